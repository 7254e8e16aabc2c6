/*
 * Bounded-loss allreduces (coh_allreduce_ex with a loss bound) on udp rails
 * (COHORT_NICS=lo:udp), under cohortrun.
 *
 *   test_udp exact ITERS   bounds of 1e-9 (every byte, asked again if need be):
 *                          results equal the reliable allreduce's,
 *                          every byte arrived, the datagram path was used
 *   test_udp spray ITERS   small ops (one slice each): sprayed (several udp
 *                          rails, COHORT_UDP_SPRAY on), every op's datagrams
 *                          leave on every udp rail; else on one rail
 *   test_udp lossy ITERS PUSH PULL [MIN]
 *                          with COHORT_TEST_UDP_DROP_PPM: every op completes;
 *                          each value decodes to a set of contributors (rank r
 *                          adds 2^r), the owner always in it; the elements
 *                          that miss a contributor or hold this rank's own
 *                          value account exactly for the reported lost bytes,
 *                          which stay within the bounds; averages divide by
 *                          the contributors actually received; with MIN, at
 *                          least that fraction of the push bytes was lost
 *   test_udp sendfail ITERS
 *                          with COHORT_TEST_UDP_SEND_FAIL=n (every rank's
 *                          n-th batch refused, EPERM) and a low
 *                          COHORT_UDP_RATE_MBPS (most batches go from the
 *                          pacing timer): some op fails with EPEER naming
 *                          the refusal, here or as a peer's abort (each
 *                          rank's refusal may fail another op); the others
 *                          complete; the rank finalizes
 */
#include <math.h>
#include <stdint.h>

#include "mp_util.h"

static int R, N;
static coh_comm_t *W;
static coh_ctx_t *CTX;

/* COHORT_NICS's udp and tcp rails, and whether the udp ones spray. */
static int n_udp, n_tcp;
static bool spray;

static void read_nics(void)
{
    const char *e = getenv("COHORT_NICS");
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", e ? e : "lo");
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        char *at = strchr(t, '@'); /* NIC:udp@MBPS */
        if (at) *at = 0;
        size_t l = strlen(t);
        if (l > 4 && !strcmp(t + l - 4, ":udp"))
            n_udp++;
        else
            n_tcp++;
    }
    const char *sp = getenv("COHORT_UDP_SPRAY");
    spray = n_udp > 1 && !(sp && !strcmp(sp, "0"));
}

/* Spraying: every udp rail carried a share of the datagrams (each at least
 * a tenth: the lead takes turns over the paths), and the tcp rails none. */
/* Each rail's datagrams sent and received (recv may be NULL); returns the
 * rails (at most 16). */
static int rail_datagrams(uint64_t sent[16], uint64_t *recv)
{
    int nr;
    MP_OK(coh_ctx_nrails(CTX, &nr));
    for (int r = 0; r < nr && r < 16; r++) {
        coh_stats_t st;
        MP_OK(coh_ctx_rail_stats(CTX, r, &st));
        sent[r] = st.dg_sent;
        if (recv) recv[r] = st.dg_received;
    }
    return nr < 16 ? nr : 16;
}

static void check_spray(void)
{
    uint64_t sent[16] = {0}, recv[16] = {0}, total = 0, rtotal = 0;
    int nr = rail_datagrams(sent, recv);
    for (int r = 0; r < nr; r++) {
        total += sent[r];
        rtotal += recv[r];
    }
    if (!total || !rtotal)
        MP_FAIL("no datagrams sent (%llu) or received (%llu)", (unsigned long long)total,
                (unsigned long long)rtotal);
    for (int r = 0; r < nr && r < n_udp; r++)
        if (sent[r] * 10 < total || recv[r] * 10 < rtotal)
            MP_FAIL("rail %d sent %llu of %llu datagrams, received %llu of %llu", r,
                    (unsigned long long)sent[r], (unsigned long long)total,
                    (unsigned long long)recv[r], (unsigned long long)rtotal);
    for (int r = n_udp; r < nr && r < 16; r++)
        if (sent[r] || recv[r])
            MP_FAIL("tcp rail %d sent %llu datagrams", r, (unsigned long long)sent[r]);
    printf("rank %d: datagrams by rail:", R);
    for (int r = 0; r < nr && r < 16; r++)
        printf(" %llu/%llu", (unsigned long long)sent[r], (unsigned long long)recv[r]);
    printf(" (sent/received)\n");
}

static coh_request_t *lossy(const void *in, void *out, size_t count, coh_dtype dt, coh_redop op,
                            double push, double pull, int layer)
{
    coh_allreduce_opts_t o = {
        .loss_bound = push, .pull_loss_bound = pull, .layer = layer, .nlayers = layer >= 0 ? 8 : 0};
    coh_request_t *req;
    MP_OK(coh_allreduce_ex(W, in, out, count, dt, op, &o, &req));
    return req;
}

