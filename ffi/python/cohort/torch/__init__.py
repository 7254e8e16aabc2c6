"""cohort as a torch.distributed backend, and partial sync for PyTorch loops.

    import torch.distributed as dist
    import cohort.torch                      # registers the "cohort" backend
    dist.init_process_group("cohort")        # under torchrun or cohortrun
    model = torch.nn.parallel.DistributedDataParallel(net)   # no gloo group
    dist.all_reduce(t); dist.broadcast(t, 0); dist.all_gather(ts, t); ...

The backend (a C++ extension, ffi/torch/ff_c10d.cc) runs every collective
on CPU tensors in place with libcohort: float32/64, float16, bfloat16,
int32/64, uint8, bool and complex tensors; SUM, AVG, PRODUCT, MIN, MAX.
Errors are RuntimeErrors carrying cohort's text ("cohort allreduce: [EPEER]
rank 1 is gone ..."). The process group's ``timeout`` (torch's default: 30
minutes) is cohort's operation timeout: an op fails after that long without
progress, while a dead peer fails it at once through its connection.

``PartialSync`` averages a model's parameters with the group cohort's
scheduler picks each step instead of all ranks (docs/torch.md).
"""

import glob
import importlib.machinery
import importlib.util
import os

import torch  # noqa: F401 - torch's types must be registered before the extension loads
import torch.distributed as dist

__all__ = ["PartialSync", "sync", "sync_leave", "stats", "describe", "is_cohort_group",
           "extension_path", "BACKEND"]

BACKEND = "cohort"
_here = os.path.dirname(os.path.abspath(__file__))


def _candidates():
    """$COHORT_TORCH_EXT; the package's _lib/ (pip install, cmake --install);
    the build tree this source tree sits in."""
    env = os.environ.get("COHORT_TORCH_EXT")
    if env:
        return [env]
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    pkg = os.path.dirname(_here)
    found = sorted(glob.glob(os.path.join(pkg, "_lib", "_c10d*" + suffix)))
    repo = os.path.dirname(os.path.dirname(os.path.dirname(pkg)))
    for d in ("build", "build-ffi"):
        p = os.path.join(repo, d, "lib", "_c10d" + suffix)
        if os.path.exists(p):
            found.append(p)
    return found


def extension_path():
    """The path of the backend's extension module that is (or would be) loaded."""
    c = _candidates()
    return c[0] if c else None


def _load():
    path = extension_path()
    if not path or not os.path.exists(path):
        raise ImportError(
            "cohort.torch: the backend's extension (_c10d) was not found: build cohort where "
            "torch and its headers are installed (apt-get install python3-torch libtorch-dev; "
            "it lands in build/lib), or set COHORT_TORCH_EXT to its path")
    # The extension links libcohort: load the one the package uses first, so
    # both are the same library.
    from .. import _abi
    _abi.load()
    spec = importlib.util.spec_from_file_location("cohort.torch._c10d", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_c10d = _load()


def _create(store, rank, world_size, timeout):
    return _c10d.create(store, rank, world_size, timeout)


if "COHORT" not in dist.Backend._plugins:
    dist.Backend.register_backend(BACKEND, _create)


def _group(group):
    pg = dist.distributed_c10d._get_default_group() if group is None else group
    if not _c10d.is_cohort(pg):
        raise ValueError("cohort.torch: the process group's backend is not 'cohort' "
                         "(dist.init_process_group('cohort') or dist.new_group(backend='cohort'))")
    return pg


def is_cohort_group(group=None):
    pg = dist.distributed_c10d._get_default_group() if group is None else group
    return bool(_c10d.is_cohort(pg))


def sync(tensor, iteration, weight=1.0, mode="default", group=None):
    """One partial / selective sync of ``tensor`` (CPU, contiguous, in place)
    for training step ``iteration``: the tensor becomes the weighted average
    of the group cohort's scheduler forms (weight > 0: this rank's local
    steps since its last sync). mode: default (COHORT_SYNC_MODE, selective),
    allreduce, partial, selective or relay; the same on every rank. Returns
    the group: {"members", "full", "total_weight", "wait_us", "comm_us",
    "group_id"}. A collective of the whole group takes the rank out of the
    schedule first (see sync_leave)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError("cohort.torch.sync: a torch.Tensor, got %s" % type(tensor).__name__)
    return _c10d.sync(_group(group), tensor, int(iteration), float(weight), mode)


def sync_leave(group=None):
    """Take this rank out of the sync schedule, so no group waits for it (the
    backend does this itself before any collective on the group)."""
    _c10d.sync_leave(_group(group))


def stats(group=None):
    """Counters of the group's cohort context (bytes, requests)."""
    return _c10d.stats(_group(group))


def describe(group=None):
    """The group's rails and transports, as cohort describes them."""
    return _c10d.describe(_group(group))


def _shutdown_all():
    """Close every cohort group's connections at exit: peers then see this
    rank leave (EPEER at once) instead of waiting for a timeout."""
    try:
        groups = list(dist.distributed_c10d._pg_map.keys())
    except Exception:  # noqa: BLE001 - torch's internals changed: nothing to do
        return
    for pg in groups:
        try:
            if _c10d.is_cohort(pg):
                _c10d.shutdown(pg)
        except Exception:  # noqa: BLE001
            pass


import atexit  # noqa: E402

atexit.register(_shutdown_all)

from .partial import PartialSync  # noqa: E402
