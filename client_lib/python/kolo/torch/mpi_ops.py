"""Collectives on torch tensors with Horovod's signatures, each on libkolo's
native C ABI (kolo/kolo_c.h):

* allreduce: kolo_ps_allreduce_async; grouped_allreduce (all variants):
  kolo_ps_grouped_allreduce_async, one atomic group;
* broadcast (all variants): kolo_ps_broadcast_async, in place;
* allgather: kolo_ps_allgather_async, output read with kolo_result (dim 0
  may differ per rank); grouped_allgather: kolo_ps_grouped_allgather_async;
* alltoall: kolo_ps_alltoall_async plus an allreduce of the split matrix
  that tells each rank its received splits (both in flight together);
* reducescatter: kolo_ps_reducescatter_async, grouped_reducescatter:
  kolo_ps_grouped_reducescatter_async (Average or Sum; prescale/postscale
  are applied here, around it, since the C ABI has no scale factors);
* barrier: kolo_ps_barrier;
* join is native too (kolo_join, global set only): the last rank to join,
  Horovod semantics.

Every op takes ``process_set=`` (process_sets.py): the set's id goes to the
kolo_ps_* function (0 is the global set) and everything is relative to the
set -- Average divides by its size, the rank order of allgather,
reducescatter and alltoall is the set's, alltoall's splits have one entry
per member, a broadcast root is a global rank in the set. A rank outside
the set gets ValueError.

Grouped ops are atomic (Horovod's semantics): the whole list is one libkolo
submission, negotiated as a unit -- no member runs before every member is
ready on every rank -- and fused; every rank's n-th grouped op on a set must
list the same names. broadcast, allgather and alltoall carry every dtype bit for bit:
the eight kolo dtypes natively, bool/int16/complex as bytes (see
_native.py). kolo_allgather_async and kolo_alltoall_async return only once
every rank has called them (libkolo exchanges sizes/splits first), so they
are submitted from a thread of their own (_handles.Deferred): the *_async
calls here return at once and ranks may issue them in any order.

Tensors may be CPU or CUDA tensors (_cuda.py): allreduce, grouped_allreduce
and broadcast of CUDA tensors take libkolo's device path, ordered on the
tensor device's current stream; the other collectives (and every one when
this rank has no device arena) stage CUDA tensors through pinned host
memory, ordered on that stream too. Inputs that are not contiguous are
staged through a contiguous copy. Asynchronous calls return an int handle for
poll() / synchronize(); the tensors passed in must not be modified until
then.
"""

import warnings

import torch

from .. import basics
from ..errors import KoloInternalError, KoloNotImplementedError
from . import _cuda, _dtypes, _handles, _native, shared
from . import adasum as _adasum
from .compression import Compression
from .process_sets import global_process_set
from .process_sets import resolve as _resolve_set

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


def _resolve_op(op, average, op_name, adasum=False):
    if op is not None and average is not None:
        raise ValueError("kolo %s: give either op or the older average argument, not both" % op_name)
    if op is None:
        if average is not None:
            warnings.warn("the average argument is deprecated; use op=Average or op=Sum",
                          DeprecationWarning, stacklevel=3)
            op = Average if average else Sum
        else:
            op = Average
    if op == Adasum and not adasum:
        raise KoloNotImplementedError("Adasum in %s" % op_name,
                                      "use allreduce(op=Adasum), op=Average or op=Sum")
    if op not in _OP_NAMES:
        raise ValueError("kolo %s: unknown reduction op %r (Average, Sum, Min, Max or Product)"
                         % (op_name, op))
    return op


def _named(name, wires):
    """The wire names to hold while the op is in flight (user-named ops
    only: a second op of that name on this rank raises ValueError then)."""
    return wires if name is not None else ()


def _check_scale(v, what):
    try:
        return float(v)
    except (TypeError, ValueError):
        raise ValueError("%s must be a number, got %r" % (what, v))


def _check_root(root_rank, op_name, pset=None):
    """root_rank is a global rank; on a process set (`pset`, a SetInfo) it
    must be one of the set's ranks (Horovod's convention)."""
    n = basics.size()
    if not isinstance(root_rank, int) or isinstance(root_rank, bool) or not 0 <= root_rank < n:
        raise ValueError("kolo %s: root_rank must be an int in [0, %d), got %r"
                         % (op_name, n, root_rank))
    if pset is not None and pset.id != 0 and root_rank not in pset.ranks:
        raise ValueError("kolo %s: broadcast root rank %d is not in process set %d (ranks %s); "
                         "the root is a global rank of the set" % (op_name, root_rank, pset.id,
                                                                   pset.ranks))


def _prologue(op_name, process_set):
    """Checks that kolo is initialized; returns the op's process set as a
    process_sets.SetInfo (id, this rank's set rank, set size, ranks).
    Raises ValueError on a rank outside the set."""
    _handles.require_init()
    return _resolve_set(process_set, op_name)


# --------------------------------------------------------------------------
# allreduce


