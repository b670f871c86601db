"""kolo.tensorflow.keras (and kolo.keras): Horovod's Keras API on kolo.

    import kolo.tensorflow.keras as hvd   # instead of: import horovod.tensorflow.keras as hvd
    hvd.init()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size()))
    model.compile(optimizer=opt, loss=...)
    model.fit(x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                hvd.callbacks.MetricAverageCallback()])

Keras is tf.keras: Keras 3 with TensorFlow 2.16+, or Keras 2 (tf-keras) with
TF_USE_LEGACY_KERAS=1. See docs/tensorflow.md.
"""

import tensorflow as tf

from .. import (  # noqa: F401
    Adasum,
    Average,
    Compression,
    Max,
    Min,
    ProcessSet,
    Product,
    Sum,
    add_process_set,
    allgather,
    allgather_object,
    allreduce,
    alltoall,
    barrier,
    broadcast,
    broadcast_object,
    broadcast_variables,
    cross_rank,
    cross_size,
    global_process_set,
    grouped_allreduce,
    init,
    is_initialized,
    join,
    local_rank,
    local_size,
    rank,
    reducescatter,
    remove_process_set,
    shutdown,
    size,
)
from . import callbacks, elastic  # noqa: F401
from .optimizer import DistributedOptimizer, _distributed_class  # noqa: F401


def broadcast_global_variables(root_rank):
    """Keras 2's name for broadcasting every variable; in TF2 eager use the
    BroadcastGlobalVariablesCallback or broadcast_variables(model.variables)."""
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


def load_model(filepath, custom_optimizers=None, custom_objects=None,
               compression=Compression.none):
    """keras.models.load_model whose optimizer comes back wrapped in
    DistributedOptimizer (Horovod's hvd.load_model)."""
    keras = tf.keras
    bases = [c for c in vars(keras.optimizers).values()
             if isinstance(c, type) and issubclass(c, keras.optimizers.Optimizer)]
    bases += list(custom_optimizers or [])
    objects = {}
    for base in bases:
        cls = _distributed_class(base)
        objects[base.__name__] = cls
        objects[base.__name__.lower()] = cls
    objects.update(custom_objects or {})
    return keras.models.load_model(filepath, custom_objects=objects)
