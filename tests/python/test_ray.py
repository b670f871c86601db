"""kolo.ray.RayExecutor on a real Ray cluster of three raylets on this
machine (ray.cluster_utils.Cluster): a head with no CPU for workers and two
worker nodes of 2 CPUs each, shared by the whole module."""

import os
import time

import pytest
import torch

import common_model as cm
from daemon_procs import wait_gone

# Ray on 127.0.0.1: read when ray is imported (tests/python/ray_cluster.py)
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
ray = pytest.importorskip("ray")
from ray_cluster import NODE_CPUS, ray_cluster  # noqa: E402

import cluster_fns  # noqa: E402
from kolo.ray import KoloRayError, RayExecutor  # noqa: E402

MARKER = "kolo-ray-"


@pytest.fixture(scope="module")
def cluster(stack):
    with ray_cluster(2) as c:
        yield c


def settings(**kw):
    kw.setdefault("timeout_s", 60)
    kw.setdefault("placement_group_timeout_s", 60)
    return RayExecutor.create_settings(**kw)


def check_training(results, n):
    want = (torch.arange(8, dtype=torch.float64) * (n * (n + 1) // 2)).tolist()
    ref = cm.reference({}, n).tolist()
    for r, res in enumerate(results):
        assert res["rank"] == r and res["size"] == n
        assert res["sum"] == want, "rank %d: allreduce %s != %s" % (r, res["sum"], want)
        assert res["gathered"] == list(range(n))
        assert res["params"] == results[0]["params"], "rank %d's parameters differ from rank 0's" % r
    assert torch.allclose(torch.tensor(results[0]["params"]), torch.tensor(ref), atol=1e-5)


def test_four_ranks_in_node_blocks_share_their_node_agent(cluster):
    ex = RayExecutor(settings(), num_hosts=2, num_workers_per_host=2)
    ex.start()
    try:
        assert len(set(ex.nodes)) == 2
        res = ex.run(cluster_fns.train_and_allreduce)
        check_training(res, 4)
        assert [(r["local_rank"], r["local_size"], r["cross_rank"], r["cross_size"]) for r in res] == \
            [(0, 2, 0, 2), (1, 2, 0, 2), (0, 2, 1, 2), (1, 2, 1, 2)]
        # local ranks share their node's agent; the two nodes have one each
        assert res[0]["socket"] == res[1]["socket"] != res[2]["socket"] == res[3]["socket"]
        # more calls on the same executor: execute() and run_remote()
        assert ex.execute(lambda _: int(os.environ["KOLO_LOCAL_RANK"])) == [0, 1, 0, 1]
        assert ray.get(ex.run_remote(lambda x: x * 2, args=(21,))) == [42] * 4
    finally:
        ex.shutdown()
    assert wait_gone(MARKER, 20) == []


def test_a_failing_rank_fails_run_with_its_error(cluster):
    ex = RayExecutor(settings(), num_hosts=2, num_workers_per_host=1)
    ex.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(KoloRayError) as e:
            ex.run(cluster_fns.fail_on, args=(1,))
        assert time.monotonic() - t0 < 60
        assert "failed on rank 1" in str(e.value) and "rank 1 says boom on purpose" in str(e.value)
        with pytest.raises(KoloRayError, match="failed earlier"):
            ex.run(cluster_fns.train_and_allreduce)
    finally:
        ex.shutdown()
    assert wait_gone(MARKER, 20) == []


def test_a_killed_worker_fails_run_naming_it(cluster):
    ex = RayExecutor(settings(), num_hosts=2, num_workers_per_host=1)
    ex.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(KoloRayError) as e:
            ex.run(cluster_fns.die_on, args=(0,))
        assert time.monotonic() - t0 < 60
        assert "failed on rank 0" in str(e.value) and "worker actor died" in str(e.value)
    finally:
        ex.shutdown()
    assert wait_gone(MARKER, 20) == []


def test_a_worker_actor_killed_from_outside_fails_run_naming_it(cluster, tmp_path):
    ex = RayExecutor(settings(), num_hosts=2, num_workers_per_host=1)
    ex.start()
    try:
        refs = ex.run_remote(cluster_fns.allreduce_until, args=(str(tmp_path), 120))
        deadline = time.monotonic() + 60
        while len(os.listdir(tmp_path)) < 2:
            assert time.monotonic() < deadline, "the ranks did not start"
            time.sleep(0.1)
        t0 = time.monotonic()
        ray.kill(ex.workers[1], no_restart=True)
        with pytest.raises(KoloRayError) as e:
            ex._collect(refs, "run")
        assert time.monotonic() - t0 < 30
        # rank 0's allreduce fails too, but the cause named is rank 1's death
        assert "run failed on rank 1" in str(e.value) and "its worker actor died" in str(e.value)
    finally:
        ex.shutdown()
    assert wait_gone(MARKER, 20) == []


def test_too_few_resources_is_a_clear_error_within_the_timeout(cluster):
    ex = RayExecutor(settings(placement_group_timeout_s=4), num_hosts=3, num_workers_per_host=1)
    t0 = time.monotonic()
    with pytest.raises(KoloRayError) as e:
        ex.start()
    assert time.monotonic() - t0 < 30
    assert "could not place 3 workers" in str(e.value) and "STRICT_SPREAD" in str(e.value)
    assert "add nodes" in str(e.value)
    assert wait_gone(MARKER, 10) == []
    # the placement group was removed: a fitting executor still starts (num_workers,
    # PACK; cpus_per_worker=NODE_CPUS puts one worker on each node)
    ex = RayExecutor(settings(), num_workers=2, cpus_per_worker=NODE_CPUS)
    ex.start()
    try:
        assert len(set(ex.nodes)) == 2
        res = ex.run(cluster_fns.train_and_allreduce)
        check_training(res, 2)
        assert [(r["local_size"], r["cross_size"]) for r in res] == [(1, 2), (1, 2)]
    finally:
        ex.shutdown()
    assert wait_gone(MARKER, 20) == []


def test_bad_arguments():
    with pytest.raises(KoloRayError, match="either num_workers, or num_hosts"):
        RayExecutor(settings(), num_workers=2, num_hosts=2)
    with pytest.raises(KoloRayError, match="num_workers must be a positive integer"):
        RayExecutor(settings(), num_workers=0)
    with pytest.raises(KoloRayError, match="not started"):
        RayExecutor(settings(), num_workers=1).run(print)
    with pytest.raises(KoloRayError, match="elastic options belong to ElasticRayExecutor"):
        RayExecutor(settings(), num_workers=2, min_workers=1)
