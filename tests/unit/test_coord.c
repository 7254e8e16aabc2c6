/*
 * The coordinator and the member side of coh_sync, with every rank of a
 * small world as a thread of this process (a real store, real rails, real
 * control connections), so that a test can reach into one rank's state:
 *
 *   - a plan naming a rank this member knows is gone is refused, the
 *     coordinator drops that rank and groups the others again;
 *   - members whose counts differ get EMISMATCH from the coordinator;
 *   - a rank that left is not waited for, even in allreduce mode;
 *   - results are the weighted mean of the group, in every mode;
 *   - a malformed READY (a weight no API call lets through) takes only its
 *     sender out: the coordinator stays up and the others sync on;
 *   - a READY in another mode while a group of the old mode is still
 *     exchanging is no mode disagreement (cohort-load found the false
 *     EMISMATCH).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <netinet/in.h>
#include <unistd.h>

#include "reactor/rx_ctx.h"
#include "reactor/rx_sync.h"

#define MAXR 4

typedef struct world world_t;
typedef void (*rank_fn)(world_t *w, int r, coh_ctx_t *ctx);

struct world {
    int n;
    int timeout_ms; /* each rank's op timeout (no progress for this long) */
    int port;
    int store_fd;
    coh_sync_mode mode;
    rank_fn fn;
    uv_barrier_t barrier;
    int status[MAXR]; /* what each rank's syncs ended with */
    int gsize[MAXR];  /* size of each rank's last group */
    double result[MAXR];
    _Atomic int finished;
    coh_request_t *pending; /* a request left running into finalize */
};

typedef struct arg {
    world_t *w;
    int r;
} arg_t;

static void rank_main(void *p)
{
    arg_t *a = p;
    world_t *w = a->w;
    coh_config_t cfg;
    assert_int_equal(coh_config_init(&cfg), 0);
    char store[64];
    snprintf(store, sizeof(store), "127.0.0.1:%d", w->port);
    cfg.rank = a->r;
    cfg.world_size = w->n;
    cfg.store = store;
    cfg.store_fd = a->r == 0 ? w->store_fd : -1;
    cfg.token = "unit";
    cfg.nics = "127.0.0.1";
    cfg.timeout_ms = w->timeout_ms;
    cfg.connect_timeout_ms = 20000;
    cfg.sync_mode = w->mode;
    coh_ctx_t *ctx;
    int st = coh_init(&cfg, &ctx);
    if (st) fail_msg("rank %d: coh_init: %s", a->r, coh_last_error());
    uv_barrier_wait(&w->barrier);
    w->fn(w, a->r, ctx);
    uv_barrier_wait(&w->barrier);
    assert_int_equal(coh_finalize(ctx), 0);
}

static void run_world_timeout(world_t *w, int n, coh_sync_mode mode, rank_fn fn, int timeout_ms)
{
    memset(w, 0, sizeof(*w));
    w->n = n;
    w->timeout_ms = timeout_ms;
    w->mode = mode;
    w->fn = fn;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    uv_ip4_addr("127.0.0.1", 0, &a);
    socklen_t len = sizeof(a);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(fd, 64), 0);
    getsockname(fd, (struct sockaddr *)&a, &len);
    w->port = ntohs(a.sin_port);
    w->store_fd = fd; /* adopted by rank 0's store */
    uv_barrier_init(&w->barrier, (unsigned)n);
    uv_thread_t th[MAXR];
    arg_t args[MAXR];
    for (int r = 0; r < n; r++) {
        args[r] = (arg_t){w, r};
        assert_int_equal(uv_thread_create(&th[r], rank_main, &args[r]), 0);
    }
    for (int r = 0; r < n; r++) uv_thread_join(&th[r]);
    uv_barrier_destroy(&w->barrier);
}

/* 3 s: the tests that end by a peer's silence end soon. */
static void run_world(world_t *w, int n, coh_sync_mode mode, rank_fn fn)
{
    run_world_timeout(w, n, mode, fn, 3000);
}

