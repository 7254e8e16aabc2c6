/*
 * The world communicator's rail balancer, live (see rx_lb.h).
 *
 * Locks: `mu` guards the history of tables and the queue of launches
 * waiting for theirs; `live_mu` guards the coordinator's own balancer (fed
 * from the rail threads). A thread may take live_mu while it holds mu (a
 * launch that runs a rail loop inline ends slices), never the other way.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "reactor/rx_ctx.h"
#include "reactor/rx_trace.h"
#include "sched/sc_lb.h"

/* A quiet balancer's table covers up to this many epochs per message. */
#define SPAN_MAX    16
#define LB_TEXT_MAX (1 << 16) /* a table as text (sc_lb_dump): 16 rails x 41 lines fit */

/* One table, shared by consecutive epochs that published the same bytes. */
typedef struct lb_tab {
    int refs;
    sc_lb_t *lb;
    size_t len;
    uint8_t bytes[];
} lb_tab_t;

typedef struct lb_ent {
    uint64_t epoch;
    lb_tab_t *t;
} lb_ent_t;

/* A launch waiting for its table. */
typedef struct lb_wait {
    struct lb_wait *next;
    coh_request_t *req;
    rx_launch_t L;
    uint64_t t_queued_ns;
    char desc[96];
} lb_wait_t;

struct rx_lb {
    struct coh_ctx *ctx;
    int nrails;
    uint64_t E;
    bool authority; /* this rank is the coordinator */
    uv_mutex_t mu;
    lb_ent_t *ent; /* by epoch, ascending */
    size_t nent, capent;
    lb_wait_t *qhead, *qtail;
    uint64_t launched; /* highest seq launched + 1 */
    bool closed;
    int close_status;
    char close_why[BS_ERR_LEN];
    /* the coordinator */
    uv_mutex_t live_mu;
    sc_lb_t *live;
    uint64_t published; /* tables published (epoch of the next + 1), under live_mu */
    /* Epochs the last publication covered, and whether an op larger than
     * COHORT_SMALL_BYTES or a rail event came since (live_mu). */
    uint64_t span;
    bool busy;
    /* Members: table messages installed (rx_lb_tables_in). */
    _Atomic uint64_t tables_in;
    /* Control loop (coordinator): links reported failed over, per rail. */
    uint64_t *down[RX_MAX_RAILS];
    int ndown[RX_MAX_RAILS], capdown[RX_MAX_RAILS];
    /* When each rail last came back into the table (live_mu): a slice that
     * began before says nothing of the rail's rate (below). */
    uint64_t t_back_ns[RX_MAX_RAILS];
};

/* ---- tables ---- */

static lb_tab_t *tab_new(int nrails, const uint8_t *bytes, size_t len)
{
    lb_tab_t *t = coh_zalloc(sizeof(*t) + len);
    if (!t) return NULL;
    if (sc_lb_create(nrails, NULL, &t->lb) < 0 || sc_lb_unpack(t->lb, bytes, len) < 0) {
        sc_lb_destroy(t->lb);
        coh_free(t);
        return NULL;
    }
    t->refs = 1;
    t->len = len;
    memcpy(t->bytes, bytes, len);
    return t;
}

static void tab_unref(lb_tab_t *t)
{
    if (t && --t->refs == 0) {
        sc_lb_destroy(t->lb);
        coh_free(t);
    }
}

/* Under mu: the entry of epoch e, or NULL. */
static lb_tab_t *find(rx_lb_t *lb, uint64_t e)
{
    size_t lo = 0, hi = lb->nent;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (lb->ent[mid].epoch < e)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < lb->nent && lb->ent[lo].epoch == e ? lb->ent[lo].t : NULL;
}

/* Under mu: drop the tables no launch can need any more (older than the
 * oldest op not launched, with an epoch's slack for threads between their
 * sequence number and this lock), but always keep the newest. */
