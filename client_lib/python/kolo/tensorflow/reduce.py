"""allreduce / grouped_allreduce / reducescatter with Horovod's Python
signatures (compression, IndexedSlices, scale factors) over mpi_ops."""

import tensorflow as tf

from ..process_sets import global_process_set, resolve as _resolve_set
from . import adasum as _adasum
from .compression import Compression
from .mpi_ops import (Adasum, Average, Sum, _allreduce, _grouped_allreduce, _grouped_reducescatter,
                      _op_value, _reducescatter, allgather)


def allreduce(tensor, average=None, device_dense="", device_sparse="",
              compression=Compression.none, op=None, prescale_factor=1.0, postscale_factor=1.0,
              name=None, process_set=global_process_set, ignore_name_scope=False):
    """Reduces `tensor` over the ranks of the set (default op Average).
    An IndexedSlices is allgathered (values and indices), its values
    divided by the size for Average, as Horovod does."""
    op = _op_value(op, average, "allreduce", adasum=True)
    if isinstance(tensor, tf.IndexedSlices):
        if op == Adasum:
            raise NotImplementedError("kolo allreduce: Adasum does not support sparse tensors "
                                      "(IndexedSlices); pass sparse_as_dense=True to "
                                      "DistributedGradientTape, as Horovod says")
        if op not in (Average, Sum):
            raise ValueError("kolo allreduce: IndexedSlices take Average or Sum only")
        values = allgather(tensor.values, name=None if name is None else name + ".values",
                           process_set=process_set)
        indices = allgather(tensor.indices, name=None if name is None else name + ".indices",
                            process_set=process_set)
        scale = prescale_factor * postscale_factor
        if op == Average:
            scale /= _resolve_set(process_set, "allreduce").size
        if scale != 1.0:
            values = values * tf.cast(scale, values.dtype)
        return tf.IndexedSlices(values, indices, dense_shape=tensor.dense_shape)
    tensor = tf.convert_to_tensor(tensor)
    compressed, ctx = compression.compress(tensor)
    if op == Adasum:
        reduced = _adasum.allreduce(compressed, name=name, prescale_factor=prescale_factor,
                                    postscale_factor=postscale_factor, process_set=process_set)
    else:
        reduced = _allreduce(compressed, name=name, op=op, prescale_factor=prescale_factor,
                             postscale_factor=postscale_factor,
                             ignore_name_scope=ignore_name_scope, process_set=process_set)
    return compression.decompress(reduced, ctx)


def grouped_allreduce(tensors, average=None, device_dense="", device_sparse="",
                      compression=Compression.none, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=global_process_set,
                      ignore_name_scope=False, name=None):
    """allreduce of every tensor as one atomic, fused group."""
    op = _op_value(op, average, "grouped_allreduce", adasum=True)
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    comp = [compression.compress(t) for t in tensors]
    if op == Adasum:
        red = _adasum.grouped_allreduce([c[0] for c in comp], name=name,
                                        prescale_factor=prescale_factor,
                                        postscale_factor=postscale_factor,
                                        process_set=process_set)
    else:
        red = _grouped_allreduce([c[0] for c in comp], name=name, op=op,
                                 prescale_factor=prescale_factor,
                                 postscale_factor=postscale_factor,
                                 ignore_name_scope=ignore_name_scope, process_set=process_set)
    return [compression.decompress(r, c[1]) for r, c in zip(red, comp)]


def _scaled(tensor, factor):
    if factor == 1.0:
        return tensor
    if tensor.dtype.is_integer:
        return tf.cast(tf.cast(tensor, tf.float64) * factor, tensor.dtype)
    return tensor * tf.cast(factor, tensor.dtype)


def reducescatter(tensor, device_dense="", compression=Compression.none, op=Average, name=None,
                  process_set=global_process_set, ignore_name_scope=False,
                  prescale_factor=1.0, postscale_factor=1.0):
    """Reduces `tensor` and returns this rank's block of rows (the first
    dim % size ranks get one row more), Horovod's reducescatter."""
    op = _op_value(op, None, "reducescatter")
    tensor = _scaled(tf.convert_to_tensor(tensor), prescale_factor)
    compressed, ctx = compression.compress(tensor)
    out = _reducescatter(compressed, name=name, op=op, ignore_name_scope=ignore_name_scope,
                         process_set=process_set)
    return _scaled(compression.decompress(out, ctx), postscale_factor)


def grouped_reducescatter(tensors, device_dense="", compression=Compression.none, op=Average,
                          process_set=global_process_set, ignore_name_scope=False,
                          prescale_factor=1.0, postscale_factor=1.0, name=None):
    op = _op_value(op, None, "grouped_reducescatter")
    tensors = [_scaled(tf.convert_to_tensor(t), prescale_factor) for t in tensors]
    comp = [compression.compress(t) for t in tensors]
    outs = _grouped_reducescatter([c[0] for c in comp], name=name, op=op,
                                  ignore_name_scope=ignore_name_scope, process_set=process_set)
    return [_scaled(compression.decompress(o, c[1]), postscale_factor) for o, c in zip(outs, comp)]
