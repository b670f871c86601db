"""kolo.torch: Horovod's PyTorch API on kolo.

    import kolo.torch as hvd      # instead of: import horovod.torch as hvd
    hvd.init()
    optimizer = hvd.DistributedOptimizer(optimizer,
                                         named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

Run the script with ``kolorun -np N python train.py``. CPU and CUDA tensors
(a Horovod GPU script -- ``torch.cuda.set_device(hvd.local_rank())``,
``model.cuda()`` -- runs with only its import changed; see _cuda.py and
docs/gpu.md, "kolo.torch on CUDA"). Every collective takes ``process_set=`` (see process_sets.py). See
docs/user-guide-python.md.
"""

import os

from .. import basics as _basics
from ..basics import (  # noqa: F401
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    init as _basics_init,
    is_homogeneous,
    is_initialized,
    kolo_built,
    library_path,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    rocm_built,
    shutdown,
    size,
)
from ..errors import (  # noqa: F401
    HorovodInternalError,
    KoloError,
    KoloInternalError,
    KoloLibraryNotFound,
    KoloNotImplementedError,
)
from . import _cuda, _handles, _zero_copy, shared as _shared
from .compression import Compression  # noqa: F401
from .functions import (  # noqa: F401
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from .mpi_ops import (  # noqa: F401
    Adasum,
    Average,
    Max,
    Min,
    Product,
    Sum,
    allgather,
    allgather_async,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall,
    alltoall_async,
    barrier,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allgather,
    grouped_allgather_async,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter,
    grouped_reducescatter_async,
    join,
    poll,
    reducescatter,
    reducescatter_async,
    sparse_allreduce_async,
    synchronize,
)
from .optimizer import DistributedOptimizer  # noqa: F401
from .process_sets import (  # noqa: F401
    ProcessSet,
    add_process_set,
    global_process_set,
    remove_process_set,
)
from .shared import is_shared, shared_empty, shared_zeros, to_shared  # noqa: F401
from .sync_batch_norm import SyncBatchNorm  # noqa: F401
from . import elastic  # noqa: F401,E402  (kolo.torch.elastic.run, TorchState: docs/elastic.md)

release = _handles.release


def _forget_session():
    _handles.fail_all_pending()
    _shared.invalidate_all()
    _cuda.forget_session()


_basics.add_shutdown_hook(_forget_session)


def init(comm=None, process_sets=None):
    """Joins the kolo job (Horovod's hvd.init). `process_sets`: a list of
    ProcessSets (or lists of global ranks) registered right after joining,
    in list order, on every rank (each is an add_process_set, so every rank
    must pass the same list); "dynamic" (Horovod's switch for sets added
    later) is accepted -- add_process_set always works after init. Calling
    init again while initialized registers nothing.

    With CUDA available, the rank asks its agent for a device arena
    (KOLO_DEVICE_ARENA_MB, default 512; 0: none, CUDA tensors then go
    through host memory) on its GPU: the current device if the script
    already set one, else local_rank % device_count (Horovod's convention:
    the script's torch.cuda.set_device(hvd.local_rank()) after init then
    names the same GPU). KOLO_DEVICE_ZERO_COPY=1 (before init, and before
    the first CUDA tensor) puts every CUDA tensor in that arena, so device
    allreduces and broadcasts copy nothing (kolo/torch/_zero_copy.py;
    not run on a GPU yet)."""
    if isinstance(process_sets, str) and process_sets != "dynamic":
        raise ValueError('kolo init: process_sets must be a list of ProcessSets or '
                         '"dynamic", got %r' % (process_sets,))
    was_initialized = _basics.is_initialized()
    with _cuda.init_context():
        _basics_init(comm)
    _zero_copy.after_init(_cuda.arena_device)
    if process_sets is None or isinstance(process_sets, str) or was_initialized:
        return
    for ps in process_sets:
        add_process_set(ps)


def start_timeline(file_path, mark_cycles=False):
    """Horovod's runtime timeline switch: the agent starts writing a Chrome
    trace of every collective to `file_path` (on the agent's machine). Any
    rank may call it; the local rank 0 of each agent sends the request, so
    each agent writes one file (the same as `kolo timeline start PATH`).
    It waits for the agent's answer: a path the agent may not write (outside
    its timeline folder) raises KoloInternalError naming that folder.
    Merge several agents' files with `kolo timeline merge`."""
    from . import _native
    if not _basics.is_initialized():
        raise ValueError("start_timeline: kolo is not initialized (call init() first)")
    if _basics.local_rank() == 0:
        _native.timeline(True, os.fspath(file_path), mark_cycles)


def stop_timeline():
    """Stops the agent's timeline (closes the file as valid JSON)."""
    from . import _native
    if not _basics.is_initialized():
        raise ValueError("stop_timeline: kolo is not initialized (call init() first)")
    if _basics.local_rank() == 0:
        _native.timeline(False)


# Importing kolo.torch registers the torch.distributed backend "kolo" (and the
# init_method "kolo://"): init_process_group(backend="kolo") needs nothing else.
import torch.distributed as _tdist  # noqa: E402

if _tdist.is_available():
    from . import distributed  # noqa: F401,E402  (registers on import)
