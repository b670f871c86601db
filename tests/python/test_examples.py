"""The examples run end to end (short settings)."""

import os

from conftest import EXAMPLES, PYTHON, rank_env, run_bounded


def test_mnist_style_example(kolorun):
    res = kolorun(2, os.path.join(EXAMPLES, "pytorch_mnist_style.py"), "--epochs", "2",
                  "--samples", "512", "--zero-copy", timeout=120)
    assert res.rc == 0, res.describe()
    lines = [l for l in res.rank_lines(0) if l.startswith("epoch ")]
    assert len(lines) == 2 and "(2 ranks)" in lines[0], res.describe()


def test_horovod_script_with_only_the_import_changed(kolorun):
    path = os.path.join(EXAMPLES, "horovod_example_unchanged.py")
    code = open(path).read().split('"""', 2)[2]  # after the module docstring
    kolo_lines = [l for l in code.splitlines() if "kolo" in l]
    assert kolo_lines == ["import kolo.torch as hvd"], kolo_lines
    res = kolorun(2, path, "--epochs", "1", timeout=120)
    assert res.rc == 0, res.describe()
    assert "Done: 2 ranks, identical parameters" in res.rank_lines(0), res.describe()


def test_synthetic_benchmarks_and_comparison(stack, tmp_path):
    # compare_ddp.sh runs pytorch_synthetic_benchmark.py under kolorun and
    # ddp_synthetic_benchmark.py with its own launcher, then the table.
    cmd = [os.path.join(EXAMPLES, "compare_ddp.sh"), "--build-dir", stack, "--np", "2",
           "--python", PYTHON, "--zero-copy", "--",
           "--model", "convnet", "--batch-size", "4", "--image-size", "32", "--num-classes", "10",
           "--num-warmup-batches", "1", "--num-batches-per-iter", "2", "--num-iters", "2"]
    env = rank_env({"TMPDIR": str(tmp_path)})
    res = run_bounded(cmd, 240, env=env)
    assert res.rc == 0, res.describe()
    assert "RESULT framework=kolo model=convnet np=2" in res.out, res.describe()
    assert "RESULT framework=ddp model=convnet np=2" in res.out, res.describe()
    table = res.out.split("kolo/ddp", 1)[1].split()
    assert table[0] == "2" and float(table[1]) > 0 and float(table[2]) > 0, res.describe()
