/*
 * sched/sc_plan.h: the plan builders, run for real by an in-memory executor.
 *
 * The executor builds every member's plan for a collective (one per rail
 * when the op is split across rails) and runs them all together, one
 * randomly chosen event at a time (seeded):
 *   - a step whose dependencies are done starts; local steps (copy, reduce,
 *     div, scale) run and finish at once, a receive is "posted", a send puts
 *     a message on the channel (rail, from, to);
 *   - a send captures its payload at a random moment after its start and
 *     no later than its completion, as a socket write reads its buffer until
 *     the write callback: a step that overwrites a buffer still being sent
 *     without waiting for the send shows up as a wrong result;
 *   - a message is delivered into the receive of its peer with the same tag
 *     once that receive is posted: the match must exist, be unique, and have
 *     the same element count; optionally channels are FIFO with head-of-line
 *     blocking (one TCP connection per peer and rail), and optionally a send
 *     completes only once delivered (a full socket);
 *   - nothing left to do while steps are unfinished is a deadlock.
 * Data are int64 and reduce with sum or max, exactly; every buffer access
 * is bounds-checked (scratch against scratch_count), the input buffer must
 * stay untouched, and elements outside the plan's slice must not change.
 * A few deliberately broken plans check that the executor notices.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cohort.h"
#include "sched/sc_plan.h"

/* The broadcast fence's tags (sc_plan.c): its steps move no data. */
#define FENCE_TAG 0x40000000u
/* A fence has log2(n) rounds; the hierarchical plans' tags inside a host
 * (0x50000000 on) are above it. */
#define IS_FENCE(tag) ((tag) >= FENCE_TAG && (tag) < FENCE_TAG + 64)

enum { OP_SUM = 0, OP_MAX = 1 };
enum { ST_WAIT = 0, ST_RUN = 1, ST_DONE = 2 };

typedef struct scen {
    sc_coll_kind kind;
    sc_algo algo;
    int n;            /* members */
    const int *order; /* NULL: identity; else comm rank of each position (may be a subset) */
    int root;         /* broadcast: position of the root */
    uint64_t count;
    uint64_t lo, hi; /* the slice when nrails == 1 */
    int nrails;      /* > 1: slices sc_split(count, nrails, k) run at once */
    uint64_t chunk;
    bool avg;
    bool in_place;    /* allreduce, allgather: the caller's in-place form */
    bool rs_in_place; /* reduce-scatter */
    int op;
    bool fifo, rendezvous;
    uint64_t seed;
    const int *host; /* host of each comm rank (SC_ALGO_HIER); NULL: none */
} scen_t;

/* Lets a test break a plan on purpose after it is built. */
typedef void (*mutate_fn)(sc_plan_t *plan, int proc, int rail, void *arg);

/* ---- the executor ---- */

typedef struct msg {
    int rail, from, to;
    uint32_t step; /* the send step in the sender's plan */
    uint32_t tag;
    uint64_t count;
    int64_t *payload;
    bool captured, delivered, in_pool;
    struct msg *next, *prev; /* in its channel, while undelivered */
    struct msg *all_next;    /* every message, for freeing */
} msg_t;

typedef struct chan {
    msg_t *head, *tail;
    bool in_pool;
} chan_t;

typedef struct rkey {
    int32_t peer;
    uint32_t tag;
    uint32_t step;
} rkey_t;

typedef struct inst {
    bool used;
    sc_plan_t plan;
    uint8_t *state;
    uint32_t *deps_left;
    rkey_t *rmap; /* receives sorted by (peer, tag) */
    uint32_t nr;
    int64_t *scratch;
    uint32_t ndone;
} inst_t;

enum { A_START, A_CAPTURE, A_SENDDONE, A_DELIVER, A_DELIVER_CH };
typedef struct action {
    int type;
    int a; /* instance or channel index */
    uint32_t step;
    msg_t *m;
} action_t;

typedef struct proc {
    bool member;
    int pos;
    int64_t *send, *recv; /* send may alias into recv */
    uint64_t nsend_el, nrecv_el;
    int64_t *send_init, *recv_init; /* copies for the checks */
    bool send_alias;
} proc_t;

typedef struct ex {
    const scen_t *s;
    int world; /* comm ranks 0 .. world-1; members are order[] */
    int nrails;
    proc_t *procs;
    inst_t *inst; /* [rail * world + proc] */
    chan_t *ch;   /* [(rail * world + from) * world + to] */
    action_t *pool;
    size_t npool, cap;
    msg_t *msgs;
    uint64_t rng;
    char err[512];
    bool failed;
} ex_t;

static uint64_t rnd(uint64_t *s) /* splitmix64 */
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void ex_fail(ex_t *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void ex_fail(ex_t *e, const char *fmt, ...)
{
    if (e->failed) return;
    e->failed = true;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->err, sizeof(e->err), fmt, ap);
    va_end(ap);
}

static const char *kind_name(sc_coll_kind k)
{
    return sc_coll_kind_name(k);
}

static void describe(const scen_t *s, char *out, size_t cap)
{
    char ord[128] = "identity";
    if (s->order) {
        size_t l = 0;
        for (int i = 0; i < s->n && l < sizeof(ord) - 8; i++)
            l += (size_t)snprintf(ord + l, sizeof(ord) - l, "%s%d", i ? "," : "", s->order[i]);
    }
    snprintf(out, cap,
             "%s algo=%s n=%d order=[%s] root=%d count=%llu slice=[%llu,%llu) rails=%d "
             "chunk=%llu avg=%d in_place=%d rs_in_place=%d op=%s fifo=%d rendezvous=%d seed=%llu",
             kind_name(s->kind),
             s->algo == SC_ALGO_RING   ? "ring"
             : s->algo == SC_ALGO_RD   ? "rd"
             : s->algo == SC_ALGO_HIER ? "hier"
             : s->algo == SC_ALGO_HD   ? "hd"
                                       : "direct",
             s->n, ord, s->root, (unsigned long long)s->count, (unsigned long long)s->lo,
             (unsigned long long)s->hi, s->nrails, (unsigned long long)s->chunk, s->avg,
             s->in_place, s->rs_in_place, s->op == OP_SUM ? "sum" : "max", s->fifo, s->rendezvous,
             (unsigned long long)s->seed);
}

static void push(ex_t *e, action_t a)
{
    if (e->npool == e->cap) {
        e->cap = e->cap ? e->cap * 2 : 256;
        e->pool = realloc(e->pool, e->cap * sizeof(action_t));
        assert_non_null(e->pool);
    }
    e->pool[e->npool++] = a;
}

static int inst_idx(const ex_t *e, int rail, int proc)
{
    return rail * e->world + proc;
}

static int ch_idx(const ex_t *e, int rail, int from, int to)
{
    return (rail * e->world + from) * e->world + to;
}

/* The element range [off, off+count) of buffer b of (proc, instance). */
static int64_t *region(ex_t *e, int proc, int ii, int b, uint64_t off, uint64_t count,
                       const char *what, uint32_t step)
{
    proc_t *p = &e->procs[proc];
    int64_t *base;
    uint64_t size;
    switch (b) {
    case SC_BUF_SEND:
        base = p->send;
        size = p->nsend_el;
        break;
    case SC_BUF_RECV:
        base = p->recv;
        size = p->nrecv_el;
        break;
    case SC_BUF_SCRATCH:
        base = e->inst[ii].scratch;
        size = e->inst[ii].plan.scratch_count;
        break;
    default: ex_fail(e, "rank %d step %u: %s names buffer %d", proc, step, what, b); return NULL;
    }
    if (off > size || count > size - off) {
        ex_fail(e, "rank %d step %u: %s [%llu, %llu) of buffer %d is outside its %llu elements",
                proc, step, what, (unsigned long long)off, (unsigned long long)(off + count), b,
                (unsigned long long)size);
        return NULL;
    }
    return count ? base + off : NULL;
}

static int64_t apply_op(const scen_t *s, int64_t x, int64_t y)
{
    if (s->op == OP_SUM) return x + y;
    return x > y ? x : y;
}

static uint32_t lookup_recv(const inst_t *in, int32_t peer, uint32_t tag)
{
    uint32_t lo = 0, hi = in->nr;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        const rkey_t *k = &in->rmap[mid];
        if (k->peer < peer || (k->peer == peer && k->tag < tag))
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < in->nr && in->rmap[lo].peer == peer && in->rmap[lo].tag == tag)
        return in->rmap[lo].step;
    return UINT32_MAX;
}

static int rkey_cmp(const void *a, const void *b)
{
    const rkey_t *x = a, *y = b;
    if (x->peer != y->peer) return x->peer < y->peer ? -1 : 1;
    if (x->tag != y->tag) return x->tag < y->tag ? -1 : 1;
    return 0;
}

