#!/usr/bin/env bash
# bench/gpu_check.sh [BUILD_OR_BUNDLE_DIR] [-- kolo-gpu-bench options]
#
# On a GPU machine, with binaries made elsewhere (this script builds
# nothing): prints the device, runs every GPU test (the kernels, VMM arenas,
# NCCL, and the device data path through the real daemons: trainers sharing
# one GPU, copy ordering, a dying trainer), then kolo-gpu-bench and the
# device allreduce timings through the daemons (4 and 1 trainers on one GPU),
# then, where nvidia-cuda-mps-control exists, the device path tests and
# timings again under a private CUDA MPS daemon (KOLO_GPU_CHECK_MPS=0: not),
# and ends with a summary table. Exit status 0 when every test passed (or skipped)
# and the bench ran, 1 otherwise.
#
# The argument is either a build tree (bin/ holds the binaries; the machine
# must have their shared libraries) or a bundle made by bench/gpu_bundle.sh
# on the build machine (bin/, lib/, origin_bin_dir), for a GPU machine with
# no package registry:
#   here:        ninja -C build <targets listed in gpu_bundle.sh> && bench/gpu_bundle.sh build
#   GPU machine: bench/gpu_check.sh build-gpubundle   (carry build-gpubundle)
# libnccl.so.2 is not bundled (208 MiB): it is taken from the machine, or
# from the nvidia-nccl-cu13 wheel of its python3.
set -uo pipefail

