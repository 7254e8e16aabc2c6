/*
 * Plan builders: ring (reduce-scatter + allgather, chunked), recursive
 * doubling, binomial tree, pipelined chain, direct exchange, dissemination
 * barrier. See sc_plan.h for the step semantics.
 */
#include "sched/sc_plan.h"

#include "base/bs_alloc.h"
#include <math.h>
#include <string.h>

#include "cohort.h"

#define NONE  UINT32_MAX
#define LOCAL INT32_MIN /* peer position of local steps (positions may be negative: mod n) */

void sc_plan_init(sc_plan_t *plan)
{
    memset(plan, 0, sizeof(*plan));
}

void sc_plan_free(sc_plan_t *plan)
{
    coh_free(plan->steps);
    coh_free(plan->deps);
    coh_free(plan->rdep_off);
    coh_free(plan->rdeps);
    memset(plan, 0, sizeof(*plan));
}

int64_t sc_plan_add(sc_plan_t *plan, const sc_step_t *step, const uint32_t *deps, uint32_t ndeps)
{
    if (plan->nsteps == plan->steps_cap) {
        uint32_t cap = plan->steps_cap ? plan->steps_cap * 2 : 16;
        sc_step_t *s = coh_reallocn(plan->steps, cap, sizeof(*s));
        if (!s) return -1;
        plan->steps = s;
        plan->steps_cap = cap;
    }
    uint32_t real = 0;
    for (uint32_t i = 0; i < ndeps; i++) real += deps[i] != NONE;
    if (plan->ndeps + real > plan->deps_cap) {
        uint32_t cap = plan->deps_cap ? plan->deps_cap * 2 : 32;
        while (cap < plan->ndeps + real) cap *= 2;
        uint32_t *d = coh_reallocn(plan->deps, cap, sizeof(*d));
        if (!d) return -1;
        plan->deps = d;
        plan->deps_cap = cap;
    }
    sc_step_t *s = &plan->steps[plan->nsteps];
    *s = *step;
    s->dep_off = plan->ndeps;
    s->ndeps = 0;
    for (uint32_t i = 0; i < ndeps; i++) {
        if (deps[i] == NONE) continue;
        plan->deps[plan->ndeps++] = deps[i];
        s->ndeps++;
    }
    if (s->kind == SC_SEND) plan->nsend++;
    if (s->kind == SC_RECV || s->kind == SC_RECV_REDUCE) plan->nrecv++;
    return plan->nsteps++;
}

int sc_plan_finish(sc_plan_t *plan)
{
    coh_free(plan->rdep_off);
    coh_free(plan->rdeps);
    plan->rdep_off = coh_calloc(plan->nsteps + 1, sizeof(uint32_t));
    plan->rdeps = coh_calloc(plan->ndeps ? plan->ndeps : 1, sizeof(uint32_t));
    if (!plan->rdep_off || !plan->rdeps) return COH_ENOMEM;
    for (uint32_t i = 0; i < plan->nsteps; i++) {
        const sc_step_t *s = &plan->steps[i];
        for (uint32_t d = 0; d < s->ndeps; d++) plan->rdep_off[plan->deps[s->dep_off + d] + 1]++;
    }
    for (uint32_t i = 0; i < plan->nsteps; i++) plan->rdep_off[i + 1] += plan->rdep_off[i];
    uint32_t *fill = coh_calloc(plan->nsteps + 1, sizeof(uint32_t));
    if (!fill) return COH_ENOMEM;
    for (uint32_t i = 0; i < plan->nsteps; i++) {
        const sc_step_t *s = &plan->steps[i];
        for (uint32_t d = 0; d < s->ndeps; d++) {
            uint32_t from = plan->deps[s->dep_off + d];
            plan->rdeps[plan->rdep_off[from] + fill[from]++] = i;
        }
    }
    coh_free(fill);
    return 0;
}

/* ---- small helpers shared by the builders ---- */

typedef struct bld {
    const sc_coll_t *c;
    sc_plan_t *plan;
    int n, r;
    uint64_t lo, len; /* the slice */
    uint32_t k;       /* chunks per segment */
    int err;
    uint32_t root; /* a step every later step waits for (the weighting prologue) */
    int in;        /* buffer the input is read from: SEND, or RECV after the prologue */
} bld_t;

static int pos_rank(const bld_t *b, int pos)
{
    int p = ((pos % b->n) + b->n) % b->n;
    return b->c->order ? b->c->order[p] : p;
}

static uint32_t add(bld_t *b, int kind, int src, int dst, int peer_pos, uint32_t tag,
                    uint64_t src_off, uint64_t dst_off, uint64_t count, double factor,
                    const uint32_t *deps, uint32_t ndeps)
{
    if (b->err) return NONE;
    sc_step_t s = {.kind = (uint8_t)kind,
                   .src = (uint8_t)src,
                   .dst = (uint8_t)dst,
                   .peer = peer_pos == LOCAL ? -1 : pos_rank(b, peer_pos),
                   .tag = tag,
                   .src_off = src_off,
                   .dst_off = dst_off,
                   .count = count,
                   .factor = factor};
    uint32_t all[8];
    if (b->root != NONE) {
        /* Everything after the prologue waits for it (plans pass at most 3 deps). */
        uint32_t n = 0;
        for (uint32_t d = 0; d < ndeps && n < 7; d++) all[n++] = deps[d];
        all[n++] = b->root;
        deps = all;
        ndeps = n;
    }
    int64_t i = sc_plan_add(b->plan, &s, deps, ndeps);
    if (i < 0) {
        b->err = COH_ENOMEM;
        return NONE;
    }
    return (uint32_t)i;
}

#define DEPS(...)                                                                                  \
    (const uint32_t[]){__VA_ARGS__},                                                               \
        (uint32_t)(sizeof((uint32_t[]){__VA_ARGS__}) / sizeof(uint32_t))
#define NODEPS NULL, 0

static uint32_t tag_of(const bld_t *b, uint32_t phase, uint32_t step, uint32_t chunk)
{
    return (phase * (uint32_t)b->n + step) * b->k + chunk;
}

/* Chunks per segment: enough that a chunk is at most chunk_elems, capped so
 * tags stay within 32 bits (phase * n * k < 2^32 with n <= 65536). */
static uint32_t chunks_for(uint64_t seg_max, uint64_t chunk_elems)
{
    if (chunk_elems == 0) chunk_elems = 1;
    uint64_t k = (seg_max + chunk_elems - 1) / chunk_elems;
    if (k < 1) k = 1;
    if (k > 4096) k = 4096;
    return (uint32_t)k;
}

/* Element range of chunk k of segment seg when the slice is split into nseg
 * segments of k chunks each; offsets relative to the slice start. */
static void chunk_range(const bld_t *b, uint64_t nseg, uint64_t seg, uint32_t k, uint64_t *off,
                        uint64_t *cnt)
{
    uint64_t s0 = sc_split(b->len, nseg, seg), s1 = sc_split(b->len, nseg, seg + 1);
    uint64_t sl = s1 - s0;
    uint64_t c0 = sc_split(sl, b->k, k), c1 = sc_split(sl, b->k, k + 1);
    *off = s0 + c0;
    *cnt = c1 - c0;
}

/* ---- barrier: dissemination, also used for zero-element collectives ---- */

static void build_barrier(bld_t *b)
{
    uint32_t prev = NONE;
    for (uint32_t round = 0, dist = 1; (int)dist < b->n; round++, dist <<= 1) {
        add(b, SC_SEND, SC_BUF_RECV, SC_BUF_RECV, b->r + (int)dist, round, 0, 0, 0, 0, DEPS(prev));
        prev =
            add(b, SC_RECV, SC_BUF_RECV, SC_BUF_RECV, b->r - (int)dist, round, 0, 0, 0, 0, NODEPS);
    }
}

/* A broadcast's root depends on nobody, so it would finish before a rank
 * that disagrees on the arguments could tell it. Closing every broadcast
 * with this fence (a dissemination barrier that starts once the rank has
 * its data) makes each rank's completion depend on every other rank's
 * receive: a mismatch anywhere fails the op everywhere. It costs log2(n)
 * zero-byte rounds, nothing next to a large broadcast. */
#define FENCE_TAG 0x40000000u
static void build_fence(bld_t *b)
{
    sc_plan_t *p = b->plan;
    uint32_t n0 = p->nsteps;
    uint32_t *mine = coh_malloc(sizeof(uint32_t) * (n0 ? n0 : 1));
    if (!mine) {
        b->err = COH_ENOMEM;
        return;
    }
    uint32_t nm = 0;
    for (uint32_t i = 0; i < n0; i++)
        if (p->steps[i].kind == SC_RECV) mine[nm++] = i;
    uint32_t prev = NONE;
    for (uint32_t round = 0, dist = 1; (int)dist < b->n; round++, dist <<= 1) {
        if (round == 0) {
            sc_step_t s = {.kind = SC_SEND,
                           .src = SC_BUF_RECV,
                           .dst = SC_BUF_RECV,
                           .peer = pos_rank(b, b->r + (int)dist),
                           .tag = FENCE_TAG};
            if (!b->err && sc_plan_add(p, &s, mine, nm) < 0) b->err = COH_ENOMEM;
        } else {
            add(b, SC_SEND, SC_BUF_RECV, SC_BUF_RECV, b->r + (int)dist, FENCE_TAG + round, 0, 0, 0,
                0, DEPS(prev));
        }
        prev = add(b, SC_RECV, SC_BUF_RECV, SC_BUF_RECV, b->r - (int)dist, FENCE_TAG + round, 0, 0,
                   0, 0, NODEPS);
    }
    coh_free(mine);
}

