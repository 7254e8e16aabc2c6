/*
 * Multi-rail failover on loopback rails (cohortrun --nics lo,lo[,lo]).
 *
 *   test_rails cut OPS [EVERY]
 *
 * A stream of allreduces (sizes from 4 KiB to 4 MiB, several in flight,
 * integer-valued floats so every sum is exact). Every EVERY ops one rank
 * breaks the link to its right neighbour on the last rail in the middle of
 * an op (the socket is shut down under the engine, as a failing NIC would
 * leave it). With failover every op must still complete with the right
 * result, the link must have moved (failovers counted on both ends) and
 * come back (returns counted: COHORT_RAIL_PROBE_MS is small here). Without
 * failover (COHORT_RAIL_FAILOVER=0) the first cut fails an op: the test
 * fails, which is how it was checked.
 *
 * MP_DECLARE=1 declares the buffers (coh_mem_register), so verbs rails
 * write them without a copy and a resume must write them again from the
 * application's memory (mp.verbs.soft.cut.zcopy); it fails unless some
 * bytes went so.
 *
 * MP_EXPECT_MOVES=1 (verbs, with COHORT_TEST_VERBS_PORT_DOWN_MS): each cut
 * also takes the cutter's device's port down for a while, so the link
 * must resume on another rail's device and move back (mp.verbs.soft.move):
 * it fails unless both ends of the cut link counted moves.
 *
 * MP_CUT_PEER=k cuts the link to the k-th rank on the right instead (2 on
 * 4 ranks of a ring: no ring traffic; with COHORT_SMALL_BYTES=0 none at
 * all, else small ops may cross it as a star), MP_BACK_WAIT_S the time
 * the cut link may take to come back after the last op (default 3 s),
 * MP_CUT_GAP_MS a pause of the cutter before each cut after the first.
 * MP_EXPECT_ALL_BACK=1: both ends of the cut link must count a return for
 * every failover (an idle link may be lost without failing any op).
 * MP_CUTTER=r: rank r cuts (default 0); MP_CUT_CMD: a shell command the
 * cutter runs before each cut (tests/mp/blackout.sh: the network drops a
 * rail's packets for a while, so the cut's own notice never arrives).
 *
 *   test_rails blockcut ROUNDS   (2 ranks)
 *
 * Each round two allreduces, one after the other; rank 1 starts the
 * second 200 ms after the first ended. With COHORT_STASH_BYTES=0 rank 1's
 * links stop reading at the second op's first header (blocked: no receive
 * posted). 100 ms in, rank 1 cuts its link on the last rail; its next ACK
 * fails, and the link waits frozen for rank 0's resume dial
 * (COHORT_TEST_RESUME_DELAY_MS, over 100). Rank 1 starts the op then: its
 * receive is posted on a frozen link. Every op must end, right.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mp_util.h"
#include "reactor/rx_ctx.h"

#define INFLIGHT 3

static uint64_t stat_sum(coh_ctx_t *ctx, int which)
{
    uint64_t n = 0;
    for (int r = 0; r < ctx->nrails; r++)
        n += which == 0   ? atomic_load(&ctx->rails[r].en.stat_failovers)
             : which == 1 ? atomic_load(&ctx->rails[r].en.stat_returns)
                          : atomic_load(&ctx->rails[r].en.stat_resent);
    return n;
}

static void fill(float *x, size_t n, int rank, int op)
{
    for (size_t i = 0; i < n; i++) x[i] = (float)((i * 7 + (size_t)rank * 13 + (size_t)op) % 61);
}

static int check(const float *x, size_t n, int size, int op)
{
    for (size_t i = 0; i < n; i++) {
        float want = 0;
        for (int r = 0; r < size; r++) want += (float)((i * 7 + (size_t)r * 13 + (size_t)op) % 61);
        if (x[i] != want) {
            fprintf(stderr, "rank %d: op %d element %zu is %g, want %g\n", mp_rank, op, i,
                    (double)x[i], (double)want);
            return -1;
        }
    }
    return 0;
}

static int run_cut(int ops, int every)
{
    coh_comm_t *world;
    int rank, size;
    coh_ctx_t *ctx = mp_init(&world, &rank, &size);
    if (ctx->nrails < 2) MP_FAIL("needs two rails or more (cohortrun --nics lo,lo)");
    /* Frames up to 64 KiB are copied and acked late (en_tcp.c): a cut
     * finds such copies unacked, and the new socket must replay them. */
    static const size_t sizes[] = {16384, 262144, 1048576, 65536, 524288, 1024}; /* floats */
    enum { NSIZES = sizeof(sizes) / sizeof(sizes[0]) };
    float *buf[INFLIGHT];
    size_t cnt[INFLIGHT];
    coh_request_t *req[INFLIGHT] = {0};
    int id[INFLIGHT];
    bool declare = getenv("MP_DECLARE") && atoi(getenv("MP_DECLARE")) == 1;
    for (int k = 0; k < INFLIGHT; k++) {
        buf[k] = malloc(sizes[2] * sizeof(float));
        if (!buf[k]) MP_FAIL("out of memory");
        if (declare) MP_OK(coh_mem_register(ctx, buf[k], sizes[2] * sizeof(float)));
    }
    /* MP_CUT_PEER=k: the link to the k-th rank on the right (default 1,
     * the ring's neighbour; 2 on 4 ranks of a ring: no ring traffic). */
    const char *cp = getenv("MP_CUT_PEER"), *cr = getenv("MP_CUTTER");
    int cutter = cr ? atoi(cr) % size : 0, cuts = 0, victim = (cutter + (cp ? atoi(cp) : 1)) % size;
    const char *cmd = getenv("MP_CUT_CMD");   /* the cutter runs it before each cut */
    const char *gs = getenv("MP_CUT_GAP_MS"); /* the cutter waits so before each later cut */
    int gap_ms = gs ? atoi(gs) : 0;
    double t0 = mp_now_s();
    for (int op = 0; op < ops + INFLIGHT; op++) {
        int k = op % INFLIGHT;
        if (req[k]) {
            int st = coh_wait(req[k], -1);
            if (st != 0) MP_FAIL("op %d failed: %s", id[k], coh_request_error(req[k]));
            coh_request_free(req[k]);
            req[k] = NULL;
            if (check(buf[k], cnt[k], size, id[k]) != 0) MP_FAIL("op %d: wrong result", id[k]);
        }
        if (op >= ops) continue;
        cnt[k] = sizes[op % NSIZES];
        id[k] = op;
        fill(buf[k], cnt[k], rank, op);
        MP_OK(coh_allreduce(world, buf[k], buf[k], cnt[k], COH_F32, COH_SUM, &req[k]));
        if (rank == cutter && op % every == every / 2) {
            if (cuts > 0 && gap_ms > 0) usleep((useconds_t)gap_ms * 1000);
            if (cmd && system(cmd) != 0) MP_FAIL("MP_CUT_CMD failed: %s", cmd);
            /* mid-op: its frames are on the wire */
            rx_rail_debug_cut(&ctx->rails[ctx->nrails - 1], victim);
            cuts++;
        }
    }
    double dt = mp_now_s() - t0;
    /* Let the probes bring the links home, then look at the counts. */
    coh_request_t *b;
    uint64_t fo = stat_sum(ctx, 0), back = stat_sum(ctx, 1);
    const char *ws = getenv("MP_BACK_WAIT_S"); /* how long the links may take to come home */
    /* MP_EXPECT_LOST=1: the cut link never resumes (it ends, its rank lost
     * on that rail); the ops go on over the others. */
    bool lost = getenv("MP_EXPECT_LOST") && atoi(getenv("MP_EXPECT_LOST")) == 1;
    int waits = (ws ? atoi(ws) : 3) * 20;
    for (int i = 0; i < waits && (rank == cutter || rank == victim) && back < fo; i++) {
        usleep(50000);
        fo = stat_sum(ctx, 0);
        back = stat_sum(ctx, 1);
    }
    MP_OK(coh_barrier(world, &b));
    MP_EQ_INT(mp_wait(b), 0);
    printf("rank %d: %d ops in %.2f s, %d cuts, failovers %llu, returns %llu, resent %llu bytes\n",
           rank, ops, dt, cuts, (unsigned long long)fo, (unsigned long long)back,
           (unsigned long long)stat_sum(ctx, 2));
    if ((rank == cutter || rank == victim) && size > 1) {
        if (fo == 0) MP_FAIL("no failover was counted on this end of the cut link");
        /* Under a sanitizer other links may fail over (stalls) and come
         * back: the cut one must not. */
        if (lost && back >= fo) MP_FAIL("every failover came back; the cut link was to be lost");
        if (!lost && back == 0) MP_FAIL("the link never came back to its own interface");
        /* MP_EXPECT_ALL_BACK=1: every failover came back (a link that
         * carries no op may be lost without failing one). */
        if (getenv("MP_EXPECT_ALL_BACK") && atoi(getenv("MP_EXPECT_ALL_BACK")) == 1 && back < fo)
            MP_FAIL("%llu of %llu failovers did not come back", (unsigned long long)(fo - back),
                    (unsigned long long)fo);
    }
    /* The public stats say the same. */
    coh_stats_t st;
    MP_OK(coh_ctx_stats(ctx, &st));
    MP_EQ_INT(st.rail_failovers, stat_sum(ctx, 0));
    MP_EQ_INT(st.rail_returns, stat_sum(ctx, 1));
    MP_EQ_INT(st.rail_resent_bytes, stat_sum(ctx, 2));
    if (declare && st.zcopy_bytes_sent == 0) MP_FAIL("declared, but nothing went without a copy");
    bool moves = getenv("MP_EXPECT_MOVES") && atoi(getenv("MP_EXPECT_MOVES")) == 1;
    if (moves)
        printf("rank %d: %llu moves to another rail's device\n", rank,
               (unsigned long long)st.rail_moves);
    if (moves && (rank == cutter || rank == victim) && size > 1 && st.rail_moves == 0)
        MP_FAIL("no link moved to another rail's device");
    for (int k = 0; k < INFLIGHT; k++) {
        if (declare) MP_OK(coh_mem_deregister(ctx, buf[k]));
        free(buf[k]);
    }
    MP_OK(coh_finalize(ctx));
    printf("rank %d: OK\n", rank);
    return 0;
}

