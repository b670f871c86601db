#!/usr/bin/env bash
# kolo on a real Slurm cluster built on this machine (tests/slurm/cluster.sh:
# munge, slurmctld and a kolo-coordinator, and SLURM_TEST_NODES nodes, each a
# network namespace with its slurmd and kolo-agent; default 2). Runs:
#   direct   sbatch -N2 -n4: `srun kolo_check M` for every collective (results
#            checked exactly by kolo_check), ranks from srun's variables, the
#            token from deploy/slurm/prolog.sh
#   kolorun  sbatch -N2 -n4: `kolorun -np 4 kolo_check M` (--launcher auto:
#            one srun step, hosts from the allocation)
#   kolorun-fail  rank 1 of kolorun's srun step exits 3: kolorun exits 3, the
#            others (sleeping 60 s) are stopped
#   mpirun   `mpirun -np 2 kolo_check allreduce` on node n1 (its system agent);
#            without KOLO_JOB_TOKEN the error says what to set
#   nodelost a running srun job loses node n2 (its slurmd and kolo-agent
#            SIGKILLed): every remaining rank fails naming n2 within the bound
#   scancel  scancel of a running job ends every rank; every agent drops the job
# Exit 0 when all pass; 77 when it cannot run here (not root, no Slurm).
# Bounded: every wait has a deadline; the EXIT trap removes everything.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
[ "$(id -u)" = 0 ] || { echo "slurm_test: SKIP: needs root (network namespaces)"; exit 77; }
for p in slurmctld slurmd munged srun sbatch; do
  command -v "$p" >/dev/null || [ -x "/usr/sbin/$p" ] || { echo "slurm_test: SKIP: no $p (scripts/install-deps.sh)"; exit 77; }
done
# slurmd 22.05 needs a cgroup plugin (cluster.sh: cgroup/v1 unless
# SC_CGROUP_PLUGIN says otherwise); without the v1 hierarchies it cannot start.
if [ -z "${SC_CGROUP_PLUGIN:-}" ] && ! grep -qs " /sys/fs/cgroup/freezer cgroup " /proc/mounts; then
  echo "slurm_test: SKIP: no cgroup v1 freezer hierarchy mounted for slurmd's cgroup/v1 plugin (set SC_CGROUP_PLUGIN)"
  exit 77
fi
source "$here/cluster.sh"
trap slurm_cluster_down EXIT
N=${SLURM_TEST_NODES:-2}
T0=$SECONDS
slurm_cluster_up "$N"
echo "slurm_test: cluster of $N nodes up in $((SECONDS - T0)) s"
CHECK=$KOLO_BIN/kolo_check
fails=0
pass() { echo "slurm_test: PASS $1 ($2)"; }
fail() { echo "slurm_test: FAIL $1: $2"; fails=$((fails + 1)); }
ranks=$((2 * N))
collectives="allreduce broadcast allgather reducescatter alltoall barrier"

# sbatch -W with a deadline; prints the job's output.
run_batch() {
  local name=$1 secs=$2; shift 2
  local out=$SC_DIR/$name.out
  timeout "$secs" ip netns exec "$SC_CTL_NS" sbatch -W -N "$N" -n "$ranks" -o "$out" "$@" >/dev/null 2>&1
  local rc=$?
  cat "$out" 2>/dev/null || true
  return $rc
}

# 1. Direct launch: srun starts the ranks, no kolorun.
cat > "$SC_DIR/direct.sh" <<S
#!/bin/bash
for m in $collectives; do
  srun --label --overlap --kill-on-bad-exit=1 "$CHECK" \$m || { echo "collective \$m failed"; exit 1; }
done
srun --label --overlap "$CHECK" init-only
S
t=$SECONDS
if out=$(run_batch direct 300 "$SC_DIR/direct.sh"); then
  passed=$(grep -c "checks passed" <<<"$out" || true)
  same=$(grep -cE "^ *([0-9]+): rank \\1/$ranks local" <<<"$out" || true)  # init-only: kolo rank = SLURM_PROCID
  if [ "$passed" -ge $((ranks * 5)) ] && [ "$same" = "$ranks" ] && ! grep -q "kolo: warning: kolo rank" <<<"$out"; then
    pass direct "$passed 'checks passed' lines, kolo ranks = SLURM_PROCID, $((SECONDS - t)) s"
  else fail direct "$passed 'checks passed' lines, $same ranks equal to SLURM_PROCID: $out"; fi
