"""DistributedGradientTape (Horovod's horovod/tensorflow/__init__.py):
gradient() returns the gradients averaged (op) over the ranks."""

import tensorflow as tf

from .. import basics
from ..process_sets import global_process_set, resolve as _resolve_set
from .compression import Compression
from .mpi_ops import Adasum, Average, Sum, _grouped_allreduce, _op_value
from . import adasum as _adasum
from . import reduce as _reduce


def make_allreduce_grads_fn(name, compression, sparse_as_dense, op, gradient_predivide_factor,
                            process_set, num_groups=0, groups=None):
    """fn(grads) -> the gradients reduced over the set (None stays None).
    Average is split across prescale 1/predivide and postscale predivide
    (the op itself divides by the size), as Horovod does."""
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor is only supported with op=Average")
    pre, post = ((1.0 / gradient_predivide_factor, gradient_predivide_factor)
                 if op == Average else (1.0, 1.0))

    def allreduce_grads(grads):
        grads = list(grads)
        if sparse_as_dense:
            grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
                     for g in grads]
        if tf.executing_eagerly() and pre * post == 1.0 and \
                _resolve_set(process_set, name).size == 1:
            return grads  # (not in a graph: an elastic job's size may change after tracing)
        out = list(grads)
        dense = [i for i, g in enumerate(grads)
                 if g is not None and not isinstance(g, tf.IndexedSlices)]
        for i, g in enumerate(grads):
            if isinstance(g, tf.IndexedSlices):
                out[i] = _reduce.allreduce(g, op=op, prescale_factor=pre, postscale_factor=post,
                                           compression=compression, process_set=process_set)
        if not dense:
            return out
        if tf.executing_eagerly() or num_groups or groups:
            # One atomic, fused group per bucket (eagerly: one round trip).
            for bucket in _buckets(dense, grads, num_groups, groups):
                comp = [compression.compress(grads[i]) for i in bucket]
                gname = None if not tf.executing_eagerly() else "%s.%d" % (name, bucket[0])
                if op == Adasum:
                    red = _adasum.grouped_allreduce([c[0] for c in comp], name=gname,
                                                    process_set=process_set)
                else:
                    red = _grouped_allreduce([c[0] for c in comp], op=op, prescale_factor=pre,
                                             postscale_factor=post, process_set=process_set,
                                             name=gname)
                for i, r, c in zip(bucket, red, comp):
                    out[i] = compression.decompress(r, c[1])
        else:
            # In a graph each gradient is its own op, so reductions overlap backprop.
            for i in dense:
                out[i] = _reduce.allreduce(grads[i], op=op, prescale_factor=pre,
                                           postscale_factor=post, compression=compression,
                                           process_set=process_set)
        return out

    return allreduce_grads


def _buckets(dense, grads, num_groups, groups):
    if groups:
        return [[i for i in dense if any(grads[i] is g for g in grp)] for grp in groups] or [dense]
    if num_groups and num_groups > 1:
        k = max(1, -(-len(dense) // num_groups))
        return [dense[j:j + k] for j in range(0, len(dense), k)]
    return [dense]


_tape_classes = {}


def _distributed_tape_class(base):
    """A subclass of the tape's class whose gradient() reduces the result
    (as Horovod builds one), so the wrapped tape is still a GradientTape."""
    if base not in _tape_classes:
        def gradient(self, target, sources, output_gradients=None, **kwargs):
            grads = base.gradient(self, target, sources, output_gradients, **kwargs)
            flat = tf.nest.flatten(grads, expand_composites=False)
            return tf.nest.pack_sequence_as(grads, self._kolo_fn(flat), expand_composites=False)
        _tape_classes[base] = type(base.__name__, (base,), {"gradient": gradient,
                                                            "_kolo_distributed": True})
    return _tape_classes[base]


def DistributedGradientTape(gradtape, device_dense="", device_sparse="",
                            compression=Compression.none, sparse_as_dense=False, op=Average,
                            gradient_predivide_factor=1.0, num_groups=0, groups=None,
                            process_set=global_process_set, scale_local_gradients=True):
    """Horovod's DistributedGradientTape: tape.gradient(...) reduces every
    gradient over the ranks (Average by default; IndexedSlices by allgather,
    or densified with sparse_as_dense=True)."""
    if not basics.is_initialized():
        raise ValueError("kolo DistributedGradientTape: call kolo.tensorflow.init() first")
    op = _op_value(op, None, "DistributedGradientTape", adasum=True)
    fn = make_allreduce_grads_fn("DistributedGradientTape", compression, sparse_as_dense, op,
                                 gradient_predivide_factor, process_set, num_groups, groups)
    # The new tape shares the recorded tape's state (its attributes, which hold
    # the recording), as Horovod's wrapper takes over gradtape._tape.
    tape = object.__new__(_distributed_tape_class(gradtape.__class__))
    tape.__dict__.update(gradtape.__dict__)
    tape._kolo_fn = fn
    return tape


__all__ = ["DistributedGradientTape", "Average", "Sum"]
