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

float gpu_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400u));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t gpu_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) /* inf or NaN (keep NaN quiet and non-zero) */
        return (uint16_t)(sign | 0x7c00u |
                          (absx > 0x7f800000u ? 0x200u | ((absx >> 13) & 0x3ffu) : 0));
    if (absx >= 0x477ff000u) /* rounds to above the largest half: inf */
        return (uint16_t)(sign | 0x7c00u);
    if (absx < 0x38800000u) { /* below the smallest normal half: subnormal or zero */
        if (absx < 0x33000000u) return (uint16_t)sign; /* at most half the smallest subnormal */
        /* The subnormal counts units of 2^-24: man * 2^(e-150) / 2^-24. */
        uint32_t e = absx >> 23, man = (absx & 0x7fffffu) | 0x800000u, shift = 126 - e;
        uint32_t q = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t e = (absx >> 23) - 127 + 15;
    uint32_t man = absx & 0x7fffffu;
    uint32_t h = (e << 10) | (man >> 13);
    uint32_t rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++; /* carry may bump the exponent: fine */
    return (uint16_t)(sign | h);
}

float gpu_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t gpu_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    uint32_t lsb = (x >> 16) & 1u;
    x += 0x7fffu + lsb;
    return (uint16_t)(x >> 16);
}

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

/* Half types: widen in blocks so the f32 loop in the middle vectorises. */
#define HALF_BLOCK 256
static int reduce_half(coh_dtype dtype, coh_redop op, void *dst, const void *a, const void *b,
                       size_t n)
{
    if ((unsigned)op >= COH_REDOP_COUNT) return COH_EINVAL; /* even when n == 0, as for f32 */
    float fa[HALF_BLOCK], fb[HALF_BLOCK];
    const uint16_t *x = a, *y = b;
    uint16_t *d = dst;
    const int bf = dtype == COH_BF16;
    for (size_t base = 0; base < n; base += HALF_BLOCK) {
        size_t m = n - base < HALF_BLOCK ? n - base : HALF_BLOCK;
        for (size_t i = 0; i < m; i++) {
            fa[i] = bf ? gpu_bf16_to_f32(x[base + i]) : gpu_f16_to_f32(x[base + i]);
            fb[i] = bf ? gpu_bf16_to_f32(y[base + i]) : gpu_f16_to_f32(y[base + i]);
        }
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
        for (size_t i = 0; i < m; i++)
            d[base + i] = bf ? gpu_f32_to_bf16(fa[i]) : gpu_f32_to_f16(fa[i]);
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

int gpu_cpu_div(coh_dtype dtype, void *buf, size_t n, double divisor)
{
    if (!isfinite(divisor) || divisor == 0) return COH_EINVAL;
    /* Integer types divide by an integer: converting anything else (a
     * fraction, or a value out of the type's range) would be undefined. */
    bool integral = divisor == floor(divisor);
    if ((dtype == COH_I32 || dtype == COH_I64) && (!integral || fabs(divisor) > 2147483647.0))
        return COH_EINVAL;
    if (dtype == COH_U8 && (!integral || divisor < 1 || divisor > 255)) return COH_EINVAL;
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
