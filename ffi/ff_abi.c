/*
 * The ABI entry points of include/cohort_ffi.h and the handle tables behind
 * them.
 *
 * Ownership: a context handle owns an ff_ctx_t (its coh_ctx_t, its request
 * table); a request handle owns one reference to an ff_op_t (the caller's
 * coh_request_t reference and the buffers the ABI allocated for inline
 * tensors). Every object is reference counted so that a thread blocked in
 * coh_ffi_wait keeps what it waits on alive while another thread destroys
 * the context; it dies when its last reference goes.
 *
 * Locks: the global context table has a mutex; each context has an rwlock
 * (read: calls that reach the coh_ctx_t, coh_wait included; write: destroy)
 * and a mutex for its request table. coh_wait runs in slices of at most
 * FF_WAIT_SLICE_MS under the read lock, because it may touch the context
 * after its request completed and coh_finalize frees the context right after
 * completing the requests: no thread may be inside coh_wait then. Destroy
 * first raises `closing`, so waiters leave at the end of their slice and
 * wait for the destroy to end; then they answer the (cancelled) request.
 */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <uv.h>

#include "cohort_ffi.h"
#include "ffi/ffi.h"
#include "reactor/reactor.h"

/* ---- handle tables ----
 * A handle is (generation << 32) | (slot + 1): 0 is never a handle, and a
 * slot reused after a release carries a new generation, so stale handles
 * miss instead of reaching the new occupant. */

#define FF_MAX_HANDLES (1u << 22)

typedef struct ff_slot {
    uint32_t gen;
    void *p;
} ff_slot_t;

typedef struct ff_table {
    ff_slot_t *slots;
    uint32_t *free; /* stack of free slot indices */
    uint32_t nslots, nfree;
} ff_table_t;

static int table_put(ff_table_t *t, void *p, uint64_t *h)
{
    if (t->nfree == 0) {
        uint32_t n = t->nslots ? t->nslots * 2 : 16;
        if (n > FF_MAX_HANDLES || n <= t->nslots) return COH_ENOMEM;
        ff_slot_t *s = coh_reallocn(t->slots, n, sizeof(*s));
        if (!s) return COH_ENOMEM;
        t->slots = s;
        uint32_t *f = coh_reallocn(t->free, n, sizeof(*f));
        if (!f) return COH_ENOMEM;
        t->free = f;
        memset(s + t->nslots, 0, (n - t->nslots) * sizeof(*s));
        for (uint32_t i = n; i > t->nslots; i--) t->free[t->nfree++] = i - 1;
        t->nslots = n;
    }
    uint32_t i = t->free[--t->nfree];
    ff_slot_t *s = &t->slots[i];
    s->gen = s->gen + 1 ? s->gen + 1 : 1;
    s->p = p;
    *h = ((uint64_t)s->gen << 32) | (uint64_t)(i + 1);
    return 0;
}

static void *table_get(const ff_table_t *t, uint64_t h)
{
    uint32_t i = (uint32_t)h, gen = (uint32_t)(h >> 32);
    if (i == 0 || i > t->nslots) return NULL;
    const ff_slot_t *s = &t->slots[i - 1];
    return s->p && s->gen == gen ? s->p : NULL;
}

static void *table_take(ff_table_t *t, uint64_t h)
{
    void *p = table_get(t, h);
    if (p) {
        t->slots[(uint32_t)h - 1].p = NULL;
        t->free[t->nfree++] = (uint32_t)h - 1;
    }
    return p;
}

static void table_fini(ff_table_t *t)
{
    coh_free(t->slots);
    coh_free(t->free);
    memset(t, 0, sizeof(*t));
}

/* ---- objects ---- */

typedef struct ff_op {
    _Atomic int refs;
    _Atomic(coh_request_t *) req; /* NULL until submitted */
    ff_type type;
    bool sched_group; /* a sync or a relay allreduce: coh_request_group describes it */
    bool lossy;       /* an allreduce with a loss bound: coh_request_loss describes it */
    bool has_id;
    int64_t id;
    int rank, size;
    double abi_us;
    void *owned[FF_NTENSORS]; /* copies of inline tensors and allocated outputs */
    size_t owned_n[FF_NTENSORS];
} ff_op_t;

#define FF_WAIT_SLICE_MS 50

typedef struct ff_ctx {
    _Atomic int refs;
    _Atomic int closing; /* destroy has begun: no new coh_* call on ctx */
    uv_rwlock_t api;
    uv_mutex_t mu;
    uv_cond_t gone; /* signalled (under mu) when destroyed turns true */
    bool destroyed;
    ff_table_t ops;
    coh_ctx_t *ctx; /* NULL once destroyed */
    coh_comm_t *world;
    int rank, size, nrails;
} ff_ctx_t;

static uv_once_t g_once = UV_ONCE_INIT;
static uv_mutex_t g_mu;
static ff_table_t g_ctxs;

/* Log messages captured for "logs" requests (the handler is process-wide). */
#define FF_LOG_RING 256
#define FF_LOG_MSG  256
static struct {
    int head, n;
    uint64_t dropped;
    struct {
        int level;
        char msg[FF_LOG_MSG];
    } e[FF_LOG_RING];
} g_log;

static void g_init(void)
{
    uv_mutex_init(&g_mu);
}

static void op_put(ff_op_t *op)
{
    if (!op || atomic_fetch_sub(&op->refs, 1) != 1) return;
    coh_request_free(atomic_load(&op->req));
    for (int t = 0; t < FF_NTENSORS; t++) coh_free(op->owned[t]);
    coh_free(op);
}

