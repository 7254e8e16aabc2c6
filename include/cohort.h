/*
 * cohort.h - the public C API of cohort, an adaptive collective-communication
 * runtime for data-parallel training.
 *
 * Conventions (the same everywhere in this header):
 *   - Every function returns 0 (COH_OK) or a negative coh_status code; outputs
 *     go through pointer arguments. coh_strerror() names a code, and
 *     coh_last_error() gives the detail of the last failure on this thread.
 *   - Long-lived handles: coh_ctx_t (one per process, owns the reactor threads
 *     and connections) and coh_comm_t (a communicator; the world communicator
 *     is owned by its context). Short-lived requests: coh_request_t, one per
 *     collective, owned by the caller until coh_request_free().
 *   - Collectives are non-blocking. Buffers are read and written in place by
 *     the reactor threads (no copy on submission): the caller must not touch
 *     them until the request completes. Every rank of a communicator must
 *     submit the same collectives in the same order with matching arguments;
 *     a mismatch is detected and fails the request on every rank.
 *   - Requests complete with a status of their own (coh_request_status) and an
 *     error string (coh_request_error). An asynchronous failure (peer lost,
 *     timeout, argument mismatch) lands on the request, never in a crash.
 *     When a collective fails, the contents of its output buffer are
 *     unspecified (it may hold partial results); nothing outside the
 *     buffers is ever written, and a failure is reported on every rank.
 *   - Thread safety: any thread may submit, wait or test. Submissions from
 *     several threads to one communicator are ordered by their submission;
 *     keep them consistent across ranks.
 */
#ifndef COHORT_H
#define COHORT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(COH_BUILDING_LIB)
#define COH_API __attribute__((visibility("default")))
#else
#define COH_API
#endif

#define COH_VERSION_MAJOR 0
#define COH_VERSION_MINOR 1
#define COH_VERSION_PATCH 0

/* X-macro: code, value, message. Generates the enum and coh_strerror(). */
#define COH_STATUS_MAP(X)                                                                          \
    X(OK, 0, "success")                                                                            \
    X(EINVAL, -1, "invalid argument")                                                              \
    X(ENOMEM, -2, "out of memory")                                                                 \
    X(ESYS, -3, "system call failed")                                                              \
    X(ETIMEDOUT, -4, "timed out")                                                                  \
    X(EPEER, -5, "a peer was lost")                                                                \
    X(EMISMATCH, -6, "ranks disagree on the arguments of a collective")                            \
    X(EPROTO, -7, "protocol error")                                                                \
    X(ESTATE, -8, "object is in the wrong state")                                                  \
    X(EUNSUPPORTED, -9, "not supported")                                                           \
    X(ECANCELED, -10, "operation canceled")                                                        \
    X(EAGAIN, -11, "not complete yet")                                                             \
    X(EAUTH, -12, "authentication failed (wrong job token)")                                       \
    X(EBOOTSTRAP, -13, "bootstrap failed")                                                         \
    X(EINTERNAL, -14, "internal error")

typedef enum coh_status {
#define COH__STATUS_ENUM(name, value, msg) COH_##name = (value),
    COH_STATUS_MAP(COH__STATUS_ENUM)
#undef COH__STATUS_ENUM
} coh_status;

/* "EINVAL" style name and a one-line message for a status code. */
COH_API const char *coh_status_name(int status);
COH_API const char *coh_strerror(int status);
/* Detail of the last failure returned on the calling thread ("" if none). */
COH_API const char *coh_last_error(void);

typedef enum coh_dtype {
    COH_F32 = 0,
    COH_F64 = 1,
    COH_F16 = 2,  /* IEEE binary16, reduced in f32 */
    COH_BF16 = 3, /* bfloat16, reduced in f32 */
    COH_I32 = 4,  /* sum and prod wrap around on overflow */
    COH_I64 = 5,
    COH_U8 = 6,
    COH_DTYPE_COUNT
} coh_dtype;

typedef enum coh_redop {
    COH_SUM = 0,
    COH_AVG = 1, /* sum divided by the number of ranks; integer types truncate toward zero */
    COH_MIN = 2,
    COH_MAX = 3,
    COH_PROD = 4,
    COH_REDOP_COUNT
} coh_redop;

COH_API size_t coh_dtype_size(coh_dtype dtype); /* 0 for an unknown dtype */
COH_API const char *coh_dtype_name(coh_dtype dtype);
COH_API const char *coh_redop_name(coh_redop op);

typedef struct coh_ctx coh_ctx_t;
typedef struct coh_comm coh_comm_t;
typedef struct coh_request coh_request_t;

/*
 * Configuration. coh_config_init() fills the documented defaults and then
 * applies the environment (the variable named beside each field); fields set
 * by the caller afterwards win. Strings are copied by coh_init().
 */
