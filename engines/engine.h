/*
 * engine.h - data movement.
 *
 * engines/ owns the transports (one ops table each: tcp, shm, verbs; the
 * bounded-loss udp datagrams beside a rail), the per-rail state (connections to every peer, the
 * ops in flight) and the plan executor that runs a rank's part of a
 * collective (sched/sc_plan.h) as a state machine driven by completions.
 *
 * The boundary with reactor/ (nng's transport rule, UCX's completion): an
 * engine is handed a libuv loop and runs on that loop's thread; it never
 * calls up. An op carries a completion object (en_completion_t) that the
 * engine calls exactly once, when the op has ended and no longer touches the
 * caller's buffers, with the op's status, the reason and the link
 * measurements it made. Whoever submitted the op owns everything else: the
 * countdown of slices, the first error, cancelling sibling slices, threads
 * and cross-thread submission. A test drives an engine with a counting
 * completion and a bare loop.
 *
 * Threading: everything here runs on the rail's loop thread unless a
 * function says otherwise.
 */
#ifndef COH_ENGINE_H
#define COH_ENGINE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <uv.h>

#include "base/base.h"
#include "engines/en_frame.h"
#include "sched/sc_plan.h"
#include "sched/sc_rails.h"

#define EN_MAX_RAILS SC_MAX_RAILS
#define EN_SHM_NAME  48 /* a context's shared-memory name, NUL included */

/* A socket address's length, and whether two are the same (family, address
 * and port): the datagram sockets' peer checks. */
static inline socklen_t en_sa_size(const struct sockaddr_storage *a)
{
    return a->ss_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
}

static inline bool en_sa_same(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
    if (a->ss_family != b->ss_family) return false;
    if (a->ss_family == AF_INET) {
        const struct sockaddr_in *x = (const void *)a, *y = (const void *)b;
        return x->sin_port == y->sin_port && x->sin_addr.s_addr == y->sin_addr.s_addr;
    }
    const struct sockaddr_in6 *x = (const void *)a, *y = (const void *)b;
    return x->sin6_port == y->sin6_port && !memcmp(&x->sin6_addr, &y->sin6_addr, 16);
}

/* Wait on cv (mu held) until signalled or the deadline; false when the
 * deadline has passed. The callers loop on their own condition. */
static inline bool en_cond_wait_until(uv_cond_t *cv, uv_mutex_t *mu, uint64_t deadline_ns)
{
    uint64_t now = bs_now_ns();
    if (now >= deadline_ns) return false;
    uv_cond_timedwait(cv, mu, deadline_ns - now);
    return true;
}

/* Take a connection off server's backlog and drop it (no room for it); the
 * handle lives until its close callback. Loop thread. */
void en_drop_accept(uv_stream_t *server);

/* ---- completion: how an op reports to whoever submitted it ---- */

/* What a slice measured of a peer's link: bytes received from it in large
 * frames and the time from their header to their last byte. */
#define EN_BW_PER_SLICE 8
typedef struct en_bw {
    int peer;
    uint64_t bytes;
    uint64_t ns;
} en_bw_t;

typedef struct en_result {
    int slice;       /* the op's slice index, as given to en_op_new */
    int status;      /* 0 or a negative coh_status */
    const char *why; /* "" on success; valid during the call only */
    const en_bw_t *bw;
    int nbw;
    uint64_t t_start_ns, t_end_ns; /* when the op started running on the rail, and ended */
    uint64_t bytes_out;            /* payload bytes the op sent */
    /* Bounded loss, by sc_stage (push, pull): bytes its receives were
     * short of, of how many received in datagrams. */
    uint64_t lost_bytes[3], stage_bytes[3];
} en_result_t;

typedef struct en_completion en_completion_t;
struct en_completion {
    /* Runs once per op, on the op's loop thread, after the op is freed.
     * Several ops (the slices of one request) may share one completion. */
    void (*fn)(en_completion_t *c, const en_result_t *r);
};

typedef struct en_rail en_rail_t;
typedef struct en_conn en_conn_t;
typedef struct en_op en_op_t;
typedef struct en_wreq en_wreq_t;

/* ---- rail events: a link moved to another interface, or came back ---- */

typedef enum en_rail_event_kind {
    EN_RAIL_FAILOVER = 1, /* the link to peer left this rail's interface (now on `via`) */
    EN_RAIL_RETURN = 2,   /* the link to peer is back on this rail's own interface */
    EN_RAIL_GONE = 3,     /* no interface reaches peer: its ops fail (EPEER) */
} en_rail_event_kind;

typedef struct en_rail_event {
    int kind;        /* en_rail_event_kind */
    int rail;        /* this rail's index */
    int peer;        /* the rank at the other end */
    int via;         /* the interface (rail index) the link now uses */
    double pause_s;  /* FAILOVER/RETURN: time from the last progress to the switch */
    const char *why; /* valid during the call only */
} en_rail_event_t;

/* Told of rail events, on the rail's loop thread (the same rule as
 * completions: the engine never calls up, it reports to what it was given). */
