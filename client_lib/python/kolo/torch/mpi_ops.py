"""Collectives on torch tensors with Horovod's signatures.

Today's libkolo ABI has allreduce only, so:

* allreduce (all variants, grouped too) maps 1:1 onto kolo_allreduce_async;
* broadcast is an allreduce (sum) of the tensor's bytes viewed as int32 (or
  uint8) where every rank but the root contributes zeros: exact for every
  dtype, bit for bit (integer addition of zeros);
* allgather first allreduces a small table of every rank's shape (sizes and
  a consistency check), then allreduces a zero buffer of the gathered size
  into which each rank wrote its own rows (again as integer words: exact);
* barrier is a one-element allreduce;
* alltoall, reducescatter and join raise KoloNotImplementedError until the
  agent implements them natively (issue 5).

All tensors must be CPU tensors. Inputs that are not contiguous are staged
through a contiguous copy. Asynchronous calls return an int handle for
poll() / synchronize(); the tensors passed in must not be modified until
then.
"""

import warnings

import torch

from .. import basics
from ..errors import KoloInternalError, KoloNotImplementedError
from . import _dtypes, _handles, shared
from .compression import Compression
from .process_sets import check as _check_process_set
from .process_sets import global_process_set

# Reduction ops (Horovod's numbering; kolo_op_t).
Average = 0
Sum = 1
Adasum = 2
Min = 3
Max = 4
Product = 5

_OP_NAMES = {Average: "Average", Sum: "Sum", Adasum: "Adasum", Min: "Min", Max: "Max",
             Product: "Product"}

poll = _handles.poll
synchronize = _handles.synchronize


def _resolve_op(op, average, op_name):
    if op is not None and average is not None:
        raise ValueError("kolo %s: give either op or the older average argument, not both" % op_name)
    if op is None:
        if average is not None:
            warnings.warn("the average argument is deprecated; use op=Average or op=Sum",
                          DeprecationWarning, stacklevel=3)
            op = Average if average else Sum
        else:
            op = Average
    if op == Adasum:
        raise KoloNotImplementedError("Adasum", "use op=Average or op=Sum")
    if op not in _OP_NAMES:
        raise ValueError("kolo %s: unknown reduction op %r (Average, Sum, Min, Max or Product)"
                         % (op_name, op))
    return op


def _check_scale(v, what):
    try:
        return float(v)
    except (TypeError, ValueError):
        raise ValueError("%s must be a number, got %r" % (what, v))


def _check_root(root_rank, op_name):
    n = basics.size()
    if not isinstance(root_rank, int) or isinstance(root_rank, bool) or not 0 <= root_rank < n:
        raise ValueError("kolo %s: root_rank must be an int in [0, %d), got %r"
                         % (op_name, n, root_rank))


def _prologue(op_name, process_set):
    _handles.require_init()
    _check_process_set(process_set, op_name)


# --------------------------------------------------------------------------
# allreduce


def _allreduce_gen(tensor, output, name, kdtype, op, prescale, postscale):
    """One allreduce of `tensor` into `output` (both CPU, same shape/dtype;
    output may be tensor). Stages through contiguous copies as needed."""
    src = tensor if tensor.is_contiguous() else tensor.contiguous()
    if output is tensor:
        dst = src
    else:
        dst = output if output.is_contiguous() else torch.empty_like(
            output, memory_format=torch.contiguous_format)
        if shared.is_shared(src):
            # libkolo reduces arena-resident inputs in place; keep the input intact.
            src = src.clone()
    h = _handles.submit_allreduce(name, src, dst, kdtype, op, prescale, postscale)
    yield [h]
    if output is tensor:
        if src is not tensor:
            with torch.no_grad():
                tensor.copy_(src)
        return tensor
    if dst is not output:
        with torch.no_grad():
            output.copy_(dst)
    return output


