/*
 * Device-buffer collectives (docs/gpu.md): a collective whose buffers are
 * device memory runs as a state machine on the GPU reactor ("cohort-gpu",
 * a loop of its own, started when the context has a device runtime).
 *
 *   submit (caller's thread): record an event on the caller's stream,
 *       reserve one op number per chunk, hand the op to the reactor;
 *   the reactor, per op: wait for that event (polled, no thread blocks in
 *       the device runtime), then run up to GPU_SLOTS chunks at once, each
 *       through a pinned host slot:
 *         OUT  copy the chunk device -> host on cohort's stream, event;
 *         NET  the host collective on the slot (op number seq0 + chunk);
 *         IN   copy the result host -> device, event;
 *       so the copy-out of chunk k+1 and the copy-in of chunk k-1 overlap
 *       the network of chunk k. The request completes when the last
 *       copy-in's event has.
 *
 * Polling: an idle handle spins the loop while a device event is pending
 * and may complete soon: up to GPU_SPIN_NS after an op arrives or a copy is
 * issued, plus the copy's time at GPU_COPY_BPNS; after that a 1 ms timer.
 * A chunk's host collective wakes the loop when it completes (on_done).
 *
 * Allreduce and broadcast are cut into COHORT_GPU_CHUNK_BYTES chunks;
 * allgather and reduce-scatter go as one chunk (their layout is strided).
 *
 * Every member on this host (the IPC path): the buffers' IPC handles are
 * allgathered (op seq0), then a vote (seq0 + 1) says whether every member
 * has the others' buffers mapped already; if so each member reduces its
 * shard from the others' memory and a barrier (seq0 + 2) ends the op, else
 * the op is staged as above on its numbers from seq0 + 2. The kernels are
 * queued at submission, on the caller's thread, behind a flag (the gate):
 * they read every member's buffers from a table that the loop fills, and
 * then sets the flag, once the vote says go (else the table says skip).
 * Launched by the loop, they waited for a caller's copy into pageable
 * memory ordered after the op (the driver's lock). Mappings are
 * opened and closed by the mapper thread, never the loop: opening one
 * waits while any thread synchronizes a stream (gpu-lockprobe), and that
 * stream may be waiting for the very op that needs the mapping.
 */
#include <sched.h>
#include <stdio.h>
#include <string.h>

#include "gpu/gpu_dev.h"
#include "reactor/rx_ctx.h"

#define GPU_SLOTS     3
#define GPU_MAX_DEV   16
#define GPU_SPIN_NS   200000ull  /* 200 us */
#define GPU_SPIN_MAX  3000000ull /* the learnt part of the window at most (3 ms) */
#define GPU_COPY_BPNS 5.0        /* bytes per ns a copy is expected to move (5 GB/s) */
#define GPU_CACHE     6          /* pinned buffers kept for reuse */
#define GPU_EVENTS    64         /* events kept for reuse */
#define GPU_FLAGS     1024       /* streams waiting for requests at once */
#define GPU_SEEN      128        /* own allocations remembered as mapped by the peers */

typedef enum { SLOT_FREE = 0, SLOT_OUT, SLOT_NET, SLOT_IN } slot_state;

typedef struct gslot {
    slot_state state;
    char *host; /* pinned staging */
    size_t bytes;
    void *ev;
    uint64_t t_ev; /* when ev was recorded: its wait feeds rx_gpu.lat_ns */
    size_t chunk;
    coh_request_t *sub;
} gslot_t;

typedef struct gop {
    rx_task_t task; /* the submission */
    struct gop *next;
    coh_request_t *req;
    coh_comm_t *comm;
    rx_coll_args_t a; /* as checked; sendbuf / recvbuf are the device pointers */
    int dev;
    void *user_ev;
    bool started; /* the caller's stream got past the submission */
    uint64_t seq0;
    size_t nchunks, next_out, ndone, chunk_elems, es;
    gslot_t slot[GPU_SLOTS];
    /* Every member on this host (COHORT_GPU_IPC): op numbers seq0 (the
     * buffers' IPC handles, allgathered), seq0 + 1 (the vote) and seq0 + 2
     * (a barrier once every member's device work is done); nchunks is 3,
     * next_out and ndone count them as for chunks. */
    bool local;
    bool fallback;       /* was local, staged: a member lacked a mapping */
    size_t staged_n;     /* the chunks if staged; a local op reserves 2 more numbers */
    int32_t vote;        /* 1: some member lacks a mapping of this op's buffers */
    coh_request_t *lsub; /* the exchange, the vote or the barrier, while it runs */
    bool ldev;           /* device work let go (the gate), the gate's event pending */
    struct ggate *gate;  /* the kernels' table and flag, queued (and counted) at submission */
    bool gate_open;
    bool told;          /* the peers were told of every number it will not launch */
    gpu_ipc_t *tab;     /* [size][2]: every member's input and output */
    struct gipc **held; /* [size * 2]: the peers' mappings this op holds */
    int status;
    char why[BS_ERR_LEN];
} gop_t;

/* A job of the mapper thread: map a peer's allocation here, or unmap one. */
typedef struct mjob {
    struct mjob *next;
    bool close;
    int peer, dev;
    gpu_ipc_t h;
    void *base; /* close: what to unmap; open: the mapping made */
    int st;     /* open: 0, or < 0 failed (why) */
    char why[96];
    void *owner; /* freed with the job once done (a gipc_t's own close), else the job */
} mjob_t;

/* A peer's allocation mapped here (CUDA IPC), kept for the next ops. */
typedef struct gipc {
    mjob_t unmap; /* its close, made ready: evicting it needs no memory */
    int peer;     /* world rank */
    gpu_ipc_t h;
    void *base;
    int busy;      /* ops using it now */
    uint64_t used; /* for eviction */
} gipc_t;

/* The IPC path's gate: a pointer table (tab[0]: skip; tab[1 + 2q + w]:
 * member q's input (w 0) or output (1)) and the flag its stream waits on
 * before copying the table to the device, where the op's kernels read it.
 * A stream of its own: work queued behind a closed gate waits for the
 * op's vote, and the staged path's copies on cohort's stream must not (an
 * op ordered after a staged one through the caller's stream would wait
 * for itself). Reused once the stream got past the event recorded after
 * the kernels: a flag reset before the stream reached its wait would hold
 * the stream for good. */
typedef struct ggate {
    struct ggate *next;
    char *host;     /* pinned: the flag (uint32_t), then the table at GATE_TAB */
    uint64_t *dtab; /* device */
    void *stream;
    void *ev;
    int dev;
    size_t cap; /* table entries */
    bool busy;  /* an op holds it */
    bool armed; /* ev recorded after its work: free once that completes */
} ggate_t;

#define GATE_TAB 64

struct rx_gpu {
    struct coh_ctx *ctx;
    const gpu_dev_t *dev;
    rx_reactor_t rx;
    bool started, handles;
    uv_timer_t timer;
    uv_idle_t idle;
    gop_t *ops; /* loop thread only */
    void *stream[GPU_MAX_DEV];
    _Atomic int kicked;
    rx_task_t kick_task;
    uint64_t spin_until_ns; /* poll without pause until then (device events soon) */
    uint64_t lat_ns;        /* recent waits from an event's record to its completion seen */
    size_t chunk_bytes;
    bool ipc;      /* COHORT_GPU_IPC and the runtime offers it */
    gipc_t **maps; /* loop thread only */
    int nmaps, capmaps;
    uint64_t uses;
    _Atomic uint64_t n_ops, n_ipc, staged, n_maps, n_unmapped; /* coh_stats_t's gpu_* */
    /* The mapper thread's queue (under mu): jobs to do in order, the one
     * being done, and the opens done that the loop thread has not taken. */
    uv_thread_t mapper;
    bool mapper_on, mstop;
    uv_cond_t mcv;
    mjob_t *mq, **mq_tail, *mbusy, *mdone;
    int mqlen;       /* jobs queued (mu) */
    mjob_t *mfailed; /* opens that failed, not asked again (loop thread) */
    int nfailed;
    /* This rank's allocations that went through the IPC path (mu): an op
     * on others likely falls back to staging, so its slots are taken at
     * submission, where taking them cannot wait for a caller's pageable
     * copy (the loop thread could). */
    uint8_t seen[GPU_SEEN][GPU_IPC_BYTES];
    int nseen, seen_next;
    uv_mutex_t mu; /* the cache, the events, the flags */
    void *cache[GPU_CACHE];
    size_t cache_n[GPU_CACHE];
    void *events[GPU_EVENTS];
    int nevents;
    ggate_t *gates; /* (mu) */
    /* Gates queued and not open: the device may not be synchronized (a free
     * of pinned memory) until the loop opens them. A grave is released, and
     * a gate counted, under drain_mu: else a gate queued during the release
     * would hold the release, and the loop with it, for good. */
    _Atomic int closed;
    uv_mutex_t drain_mu;
    /* Releases that can block in the CUDA driver while a caller's stream
     * waits for an op (pinned frees synchronize the device): made on the
     * loop thread only once no op runs (graves_drain). */
    struct grave *graves;
    int ngraves, capgraves;
    /* coh_request_stream_wait: flag i (pinned, mapped) is waited on by a
     * stream; the slot is free again once set and the stream's event after
     * the wait (fw_ev[i]) has completed. */
    uint32_t *flags;
    rx_flagwait_t fw[GPU_FLAGS];
    void *fw_ev[GPU_FLAGS];
    uint8_t fw_state[GPU_FLAGS]; /* FW_FREE, FW_ARMING (until fw_ev is recorded), FW_ARMED */
};