typedef struct en_rail_observer en_rail_observer_t;
struct en_rail_observer {
    void (*fn)(en_rail_observer_t *o, const en_rail_event_t *ev);
};

/* ---- where received payload goes ---- */

typedef enum en_sink_mode {
    EN_SINK_NONE = 0,
    EN_SINK_COPY,    /* dst[done..] = bytes */
    EN_SINK_REDUCE,  /* dst[i] = src[i] op bytes[i], element by element */
    EN_SINK_DISCARD, /* bytes of a failed op: read and drop */
    EN_SINK_CTRL,    /* a control frame's payload into conn->ctl */
} en_sink_mode;

typedef struct en_sink {
    int mode;
    uint8_t *dst;
    const uint8_t *src;
    uint64_t len, done;
    coh_dtype dtype;
    coh_redop op;
    uint32_t esize;
    en_op_t *owner; /* NULL for DISCARD and CTRL */
    uint32_t step;
    struct en_stash *stash; /* the payload is being kept for a receive not posted yet */
} en_sink_t;

/* A frame that arrived before its receive was posted (its op not submitted
 * here yet, or the step waiting for dependencies). Ranks may submit ops in
 * different orders (partial synchronisation interleaves group ops with world
 * collectives), so stopping the connection until the receive is posted could
 * deadlock on whatever follows the frame; it is read into memory instead,
 * up to COHORT_STASH_BYTES per rail, and delivered when the receive starts. */
#define EN_STASH_SPARE 64
/* With failover, data frames up to this size are copied and kept until the
 * peer's ACK, their send ending once written (en_tcp.c, tcp_send); the peer
 * acks them at once only when this many bytes of them wait (else at its
 * watch timer's next look). */
#define EN_TX_COPY_MAX        (64u << 10)
#define EN_TX_ACK_BYTES       (256u << 10)
#define EN_SCRATCH_KEEP       4
#define EN_SCRATCH_KEEP_BYTES (256u << 20)
typedef struct en_stash {
    struct en_stash *prev, *next;
    uint32_t comm;
    uint64_t seq;
    int peer;
    uint32_t tag;
    uint64_t sig;
    uint64_t len;
    bool complete;
    uint64_t t_ns;
    uint8_t *data;
    size_t cap; /* bytes allocated at data */
} en_stash_t;

/* Consume n bytes of payload into the sink (whole elements for REDUCE). */
void en_sink_consume(en_sink_t *s, const uint8_t *bytes, size_t n);
/* Where the transport can place payload itself (a copy sink: dst + done), or
 * drop it (DISCARD): count n bytes as consumed without passing them. */
bool en_sink_direct(const en_sink_t *s);
void en_sink_placed(en_sink_t *s, size_t n);

/* ---- connections ---- */

typedef enum en_conn_state {
    EN_CONN_CONNECTING = 0,
    EN_CONN_HANDSHAKE,
    EN_CONN_READY,
    EN_CONN_CLOSING,
    EN_CONN_CLOSED,
} en_conn_state;

typedef enum en_read_state {
    EN_RD_HDR = 0, /* waiting for a frame header */
    EN_RD_PAYLOAD, /* header matched; payload streams into sink */
    EN_RD_BLOCKED, /* header read, its receive is not posted yet: reading paused */
} en_read_state;

struct en_conn {
    en_rail_t *rail;
    const struct en_transport_ops *ops; /* its transport's (tcp, or shm to a peer on this host) */
    en_conn_t *all_prev, *all_next;     /* every conn of the rail, identified or not */
    int peer;                           /* communicator rank; -1 until the handshake names it */
    int state;
    int rstate;
    bool outgoing;
    bool peer_bye; /* the peer announced it is finalizing */
    en_hdr_t hdr;  /* the frame being read */
    en_sink_t sink;
    uint8_t ctl[EN_MAX_ABORT];
    uint64_t bytes_in, bytes_out;
    uint32_t writes_out;
    uint64_t t_frame_ns; /* when the current frame's header matched */
};

/* A queued frame. The payload stays owned by the op until done() runs. */
struct en_wreq {
    en_conn_t *conn;
    en_op_t *op; /* NULL for control frames */
    uint32_t step;
    uint8_t hdr[EN_HDR_SIZE];
    const uint8_t *payload;
    uint64_t len;
    void (*done)(en_wreq_t *w, int status);
    /* done may run inside tr_send (an op's data frame, sent from a step the
     * executor holds); otherwise only from a later callback. */
    bool done_inline;
    union {
        uv_write_t tcp;
        struct { /* verbs, written from declared memory: done at send completion mark */
            uint64_t mark;
            void *reg;
        } vb;
    } tr;
    uint8_t ctl[EN_MAX_ABORT]; /* control frames carry their payload here */
    /* Failover: the transport keeps every frame until the peer has consumed
     * it (an ACK), so a link that moves sends exactly the missing bytes. */
    en_wreq_t *tx_next;
    uint64_t tx_off;    /* where the frame starts in the link's byte stream */
    bool tx_writing;    /* a write of it is queued on some socket */
    bool tx_own;        /* the transport's copy of a control frame */
    en_wreq_t *tx_orig; /* tx_own: the control frame copied, told once written */
};

