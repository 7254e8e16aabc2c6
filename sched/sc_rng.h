/*
 * sc_rng.h - the simulator's only source of randomness: xoshiro256** seeded
 * through splitmix64 (Blackman and Vigna). Independent streams come from
 * (seed, stream) pairs, so a worker's k-th compute time is the same under
 * every scheme for one seed (common random numbers).
 */
#ifndef COH_SC_RNG_H
#define COH_SC_RNG_H

#include <math.h>
#include <stdint.h>

typedef struct sc_rng {
    uint64_t s[4];
} sc_rng_t;

static inline uint64_t sc_splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline void sc_rng_seed(sc_rng_t *r, uint64_t seed, uint64_t stream)
{
    uint64_t x = seed * 0xD1B54A32D192ED03ull ^ (stream + 1) * 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < 4; i++) r->s[i] = sc_splitmix64(&x);
}

static inline uint64_t sc_rng_rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static inline uint64_t sc_rng_next(sc_rng_t *r)
{
    uint64_t *s = r->s;
    uint64_t result = sc_rng_rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = sc_rng_rotl(s[3], 45);
    return result;
}

/* Uniform in [0, 1). */
static inline double sc_rng_uniform(sc_rng_t *r)
{
    return (double)(sc_rng_next(r) >> 11) * 0x1.0p-53;
}

/* Standard normal (Box-Muller, no cached second value: one call, two draws). */
static inline double sc_rng_normal(sc_rng_t *r)
{
    double u1 = 1.0 - sc_rng_uniform(r); /* (0, 1] */
    double u2 = sc_rng_uniform(r);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static inline double sc_rng_exponential(sc_rng_t *r, double mean)
{
    return -mean * log(1.0 - sc_rng_uniform(r));
}

#endif
