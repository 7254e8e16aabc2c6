/*
 * The coordinator: one rank's control reactor hosts the scheduler fiber.
 *
 * It listens for every rank's control connection, turns READY / DONE /
 * REFUSE messages and lost connections into scheduler events (sched/sched.h,
 * pure and deterministic: the same code the simulator runs), asks the
 * scheduler for decisions on a timer every COHORT_TICK_MS and after every
 * event, and sends each LAUNCH out as PLANs. Everything here runs on that
 * reactor's loop thread.
 *
 * Times given to the scheduler are seconds on this rank's monotonic clock
 * since the coordinator started; compute times are measured by the ranks
 * themselves (from the end of their previous sync to their READY).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reactor/rx_ctx.h"
#include "reactor/rx_trace.h"
#include "reactor/rx_sync.h"
#include "sched/sched.h"

typedef struct co_rank {
    rx_conn_t *conn;
    bool lost;
    bool left;          /* said LEAVE: out of the schedule, connection kept */
    bool has_ready;     /* a READY waits for a group */
    bool deferred;      /* a READY arrived while its group still ran */
    bool owe_mode;      /* ranks disagreed on the mode: its next READY is refused */
    bool bye;           /* said BYE (finalizing): its close is not a failure */
    uint64_t owed_gid;  /* a relay plan waits for it to connect (after an election) */
    bool stated;        /* sent its STATE (to this elected coordinator) */
    uint64_t committed; /* STATE: the newest relay group it kept */
    uint64_t awaiting;  /* STATE: the relay group whose COMMIT it waits for */
    bool joining;       /* restarted after it failed (COHORT_REJOIN): out until a grow takes it */
    bool join_asked;    /* joining, and it asked to grow */
    rx_ctl_ready_t ready;
    uint64_t t_heard_ns; /* last message from it (liveness) */
    uint64_t t_ready_ns; /* when has_ready was set */
    uint64_t group;      /* the running group it is in, 0 if none */
    sc_rate_t bw;        /* its link's rate, from its frames and probes (sc_est.h) */
    double t_done;       /* its latest DONE came (now_s): it computes again from there */
    double t_ready_in;   /* its latest READY came (now_s), deferred or not */
} co_rank_t;

typedef struct co_group {
    struct co_group *next;
    uint64_t gid;  /* global: PLANs and DONEs carry it */
    uint64_t sgid; /* the scheduler's id */
    int mode;
    int n;
    int *members;
    rx_ctl_ready_t *readys; /* what each member asked with (to group it again) */
    uint8_t *done;
    int ndone;
    double max_duration;
    int status;
    double t_launch, t_first_fail;
    /* Relay groups (COH_SYNC_RELAY): members are the ring, ready ranks first
     * and then the late ones, who relay phase 1. */
    bool relay;
    int phase;           /* 1 phase 1 runs; 2 waiting for the late ranks; 3 phase 2 runs */
    uint8_t *rst;        /* per member: RL_* */
    int32_t exp;         /* weighted floating-point data scales by 2^-exp */
    double w1;           /* weights in the phase-1 result (plain: contributors) */
    double t_p1;         /* phase 1 ended */
    double t_first_done; /* the running phase's first DONE came (0: none yet) */
    rx_ctl_rplan_t p1;   /* phase 1's plan (attempt 0), for a relay that connects late */
    uint32_t nseg;       /* phase 1's segments (a late rank's data joins those to come) */
    uint32_t *ring32;    /* p1's ring and late ranks point here */
} co_group_t;

enum {
    RL_LATE = 1,  /* late at the launch: relays phase 1 */
    RL_READY = 2, /* late, and its READY has arrived: folded in by phase 2 */
    RL_OUT = 4,   /* gone, failed or left: not in phase 2 */
};

/* A coh_comm_shrink in progress: comm's members, and who asked so far. */
typedef struct co_shrink {
    struct co_shrink *next;
    bool grow; /* coh_comm_grow: the ranks that rejoined and asked come in too */
    uint32_t comm;
    int n;
    int *ranks;
    uint8_t *asked;
} co_shrink_t;

struct rx_coord {
    struct coh_ctx *ctx;
    co_shrink_t *shrinks;
    uint32_t next_comm; /* communicator ids given out (0 is the world) */
    rx_reactor_t *rx;
    rx_listener_t *listener;
    uv_timer_t tick;
    bool tick_slow; /* nothing waits on a decision: the tick only checks liveness */
    bool closing;
    bool dormant;         /* not (yet) the coordinator: no timer, no scheduler */
    bool elected;         /* became the coordinator after the configured one failed */
    uint64_t t_active_ns; /* when it became active */
    int world;
    co_rank_t *ranks;
    sc_sched_t *sched[COH_SYNC_MODE_COUNT];
    co_group_t *groups;
    uint64_t next_gid;
    uint64_t max_seen_gid;  /* the newest group any READY named (elections) */
    uint64_t max_committed; /* the newest relay group a rank kept */
    double probe_alpha_s;   /* the median latency of the last probe (0: none) */
    uint64_t t0_ns;
    uint64_t t_ping_ns; /* last heartbeat sent */
    /* The disagreement on the mode that owe_mode ranks are told about. */
    int mode_rank[2];
    uint32_t mode_mode[2];
    struct sockaddr_storage addr;
    /* BEAT datagrams (rx_ctl.h) on a UDP socket bound to addr; NULL when it
     * could not be bound (liveness then rides the TCP PINGs alone).
     * beats_ok: this rank's member started, so ctx->ctrl_addrs is complete. */
    struct co_beat *beat;
    bool beats_ok;
    uint64_t beat_value;
    /* Ranks connected and not gone or left; finalize waits (under mu) for 0. */
    int active;
    uv_mutex_t mu;
    uv_cond_t idle;
};

static void active_add(rx_coord_t *c, int d)
{
    uv_mutex_lock(&c->mu);
    c->active += d;
    if (c->active == 0) uv_cond_broadcast(&c->idle);
    uv_mutex_unlock(&c->mu);
}

static bool dtype_is_int(uint32_t dt)
{
    return dt == COH_I32 || dt == COH_I64 || dt == COH_U8;
}

static double now_s(rx_coord_t *c)
{
    return (double)(bs_now_ns() - c->t0_ns) / 1e9;
}

/* Warm start from the trace coh_init read (COHORT_SCHED_TRACE): its compute
 * times (its rates are the ranks' first estimates, rx_coord_start). */
static void apply_trace(rx_coord_t *c, sc_sched_t *s)
{
    const rx_sched_cfg_t *sc = &c->ctx->sched_cfg;
    if (!sc->trace_n) return;
    for (int w = 0; w < c->world; w++)
        if (sc->trace_n[w]) sc_sched_load_cdf(s, w, sc->trace_samples[w], sc->trace_n[w]);
}

static sc_sched_t *sched_for(rx_coord_t *c, int mode, const rx_ctl_ready_t *first)
{
    if (c->sched[mode]) return c->sched[mode];
    sc_params_t p = c->ctx->sched_cfg.params;
    static const sc_policy policy[] = {SC_POLICY_ALLREDUCE, SC_POLICY_PARTIAL, SC_POLICY_SELECTIVE,
                                       SC_POLICY_RELAY};
    p.policy = policy[mode];
    /* The cost model's v is the size being synchronised. */
    if (first->count) p.model_mb = (double)first->count * coh_dtype_size(first->dtype) / 1e6;
    if (c->probe_alpha_s > 0) p.alpha_s = c->probe_alpha_s;
    if (sc_sched_create(&p, c->world, &c->sched[mode]) < 0) return NULL;
    sc_sched_t *s = c->sched[mode];
    apply_trace(c, s);
    for (int r = 0; r < c->world; r++) {
        if (c->ranks[r].lost || c->ranks[r].left) sc_sched_on_worker_lost(s, r);
        double bw = sc_rate_get(&c->ranks[r].bw);
        if (bw > 0) sc_sched_on_bandwidth(s, r, bw);
    }
    return s;
}

/* ---- sending ---- */

static void declare_lost(rx_coord_t *c, int r, const char *why);
static void shrink_try_all(rx_coord_t *c);
static void broadcast_lost(rx_coord_t *c, int r, uint32_t silent_ms, int why);

static void send_plan(rx_coord_t *c, int r, uint64_t gid, uint64_t attempt, int status, int full,
                      double total_weight, const int *members, int n)
{
    co_rank_t *cr = &c->ranks[r];
    uint32_t stack[64];
    uint32_t *m32 = n <= 64 ? stack : coh_malloc(sizeof(uint32_t) * (size_t)n);
    if (!m32) {
        declare_lost(c, r, "out of memory planning it");
        return;
    }
    for (int i = 0; i < n; i++) m32[i] = (uint32_t)members[i];
    rx_ctl_msg_t msg = {.type = RX_CTL_PLAN};
    msg.u.plan = (rx_ctl_plan_t){.group_id = gid,
                                 .attempt = attempt,
                                 .status = status,
                                 .full = (uint32_t)full,
                                 .total_weight = total_weight,
                                 .nmembers = (uint32_t)n,
                                 .members_in = m32};
    int st = cr->conn ? rx_ctl_send(cr->conn, &msg) : COH_EPEER;
    if (m32 != stack) coh_free(m32);
    if (st < 0) declare_lost(c, r, "cannot send it its plan");
}

/* ---- groups ---- */

static co_group_t *group_find(rx_coord_t *c, uint64_t gid)
{
    for (co_group_t *g = c->groups; g; g = g->next)
        if (g->gid == gid) return g;
    return NULL;
}

static void apply_ready(rx_coord_t *c, int r);

/* A group id no rank has used: after an election, past every group the
 * ranks report (READY's last_gid), with room for what the relays of the
 * last group saw (ranks remember finished ops, EN_FIN_MAX of them, and drop
 * frames for one: a reused id would stall the group). */
static uint64_t new_gid(rx_coord_t *c)
{
    if (c->next_gid < c->max_seen_gid) c->next_gid = c->max_seen_gid + EN_FIN_MAX;
    return ++c->next_gid;
}

static void group_end(rx_coord_t *c, co_group_t *g)
{
    co_group_t **pp = &c->groups;
    while (*pp != g) pp = &(*pp)->next;
    *pp = g->next;
    sc_sched_t *s = c->sched[g->mode];
    if (s) sc_sched_on_group_done(s, g->sgid, now_s(c), g->max_duration);
    for (int i = 0; i < g->n; i++) {
        co_rank_t *cr = &c->ranks[g->members[i]];
        if (cr->group == g->gid) cr->group = 0;
    }
    for (int i = 0; i < g->n; i++) {
        co_rank_t *cr = &c->ranks[g->members[i]];
        if (cr->deferred && !cr->lost) {
            cr->deferred = false;
            apply_ready(c, g->members[i]);
        }
    }
    coh_free(g->members);
    coh_free(g->readys);
    coh_free(g->done);
    coh_free(g->rst);
    coh_free(g->ring32);
    coh_free(g);
}

