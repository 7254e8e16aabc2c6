/*
 * The bounded-loss transport (DLCP, issue 11; docs/udp.md): a udp rail's
 * datagram data path. A rail opened with cfg->udp keeps its TCP links (they
 * carry every reliable op and this engine's control messages) and adds one
 * UDP socket, bound to the same address and port as its listener. Ops with a
 * loss bound (en_op_set_loss) run the chunked push/pull allreduce plan
 * (SC_ALGO_DIRECT); their staged sends and receives come here. Sends are
 * paced per flow and per rail (the line rate), take turns by destination and
 * go out as UDP GSO groups where the kernel has them (GRO on receipt):
 *
 *   send    the step's bytes go out at once (zero RTT: no rendezvous) as
 *           datagrams of udp_seg_bytes, paced at the flow's rate (DLCP's
 *           Fig. 7 rate control, en_dgram.h), then DONE on the TCP link
 *   recv    a bitmap of the segments that arrived; each is copied or reduced
 *           into place once. At DONE: the bound met -> FIN (the step ends on
 *           both sides), else NACK with the missing ranges, which the sender
 *           sends again (at line rate) and closes with DONE. DONE, NACK and
 *           FIN also go ahead as datagrams (EN_DG_CTL): a lost TCP segment
 *           waits 200 ms for its retransmission; both copies are idempotent
 *   rate    every udp_period_us the receiver reports what it received, as a
 *           datagram (EN_DG_RATE); the sender decides over 8 reports
 *
 * Threading: the rail's loop thread, except en_udp_stats and en_udp_fini.
 *
 * Datagrams are checked before they touch memory: the job value, a peer's
 * address, the header (en_dg_decode), the op and step, the stage and the
 * bounds of the posted buffer; anything else is dropped and counted. Data
 * for a receive not posted yet (the peer's op ran ahead) is kept in a
 * bounded stash, as frames are (en_exec.c). A missing push segment is absent
 * from the sum (the owner divides by the contributors per segment), a
 * missing pull segment leaves the receiver's own value in place.
 */
#include <errno.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/udp.h>
#include <sys/socket.h>
#include <unistd.h>

#include "engines/en_dgram.h"
#include "engines/engine.h"
#include "sched/sc_rng.h"
#include "gpu/gpu.h"

#define DG_BATCH 64
/* Datagrams a flow sends per turn: the flows of a rail share the line rate
 * in small interleaved turns (a receiver waits for its slowest pusher). */
#define DG_QUANTUM 8
#define DG_QMAX    32 /* the same with UDP GSO: 32 datagrams in a few sends */
/* Pacer credit after idle: libuv's timers tick in milliseconds and fire
 * late on a loaded host; a flow may catch up on this much of a stall. */
#define DG_BURST  5000000ull
#define DG_WINDOW 8    /* rate reports per rate-control decision (docs/udp.md) */
#define DG_RANGES 60   /* missing ranges per NACK (fits EN_MAX_ABORT) */
#define DG_AI     0.05 /* additive increase: 5% of the line rate per period */

enum { CTL_DONE = 1, CTL_NACK = 2, CTL_FIN = 3 }; /* rate reports: EN_DG_RATE datagrams */
#define CTL_HDR 24 /* u8 kind, u8 flags, 2 zero, u32 pass, u64 a, u64 b */
/* flags: a datagram DONE sent again because no answer came; the receiver
 * answers it again (FIN, or the NACK of that pass). */
#define CTL_AGAIN 1
/* A sender with no answer to its DONE sends it again as a datagram after
 * this, doubling up to DG_AGAIN_MAX: both copies of a control message (the
 * datagram and the TCP segment) lost costs a TCP retransmission timeout of
 * 200 ms or more otherwise, which at 5% drops hit nearly every op. The
 * first tries mostly go while the answer is still on its way (a round trip
 * of queues: 11-14 ms in the cluster of docs/udp.md), so by the time an
 * answer is really lost the gap had grown to 32-64 ms: the 5% tail's
 * outliers (bench/udp.sh: 644 and 673 ms in runs whose p50 was 578).
 * Capped at 16 ms, a flow that waits costs a 60-byte datagram every 16 ms. */
#define DG_AGAIN_MIN_NS (2ull * 1000000ull)
#define DG_AGAIN_MAX_NS (16ull * 1000000ull)

/* A flow on one path: DLCP's rate control runs per path, so a congested
 * rail sheds its share to the others. */
typedef struct dg_fpath {
    en_rc_t rc;
    en_pacer_t pacer;
    uint64_t period_bytes; /* since the last report: sent (send), received (recv) */
    uint64_t w_sent, w_recv;
} dg_fpath_t;

typedef struct en_dgflow {
    struct en_dgflow *snext; /* the rail's sending flows */
    en_op_t *op;
    uint32_t step;
    int peer;
    uint8_t stage;
    bool recv, posted, ended, sending;
    uint8_t *dst;       /* recv: where segments land */
    const uint8_t *src; /* send: the data; recv: a reduce's other operand, else the fallback */
    bool reduce;
    uint64_t len;
    uint32_t nseg;
    en_dg_bitmap_t bm; /* recv: segments that arrived */
    /* send: the ranges of this pass, where it stands in them */
    en_dg_range_t *rg;
    int nrg, ri;
    uint32_t rk;
    uint32_t *redo; /* send: taken, not sent (a short send): they go first */
    int nredo;
    uint32_t pass;
    uint64_t again_ns, again_gap; /* send: DONE out, no answer yet: send it again then */
    bool done_seen;               /* recv: the sender finished a pass */
    uint32_t done_next; /* recv: the pass whose DONE comes next (earlier ones are copies) */
    uint64_t done_ns;   /* recv: when this pass's first DONE copy came */
    /* Paths (spraying: one per udp rail of the group). send: those this
     * pass used; recv: those the pass used (its DONE says) and those closed
     * (their DONE copy or the pass's LAST datagram came on them: in order
     * on one path, so nothing more of the pass is on its way there). */
    uint8_t pmask, done_mask, pdone;
    uint32_t pdone_pass;
    uint8_t pnext; /* send: the path that goes first next turn */
    dg_fpath_t fp[EN_DG_PATHS];
    uint64_t period_t0;
    uint64_t w_sent_ns, w_recv_ns; /* send: the rate window */
    int w_n;
    uint64_t t_start;
    uint32_t chunk;         /* send, push: its number among the pushes to its peer */
    uint8_t tos_lo, tos_hi; /* send: the TOS of an unimportant / important datagram */
    double median;          /* send: ECN threshold (|x| of the tensor's median) */
} en_dgflow_t;

struct en_dgop {
    en_dgflow_t *flows;    /* [nsteps]; network steps with a stage */
    uint64_t stage_len[3]; /* by sc_stage: the bytes of this rank's datagram receives */
    /* [world]: the pushes to each peer that started and have not ended, a
     * bit per push by its number among that peer's (dg_held). */
    uint64_t *push_live;
};

/* One turn's datagrams on one path (flow_turn): headers, the iovecs that
 * point them and their payloads, and the messages they make. */
typedef struct dg_batch {
    en_dg_hdr_t h[DG_QMAX];
    uint8_t hdr[DG_QMAX][EN_DG_HDR];
    struct iovec iov[DG_QMAX][2];
    struct mmsghdr mm[DG_QMAX];
    int msg_nd[DG_QMAX]; /* datagrams per message */
    uint32_t seg[DG_QMAX];
    union {
        char buf[CMSG_SPACE(sizeof(int)) + CMSG_SPACE(sizeof(uint16_t))];
        struct cmsghdr align;
    } cm[DG_QMAX];
    int n, nm, tos_prev;
    bool short_prev;
    en_pacer_t pc, lp; /* the flow's pacer on the path, the path's line pacer */
} dg_batch_t;

/* A datagram or control message that came before its receive. */
typedef struct dg_keep {
    struct dg_keep *next;
    uint32_t comm, tag;
    uint64_t seq;
    int peer, path;
    bool ctl;
    size_t len;
    uint8_t data[];
} dg_keep_t;

/* A socket the rail's flows send on and read (spraying: each udp rail's of
 * the group, read and written by the lead; else the rail's own). */
typedef struct dg_path {
    struct en_udp *u;     /* the engine that runs it */
    struct en_udp *owner; /* its rail's: counts what went through it */
    int idx, fd;
    bool open, poll_open;
    int events;
    uv_poll_t poll;
    en_pacer_t line;               /* every flow on it together: at most the line rate */
    double line_bps;               /* its rail's line rate (NIC:udp@MBPS) */
    struct sockaddr_storage *peer; /* [world]: each peer's address on this path */
    int gso_max;                   /* datagrams per UDP GSO send (1: no GSO) */
    bool gro;                      /* the socket hands over coalesced datagrams (UDP_GRO) */
} dg_path_t;

struct en_udp {
    en_rail_t *rail;
    int fd; /* this rail's socket (closed by this engine, used by the lead's) */
    en_udp_group_t *group;
    int gidx;
    bool lent; /* a group member, not its lead: the lead runs the socket */
    dg_path_t path[EN_DG_PATHS];
    int npaths;
    uv_timer_t timer;
    bool timer_open, timer_on;
    uint64_t job;
    uint32_t seg;
    double line_bps, delta;
    uint64_t period_ns;
    uint32_t drop_ppm;
    int send_fail;       /* tests: batches to send before one fails (0: none) */
    bool ctl_dgram_only; /* tests only: control messages go as datagrams alone */
    uint64_t rng;
    uint64_t refreshed_ns;
    bool debug;        /* COHORT_UDP_DEBUG: per-flow and per-rail figures on stderr */
    uint8_t *took;     /* [world]: the peer had its turn in this round (pump) */
    dg_batch_t *batch; /* [EN_DG_PATHS]: flow_turn's */
    int gso_max;       /* this socket's: datagrams per UDP GSO send (1: no GSO) */
    bool gro;          /* this socket's: UDP_GRO */
    en_dgflow_t *sends;
    int nflows; /* live flows of running ops: the timer runs while > 0 */
    dg_keep_t *keep;
    uint64_t keep_bytes, keep_limit;
    uint8_t *rxbuf;
    size_t rxsz;
    /* Counters (en_udp_stats_t's, read from any thread). */
    struct {
        _Atomic uint64_t dg_sent, dg_recv, dg_dup, dg_bad, dg_stranger, dg_late, dg_kept,
            dg_dropped, dg_test_dropped, nacks, resent_bytes, ctl_again;
    } st;
};

