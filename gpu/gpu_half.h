/*
 * gpu_half.h - f16 and bf16 conversions, one source for the CPU kernels
 * (gpu_cpu.c) and the CUDA kernels (gpu_kernels.cu), so that both round
 * alike: a device reduction equals the CPU's bit for bit.
 */
#ifndef COH_GPU_HALF_H
#define COH_GPU_HALF_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define GPU_HD __host__ __device__
#else
#define GPU_HD
#endif

GPU_HD static inline float gpu_bits_f32(uint32_t bits)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(bits);
#else
    float f;
    memcpy(&f, &bits, 4);
    return f;
#endif
}

GPU_HD static inline uint32_t gpu_f32_bits(float f)
{
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t x;
    memcpy(&x, &f, 4);
    return x;
#endif
}

GPU_HD static inline float gpu_f16_to_f32(uint16_t h)
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
    float f = gpu_bits_f32(bits);
    return f;
}

GPU_HD static inline uint16_t gpu_f32_to_f16(float f)
{
    uint32_t x = gpu_f32_bits(f);
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

GPU_HD static inline float gpu_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f = gpu_bits_f32(bits);
    return f;
}

GPU_HD static inline uint16_t gpu_f32_to_bf16(float f)
{
    uint32_t x = gpu_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    uint32_t lsb = (x >> 16) & 1u;
    x += 0x7fffu + lsb;
    return (uint16_t)(x >> 16);
}

#endif