static void relay_phase1_end(rx_coord_t *c, co_group_t *g);
static void relay_try_phase2(rx_coord_t *c, co_group_t *g);

static void send_commit(rx_coord_t *c, int r, uint64_t gid, int status)
{
    co_rank_t *cr = &c->ranks[r];
    rx_ctl_msg_t msg = {.type = RX_CTL_COMMIT};
    msg.u.commit.group_id = gid;
    msg.u.commit.status = status;
    bs_log(COH_LOG_DEBUG, "coordinator: relay group %llu: COMMIT %d to rank %d%s",
           (unsigned long long)gid, status, r, cr->conn && !cr->lost ? "" : " (not sent: lost)");
    if (cr->conn && !cr->lost) rx_ctl_send(cr->conn, &msg);
}

/* The relay group's last op ended on every member: keep the result on all
 * of them (each has it), or, if the op failed anywhere, on none: the ranks
 * it ended well on start over beside those it failed on (who already did). */
static void relay_commit(rx_coord_t *c, co_group_t *g)
{
    int st = g->status < 0 ? COH_EPEER : 0;
    if (st)
        bs_log(COH_LOG_INFO, "coordinator: relay group %llu failed on a member: nobody keeps it",
               (unsigned long long)g->gid);
    else if (g->gid > c->max_committed)
        c->max_committed = g->gid;
    for (int i = 0; i < g->n; i++)
        if (g->done[i] == 1 && !(g->rst[i] & RL_OUT)) send_commit(c, g->members[i], g->gid, st);
}

/*
 * After an election: ranks whose relay group ended well wait for a COMMIT
 * the old coordinator may have sent to some members before it died. It
 * sent one only once every member had the result, and relay groups do not
 * overlap, so if any live rank kept group g or a later one, g is kept
 * everywhere; once every live rank has said where it stands and none kept
 * it, nobody did, and the waiting ones start over.
 */
static void resolve_awaiting(rx_coord_t *c)
{
    bool all = true;
    for (int r = 0; r < c->world && all; r++)
        all = c->ranks[r].lost || c->ranks[r].bye || c->ranks[r].stated;
    for (int r = 0; r < c->world; r++) {
        co_rank_t *cr = &c->ranks[r];
        if (!cr->awaiting || cr->lost || (c->max_committed < cr->awaiting && !all)) continue;
        uint64_t g = cr->awaiting;
        bool kept = c->max_committed >= g;
        cr->awaiting = 0;
        if (kept) cr->committed = g;
        bs_log(COH_LOG_INFO, "coordinator: rank %d's relay group %llu: %s", r,
               (unsigned long long)g, kept ? "kept by a member: kept" : "kept by nobody: again");
        send_commit(c, r, g, kept ? 0 : COH_EPEER);
    }
}

/* The relay group cannot finish: the ready members that wait for phase 2
 * try again (a PLAN refusal with their attempt; those that failed already
 * did, under a new attempt, and ignore it). Late ranks whose READY came are
 * grouped again with it at the group's end. */
static void relay_retry_all(rx_coord_t *c, co_group_t *g)
{
    bs_log(COH_LOG_DEBUG, "coordinator: relay group %llu (phase %d): every member again",
           (unsigned long long)g->gid, g->phase);
    for (int i = 0; i < g->n; i++) {
        co_rank_t *cr = &c->ranks[g->members[i]];
        if ((g->rst[i] & RL_LATE) || cr->lost || !cr->conn) continue;
        int one[1] = {g->members[i]};
        send_plan(c, g->members[i], g->gid, g->readys[i].attempt, COH_EPEER, RX_CTL_WHY_NONE, 0,
                  one, 1);
    }
    group_end(c, g);
}

/*
 * A relay group whose running phase ended on some members twice the op
 * timeout ago, with nobody failed, while others never reported (a plan they
 * did not take up, as a stale one). Members of one op end within an op
 * timeout of each other (an op without progress fails), so that word will
 * not come: the group starts over instead of holding every member forever. Phase 1: as when it
 * fails. Phase 2: the members that reported well start over on a COMMIT EPEER, the silent ones on a
 * refusal of the attempt they were planned with.
 */
static void relay_stuck(rx_coord_t *c, co_group_t *g)
{
    for (int i = 0; i < g->n; i++)
        if (!g->done[i])
            bs_log(COH_LOG_WARN,
                   "coordinator: relay group %llu: no word from rank %d in twice the op timeout: "
                   "the group starts over",
                   (unsigned long long)g->gid, g->members[i]);
    g->status = COH_ETIMEDOUT;
    if (g->phase == 1) {
        relay_retry_all(c, g);
        return;
    }
    int *who = coh_malloc(sizeof(int) * (size_t)g->n);
    uint64_t *att = coh_malloc(sizeof(uint64_t) * (size_t)g->n);
    int nw = 0;
    for (int i = 0; i < g->n; i++) {
        if (g->done[i]) continue;
        g->done[i] = 2;
        g->ndone++;
        if (who && att && !(g->rst[i] & RL_OUT)) {
            who[nw] = g->members[i];
            att[nw++] = g->readys[i].attempt;
        }
    }
    uint64_t gid = g->gid;
    relay_commit(c, g);
    group_end(c, g);
    /* After the group is gone: a failed send declares the rank lost. */
    for (int k = 0; k < nw; k++)
        if (!c->ranks[who[k]].lost)
            send_plan(c, who[k], gid, att[k], COH_EPEER, RX_CTL_WHY_NONE, 0, &who[k], 1);
    coh_free(who);
    coh_free(att);
}

/* A late rank whose data joined some segments of phase 1: the result has
 * part of it, so a group that loses it starts over without it. */
static bool relay_partial(const co_group_t *g, int i)
{
    return (g->rst[i] & RL_READY) && g->readys[i].join != RX_JOIN_NONE;
}

static void member_done(rx_coord_t *c, co_group_t *g, int r, int status, double duration)
{
    bs_log(COH_LOG_DEBUG,
           "coordinator: group %llu (%s, phase %d): rank %d done, status %d, %d of %d",
           (unsigned long long)g->gid, g->relay ? "relay" : "plain", g->phase, r, status, g->ndone,
           g->n);
    if (g->relay && g->phase == 2) {
        /* Between the phases nobody owes a DONE: r is gone or failed, so
         * phase 2 goes on without it (its phase-1 part, if it was ready,
         * is in the result already; a late rank's is not), unless its data
         * partly joined phase 1. */
        bool partial = false;
        for (int i = 0; i < g->n; i++) {
            if (g->members[i] != r || (g->rst[i] & RL_OUT)) continue;
            partial |= relay_partial(g, i);
            g->rst[i] |= RL_OUT;
            if (!g->done[i]) {
                g->done[i] = 1;
                g->ndone++;
            }
        }
        if (partial) {
            bs_log(COH_LOG_INFO,
                   "coordinator: relay group %llu lost rank %d, whose data joined "
                   "phase 1: again without it",
                   (unsigned long long)g->gid, r);
            relay_retry_all(c, g);
            return;
        }
        relay_try_phase2(c, g);
        return;
    }
    for (int i = 0; i < g->n; i++) {
        if (g->members[i] != r) continue;
        /* A relay member lost while its phase runs is out of what follows
         * (phase 2's ring, the commit) even if its DONE came first: a
         * phase 2 planned through the dead rank failed on every member,
         * and the group then waited forever for the dead rank's DONE. */
        if (g->relay && c->ranks[r].lost) g->rst[i] |= RL_OUT;
        if (g->done[i]) continue;
        g->done[i] = status < 0 ? 2 : 1; /* 1: ended well (relay_commit) */
        g->ndone++;
        if (!g->t_first_done) g->t_first_done = now_s(c);
        c->ranks[r].t_done = now_s(c);
        /* It computes again from here, not from the group's last DONE. */
        if (!g->relay && c->sched[g->mode]) sc_sched_on_member_done(c->sched[g->mode], r, now_s(c));
        if (duration > g->max_duration) g->max_duration = duration;
        if (status < 0 && g->status == 0) {
            g->status = status;
            g->t_first_fail = now_s(c);
        }
    }
    if (g->ndone < g->n) return;
    if (g->relay && g->phase == 1 && g->status == 0) {
        relay_phase1_end(c, g);
        return;
    }
    if (g->relay && g->phase == 1) {
        /* Phase 1 failed for some members (a rank died mid-ring) and may
         * have succeeded for others, who now wait for a phase 2 that will
         * not come. */
        relay_retry_all(c, g);
        return;
    }
    if (g->relay && g->phase == 3) relay_commit(c, g);
    group_end(c, g);
}

/* Every other rank drops r's data connections: ops that wait on it end
 * (EPEER, naming it) instead of running into their timeout, now and later. */
static void broadcast_lost(rx_coord_t *c, int r, uint32_t silent_ms, int why)
{
    rx_ctl_msg_t msg = {.type = RX_CTL_LOST};
    msg.u.lost.rank = (uint32_t)r;
    msg.u.lost.silent_ms = silent_ms;
    msg.u.lost.why = (uint32_t)why;
    for (int k = 0; k < c->world; k++)
        if (k != r && c->ranks[k].conn && !c->ranks[k].lost) rx_ctl_send(c->ranks[k].conn, &msg);
}

/* r is failed for good (unless it said BYE: then it is only gone): out of
 * every schedule, and every other rank hears it (LOST) and drops it. */
static void declare_lost_as(rx_coord_t *c, int r, int code, uint32_t silent_ms, const char *why)
{
    co_rank_t *cr = &c->ranks[r];
    if (cr->lost) return;
    cr->lost = true;
    if (!cr->bye && !c->closing) {
        broadcast_lost(c, r, silent_ms, code);
        /* And r itself, should it still read: it is out, and must not take
         * the closed connection for a failed coordinator and elect one. */
        rx_ctl_msg_t msg = {.type = RX_CTL_LOST};
        msg.u.lost.rank = (uint32_t)r;
        msg.u.lost.silent_ms = silent_ms;
        msg.u.lost.why = (uint32_t)code;
        if (cr->conn) rx_ctl_send(cr->conn, &msg);
    }
    if (cr->conn && !cr->left) active_add(c, -1);
    cr->has_ready = cr->deferred = false;
    bs_log(COH_LOG_WARN, "coordinator: rank %d is out of the schedule: %s", r, why);
    for (int m = 0; m < COH_SYNC_MODE_COUNT; m++)
        if (c->sched[m]) sc_sched_on_worker_lost(c->sched[m], r);
    /* The LOST above goes out before the close: dropped with the queued
     * bytes of a rank slow to read, the rank saw only the close, took it
     * for a failed coordinator and went on electing one. */
    if (cr->conn)
        rx_conn_close_flushed(cr->conn, COH_EPEER, why, (unsigned)c->ctx->cfg.liveness_ms);
    co_group_t *g = cr->group ? group_find(c, cr->group) : NULL;
    if (g) member_done(c, g, r, COH_EPEER, 0);
    shrink_try_all(c);   /* a shrink no longer waits for r */
    resolve_awaiting(c); /* nor does the fate of a relay group */
}

