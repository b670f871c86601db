#!/usr/bin/env bash
# bench/gpu_check.sh [BUILD_DIR] [-- kolo-gpu-bench options]
#
# On a GPU machine, with a build tree made elsewhere (this script builds
# nothing): runs the GPU tests and kolo-gpu-bench, and prints the device, the
# test summary and the bench table. The build tree's bin/ must hold
# kolo_gpu_plan_tests, kolo_gpu_tests, kolo_gpu_test_peer and kolo-gpu-bench
# (configure with -DKOLO_WITH_CUDA=ON -DKOLO_WITH_NCCL=ON). Exit status: 0
# when every test passed (or skipped) and the bench ran, 1 otherwise.
set -uo pipefail

BUILD_DIR=${1:-build}
[[ $# -gt 0 ]] && shift
[[ ${1:-} == "--" ]] && shift
BIN="$BUILD_DIR/bin"
status=0

echo "== device"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader || true
else
  echo "nvidia-smi not found"
fi

for exe in kolo_gpu_plan_tests kolo_gpu_tests kolo_gpu_test_peer kolo-gpu-bench; do
  if [[ ! -x "$BIN/$exe" ]]; then
    echo "missing $BIN/$exe (build with -DKOLO_WITH_CUDA=ON and carry the build tree)" >&2
    exit 1
  fi
  missing=$(ldd "$BIN/$exe" 2>/dev/null | grep "not found" || true)
  if [[ -n $missing ]]; then
    echo "$exe: shared libraries missing on this machine:" >&2
    echo "$missing" >&2
    status=1
  fi
done
[[ $status -ne 0 ]] && exit 1

export KOLO_GPU_TEST_PEER="$BIN/kolo_gpu_test_peer"
for t in kolo_gpu_plan_tests kolo_gpu_tests; do
  echo "== $t"
  if ! timeout 900 "$BIN/$t" --gtest_brief=1; then
    echo "$t FAILED" >&2
    status=1
  fi
done

echo "== kolo-gpu-bench"
if ! timeout 600 "$BIN/kolo-gpu-bench" "$@"; then
  echo "kolo-gpu-bench FAILED" >&2
  status=1
fi
exit $status
