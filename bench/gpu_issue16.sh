#!/usr/bin/env bash
# bench/gpu_issue16.sh [BUNDLE_OR_BUILD_DIR] [--list]
#
# GPU training through kolo.torch on a GPU machine, in one
# command of about 8 minutes (KOLO_GPU16_BUDGET_S, default 480 s: a phase
# that would start with too little of it left is skipped and says so):
#
#   1. env        the GPU, torch, and a private CUDA MPS daemon for phases 2-5
#   2. cxx-stream the device path tests through the real daemons, under MPS
#                 (kolo_gpu_device_path_tests DevicePath*: the C ABI's
#                 kolo_set_stream on device tensors included)
#   2b. cxx-seam-cuda the device seam tests on the real CUDA implementation;
#                 nccl-procs NCCL with one rank per process, two processes on
#                 one GPU with their own NCCL_HOSTID, a killed and a stopped
#                 peer, the same host id refused (kolo_gpu_nccl_process_tests);
#                 kolo-status `kolo status` against a live agent (kolo_cli_tests)
#   3. py-ops     every kolo.torch op on CUDA tensors (tests/python/
#                 test_device_ops.py: 2 and 4 trainers sharing the GPU on the
#                 device path, and 2 with every op staged through host memory)
#   3a. py-zerocopy the same with KOLO_DEVICE_ZERO_COPY=1 (torch's allocator
#                 is the device arena's: device ops copy nothing)
#   3b. torch-dist the torch.distributed backend "kolo" under this torch
#                 (tests/python/test_torch_distributed.py: CPU ops, DDP, and
#                 CUDA tensors with stream order, DDP and FSDP on CUDA)
#   4. synth      examples/pytorch_synthetic_benchmark.py on CUDA (ResNet-50,
#                 batch 64, 224 px, fp32) with 1, 2 and 4 trainers sharing
#                 the GPU: without allreduce (the compute-only ceiling) and
#                 with kolo (k = 2, 4; with k = 1 kolo installs no hooks, so
#                 it is the ceiling); torch DDP over gloo on CUDA tensors
#                 (examples/ddp_synthetic_benchmark.py) with 2 and 4 ranks
#   5. collectives per-op time and busbw of allreduce, broadcast, allgather,
#                 reducescatter and alltoall on CUDA tensors, 4 B to 256 MiB, 2
#                 and 4 trainers (bench/gpu/torch_collectives_bench.py); and
#                 kolo-bench --device cuda (bench/device_bench_all.sh): the C
#                 ABI's device collectives, user memory and zero copy
#                 (kolo_device_alloc), in place and not
#   5b. nccl-cross device allreduce 4 B..256 MiB across 2 and 4 agents on the
#                 one GPU (own NCCL_HOSTID each, trainers under MPS): kolo over
#                 NCCL, the same forced through host staging, torch.distributed
#                 over NCCL with the same layout; a table in the summary
#   6. gpu-check  bench/gpu_check.sh: every GPU test, kolo-gpu-bench, the
#                 device allreduce timings under its own MPS daemon (the
#                 timings without MPS skipped: KOLO_GPU_CHECK_PLAIN_BENCH=0)
#
# and ends with a summary table ($OUT/summary.txt, written after every phase
# as far as it got). What a phase leaves running when it ends (a timed-out
# phase's agents and trainers) is killed before the next one starts. Logs go to $OUT
# (the device tool brings them back) or a temporary directory. Exit status
# 0 when every phase that ran passed.
#
# The argument is a bundle made here by bench/gpu_bundle.sh (bin/, lib/ with
# libkolo.so, origin_bin_dir) or a build tree; the Python package, tests and
# examples come from this checkout. On the build machine:
#   ninja -C build-cuda kolo_gpu_plan_tests kolo_gpu_tests kolo_gpu_test_peer kolo-gpu-bench \
#     kolo_gpu_device_path_tests kolo_gpu_device_rank kolo_gpu_seam_tests kolo_gpu_seam_rank \
#     kolo_gpu_nccl_process_tests kolo_gpu_nccl_rank kolo_cli_tests kolo_gpu_nccl_cross_tests \
#     kolo-agent kolo-coordinator kolorun kolo kolo_client kolo-bench
#   bench/gpu_bundle.sh build-cuda build-gpubundle
# With the device tool: run(command="bench/gpu_issue16.sh build-gpubundle",
#                           carry=["build-gpubundle"], timeout_s=600)
# --list prints the phases and their commands, checks the inputs, runs nothing.
# Knobs: KOLO_GPU16_BUDGET_S, KOLO_GPU16_PHASES (a comma list: only those
# phases, e.g. a rerun of the failed ones), KOLO_GPU16_PYTHON (default $KOLO_PYTHON, else python3),
# KOLO_GPU16_SYNTH_ARGS (the benchmarks' options).
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(dirname "$HERE")
DIR=build-gpubundle
LIST=0
for a in "$@"; do
  case $a in
    --list | --dry-run) LIST=1 ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "unknown option $a (see --help)" >&2; exit 2 ;;
    *) DIR=$a ;;
  esac