enum { FW_FREE = 0, FW_ARMING, FW_ARMED };

typedef enum { GRAVE_HOST, GRAVE_EVENT, GRAVE_DEV } grave_kind;
typedef struct grave {
    grave_kind kind;
    void *p;
} grave_t;

static void grave_release(const gpu_dev_t *d, grave_kind k, void *p)
{
    if (k == GRAVE_HOST) d->host_free(p);
    if (k == GRAVE_EVENT) d->event_free(p);
    if (k == GRAVE_DEV) d->dev_free(p);
}

/* Any thread: release p once no op runs (at once if memory is short). */
static void grave_add(struct rx_gpu *g, grave_kind k, void *p)
{
    uv_mutex_lock(&g->mu);
    if (g->ngraves == g->capgraves) {
        int cap = g->capgraves ? g->capgraves * 2 : 16;
        grave_t *n = coh_realloc(g->graves, sizeof(*n) * (size_t)cap);
        if (n) {
            g->graves = n;
            g->capgraves = cap;
        }
    }
    bool kept = g->ngraves < g->capgraves;
    if (kept) g->graves[g->ngraves++] = (grave_t){k, p};
    uv_mutex_unlock(&g->mu);
    if (!kept) grave_release(g->dev, k, p);
}

/* Loop thread, no op running (or finalizing): the deferred releases. */
static void graves_drain(struct rx_gpu *g)
{
    for (bool any = true; any;) {
        uv_mutex_lock(&g->drain_mu);
        uv_mutex_lock(&g->mu);
        grave_t t = {0};
        any = g->ngraves > 0 && atomic_load(&g->closed) == 0;
        if (any) t = g->graves[--g->ngraves];
        uv_mutex_unlock(&g->mu);
        if (any) grave_release(g->dev, t.kind, t.p);
        uv_mutex_unlock(&g->drain_mu);
    }
}

/* ---- pinned staging, reused: pinning costs milliseconds ---- */

/* From the cache only (never waits in the driver), or NULL. */
static char *stage_cached(struct rx_gpu *g, size_t n, size_t *got)
{
    uv_mutex_lock(&g->mu);
    int best = -1;
    for (int i = 0; i < GPU_CACHE; i++)
        if (g->cache[i] && g->cache_n[i] >= n && (best < 0 || g->cache_n[i] < g->cache_n[best]))
            best = i;
    void *p = NULL;
    if (best >= 0) {
        p = g->cache[best];
        *got = g->cache_n[best];
        g->cache[best] = NULL;
    }
    uv_mutex_unlock(&g->mu);
    return p;
}

static char *stage_get(struct rx_gpu *g, size_t n, size_t *got)
{
    void *p = stage_cached(g, n, got);
    if (p) return p;
    if (g->dev->host_alloc(&p, n) < 0) return NULL;
    *got = n;
    return p;
}

static void stage_put(struct rx_gpu *g, char *p, size_t n)
{
    if (!p) return;
    uv_mutex_lock(&g->mu);
    int slot = -1;
    for (int i = 0; i < GPU_CACHE && slot < 0; i++)
        if (!g->cache[i]) slot = i;
    if (slot < 0) { /* full: drop the smallest if this one is larger */
        slot = 0;
        for (int i = 1; i < GPU_CACHE; i++)
            if (g->cache_n[i] < g->cache_n[slot]) slot = i;
        if (g->cache_n[slot] >= n) slot = -1;
    }
    void *drop = p;
    if (slot >= 0) {
        drop = g->cache[slot];
        g->cache[slot] = p;
        g->cache_n[slot] = n;
    }
    uv_mutex_unlock(&g->mu);
    if (drop) grave_add(g, GRAVE_HOST, drop);
}

/* Events, reused: creating or destroying one waits for a lock of the CUDA
 * driver that a caller's thread may hold while it waits for an op
 * (gpu-lockprobe); what the pool cannot keep goes to the graves. */
static int ev_get(struct rx_gpu *g, void **e)
{
    uv_mutex_lock(&g->mu);
    *e = g->nevents ? g->events[--g->nevents] : NULL;
    uv_mutex_unlock(&g->mu);
    return *e ? 0 : g->dev->event_new(e);
}

static void ev_put(struct rx_gpu *g, void *e)
{
    if (!e) return;
    uv_mutex_lock(&g->mu);
    bool kept = g->nevents < GPU_EVENTS;
    if (kept) g->events[g->nevents++] = e;
    uv_mutex_unlock(&g->mu);
    if (!kept) grave_add(g, GRAVE_EVENT, e);
}

/* ---- the IPC path's gates ---- */

static uint32_t *gate_flag(const ggate_t *e)
{
    return (uint32_t *)(void *)e->host;
}

static uint64_t *gate_tab(const ggate_t *e)
{
    return (uint64_t *)(void *)(e->host + GATE_TAB);
}

static void gate_release(const gpu_dev_t *d, ggate_t *e)
{
    d->host_free(e->host);
    d->dev_free(e->dtab);
    if (e->ev) d->event_free(e->ev);
    if (e->stream) d->stream_free(e->stream);
    coh_free(e);
}

static void grave_add(struct rx_gpu *g, grave_kind k, void *p);

/* Caller's thread, dev current: a gate of n entries or more, its flag 0. */
static ggate_t *gate_get(struct rx_gpu *g, int dev, size_t n)
{
    uv_mutex_lock(&g->mu);
    ggate_t *e = g->gates;
    for (; e; e = e->next)
        if (!e->busy && e->dev == dev && e->cap >= n &&
            (!e->armed || g->dev->event_query(e->ev) == 1))
            break;
    if (e) e->busy = true, e->armed = false;
    uv_mutex_unlock(&g->mu);
    if (!e) {
        e = coh_zalloc(sizeof(*e));
        if (!e) return NULL;
        e->dev = dev;
        e->cap = n < 32 ? 32 : n; /* 15 members and fewer share sizes */
        e->busy = true;
        void *h = NULL, *d = NULL;
        int st = g->dev->host_alloc(&h, GATE_TAB + e->cap * sizeof(uint64_t));
        e->host = h;
        if (st == 0) st = g->dev->dev_alloc(&d, e->cap * sizeof(uint64_t));
        e->dtab = d;
        if (st == 0) st = g->dev->event_new(&e->ev);
        if (st == 0) st = g->dev->stream_new(&e->stream);
        if (st < 0) { /* frees can synchronize the device: other gates may be closed */
            if (e->host) grave_add(g, GRAVE_HOST, e->host);
            if (e->dtab) grave_add(g, GRAVE_DEV, e->dtab);
            if (e->ev) grave_add(g, GRAVE_EVENT, e->ev);
            coh_free(e);
            return NULL;
        }
        uv_mutex_lock(&g->mu);
        e->next = g->gates;
        g->gates = e;
        uv_mutex_unlock(&g->mu);
    }
    __atomic_store_n(gate_flag(e), 0u, __ATOMIC_RELAXED);
    return e;
}

/* Let the op's queued work go: with its table filled (go), or as no-ops.
 * Any thread that owns the op, once. */
static void gate_open(struct rx_gpu *g, gop_t *op, bool go)
{
    if (!op->gate || op->gate_open) return;
    gate_tab(op->gate)[0] = go ? 0 : 1;
    __atomic_store_n(gate_flag(op->gate), 1u, __ATOMIC_RELEASE);
    op->gate_open = true;
    atomic_fetch_sub(&g->closed, 1);
}

static void gate_put(struct rx_gpu *g, gop_t *op)
{
    if (!op->gate) return;
    gate_open(g, op, false);
    uv_mutex_lock(&g->mu);
    op->gate->busy = !op->gate->armed; /* never reused if unsure */
    uv_mutex_unlock(&g->mu);
    op->gate = NULL;
}

/* ---- chunks ---- */

/* Chunk k: its elements [*off, *off + *n) of the op's count (allreduce and
 * broadcast); the other kinds have one chunk, the whole op. */
static void chunk_range(const gop_t *op, size_t k, size_t *off, size_t *n)
{
    *off = k * op->chunk_elems;
    size_t left = op->a.count - *off;
    *n = left < op->chunk_elems ? left : op->chunk_elems;
}

/* The bytes a slot holds for one chunk. */
static size_t slot_need(const gop_t *op)
{
    size_t size = (size_t)op->comm->size;
    switch (op->a.kind) {
    case SC_ALLGATHER:
    case SC_REDUCE_SCATTER: return op->a.count * op->es * size;
    default: return op->chunk_elems * op->es;
    }
}

/* Staging slots 0..n-1 and their events, where missing: slots below npin
 * from the cache or pinned new (which fails the call), the others from
 * the cache only (staging goes through the slots it has). */
static int slots_take(struct rx_gpu *g, gop_t *op, int n, int npin)
{
    size_t need = slot_need(op);
    for (int i = 0; i < n; i++) {
        gslot_t *s = &op->slot[i];
        if (!s->host)
            s->host = i < npin ? stage_get(g, need ? need : 1, &s->bytes)
                               : stage_cached(g, need ? need : 1, &s->bytes);
        if (!s->host && i < npin) return COH_ENOMEM;
        int st = s->ev ? 0 : ev_get(g, &s->ev);
        if (st < 0) return st;
    }
    return 0;
}

