/*
 * The plan executor: runs one rail's slice of a collective as a state
 * machine. A step starts when its dependencies are done; sends go to the
 * transport, receives are "posted" (their frames may then be delivered),
 * local steps run at once. Completions (a write callback, a payload fully
 * delivered) finish steps and release their dependents.
 *
 * An op ends exactly once: DONE when every step is done, or FAILED and then
 * ended when no write still reads its buffers (a receive still streaming
 * into them is switched to discard at failure). Only then is the request
 * told, so the caller never sees completion while cohort touches its memory.
 *
 * Threading: loop thread of the op's rail, except en_op_new / en_op_free.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "engines/engine.h"
#include "gpu/gpu.h"

/* ---- construction ---- */

int en_op_new(en_completion_t *comp, int slice, uint32_t comm, uint64_t seq, uint64_t sig,
              const char *desc, coh_dtype dtype, coh_redop redop, void *sendbuf, void *recvbuf,
              sc_plan_t *plan, en_op_t **out)
{
    en_op_t *op = coh_zalloc(sizeof(*op));
    if (!op) return COH_ENOMEM;
    op->comp = comp;
    op->slice = slice;
    op->comm = comm;
    op->seq = seq;
    op->sig = sig;
    bs_strcpy(op->desc, sizeof(op->desc), desc);
    op->dtype = dtype;
    op->redop = redop;
    op->esize = (uint32_t)coh_dtype_size(dtype);
    op->plan = *plan;
    sc_plan_init(plan); /* the op owns the steps now */
    op->buf[SC_BUF_SEND] = sendbuf ? sendbuf : recvbuf;
    op->buf[SC_BUF_RECV] = recvbuf;
    uint32_t n = op->plan.nsteps;
    op->deps_left = coh_malloc(sizeof(uint32_t) * (n ? n : 1));
    op->sstate = coh_zalloc(n ? n : 1);
    op->ready = coh_malloc(sizeof(uint32_t) * (n ? n : 1));
    op->wreqs = coh_zalloc(sizeof(en_wreq_t) * (op->plan.nsend ? op->plan.nsend : 1));
    uint32_t cap = 4;
    while (cap < 2 * op->plan.nrecv) cap <<= 1;
    op->rtab = coh_zalloc(sizeof(uint32_t) * cap);
    op->rtab_mask = cap - 1;
    if (!op->deps_left || !op->sstate || !op->ready || !op->wreqs || !op->rtab) goto nomem;
    for (uint32_t i = 0; i < n; i++) {
        const sc_step_t *s = &op->plan.steps[i];
        op->deps_left[i] = s->ndeps;
        if (s->kind != SC_RECV && s->kind != SC_RECV_REDUCE) continue;
        uint32_t h = ((uint32_t)s->peer * 0x9E3779B1u ^ s->tag * 0x85EBCA77u) & op->rtab_mask;
        while (op->rtab[h]) h = (h + 1) & op->rtab_mask;
        op->rtab[h] = i + 1;
    }
    op->left = n;
    *out = op;
    return 0;
nomem:
    en_op_free(op);
    return bs_fail(COH_ENOMEM, "out of memory building an op of %u steps", n);
}

void en_op_set_loss(en_op_t *op, double push, double pull, int layer, int nlayers, bool ecn)
{
    op->loss[SC_STAGE_PUSH] = push;
    op->loss[SC_STAGE_PULL] = pull;
    op->layer = layer;
    op->nlayers = nlayers;
    op->ecn = ecn;
}

void en_op_free(en_op_t *op)
{
    if (!op) return;
    en_udp_op_free(op);
    sc_plan_free(&op->plan);
    coh_free(op->deps_left);
    coh_free(op->sstate);
    coh_free(op->ready);
    coh_free(op->wreqs);
    coh_free(op->rtab);
    coh_free(op->buf[SC_BUF_SCRATCH]);
    coh_free(op);
}

int64_t en_exec_find_recv(const en_op_t *op, int peer, uint32_t tag)
{
    uint32_t h = ((uint32_t)peer * 0x9E3779B1u ^ tag * 0x85EBCA77u) & op->rtab_mask;
    while (op->rtab[h]) {
        uint32_t i = op->rtab[h] - 1;
        const sc_step_t *s = &op->plan.steps[i];
        if (s->peer == peer && s->tag == tag) return i;
        h = (h + 1) & op->rtab_mask;
    }
    return -1;
}

/* ---- the rail's record of ended ops ---- */

#define FIN_TAB_MASK (EN_FIN_MAX * 4 - 1)

static uint32_t fin_home(uint32_t comm, uint64_t seq)
{
    uint64_t h = (seq ^ ((uint64_t)comm << 40)) * 0x9e3779b97f4a7c15ull;
    return (uint32_t)(h >> 32) & FIN_TAB_MASK;
}

static struct en_fin *fin_find(en_rail_t *rail, uint32_t comm, uint64_t seq)
{
    for (uint32_t i = fin_home(comm, seq); rail->fin_tab[i]; i = (i + 1) & FIN_TAB_MASK) {
        struct en_fin *f = &rail->fin[rail->fin_tab[i] - 1];
        if (f->seq == seq && f->comm == comm) return f;
    }
    return NULL;
}

/* Drop f from the index: backward-shift deletion keeps every other entry
 * reachable from its home slot without tombstones. */
static void fin_unindex(en_rail_t *rail, const struct en_fin *f)
{
    uint16_t want = (uint16_t)(f - rail->fin + 1);
    uint32_t i = fin_home(f->comm, f->seq);
    while (rail->fin_tab[i] != want) {
        if (!rail->fin_tab[i]) return;
        i = (i + 1) & FIN_TAB_MASK;
    }
    for (uint32_t j = i;;) {
        rail->fin_tab[i] = 0;
        for (;;) {
            j = (j + 1) & FIN_TAB_MASK;
            if (!rail->fin_tab[j]) return;
            const struct en_fin *g = &rail->fin[rail->fin_tab[j] - 1];
            uint32_t k = fin_home(g->comm, g->seq);
            /* g stays when its home lies cyclically in (i, j]. */
            if (i <= j ? (i < k && k <= j) : (i < k || k <= j)) continue;
            rail->fin_tab[i] = rail->fin_tab[j];
            i = j;
            break;
        }
    }
}

