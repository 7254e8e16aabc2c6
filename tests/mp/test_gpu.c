/*
 * Collectives on device buffers (docs/gpu.md), against the device runtime
 * COHORT_GPU names: "host" (the emulation: device memory a host access
 * faults on, streams that run later) on every machine, "cuda" where a GPU
 * is (label gpu; exit 77 without one).
 *
 * Each case fills the device input through the runtime, runs the
 * collective on device pointers, copies the result back and checks every
 * element against the exact value (mp_data.h) and, bit for bit, against
 * the same collective on host buffers. Also: several pipeline chunks
 * (COHORT_GPU_CHUNK_BYTES is small in the tests), an op ordered after a
 * stream whose earlier work is slow, a stream ordered after an op
 * (coh_request_stream_wait), device and host ops in flight together, and
 * the paths that refuse device buffers.
 *
 *   test_gpu probe   exit 0 when COHORT_GPU's runtime is usable, else 77
 *   test_gpu         the matrix
 *   test_gpu kill    the last rank SIGKILLs itself during a 16 MiB device
 *                    allreduce: the others' op fails (no hang) within 5 s,
 *                    and so does the next one
 *   test_gpu finalize
 *                    every rank but the last finalizes with a device op in
 *                    flight that the last never joins (on the IPC path its
 *                    kernels wait behind a closed gate): finalize returns
 *                    within 5 s, the op ends failed, and work the caller
 *                    ordered after it on another stream runs
 *   test_gpu graves  allgathers on fresh buffers of growing sizes (staged, each
 *                    slot larger than the pinned cache's: the smallest goes
 *                    to the graves, released once no op runs), each followed
 *                    at once by an allreduce through IPC (its gate queued at
 *                    submission), COHORT_TEST_GPU_FREE_US making each pinned
 *                    free slow: a gate counted during a release used to have
 *                    its wait queued before the release's synchronization
 *                    reached its stream, which then waited for the loop that
 *                    was in the release (no op ended again)
 *   test_gpu finalize_busy
 *                    every rank submits a 4 MiB device allreduce and rank 0
 *                    finalizes at once, its kernels or copies perhaps
 *                    running: the same, whatever each op ended with
 */
#include <signal.h>
#include <unistd.h>

#include "gpu/gpu_dev.h"
#include "mp_data.h"
#include "mp_util.h"

static int R, N;
static coh_comm_t *W;
static const gpu_dev_t *D;

static const coh_dtype DTYPES[] = {COH_F32, COH_F64, COH_F16, COH_BF16, COH_I32, COH_I64, COH_U8};
static const coh_redop OPS[] = {COH_SUM, COH_AVG, COH_MIN, COH_MAX, COH_PROD};

static void *xmalloc(size_t n)
{
    void *p = calloc(1, n ? n : 1);
    if (!p) MP_FAIL("out of memory (%zu bytes)", n);
    return p;
}

/* Device buffers come from one 64 MiB allocation, as a framework's caching
 * allocator hands them out: the peers map it once (the IPC path) and ops
 * on new buffers in it need no new mapping. It is reused once every buffer
 * in it is back. */
#define ARENA_BYTES (64u << 20)
static char *arena;
static size_t arena_used;
static int arena_live;

static void *dalloc(size_t n)
{
    void *p;
    size_t need = (n + 255) & ~(size_t)255;
    if (!arena && D->dev_alloc((void **)&arena, ARENA_BYTES) < 0)
        MP_FAIL("dev_alloc(arena): %s", D->last_error());
    if (need <= ARENA_BYTES - arena_used) {
        p = arena + arena_used;
        arena_used += need ? need : 256;
        arena_live++;
        return p;
    }
    if (D->dev_alloc(&p, n) < 0) MP_FAIL("dev_alloc(%zu): %s", n, D->last_error());
    return p;
}

static void dfree(void *p)
{
    if (!p) return;
    if ((char *)p >= arena && (char *)p < arena + ARENA_BYTES) {
        if (--arena_live == 0) arena_used = 0;
        return;
    }
    D->dev_free(p);
}

static void to_dev(void *d, const void *h, size_t n)
{
    if (D->copy(d, h, n, NULL) < 0 || D->stream_sync(NULL) < 0)
        MP_FAIL("copy to device: %s", D->last_error());
}

static void from_dev(void *h, const void *d, size_t n)
{
    if (D->copy(h, d, n, NULL) < 0 || D->stream_sync(NULL) < 0)
        MP_FAIL("copy from device: %s", D->last_error());
}

static void fill(void *buf, coh_dtype dt, coh_redop op, int r, size_t off, size_t n, int seed)
{
    for (size_t i = 0; i < n; i++)
        mpd_put(buf, dt, off + i, mpd_val(dt, op, r, i, (unsigned)seed, N));
}

static void check(const char *what, coh_dtype dt, coh_redop op, size_t count, const void *got,
                  size_t goff, int seed, int nranks)
{
    for (size_t i = 0; i < count; i++) {
        double g = mpd_get(got, dt, goff + i), w = mpd_expect(dt, op, i, (unsigned)seed, nranks);
        if (!mpd_close(dt, g, w))
            MP_FAIL("%s %s %s count=%zu: element %zu is %.9g, expected %.9g", what,
                    coh_dtype_name(dt), coh_redop_name(op), count, i, g, w);
    }
}

