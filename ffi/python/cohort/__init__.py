"""cohort: adaptive collective communication for data-parallel training.

Python binding of libcohort through its msgpack ABI (include/cohort_ffi.h,
docs/ffi.md). In the style of torch.distributed::

    import numpy as np, cohort
    cohort.init()                      # rank, world size, store from the environment
    grad = np.ones(1024, np.float32)
    cohort.allreduce(grad, op="avg")   # in place
    work = cohort.allreduce(grad, async_op=True)
    ...                                # overlap
    work.wait()
    cohort.finalize()

Run the ranks with cohort's launcher: ``cohortrun -n 4 -- python3 train.py``
(or torchrun, mpirun, Slurm: see the README).
"""

import atexit
import threading

from . import errors
from ._abi import SCHEMA, library_path
from ._core import ALLREDUCE_ALGOS, OPS, SUPPORTED_DTYPES, SYNC_MODES, Context, Result, Work
from .errors import (CanceledError, CohortError, DtypeError, InvalidArgumentError,
                     MismatchError, PeerError, StateError, TimeoutError, UnsupportedError)

__version__ = "0.1.0"
__all__ = [
    "init", "finalize", "is_initialized", "get_context", "rank", "world_size", "get_rank",
    "get_world_size", "allreduce", "all_reduce", "broadcast", "allgather",
    "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor", "barrier", "sync",
    "sync_leave",
    "stats", "lb_table", "failed_ranks", "probe", "Context", "Work", "Result", "CohortError", "InvalidArgumentError", "DtypeError",
    "UnsupportedError", "TimeoutError", "PeerError", "MismatchError", "CanceledError",
    "StateError", "OPS", "SYNC_MODES", "ALLREDUCE_ALGOS", "SUPPORTED_DTYPES", "SCHEMA",
    "library_path", "errors",
]

_default = None
_default_lock = threading.Lock()


def init(config=None, **kwargs):
    """Create the default context (and return it). Keyword arguments are
    config fields: rank, world_size, store, token, nics, timeout_ms,
    connect_timeout_ms, chunk_bytes, small_bytes, rail_min_bytes, spin_us,
    poll_us, sockbuf_bytes, store_fd, log_level. Usable as a context manager:
    ``with cohort.init() as ctx: ...`` finalizes on exit."""
    global _default
    with _default_lock:
        if _default is not None and not _default.finalized:
            raise StateError("cohort.init: already initialized (call cohort.finalize() first)",
                             -8, "ESTATE")
        _default = Context(config, **kwargs)
        return _default


def _default_cleared(ctx):
    global _default
    with _default_lock:
        if _default is ctx:
            _default = None


def is_initialized():
    return _default is not None and not _default.finalized


def get_context():
    """The default context; StateError before init()."""
    ctx = _default
    if ctx is None or ctx.finalized:
        raise StateError("cohort is not initialized: call cohort.init() first", -8, "ESTATE")
    return ctx


def finalize():
    """Finalize the default context (requests still running are canceled)."""
    ctx = _default
    if ctx is not None:
        ctx.finalize()


destroy_process_group = finalize


def rank():
    return get_context().rank


def world_size():
    return get_context().size


get_rank = rank
get_world_size = world_size


def allreduce(arr, op="sum", async_op=False, dtype=None, algo="default", iteration=None,
              loss_bound=0.0, pull_loss_bound=0.0, layer=None, nlayers=None):
    return get_context().allreduce(arr, op=op, async_op=async_op, dtype=dtype, algo=algo,
                                   iteration=iteration, loss_bound=loss_bound,
                                   pull_loss_bound=pull_loss_bound, layer=layer,
                                   nlayers=nlayers)


all_reduce = allreduce


def broadcast(arr, src=0, async_op=False, dtype=None):
    return get_context().broadcast(arr, src=src, async_op=async_op, dtype=dtype)


def allgather(output, input=None, async_op=False, dtype=None):  # noqa: A002
    return get_context().allgather(output, input, async_op=async_op, dtype=dtype)


all_gather_into_tensor = allgather


def reduce_scatter(output, input=None, op="sum", async_op=False, dtype=None):  # noqa: A002
    return get_context().reduce_scatter(output, input, op=op, async_op=async_op, dtype=dtype)


reduce_scatter_tensor = reduce_scatter


def barrier(async_op=False):
    return get_context().barrier(async_op=async_op)


def sync(arr, iteration, weight=1.0, mode=None, async_op=False, dtype=None):
    return get_context().sync(arr, iteration, weight=weight, mode=mode, async_op=async_op,
                              dtype=dtype)


def sync_leave():
    return get_context().sync_leave()


def stats():
    return get_context().stats()


def lb_table():
    """The rail balancer's newest table as text (see Context.lb_table)."""
    return get_context().lb_table()


def failed_ranks():
    """World ranks known failed (see Context.failed_ranks)."""
    return get_context().failed_ranks()


def probe():
    """Alpha-beta probe of every link; collective (see Context.probe)."""
    return get_context().probe()


@atexit.register
def _finalize_at_exit():
    try:
        finalize()
    except CohortError:
        pass