/*
 * A transport. Every member runs on the rail's loop thread and never blocks.
 * A rail runs a copy of the table in which en_ops_complete() has filled the
 * missing members with stubs (send: COH_EUNSUPPORTED), so callers never test
 * for NULL.
 */
typedef struct en_transport_ops {
    const char *name;
    /* Bind and listen on addr (port 0: pick one); write the bound address. */
    int (*tr_listen)(en_rail_t *rail, const struct sockaddr *addr, struct sockaddr_storage *bound);
    /* Start connecting to peer's addr from the rail's address; the result
     * arrives as en_rail_conn_ready() or en_rail_conn_lost(). */
    int (*tr_connect)(en_rail_t *rail, int peer, const struct sockaddr *addr);
    /* Queue a frame (header + payload). The transport calls w->done exactly
     * once, with 0 or a negative status, also when the conn closes. */
    int (*tr_send)(en_conn_t *c, en_wreq_t *w);
    /* Reading was paused on an unmatched header: match again and go on. */
    void (*tr_resume)(en_conn_t *c);
    /* Close one connection (pending sends end with COH_ECANCELED). */
    void (*tr_close)(en_conn_t *c, int status, const char *why);
    /* Close the listener and every connection: the rail is stopping. */
    void (*tr_shutdown)(en_rail_t *rail);
    /* Tests: break the connection's socket under it (a failing NIC). */
    void (*tr_cut)(en_conn_t *c);
} en_transport_ops_t;

extern const en_transport_ops_t en_tcp_ops;
/* RDMA reliable connections (en_verbs.c, built with libibverbs). */
extern const en_transport_ops_t en_verbs_ops;
/* Peers on the same host (en_shm.c): listen and connect ignore addresses. */
extern const en_transport_ops_t en_shm_ops;
void en_ops_complete(en_transport_ops_t *ops);
struct en_rail_cfg;
int en_verbs_init(en_rail_t *rail, const struct en_rail_cfg *cfg);
void en_verbs_fini(en_rail_t *rail);
bool en_verbs_poll(en_rail_t *rail); /* completions drained (the rail's poll hook) */
/* A rail named by its RDMA device (COHORT_NICS=mlx5_0:verbs): the network
 * interface of the device's port, through provider ("rdma-core" or NULL,
 * "soft"); 0, or < 0 when there is no such device or it has none. */
int en_verbs_netdev_of(const char *provider, const char *dev, int port, char *out, size_t cap);

/* ---- ops: one rail's slice of a request ---- */

typedef enum en_op_state { EN_OP_QUEUED = 0, EN_OP_RUNNING, EN_OP_FAILED, EN_OP_DONE } en_op_state;
typedef enum en_step_state { EN_STEP_WAIT = 0, EN_STEP_RUN, EN_STEP_DONE } en_step_state;

struct en_op {
    en_op_t *prev, *next;
    en_rail_t *rail;
    en_completion_t *comp; /* told once, when the op has ended */
    int slice;             /* index of this slice in whatever submitted it */
    uint32_t comm;
    uint64_t seq;
    uint64_t sig;
    char desc[96]; /* "allreduce(count=..., f32, sum)" for error messages */
    coh_dtype dtype;
    coh_redop redop;
    uint32_t esize;
    uint8_t *buf[SC_BUF_COUNT];
    size_t scratch_cap; /* buf[SC_BUF_SCRATCH]'s size: the rail's scratch_spare, given back */
    sc_plan_t plan;
    uint32_t *deps_left;
    uint8_t *sstate;
    uint32_t *rtab; /* open addressing on (peer, tag): step index + 1 */
    uint32_t rtab_mask;
    uint32_t left; /* steps not done */
    uint32_t writes_out;
    uint32_t *ready; /* worklist of steps whose dependencies are met */
    uint32_t nready;
    en_wreq_t *wreqs;
    uint32_t nwreqs;
    bool progressing;
    bool doomed; /* cancelled while queued: fails as it starts (status, why) */
    int state;
    int status;
    char why[BS_ERR_LEN];
    uint64_t t_progress_ns;
    uint64_t t_fail_ns;
    uint64_t bytes_in;
    uint64_t t_start_ns; /* when it started running on the rail (not when queued) */
    uint64_t bytes_out;  /* payload of its sends that completed */
    /* Link measurements: bytes of large frames from each peer and the time
     * from their header to their last byte (the peer's sending rate). */
    en_bw_t bw[EN_BW_PER_SLICE];
    int nbw;
    /* Bounded loss (en_op_set_loss; engines/en_udp.c): by sc_stage, the
     * fraction of a datagram receive's bytes that may be missing (0: all
     * must arrive); DSCP/ECN tagging; the op's datagram flows. */
    double loss[3];
    int layer, nlayers;
    bool ecn;
    struct en_dgop *dg;
    uint64_t lost_bytes[3], stage_bytes[3];
};

/* Build an op (any thread). Takes ownership of plan. sendbuf and recvbuf
 * are the caller's (sendbuf NULL: in place); scratch is allocated here.
 * comp->fn runs once the op has ended on the rail it was started on. */
