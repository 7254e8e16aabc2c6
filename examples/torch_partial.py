"""The same MLP trained three ways on the "cohort" backend with one injected
straggler: DDP (every step averages gradients over every rank), and
cohort.torch.PartialSync in partial and selective mode (every step averages
parameters with the group the scheduler forms). Prints the time until every
rank's model reaches the target validation loss.

    cohortrun -n 4 -- python3 examples/torch_partial.py --mode selective
    examples/torch_partial.sh            # the three modes, one after another

The task: a random "teacher" MLP labels Gaussian inputs; every rank draws
its own batches. Every few steps rank 0 checks its model on a fixed
validation set; when it reaches --target (or at --budget s) every rank
stops, leaves the sync schedule and the ranks' models are averaged once
(the model a job would keep; its loss is printed too). Rank N-1 sleeps
--straggler-ms each step (a slower GPU, a busy host).
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
    store = dist.distributed_c10d._get_default_store()
    stop_key = "torch_partial/stop"

    def val_loss():
        with torch.no_grad():
            return torch.nn.functional.cross_entropy(model(xv), yv).item()

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
        if steps % a.eval_every:
            continue
        # Rank 0's model decides (the one a job would checkpoint). DDP ranks
        # step in lockstep: they hear it through a broadcast; the partial
        # ranks, each at its own pace, through torch's store.
        done = False
        if r == 0:
            loss_v = val_loss()
            done = loss_v <= a.target
        if a.mode == "ddp":
            flag = torch.tensor([int(done)], dtype=torch.int32)
            dist.broadcast(flag, 0)
            done = bool(flag.item())
        elif r == 0 and done:
            store.add(stop_key, 1)
        elif r != 0:
            done = store.add(stop_key, 0) > 0  # a read: add 0
        if done:
            reached = time.monotonic() - t0
            break
    if ps:
        ps.leave()
        ps.average()  # the model a job would keep: every rank's, averaged
    avg_loss = val_loss()
    out = torch.tensor([reached if reached is not None else float("inf"), float(steps),
                        (ps.wait_us / 1e3) if ps else 0.0, float(ps.syncs if ps else steps),
                        ps.comm_us / 1e3 if ps else 0.0], dtype=torch.float64)
    rows = [torch.zeros_like(out) for _ in range(n)]
    dist.all_gather(rows, out)
    if r == 0:
        for k, row in enumerate(rows):
            t, s, w, ns, c = row.tolist()
            print("rank %d%s: %d steps, %d syncs, waited %.0f ms for groups, %.0f ms in them" % (
                k, " (straggler)" if k == n - 1 and n > 1 else "", s, ns, w, c))
        print("RESULT mode=%s ranks=%d straggler_ms=%g target=%g time_to_target_s=%s "
              "steps_rank0=%d final_avg_val_loss=%.3f" % (
                  a.mode, n, a.straggler_ms, a.target,
                  "%.2f" % reached if reached is not None else "inf", steps, avg_loss),
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
