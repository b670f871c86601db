"""kolo.tensorflow (issue 42) under kolorun on 2 ranks: every collective
bit-exact against a numpy reference (float16/bfloat16/float32/float64,
int8/int32/int64/uint8, bool where Horovod allows), eagerly and in
tf.function; the registered gradients against TensorFlow's autodiff of the
reference; a DistributedGradientTape loop (dense and IndexedSlices) equal
to one process on the whole batch; errors naming the tensor; XLA's error.
All checks run in one job (TensorFlow imports slowly): workers/tf_ops_worker.py."""

import os

import pytest

from conftest import EXAMPLES, PYTHON, WORKERS, rank_env, run_bounded

CHECKS = ["allreduce", "grouped_allreduce", "allgather", "broadcast", "alltoall",
          "reducescatter", "gradients", "tape_training sparse_as_dense=False",
          "tape_training sparse_as_dense=True", "errors", "process_set", "join"]


def tf_available(stack):
    """Skips unless KOLO_PYTHON has TensorFlow and the op library is built."""
    lib = os.path.join(stack, "lib", "libkolo_tensorflow.so")
    res = run_bounded([PYTHON, "-c", "import tensorflow"], 120, env=rank_env())
    if res.rc != 0:
        pytest.skip("KOLO_PYTHON cannot import tensorflow (scripts/install-python.sh installs it)")
    if not os.path.exists(lib):
        pytest.fail("TensorFlow is importable but %s is not built (reconfigure: CMake builds it "
                    "when KOLO_PYTHON has TensorFlow)" % lib)


def test_collectives_gradients_and_tape_on_two_ranks(stack, kolorun):
    tf_available(stack)
    res = kolorun(2, os.path.join(WORKERS, "tf_ops_worker.py"), timeout=240,
                  env={"TF_CPP_MIN_LOG_LEVEL": "2"})
    assert res.rc == 0, res.describe()
    for rank in range(2):
        lines = res.rank_lines(rank)
        for check in CHECKS:
            assert "CHECK %s ok" % check in lines, (check, res.describe())


def _kolo_lines(path):
    code = open(path).read().split('"""', 2)[2]  # after the module docstring
    return [l for l in code.splitlines() if "kolo" in l]


def test_horovod_tf2_examples_with_only_the_import_changed(stack, kolorun):
    """Horovod's TF2 custom loop and Keras fit examples, import changed only."""
    tf_available(stack)
    env = {"TF_CPP_MIN_LOG_LEVEL": "2"}
    loop = os.path.join(EXAMPLES, "tensorflow2_mnist.py")
    assert _kolo_lines(loop) == ["import kolo.tensorflow as hvd"], _kolo_lines(loop)
    res = kolorun(2, loop, "--steps", "8", "--batch-size", "16", timeout=180, env=env)
    assert res.rc == 0, res.describe()
    assert "Done: 2 ranks, identical weights" in res.rank_lines(0), res.describe()
    fit = os.path.join(EXAMPLES, "tensorflow2_keras_mnist.py")
    assert _kolo_lines(fit) == ["import kolo.tensorflow.keras as hvd"], _kolo_lines(fit)
    res = kolorun(2, fit, "--epochs", "2", "--steps-per-epoch", "8", "--batch-size", "16",
                  timeout=180, env=env)
    assert res.rc == 0, res.describe()
    assert any(l.startswith("Done: 2 ranks, final loss") for l in res.rank_lines(0)), res.describe()
