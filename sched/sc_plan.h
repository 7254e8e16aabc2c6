/*
 * sc_plan.h - collective plan builders (pure: no I/O, no clock).
 *
 * A plan is one rank's part of a collective: a list of steps (send, receive,
 * receive-and-reduce, local copy / reduce / scale) with dependencies between
 * them. engines/ runs the plan as a state machine; tests run all ranks' plans
 * in memory. Every rank builds its plan from the same arguments, so a send on
 * one rank and the matching receive on its peer carry the same tag and the
 * same element count: frames are matched by (op, tag), never by arrival order.
 *
 * Offsets and counts are in elements of the collective's dtype; a step names
 * which of the op's buffers it reads and writes (SC_BUF_*).
 */
#ifndef COH_SC_PLAN_H
#define COH_SC_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum { SC_BUF_SEND = 0, SC_BUF_RECV = 1, SC_BUF_SCRATCH = 2, SC_BUF_COUNT = 3 };

typedef enum sc_step_kind {
    SC_SEND = 0,        /* send buf[src][src_off .. +count) to peer */
    SC_RECV = 1,        /* receive count elements from peer into buf[dst][dst_off ..] */
    SC_RECV_REDUCE = 2, /* receive x from peer: buf[dst][dst_off+i] = buf[src][src_off+i] op x[i] */
    SC_COPY = 3,        /* local copy buf[src] -> buf[dst]; skipped when the regions coincide */
    SC_REDUCE = 4,      /* local: buf[dst][i] = buf[dst][i] op buf[src][i] */
    SC_SCALE = 5,       /* local: buf[dst][i] *= factor (weights) */
    SC_DIV = 6,         /* local: buf[dst][i] /= factor (average; integers truncate) */
} sc_step_kind;

/* The stages of a direct (push/pull) allreduce, which a bounded-loss
 * transport treats differently: a push segment that never arrives is absent
 * from the owner's sum, a pull segment leaves the receiver its own value, and
 * each stage has its own loss bound (engines/en_udp.c). */
typedef enum sc_stage { SC_STAGE_NONE = 0, SC_STAGE_PUSH = 1, SC_STAGE_PULL = 2 } sc_stage;

typedef struct sc_step {
    uint8_t kind;  /* sc_step_kind */
    uint8_t src;   /* SC_BUF_* read by the step */
    uint8_t dst;   /* SC_BUF_* written by the step */
    uint8_t stage; /* sc_stage: which stage of a push/pull allreduce (bounded loss) */
    int32_t peer;  /* rank in the communicator; -1 for local steps */
    uint32_t tag;  /* equal on the sending and the receiving side */
    uint32_t ndeps;
    uint32_t dep_off; /* deps[dep_off .. dep_off+ndeps) must finish before this step starts */
    uint64_t src_off;
    uint64_t dst_off;
    uint64_t count;
    double factor; /* SC_SCALE, SC_DIV */
} sc_step_t;

typedef struct sc_plan {
    sc_step_t *steps;
    uint32_t nsteps, steps_cap;
    uint32_t *deps; /* indices of steps */
    uint32_t ndeps, deps_cap;
    /* Reverse edges, filled by sc_plan_build: the steps waiting on step i are
     * rdeps[rdep_off[i] .. rdep_off[i+1]). */
    uint32_t *rdep_off;
    uint32_t *rdeps;
    uint64_t scratch_count; /* elements of scratch the plan needs */
    uint32_t nsend, nrecv;  /* how many network steps, for bookkeeping */
} sc_plan_t;

typedef enum sc_coll_kind {
    SC_ALLREDUCE = 0,
    SC_BROADCAST = 1,
    SC_ALLGATHER = 2,
    SC_REDUCE_SCATTER = 3,
    SC_BARRIER = 4,
    SC_COLL_COUNT
} sc_coll_kind;

typedef enum sc_algo {
    SC_ALGO_AUTO = 0,   /* by size: latency-optimal at or below small_elems */
    SC_ALGO_RING = 1,   /* bandwidth-optimal, chunked and pipelined */
    SC_ALGO_RD = 2,     /* recursive doubling (allreduce), binomial tree (broadcast),
                           direct exchange (allgather, reduce-scatter) */
    SC_ALGO_DIRECT = 3, /* allreduce: push every block to its owner, pull the reduced
                           blocks back (a sharded parameter server; 2 steps, n-1 flows
                           at once); what bounded-loss ops run */
    SC_ALGO_HIER = 4,   /* allreduce across hosts (host[]): reduce-scatter inside each
                           host, a ring of each shard between the hosts, allgather
                           inside each host (NCCL's and Horovod's hierarchical
                           allreduce); falls back to the ring when the hosts do not
                           all have the same number (>= 2) of members */
    SC_ALGO_HD = 5,     /* allreduce: halving-doubling (Rabenseifner): reduce-scatter by
                           recursive halving, allgather by recursive doubling; the ring's
                           bytes in 2 log2(n) steps (non-powers of two fold first); other
                           collectives: the ring */
    SC_ALGO_STAR = 6,   /* allreduce: every rank to position 0, which reduces and sends
                           the result back (2(n-1) messages); other collectives: as
                           SC_ALGO_RD */
} sc_algo;