static void same_bits(const char *what, coh_dtype dt, const void *a, const void *b, size_t n)
{
    if (n && memcmp(a, b, n))
        MP_FAIL("%s %s: device result differs from host's", what, coh_dtype_name(dt));
}

static void test_allreduce(coh_dtype dt, coh_redop op, size_t count, bool inplace, int seed)
{
    size_t es = coh_dtype_size(dt), n = count * es;
    char *in = xmalloc(n), *host = xmalloc(n), *out = xmalloc(n);
    fill(in, dt, op, R, 0, count, seed);
    memcpy(host, in, n);
    MP_OK(coh_allreduce_sync(W, host, host, count, dt, op)); /* the host path, in place */
    char *dsend = dalloc(n), *drecv = dalloc(n);
    to_dev(inplace ? drecv : dsend, in, n);
    coh_request_t *req;
    MP_OK(coh_allreduce(W, inplace ? drecv : dsend, drecv, count, dt, op, &req)); /* found out */
    mp_wait(req);
    from_dev(out, drecv, n);
    check("allreduce", dt, op, count, out, 0, seed, N);
    same_bits("allreduce", dt, out, host, n);
    dfree(dsend);
    dfree(drecv);
    free(in);
    free(host);
    free(out);
}

static void test_broadcast(coh_dtype dt, size_t count, int root)
{
    size_t es = coh_dtype_size(dt), n = count * es;
    char *in = xmalloc(n), *out = xmalloc(n);
    fill(in, dt, COH_MAX, R == root ? 0 : R + 1, 0, count, 3);
    char *d = dalloc(n);
    to_dev(d, in, n);
    coh_request_t *req;
    coh_coll_opts_t o = {.mem = COH_MEM_DEVICE};
    MP_OK(coh_broadcast_ex(W, d, count, dt, root, &o, &req));
    mp_wait(req);
    from_dev(out, d, n);
    fill(in, dt, COH_MAX, 0, 0, count, 3);
    same_bits("broadcast", dt, out, in, n);
    dfree(d);
    free(in);
    free(out);
}

static void test_allgather(coh_dtype dt, size_t count, bool inplace)
{
    size_t es = coh_dtype_size(dt), n = count * es;
    char *want = xmalloc(n * (size_t)N), *out = xmalloc(n * (size_t)N);
    for (int r = 0; r < N; r++) fill(want, dt, COH_SUM, r, (size_t)r * count, count, 5);
    char *drecv = dalloc(n * (size_t)N), *dsend = NULL;
    if (inplace) {
        to_dev(drecv + (size_t)R * n, want + (size_t)R * n, n);
    } else {
        dsend = dalloc(n);
        to_dev(dsend, want + (size_t)R * n, n);
    }
    coh_request_t *req;
    MP_OK(coh_allgather(W, inplace ? NULL : dsend, drecv, count, dt, &req));
    mp_wait(req);
    from_dev(out, drecv, n * (size_t)N);
    same_bits("allgather", dt, out, want, n * (size_t)N);
    dfree(drecv);
    dfree(dsend);
    free(want);
    free(out);
}

/* form 0: separate buffers; 1: sendbuf NULL (recvbuf holds the input);
 * 2: NCCL's in place (recvbuf = sendbuf + rank * count). */
static void test_reduce_scatter(coh_dtype dt, coh_redop op, size_t count, int form)
{
    size_t es = coh_dtype_size(dt), n = count * es, full = n * (size_t)N;
    char *in = xmalloc(full), *out = xmalloc(full);
    /* element i of block b: the value of index b * count + i */
    fill(in, dt, op, R, 0, count * (size_t)N, 7);
    char *dfull = dalloc(full), *drecv = form == 0 ? dalloc(n) : NULL;
    to_dev(dfull, in, full);
    coh_request_t *req;
    const void *send = form == 1 ? NULL : dfull;
    void *recv = form == 0 ? drecv : form == 1 ? dfull : dfull + (size_t)R * n;
    MP_OK(coh_reduce_scatter(W, send, recv, count, dt, op, &req));
    mp_wait(req);
    if (form == 0)
        from_dev(out, drecv, n);
    else
        from_dev(out, dfull + (size_t)R * n, n);
    for (size_t i = 0; i < count; i++) {
        double g = mpd_get(out, dt, i), w = mpd_expect(dt, op, (size_t)R * count + i, 7, N);
        if (!mpd_close(dt, g, w))
            MP_FAIL("reduce_scatter form %d %s %s count=%zu: element %zu is %.9g, expected %.9g",
                    form, coh_dtype_name(dt), coh_redop_name(op), count, i, g, w);
    }
    dfree(dfull);
    dfree(drecv);
    free(in);
    free(out);
}

/* ---- stream order ---- */

typedef struct slow_fill {
    float *host;
    size_t count;
    int rank;
} slow_fill_t;

/* Runs on the stream: late, then writes what the op must reduce. */
static void slow_fill_fn(void *arg)
{
    slow_fill_t *s = arg;
    usleep(150000);
    for (size_t i = 0; i < s->count; i++) s->host[i] = (float)(s->rank + 1) * (float)(i % 97);
}