static void evict(rx_lb_t *lb)
{
    uint64_t oldest = lb->qhead ? lb->qhead->L.seq : lb->launched;
    uint64_t keep = oldest / lb->E;
    keep = keep > 0 ? keep - 1 : 0;
    size_t k = 0;
    while (k + 1 < lb->nent && lb->ent[k].epoch < keep) tab_unref(lb->ent[k++].t);
    if (k) {
        memmove(lb->ent, lb->ent + k, sizeof(lb_ent_t) * (lb->nent - k));
        lb->nent -= k;
    }
}

static int launch_with(struct coh_ctx *ctx, coh_request_t *req, const rx_launch_t *L,
                       const sc_lb_t *t)
{
    rx_launch_t l = *L;
    sc_slice_t sl[SC_MAX_RAILS];
    if (L->bytes && L->coll.count) {
        uint64_t unit = L->bytes / L->coll.count;
        sc_lb_plan_t plan;
        int st = sc_lb_split(t, L->bytes, unit, L->seq, &plan);
        if (st == 0) st = sc_lb_slices(&plan, L->coll.count, unit, sl);
        if (st < 0)
            return bs_fail(st, "%s: the rail balancer cannot split it: %s", L->desc,
                           coh_strerror(st));
        l.nslices = st;
        l.slices = sl;
    }
    return rx_launch(ctx, req, &l);
}

/* Under mu: launch the queued ops whose table is here, in order. */
static void drain(rx_lb_t *lb)
{
    while (lb->qhead) {
        lb_wait_t *w = lb->qhead;
        lb_tab_t *t = find(lb, w->L.seq / lb->E);
        if (!t) break;
        lb->qhead = w->next;
        if (!lb->qhead) lb->qtail = NULL;
        int st = launch_with(lb->ctx, w->req, &w->L, t->lb);
        if (st < 0) {
            char why[BS_ERR_LEN];
            snprintf(why, sizeof(why), "%s", coh_last_error());
            rx_request_set_error(w->req, st, why);
            rx_request_complete(w->req);
        }
        if (w->L.seq + 1 > lb->launched) lb->launched = w->L.seq + 1;
        coh_free(w);
    }
}

/* Under mu: add epoch e's table (ignored when it is here already). */
static int install(rx_lb_t *lb, uint64_t e, const uint8_t *bytes, size_t len)
{
    size_t pos = lb->nent;
    while (pos > 0 && lb->ent[pos - 1].epoch >= e) pos--;
    if (pos < lb->nent && lb->ent[pos].epoch == e) return 0;
    lb_tab_t *t = NULL;
    /* Consecutive epochs often publish the same table: share it. */
    if (pos > 0 && lb->ent[pos - 1].t->len == len && !memcmp(lb->ent[pos - 1].t->bytes, bytes, len))
        t = lb->ent[pos - 1].t;
    else if (pos < lb->nent && lb->ent[pos].t->len == len &&
             !memcmp(lb->ent[pos].t->bytes, bytes, len))
        t = lb->ent[pos].t;
    if (t) {
        t->refs++;
    } else {
        t = tab_new(lb->nrails, bytes, len);
        if (!t) return COH_EPROTO;
    }
    if (lb->nent == lb->capent) {
        size_t cap = lb->capent ? 2 * lb->capent : 16;
        lb_ent_t *n = coh_realloc(lb->ent, cap * sizeof(*n));
        if (!n) {
            tab_unref(t);
            return COH_ENOMEM;
        }
        lb->ent = n;
        lb->capent = cap;
    }
    memmove(lb->ent + pos + 1, lb->ent + pos, sizeof(lb_ent_t) * (lb->nent - pos));
    lb->ent[pos] = (lb_ent_t){.epoch = e, .t = t};
    lb->nent++;
    drain(lb);
    evict(lb);
    return 0;
}

/* ---- the coordinator publishes ---- */