/* Device work of n bytes was just queued: poll closely until it may be done. */
static void expect_soon(struct rx_gpu *g, size_t n)
{
    /* The window also covers what device events took lately: with several
     * processes on one GPU, a process's work waits for the GPU to switch
     * to its context (measured: about 1.2 ms), and polling that only on
     * the 1 ms timer made small ops take one more tick. */
    uint64_t learnt = 2 * g->lat_ns < GPU_SPIN_MAX ? 2 * g->lat_ns : GPU_SPIN_MAX;
    uint64_t t = bs_now_ns() + GPU_SPIN_NS + learnt + (uint64_t)((double)n / GPU_COPY_BPNS);
    if (t > g->spin_until_ns) g->spin_until_ns = t;
}

static void op_fail(gop_t *op, int st, const char *why)
{
    if (op->status < 0) return;
    op->status = st;
    snprintf(op->why, sizeof(op->why), "%s", why);
}

static void dev_fail(gop_t *op, const struct rx_gpu *g, const char *what)
{
    char why[BS_ERR_LEN];
    snprintf(why, sizeof(why), "%s: %s: %s", op->req->what, what, g->dev->last_error());
    op_fail(op, COH_EINTERNAL, why);
}

/* A staged path's copy on cohort's stream, counted (coh_stats_t's
 * gpu_staged_bytes) and expected soon by the poll. */
static int stage_copy(struct rx_gpu *g, const gop_t *op, void *dst, const void *src, size_t n)
{
    int r = g->dev->copy(dst, src, n, g->stream[op->dev]);
    if (r == 0) {
        atomic_fetch_add_explicit(&g->staged, n, memory_order_relaxed);
        expect_soon(g, n);
    }
    return r;
}

/* Issue the copy-out of chunk k into s (with its event). */
static int issue_out(struct rx_gpu *g, gop_t *op, gslot_t *s, size_t k)
{
    const char *src = op->a.sendbuf ? op->a.sendbuf : op->a.recvbuf;
    size_t off, n, rank = (size_t)op->comm->rank, es = op->es;
    int r = 0;
    switch (op->a.kind) {
    case SC_ALLREDUCE:
        chunk_range(op, k, &off, &n);
        r = stage_copy(g, op, s->host, src + off * es, n * es);
        break;
    case SC_BROADCAST: /* only the root has data to send */
        chunk_range(op, k, &off, &n);
        if (op->comm->rank == op->a.root)
            r = stage_copy(g, op, s->host, (char *)op->a.recvbuf + off * es, n * es);
        break;
    case SC_ALLGATHER:
        r = stage_copy(g, op, s->host + rank * op->a.count * es, op->a.sendbuf, op->a.count * es);
        break;
    case SC_REDUCE_SCATTER: /* the whole input: sendbuf, or recvbuf when in place */
        r = stage_copy(g, op, s->host, op->a.rs_in_place ? op->a.recvbuf : op->a.sendbuf,
                       op->a.count * es * (size_t)op->comm->size);
        break;
    default: r = COH_EINVAL;
    }
    if (r == 0) r = g->dev->event_record(s->ev, g->stream[op->dev]);
    s->t_ev = bs_now_ns();
    if (r < 0) return dev_fail(op, g, "copy to host"), r;
    expect_soon(g, 0); /* the event, also where nothing was copied */
    s->chunk = k;
    s->state = SLOT_OUT;
    return 0;
}

static void kick(void *arg);

/* The host collective of the chunk in s. */
static int issue_net(struct rx_gpu *g, gop_t *op, gslot_t *s)
{
    rx_coll_args_t a = op->a;
    a.on_done = kick;
    a.on_done_arg = g;
    size_t off, n;
    switch (a.kind) {
    case SC_ALLREDUCE:
    case SC_BROADCAST:
        chunk_range(op, s->chunk, &off, &n);
        a.sendbuf = NULL;
        a.recvbuf = s->host;
        a.count = n;
        break;
    case SC_ALLGATHER:
        a.recvbuf = s->host;
        a.sendbuf = s->host + (size_t)op->comm->rank * op->a.count * op->es;
        break;
    case SC_REDUCE_SCATTER:
        a.sendbuf = NULL;
        a.recvbuf = s->host;
        a.rs_in_place = true;
        break;
    default: return COH_EINVAL;
    }
    int st = rx_coll_submit(op->comm, &a, op->seq0 + s->chunk, &s->sub, op->req->what);
    if (st < 0) {
        op_fail(op, st, coh_last_error());
        return st;
    }
    s->state = SLOT_NET;
    return 0;
}

/* The chunk's collective ended: copy its result back. */
static int issue_in(struct rx_gpu *g, gop_t *op, gslot_t *s)
{
    size_t off, n, es = op->es, rank = (size_t)op->comm->rank;
    int r = 0;
    switch (op->a.kind) {
    case SC_ALLREDUCE:
        chunk_range(op, s->chunk, &off, &n);
        r = stage_copy(g, op, (char *)op->a.recvbuf + off * es, s->host, n * es);
        break;
    case SC_BROADCAST:
        chunk_range(op, s->chunk, &off, &n);
        if (op->comm->rank != op->a.root)
            r = stage_copy(g, op, (char *)op->a.recvbuf + off * es, s->host, n * es);
        break;
    case SC_ALLGATHER:
        r = stage_copy(g, op, op->a.recvbuf, s->host, op->a.count * es * (size_t)op->comm->size);
        break;
    case SC_REDUCE_SCATTER: {
        char *dst = (char *)op->a.recvbuf + (op->a.rs_in_place ? rank * op->a.count * es : 0);
        r = stage_copy(g, op, dst, s->host + rank * op->a.count * es, op->a.count * es);
        break;
    }
    default: r = COH_EINVAL;
    }
    if (r == 0) r = g->dev->event_record(s->ev, g->stream[op->dev]);
    s->t_ev = bs_now_ns();
    if (r < 0) return dev_fail(op, g, "copy to the device"), r;
    expect_soon(g, 0);
    s->state = SLOT_IN;
    return 0;
}

/* 1: ev (recorded at *t_ev) completed; 0: pending; < 0: the device
 * failed. */
static int ev_done(struct rx_gpu *g, gop_t *op, void *ev, uint64_t *t_ev)
{
    int q = g->dev->event_query(ev);
    if (q < 0) dev_fail(op, g, "event");
    if (q > 0 && *t_ev) { /* seen now: an average over the last few */
        uint64_t w = bs_now_ns() - *t_ev;
        g->lat_ns = g->lat_ns ? (g->lat_ns * 7 + w) / 8 : w;
        *t_ev = 0;
    }
    return q;
}

static int slot_event(struct rx_gpu *g, gop_t *op, gslot_t *s)
{
    return ev_done(g, op, s->ev, &s->t_ev);
}

/* Chunks never launched: their peers must not wait for them. */
static void abort_unlaunched(struct rx_gpu *g, gop_t *op, size_t k)
{
    if (op->told) return;
    char why[BS_ERR_LEN]; /* "aborted by rank r: ..." there, as the rails' aborts read */
    snprintf(why, sizeof(why), "rank %d: %s", g->ctx->rank, op->why);
    rx_comm_abort_seq(g->ctx, op->comm, op->seq0 + k, op->status < 0 ? op->status : COH_ESTATE, why,
                      -1);
}

/* Every number from next_out on: a local op's every number reserved, the
 * fallback's too (the peers may have staged it). */
static void abort_rest(struct rx_gpu *g, gop_t *op)
{
    size_t end = op->local ? 2 + op->staged_n : op->nchunks;
    for (size_t k = op->next_out; k < end; k++) abort_unlaunched(g, op, k);
}

static void advance_local(struct rx_gpu *g, gop_t *op, bool *devwait);

/* Move op as far as it goes now; *devwait: it waits for a device event. */
static void advance(struct rx_gpu *g, gop_t *op, bool *devwait)
{
    if (!op->started) {
        int q = g->dev->event_query(op->user_ev);
        if (q == 0) {
            *devwait = true;
            return;
        }
        if (q < 0) dev_fail(op, g, "the caller's stream");
        op->started = true;
    }
    if (g->dev->set_device(op->dev, NULL) < 0) dev_fail(op, g, "set device");
    if (op->local) {
        advance_local(g, op, devwait);
        if (op->local) return; /* else staged from here (fallback) */
    }
    for (bool again = true; again;) {
        again = false;
        for (int i = 0; i < GPU_SLOTS; i++) {
            gslot_t *s = &op->slot[i];
            int q;
            switch (s->state) {
            case SLOT_FREE:
                if (op->status < 0 || op->next_out >= op->nchunks || !s->host) break;
                if (issue_out(g, op, s, op->next_out) == 0) {
                    op->next_out++;
                    again = true;
                }
                break;
            case SLOT_OUT:
                q = slot_event(g, op, s);
                if (q == 0) {
                    *devwait = true;
                } else if (q > 0 && op->status == 0) {
                    if (issue_net(g, op, s) == 0) again = true;
                } else {
                    abort_unlaunched(g, op, s->chunk);
                    s->state = SLOT_FREE;
                    again = true;
                }
                break;
            case SLOT_NET:
                if (atomic_load(&s->sub->state) != RX_REQ_DONE) break;
                if (atomic_load(&s->sub->status) < 0)
                    op_fail(op, atomic_load(&s->sub->status), s->sub->err);
                coh_request_free(s->sub);
                s->sub = NULL;
                s->state = SLOT_FREE;
                if (op->status == 0) issue_in(g, op, s);
                again = true;
                break;
            case SLOT_IN:
                q = slot_event(g, op, s);
                if (q == 0) {
                    *devwait = true;
                } else {
                    if (q > 0) op->ndone++;
                    s->state = SLOT_FREE;
                    again = true;
                }
                break;
            }
        }
    }
}

