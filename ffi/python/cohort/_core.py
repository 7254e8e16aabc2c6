"""Contexts, collectives on numpy arrays, futures and asyncio."""

import asyncio
import ctypes
import math
import numbers
import os
import threading
import time

import msgpack
import numpy as np

from . import _abi, errors

# numpy dtype -> cohort dtype name. bfloat16 has no numpy dtype: pass a uint16
# (or ml_dtypes.bfloat16) array with dtype="bf16".
_DTYPES = {
    np.dtype(np.float32): "f32",
    np.dtype(np.float64): "f64",
    np.dtype(np.float16): "f16",
    np.dtype(np.int32): "i32",
    np.dtype(np.int64): "i64",
    np.dtype(np.uint8): "u8",
}
_NAMES = {"f32": 4, "f64": 8, "f16": 2, "bf16": 2, "i32": 4, "i64": 8, "u8": 1}
_ALIASES = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16",
            "int32": "i32", "int64": "i64", "uint8": "u8"}
OPS = ("sum", "avg", "min", "max", "prod")
SYNC_MODES = ("default", "allreduce", "partial", "selective", "relay")
ALLREDUCE_ALGOS = ("default", "relay")
SUPPORTED_DTYPES = ("float32", "float64", "float16", "bfloat16 (dtype='bf16')", "int32", "int64",
                    "uint8")

_packb = msgpack.packb
_addressof = ctypes.addressof
_c_char = ctypes.c_char
_WAIT_SLICE_MS = 1000  # blocking calls return to Python this often (Ctrl-C works)
# A context tests the requests it still tracks (async ops nobody waited for)
# once it tracks this many, then again at twice what is left: completed ones
# are dropped with their arrays, at an amortized cost of ~1 test per submission.
_PRUNE_MIN = 64
_INT64_MAX = (1 << 63) - 1
_CANCELED = {"status": -10, "code": "ECANCELED",
             "error": "the context was finalized before the request completed"}
# Work outcomes are set once, under this lock (finalize and a waiter may race).
_outcome_lock = threading.Lock()


class Result:
    """The outcome of a completed collective."""

    __slots__ = ("type", "time_us", "abi_us", "rank", "size", "members", "wait_us", "comm_us",
                 "full", "total_weight", "group_id", "relays", "nrelays", "relayed", "phase2",
                 "phase2_method", "nexcluded", "nsegments", "joined", "loss", "response")

    def __init__(self, resp):
        self.response = resp
        self.type = resp.get("type")
        self.time_us = resp.get("time_us", 0.0)
        self.abi_us = resp.get("abi_us", 0.0)
        g = resp.get("group") or {}
        self.rank = g.get("rank")
        self.size = g.get("size")
        self.members = g.get("members")
        if self.members is None and self.size is not None:
            self.members = list(range(self.size))
        # sync and relay allreduce only: the scheduler's group
        self.wait_us = g.get("wait_us")
        self.comm_us = g.get("comm_us")
        self.full = g.get("full")
        self.total_weight = g.get("total_weight")
        self.group_id = g.get("group_id")
        # relay groups (mode "relay", algo "relay"): the ranks late at the
        # launch (relays of phase 1), whether this rank was one of them, how
        # many late ranks phase 2 folded in and how (0 none, 1 broadcast
        # around the ring, 2 prefix allreduce), how many were left out.
        # Zeros / empty for the other sync modes, None for other collectives.
        self.relays = g.get("relays")
        self.nrelays = None if self.relays is None else len(self.relays)
        self.relayed = g.get("relayed")
        self.phase2 = g.get("phase2")
        self.phase2_method = g.get("phase2_method")
        self.nexcluded = g.get("nexcluded")
        # phase 1 ran as nsegments ops; joined: the segment this (late) rank's
        # data joined phase 1 at (-1: none; phase 2 brought the ones before)
        self.nsegments = g.get("nsegments")
        self.joined = g.get("joined")
        # bounded-loss allreduce (loss_bound > 0): bytes this rank's datagram
        # receives expected and missed, by stage (push_*, pull_*), and the
        # missed fractions; None for other collectives.
        self.loss = resp.get("loss")

    def __repr__(self):
        return "Result(type=%r, time_us=%.1f, abi_us=%.1f, group=%r)" % (
            self.type, self.time_us, self.abi_us, self.members)


def _check(resp, what):
    if resp.get("status", -14) < 0:
        raise errors.from_response(resp, what)
    return resp