static void declare_lost(rx_coord_t *c, int r, const char *why)
{
    declare_lost_as(c, r, RX_LOST_OTHER, 0, why);
}

/* Out of the schedule until its next READY (LEAVE, or a rank that held the
 * others up): nobody waits for it, its connection stays. */
static void take_out(rx_coord_t *c, int r)
{
    co_rank_t *cr = &c->ranks[r];
    if (cr->left || cr->lost) return;
    cr->left = true;
    active_add(c, -1);
    cr->has_ready = cr->deferred = false;
    for (int md = 0; md < COH_SYNC_MODE_COUNT; md++)
        if (c->sched[md]) sc_sched_on_worker_lost(c->sched[md], r);
    co_group_t *g = cr->group ? group_find(c, cr->group) : NULL;
    if (g && g->relay && g->phase != 2) {
        /* Its relay op or phase 2 runs: its DONE ends its part; it is out
         * of any phase 2 still to come. */
        for (int i = 0; i < g->n; i++)
            if (g->members[i] == r && (g->rst[i] & RL_LATE)) g->rst[i] |= RL_OUT;
    } else if (g) {
        member_done(c, g, r, 0, 0);
    }
}

/* Tell rank r its sync has no group: status and an rx_ctl_why, with up to
 * two detail words in the members list. */
static void refuse_rank(rx_coord_t *c, int r, int status, int why, const int *detail, int ndetail)
{
    co_rank_t *cr = &c->ranks[r];
    int one[2] = {r, 0};
    if (!detail) {
        detail = one;
        ndetail = 1;
    }
    send_plan(c, r, 0, cr->ready.attempt, status, why, 0, detail, ndetail);
}

/* The timeline: a launch (or a suspect) with the scheduler's reason. */
static void trace_decision(rx_coord_t *c, int mode, const sc_decision_t *d)
{
    char line[256], esc[128], args[240];
    if (sc_decision_explain(d, line, sizeof(line)) <= 0) line[0] = 0;
    rx_trace_escape(line, esc, sizeof(esc));
    snprintf(args, sizeof(args), "\"mode\":\"%s\",\"why\":\"%s\",\"members\":%d,\"explain\":\"%s\"",
             coh_sync_mode_name((coh_sync_mode)mode), sc_why_name(d->why), d->nmembers, esc);
    rx_trace_add(c->ctx->trace, 'i', "coordinator", d->kind == SC_DEC_LAUNCH ? "launch" : "suspect",
                 RX_TR_COORD, bs_now_ns(), 0, 0, args);
}

static void launch(rx_coord_t *c, int mode, const sc_decision_t *d)
{
    int n = d->nmembers;
    /* Every member must be ready, in this mode, with the same count and dtype. */
    const rx_ctl_ready_t *first = NULL;
    bool mismatch = false, missing = false;
    double total = 0;
    for (int i = 0; i < n; i++) {
        co_rank_t *cr = &c->ranks[d->members[i]];
        if (!cr->has_ready || cr->ready.mode != (uint32_t)mode) {
            missing = true;
            continue;
        }
        if (!first) first = &cr->ready;
        mismatch |= cr->ready.count != first->count || cr->ready.dtype != first->dtype;
        total += cr->ready.weight; /* weights are in range (on_msg): the sum is finite */
    }
    /* Integer data is scaled by whole weights and divided by their sum. */
    bool bad_weight = first && dtype_is_int(first->dtype) && total > COH_SYNC_WEIGHT_INT_MAX;
    co_group_t *g = coh_zalloc(sizeof(*g));
    if (g) {
        g->members = coh_malloc(sizeof(int) * (size_t)n);
        g->readys = coh_calloc((size_t)n, sizeof(rx_ctl_ready_t));
        g->done = coh_calloc((size_t)n, 1);
    }
    if (!g || !g->members || !g->readys || !g->done) {
        if (g) {
            coh_free(g->members);
            coh_free(g->readys);
            coh_free(g->done);
            coh_free(g);
        }
        sc_sched_on_group_done(c->sched[mode], d->group_id, now_s(c), 0);
        bs_log(COH_LOG_ERROR, "coordinator: out of memory launching a group");
        return;
    }
    g->gid = new_gid(c);
    g->sgid = d->group_id;
    g->mode = mode;
    g->n = n;
    g->t_launch = now_s(c);
    for (int i = 0; i < n; i++) {
        g->members[i] = d->members[i];
        g->readys[i] = c->ranks[d->members[i]].ready;
    }
    if (mismatch || missing || bad_weight) {
        /* Refuse the group: every member's sync fails with the reason. */
        int st = mismatch ? COH_EMISMATCH : bad_weight ? COH_EINVAL : COH_EPROTO;
        int why = mismatch ? RX_CTL_WHY_COUNT : bad_weight ? RX_CTL_WHY_WEIGHT : RX_CTL_WHY_NONE;
        bs_log(COH_LOG_WARN, "coordinator: group %llu refused: %s", (unsigned long long)g->gid,
               mismatch     ? "members disagree on count or dtype"
               : bad_weight ? "integer weights sum beyond 2^24"
                            : "a member is not ready");
        for (int i = 0; i < n; i++) {
            co_rank_t *cr = &c->ranks[g->members[i]];
            if (!cr->has_ready) continue;
            cr->has_ready = false;
            send_plan(c, g->members[i], g->gid, cr->ready.attempt, st, why, 0, g->members, n);
        }
        sc_sched_on_group_done(c->sched[mode], g->sgid, now_s(c), 0);
        coh_free(g->members);
        coh_free(g->readys);
        coh_free(g->done);
        coh_free(g);
        return;
    }
    g->next = c->groups;
    c->groups = g;
    for (int i = 0; i < n; i++) {
        co_rank_t *cr = &c->ranks[g->members[i]];
        cr->has_ready = false;
        cr->group = g->gid;
    }
    /* Sending can declare a member lost and so end (free) the group: send
     * from copies. */
    uint64_t gid = g->gid;
    int *mem = coh_malloc(sizeof(int) * (size_t)n);
    uint64_t *att = coh_malloc(sizeof(uint64_t) * (size_t)n);
    if (!mem || !att) {
        coh_free(mem);
        coh_free(att);
        for (int i = 0; i < n; i++) declare_lost(c, d->members[i], "out of memory planning it");
        return;
    }
    for (int i = 0; i < n; i++) {
        mem[i] = g->members[i];
        att[i] = g->readys[i].attempt;
    }
    for (int i = 0; i < n; i++)
        if (!c->ranks[mem[i]].lost) send_plan(c, mem[i], gid, att[i], 0, d->full, total, mem, n);
    coh_free(mem);
    coh_free(att);
}

/* ---- relay groups (AdapCC, seeds/004 IV-C) ---- */

static void send_rplan(rx_coord_t *c, int r, const rx_ctl_rplan_t *p)
{
    co_rank_t *cr = &c->ranks[r];
    if (!cr->conn && !cr->lost && p->phase == 1 && p->attempt == 0) {
        /* A relay that has not reached this (elected) coordinator yet: its
         * data connections are up, so it relays once it connects. */
        cr->owed_gid = p->group_id;
        return;
    }
    rx_ctl_msg_t msg = {.type = RX_CTL_RPLAN};
    msg.u.rplan = *p;
    int st = cr->conn ? rx_ctl_send(cr->conn, &msg) : COH_EPEER;
    if (st < 0) declare_lost(c, r, "cannot send it its relay plan");
}

/* Send one plan per rank of `to` (attempts att[]), from copies: sending can
 * declare a rank lost and so end the group. */
static void send_rplans(rx_coord_t *c, rx_ctl_rplan_t *p, const int *to, const uint64_t *att,
                        int nto)
{
    for (int i = 0; i < nto; i++) {
        if (c->ranks[to[i]].lost) continue;
        p->attempt = att[i];
        send_rplan(c, to[i], p);
    }
}

static bool same_op(const rx_ctl_ready_t *a, const rx_ctl_ready_t *b)
{
    return a->count == b->count && a->dtype == b->dtype && a->redop == b->redop &&
           a->plain == b->plain && a->mode == b->mode;
}

/*
 * Launch a relay group: phase 1 is a ring over every live rank, the ready
 * ones (d->members) contributing and the late ones (d->relays) relaying:
 * their reactors forward and reduce the others' data, contributing the
 * op's identity, while their applications still compute. With nobody late
 * (every rank was ready) phase 1 is the whole allreduce.
 */
