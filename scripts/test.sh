#!/usr/bin/env bash
# One command for a fresh machine: install what is missing, build everything
# with the tests, and run every test (unit, multi-process integration, fault,
# deployment checks, Python).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh -DKOLO_BUILD_TESTS=ON
ctest --test-dir build --output-on-failure -j"${KOLO_TEST_JOBS:-2}" --timeout 900 "$@"
