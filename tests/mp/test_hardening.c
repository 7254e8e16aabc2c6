/*
 * Faults found from outside (the hardening issue), one mode per CTest:
 *
 *   inflight N       N 4-float allreduces in flight at once: all succeed,
 *                    with the right value, on every rank (they used to time
 *                    out on some ranks and not others, or stall).
 *   inflight-kill N  N 64 KiB allreduces in flight, waiters driving the
 *                    loops (COHORT_SPIN_US), then the last rank dies: every
 *                    survivor's request ends (none pending), and no survivor
 *                    is killed by SIGPIPE.
 *   sync-stop MODE PIDFILE  the last rank SIGSTOPs itself at a random point of
 *                    a run of syncs: the survivors' syncs never hang (each
 *                    ends within a bound, by a regroup or an error), a world
 *                    allreduce afterwards fails at once naming the stopped
 *                    rank, and finalize is quick. Another rank then SIGKILLs
 *                    it. An optional last argument names the rank that stops
 *                    (0: the coordinator; the others' syncs then end with
 *                    EPEER, bounded, until coordinator election exists).
 *   sync-hang        the last rank (alive) stays away from its sync for
 *                    longer than COHORT_TIMEOUT_MS: the others go on without
 *                    it, and it syncs with them again afterwards.
 *   mode-mismatch    the last rank syncs in partial mode, the others in
 *                    allreduce: every rank fails with EMISMATCH naming 'mode'.
 *   coord-mismatch   rank 1 alone sets COHORT_COORDINATOR=1: every rank's
 *                    coh_init fails with EMISMATCH naming the coordinator.
 *   known-failed     the last rank dies; once a survivor knows it failed, a
 *                    world allreduce of its own fails at once (rank 0 first,
 *                    the others 2 s later), though recursive doubling over 4
 *                    ranks never pairs rank 0 with the dead one: it used to
 *                    wait for the others' ABORTs (in CI, for its timeout).
 *   ctl-quiet S FILE every rank idles S seconds after a barrier (rank 1
 *                    creates FILE as it starts), then allreduces: the world
 *                    must still be whole. cluster.liveness blocks TCP between
 *                    rank 1 and the coordinator meanwhile, longer than
 *                    COHORT_LIVENESS_MS: the heartbeat datagrams must keep
 *                    both sides from taking the other for hung.
 *   finalize-queue N N 4-float allreduces in flight on every rank, more than
 *                    COHORT_MAX_INFLIGHT (the rest wait for their turn), and
 *                    rank 0 (the coordinator's) finalizes at once: every
 *                    other rank's requests end within 10 s, and its finalize
 *                    within 5 s.
 *   weights          extreme weights give finite, exact-enough weighted means
 *                    (they gave NaN or killed syncing for the whole job);
 *                    weights out of range are refused by the API.
 */
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include "mp_util.h"

static int R, N;
static coh_comm_t *W;

static void mode_inflight(int n)
{
    float *b = malloc(sizeof(float) * 4 * (size_t)n);
    coh_request_t **q = malloc(sizeof(*q) * (size_t)n);
    for (int i = 0; i < 4 * n; i++) b[i] = (float)(R + 1 + i % 7);
    double t0 = mp_now_s();
    for (int i = 0; i < n; i++)
        MP_OK(coh_allreduce(W, NULL, b + 4 * i, 4, COH_F32, COH_SUM, &q[i]));
    int bad = 0;
    for (int i = 0; i < n; i++) {
        int st = coh_wait(q[i], 60000);
        if (st != 0 && bad++ == 0)
            fprintf(stderr, "rank %d: op %d: %s: %s\n", R, i, coh_status_name(st),
                    coh_request_error(q[i]));
        coh_request_free(q[i]);
    }
    if (bad) MP_FAIL("%d of %d ops in flight failed", bad, n);
    for (int i = 0; i < 4 * n; i++) {
        float want = (float)(N * (N + 1) / 2 + N * (i % 7));
        if (b[i] != want) MP_FAIL("element %d: %g, expected %g", i, b[i], want);
    }
    printf("rank %d: %d ops in flight done in %.2f s\n", R, n, mp_now_s() - t0);
    free(b);
    free(q);
    printf("rank %d: OK\n", R);
}

