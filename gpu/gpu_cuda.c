/*
 * The CUDA implementation of the device interface (gpu_dev.h) on the CUDA
 * runtime, and the device probe. Without the toolkit only the probe is
 * built (it answers 0) and gpu_dev_cuda() is NULL.
 */
#include "gpu/gpu.h"
#include "gpu/gpu_dev.h"

#ifdef COHORT_HAVE_CUDA
#include <cuda.h> /* types only: the driver is reached through the runtime */
#include <cuda_runtime_api.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#endif

int gpu_cuda_built(void)
{
#ifdef COHORT_HAVE_CUDA
    return 1;
#else
    return 0;
#endif
}

int gpu_device_count(void)
{
#ifdef COHORT_HAVE_CUDA
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
    return n;
#else
    return 0;
#endif
}

#ifdef COHORT_HAVE_CUDA

static _Thread_local char err_text[160];

/* 0, or a status with the runtime's text kept for last_error. */
static int check(cudaError_t e, const char *what)
{
    if (e == cudaSuccess) return 0;
    snprintf(err_text, sizeof(err_text), "%s: %s", what, cudaGetErrorString(e));
    return e == cudaErrorMemoryAllocation ? COH_ENOMEM : COH_EINVAL;
}

static int c_is_device(const void *p, int *dev)
{
    struct cudaPointerAttributes a;
    cudaError_t e = cudaPointerGetAttributes(&a, p);
    if (e != cudaSuccess) { /* older runtimes: an unregistered host pointer */
        (void)cudaGetLastError();
        return 0;
    }
    if (dev) *dev = a.device;
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

static int c_set_device(int dev, int *prev)
{
    int cur = -1;
    if (cudaGetDevice(&cur) != cudaSuccess) cur = -1;
    if (prev) *prev = cur;
    return cur == dev ? 0 : check(cudaSetDevice(dev), "cudaSetDevice");
}

static int c_dev_alloc(void **p, size_t n)
{
    return check(cudaMalloc(p, n ? n : 1), "cudaMalloc");
}

static void c_dev_free(void *p)
{
    if (p) cudaFree(p);
}

static int c_host_alloc(void **p, size_t n)
{
    return check(cudaHostAlloc(p, n ? n : 1, cudaHostAllocPortable | cudaHostAllocMapped),
                 "cudaHostAlloc");
}

static void c_host_free(void *p)
{
    if (p) cudaFreeHost(p);
}

static int c_stream_new(void **s)
{
    cudaStream_t st;
    int r = check(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "cudaStreamCreate");
    if (r == 0) *s = st;
    return r;
}

static void c_stream_free(void *s)
{
    if (s) cudaStreamDestroy((cudaStream_t)s);
}

static int c_event_new(void **e)
{
    cudaEvent_t ev;
    int r = check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
    if (r == 0) *e = ev;
    return r;
}

static void c_event_free(void *e)
{
    if (e) cudaEventDestroy((cudaEvent_t)e);
}

static int c_event_record(void *e, void *s)
{
    return check(cudaEventRecord((cudaEvent_t)e, (cudaStream_t)s), "cudaEventRecord");
}

static int c_event_query(void *e)
{
    cudaError_t r = cudaEventQuery((cudaEvent_t)e);
    if (r == cudaSuccess) return 1;
    if (r == cudaErrorNotReady) return 0;
    return check(r, "cudaEventQuery");
}

static int c_stream_wait(void *s, void *e)
{
    return check(cudaStreamWaitEvent((cudaStream_t)s, (cudaEvent_t)e, 0), "cudaStreamWaitEvent");
}

static int c_copy(void *dst, const void *src, size_t n, void *s)
{
    return check(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, (cudaStream_t)s),
                 "cudaMemcpyAsync");
}

/* r from a kernel's launcher (gpu_kernels.cu), then whether the launch
 * itself failed. */
static int launched(int r, const char *what)
{
    return r < 0 ? r : check(cudaGetLastError(), what);
}

static int c_reduce(coh_dtype dt, coh_redop op, void *dst, const void *a, const void *b, size_t n,
                    void *s)
{
    return launched(gpu_cuda_reduce(dt, op, dst, a, b, n, s), "reduction kernel launch");
}

static int c_div(coh_dtype dt, void *buf, size_t n, double d, void *s)
{
    return launched(gpu_cuda_div(dt, buf, n, d, s), "division kernel launch");
}

static int c_reduce_ref(coh_dtype dt, coh_redop op, const uint64_t *tab, gpu_ref_t dst, gpu_ref_t a,
                        gpu_ref_t b, size_t n, void *s)
{
    return launched(gpu_cuda_reduce_ref(dt, op, tab, dst, a, b, n, s), "reduction kernel launch");
}

static int c_copy_mapped(void *dst, const void *src, size_t n, void *s)
{
    void *dp = NULL;
    int r =
        check(cudaHostGetDevicePointer(&dp, (void *)(uintptr_t)src, 0), "cudaHostGetDevicePointer");
    return r < 0 ? r : launched(gpu_cuda_copy(dst, dp, n, s), "copy kernel launch");
}

static int c_copy_ref(const uint64_t *tab, gpu_ref_t dst, gpu_ref_t src, size_t n, void *s)
{
    return launched(gpu_cuda_copy_ref(tab, dst, src, n, s), "copy kernel launch");
}

static int c_div_ref(coh_dtype dt, const uint64_t *tab, gpu_ref_t buf, size_t n, double d, void *s)
{
    return launched(gpu_cuda_div_ref(dt, tab, buf, n, d, s), "division kernel launch");
}

