"""The package on its own: loading libkolo, errors before init, constants
that must match the C ABI, compression, names. No agent is started here."""

import os
import re
import shutil
import time
import types

import pytest
import torch

from conftest import PKG_DIR, PYTHON, REPO, build_dir, rank_env, run_bounded

import kolo  # noqa: E402  (conftest put the checkout on sys.path)
import kolo.torch as hvd  # noqa: E402
from kolo import errors  # noqa: E402
from kolo.torch import _dtypes, _handles, _native, mpi_ops  # noqa: E402

HEADER = os.path.join(REPO, "client_lib", "include", "kolo", "kolo_c.h")


def py(code, env, timeout=60, cwd=None):
    r = run_bounded([PYTHON, "-c", code], timeout, env=env, cwd=cwd)
    return r


def header_enum(prefix):
    text = open(HEADER).read()
    return {m.group(1): int(m.group(2))
            for m in re.finditer(r"\b(%s[A-Z0-9_]*)\s*=\s*(\d+)" % prefix, text)}


def test_constants_match_c_abi():
    dt = header_enum("KOLO_")
    assert _dtypes.KOLO_FLOAT16 == dt["KOLO_FLOAT16"] and _dtypes.KOLO_INT64 == dt["KOLO_INT64"]
    for name in ["FLOAT16", "BFLOAT16", "FLOAT32", "FLOAT64", "INT8", "UINT8", "INT32", "INT64"]:
        assert getattr(_dtypes, "KOLO_" + name) == dt["KOLO_" + name]
    assert (mpi_ops.Average, mpi_ops.Sum, mpi_ops.Min, mpi_ops.Max, mpi_ops.Product) == (
        dt["KOLO_AVERAGE"], dt["KOLO_SUM"], dt["KOLO_MIN"], dt["KOLO_MAX"], dt["KOLO_PRODUCT"])
    for code, name in errors.STATUS_NAMES.items():
        assert dt[name] == code, name
    assert len(_dtypes.TORCH_TO_KOLO) == 8


def test_import_does_not_load_the_library():
    r = py("import kolo, kolo.torch; from kolo import _library; "
           "assert _library._lib is None; print('ok')", rank_env())
    assert r.rc == 0 and "ok" in r.out, r.describe()


def test_kolo_library_pointing_nowhere_is_an_error():
    env = rank_env({"KOLO_LIBRARY": "/nonexistent/libkolo.so"})
    r = py("import kolo.torch as hvd\n"
           "try:\n    hvd.init()\nexcept hvd.KoloLibraryNotFound as e:\n"
           "    assert isinstance(e, ImportError); print('ERR', e)\n", env)
    assert r.rc == 0 and "ERR KOLO_LIBRARY=/nonexistent/libkolo.so" in r.out, r.describe()


def test_library_not_found_lists_where_it_looked(tmp_path):
    # A copy of the package outside the checkout, no hints in the environment.
    shutil.copytree(os.path.join(PKG_DIR, "kolo"), str(tmp_path / "kolo"),
                    ignore=shutil.ignore_patterns("libkolo.so*", "__pycache__"))
    env = rank_env()
    for k in ("KOLO_LIBRARY", "KOLO_BUILD_DIR", "LD_LIBRARY_PATH"):
        env.pop(k, None)
    env["PYTHONPATH"] = str(tmp_path)
    r = py("import kolo\ntry:\n    kolo.rank()\nexcept kolo.KoloLibraryNotFound as e:\n"
           "    print('ERR', e)\n", env, cwd=str(tmp_path))
    assert r.rc == 0, r.describe()
    assert "cannot find libkolo.so" in r.out and str(tmp_path / "kolo" / "libkolo.so") in r.out
    assert "KOLO_LIBRARY" in r.out and "kolo_client" in r.out


