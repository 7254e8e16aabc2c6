/*
 * rx_ctl.h - the control plane: messages between ranks and the coordinator.
 *
 * Every rank keeps one TCP connection to the coordinator (rank
 * COHORT_COORDINATOR), opened at init with a HELLO of kind EN_HELLO_CTRL (job
 * token first, rx_conn.h), separate from the data rails. It carries small
 * messages:
 *
 *   READY   rank -> coordinator  "I finished a step: place me in a group"
 *   PLAN    coordinator -> rank  "your group: these members, this weight"
 *   DONE    rank -> coordinator  "that group's op ended (status, duration,
 *                                 what I measured of my peers' links)"
 *   REFUSE  rank -> coordinator  "your plan names a rank I know is gone"
 *   LEAVE   rank -> coordinator  "I will not sync again: do not wait for me"
 *   PING    both ways            "I am alive" (every COHORT_LIVENESS_MS / 5):
 *                                 a side that hears nothing, PING or other,
 *                                 for COHORT_LIVENESS_MS takes the other for
 *                                 hung (a SIGSTOPped process keeps its TCP
 *                                 connections open, so only silence tells).
 *                                 Each PING also goes as a datagram (BEAT,
 *                                 below): on a lossy link a TCP segment lost
 *                                 four times in a row is held back 3 s by
 *                                 the retransmission backoff (0.2 + 0.4 +
 *                                 0.8 + 1.6 s), and every message behind it
 *                                 with it; a rank that is alive must not be
 *                                 taken for hung then
 *   LOST    coordinator -> rank  "rank r failed (died, hung, missed its fault
 *                                 deadline): drop it" (its data connections
 *                                 too, so no op waits on it)
 *   BYE     either way           "I am finalizing": the connection's close
 *                                 that follows is not a failure
 *   SHRINK  rank -> coordinator  "make a communicator of comm's live ranks"
 *                                 (coh_comm_shrink; carries comm's members)
 *   SHRUNK  coordinator -> rank  "here it is": its id and ranks, once every
 *                                 live member asked
 *   GROW    rank -> coordinator  "make a communicator of comm's live ranks and
 *                                 the ranks that rejoined" (coh_comm_grow; a
 *                                 rank that rejoined sends it with no members;
 *                                 the answer is a SHRUNK)
 *   PROBE   rank -> coordinator  "what I measured of my links" (coh_probe:
 *                                 latency and rate per peer and rail)
 *   LBTAB   coordinator -> rank  "the rail balancer's table for epochs e ..
 *                                 e + more" (the packed sc_lb table world ops
 *                                 of those epochs are split with,
 *                                 docs/multirail.md)
 *   RAIL    rank -> coordinator  "my link to peer on rail r failed over /
 *                                 came back / is gone" (the balancer marks
 *                                 the rail down while any link on it is off)
 *   RPLAN   coordinator -> rank  a relay group's phase (COH_SYNC_RELAY):
 *                                 phase 1, the ring over every live rank in
 *                                 which the late ones relay; phase 2, how
 *                                 the late ranks' data is folded in
 *   COMMIT  coordinator -> rank  "every member of relay group g has its
 *                                 result: keep it" (status 0), or "a member
 *                                 failed before all had it: start over"
 *                                 (< 0). A relay op ends on every survivor
 *                                 with the same result or on none of them
 *   STATE   rank -> coordinator  sent to an elected coordinator on reaching
 *                                 it: the last relay group this rank
 *                                 committed, and the one whose COMMIT it
 *                                 still waits for (0: none)
 *
 * Framing: a 16-byte header, then `len` payload bytes, little-endian:
 *   0 u32 magic "COHC"  4 u8 type  5 u8 flags (0)  6 u16 reserved (0)
 *   8 u32 len           12 u32 comm
 */
#ifndef COH_RX_CTL_H
#define COH_RX_CTL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "reactor/reactor.h"
#include "reactor/rx_conn.h"

#define RX_CTL_MAGIC   0x43484f43u /* "COHC" */
#define RX_CTL_HDR     16
#define RX_CTL_MAX     (1u << 24) /* payload limit: plans for up to ~4M members */
#define RX_CTL_MAXBW   64         /* link measurements per DONE */
#define RX_CTL_MAXLB   16384      /* bytes of a packed balancer table (>= SC_LB_PACK_MAX) */
#define RX_CTL_LB_MORE 1024       /* epochs one LBTAB may cover beyond its first */

