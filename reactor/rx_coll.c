/*
 * Collective entry points: check arguments, give the op its sequence number,
 * split it across rails, build each rail's plan (sched/sc_plan.h) and hand
 * the slices to the rails. Nothing is copied: the rails read and write the
 * caller's buffers.
 */
#include <stdio.h>
#include <string.h>

#include "reactor/rx_ctx.h"

static bool overlap(const void *a, size_t an, const void *b, size_t bn)
{
    const char *x = a, *y = b;
    return x < y + bn && y < x + an;
}

static int check(coh_comm_t *comm, const rx_coll_args_t *a, coh_request_t **req, const char *fn)
{
    if (!comm || !comm->ctx) return bs_fail(COH_EINVAL, "%s: comm is NULL", fn);
    if (!rx_ctx_alive(comm->ctx) || atomic_load(&comm->ctx->state) != RX_CTX_RUNNING)
        return bs_fail(COH_ESTATE, "%s: the context is not running", fn);
    if (!req) return bs_fail(COH_EINVAL, "%s: req is NULL", fn);
    if (a->kind == SC_BARRIER) return 0;
    size_t es = coh_dtype_size(a->dtype);
    if (!es) return bs_fail(COH_EINVAL, "%s: unknown dtype %d", fn, (int)a->dtype);
    if ((a->kind == SC_ALLREDUCE || a->kind == SC_REDUCE_SCATTER) &&
        ((unsigned)a->op >= COH_REDOP_COUNT))
        return bs_fail(COH_EINVAL, "%s: unknown reduction op %d", fn, (int)a->op);
    size_t mul = (a->kind == SC_ALLGATHER || a->kind == SC_REDUCE_SCATTER) ? (size_t)comm->size : 1;
    if (a->count > (SIZE_MAX / es) / mul) return bs_fail(COH_EINVAL, "%s: count overflows", fn);
    if (a->count && !a->recvbuf)
        return bs_fail(COH_EINVAL, "%s: NULL buffer with count %zu", fn, a->count);
    if (a->kind == SC_BROADCAST && (a->root < 0 || a->root >= comm->size))
        return bs_fail(COH_EINVAL, "%s: root %d is not a rank of a size-%d communicator", fn,
                       a->root, comm->size);
    return 0;
}

/* Spraying (COHORT_UDP_SPRAY): the slices on the group's rails become one,
 * on the lead, whose datagrams go over all of them. The other slices keep
 * their sizes and order; the ranges are laid out again from 0. */
static int spray_merge(const struct coh_ctx *ctx, sc_slice_t *sl, int n)
{
    sc_slice_t out[RX_MAX_RAILS];
    int m = 0, lead = -1;
    for (int s = 0; s < n; s++) {
        uint64_t len = sl[s].hi - sl[s].lo;
        if (rx_udp_path(ctx, sl[s].rail) < 0) {
            out[m++] = (sc_slice_t){.rail = sl[s].rail, .lo = 0, .hi = len};
        } else if (lead < 0) {
            lead = m;
            out[m++] = (sc_slice_t){.rail = ctx->udp_group.rail[0], .lo = 0, .hi = len};
        } else {
            out[lead].hi += len;
        }
    }
    uint64_t at = sl[0].lo;
    for (int s = 0; s < m; s++) {
        uint64_t len = out[s].hi;
        sl[s] = (sc_slice_t){.rail = out[s].rail, .lo = at, .hi = at + len};
        at += len;
    }
    return m;
}

