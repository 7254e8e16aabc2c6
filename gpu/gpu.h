/*
 * gpu.h - reduction kernels and device support.
 *
 * gpu/ owns the arithmetic of reductions: the CPU kernels used when no GPU is
 * present (and for host-staged data), the f16/bf16 conversions, and, where
 * the CUDA toolkit is installed, the device probe (gpu_cuda.c). Kernels are
 * pure functions of their arguments: no I/O, no allocation, callable from
 * any thread.
 */
#ifndef COH_GPU_H
#define COH_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "cohort.h"

/* dst[i] = a[i] op b[i] for i < n. dst may be a or b (exactly), never a
 * partial overlap. COH_AVG reduces as COH_SUM (the division is gpu_cpu_div,
 * applied once at the end). Returns 0 or COH_EINVAL. */
int gpu_cpu_reduce(coh_dtype dtype, coh_redop op, void *dst, const void *a, const void *b,
                   size_t n);
/* buf[i] = the identity of op (x op identity == x): -0.0 for a float sum
 * (so -0.0 survives), 0 for an integer sum, 1 for a product, the type's
 * largest value (+inf) for MIN, its smallest (-inf) for MAX. A relay's
 * contribution to a ring it forwards for (AdapCC's has-reduce = 0). */
int gpu_cpu_fill_identity(coh_dtype dtype, coh_redop op, void *buf, size_t n);
/* buf[i] /= divisor; integer types truncate toward zero. */
int gpu_cpu_div(coh_dtype dtype, void *buf, size_t n, double divisor);
/* buf[i] *= factor; integer types round to nearest. */
int gpu_cpu_scale(coh_dtype dtype, void *buf, size_t n, double factor);

float gpu_f16_to_f32(uint16_t h);
uint16_t gpu_f32_to_f16(float f); /* round to nearest even, overflow to inf */
float gpu_bf16_to_f32(uint16_t h);
uint16_t gpu_f32_to_bf16(float f); /* round to nearest even, NaN stays NaN */

/* Does this build have CUDA kernels, and does the process see a GPU? */
int gpu_cuda_built(void);
int gpu_device_count(void);

#endif
