/*
 * gpu/gpu.h: the CPU reduction kernels, division and scaling, the f16/bf16
 * conversions, and the status / dtype name tables of cohort.h.
 *
 * Every kernel result is compared bit for bit with a scalar reference
 * written here: integer sum and product wrap (computed in unsigned
 * arithmetic, so the reference itself is UB-free), f16 and bf16 are widened
 * to f32, reduced in f32 and rounded back once. The conversions are checked
 * against a reference that rounds in double precision with rint() (ties to
 * even), independent of the bit tricks of gpu_cpu.c.
 */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cohort.h"
#include "gpu/gpu.h"

static const coh_dtype DTYPES[] = {COH_F32, COH_F64, COH_F16, COH_BF16, COH_I32, COH_I64, COH_U8};
static const coh_redop OPS[] = {COH_SUM, COH_AVG, COH_MIN, COH_MAX, COH_PROD};
/* Lengths around the vector widths and the 256-element blocks of the half kernels. */
static const size_t LENS[] = {0,  1,  2,  3,  5,   7,   8,   15,  16,
                              17, 31, 33, 63, 255, 256, 257, 513, 1001};

/* ---- helpers ---- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) /* splitmix64 */
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint64_t f64_bits(double d)
{
    uint64_t u;
    memcpy(&u, &d, 8);
    return u;
}

static bool f16_is_nan(uint16_t h)
{
    return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0;
}

static bool bf16_is_nan(uint16_t h)
{
    return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0;
}

/* ---- independent conversion references ---- */

/* The value of an f16 bit pattern, from the definition. */
static double ref_f16_value(uint16_t h)
{
    int sign = h >> 15, e = (h >> 10) & 31, m = h & 0x3ff;
    double v;
    if (e == 0)
        v = ldexp(m, -24);
    else if (e == 31)
        v = m ? NAN : INFINITY;
    else
        v = ldexp(1024 + m, e - 25);
    return sign ? -v : v;
}

/* Round a finite or infinite non-NaN f32 to f16, nearest even. */
static uint16_t ref_f32_to_f16(float f)
{
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    double x = fabs((double)f);
    if (x >= 65520.0) return sign | 0x7c00;    /* 65520 is the tie between 65504 and 2^16 */
    if (x < ldexp(1, -14)) {                   /* subnormal range: units of 2^-24 */
        double q = rint(ldexp(x, 24));         /* exact scaling, rint rounds ties to even */
        return (uint16_t)(sign | (uint16_t)q); /* q == 1024 is the smallest normal: fine */
    }
    int ex;
    frexp(x, &ex);                     /* x = m * 2^ex, m in [0.5, 1) */
    int e = ex - 1;                    /* x in [2^e, 2^(e+1)) */
    double q = rint(ldexp(x, 10 - e)); /* in [1024, 2048] */
    if (q == 2048.0) {
        q = 1024.0;
        e++;
    }
    if (e + 15 >= 31) return sign | 0x7c00;
    return (uint16_t)(sign | (uint16_t)((e + 15) << 10) | (uint16_t)(q - 1024.0));
}

/* Round a non-NaN f32 to bf16, nearest even: round the value to 8
 * significant bits in double, then the result is exact in f32. */
static uint16_t ref_f32_to_bf16(float f)
{
    double x = fabs((double)f);
    double r;
    if (isinf(x)) {
        r = x;
    } else if (x < ldexp(1, -126)) {
        r = ldexp(rint(ldexp(x, 133)), -133); /* subnormal: units of 2^-133 */
    } else {
        int ex;
        frexp(x, &ex);
        r = ldexp(rint(ldexp(x, 8 - ex)), ex - 8);
    }
    if (r >= ldexp(1, 128)) r = INFINITY;
    float rf = (float)(signbit(f) ? -r : r);
    uint32_t u = f32_bits(rf);
    assert_int_equal(u & 0xffffu, 0); /* the reference itself: exactly representable */
    return (uint16_t)(u >> 16);
}

/* ---- reduction reference ---- */

static float ref_op_f32(coh_redop op, float x, float y)
{
    switch (op) {
    case COH_SUM:
    case COH_AVG: return x + y;
    case COH_PROD: return x * y;
    case COH_MIN: return y < x ? y : x;
    case COH_MAX: return y > x ? y : x;
    default: fail();
    }
    return 0;
}

static double ref_op_f64(coh_redop op, double x, double y)
{
    switch (op) {
    case COH_SUM:
    case COH_AVG: return x + y;
    case COH_PROD: return x * y;
    case COH_MIN: return y < x ? y : x;
    case COH_MAX: return y > x ? y : x;
    default: fail();
    }
    return 0;
}

/* Unsigned arithmetic of `bits` bits; min/max compare as signed when sgn. */
static uint64_t ref_op_int(coh_redop op, uint64_t x, uint64_t y, int bits, bool sgn)
{
    uint64_t mask = bits == 64 ? ~0ull : (1ull << bits) - 1;
    int64_t sx = 0, sy = 0;
    if (sgn) { /* sign-extend without implementation-defined conversions */
        uint64_t top = 1ull << (bits - 1);
        sx = (x & top) ? -(int64_t)(~x & mask) - 1 : (int64_t)x;
        sy = (y & top) ? -(int64_t)(~y & mask) - 1 : (int64_t)y;
    }
    bool less = sgn ? sy < sx : y < x;    /* y < x */
    bool greater = sgn ? sy > sx : y > x; /* y > x */
    switch (op) {
    case COH_SUM:
    case COH_AVG: return (x + y) & mask;
    case COH_PROD: return (x * y) & mask;
    case COH_MIN: return less ? y : x;
    case COH_MAX: return greater ? y : x;
    default: fail();
    }
    return 0;
}

