"""One rank of a torch.distributed job on the "cohort" backend, started by
test_c10d_launch.py under cohortrun or torchrun (not collected by pytest).

    c10d_worker.py calls   every dist.* call, sync and async, every dtype
    c10d_worker.py ddp     DDP on cohort vs DDP on gloo, same seed, 100 steps
    c10d_worker.py raise   rank 1 raises mid-training; the others must get a
                           RuntimeError carrying cohort's text
    c10d_worker.py partial PartialSync with a straggler (rank size-1)
    c10d_worker.py timeout a 2 s group timeout: rank 1 comes 6 s late (alive);
                           rank 0's op fails with ETIMEDOUT after ~2 s

Prints "PASS <mode> ..." on success; any failure raises (exit status 1).
"""
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import cohort.torch  # noqa: E402,F401 - registers the backend

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64,
          torch.uint8]


def init(timeout_s=1800):
    dist.init_process_group("cohort", timeout=timedelta(seconds=timeout_s))
    return dist.get_rank(), dist.get_world_size()


def check_calls(r, n):
    """Every call the issue names, sync and async, on every dtype."""
    pg = dist.distributed_c10d._get_default_group()
    assert cohort.torch._c10d.timeout(pg).total_seconds() == 1800  # the group's, torch's default
    for dt in DTYPES:
        for async_op in (False, True):
            t = torch.full((1000,), r + 1, dtype=dt)
            w = dist.all_reduce(t, async_op=async_op)
            if async_op:
                assert w.wait()
                assert w.is_completed()  # wait() raised if it failed
                assert w.result()[0].data_ptr() == t.data_ptr()
            want = n * (n + 1) // 2
            assert torch.all(t == want), (dt, t[:4])

            b = torch.arange(17, dtype=torch.int64).to(dt) if r == 1 % n else torch.zeros(17, dtype=dt)
            w = dist.broadcast(b, src=1 % n, async_op=async_op)
            if async_op:
                w.wait()
            assert torch.equal(b, torch.arange(17, dtype=torch.int64).to(dt)), (dt, b)

            outs = [torch.zeros(5, dtype=dt) for _ in range(n)]
            w = dist.all_gather(outs, torch.full((5,), r, dtype=dt), async_op=async_op)
            if async_op:
                w.wait()
            for k in range(n):
                assert torch.all(outs[k] == k), (dt, k, outs[k])

            big = torch.zeros(3 * n, dtype=dt)
            w = dist.all_gather_into_tensor(big, torch.full((3,), r, dtype=dt), async_op=async_op) \
                if hasattr(dist, "all_gather_into_tensor") else \
                dist._all_gather_base(big, torch.full((3,), r, dtype=dt), async_op=async_op)
            if async_op:
                w.wait()
            assert torch.equal(big, torch.arange(n).repeat_interleave(3).to(dt)), (dt, big)

            out = torch.zeros(4, dtype=dt)
            ins = [torch.full((4,), k + r, dtype=dt) for k in range(n)]
            w = dist.reduce_scatter(out, ins, async_op=async_op)
            if async_op:
                w.wait()
            assert torch.all(out == n * r + n * (n - 1) // 2), (dt, out)

            w = dist.barrier(async_op=async_op)
            if async_op:
                w.wait()
    # ops
    for op, want in ((dist.ReduceOp.SUM, sum(range(1, n + 1))), (dist.ReduceOp.PRODUCT,
                     float(torch.arange(1, n + 1).prod())), (dist.ReduceOp.MIN, 1),
                     (dist.ReduceOp.MAX, n), (dist.ReduceOp.AVG, (n + 1) / 2)):
        t = torch.full((8,), float(r + 1), dtype=torch.float64)
        dist.all_reduce(t, op=op)
        assert torch.all(t == want), (op, t)
    flags = torch.tensor([r == 0, True, False])
    dist.all_reduce(flags)  # bool: SUM is a logical or
    assert flags.tolist() == [True, True, False], flags
    c = torch.full((3,), complex(r, 1))
    dist.all_reduce(c)
    assert torch.all(c == complex(n * (n - 1) / 2, n)), c
    # reduce, gather, scatter
    t = torch.full((4,), float(r + 1))
    dist.reduce(t, dst=0)
    assert torch.all(t == (n * (n + 1) / 2 if r == 0 else r + 1)), t
    g = [torch.zeros(2) for _ in range(n)] if r == 0 else None
    dist.gather(torch.full((2,), float(r)), g, dst=0)
    if r == 0:
        assert [x[0].item() for x in g] == list(range(n)), g
    s = torch.zeros(2)
    dist.scatter(s, [torch.full((2,), float(k)) for k in range(n)] if r == 0 else None, src=0)
    assert torch.all(s == r), s
    # a non-contiguous tensor, a dtype cohort lacks: RuntimeErrors with cohort's text
    for bad, what in ((torch.zeros(4, 4).t(), "contiguous"), (torch.zeros(4, dtype=torch.int8),
                                                              "not supported")):
        try:
            dist.all_reduce(bad)
        except RuntimeError as e:
            assert "cohort" in str(e) and what in str(e), e
        else:
            raise AssertionError("all_reduce of %s did not raise" % what)
    # new_group: every rank but the last; its members only
    if n > 1:
        members = list(range(n - 1))
        g = dist.new_group(members)
        if r in members:
            t = torch.full((3,), float(r + 1))
            dist.all_reduce(t, group=g)
            assert torch.all(t == sum(k + 1 for k in members)), t
            assert dist.get_world_size(g) == n - 1
        dist.barrier()
    # allreduce_coalesced (deprecated torch API, still DDP-reachable)
    ts = [torch.full((3,), float(r)), torch.full((2, 2), float(r + 1))]
    dist.all_reduce_coalesced(ts)
    assert torch.all(ts[0] == n * (n - 1) / 2) and torch.all(ts[1] == n * (n + 1) / 2), ts
    print("PASS calls rank %d of %d" % (r, n), flush=True)


def make_net(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                               torch.nn.ReLU(), torch.nn.Linear(64, 10))


def check_ddp(r, n, steps=100):
    """DDP on cohort and DDP on gloo from the same weights and data."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    gloo = dist.new_group(backend="gloo")
    models = {"cohort": DDP(make_net(0)), "gloo": DDP(make_net(0), process_group=gloo)}
    opts = {k: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for k, m in models.items()}
    for step in range(steps):
        g = torch.Generator().manual_seed(1000 * step + r)  # different data on every rank
        x = torch.randn(16, 32, generator=g)
        y = torch.randint(0, 10, (16,), generator=g)
        for k, m in models.items():
            opts[k].zero_grad()
            torch.nn.functional.cross_entropy(m(x), y).backward()
            opts[k].step()
    diff, bitwise = 0.0, True
    for p, q in zip(models["cohort"].parameters(), models["gloo"].parameters()):
        diff = max(diff, (p - q).abs().max().item())
        bitwise = bitwise and torch.equal(p, q)
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
    # and the ranks agree with each other
    flat = torch.cat([p.detach().flatten() for p in models["cohort"].parameters()])
    lo, hi = flat.clone(), flat.clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    assert torch.equal(lo, hi), "ranks diverged"
    print("PASS ddp rank %d of %d: %d steps, max |cohort - gloo| = %.3g, bitwise equal: %s" % (
        r, n, steps, diff, bitwise), flush=True)


def check_raise(r, n):
    """Rank 1 raises at step 5 of a DDP loop; every other rank must see a
    RuntimeError with cohort's text, quickly, not a hang."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    m = DDP(make_net(0))
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    t0 = None
    try:
        for step in range(1000):
            if r == 1 and step == 5:
                raise ValueError("rank 1 fails on purpose")
            if step == 5:
                t0 = time.monotonic()
            x = torch.randn(16, 32)
            opt.zero_grad()
            m(x).pow(2).mean().backward()
            opt.step()
            time.sleep(0.01)
    except RuntimeError as e:
        took = time.monotonic() - (t0 or time.monotonic())
        msg = str(e).splitlines()[0] if str(e) else repr(e)
        assert "cohort" in str(e), "not cohort's text: %s" % e
        print("PASS raise rank %d: RuntimeError after %.2f s: %s" % (r, took, msg[:200]),
              flush=True)
        os._exit(0)  # the group is broken: skip the teardown
    raise AssertionError("rank %d trained on without rank 1" % r)


def check_partial(r, n):
    """PartialSync with a straggler: the fast ranks sync without it, the
    average keeps the models close, and leave + a world collective works."""
    torch.manual_seed(r)  # different starting points on purpose
    net = make_net(r)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    ps = cohort.torch.PartialSync(net, opt, mode=os.environ.get("MODE", "selective"))
    sizes = []
    end = time.monotonic() + float(os.environ.get("SECONDS_BUDGET", "3"))
    while time.monotonic() < end:
        if r == n - 1:
            time.sleep(0.05)  # the straggler
        x = torch.randn(16, 32)
        opt.zero_grad()
        net(x).pow(2).mean().backward()
        opt.step()
        info = ps.step()
        sizes.append(len(info["members"]))
    ps.leave()
    steps = torch.tensor([float(ps.steps)])
    dist.all_reduce(steps, op=dist.ReduceOp.MAX)  # a world collective after leaving
    ps.average()  # everyone holds the same model
    flat = torch.cat([p.detach().flatten() for p in net.parameters()])
    lo, hi = flat.clone(), flat.clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    assert torch.allclose(lo, hi, atol=1e-5), "ranks differ after average()"
    print("PASS partial rank %d of %d: %d steps (most: %d), %d syncs, mean group %.2f, "
          "wait %.1f ms" % (r, n, ps.steps, int(steps.item()), ps.syncs,
                            sum(sizes) / max(1, len(sizes)), ps.wait_us / 1000), flush=True)


def check_timeout(r, n):
    """The group's timeout is cohort's op timeout (not cohort's default)."""
    ms = cohort.torch._c10d.timeout(dist.distributed_c10d._get_default_group()).total_seconds()
    assert abs(ms - 2.0) < 1e-6, ms
    t = torch.ones(4)
    if r == 1:
        time.sleep(6)
        try:
            dist.all_reduce(t)
        except RuntimeError:
            pass  # rank 0 gave up on it
        print("PASS timeout rank 1", flush=True)
        return
    t0 = time.monotonic()
    try:
        dist.all_reduce(t)
    except RuntimeError as e:
        took = time.monotonic() - t0
        assert "ETIMEDOUT" in str(e), e
        assert 1.5 < took < 5.0, took
        print("PASS timeout rank %d: RuntimeError after %.2f s: %s" % (r, took, str(e)[:160]),
              flush=True)
        return
    raise AssertionError("no timeout")


def main():
    mode = sys.argv[1]
    r, n = init(timeout_s=2 if mode == "timeout" else 1800)
    {"calls": check_calls, "ddp": check_ddp, "raise": check_raise,
     "partial": check_partial, "timeout": check_timeout}[mode](r, n)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