static ff_ctx_t *ctx_get(uint64_t h)
{
    uv_once(&g_once, g_init);
    uv_mutex_lock(&g_mu);
    ff_ctx_t *fc = table_get(&g_ctxs, h);
    if (fc) atomic_fetch_add(&fc->refs, 1);
    uv_mutex_unlock(&g_mu);
    return fc;
}

static void ctx_put(ff_ctx_t *fc)
{
    if (atomic_fetch_sub(&fc->refs, 1) != 1) return;
    /* Destroy dropped every op already; nothing else can reach fc now. */
    table_fini(&fc->ops);
    uv_rwlock_destroy(&fc->api);
    uv_cond_destroy(&fc->gone);
    uv_mutex_destroy(&fc->mu);
    coh_free(fc);
}

static int no_ctx(uint64_t h, ff_err_t *e)
{
    return ff_fail(e, COH_EINVAL, "context",
                   "context handle 0x%" PRIx64 " is not a live context (destroyed, or never "
                   "created)",
                   h);
}

/* Read-lock the context and check it still runs. */
static int api_enter(ff_ctx_t *fc, ff_err_t *e)
{
    uv_rwlock_rdlock(&fc->api);
    if (fc->ctx && !atomic_load(&fc->closing)) return 0;
    uv_rwlock_rdunlock(&fc->api);
    return ff_fail(e, COH_ESTATE, "context", "the context is being destroyed");
}

/* coh_wait(req, timeout_ms) in slices under the read lock (see the top of
 * this file). When the context is being destroyed, wait for the destroy to
 * end: then the request is complete (cancelled) and nothing touches it. */
static int ff_wait(ff_ctx_t *fc, coh_request_t *req, int timeout_ms)
{
    uint64_t deadline =
        timeout_ms < 0 ? UINT64_MAX : bs_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    for (;;) {
        int st = coh_request_status(req); /* reads the request only */
        if (st != COH_EAGAIN) return st;
        uint64_t now = bs_now_ns();
        if (now >= deadline && timeout_ms != 0) return COH_EAGAIN;
        int slice = FF_WAIT_SLICE_MS;
        if (deadline != UINT64_MAX && (deadline - now) / 1000000ull < (uint64_t)slice)
            slice = (int)((deadline - now) / 1000000ull);
        uv_rwlock_rdlock(&fc->api);
        if (!fc->ctx || atomic_load(&fc->closing)) {
            uv_rwlock_rdunlock(&fc->api);
            uv_mutex_lock(&fc->mu);
            while (!fc->destroyed) uv_cond_wait(&fc->gone, &fc->mu);
            uv_mutex_unlock(&fc->mu);
            return coh_request_status(req);
        }
        st = coh_wait(req, slice);
        uv_rwlock_rdunlock(&fc->api);
        if (st != COH_EAGAIN || timeout_ms == 0) return st;
    }
}

static double since_us(uint64_t t0)
{
    return (double)(bs_now_ns() - t0) / 1e3;
}

static int finish(ff_out_t *o, int st, void **resp, size_t *resp_len)
{
    if (!resp) {
        ff_out_fini(o);
        return st;
    }
    if (!o->ok) {
        ff_out_fini(o);
        *resp = NULL;
        if (resp_len) *resp_len = 0;
        return st < 0 ? st : COH_ENOMEM;
    }
    *resp = o->data;
    if (resp_len) *resp_len = o->len;
    return st;
}

COH_API void coh_ffi_free(void *resp)
{
    coh_free(resp);
}

/* ---- logs ---- */

static void log_cb(int level, const char *msg, void *arg)
{
    (void)arg;
    uv_mutex_lock(&g_mu);
    if (g_log.n == FF_LOG_RING) {
        g_log.head = (g_log.head + 1) % FF_LOG_RING;
        g_log.n--;
        g_log.dropped++;
    }
    int i = (g_log.head + g_log.n) % FF_LOG_RING;
    g_log.e[i].level = level;
    snprintf(g_log.e[i].msg, FF_LOG_MSG, "%s", msg);
    g_log.n++;
    uv_mutex_unlock(&g_mu);
}

/* "links": [{peer, rail, latency_us, gbps}, ...] (probe and stats). */
static void pack_links(msgpack_packer *pk, const coh_link_probe_t *links, int n)
{
    ff_pack_str(pk, "links");
    msgpack_pack_array(pk, (size_t)n);
    for (int i = 0; i < n; i++) {
        msgpack_pack_map(pk, 4);
        ff_pack_kv_int(pk, "peer", links[i].peer);
        ff_pack_kv_int(pk, "rail", links[i].rail);
        ff_pack_kv_double(pk, "latency_us", links[i].latency_us);
        ff_pack_kv_double(pk, "gbps", links[i].gbps);
    }
}

static void pack_logs(msgpack_packer *pk)
{
    uv_mutex_lock(&g_mu);
    ff_pack_str(pk, "logs");
    msgpack_pack_array(pk, (size_t)g_log.n);
    for (int k = 0; k < g_log.n; k++) {
        int i = (g_log.head + k) % FF_LOG_RING;
        msgpack_pack_array(pk, 2);
        msgpack_pack_int(pk, g_log.e[i].level);
        /* Messages are cut at a byte boundary: keep them valid UTF-8. */
        char m[FF_LOG_MSG];
        size_t n = strlen(g_log.e[i].msg);
        memcpy(m, g_log.e[i].msg, n + 1);
        for (size_t j = 0; j < n; j++)
            if ((unsigned char)m[j] >= 0x80 || (m[j] < 0x20 && m[j] != '\t')) m[j] = '?';
        ff_pack_str(pk, m);
    }
    ff_pack_kv_uint(pk, "dropped", g_log.dropped);
    g_log.n = 0;
    g_log.dropped = 0;
    uv_mutex_unlock(&g_mu);
}