int en_op_new(en_completion_t *comp, int slice, uint32_t comm, uint64_t seq, uint64_t sig,
              const char *desc, coh_dtype dtype, coh_redop redop, void *sendbuf, void *recvbuf,
              sc_plan_t *plan, en_op_t **out);
/* Free an op that was never started (an error path of a submission). */
void en_op_free(en_op_t *op);
/* Before it starts: the op may lose up to push / pull of each datagram
 * receive's bytes of those stages (its plan must be SC_ALGO_DIRECT's); on a
 * udp rail its staged steps then go as datagrams. layer of nlayers (< 1:
 * none) sets the DSCP priority, ecn marks datagrams above the median. */
void en_op_set_loss(en_op_t *op, double push, double pull, int layer, int nlayers, bool ecn);

/* ---- rails ---- */

#define EN_FIN_MAX 1024

/* Spraying (docs/udp.md): with several udp rails, one bounded-loss op's
 * datagrams go over all of them. The group's first rail (the lead) runs the
 * ops and reads and writes every member's socket; the others only open
 * theirs (bound to their listener's address, where peers expect it) and
 * hand it over. Shared by the rank's rails; members publish in order. */
#define EN_DG_PATHS 4
typedef struct en_udp_group {
    int n;                                   /* members (paths), 0: no spraying */
    int rail[EN_DG_PATHS];                   /* their rail indices, ascending: path k is rail[k] */
    struct en_udp *_Atomic udp[EN_DG_PATHS]; /* a member's engine, once its socket is open */
} en_udp_group_t;

/* A udp rail's datagram engine (engines/en_udp.c). */
typedef struct en_udp_cfg {
    en_udp_group_t *group; /* NULL: the rail sprays nothing */
    int gidx;              /* this rail's path in group (0: the lead), -1: none */
    size_t seg_bytes;      /* payload per datagram (rounded down to 8) */
    double rate_mbps;      /* line rate: where flows start */
    double delta;          /* sending > delta x receiving: halve */
    int period_us;         /* receivers report their rate this often */
    size_t rcvbuf_bytes;   /* SO_RCVBUF */
    uint32_t test_drop_ppm;
    int test_send_fail;       /* the n-th batch sent fails (EPERM); 0: none */
    bool test_ctl_dgram_only; /* control messages as datagrams alone (no TCP copy) */
} en_udp_cfg_t;

/* What a udp rail saw (loop thread). */
typedef struct en_udp_stats {
    uint64_t dg_sent, dg_recv; /* data datagrams */
    uint64_t dg_dup;           /* a segment that had arrived already */
    uint64_t dg_bad;           /* malformed, unknown step, outside the buffer */
    uint64_t dg_stranger;      /* not from a peer's address, or not this job's */
    uint64_t dg_late;          /* for an op or step that had ended */
    uint64_t dg_kept;          /* came before their receive was posted */
    uint64_t dg_dropped;       /* could not be kept (the stash was full) */
    uint64_t dg_test_dropped;  /* COHORT_TEST_UDP_DROP_PPM */
    uint64_t nacks;            /* retransmission requests sent */
    uint64_t resent_bytes;     /* payload sent again */
    uint64_t ctl_again;        /* control datagrams sent again: no answer came */
} en_udp_stats_t;