/* The driver's calls need a context current on the thread, which the
 * runtime's calls make only as they need it (a thread whose first CUDA call
 * is to the driver has none: the H200 showed it): the current device's
 * primary context. */
static int make_current(void)
{
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return -1;
    return cudaSetDevice(dev) == cudaSuccess ? 0 : -1;
}

/* A driver function through the runtime (linking libcuda would keep
 * programs from starting on machines without a driver), looked up once;
 * NULL with the error kept when the driver lacks it. */
static void *driver_fn(const char *name, void *_Atomic *cache)
{
    void *fp = atomic_load(cache);
    if (fp) return fp;
    enum cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion(name, &fp, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        !fp) {
        check(cudaErrorNotSupported, name);
        return NULL;
    }
    atomic_store(cache, fp);
    return fp;
}

typedef CUresult (*range_fn)(CUdeviceptr *base, size_t *size, CUdeviceptr p);

static int c_ipc_get(const void *p, gpu_ipc_t *h)
{
    static void *_Atomic range_p;
    range_fn range = (range_fn)driver_fn("cuMemGetAddressRange", &range_p);
    if (!range) return COH_EINVAL;
    CUdeviceptr base = 0;
    size_t size = 0;
    CUresult e = range(&base, &size, (CUdeviceptr)(uintptr_t)p);
    if (e == CUDA_ERROR_INVALID_CONTEXT && make_current() == 0)
        e = range(&base, &size, (CUdeviceptr)(uintptr_t)p);
    if (e != CUDA_SUCCESS) return check(cudaErrorInvalidValue, "cuMemGetAddressRange");
    cudaIpcMemHandle_t ih;
    int r = check(cudaIpcGetMemHandle(&ih, (void *)(uintptr_t)base), "cudaIpcGetMemHandle");
    if (r < 0) return r;
    memset(h, 0, sizeof(*h));
    memcpy(h->handle, &ih, sizeof(ih) < GPU_IPC_BYTES ? sizeof(ih) : GPU_IPC_BYTES);
    h->offset = (uint64_t)((uintptr_t)p - (uintptr_t)base);
    h->size = size;
    h->pid = (int32_t)getpid();
    int dev = 0;
    cudaGetDevice(&dev);
    h->dev = dev;
    return 0;
}

static int c_ipc_open(const gpu_ipc_t *h, void **base)
{
    cudaIpcMemHandle_t ih;
    memcpy(&ih, h->handle, sizeof(ih));
    return check(cudaIpcOpenMemHandle(base, ih, cudaIpcMemLazyEnablePeerAccess),
                 "cudaIpcOpenMemHandle");
}

static void c_ipc_close(void *base)
{
    if (base) cudaIpcCloseMemHandle(base);
}

static int c_host_fn(void *s, void (*fn)(void *), void *arg)
{
    return check(cudaLaunchHostFunc((cudaStream_t)s, fn, arg), "cudaLaunchHostFunc");
}

typedef CUresult (*wait32_fn)(CUstream s, CUdeviceptr addr, cuuint32_t value, unsigned int flags);

static int c_wait_value(void *s, volatile uint32_t *flag, uint32_t value)
{
    static void *_Atomic wait32_p;
    wait32_fn wait32 = (wait32_fn)driver_fn("cuStreamWaitValue32", &wait32_p);
    if (!wait32) return COH_EINVAL;
    void *dp = NULL;
    int r = check(cudaHostGetDevicePointer(&dp, (void *)(uintptr_t)flag, 0),
                  "cudaHostGetDevicePointer");
    if (r < 0) return r;
    CUresult e = wait32((CUstream)s, (CUdeviceptr)(uintptr_t)dp, value, CU_STREAM_WAIT_VALUE_GEQ);
    if (e == CUDA_ERROR_INVALID_CONTEXT && make_current() == 0)
        e = wait32((CUstream)s, (CUdeviceptr)(uintptr_t)dp, value, CU_STREAM_WAIT_VALUE_GEQ);
    if (e != CUDA_SUCCESS) {
        snprintf(err_text, sizeof(err_text), "cuStreamWaitValue32: CUresult %d", (int)e);
        return COH_EINVAL;
    }
    return 0;
}

static int c_stream_sync(void *s)
{
    return check(cudaStreamSynchronize((cudaStream_t)s), "cudaStreamSynchronize");
}

static const char *c_last_error(void)
{
    return err_text;
}

static const gpu_dev_t cuda_dev = {
    .name = "cuda",
    .is_device = c_is_device,
    .set_device = c_set_device,
    .dev_alloc = c_dev_alloc,
    .dev_free = c_dev_free,
    .host_alloc = c_host_alloc,
    .host_free = c_host_free,
    .stream_new = c_stream_new,
    .stream_free = c_stream_free,
    .event_new = c_event_new,
    .event_free = c_event_free,
    .event_record = c_event_record,
    .event_query = c_event_query,
    .stream_wait = c_stream_wait,
    .copy = c_copy,
    .reduce = c_reduce,
    .div = c_div,
    .copy_mapped = c_copy_mapped,
    .reduce_ref = c_reduce_ref,
    .copy_ref = c_copy_ref,
    .div_ref = c_div_ref,
    .ipc_get = c_ipc_get,
    .ipc_open = c_ipc_open,
    .ipc_close = c_ipc_close,
    .host_fn = c_host_fn,
    .wait_value = c_wait_value,
    .stream_sync = c_stream_sync,
    .last_error = c_last_error,
};

const gpu_dev_t *gpu_dev_cuda(void)
{
    return &cuda_dev;
}

#else

const gpu_dev_t *gpu_dev_cuda(void)
{
    return NULL;
}

#endif
