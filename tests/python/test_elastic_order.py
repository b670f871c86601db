"""The order kolo/_elastic.py's @run keeps after a membership change, for
every framework on it (kolo.torch and kolo.tensorflow share it): restore
the last commit, learn the new world, run the reset callbacks (size() there
is the new size), sync from rank 0, call the function again. In process,
over a Framework whose one-element allreduce stands for the daemons:
test_elastic.py checks the same code through kolorun with real agents (a
grow and a shrink), this test the order itself, for both Framework shapes,
in milliseconds."""

import pytest

from kolo import _elastic, basics
from kolo.errors import ERR_MEMBERSHIP_CHANGED, ERR_PEER_FAILURE, KoloInternalError


class World:
    """rank()/size() as libkolo reports them: the new world becomes visible
    once an op of the new generation completed (the world allreduce)."""

    def __init__(self, size):
        self.size = size
        self.pending = None
        self.log = []

    def allreduce_one(self, name):
        self.log.append(name)
        if name == "__kolo.elastic.world" and self.pending is not None:
            self.size, self.pending = self.pending, None

    def broadcast_object(self, obj, root_rank, name):
        self.log.append(name)
        return obj


@pytest.fixture
def world(monkeypatch):
    w = World(2)
    monkeypatch.setattr(basics, "is_initialized", lambda: True)
    monkeypatch.setattr(basics, "rank", lambda: 0)
    monkeypatch.setattr(basics, "size", lambda: w.size)
    return w


class FrameworkError(Exception):
    pass


def _framework(w, kind):
    if kind == "torch":
        return _elastic.Framework("kolo.torch", (KoloInternalError,), w.allreduce_one, w.broadcast_object)
    # TensorFlow's shape: a framework error whose text carries the status name.
    return _elastic.Framework("kolo.tensorflow", (FrameworkError, KoloInternalError), w.allreduce_one,
                              w.broadcast_object, lambda e: "KOLO_ERR_MEMBERSHIP_CHANGED" in str(e))


def _changed(kind):
    if kind == "torch":
        return KoloInternalError("membership changed", code=ERR_MEMBERSHIP_CHANGED)
    return FrameworkError("Aborted: KOLO_ERR_MEMBERSHIP_CHANGED: the job's generation ended")


@pytest.mark.parametrize("kind", ["torch", "tensorflow"])
@pytest.mark.parametrize("new_size", [3, 1])
def test_reset_callbacks_run_in_the_new_world_after_the_restore(world, kind, new_size):
    fw = _framework(world, kind)

    class State(_elastic.State):
        _fw = fw

    class ObjectState(_elastic.ObjectStateMixin, State):
        def restore(self):
            world.log.append("restore")
            super().restore()

    state = ObjectState(step=0)
    seen = []
    state.register_reset_callbacks([lambda: (world.log.append("callback"), seen.append(basics.size()))])
    calls = []

    @_elastic.make_run(fw)
    def train(state):
        calls.append(basics.size())
        if len(calls) == 1:
            state.step = 5
            state.commit()
            state.step = 7  # lost: not committed
            world.pending = new_size
            raise _changed(kind)
        return state.step

    assert train(state) == 5
    assert calls == [2, new_size]
    assert seen == [new_size]
    i = world.log.index("restore")
    assert world.log[i:i + 4] == ["restore", "__kolo.elastic.world", "callback", "__kolo.elastic.state"]


@pytest.mark.parametrize("kind", ["torch", "tensorflow"])
def test_a_failure_that_is_not_a_membership_change_propagates(world, kind):
    fw = _framework(world, kind)

    class State(_elastic.State):
        _fw = fw

    class ObjectState(_elastic.ObjectStateMixin, State):
        pass

    @_elastic.make_run(fw)
    def train(state):
        if kind == "torch":
            raise KoloInternalError("peer failed", code=ERR_PEER_FAILURE)
        raise FrameworkError("Internal: KOLO_ERR_PEER_FAILURE")

    with pytest.raises((KoloInternalError, FrameworkError), match="PEER_FAILURE|peer failed"):
        train(ObjectState(step=0))


def test_run_before_init_says_which_init(monkeypatch):
    monkeypatch.setattr(basics, "is_initialized", lambda: False)
    fw = _elastic.Framework("kolo.tensorflow", (KoloInternalError,), lambda n: None, lambda o, **k: o)
    with pytest.raises(ValueError, match=r"kolo.tensorflow.elastic.run: call kolo.tensorflow.init\(\) first"):
        _elastic.make_run(fw)(lambda s: None)(None)
