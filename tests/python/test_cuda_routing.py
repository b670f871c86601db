"""kolo.torch's CUDA routing (_cuda.py) without a GPU and without an agent:
which route an op takes, the texts of its refusals, the C ABI revision 2
bindings (kolo_set_stream & co.) and kolo_stream_t's layout."""

import ctypes
import os
import warnings

import pytest
import torch

from conftest import REPO, build_dir

import kolo.torch as hvd  # noqa: E402,F401  (conftest put the checkout on sys.path)
from kolo import _library  # noqa: E402
from kolo.torch import _cuda, _dtypes, _zero_copy  # noqa: E402


class FakeCuda:
    """Stands in for a CUDA tensor where route() looks (is_cuda, device)."""

    def __init__(self, index):
        self.is_cuda = True
        self.device = torch.device("cuda", index)


@pytest.fixture
def arena(monkeypatch):
    """Sets what kolo_device_path answers: arena(device, why)."""
    def set_arena(device, why=""):
        monkeypatch.setattr(_cuda, "arena_device", lambda: (device, why))
        monkeypatch.setattr(_cuda, "_warned", False)
    return set_arena


def test_host_tensors_take_the_host_route(arena):
    arena(0)
    assert _cuda.route([torch.ones(2), torch.ones(3)], "allreduce") == _cuda.HOST
    assert _cuda.route([], "grouped_allreduce") == _cuda.HOST


def test_cuda_tensors_on_the_arena_gpu_take_the_device_path(arena):
    arena(1)
    assert _cuda.route([FakeCuda(1), FakeCuda(1)], "grouped_allreduce") == _cuda.DEVICE
    # Collectives the agent does not run on device memory: staged.
    assert _cuda.route([FakeCuda(1)], "allgather", device_capable=False) == _cuda.STAGED
    # Host and device tensors in one group: staged.
    assert _cuda.route([FakeCuda(1), torch.ones(1)], "grouped_allreduce") == _cuda.STAGED


def test_a_tensor_on_another_gpu_is_refused_naming_both(arena):
    arena(0)
    with pytest.raises(ValueError) as e:
        _cuda.route([FakeCuda(2)], "allreduce")
    msg = str(e.value)
    assert "kolo allreduce: the tensor is on cuda:2, but this rank's kolo device arena is on cuda:0" in msg
    assert "torch.cuda.set_device(0) before kolo.torch.init()" in msg


def test_without_a_device_arena_cuda_tensors_are_staged_with_one_warning(arena):
    arena(-1, "this rank has no device arena: this process asked for none")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert _cuda.route([FakeCuda(0)], "allreduce") == _cuda.STAGED
        assert _cuda.route([FakeCuda(0)], "broadcast") == _cuda.STAGED
    texts = [str(x.message) for x in w if issubclass(x.category, RuntimeWarning)]
    assert texts == ["kolo: CUDA tensors go through host memory (slower), because this rank "
                     "has no device arena: this process asked for none"], texts


def test_devices_other_than_cpu_and_cuda_are_refused():
    t = torch.empty(2, device="meta")
    with pytest.raises(ValueError, match="kolo allreduce supports CPU and CUDA tensors; got a "
                                         "tensor on meta"):
        _dtypes.check_tensor(t, "allreduce")


def test_init_context_leaves_everything_alone_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("KOLO_DEVICE_ARENA_MB", raising=False)
    with _cuda.init_context():
        assert "KOLO_DEVICE_ARENA_MB" not in os.environ


def test_stream_struct_matches_the_header():
    # size_t struct_size; int device; void* stream (x86-64: 8 + 4 (+4) + 8).
    assert ctypes.sizeof(_library.kolo_stream_t) == 24
    assert _library.kolo_stream_t.stream.offset == 16
    text = open(os.path.join(REPO, "client_lib", "include", "kolo", "kolo_c.h")).read()
    assert "#define KOLO_ABI_VERSION 3" in text
    assert "#define KOLO_DEVICE_ANY (-1)" in text