static int run_blockcut(int rounds)
{
    coh_comm_t *world;
    int rank, size;
    coh_ctx_t *ctx = mp_init(&world, &rank, &size);
    if (size != 2 || ctx->nrails < 2) MP_FAIL("needs 2 ranks and two rails or more");
    size_t n = 1 << 18; /* 1 MiB: every rail carries a part */
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    if (!x || !y) MP_FAIL("out of memory");
    double t0 = mp_now_s();
    for (int op = 0; op < 2 * rounds; op += 2) {
        coh_request_t *a, *b;
        fill(x, n, rank, op);
        fill(y, n, rank, op + 1);
        MP_OK(coh_allreduce(world, x, x, n, COH_F32, COH_SUM, &a));
        int st = coh_wait(a, -1);
        if (st != 0) MP_FAIL("op %d failed: %s", op, coh_request_error(a));
        coh_request_free(a);
        if (rank == 0) MP_OK(coh_allreduce(world, y, y, n, COH_F32, COH_SUM, &b));
        if (rank == 1) {
            usleep(100000); /* rank 0's frames of the next op are in: the links block */
            rx_rail_debug_cut(&ctx->rails[ctx->nrails - 1], 0);
            usleep(250000); /* its ACK failed: frozen, rank 0's dial is late */
            MP_OK(coh_allreduce(world, y, y, n, COH_F32, COH_SUM, &b));
        }
        st = coh_wait(b, -1);
        if (st != 0) MP_FAIL("op %d failed: %s", op + 1, coh_request_error(b));
        coh_request_free(b);
        if (check(x, n, size, op) != 0) MP_FAIL("op %d: wrong result", op);
        if (check(y, n, size, op + 1) != 0) MP_FAIL("op %d: wrong result", op + 1);
    }
    printf("rank %d: %d rounds in %.2f s, failovers %llu, returns %llu\n", rank, rounds,
           mp_now_s() - t0, (unsigned long long)stat_sum(ctx, 0),
           (unsigned long long)stat_sum(ctx, 1));
    if (stat_sum(ctx, 0) == 0) MP_FAIL("no failover was counted");
    free(x);
    free(y);
    MP_OK(coh_finalize(ctx));
    printf("rank %d: OK\n", rank);
    return 0;
}