done
DIR=$(cd "$DIR" 2>/dev/null && pwd) || { echo "no such directory: $DIR" >&2; exit 2; }
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
BUDGET=${KOLO_GPU16_BUDGET_S:-480}
# KOLO_GPU16_PHASES=a,b: run only those phases (a rerun of what failed).
ONLY=${KOLO_GPU16_PHASES:-}
# The interpreter: KOLO_GPU16_PYTHON, else $KOLO_PYTHON when it exists (kolo's
# venv, scripts/python-env.sh), else the machine's python3 (the GPU machine's
# has torch 2.11). Exported as KOLO_PYTHON: the tests start workers with it.
PY=${KOLO_GPU16_PYTHON:-}
if [[ -z $PY && -n ${KOLO_PYTHON:-} && -x ${KOLO_PYTHON:-} ]]; then PY=$KOLO_PYTHON; fi
PY=${PY:-$(command -v python3 || echo python3)}
export KOLO_PYTHON=$PY
SYNTH_ARGS=(--model resnet50 --batch-size 64 --image-size 224 --num-warmup-batches 5
            --num-batches-per-iter 5 --num-iters 4)
# KOLO_GPU16_SYNTH_ARGS replaces them (e.g. a small model for a smoke run of
# this script on a machine without a GPU).
if [[ -n ${KOLO_GPU16_SYNTH_ARGS:-} ]]; then
  read -r -a SYNTH_ARGS <<< "$KOLO_GPU16_SYNTH_ARGS"
fi
if [[ $LIST == 1 ]]; then
  log_dir=${OUT:-/tmp/kolo-gpu16.XXXXXX}
else
  log_dir=${OUT:-$(mktemp -d /tmp/kolo-gpu16.XXXXXX)}
  mkdir -p "$log_dir"
fi
status=0
min_total=0
declare -a summary phases

# Inputs: the binaries, libkolo, the Python package and the examples.
missing=()
for f in bin/kolorun bin/kolo-agent bin/kolo-coordinator bin/kolo bin/kolo_gpu_device_path_tests \
         bin/kolo_gpu_device_rank bin/kolo_gpu_seam_tests bin/kolo_gpu_seam_rank \
         bin/kolo_gpu_nccl_process_tests bin/kolo_gpu_nccl_rank bin/kolo_cli_tests bin/kolo-bench \
         bin/kolo_gpu_nccl_cross_tests lib/libkolo.so; do
  [[ -e "$DIR/$f" ]] || missing+=("$DIR/$f")
done
for f in client_lib/python/kolo/torch/_cuda.py tests/python/test_device_ops.py \
         examples/pytorch_synthetic_benchmark.py examples/ddp_synthetic_benchmark.py \
         bench/gpu_check.sh bench/device_bench_all.sh client_lib/python/kolo/torch/_zero_copy.py \
         bench/gpu/torch_nccl_hostid_bench.py; do
  [[ -e "$REPO/$f" ]] || missing+=("$REPO/$f")