typedef struct pub_task {
    rx_task_t task;
    uint64_t epoch;
    uint32_t more;
    size_t len;
    uint8_t bytes[];
} pub_task_t;

static void pub_run(rx_task_t *task, rx_reactor_t *rx)
{
    pub_task_t *p = (pub_task_t *)task;
    struct coh_ctx *ctx = rx->owner;
    if (ctx->coord) {
        rx_ctl_msg_t m = {.type = RX_CTL_LBTAB};
        m.u.lbtab = (rx_ctl_lbtab_t){
            .epoch = p->epoch, .more = p->more, .len = (uint32_t)p->len, .table = p->bytes};
        rx_coord_send_all(ctx->coord, &m);
    }
    coh_free(p);
}

/* Under mu: install one table for epochs [from, to). */
static int install_range(rx_lb_t *lb, uint64_t from, uint64_t to, const uint8_t *bytes, size_t len)
{
    int st = 0;
    for (uint64_t k = from; k < to && st == 0; k++) st = install(lb, k, bytes, len);
    return st;
}

/* Tables [from, to): installed here, and one message to every rank. */
static void publish_range(rx_lb_t *lb, uint64_t from, uint64_t to, const uint8_t *bytes, size_t len)
{
    uv_mutex_lock(&lb->mu);
    int st = install_range(lb, from, to, bytes, len);
    uv_mutex_unlock(&lb->mu);
    if (st < 0) {
        bs_log(COH_LOG_ERROR, "rank %d: cannot install rail tables %llu..%llu: %s", lb->ctx->rank,
               (unsigned long long)from, (unsigned long long)to - 1, coh_strerror(st));
        return;
    }
    pub_task_t *p = coh_malloc(sizeof(*p) + len);
    if (!p) return;
    p->task.run = pub_run;
    p->epoch = from;
    p->more = (uint32_t)(to - from - 1);
    p->len = len;
    memcpy(p->bytes, bytes, len);
    if (!rx_reactor_post(&lb->ctx->ctrl, &p->task)) coh_free(p);
}

/* Application thread of the coordinator, at op s = e * E: when the tables
 * published so far end with epoch e, the next ones, from e + 1. While only
 * small ops ran (and no rail event came), each publication covers twice the
 * epochs of the last, up to SPAN_MAX, in one message: a table per 16 ops of
 * 4 KiB woke every rank's control thread that often, and 2 ranks on 2 cores
 * then lost whole time slices (p99 1.9-3.1 ms, mean 54-94 us against 24-37
 * with COHORT_LB_EPOCH 1024 or 0). The cost: small ops may use a table up to
 * SPAN_MAX epochs old; a larger op brings the span back to 1. */
static void publish(rx_lb_t *lb, uint64_t e)
{
    static _Thread_local uint8_t buf[SC_LB_PACK_MAX];
    uv_mutex_lock(&lb->live_mu);
    if (e + 2 <= lb->published) {
        uv_mutex_unlock(&lb->live_mu);
        return;
    }
    int len = sc_lb_pack(lb->live, buf, sizeof(buf));
    uint64_t from = lb->published, to = 0;
    if (len >= 0) {
        lb->span = lb->busy || !lb->span ? 1 : (2 * lb->span < SPAN_MAX ? 2 * lb->span : SPAN_MAX);
        lb->busy = false;
        /* Two threads may race here: the second finds these published. */
        to = lb->published = e + 1 + lb->span;
    }
    uv_mutex_unlock(&lb->live_mu);
    if (len >= 0 && to > from) publish_range(lb, from, to, buf, (size_t)len);
}

void rx_lb_reserve(struct coh_ctx *ctx, uint64_t seq, uint64_t n)
{
    rx_lb_t *lb = ctx->lb;
    if (!lb || !lb->authority) return;
    for (uint64_t s = seq; s < seq + n; s++)
        if (s % lb->E == 0) publish(lb, s / lb->E);
}

/* ---- the world's ops ---- */

