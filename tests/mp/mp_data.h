/*
 * Checkable data for collectives: the value every rank contributes at every
 * index is a small integer derived from (dtype, op, rank, index, seed), so
 * any rank can compute any other's input and the exact result. Sums and
 * products stay exact in every dtype for the world size given (bf16 holds
 * integers up to 256, u8 up to 255): integer dtypes are checked exactly,
 * float ones within a relative tolerance only the average (one division,
 * one rounding) needs. Used by test_collectives and cohort-load.
 */
#ifndef COH_MP_DATA_H
#define COH_MP_DATA_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include "cohort.h"
#include "gpu/gpu.h"

/* The value rank r contributes at index i in a world of n ranks. */
static inline double mpd_val(coh_dtype dt, coh_redop op, int r, size_t i, unsigned seed, int n)
{
    unsigned k = (unsigned)r * 7u + (unsigned)(i % 1000003) * 13u + seed * 5u;
    if (op == COH_PROD) { /* +-1, +-2: at most 2^7, exact and in range everywhere */
        static const double p[] = {1, 2, -1, -2};
        double v = n <= 7 ? p[k % 4] : (k % 2 ? -1.0 : 1.0);
        return dt == COH_U8 ? fabs(v) : v;
    }
    int amp = n <= 15 ? 8 : (127 / n > 1 ? 127 / n : 1);
    double v = (double)(k % (unsigned)(2 * amp + 1)) - amp;
    return dt == COH_U8 ? v + amp : v;
}

static inline void mpd_put(void *buf, coh_dtype dt, size_t i, double v)
{
    switch (dt) {
    case COH_F32: ((float *)buf)[i] = (float)v; break;
    case COH_F64: ((double *)buf)[i] = v; break;
    case COH_F16: ((uint16_t *)buf)[i] = gpu_f32_to_f16((float)v); break;
    case COH_BF16: ((uint16_t *)buf)[i] = gpu_f32_to_bf16((float)v); break;
    case COH_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case COH_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case COH_U8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    default: break;
    }
}

static inline double mpd_get(const void *buf, coh_dtype dt, size_t i)
{
    switch (dt) {
    case COH_F32: return ((const float *)buf)[i];
    case COH_F64: return ((const double *)buf)[i];
    case COH_F16: return gpu_f16_to_f32(((const uint16_t *)buf)[i]);
    case COH_BF16: return gpu_bf16_to_f32(((const uint16_t *)buf)[i]);
    case COH_I32: return ((const int32_t *)buf)[i];
    case COH_I64: return (double)((const int64_t *)buf)[i];
    case COH_U8: return ((const uint8_t *)buf)[i];
    default: return NAN;
    }
}

static inline bool mpd_is_int(coh_dtype dt)
{
    return dt == COH_I32 || dt == COH_I64 || dt == COH_U8;
}

/* op over ranks 0..n-1 at index i. */
static inline double mpd_expect(coh_dtype dt, coh_redop op, size_t i, unsigned seed, int n)
{
    double acc = mpd_val(dt, op, 0, i, seed, n);
    for (int r = 1; r < n; r++) {
        double v = mpd_val(dt, op, r, i, seed, n);
        switch (op) {
        case COH_SUM:
        case COH_AVG: acc += v; break;
        case COH_PROD: acc *= v; break;
        case COH_MIN: acc = v < acc ? v : acc; break;
        case COH_MAX: acc = v > acc ? v : acc; break;
        default: break;
        }
    }
    if (op == COH_AVG) acc = mpd_is_int(dt) ? trunc(acc / n) : acc / n;
    return acc;
}

/* got is want within dt's tolerance. */
static inline bool mpd_close(coh_dtype dt, double got, double want)
{
    double tol = 0;
    switch (dt) {
    case COH_F32: tol = 1e-6; break;
    case COH_F64: tol = 1e-12; break;
    case COH_F16: tol = 2e-3; break;
    case COH_BF16: tol = 1e-2; break;
    default: break;
    }
    double scale = fabs(want) > 1 ? fabs(want) : 1;
    return fabs(got - want) <= tol * scale;
}

#endif
