"""Starting kolo-coordinator and kolo-agent from Python, the way kolorun's
embedded mode does (docs/kolorun.md, "Where the agents come from"): a private
directory, a ready file per daemon, every wait bounded, the end of a
daemon's log in the error when it fails. Used by kolo.ray and kolo.spark.

The programs are found like libkolo (kolo._library): ``$KOLO_AGENT_BIN`` /
``$KOLO_COORDINATOR_BIN`` (a wrong one is an error), then
``$KOLO_BUILD_DIR/bin``, then ``<repository>/build/bin`` for a source
checkout, then the package's ``bin`` folder, then ``PATH``.
"""

import ctypes
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time

from .errors import KoloError

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_ENV_OVERRIDE = {"kolo-agent": "KOLO_AGENT_BIN", "kolo-coordinator": "KOLO_COORDINATOR_BIN"}
# Settings meant for a shared, TLS-protected coordinator must not reach the
# private plain-text daemons (cli/daemons.cc, privateCoordinatorEnv/privateAgentEnv).
_PRIVATE_COORDINATOR_ENV = ("KOLO_TLS_CERT", "KOLO_TLS_KEY", "KOLO_TLS_CLIENT_CA", "KOLO_AUTH_TOKEN_FILE")
_PRIVATE_AGENT_ENV = ("KOLO_COORDINATOR_CA", "KOLO_COORDINATOR_CERT", "KOLO_COORDINATOR_KEY",
                      "KOLO_COORDINATOR_SERVER_NAME", "KOLO_COORDINATOR_TOKEN",
                      "KOLO_COORDINATOR_TOKEN_FILE")
STOP_GRACE_S = 5.0


def find_program(name):
    """The path of kolo-agent or kolo-coordinator, or KoloError naming what was tried."""
    var = _ENV_OVERRIDE.get(name)
    if var and os.environ.get(var):
        path = os.environ[var]
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise KoloError("%s=%s is not an executable file" % (var, path))
        return path
    dirs = []
    if os.environ.get("KOLO_BUILD_DIR"):
        dirs.append(os.path.join(os.environ["KOLO_BUILD_DIR"], "bin"))
    repo = os.path.normpath(os.path.join(_PACKAGE_DIR, "..", "..", ".."))
    if os.path.isdir(os.path.join(repo, "client_lib")):
        dirs.append(os.path.join(repo, "build", "bin"))
    dirs.append(os.path.join(_PACKAGE_DIR, "bin"))
    for d in dirs:
        c = os.path.join(d, name)
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    found = shutil.which(name)
    if found:
        return found
    raise KoloError("cannot find %s (tried %s and PATH): build it (ninja %s), install kolo, "
                    "or set %s" % (name, ", ".join(dirs), name, var))


def _die_with_parent():
    """preexec_fn: the daemon gets SIGTERM when the process that started it
    dies (a killed Ray actor or Spark task), so nothing is left behind."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    os.setpgrp()


def log_tail(path, lines=12):
    try:
        with open(path, errors="replace") as f:
            return "".join("  " + l for l in f.readlines()[-lines:])
    except OSError:
        return "  (no log)\n"


def read_ready(path):
    """The first word of a complete ready file, else None."""
    try:
        with open(path) as f:
            s = f.read()
    except OSError:
        return None
    if not s.endswith("\n") or not s.split():
        return None
    return s.split()[0]


class Daemon:
    """One started daemon: its process, ready file and log."""

    def __init__(self, label, argv, env, log_path, ready_path):
        self.label, self.log_path, self.ready_path = label, log_path, ready_path
        self.address = None
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, env=env,
                                         preexec_fn=_die_with_parent, close_fds=True)

    def wait_ready(self, deadline):
        while True:
            addr = read_ready(self.ready_path)
            if addr:
                self.address = addr
                return addr
            rc = self.proc.poll()
            if rc is not None:
                raise KoloError("%s exited with code %s before it was ready; the end of its log (%s):\n%s"
                                % (self.label, rc, self.log_path, log_tail(self.log_path)))
            if time.monotonic() > deadline:
                raise KoloError("%s was not ready within the start timeout; the end of its log (%s):\n%s"
                                % (self.label, self.log_path, log_tail(self.log_path)))
            time.sleep(0.05)

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=STOP_GRACE_S)


def _clean_env(names):
    env = dict(os.environ)
    for n in names:
        env.pop(n, None)
    return env


def make_dir(prefix):
    return tempfile.mkdtemp(prefix=prefix, dir=os.environ.get("TMPDIR") or "/tmp")


def start_coordinator(workdir, listen_host, timeout_s, log_level=None, extra_args=()):
    """A private kolo-coordinator on listen_host (port 0); waits for it.
    extra_args: more flags (an elastic job's shorter lease)."""
    argv = [find_program("kolo-coordinator"), "--listen", "%s:0" % listen_host,
            "--ready-file", os.path.join(workdir, "coordinator.ready")] + list(extra_args)
    if log_level:
        argv += ["--log-level", log_level]
    d = Daemon("kolo-coordinator", argv, _clean_env(_PRIVATE_COORDINATOR_ENV),
               os.path.join(workdir, "coordinator.log"), os.path.join(workdir, "coordinator.ready"))
    try:
        d.wait_ready(time.monotonic() + timeout_s)
    except BaseException:
        d.stop()
        raise
    return d


def start_agent(workdir, agent_id, coordinator, timeout_s, rpc_host="127.0.0.1", log_level=None):
    """A kolo-agent with id agent_id for this node; waits for it. Its
    admin token is a fresh file in workdir (mode 0600)."""
    token_file = os.path.join(workdir, "agent-admin.token")
    if not os.path.exists(token_file):
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(16) + "\n")
    base = os.path.join(workdir, "agent-" + agent_id)
    argv = [find_program("kolo-agent"), "--socket", base + ".sock", "--coordinator", coordinator,
            "--rpc-listen", "%s:0" % rpc_host, "--rpc-auth-token-file", token_file,
            "--ready-file", base + ".ready", "--agent-id", agent_id,
            "--metrics-listen", "127.0.0.1:0"]
    if log_level:
        argv += ["--log-level", log_level]
    env = _clean_env(_PRIVATE_AGENT_ENV)
    env["KOLO_COORDINATOR_TLS"] = "false"
    d = Daemon("kolo-agent " + agent_id, argv, env, base + ".log", base + ".ready")
    d.socket = base + ".sock"
    d.token_file = token_file
    try:
        d.wait_ready(time.monotonic() + timeout_s)
    except BaseException:
        d.stop()
        raise
    return d