/* ---- create / destroy ---- */

COH_API int coh_ffi_create(const void *config, size_t len, uint64_t *out, void **resp,
                           size_t *resp_len)
{
    uv_once(&g_once, g_init);
    ff_err_t e = {0};
    ff_config_t c;
    if (out) *out = 0;
    if (!out) {
        ff_fail(&e, COH_EINVAL, "", "coh_ffi_create: the ctx pointer is NULL");
        return ff_error_response(&e, -1, false, 0, resp, resp_len);
    }
    if (ff_decode_config(config, len, &c, &e) < 0)
        return ff_error_response(&e, -1, false, 0, resp, resp_len);
    if (c.log_level == -1) coh_set_log_handler(NULL, NULL, 0);
    if (c.log_level >= 0) coh_set_log_handler(log_cb, NULL, c.log_level);

    coh_ctx_t *ctx = NULL;
    int st = coh_init(&c.cfg, &ctx); /* copies the strings */
    ff_config_fini(&c);
    if (st < 0) {
        ff_fail(&e, st, "", "%s", coh_last_error());
        return ff_error_response(&e, -1, false, 0, resp, resp_len);
    }
    ff_ctx_t *fc = coh_zalloc(sizeof(*fc));
    if (!fc) {
        coh_finalize(ctx);
        ff_fail(&e, COH_ENOMEM, "", "coh_ffi_create: out of memory");
        return ff_error_response(&e, -1, false, 0, resp, resp_len);
    }
    atomic_init(&fc->refs, 1); /* the table's */
    uv_rwlock_init(&fc->api);
    uv_mutex_init(&fc->mu);
    uv_cond_init(&fc->gone);
    fc->ctx = ctx;
    coh_ctx_world(ctx, &fc->world);
    coh_comm_rank(fc->world, &fc->rank);
    coh_comm_size(fc->world, &fc->size);
    coh_ctx_nrails(ctx, &fc->nrails);
    uint64_t h = 0;
    uv_mutex_lock(&g_mu);
    st = table_put(&g_ctxs, fc, &h);
    uv_mutex_unlock(&g_mu);
    if (st < 0) {
        coh_finalize(ctx);
        fc->ctx = NULL;
        ctx_put(fc);
        ff_fail(&e, st, "", "coh_ffi_create: no room for another context handle");
        return ff_error_response(&e, -1, false, 0, resp, resp_len);
    }
    *out = h;
    ff_out_t o;
    msgpack_packer pk;
    ff_out_init(&o, &pk);
    ff_pack_head(&pk, 0, NULL, -1, false, 0, 7);
    ff_pack_kv_uint(&pk, "context", h);
    ff_pack_kv_int(&pk, "rank", fc->rank);
    ff_pack_kv_int(&pk, "size", fc->size);
    ff_pack_kv_int(&pk, "nrails", fc->nrails);
    ff_pack_kv_str(&pk, "describe", coh_ctx_describe(ctx));
    char ver[32];
    snprintf(ver, sizeof(ver), "%d.%d.%d", COH_VERSION_MAJOR, COH_VERSION_MINOR, COH_VERSION_PATCH);
    ff_pack_kv_str(&pk, "version", ver);
    ff_pack_kv_int(&pk, "schema", FF_SCHEMA);
    return finish(&o, 0, resp, resp_len);
}

COH_API int coh_ffi_destroy(uint64_t h, void **resp, size_t *resp_len)
{
    uv_once(&g_once, g_init);
    ff_err_t e = {0};
    uv_mutex_lock(&g_mu);
    ff_ctx_t *fc = table_take(&g_ctxs, h); /* the table's reference is ours now */
    uv_mutex_unlock(&g_mu);
    if (!fc) {
        no_ctx(h, &e);
        return ff_error_response(&e, -1, false, 0, resp, resp_len);
    }
    /* Waiters leave coh_wait within a slice, submissions end, then no thread
     * is inside the C API on this context while it is finalized. */
    atomic_store(&fc->closing, 1);
    uv_rwlock_wrlock(&fc->api);
    int st = coh_finalize(fc->ctx);
    fc->ctx = NULL;
    uv_rwlock_wrunlock(&fc->api);
    if (st < 0) ff_fail(&e, st, "", "%s", coh_last_error());
    /* Every request ended with the context; waiters still hold their own
     * references to what they wait on. */
    uv_mutex_lock(&fc->mu);
    for (uint32_t i = 0; i < fc->ops.nslots; i++) {
        op_put(fc->ops.slots[i].p);
        fc->ops.slots[i].p = NULL;
    }
    fc->destroyed = true;
    uv_cond_broadcast(&fc->gone);
    uv_mutex_unlock(&fc->mu);
    ctx_put(fc);
    if (st < 0) return ff_error_response(&e, -1, false, 0, resp, resp_len);
    ff_out_t o;
    msgpack_packer pk;
    ff_out_init(&o, &pk);
    ff_pack_head(&pk, 0, NULL, -1, false, 0, 0);
    return finish(&o, 0, resp, resp_len);
}