int rx_lb_launch(struct coh_ctx *ctx, coh_request_t *req, const rx_launch_t *L)
{
    rx_lb_t *lb = ctx->lb;
    uint64_t e = L->seq / lb->E;
    if (lb->authority && L->seq % lb->E == 0) publish(lb, e);
    uv_mutex_lock(&lb->mu);
    lb_tab_t *t = find(lb, e);
    if (t && !lb->qhead) {
        int st = launch_with(ctx, req, L, t->lb);
        if (L->seq + 1 > lb->launched) lb->launched = L->seq + 1;
        uv_mutex_unlock(&lb->mu);
        return st;
    }
    if (lb->closed) {
        uv_mutex_unlock(&lb->mu);
        return bs_fail(lb->close_status, "%s: no rail table for epoch %llu: %s", L->desc,
                       (unsigned long long)e, lb->close_why);
    }
    /* A member known failed: the coordinator fails this op at submission
     * and publishes no table for it, so it would wait COHORT_TIMEOUT_MS.
     * It ends now. (Checked under mu: a failure reported after this finds
     * the op queued, rx_lb_revoke.) */
    bool stale;
    int gone = rx_comm_failed_member(ctx, &ctx->world_comm, &stale);
    if (gone >= 0) {
        if (L->seq + 1 > lb->launched) lb->launched = L->seq + 1;
        uv_mutex_unlock(&lb->mu);
        char why[BS_ERR_LEN];
        rx_excluded_why(ctx, gone, why, sizeof(why));
        rx_request_set_error(req, COH_EPEER, why);
        rx_request_complete(req);
        return 0;
    }
    lb_wait_t *w = coh_zalloc(sizeof(*w));
    if (!w) {
        uv_mutex_unlock(&lb->mu);
        return bs_fail(COH_ENOMEM, "%s: out of memory", L->desc);
    }
    w->req = req;
    w->L = *L;
    snprintf(w->desc, sizeof(w->desc), "%s", L->desc);
    w->L.desc = w->desc;
    w->t_queued_ns = bs_now_ns();
    req->deferred = true;
    if (lb->qtail)
        lb->qtail->next = w;
    else
        lb->qhead = w;
    lb->qtail = w;
    uv_mutex_unlock(&lb->mu);
    return 0;
}

void rx_lb_observe(struct coh_ctx *ctx, const coh_request_t *req, const en_result_t *r)
{
    rx_lb_t *lb = ctx->lb;
    if (!lb->authority || req->sync || req->comm != ctx->world_comm.id) return;
    const rx_slice_t *s = &req->slice[r->slice];
    if (!s->bytes || r->t_end_ns <= r->t_start_ns) return;
    double secs = (double)(r->t_end_ns - r->t_start_ns) / 1e9;
    uv_mutex_lock(&lb->live_mu);
    if (req->bytes > ctx->cfg.small_bytes) lb->busy = true;
    /* A slice that ran while a link of its rail was failed over measured the
     * failure, not the rail. Such samples (a verbs link's 2.5 s pause) left
     * the rail's rate so low that its share stayed small after it came back,
     * and a small share never measured the large size again
     * (cluster.rails.failover.verbs: ops at one rail's time for 50 s). */
    if (sc_lb_is_up(lb->live, s->rail) && r->t_start_ns >= lb->t_back_ns[s->rail])
        sc_lb_observe(lb->live, s->rail, s->bytes, secs);
    uv_mutex_unlock(&lb->live_mu);
}

int rx_lb_on_table(struct coh_ctx *ctx, const rx_ctl_lbtab_t *t)
{
    rx_lb_t *lb = ctx->lb;
    if (!lb) return COH_EPROTO;  /* ranks agree on the settings: nobody should send one */
    if (lb->authority) return 0; /* installed when published */
    uv_mutex_lock(&lb->mu);
    int st = install_range(lb, t->epoch, t->epoch + t->more + 1, t->table, t->len);
    uv_mutex_unlock(&lb->mu);
    atomic_fetch_add(&lb->tables_in, 1);
    if (st < 0)
        bs_log(COH_LOG_ERROR, "rank %d: rail table %llu from the coordinator: %s", ctx->rank,
               (unsigned long long)t->epoch, coh_strerror(st));
    return st;
}