static void wait_loss(coh_request_t *req, coh_loss_info_t *li)
{
    int st = coh_wait(req, -1);
    if (st != 0)
        MP_FAIL("lossy allreduce failed: %s: %s", coh_status_name(st), coh_request_error(req));
    MP_OK(coh_request_loss(req, li));
    coh_request_free(req);
}

/* Rank r's value at i: identifies r (bit r) and i. */
static double val(int r, size_t i)
{
    return (double)(1 << r) + 32.0 * (double)(i % 1000);
}

/* The block of [0, count) owned by pos (sc_split). */
static size_t split(size_t n, size_t parts, size_t i)
{
    size_t q = n / parts, rem = n % parts;
    return q * i + (i < rem ? i : rem);
}

static void run_exact(int iters)
{
    const size_t counts[] = {1, 7, 1000, 4099, 100000, 1 << 20};
    const coh_dtype dts[] = {COH_F32, COH_F64, COH_I32};
    for (int it = 0; it < iters; it++)
        for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++)
            for (int di = 0; di < 3; di++)
                for (int opi = 0; opi < 3; opi++) {
                    size_t n = counts[ci];
                    coh_dtype dt = dts[di];
                    coh_redop op = opi == 0 ? COH_SUM : opi == 1 ? COH_AVG : COH_MAX;
                    if (op == COH_AVG && dt == COH_I32) continue;
                    size_t es = coh_dtype_size(dt);
                    char *a = malloc(n * es), *b = malloc(n * es), *ref = malloc(n * es);
                    for (size_t i = 0; i < n; i++) {
                        double v = val(R, i) + it;
                        if (dt == COH_F32) ((float *)a)[i] = (float)v;
                        if (dt == COH_F64) ((double *)a)[i] = v;
                        if (dt == COH_I32) ((int32_t *)a)[i] = (int32_t)v;
                    }
                    bool inplace = (ci + (size_t)opi) % 2;
                    if (inplace) memcpy(b, a, n * es);
                    coh_request_t *rq;
                    MP_OK(coh_allreduce(W, a, ref, n, dt, op, &rq));
                    mp_wait(rq);
                    coh_loss_info_t li;
                    wait_loss(lossy(inplace ? b : a, b, n, dt, op, 1e-9, 0, (int)(ci % 8)), &li);
                    if (memcmp(b, ref, n * es) != 0) {
                        size_t i = 0;
                        while (!memcmp(b + i * es, ref + i * es, es)) i++;
                        MP_FAIL("count %zu %s %s%s: element %zu differs from the reliable result",
                                n, coh_dtype_name(dt), coh_redop_name(op),
                                inplace ? " in place" : "", i);
                    }
                    if (li.push_lost_bytes || li.pull_lost_bytes)
                        MP_FAIL("no loss, yet %llu + %llu bytes lost",
                                (unsigned long long)li.push_lost_bytes,
                                (unsigned long long)li.pull_lost_bytes);
                    /* Every block but this rank's came by datagram (with a tcp rail
                     * beside, the share of the op on the udp rail). */
                    size_t mine =
                        split(n, (size_t)N, (size_t)R + 1) - split(n, (size_t)N, (size_t)R);
                    bool mixed = n_tcp > 0 || (n_udp > 1 && !spray);
                    if (mixed ? li.pull_bytes > (n - mine) * es + es * N ||
                                    li.push_bytes > (mine + 1) * es * (N - 1)
                              : li.pull_bytes != (n - mine) * es ||
                                    li.push_bytes != mine * es * (N - 1))
                        MP_FAIL("count %zu: %llu push and %llu pull bytes by datagram, expected "
                                "%zu and %zu",
                                n, (unsigned long long)li.push_bytes,
                                (unsigned long long)li.pull_bytes, mine * es * (N - 1),
                                (n - mine) * es);
                    free(a);
                    free(b);
                    free(ref);
                }
    /* Several at once, interleaved with reliable ops. */
    enum { K = 6 };
    size_t n = 300000;
    float *x[K];
    coh_request_t *rq[K], *rel;
    double y[64];
    for (int k = 0; k < K; k++) {
        x[k] = malloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++) x[k][i] = (float)(val(R, i) + k);
        rq[k] = lossy(x[k], x[k], n, COH_F32, COH_SUM, 1e-9, 1e-9, -1);
    }
    for (int j = 0; j < 64; j++) y[j] = R;
    MP_OK(coh_allreduce(W, y, y, 64, COH_F64, COH_SUM, &rel));
    for (int k = 0; k < K; k++) {
        coh_loss_info_t li;
        wait_loss(rq[k], &li);
        for (size_t i = 0; i < n; i++) {
            double want = 0;
            for (int r = 0; r < N; r++) want += val(r, i) + k;
            if (x[k][i] != (float)want)
                MP_FAIL("inflight %d: x[%zu] = %g, expected %g", k, i, x[k][i], want);
        }
        free(x[k]);
    }
    mp_wait(rel);
    if (y[5] != N * (N - 1) / 2.0) MP_FAIL("the reliable op beside: %g", y[5]);
    printf("rank %d: OK exact\n", R);
}