static void fin_record(en_rail_t *rail, uint32_t comm, uint64_t seq, int status, const char *why)
{
    struct en_fin *f = fin_find(rail, comm, seq);
    if (!f) {
        f = &rail->fin[rail->fin_next];
        rail->fin_next = (rail->fin_next + 1) % EN_FIN_MAX;
        if (f->used) fin_unindex(rail, f);
        f->used = true;
        f->comm = comm;
        f->seq = seq;
        uint32_t i = fin_home(comm, seq);
        while (rail->fin_tab[i]) i = (i + 1) & FIN_TAB_MASK;
        rail->fin_tab[i] = (uint16_t)(f - rail->fin + 1);
    }
    f->status = status;
    if (why)
        snprintf(f->why, sizeof(f->why), "%s", why);
    else
        f->why[0] = 0;
}

en_op_t *en_exec_find_op(en_rail_t *rail, uint32_t comm, uint64_t seq)
{
    for (en_op_t *op = rail->ops_head; op; op = op->next)
        if (op->seq == seq && op->comm == comm) return op;
    return NULL;
}

bool en_exec_ended(en_rail_t *rail, uint32_t comm, uint64_t seq, int *status)
{
    const struct en_fin *f = fin_find(rail, comm, seq);
    if (f && status) *status = f->status;
    return f != NULL;
}

/* ---- frames that arrived before their receive ---- */

/* A payload buffer of at least len bytes: a spare one that fits (not more
 * than a quarter larger), else a new one, rounded up to 64 KiB so that
 * frames of one chunk size (which differ by a few elements) share them.
 * Halving-doubling stashes a fifth of a 64 MiB allreduce on 4 ranks here;
 * with a new buffer each time its page faults doubled the op's time. */
static uint8_t *stash_buf(en_rail_t *rail, size_t len, size_t *cap)
{
    int best = -1;
    for (int i = 0; i < rail->nspare; i++)
        if (rail->spare_cap[i] >= len && rail->spare_cap[i] - len <= len / 4 + 65536 &&
            (best < 0 || rail->spare_cap[i] < rail->spare_cap[best]))
            best = i;
    if (best >= 0) {
        uint8_t *p = rail->spare[best];
        *cap = rail->spare_cap[best];
        rail->spare_bytes -= *cap;
        rail->nspare--;
        rail->spare[best] = rail->spare[rail->nspare];
        rail->spare_cap[best] = rail->spare_cap[rail->nspare];
        return p;
    }
    *cap = len ? (len + 65535) / 65536 * 65536 : 64;
    return coh_aligned(*cap, 64);
}

/* Keep a delivered entry's buffer for the next, within EN_STASH_SPARE
 * buffers and the stash's own limit (the oldest spare goes first): what
 * the stash held at once comes back in the next op like it, and a smaller
 * bound allocated the rest anew every op (16 buffers and 32 MiB kept; a
 * rank 24 frames behind faulted 2850 pages per op under ASan, 261 with
 * mimalloc, which hands idle pages back; mp.faults.n4.tcp). */
static void stash_buf_put(en_rail_t *rail, uint8_t *p, size_t cap)
{
    if (!p) return;
    if (cap > rail->stash_limit) {
        coh_free(p);
        return;
    }
    while (rail->nspare &&
           (rail->nspare == EN_STASH_SPARE || rail->spare_bytes + cap > rail->stash_limit)) {
        coh_free(rail->spare[0]);
        rail->spare_bytes -= rail->spare_cap[0];
        rail->nspare--;
        memmove(rail->spare, rail->spare + 1, sizeof(rail->spare[0]) * (size_t)rail->nspare);
        memmove(rail->spare_cap, rail->spare_cap + 1,
                sizeof(rail->spare_cap[0]) * (size_t)rail->nspare);
    }
    rail->spare[rail->nspare] = p;
    rail->spare_cap[rail->nspare++] = cap;
    rail->spare_bytes += cap;
}

/* A reduce-scatter's partial sums (plan.scratch_count) live in a buffer
 * the rail keeps for the next op: a new one per op was paged in again every
 * time (the allocator hands large blocks back to the kernel), and 4 ranks,
 * 16 MiB took 95-100 ms instead of 19-24 (120 thousand page faults against
 * 41 thousand for 22 ops; mp.faults.n4.tcp). Its own slot, not the stash's
 * spares, whose frames would push it out. Loop thread. */
static bool scratch_take(en_rail_t *rail, en_op_t *op)
{
    size_t need = op->plan.scratch_count * op->esize;
    int best = -1;
    for (int i = 0; i < EN_SCRATCH_KEEP; i++)
        if (rail->scratch_spare[i] && rail->scratch_spare_cap[i] >= need &&
            (best < 0 || rail->scratch_spare_cap[i] < rail->scratch_spare_cap[best]))
            best = i;
    if (best >= 0) {
        op->buf[SC_BUF_SCRATCH] = rail->scratch_spare[best];
        op->scratch_cap = rail->scratch_spare_cap[best];
        rail->scratch_spare[best] = NULL;
        rail->scratch_spare_cap[best] = 0;
        return true;
    }
    op->scratch_cap = (need + 65535) / 65536 * 65536;
    op->buf[SC_BUF_SCRATCH] = coh_aligned(op->scratch_cap, 64);
    return op->buf[SC_BUF_SCRATCH] != NULL;
}

/* The op's scratch back to the rail, in a free slot or in place of the
 * smallest kept one when it is larger. */
