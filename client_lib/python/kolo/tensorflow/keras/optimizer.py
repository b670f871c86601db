"""DistributedOptimizer for Keras (Horovod's horovod/_keras): a subclass of
the optimizer's own class whose gradients are reduced over the ranks
before they are applied. Keras 3 (tf.keras in TensorFlow 2.16+): apply()
is wrapped (fit and apply_gradients both go through it). Keras 2 (tf-keras,
TF_USE_LEGACY_KERAS=1): apply_gradients() is wrapped."""

from ...process_sets import global_process_set
from ..compression import Compression
from ..gradient_tape import make_allreduce_grads_fn
from ..mpi_ops import Adasum, Average, _op_value

_classes = {}


def _is_keras3(cls):
    return hasattr(cls, "stateless_apply")


def _distributed_class(base):
    """The distributed subclass of optimizer class `base` (one per class)."""
    if getattr(base, "_kolo_distributed", False):
        return base
    if base in _classes:
        return _classes[base]

    def _kolo_reduce(self, grads):
        fn = getattr(self, "_kolo_fn", None)
        if fn is None:
            self._kolo_fn = fn = make_allreduce_grads_fn(
                "DistributedOptimizer", Compression.none, False, Average, 1.0, global_process_set)
        return fn(grads)

    attrs = {"_kolo_distributed": True, "_kolo_reduce": _kolo_reduce, "__module__": base.__module__}
    if _is_keras3(base):
        def apply(self, grads, trainable_variables=None):
            return base.apply(self, self._kolo_reduce(list(grads)), trainable_variables)
        attrs["apply"] = apply
    else:
        def apply_gradients(self, grads_and_vars, *args, **kwargs):
            gv = list(grads_and_vars)
            grads = self._kolo_reduce([g for g, _ in gv])
            return base.apply_gradients(self, list(zip(grads, [v for _, v in gv])), *args, **kwargs)
        attrs["apply_gradients"] = apply_gradients
    cls = type(base.__name__, (base,), attrs)
    _classes[base] = cls
    return cls


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                         compression=Compression.none, sparse_as_dense=False,
                         gradient_predivide_factor=1.0, op=Average, backward_passes_per_step=1,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=global_process_set, scale_local_gradients=True):
    """A new optimizer of `optimizer`'s class and config whose gradients are
    reduced over the ranks (Average by default) before they are applied.

    backward_passes_per_step=N (Keras 3): the gradients of N passes are
    aggregated before one update (summed, or averaged with
    average_aggregated_gradients=True, as Horovod). Keras 3 accumulates them
    (its gradient_accumulation_steps); kolo reduces every pass."""
    if op == Adasum:
        raise ValueError("kolo DistributedOptimizer: op == Adasum is not supported yet with Keras "
                         "(as Horovod); use kolo.tensorflow.DistributedGradientTape(op=Adasum)")
    op = _op_value(op, None, "DistributedOptimizer")
    base = optimizer.__class__
    cls = _distributed_class(base)
    config = optimizer.get_config()
    post_extra = 1.0
    if backward_passes_per_step > 1:
        if not _is_keras3(base):
            raise NotImplementedError("kolo DistributedOptimizer: backward_passes_per_step > 1 "
                                      "needs Keras 3 (gradient_accumulation_steps); tf-keras "
                                      "optimizers are not supported (docs/tensorflow.md)")
        config["gradient_accumulation_steps"] = int(backward_passes_per_step)
        if not average_aggregated_gradients:
            post_extra = float(backward_passes_per_step)  # Keras averages; Horovod sums
    if name is not None:
        config["name"] = name
    new = cls.from_config(config)
    fn = make_allreduce_grads_fn("DistributedOptimizer", compression, sparse_as_dense, op,
                                 gradient_predivide_factor, process_set, num_groups, groups)
    if post_extra != 1.0:
        import tensorflow as tf
        inner = fn

        def fn(grads):
            return [None if g is None else g * tf.cast(post_extra, g.dtype) for g in inner(grads)]
    new._kolo_fn = fn
    return new