/* ---- control messages on the TCP link ---- */

static void ctl_sent(en_wreq_t *w, int status)
{
    (void)status;
    coh_free(w);
}

/* A control message's payload into p (CTL_HDR + 8 per range): its length. */
static size_t ctl_encode(uint8_t *p, int kind, int flags, uint32_t pass, uint64_t a, uint64_t b,
                         const en_dg_range_t *rg, int nrg)
{
    memset(p, 0, CTL_HDR);
    p[0] = (uint8_t)kind;
    p[1] = (uint8_t)flags;
    en_put32(p + 4, pass);
    en_put64(p + 8, a);
    en_put64(p + 16, b);
    size_t len = CTL_HDR;
    for (int i = 0; i < nrg; i++, len += 8) {
        en_put32(p + len, rg[i].first);
        en_put32(p + len + 4, rg[i].count);
    }
    return len;
}

/* A control message as a datagram to peer, on the paths in mask that exist. */
static void ctl_datagram(struct en_udp *u, uint32_t comm, uint64_t seq, uint32_t tag, int peer,
                         const uint8_t *p, size_t len, unsigned mask)
{
    if (len > u->seg) return;
    uint8_t dg[EN_DG_HDR + EN_MAX_ABORT];
    en_dg_hdr_t dh = {.flags = EN_DG_CTL,
                      .job = u->job,
                      .comm = comm,
                      .step = tag,
                      .seq = seq,
                      .len = (uint32_t)len};
    en_dg_encode(&dh, dg);
    memcpy(dg + EN_DG_HDR, p, len);
    for (int k = 0; k < u->npaths; k++) {
        if (!(mask & (1u << k)) || !u->path[k].open) continue;
        const struct sockaddr_storage *to = &u->path[k].peer[peer];
        (void)sendto(u->path[k].fd, dg, EN_DG_HDR + len, MSG_DONTWAIT, (const struct sockaddr *)to,
                     en_sa_size(to));
    }
}

/* The datagram copies go on the paths in mask (where they exist). */
static void send_ctl(en_op_t *op, const en_dgflow_t *f, int kind, uint32_t pass, uint64_t a,
                     uint64_t b, const en_dg_range_t *rg, int nrg, unsigned mask)
{
    en_rail_t *rail = op->rail;
    en_conn_t *c = rail->peers[f->peer];
    if (!c) return; /* the link is gone: the op fails by it */
    en_wreq_t *w = coh_zalloc(sizeof(*w));
    if (!w) return; /* the peer asks again, or the op times out */
    uint8_t *p = w->ctl;
    size_t len = ctl_encode(p, kind, 0, pass, a, b, rg, nrg);
    en_hdr_t h = {.type = EN_FRAME_DGCTL,
                  .comm = op->comm,
                  .tag = op->plan.steps[f->step].tag,
                  .seq = op->seq,
                  .len = len};
    en_hdr_encode(&h, w->hdr);
    w->payload = w->ctl;
    w->len = len;
    w->done = ctl_sent;
    /* Copies go as datagrams first: one lost TCP segment costs a 200 ms
     * retransmission timeout, which would be the tail of a lossy link. The
     * TCP copy is the reliable one; all are idempotent (pass numbers). Two
     * datagrams: a drop rate p loses both p^2 of the time, not p (at 5%, an
     * op's thousands of messages lost dozens, each waiting for a DONE sent
     * again); they are 50 bytes. */
    struct en_udp *u = rail->udp;
    for (int copy = 0; u && copy < 2; copy++)
        ctl_datagram(u, op->comm, op->seq, h.tag, f->peer, p, len, mask);
    if (u && u->ctl_dgram_only) {
        coh_free(w);
        return;
    }
    if (c->ops->tr_send(c, w) != 0) coh_free(w);
}

/* A control message again, as a datagram alone on every path (the TCP
 * copy of the first is on its way, reliably, if late). */
static void ctl_again(struct en_udp *u, const en_op_t *op, const en_dgflow_t *f, int kind,
                      uint32_t pass, uint64_t a, const en_dg_range_t *rg, int nrg)
{
    uint8_t p[EN_MAX_ABORT];
    size_t len = ctl_encode(p, kind, CTL_AGAIN, pass, a, 0, rg, nrg);
    u->st.ctl_again++;
    ctl_datagram(u, op->comm, op->seq, op->plan.steps[f->step].tag, f->peer, p, len, ~0u);
}

/* ---- the timer: pacing, rate reports ---- */

static void pump(struct en_udp *u);

static void recv_decide(struct en_udp *u, en_dgflow_t *f);

/* A rate report goes as a datagram (not on the TCP link, where one lost
 * segment would hold every DONE and NACK behind it). */
/* A rate report's payload: path 0's bytes, the period (ns), then the other
 * paths' bytes. */
static uint32_t rate_len(const struct en_udp *u)
{
    return 16 + 8 * (uint32_t)(u->npaths - 1);
}

static void send_rate(struct en_udp *u, const en_op_t *op, en_dgflow_t *f, uint64_t ns)
{
    uint8_t b[EN_DG_HDR + 16 + 8 * EN_DG_PATHS];
    en_dg_hdr_t h = {.flags = (uint8_t)(EN_DG_RATE | (f->stage == SC_STAGE_PULL ? EN_DG_PULL : 0)),
                     .job = u->job,
                     .comm = op->comm,
                     .step = op->plan.steps[f->step].tag,
                     .seq = op->seq,
                     .len = rate_len(u)};
    en_dg_encode(&h, b);
    en_put64(b + EN_DG_HDR, f->fp[0].period_bytes);
    en_put64(b + EN_DG_HDR + 8, ns);
    /* On the path that carried the most: it evidently works. */
    int best = 0;
    for (int k = 1; k < u->npaths; k++) {
        en_put64(b + EN_DG_HDR + 8 + 8 * (size_t)k, f->fp[k].period_bytes);
        if (f->fp[k].period_bytes > f->fp[best].period_bytes) best = k;
    }
    for (int k = 0; k < u->npaths; k++) f->fp[k].period_bytes = 0;
    const dg_path_t *pt = &u->path[best];
    if (!pt->open) return;
    const struct sockaddr_storage *to = &pt->peer[f->peer];
    (void)sendto(pt->fd, b, EN_DG_HDR + h.len, MSG_DONTWAIT, (const struct sockaddr *)to,
                 en_sa_size(to));
}

static uint64_t period_bytes(const struct en_udp *u, const en_dgflow_t *f)
{
    uint64_t b = 0;
    for (int k = 0; k < u->npaths; k++) b += f->fp[k].period_bytes;
    return b;
}

/* Each period: receivers report their rate; senders whose DONE has no
 * answer send it again. */
static void report_rates(struct en_udp *u, uint64_t now)
{
    for (en_op_t *op = u->rail->ops_head; op; op = op->next) {
        if (!op->dg || op->state != EN_OP_RUNNING) continue;
        op->progressing = true;
        for (uint32_t i = 0; i < op->plan.nsteps && op->state == EN_OP_RUNNING; i++) {
            en_dgflow_t *f = &op->dg->flows[i];
            if (f->op && !f->recv && !f->ended && f->again_ns && now >= f->again_ns) {
                /* No FIN or NACK for this pass yet: one of them, or DONE, is lost. */
                ctl_again(u, op, f, CTL_DONE, f->pass, f->nseg, NULL, 0);
                f->again_gap =
                    2 * f->again_gap < DG_AGAIN_MAX_NS ? 2 * f->again_gap : DG_AGAIN_MAX_NS;
                f->again_ns = now + f->again_gap;
            }
            if (!f->recv || !f->posted || f->ended) continue;
            if (f->ended || !period_bytes(u, f)) continue;
            if (now - f->period_t0 < u->period_ns) continue;
            send_rate(u, op, f, now - f->period_t0);
            f->period_t0 = now;
        }
        op->progressing = false;
    }
    /* Kicks after the walk: one may end (and free) its op. */
    for (en_op_t *op = u->rail->ops_head, *next; op; op = next) {
        next = op->next;
        if (op->dg) en_exec_kick(op);
    }
}

static void timer_cb(uv_timer_t *t)
{
    struct en_udp *u = t->data;
    pump(u);
    report_rates(u, bs_now_ns());
    if (u->nflows <= 0 && u->timer_on) {
        uv_timer_stop(&u->timer);
        u->timer_on = false;
    }
}

static void timer_arm(struct en_udp *u)
{
    if (u->timer_on || !u->timer_open) return;
    /* Every millisecond (libuv's resolution): pacing; the rate reports and
     * decisions check their own period. */
    uv_timer_start(&u->timer, timer_cb, 1, 1);
    u->timer_on = true;
}

/* ---- sending ---- */

static void send_list_remove(struct en_udp *u, en_dgflow_t *f)
{
    if (!f->sending) return;
    for (en_dgflow_t **pp = &u->sends; *pp; pp = &(*pp)->snext)
        if (*pp == f) {
            *pp = f->snext;
            break;
        }
    f->snext = NULL;
    f->sending = false;
}

