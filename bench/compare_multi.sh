#!/usr/bin/env bash
# compare_multi.sh: the across-agents figures. kolo across K agents (each acting as
# a node, talking UCX over TCP) against, in the same invocation and on the
# same path, Open MPI over TCP, Gloo's ring allreduce over TCP and iperf3's
# bandwidth; prints every table, a comparison table per kolo configuration
# (ratios kolo/iperf3, kolo/Gloo, kolo/MPI) and pass/fail against the
# targets:
#   busbw at 16 MiB and 64 MiB >= 90% of iperf3 and >= 1.3x Gloo's busbw;
#   4-byte allreduce across 2 agents <= 100 us (median of the slowest rank).
#
#   bench/compare_multi.sh --build-dir build-bench                 # loopback (lo)
#   bench/compare_multi.sh --build-dir build-bench --veth          # two netns joined by a veth pair
#
# Exit status: 0 when every run succeeded and verified (targets missed are
# reported, not failures), 1 if a run failed or found wrong elements, 2 for
# bad usage or missing programs, 77 when --veth cannot run here (not root,
# no CAP_NET_ADMIN). See docs/bench-tools.md.
set -u -o pipefail
export LC_ALL=C

usage() {
  cat <<'EOF'
Usage: compare_multi.sh [options]
  --build-dir DIR          build tree with bin/kolo-bench, bin/kolo-agent, bin/kolo-coordinator,
                           bin/mpi-allreduce-bench, bin/gloo-allreduce-bench (default: this
                           script's directory's parent if it is a build's bin/, else ./build)
  --agents "K1 K2"         agent counts (default "2 4")
  --ranks-per-agent "R.."  ranks on each agent (default "1 2"); every K x R pair runs
  -b, --minbytes S         smallest size (default 4; K/M/G suffixes)
  -e, --maxbytes S         largest size (default 256M)
  -f, --stepfactor F       size multiplier (default 2)
  -w, --warmup N           warm-up iterations (default 5)
  -n, --iters N            timed iterations (default 20)
  -T, --max-time S         cut each size's timed loop to ~S seconds (default 0.5)
  -c, --check 0|1          verify results (default 1)
  --inplace                every allreduce in place (output = input), the default: kolo-bench
                           --inplace, Gloo without an input, MPI_IN_PLACE (each one's strongest form)
  --out-of-place           every allreduce out of place (separate input and output) instead
  --veth                   run on a veth pair between two network namespaces (kolo-bench-a,
                           10.200.0.1 and kolo-bench-b, 10.200.0.2; removed at exit; needs root);
                           K must be even (agents and ranks split in two blocks)
  --kolo-memory "M.."      kolo-bench's buffers: user (copy-in/copy-out, default) and/or shared
                           (--zero-copy, kolo_alloc_shared: the ranks' tensors live in the agent's
                           arena, as Gloo and MPI work on the caller's buffer); every mode runs for
                           every K x R
  --launcher script|kolorun  start kolo's agents with bench/multi_agent_run.sh (default) or
                           with kolorun --agents K (loopback only)
  --agent-env "K=V ..."    extra environment for kolo's agents and ranks (e.g. UCX_RNDV_THRESH=inf,
                           KOLO_BACKEND_CHUNK_BYTES=1048576) to A/B a setting with the same command;
                           printed in the header
  --iperf-time S           iperf3 -t (default 3)
  --timeout S              per-run limit in seconds (default 600)
  --out DIR                keep logs and JSON there (default: a temporary directory, removed)
  --from DIR               run nothing: print the comparison and targets again from the
                           tables a previous run kept with --out DIR (same --agents etc.)
  --skip-kolo / --skip-mpi / --skip-gloo / --skip-iperf
EOF
}

script_dir=$(cd "$(dirname "$0")" && pwd)
if [ -x "$script_dir/kolo-bench" ]; then build_dir=$(dirname "$script_dir"); else build_dir=./build; fi
agent_counts="2 4" rpas="1 2"
minb=4 maxb=256M step=2 warmup=5 iters=20 maxtime=0.5 check=1
agent_env=""
kolo_memory="user"
veth=0 launcher=script iperf_time=3 run_timeout=600 out_dir="" from_dir=""
skip_kolo=0 skip_mpi=0 skip_gloo=0 skip_iperf=0 inplace=1
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build_dir=$2; shift 2 ;;
    --agents) agent_counts=$2; shift 2 ;;
    --ranks-per-agent) rpas=$2; shift 2 ;;
    -b|--minbytes) minb=$2; shift 2 ;;
    -e|--maxbytes) maxb=$2; shift 2 ;;
    -f|--stepfactor) step=$2; shift 2 ;;
    -w|--warmup) warmup=$2; shift 2 ;;
    -n|--iters) iters=$2; shift 2 ;;
    -T|--max-time) maxtime=$2; shift 2 ;;
    -c|--check) check=$2; shift 2 ;;
    --inplace) inplace=1; shift ;;
    --out-of-place) inplace=0; shift ;;
    --veth) veth=1; shift ;;
    --launcher) launcher=$2; shift 2 ;;
    --agent-env) agent_env=$2; shift 2 ;;
    --kolo-memory) kolo_memory=$2; shift 2 ;;
    --iperf-time) iperf_time=$2; shift 2 ;;
    --timeout) run_timeout=$2; shift 2 ;;
    --out) out_dir=$2; shift 2 ;;
    --from) from_dir=$2; shift 2 ;;
    --skip-kolo) skip_kolo=1; shift ;;
    --skip-mpi) skip_mpi=1; shift ;;
    --skip-gloo) skip_gloo=1; shift ;;
    --skip-iperf) skip_iperf=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "compare_multi.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
