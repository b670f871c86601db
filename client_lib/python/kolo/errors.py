"""Exceptions raised by the kolo Python package.

Taxonomy (mirrors the C ABI's kolo_status_t, see docs/user-guide-python.md):

* ``ValueError``            -- a bad argument detected before anything was
                              submitted (wrong dtype, non-CPU tensor, bad root
                              rank, a name already in flight, ...). Nothing ran.
* ``KoloInternalError``     -- a collective failed after submission: mismatched
                              tensors across ranks, a rank or node that died,
                              the job shut down, a timeout. Carries the agent's
                              message verbatim and the status code. Training
                              frameworks that catch ``HorovodInternalError``
                              catch this (it is the same class).
* ``KoloNotImplementedError`` -- the operation exists in the API but libkolo
                              cannot run it yet (it names the operation).
* ``KoloLibraryNotFound``   -- libkolo.so could not be located or loaded.
* ``KoloError``             -- base class of all of the above that are ours;
                              also raised when ``init()`` fails.
"""

# Status codes of kolo_status_t (client_lib/include/kolo/kolo_c.h).
OK = 0
IN_PROGRESS = 1
ERR_INVALID_ARGUMENT = 2
ERR_UNAVAILABLE = 3
ERR_TIMED_OUT = 4
ERR_ABORTED = 5
ERR_PEER_FAILURE = 6
ERR_MEMBERSHIP_CHANGED = 7
ERR_INTERNAL = 8
ERR_PERMISSION_DENIED = 9

STATUS_NAMES = {
    OK: "KOLO_OK",
    IN_PROGRESS: "KOLO_IN_PROGRESS",
    ERR_INVALID_ARGUMENT: "KOLO_ERR_INVALID_ARGUMENT",
    ERR_UNAVAILABLE: "KOLO_ERR_UNAVAILABLE",
    ERR_TIMED_OUT: "KOLO_ERR_TIMED_OUT",
    ERR_ABORTED: "KOLO_ERR_ABORTED",
    ERR_PEER_FAILURE: "KOLO_ERR_PEER_FAILURE",
    ERR_MEMBERSHIP_CHANGED: "KOLO_ERR_MEMBERSHIP_CHANGED",
    ERR_INTERNAL: "KOLO_ERR_INTERNAL",
    ERR_PERMISSION_DENIED: "KOLO_ERR_PERMISSION_DENIED",
}


def status_name(code):
    return STATUS_NAMES.get(code, "KOLO_STATUS_%d" % code)


class KoloError(RuntimeError):
    """Base class of kolo's errors. ``code`` is the kolo_status_t value (or None)."""

    def __init__(self, message, code=None):
        super().__init__(message)
        self.code = code

    @property
    def status_name(self):
        return status_name(self.code) if self.code is not None else None


class KoloInternalError(KoloError):
    """A collective failed after submission (Horovod's HorovodInternalError)."""


# Horovod scripts (and elastic loops) catch this name.
HorovodInternalError = KoloInternalError


class KoloNotImplementedError(KoloError, NotImplementedError):
    """The operation is part of the API but the loaded libkolo cannot run it yet."""

    def __init__(self, op, detail=None):
        msg = "kolo: %s is not available yet" % op
        if detail:
            msg += ": " + detail
        super().__init__(msg)
        self.op = op


class KoloLibraryNotFound(KoloError, ImportError):
    """libkolo.so could not be found or loaded."""
