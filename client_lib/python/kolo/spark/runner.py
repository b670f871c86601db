"""kolo.spark.run: Horovod's horovod.spark.run on kolo (docs/spark.md).

The driver starts a private kolo-coordinator and a small TCP listener, then
runs one Spark barrier stage of num_proc tasks; every task is one rank
(kolo.spark._task). The driver waits for all ranks to connect within
start_timeout (too few Spark slots: a clear error), and ends the stage as
soon as a rank fails or its connection drops (a killed executor).
"""

import json
import os
import re
import secrets
import shutil
import socket
import sys
import threading
import time

from .. import _daemons
from ..errors import KoloError
from . import _task

_PASSED_ON = ("KOLO_LIBRARY", "KOLO_BUILD_DIR", "KOLO_AGENT_BIN", "KOLO_OP_TIMEOUT",
              "KOLO_LOG_LEVEL", "KOLO_BACKEND", "KOLO_FUSION_THRESHOLD_MB", "KOLO_CYCLE_TIME_MS")


class KoloSparkError(KoloError):
    """kolo.spark.run could not start its ranks, or a rank failed."""


class _Listener:
    """Accepts the tasks' connections and records what they report."""

    def __init__(self, host, secret, num_proc):
        self.secret, self.num_proc = secret, num_proc
        self.srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.srv.bind((host, 0))
        self.srv.listen(max(16, num_proc * 2))
        self.address = self.srv.getsockname()
        self.cond = threading.Condition()
        self.registered, self.running, self.done = {}, {}, set()
        self.failure = None  # (rank or partition, text)
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closed:
            try:
                conn, _ = self.srv.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _fail(self, who, text):
        with self.cond:
            # A rank that failed because another one ended first is not the
            # cause: that one's own failure replaces it when it comes.
            if self.failure is None or (_is_consequence(self.failure[1]) and not _is_consequence(text)):
                self.failure = (who, text)
            self.cond.notify_all()

    def settled_failure(self, wait_s=2.0):
        """The failure to report: a consequence (a peer ended) waits up to
        wait_s for the peer's own failure. Call with cond held."""
        if self.failure is not None and _is_consequence(self.failure[1]):
            self.cond.wait_for(lambda: not _is_consequence(self.failure[1]), timeout=wait_s)
        return self.failure

    def _serve(self, conn):
        part, rank = None, None
        with conn, conn.makefile("r") as f:
            for line in f:
                msg = json.loads(line)
                if part is None:
                    if msg.get("secret") != self.secret:
                        return
                    part = msg["partition"]
                    with self.cond:
                        self.registered[part] = msg
                        self.cond.notify_all()
                    continue
                rank = msg.get("rank", rank)
                if msg.get("state") == "running":
                    with self.cond:
                        self.running[rank] = part
                        self.cond.notify_all()
                elif msg.get("state") == "failed":
                    self._fail("rank %d" % rank, "%s\n%s" % (msg["error"], msg.get("traceback", "")))
                elif msg.get("state") == "done":
                    with self.cond:
                        self.done.add(rank)
                        self.cond.notify_all()
        if part is not None and rank not in self.done and not self.closed:
            who = ("rank %d" % rank) if rank is not None else ("Spark task %d" % part)
            host = self.registered.get(part, {}).get("host", "?")
            self._fail(who, "its Spark task on executor host %s ended before the function returned "
                            "(the executor or its Python worker died, or the task was killed)" % host)

    def close(self):
        self.closed = True
        try:
            self.srv.close()
        except OSError:
            pass


def _spark_context():
    try:
        from pyspark import SparkContext
    except ImportError as e:
        raise KoloSparkError("kolo.spark.run needs pyspark (pip install pyspark): %s" % e) from e
    sc = SparkContext._active_spark_context
    if sc is None:
        raise KoloSparkError("kolo.spark.run: no active SparkContext; create a SparkSession "
                             "(SparkSession.builder...getOrCreate()) first")
    return sc


def _default_start_timeout():
    return int(os.environ.get("HOROVOD_SPARK_START_TIMEOUT", os.environ.get("KOLO_SPARK_START_TIMEOUT", "600")))


