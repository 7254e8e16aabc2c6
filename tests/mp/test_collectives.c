/*
 * Every collective, dtype and op across the awkward counts (0, 1, fewer
 * than the ranks, not divisible by them, small and ring-sized, several
 * pipeline chunks), in place and out of place, several ops in flight at once.
 *
 * Data are small integers so that sums and products are exact in every
 * dtype (bf16 holds integers up to 256 exactly): integer dtypes are checked
 * exactly, float dtypes within a relative tolerance (f32 1e-6, f64 1e-12,
 * f16 2e-3, bf16 1e-2) that only the average (one division, one rounding)
 * needs.
 *
 *   test_collectives            the full matrix
 *   test_collectives --big MiB  one large f32 allreduce, checked exactly
 *   test_collectives --faults   large ops of each kind repeated: the process's
 *                               page faults per op stay low once warm
 *   test_collectives --overlap  two allreduces in flight, the first waited for,
 *                               then a pause: the second is not left behind
 *   test_collectives --small-plan PLAN
 *                               4 KiB allreduces: the plan that ran, told by
 *                               what the last rank sent per op, is PLAN (rd,
 *                               star, or auto: what the link model picks on
 *                               this host, sc_plan.c)
 */
#include <unistd.h>

#include "mp_data.h"
#include "mp_util.h"

static int R, N;
static coh_comm_t *W;
static coh_ctx_t *CTX;
/* MP_DECLARE=1: allreduce buffers are declared (coh_mem_register) for the
 * op, so verbs rails write them without a copy (mp.verbs.zcopy). */
static bool DECLARE;

static void declare(const void *p, size_t n)
{
    if (DECLARE && n) MP_OK(coh_mem_register(CTX, p, n));
}

static void undeclare(const void *p, size_t n)
{
    if (DECLARE && n) MP_OK(coh_mem_deregister(CTX, p));
}

static const coh_dtype DTYPES[] = {COH_F32, COH_F64, COH_F16, COH_BF16, COH_I32, COH_I64, COH_U8};
static const coh_redop OPS[] = {COH_SUM, COH_AVG, COH_MIN, COH_MAX, COH_PROD};

/* mp_data.h's values for this world. */
static double val(coh_dtype dt, coh_redop op, int r, size_t i, int seed)
{
    return mpd_val(dt, op, r, i, (unsigned)seed, N);
}

#define put mpd_put
#define get mpd_get

static double expect(coh_dtype dt, coh_redop op, size_t i, int seed, int nranks)
{
    return mpd_expect(dt, op, i, (unsigned)seed, nranks);
}

static void check_val(const char *what, coh_dtype dt, coh_redop op, size_t count, size_t i,
                      double got, double want)
{
    if (!mpd_close(dt, got, want))
        MP_FAIL("%s %s %s count=%zu: element %zu is %.9g, expected %.9g", what, coh_dtype_name(dt),
                coh_redop_name(op), count, i, got, want);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) MP_FAIL("out of memory (%zu bytes)", n);
    return p;
}

static void test_allreduce(coh_dtype dt, coh_redop op, size_t count, bool inplace, int seed)
{
    size_t es = coh_dtype_size(dt);
    char *send = xmalloc(count * es), *recv = xmalloc(count * es);
    for (size_t i = 0; i < count; i++) put(send, dt, i, val(dt, op, R, i, seed));
    if (inplace) memcpy(recv, send, count * es);
    if (!inplace) declare(send, count * es);
    declare(recv, count * es);
    coh_request_t *req;
    MP_OK(coh_allreduce(W, inplace ? recv : send, recv, count, dt, op, &req));
    mp_wait(req);
    if (!inplace) undeclare(send, count * es);
    undeclare(recv, count * es);
    for (size_t i = 0; i < count; i++)
        check_val(inplace ? "allreduce(in place)" : "allreduce", dt, op, count, i, get(recv, dt, i),
                  expect(dt, op, i, seed, N));
    /* Out of place must leave the input alone. */
    for (size_t i = 0; !inplace && i < count; i++)
        if (get(send, dt, i) != val(dt, op, R, i, seed))
            MP_FAIL("allreduce modified its send buffer at %zu", i);
    free(send);
    free(recv);
}

