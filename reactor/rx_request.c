/*
 * Requests: created by the submitting thread, completed by whichever rail
 * thread ends the last slice, read by any thread. The state flips to DONE
 * (release) only after status, error text and times are written, so a
 * reader that sees DONE (acquire) sees them too.
 *
 * The request is the completion object of its slices (engines/engine.h):
 * it owns their countdown, the first error, the cancelling of the sibling
 * slices and the hand-off of a sync attempt to the control reactor.
 */
#include <errno.h>
#include <stddef.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "reactor/rx_trace.h"
#include "reactor/rx_ctx.h"
#include "reactor/rx_sync.h"

#if defined(__x86_64__) || defined(__i386__)
#define cpu_relax() __builtin_ia32_pause()
#else
#define cpu_relax() ((void)0)
#endif

static void slice_end(en_completion_t *c, const en_result_t *r);

coh_request_t *rx_request_new(struct coh_ctx *ctx, int nslices)
{
    coh_request_t *r = coh_zalloc(sizeof(*r));
    if (!r) return NULL;
    r->ctx = ctx;
    rx_ctx_ref(ctx);
    r->nslices = nslices;
    r->done.fn = slice_end;
    atomic_init(&r->refs, 2); /* the caller's and the runtime's */
    atomic_init(&r->slices, nslices);
    atomic_init(&r->state, RX_REQ_RUNNING);
    r->t_submit_ns = bs_now_ns();
    r->spin_us = ctx->spin_us;
    return r;
}

void rx_request_unref(coh_request_t *req)
{
    if (atomic_fetch_sub_explicit(&req->refs, 1, memory_order_acq_rel) == 1) {
        if (req->sync) {
            coh_free(req->sync->scratch);
            coh_free(req->sync->members);
            coh_free(req->sync->relays);
            coh_free(req->sync->tmp);
            coh_free(req->sync->ident);
            coh_free(req->sync);
        }
        struct coh_ctx *ctx = req->ctx;
        coh_free(req);
        rx_ctx_unref(ctx);
    }
}

static void futex_wake_all(coh_request_t *req);

void rx_request_discard(coh_request_t *req)
{
    atomic_store(&req->refs, 1);
    rx_request_unref(req);
}

/* The timeline: the request from submission to completion (an async pair,
 * since requests overlap), its slices per rail nested in it. */
static void trace_request(struct coh_ctx *ctx, coh_request_t *req, uint64_t want, uint64_t lost)
{
    uint64_t id = atomic_fetch_add(&ctx->trace_ids, 1) + 1;
    int st = atomic_load(&req->status);
    const char *what = req->what ? req->what : "request";
    char args[200];
    snprintf(args, sizeof(args), "\"comm\":%u,\"seq\":%llu,\"bytes\":%llu,\"rails\":%d", req->comm,
             (unsigned long long)req->seq, (unsigned long long)req->bytes, req->nslices);
    rx_trace_add(ctx->trace, 'b', "request", what, 0, req->t_submit_ns, 0, id, args);
    for (int s = 0; s < req->nslices; s++) {
        snprintf(args, sizeof(args), "\"rail\":%d,\"bytes\":%llu", req->slice[s].rail,
                 (unsigned long long)req->slice[s].bytes);
        rx_trace_add(ctx->trace, 'b', "request", "slice", 0, req->t_submit_ns, 0, id, args);
        rx_trace_add(ctx->trace, 'e', "request", "slice", 0, req->t_done_ns, 0, id, NULL);
    }
    char err[120] = "";
    if (st < 0) rx_trace_escape(req->err, err, sizeof(err));
    snprintf(args, sizeof(args), "\"status\":\"%s\",\"error\":\"%s\"", coh_status_name(st), err);
    if (want) {
        size_t k = strlen(args);
        snprintf(args + k, sizeof(args) - k, ",\"loss_bytes\":%llu,\"lost_bytes\":%llu",
                 (unsigned long long)want, (unsigned long long)lost);
    }
    rx_trace_add(ctx->trace, 'e', "request", what, 0, req->t_done_ns, 0, id, args);
}