def _allreduce_gen(tensor, output, name, kdtype, op, prescale, postscale, ps=0):
    """One allreduce of `tensor` into `output` (same device, shape and dtype;
    output may be tensor). Stages through contiguous copies as needed. CUDA
    tensors (the device route) are copied on the current stream of their
    device, which the current stream at synchronize() then waits for."""
    src = tensor if tensor.is_contiguous() else tensor.contiguous()
    if output is tensor:
        dst = src
    else:
        dst = output if output.is_contiguous() else torch.empty_like(
            output, memory_format=torch.contiguous_format)
        if shared.is_shared(src):
            # libkolo reduces arena-resident inputs in place; keep the input intact.
            src = src.clone()
    stream = _cuda.set_stream(src.device) if src.is_cuda else None
    h = _handles.submit_allreduce(name, src, dst, kdtype, op, prescale, postscale, ps)
    yield [h]
    _cuda.join_stream(stream)
    if output is tensor:
        if src is not tensor:
            with torch.no_grad():
                tensor.copy_(src)
        return tensor
    if dst is not output:
        with torch.no_grad():
            output.copy_(dst)
    return output


def _compressed_allreduce_gen(tensor, in_place, name, op, prescale, postscale, compression,
                              ps=0):
    compressed, ctx = compression.compress(tensor)
    kdtype = _dtypes.check_tensor(compressed, "allreduce")
    if in_place and compressed is tensor:
        result = yield from _allreduce_gen(tensor, tensor, name, kdtype, op, prescale, postscale,
                                           ps)
        return result
    if compressed is tensor:
        out = torch.empty(tensor.shape, dtype=tensor.dtype, device=tensor.device)
        result = yield from _allreduce_gen(tensor, out, name, kdtype, op, prescale, postscale, ps)
        return result
    # compressed is a fresh tensor: reduce it in place, then decompress.
    reduced = yield from _allreduce_gen(compressed, compressed, name, kdtype, op, prescale,
                                        postscale, ps)
    result = compression.decompress(reduced, ctx)
    if in_place:
        with torch.no_grad():
            tensor.copy_(result)
        return tensor
    return result


def _adasum_gen(tensor, in_place, name, prescale, postscale, compression, ps):
    """Adasum (see adasum.py): every rank's tensor gathered over the set,
    then the same tree evaluated on every rank."""
    compressed, ctx = compression.compress(tensor)
    _adasum.check_dtype(compressed, "allreduce")
    src = compressed.detach().reshape(1, -1)
    if prescale != 1.0:
        src = _scaled(src, prescale)
    rows = yield from _allgather_gen(src, name, ps)
    out = _adasum.tree(rows).reshape(tensor.shape)
    if postscale != 1.0:
        out = _scaled(out, postscale)
    result = compression.decompress(out, ctx)
    if in_place:
        with torch.no_grad():
            tensor.copy_(result)
        return tensor
    return result


def _allreduce_start(tensor, in_place, average, name, op, prescale_factor, postscale_factor,
                     process_set, compression, kind="allreduce"):
    pset = _prologue(kind, process_set)
    op = _resolve_op(op, average, kind, adasum=True)
    _dtypes.check_tensor(tensor, kind)
    pre = _check_scale(prescale_factor, "prescale_factor")
    post = _check_scale(postscale_factor, "postscale_factor")
    compression = compression or Compression.none
    route = _cuda.route([tensor], kind, device_capable=op != Adasum)
    if op == Adasum:
        wire = _handles.op_name("allreduce", name, _GATHER_NAME_BYTES, ps=pset.id)

        def make(t, ip):
            return _adasum_gen(t, ip, wire, pre, post, compression, pset.id)
    else:
        wire = _handles.op_name("allreduce", name, ps=pset.id)

        def make(t, ip):
            return _compressed_allreduce_gen(t, ip, wire, op, pre, post, compression, pset.id)
    if route == _cuda.STAGED:
        gen = _cuda.staged(lambda hosts: make(hosts[0], in_place), [tensor],
                           _staged_finish([tensor], in_place), _handles)
    else:
        gen = make(tensor, in_place)
    return _handles.start(gen, _named(name, [wire]), pset.id)


