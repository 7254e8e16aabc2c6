/*
 * bs_alloc.h - the one allocator of cohort.
 *
 * Every allocation goes through these functions: mimalloc in normal builds
 * (fast, thread-local heaps, frees from any thread), libc's malloc in
 * sanitizer builds, because ASan and TSan only see what goes through malloc
 * and would otherwise miss every overflow, leak and race on cohort's heap.
 */
#ifndef COH_BS_ALLOC_H
#define COH_BS_ALLOC_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(COHORT_SANITIZE)
static inline void *coh_malloc(size_t n)
{
    return malloc(n ? n : 1);
}
static inline void *coh_calloc(size_t n, size_t size)
{
    return calloc(n ? n : 1, size ? size : 1);
}
static inline void *coh_realloc(void *p, size_t n)
{
    return realloc(p, n ? n : 1);
}
static inline void *coh_aligned(size_t n, size_t align)
{
    void *p = NULL;
    return posix_memalign(&p, align, n ? n : 1) == 0 ? p : NULL;
}
static inline char *coh_strdup(const char *s)
{
    return strdup(s);
}
static inline void coh_free(void *p)
{
    free(p);
}
static inline void coh_alloc_release(void) {}
#else
#include <mimalloc.h>
static inline void *coh_malloc(size_t n)
{
    return mi_malloc(n);
}
static inline void *coh_calloc(size_t n, size_t size)
{
    return mi_calloc(n, size);
}
static inline void *coh_realloc(void *p, size_t n)
{
    return mi_realloc(p, n);
}
static inline void *coh_aligned(size_t n, size_t align)
{
    return mi_malloc_aligned(n, align);
}
static inline char *coh_strdup(const char *s)
{
    return mi_strdup(s);
}
static inline void coh_free(void *p)
{
    mi_free(p);
}
/* Hand the calling thread's free pages back to the kernel now: mimalloc
 * 2.0 keeps them (page reset is off by default) for the next allocations. */
static inline void coh_alloc_release(void)
{
    mi_collect(true);
}
#endif

static inline void *coh_zalloc(size_t n)
{
    return coh_calloc(1, n);
}
/* realloc of n elements of size bytes, NULL on overflow. */
static inline void *coh_reallocn(void *p, size_t n, size_t size)
{
    if (size && n > SIZE_MAX / size) return NULL;
    return coh_realloc(p, n * size);
}

#endif