/* ---- every member on this host: through each other's device memory ---- */

#define GPU_MAPS_KEEP 64 /* peers' allocations kept mapped when unused */

/* The mapping of peer's allocation h if this rank has it (held by the
 * caller then), else NULL. */
static gipc_t *map_find(struct rx_gpu *g, int peer, const gpu_ipc_t *h)
{
    for (int i = 0; i < g->nmaps; i++) {
        gipc_t *m = g->maps[i];
        if (m->peer == peer && m->h.pid == h->pid && m->h.size == h->size &&
            !memcmp(m->h.handle, h->handle, GPU_IPC_BYTES)) {
            m->busy++;
            m->used = ++g->uses;
            return m;
        }
    }
    return NULL;
}

static bool same_open(const mjob_t *j, int peer, const gpu_ipc_t *h)
{
    return j && !j->close && j->peer == peer && j->h.pid == h->pid &&
           !memcmp(j->h.handle, h->handle, GPU_IPC_BYTES);
}

#define GPU_MQ_MAX     256 /* opens queued at most: beyond, ops stay staged */
#define GPU_FAILED_MAX 64  /* failed opens remembered */

/* Under mu: was this rank's allocation h used through IPC before? */
static bool seen_has(const struct rx_gpu *g, const gpu_ipc_t *h)
{
    for (int i = 0; i < g->nseen; i++)
        if (!memcmp(g->seen[i], h->handle, GPU_IPC_BYTES)) return true;
    return false;
}

static void seen_add(struct rx_gpu *g, const gpu_ipc_t *h)
{
    uv_mutex_lock(&g->mu);
    if (!seen_has(g, h)) {
        memcpy(g->seen[g->seen_next], h->handle, GPU_IPC_BYTES);
        g->seen_next = (g->seen_next + 1) % GPU_SEEN;
        if (g->nseen < GPU_SEEN) g->nseen++;
    }
    uv_mutex_unlock(&g->mu);
}

static void mjob_push(struct rx_gpu *g, mjob_t *j)
{
    j->next = NULL;
    *g->mq_tail = j;
    g->mq_tail = &j->next;
    g->mqlen++;
    uv_cond_signal(&g->mcv);
}

/* Ask the mapper for peer's allocation h (once: not if asked already, nor
 * if it failed before; such buffers stay staged). Loop thread. */
static void map_want(struct rx_gpu *g, int peer, int dev, const gpu_ipc_t *h)
{
    for (mjob_t *j = g->mfailed; j; j = j->next)
        if (same_open(j, peer, h)) return;
    uv_mutex_lock(&g->mu);
    bool asked = same_open(g->mbusy, peer, h) || g->mqlen >= GPU_MQ_MAX;
    for (mjob_t *j = g->mq; j && !asked; j = j->next) asked = same_open(j, peer, h);
    for (mjob_t *j = g->mdone; j && !asked; j = j->next) asked = same_open(j, peer, h);
    mjob_t *j = asked || g->mstop ? NULL : coh_zalloc(sizeof(*j));
    if (j) {
        *j = (mjob_t){.peer = peer, .dev = dev, .h = *h};
        mjob_push(g, j);
    }
    uv_mutex_unlock(&g->mu);
}

/* Unmap base on the mapper thread, through job j (no allocation), which is
 * freed with owner there. */
static void map_drop(struct rx_gpu *g, mjob_t *j, void *base, void *owner)
{
    *j = (mjob_t){.close = true, .base = base, .owner = owner};
    uv_mutex_lock(&g->mu);
    bool queued = !g->mstop;
    if (queued) mjob_push(g, j);
    uv_mutex_unlock(&g->mu);
    if (!queued) { /* finalizing: no op runs */
        g->dev->ipc_close(base);
        coh_free(owner);
    }
}

/* Loop thread: take the mapper's new mappings into the cache, making room
 * (the least recently used unused ones beyond GPU_MAPS_KEEP go). */
static void maps_collect(struct rx_gpu *g)
{
    uv_mutex_lock(&g->mu);
    mjob_t *d = g->mdone;
    g->mdone = NULL;
    uv_mutex_unlock(&g->mu);
    while (d) {
        mjob_t *j = d;
        d = d->next;
        if (j->st < 0) { /* remembered (the oldest forgotten): not asked again */
            if (j->st != COH_ECANCELED)
                bs_log(COH_LOG_WARN,
                       "GPU: cannot map rank %d's device memory (%s): ops on it are staged",
                       j->peer, j->why);
            j->next = g->mfailed;
            g->mfailed = j;
            if (++g->nfailed > GPU_FAILED_MAX) {
                mjob_t **pp = &g->mfailed;
                while ((*pp)->next) pp = &(*pp)->next;
                coh_free(*pp);
                *pp = NULL;
                g->nfailed--;
            }
            continue;
        }
        if (g->nmaps >= GPU_MAPS_KEEP) {
            int lru = -1;
            for (int i = 0; i < g->nmaps; i++)
                if (!g->maps[i]->busy && (lru < 0 || g->maps[i]->used < g->maps[lru]->used))
                    lru = i;
            if (lru >= 0) {
                gipc_t *old = g->maps[lru];
                g->maps[lru] = g->maps[--g->nmaps];
                map_drop(g, &old->unmap, old->base, old);
            }
        }
        gipc_t *m = NULL;
        if (g->nmaps == g->capmaps) {
            int cap = g->capmaps ? g->capmaps * 2 : 16;
            gipc_t **nm = coh_realloc(g->maps, sizeof(*nm) * (size_t)cap);
            if (nm) {
                g->maps = nm;
                g->capmaps = cap;
            }
        }
        if (g->nmaps < g->capmaps) m = coh_zalloc(sizeof(*m));
        if (!m) { /* out of memory: the job itself unmaps it */
            map_drop(g, j, j->base, j);
            continue;
        }
        *m = (gipc_t){.peer = j->peer, .h = j->h, .base = j->base};
        g->maps[g->nmaps++] = m;
        atomic_fetch_add_explicit(&g->n_maps, 1, memory_order_relaxed);
        coh_free(j);
    }
}

/* The mapper thread: opens and closes mappings in order. Both wait while
 * any thread of the process synchronizes a stream (or a host function
 * runs): here that holds up no op, since an op only uses mappings already
 * made (the vote), and takes the staged path meanwhile. */
static void mapper_main(void *arg)
{
    struct rx_gpu *g = arg;
    uv_mutex_lock(&g->mu);
    for (;;) {
        while (!g->mq && !g->mstop) uv_cond_wait(&g->mcv, &g->mu);
        mjob_t *j = g->mq;
        if (!j) break; /* stopping, nothing left */
        g->mq = j->next;
        if (!g->mq) g->mq_tail = &g->mq;
        g->mqlen--;
        g->mbusy = j;
        bool stop = g->mstop;
        uv_mutex_unlock(&g->mu);
        if (j->close) {
            g->dev->ipc_close(j->base);
        } else if (stop) {
            j->st = COH_ECANCELED;
        } else {
            j->st = g->dev->set_device(j->dev, NULL);
            if (j->st == 0) j->st = g->dev->ipc_open(&j->h, &j->base);
            if (j->st < 0) snprintf(j->why, sizeof(j->why), "%s", g->dev->last_error());
        }
        uv_mutex_lock(&g->mu);
        g->mbusy = NULL;
        if (j->close) {
            coh_free(j->owner);
        } else {
            j->next = g->mdone;
            g->mdone = j;
        }
    }
    uv_mutex_unlock(&g->mu);
}

/* The op's input (which 0) or output (1) pointer on comm rank q. */
static char *lbuf(const gop_t *op, int q, int which)
{
    if (q == op->comm->rank) {
        const rx_coll_args_t *a = &op->a;
        if (which == 1 || a->kind == SC_BROADCAST) return a->recvbuf;
        if (a->kind == SC_REDUCE_SCATTER) return a->rs_in_place ? a->recvbuf : (char *)a->sendbuf;
        return a->sendbuf ? (char *)a->sendbuf : a->recvbuf;
    }
    const gipc_t *m = op->held[q * 2 + which];
    return (char *)m->base + op->tab[q * 2 + which].offset;
}

static int world_of(const coh_comm_t *c, int q)
{
    return c->ranks ? c->ranks[q] : q;
}

/* Operand (member q's input, which 0, or output, 1) + off bytes in the
 * gate's table. */
static gpu_ref_t ref(int q, int which, size_t off)
{
    return (gpu_ref_t){(uint32_t)(1 + 2 * q + which), off};
}

/* This member's output + dst_off = op over every member's input + off (n
 * elements), own first: the output may be this member's input there (the
 * reduction reads it first). */