/* The divisor of the result: an explicit one (weighted mean), nranks for
 * avg, or 0 for none. */
static double divisor(const bld_t *b)
{
    if (b->c->divide > 0) return b->c->divide;
    return b->c->avg ? (double)b->n : 0;
}

/* ---- allreduce ---- */

static void build_allreduce_ring(bld_t *b)
{
    const int n = b->n, r = b->r;
    const double div = divisor(b);
    b->k = chunks_for((b->len + n - 1) / n, b->c->chunk_elems);
    uint32_t *prev = coh_malloc(sizeof(uint32_t) * b->k); /* last step touching chunk k */
    if (!prev) {
        b->err = COH_ENOMEM;
        return;
    }
    for (uint32_t k = 0; k < b->k; k++) prev[k] = NONE;

    /* Reduce-scatter: at step s send segment r-s, receive and reduce segment
     * r-s-1. The segment sent at step s is the one reduced at step s-1. */
    for (int s = 0; s < n - 1; s++) {
        for (uint32_t k = 0; k < b->k; k++) {
            uint64_t so, sc, ro, rc;
            chunk_range(b, n, (uint64_t)((r - s + n) % n), k, &so, &sc);
            chunk_range(b, n, (uint64_t)((r - s - 1 + 2 * n) % n), k, &ro, &rc);
            uint32_t tag = tag_of(b, 0, (uint32_t)s, k);
            if (sc) /* the first step reads the caller's input, later ones the partial sums */
                add(b, SC_SEND, s == 0 ? b->in : SC_BUF_RECV, SC_BUF_RECV, r + 1, tag, b->lo + so,
                    b->lo + so, sc, 0, DEPS(prev[k]));
            if (rc)
                prev[k] = add(b, SC_RECV_REDUCE, b->in, SC_BUF_RECV, r - 1, tag, b->lo + ro,
                              b->lo + ro, rc, 0, NODEPS);
        }
    }
    /* This rank now owns segment r+1 fully reduced. */
    for (uint32_t k = 0; k < b->k; k++) {
        uint64_t o, c;
        chunk_range(b, n, (uint64_t)((r + 1) % n), k, &o, &c);
        if (div > 0 && c)
            prev[k] = add(b, SC_DIV, SC_BUF_RECV, SC_BUF_RECV, LOCAL, 0, b->lo + o, b->lo + o, c,
                          div, DEPS(prev[k]));
    }
    /* Allgather: at step s send segment r+1-s, receive segment r-s. */
    for (int s = 0; s < n - 1; s++) {
        for (uint32_t k = 0; k < b->k; k++) {
            uint64_t so, sc, ro, rc;
            chunk_range(b, n, (uint64_t)((r + 1 - s + n) % n), k, &so, &sc);
            chunk_range(b, n, (uint64_t)((r - s + n) % n), k, &ro, &rc);
            uint32_t tag = tag_of(b, 1, (uint32_t)s, k);
            if (sc)
                add(b, SC_SEND, SC_BUF_RECV, SC_BUF_RECV, r + 1, tag, b->lo + so, b->lo + so, sc, 0,
                    DEPS(prev[k]));
            if (rc)
                prev[k] = add(b, SC_RECV, SC_BUF_RECV, SC_BUF_RECV, r - 1, tag, b->lo + ro,
                              b->lo + ro, rc, 0, NODEPS);
        }
    }
    coh_free(prev);
}

/*
 * Direct (push/pull) allreduce: a parameter server sharded over the ranks,
 * DLCP's push and pull stages. Every rank owns block r of the slice; it
 * pushes every other block to its owner, reduces the pushes of its own block
 * (all posted at once, reduced into the block as they come), divides, and
 * sends the block to everyone (the pull). Per rank the same bytes as the
 * ring, in two steps of n-1 flows. A pull that never arrives leaves the
 * receiver its own value of that block (its receive's src), and a push that
 * never arrives is simply absent from the owner's sum (a bounded-loss
 * transport divides by the contributors per segment, engines/en_udp.c).
 */

/* A step of one stage after a list of steps (the prologue's dependency, if
 * any, comes through them). */
static uint32_t add_after(bld_t *b, sc_step_t s, const uint32_t *deps, uint32_t nd)
{
    if (b->err) return NONE;
    int64_t i = sc_plan_add(b->plan, &s, deps, nd);
    if (i < 0) b->err = COH_ENOMEM;
    return i < 0 ? NONE : (uint32_t)i;
}

/* Chunks of one destination's pushes in flight at once (SC_DIRECT_WINDOW).
 * With one, each waited for the end of the last (over udp: its FIN, after a
 * NACK round at drops), a round trip through the links' queues in which
 * nothing went to that destination: at 5% drops a rank's sender had nothing
 * to send a third of the time. Two kept the link busy; more only lengthened
 * the queues while the engine sent pulls and pushes by chunk. Since it sends
 * pushes first (en_udp.c, turn_flow), four let the last chunks' pushes, which
 * their owners' pulls wait for, end sooner: at 5% drops p50 567 / 568 ms
 * against 572 / 570 with two, p99 573 / 573 against 580 / 584 (bench/udp.sh's
 * cluster, 24 iterations, two rounds); six or eight gained nothing more. A
 * sprayed op still sends one at a time (en_udp.c, dg_held). */

static void build_allreduce_direct(bld_t *b)
{
    const int n = b->n, r = b->r;
    const double div = divisor(b);
    /* Out of place, the pushes read the input and only this rank's own
     * block is copied (chunk by chunk) before its pushes are reduced into
     * it: nothing waits for a copy of the whole input (16 MiB: 7 ms before
     * the first push left). A pull receive writes a block no step reads, and
     * names the input as its fallback (src): a bounded-loss transport keeps
     * the rank's own value there for a segment that never came. In place,
     * the pushes read the blocks the pulls overwrite: a pull receive waits
     * for the push of its block. */
    const bool oop = b->in == SC_BUF_SEND;
    /* Every block in K chunks: the pull of a chunk starts once its pushes
     * are in, while later chunks are still pushed (a pipeline, as the ring's
     * chunks are); each destination gets its chunks in order, SC_DIRECT_WINDOW
     * of them at once. */
    uint32_t K = chunks_for((b->len + (uint64_t)n - 1) / (uint64_t)n, b->c->chunk_elems);
    if (K > 64) K = 64;
    uint32_t *sv = coh_malloc(sizeof(uint32_t) * (size_t)n * K); /* [block][chunk]: its push */
    uint32_t *rv = coh_malloc(sizeof(uint32_t) * (size_t)n);
    if (!sv || !rv) {
        coh_free(sv);
        coh_free(rv);
        b->err = COH_ENOMEM;
        return;
    }
    uint64_t mo = b->lo + sc_split(b->len, (uint64_t)n, (uint64_t)r);
    uint64_t mc = b->lo + sc_split(b->len, (uint64_t)n, (uint64_t)r + 1) - mo;
    for (uint32_t k = 0; k < K; k++) {
        uint32_t tpush = 1 + 2 * k, tpull = 2 + 2 * k;
        uint64_t ko = mo + sc_split(mc, K, k), kc = mo + sc_split(mc, K, k + 1) - ko;
        uint32_t nrv = 0, cp = NONE;
        if (oop && kc)
            cp = add(b, SC_COPY, SC_BUF_SEND, SC_BUF_RECV, LOCAL, 0, ko, ko, kc, 0, NODEPS);
        for (int d = 1; d < n; d++) {
            int p = (r + d) % n;
            uint64_t o = b->lo + sc_split(b->len, (uint64_t)n, (uint64_t)p);
            uint64_t c = b->lo + sc_split(b->len, (uint64_t)n, (uint64_t)p + 1) - o;
            uint64_t co = o + sc_split(c, K, k), cc = o + sc_split(c, K, k + 1) - co;
            uint32_t prev = k >= SC_DIRECT_WINDOW ? sv[(size_t)p * K + k - SC_DIRECT_WINDOW] : NONE;
            uint32_t i =
                cc ? add(b, SC_SEND, b->in, SC_BUF_RECV, r + d, tpush, co, co, cc, 0, DEPS(prev))
                   : prev;
            if (cc && i != NONE) b->plan->steps[i].stage = SC_STAGE_PUSH;
            sv[(size_t)p * K + k] = i;
            if (!kc) continue;
            i = add(b, SC_RECV_REDUCE, SC_BUF_RECV, SC_BUF_RECV, r - d, tpush, ko, ko, kc, 0,
                    DEPS(cp));
            if (i != NONE) b->plan->steps[rv[nrv++] = i].stage = SC_STAGE_PUSH;
        }
        /* The pulls of this chunk go after its pushes are reduced (and
         * divided); a pull received overwrites a chunk this rank pushed. */
        const uint32_t *after = rv;
        uint32_t nafter = nrv, dv = NONE;
        if (kc && div > 0) {
            dv = add_after(b,
                           (sc_step_t){.kind = SC_DIV,
                                       .src = SC_BUF_RECV,
                                       .dst = SC_BUF_RECV,
                                       .peer = -1,
                                       .stage = SC_STAGE_PUSH,
                                       .src_off = ko,
                                       .dst_off = ko,
                                       .count = kc,
                                       .factor = div},
                           rv, nrv);
            after = &dv;
            nafter = 1;
        }
        for (int d = 1; d < n; d++) {
            int q = (r - d + n) % n;
            uint64_t o = b->lo + sc_split(b->len, (uint64_t)n, (uint64_t)q);
            uint64_t c = b->lo + sc_split(b->len, (uint64_t)n, (uint64_t)q + 1) - o;
            uint64_t co = o + sc_split(c, K, k), cc = o + sc_split(c, K, k + 1) - co;
            if (kc)
                add_after(b,
                          (sc_step_t){.kind = SC_SEND,
                                      .src = SC_BUF_RECV,
                                      .dst = SC_BUF_RECV,
                                      .peer = pos_rank(b, r + d),
                                      .tag = tpull,
                                      .stage = SC_STAGE_PULL,
                                      .src_off = ko,
                                      .dst_off = ko,
                                      .count = kc},
                          after, nafter);
            if (cc) {
                uint32_t i = add(b, SC_RECV, b->in, SC_BUF_RECV, r - d, tpull, co, co, cc, 0,
                                 DEPS(oop ? NONE : sv[(size_t)q * K + k]));
                if (i != NONE) b->plan->steps[i].stage = SC_STAGE_PULL;
            }
        }
    }
    coh_free(sv);
    coh_free(rv);
}