static void scratch_put(en_rail_t *rail, en_op_t *op)
{
    uint8_t *p = op->buf[SC_BUF_SCRATCH];
    size_t cap = op->scratch_cap;
    op->buf[SC_BUF_SCRATCH] = NULL;
    op->scratch_cap = 0;
    if (!p) return;
    int slot = -1;
    for (int i = 0; i < EN_SCRATCH_KEEP; i++)
        if (slot < 0 || !rail->scratch_spare[i] ||
            (rail->scratch_spare[slot] &&
             rail->scratch_spare_cap[i] < rail->scratch_spare_cap[slot]))
            slot = i;
    /* Closing: en_exec_drop_stash may have run (an op failed at finalize
     * ends when its writes drain, later). */
    if (rail->closing || cap > EN_SCRATCH_KEEP_BYTES ||
        (rail->scratch_spare[slot] && rail->scratch_spare_cap[slot] >= cap)) {
        coh_free(p);
        return;
    }
    coh_free(rail->scratch_spare[slot]);
    rail->scratch_spare[slot] = p;
    rail->scratch_spare_cap[slot] = cap;
}

static void stash_unlink(en_rail_t *rail, en_stash_t *e)
{
    if (e->prev)
        e->prev->next = e->next;
    else
        rail->stash_head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        rail->stash_tail = e->prev;
    rail->stash_bytes -= e->len;
    stash_buf_put(rail, e->data, e->cap);
    coh_free(e);
}

/* Keep the frame c is reading, if the budget allows. */
static int stash_or_block(en_rail_t *rail, en_conn_t *c)
{
    const en_hdr_t *h = &c->hdr;
    if (h->type != EN_FRAME_DATA || rail->stash_bytes + h->len > rail->stash_limit)
        return EN_MATCH_BLOCK;
    en_stash_t *e = coh_zalloc(sizeof(*e));
    size_t cap = 0;
    uint8_t *data = e ? stash_buf(rail, h->len, &cap) : NULL;
    if (!e || !data) {
        coh_free(e);
        return EN_MATCH_BLOCK;
    }
    *e = (en_stash_t){.comm = h->comm,
                      .seq = h->seq,
                      .peer = c->peer,
                      .tag = h->tag,
                      .sig = h->sig,
                      .len = h->len,
                      .t_ns = bs_now_ns(),
                      .data = data,
                      .cap = cap,
                      .prev = rail->stash_tail};
    if (rail->stash_tail)
        rail->stash_tail->next = e;
    else
        rail->stash_head = e;
    rail->stash_tail = e;
    rail->stash_bytes += h->len;
    en_sink_t *s = &c->sink;
    s->mode = EN_SINK_COPY;
    s->dst = data;
    s->stash = e;
    return EN_MATCH_OK;
}

static en_stash_t *stash_find(en_rail_t *rail, uint32_t comm, uint64_t seq, int peer, uint32_t tag)
{
    for (en_stash_t *e = rail->stash_head; e; e = e->next)
        if (e->complete && e->seq == seq && e->comm == comm && e->peer == peer && e->tag == tag)
            return e;
    return NULL;
}

static void stash_drop_op(en_rail_t *rail, uint32_t comm, uint64_t seq)
{
    en_stash_t *next;
    for (en_stash_t *e = rail->stash_head; e; e = next) {
        next = e->next;
        if (e->complete && e->seq == seq && e->comm == comm) stash_unlink(rail, e);
    }
}

/* ---- ending ---- */

static void op_unlink(en_op_t *op)
{
    en_rail_t *rail = op->rail;
    if (op->prev)
        op->prev->next = op->next;
    else
        rail->ops_head = op->next;
    if (op->next)
        op->next->prev = op->prev;
    else
        rail->ops_tail = op->prev;
    op->prev = op->next = NULL;
}

/* The op has ended and nothing of it is in flight: free it, then tell its
 * completion (which may free the buffers the op used). */
static void starter_cb(uv_idle_t *h)
{
    en_exec_start_waiting(h->data);
}

static void op_finish(en_op_t *op)
{
    en_rail_t *rail = op->rail;
    op_unlink(op);
    rail->nrunning--;
    /* Room for a waiting op: start it from the top of the loop, not from
     * inside whatever frame ended this one. */
    if (rail->wait_head && rail->starter_open) uv_idle_start(&rail->starter, starter_cb);
    if (op->state == EN_OP_RUNNING) {
        op->state = EN_OP_DONE;
        fin_record(rail, op->comm, op->seq, 0, NULL);
    }
    en_udp_op_end(op);
    /* Every step has ended (no write reads the scratch any more). */
    scratch_put(rail, op);
    char why[BS_ERR_LEN];
    en_bw_t bw[EN_BW_PER_SLICE];
    en_result_t r = {.slice = op->slice,
                     .status = op->state == EN_OP_DONE ? 0 : op->status,
                     .why = why,
                     .bw = bw,
                     .nbw = op->nbw,
                     .t_start_ns = op->t_start_ns,
                     .t_end_ns = bs_now_ns(),
                     .bytes_out = op->bytes_out};
    bs_strcpy(why, sizeof(why), op->state == EN_OP_DONE ? "" : op->why);
    memcpy(bw, op->bw, sizeof(en_bw_t) * (size_t)op->nbw);
    memcpy(r.lost_bytes, op->lost_bytes, sizeof(r.lost_bytes));
    memcpy(r.stage_bytes, op->stage_bytes, sizeof(r.stage_bytes));
    en_completion_t *c = op->comp;
    en_op_free(op);
    c->fn(c, &r);
}

/* End the op if nothing of it is in flight. Only at the outermost level:
 * a nested caller still holds the op. */
static void op_settle(en_op_t *op)
{
    if (op->progressing) return;
    if ((op->state == EN_OP_RUNNING && op->left == 0) ||
        (op->state == EN_OP_FAILED && op->writes_out == 0))
        op_finish(op);
}

