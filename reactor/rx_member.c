/*
 * Partial synchronisation, member side: coh_sync, the READY / PLAN / DONE
 * exchange with the coordinator, and the group collective (a weighted ring
 * allreduce over the members, in the order the plan gives).
 *
 * Threading: coh_sync runs on the caller's thread and only posts; everything
 * else runs on this rank's control reactor, except rx_sync_attempt_done and
 * rx_request_slice_stats, which rail threads call and which only post or
 * write their own slot.
 */
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "gpu/gpu.h"
#include "reactor/rx_ctx.h"
#include "reactor/rx_trace.h"
#include "reactor/rx_sync.h"

struct rx_member {
    struct coh_ctx *ctx;
    rx_conn_t *conn; /* loop thread */
    uv_mutex_t mu;   /* conn_state and why, for the initialising thread */
    uv_cond_t cv;
    int conn_state; /* 0 connecting, 1 ready, < 0 failed or lost */
    char why[BS_ERR_LEN];
    coh_request_t *pending; /* loop thread: the sync of this rank, one at a time */
    uint64_t attempt;
    uint64_t last_done_ns;
    _Atomic int busy; /* a sync is outstanding (checked by coh_sync) */
    /* The last sync's scratch, for the next (whoever holds busy): a new one
     * per sync paged the whole model in again every step (the allocator
     * returns blocks that large to the kernel). */
    void *sync_spare;
    size_t sync_spare_cap;
    _Atomic int lost; /* the coordinator is gone: syncs fail at once */
    struct sockaddr_storage coord;
    uv_timer_t beat; /* heartbeats out, the coordinator's silence checked */
    bool beat_open;
    uint64_t t_heard_ns, t_ping_ns;
    /* This rank as a relay (AdapCC): the phase-1 op it runs for the group's
     * ready ranks while its own step still computes, then that op's result,
     * which its own sync takes up in phase 2. */
    coh_request_t *relay_req;
    uint64_t relay_gid;
    void *relay_result;
    int *relay_late; /* the group's relays, as phase 1 named them */
    int relay_nlate;
    int *relay_ring; /* phase 1's ring */
    int relay_nring;
    uint32_t relay_nseg; /* phase 1's segments */
    bool coord_bye;      /* the coordinator said BYE: its close is not a failure */
    /* Coordinator election (COHORT_COORD_ELECTION). */
    _Atomic int coord_rank;  /* the coordinator, or the candidate being dialled */
    bool was_ready;          /* had a coordinator once (init is over) */
    bool electing;           /* between losing one and reaching the next */
    uint64_t t_lost_ns;      /* the coordinator was lost */
    uint64_t t_cand_ns;      /* the current candidate was picked */
    uint32_t coord_epoch;    /* coordinators reached so far */
    uint64_t last_gid;       /* the newest group this rank ran an op of */
    uint64_t committed;      /* the newest relay group whose result it kept */
    bool rejoining;          /* COHORT_REJOIN: looking for the coordinator among the ranks */
    uint64_t lockstep_syncs; /* relay and allreduce mode syncs (COHORT_PROBE_EVERY) */
    bool first_probed;       /* the first partial/selective sync's probe ran (or was skipped) */
    uv_timer_t redial;
    uv_timer_t held; /* COHORT_TEST_FAULT=hold-relay-done: the DONE held back */
    rx_ctl_msg_t held_msg;
    char test_fault[32];   /* COHORT_TEST_FAULT, read once at start */
    _Atomic bool excluded; /* the coordinator took this rank out for good (LOST about itself) */
    /* coh_comm_shrink: one at a time; state under mu (the caller waits). */
    int shrink_state; /* 0 none, 1 asked, 2 answered, < 0 failed */
    rx_ctl_shrink_t shrink_req;
    bool shrink_grow;       /* the request is a GROW */
    uint32_t *shrink_ranks; /* the request's members, then the answer's ranks */
    uint32_t shrink_newcomm;
    int shrink_n;
    char excluded_why[160];
};

static void on_redial(uv_timer_t *t);
static void done_msg(rx_member_t *m, coh_request_t *req, int status, rx_ctl_msg_t *msg);
static void send_held(uv_timer_t *t);
static void resend_pending(rx_member_t *m);
static void send_state(rx_member_t *m);
static void send_shrink(rx_member_t *m);

#define SYNC_RETRIES 3

/* ---- finishing ---- */

/* A sync completed: coh_stats_t's sync counters. */
static void count_sync(struct coh_ctx *ctx, const rx_syncreq_t *s)
{
    if (s->t_plan_ns > s->t_start_ns)
        atomic_fetch_add(&ctx->sync_wait_ns, s->t_plan_ns - s->t_start_ns);
    if (s->t_done_ns > s->t_plan_ns)
        atomic_fetch_add(&ctx->sync_comm_ns, s->t_done_ns - s->t_plan_ns);
    atomic_fetch_add(&ctx->n_syncs, 1);
    atomic_fetch_add(&ctx->sync_members, (uint64_t)(s->nmembers > 0 ? s->nmembers : 1));
    if (s->full) atomic_fetch_add(&ctx->sync_full, 1);
    if (s->relayed) atomic_fetch_add(&ctx->sync_relayed, 1);
    if (ctx->trace) {
        char args[200];
        int k = snprintf(args, sizeof(args),
                         "\"group\":%llu,\"mode\":\"%s\",\"full\":%d,\"relayed\":%d,"
                         "\"weight\":%g,\"members\":[",
                         (unsigned long long)s->group_id, coh_sync_mode_name(s->mode), s->full,
                         s->relayed, s->weight);
        for (int i = 0; i < s->nmembers && s->members && k < (int)sizeof(args) - 12; i++)
            k += snprintf(args + k, sizeof(args) - (size_t)k, "%s%d", i ? "," : "", s->members[i]);
        if (k < (int)sizeof(args) - 2)
            snprintf(args + k, sizeof(args) - (size_t)k, "]");
        else
            snprintf(args + sizeof(args) - 3, 3, "]"); /* a long member list, cut */
        rx_trace_add(ctx->trace, 'X', "sync", "wait for a group", RX_TR_SYNC, s->t_start_ns,
                     s->t_plan_ns > s->t_start_ns ? s->t_plan_ns - s->t_start_ns : 0, 0, args);
        rx_trace_add(ctx->trace, 'X', "sync", "exchange", RX_TR_SYNC, s->t_plan_ns,
                     s->t_done_ns > s->t_plan_ns ? s->t_done_ns - s->t_plan_ns : 0, 0, NULL);
    }
}

/* Loop thread. The sync is over: publish the result and wake the caller. */
static void finish(rx_member_t *m, coh_request_t *req, int status, const char *why)
{
    rx_syncreq_t *s = req->sync;
    /* Once excluded, whatever ends a sync (a closed link, a lost
     * connection) follows from that: say so, as a submission would. */
    if (status == COH_EPEER && m && atomic_load(&m->excluded)) why = m->excluded_why;
    if (status < 0)
        rx_request_set_error(req, status, why);
    else if (s->count)
        memcpy(s->buf, s->scratch, s->count * coh_dtype_size(s->dtype));
    s->t_done_ns = bs_now_ns();
    if (status >= 0) count_sync(req->ctx, s);
    /* Done with the scratch (no op of this sync runs any more): the next
     * sync's, before busy lets it start. */
    if (m && status >= 0 && s->scratch && s->scratch_cap &&
        (!m->sync_spare || m->sync_spare_cap <= s->scratch_cap)) {
        coh_free(m->sync_spare);
        m->sync_spare = s->scratch;
        m->sync_spare_cap = s->scratch_cap;
        s->scratch = NULL;
    }
    if (m) {
        m->pending = NULL;
        m->last_done_ns = s->t_done_ns;
        atomic_store(&m->busy, 0);
    }
    rx_request_complete(req);
}

static int send_ready(rx_member_t *m, coh_request_t *req)
{
    rx_syncreq_t *s = req->sync;
    uint64_t now = bs_now_ns();
    s->attempt = ++m->attempt;
    s->t_ready_ns = now;
    s->coord_epoch = m->coord_epoch;
    rx_ctl_msg_t msg = {.type = RX_CTL_READY, .comm = 0};
    msg.u.ready = (rx_ctl_ready_t){.rank = (uint32_t)m->ctx->rank,
                                   .mode = (uint32_t)s->mode,
                                   .iteration = s->iteration,
                                   .count = s->count,
                                   .dtype = (uint32_t)s->dtype,
                                   .compute_s = (double)(now - m->last_done_ns) / 1e9,
                                   .weight = s->weight,
                                   .attempt = s->attempt,
                                   .redop = (uint32_t)s->redop,
                                   .plain = (uint32_t)s->plain,
                                   .last_gid = m->last_gid,
                                   .join = s->join};
    /* Excluded: no plan will come (the sync fails with why). A sync the
     * application submitted just before the LOST was read gets here after
     * it: its READY went out, nobody answered, and it hung 30 s (the kill
     * trials' hang). */
    if (!m->conn || atomic_load(&m->lost) || atomic_load(&m->excluded)) return COH_EPEER;
    return rx_ctl_send(m->conn, &msg);
}

/* Forget the current attempt's group. The caller's buffer is untouched
 * until a sync succeeds, so a new READY can start the op over. */
static void reset_attempt(rx_syncreq_t *s)
{
    coh_free(s->members);
    s->members = NULL;
    s->nmembers = 0;
    coh_free(s->relays);
    s->relays = NULL;
    s->nrelays = s->relayed = s->phase = s->phase2 = s->phase2_method = s->nexcluded = 0;
    coh_free(s->tmp);
    s->tmp = NULL;
    s->awaiting = false;
    s->join = RX_JOIN_NONE; /* a retry joins nothing */
    s->nseg = s->seg = 0;
}

/* ---- coh_sync's task on the control reactor ---- */

typedef struct ready_task {
    rx_task_t task;
    coh_request_t *req;
} ready_task_t;

static void ready_run(rx_task_t *t, rx_reactor_t *rx)
{
    ready_task_t *rt = (ready_task_t *)t;
    coh_request_t *req = rt->req;
    coh_free(rt);
    rx_member_t *m = ((struct coh_ctx *)rx->owner)->member;
    m->pending = req;
    rx_syncreq_t *s = req->sync;
    s->t_start_ns = bs_now_ns();
    /* This rank relays phase 1 of a group of this op right now: its data
     * joins the segments not launched yet (AdapCC's mid-phase join). The
     * READY says from which one, so phase 2 brings only the ones before. */
    coh_request_t *rr = m->relay_req;
    rx_syncreq_t *rs = rr ? rr->sync : NULL;
    if (rs && rs->running && !rs->joined && s->mode == COH_SYNC_RELAY && rs->count == s->count &&
        rs->dtype == s->dtype && rs->redop == s->redop && rs->plain == s->plain &&
        rs->seg + 1 < rs->nseg && !m->electing) {
        s->join = rs->seg + 1;
        rs->joined = true;
    }
    if (m->electing) return; /* sent once the new coordinator is reached */
    int st = send_ready(m, req);
    if (st < 0) finish(m, req, st, "lost the connection to the coordinator");
}