/* Small ops alternating over the rails, each on a rail that was idle: an op
 * started inline by the caller (its peers' frames already stashed) waited
 * for its own send's completion until the rail thread's 50 ms poll timeout
 * (48 ms per 4 KiB allreduce on 4 ranks and 2 rails, instead of ~0.1 ms). */
static int run_latency(int ops)
{
    coh_comm_t *world;
    int rank, size;
    coh_ctx_t *ctx = mp_init(&world, &rank, &size);
    /* Back to back, as a training step's small gradients go: no work in
     * between (max keeps the values, so the last result is still checked). */
    float x[1024], y[1024];
    fill(x, 1024, rank, 0);
    double worst = 0, total = 0;
    int slow = 0, lost = 0;
    for (int op = 0; op < ops + 10; op++) {
        double t0 = mp_now_s();
        MP_OK(coh_allreduce_sync(world, x, y, 1024, COH_F32, COH_MAX));
        double dt = mp_now_s() - t0;
        if (op < 10) continue; /* warm-up */
        total += dt;
        if (dt > worst) worst = dt;
        slow += dt > 0.020;
        lost += dt > 0.045; /* the look of a wake-up lost to the 50 ms poll */
    }
    for (int i = 0; i < 1024; i++) {
        float want = 0;
        for (int r = 0; r < size; r++) {
            float v = (float)(((size_t)i * 7 + (size_t)r * 13) % 61);
            if (v > want) want = v;
        }
        if (y[i] != want) MP_FAIL("element %d is %g, want %g", i, (double)y[i], (double)want);
    }
    double mean = total / ops;
    printf("rank %d: %d allreduces of 4 KiB on %d rails: mean %.3f ms, worst %.3f ms, %d over 20 "
           "ms, %d over 45 ms\n",
           rank, ops, ctx->nrails, mean * 1e3, worst * 1e3, slow, lost);
    const char *tc = getenv("COHORT_TIMING_CHECKS");
    /* A lost wake-up costs the rail thread's 50 ms poll timeout (the defect
     * made nearly every op take 48 ms). A busy host (ctest -j2 on 2 cores,
     * 4 ranks beside another test's) stalls an op for 20-30 ms now and
     * then: 5 in 1000 were seen, none near 45 ms. */
    if (!(tc && !strcmp(tc, "0")) && (slow > ops / 20 || lost > 3))
        MP_FAIL("%d of %d 4 KiB allreduces took over 20 ms, %d over 45 ms: ops wait for a "
                "wake-up",
                slow, ops, lost);
    MP_OK(coh_finalize(ctx));
    printf("rank %d: OK\n", rank);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "cut") == 0)
        return run_cut(atoi(argv[2]), argc >= 4 ? atoi(argv[3]) : 20);
    if (argc >= 3 && strcmp(argv[1], "latency") == 0) return run_latency(atoi(argv[2]));
    if (argc >= 3 && strcmp(argv[1], "blockcut") == 0) return run_blockcut(atoi(argv[2]));
    fprintf(stderr, "usage: test_rails cut OPS [EVERY] | latency OPS | blockcut ROUNDS\n");
    return 2;
}