/* One sync of a single f64 x = r + 1 with weight r + 1. */
static void sync_once(world_t *w, int r, coh_ctx_t *ctx, size_t count)
{
    coh_comm_t *world;
    coh_ctx_world(ctx, &world);
    double x[8];
    for (size_t i = 0; i < count; i++) x[i] = r + 1;
    coh_request_t *req;
    coh_stats_t s0, s1;
    assert_int_equal(coh_ctx_stats(ctx, &s0), 0);
    assert_int_equal(coh_sync(world, x, count, COH_F64, 0, r + 1, &req), 0);
    w->status[r] = coh_wait(req, 15000);
    coh_group_info_t g;
    if (w->status[r] == 0) {
        assert_int_equal(coh_request_group(req, &g), 0);
        /* the stats count it: one sync, its group, its times */
        assert_int_equal(coh_ctx_stats(ctx, &s1), 0);
        assert_int_equal(s1.syncs, s0.syncs + 1);
        assert_int_equal(s1.sync_members, s0.sync_members + (uint64_t)g.size);
        assert_int_equal(s1.sync_full, s0.sync_full + (g.full ? 1 : 0));
        assert_true(s1.sync_wait_us + s1.sync_comm_us >= s0.sync_wait_us + s0.sync_comm_us);
        w->gsize[r] = g.size;
        w->result[r] = x[0];
        /* sum((m+1) * (m+1)) / sum(m+1) over the members */
        double num = 0, den = 0;
        for (int i = 0; i < g.size; i++) {
            num += (g.members[i] + 1.0) * (g.members[i] + 1.0);
            den += g.members[i] + 1.0;
        }
        assert_true(x[0] == num / den);
    }
    coh_request_free(req);
}

static int run_on_rail(rx_reactor_t *rx, void *arg)
{
    en_rail_t *rail = &((rx_rail_t *)rx->owner)->en;
    int gone = *(int *)arg;
    uv_mutex_lock(&rail->mu);
    rail->lost[gone] = 1;
    uv_mutex_unlock(&rail->mu);
    return 0;
}

static void refuse_fn(world_t *w, int r, coh_ctx_t *ctx)
{
    if (r == 1) {
        /* Rank 1 believes rank 2 is gone (as if its data connection died);
         * the coordinator does not know yet. */
        int gone = 2;
        for (int i = 0; i < ctx->nrails; i++)
            rx_reactor_call(&ctx->rails[i].rx, run_on_rail, &gone);
    }
    sync_once(w, r, ctx, 1);
}

static void test_refuse_gone_member(void **state)
{
    (void)state;
    world_t w;
    run_world(&w, 3, COH_SYNC_ALLREDUCE, refuse_fn);
    /* Ranks 0 and 1 synchronise with each other; rank 2 is out. */
    assert_int_equal(w.status[0], 0);
    assert_int_equal(w.status[1], 0);
    assert_int_equal(w.gsize[0], 2);
    assert_int_equal(w.gsize[1], 2);
    assert_int_not_equal(w.status[2], 0);
}

static void mismatch_fn(world_t *w, int r, coh_ctx_t *ctx)
{
    sync_once(w, r, ctx, r ? 3 : 2);
}

static void test_mismatched_counts(void **state)
{
    (void)state;
    world_t w;
    run_world(&w, 2, COH_SYNC_ALLREDUCE, mismatch_fn);
    assert_int_equal(w.status[0], COH_EMISMATCH);
    assert_int_equal(w.status[1], COH_EMISMATCH);
}

static void leave_fn(world_t *w, int r, coh_ctx_t *ctx)
{
    coh_comm_t *world;
    coh_ctx_world(ctx, &world);
    if (r == 2) {
        assert_int_equal(coh_sync_leave(world), 0);
        /* Back once the others are done (and have left): alone, its sync is
         * a group of one. */
        while (atomic_load(&w->finished) < 2) usleep(10000);
        sync_once(w, r, ctx, 4);
        return;
    }
    usleep(100000); /* let the LEAVE land first */
    for (int i = 0; i < 3; i++) {
        sync_once(w, r, ctx, 4);
        assert_int_equal(w->status[r], 0);
        assert_int_equal(w->gsize[r], 2); /* rank 2 is not waited for */
    }
    assert_int_equal(coh_sync_leave(world), 0);
    atomic_fetch_add(&w->finished, 1);
}

static void test_left_rank_not_waited_for(void **state)
{
    (void)state;
    world_t w;
    run_world(&w, 3, COH_SYNC_ALLREDUCE, leave_fn);
    assert_int_equal(w.status[0], 0);
    assert_int_equal(w.status[1], 0);
    assert_int_equal(w.gsize[0], 2);
    assert_int_equal(w.status[2], 0); /* it came back */
    assert_int_equal(w.gsize[2], 1);
}