def _compressed_allreduce_gen(tensor, in_place, name, op, prescale, postscale, compression):
    compressed, ctx = compression.compress(tensor)
    kdtype = _dtypes.check_tensor(compressed, "allreduce")
    if in_place and compressed is tensor:
        result = yield from _allreduce_gen(tensor, tensor, name, kdtype, op, prescale, postscale)
        return result
    if compressed is tensor:
        out = torch.empty(tensor.shape, dtype=tensor.dtype)
        result = yield from _allreduce_gen(tensor, out, name, kdtype, op, prescale, postscale)
        return result
    # compressed is a fresh tensor: reduce it in place, then decompress.
    reduced = yield from _allreduce_gen(compressed, compressed, name, kdtype, op, prescale,
                                        postscale)
    result = compression.decompress(reduced, ctx)
    if in_place:
        with torch.no_grad():
            tensor.copy_(result)
        return tensor
    return result


def _allreduce_start(tensor, in_place, average, name, op, prescale_factor, postscale_factor,
                     process_set, compression, kind="allreduce"):
    _prologue(kind, process_set)
    op = _resolve_op(op, average, kind)
    _dtypes.check_tensor(tensor, kind)
    pre = _check_scale(prescale_factor, "prescale_factor")
    post = _check_scale(postscale_factor, "postscale_factor")
    wire = _handles.op_name("allreduce", name)
    return _handles.start(_compressed_allreduce_gen(tensor, in_place, wire, op, pre, post,
                                                    compression or Compression.none))


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set,
                    compression=Compression.none):
    """Starts an allreduce of `tensor` into a new tensor; returns a handle.
    op: Average (default), Sum, Min, Max or Product. prescale multiplies each
    input before the reduction, postscale the result after it."""
    return _allreduce_start(tensor, False, average, name, op, prescale_factor, postscale_factor,
                            process_set, compression)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set,
                     compression=Compression.none):
    """Starts an in-place allreduce of `tensor`; returns a handle."""
    return _allreduce_start(tensor, True, average, name, op, prescale_factor, postscale_factor,
                            process_set, compression)


class _AllreduceFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale, postscale, compression):
        ctx.op, ctx.prescale, ctx.postscale = op, prescale, postscale
        ctx.compression = compression
        return synchronize(allreduce_async(tensor, name=name, op=op, prescale_factor=prescale,
                                           postscale_factor=postscale, compression=compression))

    @staticmethod
    def backward(ctx, grad_output):
        return (allreduce(grad_output, op=ctx.op, prescale_factor=ctx.prescale,
                          postscale_factor=ctx.postscale, compression=ctx.compression),
                None, None, None, None, None)


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Allreduces `tensor` across all ranks and returns the result (a new
    tensor; differentiable: the gradient is allreduced the same way)."""
    if torch.is_grad_enabled() and torch.is_tensor(tensor) and tensor.requires_grad:
        _prologue("allreduce", process_set)
        op = _resolve_op(op, average, "allreduce")
        return _AllreduceFn.apply(tensor, name, op, prescale_factor, postscale_factor,
                                  compression or Compression.none)
    return synchronize(allreduce_async(tensor, average, name, op, prescale_factor,
                                       postscale_factor, process_set, compression))


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set,
               compression=Compression.none):
    """Allreduces `tensor` in place and returns it."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set, compression))


