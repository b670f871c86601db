"""Process sets (Horovod API). Stub until the agent supports them: the only
set that exists is the global one, containing every rank. Creating a set
that contains every rank returns an equivalent of the global set; any other
set raises KoloNotImplementedError."""

from .. import basics
from ..errors import KoloNotImplementedError


class ProcessSet:
    """A group of ranks a collective runs over. Only the set of all ranks is
    supported today (``global_process_set``)."""

    process_set_id = None

    def __init__(self, ranks_or_comm=None):
        if ranks_or_comm is None:
            self.ranks = None  # all ranks (resolved lazily: the size is known after init)
        else:
            self.ranks = sorted(int(r) for r in ranks_or_comm)

    def _all(self):
        return self.ranks is None or self.ranks == list(range(basics.size()))

    def size(self):
        return basics.size() if self.ranks is None else len(self.ranks)

    def rank(self):
        r = basics.rank()
        if self.ranks is None:
            return r
        return self.ranks.index(r) if r in self.ranks else -1

    def included(self):
        return self.ranks is None or basics.rank() in self.ranks

    def __eq__(self, other):
        return isinstance(other, ProcessSet) and self._key() == other._key()

    def __hash__(self):
        return hash(tuple(self._key()))

    def _key(self):
        if self.ranks is None:
            return ["all"]
        try:
            if self._all():
                return ["all"]
        except ValueError:
            pass
        return self.ranks

    def __repr__(self):
        return "ProcessSet(process_set_id=%s, ranks=%s)" % (
            self.process_set_id, "all" if self.ranks is None else self.ranks)


global_process_set = ProcessSet(None)
global_process_set.process_set_id = 0


def check(process_set, op_name):
    """Raises unless `process_set` is the global set (or equivalent)."""
    if process_set is None or process_set is global_process_set:
        return
    if not isinstance(process_set, ProcessSet):
        raise ValueError("kolo %s: process_set must be a ProcessSet, got %r" % (op_name, process_set))
    if not process_set._all():
        raise KoloNotImplementedError(
            "process sets",
            "%s on ranks %s: kolo runs collectives over all ranks of the job only "
            "(process sets are planned)" % (op_name, process_set.ranks))


def add_process_set(process_set):
    """Registers a process set. Only the set of all ranks is accepted."""
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    check(ps, "add_process_set")
    ps.process_set_id = 0
    return ps


def remove_process_set(process_set):
    if process_set is global_process_set or (isinstance(process_set, ProcessSet) and
                                             process_set.process_set_id == 0):
        return False
    raise KoloNotImplementedError("process sets", "remove_process_set")
