"""Keras callbacks of Horovod's elastic API (horovod/_keras/elastic.py):
with kolo.tensorflow.elastic's TensorFlowKerasState and run."""

import tensorflow as tf

from ..elastic import (  # noqa: F401
    HostsUpdatedInterrupt,
    ObjectState,
    State,
    TensorFlowKerasState,
    TensorFlowState,
    run,
)


class CommitStateCallback(tf.keras.callbacks.Callback):
    """Commits the state every `batches_per_commit` batches."""

    def __init__(self, state, batches_per_commit=1):
        super().__init__()
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_batch_end(self, batch, logs=None):
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit


class UpdateBatchStateCallback(tf.keras.callbacks.Callback):
    """Keeps state.batch current (and resumes an epoch at it)."""

    def __init__(self, state):
        super().__init__()
        self.state = state
        self.steps_per_epoch = None

    def on_epoch_begin(self, epoch, logs=None):
        if self.params.get("steps"):
            if self.steps_per_epoch is None:
                self.steps_per_epoch = self.params.get("steps")
            self.params["steps"] = self.steps_per_epoch - self.state.batch

    def on_batch_end(self, batch, logs=None):
        self.state.batch = batch

    def on_epoch_end(self, epoch, logs=None):
        self.state.batch = 0


class UpdateEpochStateCallback(tf.keras.callbacks.Callback):
    """Keeps state.epoch current."""

    def __init__(self, state):
        super().__init__()
        self.state = state
        self.initial_epoch = state.epoch

    def on_epoch_end(self, epoch, logs=None):
        self.state.epoch = self.initial_epoch + epoch + 1
