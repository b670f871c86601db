"""kolo.ray.ElasticRayExecutor on a real Ray cluster of raylets on this machine
(ray.cluster_utils.Cluster): a head with no CPU for workers and worker nodes
of 2 CPUs, one slot each (cpus_per_slot=2). Nodes are added to and removed
from the cluster while a kolo.torch.elastic job trains (docs/ray.md,
"Elastic"). Its own cluster: the nodes it removes must not be missed by
test_ray.py."""

import glob
import os
import re
import threading
import time

import pytest

from daemon_procs import wait_gone

# Ray on 127.0.0.1: read when ray is imported (tests/python/ray_cluster.py)
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
ray = pytest.importorskip("ray")
from ray_cluster import NODE_CPUS, add_node, pid_alive, ray_cluster, raylet_pid  # noqa: E402

import cluster_fns  # noqa: E402
from kolo.ray import ElasticRayExecutor, KoloRayError  # noqa: E402

MARKER = "kolo-ray-"


@pytest.fixture(scope="module")
def cluster(stack):
    with ray_cluster(2) as c:
        yield c


def settings(**kw):
    kw.setdefault("timeout_s", 60)
    kw.setdefault("elastic_timeout", 60)
    kw.setdefault("discovery_interval_s", 0.5)
    return ElasticRayExecutor.create_settings(**kw)


def _wait(what, cond, timeout):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("timed out after %s s waiting for %s" % (timeout, what))
        time.sleep(0.1)


def _sizes(d):
    """Every worker's reset sizes (resets.PID files), in order."""
    out = []
    for p in glob.glob(os.path.join(d, "resets.*")):
        with open(p) as f:
            out.append([int(x) for x in f.read().split()])
    return out


def _seen(d, size, after=None):
    """Some worker's reset callback saw `size` (after `after`)."""
    for s in _sizes(d):
        if size in (s[s.index(after) + 1:] if after is not None and after in s else []
                    if after is not None else s):
            return True
    return False


def _training_at(d, size):
    """`size` workers committed in a world of `size` (world.PID files; a
    dead worker's file keeps its last size)."""
    n = 0
    for p in glob.glob(os.path.join(d, "world.*")):
        try:
            with open(p) as f:
                n += f.read().strip() == str(size)
        except OSError:
            pass
    return n >= size


def _run_in_thread(ex, d):
    """ex.run(elastic_train) in a thread (Ray's Cluster adds and removes
    nodes from the main thread only); out["res"] or out["err"] once done."""
    out = {}

    def body():
        try:
            out["res"] = ex.run(cluster_fns.elastic_train, args=(d,))
        except BaseException as e:  # noqa: BLE001 -- reported by the test
            out["err"] = e

    t = threading.Thread(target=body, daemon=True)
    t.start()
    return t, out


def _drive(ex, d, steps, bound):
    """steps() in the main thread while the job runs; then the stop file
    ends the job (whatever steps() did); the run's outcome within bound s."""
    t, out = _run_in_thread(ex, d)
    t0 = time.monotonic()
    try:
        try:
            steps()
        finally:
            open(os.path.join(d, "stop"), "w").close()
        t.join(bound)
        assert not t.is_alive(), "run() did not return within %s s; events %s" % (bound, ex.events)
    finally:
        ex.shutdown()
        t.join(30)
    return out, time.monotonic() - t0


