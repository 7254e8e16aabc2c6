/* rx_ctx.h - the context and communicator objects (internal). */
#ifndef COH_RX_CTX_H
#define COH_RX_CTX_H

#include "reactor/reactor.h"
#include "reactor/rx_store.h"
#include "reactor/rx_sync.h"

typedef enum rx_ctx_state { RX_CTX_RUNNING = 1, RX_CTX_FINALIZING = 2 } rx_ctx_state;

struct coh_comm {
    struct coh_ctx *ctx;
    uint32_t id;
    int rank, size;
    const int *ranks; /* world rank of each member; NULL for the world */
    _Atomic uint64_t next_seq;
    coh_failure_fn on_failure; /* under ctx->fail_mu */
    void *on_failure_arg;
    struct coh_comm *next; /* the context's communicators (under ctx->fail_mu) */
};

struct coh_ctx {
    coh_config_t cfg; /* strings below are this context's copies */
    char *store_s, *token_s, *nics_s, *sched_s;
    int rank, world, nrails;
    int spin_us;         /* resolved from cfg.spin_us (auto) */
    bool oversubscribed; /* more local ranks than cores */
    int ar_algo;         /* COHORT_ALGO: sc_algo of large allreduces (SC_ALGO_AUTO: by cost) */
    int small_algo; /* COHORT_SMALL_ALGO: sc_algo of small allreduces (SC_ALGO_AUTO: by cost) */
    int msg_cpu_us; /* COHORT_HIER_LOCAL_MSG_US */
    int cores;      /* online CPUs of this host (rx_config_cores; 0: unknown) */
    rx_rail_t *rails;
    struct sockaddr_storage rail_addr[RX_MAX_RAILS];
    bool rail_udp[RX_MAX_RAILS];     /* COHORT_NICS NIC:udp: a datagram socket beside the rail */
    bool rail_verbs[RX_MAX_RAILS];   /* COHORT_NICS NIC:verbs: RDMA links (engines/en_verbs.c) */
    char rail_nic[RX_MAX_RAILS][64]; /* the NIC as COHORT_NICS named it (a device: its interface) */
    char rail_verbs_dev[RX_MAX_RAILS][64]; /* NIC:verbs named by its RDMA device (mlx5_0), or "" */
    char rail_netdev[RX_MAX_RAILS][64];    /* the interface behind the rail (verbs builds) */
    uint32_t udp_seg[RX_MAX_RAILS]; /* its datagrams' payload (COHORT_UDP_SEG_BYTES or MTU) */
    int udp_rate[RX_MAX_RAILS];     /* NIC:udp@MBPS: its line rate (0: COHORT_UDP_RATE_MBPS) */
    bool any_udp;
    en_udp_group_t udp_group; /* udp rails a bounded-loss op sprays over (COHORT_UDP_SPRAY) */
    const struct sockaddr *rail_locals[RX_MAX_RAILS]; /* the same, for the rails' failover */
    _Atomic uint64_t rail_progress[RX_MAX_RAILS];     /* last ACK seen per rail (failover) */
    rx_reactor_t ctrl;                                /* control reactor: the store (rank 0) */
    bool ctrl_started;
    rx_store_server_t *store;
    bool store_inherited;               /* it listens on the launcher's socket (or the kept copy) */
    uint32_t incarnation;               /* which init of its job this context is (rx_ctx.c) */
    struct rx_member *member;           /* every rank of a world > 1 */
    struct rx_coord *coord;             /* every rank's; active on the coordinator only */
    rx_sched_cfg_t sched_cfg;           /* read at init, for the coordinator */
    struct sockaddr_storage coord_addr; /* where the coordinator listens */
    /* Every rank's control listener (its coordinator, dormant until it is
     * elected or configured): the survivors elect the lowest live rank when
     * the coordinator fails (rx_member.c). */
    struct sockaddr_storage *ctrl_addrs;
    coh_comm_t world_comm;
    _Atomic int state;
    _Atomic int refs; /* finalize's, plus one per request not yet freed */
    int event_fd;
    _Atomic int event_fd_used; /* written only once the application asked for it */
    _Atomic uint64_t n_completed, n_failed;
    struct rx_lb *lb;            /* the world comm's rail balancer (rx_lb.h); NULL: even splits */
    char *lb_table_s;            /* cfg.lb_table's copy */
    en_rail_observer_t rail_obs; /* the rails' failover events (rx_lb.c) */
    _Atomic uint64_t rail_events[RX_MAX_RAILS][3]; /* per rail: failovers, returns, gone */
    /* Failed ranks (rx_fail.c): world ranks the coordinator excluded. */
    uv_mutex_t fail_mu;
    uint8_t *failed; /* world entries */
    int nfailed;
    /* Ranks that failed and rejoined (coh_comm_grow): the id of the
     * communicator that took each back. Communicators older than that hold
     * its failed incarnation. World entries, 0: none. */
    uint32_t *back;
    int nback;
    /* The coordinator excluded this rank (rx_ctx_self_excluded): every op
     * of its communicators ends, those to come too. Under fail_mu. */
    bool self_excluded;
    char excluded_why[BS_ERR_LEN];
    struct sockaddr_storage *rejoin_addrs; /* COHORT_REJOIN: [peer * nrails + rail] */
    coh_comm_t *comms;                     /* world_comm, then communicators made from it */
    uint32_t probe_no;                     /* coh_probe calls (every rank the same) */
    _Atomic uint64_t n_probes;
    /* coh_stats_t's sync and loss counters (rx_member.c, rx_request.c) */
    _Atomic uint64_t n_syncs, sync_wait_ns, sync_comm_ns, sync_members, sync_full, sync_relayed,
        sync_retries, loss_expected, loss_missed;
    struct rx_trace *trace; /* COHORT_TIMELINE (rx_trace.h), else NULL */
    uv_mutex_t links_mu;    /* the latest probe's links (coh_ctx_links) */
    coh_link_probe_t *links;
    int nlinks;
    _Atomic uint64_t trace_ids; /* the timeline's async event ids */
    /* Who shares this host (COHORT_HOST_ID, else the boot id): same_host
     * and shm_peer are world entries, learned at bootstrap; shm_peer: the
     * link goes through shared memory on every rail (both sides have it). */
    char host_id[256];
    const char *shm_dir;            /* COHORT_SHM_DIR; NULL: no shared memory */
    char shm_name[EN_SHM_NAME];     /* this context's listeners: DIR/.../NAME.RAIL */
    char (*shm_names)[EN_SHM_NAME]; /* [world]: the peers' */
    uint8_t *same_host, *shm_peer;
    int local_n; /* ranks on this host, this one included */
    /* Every world rank's host: host_hash the id's, host_idx the lowest rank
     * on the same host (the grouping of hierarchical plans, sc_coll_t.host);
     * NULL before bootstrap and for a rank that rejoined. */
    uint64_t *host_hash;
    int *host_idx;
    struct rx_gpu *gpu;        /* device buffers (rx_gpu.c); NULL: none (COHORT_GPU) */
    struct en_regtab *regions; /* memory declared for zero copy (coh_mem_register) */
    char describe[1024];
};