class _Device:
    """A device array (__cuda_array_interface__: CuPy, Numba, torch CUDA
    tensors) as the collectives see it: its address, elements, numpy dtype,
    and the stream its producer said it uses (v3's "stream"; None: none)."""

    __slots__ = ("obj", "addr", "size", "dtype", "nbytes", "stream", "readonly")

    def __init__(self, obj, cai, what, field):
        self.obj = obj  # kept alive while cohort uses the memory
        try:
            shape = tuple(int(n) for n in cai["shape"])
            self.dtype = np.dtype(cai["typestr"])
            self.addr, self.readonly = int(cai["data"][0]), bool(cai["data"][1])
        except Exception as e:  # noqa: BLE001 - a malformed interface, whatever its fault
            raise errors.InvalidArgumentError("%s: %s has a malformed __cuda_array_interface__"
                                              " (%s)" % (what, field, e), field=field) from None
        self.size = math.prod(shape)
        self.nbytes = self.size * self.dtype.itemsize
        strides = cai.get("strides")
        if strides is not None:
            want, step = [], self.dtype.itemsize
            for n in reversed(shape):
                want.append(step)
                step *= n
            if self.size > 1 and tuple(strides) != tuple(reversed(want)):
                raise errors.InvalidArgumentError(
                    "%s: %s is not contiguous (strides %s): cohort works in place on the "
                    "array's memory" % (what, field, tuple(strides)), field=field)
        self.stream = cai.get("stream")


def _cuda_interface(x):
    """x's __cuda_array_interface__, or None (numpy arrays, CPU tensors)."""
    if isinstance(x, np.ndarray):
        return None
    try:
        return x.__cuda_array_interface__
    except (AttributeError, RuntimeError, TypeError):  # torch raises for CPU tensors
        return None


def _stream_value(stream, what):
    """A stream argument as the ABI's integer: an int (a cudaStream_t), or
    an object with cuda_stream (torch.cuda.Stream) or ptr (CuPy)."""
    for attr in ("cuda_stream", "ptr"):
        if not isinstance(stream, numbers.Integral) and hasattr(stream, attr):
            stream = getattr(stream, attr)
    if isinstance(stream, bool) or not isinstance(stream, numbers.Integral) or \
            not 0 <= int(stream) < 2**64:
        raise errors.InvalidArgumentError(
            "%s: stream must be a cudaStream_t (an int), torch.cuda.Stream or a CuPy stream, "
            "got %s" % (what, type(stream).__name__), field="stream")
    return int(stream)


def _place(req, arrays, stream, what):
    """Device arrays: say so, and which stream the op follows (the argument,
    else the one the first array's producer named, else the default)."""
    dev = [a for a in arrays if isinstance(a, _Device)]
    if not dev:
        if stream is not None:
            raise errors.InvalidArgumentError(
                "%s: stream is for device arrays (__cuda_array_interface__)" % what,
                field="stream")
        return
    if len(dev) != len(arrays):
        raise errors.InvalidArgumentError(
            "%s: device and host arrays in one call (both must be on the device)" % what,
            field="mem")
    req["mem"] = "device"
    if stream is None:
        stream = dev[0].stream or 0
    req["stream"] = _stream_value(stream, what)


def _array(arr, what, field):
    if isinstance(arr, _Device):
        return arr
    if not isinstance(arr, np.ndarray):
        raise errors.InvalidArgumentError(
            "%s: %s must be a numpy.ndarray or a torch.Tensor, got %s" % (
                what, field, type(arr).__name__), field=field)
    return arr


def _is_tensor(x):
    t = type(x)
    return t.__module__.startswith("torch") and hasattr(x, "data_ptr") and hasattr(x, "numpy")


def _host(x, dtype, what, field):
    """A torch tensor as a numpy array over the same memory (zero copy), and
    the dtype name (bfloat16 has no numpy dtype: it goes as uint16 with
    dtype bf16); numpy arrays pass through; device arrays (a CUDA tensor,
    anything with __cuda_array_interface__) come back as _Device."""
    cai = _cuda_interface(x)
    if cai is not None:
        return _Device(x, cai, what, field), dtype
    if not _is_tensor(x):
        return x, dtype
    if x.device.type != "cpu":
        raise errors.InvalidArgumentError(
            "%s: %s is on %s and has no __cuda_array_interface__ (torch offers none for "
            "bfloat16): move it with .cpu()" % (what, field, x.device),
            field=field)
    if not x.is_contiguous():
        raise errors.InvalidArgumentError(
            "%s: %s is not contiguous (strides %s): cohort works in place on the tensor's "
            "memory; pass tensor.contiguous() and copy the result back" % (
                what, field, tuple(x.stride())), field=field)
    x = x.detach()
    name = str(x.dtype).replace("torch.", "")
    if name == "bfloat16":
        return x.view(_torch_int16(x)).numpy().view(np.uint16), dtype or "bf16"
    if name not in _ALIASES:
        raise errors.DtypeError("%s: unsupported dtype %s (supported: %s)" % (
            what, x.dtype, ", ".join(SUPPORTED_DTYPES)), field="dtype")
    return x.numpy(), dtype


def _torch_int16(x):
    import torch  # only reached with a torch tensor in hand
    return torch.int16


