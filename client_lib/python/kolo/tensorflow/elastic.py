"""kolo.tensorflow.elastic: Horovod's elastic API for TensorFlow and Keras
(horovod/tensorflow/elastic.py) on kolo, with the semantics of
kolo.torch.elastic (docs/elastic.md):

    state = hvd.elastic.TensorFlowKerasState(model, optimizer, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        ...
        state.commit()

A collective of a generation that ended fails with a TensorFlow error
carrying KOLO_ERR_MEMBERSHIP_CHANGED; run() then restores the last commit,
learns the new world, runs the reset callbacks, syncs the state from rank 0 and calls the function
again. HostsUpdatedInterrupt (from commit()) keeps the state as committed.
As in kolo.torch, the reset callbacks run once the new world is known
(``hvd.size()`` there is the new size). The shared logic: kolo/_elastic.py.
"""

import numpy as np
import tensorflow as tf

from .. import _elastic
from .._elastic import HostsUpdatedInterrupt
from ..errors import KoloInternalError
from .functions import broadcast_object, broadcast_variables
from .mpi_ops import Sum, _allreduce

__all__ = ["HostsUpdatedInterrupt", "ObjectState", "State", "TensorFlowKerasState",
           "TensorFlowState", "run"]

# A failed op inside a TensorFlow kernel surfaces as a tf.errors.OpError
# whose text carries the C ABI's error name.
_MARK = "KOLO_ERR_MEMBERSHIP_CHANGED"

_FW = _elastic.Framework(
    "kolo.tensorflow", (tf.errors.OpError, KoloInternalError),
    lambda name: _allreduce(tf.zeros([1]), name=name, op=Sum), broadcast_object,
    lambda e: isinstance(e, tf.errors.OpError) and _MARK in str(e))


class State(_elastic.State):
    """Horovod's elastic State (kolo/_elastic.py), for TensorFlow."""

    _fw = _FW


class ObjectState(_elastic.ObjectStateMixin, State):
    """Picklable attributes (kwargs), synced by broadcast_object from rank 0."""


def _optimizer_variables(opt):
    v = getattr(opt, "variables", None)
    return list(v() if callable(v) else (v or []))


class TensorFlowState(ObjectState):
    """tf.Variables (and picklable kwargs): saved as numpy copies, synced by
    broadcast from rank 0."""

    def __init__(self, variables=None, session=None, **kwargs):
        self.variables = list(variables or [])
        self._values = None
        super().__init__(**kwargs)
        self._save_variables()

    def _all_variables(self):
        return self.variables

    def _save_variables(self):
        self._values = [np.array(v.numpy(), copy=True) for v in self._all_variables()]

    def save(self):
        self._save_variables()
        super().save()

    def restore(self):
        for v, value in zip(self._all_variables(), self._values or []):
            v.assign(value)
        super().restore()

    def sync(self):
        vs = self._all_variables()
        if vs:
            broadcast_variables(vs, root_rank=0)
        self._save_variables()
        super().sync()


class TensorFlowKerasState(TensorFlowState):
    """A Keras model and its optimizer (its variables as they exist when
    saved: build the optimizer, e.g. one step, before the first commit for
    its slots to be part of the state), plus picklable kwargs."""

    def __init__(self, model, optimizer=None, backend=None, **kwargs):
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        super().__init__(variables=None, **kwargs)

    def _all_variables(self):
        vs = list(self.model.variables)
        if self.optimizer is not None:
            vs += _optimizer_variables(self.optimizer)
        return vs

    def restore(self):
        values = self._values or []
        vs = self._all_variables()
        for v, value in zip(vs, values):
            if tuple(v.shape) == value.shape:
                v.assign(value)
        ObjectState.restore(self)


run = _elastic.make_run(_FW)