static void step_done(ex_t *e, int ii, uint32_t i)
{
    inst_t *in = &e->inst[ii];
    in->state[i] = ST_DONE;
    in->ndone++;
    const sc_plan_t *p = &in->plan;
    for (uint32_t d = p->rdep_off[i]; d < p->rdep_off[i + 1]; d++) {
        uint32_t j = p->rdeps[d];
        if (in->deps_left[j] == 0) {
            ex_fail(e, "instance %d: step %u released more often than it has dependencies", ii, j);
            return;
        }
        if (--in->deps_left[j] == 0) push(e, (action_t){.type = A_START, .a = ii, .step = j});
    }
}

/* FIFO: queue a delivery when the channel's head can go. */
static void ch_check(ex_t *e, int c)
{
    chan_t *ch = &e->ch[c];
    msg_t *m = ch->head;
    if (!m || ch->in_pool || !m->captured) return;
    const inst_t *rin = &e->inst[inst_idx(e, m->rail, m->to)];
    uint32_t j = lookup_recv(rin, m->from, m->tag);
    if (j == UINT32_MAX || rin->state[j] != ST_RUN) return;
    ch->in_pool = true;
    push(e, (action_t){.type = A_DELIVER_CH, .a = c});
}

/* Non-FIFO: queue the delivery of m when its receive is posted. */
static void msg_check(ex_t *e, msg_t *m)
{
    if (m->in_pool || !m->captured || m->delivered) return;
    const inst_t *rin = &e->inst[inst_idx(e, m->rail, m->to)];
    uint32_t j = lookup_recv(rin, m->from, m->tag);
    if (j == UINT32_MAX || rin->state[j] != ST_RUN) return;
    m->in_pool = true;
    push(e, (action_t){.type = A_DELIVER, .m = m});
}

static void start_step(ex_t *e, int ii, uint32_t i)
{
    inst_t *in = &e->inst[ii];
    const int rail = ii / e->world, proc = ii % e->world;
    const sc_step_t *s = &in->plan.steps[i];
    if (in->state[i] != ST_WAIT) {
        ex_fail(e, "rank %d step %u started twice", proc, i);
        return;
    }
    in->state[i] = ST_RUN;
    switch (s->kind) {
    case SC_SEND: {
        int to = s->peer;
        const inst_t *rin = &e->inst[inst_idx(e, rail, to)];
        uint32_t j = lookup_recv(rin, proc, s->tag);
        if (j == UINT32_MAX) {
            ex_fail(e, "rank %d step %u sends tag %u to rank %d, which has no receive for it", proc,
                    i, s->tag, to);
            return;
        }
        if (rin->plan.steps[j].count != s->count) {
            ex_fail(e,
                    "rank %d step %u sends %llu elements (tag %u), rank %d step %u receives %llu",
                    proc, i, (unsigned long long)s->count, s->tag, to, j,
                    (unsigned long long)rin->plan.steps[j].count);
            return;
        }
        msg_t *m = calloc(1, sizeof(*m));
        assert_non_null(m);
        m->rail = rail;
        m->from = proc;
        m->to = to;
        m->step = i;
        m->tag = s->tag;
        m->count = s->count;
        m->all_next = e->msgs;
        e->msgs = m;
        chan_t *ch = &e->ch[ch_idx(e, rail, proc, to)];
        m->prev = ch->tail;
        if (ch->tail)
            ch->tail->next = m;
        else
            ch->head = m;
        ch->tail = m;
        push(e, (action_t){.type = A_CAPTURE, .m = m});
        return;
    }
    case SC_RECV:
    case SC_RECV_REDUCE: {
        int from = s->peer;
        int c = ch_idx(e, rail, from, proc);
        if (e->s->fifo) {
            ch_check(e, c);
        } else {
            for (msg_t *m = e->ch[c].head; m; m = m->next)
                if (m->tag == s->tag) msg_check(e, m);
        }
        return;
    }
    case SC_COPY: {
        int64_t *d = region(e, proc, ii, s->dst, s->dst_off, s->count, "copy dst", i);
        const int64_t *x = region(e, proc, ii, s->src, s->src_off, s->count, "copy src", i);
        if (e->failed) return;
        if (s->count && d != x) memmove(d, x, s->count * sizeof(int64_t));
        break;
    }
    case SC_REDUCE: {
        int64_t *d = region(e, proc, ii, s->dst, s->dst_off, s->count, "reduce dst", i);
        const int64_t *x = region(e, proc, ii, s->src, s->src_off, s->count, "reduce src", i);
        if (e->failed) return;
        for (uint64_t k = 0; k < s->count; k++) d[k] = apply_op(e->s, d[k], x[k]);
        break;
    }
    case SC_DIV: {
        int64_t *d = region(e, proc, ii, s->dst, s->dst_off, s->count, "div", i);
        if (e->failed) return;
        int64_t f = (int64_t)s->factor;
        if (!(s->factor >= 1) || (double)f != s->factor) {
            ex_fail(e, "rank %d step %u divides by %g", proc, i, s->factor);
            return;
        }
        for (uint64_t k = 0; k < s->count; k++) d[k] /= f; /* truncates toward zero */
        break;
    }
    case SC_SCALE: {
        int64_t *d = region(e, proc, ii, s->dst, s->dst_off, s->count, "scale", i);
        if (e->failed) return;
        for (uint64_t k = 0; k < s->count; k++) d[k] = (int64_t)((double)d[k] * s->factor);
        break;
    }
    default: ex_fail(e, "rank %d step %u has kind %d", proc, i, s->kind); return;
    }
    step_done(e, ii, i);
}

static void capture(ex_t *e, msg_t *m)
{
    int ii = inst_idx(e, m->rail, m->from);
    const sc_step_t *s = &e->inst[ii].plan.steps[m->step];
    const int64_t *x = region(e, m->from, ii, s->src, s->src_off, s->count, "send", m->step);
    if (e->failed) return;
    m->payload = malloc((m->count ? m->count : 1) * sizeof(int64_t));
    assert_non_null(m->payload);
    if (m->count) memcpy(m->payload, x, m->count * sizeof(int64_t));
    m->captured = true;
    if (!e->s->rendezvous) push(e, (action_t){.type = A_SENDDONE, .m = m});
    if (e->s->fifo)
        ch_check(e, ch_idx(e, m->rail, m->from, m->to));
    else
        msg_check(e, m);
}

static void deliver(ex_t *e, msg_t *m)
{
    int ri = inst_idx(e, m->rail, m->to);
    inst_t *rin = &e->inst[ri];
    uint32_t j = lookup_recv(rin, m->from, m->tag);
    if (j == UINT32_MAX || rin->state[j] != ST_RUN) {
        ex_fail(e, "delivery of tag %u from rank %d to rank %d: receive %s", m->tag, m->from, m->to,
                j == UINT32_MAX            ? "missing"
                : rin->state[j] == ST_DONE ? "already done"
                                           : "not posted");
        return;
    }
    const sc_step_t *s = &rin->plan.steps[j];
    if (s->count != m->count) {
        ex_fail(e, "tag %u from rank %d to rank %d: %llu elements sent, %llu expected", m->tag,
                m->from, m->to, (unsigned long long)m->count, (unsigned long long)s->count);
        return;
    }
    int64_t *d = region(e, m->to, ri, s->dst, s->dst_off, s->count, "recv dst", j);
    if (s->kind == SC_RECV) {
        if (e->failed) return;
        if (s->count) memcpy(d, m->payload, s->count * sizeof(int64_t));
    } else {
        const int64_t *x = region(e, m->to, ri, s->src, s->src_off, s->count, "recv src", j);
        if (e->failed) return;
        for (uint64_t k = 0; k < s->count; k++) d[k] = apply_op(e->s, x[k], m->payload[k]);
    }
    m->delivered = true;
    chan_t *ch = &e->ch[ch_idx(e, m->rail, m->from, m->to)];
    if (m->prev)
        m->prev->next = m->next;
    else
        ch->head = m->next;
    if (m->next)
        m->next->prev = m->prev;
    else
        ch->tail = m->prev;
    m->next = m->prev = NULL;
    step_done(e, ri, j);
    if (e->s->rendezvous) push(e, (action_t){.type = A_SENDDONE, .m = m});
}