COH_API int coh_ffi_event_fd(uint64_t h, int *fd)
{
    ff_err_t e = {0};
    if (!fd) return bs_fail(COH_EINVAL, "coh_ffi_event_fd: fd is NULL");
    *fd = -1;
    ff_ctx_t *fc = ctx_get(h);
    if (!fc) return bs_fail(no_ctx(h, &e), "%s", e.msg);
    int st = api_enter(fc, &e);
    if (st == 0) {
        st = coh_ctx_event_fd(fc->ctx, fd);
        uv_rwlock_rdunlock(&fc->api);
    } else {
        bs_fail(st, "%s", e.msg);
    }
    ctx_put(fc);
    return st;
}

int ff_world_of(uint64_t h, coh_comm_t **world)
{
    ff_ctx_t *fc = ctx_get(h);
    if (!fc) return COH_EINVAL;
    *world = fc->ctx ? fc->world : NULL;
    ctx_put(fc);
    return *world ? 0 : COH_ESTATE;
}

/* ---- requests ---- */

/* The answer to a completed request. */
static int pack_done(const ff_op_t *op, void **resp, size_t *resp_len)
{
    coh_request_t *req = atomic_load(&op->req);
    int st = coh_request_status(req);
    ff_err_t e = {0};
    if (st < 0) ff_fail(&e, st, "", "%s", coh_request_error(req));
    double us = 0;
    coh_request_time_us(req, &us);
    uint32_t extra = 4;
    for (int t = 0; t < FF_NTENSORS; t++) extra += op->owned[t] && t != FF_T_SEND;
    /* A sync's (and a relay allreduce's) group is the scheduler's: who took
     * part, how long this rank waited for the group and how long the
     * exchange took; for relay groups, who relayed and what phase 2 did. */
    coh_group_info_t gi;
    bool sync_group = op->sched_group && st == 0 && coh_request_group(req, &gi) == 0;
    /* A bounded-loss allreduce: what its datagram receives missed. */
    coh_loss_info_t li;
    bool loss = op->lossy && st == 0 && coh_request_loss(req, &li) == 0;
    extra += loss;
    ff_out_t o;
    msgpack_packer pk;
    ff_out_init(&o, &pk);
    ff_pack_head(&pk, st, &e, op->type, op->has_id, op->id, extra);
    ff_pack_kv_bool(&pk, "done", true);
    ff_pack_kv_double(&pk, "time_us", us);
    ff_pack_kv_double(&pk, "abi_us", op->abi_us);
    ff_pack_str(&pk, "group");
    if (sync_group) {
        msgpack_pack_map(&pk, 15);
        ff_pack_kv_int(&pk, "rank", op->rank);
        ff_pack_kv_int(&pk, "size", gi.size);
        ff_pack_str(&pk, "members");
        msgpack_pack_array(&pk, gi.size > 0 ? (size_t)gi.size : 0);
        for (int i = 0; i < gi.size; i++) msgpack_pack_int(&pk, gi.members[i]);
        ff_pack_kv_bool(&pk, "full", gi.full != 0);
        ff_pack_kv_double(&pk, "total_weight", gi.total_weight);
        ff_pack_kv_double(&pk, "wait_us", gi.wait_us);
        ff_pack_kv_double(&pk, "comm_us", gi.comm_us);
        ff_pack_kv_uint(&pk, "group_id", gi.group_id);
        int nrelays = gi.relays && gi.nrelays > 0 ? gi.nrelays : 0;
        ff_pack_str(&pk, "relays");
        msgpack_pack_array(&pk, (size_t)nrelays);
        for (int i = 0; i < nrelays; i++) msgpack_pack_int(&pk, gi.relays[i]);
        ff_pack_kv_bool(&pk, "relayed", gi.relayed != 0);
        ff_pack_kv_int(&pk, "phase2", gi.phase2);
        ff_pack_kv_int(&pk, "phase2_method", gi.phase2_method);
        ff_pack_kv_int(&pk, "nexcluded", gi.nexcluded);
        ff_pack_kv_int(&pk, "nsegments", gi.nsegments);
        ff_pack_kv_int(&pk, "joined", gi.joined);
    } else {
        msgpack_pack_map(&pk, 2);
        ff_pack_kv_int(&pk, "rank", op->rank);
        ff_pack_kv_int(&pk, "size", op->size);
    }
    if (loss) {
        ff_pack_str(&pk, "loss");
        msgpack_pack_map(&pk, 6);
        ff_pack_kv_uint(&pk, "push_bytes", li.push_bytes);
        ff_pack_kv_uint(&pk, "push_lost_bytes", li.push_lost_bytes);
        ff_pack_kv_uint(&pk, "pull_bytes", li.pull_bytes);
        ff_pack_kv_uint(&pk, "pull_lost_bytes", li.pull_lost_bytes);
        ff_pack_kv_double(&pk, "push_lost", li.push_lost);
        ff_pack_kv_double(&pk, "pull_lost", li.pull_lost);
    }
    for (int t = 0; t < FF_NTENSORS; t++) {
        if (!op->owned[t] || t == FF_T_SEND) continue;
        ff_pack_str(&pk, ff_tensor_names[t]);
        msgpack_pack_bin(&pk, op->owned_n[t]);
        msgpack_pack_bin_body(&pk, op->owned[t], op->owned_n[t]);
    }
    return finish(&o, st, resp, resp_len);
}

/* The answer while a request runs: its handle. abi_us is read only once
 * op->req was seen (it is written before op->req is published). */
static int pack_pending(const ff_op_t *op, uint64_t h, int st, const ff_err_t *e, double abi_us,
                        void **resp, size_t *resp_len)
{
    ff_out_t o;
    msgpack_packer pk;
    ff_out_init(&o, &pk);
    ff_pack_head(&pk, st, e, op->type, op->has_id, op->id, 3);
    ff_pack_kv_bool(&pk, "done", false);
    ff_pack_kv_uint(&pk, "request", h);
    ff_pack_kv_double(&pk, "abi_us", abi_us);
    return finish(&o, st, resp, resp_len);
}