typedef struct en_rail_cfg {
    int index; /* this rail among the rank's rails */
    int rank, world, nrails;
    const char *token; /* must outlive the rail */
    int timeout_ms;    /* an op fails after this long without progress */
    int max_inflight;  /* ops running at once; later ones queue in order (0: 1024) */
    size_t sockbuf_bytes;
    size_t stash_bytes;
    int spare_idle_ms; /* free the kept buffers after this long without an op start (0: never) */
    const struct sockaddr *local;  /* the interface's address, port 0 */
    const en_transport_ops_t *ops; /* NULL: tcp */
    /* Failover (several rails): a link whose sent bytes go unacknowledged
     * for stall_ms while another rail progresses, or whose socket fails,
     * resumes on another interface, exactly where the peer stopped reading;
     * every probe_ms it tries its own interface again. */
    bool failover;
    int stall_ms, probe_ms;
    int test_resume_delay_ms;             /* tests: the lower rank's resume dials connect late */
    bool test_drop_probe;                 /* tests: the higher rank drops the first move back */
    bool rejoin;                          /* this rank restarts a failed one: its hellos say so */
    _Atomic uint64_t *progress_ns;        /* [nrails], shared by the rank's rails: last ack seen */
    const struct sockaddr *const *locals; /* [nrails]: every interface's address, port 0 */
    en_rail_observer_t *observer;         /* NULL: events are only logged */
    bool udp;                             /* a datagram socket beside the listener */
    en_udp_cfg_t udpcfg;
    /* Shared memory for peers on this host (en_rail_set_shm_peer): the
     * directory of the job's sockets (NULL or "": off), each ring's bytes. */
    const char *shm_dir;
    const char *shm_name; /* this context's: rank, pid and a count (unique on the host) */
    size_t shm_ring_bytes;
    size_t shm_cma_bytes; /* single copy (process_vm_readv) from this frame size; 0: never */
    /* A verbs rail (ops = &en_verbs_ops): every rail's interface ([nrails];
     * this rail's RDMA device is found behind its own), or the device
     * itself; port, GID index, and each link's ring per direction. With
     * failover and verbs_move, a link whose device fails may move to the
     * RDMA device behind another rail's interface, as a TCP link moves to
     * another interface. */
    bool verbs, verbs_move;
    const char *verbs_netdevs[EN_MAX_RAILS];
    const char *verbs_devs[EN_MAX_RAILS]; /* the rails COHORT_NICS named by device; else NULL */
    const char *verbs_dev;
    int verbs_resume_ms;           /* a failed link resumes within this, or it ends */
    int verbs_test_port_down_ms;   /* tests: a cut takes the own port down this long */
    int verbs_test_ready_delay_ms; /* tests: a resume's READY is taken this late */
    int verbs_test_lose_ready;     /* tests: 1 + the rank whose first READY (per rail) is lost */
    int verbs_test_poke_late_ms;   /* tests: poke at once, each poke's HELLO this late */
    int verbs_test_rts_fail;       /* tests: 1 + the rank whose first resume QP is refused RTS */
    int verbs_test_rts_fail_times; /* tests: how many resume QPs are refused; 0: all */
    bool verbs_test_create_fail;   /* tests: ...at their creation, not RTS */
    int verbs_test_rts_fail_peer;  /* tests: ...on the link to this rank only (-1: any) */
    const char *verbs_provider;    /* en_ibv.h: "rdma-core" (NULL too) or "soft" */
    int verbs_port, verbs_gid;
    size_t verbs_ring_bytes;
    /* Memory the application declared for zero copy (coh_mem_register):
     * frames of zcopy_bytes or more from it are written without a copy;
     * what stays registered is bounded by reg_cache_bytes. */
    struct en_regtab *regions;
    size_t verbs_zcopy_bytes, verbs_reg_cache_bytes;
} en_rail_cfg_t;

/* A communicator whose ops fail on a rail, and how (en_rail_revoke_comm). */
struct en_revoked {
    uint32_t comm;
    int status;
    char why[160];
};

