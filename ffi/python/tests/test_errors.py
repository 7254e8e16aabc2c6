"""Bad input from Python: clear exceptions, and through the raw ABI error
responses that name the field (never a crash, never a hang)."""
import subprocess
import sys
import os

import msgpack
import numpy as np
import pytest

import cohort
from cohort import _abi


def test_non_contiguous(ctx):
    a = np.zeros((4, 4), np.float32)[:, 1]
    with pytest.raises(cohort.InvalidArgumentError, match="not contiguous") as e:
        cohort.allreduce(a)
    assert e.value.field == "array" and isinstance(e.value, ValueError)
    with pytest.raises(ValueError, match="ascontiguousarray"):
        cohort.broadcast(np.zeros(10, np.int32)[::2])
    with pytest.raises(cohort.InvalidArgumentError, match="input is not contiguous"):
        cohort.allgather(np.zeros(10 * ctx.size, np.int32), np.zeros(20, np.int32)[::2])
    with pytest.raises(cohort.InvalidArgumentError, match="not contiguous"):
        cohort.allreduce(np.asfortranarray(np.zeros((3, 4), np.float32)))


def test_read_only(ctx):
    a = np.zeros(8, np.float32)
    a.setflags(write=False)
    with pytest.raises(cohort.InvalidArgumentError, match="read-only"):
        cohort.allreduce(a)
    # a read-only input of an out-of-place collective is fine
    out = np.zeros(8 * ctx.size, np.float32)
    cohort.allgather(out, a)


@pytest.mark.parametrize("dt", [np.int8, np.uint16, np.int16, np.uint32, np.bool_,
                                np.complex64, np.float128 if hasattr(np, "float128") else np.int8])
def test_unsupported_dtype(ctx, dt):
    with pytest.raises(cohort.DtypeError, match="unsupported dtype") as e:
        cohort.allreduce(np.zeros(4, dt))
    assert isinstance(e.value, TypeError) and e.value.field == "dtype"
    assert "float32" in str(e.value)  # the message lists what is supported


def test_dtype_argument(ctx):
    with pytest.raises(cohort.DtypeError, match="unknown dtype 'f8'"):
        cohort.allreduce(np.zeros(4, np.float64), dtype="f8")
    with pytest.raises(cohort.DtypeError, match="2-byte elements"):
        cohort.allreduce(np.zeros(4, np.float32), dtype="bf16")
    with pytest.raises(cohort.InvalidArgumentError, match="unknown op of type ndarray"):
        cohort.allreduce(np.zeros(4, np.float32), np.zeros(4, np.float32))
    with pytest.raises(cohort.InvalidArgumentError, match="must be a numpy.ndarray, got list"):
        cohort.allreduce([1.0, 2.0])


def test_mismatched_sizes(ctx, size):
    with pytest.raises(cohort.InvalidArgumentError, match="expected world_size") as e:
        cohort.allgather(np.zeros(3 * size + 1, np.float32), np.zeros(3, np.float32))
    assert e.value.field == "recv"
    with pytest.raises(cohort.InvalidArgumentError, match="input has 7 elements"):
        cohort.reduce_scatter(np.zeros(2, np.float32), np.zeros(7, np.float32))
    with pytest.raises(cohort.DtypeError, match="input is float64 but output is float32"):
        cohort.allgather(np.zeros(size, np.float32), np.zeros(1, np.float64))
    if size > 1:
        with pytest.raises(cohort.InvalidArgumentError, match="not a multiple of world_size"):
            cohort.allgather(np.zeros(size + 1, np.float32))


def test_bad_arguments(ctx, size):
    with pytest.raises(cohort.InvalidArgumentError, match="unknown op 'mean'"):
        cohort.allreduce(np.zeros(2, np.float32), op="mean")
    with pytest.raises(cohort.InvalidArgumentError, match="src 99 is not a rank"):
        cohort.broadcast(np.zeros(2, np.float32), src=99)
    with pytest.raises(cohort.InvalidArgumentError, match="iteration"):
        cohort.sync(np.zeros(2, np.float32), iteration=-1)
    with pytest.raises(cohort.InvalidArgumentError, match="unknown mode"):
        cohort.sync(np.zeros(2, np.float32), iteration=1, mode="eager")
    with pytest.raises(cohort.InvalidArgumentError, match="'weight': 0 is not > 0") as e:
        cohort.sync(np.zeros(2, np.float32), iteration=1, weight=0.0)
    assert e.value.field == "weight"


def raw(ctx, data):
    r = ctx.call_raw(data)
    assert r["v"] == 1 and r["status"] < 0 and r["error"]
    return r


def test_raw_malformed(ctx):
    assert raw(ctx, b"")["error"].startswith("request: empty")
    assert "expected a msgpack map" in raw(ctx, msgpack.packb([1, 2]))["error"]
    assert "0xc1" in raw(ctx, b"\xc1")["error"]
    assert "trailing" in raw(ctx, msgpack.packb({"type": "info"}) + b"\x00")["error"]
    assert "declares 4294967295" in raw(ctx, b"\xdd\xff\xff\xff\xff")["error"]
    assert "nested deeper" in raw(ctx, b"\x91" * 100 + b"\x00")["error"]
    assert "more than 1024" in raw(ctx, msgpack.packb({"type": "info", "x": [None] * 2000}))["error"]