/* The op follows work the caller queued on its stream (a slow host step,
 * then a copy into the device buffer) and the caller's second stream
 * follows the op: neither ordering comes from the host waiting. With
 * pageable_out the result is copied into pageable memory, which holds the
 * driver's lock until the op is done: the op's path must then need no
 * call that waits for it (the staged path; not the IPC path's kernels). */
static void test_stream_order(size_t count, bool pageable_out)
{
    size_t n = count * sizeof(float);
    void *s1, *s2;
    if (D->stream_new(&s1) < 0 || D->stream_new(&s2) < 0)
        MP_FAIL("stream_new: %s", D->last_error());
    /* The source pinned: CUDA reads a pageable one when the copy is issued,
     * before slow_fill_fn has run (docs/gpu.md, "Pageable memory"). */
    float *src, *out = pageable_out ? xmalloc(n) : NULL;
    if (D->host_alloc((void **)&src, n) < 0 || (!out && D->host_alloc((void **)&out, n) < 0))
        MP_FAIL("host_alloc: %s", D->last_error());
    float *d = dalloc(n);
    slow_fill_t sf = {.host = src, .count = count, .rank = R};
    if (D->host_fn(s1, slow_fill_fn, &sf) < 0 || D->copy(d, src, n, s1) < 0)
        MP_FAIL("queue: %s", D->last_error());
    coh_allreduce_opts_t o = {.mem = COH_MEM_DEVICE, .stream = s1};
    coh_request_t *req;
    MP_OK(coh_allreduce_ex(W, d, d, count, COH_F32, COH_SUM, &o, &req));
    MP_OK(coh_request_stream_wait(req, s2));
    if (D->copy(out, d, n, s2) < 0) MP_FAIL("copy: %s", D->last_error());
    if (D->stream_sync(s2) < 0) MP_FAIL("sync: %s", D->last_error());
    /* s2's copy ran after the op: the result is there before any wait. */
    float tri = (float)N * (float)(N + 1) / 2;
    for (size_t i = 0; i < count; i++)
        if (out[i] != tri * (float)(i % 97))
            MP_FAIL("stream order: element %zu is %g, expected %g", i, out[i],
                    tri * (float)(i % 97));
    mp_wait(req);
    D->stream_free(s1);
    D->stream_free(s2);
    dfree(d);
    D->host_free(src);
    if (pageable_out)
        free(out);
    else
        D->host_free(out);
}

/* Which way op went, from the counters before and after it. */
typedef struct path {
    bool ipc, unmapped;
} path_t;

static path_t path_of(coh_ctx_t *ctx, coh_stats_t *prev)
{
    coh_stats_t now;
    MP_OK(coh_ctx_stats(ctx, &now));
    path_t p = {now.gpu_ops_ipc > prev->gpu_ops_ipc, now.gpu_ops_unmapped > prev->gpu_ops_unmapped};
    *prev = now;
    return p;
}

/* Ops on buffers never used before, each with a stream ordered after it
 * at once and the caller then synchronizing that stream (what a training
 * step's first iteration does), until one went through IPC. Mapping waits
 * while a thread synchronizes a stream (gpu-lockprobe: on the H200 and in
 * the emulation): made by the GPU reactor for the op, it deadlocked the
 * op. Now the first op is staged (the vote: nobody has the others'
 * buffers), the mapper maps them meanwhile, and a later op takes the IPC
 * path. With pageable, the result is copied into pageable memory instead,
 * which holds the driver's lock until the op is done: the first op (staged)
 * needs no call that waits for that lock, its slots having been taken at
 * submission (this rank's buffers were new); a later op goes through IPC,
 * whose kernels were queued at submission behind the gate (launched by the
 * GPU reactor after the vote, they waited for that lock: the op never
 * ended, nor did the copy). 8 MiB:
 * an allocation of its own (on CUDA, small ones share a block that earlier
 * ops mapped already). */
static void test_fresh_buffers(coh_ctx_t *ctx, bool ipc, bool pageable)
{
    const size_t count = 2u << 20;
    size_t n = count * sizeof(float);
    void *s1, *s2;
    if (D->stream_new(&s1) < 0 || D->stream_new(&s2) < 0)
        MP_FAIL("stream_new: %s", D->last_error());
    float *h, *out = pageable ? xmalloc(n) : NULL, *d;
    if (D->dev_alloc((void **)&d, n) < 0) MP_FAIL("dev_alloc: %s", D->last_error());
    if (D->host_alloc((void **)&h, n) < 0 || (!out && D->host_alloc((void **)&out, n) < 0))
        MP_FAIL("host_alloc: %s", D->last_error());
    coh_stats_t prev;
    MP_OK(coh_ctx_stats(ctx, &prev));
    float tri = (float)N * (float)(N + 1) / 2;
    bool via = false;
    for (int it = 0; !via && it < 200; it++) {
        for (size_t i = 0; i < count; i++) h[i] = (float)(R + 1) * (float)(i % 89);
        if (D->copy(d, h, n, s1) < 0) MP_FAIL("copy: %s", D->last_error());
        coh_allreduce_opts_t o = {.mem = COH_MEM_DEVICE, .stream = s1};
        coh_request_t *req;
        MP_OK(coh_allreduce_ex(W, d, d, count, COH_F32, COH_SUM, &o, &req));
        MP_OK(coh_request_stream_wait(req, s2));
        if (D->copy(out, d, n, s2) < 0 || D->stream_sync(s2) < 0)
            MP_FAIL("copy back: %s", D->last_error());
        mp_wait(req);
        for (size_t i = 0; i < count; i++)
            if (out[i] != tri * (float)(i % 89))
                MP_FAIL("fresh buffers op %d: element %zu is %g, expected %g", it, i, out[i],
                        tri * (float)(i % 89));
        path_t p = path_of(ctx, &prev);
        if (ipc && it == 0 && (!p.unmapped || p.ipc))
            MP_FAIL("fresh buffers: the first op went %s, expected staged for want of a mapping",
                    p.ipc ? "through IPC" : "staged as if COHORT_GPU_IPC=0");
        via = p.ipc;
        if (!ipc) break;
        if (!via) usleep(2000); /* the mapper's turn */
    }
    if (ipc && !via) MP_FAIL("fresh buffers: no op through IPC in 200");
    D->stream_free(s1);
    D->stream_free(s2);
    D->dev_free(d);
    D->host_free(h);
    if (pageable)
        free(out);
    else
        D->host_free(out);
}

