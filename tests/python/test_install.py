"""`pip install ./client_lib/python` bundles libkolo.so and works offline
(--no-build-isolation: pip >= 25 otherwise fetches setuptools into a
build environment; the venv has setuptools)."""

import os
import shutil

from conftest import PKG_DIR, PYTHON, rank_env, run_bounded


def test_pip_install_bundles_libkolo(stack, tmp_path):
    # Install from a copy so the checkout gets no build/ or egg-info.
    src = tmp_path / "src"
    shutil.copytree(PKG_DIR, str(src), ignore=shutil.ignore_patterns(
        "build", "*.egg-info", "__pycache__", "libkolo.so*"))
    target = tmp_path / "site"
    env = rank_env({"KOLO_BUILD_DIR": stack})
    env.pop("KOLO_LIBRARY")
    res = run_bounded([PYTHON, "-m", "pip", "install", "--no-index", "--no-deps",
                       "--disable-pip-version-check", "--no-build-isolation", "--target", str(target), str(src)],
                      180, env=env, cwd=str(tmp_path))
    assert res.rc == 0, res.describe()
    lib = target / "kolo" / "libkolo.so"
    assert lib.is_file() and not lib.is_symlink()

    # The installed package finds its own copy (no hints in the environment)
    # and runs a job.
    env = rank_env()
    for k in ("KOLO_LIBRARY", "KOLO_BUILD_DIR"):
        env.pop(k, None)
    env["PYTHONPATH"] = str(target)
    code = ("import torch, kolo.torch as hvd; hvd.init(); "
            "assert hvd.library_path() == %r, hvd.library_path(); "
            "print('SUM', hvd.allreduce(torch.ones(2), op=hvd.Sum).tolist())" % str(lib))
    res = run_bounded([os.path.join(stack, "bin", "kolorun"), "-np", "2", "--", PYTHON, "-c",
                       code], 120, env=env, cwd=str(tmp_path))
    assert res.rc == 0, res.describe()
    assert res.rank_lines(0) == ["SUM [2.0, 2.0]"], res.describe()

    # kolo.tensorflow from the installed package: its bundled op library
    # (when the build made one: KOLO_PYTHON has TensorFlow).
    if not os.path.exists(os.path.join(stack, "lib", "libkolo_tensorflow.so")):
        return
    tf_lib = target / "kolo" / "libkolo_tensorflow.so"
    assert tf_lib.is_file(), "libkolo_tensorflow.so was not bundled"
    code = ("import tensorflow as tf, kolo.tensorflow as hvd; hvd.init(); "
            "print('TF', hvd.allreduce(tf.ones([2]), op=hvd.Sum).numpy().tolist())")
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    res = run_bounded([os.path.join(stack, "bin", "kolorun"), "-np", "2", "--", PYTHON, "-c",
                       code], 120, env=env, cwd=str(tmp_path))
    assert res.rc == 0, res.describe()
    assert "TF [2.0, 2.0]" in res.rank_lines(0), res.describe()