def test_nodes_added_and_removed_grow_and_shrink_the_job(cluster, tmp_path):
    c, nodes = cluster
    d = str(tmp_path)
    ex = ElasticRayExecutor(settings(min_np=1, max_np=3), cpus_per_slot=NODE_CPUS)
    ex.start()
    state = {}

    def steps():
        _wait("2 workers training", lambda: len(glob.glob(os.path.join(d, "started.*"))) >= 2, 120)
        state["added"] = add_node(c)  # grows 2 -> 3 at a commit
        _wait("the job at 3 workers", lambda: _training_at(d, 3), 120)
        victim = nodes[0]
        raylet = raylet_pid(victim)
        c.remove_node(victim)  # shrinks 3 -> 2
        _wait("the removed node's raylet to exit", lambda: not pid_alive(raylet), 30)
        _wait("the job at 2 workers after 3", lambda: _training_at(d, 2), 120)
        # a worker actor killed on a node that stays: 2 -> 1
        host = [h for h in ex.hosts if h.node_id == nodes[1].node_id][0]
        ray.kill(host.workers[0]["actor"], no_restart=True)
        _wait("the job at 1 worker", lambda: _training_at(d, 1), 120)

    out, took = _drive(ex, d, steps, 120)
    assert "err" not in out, "run() failed: %s; events %s" % (out.get("err"), ex.events)
    res = out["res"]
    assert took < 300
    # one worker left (on the added node), its weights exactly -step
    assert len(res) == 1 and res[0]["size"] == 1 and res[0]["rank"] == 0, res
    assert res[0]["w"] == [-float(res[0]["step"])] * 4, res
    # It joined at 3 (no callback: it had no world before); its callbacks saw
    # the sizes after each change (2 may be missed: a change during its first
    # sync is part of that sync), ending at 1. The others' saw 3, then 2.
    assert res[0]["resets"] in ([2, 1], [1]), res
    assert _seen(d, 3) and _seen(d, 2, after=3)
    text = "\n".join(ex.events)
    print("events (%.1f s):\n%s" % (took, text))
    assert "starting 2 worker(s) on 2 node(s)" in text, text
    assert "Ray node %s added: starting 1 worker(s) there (the job grows to 3)" \
        % state["added"].node_id[:12] in text, text
    # the removed node: seen gone by the driver, or first by its worker's end
    assert re.search(r"Ray node %s \(agent node00[01]\) (is gone from the Ray cluster|lost worker \d+ "
                     r"\(its actor died: .*\)): 1 worker\(s\) dropped \(the job shrinks to 2\)"
                     % nodes[0].node_id[:12], text), text
    assert "lost worker" in text and "(the job shrinks to 1)" in text, text
    assert wait_gone(MARKER, 20) == []


def test_below_min_np_fails_with_the_cause_within_the_elastic_timeout(cluster, tmp_path):
    d = str(tmp_path)
    ex = ElasticRayExecutor(settings(min_np=2, max_np=2, elastic_timeout=3), cpus_per_slot=NODE_CPUS)
    ex.start()
    killed = []

    def steps():
        _wait("2 workers training", lambda: len(glob.glob(os.path.join(d, "started.*"))) >= 2, 120)
        killed.append(time.monotonic())
        ray.kill(ex.hosts[0].workers[0]["actor"], no_restart=True)
        _wait("run() to fail", lambda: not t_alive(), 45)

    t, out = _run_in_thread(ex, d)
    t_alive = t.is_alive
    try:
        steps()
        t.join(5)
    finally:
        ex.shutdown()
        t.join(30)
    assert isinstance(out.get("err"), KoloRayError), (out, ex.events)
    assert time.monotonic() - killed[0] < 50
    e = out["err"]
    msg = str(e)
    print("error: %s" % msg)
    assert "\x1b[" not in msg, msg  # no terminal colours
    assert "below min_np 2" in msg, msg
    assert "1 rank left, below --min-np 2, for 3 s" in msg, msg
    assert wait_gone(MARKER, 20) == []


def test_too_few_slots_is_a_clear_error_within_the_start_timeout(cluster):
    ex = ElasticRayExecutor(settings(min_np=3, timeout_s=3), cpus_per_slot=NODE_CPUS)
    ex.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(KoloRayError) as e:
            ex.run(cluster_fns.elastic_train, args=("/nonexistent",))
        assert time.monotonic() - t0 < 15
    finally:
        ex.shutdown()
    msg = str(e.value)
    assert "has 2 slot(s) on 2 node(s) (cpus_per_slot=2), fewer than min_np 3, for timeout_s=3 s" \
        in msg, msg
    assert "Add nodes to the Ray cluster" in msg, msg
    assert wait_gone(MARKER, 10) == []


def test_bad_arguments():
    with pytest.raises(KoloRayError, match="max_np 1 is below min_np 2"):
        ElasticRayExecutor.create_settings(min_np=2, max_np=1)
    with pytest.raises(KoloRayError, match="min_np must be a positive integer"):
        ElasticRayExecutor.create_settings(min_np=0)
    with pytest.raises(KoloRayError, match="override_discovery=False"):
        ElasticRayExecutor(settings(), override_discovery=False)
    with pytest.raises(KoloRayError, match="not started"):
        ElasticRayExecutor(settings()).run(print)
    ex = ElasticRayExecutor(settings(), min_workers=2, max_workers=4)  # Horovod 0.28's names
    assert (ex.settings.min_np, ex.settings.max_np) == (2, 4)
