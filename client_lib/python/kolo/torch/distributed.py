"""kolo as a torch.distributed backend: ``init_process_group(backend="kolo")``.

    import kolo.torch                        # registers the backend "kolo"
    torch.distributed.init_process_group(backend="kolo")
    model = torch.nn.parallel.DistributedDataParallel(model)

Launch with ``kolorun -np N python train.py``: kolorun's environment names
the job, the rank and the size, and exports torchrun's variables (RANK,
LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR,
MASTER_PORT), so torch's default ``env://`` works unchanged, as does
``init_method="kolo://"`` (kolo's own rendezvous, below). Without kolorun
(torchrun, or MASTER_ADDR/RANK/WORLD_SIZE set by hand) a kolo agent must
already run on every node (KOLO_AGENT_SOCKET, default /run/kolo/agent.sock);
the job id is then agreed through torch's store. See
docs/user-guide-python.md, "Using kolo from DDP".

The process group is a Python subclass of torch.distributed.ProcessGroup
(torch 2.x's pybind trampoline, PyProcessGroup, lets C++ callers such as
DDP's reducer and the functional collectives call back into it; tested
under torch 2.11). Every collective is submitted through kolo.torch's
asynchronous handles; a completion thread of this process waits for them in
submission order and completes the torch Future behind the returned Work
(``_create_work_from_future``), with the op's result or a RuntimeError that
carries kolo's message. CPU and CUDA tensors (as kolo.torch): an op on
CUDA tensors is ordered on their device's current stream, its Work's
wait() makes the caller's current stream wait (no host wait on the GPU),
as with torch's NCCL backend.
"""

import atexit
import os
import queue
import secrets
import sys
import threading
import uuid
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.futures import Future

from .. import basics
from . import _cuda
from . import _handles
from . import mpi_ops as _ops
from . import process_sets as _psets

try:
    from torch._C._distributed_c10d import _create_work_from_future
except ImportError:  # pragma: no cover - torch without it cannot host a Python backend
    _create_work_from_future = None

BACKEND_NAME = "kolo"

_REDUCE_OPS = {
    dist.ReduceOp.SUM: _ops.Sum,
    dist.ReduceOp.PRODUCT: _ops.Product,
    dist.ReduceOp.MIN: _ops.Min,
    dist.ReduceOp.MAX: _ops.Max,
}
if hasattr(dist.ReduceOp, "AVG"):
    _REDUCE_OPS[dist.ReduceOp.AVG] = _ops.Average


def _op_name(op):
    return str(op).split(".")[-1]


def _kolo_op(reduce_op, what):
    for k, v in _REDUCE_OPS.items():
        if reduce_op == k:
            return v
    raise RuntimeError("%s: reduce op %s is not supported by the kolo backend (SUM, AVG, "
                       "PRODUCT, MIN, MAX are)" % (what, _op_name(reduce_op)))


# ---------------------------------------------------------------------------
# completion thread


