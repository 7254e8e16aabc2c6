/*
 * Failed ranks: which world ranks the coordinator excluded for good (died,
 * hung, missed T_fault), as this rank heard it, and the applications'
 * failure handlers. Written from the control reactor, read by any thread.
 * And the communicators made of the survivors (coh_comm_shrink) and of
 * them and the ranks that rejoined (coh_comm_grow).
 */
#include <stdio.h>
#include <string.h>

#include "reactor/rx_ctx.h"
#include "reactor/rx_lb.h"

/* comm's rank of world rank r, or -1. */
static int comm_rank_of(const coh_comm_t *c, int r)
{
    if (!c->ranks) return r < c->size ? r : -1;
    for (int i = 0; i < c->size; i++)
        if (c->ranks[i] == r) return i;
    return -1;
}

bool rx_ctx_is_failed(struct coh_ctx *ctx, int r)
{
    if (!ctx->failed || r < 0 || r >= ctx->world) return false;
    uv_mutex_lock(&ctx->fail_mu);
    bool f = ctx->failed[r] != 0;
    uv_mutex_unlock(&ctx->fail_mu);
    return f;
}

bool rx_ctx_electable(struct coh_ctx *ctx, int r)
{
    if (!ctx->failed || r < 0 || r >= ctx->world) return false;
    uv_mutex_lock(&ctx->fail_mu);
    bool ok = !ctx->failed[r] && (r == ctx->rank || !ctx->back[r] || ctx->cfg.rejoin);
    uv_mutex_unlock(&ctx->fail_mu);
    return ok;
}

void rx_excluded_why(const struct coh_ctx *ctx, int gone, char *out, size_t cap)
{
    snprintf(out, cap, "rank %d: rank %d failed (the coordinator excluded it)", ctx->rank, gone);
}

int rx_comm_failed_member(struct coh_ctx *ctx, const coh_comm_t *c, bool *stale)
{
    int r = -1;
    *stale = false;
    if (!ctx->failed) return -1;
    uv_mutex_lock(&ctx->fail_mu);
    if (ctx->self_excluded) r = ctx->rank;                    /* not stale: excluded for good */
    if (r < 0 && ctx->back && ctx->back[ctx->rank] > c->id) { /* rejoined after c was made */
        r = ctx->rank;
        *stale = true;
    }
    for (int i = 0; (ctx->nfailed || ctx->nback) && i < c->size && r < 0; i++) {
        int w = c->ranks ? c->ranks[i] : i;
        if (ctx->failed[w]) r = w;
        if (r < 0 && ctx->back && ctx->back[w] > c->id) {
            r = w;
            *stale = true;
        }
    }
    uv_mutex_unlock(&ctx->fail_mu);
    return r;
}

/* World rank r is back (it rejoined): communicator `comm` and later ones
 * hold it; older ones hold its failed incarnation. */
static void rank_back(struct coh_ctx *ctx, int r, uint32_t comm)
{
    uv_mutex_lock(&ctx->fail_mu);
    if (ctx->failed[r]) {
        ctx->failed[r] = 0;
        ctx->nfailed--;
    }
    if (!ctx->back[r]) ctx->nback++;
    ctx->back[r] = comm;
    uv_mutex_unlock(&ctx->fail_mu);
}

void rx_ctx_rank_failed(struct coh_ctx *ctx, int r, const char *why)
{
    if (!ctx->failed || r < 0 || r >= ctx->world || r == ctx->rank) return;
    /* Handlers are called outside the lock (they may ask for the list):
     * collect them first. A communicator made later does not contain r. */
    enum { MAXH = 16 };
    coh_failure_fn fn[MAXH];
    void *arg[MAXH];
    coh_comm_t *comm[MAXH];
    int cr[MAXH], nh = 0;
    uint32_t *ids = NULL;
    int nids = 0;
    uv_mutex_lock(&ctx->fail_mu);
    if (ctx->failed[r]) {
        uv_mutex_unlock(&ctx->fail_mu);
        return;
    }
    ctx->failed[r] = 1;
    ctx->nfailed++;
    int ncomms = 0;
    for (coh_comm_t *c = ctx->comms; c; c = c->next) ncomms++;
    ids = coh_malloc(sizeof(uint32_t) * (size_t)ncomms);
    for (coh_comm_t *c = ctx->comms; c; c = c->next) {
        int k = comm_rank_of(c, r);
        if (k < 0) continue;
        if (ids) ids[nids++] = c->id;
        if (!c->on_failure || nh == MAXH) continue;
        fn[nh] = c->on_failure;
        arg[nh] = c->on_failure_arg;
        comm[nh] = c;
        cr[nh++] = k;
    }
    uv_mutex_unlock(&ctx->fail_mu);
    bs_log(COH_LOG_WARN, "rank %d: rank %d failed: %s", ctx->rank, r, why ? why : "");
    /* Every op of a communicator with r in it ends now, those still to
     * come too (as at submission, rx_coll.c): an op launched before this
     * news may wait only on live peers that stopped at an earlier failed op
     * and will never submit it. */
    char text[BS_ERR_LEN];
    rx_excluded_why(ctx, r, text, sizeof(text));
    for (int i = 0; i < nids; i++) {
        for (int k = 0; k < ctx->nrails; k++)
            rx_rail_revoke(&ctx->rails[k], ids[i], COH_EPEER, text);
        /* With several rails a world op may still wait for its epoch's
         * table, which the coordinator, failing the op at submission, will
         * never publish: it waited COHORT_TIMEOUT_MS (mp.hard.sync_stop.*
         * with two rails: 4.0 s). */
        rx_lb_revoke(ctx, ids[i], COH_EPEER, text);
    }
    coh_free(ids);
    for (int i = 0; i < nh; i++) fn[i](comm[i], cr[i], why ? why : "", arg[i]);
}

