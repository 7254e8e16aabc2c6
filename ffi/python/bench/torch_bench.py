"""DDP step time and dist.all_reduce on the "cohort" backend vs "gloo", side by
side in one job (the machine is shared and noisy: ratios of the same run).

    cohortrun -n 4 -- python3 ffi/python/bench/torch_bench.py [--steps 50] [--reps 5]

The default group is cohort's; a gloo group over the same ranks is created
beside it. For each model (a small MLP, 0.02 MB of parameters, and a 4.5 MB
one) the two DDPs alternate steps, so both see the same machine; then the
all_reduce of 25M float32 (100 MB) alternates between the groups. Rank 0
prints one line per measurement and the ratio gloo / cohort (above 1:
cohort faster).
"""
import argparse
import statistics
import sys
import time

import torch
import torch.distributed as dist

import cohort.torch  # noqa: F401 - registers the backend


def mlp(width, depth, inp=32, out=10):
    layers, d = [], inp
    for _ in range(depth):
        layers += [torch.nn.Linear(d, width), torch.nn.ReLU()]
        d = width
    layers.append(torch.nn.Linear(d, out))
    return torch.nn.Sequential(*layers)


def nbytes(m):
    return sum(p.numel() * p.element_size() for p in m.parameters())


def ddp_steps(models, opts, steps, batch, inp):
    """Alternating steps of each DDP; per-backend list of step times (s)."""
    times = {k: [] for k in models}
    for s in range(steps):
        x = torch.randn(batch, inp)
        y = torch.randint(0, 10, (batch,))
        for k, m in models.items():
            t0 = time.perf_counter()
            opts[k].zero_grad()
            torch.nn.functional.cross_entropy(m(x), y).backward()
            opts[k].step()
            times[k].append(time.perf_counter() - t0)
    return times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--reps", type=int, default=5, help="all_reduce repetitions per backend")
    ap.add_argument("--floats", type=int, default=25_000_000)
    a = ap.parse_args()
    torch.set_num_threads(1)  # 2 cores shared by all ranks: no intra-op threads
    dist.init_process_group("cohort")
    r, n = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    from torch.nn.parallel import DistributedDataParallel as DDP

    def say(*args):
        if r == 0:
            print(*args, flush=True)

    say("ranks %d, torch %s, %d DDP steps per model per backend (median step ms)" % (
        n, torch.__version__, a.steps))
    for name, (width, depth) in (("small", (64, 2)), ("4.5MB", (600, 4))):
        torch.manual_seed(0)
        base = mlp(width, depth)
        models = {}
        for k, pg in (("cohort", None), ("gloo", gloo)):
            m = mlp(width, depth)
            m.load_state_dict(base.state_dict())
            models[k] = DDP(m, process_group=pg)
        opts = {k: torch.optim.SGD(m.parameters(), lr=0.01) for k, m in models.items()}
        ddp_steps(models, opts, 5, 32, 32)  # warm-up
        times = ddp_steps(models, opts, a.steps, 32, 32)
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        say("ddp %-6s %.2f MB  cohort %.2f ms  gloo %.2f ms  gloo/cohort %.2fx" % (
            name, nbytes(base) / 1e6, med["cohort"], med["gloo"], med["gloo"] / med["cohort"]))
    buf = torch.ones(a.floats)
    res = {"cohort": [], "gloo": []}
    for k, pg in (("cohort", None), ("gloo", gloo)):  # warm-up
        dist.all_reduce(buf, group=pg)
    for _ in range(a.reps):
        for k, pg in (("cohort", None), ("gloo", gloo)):
            dist.barrier(group=pg)
            t0 = time.perf_counter()
            dist.all_reduce(buf, group=pg)
            res[k].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in res.items()}
    mb = a.floats * 4 / 1e6
    say("all_reduce %d floats (%.0f MB)  cohort %.1f ms (%.0f MB/s)  gloo %.1f ms (%.0f MB/s)  "
        "gloo/cohort %.2fx" % (a.floats, mb, med["cohort"] * 1e3, mb / med["cohort"],
                               med["gloo"] * 1e3, mb / med["gloo"], med["gloo"] / med["cohort"]))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