int rx_launch(struct coh_ctx *ctx, coh_request_t *req, const rx_launch_t *L)
{
    const coh_config_t *cfg = &ctx->cfg;
    sc_split_in_t in = {.count = L->coll.count,
                        .bytes = L->bytes,
                        .nrails = ctx->nrails,
                        .rail_min_bytes = cfg->rail_min_bytes,
                        .small_bytes = cfg->small_bytes,
                        .key = L->key};
    sc_slice_t sl[RX_MAX_RAILS];
    int n = L->nslices;
    if (n > 0 && n <= ctx->nrails)
        memcpy(sl, L->slices, sizeof(sc_slice_t) * (size_t)n);
    else
        n = sc_rail_split(&in, sl);
    if (n < 0) return bs_fail(n, "%s: cannot split over %d rails", L->desc, ctx->nrails);
    bool lossy = L->loss[SC_STAGE_PUSH] > 0 || L->loss[SC_STAGE_PULL] > 0;
    if (lossy && ctx->udp_group.n > 1) n = spray_merge(ctx, sl, n);
    /* Ranks that split differently would exchange mismatched frames: the
     * split (slice count and boundaries) is part of the signature. */
    uint64_t sig = bs_fnv64(L->sig, (uint64_t)n);
    for (int s = 0; s < n; s++)
        sig = bs_fnv64(bs_fnv64(bs_fnv64(sig, (uint64_t)sl[s].rail), sl[s].lo), sl[s].hi);
    en_op_t *ops[RX_MAX_RAILS] = {0};
    int st = 0;
    if (lossy) { /* which slices go by datagram, in what size, sprayed over what */
        for (int s = 0; s < n; s++)
            sig = bs_fnv64(bs_fnv64(sig, ctx->rail_udp[sl[s].rail]), ctx->udp_seg[sl[s].rail]);
        for (int k = 0; k < ctx->udp_group.n; k++)
            sig = bs_fnv64(sig, (uint64_t)ctx->udp_group.rail[k] + 1);
    }
    for (int s = 0; s < n && st == 0; s++) {
        sc_coll_t c = L->coll;
        c.lo = sl[s].lo;
        c.hi = sl[s].hi;
        bool dg = lossy && ctx->rail_udp[sl[s].rail] && c.kind == SC_ALLREDUCE && c.nranks > 1;
        if (dg) c.algo = SC_ALGO_DIRECT;
        sc_plan_t plan;
        sc_plan_init(&plan);
        st = sc_plan_build(&c, &plan);
        if (st == 0)
            st = en_op_new(&req->done, s, L->comm, L->seq, sig, L->desc, L->dtype, L->redop,
                           (void *)L->sendbuf, L->recvbuf, &plan, &ops[s]);
        if (st == 0 && dg)
            en_op_set_loss(ops[s], L->loss[SC_STAGE_PUSH], L->loss[SC_STAGE_PULL], L->layer,
                           L->nlayers, true);
        sc_plan_free(&plan);
    }
    if (st < 0) {
        for (int s = 0; s < n; s++) en_op_free(ops[s]);
        return bs_fail(st, "%s: cannot build the plan: %s", L->desc, coh_strerror(st));
    }
    req->comm = L->comm;
    req->seq = L->seq;
    req->nslices = n;
    atomic_store(&req->slices, n);
    bool small = L->bytes <= cfg->small_bytes;
    uint64_t unit = L->coll.count ? L->bytes / L->coll.count : 0;
    for (int s = 0; s < n; s++)
        req->slice[s] = (rx_slice_t){
            .req = req, .op = ops[s], .rail = sl[s].rail, .bytes = (sl[s].hi - sl[s].lo) * unit};
    /* Once the first slice is handed over the request may complete under us
     * (a failure cancels the rest): read nothing of it after the loop. */
    for (int s = 0; s < n; s++) rx_rail_submit(&ctx->rails[sl[s].rail], &req->slice[s], small);
    return 0;
}

/* Op seq of comm (launched) has a member known failed: it cannot complete.
 * Dropping that rank's connections ends only the ops that exchange with it
 * directly (recursive doubling over 4 ranks pairs rank 0 with 1 and 2
 * only), and the peers this one waits for may be busy elsewhere: it would
 * run into its timeout. End it now on every rail and tell the peers. */
static void abort_known_failed(struct coh_ctx *ctx, const coh_comm_t *comm, uint64_t seq, int gone)
{
    char why[BS_ERR_LEN];
    rx_excluded_why(ctx, gone, why, sizeof(why));
    rx_comm_abort_seq(ctx, comm, seq, COH_EPEER, why, gone);
}

void rx_comm_abort_seq(struct coh_ctx *ctx, const coh_comm_t *comm, uint64_t seq, int status,
                       const char *why, int gone)
{
    int peers[64];
    for (int i = 0; i < comm->size;) {
        int n = 0;
        for (; i < comm->size && n < 64; i++) {
            int w = comm->ranks ? comm->ranks[i] : i;
            if (w != ctx->rank && w != gone) peers[n++] = w;
        }
        for (int r = 0; r < ctx->nrails; r++)
            rx_rail_abort(&ctx->rails[r], comm->id, seq, status, why, peers, n);
    }
}