typedef struct coh_config {
    int rank;                /* COHORT_RANK | RANK | OMPI_COMM_WORLD_RANK | SLURM_PROCID */
    int world_size;          /* COHORT_WORLD_SIZE | WORLD_SIZE | OMPI_..._SIZE | SLURM_NTASKS */
    const char *store;       /* COHORT_STORE "host:port"; else MASTER_ADDR:MASTER_PORT+1 */
    const char *token;       /* COHORT_TOKEN: job token every connection must present */
    const char *nics;        /* COHORT_NICS: comma list of interfaces or addresses; "lo" */
    int timeout_ms;          /* COHORT_TIMEOUT_MS: op fails after this long without progress
                                (default 300000, 5 min, as PyTorch users expect:
                                a dead peer still fails it at once) */
    int connect_timeout_ms;  /* COHORT_CONNECT_TIMEOUT_MS: bootstrap deadline (default 60000) */
    size_t chunk_bytes;      /* COHORT_CHUNK_BYTES: pipeline chunk of ring plans (1 MiB) */
    size_t small_bytes;      /* COHORT_SMALL_BYTES: at or below, latency-optimal
                                algorithms are used (65536) */
    size_t rail_min_bytes;   /* COHORT_RAIL_MIN_BYTES: below, an op uses one rail (1 MiB) */
    int spin_us;             /* COHORT_SPIN_US: coh_wait runs the request's rail loops itself this
                                long before sleeping, yielding the CPU when nothing moves
                                (-1 = auto: 5000) */
    int store_fd;            /* COHORT_STORE_FD: listening socket inherited from cohortrun
                                for rank 0's store (-1 = bind it) */
    size_t sockbuf_bytes;    /* COHORT_SOCKBUF_BYTES: SO_SNDBUF/SO_RCVBUF of data sockets
                                (0 = kernel autotuning, the default) */
    size_t stash_bytes;      /* COHORT_STASH_BYTES: frames that arrive before their receive is
                                posted are kept in memory up to this much per rail (64 MiB);
                                beyond it the connection pauses */
    int sync_mode;           /* COHORT_SYNC_MODE: allreduce, partial or selective (selective) */
    int coordinator;         /* COHORT_COORDINATOR: rank that runs the scheduler (0) */
    int tick_ms;             /* COHORT_TICK_MS: the scheduler fiber's period (2) */
    const char *sched;       /* COHORT_SCHED: scheduler parameters "name=value,...", see
                                docs/sched.md (p-frac, eta, theta, dt-ms, c, ...); also
                                COHORT_SCHED_<NAME> per parameter, e.g. COHORT_SCHED_ETA */
    int poll_us;             /* COHORT_POLL_US: a rail with ops in flight polls its sockets this
                                long before sleeping (50; 0 = always sleep in epoll) */
    int liveness_ms;         /* COHORT_LIVENESS_MS: a rank or coordinator silent this long on the
                                control plane (heartbeats every fifth of it) is taken for hung:
                                dropped by every rank, its syncs regrouped (3000; 0 = off) */
    int max_inflight;        /* COHORT_MAX_INFLIGHT: ops running at once per rail; later ones
                                wait in order, their timeout not yet started (1024) */
    int rail_failover;       /* COHORT_RAIL_FAILOVER: with several rails, a link that fails or
                                stalls moves to another interface and back (1; 0 = off) */
    int rail_stall_ms;       /* COHORT_RAIL_STALL_MS: unacknowledged this long while another rail
                                progresses = failed (100) */
    int rail_probe_ms;       /* COHORT_RAIL_PROBE_MS: a moved link tries its own interface again
                                this often (500) */
    int lb_epoch;            /* COHORT_LB_EPOCH: with several rails, world ops are split by the
                                coordinator's balancer table, republished every this many ops
                                (16; 0 = even splits) */
    const char *lb_table;    /* COHORT_LB_TABLE: file the coordinator loads its balancer table
                                from at init (if it exists) and saves it to at finalize ("") */
    int coord_election;      /* COHORT_COORD_ELECTION: when the coordinator fails, the survivors
                                elect the lowest live rank (1; 0 = syncs fail with EPEER) */
    int probe_every;         /* COHORT_PROBE_EVERY: in relay and allreduce sync modes, every this
                                many syncs every rank runs coh_probe first (AdapCC: 500; default
                                0 = only on demand: see docs/relay.md) */
    size_t probe_bytes;      /* COHORT_PROBE_BYTES: the bandwidth transfer of a probe (1 MiB) */
    int rejoin;              /* COHORT_REJOIN: this process restarts a rank that failed; it
                                rejoins the running job through coh_comm_grow (0) */
    int relay_segments;      /* COHORT_RELAY_SEGMENTS: phase 1 of a relay group runs as up to
                                this many consecutive ops (of 256 KiB at least), so a late
                                rank's data joins the ones still to come (8; 1 = phase 2) */
    size_t udp_seg_bytes;    /* COHORT_UDP_SEG_BYTES: payload of a bounded-loss data datagram
                                (0: the rail interface's MTU less the IP, UDP and cohort
                                headers, 1448 on Ethernet) */
    int udp_rate_mbps;       /* COHORT_UDP_RATE_MBPS: the line rate a udp flow starts at and
                                returns to (10000) */
    int udp_period_us;       /* COHORT_UDP_PERIOD_US: receivers report their receiving rate
                                this often (1000) */
    int udp_delta_pct;       /* COHORT_UDP_DELTA_PCT: sending above this percentage of the
                                receiving rate is congestion (200: DLCP's delta 2) */
    size_t udp_rcvbuf_bytes; /* COHORT_UDP_RCVBUF_BYTES: SO_RCVBUF of a udp rail (8 MiB) */
    size_t udp_chunk_bytes;  /* COHORT_UDP_CHUNK_BYTES: a bounded-loss allreduce pipelines each
                                block in chunks of this size (128 KiB) */
    int udp_spray;           /* COHORT_UDP_SPRAY: with several udp rails (same datagram size),
                                a bounded-loss allreduce sprays its datagrams over all of them,
                                rate-controlled per rail (1); 0: each carries its own slice */
    int shm;                 /* COHORT_SHM: ranks on the same host (COHORT_HOST_ID) connect
                                through shared memory on every rail (1) */
    size_t shm_ring_bytes;   /* COHORT_SHM_RING_BYTES: each shared-memory ring (0, auto: 1 MiB
                                up to 65 ranks on the host, less above) */
    size_t shm_cma_bytes;    /* COHORT_SHM_CMA_BYTES: frames this large are read by the receiver
                                from the sender's memory, one copy (0: never, the default) */
    int hier;                /* COHORT_HIER: collectives across hosts of equal size: 1
                                hierarchical, 0 flat, -1 (auto) by the link model below */
    int hier_net_us;         /* COHORT_HIER_NET_US: latency between hosts (20 us) */
    int hier_net_mbps;       /* COHORT_HIER_NET_MBPS: a rank's rate to another host (10000) */
    int hier_local_us;       /* COHORT_HIER_LOCAL_US: latency inside a host (2 us) */
    int hier_local_mbps;     /* COHORT_HIER_LOCAL_MBPS: a rank's rate inside a host (40000) */
    int sync_probe_rounds;   /* COHORT_SYNC_PROBE_ROUNDS: the first partial or selective sync of
                                every rank first probes its links to this many peers (0 = off:
                                the rates come from the syncs' frames) */
    int spare_idle_ms;       /* COHORT_SPARE_IDLE_MS: a rail that started no op for this long
                                frees the buffers it keeps for the next ops (frames that came
                                early, reduce-scatter scratch) (5000; 0 = keep them) */
    char _storage[320];      /* private: holds strings coh_config_init composes */
} coh_config_t;

