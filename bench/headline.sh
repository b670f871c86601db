#!/usr/bin/env bash
# headline.sh: the one-node headline of docs/benchmarks.md in one command.
# Allreduce, float32 sum, in place on every side, N ranks on this machine:
#   kolo, user memory     kolorun -np N -- kolo-bench --inplace
#   kolo, shared memory   kolorun -np N -- kolo-bench --inplace --zero-copy (kolo_alloc_shared)
#   Open MPI, in place    mpirun -np N --mca pml ob1 --mca btl self,vader mpi-allreduce-bench --inplace
# Each N runs the three --repeats times, alternating their order (ABC, CBA,
# ...) so that a change of machine load hits all of them; each size keeps the
# best (lowest-time) run of each system. Writes the raw tables to --data,
# the plot (bench/plot_busbw.py) to --png, and the Markdown table between
#   <!-- headline:one-node:begin --> and <!-- headline:one-node:end -->
# in --doc, preceded by the date, machine, load and command.
#
#   bench/headline.sh                         # build/, N "2 4", 4 B .. 64 MiB, 2 repeats
#   bench/headline.sh --np 2 -e 1M --repeats 1 --doc "" --png /tmp/x.png --data /tmp/x
#
# Exit status: 0 when every run succeeded (and verified), 1 otherwise, 2 for
# bad usage or missing programs.
set -u -o pipefail
export LC_ALL=C

root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/scripts/python-env.sh"  # KOLO_PYTHON: kolo's venv (matplotlib for the plot)
build_dir=$root/build nps="2 4" minb=4 maxb=64M repeats=2 maxtime=0.5 run_timeout=600
data=$root/docs/data/one-node png=$root/docs/img/one_node_busbw.png doc=$root/docs/benchmarks.md
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build_dir=$2; shift 2 ;;
    --np) nps=$2; shift 2 ;;
    -b|--minbytes) minb=$2; shift 2 ;;
    -e|--maxbytes) maxb=$2; shift 2 ;;
    -T|--max-time) maxtime=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --png) png=$2; shift 2 ;;
    --doc) doc=$2; shift 2 ;;
    --timeout) run_timeout=$2; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "headline.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
bin=$build_dir/bin
for p in kolorun kolo-bench mpi-allreduce-bench; do
  [ -x "$bin/$p" ] || { echo "headline.sh: $bin/$p not found (build it, or pass --build-dir)" >&2; exit 2; }
done
command -v mpirun >/dev/null || { echo "headline.sh: mpirun not in PATH" >&2; exit 2; }
mkdir -p "$data" || exit 2
rm -f "$data"/*.table

args=(-b "$minb" -e "$maxb" -f 2 -w 5 -n 20 -T "$maxtime" -c 1 --inplace)
machine="$(nproc) cores ($(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)),"
machine+=" $(awk '/^MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo),"
machine+=" $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME"), $(mpirun --version 2>/dev/null | head -n 1)"
commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo "?")
start=$(date -u +%Y-%m-%dT%H:%MZ)
loads=()
status=0

# run SYSTEM N REPEAT: one table, $data/SYSTEM-nN-rREPEAT.table (rank 0's lines).
run() {
  local sys=$1 n=$2 r=$3 out=$data/$1-n$2-r$3 cmd
  case "$sys" in
    kolo-user) cmd=("$bin/kolorun" -np "$n" -- "$bin/kolo-bench" "${args[@]}") ;;
    kolo-shared) cmd=("$bin/kolorun" -np "$n" -- "$bin/kolo-bench" "${args[@]}" --zero-copy) ;;
    mpi) cmd=(mpirun --oversubscribe --allow-run-as-root -np "$n" --mca pml ob1 --mca btl self,vader
              "$bin/mpi-allreduce-bench" "${args[@]}") ;;
  esac
  loads+=("$(cut -d' ' -f1 /proc/loadavg)")
  echo "## $sys N=$n run $r, load $(cut -d' ' -f1-3 /proc/loadavg): ${cmd[*]}"
  timeout -k 15 "$run_timeout" "${cmd[@]}" >"$out.log" 2>&1
  local rc=$?
  # kolorun prefixes rank 0's lines with "[0]<stdout>:"; mpirun prints rank 0's alone.
  if [ "$sys" = mpi ]; then grep -v '^\[' "$out.log" >"$out.table"; else sed -n 's/^\[0\]<stdout>://p' "$out.log" >"$out.table"; fi
  cat "$out.table"
  if [ "$rc" -ne 0 ]; then
    echo "## $sys N=$n FAILED (exit $rc)"; tail -n 20 "$out.log"; status=1
  fi
  rm -f "$out.log"
}

order=(kolo-user kolo-shared mpi)
for ((r = 0; r < repeats; ++r)); do
  for n in $nps; do
    if [ $((r % 2)) = 0 ]; then seq=("${order[@]}"); else seq=(mpi kolo-shared kolo-user); fi
    for sys in "${seq[@]}"; do run "$sys" "$n" "$r"; done
  done
done
end=$(date -u +%H:%MZ)
load_range=$(printf '%s\n' "${loads[@]}" | sort -n | awk 'NR == 1 {lo = $1} {hi = $1} END {print lo "-" hi}')

series=()
label() { case "$1" in kolo-user) echo "kolo, user memory" ;; kolo-shared) echo "kolo, kolo_alloc_shared" ;; mpi) echo "Open MPI, in place" ;; esac; }
for n in $nps; do
  for sys in "${order[@]}"; do
    files=$(ls "$data/$sys-n$n-"r*.table 2>/dev/null | paste -sd, -)
    [ -n "$files" ] && series+=(-s "N=$n|$(label "$sys")=$files")
  done
done
"$KOLO_PYTHON" "$root/bench/plot_busbw.py" "${series[@]}" --out "$png" --markdown "$data/headline.md" \
  --title "One node, allreduce float32 in place ($(date -u +%Y-%m-%d), load $load_range)" || status=1
cat "$data/headline.md"

cmdline="bench/headline.sh"
[ "$nps" = "2 4" ] || cmdline+=" --np \"$nps\""
[ "$maxb" = 64M ] || cmdline+=" -e $maxb"
[ "$repeats" = 2 ] || cmdline+=" --repeats $repeats"
{
  echo "Measured $start-$end (commit $commit) on $machine;"
  echo "1-minute load average $load_range during the runs (other engineers building and testing on"
  echo "the same 2 cores: noisy). Best of $repeats alternating runs per size; every row verified."
  echo "Regenerate: \`$cmdline\` (tables in \`${data#"$root"/}/\`; kolo's agent and libkolo as on main at"
  echo "this commit, only bench/ differs)."
  echo
  cat "$data/headline.md"
} >"$data/headline-block.md"
if [ -n "$doc" ]; then
  if grep -q '<!-- headline:one-node:begin -->' "$doc" && grep -q '<!-- headline:one-node:end -->' "$doc"; then
    "$KOLO_PYTHON" - "$doc" "$data/headline-block.md" <<'EOF'
import sys
doc, block = sys.argv[1], open(sys.argv[2]).read()
text = open(doc).read()
b, e = "<!-- headline:one-node:begin -->", "<!-- headline:one-node:end -->"
head, rest = text.split(b, 1)
_, tail = rest.split(e, 1)
open(doc, "w").write(head + b + "\n" + block + e + tail)
EOF
    echo "# headline.sh: updated $doc and $png"
  else
    echo "headline.sh: $doc has no headline:one-node markers; table left in $data/headline-block.md" >&2
    status=1
  fi
fi
exit "$status"