struct en_rail {
    uv_loop_t *loop; /* the loop this rail runs on (en_rail_open) */
    int index;
    int rank, world, nrails;
    const char *token;
    int timeout_ms;
    size_t sockbuf_bytes;
    const en_transport_ops_t *ops; /* &ops_full */
    en_transport_ops_t ops_full;
    struct sockaddr_storage local; /* the configured interface, port 0 */
    struct sockaddr_storage bound; /* where this rail listens */
    void *listener;                /* transport private */
    en_conn_t **peers;             /* [world]; NULL until connected */
    en_conn_t *all;                /* every open conn, for shutdown */
    bool closing;                  /* en_rail_close ran: no new ops */
    int bye_pending;               /* BYE frames not yet written (under mu) */
    uint8_t *lost;                 /* [world]: the peer's connection is gone (under mu) */
    int nready;
    en_op_t *ops_head, *ops_tail; /* running */
    /* Ops beyond max_running wait here in submission order, not started
     * (no frames sent, no timeout running): any number may be submitted,
     * and per-frame lookups stay bounded by the window. */
    en_op_t *wait_head, *wait_tail;
    uint32_t nrunning, max_running;
    uv_idle_t starter; /* starts waiting ops from the top of the loop */
    bool starter_open;
    /* Recently ended ops (comm, seq) and how: frames of a failed op are
     * dropped, an ABORT for an op not yet submitted fails it on arrival. */
    struct en_fin {
        uint32_t comm;
        uint64_t seq;
        int status;
        bool used;
        char why[160];
    } fin[EN_FIN_MAX];
    uint32_t fin_next;
    /* An index of fin by (comm, seq): slot + 1, 0 empty; linear probing.
     * Every op start and many frames look an op up: a scan of the ring cost
     * a fifth of a 4 KiB allreduce over shared memory. */
    uint16_t fin_tab[EN_FIN_MAX * 4];
    /* Communicators with a member the job excluded (en_rail_revoke_comm):
     * their ops fail, those running and those still to come. */
    struct en_revoked *revoked;
    uint32_t nrevoked;
    uv_timer_t timer;
    bool timer_open, timer_on;
    en_stash_t *stash_head, *stash_tail;
    uint64_t stash_bytes, stash_limit;
    /* Payload buffers of delivered stash entries, kept for the next ones:
     * a fresh buffer is fresh pages, and faulting them in (during the
     * kernel's copy) cost more than the copy (en_exec.c, stash_buf). */
    uint8_t *spare[EN_STASH_SPARE];
    size_t spare_cap[EN_STASH_SPARE];
    int nspare;
    uint64_t spare_bytes;
    /* The last reduce-scatter scratches (en_exec.c, scratch_take), kept
     * for the next ops (a request's slices run at once): up to
     * EN_SCRATCH_KEEP of them, each up to EN_SCRATCH_KEEP_BYTES. */
    uint8_t *scratch_spare[EN_SCRATCH_KEEP];
    size_t scratch_spare_cap[EN_SCRATCH_KEEP];
    /* Both kinds are freed once no op started for spare_idle_ns (0: never;
     * en_exec.c, trim_idle): ops_started counts op starts, idle_mark is its
     * value at the timer's last look, idle_since_ns when it last changed. */
    uint64_t spare_idle_ns, ops_started, idle_mark, idle_since_ns;
    _Atomic uint64_t stat_trimmed; /* bytes of kept buffers freed that way */
    /* Other threads wait here: for every peer at bootstrap, for the BYEs at
     * close. mu guards peers[] (writes), lost[], nready, bye_pending and
     * conn_status. */
    bool sync_init;
    uv_mutex_t mu;
    uv_cond_t cv;
    int conn_status;
    char conn_why[BS_ERR_LEN];
    _Atomic uint64_t stat_bytes_out, stat_bytes_in;
    /* A TCP socket was made on this rail (any thread reads it): a waiter's
     * pass must ask epoll (rx_reactor_hooks_t.streams). */
    _Atomic int stream_socks;
    /* libuv writes started on TCP sockets and not called back yet: a pass
     * may flush them with write(2) (rx_reactor_hooks_t.writes). */
    _Atomic int uv_writes;
    _Atomic uint64_t stat_rejected;   /* connections dropped at the handshake */
    _Atomic uint64_t stat_bad_frames; /* connections closed for a malformed frame */
    /* Failover (en_rail_cfg_t). routes[peer * nrails + j]: peer's listener
     * of this rail through interface j (under mu). */
    bool failover;
    int stall_ms, probe_ms;
    int test_resume_delay_ms;
    bool test_drop_probe;
    bool rejoin;
    _Atomic uint64_t *progress_ns;
    struct sockaddr_storage locals[EN_MAX_RAILS];
    struct sockaddr_storage *routes;
    en_rail_observer_t *observer;
    uint64_t suspect_until_ns;       /* a link on this interface failed lately (loop thread) */
    _Atomic uint64_t stat_failovers; /* links moved off this rail's interface */
    _Atomic uint64_t stat_returns;   /* links back on it */
    _Atomic uint64_t stat_resent;    /* bytes sent again after a move */
    _Atomic uint64_t stat_moved;     /* verbs links resumed on another rail's device */
    _Atomic uint64_t stat_shm_out, stat_shm_in; /* of stat_bytes_*: through shared memory */
    _Atomic uint64_t stat_cma_in;               /* of stat_shm_in: read from the sender's memory */
    _Atomic uint64_t stat_zcopy_out; /* of stat_bytes_out: written from declared memory (verbs) */
    _Atomic uint64_t stat_regs;      /* registrations of declared memory made (verbs) */
    struct en_udp *udp;              /* a udp rail's datagram engine; NULL on tcp rails */
    struct en_shm *shm;              /* the shared-memory transport; NULL: off */
    struct en_verbs *verbs;          /* a verbs rail's device and links; NULL: not one */
    uint8_t *shm_peer;               /* [world]: dial this peer through shared memory */
    char *shm_names;                 /* [world * EN_SHM_NAME]: their contexts' names */
    bool want_udp;
    en_udp_cfg_t udpcfg;
};

/*
 * Lifecycle, as everywhere in cohort: init -> open -> ... -> close -> stop
 * -> fini. init and fini run on any thread (fini after the loop has ended
 * and safe on a zeroed or half-initialised rail); open, close and shutdown
 * on the loop thread; the waits on any thread.
 */
/* Any thread. Fill the rail from cfg; nothing touches a loop yet. */
int en_rail_init(en_rail_t *rail, const en_rail_cfg_t *cfg);
/* Loop thread. Adopt loop: arm the timer, listen on cfg->local. */
int en_rail_open(en_rail_t *rail, uv_loop_t *loop);
/* Loop thread. Connect to peer at addr (only to peers of lower rank: the
 * higher rank dials). A failure lands in en_rail_wait_connected. */
void en_rail_dial(en_rail_t *rail, int peer, const struct sockaddr *addr);
/* Any thread. Wait until every peer is connected or the deadline passes. */
int en_rail_wait_connected(en_rail_t *rail, uint64_t deadline_ns);
/* Any thread but the loop's: wait until peer is connected (a rank that
 * rejoined, coh_comm_grow); COH_ETIMEDOUT at the deadline. */
int en_rail_wait_peer(en_rail_t *rail, int peer, uint64_t deadline_ns);
/* Loop thread. Start an op (from en_op_new); the rail owns it until its
 * completion runs. A rail that is closing fails it with COH_ECANCELED.
 * With max_running ops running, it waits its turn (in order). */
void en_rail_start_op(en_rail_t *rail, en_op_t *op);
/* Loop thread. Fail (comm, seq) here if it still runs, or when it comes:
 * another slice of the same request failed. No ABORT is sent for it. */