/* SC_ALGO_DIRECT: chunks of one destination's pushes in flight at once
 * (sc_plan.c explains the number). */
#define SC_DIRECT_WINDOW 4u

typedef struct sc_coll {
    sc_coll_kind kind;
    sc_algo algo;
    int nranks; /* members of the plan */
    int rank;   /* this rank's index in order[] (its position in the ring) */
    /* order[i] is the communicator rank at ring position i; NULL = identity.
     * Peers in steps are communicator ranks. */
    const int *order;
    int root; /* broadcast: position of the root in order[] */
    /* allreduce, broadcast: elements of the whole buffer; allgather: elements
     * contributed per rank; reduce-scatter: elements of each rank's result. */
    uint64_t count;
    /* The slice [lo, hi) of [0, count) this plan moves (one rail's share);
     * for allgather and reduce-scatter the slice of every rank's block. */
    uint64_t lo, hi;
    uint64_t chunk_elems; /* pipeline chunk of ring plans (>= 1) */
    uint64_t small_elems; /* SC_ALGO_AUTO threshold, in elements of the whole op */
    bool avg;             /* divide the result by nranks */
    /* Weighted averaging (partial synchronisation), allreduce only: the
     * input is copied into the recv buffer and multiplied there by `scale`
     * before anything is sent (so the send buffer is only read), and the
     * sum is divided by `divide` (0: no division). With scale = w_i and
     * divide = sum of w over the members, the result is the weighted mean. */
    double scale;  /* 0 = no prologue */
    double divide; /* 0 = none; overrides avg */
    /* reduce-scatter: the input sits in the recv buffer (in place); the work
     * area is the input itself and no scratch is needed. */
    bool rs_in_place;
    /* allgather, reduce-scatter with an order: rank blocks sit by position
     * in order[] (a communicator's layout), not at order[p] * count (a
     * subset's blocks in a world-sized buffer). */
    bool pos_blocks;
    /* host[comm rank]: which host each member is on (any ints; equal = same
     * host); NULL = not known. SC_ALGO_HIER's grouping. */
    const int *host;
} sc_coll_t;

void sc_plan_init(sc_plan_t *plan);
void sc_plan_free(sc_plan_t *plan);
/* Build (appending to an initialised, empty plan). Returns 0, COH_EINVAL for
 * arguments out of range, COH_ENOMEM. On failure the plan is left freeable. */
int sc_plan_build(const sc_coll_t *coll, sc_plan_t *plan);
/* The algorithm SC_ALGO_AUTO resolves to for these arguments. */
sc_algo sc_plan_resolve_algo(const sc_coll_t *coll);
/* Hosts and members per host of coll's members when SC_ALGO_HIER applies
 * (an allreduce; host[] given; >= 2 hosts of the same number >= 2 of
 * members; no weighting prologue); false otherwise. */
bool sc_plan_hier_shape(const sc_coll_t *coll, int *hosts, int *per_host);

/* A two-level link model for choosing a hierarchical plan (COHORT_HIER=-1):
 * latency (s) and rate (bytes/s) of a message between hosts (one rank's share
 * of its NIC) and inside a host. Every rank must use the same model. */
typedef struct sc_link_model {
    double net_lat, net_bw;
    double local_lat, local_bw;
    /* The CPU of small allreduces when every rank shares one host: a message
     * costs msg_cpu (s) plus its bytes at net_bw to its sender and again to
     * its receiver, and the ranks' sum of that is shared by `cores`. The busiest
     * rank, or the sum over min(cores, ranks), bounds the op from below, as its
     * path of latencies does: the cost is the larger. 0: not counted (ranks on
     * several hosts, each with its own cores). */
    double msg_cpu;
    int cores;
} sc_link_model_t;

/* Expected seconds of coll with elements of es bytes under model m, for its
 * algo (SC_ALGO_AUTO: what sc_plan_resolve_algo picks). Flat plans are paced
 * by their slowest link, a network one (a ring over several hosts has some);
 * SC_ALGO_HIER by its phases, each on its own kind of link. Alpha-beta terms,
 * and the CPU term of m for small allreduces (SC_ALGO_RD, SC_ALGO_STAR): no
 * contention between phases, no reduction cost. -1 when SC_ALGO_HIER
 * does not apply (sc_plan_hier_shape). */
double sc_plan_cost(const sc_coll_t *coll, size_t es, const sc_link_model_t *m);

/* Low-level building blocks, used by the builders above and by the subset and
 * relay plans of the scheduler. Return the new step index or -1 on ENOMEM. */
int64_t sc_plan_add(sc_plan_t *plan, const sc_step_t *step, const uint32_t *deps, uint32_t ndeps);
/* Fill rdep_off / rdeps. Called by sc_plan_build; call it after sc_plan_add. */
int sc_plan_finish(sc_plan_t *plan);

/* Balanced split of n items into parts: part i is [sc_split(n, parts, i),
 * sc_split(n, parts, i+1)). Every rank computes the same boundaries. */
static inline uint64_t sc_split(uint64_t n, uint64_t parts, uint64_t i)
{
    /* n * i can overflow for huge n; split into quotient and remainder. */
    uint64_t q = n / parts, r = n % parts;
    return q * i + (i < r ? i : r);
}

const char *sc_step_kind_name(int kind);
const char *sc_coll_kind_name(int kind);

#endif
