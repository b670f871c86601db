"""Keras callbacks of Horovod (horovod/_keras/callbacks.py) on kolo."""

import numpy as np
import tensorflow as tf

from ... import basics
from ..functions import broadcast_variables
from ..mpi_ops import Average
from ..reduce import allreduce

_Callback = tf.keras.callbacks.Callback


def _optimizer_variables(opt):
    v = getattr(opt, "variables", None)
    return list(v() if callable(v) else (v or []))


class BroadcastGlobalVariablesCallback(_Callback):
    """Broadcasts the model's and the optimizer's variables from `root_rank`
    at the end of the first batch (the optimizer's slots exist by then), so
    every rank continues from the same state, as Horovod does."""

    def __init__(self, root_rank=0, device=""):
        super().__init__()
        self.root_rank = root_rank
        self.broadcast_done = False

    def on_batch_end(self, batch, logs=None):
        if self.broadcast_done:
            return
        broadcast_variables(self.model.variables, root_rank=self.root_rank)
        opt_vars = _optimizer_variables(self.model.optimizer)
        if opt_vars:
            broadcast_variables(opt_vars, root_rank=self.root_rank)
        self.broadcast_done = True


class MetricAverageCallback(_Callback):
    """Averages the epoch's metrics over the ranks at the end of each epoch
    (put it before callbacks that read them, e.g. ModelCheckpoint)."""

    def __init__(self, device=""):
        super().__init__()

    def on_epoch_end(self, epoch, logs=None):
        if not logs:
            return
        for metric in sorted(logs):
            value = logs[metric]
            try:
                arr = np.asarray(value, dtype=np.float64)
            except (TypeError, ValueError):
                continue
            avg = allreduce(tf.constant(arr), op=Average, name="MetricAverage." + metric)
            logs[metric] = float(avg.numpy()) if arr.ndim == 0 else avg.numpy()


def _get_lr(opt):
    return float(np.asarray(opt.learning_rate))


class LearningRateScheduleCallback(_Callback):
    """lr = initial_lr * multiplier(epoch) from start_epoch up to end_epoch
    (per epoch with staircase, else per batch at fractional epochs).
    momentum_correction is accepted and has no effect (the momentum of
    Keras' optimizers is a constant of the compiled train step)."""

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                 momentum_correction=True, steps_per_epoch=None, verbose=0):
        super().__init__()
        self.initial_lr = initial_lr
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.steps_per_epoch = steps_per_epoch
        self.verbose = verbose
        self.current_epoch = None
        if not callable(multiplier):
            self.staircase = True
            self.multiplier = lambda epoch: multiplier
        else:
            self.multiplier = multiplier

    def _adjust_learning_rate(self, epoch):
        self.model.optimizer.learning_rate = self.initial_lr * self.multiplier(epoch)

    def on_train_begin(self, logs=None):
        if self.initial_lr is None:
            self.initial_lr = _get_lr(self.model.optimizer)
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = (self.params or {}).get("steps")
            if not self.steps_per_epoch:
                raise ValueError("kolo LearningRateScheduleCallback: could not tell the steps per "
                                 "epoch; pass steps_per_epoch=")

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch

    def on_batch_begin(self, batch, logs=None):
        if self.current_epoch < self.start_epoch or (
                self.end_epoch is not None and self.current_epoch >= self.end_epoch):
            return
        if self.staircase and batch == 0:
            self._adjust_learning_rate(self.current_epoch)
        elif not self.staircase:
            self._adjust_learning_rate(self.current_epoch + float(batch) / self.steps_per_epoch)

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["lr"] = _get_lr(self.model.optimizer)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Horovod's warmup: from initial_lr / size up to initial_lr over
    warmup_epochs, adjusted every batch."""

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True, steps_per_epoch=None,
                 verbose=0):
        def multiplier(epoch):
            epoch += 1.0 / self.steps_per_epoch
            n = basics.size()
            return 1.0 / n * (epoch * (n - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs,
                         staircase=False, momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch, verbose=verbose)

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0:
            print("\nEpoch %d: finished gradual learning rate warmup to %g."
                  % (epoch + 1, _get_lr(self.model.optimizer)))


__all__ = ["BroadcastGlobalVariablesCallback", "MetricAverageCallback",
           "LearningRateScheduleCallback", "LearningRateWarmupCallback", "Average"]
