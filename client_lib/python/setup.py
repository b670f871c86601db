"""Installs the kolo Python package (kolo, kolo.torch) with a copy of an
already-built libkolo.so inside it.

    KOLO_BUILD_DIR=/path/to/build pip install ./client_lib/python
    (Debian 12 as root: add --break-system-packages, see docs/user-guide-python.md)

libkolo.so is taken from, in order: $KOLO_LIBRARY (a file), then
$KOLO_BUILD_DIR/lib/libkolo.so, then <repo>/build/lib/libkolo.so. Build it
first (CMake target kolo_client). Set KOLO_PYTHON_NO_LIBRARY=1 to install the
Python code alone (libkolo is then found at run time through KOLO_LIBRARY,
KOLO_BUILD_DIR or the system's loader).
"""

import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))


def find_libkolo():
    tried = []
    env = os.environ.get("KOLO_LIBRARY")
    if env:
        return (env if os.path.isfile(env) else None), [env]
    candidates = []
    if os.environ.get("KOLO_BUILD_DIR"):
        candidates.append(os.path.join(os.environ["KOLO_BUILD_DIR"], "lib", "libkolo.so"))
    candidates.append(os.path.join(HERE, "..", "..", "build", "lib", "libkolo.so"))
    for c in candidates:
        c = os.path.normpath(c)
        tried.append(c)
        if os.path.isfile(c):
            return c, tried
    return None, tried


class BuildPyWithLibkolo(build_py):
    def run(self):
        super().run()
        if os.environ.get("KOLO_PYTHON_NO_LIBRARY") == "1":
            return
        lib, tried = find_libkolo()
        if lib is None:
            raise SystemExit(
                "kolo setup: cannot find libkolo.so (tried: %s). Build it first "
                "(cmake --build <build> --target kolo_client) and set KOLO_BUILD_DIR=<build>, "
                "or set KOLO_LIBRARY=<path to libkolo.so>; KOLO_PYTHON_NO_LIBRARY=1 installs "
                "without it." % ", ".join(tried))
        dest = os.path.join(self.build_lib, "kolo", "libkolo.so")
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(os.path.realpath(lib), dest)  # the real file, not the symlink
        os.chmod(dest, 0o755)
        print("kolo setup: bundled %s" % os.path.realpath(lib))
        # kolo.tensorflow's op library, when the build made it (KOLO_PYTHON had TensorFlow).
        tf_ops = os.path.join(os.path.dirname(os.path.realpath(lib)), "libkolo_tensorflow.so")
        if os.path.isfile(tf_ops):
            dest = os.path.join(self.build_lib, "kolo", "libkolo_tensorflow.so")
            shutil.copyfile(tf_ops, dest)
            os.chmod(dest, 0o755)
            print("kolo setup: bundled %s" % tf_ops)


class BinaryDistribution(Distribution):
    """The package carries a native library: wheels are platform-specific."""

    def has_ext_modules(self):
        return os.environ.get("KOLO_PYTHON_NO_LIBRARY") != "1"


def read_version():
    with open(os.path.join(HERE, "kolo", "__init__.py")) as f:
        for line in f:
            if line.startswith("__version__"):
                return line.split("=")[1].strip().strip("\"'")
    return "0.0.0"


setup(
    name="kolo",
    version=read_version(),
    description="kolo: data-parallel training collectives through a per-node agent "
                "(Horovod-compatible PyTorch, TensorFlow and Keras APIs)",
    packages=["kolo", "kolo.torch", "kolo.tensorflow", "kolo.tensorflow.keras", "kolo.keras",
              "kolo.ray", "kolo.spark"],
    python_requires=">=3.8",
    extras_require={"torch": ["torch"]},
    cmdclass={"build_py": BuildPyWithLibkolo},
    distclass=BinaryDistribution,
    zip_safe=False,
)