static void send_list_add(struct en_udp *u, en_dgflow_t *f)
{
    if (f->sending) return;
    f->snext = u->sends;
    u->sends = f;
    f->sending = true;
}

static void poll_cb(uv_poll_t *h, int status, int events);

static void poll_set(dg_path_t *pt, int events)
{
    if (!pt->poll_open || events == pt->events) return;
    pt->events = events;
    uv_poll_start(&pt->poll, events, poll_cb);
}

/* The next datagram of the flow's pass: one a short send left over first,
 * then the pass's ranges in order (cursor ri, rk; rd into the leftovers). */
static uint32_t next_seg(const en_dgflow_t *f, int *rd, int *ri, uint32_t *rk)
{
    if (*rd < f->nredo) return f->redo[(*rd)++];
    uint32_t s = f->rg[*ri].first + *rk;
    if (++*rk == f->rg[*ri].count) {
        (*ri)++;
        *rk = 0;
    }
    return s;
}

/* Datagram s (the pass's LAST: last) into path b's batch: consecutive
 * full-size ones with the same TOS byte make one UDP GSO message (the kernel
 * cuts it at each header + segment), so the stack is crossed once per group. */
static void batch_add(struct en_udp *u, en_dgflow_t *f, dg_batch_t *b, const dg_path_t *pt,
                      uint32_t s, bool last, uint64_t now)
{
    en_op_t *op = f->op;
    struct sockaddr_storage *to = &pt->peer[f->peer];
    uint64_t off = (uint64_t)s * u->seg;
    uint32_t len = (uint32_t)(f->len - off < u->seg ? f->len - off : u->seg);
    en_pacer_delay(&b->pc, now, f->fp[pt->idx].rc.rate_bps, len + EN_DG_HDR + 28, DG_BURST);
    /* Every flow of the path together: at most its line rate. */
    en_pacer_delay(&b->lp, now, pt->line_bps, len + EN_DG_HDR + 28, DG_BURST);
    int n = b->n;
    b->h[n] = (en_dg_hdr_t){
        .flags = (uint8_t)((f->stage == SC_STAGE_PULL ? EN_DG_PULL : 0) | (last ? EN_DG_LAST : 0)),
        .job = u->job,
        .comm = op->comm,
        .step = op->plan.steps[f->step].tag,
        .seq = op->seq,
        .offset = off,
        .len = len,
        .segno = s};
    en_dg_encode(&b->h[n], b->hdr[n]);
    b->iov[n][0] = (struct iovec){.iov_base = b->hdr[n], .iov_len = EN_DG_HDR};
    b->iov[n][1] = (struct iovec){.iov_base = (void *)(f->src + off), .iov_len = len};
    int tos = 0;
    bool tagged = f->tos_lo || f->tos_hi;
    if (tagged) {
        bool imp = (op->dtype == COH_F32 || op->dtype == COH_F64) &&
                   en_tag_important(f->src + off, len / op->esize, op->esize, f->median);
        tos = imp ? f->tos_hi : f->tos_lo;
    }
    /* A new message: the first, another TOS, a full group, or after a short
     * segment (only a group's last may be short). */
    int nm = b->nm;
    if (nm == 0 || tos != b->tos_prev || b->msg_nd[nm - 1] >= pt->gso_max || b->short_prev) {
        b->mm[nm] = (struct mmsghdr){.msg_hdr = {.msg_name = to,
                                                 .msg_namelen = en_sa_size(to),
                                                 .msg_iov = &b->iov[n][0],
                                                 .msg_iovlen = 0}};
        b->msg_nd[nm] = 0;
        if (tagged) {
            bool v6 = to->ss_family == AF_INET6;
            struct cmsghdr *c = (struct cmsghdr *)b->cm[nm].buf;
            c->cmsg_level = v6 ? IPPROTO_IPV6 : IPPROTO_IP;
            c->cmsg_type = v6 ? IPV6_TCLASS : IP_TOS;
            c->cmsg_len = CMSG_LEN(sizeof(int));
            memcpy(CMSG_DATA(c), &tos, sizeof(int));
            b->mm[nm].msg_hdr.msg_control = b->cm[nm].buf;
            b->mm[nm].msg_hdr.msg_controllen = CMSG_SPACE(sizeof(int));
        }
        b->nm = ++nm;
    }
    b->mm[nm - 1].msg_hdr.msg_iovlen += 2;
    b->msg_nd[nm - 1]++;
    b->tos_prev = tos;
    b->short_prev = len < u->seg;
    b->seg[n] = s;
    b->n = n + 1;
}

enum { SENT_ALL = 0, SENT_SOCKFULL = 1, SENT_BACKOFF = 2, SENT_FAILED = 3 };

/* Send path b's batch; returns how many of its datagrams left (*how: why
 * not all). SENT_SOCKFULL: the socket buffer is full (wait until writable);
 * SENT_BACKOFF: the interface's queue refused (ENOBUFS: its qdisc is full;
 * always writable, so wait for the timer); SENT_FAILED: the op failed. */
static int batch_send(struct en_udp *u, en_dgflow_t *f, dg_batch_t *b, dg_path_t *pt, int *how)
{
    *how = SENT_ALL;
    for (int m = 0; m < b->nm; m++) {
        if (b->msg_nd[m] < 2) continue;
        struct msghdr *mh = &b->mm[m].msg_hdr;
        struct cmsghdr *c = (struct cmsghdr *)(b->cm[m].buf + mh->msg_controllen);
        uint16_t gso = (uint16_t)(u->seg + EN_DG_HDR);
        c->cmsg_level = SOL_UDP;
        c->cmsg_type = UDP_SEGMENT;
        c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
        memcpy(CMSG_DATA(c), &gso, sizeof(gso));
        mh->msg_control = b->cm[m].buf;
        mh->msg_controllen += CMSG_SPACE(sizeof(uint16_t));
    }
    int k;
    if (u->send_fail > 0 && --u->send_fail == 0) { /* tests: refused */
        errno = EPERM;
        k = -1;
    } else {
        k = sendmmsg(pt->fd, b->mm, (unsigned)b->nm, MSG_DONTWAIT);
    }
    if (k < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            *how = SENT_SOCKFULL;
        } else if (errno == ENOBUFS) {
            *how = SENT_BACKOFF;
        } else if (errno == EIO && pt->gso_max > 1) {
            pt->gso_max = 1; /* the device cannot segment: no GSO from now on */
            *how = SENT_BACKOFF;
        } else {
            char why[128];
            snprintf(why, sizeof(why), "udp send to rank %d: %s", f->peer, strerror(errno));
            en_exec_fail_op(f->op, COH_EPEER, true, why);
            *how = SENT_FAILED;
        }
        return 0;
    }
    if (k < b->nm) *how = SENT_BACKOFF;
    int sent = 0;
    for (int m = 0; m < k; m++) sent += b->msg_nd[m];
    return sent;
}

/* One turn of flow f on the paths in avail: up to a quantum of datagrams
 * per path. Spraying is per datagram: each goes to the path whose pacers
 * (the flow's there, and the path's line) let it out first, so equal rails
 * alternate and a rail of a quarter of the rate carries every fifth. What a
 * short send left goes first next turn; the pass's LAST goes out after
 * everything else of the pass, or not at all (DONE closes its path). */