static void ref_reduce(coh_dtype dt, coh_redop op, void *dst, const void *a, const void *b,
                       size_t n)
{
    for (size_t i = 0; i < n; i++) {
        switch (dt) {
        case COH_F32:
            ((float *)dst)[i] = ref_op_f32(op, ((const float *)a)[i], ((const float *)b)[i]);
            break;
        case COH_F64:
            ((double *)dst)[i] = ref_op_f64(op, ((const double *)a)[i], ((const double *)b)[i]);
            break;
        case COH_F16: {
            float x = (float)ref_f16_value(((const uint16_t *)a)[i]);
            float y = (float)ref_f16_value(((const uint16_t *)b)[i]);
            ((uint16_t *)dst)[i] = ref_f32_to_f16(ref_op_f32(op, x, y));
            break;
        }
        case COH_BF16: {
            float x = bits_f32((uint32_t)((const uint16_t *)a)[i] << 16);
            float y = bits_f32((uint32_t)((const uint16_t *)b)[i] << 16);
            ((uint16_t *)dst)[i] = ref_f32_to_bf16(ref_op_f32(op, x, y));
            break;
        }
        case COH_I32: {
            uint32_t x, y;
            memcpy(&x, (const char *)a + 4 * i, 4);
            memcpy(&y, (const char *)b + 4 * i, 4);
            uint32_t r = (uint32_t)ref_op_int(op, x, y, 32, true);
            memcpy((char *)dst + 4 * i, &r, 4);
            break;
        }
        case COH_I64: {
            uint64_t x, y;
            memcpy(&x, (const char *)a + 8 * i, 8);
            memcpy(&y, (const char *)b + 8 * i, 8);
            uint64_t r = ref_op_int(op, x, y, 64, true);
            memcpy((char *)dst + 8 * i, &r, 8);
            break;
        }
        case COH_U8:
            ((uint8_t *)dst)[i] =
                (uint8_t)ref_op_int(op, ((const uint8_t *)a)[i], ((const uint8_t *)b)[i], 8, false);
            break;
        default: fail();
        }
    }
}

/* Random elements: finite floats of every magnitude, any integer. */
static void fill_random(coh_dtype dt, void *buf, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t r = rnd();
        switch (dt) {
        case COH_F32: {
            uint32_t u = (uint32_t)r;
            if ((u & 0x7f800000u) == 0x7f800000u) u &= ~0x40000000u; /* not inf/NaN */
            if (r >> 62 == 0) u = f32_bits((float)((int)((r >> 32) % 2001) - 1000) / 8.0f);
            ((float *)buf)[i] = bits_f32(u);
            break;
        }
        case COH_F64: {
            uint64_t u = r;
            if ((u & 0x7ff0000000000000ull) == 0x7ff0000000000000ull) u &= ~0x4000000000000000ull;
            double d;
            memcpy(&d, &u, 8);
            if (r >> 62 == 0) d = (double)((int)((r >> 32) % 2001) - 1000) / 8.0;
            ((double *)buf)[i] = d;
            break;
        }
        case COH_F16: {
            uint16_t h = (uint16_t)r;
            if ((h & 0x7c00u) == 0x7c00u) h &= (uint16_t)~0x4000u;
            ((uint16_t *)buf)[i] = h;
            break;
        }
        case COH_BF16: {
            uint16_t h = (uint16_t)r;
            if ((h & 0x7f80u) == 0x7f80u) h &= (uint16_t)~0x4000u;
            ((uint16_t *)buf)[i] = h;
            break;
        }
        case COH_I32: {
            uint32_t u = (uint32_t)r;
            if (r >> 62 == 1) u = (uint32_t)(r >> 40) % 7u; /* small values: products too */
            memcpy((char *)buf + 4 * i, &u, 4);
            break;
        }
        case COH_I64: memcpy((char *)buf + 8 * i, &r, 8); break;
        case COH_U8: ((uint8_t *)buf)[i] = (uint8_t)r; break;
        default: fail();
        }
    }
}

/* Compare element by element so a failure names the element and both bit patterns. */
static void expect_same(coh_dtype dt, const void *got, const void *want, size_t n, coh_redop op,
                        const char *how)
{
    size_t es = coh_dtype_size(dt);
    for (size_t i = 0; i < n; i++) {
        uint64_t g = 0, w = 0;
        memcpy(&g, (const char *)got + i * es, es);
        memcpy(&w, (const char *)want + i * es, es);
        if (g != w)
            print_error("%s %s %s n=%zu: element %zu differs\n", coh_dtype_name(dt),
                        coh_redop_name(op), how, n, i);
        assert_int_equal(g, w);
    }
}

static void check_reduce_dtype(coh_dtype dt)
{
    size_t es = coh_dtype_size(dt);
    size_t max = LENS[sizeof(LENS) / sizeof(LENS[0]) - 1];
    /* One spare element after each buffer: the kernel must not write past n. */
    uint8_t *a = malloc((max + 1) * es), *b = malloc((max + 1) * es), *d = malloc((max + 1) * es),
            *want = malloc((max + 1) * es), *work = malloc((max + 1) * es);
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(d);
    assert_non_null(want);
    assert_non_null(work);
    for (size_t oi = 0; oi < sizeof(OPS) / sizeof(OPS[0]); oi++) {
        coh_redop op = OPS[oi];
        for (size_t li = 0; li < sizeof(LENS) / sizeof(LENS[0]); li++) {
            size_t n = LENS[li];
            fill_random(dt, a, n);
            fill_random(dt, b, n);
            ref_reduce(dt, op, want, a, b, n);

            /* out of place; the guard element stays untouched */
            memset(d, 0xA5, (n + 1) * es);
            assert_int_equal(gpu_cpu_reduce(dt, op, d, a, b, n), 0);
            expect_same(dt, d, want, n, op, "dst!=a,b");
            for (size_t k = 0; k < es; k++) assert_int_equal(d[n * es + k], 0xA5);

            /* dst == a */
            memcpy(work, a, n * es);
            assert_int_equal(gpu_cpu_reduce(dt, op, work, work, b, n), 0);
            expect_same(dt, work, want, n, op, "dst==a");

            /* dst == b */
            memcpy(work, b, n * es);
            assert_int_equal(gpu_cpu_reduce(dt, op, work, a, work, n), 0);
            expect_same(dt, work, want, n, op, "dst==b");

            /* a == b == dst */
            memcpy(work, a, n * es);
            ref_reduce(dt, op, d, a, a, n);
            assert_int_equal(gpu_cpu_reduce(dt, op, work, work, work, n), 0);
            expect_same(dt, work, d, n, op, "dst==a==b");
        }
    }
    free(a);
    free(b);
    free(d);
    free(want);
    free(work);
}

