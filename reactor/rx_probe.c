/*
 * coh_probe: AdapCC's alpha-beta profiling. Every link of the world, on every
 * rail, in rounds of disjoint pairs (the circle method of a round-robin
 * tournament: in round k rank i meets (k - i) mod (n' - 1), and the last
 * rank meets whoever would meet itself), so no rank takes part in two probes
 * at once and the probes do not share a NIC. Per pair and rail: REPS one-f64
 * exchanges (a 2-rank allreduce: the median is the one-way latency) and a
 * COHORT_PROBE_BYTES broadcast each way (the rate; sc_fit_alpha_beta). A short
 * probe (the first partial or selective sync's, COHORT_SYNC_PROBE_ROUNDS)
 * runs only the first rounds: each rank meets that many peers. The pairs' ops run on
 * their own communicator ids (0x40000000 | probe number << 16 | round), one
 * rail each. The results go to the coordinator (PROBE), which feeds its
 * scheduler's cost model and the rail balancer (rx_coord.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reactor/rx_ctx.h"
#include "sched/sc_est.h"

#define PROBE_REPS 15

/* Round k's partner of rank i among np (even) slots (the circle method:
 * slots 0..m-1 on a circle, m = np - 1 odd, pair up as i + j = 2k mod m;
 * the slot left alone, k, meets slot m). A partner >= n is a bye. */
static int partner(int k, int i, int np)
{
    int m = np - 1;
    if (i == m) return k;
    int j = ((2 * k - i) % m + m) % m;
    return j == i ? m : j;
}

typedef struct pair_op {
    struct coh_ctx *ctx;
    uint32_t comm;
    int order[2], pos, rail;
} pair_op_t;

/* One op of the pair on its rail; returns its status and wall time. */
static int pair_run(const pair_op_t *po, uint64_t seq, sc_coll_kind kind, int root, void *buf,
                    uint64_t count, coh_dtype dtype, double *secs)
{
    struct coh_ctx *ctx = po->ctx;
    size_t es = coh_dtype_size(dtype);
    uint64_t sig = bs_fnv64(bs_fnv64(bs_fnv64(BS_FNV_SEED, 0x50524fu), count), (uint64_t)kind);
    sc_slice_t sl = {.rail = po->rail, .lo = 0, .hi = count};
    uint64_t chunk = ctx->cfg.chunk_bytes / es ? ctx->cfg.chunk_bytes / es : 1;
    rx_launch_t L = {.coll = {.kind = kind,
                              .algo = SC_ALGO_AUTO,
                              .nranks = 2,
                              .rank = po->pos,
                              .order = po->order,
                              .root = root,
                              .count = count,
                              .chunk_elems = chunk,
                              .small_elems = ctx->cfg.small_bytes / es},
                     .comm = po->comm,
                     .seq = seq,
                     .sig = sig,
                     .key = seq,
                     .bytes = count * es,
                     .desc = kind == SC_BROADCAST ? "probe(rate)" : "probe(latency)",
                     .dtype = dtype,
                     .redop = COH_SUM,
                     .sendbuf = kind == SC_BROADCAST ? buf : NULL,
                     .recvbuf = buf,
                     .nslices = 1,
                     .slices = &sl};
    coh_request_t *req = rx_request_new(ctx, 0);
    if (!req) return COH_ENOMEM;
    req->what = "probe";
    uint64_t t0 = bs_now_ns();
    int st = rx_launch(ctx, req, &L);
    if (st < 0) {
        rx_request_discard(req);
        return st;
    }
    st = coh_wait(req, ctx->cfg.timeout_ms + 1000);
    *secs = (double)(bs_now_ns() - t0) / 1e9;
    coh_request_free(req);
    return st;
}

COH_API int coh_probe(coh_comm_t *world, coh_link_probe_t *links, int cap, coh_probe_info_t *info)
{
    if (!world || !world->ctx) return bs_fail(COH_EINVAL, "coh_probe: world is NULL");
    struct coh_ctx *ctx = world->ctx;
    if (!rx_ctx_alive(ctx) || atomic_load(&ctx->state) != RX_CTX_RUNNING)
        return bs_fail(COH_ESTATE, "coh_probe: the context is not running");
    if (world != &ctx->world_comm) return bs_fail(COH_EUNSUPPORTED, "coh_probe: the world only");
    if (cap < 0 || (cap > 0 && !links)) return bs_fail(COH_EINVAL, "coh_probe: no room for links");
    return rx_probe(ctx, 0, links, cap, info);
}