def test_revision_2_functions_through_ctypes(stack):
    os.environ.setdefault("KOLO_LIBRARY", os.path.join(build_dir(), "lib", "libkolo.so"))
    lib = _library.lib()
    for name in ("kolo_set_stream", "kolo_get_stream", "kolo_device_path"):
        assert _library.has_symbol(name), name
    s = _library.kolo_stream_t(ctypes.sizeof(_library.kolo_stream_t), 0, ctypes.c_void_p(0x1234))
    assert lib.kolo_set_stream(ctypes.byref(s)) == 0, _library.last_error()
    got = _library.kolo_stream_t(ctypes.sizeof(_library.kolo_stream_t), 9, None)
    assert lib.kolo_get_stream(ctypes.byref(got)) == 0
    assert (got.device, got.stream) == (0, 0x1234)
    assert lib.kolo_set_stream(None) == 0
    bad = _library.kolo_stream_t(4, 0, None)
    assert lib.kolo_set_stream(ctypes.byref(bad)) == 2  # KOLO_ERR_INVALID_ARGUMENT
    assert "struct_size is 4" in _library.last_error()
    dev = ctypes.c_int(7)
    assert lib.kolo_device_path(ctypes.byref(dev)) == 2  # not initialized
    assert dev.value == -1 and "kolo_init" in _library.last_error()


def test_the_arena_gpu_follows_kolorun_then_torchrun_local_rank(monkeypatch):
    # kolo.torch.init() and the torch.distributed backend (issue 39) choose
    # local_rank % device_count: kolorun's KOLO_LOCAL_RANK, else torchrun's.
    monkeypatch.delenv("KOLO_LOCAL_RANK", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert _cuda._local_rank_from_env() == 0
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert _cuda._local_rank_from_env() == 3
    monkeypatch.setenv("KOLO_LOCAL_RANK", "1")
    assert _cuda._local_rank_from_env() == 1



# Zero copy (KOLO_DEVICE_ZERO_COPY=1, _zero_copy.py; C ABI revision 3): what
# runs without a GPU. The allocator swap itself runs in bench/gpu_issue16.sh
# (phase py-zerocopy) only.
def test_revision_3_allocator_hooks_through_ctypes(stack):
    os.environ.setdefault("KOLO_LIBRARY", os.path.join(build_dir(), "lib", "libkolo.so"))
    lib = _library.lib()
    for name in ("kolo_device_alloc", "kolo_device_free", _zero_copy.ALLOC_FN, _zero_copy.FREE_FN):
        assert _library.has_symbol(name), name
    alloc = getattr(lib, _zero_copy.ALLOC_FN)
    alloc.restype = ctypes.c_void_p
    alloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    assert alloc(64, 0, None) is None  # before kolo_init: NULL, and why
    assert "has not been initialized" in _library.last_error()
    assert alloc(0, 0, None) is None


def test_zero_copy_is_ignored_with_a_warning_without_cuda(monkeypatch):
    monkeypatch.setenv("KOLO_DEVICE_ZERO_COPY", "1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.warns(RuntimeWarning, match="KOLO_DEVICE_ZERO_COPY=1 is ignored: CUDA is not available"):
        assert _zero_copy.before_init() is False
    assert not _zero_copy.installed()
    monkeypatch.setenv("KOLO_DEVICE_ZERO_COPY", "0")
    assert not _zero_copy.requested()


def test_zero_copy_after_torch_allocated_names_the_way_out(monkeypatch, stack):
    # torch refuses to swap an allocator it initialized already; kolo says
    # what to do instead. (torch's allocator calls are stood in for: no GPU.)
    os.environ.setdefault("KOLO_LIBRARY", os.path.join(build_dir(), "lib", "libkolo.so"))
    import torch.cuda.memory as tcm
    monkeypatch.setenv("KOLO_DEVICE_ZERO_COPY", "1")
    monkeypatch.delenv("KOLO_DEVICE_ARENA_MB", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    seen = []
    monkeypatch.setattr(tcm, "CUDAPluggableAllocator", lambda *a: seen.append(a) or object())

    def refuse(_):
        raise RuntimeError("Can't swap an already initialized allocator")
    monkeypatch.setattr(tcm, "change_current_allocator", refuse)
    with pytest.raises(RuntimeError) as e:
        _zero_copy.before_init()
    assert "call kolo.torch.init() before the first CUDA tensor, or leave KOLO_DEVICE_ZERO_COPY unset" in str(e.value)
    assert seen and seen[0][1:] == (_zero_copy.ALLOC_FN, _zero_copy.FREE_FN)
    assert os.environ["KOLO_DEVICE_ARENA_MB"] == str(_zero_copy.DEFAULT_ZERO_COPY_ARENA_MB)
    assert not _zero_copy.installed()