static int ilog2_floor(int n)
{
    int l = 0;
    while ((1 << (l + 1)) <= n) l++;
    return l;
}

/* Recursive doubling with the usual fold for non-powers of two: the first
 * 2*rem ranks pair up, odd ones carry the pair through the doubling rounds
 * and hand the result back. Each round receives into its own scratch slice so
 * every receive can be posted at once; the reduce waits for the round's send
 * (it overwrites what is being sent). Every rank ends with the same bits:
 * a op b == b op a for the ops and dtypes supported. */
static void build_allreduce_rd(bld_t *b)
{
    const int n = b->n, r = b->r;
    const uint64_t lo = b->lo, len = b->len;
    const int P = 1 << ilog2_floor(n), rem = n - P, rounds = ilog2_floor(n);
    b->plan->scratch_count = len * (uint64_t)(rounds + 1);
    uint32_t last = add(b, SC_COPY, b->in, SC_BUF_RECV, LOCAL, 0, lo, lo, len, 0, NODEPS);
    int newr;
    uint32_t fold_send = NONE;
    if (r < 2 * rem) {
        if (r % 2 == 0) {
            fold_send =
                add(b, SC_SEND, SC_BUF_RECV, SC_BUF_RECV, r + 1, 0, lo, lo, len, 0, DEPS(last));
            newr = -1;
        } else {
            uint32_t rv =
                add(b, SC_RECV, SC_BUF_SCRATCH, SC_BUF_SCRATCH, r - 1, 0, 0, 0, len, 0, NODEPS);
            last = add(b, SC_REDUCE, SC_BUF_SCRATCH, SC_BUF_RECV, LOCAL, 0, 0, lo, len, 0,
                       DEPS(rv, last));
            newr = r / 2;
        }
    } else {
        newr = r - rem;
    }
    if (newr >= 0) {
        for (int round = 0, mask = 1; mask < P; round++, mask <<= 1) {
            int pn = newr ^ mask;
            int partner = pn < rem ? pn * 2 + 1 : pn + rem;
            uint32_t tag = 1 + (uint32_t)round;
            uint64_t scr = len * (uint64_t)(round + 1);
            uint32_t sd =
                add(b, SC_SEND, SC_BUF_RECV, SC_BUF_RECV, partner, tag, lo, lo, len, 0, DEPS(last));
            uint32_t rv = add(b, SC_RECV, SC_BUF_SCRATCH, SC_BUF_SCRATCH, partner, tag, scr, scr,
                              len, 0, NODEPS);
            last = add(b, SC_REDUCE, SC_BUF_SCRATCH, SC_BUF_RECV, LOCAL, 0, scr, lo, len, 0,
                       DEPS(sd, rv, last));
        }
        if (divisor(b) > 0)
            last = add(b, SC_DIV, SC_BUF_RECV, SC_BUF_RECV, LOCAL, 0, lo, lo, len, divisor(b),
                       DEPS(last));
        if (r < 2 * rem)
            add(b, SC_SEND, SC_BUF_RECV, SC_BUF_RECV, r - 1, 0x7fffffffu, lo, lo, len, 0,
                DEPS(last));
    } else {
        /* The result overwrites what this rank sent: wait for that send. */
        add(b, SC_RECV, SC_BUF_RECV, SC_BUF_RECV, r + 1, 0x7fffffffu, lo, lo, len, 0,
            DEPS(fold_send));
    }
}

/* A star: every rank sends its input to position 0, which reduces them in
 * position order and sends the result back (Open MPI's basic linear
 * allreduce). 2(n-1) messages where recursive doubling sends n log2(n), and
 * a rank other than the root sends and receives once. With more ranks than
 * cores the messages' CPU is what a small op waits for (4 ranks on 2 cores,
 * docs/perf.md). The root receives every contribution into its own scratch
 * slice, so all its receives are posted at once and the sum's order does not
 * depend on arrival; every rank ends with the root's bits. */
static void build_allreduce_star(bld_t *b)
{
    const int n = b->n, r = b->r;
    const uint64_t lo = b->lo, len = b->len;
    if (r != 0) {
        uint32_t sd = add(b, SC_SEND, b->in, SC_BUF_RECV, 0, 1, lo, lo, len, 0, NODEPS);
        /* In place, the result overwrites what this rank sent. */
        add(b, SC_RECV, SC_BUF_RECV, SC_BUF_RECV, 0, 2, lo, lo, len, 0, &sd,
            b->in == SC_BUF_RECV ? 1 : 0);
        return;
    }
    b->plan->scratch_count = len * (uint64_t)(n - 1);
    uint32_t last = b->in == SC_BUF_RECV
                        ? NONE
                        : add(b, SC_COPY, b->in, SC_BUF_RECV, LOCAL, 0, lo, lo, len, 0, NODEPS);
    for (int p = 1; p < n; p++) {
        uint64_t scr = len * (uint64_t)(p - 1);
        uint32_t rv =
            add(b, SC_RECV, SC_BUF_SCRATCH, SC_BUF_SCRATCH, p, 1, scr, scr, len, 0, NODEPS);
        const uint32_t dep[2] = {rv, last}; /* the sum so far, if any, first */
        last = add(b, SC_REDUCE, SC_BUF_SCRATCH, SC_BUF_RECV, LOCAL, 0, scr, lo, len, 0, dep,
                   last == NONE ? 1 : 2);
    }
    if (divisor(b) > 0)
        last =
            add(b, SC_DIV, SC_BUF_RECV, SC_BUF_RECV, LOCAL, 0, lo, lo, len, divisor(b), DEPS(last));
    for (int p = 1; p < n; p++)
        add(b, SC_SEND, SC_BUF_RECV, SC_BUF_RECV, p, 2, lo, lo, len, 0, DEPS(last));
}

/* ---- broadcast ---- */

/*
 * Halving-doubling (Rabenseifner's allreduce, Open MPI's choice from a few
 * hundred KiB): a reduce-scatter by recursive halving, then an allgather by
 * recursive doubling. Per rank the ring's bytes, 2(P-1)/P * S, in 2 log2(P)
 * steps instead of 2(n-1), each an exchange with one partner. With more
 * ranks than cores every step waits for a peer to be scheduled, so the
 * steps are what costs (4 ranks on 2 cores, 1 MiB: 1.1-1.5 ms against the
 * ring's 1.7-2.9). Not a power of two: the first 2*rem ranks pair up as in
 * build_allreduce_rd (odd ones carry the pair: the whole buffer once more
 * each way).
 *
 * The slice is cut into P blocks of k chunks (units); every transfer is a
 * unit, so a unit reduced at one step is sent on at the next while later
 * units still arrive (the ring's pipelining). prev[u]: the last step that
 * wrote unit u (into RECV); rd[u]: the last send that read it, which a
 * receive overwriting u must follow.
 */
