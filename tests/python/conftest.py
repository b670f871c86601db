"""Shared fixtures for the kolo Python tests.

The build under test is $KOLO_BUILD_DIR (ctest sets it), else <repo>/build.
Multi-rank tests run worker scripts through <build>/bin/kolorun, which starts
a private coordinator and agent; every run is bounded and its whole process
group is killed if it overruns. Temporary files live in pytest's tmp_path.
"""

import os
import signal
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
PKG_DIR = os.path.join(REPO, "client_lib", "python")
WORKERS = os.path.join(HERE, "workers")
EXAMPLES = os.path.join(REPO, "examples")
# The interpreter every worker runs under: $KOLO_PYTHON (scripts/python-env.sh,
# CTest passes it), else the one running pytest. Never a system path.
PYTHON = os.environ.get("KOLO_PYTHON") or sys.executable

sys.path.insert(0, PKG_DIR)
sys.path.insert(0, WORKERS)


def build_dir():
    return os.path.abspath(os.environ.get("KOLO_BUILD_DIR") or os.path.join(REPO, "build"))


def _missing():
    b = build_dir()
    need = [os.path.join(b, "lib", "libkolo.so"), os.path.join(b, "bin", "kolorun"),
            os.path.join(b, "bin", "kolo-agent"), os.path.join(b, "bin", "kolo-coordinator")]
    return [p for p in need if not os.path.exists(p)]


@pytest.fixture(scope="session")
def stack():
    """The build folder, with libkolo, kolorun and both daemons present."""
    missing = _missing()
    if missing:
        msg = ("the kolo stack is not built in %s (missing: %s); build the targets "
               "kolo_client kolorun kolo-agent kolo-coordinator" % (build_dir(), ", ".join(missing)))
        if os.environ.get("KOLO_PYTHON_TESTS_REQUIRE_BUILD") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    return build_dir()


def rank_env(extra=None):
    """The environment for a process that imports kolo from this checkout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([PKG_DIR, WORKERS] + (
        [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["KOLO_LIBRARY"] = os.path.join(build_dir(), "lib", "libkolo.so")
    env["OMP_NUM_THREADS"] = "1"
    env.setdefault("KOLO_START_TIMEOUT", "30")
    env.setdefault("KOLO_OP_TIMEOUT", "60")
    env.pop("KOLO_AGENT_SOCKET", None)  # always the private agent kolorun starts
    if extra:
        env.update(extra)
    return env


class RunResult:
    def __init__(self, rc, out, err, cmd):
        self.rc, self.out, self.err, self.cmd = rc, out, err, cmd

    def rank_lines(self, rank, stream="stdout"):
        prefix = "[%d]<%s>:" % (rank, stream)
        return [l[len(prefix):] for l in self.out.splitlines() + self.err.splitlines()
                if l.startswith(prefix)]

    def describe(self, limit=6000):
        return "command: %s\nexit: %s\n--- stdout ---\n%s\n--- stderr ---\n%s" % (
            " ".join(self.cmd), self.rc, self.out[-limit:] if limit else self.out,
            self.err[-limit:] if limit else self.err)


def _session_pids(sid):
    """Processes of session `sid` (kolorun and `timeout` put their children
    in process groups of their own, but they stay in our session)."""
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid:  # fields after "(comm)": state ppid pgrp session
            pids.append(int(d))
    return pids


def _kill_session(sid, sig):
    for pid in _session_pids(sid):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def run_bounded(cmd, timeout, env=None, cwd=None):
    """Runs cmd in a session of its own. On timeout it kills every process
    of that session (SIGTERM, then SIGKILL) and fails; after a normal exit
    it also kills anything the command left behind in its session."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd,
                         start_new_session=True, text=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out, err = "", ""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            _kill_session(p.pid, sig)
            try:
                out, err = p.communicate(timeout=10)
                break
            except subprocess.TimeoutExpired:
                continue
        _kill_session(p.pid, signal.SIGKILL)
        raise AssertionError("timed out after %d s: %s\n%s\n%s" % (timeout, " ".join(cmd),
                                                                   out[-4000:], err[-4000:]))
    finally:
        leftovers = _session_pids(p.pid)
        _kill_session(p.pid, signal.SIGKILL)
    res = RunResult(p.returncode, out, err, cmd)
    res.leftovers = leftovers
    return res


@pytest.fixture
def kolorun(stack, tmp_path):
    """kolorun(np, script, *args, timeout=..., flags=[kolorun flags]) -> RunResult;
    asserts nothing."""
    def run(np, script, *args, timeout=120, env=None, agents=None, flags=()):
        cmd = [os.path.join(stack, "bin", "kolorun"), "-np", str(np)] + list(flags)
        if agents:
            cmd += ["--agents", str(agents)]
        cmd += ["--", PYTHON, script] + [str(a) for a in args]
        return run_bounded(cmd, timeout, env=rank_env(env), cwd=str(tmp_path))
    return run