void rx_request_complete(coh_request_t *req)
{
    struct coh_ctx *ctx = req->ctx;
    req->t_done_ns = bs_now_ns();
    /* coh_stats_t's loss counters: the datagram stages of a bounded-loss op */
    uint64_t want = 0, lost = 0;
    for (int s = 0; s < req->nslices; s++) {
        want += req->slice[s].stage_bytes[SC_STAGE_PUSH] + req->slice[s].stage_bytes[SC_STAGE_PULL];
        lost += req->slice[s].lost_bytes[SC_STAGE_PUSH] + req->slice[s].lost_bytes[SC_STAGE_PULL];
    }
    if (want) {
        atomic_fetch_add(&ctx->loss_expected, want);
        atomic_fetch_add(&ctx->loss_missed, lost);
    }
    if (ctx->trace) trace_request(ctx, req, want, lost);
    int failed = atomic_load(&req->status) < 0;
    atomic_store(&req->state, RX_REQ_DONE); /* seq_cst: then read waiters (Dekker with coh_wait) */
    if (atomic_load(&req->waiters) > 0) futex_wake_all(req);
    /* Streams ordered after the request go on (their slots are rx_gpu's:
     * read next before the store that lets a slot be reused). */
    for (rx_flagwait_t *w = atomic_exchange(&req->flagwaits, RX_FLAGWAITS_CLOSED); w;) {
        rx_flagwait_t *next = w->next;
        __atomic_store_n(w->flag, 1u, __ATOMIC_RELEASE);
        w = next;
    }
    rx_ctx_notify(ctx, failed);
    if (req->on_done) req->on_done(req->on_done_arg);
    rx_request_unref(req);
}

void rx_request_set_error(coh_request_t *req, int status, const char *why)
{
    int expected = 0;
    if (atomic_compare_exchange_strong(&req->err_set, &expected, 1)) {
        snprintf(req->err, sizeof(req->err), "%s", why && *why ? why : coh_strerror(status));
        atomic_store(&req->status, status);
    }
}

/* Threading: the loop thread of the slice's rail. */
static void slice_end(en_completion_t *c, const en_result_t *r)
{
    coh_request_t *req = (coh_request_t *)((char *)c - offsetof(coh_request_t, done));
    if (req->ctx->lb && r->status == 0 && r->slice >= 0 && r->slice < req->nslices)
        rx_lb_observe(req->ctx, req, r);
    if (r->slice >= 0 && r->slice < req->nslices) {
        rx_slice_t *sl = &req->slice[r->slice];
        memcpy(sl->lost_bytes, r->lost_bytes, sizeof(sl->lost_bytes));
        memcpy(sl->stage_bytes, r->stage_bytes, sizeof(sl->stage_bytes));
    }
    if (req->sync && r->slice >= 0 && r->slice < RX_MAX_RAILS) {
        int n = r->nbw < EN_BW_PER_SLICE ? r->nbw : EN_BW_PER_SLICE;
        memcpy(req->sync->bw[r->slice], r->bw, sizeof(en_bw_t) * (size_t)n);
        req->sync->nbw[r->slice] = n;
    }
    if (r->status < 0) {
        int expected = 0;
        if (atomic_compare_exchange_strong(&req->err_set, &expected, 1)) {
            snprintf(req->err, sizeof(req->err), "%s",
                     r->why && *r->why ? r->why : coh_strerror(r->status));
            atomic_store(&req->status, r->status);
            /* The other slices cannot succeed: end them now, not at their timeout. */
            for (int s = 0; s < req->nslices; s++)
                if (s != r->slice)
                    rx_rail_cancel(&req->ctx->rails[req->slice[s].rail], req->comm, req->seq,
                                   r->status, req->err);
        }
    }
    if (atomic_fetch_sub_explicit(&req->slices, 1, memory_order_acq_rel) == 1) {
        if (req->sync)
            rx_sync_attempt_done(req); /* the control reactor decides: done, or try again */
        else
            rx_request_complete(req);
    }
}