static void mode_inflight_kill(int n)
{
    const size_t count = 16384; /* 64 KiB each: writes are still going when the peer dies */
    float *b = malloc(sizeof(float) * count * (size_t)n);
    coh_request_t **q = malloc(sizeof(*q) * (size_t)n);
    for (size_t i = 0; i < count * (size_t)n; i++) b[i] = 1.0f;
    for (int i = 0; i < n; i++)
        MP_OK(coh_allreduce(W, NULL, b + count * (size_t)i, count, COH_F32, COH_SUM, &q[i]));
    if (R == N - 1) {
        usleep(2000);
        raise(SIGKILL);
    }
    int ok = 0, failed = 0;
    for (int i = 0; i < n; i++) {
        int st = coh_wait(q[i], 30000);
        if (st == COH_EAGAIN) MP_FAIL("op %d still pending 30 s after the peer died", i);
        st == 0 ? ok++ : failed++;
        coh_request_free(q[i]);
    }
    printf("rank %d: %d ops ended: %d ok, %d failed; alive (no SIGPIPE)\n", R, n, ok, failed);
    free(b);
    free(q);
    printf("rank %d: OK\n", R);
}

/* One sync of `x`, bounded: returns its status and how long it took. */
static int bounded_sync(double *x, size_t count, uint64_t it, coh_sync_mode mode, double bound,
                        double *took)
{
    coh_request_t *req;
    double t0 = mp_now_s();
    int st = coh_sync_ex(W, x, count, COH_F64, it, 1.0, mode, &req);
    if (st != 0) { /* refused at once (the coordinator is known gone): a clean error */
        *took = 0;
        if (st != COH_EPEER) MP_FAIL("coh_sync: %s: %s", coh_status_name(st), coh_last_error());
        return st;
    }
    st = coh_wait(req, (int)(bound * 1000));
    *took = mp_now_s() - t0;
    if (st == COH_EAGAIN)
        MP_FAIL("sync %llu hangs: not done after %.1f s", (unsigned long long)it, *took);
    if (st != 0)
        printf("rank %d: sync %llu ended with %s in %.2f s: %s\n", R, (unsigned long long)it,
               coh_status_name(st), *took, coh_request_error(req));
    coh_request_free(req);
    return st;
}

/* Stops the whole process at a random moment: between syncs, in a sync
 * waiting for its plan, or in the middle of a group's data transfer. */
static void *stopper(void *arg)
{
    usleep((useconds_t)(uintptr_t)arg);
    printf("rank %d: stopping myself\n", R);
    fflush(stdout);
    raise(SIGSTOP); /* never resumed: rank 0 kills it at the end */
    return NULL;
}

static int victim; /* the rank that stops (argv; default the last) */

static void mode_sync_stop(const char *mname, const char *pidfile)
{
    coh_sync_mode mode;
    MP_OK(coh_sync_mode_from_name(mname, &mode));
    double x[65536];
    srand((unsigned)time(NULL) ^ (unsigned)getpid());
    if (R == victim) {
        FILE *f = fopen(pidfile, "w");
        if (!f) MP_FAIL("cannot write %s", pidfile);
        fprintf(f, "%d\n", (int)getpid());
        fclose(f);
        pthread_t t;
        pthread_create(&t, NULL, stopper, (void *)(uintptr_t)(50000 + rand() % 400000));
        pthread_detach(t);
    }
    double worst = 0, t0 = mp_now_s();
    int it = 0;
    for (; mp_now_s() - t0 < 3.0; it++) { /* the stop comes within 0.5 s */
        for (int i = 0; i < 65536; i++) x[i] = R + it;
        double took;
        bounded_sync(x, 65536, (uint64_t)it, mode, 30, &took);
        if (took > worst) worst = took;
        usleep(20000);
    }
    /* COHORT_LIVENESS_MS + COHORT_TIMEOUT_MS (the test sets 1000 and 4000) */
    if (worst > 8) MP_FAIL("a sync took %.1f s", worst);
    /* The stopped rank is known to be gone: a world op fails at once. */
    float v[256] = {0};
    coh_request_t *req;
    t0 = mp_now_s();
    MP_OK(coh_allreduce(W, NULL, v, 256, COH_F32, COH_SUM, &req));
    int st = coh_wait(req, 20000);
    double dt = mp_now_s() - t0;
    if (st == 0) MP_FAIL("an allreduce with a stopped rank succeeded");
    const char *why = coh_request_error(req);
    char name[32];
    snprintf(name, sizeof(name), "rank %d", victim);
    printf("rank %d: allreduce after the stop: %s in %.3f s: %s\n", R, coh_status_name(st), dt,
           why);
    if (dt > 1.5) MP_FAIL("the allreduce took %.1f s: the stopped rank was not remembered", dt);
    if (!strstr(why, name)) MP_FAIL("the error does not name the stopped rank: %s", why);
    coh_request_free(req);
    printf("rank %d: %d syncs, worst %.2f s\n", R, it, worst);
}