class _Completer:
    """One daemon thread that waits for kolo handles in submission order and
    completes their Futures (callbacks attached with Future.then, such as
    DDP's, run on this thread)."""

    def __init__(self):
        self._q = queue.Queue()
        self._thread = None
        self._lock = threading.Lock()
        self._atexit = False

    def submit(self, handle, finish, timeout_s, what, cuda=None):
        """Returns the op's Future: it completes with finish(result), or
        with an error (a C++-level error: DDP's reducer and fut.wait() see
        it) carrying kolo's message. cuda: (device, stream) of an op on
        CUDA tensors, the caller's current stream at submission (_cuda_of):
        the Future is then a CUDA Future of that device, completed with that
        stream current, so that its waiters' streams wait for the result
        (torch's NCCL semantics) and no host thread waits on the GPU."""
        fut = Future(devices=[cuda[0]]) if cuda is not None else Future()
        out = fut.then(_unwrap)
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="kolo-pg-completion",
                                                daemon=True)
                self._thread.start()
                if not self._atexit:
                    atexit.register(self.stop)
                    self._atexit = True
        self._q.put((handle, fut, finish, timeout_s, what, cuda))
        return out, fut

    def stop(self, timeout_s=10.0):
        """Ends the thread (at exit: a daemon thread still alive while the
        interpreter finalizes is unwound by force, which aborts the process
        if torch's C++ frames are on its stack)."""
        with self._lock:
            t, self._thread = self._thread, None
        if t is not None and t.is_alive():
            self._q.put(None)
            t.join(timeout_s)

    def _loop(self):
        while True:
            item = self._q.get()
            if item is None:
                return
            handle, fut, finish, timeout_s, what, cuda = item
            if cuda is None:
                self._complete(handle, fut, finish, timeout_s, what)
            else:
                # This thread's device and current stream become the
                # submitter's: kolo's synchronize makes that stream wait for
                # the op, finish() copies on it, and the Future records its
                # completion there.
                with torch.cuda.device(cuda[0]), torch.cuda.stream(cuda[1]):
                    self._complete(handle, fut, finish, timeout_s, what)

    @staticmethod
    def _complete(handle, fut, finish, timeout_s, what):
        try:
            if handle is not None:
                op = _handles._lookup(handle)
                with op.lock:
                    op.progress(block=True, timeout_ms=max(1, int(timeout_s * 1000)))
                res = _handles.synchronize(handle)
            else:
                res = None
            val = finish(res)
        except BaseException as e:  # handed to whoever waits on the Work
            msg = str(e)
            if "timed out" in msg:
                msg += " (torch timeout %.0f s)" % timeout_s
            fut.set_result((False, RuntimeError("kolo backend: %s failed: %s" % (what, msg))))
        else:
            fut.set_result((True, val))


def _unwrap(base):
    ok, value = base.value()
    if not ok:
        raise value
    return value


_completer = _Completer()


def _cuda_of(tensors):
    """(device, the current stream of that device) when any of `tensors` is
    a CUDA tensor, else None. One device per op, as torch's NCCL backend."""
    devs = {t.device for t in tensors if t is not None and t.is_cuda}
    if not devs:
        return None
    if len(devs) > 1:
        raise ValueError("tensors on several devices (%s): one device per collective"
                         % ", ".join(sorted(str(d) for d in devs)))
    dev = devs.pop()
    return dev, torch.cuda.current_stream(dev)


def _failed_future(err):
    fut = Future()
    out = fut.then(_unwrap)
    fut.set_result((False, err))
    return out, fut


# torch.distributed.Work in torch 1.13; newer releases keep the class as
# dist._Work too (their own tests subclass that name).
_WorkBase = getattr(dist, "Work", None) or getattr(dist, "_Work")


class KoloWork(_WorkBase):
    """The Work handed to Python callers (torch.distributed's functions):
    wait() raises the collective's error. torch's future-wrapping Work (1.13 to 2.11)
    (what C++ callers such as DDP get) returns from wait() even when its
    future failed, and C++ cannot call back into a Python Work, so each
    caller gets the kind it can use (see ProcessGroupKolo._work)."""

    def __init__(self, fut, base):
        super().__init__()
        self._fut = fut  # completes with the op's value or fails (torch's error wrapping)
        self._base = base  # (ok, value or the error itself)

    def wait(self, timeout=None):
        # The process group's timeout bounds every op (the completion thread
        # fails it then); `timeout` here is accepted for torch's signature.
        ok, value = self._base.wait()
        if not ok:
            raise value  # kolo's message, without the Future's callback wrapping
        self._fut.wait()
        return True

    def is_completed(self):
        return self._fut.done()

    def is_success(self):
        if not self._fut.done():
            raise RuntimeError("kolo backend: is_success() on a work that is not completed")
        return self.exception() is None

    def exception(self):
        try:
            self.wait()
            return None
        except RuntimeError as e:
            return e

    def result(self):
        return self._fut.wait()

    def get_future(self):
        return self._fut

    def synchronize(self):
        pass  # CPU tensors: nothing to order on a stream


_last_name = threading.local()  # the kolo name of this thread's last submission


def _describe(tensors):
    """'float32[4, 3]' for an op's first tensor (errors name the tensor)."""
    for t in tensors:
        if isinstance(t, torch.Tensor):
            return "%s%s" % (str(t.dtype).replace("torch.", ""), list(t.shape))
    return "no tensor"


_C10D_FILE = os.path.normcase(os.path.abspath(dist.distributed_c10d.__file__)).rstrip("co")


# ---------------------------------------------------------------------------
# the process group


def _flat(t):
    return t.detach().reshape(-1)