DIR=${1:-build}
[[ $# -gt 0 ]] && shift
[[ ${1:-} == "--" ]] && shift
DIR=$(cd "$DIR" && pwd) || { echo "no such directory" >&2; exit 1; }
# A bundle packed by bench/gpu_bundle.sh (bundle.tar.xz): unpacked in place
# once (Python's tarfile: the GPU machine need not have xz).
if [[ -f "$DIR/bundle.tar.xz" && ! -d "$DIR/bin" ]]; then
  unpack_py=${KOLO_GPU16_PYTHON:-${KOLO_PYTHON:-}}
  [[ -n $unpack_py && -x $unpack_py ]] || unpack_py=python3
  "$unpack_py" -c 'import sys, tarfile
kw = {"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}
tarfile.open(sys.argv[1]).extractall(sys.argv[2], **kw)' "$DIR/bundle.tar.xz" "$DIR" ||
    { echo "cannot unpack $DIR/bundle.tar.xz" >&2; exit 1; }
fi
BIN="$DIR/bin"
status=0
declare -a summary

if [[ -f "$DIR/origin_bin_dir" ]]; then
  export LD_LIBRARY_PATH="$DIR/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # The integration harness starts the daemons from the bin dir compiled
  # into it: make that path lead here.
  origin=$(cat "$DIR/origin_bin_dir")
  if [[ ! -x "$origin/kolo-agent" ]]; then
    if [[ ! -e "$origin" ]]; then
      mkdir -p "$(dirname "$origin")" && ln -s "$BIN" "$origin" && echo "linked $origin -> $BIN"
    else
      echo "warning: $origin exists without kolo-agent; the device path tests will not find the daemons" >&2
    fi
  fi
fi
if ! ldconfig -p 2>/dev/null | grep -q 'libnccl.so.2 '; then
  nccl_dir=$(LD_LIBRARY_PATH='' python3 -c 'import nvidia.nccl as m, os; print(os.path.join(list(m.__path__)[0], "lib"))' 2>/dev/null || true)
  [[ -z $nccl_dir || ! -e $nccl_dir/libnccl.so.2 ]] && nccl_dir=$(dirname "$(find / -name libnccl.so.2 -path '*nvidia*' 2>/dev/null | head -1)" 2>/dev/null)
  [[ -n $nccl_dir && -e $nccl_dir/libnccl.so.2 ]] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$nccl_dir" && echo "libnccl from $nccl_dir"
fi

echo "== device"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader || true
else
  echo "nvidia-smi not found"
fi

tests=(kolo_gpu_plan_tests kolo_gpu_tests kolo_gpu_device_path_tests)
for exe in "${tests[@]}" kolo_gpu_test_peer kolo_gpu_device_rank kolo-gpu-bench kolo-agent kolo-coordinator; do
  if [[ ! -x "$BIN/$exe" ]]; then
    echo "missing $BIN/$exe (build with -DKOLO_WITH_CUDA=ON -DKOLO_BUILD_TESTS=ON; see bench/gpu_bundle.sh)" >&2
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
export KOLO_GPU_DEVICE_RANK="$BIN/kolo_gpu_device_rank"
log_dir=${OUT:-$(mktemp -d)}
for t in "${tests[@]}"; do
  echo "== $t"
  timeout 900 "$BIN/$t" --gtest_brief=1 2>&1 | tee "$log_dir/$t.log"
  rc=${PIPESTATUS[0]}
  passed=$(grep -oE '\[  PASSED  \] [0-9]+' "$log_dir/$t.log" | grep -oE '[0-9]+$' || echo 0)
  skipped=$(grep -oE '\[  SKIPPED \] [0-9]+ test' "$log_dir/$t.log" | grep -oE '[0-9]+' || echo 0)
  failed=$(grep -oE '\[  FAILED  \] [0-9]+ test' "$log_dir/$t.log" | grep -oE '[0-9]+' || echo 0)
  summary+=("$(printf '%-28s rc=%-3s passed=%-4s skipped=%-4s failed=%s' "$t" "$rc" "$passed" "$skipped" "$failed")")
  if [[ $rc -ne 0 ]]; then
    echo "$t FAILED" >&2
    status=1
  fi
done

echo "== kolo-gpu-bench"
timeout 600 "$BIN/kolo-gpu-bench" "$@" 2>&1 | tee "$log_dir/kolo-gpu-bench.log"
rc=${PIPESTATUS[0]}
summary+=("$(printf '%-28s rc=%s' kolo-gpu-bench "$rc")")
[[ $rc -ne 0 ]] && { echo "kolo-gpu-bench FAILED" >&2; status=1; }

# KOLO_GPU_CHECK_PLAIN_BENCH=0 skips these timings without MPS (bench/gpu_issue16.sh
# does, for time; the first run's are in docs/gpu.md).
if [[ ${KOLO_GPU_CHECK_PLAIN_BENCH:-1} != 0 ]]; then
  echo "== device allreduce through the daemons (trainers sharing one GPU)"
  timeout 900 "$BIN/kolo_gpu_device_path_tests" --gtest_also_run_disabled_tests \
    --gtest_filter='DevicePathGpu.DISABLED_Bench*' 2>&1 | tee "$log_dir/device-allreduce-bench.log"
  rc=${PIPESTATUS[0]}
  summary+=("$(printf '%-28s rc=%s' device-allreduce-bench "$rc")")
  [[ $rc -ne 0 ]] && { echo "device allreduce bench FAILED" >&2; status=1; }
fi

# The same timings under CUDA MPS when the machine has it (docs/gpu.md, "CUDA
# MPS"): a private control daemon, stopped on the way out whatever happens.
if command -v nvidia-cuda-mps-control >/dev/null 2>&1 && [[ ${KOLO_GPU_CHECK_MPS:-1} != 0 ]]; then
  echo "== device allreduce through the daemons, under CUDA MPS"
  CUDA_MPS_PIPE_DIRECTORY=$(mktemp -d /tmp/kolo-mps-pipe.XXXXXX)
  CUDA_MPS_LOG_DIRECTORY=$(mktemp -d /tmp/kolo-mps-log.XXXXXX)
  export CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  if nvidia-cuda-mps-control -d; then
    trap 'echo quit | nvidia-cuda-mps-control >/dev/null 2>&1' EXIT
    timeout 900 "$BIN/kolo_gpu_device_path_tests" --gtest_also_run_disabled_tests \
      --gtest_filter='DevicePathGpu.*' 2>&1 | tee "$log_dir/device-allreduce-bench-mps.log"
    rc=${PIPESTATUS[0]}
    echo quit | nvidia-cuda-mps-control
    trap - EXIT
    if grep -q 'CUDA MPS does not seem to run' "$log_dir/device-allreduce-bench-mps.log"; then
      echo "the agent did not see the MPS control daemon" >&2
      rc=1
    fi
    summary+=("$(printf '%-28s rc=%s' device-allreduce-bench-mps "$rc")")
    [[ $rc -ne 0 ]] && { echo "device allreduce bench under MPS FAILED" >&2; status=1; }
  else
    summary+=("$(printf '%-28s %s' device-allreduce-bench-mps 'MPS did not start')")
  fi
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
fi

echo "== summary (logs in $log_dir)"
printf '%s\n' "${summary[@]}"
exit $status