static void *tensor_copy(const ff_tensor_t *t, size_t n)
{
    void *p = coh_aligned(n ? n : 1, 64);
    if (p && t && t->kind == FF_TENSOR_INLINE && n) memcpy(p, t->data, n);
    if (p && !t && n) memset(p, 0, n);
    return p;
}

/* Resolve pointers (copying inline tensors) and call the C API. */
static int submit(ff_ctx_t *fc, const ff_req_t *r, const ff_shape_t *s, ff_op_t *op,
                  coh_request_t **req, ff_err_t *e)
{
    void *ptr[FF_NTENSORS] = {0};
    for (int t = 0; t < FF_NTENSORS; t++) {
        const ff_tensor_t *ts = &r->t[t];
        if (ts->kind == FF_TENSOR_ADDR) {
            ptr[t] = (void *)(uintptr_t)ts->addr;
        } else if (ts->kind == FF_TENSOR_INLINE) {
            op->owned[t] = tensor_copy(ts, ts->nbytes);
            op->owned_n[t] = ts->nbytes;
            ptr[t] = op->owned[t];
        }
        if ((ts->kind == FF_TENSOR_INLINE) && !ptr[t])
            return ff_fail(e, COH_ENOMEM, ff_tensor_names[t], "field '%s': out of memory",
                           ff_tensor_names[t]);
    }
    if (s->alloc_recv) {
        op->owned[FF_T_RECV] = tensor_copy(NULL, s->nbytes[FF_T_RECV]);
        op->owned_n[FF_T_RECV] = s->nbytes[FF_T_RECV];
        ptr[FF_T_RECV] = op->owned[FF_T_RECV];
        if (!ptr[FF_T_RECV]) return ff_fail(e, COH_ENOMEM, "recv", "field 'recv': out of memory");
    }
    coh_comm_t *w = fc->world;
    /* Where the buffers are: as asked; with no addr tensor (all inline or
     * allocated here, host memory) nothing to ask the device runtime. */
    int mem = r->mem;
    bool any_addr = false;
    for (int t = 0; t < FF_NTENSORS; t++) any_addr |= r->t[t].kind == FF_TENSOR_ADDR;
    if (mem == COH_MEM_AUTO && !any_addr) mem = COH_MEM_HOST;
    void *stream = (void *)(uintptr_t)r->stream;
    coh_coll_opts_t co = {.mem = mem, .stream = stream};
    int st;
    switch (r->type) {
    case FF_ALLREDUCE: {
        coh_allreduce_opts_t o = {.algo = r->algo == FF_ALGO_RELAY ? COH_ALLREDUCE_RELAY
                                                                   : COH_ALLREDUCE_DEFAULT,
                                  .iteration = (uint64_t)r->iteration,
                                  .loss_bound = r->loss_bound,
                                  .pull_loss_bound = r->pull_loss_bound,
                                  .layer = r->layer,
                                  .nlayers = r->nlayers,
                                  .mem = mem,
                                  .stream = stream};
        if (r->t[FF_T_BUF].kind != FF_TENSOR_NONE)
            st = coh_allreduce_ex(w, NULL, ptr[FF_T_BUF], s->count, r->dtype, r->op, &o, req);
        else
            st = coh_allreduce_ex(w, ptr[FF_T_SEND], ptr[FF_T_RECV], s->count, r->dtype, r->op, &o,
                                  req);
        break;
    }
    case FF_BROADCAST:
        st = coh_broadcast_ex(w, ptr[FF_T_BUF], s->count, r->dtype, r->root, &co, req);
        break;
    case FF_ALLGATHER:
        st = coh_allgather_ex(w, ptr[FF_T_SEND], ptr[FF_T_RECV], s->count, r->dtype, &co, req);
        break;
    case FF_REDUCE_SCATTER:
        st = coh_reduce_scatter_ex(w, ptr[FF_T_SEND], ptr[FF_T_RECV], s->count, r->dtype, r->op,
                                   &co, req);
        break;
    case FF_BARRIER: st = coh_barrier(w, req); break;
    case FF_SYNC: {
        static const coh_sync_mode modes[FF_SYNC_MODE_COUNT] = {
            [FF_SYNC_DEFAULT] = COH_SYNC_DEFAULT, [FF_SYNC_ALLREDUCE] = COH_SYNC_ALLREDUCE,
            [FF_SYNC_PARTIAL] = COH_SYNC_PARTIAL, [FF_SYNC_SELECTIVE] = COH_SYNC_SELECTIVE,
            [FF_SYNC_RELAY] = COH_SYNC_RELAY,
        };
        st = coh_sync_ex(w, ptr[FF_T_BUF], s->count, r->dtype, (uint64_t)r->iteration, r->weight,
                         modes[r->mode], req);
        break;
    }
    default: return ff_fail(e, COH_EINTERNAL, "type", "no collective for this type");
    }
    if (st < 0) return ff_fail(e, st, "", "%s", coh_last_error());
    return 0;
}

/* A live request of fc, with a reference the caller puts; NULL when rh is
 * none (released, never issued, or another context's). */
static ff_op_t *op_find(ff_ctx_t *fc, uint64_t rh)
{
    uv_mutex_lock(&fc->mu);
    ff_op_t *op = table_get(&fc->ops, rh);
    if (op) atomic_fetch_add(&op->refs, 1);
    uv_mutex_unlock(&fc->mu);
    return op;
}

