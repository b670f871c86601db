"""CUDA tensors in kolo.torch (docs/gpu.md, "kolo.torch on CUDA").

Every collective takes CUDA tensors. Each op takes one of two routes:

* **device** -- allreduce, grouped_allreduce and broadcast (every form:
  sync, async, in place, autograd, process sets, fp16/bf16 compression,
  DistributedOptimizer, broadcast_parameters) when this rank has a device
  arena on the tensors' GPU (C ABI kolo_device_path): the device pointers go
  to libkolo, which copies them into the arena on the tensor device's
  *current stream* (named for the calling thread with kolo_set_stream just
  before the submission), so the submission never waits for the GPU. When
  the op completes, libkolo makes that stream wait on the agent's event and
  copies the result out on it; synchronize() then makes the current stream
  (if it is another one) wait on it, as Horovod's does.
* **staged** -- the collectives the agent cannot run on device memory yet
  (allgather, grouped_allgather, alltoall, reducescatter,
  grouped_reducescatter, Adasum, sparse allreduce), and every op when the
  rank has no device arena (KOLO_DEVICE_ARENA_MB=0, an agent without a GPU,
  a libkolo without CUDA: a warning says why, once): the inputs are copied
  into pinned host memory on the current stream; a thread waits for that
  copy (the calling thread never blocks on the GPU) and submits the host
  collective; the results are copied back to the GPU on the current stream
  of the thread that synchronizes.

A tensor on a GPU other than the one of this rank's device arena (the GPU
kolo.torch.init() chose: the current device if CUDA was already in use,
else local_rank % device_count, Horovod's convention) is refused with a
ValueError naming both GPUs.
"""

import contextlib
import ctypes
import os
import threading
import warnings

import torch

from .. import _library
from . import _zero_copy
from ..errors import ERR_INVALID_ARGUMENT, OK, KoloInternalError

HOST, DEVICE, STAGED = "host", "device", "staged"

# The device arena a kolo.torch process asks for when KOLO_DEVICE_ARENA_MB is
# not set and CUDA is available (MiB; KOLO_DEVICE_ARENA_MB=0 turns the device
# path off: CUDA tensors are then staged through host memory).
DEFAULT_DEVICE_ARENA_MB = 512

_state_lock = threading.Lock()
_arena = None          # (device ordinal or -1, why) for this session; None: not asked yet
_warned = False
_tls = threading.local()


kolo_stream_t = _library.kolo_stream_t


def forget_session():
    """kolo shut down: the next session asks libkolo again."""
    global _arena, _warned
    with _state_lock:
        _arena = None
        _warned = False
    _tls.__dict__.clear()


def _local_rank_from_env():
    """kolorun's KOLO_LOCAL_RANK, else torchrun's LOCAL_RANK, else the
    launcher's (mpirun's OMPI_COMM_WORLD_LOCAL_RANK, srun's SLURM_LOCALID:
    direct launch, docs/slurm.md), else 0."""
    for name in ("KOLO_LOCAL_RANK", "LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"):
        try:
            return int(os.environ[name])
        except (KeyError, ValueError):
            continue
    return 0


@contextlib.contextmanager
def init_context():
    """Around kolo_init: when CUDA is available, ask for a device arena
    (KOLO_DEVICE_ARENA_MB, default DEFAULT_DEVICE_ARENA_MB; set for the rest
    of the process, so process sets get one too) on the GPU this rank will
    use -- the current device when CUDA is already initialized (the script
    called torch.cuda.set_device first), else local_rank % device_count,
    made current only for the duration of kolo_init."""
    try:
        available = torch.cuda.is_available()
    except Exception:  # a broken driver: the host path only
        available = False
    if not available:
        _zero_copy.before_init()  # warns when asked for
        yield
        return
    _zero_copy.before_init()  # KOLO_DEVICE_ZERO_COPY=1: torch's allocator -> the arena
    os.environ.setdefault("KOLO_DEVICE_ARENA_MB", str(DEFAULT_DEVICE_ARENA_MB))
    if os.environ.get("KOLO_DEVICE_ARENA_MB", "0").strip() in ("", "0"):
        yield
        return
    if torch.cuda.is_initialized():
        device = torch.cuda.current_device()
    else:
        device = _local_rank_from_env() % max(torch.cuda.device_count(), 1)
    with torch.cuda.device(device):
        yield


def arena_device():
    """(device, why): the CUDA device of this rank's device arena, or -1 and
    libkolo's reason (kolo_device_path)."""
    global _arena
    with _state_lock:
        if _arena is not None:
            return _arena
        lib = _library.lib()
        if not _library.has_symbol("kolo_device_path"):
            _arena = (-1, "%s is a libkolo of C ABI revision 1 (no kolo_device_path)"
                      % _library.library_path())
            return _arena
        dev = ctypes.c_int(-1)
        st = lib.kolo_device_path(ctypes.byref(dev))
        _arena = (dev.value, "") if st == OK else (-1, _library.last_error())
        return _arena


def _warn_staged(why):
    global _warned
    with _state_lock:
        if _warned:
            return
        _warned = True
    warnings.warn("kolo: CUDA tensors go through host memory (slower), because %s" % why,
                  RuntimeWarning, stacklevel=4)


