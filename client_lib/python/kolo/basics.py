"""Framework-independent basics: lifecycle and topology of the job.

``init()`` connects this process to its node's kolo-agent using the
environment kolorun sets (KOLO_AGENT_SOCKET, KOLO_JOB_ID, ...), and waits
until every rank of the job has joined (bounded by KOLO_START_TIMEOUT).
"""

import atexit
import threading

from . import _library
from .errors import KoloError, OK

_lock = threading.Lock()
_atexit_registered = False
_shutdown_hooks = []

NOT_INITIALIZED = ("kolo has not been initialized; call init() first "
                   "(hvd.init() in a Horovod script).")


def _raise_status(what, code):
    raise KoloError("%s failed (%s): %s" % (what, _library.status_string(code),
                                            _library.last_error()), code)


def init(comm=None, process_sets=None):
    """Connects to the local kolo-agent and joins the job. Idempotent.

    ``comm`` (Horovod: an MPI communicator or a list of ranks) must be None or
    the list of all ranks: kolo jobs always span the ranks kolorun started.
    ``process_sets`` is ignored here: kolo.torch.init(process_sets=...) registers
    them (see kolo.torch.process_sets).
    """
    global _atexit_registered
    lib = _library.lib()
    with _lock:
        if not lib.kolo_is_initialized():
            code = lib.kolo_init()
            if code != OK:
                _raise_status("kolo init", code)
        if not _atexit_registered:
            atexit.register(_shutdown_at_exit)
            _atexit_registered = True
    if comm is not None:
        ranks = sorted(list(comm)) if not isinstance(comm, int) else None
        if ranks != list(range(size())):
            raise ValueError("kolo.init(comm=...) accepts only None or the list of all ranks "
                             "(got %r): a kolo job always spans every rank kolorun started" % (comm,))


def shutdown():
    """Leaves the job and disconnects from the agent. Pending operations fail
    with KoloInternalError (aborted). Idempotent; init() may be called again."""
    lib = _library.lib()
    with _lock:
        for hook in list(_shutdown_hooks):
            hook()
        if lib.kolo_is_initialized():
            code = lib.kolo_shutdown()
            if code != OK:
                _raise_status("kolo shutdown", code)


def _shutdown_at_exit():
    try:
        if _library._lib is not None and _library._lib.kolo_is_initialized():
            shutdown()
    except Exception:  # nothing useful to do at interpreter exit
        pass


def add_shutdown_hook(fn):
    """Runs `fn()` at the start of every shutdown() (used by kolo.torch to
    forget its pending handles)."""
    _shutdown_hooks.append(fn)


def is_initialized():
    return bool(_library.lib().kolo_is_initialized())


def _query(fn_name):
    v = getattr(_library.lib(), fn_name)()
    if v < 0:
        raise ValueError(NOT_INITIALIZED)
    return v


def rank():
    """This process's rank in the job (0..size()-1)."""
    return _query("kolo_rank")


def size():
    """Number of ranks in the job."""
    return _query("kolo_size")


def local_rank():
    """This process's rank on its node."""
    return _query("kolo_local_rank")


def local_size():
    """Number of ranks of the job on this node."""
    return _query("kolo_local_size")


def cross_rank():
    """Index of this node among the nodes that hold this local rank."""
    return _query("kolo_cross_rank")


def cross_size():
    """Number of nodes that hold this local rank."""
    return _query("kolo_cross_size")


def is_homogeneous():
    """True when every node runs the same number of ranks."""
    return size() == local_size() * cross_size()


def library_path():
    """Which libkolo.so is in use."""
    return _library.library_path()


def kolo_built():
    return True


# Horovod's build queries: kolo does not use MPI, Gloo, NCCL, DDL or oneCCL
# through the framework adapter (the agent owns communication).
def mpi_built():
    return False


def mpi_enabled():
    return False


def mpi_threads_supported():
    return False


def gloo_built():
    return False


def gloo_enabled():
    return False


def nccl_built():
    return False


def ddl_built():
    return False


def ccl_built():
    return False


def cuda_built():
    return False


def rocm_built():
    return False