/* Defaults + environment. Returns COH_EINVAL when an environment value does not parse. */
COH_API int coh_config_init(coh_config_t *cfg);

/*
 * Create a context: start one reactor thread per NIC plus a control reactor,
 * bootstrap through the store, connect to every peer on every rail, and
 * build the world communicator. Blocks until all ranks have joined or
 * connect_timeout_ms passes. cfg may be NULL (defaults + environment).
 */
COH_API int coh_init(const coh_config_t *cfg, coh_ctx_t **ctx);
/* Fail every pending request with COH_ECANCELED, close every connection,
 * join every thread and free the context. A second call on the same pointer
 * returns COH_ESTATE. */
COH_API int coh_finalize(coh_ctx_t *ctx);

COH_API int coh_ctx_world(coh_ctx_t *ctx, coh_comm_t **world);
COH_API int coh_ctx_nrails(coh_ctx_t *ctx, int *nrails);
/* The context's "describe yourself" line: rails, addresses, transports,
 * whether a GPU was found. Valid until coh_finalize. */
COH_API const char *coh_ctx_describe(coh_ctx_t *ctx);

/*
 * A file descriptor that becomes readable when any request of this context
 * completes, for foreign event loops (epoll, asyncio, libuv). It stays
 * readable until coh_ctx_event_clear(); then test your requests. Owned by
 * the context: do not close it.
 */
COH_API int coh_ctx_event_fd(coh_ctx_t *ctx, int *fd);
COH_API int coh_ctx_event_clear(coh_ctx_t *ctx);

COH_API int coh_comm_rank(const coh_comm_t *comm, int *rank);
COH_API int coh_comm_size(const coh_comm_t *comm, int *size);

/*
 * Failures. A rank is failed when the coordinator excludes it for good: its
 * process died (its connections closed without a goodbye), it was silent
 * for COHORT_LIVENESS_MS (hung, SIGSTOP), or, in a relay group, it missed
 * its fault deadline (T_fault). Every rank hears it from the coordinator
 * and drops the failed rank's connections (so ops waiting on it end with
 * COH_EPEER at once, and so does every later collective of a communicator
 * that holds it: use coh_comm_shrink); syncs and relay groups go on
 * without it. A rank that
 * loses the coordinator counts the coordinator as failed. A rank that
 * finalizes is not failed.
 *
 * coh_comm_on_failure: fn(comm, rank in comm, why, arg) is called once per
 * failed rank of comm, from a cohort thread (keep it short; do not wait on
 * cohort requests in it). NULL removes it. coh_comm_failed_ranks: the
 * failed ranks of comm, ascending, up to cap of them into ranks (may be
 * NULL with cap 0); returns how many there are, or a negative status.
 */
