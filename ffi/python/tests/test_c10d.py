"""The "cohort" torch.distributed backend (cohort.torch), in the pytest
session's own world: a world of one (plain pytest) or 2-3 ranks under
cohortrun, whose RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT torch's env://
rendezvous reads unchanged. Jobs of their own (4 ranks, torchrun, a rank
that raises, a straggler) are in test_c10d_launch.py."""
import os
import socket

import pytest

if os.environ.get("COHORT_SKIP_TORCH"):
    pytest.skip(os.environ["COHORT_SKIP_TORCH"], allow_module_level=True)
torch = pytest.importorskip("torch", reason="torch is not installed (apt-get install python3-torch)")
dist = pytest.importorskip("torch.distributed")
try:
    import cohort.torch  # noqa: E402
except ImportError as e:  # built without torch's headers
    pytest.skip(str(e), allow_module_level=True)

import c10d_worker  # noqa: E402 - the checks the launched jobs run too


@pytest.fixture(scope="module")
def pg(ctx):
    if "RANK" in os.environ:
        dist.init_process_group("cohort")
    else:  # plain pytest: a world of one
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        dist.init_process_group("cohort", init_method="tcp://127.0.0.1:%d" % port, rank=0,
                                world_size=1)
    yield dist.distributed_c10d._get_default_group()
    dist.barrier()
    dist.destroy_process_group()


def test_backend_registered():
    assert "COHORT" in dist.Backend._plugins
    assert dist.Backend("cohort") == "cohort"


def test_world_matches_cohort(pg, ctx):
    assert dist.get_rank() == ctx.rank and dist.get_world_size() == ctx.size
    assert cohort.torch.is_cohort_group()
    assert dist.get_backend() == "cohort"


def test_every_call(pg):
    c10d_worker.check_calls(dist.get_rank(), dist.get_world_size())


def test_ddp_equals_gloo(pg):
    c10d_worker.check_ddp(dist.get_rank(), dist.get_world_size(), steps=20)


def test_future_then(pg):
    """Work.get_future(): what DDP's reducer and comm hooks chain on."""
    n = dist.get_world_size()
    t = torch.ones(64)
    fut = dist.all_reduce(t, async_op=True).get_future()
    doubled = fut.then(lambda f: f.value()[0] * 2)
    assert torch.all(doubled.wait() == 2 * n)


def test_errors_are_runtime_errors(pg):
    with pytest.raises(RuntimeError, match="cohort broadcast: root 99"):
        pg.broadcast([torch.ones(2)], _bopts(99))
    with pytest.raises(RuntimeError, match="ReduceOp is not supported"):
        dist.all_reduce(torch.ones(2, dtype=torch.int32), op=dist.ReduceOp.BAND)
    with pytest.raises(RuntimeError, match="expects one tensor per call"):
        pg.allreduce([torch.ones(2), torch.ones(2)])
    dist.barrier()  # the ranks still agree afterwards


def _bopts(root):
    o = dist.BroadcastOptions()
    o.rootRank = root
    return o


def test_partial_sync_allreduce_mode(pg):
    """PartialSync in allreduce mode: every rank in every group, so the
    models (and momentum) are equal after each step."""
    r = dist.get_rank()
    net = c10d_worker.make_net(r)  # different on every rank
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    ps = cohort.torch.PartialSync(net, opt, mode="allreduce")
    for _ in range(3):
        opt.zero_grad()
        net(torch.randn(4, 32)).sum().backward()
        opt.step()
        info = ps.step()
        assert len(info["members"]) == dist.get_world_size() and info["full"]
    flat = torch.cat([p.detach().flatten() for p in net.parameters()] +
                     [opt.state[p]["momentum_buffer"].flatten() for p in net.parameters()])
    lo, hi = flat.clone(), flat.clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)  # a world collective: leaves the schedule
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    torch.testing.assert_close(lo, hi)