def _staged_finish(tensors, in_place):
    return _cuda.finish_in_place(tensors) if in_place else _cuda.finish_new(tensors)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set,
                    compression=Compression.none):
    """Starts an allreduce of `tensor` into a new tensor; returns a handle.
    op: Average (default; divides by the process set's size), Sum, Min, Max
    or Product. prescale multiplies each input before the reduction,
    postscale the result after it. process_set: the ranks taking part
    (default every rank)."""
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
    def forward(ctx, tensor, name, op, prescale, postscale, compression, process_set):
        ctx.op, ctx.prescale, ctx.postscale = op, prescale, postscale
        ctx.compression, ctx.process_set = compression, process_set
        return synchronize(allreduce_async(tensor, name=name, op=op, prescale_factor=prescale,
                                           postscale_factor=postscale, compression=compression,
                                           process_set=process_set))

    @staticmethod
    def backward(ctx, grad_output):
        return (allreduce(grad_output, op=ctx.op, prescale_factor=ctx.prescale,
                          postscale_factor=ctx.postscale, compression=ctx.compression,
                          process_set=ctx.process_set),
                None, None, None, None, None, None)


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Allreduces `tensor` across the ranks of `process_set` (default all)
    and returns the result (a new tensor; differentiable: the gradient is
    allreduced the same way)."""
    if torch.is_grad_enabled() and torch.is_tensor(tensor) and tensor.requires_grad:
        _prologue("allreduce", process_set)
        op = _resolve_op(op, average, "allreduce", adasum=True)
        return _AllreduceFn.apply(tensor, name, op, prescale_factor, postscale_factor,
                                  compression or Compression.none, process_set)
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
    pset = _prologue("grouped_allreduce", process_set)
    op = _resolve_op(op, average, "grouped_allreduce")
    if not isinstance(tensors, (list, tuple)):
        raise ValueError("kolo grouped_allreduce expects a list of tensors, got %s"
                         % type(tensors).__name__)
    for t in tensors:
        _dtypes.check_tensor(t, "grouped_allreduce")
    pre = _check_scale(prescale_factor, "prescale_factor")
    post = _check_scale(postscale_factor, "postscale_factor")
    base = _handles.op_name("allreduce" if name is not None else "grouped_allreduce", name,
                            _handles.MAX_NAME_BYTES - 4, ps=pset.id)
    names = [_handles.fit_name("%s.%d" % (base, i)) for i in range(len(tensors))]
    compression = compression or Compression.none
    tensors = list(tensors)
    if _cuda.route(tensors, "grouped_allreduce") == _cuda.STAGED:
        gen = _cuda.staged(lambda hosts: _grouped_allreduce_gen(hosts, in_place, names, op, pre,
                                                                post, compression, pset.id),
                           tensors, _staged_finish(tensors, in_place), _handles)
    else:
        gen = _grouped_allreduce_gen(tensors, in_place, names, op, pre, post, compression,
                                     pset.id)
    return _handles.start(gen, _named(name, names), pset.id)


def _grouped_allreduce_gen(tensors, in_place, names, op, prescale, postscale, compression, ps):
    """One atomic grouped allreduce (kolo_ps_grouped_allreduce_async):
    each tensor is compressed first, staged through a contiguous copy if
    needed, and all go out in one submission."""
    if not tensors:
        return []
    members, srcs, dsts = [], [], []
    for t in tensors:
        c, cctx = compression.compress(t)
        _dtypes.check_tensor(c, "grouped_allreduce")
        src = _contiguous(c)
        if c is not t or in_place:
            dst = src  # a fresh (compressed or staged) tensor, or in place: reduce in place
        else:
            dst = torch.empty(t.shape, dtype=t.dtype, device=t.device)
            if shared.is_shared(src):
                # libkolo reduces arena-resident inputs in place; keep the input intact.
                src = src.clone()
        members.append((t, c, cctx, src, dst))
        srcs.append(src)
        dsts.append(dst)
    stream = _cuda.set_stream(srcs[0].device) if srcs[0].is_cuda else None
    handles = _native.submit_grouped_allreduce(names, srcs, dsts, op, prescale, postscale, ps)
    yield handles
    _cuda.join_stream(stream)
    results = []
    for t, c, cctx, src, dst in members:
        out = dst if c is t else compression.decompress(dst, cctx)
        if in_place:
            if out is not t:
                with torch.no_grad():
                    t.copy_(out)
            out = t
        results.append(out)
    return results


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set,
                            compression=Compression.none):
    """Starts an allreduce of a list of tensors as one atomic group (one
    libkolo submission, fused; none runs before all are ready on every rank
    of the set); synchronize() returns the list of results. Compression is
    applied to each tensor before."""
    return _grouped_start(tensors, False, average, name, op, prescale_factor, postscale_factor,
                          process_set, compression)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set,
                             compression=Compression.none):
    """In-place variant of grouped_allreduce_async."""
    return _grouped_start(tensors, True, average, name, op, prescale_factor, postscale_factor,
                          process_set, compression)


def _needs_grad(tensors):
    return torch.is_grad_enabled() and isinstance(tensors, (list, tuple)) and any(
        torch.is_tensor(t) and t.requires_grad for t in tensors)


class _GroupedAllreduceFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, average, name, op, prescale, postscale, process_set, *tensors):
        ctx.average, ctx.op, ctx.prescale, ctx.postscale = average, op, prescale, postscale
        ctx.process_set = process_set
        return tuple(synchronize(grouped_allreduce_async(
            list(tensors), average, name, op, prescale, postscale, process_set)))

    @staticmethod
    def backward(ctx, *grad_output):
        g = grouped_allreduce(list(grad_output), average=ctx.average, op=ctx.op,
                              prescale_factor=ctx.prescale, postscale_factor=ctx.postscale,
                              process_set=ctx.process_set)
        return (None, None, None, None, None, None) + tuple(g)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Allreduces a list of tensors as one group; returns the list of results
    (differentiable: the gradients are grouped-allreduced the same way)."""
    if _needs_grad(tensors):
        _prologue("grouped_allreduce", process_set)
        if op is None and average is None:
            op = Average
        compression = compression or Compression.none
        pairs = [compression.compress(t) for t in tensors]
        outs = _GroupedAllreduceFn.apply(average, name, op, prescale_factor, postscale_factor,
                                         process_set, *[c for c, _ in pairs])
        return [compression.decompress(o, cctx) for o, (_, cctx) in zip(outs, pairs)]
    return synchronize(grouped_allreduce_async(tensors, average, name, op, prescale_factor,
                                               postscale_factor, process_set, compression))


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set,
                       compression=Compression.none):
    """Allreduces a list of tensors in place; returns them."""
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set, compression))


# --------------------------------------------------------------------------
# shared by broadcast, allgather, alltoall and reducescatter

# libkolo appends "<name>.__sizes" (allgather) and "<name>.__splits"
# (alltoall) for its internal exchanges; alltoall here adds "<name>.__kolo_recv".
_GATHER_NAME_BYTES = _handles.MAX_NAME_BYTES - len(".__sizes")
_RECV_SUFFIX = ".__kolo_recv"
_ALLTOALL_NAME_BYTES = _handles.MAX_NAME_BYTES - len(_RECV_SUFFIX)