def _copy_back(dst, src):
    with torch.no_grad():
        dst.copy_(src.reshape(dst.shape))


class ProcessGroupKolo(dist.ProcessGroup):
    """A torch.distributed process group over a kolo process set (the whole
    job for the default group; a kolo process set for dist.new_group)."""

    def __init__(self, rank, size, timeout, process_set=None, tag="0"):
        super().__init__(rank, size)
        self._ps = process_set if process_set is not None else _psets.global_process_set
        self._global_ranks = None if process_set is None else list(process_set.ranks)
        self._timeout = timeout.total_seconds() if isinstance(timeout, timedelta) else float(
            timeout or 1800)
        self._tag = tag
        self._seq = 0
        self._seq_lock = threading.Lock()
        self._group_name = None
        self._group_desc = ""

    # -- helpers ------------------------------------------------------------

    def getBackendName(self):
        return BACKEND_NAME

    # torch 2.x keeps a group's name and description in its C++ backends; a
    # Python ProcessGroup has none, so its trampoline asks these (DeviceMesh,
    # FSDP2 and the functional collectives look groups up by name).
    def getGroupName(self):
        if self._group_name is None:
            raise RuntimeError("kolo backend: the process group's name is not set yet")
        return self._group_name

    def setGroupName(self, name):
        self._group_name = name

    def getGroupDesc(self):
        return self._group_desc

    def setGroupDesc(self, desc):
        self._group_desc = desc

    def _name(self):
        with self._seq_lock:
            n = self._seq
            self._seq += 1
        name = "tdist.%s.%d" % (self._tag, n)
        _last_name.value = name
        return name

    def _global(self, group_rank):
        if not 0 <= group_rank < self.size():
            raise RuntimeError("kolo backend: root rank %d out of range [0, %d)"
                               % (group_rank, self.size()))
        return group_rank if self._global_ranks is None else self._global_ranks[group_rank]

    @staticmethod
    def _work(futs):
        """A KoloWork when torch.distributed's Python functions call (the
        caller's frame is in distributed_c10d.py), else (DDP's reducer and
        other C++ callers through the pybind trampoline, whose frames are
        elsewhere) torch's future-wrapping Work, which C++ can wait on."""
        f = sys._getframe(1)
        while f is not None and f.f_code.co_filename == __file__:
            f = f.f_back
        if f is not None and os.path.normcase(os.path.abspath(f.f_code.co_filename)).rstrip(
                "co") == _C10D_FILE:
            return KoloWork(*futs)
        return _create_work_from_future(futs[0])

    def _run(self, what, start, finish, tensors=()):
        """start() submits and returns a kolo handle (or None); finish(result)
        gives the Future's value. Argument errors raise here, at the call,
        as with torch's backends; collective failures go to the Future.
        `tensors`: the op's inputs and outputs; CUDA ones make it a CUDA
        work ordered on their device's current stream."""
        desc = _describe(tensors)
        _last_name.value = None
        try:
            cuda = _cuda_of(tensors)
            h = start()
        except (ValueError, TypeError) as e:
            raise RuntimeError("kolo backend: %s of tensor %s: %s" % (what, desc, e)) from None
        except Exception as e:
            return self._work(_failed_future(RuntimeError(
                "kolo backend: %s failed for tensor %s: %s" % (what, desc, e))))
        label = "%s (tensor %s, kolo name %s)" % (what, desc, _last_name.value)
        return self._work(_completer.submit(h, finish, self._timeout, label, cuda))

    @staticmethod
    def _one(tensors, what):
        if len(tensors) != 1:
            raise RuntimeError("kolo backend: %s takes one tensor per process, got %d"
                               % (what, len(tensors)))
        return tensors[0]

    # -- allreduce ------------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        op = _kolo_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM, "allreduce")
        return self._allreduce_list(list(tensors), op, "allreduce")

    def allreduce_coalesced(self, tensors, opts=None):
        op = _kolo_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM,
                      "allreduce_coalesced")
        return self._allreduce_list(list(tensors), op, "allreduce_coalesced")

    def _allreduce_list(self, tensors, op, what):
        bufs = [t if t.is_contiguous() else t.contiguous() for t in tensors]

        def start():
            name = self._name()
            if len(bufs) == 1:
                return _ops.allreduce_async_(bufs[0], name=name, op=op, process_set=self._ps)
            return _ops.grouped_allreduce_async_(bufs, name=name, op=op, process_set=self._ps)

        def finish(_):
            for t, b in zip(tensors, bufs):
                if b is not t:
                    _copy_back(t, b)
            return tensors

        return self._run(what, start, finish, tensors)

    # -- broadcast ------------------------------------------------------------

    def broadcast(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        t = self._one(tensors, "broadcast")
        buf = t if t.is_contiguous() else t.contiguous()

        def start():
            return _ops.broadcast_async_(buf, self._global(root), name=self._name(),
                                         process_set=self._ps)

        def finish(_):
            if buf is not t:
                _copy_back(t, buf)
            return tensors

        return self._run("broadcast", start, finish, [t])

    # -- allgather ------------------------------------------------------------

    def _allgather_flat(self, inp, what, finish_parts, outputs=()):
        def start():
            return _ops.allgather_async(_flat(inp), name=self._name(), process_set=self._ps)
        return self._run(what, start, finish_parts, [inp] + list(outputs))

    def allgather(self, output_tensors, input_tensors, opts=None):
        inp = self._one(input_tensors, "allgather")
        outs = self._one(output_tensors, "allgather")
        if len(outs) != self.size():
            raise RuntimeError("kolo backend: allgather needs %d output tensors, got %d"
                               % (self.size(), len(outs)))

        def finish(res):
            off = 0
            for o in outs:
                n = o.numel()
                _copy_back(o, res[off:off + n])
                off += n
            if off != res.numel():
                raise RuntimeError("allgather received %d elements, the outputs hold %d"
                                   % (res.numel(), off))
            return output_tensors

        return self._allgather_flat(inp, "allgather", finish, outs)

    def _allgather_base(self, output, input, opts=None):
        if output.numel() != input.numel() * self.size():
            raise RuntimeError("kolo backend: all_gather_into_tensor: output has %d elements, "
                               "needs %d x %d" % (output.numel(), self.size(), input.numel()))

        def finish(res):
            _copy_back(output, res)
            return [output]

        return self._allgather_flat(input, "all_gather_into_tensor", finish, [output])

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        inputs = list(input_list)
        cat = torch.cat([_flat(t) for t in inputs]) if inputs else torch.empty(0)

        def finish(res):
            per = cat.numel()
            for r, outs in enumerate(output_lists):
                off = r * per
                for o in outs:
                    _copy_back(o, res[off:off + o.numel()])
                    off += o.numel()
            return output_lists

        return self._allgather_flat(cat, "allgather_coalesced", finish,
                                    [o for outs in output_lists for o in outs])

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        """One atomic grouped allgather (FSDP2, functional collectives):
        outputs[i] gets every rank's inputs[i], in rank order."""
        outputs, inputs = list(outputs), list(inputs)
        if len(outputs) != len(inputs):
            raise RuntimeError("kolo backend: allgather_into_tensor_coalesced: %d outputs for %d "
                               "inputs" % (len(outputs), len(inputs)))
        for o, i in zip(outputs, inputs):
            if o.numel() != i.numel() * self.size():
                raise RuntimeError("kolo backend: allgather_into_tensor_coalesced: output %s "
                                   "has %d elements, needs %d x %d" % (
                                       _describe([o]), o.numel(), self.size(), i.numel()))
        flats = [_flat(i) for i in inputs]

        def start():
            return _ops.grouped_allgather_async(flats, name=self._name(), process_set=self._ps)

        def finish(res):
            for o, r in zip(outputs, res):
                _copy_back(o, r)
            return outputs

        return self._run("allgather_into_tensor_coalesced", start, finish, inputs + outputs)

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        """One atomic grouped reducescatter (SUM, AVG; MIN/MAX/PRODUCT as a
        grouped allreduce of which each rank keeps its block)."""
        op = _kolo_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM,
                      "reduce_scatter_tensor_coalesced")
        outputs, inputs = list(outputs), list(inputs)
        n, r = self.size(), self.rank()
        if len(outputs) != len(inputs):
            raise RuntimeError("kolo backend: reduce_scatter_tensor_coalesced: %d outputs for %d "
                               "inputs" % (len(outputs), len(inputs)))
        for o, i in zip(outputs, inputs):
            if i.numel() != o.numel() * n:
                raise RuntimeError("kolo backend: reduce_scatter_tensor_coalesced: input %s has "
                                   "%d elements, needs %d x %d" % (
                                       _describe([i]), i.numel(), n, o.numel()))
        if op in (_ops.Sum, _ops.Average):
            rows = [_flat(i).reshape(n, o.numel()) for o, i in zip(outputs, inputs)]

            def start():
                return _ops.grouped_reducescatter_async(rows, name=self._name(), op=op,
                                                        process_set=self._ps)

            def finish(res):
                for o, x in zip(outputs, res):
                    _copy_back(o, x)
                return outputs
        else:
            bufs = [_flat(i).clone() for i in inputs]

            def start():
                return _ops.grouped_allreduce_async_(bufs, name=self._name(), op=op,
                                                     process_set=self._ps)

            def finish(_):
                for o, b in zip(outputs, bufs):
                    k = o.numel()
                    _copy_back(o, b[r * k:(r + 1) * k])
                return outputs
        return self._run("reduce_scatter_tensor_coalesced", start, finish, inputs + outputs)

    # -- reduce_scatter -------------------------------------------------------

    def _reduce_scatter_flat(self, flat_in, out, op, what):
        n, r = self.size(), self.rank()
        if flat_in.numel() != out.numel() * n:
            raise RuntimeError("kolo backend: %s: input has %d elements, needs %d x %d"
                               % (what, flat_in.numel(), n, out.numel()))
        k = out.numel()
        if op in (_ops.Sum, _ops.Average):
            rows = flat_in.reshape(n, k)  # one row per rank: kolo splits dim 0 evenly

            def start():
                return _ops.reducescatter_async(rows, name=self._name(), op=op,
                                                process_set=self._ps)

            def finish(res):
                _copy_back(out, res)
                return [out]
        else:  # MIN/MAX/PRODUCT: kolo's reducescatter has Sum/Average only
            buf = flat_in.clone()

            def start():
                return _ops.allreduce_async_(buf, name=self._name(), op=op,
                                             process_set=self._ps)

            def finish(_):
                _copy_back(out, buf[r * k:(r + 1) * k])
                return [out]
        return self._run(what, start, finish, [flat_in, out])

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        out = self._one(output_tensors, "reduce_scatter")
        ins = self._one(input_tensors, "reduce_scatter")
        op = _kolo_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM, "reduce_scatter")
        if len(ins) != self.size():
            raise RuntimeError("kolo backend: reduce_scatter needs %d input tensors, got %d"
                               % (self.size(), len(ins)))
        flat = torch.cat([_flat(t) for t in ins])
        work = self._reduce_scatter_flat(flat, out, op, "reduce_scatter")
        return work

    def _reduce_scatter_base(self, output, input, opts=None):
        op = _kolo_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM,
                      "reduce_scatter_tensor")
        return self._reduce_scatter_flat(_flat(input), output, op, "reduce_scatter_tensor")

    # -- alltoall -------------------------------------------------------------

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        n = self.size()
        if input.dim() == 0:
            raise RuntimeError("kolo backend: all_to_all_single needs at least one dimension")
        splits = list(input_split_sizes) if len(input_split_sizes) else None
        if splits is None and input.shape[0] % n:
            raise RuntimeError("kolo backend: all_to_all_single: dim 0 (%d) does not divide by "
                               "%d" % (input.shape[0], n))
        src = input.detach()

        def start():
            return _ops.alltoall_async(src, splits, name=self._name(), process_set=self._ps)

        def finish(res):
            got, _ = res
            _copy_back(output, got)
            return [output]

        return self._run("all_to_all_single", start, finish, [input, output])

    def alltoall(self, output_tensors, input_tensors, opts=None):
        n = self.size()
        if len(input_tensors) != n or len(output_tensors) != n:
            raise RuntimeError("kolo backend: all_to_all needs %d input and output tensors" % n)
        src = torch.cat([_flat(t) for t in input_tensors])
        splits = [t.numel() for t in input_tensors]

        def start():
            return _ops.alltoall_async(src, splits, name=self._name(), process_set=self._ps)

        def finish(res):
            got, received = res
            off = 0
            for o, k in zip(output_tensors, received.tolist()):
                if k != o.numel():
                    raise RuntimeError("all_to_all: received %d elements for an output of %d"
                                       % (k, o.numel()))
                _copy_back(o, got[off:off + k])
                off += k
            return output_tensors

        return self._run("all_to_all", start, finish,
                         list(input_tensors) + list(output_tensors))

    # -- barrier --------------------------------------------------------------

    def barrier(self, opts=None):
        token = torch.zeros(1, dtype=torch.int32)

        def start():
            return _ops.allreduce_async_(token, name=self._name(), op=_ops.Sum,
                                         process_set=self._ps)

        return self._run("barrier", start, lambda _: [])

    # -- rooted collectives on top of the symmetric ones ----------------------

    def reduce(self, tensors, opts=None):
        """allreduce into a copy; only the root's tensor receives the result."""
        t = self._one(tensors, "reduce")
        op = _kolo_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM, "reduce")
        root = opts.rootRank if opts is not None else 0
        buf = t.detach().contiguous().clone()

        def start():
            return _ops.allreduce_async_(buf, name=self._name(), op=op, process_set=self._ps)

        def finish(_):
            if self.rank() == root:
                _copy_back(t, buf)
            return tensors

        return self._run("reduce", start, finish, [t])

    def gather(self, output_tensors, input_tensors, opts=None):
        """allgather; the root copies the parts out."""
        inp = self._one(input_tensors, "gather")
        root = opts.rootRank if opts is not None else 0
        if self.rank() == root and len(self._one(output_tensors, "gather")) != self.size():
            raise RuntimeError("kolo backend: gather needs %d output tensors on the root"
                               % self.size())

        def finish(res):
            if self.rank() == root:
                parts = res.reshape(self.size(), -1)
                for o, p in zip(output_tensors[0], parts):
                    _copy_back(o, p)
            return output_tensors

        return self._allgather_flat(
            inp, "gather", finish, output_tensors[0] if self.rank() == root else ())

    def scatter(self, output_tensors, input_tensors, opts=None):
        """A broadcast of the root's concatenated inputs; each rank keeps its part."""
        out = self._one(output_tensors, "scatter")
        root = opts.rootRank if opts is not None else 0
        n, k = self.size(), out.numel()
        if self.rank() == root:
            ins = self._one(input_tensors, "scatter")
            if len(ins) != n:
                raise RuntimeError("kolo backend: scatter needs %d input tensors on the root" % n)
            buf = torch.cat([_flat(t) for t in ins]).contiguous()
        else:
            buf = torch.empty(n * k, dtype=out.dtype, device=out.device)

        def start():
            return _ops.broadcast_async_(buf, self._global(root), name=self._name(),
                                         process_set=self._ps)

        def finish(_):
            _copy_back(out, buf[self.rank() * k:(self.rank() + 1) * k])
            return output_tensors

        return self._run("scatter", start, finish, [out])

    # -- not served by the agent ------------------------------------------------

    def _unsupported(self, what):
        raise RuntimeError("%s is not supported by the kolo backend (kolo runs collectives "
                           "only; use backend='gloo' for point-to-point)" % what)

    def send(self, tensors, dst, tag=0):
        self._unsupported("send")

    def recv(self, tensors, src, tag=0):
        self._unsupported("recv")

    def recv_anysource(self, tensors, tag=0):
        self._unsupported("recv")

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        self.barrier().wait()