static void malformed_fn(world_t *w, int r, coh_ctx_t *ctx)
{
    if (r == 2) {
        /* What the API refuses: a READY with weight 1e308 (two of them made
         * the group's total infinite, and every member then lost the
         * coordinator to a PLAN it could not parse). */
        rx_ctl_msg_t m = {.type = RX_CTL_READY};
        m.u.ready = (rx_ctl_ready_t){
            .rank = 2, .count = 8, .dtype = COH_F64, .weight = 1e308, .attempt = 99};
        assert_int_equal(rx_member_send_raw(ctx, &m), 0);
        usleep(300000);
        coh_comm_t *world;
        coh_ctx_world(ctx, &world);
        double x[8] = {0};
        coh_request_t *req;
        int st = coh_sync(world, x, 8, COH_F64, 0, 1.0, &req);
        if (st == 0) {
            st = coh_wait(req, 15000);
            coh_request_free(req);
        }
        w->status[2] = st; /* out: its connection to the coordinator is gone */
        return;
    }
    usleep(100000);
    for (int i = 0; i < 3; i++) {
        sync_once(w, r, ctx, 8);
        assert_int_equal(w->status[r], 0);
    }
}

/* Ranks 0 and 1 sync a large buffer in allreduce mode (rank 2 has left);
 * while they exchange, rank 2 syncs alone in partial mode. The planned
 * group is not a rank waiting in another mode: no EMISMATCH. */
#define BIG_COUNT (48u << 20) /* 384 MiB of f64: an exchange of about a second */
/* coh_wait with a limit, then until the request is done: its buffer is the
 * library's until then. A loaded host (ctest -j12 beside it) took over 15 s
 * for the 384 MiB exchange; the test freed x after the timed-out wait and
 * the rail thread still copying from it crashed (the "race" TSan reported).
 * The limit's EAGAIN is kept: the test still fails on it. */
static int wait_then_own(coh_request_t *req)
{
    int st = coh_wait(req, 60000);
    if (st == COH_EAGAIN) coh_wait(req, -1);
    return st;
}

static void mode_switch_fn(world_t *w, int r, coh_ctx_t *ctx)
{
    coh_comm_t *world;
    coh_ctx_world(ctx, &world);
    if (r == 2) {
        assert_int_equal(coh_sync_leave(world), 0);
        while (atomic_load(&w->finished) < 2) usleep(1000); /* both submitted */
        usleep(100000); /* their group is planned and exchanging */
        double x = 3;
        coh_request_t *req;
        assert_int_equal(coh_sync_ex(world, &x, 1, COH_F64, 1, 1.0, COH_SYNC_PARTIAL, &req), 0);
        w->status[2] = wait_then_own(req);
        coh_request_free(req);
        return;
    }
    usleep(100000); /* rank 2's LEAVE first */
    double *x = malloc(BIG_COUNT * sizeof(double));
    assert_non_null(x);
    for (size_t i = 0; i < BIG_COUNT; i++) x[i] = r;
    coh_request_t *req;
    assert_int_equal(coh_sync_ex(world, x, BIG_COUNT, COH_F64, 0, 1.0, COH_SYNC_ALLREDUCE, &req),
                     0);
    atomic_fetch_add(&w->finished, 1);
    w->status[r] = wait_then_own(req);
    coh_request_free(req);
    free(x);
    assert_int_equal(coh_sync_leave(world), 0);
}

static void test_mode_switch_while_exchanging(void **state)
{
    (void)state;
#if defined(__SANITIZE_THREAD__)
    /* Two 384 MiB syncs are too slow under TSan for the 3 s op timeout
     * (the race TSan once reported here was the test's: wait_then_own). */
    skip();
#endif
    world_t w;
    /* 30 s, not 3: under ASan beside other tests (CI, 2026-11-29) rank 0's
     * sync ended ETIMEDOUT, 3 s without progress on a host too loaded to fill
     * and move 384 MiB at pace. Nothing here waits for a silent peer, so a
     * long limit costs nothing and a real hang still fails. */
    run_world_timeout(&w, 3, COH_SYNC_ALLREDUCE, mode_switch_fn, 30000);
    assert_int_equal(w.status[0], 0);
    assert_int_equal(w.status[1], 0);
    assert_int_equal(w.status[2], 0);
}

static void test_malformed_ready(void **state)
{
    (void)state;
    world_t w;
    run_world(&w, 3, COH_SYNC_ALLREDUCE, malformed_fn);
    assert_int_equal(w.status[0], 0);
    assert_int_equal(w.status[1], 0);
    assert_int_equal(w.gsize[0], 2);
    assert_int_equal(w.status[2], COH_EPEER);
}

