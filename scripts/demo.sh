#!/usr/bin/env bash
# One command for a fresh machine: install what is missing, build, and run
# the demo: 4 ranks under kolorun, which starts an embedded coordinator and
# agent, allreduce and check their results, and print a bandwidth line.
set -euo pipefail
cd "$(dirname "$0")/.."
KOLO_SKIP_PYTHON_DEPS=${KOLO_SKIP_PYTHON_DEPS:-1} scripts/install-deps.sh
scripts/build.sh -DKOLO_BUILD_TESTS=OFF
exec build/bin/kolorun -np "${NP:-4}" -- build/bin/kolo-demo "${DEMO_MB:-64}"