typedef void (*coh_failure_fn)(coh_comm_t *comm, int rank, const char *why, void *arg);
COH_API int coh_comm_on_failure(coh_comm_t *comm, coh_failure_fn fn, void *arg);
COH_API int coh_comm_failed_ranks(const coh_comm_t *comm, int *ranks, int cap);

/*
 * Shrink (cf. MPI_Comm_shrink, ncclCommShrink): after failures, a new
 * communicator of comm's ranks that are not failed, renumbered in comm's
 * order (rank i of the new one is the i-th survivor). Every surviving rank
 * of comm calls it; it blocks until they all have (a survivor that never
 * calls holds the others up to twice COHORT_TIMEOUT_MS, then ETIMEDOUT) and
 * every caller gets the same communicator. A rank that fails meanwhile is
 * left out. Collectives on the new communicator run over the surviving
 * connections; syncs stay on the world. Free it with coh_comm_free (the
 * context frees what is left at finalize).
 */
COH_API int coh_comm_shrink(coh_comm_t *comm, coh_comm_t **newcomm);
/*
 * Grow: a new communicator of comm's live ranks and the ranks that failed
 * and came back, in world-rank order. A failed rank comes back by starting
 * a new process with the same rank, world size, job token and store and
 * COHORT_REJOIN=1 (the store, on rank 0, must still be up); its coh_init
 * finds the coordinator, and it then calls coh_comm_grow on its world. The
 * live ranks of comm all call it (a grow point); every restarted rank that
 * has asked by the time the last of them does is taken in, and the others
 * wait for the next grow. With none, it returns comm's live ranks again.
 * Everyone gets the same communicator, connected on every rail. The
 * communicators made before, the world included, hold the failed
 * incarnation: collectives on them fail naming the rank. Bounded by twice
 * COHORT_TIMEOUT_MS, like shrink. Not taken back: the rank cannot be
 * elected coordinator (the others have its old control address), and rail
 * failover to it is off (its old routes).
 */
COH_API int coh_comm_grow(coh_comm_t *comm, coh_comm_t **newcomm);
COH_API int coh_comm_free(coh_comm_t *comm); /* COH_EINVAL for the world */

/*
 * Collectives. sendbuf == recvbuf (or sendbuf == NULL) means in place.
 * A count of 0 is valid and completes after matching the other ranks.
 */
/* recvbuf[i] = op over ranks of sendbuf[i], i < count. */
COH_API int coh_allreduce(coh_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                          coh_dtype dtype, coh_redop op, coh_request_t **req);
/* buf on every rank = buf on root. */
COH_API int coh_broadcast(coh_comm_t *comm, void *buf, size_t count, coh_dtype dtype, int root,
                          coh_request_t **req);
/* recvbuf[r*count + i] = sendbuf of rank r [i]; recvbuf holds size*count elements.
 * In place when sendbuf == recvbuf + rank*count or sendbuf == NULL. */
COH_API int coh_allgather(coh_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                          coh_dtype dtype, coh_request_t **req);
/* recvbuf[i] = op over ranks of sendbuf[rank*recvcount + i]; sendbuf holds
 * size*recvcount elements. sendbuf == NULL: recvbuf holds the full input and
 * the result is left in recvbuf[rank*recvcount ...]. */
COH_API int coh_reduce_scatter(coh_comm_t *comm, const void *sendbuf, void *recvbuf,
                               size_t recvcount, coh_dtype dtype, coh_redop op,
                               coh_request_t **req);
COH_API int coh_barrier(coh_comm_t *comm, coh_request_t **req);

/* Wait until the request completes or timeout_ms passes (-1 = forever).
 * Returns the request's status, or COH_EAGAIN on timeout. */
COH_API int coh_wait(coh_request_t *req, int timeout_ms);
/* *done = 1 when complete. Returns 0, or COH_EINVAL for a NULL request. */
COH_API int coh_test(coh_request_t *req, int *done);
/* Status of a completed request; COH_EAGAIN while it runs. */
COH_API int coh_request_status(const coh_request_t *req);
/* Why it failed ("" when it succeeded or still runs). Valid until freed. */
COH_API const char *coh_request_error(const coh_request_t *req);
/* Wall time from submission to completion, in microseconds (0 while running). */
COH_API int coh_request_time_us(const coh_request_t *req, double *us);
/* Release the caller's reference. Freeing a running request is allowed: the
 * runtime keeps its own reference and the buffers stay in use until it ends. */
COH_API void coh_request_free(coh_request_t *req);

