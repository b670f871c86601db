#!/usr/bin/env bash
# Fault detection times: repeats each fault RUNS times against the real
# daemons and prints, per fault, the median and max time from the fault to
# the moment every affected rank has returned an error (or, for the
# coordinator, whether the job still finished), and what a rank printed.
#
#   scripts/fault_times.sh                # 5 runs of each fault, build/bin
#   scripts/fault_times.sh -n 3 -b build-rel trainer-kill agent-stop
#
# Faults (the names to pick some):
#   trainer-kill   SIGKILL one trainer of a 2-node x 2-rank job
#   trainer-stop   SIGSTOP one trainer; the agents run with
#                  --stall-check-time-s 2 --stall-shutdown-time-s 5
#   agent-kill     SIGKILL node1's agent of a 2-node x 1-rank job
#   agent-stop     SIGSTOP node1's agent (coordinator lease, default 5 s)
#   coord-kill     SIGKILL the coordinator mid-training, restart it 1 s later
#                  from its --state-dir; the job must finish
#
# Everything runs in a private directory under /tmp (kept with -k); every
# process the script starts is stopped on exit. Each rank is the integration
# tests' kolo_check in "loop" mode (allreduce of 4096 floats, checked).
# The daemons run with their defaults except where said above.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=5
build=build
keep=0
while getopts "n:b:kh" opt; do
  case $opt in
    n) runs=$OPTARG ;;
    b) build=$OPTARG ;;
    k) keep=1 ;;
    *) sed -n '2,22p' "$0"; exit 0 ;;
  esac