# ---------------------------------------------------------------------------
# creation and registration


def _rendezvous_without_kolorun(store, rank, size):
    """No kolorun: name the job through torch's store and take the rank
    and size from torch; the node's agent must be running already."""
    if rank == 0:
        store.set("kolo/job_id", "torch-" + uuid.uuid4().hex[:12])
        if "KOLO_JOB_TOKEN" not in os.environ:  # what kolorun would generate (docs/kolorun.md)
            store.set("kolo/job_token", secrets.token_hex(16))
    job = store.get("kolo/job_id").decode()
    os.environ["KOLO_JOB_ID"] = job
    if "KOLO_JOB_TOKEN" not in os.environ:
        os.environ["KOLO_JOB_TOKEN"] = store.get("kolo/job_token").decode()
    os.environ["KOLO_RANK"] = str(rank)
    os.environ["KOLO_SIZE"] = str(size)
    os.environ.setdefault("KOLO_LOCAL_RANK", os.environ.get("LOCAL_RANK", "0"))
    os.environ.setdefault("KOLO_LOCAL_SIZE", os.environ.get("LOCAL_WORLD_SIZE", "1"))


_subgroup_sets = {}  # sorted global ranks -> kolo ProcessSet (None: every rank)


def _init_with_device_arena():
    """kolo's init as kolo.torch.init() does it: with CUDA available, the
    rank asks for a device arena on its GPU (the current device, else
    local_rank % device_count), so CUDA tensors take the device path
    instead of host staging (docs/user-guide-python.md)."""
    with _cuda.init_context():
        basics.init()
    from . import _zero_copy  # KOLO_DEVICE_ZERO_COPY=1: the arena must be there
    _zero_copy.after_init(_cuda.arena_device)


