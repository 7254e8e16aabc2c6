/*
 * A rail: one NIC's connections to every peer and the ops in flight on it,
 * on the loop it was given. The higher rank dials the lower one; both sides
 * check the other's HELLO (job token first) before anything else is read.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "engines/engine.h"

static size_t sa_len(const struct sockaddr *a)
{
    return a->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
}

static void timer_cb(uv_timer_t *h)
{
    en_rail_t *rail = h->data;
    en_exec_check_timeouts(rail);
}

void en_rail_arm_timer(en_rail_t *rail)
{
    if (rail->timer_on || !rail->timer_open) return;
    uint64_t period = (uint64_t)rail->timeout_ms / 4;
    if (period > 250) period = 250;
    if (period < 10) period = 10;
    uv_timer_start(&rail->timer, timer_cb, period, period);
    rail->timer_on = true;
}

int en_rail_init(en_rail_t *rail, const en_rail_cfg_t *cfg)
{
    memset(rail, 0, sizeof(*rail));
    rail->index = cfg->index;
    rail->rank = cfg->rank;
    rail->world = cfg->world;
    rail->nrails = cfg->nrails;
    rail->token = cfg->token ? cfg->token : "";
    rail->timeout_ms = cfg->timeout_ms;
    rail->max_running = cfg->max_inflight > 0 ? (uint32_t)cfg->max_inflight : 1024;
    rail->sockbuf_bytes = cfg->sockbuf_bytes;
    rail->stash_limit = cfg->stash_bytes;
    rail->spare_idle_ns = cfg->spare_idle_ms > 0 ? (uint64_t)cfg->spare_idle_ms * 1000000ull : 0;
    rail->ops_full = cfg->ops ? *cfg->ops : en_tcp_ops;
    en_ops_complete(&rail->ops_full);
    rail->ops = &rail->ops_full;
    memcpy(&rail->local, cfg->local, sa_len(cfg->local));
    rail->failover = cfg->failover && cfg->nrails > 1 && cfg->locals;
    rail->stall_ms = cfg->stall_ms > 0 ? cfg->stall_ms : 100;
    rail->rejoin = cfg->rejoin;
    rail->probe_ms = cfg->probe_ms > 0 ? cfg->probe_ms : 500;
    rail->test_resume_delay_ms = cfg->test_resume_delay_ms;
    rail->test_drop_probe = cfg->test_drop_probe;
    rail->progress_ns = cfg->progress_ns;
    rail->observer = cfg->observer;
    rail->want_udp = cfg->udp;
    rail->udpcfg = cfg->udpcfg;
    for (int j = 0; rail->failover && j < cfg->nrails && j < EN_MAX_RAILS; j++)
        memcpy(&rail->locals[j], cfg->locals[j], sa_len(cfg->locals[j]));
    rail->peers = coh_zalloc(sizeof(en_conn_t *) * (size_t)cfg->world);
    rail->lost = coh_zalloc((size_t)cfg->world);
    rail->routes = coh_zalloc(sizeof(struct sockaddr_storage) * (size_t)cfg->world *
                              (size_t)(cfg->nrails > 0 ? cfg->nrails : 1));
    if (!rail->peers || !rail->lost || !rail->routes || uv_mutex_init(&rail->mu) != 0) goto nomem;
    if (uv_cond_init(&rail->cv) != 0) {
        uv_mutex_destroy(&rail->mu);
        goto nomem;
    }
    rail->sync_init = true;
    if (cfg->shm_dir && cfg->shm_dir[0]) {
        rail->shm_peer = coh_zalloc((size_t)cfg->world);
        rail->shm_names = coh_zalloc((size_t)cfg->world * EN_SHM_NAME);
        if (!rail->shm_peer || !rail->shm_names) goto nomem;
        int e = en_shm_init(rail, cfg->shm_dir, cfg->shm_name ? cfg->shm_name : "0",
                            cfg->shm_ring_bytes, cfg->shm_cma_bytes);
        if (e) {
            char why[BS_ERR_LEN];
            snprintf(why, sizeof(why), "%s", coh_last_error());
            en_rail_fini(rail);
            return bs_fail(e, "%s", why);
        }
    }
#ifdef COHORT_HAVE_VERBS
    if (cfg->verbs) {
        int e = en_verbs_init(rail, cfg);
        if (e) {
            char why[BS_ERR_LEN];
            snprintf(why, sizeof(why), "%s", coh_last_error());
            en_rail_fini(rail);
            return bs_fail(e, "%s", why);
        }
    }
#else
    if (cfg->verbs) {
        en_rail_fini(rail);
        return bs_fail(COH_EUNSUPPORTED, "rail %d: this build has no verbs engine", cfg->index);
    }
#endif
    return 0;
nomem:
    en_rail_fini(rail);
    return bs_fail(COH_ENOMEM, "rail %d: out of memory", cfg->index);
}

void en_rail_fini(en_rail_t *rail)
{
#ifdef COHORT_HAVE_VERBS
    en_verbs_fini(rail);
#endif
    en_udp_fini(rail);
    en_shm_fini(rail);
    coh_free(rail->shm_peer);
    coh_free(rail->shm_names);
    rail->shm_peer = NULL;
    rail->shm_names = NULL;
    if (rail->sync_init) {
        uv_cond_destroy(&rail->cv);
        uv_mutex_destroy(&rail->mu);
        rail->sync_init = false;
    }
    coh_free(rail->peers);
    coh_free(rail->lost);
    coh_free(rail->routes);
    coh_free(rail->revoked);
    rail->revoked = NULL;
    rail->nrevoked = 0;
    rail->peers = NULL;
    rail->lost = NULL;
    rail->routes = NULL;
}

int en_rail_open(en_rail_t *rail, uv_loop_t *loop)
{
    rail->loop = loop;
    uv_timer_init(loop, &rail->timer);
    rail->timer.data = rail;
    rail->timer_open = true;
    uv_idle_init(loop, &rail->starter);
    rail->starter.data = rail;
    rail->starter_open = true;
    en_rail_arm_timer(rail);
    int e = rail->ops->tr_listen(rail, (struct sockaddr *)&rail->local, &rail->bound);
    if (e == 0 && rail->want_udp) e = en_udp_open(rail, &rail->udpcfg);
    if (e == 0 && rail->shm) e = en_shm_ops.tr_listen(rail, NULL, NULL);
    return e;
}

bool en_rail_busy(en_rail_t *rail)
{
    return rail->ops_head != NULL || rail->wait_head != NULL;
}

bool en_rail_poll(en_rail_t *rail)
{
    bool did = rail->shm && en_shm_poll(rail);
#ifdef COHORT_HAVE_VERBS
    did = en_verbs_poll(rail) || did;
#endif
    return did;
}

bool en_rail_arm(en_rail_t *rail)
{
    return !rail->shm || en_shm_arm(rail);
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

bool en_rail_set_shm_peer(en_rail_t *rail, int peer, const char *name)
{
    if (!rail->shm || peer < 0 || peer >= rail->world || !name || strlen(name) >= EN_SHM_NAME)
        return false;
    snprintf(rail->shm_names + (size_t)peer * EN_SHM_NAME, EN_SHM_NAME, "%s", name);
    rail->shm_peer[peer] = 1;
    return true;
}

void en_rail_dial(en_rail_t *rail, int peer, const struct sockaddr *addr)
{
    int e = rail->shm && rail->shm_peer[peer] ? en_shm_ops.tr_connect(rail, peer, addr)
                                              : rail->ops->tr_connect(rail, peer, addr);
    if (e < 0) set_conn_status(rail, e, "%s", coh_last_error());
}

int en_rail_wait_peer(en_rail_t *rail, int peer, uint64_t deadline_ns)
{
    uv_mutex_lock(&rail->mu);
    while (!rail->peers[peer] && en_cond_wait_until(&rail->cv, &rail->mu, deadline_ns)) {
    }
    bool up = rail->peers[peer] != NULL;
    uv_mutex_unlock(&rail->mu);
    return up ? 0 : COH_ETIMEDOUT;
}

int en_rail_wait_connected(en_rail_t *rail, uint64_t deadline_ns)
{
    int st = 0;
    uv_mutex_lock(&rail->mu);
    while (rail->nready < rail->world - 1 && rail->conn_status == 0 &&
           en_cond_wait_until(&rail->cv, &rail->mu, deadline_ns)) {
    }
    if (rail->conn_status < 0) {
        st = bs_fail(rail->conn_status, "rail %d: %s", rail->index, rail->conn_why);
    } else if (rail->nready < rail->world - 1) {
        char missing[256] = "";
        size_t ml = 0;
        for (int p = 0; p < rail->world && ml < sizeof(missing) - 16; p++)
            if (p != rail->rank && !rail->peers[p])
                ml += (size_t)snprintf(missing + ml, sizeof(missing) - ml, " %d", p);
        st = bs_fail(COH_ETIMEDOUT, "rail %d: timed out waiting for rank(s)%s to connect",
                     rail->index, missing);
    }
    uv_mutex_unlock(&rail->mu);
    return st;
}

int en_rail_set_routes(en_rail_t *rail, int peer, const struct sockaddr_storage *addrs, int n)
{
    if (peer < 0 || peer >= rail->world || n != rail->nrails) return COH_EINVAL;
    uv_mutex_lock(&rail->mu);
    memcpy(&rail->routes[(size_t)peer * (size_t)n], addrs, sizeof(*addrs) * (size_t)n);
    uv_mutex_unlock(&rail->mu);
    return 0;
}

void en_rail_listen_at(const en_rail_t *rail, const struct sockaddr *addr,
                       struct sockaddr_storage *at)
{
    memset(at, 0, sizeof(*at));
    memcpy(at, addr, sa_len(addr));
    if (!rail->failover) return;
    if (at->ss_family == AF_INET) {
        ((struct sockaddr_in *)at)->sin_addr.s_addr = htonl(INADDR_ANY);
    } else if (at->ss_family == AF_INET6) {
        /* It was bound to the rail's address only: a resume through
         * another interface found nothing listening there (refused), and
         * on IPv6 no link could move. */
        ((struct sockaddr_in6 *)at)->sin6_addr = in6addr_any;
        ((struct sockaddr_in6 *)at)->sin6_scope_id = 0;
    }
}

