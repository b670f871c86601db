#!/usr/bin/env bash
# model_compare.sh: "many tensors, user memory". One
# model's gradients (default ResNet-50: 161 tensors) allreduced three ways on
# this machine, in one invocation, alternating the systems run by run:
#   kolo async     kolo-bench --model-step: every tensor kolo_allreduce_async in
#                  reverse order, then synchronize all (Horovod's pattern)
#   kolo blocking  kolo-bench --model-step --blocking: each tensor submitted and
#                  synchronized before the next (same run as kolo async, interleaved)
#   MPI loop       mpi-allreduce-bench --model-step: MPI_Allreduce(MPI_IN_PLACE) of
#                  each tensor in reverse order (Open MPI, shared memory: pml ob1, btl self,vader)
# kolo runs under kolorun (its embedded coordinator and one agent), with the
# gradients in the trainer's own memory (no --zero-copy). Each figure is the
# median over steps of the slowest rank's step time; the summary takes the
# median over the --reps runs and checks the targets:
#   kolo async <= MPI loop;  kolo blocking <= 1.5 x MPI loop.
#
#   bench/model_compare.sh                       # resnet50, N=2 and N=4, 3 alternations
#   bench/model_compare.sh --np "2 4" --reps 5 --model bench/models/resnet50.txt
#
# Exit status: 0 when every run succeeded and verified (a missed target is
# reported, not a failure), 1 if a run failed, 2 for bad usage or missing programs.
set -u -o pipefail
export LC_ALL=C

usage() {
  cat <<'EOF'
Usage: model_compare.sh [options]
  --build-dir DIR    build tree with bin/kolorun, bin/kolo-bench, bin/mpi-allreduce-bench
                     (default: this script's directory's parent if it is a build's bin/, else ./build)
  --model FILE       model file (default: models/resnet50.txt next to this script)
  --np "N1 N2"       rank counts (default "2 4")
  --reps R           alternations: R runs of each system at each N (default 3)
  -w, --warmup N     warm-up steps per run (default 2)
  -n, --iters N      timed steps per run (default 20, cut by -T)
  -T, --max-time S   cut each run's timed steps to ~S seconds (default 2)
  -c, --check 0|1    verify one step of each kind per run (default 1)
  --timeout S        per-run limit in seconds (default 300)
  --out DIR          keep the logs (default: a temporary directory, removed)
EOF
}

script_dir=$(cd "$(dirname "$0")" && pwd)
if [ -x "$script_dir/kolo-bench" ]; then build_dir=$(dirname "$script_dir"); else build_dir=./build; fi
model=$script_dir/models/resnet50.txt
nps="2 4" reps=3 warmup=2 iters=20 maxtime=2 check=1 run_timeout=300 out_dir=""
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build_dir=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --np) nps=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    -w|--warmup) warmup=$2; shift 2 ;;
    -n|--iters) iters=$2; shift 2 ;;
    -T|--max-time) maxtime=$2; shift 2 ;;
    -c|--check) check=$2; shift 2 ;;
    --timeout) run_timeout=$2; shift 2 ;;
    --out) out_dir=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "model_compare.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
bad() { echo "model_compare.sh: $*" >&2; exit 2; }
for v in $nps $reps; do
  case "$v" in ''|*[!0-9]*|0) bad "--np and --reps take positive numbers" ;; esac
done
bin=$build_dir/bin
for p in kolorun kolo-bench kolo-agent kolo-coordinator mpi-allreduce-bench; do
  [ -x "$bin/$p" ] || bad "$bin/$p not found (build it, or pass --build-dir; mpi-allreduce-bench needs libopenmpi-dev)"
done
command -v mpirun >/dev/null || bad "mpirun not in PATH (apt-get install openmpi-bin)"
[ -f "$model" ] || bad "no model file $model"
name=$(basename "$model"); name=${name%.*}

