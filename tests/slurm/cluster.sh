#!/usr/bin/env bash
# A real Slurm cluster on this machine (sourced by tests/slurm/*.sh):
# munged, slurmctld and one kolo-coordinator in a "control" network
# namespace holding a bridge on 10.77.0.0/24, and N nodes, each a network
# namespace with a veth on that bridge (10.77.0.1X), its own slurmd
# (`slurmd -N nX`) and its own kolo-agent. Nothing is added to the host's
# own network namespace. slurm_cluster_down (run by the caller's EXIT trap)
# stops every process it started and removes the namespaces and files.
#
# Needs root, iproute2, munge, slurmctld, slurmd, slurm-client
# (scripts/install-deps.sh) and a build (KOLO_BIN: build/bin).
set -euo pipefail

SC_ID=${SC_ID:-$$}
SC_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
KOLO_BIN=${KOLO_BIN:-$SC_REPO/build/bin}
SC_DIR=$(mktemp -d /tmp/kolo-slurm-XXXXXX)
SC_CTL_NS=ksl${SC_ID}c
SC_BR=kslbr${SC_ID}
SC_NODES=()
SC_PIDS=()
export SLURM_CONF=$SC_DIR/slurm.conf

sc_log() { echo "slurm-cluster: $*" >&2; }
sc_in() { local ns=$1; shift; ip netns exec "$ns" "$@"; }
sc_node_ns() { echo "ksl${SC_ID}n$1"; }

# Waits (bounded) until "$@" succeeds.
sc_wait() {
  local secs=$1 what=$2; shift 2
  local end=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $end ]; then sc_log "timed out after ${secs}s waiting for $what"; return 1; fi
    sleep 0.2
  done
}

slurm_cluster_down() {
  local p
  for p in "${SC_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${SC_PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null || true
  done
  # slurmstepd and job tasks left by a killed slurmd.
  for p in $(pgrep -f "$SC_DIR" 2>/dev/null || true); do kill -KILL "$p" 2>/dev/null || true; done
  local i
  for i in "${SC_NODES[@]}"; do ip netns del "$(sc_node_ns "$i")" 2>/dev/null || true; done
  ip netns del "$SC_CTL_NS" 2>/dev/null || true
  [ "${KOLO_SLURM_KEEP:-0}" = 1 ] && { sc_log "kept $SC_DIR"; return; }
  rm -rf "$SC_DIR"
}

# slurm_cluster_up N: munge, slurmctld, coordinator, N nodes (n1..nN) with
# CPUs=$SC_CPUS each (default 2), each with its slurmd and kolo-agent.
slurm_cluster_up() {
  local n=$1 cpus=${SC_CPUS:-2} i
  mkdir -p "$SC_DIR"/{munge,ctl,log}
  ip netns add "$SC_CTL_NS"
  sc_in "$SC_CTL_NS" ip link set lo up
  sc_in "$SC_CTL_NS" ip link add "$SC_BR" type bridge
  sc_in "$SC_CTL_NS" ip addr add 10.77.0.1/24 dev "$SC_BR"
  sc_in "$SC_CTL_NS" ip link set "$SC_BR" up
  local nodes_conf=""
  for i in $(seq 1 "$n"); do
    local ns; ns=$(sc_node_ns "$i")
    ip netns add "$ns"
    SC_NODES+=("$i")
    sc_in "$ns" ip link set lo up
    ip link add "kslv${SC_ID}a$i" netns "$SC_CTL_NS" type veth peer name eth0 netns "$ns"
    sc_in "$SC_CTL_NS" ip link set "kslv${SC_ID}a$i" master "$SC_BR" up
    sc_in "$ns" ip addr add "10.77.0.1$i/24" dev eth0
    sc_in "$ns" ip link set eth0 up
    nodes_conf+="NodeName=n$i NodeAddr=10.77.0.1$i CPUs=$cpus State=UNKNOWN"$'\n'
  done
  dd if=/dev/urandom of="$SC_DIR/munge/munge.key" bs=1024 count=1 status=none
  chmod 0400 "$SC_DIR/munge/munge.key"
  /usr/sbin/munged --foreground --force --key-file="$SC_DIR/munge/munge.key" \
    --socket="$SC_DIR/munge/munge.sock" --pid-file="$SC_DIR/munge/munged.pid" \
    --seed-file="$SC_DIR/munge/seed" --log-file="$SC_DIR/log/munged.log" &
  SC_PIDS+=($!)
  sc_wait 10 munged test -S "$SC_DIR/munge/munge.sock"
  cat > "$SLURM_CONF" <<CONF
ClusterName=kolotest
SlurmctldHost=$(hostname -s)(10.77.0.1)
MailProg=/bin/true
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SC_DIR/munge/munge.sock
StateSaveLocation=$SC_DIR/ctl
SlurmdSpoolDir=$SC_DIR/spool-%n
SlurmctldPidFile=$SC_DIR/ctl/slurmctld.pid
SlurmdPidFile=$SC_DIR/slurmd-%n.pid
SlurmctldLogFile=$SC_DIR/log/slurmctld.log
SlurmdLogFile=$SC_DIR/log/slurmd-%n.log
SlurmctldPort=${SC_CTL_PORT:-6817}
SlurmdPort=6818
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
SlurmdTimeout=${SC_SLURMD_TIMEOUT:-30}
InactiveLimit=0
KillWait=5
MinJobAge=10
Prolog=$SC_DIR/prolog
Epilog=$SC_DIR/epilog
$nodes_conf
PartitionName=kolo Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
  # slurmd 22.05 always loads a cgroup plugin; this machine has the v1
  # hierarchies mounted (nothing is confined: proctrack/linuxproc, task/none).
  echo "CgroupPlugin=${SC_CGROUP_PLUGIN:-cgroup/v1}" > "$SC_DIR/cgroup.conf"
  for i in $(seq 1 "$n"); do mkdir -p "$SC_DIR/spool-n$i"; done
  # The cluster's kolo-coordinator, next to slurmctld.
  SC_COORD_PORT=7470
  sc_in "$SC_CTL_NS" "$KOLO_BIN/kolo-coordinator" --listen "10.77.0.1:$SC_COORD_PORT" \
    --ready-file "$SC_DIR/coordinator.ready" --lease-ms 3000 --heartbeat-interval-ms 500 \
    >"$SC_DIR/log/coordinator.log" 2>&1 &
  SC_PIDS+=($!)
  sc_wait 20 kolo-coordinator test -s "$SC_DIR/coordinator.ready"
  # The prolog and epilog of deploy/slurm, with this cluster's site key.
  dd if=/dev/urandom of="$SC_DIR/site.key" bs=32 count=1 status=none
  chmod 0400 "$SC_DIR/site.key"
  for p in prolog epilog; do
    printf '#!/bin/sh\nKOLO_SLURM_JOB_KEY=%s exec %s\n' "$SC_DIR/site.key" "$SC_REPO/deploy/slurm/$p.sh" > "$SC_DIR/$p"
    chmod 0755 "$SC_DIR/$p"
  done
  sc_in "$SC_CTL_NS" /usr/sbin/slurmctld -D -i -f "$SLURM_CONF" >"$SC_DIR/log/slurmctld.out" 2>&1 &
  SC_PIDS+=($!)
  sc_wait 20 slurmctld sc_in "$SC_CTL_NS" scontrol ping
  for i in $(seq 1 "$n"); do sc_node_up "$i"; done
  sc_wait 30 "every node idle" sc_all_idle "$n"
}

