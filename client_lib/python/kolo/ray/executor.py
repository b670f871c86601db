"""kolo.ray.RayExecutor: Horovod's horovod.ray.RayExecutor on kolo.

    settings = RayExecutor.create_settings(timeout_s=30)
    ex = RayExecutor(settings, num_workers=4)          # or num_hosts=2, num_workers_per_host=2
    ex.start()
    results = ex.run(train_fn, args=(...,))            # one result per rank, in rank order
    ex.shutdown()

What runs where (docs/ray.md): the driver starts a private kolo-coordinator;
the workers are Ray actors in one placement group; each Ray node that holds
workers gets one kolo-agent, started by a zero-CPU actor pinned to that
node; ranks fill the nodes in contiguous blocks, so a node's local ranks
share its agent's shared memory.
"""

import os
import re
import shutil
import time

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import (NodeAffinitySchedulingStrategy,
                                            PlacementGroupSchedulingStrategy)

from .. import _daemons
from ..errors import KoloError
from ._actors import NodeAgent, Worker

# Variables the driver passes on to the actors so that they find the same
# kolo build (libkolo, kolo-agent) and tuning.
_PASSED_ON = ("KOLO_LIBRARY", "KOLO_BUILD_DIR", "KOLO_AGENT_BIN", "KOLO_OP_TIMEOUT",
              "KOLO_LOG_LEVEL", "KOLO_BACKEND", "KOLO_FUSION_THRESHOLD_MB", "KOLO_CYCLE_TIME_MS")


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def error_text(e):
    """A Ray error's text without the terminal colours Ray puts in it."""
    return _ANSI.sub("", str(e)).strip()


class KoloRayError(KoloError):
    """A RayExecutor that cannot start, or a job that failed on a rank."""


class RaySettings:
    """Horovod's horovod.ray settings (create_settings). ssh options do not
    apply to kolo (no ssh: every process is a Ray actor)."""

    def __init__(self, timeout_s=30, placement_group_timeout_s=100, coordinator_host=None,
                 log_level=None):
        self.timeout_s = timeout_s
        self.placement_group_timeout_s = placement_group_timeout_s
        self.coordinator_host = coordinator_host
        self.log_level = log_level


