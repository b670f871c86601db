#!/usr/bin/env bash
# CTest bench.kolo_bench_device_smoke: kolo-bench --device host-emulated for
# every device collective (bench/device_bench_all.sh: user memory and zero
# copy, allreduce and broadcast in place too), 2 trainers under kolorun,
# 4 B - 64 KiB, checked. Passes when every run exits 0 and rank 0 printed,
# per run, the header, the emulation warning (first and last), a row per
# size with #wrong 0, and "Out of bounds values : 0 OK".
#   device_smoke_test.sh BIN_DIR
set -u
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d "${TMPDIR:-/tmp}/kolo-bench-device.XXXXXX") || exit 1
trap 'rm -rf "$out"' EXIT
fail() { echo "kolo-bench --device smoke test FAILED: $*" >&2; exit 1; }
start=$SECONDS
"$here/device_bench_all.sh" "$bin" 2 host-emulated -b 4 -e 64K -f 16 -w 1 -n 2 -T 0 >"$out/all.log" 2>&1
rc=$?
cat "$out/all.log"
[ "$rc" -eq 0 ] || fail "device_bench_all.sh exited with status $rc"
sed -n 's/^\[0\]<stdout>://p' "$out/all.log" >"$out/rank0"
runs=$(grep -c '^# kolo-bench ' "$out/rank0")
[ "$runs" -eq 14 ] || fail "$runs tables, expected 14 (5 ops x user/zero copy, + in place for 2)"
warn='# WARNING: THE DEVICE IS HOST-EMULATED (--device host-emulated, the test emulation): these are CPU timings of the emulated device path, NOT GPU figures'
[ "$(grep -cF "$warn" "$out/rank0")" -eq 28 ] || fail "the emulation warning is not printed twice per table"
[ "$(grep -c '^# Out of bounds values : 0 OK' "$out/rank0")" -eq 14 ] || fail "a table has wrong elements"
[ "$(grep -c 'buffers host-emulated device 0, zero copy (kolo_device_alloc' "$out/rank0")" -eq 7 ] ||
  fail "not 7 zero-copy tables"
[ "$(grep -c 'buffers host-emulated device 0, user device memory' "$out/rank0")" -eq 7 ] ||
  fail "not 7 user-memory tables"
# Rows: size count type redop time algbw busbw #wrong; every one checked (#wrong 0).
bad=$(awk '$1 ~ /^[0-9]+$/ && NF >= 8 && $8 != 0' "$out/rank0" | wc -l)
[ "$bad" -eq 0 ] || fail "$bad rows with wrong elements"
rows=$(awk '$1 ~ /^[0-9]+$/ && NF >= 8 && $5 > 0' "$out/rank0" | wc -l)
[ "$rows" -ge 42 ] || fail "$rows rows, expected at least 3 sizes per table"
echo "kolo-bench --device smoke test passed in $((SECONDS - start)) s"