static void modes_fn(world_t *w, int r, coh_ctx_t *ctx)
{
    for (int i = 0; i < 5; i++) {
        usleep((useconds_t)(1000 * r));
        sync_once(w, r, ctx, 8);
        assert_int_equal(w->status[r], 0);
    }
    coh_comm_t *world;
    coh_ctx_world(ctx, &world);
    assert_int_equal(coh_sync_leave(world), 0);
}

static void test_every_mode(void **state)
{
    (void)state;
    for (int m = 0; m < COH_SYNC_MODE_COUNT; m++) {
        world_t w;
        run_world(&w, 4, (coh_sync_mode)m, modes_fn);
        for (int r = 0; r < 4; r++) assert_int_equal(w.status[r], 0);
    }
}

/* Rank 0 finalizes with an allreduce that rank 1 never joins: the request
 * ends cancelled at finalize, not after its op timeout, and stays readable
 * after the context is gone. */
static void pending_fn(world_t *w, int r, coh_ctx_t *ctx)
{
    if (r != 0) return;
    coh_comm_t *world;
    coh_ctx_world(ctx, &world);
    static float x[16];
    assert_int_equal(coh_allreduce(world, NULL, x, 16, COH_F32, COH_SUM, &w->pending), 0);
    usleep(100000);
    int done = 1;
    assert_int_equal(coh_test(w->pending, &done), 0);
    assert_int_equal(done, 0);
}

static void test_finalize_cancels(void **state)
{
    (void)state;
    world_t w;
    run_world(&w, 2, COH_SYNC_ALLREDUCE, pending_fn);
    assert_non_null(w.pending);
    /* Cancelled by its own finalize, or failed because rank 1 finalized
     * first: either way at finalize, never by the 3 s op timeout. */
    int st = coh_wait(w.pending, 0);
    char why[256];
    snprintf(why, sizeof(why), "%s", coh_request_error(w.pending));
    int ok = (st == COH_ECANCELED || st == COH_EPEER) && strstr(why, "finalized") != NULL;
    coh_request_free(w.pending);
    if (!ok) fail_msg("pending request ended with %s: %s", coh_status_name(st), why);
}

/* A stranger at the coordinator's control port (wrong token, then
 * garbage) is refused and counted in connections_rejected, like the rails'
 * and the store's refusals (the coordinator's listener used to be missed). */
static void stranger_fn(world_t *w, int r, coh_ctx_t *ctx)
{
    (void)w;
    if (r != 0) return;
    coh_stats_t before, after;
    assert_int_equal(coh_ctx_stats(ctx, &before), 0);
    for (int k = 0; k < 2; k++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        assert_int_equal(
            connect(fd, (struct sockaddr *)&ctx->coord_addr, sizeof(struct sockaddr_in)), 0);
        uint8_t b[EN_HELLO_SIZE];
        if (k == 0) {
            en_hello_t h = {.version = EN_PROTO_VERSION, .kind = EN_HELLO_CTRL, .world = 2};
            en_hello_set_token(&h, "not-the-token");
            en_hello_encode(&h, b);
        } else {
            memset(b, 'G', sizeof(b));
        }
        assert_int_equal(send(fd, b, sizeof(b), MSG_NOSIGNAL), (ssize_t)sizeof(b));
        char c;
        assert_true(recv(fd, &c, 1, 0) <= 0); /* closed without an answer */
        close(fd);
    }
    for (int i = 0; i < 100; i++) {
        assert_int_equal(coh_ctx_stats(ctx, &after), 0);
        if (after.connections_rejected >= before.connections_rejected + 2) break;
        usleep(10000);
    }
    assert_int_equal(after.connections_rejected, before.connections_rejected + 2);
}

static void test_coordinator_counts_strangers(void **state)
{
    (void)state;
    world_t w;
    run_world(&w, 2, COH_SYNC_ALLREDUCE, stranger_fn);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refuse_gone_member),
        cmocka_unit_test(test_mismatched_counts),
        cmocka_unit_test(test_left_rank_not_waited_for),
        cmocka_unit_test(test_malformed_ready),
        cmocka_unit_test(test_mode_switch_while_exchanging),
        cmocka_unit_test(test_every_mode),
        cmocka_unit_test(test_finalize_cancels),
        cmocka_unit_test(test_coordinator_counts_strangers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