def _grouped_start(tensors, in_place, average, name, op, prescale_factor, postscale_factor,
                   process_set, compression):
    _prologue("grouped_allreduce", process_set)
    op = _resolve_op(op, average, "grouped_allreduce")
    if not isinstance(tensors, (list, tuple)):
        raise ValueError("kolo grouped_allreduce expects a list of tensors, got %s"
                         % type(tensors).__name__)
    for t in tensors:
        _dtypes.check_tensor(t, "grouped_allreduce")
    pre = _check_scale(prescale_factor, "prescale_factor")
    post = _check_scale(postscale_factor, "postscale_factor")
    base = _handles.op_name("allreduce" if name is not None else "grouped_allreduce", name)
    comp = compression or Compression.none
    gens = [_compressed_allreduce_gen(t, in_place, "%s.%d" % (base, i), op, pre, post, comp)
            for i, t in enumerate(tensors)]
    return _handles.start(_handles.parallel(gens))


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set,
                            compression=Compression.none):
    """Starts allreduces of a list of tensors as one group; synchronize()
    returns the list of results."""
    return _grouped_start(tensors, False, average, name, op, prescale_factor, postscale_factor,
                          process_set, compression)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set,
                             compression=Compression.none):
    """In-place variant of grouped_allreduce_async."""
    return _grouped_start(tensors, True, average, name, op, prescale_factor, postscale_factor,
                          process_set, compression)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Allreduces a list of tensors as one group; returns the list of results."""
    return synchronize(grouped_allreduce_async(tensors, average, name, op, prescale_factor,
                                               postscale_factor, process_set, compression))


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set,
                       compression=Compression.none):
    """Allreduces a list of tensors in place; returns them."""
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set, compression))


# --------------------------------------------------------------------------
# exact byte transport helpers (broadcast and allgather on allreduce)


def _words(t):
    """A view of contiguous tensor `t` as integer words sharing its memory,
    keeping the leading dims (so shape mismatches across ranks are still
    caught by the agent): int32 when the last dim's bytes allow, else uint8.
    The choice depends on the shape and dtype only (the same on every rank);
    `t` must be 4-byte aligned (see _aligned). Returns (view, kolo dtype)."""
    if t.dim() == 0:
        t = t.reshape(1)
    if t.numel() == 0:
        return t.reshape(-1).view(torch.uint8), _dtypes.KOLO_UINT8
    b = t if t.dtype == torch.uint8 else t.view(torch.uint8)
    if b.shape[-1] % 4 == 0:
        return b.view(torch.int32), _dtypes.KOLO_INT32
    return b, _dtypes.KOLO_UINT8


def _aligned(t):
    """`t` if it is contiguous and 4-byte aligned, else an aligned copy."""
    if t.is_contiguous() and t.data_ptr() % 4 == 0:
        return t
    return t.clone(memory_format=torch.contiguous_format)


# --------------------------------------------------------------------------
# broadcast


def _broadcast_gen(tensor, root_rank, name):
    """In place: every rank ends with the root's bytes."""
    work = _aligned(tensor)
    if basics.rank() != root_rank:
        with torch.no_grad():
            work.zero_()
    words, kdtype = _words(work)
    h = _handles.submit_allreduce(name, words, words, kdtype, Sum)
    yield [h]
    if work is not tensor:
        with torch.no_grad():
            tensor.copy_(work)
    return tensor


def _broadcast_start(tensor, root_rank, name, process_set, in_place):
    _prologue("broadcast", process_set)
    _dtypes.check_tensor(tensor, "broadcast", any_dtype=True)
    _check_root(root_rank, "broadcast")
    wire = _handles.op_name("broadcast", name)
    if not in_place:
        if basics.rank() == root_rank:
            target = tensor.detach().clone(memory_format=torch.contiguous_format)
        else:
            target = torch.zeros(tensor.shape, dtype=tensor.dtype)
    else:
        target = tensor
    return _handles.start(_broadcast_gen(target, root_rank, wire))


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts a broadcast of the root's `tensor` into a new tensor on every rank."""
    return _broadcast_start(tensor, root_rank, name, process_set, in_place=False)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts an in-place broadcast of the root's `tensor`."""
    return _broadcast_start(tensor, root_rank, name, process_set, in_place=True)


class _BroadcastFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name):
        ctx.root_rank = root_rank
        return synchronize(broadcast_async(tensor, root_rank, name))

    @staticmethod
    def backward(ctx, grad_output):
        g = allreduce(grad_output, op=Average)
        if basics.rank() != ctx.root_rank:
            g = g * 0
        return g, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Returns the root rank's `tensor` on every rank (a new tensor;
    differentiable: the root receives the averaged gradient)."""
    if torch.is_grad_enabled() and torch.is_tensor(tensor) and tensor.requires_grad:
        _prologue("broadcast", process_set)
        _check_root(root_rank, "broadcast")
        return _BroadcastFn.apply(tensor, root_rank, name)
    return synchronize(broadcast_async(tensor, root_rank, name, process_set))


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """Overwrites `tensor` with the root rank's values, in place; returns it."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