static void mode_sync_hang(void)
{
    double x[512];
    double worst = 0;
    int hang_at = 3, together = 0;
    for (int it = 0; it < 14; it++) {
        for (int i = 0; i < 512; i++) x[i] = R;
        if (R == N - 1 && it == hang_at) sleep(3); /* COHORT_TIMEOUT_MS=1500 in the test */
        coh_request_t *req;
        double t0 = mp_now_s();
        MP_OK(coh_sync_ex(W, x, 512, COH_F64, (uint64_t)it, 1.0, COH_SYNC_ALLREDUCE, &req));
        int st = coh_wait(req, 20000);
        double took = mp_now_s() - t0;
        if (st != 0)
            MP_FAIL("sync %d: %s: %s (a regroup was expected)", it, coh_status_name(st),
                    coh_request_error(req));
        coh_group_info_t g;
        MP_OK(coh_request_group(req, &g));
        if (R != N - 1 && took > worst) worst = took;
        if (it > hang_at && g.size == N) together++;
        coh_request_free(req);
        usleep(300000);
    }
    if (worst > 5) MP_FAIL("a sync waited %.1f s for the absent rank", worst);
    if (!together) MP_FAIL("the absent rank never synced with the others again");
    printf("rank %d: worst wait %.2f s, %d full groups after the absence\n", R, worst, together);
    printf("rank %d: OK\n", R);
}

static void mode_ctl_quiet(double secs, const char *file)
{
    coh_request_t *req;
    float x[4] = {0};
    MP_OK(coh_allreduce(W, x, x, 4, COH_F32, COH_SUM, &req)); /* everybody is up */
    mp_wait(req);
    if (R == 1) {
        FILE *f = fopen(file, "w");
        if (!f) MP_FAIL("cannot create %s", file);
        fclose(f);
    }
    double t0 = mp_now_s();
    while (mp_now_s() - t0 < secs) usleep(100000);
    for (int i = 0; i < 4; i++) x[i] = (float)(R + i);
    MP_OK(coh_allreduce(W, x, x, 4, COH_F32, COH_SUM, &req));
    mp_wait(req);
    for (int i = 0; i < 4; i++) {
        float want = (float)(N * (N - 1) / 2 + N * i);
        if (x[i] != want) MP_FAIL("element %d is %g, expected %g", i, x[i], want);
    }
    printf("rank %d: OK ctl-quiet (%.1f s idle)\n", R, secs);
}

static void mode_known_failed(void)
{
    if (R == N - 1) {
        usleep(100000);
        raise(SIGKILL);
    }
    /* Until this rank has heard of the death (LOST, or its own links). */
    float v[256];
    double t0 = mp_now_s();
    int fr[8];
    while (coh_comm_failed_ranks(W, fr, 8) < 1) {
        if (mp_now_s() - t0 > 10) MP_FAIL("rank %d's death was never reported", N - 1);
        usleep(1000);
    }
    if (R != 0) usleep(2000000); /* rank 0 alone: nobody else aborts its op for it */
    for (int i = 0; i < 256; i++) v[i] = (float)R;
    coh_request_t *req;
    t0 = mp_now_s();
    MP_OK(coh_allreduce(W, NULL, v, 256, COH_F32, COH_SUM, &req));
    int st = coh_wait(req, 20000);
    double dt = mp_now_s() - t0;
    if (st == 0) MP_FAIL("a world allreduce with a dead member succeeded");
    char name[32];
    snprintf(name, sizeof(name), "rank %d", N - 1);
    if (!strstr(coh_request_error(req), name))
        MP_FAIL("the error does not name the dead rank: %s", coh_request_error(req));
    if (R == 0 && dt > 1.0)
        MP_FAIL("the allreduce took %.2f s: the known failure was not used", dt);
    printf("rank %d: allreduce after the death: %s in %.3f s\nrank %d: OK\n", R,
           coh_status_name(st), dt, R);
    coh_request_free(req);
}

