"""The DDP communication hook (cohort.torch_hook) and torch tensors in the
package's collectives, when torch is installed
(Debian's python3-torch): gradients averaged by cohort must equal those of
DDP's own allreduce on the same data."""
import os

import numpy as np
import pytest

if os.environ.get("COHORT_SKIP_TORCH"):
    pytest.skip(os.environ["COHORT_SKIP_TORCH"], allow_module_level=True)
torch = pytest.importorskip("torch", reason="torch is not installed (apt-get install python3-torch)")

import cohort  # noqa: E402
from cohort import torch_hook  # noqa: E402


class FakeBucket:
    def __init__(self, t):
        self.t = t

    def buffer(self):
        return self.t


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_hook_on_a_bucket(ctx, rank, size, dtype):
    t = torch.full((10,), float(rank + 1), dtype=dtype)
    fut = torch_hook.allreduce_hook(ctx, FakeBucket(t))
    out = fut.wait()
    assert out.data_ptr() == t.data_ptr()  # in place, zero copy
    assert torch.all(out == (size + 1) / 2)


def _free_port_from_rank0(ctx):
    import socket
    port = np.zeros(1, np.int64)
    if ctx.rank == 0:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port[0] = s.getsockname()[1]
        s.close()
    ctx.broadcast(port, src=0)
    return int(port[0])


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed missing")
def test_ddp_matches_gloo(ctx, rank, size):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    port = _free_port_from_rank0(ctx)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=size)
    try:
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
        ref = DDP(torch.nn.Sequential(*[type(m)(*()) if isinstance(m, torch.nn.ReLU) else
                                        torch.nn.Linear(m.in_features, m.out_features)
                                        for m in net]))
        ref.module.load_state_dict(net.state_dict())
        mine = DDP(net)
        torch_hook.register(mine, ctx)
        g = torch.Generator().manual_seed(100 + rank)  # different data on every rank
        x = torch.randn(5, 8, generator=g)
        for model in (ref, mine):
            model.zero_grad()
            model(x).pow(2).sum().backward()
        for p, q in zip(ref.parameters(), mine.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6)
        # and the gradients really are shared: equal on every rank
        flat = torch.cat([q.grad.flatten() for q in mine.parameters()]).numpy().copy()
        mx, mn = flat.copy(), flat.copy()
        ctx.allreduce(mx, op="max")
        ctx.allreduce(mn, op="min")
        np.testing.assert_array_equal(mx, mn)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16,
                                   torch.int32, torch.int64, torch.uint8])
def test_package_takes_tensors(ctx, rank, size, dtype):
    """cohort.allreduce & co. on torch tensors: in place on the tensor's own
    memory (zero copy), every dtype, torch's ReduceOp values."""
    import torch.distributed as dist
    t = torch.full((33,), rank + 1, dtype=dtype)
    ptr = t.data_ptr()
    cohort.allreduce(t, op=dist.ReduceOp.SUM)
    assert t.data_ptr() == ptr and torch.all(t == size * (size + 1) // 2)
    m = torch.full((5,), rank + 1, dtype=dtype)
    cohort.allreduce(m, op=dist.ReduceOp.MAX)
    assert torch.all(m == size)
    b = torch.arange(7).to(dtype) if rank == 0 else torch.zeros(7, dtype=dtype)
    cohort.broadcast(b, src=0)
    assert torch.equal(b, torch.arange(7).to(dtype))
    out = torch.zeros(3 * size, dtype=dtype)
    cohort.allgather(out, torch.full((3,), rank, dtype=dtype))
    assert torch.equal(out, torch.arange(size).repeat_interleave(3).to(dtype))
    w = cohort.allreduce(torch.ones(4, dtype=dtype, requires_grad=dtype.is_floating_point),
                         async_op=True)
    w.wait()


def test_package_refuses_what_it_cannot_reduce_in_place(ctx):
    import torch.distributed as dist
    with pytest.raises(cohort.InvalidArgumentError, match="not contiguous"):
        cohort.allreduce(torch.zeros(4, 4).t())
    with pytest.raises(cohort.DtypeError, match="unsupported dtype torch.int8"):
        cohort.allreduce(torch.zeros(4, dtype=torch.int8))
    with pytest.raises(cohort.InvalidArgumentError, match="unsupported torch ReduceOp BAND"):
        cohort.allreduce(torch.zeros(4), op=dist.ReduceOp.BAND)