void rx_lb_greet(struct coh_ctx *ctx, rx_conn_t *conn)
{
    rx_lb_t *lb = ctx->lb;
    if (!lb || conn->peer == ctx->rank) return;
    /* Every table the coordinator still holds: from the epoch before its
     * oldest op not launched to the newest published (several epochs
     * ahead when the balancer is quiet). */
    uv_mutex_lock(&lb->mu);
    for (size_t i = 0; i < lb->nent; i++) {
        size_t j = i;
        while (j + 1 < lb->nent && lb->ent[j + 1].t == lb->ent[i].t &&
               lb->ent[j + 1].epoch == lb->ent[j].epoch + 1 && j - i < RX_CTL_LB_MORE)
            j++;
        rx_ctl_msg_t m = {.type = RX_CTL_LBTAB};
        m.u.lbtab = (rx_ctl_lbtab_t){.epoch = lb->ent[i].epoch,
                                     .more = (uint32_t)(j - i),
                                     .len = (uint32_t)lb->ent[i].t->len,
                                     .table = lb->ent[i].t->bytes};
        rx_ctl_send(conn, &m);
        i = j;
    }
    uv_mutex_unlock(&lb->mu);
}

/* ---- rail events ---- */

static const char *kind_name(int kind)
{
    return kind == EN_RAIL_FAILOVER ? "failover" : kind == EN_RAIL_RETURN ? "return" : "gone";
}

static void on_rail_event(en_rail_observer_t *o, const en_rail_event_t *ev)
{
    struct coh_ctx *ctx = (struct coh_ctx *)((char *)o - offsetof(struct coh_ctx, rail_obs));
    if (ev->kind < EN_RAIL_FAILOVER || ev->kind > EN_RAIL_GONE || ev->rail < 0 ||
        ev->rail >= ctx->nrails)
        return;
    atomic_fetch_add(&ctx->rail_events[ev->rail][ev->kind - 1], 1);
    if (ctx->trace) {
        char args[200], why[120];
        rx_trace_escape(ev->why ? ev->why : "", why, sizeof(why));
        snprintf(args, sizeof(args), "\"peer\":%d,\"via\":%d,\"pause_ms\":%.1f,\"why\":\"%s\"",
                 ev->peer, ev->via, ev->pause_s * 1e3, why);
        rx_trace_add(ctx->trace, 'i', "rail", kind_name(ev->kind), RX_TR_RAIL0 + ev->rail,
                     bs_now_ns(), 0, 0, args);
    }
    bs_log(ev->kind == EN_RAIL_RETURN ? COH_LOG_INFO : COH_LOG_WARN,
           "rank %d rail %d: link to rank %d: %s (now via rail %d, pause %.1f ms)%s%s", ctx->rank,
           ev->rail, ev->peer, kind_name(ev->kind), ev->via, ev->pause_s * 1e3,
           ev->why && *ev->why ? ": " : "", ev->why ? ev->why : "");
    if (!ctx->lb) return;
    rx_ctl_msg_t m = {.type = RX_CTL_RAIL};
    m.u.rail = (rx_ctl_rail_t){.rank = (uint32_t)ctx->rank,
                               .rail = (uint32_t)ev->rail,
                               .peer = (uint32_t)ev->peer,
                               .kind = (uint32_t)ev->kind};
    rx_member_post(ctx, &m);
}

en_rail_observer_t *rx_lb_observer(struct coh_ctx *ctx)
{
    ctx->rail_obs.fn = on_rail_event;
    return &ctx->rail_obs;
}