/* Structural checks of one plan. */
static void check_plan(ex_t *e, int proc, int rail, const sc_plan_t *p, uint64_t slice_len)
{
    const scen_t *s = e->s;
    const bool barrier = s->kind == SC_BARRIER || s->count == 0;
    uint32_t nsend = 0, nrecv = 0;
    for (uint32_t i = 0; i < p->nsteps && !e->failed; i++) {
        const sc_step_t *st = &p->steps[i];
        bool net = st->kind == SC_SEND || st->kind == SC_RECV || st->kind == SC_RECV_REDUCE;
        nsend += st->kind == SC_SEND;
        nrecv += st->kind == SC_RECV || st->kind == SC_RECV_REDUCE;
        if (st->kind > SC_DIV) ex_fail(e, "rank %d step %u: kind %d", proc, i, st->kind);
        if (net && (st->peer < 0 || st->peer >= e->world || !e->procs[st->peer].member ||
                    st->peer == proc))
            ex_fail(e, "rank %d step %u (%s): peer %d is not another member", proc, i,
                    sc_step_kind_name(st->kind), st->peer);
        if (!net && st->peer != -1)
            ex_fail(e, "rank %d step %u: local step with peer %d", proc, i, st->peer);
        bool fence = s->kind == SC_BROADCAST && IS_FENCE(st->tag);
        if (barrier || fence) {
            if (st->count != 0 || !net || st->kind == SC_RECV_REDUCE)
                ex_fail(e, "rank %d step %u: barrier/fence step %s with count %llu", proc, i,
                        sc_step_kind_name(st->kind), (unsigned long long)st->count);
        } else if (st->count == 0 && st->kind == SC_COPY && st->ndeps > 0) {
            /* a join: a local step of no elements after several (hierarchical) */
        } else if (st->count == 0) {
            ex_fail(e, "rank %d step %u: %s of 0 elements in a %s plan", proc, i,
                    sc_step_kind_name(st->kind), kind_name(s->kind));
        } else if (st->count > slice_len && s->kind != SC_BARRIER) {
            ex_fail(e, "rank %d step %u moves %llu elements, more than the slice's %llu", proc, i,
                    (unsigned long long)st->count, (unsigned long long)slice_len);
        }
        if (st->dep_off + (uint64_t)st->ndeps > p->ndeps)
            ex_fail(e, "rank %d step %u: deps out of range", proc, i);
        for (uint32_t d = 0; d < st->ndeps && !e->failed; d++) {
            uint32_t dep = p->deps[st->dep_off + d];
            if (dep >= p->nsteps || dep == i)
                ex_fail(e, "rank %d step %u depends on step %u of %u", proc, i, dep, p->nsteps);
        }
    }
    if (!e->failed && (nsend != p->nsend || nrecv != p->nrecv))
        ex_fail(e, "rank %d rail %d: nsend/nrecv %u/%u, counted %u/%u", proc, rail, p->nsend,
                p->nrecv, nsend, nrecv);
    if (!e->failed && p->nsteps && p->rdep_off[p->nsteps] != p->ndeps)
        ex_fail(e, "rank %d rail %d: %u reverse edges for %u deps", proc, rail,
                p->rdep_off[p->nsteps], p->ndeps);
}

static int64_t input(int q, uint64_t j)
{
    return (int64_t)(((j * 31 + (uint64_t)q * 17) % 101) * 1000 + (uint64_t)q * 7 + 1);
}

static int64_t poison(int q, uint64_t j, int b)
{
    return -(int64_t)(1000000000 + (uint64_t)q * 1000000 + j * 4 + (uint64_t)b);
}

static void setup_buffers(ex_t *e)
{
    const scen_t *s = e->s;
    const uint64_t c = s->count, W = (uint64_t)e->world;
    for (int q = 0; q < e->world; q++) {
        proc_t *p = &e->procs[q];
        uint64_t ns = 0, nr = 0;
        switch (s->kind) {
        case SC_ALLREDUCE:
            ns = nr = c;
            p->send_alias = s->in_place;
            break;
        case SC_BROADCAST:
            ns = nr = c;
            p->send_alias = true;
            break;
        case SC_ALLGATHER:
            ns = c;
            nr = W * c;
            p->send_alias = s->in_place;
            break;
        case SC_REDUCE_SCATTER:
            ns = W * c;
            nr = s->rs_in_place ? W * c : c;
            p->send_alias = s->rs_in_place;
            break;
        default: break;
        }
        p->nsend_el = ns;
        p->nrecv_el = nr;
        p->recv = malloc((nr ? nr : 1) * sizeof(int64_t));
        p->recv_init = malloc((nr ? nr : 1) * sizeof(int64_t));
        assert_non_null(p->recv);
        assert_non_null(p->recv_init);
        for (uint64_t j = 0; j < nr; j++) p->recv[j] = poison(q, j, 1);
        if (p->send_alias) {
            /* the send buffer is a view into the receive buffer */
            uint64_t at = s->kind == SC_ALLGATHER ? (uint64_t)q * c : 0;
            p->send = p->recv + at;
            for (uint64_t j = 0; j < ns; j++) p->send[j] = input(q, j);
            if (s->kind == SC_BROADCAST && !(p->member && p->pos == s->root))
                for (uint64_t j = 0; j < ns; j++) p->send[j] = poison(q, j, 1);
        } else {
            p->send = malloc((ns ? ns : 1) * sizeof(int64_t));
            p->send_init = malloc((ns ? ns : 1) * sizeof(int64_t));
            assert_non_null(p->send);
            assert_non_null(p->send_init);
            for (uint64_t j = 0; j < ns; j++) p->send[j] = p->send_init[j] = input(q, j);
        }
        if (nr) memcpy(p->recv_init, p->recv, nr * sizeof(int64_t));
    }
}

/* Is element j of a block inside some rail's slice? */
static bool in_slices(const ex_t *e, uint64_t j)
{
    if (e->nrails > 1) return true;
    return j >= e->s->lo && j < e->s->hi;
}

static int64_t reduce_over(const ex_t *e, uint64_t j)
{
    const scen_t *s = e->s;
    int64_t acc = 0;
    bool first = true;
    for (int q = 0; q < e->world; q++) {
        if (!e->procs[q].member) continue;
        int64_t v = input(q, j);
        acc = first ? v : apply_op(s, acc, v);
        first = false;
    }
    if (s->avg) acc /= s->n;
    return acc;
}

static void check_results(ex_t *e)
{
    const scen_t *s = e->s;
    const uint64_t c = s->count;
    int root_rank = s->order ? s->order[s->root] : s->root;
    for (int q = 0; q < e->world && !e->failed; q++) {
        const proc_t *p = &e->procs[q];
        if (!p->send_alias)
            for (uint64_t j = 0; j < p->nsend_el && !e->failed; j++)
                if (p->send[j] != p->send_init[j])
                    ex_fail(e, "rank %d: input element %llu changed", q, (unsigned long long)j);
        for (uint64_t j = 0; j < p->nrecv_el && !e->failed; j++) {
            int64_t got = p->recv[j], init = p->recv_init[j], want = init;
            bool care = true;
            if (!p->member) {
                want = init;
            } else if (s->kind == SC_BARRIER || c == 0) {
                want = init;
            } else if (s->kind == SC_ALLREDUCE) {
                if (in_slices(e, j)) want = reduce_over(e, j);
            } else if (s->kind == SC_BROADCAST) {
                if (in_slices(e, j)) want = input(root_rank, j);
            } else if (s->kind == SC_ALLGATHER) {
                uint64_t b = j / c, o = j % c;
                if (in_slices(e, o) && e->procs[b].member) want = input((int)b, o);
            } else if (s->kind == SC_REDUCE_SCATTER) {
                if (!s->rs_in_place) {
                    if (in_slices(e, j)) want = reduce_over(e, (uint64_t)q * c + j);
                } else {
                    uint64_t b = j / c, o = j % c;
                    if (in_slices(e, o)) {
                        if (b == (uint64_t)q)
                            want = reduce_over(e, j);
                        else if (e->procs[b].member)
                            care = false; /* the in-place work area */
                    }
                }
            }
            if (care && got != want)
                ex_fail(e, "rank %d: recv[%llu] = %lld, want %lld (initially %lld)", q,
                        (unsigned long long)j, (long long)got, (long long)want, (long long)init);
        }
    }
}

static void ex_free(ex_t *e)
{
    for (int q = 0; q < e->world; q++) {
        proc_t *p = &e->procs[q];
        if (!p->send_alias) {
            free(p->send);
            free(p->send_init);
        }
        free(p->recv);
        free(p->recv_init);
    }
    for (int i = 0; i < e->nrails * e->world; i++) {
        inst_t *in = &e->inst[i];
        sc_plan_free(&in->plan);
        free(in->state);
        free(in->deps_left);
        free(in->rmap);
        free(in->scratch);
    }
    for (msg_t *m = e->msgs, *n; m; m = n) {
        n = m->all_next;
        free(m->payload);
        free(m);
    }
    free(e->procs);
    free(e->inst);
    free(e->ch);
    free(e->pool);
}