static int simple_request(ff_ctx_t *fc, const ff_req_t *r, void **resp, size_t *resp_len)
{
    ff_err_t e = {0};
    bool has_id = r->seen & FF_F_ID;
    if (api_enter(fc, &e) < 0) return ff_error_response(&e, r->type, has_id, r->id, resp, resp_len);
    ff_out_t o;
    msgpack_packer pk;
    ff_out_init(&o, &pk);
    int st = 0;
    switch (r->type) {
    case FF_INFO: {
        ff_pack_head(&pk, 0, NULL, r->type, has_id, r->id, 6);
        ff_pack_kv_int(&pk, "rank", fc->rank);
        ff_pack_kv_int(&pk, "size", fc->size);
        ff_pack_kv_int(&pk, "nrails", fc->nrails);
        ff_pack_kv_str(&pk, "describe", coh_ctx_describe(fc->ctx));
        char ver[32];
        snprintf(ver, sizeof(ver), "%d.%d.%d", COH_VERSION_MAJOR, COH_VERSION_MINOR,
                 COH_VERSION_PATCH);
        ff_pack_kv_str(&pk, "version", ver);
        ff_pack_kv_int(&pk, "schema", FF_SCHEMA);
        break;
    }
    case FF_STATS: {
        coh_stats_t s;
        st = coh_ctx_stats(fc->ctx, &s);
        if (st < 0) {
            ff_fail(&e, st, "", "%s", coh_last_error());
            ff_pack_head(&pk, st, &e, r->type, has_id, r->id, 0);
            break;
        }
        ff_pack_head(&pk, 0, NULL, r->type, has_id, r->id, 1);
        ff_pack_str(&pk, "stats");
        msgpack_pack_map(&pk, 42);
        ff_pack_kv_uint(&pk, "bytes_sent", s.bytes_sent);
        ff_pack_kv_uint(&pk, "bytes_received", s.bytes_received);
        ff_pack_kv_uint(&pk, "requests_completed", s.requests_completed);
        ff_pack_kv_uint(&pk, "requests_failed", s.requests_failed);
        ff_pack_kv_uint(&pk, "connections_rejected", s.connections_rejected);
        ff_pack_kv_uint(&pk, "frames_invalid", s.frames_invalid);
        ff_pack_kv_uint(&pk, "rail_failovers", s.rail_failovers);
        ff_pack_kv_uint(&pk, "rail_returns", s.rail_returns);
        ff_pack_kv_uint(&pk, "rail_resent_bytes", s.rail_resent_bytes);
        ff_pack_kv_uint(&pk, "dg_sent", s.dg_sent);
        ff_pack_kv_uint(&pk, "dg_received", s.dg_received);
        ff_pack_kv_uint(&pk, "dg_duplicate", s.dg_duplicate);
        ff_pack_kv_uint(&pk, "dg_invalid", s.dg_invalid);
        ff_pack_kv_uint(&pk, "dg_stranger", s.dg_stranger);
        ff_pack_kv_uint(&pk, "dg_late", s.dg_late);
        ff_pack_kv_uint(&pk, "dg_kept", s.dg_kept);
        ff_pack_kv_uint(&pk, "dg_dropped", s.dg_dropped);
        ff_pack_kv_uint(&pk, "udp_nacks", s.udp_nacks);
        ff_pack_kv_uint(&pk, "udp_resent_bytes", s.udp_resent_bytes);
        ff_pack_kv_uint(&pk, "shm_bytes_sent", s.shm_bytes_sent);
        ff_pack_kv_uint(&pk, "shm_bytes_received", s.shm_bytes_received);
        ff_pack_kv_uint(&pk, "shm_cma_bytes_received", s.shm_cma_bytes_received);
        ff_pack_kv_uint(&pk, "probes", s.probes);
        ff_pack_kv_uint(&pk, "syncs", s.syncs);
        ff_pack_kv_uint(&pk, "sync_wait_us", s.sync_wait_us);
        ff_pack_kv_uint(&pk, "sync_comm_us", s.sync_comm_us);
        ff_pack_kv_uint(&pk, "sync_members", s.sync_members);
        ff_pack_kv_uint(&pk, "sync_full", s.sync_full);
        ff_pack_kv_uint(&pk, "sync_relayed", s.sync_relayed);
        ff_pack_kv_uint(&pk, "sync_retries", s.sync_retries);
        ff_pack_kv_uint(&pk, "ranks_failed", s.ranks_failed);
        ff_pack_kv_uint(&pk, "loss_bytes_expected", s.loss_bytes_expected);
        ff_pack_kv_uint(&pk, "loss_bytes_missed", s.loss_bytes_missed);
        ff_pack_kv_uint(&pk, "gpu_ops", s.gpu_ops);
        ff_pack_kv_uint(&pk, "gpu_ops_ipc", s.gpu_ops_ipc);
        ff_pack_kv_uint(&pk, "gpu_staged_bytes", s.gpu_staged_bytes);
        ff_pack_kv_uint(&pk, "gpu_ipc_maps", s.gpu_ipc_maps);
        ff_pack_kv_uint(&pk, "gpu_ops_unmapped", s.gpu_ops_unmapped);
        ff_pack_kv_uint(&pk, "zcopy_bytes_sent", s.zcopy_bytes_sent);
        ff_pack_kv_uint(&pk, "mem_registrations", s.mem_registrations);
        ff_pack_kv_uint(&pk, "rail_moves", s.rail_moves);
        /* the per-peer link estimates (the latest probe's: coh_ctx_links) */
        int cap = fc->size * fc->nrails;
        coh_link_probe_t *links = coh_malloc(sizeof(*links) * (size_t)(cap ? cap : 1));
        int nl = links ? coh_ctx_links(fc->ctx, links, cap) : 0;
        pack_links(&pk, links, nl < 0 ? 0 : nl < cap ? nl : cap);
        coh_free(links);
        break;
    }
    case FF_EVENT_CLEAR:
        st = coh_ctx_event_clear(fc->ctx);
        if (st < 0) ff_fail(&e, st, "", "%s", coh_last_error());
        ff_pack_head(&pk, st, &e, r->type, has_id, r->id, 0);
        break;
    case FF_LOGS:
        ff_pack_head(&pk, 0, NULL, r->type, has_id, r->id, 2);
        pack_logs(&pk);
        break;
    case FF_LB_TABLE: {
        /* At most 16 rails x 40 buckets of short lines. */
        size_t cap = 64 * 1024;
        char *text = coh_malloc(cap);
        st = text ? coh_lb_table(fc->ctx, text, cap) : COH_ENOMEM;
        if (st < 0) {
            ff_fail(&e, st, "", "%s", text ? coh_last_error() : "out of memory");
            ff_pack_head(&pk, st, &e, r->type, has_id, r->id, 0);
        } else {
            st = 0;
            ff_pack_head(&pk, 0, NULL, r->type, has_id, r->id, 1);
            ff_pack_kv_str(&pk, "table", text);
        }
        coh_free(text);
        break;
    }
    case FF_FAILED_RANKS: {
        int *fr = coh_malloc(sizeof(int) * (size_t)(fc->size ? fc->size : 1));
        st = fr ? coh_comm_failed_ranks(fc->world, fr, fc->size) : COH_ENOMEM;
        if (st < 0) {
            ff_fail(&e, st, "", "%s", fr ? coh_last_error() : "out of memory");
            ff_pack_head(&pk, st, &e, r->type, has_id, r->id, 0);
            coh_free(fr);
            break;
        }
        int n = st < fc->size ? st : fc->size;
        st = 0;
        ff_pack_head(&pk, 0, NULL, r->type, has_id, r->id, 1);
        ff_pack_str(&pk, "ranks");
        msgpack_pack_array(&pk, (size_t)n);
        for (int i = 0; i < n; i++) msgpack_pack_int(&pk, fr[i]);
        coh_free(fr);
        break;
    }
    case FF_PROBE: {
        int cap = fc->size * fc->nrails;
        coh_link_probe_t *links = coh_malloc(sizeof(*links) * (size_t)(cap ? cap : 1));
        coh_probe_info_t pi = {0};
        st = links ? coh_probe(fc->world, links, cap, &pi) : COH_ENOMEM;
        if (st < 0) {
            ff_fail(&e, st, "", "%s", links ? coh_last_error() : "out of memory");
            ff_pack_head(&pk, st, &e, r->type, has_id, r->id, 0);
            coh_free(links);
            break;
        }
        int n = pi.nlinks < cap ? pi.nlinks : cap;
        ff_pack_head(&pk, 0, NULL, r->type, has_id, r->id, 4);
        ff_pack_kv_double(&pk, "duration_us", pi.duration_us);
        ff_pack_kv_uint(&pk, "bytes_sent", pi.bytes_sent);
        ff_pack_kv_int(&pk, "failed", pi.nfailed);
        pack_links(&pk, links, n);
        coh_free(links);
        break;
    }
    case FF_STREAM_WAIT: {
        /* The request stays the caller's: its completion is still answered
         * by wait or test, once. */
        ff_op_t *op = op_find(fc, r->request);
        coh_request_t *req = op ? atomic_load(&op->req) : NULL;
        if (!op)
            st = ff_fail(&e, COH_EINVAL, "request",
                         "request handle 0x%" PRIx64 " is not a live request of this context",
                         r->request);
        else if (!req)
            st = ff_fail(&e, COH_EAGAIN, "request", "the request is being submitted");
        else if ((st = coh_request_stream_wait(req, (void *)(uintptr_t)r->stream)) < 0)
            ff_fail(&e, st, "", "%s", coh_last_error());
        op_put(op);
        ff_pack_head(&pk, st, &e, r->type, has_id, r->id, 0);
        break;
    }
    case FF_SYNC_LEAVE:
        st = coh_sync_leave(fc->world);
        if (st < 0) ff_fail(&e, st, "", "%s", coh_last_error());
        ff_pack_head(&pk, st, &e, r->type, has_id, r->id, 0);
        break;
    default:
        st = ff_fail(&e, COH_EINTERNAL, "type", "not a simple request");
        ff_pack_head(&pk, st, &e, r->type, has_id, r->id, 0);
        break;
    }
    uv_rwlock_rdunlock(&fc->api);
    return finish(&o, st, resp, resp_len);
}