bad() { echo "compare_multi.sh: $*" >&2; exit 2; }
for k in $agent_counts $rpas; do
  case "$k" in ''|*[!0-9]*|0) bad "--agents and --ranks-per-agent take positive numbers" ;; esac
done
case "$launcher" in script|kolorun) ;; *) bad "--launcher is 'script' or 'kolorun'" ;; esac
[ -n "$kolo_memory" ] || bad "--kolo-memory needs at least one of: user shared"
for m in $kolo_memory; do
  case "$m" in user|shared) ;; *) bad "--kolo-memory takes 'user' and/or 'shared' (got '$m')" ;; esac
done
if [ "$veth" = 1 ]; then
  [ "$launcher" = script ] || bad "--veth needs --launcher script (kolorun cannot place agents in namespaces)"
  for k in $agent_counts; do [ $((k % 2)) = 0 ] || bad "--veth needs even agent counts (got $k)"; done
fi

replay=0
if [ -n "$from_dir" ]; then
  [ -d "$from_dir" ] || bad "--from $from_dir: no such directory"
  replay=1 out_dir=$from_dir skip_kolo=1 skip_mpi=1 skip_gloo=1 skip_iperf=1
fi

bin=$build_dir/bin
if [ "$skip_kolo" = 0 ]; then
  for p in kolo-bench kolo-agent kolo-coordinator; do
    [ -x "$bin/$p" ] || bad "$bin/$p not found (build it, or pass --build-dir)"
  done
  [ "$launcher" = script ] || [ -x "$bin/kolorun" ] || bad "$bin/kolorun not found"
fi
skip_note=()
if [ "$skip_mpi" = 0 ] && { [ ! -x "$bin/mpi-allreduce-bench" ] || ! command -v mpirun >/dev/null; }; then
  skip_mpi=1
  skip_note+=("MPI skipped: mpi-allreduce-bench not built or mpirun missing (apt-get install openmpi-bin libopenmpi-dev)")
fi
if [ "$skip_gloo" = 0 ] && [ ! -x "$bin/gloo-allreduce-bench" ]; then
  skip_gloo=1
  skip_note+=("Gloo skipped: gloo-allreduce-bench not built (apt-get install libgloo-dev, re-run cmake)")
fi
if [ "$skip_iperf" = 0 ] && ! command -v iperf3 >/dev/null; then
  skip_iperf=1
  skip_note+=("iperf3 skipped: not installed (apt-get install iperf3)")
fi
if [ "$skip_iperf" = 0 ] && ! command -v python3 >/dev/null; then
  skip_iperf=1
  skip_note+=("iperf3 skipped: python3 (to read its JSON) not found")
fi

