"""hvd.DistributedOptimizer for kolo.tensorflow: a Keras optimizer gets
kolo.tensorflow.keras's wrapper; a tf.compat.v1.train.Optimizer gets its
gradients reduced in compute_gradients (Horovod's _DistributedOptimizer)."""

import tensorflow as tf

from ..process_sets import global_process_set
from .compression import Compression
from .gradient_tape import make_allreduce_grads_fn
from .mpi_ops import Average, _op_value


def DistributedOptimizer(optimizer, name=None, use_locking=False, device_dense="",
                         device_sparse="", compression=Compression.none, sparse_as_dense=False,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=global_process_set, scale_local_gradients=True):
    if not isinstance(optimizer, tf.compat.v1.train.Optimizer):
        from .keras import DistributedOptimizer as _keras_opt
        return _keras_opt(optimizer, name=name, compression=compression,
                          sparse_as_dense=sparse_as_dense,
                          backward_passes_per_step=backward_passes_per_step, op=op,
                          gradient_predivide_factor=gradient_predivide_factor,
                          average_aggregated_gradients=average_aggregated_gradients,
                          num_groups=num_groups, groups=groups, process_set=process_set)
    if backward_passes_per_step != 1:
        raise NotImplementedError("kolo: backward_passes_per_step > 1 is supported for Keras "
                                  "optimizers only (docs/tensorflow.md)")
    op = _op_value(op, None, "DistributedOptimizer")
    fn = make_allreduce_grads_fn(name or "DistributedOptimizer", compression, sparse_as_dense, op,
                                 gradient_predivide_factor, process_set, num_groups, groups)
    base = optimizer.__class__

    def compute_gradients(self, *args, **kwargs):
        gv = base.compute_gradients(self, *args, **kwargs)
        grads = fn([g for g, _ in gv])
        return list(zip(grads, [v for _, v in gv]))

    cls = type(base.__name__, (base,), {"compute_gradients": compute_gradients})
    optimizer.__class__ = cls
    return optimizer