static void launch_relay(rx_coord_t *c, const sc_decision_t *d)
{
    int m1 = d->nmembers, nl = d->nrelays, n = m1 + nl;
    const rx_ctl_ready_t *first = NULL;
    bool mismatch = false, missing = false;
    double total = 0, wmax = 0;
    for (int i = 0; i < m1; i++) {
        co_rank_t *cr = &c->ranks[d->members[i]];
        if (!cr->has_ready || cr->ready.mode != COH_SYNC_RELAY) {
            missing = true;
            continue;
        }
        if (!first) first = &cr->ready;
        mismatch |= !same_op(&cr->ready, first);
        total += cr->ready.weight;
        if (cr->ready.weight > wmax) wmax = cr->ready.weight;
    }
    for (int i = 0; i < nl; i++) {
        co_rank_t *cr = &c->ranks[d->relays[i]];
        missing |= cr->lost || cr->left || cr->group;
    }
    bool plain = first && first->plain;
    /* Late weights are not known yet: room is left for each to be as large
     * as the largest ready one (a later, larger one only narrows the
     * headroom; the result stays exact for integer-valued data). */
    double west = total + nl * wmax;
    bool bad_weight =
        first && !plain && dtype_is_int(first->dtype) && west > COH_SYNC_WEIGHT_INT_MAX;
    co_group_t *g = coh_zalloc(sizeof(*g));
    int *to = coh_malloc(sizeof(int) * (size_t)n);
    uint64_t *att = coh_calloc((size_t)n, sizeof(uint64_t));
    uint32_t *ring = coh_malloc(sizeof(uint32_t) * (size_t)n);
    if (g) {
        g->members = coh_malloc(sizeof(int) * (size_t)n);
        g->readys = coh_calloc((size_t)n, sizeof(rx_ctl_ready_t));
        g->done = coh_calloc((size_t)n, 1);
        g->rst = coh_calloc((size_t)n, 1);
    }
    if (!g || !g->members || !g->readys || !g->done || !g->rst || !to || !att || !ring ||
        mismatch || missing || bad_weight) {
        if (g && g->members && g->readys && g->done && g->rst && to && att && ring) {
            int st = mismatch ? COH_EMISMATCH : bad_weight ? COH_EINVAL : COH_EPROTO;
            int why = mismatch     ? RX_CTL_WHY_COUNT
                      : bad_weight ? RX_CTL_WHY_WEIGHT
                                   : RX_CTL_WHY_NONE;
            bs_log(COH_LOG_WARN, "coordinator: relay group refused: %s",
                   mismatch     ? "ranks disagree on count, dtype or op"
                   : bad_weight ? "integer weights may sum beyond 2^24"
                                : "a member is not ready or a relay is gone");
            for (int i = 0; i < m1; i++) {
                co_rank_t *cr = &c->ranks[d->members[i]];
                if (!cr->has_ready) continue;
                cr->has_ready = false;
                send_plan(c, d->members[i], 0, cr->ready.attempt, st, why, 0, d->members, m1);
            }
        } else {
            bs_log(COH_LOG_ERROR, "coordinator: out of memory launching a relay group");
        }
        sc_sched_on_group_done(c->sched[COH_SYNC_RELAY], d->group_id, now_s(c), 0);
        if (g) {
            coh_free(g->members);
            coh_free(g->readys);
            coh_free(g->done);
            coh_free(g->rst);
        }
        coh_free(g);
        coh_free(to);
        coh_free(att);
        coh_free(ring);
        return;
    }
    g->gid = new_gid(c);
    g->sgid = d->group_id;
    g->mode = COH_SYNC_RELAY;
    g->n = n;
    g->t_launch = now_s(c);
    g->relay = true;
    g->phase = nl ? 1 : 3;
    g->w1 = plain ? m1 : total;
    if (first && !plain && !dtype_is_int(first->dtype)) {
        int e;
        frexp(west, &e);
        g->exp = e;
    }
    for (int i = 0; i < n; i++) {
        int r = i < m1 ? d->members[i] : d->relays[i - m1];
        co_rank_t *cr = &c->ranks[r];
        g->members[i] = to[i] = r;
        ring[i] = (uint32_t)r;
        if (i < m1) {
            g->readys[i] = cr->ready;
            att[i] = cr->ready.attempt;
            cr->has_ready = false;
        } else {
            g->rst[i] = RL_LATE;
        }
        cr->group = g->gid;
    }
    g->next = c->groups;
    c->groups = g;
    g->ring32 = ring;
    ring = NULL;
    /* Phase 1 as consecutive segments of 256 KiB or more, so a late rank
     * whose data comes during phase 1 joins the segments still to come. */
    uint64_t segs = first->count * coh_dtype_size((coh_dtype)first->dtype) / (256u << 10);
    if (segs > (uint64_t)c->ctx->cfg.relay_segments) segs = (uint64_t)c->ctx->cfg.relay_segments;
    if (segs > first->count) segs = first->count;
    g->nseg = nl && segs > 1 ? (uint32_t)segs : 1;
    rx_ctl_rplan_t p = {.group_id = g->gid,
                        .phase = 1,
                        .final = nl == 0,
                        .count = first->count,
                        .dtype = first->dtype,
                        .redop = first->redop,
                        .plain = first->plain,
                        .exp = g->exp,
                        .total_weight = g->w1,
                        .nring = (uint32_t)n,
                        .nlate = (uint32_t)nl,
                        .nseg = g->nseg,
                        .ring_in = g->ring32,
                        .late_in = g->ring32 + m1};
    g->p1 = p;
    bs_log(COH_LOG_DEBUG, "coordinator: relay group %llu: %d ready, %d relaying",
           (unsigned long long)g->gid, m1, nl);
    send_rplans(c, &p, to, att, n);
    coh_free(to);
    coh_free(att);
    coh_free(ring);
}

/* Every rank has reported phase 1: the result of the ready ranks' data is
 * on every rank, relays included. Phase 2 waits for the late ranks. */
static void relay_phase1_end(rx_coord_t *c, co_group_t *g)
{
    g->t_p1 = now_s(c);
    g->t_first_done = 0;
    if (c->sched[g->mode]) sc_sched_on_phase1_done(c->sched[g->mode], g->sgid, g->t_p1);
    g->phase = 2;
    g->ndone = 0;
    bool partial = false;
    for (int i = 0; i < g->n; i++) {
        g->done[i] = (g->rst[i] & RL_OUT) != 0;
        g->ndone += g->done[i];
        partial |= g->done[i] && relay_partial(g, i);
    }
    if (partial) { /* a member lost during phase 1 had joined it */
        relay_retry_all(c, g);
        return;
    }
    relay_try_phase2(c, g);
}

/*
 * Phase 2, once every late rank is ready or out: the late ranks' data is
 * folded into the phase-1 result by a broadcast around the ring (one late
 * rank) or an allreduce where the others contribute the identity, as the
 * scheduler's cost model says; ranks that are out are not in its ring.
 */
static void relay_try_phase2(rx_coord_t *c, co_group_t *g)
{
    if (g->phase != 2) return;
    for (int i = 0; i < g->n; i++)
        if ((g->rst[i] & RL_LATE) && !(g->rst[i] & (RL_READY | RL_OUT))) return;
    int n = g->n, n2 = 0, k = 0;
    int *to = coh_malloc(sizeof(int) * (size_t)n);
    uint64_t *att = coh_malloc(sizeof(uint64_t) * (size_t)n);
    uint32_t *ring = coh_malloc(sizeof(uint32_t) * (size_t)n * 2);
    int *iring = coh_malloc(sizeof(int) * (size_t)n);
    if (!to || !att || !ring || !iring) {
        coh_free(to);
        coh_free(att);
        coh_free(ring);
        coh_free(iring);
        for (int i = 0; i < n; i++)
            if (!(g->rst[i] & RL_OUT)) declare_lost(c, g->members[i], "out of memory (phase 2)");
        return;
    }
    uint32_t *late = ring + n;
    double total = g->w1;
    const rx_ctl_ready_t *first = NULL;
    for (int i = 0; i < n && !first; i++)
        if (!(g->rst[i] & (RL_OUT | RL_LATE))) first = &g->readys[i];
    if (!first) {
        /* Every ready member is gone, and with them the phase-1 result's
         * data: nobody to finish with. The late ranks' READYs came (or they
         * are out) and are still theirs (deferred): the group ends and they
         * are grouped again. This used to leave the group in phase 3 with
         * no plan sent, and their syncs hung. */
        coh_free(to);
        coh_free(att);
        coh_free(ring);
        coh_free(iring);
        bs_log(COH_LOG_INFO,
               "coordinator: relay group %llu lost every ready member: the late ones are "
               "grouped again",
               (unsigned long long)g->gid);
        relay_retry_all(c, g);
        return;
    }
    for (int i = 0; i < n; i++) {
        if (g->rst[i] & RL_OUT) continue;
        to[n2] = g->members[i];
        iring[n2] = g->members[i];
        att[n2] = g->readys[i].attempt;
        ring[n2++] = (uint32_t)g->members[i];
        if (g->rst[i] & RL_READY) {
            late[k++] = (uint32_t)g->members[i];
            total += g->readys[i].plain ? 1 : g->readys[i].weight;
            c->ranks[g->members[i]].deferred = false; /* its READY is used up here */
        }
    }
    /* Phase 2 covers what the late ranks' data missed: everything for one
     * that joined no segment of phase 1, the segments before its join for
     * one that did. */
    uint64_t prefix = 0;
    for (int i = 0; i < n; i++) {
        if (!(g->rst[i] & RL_READY) || (g->rst[i] & RL_OUT)) continue;
        uint32_t j = g->readys[i].join;
        uint64_t lp = j == RX_JOIN_NONE || j >= g->nseg
                          ? first->count
                          : (uint64_t)((unsigned __int128)first->count * j / g->nseg);
        if (lp > prefix) prefix = lp;
    }
    int method = k && prefix ? sc_sched_phase2_method(c->sched[g->mode], iring, n2, k,
                                                      (double)prefix / (double)first->count)
                             : RX_RELAY_NONE;
    if (method < 0) method = RX_RELAY_ALLREDUCE;
    g->phase = 3;
    g->t_first_done = 0;
    bs_log(COH_LOG_DEBUG, "coordinator: relay group %llu phase 2: %d late folded in (%s), %d out",
           (unsigned long long)g->gid, k,
           method == RX_RELAY_BCAST       ? "broadcast"
           : method == RX_RELAY_ALLREDUCE ? "allreduce"
                                          : "nothing to fold",
           n - n2);
    rx_ctl_rplan_t p = {.group_id = g->gid,
                        .phase = 2,
                        .method = (uint32_t)method,
                        .final = 1,
                        .count = first->count,
                        .dtype = first->dtype,
                        .redop = first->redop,
                        .plain = first->plain,
                        .exp = g->exp,
                        .total_weight = total,
                        .nring = (uint32_t)n2,
                        .nlate = (uint32_t)k,
                        .nseg = g->nseg,
                        .prefix = prefix,
                        .ring_in = ring,
                        .late_in = late};
    send_rplans(c, &p, to, att, n2);
    coh_free(to);
    coh_free(att);
    coh_free(ring);
    coh_free(iring);
}

/* A READY from r while its relay group runs. A late rank's is its data for
 * phase 2; anything else waits for the group's end as usual. Returns true
 * when it was taken. */
static bool relay_ready(rx_coord_t *c, int r, const rx_ctl_ready_t *rd)
{
    co_rank_t *cr = &c->ranks[r];
    co_group_t *g = group_find(c, cr->group);
    if (!g || !g->relay || g->phase > 2) return false;
    int i = 0;
    while (i < g->n && g->members[i] != r) i++;
    if (i == g->n || (g->rst[i] & (RL_READY | RL_OUT)) != 0 || !(g->rst[i] & RL_LATE)) return false;
    const rx_ctl_ready_t *first = NULL;
    for (int j = 0; j < g->n && !first; j++)
        if (!(g->rst[j] & RL_LATE)) first = &g->readys[j];
    if (first && !same_op(rd, first)) {
        bs_log(COH_LOG_WARN, "coordinator: rank %d's READY disagrees with its relay group", r);
        g->rst[i] |= RL_OUT;
        if (g->phase == 2 && !g->done[i]) {
            g->done[i] = 1;
            g->ndone++;
        }
        cr->ready = *rd;
        refuse_rank(c, r, COH_EMISMATCH, RX_CTL_WHY_COUNT, NULL, 0);
        relay_try_phase2(c, g);
        return true;
    }
    g->rst[i] |= RL_READY;
    g->readys[i] = *rd;
    cr->ready = *rd;
    cr->deferred = true; /* should the group fail, it is grouped again */
    sc_sched_t *s = c->sched[g->mode];
    if (s) sc_sched_on_ready(s, r, now_s(c), rd->compute_s);
    relay_try_phase2(c, g);
    return true;
}

