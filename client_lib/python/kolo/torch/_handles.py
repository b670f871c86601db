"""Asynchronous operations, handles, poll and synchronize.

Every kolo.torch collective is a *stage generator*: it submits one or more
libkolo operations, yields the list of their C handles, and is resumed when
they have all completed (the next stage may submit more), until it returns
its result. Every native op has one stage; grouped ops run several
generators side by side (parallel()). The generator's frame keeps every
buffer alive until libkolo no longer touches it, and a generator whose C
handle owns a library result (allgather, alltoall) frees it when it ends,
however it ends. Besides C handles a stage may yield Deferred submissions
(allgather, alltoall: libkolo's submission itself waits for the other ranks,
so it runs on a thread of its own).

The handle returned to the user is a Python int indexing a table of such
operations, so poll()/synchronize() work the same for all of them.
"""

import ctypes
import hashlib
import itertools
import threading

from .. import _library, basics
from ..errors import (ERR_ABORTED, ERR_INVALID_ARGUMENT, ERR_TIMED_OUT, IN_PROGRESS, OK,
                      KoloInternalError)

MAX_NAME_BYTES = 255
MAX_DIMS = 8

_table = {}
_table_lock = threading.Lock()
_busy = {}  # (process set id, wire name) -> user handle, for user-named ops
_ids = itertools.count(1)
_noname = {}
_noname_lock = threading.Lock()


def require_init():
    if not _library.lib().kolo_is_initialized():
        raise ValueError(basics.NOT_INITIALIZED)


def op_name(kind, name, max_bytes=MAX_NAME_BYTES, ps=0):
    """The wire name of a collective: '<kind>.<name>', or '<kind>.noname.<n>'
    counted per kind and process set `ps` (every member of the set must then
    call unnamed ops on it in the same order, as with Horovod; names are per
    set in libkolo, so ops on other sets do not shift the count). Names
    longer than `max_bytes` (libkolo's limit, less what libkolo or
    kolo.torch append for an op's internal exchanges) are shortened with a
    hash, deterministically on every rank."""
    if name is None:
        key = kind if not ps else (kind, ps)
        with _noname_lock:
            n = _noname.get(key, 0)
            _noname[key] = n + 1
        full = "%s.noname.%d" % (kind, n)
    else:
        full = "%s.%s" % (kind, name)
    return fit_name(full, max_bytes)


def fit_name(full, max_bytes=MAX_NAME_BYTES):
    """`full` if its UTF-8 form fits in `max_bytes`, else a prefix of it plus
    '#' and 16 hex digits of its SHA-1 (the same on every rank)."""
    b = full.encode("utf-8")
    if len(b) > max_bytes:
        digest = hashlib.sha1(b).hexdigest()[:16]
        b = b[:max_bytes - 17].decode("utf-8", "ignore").encode("utf-8") + b"#" + digest.encode()
    return b.decode("utf-8")


def _shape_for_abi(shape):
    shape = [int(d) for d in shape]
    if len(shape) > MAX_DIMS:
        # libkolo takes at most 8 dims: fold the leading ones (same element count).
        lead = 1
        for d in shape[:len(shape) - MAX_DIMS + 1]:
            lead *= d
        shape = [lead] + shape[len(shape) - MAX_DIMS + 1:]
    return shape


def submit_allreduce(name, inp, out, kdtype, op, prescale=1.0, postscale=1.0, ps=0):
    """Submits one libkolo allreduce of contiguous tensor `inp` into `out`
    (may be the same tensor) on process set `ps` (0: every rank). Returns
    the C handle. Submission errors raise:
    ValueError for bad arguments (including a name already in flight),
    KoloInternalError otherwise."""
    lib = _library.lib()
    shape = _shape_for_abi(inp.shape)
    arr = (ctypes.c_int64 * max(len(shape), 1))(*shape)
    h = _library.kolo_handle_t(0)
    st = lib.kolo_ps_allreduce_async(int(ps), name.encode("utf-8"),
                                     ctypes.c_void_p(inp.data_ptr()),
                                     ctypes.c_void_p(out.data_ptr()), len(shape), arr, kdtype,
                                     int(op), float(prescale), float(postscale), ctypes.byref(h))
    if st != OK:
        msg = _library.last_error() or _library.status_string(st)
        if st == ERR_INVALID_ARGUMENT:
            raise ValueError(msg)
        raise KoloInternalError(msg, st)
    return h.value