def _contiguous(t):
    return t if t.is_contiguous() else t.contiguous()


def _check_dim0(tensor, op_name):
    if tensor.dim() == 0:
        raise ValueError("kolo %s: cannot %s a rank-zero (scalar) tensor; it works along the "
                         "first dimension (reshape it to [1])" % (op_name, op_name))


# --------------------------------------------------------------------------
# broadcast (kolo_broadcast_async)


def _broadcast_gen(tensor, root_rank, name, ps=0):
    """In place: every rank ends with the root's tensor, bit for bit."""
    work = _contiguous(tensor)
    stream = _cuda.set_stream(work.device) if work.is_cuda else None
    h = _native.submit_broadcast(name, work, root_rank, ps)
    yield [h]
    _cuda.join_stream(stream)
    if work is not tensor:
        with torch.no_grad():
            tensor.copy_(work)
    return tensor


def _broadcast_start(tensor, root_rank, name, process_set, in_place):
    pset = _prologue("broadcast", process_set)
    _dtypes.check_tensor(tensor, "broadcast", any_dtype=True)
    _native.check_carried_dtype(tensor, "broadcast")
    _check_root(root_rank, "broadcast", pset)
    wire = _handles.op_name("broadcast", name, ps=pset.id)
    if in_place:
        target = tensor
    elif basics.rank() == root_rank:
        target = tensor.detach().clone(memory_format=torch.contiguous_format)
    else:
        target = torch.empty(tensor.shape, dtype=tensor.dtype, device=tensor.device)
    if _cuda.route([target], "broadcast") == _cuda.STAGED:
        gen = _cuda.staged(lambda hosts: _broadcast_gen(hosts[0], root_rank, wire, pset.id),
                           [target], _cuda.finish_in_place([target]), _handles)
    else:
        gen = _broadcast_gen(target, root_rank, wire, pset.id)
    return _handles.start(gen, _named(name, [wire]), pset.id)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts a broadcast of the root's `tensor` into a new tensor on every
    rank (of `process_set`; root_rank is a global rank in the set);
    synchronize() returns it."""
    return _broadcast_start(tensor, root_rank, name, process_set, in_place=False)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts an in-place broadcast of the root's `tensor`; synchronize()
    returns `tensor`."""
    return _broadcast_start(tensor, root_rank, name, process_set, in_place=True)


class _BroadcastFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return synchronize(broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        g = allreduce(grad_output, op=Average, process_set=ctx.process_set)
        if basics.rank() != ctx.root_rank:
            g = g * 0
        return g, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Returns the root rank's `tensor` on every rank (a new tensor;
    differentiable: the root receives the averaged gradient)."""
    if torch.is_grad_enabled() and torch.is_tensor(tensor) and tensor.requires_grad:
        pset = _prologue("broadcast", process_set)
        _check_root(root_rank, "broadcast", pset)
        return _BroadcastFn.apply(tensor, root_rank, name, process_set)
    return synchronize(broadcast_async(tensor, root_rank, name, process_set))


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """Overwrites `tensor` with the root rank's values, in place; returns it."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


# --------------------------------------------------------------------------
# allgather (kolo_allgather_async + kolo_result)


def _allgather_gen(tensor, name, ps=0):
    """Concatenation of every rank's `tensor` along dim 0 (dim 0 may differ).
    The submission waits for every rank (libkolo exchanges the first
    dimensions first), so it runs on a thread of its own (Deferred)."""
    src = _contiguous(tensor)
    sub = _handles.Deferred(lambda: _native.submit_allgather(name, src, ps))
    try:
        yield [sub]
        return _native.take_result(sub.handle, tensor.shape[1:], tensor.dtype)
    finally:
        sub.abandon()  # frees libkolo's copy of the output


def _check_allgather(tensor, op_name):
    _dtypes.check_tensor(tensor, op_name, any_dtype=True)
    _native.check_carried_dtype(tensor, op_name)
    _check_dim0(tensor, "allgather")


def allgather_async(tensor, name=None, process_set=global_process_set):
    """Starts an allgather: synchronize() returns the concatenation of every
    rank's tensor along dim 0 (dim 0 may differ between ranks), in the rank
    order of `process_set` (ascending global rank)."""
    pset = _prologue("allgather", process_set)
    _check_allgather(tensor, "allgather")
    wire = _handles.op_name("allgather", name, _GATHER_NAME_BYTES, ps=pset.id)
    t = tensor.detach()
    if _cuda.route([t], "allgather", device_capable=False) == _cuda.STAGED:
        gen = _cuda.staged(lambda hosts: _allgather_gen(hosts[0], wire, pset.id), [t],
                           _cuda.finish_new([t]), _handles)
    else:
        gen = _allgather_gen(t, wire, pset.id)
    return _handles.start(gen, _named(name, [wire]), pset.id)


class _AllgatherFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.dim0, ctx.process_set = tensor.shape[0], process_set
        return synchronize(allgather_async(tensor, name=name, process_set=process_set))

    @staticmethod
    def backward(ctx, grad_output):
        ps = ctx.process_set
        g = allreduce(grad_output, op=Average, process_set=ps)
        dims = allgather(torch.tensor([ctx.dim0], dtype=torch.int64), process_set=ps)
        set_rank = _prologue("allgather", ps).rank
        offset = int(dims[:set_rank].sum().item())
        return g.narrow(0, offset, ctx.dim0), None, None