/* Two ops, the second ordered after the first through the caller's
 * stream and submitted before the first ended: A on buffers new to the
 * peers (staged for want of a mapping), then B on d and o, which went
 * through IPC already. With B's kernels and A's staged copies on one stream,
 * A's copies waited behind B's gate, which opens at B's vote, which waited
 * for A through the caller's stream: neither ended. */
static void test_chained(coh_ctx_t *ctx, float *d, float *o, size_t count)
{
    const size_t na = 2u << 20;
    void *s1, *s2;
    if (D->stream_new(&s1) < 0 || D->stream_new(&s2) < 0)
        MP_FAIL("stream_new: %s", D->last_error());
    float *h = xmalloc(na * 4), *da;
    if (D->dev_alloc((void **)&da, na * 4) < 0) MP_FAIL("dev_alloc: %s", D->last_error());
    for (size_t k = 0; k < na; k++) h[k] = (float)(R + 1) * (float)(k % 31);
    to_dev(da, h, na * 4);
    for (size_t k = 0; k < count; k++) h[k] = (float)R - (float)(k % 7);
    to_dev(d, h, count * 4);
    coh_stats_t prev;
    MP_OK(coh_ctx_stats(ctx, &prev));
    coh_allreduce_opts_t oa = {.mem = COH_MEM_DEVICE, .stream = s1};
    coh_request_t *ra, *rb;
    MP_OK(coh_allreduce_ex(W, da, da, na, COH_F32, COH_SUM, &oa, &ra));
    MP_OK(coh_request_stream_wait(ra, s1));
    MP_OK(coh_allreduce_ex(W, d, o, count, COH_F32, COH_SUM, &oa, &rb));
    MP_OK(coh_request_stream_wait(rb, s2));
    if (D->stream_sync(s2) < 0) MP_FAIL("sync: %s", D->last_error());
    mp_wait(ra);
    mp_wait(rb);
    coh_stats_t now;
    MP_OK(coh_ctx_stats(ctx, &now));
    if (now.gpu_ops_unmapped - prev.gpu_ops_unmapped != 1 ||
        now.gpu_ops_ipc - prev.gpu_ops_ipc != 1)
        MP_FAIL("chained: %llu ops staged for want of a mapping and %llu through IPC, expected 1 "
                "and 1",
                (unsigned long long)(now.gpu_ops_unmapped - prev.gpu_ops_unmapped),
                (unsigned long long)(now.gpu_ops_ipc - prev.gpu_ops_ipc));
    float tri = (float)N * (float)(N + 1) / 2;
    from_dev(h, da, na * 4);
    for (size_t k = 0; k < na; k++)
        if (h[k] != tri * (float)(k % 31)) MP_FAIL("chained A: element %zu is %g", k, h[k]);
    from_dev(h, o, count * 4);
    for (size_t k = 0; k < count; k++) {
        float want = (float)(N * (N - 1) / 2) - (float)N * (float)(k % 7);
        if (h[k] != want) MP_FAIL("chained B: element %zu is %g, expected %g", k, h[k], want);
    }
    D->dev_free(da);
    D->stream_free(s1);
    D->stream_free(s2);
    free(h);
}

/* Rank 0's buffers went through IPC already, the others' are new: the
 * vote stages the op, on rank 0 too, whose buffers looked known at
 * submission. Its fallback's slot is pinned at submission: pinned by the
 * GPU reactor (nothing cached is as large as this allgather's N MiB), it
 * waited for rank 0's copy into pageable memory ordered after the op,
 * which waited for the op. */