def _create(opts, pg_options=None):
    store, rank, size = opts.store, opts.group_rank, opts.group_size
    timeout = opts.timeout
    global_ranks = list(opts.global_ranks_in_group or [])
    if not global_ranks:  # the default group
        if not basics.is_initialized():
            if "KOLO_JOB_ID" not in os.environ:
                _rendezvous_without_kolorun(store, rank, size)
            _init_with_device_arena()
        if basics.rank() != rank or basics.size() != size:
            raise RuntimeError(
                "kolo backend: torch's rank/world_size (%d/%d) do not match kolo's (%d/%d); "
                "under kolorun leave RANK/WORLD_SIZE unset or set them to kolo's"
                % (rank, size, basics.rank(), basics.size()))
        return ProcessGroupKolo(rank, size, timeout)
    ps = _subgroup_sets.get(tuple(sorted(int(r) for r in global_ranks)))
    if ps is None:
        return ProcessGroupKolo(rank, size, timeout, tag=opts.group_id)  # every rank
    return ProcessGroupKolo(rank, size, timeout, process_set=ps, tag=opts.group_id)


def _install_new_group_hook():
    """dist.new_group calls the backend's creator on the members only, but a
    kolo process set is added by every rank of the job together. Wrap
    torch's helper (which every rank runs, members or not) so that every
    rank adds the kolo process set first."""
    c10d = dist.distributed_c10d
    orig = c10d._new_process_group_helper
    if getattr(orig, "_kolo_wrapped", False):
        return

    def helper(group_size, group_rank, global_ranks_in_group, backend, store, *args, **kwargs):
        try:
            is_kolo = dist.Backend(backend) == BACKEND_NAME
        except Exception:
            is_kolo = False
        if is_kolo and global_ranks_in_group:
            ranks = tuple(sorted(int(r) for r in global_ranks_in_group))
            if ranks not in _subgroup_sets:  # a second group of the same ranks shares it
                _subgroup_sets[ranks] = None if list(ranks) == list(range(basics.size())) \
                    else _psets.add_process_set(list(ranks))
        return orig(group_size, group_rank, global_ranks_in_group, backend, store, *args,
                    **kwargs)

    helper._kolo_wrapped = True
    c10d._new_process_group_helper = helper


