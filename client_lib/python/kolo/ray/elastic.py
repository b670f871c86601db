"""kolo.ray.ElasticRayExecutor: Horovod's horovod.ray.ElasticRayExecutor on kolo.

    settings = ElasticRayExecutor.create_settings(min_np=2, max_np=4, elastic_timeout=60)
    ex = ElasticRayExecutor(settings, cpus_per_slot=1)
    ex.start()
    results = ex.run(train_fn)       # train_fn uses kolo.torch.elastic (hvd.elastic.run, State)
    ex.shutdown()

What runs where (docs/ray.md, "Elastic"): the driver runs a private
kolo-coordinator with kolorun's elastic lease (2 s), and a discovery loop
over the Ray cluster's alive nodes (every discovery_interval_s): each node
has floor(CPU / cpus_per_slot) slots (and GPU / gpus_per_slot with
use_gpu). A node that appears, while the job is below max_np, gets a
kolo-agent and workers (Ray actors pinned to it); they join the job at its
next commit. A node that goes away (or whose worker actor dies) is dropped:
its workers and agent are ended, the coordinator seals the next generation
without it and kolo.torch.elastic restores the last commit on the others.
"""

import logging
import os
import shutil
import time

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from .. import _daemons
from ._actors import NodeAgent, Worker
from .executor import _PASSED_ON, KoloRayError, error_text

_LOG = logging.getLogger("kolo.ray")
# kolorun's elastic mode (cli/elastic_runner.cc): a lost agent is seen within 2 s.
_COORDINATOR_ARGS = ("--lease-ms", "2000", "--heartbeat-interval-ms", "400")
# An elastic rank's numbers change between generations: no torchrun variables.
_TORCHRUN = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
             "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class ElasticRaySettings:
    """Horovod's elastic settings (create_settings): min_np/max_np are the
    bounds of the job's size, elastic_timeout how long it may stay below
    min_np, timeout_s the start timeout (slots for min_np, a daemon, a
    worker), reset_limit the most membership changes (None: no limit)."""

    def __init__(self, min_np=1, max_np=None, reset_limit=None, elastic_timeout=600, timeout_s=30,
                 coordinator_host=None, log_level=None, discovery_interval_s=1.0):
        for name, v in (("min_np", min_np), ("max_np", max_np)):
            if v is not None and (not isinstance(v, int) or v < 1):
                raise KoloRayError("ElasticRayExecutor: %s must be a positive integer, got %r" % (name, v))
        if max_np is not None and max_np < min_np:
            raise KoloRayError("ElasticRayExecutor: max_np %d is below min_np %d" % (max_np, min_np))
        if not elastic_timeout or elastic_timeout <= 0 or not timeout_s or timeout_s <= 0:
            raise KoloRayError("ElasticRayExecutor: elastic_timeout and timeout_s must be > 0")
        self.min_np, self.max_np, self.reset_limit = min_np, max_np, reset_limit
        self.elastic_timeout, self.timeout_s = elastic_timeout, timeout_s
        self.coordinator_host, self.log_level = coordinator_host, log_level
        self.discovery_interval_s = discovery_interval_s


def _call(fn, args, kwargs):
    """What a worker runs: fn, then the rank and size it ended with."""
    result = fn(*(args or ()), **(kwargs or {}))
    rank = size = None
    try:
        import kolo
        if kolo.is_initialized():
            rank, size = kolo.rank(), kolo.size()
    except Exception:  # noqa: BLE001 -- only the order of the results needs it
        pass
    return {"result": result, "rank": rank, "size": size}


class _Host:
    """One Ray node of the job: its agent actor and its workers."""

    def __init__(self, node_id, agent_id):
        self.node_id, self.agent_id = node_id, agent_id
        self.agent, self.info, self.workers = None, None, []

    def label(self):
        return "Ray node %s (agent %s)" % (self.node_id[:12], self.agent_id)


