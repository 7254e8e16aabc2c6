/*
 * peers_common.h - what gloo-bench and mpi-bench share with cohort-bench: the
 * nccl-tests flags, the timing reduction (per-iteration time, max over ranks,
 * median over iterations) and the CSV row. Header-only and valid C11 and
 * C++17, so the C++ Gloo benchmark and the C MPI one print the same bytes.
 */
#ifndef PEERS_COMMON_H
#define PEERS_COMMON_H

#include <ctype.h>
#include <getopt.h>
#include <pthread.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

typedef struct pb_opts {
    size_t min_bytes, max_bytes;
    double factor;
    size_t step; /* -i: add instead of multiply */
    int iters, warmup;
    int check;
    bool csv;
    bool pct;            /* --pct: also a 'pct,...' line per size (pb_print_pct) */
    bool span;           /* --span: also a 'span,...' line per size (pb_print_span) */
    int compute_threads; /* --compute-threads: pb_compute_start */
    const char *op, *dtype;
    /* benchmark-specific extras (Gloo): NULL/0 when not given */
    const char *algo, *store, *host;
} pb_opts_t;

#define PB_COMPUTE_MAX 64

/* "4K", "64M", "1G", "4096": binary units, like nccl-tests. 0 on error. */
static inline size_t pb_parse_size(const char *s)
{
    char *end = NULL;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s) return 0;
    switch (toupper((unsigned char)*end)) {
    case 'K':
        v <<= 10;
        end++;
        break;
    case 'M':
        v <<= 20;
        end++;
        break;
    case 'G':
        v <<= 30;
        end++;
        break;
    default: break;
    }
    if (*end == 'B' || *end == 'b') end++;
    return *end ? 0 : (size_t)v;
}

static inline void pb_usage(FILE *f, const char *prog, const char *extra)
{
    fprintf(f,
            "usage: %s [options]\n"
            "  -b, --minbytes SIZE     smallest message (default 4K)\n"
            "  -e, --maxbytes SIZE     largest message (default 64M)\n"
            "  -f, --stepfactor F      size multiplier between steps (default 2)\n"
            "  -i, --stepbytes SIZE    add SIZE between steps instead of -f\n"
            "  -n, --iters N           timed iterations per size (default 20)\n"
            "  -w, --warmup_iters N    untimed iterations per size (default 5)\n"
            "  -c, --check 0|1         verify the result of an extra allreduce (default 1)\n"
            "  -o, --op sum            reduction (only sum)\n"
            "  -d, --datatype float    element type (only float, printed as f32)\n"
            "      --csv               print op,bytes,count,dtype,nranks,time_us,algbw_GBps,"
            "busbw_GBps\n"
            "      --pct               also print 'pct,bytes,p50_us,p90_us,p99_us,max_us,0,mean_us'"
            " per size\n"
            "      --span              also print 'span,bytes,p50_us,p90_us,mean_us,period_us'"
            " per size\n"
            "                          (last rank in to last rank out; one host only)\n"
            "      --compute-threads K K threads per rank compute for the whole run (a\n"
            "                          trainer's compute beside its allreduces); prints\n"
            "                          'compute,bytes,gflops' per size, all ranks\n"
            "%s",
            prog, extra ? extra : "");
}