static void test_broadcast(coh_dtype dt, size_t count, int root)
{
    size_t es = coh_dtype_size(dt);
    char *buf = xmalloc(count * es);
    for (size_t i = 0; i < count; i++)
        put(buf, dt, i, R == root ? val(dt, COH_SUM, root, i, 3) : 99);
    coh_request_t *req;
    MP_OK(coh_broadcast(W, buf, count, dt, root, &req));
    mp_wait(req);
    for (size_t i = 0; i < count; i++)
        if (get(buf, dt, i) != val(dt, COH_SUM, root, i, 3))
            MP_FAIL("broadcast %s count=%zu root=%d: element %zu is %g", coh_dtype_name(dt), count,
                    root, i, get(buf, dt, i));
    free(buf);
}

static void test_allgather(coh_dtype dt, size_t count, bool inplace)
{
    size_t es = coh_dtype_size(dt);
    char *send = xmalloc(count * es), *recv = xmalloc(count * es * (size_t)N);
    for (size_t i = 0; i < count * (size_t)N; i++) put(recv, dt, i, 99);
    char *mine = inplace ? recv + (size_t)R * count * es : send;
    for (size_t i = 0; i < count; i++) put(mine, dt, i, val(dt, COH_SUM, R, i, 4));
    coh_request_t *req;
    MP_OK(coh_allgather(W, inplace ? NULL : send, recv, count, dt, &req));
    mp_wait(req);
    for (int r = 0; r < N; r++)
        for (size_t i = 0; i < count; i++)
            if (get(recv, dt, (size_t)r * count + i) != val(dt, COH_SUM, r, i, 4))
                MP_FAIL("allgather %s count=%zu%s: block %d element %zu is %g", coh_dtype_name(dt),
                        count, inplace ? " in place" : "", r, i,
                        get(recv, dt, (size_t)r * count + i));
    free(send);
    free(recv);
}

/* mode 0: out of place; 1: sendbuf NULL (input in recvbuf); 2: NCCL's
 * recvbuf = sendbuf + rank*recvcount. */
static void test_reduce_scatter(coh_dtype dt, coh_redop op, size_t count, int mode)
{
    size_t es = coh_dtype_size(dt), full = count * (size_t)N;
    char *in = xmalloc(full * es), *out = xmalloc(count * es);
    /* Element j of the full input on rank r is val(r, j). */
    for (size_t j = 0; j < full; j++) put(in, dt, j, val(dt, op, R, j, 5));
    coh_request_t *req;
    const char *res;
    if (mode == 0) {
        MP_OK(coh_reduce_scatter(W, in, out, count, dt, op, &req));
        res = out;
    } else if (mode == 1) {
        MP_OK(coh_reduce_scatter(W, NULL, in, count, dt, op, &req));
        res = in + (size_t)R * count * es;
    } else {
        MP_OK(coh_reduce_scatter(W, in, in + (size_t)R * count * es, count, dt, op, &req));
        res = in + (size_t)R * count * es;
    }
    mp_wait(req);
    for (size_t i = 0; i < count; i++)
        check_val("reduce_scatter", dt, op, count, i, get(res, dt, i),
                  expect(dt, op, (size_t)R * count + i, 5, N));
    free(in);
    free(out);
}

/* Several different ops in flight at once: matched by sequence, not by order. */
static void test_concurrent(void)
{
    enum { K = 8 };
    size_t counts[K] = {1, 7, 100, 5000, 70000, 3, 250000, 0};
    float *bufs[K];
    coh_request_t *reqs[K];
    for (int k = 0; k < K; k++) {
        bufs[k] = xmalloc(counts[k] * sizeof(float));
        for (size_t i = 0; i < counts[k]; i++) bufs[k][i] = (float)val(COH_F32, COH_SUM, R, i, k);
        MP_OK(coh_allreduce(W, NULL, bufs[k], counts[k], COH_F32, COH_SUM, &reqs[k]));
    }
    /* Wait out of order too. */
    for (int k = K - 1; k >= 0; k--) mp_wait(reqs[k]);
    for (int k = 0; k < K; k++) {
        for (size_t i = 0; i < counts[k]; i++)
            check_val("concurrent allreduce", COH_F32, COH_SUM, counts[k], i, bufs[k][i],
                      expect(COH_F32, COH_SUM, i, k, N));
        free(bufs[k]);
    }
}

