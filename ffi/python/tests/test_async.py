"""async_op=True futures (torch.distributed's Work) and asyncio through the
completion fd."""
import asyncio
import os
import queue
import select
import socket
import threading
import time
import weakref

import numpy as np
import pytest

import cohort
from cohort import _core


def test_future_wait(ctx, rank, size):
    a = np.full(1000, rank + 1, np.float64)
    w = cohort.allreduce(a, async_op=True)
    assert isinstance(w, cohort.Work)
    res = w.wait()
    assert w.is_completed() and w.done()
    assert res.type == "allreduce" and res.size == size
    assert np.all(a == size * (size + 1) / 2)
    # wait again: the same result, no second trip to the library
    assert w.wait().time_us == res.time_us
    assert w.result().type == "allreduce"
    assert w.exception() is None


def test_many_in_flight(ctx, rank, size):
    arrs = [np.full(64 + i, rank + i, np.int64) for i in range(32)]
    works = [cohort.allreduce(a, async_op=True) for a in arrs]
    works.append(cohort.barrier(async_op=True))
    bufs = [np.full(7, rank, np.int32) for _ in range(4)]
    works += [cohort.broadcast(b, src=i % size, async_op=True) for i, b in enumerate(bufs)]
    for w in reversed(works):  # any order
        w.wait()
    for i, a in enumerate(arrs):
        assert np.all(a == sum(r + i for r in range(size)))
    for i, b in enumerate(bufs):
        assert np.all(b == i % size)
    assert not ctx._pending  # every Work let go of its arrays


def test_is_completed_polling(ctx, rank, size):
    a = np.ones(1 << 16, np.float32)
    w = cohort.allreduce(a, async_op=True)
    deadline = time.time() + 30
    while not w.is_completed():
        assert time.time() < deadline
        time.sleep(0.0005)
    assert np.all(a == size)


def test_every_collective_async(ctx, rank, size):
    out = np.zeros(3 * size, np.float32)
    inp = np.full(3, rank, np.float32)
    rs = np.zeros(2, np.float32)
    full = np.ones(2 * size, np.float32)
    ws = [cohort.allgather(out, inp, async_op=True),
          cohort.reduce_scatter(rs, full, async_op=True)]
    for w in ws:
        w.wait()
    assert np.all(out == np.repeat(np.arange(size), 3))
    assert np.all(rs == size)


def test_event_fd(ctx, rank, size):
    fd = ctx.event_fd
    assert fd >= 0 and fd == ctx.event_fd
    ctx.call({"type": "event_clear"})
    a = np.ones(8, np.float32)
    w = cohort.allreduce(a, async_op=True)
    r, _, _ = select.select([fd], [], [], 30)
    assert r == [fd]  # readable once the request completed
    w.wait()


def test_asyncio(ctx, rank, size):
    async def main():
        a = np.full(4, rank, np.float64)
        res = await cohort.allreduce(a, async_op=True)
        assert res.type == "allreduce"
        assert np.all(a == sum(range(size)))
        arrs = [np.full(100, i, np.float32) for i in range(16)]
        works = [cohort.allreduce(x, op="max", async_op=True) for x in arrs]
        results = await asyncio.gather(*works)
        assert len(results) == 16
        for i, x in enumerate(arrs):
            assert np.all(x == i)
        await cohort.barrier(async_op=True)
        # Other coroutines run while a collective is in flight: rank 0 awaits
        # a barrier that the others join 0.2 s late.
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.001)

        t = asyncio.ensure_future(ticker())
        await asyncio.sleep(0)
        before = ticks
        if rank != 0:
            time.sleep(0.2)
        await cohort.barrier(async_op=True)
        t.cancel()
        if rank == 0 and size > 1:
            assert ticks > before + 10
        big = np.ones(4 << 20, np.float32)
        await cohort.allreduce(big, async_op=True)
        assert np.all(big == size)

    asyncio.run(main())


def test_asyncio_error_propagates(ctx, rank, size):
    async def main():
        # refused at submission, before any future exists
        with pytest.raises(cohort.DtypeError):
            cohort.allreduce(np.ones(2, np.int8), async_op=True)
        if size > 1:
            # ranks disagree on the count: the request fails on every rank,
            # and the failure comes out of the await
            w = cohort.allreduce(np.ones(4 + rank, np.float32), async_op=True)
            with pytest.raises(cohort.MismatchError):
                await w
            with pytest.raises(cohort.MismatchError):
                w.wait()  # and stays the request's outcome
            assert isinstance(w.exception(), cohort.MismatchError)
        # the context is still usable afterwards
        a = np.ones(3, np.float32)
        await cohort.allreduce(a, async_op=True)
        assert np.all(a == size)

    asyncio.run(main())


@pytest.mark.skipif(os.environ.get("COHORT_WORLD_SIZE", "1") == "1",
                    reason="needs a peer that arrives late")
def test_wait_timeout(ctx, rank, size):
    if rank != 0:
        time.sleep(0.5)  # arrive late
    w = cohort.barrier(async_op=True)
    if rank == 0:
        with pytest.raises(cohort.TimeoutError):
            w.wait(timeout=0.05)  # the others are still sleeping
        assert not w.is_completed()
    w.wait()  # and then it completes
    assert w.is_completed()


