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

/* Where a kernel's operands come from: pointers given at launch, or a
 * pointer table read when it runs (gpu_ref_t; nothing is done when
 * tab[0] != 0). Every thread resolves them alike, so the branches below are
 * uniform. */
struct Direct3 {
    void *d;
    const void *a, *b;
    __device__ bool get(char **d_, const char **a_, const char **b_) const
    {
        *d_ = (char *)d, *a_ = (const char *)a, *b_ = (const char *)b;
        return true;
    }
};
struct Ref3 {
    const uint64_t *tab;
    gpu_ref_t d, a, b;
    __device__ bool get(char **d_, const char **a_, const char **b_) const
    {
        if (tab[0]) return false;
        *d_ = (char *)(uintptr_t)(tab[d.i] + d.off);
        *a_ = (const char *)(uintptr_t)(tab[a.i] + a.off);
        *b_ = (const char *)(uintptr_t)(tab[b.i] + b.off);
        return true;
    }
};
struct Direct1 {
    void *p;
    __device__ bool get(char **p_) const { return *p_ = (char *)p, true; }
};
struct Ref1 {
    const uint64_t *tab;
    gpu_ref_t p;
    __device__ bool get(char **p_) const
    {
        if (tab[0]) return false;
        *p_ = (char *)(uintptr_t)(tab[p.i] + p.off);
        return true;
    }
};

/* 16 bytes per load and store when the three pointers allow it: one f16 or
 * u8 element per thread and pass left the kernel at 0.37x of a copy's
 * bandwidth on an H200 (docs/gpu.md). The tail, or everything when the
 * pointers are not aligned, goes element by element. */
template <typename T> union Vec16 {
    uint4 v;
    T e[16 / sizeof(T)];
};

