"""kolo.tensorflow (issue 42) under kolorun on 2 ranks: every collective
bit-exact against a numpy reference (float16/bfloat16/float32/float64,
int8/int32/int64/uint8, bool where Horovod allows), eagerly and in
tf.function; the registered gradients against TensorFlow's autodiff of the
reference; a DistributedGradientTape loop (dense and IndexedSlices) equal
to one process on the whole batch; errors naming the tensor; XLA's error.
All checks run in one job (TensorFlow imports slowly): workers/tf_ops_worker.py."""

import os
import re

import pytest

from conftest import EXAMPLES, PYTHON, WORKERS, rank_env, run_bounded

CHECKS = ["allreduce", "grouped_allreduce", "allgather", "broadcast", "alltoall",
          "reducescatter", "gradients", "adasum", "tape_training sparse_as_dense=False",
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


@pytest.mark.skipif(os.environ.get("KOLO_TF_LONG") != "1",
                    reason="4 ranks over 2 agents: about 75 s; KOLO_TF_LONG=1 (scripts/test-long.sh)")
def test_collectives_on_four_ranks_over_two_agents(stack, kolorun):
    tf_available(stack)
    res = kolorun(4, os.path.join(WORKERS, "tf_ops_worker.py"), timeout=480, agents=2,
                  env={"TF_CPP_MIN_LOG_LEVEL": "2"})
    assert res.rc == 0, res.describe()
    for rank in range(4):
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


def test_elastic_a_crashed_rank_restarts_and_resumes_from_the_commit(stack, tmp_path):
    """kolo.tensorflow.elastic: rank 1 aborts at step 12; kolorun restarts it,
    both resume from the commit at step 10 (TensorFlowKerasState) and end
    with every step applied exactly once; rank 0's reset callbacks see the
    new world's size."""
    tf_available(stack)
    (tmp_path / "hosts").write_text("hostA:1\nhostB:1\n")
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\ncat %s\n" % (tmp_path / "hosts"))
    script.chmod(0o755)
    crash = tmp_path / "crash-once"
    crash.write_text("x")
    cmd = [os.path.join(stack, "bin", "kolorun"), "-np", "2", "--min-np", "2", "--max-np", "2",
           "--host-discovery-script", str(script), "--", PYTHON,
           os.path.join(WORKERS, "tf_elastic_worker.py"), "30"]
    res = run_bounded(cmd, 240, env=rank_env({"ELASTIC_CRASH_ONCE": str(crash),
                                              "TF_CPP_MIN_LOG_LEVEL": "2"}), cwd=str(tmp_path))
    text = res.out + res.err
    assert res.rc == 0, res.describe()
    assert "crashing at step 12" in text, res.describe()
    assert "restarting it (restart 1 of" in text, res.describe()
    done = {r: (int(k), sizes) for r, k, sizes in
            re.findall(r"TF-ELASTIC-OK rank (\d+) size 2 step 30 resets (\d+) sizes (\S+)", text)}
    assert set(done) == {"0", "1"}, res.describe()
    assert done["0"][0] >= 1, res.describe()  # rank 0 went through a reset (restore + sync)
    # Its last reset callback ran in the world the job ended in (Horovod's
    # order: the new world is known before the callbacks), not the one before.
    assert done["0"][1].split(",")[-1] == "2", (done, res.describe())


@pytest.mark.skipif(os.environ.get("KOLO_TF_LONG") != "1",
                    reason="about 20 s more of CI; KOLO_TF_LONG=1 (scripts/test-long.sh)")
def test_horovod_tf2_synthetic_benchmark_with_only_the_import_changed(stack, kolorun):
    tf_available(stack)
    env = {"TF_CPP_MIN_LOG_LEVEL": "2"}
    bench = os.path.join(EXAMPLES, "tensorflow2_synthetic_benchmark.py")
    assert _kolo_lines(bench) == ["import kolo.tensorflow as hvd"], _kolo_lines(bench)
    res = kolorun(2, bench, "--model", "small", "--image-size", "32", "--batch-size", "8",
                  "--num-warmup-batches", "1", "--num-batches-per-iter", "2", "--num-iters", "2",
                  "--fp16-allreduce", timeout=240, env=env)
    assert res.rc == 0, res.describe()
    assert any(l.startswith("Total img/sec on 2 CPU(s): ") for l in res.rank_lines(0)), res.describe()