static void mode_mode_mismatch(void)
{
    double x[64] = {0};
    coh_request_t *req;
    coh_sync_mode mode = R == N - 1 ? COH_SYNC_PARTIAL : COH_SYNC_ALLREDUCE;
    if (R == N - 1) usleep(200000); /* the others are waiting in allreduce mode */
    MP_OK(coh_sync_ex(W, x, 64, COH_F64, 0, 1.0, mode, &req));
    int st = coh_wait(req, 10000);
    if (st != COH_EMISMATCH)
        MP_FAIL("expected EMISMATCH, got %s: %s", coh_status_name(st), coh_request_error(req));
    if (!strstr(coh_request_error(req), "mode"))
        MP_FAIL("the error does not name the mode: %s", coh_request_error(req));
    printf("rank %d: %s\n", R, coh_request_error(req));
    coh_request_free(req);
    /* Agreeing again works. */
    MP_OK(coh_sync_ex(W, x, 64, COH_F64, 1, 1.0, COH_SYNC_ALLREDUCE, &req));
    mp_wait(req);
    printf("rank %d: OK\n", R);
}

static void mode_weights(void)
{
    /* Refused at the API: not finite, not positive, out of range. */
    double bad[] = {NAN, INFINITY, -1, 0, 1e300, 1e-300, 1e308};
    double x[256];
    coh_request_t *req;
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++)
        if (coh_sync_ex(W, x, 256, COH_F64, 0, bad[k], COH_SYNC_ALLREDUCE, &req) != COH_EINVAL)
            MP_FAIL("weight %g was not refused", bad[k]);
    /* Integer data takes whole weights. */
    int32_t ix[16] = {0};
    if (coh_sync_ex(W, ix, 16, COH_I32, 0, 1.5, COH_SYNC_ALLREDUCE, &req) != COH_EINVAL)
        MP_FAIL("weight 1.5 on i32 data was not refused");
    /* In range, extreme and mixed: the weighted mean, finite, in f32 and f64. */
    double cases[][2] = {{1e30, 1e30}, {1e-30, 1e-30}, {1e30, 1e-30}, {1e-30, 1}, {3, 5}};
    uint64_t it = 0;
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        double w = R == 0 ? cases[k][0] : cases[k][1], num = 0, den = 0;
        for (int r = 0; r < N; r++) {
            double wr = r == 0 ? cases[k][0] : cases[k][1];
            num += wr * (r + 1);
            den += wr;
        }
        double want = num / den;
        float f[256];
        for (int i = 0; i < 256; i++) {
            x[i] = R + 1;
            f[i] = (float)(R + 1);
        }
        MP_OK(coh_sync_ex(W, x, 256, COH_F64, it++, w, COH_SYNC_ALLREDUCE, &req));
        mp_wait(req);
        MP_OK(coh_sync_ex(W, f, 256, COH_F32, it++, w, COH_SYNC_ALLREDUCE, &req));
        mp_wait(req);
        for (int i = 0; i < 256; i++) {
            if (!isfinite(x[i]) || fabs(x[i] - want) > 1e-12 * want)
                MP_FAIL("weights %g/%g: f64 %.17g, expected %.17g", cases[k][0], cases[k][1], x[i],
                        want);
            if (!isfinite(f[i]) || fabs(f[i] - want) > 1e-5 * want)
                MP_FAIL("weights %g/%g: f32 %.9g, expected %.9g", cases[k][0], cases[k][1], f[i],
                        want);
        }
    }
    /* Syncing still works for everybody afterwards. */
    for (int i = 0; i < 256; i++) x[i] = R;
    MP_OK(coh_sync_ex(W, x, 256, COH_F64, it++, 1.0, COH_SYNC_ALLREDUCE, &req));
    mp_wait(req);
    printf("rank %d: OK\n", R);
}