static void test_known_new(coh_ctx_t *ctx)
{
    const size_t count = 1u << 18, n = count * 4, nout = n * (size_t)N;
    float *in0, *out0, *in, *out, *h, *back = xmalloc(nout);
    if (D->dev_alloc((void **)&in0, n) < 0 || D->dev_alloc((void **)&out0, nout) < 0 ||
        D->host_alloc((void **)&h, n) < 0)
        MP_FAIL("alloc: %s", D->last_error());
    for (size_t k = 0; k < count; k++) h[k] = (float)(R * 7) + (float)(k % 13);
    to_dev(in0, h, n);
    coh_stats_t prev;
    MP_OK(coh_ctx_stats(ctx, &prev));
    bool via = false;
    for (int it = 0; it < 200 && !via; it++) { /* until the peers have mapped in0, out0 */
        coh_request_t *req;
        /* Half the count: the staged ones leave slots of half the size in
         * the cache. */
        MP_OK(coh_allgather(W, in0, out0, count / 2, COH_F32, &req));
        mp_wait(req);
        via = path_of(ctx, &prev).ipc;
        MP_OK(coh_allreduce_sync(W, NULL, &via, 1, COH_U8, COH_MIN)); /* every rank's */
        if (!via) usleep(2000);
    }
    if (!via) MP_FAIL("known and new: no allgather through IPC in 200");
    in = in0, out = out0;
    if (R != 0 && (D->dev_alloc((void **)&in, n) < 0 || D->dev_alloc((void **)&out, nout) < 0))
        MP_FAIL("dev_alloc: %s", D->last_error());
    void *s1, *s2;
    if (D->stream_new(&s1) < 0 || D->stream_new(&s2) < 0)
        MP_FAIL("stream_new: %s", D->last_error());
    if (D->copy(in, h, n, s1) < 0) MP_FAIL("copy: %s", D->last_error());
    coh_coll_opts_t o = {.mem = COH_MEM_DEVICE, .stream = s1};
    coh_request_t *req;
    MP_OK(coh_allgather_ex(W, in, out, count, COH_F32, &o, &req));
    MP_OK(coh_request_stream_wait(req, s2));
    if (D->copy(back, out, nout, s2) < 0 || D->stream_sync(s2) < 0)
        MP_FAIL("copy back: %s", D->last_error());
    mp_wait(req);
    path_t p = path_of(ctx, &prev);
    if (p.ipc || !p.unmapped) MP_FAIL("known and new: the op was not staged for want of a mapping");
    for (int q = 0; q < N; q++)
        for (size_t k = 0; k < count; k++)
            if (back[(size_t)q * count + k] != (float)(q * 7) + (float)(k % 13))
                MP_FAIL("known and new: rank %d's element %zu is %g", q, k,
                        back[(size_t)q * count + k]);
    if (R != 0) {
        D->dev_free(in);
        D->dev_free(out);
    }
    D->dev_free(in0);
    D->dev_free(out0);
    D->host_free(h);
    D->stream_free(s1);
    D->stream_free(s2);
    free(back);
}

/* A training loop's shape: the same buffers op after op. Through IPC: the
 * first op is staged (the buffers are new), the next ones too until the
 * mapper has mapped them, then every op goes through IPC and no more of
 * the peers' memory is mapped. Staged: nothing is mapped. */
static void test_same_buffers(coh_ctx_t *ctx, bool ipc)
{
    const size_t count = 4099;
    float *h = xmalloc(count * 4), *d, *o;
    if (D->dev_alloc((void **)&d, count * 4) < 0 || D->dev_alloc((void **)&o, count * 4) < 0)
        MP_FAIL("dev_alloc: %s", D->last_error());
    coh_stats_t prev, at_first = {0};
    MP_OK(coh_ctx_stats(ctx, &prev));
    int first_ipc = -1, i;
    for (i = 0; i < 200; i++) {
        for (size_t k = 0; k < count; k++) h[k] = (float)(R + i) + (float)(k % 5);
        to_dev(d, h, count * 4);
        coh_request_t *req;
        MP_OK(coh_allreduce(W, d, o, count, COH_F32, COH_SUM, &req));
        mp_wait(req);
        from_dev(h, o, count * 4);
        for (size_t k = 0; k < count; k++) {
            float want = (float)(N * (N - 1) / 2 + N * i) + (float)N * (float)(k % 5);
            if (h[k] != want)
                MP_FAIL("same buffers op %d: element %zu is %g, expected %g", i, k, h[k], want);
        }
        path_t p = path_of(ctx, &prev);
        if (ipc && i == 0 && !p.unmapped) MP_FAIL("same buffers: the first op was not staged");
        if (ipc && first_ipc >= 0 && !p.ipc)
            MP_FAIL("same buffers: op %d staged after op %d went through IPC", i, first_ipc);
        if (first_ipc < 0 && p.ipc) {
            first_ipc = i;
            at_first = prev;
        }
        if (!ipc ? i == 7 : first_ipc >= 0 && i == first_ipc + 4) break;
        if (first_ipc < 0) usleep(2000); /* the mapper's turn */
    }
    if (ipc && first_ipc < 0) MP_FAIL("same buffers: no op through IPC in 200");
    if (ipc ? prev.gpu_ipc_maps != at_first.gpu_ipc_maps : prev.gpu_ipc_maps != 0)
        MP_FAIL("peer mappings: %llu at the first op through IPC, %llu four ops later (IPC: %d)",
                ipc ? (unsigned long long)at_first.gpu_ipc_maps : 0ull,
                (unsigned long long)prev.gpu_ipc_maps, ipc);
    if (ipc) test_chained(ctx, d, o, count);
    if (ipc) test_known_new(ctx);
    D->dev_free(d);
    D->dev_free(o);
    free(h);
}