void rx_ctx_notify(struct coh_ctx *ctx, int failed)
{
    atomic_fetch_add(failed ? &ctx->n_failed : &ctx->n_completed, 1);
    /* A syscall here is on the latency path of every small op: skip the
     * event fd until the application has asked for it. */
    if (atomic_load(&ctx->event_fd_used)) {
        uint64_t one = 1;
        ssize_t w;
        do {
            w = write(ctx->event_fd, &one, sizeof(one));
        } while (w < 0 && errno == EINTR);
    }
}

static int is_done(const coh_request_t *req)
{
    return atomic_load_explicit(&req->state, memory_order_acquire) == RX_REQ_DONE;
}

COH_API int coh_test(coh_request_t *req, int *done)
{
    if (!req || !done) return bs_fail(COH_EINVAL, "coh_test: NULL argument");
    *done = is_done(req);
    return 0;
}

/* Waiters sleep on the request's own state word: one futex per request, so
 * a completion wakes exactly its waiters and nobody has to take a lock. */
static void futex_wait_state(coh_request_t *req, uint64_t timeout_ns)
{
    struct timespec ts, *tp = NULL;
    if (timeout_ns != UINT64_MAX) {
        ts.tv_sec = (time_t)(timeout_ns / 1000000000ull);
        ts.tv_nsec = (long)(timeout_ns % 1000000000ull);
        tp = &ts;
    }
    syscall(SYS_futex, (int *)&req->state, FUTEX_WAIT_PRIVATE, RX_REQ_RUNNING, tp, NULL, 0);
}