def allgather(tensor, name=None, process_set=global_process_set):
    """Returns the concatenation of every rank's `tensor` along dim 0
    (differentiable)."""
    if torch.is_grad_enabled() and torch.is_tensor(tensor) and tensor.requires_grad:
        _prologue("allgather", process_set)
        _check_allgather(tensor, "allgather")
        return _AllgatherFn.apply(tensor, name, process_set)
    return synchronize(allgather_async(tensor, name, process_set))


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    """Starts an allgather of a list of tensors as one atomic group
    (kolo_ps_grouped_allgather_async: the first dimensions of all members
    are exchanged in one step, then the gathers run); synchronize() returns
    the list of results. Like allgather_async it returns at once; the
    submission waits for the other ranks on a thread of its own."""
    pset = _prologue("grouped_allgather", process_set)
    if not isinstance(tensors, (list, tuple)):
        raise ValueError("kolo grouped_allgather expects a list of tensors, got %s"
                         % type(tensors).__name__)
    for t in tensors:
        _check_allgather(t, "grouped_allgather")
    base = _handles.op_name("allgather" if name is not None else "grouped_allgather", name,
                            ps=pset.id)
    names = [_handles.fit_name("%s.%d" % (base, i), _GATHER_NAME_BYTES)
             for i in range(len(tensors))]
    ts = [t.detach() for t in tensors]
    if _cuda.route(ts, "grouped_allgather", device_capable=False) == _cuda.STAGED:
        gen = _cuda.staged(lambda hosts: _grouped_allgather_gen(hosts, names, pset.id), ts,
                           _cuda.finish_new(ts), _handles)
    else:
        gen = _grouped_allgather_gen(ts, names, pset.id)
    return _handles.start(gen, _named(name, names), pset.id)


def _grouped_allgather_gen(tensors, names, ps):
    if not tensors:
        return []
    srcs = [_contiguous(t) for t in tensors]
    sub = _handles.Deferred(lambda: _native.submit_grouped_allgather(names, srcs, ps))
    try:
        yield [sub]
        return [_native.take_result(h, t.shape[1:], t.dtype)
                for h, t in zip(sub.handles(), tensors)]
    finally:
        sub.abandon()  # frees libkolo's copies of the outputs


class _GroupedAllgatherFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        ctx.dims = [t.shape[0] for t in tensors]
        ctx.process_set = process_set
        return tuple(synchronize(grouped_allgather_async(list(tensors), name, process_set)))

    @staticmethod
    def backward(ctx, *grad_output):
        ps = ctx.process_set
        reduced = grouped_allreduce(list(grad_output), op=Average, process_set=ps)
        dims = grouped_allgather([torch.tensor([d], dtype=torch.int64) for d in ctx.dims],
                                 process_set=ps)
        r = _prologue("grouped_allgather", ps).rank
        offsets = [int(d[:r].sum().item()) for d in dims]
        return (None, None) + tuple(g.narrow(0, o, d)
                                    for g, o, d in zip(reduced, offsets, ctx.dims))


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """Allgathers a list of tensors; returns the list of results
    (differentiable, as allgather)."""
    if _needs_grad(tensors):
        _prologue("grouped_allgather", process_set)
        for t in tensors:
            _check_allgather(t, "grouped_allgather")
        return list(_GroupedAllgatherFn.apply(name, process_set, *tensors))
    return synchronize(grouped_allgather_async(tensors, name, process_set))


# --------------------------------------------------------------------------
# alltoall (kolo_alltoall_async + kolo_result)


