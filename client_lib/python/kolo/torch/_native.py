"""libkolo's native collectives on torch tensors: tensor descriptors,
submission through the C ABI (kolo/kolo_c.h) and library-owned results.

Every function here takes contiguous CPU tensors and returns C handles (or
raises at once): ValueError when libkolo refuses the arguments
(KOLO_ERR_INVALID_ARGUMENT), KoloInternalError with libkolo's message for
anything else. The stage generators in mpi_ops.py wait for the handles.

Element types. The eight kolo dtypes travel as themselves. The element
types the agent does not know (bool, int16, complex64, complex128) can still
be moved bit for bit by broadcast, allgather and alltoall: they travel as
uint8 with one more, trailing dimension of the element's size (a [5] int16
tensor is a [5, 2] uint8 one on the wire), so the first dimension -- the one
allgather and alltoall cut along -- is the tensor's own.
"""

import ctypes
import os

import torch

from .. import _library
from ..errors import ERR_INVALID_ARGUMENT, OK, KoloInternalError
from . import _dtypes

MAX_DIMS = 8

# Element types broadcast, allgather and alltoall can carry (reductions take
# the kolo dtypes only).
CARRIED_DTYPES = list(_dtypes.TORCH_TO_KOLO) + [torch.int16, torch.bool, torch.complex64,
                                                torch.complex128]


def dtype_name(dtype):
    return str(dtype).replace("torch.", "")


def is_byte_carried(dtype):
    return dtype not in _dtypes.TORCH_TO_KOLO


def check_carried_dtype(tensor, op_name):
    if tensor.dtype not in CARRIED_DTYPES:
        raise ValueError("kolo %s does not support dtype %s (supported: %s)"
                         % (op_name, dtype_name(tensor.dtype),
                            ", ".join(dtype_name(d) for d in CARRIED_DTYPES)))


class Desc:
    """What libkolo is told about a tensor: ndim, shape array, kolo dtype."""

    __slots__ = ("ndim", "shape", "kdtype")

    def __init__(self, shape, kdtype):
        shape = [int(d) for d in shape]
        if len(shape) > MAX_DIMS:
            # libkolo takes at most 8 dims: fold the trailing ones, so that the
            # first dimension stays the tensor's own.
            tail = 1
            for d in shape[MAX_DIMS - 1:]:
                tail *= d
            shape = shape[:MAX_DIMS - 1] + [tail]
        self.ndim = len(shape)
        self.shape = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        self.kdtype = kdtype


def describe(tensor):
    """The descriptor of contiguous `tensor` (byte-carried when its dtype is
    not a kolo dtype, see the module docstring)."""
    kd = _dtypes.TORCH_TO_KOLO.get(tensor.dtype)
    if kd is not None:
        return Desc(tensor.shape, kd)
    return Desc(list(tensor.shape) + [tensor.element_size()], _dtypes.KOLO_UINT8)


def _ptr(tensor):
    return ctypes.c_void_p(tensor.data_ptr() or None)


def _raise(st):
    msg = _library.last_error() or _library.status_string(st)
    if st == ERR_INVALID_ARGUMENT:
        raise ValueError(msg)
    raise KoloInternalError(msg, st)


def submit_broadcast(name, buf, root, ps=0):
    """In place on contiguous `buf`: the root's tensor everywhere (`root` is
    a global rank; on process set `ps` it must be one of the set's)."""
    d = describe(buf)
    h = _library.kolo_handle_t(0)
    st = _library.lib().kolo_ps_broadcast_async(int(ps), name.encode("utf-8"), _ptr(buf), d.ndim,
                                                d.shape, d.kdtype, int(root), ctypes.byref(h))
    if st != OK:
        _raise(st)
    return h.value


def submit_allgather(name, tensor, ps=0):
    """Returns once every rank of process set `ps` has called it (libkolo
    exchanges the first dimensions first), so callers run it on a thread of
    its own (_handles.Deferred); `tensor` may be reused then. Read the
    output with take_result() once the handle completed."""
    d = describe(tensor)
    h = _library.kolo_handle_t(0)
    st = _library.lib().kolo_ps_allgather_async(int(ps), name.encode("utf-8"), _ptr(tensor),
                                                d.ndim, d.shape, d.kdtype, ctypes.byref(h))
    if st != OK:
        _raise(st)
    return h.value


class _Group:
    """The C arrays of a grouped submission (names, buffers, dims, shapes,
    dtypes, handles); kept alive by the caller until the call returns."""

    def __init__(self, names, inputs, outputs=None):
        n = len(inputs)
        self.count = n
        descs = [describe(t) for t in inputs]
        self._names = [nm.encode("utf-8") for nm in names]
        self.names = (ctypes.c_char_p * n)(*self._names)
        self.inputs = (ctypes.c_void_p * n)(*[t.data_ptr() or None for t in inputs])
        self.outputs = None if outputs is None else \
            (ctypes.c_void_p * n)(*[t.data_ptr() or None for t in outputs])
        self.ndims = (ctypes.c_int * n)(*[d.ndim for d in descs])
        self._shapes = [d.shape for d in descs]
        self.shapes = (ctypes.POINTER(ctypes.c_int64) * n)(
            *[ctypes.cast(sh, ctypes.POINTER(ctypes.c_int64)) for sh in self._shapes])
        self.dtypes = (ctypes.c_int * n)(*[d.kdtype for d in descs])
        self.handles = (_library.kolo_handle_t * n)()

    def handle_list(self):
        return [int(self.handles[i]) for i in range(self.count)]