static void ctl_done(en_wreq_t *w, int status)
{
    (void)status;
    en_rail_t *rail = w->conn->rail;
    if (w->hdr[4] == EN_FRAME_BYE) en_rail_bye_sent(rail);
    coh_free(w);
}

/* Queue a control frame (ABORT, BYE) on c. */
int en_exec_send_ctl(en_conn_t *c, int type, uint32_t comm, uint64_t seq, int status,
                     const char *text)
{
    en_wreq_t *w = coh_zalloc(sizeof(*w));
    if (!w) return COH_ENOMEM;
    size_t len = 0;
    if (type == EN_FRAME_ABORT) {
        size_t tl = text ? strlen(text) : 0;
        if (tl > EN_MAX_ABORT - 4) tl = EN_MAX_ABORT - 4;
        en_put32(w->ctl, (uint32_t)status);
        memcpy(w->ctl + 4, text, tl);
        len = 4 + tl;
    }
    en_hdr_t h = {.type = (uint8_t)type, .comm = comm, .seq = seq, .len = len};
    en_hdr_encode(&h, w->hdr);
    w->payload = w->ctl;
    w->len = len;
    w->done = ctl_done;
    int e = c->ops->tr_send(c, w);
    if (e) coh_free(w);
    return e;
}

/* Fail the op: keep the first reason, drop whatever still arrives for it,
 * and (for failures found here) tell every peer so no rank waits for us. */