/* Returns 0, 1 for --help (caller exits 0), or -1 on a bad flag. */
static inline int pb_parse(int argc, char **argv, pb_opts_t *o, const char *extra_help)
{
    static const struct option longopts[] = {
        {"minbytes", required_argument, NULL, 'b'},
        {"maxbytes", required_argument, NULL, 'e'},
        {"stepfactor", required_argument, NULL, 'f'},
        {"stepbytes", required_argument, NULL, 'i'},
        {"iters", required_argument, NULL, 'n'},
        {"warmup_iters", required_argument, NULL, 'w'},
        {"check", required_argument, NULL, 'c'},
        {"op", required_argument, NULL, 'o'},
        {"datatype", required_argument, NULL, 'd'},
        {"csv", no_argument, NULL, 'C'},
        {"pct", no_argument, NULL, 'P'},
        {"span", no_argument, NULL, 'T'},
        {"compute-threads", required_argument, NULL, 'K'},
        {"algo", required_argument, NULL, 'a'},
        {"store", required_argument, NULL, 'S'},
        {"host", required_argument, NULL, 'H'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    memset(o, 0, sizeof(*o));
    o->min_bytes = 4096;
    o->max_bytes = 64u << 20;
    o->factor = 2;
    o->iters = 20;
    o->warmup = 5;
    o->check = 1;
    o->op = "sum";
    o->dtype = "float";
    int c;
    while ((c = getopt_long(argc, argv, "b:e:f:i:n:w:c:o:d:a:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'b': o->min_bytes = pb_parse_size(optarg); break;
        case 'e': o->max_bytes = pb_parse_size(optarg); break;
        case 'f': o->factor = atof(optarg); break;
        case 'i': o->step = pb_parse_size(optarg); break;
        case 'n': o->iters = atoi(optarg); break;
        case 'w': o->warmup = atoi(optarg); break;
        case 'c': o->check = atoi(optarg); break;
        case 'o': o->op = optarg; break;
        case 'd': o->dtype = optarg; break;
        case 'C': o->csv = true; break;
        case 'P': o->pct = true; break;
        case 'T': o->span = true; break;
        case 'K': o->compute_threads = atoi(optarg); break;
        case 'a': o->algo = optarg; break;
        case 'S': o->store = optarg; break;
        case 'H': o->host = optarg; break;
        case 'h': pb_usage(stdout, argv[0], extra_help); return 1;
        default: pb_usage(stderr, argv[0], extra_help); return -1;
        }
    }
    if (optind < argc || o->min_bytes < 4 || o->max_bytes < o->min_bytes || o->iters < 1 ||
        o->warmup < 0 || (o->step == 0 && o->factor <= 1) || o->compute_threads < 0 ||
        o->compute_threads > PB_COMPUTE_MAX) {
        fprintf(stderr,
                "%s: bad arguments (sizes >= 4 bytes, min <= max, -n >= 1, -f > 1,"
                " --compute-threads 0-64)\n",
                argv[0]);
        return -1;
    }
    /* The check below relies on exact float sums; other ops/types are not needed to
       compare with cohort-bench's allreduce sum float. */
    if (!strcmp(o->dtype, "float") || !strcmp(o->dtype, "f32"))
        o->dtype = "f32"; /* the name cohort-bench prints (coh_dtype_name) */
    else
        o->dtype = NULL;
    if (strcmp(o->op, "sum") != 0 || !o->dtype) {
        fprintf(stderr, "%s: only -o sum -d float (f32) are supported\n", argv[0]);
        return -1;
    }
    return 0;
}

/* Next size of the sweep, the same progression as cohort-bench (the raw size is
   multiplied, the reported one rounded down to whole elements); 0 when done. */
static inline size_t pb_next_size(const pb_opts_t *o, size_t bytes)
{
    size_t next = o->step ? bytes + o->step : (size_t)ceil((double)bytes * o->factor);
    return next > o->max_bytes ? 0 : next;
}

static inline double pb_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static inline int pb_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median of the already max-reduced per-iteration times; sorts in place. */
static inline double pb_median(double *t, int n)
{
    qsort(t, (size_t)n, sizeof(*t), pb_cmp_double);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

/* The tail, in cohort-bench's --pct layout (its 'lost' field is 0 here), plus the
   mean: under CPU contention a median hides the ops that waited for a time slice. */
static inline void pb_print_pct(size_t bytes, double *t, int n)
{
    double sum = 0;
    for (int i = 0; i < n; i++) sum += t[i];
    qsort(t, (size_t)n, sizeof(*t), pb_cmp_double);
    printf("pct,%zu,%.1f,%.1f,%.1f,%.1f,0,%.1f\n", bytes, t[(n - 1) / 2], t[(int)ceil(0.9 * n) - 1],
           t[(int)ceil(0.99 * n) - 1], t[n - 1], sum / n);
}

/* One timed iteration i: its duration, and its entry and return for --span. */
static inline void pb_record(double *times, double *in, double *out, int i, double t0, double t1)
{
    times[i] = t1 - t0;
    in[i] = t0;
    out[i] = t1;
}

/*
 * --span: what an op costs once everyone is in it. The per-iteration time above
 * (the slowest rank's call) also counts how far apart the ranks entered: a rank
 * that was descheduled after its last op makes the others' next call long. Here
 * IN and OUT are every iteration's latest entry and latest return over the ranks
 * (CLOCK_MONOTONIC, the same clock in every process of one host: meaningless
 * across hosts), and the span is OUT - IN; PERIOD is rank 0's time per
 * iteration over the whole run (back to back: the throughput's reciprocal).
 * Sorts SPAN_OUT in place.
 */
static inline void pb_print_span(size_t bytes, const double *in, double *out, int n, double period)
{
    double sum = 0;
    for (int i = 0; i < n; i++) {
        out[i] -= in[i];
        sum += out[i];
    }
    qsort(out, (size_t)n, sizeof(*out), pb_cmp_double);
    printf("span,%zu,%.1f,%.1f,%.1f,%.1f\n", bytes, out[(n - 1) / 2], out[(int)ceil(0.9 * n) - 1],
           sum / n, period);
}

/* Pattern for the check: small integers, so the float sum over ranks is exact and the
   expected value is known without communication. */
static inline float pb_value(int rank, size_t i)
{
    return (float)((rank + 1) * (int)(i % 13 + 1));
}

static inline float pb_expected(int nranks, size_t i)
{
    return (float)(nranks * (nranks + 1) / 2 * (int)(i % 13 + 1));
}

static inline void pb_fill(float *buf, size_t count, int rank)
{
    for (size_t i = 0; i < count; i++) buf[i] = pb_value(rank, i);
}

static inline size_t pb_count_wrong(const float *buf, size_t count, int nranks)
{
    size_t wrong = 0;
    for (size_t i = 0; i < count; i++) wrong += buf[i] != pb_expected(nranks, i);
    return wrong;
}

static inline void pb_print_header(const pb_opts_t *o, const char *what, int nranks)
{
    if (o->csv) {
        printf("op,bytes,count,dtype,nranks,time_us,algbw_GBps,busbw_GBps\n");
    } else {
        printf("# %s: allreduce %s %s, %d ranks, %d iters, %d warm-up, check %d\n", what, o->op,
               o->dtype, nranks, o->iters, o->warmup, o->check);
        printf("# %12s %12s %6s %12s %10s %10s %8s\n", "size", "count", "type", "time(us)", "algbw",
               "busbw", "#wrong");
    }
}

/* algbw and busbw in decimal GB/s (1e9 bytes), the nccl-tests definitions. */
static inline void pb_print_row(const pb_opts_t *o, size_t bytes, int nranks, double time_us,
                                long long wrong)
{
    size_t count = bytes / sizeof(float);
    double algbw = (double)bytes / (time_us * 1e3);
    double busbw = algbw * 2.0 * (nranks - 1) / nranks;
    if (o->csv) {
        printf("%s,%zu,%zu,%s,%d,%.2f,%.4f,%.4f\n", o->op, bytes, count, o->dtype, nranks, time_us,
               algbw, busbw);
    } else {
        char w[24];
        if (wrong < 0)
            snprintf(w, sizeof(w), "N/A");
        else
            snprintf(w, sizeof(w), "%lld", wrong);
        printf("  %12zu %12zu %6s %12.2f %10.3f %10.3f %8s\n", bytes, count, o->dtype, time_us,
               algbw, busbw, w);
    }
    fflush(stdout);
}

/* CPU seconds (user + system, every thread) this process has used so far. */
static inline double pb_cpu_s(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

/* The CPU cost of a size: every rank's CPU seconds over the timed iterations
 * (summed by the caller), per decimal GB of buffer allreduced. --csv prints
 * "cpu,BYTES,S_PER_GB" after the size's row (bench/peers/run.sh joins them). */
static inline void pb_print_cpu(bool csv, int iters, size_t bytes, double cpu_s_all)
{
    double gb = (double)bytes * (double)iters / 1e9;
    double per = gb > 0 ? cpu_s_all / gb : 0;
    if (csv)
        printf("cpu,%zu,%.4f\n", bytes, per);
    else
        printf("# cpu: %.3f s per GB (all ranks)\n", per);
    fflush(stdout);
}

/* Rank and size from RANK/WORLD_SIZE, else cohortrun's COHORT_RANK/COHORT_WORLD_SIZE. */
static inline bool pb_env_rank(int *rank, int *size)
{
    const char *r = getenv("RANK"), *s = getenv("WORLD_SIZE");
    if (!r || !s) {
        r = getenv("COHORT_RANK");
        s = getenv("COHORT_WORLD_SIZE");
    }
    if (!r || !s) return false;
    *rank = atoi(r);
    *size = atoi(s);
    return *size >= 1 && *rank >= 0 && *rank < *size;
}

/*
 * Compute beside the collectives (--compute-threads K): K threads per rank
 * that compute for the whole run, as a trainer's own threads (intra-op
 * threads, the backward pass of the next bucket) do while its allreduces
 * run. Foreign busy processes (bench/contention.sh) take cores from every
 * implementation alike; threads of the rank's own process are what a waiter
 * that spins takes its cycles from. Each pass is y = 0.999 y + x over two
 * cache-resident vectors of PB_COMPUTE_N floats (2 flops an element);
 * pb_compute_flops is what the threads have done so far, so a benchmark can
 * report how much compute the collectives left them (more is better).
 * Atomics through the GCC builtins: this header is C11 and C++17.
 */
#define PB_COMPUTE_N 65536

typedef struct pb_compute {
    int n;
    int started;               /* __atomic: threads that have begun computing */
    int stop;                  /* __atomic */
    unsigned long long passes; /* __atomic: every thread's passes */
    pthread_t th[PB_COMPUTE_MAX];
} pb_compute_t;

static volatile float pb_compute_sink; /* keeps the sweeps from being optimised away */

static inline void *pb_compute_main(void *arg)
{
    pb_compute_t *c = (pb_compute_t *)arg;
    float *x = (float *)malloc(PB_COMPUTE_N * sizeof(float));
    float *y = (float *)calloc(PB_COMPUTE_N, sizeof(float));
    if (!x || !y) {
        free(x);
        free(y);
        return NULL;
    }
    for (int i = 0; i < PB_COMPUTE_N; i++) x[i] = (float)(i % 97) * 1e-3f;
    __atomic_fetch_add(&c->started, 1, __ATOMIC_RELAXED);
    while (!__atomic_load_n(&c->stop, __ATOMIC_RELAXED)) {
        for (int i = 0; i < PB_COMPUTE_N; i++) y[i] = 0.999f * y[i] + x[i];
        __atomic_fetch_add(&c->passes, 1ull, __ATOMIC_RELAXED);
    }
    pb_compute_sink = y[PB_COMPUTE_N / 2];
    free(x);
    free(y);
    return NULL;
}

/* Starts k threads (0: none) and returns once each is computing, so that the
 * first size's timed iterations do not run before them. Returns 0, or -1 when
 * a thread could not start. */
static inline int pb_compute_start(pb_compute_t *c, int k)
{
    memset(c, 0, sizeof(*c));
    for (; c->n < k; c->n++)
        if (pthread_create(&c->th[c->n], NULL, pb_compute_main, c) != 0) return -1;
    while (__atomic_load_n(&c->started, __ATOMIC_RELAXED) < k) {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    return 0;
}

static inline double pb_compute_flops(pb_compute_t *c)
{
    return (double)__atomic_load_n(&c->passes, __ATOMIC_RELAXED) * 2.0 * PB_COMPUTE_N;
}

static inline void pb_compute_stop(pb_compute_t *c)
{
    __atomic_store_n(&c->stop, 1, __ATOMIC_RELAXED);
    for (int i = 0; i < c->n; i++) pthread_join(c->th[i], NULL);
    c->n = 0;
}

/* Every rank's compute over a size's timed iterations, in Gflop/s summed
 * over ranks (the caller sums each rank's flops / seconds): "compute,BYTES,GFLOPS". */
static inline void pb_print_compute(bool csv, size_t bytes, double flops_per_s_all)
{
    if (csv)
        printf("compute,%zu,%.3f\n", bytes, flops_per_s_all / 1e9);
    else
        printf("# compute beside: %.3f Gflop/s (all ranks' compute threads)\n",
               flops_per_s_all / 1e9);
    fflush(stdout);
}

#endif /* PEERS_COMMON_H */