def _dtype_of(arr, dtype, what, field="array"):
    _array(arr, what, field)
    if dtype is not None:
        if isinstance(dtype, str):
            key = dtype
        else:  # numpy.float32, numpy.dtype("f8"), ml_dtypes.bfloat16, ...
            try:
                key = np.dtype(dtype).name
            except Exception:  # noqa: BLE001 - anything numpy does not take is unknown
                key = repr(dtype)
        name = _ALIASES.get(key, key)
        if name not in _NAMES:
            raise errors.DtypeError("%s: unknown dtype %r (supported: %s)" % (
                what, dtype, ", ".join(SUPPORTED_DTYPES)), field="dtype")
        if arr.dtype.itemsize != _NAMES[name]:
            raise errors.DtypeError("%s: dtype=%r needs %d-byte elements, the array has %s" % (
                what, dtype, _NAMES[name], arr.dtype), field="dtype")
        return name
    name = _DTYPES.get(arr.dtype)
    if name is None:
        if arr.dtype.name == "bfloat16":  # ml_dtypes
            return "bf16"
        raise errors.DtypeError("%s: unsupported dtype %s (supported: %s)" % (
            what, arr.dtype, ", ".join(SUPPORTED_DTYPES)), field="dtype")
    return name


def _tensor(arr, what, field, writable=True):
    """(address, nbytes) of a numpy array cohort may read and write in place."""
    _array(arr, what, field)
    if isinstance(arr, _Device):
        if writable and arr.readonly:
            raise errors.InvalidArgumentError("%s: %s is read-only" % (what, field), field=field)
        return {"addr": arr.addr, "nbytes": arr.nbytes}
    if not arr.flags.c_contiguous:
        raise errors.InvalidArgumentError(
            "%s: %s is not contiguous (strides %s): cohort works in place on the array's "
            "memory; pass numpy.ascontiguousarray(x) and copy the result back" % (
                what, field, arr.strides), field=field)
    if writable and not arr.flags.writeable:
        raise errors.InvalidArgumentError("%s: %s is read-only" % (what, field), field=field)
    n = arr.nbytes
    if writable and n:
        # 5x faster than __array_interface__, which builds a dict every time
        return {"addr": _addressof(_c_char.from_buffer(arr)), "nbytes": n}
    return {"addr": arr.__array_interface__["data"][0], "nbytes": n}


_TORCH_OPS = None


def _torch_op(op, what):
    """torch.distributed.ReduceOp.SUM (or its RedOpType) -> "sum"; None if op
    is not one."""
    global _TORCH_OPS
    if "ReduceOp" not in type(op).__qualname__ and "RedOpType" not in type(op).__qualname__:
        return None
    if _TORCH_OPS is None:
        import torch.distributed as dist
        R = dist.ReduceOp
        _TORCH_OPS = [(R.SUM, "sum"), (R.AVG, "avg"), (R.PRODUCT, "prod"), (R.MIN, "min"),
                      (R.MAX, "max")]
    for k, v in _TORCH_OPS:
        if op == k:
            return v
    import torch.distributed as dist
    kinds = getattr(dist.ReduceOp, "RedOpType", None)
    label = next((k for k, v in getattr(kinds, "__members__", {}).items() if op == v), op)
    raise errors.InvalidArgumentError(
        "%s: unsupported torch ReduceOp %s (SUM, AVG, PRODUCT, MIN, MAX are)" % (what, label),
        field="op")


def _op(op, what):
    if not isinstance(op, str):
        op = _torch_op(op, what) or op
    if not isinstance(op, str) or op not in OPS:
        shown = repr(op) if isinstance(op, str) else "of type %s" % type(op).__name__
        raise errors.InvalidArgumentError("%s: unknown op %s (one of %s)" % (
            what, shown, ", ".join(OPS)), field="op")
    return op


def _integer(v, what, field, lo, hi, name=None):
    """An int (or numpy integer, not a bool) in [lo, hi]."""
    name = name or field
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise errors.InvalidArgumentError("%s: %s must be an int, got %s" % (
            what, name, type(v).__name__), field=field)
    v = int(v)
    if not lo <= v <= hi:
        raise errors.InvalidArgumentError("%s: %s %d is outside [%d, %d]" % (
            what, name, v, lo, hi), field=field)
    return v


def _flag(v, what, field, name):
    """A bool (or numpy bool, the ints 0 and 1, or None for False)."""
    if v is None:
        return False
    if isinstance(v, (bool, np.bool_)) or (isinstance(v, (int, np.integer)) and v in (0, 1)):
        return bool(v)
    raise errors.InvalidArgumentError("%s: %s must be a bool, got %s" % (
        what, name, type(v).__name__), field=field)


def _bound(b, what, field):
    """A loss bound: a number in [0, 1)."""
    if isinstance(b, (bool, np.bool_)) or not isinstance(b, numbers.Real):
        raise errors.InvalidArgumentError("%s: %s must be a number, got %s" % (
            what, field, type(b).__name__), field=field)
    f = float(b)
    if not 0 <= f < 1:
        raise errors.InvalidArgumentError("%s: field '%s': %r is not in [0, 1)" % (
            what, field, f), field=field)
    return f


def _weight(w, what):
    """sync's weight: a finite number > 0 (the library checks its range)."""
    if isinstance(w, (bool, np.bool_)) or not isinstance(w, numbers.Real):
        raise errors.InvalidArgumentError("%s: weight must be a number, got %s" % (
            what, type(w).__name__), field="weight")
    try:
        f = float(w)
    except (OverflowError, ValueError):  # an int past the float range
        raise errors.InvalidArgumentError("%s: field 'weight': %s is not a finite number" % (
            what, w), field="weight") from None
    if not math.isfinite(f):
        raise errors.InvalidArgumentError("%s: field 'weight': %r is not a finite number" % (
            what, f), field="weight")
    if not f > 0:
        raise errors.InvalidArgumentError("%s: field 'weight': %g is not > 0" % (what, f),
                                          field="weight")
    return f