# --------------------------------------------------------------------------
# allgather

_HDR_DIMS = 16  # trailing dims a gathered tensor may have, plus dim 0
# Element types allgather/broadcast can carry (codes are positions + 1).
_ANY_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8,
               torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool,
               torch.complex64, torch.complex128]


def _shape_str(row):
    ndim = row[1]
    return "[%s]" % ", ".join(str(d) for d in [row[0]] + row[3:3 + ndim - 1])


def _allgather_gen(tensor, name):
    """Concatenation of every rank's `tensor` along dim 0 (dim 0 may differ)."""
    n, r = basics.size(), basics.rank()
    # Stage 1: every rank's shape and dtype.
    hdr = torch.zeros((n, 3 + _HDR_DIMS), dtype=torch.int64)
    row = [tensor.shape[0], tensor.dim(), _ANY_DTYPES.index(tensor.dtype) + 1] + \
        list(tensor.shape[1:])
    hdr[r, :len(row)] = torch.tensor(row, dtype=torch.int64)
    h = _handles.submit_allreduce(name + "#shapes", hdr, hdr, _dtypes.KOLO_INT64, Sum)
    yield [h]
    rows = hdr.tolist()
    for q in range(1, n):
        if rows[q][1:] != rows[0][1:]:
            a, b = rows[0], rows[q]
            da = str(_ANY_DTYPES[a[2] - 1]).replace("torch.", "") if 0 < a[2] <= len(
                _ANY_DTYPES) else "?"
            db = str(_ANY_DTYPES[b[2] - 1]).replace("torch.", "") if 0 < b[2] <= len(
                _ANY_DTYPES) else "?"
            raise KoloInternalError(
                "Mismatched ALLGATHER tensors for tensor '%s': rank 0 sent a %s tensor of shape "
                "%s, but rank %d sent a %s tensor of shape %s (all dims but the first, and the "
                "dtype, must agree)" % (name, da, _shape_str(a), q, db, _shape_str(b)))
    dims0 = [row[0] for row in rows]
    # Stage 2: a zero buffer of the gathered size holding our rows.
    out = torch.zeros((sum(dims0),) + tuple(tensor.shape[1:]), dtype=tensor.dtype)
    start = sum(dims0[:r])
    with torch.no_grad():
        out.narrow(0, start, dims0[r]).copy_(tensor)
    words, kdtype = _words(out)
    h = _handles.submit_allreduce(name, words, words, kdtype, Sum)
    yield [h]
    return out


def _check_allgather(tensor, op_name):
    _dtypes.check_tensor(tensor, op_name, any_dtype=True)
    if tensor.dim() == 0:
        raise ValueError("kolo %s: cannot gather a rank-zero (scalar) tensor; reshape it to [1]"
                         % op_name)
    if tensor.dim() > _HDR_DIMS:
        raise ValueError("kolo %s supports tensors of at most %d dims" % (op_name, _HDR_DIMS))
    if tensor.dtype not in _ANY_DTYPES:
        raise ValueError("kolo %s does not support dtype %s" % (op_name, tensor.dtype))


def allgather_async(tensor, name=None, process_set=global_process_set):
    """Starts an allgather: synchronize() returns the concatenation of every
    rank's tensor along dim 0 (dim 0 may differ between ranks)."""
    _prologue("allgather", process_set)
    _check_allgather(tensor, "allgather")
    return _handles.start(_allgather_gen(tensor.detach(), _handles.op_name("allgather", name)))


class _AllgatherFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name):
        ctx.dim0 = tensor.shape[0]
        return synchronize(allgather_async(tensor, name=name))

    @staticmethod
    def backward(ctx, grad_output):
        g = allreduce(grad_output, op=Average)
        dims = allgather(torch.tensor([ctx.dim0], dtype=torch.int64))
        offset = int(dims[:basics.rank()].sum().item())
        return g.narrow(0, offset, ctx.dim0), None