static void test_big(size_t mib)
{
    size_t count = mib * (1u << 20) / sizeof(float);
    float *buf = xmalloc(count * sizeof(float));
    for (size_t i = 0; i < count; i++) buf[i] = (float)val(COH_F32, COH_SUM, R, i, 9);
    declare(buf, count * sizeof(float));
    coh_request_t *req;
    MP_OK(coh_allreduce(W, NULL, buf, count, COH_F32, COH_SUM, &req));
    double us;
    int st = coh_wait(req, -1);
    undeclare(buf, count * sizeof(float));
    if (st) MP_FAIL("big allreduce: %s", coh_request_error(req));
    coh_request_time_us(req, &us);
    coh_request_free(req);
    for (size_t i = 0; i < count; i++)
        if (buf[i] != (float)expect(COH_F32, COH_SUM, i, 9, N))
            MP_FAIL("big allreduce: element %zu is %g, expected %g", i, buf[i],
                    expect(COH_F32, COH_SUM, i, 9, N));
    if (R == 0)
        printf("big allreduce of %zu MiB over %d ranks: %.1f ms, checked\n", mib, N, us / 1e3);
    free(buf);
}

/* Rank N-1 sends its 4 KiB once per op in the star (to rank 0) and
 * log2(N) times in recursive doubling (4 ranks: twice), so its bytes sent
 * per op say which plan ran. Auto on one host: the star where the ranks'
 * messages cost the cores more than the star's longer path (sc_plan.c,
 * test_plan's test_cost_small): from 4 ranks on 2 cores. */
static void test_small_plan(const char *want)
{
    if (N != 4) MP_FAIL("--small-plan runs on 4 ranks, not %d", N);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    bool star = !strcmp(want, "star") || (!strcmp(want, "auto") && cpus <= 2);
    enum { COUNT = 1024, NOPS = 200 };
    float x[COUNT], y[COUNT];
    coh_stats_t s0, s1;
    for (int it = 0; it < 20 + NOPS; it++) {
        if (it == 20) MP_OK(coh_ctx_stats(CTX, &s0));
        for (size_t i = 0; i < COUNT; i++) x[i] = (float)val(COH_F32, COH_SUM, R, i, it);
        coh_request_t *req;
        MP_OK(coh_allreduce(W, x, y, COUNT, COH_F32, COH_SUM, &req));
        if (coh_wait(req, -1)) MP_FAIL("allreduce %d: %s", it, coh_request_error(req));
        coh_request_free(req);
        for (size_t i = 0; i < COUNT; i++)
            if (y[i] != (float)expect(COH_F32, COH_SUM, i, it, N))
                MP_FAIL("allreduce %d: element %zu is %g, expected %g", it, i, y[i],
                        expect(COH_F32, COH_SUM, i, it, N));
    }
    MP_OK(coh_ctx_stats(CTX, &s1));
    double per = (double)(s1.bytes_sent - s0.bytes_sent) / NOPS / (COUNT * sizeof(float));
    if (R == N - 1) {
        printf("%s on %ld cpus: rank %d sent %.2fx the buffer per op (%s expected)\n", want, cpus,
               R, per, star ? "star: 1" : "rd: 2");
        if (star ? !(per > 0.9 && per < 1.5) : !(per > 1.9 && per < 2.5))
            MP_FAIL("the %s plan did not run: %.2fx the buffer sent per op", star ? "star" : "rd",
                    per);
    }
}

static const char *const FAULT_OPS[] = {"allreduce", "reduce_scatter", "allgather", "broadcast"};

/* Runs op kind (FAULT_OPS) WARM + TIMED times on count floats per rank and
 * returns this rank's page faults in the median timed op (*worst: the most
 * in one). Rank late posts each op sleep_ms after the others. */
static long median_faults(int kind, const float *in, float *out, size_t count, int late,
                          int sleep_ms, long *worst)
{
    enum { WARM = 3, TIMED = 9 };
    long faults[TIMED];
    for (int it = 0; it < WARM + TIMED; it++) {
        /* Counted from before the pause: the loop thread stashes meanwhile. */
        long f0 = mp_minflt();
        if (R == late) {
            struct timespec pause = {0, sleep_ms * 1000L * 1000L};
            nanosleep(&pause, NULL);
        }
        coh_request_t *req;
        switch (kind) {
        case 0: MP_OK(coh_allreduce(W, in, out, count, COH_F32, COH_SUM, &req)); break;
        case 1: MP_OK(coh_reduce_scatter(W, in, out, count, COH_F32, COH_SUM, &req)); break;
        case 2: MP_OK(coh_allgather(W, in, out, count, COH_F32, &req)); break;
        default: MP_OK(coh_broadcast(W, out, count, COH_F32, 0, &req)); break;
        }
        mp_wait(req);
        if (it >= WARM) faults[it - WARM] = mp_minflt() - f0;
    }
    /* The median op: a rank that gets further ahead than before stashes
     * its peers' frames in new buffers once (a burst in one op). */
    qsort(faults, TIMED, sizeof(long), mp_cmp_long);
    *worst = faults[TIMED - 1];
    return faults[TIMED / 2];
}