void en_rail_listen_named(const struct sockaddr *addr, struct sockaddr_storage *bound)
{
    uint16_t port = en_sa_port(bound);
    memset(bound, 0, sizeof(*bound));
    memcpy(bound, addr, sa_len(addr));
    en_sa_set_port(bound, port);
}

void en_rail_progress(en_rail_t *rail, uint64_t now)
{
    if (rail->progress_ns)
        atomic_store_explicit(&rail->progress_ns[rail->index], now, memory_order_relaxed);
}

bool en_rail_others_progress(const en_rail_t *rail, uint64_t now)
{
    uint64_t stall = (uint64_t)rail->stall_ms * 1000000ull;
    for (int j = 0; rail->progress_ns && j < rail->nrails; j++)
        if (j != rail->index &&
            now - atomic_load_explicit(&rail->progress_ns[j], memory_order_relaxed) < stall)
            return true;
    return false;
}

bool en_rail_route(en_rail_t *rail, int peer, int via, struct sockaddr_storage *out)
{
    if (peer < 0 || peer >= rail->world || via < 0 || via >= rail->nrails) return false;
    uv_mutex_lock(&rail->mu);
    *out = rail->routes[(size_t)peer * (size_t)rail->nrails + (size_t)via];
    uv_mutex_unlock(&rail->mu);
    return out->ss_family == AF_INET || out->ss_family == AF_INET6;
}

