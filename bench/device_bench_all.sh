#!/usr/bin/env bash
# bench/device_bench_all.sh BIN_DIR NP KIND [KOLO-BENCH OPTIONS...]
#
# kolo-bench --device KIND (cuda | host-emulated) for every device collective
# the agent serves -- allreduce, broadcast, allgather, reducescatter,
# alltoall -- with user device memory and with zero copy (kolo_device_alloc
# buffers), allreduce and broadcast also in place: one nccl-tests style
# table each, NP trainers under kolorun (its embedded agent gets
# KOLO_DEVICE=KIND). The options default to 4 B - 256 MiB, factor 4, about
# 0.2 s per size. Exit status 0 when every run exited 0 with no wrong
# element. bench/gpu_issue16.sh runs it with cuda (phase
# collectives-device-N); the ctest bench.kolo_bench_device_smoke runs it
# with host-emulated and small sizes (CPU timings of the emulation, not GPU
# figures: the tables say so).
set -uo pipefail
bin=$1 np=$2 kind=$3
shift 3
opts=("$@")
[[ ${#opts[@]} -gt 0 ]] || opts=(-b 4 -e 256M -f 4 -w 2 -n 10 -T 0.2)
export KOLO_DEVICE=$kind
status=0
for op in allreduce broadcast allgather reducescatter alltoall; do
  variants=("" "--zero-copy")
  if [[ $op == allreduce || $op == broadcast ]]; then
    variants+=("--inplace" "--zero-copy --inplace")
  fi
  for v in "${variants[@]}"; do
    echo "== kolo-bench --device $kind --op $op $v (np $np)"
    # shellcheck disable=SC2086  # $v: zero, one or two flags
    timeout -k 10 300 "$bin/kolorun" -np "$np" -- "$bin/kolo-bench" --device "$kind" --op "$op" $v \
      -c 1 "${opts[@]}"
    rc=$?
    if [[ $rc -ne 0 ]]; then
      echo "device_bench_all: --op $op $v FAILED (rc $rc)" >&2
      status=1
    fi
  done
done
exit $status
