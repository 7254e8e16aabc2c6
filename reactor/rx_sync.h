/*
 * rx_sync.h - partial synchronisation: the member side (every rank's control
 * reactor) and the coordinator (one rank's control reactor, hosting the
 * scheduler fiber).
 *
 * One sync on a rank goes:
 *   app thread   coh_sync: request + scratch, post "ready" to the control reactor
 *   control      READY -> coordinator; wait for the PLAN
 *   control      PLAN: weighted ring allreduce over the group, sliced over
 *                the rails, into the scratch buffer (the caller's buffer is
 *                only read, so a failed attempt leaves it as it was)
 *   rails        run the slices; the last one hands the attempt back
 *   control      DONE -> coordinator; on success copy the result into the
 *                caller's buffer and complete; if a member died, try again
 *                with a new READY (the survivors are grouped again)
 */
#ifndef COH_RX_SYNC_H
#define COH_RX_SYNC_H

#include "reactor/reactor.h"
#include "reactor/rx_ctl.h"
#include "sched/sched.h"

struct coh_ctx;

/* The sync-specific part of a request. */
typedef struct rx_syncreq {
    void *buf;           /* the caller's: written once at the end */
    const void *sendbuf; /* the caller's input (buf, or coh_allreduce_ex's sendbuf) */
    void *scratch;
    size_t scratch_cap; /* its size; 0 once a relay swapped it: not kept (rx_member.c) */
    size_t count;
    coh_dtype dtype;
    coh_sync_mode mode;
    uint64_t iteration;
    double weight;
    uint64_t attempt;
    int retries_left;
    uint64_t t_start_ns, t_ready_ns, t_plan_ns, t_done_ns;
    /* the group of the current attempt */
    uint64_t group_id;
    int *members;
    int nmembers;
    int full;
    double total_weight;
    en_bw_t bw[RX_MAX_RAILS][EN_BW_PER_SLICE]; /* what each slice measured */
    int nbw[RX_MAX_RAILS];
    /* Relay groups (COH_SYNC_RELAY, coh_allreduce_ex's relay). */
    coh_redop redop; /* COH_SUM for a weighted sync */
    int plain;       /* 1: coh_allreduce_ex: no weights, `redop` over the ranks */
    int internal;    /* 1: a relay's own phase-1 op (no caller: relay_done ends it) */
    int phase;       /* 1: phase 1 runs; 2: phase 1 done, phase 2 awaited or running */
    bool running;    /* an op of this attempt is on the rails */
    bool awaiting;   /* its last op ended here: kept once the COMMIT comes */
    int *relays;     /* the late ranks at the launch */
    int nrelays;
    int relayed, phase2, phase2_method, nexcluded;
    int32_t exp;          /* floating-point weights scale by 2^-exp */
    void *tmp;            /* phase 2: what the late ranks bring */
    size_t prefix;        /* phase 2: the elements it covers, from the start */
    uint32_t nseg, seg;   /* phase 1 runs as nseg ops over consecutive segments; seg runs */
    uint32_t join;        /* a late rank's sync: the first segment of its relay op that its
                             data went into (RX_JOIN_NONE: none) */
    bool joined;          /* a relay's own phase-1 op: the rank's sync joined it */
    void *ident;          /* the identity of redop: what a non-contributor sends */
    uint32_t coord_epoch; /* the coordinator its READY went to */
} rx_syncreq_t;

/* ---- member side (per context, on its control reactor) ---- */

typedef struct rx_member rx_member_t;
int rx_member_start(struct coh_ctx *ctx); /* any thread; dials the coordinator */
int rx_member_wait_ready(struct coh_ctx *ctx, uint64_t deadline_ns);
void rx_member_fini(struct coh_ctx *ctx); /* after the control reactor stopped */
/* Tests (any thread but the control loop's): send a raw control message. */
int rx_member_send_raw(struct coh_ctx *ctx, const rx_ctl_msg_t *msg);
/* Any thread: send msg (no pointers in it) to the coordinator from the
 * control loop; dropped when there is no connection. */
void rx_member_post(struct coh_ctx *ctx, const rx_ctl_msg_t *msg);
/* coh_comm_shrink's and coh_comm_grow's agreement (caller's thread,
 * blocks): comm's members (world ranks) -> the new communicator's id and
 * world ranks (*out is coh_malloc'd). top: the highest communicator id this
 * rank knows. A rank that rejoined grows with n 0. */
int rx_member_shrink(struct coh_ctx *ctx, bool grow, uint32_t comm, const int *ranks, int n,
                     uint32_t top, uint32_t *newcomm, int **out, int *nout);
/* The last slice of a sync attempt ended (rail thread). */
void rx_sync_attempt_done(coh_request_t *req);

/* ---- the scheduler's configuration, read in coh_init (rx_schedcfg.c) ---- */

typedef struct rx_sched_cfg {
    sc_params_t params; /* defaults, COHORT_SCHED, COHORT_SCHED_<NAME>; validated */
    int world;
    /* COHORT_SCHED_TRACE (coordinator only): per worker its bandwidth (0:
     * none) and compute-time samples. NULL when there is no trace. */
    double *trace_bw;
    double **trace_samples;
    int *trace_n;
} rx_sched_cfg_t;

/* Caller's thread. On failure nothing is left to free. */
int rx_sched_cfg_load(const coh_config_t *cfg, int world, bool coordinator, rx_sched_cfg_t *out);
void rx_sched_cfg_fini(rx_sched_cfg_t *c);

/* ---- coordinator (on the coordinator rank's control reactor) ---- */

typedef struct rx_coord rx_coord_t;
/* Loop thread of the control reactor. Listen next to rail 0's address.
 * Every rank runs one; only the configured coordinator's is active. The
 * others are dormant (no timer, no scheduler) until this rank is elected:
 * rx_coord_activate, or the first member that connects to it while this
 * rank's own member has no coordinator either. */
int rx_coord_start(struct coh_ctx *ctx, rx_reactor_t *rx, bool active, rx_coord_t **out);
void rx_coord_activate(rx_coord_t *c, int old_coordinator);
/* Loop thread: the member has a live coordinator connection (a dormant
 * coordinator refuses members that elected it early). */
bool rx_member_has_coordinator(struct coh_ctx *ctx);
void rx_coord_close(rx_coord_t *c); /* loop thread: close everything */
int rx_coord_addr(rx_coord_t *c, struct sockaddr_storage *addr);
/* Control connections refused at the handshake (any thread, before stop). */
uint64_t rx_coord_rejected(rx_coord_t *c);
/* Loop thread. This rank's member started: ctx->ctrl_addrs is complete and
 * BEAT datagrams (rx_ctl.h) may go and count. */
void rx_coord_beats_ready(rx_coord_t *c);
/* Loop thread: one BEAT to a control address, from this rank's own. */
void rx_coord_beat(rx_coord_t *c, const struct sockaddr_storage *to, rx_beat_kind kind);
/* Loop thread: a BEAT of rank `from` reached this rank's member. */
void rx_member_heard(struct coh_ctx *ctx, int from, uint64_t now_ns);
/* Loop thread: send m to every connected live rank but this one. */
void rx_coord_send_all(rx_coord_t *c, const rx_ctl_msg_t *m);
/* Any thread: wait until no rank is connected and in the schedule (they
 * have all left or gone), or the deadline. */
void rx_coord_wait_idle(rx_coord_t *c, uint64_t deadline_ns);

/* The group comm id of a group: data frames of group g carry it. */
static inline uint32_t rx_group_comm(uint64_t gid)
{
    return 0x80000000u | (uint32_t)(gid & 0x7fffffffu);
}

#endif