/* One collective on a set of ranks, as every member builds it: the one
 * submission path of world collectives and sync groups (rx_coll.c). */
typedef struct rx_launch {
    sc_coll_t coll; /* the plan's shape; lo/hi are set per slice */
    uint32_t comm;
    uint64_t seq;
    uint64_t sig;   /* everything that shapes the plan except the split (added here) */
    uint64_t key;   /* the same on every member: picks the rail of a one-rail op */
    uint64_t bytes; /* what the op moves, for the split */
    const char *desc;
    coh_dtype dtype;
    coh_redop redop;
    const void *sendbuf;
    void *recvbuf;
    /* The split, when the caller made it (the balancer, rx_lb.c); else
     * nslices 0 and rx_launch splits with sc_rail_split. */
    int nslices;
    const sc_slice_t *slices;
    /* Bounded loss (coh_allreduce_opts_t): slices on udp rails run the
     * push/pull plan with these bounds, by sc_stage; 0 = reliable. */
    double loss[3];
    int layer, nlayers;
} rx_launch_t;
/* A collective's arguments as its entry point checked them (rx_coll.c). */
typedef struct rx_coll_args {
    sc_coll_kind kind;
    const void *sendbuf;
    void *recvbuf;
    size_t count;
    coh_dtype dtype;
    coh_redop op;
    int root;
    bool rs_in_place;
    double loss[3]; /* by sc_stage */
    int layer, nlayers;
    void (*on_done)(void *arg); /* the request's completion hook (rx_gpu.c), or NULL */
    void *on_done_arg;
} rx_coll_args_t;
#define RX_SEQ_NEXT UINT64_MAX
/* Submit a checked collective as op seq of comm (RX_SEQ_NEXT: the next
 * one; a reserved one is launched without the rail balancer). */
int rx_coll_submit(coh_comm_t *comm, const rx_coll_args_t *a, uint64_t seq, coh_request_t **out,
                   const char *fn);
/* End op seq of comm on every rail and tell comm's members but `gone` (a
 * world rank, or -1) to stop waiting for it. */
void rx_comm_abort_seq(struct coh_ctx *ctx, const coh_comm_t *comm, uint64_t seq, int status,
                       const char *why, int gone);