static void flow_turn(struct en_udp *u, en_dgflow_t *f, unsigned avail, uint64_t now,
                      unsigned *full, unsigned *stopped)
{
    en_op_t *op = f->op;
    uint32_t quantum = u->npaths == 1 && u->path[0].gso_max > 1 ? DG_QMAX : DG_QUANTUM;
    for (int k = 0; k < u->npaths; k++) {
        dg_batch_t *b = &u->batch[k];
        b->n = b->nm = 0;
        b->short_prev = false;
        b->tos_prev = -1;
        b->pc = f->fp[k].pacer;
        b->lp = u->path[k].line;
        if (b->pc.next_ns + DG_BURST < now) b->pc.next_ns = now - DG_BURST;
        if (b->lp.next_ns + DG_BURST < now) b->lp.next_ns = now - DG_BURST;
    }
    int rd = 0, ri = f->ri, lastk = -1, first = f->pnext++ % u->npaths;
    uint32_t rk = f->rk;
    /* While datagrams are left over, a turn sends only those: what is left
     * never outgrows one turn's worth. */
    while (rd < f->nredo || (f->nredo == 0 && ri < f->nrg)) {
        uint64_t next[EN_DG_PATHS];
        unsigned open = 0;
        for (int k = 0; k < u->npaths; k++) {
            const dg_batch_t *b = &u->batch[k];
            next[k] = b->pc.next_ns > b->lp.next_ns ? b->pc.next_ns : b->lp.next_ns;
            if ((uint32_t)b->n < quantum) open |= 1u << k;
        }
        int k = en_dg_spray_pick(next, u->npaths, avail & open, first, now);
        if (k < 0) break;
        uint32_t s = next_seg(f, &rd, &ri, &rk);
        bool last = rd == f->nredo && ri == f->nrg;
        batch_add(u, f, &u->batch[k], &u->path[k], s, last, now);
        if (last) lastk = k;
    }
    /* Send path by path, the one with LAST at the end: a short send before
     * it takes the flag off (the rest of the pass is still to go). */
    uint32_t left[EN_DG_PATHS * DG_QMAX];
    int nleft = 0;
    bool shortened = false;
    for (int j = 0; j < u->npaths; j++) {
        int k = (lastk + 1 + j) % u->npaths; /* lastk (or path npaths-1) last */
        dg_batch_t *b = &u->batch[k];
        dg_path_t *pt = &u->path[k];
        if (b->n == 0) continue;
        if (k == lastk && shortened) {
            en_dg_hdr_t *h = &b->h[b->n - 1];
            h->flags &= (uint8_t)~EN_DG_LAST;
            en_dg_encode(h, b->hdr[b->n - 1]);
        }
        int how, sent = batch_send(u, f, b, pt, &how);
        if (how == SENT_FAILED) return;
        if (how == SENT_SOCKFULL) *full |= 1u << k;
        if (how != SENT_ALL) *stopped |= 1u << k;
        if (sent < b->n) shortened = true;
        for (int d = sent; d < b->n; d++) left[nleft++] = b->seg[d];
        if (sent == 0) continue;
        /* The pacers keep the batch's accounting (a short send undercounts
         * nothing that matters). */
        dg_fpath_t *fp = &f->fp[k];
        fp->pacer = b->pc;
        pt->line = b->lp;
        f->pmask |= (uint8_t)(1u << k);
        for (int d = 0; d < sent; d++) {
            uint64_t len = b->iov[d][1].iov_len;
            fp->period_bytes += len;
            op->bytes_out += len;
            pt->owner->st.dg_sent++;
            if (f->pass) u->st.resent_bytes += len;
        }
        op->t_progress_ns = now;
    }
    /* Every datagram taken went out or is left for the next turn. */
    f->ri = ri;
    f->rk = rk;
    int keep = f->nredo - rd;
    if (keep + nleft > 0 && !f->redo) {
        f->redo = coh_malloc(sizeof(uint32_t) * EN_DG_PATHS * DG_QMAX);
        if (!f->redo) {
            en_exec_fail_op(op, COH_ENOMEM, true, "udp: out of memory");
            return;
        }
    }
    if (keep > 0) memmove(f->redo, f->redo + rd, sizeof(uint32_t) * (size_t)keep);
    if (nleft) memcpy(f->redo + keep, left, sizeof(uint32_t) * (size_t)nleft);
    f->nredo = keep + nleft;
    if (f->ri == f->nrg && f->nredo == 0) {
        /* The pass is out: the receiver decides. */
        if (u->debug)
            fprintf(stderr, "udp rank %d: op %llu flow to %d stage %d pass %u out at %.1f ms\n",
                    u->rail->rank, (unsigned long long)op->seq, f->peer, f->stage, f->pass,
                    (now - op->t_start_ns) / 1e6);
        send_list_remove(u, f);
        send_ctl(op, f, CTL_DONE, f->pass, f->nseg, f->pmask, NULL, 0, f->pmask);
        f->again_gap = 4 * u->period_ns > DG_AGAIN_MIN_NS ? 4 * u->period_ns : DG_AGAIN_MIN_NS;
        f->again_ns = now + f->again_gap;
    }
}

/* A push to a peer waits while this many older pushes to it have not
 * ended. The plan starts SC_DIRECT_WINDOW at once (sc_plan.c): that keeps
 * a single path busy at drops. A sprayed op sends one at a time: two made
 * it slower (bench/udp_spray.sh at 1% drops, two 400 Mbit/s rails: 352 and
 * 368 ms against 323 and 319 with one; four: 417 and 400). */
static bool dg_held(const struct en_udp *u, const en_dgflow_t *f)
{
    if (u->npaths == 1 || f->stage != SC_STAGE_PUSH || f->pass > 0 || f->chunk >= 64) return false;
    return (f->op->dg->push_live[f->peer] & ((1ull << f->chunk) - 1)) != 0;
}

/* The flow that takes peer's turn: a pass sent again first (a few
 * datagrams that a receive, and the chunk after it, wait for), else the
 * oldest op's; in it a push before a pull, then by step. A push is what its
 * chunk's owner waits for before it can pull that chunk to everyone; a pull
 * only ends this op. By step alone (a chunk's pull before the next chunk's
 * push), the last pushes went out late and the owners' last pulls waited
 * for them: at 5% drops a rank's last push left 27 ms after it could. The
 * plan sends a destination's push chunks in order, SC_DIRECT_WINDOW at once
 * (sc_plan.c), and the older goes out first. */
static en_dgflow_t *turn_flow(struct en_udp *u, int peer)
{
    en_dgflow_t *g = NULL;
    for (en_dgflow_t *x = u->sends; x; x = x->snext) {
        if (x->peer != peer || dg_held(u, x)) continue;
        if (!g) {
            g = x;
            continue;
        }
        bool xr = x->pass > 0, gr = g->pass > 0;
        if (xr != gr                   ? xr
            : x->op->seq != g->op->seq ? x->op->seq < g->op->seq
            : x->stage != g->stage     ? x->stage == SC_STAGE_PUSH
                                       : x->step < g->step)
            g = x;
    }
    return g;
}

static void pump(struct en_udp *u)
{
    uint64_t now = bs_now_ns();
    /* Paths that cannot take more now: their socket is full (wait until
     * writable), or their interface's queue refused (wait for the timer). */
    unsigned full = 0, stopped = 0, all = 0;
    for (int k = 0; k < u->npaths; k++)
        if (u->path[k].open) all |= 1u << k;
    /* Round robin over destinations: each peer's flows (a push and a pull
     * chunk may go to it at once) get one turn per round, so every receiver
     * gets an even share of this rank's line rate, as it does of the others'.
     * A turn sprays its datagrams over the paths that have credit. */
    for (int round = 0; round < 64 && u->sends && stopped != all; round++) {
        bool any = false;
        memset(u->took, 0, (size_t)u->rail->world);
        en_dgflow_t *next;
        for (en_dgflow_t *p = u->sends; p && stopped != all; p = next) {
            next = p->snext;
            if (u->took[p->peer]) continue;
            u->took[p->peer] = 1;
            en_dgflow_t *f = turn_flow(u, p->peer);
            if (!f) continue;               /* every flow to that peer waits (dg_held) */
            if (f == next) next = f->snext; /* its turn may take it off the list */
            en_op_t *op = f->op;
            uint32_t ri = (uint32_t)f->ri, rk = f->rk;
            int nredo = f->nredo;
            /* Held through the turn: a send that fails the op kicks it, and
             * an op held by nobody (a pump from the timer or the socket)
             * was freed with its flows under us. */
            bool held = op->progressing;
            op->progressing = true;
            if (f->sending && op->state == EN_OP_RUNNING)
                flow_turn(u, f, all & ~stopped, now, &full, &stopped);
            if ((uint32_t)f->ri != ri || f->rk != rk || f->nredo != nredo) any = true;
            op->progressing = held;
            if (op->state != EN_OP_RUNNING) {
                /* A send failed it: its flows left the list, and the kick
                 * may free them. Start the round over. */
                en_exec_kick(op);
                next = u->sends;
                memset(u->took, 0, (size_t)u->rail->world);
            }
        }
        if (!any) break;
    }
    /* The next pump starts with the next destination: round robin across
     * pumps, or the head would take every pump's first credit. A pass sent
     * again stays ahead (send_list_add put it there; turn_flow picks it). */
    if (u->sends && u->sends->snext && u->sends->pass == 0) {
        en_dgflow_t *h = u->sends, *t = h;
        while (t->snext) t = t->snext;
        u->sends = h->snext;
        h->snext = NULL;
        t->snext = h;
    }
    for (int k = 0; k < u->npaths; k++)
        poll_set(&u->path[k], UV_READABLE | ((full >> k) & 1 ? UV_WRITABLE : 0));
    if (u->sends) timer_arm(u);
}

/* ---- receiving ---- */

static void keep_drop(struct en_udp *u, dg_keep_t **pp)
{
    dg_keep_t *k = *pp;
    *pp = k->next;
    u->keep_bytes -= k->len;
    coh_free(k);
}

static void keep_add(struct en_udp *u, uint32_t comm, uint64_t seq, int peer, int path,
                     uint32_t tag, bool ctl, const uint8_t *data, size_t len)
{
    if (u->keep_bytes + len > u->keep_limit) {
        u->st.dg_dropped++;
        return;
    }
    dg_keep_t *k = coh_malloc(sizeof(*k) + len);
    if (!k) {
        u->st.dg_dropped++;
        return;
    }
    *k = (dg_keep_t){
        .comm = comm, .seq = seq, .peer = peer, .path = path, .tag = tag, .ctl = ctl, .len = len};
    memcpy(k->data, data, len);
    /* Appended: control messages of a step replay in the order they came. */
    dg_keep_t **pp = &u->keep;
    while (*pp) pp = &(*pp)->next;
    *pp = k;
    u->keep_bytes += len;
    if (!ctl) u->st.dg_kept++;
}

/* A DONE of this flow (h's) is kept already: a copy sent again adds nothing. */
static bool kept_done(const struct en_udp *u, const en_dg_hdr_t *h, int peer)
{
    for (const dg_keep_t *k = u->keep; k; k = k->next)
        if (k->ctl && k->comm == h->comm && k->seq == h->seq && k->peer == peer &&
            k->tag == h->step && k->data[0] == CTL_DONE)
            return true;
    return false;
}

static void recv_decide(struct en_udp *u, en_dgflow_t *f);

/* Every path the sender's pass used is closed (see en_dgflow_t). */
static bool paths_closed(const en_dgflow_t *f)
{
    return f->done_mask && (f->pdone & f->done_mask) == f->done_mask;
}

/* After DONE: every path closed, or the last missing segment, means
 * nothing more is on its way. */
static void recv_check(struct en_udp *u, en_dgflow_t *f)
{
    if (!f->done_seen || !f->posted) return;
    if (paths_closed(f) || f->bm.got == f->nseg) recv_decide(u, f);
}

/* One checked segment, which came on path, into its posted receive (the
 * caller decides: recv_check). */