void rx_lb_on_rail(struct coh_ctx *ctx, int rank, const rx_ctl_rail_t *ev)
{
    rx_lb_t *lb = ctx->lb;
    if (!lb || !lb->authority || (int)ev->rail >= lb->nrails || ev->peer >= (uint32_t)ctx->world)
        return;
    int r = (int)ev->rail;
    uint64_t key = (uint64_t)(uint32_t)rank << 32 | ev->peer;
    int i = 0;
    while (i < lb->ndown[r] && lb->down[r][i] != key) i++;
    if (ev->kind == EN_RAIL_FAILOVER && i == lb->ndown[r]) {
        if (lb->ndown[r] == lb->capdown[r]) {
            int cap = lb->capdown[r] ? 2 * lb->capdown[r] : 8;
            uint64_t *n = coh_realloc(lb->down[r], sizeof(uint64_t) * (size_t)cap);
            if (!n) return;
            lb->down[r] = n;
            lb->capdown[r] = cap;
        }
        lb->down[r][lb->ndown[r]++] = key;
    } else if (ev->kind != EN_RAIL_FAILOVER && i < lb->ndown[r]) {
        /* Back, or gone for good (the peer, not the rail: it does not
         * keep the rail out). */
        lb->down[r][i] = lb->down[r][--lb->ndown[r]];
    }
    uv_mutex_lock(&lb->live_mu);
    bool any = false;
    for (int k = 0; k < lb->nrails; k++) any |= lb->ndown[k] == 0;
    for (int k = 0; k < lb->nrails; k++) {
        bool up = !any || lb->ndown[k] == 0; /* every rail down: use them all */
        if (up != sc_lb_is_up(lb->live, k)) {
            bs_log(COH_LOG_INFO, "coordinator: rail %d %s the balancer's table", k,
                   up ? "is back in" : "is out of");
            if (up) lb->t_back_ns[k] = bs_now_ns();
        }
        sc_lb_set_up(lb->live, k, up);
    }
    lb->busy = true; /* the next tables cover one epoch each again */
    uv_mutex_unlock(&lb->live_mu);
}

/* ---- life ---- */

int rx_lb_start(struct coh_ctx *ctx)
{
    rx_lb_observer(ctx);
    const char *path = ctx->cfg.lb_table ? ctx->cfg.lb_table : "";
    ctx->lb_table_s = coh_malloc(strlen(path) + 1);
    if (!ctx->lb_table_s) return bs_fail(COH_ENOMEM, "coh_init: out of memory");
    memcpy(ctx->lb_table_s, path, strlen(path) + 1);
    ctx->cfg.lb_table = ctx->lb_table_s;
    if (ctx->nrails < 2 || ctx->world < 2 || ctx->cfg.lb_epoch <= 0) return 0;
    rx_lb_t *lb = coh_zalloc(sizeof(*lb));
    if (!lb) return bs_fail(COH_ENOMEM, "coh_init: out of memory");
    lb->ctx = ctx;
    lb->nrails = ctx->nrails;
    lb->E = (uint64_t)ctx->cfg.lb_epoch;
    lb->authority = ctx->rank == ctx->cfg.coordinator;
    uv_mutex_init(&lb->mu);
    uv_mutex_init(&lb->live_mu);
    ctx->lb = lb;
    if (!lb->authority) return 0;
    int st = sc_lb_create(ctx->nrails, NULL, &lb->live);
    if (st < 0) return bs_fail(st, "coh_init: cannot create the rail balancer");
    if (*path) {
        FILE *f = fopen(path, "r");
        char *text = f ? coh_malloc(LB_TEXT_MAX) : NULL;
        if (f && !text) fclose(f);
        if (f && text) {
            size_t n = fread(text, 1, LB_TEXT_MAX - 1, f);
            fclose(f);
            text[n] = 0;
            if (sc_lb_load(lb->live, text) == 0)
                bs_log(COH_LOG_INFO, "rank %d: rail table loaded from %s", ctx->rank, path);
            else
                bs_log(COH_LOG_WARN,
                       "rank %d: COHORT_LB_TABLE=%s is not a table of %d rails: starting cold",
                       ctx->rank, path, ctx->nrails);
            coh_free(text);
        }
    }
    return 0;
}

