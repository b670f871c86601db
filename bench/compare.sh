#!/usr/bin/env bash
# compare.sh: kolo-bench (under kolorun) against mpi-allreduce-bench (under
# Open MPI's mpirun) on this machine, in one invocation, same sizes, same
# timing method; prints both tables and a side-by-side comparison per
# collective and N.
#
#   bench/compare.sh [--build-dir DIR] [--op "allreduce allgather"|all] [--np "2 4"]
#                    [-b 4] [-e 256M] [--tcp]
#
# Exit status: 0 when every run succeeded (and verified), 1 otherwise, 2 for
# bad usage or missing programs. See docs/bench-tools.md.
set -u -o pipefail
export LC_ALL=C

usage() {
  cat <<'EOF'
Usage: compare.sh [options]
  --build-dir DIR     build tree holding bin/kolorun, bin/kolo-bench, bin/mpi-allreduce-bench
                      (default ./build)
  --op "OP1 OP2 ..."  collectives: allreduce allgather broadcast alltoall reducescatter
                      barrier, or "all" for every one (default allreduce)
  --np "N1 N2 ..."    rank counts (default "2 4")
  -b, --minbytes S    smallest size (default 4; K/M/G suffixes)
  -e, --maxbytes S    largest size (default 256M)
  -f, --stepfactor F  size multiplier (default 2)
  -w, --warmup N      warm-up iterations (default 5)
  -n, --iters N       timed iterations (default 20)
  -T, --max-time S    cut each size's timed loop to ~S seconds (default 0.5)
  -c, --check 0|1     verify results (default 1)
  --zero-copy         kolo-bench allocates its buffers with kolo_alloc_shared
  --out-of-place      allreduce with separate input and output buffers on both sides (default:
                      in place, kolo-bench --inplace against MPI_IN_PLACE, MPI's strongest form)
  --tcp               MPI over TCP on loopback (--mca btl self,tcp --mca btl_tcp_if_include lo)
                      and kolo with one agent per rank talking over TCP (UCX_TLS=tcp)
  --kolorun-args "A"  extra kolorun options (default: none; with --tcp: "--agents N")
  --mpirun-args "A"   extra mpirun options
  --timeout S         per-run limit in seconds (default 600)
  --out DIR           keep the logs and JSON files there (default: a temporary directory, removed)
  --skip-kolo / --skip-mpi   run one side only
EOF
}

build_dir=./build
all_ops="allreduce allgather broadcast alltoall reducescatter barrier"
ops=allreduce
nps="2 4"
minb=4 maxb=256M step=2 warmup=5 iters=20 maxtime=0.5 check=1
zero_copy=0 inplace=1 tcp=0 kolorun_args="" kolorun_args_set=0 mpirun_args="" run_timeout=600
out_dir="" skip_kolo=0 skip_mpi=0

while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build_dir=$2; shift 2 ;;
    --op|--ops) ops=$2; shift 2 ;;
    --np) nps=$2; shift 2 ;;
    -b|--minbytes) minb=$2; shift 2 ;;
    -e|--maxbytes) maxb=$2; shift 2 ;;
    -f|--stepfactor) step=$2; shift 2 ;;
    -w|--warmup) warmup=$2; shift 2 ;;
    -n|--iters) iters=$2; shift 2 ;;
    -T|--max-time) maxtime=$2; shift 2 ;;
    -c|--check) check=$2; shift 2 ;;
    --zero-copy) zero_copy=1; shift ;;
    --out-of-place) inplace=0; shift ;;
    --inplace) inplace=1; shift ;;
    --tcp) tcp=1; shift ;;
    --kolorun-args) kolorun_args=$2; kolorun_args_set=1; shift 2 ;;
    --mpirun-args) mpirun_args=$2; shift 2 ;;
    --timeout) run_timeout=$2; shift 2 ;;
    --out) out_dir=$2; shift 2 ;;
    --skip-kolo) skip_kolo=1; shift ;;
    --skip-mpi) skip_mpi=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "compare.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done

