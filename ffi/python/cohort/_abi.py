"""The C ABI of libcohort (include/cohort_ffi.h) through ctypes and msgpack.

Nothing here knows about numpy: requests are dicts, responses are dicts.
The library is found, in order, at:

1. ``$COHORT_LIBRARY`` (a path to libcohort.so);
2. the copy bundled into the package when it was pip-installed
   (``cohort/_lib/``, see setup.py), or the library ``cmake --install``
   put beside it (named in ``cohort/_paths.py``, written by the install);
3. the build tree this source tree sits in (``<repo>/build*/lib``), for
   running the package straight from a checkout;
4. the system's search path (``ctypes.util.find_library("cohort")``).
"""

import ctypes
import ctypes.util
import glob
import os
import threading

import msgpack

from . import errors

SCHEMA = 1

_here = os.path.dirname(os.path.abspath(__file__))
_lock = threading.Lock()
_lib = None


def _candidates():
    env = os.environ.get("COHORT_LIBRARY")
    if env:
        return [env], "COHORT_LIBRARY=%s" % env
    found = sorted(glob.glob(os.path.join(_here, "_lib", "libcohort.so*")))
    try:
        from . import _paths  # written by cmake --install

        if os.path.exists(_paths.LIBRARY):
            found.append(_paths.LIBRARY)
    except ImportError:
        pass
    repo = os.path.dirname(os.path.dirname(os.path.dirname(_here)))
    for d in ("build", "build-ffi"):
        p = os.path.join(repo, d, "lib", "libcohort.so")
        if os.path.exists(p):
            found.append(p)
    sys_lib = ctypes.util.find_library("cohort")
    if sys_lib:
        found.append(sys_lib)
    return found, "the package's _lib/, %s/build*/lib and the system paths" % repo


def library_path():
    """The path of the library that is (or would be) loaded."""
    paths, _ = _candidates()
    return paths[0] if paths else None


class Library:
    """libcohort's ABI functions with their ctypes signatures."""

    def __init__(self, path):
        self.path = path
        dll = ctypes.CDLL(path)  # CDLL releases the GIL during calls
        u64, vp, sz = ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t
        pvp, psz = ctypes.POINTER(vp), ctypes.POINTER(sz)
        dll.coh_ffi_create.argtypes = [ctypes.c_char_p, sz, ctypes.POINTER(u64), pvp, psz]
        dll.coh_ffi_call.argtypes = [u64, ctypes.c_char_p, sz, pvp, psz]
        dll.coh_ffi_wait.argtypes = [u64, u64, ctypes.c_int, pvp, psz]
        dll.coh_ffi_test.argtypes = [u64, u64, pvp, psz]
        dll.coh_ffi_event_fd.argtypes = [u64, ctypes.POINTER(ctypes.c_int)]
        dll.coh_ffi_destroy.argtypes = [u64, pvp, psz]
        dll.coh_ffi_free.argtypes = [vp]
        dll.coh_ffi_free.restype = None
        dll.coh_last_error.restype = ctypes.c_char_p
        for f in ("create", "call", "wait", "test", "event_fd", "destroy"):
            getattr(dll, "coh_ffi_" + f).restype = ctypes.c_int
        self.dll = dll
        self._call = dll.coh_ffi_call
        self._wait = dll.coh_ffi_wait
        self._test = dll.coh_ffi_test
        self._free = dll.coh_ffi_free
        self._unpackb = msgpack.unpackb

    def _take(self, st, resp, n):
        if not resp.value:
            return {"status": st, "code": "ENOMEM", "error": "no response (out of memory)"}
        try:
            data = ctypes.string_at(resp.value, n.value)
        finally:
            self._free(resp)
        return self._unpackb(data, raw=False)

    def create(self, config_bytes):
        h, resp, n = ctypes.c_uint64(), ctypes.c_void_p(), ctypes.c_size_t()
        st = self.dll.coh_ffi_create(config_bytes, len(config_bytes), ctypes.byref(h),
                                     ctypes.byref(resp), ctypes.byref(n))
        return self._take(st, resp, n), h.value

    def call(self, ctx, request_bytes):
        resp, n = ctypes.c_void_p(), ctypes.c_size_t()
        st = self._call(ctx, request_bytes, len(request_bytes), ctypes.byref(resp),
                        ctypes.byref(n))
        return self._take(st, resp, n)

    def wait(self, ctx, request, timeout_ms):
        resp, n = ctypes.c_void_p(), ctypes.c_size_t()
        st = self._wait(ctx, request, timeout_ms, ctypes.byref(resp), ctypes.byref(n))
        return self._take(st, resp, n)

    def test(self, ctx, request):
        resp, n = ctypes.c_void_p(), ctypes.c_size_t()
        st = self._test(ctx, request, ctypes.byref(resp), ctypes.byref(n))
        return self._take(st, resp, n)

    def event_fd(self, ctx):
        fd = ctypes.c_int(-1)
        st = self.dll.coh_ffi_event_fd(ctx, ctypes.byref(fd))
        if st < 0:
            raise errors.from_response(
                {"status": st, "code": _code(st), "error": self.dll.coh_last_error().decode(
                    "utf-8", "replace")}, "event_fd")
        return fd.value

    def destroy(self, ctx):
        resp, n = ctypes.c_void_p(), ctypes.c_size_t()
        st = self.dll.coh_ffi_destroy(ctx, ctypes.byref(resp), ctypes.byref(n))
        return self._take(st, resp, n)


_CODES = {0: "OK", -1: "EINVAL", -2: "ENOMEM", -3: "ESYS", -4: "ETIMEDOUT", -5: "EPEER",
          -6: "EMISMATCH", -7: "EPROTO", -8: "ESTATE", -9: "EUNSUPPORTED", -10: "ECANCELED",
          -11: "EAGAIN", -12: "EAUTH", -13: "EBOOTSTRAP", -14: "EINTERNAL"}


def _code(st):
    return _CODES.get(st, "UNKNOWN")


def load():
    """Load the library once (thread-safe) and return its Library."""
    global _lib
    with _lock:
        if _lib is not None:
            return _lib
        paths, where = _candidates()
        if not paths:
            raise errors.CohortError(
                "libcohort.so not found: build it (tools/build.sh) or set COHORT_LIBRARY to "
                "its path (searched %s)" % where, -9, "EUNSUPPORTED")
        last = None
        for p in paths:
            try:
                _lib = Library(p)
                return _lib
            except OSError as e:  # a stale or foreign file: try the next one
                last = e
        raise errors.CohortError("cannot load libcohort (%s): %s" % (", ".join(paths), last),
                                 -9, "EUNSUPPORTED")