ns_a=kolo-bench-a ns_b=kolo-bench-b
made_ns=0
bg_pids=()  # background programs started here (iperf3 server, Gloo ranks)
tmp_out=""
cleanup() {
  local p
  for p in "${bg_pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  if [ "$made_ns" = 1 ]; then
    ip netns del "$ns_a" 2>/dev/null   # takes the veth pair with it
    ip netns del "$ns_b" 2>/dev/null
  fi
  [ -z "$tmp_out" ] || rm -rf "$tmp_out"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if [ -n "$out_dir" ]; then
  mkdir -p "$out_dir" || exit 2
else
  out_dir=$(mktemp -d "${TMPDIR:-/tmp}/kolo-compare-multi.XXXXXX") || exit 2
  tmp_out=$out_dir
fi

if [ "$veth" = 1 ] && [ "$replay" = 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "compare_multi.sh: SKIPPED --veth: needs root (ip netns / veth need CAP_NET_ADMIN)" >&2
    exit 77
  fi
  if ip netns list 2>/dev/null | grep -qE "^($ns_a|$ns_b)( |$)"; then
    echo "compare_multi.sh: namespaces $ns_a/$ns_b exist already (another run, or a killed one:" \
      "ip netns del $ns_a; ip netns del $ns_b)" >&2
    exit 2
  fi
  if ! ip netns add "$ns_a" 2>"$out_dir/netns.err"; then
    echo "compare_multi.sh: SKIPPED --veth: cannot create a network namespace" \
      "(no CAP_NET_ADMIN?): $(cat "$out_dir/netns.err")" >&2
    exit 77
  fi
  made_ns=1
  # Both ends are called kbveth inside their namespace, so one UCX_NET_DEVICES fits both.
  if ! { ip netns add "$ns_b" &&
         ip link add kbv-a-$$ type veth peer name kbv-b-$$ &&
         ip link set kbv-a-$$ netns "$ns_a" && ip link set kbv-b-$$ netns "$ns_b" &&
         ip -n "$ns_a" link set kbv-a-$$ name kbveth && ip -n "$ns_b" link set kbv-b-$$ name kbveth &&
         ip -n "$ns_a" addr add 10.200.0.1/24 dev kbveth && ip -n "$ns_b" addr add 10.200.0.2/24 dev kbveth &&
         ip -n "$ns_a" link set lo up && ip -n "$ns_b" link set lo up &&
         ip -n "$ns_a" link set kbveth up && ip -n "$ns_b" link set kbveth up; } 2>"$out_dir/netns.err"; then
    echo "compare_multi.sh: SKIPPED --veth: cannot set up the veth pair: $(cat "$out_dir/netns.err")" >&2
    exit 77
  fi
fi
if [ "$veth" = 1 ]; then
  path="veth ($ns_a 10.200.0.1 <-> $ns_b 10.200.0.2, device kbveth)"
  host_a=10.200.0.1 host_b=10.200.0.2 dev=kbveth
else
  path="loopback (lo, 127.0.0.1)"
  host_a=127.0.0.1 host_b=127.0.0.1 dev=lo
fi
# Runs "$@" in namespace $1 (loopback: as is).
in_ns() {
  local ns=$1
  shift
  if [ "$veth" = 1 ]; then ip netns exec "$ns" "$@"; else "$@"; fi
}
# The same for a background job, "(in_ns_exec NS cmd...) &": $! is then the command itself.
in_ns_exec() {
  local ns=$1
  shift
  if [ "$veth" = 1 ]; then exec ip netns exec "$ns" "$@"; else exec "$@"; fi
}

# Rank 0's lines of a log, without a "[0]<stdout>:" prefix (kolorun, multi_agent_run.sh).
rank0() { sed -n 's/^\[0\]<stdout>://p' "$1"; }
# "size time busbw" for each table row.
rows() { awk '$1 ~ /^[0-9]+$/ && NF >= 8 {print $1, $5, $7}' "$1"; }
latency() { awk -F' : ' '/^# Latency/ {split($2, a, " "); print a[1]; exit}' "$1"; }
# A size's time (us) in a table file, and its busbw in GB/s computed from the time
# (tables print busbw with 2 decimals only), for N ranks ("" if absent).
time_at() { awk -v s="$2" '$1 == s && NF >= 8 {print $5; exit}' "$1"; }
# A size's cpu-s/GB (the 9th column; "" if absent or N/A).
cpu_at() { awk -v s="$2" '$1 == s && NF >= 9 && $9 != "N/A" {print $9; exit}' "$1"; }
busbw_at() {
  awk -v s="$2" -v n="$3" '$1 == s && NF >= 8 && $5 > 0 {printf "%.4f", $1 / ($5 * 1e3) * 2 * (n - 1) / n; exit}' "$1"
}

status=0
common_args=(-b "$minb" -e "$maxb" -f "$step" -w "$warmup" -n "$iters" -T "$maxtime" -c "$check")
[ "$inplace" = 1 ] && common_args+=(--inplace)
echo "# compare_multi.sh: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), $(nproc) cores," \
  "$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)," \
  "$(awk '/^MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo), load $(cut -d' ' -f1-3 /proc/loadavg)," \
  "allreduce $([ "$inplace" = 1 ] && echo "in place" || echo "out of place")"
echo "# path: $path; kolo: UCX_TLS=tcp UCX_NET_DEVICES=$dev; agents: $agent_counts; ranks per agent: $rpas"
[ -z "$agent_env" ] || echo "# kolo agent environment (--agent-env): $agent_env"
[ "$replay" = 1 ] && echo "# replay of the tables in $out_dir (nothing run)"
[ "$replay" = 1 ] || for s in "${skip_note[@]}"; do echo "# $s"; done

# --- iperf3 on the same path ------------------------------------------------
# Starts `iperf3 -s -1` in namespace $1 bound to $2, logging to $3, on a free
# port below the ephemeral range (up to 5 tries; the server says when it
# listens, each wait bounded at 10 s). Sets iperf_srv_pid and iperf_srv_port;
# returns 1 if no server came up.
start_iperf_server() {
  local ns=$1 host=$2 log=$3 deadline _
  for _ in 1 2 3 4 5; do
    iperf_srv_port=$((10000 + RANDOM % 20000))
    (in_ns_exec "$ns" timeout $((iperf_time + 60)) iperf3 -s -1 --forceflush -B "$host" -p "$iperf_srv_port") \
      >"$log" 2>&1 &
    iperf_srv_pid=$!
    bg_pids+=("$iperf_srv_pid")
    deadline=$((SECONDS + 10))
    while kill -0 "$iperf_srv_pid" 2>/dev/null && ! grep -q "Server listening" "$log" &&
          [ $SECONDS -lt $deadline ]; do
      sleep 0.05  # polling for the server's line, bounded
    done
    grep -q "Server listening" "$log" && return 0
    stop_pid "$iperf_srv_pid"
  done
  iperf_srv_pid=""
  return 1
}
stop_pid() { [ -z "$1" ] || { kill "$1" 2>/dev/null; wait "$1" 2>/dev/null; }; }
# The received bandwidth of iperf3 -J outputs, summed, in GB/s ("" if one is unreadable).
iperf_received_gbs() {
  python3 -c '
import json, sys
try:
    print("%.4f" % sum(json.load(open(f))["end"]["sum_received"]["bits_per_second"] / 8e9 for f in sys.argv[1:]))
except Exception:
    pass' "$@"
}

iperf_gbs=""
if [ "$skip_iperf" = 0 ]; then
  server="" port=""
  start_iperf_server "$ns_a" "$host_a" "$out_dir/iperf-server.log" && server=$iperf_srv_pid port=$iperf_srv_port
  cmd="iperf3 -c $host_a -p $port -t $iperf_time -J"
  echo
  echo "## iperf3: server 'iperf3 -s -1 --forceflush -B $host_a -p $port'$([ "$veth" = 1 ] && echo " in $ns_a"), client '$cmd'$([ "$veth" = 1 ] && echo " in $ns_b")"
  : >"$out_dir/iperf.json"
  [ -z "$server" ] || in_ns "$ns_b" timeout $((iperf_time + 30)) $cmd >"$out_dir/iperf.json" 2>"$out_dir/iperf.err"
  iperf_gbs=$(iperf_received_gbs "$out_dir/iperf.json")
  stop_pid "$server"
  if [ -n "$iperf_gbs" ]; then
    echo "# iperf3 bandwidth (received, one TCP stream): $iperf_gbs GB/s"
  else
    echo "## iperf3 FAILED: $(cat "$out_dir/iperf-server.log" "$out_dir/iperf.err" 2>/dev/null | tail -n 3 | tr '\n' ' ')" \
      "$(grep '"error"' "$out_dir/iperf.json")"
    status=1
  fi
fi

# --- what this machine allows -------------------------------------------------
# A ring of K agents keeps K TCP streams busy at once (agent i -> i+1), each
# carrying busbw: K x busbw can be no more than what the machine moves over
# TCP with K streams at once. iperf3 measures that with K client/server pairs
# started together (each stream with its own two processes, more CPU than
# the K agents have); their received sum / K is the ring's ceiling here. On
# veth the streams alternate direction, as the ring alternates namespaces.
declare -A ring_ceiling
if [ "$skip_iperf" = 0 ] && [ -n "$iperf_gbs" ]; then
  echo
  echo "## iperf3, K streams at once (K client/server pairs started together, -t $iperf_time): the ring's ceiling"
  printf '#%5s%16s%18s%20s\n' K "sum (GB/s)" "per stream" "per stream/single"
  for k in $agent_counts; do
    srv=() ports=() cli=() ok=1
    for ((i = 0; i < k && ok; ++i)); do
      if [ "$veth" = 1 ] && [ $((i % 2)) = 1 ]; then sns=$ns_b shost=$host_b; else sns=$ns_a shost=$host_a; fi
      if start_iperf_server "$sns" "$shost" "$out_dir/iperf-k$k-s$i.log"; then
        srv+=("$iperf_srv_pid") ports+=("$iperf_srv_port")
      else
        ok=0
      fi
    done
    if [ "$ok" = 1 ]; then
      for ((i = 0; i < k; ++i)); do
        if [ "$veth" = 1 ] && [ $((i % 2)) = 1 ]; then cns=$ns_a shost=$host_b; else cns=$ns_b shost=$host_a; fi
        (in_ns_exec "$cns" timeout $((iperf_time + 30)) iperf3 -c "$shost" -p "${ports[$i]}" -t "$iperf_time" -J) \
          >"$out_dir/iperf-k$k-c$i.json" 2>"$out_dir/iperf-k$k-c$i.err" &
        cli+=($!)
      done
      for p in "${cli[@]}"; do wait "$p" || ok=0; done
    fi
    for p in "${srv[@]}"; do stop_pid "$p"; done
    sum=""
    [ "$ok" = 1 ] && sum=$(iperf_received_gbs "$out_dir"/iperf-k$k-c*.json)
    if [ -n "$sum" ]; then
      ring_ceiling[$k]=$(awk -v s="$sum" -v k="$k" 'BEGIN { printf "%.4f", s / k }')
      printf '%6s%16s%18s%20s\n' "$k" "$sum" "${ring_ceiling[$k]}" \
        "$(awk -v c="${ring_ceiling[$k]}" -v i="$iperf_gbs" 'BEGIN { printf "%.2f", c / i }')"
    else
      echo "## iperf3 with $k streams FAILED: $(cat "$out_dir"/iperf-k$k-s*.log "$out_dir"/iperf-k$k-c*.err \
        2>/dev/null | tail -n 3 | tr '\n' ' ')"
      status=1
    fi
  done
fi

# The wake-up floor: a 4-byte allreduce across 2 agents is at least three
# blocking hops in a row (rank -> agent, agent -> agent, agent -> rank) with
# two ranks and two agents on the machine (kolo-relay-floor, 4 processes).
floor_us=""
if [ "$replay" = 0 ] && [ -x "$bin/kolo-relay-floor" ]; then
  echo
  echo "## kolo-relay-floor -p 2,4 (one blocking wake-up between processes on this machine)"
  "$bin/kolo-relay-floor" -p 2,4 -n 20000 | tee "$out_dir/relay-floor.txt"
  hop=$(awk '$1 == 4 {print $4; exit}' "$out_dir/relay-floor.txt")
  [ -z "$hop" ] || floor_us=$(awk -v h="$hop" 'BEGIN { printf "%.1f", 3 * h }')
  [ -z "$floor_us" ] || echo "# floor of a 4-byte allreduce across 2 agents without busy polling: 3 x $hop = $floor_us us"
fi

if [ "$replay" = 1 ] && [ -s "$out_dir/iperf.json" ]; then
  iperf_gbs=$(iperf_received_gbs "$out_dir/iperf.json")
  echo "# iperf3 bandwidth (from $out_dir/iperf.json): ${iperf_gbs:-n/a} GB/s"
  for k in $agent_counts; do  # the ring's ceiling, from the K-stream runs kept there
    compgen -G "$out_dir/iperf-k$k-c*.json" >/dev/null || continue
    sum=$(iperf_received_gbs "$out_dir"/iperf-k$k-c*.json)
    [ -z "$sum" ] || ring_ceiling[$k]=$(awk -v s="$sum" -v k="$k" 'BEGIN { printf "%.4f", s / k }')
    [ -z "$sum" ] || echo "# iperf3, $k streams at once (from $out_dir): per stream ${ring_ceiling[$k]} GB/s"
  done
fi

# --- peers, once per rank count -----------------------------------------------
declare -A mpi_table gloo_table
nps=()
for k in $agent_counts; do
  for r in $rpas; do
    n=$((k * r))
    case " ${nps[*]} " in *" $n "*) ;; *) nps+=("$n") ;; esac
  done