[ "$ops" = all ] && ops=$all_ops
for op in $ops; do
  case " $all_ops " in
    *" $op "*) ;;
    *) echo "compare.sh: unknown --op '$op' ($all_ops, or all)" >&2; exit 2 ;;
  esac
done

bin=$build_dir/bin
need() {
  if [ ! -x "$1" ]; then
    echo "compare.sh: $1 not found or not executable ($2)" >&2
    exit 2
  fi
}
if [ "$skip_kolo" = 0 ]; then
  need "$bin/kolorun" "build the kolorun target, or pass --build-dir"
  need "$bin/kolo-bench" "configure with -DKOLO_BUILD_BENCH=ON and build kolo-bench"
fi
if [ "$skip_mpi" = 0 ]; then
  need "$bin/mpi-allreduce-bench" "needs MPI at configure time: apt-get install openmpi-bin libopenmpi-dev"
  command -v mpirun >/dev/null || { echo "compare.sh: mpirun not in PATH" >&2; exit 2; }
fi

if [ -n "$out_dir" ]; then
  mkdir -p "$out_dir" || exit 2
else
  out_dir=$(mktemp -d "${TMPDIR:-/tmp}/kolo-compare.XXXXXX") || exit 2
  trap 'rm -rf "$out_dir"' EXIT
fi

common_args=(-b "$minb" -e "$maxb" -f "$step" -w "$warmup" -n "$iters" -T "$maxtime" -c "$check")
if [ "$tcp" = 1 ]; then
  mpi_transport=(--mca pml ob1 --mca btl self,tcp --mca btl_tcp_if_include lo)
  mode="tcp (loopback)"
else
  # pml ob1: otherwise Open MPI may pick its UCX pml and ignore the btl list.
  mpi_transport=(--mca pml ob1 --mca btl self,vader)
  mode="shared memory"
fi

# Rank 0's lines of a log, without kolorun's "[0]<stdout>:" prefix.
rank0() { sed -n 's/^\[0\]<stdout>://p' "$1"; }
# "size time busbw cpu-s/GB" for each table row ("-": no cpu-s/GB column).
rows() { awk '$1 ~ /^[0-9]+$/ && NF >= 8 {print $1, $5, $7, (NF >= 9 ? $9 : "-")}' "$1"; }
latency() { awk -F' : ' '/^# Latency/ {split($2, a, " "); print a[1]; exit}' "$1"; }
avgbus() { awk -F' : ' '/^# Avg bus bandwidth/ {print $2; exit}' "$1"; }

status=0
summary=()
echo "# compare.sh: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), $(nproc) cores,"\
  "$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo),"\
  "$(awk '/^MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo), load $(cut -d' ' -f1-3 /proc/loadavg),"\
  "transport: $mode, allreduce $([ "$inplace" = 1 ] && echo "in place" || echo "out of place")"
