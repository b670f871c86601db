"""The collectives of kolo.tensorflow as TensorFlow ops (Horovod's
horovod/tensorflow/mpi_ops.py): libkolo_tensorflow.so's asynchronous kernels
(client_lib/tensorflow), so they run eagerly and inside tf.function, and
their gradients, registered as Horovod registers them.

Names: a collective's tensor name must be the same on every rank. In a
graph (tf.function, Keras fit) an unnamed op is named after its input
tensor ("KoloAllreduce_<tensor>", made unique by TensorFlow within the
graph), as Horovod names them; the kernel then uses its node name. Eagerly
ops run one after another, so an unnamed one is named after its op.

XLA: a tf.function(jit_compile=True) that reaches a kolo op fails with
TensorFlow's "Detected unsupported operations ... KoloAllreduce" (XLA has
no kernel for them): reduce outside the jit-compiled function.
"""

import os
import re

import tensorflow as tf

from .. import _library, basics
from ..process_sets import global_process_set, resolve as _resolve_set

# Horovod's ReduceOp numbering (horovod/common/basics.py), the same as kolo_op_t.
Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5
_OP_NAMES = {Average: "Average", Sum: "Sum", Adasum: "Adasum", Min: "Min", Max: "Max",
             Product: "Product"}

_LIB_NAME = "libkolo_tensorflow.so"
_ops = None


def _library_candidates():
    env = os.environ.get("KOLO_TENSORFLOW_LIBRARY")
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    out = [os.path.join(os.path.dirname(here), _LIB_NAME)]  # pip install copies it there
    out.append(os.path.join(os.path.dirname(os.path.realpath(_library.library_path())), _LIB_NAME))
    build = os.environ.get("KOLO_BUILD_DIR")
    if build:
        out.append(os.path.join(build, "lib", _LIB_NAME))
    return out


@tf.autograph.experimental.do_not_convert
def load_ops():
    """Loads libkolo.so, then the op library (next to libkolo.so, in the
    package, $KOLO_BUILD_DIR/lib, or $KOLO_TENSORFLOW_LIBRARY)."""
    global _ops
    if _ops is not None:
        return _ops
    _library.lib()  # libkolo.so first: the op library links to this same copy
    tried = _library_candidates()
    found = [p for p in tried if os.path.exists(p)]
    if not found:
        raise ImportError("kolo.tensorflow: %s was not found (looked in: %s). Build kolo with "
                          "TensorFlow importable by KOLO_PYTHON (CMake builds it when it is; "
                          "docs/tensorflow.md) or set KOLO_TENSORFLOW_LIBRARY"
                          % (_LIB_NAME, ", ".join(tried)))
    _ops = tf.load_op_library(found[0])
    return _ops


def _normalize_name(name):
    """Horovod's: characters other than [A-Za-z0-9_] become '_'."""
    return re.sub("[^a-zA-Z0-9_]", "_", name)


_VALID_NODE_NAME = re.compile(r"^[A-Za-z0-9.][A-Za-z0-9_.\-/>]*$")


def _executing_eagerly():
    return tf.executing_eagerly()


def _names(prefix, tensor, name):
    """(node name, tensor_name attr) for a collective."""
    if _executing_eagerly():
        return None, name or prefix
    if name is None:
        name = "%s_%s" % (prefix, _normalize_name(tensor.name))
    elif not _VALID_NODE_NAME.match(name):
        name = "%s_%s" % (prefix, _normalize_name(name))  # what TensorFlow accepts as a node name
    return name, ""


def _set_id(process_set, what):
    return _resolve_set(process_set, what).id


def _op_value(op, average, what, adasum=False):
    """The op's value; Adasum only where `adasum` (allreduce, grouped
    allreduce, DistributedGradientTape: adasum.py)."""
    if average is not None:
        if op is not None:
            raise ValueError("kolo %s: give op or average, not both" % what)
        return Average if average else Sum
    op = Average if op is None else op
    if op == Adasum and not adasum:
        raise NotImplementedError("kolo %s: Adasum is not supported here (allreduce, "
                                  "grouped_allreduce and DistributedGradientTape take it)" % what)
    if op not in _OP_NAMES:
        raise ValueError("kolo %s: unknown op %r (Average, Sum, Adasum, Min, Max, Product)"
                         % (what, op))
    return op


