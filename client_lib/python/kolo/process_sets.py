"""Process sets (Horovod's API) on libkolo's kolo_add_process_set & co.

A process set is a subset of the job's ranks with its own negotiation, so
collectives on different sets run concurrently. Every collective of
kolo.torch takes ``process_set=`` (default ``global_process_set``, every
rank); on a set everything is relative to the set: Average divides by the
set's size, allgather concatenates and reducescatter / alltoall split in
the set's rank order (ascending global rank), alltoall's splits have one
entry per member, and a broadcast's ``root_rank`` stays a *global* rank
that must be in the set (Horovod's convention). A rank outside the set
that calls a collective on it gets ValueError.

    hvd.init(process_sets=[hvd.ProcessSet([0, 2]), hvd.ProcessSet([1, 3])])
    # or, after init (every rank, in the same order):
    even = hvd.add_process_set([0, 2])
    hvd.allreduce(x, process_set=even)
    hvd.remove_process_set(even)

Adding and removing are collective over the whole job (every rank calls
them, in the same order, with the same ranks); a disagreement, a duplicate
set, a list with a duplicate or out-of-range rank, or the list of every
rank (that is ``global_process_set``) raise ValueError on every rank with
libkolo's message. Sets are forgotten at shutdown (their ProcessSet
objects get ``process_set_id = None``).
"""

import ctypes
import threading

from . import _library, basics
from .errors import ERR_INVALID_ARGUMENT, OK, KoloInternalError

_lock = threading.Lock()
_registered = {}  # id -> ProcessSet, for the sets added in this session


class ProcessSet:
    """A set of global ranks a collective runs over (Horovod's ProcessSet).

    ``ProcessSet(ranks)`` only describes the set; it becomes usable once
    registered with ``add_process_set`` or ``init(process_sets=[...])``,
    which sets ``process_set_id``. ``ranks`` is the ascending list of
    global ranks. ``size()``, ``rank()`` and ``included()`` return None
    while the set is not registered (as Horovod's do).
    """

    process_set_id = None

    def __init__(self, ranks_or_comm):
        if isinstance(ranks_or_comm, (str, bytes)) or not hasattr(ranks_or_comm, "__iter__"):
            raise ValueError("kolo ProcessSet takes a list of global ranks, got %r (MPI "
                             "communicators are not supported: kolo does not use MPI)"
                             % (ranks_or_comm,))
        try:
            self.ranks = sorted(_as_rank(r) for r in ranks_or_comm)
        except (TypeError, ValueError):
            raise ValueError("kolo ProcessSet takes a list of int ranks, got %r" % (ranks_or_comm,))

    def _invalidate(self):
        self.process_set_id = None

    def size(self):
        """Number of ranks in the set (None while the set is not registered)."""
        if self.process_set_id is None:
            return None
        if self.process_set_id == 0:
            return basics.size()
        v = _library.lib().kolo_process_set_size(self.process_set_id)
        return None if v < 0 else v

    def rank(self):
        """This process's rank within the set: its place in ``ranks`` (None
        while the set is not registered; -1 on a rank outside the set)."""
        if self.process_set_id is None:
            return None
        if self.process_set_id == 0:
            return basics.rank()
        if _library.lib().kolo_process_set_size(self.process_set_id) < 0:
            return None
        return _library.lib().kolo_process_set_rank(self.process_set_id)

    def included(self):
        """True if this process belongs to the set (None while not registered)."""
        if self.process_set_id is None:
            return None
        if self.process_set_id == 0:
            return True
        r = self.rank()
        return None if r is None else r >= 0

    def __eq__(self, other):
        if not isinstance(other, ProcessSet):
            return NotImplemented
        return self.process_set_id == other.process_set_id and self.ranks == other.ranks

    def __ne__(self, other):
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self):
        # The ranks only: the id changes when the set is registered.
        return hash(tuple(self.ranks or ()))

    def __repr__(self):
        return "ProcessSet(process_set_id=%s, ranks=%s)" % (self.process_set_id, self.ranks)

    __str__ = __repr__


def _as_rank(r):
    if isinstance(r, bool) or int(r) != r:
        raise TypeError(r)
    return int(r)


class _GlobalProcessSet(ProcessSet):
    """Every rank of the job (id 0); its ranks are known once initialized."""

    process_set_id = 0

    def __init__(self):
        pass

    @property
    def ranks(self):
        try:
            return list(range(basics.size()))
        except ValueError:  # not initialized
            return None

    def _invalidate(self):
        pass  # the global set always exists

    def __repr__(self):
        return "ProcessSet(process_set_id=0, ranks=all)"

    __str__ = __repr__


global_process_set = _GlobalProcessSet()


def _raise(st, what):
    msg = _library.last_error() or _library.status_string(st)
    if st == ERR_INVALID_ARGUMENT:
        raise ValueError(msg)
    raise KoloInternalError("%s: %s" % (what, msg) if what not in msg else msg, st)