/* Run one scenario. Returns 0, or -1 with the reason in err. */
static int run(const scen_t *s, mutate_fn mutate, void *marg, char *err, size_t errcap)
{
    ex_t e;
    memset(&e, 0, sizeof(e));
    e.s = s;
    e.rng = s->seed * 0x9E3779B97F4A7C15ull + 1;
    e.nrails = s->nrails > 1 ? s->nrails : 1;
    e.world = s->n;
    if (s->order)
        for (int i = 0; i < s->n; i++)
            if (s->order[i] + 1 > e.world) e.world = s->order[i] + 1;
    e.procs = calloc((size_t)e.world, sizeof(proc_t));
    e.inst = calloc((size_t)(e.nrails * e.world), sizeof(inst_t));
    e.ch = calloc((size_t)(e.nrails * e.world * e.world), sizeof(chan_t));
    assert_non_null(e.procs);
    assert_non_null(e.inst);
    assert_non_null(e.ch);
    for (int pos = 0; pos < s->n; pos++) {
        int q = s->order ? s->order[pos] : pos;
        assert_false(e.procs[q].member); /* order must not repeat a rank */
        e.procs[q].member = true;
        e.procs[q].pos = pos;
    }
    setup_buffers(&e);

    /* build every member's plan for every rail */
    uint64_t total_steps = 0;
    for (int rail = 0; rail < e.nrails && !e.failed; rail++) {
        uint64_t lo = s->lo, hi = s->hi;
        if (e.nrails > 1) {
            lo = sc_split(s->count, (uint64_t)e.nrails, (uint64_t)rail);
            hi = sc_split(s->count, (uint64_t)e.nrails, (uint64_t)rail + 1);
        }
        for (int q = 0; q < e.world && !e.failed; q++) {
            if (!e.procs[q].member) continue;
            int ii = inst_idx(&e, rail, q);
            inst_t *in = &e.inst[ii];
            in->used = true;
            sc_coll_t c = {.kind = s->kind,
                           .algo = s->algo,
                           .nranks = s->n,
                           .rank = e.procs[q].pos,
                           .order = s->order,
                           .root = s->root,
                           .count = s->count,
                           .lo = lo,
                           .hi = hi,
                           .chunk_elems = s->chunk,
                           .small_elems = 0,
                           .avg = s->avg,
                           .rs_in_place = s->rs_in_place,
                           .host = s->host};
            sc_plan_init(&in->plan);
            int st = sc_plan_build(&c, &in->plan);
            if (st != 0) {
                ex_fail(&e, "sc_plan_build for rank %d rail %d: %d", q, rail, st);
                break;
            }
            if (mutate) {
                mutate(&in->plan, q, rail, marg);
                assert_int_equal(sc_plan_finish(&in->plan), 0);
            }
            check_plan(&e, q, rail, &in->plan, hi - lo);
            const sc_plan_t *p = &in->plan;
            uint32_t n = p->nsteps;
            total_steps += n;
            in->state = calloc(n ? n : 1, 1);
            in->deps_left = calloc(n ? n : 1, sizeof(uint32_t));
            in->rmap = calloc(p->nrecv ? p->nrecv : 1, sizeof(rkey_t));
            in->scratch = malloc((p->scratch_count ? p->scratch_count : 1) * sizeof(int64_t));
            assert_non_null(in->state);
            assert_non_null(in->deps_left);
            assert_non_null(in->rmap);
            assert_non_null(in->scratch);
            for (uint64_t k = 0; k < p->scratch_count; k++) in->scratch[k] = poison(q, k, 2);
            for (uint32_t i = 0; i < n; i++) {
                const sc_step_t *stp = &p->steps[i];
                in->deps_left[i] = stp->ndeps;
                if ((stp->kind == SC_RECV || stp->kind == SC_RECV_REDUCE) && in->nr < p->nrecv)
                    in->rmap[in->nr++] = (rkey_t){stp->peer, stp->tag, i};
            }
            qsort(in->rmap, in->nr, sizeof(rkey_t), rkey_cmp);
            for (uint32_t k = 1; k < in->nr && !e.failed; k++)
                if (in->rmap[k].peer == in->rmap[k - 1].peer &&
                    in->rmap[k].tag == in->rmap[k - 1].tag)
                    ex_fail(&e, "rank %d: receives %u and %u both match peer %d tag %u", q,
                            in->rmap[k - 1].step, in->rmap[k].step, in->rmap[k].peer,
                            in->rmap[k].tag);
        }
    }
    /* the ready steps; then one random event at a time */
    for (int ii = 0; ii < e.nrails * e.world && !e.failed; ii++) {
        inst_t *in = &e.inst[ii];
        if (!in->used) continue;
        for (uint32_t i = 0; i < in->plan.nsteps; i++)
            if (in->deps_left[i] == 0) push(&e, (action_t){.type = A_START, .a = ii, .step = i});
    }
    while (e.npool && !e.failed) {
        size_t k = (size_t)(rnd(&e.rng) % e.npool);
        action_t a = e.pool[k];
        e.pool[k] = e.pool[--e.npool];
        switch (a.type) {
        case A_START: start_step(&e, a.a, a.step); break;
        case A_CAPTURE: capture(&e, a.m); break;
        case A_SENDDONE: step_done(&e, inst_idx(&e, a.m->rail, a.m->from), a.m->step); break;
        case A_DELIVER: deliver(&e, a.m); break;
        case A_DELIVER_CH: {
            chan_t *ch = &e.ch[a.a];
            ch->in_pool = false;
            msg_t *m = ch->head;
            if (m) deliver(&e, m);
            if (!e.failed) ch_check(&e, a.a);
            break;
        }
        }
    }
    /* everything finished, every message delivered */
    uint64_t done = 0;
    for (int ii = 0; ii < e.nrails * e.world; ii++) done += e.inst[ii].ndone;
    if (!e.failed && done != total_steps) {
        char stuck[256] = "";
        size_t l = 0;
        for (int ii = 0; ii < e.nrails * e.world && l < 200; ii++) {
            const inst_t *in = &e.inst[ii];
            for (uint32_t i = 0; i < in->plan.nsteps && l < 200; i++)
                if (in->state[i] != ST_DONE)
                    l +=
                        (size_t)snprintf(stuck + l, sizeof(stuck) - l, " r%d.s%u(%s,%s)",
                                         ii % e.world, i, sc_step_kind_name(in->plan.steps[i].kind),
                                         in->state[i] == ST_RUN ? "run" : "wait");
        }
        ex_fail(&e, "deadlock: %llu of %llu steps done; stuck:%s", (unsigned long long)done,
                (unsigned long long)total_steps, stuck);
    }
    for (int c = 0; c < e.nrails * e.world * e.world && !e.failed; c++)
        if (e.ch[c].head)
            ex_fail(&e, "a message (tag %u) from rank %d to rank %d was never received",
                    e.ch[c].head->tag, e.ch[c].head->from, e.ch[c].head->to);
    if (!e.failed) check_results(&e);
    int rc = e.failed ? -1 : 0;
    if (err) snprintf(err, errcap, "%s", e.err);
    ex_free(&e);
    return rc;
}

static void run_ok(const scen_t *s)
{
    char err[512];
    if (run(s, NULL, NULL, err, sizeof(err)) != 0) {
        char d[512];
        describe(s, d, sizeof(d));
        print_error("%s\n  %s\n", d, err);
        fail();
    }
}

/* ---- scenario generation ---- */

static void shuffle(int *v, int n, uint64_t *rng)
{
    for (int i = 0; i < n; i++) v[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(rnd(rng) % (uint64_t)(i + 1));
        int t = v[i];
        v[i] = v[j];
        v[j] = t;
    }
}

static uint64_t counts_for(int n, int i)
{
    const uint64_t c[] = {0, 1, (uint64_t)n - 1, (uint64_t)n + 1, 1000};
    return c[i];
}

static uint64_t seq_seed = 1;

/* Three runs of one configuration: the whole buffer in one piece; a rail's
 * share [lo, hi) with small chunks, a permuted ring, FIFO channels and
 * sends that complete only when received; two or three rails at once with
 * another permutation. */
static void run_variants(scen_t base)
{
    int perm[32];
    assert_true(base.n <= 32);
    uint64_t rng = ++seq_seed * 7919;

    scen_t s = base;
    s.lo = 0;
    s.hi = s.count;
    s.nrails = 1;
    s.chunk = 1 << 20;
    s.order = NULL;
    s.seed = ++seq_seed;
    run_ok(&s);

    s = base;
    shuffle(perm, s.n, &rng);
    s.order = perm;
    s.lo = s.count / 3;
    s.hi = s.count - s.count / 5;
    s.nrails = 1;
    s.chunk = 3;
    s.fifo = true;
    s.rendezvous = true;
    s.seed = ++seq_seed;
    run_ok(&s);

    s = base;
    shuffle(perm, s.n, &rng);
    s.order = perm;
    s.nrails = 2 + (int)(seq_seed % 2);
    s.chunk = 7;
    s.fifo = true;
    s.rendezvous = false;
    s.seed = ++seq_seed;
    run_ok(&s);
}

static void test_allreduce(void **state)
{
    (void)state;
    const sc_algo algos[] = {SC_ALGO_RING, SC_ALGO_RD, SC_ALGO_DIRECT, SC_ALGO_HD, SC_ALGO_STAR};
    for (int n = 1; n <= 9; n++)
        for (int ci = 0; ci < 5; ci++)
            for (int ai = 0; ai < 5; ai++)
                for (int v = 0; v < 3; v++)
                    for (int ip = 0; ip < 2; ip++) {
                        scen_t s = {.kind = SC_ALLREDUCE,
                                    .algo = algos[ai],
                                    .n = n,
                                    .count = counts_for(n, ci),
                                    .avg = v == 1,
                                    .op = v == 2 ? OP_MAX : OP_SUM,
                                    .in_place = ip};
                        run_variants(s);
                    }
}

