/*
 * Partial synchronisation across processes.
 *
 *   test_sync MODE ITERS [--straggler]   every rank syncs ITERS times; checks
 *       - the result equals the group's weighted mean sum(w_i x_i) / sum(w_i)
 *         exactly (integer-valued f64 data and integer weights: every
 *         partial sum is exact, the one division rounds once);
 *       - every member of a group reports the same members, in the same
 *         order, and the same total weight;
 *       - groups have at least p members unless they are full syncs;
 *       - in allreduce mode every group is full.
 *       - with COHORT_SYNC_PROBE_ROUNDS=K, the first partial or selective
 *         sync probed this rank's links to K peers (at most N - 1) before
 *         it, and no sync after; allreduce mode never does, nor K = 0.
 *   test_sync die ITERS                  the last rank exits in the middle of
 *       the run; the others keep syncing (their groups exclude it) and finish.
 *   test_sync faults ITERS               syncs of an 8 MiB model: the median
 *       sync pages in less than an eighth of it (a scratch allocated per sync
 *       was paged in again every step).
 */
#include <math.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include "mp_util.h"

#define COUNT 4099 /* not a multiple of anything */
#define MAXR  64

static int R, N;
static coh_comm_t *W;

typedef struct rec {
    double gid, size, full, total;
    double members[MAXR];
} rec_t;

/* Members of a group may be at different iterations (that is the point of
 * partial sync), so a rank's data depend on the rank only. */
static double val(int r, size_t j)
{
    return (double)((r * 7 + (int)j * 3) % 11 + r);
}

static int min_p(void)
{
    int p = (int)lround(0.3 * N);
    if (p < 2) p = 2;
    return p > N ? N : p;
}