COH_API int coh_ffi_call(uint64_t h, const void *buf, size_t len, void **resp, size_t *resp_len)
{
    uint64_t t0 = bs_now_ns();
    ff_err_t e = {0};
    ff_req_t r;
    ff_ctx_t *fc = ctx_get(h);
    if (!fc) {
        int64_t id = 0;
        bool has_id = ff_peek_id(buf, len, &id);
        no_ctx(h, &e);
        return ff_error_response(&e, -1, has_id, id, resp, resp_len);
    }
    int st = ff_decode_request(buf, len, &r, &e);
    if (st < 0) {
        int64_t id = r.id;
        bool has_id = (r.seen & FF_F_ID) || ff_peek_id(buf, len, &id);
        ctx_put(fc);
        return ff_error_response(&e, r.seen & FF_F_TYPE ? (int)r.type : -1, has_id, id, resp,
                                 resp_len);
    }
    bool has_id = r.seen & FF_F_ID;
    if (r.type >= FF_INFO) {
        st = simple_request(fc, &r, resp, resp_len);
        ctx_put(fc);
        return st;
    }
    ff_shape_t shape;
    if (ff_resolve(&r, fc->size, &shape, &e) < 0) {
        ctx_put(fc);
        return ff_error_response(&e, r.type, has_id, r.id, resp, resp_len);
    }
    ff_op_t *op = coh_zalloc(sizeof(*op));
    if (!op) {
        ctx_put(fc);
        ff_fail(&e, COH_ENOMEM, "", "out of memory");
        return ff_error_response(&e, r.type, has_id, r.id, resp, resp_len);
    }
    atomic_init(&op->refs, 1); /* ours */
    op->type = r.type;
    op->sched_group = r.type == FF_SYNC || (r.type == FF_ALLREDUCE && r.algo == FF_ALGO_RELAY);
    op->lossy = r.type == FF_ALLREDUCE && (r.loss_bound > 0 || r.pull_loss_bound > 0);
    op->has_id = has_id;
    op->id = r.id;
    op->rank = fc->rank;
    op->size = fc->size;
    /* The handle exists before the submission, so that a running request is
     * always reachable (and its buffers owned) whatever happens next. */
    uint64_t rh = 0;
    uv_mutex_lock(&fc->mu);
    st = table_put(&fc->ops, op, &rh);
    if (st == 0) atomic_fetch_add(&op->refs, 1); /* the table's */
    uv_mutex_unlock(&fc->mu);
    if (st < 0) {
        ff_fail(&e, st, "", "too many requests in flight on this context");
        goto fail_untabled;
    }
    coh_request_t *req = NULL;
    st = api_enter(fc, &e);
    if (st == 0) {
        st = submit(fc, &r, &shape, op, &req, &e);
        uv_rwlock_rdunlock(&fc->api);
    }
    if (st < 0) goto fail_tabled;
    /* Publish the request last: a thread that sees op->req sees the rest. */
    op->abi_us = since_us(t0);
    atomic_store(&op->req, req);
    if (!r.async) {
        st = ff_wait(fc, req, r.timeout_ms);
        if (st != COH_EAGAIN) {
            uv_mutex_lock(&fc->mu);
            ff_op_t *mine = table_take(&fc->ops, rh);
            uv_mutex_unlock(&fc->mu);
            if (mine) op_put(mine);
            st = pack_done(op, resp, resp_len);
            op_put(op);
            ctx_put(fc);
            return st;
        }
        ff_fail(&e, COH_EAGAIN, "", "not complete after %d ms: wait on 'request'", r.timeout_ms);
    }
    st = pack_pending(op, rh, r.async ? 0 : COH_EAGAIN, &e, op->abi_us, resp, resp_len);
    op_put(op);
    ctx_put(fc);
    return st;

fail_tabled:
    uv_mutex_lock(&fc->mu);
    ff_op_t *mine = table_take(&fc->ops, rh);
    uv_mutex_unlock(&fc->mu);
    if (mine) op_put(mine);
fail_untabled:
    op_put(op);
    ctx_put(fc);
    return ff_error_response(&e, r.type, has_id, r.id, resp, resp_len);
}