void en_rail_event(en_rail_t *rail, int kind, int peer, int via, double pause_s, const char *why)
{
    if (kind == EN_RAIL_FAILOVER) atomic_fetch_add(&rail->stat_failovers, 1);
    if (kind == EN_RAIL_RETURN) atomic_fetch_add(&rail->stat_returns, 1);
    if (rail->observer) {
        en_rail_event_t ev = {.kind = kind,
                              .rail = rail->index,
                              .peer = peer,
                              .via = via,
                              .pause_s = pause_s,
                              .why = why ? why : ""};
        rail->observer->fn(rail->observer, &ev);
        return;
    }
    bs_log(kind == EN_RAIL_RETURN ? COH_LOG_INFO : COH_LOG_WARN,
           "rank %d rail %d: link to rank %d %s (interface of rail %d, %.1f ms pause): %s",
           rail->rank, rail->index, peer,
           kind == EN_RAIL_FAILOVER ? "failed over"
           : kind == EN_RAIL_RETURN ? "is back"
                                    : "is gone",
           via, pause_s * 1e3, why ? why : "");
}

bool en_rail_peer_lost(en_rail_t *rail, int peer)
{
    uv_mutex_lock(&rail->mu);
    bool lost = peer >= 0 && peer < rail->world && rail->lost[peer];
    uv_mutex_unlock(&rail->mu);
    return lost;
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
    h->flags = rail->rejoin ? EN_HELLO_REJOIN : 0;
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
    if (h->flags & EN_HELLO_RESUME) {
        /* A link that exists moves to a new socket: either side may dial. */
        if (!rail->failover || r == rail->rank || !rail->peers[r] || rail->lost[r] ||
            (int)h->via >= rail->nrails) {
            snprintf(why, whylen, "rank %d cannot resume a link here", r);
            return COH_EPROTO;
        }
        return 0;
    }
    if ((h->flags & EN_HELLO_REJOIN) && incoming && r != rail->rank) {
        /* A restarted rank dials every member of the communicator it was
         * grown into: it takes its failed incarnation's place. */
        if (rail->peers[r]) {
            snprintf(why, whylen, "rank %d rejoins, but its old connection is still up", r);
            return COH_EPROTO;
        }
        return 0;
    }
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

void en_rail_conn_link(en_rail_t *rail, en_conn_t *c)
{
    c->all_prev = NULL;
    c->all_next = rail->all;
    if (rail->all) rail->all->all_prev = c;
    rail->all = c;
}

void en_rail_conn_unlink(en_conn_t *c)
{
    en_rail_t *rail = c->rail;
    if (c->all_prev)
        c->all_prev->all_next = c->all_next;
    else if (rail->all == c)
        rail->all = c->all_next;
    if (c->all_next) c->all_next->all_prev = c->all_prev;
    c->all_prev = c->all_next = NULL;
}

void en_rail_conn_ready(en_rail_t *rail, en_conn_t *c)
{
    uv_mutex_lock(&rail->mu);
    rail->peers[c->peer] = c;
    rail->lost[c->peer] = 0; /* a rank that rejoined */
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
            bs_log(COH_LOG_WARN, "rank %d rail %d: dropped an incoming connection: %s", rail->rank,
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
        bs_log(c->peer_bye ? COH_LOG_INFO : COH_LOG_WARN, "rank %d rail %d: lost rank %d: %s",
               rail->rank, rail->index, p, why);
    char msg[BS_ERR_LEN];
    snprintf(msg, sizeof(msg), "%s rank %d on rail %d (%s)",
             c->peer_bye ? "finalized:" : "lost the connection to", p, rail->index, why);
    en_exec_fail_peer(rail, p, COH_EPEER, msg);
}

void en_rail_drop_peer(en_rail_t *rail, int peer, int status, const char *why)
{
    if (peer < 0 || peer >= rail->world || !rail->peers[peer]) return;
    en_conn_t *c = rail->peers[peer];
    /* The ops fail with why itself, not "lost the connection": say it first. */
    en_exec_fail_peer(rail, peer, status, why);
    c->ops->tr_close(c, status, why);
}

void en_rail_debug_cut(en_rail_t *rail, int peer)
{
    if (peer >= 0 && peer < rail->world && rail->peers[peer])
        rail->peers[peer]->ops->tr_cut(rail->peers[peer]);
}

void en_rail_cancel_op(en_rail_t *rail, uint32_t comm, uint64_t seq, int status, const char *why)
{
    en_exec_cancel(rail, comm, seq, status, why);
}

void en_rail_abort_op(en_rail_t *rail, uint32_t comm, uint64_t seq, int status, const char *why,
                      const int *peers, int npeers)
{
    en_exec_cancel(rail, comm, seq, status, why);
    for (int i = 0; i < npeers; i++) {
        int p = peers[i];
        if (p >= 0 && p < rail->world && rail->peers[p])
            en_exec_send_ctl(rail->peers[p], EN_FRAME_ABORT, comm, seq, status, why);
    }
}

void en_rail_revoke_comm(en_rail_t *rail, uint32_t comm, int status, const char *why)
{
    en_exec_revoke(rail, comm, status, why);
}

void en_rail_cancel_all(en_rail_t *rail, const char *why)
{
    en_exec_fail_all(rail, COH_ECANCELED, true, why);
}

void en_rail_bye_sent(en_rail_t *rail)
{
    uv_mutex_lock(&rail->mu);
    if (--rail->bye_pending == 0) uv_cond_broadcast(&rail->cv);
    uv_mutex_unlock(&rail->mu);
}

void en_rail_close(en_rail_t *rail)
{
    if (rail->closing) return;
    rail->closing = true;
    en_exec_fail_all(rail, COH_ECANCELED, true, "the context was finalized");
    en_exec_start_waiting(rail); /* closing: each fails as it starts */
    /* Say goodbye so peers log a finalize, not a failure. */
    for (int p = 0; p < rail->world; p++) {
        en_conn_t *c = rail->peers[p];
        if (!c || c->state != EN_CONN_READY) continue;
        uv_mutex_lock(&rail->mu);
        rail->bye_pending++;
        uv_mutex_unlock(&rail->mu);
        if (en_exec_send_ctl(c, EN_FRAME_BYE, 0, 0, 0, NULL) != 0) en_rail_bye_sent(rail);
    }
}

void en_rail_wait_quiet(en_rail_t *rail, uint64_t deadline_ns)
{
    /* A dead or stopped peer must not hold the finalize: at most until the
     * deadline. */
    uv_mutex_lock(&rail->mu);
    while (rail->bye_pending > 0 && en_cond_wait_until(&rail->cv, &rail->mu, deadline_ns)) {
    }
    uv_mutex_unlock(&rail->mu);
}

void en_rail_shutdown(en_rail_t *rail)
{
    rail->closing = true;
    en_exec_fail_all(rail, COH_ECANCELED, false, "the context was finalized");
    en_exec_start_waiting(rail);
    en_exec_drop_stash(rail);
    if (rail->starter_open) uv_close((uv_handle_t *)&rail->starter, NULL);
    rail->starter_open = false;
    if (rail->timer_open) uv_close((uv_handle_t *)&rail->timer, NULL);
    rail->timer_open = rail->timer_on = false;
    en_udp_shutdown(rail);
    en_shm_ops.tr_shutdown(rail);
    rail->ops->tr_shutdown(rail);
}

/* ---- default members for transports that lack some ---- */

static int unsup_listen(en_rail_t *r, const struct sockaddr *a, struct sockaddr_storage *b)
{
    (void)a;
    (void)b;
    return bs_fail(COH_EUNSUPPORTED, "rail %d: transport cannot listen", r->index);
}
static int unsup_connect(en_rail_t *r, int peer, const struct sockaddr *a)
{
    (void)a;
    return bs_fail(COH_EUNSUPPORTED, "rail %d: transport cannot dial rank %d", r->index, peer);
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
    if (!ops->name) ops->name = "?";
    if (!ops->tr_listen) ops->tr_listen = unsup_listen;
    if (!ops->tr_connect) ops->tr_connect = unsup_connect;
    if (!ops->tr_send) ops->tr_send = unsup_send;
    if (!ops->tr_resume) ops->tr_resume = noop_conn;
    if (!ops->tr_close) ops->tr_close = noop_close;
    if (!ops->tr_shutdown) ops->tr_shutdown = noop_rail;
    if (!ops->tr_cut) ops->tr_cut = noop_conn;
}
