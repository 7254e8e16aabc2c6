#!/usr/bin/env python3
"""torch-bench: torch.distributed allreduce measured the way cohort-bench measures cohort.

    python3 bench/peers/torch_bench.py --backend gloo --device cuda -n 2 -b 4K -e 256M -f 4

It spawns N processes itself (torch.multiprocessing, file:// rendezvous in a temp dir),
each on cuda:0 for --device cuda (several processes on one GPU, as the GPU issue's
benchmark asks), or on host tensors for --device cpu. Timing follows bench/peers: warm-up
and timed iterations back to back (no barrier), per-iteration time (after the op's
completion is seen: torch.cuda.synchronize for device tensors), max over ranks, median over
iterations; float sum, in place; busbw = bytes/time * 2(n-1)/n. Rank 0 prints
cohort-bench's CSV: op,bytes,count,dtype,nranks,time_us,algbw_GBps,busbw_GBps.

With -c 1 each size's result is checked once (element i of rank r is (r+1)*(i%7+1), so
the sum is n(n+1)/2*(i%7+1), exact in float).

A backend that refuses the setup (NCCL with several ranks on one GPU: "Duplicate GPU
detected") prints 'error,BACKEND,MESSAGE' and exits 3: that is a result, not a crash.
"""
import argparse
import os
import sys
import tempfile
import time


def parse_size(s):
    s = s.strip().upper()
    mult = 1
    for suf, m in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30)):
        if s.endswith(suf):
            s, mult = s[:-1], m
            break
    return int(s) * mult


def worker(rank, args, store):
    import torch
    import torch.distributed as dist

    n = args.nranks
    dev = torch.device("cuda:0") if args.device == "cuda" else torch.device("cpu")
    if args.device == "cuda":
        torch.cuda.set_device(0)
    init = "file://" + store
    try:
        dist.init_process_group(args.backend, init_method=init, rank=rank, world_size=n)
        # Statistics go through a CPU group of their own so that they never
        # disturb the backend measured.
        stats = dist.new_group(backend="gloo")
        sync = (lambda: torch.cuda.synchronize()) if args.device == "cuda" else (lambda: None)
        if rank == 0:
            print("op,bytes,count,dtype,nranks,time_us,algbw_GBps,busbw_GBps", flush=True)
            print("# torch %s, backend %s, %s tensors, %d ranks, %d iterations (median), %d warm-up"
                  % (torch.__version__, args.backend, args.device, n, args.iters, args.warmup),
                  flush=True)
        size = args.min
        while size <= args.max:
            count = size // 4
            t = torch.empty(count, dtype=torch.float32, device=dev)
            if args.check:
                pat = (torch.arange(count, device=dev) % 7 + 1).to(torch.float32)
                t.copy_(pat * (rank + 1))
                dist.all_reduce(t)
                sync()
                want = pat * (n * (n + 1) // 2)
                bad = int((t != want).sum().item())
                if bad:
                    print("torch-bench rank %d: %d wrong elements at %d bytes" % (rank, bad, size),
                          file=sys.stderr, flush=True)
                    sys.exit(1)
            t.fill_(1.0)
            for _ in range(args.warmup):
                dist.all_reduce(t)
            sync()
            times = []
            for _ in range(args.iters):
                t0 = time.perf_counter()
                dist.all_reduce(t)
                sync()
                times.append((time.perf_counter() - t0) * 1e6)
            allt = [None] * n
            dist.all_gather_object(allt, times, group=stats)
            if rank == 0:
                per = sorted(max(ts[k] for ts in allt) for k in range(args.iters))
                med = per[len(per) // 2] if len(per) % 2 else (per[len(per) // 2 - 1] + per[len(per) // 2]) / 2
                algbw = size / med / 1e3
                busbw = algbw * 2 * (n - 1) / n
                print("allreduce,%d,%d,float,%d,%.2f,%.4f,%.4f" % (size, count, n, med, algbw, busbw),
                      flush=True)
            size *= args.factor
        dist.barrier(group=stats)
        dist.destroy_process_group()
    except Exception as e:  # a backend's refusal is the result to report
        msg = str(e).replace("\n", " ")[:400]
        if rank == 0:
            print("error,%s,%s" % (args.backend, msg), flush=True)
        os._exit(3)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="gloo", choices=["gloo", "nccl", "mpi"])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("-n", "--nranks", type=int, default=2)
    p.add_argument("-b", dest="min", default="4K")
    p.add_argument("-e", dest="max", default="256M")
    p.add_argument("-f", dest="factor", type=int, default=4)
    p.add_argument("--iters", "-i", type=int, default=20)
    p.add_argument("-w", dest="warmup", type=int, default=5)
    p.add_argument("-c", dest="check", type=int, default=1)
    args = p.parse_args()
    args.min, args.max = parse_size(args.min), parse_size(args.max)
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as d:
        store = os.path.join(d, "store")
        ctx = mp.start_processes(worker, args=(args, store), nprocs=args.nranks, join=False,
                                 start_method="spawn")
        while not ctx.join():
            pass
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:
        # a worker's exit 3 (a refused backend) surfaces as ProcessExitedException
        code = getattr(e, "exit_code", 1)
        sys.exit(code if code else 1)