static void recv_segment(struct en_udp *u, en_dgflow_t *f, int path, const en_dg_hdr_t *h,
                         const uint8_t *payload)
{
    en_op_t *op = f->op;
    /* The pass's last datagram: nothing more of it comes on its path. */
    if (h->flags & EN_DG_LAST) f->pdone |= (uint8_t)(1u << path);
    int r = en_dg_bitmap_set(&f->bm, h->segno);
    if (r <= 0) {
        if (r == 0)
            u->st.dg_dup++;
        else
            u->st.dg_bad++;
        return;
    }
    if (f->reduce)
        gpu_cpu_reduce(op->dtype, op->redop, f->dst + h->offset, f->src + h->offset, payload,
                       h->len / op->esize);
    else
        memcpy(f->dst + h->offset, payload, h->len);
    u->path[path].owner->st.dg_recv++;
    f->fp[path].period_bytes += h->len;
    op->bytes_in += h->len;
    op->t_progress_ns = bs_now_ns();
}

/* The datagram belongs to this receive: its stage, and exactly segment
 * segno's bytes of it (a datagram never writes outside the posted buffer). */
static bool dg_fits(const struct en_udp *u, const en_dgflow_t *f, const en_dg_hdr_t *h)
{
    return ((h->flags & EN_DG_PULL) != 0) == (f->stage == SC_STAGE_PULL) && h->segno < f->nseg &&
           h->offset == (uint64_t)h->segno * u->seg && h->offset < f->len &&
           h->len == (f->len - h->offset < u->seg ? f->len - h->offset : u->seg);
}

/* The receiver got bytes[k] of this flow on each path k over ns: DLCP's
 * rate control compares that, path by path, with what was sent there since
 * the last report. */
static void rate_report(struct en_udp *u, en_dgflow_t *f, const uint64_t *bytes, uint64_t ns)
{
    uint64_t now = bs_now_ns(), dt = now - f->period_t0;
    if (ns > 0 && dt > 0 && period_bytes(u, f) > 0) {
        /* Both rates over the last DG_WINDOW reports: one period's are
         * noisy on a loaded host (a loop that read late sees a burst). */
        for (int k = 0; k < u->npaths; k++) {
            f->fp[k].w_sent += f->fp[k].period_bytes;
            f->fp[k].w_recv += bytes[k];
        }
        f->w_sent_ns += dt;
        f->w_recv_ns += ns;
        if (++f->w_n >= DG_WINDOW) {
            for (int k = 0; k < u->npaths; k++) {
                dg_fpath_t *fp = &f->fp[k];
                if (fp->w_sent) /* a path this window did not use says nothing */
                    en_rc_report(&fp->rc, (double)fp->w_sent * 8e9 / (double)f->w_sent_ns,
                                 (double)fp->w_recv * 8e9 / (double)f->w_recv_ns);
                fp->w_sent = fp->w_recv = 0;
            }
            f->w_sent_ns = f->w_recv_ns = 0;
            f->w_n = 0;
        }
    }
    for (int k = 0; k < u->npaths; k++) f->fp[k].period_bytes = 0;
    f->period_t0 = now;
}

static en_dgflow_t *send_flow(en_op_t *op, int peer, uint32_t tag)
{
    if (!op->dg) return NULL;
    for (uint32_t i = 0; i < op->plan.nsteps; i++) {
        const sc_step_t *s = &op->plan.steps[i];
        if (s->kind == SC_SEND && s->peer == peer && s->tag == tag && op->dg->flows[i].op)
            return &op->dg->flows[i];
    }
    return NULL;
}

static en_dgflow_t *recv_flow(en_op_t *op, int peer, uint32_t tag)
{
    if (!op->dg) return NULL;
    int64_t i = en_exec_find_recv(op, peer, tag);
    if (i < 0 || !op->dg->flows[i].op || !op->dg->flows[i].recv) return NULL;
    return &op->dg->flows[i];
}

static void on_ctl(struct en_udp *u, en_op_t *op, int peer, int path, uint32_t tag,
                   const uint8_t *p, size_t len);

/* A datagram from peer (its source address on path checked). */
static void on_datagram(struct en_udp *u, int path, int peer, const uint8_t *buf, size_t n)
{
    en_rail_t *rail = u->rail;
    en_dg_hdr_t h;
    if (en_dg_decode(buf, n, u->seg, &h) != 0) {
        u->st.dg_bad++;
        return;
    }
    if (h.job != u->job) {
        u->st.dg_stranger++;
        return;
    }
    en_op_t *op = en_exec_find_op(rail, h.comm, h.seq);
    if (!op) {
        const uint8_t *cp = buf + EN_DG_HDR;
        bool again_done =
            (h.flags & EN_DG_CTL) && h.len >= CTL_HDR && cp[0] == CTL_DONE && (cp[1] & CTL_AGAIN);
        int status = 0;
        if (en_exec_ended(rail, h.comm, h.seq, &status) || (h.flags & EN_DG_RATE)) {
            u->st.dg_late++;
            /* The op ended well here, so every receive of it did: the
             * sender asking again lost its FIN. */
            if (again_done && status == 0) {
                uint8_t fin[CTL_HDR];
                size_t len = ctl_encode(fin, CTL_FIN, CTL_AGAIN, en_get32(cp + 4), 0, 0, NULL, 0);
                u->st.ctl_again++;
                if (u->debug)
                    fprintf(stderr, "udp rank %d: op %llu ended: FIN again to %d\n", rail->rank,
                            (unsigned long long)h.seq, peer);
                ctl_datagram(u, h.comm, h.seq, h.step, peer, fin, len, 1u << path);
            }
        } else if (h.flags & EN_DG_CTL) {
            if (h.len >= CTL_HDR && cp[0] == CTL_DONE && !(again_done && kept_done(u, &h, peer)))
                keep_add(u, h.comm, h.seq, peer, path, h.step, true, cp, h.len);
        } else
            keep_add(u, h.comm, h.seq, peer, path, h.step, false, buf, n); /* its op comes later */
        return;
    }
    if (op->state != EN_OP_RUNNING) {
        u->st.dg_late++;
        return;
    }
    if (h.flags & EN_DG_CTL) {
        const uint8_t *cp = buf + EN_DG_HDR;
        if (h.len < CTL_HDR || (h.len - CTL_HDR) % 8 || cp[0] < CTL_DONE || cp[0] > CTL_FIN) {
            u->st.dg_bad++;
            return;
        }
        op->progressing = true;
        on_ctl(u, op, peer, path, h.step, cp, h.len);
        op->progressing = false;
        en_exec_kick(op);
        return;
    }
    if (h.flags & EN_DG_RATE) {
        en_dgflow_t *sf = send_flow(op, peer, h.step);
        if (sf && !sf->ended && h.len == rate_len(u) && n == EN_DG_HDR + h.len) {
            uint64_t bytes[EN_DG_PATHS];
            bytes[0] = en_get64(buf + EN_DG_HDR);
            for (int k = 1; k < u->npaths; k++)
                bytes[k] = en_get64(buf + EN_DG_HDR + 8 + 8 * (size_t)k);
            rate_report(u, sf, bytes, en_get64(buf + EN_DG_HDR + 8));
        } else if (!sf || h.len != rate_len(u)) {
            u->st.dg_bad++;
        }
        return;
    }
    en_dgflow_t *f = recv_flow(op, peer, h.step);
    if (!f || !dg_fits(u, f, &h)) {
        u->st.dg_bad++;
        return;
    }
    if (f->ended) {
        u->st.dg_late++;
        return;
    }
    if (!f->posted) {
        keep_add(u, h.comm, h.seq, peer, path, h.step, false, buf, n);
        return;
    }
    op->progressing = true;
    recv_segment(u, f, path, &h, buf + EN_DG_HDR);
    recv_check(u, f);
    op->progressing = false;
    en_exec_kick(op);
}

/* Where each peer's datagrams come from and go: its listener's address on
 * this rail (a rank that rejoined listens elsewhere now). */
static void refresh_peers(struct en_udp *u)
{
    en_rail_t *rail = u->rail;
    for (int k = 0; k < u->npaths; k++) {
        dg_path_t *pt = &u->path[k];
        if (!pt->open) continue;
        /* A member's own route table (its rail's listener on its interface);
         * the lead's routes via that interface lead to the lead's port. */
        en_rail_t *r = pt->owner->rail;
        for (int p = 0; p < rail->world; p++)
            if (p != rail->rank) en_rail_route(r, p, r->index, &pt->peer[p]);
    }
    u->refreshed_ns = bs_now_ns();
}

static int peer_of(struct en_udp *u, const dg_path_t *pt, const struct sockaddr_storage *from)
{
    for (int pass = 0; pass < 2; pass++) {
        for (int p = 0; p < u->rail->world; p++)
            if (p != u->rail->rank && en_sa_same(&pt->peer[p], from)) return p;
        /* Before this rail's first op the addresses may not be read yet. */
        if (pass || bs_now_ns() - u->refreshed_ns < 1000000) break;
        refresh_peers(u);
    }
    return -1;
}