/* Counters of a context, summed over its rails. */
typedef struct coh_stats {
    uint64_t bytes_sent;
    uint64_t bytes_received;
    uint64_t requests_completed;
    uint64_t requests_failed;
    uint64_t connections_rejected; /* handshakes this rank's listeners refused (its rails;
                                      rank 0's store; the coordinator's control listener):
                                      wrong job token, garbage, another kind or world size,
                                      no hello in time, too many at once. A peer that hangs
                                      up before its whole hello is not one. */
    uint64_t frames_invalid;       /* connections closed for a malformed frame */
    uint64_t rail_failovers;       /* links (ends on this rank) that moved off their rail's
                                      interface: a socket error, or no ACK for
                                      COHORT_RAIL_STALL_MS while another rail was acked */
    uint64_t rail_returns;         /* links that came back to their own interface */
    uint64_t rail_resent_bytes;    /* bytes sent again after a move (what the old socket had
                                      taken but the peer had not read) */
    uint64_t probes;               /* alpha-beta probes this rank took part in (coh_probe) */
    /* udp rails (bounded loss, docs/udp.md): data datagrams sent and placed;
     * dropped unused: duplicates, invalid ones (malformed header, unknown op
     * step, outside the receive), strangers' (not a peer's address, or not
     * this job's value), late ones (their op or step had ended), and those
     * that came before their receive but found the stash full (kept: those
     * that came early and were kept); retransmission requests this rank
     * sent, and the payload it sent again. */
    uint64_t dg_sent, dg_received;
    uint64_t dg_duplicate, dg_invalid, dg_stranger, dg_late, dg_kept, dg_dropped;
    uint64_t udp_nacks, udp_resent_bytes;
    /* Of bytes_sent and bytes_received, what went through shared memory to
     * ranks on the same host (COHORT_SHM, docs/shm.md). */
    uint64_t shm_bytes_sent, shm_bytes_received;
    /* Of shm_bytes_received, the payload read straight from the sender's
     * memory (single copy, COHORT_SHM_CMA_BYTES). */
    uint64_t shm_cma_bytes_received;
    /* Syncs (coh_sync, relay allreduces) this rank completed: their summed
     * wait for a group (from READY to the plan) and exchange time, the
     * sizes of their groups summed (sync_members / syncs: the mean group),
     * how many had every live rank, and how many this rank relayed (it was
     * late when its group started: a straggler as the coordinator saw it);
     * attempts whose group failed and were tried again. */
    uint64_t syncs, sync_wait_us, sync_comm_us, sync_members, sync_full, sync_relayed, sync_retries;
    /* World ranks this rank knows failed (coh_comm_failed_ranks). */
    uint64_t ranks_failed;
    /* Bounded-loss allreduces: the bytes their datagram receives expected
     * and those they missed (loss fraction = missed / expected). */
    uint64_t loss_bytes_expected, loss_bytes_missed;
    /* Collectives on device buffers (docs/gpu.md) this rank completed, of
     * them those that went through the host's ranks' device memory (CUDA
     * IPC), and the bytes the others copied between device and host. */
    uint64_t gpu_ops, gpu_ops_ipc, gpu_staged_bytes;
    /* Verbs rails (docs/verbs.md): payload bytes written to peers straight
     * from memory declared with coh_mem_register, and the registrations of
     * that memory made (a count that keeps growing: the cache evicts). */
    uint64_t zcopy_bytes_sent, mem_registrations;
    /* Peers' device allocations this rank mapped for the IPC path (CUDA
     * IPC; kept for later ops, so a training loop's count stops growing). */
    uint64_t gpu_ipc_maps;
    /* Of the device ops whose members are all on this host, those staged
     * because some member had not mapped the others' buffers yet (their
     * first use: the mapping is made meanwhile, for the next op). */
    uint64_t gpu_ops_unmapped;
    /* Verbs rails: links (ends on this rank) that resumed on the RDMA
     * device behind another rail's interface, their own device's port
     * being down (docs/verbs.md); each counts in rail_failovers too, and
     * in rail_returns once back. */
    uint64_t rail_moves;
} coh_stats_t;
COH_API int coh_ctx_stats(coh_ctx_t *ctx, coh_stats_t *stats);
/* The same counters for one rail (0 <= rail < coh_ctx_nrails): what went
 * through its interface. Sprayed datagrams count on the rail whose socket
 * carried them; the request and probe counts and the store's and the
 * coordinator's refusals are the context's and stay 0 here. */
COH_API int coh_ctx_rail_stats(coh_ctx_t *ctx, int rail, coh_stats_t *stats);

/* The newest rail balancer table this rank has (the one world ops of the
 * latest epoch it knows are split with; the same text on every rank for
 * the same epoch), as text loadable through COHORT_LB_TABLE. Returns its
 * length (NUL-terminated in buf), COH_EAGAIN before the first world op,
 * COH_EUNSUPPORTED without a balancer (one rail, one rank, or
 * COHORT_LB_EPOCH=0), COH_EINVAL when cap is too small. */
