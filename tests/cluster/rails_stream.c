/*
 * rails-stream - a stream of allreduces, every result checked exactly, every
 * op timed: the load of the multi-rail failover test (test_rails.sh) and of
 * bench/multirail.sh.
 *
 *   cohortrun -n 4 -- rails-stream [--bytes 4M[,16M..]] [--ops N[,N..]] [--warmup W[,W..]]
 *                                  [--stop-file PATH] [--csv] [--out-of-place]
 *
 * For every size in --bytes: W untimed ops, then N timed ones (--warmup W,
 * default 3, and --ops N, default 100: one value for every size, or one per
 * size), one at a time,
 * f32 sum, in place unless --out-of-place. Every element is a small integer
 * that changes with the op, so every sum is exact and a stale, lost or twice
 * applied byte shows. Rank 0 prints, with --csv:
 *   op,<size>,<i>,<t_start_s>,<t_end_s>,<ms>      one line per timed op, as it ends
 *   size,<size>,<n>,<median_ms>,<p10_ms>,<p90_ms>,<max_ms>,<algbw_MBps>,<busbw_MBps>
 *   stats,<failed>,<completed>                      rank 0's counters at the end
 * t_* are CLOCK_MONOTONIC seconds (the same clock as Python's time.monotonic(),
 * shared by every namespace), so a script can tell which op was in flight
 * when it cut a link. busbw = algbw * 2(n-1)/n.
 *
 * --stop-file PATH: after each timed op rank 0 looks for PATH and broadcasts
 * whether it exists (a 4-byte broadcast, timed as part of the op); every rank
 * stops the size's loop when it does (so a script ends the stream when its
 * cuts are done; --ops is then a maximum).
 *
 * Library log messages go to stderr up to level COHORT_LOG (default 2, info:
 * the "failed over" / "is back" lines of the rails).
 *
 * Exit status: 0 when every op succeeded and every result was right; 1 at the
 * first failed op or wrong element (with the op, the element and both values);
 * 2 for bad usage.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cohort.h"

static int R = -1, N;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void log_stderr(int level, const char *msg, void *arg)
{
    (void)arg;
    static const char *names[] = {"ERROR", "WARN", "INFO", "DEBUG"};
    fprintf(stderr, "%.3f %s %s\n", now_s(), names[level & 3], msg);
    fflush(stderr);
}

static void die(const char *what, int st, coh_request_t *req)
{
    fprintf(stderr, "rails-stream: FAIL rank %d: %s: %s: %s\n", R, what, coh_status_name(st),
            req ? coh_request_error(req) : coh_last_error());
    fflush(stderr);
    exit(1);
}

static int parse_size(const char *s, size_t *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || v < 0) return -1;
    if (*end == 'k' || *end == 'K')
        v *= 1024, end++;
    else if (*end == 'm' || *end == 'M')
        v *= 1024 * 1024, end++;
    else if (*end == 'g' || *end == 'G')
        v *= 1024.0 * 1024 * 1024, end++;
    if (*end == 'B' || *end == 'b') end++;
    if (*end) return -1;
    *out = (size_t)v;
    return 0;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: rails-stream [--bytes 4M[,16M,..]] [--ops N[,N,..]] [--warmup W[,W,..]] "
            "[--stop-file PATH] [--csv] [--out-of-place]\n");
    exit(2);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(const double *sorted, int n, double p)
{
    if (n == 0) return 0;
    int i = (int)floor(p * (n - 1) + 0.5);
    return sorted[i < 0 ? 0 : i >= n ? n - 1 : i];
}

/* Element j of rank r's input for op `it`: (j * 7 + r * 3 + it) mod 17, a
 * pattern of period 17 in j. The sum over ranks is exact in f32. */
static void fill(float *buf, size_t count, int rank, long it)
{
    float pat[17];
    for (int k = 0; k < 17; k++) pat[k] = (float)((k * 7 + rank * 3 + it) % 17);
    size_t j = 0;
    while (j < count) {
        size_t k0 = j % 17;
        for (size_t k = k0; k < 17 && j < count; k++, j++) buf[j] = pat[k];
    }
}

