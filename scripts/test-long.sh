#!/usr/bin/env bash
# The longer suite, run by hand before a release or after touching a parser
# (not by CI, to keep a cold CI run under an hour): everything scripts/test.sh
# runs, plus the fixed fuzz pass over every target in fuzz/ (where clang can
# link libFuzzer), plus Horovod's own PyTorch test suite at np 2 and 4 when
# its sources are given (KOLO_HOROVOD_SRC: a checkout of horovod 0.28.1).
#
#   scripts/test-long.sh
#   KOLO_HOROVOD_SRC=/tmp/hvd scripts/test-long.sh
set -euo pipefail
cd "$(dirname "$0")/.."
rc=0
# KOLO_TF_LONG: kolo.tensorflow's collectives on 4 ranks over 2 agents (tests/python/test_tensorflow.py)
KOLO_CI_FUZZ=1 KOLO_TF_LONG=1 scripts/test.sh || rc=$?
if [ -n "${KOLO_HOROVOD_SRC:-}" ]; then
  . scripts/python-env.sh
  for np in 2 4; do
    PYTHONPATH=$PWD/client_lib/python KOLO_BUILD_DIR=$PWD/build \
      "$KOLO_PYTHON" tests/python/horovod_suite.py -np "$np" || rc=1
  done
else
  echo "test-long.sh: Horovod's suite not run (set KOLO_HOROVOD_SRC to a horovod 0.28.1 checkout)"
fi
exit $rc