/* Unit u (block u / k, chunk u % k) of a slice cut into P blocks. */
static void hd_unit(const bld_t *b, int P, uint32_t u, uint64_t *off, uint64_t *cnt)
{
    chunk_range(b, (uint64_t)P, u / b->k, u % b->k, off, cnt);
    *off += b->lo;
}

/* The blocks of the aligned region [base, base + m) in the order virtual
 * rank w passes them on while halving: the half it gives away next first,
 * then the same for the half it keeps, its own block last. */
static void hd_order(int w, int base, int m, int *out)
{
    int n = 0;
    for (; m > 1; m /= 2) {
        int h = m / 2, give = (w & h) ? base : base + h;
        for (int i = 0; i < h; i++) out[n++] = give + i;
        if (w & h) base += h;
    }
    out[n] = base;
}

static void build_allreduce_hd(bld_t *b)
{
    const int n = b->n, r = b->r;
    const int L = ilog2_floor(n), P = 1 << L, rem = n - P;
    const double div = divisor(b);
    b->k = chunks_for((b->len + (uint64_t)P - 1) / (uint64_t)P, b->c->chunk_elems);
    /* tag = ((phase * (L+1) + step) * P + block) * k + chunk, 4 phases,
     * below the fence's and the fold's tags */
    uint64_t kmax = (1u << 30) / (4u * (uint64_t)(L + 1) * (uint64_t)P);
    if (b->k > kmax) b->k = (uint32_t)(kmax ? kmax : 1);
    const uint32_t k = b->k, nu = (uint32_t)P * k;
    uint32_t *prev = coh_malloc(sizeof(uint32_t) * nu * 2);
    int *order = coh_malloc(sizeof(int) * (size_t)P);
    if (!prev || !order) {
        coh_free(prev);
        coh_free(order);
        b->err = COH_ENOMEM;
        return;
    }
    uint32_t *rd = prev + nu;
    for (uint32_t u = 0; u < 2 * nu; u++) prev[u] = NONE;
#define HD_TAG(ph, st, u)                                                                          \
    ((((uint32_t)(ph) * (uint32_t)(L + 1) + (uint32_t)(st)) * (uint32_t)P) * k + (u))
        /* a virtual rank (0..P-1) to its position */
#define HD_POS(v) ((v) < rem ? 2 * (v) + 1 : (v) + rem)
    int v = r < 2 * rem ? (r % 2 ? r / 2 : -1) : r - rem;
    uint64_t off, cnt;
    if (r < 2 * rem) /* fold: the even rank of a pair hands its input to the odd one */
        for (uint32_t ch = 0; ch < k; ch++)
            for (int blk = 0; blk < P; blk++) {
                uint32_t u = (uint32_t)blk * k + ch;
                hd_unit(b, P, u, &off, &cnt);
                if (!cnt) continue;
                if (v < 0)
                    rd[u] = add(b, SC_SEND, b->in, SC_BUF_RECV, r + 1, HD_TAG(0, 0, u), off, off,
                                cnt, 0, NODEPS);
                else
                    prev[u] = add(b, SC_RECV_REDUCE, b->in, SC_BUF_RECV, r - 1, HD_TAG(0, 0, u),
                                  off, off, cnt, 0, NODEPS);
            }
    if (v >= 0) {
        /* Recursive halving: keep the half of the region holding block v,
         * send the other half to the partner, reduce its half of ours. The
         * partner gets the chunks of its next step's half first (and the
         * first chunk of every block before the second of any), so it can
         * pass them on while the rest still comes. */
        for (int st = 0; st < L; st++) {
            int mask = P >> (st + 1), base = v & ~(2 * mask - 1);
            int keep = (v & mask) ? base + mask : base, give = (v & mask) ? base : base + mask;
            int w = v ^ mask, peer = HD_POS(w);
            hd_order(w, give, mask, order);
            for (uint32_t ch = 0; ch < k; ch++)
                for (int i = 0; i < mask; i++) {
                    uint32_t u = (uint32_t)order[i] * k + ch;
                    hd_unit(b, P, u, &off, &cnt);
                    if (cnt)
                        rd[u] = add(b, SC_SEND, prev[u] == NONE ? b->in : SC_BUF_RECV, SC_BUF_RECV,
                                    peer, HD_TAG(1, st, u), off, off, cnt, 0, DEPS(prev[u]));
                }
            for (uint32_t u = (uint32_t)keep * k; u < (uint32_t)(keep + mask) * k; u++) {
                hd_unit(b, P, u, &off, &cnt);
                if (cnt)
                    prev[u] =
                        add(b, SC_RECV_REDUCE, prev[u] == NONE ? b->in : SC_BUF_RECV, SC_BUF_RECV,
                            peer, HD_TAG(1, st, u), off, off, cnt, 0, DEPS(prev[u]));
            }
        }
        for (uint32_t u = (uint32_t)v * k; u < (uint32_t)(v + 1) * k; u++) {
            hd_unit(b, P, u, &off, &cnt);
            if (cnt && div > 0)
                prev[u] = add(b, SC_DIV, SC_BUF_RECV, SC_BUF_RECV, LOCAL, 0, off, off, cnt, div,
                              DEPS(prev[u]));
        }
        /* Recursive doubling: exchange the regions reduced so far, chunk by
         * chunk; what comes back is the half given away at the same
         * distance. */
        for (int st = 0; st < L; st++) {
            int mask = 1 << st, mine = v & ~(mask - 1), theirs = (v ^ mask) & ~(mask - 1);
            int peer = HD_POS(v ^ mask);
            for (uint32_t ch = 0; ch < k; ch++)
                for (int i = 0; i < mask; i++) {
                    uint32_t u = (uint32_t)(mine + i) * k + ch;
                    hd_unit(b, P, u, &off, &cnt);
                    if (cnt)
                        rd[u] = add(b, SC_SEND, SC_BUF_RECV, SC_BUF_RECV, peer, HD_TAG(2, st, u),
                                    off, off, cnt, 0, DEPS(prev[u]));
                }
            for (uint32_t u = (uint32_t)theirs * k; u < (uint32_t)(theirs + mask) * k; u++) {
                hd_unit(b, P, u, &off, &cnt);
                if (cnt)
                    prev[u] = add(b, SC_RECV, SC_BUF_RECV, SC_BUF_RECV, peer, HD_TAG(2, st, u), off,
                                  off, cnt, 0, DEPS(rd[u]));
            }
        }
    }
    if (r < 2 * rem) /* unfold: the odd rank hands the result back */
        for (uint32_t ch = 0; ch < k; ch++)
            for (int blk = 0; blk < P; blk++) {
                uint32_t u = (uint32_t)blk * k + ch;
                hd_unit(b, P, u, &off, &cnt);
                if (!cnt) continue;
                if (v >= 0)
                    add(b, SC_SEND, SC_BUF_RECV, SC_BUF_RECV, r - 1, HD_TAG(3, 0, u), off, off, cnt,
                        0, DEPS(prev[u]));
                else
                    add(b, SC_RECV, SC_BUF_RECV, SC_BUF_RECV, r + 1, HD_TAG(3, 0, u), off, off, cnt,
                        0, DEPS(rd[u]));
            }
#undef HD_TAG
#undef HD_POS
    coh_free(prev);
    coh_free(order);
}

static void build_bcast_tree(bld_t *b)
{
    const int n = b->n, v = (b->r - b->c->root + n) % n, root = b->c->root;
    uint32_t got = NONE;
    int mask = 1;
    while (mask < n) {
        if (v & mask) {
            got = add(b, SC_RECV, SC_BUF_RECV, SC_BUF_RECV, root + v - mask, 0, b->lo, b->lo,
                      b->len, 0, NODEPS);
            break;
        }
        mask <<= 1;
    }
    for (mask >>= 1; mask > 0; mask >>= 1)
        if (v + mask < n)
            add(b, SC_SEND, SC_BUF_RECV, SC_BUF_RECV, root + v + mask, 0, b->lo, b->lo, b->len, 0,
                DEPS(got));
}

/* A pipelined chain from the root: each link carries the buffer once, so the
 * time is S/B plus (n-2) chunk times, better than scatter + allgather. */
static void build_bcast_chain(bld_t *b)
{
    const int n = b->n, v = (b->r - b->c->root + n) % n, root = b->c->root;
    b->k = chunks_for(b->len, b->c->chunk_elems);
    for (uint32_t k = 0; k < b->k; k++) {
        uint64_t o, c;
        chunk_range(b, 1, 0, k, &o, &c);
        if (!c) continue;
        uint32_t got = NONE;
        if (v > 0)
            got = add(b, SC_RECV, SC_BUF_RECV, SC_BUF_RECV, root + v - 1, k, b->lo + o, b->lo + o,
                      c, 0, NODEPS);
        if (v < n - 1)
            add(b, SC_SEND, SC_BUF_RECV, SC_BUF_RECV, root + v + 1, k, b->lo + o, b->lo + o, c, 0,
                DEPS(got));
    }
}

/* ---- allgather: block of ring position p sits at order[p] * count (a
 * subset of a world-sized buffer), or at p * count (pos_blocks: a
 * communicator's own layout) ---- */