done
shift $((OPTIND - 1))
faults=("$@")
[ ${#faults[@]} -gt 0 ] || faults=(trainer-kill trainer-stop agent-kill agent-stop coord-kill)
bin=$PWD/$build/bin
for p in kolo-coordinator kolo-agent kolo_check kolo; do
  [ -x "$bin/$p" ] || { echo "fault_times: $bin/$p is missing (build with -DKOLO_BUILD_TESTS=ON)" >&2; exit 1; }
done

work=$(mktemp -d /tmp/kolo-faults-XXXXXX)
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill -CONT "$p" 2>/dev/null || true; kill -KILL "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ "$keep" = 1 ]; then echo "fault_times: logs kept in $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT

now() { date +%s.%N; }
# Waits (polling, bounded by $2 seconds) until file $1 exists.
wait_file() {
  local end=$(( $(date +%s) + $2 ))
  while [ ! -s "$1" ]; do
    [ "$(date +%s)" -lt "$end" ] || return 1
    sleep 0.01
  done
}

# start_cluster DIR AGENTS [agent flags...]: coordinator (state in DIR/state)
# and AGENTS agents; sets coord_pid, coord_addr, agent_pids.
start_coordinator() {
  local d=$1 listen=$2
  rm -f "$d/coord.ready"
  "$bin/kolo-coordinator" --listen "$listen" --ready-file "$d/coord.ready" --state-dir "$d/state" \
    >>"$d/coordinator.log" 2>&1 &
  coord_pid=$!
  pids+=("$coord_pid")
  wait_file "$d/coord.ready" 20 || { echo "coordinator not ready: $(tail -5 "$d/coordinator.log")" >&2; return 1; }
  coord_addr=$(head -1 "$d/coord.ready")
}
start_cluster() {
  local d=$1 n=$2 i
  shift 2
  mkdir -p "$d"
  start_coordinator "$d" 127.0.0.1:0
  agent_pids=()
  for ((i = 0; i < n; i++)); do
    "$bin/kolo-agent" --socket "$d/agent-$i.sock" --coordinator "$coord_addr" --rpc-listen 127.0.0.1:0 \
      --metrics-listen "" --ready-file "$d/node$i.ready" --agent-id "node$i" --hostname "node$i" "$@" \
      >"$d/agent-$i.log" 2>&1 &
    agent_pids+=($!)
    pids+=($!)
  done
  for ((i = 0; i < n; i++)); do
    wait_file "$d/node$i.ready" 20 || { echo "agent $i not ready: $(tail -5 "$d/agent-$i.log")" >&2; return 1; }
  done
}

# launch DIR JOB LOCAL_SIZES ITERATIONS: ranks ("a<agent>-l<local>"); each
# rank's pid goes to DIR/<rank>.pid and "exit-code end-time" to DIR/<rank>.end.
launch() {
  local d=$1 job=$2 sizes=$3 iters=$4 world=0 a=0 n l r
  rank_names=()
  for n in ${sizes//,/ }; do world=$((world + n)); done
  for n in ${sizes//,/ }; do
    for ((l = 0; l < n; l++)); do
      local r="a$a-l$l"
      rank_names+=("$r")
      (
        KOLO_AGENT_SOCKET="$d/agent-$a.sock" KOLO_JOB_ID="$job" KOLO_JOB_TOKEN="secret-$job" \
          KOLO_SIZE=$world KOLO_LOCAL_RANK=$l KOLO_LOCAL_SIZE=$n KOLO_START_TIMEOUT=20 KOLO_OP_TIMEOUT=120 \
          "$bin/kolo_check" loop "$iters" >"$d/$r.log" 2>&1 &
        echo $! >"$d/$r.pid"
        rc=0
        wait $! || rc=$?
        echo "$rc $(date +%s.%N)" >"$d/$r.end"
      ) &
      pids+=($!)
    done
    a=$((a + 1))
  done
  for r in "${rank_names[@]}"; do wait_file "$d/$r.pid" 10 || return 1; pids+=("$(cat "$d/$r.pid")"); done
}

# Lets the job form (the coordinator lists it RUNNING) and train for 1 s; a
# rank that ended already is a setup failure.
settle() {
  local d=$1 end=$(( $(date +%s) + 30 )) r
  until "$bin/kolo" jobs --coordinator "$coord_addr" --json 2>/dev/null | grep -q '"state": "RUNNING"'; do
    [ "$(date +%s)" -lt "$end" ] || { echo "the job did not form in 30 s" >&2; return 1; }
    sleep 0.05
  done
  sleep 1
  for r in "${rank_names[@]}"; do
    if [ -e "$d/$r.end" ]; then echo "rank $r ended before the fault: $(tail -3 "$d/$r.log")" >&2; return 1; fi
  done
}

# wait_ends DIR T0 TIMEOUT RANKS...: seconds from T0 until the last of RANKS ended.
wait_ends() {
  local d=$1 t0=$2 timeout=$3 last=0 r
  shift 3
  for r in "$@"; do
    wait_file "$d/$r.end" "$timeout" || { echo "timeout"; return; }
    local t
    t=$(cut -d' ' -f2 "$d/$r.end")
    last=$(echo "$t $last" | awk '{print ($1 > $2) ? $1 : $2}')
  done
  echo "$last $t0" | awk '{printf "%.3f", $1 - $2}'
}

# A rank's error line, shortened for the table.
what_seen() {
  grep -h "FAIL" "$1" 2>/dev/null | head -1 | sed -e 's/^rank [0-9]*: FAIL //' -e 's/|/\\|/g' | cut -c1-160
}

stop_all() {
  local p
  for p in "${pids[@]}"; do kill -CONT "$p" 2>/dev/null || true; kill -KILL "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  pids=()
}

declare -A times seen setting
one_run() {
  local fault=$1 run=$2 d="$work/$1-$2" t0 dt
  rm -rf "$d"
  case $fault in
    trainer-kill)
      start_cluster "$d" 2 || return 1
      launch "$d" "tk$run" 2,2 100000000 || return 1
      settle "$d" || return 1
      t0=$(now); kill -KILL "$(cat "$d/a1-l1.pid")"
      dt=$(wait_ends "$d" "$t0" 60 a0-l0 a0-l1 a1-l0)
      seen[$fault]=$(what_seen "$d/a0-l0.log")
      setting[$fault]="2 agents x 2 ranks; defaults" ;;
    trainer-stop)
      start_cluster "$d" 2 --stall-check-time-s 2 --stall-shutdown-time-s 5 || return 1
      launch "$d" "ts$run" 2,2 100000000 || return 1
      settle "$d" || return 1
      t0=$(now); kill -STOP "$(cat "$d/a1-l1.pid")"
      dt=$(wait_ends "$d" "$t0" 60 a0-l0 a0-l1 a1-l0)
      seen[$fault]=$(what_seen "$d/a0-l0.log")
      setting[$fault]="2 agents x 2 ranks; --stall-check-time-s 2 --stall-shutdown-time-s 5" ;;
    agent-kill)
      start_cluster "$d" 2 || return 1
      launch "$d" "ak$run" 1,1 100000000 || return 1
      settle "$d" || return 1
      t0=$(now); kill -KILL "${agent_pids[1]}"
      dt=$(wait_ends "$d" "$t0" 60 a0-l0 a1-l0)
      seen[$fault]="node0: $(what_seen "$d/a0-l0.log") / node1: $(what_seen "$d/a1-l0.log")"
      setting[$fault]="2 agents x 1 rank; defaults" ;;
    agent-stop)
      start_cluster "$d" 2 || return 1
      launch "$d" "as$run" 1,1 100000000 || return 1
      settle "$d" || return 1
      t0=$(now); kill -STOP "${agent_pids[1]}"
      dt=$(wait_ends "$d" "$t0" 60 a0-l0)
      kill -CONT "${agent_pids[1]}" 2>/dev/null || true
      seen[$fault]=$(what_seen "$d/a0-l0.log")
      setting[$fault]="2 agents x 1 rank; lease 5 s, heartbeat 1 s (defaults); rank on node0" ;;
    coord-kill)
      start_cluster "$d" 2 || return 1
      launch "$d" "ck$run" 1,1 "${COORD_KILL_ITERS:-30000}" || return 1
      settle "$d" || return 1
      local addr=$coord_addr
      t0=$(now); kill -KILL "$coord_pid"
      sleep 1
      start_coordinator "$d" "$addr" || return 1
      local end
      end=$(wait_ends "$d" "$t0" 120 a0-l0 a1-l0)
      local ok=0 r
      for r in a0-l0 a1-l0; do [ "$(cut -d' ' -f1 "$d/$r.end" 2>/dev/null)" = 0 ] && ok=$((ok + 1)); done
      if [ "$ok" = 2 ]; then
        dt="ok"
        seen[$fault]="nothing: every rank finished its loop with exit 0 and correct sums"
      else
        dt="failed"
        seen[$fault]=$(what_seen "$d/a0-l0.log")
      fi
      setting[$fault]="2 agents x 1 rank; coordinator --state-dir, restarted 1 s after the kill" ;;
    *) echo "unknown fault $fault" >&2; return 1 ;;
  esac
  stop_all
  times[$fault]="${times[$fault]:-} $dt"
  printf '\nfault_times: %s run %s: %s\n' "$fault" "$run" "$dt" >&2
}