/* ---- a plan arrives ---- */

static bool member_gone(struct coh_ctx *ctx, int r)
{
    for (int i = 0; i < ctx->nrails; i++)
        if (en_rail_peer_lost(&ctx->rails[i].en, r)) return true;
    return false;
}

/* Fail group gcomm here and tell the other members (they retry on EPEER). */
static void abort_group(struct coh_ctx *ctx, uint32_t gcomm, const int *members, int n, int skip,
                        const char *why)
{
    int others[64], no = 0;
    for (int j = 0; j < n && no < 64; j++)
        if (members[j] != ctx->rank && members[j] != skip) others[no++] = members[j];
    for (int r = 0; r < ctx->nrails; r++)
        rx_rail_abort(&ctx->rails[r], gcomm, 0, COH_EPEER, why, others, no);
}

/* Run one collective of group gid (its op number seq) over `ring`, this
 * rank at position pos, on the rails: the weighted ring allreduce of a
 * group, and a relay group's phases. */
static int group_launch(struct coh_ctx *ctx, coh_request_t *req, uint64_t gid, uint64_t seq,
                        sc_coll_kind kind, const int *ring, int n, int pos, int root,
                        const void *in, void *out, size_t count, double scale, double divide)
{
    rx_syncreq_t *s = req->sync;
    const coh_config_t *cfg = &ctx->cfg;
    size_t es = coh_dtype_size(s->dtype);
    uint64_t chunk = cfg->chunk_bytes / es ? cfg->chunk_bytes / es : 1;
    uint64_t sig = bs_fnv64(bs_fnv64(bs_fnv64(BS_FNV_SEED, 0x5359u), count), (uint64_t)s->dtype);
    sig = bs_fnv64(bs_fnv64(bs_fnv64(sig, gid), seq), (uint64_t)kind * 8 + (uint64_t)s->redop);
    for (int i = 0; i < n; i++) sig = bs_fnv64(sig, (uint64_t)ring[i]);
    char desc[96];
    if (s->phase || s->internal)
        snprintf(desc, sizeof(desc), "relay group %llu phase %d.%llu (%d ranks, count=%zu, %s)",
                 (unsigned long long)gid, seq >= RX_MAX_SEGS ? 2 : 1,
                 (unsigned long long)(seq % RX_MAX_SEGS), n, count, coh_dtype_name(s->dtype));
    else
        snprintf(desc, sizeof(desc), "sync(group %llu of %d, count=%zu, %s)",
                 (unsigned long long)gid, n, count, coh_dtype_name(s->dtype));
    memset(s->nbw, 0, sizeof(s->nbw));
    rx_launch_t L = {.coll = {.kind = kind,
                              .algo = SC_ALGO_AUTO,
                              .nranks = n,
                              .rank = pos,
                              .order = ring,
                              .root = root,
                              .count = count,
                              .chunk_elems = chunk,
                              .small_elems = cfg->small_bytes / es,
                              .scale = scale,
                              .divide = divide},
                     .comm = rx_group_comm(gid),
                     .seq = seq,
                     .sig = sig,
                     .key = gid + seq,
                     .bytes = (uint64_t)count * es,
                     .desc = desc,
                     .dtype = s->dtype,
                     .redop = s->redop,
                     .sendbuf = in,
                     .recvbuf = out};
    s->running = true;
    int st = rx_launch(ctx, req, &L);
    if (st < 0) s->running = false;
    return st;
}

/* Segment k of nseg over count elements starts here (k = nseg: the end). */
static size_t seg_lo(size_t count, uint32_t nseg, uint32_t k)
{
    return nseg ? (size_t)((unsigned __int128)count * k / nseg) : 0;
}

static bool dtype_int(coh_dtype d);
static double relay_scale(const rx_syncreq_t *s);
static double relay_divide(const rx_syncreq_t *s, double total);

/*
 * Launch segment s->seg of a relay group's phase 1 (op number seg). A ready
 * rank sends its data; a relay the op's identity, or, once its own sync has
 * joined (AdapCC: the late rank joins the chunks still to come), that
 * sync's data: those segments then have it, and phase 2 folds in only the
 * ones before.
 */
static int launch_seg(rx_member_t *m, coh_request_t *req)
{
    rx_syncreq_t *s = req->sync;
    int pos = 0;
    while (pos < s->nmembers && s->members[pos] != m->ctx->rank) pos++;
    /* A final phase 1 (nobody late) divides at its end. */
    double divide = !s->internal && s->phase == 0 ? relay_divide(s, s->total_weight) : 0;
    size_t es = coh_dtype_size(s->dtype);
    size_t lo = seg_lo(s->count, s->nseg, s->seg), hi = seg_lo(s->count, s->nseg, s->seg + 1);
    const void *in = s->sendbuf;
    double scale = relay_scale(s);
    if (s->internal) {
        coh_request_t *own = m->pending;
        rx_syncreq_t *os = own ? own->sync : NULL;
        bool data = s->joined && os && os->join != RX_JOIN_NONE && os->join <= s->seg;
        in = data ? os->sendbuf : s->ident;
        scale = data && !os->plain
                    ? (dtype_int(os->dtype) ? os->weight : ldexp(os->weight, -s->exp))
                    : 0;
    }
    return group_launch(m->ctx, req, s->group_id, s->seg, SC_ALLREDUCE, s->members, s->nmembers,
                        pos, 0, (const char *)in + lo * es, (char *)s->scratch + lo * es, hi - lo,
                        scale, divide);
}

static void handle_plan(rx_member_t *m, const rx_ctl_plan_t *p)
{
    struct coh_ctx *ctx = m->ctx;
    coh_request_t *req = m->pending;
    rx_syncreq_t *ps = req ? req->sync : NULL;
    if (ps && p->status < 0 && ps->attempt == p->attempt && !ps->running && !ps->awaiting &&
        (ps->phase == 2 || (ps->mode == COH_SYNC_RELAY && !ps->members && p->status == COH_EPEER &&
                            p->full == RX_CTL_WHY_NONE))) {
        /* Our relay group's phase 1 ended here but failed elsewhere, or the
         * group started over while this (late) rank waited for phase 2: no
         * phase 2 will come. The caller's buffer is untouched: again. */
        bs_log(COH_LOG_INFO, "rank %d: relay group %llu failed after our phase 1; trying again",
               ctx->rank, (unsigned long long)p->group_id);
        resend_pending(m);
        return;
    }
    if (!req || req->sync->attempt != p->attempt || req->sync->members) {
        bs_log(COH_LOG_WARN, "rank %d: ignoring a stale plan for group %llu", ctx->rank,
               (unsigned long long)p->group_id);
        return;
    }
    rx_syncreq_t *s = req->sync;
    if (p->status < 0) {
        char why[BS_ERR_LEN];
        uint32_t d0 = p->nmembers > 0 ? en_get32(p->members) : 0;
        uint32_t d1 = p->nmembers > 1 ? en_get32(p->members + 4) : 0;
        switch (p->full) {
        case RX_CTL_WHY_COUNT:
            snprintf(why, sizeof(why),
                     "the coordinator refused group %llu: its members disagree "
                     "on count or dtype",
                     (unsigned long long)p->group_id);
            break;
        case RX_CTL_WHY_MODE:
            snprintf(why, sizeof(why),
                     "ranks disagree on the sync mode (field 'mode'): this rank asked for %s, "
                     "rank %u for %s",
                     coh_sync_mode_name(s->mode), d0,
                     coh_sync_mode_name(d1 < COH_SYNC_MODE_COUNT ? (coh_sync_mode)d1
                                                                 : COH_SYNC_DEFAULT));
            break;
        case RX_CTL_WHY_WEIGHT:
            snprintf(why, sizeof(why),
                     "the group's integer weights add up to more than 2^24 "
                     "(field 'weight')");
            break;
        case RX_CTL_WHY_OUT:
            snprintf(why, sizeof(why), "the coordinator has this rank out of the schedule: %s",
                     coh_strerror(p->status));
            break;
        default:
            snprintf(why, sizeof(why), "the coordinator formed no group for this rank: %s",
                     p->status == COH_ETIMEDOUT ? "no group within twice COHORT_TIMEOUT_MS"
                                                : coh_strerror(p->status));
        }
        finish(m, req, p->status, why);
        return;
    }
    int n = (int)p->nmembers, pos = -1;
    int *members = coh_malloc(sizeof(int) * (size_t)(n ? n : 1));
    if (!members) {
        finish(m, req, COH_ENOMEM, "out of memory for a plan");
        return;
    }
    bool bad = n < 1;
    for (int i = 0; i < n && !bad; i++) {
        members[i] = (int)en_get32(p->members + 4 * i);
        bad = members[i] < 0 || members[i] >= ctx->world;
        for (int j = 0; j < i && !bad; j++) bad = members[j] == members[i];
        if (members[i] == ctx->rank) pos = i;
    }
    if (bad || pos < 0) {
        coh_free(members);
        finish(m, req, COH_EPROTO, "the coordinator sent a plan that does not name this rank once");
        return;
    }
    uint32_t gcomm = rx_group_comm(p->group_id);
    for (int i = 0; i < n; i++) {
        if (members[i] == ctx->rank || !member_gone(ctx, members[i])) continue;
        /* A rank this one knows is gone: refuse the plan (the coordinator
         * drops that rank and groups us again), and drop whatever the
         * others already sent for this group. */
        bs_log(COH_LOG_WARN, "rank %d: refusing group %llu: rank %d is gone", ctx->rank,
               (unsigned long long)p->group_id, members[i]);
        /* The other members may have started: abort it for them with a
         * status they retry on. */
        char why[BS_ERR_LEN];
        snprintf(why, sizeof(why), "rank %d refused group %llu: rank %d is gone", ctx->rank,
                 (unsigned long long)p->group_id, members[i]);
        abort_group(ctx, gcomm, members, n, members[i], why);
        rx_ctl_msg_t msg = {.type = RX_CTL_REFUSE};
        msg.u.refuse = (rx_ctl_refuse_t){.group_id = p->group_id,
                                         .attempt = p->attempt,
                                         .rank = (uint32_t)ctx->rank,
                                         .gone = (uint32_t)members[i]};
        coh_free(members);
        if (rx_ctl_send(m->conn, &msg) < 0) finish(m, req, COH_EPEER, "lost the coordinator");
        return;
    }
    s->members = members;
    s->nmembers = n;
    s->group_id = p->group_id;
    if (p->group_id > m->last_gid) m->last_gid = p->group_id;
    s->full = (int)p->full;
    s->total_weight = p->total_weight;
    s->t_plan_ns = bs_now_ns();

    /* The group's weighted ring allreduce: this rank's input (the caller's
     * buffer) times its weight, summed over the members, divided by the
     * total weight, into the scratch buffer. Floating-point data is scaled
     * by w / 2^e and divided by W / 2^e, 2^e the power of two just above the
     * total W: powers of two scale exactly, and every factor is at most 1,
     * so no weight in range overflows the data type (1e30 on an f32 would). */
    double scale = s->weight, divide = p->total_weight;
    if (!(s->dtype == COH_I32 || s->dtype == COH_I64 || s->dtype == COH_U8)) {
        int e;
        frexp(p->total_weight, &e);
        scale = ldexp(scale, -e);
        divide = ldexp(divide, -e);
    }
    int st = group_launch(ctx, req, p->group_id, 0, SC_ALLREDUCE, members, n, pos, 0, s->sendbuf,
                          s->scratch, s->count, scale, divide);
    if (st < 0) {
        /* The others wait for our part: tell them and the coordinator, and fail. */
        rx_ctl_msg_t msg = {.type = RX_CTL_DONE};
        msg.u.done =
            (rx_ctl_done_t){.group_id = p->group_id, .rank = (uint32_t)ctx->rank, .status = st};
        rx_ctl_send(m->conn, &msg);
        abort_group(ctx, gcomm, members, n, -1, "a member could not build its plan");
        finish(m, req, st, "cannot build the group's plan");
    }
}

