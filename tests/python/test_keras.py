"""kolo.tensorflow.keras (issue 42) under kolorun on 2 ranks: Keras fit
with DistributedOptimizer, BroadcastGlobalVariablesCallback,
MetricAverageCallback and the learning-rate callbacks equals one process
fitting the whole batch; backward_passes_per_step (Keras 3); load_model.
Keras 3 (tf.keras of TensorFlow 2.21) and Keras 2 (tf-keras,
TF_USE_LEGACY_KERAS=1): workers/keras_worker.py."""

import os

import pytest

from conftest import WORKERS
from test_tensorflow import tf_available


@pytest.mark.parametrize("legacy", [False, True], ids=["keras3", "tf_keras"])
def test_keras_fit_equals_one_process(stack, kolorun, tmp_path, legacy):
    tf_available(stack)
    env = {"TF_CPP_MIN_LOG_LEVEL": "2"}
    if legacy:
        env["TF_USE_LEGACY_KERAS"] = "1"
    res = kolorun(2, os.path.join(WORKERS, "keras_worker.py"), str(tmp_path), timeout=240, env=env)
    assert res.rc == 0, res.describe()
    checks = ["fit_callbacks", "lr_schedule", "load_model"] + ([] if legacy else
                                                               ["backward_passes_per_step"])
    for rank in range(2):
        lines = res.rank_lines(rank)
        want_keras = "CHECK keras 2." if legacy else "CHECK keras 3."
        assert any(l.startswith(want_keras) for l in lines), res.describe()
        for check in checks:
            assert "CHECK %s ok" % check in lines, (check, res.describe())
