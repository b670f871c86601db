"""kolo as a torch.distributed backend (kolo.torch.distributed) through
kolorun with the real coordinator and agent: every collective and dtype
against references each rank computes (bit-exact), dist.new_group as a kolo
process set, async work, errors and torch's timeout, and DDP training
(plain, no_sync, find_unused_parameters, the fp16 compression hook, small
buckets) against a single-process run on the concatenated batch
(workers/torch_dist_worker.py)."""

import os

import pytest

from conftest import PYTHON, WORKERS, run_bounded

WORKER = os.path.join(WORKERS, "torch_dist_worker.py")


def _torch_has_python_backends():
    res = run_bounded([PYTHON, "-c", "from torch._C._distributed_c10d import "
                       "_create_work_from_future; import torch.distributed as d; "
                       "assert d.is_available()"], 120)
    return res.rc == 0


@pytest.fixture(scope="module", autouse=True)
def _needs_torch_backend_support():
    if not _torch_has_python_backends():
        pytest.skip("this torch cannot host a Python process-group backend "
                    "(no torch.distributed or _create_work_from_future)")


def _ok(res, np_, names):
    assert res.rc == 0, res.describe()
    for r in range(np_):
        lines = res.rank_lines(r)
        for n in names:
            assert "passed %s" % n in lines, "rank %d: no 'passed %s'\n%s" % (r, n, res.describe())
        assert "WORKER-OK rank %d" % r in lines, res.describe()


@pytest.mark.parametrize("np_", [2, 3])
def test_collectives(kolorun, np_):
    res = kolorun(np_, WORKER, "collectives", timeout=240)
    _ok(res, np_, ["allreduce", "allreduce_avg", "allreduce_shapes", "allreduce_coalesced",
                   "broadcast", "allgather", "reduce_scatter", "alltoall", "barrier", "rooted",
                   "new_group"])


def test_async_errors_timeout(kolorun):
    res = kolorun(2, WORKER, "async_errors", 8, timeout=180)
    _ok(res, 2, ["async", "error_mismatch", "error_unsupported", "after_errors", "timeout"])
    assert any(l.startswith("timeout error after") for l in res.rank_lines(0)), res.describe()


def test_ddp_matches_single_process(kolorun):
    res = kolorun(2, WORKER, "ddp", timeout=240)
    _ok(res, 2, ["ddp_plain", "ddp_no_sync", "ddp_find_unused", "ddp_fp16_hook",
                 "ddp_small_buckets"])