static int reduce_all(struct rx_gpu *g, gop_t *op, size_t dst_off, size_t off, size_t n, void *st)
{
    int N = op->comm->size, me = op->comm->rank, r = 0;
    const rx_coll_args_t *a = &op->a;
    const uint64_t *t = op->gate->dtab;
    gpu_ref_t dst = ref(me, 1, dst_off);
    if (N == 1) {
        if (lbuf(op, me, 1) + dst_off != lbuf(op, me, 0) + off)
            r = g->dev->copy_ref(t, dst, ref(me, 0, off), n * op->es, st);
    } else {
        r = g->dev->reduce_ref(a->dtype, a->op, t, dst, ref(me, 0, off), ref((me + 1) % N, 0, off),
                               n, st);
        for (int k = 2; k < N && r == 0; k++)
            r = g->dev->reduce_ref(a->dtype, a->op, t, dst, dst, ref((me + k) % N, 0, off), n, st);
    }
    if (r == 0 && a->op == COH_AVG) r = g->dev->div_ref(a->dtype, t, dst, n, (double)N, st);
    return r;
}

/* Caller's thread, at submission: this member's part on the gate's
 * stream (ops are ordered by the callers' streams: an op's gate opens only
 * after its inputs are ready on every member), behind the gate
 * (its flag, then its table copied to the device), then the gate's
 * event (not a slot's: the staged fallback records those on cohort's
 * stream). Every member's pointers are read from the table when the
 * kernels run. */
static int issue_local(struct rx_gpu *g, gop_t *op)
{
    int N = op->comm->size, me = op->comm->rank, r = 0;
    const rx_coll_args_t *a = &op->a;
    size_t es = op->es, nt = 1 + 2 * (size_t)N;
    op->gate = gate_get(g, op->dev, nt);
    if (!op->gate) return COH_ENOMEM;
    ggate_t *e = op->gate;
    void *st = e->stream;
    const uint64_t *t = e->dtab;
    uv_mutex_lock(&g->drain_mu);
    atomic_fetch_add(&g->closed, 1);
    uv_mutex_unlock(&g->drain_mu);
    r = g->dev->wait_value(st, gate_flag(e), 1);
    if (r == 0) r = g->dev->copy_mapped(e->dtab, gate_tab(e), nt * sizeof(uint64_t), st);
    switch (r ? -1 : (int)a->kind) {
    case -1: break;
    case SC_ALLREDUCE: { /* reduce my shard, then write it into every output */
        size_t lo = a->count * (size_t)me / (size_t)N, hi = a->count * (size_t)(me + 1) / (size_t)N;
        if (hi > lo) r = reduce_all(g, op, lo * es, lo * es, hi - lo, st);
        for (int q = 0; q < N && r == 0 && hi > lo; q++)
            if (q != me)
                r = g->dev->copy_ref(t, ref(q, 1, lo * es), ref(me, 1, lo * es), (hi - lo) * es,
                                     st);
        break;
    }
    case SC_REDUCE_SCATTER: {
        size_t out = a->rs_in_place ? (size_t)me * a->count * es : 0;
        r = reduce_all(g, op, out, (size_t)me * a->count * es, a->count, st);
        break;
    }
    case SC_ALLGATHER: /* my block into every output */
        for (int q = 0; q < N && r == 0; q++) {
            size_t at = (size_t)me * a->count * es;
            if (q != me || lbuf(op, me, 1) + at != lbuf(op, me, 0))
                r = g->dev->copy_ref(t, ref(q, 1, at), ref(me, 0, 0), a->count * es, st);
        }
        break;
    case SC_BROADCAST: /* the root's buffer into mine */
        if (me != a->root)
            r = g->dev->copy_ref(t, ref(me, 1, 0), ref(a->root, 1, 0), a->count * es, st);
        break;
    default: r = COH_EINVAL;
    }
    uv_mutex_lock(&g->mu);
    if (r == 0) r = g->dev->event_record(e->ev, st);
    if (r == 0) e->armed = true;
    uv_mutex_unlock(&g->mu);
    return r;
}

/* The vote said go: every member's pointers into the table, and the
 * kernels queued at submission run. */
static void gate_go(struct rx_gpu *g, gop_t *op)
{
    uint64_t *t = gate_tab(op->gate);
    for (int q = 0; q < op->comm->size; q++)
        for (int w = 0; w < 2; w++) t[1 + 2 * q + w] = (uint64_t)(uintptr_t)lbuf(op, q, w);
    gate_open(g, op, true);
    op->slot[0].t_ev = bs_now_ns();
    expect_soon(g, op->a.count * op->es);
    op->ldev = true;
}

/* Launch reserved op number seq0 + k: the exchange (0), the vote (1) or
 * the barrier (2). */
static void launch_local(struct rx_gpu *g, gop_t *op, int k)
{
    rx_coll_args_t a = {.kind = SC_BARRIER, .on_done = kick, .on_done_arg = g};
    if (k == 1)
        a = (rx_coll_args_t){.kind = SC_ALLREDUCE,
                             .recvbuf = &op->vote,
                             .count = 1,
                             .dtype = COH_I32,
                             .op = COH_MAX,
                             .on_done = kick,
                             .on_done_arg = g};
    if (k == 0) {
        size_t n = 2 * sizeof(gpu_ipc_t);
        a = (rx_coll_args_t){.kind = SC_ALLGATHER,
                             .sendbuf = (char *)op->tab + (size_t)op->comm->rank * n,
                             .recvbuf = op->tab,
                             .count = n,
                             .dtype = COH_U8,
                             .on_done = kick,
                             .on_done_arg = g};
    }
    int st = rx_coll_submit(op->comm, &a, op->seq0 + (uint64_t)k, &op->lsub, op->req->what);
    if (st < 0) {
        op->lsub = NULL;
        op_fail(op, st, coh_last_error()); /* seq0 + k on is aborted at finish */
        return;
    }
    op->next_out = (size_t)k + 1;
}

/* Some member lacks a mapping of this op's buffers (the vote): the op is
 * staged instead, as op numbers seq0 + 2 on, reserved for this at
 * submission. Its slots were taken at submission: all when this rank's own
 * buffers were new (the likely case), else one and what the pinned cache
 * had. It stages through those; nothing is pinned here, which could wait
 * behind a caller's pageable copy (gpu-lockprobe). */
static void fallback(struct rx_gpu *g, gop_t *op)
{
    for (int i = 0; op->held && i < op->comm->size * 2; i++)
        if (op->held[i]) op->held[i]->busy--, op->held[i] = NULL;
    op->local = false;
    op->fallback = true;
    op->seq0 += 2;
    op->nchunks = op->staged_n;
    op->next_out = op->ndone = 0;
    int nslots = op->nchunks < GPU_SLOTS ? (int)op->nchunks : GPU_SLOTS;
    /* Slot 0 and the events were taken at submission (else the op failed
     * there); the others only from the cache: pinning here could wait for a
     * caller's pageable copy ordered after this op. */
    if (op->status == 0 && slots_take(g, op, nslots, 1) < 0) dev_fail(op, g, "staging slots");
}

/* The local op as far as it goes (it has started). */
static void advance_local(struct rx_gpu *g, gop_t *op, bool *devwait)
{
    int N = op->comm->size, me = op->comm->rank;
    if (op->next_out == 0 && op->status == 0) {
        launch_local(g, op, 0); /* my handles (taken at submission) for the others */
        return;
    }
    if (op->lsub) {
        if (atomic_load(&op->lsub->state) != RX_REQ_DONE) return;
        if (atomic_load(&op->lsub->status) < 0)
            op_fail(op, atomic_load(&op->lsub->status), op->lsub->err);
        coh_request_free(op->lsub);
        op->lsub = NULL;
        if (op->status < 0) return;
        op->ndone++;
        if (op->ndone == 1) {
            /* The handles are in: does this rank have the peers' memory
             * mapped? What it lacks, the mapper maps for later ops. */
            int32_t miss = 0;
            for (int q = 0; q < N; q++)
                for (int w = 0; w < 2 && q != me; w++) {
                    int peer = world_of(op->comm, q);
                    gipc_t *m = map_find(g, peer, &op->tab[q * 2 + w]);
                    op->held[q * 2 + w] = m;
                    if (!m) {
                        miss = 1;
                        map_want(g, peer, op->dev, &op->tab[q * 2 + w]);
                    }
                }
            op->vote = miss;
            launch_local(g, op, 1);
            return;
        }
        if (op->ndone == 3) return;  /* the barrier: done */
        if (op->vote) {              /* the vote's maximum: somebody lacks a mapping */
            gate_open(g, op, false); /* the kernels pass as no-ops */
            fallback(g, op);
            return;
        }
        gate_go(g, op);
    }
    if (op->ldev) {
        int q = ev_done(g, op, op->gate->ev, &op->slot[0].t_ev);
        if (q == 0) {
            *devwait = true;
            return;
        }
        op->ldev = false;
        if (q > 0 && op->status == 0) launch_local(g, op, 2);
    }
}

static bool op_busy(const gop_t *op)
{
    if (op->lsub || op->ldev) return true;
    for (int i = 0; i < GPU_SLOTS; i++)
        if (op->slot[i].state != SLOT_FREE) return true;
    return false;
}