def _normalize_splits(tensor, splits, op_name="alltoall", n=None):
    """The list of `n` (the set's size; default size()) non-negative ints
    to send to each rank (even when splits is None); their sum may be below
    dim 0 (the rest is not sent), as with Horovod."""
    n = basics.size() if n is None else n
    d0 = tensor.shape[0]
    if splits is None:
        if d0 % n != 0:
            raise ValueError("kolo %s: without splits the first dimension (%d) must divide "
                             "evenly by the number of ranks (%d)" % (op_name, d0, n))
        return [d0 // n] * n
    if torch.is_tensor(splits):
        if splits.dim() != 1 or splits.dtype.is_floating_point or splits.is_complex():
            raise ValueError("kolo %s: splits must be a 1-D integer tensor or a list of ints, "
                             "got a %s tensor of shape %s" % (op_name, splits.dtype,
                                                              list(splits.shape)))
        splits = splits.tolist()
    try:
        sp = [int(s) for s in splits]
        if any(isinstance(s, bool) or int(s) != s for s in splits):
            raise TypeError
    except (TypeError, ValueError):
        raise ValueError("kolo %s: splits must be a list of ints, got %r" % (op_name, splits))
    if len(sp) != n:
        raise ValueError("kolo %s: splits has %d entries; it needs one per rank (%d)"
                         % (op_name, len(sp), n))
    if any(s < 0 for s in sp):
        raise ValueError("kolo %s: splits must not be negative, got %s" % (op_name, sp))
    if sum(sp) > d0:
        raise ValueError("kolo %s: the splits add up to %d rows, more than the first dimension "
                         "of the tensor (%d)" % (op_name, sum(sp), d0))
    return sp


def _alltoall_gen(tensor, splits, name, pset):
    """(output, received_splits): rank r sends splits[d] rows to rank d and
    receives every rank's rows for it, from rank 0 up. Besides the native
    alltoall (whose own exchange of the split matrix stays inside libkolo) an
    allreduce of the split matrix gives this rank the received splits; both
    are in flight together. On a process set, ranks are the set's."""
    n, r, ps = pset.size, pset.rank, pset.id
    src = _contiguous(tensor)
    if sum(splits) < src.shape[0]:
        src = src.narrow(0, 0, sum(splits))  # the rows after the splits are not sent
    matrix = torch.zeros((n, n), dtype=torch.int64)
    matrix[r] = torch.tensor(splits, dtype=torch.int64)
    hm = _handles.submit_allreduce(name + _RECV_SUFFIX, matrix, matrix, _dtypes.KOLO_INT64, Sum,
                                   ps=ps)
    try:
        sub = _handles.Deferred(lambda: _native.submit_alltoall(name, src, splits, ps))
    except BaseException:
        _handles.release_c_handles([hm])
        raise
    try:
        yield [hm, sub]
        received = matrix[:, r].to(torch.int32)
        out = _native.take_result(sub.handle, tensor.shape[1:], tensor.dtype)
        if out.shape[0] != int(received.sum()):
            raise KoloInternalError("alltoall of tensor '%s': received %d rows, but the ranks' "
                                    "splits add up to %d" % (name, out.shape[0],
                                                             int(received.sum())))
        return out, received
    finally:
        sub.abandon()  # frees libkolo's copy of the output


def _alltoall_prepare(tensor, splits, op_name, pset):
    _dtypes.check_tensor(tensor, op_name, any_dtype=True)
    _native.check_carried_dtype(tensor, op_name)
    _check_dim0(tensor, "alltoall")
    return _normalize_splits(tensor, splits, op_name, pset.size)


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Starts an alltoall; synchronize() returns (output, received_splits)
    (an int32 tensor: the rows received from each rank). `splits` (a list or
    1-D integer tensor, one entry per rank of `process_set`, in the set's
    rank order) says how many rows along dim 0 go to each rank; None splits
    dim 0 evenly."""
    pset = _prologue("alltoall", process_set)
    sp = _alltoall_prepare(tensor, splits, "alltoall", pset)
    wire = _handles.op_name("alltoall", name, _ALLTOALL_NAME_BYTES, ps=pset.id)
    t = tensor.detach()
    if _cuda.route([t], "alltoall", device_capable=False) == _cuda.STAGED:
        # The received splits stay a CPU tensor (as Horovod's).
        gen = _cuda.staged(lambda hosts: _alltoall_gen(hosts[0], sp, wire, pset), [t],
                           lambda res: (_cuda.to_device(res[0], t), res[1]), _handles)
    else:
        gen = _alltoall_gen(t, sp, wire, pset)
    return _handles.start(gen, _named(name, [wire]), pset.id)


class _AlltoallFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        ctx.dim0, ctx.process_set = tensor.shape[0], process_set
        out, received = synchronize(alltoall_async(tensor, splits, name, process_set))
        ctx.received = received.tolist()
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx, grad_output, grad_received):
        g, _ = synchronize(alltoall_async(grad_output, ctx.received,
                                          process_set=ctx.process_set))
        if g.shape[0] < ctx.dim0:  # rows that were not sent get no gradient
            g = torch.cat([g, g.new_zeros((ctx.dim0 - g.shape[0],) + tuple(g.shape[1:]))])
        return g, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Sends splits[d] rows of `tensor` (along dim 0, in order) to each rank
    d and returns the rows every rank sent this one, concatenated in rank
    order. With `splits` given returns (output, received_splits), without
    (even split) the output only -- Horovod's convention. Differentiable."""
    if torch.is_grad_enabled() and torch.is_tensor(tensor) and tensor.requires_grad:
        pset = _prologue("alltoall", process_set)
        sp = _alltoall_prepare(tensor, splits, "alltoall", pset)
        out, received = _AlltoallFn.apply(tensor, sp, name, process_set)
    else:
        out, received = synchronize(alltoall_async(tensor, splits, name, process_set))
    return out if splits is None else (out, received)


# --------------------------------------------------------------------------
# reducescatter (kolo_reducescatter_async)


def _scaled(t, factor):
    """t * factor as Horovod scales a buffer on the CPU (ScaleBufferCPUImpl),
    bit for bit: float32 multiplies by the factor rounded to float32,
    float16/bfloat16 the same in float32 then round back, float64 in
    float64, integers in float64 truncated toward zero."""
    if t.dtype == torch.float64:
        return t * factor
    if t.dtype == torch.float32:
        return t * torch.tensor(factor, dtype=torch.float32)
    if t.dtype in (torch.float16, torch.bfloat16):
        return (t.to(torch.float32) * torch.tensor(factor, dtype=torch.float32)).to(t.dtype)
    return (t.to(torch.float64) * factor).to(t.dtype)


def _rs_native_op(op, postscale, size):
    """(op submitted, factor applied after it). Average with a postscale is a
    Sum followed by one scaling by postscale / size -- Horovod's own
    arithmetic; without one the agent's Average already scales by 1 / size
    exactly so (and still tells a Sum from an Average across ranks)."""
    if op == Average and postscale != 1.0:
        return Sum, postscale / size
    return op, postscale


def _reducescatter_prepare(tensor, prescale, pset):
    """(input, output) of one reducescatter: the input scaled by prescale
    (a copy) and contiguous, and an output for this rank's block of rows:
    dim0 // size rows, plus one on the first dim0 % size ranks (of the
    set). The C ABI has no scale factors: prescale is applied here."""
    src = _scaled(tensor, prescale) if prescale != 1.0 else _contiguous(tensor)
    src = _contiguous(src)
    rows = _native.reducescatter_rows(src.shape[0], pset.size, pset.rank)
    return src, torch.empty((rows,) + tuple(src.shape[1:]), dtype=src.dtype)


def _reducescatter_gen(tensor, name, op, prescale, postscale, pset):
    """This rank's block of rows of the reduction over the set; postscale
    multiplies the output."""
    src, out = _reducescatter_prepare(tensor, prescale, pset)
    op, post = _rs_native_op(op, postscale, pset.size)
    h = _native.submit_reducescatter(name, src, out, op, pset.id)
    yield [h]
    if post != 1.0:
        out = _scaled(out, post)
    return out


def _resolve_rs_op(op, op_name):
    if op == Adasum:
        raise KoloNotImplementedError("Adasum", "use op=Average or op=Sum")
    if op not in (Average, Sum):
        raise ValueError("kolo %s: op must be Average or Sum, got %s"
                         % (op_name, _OP_NAMES.get(op, repr(op))))
    return op


def _check_reducescatter(tensor, op_name):
    _dtypes.check_tensor(tensor, op_name)
    _check_dim0(tensor, "reducescatter")


def _reducescatter_start(tensor, name, op, prescale_factor, postscale_factor, process_set):
    pset = _prologue("reducescatter", process_set)
    op = _resolve_rs_op(op, "reducescatter")
    _check_reducescatter(tensor, "reducescatter")
    pre = _check_scale(prescale_factor, "prescale_factor")
    post = _check_scale(postscale_factor, "postscale_factor")
    wire = _handles.op_name("reducescatter", name, ps=pset.id)
    t = tensor.detach()
    if _cuda.route([t], "reducescatter", device_capable=False) == _cuda.STAGED:
        gen = _cuda.staged(lambda hosts: _reducescatter_gen(hosts[0], wire, op, pre, post, pset),
                           [t], _cuda.finish_new([t]), _handles)
    else:
        gen = _reducescatter_gen(t, wire, op, pre, post, pset)
    return _handles.start(gen, _named(name, [wire]), pset.id)


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0):
    """Starts a reducescatter; synchronize() returns this rank's block of
    rows of the reduced tensor (dim0 // size rows, plus one on the first
    dim0 % size ranks; size and ranks of `process_set`). op: Average
    (default; divides by the set's size) or Sum."""
    return _reducescatter_start(tensor, name, op, prescale_factor, postscale_factor, process_set)