/* Hierarchical allreduce: hosts of 2, 3 and 4 members (the host of a comm
 * rank, whatever its ring position), results exact in every order of events;
 * hosts of unequal sizes fall back to the ring. */
static void test_allreduce_hier(void **state)
{
    (void)state;
    static const struct {
        int n, per; /* per: members per host (0: unequal hosts) */
    } shapes[] = {{4, 2}, {6, 2}, {6, 3}, {8, 4}, {8, 2}, {9, 3}, {5, 0}, {7, 0}};
    for (size_t k = 0; k < sizeof(shapes) / sizeof(shapes[0]); k++) {
        int n = shapes[k].n, per = shapes[k].per;
        int host[16];
        for (int q = 0; q < n; q++) host[q] = per ? (q * 7 % n) / per : (q < 2 ? 0 : 1);
        sc_coll_t c = {.kind = SC_ALLREDUCE, .nranks = n, .host = host};
        int H = 0, L = 0;
        assert_int_equal(sc_plan_hier_shape(&c, &H, &L), per != 0);
        if (per) {
            assert_int_equal(L, per);
            assert_int_equal(H, n / per);
        }
        /* The plan is the hierarchical one: steps inside the host carry
         * its tags (0x50000000, +1), and the ring between the hosts has H
         * members, so a rank talks to 2 remote peers at most. */
        sc_plan_t pl;
        sc_plan_init(&pl);
        sc_coll_t b = {.kind = SC_ALLREDUCE,
                       .algo = SC_ALGO_HIER,
                       .nranks = n,
                       .rank = 0,
                       .count = 1000,
                       .hi = 1000,
                       .chunk_elems = 100,
                       .host = host};
        assert_int_equal(sc_plan_build(&b, &pl), 0);
        int inside = 0;
        bool peer_seen[16] = {false};
        for (uint32_t i = 0; i < pl.nsteps; i++) {
            const sc_step_t *st = &pl.steps[i];
            if (st->peer < 0) continue;
            if (st->tag >= 0x50000000u) {
                inside++;
                assert_int_equal(host[st->peer], host[0]);
            } else {
                assert_true(!per || host[st->peer] != host[0]);
                peer_seen[st->peer] = true;
            }
        }
        int remote = 0;
        for (int q = 0; q < n; q++) remote += peer_seen[q];
        if (per) {
            assert_int_equal(inside, 4 * (per - 1));
            assert_true(remote <= 2 && remote >= 1);
        } else {
            assert_int_equal(inside, 0);
        }
        sc_plan_free(&pl);
        c.scale = 2.0; /* no weighting prologue */
        assert_false(sc_plan_hier_shape(&c, NULL, NULL));
        for (int ci = 0; ci < 5; ci++)
            for (int v = 0; v < 3; v++)
                for (int ip = 0; ip < 2; ip++) {
                    scen_t s = {.kind = SC_ALLREDUCE,
                                .algo = SC_ALGO_HIER,
                                .n = n,
                                .count = counts_for(n, ci),
                                .avg = v == 1,
                                .op = v == 2 ? OP_MAX : OP_SUM,
                                .in_place = ip,
                                .host = host};
                    run_variants(s);
                }
    }
}

/* Broadcast, allgather, reduce-scatter and barrier across hosts: every root,
 * in and out of place, exact in every order of events; the network steps
 * join members of different hosts only, and a rank's network peers are the
 * members with its index in the other hosts (the barrier: only the first
 * member of each host uses the network). Unequal hosts fall back. */
static void hier_peers(sc_coll_kind kind, int n, const int *host, int per)
{
    for (int r = 0; r < n; r++) {
        sc_plan_t pl;
        sc_plan_init(&pl);
        sc_coll_t b = {.kind = kind,
                       .algo = SC_ALGO_HIER,
                       .nranks = n,
                       .rank = r,
                       .root = n - 1,
                       .count = 1000,
                       .hi = 1000,
                       .chunk_elems = 100,
                       .host = host};
        assert_int_equal(sc_plan_build(&b, &pl), 0);
        /* this rank's index in its host */
        int idx = 0, remote = 0;
        for (int q = 0; q < r; q++) idx += host[q] == host[r];
        bool seen[16] = {false};
        for (uint32_t i = 0; i < pl.nsteps; i++) {
            const sc_step_t *st = &pl.steps[i];
            if (st->peer < 0 || IS_FENCE(st->tag)) continue;
            bool inside = st->tag >= 0x50000000u;
            assert_int_equal(inside, host[st->peer] == host[r]);
            if (inside) continue;
            int pidx = 0;
            for (int q = 0; q < st->peer; q++) pidx += host[q] == host[st->peer];
            if (kind == SC_BARRIER) assert_int_equal(idx, 0);
            if (kind != SC_BROADCAST) assert_int_equal(pidx, idx);
            remote += !seen[st->peer];
            seen[st->peer] = true;
        }
        if (kind == SC_ALLGATHER || kind == SC_REDUCE_SCATTER)
            assert_int_equal(remote, n / per - 1);
        sc_plan_free(&pl);
    }
}

static void test_other_hier(void **state)
{
    (void)state;
    static const struct {
        int n, per;
    } shapes[] = {{4, 2}, {6, 2}, {6, 3}, {8, 4}, {9, 3}, {5, 0}};
    for (size_t k = 0; k < sizeof(shapes) / sizeof(shapes[0]); k++) {
        int n = shapes[k].n, per = shapes[k].per;
        int host[16];
        for (int q = 0; q < n; q++) host[q] = per ? (q * 7 % n) / per : (q < 2 ? 0 : 1);
        for (int kind = SC_BROADCAST; kind <= SC_BARRIER; kind++) {
            sc_coll_t c = {.kind = (sc_coll_kind)kind, .nranks = n, .host = host};
            assert_int_equal(sc_plan_hier_shape(&c, NULL, NULL), per != 0);
            if (per) hier_peers((sc_coll_kind)kind, n, host, per);
        }
        scen_t bar = {.kind = SC_BARRIER, .algo = SC_ALGO_HIER, .n = n, .host = host};
        run_variants(bar);
        for (int ci = 0; ci < 5; ci++) {
            for (int root = 0; root < n; root++) {
                scen_t s = {.kind = SC_BROADCAST,
                            .algo = SC_ALGO_HIER,
                            .n = n,
                            .root = root,
                            .count = counts_for(n, ci),
                            .host = host};
                run_variants(s);
            }
            for (int ip = 0; ip < 2; ip++) {
                scen_t s = {.kind = SC_ALLGATHER,
                            .algo = SC_ALGO_HIER,
                            .n = n,
                            .count = counts_for(n, ci),
                            .in_place = ip,
                            .host = host};
                run_variants(s);
                for (int v = 0; v < 3; v++) {
                    scen_t r = {.kind = SC_REDUCE_SCATTER,
                                .algo = SC_ALGO_HIER,
                                .n = n,
                                .count = counts_for(n, ci),
                                .avg = v == 1,
                                .op = v == 2 ? OP_MAX : OP_SUM,
                                .rs_in_place = ip,
                                .host = host};
                    run_variants(r);
                }
            }
        }
    }
}

/* The link model of COHORT_HIER=-1 (the knobs' defaults: 20 us / 10 Gbit/s
 * between hosts, 2 us / 40 Gbit/s inside). */
static double cost(sc_coll_kind kind, sc_algo algo, int n, const int *host, uint64_t count,
                   const sc_link_model_t *m)
{
    sc_coll_t c = {.kind = kind,
                   .algo = algo,
                   .nranks = n,
                   .count = count,
                   .hi = count,
                   .chunk_elems = 1u << 18,
                   .small_elems = 16384,
                   .host = host};
    return sc_plan_cost(&c, 4, m);
}

static bool hier_wins(sc_coll_kind kind, int n, const int *host, uint64_t count,
                      const sc_link_model_t *m)
{
    return cost(kind, SC_ALGO_HIER, n, host, count, m) <
           cost(kind, SC_ALGO_AUTO, n, host, count, m);
}