static void op_fail(en_op_t *op, int status, bool tell_peers, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void op_fail(en_op_t *op, int status, bool tell_peers, const char *fmt, ...)
{
    if (op->state != EN_OP_RUNNING) return;
    en_rail_t *rail = op->rail;
    /* Hold the op: resuming a paused conn below can run other callbacks that
     * would otherwise end (and free) it under us. The caller settles it. */
    bool held = op->progressing;
    op->progressing = true;
    op->state = EN_OP_FAILED;
    op->status = status;
    op->t_fail_ns = bs_now_ns();
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(op->why, sizeof(op->why), fmt, ap);
    va_end(ap);
    fin_record(rail, op->comm, op->seq, status, op->why);
    stash_drop_op(rail, op->comm, op->seq);
    en_udp_op_end(op);
    bs_log(COH_LOG_WARN, "rank %d rail %d: %s #%llu failed: %s", rail->rank, rail->index, op->desc,
           (unsigned long long)op->seq, op->why);
    for (int p = 0; p < rail->world; p++) {
        en_conn_t *c = rail->peers[p];
        if (!c) continue;
        if (c->sink.owner == op) {
            c->sink.mode = EN_SINK_DISCARD;
            c->sink.owner = NULL;
        }
        if (tell_peers) {
            char text[EN_MAX_ABORT];
            snprintf(text, sizeof(text), "rank %d: %s", rail->rank, op->why);
            en_exec_send_ctl(c, EN_FRAME_ABORT, op->comm, op->seq, status, text);
        }
        /* A conn paused on this op's frame can now drop it. */
        if (c->rstate == EN_RD_BLOCKED && c->hdr.seq == op->seq && c->hdr.comm == op->comm)
            c->ops->tr_resume(c);
    }
    op->progressing = held;
}

/* A peer's frame carries another signature: the ranks disagree. */
static void fail_mismatch(en_op_t *op, int peer)
{
    op_fail(op, COH_EMISMATCH, true,
            "rank %d called a different collective as #%llu than this rank's %s "
            "(count, dtype, op, root or COHORT_CHUNK_BYTES/COHORT_SMALL_BYTES differ)",
            peer, (unsigned long long)op->seq, op->desc);
}

/* ---- running steps ---- */

int en_conn_match(en_conn_t *c)
{
    int m = en_exec_match(c->rail, c);
    if (m < 0) {
        atomic_fetch_add(&c->rail->stat_bad_frames, 1);
        return m;
    }
    c->rstate = m == EN_MATCH_BLOCK ? EN_RD_BLOCKED : EN_RD_PAYLOAD;
    return m;
}

void en_exec_step_done(en_op_t *op, uint32_t i)
{
    op->sstate[i] = EN_STEP_DONE;
    op->left--;
    op->t_progress_ns = bs_now_ns();
    const sc_plan_t *p = &op->plan;
    for (uint32_t d = p->rdep_off[i]; d < p->rdep_off[i + 1]; d++) {
        uint32_t j = p->rdeps[d];
        if (--op->deps_left[j] == 0) op->ready[op->nready++] = j;
    }
}

static void send_done(en_wreq_t *w, int status)
{
    en_op_t *op = w->op;
    op->writes_out--;
    if (op->state != EN_OP_RUNNING) op->sstate[w->step] = EN_STEP_DONE; /* drained */
    if (status < 0)
        op_fail(op, status, true, "sending to rank %d failed: %s", w->conn->peer,
                coh_strerror(status));
    else if (op->state == EN_OP_RUNNING)
        en_exec_step_done(op, w->step);
    if (status >= 0) op->bytes_out += w->len;
    en_exec_kick(op);
}

static uint8_t *at(const en_op_t *op, int buf, uint64_t off)
{
    return op->buf[buf] + off * op->esize;
}

/* A kept frame meets its receive: check it as en_exec_match would have,
 * then copy or reduce it into place. */
static void stash_deliver(en_op_t *op, uint32_t i, en_stash_t *e)
{
    en_rail_t *rail = op->rail;
    const sc_step_t *st = &op->plan.steps[i];
    if (e->sig != op->sig) {
        fail_mismatch(op, e->peer);
        return;
    }
    if (e->len != st->count * op->esize) {
        op_fail(op, COH_EPROTO, true, "rank %d sent %llu bytes where %s expects %llu", e->peer,
                (unsigned long long)e->len, op->desc, (unsigned long long)(st->count * op->esize));
        return;
    }
    uint8_t *dst = at(op, st->dst, st->dst_off);
    if (!e->len) {
        /* zero-length frames (barrier, fence): nothing to place */
    } else if (st->kind == SC_RECV) {
        memcpy(dst, e->data, e->len);
    } else {
        gpu_cpu_reduce(op->dtype, op->redop, dst, at(op, st->src, st->src_off), e->data, st->count);
    }
    op->bytes_in += e->len;
    stash_unlink(rail, e);
    en_exec_step_done(op, i);
}

static void start_step(en_op_t *op, uint32_t i)
{
    en_rail_t *rail = op->rail;
    const sc_step_t *s = &op->plan.steps[i];
    op->sstate[i] = EN_STEP_RUN;
    switch (s->kind) {
    case SC_SEND: {
        en_conn_t *c = rail->peers[s->peer];
        if (!c) {
            op_fail(op, COH_EPEER, true, "no connection to rank %d", s->peer);
            return;
        }
        if (op->dg) {
            int e = en_udp_send(op, i);
            if (e < 0) op_fail(op, e, true, "%s", coh_last_error());
            if (e <= 0) return; /* ends at the receiver's FIN */
        }
        en_wreq_t *w = &op->wreqs[op->nwreqs++];
        w->op = op;
        w->step = i;
        w->payload = at(op, s->src, s->src_off);
        w->len = s->count * op->esize;
        w->done = send_done;
        w->done_inline = true;
        en_hdr_t h = {.type = EN_FRAME_DATA,
                      .comm = op->comm,
                      .tag = s->tag,
                      .seq = op->seq,
                      .sig = op->sig,
                      .len = w->len};
        en_hdr_encode(&h, w->hdr);
        /* Counted first: the transport may complete it inside tr_send. */
        op->writes_out++;
        int e = c->ops->tr_send(c, w);
        if (e) {
            op->writes_out--;
            op_fail(op, e, true, "cannot send to rank %d: %s", s->peer, coh_strerror(e));
        }
        return;
    }
    case SC_RECV:
    case SC_RECV_REDUCE: {
        /* Posted: the peer's frame may be delivered now. */
        en_conn_t *c = rail->peers[s->peer];
        if (!c) {
            op_fail(op, COH_EPEER, true, "no connection to rank %d", s->peer);
            return;
        }
        if (op->dg) {
            int e = en_udp_post(op, i);
            if (e < 0) op_fail(op, e, true, "%s", coh_last_error());
            if (e <= 0) return; /* ends when the loss bound is met */
        }
        en_stash_t *e = stash_find(rail, op->comm, op->seq, s->peer, s->tag);
        if (e) {
            stash_deliver(op, i, e);
            return;
        }
        if (c->rstate == EN_RD_BLOCKED) c->ops->tr_resume(c);
        return;
    }
    case SC_COPY: {
        uint8_t *d = at(op, s->dst, s->dst_off);
        const uint8_t *src = at(op, s->src, s->src_off);
        if (d != src) memmove(d, src, s->count * op->esize);
        break;
    }
    case SC_REDUCE: {
        uint8_t *d = at(op, s->dst, s->dst_off);
        gpu_cpu_reduce(op->dtype, op->redop, d, d, at(op, s->src, s->src_off), s->count);
        break;
    }
    case SC_DIV:
        if (op->dg && s->stage == SC_STAGE_PUSH)
            en_udp_div(op, i);
        else
            gpu_cpu_div(op->dtype, at(op, s->dst, s->dst_off), s->count, s->factor);
        break;
    case SC_SCALE: gpu_cpu_scale(op->dtype, at(op, s->dst, s->dst_off), s->count, s->factor); break;
    default: op_fail(op, COH_EINTERNAL, true, "unknown step kind %d", s->kind); return;
    }
    en_exec_step_done(op, i);
}

void en_exec_kick(en_op_t *op)
{
    if (op->progressing) return;
    op->progressing = true;
    while (op->nready && op->state == EN_OP_RUNNING) start_step(op, op->ready[--op->nready]);
    op->progressing = false;
    op_settle(op);
}

/* ---- entry points ---- */

static const struct en_revoked *revoked_find(const en_rail_t *rail, uint32_t comm)
{
    for (uint32_t i = 0; i < rail->nrevoked; i++)
        if (rail->revoked[i].comm == comm) return &rail->revoked[i];
    return NULL;
}

static void op_run(en_rail_t *rail, en_op_t *op)
{
    op->rail = rail;
    op->prev = rail->ops_tail;
    op->next = NULL;
    if (rail->ops_tail)
        rail->ops_tail->next = op;
    else
        rail->ops_head = op;
    rail->ops_tail = op;
    rail->nrunning++;
    rail->ops_started++;
    op->state = EN_OP_RUNNING;
    op->t_progress_ns = op->t_start_ns = bs_now_ns();
    en_rail_arm_timer(rail);
    if (op->doomed) {
        char why[BS_ERR_LEN];
        snprintf(why, sizeof(why), "%s", op->why);
        op_fail(op, op->status, false, "%s", why);
    }
    const struct en_revoked *rv = revoked_find(rail, op->comm);
    if (rv && op->state == EN_OP_RUNNING) op_fail(op, rv->status, false, "%s", rv->why);
    struct en_fin *f = fin_find(rail, op->comm, op->seq);
    for (en_stash_t *e = rail->stash_head; e && !(f && f->status < 0); e = e->next)
        if (e->complete && e->seq == op->seq && e->comm == op->comm && e->sig != op->sig) {
            fail_mismatch(op, e->peer);
            break;
        }
    if (op->state != EN_OP_RUNNING) {
        /* failed above */
    } else if (rail->closing) {
        /* Told: the peers' op would wait for this rank until its timeout
         * (the coordinator's rank, waiting for them in finalize, as long). */
        op_fail(op, COH_ECANCELED, true, "the context was finalized");
    } else if (op->plan.scratch_count && !scratch_take(rail, op)) {
        op_fail(op, COH_ENOMEM, true, "out of memory for the %llu-byte scratch of %s",
                (unsigned long long)(op->plan.scratch_count * op->esize), op->desc);
    } else if (en_udp_usable(rail, op) && en_udp_op_start(op) != 0) {
        op_fail(op, COH_ENOMEM, true, "out of memory starting the datagram flows of %s", op->desc);
    } else if (f && f->status < 0) {
        /* A peer aborted it, or another rail's slice failed, before it got here. */
        op_fail(op, f->status, false, "%s", f->why);
    } else {
        for (uint32_t i = 0; i < op->plan.nsteps && op->state == EN_OP_RUNNING; i++) {
            int p = op->plan.steps[i].peer;
            if (p >= 0 && rail->lost[p])
                op_fail(op, COH_EPEER, true, "rank %d is gone (rail %d)", p, rail->index);
        }
        for (uint32_t i = op->plan.nsteps; i-- > 0;)
            if (op->deps_left[i] == 0) op->ready[op->nready++] = i;
    }
    /* Hold the op while paused connections deliver: what they bring can
     * finish (and free) it, which only the final kick may do. */
    op->progressing = true;
    while (op->nready && op->state == EN_OP_RUNNING) start_step(op, op->ready[--op->nready]);
    /* Connections paused on a frame of this op can deliver it now. */
    for (int p = 0; p < rail->world; p++) {
        en_conn_t *c = rail->peers[p];
        if (c && c->rstate == EN_RD_BLOCKED && c->hdr.seq == op->seq && c->hdr.comm == op->comm)
            c->ops->tr_resume(c);
    }
    op->progressing = false;
    en_exec_kick(op);
}

void en_rail_start_op(en_rail_t *rail, en_op_t *op)
{
    op->rail = rail;
    /* Behind ops already waiting, even with room: the order is kept. */
    if (!rail->closing && (rail->wait_head || rail->nrunning >= rail->max_running)) {
        op->state = EN_OP_QUEUED;
        op->next = NULL;
        op->prev = rail->wait_tail;
        if (rail->wait_tail)
            rail->wait_tail->next = op;
        else
            rail->wait_head = op;
        rail->wait_tail = op;
        return;
    }
    op_run(rail, op);
}

static en_op_t *wait_pop(en_rail_t *rail)
{
    en_op_t *op = rail->wait_head;
    if (!op) return NULL;
    rail->wait_head = op->next;
    if (rail->wait_head)
        rail->wait_head->prev = NULL;
    else
        rail->wait_tail = NULL;
    op->prev = op->next = NULL;
    return op;
}

void en_exec_start_waiting(en_rail_t *rail)
{
    en_op_t *op;
    while ((rail->closing || rail->nrunning < rail->max_running) && (op = wait_pop(rail)))
        op_run(rail, op);
    if (rail->starter_open && (!rail->wait_head || rail->nrunning >= rail->max_running))
        uv_idle_stop(&rail->starter);
}

int en_exec_match(en_rail_t *rail, en_conn_t *c)
{
    const en_hdr_t *h = &c->hdr;
    en_sink_t *s = &c->sink;
    memset(s, 0, sizeof(*s));
    s->len = h->len;
    switch (h->type) {
    case EN_FRAME_BYE:
        c->peer_bye = true;
        s->mode = EN_SINK_NONE;
        return EN_MATCH_OK;
    case EN_FRAME_ABORT:
    case EN_FRAME_DGCTL:
        s->mode = EN_SINK_CTRL;
        s->dst = c->ctl;
        return EN_MATCH_OK;
    case EN_FRAME_DATA: break;
    default: return COH_EPROTO;
    }
    en_op_t *op = en_exec_find_op(rail, h->comm, h->seq);
    if (!op) {
        struct en_fin *f = fin_find(rail, h->comm, h->seq);
        if (!f) return stash_or_block(rail, c); /* not submitted here yet */
        if (f->status == 0)
            bs_log(COH_LOG_WARN, "rank %d rail %d: rank %d sent data for finished op #%llu",
                   rail->rank, rail->index, c->peer, (unsigned long long)h->seq);
        s->mode = EN_SINK_DISCARD;
        return EN_MATCH_OK;
    }
    if (op->state != EN_OP_RUNNING) {
        s->mode = EN_SINK_DISCARD;
        return EN_MATCH_OK;
    }
    if (h->sig != op->sig) {
        fail_mismatch(op, c->peer);
        s->mode = EN_SINK_DISCARD;
        en_exec_kick(op);
        return EN_MATCH_OK;
    }
    int64_t i = en_exec_find_recv(op, c->peer, h->tag);
    const sc_step_t *st = i >= 0 ? &op->plan.steps[i] : NULL;
    if (!st || h->len != st->count * op->esize || op->sstate[i] == EN_STEP_DONE) {
        op_fail(op, COH_EPROTO, true,
                "rank %d sent an unexpected frame (tag %u, %llu bytes) for %s", c->peer, h->tag,
                (unsigned long long)h->len, op->desc);
        s->mode = EN_SINK_DISCARD;
        en_exec_kick(op);
        return EN_MATCH_OK;
    }
    if (op->sstate[i] == EN_STEP_WAIT) return stash_or_block(rail, c); /* dependencies pending */
    s->owner = op;
    s->step = (uint32_t)i;
    c->t_frame_ns = bs_now_ns();
    s->esize = op->esize;
    s->dtype = op->dtype;
    s->op = op->redop;
    s->dst = at(op, st->dst, st->dst_off);
    if (st->kind == SC_RECV) {
        s->mode = EN_SINK_COPY;
    } else {
        s->mode = EN_SINK_REDUCE;
        s->src = at(op, st->src, st->src_off);
    }
    return EN_MATCH_OK;
}

void en_sink_consume(en_sink_t *s, const uint8_t *bytes, size_t n)
{
    switch (s->mode) {
    case EN_SINK_COPY:
    case EN_SINK_CTRL: memcpy(s->dst + s->done, bytes, n); break;
    case EN_SINK_REDUCE:
        gpu_cpu_reduce(s->dtype, s->op, s->dst + s->done, s->src + s->done, bytes, n / s->esize);
        break;
    default: break;
    }
    en_sink_placed(s, n);
}

bool en_sink_direct(const en_sink_t *s)
{
    return (s->mode == EN_SINK_COPY && s->dst) || s->mode == EN_SINK_DISCARD;
}

void en_sink_placed(en_sink_t *s, size_t n)
{
    s->done += n;
    if (s->owner) {
        s->owner->t_progress_ns = bs_now_ns();
        s->owner->bytes_in += n;
    }
}

static void handle_abort(en_rail_t *rail, en_conn_t *c, const en_hdr_t *h, size_t len)
{
    int status = (int32_t)en_get32(c->ctl);
    if (status >= 0 || status < COH_EINTERNAL) status = COH_EPROTO;
    char text[EN_MAX_ABORT];
    size_t tl = len - 4 < sizeof(text) - 1 ? len - 4 : sizeof(text) - 1;
    memcpy(text, c->ctl + 4, tl);
    text[tl] = 0;
    for (size_t k = 0; k < tl; k++)
        if (text[k] < 32 || text[k] > 126) text[k] = '?';
    en_op_t *op = en_exec_find_op(rail, h->comm, h->seq);
    if (op) {
        op_fail(op, status, false, "aborted by %s", text);
        en_exec_kick(op);
    } else if (!fin_find(rail, h->comm, h->seq)) {
        char why[160];
        snprintf(why, sizeof(why), "aborted by %s", text);
        fin_record(rail, h->comm, h->seq, status, why);
    }
}

void en_exec_recv_done(en_rail_t *rail, en_conn_t *c)
{
    en_sink_t s = c->sink;
    en_hdr_t h = c->hdr;
    memset(&c->sink, 0, sizeof(c->sink));
    if (s.mode == EN_SINK_CTRL) {
        if (h.type == EN_FRAME_DGCTL) {
            if (en_udp_ctl(rail, c, &h, c->ctl, (size_t)s.len) < 0)
                c->ops->tr_close(c, COH_EPROTO, "a malformed datagram control message");
            return;
        }
        handle_abort(rail, c, &h, (size_t)s.len);
        return;
    }
    if (s.stash) {
        en_stash_t *e = s.stash;
        e->complete = true;
        /* Its receive may have been posted while the payload came in. */
        en_op_t *op = en_exec_find_op(rail, e->comm, e->seq);
        struct en_fin *f = op ? NULL : fin_find(rail, e->comm, e->seq);
        if ((op && op->state != EN_OP_RUNNING) || (f && f->status < 0)) {
            stash_unlink(rail, e);
        } else if (op) {
            int64_t i = en_exec_find_recv(op, e->peer, e->tag);
            if (i >= 0 && op->sstate[i] == EN_STEP_RUN) {
                stash_deliver(op, (uint32_t)i, e);
                en_exec_kick(op);
            }
        }
        return;
    }
    if (!s.owner) return;
    en_op_t *op = s.owner;
    /* Frames below 64 KiB mostly measure latency, not the link. */
    if (s.len >= 65536 && c->peer >= 0) {
        uint64_t ns = bs_now_ns() - c->t_frame_ns;
        int k = 0;
        while (k < op->nbw && op->bw[k].peer != c->peer) k++;
        if (k < EN_BW_PER_SLICE) {
            if (k == op->nbw) op->bw[op->nbw++] = (en_bw_t){.peer = c->peer};
            op->bw[k].bytes += s.len;
            op->bw[k].ns += ns;
        }
    }
    en_exec_step_done(op, s.step);
    en_exec_kick(op);
}

/* ---- failures from outside the op ---- */

void en_exec_fail_op(en_op_t *op, int status, bool tell_peers, const char *why)
{
    op_fail(op, status, tell_peers, "%s", why);
    en_exec_kick(op);
}

/* The loops below rescan from the head after each failure: failing one op
 * can deliver frames that end others, so a saved "next" could dangle. Each
 * pass turns one RUNNING op FAILED, so they terminate. */
static bool needs_peer(const en_op_t *op, int peer)
{
    for (uint32_t i = 0; i < op->plan.nsteps; i++)
        if (op->plan.steps[i].peer == peer && op->sstate[i] != EN_STEP_DONE) return true;
    return false;
}

void en_exec_fail_peer(en_rail_t *rail, int peer, int status, const char *why)
{
    /* Only ops that still need this peer fail: one that finished its part
     * with it goes on (a peer that finalizes right after its last op is not
     * an error for the others). */
    for (;;) {
        en_op_t *op = rail->ops_head;
        while (op && !(op->state == EN_OP_RUNNING && needs_peer(op, peer))) op = op->next;
        if (!op) return;
        en_exec_fail_op(op, status, true, why);
    }
}

void en_exec_fail_all(en_rail_t *rail, int status, bool tell_peers, const char *why)
{
    for (;;) {
        en_op_t *op = rail->ops_head;
        while (op && op->state != EN_OP_RUNNING) op = op->next;
        if (!op) return;
        en_exec_fail_op(op, status, tell_peers, why);
    }
}

void en_exec_cancel(en_rail_t *rail, uint32_t comm, uint64_t seq, int status, const char *why)
{
    en_op_t *op = en_exec_find_op(rail, comm, seq);
    if (op) {
        en_exec_fail_op(op, status, false, why);
        return;
    }
    /* Waiting for its turn: it fails as it starts (a fin record could be
     * overwritten by then). Newest first: a cancel is usually for one just
     * submitted. */
    for (op = rail->wait_tail; op; op = op->prev)
        if (op->seq == seq && op->comm == comm) {
            if (!op->doomed) {
                op->doomed = true;
                op->status = status;
                snprintf(op->why, sizeof(op->why), "%s", why && *why ? why : coh_strerror(status));
            }
            return;
        }
    if (!fin_find(rail, comm, seq)) fin_record(rail, comm, seq, status, why);
}

void en_exec_revoke(en_rail_t *rail, uint32_t comm, int status, const char *why)
{
    if (!revoked_find(rail, comm)) {
        struct en_revoked *rv =
            coh_reallocn(rail->revoked, rail->nrevoked + 1, sizeof(*rail->revoked));
        if (rv) { /* else: its ops still end, at their timeout */
            rail->revoked = rv;
            rv += rail->nrevoked++;
            rv->comm = comm;
            rv->status = status;
            snprintf(rv->why, sizeof(rv->why), "%s", why && *why ? why : coh_strerror(status));
        }
    }
    for (;;) {
        en_op_t *op = rail->ops_head;
        while (op && !(op->state == EN_OP_RUNNING && op->comm == comm)) op = op->next;
        if (!op) break;
        en_exec_fail_op(op, status, true, why);
    }
    for (en_op_t *op = rail->wait_head; op; op = op->next)
        if (op->comm == comm && !op->doomed) {
            op->doomed = true;
            op->status = status;
            snprintf(op->why, sizeof(op->why), "%s", why && *why ? why : coh_strerror(status));
        }
}

/* The buffers kept for the next ops, back to the allocator; the bytes. */
static uint64_t free_spares(en_rail_t *rail)
{
    uint64_t freed = rail->spare_bytes;
    while (rail->nspare) coh_free(rail->spare[--rail->nspare]);
    rail->spare_bytes = 0;
    for (int i = 0; i < EN_SCRATCH_KEEP; i++) {
        freed += rail->scratch_spare_cap[i];
        coh_free(rail->scratch_spare[i]);
        rail->scratch_spare[i] = NULL;
        rail->scratch_spare_cap[i] = 0;
    }
    return freed;
}

void en_exec_drop_stash(en_rail_t *rail)
{
    while (rail->stash_head) stash_unlink(rail, rail->stash_head);
    free_spares(rail);
}

/* A rail that started no op for spare_idle_ns frees its kept buffers: a
 * job that stopped communicating (evaluation, a checkpoint, the end of
 * training) held up to COHORT_STASH_BYTES and 4 x 256 MiB per rail until
 * finalize. The next op allocates, and faults in, what it needs again.
 * Called from the rail's periodic timer; ops_started tells whether an op
 * started and ended between two calls. */
static void trim_idle(en_rail_t *rail, uint64_t now)
{
    if (rail->ops_started != rail->idle_mark || rail->ops_head || rail->wait_head) {
        rail->idle_mark = rail->ops_started;
        rail->idle_since_ns = now;
        return;
    }
    if (!rail->spare_idle_ns || now - rail->idle_since_ns < rail->spare_idle_ns) return;
    uint64_t freed = free_spares(rail);
    if (freed) {
        coh_alloc_release();
        atomic_fetch_add(&rail->stat_trimmed, freed);
        bs_log(COH_LOG_DEBUG,
               "rank %d rail %d: idle for %llu ms, freed %llu bytes kept for later ops", rail->rank,
               rail->index, (unsigned long long)((now - rail->idle_since_ns) / 1000000ull),
               (unsigned long long)freed);
    }
}

/* Periodic check: ops without progress for timeout_ms fail; a failed op
 * whose writes do not drain (the peer stopped reading) closes those
 * connections so the writes are cancelled and the op can end. */
void en_exec_check_timeouts(en_rail_t *rail)
{
    uint64_t now = bs_now_ns(), limit = (uint64_t)rail->timeout_ms * 1000000ull;
    /* Frames kept for an op that never came: its peers have long failed it. */
    en_stash_t *next;
    for (en_stash_t *e = rail->stash_head; e; e = next) {
        next = e->next;
        if (e->complete && now - e->t_ns > 2 * limit) stash_unlink(rail, e);
    }
    trim_idle(rail, now);
    for (;;) {
        en_op_t *op = rail->ops_head;
        while (op && !(op->state == EN_OP_RUNNING && now - op->t_progress_ns > limit))
            op = op->next;
        if (!op) break;
        char waiting[128] = "";
        size_t wl = 0;
        int named[8], nnamed = 0;
        for (uint32_t i = 0; i < op->plan.nsteps && nnamed < 8; i++) {
            const sc_step_t *s = &op->plan.steps[i];
            if (op->sstate[i] != EN_STEP_RUN || s->peer < 0) continue;
            bool seen = false;
            for (int k = 0; k < nnamed && !seen; k++) seen = named[k] == s->peer;
            if (seen) continue;
            named[nnamed++] = s->peer;
            wl += (size_t)snprintf(waiting + wl, sizeof(waiting) - wl, " %d", s->peer);
        }
        char why[BS_ERR_LEN];
        snprintf(why, sizeof(why), "no progress for %d ms (waiting on rank(s)%s)", rail->timeout_ms,
                 wl ? waiting : " none");
        en_exec_fail_op(op, COH_ETIMEDOUT, true, why);
    }
    /* Closing a conn cancels its writes, whose callbacks come later: no op
     * ends inside this loop. */
    for (en_op_t *op = rail->ops_head; op; op = op->next) {
        if (op->state != EN_OP_FAILED || !op->writes_out ||
            now - op->t_fail_ns <= limit / 2 + 1000000000ull)
            continue;
        for (uint32_t w = 0; w < op->nwreqs; w++) {
            en_wreq_t *wr = &op->wreqs[w];
            if (op->sstate[wr->step] == EN_STEP_RUN && wr->conn && wr->conn->state == EN_CONN_READY)
                wr->conn->ops->tr_close(wr->conn, COH_ETIMEDOUT, "send stuck after its op failed");
        }
    }
}