/* ---- relay groups (COH_SYNC_RELAY, coh_allreduce_ex's relay) ---- */

static bool dtype_int(coh_dtype d)
{
    return d == COH_I32 || d == COH_I64 || d == COH_U8;
}

/* What this rank's input is multiplied by before it is sent (0: as it is). */
static double relay_scale(const rx_syncreq_t *s)
{
    if (s->plain) return 0;
    return dtype_int(s->dtype) ? s->weight : ldexp(s->weight, -s->exp);
}

/* What the sum is divided by at the end (0: nothing), from the plan's total:
 * the weights folded in, or for a plain AVG the number of contributors. */
static double relay_divide(const rx_syncreq_t *s, double total)
{
    if (s->plain) return s->redop == COH_AVG ? total : 0;
    return dtype_int(s->dtype) ? total : ldexp(total, -s->exp);
}

/* The ranks of a plan: n little-endian u32, each < world, no repeats. */
static int *plan_ranks(struct coh_ctx *ctx, const uint8_t *p, uint32_t n, int *pos)
{
    int *r = coh_malloc(sizeof(int) * (n ? n : 1));
    if (!r) return NULL;
    if (pos) *pos = -1;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t v = en_get32(p + 4 * i);
        bool bad = v >= (uint32_t)ctx->world;
        for (uint32_t j = 0; j < i && !bad; j++) bad = r[j] == (int)v;
        if (bad) {
            coh_free(r);
            return NULL;
        }
        r[i] = (int)v;
        if (pos && r[i] == ctx->rank) *pos = (int)i;
    }
    return r;
}

static bool has_rank(const int *r, int n, int x)
{
    for (int i = 0; i < n; i++)
        if (r[i] == x) return true;
    return false;
}

static void send_done(rx_member_t *m, coh_request_t *req, int status);

static void relay_forget(rx_member_t *m)
{
    coh_free(m->relay_result);
    coh_free(m->relay_late);
    coh_free(m->relay_ring);
    m->relay_result = NULL;
    m->relay_late = NULL;
    m->relay_ring = NULL;
    m->relay_nlate = m->relay_nring = 0;
    m->relay_gid = 0;
}

/* Phase 1 with this rank as a relay: its reactor runs the group's ring on
 * a buffer of its own, contributing the identity of the op (AdapCC's
 * has-reduce = 0: what passes through is forwarded and reduced with
 * nothing of this rank's), while its application still computes. */
static void relay_start(rx_member_t *m, const rx_ctl_rplan_t *p, int *ring, int pos, int *late)
{
    struct coh_ctx *ctx = m->ctx;
    relay_forget(m);
    size_t es = coh_dtype_size((coh_dtype)p->dtype);
    coh_request_t *req = rx_request_new(ctx, 0);
    rx_syncreq_t *s = coh_zalloc(sizeof(*s));
    void *scratch = coh_aligned(p->count ? p->count * es : 1, 64);
    void *ident = coh_aligned(p->count ? p->count * es : 1, 64);
    if (!req || !s || !scratch || !ident) {
        if (req) rx_request_discard(req);
        coh_free(s);
        coh_free(scratch);
        coh_free(ident);
        coh_free(ring);
        coh_free(late);
        rx_ctl_msg_t msg = {.type = RX_CTL_DONE};
        msg.u.done = (rx_ctl_done_t){
            .group_id = p->group_id, .rank = (uint32_t)ctx->rank, .status = COH_ENOMEM};
        if (m->conn) rx_ctl_send(m->conn, &msg);
        return;
    }
    gpu_cpu_fill_identity((coh_dtype)p->dtype, (coh_redop)p->redop, ident, p->count);
    *s = (rx_syncreq_t){.scratch = scratch,
                        .ident = ident,
                        .sendbuf = ident,
                        .count = p->count,
                        .dtype = (coh_dtype)p->dtype,
                        .redop = (coh_redop)p->redop,
                        .plain = (int)p->plain,
                        .internal = 1,
                        .phase = 1,
                        .relayed = 1,
                        .exp = p->exp,
                        .group_id = p->group_id,
                        .members = ring,
                        .nmembers = (int)p->nring,
                        .relays = late,
                        .nrelays = (int)p->nlate,
                        .nseg = p->nseg,
                        .join = RX_JOIN_NONE,
                        .mode = COH_SYNC_RELAY};
    (void)pos;
    s->t_plan_ns = bs_now_ns();
    req->sync = s;
    m->relay_req = req;
    m->relay_gid = p->group_id;
    int st = launch_seg(m, req);
    if (st < 0) {
        m->relay_req = NULL;
        send_done(m, req, st);
        rx_request_discard(req);
    }
}

/* COHORT_TEST_FAULT (tests only): die-after-joined-relay dies between a
 * relay group's phases once this rank's data is partly in phase 1's result;
 * die-after-phase1 dies once its phase-1 DONE as a ready member is out, while
 * the group still waits for others' (hold-relay-done: a relay that reports
 * its phase 1 300 ms late). The DONE just queued goes out first. */
static bool test_fault_is(const rx_member_t *m, const char *what)
{
    return m->test_fault[0] && strcmp(m->test_fault, what) == 0;
}

static void *die_soon(void *arg)
{
    (void)arg;
    usleep(20000);
    raise(SIGKILL);
    return NULL;
}

static void test_fault_die(const rx_member_t *m, const char *when)
{
    if (!test_fault_is(m, when)) return;
    pthread_t t;
    if (pthread_create(&t, NULL, die_soon, NULL) == 0) pthread_detach(t);
}

/* The relay's phase-1 op ended: report it, keep its result for phase 2. */
static void relay_end(rx_member_t *m, coh_request_t *req)
{
    rx_syncreq_t *s = req->sync;
    int status = atomic_load(&req->status);
    s->running = false;
    if (test_fault_is(m, "hold-relay-done") && !uv_is_active((uv_handle_t *)&m->held)) {
        done_msg(m, req, status, &m->held_msg); /* the loop goes on meanwhile */
        uv_timer_start(&m->held, send_held, 300, 0);
    } else {
        send_done(m, req, status);
    }
    if (status == 0 && s->joined) test_fault_die(m, "die-after-joined-relay");
    if (m->relay_req == req) m->relay_req = NULL;
    if (status == 0 && m->relay_gid == s->group_id) {
        relay_forget(m);
        m->relay_gid = s->group_id;
        m->relay_result = s->scratch;
        m->relay_late = s->relays;
        m->relay_nlate = s->nrelays;
        m->relay_ring = s->members;
        m->relay_nring = s->nmembers;
        m->relay_nseg = s->nseg;
        s->scratch = NULL;
        s->relays = NULL;
        s->members = NULL;
    } else if (m->relay_gid == s->group_id) {
        relay_forget(m);
    }
    bs_log(COH_LOG_DEBUG, "rank %d: relayed phase 1 of group %llu: %s", m->ctx->rank,
           (unsigned long long)s->group_id, status ? req->err : "ok");
    rx_request_discard(req);
}

/* Phase 2 ended (or there was none): fold what the late ranks brought into
 * the phase-1 result, divide, done. Every rank does the same arithmetic on
 * the same bytes, so every rank has the same result. */
static void relay_complete(rx_member_t *m, coh_request_t *req, int status)
{
    rx_syncreq_t *s = req->sync;
    if (status == 0 && s->count) {
        if (s->phase2_method != RX_RELAY_NONE && s->tmp)
            gpu_cpu_reduce(s->dtype, s->redop, s->scratch, s->scratch, s->tmp, s->prefix);
        double div = relay_divide(s, s->total_weight);
        if (div != 0 && gpu_cpu_div(s->dtype, s->scratch, s->count, div) < 0) status = COH_EINVAL;
    }
    if (status < 0 && !req->err_set) rx_request_set_error(req, status, "cannot divide the result");
    finish(m, req, status, req->err);
}

/*
 * The relay group's op ended well here, but the result is kept only once
 * every member has it (COMMIT). Otherwise a rank that died in phase 2 could
 * leave some members with its data and others retrying without it: they
 * would compute different results, or the ones that moved on would meet
 * the retry in one group as their next op.
 */
static void await_commit(rx_member_t *m, coh_request_t *req)
{
    rx_syncreq_t *s = req->sync;
    s->awaiting = true;
    if (m->electing) return; /* STATE asks the new coordinator once reached */
    if (s->coord_epoch != m->coord_epoch) {
        send_state(m); /* an elected coordinator: it learns of the group now */
        return;
    }
    if (!m->conn) finish(m, req, COH_EPEER, "lost the coordinator before the relay group's commit");
}