/* "allreduce(count=1024, f32, sum)", for error messages. A thread's last
 * one is kept: formatting it anew for every op was a twentieth of a small
 * op's time. The string stays valid until the thread's next call. */
static const char *describe(const rx_coll_args_t *a)
{
    static _Thread_local struct {
        bool valid;
        int kind, dtype, op, root;
        size_t count;
        char text[96];
    } last;
    if (last.valid && last.kind == (int)a->kind && last.dtype == (int)a->dtype &&
        last.op == (int)a->op && last.root == a->root && last.count == a->count)
        return last.text;
    char *desc = last.text;
    size_t cap = sizeof(last.text);
    if (a->kind == SC_BARRIER)
        snprintf(desc, cap, "barrier");
    else if (a->kind == SC_BROADCAST)
        snprintf(desc, cap, "broadcast(count=%zu, %s, root=%d)", a->count, coh_dtype_name(a->dtype),
                 a->root);
    else if (a->kind == SC_ALLGATHER)
        snprintf(desc, cap, "allgather(count=%zu, %s)", a->count, coh_dtype_name(a->dtype));
    else
        snprintf(desc, cap, "%s(count=%zu, %s, %s)", sc_coll_kind_name(a->kind), a->count,
                 coh_dtype_name(a->dtype), coh_redop_name(a->op));
    last.valid = true;
    last.kind = (int)a->kind;
    last.dtype = (int)a->dtype;
    last.op = (int)a->op;
    last.root = a->root;
    last.count = a->count;
    return last.text;
}