void en_rail_cancel_op(en_rail_t *rail, uint32_t comm, uint64_t seq, int status, const char *why);
/* Loop thread. (comm, seq) will not run here: drop what arrives for it and
 * send ABORT(status, why) to these peers, so they stop waiting for us. */
void en_rail_abort_op(en_rail_t *rail, uint32_t comm, uint64_t seq, int status, const char *why,
                      const int *peers, int npeers);
/* Loop thread. A member of communicator comm was excluded from the job:
 * every op of comm fails with status and why, running, waiting or started
 * later (peers told). Dropping the member's links ends only the ops that
 * still exchange with it; one that waits on live peers who stopped at an
 * earlier failed op would wait for COHORT_TIMEOUT_MS. */
void en_rail_revoke_comm(en_rail_t *rail, uint32_t comm, int status, const char *why);
/* Loop thread. Fail every running op (COH_ECANCELED, peers told). */
void en_rail_cancel_all(en_rail_t *rail, const char *why);
/* Loop thread. True while ops are in flight (frames will come soon). */
bool en_rail_busy(en_rail_t *rail);
/* Loop thread (whoever runs the loop). Look at what no fd announces: the
 * shared-memory rings and the sends they completed. True when it did
 * something. */
bool en_rail_poll(en_rail_t *rail);
/* Loop thread, about to block in epoll: ask the peers for doorbells. False
 * when work is already waiting (then do not block). */
bool en_rail_arm(en_rail_t *rail);
/* Loop thread. close: no new ops; what runs is cancelled; every peer is
 * told BYE, so the close that follows is not a failure for it. */
void en_rail_close(en_rail_t *rail);
/* Any thread. stop: wait (until the deadline) for the BYEs to leave. */
void en_rail_wait_quiet(en_rail_t *rail, uint64_t deadline_ns);
/* Loop thread. Close every handle; the loop can end after this. */
void en_rail_shutdown(en_rail_t *rail);
/* Any thread, once the loop has ended (or never ran the rail). */
void en_rail_fini(en_rail_t *rail);
/* Loop thread. The peer is unresponsive (said from above: the control
 * plane's liveness check): close its connection; ops that need it fail with
 * status and why, and so does every later op that needs it. */
void en_rail_drop_peer(en_rail_t *rail, int peer, int status, const char *why);
/* Any thread. Where peer's listener of this rail is reached through each
 * interface: addrs[j] = peer's address on interface j, this rail's port
 * (failover dials these; addrs[rail->index] is the normal route). */
int en_rail_set_routes(en_rail_t *rail, int peer, const struct sockaddr_storage *addrs, int n);
/* Loop thread. Tests: break the link to peer as a failing NIC would. */
void en_rail_debug_cut(en_rail_t *rail, int peer);
/* Any thread: has the peer's connection gone on this rail? */
bool en_rail_peer_lost(en_rail_t *rail, int peer);
/* Any thread, before en_rail_dial(peer): peer shares this host and listens
 * on shared memory too (false without shm). */
bool en_rail_set_shm_peer(en_rail_t *rail, int peer, const char *name);

/* ---- inside engines/ ---- */

/* Upcalls from transports (loop thread). A conn is on the rail's list of
 * every conn (rail->all) from its creation until it is closed. */
void en_rail_conn_link(en_rail_t *rail, en_conn_t *c);
void en_rail_conn_unlink(en_conn_t *c);
void en_rail_conn_ready(en_rail_t *rail, en_conn_t *c);
void en_rail_conn_lost(en_rail_t *rail, en_conn_t *c, int status, const char *why);
/* Handshake check for an accepted connection: 0, or a status with why. */
int en_rail_check_hello(en_rail_t *rail, const en_hello_t *h, bool incoming, char *why,
                        size_t whylen);
void en_rail_fill_hello(en_rail_t *rail, en_hello_t *h);
/* Report a failover, return or loss to the observer (and the log). */
void en_rail_event(en_rail_t *rail, int kind, int peer, int via, double pause_s, const char *why);
/* The stall rule's shared clock (progress_ns): this rail's links made
 * progress at now (an ACK, an RDMA completion); whether another rail of
 * the rank did within the last stall_ms (only then is a silent link at
 * fault, not its peer). */
void en_rail_progress(en_rail_t *rail, uint64_t now);
bool en_rail_others_progress(const en_rail_t *rail, uint64_t now);
/* An IPv4 or IPv6 address's port (network order), and setting it. */
static inline uint16_t en_sa_port(const struct sockaddr_storage *a)
{
    return a->ss_family == AF_INET6 ? ((const struct sockaddr_in6 *)a)->sin6_port
                                    : ((const struct sockaddr_in *)a)->sin_port;
}
static inline void en_sa_set_port(struct sockaddr_storage *a, uint16_t port)
{
    if (a->ss_family == AF_INET6)
        ((struct sockaddr_in6 *)a)->sin6_port = port;
    else
        ((struct sockaddr_in *)a)->sin_port = port;
}
/* Copy of peer's route through interface via; false when unknown. */
bool en_rail_route(en_rail_t *rail, int peer, int via, struct sockaddr_storage *out);
/* A listener's address: with failover a peer may reach this rail through
 * any interface (a link resumed through another rail's), so every address
 * (IPv6: dual stack, so that an IPv4 interface's route reaches it too);
 * else the rail's own. en_rail_listen_named: what the peers are told, the
 * rail's own address at the port bound. */
