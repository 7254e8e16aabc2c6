"""A PyTorch DistributedDataParallel communication hook that averages the
gradient buckets with cohort instead of the process group's allreduce.

    import torch, cohort
    from cohort.torch_hook import register
    cohort.init()
    torch.distributed.init_process_group("gloo", ...)
    model = torch.nn.parallel.DistributedDataParallel(net)
    register(model)                                    # gradients go through cohort

With the "cohort" backend (cohort.torch) DDP needs no hook and no gloo
group: dist.init_process_group("cohort") and plain DDP(net) run on cohort.

CPU tensors are reduced in place (zero copy through numpy); CUDA tensors are
staged through host memory (cohort's CUDA path is not in this build).
"""
import concurrent.futures

import torch

from . import _core

__all__ = ["HookState", "allreduce_hook", "register"]


class HookState:
    """What the hook needs: the cohort context and the reduction ("avg")."""

    def __init__(self, ctx=None, op="avg"):
        if ctx is None:
            import cohort
            ctx = cohort.get_context()
        self.ctx = ctx
        self.op = op
        # Completions are handed to torch futures from one thread, in order.
        self.executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="cohort-ddp")

    def __getstate__(self):  # DDP may pickle the state: keep it local
        raise TypeError("cohort.torch_hook.HookState cannot be pickled")


def allreduce_hook(state, bucket):
    """DDP comm hook: average bucket.buffer() over the ranks with cohort."""
    if isinstance(state, _core.Context):
        state = HookState(state)
    elif state is None:
        state = HookState()
    tensor = bucket.buffer() if hasattr(bucket, "buffer") else bucket.get_tensor()
    host = tensor.detach()
    on_cpu = host.device.type == "cpu"
    if not on_cpu:
        host = host.to("cpu")
    if not host.is_contiguous():
        host = host.contiguous()
    work = state.ctx.allreduce(host, op=state.op, async_op=True)  # zero copy on CPU
    fut = torch.futures.Future()

    def finish():
        try:
            work.wait()
            if on_cpu and host.data_ptr() == tensor.data_ptr():
                fut.set_result(tensor)
            else:
                tensor.copy_(host)
                fut.set_result(tensor)
        except Exception as e:  # hand any failure to DDP
            fut.set_exception(e)

    state.executor.submit(finish)
    return fut


def register(model, ctx=None, op="avg"):
    """Install the hook on a DistributedDataParallel model; returns the state."""
    state = HookState(ctx, op)
    model.register_comm_hook(state, allreduce_hook)
    return state