def _timeout_s(timeout, what):
    """Work.wait's timeout in seconds: None (or inf) waits forever."""
    if timeout is None:
        return None
    if isinstance(timeout, (bool, np.bool_)) or not isinstance(timeout, numbers.Real):
        raise errors.InvalidArgumentError("%s: timeout must be a number of seconds or None, "
                                          "got %s" % (what, type(timeout).__name__),
                                          field="timeout")
    try:
        t = float(timeout)
    except (OverflowError, ValueError):
        return None  # an int too large for a float: forever
    if math.isnan(t):
        raise errors.InvalidArgumentError("%s: timeout is NaN" % what, field="timeout")
    if math.isinf(t):
        return None if t > 0 else 0.0
    return max(0.0, t)


def _pack(obj, what):
    """msgpack bytes of a request or config map; what msgpack cannot encode
    (an int outside [-2^63, 2^64), an object) is a typed error that names
    the field."""
    try:
        return _packb(obj)
    except (OverflowError, TypeError, ValueError) as e:
        field, value = None, None
        if isinstance(obj, dict):
            for k, v in obj.items():
                try:
                    _packb(v)
                except (OverflowError, TypeError, ValueError):
                    field, value = k, v
                    break
        if field is None:
            msg = "%s: cannot encode the request: %s" % (what, e)
        elif isinstance(value, int) and not isinstance(value, bool):
            msg = "%s: field '%s': %d is outside the integer range [-2^63, 2^64 - 1]" % (
                what, field, value)
        else:
            msg = "%s: field '%s': cannot encode a %s (%s)" % (
                what, field, type(value).__name__, e)
        raise errors.InvalidArgumentError(msg, field=field) from None


class Work:
    """A collective in flight (torch.distributed's Work): wait(), is_completed(),
    result(), exception(), and ``await work`` in asyncio.

    A Work nobody holds any more (fire and forget) is still tracked by its
    context until its completion is seen, so the arrays it reads and writes
    stay alive while the library may touch them; then it is dropped."""

    __slots__ = ("_ctx", "_h", "_keep", "_resp", "_exc", "_what", "_make", "_busy",
                 "__weakref__")

    def __init__(self, ctx, handle, keep, what, make=Result):
        self._ctx = ctx
        self._h = handle
        self._keep = keep  # the arrays cohort reads and writes until completion
        self._resp = None
        self._exc = None
        self._what = what
        self._make = make
        # One library call on this request handle at a time: its completion is
        # answered once, then the handle is released.
        self._busy = threading.Lock()

    def _done(self):
        return self._resp is not None or self._exc is not None

    def _complete(self, resp):
        with _outcome_lock:
            if self._resp is not None or self._exc is not None:
                return
            if resp.get("status", -14) < 0:
                self._exc = errors.from_response(resp, self._what)
            else:
                self._resp = resp
            self._keep = None
        self._ctx._pending.pop(self._h, None)

    def _finalized(self):
        """The context is finalized (or being finalized): complete as canceled
        once its destroy has returned (the library no longer touches the
        arrays); False until then."""
        if not self._ctx._destroyed.is_set():
            return False
        self._complete(_CANCELED)
        return True

    def _answer(self, resp):
        """A wait / test response; False while the request is running."""
        if resp.get("status") == -11:
            return False
        if (resp.get("code") == "EINVAL" and resp.get("field") in ("context", "request")
                and self._ctx._h is None):
            return self._finalized()  # finalize released the handle under our feet
        self._complete(resp)
        return True

    def _test(self):
        """Test the request once (the caller holds _busy)."""
        if self._done():
            return True
        h = self._ctx._h
        if h is None:
            return self._finalized()
        return self._answer(self._ctx._lib.test(h, self._h))

    def _outcome(self):
        if self._exc is not None:
            raise self._exc
        return self._make(self._resp)

    def is_completed(self):
        """True once the request has completed (successfully or not). While
        another thread is inside wait() on the same Work this waits for its
        current slice (up to 1 s, less once the request completes)."""
        if self._done():
            return True
        with self._busy:
            return self._test()

    done = is_completed

    def wait(self, timeout=None):
        """Block until complete; return its Result or raise its error.
        timeout (seconds): raise cohort.TimeoutError if not complete by then
        (the request goes on; wait again later)."""
        ctx = self._ctx
        timeout = _timeout_s(timeout, self._what)
        end = None if timeout is None else time.monotonic() + timeout
        while not self._done():
            ms = _WAIT_SLICE_MS
            if end is not None:
                ms = min(ms, max(0, int((end - time.monotonic()) * 1000)))
            if self._busy.acquire(timeout=ms / 1000.0):  # else another thread waits on it
                try:
                    h = ctx._h
                    if h is not None and not self._done():
                        self._answer(ctx._lib.wait(h, self._h, ms))
                    if not self._done() and ctx._h is None and not self._finalized():
                        ctx._destroyed.wait(ms / 1000.0)  # finalize is under way
                finally:
                    self._busy.release()
            if not self._done() and end is not None and time.monotonic() >= end:
                raise errors.TimeoutError(
                    "%s: not complete after %s s" % (self._what, timeout), -11, "EAGAIN")
        return self._outcome()

    def stream_wait(self, stream=0):
        """Work queued on the device stream after this call starts once the
        request has completed, with no host thread waiting
        (coh_request_stream_wait). stream: an int cudaStream_t (0: the
        default stream), torch.cuda.Stream or a CuPy stream. The Work is
        still waited for as usual. Needs a device runtime while the request
        runs (cohort.UnsupportedError otherwise)."""
        what = "stream_wait"
        value = _stream_value(stream, what)
        with self._busy:
            if self._done():
                return  # complete: the stream has nothing to wait for
            h = self._ctx._live(what)
            resp = self._ctx._lib.call(h, _pack({"type": what, "request": self._h,
                                                 "stream": value}, what))
        _check(resp, what)

    def result(self, timeout=None):
        return self.wait(timeout)

    def exception(self, timeout=None):
        try:
            self.wait(timeout)
        except errors.TimeoutError:
            if self._exc is None:
                raise
        except errors.CohortError:
            pass
        return self._exc

    def __await__(self):
        return self._ctx._aio_wait(self).__await__()

    def __repr__(self):
        state = "done" if self._done() else "running"
        return "<cohort.Work %s %s>" % (self._what, state)