class RayExecutor:
    @classmethod
    def create_settings(cls, timeout_s=30, ssh_identity_file=None, ssh_str=None,
                        placement_group_timeout_s=100, nics=None, coordinator_host=None,
                        log_level=None):
        del ssh_identity_file, ssh_str, nics  # Horovod's; kolo starts nothing over ssh
        return RaySettings(timeout_s, placement_group_timeout_s, coordinator_host, log_level)

    def __init__(self, settings=None, num_workers=None, num_hosts=None, num_workers_per_host=1,
                 cpus_per_worker=1, use_gpu=False, gpus_per_worker=None,
                 use_current_placement_group=True, **unsupported):
        if unsupported:
            raise KoloRayError("RayExecutor: unsupported arguments %s (elastic options belong to "
                               "ElasticRayExecutor)" % ", ".join(sorted(unsupported)))
        if (num_workers is None) == (num_hosts is None):
            raise KoloRayError("RayExecutor: give either num_workers, or num_hosts and "
                               "num_workers_per_host (not both, not neither)")
        for name, v in (("num_workers", num_workers), ("num_hosts", num_hosts),
                        ("num_workers_per_host", num_workers_per_host)):
            if v is not None and (not isinstance(v, int) or v < 1):
                raise KoloRayError("RayExecutor: %s must be a positive integer, got %r" % (name, v))
        if cpus_per_worker is None or cpus_per_worker < 0:
            raise KoloRayError("RayExecutor: cpus_per_worker must be >= 0, got %r" % (cpus_per_worker,))
        if gpus_per_worker is not None and not use_gpu:
            raise KoloRayError("RayExecutor: gpus_per_worker is given but use_gpu is False")
        self.settings = settings or RaySettings()
        self.num_workers, self.num_hosts = num_workers, num_hosts
        self.num_workers_per_host = num_workers_per_host
        self.cpus_per_worker = cpus_per_worker
        self.gpus_per_worker = (gpus_per_worker or 1) if use_gpu else 0
        self.use_gpu = use_gpu
        del use_current_placement_group  # a placement group of its own, always
        self._reset()

    def _reset(self):
        self.workers, self.layout, self.nodes = [], [], []
        self._agents, self._pg, self._coordinator, self._dir = {}, None, None, None
        self._failed = None

    @property
    def size(self):
        return self.num_workers if self.num_workers is not None else (
            self.num_hosts * self.num_workers_per_host)

    # ----- start -----
    def start(self, executable_cls=None, executable_args=None, executable_kwargs=None,
              extra_env_vars=None):
        """Places the workers, starts the coordinator and one agent per node,
        gives every worker its rank variables. Fails with KoloRayError
        (and leaves nothing behind) when Ray cannot place them in time."""
        if self.workers:
            raise KoloRayError("RayExecutor.start: already started; shutdown() first")
        if not ray.is_initialized():
            raise KoloRayError("RayExecutor.start: Ray is not initialized; call ray.init(address=...) first")
        try:
            self._place_workers()
            self._start_daemons()
            self._configure_workers(dict(extra_env_vars or {}))
            if executable_cls is not None:
                self._get_all([w.start_executable.remote(executable_cls, executable_args,
                                                         executable_kwargs) for w in self.workers],
                              "start_executable")
        except BaseException:
            self.shutdown()
            raise

    def _bundles(self):
        one = {"CPU": self.cpus_per_worker}
        if self.use_gpu:
            one["GPU"] = self.gpus_per_worker
        if self.num_hosts is None:
            return [dict(one) for _ in range(self.num_workers)], "PACK"
        per_host = {k: v * self.num_workers_per_host for k, v in one.items()}
        return [dict(per_host) for _ in range(self.num_hosts)], "STRICT_SPREAD"

    def _place_workers(self):
        bundles, strategy = self._bundles()
        self._pg = placement_group(bundles, strategy=strategy)
        t = self.settings.placement_group_timeout_s
        ready, _ = ray.wait([self._pg.ready()], timeout=t)
        if not ready:
            raise KoloRayError(
                "RayExecutor.start: Ray could not place %d workers (%d bundles %s, strategy %s) within "
                "placement_group_timeout_s=%s s; the cluster has %s available of %s. Lower num_workers, "
                "num_hosts or cpus_per_worker/gpus_per_worker, or add nodes to the Ray cluster."
                % (self.size, len(bundles), bundles[0], strategy, t, ray.available_resources(),
                   ray.cluster_resources()))
        actor = ray.remote(Worker)
        for i in range(self.size):
            bundle = i if self.num_hosts is None else i // self.num_workers_per_host
            self.workers.append(actor.options(
                num_cpus=self.cpus_per_worker, num_gpus=self.gpus_per_worker, max_restarts=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self._pg, placement_group_bundle_index=bundle)).remote())
        where = self._get_all([w.where.remote() for w in self.workers], "where")
        rank_of, layout = _daemons.node_blocks([w["node_id"] for w in where])
        order = sorted(range(self.size), key=lambda i: rank_of[i])
        self.workers = [self.workers[i] for i in order]
        self.layout = [layout[i] for i in order]
        self.where = [where[i] for i in order]
        self.nodes = []
        for w in self.where:
            if w["node_id"] not in self.nodes:
                self.nodes.append(w["node_id"])

    def _passed_on_env(self):
        return {k: os.environ[k] for k in _PASSED_ON if k in os.environ}

    def _start_daemons(self):
        s = self.settings
        host = s.coordinator_host or os.environ.get("KOLO_RAY_COORDINATOR_HOST") or \
            ray.util.get_node_ip_address()
        self._dir = _daemons.make_dir("kolo-ray-driver-")
        self._coordinator = _daemons.start_coordinator(self._dir, host, s.timeout_s, s.log_level)
        addr = self._coordinator.address
        actor = ray.remote(NodeAgent)
        for i, node in enumerate(self.nodes):
            self._agents[node] = {"actor": actor.options(
                num_cpus=0, max_restarts=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(
                    self._passed_on_env())}
        infos = self._get_all([self._agents[n]["actor"].start.remote(
            _daemons.agent_id(i, len(self.nodes)), addr, s.timeout_s, s.log_level)
            for i, n in enumerate(self.nodes)], "kolo-agent start",
            timeout=s.timeout_s + 30)
        for n, info in zip(self.nodes, infos):
            self._agents[n].update(info)

    def _configure_workers(self, extra):
        job_id, token = _daemons.new_job()
        refs = []
        for w, lay, where in zip(self.workers, self.layout, self.where):
            a = self._agents[where["node_id"]]
            env = self._passed_on_env()
            env.update(extra)
            env.update(_daemons.rank_environment(lay, self.size, a["socket"], a["rpc"],
                                                 self._coordinator.address, job_id, token,
                                                 self.settings.timeout_s, a["token_file"]))
            env.setdefault("MASTER_ADDR", self.where[0]["ip"])
            env.setdefault("MASTER_PORT", str(29500 + int(job_id[-3:], 16) % 1000))
            refs.append(w.set_env.remote(env))
        self._get_all(refs, "set_env")

    # ----- running -----
    def _get_all(self, refs, what, timeout=None):
        """ray.get of one ref per worker (or agent), in order; the first
        failure ends the wait and names its rank and cause."""
        timeout = timeout if timeout is not None else self.settings.timeout_s + 60
        results = self._wait_all(refs, what, deadline=time.monotonic() + timeout)
        return results

    def _wait_all(self, refs, what, deadline=None):
        index = {r: i for i, r in enumerate(refs)}
        results, pending = [None] * len(refs), list(refs)
        while pending:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise KoloRayError("RayExecutor: %s did not finish in time on ranks %s"
                                   % (what, sorted(index[r] for r in pending)))
            done, pending = ray.wait(pending, num_returns=1, timeout=min(left or 1.0, 1.0))
            for r in done:
                try:
                    results[index[r]] = ray.get(r)
                except Exception as e:  # noqa: BLE001 -- named and re-raised
                    i, e = self._root_cause(index, pending, index[r], e)
                    raise self._rank_error(i, what, e) from e
        return results

    def _root_cause(self, index, pending, i, e):
        """A rank that raised because a peer died is not the cause: when a
        worker actor died too (within 2 s), that rank and its death are."""
        if isinstance(e, ray.exceptions.RayActorError) or not pending:
            return i, e
        done, _ = ray.wait(pending, num_returns=len(pending), timeout=2.0)
        for r in done:
            try:
                ray.get(r)
            except ray.exceptions.RayActorError as died:
                return index[r], died
            except Exception:  # noqa: BLE001 -- another rank's error: not the cause
                pass
        return i, e

    def _rank_error(self, i, what, e):
        kind = "its worker actor died" if isinstance(e, ray.exceptions.RayActorError) else "it raised"
        where = self.where[i]["node_id"][:12] if getattr(self, "where", None) and i < len(self.where) else "?"
        cause = error_text(e)
        err = KoloRayError("RayExecutor: %s failed on rank %d (Ray node %s): %s: %s"
                           % (what, i, where, kind, cause))
        err.rank, err.cause = i, e
        return err

    def _check_ready(self):
        if not self.workers:
            raise KoloRayError("RayExecutor: not started; call start() first")
        if self._failed is not None:
            raise KoloRayError("RayExecutor: the job failed earlier (%s); shutdown() and start() again"
                               % self._failed)

    def run_remote(self, fn, args=None, kwargs=None):
        """fn(*args, **kwargs) on every rank; the ObjectRefs, in rank order."""
        self._check_ready()
        return [w.run.remote(fn, args, kwargs) for w in self.workers]

    def _collect(self, refs, what):
        try:
            return self._wait_all(refs, what)
        except KoloRayError as e:
            # The other ranks may be blocked in a collective with the failed
            # one: end them, so that nothing hangs and the error is final.
            self._failed = str(e).splitlines()[0]
            for w in self.workers:
                ray.kill(w, no_restart=True)
            raise

    def run(self, fn, args=None, kwargs=None, callbacks=None):
        """fn(*args, **kwargs) on every rank; the results in rank order. A
        rank that raises or dies fails the call with its rank and error."""
        if callbacks:
            raise KoloRayError("RayExecutor.run: callbacks are not supported by kolo.ray (docs/ray.md)")
        return self._collect(self.run_remote(fn, args, kwargs), "run")

    def execute(self, fn, callbacks=None):
        """fn(executable) on every rank (executable: the executable_cls
        instance of start(), or None); the results in rank order."""
        if callbacks:
            raise KoloRayError("RayExecutor.execute: callbacks are not supported by kolo.ray")
        self._check_ready()
        return self._collect([w.execute.remote(fn) for w in self.workers], "execute")

    def execute_single(self, fn):
        """fn(executable) on rank 0 alone."""
        self._check_ready()
        return self._collect([self.workers[0].execute.remote(fn)], "execute_single")[0]

    # ----- shutdown -----
    def shutdown(self):
        """Ends the workers, the agents and the coordinator; removes the
        placement group. Safe to call more than once."""
        if self.workers and self._failed is None:
            try:
                ray.wait([w.shutdown_kolo.remote() for w in self.workers], num_returns=len(self.workers),
                         timeout=10)
            except Exception:  # noqa: BLE001
                pass
        for w in self.workers:
            ray.kill(w, no_restart=True)
        stops = [a["actor"].stop.remote() for a in self._agents.values()]
        if stops:
            ray.wait(stops, num_returns=len(stops), timeout=_daemons.STOP_GRACE_S * 2 + 5)
        for a in self._agents.values():
            ray.kill(a["actor"], no_restart=True)
        if self._coordinator is not None:
            self._coordinator.stop()
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)
        if self._pg is not None:
            remove_placement_group(self._pg)
        self._reset()