/* Device buffers (rx_gpu.c). init picks the device runtime (COHORT_GPU)
 * and starts the GPU reactor; stop (after the rails) fails what still runs. */
int rx_gpu_init(struct coh_ctx *ctx);
void rx_gpu_finalizing(struct coh_ctx *ctx); /* fail the ops, tell the peers (rails still up) */
void rx_gpu_stop(struct coh_ctx *ctx);
void rx_gpu_fini(struct coh_ctx *ctx);
const char *rx_gpu_name(const struct coh_ctx *ctx);     /* "cuda", "host", or NULL */
void rx_gpu_stats(struct coh_ctx *ctx, coh_stats_t *s); /* the gpu_* counters */
/* 1: a collective on a and b is a device op (of device *dev), 0: host
 * memory, < 0: an error (mem is a coh_mem). */
int rx_gpu_where(struct coh_ctx *ctx, int mem, const void *a, const void *b, int *dev,
                 const char *fn);
/* COH_EUNSUPPORTED when a or b is device memory (paths that take host
 * buffers only: syncs, relay, bounded loss). */
int rx_gpu_host_only(struct coh_ctx *ctx, const void *a, const void *b, const char *fn);
/* coh_allreduce with where its buffers are (NULL: ask). */
int rx_allreduce_opts(coh_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                      coh_dtype dtype, coh_redop op, const coh_coll_opts_t *o, coh_request_t **req,
                      const char *fn);
/* Submit a checked collective on device buffers, ordered after stream. */
int rx_gpu_submit(coh_comm_t *comm, const rx_coll_args_t *a, void *stream, int dev,
                  coh_request_t **out, const char *fn);
int rx_allreduce_lossy(coh_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                       coh_dtype dtype, coh_redop op, const coh_allreduce_opts_t *o,
                       coh_request_t **req);
/* Split L over the rails, build each slice's plan and op, hand them to the
 * rails. On failure nothing was submitted and the request is untouched
 * (its comm, seq and slices are set only on success). */
int rx_launch(struct coh_ctx *ctx, coh_request_t *req, const rx_launch_t *L);

/* Any thread: world rank r failed (idempotent); tells every communicator's
 * failure handler that has r. */
void rx_ctx_rank_failed(struct coh_ctx *ctx, int r, const char *why);
bool rx_ctx_is_failed(struct coh_ctx *ctx, int r);
/* Any thread: the coordinator excluded this rank (idempotent). The others
 * end every op of every communicator that holds it (rx_ctx_rank_failed);
 * this rank ends its own on all of them alike, in flight or later, and its
 * balancer's queued and later world ops, with COH_EPEER and why. */
void rx_ctx_self_excluded(struct coh_ctx *ctx, const char *why);
/* Not failed, and its control address is known: a rank that rejoined
 * listens elsewhere now, which only it (and ranks that rejoined) read. */
bool rx_ctx_electable(struct coh_ctx *ctx, int r);
/* Any thread: the world rank of c's first failed member, or -1; *stale:
 * it failed and rejoined since c was made (c holds its old incarnation).
 * This rank, not stale, once the coordinator excluded it. */
int rx_comm_failed_member(struct coh_ctx *ctx, const coh_comm_t *c, bool *stale);
/* The reason an op fails with when rank gone of its communicator is known
 * failed: one text wherever it is found (submission, launch, the news). */
void rx_excluded_why(const struct coh_ctx *ctx, int gone, char *out, size_t cap);
/* The probe of every link (rx_probe.c); caller's thread. rounds > 0: only the
 * first that many rounds of pairs (each rank meets that many peers). */
int rx_probe(struct coh_ctx *ctx, int rounds, coh_link_probe_t *links, int cap,
             coh_probe_info_t *info);
/* Send this rank's probe results to the coordinator (any thread). */
void rx_member_report_probe(struct coh_ctx *ctx, const rx_ctl_link_t *links, int n);
/* Free every communicator but the world (ctx_fini). */
void rx_ctx_free_comms(struct coh_ctx *ctx);

/* Notify waiters and the event fd that a request of ctx completed. */
void rx_ctx_notify(struct coh_ctx *ctx, int failed);
/* Is ctx a live context? (registry check for use-after-finalize) */
bool rx_ctx_alive(struct coh_ctx *ctx);
/* Rail r's path in the spraying group (0: the lead), or -1. */
int rx_udp_path(const struct coh_ctx *ctx, int r);
void rx_member_close(struct coh_ctx *ctx);
/* The context's memory lives until finalize and every request are done with
 * it: a waiter may touch its rails after its request completed. */
void rx_ctx_ref(struct coh_ctx *ctx);
void rx_ctx_unref(struct coh_ctx *ctx);

#include "reactor/rx_lb.h"

#endif