done

run_mpi() {
  local n=$1 log=$out_dir/mpi-$n.log
  local transport=(--mca pml ob1 --mca btl self,tcp --mca btl_tcp_if_include "$dev")
  local prog=("$bin/mpi-allreduce-bench" "${common_args[@]}" --json "$out_dir/mpi-$n.json")
  local cmd
  if [ "$veth" = 1 ]; then
    # mpirun in namespace a; half the ranks re-enter namespace b. Its out-of-band and PMIx
    # channels must use the veth too (the namespaces' loopbacks are separate).
    cmd=(ip netns exec "$ns_a" env PMIX_MCA_ptl_tcp_if_include="$dev" PMIX_MCA_ptl_tcp_remote_connections=1
         mpirun --oversubscribe --allow-run-as-root "${transport[@]}" --mca oob_tcp_if_include "$dev"
         -np $((n / 2)) "${prog[@]}" : -np $((n - n / 2)) ip netns exec "$ns_b" "${prog[@]}")
  else
    cmd=(mpirun --oversubscribe --allow-run-as-root -np "$n" "${transport[@]}" "${prog[@]}")
  fi
  echo
  echo "## MPI, N=$n: ${cmd[*]}"
  timeout -k 15 "$run_timeout" "${cmd[@]}" >"$log" 2>&1
  local rc=$?
  # mpirun prints rank 0's lines unprefixed (the other ranks print none).
  grep -v '^\[' "$log" >"$out_dir/mpi-$n.table"
  cat "$out_dir/mpi-$n.table"
  if [ "$rc" -ne 0 ]; then
    echo "## mpi-allreduce-bench FAILED (exit $rc)"
    status=1
  fi
  mpi_table[$n]=$out_dir/mpi-$n.table
}