/* The same large op again and again must not page its memory in every
 * time: a buffer the op allocates and frees is handed back to the kernel by
 * the allocator and faulted in again on the next op, which made a 16 MiB
 * reduce-scatter on 4 ranks 4-5x slower (en_exec.c, scratch_take). Every
 * buffer here is the test's and touched before; what faults while the ops
 * run is the runtime's. Budget: an eighth of a block's pages in the median
 * op. */
static void test_faults(void)
{
    const size_t count = 1u << 20; /* per rank: a 4 MiB block */
    const size_t big = 2 * count;  /* the late round's 8 MiB blocks */
    float *in = xmalloc(big * (size_t)N * sizeof(float));
    float *out = xmalloc(big * (size_t)N * sizeof(float));
    for (size_t i = 0; i < big * (size_t)N; i++) in[i] = out[i] = (float)(i % 7);
    const long budget = (long)(count * sizeof(float) / 4096 / 8);
    for (int kind = 0; kind < 4; kind++) {
        long worst, med = median_faults(kind, in, out, count, -1, 0, &worst);
        printf("rank %d: %s of %zu floats per rank: %ld page faults in the median op, %ld in the "
               "worst (budget %ld)\n",
               R, FAULT_OPS[kind], count, med, worst, budget);
        if (med > budget)
            MP_FAIL("%s: %ld page faults in the median op once warm, budget %ld", FAULT_OPS[kind],
                    med, budget);
    }
    /* Rank 0 posts late: its peers' frames arrive first and are stashed
     * (en_exec.c, stash_or_block), more than 16 of them and over 16 MiB in
     * each op. Their buffers are kept for the next op's; when at most 16
     * were, rank 0 allocated (and faulted in) the rest again in every op
     * (one 4 MiB ASan CI run: 329 faults in the median reduce-scatter). */
    long worst, med = median_faults(2, in, out, big, 0, 200, &worst);
    printf("rank %d: allgather of %zu floats per rank, rank 0 late: %ld page faults in the median "
           "op, %ld in the worst (budget %ld)\n",
           R, big, med, worst, budget);
    if (med > budget)
        MP_FAIL("late allgather: %ld page faults in the median op once warm, budget %ld", med,
                budget);
    free(in);
    free(out);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Two allreduces in flight (a trainer's buckets); the caller waits for the
 * first, then computes (sleeps here) before it waits for the second. The
 * second must go on meanwhile: the waiter ran the rail's loop while its
 * thread slept, and leaving with its own op done it did not wake that
 * thread, which looked again only after up to 20 ms (RX_PARK_NS). The
 * second's time past the first's, median of the trials, stays under 8 ms
 * (about 1-3 ms of transfer at 2 ranks). */
static void test_overlap(void)
{
    enum { TRIALS = 15 };
    const size_t count = 1u << 20; /* 4 MiB each */
    float *a = xmalloc(count * sizeof(float)), *b = xmalloc(count * sizeof(float));
    double lag[TRIALS];
    for (int t = 0; t < TRIALS + 2; t++) {
        for (size_t i = 0; i < count; i++) a[i] = b[i] = (float)val(COH_F32, COH_SUM, R, i, t);
        coh_request_t *ra, *rb;
        MP_OK(coh_allreduce(W, NULL, a, count, COH_F32, COH_SUM, &ra));
        MP_OK(coh_allreduce(W, NULL, b, count, COH_F32, COH_SUM, &rb));
        if (coh_wait(ra, -1)) MP_FAIL("first allreduce: %s", coh_request_error(ra));
        struct timespec pause = {0, 40 * 1000 * 1000};
        nanosleep(&pause, NULL);
        if (coh_wait(rb, -1)) MP_FAIL("second allreduce: %s", coh_request_error(rb));
        double ta, tb;
        coh_request_time_us(ra, &ta);
        coh_request_time_us(rb, &tb);
        coh_request_free(ra);
        coh_request_free(rb);
        for (size_t i = 0; i < count; i++)
            if (a[i] != (float)expect(COH_F32, COH_SUM, i, t, N) ||
                b[i] != (float)expect(COH_F32, COH_SUM, i, t, N))
                MP_FAIL("overlap trial %d: element %zu wrong", t, i);
        if (t >= 2) lag[t - 2] = (tb - ta) / 1e3; /* ms */
    }
    qsort(lag, TRIALS, sizeof(double), cmp_double);
    double med = lag[TRIALS / 2];
    printf("rank %d: the second allreduce ended %.2f ms after the first (median of %d; max "
           "%.2f)\n",
           R, med, TRIALS, lag[TRIALS - 1]);
    if (med > 8.0) MP_FAIL("the second allreduce lagged %.2f ms behind the first (median)", med);
    free(a);
    free(b);
}

int main(int argc, char **argv)
{
    coh_ctx_t *ctx = mp_init(&W, &R, &N);
    CTX = ctx;
    DECLARE = getenv("MP_DECLARE") && atoi(getenv("MP_DECLARE")) == 1;
    if (argc > 1 && !strcmp(argv[1], "--overlap")) {
        test_overlap();
        MP_OK(coh_finalize(ctx));
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "--faults")) {
        test_faults();
        MP_OK(coh_finalize(ctx));
        return 0;
    }
    if (argc > 2 && !strcmp(argv[1], "--small-plan")) {
        test_small_plan(argv[2]);
        MP_OK(coh_finalize(ctx));
        return 0;
    }
    if (argc > 2 && !strcmp(argv[1], "--big")) {
        test_big((size_t)atoi(argv[2]));
        MP_OK(coh_finalize(ctx));
        return 0;
    }
    const size_t counts[] = {0, 1, (size_t)N - 1, (size_t)N + 1, 1000, 16411, 70001};
    int seed = 0;
    for (size_t d = 0; d < sizeof(DTYPES) / sizeof(DTYPES[0]); d++)
        for (size_t o = 0; o < sizeof(OPS) / sizeof(OPS[0]); o++)
            for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
                test_allreduce(DTYPES[d], OPS[o], counts[c], false, seed++);
                test_allreduce(DTYPES[d], OPS[o], counts[c], true, seed++);
            }
    /* Large enough for several pipeline chunks (1 MiB) per ring segment. */
    test_allreduce(COH_F32, COH_SUM, (size_t)N * 600000 + 3, false, 1);
    test_allreduce(COH_F64, COH_MAX, (size_t)N * 300000 + 1, true, 2);
    if (R == 0) printf("allreduce: ok\n");

    for (size_t d = 0; d < sizeof(DTYPES) / sizeof(DTYPES[0]); d++)
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
            test_broadcast(DTYPES[d], counts[c], (int)(c % (size_t)N));
    test_broadcast(COH_F32, 3000000, N - 1);
    if (R == 0) printf("broadcast: ok\n");

    for (size_t d = 0; d < sizeof(DTYPES) / sizeof(DTYPES[0]); d++)
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
            test_allgather(DTYPES[d], counts[c], false);
            test_allgather(DTYPES[d], counts[c], true);
        }
    test_allgather(COH_I32, 700001, false);
    if (R == 0) printf("allgather: ok\n");

    for (size_t d = 0; d < sizeof(DTYPES) / sizeof(DTYPES[0]); d++)
        for (size_t o = 0; o < sizeof(OPS) / sizeof(OPS[0]); o++)
            for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
                test_reduce_scatter(DTYPES[d], OPS[o], counts[c], (int)(c % 3));
    test_reduce_scatter(COH_F32, COH_SUM, 400003, 0);
    test_reduce_scatter(COH_I64, COH_SUM, 300001, 1);
    if (R == 0) printf("reduce_scatter: ok\n");

    for (int k = 0; k < 5; k++) {
        coh_request_t *req;
        MP_OK(coh_barrier(W, &req));
        mp_wait(req);
    }
    test_concurrent();
    if (R == 0) printf("barrier, concurrent: ok\n");
    if (DECLARE) { /* MP_EXPECT_ZCOPY=1: verbs rails wrote from the declarations */
        coh_stats_t st;
        MP_OK(coh_ctx_stats(ctx, &st));
        bool want = getenv("MP_EXPECT_ZCOPY") && atoi(getenv("MP_EXPECT_ZCOPY")) == 1;
        printf("rank %d: %llu bytes sent without a copy, %llu registrations\n", R,
               (unsigned long long)st.zcopy_bytes_sent, (unsigned long long)st.mem_registrations);
        if (want != (st.zcopy_bytes_sent > 0))
            MP_FAIL("zero copy: %llu bytes, expected %s", (unsigned long long)st.zcopy_bytes_sent,
                    want ? "some" : "none");
    }
    MP_OK(coh_finalize(ctx));
    return 0;
}