static void check(const float *buf, size_t count, long it, size_t bytes)
{
    float want[17];
    for (int k = 0; k < 17; k++) {
        long s = 0;
        for (int r = 0; r < N; r++) s += (k * 7 + r * 3 + it) % 17;
        want[k] = (float)s;
    }
    size_t j = 0;
    while (j < count) {
        size_t k0 = j % 17;
        for (size_t k = k0; k < 17 && j < count; k++, j++)
            if (buf[j] != want[k]) {
                fprintf(stderr,
                        "rails-stream: FAIL rank %d: WRONG result: size %zu op %ld element %zu: "
                        "%g, expected %g\n",
                        R, bytes, it, j, (double)buf[j], (double)want[k]);
                fflush(stderr);
                exit(1);
            }
    }
}

int main(int argc, char **argv)
{
    size_t sizes[32];
    int nsizes = 0, nops = 0, ops_of[32], ops = 100, nwarm = 0, warm_of[32], csv = 0, oop = 0;
    const char *stop_file = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--csv")) {
            csv = 1;
            continue;
        }
        if (!strcmp(a, "--out-of-place")) {
            oop = 1;
            continue;
        }
        if (i + 1 >= argc) usage();
        const char *v = argv[++i];
        if (!strcmp(a, "--bytes")) {
            char tmp[512];
            snprintf(tmp, sizeof(tmp), "%s", v);
            for (char *save = NULL, *t = strtok_r(tmp, ",", &save); t;
                 t = strtok_r(NULL, ",", &save)) {
                if (nsizes == 32 || parse_size(t, &sizes[nsizes]) || sizes[nsizes] < 4) usage();
                nsizes++;
            }
        } else if (!strcmp(a, "--ops")) {
            char tmp[512];
            snprintf(tmp, sizeof(tmp), "%s", v);
            for (char *save = NULL, *t = strtok_r(tmp, ",", &save); t;
                 t = strtok_r(NULL, ",", &save)) {
                if (nops == 32 || (ops_of[nops] = atoi(t)) < 1) usage();
                if (ops_of[nops] > ops || nops == 0) ops = ops_of[nops];
                nops++;
            }
        } else if (!strcmp(a, "--warmup")) {
            char tmp[512];
            snprintf(tmp, sizeof(tmp), "%s", v);
            for (char *save = NULL, *t = strtok_r(tmp, ",", &save); t;
                 t = strtok_r(NULL, ",", &save)) {
                if (nwarm == 32 || (warm_of[nwarm] = atoi(t)) < 0) usage();
                nwarm++;
            }
        } else if (!strcmp(a, "--stop-file")) {
            stop_file = v;
        } else {
            usage();
        }
    }
    if (nsizes == 0) sizes[nsizes++] = 4 << 20;
    if ((nops > 1 && nops != nsizes) || (nwarm > 1 && nwarm != nsizes)) usage();
    int warmup = nwarm ? warm_of[0] : 3;
    for (int s = 0; s < nsizes; s++) warm_of[s] = nwarm > 1 ? warm_of[s] : warmup;
    for (int s = 0; s < nsizes; s++) ops_of[s] = nops > 1 ? ops_of[s] : ops;
    for (int s = 0; s < nsizes; s++)
        if (ops_of[s] > ops) ops = ops_of[s];

    const char *lv = getenv("COHORT_LOG");
    coh_set_log_handler(log_stderr, NULL, lv && *lv ? atoi(lv) : COH_LOG_INFO);

    coh_ctx_t *ctx;
    coh_comm_t *world;
    int st = coh_init(NULL, &ctx);
    if (st) die("coh_init", st, NULL);
    if ((st = coh_ctx_world(ctx, &world)) || (st = coh_comm_rank(world, &R)) ||
        (st = coh_comm_size(world, &N)))
        die("world", st, NULL);

    size_t maxb = 0;
    for (int s = 0; s < nsizes; s++)
        if (sizes[s] > maxb) maxb = sizes[s];
    float *buf = malloc(maxb), *src = oop ? malloc(maxb) : NULL;
    double *ms = malloc(sizeof(double) * (size_t)ops);
    if (!buf || (oop && !src) || !ms) {
        fprintf(stderr, "rails-stream: out of memory\n");
        return 1;
    }
    if (R == 0 && csv) {
        printf("# op,size,i,t_start_s,t_end_s,ms\n"
               "# size,size,n,median_ms,p10_ms,p90_ms,max_ms,algbw_MBps,busbw_MBps\n");
        fflush(stdout);
    }
    long it = 0; /* every op's pattern differs, across sizes too */
    for (int s = 0; s < nsizes; s++) {
        size_t bytes = sizes[s], count = bytes / sizeof(float);
        int done = 0;
        for (int i = -warm_of[s]; i < ops_of[s]; i++, it++) {
            float *in = oop ? src : buf;
            fill(in, count, R, it);
            if (oop) memset(buf, 0xff, count * sizeof(float));
            coh_request_t *req;
            double t0 = now_s();
            st = coh_allreduce(world, oop ? src : NULL, buf, count, COH_F32, COH_SUM, &req);
            if (st) die("coh_allreduce", st, NULL);
            st = coh_wait(req, -1);
            if (st) {
                fprintf(stderr, "rails-stream: FAIL rank %d: size %zu op %d failed\n", R, bytes, i);
                die("allreduce", st, req);
            }
            coh_request_free(req);
            /* The stop flag's broadcast counts in the op's time, so that a
             * stall on it is not lost between two timed ops. */
            int32_t stop = 0;
            if (stop_file && i >= 0) {
                stop = R == 0 && access(stop_file, F_OK) == 0;
                if ((st = coh_broadcast(world, &stop, 1, COH_I32, 0, &req))) die("bcast", st, NULL);
                if ((st = coh_wait(req, -1))) die("stop broadcast", st, req);
                coh_request_free(req);
            }
            double t1 = now_s();
            check(buf, count, it, bytes);
            if (i < 0) continue;
            ms[done++] = (t1 - t0) * 1e3;
            if (R == 0 && csv) {
                printf("op,%zu,%d,%.6f,%.6f,%.3f\n", bytes, i, t0, t1, (t1 - t0) * 1e3);
                fflush(stdout);
            }
            if (stop) break;
        }
        qsort(ms, (size_t)done, sizeof(double), cmp_double);
        double med = pct(ms, done, 0.5);
        double alg = med > 0 ? (double)bytes / (med / 1e3) / 1e6 : 0;
        double bus = alg * 2.0 * (N - 1) / N;
        if (R == 0) {
            if (csv)
                printf("size,%zu,%d,%.3f,%.3f,%.3f,%.3f,%.2f,%.2f\n", bytes, done, med,
                       pct(ms, done, 0.1), pct(ms, done, 0.9), ms[done - 1], alg, bus);
            else
                printf("%10zu B  %4d ops  median %9.3f ms  p10 %9.3f  p90 %9.3f  max %9.3f  "
                       "algbw %8.2f MB/s  busbw %8.2f MB/s\n",
                       bytes, done, med, pct(ms, done, 0.1), pct(ms, done, 0.9), ms[done - 1], alg,
                       bus);
            fflush(stdout);
        }
    }
    coh_stats_t stats;
    if (coh_ctx_stats(ctx, &stats) == 0 && R == 0) {
        if (csv)
            printf("stats,%llu,%llu\n", (unsigned long long)stats.requests_failed,
                   (unsigned long long)stats.requests_completed);
        else
            printf("requests failed %llu, completed %llu\n",
                   (unsigned long long)stats.requests_failed,
                   (unsigned long long)stats.requests_completed);
    }
    fflush(stdout);
    if ((st = coh_finalize(ctx))) die("coh_finalize", st, NULL);
    free(buf);
    free(src);
    free(ms);
    if (R == 0) fprintf(stderr, "rails-stream: OK\n");
    return 0;
}
