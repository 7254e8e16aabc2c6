"""Contexts, collectives on numpy arrays, futures and asyncio."""

import asyncio
import ctypes
import os
import threading

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
SYNC_MODES = ("default", "allreduce", "partial", "selective")
SUPPORTED_DTYPES = ("float32", "float64", "float16", "bfloat16 (dtype='bf16')", "int32", "int64",
                    "uint8")

_packb = msgpack.packb
_addressof = ctypes.addressof
_c_char = ctypes.c_char
_WAIT_SLICE_MS = 1000  # blocking calls return to Python this often (Ctrl-C works)


class Result:
    """The outcome of a completed collective."""

    __slots__ = ("type", "time_us", "abi_us", "rank", "size", "members", "wait_us", "comm_us",
                 "full", "total_weight", "group_id", "response")

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
        # sync only: the scheduler's group
        self.wait_us = g.get("wait_us")
        self.comm_us = g.get("comm_us")
        self.full = g.get("full")
        self.total_weight = g.get("total_weight")
        self.group_id = g.get("group_id")

    def __repr__(self):
        return "Result(type=%r, time_us=%.1f, abi_us=%.1f, group=%r)" % (
            self.type, self.time_us, self.abi_us, self.members)


def _check(resp, what):
    if resp.get("status", -14) < 0:
        raise errors.from_response(resp, what)
    return resp


def _dtype_of(arr, dtype, what):
    if dtype is not None:
        name = _ALIASES.get(str(dtype), str(dtype))
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
    if not isinstance(arr, np.ndarray):
        raise errors.InvalidArgumentError(
            "%s: %s must be a numpy.ndarray, got %s" % (what, field, type(arr).__name__),
            field=field)
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


def _op(op, what):
    if not isinstance(op, str) or op not in OPS:
        shown = repr(op) if isinstance(op, str) else "of type %s" % type(op).__name__
        raise errors.InvalidArgumentError("%s: unknown op %s (one of %s)" % (
            what, shown, ", ".join(OPS)), field="op")
    return op