/* Device ops reserve their chunks' op numbers at submission and launch
 * them later: host ops submitted meanwhile must not be confused with them. */
static void test_interleaved(size_t count)
{
    size_t n = count * 4;
    int32_t *dh = xmalloc(n), *hh = xmalloc(n), *out = xmalloc(n);
    for (size_t i = 0; i < count; i++) {
        dh[i] = R + (int32_t)i;
        hh[i] = 2 * R - (int32_t)i;
    }
    int32_t *d = dalloc(n);
    to_dev(d, dh, n);
    coh_request_t *r1, *r2, *r3;
    MP_OK(coh_allreduce(W, d, d, count, COH_I32, COH_SUM, &r1));
    MP_OK(coh_allreduce(W, hh, hh, count, COH_I32, COH_SUM, &r2));
    MP_OK(coh_barrier(W, &r3));
    mp_wait(r3);
    mp_wait(r2);
    mp_wait(r1);
    from_dev(out, d, n);
    int32_t rs = N * (N - 1) / 2;
    for (size_t i = 0; i < count; i++) {
        if (out[i] != rs + N * (int32_t)i) MP_FAIL("interleaved device element %zu: %d", i, out[i]);
        if (hh[i] != 2 * rs - N * (int32_t)i) MP_FAIL("interleaved host element %zu: %d", i, hh[i]);
    }
    dfree(d);
    free(dh);
    free(hh);
    free(out);
}

static void test_refused(void)
{
    void *d = dalloc(64);
    coh_request_t *req;
    int st = coh_sync(W, d, 16, COH_F32, 0, 1.0, &req);
    if (st != COH_EUNSUPPORTED) MP_FAIL("coh_sync on a device buffer: %s", coh_status_name(st));
    coh_allreduce_opts_t o = {.loss_bound = 0.01};
    st = coh_allreduce_ex(W, d, d, 16, COH_F32, COH_SUM, &o, &req);
    if (st != COH_EUNSUPPORTED) MP_FAIL("bounded loss on a device buffer: %s", coh_status_name(st));
    coh_coll_opts_t bad = {.mem = 7};
    st = coh_broadcast_ex(W, d, 16, COH_F32, 0, &bad, &req);
    if (st != COH_EINVAL) MP_FAIL("mem = 7: %s", coh_status_name(st));
    dfree(d);
}

static void mode_kill(void)
{
    size_t count = 4u << 20, n = count * sizeof(float);
    float *h = xmalloc(n);
    for (size_t i = 0; i < count; i++) h[i] = 1.0f;
    float *d = dalloc(n);
    to_dev(d, h, n);
    MP_OK(coh_allreduce_sync(W, d, d, 1024, COH_F32, COH_SUM)); /* everyone is up */
    coh_request_t *req = NULL;
    /* The last rank dies while the others' op waits for it, before its own
     * submission: when it submitted and died 2 ms later, its part could
     * already have gone and the op end well on every rank (CI, 2026-11-29:
     * "succeeded although a rank died in it" once). */
    if (R == N - 1) {
        usleep(2000);
        raise(SIGKILL);
    }
    double t0 = mp_now_s();
    /* Refused at submission is a failure too (the death already known). */
    int st = coh_allreduce(W, d, d, count, COH_F32, COH_SUM, &req);
    if (st == 0) st = coh_wait(req, 10000);
    double dt = mp_now_s() - t0;
    if (st == COH_EAGAIN) MP_FAIL("the device op still runs 10 s after a rank died");
    if (st == 0) MP_FAIL("the device op succeeded although a rank died in it");
    if (dt > 5) MP_FAIL("took %.1f s to notice the dead rank", dt);
    printf("rank %d: failed as it should after %.2f s: %s: %s\n", R, dt, coh_status_name(st),
           req ? coh_request_error(req) : coh_last_error());
    coh_request_free(req);
    MP_OK(coh_allreduce(W, d, d, 1024, COH_F32, COH_SUM, &req));
    st = coh_wait(req, 10000);
    if (st == 0 || st == COH_EAGAIN)
        MP_FAIL("the next device op: %s (expected a failure)", coh_status_name(st));
    coh_request_free(req);
    dfree(d);
    free(h);
    printf("rank %d: OK\n", R);
}

/* Until an op on d went through IPC (COHORT_GPU_IPC on): the next op's
 * kernels are then queued at submission, behind its gate. */
static void until_ipc(coh_ctx_t *ctx, float *d, size_t count, void *stream, bool ipc)
{
    coh_stats_t prev;
    MP_OK(coh_ctx_stats(ctx, &prev));
    coh_allreduce_opts_t o = {.mem = COH_MEM_DEVICE, .stream = stream};
    for (int it = 0; it < 200; it++) {
        coh_request_t *req;
        MP_OK(coh_allreduce_ex(W, d, d, count, COH_F32, COH_SUM, &o, &req));
        mp_wait(req);
        /* The same on every rank: each counts the same ops. */
        if (!ipc || path_of(ctx, &prev).ipc) return;
        usleep(2000); /* the mapper's turn */
    }
    MP_FAIL("no op through IPC in 200");
}