def run(fn, args=(), kwargs=None, num_proc=None, start_timeout=None, use_mpi=None, use_gloo=None,
        extra_mpi_args=None, env=None, stdout=None, stderr=None, verbose=1, nics=None,
        prefix_output_with_timestamp=False, executable=None):
    """Runs fn(*args, **kwargs) on num_proc ranks, one per Spark barrier
    task; returns the ranks' results in rank order. A rank that raises or
    whose executor dies fails the call with that rank's error."""
    del use_mpi, use_gloo, extra_mpi_args, nics, prefix_output_with_timestamp, executable
    sc = _spark_context()
    num_proc = num_proc if num_proc is not None else sc.defaultParallelism
    if not isinstance(num_proc, int) or num_proc < 1:
        raise KoloSparkError("kolo.spark.run: num_proc must be a positive integer, got %r" % (num_proc,))
    start_timeout = start_timeout if start_timeout is not None else _default_start_timeout()
    host = os.environ.get("KOLO_SPARK_DRIVER_HOST") or sc.getConf().get("spark.driver.host", "127.0.0.1")
    job_id, token = _daemons.new_job()
    secret = secrets.token_hex(16)
    workdir = _daemons.make_dir("kolo-spark-driver-")
    coordinator, listener = None, None
    group = "kolo-spark-" + job_id
    try:
        coordinator = _daemons.start_coordinator(workdir, host, start_timeout)
        listener = _Listener(host, secret, num_proc)
        job = {"driver": listener.address, "secret": secret, "coordinator": coordinator.address,
               "job_id": job_id, "token": token, "start_timeout": start_timeout,
               "env": _job_env(env)}
        if verbose >= 2:
            print("kolo.spark: coordinator %s, %d ranks, job %s" % (coordinator.address, num_proc, job_id),
                  file=stderr or sys.stderr)
        return _run_stage(sc, group, listener, job, fn, tuple(args or ()), dict(kwargs or {}),
                          num_proc, start_timeout)
    finally:
        if listener is not None:
            listener.close()
        if coordinator is not None:
            coordinator.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def _job_env(env):
    out = {k: os.environ[k] for k in _PASSED_ON if k in os.environ}
    out.update(env or {})
    return out


def _run_stage(sc, group, listener, job, fn, args, kwargs, num_proc, start_timeout):
    from pyspark import InheritableThread
    outcome = {}

    def stage():
        sc.setJobGroup(group, "kolo.spark.run", interruptOnCancel=True)
        try:
            rdd = sc.parallelize(range(num_proc), num_proc).barrier()
            outcome["results"] = rdd.mapPartitions(lambda _: _task.run_task(job, fn, args, kwargs)).collect()
        except BaseException as e:  # noqa: BLE001 -- reported by the caller
            outcome["error"] = e

    t = InheritableThread(target=stage, daemon=True)
    t.start()
    deadline = time.monotonic() + start_timeout
    try:
        _wait(listener, t, outcome, deadline, num_proc, start_timeout)
    except BaseException:
        sc.cancelJobGroup(group)
        t.join(timeout=5)  # Spark kills the tasks (and so the agents) on its own; do not wait on it long
        raise
    t.join()
    if "error" in outcome:
        # A killed executor: Spark may notice before the rank's connection
        # drops; the rank's own report names it better, so wait for it briefly.
        with listener.cond:
            listener.cond.wait_for(lambda: listener.failure is not None, timeout=3)
            failure = listener.settled_failure()
        reason = _spark_reason(outcome["error"])
        if failure is not None:
            raise KoloSparkError("kolo.spark.run: %s failed: %s (Spark: %s)"
                                 % (failure[0], failure[1].strip(), reason)) from outcome["error"]
        raise KoloSparkError("kolo.spark.run: the Spark stage failed: %s" % reason) from outcome["error"]
    results = dict(outcome["results"])
    return [results[r] for r in range(num_proc)]


# libkolo's texts for an op that failed because another rank ended or was
# lost (kolo/errors.py, the agent's job failure texts).
_CONSEQUENCE = re.compile(r"rank \d+ of job \S+ has shut down|collectives that need it can no longer "
                          r"complete|lost node|has left the job")


def _is_consequence(text):
    return bool(_CONSEQUENCE.search(text or ""))


def _spark_reason(e):
    """The line of a Spark job failure that says why (Py4J's first line
    only names the call)."""
    lines = [l.strip() for l in str(e).splitlines() if l.strip()]
    for l in lines:
        if "Job aborted" in l or "Exception:" in l and "Py4J" not in l:
            return l[:600]
    return lines[0][:600] if lines else type(e).__name__


def _wait(listener, thread, outcome, deadline, num_proc, start_timeout):
    with listener.cond:
        while True:
            if listener.failure is not None:
                who, text = listener.settled_failure()
                raise KoloSparkError("kolo.spark.run: %s failed: %s" % (who, text.strip()))
            if not thread.is_alive():
                return
            if len(listener.running) < num_proc and time.monotonic() > deadline:
                raise KoloSparkError(
                    "kolo.spark.run: only %d of %d ranks started within start_timeout=%s s. Each rank is "
                    "one task of a Spark barrier stage, and a barrier stage needs num_proc free task "
                    "slots at once: lower num_proc, add executors or cores, or raise start_timeout if "
                    "executors are allocated on demand." % (len(listener.running), num_proc, start_timeout))
            listener.cond.wait(timeout=0.5)
