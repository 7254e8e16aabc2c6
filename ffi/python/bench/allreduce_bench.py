#!/usr/bin/python3
"""Python allreduce through the msgpack ABI, for comparison with the same
call from C (cohort-ffi-bench). Run both with bench/ffi_bench.sh, or:

    COHORT_LIBRARY=build/lib/libcohort.so PYTHONPATH=ffi/python \
        build/bin/cohortrun -n 2 -- /usr/bin/python3 ffi/python/bench/allreduce_bench.py

Per size: rounds of blocking cohort.allreduce(arr) (in place, float32), the
same number of ops on every rank (rank 0's estimate, broadcast), the median
round reported. Also: the cost of the Python side alone (checks, msgpack
encode and decode, no library call) and of an async submission.
"""
import argparse
import statistics
import time

import msgpack
import numpy as np

import cohort


def per_op(fn, iters):
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-s", "--sizes", default="4K,64M")
    ap.add_argument("-r", "--rounds", type=int, default=7)
    ap.add_argument("-t", "--round-seconds", type=float, default=0.5)
    args = ap.parse_args()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    sizes = [int(s[:-1]) * mult[s[-1]] if s[-1] in mult else int(s) for s in args.sizes.split(",")]

    ctx = cohort.init()
    rank, size = ctx.rank, ctx.size
    say = print if rank == 0 else (lambda *a, **k: None)
    say("# python allreduce_bench: world of %d, %d rounds; medians" % (size, args.rounds))

    # The Python side alone: what cohort.allreduce does around the call.
    a = np.zeros(1024, np.float32)
    resp = msgpack.packb({"v": 1, "status": 0, "code": "OK", "type": "allreduce", "done": True,
                          "time_us": 1.0, "abi_us": 1.0, "group": {"rank": 0, "size": size}})

    def python_only():
        t = cohort._core._tensor(a, "allreduce", "array")
        req = {"type": "allreduce", "dtype": cohort._core._dtype_of(a, None, "allreduce"),
               "op": cohort._core._op("sum", "allreduce"), "buf": t, "timeout_ms": 1000}
        msgpack.packb(req)
        cohort.Result(msgpack.unpackb(resp, raw=False))

    py = statistics.median(per_op(python_only, 20000) for _ in range(args.rounds))
    say("python side only (checks + msgpack encode/decode + Result): %.2f us" % py)

    # An async submission (the wait untimed).
    sub = []
    for _ in range(args.rounds):
        t = 0.0
        for _ in range(500):
            t0 = time.perf_counter()
            w = ctx.allreduce(a, async_op=True)
            t += time.perf_counter() - t0
            w.wait()
        sub.append(t / 500 * 1e6)
    say("async submit of a 4 KiB allreduce from python: %.2f us" % statistics.median(sub))

    for nbytes in sizes:
        arr = np.zeros(nbytes // 4, np.float32)
        ctx.allreduce(arr)
        t0 = time.perf_counter()
        for _ in range(3):
            ctx.allreduce(arr)
        est = (time.perf_counter() - t0) / 3
        n = np.array([max(3, int(args.round_seconds / max(est, 1e-6)))], np.int64)
        ctx.broadcast(n, src=0)
        iters = int(n[0])
        rounds = [per_op(lambda: ctx.allreduce(arr), iters) for _ in range(args.rounds)]
        say("python allreduce %9d B: %10.2f us/op, %d ops/round" % (
            nbytes, statistics.median(rounds), iters))
    ctx.finalize()


if __name__ == "__main__":
    main()
