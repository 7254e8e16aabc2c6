/*
 * rx_trace.c - the timeline: events in memory, a Chrome trace at finalize.
 * See rx_trace.h.
 */
#include "reactor/rx_trace.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "base/base.h"
#include "base/bs_alloc.h"
#include "reactor/rx_ctx.h"

/* At most this many events per rank (~64 MiB); later ones are counted. */
#define TRACE_MAX_EVENTS (256u * 1024u)
#define TRACE_ARGS       256

typedef struct tev {
    uint64_t ts_ns, dur_ns, id;
    const char *cat, *name; /* static strings */
    int tid;
    char ph;
    char args[TRACE_ARGS];
} tev_t;

struct rx_trace {
    uv_mutex_t mu;
    tev_t *ev;
    size_t n, cap;
    uint64_t dropped;
    char path[512];
    int64_t offset_ns; /* this rank's clock minus rank 0's */
    int offset_rounds;
    double offset_spread_us; /* max - min over the rounds: the measurement's precision */
};

int rx_trace_open(struct coh_ctx *ctx)
{
    const char *pat = NULL;
    BS_CHECK(rx_env_knob_str("timeline", &pat));
    if (!pat || !*pat) return 0;
    rx_trace_t *t = coh_zalloc(sizeof(*t));
    if (!t) return bs_fail(COH_ENOMEM, "COHORT_TIMELINE: out of memory");
    const char *pc = strstr(pat, "%d");
    if (pc)
        snprintf(t->path, sizeof(t->path), "%.*s%d%s", (int)(pc - pat), pat, ctx->rank, pc + 2);
    else
        snprintf(t->path, sizeof(t->path), "%s.%d.json", pat, ctx->rank);
    uv_mutex_init(&t->mu);
    ctx->trace = t;
    return 0;
}

void rx_trace_add(rx_trace_t *t, char ph, const char *cat, const char *name, int tid,
                  uint64_t ts_ns, uint64_t dur_ns, uint64_t id, const char *args)
{
    if (!t) return;
    uv_mutex_lock(&t->mu);
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 4096;
        tev_t *ev = t->n < TRACE_MAX_EVENTS ? coh_realloc(t->ev, cap * sizeof(tev_t)) : NULL;
        if (!ev) {
            t->dropped++;
            uv_mutex_unlock(&t->mu);
            return;
        }
        t->ev = ev;
        t->cap = cap;
    }
    tev_t *e = &t->ev[t->n++];
    e->ts_ns = ts_ns;
    e->dur_ns = dur_ns;
    e->id = id;
    e->cat = cat;
    e->name = name;
    e->tid = tid;
    e->ph = ph;
    /* The callers bound their args; one cut anyway would not be JSON. */
    if (args && strlen(args) >= sizeof(e->args))
        snprintf(e->args, sizeof(e->args), "\"args_cut\":true");
    else
        snprintf(e->args, sizeof(e->args), "%s", args ? args : "");
    uv_mutex_unlock(&t->mu);
}

void rx_trace_escape(const char *s, char *out, size_t cap)
{
    size_t k = 0;
    for (; s && *s && k + 7 < cap; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') {
            out[k++] = '\\';
            out[k++] = (char)ch;
        } else if (ch < 0x20) {
            k += (size_t)snprintf(out + k, cap - k, "\\u%04x", ch);
        } else {
            out[k++] = (char)ch;
        }
    }
    out[k < cap ? k : cap - 1] = 0;
}

/* One timestamp: microseconds on this rank's clock (the merge tool moves
 * them onto rank 0's with clock_offset_us). */
static double us(uint64_t ns)
{
    return (double)ns / 1e3;
}

/* Time order; at one time a begin before what it encloses, longer before
 * shorter, an end last. */
static int ph_rank(char ph)
{
    return ph == 'b' ? 0 : ph == 'X' ? 1 : ph == 'i' ? 2 : 3;
}

static int by_ts(const void *a, const void *b)
{
    const tev_t *x = a, *y = b;
    if (x->ts_ns != y->ts_ns) return x->ts_ns < y->ts_ns ? -1 : 1;
    if (ph_rank(x->ph) != ph_rank(y->ph)) return ph_rank(x->ph) - ph_rank(y->ph);
    return x->dur_ns > y->dur_ns ? -1 : x->dur_ns < y->dur_ns;
}