def drain(ctx, seconds=30):
    """Let the context drop what completed (it does so by itself as more
    requests are submitted; the tests want it now)."""
    deadline = time.time() + seconds
    while ctx._pending and time.time() < deadline:
        ctx._prune()
        time.sleep(0.005)
    return len(ctx._pending)


def test_fire_and_forget_is_bounded(ctx, rank, size):
    """Async ops nobody waits for are dropped (with their arrays) once they
    completed instead of piling up until finalize; a Work the caller holds
    still gives its outcome, and every result is right."""
    n = 2000
    most = 0
    unheld = []   # weak references to arrays whose Work nobody holds
    sampled = []  # (i, array, weak reference to its Work)
    held = []     # (i, array, Work) kept by the caller
    for i in range(n):
        a = np.full(256, rank + i % 7, np.float32)
        w = cohort.allreduce(a, async_op=True)
        if i % 100 == 0:
            held.append((i, a, w))
        elif i % 100 == 50:
            sampled.append((i, a, weakref.ref(w)))
        else:
            unheld.append(weakref.ref(a))
        del a, w
        most = max(most, len(ctx._pending))
        if i % 50 == 49:
            ctx.barrier()  # the ranks stay in step whatever the scheduling
    ctx.barrier()
    assert most < n // 4, "the context tracked %d of %d finished requests" % (most, n)
    assert sum(r() is not None for r in unheld) < n // 4
    for i, a, w in held:
        assert w.wait().type == "allreduce"
        assert np.all(a == size * (i % 7) + size * (size - 1) / 2), i
    for i, a, wref in sampled:
        w = wref()
        if w is not None:
            w.wait()
        assert np.all(a == size * (i % 7) + size * (size - 1) / 2), i
    del held, sampled
    assert drain(ctx) == 0
    assert all(r() is None for r in unheld)


def test_unheld_work_keeps_its_array_until_complete(ctx, rank, size):
    """An op nobody holds keeps its array alive while the library may still
    write into it (rank 0's op cannot complete before the others join, 1 s
    later), through prunes, and lets go of it once it completed."""
    ctx.barrier()
    t0 = time.monotonic()
    if rank != 0:
        time.sleep(1.0)
    a = np.full(1 << 14, 1.0, np.float32)
    ref = weakref.ref(a)
    cohort.allreduce(a, async_op=True)
    del a
    for _ in range(3 * _core._PRUNE_MIN):  # past the pruning threshold, more than once
        cohort.allreduce(np.ones(16, np.float32), async_op=True)
    if rank == 0 and size > 1 and time.monotonic() - t0 < 0.8:
        assert ref() is not None, "freed while the library may still write into it"
    ctx.barrier()
    assert drain(ctx) == 0
    assert ref() is None


def test_waiters_and_pruning_threads(ctx, rank, size):
    """A thread waits on the Works it was handed while this one submits ops
    nobody waits for (and prunes): every Work gives its own outcome once."""
    todo, errors = queue.Queue(), []

    def waiter():
        while True:
            item = todo.get()
            if item is None:
                return
            i, a, w = item
            try:
                w.wait()
                if not np.all(a == size * i + size * (size - 1) / 2):
                    errors.append("wrong result %d" % i)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(repr(e))

    t = threading.Thread(target=waiter)
    t.start()
    try:
        for i in range(600):
            a = np.full(64, rank + i, np.float64)
            w = cohort.allreduce(a, async_op=True)
            if i % 3 == 0:
                todo.put((i, a, w))
    finally:
        todo.put(None)
        t.join(120)
    assert not t.is_alive() and not errors, errors[:5]
    ctx.barrier()
    assert drain(ctx) == 0


def pair(nics="lo", **cfg):
    """A world of two contexts in this process, one thread per rank."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    made, failed = [None, None], []

    def make(r):
        try:
            made[r] = cohort.Context(rank=r, world_size=2, store="127.0.0.1:%d" % port,
                                     store_fd=-1, nics=nics, **cfg)
        except Exception as e:  # noqa: BLE001 - raised below
            failed.append(e)

    ts = [threading.Thread(target=make, args=(r,)) for r in (0, 1)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    if failed:
        for c in made:
            if c is not None:
                c.finalize()
        raise failed[0]
    return made


@pytest.mark.parametrize("where", ["loop", "thread"])
def test_asyncio_await_across_finalize(where):
    """A coroutine awaiting a request whose context is finalized (in the loop
    or in another thread) gets the cancellation instead of waiting forever;
    the event fd is then refused."""
    c0, c1 = pair(timeout_ms=1000)
    try:
        async def wait_for_it(w):
            return await w

        async def main():
            assert c0.event_fd >= 0
            w = c0.barrier(async_op=True)  # c1 never joins
            awaiting = asyncio.ensure_future(wait_for_it(w))
            await asyncio.sleep(0.05)
            assert not awaiting.done()
            if where == "loop":
                c0.finalize()
            else:
                await asyncio.get_running_loop().run_in_executor(None, c0.finalize)
            with pytest.raises((cohort.CanceledError, cohort.TimeoutError)):
                await asyncio.wait_for(awaiting, 20)
            with pytest.raises(cohort.StateError):
                c0.event_fd

        asyncio.run(main())
    finally:
        c0.finalize()
        c1.finalize()