static uint64_t block(const bld_t *b, int pos)
{
    if (b->c->pos_blocks) return (uint64_t)(((pos % b->n) + b->n) % b->n) * b->c->count;
    return (uint64_t)pos_rank(b, pos) * b->c->count;
}

static void build_allgather_ring(bld_t *b)
{
    const int n = b->n, r = b->r;
    b->k = chunks_for(b->len, b->c->chunk_elems);
    add(b, SC_COPY, SC_BUF_SEND, SC_BUF_RECV, LOCAL, 0, b->lo, block(b, r) + b->lo, b->len, 0,
        NODEPS);
    uint32_t *prev = coh_malloc(sizeof(uint32_t) * b->k);
    if (!prev) {
        b->err = COH_ENOMEM;
        return;
    }
    for (uint32_t k = 0; k < b->k; k++) prev[k] = NONE;
    for (int s = 0; s < n - 1; s++) {
        for (uint32_t k = 0; k < b->k; k++) {
            uint64_t o, c;
            chunk_range(b, 1, 0, k, &o, &c);
            if (!c) continue;
            uint32_t tag = tag_of(b, 0, (uint32_t)s, k);
            if (s == 0)
                add(b, SC_SEND, SC_BUF_SEND, SC_BUF_RECV, r + 1, tag, b->lo + o, 0, c, 0, NODEPS);
            else
                add(b, SC_SEND, SC_BUF_RECV, SC_BUF_RECV, r + 1, tag, block(b, r - s) + b->lo + o,
                    0, c, 0, DEPS(prev[k]));
            prev[k] = add(b, SC_RECV, SC_BUF_RECV, SC_BUF_RECV, r - 1, tag, 0,
                          block(b, r - s - 1) + b->lo + o, c, 0, NODEPS);
        }
    }
    coh_free(prev);
}

static void build_allgather_direct(bld_t *b)
{
    const int n = b->n, r = b->r;
    add(b, SC_COPY, SC_BUF_SEND, SC_BUF_RECV, LOCAL, 0, b->lo, block(b, r) + b->lo, b->len, 0,
        NODEPS);
    for (int d = 1; d < n; d++) {
        add(b, SC_SEND, SC_BUF_SEND, SC_BUF_RECV, r + d, 0, b->lo, 0, b->len, 0, NODEPS);
        add(b, SC_RECV, SC_BUF_RECV, SC_BUF_RECV, r - d, 0, 0, block(b, r - d) + b->lo, b->len, 0,
            NODEPS);
    }
}

/* ---- reduce-scatter: input block of position p at block(p) ---- */

static void build_rs_ring(bld_t *b)
{
    const int n = b->n, r = b->r;
    const bool inplace = b->c->rs_in_place;
    const uint64_t lo = b->lo, len = b->len;
    /* The result lives in recv[lo..] (out of place) or in recv's own block. */
    const uint64_t out = inplace ? block(b, r) + lo : lo;
    const int in = inplace ? SC_BUF_RECV : SC_BUF_SEND;
    b->k = chunks_for(len, b->c->chunk_elems);
    if (n == 1) {
        if (!inplace)
            add(b, SC_COPY, SC_BUF_SEND, SC_BUF_RECV, LOCAL, 0, block(b, r) + lo, out, len, 0,
                NODEPS);
        return;
    }
    /* Out of place, the partial sum made at step s lives in scratch slot s
     * until step s+1 sends it. One slot per step (not two reused ones): a
     * receive that had to wait for a send to drain a slot could wait on a
     * full socket around the whole ring. */
    if (!inplace && n > 2) b->plan->scratch_count = (uint64_t)(n - 2) * len;
    uint32_t *prev = coh_malloc(sizeof(uint32_t) * b->k);
    if (!prev) {
        b->err = COH_ENOMEM;
        return;
    }
    for (uint32_t k = 0; k < b->k; k++) prev[k] = NONE;
    /* Step s: send block r-s-1, receive and reduce block r-s-2; the last step
     * (s = n-2) reduces this rank's own block into the output. */
    for (int s = 0; s < n - 1; s++) {
        for (uint32_t k = 0; k < b->k; k++) {
            uint64_t o, c;
            chunk_range(b, 1, 0, k, &o, &c);
            if (!c) continue;
            uint32_t tag = tag_of(b, 0, (uint32_t)s, k);
            int sblk = r - s - 1, rblk = r - s - 2;
            if (s == 0 || inplace)
                add(b, SC_SEND, in, in, r + 1, tag, block(b, sblk) + lo + o, 0, c, 0,
                    DEPS(prev[k]));
            else
                add(b, SC_SEND, SC_BUF_SCRATCH, SC_BUF_SCRATCH, r + 1, tag,
                    (uint64_t)(s - 1) * len + o, 0, c, 0, DEPS(prev[k]));
            uint64_t dst;
            int dbuf;
            if (s == n - 2) {
                dst = out + o;
                dbuf = SC_BUF_RECV;
            } else if (inplace) {
                dst = block(b, rblk) + lo + o;
                dbuf = SC_BUF_RECV;
            } else {
                dst = (uint64_t)s * len + o;
                dbuf = SC_BUF_SCRATCH;
            }
            prev[k] = add(b, SC_RECV_REDUCE, in, dbuf, r - 1, tag, block(b, rblk) + lo + o, dst, c,
                          0, NODEPS);
        }
    }
    if (b->c->avg)
        for (uint32_t k = 0; k < b->k; k++) {
            uint64_t o, c;
            chunk_range(b, 1, 0, k, &o, &c);
            if (c)
                add(b, SC_DIV, SC_BUF_RECV, SC_BUF_RECV, LOCAL, 0, out + o, out + o, c, (double)n,
                    DEPS(prev[k]));
        }
    coh_free(prev);
}

static void build_rs_direct(bld_t *b)
{
    const int n = b->n, r = b->r;
    const bool inplace = b->c->rs_in_place;
    const uint64_t lo = b->lo, len = b->len;
    const uint64_t out = inplace ? block(b, r) + lo : lo;
    const int in = inplace ? SC_BUF_RECV : SC_BUF_SEND;
    uint32_t cp = NONE;
    if (!inplace)
        cp = add(b, SC_COPY, SC_BUF_SEND, SC_BUF_RECV, LOCAL, 0, block(b, r) + lo, out, len, 0,
                 NODEPS);
    uint32_t *rv = coh_malloc(sizeof(uint32_t) * (size_t)n);
    if (!rv) {
        b->err = COH_ENOMEM;
        return;
    }
    for (int d = 1; d < n; d++) {
        add(b, SC_SEND, in, in, r + d, 0, block(b, r + d) + lo, 0, len, 0, NODEPS);
        rv[d - 1] =
            add(b, SC_RECV_REDUCE, SC_BUF_RECV, SC_BUF_RECV, r - d, 0, out, out, len, 0, DEPS(cp));
    }
    if (b->c->avg) {
        sc_step_t s = {.kind = SC_DIV,
                       .src = SC_BUF_RECV,
                       .dst = SC_BUF_RECV,
                       .peer = -1,
                       .src_off = out,
                       .dst_off = out,
                       .count = len,
                       .factor = (double)n};
        if (!b->err && sc_plan_add(b->plan, &s, rv, (uint32_t)(n - 1)) < 0) b->err = COH_ENOMEM;
    }
    coh_free(rv);
}

/*
 * Hierarchical allreduce (SC_ALGO_HIER): with H hosts of L members each, the
 * slice is cut into L shards.
 *   1. inside each host, member j receives shard j from the other members and
 *      reduces it (a direct reduce-scatter: shared memory carries it);
 *   2. the j-th members of the hosts run a ring allreduce of shard j between
 *      the hosts (the network carries 1/L of the data per member, and every
 *      member of a host uses the network at once);
 *   3. inside each host, every member sends its shard to the others.
 * Each phase waits for the one before (no pipelining across phases yet).
 * Tags: the ring's between hosts, HIER_TAG and HIER_TAG + 1 inside a host
 * (other peers: no clash).
 */
#define HIER_TAG 0x50000000u

/* Members grouped by host, hosts in the order their first member appears:
 * pos[h * L + j] is the position of host h's j-th member. */
static bool hier_groups(const sc_coll_t *c, int *H, int *L, int *pos)
{
    const int n = c->nranks;
    if (!c->host || n < 4) return false;
    int nh = 0, per = 0;
    int *first = coh_malloc(sizeof(int) * (size_t)n), *cnt = coh_calloc((size_t)n, sizeof(int));
    int *hof = coh_malloc(sizeof(int) * (size_t)n);
    bool ok = first && cnt && hof;
    for (int p = 0; ok && p < n; p++) {
        int hv = c->host[c->order ? c->order[p] : p], h = 0;
        while (h < nh && c->host[c->order ? c->order[first[h]] : first[h]] != hv) h++;
        if (h == nh) first[nh++] = p;
        hof[p] = h;
        cnt[h]++;
    }
    if (ok) {
        per = nh ? cnt[0] : 0;
        for (int h = 1; h < nh; h++) ok = ok && cnt[h] == per;
        ok = ok && nh >= 2 && per >= 2;
    }
    if (ok && pos) {
        int *fill = cnt; /* reuse: members placed so far per host */
        memset(fill, 0, sizeof(int) * (size_t)n);
        for (int p = 0; p < n; p++) pos[hof[p] * per + fill[hof[p]]++] = p;
    }
    coh_free(first);
    coh_free(cnt);
    coh_free(hof);
    if (ok) {
        *H = nh;
        *L = per;
    }
    return ok;
}