static void mode_finalize_queue(coh_ctx_t *ctx, int n)
{
    float *b = malloc(sizeof(float) * 4 * (size_t)n);
    coh_request_t **q = malloc(sizeof(*q) * (size_t)n);
    for (int i = 0; i < 4 * n; i++) b[i] = 1.0f;
    for (int i = 0; i < n; i++)
        MP_OK(coh_allreduce(W, NULL, b + 4 * i, 4, COH_F32, COH_SUM, &q[i]));
    double t0 = mp_now_s();
    int failed = 0;
    if (R == 0) {
        MP_OK(coh_finalize(ctx));
        for (int i = 0; i < n; i++) { /* finalize ended every one, cancelled or done */
            int st = coh_wait(q[i], 0);
            if (st == COH_EAGAIN) MP_FAIL("request %d of %d still pending after finalize", i, n);
            failed += st != 0;
        }
    } else {
        for (int i = 0; i < n; i++) {
            double left = 10 - (mp_now_s() - t0);
            int st = coh_wait(q[i], left > 0 ? (int)(left * 1000) : 0);
            if (st == COH_EAGAIN)
                MP_FAIL("request %d of %d still runs %.1f s after rank 0 finalized", i, n,
                        mp_now_s() - t0);
            failed += st != 0;
        }
        MP_OK(coh_finalize(ctx));
    }
    double dt = mp_now_s() - t0;
    if (dt > (R == 0 ? 5 : 15)) MP_FAIL("finalize took %.1f s", dt);
    printf("rank %d: %d of %d ops failed, finalize done after %.2f s\nrank %d: OK\n", R, failed, n,
           dt, R);
    for (int i = 0; i < n; i++) coh_request_free(q[i]);
    free(q);
    free(b);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: test_hardening MODE [args]\n");
        return 2;
    }
    const char *m = argv[1];
    if (!strcmp(m, "coord-mismatch")) {
        const char *r = getenv("COHORT_RANK");
        if (r && atoi(r) == 1) setenv("COHORT_COORDINATOR", "1", 1);
        coh_ctx_t *ctx;
        int st = coh_init(NULL, &ctx);
        if (st != COH_EMISMATCH)
            MP_FAIL("coh_init: expected EMISMATCH, got %s: %s", coh_status_name(st),
                    coh_last_error());
        if (!strstr(coh_last_error(), "coordinator"))
            MP_FAIL("the error does not name the coordinator: %s", coh_last_error());
        printf("rank %s: %s\nrank %s: OK\n", r ? r : "?", coh_last_error(), r ? r : "?");
        return 0;
    }
    coh_ctx_t *ctx = mp_init(&W, &R, &N);
    int n = argc > 2 ? atoi(argv[2]) : 100000;
    if (!strcmp(m, "inflight"))
        mode_inflight(n);
    else if (!strcmp(m, "inflight-kill"))
        mode_inflight_kill(n);
    else if (!strcmp(m, "sync-stop") && argc > 3) {
        victim = argc > 4 ? atoi(argv[4]) : N - 1;
        mode_sync_stop(argv[2], argv[3]);
    } else if (!strcmp(m, "sync-hang"))
        mode_sync_hang();
    else if (!strcmp(m, "mode-mismatch"))
        mode_mode_mismatch();
    else if (!strcmp(m, "weights"))
        mode_weights();
    else if (!strcmp(m, "ctl-quiet") && argc > 3)
        mode_ctl_quiet(atof(argv[2]), argv[3]);
    else if (!strcmp(m, "known-failed"))
        mode_known_failed();
    else if (!strcmp(m, "finalize-queue")) {
        mode_finalize_queue(ctx, n);
        return 0;
    } else
        MP_FAIL("unknown mode %s", m);
    fflush(stdout);
    double t0 = mp_now_s();
    MP_OK(coh_finalize(ctx));
    if (!strcmp(m, "sync-stop")) {
        double dt = mp_now_s() - t0;
        if (dt > 3) MP_FAIL("finalize took %.1f s with a stopped peer", dt);
        if (R == (victim == 0 ? 1 : 0)) {
            FILE *f = fopen(argv[3], "r");
            int pid = 0;
            if (f && fscanf(f, "%d", &pid) == 1 && pid > 0) kill(pid, SIGKILL);
            if (f) fclose(f);
        }
        printf("rank %d: finalize %.2f s\nrank %d: OK\n", R, dt, R);
    }
    return 0;
}
