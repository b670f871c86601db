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
runs the reset callbacks, syncs the state from rank 0 and calls the function
again. HostsUpdatedInterrupt (from commit()) keeps the state as committed.
"""

import copy
import functools
import os
import time

import numpy as np
import tensorflow as tf

from .. import basics
from ..errors import ERR_MEMBERSHIP_CHANGED, KoloInternalError
from .functions import broadcast_object, broadcast_variables
from .mpi_ops import Sum, _allreduce

_MARK = "KOLO_ERR_MEMBERSHIP_CHANGED"


class HostsUpdatedInterrupt(RuntimeError):
    """The membership changed where the state is consistent (at commit())."""

    def __init__(self, skip_sync=False):
        super().__init__("the job's hosts were updated")
        self.skip_sync = skip_sync


def _membership_changed(e):
    if isinstance(e, KoloInternalError):
        return e.code == ERR_MEMBERSHIP_CHANGED
    return isinstance(e, tf.errors.OpError) and _MARK in str(e)


def _sync_deadline():
    try:
        t = float(os.environ.get("KOLO_ELASTIC_TIMEOUT") or 600)
    except ValueError:
        t = 600.0
    return time.monotonic() + (t if t > 0 else 600.0) + 30.0


class State:
    """save/restore/sync are the subclass's; commit() saves, then checks for
    a membership change (a one-element allreduce, as kolo.torch)."""

    def __init__(self):
        self._reset_callbacks = []
        self._world = None

    def register_reset_callbacks(self, callbacks):
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self):
        self.save()
        self.check_host_updates()

    def check_host_updates(self):
        if self._world is not None and (basics.rank(), basics.size()) != self._world:
            raise HostsUpdatedInterrupt()
        try:
            _allreduce(tf.zeros([1]), name="__kolo.elastic.commit", op=Sum)
        except (tf.errors.OpError, KoloInternalError) as e:
            if _membership_changed(e):
                raise HostsUpdatedInterrupt() from e
            raise

    def _synced(self):
        self._world = (basics.rank(), basics.size())

    def save(self):
        raise NotImplementedError()

    def restore(self):
        raise NotImplementedError()

    def sync(self):
        raise NotImplementedError()

    def reset(self):
        pass


class ObjectState(State):
    """Picklable attributes (kwargs), synced by broadcast_object from rank 0."""

    def __init__(self, **kwargs):
        super().__init__()
        self._saved_state = kwargs
        self._set_attrs()

    def save(self):
        self._saved_state = {k: copy.deepcopy(getattr(self, k)) for k in self._saved_state}

    def restore(self):
        self._set_attrs()

    def sync(self):
        if self._saved_state:
            self._saved_state = broadcast_object(self._saved_state, root_rank=0,
                                                 name="__kolo.elastic.state")
            self._set_attrs()

    def _set_attrs(self):
        for k, v in self._saved_state.items():
            setattr(self, k, copy.deepcopy(v))


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


def _sync(state):
    deadline = _sync_deadline()
    while True:
        try:
            state.sync()
            state._synced()
            return
        except (tf.errors.OpError, KoloInternalError) as e:
            if not _membership_changed(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def run(func):
    """Horovod's @hvd.elastic.run: calls func(state, ...) until it returns,
    restoring the last commit after a membership change."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        if not basics.is_initialized():
            raise ValueError("kolo.tensorflow.elastic.run: call kolo.tensorflow.init() first")
        while True:
            _sync(state)
            try:
                return func(state, *args, **kwargs)
            except HostsUpdatedInterrupt:
                pass
            except (tf.errors.OpError, KoloInternalError) as e:
                if not _membership_changed(e):
                    raise
                state.restore()
            state.on_reset()

    return wrapper