# A run whose setup failed (the job did not form, a daemon did not start:
# not a measurement) is repeated, up to 3 times; its logs are kept.
setup_failures=0
for f in "${faults[@]}"; do
  for ((i = 1; i <= runs; i++)); do
    for try in 1 2 3; do
      if one_run "$f" "$i"; then break; fi
      setup_failures=$((setup_failures + 1))
      mv "$work/$f-$i" "$work/setup-failed-$f-$i-$try" 2>/dev/null || true
      echo "fault_times: $f run $i: setup failed (logs in $work/setup-failed-$f-$i-$try)" >&2
      stop_all
      keep=1
    done
  done
done

echo
echo "| fault | setting | runs | detection median (s) | max (s) | what the ranks see |"
echo "|---|---|---|---|---|---|"
for f in "${faults[@]}"; do
  vals=${times[$f]}
  if [ "$f" = coord-kill ]; then
    okc=$(echo "$vals" | tr ' ' '\n' | grep -c '^ok$' || true)
    echo "| $f | ${setting[$f]} | $runs | job finished in $okc/$runs | - | ${seen[$f]} |"
    continue
  fi
  read -r med max n_to <<<"$(echo "$vals" | tr ' ' '\n' | grep -v '^$' | sort -g | awk '
    /timeout/ { to++; next } { v[++n] = $1 }
    END { if (n == 0) { print "- - " to+0; exit }
          m = (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
          printf "%.2f %.2f %d\n", m, v[n], to }')"
  note=""
  [ "$n_to" != 0 ] && note=" ($n_to timed out)"
  echo "| $f | ${setting[$f]} | $runs$note | $med | $max | ${seen[$f]} |"
done
