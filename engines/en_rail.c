/*
 * A rail: one NIC's reactor, its connections to every peer and the ops in
 * flight on it. The higher rank dials the lower one; both sides check the
 * other's HELLO (job token first) before anything else is read.
 */
#include "reactor/rx_alloc.h"
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "engines/engine.h"

static void timer_cb(uv_timer_t *h)
{
    en_rail_t *rail = h->data;
    en_exec_check_timeouts(rail);
}

void en_rail_arm_timer(en_rail_t *rail)
{
    if (rail->timer_on) return;
    uint64_t period = (uint64_t)rail->timeout_ms / 4;
    if (period > 250) period = 250;
    if (period < 10) period = 10;
    uv_timer_start(&rail->timer, timer_cb, period, period);
    rail->timer_on = true;
}

/* Threading: loop thread, as the reactor stops. */
static void rail_on_stop(rx_reactor_t *rx)
{
    en_rail_t *rail = rx->owner;
    en_exec_fail_all(rail, COH_ECANCELED, false, "the context was finalized");
    en_exec_drop_stash(rail);
    uv_close((uv_handle_t *)&rail->timer, NULL);
    rail->ops->tr_shutdown(rail);
}

/* Threading: loop thread. Ops in flight: frames will come soon. */
static bool rail_busy(rx_reactor_t *rx)
{
    en_rail_t *rail = rx->owner;
    return rail->ops_head != NULL;
}

static int listen_fn(rx_reactor_t *rx, void *arg)
{
    (void)arg;
    en_rail_t *rail = rx->owner;
    uv_timer_init(&rx->loop, &rail->timer);
    rail->timer.data = rail;
    en_rail_arm_timer(rail);
    return rail->ops->tr_listen(rail, (struct sockaddr *)&rail->local, &rail->bound);
}

int en_rail_start(en_rail_t *rail, struct coh_ctx *ctx, int index, int rank, int world, int nrails,
                  const struct sockaddr *local, const char *token, int timeout_ms,
                  size_t sockbuf_bytes, int poll_us, size_t stash_bytes)
{
    memset(rail, 0, sizeof(*rail));
    rail->ctx = ctx;
    rail->index = index;
    rail->rank = rank;
    rail->world = world;
    rail->nrails = nrails;
    rail->token = token;
    rail->timeout_ms = timeout_ms;
    rail->sockbuf_bytes = sockbuf_bytes;
    rail->stash_limit = stash_bytes;
    rail->ops = &en_tcp_ops;
    memcpy(&rail->local, local,
           local->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in));
    rail->peers = coh_zalloc(sizeof(en_conn_t *) * (size_t)world);
    rail->lost = coh_zalloc((size_t)world);
    if (!rail->peers || !rail->lost) {
        coh_free(rail->peers);
        coh_free(rail->lost);
        return rx_fail(COH_ENOMEM, "rail %d: out of memory", index);
    }
    uv_mutex_init(&rail->mu);
    uv_cond_init(&rail->cv);
    char name[32];
    snprintf(name, sizeof(name), "cohort-rail%d", index);
    int st = rx_reactor_start_polling(&rail->rx, name, rail_on_stop, rail, rail_busy,
                                      (uint64_t)poll_us * 1000ull);
    if (st < 0) goto fail;
    st = rx_reactor_call(&rail->rx, listen_fn, NULL);
    if (st < 0) {
        char why[512];
        snprintf(why, sizeof(why), "%s", coh_last_error());
        rx_reactor_stop(&rail->rx);
        rx_fail(st, "%s", why);
        goto fail;
    }
    return 0;
fail:
    uv_cond_destroy(&rail->cv);
    uv_mutex_destroy(&rail->mu);
    coh_free(rail->peers);
    coh_free(rail->lost);
    rail->peers = NULL;
    rail->lost = NULL;
    return st;
}

static void set_conn_status(en_rail_t *rail, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_conn_status(en_rail_t *rail, int status, const char *fmt, ...)
{
    uv_mutex_lock(&rail->mu);
    if (rail->conn_status == 0) {
        rail->conn_status = status;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(rail->conn_why, sizeof(rail->conn_why), fmt, ap);
        va_end(ap);
    }
    uv_cond_broadcast(&rail->cv);
    uv_mutex_unlock(&rail->mu);
}

typedef struct connect_task {
    rx_task_t task;
    int peer;
    struct sockaddr_storage addr;
} connect_task_t;

static void connect_run(rx_task_t *t, rx_reactor_t *rx)
{
    connect_task_t *ct = (connect_task_t *)t;
    en_rail_t *rail = rx->owner;
    int e = rail->ops->tr_connect(rail, ct->peer, (struct sockaddr *)&ct->addr);
    if (e < 0) set_conn_status(rail, e, "%s", coh_last_error());
    coh_free(ct);
}

int en_rail_connect(en_rail_t *rail, int peer, const struct sockaddr *addr)
{
    connect_task_t *ct = coh_zalloc(sizeof(*ct));
    if (!ct) return COH_ENOMEM;
    ct->task.run = connect_run;
    ct->peer = peer;
    memcpy(&ct->addr, addr,
           addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in));
    rx_reactor_post(&rail->rx, &ct->task);
    return 0;
}