static void handle_commit(rx_member_t *m, const rx_ctl_commit_t *c)
{
    coh_request_t *req = m->pending;
    rx_syncreq_t *s = req ? req->sync : NULL;
    bs_log(COH_LOG_DEBUG, "rank %d: COMMIT %d of group %llu (pending: %s, group %llu)",
           m->ctx->rank, c->status, (unsigned long long)c->group_id,
           s ? (s->awaiting ? "awaiting" : "running") : "none",
           s ? (unsigned long long)s->group_id : 0ull);
    if (!s || !s->awaiting || s->group_id != c->group_id) {
        bs_log(COH_LOG_WARN, "rank %d: ignoring a stale commit of group %llu", m->ctx->rank,
               (unsigned long long)c->group_id);
        return;
    }
    s->awaiting = false;
    if (c->status == 0) {
        m->committed = c->group_id;
        if (s->phase == 2)
            relay_complete(m, req, 0);
        else
            finish(m, req, 0, NULL);
        return;
    }
    bs_log(COH_LOG_INFO,
           "rank %d: relay group %llu failed before every member had its result; "
           "trying again",
           m->ctx->rank, (unsigned long long)c->group_id);
    reset_attempt(s);
    atomic_fetch_add(&m->ctx->sync_retries, 1);
    if (s->retries_left-- <= 0) {
        finish(m, req, c->status,
               "a relay group failed before every member had its result, "
               "too many times");
        return;
    }
    int st = send_ready(m, req);
    if (st < 0) finish(m, req, st, "lost the connection to the coordinator");
}

static void handle_rplan(rx_member_t *m, const rx_ctl_rplan_t *p)
{
    struct coh_ctx *ctx = m->ctx;
    bs_log(COH_LOG_DEBUG, "rank %d: relay plan of group %llu, phase %u, ring of %u, %u late",
           ctx->rank, (unsigned long long)p->group_id, p->phase, p->nring, p->nlate);
    int pos = -1;
    int *ring = plan_ranks(ctx, p->ring, p->nring, &pos);
    int *late = ring ? plan_ranks(ctx, p->late, p->nlate, NULL) : NULL;
    bool late_ok = late != NULL;
    for (uint32_t i = 0; late_ok && i < p->nlate; i++)
        late_ok = has_rank(ring, (int)p->nring, late[i]);
    if (!ring || !late_ok || pos < 0) {
        coh_free(ring);
        coh_free(late);
        if (m->conn)
            rx_conn_close(m->conn, COH_EPROTO,
                          "the coordinator sent a relay plan that does not name this rank once");
        return;
    }
    bool am_late = has_rank(late, (int)p->nlate, ctx->rank);
    if (p->group_id > m->last_gid) m->last_gid = p->group_id;
    if (p->phase == 1 && p->attempt == 0) {
        if (!am_late) {
            coh_free(ring);
            coh_free(late);
            rx_conn_close(m->conn, COH_EPROTO, "a relay plan for a rank that is not late");
            return;
        }
        relay_start(m, p, ring, pos, late);
        return;
    }
    coh_request_t *req = m->pending;
    rx_syncreq_t *s = req ? req->sync : NULL;
    bool want = s && s->attempt == p->attempt && !s->running && !s->awaiting &&
                (p->phase == 1 ? !s->members : s->phase == 2 || (!s->members && am_late));
    if (!want || s->count != p->count || (uint32_t)s->dtype != p->dtype ||
        (uint32_t)s->redop != p->redop || (uint32_t)s->plain != p->plain) {
        bs_log(COH_LOG_WARN, "rank %d: ignoring a stale relay plan for group %llu (phase %u)",
               ctx->rank, (unsigned long long)p->group_id, p->phase);
        coh_free(ring);
        coh_free(late);
        return;
    }
    if (p->phase == 1) {
        if (p->nlate == 0 && p->final != 1) {
            coh_free(ring);
            coh_free(late);
            rx_conn_close(m->conn, COH_EPROTO, "a relay plan without relays that is not final");
            return;
        }
        relay_forget(m);
        s->members = ring;
        s->nmembers = (int)p->nring;
        s->relays = late;
        s->nrelays = (int)p->nlate;
        s->group_id = p->group_id;
        s->full = 1;
        s->exp = p->exp;
        s->total_weight = p->total_weight;
        s->phase = p->final ? 0 : 1;
        s->nseg = p->nseg;
        s->seg = 0;
        s->join = RX_JOIN_NONE; /* ready: its data is in every segment */
        s->t_plan_ns = bs_now_ns();
        int st = launch_seg(m, req);
        if (st < 0) {
            send_done(m, req, st);
            finish(m, req, st, "cannot build the relay group's plan");
        }
        return;
    }
    /* Phase 2. */
    if (!s->members) {
        /* This rank relayed phase 1: its sync takes that op's result up. */
        if (!m->relay_result || m->relay_gid != p->group_id) {
            coh_free(ring);
            coh_free(late);
            finish(m, req, COH_EPROTO, "phase 2 of a relay group whose phase 1 this rank lacks");
            return;
        }
        coh_free(s->scratch);
        s->scratch = m->relay_result;
        s->scratch_cap = 0;
        s->relays = m->relay_late;
        s->nrelays = m->relay_nlate;
        s->members = m->relay_ring;
        s->nmembers = m->relay_nring;
        s->nseg = m->relay_nseg;
        m->relay_result = NULL;
        m->relay_late = NULL;
        m->relay_ring = NULL;
        relay_forget(m);
        s->relayed = 1;
        s->group_id = p->group_id;
        s->exp = p->exp;
        s->t_plan_ns = bs_now_ns();
    }
    /* The group's members are whose data is in the result: phase 1's ring
     * but its relays, and the relays phase 2 folds in. */
    int nm = 0;
    for (int i = 0; i < s->nmembers; i++) {
        int r = s->members[i];
        if (!has_rank(s->relays, s->nrelays, r) || has_rank(late, (int)p->nlate, r))
            s->members[nm++] = r;
    }
    s->nmembers = nm;
    s->phase = 2;
    s->phase2 = (int)p->nlate;
    s->phase2_method = (int)p->method;
    s->total_weight = p->total_weight;
    if (s->nrelays > (int)p->nlate) s->nexcluded = s->nrelays - (int)p->nlate;
    s->full = s->nexcluded == 0;
    size_t es = coh_dtype_size(s->dtype);
    int st = 0;
    s->prefix = p->prefix;
    if (p->method == RX_RELAY_NONE || !s->count || !p->prefix) {
        coh_free(ring);
        coh_free(late);
        send_done(m, req, 0);
        await_commit(m, req);
        return;
    }
    /* What this rank brings, over the elements phase 2 covers: a late rank
     * its (weighted) data of the segments before the one it joined at, the
     * identity beyond; the others the identity. */
    size_t mine =
        am_late ? (s->join == RX_JOIN_NONE ? s->count : seg_lo(s->count, s->nseg, s->join)) : 0;
    if (mine > s->prefix) mine = s->prefix;
    s->tmp = coh_aligned(s->prefix * es, 64);
    if (!s->tmp) st = COH_ENOMEM;
    int root = -1;
    for (uint32_t i = 0; i < p->nring; i++)
        if (ring[i] == late[0]) root = (int)i;
    bool bcast = p->method == RX_RELAY_BCAST;
    if (st == 0 && (!bcast || root == pos)) {
        gpu_cpu_fill_identity(s->dtype, s->redop, s->tmp, s->prefix);
        memcpy(s->tmp, s->sendbuf, mine * es);
        double f = relay_scale(s);
        if (f != 0) gpu_cpu_scale(s->dtype, s->tmp, mine, f);
    }
    if (st == 0)
        st = group_launch(ctx, req, p->group_id, RX_MAX_SEGS, bcast ? SC_BROADCAST : SC_ALLREDUCE,
                          ring, (int)p->nring, pos, bcast ? root : 0, s->tmp, s->tmp, s->prefix, 0,
                          0);
    coh_free(ring); /* the plans hold their peers */
    coh_free(late);
    if (st < 0) {
        send_done(m, req, st);
        finish(m, req, st, "cannot build phase 2 of the relay group");
    }
}

/* ---- an attempt ended ---- */

typedef struct done_task {
    rx_task_t task;
    coh_request_t *req;
} done_task_t;

/* Tell the coordinator how the op went, and what the links looked like:
 * bytes from each peer over the time they took, summed over the rails (they
 * run side by side, so the longest time counts). */
static void done_msg(rx_member_t *m, coh_request_t *req, int status, rx_ctl_msg_t *msg)
{
    rx_syncreq_t *s = req->sync;
    *msg = (rx_ctl_msg_t){.type = RX_CTL_DONE};
    rx_ctl_done_t *d = &msg->u.done;
    bs_log(COH_LOG_DEBUG, "rank %d: group %llu (phase %d) done: %d", m->ctx->rank,
           (unsigned long long)s->group_id, s->phase, status);
    d->group_id = s->group_id;
    d->rank = (uint32_t)m->ctx->rank;
    d->status = status;
    d->duration_s = (double)(bs_now_ns() - s->t_plan_ns) / 1e9;
    for (int sl = 0; status == 0 && sl < req->nslices && sl < RX_MAX_RAILS; sl++)
        for (int k = 0; k < s->nbw[sl]; k++) {
            const en_bw_t *b = &s->bw[sl][k];
            uint32_t j = 0;
            while (j < d->nbw && d->bw[j].peer != (uint32_t)b->peer) j++;
            if (j == RX_CTL_MAXBW) continue;
            if (j == d->nbw) d->bw[d->nbw++] = (rx_ctl_bw_t){.peer = (uint32_t)b->peer};
            d->bw[j].bytes += b->bytes;
            if ((double)b->ns / 1e9 > d->bw[j].seconds) d->bw[j].seconds = (double)b->ns / 1e9;
        }
}

static void send_done(rx_member_t *m, coh_request_t *req, int status)
{
    rx_ctl_msg_t msg;
    done_msg(m, req, status, &msg);
    if (m->conn) rx_ctl_send(m->conn, &msg);
}

static void send_held(uv_timer_t *t)
{
    rx_member_t *m = t->data;
    if (m->conn) rx_ctl_send(m->conn, &m->held_msg);
}

