"""The Ray actors of kolo.ray: one _NodeAgent per Ray node (it owns that
node's kolo-agent process) and one _Worker per rank."""

import os
import shutil
import socket

import ray

from .. import _daemons


class NodeAgent:
    """Runs the node's kolo-agent. Placed on its node with a hard
    NodeAffinitySchedulingStrategy and no CPU, so it never takes a worker's
    slot. The agent process dies with this actor (PR_SET_PDEATHSIG)."""

    def __init__(self, env):
        os.environ.update(env)
        self.dir = _daemons.make_dir("kolo-ray-")
        self.daemon = None

    def start(self, agent_id, coordinator, timeout_s, log_level=None):
        self.daemon = _daemons.start_agent(self.dir, agent_id, coordinator, timeout_s,
                                           log_level=log_level)
        return {"socket": self.daemon.socket, "rpc": self.daemon.address,
                "token_file": self.daemon.token_file, "pid": self.daemon.proc.pid,
                "log": self.daemon.log_path}

    def alive(self):
        return self.daemon is not None and self.daemon.alive()

    def log_tail(self):
        return _daemons.log_tail(self.daemon.log_path) if self.daemon else ""

    def stop(self):
        if self.daemon is not None:
            self.daemon.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
        return True


class Worker:
    """One rank. Its environment gets kolorun's rank variables before any
    function runs, so kolo.torch.init() inside the function joins the job."""

    def __init__(self):
        self.executable = None

    def where(self):
        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "ip": ray.util.get_node_ip_address(),
                "host": socket.gethostname(), "pid": os.getpid()}

    def set_env(self, env):
        os.environ.update(env)
        return True

    def start_executable(self, cls, args, kwargs):
        if cls is not None:
            self.executable = cls(*(args or ()), **(kwargs or {}))
        return True

    def execute(self, fn):
        return fn(self.executable)

    def run(self, fn, args, kwargs):
        return fn(*(args or ()), **(kwargs or {}))

    def shutdown_kolo(self):
        try:
            import kolo
            if kolo.is_initialized():
                kolo.shutdown()
        except Exception:  # noqa: BLE001 -- best effort before the actor goes
            pass
        return True