int en_rail_wait_connected(en_rail_t *rail, uint64_t deadline_ns)
{
    int st = 0;
    uv_mutex_lock(&rail->mu);
    while (rail->nready < rail->world - 1 && rail->conn_status == 0) {
        uint64_t now = rx_now_ns();
        if (now >= deadline_ns) break;
        uv_cond_timedwait(&rail->cv, &rail->mu, deadline_ns - now);
    }
    if (rail->conn_status < 0) {
        st = rx_fail(rail->conn_status, "rail %d: %s", rail->index, rail->conn_why);
    } else if (rail->nready < rail->world - 1) {
        char missing[256] = "";
        size_t ml = 0;
        for (int p = 0; p < rail->world && ml < sizeof(missing) - 16; p++)
            if (p != rail->rank && !rail->peers[p])
                ml += (size_t)snprintf(missing + ml, sizeof(missing) - ml, " %d", p);
        st = rx_fail(COH_ETIMEDOUT, "rail %d: timed out waiting for rank(s)%s to connect",
                     rail->index, missing);
    }
    uv_mutex_unlock(&rail->mu);
    return st;
}

void en_rail_fill_hello(en_rail_t *rail, en_hello_t *h)
{
    memset(h, 0, sizeof(*h));
    h->version = EN_PROTO_VERSION;
    h->kind = EN_HELLO_DATA;
    h->rank = (uint32_t)rail->rank;
    h->world = (uint32_t)rail->world;
    h->rail = (uint32_t)rail->index;
    h->nrails = (uint32_t)rail->nrails;
    en_hello_set_token(h, rail->token);
}

int en_rail_check_hello(en_rail_t *rail, const en_hello_t *h, bool incoming, char *why,
                        size_t whylen)
{
    /* The token first: a stranger learns nothing else about the job. */
    if (!en_hello_token_ok(h, rail->token)) {
        snprintf(why, whylen, "wrong job token");
        return COH_EAUTH;
    }
    if (h->kind != EN_HELLO_DATA) {
        snprintf(why, whylen, "not a data connection (kind %u)", h->kind);
        return COH_EPROTO;
    }
    if ((int)h->world != rail->world || (int)h->nrails != rail->nrails ||
        (int)h->rail != rail->index) {
        snprintf(why, whylen,
                 "peer has world %u, %u rails, rail %u; this rank has world %d, %d rails, rail %d",
                 h->world, h->nrails, h->rail, rail->world, rail->nrails, rail->index);
        return COH_EPROTO;
    }
    int r = (int)h->rank;
    if (r == rail->rank || (incoming && r < rail->rank)) {
        snprintf(why, whylen, "rank %d may not dial rank %d", r, rail->rank);
        return COH_EPROTO;
    }
    if (rail->peers[r] || rail->lost[r]) {
        snprintf(why, whylen, "rank %d is already connected", r);
        return COH_EPROTO;
    }
    return 0;
}

void en_rail_conn_ready(en_rail_t *rail, en_conn_t *c)
{
    uv_mutex_lock(&rail->mu);
    rail->peers[c->peer] = c;
    rail->nready++;
    uv_cond_broadcast(&rail->cv);
    uv_mutex_unlock(&rail->mu);
}

void en_rail_conn_lost(en_rail_t *rail, en_conn_t *c, int status, const char *why)
{
    int p = c->peer;
    if (p < 0 || rail->peers[p] != c) {
        /* Never identified: a stranger, a bad handshake, or our own dial failing. */
        if (c->outgoing) {
            set_conn_status(rail, status ? status : COH_EPEER, "connecting: %s", why);
        } else {
            rx_log(COH_LOG_WARN, "rank %d rail %d: dropped an incoming connection: %s", rail->rank,
                   rail->index, why);
        }
        return;
    }
    uv_mutex_lock(&rail->mu);
    rail->peers[p] = NULL;
    rail->lost[p] = 1;
    rail->nready--;
    uv_mutex_unlock(&rail->mu);
    if (status != COH_ECANCELED)
        rx_log(c->peer_bye ? COH_LOG_INFO : COH_LOG_WARN, "rank %d rail %d: lost rank %d: %s",
               rail->rank, rail->index, p, why);
    char msg[RX_ERR_LEN];
    snprintf(msg, sizeof(msg), "%s rank %d on rail %d (%s)",
             c->peer_bye ? "finalized:" : "lost the connection to", p, rail->index, why);
    en_exec_fail_peer(rail, p, COH_EPEER, msg);
}

typedef struct cancel_task {
    rx_task_t task;
    uint32_t comm;
    uint64_t seq;
    int status;
    char why[RX_ERR_LEN];
} cancel_task_t;