def route(tensors, op_name, device_capable=True):
    """HOST when no tensor is on a GPU; DEVICE when libkolo's device path
    takes them (device_capable ops, every tensor on the GPU of this rank's
    device arena); STAGED otherwise. Raises ValueError for a tensor on
    another GPU than the device arena's."""
    cuda = [t for t in tensors if t.is_cuda]
    if not cuda:
        return HOST
    if not device_capable:
        return STAGED
    arena, why = arena_device()
    if arena < 0:
        _warn_staged(why)
        return STAGED
    for t in cuda:
        if t.device.index != arena:
            raise ValueError(
                "kolo %s: the tensor is on cuda:%d, but this rank's kolo device arena is on "
                "cuda:%d (the GPU kolo.torch.init() chose: the current device, or local_rank %% "
                "device_count when CUDA was not in use yet); call torch.cuda.set_device(%d) "
                "before kolo.torch.init(), or move the tensor to cuda:%d"
                % (op_name, t.device.index, arena, arena, arena))
    if len(cuda) != len(tensors):
        return STAGED  # host and device tensors in one grouped op
    return DEVICE


def set_stream(device):
    """Names the current stream of `device` (a torch.device or index) as
    this thread's libkolo stream (kolo_set_stream) for the submissions that
    follow; returns that torch stream."""
    s = torch.cuda.current_stream(device)
    key = (s.device.index, s.cuda_stream)
    if getattr(_tls, "key", None) != key:
        lib = _library.lib()
        if not _library.has_symbol("kolo_set_stream"):
            raise KoloInternalError("%s is a libkolo of C ABI revision 1: it cannot take a CUDA "
                                    "stream (kolo_set_stream); use a newer libkolo"
                                    % _library.library_path(), None)
        ks = kolo_stream_t(ctypes.sizeof(kolo_stream_t), s.device.index,
                           ctypes.c_void_p(s.cuda_stream or None))
        st = lib.kolo_set_stream(ctypes.byref(ks))
        if st != OK:
            msg = _library.last_error() or _library.status_string(st)
            if st == ERR_INVALID_ARGUMENT:
                raise ValueError(msg)
            raise KoloInternalError(msg, st)
        _tls.key = key
    return s


def join_stream(s):
    """After a device op on stream `s` completed: the current stream of its
    device (when another one) waits for it (no host wait)."""
    if s is None:
        return
    cur = torch.cuda.current_stream(s.device)
    if cur != s:
        cur.wait_stream(s)


# --------------------------------------------------------------------------
# staging through pinned host memory


def to_host(tensors):
    """(host copies, events): each CUDA tensor copied into pinned host memory
    on its device's current stream (non-blocking); CPU tensors as they are.
    The events mark the copies' end on each stream."""
    hosts, streams = [], {}
    for t in tensors:
        if t.is_cuda:
            h = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            h.copy_(t.detach(), non_blocking=True)  # on the current stream of t's device
            streams[t.device] = torch.cuda.current_stream(t.device)
            hosts.append(h)
        else:
            hosts.append(t)
    return hosts, [s.record_event() for s in streams.values()]


def to_device(host, like):
    """`host` on the device of `like` (a copy on the current stream), or
    `host` itself when `like` is a CPU tensor."""
    if not like.is_cuda:
        return host
    return host.to(like.device, non_blocking=True)


def staged(make_gen, tensors, finish, handles_module):
    """A stage generator running the CPU stage generator make_gen(hosts)
    over host copies of `tensors` (to_host): its first stage -- the
    submission -- runs on a thread (handles_module.Deferred) once the copies
    to the host are done, its later stages as usual; finish(result) maps the
    host result back to the devices (in place or as new tensors)."""
    hosts, events = to_host(tensors)
    gen = make_gen(hosts)
    box = {}

    def first():
        for e in events:
            e.synchronize()
        try:
            return list(next(gen))
        except StopIteration as stop:
            box["result"] = stop.value
            return []

    sub = handles_module.Deferred(first)
    try:
        yield [sub]
        if "result" in box:
            result = box["result"]
        else:
            while True:
                try:
                    stage = gen.send(None)
                except StopIteration as stop:
                    result = stop.value
                    break
                yield stage
        return finish(result)
    finally:
        try:
            gen.close()
        except (ValueError, RuntimeError):  # still running on the Deferred's thread
            pass


def finish_in_place(originals):
    """finish() for in-place ops: each host result is copied into its
    CUDA original (on the current stream); returns the originals (one
    tensor, or a list for grouped ops)."""
    def finish(result):
        results = result if isinstance(result, (list, tuple)) else [result]
        out = []
        for orig, res in zip(originals, results):
            if res is not orig:  # a host copy (a CPU member was used in place)
                with torch.no_grad():
                    orig.copy_(res, non_blocking=orig.is_cuda)
            out.append(orig)
        return out if isinstance(result, (list, tuple)) else out[0]
    return finish


def finish_new(likes):
    """finish() for ops returning new tensors: each host result moved to the
    device of the matching input (one tensor, or a list)."""
    def finish(result):
        if isinstance(result, (list, tuple)):
            return [to_device(r, like) for r, like in zip(result, likes)]
        return to_device(result, likes[0])
    return finish
