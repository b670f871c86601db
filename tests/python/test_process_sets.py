"""Process sets in kolo.torch through kolorun with the real coordinator and
agent(s): two sets (even and odd ranks) used at once by every op, grouped
(atomic) ops on sets and on the global set, a DistributedOptimizer within
a set, the errors and add/remove at run time (workers/process_sets_worker.py)."""

import os

import pytest

from conftest import WORKERS

TESTS = ["registration", "allreduce", "broadcast", "allgather", "alltoall", "reducescatter",
         "grouped", "barrier", "independent", "optimizer", "errors", "add_remove"]


# (ranks, agents): two agents act as two nodes (each set then spans both).
@pytest.mark.parametrize("np_,agents", [(2, 1), (4, 1), (4, 2)])
def test_process_sets(kolorun, np_, agents):
    res = kolorun(np_, os.path.join(WORKERS, "process_sets_worker.py"), timeout=240,
                  agents=agents)
    assert res.rc == 0, res.describe()
    for r in range(np_):
        lines = res.rank_lines(r)
        for test in TESTS:
            assert "passed test_%s" % test in lines, res.describe()
        assert "WORKER-OK rank %d" % r in lines, res.describe()
