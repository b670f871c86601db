"""What kolo.torch.elastic and kolo.tensorflow.elastic share: Horovod's
elastic State, ObjectState, HostsUpdatedInterrupt and @run, written once
over a small per-framework `Framework` (how it runs a one-element allreduce,
broadcasts an object and recognises a membership change). The semantics are
in docs/elastic.md:

- ``commit()`` saves, then checks for a membership change (a zero-cost
  world check, then a one-element allreduce named __kolo.elastic.commit, at
  which the agents admit the hosts waiting to join).
- ``run(func)`` calls func until it returns. A MEMBERSHIP_CHANGED failure
  restores the last commit; HostsUpdatedInterrupt keeps the state. Either way
  the new world is learnt first (a one-element allreduce that completes only
  in the current generation), then the reset callbacks run (``size()`` there
  is the new size, as in Horovod), then the state is synced from rank 0.
"""

import copy
import functools
import os
import time

from . import basics
from .errors import ERR_MEMBERSHIP_CHANGED, KoloInternalError


class HostsUpdatedInterrupt(RuntimeError):
    """The job's membership changed at a point where the state is consistent
    (after commit()): training restarts from the current state, without a
    restore. ``skip_sync`` is Horovod's flag (kolo always syncs)."""

    def __init__(self, skip_sync=False):
        super().__init__("the job's hosts were updated")
        self.skip_sync = skip_sync


class Framework:
    """One framework's side of elastic training.

    name: the module users call (``kolo.torch``), for messages.
    errors: the exception types a failed collective raises.
    allreduce_one(name): a one-element sum allreduce over the whole job.
    broadcast_object(obj, root_rank, name): Horovod's broadcast_object.
    membership_changed(e): whether `e` is a MEMBERSHIP_CHANGED failure.
    """

    def __init__(self, name, errors, allreduce_one, broadcast_object, membership_changed=None):
        self.name = name
        self.errors = tuple(errors)
        self.allreduce_one = allreduce_one
        self.broadcast_object = broadcast_object
        self._changed = membership_changed

    def membership_changed(self, e):
        if isinstance(e, KoloInternalError):
            return e.code == ERR_MEMBERSHIP_CHANGED
        return self._changed is not None and self._changed(e)


def sync_deadline():
    """How long a sync keeps retrying while the new generation forms: the
    job's elastic timeout (KOLO_ELASTIC_TIMEOUT, 600 s by default) plus a
    margin; the coordinator fails the job before that if it cannot form."""
    try:
        t = float(os.environ.get("KOLO_ELASTIC_TIMEOUT") or 600)
    except ValueError:
        t = 600.0
    return time.monotonic() + (t if t > 0 else 600.0) + 30.0


class State:
    """Horovod's elastic State: save/restore/sync are the subclass's; commit()
    saves, then checks for a membership change; reset callbacks run after
    each change, once the new world is known (rank() and size() are the new
    ones), before the state is synced. A framework module subclasses it with
    its `_fw` (a Framework)."""

    _fw = None

    def __init__(self):
        self._reset_callbacks = []
        self._world = None
        self._commits = 0

    def register_reset_callbacks(self, callbacks):
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self):
        """Saves the state (restore() goes back to it), then raises
        HostsUpdatedInterrupt if the membership changed since the last sync."""
        self.save()
        self._commits += 1
        self.check_host_updates()

    def check_host_updates(self):
        """A changed world this rank sees, or a MEMBERSHIP_CHANGED failure of
        the __kolo.elastic.commit allreduce, mean HostsUpdatedInterrupt."""
        if self._world is not None and (basics.rank(), basics.size()) != self._world:
            raise HostsUpdatedInterrupt()
        try:
            self._fw.allreduce_one("__kolo.elastic.commit")
        except self._fw.errors as e:
            if self._fw.membership_changed(e):
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


class ObjectStateMixin:
    """State made of picklable attributes (kwargs): saved by value, synced by
    broadcast_object from rank 0. Mixed into a framework's State."""

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
            self._saved_state = self._fw.broadcast_object(self._saved_state, root_rank=0,
                                                          name="__kolo.elastic.state")
            self._set_attrs()

    def _set_attrs(self):
        for k, v in self._saved_state.items():
            setattr(self, k, copy.deepcopy(v))


def _sync(fw, state, reset):
    """Learns the new world (an allreduce named __kolo.elastic.world: it
    completes only in the generation this rank's world now is, so once it
    returns rank() and size() are the new world's on every rank; Horovod
    learns it in hvd.init()), runs the reset callbacks when `reset` (they see
    the new rank() and size()), then syncs the state from rank 0. A further
    change meanwhile starts again (the callbacks run again for it)."""
    deadline = sync_deadline()
    seen = None  # the world the callbacks ran in
    while True:
        try:
            fw.allreduce_one("__kolo.elastic.world")
            if reset and seen != (basics.rank(), basics.size()):
                seen = (basics.rank(), basics.size())
                state.on_reset()
            state.sync()
            state._synced()
            return
        except fw.errors as e:
            # The new generation is still forming (or changed again): retry.
            if not fw.membership_changed(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def make_run(fw):
    """Horovod's @hvd.elastic.run for framework `fw`."""

    def run(func):
        @functools.wraps(func)
        def wrapper(state, *args, **kwargs):
            if not basics.is_initialized():
                raise ValueError("%s.elastic.run: call %s.init() first" % (fw.name, fw.name))
            reset = False
            while True:
                _sync(fw, state, reset)
                try:
                    return func(state, *args, **kwargs)
                except HostsUpdatedInterrupt:
                    pass
                except fw.errors as e:
                    if not fw.membership_changed(e):
                        raise
                    state.restore()
                reset = True

        return wrapper

    run.__doc__ = """Horovod's @hvd.elastic.run: calls func(state, ...) until it returns.
    Before each call the new world is learnt and the state synced from rank
    0. A MEMBERSHIP_CHANGED failure restores the last commit;
    HostsUpdatedInterrupt keeps the state; either way the reset callbacks
    run (after the new world is known: size() in a callback is the new
    size) and the function is called again."""
    return run
