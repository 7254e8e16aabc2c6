/*
 * CPU reduction kernels. Each (dtype, op) pair is a plain loop the compiler
 * vectorises (this file is built with -O3); integer sum and product go
 * through unsigned arithmetic so overflow wraps instead of being undefined.
 * f16 and bf16 are widened to f32, reduced, and rounded back once.
 */
#include "gpu/gpu.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

/* The loop body for one element; OP(x, y) gives the result. */
#define LOOP(T, OP)                                                                                \
    do {                                                                                           \
        T *d = (T *)dst;                                                                           \
        const T *x = (const T *)a, *y = (const T *)b;                                              \
        for (size_t i = 0; i < n; i++) d[i] = OP(x[i], y[i]);                                      \
    } while (0)

#define ADD(x, y)     ((x) + (y))
#define MUL(x, y)     ((x) * (y))
#define MIN(x, y)     ((y) < (x) ? (y) : (x))
#define MAX(x, y)     ((y) > (x) ? (y) : (x))
#define ADD_I32(x, y) ((int32_t)((uint32_t)(x) + (uint32_t)(y)))
#define MUL_I32(x, y) ((int32_t)((uint32_t)(x) * (uint32_t)(y)))
#define ADD_I64(x, y) ((int64_t)((uint64_t)(x) + (uint64_t)(y)))
#define MUL_I64(x, y) ((int64_t)((uint64_t)(x) * (uint64_t)(y)))
#define ADD_U8(x, y)  ((uint8_t)((x) + (y)))
#define MUL_U8(x, y)  ((uint8_t)((unsigned)(x) * (unsigned)(y)))

#define DISPATCH(T, add, mul)                                                                      \
    switch (op) {                                                                                  \
    case COH_SUM:                                                                                  \
    case COH_AVG: LOOP(T, add); return 0;                                                          \
    case COH_PROD: LOOP(T, mul); return 0;                                                         \
    case COH_MIN: LOOP(T, MIN); return 0;                                                          \
    case COH_MAX: LOOP(T, MAX); return 0;                                                          \
    default: return COH_EINVAL;                                                                    \
    }

/* Half types: widen in blocks, reduce in f32, round back once. Each
 * conversion is a loop of its own per type, so that the compiler
 * vectorises bf16's (a shift one way, a branch-free rounding the other);
 * f16's use the CPU's F16C instructions where it has them, which round as
 * gpu_f32_to_f16 does (ties to even; a NaN keeps its sign and top payload
 * bits and is quiet), else the scalar conversions. Measured with
 * cohort-gpubench on the emulation (64 MiB, GB/s moved): f16 1.8 -> 12.0,
 * bf16 3.2 -> 8.8, against f32's 18.4. */
#define HALF_BLOCK 256

static void widen_bf16(const uint16_t *x, float *f, size_t m)
{
    for (size_t i = 0; i < m; i++) {
        uint32_t bits = (uint32_t)x[i] << 16;
        memcpy(&f[i], &bits, 4);
    }
}

static void narrow_bf16(const float *f, uint16_t *d, size_t m)
{
    for (size_t i = 0; i < m; i++) {
        uint32_t x;
        memcpy(&x, &f[i], 4);
        uint32_t nan = (x & 0x7fffffffu) > 0x7f800000u;
        uint32_t r = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16, q = (x >> 16) | 0x40u;
        d[i] = (uint16_t)(nan ? q : r);
    }
}

static void widen_f16_sw(const uint16_t *x, float *f, size_t m)
{
    for (size_t i = 0; i < m; i++) f[i] = gpu_f16_to_f32(x[i]);
}

static void narrow_f16_sw(const float *f, uint16_t *d, size_t m)
{
    for (size_t i = 0; i < m; i++) d[i] = gpu_f32_to_f16(f[i]);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#include <stdatomic.h>
__attribute__((target("avx,f16c"))) static void widen_f16_hw(const uint16_t *x, float *f, size_t m)
{
    size_t i = 0;
    for (; i + 8 <= m; i += 8)
        _mm256_storeu_ps(f + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))));
    for (; i < m; i++) f[i] = gpu_f16_to_f32(x[i]);
}

