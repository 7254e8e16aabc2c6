"""async_op=True futures (torch.distributed's Work) and asyncio through the
completion fd."""
import asyncio
import os
import select
import time

import numpy as np
import pytest

import cohort


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