void rx_trace_close(struct coh_ctx *ctx)
{
    rx_trace_t *t = ctx->trace;
    if (!t) return;
    ctx->trace = NULL;
    FILE *f = fopen(t->path, "w");
    if (!f) {
        bs_log(COH_LOG_WARN, "COHORT_TIMELINE: cannot write %s: %s", t->path, strerror(errno));
    } else {
        /* In time order: a viewer nests complete events by their order. */
        qsort(t->ev, t->n, sizeof(tev_t), by_ts);
        fprintf(f,
                "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"rank\":%d,\"world\":%d,"
                "\"clock_offset_us\":%.3f,\"offset_rounds\":%d,\"offset_spread_us\":%.3f,"
                "\"events\":%zu,\"dropped\":%llu,\"requests\":%llu},\"traceEvents\":[\n",
                ctx->rank, ctx->world, (double)t->offset_ns / 1e3, t->offset_rounds,
                t->offset_spread_us, t->n, (unsigned long long)t->dropped,
                (unsigned long long)(atomic_load(&ctx->n_completed) + atomic_load(&ctx->n_failed)));
        fprintf(f,
                "{\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"name\":\"process_name\","
                "\"args\":{\"name\":\"rank %d\"}},\n",
                ctx->rank, ctx->rank);
        fprintf(f,
                "{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"thread_name\","
                "\"args\":{\"name\":\"sync\"}},\n",
                ctx->rank, RX_TR_SYNC);
        fprintf(f,
                "{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"thread_name\","
                "\"args\":{\"name\":\"coordinator\"}},\n",
                ctx->rank, RX_TR_COORD);
        for (int r = 0; r < ctx->nrails; r++)
            fprintf(f,
                    "{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"thread_name\","
                    "\"args\":{\"name\":\"rail %d\"}},\n",
                    ctx->rank, RX_TR_RAIL0 + r, r);
        for (size_t i = 0; i < t->n; i++) {
            const tev_t *e = &t->ev[i];
            fprintf(f,
                    "{\"ph\":\"%c\",\"cat\":\"%s\",\"name\":\"%s\",\"pid\":%d,\"tid\":%d,"
                    "\"ts\":%.3f",
                    e->ph, e->cat, e->name, ctx->rank, e->tid, us(e->ts_ns));
            if (e->ph == 'X') fprintf(f, ",\"dur\":%.3f", (double)e->dur_ns / 1e3);
            if (e->ph == 'b' || e->ph == 'e')
                fprintf(f, ",\"id\":\"0x%llx\"", (unsigned long long)e->id);
            if (e->ph == 'i') fprintf(f, ",\"s\":\"t\"");
            fprintf(f, ",\"args\":{%s}}%s\n", e->args, i + 1 < t->n ? "," : "");
        }
        fprintf(f, "]}\n");
        if (fclose(f) != 0) bs_log(COH_LOG_WARN, "COHORT_TIMELINE: writing %s failed", t->path);
    }
    uv_mutex_destroy(&t->mu);
    coh_free(t->ev);
    coh_free(t);
}

int rx_trace_measure_offset(struct coh_ctx *ctx)
{
    rx_trace_t *t = ctx->trace;
    if (!t || ctx->world < 2) return 0;
    /* Every round: a barrier, then each rank's clock as it left it,
     * gathered. Ranks leave a barrier within about one message latency of
     * each other, so t_r - t_0 is the offset to that precision; the median
     * of the rounds is kept and the spread reported. */
    enum { ROUNDS = 5 };
    int64_t off[ROUNDS];
    int64_t *all = coh_calloc((size_t)ctx->world, sizeof(int64_t));
    if (!all) return bs_fail(COH_ENOMEM, "COHORT_TIMELINE: out of memory");
    int st = 0;
    for (int k = 0; k < ROUNDS && st == 0; k++) {
        coh_request_t *req;
        st = coh_barrier(&ctx->world_comm, &req);
        if (st == 0) st = coh_wait(req, -1), coh_request_free(req);
        int64_t now = (int64_t)bs_now_ns();
        if (st == 0) st = coh_allgather(&ctx->world_comm, &now, all, 1, COH_I64, &req);
        if (st == 0) st = coh_wait(req, -1), coh_request_free(req);
        off[k] = all[ctx->rank] - all[0];
    }
    coh_free(all);
    if (st) return st;
    for (int i = 1; i < ROUNDS; i++) /* insertion sort of five */
        for (int j = i; j > 0 && off[j] < off[j - 1]; j--) {
            int64_t x = off[j];
            off[j] = off[j - 1];
            off[j - 1] = x;
        }
    t->offset_ns = off[ROUNDS / 2];
    t->offset_rounds = ROUNDS;
    t->offset_spread_us = (double)(off[ROUNDS - 1] - off[0]) / 1e3;
    return 0;
}