/* Ops below COHORT_RAIL_MIN_BYTES: one slice, on one rail. Sprayed, each
 * op's datagrams still leave on every udp rail; not sprayed, on one. */
static void run_spray(int iters)
{
    size_t n = 48 * 1024;
    float *x = malloc(n * sizeof(float));
    for (int it = 0; it < iters; it++) {
        uint64_t before[16] = {0}, after[16] = {0}, d[16] = {0};
        int nr = rail_datagrams(before, NULL);
        for (size_t i = 0; i < n; i++) x[i] = (float)(val(R, i) + it);
        coh_loss_info_t li;
        wait_loss(lossy(x, x, n, COH_F32, COH_SUM, 1e-9, 1e-9, -1), &li);
        for (size_t i = 0; i < n; i++) {
            double want = 0;
            for (int r = 0; r < N; r++) want += val(r, i) + it;
            if (x[i] != (float)want) MP_FAIL("op %d: x[%zu] = %g, expected %g", it, i, x[i], want);
        }
        int used = 0;
        rail_datagrams(after, NULL);
        for (int r = 0; r < nr; r++) {
            d[r] = after[r] - before[r];
            used += d[r] > 0;
        }
        if (spray ? used != n_udp : used != 1)
            MP_FAIL("op %d: datagrams left on %d rails (%llu, %llu, ...), expected %d", it, used,
                    (unsigned long long)d[0], (unsigned long long)d[1], spray ? n_udp : 1);
    }
    printf("rank %d: OK %s: %d small ops\n", R, spray ? "sprayed" : "one rail each", iters);
    free(x);
}

static void run_lossy(int iters, double push, double pull, double min_lost)
{
    size_t n = 1 << 19;
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    double *a = malloc(n * sizeof(double)), *b = malloc(n * sizeof(double));
    double lost_push = 0, lost_pull = 0, seen_push = 0, seen_pull = 0;
    uint64_t missing_seen = 0;
    for (int it = 0; it < iters; it++) {
        /* Odd iterations out of place, into a poisoned buffer: a pull that
         * never came must leave this rank's input there too. */
        bool oop = it % 2;
        for (size_t i = 0; i < n; i++) {
            x[i] = (float)val(R, i);
            y[i] = -1.0f;
        }
        float *out = oop ? y : x;
        coh_loss_info_t li;
        wait_loss(lossy(x, out, n, COH_F32, COH_SUM, push, pull, it % 8), &li);
        if (li.push_lost > push + 1e-12 || li.pull_lost > pull + 1e-12)
            MP_FAIL(
                "iteration %d: lost %.4f of the push (bound %.4f), %.4f of the pull (bound %.4f)",
                it, li.push_lost, push, li.pull_lost, pull);
        uint64_t push_missing = 0, own = 0;
        for (int o = 0; o < N; o++)
            for (size_t i = split(n, (size_t)N, (size_t)o); i < split(n, (size_t)N, (size_t)o + 1);
                 i++) {
                double v = out[i];
                long mask = (long)fmod(v, 32.0);
                double k = (v - (double)mask) / 32.0;
                int pc = __builtin_popcountl((unsigned long)mask);
                if (mask <= 0 || mask >= (1L << N) || k != (double)pc * (double)(i % 1000))
                    MP_FAIL("iteration %d: x[%zu] = %.1f is no sum of contributions", it, i, v);
                if (o != R && mask == (1L << R)) {
                    own++; /* the pull never came: this rank's own value */
                    continue;
                }
                if (!(mask & (1L << o)))
                    MP_FAIL("iteration %d: x[%zu] (block of rank %d) lacks its owner: mask %ld", it,
                            i, o, mask);
                if (o == R) push_missing += (uint64_t)(N - pc);
            }
        if (own * sizeof(float) != li.pull_lost_bytes)
            MP_FAIL("iteration %d: %llu elements kept their own value, %llu pull bytes lost", it,
                    (unsigned long long)own, (unsigned long long)li.pull_lost_bytes);
        if (push_missing * sizeof(float) != li.push_lost_bytes)
            MP_FAIL("iteration %d: %llu contributions missing, %llu push bytes lost", it,
                    (unsigned long long)push_missing, (unsigned long long)li.push_lost_bytes);
        lost_push += (double)li.push_lost_bytes;
        lost_pull += (double)li.pull_lost_bytes;
        seen_push += (double)li.push_bytes;
        seen_pull += (double)li.pull_bytes;
        missing_seen += push_missing + own;
        /* An average divides by the contributors of each segment: every
         * rank's value c gives exactly c, whoever was missing. */
        for (size_t i = 0; i < n; i++) {
            a[i] = (double)(i % 777) * 0.5;
            b[i] = -1.0;
        }
        double *aout = oop ? b : a;
        wait_loss(lossy(a, aout, n, COH_F64, COH_AVG, push, pull, -1), &li);
        for (size_t i = 0; i < n; i++)
            if (aout[i] != (double)(i % 777) * 0.5)
                MP_FAIL("iteration %d: average a[%zu] = %.17g, expected %.17g", it, i, aout[i],
                        (double)(i % 777) * 0.5);
    }
    /* The bound is the tensor's: receives of a few datagrams (small chunks)
     * share it, so at drops above the bound the op does lose data. */
    if (seen_push && lost_push / seen_push < min_lost)
        MP_FAIL("lost %.4f%% of the push, expected at least %.4f%% (the bound, shared)",
                100 * lost_push / seen_push, 100 * min_lost);
    printf("rank %d: OK lossy: lost %.4f%% of the push, %.4f%% of the pull (bounds %.2f%%, "
           "%.2f%%), %llu elements short\n",
           R, seen_push ? 100 * lost_push / seen_push : 0,
           seen_pull ? 100 * lost_pull / seen_pull : 0, 100 * push, 100 * pull,
           (unsigned long long)missing_seen);
    free(x);
    free(y);
    free(a);
    free(b);
}