def test_build_dir_is_searched(stack):
    env = rank_env()
    env.pop("KOLO_LIBRARY")
    env["KOLO_BUILD_DIR"] = stack
    r = py("import kolo; print('PATH', kolo.library_path())", env)
    assert r.rc == 0 and ("PATH " + os.path.join(stack, "lib", "libkolo.so")) in r.out, r.describe()


def test_calls_before_init_raise_value_error(stack):
    code = """
import torch, kolo, kolo.torch as hvd
assert not hvd.is_initialized()
for fn, args in [(hvd.rank, ()), (hvd.size, ()), (hvd.local_rank, ()), (hvd.cross_size, ()),
                 (hvd.allreduce, (torch.ones(1),)), (hvd.broadcast_object, (1,)),
                 (hvd.barrier, ()), (hvd.shared_zeros, (4,))]:
    try:
        fn(*args)
        raise SystemExit('no error from %s' % fn.__name__)
    except ValueError as e:
        assert 'init' in str(e), e
hvd.shutdown()  # harmless before init
print('ok')
"""
    r = py(code, rank_env())
    assert r.rc == 0 and "ok" in r.out, r.describe()


def test_init_outside_kolorun_explains_what_is_missing(stack):
    env = rank_env()
    for k in list(env):
        if k.startswith("KOLO_") and k != "KOLO_LIBRARY" or k.startswith("HOROVOD_"):
            env.pop(k)
    r = py("import kolo.torch as hvd\ntry:\n    hvd.init()\nexcept hvd.KoloError as e:\n"
           "    print('ERR', e.code, e)\n", env)
    assert r.rc == 0 and "ERR 2 " in r.out, r.describe()
    assert "KOLO_JOB_ID" in r.out and "kolorun" in r.out


def test_init_without_agent_fails_within_the_start_timeout(stack, tmp_path):
    sock = str(tmp_path / "no-agent.sock")
    env = rank_env({"KOLO_AGENT_SOCKET": sock, "KOLO_JOB_ID": "job-test", "KOLO_JOB_TOKEN": "t",
                    "KOLO_SIZE": "2", "KOLO_LOCAL_RANK": "0", "KOLO_LOCAL_SIZE": "2",
                    "KOLO_START_TIMEOUT": "1"})
    t0 = time.monotonic()
    r = py("import kolo\ntry:\n    kolo.init()\nexcept kolo.KoloError as e:\n"
           "    print('ERR', e.status_name, e)\n", env)
    assert time.monotonic() - t0 < 20
    assert r.rc == 0 and "ERR KOLO_ERR_UNAVAILABLE" in r.out and sock in r.out, r.describe()


def test_compression():
    x = torch.linspace(-3, 3, 11, dtype=torch.float64)
    c, ctx = hvd.Compression.fp16.compress(x)
    assert c.dtype == torch.float16
    back = hvd.Compression.fp16.decompress(c, ctx)
    assert back.dtype == torch.float64 and torch.allclose(back, x, atol=1e-2)
    i = torch.arange(4)
    c, ctx = hvd.Compression.fp16.compress(i)
    assert c is i and hvd.Compression.fp16.decompress(c, ctx) is i
    c, ctx = hvd.Compression.none.compress(x)
    assert c is x and hvd.Compression.none.decompress(c, ctx) is x


def test_wire_names():
    assert _handles.op_name("allreduce", "fc1.weight") == "allreduce.fc1.weight"
    a = _handles.op_name("grouped_x", None)
    b = _handles.op_name("grouped_x", None)
    assert a == "grouped_x.noname.0" and b == "grouped_x.noname.1"
    long1 = _handles.op_name("allreduce", "é" * 300)
    long2 = _handles.op_name("allreduce", "é" * 300)
    other = _handles.op_name("allreduce", "é" * 299 + "x")
    assert long1 == long2 != other
    assert len(long1.encode()) <= 255 and len(other.encode()) <= 255