typedef enum rx_ctl_type {
    RX_CTL_READY = 1,
    RX_CTL_PLAN = 2,
    RX_CTL_DONE = 3,
    RX_CTL_REFUSE = 4,
    RX_CTL_LEAVE = 5, /* rank -> coordinator: "I will not sync again": payload u32 rank */
    RX_CTL_PING = 6,  /* either way: payload u32 sender rank */
    RX_CTL_LOST = 7,  /* coordinator -> rank: u32 rank, u32 silent ms, u32 rx_lost_why */
    RX_CTL_LBTAB = 8, /* coordinator -> rank: u64 epoch, u32 len, u32 more, len table bytes */
    RX_CTL_RAIL = 9,  /* rank -> coordinator: u32 rank, u32 rail, u32 peer, u32 kind */
    RX_CTL_RPLAN = 10,
    RX_CTL_BYE = 11,    /* either way: u32 sender rank */
    RX_CTL_SHRINK = 12, /* u32 rank, u32 comm, u32 top comm id known, u32 n, n u32 members */
    RX_CTL_SHRUNK = 13, /* u32 comm, u32 new comm, i32 status, u32 n, n u32 world ranks */
    RX_CTL_PROBE = 14,  /* u32 rank, u32 n, n x (u32 peer, u32 rail, f64 latency s, f64 Gbps) */
    RX_CTL_COMMIT = 15, /* coordinator -> rank: u64 group, i32 status, u32 0 */
    RX_CTL_STATE = 16,  /* rank -> coordinator: u32 rank, u32 0, u64 committed, u64 awaiting */
    RX_CTL_GROW = 17,   /* as SHRINK; n 0: from a rank that rejoined (it knows no members) */
} rx_ctl_type;

/*
 * BEAT: the datagram twin of PING, on a UDP socket bound to each rank's
 * control address (its coordinator's listener, rx_beat.c). 24 bytes,
 * little-endian:
 *   0 u32 magic "COHB"  4 u8 version (1)  5 u8 kind (rx_beat_kind)  6 u16 0
 *   8 u32 sender rank  12 u32 world  16 u64 the job's beat value (from the
 *   token: a stranger cannot make one)
 * It only counts as "heard": a lost one costs nothing. A beat counts only
 * from the sender's control address as the job began, so a rank that
 * rejoined (a new process, a new port) is heard through TCP alone.
 */
#define RX_BEAT_MAGIC 0x42484f43u /* "COHB" */
#define RX_BEAT_LEN   24
typedef enum rx_beat_kind {
    RX_BEAT_TO_COORD = 1,  /* a member to its coordinator */
    RX_BEAT_TO_MEMBER = 2, /* the coordinator to a member */
} rx_beat_kind;
/* The beat value of a job token. */
uint64_t rx_beat_value(const char *token);
void rx_beat_encode(uint8_t out[RX_BEAT_LEN], rx_beat_kind kind, uint32_t rank, uint32_t world,
                    uint64_t value);
/* 0 and the sender's rank and kind when buf is a beat of this job and
 * world; COH_EPROTO otherwise. */
int rx_beat_decode(const uint8_t *buf, size_t len, uint32_t world, uint64_t value,
                   rx_beat_kind *kind, uint32_t *rank);

/* Why the coordinator took a rank for failed (LOST). */
typedef enum rx_lost_why {
    RX_LOST_SILENT = 1,   /* nothing heard for COHORT_LIVENESS_MS */
    RX_LOST_CLOSED = 2,   /* its control connection closed without BYE */
    RX_LOST_FAULT = 3,    /* a relay that missed T_fault */
    RX_LOST_REPORTED = 4, /* a member found its data connections gone */
    RX_LOST_OTHER = 5,    /* a protocol violation, or no memory to plan it */
    RX_LOST_WHY_MAX
} rx_lost_why;
const char *rx_lost_why_text(int why);

/* How phase 2 of a relay group folds the late ranks' data in. */
typedef enum rx_relay_method {
    RX_RELAY_NONE = 0,      /* nobody late is left: the phase-1 result is final */
    RX_RELAY_BCAST = 1,     /* one late rank: broadcast its data around the ring */
    RX_RELAY_ALLREDUCE = 2, /* several: allreduce, the others contributing the identity */
} rx_relay_method;