__attribute__((target("avx,f16c"))) static void narrow_f16_hw(const float *f, uint16_t *d, size_t m)
{
    size_t i = 0;
    for (; i + 8 <= m; i += 8)
        _mm_storeu_si128(
            (__m128i *)(d + i),
            _mm256_cvtps_ph(_mm256_loadu_ps(f + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < m; i++) d[i] = gpu_f32_to_f16(f[i]);
}

/* F16C and AVX, and the OS saving the YMM registers. */
static bool probe_f16c(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
    if (!(c & bit_F16C) || !(c & bit_AVX) || !(c & bit_OSXSAVE)) return false;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    (void)hi;
    return (lo & 6) == 6;
}

static bool have_f16c(void)
{
    static _Atomic int known = -1; /* every thread computes the same */
    int k = atomic_load_explicit(&known, memory_order_relaxed);
    if (k < 0) {
        k = probe_f16c();
        atomic_store_explicit(&known, k, memory_order_relaxed);
    }
    return k > 0;
}
#else
#define widen_f16_hw  widen_f16_sw
#define narrow_f16_hw narrow_f16_sw
static bool have_f16c(void)
{
    return false;
}
#endif

static int reduce_half(coh_dtype dtype, coh_redop op, void *dst, const void *a, const void *b,
                       size_t n)
{
    if ((unsigned)op >= COH_REDOP_COUNT) return COH_EINVAL; /* even when n == 0, as for f32 */
    float fa[HALF_BLOCK], fb[HALF_BLOCK];
    const uint16_t *x = a, *y = b;
    uint16_t *d = dst;
    const bool hw = dtype == COH_F16 && have_f16c();
    void (*widen)(const uint16_t *, float *, size_t) = dtype == COH_BF16 ? widen_bf16
                                                       : hw              ? widen_f16_hw
                                                                         : widen_f16_sw;
    void (*narrow)(const float *, uint16_t *, size_t) = dtype == COH_BF16 ? narrow_bf16
                                                        : hw              ? narrow_f16_hw
                                                                          : narrow_f16_sw;
    for (size_t base = 0; base < n; base += HALF_BLOCK) {
        size_t m = n - base < HALF_BLOCK ? n - base : HALF_BLOCK;
        widen(x + base, fa, m);
        widen(y + base, fb, m);
        switch (op) {
        case COH_SUM:
        case COH_AVG:
            for (size_t i = 0; i < m; i++) fa[i] = fa[i] + fb[i];
            break;
        case COH_PROD:
            for (size_t i = 0; i < m; i++) fa[i] = fa[i] * fb[i];
            break;
        case COH_MIN:
            for (size_t i = 0; i < m; i++) fa[i] = MIN(fa[i], fb[i]);
            break;
        case COH_MAX:
            for (size_t i = 0; i < m; i++) fa[i] = MAX(fa[i], fb[i]);
            break;
        default: return COH_EINVAL;
        }
        narrow(fa, d + base, m);
    }
    return 0;
}

int gpu_cpu_reduce(coh_dtype dtype, coh_redop op, void *dst, const void *a, const void *b, size_t n)
{
    switch (dtype) {
    case COH_F32: DISPATCH(float, ADD, MUL);
    case COH_F64: DISPATCH(double, ADD, MUL);
    case COH_I32: DISPATCH(int32_t, ADD_I32, MUL_I32);
    case COH_I64: DISPATCH(int64_t, ADD_I64, MUL_I64);
    case COH_U8: DISPATCH(uint8_t, ADD_U8, MUL_U8);
    case COH_F16:
    case COH_BF16: return reduce_half(dtype, op, dst, a, b, n);
    default: return COH_EINVAL;
    }
}

#define EACH(T, EXPR)                                                                              \
    do {                                                                                           \
        T *p = (T *)buf;                                                                           \
        for (size_t i = 0; i < n; i++) p[i] = (EXPR);                                              \
    } while (0)

static int half_map(coh_dtype dtype, void *buf, size_t n, double mul, double div)
{
    uint16_t *p = buf;
    const int bf = dtype == COH_BF16;
    for (size_t i = 0; i < n; i++) {
        float f = bf ? gpu_bf16_to_f32(p[i]) : gpu_f16_to_f32(p[i]);
        f = div != 0 ? (float)(f / div) : (float)(f * mul);
        p[i] = bf ? gpu_f32_to_bf16(f) : gpu_f32_to_f16(f);
    }
    return 0;
}

#define FILL(T, V)                                                                                 \
    do {                                                                                           \
        T *p = (T *)buf, v = (V);                                                                  \
        for (size_t i = 0; i < n; i++) p[i] = v;                                                   \
    } while (0)

int gpu_cpu_fill_identity(coh_dtype dtype, coh_redop op, void *buf, size_t n)
{
    if ((unsigned)op >= COH_REDOP_COUNT) return COH_EINVAL;
    bool sum = op == COH_SUM || op == COH_AVG;
    switch (dtype) {
    case COH_F32:
        FILL(float, sum ? -0.0f : op == COH_PROD ? 1.0f : op == COH_MIN ? INFINITY : -INFINITY);
        return 0;
    case COH_F64:
        FILL(double, sum ? -0.0 : op == COH_PROD ? 1.0 : op == COH_MIN ? INFINITY : -INFINITY);
        return 0;
    case COH_I32:
        FILL(int32_t, sum ? 0 : op == COH_PROD ? 1 : op == COH_MIN ? INT32_MAX : INT32_MIN);
        return 0;
    case COH_I64:
        FILL(int64_t, sum ? 0 : op == COH_PROD ? 1 : op == COH_MIN ? INT64_MAX : INT64_MIN);
        return 0;
    case COH_U8: FILL(uint8_t, sum ? 0 : op == COH_PROD ? 1 : op == COH_MIN ? 255 : 0); return 0;
    case COH_F16:
    case COH_BF16: {
        float f = sum ? -0.0f : op == COH_PROD ? 1.0f : op == COH_MIN ? INFINITY : -INFINITY;
        FILL(uint16_t, dtype == COH_F16 ? gpu_f32_to_f16(f) : gpu_f32_to_bf16(f));
        return 0;
    }
    default: return COH_EINVAL;
    }
}

int gpu_div_check(coh_dtype dtype, double divisor)
{
    if (!isfinite(divisor) || divisor == 0 || !coh_dtype_size(dtype)) return COH_EINVAL;
    /* Integer types divide by an integer: converting anything else (a
     * fraction, or a value out of the type's range) would be undefined. */
    bool integral = divisor == floor(divisor);
    if ((dtype == COH_I32 || dtype == COH_I64) && (!integral || fabs(divisor) > 2147483647.0))
        return COH_EINVAL;
    if (dtype == COH_U8 && (!integral || divisor < 1 || divisor > 255)) return COH_EINVAL;
    return 0;
}

int gpu_cpu_div(coh_dtype dtype, void *buf, size_t n, double divisor)
{
    if (gpu_div_check(dtype, divisor) < 0) return COH_EINVAL;
    switch (dtype) {
    case COH_F32: {
        const float dv = (float)divisor;
        EACH(float, p[i] / dv);
        return 0;
    }
    case COH_F64: EACH(double, p[i] / divisor); return 0;
    case COH_I32: {
        const int32_t dv = (int32_t)divisor;
        if (dv == 0) return COH_EINVAL;
        EACH(int32_t, (dv == -1) ? (int32_t)(0u - (uint32_t)p[i]) : p[i] / dv);
        return 0;
    }
    case COH_I64: {
        const int64_t dv = (int64_t)divisor;
        if (dv == 0) return COH_EINVAL;
        EACH(int64_t, (dv == -1) ? (int64_t)(0u - (uint64_t)p[i]) : p[i] / dv);
        return 0;
    }
    case COH_U8: {
        const unsigned dv = (unsigned)divisor;
        if (dv == 0) return COH_EINVAL;
        EACH(uint8_t, (uint8_t)(p[i] / dv));
        return 0;
    }
    case COH_F16:
    case COH_BF16: return half_map(dtype, buf, n, 0, divisor);
    default: return COH_EINVAL;
    }
}

int gpu_cpu_scale(coh_dtype dtype, void *buf, size_t n, double factor)
{
    switch (dtype) {
    case COH_F32: {
        const float fv = (float)factor;
        EACH(float, p[i] * fv);
        return 0;
    }
    case COH_F64: EACH(double, p[i] * factor); return 0;
    case COH_I32: EACH(int32_t, (int32_t)llround((double)p[i] * factor)); return 0;
    case COH_I64: EACH(int64_t, (int64_t)llround((double)p[i] * factor)); return 0;
    case COH_U8: EACH(uint8_t, (uint8_t)lround((double)p[i] * factor)); return 0;
    case COH_F16:
    case COH_BF16: return half_map(dtype, buf, n, factor, 0);
    default: return COH_EINVAL;
    }
}
