#!/usr/bin/env bash
# CTest smoke test of kolo-bench: every collective (--op) at two ranks under
# kolorun (embedded agent and coordinator), small sizes, checked. Each run
# passes only if kolorun exits 0 and rank 0 printed the table header, every
# expected size's row (nccl-tests' size per op) with the op's type and redop
# columns and #wrong == 0, and the closing "Avg bus bandwidth" line.
#   smoke_test.sh KOLORUN KOLO_BENCH
set -u
kolorun=$1
bench=$2
out=$(mktemp -d "${TMPDIR:-/tmp}/kolo-bench-smoke.XXXXXX") || exit 1
trap 'rm -rf "$out"' EXIT
fail() { echo "kolo-bench smoke test FAILED: $*" >&2; exit 1; }

# run_op OP TYPE REDOP "SIZES" KOLO-BENCH-ARGS...
run_op() {
  local op=$1 type=$2 redop=$3 sizes=$4
  shift 4
  # Bounded: kolorun gets SIGTERM after 90 s (it stops its ranks and daemons),
  # SIGKILL 15 s later.
  timeout -k 15 90 "$kolorun" -np 2 -- "$bench" --op "$op" -n 3 -w 1 -c 1 "$@" >"$out/$op.log" 2>&1
  local rc=$?
  cat "$out/$op.log"
  [ "$rc" -eq 0 ] || fail "$op: kolorun exited with status $rc"
  # Rank 0's lines, without kolorun's "[0]<stdout>:" prefix.
  sed -n 's/^\[0\]<stdout>://p' "$out/$op.log" >"$out/$op.rank0"
  grep -q "^# kolo-bench $op: nranks 2" "$out/$op.rank0" || fail "$op: no '# kolo-bench $op' header"
  grep -qF '#       size         count      type   redop    time(us)   algbw(GB/s)   busbw(GB/s)  #wrong' \
    "$out/$op.rank0" || fail "$op: no table header from rank 0"
  local size
  for size in $sizes; do
    # size count type redop time algbw busbw #wrong
    awk -v s="$size" -v t="$type" -v r="$redop" \
      '$1 == s && NF >= 8 && $3 == t && $4 == r && $5 > 0 && $8 == 0 {ok=1} END {exit ok ? 0 : 1}' \
      "$out/$op.rank0" || fail "$op: no correct row for size $size"
  done
  local rows
  rows=$(awk '$1 ~ /^[0-9]+$/ && NF >= 8' "$out/$op.rank0" | wc -l)
  [ "$rows" -eq "$(echo $sizes | wc -w)" ] || fail "$op: $rows rows, expected sizes $sizes"
  grep -q '^# Avg bus bandwidth : ' "$out/$op.rank0" || fail "$op: no '# Avg bus bandwidth' line"
  echo "kolo-bench smoke test: $op passed"
}

pow2() { local s=$1 out=""; while [ "$s" -le "$2" ]; do out+="$s "; s=$((s * 2)); done; echo "$out"; }
# allreduce and broadcast: size = the buffer; the n-part ops at n = 2: 2 x whole
# elements, so 4 B rounds up to 8 B.
run_op allreduce float32 sum "$(pow2 4 65536)" -b 4 -e 64K
run_op broadcast float32 none "$(pow2 4 4096)" -b 4 -e 4K --root 1
run_op allgather float32 none "$(pow2 8 4096)" -b 4 -e 4K
run_op alltoall float32 none "$(pow2 8 4096)" -b 4 -e 4K
run_op reducescatter int32 max "$(pow2 8 4096)" -b 4 -e 4K -d int32 -o max
run_op barrier none none "0"
echo "kolo-bench smoke test passed"