bool sc_plan_hier_shape(const sc_coll_t *c, int *hosts, int *per_host)
{
    int H = 0, L = 0;
    if (!c || (c->kind == SC_ALLREDUCE && c->scale != 0) || !hier_groups(c, &H, &L, NULL))
        return false;
    if (hosts) *hosts = H;
    if (per_host) *per_host = L;
    return true;
}

/* A join: a local step of no elements (at off) after every step in deps. */
static uint32_t hier_join(bld_t *b, uint64_t off, const uint32_t *deps, uint32_t nd)
{
    sc_step_t s = {.kind = SC_COPY,
                   .src = SC_BUF_RECV,
                   .dst = SC_BUF_RECV,
                   .peer = -1,
                   .src_off = off,
                   .dst_off = off};
    int64_t i = b->err ? -1 : sc_plan_add(b->plan, &s, deps, nd);
    if (i < 0 && !b->err) b->err = COH_ENOMEM;
    return i < 0 ? NONE : (uint32_t)i;
}

static void build_allreduce_hier(bld_t *b)
{
    const sc_coll_t *c = b->c;
    const int n = b->n;
    int H = 0, L = 0;
    int *pos = coh_malloc(sizeof(int) * (size_t)n), *order2 = coh_malloc(sizeof(int) * (size_t)n);
    uint32_t *p1 = coh_malloc(sizeof(uint32_t) * (size_t)n);
    if (!pos || !order2 || !p1 || !hier_groups(c, &H, &L, pos)) {
        coh_free(pos);
        coh_free(order2);
        coh_free(p1);
        if (!b->err && (!pos || !order2 || !p1)) b->err = COH_ENOMEM;
        if (!b->err) build_allreduce_ring(b);
        return;
    }
    int h = 0, l = 0; /* this rank's host and index in it */
    for (int i = 0; i < n; i++)
        if (pos[i] == b->r) {
            h = i / L;
            l = i % L;
        }
    const int *mine = pos + (size_t)h * L; /* this host's members, by index */
    const bool inplace = b->in == SC_BUF_RECV;
    uint64_t so = b->lo + sc_split(b->len, (uint64_t)L, (uint64_t)l);
    uint64_t sc = b->lo + sc_split(b->len, (uint64_t)L, (uint64_t)l + 1) - so;
    /* 1. Reduce-scatter inside the host. */
    for (int j = 0; j < L; j++) p1[j] = NONE;
    for (int j = 0; j < L; j++) {
        if (j == l) continue;
        uint64_t o = b->lo + sc_split(b->len, (uint64_t)L, (uint64_t)j);
        uint64_t cnt = b->lo + sc_split(b->len, (uint64_t)L, (uint64_t)j + 1) - o;
        if (cnt)
            p1[j] = add(b, SC_SEND, b->in, SC_BUF_RECV, mine[j], HIER_TAG, o, o, cnt, 0, NODEPS);
    }
    uint32_t n1 = 0;
    uint32_t *red = coh_malloc(sizeof(uint32_t) * (size_t)(L + 1));
    if (!red) b->err = COH_ENOMEM;
    if (sc && red) {
        uint32_t cp =
            inplace ? NONE
                    : add(b, SC_COPY, SC_BUF_SEND, SC_BUF_RECV, LOCAL, 0, so, so, sc, 0, NODEPS);
        if (cp != NONE) red[n1++] = cp;
        for (int j = 0; j < L; j++)
            if (j != l)
                red[n1++] = add(b, SC_RECV_REDUCE, SC_BUF_RECV, SC_BUF_RECV, mine[j], HIER_TAG, so,
                                so, sc, 0, DEPS(cp));
    }
    /* 2. Shard l between the hosts: a ring of the l-th members, after the
     * shard is reduced here (a join: a local step of no elements). */
    uint32_t n2a = b->plan->nsteps, n2b = n2a;
    if (sc && red && !b->err) {
        uint32_t join = hier_join(b, so, red, n1);
        for (int g = 0; g < H; g++)
            order2[g] = c->order ? c->order[pos[g * L + l]] : pos[g * L + l];
        sc_coll_t c2 = *c;
        c2.order = order2;
        c2.nranks = H;
        c2.rank = h;
        c2.divide = c->divide > 0 ? c->divide : c->avg ? (double)n : 0;
        bld_t b2 = {.c = &c2,
                    .plan = b->plan,
                    .n = H,
                    .r = h,
                    .lo = so,
                    .len = sc,
                    .k = 1,
                    .root = join,
                    .in = SC_BUF_RECV};
        n2a = b->plan->nsteps;
        if (!b->err) build_allreduce_ring(&b2);
        if (b2.err) b->err = b2.err;
        n2b = b->plan->nsteps;
    }
    /* 3. Allgather inside the host: shard l once it is final here. */
    uint32_t done = NONE;
    if (sc && !b->err) {
        uint32_t nd = n2b - n2a;
        uint32_t *all = coh_malloc(sizeof(uint32_t) * (nd ? nd : 1));
        if (!all) b->err = COH_ENOMEM;
        for (uint32_t i = 0; all && i < nd; i++) all[i] = n2a + i;
        if (all) done = hier_join(b, so, all, nd);
        coh_free(all);
    }
    for (int j = 0; j < L && !b->err; j++) {
        if (j == l) continue;
        if (sc)
            add(b, SC_SEND, SC_BUF_RECV, SC_BUF_RECV, mine[j], HIER_TAG + 1, so, so, sc, 0,
                DEPS(done));
        uint64_t o = b->lo + sc_split(b->len, (uint64_t)L, (uint64_t)j);
        uint64_t cnt = b->lo + sc_split(b->len, (uint64_t)L, (uint64_t)j + 1) - o;
        /* In place, the shard our push read is overwritten: after the push. */
        if (cnt)
            add(b, SC_RECV, SC_BUF_RECV, SC_BUF_RECV, mine[j], HIER_TAG + 1, o, o, cnt, 0,
                DEPS(inplace ? p1[j] : NONE));
    }
    coh_free(red);
    coh_free(pos);
    coh_free(order2);
    coh_free(p1);
}

/* ---- the other collectives across hosts (SC_ALGO_HIER) ----
 * The same grouping: H hosts of L members, this rank member l of host h.
 * Network steps join members of different hosts with the same index, so
 * every member of a host uses the network at once; steps inside a host use
 * the HIER_TAG range. */

static bool hier_me(bld_t *b, int **pos, int *H, int *L, int *h, int *l)
{
    *pos = coh_malloc(sizeof(int) * (size_t)b->n);
    if (!*pos) {
        b->err = COH_ENOMEM;
        return false;
    }
    if (!hier_groups(b->c, H, L, *pos)) {
        coh_free(*pos);
        *pos = NULL;
        return false;
    }
    for (int i = 0; i < b->n; i++)
        if ((*pos)[i] == b->r) {
            *h = i / *L;
            *l = i % *L;
        }
    return true;
}

/* Broadcast: each chunk goes down a chain of one member per host (those with
 * the root's index in their host; the root leads its own), and each of them
 * hands it to the other members of its host as it comes: the network
 * carries the buffer once into each host. */
static void build_bcast_hier(bld_t *b, const int *pos, int H, int L, int h, int l)
{
    int hr = 0, lr = 0;
    for (int i = 0; i < H * L; i++)
        if (pos[i] == b->c->root) {
            hr = i / L;
            lr = i % L;
        }
    const int v = (h - hr + H) % H;
    b->k = chunks_for(b->len, b->c->chunk_elems);
    for (uint32_t k = 0; k < b->k; k++) {
        uint64_t o, c;
        chunk_range(b, 1, 0, k, &o, &c);
        if (!c) continue;
        uint64_t off = b->lo + o;
        if (l != lr) {
            add(b, SC_RECV, SC_BUF_RECV, SC_BUF_RECV, pos[h * L + lr], HIER_TAG + k, off, off, c, 0,
                NODEPS);
            continue;
        }
        uint32_t got = NONE;
        if (v > 0)
            got = add(b, SC_RECV, SC_BUF_RECV, SC_BUF_RECV, pos[((h - 1 + H) % H) * L + lr], k, off,
                      off, c, 0, NODEPS);
        if (v < H - 1)
            add(b, SC_SEND, SC_BUF_RECV, SC_BUF_RECV, pos[((h + 1) % H) * L + lr], k, off, off, c,
                0, DEPS(got));
        for (int j = 0; j < L; j++)
            if (j != lr)
                add(b, SC_SEND, SC_BUF_RECV, SC_BUF_RECV, pos[h * L + j], HIER_TAG + k, off, off, c,
                    0, DEPS(got));
    }
}