static void op_free(struct rx_gpu *g, gop_t *op)
{
    gate_put(g, op);
    for (int i = 0; i < GPU_SLOTS; i++) {
        stage_put(g, op->slot[i].host, op->slot[i].bytes);
        ev_put(g, op->slot[i].ev);
        if (op->slot[i].sub) coh_request_free(op->slot[i].sub);
    }
    ev_put(g, op->user_ev);
    if (op->lsub) coh_request_free(op->lsub);
    for (int i = 0; op->held && i < op->comm->size * 2; i++)
        if (op->held[i]) op->held[i]->busy--;
    coh_free(op->held);
    coh_free(op->tab);
    coh_free(op);
}

/* The op ended (all chunks in, or failed and nothing in flight). */
static void finish(struct rx_gpu *g, gop_t *op)
{
    if (op->status == 0 && op->ndone < op->nchunks)
        op_fail(op, COH_EINTERNAL, "device op ended with chunks missing");
    if (op->status < 0) {
        abort_rest(g, op);
        rx_request_set_error(op->req, op->status, op->why);
    }
    if (op->status == 0) {
        atomic_fetch_add_explicit(&g->n_ops, 1, memory_order_relaxed);
        if (op->local) {
            atomic_fetch_add_explicit(&g->n_ipc, 1, memory_order_relaxed);
            seen_add(g, &op->tab[op->comm->rank * 2]);
            seen_add(g, &op->tab[op->comm->rank * 2 + 1]);
        }
        if (op->fallback) atomic_fetch_add_explicit(&g->n_unmapped, 1, memory_order_relaxed);
    }
    /* Complete first: a stream ordered after the op goes on, and a caller
     * waiting behind it releases whatever driver lock it holds before the
     * op's resources go back. */
    rx_request_complete(op->req);
    op->req = NULL;
    op_free(g, op);
}

static void arm(struct rx_gpu *g, bool devwait);

/* Loop thread: every op as far as it goes. */
static void run_all(struct rx_gpu *g)
{
    bool devwait = false;
    if (g->mapper_on) maps_collect(g);
    for (gop_t **pp = &g->ops; *pp;) {
        gop_t *op = *pp;
        advance(g, op, &devwait);
        bool over = op->started && !op_busy(op) && (op->status < 0 || op->ndone == op->nchunks);
        if (over) {
            *pp = op->next;
            finish(g, op);
        } else {
            pp = &op->next;
        }
    }
    /* A grave's free may synchronize the device: graves_drain stops while
     * a gate that only this loop opens is closed (an op submitted, not yet
     * posted here). */
    if (!g->ops) graves_drain(g);
    arm(g, devwait);
}

static void on_timer(uv_timer_t *t)
{
    run_all(t->data);
}

static void on_idle(uv_idle_t *h)
{
    run_all(h->data);
    sched_yield(); /* whatever does the device's work may need this core */
}

static void arm(struct rx_gpu *g, bool devwait)
{
    if (!g->handles) return;
    if (!g->ops) {
        uv_idle_stop(&g->idle);
        uv_timer_stop(&g->timer);
        return;
    }
    if (devwait && bs_now_ns() < g->spin_until_ns)
        uv_idle_start(&g->idle, on_idle);
    else
        uv_idle_stop(&g->idle);
    if (!uv_is_active((uv_handle_t *)&g->timer)) uv_timer_start(&g->timer, on_timer, 1, 1);
}

static void kick_run(rx_task_t *t, rx_reactor_t *rx)
{
    struct rx_gpu *g = rx->owner;
    atomic_store(&g->kicked, 0);
    run_all(g);
}

/* Any thread: a chunk's host collective completed. */
static void kick(void *arg)
{
    struct rx_gpu *g = arg;
    if (atomic_exchange(&g->kicked, 1)) return;
    g->kick_task.run = kick_run;
    if (!rx_reactor_post(&g->rx, &g->kick_task)) atomic_store(&g->kicked, 0);
}

static void submit_run(rx_task_t *t, rx_reactor_t *rx)
{
    struct rx_gpu *g = rx->owner;
    gop_t *op = (gop_t *)t;
    op->next = g->ops;
    g->ops = op;
    expect_soon(g, 0); /* its caller's stream may be there already */
    run_all(g);
}

static int start_handles(rx_reactor_t *rx, void *arg)
{
    struct rx_gpu *g = arg;
    uv_timer_init(&rx->loop, &g->timer);
    uv_idle_init(&rx->loop, &g->idle);
    g->timer.data = g->idle.data = g;
    g->handles = true;
    return 0;
}

static void fail_ops(struct rx_gpu *g);

static void gpu_on_stop(rx_reactor_t *rx)
{
    struct rx_gpu *g = rx->owner;
    /* Ops posted after fail_all_fn ran (the reactor runs what was queued
     * before it stops): their gates would stay closed. */
    if (g->ops) fail_ops(g);
    if (!g->handles) return;
    uv_close((uv_handle_t *)&g->timer, NULL);
    uv_close((uv_handle_t *)&g->idle, NULL);
    g->handles = false;
}

/* ---- the context's side ---- */

int rx_gpu_init(struct coh_ctx *ctx)
{
    const char *mode = NULL, *why = NULL;
    BS_CHECK(rx_env_knob_str("gpu", &mode));
    size_t chunk = 0;
    BS_CHECK(rx_env_knob_size("gpu_chunk_bytes", &chunk));
    int ipc = 1;
    BS_CHECK(rx_env_knob_int("gpu_ipc", &ipc));
    if (strcmp(mode, "auto") && strcmp(mode, "cuda") && strcmp(mode, "host") && strcmp(mode, "off"))
        return bs_fail(COH_EINVAL, "coh_init: COHORT_GPU must be auto, cuda, host or off (%s)",
                       mode);
    const gpu_dev_t *dev = gpu_dev_pick(mode, &why);
    if (!dev && !strcmp(mode, "cuda")) return bs_fail(COH_EUNSUPPORTED, "coh_init: %s", why);
    if (!dev) return 0; /* no device runtime: every pointer is host memory */
    struct rx_gpu *g = coh_zalloc(sizeof(*g));
    if (!g) return bs_fail(COH_ENOMEM, "coh_init: out of memory");
    g->ctx = ctx;
    g->dev = dev;
    g->chunk_bytes = chunk;
    g->ipc = ipc && dev->ipc_get && dev->ipc_open && dev->ipc_close;
    uv_mutex_init(&g->mu);
    uv_mutex_init(&g->drain_mu);
    uv_cond_init(&g->mcv);
    g->mq_tail = &g->mq;
    if (g->ipc) {
        if (uv_thread_create(&g->mapper, mapper_main, g) == 0)
            g->mapper_on = true;
        else /* staged, as with COHORT_GPU_IPC=0 */
            g->ipc = false;
    }
    int st = rx_reactor_start(&g->rx, "cohort-gpu", gpu_on_stop, g);
    if (st == 0) {
        g->started = true;
        st = rx_reactor_call(&g->rx, start_handles, g);
    }
    ctx->gpu = g;
    if (st < 0) return bs_fail(st, "coh_init: the GPU reactor: %s", coh_last_error());
    return 0;
}

/* Fail every op, once its device work has ended: gates open first (else
 * the syncs hang), then cohort's streams (copies into slots) and the
 * gates' (kernels that were let go) synchronized. */
static void fail_ops(struct rx_gpu *g)
{
    for (gop_t *op = g->ops; op; op = op->next) gate_open(g, op, false);
    for (gop_t *op = g->ops; op; op = op->next)
        if (op->gate) g->dev->stream_sync(op->gate->stream);
    for (int d = 0; d < GPU_MAX_DEV; d++)
        if (g->stream[d]) g->dev->stream_sync(g->stream[d]);
    while (g->ops) {
        gop_t *op = g->ops;
        g->ops = op->next;
        for (int i = 0; i < GPU_SLOTS; i++) /* the rails have stopped: every sub-op ended */
            op->slot[i].state = SLOT_FREE;
        op_fail(op, COH_ECANCELED, "the context was finalized while the device op ran");
        finish(g, op);
    }
}

/* Finalize, before the rails close: every op fails, and the peers hear now,
 * while the rails still carry ABORT, of each number it will not launch
 * (chunks not yet copied out or not yet handed to the rails; a local op's
 * vote and barrier). Told after the rails had closed, they never heard:
 * their op waited for this rank until its timeout (5 min), and the
 * coordinator's rank waited as long in finalize for them to leave. The ops
 * end at rx_gpu_stop, once the rails have cancelled what runs on them. */
static int abort_all_fn(rx_reactor_t *rx, void *arg)
{
    (void)rx;
    struct rx_gpu *g = arg;
    for (gop_t *op = g->ops; op; op = op->next) {
        op_fail(op, COH_ECANCELED, "the context was finalized while the device op ran");
        if (!op->local) /* staged: chunks copied out, not yet on the rails */
            for (int i = 0; i < GPU_SLOTS; i++)
                if (op->slot[i].state == SLOT_OUT) abort_unlaunched(g, op, op->slot[i].chunk);
        abort_rest(g, op);
        op->told = true;
    }
    return 0;
}

void rx_gpu_finalizing(struct coh_ctx *ctx)
{
    struct rx_gpu *g = ctx->gpu;
    if (g && g->started) rx_reactor_call(&g->rx, abort_all_fn, g);
}