static void attempt_end(rx_task_t *t, rx_reactor_t *rx)
{
    done_task_t *dt = (done_task_t *)t;
    coh_request_t *req = dt->req;
    coh_free(dt);
    rx_member_t *m = ((struct coh_ctx *)rx->owner)->member;
    rx_syncreq_t *s = req->sync;
    s->running = false;
    if (atomic_load(&req->status) == 0 && (s->internal || s->phase == 1) && s->seg + 1 < s->nseg) {
        /* The next segment of phase 1 (a relay's: with its own data, should
         * its sync have joined meanwhile). */
        s->seg++;
        int st = launch_seg(m, req);
        if (st == 0) return;
        rx_request_set_error(req, st, "cannot launch the next segment of phase 1");
    }
    if (s->internal) {
        relay_end(m, req);
        return;
    }
    int status = atomic_load(&req->status);
    bool sent = m->conn != NULL || m->electing;
    send_done(m, req, status);
    if (status == 0 && s->phase == 1) {
        /* Phase 1 of a relay group: the coordinator sends phase 2 once the
         * late ranks are ready or excluded. */
        s->phase = 2;
        test_fault_die(m, "die-after-phase1");
        if (m->electing) return; /* resent to the new coordinator once reached */
        if (s->coord_epoch != m->coord_epoch) {
            resend_pending(m); /* the coordinator that planned it is gone */
            return;
        }
        if (!m->conn) finish(m, req, COH_EPEER, "lost the coordinator between the relay phases");
        return;
    }
    if (status == 0 && s->mode == COH_SYNC_RELAY) {
        await_commit(m, req); /* the last phase (2, or a final phase 1) */
        return;
    }
    if (status == COH_EPEER && s->retries_left > 0 && sent) {
        /* A member died under us: the caller's buffer is untouched, so go
         * back to the coordinator and sync with the survivors. */
        bs_log(COH_LOG_INFO, "rank %d: group %llu lost a member (%s); trying again", m->ctx->rank,
               (unsigned long long)s->group_id, req->err);
        s->retries_left--;
        reset_attempt(s);
        atomic_fetch_add(&m->ctx->sync_retries, 1);
        req->err[0] = 0;
        atomic_store(&req->status, 0);
        atomic_store(&req->err_set, 0);
        if (m->electing) return; /* sent to the coordinator being elected, once reached */
        int st = send_ready(m, req);
        if (st < 0) finish(m, req, st, "lost the connection to the coordinator");
        return;
    }
    finish(m, req, status, req->err);
}

void rx_sync_attempt_done(coh_request_t *req)
{
    done_task_t *dt = coh_zalloc(sizeof(*dt));
    if (!dt) {
        /* Cannot reach the control reactor: complete here, without DONE. */
        rx_request_set_error(req, COH_ENOMEM, "out of memory ending a sync");
        rx_request_complete(req);
        return;
    }
    dt->task.run = attempt_end;
    dt->req = req;
    if (rx_reactor_post(&req->ctx->ctrl, &dt->task)) return;
    /* The control reactor is stopping: nobody will try again. */
    coh_free(dt);
    rx_request_set_error(req, COH_ECANCELED, "the context was finalized");
    rx_request_complete(req);
}

/* ---- the connection to the coordinator ---- */

static void set_state(rx_member_t *m, int st, const char *why)
{
    uv_mutex_lock(&m->mu);
    m->conn_state = st;
    snprintf(m->why, sizeof(m->why), "%s", why ? why : "");
    uv_cond_broadcast(&m->cv);
    uv_mutex_unlock(&m->mu);
}

/* Every rail drops `peer` (unresponsive): what waits on it ends with EPEER
 * now, and later ops fail at once instead of each running into a timeout. */
static void drop_peer(struct coh_ctx *ctx, int peer, const char *why)
{
    if (peer < 0 || peer >= ctx->world || peer == ctx->rank) return;
    for (int r = 0; r < ctx->nrails; r++) rx_rail_drop_peer(&ctx->rails[r], peer, COH_EPEER, why);
}

static int on_bytes(rx_conn_t *c, const uint8_t *buf, size_t len)
{
    rx_member_t *m = c->owner;
    rx_ctl_msg_t msg;
    int n = rx_ctl_parse(buf, len, &msg);
    if (n <= 0) return n;
    m->t_heard_ns = bs_now_ns();
    if (msg.type != RX_CTL_BYE) m->t_cand_ns = 0; /* it coordinates */
    switch (msg.type) {
    case RX_CTL_PLAN: handle_plan(m, &msg.u.plan); break;
    case RX_CTL_RPLAN: handle_rplan(m, &msg.u.rplan); break;
    case RX_CTL_COMMIT: handle_commit(m, &msg.u.commit); break;
    case RX_CTL_PING: break;
    case RX_CTL_LBTAB:
        if (rx_lb_on_table(m->ctx, &msg.u.lbtab) < 0)
            rx_conn_close(c, COH_EPROTO, "a malformed rail table from the coordinator");
        break;
    case RX_CTL_LOST: {
        char why[BS_ERR_LEN];
        if (msg.u.lost.rank == (uint32_t)m->ctx->rank) {
            /* The coordinator excluded this rank: no election, every sync
             * from now on fails. */
            snprintf(m->excluded_why, sizeof(m->excluded_why),
                     "the coordinator excluded this rank (%s)",
                     rx_lost_why_text((int)msg.u.lost.why));
            m->excluded = true;
            coh_request_t *req = m->pending;
            const rx_syncreq_t *ps = req ? req->sync : NULL;
            bs_log(COH_LOG_WARN,
                   "rank %d: %s; its sync: %s (group %llu, phase %d, running %d, awaiting %d, "
                   "a relay op of its own %d)",
                   m->ctx->rank, m->excluded_why, ps ? "pending" : "none",
                   ps ? (unsigned long long)ps->group_id : 0ull, ps ? ps->phase : 0,
                   ps ? ps->running : 0, ps ? ps->awaiting : 0, m->relay_req != NULL);
            /* No plan, phase 2 or commit will come for a sync that waits
             * for one: it fails now. Its relay ops that run end now too
             * (the relay trials saw one still running 30 s after the
             * exclusion, cause not found), and so do every op of this
             * rank's communicators and every later one. */
            char text[BS_ERR_LEN];
            snprintf(text, sizeof(text), "rank %d: %s", m->ctx->rank, m->excluded_why);
            rx_ctx_self_excluded(m->ctx, text);
            coh_request_t *rr = m->relay_req;
            for (int k = 0; k < m->ctx->nrails; k++) {
                if (rr && rr->sync)
                    rx_rail_revoke(&m->ctx->rails[k], rx_group_comm(rr->sync->group_id), COH_EPEER,
                                   text);
                if (ps && ps->running)
                    rx_rail_revoke(&m->ctx->rails[k], rx_group_comm(ps->group_id), COH_EPEER, text);
            }
            if (ps && !ps->running) finish(m, req, COH_EPEER, m->excluded_why);
            break;
        }
        if (msg.u.lost.why == RX_LOST_SILENT)
            snprintf(why, sizeof(why),
                     "rank %u is unresponsive (the coordinator heard nothing from it "
                     "for %u ms)",
                     msg.u.lost.rank, msg.u.lost.silent_ms);
        else
            snprintf(why, sizeof(why), "rank %u failed: %s", msg.u.lost.rank,
                     rx_lost_why_text((int)msg.u.lost.why));
        bs_log(COH_LOG_WARN, "rank %d: %s", m->ctx->rank, why);
        drop_peer(m->ctx, (int)msg.u.lost.rank, why);
        rx_ctx_rank_failed(m->ctx, (int)msg.u.lost.rank, why);
        break;
    }
    case RX_CTL_BYE: m->coord_bye = true; break;
    case RX_CTL_SHRUNK: {
        const rx_ctl_shrink_t *k = &msg.u.shrink;
        uv_mutex_lock(&m->mu);
        /* A rank that rejoined asked to grow with no communicator: the one
         * answer it gets is its. */
        if (m->shrink_state == 1 && (k->comm == m->shrink_req.comm || m->shrink_req.n == 0)) {
            uint32_t *r = k->status == 0 ? coh_malloc(sizeof(uint32_t) * (k->n ? k->n : 1)) : NULL;
            for (uint32_t i = 0; r && i < k->n; i++) r[i] = en_get32(k->ranks + 4 * i);
            coh_free(m->shrink_ranks);
            m->shrink_ranks = r;
            m->shrink_n = (int)k->n;
            m->shrink_newcomm = k->newcomm;
            m->shrink_state = k->status < 0 ? k->status : r ? 2 : COH_ENOMEM;
            uv_cond_broadcast(&m->cv);
        }
        uv_mutex_unlock(&m->mu);
        break;
    }
    default: rx_conn_close(c, COH_EPROTO, "unexpected message from the coordinator");
    }
    return n;
}

/* Threading: control loop. Heartbeats to the coordinator, and its silence
 * checked: a coordinator that stopped (SIGSTOP keeps its sockets open) is
 * gone for this rank like one whose connection closed. */
static void on_beat(uv_timer_t *t)
{
    rx_member_t *m = t->data;
    rx_lb_check_timeouts(m->ctx);
    if (!m->conn) return;
    uint64_t now = bs_now_ns(), live = (uint64_t)m->ctx->cfg.liveness_ms * 1000000ull;
    if (now - m->t_ping_ns >= live / 5) {
        m->t_ping_ns = now;
        rx_ctl_msg_t ping = {.type = RX_CTL_PING};
        ping.u.ping_rank = (uint32_t)m->ctx->rank;
        rx_ctl_send(m->conn, &ping);
        rx_coord_beat(m->ctx->coord, &m->coord, RX_BEAT_TO_COORD);
    }
    if (now - m->t_heard_ns <= live) return;
    /* Its words may wait unread: this process stalled (a stopped rank woke
     * here before its loop read the LOST that excluded it, took the live
     * coordinator for failed and elected a partition of its own). */
    if (rx_conn_input_pending(m->conn)) return;
    char why[BS_ERR_LEN];
    snprintf(why, sizeof(why),
             "the coordinator (rank %d) is unresponsive: nothing heard for %llu ms", m->coord_rank,
             (unsigned long long)((now - m->t_heard_ns) / 1000000ull));
    drop_peer(m->ctx, m->coord_rank, why);
    rx_conn_close(m->conn, COH_EPEER, why);
}

void rx_member_heard(struct coh_ctx *ctx, int from, uint64_t now_ns)
{
    rx_member_t *m = ctx->member;
    if (m && m->conn && from == m->coord_rank) m->t_heard_ns = now_ns;
}

static const rx_conn_proto_t member_proto;

/* Dial the coordinator candidate m->coord_rank through rail 0's interface. */
static int dial(rx_member_t *m)
{
    struct coh_ctx *ctx = m->ctx;
    struct sockaddr_storage local = ctx->rail_addr[0];
    m->coord = ctx->ctrl_addrs[m->coord_rank];
    int st = rx_conn_dial(&ctx->ctrl.loop, (struct sockaddr *)&local, (struct sockaddr *)&m->coord,
                          &member_proto, m, ctx->token_s, ctx->rank, ctx->world, &m->conn);
    if (st == 0 && ctx->cfg.rejoin) m->conn->hello_flags = EN_HELLO_REJOIN; /* before it goes */
    return st;
}