static void run_sendfail(int iters)
{
    size_t n = (size_t)2 << 20; /* 8 MiB of f32: many batches */
    float *x = malloc(n * sizeof(float));
    if (!x) MP_FAIL("out of memory");
    int failed = 0;
    for (int it = 0; it < iters; it++) {
        for (size_t i = 0; i < n; i++) x[i] = (float)R;
        coh_request_t *req = lossy(x, x, n, COH_F32, COH_SUM, 0.01, 0.01, -1);
        int st = coh_wait(req, -1);
        if (st != 0) {
            const char *e = coh_request_error(req);
            if (st != COH_EPEER || !strstr(e, "Operation not permitted"))
                MP_FAIL("op %d: %s: %s, not the refused send", it, coh_status_name(st), e);
            failed++;
        }
        coh_request_free(req);
    }
    if (!failed) MP_FAIL("no op failed");
    if (failed == iters) MP_FAIL("every op failed: the rail did not recover");
    printf("rank %d: %d of %d ops failed on the refused send\n", R, failed, iters);
    free(x);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(
            stderr,
            "usage: test_udp exact ITERS | spray ITERS | lossy ITERS PUSH PULL | sendfail ITERS\n");
        return 2;
    }
    coh_ctx_t *ctx = mp_init(&W, &R, &N);
    CTX = ctx;
    read_nics();
    if (N > 5) MP_FAIL("at most 5 ranks (values carry a 5-bit contributor mask)");
    int iters = atoi(argv[2]);
    if (!strcmp(argv[1], "exact"))
        run_exact(iters);
    else if (!strcmp(argv[1], "spray"))
        run_spray(iters);
    else if (!strcmp(argv[1], "sendfail"))
        run_sendfail(iters);
    else if (!strcmp(argv[1], "lossy") && argc >= 5)
        run_lossy(iters, atof(argv[3]), atof(argv[4]), argc > 5 ? atof(argv[5]) : 0);
    else
        MP_FAIL("unknown mode %s", argv[1]);
    /* Which rails carried the datagrams: the udp rails' test (the tcp
     * rails' slices and the rails' order follow COHORT_NICS). */
    if (spray && !n_tcp && strcmp(argv[1], "spray") && strcmp(argv[1], "sendfail")) check_spray();
    /* With control as datagrams alone (COHORT_TEST_UDP_CTL_DGRAM) a rank
     * whose last FIN was lost asks again after its peer's op ended: the
     * peer must still be there to answer. */
    const char *ctl = getenv("COHORT_TEST_UDP_CTL_DGRAM");
    if (ctl && atoi(ctl)) {
        coh_request_t *b;
        MP_OK(coh_barrier(W, &b));
        MP_OK(coh_wait(b, -1));
        coh_request_free(b);
    }
    MP_OK(coh_finalize(ctx));
    return 0;
}