static int fail_all_fn(rx_reactor_t *rx, void *arg)
{
    struct rx_gpu *g = arg;
    fail_ops(g);
    arm(g, false);
    return 0;
}

void rx_gpu_stop(struct coh_ctx *ctx)
{
    struct rx_gpu *g = ctx->gpu;
    if (!g || !g->started) return;
    rx_reactor_call(&g->rx, fail_all_fn, g);
    rx_reactor_stop(&g->rx);
    g->started = false;
}

void rx_gpu_fini(struct coh_ctx *ctx)
{
    struct rx_gpu *g = ctx->gpu;
    if (!g) return;
    rx_gpu_stop(ctx);
    rx_reactor_fini(&g->rx);
    if (g->mapper_on) { /* it closes what it was asked to, opens nothing more */
        uv_mutex_lock(&g->mu);
        g->mstop = true;
        uv_cond_signal(&g->mcv);
        uv_mutex_unlock(&g->mu);
        uv_thread_join(&g->mapper);
        g->mapper_on = false;
    }
    for (mjob_t *j = g->mdone; j;) {
        mjob_t *next = j->next;
        if (j->st == 0) g->dev->ipc_close(j->base);
        coh_free(j);
        j = next;
    }
    for (mjob_t *j = g->mfailed; j;) {
        mjob_t *next = j->next;
        coh_free(j);
        j = next;
    }
    for (int d = 0; d < GPU_MAX_DEV; d++)
        if (g->stream[d]) g->dev->stream_free(g->stream[d]);
    for (int i = 0; i < GPU_CACHE; i++)
        if (g->cache[i]) g->dev->host_free(g->cache[i]);
    graves_drain(g);
    coh_free(g->graves);
    for (int i = 0; i < g->nevents; i++) g->dev->event_free(g->events[i]);
    while (g->gates) { /* kept (not freed) if a stream may still read one */
        ggate_t *e = g->gates;
        g->gates = e->next;
        if (!e->busy && (!e->armed || g->dev->event_query(e->ev) == 1))
            gate_release(g->dev, e);
        else if (e->stream)
            g->dev->stream_free(e->stream);
    }
    /* The flags stay if a stream has not got past one yet (it reads them). */
    bool passed = true;
    for (int i = 0; i < GPU_FLAGS; i++) {
        if (g->fw_state[i] != FW_FREE &&
            (g->fw_state[i] != FW_ARMED || g->dev->event_query(g->fw_ev[i]) != 1))
            passed = false;
        if (g->fw_ev[i]) g->dev->event_free(g->fw_ev[i]);
    }
    if (passed && g->flags) g->dev->host_free(g->flags);
    for (int i = 0; i < g->nmaps; i++) {
        g->dev->ipc_close(g->maps[i]->base);
        coh_free(g->maps[i]);
    }
    coh_free(g->maps);
    uv_cond_destroy(&g->mcv);
    uv_mutex_destroy(&g->mu);
    uv_mutex_destroy(&g->drain_mu);
    coh_free(g);
    ctx->gpu = NULL;
}

int rx_gpu_where(struct coh_ctx *ctx, int mem, const void *a, const void *b, int *dev,
                 const char *fn)
{
    *dev = 0;
    if (mem == COH_MEM_HOST) return 0;
    if (mem != COH_MEM_AUTO && mem != COH_MEM_DEVICE)
        return bs_fail(COH_EINVAL, "%s: mem must be COH_MEM_AUTO, _HOST or _DEVICE (%d)", fn, mem);
    struct rx_gpu *g = ctx->gpu;
    if (!g) {
        if (mem == COH_MEM_DEVICE)
            return bs_fail(COH_EUNSUPPORTED,
                           "%s: device buffers, but no device runtime "
                           "(COHORT_GPU; docs/gpu.md)",
                           fn);
        return 0;
    }
    int da = 0, db = 0;
    int ia = a ? g->dev->is_device(a, &da) : 0, ib = b ? g->dev->is_device(b, &db) : 0;
    if (ia < 0 || ib < 0) return bs_fail(COH_EINVAL, "%s: %s", fn, g->dev->last_error());
    if (mem == COH_MEM_DEVICE || ia || ib) {
        if (ia && ib && da != db)
            return bs_fail(COH_EINVAL, "%s: the buffers are on devices %d and %d", fn, da, db);
        *dev = ia ? da : db;
        if (*dev < 0 || *dev >= GPU_MAX_DEV)
            return bs_fail(COH_EUNSUPPORTED, "%s: device %d (at most %d)", fn, *dev, GPU_MAX_DEV);
        return 1;
    }
    return 0;
}

void rx_gpu_stats(struct coh_ctx *ctx, coh_stats_t *s)
{
    struct rx_gpu *g = ctx->gpu;
    if (!g) return;
    s->gpu_ops = atomic_load_explicit(&g->n_ops, memory_order_relaxed);
    s->gpu_ops_ipc = atomic_load_explicit(&g->n_ipc, memory_order_relaxed);
    s->gpu_staged_bytes = atomic_load_explicit(&g->staged, memory_order_relaxed);
    s->gpu_ipc_maps = atomic_load_explicit(&g->n_maps, memory_order_relaxed);
    s->gpu_ops_unmapped = atomic_load_explicit(&g->n_unmapped, memory_order_relaxed);
}

const char *rx_gpu_name(const struct coh_ctx *ctx)
{
    return ctx->gpu ? ctx->gpu->dev->name : NULL;
}

/* Is every member of c on this host? (The same answer on every member.) */
static bool all_here(const struct coh_ctx *ctx, const coh_comm_t *c)
{
    for (int q = 0; q < c->size; q++) {
        int w = world_of(c, q);
        if (w != ctx->rank && !ctx->same_host[w]) return false;
    }
    return true;
}

int rx_gpu_host_only(struct coh_ctx *ctx, const void *a, const void *b, const char *fn)
{
    struct rx_gpu *g = ctx->gpu;
    if (!g) return 0;
    if ((a && g->dev->is_device(a, NULL) > 0) || (b && g->dev->is_device(b, NULL) > 0))
        return bs_fail(COH_EUNSUPPORTED, "%s: takes host buffers only (docs/gpu.md)", fn);
    return 0;
}

int rx_gpu_submit(coh_comm_t *comm, const rx_coll_args_t *a, void *stream, int dev,
                  coh_request_t **out, const char *fn)
{
    struct coh_ctx *ctx = comm->ctx;
    struct rx_gpu *g = ctx->gpu;
    if (a->loss[SC_STAGE_PUSH] > 0 || a->loss[SC_STAGE_PULL] > 0)
        return bs_fail(COH_EUNSUPPORTED, "%s: a loss bound on device buffers", fn);
    gop_t *op = coh_zalloc(sizeof(*op));
    if (!op) return bs_fail(COH_ENOMEM, "%s: out of memory", fn);
    op->comm = comm;
    op->a = *a;
    op->dev = dev;
    op->es = coh_dtype_size(a->dtype);
    op->local = g->ipc && all_here(ctx, comm);
    size_t ce = g->chunk_bytes / op->es;
    op->chunk_elems = ce ? ce : 1;
    bool chunked = a->kind == SC_ALLREDUCE || a->kind == SC_BROADCAST;
    if (!chunked || a->count <= op->chunk_elems) op->chunk_elems = a->count ? a->count : 1;
    op->nchunks = chunked && a->count ? (a->count + op->chunk_elems - 1) / op->chunk_elems : 1;
    op->staged_n = op->nchunks;
    if (op->local) op->nchunks = 3; /* the exchange, the vote, the barrier */
    /* On the caller's thread: its current device is put back afterwards. */
    int prev = -1;
    int st = g->dev->set_device(dev, &prev);
    /* cohort's stream on this device, made on first use here rather than on
     * the loop thread, where making it could wait for the driver's lock. */
    /* Not under mu: making it can wait for the driver's lock, which a
     * caller's pageable copy may hold until an op ends that the loop,
     * needing mu, would end. */
    uv_mutex_lock(&g->mu);
    bool have = g->stream[dev] != NULL;
    uv_mutex_unlock(&g->mu);
    if (st == 0 && !have) {
        void *made = NULL;
        st = g->dev->stream_new(&made);
        uv_mutex_lock(&g->mu);
        if (st == 0 && !g->stream[dev]) g->stream[dev] = made, made = NULL;
        uv_mutex_unlock(&g->mu);
        if (made) g->dev->stream_free(made); /* another thread's came first */
    }
    if (st == 0) st = ev_get(g, &op->user_ev);
    if (st == 0) st = g->dev->event_record(op->user_ev, stream);
    int nslots = op->nchunks < GPU_SLOTS ? (int)op->nchunks : GPU_SLOTS;
    if (op->local) {
        op->tab = coh_calloc((size_t)comm->size * 2, sizeof(gpu_ipc_t));
        op->held = coh_calloc((size_t)comm->size * 2, sizeof(gipc_t *));
        if (!op->tab || !op->held) st = COH_ENOMEM;
        /* My input's and output's handles, for the others: on the caller's
         * thread, whose context holds the memory. */
        gpu_ipc_t *mine = op->tab ? op->tab + comm->rank * 2 : NULL;
        if (st == 0 && (g->dev->ipc_get(lbuf(op, comm->rank, 0), &mine[0]) < 0 ||
                        g->dev->ipc_get(a->recvbuf, &mine[1]) < 0)) {
            char why[BS_ERR_LEN];
            snprintf(why, sizeof(why), "%s", g->dev->last_error());
            if (prev >= 0 && prev != dev) g->dev->set_device(prev, NULL);
            op_free(g, op);
            return bs_fail(COH_EUNSUPPORTED,
                           "%s: device memory that cannot be shared with the ranks on this host "
                           "(%s); COHORT_GPU_IPC=0 stages it through host memory",
                           fn, why);
        }
        /* Buffers of mine the peers never mapped: this op will be staged. */
        uv_mutex_lock(&g->mu);
        bool known = st == 0 && seen_has(g, &mine[0]) && seen_has(g, &mine[1]);
        uv_mutex_unlock(&g->mu);
        nslots = (int)(op->staged_n < GPU_SLOTS ? op->staged_n : GPU_SLOTS);
        /* The fallback's slots and events now, on this thread (pinning on
         * the loop could wait for this caller's pageable copy): all of them
         * when this op will be staged; when known (likely through IPC, but
         * staged if a peer's buffers are new) one, pinned if the cache has
         * none, and the others if the cache has them. */
        if (st == 0) st = slots_take(g, op, nslots, known ? 1 : nslots);
        /* The kernels now, behind the gate: from the loop, a launch could
         * wait for this caller's next call, a copy into pageable memory
         * ordered after the op (gpu-lockprobe). */
        if (st == 0) st = issue_local(g, op);
    }
    if (st == 0 && !op->local) st = slots_take(g, op, nslots, nslots);
    if (prev >= 0 && prev != dev) g->dev->set_device(prev, NULL);
    op->req = st == 0 ? rx_request_new(ctx, 0) : NULL;
    if (st < 0 || !op->req) {
        char why[BS_ERR_LEN];
        snprintf(why, sizeof(why), "%s", g->dev->last_error());
        op_free(g, op);
        return bs_fail(st < 0 ? st : COH_ENOMEM, "%s: device op set-up: %s", fn, why);
    }
    op->req->what = sc_coll_kind_name(a->kind);
    op->req->bytes = (uint64_t)a->count * op->es;
    op->req->deferred = true; /* no slices for a waiter to drive */
    op->req->spin_us = 0;
    /* The chunks' numbers now, in the caller's order of submissions; a
     * local op's also for its staged fallback (after the exchange and the
     * vote). Numbers nobody launches cost nothing. */
    uint64_t nres = op->local ? 2 + op->staged_n : op->nchunks;
    op->seq0 = atomic_fetch_add(&comm->next_seq, nres);
    if (comm == &ctx->world_comm) rx_lb_reserve(ctx, op->seq0, nres);
    coh_request_t *req = op->req;
    op->task.run = submit_run;
    if (!rx_reactor_post(&g->rx, &op->task)) {
        op->req = NULL;
        op_free(g, op);
        rx_request_discard(req);
        return bs_fail(COH_ESTATE, "%s: the context is finalizing", fn);
    }
    *out = req;
    return 0;
}