/* ---- communicator shrink ---- */

static void shrink_free(co_shrink_t *k)
{
    coh_free(k->ranks);
    coh_free(k->asked);
    coh_free(k);
}

/* Every member of k's communicator asked, or is failed: the new one is the
 * ones that asked and live, in the old order. */
static void shrink_try(rx_coord_t *c, co_shrink_t *k)
{
    for (int i = 0; i < k->n; i++)
        if (!k->asked[i] && !c->ranks[k->ranks[i]].lost) return;
    co_shrink_t **pp = &c->shrinks;
    while (*pp != k) pp = &(*pp)->next;
    *pp = k->next;
    uint32_t *surv = coh_malloc(sizeof(uint32_t) * (size_t)c->world);
    int ns = 0;
    for (int i = 0; surv && i < k->n; i++)
        if (k->asked[i] && !c->ranks[k->ranks[i]].lost) surv[ns++] = (uint32_t)k->ranks[i];
    int nold = ns;
    for (int r = 0; surv && k->grow && r < c->world; r++) {
        /* Restarted ranks that asked come in, in world-rank order. */
        co_rank_t *cr = &c->ranks[r];
        bool in = false;
        for (int i = 0; i < nold; i++) in |= surv[i] == (uint32_t)r;
        if (!cr->joining || !cr->join_asked || cr->lost || !cr->conn || in) continue;
        int at = ns++;
        while (at > 0 && surv[at - 1] > (uint32_t)r) {
            surv[at] = surv[at - 1];
            at--;
        }
        surv[at] = (uint32_t)r;
    }
    rx_ctl_msg_t msg = {.type = RX_CTL_SHRUNK};
    msg.u.shrink = (rx_ctl_shrink_t){.comm = k->comm,
                                     .newcomm = ++c->next_comm,
                                     .status = surv ? 0 : COH_ENOMEM,
                                     .n = surv ? (uint32_t)ns : 0,
                                     .ranks_in = surv};
    bs_log(COH_LOG_INFO, "coordinator: communicator %u %s to %u (%d ranks, %d before)", k->comm,
           k->grow ? "grown" : "shrunk", msg.u.shrink.newcomm, ns, k->n);
    for (int i = 0; i < k->n; i++) {
        co_rank_t *cr = &c->ranks[k->ranks[i]];
        if (k->asked[i] && !cr->lost && cr->conn) rx_ctl_send(cr->conn, &msg);
    }
    for (int i = 0; surv && i < ns; i++) {
        int r = (int)surv[i];
        co_rank_t *cr = &c->ranks[r];
        if (!cr->joining) continue;
        /* Back in the schedule: it syncs with the others from now on. */
        rx_ctl_send(cr->conn, &msg);
        cr->joining = cr->join_asked = false;
        cr->left = false;
        active_add(c, 1);
        for (int md = 0; md < COH_SYNC_MODE_COUNT; md++)
            if (c->sched[md]) sc_sched_on_worker_back(c->sched[md], r, now_s(c));
    }
    coh_free(surv);
    shrink_free(k);
}

static void shrink_try_all(rx_coord_t *c)
{
    for (co_shrink_t *k = c->shrinks, *nx; k; k = nx) {
        nx = k->next;
        shrink_try(c, k);
    }
}

static void shrink_refuse(rx_coord_t *c, int r, uint32_t comm, int status)
{
    rx_ctl_msg_t msg = {.type = RX_CTL_SHRUNK};
    msg.u.shrink = (rx_ctl_shrink_t){.comm = comm, .status = status};
    if (c->ranks[r].conn) rx_ctl_send(c->ranks[r].conn, &msg);
}

static void on_shrink(rx_coord_t *c, int r, const rx_ctl_shrink_t *m, bool grow)
{
    int n = (int)m->n, me = -1;
    if (grow && n == 0 && m->rank == (uint32_t)r) {
        /* A restarted rank: it joins the next grow to complete. */
        if (!c->ranks[r].joining) {
            shrink_refuse(c, r, m->comm, COH_EINVAL);
            return;
        }
        c->ranks[r].join_asked = true;
        if (m->top >= c->next_comm) c->next_comm = m->top;
        return;
    }
    if (m->rank != (uint32_t)r || n < 1 || n > c->world) {
        declare_lost(c, r, "malformed SHRINK");
        return;
    }
    int *ranks = coh_malloc(sizeof(int) * (size_t)n);
    if (!ranks) {
        shrink_refuse(c, r, m->comm, COH_ENOMEM);
        return;
    }
    for (int i = 0; i < n; i++) {
        ranks[i] = (int)en_get32(m->ranks + 4 * i);
        bool bad = ranks[i] < 0 || ranks[i] >= c->world;
        for (int j = 0; j < i && !bad; j++) bad = ranks[j] == ranks[i];
        if (bad) {
            coh_free(ranks);
            declare_lost(c, r, "malformed SHRINK");
            return;
        }
        if (ranks[i] == r) me = i;
    }
    if (me < 0) {
        coh_free(ranks);
        declare_lost(c, r, "SHRINK of a communicator without the sender");
        return;
    }
    /* Ids stay unique across elections: above every id a member knows. */
    if (m->top >= c->next_comm) c->next_comm = m->top;
    co_shrink_t *k = c->shrinks;
    while (k && k->comm != m->comm) k = k->next;
    if (k &&
        (k->grow != grow || k->n != n || memcmp(k->ranks, ranks, sizeof(int) * (size_t)n) != 0)) {
        coh_free(ranks);
        shrink_refuse(c, r, m->comm, COH_EMISMATCH);
        return;
    }
    if (!k) {
        k = coh_zalloc(sizeof(*k));
        uint8_t *asked = coh_calloc((size_t)n, 1);
        if (!k || !asked) {
            coh_free(k);
            coh_free(asked);
            coh_free(ranks);
            shrink_refuse(c, r, m->comm, COH_ENOMEM);
            return;
        }
        *k = (co_shrink_t){.next = c->shrinks,
                           .grow = grow,
                           .comm = m->comm,
                           .n = n,
                           .ranks = ranks,
                           .asked = asked};
        c->shrinks = k;
    } else {
        coh_free(ranks);
    }
    k->asked[me] = 1;
    shrink_try(c, k);
}

/* ---- alpha-beta probe results (coh_probe) ---- */

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* What rank r measured of its links: each peer's rate (a link shows the
 * slower of its two ends, so a rank's own rate is the best of its links,
 * summed over the rails) and the cost model's alpha (the median latency);
 * the rail balancer gets each rail's slowest link. */
static void on_probe(rx_coord_t *c, int r, const rx_ctl_probe_t *p)
{
    if (p->rank != (uint32_t)r || p->n > (uint32_t)c->world * RX_MAX_RAILS) {
        declare_lost(c, r, "malformed PROBE");
        return;
    }
    if (!p->n) return;
    double *lat = coh_malloc(sizeof(double) * p->n);
    double best[RX_MAX_RAILS] = {0}, worst[RX_MAX_RAILS], alpha_r[RX_MAX_RAILS] = {0};
    int nr[RX_MAX_RAILS] = {0};
    for (int i = 0; i < RX_MAX_RAILS; i++) worst[i] = INFINITY;
    for (uint32_t i = 0; i < p->n; i++) {
        rx_ctl_link_t l;
        rx_ctl_probe_link(p, i, &l);
        if (l.peer >= (uint32_t)c->world || l.rail >= RX_MAX_RAILS) continue;
        if (lat) lat[i] = l.latency_s;
        if (l.gbps > best[l.rail]) best[l.rail] = l.gbps;
        if (l.gbps > 0 && l.gbps < worst[l.rail]) worst[l.rail] = l.gbps;
        alpha_r[l.rail] += l.latency_s;
        nr[l.rail]++;
    }
    double bw = 0;
    for (int k = 0; k < RX_MAX_RAILS; k++) {
        bw += best[k];
        if (nr[k] && worst[k] < INFINITY)
            rx_lb_probe(c->ctx, k, alpha_r[k] / nr[k], worst[k], c->world);
    }
    if (lat) {
        qsort(lat, p->n, sizeof(double), cmp_d);
        c->probe_alpha_s = lat[p->n / 2];
        coh_free(lat);
    }
    co_rank_t *cr = &c->ranks[r];
    sc_rate_probe(&cr->bw, bw);
    for (int md = 0; md < COH_SYNC_MODE_COUNT; md++) {
        if (!c->sched[md]) continue;
        if (bw > 0) sc_sched_on_bandwidth(c->sched[md], r, bw);
        if (c->probe_alpha_s > 0) sc_sched_set_alpha(c->sched[md], c->probe_alpha_s);
    }
    bs_log(COH_LOG_INFO, "coordinator: probe from rank %d: %.3f Gbps, alpha %.1f us (%u links)", r,
           bw, c->probe_alpha_s * 1e6, p->n);
}

static void tick_all(rx_coord_t *c)
{
    double t = now_s(c);
    for (int m = 0; m < COH_SYNC_MODE_COUNT; m++) {
        sc_sched_t *s = c->sched[m];
        if (!s) continue;
        sc_tick_t out;
        if (sc_sched_tick(s, t, &out) < 0) continue;
        /* Decisions live until the next call on the scheduler: copy the
         * launches first, since launching calls into it. */
        int nl = 0;
        for (int i = 0; i < out.ndec; i++) nl += out.dec[i].kind != SC_DEC_WAIT;
        if (!nl) continue;
        sc_decision_t *dec = coh_malloc(sizeof(sc_decision_t) * (size_t)nl);
        int **mem = coh_calloc((size_t)nl, sizeof(int *));
        if (!dec || !mem) {
            coh_free(dec);
            coh_free(mem);
            continue;
        }
        int k = 0;
        for (int i = 0; i < out.ndec; i++) {
            if (out.dec[i].kind == SC_DEC_WAIT) continue;
            dec[k] = out.dec[i];
            mem[k] = coh_malloc(sizeof(int) * (size_t)(dec[k].nmembers ? dec[k].nmembers : 1));
            if (mem[k]) memcpy(mem[k], dec[k].members, sizeof(int) * (size_t)dec[k].nmembers);
            dec[k].members = mem[k];
            k++;
        }
        for (int i = 0; i < k; i++) {
            if (!mem[i]) continue;
            if (dec[i].kind != SC_DEC_WAIT && c->ctx->trace) trace_decision(c, m, &dec[i]);
            if (dec[i].kind == SC_DEC_LAUNCH) {
                char line[256];
                if (sc_decision_explain(&dec[i], line, sizeof(line)) > 0)
                    bs_log(COH_LOG_DEBUG, "coordinator: %s", line);
                if (m == COH_SYNC_RELAY)
                    launch_relay(c, &dec[i]);
                else
                    launch(c, m, &dec[i]);
            } else if (dec[i].kind == SC_DEC_SUSPECT && dec[i].nmembers > 0 &&
                       dec[i].members[0] == c->ctx->rank) {
                /* This process coordinates, so it is alive: a late
                 * application thread of its own is bounded by the op
                 * timeout after phase 1 instead (excluding itself cut the
                 * job in two in 2 of 50 CI trials on a loaded host). */
                bs_log(COH_LOG_WARN, "coordinator: its own rank missed T_fault: not excluded");
            } else if (dec[i].kind == SC_DEC_SUSPECT && dec[i].nmembers > 0) {
                /* AdapCC's T_fault: taken for failed, excluded by everybody
                 * (its data connections are dropped as for a hung rank). */
                declare_lost_as(c, dec[i].members[0], RX_LOST_FAULT, 0,
                                "missed its fault deadline (T_fault)");
            }
            coh_free(mem[i]);
        }
        coh_free(mem);
        coh_free(dec);
    }
}