class ElasticRayExecutor:
    @staticmethod
    def create_settings(min_np=1, max_np=None, reset_limit=None, elastic_timeout=600, timeout_s=30,
                        ssh_identity_file=None, nics=None, min_num_proc=None, max_num_proc=None,
                        coordinator_host=None, log_level=None, discovery_interval_s=1.0, **ignored):
        del ssh_identity_file, nics, ignored  # Horovod's (verbose, ...); kolo starts nothing over ssh
        return ElasticRaySettings(min_num_proc or min_np, max_num_proc or max_np, reset_limit,
                                  elastic_timeout, timeout_s, coordinator_host, log_level,
                                  discovery_interval_s)

    def __init__(self, settings=None, use_gpu=False, cpus_per_slot=1, gpus_per_slot=None,
                 env_vars=None, override_discovery=True, min_workers=None, max_workers=None,
                 cpus_per_worker=None, gpus_per_worker=None):
        if not override_discovery:
            raise KoloRayError("ElasticRayExecutor: override_discovery=False (a host discovery "
                               "script) is not supported; the hosts are the Ray cluster's nodes")
        self.settings = settings or ElasticRaySettings()
        if min_workers is not None or max_workers is not None:  # Horovod 0.28's names
            self.settings = ElasticRaySettings(
                min_workers or self.settings.min_np, max_workers or self.settings.max_np,
                self.settings.reset_limit, self.settings.elastic_timeout, self.settings.timeout_s,
                self.settings.coordinator_host, self.settings.log_level,
                self.settings.discovery_interval_s)
        self.cpus_per_slot = cpus_per_worker if cpus_per_worker is not None else cpus_per_slot
        if self.cpus_per_slot is None or self.cpus_per_slot < 0:
            raise KoloRayError("ElasticRayExecutor: cpus_per_slot must be >= 0, got %r" % (self.cpus_per_slot,))
        self.use_gpu = use_gpu
        self.gpus_per_slot = (gpus_per_worker or gpus_per_slot or 1) if use_gpu else 0
        if not use_gpu and (gpus_per_slot or gpus_per_worker):
            raise KoloRayError("ElasticRayExecutor: gpus_per_slot is given but use_gpu is False")
        if self.cpus_per_slot == 0 and not use_gpu:
            raise KoloRayError("ElasticRayExecutor: cpus_per_slot=0 without GPUs gives no slots")
        self.env_vars = dict(env_vars or {})
        self.events = []  # what the job went through, in order (also logged to "kolo.ray")
        self._coordinator, self._dir = None, None
        self._reset_run()

    def _reset_run(self):
        self.hosts, self._blacklist, self._next_worker, self._next_agent = [], set(), 0, 0
        self._changes, self._below_since, self._finishing = 0, None, None

    def _say(self, msg):
        self.events.append(msg)
        _LOG.warning("ElasticRayExecutor: %s", msg)

    # ----- start / shutdown -----
    def start(self):
        """Starts the private coordinator (the workers start in run())."""
        if self._coordinator is not None:
            raise KoloRayError("ElasticRayExecutor.start: already started; shutdown() first")
        if not ray.is_initialized():
            raise KoloRayError("ElasticRayExecutor.start: Ray is not initialized; call "
                               "ray.init(address=...) first")
        s = self.settings
        host = s.coordinator_host or os.environ.get("KOLO_RAY_COORDINATOR_HOST") or \
            ray.util.get_node_ip_address()
        self._dir = _daemons.make_dir("kolo-ray-driver-")
        try:
            self._coordinator = _daemons.start_coordinator(self._dir, host, s.timeout_s, s.log_level,
                                                           _COORDINATOR_ARGS)
        except BaseException:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
            raise

    def shutdown(self):
        """Ends every worker and agent, and the coordinator. Safe twice."""
        self._drop_all()
        if self._coordinator is not None:
            self._coordinator.stop()
            self._coordinator = None
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    # ----- discovery -----
    def _slots(self, resources):
        n = []
        if self.cpus_per_slot > 0:
            n.append(int(resources.get("CPU", 0) // self.cpus_per_slot))
        if self.use_gpu:
            n.append(int(resources.get("GPU", 0) // self.gpus_per_slot))
        return min(n) if n else 0

    def _discover(self):
        """[(node_id, slots)] of the alive nodes with slots, not blacklisted."""
        found = []
        for n in ray.nodes():
            if n.get("Alive") and n["NodeID"] not in self._blacklist:
                slots = self._slots(n.get("Resources", {}))
                if slots > 0:
                    found.append((n["NodeID"], slots))
        return found

    def _alive_nodes(self):
        return {n["NodeID"] for n in ray.nodes() if n.get("Alive")}

    def _wait_for_slots(self):
        s = self.settings
        deadline = time.monotonic() + s.timeout_s
        while True:
            found = self._discover()
            total = sum(k for _, k in found)
            if total >= s.min_np:
                return found
            if time.monotonic() > deadline:
                raise KoloRayError(
                    "ElasticRayExecutor.run: the Ray cluster has %d slot(s) on %d node(s) "
                    "(cpus_per_slot=%s%s), fewer than min_np %d, for timeout_s=%s s; the cluster has "
                    "%s. Add nodes to the Ray cluster, or lower min_np or cpus_per_slot."
                    % (total, len(found), self.cpus_per_slot,
                       ", gpus_per_slot=%s" % self.gpus_per_slot if self.use_gpu else "",
                       s.min_np, s.timeout_s, ray.cluster_resources()))
            time.sleep(0.2)

    def _placed(self):
        return sum(len(h.workers) for h in self.hosts)

    # ----- hosts -----
    def _passed_on_env(self):
        return {k: os.environ[k] for k in _PASSED_ON if k in os.environ}

    def _new_host(self, node_id):
        h = _Host(node_id, "node%03d" % self._next_agent)
        self._next_agent += 1
        h.agent = ray.remote(NodeAgent).options(
            num_cpus=0, max_restarts=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote(
                self._passed_on_env())
        return h

    def _start_agents(self, hosts):
        s = self.settings
        refs = [h.agent.start.remote(h.agent_id, self._coordinator.address, s.timeout_s, s.log_level)
                for h in hosts]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=s.timeout_s + 30)
        for h, r in zip(hosts, refs):
            if r not in ready:
                raise KoloRayError("ElasticRayExecutor: the kolo-agent on %s did not start within "
                                   "timeout_s=%s s" % (h.label(), s.timeout_s))
            h.info = ray.get(r)

    def _worker_env(self, h, local_rank, wid, world):
        s = self.settings
        lay = dict(rank=wid, local_rank=local_rank, local_size=len(h.workers), cross_rank=0,
                   cross_size=1, node_index=0, num_nodes=1)
        env = self._passed_on_env()
        env.update(self.env_vars)
        env.update(_daemons.rank_environment(lay, world, h.info["socket"], h.info["rpc"],
                                             self._coordinator.address, self._job[0], self._job[1],
                                             s.timeout_s, h.info["token_file"]))
        for k in _TORCHRUN:
            env.pop(k, None)
        env.update({"KOLO_MIN_NP": str(s.min_np), "KOLO_MAX_NP": str(s.max_np or 0),
                    "KOLO_ELASTIC_TIMEOUT": str(int(s.elastic_timeout))})
        return env

    def _start_workers(self, h, count, world, fn):
        """count workers on h (its agent started), each running fn."""
        actor = ray.remote(Worker)
        for _ in range(count):
            w = {"id": self._next_worker, "host": h}
            self._next_worker += 1
            w["actor"] = actor.options(
                num_cpus=self.cpus_per_slot, num_gpus=self.gpus_per_slot, max_restarts=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(h.node_id, soft=False)).remote()
            h.workers.append(w)
        refs = [w["actor"].set_env.remote(self._worker_env(h, i, w["id"], world))
                for i, w in enumerate(h.workers)]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=self.settings.timeout_s)
        if len(ready) < len(refs):
            raise KoloRayError("ElasticRayExecutor: %d worker(s) on %s did not start within "
                               "timeout_s=%s s (resources taken?)" % (count, h.label(),
                                                                     self.settings.timeout_s))
        ray.get(refs)
        for w in h.workers:
            w["ref"] = w["actor"].run.remote(_call, fn, None)

    def _add_hosts(self, picks, world, fn):
        """Starts [(node_id, count)]: agents first, then the workers."""
        hosts = [self._new_host(n) for n, _ in picks]
        self.hosts.extend(hosts)
        self._start_agents(hosts)
        for h, (_, count) in zip(hosts, picks):
            self._start_workers(h, count, world, fn)

    def _drop_host(self, h, why):
        """Ends h's workers and agent; the node is not used again."""
        if h not in self.hosts:
            return
        self.hosts.remove(h)
        self._blacklist.add(h.node_id)
        for w in h.workers:
            ray.kill(w["actor"], no_restart=True)
        try:
            ray.wait([h.agent.stop.remote()], timeout=_daemons.STOP_GRACE_S * 2 + 2)
        except Exception:  # noqa: BLE001 -- the node may be gone with its actor
            pass
        ray.kill(h.agent, no_restart=True)
        if why:
            self._changes += 1
            self._say("%s %s: %d worker(s) dropped (the job shrinks to %d)"
                      % (h.label(), why, len(h.workers), self._placed()))

    def _drop_all(self):
        for h in list(self.hosts):
            self._drop_host(h, None)
        self.hosts = []

    # ----- run -----
    def run(self, worker_fn, callbacks=None, args=None, kwargs=None):
        """worker_fn(*args, **kwargs) on every slot of the job (between
        min_np and max_np) until the workers return; the results of the
        workers of the final generation, in their final rank order. The
        function uses kolo.torch.elastic (hvd.elastic.run, State.commit)."""
        if callbacks:
            raise KoloRayError("ElasticRayExecutor.run: callbacks are not supported by kolo.ray")
        if self._coordinator is None:
            raise KoloRayError("ElasticRayExecutor: not started; call start() first")
        self._reset_run()
        self._job = _daemons.new_job()
        fn = (worker_fn, args, kwargs)
        try:
            picks, left = [], self.settings.max_np or float("inf")
            for node, slots in self._wait_for_slots():
                take = int(min(slots, left))
                if take > 0:
                    picks.append((node, take))
                    left -= take
            world = sum(k for _, k in picks)
            self._say("starting %d worker(s) on %d node(s)" % (world, len(picks)))
            self._add_hosts(picks, world, fn)
            return self._supervise(fn)
        finally:
            self._drop_all()

    def _worker_of(self, ref):
        for h in self.hosts:
            for w in h.workers:
                if w.get("ref") == ref:
                    return w
        return None

    def _supervise(self, fn):
        s = self.settings
        results = {}
        while True:
            pending = [w["ref"] for h in self.hosts for w in h.workers if w["id"] not in results]
            if not pending:
                break
            done, _ = ray.wait(pending, num_returns=1, timeout=s.discovery_interval_s)
            for ref in done:
                w = self._worker_of(ref)
                if w is None or w["host"] not in self.hosts:
                    continue
                try:
                    results[w["id"]] = ray.get(ref)
                    self._finishing = self._finishing or time.monotonic()
                except ray.exceptions.RayActorError as e:
                    gone = w["host"].node_id not in self._alive_nodes()
                    self._drop_host(w["host"], "is gone from the Ray cluster" if gone else
                                    "lost worker %d (its actor died: %s)"
                                    % (w["id"], (error_text(e).splitlines() or ["?"])[0]))
                except Exception as e:  # noqa: BLE001 -- named and re-raised
                    raise self._worker_error(w, e) from e
            self._follow_cluster(fn)
            self._drop_late(results)
        ranked = sorted(results.values(), key=lambda r: (r["rank"] is None, r["rank"] or 0))
        return [r["result"] for r in ranked]

    def _drop_late(self, results):
        """Once a worker returned, the job is finishing: a worker that has not
        returned timeout_s later (one that was still waiting to join when the
        others ended) is dropped, its node with it."""
        if not self._finishing or time.monotonic() - self._finishing < self.settings.timeout_s:
            return
        for h in list(self.hosts):
            if any(w["id"] not in results for w in h.workers):
                self._drop_host(h, "did not return within timeout_s=%s s of the first worker that did"
                                % self.settings.timeout_s)

    def _follow_cluster(self, fn):
        """Drops the hosts whose node is gone, adds workers on new nodes,
        and bounds the time below min_np and the number of changes."""
        s = self.settings
        alive = self._alive_nodes()
        for h in list(self.hosts):
            if h.node_id not in alive:
                self._drop_host(h, "is gone from the Ray cluster")
        if not self._finishing:
            self._grow(fn)
        if s.reset_limit is not None and self._changes > s.reset_limit:
            raise KoloRayError("ElasticRayExecutor: the job changed %d times, more than "
                               "reset_limit %d" % (self._changes, s.reset_limit))
        placed = self._placed()
        if placed >= s.min_np:
            self._below_since = None
            return
        if self._below_since is None:
            self._below_since = time.monotonic()
            self._say("the job has %d worker(s), below min_np %d: waiting up to elastic_timeout=%s s "
                      "for nodes" % (placed, s.min_np, s.elastic_timeout))
        if placed == 0 or time.monotonic() - self._below_since > s.elastic_timeout + 30:
            raise KoloRayError("ElasticRayExecutor: the job has %d worker(s), below min_np %d, and no "
                               "node came within elastic_timeout=%s s" % (placed, s.min_np,
                                                                          s.elastic_timeout))

    def _grow(self, fn):
        s = self.settings
        for node, slots in self._discover():
            placed = self._placed()
            if any(h.node_id == node for h in self.hosts):
                continue
            take = min(slots, (s.max_np or placed + slots) - placed)
            if take <= 0:
                return
            self._changes += 1
            self._say("Ray node %s added: starting %d worker(s) there (the job grows to %d)"
                      % (node[:12], take, placed + take))
            try:
                self._add_hosts([(node, take)], placed + take, fn)
            except (KoloRayError, ray.exceptions.RayError) as e:  # e.g. the node went away meanwhile
                h = [x for x in self.hosts if x.node_id == node]
                if h:
                    self._drop_host(h[0], "could not start (%s)" % (error_text(e).splitlines() or ["?"])[0])

    def _worker_error(self, w, e):
        s = self.settings
        below = ""
        if self._below_since is not None:
            below = (" (the job had %d worker(s), below min_np %d, for %.0f s)"
                     % (self._placed(), s.min_np, time.monotonic() - self._below_since))
        err = KoloRayError("ElasticRayExecutor: run failed on worker %d (%s)%s: it raised: %s"
                           % (w["id"], w["host"].label(), below, error_text(e)))
        err.worker, err.cause = w["id"], e
        return err