done
if [[ ${#missing[@]} -gt 0 ]]; then
  printf 'missing: %s\n' "${missing[@]}" >&2
  echo "build and bundle first (see the top of $0)" >&2
  exit 1
fi

# Environment for everything below: the bundle's libraries (and the
# wheel's NCCL), the daemons where the test harness looks for them, the
# Python package of this checkout and its libkolo.
if [[ -f "$DIR/origin_bin_dir" ]]; then
  export LD_LIBRARY_PATH="$DIR/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  origin=$(cat "$DIR/origin_bin_dir")
  if [[ $LIST == 0 && ! -x "$origin/kolo-agent" && ! -e "$origin" ]]; then
    mkdir -p "$(dirname "$origin")" && ln -s "$BIN" "$origin"
  fi
fi
# kolo-agent links libnccl.so.2, which the bundle leaves out (208 MiB): the
# machine's, or the nvidia-nccl-cu13 wheel's (as gpu_check.sh finds it).
if [[ $LIST == 0 ]] && ! ldconfig -p 2>/dev/null | grep -q 'libnccl.so.2 '; then
  nccl_dir=$(LD_LIBRARY_PATH='' "$PY" -c 'import nvidia.nccl as m, os; print(os.path.join(list(m.__path__)[0], "lib"))' 2>/dev/null || true)
  if [[ -n $nccl_dir && -e $nccl_dir/libnccl.so.2 ]]; then
    export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$nccl_dir"
    echo "libnccl from $nccl_dir"
  fi
fi
if [[ $LIST == 0 ]] && ldd "$BIN/kolo-agent" 2>/dev/null | grep -q 'not found'; then
  echo "kolo-agent: shared libraries missing on this machine:" >&2
  ldd "$BIN/kolo-agent" | grep 'not found' >&2
  exit 1
fi
export PYTHONPATH="$REPO/client_lib/python${PYTHONPATH:+:$PYTHONPATH}"
export KOLO_LIBRARY="$DIR/lib/libkolo.so" KOLO_BUILD_DIR="$DIR"
export KOLO_GPU_TEST_PEER="$BIN/kolo_gpu_test_peer" KOLO_GPU_DEVICE_RANK="$BIN/kolo_gpu_device_rank"
export KOLO_GPU_SEAM_RANK="$BIN/kolo_gpu_seam_rank"
export KOLO_PYTHON_TESTS_REQUIRE_BUILD=1 OMP_NUM_THREADS=4

# phase NAME MIN_S MAX_S COMMAND...: runs COMMAND (bounded by MAX_S and
# what is left of the budget), logged to $log_dir/NAME.log; skipped when
# less than MIN_S is left.
phase() {
  local name=$1 min=$2 max=$3
  shift 3
  phases+=("$(printf '%-22s %4d-%4ds  %s' "$name" "$min" "$max" "$*")")
  [[ $name == synth-* || $name == collectives-* || $name == gpu-check ]] || min_total=$((min_total + min))
  if [[ $LIST == 1 ]]; then
    return 0
  fi
  if [[ -n $ONLY && ",$ONLY," != *",$name,"* ]]; then
    summary+=("$(printf '%-22s not selected (KOLO_GPU16_PHASES)' "$name")")
    return 0
  fi
  local left=$((BUDGET - SECONDS))
  if ((left < min)); then
    summary+=("$(printf '%-22s skipped (%d s of the budget left, needs %d)' "$name" "$left" "$min")")
    return 0
  fi
  local t=$((left < max ? left : max))
  echo "== $name (up to ${t}s): $*"
  local start=$SECONDS
  # Every process of the phase carries its tag, whatever it detaches from:
  # what is left when the phase ends (a timed-out phase's agents and
  # trainers) is found by it and killed before the next phase starts.
  local tag="$name.$$.$SECONDS"
  KOLO_GPU16_PHASE=$tag timeout -k 10 "$t" "$@" > "$log_dir/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$log_dir/$name.log"
  local left_over
  left_over=$(kill_tagged "$tag")
  summary+=("$(printf '%-22s rc=%-3s %4ds%s' "$name" "$rc" $((SECONDS - start)) \
    "${left_over:+  (left $left_over processes behind: killed)}")")
  printf '%s\n' "${summary[@]}" > "$log_dir/summary.txt"  # as far as it got
  if [[ $rc -ne 0 ]]; then
    status=1
    echo "$name FAILED (rc $rc; $log_dir/$name.log)" >&2
  fi
  return 0
}

# kill_tagged TAG: SIGKILLs every process whose environment has
# KOLO_GPU16_PHASE=TAG; prints how many there were (nothing for none).
kill_tagged() {
  local pids=() f pid
  for f in /proc/[0-9]*/environ; do
    pid=${f#/proc/}
    pid=${pid%/environ}
    if { tr '\0' '\n' < "$f"; } 2>/dev/null | grep -qxF "KOLO_GPU16_PHASE=$1"; then pids+=("$pid"); fi
  done
  [[ ${#pids[@]} -eq 0 ]] && return 0
  kill -9 "${pids[@]}" 2>/dev/null
  echo "${#pids[@]}"
}

# --- 1. the machine, torch, MPS ----------------------------------------------
# (phase runs one program: `timeout` cannot run shell functions.)
phase env 5 30 nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
phase torch 5 60 "$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(), "devices", torch.cuda.device_count())'

mps_up=0
if [[ $LIST == 0 ]] && command -v nvidia-cuda-mps-control >/dev/null 2>&1; then
  CUDA_MPS_PIPE_DIRECTORY=$(mktemp -d /tmp/kolo-mps-pipe.XXXXXX)
  CUDA_MPS_LOG_DIRECTORY=$(mktemp -d /tmp/kolo-mps-log.XXXXXX)
  export CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  if nvidia-cuda-mps-control -d; then
    mps_up=1
    trap 'echo quit | nvidia-cuda-mps-control >/dev/null 2>&1' EXIT
    echo "CUDA MPS: private daemon, pipe directory $CUDA_MPS_PIPE_DIRECTORY"
  else
    echo "warning: nvidia-cuda-mps-control -d failed: phases 2-5 run without MPS" >&2
  fi
elif [[ $LIST == 0 ]]; then
  echo "warning: no nvidia-cuda-mps-control: phases 2-5 run without MPS" >&2
fi

# --- 2. the device path through the daemons (C ABI stream included) --------
phase cxx-stream 60 150 "$BIN/kolo_gpu_device_path_tests" --gtest_brief=1 --gtest_filter='DevicePath.*'
# The device protocol tests of the host emulation, unchanged, on
# the real CUDA implementation (the fault cases skip: the emulation injects them).
phase cxx-seam-cuda 30 120 env KOLO_TEST_DEVICE=cuda "$BIN/kolo_gpu_seam_tests" --gtest_brief=1
# NCCL with one rank per process, two processes on the one GPU with their
# own NCCL_HOSTID each; a killed and a stopped peer; the same host id refused.
phase nccl-procs 20 90 "$BIN/kolo_gpu_nccl_process_tests" --gtest_brief=1
# kolo status against a live agent on the GPU (its GPU and MPS lines).
phase kolo-status 10 60 "$BIN/kolo_cli_tests" --gtest_brief=1 \
  --gtest_filter='KoloCliDaemons.Status:KoloCliDaemonsWithMps.*'

# --- 3. every kolo.torch op on CUDA tensors ----------------------------------
phase py-ops 90 200 "$PY" -m pytest -q -p no:cacheprovider -rs "$REPO/tests/python/test_device_ops.py" -k "cuda and not zerocopy"
# --- 3a. zero copy: KOLO_DEVICE_ZERO_COPY=1 puts every CUDA tensor of kolo.torch in the
# device arena (torch's pluggable allocator over kolo_device_alloc_stream); every op again.
phase py-zerocopy 30 150 "$PY" -m pytest -q -p no:cacheprovider -rs "$REPO/tests/python/test_device_ops.py" -k zerocopy

# --- 3b. torch.distributed backend "kolo" under this torch -------------------
# CPU collectives, DDP, errors and timeouts under torch 2.x, CUDA tensors
# through the backend (stream order, DDP on CUDA) on the GPU, and FSDP /
# FSDP2 on CPU (if torch's FSDP takes CPU modules) and CUDA.
phase torch-dist 60 240 "$PY" -m pytest -q -p no:cacheprovider -rs \
  "$REPO/tests/python/test_torch_distributed.py"

# --- 4. synthetic ResNet-50 on CUDA: ceiling, kolo, torch DDP/gloo ----------
SYNTH=("$REPO/examples/pytorch_synthetic_benchmark.py" "${SYNTH_ARGS[@]}")
# The figures in the order they matter, so that a short window gets the
# headline first: k = 2 (ceiling, kolo, DDP over gloo, every collective's
# busbw), then k = 4, then one trainer alone.
for k in 2 4; do
  phase "synth-ceiling-$k" 40 120 "$BIN/kolorun" -np "$k" -- "$PY" "${SYNTH[@]}" --no-allreduce
  phase "synth-kolo-$k" 40 120 "$BIN/kolorun" -np "$k" -- "$PY" "${SYNTH[@]}"
  phase "synth-ddp-gloo-$k" 40 120 "$PY" "$REPO/examples/ddp_synthetic_benchmark.py" --np "$k" \
    "${SYNTH_ARGS[@]}"
  # --- 5. per-op time and busbw of every collective on CUDA tensors ---------
  phase "collectives-$k" 40 90 "$BIN/kolorun" -np "$k" -- "$PY" \
    "$REPO/bench/gpu/torch_collectives_bench.py" --time-per-size 0.1
  # kolo-bench --device cuda: every device collective the agent serves, 4 B - 256 MiB,
  # user memory and zero copy (kolo_device_alloc), out of place and in place.
  phase "collectives-device-$k" 40 150 "$REPO/bench/device_bench_all.sh" "$BIN" "$k" cuda
done
phase "synth-ceiling-1" 40 120 "$BIN/kolorun" -np 1 -- "$PY" "${SYNTH[@]}" --no-allreduce

# --- 5b. nccl-cross: device tensors across 2 and 4 agents on the one GPU ----
# Each agent with its own NCCL_HOSTID (NCCL's socket transport over
# loopback), one trainer per agent under MPS: kolo's busbw of float32
# allreduce 4 B..256 MiB over NCCL, the same job forced through host
# staging, and torch.distributed over NCCL with the same NCCL_HOSTID layout.
for n in 2 4; do
  phase "nccl-cross-kolo-$n" 20 150 env KOLO_NCCL_BENCH_AGENTS=$n KOLO_NCCL_BENCH_CROSS=nccl \
    "$BIN/kolo_gpu_nccl_cross_tests" --gtest_also_run_disabled_tests --gtest_filter='NcclCrossGpu.*'
  phase "nccl-cross-staged-$n" 20 150 env KOLO_NCCL_BENCH_AGENTS=$n KOLO_NCCL_BENCH_CROSS=staged \
    "$BIN/kolo_gpu_nccl_cross_tests" --gtest_also_run_disabled_tests --gtest_filter='NcclCrossGpu.*'
  phase "nccl-cross-torch-$n" 20 150 "$PY" "$REPO/bench/gpu/torch_nccl_hostid_bench.py" --np "$n"
done

if [[ $mps_up == 1 ]]; then
  echo quit | nvidia-cuda-mps-control
  trap - EXIT
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
fi

# --- 6. the existing GPU check (its own MPS daemon) -------------------------
phase gpu-check 90 400 env KOLO_GPU_CHECK_PLAIN_BENCH=0 "$REPO/bench/gpu_check.sh" "$DIR"

if [[ $LIST == 1 ]]; then
  echo "bench/gpu_issue16.sh: inputs present; budget ${BUDGET}s; logs would go to $log_dir"
  echo "phases (name, least-most seconds, command), in order:"
  printf '  %s\n' "${phases[@]}"
  echo "the regression phases (before synth-*) need at least ${min_total}s of the ${BUDGET}s budget;"
  echo "the figures run with what is left, in order: a phase that would start with less than its"
  echo "minimum is skipped and says so"
  exit 0
fi

# --- summary -------------------------------------------------------------------
field() {  # field LOG KEY: KEY=value of the last RESULT line in LOG
  [[ -f "$1" ]] || return 0
  grep -o 'RESULT .*' "$1" | tail -n 1 | tr ' ' '\n' | sed -n "s/^$2=//p"
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a != "" && b != "" && b > 0) printf "%.2f", a / b; else printf "-" }'; }
{
  echo "== summary (logs in $log_dir)"
  printf '%s\n' "${summary[@]}"
  echo
  echo "synthetic training, k trainers sharing one GPU$([[ $mps_up == 1 ]] && echo ', under CUDA MPS'), aggregate img/s:"
  echo "(${SYNTH_ARGS[*]})"
  printf '%-3s %14s %14s %10s %14s %10s\n' k "ceiling img/s" "kolo img/s" kolo/ceil "ddp-gloo img/s" ddp/ceil
  for k in 1 2 4; do
    c=$(field "$log_dir/synth-ceiling-$k.log" img_sec_total)
    if [[ $k == 1 ]]; then kv=$c; else kv=$(field "$log_dir/synth-kolo-$k.log" img_sec_total); fi
    d=$([[ $k == 1 ]] || field "$log_dir/synth-ddp-gloo-$k.log" img_sec_total)
    printf '%-3s %14s %14s %10s %14s %10s\n' "$k" "${c:--}" "${kv:--}" "$(ratio "$kv" "$c")" "${d:--}" "$(ratio "$d" "$c")"
  done
  echo "(target: kolo/ceil >= 0.90 at k = 2 and 4, default settings)"
  for k in 2 4; do
    if [[ -f "$log_dir/collectives-$k.log" ]]; then
      echo
      echo "collectives on CUDA tensors, $k trainers (rank 0's table):"
      grep -E '^\[0\]<stdout>:' "$log_dir/collectives-$k.log" | sed 's/^\[0\]<stdout>://' | grep -v '^COLLECTIVES'
    fi
  done
  for n in 2 4; do
    [[ -f "$log_dir/nccl-cross-kolo-$n.log" || -f "$log_dir/nccl-cross-torch-$n.log" ]] || continue
    echo
    echo "nccl-cross: float32 allreduce of device tensors, $n agents on one GPU (NCCL_HOSTID each), us/op and busbw GB/s:"
    printf '%-10s %10s %9s %10s %9s %10s %9s %11s\n' bytes "kolo us" busbw "staged us" busbw "torch us" busbw kolo/torch
    rows() { [[ -f "$1" ]] && grep -o 'BENCHROW .*' "$1" | awk '{print $2, $3, $5}'; }
    join -a1 -a2 -e - -o 0,1.2,1.3,2.2,2.3 <(rows "$log_dir/nccl-cross-kolo-$n.log" | sort -k1,1) \
      <(rows "$log_dir/nccl-cross-staged-$n.log" | sort -k1,1) |
      join -a1 -a2 -e - -o 0,1.2,1.3,1.4,1.5,2.2,2.3 - <(rows "$log_dir/nccl-cross-torch-$n.log" | sort -k1,1) |
      sort -n | while read -r b ku kb su sb tu tb; do
        printf '%-10s %10s %9s %10s %9s %10s %9s %11s\n' "$b" "$ku" "$kb" "$su" "$sb" "$tu" "$tb" "$(ratio "$kb" "$tb")"
      done
  done
  echo "(targets: kolo/torch busbw >= 0.9 at 64-256 MiB; small ops within 1.2x torch's us + 50 us)"
  if [[ -f "$log_dir/torch-dist.log" ]]; then
    echo
    echo "torch.distributed backend kolo: $(grep -E '[0-9]+ (passed|failed|skipped)' "$log_dir/torch-dist.log" | tail -n 1)"
  fi
  if [[ -f "$log_dir/py-ops.log" ]]; then
    echo
    echo "kolo.torch op tests on CUDA: $(grep -E '[0-9]+ (passed|failed|skipped)' "$log_dir/py-ops.log" | tail -n 1)"
  fi
} | tee "$log_dir/summary.txt"
exit $status