static void apply_ready(rx_coord_t *c, int r)
{
    co_rank_t *cr = &c->ranks[r];
    const rx_ctl_ready_t *rd = &cr->ready;
    if (cr->owe_mode) {
        /* Ranks disagreed on the mode: every rank's current or next sync
         * fails, naming a rank that asked for another mode. */
        cr->owe_mode = false;
        int k = c->mode_mode[1] != rd->mode ? 1 : 0;
        int detail[2] = {c->mode_rank[k], (int)c->mode_mode[k]};
        refuse_rank(c, r, COH_EMISMATCH, RX_CTL_WHY_MODE, detail, 2);
        /* Not ready any more, but still in the schedule: the next syncs wait
         * for it as before (taking it out let the first ranks back form
         * groups without it). Lost and back again resets its READY. */
        for (int md = 0; md < COH_SYNC_MODE_COUNT; md++)
            if (c->sched[md]) {
                sc_sched_on_worker_lost(c->sched[md], r);
                sc_sched_on_worker_back(c->sched[md], r, now_s(c));
            }
        return;
    }
    /* A rank that left while its last group still ran is still linked to
     * that group in the scheduler when it comes back: it rejoins the
     * schedule here, once the group is over (deferred READYs run after
     * sc_sched_on_group_done). Returning a sync of such a rank EPEER was a
     * race (test_sync.py test_sync_leave_and_come_back, 2 in 60 runs). */
    if (!cr->left)
        for (int md = 0; md < COH_SYNC_MODE_COUNT; md++)
            if (c->sched[md]) sc_sched_on_worker_back(c->sched[md], r, now_s(c));
    sc_sched_t *s = sched_for(c, (int)rd->mode, rd);
    /* The compute time BPAWR learns is the one it predicts with: from the
     * rank's DONE to its READY as both came here, so the transit and
     * handling of each (tens of ms with 32 ranks on 2 cores) count alike in
     * what it learns and in how long a rank has been computing. The rank's
     * own figure before it has a DONE here. */
    double cs = rd->compute_s;
    if (rd->mode != COH_SYNC_RELAY && cr->t_done > 0 && cr->t_ready_in >= cr->t_done)
        cs = cr->t_ready_in - cr->t_done;
    cr->t_done = 0; /* used: a READY with no DONE before it (a retry) counts its own */
    int st = cr->left ? COH_ESTATE : s ? sc_sched_on_ready(s, r, now_s(c), cs) : COH_ENOMEM;
    if (st < 0) {
        /* The scheduler has this rank out of the schedule (or lost): tell it
         * rather than leave it waiting. */
        refuse_rank(c, r, st == COH_ESTATE ? COH_EPEER : st, RX_CTL_WHY_OUT, NULL, 0);
        return;
    }
    cr->has_ready = true;
    cr->t_ready_ns = bs_now_ns();
}

/* The mode a rank waits to be grouped in, or -1. Only waiting ranks can end
 * up in one group, so only theirs must agree: a rank whose group is already
 * planned is not compared. (It was: a group's last DONE can reach this
 * reactor after another rank, past the collective that followed the sync,
 * is READY in the next mode; that rank was refused with a false EMISMATCH,
 * found by cohort-load switching modes across collectives.) */
static int mode_of(rx_coord_t *c, int r)
{
    co_rank_t *cr = &c->ranks[r];
    if (cr->lost || cr->left) return -1;
    if (cr->has_ready || cr->deferred) return (int)cr->ready.mode;
    return -1;
}

/* A READY in `mode` from r while another rank syncs in a different one:
 * remember the pair, and fail every rank's current or next sync. */
static void check_mode(rx_coord_t *c, int r, uint32_t mode)
{
    int other = -1, om = -1;
    for (int k = 0; k < c->world && other < 0; k++) {
        int m = k == r ? -1 : mode_of(c, k);
        if (m >= 0 && (uint32_t)m != mode) {
            other = k;
            om = m;
        }
    }
    if (other < 0) return;
    bs_log(COH_LOG_ERROR, "coordinator: ranks disagree on the sync mode: rank %d %s, rank %d %s",
           other, coh_sync_mode_name((coh_sync_mode)om), r,
           coh_sync_mode_name((coh_sync_mode)mode));
    c->mode_rank[0] = other;
    c->mode_mode[0] = (uint32_t)om;
    c->mode_rank[1] = r;
    c->mode_mode[1] = mode;
    for (int k = 0; k < c->world; k++)
        if (!c->ranks[k].lost) c->ranks[k].owe_mode = true;
    for (int k = 0; k < c->world; k++)
        if (c->ranks[k].has_ready) {
            c->ranks[k].has_ready = false;
            apply_ready(c, k); /* refuses it (owe_mode) */
        }
}

/* ---- messages ---- */

static void on_msg(rx_conn_t *conn, const rx_ctl_msg_t *m)
{
    rx_coord_t *c = conn->owner;
    int r = conn->peer;
    co_rank_t *cr = &c->ranks[r];
    switch (m->type) {
    case RX_CTL_READY: {
        const rx_ctl_ready_t *rd = &m->u.ready;
        if ((int)rd->rank != r || rd->mode >= COH_SYNC_MODE_COUNT || rd->dtype >= COH_DTYPE_COUNT ||
            !(rd->weight >= COH_SYNC_WEIGHT_MIN && rd->weight <= COH_SYNC_WEIGHT_MAX) ||
            cr->has_ready) {
            declare_lost(c, r, "malformed or duplicate READY");
            return;
        }
        cr->ready = *rd;
        cr->t_ready_in = now_s(c);
        if (cr->joining) {
            /* Restarted, not grown into a communicator yet: no syncs. */
            refuse_rank(c, r, COH_EPEER, RX_CTL_WHY_OUT, NULL, 0);
            return;
        }
        if (rd->last_gid > c->max_seen_gid) c->max_seen_gid = rd->last_gid;
        check_mode(c, r, rd->mode);
        if (rd->plain) {
            /* A relay allreduce is a collective: every rank that has not
             * failed takes part, whether or not it left the sync schedule. */
            for (int k = 0; k < c->world; k++) {
                co_rank_t *o = &c->ranks[k];
                if (k == r || !o->left || o->lost || o->bye || !o->conn || o->joining) continue;
                o->left = false;
                active_add(c, 1);
                for (int md = 0; md < COH_SYNC_MODE_COUNT; md++)
                    if (c->sched[md]) sc_sched_on_worker_back(c->sched[md], k, now_s(c));
            }
        }
        if (cr->left && !cr->owe_mode) {
            /* A rank that left syncs again: back in the schedule. */
            cr->left = false;
            active_add(c, 1);
            for (int md = 0; md < COH_SYNC_MODE_COUNT; md++)
                if (c->sched[md]) sc_sched_on_worker_back(c->sched[md], r, now_s(c));
        }
        if (cr->group) {
            if (relay_ready(c, r, rd)) break;
            cr->deferred = true; /* its group ends when the last DONE arrives */
            return;
        }
        apply_ready(c, r);
        break;
    }
    case RX_CTL_DONE: {
        const rx_ctl_done_t *d = &m->u.done;
        if ((int)d->rank != r) {
            declare_lost(c, r, "DONE for another rank");
            return;
        }
        /* What this rank measured of its peers' links. */
        for (uint32_t i = 0; i < d->nbw; i++) {
            const rx_ctl_bw_t *b = &d->bw[i];
            if (b->peer >= (uint32_t)c->world || b->seconds <= 0 || b->bytes == 0) continue;
            double gbps = (double)b->bytes * 8 / b->seconds / 1e9;
            co_rank_t *pr = &c->ranks[b->peer];
            /* A frame from `peer` crosses both ends' links: it measures the
             * slower of the two, not peer's own (sc_rate_t weighs them). */
            sc_rate_frame(&pr->bw, gbps);
            double est = sc_rate_get(&pr->bw);
            bs_log(COH_LOG_DEBUG, "coordinator: rank %u sent at %.3f Gbps, estimate %.3f", b->peer,
                   gbps, est);
            for (int md = 0; md < COH_SYNC_MODE_COUNT; md++)
                if (c->sched[md]) sc_sched_on_bandwidth(c->sched[md], (int)b->peer, est);
        }
        co_group_t *g = group_find(c, d->group_id);
        if (g) member_done(c, g, r, d->status, d->duration_s);
        break;
    }
    case RX_CTL_REFUSE: {
        const rx_ctl_refuse_t *f = &m->u.refuse;
        co_group_t *g = group_find(c, f->group_id);
        if ((int)f->rank != r || !g || f->gone >= (uint32_t)c->world) return;
        for (int i = 0; i < g->n; i++)
            if (g->members[i] == r) {
                cr->ready = g->readys[i]; /* group it again once this group is over */
                cr->deferred = true;
            }
        char why[96];
        snprintf(why, sizeof(why), "rank %d reported it gone", r);
        uint64_t gid = g->gid;
        declare_lost_as(c, (int)f->gone, RX_LOST_REPORTED, 0, why); /* may end the group */
        if ((g = group_find(c, gid)) != NULL) member_done(c, g, r, 0, 0);
        break;
    }
    case RX_CTL_LEAVE:
        if (m->u.leave_rank != (uint32_t)r) {
            declare_lost(c, r, "LEAVE for another rank");
            return;
        }
        take_out(c, r);
        break;
    case RX_CTL_PING: break; /* heard (on_bytes) is all it says */
    case RX_CTL_SHRINK: on_shrink(c, r, &m->u.shrink, false); return;
    case RX_CTL_GROW: on_shrink(c, r, &m->u.shrink, true); return;
    case RX_CTL_PROBE: on_probe(c, r, &m->u.probe); return;
    case RX_CTL_STATE: {
        const rx_ctl_state_t *st = &m->u.state;
        if ((int)st->rank != r) {
            declare_lost(c, r, "STATE for another rank");
            return;
        }
        cr->stated = true;
        cr->committed = st->committed;
        cr->awaiting = st->awaiting;
        if (st->committed > c->max_committed) c->max_committed = st->committed;
        if (st->committed > c->max_seen_gid) c->max_seen_gid = st->committed;
        if (st->awaiting > c->max_seen_gid) c->max_seen_gid = st->awaiting;
        resolve_awaiting(c);
        return;
    }
    case RX_CTL_BYE:
        if (m->u.bye_rank != (uint32_t)r) {
            declare_lost(c, r, "BYE for another rank");
            return;
        }
        cr->bye = true;
        take_out(c, r);
        resolve_awaiting(c);
        break;
    case RX_CTL_RAIL:
        if (m->u.rail.rank != (uint32_t)r) {
            declare_lost(c, r, "RAIL for another rank");
            return;
        }
        rx_lb_on_rail(c->ctx, r, &m->u.rail);
        return; /* nothing for the scheduler */
    default: declare_lost(c, r, "unexpected message");
    }
    tick_all(c);
}