def test_dtype_checks():
    assert _dtypes.check_tensor(torch.ones(1, dtype=torch.bfloat16), "t") == _dtypes.KOLO_BFLOAT16
    with pytest.raises(ValueError, match="int16"):
        _dtypes.check_tensor(torch.ones(1, dtype=torch.int16), "allreduce")
    with pytest.raises(ValueError, match="torch.Tensor"):
        _dtypes.check_tensor([1.0], "allreduce")


def test_native_descriptors():
    # kolo dtypes travel as themselves; others as uint8 with a trailing dim of
    # their element size, so dim 0 (the one allgather/alltoall cut) is kept.
    d = _native.describe(torch.zeros(5, 3, dtype=torch.bfloat16))
    assert (d.ndim, list(d.shape), d.kdtype) == (2, [5, 3], _dtypes.KOLO_BFLOAT16)
    d = _native.describe(torch.zeros(5, dtype=torch.int16))
    assert (d.ndim, list(d.shape), d.kdtype) == (2, [5, 2], _dtypes.KOLO_UINT8)
    d = _native.describe(torch.zeros((), dtype=torch.complex128))
    assert (d.ndim, list(d.shape), d.kdtype) == (1, [16], _dtypes.KOLO_UINT8)
    d = _native.describe(torch.zeros(0, 2, dtype=torch.bool))
    assert (d.ndim, list(d.shape)[:3]) == (3, [0, 2, 1])
    # More than 8 dims: the trailing ones are folded, dim 0 stays.
    d = _native.describe(torch.zeros([3] + [1] * 8 + [2]))
    assert (d.ndim, list(d.shape)) == (8, [3, 1, 1, 1, 1, 1, 1, 2])
    assert [_native.reducescatter_rows(7, 3, r) for r in range(3)] == [3, 2, 2]
    assert [_native.reducescatter_rows(1, 4, r) for r in range(4)] == [1, 0, 0, 0]
    assert _handles.fit_name("a" * 300, 246) == _handles.fit_name("a" * 300, 246)
    assert len(_handles.fit_name("a" * 300, 246).encode()) == 246
    with pytest.raises(ValueError, match="broadcast does not support dtype quint8"):
        _native.check_carried_dtype(types.SimpleNamespace(dtype=torch.quint8), "broadcast")


def test_process_set_objects():
    assert hvd.global_process_set.process_set_id == 0
    assert "all" in repr(hvd.global_process_set)
    ps = hvd.ProcessSet([2, 0])
    assert ps.ranks == [0, 2] and ps.process_set_id is None
    # Not registered: Horovod's queries answer None.
    assert ps.size() is None and ps.rank() is None and ps.included() is None
    assert ps == hvd.ProcessSet((0, 2)) and ps != hvd.ProcessSet([0, 1])
    assert ps != hvd.global_process_set
    assert hash(ps) == hash(hvd.ProcessSet([0, 2])) and len({ps, hvd.ProcessSet([2, 0])}) == 1
    with pytest.raises(ValueError, match="list of global ranks"):
        hvd.ProcessSet("01")
    with pytest.raises(ValueError, match="int ranks"):
        hvd.ProcessSet([0.5, 1])
    with pytest.raises(ValueError, match="always exists"):
        hvd.add_process_set(hvd.global_process_set)
    assert hvd.remove_process_set(ps) is False  # never added
    with pytest.raises(ValueError, match="process_sets"):
        hvd.init(process_sets="static")


def test_exception_hierarchy():
    assert hvd.HorovodInternalError is hvd.KoloInternalError
    assert issubclass(hvd.KoloInternalError, kolo.KoloError)
    assert issubclass(hvd.KoloNotImplementedError, NotImplementedError)
    e = hvd.KoloNotImplementedError("alltoall", "later")
    assert "alltoall" in str(e) and e.op == "alltoall"
    assert kolo.KoloError("x", 4).status_name == "KOLO_ERR_TIMED_OUT"
    assert build_dir()  # conftest helper importable