def test_raw_truncated_at_every_byte(ctx):
    full = msgpack.packb({"type": "allreduce", "dtype": "f32", "op": "sum", "id": 5,
                          "buf": {"addr": 4096, "nbytes": 16}})
    for n in range(len(full)):
        r = raw(ctx, full[:n])
        assert r["code"] == "EINVAL"


def test_raw_oversized(ctx):
    big = msgpack.packb({"type": "allreduce", "dtype": "u8", "buf": b"\x00" * (65 << 20)})
    r = raw(ctx, big)
    assert "over the limit" in r["error"]


def test_raw_wrong_types_name_the_field(ctx):
    cases = [
        ({"type": 1}, "type", "expected a string, got an integer"),
        ({"type": "allreduce", "dtype": "f32", "buf": "abc"}, "buf", "expected binary"),
        ({"type": "allreduce", "dtype": "f32", "buf": b"\0" * 4, "op": 3}, "op",
         "expected a string"),
        ({"type": "allreduce", "dtype": "f32", "buf": b"\0" * 6}, "buf",
         "not a whole number of f32 elements"),
        ({"type": "allreduce", "dtype": "f32", "buf": {"addr": 0, "nbytes": 4}}, "buf",
         "addr is 0"),
        ({"type": "allreduce", "dtype": "f32", "buf": {"addr": 64}}, "buf", "missing 'nbytes'"),
        ({"type": "broadcast", "dtype": "f32", "buf": b"", "root": -1}, "root", "outside"),
        ({"type": "barrier", "async": 1}, "async", "expected a boolean"),
        ({"type": "info", "bogus": 1}, "bogus", "unknown field 'bogus'"),
        ({"type": "stats", "dtype": "f32"}, "dtype", "not used by a stats request"),
        ({"type": "sync", "dtype": "f32", "buf": b""}, "iteration", "missing field"),
        ({"type": "sync", "dtype": "f32", "buf": b"", "iteration": 1, "weight": "x"},
         "weight", "expected a number"),
        ({"v": 7, "type": "info"}, "v", "schema version 7"),
        ({"dtype": "f32"}, "type", "missing field 'type'"),
    ]
    for req, field, sub in cases:
        r = ctx.call(req, check=False)
        assert r["status"] < 0, req
        assert r["field"] == field, (req, r)
        assert sub in r["error"], (req, r)
        assert "'%s'" % field in r["error"] or field == "v", r
    with pytest.raises(cohort.InvalidArgumentError) as e:
        ctx.call({"type": "allreduce", "dtype": "complex", "buf": b""})
    assert e.value.field == "dtype" and e.value.code == "EINVAL"


def test_id_is_echoed_on_errors(ctx):
    r = ctx.call({"id": 42, "type": "allreduce", "dtype": "nope"}, check=False)
    assert r["id"] == 42 and r["type"] == "allreduce"


def test_stale_and_made_up_handles(ctx):
    lib = _abi.load()
    a = np.ones(4, np.float32)
    w = cohort.allreduce(a, async_op=True)
    h = w._h
    w.wait()
    r = lib.wait(ctx.handle, h, 0)  # already answered: released
    assert r["code"] == "EINVAL" and r["field"] == "request"
    for bad in (0, 1, 2**64 - 1, h ^ (1 << 40)):
        assert lib.test(ctx.handle, bad)["field"] == "request"
        assert lib.call(bad, msgpack.packb({"type": "info"}))["field"] == "context"
    with pytest.raises(cohort.CohortError):
        lib.event_fd(12345)


def test_not_initialized_and_finalized():
    """In a fresh interpreter (the session context would get in the way)."""
    code = r'''
import numpy as np, cohort
try:
    cohort.rank()
except cohort.StateError as e:
    assert "not initialized" in str(e), e
else:
    raise SystemExit("rank() before init did not raise")
ctx = cohort.init(rank=0, world_size=1, nics="lo")
try:
    cohort.init()
except cohort.StateError as e:
    assert "already initialized" in str(e)
with ctx:
    cohort.allreduce(np.ones(3, np.float32))
assert not cohort.is_initialized()
try:
    ctx.allreduce(np.ones(3, np.float32))
except cohort.StateError as e:
    assert "finalized" in str(e)
else:
    raise SystemExit("allreduce after finalize did not raise")
ctx.finalize()  # twice: nothing
try:
    cohort.Context(world_size=1, chunk_bytes="lots")
except cohort.InvalidArgumentError as e:
    assert e.field == "chunk_bytes", e
try:
    cohort.Context(world_size=1, bogus=1)
except cohort.InvalidArgumentError as e:
    assert "unknown field 'bogus'" in str(e), e
try:
    cohort.Context(world_size=1, nics="no-such-nic0")
except cohort.CohortError as e:
    assert "no-such-nic0" in str(e), e
with cohort.Context(world_size=1, log_level="debug", timeout_ms=5000, chunk_bytes="256K",
                    small_bytes=0, rail_min_bytes="2M", spin_us=0, poll_us=10,
                    sockbuf_bytes=0, token="abc", connect_timeout_ms=9000) as c:
    a = np.ones(5, np.float64)
    c.allreduce(a)
    assert isinstance(c.logs(), list)
# a Work that outlives its context fails cleanly
c = cohort.Context(world_size=1)
w = c.barrier(async_op=True)
c.finalize()
w.is_completed()
print("OK")
'''
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    for k in list(env):
        if k.startswith("COHORT_") and k != "COHORT_LIBRARY":
            del env[k]
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0 and "OK" in p.stdout, p.stdout + p.stderr