class _ReducescatterFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale, postscale, process_set):
        n = _prologue("reducescatter", process_set).size
        # Horovod's gradient: Sum multiplies by the set's size, Average not;
        # then the prescale and the postscale, one after the other.
        ctx.scales = [f for f in ((n if op == Sum else 1), prescale, postscale) if f != 1]
        ctx.process_set = process_set
        return synchronize(reducescatter_async(tensor, name, op, process_set,
                                               prescale_factor=prescale,
                                               postscale_factor=postscale))

    @staticmethod
    def backward(ctx, grad_output):
        for f in ctx.scales:
            grad_output = grad_output * f
        return allgather(grad_output, process_set=ctx.process_set), None, None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Reduces `tensor` across ranks (every rank passes the same shape) and
    returns this rank's block of rows of the result (differentiable)."""
    _prologue("reducescatter", process_set)
    op = _resolve_rs_op(op, "reducescatter")
    _check_reducescatter(tensor, "reducescatter")
    compression = compression or Compression.none
    compressed, cctx = compression.compress(tensor)
    if torch.is_grad_enabled() and compressed.requires_grad:
        pre = _check_scale(prescale_factor, "prescale_factor")
        post = _check_scale(postscale_factor, "postscale_factor")
        out = _ReducescatterFn.apply(compressed, name, op, pre, post, process_set)
    else:
        out = synchronize(reducescatter_async(compressed, name, op, process_set, prescale_factor,
                                              postscale_factor))
    return compression.decompress(out, cctx)


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0):
    """Starts a reducescatter of a list of tensors as one atomic group
    (kolo_ps_grouped_reducescatter_async); synchronize() returns the list of
    this rank's blocks."""
    pset = _prologue("grouped_reducescatter", process_set)
    op = _resolve_rs_op(op, "grouped_reducescatter")
    if not isinstance(tensors, (list, tuple)):
        raise ValueError("kolo grouped_reducescatter expects a list of tensors, got %s"
                         % type(tensors).__name__)
    for t in tensors:
        _check_reducescatter(t, "grouped_reducescatter")
    pre = _check_scale(prescale_factor, "prescale_factor")
    post = _check_scale(postscale_factor, "postscale_factor")
    base = _handles.op_name("reducescatter" if name is not None else "grouped_reducescatter", name,
                            ps=pset.id)
    names = [_handles.fit_name("%s.%d" % (base, i)) for i in range(len(tensors))]
    ts = [t.detach() for t in tensors]
    if _cuda.route(ts, "grouped_reducescatter", device_capable=False) == _cuda.STAGED:
        gen = _cuda.staged(lambda hosts: _grouped_reducescatter_gen(hosts, names, op, pre, post,
                                                                    pset),
                           ts, _cuda.finish_new(ts), _handles)
    else:
        gen = _grouped_reducescatter_gen(ts, names, op, pre, post, pset)
    return _handles.start(gen, _named(name, names), pset.id)


