"""What runs inside each Spark barrier task of kolo.spark.run: one rank.

The tasks compute the same layout from the barrier's task addresses (ranks
in per-host blocks, hosts in the order of their first task); the first
rank of each host starts that host's kolo-agent in a directory named by the
job and the agent, the host's other ranks wait for its ready file. Each
task keeps a connection to the driver open for its whole life: the driver
learns at once when a rank fails (its text) or vanishes (connection closed).
"""

import json
import os
import shutil
import socket
import sys
import time
import traceback

from .. import _daemons


def _host_of(address):
    return address.rsplit(":", 1)[0]


def _task_hosts(ctx, part):
    """The executor host of every task, in partition order: the host's
    $SPARK_LOCAL_IP when it sets one (the address Spark binds there; several
    workers on one machine differ only by it), else the host of the task's
    executor address in the barrier's task infos."""
    mine = os.environ.get("SPARK_LOCAL_IP") or _host_of(ctx.getTaskInfos()[part].address)
    return [json.loads(m) for m in ctx.allGather(json.dumps(mine))]


class _DriverLink:
    def __init__(self, driver, secret, partition, host):
        self.sock = socket.create_connection(tuple(driver), timeout=30)
        self.sock.settimeout(None)
        self.send({"secret": secret, "partition": partition, "host": host, "pid": os.getpid()})

    def send(self, msg):
        self.sock.sendall((json.dumps(msg) + "\n").encode())

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def _agent_dir(job_id, agent_id):
    base = os.environ.get("TMPDIR") or "/tmp"
    return os.path.join(base, "kolo-spark-%s-%s" % (job_id, agent_id))


def _stale(d):
    """True for a job directory of this user whose agent.pid names a
    process that is not that directory's kolo-agent any more."""
    try:
        if os.stat(d).st_uid != os.getuid():
            return False
        with open(os.path.join(d, "agent.pid")) as f:
            pid = int(f.read())
    except (OSError, ValueError):
        return False  # no pid file: being started right now
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            argv = f.read()
    except OSError:
        return True
    return not (b"kolo-agent" in argv and d.encode() in argv)


def _remove_stale_dirs():
    """Directories of earlier jobs whose task was killed before it could
    remove them (a cancelled stage, a lost executor)."""
    base = os.environ.get("TMPDIR") or "/tmp"
    for name in os.listdir(base):
        d = os.path.join(base, name)
        if name.startswith("kolo-spark-job-") and _stale(d):
            shutil.rmtree(d, ignore_errors=True)


def _start_or_wait_agent(job, lay, agent_id, deadline):
    d = _agent_dir(job["job_id"], agent_id)
    if lay["local_rank"] == 0:
        _remove_stale_dirs()
        os.makedirs(d, mode=0o700, exist_ok=True)
        left = max(1.0, deadline - time.monotonic())
        agent = _daemons.start_agent(d, agent_id, job["coordinator"], left, log_level=job.get("log_level"))
        with open(os.path.join(d, "agent.pid"), "w") as f:
            f.write("%d\n" % agent.proc.pid)
        return agent, agent.socket, agent.address, agent.token_file
    base = os.path.join(d, "agent-" + agent_id)
    while True:
        addr = _daemons.read_ready(base + ".ready")
        if addr:
            return None, base + ".sock", addr, os.path.join(d, "agent-admin.token")
        if time.monotonic() > deadline:
            raise RuntimeError("kolo.spark: the kolo-agent %s of this host (started by its first rank) "
                               "was not ready within start_timeout; its log: %s.log" % (agent_id, base))
        time.sleep(0.05)


def _shutdown_kolo():
    """A reused Python worker must not keep this job's kolo state."""
    try:
        import kolo
        if kolo.is_initialized():
            kolo.shutdown()
    except Exception:  # noqa: BLE001 -- best effort
        pass


def run_task(job, fn, args, kwargs):
    """The body of one barrier task; returns [(rank, result)]."""
    from pyspark import BarrierTaskContext
    ctx = BarrierTaskContext.get()
    part = ctx.partitionId()
    hosts = _task_hosts(ctx, part)
    rank_of, layout = _daemons.node_blocks(hosts)
    lay = layout[part]
    os.environ.update(job["env"])  # KOLO_BUILD_DIR etc.: where this host finds kolo-agent
    link = _DriverLink(job["driver"], job["secret"], part, hosts[part])
    agent = None
    try:
        deadline = time.monotonic() + job["start_timeout"]
        agent_id = _daemons.agent_id(lay["node_index"], lay["num_nodes"])
        agent, sock, rpc, token_file = _start_or_wait_agent(job, lay, agent_id, deadline)
        env = _daemons.rank_environment(lay, len(hosts), sock, rpc, job["coordinator"],
                                        job["job_id"], job["token"], job["start_timeout"], token_file)
        os.environ.update(env)
        link.send({"rank": lay["rank"], "state": "running"})
        try:
            result = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 -- reported to the driver with its text
            # first the report (the driver cancels the stage), then kolo's
            # shutdown, which may wait on the ranks still in a collective
            link.send({"rank": lay["rank"], "state": "failed", "error": "%s: %s" % (type(e).__name__, e),
                       "traceback": traceback.format_exc()})
            _shutdown_kolo()
            raise
        _shutdown_kolo()
        link.send({"rank": lay["rank"], "state": "done"})
        # The host's agent serves every local rank: its starter waits for all.
        ctx.barrier()
        return [(lay["rank"], result)]
    finally:
        sys.stdout.flush()
        if agent is not None:
            agent.stop()
            shutil.rmtree(os.path.dirname(agent.socket), ignore_errors=True)
        link.close()
