"""broadcast, allgather, alltoall and reducescatter on libkolo's native C ABI,
through kolorun with the real coordinator and agent(s): every dtype, uneven
and empty first dimensions, async/grouped/autograd forms, bit-exact against
references the worker computes, and mismatch errors carrying the agent's
message (workers/collectives_worker.py)."""

import os

import pytest

from conftest import WORKERS


# (ranks, agents): two agents act as two nodes (the cross-agent path).
@pytest.mark.parametrize("np_,agents", [(2, 1), (4, 1), (4, 2)])
def test_native_collectives(kolorun, np_, agents):
    res = kolorun(np_, os.path.join(WORKERS, "collectives_worker.py"), timeout=240, agents=agents)
    assert res.rc == 0, res.describe()
    for r in range(np_):
        lines = res.rank_lines(r)
        for test in ["broadcast", "allgather", "alltoall", "reducescatter", "mismatches",
                     "objects"]:
            assert "passed test_%s" % test in lines, res.describe()
        assert "WORKER-OK rank %d" % r in lines, res.describe()
