/*
 * CUDA reduction kernels: dst[i] = a[i] op b[i] for every (dtype, op) the
 * CPU kernels have, with the same rules (gpu.h): integer sum and product
 * wrap, f16 and bf16 widen to f32 and round back once with the same
 * conversions (gpu_half.h), MIN/MAX compare as the CPU loop does. So a
 * device reduction equals the CPU's bit for bit, but for the payload of a
 * NaN result (a GPU gives its canonical NaN; unit.test_gpu_dev.cuda).
 */
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "gpu/gpu.h"
#include "gpu/gpu_dev.h"
}

namespace
{

template <typename T> struct Add {
    __device__ T operator()(T x, T y) const { return x + y; }
};
template <typename T> struct Mul {
    __device__ T operator()(T x, T y) const { return x * y; }
};
template <typename T> struct Min {
    __device__ T operator()(T x, T y) const { return y < x ? y : x; }
};
template <typename T> struct Max {
    __device__ T operator()(T x, T y) const { return y > x ? y : x; }
};
/* Integer sum and product through the unsigned type: wrap, no UB. */
template <typename T, typename U> struct WrapAdd {
    __device__ T operator()(T x, T y) const { return (T)((U)x + (U)y); }
};
template <typename T, typename U> struct WrapMul {
    __device__ T operator()(T x, T y) const { return (T)((U)x * (U)y); }
};

template <typename T, typename F>
__global__ void reduce_kernel(T *d, const T *a, const T *b, size_t n, F f)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        d[i] = f(a[i], b[i]);
}

/* 16 bytes per load and store when the three pointers allow it: one f16 or
 * u8 element per thread and pass left the kernel at 0.37x of a copy's
 * bandwidth on an H200 (docs/gpu.md). The tail goes element by element. */
template <typename T> union Vec16 {
    uint4 v;
    T e[16 / sizeof(T)];
};

template <typename T, typename F>
__global__ void reduce_vec_kernel(T *d, const T *a, const T *b, size_t n, F f)
{
    constexpr int K = 16 / sizeof(T);
    const size_t nv = n / K, stride = (size_t)gridDim.x * blockDim.x;
    const size_t first = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    for (size_t i = first; i < nv; i += stride) {
        Vec16<T> x, y, r;
        x.v = ((const uint4 *)a)[i];
        y.v = ((const uint4 *)b)[i];
#pragma unroll
        for (int k = 0; k < K; k++) r.e[k] = f(x.e[k], y.e[k]);
        ((uint4 *)d)[i] = r.v;
    }
    for (size_t i = nv * K + first; i < n; i += stride) d[i] = f(a[i], b[i]);
}

/* f16 / bf16 stored as uint16_t: widen, op in f32, round back. */
template <bool BF, typename F> struct HalfOp {
    F f;
    __device__ uint16_t operator()(uint16_t a, uint16_t b) const
    {
        float x = BF ? gpu_bf16_to_f32(a) : gpu_f16_to_f32(a);
        float y = BF ? gpu_bf16_to_f32(b) : gpu_f16_to_f32(b);
        float r = f(x, y);
        return BF ? gpu_f32_to_bf16(r) : gpu_f32_to_f16(r);
    }
};

unsigned grid_for(size_t n)
{
    size_t g = (n + 255) / 256;
    return (unsigned)(g < 4096 ? (g ? g : 1) : 4096);
}

template <typename T, typename F>
int launch(void *d, const void *a, const void *b, size_t n, cudaStream_t s, F f)
{
    if (!n) return 0;
    if ((((uintptr_t)d | (uintptr_t)a | (uintptr_t)b) & 15) == 0 && n >= 16 / sizeof(T))
        reduce_vec_kernel<<<grid_for(n / (16 / sizeof(T))), 256, 0, s>>>((T *)d, (const T *)a,
                                                                         (const T *)b, n, f);
    else
        reduce_kernel<<<grid_for(n), 256, 0, s>>>((T *)d, (const T *)a, (const T *)b, n, f);
    return 0;
}

template <typename T, typename AddF, typename MulF>
int dispatch(coh_redop op, void *d, const void *a, const void *b, size_t n, cudaStream_t s)
{
    switch (op) {
    case COH_SUM:
    case COH_AVG: return launch<T>(d, a, b, n, s, AddF());
    case COH_PROD: return launch<T>(d, a, b, n, s, MulF());
    case COH_MIN: return launch<T>(d, a, b, n, s, Min<T>());
    case COH_MAX: return launch<T>(d, a, b, n, s, Max<T>());
    default: return COH_EINVAL;
    }
}