static void on_tick(uv_timer_t *t);

/* The scheduler's period (COHORT_TICK_MS), or, while no rank waits for a
 * decision and no group runs, one that only keeps the liveness checks in
 * time: an idle job's coordinator woke 500 times a second. Every message
 * brings the fast one back before it is handled. */
static void tick_pace(rx_coord_t *c, bool slow)
{
    if (c->tick_slow == slow || c->dormant || c->closing) return;
    c->tick_slow = slow;
    uint64_t p = (uint64_t)(c->ctx->cfg.tick_ms > 0 ? c->ctx->cfg.tick_ms : 2);
    int live = c->ctx->cfg.liveness_ms;
    if (slow) {
        uint64_t s = live > 0 && live / 10 < 100 ? (uint64_t)live / 10 : 100;
        if (s > p) p = s;
    }
    uv_timer_start(&c->tick, on_tick, p, p);
}

/* Nothing time-based to decide: no READY waiting, no group, no shrink. */
static bool coord_idle(const rx_coord_t *c)
{
    if (c->groups || c->shrinks) return false;
    for (int r = 0; r < c->world; r++) {
        const co_rank_t *cr = &c->ranks[r];
        if (cr->has_ready || cr->deferred || cr->awaiting) return false;
    }
    return true;
}

static int on_bytes(rx_conn_t *conn, const uint8_t *buf, size_t len)
{
    rx_coord_t *c = conn->owner;
    rx_ctl_msg_t m;
    int n = rx_ctl_parse(buf, len, &m);
    if (n <= 0) return n;
    if (m.type != RX_CTL_PING) tick_pace(c, false);
    if (conn->peer >= 0 && conn->peer < c->world) c->ranks[conn->peer].t_heard_ns = bs_now_ns();
    on_msg(conn, &m);
    return n;
}

static void on_ready(rx_conn_t *conn)
{
    rx_coord_t *c = conn->owner;
    int peer = conn->peer;
    bool rejoin = (conn->peer_flags & EN_HELLO_REJOIN) != 0;
    if (c->dormant) {
        /* A member elected this rank. Only if this rank has lost the
         * coordinator too: otherwise that member is the one cut off. A
         * restarted rank looking for the coordinator is told no either. */
        if (rejoin || rx_member_has_coordinator(c->ctx)) {
            /* BYE first: the member asks again shortly, rather than taking
             * this rank for failed. */
            rx_ctl_msg_t bye = {.type = RX_CTL_BYE};
            bye.u.bye_rank = (uint32_t)c->ctx->rank;
            rx_ctl_send(conn, &bye);
            rx_conn_close(conn, COH_EPEER, "not the coordinator: this rank still has one");
            return;
        }
        rx_coord_activate(c, -1);
    }
    if (rejoin && peer >= 0 && peer < c->world && c->ranks[peer].lost && !c->ranks[peer].conn) {
        /* A failed rank restarted: a new incarnation, out of the schedule
         * until a coh_comm_grow takes it in (the old one's state goes). */
        co_rank_t *cr = &c->ranks[peer];
        /* (stated: it awaits no relay group of the others) */
        *cr = (co_rank_t){.joining = true, .left = true, .stated = true};
        bs_log(COH_LOG_WARN, "coordinator: rank %d restarted and rejoins", peer);
        cr->conn = conn;
        cr->t_heard_ns = bs_now_ns();
        return;
    }
    if (peer < 0 || peer >= c->world || c->ranks[peer].conn || c->ranks[peer].lost || rejoin) {
        rx_conn_close(conn, COH_EPROTO,
                      rejoin ? "a rank that has not failed cannot rejoin"
                             : "duplicate or unknown rank");
        return;
    }
    c->ranks[peer].conn = conn;
    c->ranks[peer].t_heard_ns = bs_now_ns();
    active_add(c, 1);
    uint64_t owed = c->ranks[peer].owed_gid;
    c->ranks[peer].owed_gid = 0;
    co_group_t *og = owed ? group_find(c, owed) : NULL;
    if (og && og->relay && og->phase == 1) {
        rx_ctl_rplan_t p = og->p1;
        p.attempt = 0;
        send_rplan(c, peer, &p);
    }
    rx_lb_greet(c->ctx, conn); /* the rail tables published before it was here */
}

static void on_close(rx_conn_t *conn, int status, const char *why)
{
    (void)status;
    rx_coord_t *c = conn->owner;
    int r = conn->peer;
    if (!conn->ready || r < 0 || r >= c->world || c->ranks[r].conn != conn) {
        if (!c->closing) bs_log(COH_LOG_WARN, "coordinator: dropped a connection: %s", why);
        return;
    }
    if (c->closing) {
        c->ranks[r].conn = NULL;
        return;
    }
    char msg[160];
    snprintf(msg, sizeof(msg), "control connection closed (%s)", why);
    /* counts it out of `active` while conn is still set */
    declare_lost_as(c, r, RX_LOST_CLOSED, 0, msg);
    c->ranks[r].conn = NULL;
    tick_all(c);
}

static const rx_conn_proto_t coord_proto = RX_CTL_PROTO_INIT(on_bytes, on_ready, on_close);

/* Heartbeats out; ranks silent for liveness_ms are hung (SIGSTOP, a frozen
 * host: their sockets stay open) and are dropped by everybody. */
static void check_liveness(rx_coord_t *c, uint64_t now)
{
    uint64_t live = (uint64_t)c->ctx->cfg.liveness_ms * 1000000ull;
    if (!live) return;
    if (now - c->t_ping_ns >= live / 5) {
        c->t_ping_ns = now;
        rx_ctl_msg_t ping = {.type = RX_CTL_PING};
        ping.u.ping_rank = (uint32_t)c->ctx->rank;
        for (int r = 0; r < c->world; r++)
            if (c->ranks[r].conn && !c->ranks[r].lost) {
                rx_ctl_send(c->ranks[r].conn, &ping);
                rx_coord_beat(c, &c->ctx->ctrl_addrs[r], RX_BEAT_TO_MEMBER);
            }
    }
    for (int r = 0; r < c->world && c->elected; r++) {
        /* After an election: a rank that never connects is gone too. */
        co_rank_t *cr = &c->ranks[r];
        if (cr->conn || cr->lost || cr->bye || now - c->t_active_ns <= live) continue;
        declare_lost_as(c, r, RX_LOST_SILENT, (uint32_t)((now - c->t_active_ns) / 1000000ull),
                        "never reached the elected coordinator");
    }
    for (int r = 0; r < c->world; r++) {
        co_rank_t *cr = &c->ranks[r];
        if (!cr->conn || cr->lost || now - cr->t_heard_ns <= live) continue;
        /* Unread, not silent: this thread stalled (stopped, or busy
         * reducing) and the loop reads after this timer. */
        if (rx_conn_input_pending(cr->conn)) continue;
        uint32_t ms = (uint32_t)((now - cr->t_heard_ns) / 1000000ull);
        char why[96];
        snprintf(why, sizeof(why), "unresponsive: nothing heard for %u ms", ms);
        declare_lost_as(c, r, RX_LOST_SILENT, ms, why);
    }
}

/* A rank waiting for a group longer than the op timeout: the live ranks
 * that have not come to their sync hold it up. They leave the schedule
 * until their next sync (as with coh_sync_leave) and the waiting ranks are
 * grouped without them. Should a rank still wait twice as long, its sync
 * fails with ETIMEDOUT rather than never ending. */
static void check_waiting(rx_coord_t *c, uint64_t now)
{
    uint64_t limit = (uint64_t)c->ctx->cfg.timeout_ms * 1000000ull;
    int stuck = -1;
    for (int r = 0; r < c->world && stuck < 0; r++)
        if (c->ranks[r].has_ready && now - c->ranks[r].t_ready_ns > limit) stuck = r;
    if (stuck < 0) return;
    int out = 0;
    /* A relay allreduce does not go on without a rank that is only slow
     * (T_fault and the liveness check exclude the failed ones): after twice
     * the timeout it fails with ETIMEDOUT, as coh_allreduce would. */
    if (c->ranks[stuck].ready.plain) out = -1;
    for (int r = 0; r < c->world && out >= 0; r++) {
        co_rank_t *cr = &c->ranks[r];
        if (cr->lost || cr->left || cr->has_ready || cr->deferred || cr->group || !cr->conn)
            continue;
        bs_log(COH_LOG_WARN,
               "coordinator: rank %d has not come to its sync while rank %d waited %d ms: out of "
               "the schedule until its next sync",
               r, stuck, c->ctx->cfg.timeout_ms);
        take_out(c, r);
        out++;
    }
    if (out > 0) {
        tick_all(c);
        return;
    }
    for (int r = 0; r < c->world; r++) {
        co_rank_t *cr = &c->ranks[r];
        if (!cr->has_ready || now - cr->t_ready_ns <= 2 * limit) continue;
        refuse_rank(c, r, COH_ETIMEDOUT, RX_CTL_WHY_NONE, NULL, 0);
        take_out(c, r);
    }
}