class Deferred:
    """A libkolo submission that may block -- kolo_allgather_async and
    kolo_alltoall_async first exchange first dimensions / splits with the
    other ranks and return only when every rank has called them -- run on a
    thread of its own, so that the *_async call returns at once (as with
    Horovod) and ranks may issue such ops in any order. A stage generator
    yields it like a C handle; once it is done, `handle` is the C handle, or
    the list of C handles of a grouped submission (or `error` what the
    submission raised). The exchange is bounded by KOLO_OP_TIMEOUT inside
    libkolo, so the thread always ends."""

    __slots__ = ("handle", "error", "_done", "_lock", "_abandoned")

    def __init__(self, submit):
        self.handle = None
        self.error = None
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._abandoned = False
        threading.Thread(target=self._run, args=(submit,), name="kolo-submit",
                         daemon=True).start()

    def _run(self, submit):
        h, err = None, None
        try:
            h = submit()
        except BaseException as e:  # handed to whoever waits
            err = e
        with self._lock:
            self.handle, self.error = h, err
            abandoned = self._abandoned
        self._done.set()
        if abandoned and h:
            _release_all(h)

    def handles(self):
        """The C handles of a successful submission, as a list."""
        h = self.handle
        return list(h) if isinstance(h, (list, tuple)) else [h]

    def done(self):
        return self._done.is_set()

    def wait(self):
        self._done.wait()

    def abandon(self):
        """Nobody will wait for it: release its C handle now or when the
        submission returns (kolo_release of a finished handle frees its
        library-owned result; the collective itself still runs)."""
        with self._lock:
            self._abandoned = True
            h = self.handle
        if h:
            _release_all(h)


def _release_all(h):
    lib = _library.lib()
    for c in (h if isinstance(h, (list, tuple)) else [h]):
        if isinstance(c, Deferred):  # a staged op's first stage (_cuda.staged)
            c.abandon()
        elif c:
            lib.kolo_release(c)


def release_c_handles(handles):
    """Releases C handles (ints) and abandons Deferred submissions."""
    lib = _library.lib()
    for h in handles:
        if isinstance(h, Deferred):
            h.abandon()
        else:
            lib.kolo_release(h)


class _Op:
    __slots__ = ("gen", "pending", "stage", "result", "error", "done", "lock", "names")

    def __init__(self, gen):
        self.gen = gen
        self.pending = []
        self.stage = []  # every C handle of the current stage, waited for or not
        self.result = None
        self.error = None
        self.done = False
        self.lock = threading.Lock()
        self.names = []

    def _fail(self, err):
        # The stage's handles that completed may hold a library-owned result
        # (allgather, alltoall) the generator will now never take: free them
        # too (releasing a finished allreduce's handle is a no-op).
        release_c_handles(self.stage)
        self.pending = []
        self.stage = []
        try:
            self.gen.close()
        except Exception:
            pass
        self.error = err
        self.done = True

    def _advance_gen(self):
        self.stage = []
        try:
            self.pending = list(self.gen.send(None))
            self.stage = list(self.pending)
        except StopIteration as stop:
            self.result = stop.value
            self.pending = []
            self.done = True
        except BaseException as e:  # a later stage failed (e.g. a mismatch found in Python)
            self.pending = []
            self.error = e
            self.done = True

    def progress(self, block, timeout_ms=-1):
        """Advances as far as possible. Returns True once the op is finished
        (successfully or not). With block=True it waits until then."""
        lib = _library.lib()
        while not self.done:
            while self.pending:
                h = self.pending[0]
                if isinstance(h, Deferred):
                    if not block and not h.done():
                        return False
                    h.wait()
                    if h.error is not None:
                        self.pending.pop(0)
                        self._fail(h.error)
                        return True
                    # Submitted: wait for its C handle(s) in its place (the
                    # stage keeps the Deferred, which releases them on failure).
                    self.pending[0:1] = h.handles()
                    continue
                if not block:
                    st = lib.kolo_poll(h)
                    if st == IN_PROGRESS:
                        return False
                # Completed (or blocking): synchronize copies the result out and
                # releases the C handle.
                st = lib.kolo_synchronize(h, timeout_ms if block else -1)
                if st != OK:
                    msg = _library.last_error() or _library.status_string(st)
                    if st == ERR_TIMED_OUT:
                        msg = "timed out waiting for a collective: " + msg
                    self.pending.pop(0)
                    self._fail(KoloInternalError(msg, st))
                    return True
                self.pending.pop(0)
            self._advance_gen()
        return True