/* A restarted rank does not know which rank coordinates now: it asks each
 * in turn (the others' dormant coordinators refuse it), round and round
 * until init's deadline. */
static void rejoin_next(rx_member_t *m)
{
    struct coh_ctx *ctx = m->ctx;
    int next = m->coord_rank;
    do next = (next + 1) % ctx->world;
    while (next == ctx->rank);
    bool wrapped = next <= m->coord_rank;
    m->coord_rank = next;
    if (wrapped || dial(m) < 0) uv_timer_start(&m->redial, on_redial, 50, 0);
}

/*
 * The coordinator failed: the survivors elect the lowest rank none of them
 * knows failed (each decides alone, from the failures it heard of; ranks
 * that picked a rank that is gone find its control port closed and go on to
 * the next). That rank's dormant coordinator takes over, cold; every member
 * connects to it and sends again what it was waiting for.
 */
static void elect(rx_member_t *m)
{
    struct coh_ctx *ctx = m->ctx;
    int cand = ctx->rank;
    for (int r = 0; r < ctx->world; r++)
        if (rx_ctx_electable(ctx, r)) {
            cand = r;
            break;
        }
    if (cand != m->coord_rank || !m->electing)
        bs_log(COH_LOG_WARN, "rank %d: electing rank %d as the coordinator", ctx->rank, cand);
    int old = m->coord_rank;
    m->coord_rank = cand;
    m->electing = true;
    m->coord_bye = false;
    if (cand != old) m->t_cand_ns = bs_now_ns();
    if (cand == ctx->rank) rx_coord_activate(ctx->coord, old);
    if (dial(m) < 0) uv_timer_start(&m->redial, on_redial, 50, 0);
}

static void on_redial(uv_timer_t *t)
{
    rx_member_t *m = t->data;
    if (m->rejoining && !m->was_ready) {
        if (!m->conn && dial(m) < 0) rejoin_next(m);
        return;
    }
    if (!m->conn && m->electing && atomic_load(&m->ctx->state) == RX_CTX_RUNNING) elect(m);
}

bool rx_member_has_coordinator(struct coh_ctx *ctx)
{
    rx_member_t *m = ctx->member;
    return m && m->conn && m->conn->ready && !m->electing;
}

/* To an elected coordinator: the last relay group this rank kept, and the
 * one whose COMMIT it waits for. */
static void send_state(rx_member_t *m)
{
    coh_request_t *req = m->pending;
    rx_ctl_msg_t msg = {.type = RX_CTL_STATE};
    msg.u.state =
        (rx_ctl_state_t){.rank = (uint32_t)m->ctx->rank,
                         .committed = m->committed,
                         .awaiting = req && req->sync->awaiting ? req->sync->group_id : 0};
    if (m->conn) rx_ctl_send(m->conn, &msg);
}

/* A sync waiting for the coordinator (its READY or phase 2 went to a
 * coordinator that failed): ask the new one. The caller's buffer is
 * untouched until a sync succeeds, so starting over is safe. */
static void resend_pending(rx_member_t *m)
{
    coh_request_t *req = m->pending;
    if (!req || req->sync->running) return;
    rx_syncreq_t *s = req->sync;
    if (s->awaiting) return; /* STATE asks for its COMMIT */
    if (s->members && s->phase != 2) return;
    reset_attempt(s);
    int st = send_ready(m, req);
    if (st < 0) finish(m, req, st, "cannot reach the new coordinator");
}

static void on_ready(rx_conn_t *c)
{
    rx_member_t *m = c->owner;
    if (c->peer != m->coord_rank) {
        rx_conn_close(c, COH_EPROTO, "the coordinator's address answered as another rank");
        return;
    }
    m->t_heard_ns = bs_now_ns();
    int live = m->ctx->cfg.liveness_ms;
    if (live > 0) {
        uint64_t period = (uint64_t)(live / 10 > 0 ? live / 10 : 1);
        uv_timer_start(&m->beat, on_beat, period, period);
    }
    m->was_ready = true;
    if (m->electing) {
        m->electing = false;
        bs_log(COH_LOG_WARN, "rank %d: rank %d is the coordinator now (%.1f ms after the loss)",
               m->ctx->rank, m->coord_rank, (double)(bs_now_ns() - m->t_lost_ns) / 1e6);
        atomic_store(&m->lost, 0);
        m->coord_epoch++;
        send_state(m);
        resend_pending(m);
        send_shrink(m);
    }
    set_state(m, 1, NULL);
}

static void on_close(rx_conn_t *c, int status, const char *why)
{
    rx_member_t *m = c->owner;
    struct coh_ctx *ctx = m->ctx;
    m->conn = NULL;
    if (m->rejoining && !m->was_ready) {
        bs_log(COH_LOG_DEBUG, "rank %d (rejoining): rank %d does not coordinate: %s", ctx->rank,
               m->coord_rank, why);
        rejoin_next(m);
        return;
    }
    uv_timer_stop(&m->beat);
    char msg[BS_ERR_LEN];
    snprintf(msg, sizeof(msg), "connection to the coordinator (rank %d): %s", m->coord_rank, why);
    bool running = atomic_load(&ctx->state) == RX_CTX_RUNNING && status != COH_ECANCELED;
    if (m->excluded) snprintf(msg, sizeof(msg), "%s", m->excluded_why);
    if (running && (m->was_ready || m->electing) && ctx->cfg.coord_election && !m->excluded) {
        uint64_t now = bs_now_ns(), live = (uint64_t)ctx->cfg.liveness_ms * 1000000ull;
        if (!m->electing) {
            m->t_lost_ns = now;
            bs_log(COH_LOG_WARN, "rank %d: lost the %s", ctx->rank, msg);
        }
        if (m->coord_bye || (!c->ready && c->connected)) {
            /* Alive, but not (or no longer) coordinating: finalizing, or a
             * candidate that has not noticed the loss itself yet and said
             * so. Ask again shortly; after the liveness time it counts as
             * failed. */
            if (!m->t_cand_ns) m->t_cand_ns = now;
            m->electing = true;
            if (live && now - m->t_cand_ns > live) {
                rx_ctx_rank_failed(ctx, m->coord_rank, "did not take over as the coordinator");
                elect(m);
            } else {
                uv_timer_start(&m->redial, on_redial, 20, 0);
            }
        } else {
            /* It coordinated and the connection died, or nobody listens
             * where the candidate should: failed. */
            rx_ctx_rank_failed(ctx, m->coord_rank, msg);
            drop_peer(ctx, m->coord_rank, msg);
            elect(m);
        }
        rx_lb_close(ctx, COH_EPEER, msg); /* the balancer's tables came from the old one */
        return;
    }
    atomic_store(&m->lost, 1);
    set_state(m, status < 0 ? status : COH_EPEER, msg);
    if (running && !m->excluded) {
        bs_log(COH_LOG_WARN, "rank %d: lost the %s", ctx->rank, msg);
        if (!m->coord_bye) rx_ctx_rank_failed(ctx, m->coord_rank, msg);
    }
    /* World ops waiting for a rail table will never get one. */
    rx_lb_close(ctx, COH_EPEER, msg);
    /* A sync still waiting for its plan will never get one. One whose ops
     * run ends when they do. */
    coh_request_t *req = m->pending;
    if (req && (!req->sync->members || req->sync->awaiting ||
                (req->sync->phase == 2 && !req->sync->running)))
        finish(m, req, COH_EPEER, msg);
}

static const rx_conn_proto_t member_proto = RX_CTL_PROTO_INIT(on_bytes, on_ready, on_close);

static int dial_fn(rx_reactor_t *rx, void *arg)
{
    rx_member_t *m = arg;
    uv_timer_init(&rx->loop, &m->beat);
    m->beat.data = m;
    uv_timer_init(&rx->loop, &m->redial);
    m->redial.data = m;
    uv_timer_init(&rx->loop, &m->held);
    m->held.data = m;
    m->beat_open = true;
    rx_coord_beats_ready(m->ctx->coord);
    return dial(m);
}

int rx_member_start(struct coh_ctx *ctx)
{
    rx_member_t *m = coh_zalloc(sizeof(*m));
    if (!m) return bs_fail(COH_ENOMEM, "out of memory");
    m->ctx = ctx;
    const char *tf = NULL;
    if (rx_env_knob_str("test_fault", &tf) == 0 && tf)
        snprintf(m->test_fault, sizeof(m->test_fault), "%s", tf);
    m->last_done_ns = bs_now_ns();
    m->coord_rank = ctx->cfg.coordinator;
    if (ctx->cfg.rejoin) {
        /* The configured coordinator first, unless that is this rank. */
        m->rejoining = true;
        if (m->coord_rank == ctx->rank) m->coord_rank = (ctx->rank + 1) % ctx->world;
    }
    uv_mutex_init(&m->mu);
    uv_cond_init(&m->cv);
    ctx->member = m;
    return rx_reactor_call(&ctx->ctrl, dial_fn, m);
}

int rx_member_wait_ready(struct coh_ctx *ctx, uint64_t deadline_ns)
{
    rx_member_t *m = ctx->member;
    uv_mutex_lock(&m->mu);
    while (m->conn_state == 0 && en_cond_wait_until(&m->cv, &m->mu, deadline_ns)) {
    }
    int st = m->conn_state;
    char why[BS_ERR_LEN];
    snprintf(why, sizeof(why), "%s", m->why);
    uv_mutex_unlock(&m->mu);
    if (st == 1) return 0;
    if (st == 0) return bs_fail(COH_ETIMEDOUT, "timed out connecting to the coordinator");
    return bs_fail(st, "%s", why);
}

static int close_fn(rx_reactor_t *rx, void *arg)
{
    (void)rx;
    rx_member_t *m = arg;
    if (m->conn) {
        rx_ctl_msg_t bye = {.type = RX_CTL_BYE};
        bye.u.bye_rank = (uint32_t)m->ctx->rank;
        rx_ctl_send(m->conn, &bye); /* written now: the write queue is empty or nearly */
        rx_conn_close(m->conn, COH_ECANCELED, "finalizing");
    }
    if (m->beat_open) {
        uv_close((uv_handle_t *)&m->beat, NULL);
        uv_close((uv_handle_t *)&m->redial, NULL);
        uv_close((uv_handle_t *)&m->held, NULL);
    }
    m->beat_open = false;
    return 0;
}

void rx_member_close(struct coh_ctx *ctx)
{
    if (ctx->member && atomic_load(&ctx->ctrl.state) == RX_RUNNING)
        rx_reactor_call(&ctx->ctrl, close_fn, ctx->member);
}

