#!/usr/bin/env bash
# CTest (label bench) of the CPU figures (cpu-s/GB, idle CPU), small, seconds:
# kolo-bench at N=2 under kolorun (embedded agent), mpi-allreduce-bench under
# mpirun and gloo-allreduce-bench (each when built) must print the cpu-s/GB
# column, positive on every row; kolo-bench --idle-check 2 must find its
# agent and show that the agent and the ranks, idle (no collective in flight)
# for 2 s, used less than 5% of one core (a busy-polling agent uses 100%).
#   cpu_test.sh BIN_DIR
set -u
bin=$1
out=$(mktemp -d "${TMPDIR:-/tmp}/kolo-bench-cpu.XXXXXX") || exit 1
trap 'rm -rf "$out"' EXIT
fail() { echo "cpu test FAILED: $*" >&2; exit 1; }

# check_rows NAME TABLE: every row has 9 columns and cpu-s/GB > 0.
check_rows() {
  grep -q '#wrong    cpu-s/GB$' "$2" || fail "$1: no cpu-s/GB column in the header"
  grep -q '^# cpu-s/GB = CPU seconds' "$2" || fail "$1: no cpu-s/GB definition line"
  local rows bad
  rows=$(awk '$1 ~ /^[0-9]+$/ && NF >= 8' "$2" | wc -l)
  bad=$(awk '$1 ~ /^[0-9]+$/ && NF >= 8 && !(NF == 9 && $8 == 0 && $9 + 0 > 0)' "$2" | wc -l)
  [ "$rows" -ge 3 ] || fail "$1: $rows rows"
  [ "$bad" -eq 0 ] || fail "$1: $bad rows without a positive cpu-s/GB (or wrong elements)"
  echo "cpu test: $1: $rows rows, cpu-s/GB $(awk '$1 ~ /^[0-9]+$/ && NF == 9 {printf "%s ", $9}' "$2")"
}
args=(-b 64K -e 1M -f 4 -w 1 -n 5 -c 1)

timeout -k 15 90 "$bin/kolorun" -np 2 -- "$bin/kolo-bench" "${args[@]}" --idle-check 2 \
  >"$out/kolo.log" 2>&1 || { cat "$out/kolo.log"; fail "kolo-bench exited with status $?"; }
sed -n 's/^\[0\]<stdout>://p' "$out/kolo.log" >"$out/kolo.table"
cat "$out/kolo.table"
grep -q '^# cpu-s/GB .*agent CPU: pid [0-9]' "$out/kolo.table" || fail "kolo: the agent was not found"
check_rows kolo "$out/kolo.table"
idle=$(awk -F' : ' '/^# Idle CPU/ {split($2, a, " "); print a[1]}' "$out/kolo.table")
[ -n "$idle" ] || fail "kolo: no idle CPU line"
awk -v c="$idle" 'BEGIN { exit (c < 0.1) ? 0 : 1 }' ||
  fail "kolo: idle agent and ranks used $idle s of CPU in 2 s (busy polling?)"
echo "cpu test: idle kolo (agent + 2 ranks, 2 s): $idle s of CPU"

if [ -x "$bin/mpi-allreduce-bench" ] && command -v mpirun >/dev/null; then
  timeout -k 15 90 mpirun --oversubscribe --allow-run-as-root -np 2 --mca pml ob1 --mca btl self,vader \
    "$bin/mpi-allreduce-bench" --inplace "${args[@]}" >"$out/mpi.table" 2>&1 ||
    { cat "$out/mpi.table"; fail "mpi-allreduce-bench failed"; }
  check_rows mpi "$out/mpi.table"
fi

if [ -x "$bin/gloo-allreduce-bench" ]; then
  mkdir "$out/store"
  pids=()
  for r in 0 1; do
    timeout -k 15 90 "$bin/gloo-allreduce-bench" --rank $r --size 2 --store "$out/store" \
      --host 127.0.0.1 --inplace "${args[@]}" >"$out/gloo-$r.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || { cat "$out"/gloo-*.log; fail "gloo-allreduce-bench failed"; }; done
  check_rows gloo "$out/gloo-0.log"
fi
echo "cpu test passed"
