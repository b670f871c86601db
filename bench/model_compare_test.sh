#!/usr/bin/env bash
# CTest smoke test of bench/model_compare.sh (many tensors, user memory): a 5-tensor
# model (one tensor over 1 MiB, so the agent's direct user-memory path runs,
# and four small ones through the arena) at N=2, one alternation, checked.
# Passes when the script exits 0, every run verified (#wrong 0 in kolo-bench's
# row, the blocking loop and the MPI loop) and the summary has a row for N=2
# with both targets judged.
#   model_compare_test.sh BUILD_DIR
set -u
build=$1
command -v mpirun >/dev/null || { echo "skipped: mpirun not in PATH"; exit 77; }
out=$(mktemp -d "${TMPDIR:-/tmp}/kolo-model-compare-test.XXXXXX") || exit 1
trap 'rm -rf "$out"' EXIT
fail() { echo "model_compare.sh smoke test FAILED: $*" >&2; exit 1; }
cat >"$out/tiny5.txt" <<'M'
# 5 tensors for the smoke test
fc.weight 300000  # 1.2 MB: direct path
fc.bias 1000
conv.weight 4096
conv.bias 17
bn.weight 1
M
timeout -k 15 100 "$(dirname "$0")/model_compare.sh" --build-dir "$build" --model "$out/tiny5.txt" \
  --np 2 --reps 1 -w 1 -n 3 -T 0.5 -c 1 --out "$out/logs" >"$out/run.log" 2>&1
rc=$?
cat "$out/run.log"
[ "$rc" -eq 0 ] || fail "model_compare.sh exited with status $rc"
grep -q '^#   kolo async [0-9.]* us, kolo blocking [0-9.]* us, #wrong 0 ' "$out/run.log" ||
  fail "no verified kolo run line"
grep -q '^#   MPI loop [0-9.]* us, #wrong 0 ' "$out/run.log" || fail "no verified MPI run line"
grep -q '^# Blocking loop (per tensor, reverse order' "$out/logs/kolo-n2-r1.table" ||
  fail "kolo-bench --blocking printed no blocking-loop line"
grep -q '^# Out of bounds values : 0 OK' "$out/logs/mpi-n2-r1.log" || fail "MPI loop not verified"
awk '$1 == 2 && NF >= 8 && /(met|NOT MET) +(met|NOT MET)$/ {ok = 1} END {exit !ok}' "$out/run.log" ||
  fail "no summary row for N=2 with the targets"
echo "model_compare.sh smoke test passed"
