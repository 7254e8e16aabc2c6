"""Every collective from Python, every supported dtype, in place and out of
place, blocking, checked against numpy on every rank."""
import numpy as np
import pytest

import cohort

# (name, numpy dtype of the array, dtype argument)
DTYPES = [("f32", np.float32, None), ("f64", np.float64, None), ("f16", np.float16, None),
          ("bf16", np.uint16, "bf16"), ("i32", np.int32, None), ("i64", np.int64, None),
          ("u8", np.uint8, None)]
IDS = [d[0] for d in DTYPES]


def to_bf16(x):
    """float values (exact in bfloat16) -> their bfloat16 bits as uint16."""
    return (np.asarray(x, np.float32).view(np.uint32) >> 16).astype(np.uint16)


def from_bf16(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


def make(values, npdt, dt):
    """An array of `values` (small integers, exact in every dtype)."""
    if dt == "bf16":
        return to_bf16(values)
    return np.asarray(values).astype(npdt)


def value(arr, dt):
    return from_bf16(arr).astype(np.float64) if dt == "bf16" else arr.astype(np.float64)


def rank_data(r, n):
    # Small, distinct per rank, and no product overflows u8 for 3 ranks.
    return (np.arange(n) % 5) + r + 1


def reduce_ref(size, n, op):
    xs = np.stack([rank_data(r, n).astype(np.float64) for r in range(size)])
    return {"sum": xs.sum(0), "prod": xs.prod(0), "min": xs.min(0), "max": xs.max(0),
            "avg": xs.sum(0) / size}[op]


@pytest.mark.parametrize("name,npdt,dt", DTYPES, ids=IDS)
@pytest.mark.parametrize("op", ["sum", "avg", "min", "max", "prod"])
def test_allreduce_in_place(ctx, rank, size, name, npdt, dt, op):
    n = 33
    a = make(rank_data(rank, n), npdt, dt)
    before = a.__array_interface__["data"][0]
    res = cohort.allreduce(a, op=op, dtype=dt)
    assert a.__array_interface__["data"][0] == before  # the same memory, written in place
    want = reduce_ref(size, n, op)
    if op == "avg" and name in ("i32", "i64", "u8"):
        want = np.trunc(want)  # integer average truncates toward zero
    if op == "prod" and name == "u8":
        want = np.mod(want, 256)
    if name in ("f16", "bf16") and op == "avg":
        np.testing.assert_allclose(value(a, dt), want, rtol=1e-2)
    else:
        np.testing.assert_array_equal(value(a, dt), want)
    assert isinstance(res, cohort.Result)
    assert res.size == size and res.rank == rank and res.members == list(range(size))
    assert res.time_us > 0


@pytest.mark.parametrize("name,npdt,dt", DTYPES, ids=IDS)
def test_broadcast_every_root(ctx, rank, size, name, npdt, dt):
    for root in range(size):
        a = make(rank_data(rank, 17), npdt, dt)
        cohort.broadcast(a, src=root, dtype=dt)
        np.testing.assert_array_equal(value(a, dt), rank_data(root, 17))


@pytest.mark.parametrize("name,npdt,dt", DTYPES, ids=IDS)
def test_allgather(ctx, rank, size, name, npdt, dt):
    n = 9
    inp = make(rank_data(rank, n), npdt, dt)
    keep = inp.copy()
    out = np.zeros(n * size, dtype=inp.dtype)
    cohort.allgather(out, inp, dtype=dt)
    want = np.concatenate([rank_data(r, n) for r in range(size)])
    np.testing.assert_array_equal(value(out, dt), want)
    np.testing.assert_array_equal(inp, keep)  # out of place: the input is untouched
    # In place: this rank's block of the output is the input.
    out2 = np.zeros(n * size, dtype=inp.dtype)
    out2[rank * n:(rank + 1) * n] = inp
    cohort.allgather(out2, dtype=dt)
    np.testing.assert_array_equal(out2, out)


@pytest.mark.parametrize("name,npdt,dt", DTYPES, ids=IDS)
def test_reduce_scatter(ctx, rank, size, name, npdt, dt):
    n = 5
    full = make(rank_data(rank, n * size), npdt, dt)
    keep = full.copy()
    out = np.zeros(n, dtype=full.dtype)
    cohort.reduce_scatter(out, full, op="sum", dtype=dt)
    want = reduce_ref(size, n * size, "sum")[rank * n:(rank + 1) * n]
    np.testing.assert_array_equal(value(out, dt), want)
    np.testing.assert_array_equal(full, keep)
    # In place: the whole input in output, the result left in block `rank`.
    inpl = keep.copy()
    cohort.reduce_scatter(inpl, op="max", dtype=dt)
    want = reduce_ref(size, n * size, "max")[rank * n:(rank + 1) * n]
    np.testing.assert_array_equal(value(inpl, dt)[rank * n:(rank + 1) * n], want)


def test_barrier_and_info(ctx, rank, size):
    assert cohort.barrier().type == "barrier"
    assert cohort.rank() == rank and cohort.world_size() == size
    assert cohort.get_rank() == rank and cohort.get_world_size() == size
    info = ctx.info()
    assert info["rank"] == rank and info["size"] == size and info["schema"] == cohort.SCHEMA
    assert "rail" in ctx.describe
    st = cohort.stats()
    assert st["requests_completed"] > 0 and st["connections_rejected"] == 0


def test_multidimensional_and_empty(ctx, rank, size):
    a = np.full((3, 4, 5), rank + 1, np.float32)
    cohort.allreduce(a)
    assert (a == size * (size + 1) / 2).all()
    e = np.zeros(0, np.float64)
    cohort.allreduce(e)
    cohort.broadcast(np.zeros((0, 3), np.int32))


def test_large(ctx, rank, size):
    a = np.full(3 << 20, rank + 1, np.float32)  # 12 MiB: the ring, in chunks
    cohort.allreduce(a, op="avg")
    assert np.all(a == (size + 1) / 2)


def test_inline_through_the_abi(ctx, rank, size):
    """Inline msgpack bin tensors (what a binding without pointers uses)."""
    x = np.arange(4, dtype=np.int32) + rank
    r = ctx.call({"type": "allreduce", "dtype": "i32", "op": "sum", "buf": x.tobytes()})
    got = np.frombuffer(r["buf"], np.int32)
    np.testing.assert_array_equal(got, sum(np.arange(4) + q for q in range(size)))
    np.testing.assert_array_equal(x, np.arange(4) + rank)  # inline: the array is not touched
    r = ctx.call({"type": "allgather", "dtype": "f64", "send": np.float64([rank]).tobytes(),
                  "id": 77})
    assert r["id"] == 77
    np.testing.assert_array_equal(np.frombuffer(r["recv"], np.float64), np.arange(size))
    r = ctx.call({"type": "reduce_scatter", "dtype": "u8",
                  "send": bytes([1] * size * 2)})
    assert r["recv"] == bytes([size] * 2)
    r = ctx.call({"type": "broadcast", "dtype": "u8", "root": size - 1,
                  "buf": bytes([rank] * 3)})
    assert r["buf"] == bytes([size - 1] * 3)


def test_lb_table(ctx, rank, size):
    """The balancer's table through the FFI: with one rail (or one rank) there
    is none; with several rails (python.n2.rails2) every rail is in it after a
    few striped ops (mp.lb.* checks that every rank has the same table for
    the same epoch)."""
    info = ctx.call({"type": "info"})
    if size == 1 or info["nrails"] < 2:
        with pytest.raises(cohort.UnsupportedError):
            cohort.lb_table()
        return
    x = np.ones(1 << 20, np.float32)
    for _ in range(40):  # 2.5 epochs of 16 ops, 4 MiB each: striped and measured
        cohort.allreduce(x)
    cohort.barrier()
    text = cohort.lb_table()
    assert text.startswith("cohort-lb 1")
    # Every rail has been measured (latency at least: on a noisy host the
    # balancer may leave a rail that looked slow out of the large ops until
    # its next probe, so a rate per rail is not guaranteed in 40 ops).
    rails = {int(line.split()[1]) for line in text.splitlines()
             if line.startswith("rail ") and (" latency " in line or " rate " in line)}
    assert rails == set(range(info["nrails"])), text
    assert any(" rate " in line for line in text.splitlines()), text


def test_failed_ranks_and_probe(ctx, rank, size):
    """Nobody failed in a healthy job; the probe measures every link of this
    rank on every rail, with sane figures."""
    assert cohort.failed_ranks() == []
    info = ctx.call({"type": "info"})
    p = cohort.probe()
    assert p["failed"] == 0
    assert len(p["links"]) == (size - 1) * info["nrails"]
    assert {(l["peer"], l["rail"]) for l in p["links"]} == {
        (q, r) for q in range(size) if q != rank for r in range(info["nrails"])}
    for l in p["links"]:
        assert 0 < l["latency_us"] < 1e6 and l["gbps"] > 0, l
    if size > 1:
        assert p["bytes_sent"] > 0 and p["duration_us"] > 0
    st = cohort.stats()
    assert st["requests_failed"] >= 0
    # the per-peer link estimates the stats hold: this probe's
    key = lambda l: (l["peer"], l["rail"])  # noqa: E731
    assert sorted(st["links"], key=key) == sorted(p["links"], key=key)
