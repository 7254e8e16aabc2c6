/*
 * Rails as the runtime sees them: one reactor thread per NIC running one
 * engine rail (engines/engine.h). Everything that crosses threads is here:
 * other threads post tasks that call the engine on its loop; the engine
 * reports only through the completions it was given.
 */
#include <stdio.h>
#include <string.h>

#include "reactor/rx_ctx.h"

/* Threading: loop thread, as the reactor stops. */
static void rail_on_stop(rx_reactor_t *rx)
{
    rx_rail_t *r = rx->owner;
    en_rail_shutdown(&r->en);
}

/* Threading: loop thread. Ops in flight: frames will come soon. */
static bool rail_busy(rx_reactor_t *rx)
{
    rx_rail_t *r = rx->owner;
    return en_rail_busy(&r->en);
}

/* Threading: whichever thread runs the loop. Shared-memory rings and the
 * sends they completed are seen here, not through an fd. */
static bool rail_poll(rx_reactor_t *rx)
{
    rx_rail_t *r = rx->owner;
    return en_rail_poll(&r->en);
}

static bool rail_arm(rx_reactor_t *rx)
{
    rx_rail_t *r = rx->owner;
    return en_rail_arm(&r->en);
}

/* Bytes moved either way, on any transport: a pass that moved none did
 * nothing a waiter needs. */
static uint64_t rail_progress(rx_reactor_t *rx)
{
    rx_rail_t *r = rx->owner;
    return atomic_load_explicit(&r->en.stat_bytes_in, memory_order_relaxed) +
           atomic_load_explicit(&r->en.stat_bytes_out, memory_order_relaxed);
}

static bool rail_streams(rx_reactor_t *rx)
{
    rx_rail_t *r = rx->owner;
    return atomic_load(&r->en.stream_socks) != 0;
}

static bool rail_writes(rx_reactor_t *rx)
{
    rx_rail_t *r = rx->owner;
    return atomic_load(&r->en.uv_writes) != 0;
}

static int open_fn(rx_reactor_t *rx, void *arg)
{
    (void)arg;
    rx_rail_t *r = rx->owner;
    return en_rail_open(&r->en, &rx->loop);
}

int rx_rail_start(rx_rail_t *r, const en_rail_cfg_t *cfg, int poll_us)
{
    memset(r, 0, sizeof(*r));
    BS_CHECK(en_rail_init(&r->en, cfg));
    char name[32];
    snprintf(name, sizeof(name), "cohort-rail%d", cfg->index);
    const rx_reactor_hooks_t hooks = {.busy = rail_busy,
                                      .poll = rail_poll,
                                      .arm = rail_arm,
                                      .progress = rail_progress,
                                      .streams = rail_streams,
                                      .writes = rail_writes};
    int st =
        rx_reactor_start_hooked(&r->rx, name, rail_on_stop, r, &hooks, (uint64_t)poll_us * 1000ull);
    if (st == 0) st = rx_reactor_call(&r->rx, open_fn, NULL);
    if (st < 0) {
        char why[512];
        snprintf(why, sizeof(why), "%s", coh_last_error());
        rx_rail_stop(r, 0);
        rx_rail_fini(r);
        return bs_fail(st, "%s", why);
    }
    return 0;
}

typedef struct dial_task {
    rx_task_t task;
    int peer;
    struct sockaddr_storage addr;
} dial_task_t;

static void dial_run(rx_task_t *t, rx_reactor_t *rx)
{
    dial_task_t *dt = (dial_task_t *)t;
    rx_rail_t *r = rx->owner;
    en_rail_dial(&r->en, dt->peer, (struct sockaddr *)&dt->addr);
    coh_free(dt);
}

int rx_rail_dial(rx_rail_t *r, int peer, const struct sockaddr *addr)
{
    dial_task_t *dt = coh_zalloc(sizeof(*dt));
    if (!dt) return bs_fail(COH_ENOMEM, "out of memory");
    dt->task.run = dial_run;
    dt->peer = peer;
    memcpy(&dt->addr, addr,
           addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in));
    if (!rx_reactor_post(&r->rx, &dt->task)) {
        coh_free(dt);
        return bs_fail(COH_ESTATE, "rail %d is stopping", r->en.index);
    }
    return 0;
}

static void slice_run(rx_task_t *t, rx_reactor_t *rx)
{
    rx_slice_t *s = (rx_slice_t *)t;
    rx_rail_t *r = rx->owner;
    en_op_t *op = s->op;
    s->op = NULL; /* the rail owns it now */
    en_rail_start_op(&r->en, op);
}

void rx_rail_submit(rx_rail_t *r, rx_slice_t *s, bool inline_ok)
{
    s->task.run = slice_run;
    /* A small op starts right here when the loop is free: no wake-up on the
     * latency path. A large one is posted, so the caller is not held up by
     * its first sends and copies (it may want to compute meanwhile). */
    bool taken =
        inline_ok ? rx_reactor_run_or_post(&r->rx, &s->task) : rx_reactor_post(&r->rx, &s->task);
    if (taken) return;
    /* The rail is stopping (a finalize raced the submission): the slice
     * ends cancelled here, as the engine would have ended it. */
    en_op_t *op = s->op;
    s->op = NULL;
    en_completion_t *c = op->comp;
    int slice = op->slice;
    en_op_free(op);
    en_result_t res = {.slice = slice, .status = COH_ECANCELED, .why = "the context was finalized"};
    c->fn(c, &res);
}