int rx_probe(struct coh_ctx *ctx, int rounds, coh_link_probe_t *links, int cap,
             coh_probe_info_t *info)
{
    int n = ctx->world, me = ctx->rank, np = n + (n & 1);
    int nrounds = rounds > 0 && rounds < np - 1 ? rounds : np - 1;
    uint32_t no = ++ctx->probe_no;
    uint64_t bytes = ctx->cfg.probe_bytes;
    uint64_t t0 = bs_now_ns(), sent = 0;
    int nl = 0, nfail = 0, nres = 0;
    rx_ctl_link_t *res = coh_calloc((size_t)(n * ctx->nrails + 1), sizeof(rx_ctl_link_t));
    uint8_t *big = coh_aligned(bytes, 64);
    if (!res || !big) {
        coh_free(res);
        coh_free(big);
        return bs_fail(COH_ENOMEM, "coh_probe: out of memory");
    }
    for (int k = 0; k < nrounds && n > 1; k++) {
        int p = partner(k, me, np);
        if (p >= n || p == me || rx_ctx_is_failed(ctx, p)) {
            nfail += p < n && p != me;
            continue;
        }
        pair_op_t po = {.ctx = ctx,
                        .comm = 0x40000000u | (no & 0x3fffu) << 16 | (uint32_t)k,
                        .order = {me < p ? me : p, me < p ? p : me},
                        .pos = me < p ? 0 : 1};
        for (int r = 0; r < ctx->nrails; r++) {
            po.rail = r;
            double lat[PROBE_REPS], secs = 0, rate[2] = {0, 0};
            int st = 0;
            for (int i = 0; i < PROBE_REPS && st == 0; i++) {
                double x = 1;
                st = pair_run(&po, (uint64_t)r * 64 + (uint64_t)i, SC_ALLREDUCE, 0, &x, 1, COH_F64,
                              &lat[i]);
                sent += 8;
            }
            /* Each way: the lower rank's data first, then the higher's. */
            for (int d = 0; d < 2 && st == 0; d++) {
                st = pair_run(&po, (uint64_t)r * 64 + 40 + (uint64_t)d, SC_BROADCAST, d, big, bytes,
                              COH_U8, &secs);
                rate[d] = secs;
                if (po.pos == d) sent += bytes;
            }
            if (st != 0) {
                bs_log(COH_LOG_WARN, "rank %d: probing rank %d on rail %d: %s", me, p, r,
                       coh_last_error());
                nfail++;
                continue;
            }
            double a = 0, gbps = 0;
            if (sc_fit_alpha_beta(lat, PROBE_REPS, (rate[0] + rate[1]) / 2, bytes, &a, &gbps) !=
                0) {
                nfail++;
                continue;
            }
            res[nres++] = (rx_ctl_link_t){
                .peer = (uint32_t)p, .rail = (uint32_t)r, .latency_s = a, .gbps = gbps};
            if (nl < cap)
                links[nl] =
                    (coh_link_probe_t){.peer = p, .rail = r, .latency_us = a * 1e6, .gbps = gbps};
            nl++;
        }
    }
    coh_free(big);
    atomic_fetch_add(&ctx->n_probes, 1);
    /* kept for coh_ctx_links: every link measured, whatever cap was */
    coh_link_probe_t *keep = coh_malloc(sizeof(*keep) * (size_t)(nres ? nres : 1));
    if (keep) {
        for (int i = 0; i < nres; i++)
            keep[i] = (coh_link_probe_t){.peer = (int)res[i].peer,
                                         .rail = (int)res[i].rail,
                                         .latency_us = res[i].latency_s * 1e6,
                                         .gbps = res[i].gbps};
        uv_mutex_lock(&ctx->links_mu);
        coh_free(ctx->links);
        ctx->links = keep;
        ctx->nlinks = nres;
        uv_mutex_unlock(&ctx->links_mu);
    }
    rx_member_report_probe(ctx, res, nres);
    coh_free(res);
    if (info)
        *info = (coh_probe_info_t){.duration_us = (double)(bs_now_ns() - t0) / 1e3,
                                   .bytes_sent = sent,
                                   .nlinks = nl,
                                   .nfailed = nfail};
    return 0;
}