def allgather(tensor, name=None, process_set=global_process_set):
    """Returns the concatenation of every rank's `tensor` along dim 0
    (differentiable)."""
    if torch.is_grad_enabled() and torch.is_tensor(tensor) and tensor.requires_grad:
        _prologue("allgather", process_set)
        _check_allgather(tensor, "allgather")
        return _AllgatherFn.apply(tensor, name)
    return synchronize(allgather_async(tensor, name, process_set))


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    """Starts allgathers of a list of tensors; synchronize() returns a list."""
    _prologue("grouped_allgather", process_set)
    for t in tensors:
        _check_allgather(t, "grouped_allgather")
    base = _handles.op_name("allgather" if name is not None else "grouped_allgather", name)
    gens = [_allgather_gen(t.detach(), "%s.%d" % (base, i)) for i, t in enumerate(tensors)]
    return _handles.start(_handles.parallel(gens))


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """Allgathers a list of tensors; returns the list of results."""
    return synchronize(grouped_allgather_async(tensors, name, process_set))


# --------------------------------------------------------------------------
# sparse allreduce (allgather of indices and values)


def _sparse_gen(tensor, name, op):
    t = tensor.coalesce()
    indices = t.indices().transpose(0, 1).contiguous()
    values = t.values().contiguous()
    g_idx, g_val = yield from _handles.parallel([
        _allgather_gen(indices, name + ".indices"), _allgather_gen(values, name + ".values")])
    if op == Average:
        g_val = g_val / basics.size()
    return torch.sparse_coo_tensor(g_idx.transpose(0, 1), g_val, t.size()).coalesce()


def sparse_allreduce_async(tensor, name=None, op=Average, process_set=global_process_set):
    """Starts an allreduce of a sparse COO tensor (gathers every rank's
    indices and values); synchronize() returns the summed (or averaged)
    sparse tensor."""
    _prologue("sparse_allreduce", process_set)
    if not torch.is_tensor(tensor) or not tensor.is_sparse:
        raise ValueError("kolo sparse_allreduce_async expects a sparse COO tensor")
    if op not in (Average, Sum):
        raise ValueError("kolo sparse_allreduce supports op=Average or op=Sum only")
    return _handles.start(_sparse_gen(tensor.detach(), _handles.op_name("sparse_allreduce", name),
                                      op))


# --------------------------------------------------------------------------
# barrier, and the operations libkolo does not have yet


def barrier(process_set=global_process_set):
    """Returns once every rank has called barrier()."""
    _prologue("barrier", process_set)
    t = torch.zeros(1, dtype=torch.int32)
    _handles.run(_allreduce_gen(t, t, _handles.op_name("barrier", None), _dtypes.KOLO_INT32, Sum,
                                1.0, 1.0))


def _not_yet(op):
    raise KoloNotImplementedError(
        op, "the kolo agent has no %s yet (the C ABI of this libkolo offers allreduce; "
        "allgather, broadcast and barrier are built on it)" % op)


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    _prologue("alltoall", process_set)
    _not_yet("alltoall")


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Scatters slices of `tensor` to every rank and gathers theirs. Not
    available yet: raises KoloNotImplementedError."""
    _prologue("alltoall", process_set)
    _not_yet("alltoall")


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0):
    _prologue("reducescatter", process_set)
    _not_yet("reducescatter")


def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Reduces and scatters `tensor` along dim 0. Not available yet."""
    _prologue("reducescatter", process_set)
    _not_yet("reducescatter")


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0):
    _prologue("grouped_reducescatter", process_set)
    _not_yet("reducescatter")


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    _prologue("grouped_reducescatter", process_set)
    _not_yet("reducescatter")


def join(device=-1):
    """Horovod's join (uneven inputs). Not available yet."""
    _handles.require_init()
    _not_yet("join")