void en_rail_listen_at(const en_rail_t *rail, const struct sockaddr *addr,
                       struct sockaddr_storage *at);
void en_rail_listen_named(const struct sockaddr *addr, struct sockaddr_storage *bound);

/* The shared-memory transport (en_shm.c). init and fini: any thread. */
int en_shm_init(en_rail_t *rail, const char *dir, const char *name, size_t ring_bytes,
                size_t cma_bytes);
void en_shm_fini(en_rail_t *rail);
bool en_shm_poll(en_rail_t *rail);
bool en_shm_arm(en_rail_t *rail);
/* Where a context's listener of rail is: DIR/cohort-UID-HASH(token)/NAME.RAIL
 * (NAME: the context's, unique on the host; learned through the store). */
int en_shm_path(const char *dir, const char *token, const char *name, int rail, char *out,
                size_t cap);
/* Make path's directory if missing and check it is this user's alone (made
 * again if another context removes it meanwhile). Any thread. */
int en_shm_job_dir(const char *path);

/* The datagram engine (en_udp.c), loop thread unless said. */
int en_udp_open(en_rail_t *rail, const en_udp_cfg_t *cfg); /* after the listener is bound */
void en_udp_shutdown(en_rail_t *rail);
void en_udp_fini(en_rail_t *rail); /* any thread, once the loop has ended */
void en_udp_stats(const en_rail_t *rail, en_udp_stats_t *out);
bool en_udp_usable(const en_rail_t *rail, const en_op_t *op);
int en_udp_op_start(en_op_t *op); /* the op starts lossy: its flows */
/* A staged send / receive step starts: 0, or 1 when it is not a datagram
 * step (it goes as a frame), or a negative status. */
int en_udp_send(en_op_t *op, uint32_t i);
int en_udp_post(en_op_t *op, uint32_t i);
void en_udp_div(en_op_t *op, uint32_t i); /* SC_DIV of a push: by contributors per segment */
void en_udp_op_end(en_op_t *op);          /* the op failed or finished: stop its flows */
void en_udp_op_free(en_op_t *op);
/* A DGCTL frame from c's peer: 0 or COH_EPROTO (malformed: close the link). */
int en_udp_ctl(en_rail_t *rail, en_conn_t *c, const en_hdr_t *h, const uint8_t *p, size_t len);

/* The executor's pieces the datagram engine uses (loop thread). */
en_op_t *en_exec_find_op(en_rail_t *rail, uint32_t comm, uint64_t seq);
/* Recorded as ended (status: how, when not NULL). */
bool en_exec_ended(en_rail_t *rail, uint32_t comm, uint64_t seq, int *status);
int64_t en_exec_find_recv(const en_op_t *op, int peer, uint32_t tag);
void en_exec_step_done(en_op_t *op, uint32_t i);

/* Executor upcalls (loop thread). */
typedef enum en_match { EN_MATCH_OK = 0, EN_MATCH_BLOCK = 1 } en_match;
/* A frame header arrived on c: point c->sink at its destination. Returns
 * EN_MATCH_OK, EN_MATCH_BLOCK (nothing posted yet: pause reading), or a
 * negative status (protocol error: close the connection). */
int en_exec_match(en_rail_t *rail, en_conn_t *c);
/* en_exec_match for a transport: also sets c->rstate (EN_RD_PAYLOAD, or
 * EN_RD_BLOCKED: pause reading) and counts a refused frame (a negative
 * status: the transport closes the connection). */
int en_conn_match(en_conn_t *c);
/* The sink of c is full: finish the receive or handle the control frame. */
void en_exec_recv_done(en_rail_t *rail, en_conn_t *c);
/* Run the op's ready steps and end it if it is finished (outermost caller). */
void en_exec_kick(en_op_t *op);
int en_exec_send_ctl(en_conn_t *c, int type, uint32_t comm, uint64_t seq, int status,
                     const char *text);
void en_exec_fail_op(en_op_t *op, int status, bool tell_peers, const char *why);
/* Fail the ops that still need peer (its connection is gone). */
void en_exec_fail_peer(en_rail_t *rail, int peer, int status, const char *why);
void en_exec_fail_all(en_rail_t *rail, int status, bool tell_peers, const char *why);
void en_exec_cancel(en_rail_t *rail, uint32_t comm, uint64_t seq, int status, const char *why);
void en_exec_revoke(en_rail_t *rail, uint32_t comm, int status, const char *why);
void en_exec_check_timeouts(en_rail_t *rail);
void en_exec_drop_stash(en_rail_t *rail); /* free every kept frame (the rail stops) */
/* Start waiting ops while there is room (closing: they fail at once). */
void en_exec_start_waiting(en_rail_t *rail);
void en_rail_arm_timer(en_rail_t *rail);
/* A BYE frame left, or its connection closed before it could. */
void en_rail_bye_sent(en_rail_t *rail);

#endif