typedef struct cancel_task {
    rx_task_t task;
    uint32_t comm;
    uint64_t seq;
    int status;
    int npeers;  /* > 0: also tell these peers (ABORT) */
    bool revoke; /* every op of comm, seq aside */
    int peers[64];
    char why[BS_ERR_LEN];
} cancel_task_t;

static void cancel_run(rx_task_t *t, rx_reactor_t *rx)
{
    cancel_task_t *ct = (cancel_task_t *)t;
    rx_rail_t *r = rx->owner;
    if (ct->revoke)
        en_rail_revoke_comm(&r->en, ct->comm, ct->status, ct->why);
    else
        en_rail_abort_op(&r->en, ct->comm, ct->seq, ct->status, ct->why, ct->peers, ct->npeers);
    coh_free(ct);
}

static void post_cancel(rx_rail_t *r, uint32_t comm, uint64_t seq, int status, const char *why,
                        const int *peers, int npeers, bool revoke)
{
    cancel_task_t *ct = coh_zalloc(sizeof(*ct));
    if (!ct) return; /* the ops still end: by their own progress or their timeout */
    ct->task.run = cancel_run;
    ct->comm = comm;
    ct->seq = seq;
    ct->status = status;
    ct->revoke = revoke;
    ct->npeers = npeers < 64 ? npeers : 64;
    if (ct->npeers > 0) memcpy(ct->peers, peers, sizeof(int) * (size_t)ct->npeers);
    snprintf(ct->why, sizeof(ct->why), "%s", why);
    /* A stopped rail runs nothing more: there is nothing left to cancel. */
    if (!rx_reactor_post(&r->rx, &ct->task)) coh_free(ct);
}

void rx_rail_abort(rx_rail_t *r, uint32_t comm, uint64_t seq, int status, const char *why,
                   const int *peers, int npeers)
{
    post_cancel(r, comm, seq, status, why, peers, npeers, false);
}

void rx_rail_cancel(rx_rail_t *r, uint32_t comm, uint64_t seq, int status, const char *why)
{
    rx_rail_abort(r, comm, seq, status, why, NULL, 0);
}

void rx_rail_revoke(rx_rail_t *r, uint32_t comm, int status, const char *why)
{
    post_cancel(r, comm, 0, status, why, NULL, 0, true);
}

typedef struct drop_task {
    rx_task_t task;
    int peer, status;
    char why[BS_ERR_LEN];
} drop_task_t;

static void drop_run(rx_task_t *t, rx_reactor_t *rx)
{
    drop_task_t *dt = (drop_task_t *)t;
    rx_rail_t *r = rx->owner;
    en_rail_drop_peer(&r->en, dt->peer, dt->status, dt->why);
    coh_free(dt);
}

typedef struct cut_task {
    rx_task_t task;
    int peer;
} cut_task_t;

static void cut_run(rx_task_t *t, rx_reactor_t *rx)
{
    cut_task_t *ct = (cut_task_t *)t;
    rx_rail_t *r = rx->owner;
    en_rail_debug_cut(&r->en, ct->peer);
    coh_free(ct);
}

void rx_rail_debug_cut(rx_rail_t *r, int peer)
{
    cut_task_t *ct = coh_zalloc(sizeof(*ct));
    if (!ct) return;
    ct->task.run = cut_run;
    ct->peer = peer;
    if (!rx_reactor_post(&r->rx, &ct->task)) coh_free(ct);
}

void rx_rail_drop_peer(rx_rail_t *r, int peer, int status, const char *why)
{
    drop_task_t *dt = coh_zalloc(sizeof(*dt));
    if (!dt) return; /* its ops still end, at their timeout */
    dt->task.run = drop_run;
    dt->peer = peer;
    dt->status = status;
    snprintf(dt->why, sizeof(dt->why), "%s", why);
    if (!rx_reactor_post(&r->rx, &dt->task)) coh_free(dt);
}

static int close_fn(rx_reactor_t *rx, void *arg)
{
    (void)arg;
    rx_rail_t *r = rx->owner;
    en_rail_close(&r->en);
    return 0;
}

void rx_rail_close(rx_rail_t *r)
{
    if (atomic_load(&r->rx.state) == RX_RUNNING) rx_reactor_call(&r->rx, close_fn, NULL);
}

void rx_rail_stop(rx_rail_t *r, uint64_t quiet_deadline_ns)
{
    rx_rail_close(r);
    if (r->en.sync_init) en_rail_wait_quiet(&r->en, quiet_deadline_ns);
    rx_reactor_stop(&r->rx);
}

void rx_rail_fini(rx_rail_t *r)
{
    rx_reactor_fini(&r->rx);
    en_rail_fini(&r->en);
}