static void test_reduce_f32(void **state)
{
    (void)state;
    check_reduce_dtype(COH_F32);
}
static void test_reduce_f64(void **state)
{
    (void)state;
    check_reduce_dtype(COH_F64);
}
static void test_reduce_f16(void **state)
{
    (void)state;
    check_reduce_dtype(COH_F16);
}
static void test_reduce_bf16(void **state)
{
    (void)state;
    check_reduce_dtype(COH_BF16);
}
static void test_reduce_i32(void **state)
{
    (void)state;
    check_reduce_dtype(COH_I32);
}
static void test_reduce_i64(void **state)
{
    (void)state;
    check_reduce_dtype(COH_I64);
}
static void test_reduce_u8(void **state)
{
    (void)state;
    check_reduce_dtype(COH_U8);
}

/* Hand-computed values: wrap-around and the ops' exact meaning. */
static void test_reduce_known(void **state)
{
    (void)state;
    {
        int32_t a[] = {INT32_MAX, INT32_MIN, -7, 65536, INT32_MIN, 5, -3};
        int32_t b[] = {1, -1, 3, 65536, -1, -5, -3};
        int32_t d[7];
        assert_int_equal(gpu_cpu_reduce(COH_I32, COH_SUM, d, a, b, 7), 0);
        int32_t sum[] = {INT32_MIN, INT32_MAX, -4, 131072, INT32_MAX, 0, -6};
        for (int i = 0; i < 7; i++) assert_int_equal(d[i], sum[i]);
        assert_int_equal(gpu_cpu_reduce(COH_I32, COH_AVG, d, a, b, 7), 0);
        for (int i = 0; i < 7; i++) assert_int_equal(d[i], sum[i]);
        assert_int_equal(gpu_cpu_reduce(COH_I32, COH_PROD, d, a, b, 7), 0);
        int32_t prod[] = {INT32_MAX, INT32_MIN, -21, 0, INT32_MIN, -25, 9};
        for (int i = 0; i < 7; i++) assert_int_equal(d[i], prod[i]);
        assert_int_equal(gpu_cpu_reduce(COH_I32, COH_MIN, d, a, b, 7), 0);
        int32_t mn[] = {1, INT32_MIN, -7, 65536, INT32_MIN, -5, -3};
        for (int i = 0; i < 7; i++) assert_int_equal(d[i], mn[i]);
        assert_int_equal(gpu_cpu_reduce(COH_I32, COH_MAX, d, a, b, 7), 0);
        int32_t mx[] = {INT32_MAX, -1, 3, 65536, -1, 5, -3};
        for (int i = 0; i < 7; i++) assert_int_equal(d[i], mx[i]);
    }
    {
        uint8_t a[] = {200, 16, 255, 0, 7}, b[] = {100, 16, 255, 255, 9}, d[5];
        assert_int_equal(gpu_cpu_reduce(COH_U8, COH_SUM, d, a, b, 5), 0);
        uint8_t sum[] = {44, 32, 254, 255, 16};
        assert_memory_equal(d, sum, 5);
        assert_int_equal(gpu_cpu_reduce(COH_U8, COH_PROD, d, a, b, 5), 0);
        uint8_t prod[] = {(uint8_t)(20000 % 256), 0, 1, 0, 63};
        assert_memory_equal(d, prod, 5);
        assert_int_equal(gpu_cpu_reduce(COH_U8, COH_MIN, d, a, b, 5), 0);
        uint8_t mn[] = {100, 16, 255, 0, 7};
        assert_memory_equal(d, mn, 5);
        assert_int_equal(gpu_cpu_reduce(COH_U8, COH_MAX, d, a, b, 5), 0);
        uint8_t mx[] = {200, 16, 255, 255, 9};
        assert_memory_equal(d, mx, 5);
    }
    {
        int64_t a[] = {INT64_MAX, INT64_C(1) << 32, INT64_C(3037000500), INT64_MIN, -2};
        int64_t b[] = {1, INT64_C(1) << 32, INT64_C(3037000500), -1, 3};
        int64_t d[5];
        assert_int_equal(gpu_cpu_reduce(COH_I64, COH_SUM, d, a, b, 5), 0);
        assert_int_equal(d[0], INT64_MIN);
        assert_int_equal(d[1], INT64_C(1) << 33);
        assert_int_equal(d[2], INT64_C(6074001000));
        assert_int_equal(d[3], INT64_MAX);
        assert_int_equal(d[4], 1);
        assert_int_equal(gpu_cpu_reduce(COH_I64, COH_PROD, d, a, b, 5), 0);
        assert_int_equal(d[0], INT64_MAX);
        assert_int_equal(d[1], 0); /* 2^64 wraps to 0 */
        /* 3037000500^2 = 9223372037000250000 = 2^63 + 145474192: wraps negative */
        assert_int_equal(d[2], INT64_MIN + INT64_C(145474192));
        assert_int_equal(d[3], INT64_MIN); /* -INT64_MIN wraps to itself */
        assert_int_equal(d[4], -6);
    }
    {
        float a[] = {1.5f, -0.25f, 3.0f}, b[] = {2.0f, 0.25f, -4.0f}, d[3];
        assert_int_equal(gpu_cpu_reduce(COH_F32, COH_SUM, d, a, b, 3), 0);
        assert_true(d[0] == 3.5f && d[1] == 0.0f && d[2] == -1.0f);
        assert_int_equal(gpu_cpu_reduce(COH_F32, COH_PROD, d, a, b, 3), 0);
        assert_true(d[0] == 3.0f && d[1] == -0.0625f && d[2] == -12.0f);
        assert_int_equal(gpu_cpu_reduce(COH_F32, COH_MIN, d, a, b, 3), 0);
        assert_true(d[0] == 1.5f && d[1] == -0.25f && d[2] == -4.0f);
        assert_int_equal(gpu_cpu_reduce(COH_F32, COH_MAX, d, a, b, 3), 0);
        assert_true(d[0] == 2.0f && d[1] == 0.25f && d[2] == 3.0f);
    }
    {
        /* f16: 1 + 2 = 3 (0x4200); 65504 + 65504 overflows to inf; 2^-24 + 2^-24 = 2^-23 */
        uint16_t a[] = {0x3C00, 0x7BFF, 0x0001, 0xC000}, b[] = {0x4000, 0x7BFF, 0x0001, 0x3C00};
        uint16_t d[4];
        assert_int_equal(gpu_cpu_reduce(COH_F16, COH_SUM, d, a, b, 4), 0);
        assert_int_equal(d[0], 0x4200);
        assert_int_equal(d[1], 0x7C00);
        assert_int_equal(d[2], 0x0002);
        assert_int_equal(d[3], 0xBC00); /* -2 + 1 = -1 */
        /* bf16: 1 + 2^-8 is a tie at bf16 precision and rounds to even (1.0) */
        uint16_t x[] = {0x3F80, 0x3F81}, y[] = {0x3B80, 0x3B80}; /* 0x3B80 = 2^-8 */
        assert_int_equal(gpu_cpu_reduce(COH_BF16, COH_SUM, d, x, y, 2), 0);
        assert_int_equal(d[0], 0x3F80);
        assert_int_equal(d[1], 0x3F82);
    }
}