class _AioWatcher:
    """Completions of one context delivered to one asyncio loop through the
    context's event fd."""

    def __init__(self, ctx, loop):
        self.ctx = ctx
        self.loop = loop
        self.fd = ctx.event_fd
        self.waiting = {}  # Work -> asyncio.Future
        self.reading = False

    def add(self, work):
        fut = self.loop.create_future()
        self.waiting[work] = fut
        if not self.reading and self.ctx._h is not None:
            self.loop.add_reader(self.fd, self.on_event)
            self.reading = True
        self.poll()  # it may have completed before the fd was armed
        return fut

    def on_event(self):
        try:
            os.read(self.fd, 8)  # reset the eventfd, then look at every waiter
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            pass
        self.poll()

    def poll(self):
        for work, fut in list(self.waiting.items()):
            if fut.done():
                del self.waiting[work]
                continue
            try:
                done = work.is_completed()
            except errors.CohortError as e:
                del self.waiting[work]
                fut.set_exception(e)
                continue
            if done:
                del self.waiting[work]
                try:
                    fut.set_result(work._outcome())
                except errors.CohortError as e:
                    fut.set_exception(e)
        if not self.waiting:
            self.stop()

    def in_loop(self, fn, wait=True):
        """Run fn in the loop's thread (at once when called there or when the
        loop is not running; else scheduled, and waited for up to 1 s)."""
        loop = self.loop
        if loop.is_closed():
            return
        try:
            here = asyncio.get_running_loop() is loop
        except RuntimeError:
            here = False
        if here or not loop.is_running():
            fn()
            return
        done = threading.Event()

        def run():
            try:
                fn()
            finally:
                done.set()
        try:
            loop.call_soon_threadsafe(run)
        except RuntimeError:  # closed meanwhile
            return
        if wait:
            done.wait(1.0)

    def stop(self):
        if self.reading:
            try:
                self.loop.remove_reader(self.fd)
            except (ValueError, RuntimeError):
                pass
            self.reading = False