def _allreduce(tensor, name=None, op=Sum, prescale_factor=1.0, postscale_factor=1.0,
               ignore_name_scope=False, process_set=global_process_set):
    """The KoloAllreduce op on a dense tensor."""
    node, tname = _names("KoloAllreduce", tensor, name)
    return load_ops().kolo_allreduce(tensor, reduce_op=op, prescale_factor=prescale_factor,
                                     postscale_factor=postscale_factor, tensor_name=tname,
                                     ignore_name_scope=ignore_name_scope,
                                     process_set_id=_set_id(process_set, "allreduce"), name=node)


def _grouped_allreduce(tensors, name=None, op=Sum, prescale_factor=1.0, postscale_factor=1.0,
                       ignore_name_scope=False, process_set=global_process_set):
    if not tensors:
        return []
    node, tname = _names("KoloGroupedAllreduce", tensors[0], name)
    return load_ops().kolo_grouped_allreduce(
        tensors, reduce_op=op, prescale_factor=prescale_factor, postscale_factor=postscale_factor,
        tensor_name=tname, ignore_name_scope=ignore_name_scope,
        process_set_id=_set_id(process_set, "grouped_allreduce"), name=node)


def allgather(tensor, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Concatenation of every rank's `tensor` along the first dimension
    (which may differ per rank), in rank order (Horovod's allgather)."""
    node, tname = _names("KoloAllgather", tensor, name)
    return load_ops().kolo_allgather(tensor, tensor_name=tname, ignore_name_scope=ignore_name_scope,
                                     process_set_id=_set_id(process_set, "allgather"), name=node)


def grouped_allgather(tensors, name=None, ignore_name_scope=False, process_set=global_process_set):
    if not tensors:
        return []
    node, tname = _names("KoloGroupedAllgather", tensors[0], name)
    return load_ops().kolo_grouped_allgather(
        tensors, tensor_name=tname, ignore_name_scope=ignore_name_scope,
        process_set_id=_set_id(process_set, "grouped_allgather"), name=node)


def broadcast(tensor, root_rank, name=None, ignore_name_scope=False,
              process_set=global_process_set):
    """The tensor of global rank `root_rank`, on every rank of the set."""
    node, tname = _names("KoloBroadcast", tensor, name)
    return load_ops().kolo_broadcast(tensor, root_rank=int(root_rank), tensor_name=tname,
                                     ignore_name_scope=ignore_name_scope,
                                     process_set_id=_set_id(process_set, "broadcast"), name=node)


def alltoall(tensor, splits=None, name=None, ignore_name_scope=False,
             process_set=global_process_set):
    """(output, received_splits): sends splits[d] rows to rank d (None: an
    even split) and returns the rows every rank sent here, from rank 0 up,
    with how many came from each (Horovod's alltoall)."""
    node, tname = _names("KoloAlltoall", tensor, name)
    splits = tf.zeros([0], tf.int32) if splits is None else tf.cast(splits, tf.int32)
    return load_ops().kolo_alltoall(tensor, splits, tensor_name=tname,
                                    ignore_name_scope=ignore_name_scope,
                                    process_set_id=_set_id(process_set, "alltoall"), name=node)


def _reducescatter(tensor, name=None, op=Sum, ignore_name_scope=False,
                   process_set=global_process_set):
    node, tname = _names("KoloReducescatter", tensor, name)
    return load_ops().kolo_reducescatter(tensor, reduce_op=op, tensor_name=tname,
                                         ignore_name_scope=ignore_name_scope,
                                         process_set_id=_set_id(process_set, "reducescatter"),
                                         name=node)


def _grouped_reducescatter(tensors, name=None, op=Sum, ignore_name_scope=False,
                           process_set=global_process_set):
    if not tensors:
        return []
    node, tname = _names("KoloGroupedReducescatter", tensors[0], name)
    return load_ops().kolo_grouped_reducescatter(
        tensors, reduce_op=op, tensor_name=tname, ignore_name_scope=ignore_name_scope,
        process_set_id=_set_id(process_set, "grouped_reducescatter"), name=node)


def barrier(process_set=global_process_set):
    """Returns once every rank of the set has entered the barrier."""
    load_ops().kolo_barrier(process_set_id=_set_id(process_set, "barrier"))


def join():
    """Horovod's join: this rank has no more data; returns the last rank to
    join once every rank has joined."""
    return int(load_ops().kolo_join())


def size_op(process_set=global_process_set, name=None):
    """The set's size as a tensor (Horovod's size_op)."""
    return tf.constant(_resolve_set(process_set, "size_op").size, tf.int32, name=name)


def rank_op(name=None):
    return tf.constant(basics.rank(), tf.int32, name=name)


def local_rank_op(name=None):
    return tf.constant(basics.local_rank(), tf.int32, name=name)


def local_size_op(name=None):
    return tf.constant(basics.local_size(), tf.int32, name=name)


def process_set_included_op(process_set=global_process_set, name=None):
    return tf.constant(1 if process_set.included() else 0, tf.int32, name=name)


# --- gradients (horovod/tensorflow/mpi_ops.py) ---------------------------

def _ps_of(op):
    from ..process_sets import _registered
    pid = op.get_attr("process_set_id")
    return global_process_set if pid == 0 else _registered[pid]


@tf.RegisterGradient("KoloAllreduce")
def _allreduce_grad(op, grad):
    """Horovod's: the same allreduce (op, scale factors, set) of the
    gradient, for every op. For Sum and Average that is the derivative; for
    Min, Max and Product it is Horovod's definition, not the derivative
    (docs/tensorflow.md)."""
    return _allreduce(grad, op=op.get_attr("reduce_op"),
                      prescale_factor=op.get_attr("prescale_factor"),
                      postscale_factor=op.get_attr("postscale_factor"),
                      ignore_name_scope=op.get_attr("ignore_name_scope"), process_set=_ps_of(op))


@tf.RegisterGradient("KoloGroupedAllreduce")
def _grouped_allreduce_grad(op, *grads):
    grads = [tf.zeros_like(x) if g is None else g for g, x in zip(grads, op.inputs)]
    return _grouped_allreduce(list(grads), op=op.get_attr("reduce_op"),
                              prescale_factor=op.get_attr("prescale_factor"),
                              postscale_factor=op.get_attr("postscale_factor"),
                              ignore_name_scope=op.get_attr("ignore_name_scope"),
                              process_set=_ps_of(op))


def _gather_grad_slice(x, grad, ps):
    """This rank's rows of the Average allreduce of `grad` (Horovod's
    allgather gradient: it averages the ranks' gradients, as if the loss
    were the ranks' mean)."""
    grad = _allreduce(grad, op=Average, process_set=ps)
    d = tf.reshape(tf.shape(x, out_type=tf.int64)[0], [1])
    sizes = allgather(d, process_set=ps)
    info = _resolve_set(ps, "allgather")
    splits = tf.split(grad, num_or_size_splits=sizes, axis=0, num=info.size)
    return splits[info.rank]


@tf.RegisterGradient("KoloAllgather")
def _allgather_grad(op, grad):
    return _gather_grad_slice(op.inputs[0], grad, _ps_of(op))


@tf.RegisterGradient("KoloGroupedAllgather")
def _grouped_allgather_grad(op, *grads):
    # One allreduce per tensor, as Horovod: TensorFlow may hand a float32 zero
    # gradient for an unused float64 output.
    ps = _ps_of(op)
    return [_gather_grad_slice(x, tf.zeros_like(y) if g is None else g, ps)
            for x, y, g in zip(op.inputs, op.outputs, grads)]


@tf.RegisterGradient("KoloBroadcast")
def _broadcast_grad(op, grad):
    """Horovod's: the Average allreduce of the gradient on the root, zeros
    elsewhere."""
    ps = _ps_of(op)
    reduced = _allreduce(grad, op=Average, process_set=ps)
    if basics.rank() != op.get_attr("root_rank"):
        return reduced * 0
    return reduced


@tf.RegisterGradient("KoloAlltoall")
def _alltoall_grad(op, grad_wrt_output, grad_wrt_received_splits):
    recv_splits = op.outputs[1]
    result, _ = alltoall(grad_wrt_output, splits=recv_splits, process_set=_ps_of(op))
    return [result, None]


def _scatter_grad(grad, reduce_op, ps):
    """Horovod's reducescatter gradient: the allgather of the gradient, times
    the set's size for Sum (Average: as it is). The scale factors are
    TensorFlow multiplications around the op (reduce.py), differentiated
    by TensorFlow, as Horovod multiplies the gradient by them."""
    if reduce_op == Sum:
        grad = grad * tf.cast(_resolve_set(ps, "reducescatter").size, grad.dtype)
    return allgather(grad, process_set=ps)


@tf.RegisterGradient("KoloReducescatter")
def _reducescatter_grad(op, grad):
    return _scatter_grad(grad, op.get_attr("reduce_op"), _ps_of(op))


@tf.RegisterGradient("KoloGroupedReducescatter")
def _grouped_reducescatter_grad(op, *grads):
    ps, rop = _ps_of(op), op.get_attr("reduce_op")
    return [_scatter_grad(tf.zeros_like(y) if g is None else g, rop, ps)
            for y, g in zip(op.outputs, grads)]