int rx_coll_submit(coh_comm_t *comm, const rx_coll_args_t *a, uint64_t seq, coh_request_t **out,
                   const char *fn)
{
    struct coh_ctx *ctx = comm->ctx;
    const coh_config_t *cfg = &ctx->cfg;
    size_t es = a->kind == SC_BARRIER ? 1 : coh_dtype_size(a->dtype);
    size_t per_rank =
        (a->kind == SC_ALLGATHER || a->kind == SC_REDUCE_SCATTER) ? (size_t)comm->size : 1;
    /* Bounded loss pipelines in its own chunks (COHORT_UDP_CHUNK_BYTES). */
    size_t chunk_bytes = a->loss[SC_STAGE_PUSH] > 0 || a->loss[SC_STAGE_PULL] > 0
                             ? cfg->udp_chunk_bytes
                             : cfg->chunk_bytes;
    uint64_t chunk_elems = chunk_bytes / es ? chunk_bytes / es : 1;
    uint64_t small_elems = cfg->small_bytes / es;
    /* A device op reserved its chunks' numbers at its submission (rx_gpu.c)
     * and launches them later, split evenly: the balancer's epochs follow
     * the application's submissions, not these. */
    bool reserved = seq != RX_SEQ_NEXT;
    if (!reserved) seq = atomic_fetch_add(&comm->next_seq, 1);
    /* The signature covers everything that shapes the plan, so ranks that
     * disagree fail with EMISMATCH instead of exchanging wrong frames. */
    uint64_t sig = BS_FNV_SEED;
    sig = bs_fnv64(sig, (uint64_t)a->kind);
    sig = bs_fnv64(sig, a->kind == SC_BARRIER ? 0 : (uint64_t)a->dtype);
    sig = bs_fnv64(sig,
                   (a->kind == SC_ALLREDUCE || a->kind == SC_REDUCE_SCATTER) ? (uint64_t)a->op : 0);
    sig = bs_fnv64(sig, a->count);
    sig = bs_fnv64(sig, (uint64_t)a->root);
    sig = bs_fnv64(sig, (uint64_t)comm->size);
    sig = bs_fnv64(sig, chunk_elems);
    sig = bs_fnv64(sig, small_elems);
    for (int k = SC_STAGE_PUSH; k <= SC_STAGE_PULL; k++) {
        uint64_t bits;
        memcpy(&bits, &a->loss[k], sizeof(bits));
        sig = bs_fnv64(sig, bits);
    }

    const char *desc = describe(a);

    rx_launch_t L = {.coll = {.kind = a->kind,
                              .algo = SC_ALGO_AUTO,
                              .nranks = comm->size,
                              .rank = comm->rank,
                              .order = comm->ranks,
                              .root = a->root,
                              .count = a->count,
                              .chunk_elems = chunk_elems,
                              .small_elems = small_elems,
                              .avg = a->op == COH_AVG &&
                                     (a->kind == SC_ALLREDUCE || a->kind == SC_REDUCE_SCATTER),
                              .rs_in_place = a->rs_in_place,
                              .pos_blocks = true},
                     .comm = comm->id,
                     .seq = seq,
                     .sig = sig,
                     .key = seq,
                     .bytes = (uint64_t)a->count * es * per_rank,
                     .desc = desc,
                     .dtype = a->kind == SC_BARRIER ? COH_U8 : a->dtype,
                     .redop = a->op,
                     .sendbuf = a->sendbuf,
                     .recvbuf = a->recvbuf,
                     .loss = {0, a->loss[SC_STAGE_PUSH], a->loss[SC_STAGE_PULL]},
                     .layer = a->layer,
                     .nlayers = a->nlayers};
    /* Across hosts: inside each host, then between them (COHORT_HIER). Auto:
     * whichever the link model expects to be faster. Every rank decides
     * alike (the same hosts, sizes and knobs); the signature says so.
     * Bounded-loss ops keep their push/pull plan. */
    bool lossy = a->loss[SC_STAGE_PUSH] > 0 || a->loss[SC_STAGE_PULL] > 0;
    if (cfg->hier != 0 && !lossy && ctx->host_idx) {
        L.coll.host = ctx->host_idx;
        sc_link_model_t m = {.net_lat = cfg->hier_net_us * 1e-6,
                             .net_bw = cfg->hier_net_mbps * 125e3,
                             .local_lat = cfg->hier_local_us * 1e-6,
                             .local_bw = cfg->hier_local_mbps * 125e3};
        sc_coll_t h = L.coll;
        h.algo = SC_ALGO_HIER;
        double th = sc_plan_cost(&h, es, &m); /* < 0: the hosts do not allow it */
        if (th >= 0 && (cfg->hier == 1 || th < sc_plan_cost(&L.coll, es, &m)))
            L.coll.algo = SC_ALGO_HIER;
    }
    /* A large allreduce: the ring or halving-doubling (COHORT_ALGO). Auto:
     * the ring with several rails (below) and over shared memory (the whole
     * job on one host: measured faster at 4 MiB, alike elsewhere,
     * docs/perf.md); else the cheaper by the link model, which gives hd for
     * powers of two (the same bytes in fewer steps: 4 ranks over TCP, 1 MiB,
     * 1.2-1.5 ms against the ring's 1.5-1.9) and the ring otherwise (the
     * fold moves the whole buffer twice more) except a few KiB above
     * COHORT_SMALL_BYTES. Every rank decides alike; the signature says so. */
    if (a->kind == SC_ALLREDUCE && !lossy && L.coll.algo == SC_ALGO_AUTO &&
        sc_plan_resolve_algo(&L.coll) == SC_ALGO_RING) {
        int algo = ctx->ar_algo;
        bool one_host = ctx->local_n >= ctx->world;
        if (algo == SC_ALGO_AUTO && (ctx->nrails > 1 || (one_host && cfg->shm))) {
            /* Several rails: the ring, whose links all stream all the time.
             * hd over rails works (cluster.rails.failover.hd, since reads
             * count as a link's progress) but was not measured against the
             * ring there (docs/perf.md). */
            algo = SC_ALGO_RING;
        } else if (algo == SC_ALGO_AUTO) {
            sc_link_model_t m = {
                .net_lat = (one_host ? cfg->hier_local_us : cfg->hier_net_us) * 1e-6,
                .net_bw = (one_host ? cfg->hier_local_mbps : cfg->hier_net_mbps) * 125e3};
            sc_coll_t hd = L.coll, ring = L.coll;
            hd.algo = SC_ALGO_HD;
            ring.algo = SC_ALGO_RING;
            algo = sc_plan_cost(&hd, es, &m) <= sc_plan_cost(&ring, es, &m) ? SC_ALGO_HD
                                                                            : SC_ALGO_RING;
        }
        L.coll.algo = (sc_algo)algo;
    }
    /* A small allreduce: recursive doubling or the star (COHORT_SMALL_ALGO).
     * Auto: the cheaper by the link model with each message's CPU, which
     * the ranks of one host share: the star from 4 ranks on 2 cores (fewer
     * messages), recursive doubling when each rank has a core (fewer steps)
     * or the job spans hosts (a rank's link would carry the star's n-1
     * messages). Every rank of one host sees the same cores; the signature
     * holds the choice. */
    if (a->kind == SC_ALLREDUCE && !lossy && L.coll.algo == SC_ALGO_AUTO &&
        sc_plan_resolve_algo(&L.coll) == SC_ALGO_RD) {
        int algo = ctx->small_algo;
        if (algo == SC_ALGO_AUTO && ctx->local_n >= ctx->world) {
            sc_link_model_t m = {.net_lat = cfg->hier_local_us * 1e-6,
                                 .net_bw = cfg->hier_local_mbps * 125e3,
                                 .msg_cpu = ctx->msg_cpu_us * 1e-6,
                                 .cores = ctx->cores};
            sc_coll_t star = L.coll;
            star.algo = SC_ALGO_STAR;
            algo = sc_plan_cost(&star, es, &m) < sc_plan_cost(&L.coll, es, &m) ? SC_ALGO_STAR
                                                                               : SC_ALGO_RD;
        }
        if (algo == SC_ALGO_STAR) L.coll.algo = SC_ALGO_STAR;
    }
    L.sig = bs_fnv64(L.sig, (uint64_t)L.coll.algo);
    coh_request_t *req = rx_request_new(ctx, 0);
    if (!req) return bs_fail(COH_ENOMEM, "%s: out of memory", fn);
    req->what = sc_coll_kind_name(a->kind);
    req->on_done = a->on_done;
    req->on_done_arg = a->on_done_arg;
    req->bytes = (uint64_t)a->count * es * per_rank;
    /* With more ranks than cores, a waiter spins (yielding) only for ops
     * that may end within the spin: a larger one would hand its work back to
     * the loop threads half way anyway. Measured, 4 ranks on 2 cores: 4 KiB
     * to 1 MiB faster with the spin (4 KiB 2x), 4-16 MiB 10-20% slower. */
    if (ctx->oversubscribed && (uint64_t)a->count * es * per_rank > cfg->chunk_bytes)
        req->spin_us = 0;
    bool stale;
    int gone = rx_comm_failed_member(ctx, comm, &stale);
    if (gone >= 0 && (stale || gone == ctx->rank)) {
        /* Nothing to run, on any member: the job went on without this rank
         * (excluded), or comm holds a failed incarnation of a rank that
         * rejoined (or this rank is the new one). */
        char why[BS_ERR_LEN];
        if (!stale) {
            uv_mutex_lock(&ctx->fail_mu);
            snprintf(why, sizeof(why), "%s", ctx->excluded_why);
            uv_mutex_unlock(&ctx->fail_mu);
        } else if (gone == ctx->rank) {
            snprintf(why, sizeof(why),
                     "this rank rejoined the job after communicator %u was made: use the one "
                     "coh_comm_grow made",
                     comm->id);
        } else {
            snprintf(why, sizeof(why),
                     "rank %d failed and rejoined after communicator %u was made: use the one "
                     "coh_comm_grow made",
                     gone, comm->id);
        }
        rx_request_set_error(req, COH_EPEER, why);
        rx_request_complete(req);
        *out = req;
        return 0;
    }
    /* The world's ops are split by the balancer's table of their epoch
     * (rx_lb.h); sub-communicators have no sequence shared with the
     * coordinator and split evenly. */
    int st = ctx->lb && comm == &ctx->world_comm && !reserved ? rx_lb_launch(ctx, req, &L)
                                                              : rx_launch(ctx, req, &L);
    if (st < 0) {
        rx_request_discard(req);
        /* The sequence number is spent: peers will time out on this op. */
        return bs_fail(st, "%s: %s", fn, coh_last_error());
    }
    *out = req;
    if (gone >= 0) abort_known_failed(ctx, comm, seq, gone);
    return 0;
}