tmp_out=""
trap '[ -z "$tmp_out" ] || rm -rf "$tmp_out"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
if [ -n "$out_dir" ]; then
  mkdir -p "$out_dir" || exit 2
else
  out_dir=$(mktemp -d "${TMPDIR:-/tmp}/kolo-model-compare.XXXXXX") || exit 2
  tmp_out=$out_dir
fi

machine() {
  echo "$(hostname), $(nproc) cores, $(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)," \
    "$(awk '/^MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo)"
}
load() { cut -d' ' -f1-3 /proc/loadavg; }
echo "# model_compare.sh: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(machine), load $(load)"
echo "# model $name ($model), N in {$nps}, $reps alternation(s); kolo: kolorun, one embedded agent," \
  "user memory; MPI: pml ob1, btl self,vader"

bargs=(-w "$warmup" -n "$iters" -T "$maxtime" -c "$check")
status=0
# Per N: space-separated figures over the reps.
declare -A k_async k_block m_loop
# Per N and run ("N,R"): that run's figure, for the paired ratios.
declare -A ka kb ml

# median of the arguments ("-" when none)
median() {
  [ $# -gt 0 ] || { echo -; return; }
  printf '%s\n' "$@" | sort -g | awk '{a[NR] = $1} END {
    if (NR % 2) print a[(NR + 1) / 2]; else printf "%.4f\n", (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}

run_kolo() {  # N REP
  local n=$1 r=$2 tag=kolo-n$1-r$2
  local cmd=("$bin/kolorun" -np "$n" -- "$bin/kolo-bench" --model-step "$model" --blocking "${bargs[@]}")
  echo "## kolo async + blocking, N=$n, run $r: ${cmd[*]}"
  timeout -k 15 "$run_timeout" "${cmd[@]}" >"$out_dir/$tag.log" 2>&1
  local rc=$?
  sed -n 's/^\[0\]<stdout>://p' "$out_dir/$tag.log" >"$out_dir/$tag.table"
  local a b w
  a=$(awk -v m="$name" '$1 == m && NF == 12 {print $6; exit}' "$out_dir/$tag.table")
  w=$(awk -v m="$name" '$1 == m && NF == 12 {print $12; exit}' "$out_dir/$tag.table")
  b=$(sed -n 's/^# Blocking loop.*time(us) \([0-9.]*\).*/\1/p' "$out_dir/$tag.table" | head -n 1)
  if [ "$rc" -ne 0 ] || [ -z "$a" ] || [ -z "$b" ] || { [ "$check" = 1 ] && [ "$w" != 0 ]; }; then
    echo "## kolo-bench FAILED (exit $rc, #wrong ${w:-none}); last lines of its output:"
    tail -n 30 "$out_dir/$tag.log"
    status=1
    return
  fi
  echo "#   kolo async $a us, kolo blocking $b us, #wrong $w (load $(load))"
  k_async[$n]+=" $a"
  k_block[$n]+=" $b"
  ka[$n,$r]=$a kb[$n,$r]=$b
}

run_mpi() {  # N REP
  local n=$1 r=$2 tag=mpi-n$1-r$2
  local cmd=(mpirun --allow-run-as-root --oversubscribe -np "$n" --mca pml ob1 --mca btl self,vader
             "$bin/mpi-allreduce-bench" --model-step "$model" "${bargs[@]}")
  echo "## MPI loop, N=$n, run $r: ${cmd[*]}"
  timeout -k 15 "$run_timeout" "${cmd[@]}" >"$out_dir/$tag.log" 2>&1
  local rc=$?
  local t w
  t=$(sed -n 's/^# Model step (MPI blocking per-tensor loop) : \([0-9.]*\) us.*/\1/p' "$out_dir/$tag.log" | head -n 1)
  w=$(awk -v m="$name" '$1 == m && NF == 9 {print $8; exit}' "$out_dir/$tag.log")
  if [ "$rc" -ne 0 ] || [ -z "$t" ] || { [ "$check" = 1 ] && [ "$w" != 0 ]; }; then
    echo "## mpi-allreduce-bench FAILED (exit $rc, #wrong ${w:-none}); last lines of its output:"
    tail -n 30 "$out_dir/$tag.log"
    status=1
    return
  fi
  echo "#   MPI loop $t us, #wrong $w (load $(load))"
  m_loop[$n]+=" $t"
  ml[$n,$r]=$t
}

for r in $(seq 1 "$reps"); do
  for n in $nps; do
    # Alternate which system goes first, so neither always runs on the warmer machine.
    if [ $((r % 2)) = 1 ]; then run_kolo "$n" "$r"; run_mpi "$n" "$r"
    else run_mpi "$n" "$r"; run_kolo "$n" "$r"; fi
  done
done

echo
echo "## Summary: $name, user memory, one agent; medians over $reps run(s) of each" \
  "run's median step (slowest rank); load $(load)"
echo "# targets: kolo async <= MPI loop; kolo blocking <= 1.5 x MPI loop"
printf '#%3s %15s %18s %13s %10s %13s %16s %22s\n' N "kolo async(us)" "kolo blocking(us)" "MPI loop(us)" \
  async/MPI blocking/MPI "async <= MPI" "blocking <= 1.5x MPI"
for n in $nps; do
  # shellcheck disable=SC2086
  a=$(median ${k_async[$n]:-}) b=$(median ${k_block[$n]:-}) m=$(median ${m_loop[$n]:-})
  if [ "$a" = - ] || [ "$b" = - ] || [ "$m" = - ]; then
    printf '%4s %15s %18s %13s  (a run failed)\n' "$n" "$a" "$b" "$m"
    continue
  fi
  awk -v n="$n" -v a="$a" -v b="$b" -v m="$m" 'BEGIN {
    printf "%4s %15.1f %18.1f %13.1f %10.2f %13.2f %16s %22s\n", n, a, b, m, a / m, b / m,
           (a <= m ? "met" : "NOT MET"), (b <= 1.5 * m ? "met" : "NOT MET") }'
done
# On a shared machine the load drifts between runs: each run's kolo figures
# over the MPI run next to it (same alternation) cancel most of the drift.
echo "# paired: median over alternations of (kolo run / the MPI run beside it)"
printf '#%3s %16s %19s %16s %22s\n' N "async/MPI paired" "blocking/MPI paired" "async <= MPI" "blocking <= 1.5x MPI"
for n in $nps; do
  ra=() rb=()
  for r in $(seq 1 "$reps"); do
    [ -n "${ka[$n,$r]:-}" ] && [ -n "${ml[$n,$r]:-}" ] || continue
    ra+=("$(awk -v x="${ka[$n,$r]}" -v y="${ml[$n,$r]}" 'BEGIN {printf "%.4f", x / y}')")
    rb+=("$(awk -v x="${kb[$n,$r]}" -v y="${ml[$n,$r]}" 'BEGIN {printf "%.4f", x / y}')")
  done
  [ ${#ra[@]} -gt 0 ] || { printf '%4s  (no pair)\n' "$n"; continue; }
  pa=$(median "${ra[@]}") pb=$(median "${rb[@]}")
  awk -v n="$n" -v a="$pa" -v b="$pb" 'BEGIN {
    printf "%4s %16.2f %19.2f %16s %22s\n", n, a, b, (a <= 1 ? "met" : "NOT MET"), (b <= 1.5 ? "met" : "NOT MET") }'
done
for n in $nps; do
  echo "# N=$n runs (us): kolo async:${k_async[$n]:- none}; kolo blocking:${k_block[$n]:- none};" \
    "MPI loop:${m_loop[$n]:- none}"
done
[ "$status" = 0 ] || echo "## model_compare.sh: at least one run FAILED" >&2
exit "$status"