void rx_lb_close(struct coh_ctx *ctx, int status, const char *why)
{
    rx_lb_t *lb = ctx->lb;
    if (!lb) return;
    uv_mutex_lock(&lb->mu);
    if (!lb->closed) {
        lb->closed = true;
        lb->close_status = status;
        snprintf(lb->close_why, sizeof(lb->close_why), "%s", why);
    }
    lb_wait_t *w = lb->qhead;
    lb->qhead = lb->qtail = NULL;
    while (w) {
        lb_wait_t *next = w->next;
        char msg[BS_ERR_LEN];
        snprintf(msg, sizeof(msg), "%s #%llu: no rail table for its epoch: %s", w->desc,
                 (unsigned long long)w->L.seq, lb->close_why);
        rx_request_set_error(w->req, lb->close_status, msg);
        rx_request_complete(w->req);
        coh_free(w);
        w = next;
    }
    uv_mutex_unlock(&lb->mu);
}

void rx_lb_revoke(struct coh_ctx *ctx, uint32_t comm, int status, const char *why)
{
    rx_lb_t *lb = ctx->lb;
    if (!lb) return;
    uv_mutex_lock(&lb->mu);
    lb_wait_t **pw = &lb->qhead, *last = NULL;
    while (*pw) {
        lb_wait_t *w = *pw;
        if (w->req->comm != comm) {
            last = w;
            pw = &w->next;
            continue;
        }
        *pw = w->next;
        if (w->L.seq + 1 > lb->launched) lb->launched = w->L.seq + 1;
        rx_request_set_error(w->req, status, why);
        rx_request_complete(w->req);
        coh_free(w);
    }
    lb->qtail = last;
    drain(lb);
    uv_mutex_unlock(&lb->mu);
}

void rx_lb_check_timeouts(struct coh_ctx *ctx)
{
    rx_lb_t *lb = ctx->lb;
    if (!lb) return;
    uint64_t limit = (uint64_t)ctx->cfg.timeout_ms * 1000000ull;
    uv_mutex_lock(&lb->mu);
    /* The clock under the lock: read before it, a launch queued meanwhile
     * by the application thread was "queued in the future", its age
     * wrapped, and it failed at once with "no rail table after 300000 ms"
     * (CI, TSan stage, mp.udp.spray.lossy.d5.n4 2.2 s into its run). */
    uint64_t now = bs_now_ns();
    while (lb->qhead && now > lb->qhead->t_queued_ns && now - lb->qhead->t_queued_ns > limit) {
        lb_wait_t *w = lb->qhead;
        lb->qhead = w->next;
        if (!lb->qhead) lb->qtail = NULL;
        char msg[BS_ERR_LEN];
        snprintf(msg, sizeof(msg),
                 "%s #%llu: no rail table for epoch %llu after %d ms (the coordinator, rank %d, "
                 "has not submitted op %llu)",
                 w->desc, (unsigned long long)w->L.seq, (unsigned long long)(w->L.seq / lb->E),
                 ctx->cfg.timeout_ms, ctx->cfg.coordinator,
                 (unsigned long long)(w->L.seq / lb->E * lb->E));
        rx_request_set_error(w->req, COH_ETIMEDOUT, msg);
        rx_request_complete(w->req);
        if (w->L.seq + 1 > lb->launched) lb->launched = w->L.seq + 1;
        coh_free(w);
        drain(lb); /* the ones behind it may have their table */
    }
    uv_mutex_unlock(&lb->mu);
}