else
  fail direct "the job failed: $out $(tail -n 20 "$SC_DIR"/log/agent-n1.log)"
fi

# 2. kolorun inside the allocation: one srun step.
cat > "$SC_DIR/kolorun.sh" <<S
#!/bin/bash
for m in $collectives; do
  "$KOLO_BIN/kolorun" --verbose -np $ranks "$CHECK" \$m || { echo "collective \$m failed"; exit 1; }
done
S
t=$SECONDS
if out=$(run_batch kolorun 300 "$SC_DIR/kolorun.sh"); then
  passed=$(grep -c "checks passed" <<<"$out" || true)
  if [ "$passed" -ge $((ranks * 5)) ] && grep -q "as one srun step, all succeeded" <<<"$out"; then
    pass kolorun "$passed 'checks passed' lines, $((SECONDS - t)) s"
  else fail kolorun "$passed 'checks passed' lines: $out"; fi
else
  fail kolorun "the job failed: $out"
fi

# Processes matching $2 in node $1's network namespace.
node_procs() {
  local ns pid c=0
  ns=$(sc_node_ns "$1")
  for pid in $(pgrep -f "$2" || true); do
    [ "$(ip netns identify "$pid" 2>/dev/null)" = "$ns" ] && c=$((c + 1))
  done
  echo "$c"
}
export -f node_procs sc_node_ns
export SC_ID

# 2a. kolorun's srun step when a rank fails: the step ends, kolorun exits
# with the rank's code and says so; each rank saw its own KOLO_RANK.
cat > "$SC_DIR/kolorun-fail.sh" <<'S'
#!/bin/bash
"$1/kolorun" -np "$2" sh -c 'echo "rank $KOLO_RANK of $KOLO_SIZE local $KOLO_LOCAL_RANK/$KOLO_LOCAL_SIZE on $SLURMD_NODENAME"; [ "$KOLO_RANK" != 1 ] || exit 3; sleep 60'
echo "kolorun exit code $?"
S
t=$SECONDS
out=$(run_batch kolorun-fail 120 "$SC_DIR/kolorun-fail.sh" "$KOLO_BIN" "$ranks") || true
if grep -q "kolorun exit code 3" <<<"$out" && grep -q "as one srun step, rank 1 failed (exited with code 3)" <<<"$out" &&
   grep -q "^\[1\]<stdout>:rank 1 of $ranks local 1/2 on n1" <<<"$out" &&
   grep -q "^\[2\]<stdout>:rank 2 of $ranks local 0/2 on n2" <<<"$out" && [ $((SECONDS - t)) -lt 60 ]; then
  pass kolorun-fail "exit code 3 and the others stopped in $((SECONDS - t)) s"
else
  fail kolorun-fail "$out"
fi