static void test_cost_model(void **state)
{
    (void)state;
    const sc_link_model_t dflt = {20e-6, 10e3 * 125e3, 2e-6, 40e3 * 125e3, 0, 0};
    int h4[] = {0, 0, 1, 1}, h16[16], h8x2[16], odd[] = {0, 0, 0, 1, 1};
    for (int i = 0; i < 16; i++) {
        h16[i] = i / 8;  /* 2 hosts of 8 */
        h8x2[i] = i / 2; /* 8 hosts of 2 */
    }
    /* 2 hosts of 2: small allreduces keep recursive doubling (2 network
     * rounds against 2 local and 2 network), large ones go hierarchical. */
    assert_false(hier_wins(SC_ALLREDUCE, 4, h4, 16, &dflt));
    assert_true(hier_wins(SC_ALLREDUCE, 4, h4, 1u << 22, &dflt));
    /* 2 hosts of 8: even a small allreduce crosses the network less. */
    assert_true(hier_wins(SC_ALLREDUCE, 16, h16, 16, &dflt));
    /* Barriers: log2 H network rounds instead of log2 N. */
    assert_true(hier_wins(SC_BARRIER, 16, h16, 0, &dflt));
    assert_true(hier_wins(SC_BARRIER, 16, h8x2, 0, &dflt));
    assert_true(hier_wins(SC_BARRIER, 4, h4, 0, &dflt)); /* 1 network round, not 2 */
    for (int kind = SC_ALLREDUCE; kind <= SC_REDUCE_SCATTER; kind++) {
        assert_true(hier_wins((sc_coll_kind)kind, 16, h16, 1u << 20, &dflt));
        assert_true(hier_wins((sc_coll_kind)kind, 16, h8x2, 1u << 20, &dflt));
        /* Costs grow with the size. */
        double prev = 0;
        for (uint64_t cnt = 1; cnt <= (1u << 24); cnt <<= 4) {
            double t = cost((sc_coll_kind)kind, SC_ALGO_HIER, 16, h16, cnt, &dflt);
            assert_true(t > prev);
            prev = t;
        }
    }
    /* A network as fast as memory and a host slower than it (a fabric of
     * 400 Gbit/s against one busy socket): flat rings for large buffers. */
    const sc_link_model_t fast_net = {2e-6, 400e3 * 125e3, 2e-6, 20e3 * 125e3, 0, 0};
    assert_false(hier_wins(SC_ALLREDUCE, 16, h16, 1u << 24, &fast_net));
    assert_false(hier_wins(SC_ALLGATHER, 16, h16, 1u << 20, &fast_net));
    /* Unequal hosts: no hierarchical plan, no cost for it. */
    assert_true(cost(SC_ALLREDUCE, SC_ALGO_HIER, 5, odd, 1000, &dflt) < 0);
    /* The ring's alpha-beta time: 2(n-1)(a + S/n/b). */
    double ring = cost(SC_ALLREDUCE, SC_ALGO_RING, 4, h4, 1u << 20, &dflt);
    double want = 6 * (20e-6 + (4.0 * (1u << 20)) / 4 / (10e3 * 125e3));
    assert_true(fabs(ring - want) < 1e-12);
    /* Halving-doubling: the ring's bytes in 2 log2(n) steps, so cheaper for
     * powers of two (equal at 2); elsewhere the fold's two whole-buffer
     * transfers make the ring cheaper for all but the smallest sizes. */
    double hd = cost(SC_ALLREDUCE, SC_ALGO_HD, 4, h4, 1u << 20, &dflt);
    want = 4 * 20e-6 + 2 * 3 * (4.0 * (1u << 20)) / 4 / (10e3 * 125e3);
    assert_true(fabs(hd - want) < 1e-12);
    assert_true(hd < ring);
    assert_true(fabs(cost(SC_ALLREDUCE, SC_ALGO_HD, 2, h4, 1u << 20, &dflt) -
                     cost(SC_ALLREDUCE, SC_ALGO_RING, 2, h4, 1u << 20, &dflt)) < 1e-12);
    assert_true(cost(SC_ALLREDUCE, SC_ALGO_HD, 8, h16, 1u << 24, &dflt) <
                cost(SC_ALLREDUCE, SC_ALGO_RING, 8, h16, 1u << 24, &dflt));
    assert_true(cost(SC_ALLREDUCE, SC_ALGO_HD, 6, h16, 1u << 20, &dflt) >
                cost(SC_ALLREDUCE, SC_ALGO_RING, 6, h16, 1u << 20, &dflt));
    assert_true(cost(SC_ALLREDUCE, SC_ALGO_HD, 3, h4, 1u << 20, &dflt) >
                cost(SC_ALLREDUCE, SC_ALGO_RING, 3, h4, 1u << 20, &dflt));
}

/* Small allreduces on one host (sc_link_model_t's CPU term): the star's
 * 2(n-1) messages beat recursive doubling's n log2(n) when the ranks
 * outnumber the cores, and lose when each rank has a core, on 2 ranks (a
 * step more, no fewer messages) and without the term (several hosts). The
 * model of rx_coll.c with its default 5 us per message end (on 4 ranks and 2
 * cores the star wins 4 KiB from 0.3 us, and 64 KiB by the bytes alone). */
static bool star_wins(int n, int cores, uint64_t count)
{
    const sc_link_model_t m = {2e-6, 40e3 * 125e3, 0, 0, 5e-6, cores};
    return cost(SC_ALLREDUCE, SC_ALGO_STAR, n, NULL, count, &m) <
           cost(SC_ALLREDUCE, SC_ALGO_RD, n, NULL, count, &m);
}

static void test_cost_small(void **state)
{
    (void)state;
    /* Measured faster by the slowest call and the span (docs/perf.md). */
    assert_true(star_wins(4, 2, 1024)); /* 4 KiB */
    assert_true(star_wins(4, 2, 4096)); /* 16 KiB */
    assert_true(star_wins(6, 2, 1024));
    assert_true(star_wins(8, 2, 1024));
    assert_true(star_wins(8, 2, 16384)); /* 64 KiB */
    assert_true(star_wins(4, 2, 16384));
    /* 3 ranks: the busiest rank has 4 message ends in both (a tie, and
     * measured alike): rd, one step fewer. */
    assert_false(star_wins(3, 2, 1024));
    assert_false(star_wins(2, 2, 1024));
    assert_false(star_wins(2, 1, 1024));
    assert_false(star_wins(4, 4, 1024));
    assert_false(star_wins(8, 16, 1024));
    assert_false(star_wins(8, 0, 1024)); /* no CPU term */
    /* Without the CPU term the star is the alpha-beta cost of its root's link. */
    const sc_link_model_t ab = {2e-6, 40e3 * 125e3, 0, 0, 0, 0};
    double t = cost(SC_ALLREDUCE, SC_ALGO_STAR, 4, NULL, 1024, &ab);
    assert_true(fabs(t - 2 * (2e-6 + 3 * 4096.0 / (40e3 * 125e3))) < 1e-15);
}

static void test_broadcast(void **state)
{
    (void)state;
    const sc_algo algos[] = {SC_ALGO_RING, SC_ALGO_RD};
    for (int n = 1; n <= 9; n++)
        for (int ci = 0; ci < 5; ci++)
            for (int ai = 0; ai < 2; ai++)
                for (int root = 0; root < n; root++) {
                    scen_t s = {.kind = SC_BROADCAST,
                                .algo = algos[ai],
                                .n = n,
                                .root = root,
                                .count = counts_for(n, ci)};
                    run_variants(s);
                }
}

static void test_allgather(void **state)
{
    (void)state;
    const sc_algo algos[] = {SC_ALGO_RING, SC_ALGO_RD};
    for (int n = 1; n <= 9; n++)
        for (int ci = 0; ci < 5; ci++)
            for (int ai = 0; ai < 2; ai++)
                for (int ip = 0; ip < 2; ip++) {
                    scen_t s = {.kind = SC_ALLGATHER,
                                .algo = algos[ai],
                                .n = n,
                                .count = counts_for(n, ci),
                                .in_place = ip};
                    run_variants(s);
                }
}

static void test_reduce_scatter(void **state)
{
    (void)state;
    const sc_algo algos[] = {SC_ALGO_RING, SC_ALGO_RD};
    for (int n = 1; n <= 9; n++)
        for (int ci = 0; ci < 5; ci++)
            for (int ai = 0; ai < 2; ai++)
                for (int v = 0; v < 3; v++)
                    for (int ip = 0; ip < 2; ip++) {
                        scen_t s = {.kind = SC_REDUCE_SCATTER,
                                    .algo = algos[ai],
                                    .n = n,
                                    .count = counts_for(n, ci),
                                    .avg = v == 1,
                                    .op = v == 2 ? OP_MAX : OP_SUM,
                                    .rs_in_place = ip};
                        run_variants(s);
                    }
}

static void test_barrier(void **state)
{
    (void)state;
    for (int n = 1; n <= 17; n++) {
        scen_t s = {.kind = SC_BARRIER, .algo = SC_ALGO_RING, .n = n};
        run_variants(s);
        /* dissemination: ceil(log2 n) rounds, one send and one receive each */
        int rounds = 0;
        while ((1 << rounds) < n) rounds++;
        for (int r = 0; r < n; r++) {
            sc_coll_t c = {.kind = SC_BARRIER, .nranks = n, .rank = r};
            sc_plan_t p;
            sc_plan_init(&p);
            assert_int_equal(sc_plan_build(&c, &p), 0);
            assert_int_equal(p.nsend, rounds);
            assert_int_equal(p.nrecv, rounds);
            assert_int_equal(p.nsteps, 2 * rounds);
            assert_int_equal(p.scratch_count, 0);
            sc_plan_free(&p);
        }
    }
}

