/*
 * cohort-demo - the local multi-rank demo: allreduce a range of tensor
 * sizes, check every result, and print what happened and how fast.
 *
 *   cohortrun -n 4 -- cohort-demo [--max-mib M] [--iters K]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cohort.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void log_to_stderr(int level, const char *msg, void *arg)
{
    (void)arg;
    static const char *names[] = {"error", "warn", "info", "debug"};
    fprintf(stderr, "cohort %s: %s\n", names[level & 3], msg);
}

int main(int argc, char **argv)
{
    size_t max_mib = 64;
    int iters = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--max-mib")) max_mib = (size_t)atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--iters")) iters = atoi(argv[i + 1]);
    }
    if (getenv("COHORT_LOG")) coh_set_log_handler(log_to_stderr, NULL, atoi(getenv("COHORT_LOG")));
    coh_ctx_t *ctx;
    int st = coh_init(NULL, &ctx);
    if (st) {
        fprintf(stderr, "cohort-demo: coh_init: %s: %s\n", coh_status_name(st), coh_last_error());
        return 1;
    }
    coh_comm_t *w;
    int rank, n;
    coh_ctx_world(ctx, &w);
    coh_comm_rank(w, &rank);
    coh_comm_size(w, &n);
    if (rank == 0) {
        printf("cohort-demo: %s\n", coh_ctx_describe(ctx));
        printf("cohort-demo: allreduce (sum, f32) of every rank's tensor, %d times per size; "
               "each result checked\n",
               iters);
        printf("%12s %10s %10s %10s  %s\n", "size", "time", "algbw", "busbw", "check");
    }
    int failures = 0;
    for (size_t bytes = 4096; bytes <= max_mib << 20; bytes *= 4) {
        size_t count = bytes / sizeof(float);
        float *x = malloc(bytes);
        if (!x) return 1;
        double best = 1e30;
        int ok = 1;
        for (int it = 0; it < iters; it++) {
            /* Rank r contributes r + 1 + (i mod 3): the sum is known exactly. */
            for (size_t i = 0; i < count; i++) x[i] = (float)(rank + 1 + (int)(i % 3));
            coh_request_t *req;
            double t0 = now_s();
            st = coh_allreduce(w, NULL, x, count, COH_F32, COH_SUM, &req);
            if (!st) st = coh_wait(req, -1);
            double dt = now_s() - t0;
            if (st) {
                fprintf(stderr, "cohort-demo rank %d: allreduce of %zu bytes failed: %s\n", rank,
                        bytes, coh_request_error(req));
                return 1;
            }
            coh_request_free(req);
            if (dt < best) best = dt;
            for (size_t i = 0; i < count && ok; i++)
                ok = x[i] == (float)(n * (n + 1) / 2 + n * (int)(i % 3));
        }
        /* Every rank's check, and the slowest rank's best time. */
        float agree[2] = {(float)!ok, (float)best};
        coh_allreduce_sync(w, NULL, agree, 2, COH_F32, COH_MAX);
        failures += agree[0] != 0;
        if (rank == 0) {
            double algbw = (double)bytes / agree[1] / 1e9;
            char size[32];
            if (bytes >= 1 << 20)
                snprintf(size, sizeof(size), "%zu MiB", bytes >> 20);
            else
                snprintf(size, sizeof(size), "%zu KiB", bytes >> 10);
            printf("%12s %8.3f ms %6.2f GB/s %6.2f GB/s  %s\n", size, agree[1] * 1e3, algbw,
                   algbw * 2 * (n - 1) / n, agree[0] ? "WRONG" : "ok");
        }
        free(x);
    }
    if (rank == 0)
        printf("cohort-demo: %d ranks, %s\n", n,
               failures ? "SOME RESULTS WERE WRONG" : "all results correct");
    coh_finalize(ctx);
    return failures ? 1 : 0;
}