def agent_id(index, count):
    """node0..node9, zero-padded from 11 nodes on, so that the
    coordinator's order by id is the order of the rank blocks."""
    width = len(str(count - 1)) if count > 10 else 1
    return "node%0*d" % (width, index)


def new_job():
    return "job-" + secrets.token_hex(6), secrets.token_hex(16)


def node_blocks(keys):
    """Ranks in per-node blocks. keys[i] is the node of worker i; nodes are
    ordered by their first worker. Returns (rank_of_worker, layout) where
    layout[i] = dict(rank, local_rank, local_size, cross_rank, cross_size,
    node_index, num_nodes)."""
    nodes = []
    for k in keys:
        if k not in nodes:
            nodes.append(k)
    members = {k: [i for i, kk in enumerate(keys) if kk == k] for k in nodes}
    rank_of, layout, rank = [None] * len(keys), [None] * len(keys), 0
    for ni, k in enumerate(nodes):
        for li, w in enumerate(members[k]):
            rank_of[w] = rank
            rank += 1
            cross = [n for n in nodes if len(members[n]) > li]
            layout[w] = dict(rank=rank_of[w], local_rank=li, local_size=len(members[k]),
                             cross_rank=cross.index(k), cross_size=len(cross),
                             node_index=ni, num_nodes=len(nodes))
    return rank_of, layout


def rank_environment(lay, size, socket, agent_rpc, coordinator, job_id, token, start_timeout,
                     token_file=None):
    """The variables kolorun gives a rank (docs/kolorun.md, "Ranks")."""
    nums = {"RANK": lay["rank"], "SIZE": size, "LOCAL_RANK": lay["local_rank"],
            "LOCAL_SIZE": lay["local_size"], "CROSS_RANK": lay["cross_rank"],
            "CROSS_SIZE": lay["cross_size"]}
    env = {"KOLO_AGENT_SOCKET": socket, "KOLO_JOB_ID": job_id, "KOLO_JOB_TOKEN": token,
           "KOLO_START_TIMEOUT": str(int(start_timeout)), "KOLO_COORDINATOR": coordinator}
    if agent_rpc:
        env["KOLO_AGENT_RPC"] = agent_rpc
    if token_file:
        env["KOLO_AGENT_TOKEN_FILE"] = token_file
    for k, v in nums.items():
        env["KOLO_" + k] = str(v)
        env["HOROVOD_" + k] = str(v)
    env.update({"RANK": str(lay["rank"]), "WORLD_SIZE": str(size),
                "LOCAL_RANK": str(lay["local_rank"]), "LOCAL_WORLD_SIZE": str(lay["local_size"]),
                "GROUP_RANK": str(lay["node_index"]), "GROUP_WORLD_SIZE": str(lay["num_nodes"])})
    return env