/* Allgather: the members with this rank's index exchange their blocks
 * between the hosts, then each hands the H blocks it has to the other
 * members of its host. Each host sends L(H-1) blocks over the network
 * (a flat ring: LH-1 through each host's boundary link, one flow). */
static void build_allgather_hier(bld_t *b, const int *pos, int H, int L, int h, int l)
{
    const uint64_t lo = b->lo, len = b->len;
    add(b, SC_COPY, SC_BUF_SEND, SC_BUF_RECV, LOCAL, 0, lo, block(b, b->r) + lo, len, 0, NODEPS);
    uint32_t *got = coh_malloc(sizeof(uint32_t) * (size_t)H);
    if (!got) {
        b->err = COH_ENOMEM;
        return;
    }
    got[h] = NONE;
    for (int d = 1; d < H; d++) {
        int g = (h - d + H) % H;
        add(b, SC_SEND, SC_BUF_SEND, SC_BUF_RECV, pos[((h + d) % H) * L + l], 0, lo, 0, len, 0,
            NODEPS);
        got[g] = add(b, SC_RECV, SC_BUF_RECV, SC_BUF_RECV, pos[g * L + l], 0, 0,
                     block(b, pos[g * L + l]) + lo, len, 0, NODEPS);
    }
    for (int j = 0; j < L; j++) {
        if (j == l) continue;
        int peer = pos[h * L + j];
        for (int g = 0; g < H; g++) {
            uint32_t tag = HIER_TAG + (uint32_t)g;
            if (g == h)
                add(b, SC_SEND, SC_BUF_SEND, SC_BUF_RECV, peer, tag, lo, 0, len, 0, NODEPS);
            else
                add(b, SC_SEND, SC_BUF_RECV, SC_BUF_RECV, peer, tag, block(b, pos[g * L + l]) + lo,
                    0, len, 0, DEPS(got[g]));
            add(b, SC_RECV, SC_BUF_RECV, SC_BUF_RECV, peer, tag, 0, block(b, pos[g * L + j]) + lo,
                len, 0, NODEPS);
        }
    }
    coh_free(got);
}

/* Reduce-scatter: inside the host, member l sums the blocks of the members
 * with index l of every host (shared memory); then those members send each
 * other the sums between the hosts, and each adds up its own block. */
static void build_rs_hier(bld_t *b, const int *pos, int H, int L, int h, int l)
{
    const bool inplace = b->c->rs_in_place;
    const uint64_t lo = b->lo, len = b->len;
    const uint64_t out = inplace ? block(b, b->r) + lo : lo;
    const int in = inplace ? SC_BUF_RECV : SC_BUF_SEND;
    /* Where the host's sum of block (g, l) builds up: the output for this
     * rank's own block; in place the input block itself; else scratch. */
    int *abuf = coh_malloc(sizeof(int) * (size_t)H);
    uint64_t *aoff = coh_malloc(sizeof(uint64_t) * (size_t)H);
    uint32_t *first = coh_malloc(sizeof(uint32_t) * (size_t)H);
    const int S = L + H; /* room per block: L - 1 + 1 reduces; the own one H - 1 more */
    uint32_t *red = coh_malloc(sizeof(uint32_t) * (size_t)(H * S));
    uint32_t *nred = coh_calloc((size_t)H, sizeof(uint32_t));
    if (!abuf || !aoff || !first || !red || !nred) {
        b->err = COH_ENOMEM;
        goto out;
    }
    if (!inplace) b->plan->scratch_count = (uint64_t)H * len;
    for (int g = 0; g < H; g++) {
        uint64_t src = block(b, pos[g * L + l]) + lo;
        first[g] = NONE;
        if (g == h) {
            abuf[g] = SC_BUF_RECV;
            aoff[g] = out;
        } else {
            abuf[g] = inplace ? SC_BUF_RECV : SC_BUF_SCRATCH;
            aoff[g] = inplace ? src : (uint64_t)g * len;
        }
        if (!inplace)
            first[g] =
                add(b, SC_COPY, SC_BUF_SEND, abuf[g], LOCAL, 0, src, aoff[g], len, 0, NODEPS);
    }
    /* 1. Inside the host. */
    for (int j = 0; j < L; j++) {
        if (j == l) continue;
        int peer = pos[h * L + j];
        for (int g = 0; g < H; g++) {
            uint32_t tag = HIER_TAG + (uint32_t)g;
            add(b, SC_SEND, in, in, peer, tag, block(b, pos[g * L + j]) + lo, 0, len, 0, NODEPS);
            red[g * S + nred[g]++] = add(b, SC_RECV_REDUCE, abuf[g], abuf[g], peer, tag, aoff[g],
                                         aoff[g], len, 0, DEPS(first[g]));
        }
    }
    /* 2. Between the hosts: each sum to its owner, once complete here. */
    for (int g = 0; g < H; g++)
        if (first[g] != NONE) red[g * S + nred[g]++] = first[g];
    for (int d = 1; d < H; d++) {
        int g = (h + d) % H;
        add(b, SC_SEND, abuf[g], abuf[g], pos[g * L + l], 0, aoff[g], 0, len, 0, red + g * S,
            nred[g]);
        red[h * S + nred[h]++] =
            add(b, SC_RECV_REDUCE, SC_BUF_RECV, SC_BUF_RECV, pos[((h - d + H) % H) * L + l], 0, out,
                out, len, 0, DEPS(first[h]));
    }
    if (b->c->avg)
        add(b, SC_DIV, SC_BUF_RECV, SC_BUF_RECV, LOCAL, 0, out, out, len, (double)b->n, red + h * S,
            nred[h]);
out:
    coh_free(abuf);
    coh_free(aoff);
    coh_free(first);
    coh_free(red);
    coh_free(nred);
}

/* Barrier: the members of a host check in with its first member (shared
 * memory), the first members run the dissemination barrier between the
 * hosts (log2 H network rounds instead of log2 LH), and release their
 * hosts. */
static void build_barrier_hier(bld_t *b, const int *pos, int H, int L, int h, int l)
{
    const int lead = pos[h * L];
    if (l != 0) {
        add(b, SC_SEND, SC_BUF_RECV, SC_BUF_RECV, lead, HIER_TAG, 0, 0, 0, 0, NODEPS);
        add(b, SC_RECV, SC_BUF_RECV, SC_BUF_RECV, lead, HIER_TAG + 1, 0, 0, 0, 0, NODEPS);
        return;
    }
    /* Every step moves nothing, so the joins are dependencies, not steps. */
    uint32_t *in = coh_malloc(sizeof(uint32_t) * (size_t)L);
    uint32_t *got = coh_malloc(sizeof(uint32_t) * 32);
    if (!in || !got) {
        b->err = COH_ENOMEM;
        coh_free(in);
        coh_free(got);
        return;
    }
    for (int j = 1; j < L; j++)
        in[j - 1] =
            add(b, SC_RECV, SC_BUF_RECV, SC_BUF_RECV, pos[h * L + j], HIER_TAG, 0, 0, 0, 0, NODEPS);
    uint32_t nd = 0;
    for (uint32_t round = 0, dist = 1; (int)dist < H; round++, dist <<= 1) {
        int to = pos[((h + (int)dist) % H) * L], from = pos[((h - (int)dist % H + H) % H) * L];
        if (round == 0)
            add(b, SC_SEND, SC_BUF_RECV, SC_BUF_RECV, to, round, 0, 0, 0, 0, in, (uint32_t)(L - 1));
        else
            add(b, SC_SEND, SC_BUF_RECV, SC_BUF_RECV, to, round, 0, 0, 0, 0, DEPS(got[nd - 1]));
        got[nd++] = add(b, SC_RECV, SC_BUF_RECV, SC_BUF_RECV, from, round, 0, 0, 0, 0, NODEPS);
    }
    for (int j = 1; j < L; j++)
        add(b, SC_SEND, SC_BUF_RECV, SC_BUF_RECV, pos[h * L + j], HIER_TAG + 1, 0, 0, 0, 0, got,
            nd);
    coh_free(in);
    coh_free(got);
}

/* ---- the cost model (COHORT_HIER=-1) ---- */

static double log2_ceil(int n)
{
    int r = 0;
    while ((1 << r) < n) r++;
    return r;
}

/* The CPU term of a small allreduce (sc_link_model_t): message ends (a send
 * or a receive) of the busiest rank and of all ranks, each costing msg_cpu
 * plus its bytes. With ranks outnumbering cores, the ends of all are what the
 * cores must get through: recursive doubling has n log2(n) messages, the star
 * 2(n-1), of which the root handles half. The op takes at least that, and at
 * least its path of latencies. 4 ranks on 2 cores over TCP, the slowest
 * call: 4 KiB 78 us against 130, 64 KiB 152 against 265 (docs/perf.md). */