static void test_reduce_invalid(void **state)
{
    (void)state;
    uint64_t a[2] = {1, 2}, b[2] = {3, 4}, d[2] = {0, 0};
    for (size_t i = 0; i < sizeof(DTYPES) / sizeof(DTYPES[0]); i++) {
        for (size_t n = 0; n < 2; n++) {
            assert_int_equal(gpu_cpu_reduce(DTYPES[i], COH_REDOP_COUNT, d, a, b, n), COH_EINVAL);
            assert_int_equal(gpu_cpu_reduce(DTYPES[i], (coh_redop)-1, d, a, b, n), COH_EINVAL);
        }
    }
    assert_int_equal(gpu_cpu_reduce(COH_DTYPE_COUNT, COH_SUM, d, a, b, 1), COH_EINVAL);
    assert_int_equal(gpu_cpu_reduce((coh_dtype)-1, COH_SUM, d, a, b, 1), COH_EINVAL);
    assert_int_equal(gpu_cpu_div(COH_DTYPE_COUNT, d, 1, 2.0), COH_EINVAL);
    assert_int_equal(gpu_cpu_scale(COH_DTYPE_COUNT, d, 1, 2.0), COH_EINVAL);
    /* nothing was written */
    assert_int_equal(d[0], 0);
    assert_int_equal(d[1], 0);
    for (size_t i = 0; i < sizeof(DTYPES) / sizeof(DTYPES[0]); i++)
        assert_int_equal(gpu_cpu_div(DTYPES[i], d, 1, 0.0), COH_EINVAL);
}

/* ---- division and scaling ---- */

static void test_div(void **state)
{
    (void)state;
    {
        int32_t v[] = {7, -7, 6, -6, 1, -1, 0, INT32_MAX, INT32_MIN};
        int32_t w2[] = {3, -3, 3, -3, 0, 0, 0, 1073741823, -1073741824};
        int32_t x[9];
        memcpy(x, v, sizeof(v));
        assert_int_equal(gpu_cpu_div(COH_I32, x, 9, 2.0), 0);
        for (int i = 0; i < 9; i++) assert_int_equal(x[i], w2[i]);
        int32_t w3[] = {-2, 2, -2, 2, 0, 0, 0, -715827882, 715827882};
        memcpy(x, v, sizeof(v));
        assert_int_equal(gpu_cpu_div(COH_I32, x, 9, -3.0), 0);
        for (int i = 0; i < 9; i++) assert_int_equal(x[i], w3[i]);
        /* -1: INT32_MIN / -1 overflows; it wraps (like the sums) instead of trapping */
        int32_t wm[] = {-7, 7, -6, 6, -1, 1, 0, -INT32_MAX, INT32_MIN};
        memcpy(x, v, sizeof(v));
        assert_int_equal(gpu_cpu_div(COH_I32, x, 9, -1.0), 0);
        for (int i = 0; i < 9; i++) assert_int_equal(x[i], wm[i]);
        memcpy(x, v, sizeof(v));
        assert_int_equal(gpu_cpu_div(COH_I32, x, 0, 2.0), 0); /* n = 0 touches nothing */
        assert_memory_equal(x, v, sizeof(v));
    }
    {
        int64_t v[] = {7, -7, INT64_MAX, INT64_MIN, -1};
        int64_t x[5];
        memcpy(x, v, sizeof(v));
        assert_int_equal(gpu_cpu_div(COH_I64, x, 5, 4.0), 0);
        assert_int_equal(x[0], 1);
        assert_int_equal(x[1], -1);
        assert_int_equal(x[2], INT64_MAX / 4);
        assert_int_equal(x[3], INT64_MIN / 4);
        assert_int_equal(x[4], 0);
        memcpy(x, v, sizeof(v));
        assert_int_equal(gpu_cpu_div(COH_I64, x, 5, -1.0), 0);
        assert_int_equal(x[0], -7);
        assert_int_equal(x[1], 7);
        assert_int_equal(x[2], -INT64_MAX);
        assert_int_equal(x[3], INT64_MIN);
        assert_int_equal(x[4], 1);
    }
    {
        uint8_t x[] = {255, 7, 1, 0};
        assert_int_equal(gpu_cpu_div(COH_U8, x, 4, 2.0), 0);
        uint8_t w[] = {127, 3, 0, 0};
        assert_memory_equal(x, w, 4);
        uint8_t y[] = {255, 200};
        assert_int_equal(gpu_cpu_div(COH_U8, y, 2, 7.0), 0);
        assert_int_equal(y[0], 36);
        assert_int_equal(y[1], 28);
    }
    {
        float x[] = {1.0f, -3.0f, 10.0f, 0.0f, 7.0f};
        assert_int_equal(gpu_cpu_div(COH_F32, x, 5, 4.0), 0);
        assert_int_equal(f32_bits(x[0]), f32_bits(0.25f));
        assert_int_equal(f32_bits(x[1]), f32_bits(-0.75f));
        assert_int_equal(f32_bits(x[2]), f32_bits(2.5f));
        assert_int_equal(f32_bits(x[3]), f32_bits(0.0f));
        assert_int_equal(f32_bits(x[4]), f32_bits(1.75f));
        float y[] = {1.0f, 2.0f};
        assert_int_equal(gpu_cpu_div(COH_F32, y, 2, 3.0), 0);
        assert_int_equal(f32_bits(y[0]), f32_bits(1.0f / 3.0f));
        assert_int_equal(f32_bits(y[1]), f32_bits(2.0f / 3.0f));
    }
    {
        double x[] = {1.0, -2.0, 1e300};
        assert_int_equal(gpu_cpu_div(COH_F64, x, 3, 3.0), 0);
        assert_int_equal(f64_bits(x[0]), f64_bits(1.0 / 3.0));
        assert_int_equal(f64_bits(x[1]), f64_bits(-2.0 / 3.0));
        assert_int_equal(f64_bits(x[2]), f64_bits(1e300 / 3.0));
    }
    {
        uint16_t h[] = {0x4200, 0xC200, 0x3C00}; /* 3, -3, 1 */
        assert_int_equal(gpu_cpu_div(COH_F16, h, 3, 2.0), 0);
        assert_int_equal(h[0], 0x3E00); /* 1.5 */
        assert_int_equal(h[1], 0xBE00);
        assert_int_equal(h[2], 0x3800);  /* 0.5 */
        uint16_t g[] = {0x4040, 0x3F80}; /* bf16 3, 1 */
        assert_int_equal(gpu_cpu_div(COH_BF16, g, 2, 2.0), 0);
        assert_int_equal(g[0], 0x3FC0); /* 1.5 */
        assert_int_equal(g[1], 0x3F00); /* 0.5 */
        uint16_t t[] = {0x3C00};        /* f16 1/3 rounds to 0x3555 */
        assert_int_equal(gpu_cpu_div(COH_F16, t, 1, 3.0), 0);
        assert_int_equal(t[0], 0x3555);
    }
}