static void on_tick(uv_timer_t *t)
{
    rx_coord_t *c = t->data;
    uint64_t now = bs_now_ns();
    check_liveness(c, now);
    tick_all(c);
    check_waiting(c, now);
    /* A group where someone failed and others never report (a hung rank)
     * ends after twice the op timeout: the silent ones are out (below). */
    double tnow = now_s(c), limit = c->ctx->cfg.timeout_ms / 1e3;
    /* A relay group whose late ranks are still not ready an op timeout
     * after phase 1 (T_fault off, or no verdict): phase 2 goes on without
     * them; they leave the schedule until their next sync. */
    for (co_group_t *g = c->groups; g; g = g->next) {
        if (!g->relay || g->phase != 2 || tnow - g->t_p1 < limit) continue;
        for (int i = 0; i < g->n; i++)
            if ((g->rst[i] & RL_LATE) && !(g->rst[i] & (RL_READY | RL_OUT))) {
                bs_log(COH_LOG_WARN,
                       "coordinator: rank %d not ready %d ms after phase 1 of relay group %llu: "
                       "phase 2 goes on without it",
                       g->members[i], c->ctx->cfg.timeout_ms, (unsigned long long)g->gid);
                /* A relay allreduce's late rank would otherwise come with
                 * data for a collective that is over: it is failed. */
                if (g->readys[0].plain) /* members[0] was ready at the launch */
                    declare_lost_as(c, g->members[i], RX_LOST_FAULT, 0,
                                    "not ready an op timeout after phase 1");
                else
                    take_out(c, g->members[i]);
                break; /* the group may have moved on: next tick continues */
            }
        break;
    }
    for (co_group_t *g = c->groups; g; g = g->next) {
        if (!g->relay || g->status != 0 || (g->phase != 1 && g->phase != 3) || !g->t_first_done ||
            tnow - g->t_first_done < 2 * limit)
            continue;
        relay_stuck(c, g);
        break; /* the list changed: next tick continues */
    }
    /* Twice the op timeout: a member whose op waits on peers that gave up
     * fails by the op timeout itself (no progress), and its DONE must not
     * race this rule (a relay's op, its neighbours not the dead rank, ended
     * right at the limit and the live relay was excluded). Hung ranks are
     * the liveness check's. */
    for (co_group_t *g = c->groups; g; g = g->next) {
        if (g->status == 0 || tnow - g->t_first_fail < 2 * limit) continue;
        for (int i = 0; i < g->n; i++)
            if (!g->done[i]) {
                /* One lost already will not report either: counted so. */
                if (c->ranks[g->members[i]].lost)
                    member_done(c, g, g->members[i], COH_EPEER, 0);
                else
                    declare_lost_as(c, g->members[i], RX_LOST_SILENT, 0,
                                    "silent after its group failed");
                break; /* the group may be gone now: next tick continues */
            }
        break;
    }
    tick_pace(c, coord_idle(c));
}

/* ---- BEAT datagrams ---- */

typedef struct co_beat {
    uv_udp_t udp;
    rx_coord_t *c; /* NULL once the coordinator closed */
    uint8_t buf[64];
} co_beat_t;

static void beat_closed(uv_handle_t *h)
{
    coh_free(h->data);
}

static void beat_alloc(uv_handle_t *h, size_t want, uv_buf_t *b)
{
    (void)want;
    co_beat_t *bt = h->data;
    *b = uv_buf_init((char *)bt->buf, sizeof(bt->buf));
}

/* A beat counts only from the sender's own control address: strangers
 * without the token cannot make one, and the address pins the rank. */
static void beat_recv(uv_udp_t *h, ssize_t n, const uv_buf_t *b, const struct sockaddr *from,
                      unsigned flags)
{
    co_beat_t *bt = h->data;
    rx_coord_t *c = bt->c;
    if (n <= 0 || !from || !c || !c->beats_ok || (flags & UV_UDP_PARTIAL)) return;
    struct coh_ctx *ctx = c->ctx;
    rx_beat_kind kind;
    uint32_t r;
    if (rx_beat_decode((const uint8_t *)b->base, (size_t)n, (uint32_t)c->world, c->beat_value,
                       &kind, &r) != 0)
        return;
    struct sockaddr_storage fa = {0};
    memcpy(&fa, from,
           from->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in));
    if (!en_sa_same(&fa, &ctx->ctrl_addrs[r])) return;
    uint64_t now = bs_now_ns();
    if (kind == RX_BEAT_TO_MEMBER) {
        rx_member_heard(ctx, (int)r, now);
    } else if (!c->dormant && c->ranks[r].conn && !c->ranks[r].lost) {
        c->ranks[r].t_heard_ns = now;
    }
}

static void beat_open(rx_coord_t *c)
{
    co_beat_t *bt = coh_zalloc(sizeof(*bt));
    if (!bt) return;
    bt->c = c;
    bt->udp.data = bt;
    uv_udp_init(&c->rx->loop, &bt->udp);
    int e = uv_udp_bind(&bt->udp, (const struct sockaddr *)&c->addr, 0);
    if (!e) e = uv_udp_recv_start(&bt->udp, beat_alloc, beat_recv);
    if (e) {
        bs_log(COH_LOG_INFO, "rank %d: no heartbeat datagrams (%s): liveness rides TCP alone",
               c->ctx->rank, uv_strerror(e));
        uv_close((uv_handle_t *)&bt->udp, beat_closed);
        return;
    }
    c->beat_value = rx_beat_value(c->ctx->token_s);
    c->beat = bt;
}

void rx_coord_beats_ready(rx_coord_t *c)
{
    if (c) c->beats_ok = true;
}

void rx_coord_beat(rx_coord_t *c, const struct sockaddr_storage *to, rx_beat_kind kind)
{
    if (!c || !c->beat || !c->beats_ok || c->closing || to->ss_family == 0) return;
    uint8_t b[RX_BEAT_LEN];
    rx_beat_encode(b, kind, (uint32_t)c->ctx->rank, (uint32_t)c->world, c->beat_value);
    uv_buf_t ub = uv_buf_init((char *)b, sizeof(b));
    /* Best effort: a full socket buffer skips one beat. */
    (void)uv_udp_try_send(&c->beat->udp, &ub, 1, (const struct sockaddr *)to);
}

static void tick_closed(uv_handle_t *h)
{
    rx_coord_t *c = h->data;
    for (int m = 0; m < COH_SYNC_MODE_COUNT; m++) sc_sched_destroy(c->sched[m]);
    while (c->groups) {
        co_group_t *g = c->groups;
        c->groups = g->next;
        coh_free(g->members);
        coh_free(g->readys);
        coh_free(g->done);
        coh_free(g->rst);
        coh_free(g->ring32);
        coh_free(g);
    }
    while (c->shrinks) {
        co_shrink_t *k = c->shrinks;
        c->shrinks = k->next;
        shrink_free(k);
    }
    coh_free(c->ranks);
    uv_cond_destroy(&c->idle);
    uv_mutex_destroy(&c->mu);
    coh_free(c);
}

void rx_coord_close(rx_coord_t *c)
{
    if (!c || c->closing) return;
    /* The members still connected: this close is a finalize, not a failure. */
    rx_ctl_msg_t bye = {.type = RX_CTL_BYE};
    bye.u.bye_rank = (uint32_t)c->ctx->rank;
    for (int r = 0; r < c->world; r++)
        if (c->ranks[r].conn && !c->ranks[r].lost) rx_ctl_send(c->ranks[r].conn, &bye);
    c->closing = true;
    /* Closes every connection accepted on it; their on_close runs now. */
    rx_listener_close(c->listener);
    c->listener = NULL;
    if (c->beat) {
        c->beat->c = NULL;
        uv_close((uv_handle_t *)&c->beat->udp, beat_closed);
        c->beat = NULL;
    }
    uv_close((uv_handle_t *)&c->tick, tick_closed);
}

void rx_coord_activate(rx_coord_t *c, int old)
{
    if (!c || !c->dormant || c->closing) return;
    c->dormant = false;
    c->elected = true;
    c->t_active_ns = bs_now_ns();
    /* Cold: the ranks this rank knows failed are out; the others come
     * back with their next READY. */
    for (int r = 0; r < c->world; r++)
        if (r != c->ctx->rank && (r == old || rx_ctx_is_failed(c->ctx, r))) c->ranks[r].lost = true;
    bs_log(COH_LOG_WARN, "rank %d: now the coordinator (elected)", c->ctx->rank);
    uint64_t period = (uint64_t)(c->ctx->cfg.tick_ms > 0 ? c->ctx->cfg.tick_ms : 2);
    uv_timer_start(&c->tick, on_tick, period, period);
}

int rx_coord_start(struct coh_ctx *ctx, rx_reactor_t *rx, bool active, rx_coord_t **out)
{
    rx_coord_t *c = coh_zalloc(sizeof(*c));
    if (!c) return bs_fail(COH_ENOMEM, "coordinator: out of memory");
    c->ctx = ctx;
    c->rx = rx;
    c->world = ctx->world;
    c->t0_ns = bs_now_ns();
    c->ranks = coh_calloc((size_t)ctx->world, sizeof(co_rank_t));
    if (!c->ranks) {
        coh_free(c);
        return bs_fail(COH_ENOMEM, "coordinator: out of memory");
    }
    /* A warm-start trace's rates are measurements like a probe's: they
     * stand until the frames contradict them (sc_rate_t). */
    const rx_sched_cfg_t *sc = &ctx->sched_cfg;
    for (int r = 0; r < c->world && sc->trace_bw; r++)
        sc_rate_probe(&c->ranks[r].bw, sc->trace_bw[r]);
    uv_mutex_init(&c->mu);
    uv_cond_init(&c->idle);
    uv_timer_init(&rx->loop, &c->tick);
    c->tick.data = c;
    struct sockaddr_storage a = ctx->rail_addr[0]; /* port 0: any */
    int st = rx_listener_start(&rx->loop, (struct sockaddr *)&a, -1, &coord_proto, c, ctx->token_s,
                               ctx->rank, ctx->world, &c->listener);
    if (st < 0) {
        c->closing = true;
        uv_close((uv_handle_t *)&c->tick, tick_closed);
        return st;
    }
    c->addr = c->listener->addr;
    beat_open(c);
    c->dormant = !active;
    c->t_active_ns = bs_now_ns();
    uint64_t period = (uint64_t)(ctx->cfg.tick_ms > 0 ? ctx->cfg.tick_ms : 2);
    if (active) uv_timer_start(&c->tick, on_tick, period, period);
    *out = c;
    return 0;
}

void rx_coord_wait_idle(rx_coord_t *c, uint64_t deadline_ns)
{
    uv_mutex_lock(&c->mu);
    while (c->active > 0 && en_cond_wait_until(&c->idle, &c->mu, deadline_ns)) {
    }
    uv_mutex_unlock(&c->mu);
}

int rx_coord_addr(rx_coord_t *c, struct sockaddr_storage *addr)
{
    *addr = c->addr;
    return 0;
}

void rx_coord_send_all(rx_coord_t *c, const rx_ctl_msg_t *m)
{
    for (int r = 0; c && !c->closing && r < c->world; r++)
        if (r != c->ctx->rank && c->ranks[r].conn && !c->ranks[r].lost)
            rx_ctl_send(c->ranks[r].conn, m);
}

uint64_t rx_coord_rejected(rx_coord_t *c)
{
    return c && c->listener ? rx_listener_rejected(c->listener) : 0;
}