static double small_cpu(const sc_coll_t *c, sc_algo algo, double s, const sc_link_model_t *m)
{
    const int n = c->nranks;
    if (m->cores <= 0 || !(m->msg_cpu > 0) || n < 2) return 0;
    double most, all;
    if (algo == SC_ALGO_STAR) {
        most = 2.0 * (n - 1);
        all = 4.0 * (n - 1);
    } else { /* recursive doubling, with the fold of build_allreduce_rd */
        const int l = ilog2_floor(n), P = 1 << l, rem = n - P;
        most = 2.0 * l + (rem ? 2 : 0);
        all = 4.0 * rem + 2.0 * P * l;
    }
    const int cores = m->cores < n ? m->cores : n;
    return (m->msg_cpu + s / m->net_bw) * fmax(most, all / cores);
}

double sc_plan_cost(const sc_coll_t *c, size_t es, const sc_link_model_t *m)
{
    const int n = c->nranks;
    const double an = m->net_lat, bn = m->net_bw, al = m->local_lat, bl = m->local_bw;
    /* s: the buffer (allreduce, broadcast) or one rank's block; ch: a chunk */
    const double s = (double)c->count * (double)es;
    const double ch = fmin(s, (double)(c->chunk_elems ? c->chunk_elems : 1) * (double)es);
    sc_algo algo = sc_plan_resolve_algo(c);
    if (algo == SC_ALGO_HIER) {
        int H = 0, L = 0;
        if (!sc_plan_hier_shape(c, &H, &L)) return -1;
        switch (c->kind) {
        case SC_ALLREDUCE: /* reduce-scatter and allgather inside, a ring of shards between */
            return 2 * (al + (L - 1) * (s / L) / bl) + 2 * (H - 1) * (an + s / L / H / bn);
        case SC_BROADCAST: /* a chain of hosts, each handing chunks on inside */
            return (H - 1) * an + al + fmax(s / bn, (L - 1) * s / bl) +
                   (H > 2 ? H - 2 : 0) * ch / bn + ch / bl;
        case SC_ALLGATHER:
        case SC_REDUCE_SCATTER: /* between hosts, inside (or inside, then between) */
            return an + (H - 1) * s / bn + al + (double)(L - 1) * H * s / bl;
        case SC_BARRIER: return 2 * al + log2_ceil(H) * an;
        default: return -1;
        }
    }
    if (n <= 1) return 0;
    switch (c->kind) {
    case SC_ALLREDUCE:
        /* Two lower bounds, the path and the CPU: the larger. */
        if (algo == SC_ALGO_RD) return fmax(log2_ceil(n) * (an + s / bn), small_cpu(c, algo, s, m));
        if (algo == SC_ALGO_STAR) /* the root's link carries every message */
            return fmax(2 * (an + (n - 1) * s / bn), small_cpu(c, algo, s, m));
        if (algo == SC_ALGO_DIRECT) return 2 * (an + (n - 1) * (s / n) / bn);
        if (algo == SC_ALGO_HD) { /* a fold for non-powers of two: the buffer each way */
            const int l = ilog2_floor(n), P = 1 << l;
            return 2 * l * an + 2 * (P - 1) * (s / P) / bn + (n > P ? 2 * (an + s / bn) : 0);
        }
        return 2 * (n - 1) * (an + s / n / bn);
    case SC_BROADCAST:
        if (algo == SC_ALGO_RD) return log2_ceil(n) * (an + s / bn);
        return (n - 1) * an + s / bn + (n - 2) * ch / bn;
    case SC_ALLGATHER:
    case SC_REDUCE_SCATTER:
        if (algo == SC_ALGO_RD) return an + (n - 1) * s / bn;
        return (n - 1) * (an + s / bn);
    case SC_BARRIER: return log2_ceil(n) * an;
    default: return -1;
    }
}

sc_algo sc_plan_resolve_algo(const sc_coll_t *c)
{
    if (c->algo != SC_ALGO_AUTO) return c->algo;
    uint64_t total = c->count;
    if (c->kind == SC_ALLGATHER || c->kind == SC_REDUCE_SCATTER) total *= (uint64_t)c->nranks;
    return total <= c->small_elems ? SC_ALGO_RD : SC_ALGO_RING;
}

int sc_plan_build(const sc_coll_t *c, sc_plan_t *plan)
{
    if (!c || !plan || c->nranks < 1 || c->nranks > 65536 || c->rank < 0 || c->rank >= c->nranks ||
        c->kind < 0 || c->kind >= SC_COLL_COUNT || c->lo > c->hi || c->hi > c->count)
        return COH_EINVAL;
    if (c->kind == SC_BROADCAST && (c->root < 0 || c->root >= c->nranks)) return COH_EINVAL;
    if (c->order)
        for (int i = 0; i < c->nranks; i++)
            if (c->order[i] < 0) return COH_EINVAL;
    bld_t b = {.c = c,
               .plan = plan,
               .n = c->nranks,
               .r = c->rank,
               .lo = c->lo,
               .len = c->hi - c->lo,
               .k = 1};
    b.root = NONE;
    b.in = SC_BUF_SEND;
    if (c->kind == SC_ALLREDUCE && c->scale != 0 && c->count > 0 && b.len > 0 && c->nranks > 1) {
        /* Weighting prologue: copy the input into the recv buffer, scale it
         * there, and run the collective in place on it. */
        uint32_t cp =
            add(&b, SC_COPY, SC_BUF_SEND, SC_BUF_RECV, LOCAL, 0, b.lo, b.lo, b.len, 0, NODEPS);
        b.root = add(&b, SC_SCALE, SC_BUF_RECV, SC_BUF_RECV, LOCAL, 0, b.lo, b.lo, b.len, c->scale,
                     DEPS(cp));
        b.in = SC_BUF_RECV;
    }
    sc_algo algo = sc_plan_resolve_algo(c);
    if (algo == SC_ALGO_STAR && c->kind != SC_ALLREDUCE) algo = SC_ALGO_RD;
    int *hpos = NULL, H = 0, L = 0, h = 0, l = 0;
    bool hier = algo == SC_ALGO_HIER && c->kind != SC_ALLREDUCE && c->nranks > 1 &&
                (c->kind == SC_BARRIER || (c->count > 0 && b.len > 0)) &&
                hier_me(&b, &hpos, &H, &L, &h, &l);
    if (b.err) return b.err;
    if (hier && c->kind == SC_BARRIER) {
        build_barrier_hier(&b, hpos, H, L, h, l);
    } else if (c->kind == SC_BARRIER || c->count == 0) {
        /* Zero elements still meet the other ranks so a count mismatch is seen. */
        build_barrier(&b);
    } else if (b.len == 0) {
        /* An empty share of a non-empty op: nothing to move. */
    } else if (c->nranks == 1) {
        if (c->kind == SC_REDUCE_SCATTER)
            build_rs_ring(&b);
        else if (c->kind == SC_ALLGATHER)
            build_allgather_direct(&b); /* one copy into order[0]'s block (a subset's member) */
        else if (c->kind != SC_BROADCAST)
            add(&b, SC_COPY, SC_BUF_SEND, SC_BUF_RECV, LOCAL, 0, b.lo, b.lo, b.len, 0, NODEPS);
    } else {
        switch (c->kind) {
        case SC_ALLREDUCE:
            if (algo == SC_ALGO_DIRECT)
                build_allreduce_direct(&b);
            else if (algo == SC_ALGO_HIER)
                build_allreduce_hier(&b);
            else if (algo == SC_ALGO_RD)
                build_allreduce_rd(&b);
            else if (algo == SC_ALGO_HD)
                build_allreduce_hd(&b);
            else if (algo == SC_ALGO_STAR)
                build_allreduce_star(&b);
            else
                build_allreduce_ring(&b);
            break;
        case SC_BROADCAST:
            if (hier)
                build_bcast_hier(&b, hpos, H, L, h, l);
            else if (algo == SC_ALGO_RD)
                build_bcast_tree(&b);
            else
                build_bcast_chain(&b);
            build_fence(&b);
            break;
        case SC_ALLGATHER:
            if (hier)
                build_allgather_hier(&b, hpos, H, L, h, l);
            else if (algo == SC_ALGO_RD)
                build_allgather_direct(&b);
            else
                build_allgather_ring(&b);
            break;
        case SC_REDUCE_SCATTER:
            if (hier)
                build_rs_hier(&b, hpos, H, L, h, l);
            else if (algo == SC_ALGO_RD)
                build_rs_direct(&b);
            else
                build_rs_ring(&b);
            break;
        default: break;
        }
    }
    coh_free(hpos);
    if (b.err) return b.err;
    return sc_plan_finish(plan);
}

const char *sc_step_kind_name(int kind)
{
    static const char *names[] = {"send", "recv", "recv_reduce", "copy", "reduce", "scale", "div"};
    return kind >= 0 && kind < (int)(sizeof(names) / sizeof(names[0])) ? names[kind] : "?";
}

const char *sc_coll_kind_name(int kind)
{
    static const char *names[] = {"allreduce", "broadcast", "allgather", "reduce_scatter",
                                  "barrier"};
    return kind >= 0 && kind < SC_COLL_COUNT ? names[kind] : "?";
}
