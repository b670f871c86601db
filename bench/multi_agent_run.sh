#!/usr/bin/env bash
# multi_agent_run.sh: one kolo job over K kolo-agents on this machine, each
# acting as a node, without kolorun: a kolo-coordinator, K agents and R ranks
# per agent, started the way tests/integration/harness.cc starts them. With
# --netns the agents (and their ranks) run in network namespaces, e.g. the
# two ends of a veth pair (compare_multi.sh --veth).
#
#   bench/multi_agent_run.sh --build-dir build-bench --agents 2 --ranks-per-agent 1 -- \
#       build-bench/bin/kolo-bench -b 4 -e 64M
#
# Each rank's output is printed when the job ends, every line prefixed like
# kolorun's: "[i]<stdout>:" / "[i]<stderr>:", i = agent * R + local rank
# (which is the rank kolo assigns: agents in order, ranks in blocks).
# Exit status: 0 when every rank exited 0, else the first failing rank's
# status (124: --timeout); 2 for bad usage or when a daemon did not start.
# Every process it started is stopped and its directory removed on exit,
# whatever happens (trap); --keep DIR keeps the logs.
set -u -o pipefail

usage() {
  cat <<'EOF'
Usage: multi_agent_run.sh [options] -- PROGRAM [ARGS...]
  --build-dir DIR        build tree with bin/kolo-agent, bin/kolo-coordinator
                         (default: this script's directory if it holds them, else ./build)
  --agents K             number of agents (default 2)
  --ranks-per-agent R    ranks on each agent (default 1)
  --netns "NS0 NS1 ..."  run agent i and its ranks in namespace NS[i * count / K]
                         (blocks), the coordinator in NS0 (needs root)
  --coord-host ADDR      address the coordinator listens on (default 127.0.0.1; with
                         --netns, an address of NS0 the other namespaces can reach)
  --agent-env "K=V ..."  extra environment for the agents (e.g. KOLO_FUSION_THRESHOLD_MB=0);
                         the ranks get it too, so that they can report it
  --timeout S            stop the ranks after S seconds (default 600; exit 124)
  --keep DIR             keep the logs in DIR (default: a temporary directory, removed)
EOF
}

script_dir=$(cd "$(dirname "$0")" && pwd)
if [ -x "$script_dir/kolo-agent" ]; then build_bin=$script_dir; else build_bin=./build/bin; fi
agents=2 rpa=1 netns="" coord_host=127.0.0.1 agent_env="" run_timeout=600 keep=""
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build_bin=$2/bin; shift 2 ;;
    --agents) agents=$2; shift 2 ;;
    --ranks-per-agent) rpa=$2; shift 2 ;;
    --netns) netns=$2; shift 2 ;;
    --coord-host) coord_host=$2; shift 2 ;;
    --agent-env) agent_env=$2; shift 2 ;;
    --timeout) run_timeout=$2; shift 2 ;;
    --keep) keep=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) echo "multi_agent_run.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ $# -gt 0 ] || { echo "multi_agent_run.sh: no program given (... -- PROGRAM ARGS)" >&2; exit 2; }
case "$agents$rpa" in *[!0-9]*) echo "multi_agent_run.sh: --agents and --ranks-per-agent take numbers" >&2; exit 2 ;; esac
[ "$agents" -ge 1 ] && [ "$rpa" -ge 1 ] || { echo "multi_agent_run.sh: need K >= 1 and R >= 1" >&2; exit 2; }
for p in kolo-agent kolo-coordinator; do
  [ -x "$build_bin/$p" ] || { echo "multi_agent_run.sh: $build_bin/$p not found (--build-dir)" >&2; exit 2; }