void rx_member_fini(struct coh_ctx *ctx)
{
    rx_member_t *m = ctx->member;
    if (!m) return;
    uv_cond_destroy(&m->cv);
    uv_mutex_destroy(&m->mu);
    relay_forget(m);
    coh_free(m->shrink_ranks);
    coh_free(m->sync_spare);
    coh_free(m);
    ctx->member = NULL;
}

/* ---- leaving the schedule ---- */

static int leave_fn(rx_reactor_t *rx, void *arg)
{
    (void)rx;
    rx_member_t *m = arg;
    if (!m->conn) return 0;
    rx_ctl_msg_t msg = {.type = RX_CTL_LEAVE};
    msg.u.leave_rank = (uint32_t)m->ctx->rank;
    return rx_ctl_send(m->conn, &msg);
}

/* Tests: put a raw message on this rank's control connection. */
static int raw_fn(rx_reactor_t *rx, void *arg)
{
    rx_member_t *m = ((struct coh_ctx *)rx->owner)->member;
    return m && m->conn ? rx_ctl_send(m->conn, arg) : COH_EPEER;
}

int rx_member_send_raw(struct coh_ctx *ctx, const rx_ctl_msg_t *msg)
{
    return rx_reactor_call(&ctx->ctrl, raw_fn, (void *)msg);
}

typedef struct post_task {
    rx_task_t task;
    rx_ctl_msg_t msg;
} post_task_t;

static void post_run(rx_task_t *t, rx_reactor_t *rx)
{
    post_task_t *pt = (post_task_t *)t;
    rx_member_t *m = ((struct coh_ctx *)rx->owner)->member;
    if (m && m->conn) rx_ctl_send(m->conn, &pt->msg);
    coh_free(pt);
}

void rx_member_post(struct coh_ctx *ctx, const rx_ctl_msg_t *msg)
{
    post_task_t *pt = coh_zalloc(sizeof(*pt));
    if (!pt) return;
    pt->task.run = post_run;
    pt->msg = *msg;
    if (!rx_reactor_post(&ctx->ctrl, &pt->task)) coh_free(pt);
}

/* ---- API ---- */

COH_API int coh_sync_leave(coh_comm_t *comm)
{
    if (!comm || !comm->ctx) return bs_fail(COH_EINVAL, "coh_sync_leave: comm is NULL");
    struct coh_ctx *ctx = comm->ctx;
    if (!rx_ctx_alive(ctx) || atomic_load(&ctx->state) != RX_CTX_RUNNING)
        return bs_fail(COH_ESTATE, "coh_sync_leave: the context is not running");
    rx_member_t *m = ctx->member;
    if (!m) return 0;
    if (atomic_load(&m->busy))
        return bs_fail(COH_ESTATE, "coh_sync_leave: a sync is still outstanding");
    int st = rx_reactor_call(&ctx->ctrl, leave_fn, m);
    return st < 0 ? bs_fail(st, "coh_sync_leave: the coordinator is gone") : 0;
}

COH_API const char *coh_sync_mode_name(coh_sync_mode mode)
{
    static const char *names[] = {"allreduce", "partial", "selective", "relay"};
    return (unsigned)mode < COH_SYNC_MODE_COUNT ? names[mode] : "default";
}

COH_API int coh_sync_mode_from_name(const char *name, coh_sync_mode *mode)
{
    for (int i = 0; name && mode && i < COH_SYNC_MODE_COUNT; i++)
        if (!strcmp(name, coh_sync_mode_name((coh_sync_mode)i))) {
            *mode = (coh_sync_mode)i;
            return 0;
        }
    return bs_fail(COH_EINVAL, "unknown sync mode \"%s\" (allreduce, partial, selective, relay)",
                   name ? name : "(null)");
}

/* A sync request (coh_sync_ex) or a relay allreduce (coh_allreduce_ex):
 * arguments checked by the caller. */
static int sync_submit(coh_comm_t *comm, const void *sendbuf, void *buf, size_t count,
                       coh_dtype dtype, uint64_t iteration, double weight, coh_sync_mode mode,
                       coh_redop redop, int plain, coh_request_t **out, const char *fn)
{
    struct coh_ctx *ctx = comm->ctx;
    size_t es = coh_dtype_size(dtype);
    if (comm != &ctx->world_comm)
        return bs_fail(COH_EUNSUPPORTED, "%s: only the world communicator is scheduled", fn);
    BS_CHECK(rx_gpu_host_only(ctx, sendbuf, buf, fn));
    rx_member_t *m = ctx->member;
    /* Every COHORT_PROBE_EVERY syncs, an alpha-beta probe first. Only where
     * every rank syncs as often as every other (relay and allreduce modes:
     * every live rank is in every group), so they all reach it together. */
    if (m && ctx->cfg.probe_every > 0 && (mode == COH_SYNC_RELAY || mode == COH_SYNC_ALLREDUCE) &&
        !atomic_load(&m->busy) && ++m->lockstep_syncs % (uint64_t)ctx->cfg.probe_every == 0) {
        coh_probe_info_t pi = {0};
        int pst = rx_probe(ctx, 0, NULL, 0, &pi);
        bs_log(COH_LOG_INFO, "rank %d: probe before sync %llu: %s, %.1f ms, %d links", ctx->rank,
               (unsigned long long)m->lockstep_syncs, coh_status_name(pst), pi.duration_us / 1e3,
               pi.nlinks);
    }
    /* COHORT_SYNC_PROBE_ROUNDS: the first partial or selective sync probes
     * first, so that the coordinator groups by measured rates from the start
     * (the syncs' own frames showed 0.35-2.2x a rank's rate at 32 ranks, a
     * probe 1.13x for 30 of them; docs/sync.md, "Link estimates"). Every
     * rank's first sync meets its peers here; a rank that rejoined comes
     * later than everyone's first sync and skips it. */
    if (m && !m->first_probed && (mode == COH_SYNC_PARTIAL || mode == COH_SYNC_SELECTIVE) &&
        !atomic_load(&m->busy)) {
        m->first_probed = true;
        if (ctx->cfg.sync_probe_rounds > 0 && !ctx->cfg.rejoin && ctx->world > 1) {
            coh_probe_info_t pi = {0};
            int pst = rx_probe(ctx, ctx->cfg.sync_probe_rounds, NULL, 0, &pi);
            bs_log(COH_LOG_INFO, "rank %d: probe before the first sync: %s, %.1f ms, %d links",
                   ctx->rank, coh_status_name(pst), pi.duration_us / 1e3, pi.nlinks);
        }
    }
    if (m && (atomic_load(&m->lost) || atomic_load(&m->excluded)))
        return m->excluded
                   ? bs_fail(COH_EPEER, "%s: %s", fn, m->excluded_why)
                   : bs_fail(COH_EPEER, "%s: the coordinator (rank %d) is gone", fn, m->coord_rank);
    if (m) {
        int idle = 0;
        if (!atomic_compare_exchange_strong(&m->busy, &idle, 1))
            return bs_fail(COH_ESTATE,
                           "%s: a sync or relay op is already outstanding on this "
                           "communicator (wait for it first)",
                           fn);
    }
    coh_request_t *req = rx_request_new(ctx, 0);
    rx_syncreq_t *s = coh_zalloc(sizeof(*s));
    size_t need = count ? count * es : 1, cap = need;
    void *scratch = NULL;
    if (m && m->sync_spare && m->sync_spare_cap >= need) { /* busy is ours */
        scratch = m->sync_spare;
        cap = m->sync_spare_cap;
        m->sync_spare = NULL;
        m->sync_spare_cap = 0;
    } else {
        scratch = coh_aligned(need, 64);
    }
    ready_task_t *rt = coh_zalloc(sizeof(*rt));
    if (!req || !s || !scratch || !rt) {
        if (req) rx_request_discard(req);
        coh_free(s);
        coh_free(scratch);
        coh_free(rt);
        if (m) atomic_store(&m->busy, 0);
        return bs_fail(COH_ENOMEM, "%s: out of memory", fn);
    }
    *s = (rx_syncreq_t){.buf = buf,
                        .sendbuf = sendbuf ? sendbuf : buf,
                        .scratch = scratch,
                        .scratch_cap = cap,
                        .count = count,
                        .dtype = dtype,
                        .mode = mode,
                        .iteration = iteration,
                        .weight = weight,
                        .redop = redop,
                        .plain = plain,
                        .join = RX_JOIN_NONE,
                        .retries_left = SYNC_RETRIES};
    req->sync = s;
    req->what = plain ? "relay allreduce" : "sync";
    req->bytes = (uint64_t)count * es;
    if (!m) {
        /* A world of one: the group is this rank, the result its own input. */
        if (count && buf != s->sendbuf) memcpy(buf, s->sendbuf, count * es);
        s->members = coh_malloc(sizeof(int));
        if (s->members) s->members[0] = 0;
        s->nmembers = 1;
        s->full = 1;
        s->total_weight = weight;
        s->t_start_ns = s->t_ready_ns = s->t_plan_ns = s->t_done_ns = bs_now_ns();
        count_sync(ctx, s);
        coh_free(rt);
        rx_request_complete(req);
        *out = req;
        return 0;
    }
    rt->task.run = ready_run;
    rt->req = req;
    if (!rx_reactor_post(&ctx->ctrl, &rt->task)) {
        coh_free(rt);
        rx_request_discard(req);
        atomic_store(&m->busy, 0);
        return bs_fail(COH_ESTATE, "%s: the context is finalizing", fn);
    }
    *out = req;
    return 0;
}

COH_API int coh_sync_ex(coh_comm_t *comm, void *buf, size_t count, coh_dtype dtype,
                        uint64_t iteration, double weight, coh_sync_mode mode, coh_request_t **out)
{
    if (!comm || !comm->ctx) return bs_fail(COH_EINVAL, "coh_sync: comm is NULL");
    struct coh_ctx *ctx = comm->ctx;
    if (!rx_ctx_alive(ctx) || atomic_load(&ctx->state) != RX_CTX_RUNNING)
        return bs_fail(COH_ESTATE, "coh_sync: the context is not running");
    if (!out) return bs_fail(COH_EINVAL, "coh_sync: req is NULL");
    size_t es = coh_dtype_size(dtype);
    if (!es) return bs_fail(COH_EINVAL, "coh_sync: unknown dtype %d", (int)dtype);
    if (count && !buf) return bs_fail(COH_EINVAL, "coh_sync: NULL buffer with count %zu", count);
    if (count > SIZE_MAX / es) return bs_fail(COH_EINVAL, "coh_sync: count overflows");
    if (!(weight >= COH_SYNC_WEIGHT_MIN && weight <= COH_SYNC_WEIGHT_MAX))
        return bs_fail(COH_EINVAL, "coh_sync: weight %g is out of range [%g, %g]", weight,
                       COH_SYNC_WEIGHT_MIN, COH_SYNC_WEIGHT_MAX);
    bool integral = dtype == COH_I32 || dtype == COH_I64 || dtype == COH_U8;
    if (integral && (weight != floor(weight) || weight > COH_SYNC_WEIGHT_INT_MAX))
        return bs_fail(COH_EINVAL, "coh_sync: integer data takes whole weights up to 2^24, not %g",
                       weight);
    if (mode == COH_SYNC_DEFAULT) mode = (coh_sync_mode)ctx->cfg.sync_mode;
    if ((unsigned)mode >= COH_SYNC_MODE_COUNT)
        return bs_fail(COH_EINVAL, "coh_sync: unknown mode %d", (int)mode);
    return sync_submit(comm, NULL, buf, count, dtype, iteration, weight, mode, COH_SUM, 0, out,
                       "coh_sync");
}

