"""cohort.sync: partial / selective synchronisation (coh_sync) from Python.

A rank's array after a sync is the weighted average of its group's arrays,
and the result says who was in the group. A rank that has done its steps
while others go on must leave (sync_leave) so that no group waits for it;
its next sync brings it back. Each mode runs in a fresh context (its
config's sync_mode), where ranks take different numbers of steps as
stragglers would. The session context's own syncs (allreduce mode: every
rank in every group) come after.
"""
import asyncio
import socket
import time

import numpy as np
import pytest

import cohort


def fresh_context(ctx, **cfg):
    """A second context over the same ranks, with its own store (rank 0
    picks a free port and tells the others through the session context)."""
    port = np.zeros(1, np.int64)
    if ctx.rank == 0:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port[0] = s.getsockname()[1]
        s.close()
    ctx.broadcast(port, src=0)
    return cohort.Context(store="127.0.0.1:%d" % port[0], store_fd=-1, **cfg)


@pytest.mark.parametrize("mode", ["allreduce", "partial", "selective", "relay"])
def test_sync_groups(ctx, rank, size, mode):
    with fresh_context(ctx, sync_mode=mode) as c:
        members = relayed = full = 0
        for it in range(3 + rank):  # rank r takes 3 + r steps
            a = np.full(16, float(rank + 1), np.float32)
            res = c.sync(a, iteration=it, weight=1.0)
            members, relayed, full = members + res.size, relayed + res.relayed, full + res.full
            assert res.type == "sync"
            assert rank in res.members and res.size == len(res.members) >= 1
            assert res.wait_us >= 0 and res.comm_us >= 0 and res.total_weight > 0
            if mode in ("allreduce", "relay") and it < 3:  # before anyone left: everyone
                assert sorted(res.members) == list(range(size)) and res.full
            # The relay fields: empty / zero unless the group was a relay group.
            assert res.nrelays == len(res.relays) and res.nexcluded >= 0
            assert res.phase2_method in (0, 1, 2)
            if mode == "relay":
                assert set(res.relays) <= set(range(size))
                assert res.relayed == (rank in res.relays)
                assert res.phase2 + res.nexcluded == res.nrelays
            else:
                assert res.relays == [] and not res.relayed and res.phase2 == 0
            want = np.mean([m + 1 for m in res.members])
            np.testing.assert_allclose(a, want, rtol=1e-6)
        # cohort.stats() sums what the results said (coh_ctx_stats' sync counters)
        st = c.stats()
        assert st["syncs"] == 3 + rank and st["sync_members"] == members, st
        assert st["sync_relayed"] == relayed and st["sync_full"] == full, st
        assert st["sync_wait_us"] >= 0 and st["sync_comm_us"] >= 0 and st["ranks_failed"] == 0
        c.sync_leave()  # no group waits for a rank that is done
        c.barrier()  # the coordinator (rank 0) stays until everyone is done


def test_sync_weights(ctx, rank, size):
    a = np.full(5, float(rank), np.float64)
    res = cohort.sync(a, iteration=10, weight=float(rank + 1), mode="allreduce")
    w = {m: m + 1.0 for m in res.members}
    want = sum(m * w[m] for m in res.members) / sum(w.values())
    np.testing.assert_allclose(a, want, rtol=1e-12)
    assert res.total_weight == pytest.approx(sum(w.values()))


def test_sync_async_and_asyncio(ctx, rank, size):
    w = cohort.sync(np.ones(4, np.float32), iteration=20, mode="allreduce", async_op=True)
    assert rank in w.wait().members

    async def main():
        a = np.full(4, float(rank), np.float32)
        res = await cohort.sync(a, iteration=21, mode="allreduce", async_op=True)
        assert rank in res.members
        np.testing.assert_allclose(a, np.mean(res.members))

    asyncio.run(main())


def test_sync_inline_through_the_abi(ctx, rank, size):
    r = ctx.call({"type": "sync", "dtype": "f64", "iteration": 30, "mode": "allreduce",
                  "buf": np.float64([rank]).tobytes()})
    g = r["group"]
    assert sorted(g["members"]) == list(range(size)) and g["size"] == size
    assert set(g) >= {"members", "size", "wait_us", "comm_us", "full", "total_weight", "group_id"}
    assert np.frombuffer(r["buf"], np.float64)[0] == pytest.approx(np.mean(range(size)))


INT_OPS = ["sum", "prod", "min", "max", "avg"]


def relay_data(r, n, dt):
    x = (np.arange(n) % 7) - 3 + r  # negative and positive, small: no product overflows
    return x.astype(dt)


@pytest.mark.parametrize("dt", [np.int32, np.int64])
def test_relay_allreduce_equals_allreduce(ctx, rank, size, dt):
    """A relay allreduce (late ranks relay, folded in by phase 2) gives
    exactly what a plain allreduce gives on integer data, and its Result
    describes the group: everyone, full. It runs before
    test_sync_leave_and_come_back: a rank that left is not scheduled again
    until it syncs."""
    n = 1000
    for it, op in enumerate(INT_OPS):
        plain = relay_data(rank, n, dt)
        cohort.allreduce(plain, op=op)
        relay = relay_data(rank, n, dt)
        if it % 2 and rank == size - 1 and size > 1:
            # Late: the others may start with this rank relaying. Not much
            # later: past its fault deadline (5 x the time from the first
            # READY to the end of phase 1, a few ms here) it is excluded.
            time.sleep(0.01)
        res = cohort.allreduce(relay, op=op, algo="relay", iteration=it)
        np.testing.assert_array_equal(relay, plain)
        assert res.type == "allreduce"
        assert res.size == size and sorted(res.members) == list(range(size)) and res.full
        assert res.rank == rank and res.group_id is not None
        assert res.wait_us >= 0 and res.comm_us >= 0
        assert res.nrelays == len(res.relays) and res.nexcluded == 0
        assert res.relayed == (rank in res.relays)
        assert res.phase2 == res.nrelays
        assert res.phase2_method in ((0,) if res.nrelays == 0 else (1, 2))
    # A plain allreduce's Result has no scheduler group.
    res = cohort.allreduce(np.zeros(4, dt), algo="default")
    assert res.group_id is None and res.relays is None and res.nrelays is None


def test_relay_allreduce_async_and_inline(ctx, rank, size):
    a = np.full(8, rank + 1, np.int64)
    w = cohort.allreduce(a, algo="relay", async_op=True)
    res = w.wait()
    assert (a == size * (size + 1) // 2).all() and res.full and res.size == size
    # Through the ABI: inline out of place, the result comes back as recv.
    r = ctx.call({"type": "allreduce", "dtype": "i32", "op": "max", "algo": "relay",
                  "iteration": 7, "send": np.int32([rank, -rank]).tobytes()})
    assert list(np.frombuffer(r["recv"], np.int32)) == [size - 1, 0]
    g = r["group"]
    assert g["size"] == size and g["full"] and sorted(g["members"]) == list(range(size))
    assert set(g) >= {"relays", "relayed", "phase2", "phase2_method", "nexcluded", "group_id"}


def test_sync_leave_and_come_back(ctx, rank, size):
    cohort.sync_leave()
    ctx.barrier()  # everyone has left
    # Each comes back with its next sync; who is back when a group forms
    # depends on arrival order, so the group holds this rank and some others.
    a = np.full(3, float(rank), np.float32)
    res = cohort.sync(a, iteration=40, mode="allreduce")
    assert rank in res.members and set(res.members) <= set(range(size))
    np.testing.assert_allclose(a, np.mean(res.members))
    cohort.sync_leave()  # so that no rank still syncing waits for this one
    ctx.barrier()

