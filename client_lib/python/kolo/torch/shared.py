"""Zero-copy tensors: storage inside the memory this process shares with its
kolo-agent (kolo_alloc_shared).

A collective on a tensor that lives there is reduced in place by the agent:
libkolo copies nothing in or out. ``DistributedOptimizer(...,
gradient_as_bucket_view=True)`` puts every gradient there; ``shared_zeros`` /
``shared_empty`` / ``to_shared`` make such tensors directly.

Each allocation is freed when the last tensor viewing it is garbage
collected. Shared tensors belong to one kolo session: after ``shutdown()``
they must not be used any more (the memory is unmapped when the next
``init()`` connects again).
"""

import ctypes
import threading
import weakref

import torch

from .. import _library, basics
from ..errors import KoloError

_lock = threading.Lock()
_live = {}          # id(owner) -> SharedBuffer, for address lookups
_generation = [0]   # bumped at shutdown: older buffers are dead


class SharedBuffer:
    """One kolo_alloc_shared allocation of `nbytes`, viewable as tensors."""

    def __init__(self, nbytes):
        if not basics.is_initialized():
            raise ValueError(basics.NOT_INITIALIZED)
        nbytes = max(int(nbytes), 1)
        ptr = _library.lib().kolo_alloc_shared(nbytes)
        if not ptr:
            raise KoloError(
                "kolo_alloc_shared(%d bytes) failed: %s. The shared arena is sized by "
                "KOLO_ARENA_MB (client) or the agent's --arena-mb."
                % (nbytes, _library.last_error() or "no memory"))
        self.ptr = ptr
        self.nbytes = nbytes
        self._gen = _generation[0]
        # The ctypes array is what tensors keep alive (torch.frombuffer holds a
        # reference); when it is collected the memory goes back to the arena.
        self._array = (ctypes.c_char * nbytes).from_address(ptr)
        weakref.finalize(self._array, _free, ptr, self._gen)
        with _lock:
            _live[ptr] = (nbytes, weakref.ref(self._array))

    def view(self, offset, shape, dtype):
        """A tensor of `shape`/`dtype` at byte `offset` in this buffer."""
        shape = tuple(int(d) for d in shape)
        count = 1
        for d in shape:
            count *= d
        esize = torch.empty((), dtype=dtype).element_size()
        if offset < 0 or offset + count * esize > self.nbytes:
            raise ValueError("view [%d, %d) outside the shared buffer of %d bytes"
                             % (offset, offset + count * esize, self.nbytes))
        if count == 0:
            return torch.empty(shape, dtype=dtype)
        t = torch.frombuffer(self._array, dtype=dtype, count=count, offset=offset)
        return t.view(shape)


def _free(ptr, gen):
    with _lock:
        _live.pop(ptr, None)
    # Memory of an earlier session was unmapped with it; never free it into
    # the current arena.
    if gen == _generation[0] and _library._lib is not None and basics.is_initialized():
        _library.lib().kolo_free_shared(ptr)


def invalidate_all():
    """Called at shutdown: every existing shared allocation becomes dead."""
    with _lock:
        _generation[0] += 1
        _live.clear()


def is_shared(tensor):
    """True if `tensor`'s memory lies in a live kolo shared allocation."""
    if not torch.is_tensor(tensor) or tensor.device.type != "cpu":
        return False
    p = tensor.data_ptr()
    with _lock:
        for base, (n, _) in _live.items():
            if base <= p < base + n:
                return True
    return False


def shared_empty(*shape, dtype=torch.float32):
    """An uninitialized tensor in agent-shared memory (zero-copy collectives)."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)):
        shape = tuple(shape[0])
    esize = torch.empty((), dtype=dtype).element_size()
    count = 1
    for d in shape:
        count *= int(d)
    return SharedBuffer(count * esize).view(0, shape, dtype)


def shared_zeros(*shape, dtype=torch.float32):
    """A zero-filled tensor in agent-shared memory."""
    return shared_empty(*shape, dtype=dtype).zero_()


def to_shared(tensor):
    """A copy of `tensor` in agent-shared memory."""
    out = shared_empty(tuple(tensor.shape), dtype=tensor.dtype)
    out.copy_(tensor)
    return out


def align_up(n, a=64):
    return (n + a - 1) // a * a