def _grouped_reducescatter_gen(tensors, names, op, prescale, postscale, pset):
    if not tensors:
        return []
    pairs = [_reducescatter_prepare(t, prescale, pset) for t in tensors]
    op, post = _rs_native_op(op, postscale, pset.size)
    handles = _native.submit_grouped_reducescatter(names, [p[0] for p in pairs],
                                                   [p[1] for p in pairs], op, pset.id)
    yield handles
    outs = [p[1] for p in pairs]
    if post != 1.0:
        outs = [_scaled(o, post) for o in outs]
    return outs


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    """Reducescatters a list of tensors; returns the list of this rank's blocks."""
    if not isinstance(tensors, (list, tuple)):
        raise ValueError("kolo grouped_reducescatter expects a list of tensors, got %s"
                         % type(tensors).__name__)
    for t in tensors:
        _dtypes.check_tensor(t, "grouped_reducescatter")
    compression = compression or Compression.none
    pairs = [compression.compress(t) for t in tensors]
    compressed = [c for c, _ in pairs]
    if _needs_grad(compressed):
        n = _prologue("grouped_reducescatter", process_set).size
        _resolve_rs_op(op, "grouped_reducescatter")
        pre = _check_scale(prescale_factor, "prescale_factor")
        post = _check_scale(postscale_factor, "postscale_factor")
        outs = _GroupedReducescatterFn.apply(name, op, process_set, pre, post, n, *compressed)
    else:
        outs = synchronize(grouped_reducescatter_async(compressed, name, op, process_set,
                                                       prescale_factor, postscale_factor))
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(outs, pairs)]


class _GroupedReducescatterFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, process_set, prescale, postscale, n, *tensors):
        ctx.scales = [f for f in ((n if op == Sum else 1), prescale, postscale) if f != 1]
        ctx.process_set = process_set
        return tuple(synchronize(grouped_reducescatter_async(
            list(tensors), name, op, process_set, prescale, postscale)))

    @staticmethod
    def backward(ctx, *grad_output):
        grads = list(grad_output)
        for f in ctx.scales:
            grads = [g * f for g in grads]
        return (None,) * 6 + tuple(grouped_allgather(grads, process_set=ctx.process_set))


# --------------------------------------------------------------------------
# sparse allreduce (allgather of indices and values)


def _sparse_gen(tensor, name, op, pset):
    t = tensor.coalesce()
    indices = t.indices().transpose(0, 1).contiguous()
    values = t.values().contiguous()
    g_idx, g_val = yield from _handles.parallel([
        _allgather_gen(indices, name + ".indices", pset.id),
        _allgather_gen(values, name + ".values", pset.id)])
    if op == Average:
        g_val = g_val / pset.size
    return torch.sparse_coo_tensor(g_idx.transpose(0, 1), g_val, t.size()).coalesce()


def sparse_allreduce_async(tensor, name=None, op=Average, process_set=global_process_set):
    """Starts an allreduce of a sparse COO tensor (gathers every rank's
    indices and values). Returns a handle that is also callable, as in
    Horovod: handle() (or synchronize(handle)) returns the summed (or
    averaged) sparse tensor."""
    pset = _prologue("sparse_allreduce", process_set)
    if not torch.is_tensor(tensor) or not tensor.is_sparse:
        raise ValueError("kolo sparse_allreduce_async expects a sparse COO tensor")
    if op not in (Average, Sum):
        raise ValueError("kolo sparse_allreduce supports op=Average or op=Sum only")
    wire = _handles.op_name("sparse_allreduce", name, _GATHER_NAME_BYTES - 8, ps=pset.id)
    t = tensor.detach()
    if t.is_cuda:
        # Through host memory (the copy to the host waits for the GPU here).
        gen = _then(_sparse_gen(t.cpu(), wire, op, pset), lambda r, d=t.device: r.to(d))
    else:
        gen = _sparse_gen(t, wire, op, pset)
    return _SparseHandle(_handles.start(gen, _named(name, [wire]), pset.id))


def _then(gen, fn):
    result = yield from gen
    return fn(result)


class _SparseHandle(int):
    """sparse_allreduce_async's handle: Horovod returns a function that
    waits and returns the result; this is one, and also an ordinary handle
    for poll() and synchronize()."""

    def __call__(self):
        return synchronize(self)


# --------------------------------------------------------------------------
# barrier and join


def barrier(process_set=global_process_set):
    """Returns once every rank (of `process_set`) has called barrier()
    (kolo_ps_barrier; waits at most KOLO_OP_TIMEOUT)."""
    pset = _prologue("barrier", process_set)
    _native.barrier(ps=pset.id)


def join(device=-1):
    """Horovod's join, for uneven inputs: this rank has run out of data. It
    takes no more part; until every rank has joined, the others' allreduces
    go on with zeros in its place (Average still divides by the full size,
    as in Horovod); their other collectives (allgather too) fail. Returns, on
    every rank, the rank that joined last. `device` is accepted for
    Horovod compatibility (device tensors of joined ranks are refused by the
    agent for now: docs/gpu.md). Waits at most KOLO_OP_TIMEOUT.

    Every rank leaves join() at the same point, so unnamed ops are counted
    from 0 again after it: ranks that ran different unnamed ops before the
    join (the ones that failed because a rank had joined) agree on the
    names of the next ones."""
    _handles.require_init()
    last = _native.join()
    _handles.reset_unnamed()
    return last