# A node: a private mount namespace in which /run/kolo is the node's own
# directory (the system agent's default socket /run/kolo/agent.sock and the
# prolog's /run/kolo/jobs), its kolo-agent and its slurmd, all in its network
# namespace. SC_AGENT_PID_i and SC_SLURMD_PID_i are their pids.
sc_node_up() {
  local i=$1 ns holder
  ns=$(sc_node_ns "$i")
  mkdir -p "$SC_DIR/run-n$i" /run/kolo
  unshare -m --propagation private sh -c "mount --bind '$SC_DIR/run-n$i' /run/kolo && exec sleep 100000" &
  holder=$!
  SC_PIDS+=("$holder")
  eval "SC_HOLDER_PID_$i=$holder"
  sc_wait 10 "node n$i's mount namespace" nsenter -t "$holder" -m mountpoint -q /run/kolo
  nsenter -t "$holder" -m ip netns exec "$ns" env KOLO_BACKEND=tcp "$KOLO_BIN/kolo-agent" \
    --socket /run/kolo/agent.sock --coordinator "10.77.0.1:$SC_COORD_PORT" --agent-id "n$i" --hostname "n$i" \
    --rpc-listen "10.77.0.1$i:7471" --metrics-listen "10.77.0.1$i:0" --ready-file "$SC_DIR/agent-n$i.ready" \
    --backend-timeout-ms "${SC_BACKEND_TIMEOUT_MS:-5000}" >"$SC_DIR/log/agent-n$i.log" 2>&1 &
  SC_PIDS+=($!)
  eval "SC_AGENT_PID_$i=$!"
  sc_wait 30 "the kolo-agent of n$i" test -s "$SC_DIR/agent-n$i.ready"
  nsenter -t "$holder" -m ip netns exec "$ns" /usr/sbin/slurmd -D -N "n$i" -f "$SLURM_CONF" \
    >"$SC_DIR/log/slurmd-n$i.out" 2>&1 &
  SC_PIDS+=($!)
  eval "SC_SLURMD_PID_$i=$!"
}

# sc_on_node I CMD...: CMD on node I (its network and mount namespaces).
sc_on_node() {
  local i=$1; shift
  local holder_var="SC_HOLDER_PID_$i"
  nsenter -t "${!holder_var}" -m ip netns exec "$(sc_node_ns "$i")" "$@"
}

sc_all_idle() {
  local idle
  idle=$(sc_in "$SC_CTL_NS" sinfo -h -N -t idle -o %N | sort -u | wc -l)
  [ "$idle" -eq "$1" ]
}

# sc_ctl CMD...: a Slurm client command (sbatch, srun, squeue, scancel)
# where slurmctld and the nodes reach it.
sc_ctl() { sc_in "$SC_CTL_NS" "$@"; }
