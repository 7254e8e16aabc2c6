"""The same MLP trained three ways on the "cohort" backend with one injected
straggler: DDP (every step averages gradients over every rank), and
cohort.torch.PartialSync in partial and selective mode (every step averages
parameters with the group the scheduler forms). Prints the time until every
rank's model reaches the target validation loss.

    cohortrun -n 4 -- python3 examples/torch_partial.py --mode selective
    examples/torch_partial.sh            # the three modes, one after another

The task: a random "teacher" MLP labels Gaussian inputs; every rank draws
its own batches, and checks its own model on a fixed validation set every
few steps. Rank N-1 sleeps --straggler-ms each step (a slower GPU, a busy
host). A rank stops when its model reaches --target (or at --budget s) and
leaves the sync schedule, so no group waits for it.
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ffi",
                                "python"))
import cohort.torch  # noqa: E402 - registers the backend


def net(seed, width=128):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, width), torch.nn.ReLU(),
                               torch.nn.Linear(width, width), torch.nn.ReLU(),
                               torch.nn.Linear(width, 10))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=["ddp", "partial", "selective"], default="selective")
    ap.add_argument("--target", type=float, default=0.5, help="validation loss to reach")
    ap.add_argument("--budget", type=float, default=30.0, help="seconds at most")
    ap.add_argument("--straggler-ms", type=float, default=50.0)
    ap.add_argument("--eval-every", type=int, default=10, help="steps between checks")
    a = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("cohort")
    r, n = dist.get_rank(), dist.get_world_size()

    teacher = net(1234, 64)
    g = torch.Generator().manual_seed(4321)
    xv = torch.randn(2000, 32, generator=g)
    with torch.no_grad():
        yv = teacher(xv).argmax(1)
    model = net(0)  # the same start on every rank
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if a.mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        train = DDP(model)
        ps = None
    else:
        train = model
        ps = cohort.torch.PartialSync(model, opt, mode=a.mode)
    data = torch.Generator().manual_seed(100 + r)
    slow = r == n - 1 and n > 1
    steps, reached, loss_v = 0, None, float("nan")
    t0 = time.monotonic()
    while time.monotonic() - t0 < a.budget:
        x = torch.randn(32, 32, generator=data)
        with torch.no_grad():
            y = teacher(x).argmax(1)
        if slow:
            time.sleep(a.straggler_ms / 1000)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(train(x), y).backward()
        opt.step()
        if ps:
            ps.step()
        steps += 1
        if steps % a.eval_every == 0:
            with torch.no_grad():
                loss_v = torch.nn.functional.cross_entropy(model(xv), yv).item()
            done = loss_v <= a.target
            if a.mode == "ddp":  # every rank holds the same model: stop together
                flag = torch.tensor([1 if done else 0], dtype=torch.int32)
                dist.all_reduce(flag, op=dist.ReduceOp.MIN)
                done = bool(flag.item())
            if done:
                reached = time.monotonic() - t0
                break
    if ps:
        ps.leave()
    out = torch.tensor([reached if reached is not None else float("inf"), float(steps), loss_v,
                        (ps.wait_us / 1e3) if ps else 0.0, float(ps.syncs if ps else steps)],
                       dtype=torch.float64)
    rows = [torch.zeros_like(out) for _ in range(n)]
    dist.all_gather(rows, out)
    if r == 0:
        for k, row in enumerate(rows):
            t, s, lv, w, ns = row.tolist()
            print("rank %d%s: %s, %d steps, val loss %.3f, %d syncs, waited %.0f ms" % (
                k, " (straggler)" if k == n - 1 and n > 1 else "",
                "target at %.2f s" % t if t != float("inf") else "no target in %.0f s" % a.budget,
                s, lv, ns, w))
        worst = max(row[0].item() for row in rows)
        print("RESULT mode=%s ranks=%d straggler_ms=%g target=%g time_to_target_s=%s" % (
            a.mode, n, a.straggler_ms, a.target,
            "%.2f" % worst if worst != float("inf") else "inf"), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
