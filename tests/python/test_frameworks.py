"""PyTorch Lightning and Hugging Face Accelerate on kolo, through kolorun
with the real agent and coordinator: examples/lightning_kolo.py (a Trainer
with DDPStrategy(process_group_backend="kolo") and kolo.lightning's
KoloEnvironment) and examples/accelerate_kolo.py, 2 ranks, 6 steps each:
both ranks end with bit-identical parameters, equal to one process on the
whole batches within 1e-5 (the examples' --check)."""

import os

import pytest

from conftest import EXAMPLES, PYTHON, run_bounded


def _need(module):
    if run_bounded([PYTHON, "-c", "import " + module], 120).rc != 0:
        msg = "%s cannot import %s (scripts/python-requirements.txt pins it)" % (PYTHON, module)
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        pytest.skip(msg)


@pytest.mark.parametrize("example,module,tag", [
    ("lightning_kolo.py", "pytorch_lightning", "lightning"),
    ("accelerate_kolo.py", "accelerate", "accelerate"),
])
def test_framework_trains_like_one_process(kolorun, example, module, tag):
    _need(module)
    res = kolorun(2, os.path.join(EXAMPLES, example), "--check", "--steps", 6, timeout=240)
    assert res.rc == 0, res.describe()
    sums = set()
    for r in range(2):
        lines = res.rank_lines(r)
        ck = [l for l in lines if l.startswith("%s rank %d steps 6 checksum " % (tag, r))]
        assert len(ck) == 1, res.describe()
        sums.add(ck[0].rsplit(" ", 1)[1])
        assert any(l.startswith("%s rank %d matches one process" % (tag, r)) for l in lines), \
            res.describe()
    assert len(sums) == 1, "ranks ended with different parameters: %s" % sums
