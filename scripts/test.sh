#!/usr/bin/env bash
# One command for a fresh machine: install what is missing, build everything
# with the tests, and run every test (unit, multi-process integration, fault,
# deployment checks, Python); then the sanitizer runs (scripts/sanitize.sh): an ASan+UBSan build of the test
# suite in build-asan and a TSan build of the agent's threaded parts in
# build-tsan, each building only what its tests need, each within a budget.
#
#   scripts/test.sh                 # what CI runs
#   scripts/test.sh -R Tls          # a ctest selection only
#   scripts/test-long.sh            # all of it plus the fuzz pass (not in CI)
#
# With KOLO_CI_FUZZ=1 (scripts/test-long.sh sets it), where clang can link
# libFuzzer, a fixed fuzz pass over every target in fuzz/ runs after ctest
# (scripts/fuzz.sh, its build in build-fuzz): about 4-5 minutes, left out of
# CI to keep a cold run under an hour (docs/operations.md, "What CI runs").
#
# Environment: KOLO_TEST_JOBS (2), KOLO_CI_FUZZ (0): 1 runs the fuzz pass,
# KOLO_CI_FUZZ_SECONDS (300): backstop per target for its fixed run count,
# KOLO_CI_SANITIZE=0 skips the sanitizer runs, KOLO_CI_ASAN_BUDGET_S (1800)
# and KOLO_CI_TSAN_BUDGET_S (1500): wall-clock budget of each sanitizer
# run, build and tests (past it the run stops and fails; 0: no budget).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh -DKOLO_BUILD_TESTS=ON
rc=0
ctest --test-dir build --output-on-failure -j"${KOLO_TEST_JOBS:-2}" --timeout 900 "$@" || rc=$?

if [ $# -gt 0 ]; then
  exit $rc
fi
if [ "${KOLO_CI_FUZZ:-0}" = 0 ]; then
  echo "test.sh: fuzz pass not run (scripts/test-long.sh or KOLO_CI_FUZZ=1 runs it)"
elif scripts/fuzz.sh --available; then
  # A fixed seed and a fixed number of inputs per target (about 20 s each
  # on a 2-core VM): the pass is repeatable, so what passed before landing
  # passes in CI; a time budget would explore different inputs on a faster
  # machine. Longer, open-ended runs: scripts/fuzz.sh (FUZZ_SECONDS).
  start=$SECONDS
  FUZZ_SECONDS=${KOLO_CI_FUZZ_SECONDS:-300} FUZZ_SEED=1 \
    FUZZ_RUNS_frame_decoder=900000 FUZZ_RUNS_client_desc=1200000 \
    FUZZ_RUNS_cross_requests=600000 FUZZ_RUNS_coordinator=8000 FUZZ_RUNS_shm=400000 \
    scripts/fuzz.sh || rc=1
  echo "test.sh: fuzz pass (build and a fixed 1-seed run per target) took $((SECONDS - start)) s"
else
  echo "test.sh: fuzz pass skipped: clang with libFuzzer is not installed (apt-get install clang-14 libclang-rt-14-dev)"
fi

if [ "${KOLO_CI_SANITIZE:-1}" = 0 ]; then
  echo "test.sh: sanitizer runs skipped (KOLO_CI_SANITIZE=0)"
else
  # What each run builds and tests: scripts/sanitize.sh --list. The budgets
  # hold a cold build (no ccache) plus the tests on a 2-core machine with
  # room to spare; see docs/operations.md "What CI runs".
  start=$SECONDS
  SAN_BUDGET_S_asan=${KOLO_CI_ASAN_BUDGET_S:-1800} SAN_BUDGET_S_tsan=${KOLO_CI_TSAN_BUDGET_S:-1500} \
    scripts/sanitize.sh asan tsan || rc=1
  echo "test.sh: sanitizer runs (ASan+UBSan, TSan: builds and tests) took $((SECONDS - start)) s"
fi
exit $rc