static void test_scale(void **state)
{
    (void)state;
    {
        /* integers round to nearest, halves away from zero (llround) */
        int32_t x[] = {3, -3, 5, 4, 0, 1000001};
        assert_int_equal(gpu_cpu_scale(COH_I32, x, 6, 0.5), 0);
        int32_t w[] = {2, -2, 3, 2, 0, 500001};
        for (int i = 0; i < 6; i++) assert_int_equal(x[i], w[i]);
        int32_t y[] = {10, -10};
        assert_int_equal(gpu_cpu_scale(COH_I32, y, 2, 0.26), 0);
        assert_int_equal(y[0], 3);
        assert_int_equal(y[1], -3);
    }
    {
        int64_t x[] = {INT64_C(1) << 40, -3, 7};
        assert_int_equal(gpu_cpu_scale(COH_I64, x, 3, 2.0), 0);
        assert_int_equal(x[0], INT64_C(1) << 41);
        assert_int_equal(x[1], -6);
        assert_int_equal(x[2], 14);
    }
    {
        uint8_t x[] = {10, 3, 100};
        assert_int_equal(gpu_cpu_scale(COH_U8, x, 3, 2.5), 0);
        assert_int_equal(x[0], 25);
        assert_int_equal(x[1], 8); /* 7.5 rounds away from zero */
        assert_int_equal(x[2], 250);
    }
    {
        float x[] = {1.0f, -2.0f, 3.0f};
        assert_int_equal(gpu_cpu_scale(COH_F32, x, 3, 0.75), 0);
        assert_int_equal(f32_bits(x[0]), f32_bits(0.75f));
        assert_int_equal(f32_bits(x[1]), f32_bits(-1.5f));
        assert_int_equal(f32_bits(x[2]), f32_bits(2.25f));
        double y[] = {1.0, -2.0};
        assert_int_equal(gpu_cpu_scale(COH_F64, y, 2, 0.1), 0);
        assert_int_equal(f64_bits(y[0]), f64_bits(0.1));
        assert_int_equal(f64_bits(y[1]), f64_bits(-0.2));
        uint16_t h[] = {0x3C00, 0x4200}; /* f16 1, 3 */
        assert_int_equal(gpu_cpu_scale(COH_F16, h, 2, 3.0), 0);
        assert_int_equal(h[0], 0x4200);
        assert_int_equal(h[1], 0x4880); /* 9 */
        uint16_t g[] = {0x3F80};        /* bf16 1 */
        assert_int_equal(gpu_cpu_scale(COH_BF16, g, 1, 0.5), 0);
        assert_int_equal(g[0], 0x3F00);
        /* factor 0 zeroes (it is not "no factor") */
        uint16_t z[] = {0x3C00};
        assert_int_equal(gpu_cpu_scale(COH_F16, z, 1, 0.0), 0);
        assert_int_equal(z[0], 0x0000);
    }
}

/* ---- f16 ---- */