static int faults(int iters)
{
    const size_t count = 1u << 20; /* doubles: 8 MiB */
    double *x = malloc(count * sizeof(double));
    long *f = calloc((size_t)iters, sizeof(long));
    if (!x || !f || iters < 4) MP_FAIL("faults: out of memory or fewer than 4 syncs");
    for (size_t j = 0; j < count; j++) x[j] = val(R, j % 1000);
    for (int it = 0; it < iters; it++) {
        long f0 = mp_minflt();
        coh_request_t *req;
        MP_OK(coh_sync_ex(W, x, count, COH_F64, (uint64_t)it, 1.0, COH_SYNC_ALLREDUCE, &req));
        mp_wait(req);
        f[it] = mp_minflt() - f0;
    }
    /* The first two warm up (the rails' buffers, the kept scratch). */
    qsort(f + 2, (size_t)iters - 2, sizeof(long), mp_cmp_long);
    long med = f[2 + (iters - 2) / 2], budget = (long)(count * sizeof(double) / 4096 / 8);
    printf("rank %d: %ld page faults in the median sync of 8 MiB (first %ld, budget %ld)\n", R, med,
           f[0], budget);
    if (med > budget) MP_FAIL("%ld page faults in the median sync, budget %ld", med, budget);
    MP_OK(coh_sync_leave(W));
    free(x);
    free(f);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr,
                "usage: test_sync allreduce|partial|selective|die|faults ITERS [--straggler]\n");
        return 2;
    }
    const char *mode_name = argv[1];
    int iters = atoi(argv[2]);
    int straggler = argc > 3 && !strcmp(argv[3], "--straggler");
    int die = !strcmp(mode_name, "die");
    coh_ctx_t *ctx = mp_init(&W, &R, &N);
    if (N > MAXR) MP_FAIL("at most %d ranks", MAXR);
    if (!strcmp(mode_name, "faults")) {
        faults(iters);
        MP_OK(coh_finalize(ctx));
        return 0;
    }
    coh_sync_mode mode = COH_SYNC_PARTIAL;
    if (!die) MP_OK(coh_sync_mode_from_name(mode_name, &mode));
    double *x = malloc(COUNT * sizeof(double));
    rec_t *recs = calloc((size_t)iters, sizeof(rec_t));
    double weight = R + 1;
    double wait_us = 0, comm_us = 0;
    int p = min_p(), done = 0;
    for (int it = 0; it < iters; it++) {
        if (die && R == N - 1 && it == iters / 3) {
            printf("rank %d: leaving after %d syncs\n", R, it);
            fflush(stdout);
            _exit(0); /* no finalize: like a crashed worker */
        }
        /* Some ranks are slower: partial and selective should not wait. */
        usleep((useconds_t)(1000 + (straggler && R == N - 1 ? 20000 : 500 * R)));
        for (size_t j = 0; j < COUNT; j++) x[j] = val(R, j);
        coh_request_t *req;
        MP_OK(coh_sync_ex(W, x, COUNT, COH_F64, (uint64_t)it, weight, mode, &req));
        int st = coh_wait(req, 60000);
        if (st != 0)
            MP_FAIL("sync %d failed: %s: %s", it, coh_status_name(st), coh_request_error(req));
        coh_group_info_t g;
        MP_OK(coh_request_group(req, &g));
        wait_us += g.wait_us;
        comm_us += g.comm_us;
        if (g.size < 1 || g.size > N) MP_FAIL("group of %d", g.size);
        int me = 0;
        double total = 0;
        for (int i = 0; i < g.size; i++) {
            me += g.members[i] == R;
            total += g.members[i] + 1;
        }
        if (me != 1) MP_FAIL("sync %d: this rank is %d times in its group", it, me);
        if (total != g.total_weight)
            MP_FAIL("total weight %g, members say %g", g.total_weight, total);
        if (!g.full && g.size < p) MP_FAIL("sync %d: group of %d < p = %d", it, g.size, p);
        if (mode == COH_SYNC_ALLREDUCE && !die && (!g.full || g.size != N))
            MP_FAIL("allreduce mode gave a group of %d (full=%d)", g.size, g.full);
        for (size_t j = 0; j < COUNT; j++) {
            double num = 0;
            for (int i = 0; i < g.size; i++) num += (g.members[i] + 1) * val(g.members[i], j);
            double want = num / total;
            if (x[j] != want)
                MP_FAIL("sync %d (group %llu of %d): x[%zu] = %.17g, expected %.17g", it,
                        (unsigned long long)g.group_id, g.size, j, x[j], want);
        }
        recs[it].gid = (double)g.group_id;
        recs[it].size = g.size;
        recs[it].full = g.full;
        recs[it].total = g.total_weight;
        for (int i = 0; i < MAXR; i++) recs[it].members[i] = i < g.size ? g.members[i] : -1;
        coh_request_free(req);
        done++;
    }
    /* Done syncing: the slower ranks must not wait for this one. */
    MP_OK(coh_sync_leave(W));
    if (!die) {
        /* Every member of a group must have seen the same group. */
        size_t rs = sizeof(rec_t) / sizeof(double) * (size_t)iters;
        double *all = malloc(sizeof(double) * rs * (size_t)N);
        coh_request_t *req;
        MP_OK(coh_allgather(W, recs, all, rs, COH_F64, &req));
        mp_wait(req);
        rec_t *ar = (rec_t *)all;
        for (int a = 0; a < N * iters; a++)
            for (int b = a + 1; b < N * iters; b++) {
                if (ar[a].gid != ar[b].gid) continue;
                if (memcmp(&ar[a], &ar[b], sizeof(rec_t)) != 0)
                    MP_FAIL("group %.0f is seen differently by two of its members", ar[a].gid);
            }
        free(all);
    }
    if (!die) {
        const char *e = getenv("COHORT_SYNC_PROBE_ROUNDS");
        int rounds = e && *e ? atoi(e) : 0, np = N + (N & 1);
        bool probes = mode != COH_SYNC_ALLREDUCE && rounds > 0 && N > 1;
        /* Each round meets one peer (an odd world has a bye a round). */
        int want = !probes ? 0 : rounds < np - 1 ? rounds : np - 1;
        if (N & 1) want = -1; /* not checked */
        coh_stats_t st;
        MP_OK(coh_ctx_stats(ctx, &st));
        if (st.probes != (probes ? 1u : 0u))
            MP_FAIL("%llu probes, expected %d", (unsigned long long)st.probes, probes);
        coh_link_probe_t links[MAXR];
        int nl = coh_ctx_links(ctx, links, MAXR);
        if (want >= 0 && nl != want) MP_FAIL("%d links probed, expected %d", nl, want);
        for (int i = 0; i < nl && i < MAXR; i++)
            if (links[i].peer == R || links[i].peer < 0 || links[i].peer >= N ||
                !(links[i].gbps > 0))
                MP_FAIL("probed link %d: rank %d, %.3f Gbps", i, links[i].peer, links[i].gbps);
    }
    double avg = 0;
    for (int i = 0; i < done; i++) avg += recs[i].size;
    printf("rank %d: OK %d %s syncs, average group %.2f, wait %.0f us, comm %.0f us per sync\n", R,
           done, die ? "partial" : mode_name, avg / (done ? done : 1), wait_us / (done ? done : 1),
           comm_us / (done ? done : 1));
    fflush(stdout);
    free(x);
    free(recs);
    MP_OK(coh_finalize(ctx));
    return 0;
}