run_gloo() {
  local n=$1 store=$out_dir/gloo-store-$n pids=() r ns host rc=0 prc
  rm -rf "$store"
  mkdir -p "$store"
  echo
  echo "## Gloo, N=$n: gloo-allreduce-bench --rank R --size $n --store $store --host HOST ${common_args[*]}" \
    "($([ "$veth" = 1 ] && echo "ranks 0..$((n / 2 - 1)) in $ns_a on $host_a, the others in $ns_b on $host_b" || echo "all on $host_a"))"
  for ((r = 0; r < n; ++r)); do
    ns=$ns_a host=$host_a
    if [ "$veth" = 1 ] && [ $r -ge $((n / 2)) ]; then ns=$ns_b host=$host_b; fi
    (in_ns_exec "$ns" timeout -k 15 "$run_timeout" "$bin/gloo-allreduce-bench" --rank "$r" --size "$n" \
      --store "$store" --host "$host" "${common_args[@]}" --json "$out_dir/gloo-$n.json") \
      >"$out_dir/gloo-$n-rank$r.log" 2>&1 &
    pids+=($!)
    bg_pids+=($!)
  done
  for r in "${!pids[@]}"; do
    wait "${pids[$r]}"
    prc=$?
    [ "$rc" -ne 0 ] || rc=$prc
  done
  cp "$out_dir/gloo-$n-rank0.log" "$out_dir/gloo-$n.table"
  cat "$out_dir/gloo-$n.table"
  if [ "$rc" -ne 0 ]; then
    echo "## gloo-allreduce-bench FAILED (exit $rc); other ranks' output:"
    for ((r = 1; r < n; ++r)); do tail -n 5 "$out_dir/gloo-$n-rank$r.log"; done
    status=1
  fi
  rm -rf "$store"
  gloo_table[$n]=$out_dir/gloo-$n.table
}

