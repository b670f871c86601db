"""broadcast_variables, broadcast_object, allgather_object (Horovod's
horovod/tensorflow/functions.py)."""

import io
import pickle

import numpy as np
import tensorflow as tf

from .. import basics
from ..process_sets import global_process_set
from .mpi_ops import allgather, broadcast


def broadcast_variables(variables, root_rank, process_set=global_process_set):
    """Assigns every variable the value it has on global rank `root_rank`."""
    variables = list(variables)
    if tf.executing_eagerly():
        for i, var in enumerate(variables):
            var.assign(broadcast(var, root_rank, name="broadcast_variables.%d" % i,
                                 process_set=process_set))
        return None
    return tf.group(*[var.assign(broadcast(var, root_rank, process_set=process_set))
                      for var in variables])


def _to_bytes_tensor(obj):
    buf = io.BytesIO()
    pickle.dump(obj, buf)
    return tf.constant(np.frombuffer(buf.getvalue(), dtype=np.uint8))


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """A picklable object of rank `root_rank`, on every rank (eager)."""
    name = name or "broadcast_object"
    if basics.rank() == root_rank:
        data = _to_bytes_tensor(obj)
        size = tf.constant([int(data.shape[0])], tf.int64)
    else:
        size = tf.constant([0], tf.int64)
    size = broadcast(size, root_rank, name=name + ".sz", process_set=process_set)
    if basics.rank() != root_rank:
        data = tf.zeros([int(size.numpy()[0])], tf.uint8)
    data = broadcast(data, root_rank, name=name + ".t", process_set=process_set)
    return pickle.loads(data.numpy().tobytes())


def allgather_object(obj, name=None, process_set=global_process_set):
    """The list of every rank's picklable `obj`, in rank order (eager)."""
    name = name or "allgather_object"
    data = _to_bytes_tensor(obj)
    sizes = allgather(tf.constant([int(data.shape[0])], tf.int64), name=name + ".sz",
                      process_set=process_set).numpy()
    gathered = allgather(data, name=name + ".t", process_set=process_set).numpy().tobytes()
    out, at = [], 0
    for s in sizes:
        out.append(pickle.loads(gathered[at:at + int(s)]))
        at += int(s)
    return out