/* The direct allreduce sends each destination its push chunks in order,
 * SC_DIRECT_WINDOW at once: chunk k waits for chunk k-W to that peer, not
 * for k-1 (one at a time left a udp sender idle for a round trip per
 * chunk). */
static void test_direct_window(void **state)
{
    (void)state;
    const int n = 4;
    sc_coll_t c = {.kind = SC_ALLREDUCE,
                   .algo = SC_ALGO_DIRECT,
                   .nranks = n,
                   .rank = 1,
                   .count = 4 * 8 * 100,
                   .chunk_elems = 100};
    c.hi = c.count;
    sc_plan_t p;
    sc_plan_init(&p);
    assert_int_equal(sc_plan_build(&c, &p), 0);
    for (int peer = 0; peer < n; peer++) {
        if (peer == c.rank) continue;
        uint32_t push[64];
        int k = 0;
        for (uint32_t i = 0; i < p.nsteps; i++)
            if (p.steps[i].kind == SC_SEND && p.steps[i].stage == SC_STAGE_PUSH &&
                p.steps[i].peer == peer)
                push[k++] = i;
        assert_int_equal(k, 8); /* 800 elements a block, chunks of 100 */
        for (int j = 0; j < k; j++) {
            const sc_step_t *st = &p.steps[push[j]];
            if (j < (int)SC_DIRECT_WINDOW) {
                assert_int_equal(st->ndeps, 0);
            } else {
                assert_int_equal(st->ndeps, 1);
                assert_int_equal(p.deps[st->dep_off], push[j - (int)SC_DIRECT_WINDOW]);
            }
        }
    }
    sc_plan_free(&p);
}

/* Plans over a subset of a larger communicator (order names comm ranks
 * that are not 0..n-1), as the scheduler's group plans use them. */
static void test_subset(void **state)
{
    (void)state;
    static const int sub3[] = {6, 2, 4}, sub1[] = {3}, sub5[] = {7, 0, 5, 1, 3};
    static const struct {
        const int *order;
        int n;
    } subs[] = {{sub3, 3}, {sub1, 1}, {sub5, 5}};
    const sc_coll_kind kinds[] = {SC_ALLREDUCE, SC_BROADCAST, SC_ALLGATHER, SC_REDUCE_SCATTER,
                                  SC_BARRIER};
    const sc_algo algos[] = {SC_ALGO_RING, SC_ALGO_RD, SC_ALGO_HD};
    for (size_t si = 0; si < sizeof(subs) / sizeof(subs[0]); si++)
        for (size_t ki = 0; ki < sizeof(kinds) / sizeof(kinds[0]); ki++)
            for (int ai = 0; ai < 3; ai++)
                for (int ip = 0; ip < 2; ip++) {
                    const uint64_t counts[] = {1, 5, 23};
                    for (int ci = 0; ci < 3; ci++) {
                        scen_t s = {.kind = kinds[ki],
                                    .algo = algos[ai],
                                    .n = subs[si].n,
                                    .order = subs[si].order,
                                    .root = subs[si].n - 1,
                                    .count = counts[ci],
                                    .lo = 0,
                                    .hi = counts[ci],
                                    .nrails = 1,
                                    .chunk = 2,
                                    .op = OP_SUM,
                                    .in_place = ip,
                                    .rs_in_place = ip,
                                    .fifo = ip,
                                    .seed = ++seq_seed};
                        run_ok(&s);
                    }
                }
}

/* Many seeds of the configurations with the most interleavings. */
static void test_many_orders(void **state)
{
    (void)state;
    for (int seed = 0; seed < 60; seed++) {
        int perm[8];
        uint64_t rng = (uint64_t)seed + 99;
        shuffle(perm, 7, &rng);
        for (int kind = 0; kind < 4; kind++)
            for (int ai = 0; ai < 3; ai++) {
                if (ai == 2 && kind != SC_ALLREDUCE) continue;
                scen_t s = {.kind = (sc_coll_kind)kind,
                            .algo = ai == 2 ? SC_ALGO_HD
                                    : ai    ? SC_ALGO_RD
                                            : SC_ALGO_RING,
                            .n = 7,
                            .order = seed % 2 ? perm : NULL,
                            .root = seed % 7,
                            .count = 29,
                            .lo = 3,
                            .hi = 26,
                            .nrails = seed % 3 == 0 ? 2 : 1,
                            .chunk = 2,
                            .avg = seed % 4 == 1 && kind != SC_BROADCAST && kind != SC_ALLGATHER,
                            .in_place = seed % 5 < 2,
                            .rs_in_place = seed % 5 >= 2,
                            .op = seed % 3 == 2 ? OP_MAX : OP_SUM,
                            .fifo = seed % 2 == 0,
                            .rendezvous = seed % 4 < 2,
                            .seed = (uint64_t)seed * 1000 + (uint64_t)kind * 10 + (uint64_t)ai};
                run_ok(&s);
            }
    }
}

/* An empty share of a non-empty op has no steps; an empty op is a barrier. */
static void test_empty(void **state)
{
    (void)state;
    for (int kind = 0; kind < 4; kind++) {
        for (int n = 1; n <= 5; n++) {
            sc_coll_t c = {.kind = (sc_coll_kind)kind,
                           .algo = SC_ALGO_RING,
                           .nranks = n,
                           .rank = n - 1,
                           .count = 10,
                           .lo = 4,
                           .hi = 4,
                           .chunk_elems = 3};
            sc_plan_t p;
            sc_plan_init(&p);
            assert_int_equal(sc_plan_build(&c, &p), 0);
            assert_int_equal(p.nsteps, 0);
            assert_int_equal(p.scratch_count, 0);
            sc_plan_free(&p);
            c.count = c.lo = c.hi = 0;
            sc_plan_init(&p);
            assert_int_equal(sc_plan_build(&c, &p), 0);
            int rounds = 0;
            while ((1 << rounds) < n) rounds++;
            assert_int_equal(p.nsend, rounds);
            assert_int_equal(p.nrecv, rounds);
            for (uint32_t i = 0; i < p.nsteps; i++) assert_int_equal(p.steps[i].count, 0);
            sc_plan_free(&p);
        }
        scen_t s = {.kind = (sc_coll_kind)kind,
                    .algo = SC_ALGO_RING,
                    .n = 5,
                    .count = 10,
                    .lo = 4,
                    .hi = 4,
                    .nrails = 1,
                    .chunk = 3,
                    .op = OP_SUM,
                    .seed = 5};
        run_ok(&s); /* nothing moves, nothing outside the empty slice changes */
    }
}

static void test_invalid_args(void **state)
{
    (void)state;
    const int good_order[] = {2, 0, 1}, bad_order[] = {2, -1, 1};
    const sc_coll_t ok = {.kind = SC_ALLREDUCE,
                          .algo = SC_ALGO_RING,
                          .nranks = 3,
                          .rank = 1,
                          .order = good_order,
                          .count = 10,
                          .lo = 2,
                          .hi = 9,
                          .chunk_elems = 4};
    sc_plan_t p;
    sc_plan_init(&p);
    assert_int_equal(sc_plan_build(&ok, &p), 0);
    assert_true(p.nsteps > 0);
    sc_plan_free(&p);
    assert_int_equal(p.nsteps, 0);
    assert_null(p.steps);

    struct {
        const char *what;
        sc_coll_t c;
    } k[] = {
        {"rank == nranks", ok}, {"rank > nranks", ok},   {"rank < 0", ok},
        {"nranks 0", ok},       {"nranks > 65536", ok},  {"lo > hi", ok},
        {"hi > count", ok},     {"negative order", ok},  {"kind out of range", ok},
        {"negative kind", ok},  {"bcast root == n", ok}, {"bcast root < 0", ok},
        {"lo > count", ok},
    };
    k[0].c.rank = 3;
    k[1].c.rank = 7;
    k[2].c.rank = -1;
    k[3].c.nranks = 0;
    k[3].c.rank = 0;
    k[3].c.order = NULL;
    k[4].c.nranks = 65537;
    k[4].c.order = NULL;
    k[5].c.lo = 6;
    k[5].c.hi = 5;
    k[6].c.hi = 11;
    k[7].c.order = bad_order;
    k[8].c.kind = SC_COLL_COUNT;
    k[9].c.kind = (sc_coll_kind)-1;
    k[10].c.kind = SC_BROADCAST;
    k[10].c.root = 3;
    k[11].c.kind = SC_BROADCAST;
    k[11].c.root = -1;
    k[12].c.lo = 11;
    k[12].c.hi = 12;
    for (size_t i = 0; i < sizeof(k) / sizeof(k[0]); i++) {
        sc_plan_init(&p);
        int st = sc_plan_build(&k[i].c, &p);
        if (st != COH_EINVAL) print_error("case \"%s\"\n", k[i].what);
        assert_int_equal(st, COH_EINVAL);
        assert_int_equal(p.nsteps, 0);
        sc_plan_free(&p); /* left freeable */
    }
    assert_int_equal(sc_plan_build(NULL, &p), COH_EINVAL);
    assert_int_equal(sc_plan_build(&ok, NULL), COH_EINVAL);
    /* the broadcast root bound is by position, for every valid root */
    for (int root = 0; root < 3; root++) {
        sc_coll_t c = ok;
        c.kind = SC_BROADCAST;
        c.root = root;
        sc_plan_init(&p);
        assert_int_equal(sc_plan_build(&c, &p), 0);
        sc_plan_free(&p);
    }
}