/* Wait on a request of fc; answer its completion (releasing the handle) or
 * COH_EAGAIN. */
static int wait_request(uint64_t h, uint64_t rh, int timeout_ms, void **resp, size_t *resp_len)
{
    ff_err_t e = {0};
    ff_ctx_t *fc = ctx_get(h);
    if (!fc) {
        no_ctx(h, &e);
        return ff_error_response(&e, -1, false, 0, resp, resp_len);
    }
    ff_op_t *op = op_find(fc, rh);
    if (!op) {
        ff_fail(&e, COH_EINVAL, "request",
                "request handle 0x%" PRIx64 " is not a live request of this context (its "
                "completion was already answered, or it was never issued)",
                rh);
        ctx_put(fc);
        return ff_error_response(&e, -1, false, 0, resp, resp_len);
    }
    int st;
    coh_request_t *req = atomic_load(&op->req);
    if (!req) { /* another thread is still submitting it */
        ff_fail(&e, COH_EAGAIN, "", "the request is being submitted");
        st = pack_pending(op, rh, COH_EAGAIN, &e, 0, resp, resp_len);
    } else if (ff_wait(fc, req, timeout_ms) == COH_EAGAIN) {
        ff_fail(&e, COH_EAGAIN, "", "not complete after %d ms", timeout_ms);
        st = pack_pending(op, rh, COH_EAGAIN, &e, op->abi_us, resp, resp_len);
    } else {
        uv_mutex_lock(&fc->mu);
        ff_op_t *mine = table_take(&fc->ops, rh);
        uv_mutex_unlock(&fc->mu);
        if (mine) op_put(mine);
        st = pack_done(op, resp, resp_len);
    }
    op_put(op);
    ctx_put(fc);
    return st;
}

COH_API int coh_ffi_wait(uint64_t h, uint64_t rh, int timeout_ms, void **resp, size_t *resp_len)
{
    if (timeout_ms < -1) timeout_ms = -1;
    return wait_request(h, rh, timeout_ms, resp, resp_len);
}

COH_API int coh_ffi_test(uint64_t h, uint64_t rh, void **resp, size_t *resp_len)
{
    return wait_request(h, rh, 0, resp, resp_len);
}