class Work:
    """A collective in flight (torch.distributed's Work): wait(), is_completed(),
    result(), exception(), and ``await work`` in asyncio."""

    __slots__ = ("_ctx", "_h", "_keep", "_resp", "_exc", "_what", "_make", "__weakref__")

    def __init__(self, ctx, handle, keep, what, make=Result):
        self._ctx = ctx
        self._h = handle
        self._keep = keep  # the arrays cohort reads and writes until completion
        self._resp = None
        self._exc = None
        self._what = what
        self._make = make

    def _complete(self, resp):
        if self._resp is not None or self._exc is not None:
            return
        self._ctx._pending.pop(self._h, None)
        self._keep = None
        if resp.get("status", -14) < 0:
            self._exc = errors.from_response(resp, self._what)
        else:
            self._resp = resp

    def _outcome(self):
        if self._exc is not None:
            raise self._exc
        return self._make(self._resp)

    def is_completed(self):
        """True once the request has completed (successfully or not)."""
        if self._resp is not None or self._exc is not None:
            return True
        ctx = self._ctx
        if ctx._h is None:
            return True
        resp = ctx._lib.test(ctx._h, self._h)
        if resp.get("status") == -11:
            return False
        self._complete(resp)
        return True

    done = is_completed

    def wait(self, timeout=None):
        """Block until complete; return its Result or raise its error.
        timeout (seconds): raise cohort.TimeoutError if not complete by then
        (the request goes on; wait again later)."""
        ctx = self._ctx
        deadline = None if timeout is None else max(0, int(timeout * 1000))
        while self._resp is None and self._exc is None:
            if ctx._h is None:
                self._complete({"status": -10, "code": "ECANCELED",
                                "error": "the context was finalized"})
                break
            ms = _WAIT_SLICE_MS if deadline is None else min(_WAIT_SLICE_MS, deadline)
            resp = ctx._lib.wait(ctx._h, self._h, ms)
            if resp.get("status") == -11:
                if deadline is not None:
                    deadline -= ms
                    if deadline <= 0:
                        raise errors.TimeoutError(
                            "%s: not complete after %s s" % (self._what, timeout), -11, "EAGAIN")
                continue
            self._complete(resp)
        return self._outcome()

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
        state = "done" if (self._resp is not None or self._exc is not None) else "running"
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
        if not self.reading:
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
        self._lib = _abi.load()
        cfg = dict(config or {})
        cfg.update(kwargs)
        resp, h = self._lib.create(_packb(cfg) if cfg else b"")
        _check(resp, "init")
        self._h = h
        self._rank = resp["rank"]
        self._size = resp["size"]
        self._nrails = resp["nrails"]
        self._describe = resp["describe"]
        self.version = resp["version"]
        self._pending = {}
        self._lock = threading.Lock()
        self._watcher = None
        self._event_fd = None

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
        """A descriptor that becomes readable when a request completes."""
        if self._event_fd is None:
            self._event_fd = self._lib.event_fd(self._live("event_fd"))
        return self._event_fd

    @property
    def handle(self):
        return self._h

    # ---- raw requests ----
    def call(self, request, check=True):
        """Send one request dict through the ABI; return the response dict
        (raise its error unless check=False)."""
        resp = self._lib.call(self._live("call"), _packb(request))
        return _check(resp, request.get("type", "request")) if check else resp

    def call_raw(self, data):
        """Send raw bytes as a request; return the response dict unchecked."""
        return self._lib.call(self._live("call"), bytes(data))

    def info(self):
        return self.call({"type": "info"})

    def stats(self):
        return self.call({"type": "stats"})["stats"]

    def logs(self):
        """Messages captured since the last call when log_level was set."""
        return [tuple(x) for x in self.call({"type": "logs"})["logs"]]

    # ---- collectives ----
    def _submit(self, req, keep, what, async_op, make=Result):
        h = self._live(what)
        if async_op:
            req["async"] = True
        else:
            req["timeout_ms"] = _WAIT_SLICE_MS
        resp = self._lib.call(h, _packb(req))
        st = resp.get("status", -14)
        if st < 0 and not (st == -11 and "request" in resp):
            raise errors.from_response(resp, what)
        if "request" not in resp:  # completed within the call
            return make(resp)
        work = Work(self, resp["request"], keep, what, make)
        self._pending[work._h] = work
        return work if async_op else work.wait()

    def allreduce(self, arr, op="sum", async_op=False, dtype=None):
        """Reduce arr over every rank, in place. op: sum, avg, min, max, prod."""
        what = "allreduce"
        t = _tensor(arr, what, "array")
        req = {"type": what, "dtype": _dtype_of(arr, dtype, what), "op": _op(op, what), "buf": t}
        return self._submit(req, (arr,), what, async_op)

    all_reduce = allreduce

    def broadcast(self, arr, src=0, async_op=False, dtype=None):
        """Copy arr of rank src to every rank, in place."""
        what = "broadcast"
        if not isinstance(src, int) or not 0 <= src < self._size:
            raise errors.InvalidArgumentError(
                "%s: src %r is not a rank of a world of %d" % (what, src, self._size), field="root")
        t = _tensor(arr, what, "array")
        req = {"type": what, "dtype": _dtype_of(arr, dtype, what), "root": src, "buf": t}
        return self._submit(req, (arr,), what, async_op)

    def allgather(self, output, input=None, async_op=False, dtype=None):  # noqa: A002
        """output (world_size x input.size elements) = every rank's input, in rank
        order. input None: in place, this rank's block of output is its input."""
        what = "allgather"
        name = _dtype_of(output, dtype, what)
        req = {"type": what, "dtype": name, "recv": _tensor(output, what, "output")}
        keep = (output,)
        if input is not None:
            if _dtype_of(input, dtype, what) != name:
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
        return self._submit(req, keep, what, async_op)

    all_gather_into_tensor = allgather

    def reduce_scatter(self, output, input=None, op="sum", async_op=False,  # noqa: A002
                       dtype=None):
        """output = block `rank` of (input reduced over ranks); input has
        world_size x output.size elements. input None: output holds the whole
        input and the result is left in output's block `rank`."""
        what = "reduce_scatter"
        name = _dtype_of(output, dtype, what)
        req = {"type": what, "dtype": name, "op": _op(op, what),
               "recv": _tensor(output, what, "output")}
        keep = (output,)
        if input is not None:
            if _dtype_of(input, dtype, what) != name:
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
        return self._submit(req, keep, what, async_op)

    reduce_scatter_tensor = reduce_scatter

    def barrier(self, async_op=False):
        return self._submit({"type": "barrier"}, (), "barrier", async_op)

    def sync(self, arr, iteration, weight=1.0, mode=None, async_op=False, dtype=None):
        """Partial / selective synchronisation of arr (in place) for training
        step `iteration`: this rank joins the group the scheduler forms, which
        averages its members' arrays with their weights (weight > 0, e.g. the
        local steps since the last sync). mode: default (the context's
        sync_mode), allreduce, partial or selective; every rank must use the
        same. The Result says who was in the group (members, full), how long
        this rank waited for it (wait_us) and how long the exchange took
        (comm_us)."""
        what = "sync"
        if isinstance(iteration, bool) or not isinstance(iteration, (int, np.integer)) \
                or iteration < 0:
            raise errors.InvalidArgumentError(
                "sync: iteration must be a non-negative int, got %r" % (iteration,),
                field="iteration")
        if mode is not None and mode not in SYNC_MODES:
            raise errors.InvalidArgumentError("sync: unknown mode %r (one of %s)" % (
                mode, ", ".join(SYNC_MODES)), field="mode")
        req = {"type": what, "dtype": _dtype_of(arr, dtype, what), "buf": _tensor(arr, what, "array"),
               "iteration": int(iteration), "weight": float(weight)}
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
        if work._resp is not None or work._exc is not None:
            return work._outcome()
        loop = asyncio.get_running_loop()
        with self._lock:
            w = self._watcher
            if w is None or w.loop.is_closed():
                w = self._watcher = _AioWatcher(self, loop)
        if w.loop is not loop:  # another loop owns the fd: wait in a thread
            return await loop.run_in_executor(None, work.wait)
        return await w.add(work)

    # ---- teardown ----
    def finalize(self):
        """Cancel what still runs, close connections, stop threads. A second
        call does nothing."""
        h = self._h
        if h is None:
            return
        if self._watcher is not None:
            self._watcher.stop()
        self._h = None
        resp = self._lib.destroy(h)
        for work in list(self._pending.values()):
            work._complete({"status": -10, "code": "ECANCELED",
                            "error": "the context was finalized before the request completed"})
        self._pending.clear()
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