static int route(coh_comm_t *comm, const rx_coll_args_t *a, const coh_coll_opts_t *o,
                 coh_request_t **req, const char *fn);

/* An allreduce's arguments checked, then submitted: bounded loss on host
 * buffers, otherwise where the buffers are (o). */
static int allreduce_submit(coh_comm_t *comm, rx_coll_args_t *a, const coh_coll_opts_t *o,
                            coh_request_t **req, const char *fn)
{
    BS_CHECK(check(comm, a, req, fn));
    size_t n = a->count * coh_dtype_size(a->dtype);
    if (a->sendbuf == a->recvbuf) a->sendbuf = NULL;
    if (a->count && a->sendbuf && overlap(a->sendbuf, n, a->recvbuf, n))
        return bs_fail(COH_EINVAL, "%s: send and recv buffers partly overlap", fn);
    if (a->loss[SC_STAGE_PUSH] > 0 || a->loss[SC_STAGE_PULL] > 0) {
        BS_CHECK(rx_gpu_host_only(comm->ctx, a->sendbuf, a->recvbuf, fn));
        return rx_coll_submit(comm, a, RX_SEQ_NEXT, req, fn);
    }
    return route(comm, a, o, req, fn);
}

/* coh_allreduce with a loss bound (coh_allreduce_ex, COH_ALLREDUCE_DEFAULT). */
int rx_allreduce_lossy(coh_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                       coh_dtype dtype, coh_redop op, const coh_allreduce_opts_t *o,
                       coh_request_t **req)
{
    const char *fn = "coh_allreduce_ex";
    double push = o->loss_bound, pull = o->pull_loss_bound;
    if (!(push >= 0 && push < 1) || !(pull >= 0 && pull < 1))
        return bs_fail(COH_EINVAL, "%s: loss bounds must be in [0, 1) (%g, %g)", fn, push, pull);
    if (o->nlayers < 0 || (o->nlayers > 0 && (o->layer < 0 || o->layer >= o->nlayers)))
        return bs_fail(COH_EINVAL, "%s: layer %d of %d", fn, o->layer, o->nlayers);
    if (pull == 0) pull = push / 4;
    rx_coll_args_t a = {.kind = SC_ALLREDUCE,
                        .sendbuf = sendbuf,
                        .recvbuf = recvbuf,
                        .count = count,
                        .dtype = dtype,
                        .op = op,
                        .loss = {0, push, pull},
                        .layer = o->layer,
                        .nlayers = o->nlayers};
    return allreduce_submit(comm, &a, NULL, req, fn);
}