# 2b. Direct launch by Open MPI's mpirun on node n1, joining its system
# agent at /run/kolo/agent.sock: without a token it says what to set.
if command -v mpirun >/dev/null; then
  t=$SECONDS
  out=$(KOLO_JOB_TOKEN=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n') \
        sc_on_node 1 timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2 -x KOLO_JOB_TOKEN "$CHECK" allreduce 2>&1) || true
  bad=$(sc_on_node 1 timeout 60 mpirun --allow-run-as-root --oversubscribe -np 2 "$CHECK" allreduce 2>&1) || true
  if [ "$(grep -c 'allreduce checks passed' <<<"$out")" = 2 ] &&
     grep -q "a rank started by openmpi needs the job's token: export KOLO_JOB_TOKEN" <<<"$bad"; then
    pass mpirun "2 ranks checked, and the tokenless run said what to set, $((SECONDS - t)) s"
  else
    fail mpirun "$out --- without a token: $bad"
  fi
fi

# A long-running srun job; waits until every rank trains.
start_loop_job() {
  local name=$1
  cat > "$SC_DIR/$name.sh" <<S
#!/bin/bash
srun --label --overlap "$CHECK" until "$SC_DIR/$name.stop"
S
  ip netns exec "$SC_CTL_NS" sbatch -N "$N" -n "$ranks" -o "$SC_DIR/$name.out" "$SC_DIR/$name.sh" | awk '{print $4}'
}
wait_training() {
  sc_wait 90 "job $1 training" grep -q "training" "$SC_DIR/$1.out"
}

# 3. scancel ends every rank and the agents drop the job.
jid=$(start_loop_job cancelled)
if wait_training cancelled; then
  agent_status() { ip netns exec "$(sc_node_ns 1)" "$KOLO_BIN/kolo" status --agent 10.77.0.11:7471 2>&1; }
  before=$(agent_status) || true
  t=$SECONDS
  ip netns exec "$SC_CTL_NS" scancel "$jid"
  if ! grep -q "slurm-$jid\." <<<"$before"; then
    fail scancel "agent n1 did not list job slurm-$jid while it ran: $before"
  elif sc_wait 30 "the cancelled job's ranks to end" sh -c "! pgrep -f '[k]olo_check until $SC_DIR/cancelled.stop' >/dev/null"; then
    dt=$((SECONDS - t))
    sc_wait 10 "agent n1 to drop job slurm-$jid" ip netns exec "$(sc_node_ns 1)" \
      bash -c "! '$KOLO_BIN/kolo' status --agent 10.77.0.11:7471 2>&1 | grep -q 'slurm-$jid\.'" || true
    after=$(agent_status) || true
    if grep -q "slurm-$jid\." <<<"$after"; then fail scancel "agent n1 still lists the job: $after"
    else pass scancel "every rank ended ${dt} s after scancel; agent n1 listed job slurm-$jid before and not after"; fi
  else
    fail scancel "ranks still running 30 s after scancel: $(pgrep -af '[k]olo_check until')"
  fi
else
  fail scancel "the job did not start training: $(cat "$SC_DIR/cancelled.out" 2>/dev/null)"
fi

# 4. A node lost mid-job: n2's slurmd and agent SIGKILLed.
jid=$(start_loop_job nodelost)
if wait_training nodelost; then
  t=$SECONDS
  kill -KILL "$SC_AGENT_PID_2" "$SC_SLURMD_PID_2"
  bound=$(( (${SC_BACKEND_TIMEOUT_MS:-5000} + 999) / 1000 + 2 + 10 ))
  # n1's ranks must end within the bound (their agent fails the job); n2's
  # end when their agent's socket closes.
  sc_wait "$bound" "n1's ranks to end" bash -c "[ \$(node_procs 1 '[k]olo_check until $SC_DIR/nodelost.stop') = 0 ]" || true
  dt=$((SECONDS - t))
  out=$(cat "$SC_DIR/nodelost.out")
  n1_err=$(grep -E '^ *[01]: .*(KOLO_ERR|failed)' <<<"$out" | head -n 2 || true)
  left=$(node_procs 1 "[k]olo_check until $SC_DIR/nodelost.stop")
  sc_wait 30 "n2's ranks to end" sh -c "! pgrep -f '[k]olo_check until $SC_DIR/nodelost.stop' >/dev/null" || left="$left, and ranks on n2 still running"
  if grep -qE '^ *[01]: .*lost node n2' <<<"$out" && [ "$dt" -lt "$bound" ] && [ "$left" = 0 ]; then
    pass nodelost "n1's ranks failed naming n2 ${dt} s after the kill (bound ${bound} s): $(head -c 300 <<<"$n1_err")"
  else
    fail nodelost "after ${dt} s (bound ${bound} s), $left rank(s) left on n1: $out"
  fi
else
  fail nodelost "the job did not start training: $(cat "$SC_DIR/nodelost.out" 2>/dev/null)"
fi
ip netns exec "$SC_CTL_NS" scancel "$jid" 2>/dev/null || true

echo "slurm_test: $fails failure(s) in $((SECONDS - T0)) s"
[ "$fails" = 0 ]