def _ranks_of(ps_id):
    lib = _library.lib()
    n = lib.kolo_process_set_size(ps_id)
    if n < 0:
        return None
    buf = (ctypes.c_int * max(n, 1))()
    count = ctypes.c_int(0)
    st = lib.kolo_process_set_ranks(ps_id, buf, n, ctypes.byref(count))
    if st != OK:
        _raise(st, "kolo_process_set_ranks")
    return [buf[i] for i in range(min(count.value, n))]


def add_process_set(process_set):
    """Registers a process set and returns it (a ProcessSet, or a list of
    global ranks that becomes one). Collective over the whole job: every
    rank calls it, in the same order, with the same ranks -- members and
    non-members alike. Raises ValueError with libkolo's message when the
    ranks disagree, the set exists already, a rank is repeated or out of
    range, or the list names every rank (that set is global_process_set)."""
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if ps is global_process_set or isinstance(ps, _GlobalProcessSet):
        raise ValueError("kolo add_process_set: global_process_set (id 0) always exists; it "
                         "cannot be added")
    if not basics.is_initialized():
        raise ValueError(basics.NOT_INITIALIZED)
    ranks = list(ps.ranks)
    arr = (ctypes.c_int * max(len(ranks), 1))(*ranks)
    new_id = ctypes.c_int32(-1)
    # Always called, also for a set this rank could refuse by itself (one
    # already registered, say): libkolo makes every rank take part in the
    # agreement, so that the others never wait for a rank that gave up.
    st = _library.lib().kolo_add_process_set(arr, len(ranks), ctypes.byref(new_id))
    if st != OK:
        _raise(st, "kolo add_process_set")
    ps.process_set_id = int(new_id.value)
    ps.ranks = _ranks_of(ps.process_set_id) or ranks
    with _lock:
        _registered[ps.process_set_id] = ps
    return ps


def remove_process_set(process_set):
    """Removes a registered process set; collective over the whole job like
    add_process_set. Returns True if it was removed, False if there was
    nothing to remove (the global set, a set never added or already
    removed), as Horovod does. Operations still pending on the set fail
    with KoloInternalError (aborted). Other failures raise
    KoloInternalError."""
    if not isinstance(process_set, ProcessSet):
        raise ValueError("kolo remove_process_set expects a ProcessSet, got %r" % (process_set,))
    ps_id = process_set.process_set_id
    if ps_id is None or ps_id == 0:
        return False
    if not basics.is_initialized():
        raise ValueError(basics.NOT_INITIALIZED)
    st = _library.lib().kolo_remove_process_set(ps_id)
    if st == ERR_INVALID_ARGUMENT and _library.lib().kolo_process_set_size(ps_id) < 0:
        process_set._invalidate()  # libkolo does not know it (any more)
        with _lock:
            _registered.pop(ps_id, None)
        return False
    if st != OK:
        _raise(st, "kolo remove_process_set")
    process_set._invalidate()
    with _lock:
        _registered.pop(ps_id, None)
    return True


def forget_all():
    """At shutdown: libkolo drops every set; so do the ProcessSet objects."""
    with _lock:
        sets = list(_registered.values())
        _registered.clear()
    for ps in sets:
        ps._invalidate()


basics.add_shutdown_hook(forget_all)


class SetInfo:
    """What a collective needs to know about its set: the id libkolo takes,
    this rank's rank in the set, the set's size and its ranks (global)."""

    __slots__ = ("id", "rank", "size", "ranks")

    def __init__(self, ps_id, rank, size, ranks):
        self.id, self.rank, self.size, self.ranks = ps_id, rank, size, ranks

    def global_rank(self, set_rank):
        return self.ranks[set_rank]


def resolve(process_set, op_name):
    """The SetInfo of `process_set` for collective `op_name` (kolo must be
    initialized). Raises ValueError for something that is not a ProcessSet,
    a set that is not registered, and on a rank outside the set."""
    if process_set is None or process_set is global_process_set:
        n, r = basics.size(), basics.rank()
        return SetInfo(0, r, n, None)
    if not isinstance(process_set, ProcessSet):
        raise ValueError("kolo %s: process_set must be a ProcessSet, got %r"
                         % (op_name, process_set))
    ps_id = process_set.process_set_id
    if ps_id is None:
        if process_set.ranks == list(range(basics.size())):
            return resolve(global_process_set, op_name)  # every rank: the global set
        raise ValueError("kolo %s: process set with ranks %s is not registered; add it first "
                         "with add_process_set() (on every rank) or init(process_sets=[...])"
                         % (op_name, process_set.ranks))
    if ps_id == 0:
        return resolve(global_process_set, op_name)
    lib = _library.lib()
    n = lib.kolo_process_set_size(ps_id)
    if n < 0:
        raise ValueError("kolo %s: unknown process set %d (removed, or kolo was shut down since "
                         "it was added)" % (op_name, ps_id))
    r = lib.kolo_process_set_rank(ps_id)
    ranks = _ranks_of(ps_id)
    if r < 0:
        raise ValueError("kolo %s: rank %d is not in process set %d (ranks %s); only its "
                         "members run collectives on it" % (op_name, basics.rank(), ps_id, ranks))
    return SetInfo(ps_id, r, n, ranks)