/* Read what path pt's socket holds (up to 64 batches). */
static void path_read(struct en_udp *u, dg_path_t *pt)
{
    struct mmsghdr mm[DG_BATCH];
    struct iovec iov[DG_BATCH];
    struct sockaddr_storage from[DG_BATCH];
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } cm[DG_BATCH];
    for (int rounds = 0; rounds < 64; rounds++) {
        for (int i = 0; i < DG_BATCH; i++) {
            iov[i] = (struct iovec){.iov_base = u->rxbuf + (size_t)i * u->rxsz, .iov_len = u->rxsz};
            mm[i] =
                (struct mmsghdr){.msg_hdr = {.msg_name = &from[i],
                                             .msg_namelen = sizeof(from[i]),
                                             .msg_iov = &iov[i],
                                             .msg_iovlen = 1,
                                             .msg_control = pt->gro ? cm[i].buf : NULL,
                                             .msg_controllen = pt->gro ? sizeof(cm[i].buf) : 0}};
        }
        int n = recvmmsg(pt->fd, mm, DG_BATCH, MSG_DONTWAIT, NULL);
        if (n <= 0) break;
        for (int i = 0; i < n; i++) {
            if (mm[i].msg_hdr.msg_flags & MSG_TRUNC) {
                u->st.dg_bad++;
                continue;
            }
            /* UDP GRO: several datagrams of one sender back to back, each
             * gso bytes but the last. */
            size_t gso = mm[i].msg_len;
            for (struct cmsghdr *c = pt->gro ? CMSG_FIRSTHDR(&mm[i].msg_hdr) : NULL; c;
                 c = CMSG_NXTHDR(&mm[i].msg_hdr, c))
                if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO) {
                    int g;
                    memcpy(&g, CMSG_DATA(c), sizeof(g));
                    if (g > 0) gso = (size_t)g;
                }
            int peer = -2;
            for (size_t off = 0; off < mm[i].msg_len; off += gso) {
                size_t len = mm[i].msg_len - off < gso ? mm[i].msg_len - off : gso;
                if (u->drop_ppm && sc_splitmix64(&u->rng) % 1000000u < u->drop_ppm) {
                    u->st.dg_test_dropped++;
                    continue;
                }
                if (peer == -2) peer = peer_of(u, pt, &from[i]);
                if (peer < 0) {
                    u->st.dg_stranger++;
                    continue;
                }
                on_datagram(u, pt->idx, peer, (uint8_t *)iov[i].iov_base + off, len);
            }
        }
        if (n < DG_BATCH) break;
    }
}

static void poll_cb(uv_poll_t *h, int status, int events)
{
    dg_path_t *pt = h->data;
    if (status < 0) return;
    if (events & UV_WRITABLE) pump(pt->u);
    if (events & UV_READABLE) path_read(pt->u, pt);
}

/* ---- the loss bound ---- */

static void recv_finish(struct en_udp *u, en_dgflow_t *f)
{
    en_op_t *op = f->op;
    if (u->debug)
        fprintf(stderr, "udp rank %d: op %llu recv from %d stage %d: posted %.1f, done %.1f ms\n",
                u->rail->rank, (unsigned long long)op->seq, f->peer, f->stage,
                (f->period_t0 - op->t_start_ns) / 1e6, (bs_now_ns() - op->t_start_ns) / 1e6);
    uint64_t got = en_dg_bytes_got(&f->bm, f->len, u->seg);
    f->ended = true;
    u->nflows--;
    if (f->src != f->dst) {
        /* A push that never came: this rank's own operand stands alone; a
         * pull: this rank keeps its own value of the block. */
        for (uint32_t s = en_dg_bitmap_next_missing(&f->bm, 0); s < f->nseg;
             s = en_dg_bitmap_next_missing(&f->bm, s + 1)) {
            uint64_t off = (uint64_t)s * u->seg;
            memcpy(f->dst + off, f->src + off, f->len - off < u->seg ? f->len - off : u->seg);
        }
    }
    op->lost_bytes[f->stage] += f->len - got;
    op->stage_bytes[f->stage] += f->len;
    send_ctl(op, f, CTL_FIN, f->pass, got, 0, NULL, 0, ~0u);
    en_exec_step_done(op, f->step);
}

static void recv_nack(struct en_udp *u, en_dgflow_t *f)
{
    en_dg_range_t rg[DG_RANGES];
    int n = en_dg_missing(&f->bm, rg, DG_RANGES);
    if (n > DG_RANGES) n = DG_RANGES;
    u->st.nacks++;
    if (u->debug)
        fprintf(stderr,
                "udp rank %d: op %llu NACK to %d stage %d pass %u: got %u of %u, mask %x closed "
                "%x, %d ranges first %u+%u\n",
                u->rail->rank, (unsigned long long)f->op->seq, f->peer, f->stage, f->pass,
                f->bm.got, f->nseg, f->done_mask, f->pdone, n, n ? rg[0].first : 0,
                n ? rg[0].count : 0);
    /* The next pass closes its paths anew. */
    f->pdone = 0;
    f->pdone_pass = f->pass + 1;
    send_ctl(f->op, f, CTL_NACK, f->pass, 0, 0, rg, n, ~0u);
}

/* The sender's pass is over and nothing more is expected: the bound met
 * ends the step, else the missing segments are asked for again. The bound
 * is the tensor's (DLCP), so a stage's receives share it: one may end
 * missing more than its share when those that ended before missed less
 * (counted as if every receive still running will miss nothing). A receive
 * of a few datagrams would otherwise have a bound below one datagram. */
static void recv_decide(struct en_udp *u, en_dgflow_t *f)
{
    if (f->ended || !f->done_seen) return;
    f->done_seen = false;
    en_op_t *op = f->op;
    uint64_t got = en_dg_bytes_got(&f->bm, f->len, u->seg);
    uint64_t total = op->dg->stage_len[f->stage];
    uint64_t missed = op->lost_bytes[f->stage] + (f->len - got);
    if (got == f->len ||
        (missed <= total && en_dg_bound_met(total - missed, total, op->loss[f->stage]))) {
        if (u->debug && got < f->len)
            fprintf(stderr,
                    "udp rank %d: op %llu recv from %d stage %d pass %u ends short: got %u of %u, "
                    "paths %x closed %x, %.1f ms after DONE\n",
                    u->rail->rank, (unsigned long long)op->seq, f->peer, f->stage, f->pass,
                    f->bm.got, f->nseg, f->done_mask, f->pdone,
                    (double)(bs_now_ns() - f->done_ns) / 1e6);
        recv_finish(u, f);
    } else
        recv_nack(u, f);
}

/* DONE came (its TCP link may overtake the datagrams): decide when
 * everything is here or every path the pass used is closed. Not after a
 * timeout: paths queue differently (the one with the TCP links longer, by
 * several ms), and a sprayed receive that gave up one period after the fast
 * path's DONE counted the slow path's datagrams, still on their way, as lost
 * (0.5% of every op at 0% drops). When a path's LAST and DONE copies are
 * both lost, the sender's DONE sent again (DG_AGAIN_MIN_NS, on every path,
 * after that path's data) closes it. */
static void recv_done_seen(struct en_udp *u, en_dgflow_t *f)
{
    f->done_seen = true;
    f->done_ns = bs_now_ns();
    recv_check(u, f);
}

/* A control message from peer, by TCP (path -1) or as a datagram on path. */
static void on_ctl(struct en_udp *u, en_op_t *op, int peer, int path, uint32_t tag,
                   const uint8_t *p, size_t len)
{
    int kind = p[0];
    uint32_t pass = en_get32(p + 4);
    if (kind == CTL_DONE) {
        en_dgflow_t *f = recv_flow(op, peer, tag);
        if (!f) return;
        bool again = p[1] & CTL_AGAIN;
        if (f->ended) {
            /* Our FIN was lost (both copies, or the TCP one is late). */
            if (again) ctl_again(u, op, f, CTL_FIN, f->pass, 0, NULL, 0);
            return;
        }
        /* A datagram copy closes its path: it left after the pass's data
         * there. The TCP copy closes none. */
        if (pass == f->pdone_pass && path >= 0) f->pdone |= (uint8_t)(1u << path);
        if (pass < f->done_next) {
            /* Each pass's DONE once (it comes by datagram and by TCP); a
             * later copy may close the last path. A DONE sent again for
             * the pass this receive asked to redo: the NACK was lost. */
            if (again && pass == f->pass && !f->done_seen) {
                en_dg_range_t rg[DG_RANGES];
                int n = en_dg_missing(&f->bm, rg, DG_RANGES);
                if (n > DG_RANGES) n = DG_RANGES;
                if (n > 0) ctl_again(u, op, f, CTL_NACK, f->pass, 0, rg, n);
            }
            recv_check(u, f);
            return;
        }
        f->done_next = pass + 1;
        f->pass = pass;
        /* The paths the pass used (none said: the rail's own). */
        uint64_t mask = en_get64(p + 16);
        f->done_mask = (uint8_t)(mask ? mask : 1);
        recv_done_seen(u, f); /* not posted yet: decided once it is */
        return;
    }
    en_dgflow_t *f = send_flow(op, peer, tag);
    if (!f || f->ended) return;
    op->t_progress_ns = bs_now_ns();
    if (kind == CTL_FIN) {
        if (u->debug)
            fprintf(stderr,
                    "udp rank %d: op %llu flow to %d stage %d: %.1f..%.1f ms, %u passes, %llu "
                    "halvings %llu increases, rate %.0f Mbit/s (path 0)\n",
                    u->rail->rank, (unsigned long long)op->seq, f->peer, f->stage,
                    (f->t_start - op->t_start_ns) / 1e6, (bs_now_ns() - op->t_start_ns) / 1e6,
                    f->pass + 1, (unsigned long long)f->fp[0].rc.halvings,
                    (unsigned long long)f->fp[0].rc.increases, f->fp[0].rc.rate_bps / 1e6);
        f->ended = true;
        u->nflows--;
        send_list_remove(u, f);
        if (f->stage == SC_STAGE_PUSH && f->chunk < 64)
            op->dg->push_live[f->peer] &= ~(1ull << f->chunk);
        en_exec_step_done(op, f->step);
    } else if (kind == CTL_NACK) {
        if (pass != f->pass) return; /* a copy, or about a pass already redone */
        size_t nr = (len - CTL_HDR) / 8;
        en_dg_range_t *rg = coh_malloc(sizeof(*rg) * (nr ? nr : 1));
        if (!rg) return;
        int k = 0;
        for (size_t i = 0; i < nr; i++) {
            uint32_t first = en_get32(p + CTL_HDR + 8 * i), cnt = en_get32(p + CTL_HDR + 8 * i + 4);
            if (first >= f->nseg || cnt == 0 || cnt > f->nseg - first) continue; /* garbage */
            rg[k++] = (en_dg_range_t){first, cnt};
        }
        if (k == 0) {
            coh_free(rg);
            return;
        }
        coh_free(f->rg);
        f->rg = rg;
        f->nrg = k;
        f->ri = 0;
        f->rk = 0;
        f->pass++;
        f->pmask = 0;
        f->nredo = 0;
        for (int j = 0; j < u->npaths; j++) en_rc_retransmit(&f->fp[j].rc);
        f->again_ns = 0;
        send_list_add(u, f);
        pump(u);
    }
}