/* After the host checks: a device op when the buffers are device memory. */
static int route(coh_comm_t *comm, const rx_coll_args_t *a, const coh_coll_opts_t *o,
                 coh_request_t **req, const char *fn)
{
    int dev = 0;
    int w = a->count ? rx_gpu_where(comm->ctx, o ? o->mem : COH_MEM_AUTO, a->sendbuf, a->recvbuf,
                                    &dev, fn)
                     : 0;
    if (w < 0) return w;
    if (w) return rx_gpu_submit(comm, a, o ? o->stream : NULL, dev, req, fn);
    return rx_coll_submit(comm, a, RX_SEQ_NEXT, req, fn);
}

int rx_allreduce_opts(coh_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                      coh_dtype dtype, coh_redop op, const coh_coll_opts_t *o, coh_request_t **req,
                      const char *fn)
{
    rx_coll_args_t a = {.kind = SC_ALLREDUCE,
                        .sendbuf = sendbuf,
                        .recvbuf = recvbuf,
                        .count = count,
                        .dtype = dtype,
                        .op = op};
    return allreduce_submit(comm, &a, o, req, fn);
}

COH_API int coh_allreduce(coh_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                          coh_dtype dtype, coh_redop op, coh_request_t **req)
{
    return rx_allreduce_opts(comm, sendbuf, recvbuf, count, dtype, op, NULL, req, "coh_allreduce");
}

COH_API int coh_broadcast_ex(coh_comm_t *comm, void *buf, size_t count, coh_dtype dtype, int root,
                             const coh_coll_opts_t *opts, coh_request_t **req)
{
    rx_coll_args_t a = {
        .kind = SC_BROADCAST, .recvbuf = buf, .count = count, .dtype = dtype, .root = root};
    BS_CHECK(check(comm, &a, req, "coh_broadcast"));
    return route(comm, &a, opts, req, "coh_broadcast");
}