COH_API int coh_lb_table(coh_ctx_t *ctx, char *buf, size_t cap);

/*
 * Logging. The library never prints: it hands messages to this handler,
 * which may be called from any cohort thread (keep it short and
 * thread-safe). Messages above max_level are not formatted. NULL removes it.
 */
typedef enum coh_log_level {
    COH_LOG_ERROR = 0,
    COH_LOG_WARN = 1,
    COH_LOG_INFO = 2,
    COH_LOG_DEBUG = 3
} coh_log_level;
typedef void (*coh_log_fn)(int level, const char *msg, void *arg);
COH_API void coh_set_log_handler(coh_log_fn fn, void *arg, int max_level);

/*
 * Partial synchronisation (data-parallel training with stragglers).
 *
 * A rank that finished a local step calls coh_sync(): it reports READY to the
 * coordinator (rank COHORT_COORDINATOR, 0 by default), whose scheduler places
 * it in a group of ready ranks; the request completes when the group's
 * weighted average, sum(w_i * x_i) / sum(w_i) over the members i, has
 * replaced buf. Modes:
 *   COH_SYNC_ALLREDUCE  every live rank in every group (a plain average);
 *   COH_SYNC_PARTIAL    the first p ready ranks, immediately (FIFO);
 *   COH_SYNC_SELECTIVE  groups of similar bandwidth (BAG) that wait a little
 *                       for ranks about to be ready when that pays (BPAWR),
 *                       with a full synchronisation every c rounds.
 *   COH_SYNC_RELAY      every live rank in every group, without waiting for
 *                       the late ones (AdapCC): the coordinator waits while
 *                       that is cheaper than starting (ski rental), then the
 *                       ready ranks start a ring in which the late ranks'
 *                       reactors relay (forward and reduce others' data,
 *                       their own still being computed); when a late rank
 *                       becomes ready its data is folded in (phase 2). The
 *                       result equals the full weighted average (integer
 *                       data: bit for bit). A late rank that misses its
 *                       fault deadline is left out and excluded.
 * The mode and the scheduler's parameters come from the configuration
 * (sync_mode, sched); COH_SYNC_DEFAULT uses it. All ranks must use the same
 * mode. weight in [COH_SYNC_WEIGHT_MIN, COH_SYNC_WEIGHT_MAX] (e.g. the number
 * of local steps since the last sync); for integer dtypes a whole number at
 * most COH_SYNC_WEIGHT_INT_MAX. Each member scales its input by w_i / 2^e,
 * where 2^e is the power of two just above the group's total weight, so the
 * arithmetic neither overflows nor underflows for any weights in range.
 *
 * Bounds: a rank that does not reach its sync (hung, or stopped) is taken out
 * of the schedule after COHORT_TIMEOUT_MS and the waiting ranks are grouped
 * without it; a rank silent on the control plane for COHORT_LIVENESS_MS
 * (SIGSTOP, a frozen host) is dropped by every rank at once. Ranks that
 * disagree on the mode all fail with COH_EMISMATCH.
 * Group information (members, wait and communication time) is read with
 * coh_request_group() once the request is complete.
 */
#define COH_SYNC_WEIGHT_MIN     1e-30
#define COH_SYNC_WEIGHT_MAX     1e30
#define COH_SYNC_WEIGHT_INT_MAX 16777216.0 /* 2^24 */

typedef enum coh_sync_mode {
    COH_SYNC_DEFAULT = -1,
    COH_SYNC_ALLREDUCE = 0,
    COH_SYNC_PARTIAL = 1,
    COH_SYNC_SELECTIVE = 2,
    COH_SYNC_RELAY = 3,
    COH_SYNC_MODE_COUNT
} coh_sync_mode;

COH_API int coh_sync(coh_comm_t *comm, void *buf, size_t count, coh_dtype dtype, uint64_t iteration,
                     double weight, coh_request_t **req);
COH_API int coh_sync_ex(coh_comm_t *comm, void *buf, size_t count, coh_dtype dtype,
                        uint64_t iteration, double weight, coh_sync_mode mode, coh_request_t **req);
/* This rank stops syncing on comm for now: the coordinator takes it out of
 * the schedule, so no group waits for it (call it when a rank is done with a
 * phase of training while others go on; coh_finalize does it too). Its next
 * coh_sync brings it back into the schedule. */
COH_API int coh_sync_leave(coh_comm_t *comm);
COH_API const char *coh_sync_mode_name(coh_sync_mode mode);
/* "allreduce", "partial", "selective", "relay" -> mode; COH_EINVAL otherwise. */
COH_API int coh_sync_mode_from_name(const char *name, coh_sync_mode *mode);

