"""Zero-copy CUDA tensors in kolo.torch (docs/gpu.md, "Zero copy on the device").

Opt-in with one setting, KOLO_DEVICE_ZERO_COPY=1, before kolo.torch.init():
torch's CUDA allocator is replaced by libkolo's device arena
(torch.cuda.memory.CUDAPluggableAllocator over kolo_device_alloc_stream /
kolo_device_free_stream, C ABI revision 3), so every CUDA tensor of the
process -- parameters, gradients, activations -- lives in the rank's device
arena, which the agent maps too. An allreduce or broadcast of such a tensor
is then reduced in place by the agent: nothing is copied into a staging slot
before it or out after it (out of place: the input is copied into the
output once, on the current stream).

What it costs: every CUDA allocation of the process comes from the arena,
which is allocated whole at kolo_init (KOLO_DEVICE_ARENA_MB; with zero copy
the default is DEFAULT_ZERO_COPY_ARENA_MB instead of 512), through a
first-fit allocator instead of torch's caching one. torch only lets the
allocator be swapped before it initialized CUDA, so init() must come before
the script's first CUDA call (torch.cuda.set_device included: init() picks
the GPU, local_rank % device_count, and set_device after it is fine);
otherwise init() raises, naming the way out (leave the setting unset: the
copying device path). KOLO_DEVICE_ARENA_MB=0 with it is refused. Without
CUDA the setting is ignored with a warning.

NOT RUN ON A GPU YET: this file is written against torch's documented API
and checked on CPU machines only (tests/python/test_cuda_routing.py);
bench/gpu_issue16.sh runs its check (phase py-zerocopy).
"""

import os
import warnings

import torch

from .. import _library

ENV = "KOLO_DEVICE_ZERO_COPY"
# MiB: every CUDA tensor of the process lives in the arena.
DEFAULT_ZERO_COPY_ARENA_MB = 16384
ALLOC_FN, FREE_FN = "kolo_device_alloc_stream", "kolo_device_free_stream"

_installed = [False]


def requested():
    """Whether KOLO_DEVICE_ZERO_COPY asks for it (1/true/yes/on)."""
    return os.environ.get(ENV, "").strip().lower() in ("1", "true", "yes", "on")


def installed():
    return _installed[0]


def before_init():
    """Before kolo_init (inside _cuda.init_context): swaps torch's CUDA
    allocator for the arena's. Returns True when installed; False when not
    asked or CUDA is unavailable (with a warning)."""
    if not requested() or _installed[0]:
        return False
    try:
        available = torch.cuda.is_available()
    except Exception:  # a broken driver
        available = False
    if not available:
        warnings.warn("kolo: %s=1 is ignored: CUDA is not available to torch" % ENV,
                      RuntimeWarning, stacklevel=3)
        return False
    arena_mb = os.environ.get("KOLO_DEVICE_ARENA_MB", "").strip()
    if arena_mb == "0":
        raise RuntimeError("kolo: %s=1 puts every CUDA tensor in the device arena, but "
                           "KOLO_DEVICE_ARENA_MB=0 asks for none; unset one of them" % ENV)
    if arena_mb == "":
        os.environ["KOLO_DEVICE_ARENA_MB"] = str(DEFAULT_ZERO_COPY_ARENA_MB)
    _library.lib()  # loads it (raises with the places searched)
    for name in (ALLOC_FN, FREE_FN):
        if not _library.has_symbol(name):
            raise RuntimeError("kolo: %s=1 needs a libkolo of C ABI revision 3 (%s); %s has no %s"
                               % (ENV, ALLOC_FN, _library.library_path(), name))
    from torch.cuda.memory import CUDAPluggableAllocator, change_current_allocator
    allocator = CUDAPluggableAllocator(_library.library_path(), ALLOC_FN, FREE_FN)
    try:
        change_current_allocator(allocator)
    except RuntimeError as e:
        raise RuntimeError(
            "kolo: %s=1: torch's CUDA allocator is already in use (%s): call kolo.torch.init() "
            "before the first CUDA tensor, or leave %s unset (CUDA tensors then take the "
            "copying device path)" % (ENV, e, ENV)) from e
    _installed[0] = True
    return True


def after_init(arena_device):
    """After kolo_init: with the allocator installed, the rank must have its
    device arena, or no CUDA tensor can be allocated at all."""
    if not _installed[0]:
        return
    dev, why = arena_device()
    if dev < 0:
        raise RuntimeError("kolo: %s=1: this rank has no device arena (%s), so no CUDA tensor "
                           "can be allocated; leave %s unset" % (ENV, why, ENV))