def _kolo_rendezvous(url, timeout=timedelta(minutes=30), **kwargs):
    """init_method="kolo://": rank, size and job from kolorun's environment
    (kolo is initialized here); torch's store is a TCPStore hosted by rank 0
    on a free port, whose address reaches the others through a kolo
    broadcast. The host is MASTER_ADDR if set, else rank 0's hostname
    (127.0.0.1 when the job has one node)."""
    import socket
    from .functions import broadcast_object
    if not basics.is_initialized():
        _init_with_device_arena()
    rank, size = basics.rank(), basics.size()
    store = None
    if rank == 0:
        host = os.environ.get("MASTER_ADDR") or (
            "127.0.0.1" if basics.local_size() == size else socket.gethostname())
        store = dist.TCPStore(host, 0, size, True, timeout, wait_for_workers=False)
        addr = (host, store.port)
    else:
        addr = None
    host, port = broadcast_object(addr, root_rank=0, name="kolo.rendezvous.store")
    if store is None:
        store = dist.TCPStore(host, port, size, False, timeout)
    yield (store, rank, size)
    raise RuntimeError("kolo:// rendezvous cannot run twice (re-initialization)")


_FUNCTIONAL_REDUCE_OPS = {"sum": "SUM", "avg": "AVG", "product": "PRODUCT", "min": "MIN",
                          "max": "MAX"}