/* Why a PLAN refuses (status < 0): carried in `full`, which a refusal does
 * not otherwise use. */
typedef enum rx_ctl_why {
    RX_CTL_WHY_NONE = 0,
    RX_CTL_WHY_COUNT = 1,  /* members disagree on count or dtype */
    RX_CTL_WHY_MODE = 2,   /* ranks disagree on the sync mode: members = {rank, its mode} */
    RX_CTL_WHY_WEIGHT = 3, /* the group's total weight is out of range */
    RX_CTL_WHY_OUT = 4,    /* this rank is out of the schedule */
    RX_CTL_WHY_COUNT_MAX
} rx_ctl_why;

typedef struct rx_ctl_ready {
    uint32_t rank;
    uint32_t mode;      /* coh_sync_mode */
    uint64_t iteration; /* the caller's, for traces */
    uint64_t count;
    uint32_t dtype;
    double compute_s; /* time since this rank's previous sync ended */
    double weight;
    uint64_t attempt;  /* this rank's attempt number: a PLAN answers one */
    uint32_t redop;    /* coh_redop of a plain relay allreduce (COH_SUM for syncs) */
    uint32_t plain;    /* 1: coh_allreduce_ex (no weights), 0: a weighted sync */
    uint64_t last_gid; /* the newest group this rank took part in (an elected
                          coordinator numbers its groups above every one) */
    uint32_t join;     /* a late rank whose reactor relays phase 1 of its group: the
                          first segment its own data went into (RX_JOIN_NONE: none) */
} rx_ctl_ready_t;

/* READY.join of a rank that joined no segment of phase 1. */
#define RX_JOIN_NONE 0xffffffffu
/* Most segments of a relay group's phase 1. */
#define RX_MAX_SEGS 64u

typedef struct rx_ctl_plan {
    uint64_t group_id;
    uint64_t attempt;
    int32_t status; /* < 0: no group; the sync fails with this status */
    uint32_t full;  /* 1: every live rank; for a refusal, an rx_ctl_why */
    double total_weight;
    uint32_t nmembers;
    const uint8_t *members;     /* nmembers little-endian u32 ranks, ring order (decode) */
    const uint32_t *members_in; /* (encode) */
} rx_ctl_plan_t;

/* A relay group's phase for one rank. */
typedef struct rx_ctl_rplan {
    uint64_t group_id;
    uint64_t attempt; /* the READY it answers; 0: phase 1 of a relay (it sent none) */
    uint32_t phase;   /* 1 or 2 */
    uint32_t method;  /* phase 2: rx_relay_method */
    uint32_t final;   /* 1: the result is complete after this phase */
    uint64_t count;
    uint32_t dtype, redop, plain;
    int32_t exp;         /* weighted syncs on floating point: weights scale by 2^-exp */
    double total_weight; /* final: sum of the weights folded in (plain: contributors) */
    uint32_t nring, nlate;
    uint32_t nseg;              /* phase 1: runs as nseg ops over consecutive segments of the data,
                                   so a late rank's data can join the segments still to come */
    uint64_t prefix;            /* phase 2: the elements it covers, from the start (the late ranks'
                                   data that missed phase 1's segments) */
    const uint8_t *ring, *late; /* little-endian u32 ranks (decode) */
    const uint32_t *ring_in, *late_in; /* (encode) */
} rx_ctl_rplan_t;

/* SHRINK, GROW and SHRUNK: a communicator's ranks (world ranks, in its order). */
typedef struct rx_ctl_shrink {
    uint32_t rank;    /* SHRINK: the sender */
    uint32_t comm;    /* the communicator shrunk */
    uint32_t newcomm; /* SHRUNK: the new one's id */
    uint32_t top;     /* SHRINK: the highest communicator id the sender knows */
    int32_t status;   /* SHRUNK: < 0: no new communicator */
    uint32_t n;
    const uint8_t *ranks;     /* decode */
    const uint32_t *ranks_in; /* encode */
} rx_ctl_shrink_t;

typedef struct rx_ctl_link {
    uint32_t peer, rail;
    double latency_s, gbps;
} rx_ctl_link_t;

