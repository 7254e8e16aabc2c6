/*
 * gpu.h - reduction kernels and device support.
 *
 * gpu/ owns the arithmetic of reductions: the CPU kernels (used for host
 * data and host-staged device data), the f16/bf16 conversions shared with
 * the CUDA kernels (gpu_half.h, gpu_kernels.cu), and the device interface
 * (gpu_dev.h: memory, streams, events, copies) with its CUDA implementation
 * and a host emulation. Kernels are pure functions of their arguments: no
 * I/O, no allocation, callable from any thread.
 */
#ifndef COH_GPU_H
#define COH_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "cohort.h"
#include "gpu/gpu_half.h" /* gpu_f16_to_f32 and the other conversions */

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
/* 0 when gpu_cpu_div takes divisor for dtype (finite, non-zero; an
 * integer in the type's range for integer types), else COH_EINVAL. */
int gpu_div_check(coh_dtype dtype, double divisor);
/* buf[i] /= divisor; integer types truncate toward zero. */
int gpu_cpu_div(coh_dtype dtype, void *buf, size_t n, double divisor);
/* buf[i] *= factor; integer types round to nearest. */
int gpu_cpu_scale(coh_dtype dtype, void *buf, size_t n, double factor);

/* Does this build have CUDA kernels, and does the process see a GPU? */
int gpu_cuda_built(void);
int gpu_device_count(void);

#endif