def submit_grouped_allreduce(names, inputs, outputs, op, prescale, postscale, ps=0):
    """One atomic group of allreduces (kolo_ps_grouped_allreduce_async):
    none runs before every member is ready on every rank of the set, and
    they are fused. inputs[i] -> outputs[i] (contiguous; may be the same
    tensor), kolo dtypes only. Returns the members' C handles."""
    g = _Group(names, inputs, outputs)
    st = _library.lib().kolo_ps_grouped_allreduce_async(
        int(ps), g.count, g.names, g.inputs, g.outputs, g.ndims, g.shapes, g.dtypes, int(op),
        float(prescale), float(postscale), g.handles)
    if st != OK:
        _raise(st)
    return g.handle_list()


def submit_grouped_allgather(names, tensors, ps=0):
    """One atomic group of allgathers (kolo_ps_grouped_allgather_async).
    Returns, once every rank of the set has called it (run it through
    _handles.Deferred), the members' C handles; read each output with
    take_result()."""
    g = _Group(names, tensors)
    st = _library.lib().kolo_ps_grouped_allgather_async(int(ps), g.count, g.names, g.inputs,
                                                        g.ndims, g.shapes, g.dtypes, g.handles)
    if st != OK:
        _raise(st)
    return g.handle_list()


def submit_grouped_reducescatter(names, inputs, outputs, op, ps=0):
    """One atomic group of reducescatters
    (kolo_ps_grouped_reducescatter_async); outputs[i] holds this rank's
    block of rows of member i. Returns the members' C handles."""
    g = _Group(names, inputs, outputs)
    st = _library.lib().kolo_ps_grouped_reducescatter_async(
        int(ps), g.count, g.names, g.inputs, g.outputs, g.ndims, g.shapes, g.dtypes, int(op),
        g.handles)
    if st != OK:
        _raise(st)
    return g.handle_list()


def submit_alltoall(name, tensor, splits, ps=0):
    """`splits`: a list of one int per rank of the set adding up to
    tensor.shape[0], or None (even). Returns once every rank of the set has
    called it, like submit_allgather (run it through _handles.Deferred
    too)."""
    d = describe(tensor)
    arr = None if splits is None else (ctypes.c_int64 * len(splits))(*[int(s) for s in splits])
    h = _library.kolo_handle_t(0)
    st = _library.lib().kolo_ps_alltoall_async(int(ps), name.encode("utf-8"), _ptr(tensor),
                                               d.ndim, d.shape, d.kdtype, arr, ctypes.byref(h))
    if st != OK:
        _raise(st)
    return h.value


def submit_reducescatter(name, tensor, output, op, ps=0):
    """`output` holds this rank's block of rows (see reducescatter_rows)."""
    d = describe(tensor)
    h = _library.kolo_handle_t(0)
    st = _library.lib().kolo_ps_reducescatter_async(int(ps), name.encode("utf-8"), _ptr(tensor),
                                                    _ptr(output), d.ndim, d.shape, d.kdtype,
                                                    int(op), ctypes.byref(h))
    if st != OK:
        _raise(st)
    return h.value


def reducescatter_rows(dim0, size, rank):
    """Rows of rank `rank`'s block: dim0 // size, plus one for the first
    dim0 % size ranks (libkolo's and Horovod's split)."""
    return dim0 // size + (1 if rank < dim0 % size else 0)


def take_result(handle, tail_shape, dtype):
    """The library-owned output of a completed allgather/alltoall handle,
    copied into a new tensor of shape (rows,) + tail_shape. The caller frees
    the library's copy afterwards (kolo_release)."""
    data = ctypes.c_void_p()
    dim0 = ctypes.c_int64(0)
    st = _library.lib().kolo_result(handle, ctypes.byref(data), ctypes.byref(dim0))
    if st != OK:
        raise KoloInternalError(_library.last_error() or _library.status_string(st), st)
    out = torch.empty((dim0.value,) + tuple(tail_shape), dtype=dtype)
    nbytes = out.numel() * out.element_size()
    if nbytes:
        ctypes.memmove(out.data_ptr(), data.value, nbytes)
    return out


def timeline(start, path="", mark_cycles=False):
    lib = _library.lib()
    if start:
        st = lib.kolo_start_timeline(os.fsencode(path), 1 if mark_cycles else 0)
    else:
        st = lib.kolo_stop_timeline()
    if st == ERR_INVALID_ARGUMENT:
        raise ValueError(_library.last_error() or _library.status_string(st))
    if st != OK:
        raise KoloInternalError(_library.last_error() or _library.status_string(st), st)


def join(timeout_ms=-1):
    last = ctypes.c_int(-1)
    st = _library.lib().kolo_join(int(timeout_ms), ctypes.byref(last))
    if st != OK:
        raise KoloInternalError(_library.last_error() or _library.status_string(st), st)
    return last.value


def barrier(timeout_ms=-1, ps=0):
    st = _library.lib().kolo_ps_barrier(int(ps), int(timeout_ms))
    if st != OK:
        raise KoloInternalError(_library.last_error() or _library.status_string(st), st)
