"""Locating and binding libkolo.so (the C ABI in kolo/kolo_c.h) with ctypes.

Search order (the first that exists wins):

1. ``$KOLO_LIBRARY`` -- a path to libkolo.so (or to the folder holding it).
   When it is set and wrong, that is an error: nothing else is tried.
2. the package folder (``pip install`` copies libkolo.so there).
3. ``$KOLO_BUILD_DIR/lib/libkolo.so`` -- a CMake build folder.
4. ``<repository>/build/lib/libkolo.so`` when the package is imported from a
   source checkout (client_lib/python/kolo -> ../../../build/lib).
5. the system's dynamic loader (``libkolo.so.1`` / ``libkolo.so``: ldconfig,
   LD_LIBRARY_PATH).

ctypes releases the GIL around every call, so a thread blocked in
kolo_synchronize does not stop other Python threads.
"""

import ctypes
import ctypes.util
import os
import sys
import threading

from .errors import KoloLibraryNotFound

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_LIB_NAMES = ("libkolo.so", "libkolo.so.1")

_lock = threading.Lock()
_lib = None
_lib_path = None

kolo_status_t = ctypes.c_int
kolo_handle_t = ctypes.c_uint64

# name: (restype, argtypes). Functions of the agreed ABI (KOLO_ABI_VERSION 1).
_PROTOTYPES = {
    "kolo_init": (kolo_status_t, []),
    "kolo_shutdown": (kolo_status_t, []),
    "kolo_is_initialized": (ctypes.c_int, []),
    "kolo_rank": (ctypes.c_int, []),
    "kolo_size": (ctypes.c_int, []),
    "kolo_local_rank": (ctypes.c_int, []),
    "kolo_local_size": (ctypes.c_int, []),
    "kolo_cross_rank": (ctypes.c_int, []),
    "kolo_cross_size": (ctypes.c_int, []),
    "kolo_allreduce_async": (kolo_status_t, [
        ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
        ctypes.POINTER(ctypes.c_int64), ctypes.c_int, ctypes.c_int,
        ctypes.c_double, ctypes.c_double, ctypes.POINTER(kolo_handle_t)]),
    "kolo_allreduce": (kolo_status_t, [
        ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
        ctypes.POINTER(ctypes.c_int64), ctypes.c_int, ctypes.c_int,
        ctypes.c_double, ctypes.c_double]),
    "kolo_broadcast_async": (kolo_status_t, [
        ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int64),
        ctypes.c_int, ctypes.c_int, ctypes.POINTER(kolo_handle_t)]),
    "kolo_allgather_async": (kolo_status_t, [
        ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int64),
        ctypes.c_int, ctypes.POINTER(kolo_handle_t)]),
    "kolo_grouped_allreduce_async": (kolo_status_t, [
        ctypes.c_int, ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_void_p),
        ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int),
        ctypes.POINTER(ctypes.POINTER(ctypes.c_int64)), ctypes.POINTER(ctypes.c_int), ctypes.c_int,
        ctypes.c_double, ctypes.c_double, ctypes.POINTER(kolo_handle_t)]),
    "kolo_grouped_allgather_async": (kolo_status_t, [
        ctypes.c_int, ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_void_p),
        ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.POINTER(ctypes.c_int64)),
        ctypes.POINTER(ctypes.c_int), ctypes.POINTER(kolo_handle_t)]),
    "kolo_grouped_reducescatter_async": (kolo_status_t, [
        ctypes.c_int, ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_void_p),
        ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int),
        ctypes.POINTER(ctypes.POINTER(ctypes.c_int64)), ctypes.POINTER(ctypes.c_int), ctypes.c_int,
        ctypes.POINTER(kolo_handle_t)]),
    # Process sets: kolo_add/remove_process_set, queries, and kolo_ps_<op>
    # (the set id first; set 0 is the global set, the same as kolo_<op>).
    "kolo_add_process_set": (kolo_status_t, [
        ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.POINTER(ctypes.c_int32)]),
    "kolo_remove_process_set": (kolo_status_t, [ctypes.c_int32]),
    "kolo_process_set_rank": (ctypes.c_int, [ctypes.c_int32]),
    "kolo_process_set_size": (ctypes.c_int, [ctypes.c_int32]),
    "kolo_process_set_ranks": (kolo_status_t, [
        ctypes.c_int32, ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.POINTER(ctypes.c_int)]),
    "kolo_ps_allreduce_async": (kolo_status_t, [
        ctypes.c_int32, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
        ctypes.POINTER(ctypes.c_int64), ctypes.c_int, ctypes.c_int,
        ctypes.c_double, ctypes.c_double, ctypes.POINTER(kolo_handle_t)]),
    "kolo_ps_grouped_allreduce_async": (kolo_status_t, [
        ctypes.c_int32, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p),
        ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p),
        ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.POINTER(ctypes.c_int64)),
        ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_double, ctypes.c_double,
        ctypes.POINTER(kolo_handle_t)]),
    "kolo_ps_broadcast_async": (kolo_status_t, [
        ctypes.c_int32, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int,
        ctypes.POINTER(ctypes.c_int64), ctypes.c_int, ctypes.c_int, ctypes.POINTER(kolo_handle_t)]),
    "kolo_ps_allgather_async": (kolo_status_t, [
        ctypes.c_int32, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int,
        ctypes.POINTER(ctypes.c_int64), ctypes.c_int, ctypes.POINTER(kolo_handle_t)]),
    "kolo_ps_grouped_allgather_async": (kolo_status_t, [
        ctypes.c_int32, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p),
        ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int),
        ctypes.POINTER(ctypes.POINTER(ctypes.c_int64)), ctypes.POINTER(ctypes.c_int),
        ctypes.POINTER(kolo_handle_t)]),
    "kolo_ps_reducescatter_async": (kolo_status_t, [
        ctypes.c_int32, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
        ctypes.POINTER(ctypes.c_int64), ctypes.c_int, ctypes.c_int,
        ctypes.POINTER(kolo_handle_t)]),
    "kolo_ps_grouped_reducescatter_async": (kolo_status_t, [
        ctypes.c_int32, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p),
        ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p),
        ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.POINTER(ctypes.c_int64)),
        ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.POINTER(kolo_handle_t)]),
    "kolo_ps_alltoall_async": (kolo_status_t, [
        ctypes.c_int32, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int,
        ctypes.POINTER(ctypes.c_int64), ctypes.c_int, ctypes.POINTER(ctypes.c_int64),
        ctypes.POINTER(kolo_handle_t)]),
    "kolo_ps_barrier": (kolo_status_t, [ctypes.c_int32, ctypes.c_int64]),
    "kolo_result": (kolo_status_t, [
        kolo_handle_t, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int64)]),
    "kolo_reducescatter_async": (kolo_status_t, [
        ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
        ctypes.POINTER(ctypes.c_int64), ctypes.c_int, ctypes.c_int,
        ctypes.POINTER(kolo_handle_t)]),
    "kolo_alltoall_async": (kolo_status_t, [
        ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int64),
        ctypes.c_int, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(kolo_handle_t)]),
    "kolo_barrier": (kolo_status_t, [ctypes.c_int64]),
    "kolo_join": (kolo_status_t, [ctypes.c_int64, ctypes.POINTER(ctypes.c_int)]),
    "kolo_start_timeline": (kolo_status_t, [ctypes.c_char_p, ctypes.c_int]),
    "kolo_stop_timeline": (kolo_status_t, []),
    "kolo_poll": (kolo_status_t, [kolo_handle_t]),
    "kolo_synchronize": (kolo_status_t, [kolo_handle_t, ctypes.c_int64]),
    "kolo_release": (None, [kolo_handle_t]),
    "kolo_alloc_shared": (ctypes.c_void_p, [ctypes.c_size_t]),
    "kolo_free_shared": (None, [ctypes.c_void_p]),
    "kolo_status_string": (ctypes.c_char_p, [kolo_status_t]),
    "kolo_last_error": (ctypes.c_char_p, []),
    "kolo_dtype_size": (ctypes.c_size_t, [ctypes.c_int]),
}