typedef struct coh_group_info {
    uint64_t group_id;  /* unique per communicator */
    int size;           /* members, this rank included */
    const int *members; /* ranks in ring order; valid until the request is freed */
    int full;           /* 1: every live rank took part */
    double total_weight;
    double wait_us; /* from READY to the plan's arrival */
    double comm_us; /* from the plan's arrival to completion */
    /* Relay groups (COH_SYNC_RELAY, COH_ALLREDUCE_RELAY); 0 otherwise. */
    int nrelays;       /* ranks late at the launch, relays of phase 1 */
    const int *relays; /* valid until the request is freed */
    int relayed;       /* 1: this rank relayed phase 1 (its data came in phase 2) */
    int phase2;        /* late ranks whose data phase 2 folded in */
    int phase2_method; /* 0 none, 1 broadcast around the ring, 2 prefix allreduce */
    int nexcluded;     /* late ranks left out (failed or lost): not in the result */
    int nsegments;     /* phase 1 ran as this many consecutive segment ops */
    int joined;        /* this rank relayed and its data joined phase 1 from this
                          segment on (phase 2 brought the segments before); -1: no */
} coh_group_info_t;
/* COH_EINVAL for a request that is not a sync; COH_EAGAIN while it runs. */
COH_API int coh_request_group(const coh_request_t *req, coh_group_info_t *info);

/*
 * Allreduce with options. COH_ALLREDUCE_RELAY runs the allreduce as a relay
 * group (see COH_SYNC_RELAY): ranks that submitted start, guided by the
 * coordinator, while the late ranks' reactors relay for them; the late
 * ranks' data is folded in when they submit. The result is the same as
 * coh_allreduce's (integer data: bit for bit; floating point: the same
 * value on every rank, summed in another order). World communicator only;
 * every rank must use the same algo, op, count and dtype (else
 * COH_EMISMATCH); at most one relay op or sync outstanding per rank.
 * coh_request_group() describes the group. opts NULL = defaults.
 * A late rank that fails (dies, hangs, misses its fault deadline, or is
 * still not there COHORT_TIMEOUT_MS after phase 1) is excluded: the others
 * complete without its data (the group says full = 0, nexcluded > 0) and it
 * is failed for good (coh_comm_failed_ranks); a slow rank whose compute
 * time has no record yet is waited for.
 */
typedef enum coh_allreduce_algo {
    COH_ALLREDUCE_DEFAULT = 0, /* coh_allreduce: ring or recursive doubling by size */
    COH_ALLREDUCE_RELAY = 1,
} coh_allreduce_algo;
typedef struct coh_allreduce_opts {
    int algo;           /* coh_allreduce_algo */
    uint64_t iteration; /* relay: the caller's step number, for traces */
    /* Bounded loss (DLCP; docs/udp.md), COH_ALLREDUCE_DEFAULT only: on the
     * rails marked udp (COHORT_NICS=eth0:udp) the allreduce runs as push
     * (every block to its owner) and pull (the reduced blocks back) in
     * datagrams, and each receive of the push may miss up to loss_bound of
     * its bytes, each of the pull up to pull_loss_bound (0: a quarter of
     * loss_bound). A missing push segment is left out of the owner's result
     * (COH_AVG divides by the contributors per segment); a missing pull
     * segment leaves this rank's own input there. 0 = every byte (the
     * default: the reliable path). Ranks must agree (else COH_EMISMATCH).
     * coh_request_loss() says what was lost. tcp rails ignore the bound. */
    double loss_bound;
    double pull_loss_bound;
    /* Packet tagging: this tensor is layer `layer` of `nlayers` (nlayers 0:
     * no layer priority); its datagrams get DSCP class selector
     * floor(layer * 8 / nlayers). Float datagrams whose mean |x| is above the
     * tensor's median are sent ECN-capable. */
    int layer, nlayers;
    /* Device buffers (COH_ALLREDUCE_DEFAULT without a loss bound): see
     * coh_coll_opts_t. */
    int mem;
    void *stream;
} coh_allreduce_opts_t;
COH_API int coh_allreduce_ex(coh_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                             coh_dtype dtype, coh_redop op, const coh_allreduce_opts_t *opts,
                             coh_request_t **req);

/*
 * Device buffers (docs/gpu.md). With a device runtime (COHORT_GPU; auto:
 * CUDA when this build has it and a device is visible) every collective
 * takes device pointers. The plain calls find them out
 * (cudaPointerGetAttributes) and follow the default stream; the _ex forms
 * say where the buffers are and which stream the op follows: it starts
 * once the work queued on that stream before the call has completed (no
 * thread blocks on the device), its data goes through pinned host memory
 * in pipelined chunks (COHORT_GPU_CHUNK_BYTES), and the request completes
 * when the result is in the device buffer. Without a device runtime
 * COH_MEM_DEVICE fails with COH_EUNSUPPORTED. Syncs, relay and
 * bounded-loss allreduces take host buffers only.
 */
