"""kolo.tensorflow: Horovod's TensorFlow 2 API on kolo.

    import kolo.tensorflow as hvd     # instead of: import horovod.tensorflow as hvd
    hvd.init()
    with tf.GradientTape() as tape:
        loss = ...
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    if first_batch:
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(opt.variables, root_rank=0)

The collectives are TensorFlow custom ops (libkolo_tensorflow.so, built with
kolo when KOLO_PYTHON has TensorFlow): they run eagerly and in tf.function.
Run with ``kolorun -np N python train.py``. See docs/tensorflow.md.
"""

from .. import basics as _basics
from ..basics import (  # noqa: F401
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
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
    KoloNotImplementedError,
)
from ..process_sets import (  # noqa: F401
    ProcessSet,
    add_process_set,
    global_process_set,
    remove_process_set,
)
from .compression import Compression  # noqa: F401
from .functions import allgather_object, broadcast_object, broadcast_variables  # noqa: F401
from .gradient_tape import DistributedGradientTape  # noqa: F401
from .mpi_ops import (  # noqa: F401
    Adasum,
    Average,
    Max,
    Min,
    Product,
    Sum,
    allgather,
    alltoall,
    barrier,
    broadcast,
    grouped_allgather,
    join,
    load_ops,
    local_rank_op,
    local_size_op,
    process_set_included_op,
    rank_op,
    size_op,
)
from .reduce import allreduce, grouped_allreduce, grouped_reducescatter, reducescatter  # noqa: F401
from .optimizer import DistributedOptimizer  # noqa: F401
from . import elastic  # noqa: F401,E402  (kolo.tensorflow.elastic: TensorFlowKerasState, run)


def init(comm=None, process_sets=None):
    """Joins the kolo job (Horovod's hvd.init) and loads kolo's TensorFlow
    ops. `process_sets`: ProcessSets registered right after joining, on
    every rank in the same order ("dynamic" is accepted)."""
    if isinstance(process_sets, str) and process_sets != "dynamic":
        raise ValueError('kolo init: process_sets must be a list of ProcessSets or "dynamic", '
                         'got %r' % (process_sets,))
    was_initialized = _basics.is_initialized()
    load_ops()
    _basics.init(comm)
    if process_sets is None or isinstance(process_sets, str) or was_initialized:
        return
    for ps in process_sets:
        add_process_set(ps)


def broadcast_global_variables(root_rank):
    """TF1's broadcast of every global variable; in TF2 use broadcast_variables."""
    import tensorflow as tf
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)