/* A free flag slot (its flag 0), or NULL: *idx -1 none free, else the
 * device's error. */
static rx_flagwait_t *flag_get(struct rx_gpu *g, int *idx)
{
    /* The allocations outside mu: they can wait for the driver's lock,
     * which a caller's pageable copy may hold until an op ends that the
     * loop, needing mu, would end. */
    uv_mutex_lock(&g->mu);
    bool have = g->flags != NULL;
    uv_mutex_unlock(&g->mu);
    if (!have) {
        void *p = NULL;
        if (g->dev->host_alloc(&p, GPU_FLAGS * sizeof(uint32_t)) < 0) p = NULL;
        uv_mutex_lock(&g->mu);
        if (p && !g->flags) {
            g->flags = p, p = NULL;
            for (int i = 0; i < GPU_FLAGS; i++) g->fw[i].flag = &g->flags[i];
        }
        uv_mutex_unlock(&g->mu);
        if (p) grave_add(g, GRAVE_HOST, p); /* another thread's came first */
    }
    uv_mutex_lock(&g->mu);
    int got = -1;
    for (int i = 0; g->flags && i < GPU_FLAGS && got < 0; i++) {
        /* Armed (its event recorded after the wait), set, and its stream got
         * past it. A slot still arming may be set already while its event
         * holds an older record: it is not free yet. */
        if (g->fw_state[i] == FW_ARMED && __atomic_load_n(&g->flags[i], __ATOMIC_ACQUIRE) &&
            g->dev->event_query(g->fw_ev[i]) == 1)
            g->fw_state[i] = FW_FREE;
        if (g->fw_state[i] == FW_FREE) got = i;
    }
    if (got >= 0) {
        g->fw_state[got] = FW_ARMING; /* this thread's until armed */
        g->fw[got].next = NULL;
        __atomic_store_n(&g->flags[got], 0u, __ATOMIC_RELAXED);
    }
    bool need_ev = got >= 0 && !g->fw_ev[got];
    uv_mutex_unlock(&g->mu);
    if (need_ev) {
        void *e = NULL;
        if (g->dev->event_new(&e) < 0) e = NULL;
        uv_mutex_lock(&g->mu);
        g->fw_ev[got] = e;
        if (!e) g->fw_state[got] = FW_FREE;
        uv_mutex_unlock(&g->mu);
        if (!e) got = -2; /* the device's error */
    }
    *idx = got;
    return got >= 0 ? &g->fw[got] : NULL;
}

COH_API int coh_request_stream_wait(coh_request_t *req, void *stream)
{
    if (!req) return bs_fail(COH_EINVAL, "coh_request_stream_wait: request is NULL");
    struct rx_gpu *g = req->ctx->gpu;
    if (atomic_load(&req->state) == RX_REQ_DONE) return 0; /* its data is in place */
    if (!g)
        return bs_fail(COH_EUNSUPPORTED, "coh_request_stream_wait: no device runtime (COHORT_GPU)");
    /* The stream waits on a flag in pinned memory that the request's
     * completion sets (cuStreamWaitValue32). Not a host function that
     * waits: CUDA forbids one to wait for other CUDA work, and it would
     * hold the runtime's callback thread meanwhile. */
    int i;
    rx_flagwait_t *w = flag_get(g, &i);
    if (!w)
        return bs_fail(COH_ENOMEM, "coh_request_stream_wait: %s",
                       g->flags && i == -1 ? "too many streams waiting for requests (1024)"
                                           : g->dev->last_error());
    int st = g->dev->wait_value(stream, w->flag, 1);
    if (st < 0) {
        uv_mutex_lock(&g->mu);
        g->fw_state[i] = FW_FREE;
        uv_mutex_unlock(&g->mu);
        return bs_fail(st, "coh_request_stream_wait: %s", g->dev->last_error());
    }
    /* Past this event the slot is the stream's no more. If it cannot be
     * recorded the slot stays arming, never reused (the device is failing). */
    if (g->dev->event_record(g->fw_ev[i], stream) == 0) {
        uv_mutex_lock(&g->mu);
        g->fw_state[i] = FW_ARMED;
        uv_mutex_unlock(&g->mu);
    }
    rx_flagwait_t *head = atomic_load(&req->flagwaits);
    do {
        if (head == RX_FLAGWAITS_CLOSED) { /* completed meanwhile */
            __atomic_store_n(w->flag, 1u, __ATOMIC_RELEASE);
            return 0;
        }
        w->next = head;
    } while (!atomic_compare_exchange_weak(&req->flagwaits, &head, w));
    return 0;
}

/* The context's device runtime into *d, or a failure naming fn. */
static int ctx_dev(coh_ctx_t *ctx, const char *fn, const gpu_dev_t **d)
{
    if (!ctx || !rx_ctx_alive(ctx)) return bs_fail(COH_EINVAL, "%s: not a live context", fn);
    if (!ctx->gpu)
        return bs_fail(COH_EUNSUPPORTED, "%s: no device runtime (COHORT_GPU; docs/gpu.md)", fn);
    *d = ctx->gpu->dev;
    return 0;
}

COH_API int coh_mem_alloc(coh_ctx_t *ctx, size_t bytes, void **ptr)
{
    const gpu_dev_t *d = NULL;
    BS_CHECK(ctx_dev(ctx, "coh_mem_alloc", &d));
    if (!ptr) return bs_fail(COH_EINVAL, "coh_mem_alloc: ptr is NULL");
    int st = d->dev_alloc(ptr, bytes);
    return st < 0 ? bs_fail(st, "coh_mem_alloc(%zu): %s", bytes, d->last_error()) : 0;
}

COH_API int coh_mem_free(coh_ctx_t *ctx, void *ptr)
{
    const gpu_dev_t *d = NULL;
    BS_CHECK(ctx_dev(ctx, "coh_mem_free", &d));
    d->dev_free(ptr);
    return 0;
}

COH_API int coh_mem_copy(coh_ctx_t *ctx, void *dst, const void *src, size_t bytes)
{
    const gpu_dev_t *d = NULL;
    BS_CHECK(ctx_dev(ctx, "coh_mem_copy", &d));
    int st = d->copy(dst, src, bytes, NULL);
    if (st == 0) st = d->stream_sync(NULL);
    return st < 0 ? bs_fail(st, "coh_mem_copy: %s", d->last_error()) : 0;
}