typedef struct rx_ctl_probe {
    uint32_t rank, n;
    const uint8_t *links;          /* decode: n x 24 bytes (rx_ctl_probe_link) */
    const rx_ctl_link_t *links_in; /* encode */
} rx_ctl_probe_t;
/* Link i of a decoded PROBE. */
void rx_ctl_probe_link(const rx_ctl_probe_t *p, uint32_t i, rx_ctl_link_t *out);

typedef struct rx_ctl_bw {
    uint32_t peer;
    uint64_t bytes;
    double seconds;
} rx_ctl_bw_t;

typedef struct rx_ctl_done {
    uint64_t group_id;
    uint32_t rank;
    int32_t status;
    double duration_s;
    uint32_t nbw;
    rx_ctl_bw_t bw[RX_CTL_MAXBW];
} rx_ctl_done_t;

typedef struct rx_ctl_refuse {
    uint64_t group_id;
    uint64_t attempt;
    uint32_t rank;
    uint32_t gone; /* the member this rank knows is gone */
} rx_ctl_refuse_t;

typedef struct rx_ctl_lbtab {
    uint64_t epoch;
    uint32_t more; /* the same table also for the next `more` epochs (<= RX_CTL_LB_MORE) */
    uint32_t len;
    const uint8_t *table; /* len bytes (decode: into the buffer parsed) */
} rx_ctl_lbtab_t;

typedef struct rx_ctl_rail {
    uint32_t rank, rail, peer;
    uint32_t kind; /* en_rail_event_kind: 1 failover, 2 return, 3 gone */
} rx_ctl_rail_t;

/* COMMIT: a relay group's last word. */
typedef struct rx_ctl_commit {
    uint64_t group_id;
    int32_t status; /* 0: keep the result; < 0: start over */
} rx_ctl_commit_t;

/* STATE: where a rank stands, for an elected coordinator. */
typedef struct rx_ctl_state {
    uint32_t rank;
    uint64_t committed; /* the newest relay group it kept the result of */
    uint64_t awaiting;  /* the relay group whose COMMIT it waits for, 0: none */
} rx_ctl_state_t;

typedef struct rx_ctl_msg {
    uint8_t type;
    uint32_t comm;
    union {
        rx_ctl_ready_t ready;
        rx_ctl_plan_t plan;
        rx_ctl_done_t done;
        rx_ctl_refuse_t refuse;
        uint32_t leave_rank;
        uint32_t ping_rank;
        uint32_t bye_rank;
        struct {
            uint32_t rank;
            uint32_t silent_ms;
            uint32_t why; /* rx_lost_why */
        } lost;
        rx_ctl_lbtab_t lbtab;
        rx_ctl_rail_t rail;
        rx_ctl_rplan_t rplan;
        rx_ctl_shrink_t shrink; /* SHRINK, GROW and SHRUNK */
        rx_ctl_probe_t probe;
        rx_ctl_commit_t commit;
        rx_ctl_state_t state;
    } u;
} rx_ctl_msg_t;

/* Bytes the message takes when buf holds it all, 0 for "need more",
 * COH_EPROTO for bytes that cannot be a message. Pointers in the result
 * point into buf. */
int rx_ctl_parse(const uint8_t *buf, size_t len, rx_ctl_msg_t *m);
/* Encoders: the length written, or COH_EINVAL when cap is too small. */
int rx_ctl_encode(const rx_ctl_msg_t *m, uint8_t *out, size_t cap);
/* Bytes rx_ctl_encode needs for m. */
size_t rx_ctl_size(const rx_ctl_msg_t *m);

/* ---- on a connection (reactor/rx_conn.h) ---- */

/* The framing for rx_conn_proto_t: the coordinator's and the members'. */
#define RX_CTL_PROTO_INIT(parse_fn, ready_fn, close_fn)                                            \
    {                                                                                              \
        .name = "control", .hello_kind = EN_HELLO_CTRL, .max_msg = RX_CTL_HDR + RX_CTL_MAX,        \
        .parse = parse_fn, .on_ready = ready_fn, .on_close = close_fn                              \
    }

/* Loop thread. Encode and queue a message; COH_EPEER when the conn is closing. */
int rx_ctl_send(rx_conn_t *c, const rx_ctl_msg_t *m);

#endif