typedef enum coh_mem {
    COH_MEM_AUTO = 0,   /* ask the device runtime */
    COH_MEM_HOST = 1,   /* host memory (no query) */
    COH_MEM_DEVICE = 2, /* device memory */
} coh_mem;
typedef struct coh_coll_opts {
    int mem;      /* coh_mem */
    void *stream; /* the cudaStream_t the op follows; NULL: the default stream */
} coh_coll_opts_t;
COH_API int coh_broadcast_ex(coh_comm_t *comm, void *buf, size_t count, coh_dtype dtype, int root,
                             const coh_coll_opts_t *opts, coh_request_t **req);
COH_API int coh_allgather_ex(coh_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                             coh_dtype dtype, const coh_coll_opts_t *opts, coh_request_t **req);
COH_API int coh_reduce_scatter_ex(coh_comm_t *comm, const void *sendbuf, void *recvbuf,
                                  size_t recvcount, coh_dtype dtype, coh_redop op,
                                  const coh_coll_opts_t *opts, coh_request_t **req);
/* Work queued on stream after this call starts once req has completed (a
 * completed request: at once). Until then the stream waits on a flag that
 * the completion sets (cuStreamWaitValue32); no thread waits. At most 1024
 * such waits pending (COH_ENOMEM beyond). COH_EUNSUPPORTED without a device
 * runtime. */
COH_API int coh_request_stream_wait(coh_request_t *req, void *stream);

/* Device memory from the context's device runtime, for programs and
 * languages without CUDA bindings of their own, and for benchmarks (cf.
 * ncclMemAlloc). coh_mem_copy copies bytes between host and device memory,
 * either way, and returns when they are there. COH_EUNSUPPORTED without a
 * device runtime. */
COH_API int coh_mem_alloc(coh_ctx_t *ctx, size_t bytes, void **ptr);
COH_API int coh_mem_free(coh_ctx_t *ctx, void *ptr);
COH_API int coh_mem_copy(coh_ctx_t *ctx, void *dst, const void *src, size_t bytes);

/* Declare host memory that collectives will send from, so that transports
 * that can (verbs rails, COHORT_VERBS_ZCOPY_BYTES) write it to peers
 * without a copy (cf. ncclCommRegister). The range must stay mapped until
 * coh_mem_deregister(ptr) and must not overlap another declared range
 * (COH_EINVAL); deregister only when no collective using it is pending.
 * Registrations are made per rail on first use and cached
 * (COHORT_VERBS_REG_CACHE_BYTES bounds what stays pinned). Any transport
 * accepts the declaration; those without zero copy ignore it. */
COH_API int coh_mem_register(coh_ctx_t *ctx, const void *ptr, size_t bytes);
COH_API int coh_mem_deregister(coh_ctx_t *ctx, const void *ptr);

/* What a bounded-loss request lost on this rank: bytes its datagram
 * receives expected and missed, by stage, and the missed fractions. */
typedef struct coh_loss_info {
    uint64_t push_bytes, push_lost_bytes;
    uint64_t pull_bytes, pull_lost_bytes;
    double push_lost, pull_lost; /* lost / bytes; 0 when nothing went by datagram */
} coh_loss_info_t;
/* COH_EAGAIN while it runs; all zero for a request without a loss bound. */
COH_API int coh_request_loss(const coh_request_t *req, coh_loss_info_t *info);

/*
 * Alpha-beta probe (AdapCC's profiling): every link of the world, on every
 * rail, measured in rounds of disjoint pairs (a round-robin tournament, so
 * no two probes share a rank): latency = the median of small exchanges,
 * rate = a COHORT_PROBE_BYTES transfer each way. The coordinator feeds the
 * results to the scheduler's cost model (alpha, each rank's bandwidth) and to
 * the rail balancer. Collective over the world (every rank calls it; failed
 * ranks are skipped); also run every COHORT_PROBE_EVERY syncs in relay and
 * allreduce modes. Fills up to cap of this rank's links; info (may be NULL)
 * says what it cost.
 */
typedef struct coh_link_probe {
    int peer; /* world rank */
    int rail;
    double latency_us; /* one way */
    double gbps;       /* payload rate */
} coh_link_probe_t;
typedef struct coh_probe_info {
    double duration_us;  /* the whole probe, on this rank */
    uint64_t bytes_sent; /* by this rank */
    int nlinks;          /* links this rank measured (may exceed cap) */
    int nfailed;         /* links that could not be measured (a failed peer) */
} coh_probe_info_t;
COH_API int coh_probe(coh_comm_t *world, coh_link_probe_t *links, int cap, coh_probe_info_t *info);
/* The per-peer link estimates this rank holds: its links (every peer, every
 * rail) as its latest coh_probe measured them, the figures the coordinator's
 * cost model and the rail balancer use. Copies up to cap into links and
 * returns how many there are (0 before any probe). */
COH_API int coh_ctx_links(coh_ctx_t *ctx, coh_link_probe_t *links, int cap);

/* Convenience: submit, wait, free. Returns the collective's status. */
COH_API int coh_allreduce_sync(coh_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
                               coh_dtype dtype, coh_redop op);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_H */
