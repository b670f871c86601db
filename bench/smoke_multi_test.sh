#!/usr/bin/env bash
# CTest smoke tests of the multi-agent benchmarks (label "bench"); small
# sizes, bounded, everything they start is stopped by the scripts' traps.
#   smoke_multi_test.sh compare BUILD_DIR          compare_multi.sh over loopback
#   smoke_multi_test.sh compare-veth BUILD_DIR     the same over a veth pair (77 = skipped)
#   smoke_multi_test.sh model-step BUILD_DIR       model_step.sh on a small model, 1 and 2 agents
set -u
mode=$1
build=$2
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d "${TMPDIR:-/tmp}/kolo-bench-smoke-multi.XXXXXX") || exit 1
trap 'rm -rf "$out"' EXIT
fail() { echo "smoke test ($mode) FAILED: $*" >&2; exit 1; }

# "size ... #wrong" rows of a table file: every size in $2 present with #wrong 0.
check_rows() {
  local table=$1 size
  for size in $2; do
    awk -v s="$size" '$1 == s && NF >= 8 && $5 > 0 && $8 == 0 {ok = 1} END {exit ok ? 0 : 1}' "$table" ||
      fail "no correct row for size $size in $(basename "$table")"
  done
}

case "$mode" in
  compare|compare-veth)
    extra=()
    [ "$mode" = compare-veth ] && extra=(--veth)
    # Bounded: the script's runs have --timeout 120; the whole thing 400 s.
    timeout -k 15 400 "$here/compare_multi.sh" --build-dir "$build" "${extra[@]}" --agents 2 \
      --ranks-per-agent 1 --kolo-memory "user shared" -b 4 -e 64K -f 16 -w 1 -n 3 --iperf-time 1 --timeout 120 \
      --out "$out/run" >"$out/log" 2>&1
    rc=$?
    cat "$out/log"
    if [ "$mode" = compare-veth ] && [ "$rc" = 77 ]; then
      echo "veth smoke test skipped (not root / no CAP_NET_ADMIN)"
      exit 77
    fi
    [ "$rc" -eq 0 ] || fail "compare_multi.sh exited with status $rc"
    sizes="4 64 1024 16384"
    check_rows "$out/run/kolo-k2-r1.table" "$sizes"
    grep -q 'agent mode: 2 agent(s)' "$out/run/kolo-k2-r1.table" || fail "kolo did not run on 2 agents"
    # The same with the buffers in the agents' arena (--zero-copy).
    check_rows "$out/run/kolo-zc-k2-r1.table" "$sizes"
    grep -q 'zero-copy (kolo_alloc_shared)' "$out/run/kolo-zc-k2-r1.table" || fail "the shared-memory run was not zero-copy"
    if [ -x "$build/bin/gloo-allreduce-bench" ]; then check_rows "$out/run/gloo-2.table" "$sizes"; fi
    if [ -x "$build/bin/mpi-allreduce-bench" ] && command -v mpirun >/dev/null; then
      check_rows "$out/run/mpi-2.table" "$sizes"
    fi
    if command -v iperf3 >/dev/null; then
      grep -qE '^# iperf3 bandwidth .*: [0-9.]+ GB/s' "$out/log" || fail "no iperf3 bandwidth"
      # The ring's ceiling: 2 streams at once, their sum and the per-stream share.
      grep -qE '^ +2 +[0-9.]+ +[0-9.]+ +[0-9.]+$' "$out/log" || fail "no 2-stream iperf3 row (the ring's ceiling)"
    fi
    # The wake-up floor: a row for 4 processes and the 3-hop figure on the latency line.
    grep -qE '^ +4 +4 +[0-9.]+ +[0-9.]+ +[0-9.]+$' "$out/log" || fail "no kolo-relay-floor row for 4 processes"
    grep -qE 'latency@4B .*; wake-up floor [0-9.]+ us$' "$out/log" || fail "no wake-up floor on the latency line"
    grep -q '^## Comparison, kolo with user memory, K=2 agents x 1 rank(s) (N=2)' "$out/log" || fail "no comparison table"
    grep -q '^## Comparison, kolo with shared memory, K=2 agents x 1 rank(s) (N=2)' "$out/log" ||
      fail "no comparison table for the zero-copy run"
    grep -qE '^# K=2 R=1 N=2 +latency@4B kolo [0-9.]+ us \(<= 100 us\) (met|MISSED)' "$out/log" ||
      fail "no latency target line"
    grep -qE '^# K=2 R=1 zc N=2 +latency@4B kolo [0-9.]+ us' "$out/log" || fail "no target line for the zero-copy run"
    ;;
  model-step)
    # A small model: 24 tensors, 4 B .. 1 MiB, ~1.5 M parameters.
    mkdir -p "$out/models"
    {
      echo "# smoke-test model"
      for i in $(seq 0 23); do echo "layer$i.weight $(( (1 << (i % 19)) + i ))"; done
    } >"$out/models/tiny.txt"
    timeout -k 15 400 "$here/model_step.sh" --build-dir "$build" --models tiny --models-dir "$out/models" \
      --np 2 --agents "1 2" -w 1 -n 3 -T 0.2 --timeout 120 --out "$out/run" >"$out/log" 2>&1
    rc=$?
    cat "$out/log"
    [ "$rc" -eq 0 ] || fail "model_step.sh exited with status $rc"
    for tag in n2-k1-fusion-default n2-k2-fusion-default n2-k2-fusion-off; do
      awk '$1 == "tiny" && NF == 12 && $2 == 24 && $6 > 0 && $9 > 0 && $12 == 0 {ok = 1}
           END {exit ok ? 0 : 1}' "$out/run/tiny-$tag.table" || fail "no correct row for $tag"
    done
    grep -q 'default-1agent' "$out/run/tiny-n2-k1-fusion-default.table" || fail "one agent not labelled"
    grep -q ' off ' "$out/run/tiny-n2-k2-fusion-off.table" || fail "fusion off not reported"
    [ "$(grep -cE '^ +tiny +2 +[12] +(default|off) +[0-9.]+' "$out/log")" = 3 ] || fail "summary rows missing"
    ;;
  *)
    echo "usage: smoke_multi_test.sh compare|compare-veth|model-step BUILD_DIR" >&2
    exit 2
    ;;
esac
echo "smoke test ($mode) passed"