static void test_f16_roundtrip_exhaustive(void **state)
{
    (void)state;
    for (uint32_t h = 0; h <= 0xffffu; h++) {
        float f = gpu_f16_to_f32((uint16_t)h);
        double want = ref_f16_value((uint16_t)h);
        uint16_t back = gpu_f32_to_f16(f);
        if (f16_is_nan((uint16_t)h)) {
            if (!isnan(f) || !f16_is_nan(back) || (back & 0x8000u) != (h & 0x8000u))
                print_error("f16 NaN 0x%04x -> %a -> 0x%04x\n", h, (double)f, back);
            assert_true(isnan(f));
            assert_true(f16_is_nan(back));
            assert_int_equal(back & 0x8000u, h & 0x8000u);
            assert_int_equal(signbit(f) ? 0x8000u : 0u, h & 0x8000u);
            continue;
        }
        if (f64_bits((double)f) != f64_bits(want))
            print_error("f16 0x%04x decodes to %a, want %a\n", h, (double)f, want);
        assert_int_equal(f64_bits((double)f), f64_bits(want)); /* also the sign of zero */
        if (back != h) print_error("f16 0x%04x -> %a -> 0x%04x\n", h, (double)f, back);
        assert_int_equal(back, h);
    }
}

static void test_f16_known(void **state)
{
    (void)state;
    struct {
        float f;
        uint16_t h;
    } k[] = {
        {1.0f, 0x3C00},
        {-1.0f, 0xBC00},
        {2.0f, 0x4000},
        {0.5f, 0x3800},
        {0.1f, 0x2E66},
        {65504.0f, 0x7BFF},
        {65519.0f, 0x7BFF},
        {65520.0f, 0x7C00}, /* the tie above the largest half rounds to even: inf */
        {-65520.0f, 0xFC00},
        {65536.0f, 0x7C00},
        {1e10f, 0x7C00},
        {FLT_MAX, 0x7C00},
        {0x1p-14f, 0x0400},            /* smallest normal */
        {0x1p-14f - 0x1p-25f, 0x0400}, /* 1023.5 units: tie, even is 1024 */
        {0x1p-14f - 0x1p-24f, 0x03FF}, /* largest subnormal */
        {0x1p-24f, 0x0001},            /* smallest subnormal */
        {-0x1p-24f, 0x8001},
        {0x1p-25f, 0x0000}, /* half a unit: tie, even is 0 */
        {-0x1p-25f, 0x8000},
        {0x1.000002p-25f, 0x0001}, /* just above the tie */
        {0x1.fffffep-26f, 0x0000}, /* just below */
        {3 * 0x1p-26f, 0x0001},    /* 0.75 units */
        {3 * 0x1p-25f, 0x0002},    /* 1.5 units: tie, even is 2 */
        {5 * 0x1p-25f, 0x0002},    /* 2.5 units: tie, even is 2 */
        {7 * 0x1p-25f, 0x0004},    /* 3.5 units: tie, even is 4 */
        {1e-8f, 0x0000},
        {FLT_MIN, 0x0000},
        {1.0f + 0x1p-11f, 0x3C00},     /* tie, even */
        {1.0f + 3 * 0x1p-11f, 0x3C02}, /* tie, even */
        {1.0f + 0x1p-11f + 0x1p-20f, 0x3C01},
        {1.0f + 0x1p-10f, 0x3C01},
        {2047.0f, 0x67FF},
        {2049.0f, 0x6800}, /* tie between 2048 and 2050: even 2048 */
        {2051.0f, 0x6802}, /* tie between 2050 and 2052: even 2052 */
        {0.0f, 0x0000},
        {-0.0f, 0x8000},
        {INFINITY, 0x7C00},
        {-INFINITY, 0xFC00},
    };
    for (size_t i = 0; i < sizeof(k) / sizeof(k[0]); i++) {
        uint16_t got = gpu_f32_to_f16(k[i].f);
        if (got != k[i].h) print_error("gpu_f32_to_f16(%a)\n", (double)k[i].f);
        assert_int_equal(got, k[i].h);
        assert_int_equal(ref_f32_to_f16(k[i].f), k[i].h); /* the reference agrees */
    }
    assert_true(gpu_f16_to_f32(0x0001) == 0x1p-24f);
    assert_true(gpu_f16_to_f32(0x03FF) == 1023 * 0x1p-24f);
    assert_true(gpu_f16_to_f32(0x7BFF) == 65504.0f);
    assert_true(gpu_f16_to_f32(0x3555) == 0x1.554p-2f);
    assert_true(isinf(gpu_f16_to_f32(0x7C00)) && gpu_f16_to_f32(0x7C00) > 0);
    assert_true(isinf(gpu_f16_to_f32(0xFC00)) && gpu_f16_to_f32(0xFC00) < 0);
    assert_true(isnan(gpu_f16_to_f32(0x7E00)));
    assert_true(isnan(gpu_f16_to_f32(0x7C01)));
    assert_true(gpu_f16_to_f32(0x8000) == 0.0f && signbit(gpu_f16_to_f32(0x8000)));
    /* f32 NaNs of every kind stay NaN, with their sign; a payload only in the
     * low 13 bits must not turn into inf */
    uint32_t nans[] = {0x7FC00000u, 0x7F800001u, 0xFF800001u,
                       0x7FFFFFFFu, 0xFFC00000u, 0x7F801000u};
    for (size_t i = 0; i < sizeof(nans) / sizeof(nans[0]); i++) {
        uint16_t h = gpu_f32_to_f16(bits_f32(nans[i]));
        if (!f16_is_nan(h)) print_error("f32 NaN 0x%08x -> f16 0x%04x\n", nans[i], h);
        assert_true(f16_is_nan(h));
        assert_int_equal(h >> 15, nans[i] >> 31);
    }
}

/* ~1e6 floats against the double-precision reference: uniformly random bit
 * patterns, and patterns concentrated on the exponents where f16 rounding,
 * subnormals and overflow happen, with mantissas near the halfway points. */