for n in "${nps[@]}"; do
  [ "$skip_mpi" = 1 ] || run_mpi "$n"
  [ "$skip_gloo" = 1 ] || run_gloo "$n"
  if [ "$replay" = 1 ]; then
    [ ! -s "$out_dir/mpi-$n.table" ] || mpi_table[$n]=$out_dir/mpi-$n.table
    [ ! -s "$out_dir/gloo-$n.table" ] || gloo_table[$n]=$out_dir/gloo-$n.table
  fi
done

# --- kolo across agents -----------------------------------------------------
# The table of kolo's run with K agents, R ranks each, buffers of memory mode M.
kolo_tag() { if [ "$3" = shared ]; then echo "kolo-zc-k$1-r$2"; else echo "kolo-k$1-r$2"; fi; }
run_kolo() {
  local k=$1 r=$2 mem=$3 n=$(($1 * $2)) tag
  tag=$(kolo_tag "$k" "$r" "$mem")
  local bargs=("${common_args[@]}" -d float32 -o sum --json "$out_dir/$tag.json")
  [ "$mem" = shared ] && bargs+=(--zero-copy)
  local cmd
  if [ "$launcher" = kolorun ]; then
    cmd=("$bin/kolorun" -np "$n" --agents "$k" -- "$bin/kolo-bench" "${bargs[@]}")
    [ -z "$agent_env" ] || cmd=(env $agent_env "${cmd[@]}")
  else
    cmd=("$script_dir/multi_agent_run.sh" --build-dir "$build_dir" --agents "$k" --ranks-per-agent "$r"
         --timeout "$run_timeout")
    [ "$veth" = 1 ] && cmd+=(--netns "$ns_a $ns_b" --coord-host "$host_a")
    [ -z "$agent_env" ] || cmd+=(--agent-env "$agent_env")
    cmd+=(-- "$bin/kolo-bench" "${bargs[@]}")
  fi
  echo
  echo "## kolo ($mem memory), K=$k agents x $r rank(s) (N=$n): UCX_TLS=tcp UCX_NET_DEVICES=$dev ${cmd[*]}"
  UCX_TLS=tcp UCX_NET_DEVICES=$dev timeout -k 30 $((run_timeout + 30)) "${cmd[@]}" >"$out_dir/$tag.log" 2>&1
  local rc=$?
  rank0 "$out_dir/$tag.log" >"$out_dir/$tag.table"
  cat "$out_dir/$tag.table"
  if [ "$rc" -ne 0 ]; then
    echo "## kolo-bench FAILED (exit $rc); last lines of its output:"
    tail -n 30 "$out_dir/$tag.log"
    status=1
  fi
}