void rx_ctx_self_excluded(struct coh_ctx *ctx, const char *why)
{
    uint32_t *ids = NULL;
    int nids = 0;
    uv_mutex_lock(&ctx->fail_mu);
    if (!ctx->self_excluded) {
        ctx->self_excluded = true;
        snprintf(ctx->excluded_why, sizeof(ctx->excluded_why), "%s", why);
        int ncomms = 0;
        for (coh_comm_t *c = ctx->comms; c; c = c->next) ncomms++;
        ids = coh_malloc(sizeof(uint32_t) * (size_t)(ncomms ? ncomms : 1));
        for (coh_comm_t *c = ctx->comms; ids && c; c = c->next) ids[nids++] = c->id;
    }
    uv_mutex_unlock(&ctx->fail_mu);
    if (!ids) return;
    bs_log(COH_LOG_WARN, "rank %d: %s: its ops end", ctx->rank, why);
    /* Not left to the others dropping this rank's links: an op so ended
     * blames whichever peer's link closed first ("rank 0 is gone"), and one
     * that no closed link ends would wait out its timeout. */
    for (int i = 0; i < nids; i++)
        for (int k = 0; k < ctx->nrails; k++)
            rx_rail_revoke(&ctx->rails[k], ids[i], COH_EPEER, why);
    coh_free(ids);
    rx_lb_close(ctx, COH_EPEER, why);
}

COH_API int coh_comm_on_failure(coh_comm_t *comm, coh_failure_fn fn, void *arg)
{
    if (!comm || !comm->ctx) return bs_fail(COH_EINVAL, "coh_comm_on_failure: comm is NULL");
    struct coh_ctx *ctx = comm->ctx;
    if (!rx_ctx_alive(ctx)) return bs_fail(COH_ESTATE, "coh_comm_on_failure: not a live context");
    uv_mutex_lock(&ctx->fail_mu);
    comm->on_failure = fn;
    comm->on_failure_arg = arg;
    uv_mutex_unlock(&ctx->fail_mu);
    return 0;
}

COH_API int coh_comm_failed_ranks(const coh_comm_t *comm, int *ranks, int cap)
{
    if (!comm || !comm->ctx) return bs_fail(COH_EINVAL, "coh_comm_failed_ranks: comm is NULL");
    if (cap < 0 || (cap > 0 && !ranks))
        return bs_fail(COH_EINVAL, "coh_comm_failed_ranks: no room for %d ranks", cap);
    struct coh_ctx *ctx = comm->ctx;
    if (!rx_ctx_alive(ctx)) return bs_fail(COH_ESTATE, "coh_comm_failed_ranks: not a live context");
    int n = 0;
    uv_mutex_lock(&ctx->fail_mu);
    for (int i = 0; ctx->failed && i < comm->size; i++) {
        int w = comm->ranks ? comm->ranks[i] : i;
        if (!ctx->failed[w]) continue;
        if (n < cap) ranks[n] = i;
        n++;
    }
    uv_mutex_unlock(&ctx->fail_mu);
    return n;
}

/*
 * After a grow: every member of the new communicator is connected to every
 * other on every rail. A rank that rejoined dials the members (its hello
 * says REJOIN, so their rails take it in place of its failed incarnation);
 * the others wait for its connections and count it back.
 */
static int grow_links(struct coh_ctx *ctx, const int *ranks, int n, uint32_t id)
{
    uint64_t deadline = bs_now_ns() + 2ull * (uint64_t)ctx->cfg.timeout_ms * 1000000ull;
    bool joiner = ctx->cfg.rejoin && ctx->rejoin_addrs;
    if (joiner) {
        /* What this rank learns here: who is gone, who is back. */
        for (int w = 0; w < ctx->world; w++) {
            bool in = false;
            for (int i = 0; i < n; i++) in |= ranks[i] == w;
            if (!in) rx_ctx_rank_failed(ctx, w, "not in the communicator this rank rejoined");
        }
        for (int i = 0; i < n; i++) {
            if (ranks[i] == ctx->rank) continue;
            for (int r = 0; r < ctx->nrails; r++)
                if (!en_rail_peer_lost(&ctx->rails[r].en, ranks[i]))
                    BS_CHECK(rx_rail_dial(
                        &ctx->rails[r], ranks[i],
                        (struct sockaddr *)&ctx->rejoin_addrs[ranks[i] * ctx->nrails + r]));
        }
    }
    for (int i = 0; i < n; i++) {
        int w = ranks[i];
        if (w == ctx->rank || (!joiner && !rx_ctx_is_failed(ctx, w))) continue;
        for (int r = 0; r < ctx->nrails; r++)
            if (en_rail_wait_peer(&ctx->rails[r].en, w, deadline) < 0)
                return bs_fail(COH_ETIMEDOUT,
                               "coh_comm_grow: rank %d did not connect on rail %d within twice "
                               "COHORT_TIMEOUT_MS",
                               w, r);
    }
    /* The world (and, on the others, any communicator made before) holds
     * the failed incarnation: ops on it fail, naming the rank. */
    for (int i = 0; i < n; i++)
        if (joiner || rx_ctx_is_failed(ctx, ranks[i])) rank_back(ctx, ranks[i], id);
    return 0;
}

