"""Adasum for kolo.tensorflow: allreduce(op=hvd.Adasum), grouped_allreduce
and DistributedGradientTape(op=hvd.Adasum), as kolo.torch serves it
(kolo/torch/adasum.py has the formula and the tree).

The agent has no Adasum reduction, so every rank's tensor is gathered (one
KoloAllgather, or one KoloGroupedAllgather for a group) and every rank
evaluates Horovod's tree in the same order with TensorFlow ops: at distance 1
ranks (0,1), (2,3), ... combine, at distance 2 the results of (0,1) and (2,3),
and so on; each level's result is rounded to the tensor's dtype, the dot
product and the norms taken in float64:

    adasum(a, b) = (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b

(a coefficient is 1 where that squared norm is below 1e-8). Each tensor of a
group has its own coefficients, as Horovod's fused Adasum keeps them per
tensor. Every rank holds the same bits. It moves size times the data of an
allreduce (docs/tensorflow.md).

Gradient: Horovod registers allreduce's gradient as the same allreduce of the
gradient, so the gradient of an Adasum allreduce is the Adasum allreduce of
the incoming gradient (with the same scale factors), not the derivative of
the tree.
"""

import tensorflow as tf

from ..process_sets import global_process_set, resolve as _resolve_set
from . import mpi_ops

# Horovod's threshold below which a squared norm counts as zero.
_NORM_EPS = 1e-8

FLOAT_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)


def check_dtype(tensor, what):
    if tensor.dtype not in FLOAT_DTYPES:
        raise ValueError("kolo %s: Adasum combines floating point tensors only (float16, "
                         "bfloat16, float32, float64); got %s" % (what, tensor.dtype.name))


def scaled(t, factor):
    """t * factor as Horovod scales a CPU buffer (ScaleBufferCPUImpl): float32
    by the factor rounded to float32, float16/bfloat16 the same through
    float32, float64 in float64."""
    if factor == 1.0:
        return t
    if t.dtype == tf.float64:
        return t * tf.constant(factor, tf.float64)
    if t.dtype == tf.float32:
        return t * tf.constant(factor, tf.float32)
    return tf.cast(tf.cast(t, tf.float32) * tf.constant(factor, tf.float32), t.dtype)


def _coefficient(dot, normsq):
    ok = normsq >= _NORM_EPS
    safe = tf.where(ok, normsq, tf.ones_like(normsq))
    return tf.where(ok, 1.0 - dot / safe * 0.5, tf.ones_like(normsq))


def combine(a, b):
    """adasum(a, b) of two flat tensors of one dtype, rounded to it."""
    a64, b64 = tf.cast(a, tf.float64), tf.cast(b, tf.float64)
    dot = tf.reduce_sum(a64 * b64)
    anormsq = tf.reduce_sum(a64 * a64)
    bnormsq = tf.reduce_sum(b64 * b64)
    return tf.cast(_coefficient(dot, anormsq) * a64 + _coefficient(dot, bnormsq) * b64, a.dtype)


def tree(rows, n):
    """Adasum over the n rows of a (n, count) tensor, in Horovod's order."""
    parts = [rows[i] for i in range(n)]
    distance = 1
    while distance < n:
        for i in range(0, n, 2 * distance):
            if i + distance < n:
                parts[i] = combine(parts[i], parts[i + distance])
        distance *= 2
    return parts[0]


def _gather_name(prefix, tensor, name):
    """One name for the gather on every rank: the allreduce's name, or in a
    graph the input tensor's (as an unnamed op is named); eagerly unnamed
    ops run one after another and share the op's name."""
    if name is not None or tf.executing_eagerly():
        return name
    return "%s_%s" % (prefix, mpi_ops._normalize_name(tensor.name))


def _forward(tensors, names, prescale, postscale, ps, n):
    flats = [tf.reshape(scaled(t, prescale), [1, -1]) for t in tensors]
    if len(flats) == 1:
        rows = [mpi_ops.allgather(flats[0], name=names, process_set=ps)]
    else:
        rows = mpi_ops.grouped_allgather(flats, name=names, process_set=ps)
    return [scaled(tf.reshape(tree(r, n), tf.shape(t)), postscale)
            for r, t in zip(rows, tensors)]


def grouped_allreduce(tensors, name=None, prescale_factor=1.0, postscale_factor=1.0,
                      process_set=global_process_set, what="grouped_allreduce"):
    """Adasum of each tensor over the set (one gather for the group)."""
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if not tensors:
        return []
    for t in tensors:
        check_dtype(t, what)
    n = _resolve_set(process_set, what).size
    prefix = "KoloAdasum" if len(tensors) == 1 else "KoloGroupedAdasum"
    gname = _gather_name(prefix, tensors[0], name)

    @tf.custom_gradient
    def adasum(*xs):
        out = _forward(list(xs), gname, prescale_factor, postscale_factor, process_set, n)

        def grad(*dys):
            dys = [tf.zeros_like(x) if d is None else d for d, x in zip(dys, xs)]
            return grouped_allreduce(dys, None, prescale_factor, postscale_factor, process_set,
                                     what)
        return out, grad

    return list(adasum(*tensors))


def allreduce(tensor, name=None, prescale_factor=1.0, postscale_factor=1.0,
              process_set=global_process_set):
    """Adasum of `tensor` over the set, the same bits on every rank."""
    return grouped_allreduce([tensor], name, prescale_factor, postscale_factor, process_set,
                             "allreduce")[0]