void rx_lb_finalize(struct coh_ctx *ctx)
{
    rx_lb_t *lb = ctx->lb;
    if (!lb) return;
    rx_lb_close(ctx, COH_ECANCELED, "the context was finalized");
    const char *path = ctx->cfg.lb_table;
    if (!lb->authority || !path || !*path) return;
    char *text = coh_malloc(LB_TEXT_MAX);
    if (!text) return;
    uv_mutex_lock(&lb->live_mu);
    int n = sc_lb_dump(lb->live, text, LB_TEXT_MAX);
    uv_mutex_unlock(&lb->live_mu);
    char tmp[RX_STR_MAX + 16];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = n > 0 ? fopen(tmp, "w") : NULL;
    bool ok = f && fwrite(text, 1, (size_t)n, f) == (size_t)n;
    if (f) ok = fclose(f) == 0 && ok;
    if (ok) ok = rename(tmp, path) == 0;
    if (!ok) {
        bs_log(COH_LOG_WARN, "rank %d: cannot save the rail table to %s: %s", ctx->rank, path,
               strerror(errno));
        if (f) remove(tmp);
    }
    coh_free(text);
}

uint64_t rx_lb_tables_in(struct coh_ctx *ctx)
{
    return ctx->lb ? atomic_load(&ctx->lb->tables_in) : 0;
}

void rx_lb_fini(struct coh_ctx *ctx)
{
    coh_free(ctx->lb_table_s);
    ctx->lb_table_s = NULL;
    rx_lb_t *lb = ctx->lb;
    if (!lb) return;
    rx_lb_close(ctx, COH_ECANCELED, "the context was finalized");
    for (size_t i = 0; i < lb->nent; i++) tab_unref(lb->ent[i].t);
    for (int r = 0; r < RX_MAX_RAILS; r++) coh_free(lb->down[r]);
    coh_free(lb->ent);
    sc_lb_destroy(lb->live);
    uv_mutex_destroy(&lb->live_mu);
    uv_mutex_destroy(&lb->mu);
    coh_free(lb);
    ctx->lb = NULL;
}

/* ---- API ---- */

COH_API int coh_lb_table(coh_ctx_t *ctx, char *buf, size_t cap)
{
    if (!ctx || !buf || !cap) return bs_fail(COH_EINVAL, "coh_lb_table: NULL argument");
    if (!rx_ctx_alive(ctx) || atomic_load(&ctx->state) != RX_CTX_RUNNING)
        return bs_fail(COH_ESTATE, "coh_lb_table: the context is not running");
    rx_lb_t *lb = ctx->lb;
    if (!lb)
        return bs_fail(COH_EUNSUPPORTED,
                       "coh_lb_table: no rail balancer (one rail, one rank or COHORT_LB_EPOCH=0)");
    uv_mutex_lock(&lb->mu);
    int n = lb->nent ? sc_lb_dump(lb->ent[lb->nent - 1].t->lb, buf, cap) : COH_EAGAIN;
    uv_mutex_unlock(&lb->mu);
    if (n == COH_EAGAIN) return bs_fail(n, "coh_lb_table: no table yet (no world op submitted)");
    if (n < 0) return bs_fail(n, "coh_lb_table: %zu bytes are too few", cap);
    return n;
}

void rx_lb_probe(struct coh_ctx *ctx, int rail, double alpha_s, double gbps, int world)
{
    rx_lb_t *lb = ctx->lb;
    if (!lb || !lb->authority || rail < 0 || rail >= lb->nrails || !(gbps > 0) || world < 2) return;
    static const uint64_t sizes[] = {64u << 10, 1u << 20, 16u << 20};
    uv_mutex_lock(&lb->live_mu);
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        double t = 2.0 * (world - 1) * alpha_s +
                   2.0 * (world - 1) / world * (double)sizes[i] * 8 / (gbps * 1e9);
        sc_lb_observe(lb->live, rail, sizes[i], t);
    }
    uv_mutex_unlock(&lb->live_mu);
}