static void futex_wake_all(coh_request_t *req)
{
    syscall(SYS_futex, (int *)&req->state, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

static int wait_req(coh_request_t *req, int timeout_ms);

COH_API int coh_wait(coh_request_t *req, int timeout_ms)
{
    if (!req) return bs_fail(COH_EINVAL, "coh_wait: request is NULL");
    if (is_done(req)) return atomic_load(&req->status);
    struct coh_ctx *ctx = req->ctx;
    if (!ctx->trace) return wait_req(req, timeout_ms);
    /* The timeline: how long this thread waited, on its own row. */
    uint64_t t0 = bs_now_ns();
    int st = wait_req(req, timeout_ms);
    char args[96];
    snprintf(args, sizeof(args), "\"op\":\"%s\",\"status\":\"%s\"",
             req->what ? req->what : "request", coh_status_name(st));
    rx_trace_add(ctx->trace, 'X', "wait", "coh_wait", (int)syscall(SYS_gettid), t0,
                 bs_now_ns() - t0, 0, args);
    return st;
}

static int wait_req(coh_request_t *req, int timeout_ms)
{
    struct coh_ctx *ctx = req->ctx;
    uint64_t start = bs_now_ns();
    uint64_t deadline = timeout_ms < 0 ? UINT64_MAX : start + (uint64_t)timeout_ms * 1000000ull;
    uint64_t spin_end = start + (uint64_t)req->spin_us * 1000ull;
    if (spin_end > deadline) spin_end = deadline;
    /* Drive the loops of the request's rails meanwhile: the waiter does the
     * work itself instead of waking a rail thread and being woken by it. */
    /* A running request keeps its context alive (finalize completes every
     * request before it stops the rails). */
    /* A sync request learns its slices from the coordinator's plan, on the
     * control thread: it is not helped (its completion goes through that
     * thread anyway). */
    int nh = spin_end > start && !req->sync && !req->deferred &&
                     atomic_load(&ctx->state) == RX_CTX_RUNNING
                 ? req->nslices
                 : 0;
    for (int s = 0; s < nh; s++) rx_reactor_help_begin(&ctx->rails[req->slice[s].rail].rx);
    /* The clock every 4th pass: in a VM a read took 80-300 ns, as long as a
     * pass, and half of a 4 KiB op's spin went to it. */
    uint64_t now = start;
    for (unsigned k = 1;
         spin_end > start && !is_done(req) && ((k++ & 3) || (now = bs_now_ns()) < spin_end);) {
        int helped = RX_HELP_BUSY;
        for (int s = 0; s < nh; s++) {
            int h = rx_reactor_help(&ctx->rails[req->slice[s].rail].rx, now);
            if (h > helped) helped = h;
        }
        /* Give the CPU to the peers this waits for when another thread runs
         * the loops, or, on a host with more ranks than cores, after a pass
         * that moved nothing. Otherwise spin on: measured with one foreign
         * busy process on 2 cores, 2 ranks, 4 KiB over shared memory took
         * 5 us spinning, 55 us yielding after 20 us idle, 420 us after
         * 200 us idle (a yield hands the core to the busy process for its
         * slice, and the peer waits for this rank). */
        if (helped == RX_HELP_BUSY) {
            /* Briefly: 64 pauses were 3 us, a 4 KiB op's time. */
            for (int i = 0; i < 8; i++) cpu_relax();
            sched_yield();
        } else if (helped == RX_HELP_IDLE && ctx->oversubscribed) {
            /* A pass that moved nothing, with more ranks than cores: the
             * peers this waits for may need this core. Yield, never sleep:
             * naps after yields that came back at once (meant to let the
             * kernel move a rank onto an idle core) made 4 ranks sit 3 on
             * one core and 1 on the other on 2 cores (docs/perf.md). */
            sched_yield();
            now = bs_now_ns();
        }
    }
    bool done = is_done(req);
    for (int s = 0; s < nh; s++) rx_reactor_help_end(&ctx->rails[req->slice[s].rail].rx, !done);
    if (is_done(req)) return atomic_load(&req->status);
    atomic_fetch_add(&req->waiters, 1); /* seq_cst: see complete() */
    while (!is_done(req)) {
        now = bs_now_ns();
        if (now >= deadline) break;
        futex_wait_state(req, deadline == UINT64_MAX ? UINT64_MAX : deadline - now);
    }
    atomic_fetch_sub(&req->waiters, 1);
    if (!is_done(req)) return bs_fail(COH_EAGAIN, "coh_wait: not complete after %d ms", timeout_ms);
    return atomic_load(&req->status);
}

COH_API int coh_request_status(const coh_request_t *req)
{
    if (!req) return bs_fail(COH_EINVAL, "coh_request_status: request is NULL");
    if (!is_done(req)) return COH_EAGAIN;
    return atomic_load(&req->status);
}

COH_API const char *coh_request_error(const coh_request_t *req)
{
    if (!req || !is_done(req) || atomic_load(&req->status) == 0) return "";
    return req->err;
}

COH_API int coh_request_time_us(const coh_request_t *req, double *us)
{
    if (!req || !us) return bs_fail(COH_EINVAL, "coh_request_time_us: NULL argument");
    *us = is_done(req) ? (double)(req->t_done_ns - req->t_submit_ns) / 1e3 : 0.0;
    return 0;
}

COH_API int coh_request_loss(const coh_request_t *req, coh_loss_info_t *info)
{
    if (!req || !info) return bs_fail(COH_EINVAL, "coh_request_loss: NULL argument");
    if (!is_done(req)) return COH_EAGAIN;
    *info = (coh_loss_info_t){0};
    /* Done: every slice ended, so even a deferred request's slices (launched
     * by another thread, rx_lb.c) were written before its completion. */
    for (int s = 0; s < req->nslices; s++) {
        const rx_slice_t *sl = &req->slice[s];
        info->push_bytes += sl->stage_bytes[SC_STAGE_PUSH];
        info->push_lost_bytes += sl->lost_bytes[SC_STAGE_PUSH];
        info->pull_bytes += sl->stage_bytes[SC_STAGE_PULL];
        info->pull_lost_bytes += sl->lost_bytes[SC_STAGE_PULL];
    }
    if (info->push_bytes)
        info->push_lost = (double)info->push_lost_bytes / (double)info->push_bytes;
    if (info->pull_bytes)
        info->pull_lost = (double)info->pull_lost_bytes / (double)info->pull_bytes;
    return 0;
}

COH_API void coh_request_free(coh_request_t *req)
{
    if (req) rx_request_unref(req);
}