COH_API int coh_allreduce_ex(coh_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                             coh_dtype dtype, coh_redop op, const coh_allreduce_opts_t *opts,
                             coh_request_t **req)
{
    coh_allreduce_opts_t o = opts ? *opts : (coh_allreduce_opts_t){0};
    if (o.algo == COH_ALLREDUCE_DEFAULT && (o.loss_bound != 0 || o.pull_loss_bound != 0))
        return rx_allreduce_lossy(comm, sendbuf, recvbuf, count, dtype, op, &o, req);
    const char *fn = "coh_allreduce_ex";
    if (o.algo == COH_ALLREDUCE_DEFAULT)
        return rx_allreduce_opts(comm, sendbuf, recvbuf, count, dtype, op,
                                 &(coh_coll_opts_t){.mem = o.mem, .stream = o.stream}, req, fn);
    if (o.algo != COH_ALLREDUCE_RELAY)
        return bs_fail(COH_EINVAL, "%s: unknown algo %d", fn, o.algo);
    if (!comm || !comm->ctx) return bs_fail(COH_EINVAL, "%s: comm is NULL", fn);
    struct coh_ctx *ctx = comm->ctx;
    if (!rx_ctx_alive(ctx) || atomic_load(&ctx->state) != RX_CTX_RUNNING)
        return bs_fail(COH_ESTATE, "%s: the context is not running", fn);
    if (!req) return bs_fail(COH_EINVAL, "%s: req is NULL", fn);
    size_t es = coh_dtype_size(dtype);
    if (!es) return bs_fail(COH_EINVAL, "%s: unknown dtype %d", fn, (int)dtype);
    if ((unsigned)op >= COH_REDOP_COUNT)
        return bs_fail(COH_EINVAL, "%s: unknown op %d", fn, (int)op);
    if (count && !recvbuf) return bs_fail(COH_EINVAL, "%s: NULL buffer with count %zu", fn, count);
    if (count > SIZE_MAX / es) return bs_fail(COH_EINVAL, "%s: count overflows", fn);
    BS_CHECK(rx_gpu_host_only(ctx, sendbuf, recvbuf, fn));
    if (dtype == COH_U8 && op == COH_AVG && comm->size > 255)
        return bs_fail(COH_EINVAL, "%s: a u8 average over more than 255 ranks", fn);
    return sync_submit(comm, sendbuf, recvbuf, count, dtype, o.iteration, 1.0, COH_SYNC_RELAY, op,
                       1, req, fn);
}

COH_API int coh_sync(coh_comm_t *comm, void *buf, size_t count, coh_dtype dtype, uint64_t iteration,
                     double weight, coh_request_t **req)
{
    return coh_sync_ex(comm, buf, count, dtype, iteration, weight, COH_SYNC_DEFAULT, req);
}

COH_API int coh_request_group(const coh_request_t *req, coh_group_info_t *info)
{
    if (!req || !info) return bs_fail(COH_EINVAL, "coh_request_group: NULL argument");
    if (!req->sync) return bs_fail(COH_EINVAL, "coh_request_group: not a sync request");
    if (atomic_load_explicit(&req->state, memory_order_acquire) != RX_REQ_DONE) return COH_EAGAIN;
    const rx_syncreq_t *s = req->sync;
    *info = (coh_group_info_t){
        .group_id = s->group_id,
        .size = s->nmembers,
        .members = s->members,
        .full = s->full,
        .total_weight = s->total_weight,
        .wait_us = s->t_plan_ns > s->t_start_ns ? (double)(s->t_plan_ns - s->t_start_ns) / 1e3 : 0,
        .comm_us = s->t_done_ns > s->t_plan_ns ? (double)(s->t_done_ns - s->t_plan_ns) / 1e3 : 0,
        .nrelays = s->nrelays,
        .relays = s->relays,
        .relayed = s->relayed,
        .phase2 = s->phase2,
        .phase2_method = s->phase2_method,
        .nexcluded = s->nexcluded,
        .nsegments = (int)s->nseg,
        .joined = s->join == RX_JOIN_NONE ? -1 : (int)s->join};
    return 0;
}

/* ---- coh_comm_shrink ---- */

/* Loop thread: (again) ask the coordinator for the shrunk communicator. */
static void send_shrink(rx_member_t *m)
{
    uv_mutex_lock(&m->mu);
    bool asked = m->shrink_state == 1;
    rx_ctl_msg_t msg = {.type = m->shrink_grow ? RX_CTL_GROW : RX_CTL_SHRINK};
    msg.u.shrink = m->shrink_req;
    msg.u.shrink.ranks_in = m->shrink_ranks;
    if (asked && m->conn && m->conn->ready && !m->electing) rx_ctl_send(m->conn, &msg);
    uv_mutex_unlock(&m->mu);
}

typedef struct shrink_args {
    rx_member_t *m;
    bool cancel;
} shrink_args_t;

static int shrink_fn(rx_reactor_t *rx, void *arg)
{
    (void)rx;
    shrink_args_t *a = arg;
    if (a->cancel) {
        uv_mutex_lock(&a->m->mu);
        a->m->shrink_state = 0;
        uv_mutex_unlock(&a->m->mu);
        return 0;
    }
    if (!a->m->conn && !a->m->electing) return COH_EPEER;
    send_shrink(a->m);
    return 0;
}

int rx_member_shrink(struct coh_ctx *ctx, bool grow, uint32_t comm, const int *ranks, int n,
                     uint32_t top, uint32_t *newcomm, int **out, int *nout)
{
    rx_member_t *m = ctx->member;
    const char *fn = grow ? "coh_comm_grow" : "coh_comm_shrink";
    if (m->excluded) return bs_fail(COH_EPEER, "%s: %s", fn, m->excluded_why);
    uint32_t *r = coh_malloc(sizeof(uint32_t) * (size_t)(n ? n : 1));
    if (!r) return bs_fail(COH_ENOMEM, "%s: out of memory", fn);
    for (int i = 0; i < n; i++) r[i] = (uint32_t)ranks[i];
    uv_mutex_lock(&m->mu);
    if (m->shrink_state == 1) {
        uv_mutex_unlock(&m->mu);
        coh_free(r);
        return bs_fail(COH_ESTATE, "%s: another shrink or grow of this rank is in progress", fn);
    }
    m->shrink_grow = grow;
    coh_free(m->shrink_ranks);
    m->shrink_ranks = r;
    m->shrink_req =
        (rx_ctl_shrink_t){.rank = (uint32_t)ctx->rank, .comm = comm, .top = top, .n = (uint32_t)n};
    m->shrink_state = 1;
    uv_mutex_unlock(&m->mu);
    shrink_args_t a = {.m = m};
    int st = rx_reactor_call(&ctx->ctrl, shrink_fn, &a);
    /* Every live member must call it; a rank that never does holds the
     * others until this bound. */
    uint64_t deadline = bs_now_ns() + 2ull * (uint64_t)ctx->cfg.timeout_ms * 1000000ull;
    uv_mutex_lock(&m->mu);
    while (st == 0 && m->shrink_state == 1 && en_cond_wait_until(&m->cv, &m->mu, deadline)) {
    }
    int res = st < 0 ? st : m->shrink_state == 1 ? COH_ETIMEDOUT : m->shrink_state;
    if (res == 2) {
        *out = coh_malloc(sizeof(int) * (size_t)(m->shrink_n ? m->shrink_n : 1));
        if (!*out) res = COH_ENOMEM;
        for (int i = 0; *out && i < m->shrink_n; i++) (*out)[i] = (int)m->shrink_ranks[i];
        *nout = m->shrink_n;
        *newcomm = m->shrink_newcomm;
    }
    uv_mutex_unlock(&m->mu);
    a.cancel = true;
    rx_reactor_call(&ctx->ctrl, shrink_fn, &a);
    if (res == 2) return 0;
    return bs_fail(res, "%s: %s", fn,
                   res == COH_ETIMEDOUT
                       ? (n ? "not every live member asked within twice COHORT_TIMEOUT_MS"
                            : "the job's ranks did not grow their communicator within twice "
                              "COHORT_TIMEOUT_MS")
                   : res == COH_EMISMATCH ? "members disagree on the communicator's ranks"
                   : st < 0               ? "the coordinator is gone"
                                          : coh_strerror(res));
}

/* ---- coh_probe's results to the coordinator ---- */

typedef struct probe_task {
    rx_task_t task;
    int n;
    rx_ctl_link_t links[];
} probe_task_t;

static void probe_run(rx_task_t *t, rx_reactor_t *rx)
{
    probe_task_t *pt = (probe_task_t *)t;
    rx_member_t *m = ((struct coh_ctx *)rx->owner)->member;
    if (m && m->conn && m->conn->ready) {
        rx_ctl_msg_t msg = {.type = RX_CTL_PROBE};
        msg.u.probe = (rx_ctl_probe_t){
            .rank = (uint32_t)m->ctx->rank, .n = (uint32_t)pt->n, .links_in = pt->links};
        rx_ctl_send(m->conn, &msg);
    }
    coh_free(pt);
}

void rx_member_report_probe(struct coh_ctx *ctx, const rx_ctl_link_t *links, int n)
{
    if (!ctx->member) return;
    probe_task_t *pt = coh_zalloc(sizeof(*pt) + sizeof(rx_ctl_link_t) * (size_t)(n ? n : 1));
    if (!pt) return;
    pt->task.run = probe_run;
    pt->n = n;
    if (n) memcpy(pt->links, links, sizeof(rx_ctl_link_t) * (size_t)n);
    if (!rx_reactor_post(&ctx->ctrl, &pt->task)) coh_free(pt);
}
