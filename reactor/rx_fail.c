/*
 * Failed ranks: which world ranks the coordinator excluded for good (died,
 * hung, missed T_fault), as this rank heard it, and the applications'
 * failure handlers. Written from the control reactor, read by any thread.
 * And the communicators made of the survivors (coh_comm_shrink).
 */
#include <stdio.h>
#include <string.h>

#include "reactor/rx_ctx.h"

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

int rx_comm_failed_member(struct coh_ctx *ctx, const coh_comm_t *c)
{
    int r = -1;
    if (!ctx->failed) return -1;
    uv_mutex_lock(&ctx->fail_mu);
    for (int i = 0; ctx->nfailed && i < c->size && r < 0; i++) {
        int w = c->ranks ? c->ranks[i] : i;
        if (ctx->failed[w]) r = w;
    }
    uv_mutex_unlock(&ctx->fail_mu);
    return r;
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
    uv_mutex_lock(&ctx->fail_mu);
    if (ctx->failed[r]) {
        uv_mutex_unlock(&ctx->fail_mu);
        return;
    }
    ctx->failed[r] = 1;
    ctx->nfailed++;
    for (coh_comm_t *c = ctx->comms; c && nh < MAXH; c = c->next) {
        int k = comm_rank_of(c, r);
        if (k < 0 || !c->on_failure) continue;
        fn[nh] = c->on_failure;
        arg[nh] = c->on_failure_arg;
        comm[nh] = c;
        cr[nh++] = k;
    }
    uv_mutex_unlock(&ctx->fail_mu);
    bs_log(COH_LOG_WARN, "rank %d: rank %d failed: %s", ctx->rank, r, why ? why : "");
    for (int i = 0; i < nh; i++) fn[i](comm[i], cr[i], why ? why : "", arg[i]);
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

COH_API int coh_comm_shrink(coh_comm_t *comm, coh_comm_t **out)
{
    if (!comm || !comm->ctx || !out) return bs_fail(COH_EINVAL, "coh_comm_shrink: NULL argument");
    struct coh_ctx *ctx = comm->ctx;
    if (!rx_ctx_alive(ctx) || atomic_load(&ctx->state) != RX_CTX_RUNNING)
        return bs_fail(COH_ESTATE, "coh_comm_shrink: the context is not running");
    int *ranks = coh_malloc(sizeof(int) * (size_t)comm->size);
    coh_comm_t *nc = coh_zalloc(sizeof(*nc));
    if (!ranks || !nc) {
        coh_free(ranks);
        coh_free(nc);
        return bs_fail(COH_ENOMEM, "coh_comm_shrink: out of memory");
    }
    uint32_t top = 0;
    uv_mutex_lock(&ctx->fail_mu);
    for (coh_comm_t *c = ctx->comms; c; c = c->next)
        if (c->id > top) top = c->id;
    uv_mutex_unlock(&ctx->fail_mu);
    for (int i = 0; i < comm->size; i++) ranks[i] = comm->ranks ? comm->ranks[i] : i;
    int *surv = NULL, n = 0;
    uint32_t id = 0;
    int st;
    if (ctx->member) {
        st = rx_member_shrink(ctx, comm->id, ranks, comm->size, top, &id, &surv, &n);
    } else { /* a world of one */
        surv = coh_malloc(sizeof(int));
        st = surv ? 0 : bs_fail(COH_ENOMEM, "coh_comm_shrink: out of memory");
        if (surv) surv[0] = ranks[0];
        n = 1;
        id = top + 1;
    }
    coh_free(ranks);
    if (st < 0) {
        coh_free(nc);
        return st;
    }
    int me = -1;
    for (int i = 0; i < n; i++)
        if (surv[i] == ctx->rank) me = i;
    if (me < 0) {
        coh_free(surv);
        coh_free(nc);
        return bs_fail(COH_EPROTO, "coh_comm_shrink: the new communicator does not have this rank");
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
