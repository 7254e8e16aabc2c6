"""Device arrays (anything with __cuda_array_interface__: CUDA tensors, CuPy,
Numba) through the ABI's "mem" and "stream" fields and "stream_wait".

There is no GPU here. With the host emulation (COHORT_GPU=host, staged:
COHORT_GPU_IPC=0, since its IPC path maps its own allocations only: python.device.n2)
an object that says it is CUDA memory over a numpy array's bytes runs the device
path (staged through pinned host memory, ordered after the stream: the stats'
gpu_ops count it); without a device runtime (the other python.* runs) the same
object is refused as in C. The argument checks run either way."""
import os

import numpy as np
import pytest

import cohort

EMULATION = os.environ.get("COHORT_GPU") == "host"


class FakeCuda:
    """__cuda_array_interface__ v3 over a numpy array's memory. The host
    emulation copies any address it does not own as host memory, so its
    device path runs on it (a real GPU would need real device memory)."""

    def __init__(self, arr, stream=None, strides=None, readonly=False):
        self.arr = arr
        self.__cuda_array_interface__ = {
            "shape": arr.shape, "typestr": arr.dtype.str, "version": 3,
            "data": (arr.ctypes.data, readonly), "strides": strides, "stream": stream}


class Stream:
    """A torch.cuda.Stream look-alike: the handle is its cuda_stream."""
    cuda_stream = 0


def data(rank, n, dt=np.float32):
    return ((np.arange(n) % 7) + rank + 1).astype(dt)


def summed(size, n, dt=np.float32):
    return sum(data(r, n, np.float64) for r in range(size)).astype(dt)


def gpu_ops(ctx):
    return ctx.stats()["gpu_ops"]


@pytest.mark.skipif(EMULATION, reason="the device runtime is there (COHORT_GPU=host)")
def test_device_arrays_need_a_device_runtime(ctx, rank):
    x = data(rank, 16)
    with pytest.raises(cohort.UnsupportedError):
        ctx.allreduce(FakeCuda(x))
    with pytest.raises(cohort.UnsupportedError):
        ctx.broadcast(FakeCuda(x), stream=Stream())
    w = ctx.allreduce(x, async_op=True)
    w.wait()
    w.stream_wait(0)  # complete: nothing to wait for, nothing asked of the library


@pytest.mark.skipif(not EMULATION, reason="needs COHORT_GPU=host (python.device.n2)")
def test_every_collective_on_device_arrays(ctx, rank, size):
    n = 1000
    before = gpu_ops(ctx)
    x = data(rank, n)
    ctx.allreduce(FakeCuda(x))
    np.testing.assert_array_equal(x, summed(size, n))

    y = data(rank, n, np.int64)
    ctx.allreduce(FakeCuda(y, stream=0), op="max", stream=0)
    np.testing.assert_array_equal(y, data(size - 1, n, np.int64))

    b = data(rank, n, np.float64)
    ctx.broadcast(FakeCuda(b), src=size - 1, stream=Stream())
    np.testing.assert_array_equal(b, data(size - 1, n, np.float64))

    inp = data(rank, n, np.int32)
    out = np.zeros(n * size, np.int32)
    ctx.allgather(FakeCuda(out), FakeCuda(inp))
    np.testing.assert_array_equal(out, np.concatenate([data(r, n, np.int32)
                                                       for r in range(size)]))

    full = np.concatenate([data(rank, n) for _ in range(size)])
    part = np.zeros(n, np.float32)
    ctx.reduce_scatter(FakeCuda(part), FakeCuda(full))
    np.testing.assert_array_equal(part, summed(size, n))
    assert gpu_ops(ctx) == before + 5  # each ran as a device op


@pytest.mark.skipif(not EMULATION, reason="needs COHORT_GPU=host (python.device.n2)")
def test_async_and_stream_wait(ctx, rank, size):
    n = 1 << 16
    x = data(rank, n)
    before = gpu_ops(ctx)
    w = ctx.allreduce(FakeCuda(x, stream=0), async_op=True)
    w.stream_wait(Stream())  # work queued on it next waits for the op
    w.stream_wait(0)
    w.wait()
    np.testing.assert_array_equal(x, summed(size, n))
    assert gpu_ops(ctx) == before + 1
    w.stream_wait(0)  # complete: nothing to wait for


def test_device_argument_checks(ctx, rank):
    x = data(rank, 8)
    with pytest.raises(cohort.InvalidArgumentError) as e:  # a host and a device array
        ctx.allgather(np.zeros(8 * ctx.size, np.float32), FakeCuda(x))
    assert e.value.field == "mem"
    with pytest.raises(cohort.InvalidArgumentError) as e:  # a stream for host memory
        ctx.allreduce(x, stream=0)
    assert e.value.field == "stream"
    with pytest.raises(cohort.InvalidArgumentError) as e:
        ctx.allreduce(FakeCuda(x), stream="default")
    assert e.value.field == "stream"
    with pytest.raises(cohort.InvalidArgumentError) as e:
        ctx.allreduce(FakeCuda(np.zeros((4, 4), np.float32), strides=(4, 16)))
    assert "not contiguous" in str(e.value)
    with pytest.raises(cohort.InvalidArgumentError) as e:
        ctx.allreduce(FakeCuda(x, readonly=True))
    assert "read-only" in str(e.value)
    bad = FakeCuda(x)
    bad.__cuda_array_interface__ = {"shape": (8,)}
    with pytest.raises(cohort.InvalidArgumentError) as e:
        ctx.allreduce(bad)
    assert "malformed" in str(e.value)
    with pytest.raises(cohort.InvalidArgumentError) as e:
        ctx.allreduce(FakeCuda(x), dtype="f64")  # 8-byte elements: the array has 4
    assert e.value.field == "dtype"