template <typename T, typename F, typename P> __global__ void reduce_kernel(P ops, size_t n, F f)
{
    char *dc;
    const char *ac, *bc;
    if (!ops.get(&dc, &ac, &bc)) return;
    T *d = (T *)dc;
    const T *a = (const T *)ac, *b = (const T *)bc;
    constexpr int K = 16 / sizeof(T);
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const size_t first = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    const size_t nv = (((uintptr_t)d | (uintptr_t)a | (uintptr_t)b) & 15) == 0 ? n / K : 0;
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

/* Bytes, 16 at a time when both ends allow it. */
template <typename P> __global__ void copy_kernel(P ops, size_t n)
{
    char *d;
    const char *s, *unused;
    if (!ops.get(&d, &s, &unused)) return;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const size_t first = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    const size_t nv = (((uintptr_t)d | (uintptr_t)s) & 15) == 0 ? n / 16 : 0;
    for (size_t i = first; i < nv; i += stride) ((uint4 *)d)[i] = ((const uint4 *)s)[i];
    for (size_t i = nv * 16 + first; i < n; i += stride) d[i] = s[i];
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

/* Threads for n elements: one per 16 bytes where the kernel vectorises;
 * one per element for table operands, whose alignment is known only when
 * they run (a shard's offset often is not; the loops stride over whatever
 * the grid is). */
template <typename T> unsigned grid_of(const Direct3 &p, size_t n)
{
    bool vec = (((uintptr_t)p.d | (uintptr_t)p.a | (uintptr_t)p.b) & 15) == 0;
    return grid_for(vec && n >= 16 / sizeof(T) ? n / (16 / sizeof(T)) : n);
}
template <typename T> unsigned grid_of(const Ref3 &, size_t n)
{
    return grid_for(n);
}

template <typename T, typename P, typename F> int launch(const P &p, size_t n, cudaStream_t s, F f)
{
    if (n) reduce_kernel<T><<<grid_of<T>(p, n), 256, 0, s>>>(p, n, f);
    return 0;
}

template <typename T, typename AddF, typename MulF, typename P>
int dispatch(coh_redop op, const P &p, size_t n, cudaStream_t s)
{
    switch (op) {
    case COH_SUM:
    case COH_AVG: return launch<T>(p, n, s, AddF());
    case COH_PROD: return launch<T>(p, n, s, MulF());
    case COH_MIN: return launch<T>(p, n, s, Min<T>());
    case COH_MAX: return launch<T>(p, n, s, Max<T>());
    default: return COH_EINVAL;
    }
}

template <bool BF, typename P> int dispatch_half(coh_redop op, const P &p, size_t n, cudaStream_t s)
{
    switch (op) {
    case COH_SUM:
    case COH_AVG: return launch<uint16_t>(p, n, s, HalfOp<BF, Add<float>>());
    case COH_PROD: return launch<uint16_t>(p, n, s, HalfOp<BF, Mul<float>>());
    case COH_MIN: return launch<uint16_t>(p, n, s, HalfOp<BF, Min<float>>());
    case COH_MAX: return launch<uint16_t>(p, n, s, HalfOp<BF, Max<float>>());
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

template <typename T, typename F, typename P> __global__ void map_kernel(P ops, size_t n, F f)
{
    char *pc;
    if (!ops.get(&pc)) return;
    T *p = (T *)pc;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = f(p[i]);
}

/* f16 / bf16: widen, divide in double as the CPU does, round back. */
template <bool BF> struct DivHalf {
    double d;
    __device__ uint16_t operator()(uint16_t x) const
    {
        float f = BF ? gpu_bf16_to_f32(x) : gpu_f16_to_f32(x);
        f = (float)(f / d);
        return BF ? gpu_f32_to_bf16(f) : gpu_f32_to_f16(f);
    }
};

template <typename T, typename P, typename F> int map(const P &p, size_t n, cudaStream_t s, F f)
{
    if (n) map_kernel<T><<<grid_for(n), 256, 0, s>>>(p, n, f);
    return 0;
}

template <typename P> int div_any(coh_dtype dt, const P &p, size_t n, double d, cudaStream_t s)
{
    if (gpu_div_check(dt, d) < 0) return COH_EINVAL;
    switch (dt) {
    case COH_F32: return map<float>(p, n, s, DivF<float>{d});
    case COH_F64: return map<double>(p, n, s, DivF<double>{d});
    case COH_I32: return map<int32_t>(p, n, s, DivI<int32_t, uint32_t>{(int32_t)d});
    case COH_I64: return map<int64_t>(p, n, s, DivI<int64_t, uint64_t>{(int64_t)d});
    case COH_U8: return map<uint8_t>(p, n, s, DivU8{(unsigned)d});
    case COH_F16: return map<uint16_t>(p, n, s, DivHalf<false>{d});
    case COH_BF16: return map<uint16_t>(p, n, s, DivHalf<true>{d});
    default: return COH_EINVAL;
    }
}

template <typename P>
int reduce_any(coh_dtype dt, coh_redop op, const P &p, size_t n, cudaStream_t s)
{
    switch (dt) {
    case COH_F32: return dispatch<float, Add<float>, Mul<float>>(op, p, n, s);
    case COH_F64: return dispatch<double, Add<double>, Mul<double>>(op, p, n, s);
    case COH_I32:
        return dispatch<int32_t, WrapAdd<int32_t, uint32_t>, WrapMul<int32_t, uint32_t>>(op, p, n,
                                                                                         s);
    case COH_I64:
        return dispatch<int64_t, WrapAdd<int64_t, uint64_t>, WrapMul<int64_t, uint64_t>>(op, p, n,
                                                                                         s);
    case COH_U8:
        return dispatch<uint8_t, WrapAdd<uint8_t, unsigned>, WrapMul<uint8_t, unsigned>>(op, p, n,
                                                                                         s);
    case COH_F16: return dispatch_half<false>(op, p, n, s);
    case COH_BF16: return dispatch_half<true>(op, p, n, s);
    default: return COH_EINVAL;
    }
}

} // namespace

extern "C" int gpu_cuda_div(coh_dtype dt, void *buf, size_t n, double d, void *stream)
{
    return div_any(dt, Direct1{buf}, n, d, (cudaStream_t)stream);
}

extern "C" int gpu_cuda_div_ref(coh_dtype dt, const uint64_t *tab, gpu_ref_t buf, size_t n,
                                double d, void *stream)
{
    return div_any(dt, Ref1{tab, buf}, n, d, (cudaStream_t)stream);
}

extern "C" int gpu_cuda_reduce(coh_dtype dt, coh_redop op, void *dst, const void *a, const void *b,
                               size_t n, void *stream)
{
    return reduce_any(dt, op, Direct3{dst, a, b}, n, (cudaStream_t)stream);
}

extern "C" int gpu_cuda_reduce_ref(coh_dtype dt, coh_redop op, const uint64_t *tab, gpu_ref_t dst,
                                   gpu_ref_t a, gpu_ref_t b, size_t n, void *stream)
{
    return reduce_any(dt, op, Ref3{tab, dst, a, b}, n, (cudaStream_t)stream);
}

extern "C" int gpu_cuda_copy(void *dst, const void *src, size_t n, void *stream)
{
    if (n) copy_kernel<<<grid_for(n), 256, 0, (cudaStream_t)stream>>>(Direct3{dst, src, src}, n);
    return 0;
}

extern "C" int gpu_cuda_copy_ref(const uint64_t *tab, gpu_ref_t dst, gpu_ref_t src, size_t n,
                                 void *stream)
{
    if (n) copy_kernel<<<grid_for(n), 256, 0, (cudaStream_t)stream>>>(Ref3{tab, dst, src, src}, n);
    return 0;
}