# Functions added in C ABI revision 2 (CUDA streams): bound when the loaded
# libkolo has them (has_symbol() tells callers); an older libkolo still loads.
class kolo_stream_t(ctypes.Structure):  # noqa: N801 (the C name)
    _fields_ = [("struct_size", ctypes.c_size_t), ("device", ctypes.c_int),
                ("stream", ctypes.c_void_p)]


_PROTOTYPES_ABI2 = {
    "kolo_set_stream": (kolo_status_t, [ctypes.POINTER(kolo_stream_t)]),
    "kolo_get_stream": (kolo_status_t, [ctypes.POINTER(kolo_stream_t)]),
    "kolo_device_path": (kolo_status_t, [ctypes.POINTER(ctypes.c_int)]),
}


def _repo_build_lib():
    # client_lib/python/kolo -> repository root
    repo = os.path.normpath(os.path.join(_PACKAGE_DIR, "..", "..", ".."))
    if os.path.isfile(os.path.join(repo, "client_lib", "include", "kolo", "kolo_c.h")):
        return os.path.join(repo, "build", "lib")
    return None


def candidate_paths():
    """The places searched, in order, as (description, path or None)."""
    out = []
    env = os.environ.get("KOLO_LIBRARY")
    if env:
        out.append(("$KOLO_LIBRARY", env))
    for n in _LIB_NAMES:
        out.append(("package folder", os.path.join(_PACKAGE_DIR, n)))
    build = os.environ.get("KOLO_BUILD_DIR")
    if build:
        out.append(("$KOLO_BUILD_DIR/lib", os.path.join(build, "lib", "libkolo.so")))
    repo_lib = _repo_build_lib()
    if repo_lib:
        out.append(("source checkout", os.path.join(repo_lib, "libkolo.so")))
    return out


