"""kolo.torch.elastic: Horovod's elastic training API on kolo.

    import kolo.torch as hvd
    hvd.init()
    state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)
    state.register_reset_callbacks([lambda: print("new world:", hvd.size())])

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            for state.batch in range(state.batch, batches):
                step()
                if state.batch % 10 == 0:
                    state.commit()
            state.batch = 0

    train(state)

Run it with ``kolorun -np N --min-np M [--max-np K] [--host-discovery-script
S] python train.py`` (docs/elastic.md).

When the job's membership changes (a node is lost, or a trainer restarted;
an added node is admitted at the next ``commit()``), the coordinator seals a
new generation and every collective of the old one fails with
KOLO_ERR_MEMBERSHIP_CHANGED. ``run`` catches it,
restores the state of the last ``commit()`` (the steps since are lost),
learns the new world (a one-element allreduce over the new generation),
runs the reset callbacks (``hvd.size()`` there is the new size, as in
Horovod) and syncs the state from rank 0 of the new generation,
then calls the function again. ``HostsUpdatedInterrupt`` (raised by
``commit()`` / ``check_host_updates()`` when the generation changed since the
last sync) keeps the state as just committed. Any other error (the job
failed, e.g. below --min-np for --elastic-timeout) propagates. Unlike
Horovod there is nothing to re-initialize: the same session goes on with the
new world (``rank()`` and ``size()`` report it).
"""

import copy
import math
import random

import torch

from .. import _elastic
from .._elastic import HostsUpdatedInterrupt
from ..errors import KoloInternalError
from .functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters
from .mpi_ops import allreduce

__all__ = ["ElasticSampler", "HostsUpdatedInterrupt", "ObjectState", "State", "TorchState", "run"]

_FW = _elastic.Framework("kolo.torch", (KoloInternalError,),
                         lambda name: allreduce(torch.zeros(1), name=name), broadcast_object)


class State(_elastic.State):
    """Horovod's elastic State (kolo/_elastic.py): save/restore/sync are the
    subclass's; commit() saves, then checks for a membership change; reset
    callbacks run after each change, once the new world is known."""

    _fw = _FW


class ObjectState(_elastic.ObjectStateMixin, State):
    """State made of picklable attributes (kwargs): saved by value, synced by
    broadcast_object from rank 0."""


class ElasticSampler(torch.utils.data.Sampler):
    """Horovod's ElasticSampler: splits a dataset's indices among the ranks
    and, after the world changes, splits the ones not yet processed in this
    epoch among the new ranks.

    The indices of an epoch (shuffled with seed + epoch when `shuffle`) skip
    the `processed_num` already done; the rest is padded by repeating its
    head to a multiple of size(), and rank r takes every size()-th index
    from position r. Keep the sampler in a TorchState (it is then saved,
    restored and synced from rank 0 with the state, and re-split at every
    reset), call record_batch() after each batch and set_epoch() at the end
    of each epoch."""

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0
        self.processed_indices = set()  # (Horovod's attribute; unused)
        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices = []
        self.num_samples = 0
        self.total_size = 0
        self.reset()

    def set_epoch(self, epoch):
        """Starts epoch `epoch` from its first index (call it at the end of
        an epoch, so that a partial epoch is not repeated)."""
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """Counts a batch of `batch_size` samples as processed on every rank."""
        self.processed_num += batch_size * self.num_replicas

    def state_dict(self):
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state_dict):
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.reset()

    def reset(self):
        """Re-splits the remaining indices of the epoch among the current ranks."""
        self.num_replicas = basics.size()
        self.rank = basics.rank()
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        self.remaining_indices = order[self.processed_num:]
        self.num_samples = int(math.ceil(len(self.remaining_indices) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self):
        idx = list(self.remaining_indices)
        idx += idx[:self.total_size - len(idx)]
        self.indices = idx[self.rank:self.total_size:self.num_replicas]
        return iter(self.indices)

    def __len__(self):
        return self.num_samples


class TorchState(ObjectState):
    """Horovod's TorchState: a model's and an optimizer's state_dict (copied
    at commit, loaded at restore, broadcast from rank 0 at sync) plus any
    other attributes as keyword arguments (epoch=0, batch=0, ...). An
    ElasticSampler among them is kept by its state_dict and re-split among
    the ranks at every sync."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        self.model = model
        self.optimizer = optimizer
        self._saved_model = None
        self._saved_optimizer = None
        self._samplers = {k: v for k, v in kwargs.items() if isinstance(v, ElasticSampler)}
        self._saved_samplers = {}
        for k, v in self._samplers.items():
            setattr(self, k, v)
        super().__init__(**{k: v for k, v in kwargs.items() if k not in self._samplers})
        self._save_torch()

    def _save_torch(self):
        if self.model is not None:
            self._saved_model = copy.deepcopy(self.model.state_dict())
        if self.optimizer is not None:
            self._saved_optimizer = copy.deepcopy(self.optimizer.state_dict())
        self._saved_samplers = {k: s.state_dict() for k, s in self._samplers.items()}

    def save(self):
        self._save_torch()
        super().save()

    def restore(self):
        if self.model is not None and self._saved_model is not None:
            self.model.load_state_dict(self._saved_model)
        if self.optimizer is not None and self._saved_optimizer is not None:
            self.optimizer.load_state_dict(self._saved_optimizer)
        for k, s in self._samplers.items():
            if k in self._saved_samplers:
                s.load_state_dict(self._saved_samplers[k])
        super().restore()

    def sync(self):
        if self.model is not None:
            broadcast_parameters(self.model.state_dict(), root_rank=0)
        if self.optimizer is not None:
            broadcast_optimizer_state(self.optimizer, root_rank=0)
        if self._samplers:
            states = broadcast_object({k: s.state_dict() for k, s in self._samplers.items()},
                                      root_rank=0, name="__kolo.elastic.samplers")
            for k, st in states.items():
                self._samplers[k].load_state_dict(st)  # re-splits among the current ranks
        super().sync()
        # What every rank now has is the state to come back to.
        self._save_torch()
        ObjectState.save(self)

    def reset(self):
        # A DistributedOptimizer may hold handles of the failed step.
        handles = getattr(self.optimizer, "_handles", None)
        if isinstance(handles, dict):
            handles.clear()


run = _elastic.make_run(_FW)