static void cancel_run(rx_task_t *t, rx_reactor_t *rx)
{
    cancel_task_t *ct = (cancel_task_t *)t;
    en_exec_cancel(rx->owner, ct->comm, ct->seq, ct->status, ct->why);
    coh_free(ct);
}

void en_rail_cancel(en_rail_t *rail, uint32_t comm, uint64_t seq, int status, const char *why)
{
    cancel_task_t *ct = coh_zalloc(sizeof(*ct));
    if (!ct) return; /* the slice still ends: by its own progress or timeout */
    ct->task.run = cancel_run;
    ct->comm = comm;
    ct->seq = seq;
    ct->status = status;
    snprintf(ct->why, sizeof(ct->why), "%s", why);
    rx_reactor_post(&rail->rx, &ct->task);
}

typedef struct abort_task {
    rx_task_t task;
    uint32_t comm;
    uint64_t seq;
    int status;
    int npeers;
    int peers[64];
    char why[RX_ERR_LEN];
} abort_task_t;

static void abort_run(rx_task_t *t, rx_reactor_t *rx)
{
    abort_task_t *at = (abort_task_t *)t;
    en_rail_t *rail = rx->owner;
    en_exec_cancel(rail, at->comm, at->seq, at->status, at->why);
    for (int i = 0; i < at->npeers; i++) {
        int p = at->peers[i];
        if (p >= 0 && p < rail->world && rail->peers[p])
            en_exec_send_ctl(rail->peers[p], EN_FRAME_ABORT, at->comm, at->seq, at->status,
                             at->why);
    }
    coh_free(at);
}

void en_rail_abort(en_rail_t *rail, uint32_t comm, uint64_t seq, int status, const char *why,
                   const int *peers, int npeers)
{
    abort_task_t *at = coh_zalloc(sizeof(*at));
    if (!at) return;
    at->task.run = abort_run;
    at->comm = comm;
    at->seq = seq;
    at->status = status;
    at->npeers = npeers < 64 ? npeers : 64;
    memcpy(at->peers, peers, sizeof(int) * (size_t)at->npeers);
    snprintf(at->why, sizeof(at->why), "%s", why);
    rx_reactor_post(&rail->rx, &at->task);
}

static int bye_fn(rx_reactor_t *rx, void *arg)
{
    (void)arg;
    en_rail_t *rail = rx->owner;
    for (int p = 0; p < rail->world; p++) {
        en_conn_t *c = rail->peers[p];
        if (!c || c->state != EN_CONN_READY) continue;
        atomic_fetch_add(&rail->bye_pending, 1);
        if (en_exec_send_ctl(c, EN_FRAME_BYE, 0, 0, 0, NULL) != 0)
            atomic_fetch_sub(&rail->bye_pending, 1);
    }
    return 0;
}

int en_rail_stop(en_rail_t *rail)
{
    if (!rail->peers) return 0; /* never started */
    if (atomic_load(&rail->rx.state) == RX_RUNNING) {
        /* Say goodbye so peers log a finalize, not a failure; wait a little
         * for the frames to leave (a dead peer must not hold us). */
        rx_reactor_call(&rail->rx, bye_fn, NULL);
        uint64_t deadline = rx_now_ns() + 500000000ull;
        while (atomic_load(&rail->bye_pending) > 0 && rx_now_ns() < deadline) uv_sleep(1);
    }
    int st = rx_reactor_stop(&rail->rx);
    uv_cond_destroy(&rail->cv);
    uv_mutex_destroy(&rail->mu);
    coh_free(rail->peers);
    coh_free(rail->lost);
    rail->peers = NULL;
    rail->lost = NULL;
    return st;
}

/* ---- default members for transports that lack some ---- */

static int unsup_listen(en_rail_t *r, const struct sockaddr *a, struct sockaddr_storage *b)
{
    (void)a;
    (void)b;
    return rx_fail(COH_EUNSUPPORTED, "rail %d: transport cannot listen", r->index);
}
static int unsup_connect(en_rail_t *r, int peer, const struct sockaddr *a)
{
    (void)a;
    return rx_fail(COH_EUNSUPPORTED, "rail %d: transport cannot dial rank %d", r->index, peer);
}
static int unsup_send(en_conn_t *c, en_wreq_t *w)
{
    (void)c;
    (void)w;
    return COH_EUNSUPPORTED;
}
static void noop_conn(en_conn_t *c)
{
    (void)c;
}
static void noop_close(en_conn_t *c, int status, const char *why)
{
    (void)c;
    (void)status;
    (void)why;
}
static void noop_rail(en_rail_t *r)
{
    (void)r;
}

void en_ops_complete(en_transport_ops_t *ops)
{
    if (!ops->tr_listen) ops->tr_listen = unsup_listen;
    if (!ops->tr_connect) ops->tr_connect = unsup_connect;
    if (!ops->tr_send) ops->tr_send = unsup_send;
    if (!ops->tr_resume) ops->tr_resume = noop_conn;
    if (!ops->tr_close) ops->tr_close = noop_close;
    if (!ops->tr_shutdown) ops->tr_shutdown = noop_rail;
}