static void test_f16_random_vs_reference(void **state)
{
    (void)state;
    rng_state = 12345;
    for (int i = 0; i < 1000000; i++) {
        uint64_t r = rnd();
        uint32_t u = (uint32_t)r;
        switch ((r >> 32) & 3) {
        case 0: break; /* any pattern */
        case 1:        /* exponents 2^-26 .. 2^17 */
            u = (u & 0x807fffffu) | ((uint32_t)(101 + (r >> 34) % 44) << 23);
            break;
        case 2: /* near a rounding tie: low 13 mantissa bits 0x0fff..0x1001 */
            u = (u & 0x807fe000u) | ((uint32_t)(101 + (r >> 34) % 44) << 23) |
                (uint32_t)(0x0fff + (r >> 40) % 3);
            break;
        case 3: { /* exact ties in the subnormal range: the dropped bits are exactly half */
            uint32_t e = 102 + (uint32_t)((r >> 34) % 11), shift = 126 - e;
            uint32_t man = ((uint32_t)(r >> 40) & 0xffffffu) | 0x800000u;
            man = (man & ~((1u << shift) - 1)) | (1u << (shift - 1));
            u = (u & 0x80000000u) | (e << 23) | (man & 0x7fffffu);
            break;
        }
        }
        float f = bits_f32(u);
        uint16_t got = gpu_f32_to_f16(f);
        if (isnan(f)) {
            if (!f16_is_nan(got) || (got >> 15) != (u >> 31))
                print_error("f32 0x%08x (NaN) -> 0x%04x\n", u, got);
            assert_true(f16_is_nan(got));
            assert_int_equal(got >> 15, u >> 31);
            continue;
        }
        uint16_t want = ref_f32_to_f16(f);
        if (got != want) print_error("f32 0x%08x (%a)\n", u, (double)f);
        assert_int_equal(got, want);
    }
}

/* ---- bf16 ---- */

static void test_bf16(void **state)
{
    (void)state;
    struct {
        uint32_t f;
        uint16_t h;
    } k[] = {
        {0x3F800000u, 0x3F80}, /* 1.0 */
        {0x3F808000u, 0x3F80}, /* 1.00390625: tie, even */
        {0x3F818000u, 0x3F82}, /* 1.01171875: tie, even */
        {0x3F808001u, 0x3F81}, /* just above the tie */
        {0x3F807FFFu, 0x3F80}, /* just below */
        {0x3F810000u, 0x3F81}, /* 1.0078125: exact */
        {0xBF818000u, 0xBF82}, /* negative tie */
        {0x7F7F7FFFu, 0x7F7F}, /* just below the overflow tie */
        {0x7F7F8000u, 0x7F80}, /* tie above the largest bf16: even is inf */
        {0x7F7FFFFFu, 0x7F80}, /* FLT_MAX */
        {0x7F800000u, 0x7F80}, /* inf */
        {0xFF800000u, 0xFF80}, {0x00000000u, 0x0000},
        {0x80000000u, 0x8000}, {0x00000001u, 0x0000}, /* smallest f32 subnormal */
        {0x00008000u, 0x0000},                        /* subnormal tie: even */
        {0x00018000u, 0x0002}, {0x00008001u, 0x0001},
        {0x007FFFFFu, 0x0080}, /* largest subnormal rounds up to FLT_MIN */
    };
    for (size_t i = 0; i < sizeof(k) / sizeof(k[0]); i++) {
        uint16_t got = gpu_f32_to_bf16(bits_f32(k[i].f));
        if (got != k[i].h) print_error("gpu_f32_to_bf16(0x%08x)\n", k[i].f);
        assert_int_equal(got, k[i].h);
        assert_int_equal(ref_f32_to_bf16(bits_f32(k[i].f)), k[i].h);
    }
    uint32_t nans[] = {0x7FC00000u, 0x7F800001u, 0xFF800001u,
                       0x7FFFFFFFu, 0x7F80FFFFu, 0xFFFFFFFFu};
    for (size_t i = 0; i < sizeof(nans) / sizeof(nans[0]); i++) {
        uint16_t h = gpu_f32_to_bf16(bits_f32(nans[i]));
        if (!bf16_is_nan(h)) print_error("f32 NaN 0x%08x -> bf16 0x%04x\n", nans[i], h);
        assert_true(bf16_is_nan(h));
        assert_int_equal(h >> 15, nans[i] >> 31);
    }
    /* every bf16 pattern: widening is exact, narrowing gives it back */
    for (uint32_t h = 0; h <= 0xffffu; h++) {
        float f = gpu_bf16_to_f32((uint16_t)h);
        assert_int_equal(f32_bits(f), h << 16);
        uint16_t back = gpu_f32_to_bf16(f);
        if (bf16_is_nan((uint16_t)h)) {
            assert_true(bf16_is_nan(back));
            assert_int_equal(back >> 15, h >> 15);
        } else {
            assert_int_equal(back, h);
        }
    }
    rng_state = 777;
    for (int i = 0; i < 1000000; i++) {
        uint64_t r = rnd();
        uint32_t u = (uint32_t)r;
        if ((r >> 32) & 1) u = (u & 0xffff0000u) | (uint32_t)(0x7fff + (r >> 40) % 3);
        float f = bits_f32(u);
        uint16_t got = gpu_f32_to_bf16(f);
        if (isnan(f)) {
            assert_true(bf16_is_nan(got));
            assert_int_equal(got >> 15, u >> 31);
            continue;
        }
        uint16_t want = ref_f32_to_bf16(f);
        if (got != want) print_error("f32 0x%08x (%a)\n", u, (double)f);
        assert_int_equal(got, want);
    }
}

/* ---- names ---- */

/* Every f16 and bf16 bit pattern (NaNs, infinities, subnormals) against a
 * few partners, through gpu_cpu_reduce (vectorised conversions, F16C on
 * x86 where the CPU has it) and through the scalar conversions element by
 * element: the same bits, and a NaN where the scalar path has one (which
 * NaN's payload an addition of two NaNs keeps is IEEE's choice to leave
 * open: compilers swap the operands, the ASan build here did). */