kolo_cfgs=()
for k in $agent_counts; do
  for r in $rpas; do
    for mem in $kolo_memory; do
      if [ "$skip_kolo" = 0 ]; then
        run_kolo "$k" "$r" "$mem"
        kolo_cfgs+=("$k $r $mem")
      elif [ "$replay" = 1 ] && [ -s "$out_dir/$(kolo_tag "$k" "$r" "$mem").table" ]; then
        kolo_cfgs+=("$k $r $mem")
      fi
    done
  done
done

# --- comparison and targets ---------------------------------------------------
verdict() { awk -v v="$1" -v t="$2" -v dir="$3" 'BEGIN {
  if (v == "" || t == "") { print "n/a"; exit }
  ok = (dir == "ge") ? (v + 0 >= t + 0) : (v + 0 <= t + 0); print ok ? "met" : "MISSED" }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b + 0 <= 0) print ""; else printf "%.2f", a / b }'; }

targets=()
s16=$((16 << 20)) s64=$((64 << 20))
for cfg in "${kolo_cfgs[@]}"; do
  read -r k r mem <<<"$cfg"
  n=$((k * r))
  kt=$out_dir/$(kolo_tag "$k" "$r" "$mem").table
  mlabel=""
  [ "$mem" = shared ] && mlabel=" zc"
  [ -n "$(rows "$kt")" ] || { targets+=("K=$k R=$r$mlabel: no kolo rows (run failed)"); continue; }
  mt=${mpi_table[$n]:-/dev/null}
  gt=${gloo_table[$n]:-/dev/null}
  echo
  echo "## Comparison, kolo with $mem memory, K=$k agents x $r rank(s) (N=$n), $path; iperf3 ${iperf_gbs:-n/a} GB/s"
  echo "# busbw in GB/s from the median times; kolo/iperf = kolo busbw / iperf3 bandwidth;"
  echo "# kolo/gloo, kolo/mpi = busbw ratios = their time / kolo's time (> 1: kolo faster);"
  echo "# cpu-s/GB: CPU seconds of every rank (and kolo's agents) over the timed iterations / (size x iterations / 1e9)"
  printf '#%11s%15s%12s%12s%12s%12s%12s%12s%10s%10s%10s\n' size "kolo time(us)" "kolo busbw" "gloo busbw" \
    "mpi busbw" "kolo/iperf" "kolo/gloo" "kolo/mpi" "kolo cpu" "gloo cpu" "mpi cpu"
  rows "$kt" | while read -r size t _; do
    kb=$(busbw_at "$kt" "$size" "$n") gb=$(busbw_at "$gt" "$size" "$n") mb=$(busbw_at "$mt" "$size" "$n")
    # Same N: busbw ratio = the other's time / kolo's time.
    printf '%12s%15.2f%12s%12s%12s%12s%12s%12s%10s%10s%10s\n' "$size" "$t" "${kb:--}" "${gb:--}" "${mb:--}" \
      "$(ratio "$kb" "$iperf_gbs" | sed 's/^$/-/')" "$(ratio "$(time_at "$gt" "$size")" "$t" | sed 's/^$/-/')" \
      "$(ratio "$(time_at "$mt" "$size")" "$t" | sed 's/^$/-/')" "$(cpu_at "$kt" "$size" | sed 's/^$/-/')" \
      "$(cpu_at "$gt" "$size" | sed 's/^$/-/')" "$(cpu_at "$mt" "$size" | sed 's/^$/-/')"
  done
  for s in $s16 $s64; do
    label=$((s >> 20))MiB
    kb=$(busbw_at "$kt" "$s" "$n")
    [ -n "$kb" ] || { targets+=("K=$k R=$r$mlabel N=$n: $label not measured (-e below it)"); continue; }
    gb=$(busbw_at "$gt" "$s" "$n")
    ri=$(ratio "$kb" "$iperf_gbs") rg=$(ratio "$(time_at "$gt" "$s")" "$(time_at "$kt" "$s")")
    # What the ring could reach here at most (K streams at once), against both targets.
    ceil=${ring_ceiling[$k]:-}
    reach=""
    if [ -n "$ceil" ] && [ -n "$iperf_gbs" ]; then
      reach=$(awk -v c="$ceil" -v i="$iperf_gbs" -v g="$gb" 'BEGIN {
        printf "ceiling %.3f GB/s = %.2f x iperf3", c, c / i
        if (g != "" && g > 0) printf " = %.2f x gloo", c / g }')
    fi
    targets+=("$(printf 'K=%s R=%s%s N=%-2s busbw@%-6s kolo %6.3f GB/s | iperf3 %-6s kolo/iperf %-5s (>= 0.90) %-6s | gloo %-6s kolo/gloo %-5s (>= 1.3) %s%s' \
      "$k" "$r" "$mlabel" "$n" "$label" "$kb" "${iperf_gbs:-n/a}" "${ri:-n/a}" "$(verdict "$ri" 0.9 ge)" \
      "${gb:-n/a}" "${rg:-n/a}" "$(verdict "$rg" 1.3 ge)" "${reach:+ | $reach}")")
  done
  if [ "$k" = 2 ]; then
    lat=$(time_at "$kt" 4)
    [ -z "$lat" ] || targets+=("$(printf 'K=%s R=%s%s N=%-2s latency@4B kolo %.2f us (<= 100 us) %s; gloo %s us, MPI %s us%s' \
      "$k" "$r" "$mlabel" "$n" "$lat" "$(verdict "$lat" 100 le)" "$(time_at "$gt" 4)" "$(time_at "$mt" 4)" \
      "${floor_us:+; wake-up floor $floor_us us}")")
  fi
done

if [ ${#targets[@]} -gt 0 ]; then
  echo
  echo "## Targets, $path"
  for t in "${targets[@]}"; do echo "# $t"; done
fi
[ "$status" = 0 ] || echo "## compare_multi.sh: at least one benchmark FAILED" >&2
exit "$status"