def _resolve():
    tried = []
    env = os.environ.get("KOLO_LIBRARY")
    if env:
        path = os.path.join(env, "libkolo.so") if os.path.isdir(env) else env
        if not os.path.isfile(path):
            raise KoloLibraryNotFound(
                "KOLO_LIBRARY=%s does not name libkolo.so (no such file). Point it at "
                "<build>/lib/libkolo.so or unset it." % env)
        return path, []
    for what, path in candidate_paths():
        tried.append(path)
        if os.path.isfile(path):
            return path, tried
    # The system loader: ldconfig cache, LD_LIBRARY_PATH, rpath.
    for n in ("libkolo.so.1", "libkolo.so", ctypes.util.find_library("kolo")):
        if n:
            tried.append(n + " (system loader)")
            try:
                ctypes.CDLL(n, mode=_dlopen_mode())
                return n, tried
            except OSError:
                pass
    raise KoloLibraryNotFound(
        "cannot find libkolo.so. Tried: %s. Build it (target kolo_client: "
        "`ninja -C build kolo_client`), then set KOLO_LIBRARY=<build>/lib/libkolo.so or "
        "KOLO_BUILD_DIR=<build>, or reinstall the package with KOLO_BUILD_DIR set "
        "(pip install ./client_lib/python)." % ", ".join(tried))


def _dlopen_mode():
    """RTLD_DEEPBIND when TensorFlow is already loaded: its
    libtensorflow_framework.so exports a protobuf of its own, which would
    otherwise take the place of the libprotobuf libkolo links to (a crash in
    kolo_init; docs/tensorflow.md). Loaded before TensorFlow, libkolo binds
    its own at load time (ctypes loads with RTLD_NOW) and needs nothing."""
    mode = ctypes.DEFAULT_MODE
    if "tensorflow" in sys.modules and hasattr(os, "RTLD_DEEPBIND"):
        mode |= os.RTLD_DEEPBIND
    return mode


def _bind(lib):
    for name, (restype, argtypes) in _PROTOTYPES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            raise KoloLibraryNotFound(
                "%s lacks the symbol %s: it is not a libkolo with KOLO_ABI_VERSION 1"
                % (_lib_path, name))
        fn.restype = restype
        fn.argtypes = argtypes
    for name, (restype, argtypes) in _PROTOTYPES_ABI2.items():
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.restype = restype
            fn.argtypes = argtypes


def lib():
    """The loaded libkolo (loaded and bound on first use)."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            path, _ = _resolve()
            try:
                loaded = ctypes.CDLL(path, mode=_dlopen_mode())
            except OSError as e:
                raise KoloLibraryNotFound("cannot load %s: %s" % (path, e))
            _lib_path = path
            _bind(loaded)
            _lib = loaded
    return _lib


def library_path():
    """The path (or loader name) of the libkolo in use; loads it if needed."""
    lib()
    return _lib_path


def has_symbol(name):
    """True if the loaded libkolo exports `name` (for ops that come later)."""
    try:
        getattr(lib(), name)
        return True
    except AttributeError:
        return False


def last_error():
    s = lib().kolo_last_error()
    return s.decode("utf-8", "replace") if s else ""


def status_string(code):
    s = lib().kolo_status_string(code)
    return s.decode("utf-8", "replace") if s else "KOLO_STATUS_%d" % code