int en_udp_ctl(en_rail_t *rail, en_conn_t *c, const en_hdr_t *h, const uint8_t *p, size_t len)
{
    struct en_udp *u = rail->udp;
    if (len < CTL_HDR || (len - CTL_HDR) % 8 || p[0] < CTL_DONE || p[0] > CTL_FIN)
        return COH_EPROTO;
    if (!u) return 0;
    en_op_t *op = en_exec_find_op(rail, h->comm, h->seq);
    if (!op) {
        /* The receiver's op comes later: keep the sender's DONE for it. */
        if (p[0] == CTL_DONE && !en_exec_ended(rail, h->comm, h->seq, NULL))
            keep_add(u, h->comm, h->seq, c->peer, -1, h->tag, true, p, len);
        return 0;
    }
    if (op->state != EN_OP_RUNNING || !op->dg) return 0;
    op->progressing = true;
    on_ctl(u, op, c->peer, -1, h->tag, p, len);
    op->progressing = false;
    en_exec_kick(op);
    return 0;
}

/* ---- ops ---- */

static void adopt_paths(struct en_udp *u);

bool en_udp_usable(const en_rail_t *rail, const en_op_t *op)
{
    return rail->udp && !rail->udp->lent &&
           (op->loss[SC_STAGE_PUSH] > 0 || op->loss[SC_STAGE_PULL] > 0);
}

int en_udp_op_start(en_op_t *op)
{
    en_rail_t *rail = op->rail;
    struct en_udp *u = rail->udp;
    op->dg = coh_zalloc(sizeof(*op->dg));
    if (op->dg) {
        op->dg->flows = coh_zalloc(sizeof(en_dgflow_t) * (op->plan.nsteps + 1));
        op->dg->push_live = coh_zalloc(sizeof(uint64_t) * (size_t)rail->world);
    }
    if (!op->dg || !op->dg->flows || !op->dg->push_live) return COH_ENOMEM;
    if (u->group) adopt_paths(u);
    refresh_peers(u);
    /* What the header has room for (en_dgram.h): far beyond any real op.
     * Checked before any flow counts in nflows. */
    if (op->seq > EN_DG_SEQ_MAX)
        return bs_fail(COH_EINVAL, "udp: op %llu past the datagram header's sequence numbers",
                       (unsigned long long)op->seq);
    for (uint32_t i = 0; i < op->plan.nsteps; i++) {
        const sc_step_t *s = &op->plan.steps[i];
        if (s->stage &&
            (s->tag > EN_DG_STEP_MAX || en_dg_nseg(s->count * op->esize, u->seg) > EN_DG_NSEG_MAX))
            return bs_fail(COH_EINVAL,
                           "udp: a step of %llu bytes (tag %u) does not fit the datagram header "
                           "(at most %u segments)",
                           (unsigned long long)(s->count * op->esize), s->tag, EN_DG_NSEG_MAX);
    }
    for (uint32_t i = 0; i < op->plan.nsteps; i++) {
        const sc_step_t *s = &op->plan.steps[i];
        bool recv = s->kind == SC_RECV || s->kind == SC_RECV_REDUCE;
        if (!s->stage || !(recv || s->kind == SC_SEND) || s->count == 0) continue;
        en_dgflow_t *f = &op->dg->flows[i];
        f->op = op;
        f->step = i;
        f->peer = s->peer;
        f->stage = s->stage;
        f->recv = recv;
        f->len = s->count * op->esize;
        f->nseg = en_dg_nseg(f->len, u->seg);
        if (recv) {
            op->dg->stage_len[s->stage] += f->len;
            f->dst = op->buf[s->dst] + s->dst_off * op->esize;
            f->reduce = s->kind == SC_RECV_REDUCE;
            /* A reduce's other operand; a plain receive's fallback: what a
             * segment that never came keeps (the plan's src). */
            f->src = op->buf[s->src] + s->src_off * op->esize;
            if (en_dg_bitmap_init(&f->bm, f->nseg) != 0) {
                f->op = NULL; /* not counted in nflows: op_end must not take it off */
                return COH_ENOMEM;
            }
        } else {
            f->src = op->buf[s->src] + s->src_off * op->esize;
            /* Pushes to a peer are numbered in plan order (the chunks'),
             * counted in push_live until the numbering is done. */
            if (s->stage == SC_STAGE_PUSH) f->chunk = (uint32_t)op->dg->push_live[s->peer]++;
        }
        u->nflows++;
    }
    memset(op->dg->push_live, 0, sizeof(uint64_t) * (size_t)rail->world);
    /* DONE messages that came before the op. */
    for (dg_keep_t **pp = &u->keep; *pp;) {
        dg_keep_t *k = *pp;
        if (k->ctl && k->comm == op->comm && k->seq == op->seq) {
            on_ctl(u, op, k->peer, k->path, k->tag, k->data, k->len);
            keep_drop(u, pp);
        } else {
            pp = &k->next;
        }
    }
    timer_arm(u);
    return 0;
}

int en_udp_send(en_op_t *op, uint32_t i)
{
    struct en_udp *u = op->rail->udp;
    en_dgflow_t *f = &op->dg->flows[i];
    if (!f->op) return 1; /* not a datagram step */
    if (u->path[0].peer[f->peer].ss_family == 0)
        return bs_fail(COH_EPEER, "no udp address for rank %d", f->peer);
    f->rg = coh_malloc(sizeof(en_dg_range_t));
    if (!f->rg) return COH_ENOMEM;
    f->rg[0] = (en_dg_range_t){0, f->nseg};
    f->nrg = 1;
    /* Every path starts at line rate; one the peer has no address on
     * (spraying: its rail failed to resolve) stays unused. */
    for (int k = 0; k < u->npaths; k++) {
        en_rc_init(&f->fp[k].rc, u->path[k].line_bps, u->delta, DG_AI);
        f->fp[k].pacer.next_ns = 0;
    }
    f->pmask = 0;
    /* Flows of one datagram would all take path 0 first: start apart. */
    f->pnext = (uint8_t)((op->seq + i) % (uint64_t)u->npaths);
    f->period_t0 = f->t_start = bs_now_ns();
    if (f->stage == SC_STAGE_PUSH && f->chunk < 64) op->dg->push_live[f->peer] |= 1ull << f->chunk;
    if (op->nlayers > 0 || op->ecn) {
        int prio = en_tag_prio(op->layer, op->nlayers, 8);
        f->tos_lo = en_tag_tos(prio, false);
        f->tos_hi = en_tag_tos(prio, op->ecn);
        if (op->ecn && (op->dtype == COH_F32 || op->dtype == COH_F64))
            f->median = en_tag_median(f->src, f->len / op->esize, op->esize, 0.001);
    }
    send_list_add(u, f);
    pump(u);
    return 0;
}

int en_udp_post(en_op_t *op, uint32_t i)
{
    struct en_udp *u = op->rail->udp;
    en_dgflow_t *f = &op->dg->flows[i];
    if (!f->op) return 1;
    f->posted = true;
    f->period_t0 = bs_now_ns();
    /* Decide after the whole stash is in, not at its first segment (a DONE
     * may be here already, its paths closed). */
    for (dg_keep_t **pp = &u->keep; *pp;) {
        dg_keep_t *k = *pp;
        if (!k->ctl && k->comm == op->comm && k->seq == op->seq && k->peer == f->peer &&
            k->tag == op->plan.steps[i].tag) {
            en_dg_hdr_t h;
            if (en_dg_decode(k->data, k->len, u->seg, &h) == 0 && dg_fits(u, f, &h))
                recv_segment(u, f, k->path, &h, k->data + EN_DG_HDR);
            else
                u->st.dg_bad++;
            keep_drop(u, pp);
        } else {
            pp = &k->next;
        }
    }
    recv_check(u, f);
    return 0;
}

void en_udp_div(en_op_t *op, uint32_t i)
{
    struct en_udp *u = op->rail->udp;
    const sc_step_t *s = &op->plan.steps[i];
    uint8_t *base = op->buf[s->dst] + s->dst_off * op->esize;
    uint64_t len = s->count * op->esize;
    uint32_t nseg = en_dg_nseg(len, u->seg);
    /* The pushes reduced into this block: the contributors of each segment
     * are this rank and the pushes whose segment arrived. */
    for (uint32_t g = 0; g < nseg; g++) {
        double n = 1;
        for (uint32_t j = 0; j < op->plan.nsteps; j++) {
            const en_dgflow_t *f = &op->dg->flows[j];
            if (f->op && f->recv && f->reduce && f->dst == base && f->len == len)
                n += en_dg_bitmap_test(&f->bm, g);
        }
        uint64_t off = (uint64_t)g * u->seg;
        uint64_t sl = len - off < u->seg ? len - off : u->seg;
        gpu_cpu_div(op->dtype, base + off, sl / op->esize, n);
    }
}

