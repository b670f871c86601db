#!/usr/bin/env bash
# CTest smoke test of kolo-bench: two ranks under kolorun (embedded agent and
# coordinator), 4 B .. 64 KiB, checked. Passes only if kolorun exits 0 and
# rank 0 printed the table header, every size's row with #wrong == 0 and the
# closing "Avg bus bandwidth" line.
#   smoke_test.sh KOLORUN KOLO_BENCH
set -u
kolorun=$1
bench=$2
out=$(mktemp -d "${TMPDIR:-/tmp}/kolo-bench-smoke.XXXXXX") || exit 1
trap 'rm -rf "$out"' EXIT

# Bounded: kolorun gets SIGTERM after 120 s (it stops its ranks and daemons),
# SIGKILL 15 s later.
timeout -k 15 120 "$kolorun" -np 2 -- "$bench" -b 4 -e 64K -n 3 -w 1 -c 1 >"$out/log" 2>&1
rc=$?
cat "$out/log"
fail() { echo "kolo-bench smoke test FAILED: $*" >&2; exit 1; }
[ "$rc" -eq 0 ] || fail "kolorun exited with status $rc"

# Rank 0's lines, without kolorun's "[0]<stdout>:" prefix.
sed -n 's/^\[0\]<stdout>://p' "$out/log" >"$out/rank0"
grep -qF '#       size         count      type   redop    time(us)   algbw(GB/s)   busbw(GB/s)  #wrong' \
  "$out/rank0" || fail "no table header from rank 0"
for size in 4 8 16 32 64 128 256 512 1024 2048 4096 8192 16384 32768 65536; do
  # size count type redop time algbw busbw #wrong
  awk -v s="$size" '$1 == s && NF == 8 && $3 == "float32" && $4 == "sum" && $5 > 0 && $8 == 0 {ok=1}
                    END {exit ok ? 0 : 1}' "$out/rank0" || fail "no correct row for size $size"
done
grep -q '^# Avg bus bandwidth : ' "$out/rank0" || fail "no '# Avg bus bandwidth' line"
echo "kolo-bench smoke test passed"