static void test_half_every_pattern(void **state)
{
    (void)state;
    static const uint16_t f16_partners[] = {0x0000, 0x8000, 0x3c00, 0x7c00, 0xfc00,
                                            0x7e01, 0x7c01, 0xfe7f, 0x0001, 0x7bff};
    static const uint16_t bf16_partners[] = {0x0000, 0x8000, 0x3f80, 0x7f80, 0xff80,
                                             0x7fc1, 0x7f81, 0xffbf, 0x0001, 0x7f7f};
    static uint16_t a[65536], b[65536], got[65536];
    for (int t = 0; t < 2; t++) {
        coh_dtype dt = t ? COH_BF16 : COH_F16;
        const uint16_t *partners = t ? bf16_partners : f16_partners;
        for (size_t p = 0; p < 10; p++)
            for (size_t o = 0; o < sizeof(OPS) / sizeof(OPS[0]); o++) {
                for (size_t i = 0; i < 65536; i++) {
                    a[i] = (uint16_t)i;
                    b[i] = partners[(p + i) % 10];
                }
                assert_int_equal(gpu_cpu_reduce(dt, OPS[o], got, a, b, 65536), 0);
                for (size_t i = 0; i < 65536; i++) {
                    float x = t ? gpu_bf16_to_f32(a[i]) : gpu_f16_to_f32(a[i]);
                    float y = t ? gpu_bf16_to_f32(b[i]) : gpu_f16_to_f32(b[i]);
                    float r = OPS[o] == COH_PROD  ? x * y
                              : OPS[o] == COH_MIN ? (y < x ? y : x)
                              : OPS[o] == COH_MAX ? (y > x ? y : x)
                                                  : x + y;
                    uint16_t want = t ? gpu_f32_to_bf16(r) : gpu_f32_to_f16(r);
                    bool nan = t ? bf16_is_nan(want) && bf16_is_nan(got[i])
                                 : f16_is_nan(want) && f16_is_nan(got[i]);
                    if (got[i] != want && !nan)
                        fail_msg("%s %s: 0x%04x op 0x%04x = 0x%04x, scalar 0x%04x",
                                 coh_dtype_name(dt), coh_redop_name(OPS[o]), a[i], b[i], got[i],
                                 want);
                }
            }
    }
}

static void test_dtype_names(void **state)
{
    (void)state;
    static const struct {
        coh_dtype dt;
        size_t size;
        const char *name;
    } k[] = {{COH_F32, 4, "f32"}, {COH_F64, 8, "f64"}, {COH_F16, 2, "f16"}, {COH_BF16, 2, "bf16"},
             {COH_I32, 4, "i32"}, {COH_I64, 8, "i64"}, {COH_U8, 1, "u8"}};
    assert_int_equal(sizeof(k) / sizeof(k[0]), COH_DTYPE_COUNT);
    for (size_t i = 0; i < sizeof(k) / sizeof(k[0]); i++) {
        assert_int_equal(coh_dtype_size(k[i].dt), k[i].size);
        assert_string_equal(coh_dtype_name(k[i].dt), k[i].name);
    }
    assert_int_equal(coh_dtype_size(COH_DTYPE_COUNT), 0);
    assert_int_equal(coh_dtype_size((coh_dtype)-1), 0);
    assert_string_equal(coh_dtype_name(COH_DTYPE_COUNT), "?");
    assert_string_equal(coh_dtype_name((coh_dtype)-1), "?");
    static const char *const ops[] = {"sum", "avg", "min", "max", "prod"};
    assert_int_equal(sizeof(ops) / sizeof(ops[0]), COH_REDOP_COUNT);
    for (int i = 0; i < COH_REDOP_COUNT; i++) assert_string_equal(coh_redop_name(i), ops[i]);
    assert_string_equal(coh_redop_name(COH_REDOP_COUNT), "?");
    assert_string_equal(coh_redop_name((coh_redop)-1), "?");
}

static void test_status_names(void **state)
{
    (void)state;
    static const struct {
        int code;
        const char *name, *msg;
    } k[] = {
#define ROW(name, value, msg) {value, #name, msg},
        COH_STATUS_MAP(ROW)
#undef ROW
    };
    /* the codes are 0, -1, -2, ... without gaps, and each has its own name and text */
    for (size_t i = 0; i < sizeof(k) / sizeof(k[0]); i++) {
        assert_int_equal(k[i].code, -(int)i);
        assert_string_equal(coh_status_name(k[i].code), k[i].name);
        assert_string_equal(coh_strerror(k[i].code), k[i].msg);
        assert_true(strlen(k[i].msg) > 0);
        for (size_t j = 0; j < i; j++) {
            assert_string_not_equal(coh_status_name(k[i].code), coh_status_name(k[j].code));
            assert_string_not_equal(coh_strerror(k[i].code), coh_strerror(k[j].code));
        }
    }
    assert_int_equal(sizeof(k) / sizeof(k[0]), 15);
    assert_string_equal(coh_status_name(COH_OK), "OK");
    assert_string_equal(coh_status_name(COH_EAUTH), "EAUTH");
    assert_string_equal(coh_strerror(COH_ETIMEDOUT), "timed out");
    int unknown[] = {1, 7, -15, -100, INT32_MIN, INT32_MAX};
    for (size_t i = 0; i < sizeof(unknown) / sizeof(unknown[0]); i++) {
        assert_string_equal(coh_status_name(unknown[i]), "UNKNOWN");
        assert_string_equal(coh_strerror(unknown[i]), "unknown status");
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reduce_f32),     cmocka_unit_test(test_reduce_f64),
        cmocka_unit_test(test_reduce_f16),     cmocka_unit_test(test_reduce_bf16),
        cmocka_unit_test(test_reduce_i32),     cmocka_unit_test(test_reduce_i64),
        cmocka_unit_test(test_reduce_u8),      cmocka_unit_test(test_reduce_known),
        cmocka_unit_test(test_reduce_invalid), cmocka_unit_test(test_div),
        cmocka_unit_test(test_scale),          cmocka_unit_test(test_f16_roundtrip_exhaustive),
        cmocka_unit_test(test_f16_known),      cmocka_unit_test(test_f16_random_vs_reference),
        cmocka_unit_test(test_bf16),           cmocka_unit_test(test_half_every_pattern),
        cmocka_unit_test(test_dtype_names),    cmocka_unit_test(test_status_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
