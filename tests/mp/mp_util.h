/*
 * Helpers for multi-process tests run under cohortrun: init from the
 * environment, checks that print both values and the rank, and a failure
 * exit that cohortrun turns into a failed test.
 */
#ifndef COH_MP_UTIL_H
#define COH_MP_UTIL_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "cohort.h"

static int mp_rank = -1;

#define MP_FAIL(...)                                                                               \
    do {                                                                                           \
        fprintf(stderr, "FAIL rank %d %s:%d: ", mp_rank, __FILE__, __LINE__);                      \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fprintf(stderr, "\n");                                                                     \
        exit(1);                                                                                   \
    } while (0)

#define MP_OK(expr)                                                                                \
    do {                                                                                           \
        int mp__s = (expr);                                                                        \
        if (mp__s != 0)                                                                            \
            MP_FAIL("%s returned %s: %s", #expr, coh_status_name(mp__s), coh_last_error());        \
    } while (0)

#define MP_EQ_INT(a, b)                                                                            \
    do {                                                                                           \
        long long mp__a = (long long)(a), mp__b = (long long)(b);                                  \
        if (mp__a != mp__b) MP_FAIL("%s == %s: %lld != %lld", #a, #b, mp__a, mp__b);               \
    } while (0)

static inline void mp_log(int level, const char *msg, void *arg)
{
    (void)arg;
    fprintf(stderr, "cohort[%d]: %s\n", level, msg);
}

/* COHORT_LOG=LEVEL (0-3): the library's messages on stderr. */
static inline coh_ctx_t *mp_init(coh_comm_t **world, int *rank, int *size)
{
    coh_ctx_t *ctx;
    if (getenv("COHORT_LOG")) coh_set_log_handler(mp_log, NULL, atoi(getenv("COHORT_LOG")));
    MP_OK(coh_init(NULL, &ctx));
    MP_OK(coh_ctx_world(ctx, world));
    MP_OK(coh_comm_rank(*world, rank));
    MP_OK(coh_comm_size(*world, size));
    mp_rank = *rank;
    return ctx;
}

/* Seconds on the monotonic clock. */
static inline double mp_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Minor page faults of the whole process so far (every thread). */
static inline long mp_minflt(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_minflt;
}

/* qsort order for long. */
static inline int mp_cmp_long(const void *a, const void *b)
{
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

static inline int mp_wait(coh_request_t *req)
{
    int st = coh_wait(req, -1);
    if (st != 0) MP_FAIL("request failed: %s: %s", coh_status_name(st), coh_request_error(req));
    coh_request_free(req);
    return st;
}

#endif
