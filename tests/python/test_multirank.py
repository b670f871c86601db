"""Multi-rank tests through kolorun with the real coordinator and agent."""

import os

import pytest
import torch

import common_model as cm
from conftest import WORKERS


def assert_ok(res, n):
    assert res.rc == 0, res.describe()
    for r in range(n):
        assert any(l.startswith("WORKER-OK rank %d" % r) for l in res.rank_lines(r)), res.describe()


# (ranks, agents): several agents act as several nodes (cross-agent path).
@pytest.mark.parametrize("np_,agents", [(2, 1), (3, 2)])
def test_every_api_function(kolorun, np_, agents):
    res = kolorun(np_, os.path.join(WORKERS, "api_worker.py"), timeout=150, agents=agents)
    assert_ok(res, np_)


@pytest.mark.parametrize("np_,agents", [(1, 1), (2, 1), (4, 1), (4, 2)])
def test_training_is_identical_on_all_ranks_and_matches_one_process(kolorun, tmp_path, np_,
                                                                     agents):
    names = list(cm.CONFIGS) if np_ > 1 else ["plain", "bucket"]
    res = kolorun(np_, os.path.join(WORKERS, "train_worker.py"), str(tmp_path), *names,
                  timeout=150, agents=agents)
    assert_ok(res, np_)
    for name in names:
        cfg = cm.CONFIGS[name]
        params = [torch.load(str(tmp_path / ("%s.rank%d.pt" % (name, r)))) for r in range(np_)]
        for r in range(1, np_):
            assert torch.equal(params[0], params[r]), \
                "%s: rank %d's parameters differ from rank 0's" % (name, r)
        ref = cm.reference(cfg, np_)
        init = cm.flat_params(cm.make_model(cm.INIT_SEED))
        assert not torch.equal(ref, init)  # training moved the weights
        err = (params[0] - ref).abs().max().item()
        assert err <= cfg.get("tol", 1e-5), "%s: max |distributed - reference| = %g" % (name, err)


def test_a_rank_leaving_fails_the_others_ops_promptly(kolorun):
    res = kolorun(2, os.path.join(WORKERS, "failure_worker.py"), timeout=90)
    assert res.rc == 0, res.describe()
    lines = res.rank_lines(0)
    got = [l for l in lines if l.startswith("GOT-ERROR ")]
    assert got, res.describe()
    _, code, seconds, msg = got[0].split(" ", 3)
    assert int(code) in (5, 6) and float(seconds) < 30, got[0]  # ABORTED / PEER_FAILURE
    assert "rank 1" in msg
    assert any(l.startswith("GOT-ERROR-2 ") for l in lines), res.describe()
    assert not any("UNEXPECTED" in l for l in lines), res.describe()


@pytest.mark.parametrize("np_,agents,mode", [(2, 1, "plain"), (2, 1, "stagger"),
                                             (3, 2, "stagger")])
def test_init_after_shutdown_any_number_of_times(kolorun, np_, agents, mode):
    cycles = 5
    res = kolorun(np_, os.path.join(WORKERS, "reinit_worker.py"), cycles, mode, timeout=120,
                  agents=agents)
    assert_ok(res, np_)
    for r in range(np_):
        assert ["CYCLE %d rank %d ok" % (i, r) for i in range(cycles)] == \
            [l for l in res.rank_lines(r) if l.startswith("CYCLE ")], res.describe()


@pytest.mark.parametrize("np_,agents", [(2, 1), (3, 2)])
def test_sync_batch_norm_matches_batch_norm_on_the_whole_batch(kolorun, np_, agents):
    res = kolorun(np_, os.path.join(WORKERS, "sync_bn_worker.py"), timeout=120, agents=agents)
    assert_ok(res, np_)


# 3 ranks: the block without a partner passes up a level; (4, 2): across agents.
@pytest.mark.parametrize("np_,agents", [(2, 1), (3, 1), (4, 2)])
def test_adasum_matches_the_reference_tree_and_the_delta_optimizer(kolorun, np_, agents):
    res = kolorun(np_, os.path.join(WORKERS, "adasum_worker.py"), timeout=180, agents=agents)
    assert_ok(res, np_)