void en_udp_op_end(en_op_t *op)
{
    en_rail_t *rail = op->rail;
    struct en_udp *u = rail ? rail->udp : NULL;
    if (!u || !op->dg) return;
    for (uint32_t i = 0; i < op->plan.nsteps; i++) {
        en_dgflow_t *f = &op->dg->flows[i];
        if (!f->op) continue;
        send_list_remove(u, f);
        if (!f->ended) u->nflows--;
        f->ended = true;
    }
    for (dg_keep_t **pp = &u->keep; *pp;) {
        if ((*pp)->comm == op->comm && (*pp)->seq == op->seq)
            keep_drop(u, pp);
        else
            pp = &(*pp)->next;
    }
}

void en_udp_op_free(en_op_t *op)
{
    if (!op->dg) return;
    for (uint32_t i = 0; i < op->plan.nsteps; i++) {
        en_dg_bitmap_fini(&op->dg->flows[i].bm);
        coh_free(op->dg->flows[i].rg);
        coh_free(op->dg->flows[i].redo);
    }
    coh_free(op->dg->flows);
    coh_free(op->dg->push_live);
    coh_free(op->dg);
    op->dg = NULL;
}

/* ---- the rail's socket, and the group's ---- */

/* Path k: the socket of owner (this engine's own, or a group member's). */
static void path_attach(struct en_udp *u, int k, struct en_udp *owner)
{
    dg_path_t *pt = &u->path[k];
    pt->u = u;
    pt->owner = owner;
    pt->idx = k;
    pt->fd = owner->fd;
    pt->line_bps = owner->line_bps;
    pt->gso_max = owner->gso_max;
    pt->gro = owner->gro && u->gro; /* the receive buffers are sized by u's */
    if (owner->gro && !u->gro) setsockopt(pt->fd, SOL_UDP, UDP_GRO, &(int){0}, sizeof(int));
    uv_poll_init(u->rail->loop, &pt->poll, pt->fd);
    pt->poll.data = pt;
    pt->poll_open = pt->open = true;
    poll_set(pt, UV_READABLE);
}

/* The group's members that opened their socket since (they open after the
 * lead, each on its own rail's thread, before the context runs ops). */
static void adopt_paths(struct en_udp *u)
{
    for (int k = 1; k < u->npaths; k++) {
        if (u->path[k].open) continue;
        struct en_udp *m = atomic_load(&u->group->udp[k]);
        if (m) path_attach(u, k, m);
    }
}

int en_udp_open(en_rail_t *rail, const en_udp_cfg_t *cfg)
{
    struct en_udp *u = coh_zalloc(sizeof(*u));
    if (!u) return bs_fail(COH_ENOMEM, "rail %d: out of memory", rail->index);
    rail->udp = u;
    u->rail = rail;
    u->fd = -1;
    u->seg = cfg->seg_bytes & ~7u;
    u->line_bps = cfg->rate_mbps * 1e6;
    u->delta = cfg->delta;
    u->period_ns = (uint64_t)cfg->period_us * 1000ull;
    u->drop_ppm = cfg->test_drop_ppm;
    u->send_fail = cfg->test_send_fail;
    u->ctl_dgram_only = cfg->test_ctl_dgram_only;
    u->rng = bs_now_ns() ^ ((uint64_t)rail->rank << 32) ^ (uint64_t)rail->index;
    u->keep_limit = rail->stash_limit;
    u->debug = getenv("COHORT_UDP_DEBUG") != NULL;
    /* Derived from the job token: a stranger without it cannot forge data. */
    u->job = en_dg_job(rail->token);
    /* UDP GSO / GRO where the kernel has them (Linux 4.18 / 5.0): a send
     * of a group of datagrams, a receive of a run of them. */
    int gso = (int)(u->seg + EN_DG_HDR), one = 1;
    u->gso_max = 65000 / gso < DG_QMAX ? 65000 / gso : DG_QMAX;
    u->group = cfg->group && cfg->group->n > 1 && cfg->gidx >= 0 ? cfg->group : NULL;
    u->gidx = u->group ? cfg->gidx : 0;
    u->lent = u->gidx > 0;
    u->npaths = u->group && !u->lent ? u->group->n : 1;
    for (int k = 0; k < u->npaths; k++) {
        u->path[k].peer = coh_zalloc(sizeof(struct sockaddr_storage) * (size_t)rail->world);
        if (!u->path[k].peer) return bs_fail(COH_ENOMEM, "rail %d: out of memory", rail->index);
    }
    u->took = coh_zalloc((size_t)rail->world);
    u->batch = coh_malloc(sizeof(dg_batch_t) * EN_DG_PATHS);
    if (!u->took || !u->batch) return bs_fail(COH_ENOMEM, "rail %d: out of memory", rail->index);
    const struct sockaddr_storage *a = &rail->bound;
    u->fd = socket(a->ss_family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (u->fd < 0)
        return bs_fail(COH_ESYS, "rail %d: udp socket: %s", rail->index, strerror(errno));
    int rcv = (int)cfg->rcvbuf_bytes, snd = (int)(cfg->rcvbuf_bytes / 2);
    /* Root may go past rmem_max; others get what the kernel allows. */
    if (setsockopt(u->fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcv, sizeof(rcv)) != 0)
        setsockopt(u->fd, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof(rcv));
    if (setsockopt(u->fd, SOL_SOCKET, SO_SNDBUFFORCE, &snd, sizeof(snd)) != 0)
        setsockopt(u->fd, SOL_SOCKET, SO_SNDBUF, &snd, sizeof(snd));
    if (bind(u->fd, (const struct sockaddr *)a, en_sa_size(a)) != 0)
        return bs_fail(COH_ESYS, "rail %d: udp bind to its listener's address: %s", rail->index,
                       strerror(errno));
    /* Probe GSO with the socket option, then clear it: each send says its
     * own segment size (a group of one needs none). */
    int off = 0;
    if (u->gso_max < 2 || setsockopt(u->fd, SOL_UDP, UDP_SEGMENT, &gso, sizeof(gso)) != 0)
        u->gso_max = 1;
    else
        setsockopt(u->fd, SOL_UDP, UDP_SEGMENT, &off, sizeof(off));
    u->gro = setsockopt(u->fd, SOL_UDP, UDP_GRO, &one, sizeof(one)) == 0;
    if (u->lent) {
        /* The lead reads and writes this socket from now on (it adopts it
         * at its next op): it is where peers send this rail's datagrams. */
        atomic_store(&u->group->udp[u->gidx], u);
        return 0;
    }
    u->rxsz = u->gro ? 65536 : u->seg + EN_DG_HDR + 64;
    u->rxbuf = coh_aligned(u->rxsz * DG_BATCH, 64);
    if (!u->rxbuf) return bs_fail(COH_ENOMEM, "rail %d: out of memory", rail->index);
    path_attach(u, 0, u);
    if (u->group) atomic_store(&u->group->udp[0], u);
    uv_timer_init(rail->loop, &u->timer);
    u->timer.data = u;
    u->timer_open = true;
    return 0;
}

static void udp_closed(uv_handle_t *h)
{
    (void)h;
}

void en_udp_shutdown(en_rail_t *rail)
{
    struct en_udp *u = rail->udp;
    if (!u) return;
    if (u->debug) {
        en_udp_stats_t t;
        en_udp_stats(rail, &t);
        fprintf(stderr,
                "udp rank %d: sent %llu recv %llu dup %llu bad %llu stranger %llu late %llu kept "
                "%llu dropped %llu nacks %llu resent %llu ctl-again %llu\n",
                rail->rank, (unsigned long long)t.dg_sent, (unsigned long long)t.dg_recv,
                (unsigned long long)t.dg_dup, (unsigned long long)t.dg_bad,
                (unsigned long long)t.dg_stranger, (unsigned long long)t.dg_late,
                (unsigned long long)t.dg_kept, (unsigned long long)t.dg_dropped,
                (unsigned long long)t.nacks, (unsigned long long)t.resent_bytes,
                (unsigned long long)t.ctl_again);
    }
    for (int k = 0; k < u->npaths; k++)
        if (u->path[k].poll_open) {
            uv_close((uv_handle_t *)&u->path[k].poll, udp_closed);
            u->path[k].poll_open = false;
        }
    if (u->timer_open) uv_close((uv_handle_t *)&u->timer, udp_closed);
    u->timer_open = u->timer_on = false;
    while (u->keep) keep_drop(u, &u->keep);
}

void en_udp_fini(en_rail_t *rail)
{
    struct en_udp *u = rail->udp;
    if (!u) return;
    if (u->fd >= 0) close(u->fd);
    while (u->keep) keep_drop(u, &u->keep);
    coh_free(u->rxbuf);
    for (int k = 0; k < u->npaths; k++) {
        coh_free(u->path[k].peer);
    }
    coh_free(u->took);
    coh_free(u->batch);
    coh_free(u);
    rail->udp = NULL;
}

void en_udp_stats(const en_rail_t *rail, en_udp_stats_t *out)
{
    memset(out, 0, sizeof(*out));
    const struct en_udp *u = rail->udp;
    if (!u) return;
    *out = (en_udp_stats_t){.dg_sent = atomic_load(&u->st.dg_sent),
                            .dg_recv = atomic_load(&u->st.dg_recv),
                            .dg_dup = atomic_load(&u->st.dg_dup),
                            .dg_bad = atomic_load(&u->st.dg_bad),
                            .dg_stranger = atomic_load(&u->st.dg_stranger),
                            .dg_late = atomic_load(&u->st.dg_late),
                            .dg_kept = atomic_load(&u->st.dg_kept),
                            .dg_dropped = atomic_load(&u->st.dg_dropped),
                            .dg_test_dropped = atomic_load(&u->st.dg_test_dropped),
                            .nacks = atomic_load(&u->st.nacks),
                            .resent_bytes = atomic_load(&u->st.resent_bytes),
                            .ctl_again = atomic_load(&u->st.ctl_again)};
}