# One pair of runs per collective and N (the two loops share one body).
for op in $ops; do
for np in $nps; do
  kolo_table=$out_dir/kolo-$op-$np.table
  mpi_table=$out_dir/mpi-$op-$np.table
  : >"$kolo_table"
  : >"$mpi_table"

  if [ "$skip_kolo" = 0 ]; then
    kargs=($kolorun_args)
    kenv=()
    if [ "$tcp" = 1 ]; then
      [ "$kolorun_args_set" = 1 ] || kargs=(--agents "$np")
      kenv=(UCX_TLS="${UCX_TLS:-tcp}" UCX_NET_DEVICES="${UCX_NET_DEVICES:-lo}")
    fi
    bargs=(--op "$op" "${common_args[@]}" -d float32 -o sum --json "$out_dir/kolo-$op-$np.json")
    [ "$zero_copy" = 1 ] && bargs+=(--zero-copy)
    [ "$inplace" = 1 ] && [ "$op" = allreduce ] && bargs+=(--inplace)
    cmd=("$bin/kolorun" -np "$np" "${kargs[@]}" -- "$bin/kolo-bench" "${bargs[@]}")
    echo
    echo "## kolo $op, N=$np: ${kenv[*]} ${cmd[*]}"
    env "${kenv[@]}" timeout -k 15 "$run_timeout" "${cmd[@]}" >"$out_dir/kolo-$op-$np.log" 2>&1
    rc=$?
    rank0 "$out_dir/kolo-$op-$np.log" >"$kolo_table"
    cat "$kolo_table"
    if [ "$rc" -ne 0 ]; then
      echo "## kolo-bench FAILED (exit $rc); last lines of its output:"
      tail -n 30 "$out_dir/kolo-$op-$np.log"
      status=1
    fi
  fi

  if [ "$skip_mpi" = 0 ]; then
    margs=($mpirun_args)
    inplace_arg=()
    [ "$inplace" = 1 ] && [ "$op" = allreduce ] && inplace_arg=(--inplace)
    cmd=(mpirun --oversubscribe --allow-run-as-root -np "$np" "${mpi_transport[@]}" "${margs[@]}"
         "$bin/mpi-allreduce-bench" --op "$op" "${inplace_arg[@]}" "${common_args[@]}" --json "$out_dir/mpi-$op-$np.json")
    echo
    echo "## MPI $op, N=$np: ${cmd[*]}"
    timeout -k 15 "$run_timeout" "${cmd[@]}" >"$out_dir/mpi-$op-$np.log" 2>&1
    rc=$?
    # mpirun prints rank 0's lines unprefixed (the other ranks print none).
    cp "$out_dir/mpi-$op-$np.log" "$mpi_table"
    cat "$mpi_table"
    if [ "$rc" -ne 0 ]; then
      echo "## mpi-allreduce-bench FAILED (exit $rc)"
      status=1
    fi
  fi

  if [ "$skip_kolo" = 0 ] && [ "$skip_mpi" = 0 ]; then
    echo
    if [ -z "$(rows "$kolo_table")" ] || [ -z "$(rows "$mpi_table")" ]; then
      echo "## Comparison, $op N=$np: skipped (a benchmark printed no rows)"
      summary+=("$op N=$np: no comparison (a benchmark failed)")
      continue
    fi
    echo "## Comparison, $op N=$np ($mode): busbw ratio = kolo busbw / MPI busbw = MPI time / kolo time;"
    echo "# cpu-s/GB: CPU seconds of every rank (and kolo's agent) over the timed iterations / (size x iterations / 1e9)"
    printf '#%11s%16s%16s%14s%14s%12s%14s%14s\n' size "kolo time(us)" "mpi time(us)" "kolo busbw" "mpi busbw" \
      "kolo/mpi" "kolo cpu-s/GB" "mpi cpu-s/GB"
    join <(rows "$kolo_table" | sort -k1,1) <(rows "$mpi_table" | sort -k1,1) | sort -n -k1,1 |
      awk '{ ratio = ($2 > 0) ? sprintf("%.2f", $5 / $2) : "-";
             printf "%12s%16.2f%16.2f%14.2f%14.2f%12s%14s%14s\n", $1, $2, $5, $3, $6, ratio, $4, $7 }'
    small=$(rows "$kolo_table" | head -n 1 | cut -d' ' -f1)
    target=""
    if [ "$op" = allreduce ]; then
      [ "$np" = 2 ] && [ "$small" = 4 ] && target=" (kolo target <= 30 us)"
      [ "$np" = 4 ] && [ "$small" = 4 ] && target=" (kolo target <= 60 us)"
    fi
    line="$op N=$np: latency at $small B: kolo $(latency "$kolo_table") us, MPI $(latency "$mpi_table") us$target;"
    line+=" avg busbw kolo $(avgbus "$kolo_table") GB/s, MPI $(avgbus "$mpi_table") GB/s"
    echo "# $line"
    summary+=("$line")
  fi
done
done

if [ ${#summary[@]} -gt 0 ]; then
  echo
  echo "## Summary ($mode)"
  for s in "${summary[@]}"; do echo "# $s"; done
fi
[ "$status" = 0 ] || echo "## compare.sh: at least one benchmark FAILED" >&2
exit "$status"