class Context:
    """One cohort context: a set of ranks that run collectives together.

    Created by cohort.init() (or directly: Context(**config)); use it as a
    context manager, or call finalize(). Config keys are coh_config_t's field
    names (rank, world_size, store, token, nics, timeout_ms, ...) plus
    log_level; missing keys come from the environment (COHORT_*, torchrun's
    RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT).
    """

    def __init__(self, config=None, **kwargs):
        self._h = None
        self._pending = {}  # request handle -> Work, until its completion is seen
        self._destroyed = threading.Event()  # set once finalize's destroy returned
        self._prune_at = _PRUNE_MIN
        self._prune_lock = threading.Lock()
        self._lock = threading.Lock()
        self._watcher = None
        self._event_fd = None
        self._lib = _abi.load()
        if config is not None and not isinstance(config, dict):
            try:
                config = dict(config)
            except (TypeError, ValueError):
                raise errors.InvalidArgumentError(
                    "init: config must be a dict of config fields, got %s" %
                    type(config).__name__, field="config") from None
        cfg = dict(config or {})
        cfg.update(kwargs)
        resp, h = self._lib.create(_pack(cfg, "init") if cfg else b"")
        _check(resp, "init")
        self._h = h
        self._rank = resp["rank"]
        self._size = resp["size"]
        self._nrails = resp["nrails"]
        self._describe = resp["describe"]
        self.version = resp["version"]

    # ---- properties ----
    def _live(self, what):
        if self._h is None:
            raise errors.StateError("%s: the context is finalized" % what, -8, "ESTATE")
        return self._h

    @property
    def rank(self):
        return self._rank

    @property
    def size(self):
        return self._size

    world_size = size

    def get_rank(self):
        return self._rank

    def get_world_size(self):
        return self._size

    @property
    def nrails(self):
        return self._nrails

    @property
    def describe(self):
        return self._describe

    @property
    def event_fd(self):
        """A descriptor that becomes readable when a request completes (the
        context owns it: do not close it). After finalize the descriptor is
        closed and this raises StateError, as every use of a finalized
        context does."""
        h = self._live("event_fd")
        fd = self._event_fd
        if fd is None:
            fd = self._lib.event_fd(h)
            if self._h is None:  # finalized meanwhile: fd is closed
                self._live("event_fd")
            self._event_fd = fd
        return fd

    @property
    def handle(self):
        return self._h

    # ---- raw requests ----
    def call(self, request, check=True):
        """Send one request dict through the ABI; return the response dict
        (raise its error unless check=False)."""
        if not isinstance(request, dict):
            raise errors.InvalidArgumentError("call: the request must be a dict, got %s" %
                                              type(request).__name__, field="request")
        what = request.get("type", "request")
        what = what if isinstance(what, str) else "request"
        resp = self._lib.call(self._live("call"), _pack(request, what))
        return _check(resp, what) if check else resp

    def call_raw(self, data):
        """Send raw bytes as a request; return the response dict unchecked."""
        try:
            data = bytes(data)
        except (TypeError, ValueError):
            raise errors.InvalidArgumentError("call_raw: expected bytes, got %s" %
                                              type(data).__name__, field="request") from None
        return self._lib.call(self._live("call"), data)

    def info(self):
        return self.call({"type": "info"})

    def stats(self):
        return self.call({"type": "stats"})["stats"]

    def lb_table(self):
        """The rail balancer's newest table (text, loadable through
        COHORT_LB_TABLE); the same on every rank for the same epoch. Raises
        UnsupportedError with one rail, one rank or COHORT_LB_EPOCH=0, and
        TimeoutError (EAGAIN) before the first world op."""
        return self.call({"type": "lb_table"})["table"]

    def failed_ranks(self):
        """World ranks this rank knows failed (died, hung, excluded by the
        coordinator), ascending."""
        return list(self.call({"type": "failed_ranks"})["ranks"])

    def probe(self):
        """Alpha-beta probe of every link (collective: every rank calls it).
        Returns {"duration_us", "bytes_sent", "failed", "links": [{"peer",
        "rail", "latency_us", "gbps"}, ...]} for this rank's links; the
        coordinator feeds them to its cost model and the rail balancer."""
        r = self.call({"type": "probe"})
        return {k: r[k] for k in ("duration_us", "bytes_sent", "failed", "links")}

    def logs(self):
        """Messages captured since the last call when log_level was set."""
        return [tuple(x) for x in self.call({"type": "logs"})["logs"]]

    # ---- collectives ----
    def _submit(self, req, keep, what, async_op, make=Result):
        h = self._live(what)
        if len(self._pending) >= self._prune_at:
            self._prune()
        if async_op:
            req["async"] = True
        else:
            req["timeout_ms"] = _WAIT_SLICE_MS
        resp = self._lib.call(h, _pack(req, what))
        st = resp.get("status", -14)
        if st < 0 and not (st == -11 and "request" in resp):
            raise errors.from_response(resp, what)
        if "request" not in resp:  # completed within the call
            return make(resp)
        work = Work(self, resp["request"], keep, what, make)
        self._pending[work._h] = work
        return work if async_op else work.wait()

    def _prune(self):
        """Test the requests still tracked and drop the completed ones (their
        Work, if someone holds it, keeps the outcome). A request another
        thread is waiting on is left to that thread."""
        if not self._prune_lock.acquire(blocking=False):
            return  # another thread is at it
        try:
            for work in list(self._pending.values()):
                if self._h is None:
                    return
                if work._busy.acquire(blocking=False):
                    try:
                        work._test()
                    finally:
                        work._busy.release()
            self._prune_at = max(_PRUNE_MIN, 2 * len(self._pending))
        finally:
            self._prune_lock.release()

    def allreduce(self, arr, op="sum", async_op=False, dtype=None, algo="default",
                  iteration=None, loss_bound=0.0, pull_loss_bound=0.0, layer=None,
                  nlayers=None, stream=None):
        """Reduce arr over every rank, in place. op: sum, avg, min, max, prod.
        algo: "default" (ring or recursive doubling by size) or "relay" (a
        relay group: the ranks that submitted start, guided by the
        coordinator, while the late ranks relay; their data is folded in when
        they submit; the same result, integer data bit for bit; the Result
        describes the group as a sync's does). Every rank must use the same
        algo; at most one relay allreduce or sync outstanding per rank.
        iteration: relay only, the caller's step number (for traces).
        loss_bound: on rails marked udp (COHORT_NICS=eth0:udp), the allreduce
        runs in datagrams and each receive of its push stage may miss up to
        this fraction of its bytes, each of its pull stage pull_loss_bound (0:
        a quarter of loss_bound); Result.loss says what was lost. 0: every
        byte (the reliable path). layer of nlayers: the tensor's layer, for
        the datagrams' DSCP priority (docs/udp.md).

        Device arrays (CUDA tensors, CuPy, anything with
        __cuda_array_interface__) are reduced where they are (docs/gpu.md):
        the op starts once the work queued on `stream` before the call is
        done (an int cudaStream_t, torch.cuda.Stream or CuPy stream; default:
        the stream the array names, else the default stream), and completes
        once the result is in the array. Work.stream_wait orders later device
        work after it without a host wait. The same holds for broadcast,
        allgather and reduce_scatter."""
        what = "allreduce"
        async_op = _flag(async_op, what, "async", "async_op")
        if not isinstance(algo, str) or algo not in ALLREDUCE_ALGOS:
            shown = repr(algo) if isinstance(algo, str) else "of type %s" % type(algo).__name__
            raise errors.InvalidArgumentError("%s: unknown algo %s (one of %s)" % (
                what, shown, ", ".join(ALLREDUCE_ALGOS)), field="algo")
        arr, dtype = _host(arr, dtype, what, "array")
        t = _tensor(arr, what, "array")
        req = {"type": what, "dtype": _dtype_of(arr, dtype, what), "op": _op(op, what), "buf": t}
        if iteration is not None:
            if algo != "relay":
                raise errors.InvalidArgumentError(
                    "%s: iteration is used only with algo='relay'" % what, field="iteration")
            req["iteration"] = _integer(iteration, what, "iteration", 0, _INT64_MAX)
        if algo != "default":  # absent: what every library version does
            req["algo"] = algo
        loss_bound = _bound(loss_bound, what, "loss_bound")
        pull_loss_bound = _bound(pull_loss_bound, what, "pull_loss_bound")
        if loss_bound or pull_loss_bound:
            req["loss_bound"] = loss_bound
            req["pull_loss_bound"] = pull_loss_bound
        if nlayers is not None:
            req["nlayers"] = _integer(nlayers, what, "nlayers", 1, 2**31 - 1)
            req["layer"] = _integer(0 if layer is None else layer, what, "layer", 0,
                                    req["nlayers"] - 1)
        elif layer is not None:
            raise errors.InvalidArgumentError("%s: layer needs nlayers" % what, field="layer")
        _place(req, (arr,), stream, what)
        return self._submit(req, (arr,), what, async_op)

    all_reduce = allreduce

    def broadcast(self, arr, src=0, async_op=False, dtype=None, stream=None):
        """Copy arr of rank src to every rank, in place."""
        what = "broadcast"
        async_op = _flag(async_op, what, "async", "async_op")
        if isinstance(src, (bool, np.bool_)) or not isinstance(src, (int, np.integer)):
            raise errors.InvalidArgumentError("%s: src must be an int (a rank), got %s" % (
                what, type(src).__name__), field="root")
        if not 0 <= src < self._size:
            raise errors.InvalidArgumentError(
                "%s: src %d is not a rank of a world of %d" % (what, src, self._size), field="root")
        src = int(src)
        arr, dtype = _host(arr, dtype, what, "array")
        t = _tensor(arr, what, "array")
        req = {"type": what, "dtype": _dtype_of(arr, dtype, what), "root": src, "buf": t}
        _place(req, (arr,), stream, what)
        return self._submit(req, (arr,), what, async_op)

    def allgather(self, output, input=None, async_op=False, dtype=None,  # noqa: A002
                  stream=None):
        """output (world_size x input.size elements) = every rank's input, in rank
        order. input None: in place, this rank's block of output is its input."""
        what = "allgather"
        async_op = _flag(async_op, what, "async", "async_op")
        output, dtype = _host(output, dtype, what, "output")
        if input is not None:
            input, _ = _host(input, dtype, what, "input")  # noqa: A001
        name = _dtype_of(output, dtype, what, "output")
        req = {"type": what, "dtype": name, "recv": _tensor(output, what, "output")}
        keep = (output,)
        if input is not None:
            if _dtype_of(input, dtype, what, "input") != name:
                raise errors.DtypeError("%s: input is %s but output is %s" % (
                    what, input.dtype, output.dtype), field="send")
            if output.size != input.size * self._size:
                raise errors.InvalidArgumentError(
                    "%s: output has %d elements, expected world_size (%d) x input (%d) = %d" % (
                        what, output.size, self._size, input.size, input.size * self._size),
                    field="recv")
            req["send"] = _tensor(input, what, "input", writable=False)
            keep = (output, input)
        elif output.size % self._size:
            raise errors.InvalidArgumentError(
                "%s: output has %d elements, not a multiple of world_size %d" % (
                    what, output.size, self._size), field="recv")
        _place(req, keep, stream, what)
        return self._submit(req, keep, what, async_op)

    all_gather_into_tensor = allgather

    def reduce_scatter(self, output, input=None, op="sum", async_op=False,  # noqa: A002
                       dtype=None, stream=None):
        """output = block `rank` of (input reduced over ranks); input has
        world_size x output.size elements. input None: output holds the whole
        input and the result is left in output's block `rank`."""
        what = "reduce_scatter"
        async_op = _flag(async_op, what, "async", "async_op")
        output, dtype = _host(output, dtype, what, "output")
        if input is not None:
            input, _ = _host(input, dtype, what, "input")  # noqa: A001
        name = _dtype_of(output, dtype, what, "output")
        req = {"type": what, "dtype": name, "op": _op(op, what),
               "recv": _tensor(output, what, "output")}
        keep = (output,)
        if input is not None:
            if _dtype_of(input, dtype, what, "input") != name:
                raise errors.DtypeError("%s: input is %s but output is %s" % (
                    what, input.dtype, output.dtype), field="send")
            if input.size != output.size * self._size:
                raise errors.InvalidArgumentError(
                    "%s: input has %d elements, expected world_size (%d) x output (%d) = %d" % (
                        what, input.size, self._size, output.size, output.size * self._size),
                    field="send")
            req["send"] = _tensor(input, what, "input", writable=False)
            keep = (output, input)
        elif output.size % self._size:
            raise errors.InvalidArgumentError(
                "%s: output has %d elements, not a multiple of world_size %d" % (
                    what, output.size, self._size), field="recv")
        _place(req, keep, stream, what)
        return self._submit(req, keep, what, async_op)

    reduce_scatter_tensor = reduce_scatter

    def barrier(self, async_op=False):
        async_op = _flag(async_op, "barrier", "async", "async_op")
        return self._submit({"type": "barrier"}, (), "barrier", async_op)

    def sync(self, arr, iteration, weight=1.0, mode=None, async_op=False, dtype=None):
        """Partial / selective synchronisation of arr (in place) for training
        step `iteration`: this rank joins the group the scheduler forms, which
        averages its members' arrays with their weights (weight > 0, e.g. the
        local steps since the last sync). mode: default (the context's
        sync_mode), allreduce, partial, selective or relay; every rank must use
        the same. The Result says who was in the group (members, full), how
        long this rank waited for it (wait_us) and how long the exchange took
        (comm_us); in relay mode also who relayed (relays, relayed) and what
        phase 2 did (phase2, phase2_method, nexcluded)."""
        what = "sync"
        async_op = _flag(async_op, what, "async", "async_op")
        iteration = _integer(iteration, what, "iteration", 0, _INT64_MAX)
        weight = _weight(weight, what)
        if mode is not None and (not isinstance(mode, str) or mode not in SYNC_MODES):
            shown = repr(mode) if isinstance(mode, str) else "of type %s" % type(mode).__name__
            raise errors.InvalidArgumentError("sync: unknown mode %s (one of %s)" % (
                shown, ", ".join(SYNC_MODES)), field="mode")
        arr, dtype = _host(arr, dtype, what, "array")
        t = _tensor(arr, what, "array")
        req = {"type": what, "dtype": _dtype_of(arr, dtype, what), "buf": t,
               "iteration": iteration, "weight": weight}
        if mode is not None:
            req["mode"] = mode
        return self._submit(req, (arr,), what, async_op)

    def sync_leave(self):
        """This rank stops syncing for now: the coordinator takes it out of the
        schedule so no group waits for it (call it when a rank is done with a
        phase of training while others go on). Its next sync brings it back."""
        self.call({"type": "sync_leave"})

    # ---- asyncio ----
    async def _aio_wait(self, work):
        if work._done():
            return work._outcome()
        loop = asyncio.get_running_loop()
        with self._lock:
            w = self._watcher
            if w is None or w.loop.is_closed():
                w = None
                if self._h is not None:
                    w = self._watcher = _AioWatcher(self, loop)
        if w is None:  # finalized (or being finalized): the outcome is ECANCELED
            return await loop.run_in_executor(None, work.wait)
        if w.loop is not loop:  # another loop owns the fd: wait in a thread
            return await loop.run_in_executor(None, work.wait)
        return await w.add(work)

    # ---- teardown ----
    def finalize(self):
        """Cancel what still runs, close connections, stop threads. A second
        call does nothing."""
        with self._lock:
            h = self._h
            if h is None:
                return
            self._h = None  # new calls are refused from here on
            watcher, self._watcher = self._watcher, None
        self._event_fd = None
        if watcher is not None:  # off the fd before destroy closes it
            watcher.in_loop(watcher.stop)
        try:
            resp = self._lib.destroy(h)
        finally:
            # The library is done with every request: each ends as canceled
            # (unless its completion was seen) and lets go of its arrays.
            self._destroyed.set()
            for work in list(self._pending.values()):
                work._complete(_CANCELED)
            self._pending.clear()
            if watcher is not None:  # hand the outcomes to the coroutines awaiting them
                watcher.in_loop(watcher.poll, wait=False)
        from . import _default_cleared
        _default_cleared(self)
        _check(resp, "finalize")

    destroy = finalize

    @property
    def finalized(self):
        return self._h is None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.finalize()
        return False

    def __del__(self):
        try:
            if getattr(self, "_h", None) is not None:
                self.finalize()
        except Exception:  # interpreter shutdown: nothing useful to do
            pass

    def __repr__(self):
        return "<cohort.Context rank %d of %d%s>" % (
            self._rank, self._size, ", finalized" if self._h is None else "")
