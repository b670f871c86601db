"""Horovod's own PyTorch suite (test/parallel/test_torch.py of Horovod
0.28.1) on kolo.torch, in one kolorun job, as Horovod runs it.

Runs only when KOLO_HOROVOD_SRC names a Horovod source tree (nothing of
Horovod is part of this repository); skipped otherwise. See
tests/python/horovod_suite.py and docs/user-guide-python.md ("Horovod's
test suite").
"""

import os

import pytest

import horovod_suite

SRC = os.environ.get(horovod_suite.ENV_VAR)

pytestmark = pytest.mark.skipif(not SRC, reason="%s is not set (a Horovod source tree)"
                                % horovod_suite.ENV_VAR)


@pytest.mark.parametrize("np_", [2, 4])
def test_horovods_torch_suite_passes_in_one_job(stack, np_):
    res, merged, outcomes, messages = horovod_suite.run_suite(SRC, np_, build=stack, timeout=1500)
    failed = {n: messages.get(n, "") for n, v in merged.items() if v == "failed"}
    passed = [n for n, v in merged.items() if v == "passed"]
    assert merged, res.describe()
    assert not failed, "failed: %s\n%s" % (failed, res.describe())
    assert res.rc == 0, res.describe()
    # The suite really ran (not everything skipped): the reinit test and a
    # collective from each family passed on every rank.
    for name in ["test_horovod_reinit", "test_horovod_allreduce", "test_horovod_allgather",
                 "test_horovod_broadcast", "test_horovod_alltoall", "test_horovod_reducescatter",
                 "test_horovod_allreduce_prescale", "test_broadcast_state"]:
        assert name in passed, (name, outcomes.get(name), messages.get(name))