static void mode_graves(coh_ctx_t *ctx)
{
    bool ipc = !getenv("COHORT_GPU_IPC") || atoi(getenv("COHORT_GPU_IPC")) != 0;
    const size_t count = 4096;
    float *h = xmalloc(count * sizeof(float));
    for (size_t i = 0; i < count; i++) h[i] = 1.0f;
    float *d = dalloc(count * sizeof(float));
    to_dev(d, h, count * sizeof(float));
    until_ipc(ctx, d, count, NULL, ipc);
    double t0 = mp_now_s();
    for (int it = 0; it < 24; it++) {
        /* 64 KiB more each time: every slot outgrows the cache's. */
        size_t n = (size_t)(it + 1) << 16, ag = n / sizeof(float);
        void *src, *dst;
        if (D->dev_alloc(&src, n) < 0 || D->dev_alloc(&dst, n * (size_t)N) < 0)
            MP_FAIL("dev_alloc: %s", D->last_error());
        coh_request_t *rq;
        MP_OK(coh_allgather(W, src, dst, ag, COH_F32, &rq));
        mp_wait(rq); /* the loop drains the graves now: no op runs */
        MP_OK(coh_allreduce(W, d, d, count, COH_F32, COH_SUM, &rq));
        int st = coh_wait(rq, 20000);
        if (st == COH_EAGAIN) MP_FAIL("round %d: the allreduce still runs after 20 s", it);
        if (st) MP_FAIL("round %d: %s: %s", it, coh_status_name(st), coh_request_error(rq));
        coh_request_free(rq);
        D->dev_free(src);
        D->dev_free(dst);
    }
    from_dev(h, d, count * sizeof(float));
    /* 1, then times N once per op: until_ipc's ops and the 24 here. */
    for (size_t i = 1; i < count; i++)
        if (h[i] != h[0]) MP_FAIL("element %zu is %g, element 0 %g", i, h[i], h[0]);
    coh_stats_t st;
    MP_OK(coh_ctx_stats(ctx, &st));
    printf("rank %d: 24 rounds in %.2f s, %llu device ops, %llu through IPC\n", R, mp_now_s() - t0,
           (unsigned long long)st.gpu_ops, (unsigned long long)st.gpu_ops_ipc);
    if (ipc && st.gpu_ops_ipc < 24)
        MP_FAIL("only %llu ops through IPC", (unsigned long long)st.gpu_ops_ipc);
    dfree(d);
    free(h);
    MP_OK(coh_finalize(ctx));
    printf("rank %d: OK\n", R);
}

/* Finalize with a device op in flight (see the modes above). busy: every
 * rank joins and rank 0 finalizes at once; else the last rank never joins. */
static void mode_finalize(coh_ctx_t *ctx, bool busy)
{
    bool ipc = !getenv("COHORT_GPU_IPC") || atoi(getenv("COHORT_GPU_IPC")) != 0;
    const size_t count = 1u << 20;
    size_t n = count * sizeof(float);
    void *s1, *s2, *ev;
    float *h;
    if (D->stream_new(&s1) < 0 || D->stream_new(&s2) < 0 || D->event_new(&ev) < 0 ||
        D->host_alloc((void **)&h, n) < 0)
        MP_FAIL("set-up: %s", D->last_error());
    float *d = dalloc(n);
    until_ipc(ctx, d, count, s1, ipc);
    if (!busy && R == N - 1) { /* never joins; finalizes once the others have */
        sleep(2);
        coh_finalize(ctx);
        goto out;
    }
    coh_allreduce_opts_t o = {.mem = COH_MEM_DEVICE, .stream = s1};
    coh_request_t *req;
    MP_OK(coh_allreduce_ex(W, d, d, count, COH_F32, COH_SUM, &o, &req));
    MP_OK(coh_request_stream_wait(req, s2));
    if (D->copy(h, d, n, s2) < 0 || D->event_record(ev, s2) < 0)
        MP_FAIL("queue after the op: %s", D->last_error());
    if (busy && R != 0) { /* rank 0 finalizes in the middle of it */
        int st = coh_wait(req, 10000);
        if (st == COH_EAGAIN) MP_FAIL("the op still runs 10 s after rank 0 finalized");
    } else if (!busy) {
        usleep(200000); /* at the handles' exchange: the gate closed */
    }
    double t0 = mp_now_s();
    MP_OK(coh_finalize(ctx));
    double dt = mp_now_s() - t0;
    if (dt > 5) MP_FAIL("finalize took %.1f s", dt);
    int st = coh_wait(req, 0);
    if (st == COH_EAGAIN) MP_FAIL("the op was still running after finalize");
    /* Cancelled by this finalize, or by a peer's before it ("aborted by rank
     * 0: the context was finalized"), as host ops are. */
    if (!busy && (st != COH_ECANCELED || !strstr(coh_request_error(req), "finalized")))
        MP_FAIL("the op ended %s (%s), expected ECANCELED: finalized", coh_status_name(st),
                coh_request_error(req));
    /* The caller's stream ordered after the op gets past it, op failed or not. */
    int q = 0;
    for (int i = 0; i < 10000 && (q = D->event_query(ev)) == 0; i++) usleep(1000);
    if (q != 1) MP_FAIL("the stream ordered after the op %s", q ? "failed" : "is stuck (10 s)");
    printf("rank %d: finalize in %.3f s, the op ended %s (%s)\n", R, dt, coh_status_name(st),
           coh_request_error(req));
    coh_request_free(req);
out:
    printf("rank %d: OK\n", R);
    D->event_free(ev);
    D->stream_free(s1);
    D->stream_free(s2);
    D->host_free(h);
    dfree(d);
}