template <bool BF>
int dispatch_half(coh_redop op, void *d, const void *a, const void *b, size_t n, cudaStream_t s)
{
    switch (op) {
    case COH_SUM:
    case COH_AVG: return launch<uint16_t>(d, a, b, n, s, HalfOp<BF, Add<float>>());
    case COH_PROD: return launch<uint16_t>(d, a, b, n, s, HalfOp<BF, Mul<float>>());
    case COH_MIN: return launch<uint16_t>(d, a, b, n, s, HalfOp<BF, Min<float>>());
    case COH_MAX: return launch<uint16_t>(d, a, b, n, s, HalfOp<BF, Max<float>>());
    default: return COH_EINVAL;
    }
}

/* buf[i] /= d, as gpu_cpu_div does it. */
template <typename T> struct DivF {
    double d;
    __device__ T operator()(T x) const { return x / (T)d; }
};
template <> struct DivF<float> {
    double d;
    __device__ float operator()(float x) const { return x / (float)d; }
};
template <typename T, typename U> struct DivI {
    T d;
    __device__ T operator()(T x) const { return d == (T)-1 ? (T)((U)0 - (U)x) : x / d; }
};
struct DivU8 {
    unsigned d;
    __device__ uint8_t operator()(uint8_t x) const { return (uint8_t)(x / d); }
};

template <typename T, typename F> __global__ void map_kernel(T *p, size_t n, F f)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = f(p[i]);
}

template <bool BF> __global__ void div_half_kernel(uint16_t *p, size_t n, double d)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float f = BF ? gpu_bf16_to_f32(p[i]) : gpu_f16_to_f32(p[i]);
        f = (float)(f / d);
        p[i] = BF ? gpu_f32_to_bf16(f) : gpu_f32_to_f16(f);
    }
}

template <typename T, typename F> int map(void *p, size_t n, cudaStream_t s, F f)
{
    if (n) map_kernel<T><<<grid_for(n), 256, 0, s>>>((T *)p, n, f);
    return 0;
}

} // namespace

extern "C" int gpu_cuda_div(coh_dtype dt, void *buf, size_t n, double d, void *stream)
{
    if (gpu_div_check(dt, d) < 0) return COH_EINVAL;
    cudaStream_t s = (cudaStream_t)stream;
    switch (dt) {
    case COH_F32: return map<float>(buf, n, s, DivF<float>{d});
    case COH_F64: return map<double>(buf, n, s, DivF<double>{d});
    case COH_I32: return map<int32_t>(buf, n, s, DivI<int32_t, uint32_t>{(int32_t)d});
    case COH_I64: return map<int64_t>(buf, n, s, DivI<int64_t, uint64_t>{(int64_t)d});
    case COH_U8: return map<uint8_t>(buf, n, s, DivU8{(unsigned)d});
    case COH_F16:
    case COH_BF16:
        if (!n) return 0;
        if (dt == COH_F16)
            div_half_kernel<false><<<grid_for(n), 256, 0, s>>>((uint16_t *)buf, n, d);
        else
            div_half_kernel<true><<<grid_for(n), 256, 0, s>>>((uint16_t *)buf, n, d);
        return 0;
    default: return COH_EINVAL;
    }
}

extern "C" int gpu_cuda_reduce(coh_dtype dt, coh_redop op, void *dst, const void *a, const void *b,
                               size_t n, void *stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    switch (dt) {
    case COH_F32: return dispatch<float, Add<float>, Mul<float>>(op, dst, a, b, n, s);
    case COH_F64: return dispatch<double, Add<double>, Mul<double>>(op, dst, a, b, n, s);
    case COH_I32:
        return dispatch<int32_t, WrapAdd<int32_t, uint32_t>, WrapMul<int32_t, uint32_t>>(op, dst, a,
                                                                                         b, n, s);
    case COH_I64:
        return dispatch<int64_t, WrapAdd<int64_t, uint64_t>, WrapMul<int64_t, uint64_t>>(op, dst, a,
                                                                                         b, n, s);
    case COH_U8:
        return dispatch<uint8_t, WrapAdd<uint8_t, unsigned>, WrapMul<uint8_t, unsigned>>(op, dst, a,
                                                                                         b, n, s);
    case COH_F16: return dispatch_half<false>(op, dst, a, b, n, s);
    case COH_BF16: return dispatch_half<true>(op, dst, a, b, n, s);
    default: return COH_EINVAL;
    }
}