static void test_resolve_algo(void **state)
{
    (void)state;
    sc_coll_t c = {.kind = SC_ALLREDUCE, .algo = SC_ALGO_AUTO, .nranks = 4, .small_elems = 100};
    c.count = 100;
    assert_int_equal(sc_plan_resolve_algo(&c), SC_ALGO_RD);
    c.count = 101;
    assert_int_equal(sc_plan_resolve_algo(&c), SC_ALGO_RING);
    c.kind = SC_ALLGATHER; /* the whole op is count * nranks */
    c.count = 25;
    assert_int_equal(sc_plan_resolve_algo(&c), SC_ALGO_RD);
    c.count = 26;
    assert_int_equal(sc_plan_resolve_algo(&c), SC_ALGO_RING);
    c.kind = SC_REDUCE_SCATTER;
    assert_int_equal(sc_plan_resolve_algo(&c), SC_ALGO_RING);
    c.algo = SC_ALGO_RD;
    assert_int_equal(sc_plan_resolve_algo(&c), SC_ALGO_RD);
    c.algo = SC_ALGO_RING;
    c.count = 1;
    assert_int_equal(sc_plan_resolve_algo(&c), SC_ALGO_RING);
    assert_string_equal(sc_step_kind_name(SC_RECV_REDUCE), "recv_reduce");
    assert_string_equal(sc_step_kind_name(99), "?");
    assert_string_equal(sc_coll_kind_name(SC_REDUCE_SCATTER), "reduce_scatter");
    assert_string_equal(sc_coll_kind_name(-1), "?");
    /* sc_split: balanced, exhaustive, no overflow for huge n */
    for (uint64_t n = 0; n < 40; n++)
        for (uint64_t parts = 1; parts < 9; parts++) {
            assert_int_equal(sc_split(n, parts, 0), 0);
            assert_int_equal(sc_split(n, parts, parts), n);
            for (uint64_t i = 0; i < parts; i++) {
                uint64_t len = sc_split(n, parts, i + 1) - sc_split(n, parts, i);
                assert_true(len == n / parts || len == n / parts + 1);
            }
        }
    assert_int_equal(sc_split(UINT64_MAX, 3, 2), UINT64_MAX / 3 * 2);
}

/* ---- the executor notices broken plans ---- */

/* Rebuild a plan through sc_plan_add, keeping the dependencies keep() accepts. */
static void rebuild(sc_plan_t *p, bool (*keep)(const sc_plan_t *p, uint32_t step, uint32_t dep))
{
    sc_plan_t q;
    sc_plan_init(&q);
    uint32_t *d = malloc((p->ndeps ? p->ndeps : 1) * sizeof(uint32_t));
    assert_non_null(d);
    for (uint32_t i = 0; i < p->nsteps; i++) {
        const sc_step_t *s = &p->steps[i];
        uint32_t nd = 0;
        for (uint32_t k = 0; k < s->ndeps; k++) {
            uint32_t dep = p->deps[s->dep_off + k];
            if (keep(p, i, dep)) d[nd++] = dep;
        }
        assert_true(sc_plan_add(&q, s, d, nd) >= 0);
    }
    free(d);
    q.scratch_count = p->scratch_count;
    sc_plan_free(p);
    *p = q;
}

static bool not_for_sends(const sc_plan_t *p, uint32_t step, uint32_t dep)
{
    (void)dep;
    return p->steps[step].kind != SC_SEND;
}

static void drop_send_deps(sc_plan_t *p, int proc, int rail, void *arg)
{
    (void)proc;
    (void)rail;
    (void)arg;
    rebuild(p, not_for_sends);
}

static bool not_reduce_on_send(const sc_plan_t *p, uint32_t step, uint32_t dep)
{
    return !(p->steps[step].kind == SC_REDUCE && p->steps[dep].kind == SC_SEND);
}

/* RD: the reduce of a round no longer waits for that round's send, which
 * still reads the buffer the reduce overwrites (a write-after-read race). */
static void drop_reduce_send_dep(sc_plan_t *p, int proc, int rail, void *arg)
{
    (void)proc;
    (void)rail;
    (void)arg;
    rebuild(p, not_reduce_on_send);
}

static void retag_one_recv(sc_plan_t *p, int proc, int rail, void *arg)
{
    (void)rail;
    (void)arg;
    if (proc != 1) return;
    for (uint32_t i = 0; i < p->nsteps; i++)
        if (p->steps[i].kind == SC_RECV || p->steps[i].kind == SC_RECV_REDUCE) {
            p->steps[i].tag += 1000;
            return;
        }
}

static void shrink_scratch(sc_plan_t *p, int proc, int rail, void *arg)
{
    (void)proc;
    (void)rail;
    (void)arg;
    if (p->scratch_count) p->scratch_count--;
}

static void recv_waits_for_send(sc_plan_t *p, int proc, int rail, void *arg)
{
    (void)proc;
    (void)rail;
    (void)arg;
    /* every receive waits for every send of the plan: with sends that
     * complete only when received, the ring cannot make progress */
    static uint32_t deps[4096];
    uint32_t nd = 0;
    for (uint32_t i = 0; i < p->nsteps && nd < 4096; i++)
        if (p->steps[i].kind == SC_SEND) deps[nd++] = i;
    sc_plan_t q;
    sc_plan_init(&q);
    for (uint32_t i = 0; i < p->nsteps; i++) {
        sc_step_t s = p->steps[i];
        bool rv = s.kind == SC_RECV || s.kind == SC_RECV_REDUCE;
        const uint32_t *d = rv ? deps : p->deps + s.dep_off;
        uint32_t n = rv ? nd : s.ndeps;
        assert_true(sc_plan_add(&q, &s, d, n) >= 0);
    }
    q.scratch_count = p->scratch_count;
    sc_plan_free(p);
    *p = q;
}

static int failures(const scen_t *base, mutate_fn fn, int seeds, const char *expect)
{
    int n = 0;
    for (int i = 0; i < seeds; i++) {
        scen_t s = *base;
        s.seed = (uint64_t)i + 1;
        char err[512];
        if (run(&s, fn, NULL, err, sizeof(err)) != 0) {
            n++;
            if (expect && !strstr(err, expect)) {
                print_error("expected \"%s\" in: %s\n", expect, err);
                fail();
            }
        }
    }
    return n;
}

static void test_executor_catches(void **state)
{
    (void)state;
    scen_t ring = {.kind = SC_ALLREDUCE,
                   .algo = SC_ALGO_RING,
                   .n = 4,
                   .count = 40,
                   .lo = 0,
                   .hi = 40,
                   .nrails = 1,
                   .chunk = 3,
                   .op = OP_SUM};
    assert_int_equal(failures(&ring, NULL, 20, NULL), 0);
    /* sends that do not wait for their data: wrong sums in some orders */
    assert_true(failures(&ring, drop_send_deps, 20, "recv[") > 0);
    /* a receive whose tag matches no send */
    assert_int_equal(failures(&ring, retag_one_recv, 5, "no receive for it"), 5);
    /* receives that wait for sends that complete only when received */
    scen_t rz = ring;
    rz.rendezvous = true;
    assert_int_equal(failures(&rz, recv_waits_for_send, 5, "deadlock"), 5);
    /* the write-after-read race is caught thanks to late payload capture */
    scen_t rd = ring;
    rd.algo = SC_ALGO_RD;
    rd.n = 4;
    assert_int_equal(failures(&rd, NULL, 40, NULL), 0);
    assert_true(failures(&rd, drop_reduce_send_dep, 40, "recv[") > 0);
    /* scratch accesses are bounds-checked against scratch_count */
    assert_int_equal(failures(&rd, shrink_scratch, 3, "outside"), 3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_invalid_args),
        cmocka_unit_test(test_resolve_algo),
        cmocka_unit_test(test_executor_catches),
        cmocka_unit_test(test_allreduce),
        cmocka_unit_test(test_allreduce_hier),
        cmocka_unit_test(test_other_hier),
        cmocka_unit_test(test_cost_model),
        cmocka_unit_test(test_cost_small),
        cmocka_unit_test(test_broadcast),
        cmocka_unit_test(test_allgather),
        cmocka_unit_test(test_reduce_scatter),
        cmocka_unit_test(test_barrier),
        cmocka_unit_test(test_empty),
        cmocka_unit_test(test_subset),
        cmocka_unit_test(test_direct_window),
        cmocka_unit_test(test_many_orders),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
