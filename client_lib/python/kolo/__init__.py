"""kolo: data-parallel training collectives served by a per-node agent.

This package binds libkolo's C ABI with ctypes. ``kolo.torch`` is the
PyTorch adapter with Horovod's API: a Horovod script runs on kolo when
``import horovod.torch as hvd`` becomes ``import kolo.torch as hvd``.

Importing ``kolo`` does not load libkolo.so; the first call that needs it
does (see ``kolo._library`` for where it is looked for).
"""

__version__ = "0.1.0"

from .errors import (  # noqa: F401
    HorovodInternalError,
    KoloError,
    KoloInternalError,
    KoloLibraryNotFound,
    KoloNotImplementedError,
)
from .basics import (  # noqa: F401
    cross_rank,
    cross_size,
    init,
    is_homogeneous,
    is_initialized,
    library_path,
    local_rank,
    local_size,
    rank,
    shutdown,
    size,
)