done
read -r -a ns_list <<<"$netns"
if [ ${#ns_list[@]} -gt 0 ] && [ "$(id -u)" -ne 0 ]; then
  echo "multi_agent_run.sh: --netns needs root (ip netns exec)" >&2
  exit 2
fi

if [ -n "$keep" ]; then
  mkdir -p "$keep" || exit 2
  dir=$(cd "$keep" && pwd)
else
  # Short: the agents' Unix socket paths must stay under 108 bytes.
  dir=$(mktemp -d /tmp/kolo-mar.XXXXXX) || exit 2
fi

pids=()        # every process started here, daemons and ranks
rank_pids=()
cleanup() {
  local p
  for p in "${rank_pids[@]}" "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  # Bounded: 10 s for everyone to go, then SIGKILL.
  local deadline=$((SECONDS + 10))
  for p in "${rank_pids[@]}" "${pids[@]}"; do
    while kill -0 "$p" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.05; done
    kill -KILL "$p" 2>/dev/null
    wait "$p" 2>/dev/null
  done
  [ -n "$keep" ] || rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Namespace of agent i: blocks of agents per namespace.
ns_of() {
  [ ${#ns_list[@]} -gt 0 ] || return 0
  echo "${ns_list[$(($1 * ${#ns_list[@]} / agents))]}"
}
# Runs "$@" in namespace $1 (none: as is).
in_ns() {
  local ns=$1
  shift
  if [ -n "$ns" ]; then exec ip netns exec "$ns" "$@"; else exec "$@"; fi
}

# Waits for a non-empty ready file written by the daemon with pid $2.
wait_ready() {
  local file=$1 pid=$2 what=$3 log=$4 deadline=$((SECONDS + 30))
  while [ ! -s "$file" ]; do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "multi_agent_run.sh: $what exited before it was ready; its log:" >&2
      tail -n 20 "$log" >&2
      exit 2
    fi
    if [ $SECONDS -ge $deadline ]; then
      echo "multi_agent_run.sh: $what not ready after 30 s; its log:" >&2
      tail -n 20 "$log" >&2
      exit 2
    fi
    sleep 0.05  # polling for a file, bounded
  done
}

read -r -a extra_env <<<"$agent_env"
ns0=$(ns_of 0)
(in_ns "$ns0" "$build_bin/kolo-coordinator" --listen "$coord_host:0" --ready-file "$dir/coord.ready") \
  >"$dir/coordinator.log" 2>&1 &
pids+=($!)
wait_ready "$dir/coord.ready" "${pids[0]}" kolo-coordinator "$dir/coordinator.log"
coord=$(head -n 1 "$dir/coord.ready")

# Every agent's listeners on free loopback ports (their defaults, fixed ports, would clash).
# As environment, not flags, so that agents without a metrics server accept it too.
for ((a = 0; a < agents; ++a)); do
  (in_ns "$(ns_of $a)" env KOLO_METRICS_LISTEN=127.0.0.1:0 "${extra_env[@]}" "$build_bin/kolo-agent" --socket "$dir/node$a.sock" \
     --coordinator "$coord" --rpc-listen 127.0.0.1:0 --ready-file "$dir/node$a.ready" \
     --agent-id "node$a" --hostname "node$a") >"$dir/agent-$a.log" 2>&1 &
  pids+=($!)
done
for ((a = 0; a < agents; ++a)); do
  wait_ready "$dir/node$a.ready" "${pids[$((a + 1))]}" "kolo-agent node$a" "$dir/agent-$a.log"
done

world=$((agents * rpa))
job="bench-$$-$RANDOM"
for ((a = 0; a < agents; ++a)); do
  for ((l = 0; l < rpa; ++l)); do
    i=$((a * rpa + l))
    (in_ns "$(ns_of $a)" env "${extra_env[@]}" KOLO_AGENT_SOCKET="$dir/node$a.sock" \
       KOLO_JOB_ID="$job" KOLO_JOB_TOKEN="secret-$job" KOLO_SIZE="$world" \
       KOLO_LOCAL_RANK="$l" KOLO_LOCAL_SIZE="$rpa" KOLO_START_TIMEOUT=60 \
       timeout -k 10 "$run_timeout" "$@") >"$dir/rank-$i.out" 2>"$dir/rank-$i.err" &
    rank_pids+=($!)
  done
done

status=0
for ((i = 0; i < world; ++i)); do
  wait "${rank_pids[$i]}"
  rc=$?
  [ "$status" -ne 0 ] || status=$rc
done
rank_pids=()
for ((i = 0; i < world; ++i)); do
  sed "s/^/[$i]<stdout>:/" "$dir/rank-$i.out"
  sed "s/^/[$i]<stderr>:/" "$dir/rank-$i.err"
done
if [ "$status" -ne 0 ]; then
  echo "multi_agent_run.sh: a rank failed (status $status); last lines of the agents' logs:" >&2
  for ((a = 0; a < agents; ++a)); do
    echo "--- agent node$a ($dir/agent-$a.log)" >&2
    tail -n 10 "$dir/agent-$a.log" >&2
  done
fi
exit "$status"