int main(int argc, char **argv)
{
    const char *why = "";
    /* Line by line: a run killed at its timeout still shows how far it got. */
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *mode = getenv("COHORT_GPU") ? getenv("COHORT_GPU") : "auto";
    D = gpu_dev_pick(mode, &why);
    if (argc > 1 && !strcmp(argv[1], "probe")) {
        if (!D) printf("SKIP: COHORT_GPU=%s: %s\n", mode, why);
        return D ? 0 : 77;
    }
    if (!D) MP_FAIL("COHORT_GPU=%s: %s", mode, why);
    coh_ctx_t *ctx = mp_init(&W, &R, &N);
    if (argc > 1 && !strcmp(argv[1], "kill")) {
        mode_kill();
        coh_finalize(ctx);
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "graves")) {
        mode_graves(ctx);
        return 0;
    }
    if (argc > 1 && !strncmp(argv[1], "finalize", 8)) {
        mode_finalize(ctx, !strcmp(argv[1], "finalize_busy"));
        return 0;
    }
    if (R == 0) printf("device runtime: %s; %s\n", D->name, coh_ctx_describe(ctx));
    /* COHORT_GPU_CHUNK_BYTES is 64K in the tests: 70001 f64 are 9 chunks. */
    const size_t counts[] = {0, 1, (size_t)N + 1, 1000, 70001};
    int seed = 0;
    for (size_t d = 0; d < sizeof(DTYPES) / sizeof(DTYPES[0]); d++)
        for (size_t o = 0; o < sizeof(OPS) / sizeof(OPS[0]); o++)
            for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
                test_allreduce(DTYPES[d], OPS[o], counts[c], (c + o) % 2, seed++);
    test_allreduce(COH_F32, COH_SUM, 1000003, false, 1);
    if (R == 0) printf("allreduce: ok\n");
    for (size_t d = 0; d < sizeof(DTYPES) / sizeof(DTYPES[0]); d++)
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
            test_broadcast(DTYPES[d], counts[c], (int)(c % (size_t)N));
    if (R == 0) printf("broadcast: ok\n");
    for (size_t d = 0; d < sizeof(DTYPES) / sizeof(DTYPES[0]); d++)
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
            test_allgather(DTYPES[d], counts[c], c % 2);
    if (R == 0) printf("allgather: ok\n");
    for (size_t d = 0; d < sizeof(DTYPES) / sizeof(DTYPES[0]); d++)
        for (size_t o = 0; o < sizeof(OPS) / sizeof(OPS[0]); o++)
            test_reduce_scatter(DTYPES[d], OPS[o], 1001, (int)((d + o) % 3));
    if (R == 0) printf("reduce_scatter: ok\n");
    bool ipc = !getenv("COHORT_GPU_IPC") || atoi(getenv("COHORT_GPU_IPC")) != 0;
    test_stream_order(100003, false);
    if (!ipc) test_stream_order(100003, true);
    test_fresh_buffers(ctx, ipc, false);
    test_fresh_buffers(ctx, ipc, true);
    if (R == 0) printf("stream order: ok\n");
    for (int i = 0; i < 5; i++) test_interleaved(200003);
    if (R == 0) printf("interleaved: ok\n");
    test_refused();
    test_same_buffers(ctx, ipc);
    if (R == 0) printf("same buffers: ok\n");
    /* The path taken: every rank is on this host, so through each other's
     * device memory unless COHORT_GPU_IPC=0. */
    coh_stats_t st;
    MP_OK(coh_ctx_stats(ctx, &st));
    if (R == 0)
        printf("device ops %llu, through IPC %llu, staged %llu bytes\n",
               (unsigned long long)st.gpu_ops, (unsigned long long)st.gpu_ops_ipc,
               (unsigned long long)st.gpu_staged_bytes);
    if (st.gpu_ops < 100) MP_FAIL("only %llu device ops counted", (unsigned long long)st.gpu_ops);
    /* Through IPC, or staged while a buffer was new (a fifth at most: the
     * matrix allocates buffers per case, and the mapper keeps up). */
    if (ipc ? st.gpu_ops_ipc + st.gpu_ops_unmapped != st.gpu_ops ||
                  st.gpu_ops_unmapped * 5 > st.gpu_ops || !st.gpu_ops_unmapped
            : st.gpu_ops_ipc || st.gpu_ops_unmapped || !st.gpu_staged_bytes)
        MP_FAIL("wrong path (COHORT_GPU_IPC=%d): %llu of %llu ops through IPC, %llu staged for "
                "want of a mapping, %llu bytes staged",
                ipc, (unsigned long long)st.gpu_ops_ipc, (unsigned long long)st.gpu_ops,
                (unsigned long long)st.gpu_ops_unmapped, (unsigned long long)st.gpu_staged_bytes);
    MP_OK(coh_finalize(ctx));
    printf("rank %d: OK\n", R);
    return 0;
}