COH_API int coh_broadcast(coh_comm_t *comm, void *buf, size_t count, coh_dtype dtype, int root,
                          coh_request_t **req)
{
    return coh_broadcast_ex(comm, buf, count, dtype, root, NULL, req);
}

COH_API int coh_allgather(coh_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                          coh_dtype dtype, coh_request_t **req)
{
    return coh_allgather_ex(comm, sendbuf, recvbuf, count, dtype, NULL, req);
}

COH_API int coh_allgather_ex(coh_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                             coh_dtype dtype, const coh_coll_opts_t *opts, coh_request_t **req)
{
    rx_coll_args_t a = {.kind = SC_ALLGATHER,
                        .sendbuf = sendbuf,
                        .recvbuf = recvbuf,
                        .count = count,
                        .dtype = dtype};
    BS_CHECK(check(comm, &a, req, "coh_allgather"));
    size_t es = coh_dtype_size(dtype), n = count * es;
    char *mine = count ? (char *)recvbuf + (size_t)comm->rank * n : NULL;
    if (!sendbuf) a.sendbuf = mine;
    if (count && a.sendbuf != mine && overlap(a.sendbuf, n, recvbuf, n * (size_t)comm->size))
        return bs_fail(COH_EINVAL, "coh_allgather: sendbuf overlaps recvbuf but is not this "
                                   "rank's block of it");
    return route(comm, &a, opts, req, "coh_allgather");
}

COH_API int coh_reduce_scatter(coh_comm_t *comm, const void *sendbuf, void *recvbuf,
                               size_t recvcount, coh_dtype dtype, coh_redop op, coh_request_t **req)
{
    return coh_reduce_scatter_ex(comm, sendbuf, recvbuf, recvcount, dtype, op, NULL, req);
}

COH_API int coh_reduce_scatter_ex(coh_comm_t *comm, const void *sendbuf, void *recvbuf,
                                  size_t recvcount, coh_dtype dtype, coh_redop op,
                                  const coh_coll_opts_t *opts, coh_request_t **req)
{
    rx_coll_args_t a = {.kind = SC_REDUCE_SCATTER,
                        .sendbuf = sendbuf,
                        .recvbuf = recvbuf,
                        .count = recvcount,
                        .dtype = dtype,
                        .op = op};
    BS_CHECK(check(comm, &a, req, "coh_reduce_scatter"));
    size_t n = recvcount * coh_dtype_size(dtype), full = n * (size_t)comm->size;
    if (recvcount && !sendbuf) {
        a.rs_in_place = true; /* recvbuf holds the whole input */
    } else if (recvcount &&
               (const char *)recvbuf == (const char *)sendbuf + (size_t)comm->rank * n) {
        /* NCCL's in-place form: the input is sendbuf, the result its own block. */
        a.rs_in_place = true;
        a.recvbuf = (void *)sendbuf;
        a.sendbuf = NULL;
    } else if (recvcount && overlap(sendbuf, full, recvbuf, n)) {
        return bs_fail(COH_EINVAL, "coh_reduce_scatter: buffers overlap (in place: pass "
                                   "sendbuf = NULL or recvbuf = sendbuf + rank * recvcount)");
    }
    return route(comm, &a, opts, req, "coh_reduce_scatter");
}

COH_API int coh_barrier(coh_comm_t *comm, coh_request_t **req)
{
    rx_coll_args_t a = {.kind = SC_BARRIER};
    BS_CHECK(check(comm, &a, req, "coh_barrier"));
    return rx_coll_submit(comm, &a, RX_SEQ_NEXT, req, "coh_barrier");
}

COH_API int coh_allreduce_sync(coh_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                               coh_dtype dtype, coh_redop op)
{
    coh_request_t *req;
    BS_CHECK(coh_allreduce(comm, sendbuf, recvbuf, count, dtype, op, &req));
    int st = coh_wait(req, -1);
    if (st < 0) bs_fail(st, "%s", coh_request_error(req));
    coh_request_free(req);
    return st;
}