static int remake(coh_comm_t *comm, bool grow, coh_comm_t **out)
{
    const char *fn = grow ? "coh_comm_grow" : "coh_comm_shrink";
    if (!comm || !comm->ctx || !out) return bs_fail(COH_EINVAL, "%s: NULL argument", fn);
    struct coh_ctx *ctx = comm->ctx;
    if (!rx_ctx_alive(ctx) || atomic_load(&ctx->state) != RX_CTX_RUNNING)
        return bs_fail(COH_ESTATE, "%s: the context is not running", fn);
    int *ranks = coh_malloc(sizeof(int) * (size_t)comm->size);
    coh_comm_t *nc = coh_zalloc(sizeof(*nc));
    if (!ranks || !nc) {
        coh_free(ranks);
        coh_free(nc);
        return bs_fail(COH_ENOMEM, "%s: out of memory", fn);
    }
    uint32_t top = 0;
    uv_mutex_lock(&ctx->fail_mu);
    for (coh_comm_t *c = ctx->comms; c; c = c->next)
        if (c->id > top) top = c->id;
    bool joining = grow && ctx->cfg.rejoin && ctx->nback == 0; /* not grown in yet */
    uv_mutex_unlock(&ctx->fail_mu);
    for (int i = 0; i < comm->size; i++) ranks[i] = comm->ranks ? comm->ranks[i] : i;
    int *surv = NULL, n = 0;
    uint32_t id = 0;
    int st;
    if (ctx->member) {
        st = rx_member_shrink(ctx, grow, comm->id, ranks, joining ? 0 : comm->size, top, &id, &surv,
                              &n);
    } else { /* a world of one */
        surv = coh_malloc(sizeof(int));
        st = surv ? 0 : bs_fail(COH_ENOMEM, "%s: out of memory", fn);
        if (surv) surv[0] = ranks[0];
        n = 1;
        id = top + 1;
    }
    coh_free(ranks);
    if (st == 0 && grow && ctx->member) st = grow_links(ctx, surv, n, id);
    if (st < 0) {
        coh_free(surv);
        coh_free(nc);
        return st;
    }
    int me = -1;
    for (int i = 0; i < n; i++)
        if (surv[i] == ctx->rank) me = i;
    if (me < 0) {
        coh_free(surv);
        coh_free(nc);
        return bs_fail(COH_EPROTO, "%s: the new communicator does not have this rank", fn);
    }
    nc->ctx = ctx;
    nc->id = id;
    nc->rank = me;
    nc->size = n;
    nc->ranks = surv;
    atomic_init(&nc->next_seq, 0);
    uv_mutex_lock(&ctx->fail_mu);
    nc->next = ctx->comms;
    ctx->comms = nc;
    uv_mutex_unlock(&ctx->fail_mu);
    *out = nc;
    return 0;
}

COH_API int coh_comm_shrink(coh_comm_t *comm, coh_comm_t **out)
{
    return remake(comm, false, out);
}

COH_API int coh_comm_grow(coh_comm_t *comm, coh_comm_t **out)
{
    return remake(comm, true, out);
}

COH_API int coh_comm_free(coh_comm_t *comm)
{
    if (!comm || !comm->ctx) return bs_fail(COH_EINVAL, "coh_comm_free: comm is NULL");
    struct coh_ctx *ctx = comm->ctx;
    if (comm == &ctx->world_comm)
        return bs_fail(COH_EINVAL, "coh_comm_free: the world is the context's");
    uv_mutex_lock(&ctx->fail_mu);
    coh_comm_t **pp = &ctx->comms;
    while (*pp && *pp != comm) pp = &(*pp)->next;
    if (*pp) *pp = comm->next;
    uv_mutex_unlock(&ctx->fail_mu);
    coh_free((void *)comm->ranks);
    coh_free(comm);
    return 0;
}

void rx_ctx_free_comms(struct coh_ctx *ctx)
{
    for (coh_comm_t *c = ctx->comms, *nx; c; c = nx) {
        nx = c->next;
        if (c == &ctx->world_comm) continue;
        coh_free((void *)c->ranks);
        coh_free(c);
    }
    ctx->comms = &ctx->world_comm;
    ctx->world_comm.next = NULL;
}