def start(gen, names=(), ps=0):
    """Runs the generator's first stage (submission) and registers it.
    Returns the user handle. Submission errors propagate to the caller.

    `names`: the wire names of an op the user named. As in Horovod, a name
    cannot be used again on this rank while an operation of that name is in
    progress -- here: until its handle is synchronized or released (or
    kolo shuts down), so the check does not depend on timing. Raises
    ValueError, before anything is submitted."""
    keys = [(ps, n) for n in names]
    if keys:
        with _table_lock:
            dup = [k for k in keys if k in _busy]
            if not dup:
                for k in keys:
                    _busy[k] = None  # reserved while submitting
        if dup:
            gen.close()
            raise ValueError(
                "kolo: requested an operation with the same name as another one still in "
                "progress on this rank: '%s' (its handle is not yet synchronized or released); "
                "synchronize it first, or use another name" % dup[0][1])
    op = _Op(gen)
    try:
        op.pending = list(next(gen))
        op.stage = list(op.pending)
    except StopIteration as stop:  # finished without waiting (e.g. empty group)
        op.result = stop.value
        op.done = True
    except BaseException:
        _unbusy(keys, None)
        raise
    hid = next(_ids)
    with _table_lock:
        _table[hid] = op
        for k in keys:
            _busy[k] = hid
    op.names = keys
    return hid


def _unbusy(keys, hid):
    with _table_lock:
        for k in keys:
            if _busy.get(k, hid) == hid:
                _busy.pop(k, None)


def _lookup(handle):
    with _table_lock:
        op = _table.get(handle)
    if op is None:
        raise ValueError("kolo: unknown handle %r (already synchronized, or never returned by "
                         "an *_async call)" % (handle,))
    return op


def poll(handle):
    """True if the operation behind `handle` has finished (synchronize() will
    not block); False while it is in progress."""
    op = _lookup(handle)
    with op.lock:
        return op.progress(block=False)


def synchronize(handle):
    """Waits for the operation and returns its result (the output tensor, a
    list for grouped ops). Raises KoloInternalError if it failed, with the
    agent's message. The handle is forgotten afterwards."""
    op = _lookup(handle)
    with op.lock:
        op.progress(block=True)
    with _table_lock:
        _table.pop(handle, None)
        for k in op.names:
            if _busy.get(k) == handle:
                del _busy[k]
    if op.error is not None:
        raise op.error
    return op.result


def release(handle):
    """Forgets a handle without waiting (the collective still runs on the
    other ranks; this rank's output buffer is no longer written)."""
    with _table_lock:
        op = _table.pop(handle, None)
        for k in (op.names if op is not None else ()):
            if _busy.get(k) == handle:
                del _busy[k]
    if op is not None:
        with op.lock:
            if not op.done:
                op._fail(KoloInternalError("released", None))


def reset_unnamed():
    """Unnamed ops are counted from 0 again (after a point every rank passes
    together: join(), shutdown())."""
    with _noname_lock:
        _noname.clear()


def fail_all_pending():
    """Called as shutdown() starts: every operation still in progress fails
    (its C handle is released); synchronize() on it raises KoloInternalError."""
    with _table_lock:
        ops = list(_table.values())
        _busy.clear()  # a new session starts with no name in use
    reset_unnamed()  # ... and counts its unnamed ops from 0 on every rank
    for op in ops:
        with op.lock:
            if not op.done:
                op._fail(KoloInternalError(
                    "kolo was shut down before this operation completed", ERR_ABORTED))


def run(gen):
    """Runs a stage generator to completion in the calling thread."""
    return synchronize(start(gen))


def submit_many(submissions):
    """Calls each zero-argument submit function; returns their C handles. If
    one raises, the handles already obtained are released (their buffers may
    be freed once the caller unwinds) and the error propagates."""
    handles = []
    try:
        for fn in submissions:
            handles.append(fn())
    except BaseException:
        release_c_handles(handles)
        raise
    return handles


def parallel(gens):
    """A stage generator running several stage generators side by side;
    returns their results as a list (each stage waits for the union of the
    current handles). If one fails, the handles the others submitted but
    this generator has not yielded yet are released, the others are closed,
    and the error propagates."""
    gens = list(gens)
    results = [None] * len(gens)
    unyielded = {}
    try:
        for i, g in enumerate(gens):
            try:
                unyielded[i] = list(next(g))
            except StopIteration as stop:
                results[i] = stop.value
        while unyielded:
            current = unyielded
            unyielded = {}
            yield [h for hs in current.values() for h in hs]
            for i in current:
                try:
                    unyielded[i] = list(gens[i].send(None))
                except StopIteration as stop:
                    results[i] = stop.value
    except BaseException:
        release_c_handles([h for hs in unyielded.values() for h in hs])
        for g in gens:
            try:
                g.close()
            except Exception:
                pass
        raise
    return results