_functional_lib = None


def _install_functional_kernels():
    """torch 2.x's functional collectives (torch.distributed._functional_collectives,
    DTensor's redistribute, FSDP2's full_tensor) call the C++ group directly.
    Python process groups are reached through their trampoline's methods,
    which cover every functional collective but two: all_gather_into_tensor
    and reduce_scatter_tensor call _allgather_base / _reduce_scatter_base,
    which the trampoline does not forward (torch's kernel then looks for a
    C++ backend of the device and fails: "No backend type associated with
    device type cpu"). For CPU and CUDA tensors these two ops (and their
    _out forms) get kernels here that do what torch's do (Functional.cpp:
    allocate, call the group, register the Work for wait_tensor) from
    Python, so any group's Python methods are reached; for gloo and NCCL
    groups that is the same C++ call as before."""
    global _functional_lib
    if _functional_lib is not None:
        return
    try:
        ops = torch.ops._c10d_functional
        ops.all_gather_into_tensor, ops.reduce_scatter_tensor  # noqa: B018 (present?)
        from torch._C._distributed_c10d import (AllgatherOptions as _AllgatherOptions,
                                                _register_work, _resolve_process_group)
    except (AttributeError, ImportError, RuntimeError):
        return  # a torch without functional collectives
    lib = torch.library.Library("_c10d_functional", "IMPL")

    def gather_out(input, group_size, group_name, out):
        group = _resolve_process_group(group_name)
        work = group._allgather_base(out, input.contiguous(), _AllgatherOptions())
        _register_work(out, work)
        return out

    def gather(input, group_size, group_name):
        out = input.new_empty((input.shape[0] * group_size,) + tuple(input.shape[1:])
                              if input.dim() else (group_size,))
        return gather_out(input, group_size, group_name, out)

    def scatter_out(input, reduce_op, group_size, group_name, out):
        name = _FUNCTIONAL_REDUCE_OPS.get(str(reduce_op).lower())
        if name is None:
            raise RuntimeError("reduce_scatter_tensor: reduce op %r is not supported by the kolo "
                               "backend's functional kernel" % (reduce_op,))
        opts = dist.ReduceScatterOptions()
        opts.reduceOp = getattr(dist.ReduceOp, name)
        group = _resolve_process_group(group_name)
        work = group._reduce_scatter_base(out, input.contiguous(), opts)
        _register_work(out, work)
        return out

    def scatter(input, reduce_op, group_size, group_name):
        if input.shape[0] % group_size:
            raise RuntimeError("reduce_scatter_tensor: dim 0 (%d) does not divide by the group "
                               "size %d" % (input.shape[0], group_size))
        out = input.new_empty((input.shape[0] // group_size,) + tuple(input.shape[1:]))
        return scatter_out(input, reduce_op, group_size, group_name, out)

    for key in ("CPU", "CUDA"):
        lib.impl("all_gather_into_tensor", gather, key)
        lib.impl("all_gather_into_tensor_out", gather_out, key)
        lib.impl("reduce_scatter_tensor", scatter, key)
        lib.impl("reduce_scatter_tensor_out", scatter_out, key)
    _functional_lib = lib


def register():
    """Registers backend "kolo" with torch.distributed (idempotent)."""
    if _create_work_from_future is None:
        raise RuntimeError("kolo backend: this torch has no _create_work_from_future; the "
                           "kolo backend needs torch 2.x's Python ProcessGroup support")
    if BACKEND_NAME.upper() not in dist.Backend._plugins:
        import inspect
        kwargs = {"extended_api": True}
        if "devices" in inspect.signature(dist.Backend.register_backend).parameters:
            # torch 2.x asks which devices a plugin serves (and warns when it is
            # not told); kolo.torch takes CPU and CUDA tensors.
            kwargs["devices"] = ["cpu", "cuda"]
        dist.Backend.register_backend(BACKEND_NAME, _create, **kwargs)
    _install_new_group_hook()
    _install_functional_kernels()
    import importlib
    _rdzv = importlib.import_module("torch.distributed.rendezvous")
    if "kolo" not in _rdzv._rendezvous_handlers:
        _rdzv.register_rendezvous_handler("kolo", _kolo_rendezvous)


register()
