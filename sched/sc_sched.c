/*
 * The scheduler: events in, decisions out (see sched.h). One object per
 * scheduled communicator; single-threaded; no allocation after create except
 * for the CDF windows, which grow on their first samples.
 */
#include "sched/sched.h"

#include "base/bs_alloc.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cohort.h"
#include "sched/sc_bag.h"

#define SC_MAX_WORKERS (1 << 20)
#define SLOT_BITS      20

typedef struct sc_worker {
    double t_start; /* start of the current iteration */
    double t_ready;
    double bw; /* estimate, Gbps */
    uint64_t iters;
    int32_t slot; /* running group, -1 */
    int32_t next; /* next worker of the same group, -1 */
    uint8_t state;
    uint8_t suspected;
    uint8_t ended; /* its own part of the running group is done (t_start set) */
    sc_cdf_t cdf;
} sc_worker_t;

typedef struct sc_group {
    uint64_t id; /* 0: free slot */
    int head;    /* members then relays, linked through sc_worker_t.next */
    bool relay;  /* has relays: phase 2 pending */
    double t_launch, expected_raw, phase1_end, t_first_ready;
    bool p1_reported;
} sc_group_t;

struct sc_sched {
    sc_params_t prm;
    sc_cost_t cost;
    int n, n_live, p_param;
    sc_worker_t *w;
    sc_cdf_t pool;

    int *q; /* ready queue in arrival order */
    int nq;

    int *order; /* every worker by sc_cand_before on its estimate */
    bool order_dirty;

    sc_group_t *g;
    int *free_slots;
    int nfree;
    uint64_t seq;

    /* scratch for one evaluation */
    sc_cand_t *qc, *sc, *tmp, *bscratch;
    int *bounds;
    int *ibuf, *ibuf2; /* n ids each */
    uint64_t *rkey;    /* 2n radix-sort keys */
    int *rid;          /* n ids, radix-sort scratch */
    uint64_t *it_tmp;
    double now; /* time of the evaluation in progress */

    /* outputs of the last tick */
    sc_decision_t *dec;
    int ndec, nlaunch, dec_cap;
    int *mem;
    int nmem, mem_cap;
    double *wts;
    int nwts, wts_cap;

    double t_last;
    bool dirty;
    double next_eval;
    int64_t round; /* Alg. 3's k */
    double calib;
    int64_t evaluations, launches, waits, suspects;
};

/* ---- parameters: generated from SC_PARAM_MAP (sched.h) ---- */

_Static_assert(sizeof(sc_policy) == sizeof(int) && sizeof(sc_cost_form) == sizeof(int) &&
                   sizeof(sc_eq4_reading) == sizeof(int),
               "enum parameters are stored as int");

static const sc_param_info_t param_info[] = {
#define SC__INFO(nm, field, kind, scale, deflt, range, help)                                       \
    {nm, deflt, range, help, kind, scale, offsetof(sc_params_t, field)},
    SC_PARAM_MAP(SC__INFO)
#undef SC__INFO
};
#define NPARAMS ((int)(sizeof(param_info) / sizeof(param_info[0])))

const sc_param_info_t *sc_params_info(int *count)
{
    if (count) *count = NPARAMS;
    return param_info;
}

static const char *const policy_names[SC_POLICY_COUNT] = {"allreduce", "partial", "selective",
                                                          "relay"};

int sc_policy_from_name(const char *name, sc_policy *out)
{
    if (!name || !out) return COH_EINVAL;
    for (int i = 0; i < SC_POLICY_COUNT; i++) {
        if (strcmp(name, policy_names[i]) == 0) {
            *out = (sc_policy)i;
            return 0;
        }
    }
    return COH_EINVAL;
}

const char *sc_policy_name(sc_policy policy)
{
    return (unsigned)policy < SC_POLICY_COUNT ? policy_names[policy] : "unknown";
}

/* "(0, 1]", "[1, inf)": the bounds and whether each end is included. */
typedef struct interval {
    double lo, hi;
    bool lo_in, hi_in;
} interval_t;

static bool parse_interval(const char *r, interval_t *iv)
{
    char lb, rb;
    char los[32], his[32];
    if (sscanf(r, " %c %31[^,], %31[^])] %c", &lb, los, his, &rb) != 4) return false;
    iv->lo = strtod(los, NULL);
    iv->hi = strtod(his, NULL);
    iv->lo_in = lb == '[';
    iv->hi_in = rb == ']';
    return true;
}

static bool in_interval(double v, const char *range)
{
    interval_t iv;
    if (!parse_interval(range, &iv) || !isfinite(v)) return false;
    return (iv.lo_in ? v >= iv.lo : v > iv.lo) && (iv.hi_in ? v <= iv.hi : v < iv.hi);
}

/* The index of value among "a|b|c", or -1. */
static int name_index(const char *names, const char *value)
{
    size_t n = strlen(value);
    int i = 0;
    for (const char *q = names; *q; i++) {
        const char *bar = strchr(q, '|');
        size_t len = bar ? (size_t)(bar - q) : strlen(q);
        if (len == n && !strncmp(q, value, n)) return i;
        if (!bar) break;
        q = bar + 1;
    }
    return -1;
}

static int parse_bool(const char *v, bool *out)
{
    if (!strcmp(v, "1") || !strcmp(v, "true") || !strcmp(v, "yes") || !strcmp(v, "on")) {
        *out = true;
        return 0;
    }
    if (!strcmp(v, "0") || !strcmp(v, "false") || !strcmp(v, "no") || !strcmp(v, "off")) {
        *out = false;
        return 0;
    }
    return COH_EINVAL;
}

/* Parse value as parameter pi into the struct t (no range check). */
static int param_parse(const sc_param_info_t *pi, const char *value, sc_params_t *t)
{
    char *f = (char *)t + pi->off;
    char *end;
    switch (pi->kind) {
    case SC_PK_DBL: {
        double x = strtod(value, &end);
        if (end == value || *end != '\0' || !isfinite(x)) return COH_EINVAL;
        *(double *)f = x * pi->scale;
        return 0;
    }
    case SC_PK_INT: {
        long x = strtol(value, &end, 10);
        if (end == value || *end != '\0' || x < -2147483647L || x > 2147483647L) return COH_EINVAL;
        *(int *)f = (int)x;
        return 0;
    }
    case SC_PK_BOOL: return parse_bool(value, (bool *)f);
    case SC_PK_ENUM:
    case SC_PK_ENUMB: {
        int i = name_index(pi->range, value);
        if (i < 0) return COH_EINVAL;
        if (pi->kind == SC_PK_ENUM)
            *(int *)f = i;
        else
            *(bool *)f = i != 0;
        return 0;
    }
    }
    return COH_EINVAL;
}

/* Is the value the struct holds for pi within its range? */
static bool param_ok(const sc_param_info_t *pi, const sc_params_t *t)
{
    const char *f = (const char *)t + pi->off;
    switch (pi->kind) {
    case SC_PK_DBL: return in_interval(*(const double *)f / pi->scale, pi->range);
    case SC_PK_INT: {
        interval_t iv;
        int v = *(const int *)f;
        return parse_interval(pi->range, &iv) && (iv.lo_in ? v >= iv.lo : v > iv.lo) &&
               (isinf(iv.hi) || (iv.hi_in ? v <= iv.hi : v < iv.hi));
    }
    case SC_PK_BOOL:
    case SC_PK_ENUMB: return true;
    case SC_PK_ENUM: {
        int v = *(const int *)f, n = 1;
        for (const char *q = pi->range; *q; q++) n += *q == '|';
        return v >= 0 && v < n;
    }
    }
    return false;
}

void sc_params_default(sc_params_t *p)
{
    memset(p, 0, sizeof(*p));
    for (int i = 0; i < NPARAMS; i++) param_parse(&param_info[i], param_info[i].deflt, p);
}

int sc_params_set(sc_params_t *p, const char *name, const char *value)
{
    if (!p || !name || !value) return COH_EINVAL;
    char key[32];
    size_t len = strlen(name);
    if (len >= sizeof(key)) return COH_EINVAL;
    /* Environment-style names (P_FRAC, dt_ms) are accepted too. */
    for (size_t i = 0; i <= len; i++) {
        char ch = name[i];
        if (ch == '_') ch = '-';
        if (ch >= 'A' && ch <= 'Z') ch = (char)(ch - 'A' + 'a');
        key[i] = ch;
    }
    if (!strcmp(key, "policy")) memcpy(key, "scheme", 7);
    for (int i = 0; i < NPARAMS; i++) {
        if (strcmp(key, param_info[i].name) != 0) continue;
        sc_params_t t = *p;
        if (param_parse(&param_info[i], value, &t) < 0 || !param_ok(&param_info[i], &t))
            return COH_EINVAL;
        *p = t;
        return 0;
    }
    return COH_EINVAL;
}

int sc_params_validate(const sc_params_t *p, int n)
{
    if (!p || n < 1 || n > SC_MAX_WORKERS) return COH_EINVAL;
    for (int i = 0; i < NPARAMS; i++)
        if (!param_ok(&param_info[i], p)) return COH_EINVAL;
    if (p->p > n) return COH_EINVAL;
    return 0;
}

int sc_params_p(const sc_params_t *p, int n)
{
    if (p->p > 0) return p->p < n ? p->p : n;
    long v = lround(p->p_frac * n);
    if (v < 1) v = 1;
    if (v > n) v = n;
    return (int)v;
}

/* ---- names ---- */

static const char *const why_names[SC_WHY_COUNT] = {
#define SC__WHY_NAME(name, msg) #name,
    SC_WHY_MAP(SC__WHY_NAME)
#undef SC__WHY_NAME
};
static const char *const why_msgs[SC_WHY_COUNT] = {
#define SC__WHY_MSG(name, msg) msg,
    SC_WHY_MAP(SC__WHY_MSG)
#undef SC__WHY_MSG
};

const char *sc_why_name(sc_why why)
{
    return (unsigned)why < SC_WHY_COUNT ? why_names[why] : "UNKNOWN";
}

const char *sc_why_message(sc_why why)
{
    return (unsigned)why < SC_WHY_COUNT ? why_msgs[why] : "unknown";
}

/* ---- lifetime ---- */

void sc_sched_destroy(sc_sched_t *s)
{
    if (!s) return;
    if (s->w)
        for (int i = 0; i < s->n; i++) sc_cdf_free(&s->w[i].cdf);
    sc_cdf_free(&s->pool);
    coh_free(s->w);
    coh_free(s->q);
    coh_free(s->order);
    coh_free(s->g);
    coh_free(s->free_slots);
    coh_free(s->qc);
    coh_free(s->sc);
    coh_free(s->tmp);
    coh_free(s->bscratch);
    coh_free(s->bounds);
    coh_free(s->ibuf);
    coh_free(s->ibuf2);
    coh_free(s->rkey);
    coh_free(s->rid);
    coh_free(s->it_tmp);
    coh_free(s->dec);
    coh_free(s->mem);
    coh_free(s->wts);
    coh_free(s);
}

int sc_sched_create(const sc_params_t *params, int n, sc_sched_t **out)
{
    if (!params || !out) return COH_EINVAL;
    *out = NULL;
    int rc = sc_params_validate(params, n);
    if (rc) return rc;
    sc_sched_t *s = coh_zalloc(sizeof(*s));
    if (!s) return COH_ENOMEM;
    s->prm = *params;
    s->n = n;
    s->n_live = n;
    s->p_param = sc_params_p(params, n);
    s->cost = (sc_cost_t){.alpha_s = params->alpha_s,
                          .model_gbit = params->model_mb * 8.0 / 1000.0,
                          .form = params->cost_form};
    size_t un = (size_t)n;
    s->w = coh_calloc(un, sizeof(*s->w));
    s->q = coh_reallocn(NULL, un, sizeof(int));
    s->order = coh_reallocn(NULL, un, sizeof(int));
    s->g = coh_calloc(un, sizeof(*s->g));
    s->free_slots = coh_reallocn(NULL, un, sizeof(int));
    s->qc = coh_reallocn(NULL, un, sizeof(sc_cand_t));
    s->sc = coh_reallocn(NULL, un, sizeof(sc_cand_t));
    s->tmp = coh_reallocn(NULL, un, sizeof(sc_cand_t));
    s->bscratch = coh_reallocn(NULL, 2 * un, sizeof(sc_cand_t));
    s->bounds = coh_reallocn(NULL, un + 2, sizeof(int));
    s->ibuf = coh_reallocn(NULL, un, sizeof(int));
    s->ibuf2 = coh_reallocn(NULL, un, sizeof(int));
    s->rkey = coh_reallocn(NULL, 2 * un, sizeof(uint64_t));
    s->rid = coh_reallocn(NULL, un, sizeof(int));
    s->it_tmp = coh_reallocn(NULL, un, sizeof(uint64_t));
    /* Per tick: every worker is in at most one launch or wait record, plus
     * relays and suspects; a few records carry no members. */
    s->dec_cap = 3 * n + 8;
    s->mem_cap = 3 * n + 8;
    s->wts_cap = n + 8;
    s->dec = coh_reallocn(NULL, (size_t)s->dec_cap, sizeof(sc_decision_t));
    s->mem = coh_reallocn(NULL, (size_t)s->mem_cap, sizeof(int));
    s->wts = coh_reallocn(NULL, (size_t)s->wts_cap, sizeof(double));
    if (!s->w || !s->q || !s->order || !s->g || !s->free_slots || !s->qc || !s->sc || !s->tmp ||
        !s->bscratch || !s->bounds || !s->ibuf || !s->ibuf2 || !s->rkey || !s->rid || !s->it_tmp ||
        !s->dec || !s->mem || !s->wts) {
        sc_sched_destroy(s);
        return COH_ENOMEM;
    }
    for (int i = 0; i < n; i++) {
        sc_worker_t *w = &s->w[i];
        w->state = SC_W_COMPUTING;
        w->slot = -1;
        w->next = -1;
        w->bw = params->default_gbps;
        sc_cdf_init(&w->cdf, params->cdf_window);
        s->order[i] = i;
        s->free_slots[i] = n - 1 - i;
    }
    /* Touch every scratch page now: the first decisions of a long-lived
     * scheduler should not pay the page faults (a 2048-worker scheduler has
     * ~1.5 MB of scratch). */
    memset(s->qc, 0, un * sizeof(sc_cand_t));
    memset(s->sc, 0, un * sizeof(sc_cand_t));
    memset(s->tmp, 0, un * sizeof(sc_cand_t));
    memset(s->bscratch, 0, 2 * un * sizeof(sc_cand_t));
    memset(s->bounds, 0, (un + 2) * sizeof(int));
    memset(s->ibuf, 0, un * sizeof(int));
    memset(s->ibuf2, 0, un * sizeof(int));
    memset(s->it_tmp, 0, un * sizeof(uint64_t));
    memset(s->rkey, 0, 2 * un * sizeof(uint64_t));
    memset(s->rid, 0, un * sizeof(int));
    memset(s->dec, 0, (size_t)s->dec_cap * sizeof(sc_decision_t));
    memset(s->mem, 0, (size_t)s->mem_cap * sizeof(int));
    memset(s->wts, 0, (size_t)s->wts_cap * sizeof(double));
    sc_cdf_init(&s->pool, params->cdf_pool_window);
    s->nfree = n;
    s->seq = 1;
    s->calib = 1.0;
    s->next_eval = INFINITY;
    s->dirty = true;
    *out = s;
    return 0;
}

/* ---- events ---- */

static bool bad_worker(const sc_sched_t *s, int w)
{
    return !s || w < 0 || w >= s->n;
}

static int check_time(sc_sched_t *s, double t)
{
    if (!isfinite(t) || t < s->t_last) return COH_EINVAL;
    s->t_last = t;
    return 0;
}

int sc_sched_on_compute_start(sc_sched_t *s, int w, double t)
{
    if (bad_worker(s, w) || !isfinite(t)) return COH_EINVAL;
    sc_worker_t *x = &s->w[w];
    if (x->state != SC_W_COMPUTING && x->state != SC_W_RELAY) return COH_ESTATE;
    x->t_start = t;
    return 0;
}

int sc_sched_on_ready(sc_sched_t *s, int w, double t, double compute_s)
{
    if (bad_worker(s, w) || !isfinite(t) || isnan(compute_s)) return COH_EINVAL;
    sc_worker_t *x = &s->w[w];
    if (x->state != SC_W_COMPUTING && x->state != SC_W_RELAY) return COH_ESTATE;
    int rc = check_time(s, t);
    if (rc) return rc;
    double c = compute_s >= 0 ? compute_s : t - x->t_start;
    if (c < 0) c = 0;
    /* Cold start: every observed iteration feeds the worker's CDF and the
     * pooled one (both ignore it when a warm start froze them). */
    if (s->prm.cdf_per_worker) {
        rc = sc_cdf_add(&x->cdf, c);
        if (rc) return rc;
    }
    rc = sc_cdf_add(&s->pool, c);
    if (rc) return rc;
    x->iters++;
    x->t_ready = t;
    if (x->state == SC_W_RELAY) {
        /* A relay of a running relay group: its data joins phase 2. */
        x->state = SC_W_RELAY_READY;
    } else {
        x->state = SC_W_READY;
        s->q[s->nq++] = w;
    }
    s->dirty = true;
    return 0;
}

static sc_group_t *group_of(sc_sched_t *s, uint64_t id)
{
    uint64_t slot = id & ((1u << SLOT_BITS) - 1);
    if (id == 0 || slot >= (uint64_t)s->n || s->g[slot].id != id) return NULL;
    return &s->g[slot];
}

int sc_sched_on_group_done(sc_sched_t *s, uint64_t group_id, double t, double duration_s)
{
    if (!s || !isfinite(t) || isnan(duration_s)) return COH_EINVAL;
    sc_group_t *g = group_of(s, group_id);
    if (!g) return COH_EINVAL;
    int rc = check_time(s, t);
    if (rc) return rc;
    for (int i = g->head; i >= 0;) {
        sc_worker_t *x = &s->w[i];
        int nx = x->next;
        if (x->state == SC_W_SYNCING || x->state == SC_W_RELAY_READY) {
            x->state = SC_W_COMPUTING;
            if (!x->ended) x->t_start = t;
        } else if (x->state == SC_W_RELAY) {
            /* Finished without this relay's data (the caller excluded it):
             * it keeps computing its current iteration. */
            x->state = SC_W_COMPUTING;
        }
        x->slot = -1;
        x->next = -1;
        x->ended = 0;
        i = nx;
    }
    /* Measured against expected corrects the cost model (bandwidth estimate
     * errors, protocol overheads). Relay groups are left out: their duration
     * includes waiting for late relays. */
    if (!g->relay && g->expected_raw > 0 && duration_s > 0 && s->prm.calib_gain > 0) {
        double ratio = duration_s / g->expected_raw;
        s->calib += s->prm.calib_gain * (ratio - s->calib);
    }
    int slot = (int)(g - s->g);
    memset(g, 0, sizeof(*g));
    s->free_slots[s->nfree++] = slot;
    if (s->prm.policy == SC_POLICY_RELAY) s->dirty = true;
    return 0;
}

int sc_sched_on_member_done(sc_sched_t *s, int w, double t)
{
    if (bad_worker(s, w) || !isfinite(t)) return COH_EINVAL;
    sc_worker_t *x = &s->w[w];
    if (x->state != SC_W_SYNCING || x->slot < 0) return COH_ESTATE;
    x->t_start = t;
    x->ended = 1;
    return 0;
}

int sc_sched_on_phase1_done(sc_sched_t *s, uint64_t group_id, double t)
{
    if (!s || !isfinite(t)) return COH_EINVAL;
    sc_group_t *g = group_of(s, group_id);
    if (!g) return COH_EINVAL;
    int rc = check_time(s, t);
    if (rc) return rc;
    g->phase1_end = t;
    g->p1_reported = true;
    return 0;
}

int sc_sched_on_bandwidth(sc_sched_t *s, int w, double gbps)
{
    if (bad_worker(s, w) || !(gbps > 0) || !isfinite(gbps)) return COH_EINVAL;
    if (s->w[w].bw != gbps) {
        s->w[w].bw = gbps;
        s->order_dirty = true;
    }
    return 0;
}

int sc_sched_on_worker_lost(sc_sched_t *s, int w)
{
    if (bad_worker(s, w)) return COH_EINVAL;
    sc_worker_t *x = &s->w[w];
    if (x->state == SC_W_LOST) return 0;
    if (x->state == SC_W_READY) {
        int j = 0;
        for (int i = 0; i < s->nq; i++)
            if (s->q[i] != w) s->q[j++] = s->q[i];
        s->nq = j;
    }
    x->state = SC_W_LOST; /* a member of a running group stays linked until it is done */
    s->n_live--;
    s->dirty = true;
    return 0;
}

int sc_sched_on_worker_back(sc_sched_t *s, int w, double t)
{
    if (bad_worker(s, w) || !isfinite(t)) return COH_EINVAL;
    sc_worker_t *x = &s->w[w];
    if (x->state != SC_W_LOST) return 0;
    if (x->slot != -1) return COH_ESTATE; /* still linked to a running group */
    x->state = SC_W_COMPUTING;
    x->t_start = t;
    x->suspected = 0;
    s->n_live++;
    s->dirty = true;
    return 0;
}

int sc_sched_load_cdf(sc_sched_t *s, int w, const double *samples, int count)
{
    if (!s || w < -1 || w >= s->n) return COH_EINVAL;
    return sc_cdf_load(w < 0 ? &s->pool : &s->w[w].cdf, samples, count);
}

/* ---- estimates ---- */

static const sc_cdf_t *cdf_for(const sc_sched_t *s, int w)
{
    const sc_cdf_t *own = &s->w[w].cdf;
    /* A CDF loaded for this worker is used as is; a learned one once it has
     * enough samples to say more than the pool. */
    if (s->prm.cdf_per_worker && own->count > 0 &&
        (own->frozen || own->count >= s->prm.cdf_min_samples))
        return own;
    return &s->pool;
}

double sc_sched_prob_ready(const sc_sched_t *s, int w, double elapsed)
{
    if (bad_worker(s, w)) return 0;
    return sc_cdf_prob_ready(cdf_for(s, w), elapsed, s->prm.dt_s, s->prm.eq4,
                             s->prm.overdue_factor);
}

static double prob_cb(void *ctx, int w)
{
    sc_sched_t *s = ctx;
    return sc_sched_prob_ready(s, w, s->now - s->w[w].t_start);
}

double sc_sched_bandwidth(const sc_sched_t *s, int w)
{
    return bad_worker(s, w) ? 0 : s->w[w].bw;
}

int sc_sched_worker_state(const sc_sched_t *s, int w)
{
    return bad_worker(s, w) ? COH_EINVAL : s->w[w].state;
}

int sc_sched_stats(const sc_sched_t *s, sc_sched_stats_t *st)
{
    if (!s || !st) return COH_EINVAL;
    memset(st, 0, sizeof(*st));
    st->n = s->n;
    st->n_live = s->n_live;
    st->n_ready = s->nq;
    st->n_groups = s->n - s->nfree;
    st->p = s->p_param < s->n_live ? s->p_param : s->n_live;
    st->round = s->round;
    st->evaluations = s->evaluations;
    st->launches = s->launches;
    st->waits = s->waits;
    st->suspects = s->suspects;
    st->calib = s->calib;
    return 0;
}

double sc_sched_next_tick(const sc_sched_t *s)
{
    if (!s) return INFINITY;
    return s->dirty ? s->t_last : s->next_eval;
}

/* ---- decision records ---- */

static int eff_p(const sc_sched_t *s)
{
    /* With dead workers p may exceed the live count: clamp, or nobody could
     * ever form a group again. */
    int p = s->p_param < s->n_live ? s->p_param : s->n_live;
    return p < 1 ? 1 : p;
}

static sc_decision_t *new_dec(sc_sched_t *s, sc_dec_kind kind, sc_why why)
{
    sc_decision_t *d = &s->dec[s->ndec++];
    memset(d, 0, sizeof(*d));
    d->kind = kind;
    d->why = why;
    d->t = s->now;
    d->ex.n_ready = s->nq;
    d->ex.n_live = s->n_live;
    d->ex.p = eff_p(s);
    d->ex.round = s->round;
    return d;
}

static int *take_mem(sc_sched_t *s, int m)
{
    int *p = &s->mem[s->nmem];
    s->nmem += m;
    return p;
}

static void record_wait(sc_sched_t *s, sc_why why, const int *ids, int m, const sc_explain_t *ex)
{
    sc_decision_t *d = new_dec(s, SC_DEC_WAIT, why);
    if (ex) {
        sc_explain_t keep = d->ex;
        d->ex = *ex;
        d->ex.n_ready = keep.n_ready;
        d->ex.n_live = keep.n_live;
        d->ex.p = keep.p;
        d->ex.round = keep.round;
    }
    int *mem = take_mem(s, m);
    memcpy(mem, ids, (size_t)m * sizeof(int));
    d->nmembers = m;
    d->members = mem;
    s->waits++;
}

static void explain_from_bpawr(sc_explain_t *ex, const sc_bpawr_out_t *o)
{
    memset(ex, 0, sizeof(*ex));
    ex->n_cand = o->n_cand;
    ex->sum_prob = o->sum_prob;
    ex->k_virtual = o->k_virtual;
    ex->b_virtual = o->b_virtual;
    ex->bmin_g = o->bmin_g;
    ex->bmin_gstar = o->bmin_gstar;
    ex->gstar_size = o->gstar_size;
    ex->n_delta = o->n_delta;
    ex->t_x = o->t_x;
    ex->threshold = o->threshold;
}

/*
 * Launch members (ring order) and, for a relay group, relays. Marks their
 * states, links the group, writes the LAUNCH record. Ready members are
 * dropped from the queue by the caller (compact_queue).
 */
static sc_decision_t *launch(sc_sched_t *s, sc_why why, const int *ids, int m, const int *relays,
                             int nr, double expected_raw, double phase1_raw, double t_first)
{
    int slot = s->free_slots[--s->nfree];
    sc_group_t *g = &s->g[slot];
    memset(g, 0, sizeof(*g));
    g->id = (s->seq++ << SLOT_BITS) | (uint64_t)slot;
    g->relay = nr > 0;
    g->t_launch = s->now;
    g->expected_raw = expected_raw;
    g->phase1_end = s->now + phase1_raw * s->calib;
    g->t_first_ready = t_first;
    g->head = -1;

    sc_decision_t *d = new_dec(s, SC_DEC_LAUNCH, why);
    d->group_id = g->id;
    int *mem = take_mem(s, m + nr);
    memcpy(mem, ids, (size_t)m * sizeof(int));
    if (nr) memcpy(mem + m, relays, (size_t)nr * sizeof(int));
    d->members = mem;
    d->nmembers = m;
    d->relays = nr ? mem + m : NULL;
    d->nrelays = nr;
    for (int i = 0; i < m + nr; i++) s->it_tmp[i] = s->w[mem[i]].iters;
    double *wt = &s->wts[s->nwts];
    s->nwts += m + nr;
    sc_weights_from_iters(s->it_tmp, m + nr, wt);
    d->weights = wt;
    d->relay_weights = nr ? wt + m : NULL;
    d->expected_s = expected_raw * s->calib;
    d->phase1_s = phase1_raw * s->calib;
    d->full = m + nr == s->n_live && nr == 0;

    /* Link members then relays; the list order is irrelevant. */
    for (int i = m + nr - 1; i >= 0; i--) {
        sc_worker_t *x = &s->w[mem[i]];
        x->slot = slot;
        x->next = g->head;
        g->head = mem[i];
        x->state = i < m ? SC_W_SYNCING : SC_W_RELAY;
        x->suspected = 0;
    }
    s->launches++;
    s->nlaunch++;
    return d;
}

static void compact_queue(sc_sched_t *s)
{
    int j = 0;
    for (int i = 0; i < s->nq; i++)
        if (s->w[s->q[i]].state == SC_W_READY) s->q[j++] = s->q[i];
    s->nq = j;
}

/*
 * The bandwidth order of all workers (sc_cand_before: higher first, then by
 * id), rebuilt after bandwidth updates. A stable LSD radix sort on the IEEE
 * bits of the estimate (positive doubles order like their bits; inverted for
 * "higher first"), started from id order so that ties stay by id: 2048
 * workers in ~20 us where a comparison sort over the worker records took
 * 135 us and blew the decision budget. Bytes every key shares are skipped.
 */
static void sort_order(sc_sched_t *s)
{
    if (!s->order_dirty) return;
    int n = s->n;
    uint64_t *k = s->rkey, *k2 = s->rkey + n;
    int *id = s->order, *id2 = s->rid;
    for (int i = 0; i < n; i++) {
        uint64_t u;
        memcpy(&u, &s->w[i].bw, sizeof(u));
        k[i] = ~u;
        id[i] = i;
    }
    for (int shift = 0; shift < 64; shift += 8) {
        int cnt[256] = {0};
        for (int i = 0; i < n; i++) cnt[(k[i] >> shift) & 255]++;
        if (cnt[(k[0] >> shift) & 255] == n) continue;
        int at = 0;
        for (int b = 0; b < 256; b++) {
            int c = cnt[b];
            cnt[b] = at;
            at += c;
        }
        for (int i = 0; i < n; i++) {
            int to = cnt[(k[i] >> shift) & 255]++;
            k2[to] = k[i];
            id2[to] = id[i];
        }
        uint64_t *tk = k;
        k = k2;
        k2 = tk;
        int *ti = id;
        id = id2;
        id2 = ti;
    }
    if (id != s->order) memcpy(s->order, id, (size_t)n * sizeof(int));
    s->order_dirty = false;
}

static double min_bw(const sc_sched_t *s, const int *ids, int m)
{
    double b = INFINITY;
    for (int i = 0; i < m; i++)
        if (s->w[ids[i]].bw < b) b = s->w[ids[i]].bw;
    return b;
}

static double ring_raw(const sc_sched_t *s, const int *ids, int m)
{
    return sc_cost_ring(&s->cost, m, min_bw(s, ids, m));
}

int sc_sched_set_alpha(sc_sched_t *s, double alpha_s)
{
    if (!s || !(alpha_s >= 0) || !isfinite(alpha_s)) return COH_EINVAL;
    s->cost.alpha_s = alpha_s;
    s->prm.alpha_s = alpha_s;
    s->dirty = true;
    return 0;
}

int sc_sched_phase2_method(const sc_sched_t *s, const int *ring, int n, int k, double frac)
{
    if (!s || !ring || n < 1 || k <= 0) return 0;
    for (int i = 0; i < n; i++)
        if (bad_worker(s, ring[i])) return COH_EINVAL;
    if (k > 1 || n < 2) return 2;
    sc_cost_t c = s->cost;
    if (frac > 0 && frac < 1) c.model_gbit *= frac;
    double b = min_bw(s, ring, n);
    double bcast = (n - 1) * c.alpha_s + c.model_gbit / b;
    return bcast <= sc_cost_ring(&c, n, b) ? 1 : 2;
}

/* Every ready worker, ascending id (a stable ring for full syncs). */
static int ready_by_id(sc_sched_t *s, int *ids)
{
    int m = 0;
    for (int i = 0; i < s->n; i++)
        if (s->w[i].state == SC_W_READY) ids[m++] = i;
    return m;
}

/* ---- policies ---- */

static void eval_allreduce(sc_sched_t *s)
{
    int *ids = s->ibuf;
    int m = ready_by_id(s, ids);
    if (m > 0 && m == s->n_live) {
        launch(s, SC_WHY_ALL_READY, ids, m, NULL, 0, ring_raw(s, ids, m), 0, 0);
        compact_queue(s);
    } else if (m > 0) {
        record_wait(s, SC_WHY_WAIT_ALL, s->q, s->nq, NULL);
    }
    s->next_eval = INFINITY;
}

static void eval_partial(sc_sched_t *s)
{
    /* Partial reduce [14] as II-C describes it: the controller pops the
     * first p of its FIFO queue whenever it holds p. */
    int p = eff_p(s);
    int done = 0;
    while (s->nq - done >= p) {
        const int *ids = s->q + done;
        launch(s, SC_WHY_FIFO, ids, p, NULL, 0, ring_raw(s, ids, p), 0, 0);
        done += p;
    }
    if (s->nq > done) record_wait(s, SC_WHY_BELOW_P, s->q + done, s->nq - done, NULL);
    compact_queue(s);
    s->next_eval = INFINITY;
}

static bool full_sync_due(const sc_sched_t *s)
{
    return s->prm.c > 0 && s->round % s->prm.c == 0;
}

static bool starving(const sc_sched_t *s, const sc_cand_t *g, int m)
{
    for (int i = 0; i < m; i++)
        if (s->now - s->w[g[i].id].t_ready > s->prm.starve_s) return true;
    return false;
}

/* A selective launch (a partial round: Alg. 3 line 20 advances k) with the
 * BPAWR numbers behind it. */
static void launch_explained(sc_sched_t *s, sc_why why, const int *ids, int m, double bmin,
                             const sc_explain_t *ex)
{
    sc_decision_t *d = launch(s, why, ids, m, NULL, 0, sc_cost_ring(&s->cost, m, bmin), 0, 0);
    sc_explain_t keep = d->ex;
    d->ex = *ex;
    d->ex.n_ready = keep.n_ready;
    d->ex.n_live = keep.n_live;
    d->ex.p = keep.p;
    d->ex.round = keep.round;
    s->round++;
}

static void eval_selective(sc_sched_t *s)
{
    const sc_params_t *P = &s->prm;
    int p = eff_p(s);
    s->next_eval = INFINITY;
    if (s->nq == 0) return;

    /*
     * Alg. 3 lines 5-7: every c rounds a full weighted allreduce of all n
     * (live) workers. The printed algorithm advances k only on the partial
     * branch (line 20), so after the first full sync k % c stays 0 and every
     * later round would be a full sync: selective reduce would degenerate
     * into allreduce, which the prose ("a fully weighted all reduce after c
     * rounds") rules out. A full sync therefore counts as a round; the
     * printed behaviour stays behind full-counts=0. Round 0 is a full sync,
     * as line 2 (k <- 0) with line 5 says: every worker starts from the same
     * model.
     */
    if (full_sync_due(s)) {
        if (s->nq == s->n_live) {
            int *ids = s->ibuf;
            int m = ready_by_id(s, ids);
            launch(s, SC_WHY_FULL_SYNC, ids, m, NULL, 0, ring_raw(s, ids, m), 0, 0);
            compact_queue(s);
            if (P->full_counts) s->round++;
        } else {
            record_wait(s, SC_WHY_WAIT_FULL, s->q, s->nq, NULL);
        }
        return;
    }
    if (s->nq < p) {
        record_wait(s, SC_WHY_BELOW_P, s->q, s->nq, NULL);
        return;
    }

    /* Lines 9-11: bandwidths, the workers in training, BAG over Q. Both come
     * out of the bandwidth order of all workers, so no sort per decision. */
    sort_order(s);
    int nqc = 0, ns = 0;
    for (int i = 0; i < s->n; i++) {
        int id = s->order[i];
        const sc_worker_t *x = &s->w[id];
        if (x->state == SC_W_READY)
            s->qc[nqc++] = (sc_cand_t){.bw = x->bw, .id = id};
        else if (x->state == SC_W_COMPUTING)
            s->sc[ns++] = (sc_cand_t){.bw = x->bw, .id = id};
    }
    int *bounds = s->bounds;
    int ng = sc_bag(s->qc, nqc, p, P->eta, P->bag_le, 0, bounds);
    /*
     * Starvation guard (not in the paper). Every pass BAG hands the slowest
     * ready workers a leftover group below p whenever fewer than 2p are
     * ready, and BPAWR keeps a slow group waiting while faster workers are
     * due: with c = 0 the slowest workers can wait for most of a run (80 s of
     * 100 in our simulations; the paper notes groups that "could never form"
     * for p = 0.5n). Alg. 3's own remedy is the full sync every c rounds. With
     * starve-s > 0, a leftover group holding a worker that has waited longer
     * joins the group before it, and a group holding such a worker launches
     * whatever BPAWR says. starve-s = 0 gives the paper's behaviour.
     */
    if (P->starve_s > 0 && ng >= 2 && bounds[ng] - bounds[ng - 1] < p &&
        starving(s, s->qc + bounds[ng - 1], bounds[ng] - bounds[ng - 1])) {
        bounds[ng - 1] = bounds[ng];
        ng--;
    }

    int gb[2];
    sc_bpawr_t b = {.S = s->sc,
                    .nS = ns,
                    .pos = 0,
                    .prob = prob_cb,
                    .prob_ctx = s,
                    .p = p,
                    .eta = P->eta,
                    .theta = P->theta,
                    .dt_s = P->dt_s,
                    .bag_le = P->bag_le,
                    .cost = s->cost,
                    .scratch = s->bscratch,
                    .bounds = gb};
    int *idbuf = s->ibuf;
    bool hold = false, timed = false;
    for (int i = 0; i < ng; i++) {
        int lo = bounds[i], hi = bounds[i + 1];
        int m = hi - lo;
        for (int j = 0; j < m; j++) idbuf[j] = s->qc[lo + j].id;
        if (m == 0) continue;
        if (hold) {
            record_wait(s, SC_WHY_HOLD_FULL, idbuf, m, NULL);
            continue;
        }
        sc_bpawr_out_t o;
        sc_bpawr_run(&b, s->qc + lo, m, &o);
        if (o.verdict == SC_BPAWR_WAIT && P->starve_s > 0 && starving(s, s->qc + lo, m)) {
            sc_explain_t ex;
            explain_from_bpawr(&ex, &o);
            ex.n_delta = 0;
            launch_explained(s, SC_WHY_STARVE, idbuf, m, s->qc[hi - 1].bw, &ex);
            if (full_sync_due(s)) hold = true;
            continue;
        }
        /* Lines 14-16: the workers g* leaves out move to the next group
         * (they are its fastest, so it stays sorted: move the boundary). */
        if (o.verdict == SC_BPAWR_WAIT && o.n_delta > 0 && i < ng - 1) {
            hi -= o.n_delta;
            bounds[i + 1] = hi;
            m = hi - lo;
        }
        sc_explain_t ex;
        explain_from_bpawr(&ex, &o);
        /*
         * Lines 17-21 launch g_i "if F". Alg. 2 returns F = True exactly when
         * it decides to wait and replace (line 17) and False both when g is
         * too small (line 3, "wait for more ready workers") and when no
         * waiting pays off (line 19); the prose defines the flag as
         * "waiting (True) or not (False)". Read literally, a group would
         * launch only after a replacement decision, minus the workers just
         * moved out (possibly fewer than p), and never otherwise: once every
         * worker is ready (S empty, k = 0, g* = g, t_X = 0) nothing would
         * ever launch again. We read F as "wait": launch iff BPAWR finds at
         * least p workers and no replacement worth theta*dt. The printed
         * reading stays behind flag=literal (tested to stall).
         */
        bool go = P->flag_launches ? o.verdict == SC_BPAWR_WAIT : o.verdict == SC_BPAWR_LAUNCH;
        if (go && m > 0) {
            launch_explained(s, P->flag_launches ? SC_WHY_BPAWR_LITERAL : SC_WHY_BPAWR_LAUNCH,
                             idbuf, m, s->qc[hi - 1].bw, &ex);
            /* Line 20 can carry k past a multiple of c within one pass, and
             * line 5 would then skip that full sync: stop launching once it
             * falls due; the rest wait for it. */
            if (full_sync_due(s)) hold = true;
        } else {
            sc_why why = o.verdict == SC_BPAWR_SMALL  ? SC_WHY_BPAWR_SMALL
                         : o.verdict == SC_BPAWR_WAIT ? SC_WHY_BPAWR_WAIT
                                                      : SC_WHY_BPAWR_LAUNCH;
            if (m > 0) record_wait(s, why, idbuf, m, &ex);
            /* Alg. 3 line 24: re-evaluate after dt if nobody arrives; only a
             * group that could launch may change its verdict with time. */
            if (o.verdict != SC_BPAWR_SMALL) timed = true;
        }
    }
    compact_queue(s);
    if (timed) s->next_eval = s->now + P->dt_s;
}

static void eval_relay(sc_sched_t *s)
{
    const sc_params_t *P = &s->prm;
    s->next_eval = INFINITY;

    /* A running relay group holds every live worker: only fault checks. */
    for (int slot = 0; slot < s->n; slot++) {
        sc_group_t *g = &s->g[slot];
        if (!g->id || !g->relay || P->fault_factor <= 0) continue;
        /*
         * seeds/004 IV-C2: "after T_fault has passed since the completion of
         * phase 1 ... the remaining non-ready workers" are faulty; T_fault is
         * five times the time since the fastest worker became ready. That
         * rule alone excludes, for good, healthy workers whose compute time
         * varies more than phase 1 lasts (a Transformer batch of long
         * sentences); so a relay is suspected only once it is also overdue by
         * its runtime CDF (elapsed > overdue * largest sample), as BPAWR's
         * guard says; with no sample yet it is not suspected.
         */
        double tf = P->fault_factor * (g->phase1_end - g->t_first_ready);
        if (tf < P->tick_s) tf = P->tick_s;
        /* Exclusion is for good: with steps of a few ms, 5x phase 1 and 2x
         * the longest step are a scheduling hiccup away (a healthy rank on a
         * loaded host was excluded), so never sooner than fault-min. */
        if (tf < P->fault_min_s) tf = P->fault_min_s;
        double deadline = g->phase1_end + tf;
        for (int i = g->head; i >= 0; i = s->w[i].next) {
            sc_worker_t *x = &s->w[i];
            if (x->state != SC_W_RELAY || x->suspected) continue;
            /* The longest compute time on record for this worker: its own
             * samples (even too few to be its CDF yet: a persistent
             * straggler shows itself early) or the CDF it is judged by. */
            const sc_cdf_t *c = cdf_for(s, i);
            double longest = sc_cdf_max(c);
            if (sc_cdf_max(&x->cdf) > longest) longest = sc_cdf_max(&x->cdf);
            double due = deadline;
            /* No compute time on record for it (the first steps of a run):
             * T_fault alone would exclude, for good, a healthy rank that is
             * merely slower than phase 1 is long; it is not suspected yet
             * (the live coordinator still bounds the wait). Nor is a rank
             * that has not finished a step of its own judged by what the
             * others' first steps took, unless a CDF was loaded: a rank 400
             * ms late to its first sync (loading its data) was excluded for
             * good by the pool of the others' few-ms first steps. */
            if (P->overdue_factor > 0) {
                bool first_step = x->iters == 0 && !x->cdf.frozen && !s->pool.frozen;
                if (longest <= 0 || first_step) continue;
                double overdue = x->t_start + P->overdue_factor * longest;
                if (overdue > due) due = overdue;
            }
            if (s->now >= due) {
                x->suspected = 1;
                sc_decision_t *d = new_dec(s, SC_DEC_SUSPECT, SC_WHY_RELAY_FAULT);
                int *mem = take_mem(s, 1);
                mem[0] = i;
                d->members = mem;
                d->nmembers = 1;
                d->ex.phase1_s = g->phase1_end - g->t_launch;
                d->ex.waited_s = s->now - g->phase1_end;
                s->suspects++;
            } else if (due < s->next_eval) {
                s->next_eval = due;
            }
        }
    }
    if (s->nq == 0) return;

    int *ids = s->ibuf;
    if (s->nq == s->n_live) {
        int m = ready_by_id(s, ids);
        launch(s, SC_WHY_ALL_READY, ids, m, NULL, 0, ring_raw(s, ids, m), 0, 0);
        compact_queue(s);
        return;
    }

    /*
     * seeds/004 IV-C1, break-even ski rental. Renting = waiting one more
     * cycle; buying = proceeding now: phase 1 among the ready workers (ring
     * over R, Eq. 2) and phase 2, where what the late workers missed reaches
     * everyone (sc_cost_phase2). The cost of buying changes as workers become
     * ready, so it is re-estimated every cycle; the rule proceeds once the
     * accumulated waiting cost reaches it.
     */
    double t_first = INFINITY;
    for (int i = 0; i < s->nq; i++)
        if (s->w[s->q[i]].t_ready < t_first) t_first = s->w[s->q[i]].t_ready;
    int nr = 0;
    int *late = s->ibuf2;
    double b_all = min_bw(s, s->q, s->nq);
    for (int i = 0; i < s->n; i++) {
        const sc_worker_t *x = &s->w[i];
        if (x->state == SC_W_COMPUTING) {
            late[nr++] = i;
            if (x->bw < b_all) b_all = x->bw;
        }
    }
    double t1 = ring_raw(s, s->q, s->nq);
    /* At decision time every late worker is assumed to miss all of phase 1. */
    double t2 = sc_cost_phase2(&s->cost, s->n_live, nr, nr > 0 ? 1.0 : 0.0, b_all);
    double buy = (t1 + t2) * s->calib;
    double waited = s->now - t_first;
    sc_explain_t ex = {0};
    ex.waited_s = waited;
    ex.buy_s = buy;
    ex.phase1_s = t1 * s->calib;
    ex.phase2_s = t2 * s->calib;
    if (sc_ski_proceed(waited, buy)) {
        /* Ring order by bandwidth, as BAG orders a group. */
        sort_order(s);
        int m = 0;
        for (int i = 0; i < s->n; i++)
            if (s->w[s->order[i]].state == SC_W_READY) ids[m++] = s->order[i];
        sc_decision_t *d = launch(s, SC_WHY_RELAY_PROCEED, ids, m, late, nr, t1 + t2, t1, t_first);
        sc_explain_t keep = d->ex;
        d->ex = ex;
        d->ex.n_ready = keep.n_ready;
        d->ex.n_live = keep.n_live;
        d->ex.p = keep.p;
        d->ex.round = keep.round;
        compact_queue(s);
        /* Fault checks for the new group start from its phase-1 end. */
        double deadline = s->g[d->group_id & ((1u << SLOT_BITS) - 1)].phase1_end;
        if (P->fault_factor > 0 && deadline < s->next_eval) s->next_eval = deadline;
    } else {
        record_wait(s, SC_WHY_RELAY_WAIT, s->q, s->nq, &ex);
        double at = s->now + P->tick_s;
        if (at < s->next_eval) s->next_eval = at;
    }
}

int sc_sched_tick(sc_sched_t *s, double t, sc_tick_t *out)
{
    if (!s || !out) return COH_EINVAL;
    memset(out, 0, sizeof(*out));
    int rc = check_time(s, t);
    if (rc) return rc;
    s->ndec = 0;
    s->nlaunch = 0;
    s->nmem = 0;
    s->nwts = 0;
    s->now = t;
    if (!s->dirty && t < s->next_eval) {
        out->next_tick = s->next_eval;
        return 0;
    }
    s->dirty = false;
    s->evaluations++;
    switch (s->prm.policy) {
    case SC_POLICY_ALLREDUCE: eval_allreduce(s); break;
    case SC_POLICY_PARTIAL: eval_partial(s); break;
    case SC_POLICY_SELECTIVE: eval_selective(s); break;
    case SC_POLICY_RELAY: eval_relay(s); break;
    default: return COH_EINTERNAL;
    }
    out->dec = s->dec;
    out->ndec = s->ndec;
    out->nlaunch = s->nlaunch;
    out->evaluated = true;
    out->next_tick = s->next_eval;
    return 0;
}

/* ---- explanations ---- */

int sc_decision_explain(const sc_decision_t *d, char *buf, size_t len)
{
    if (!d || (!buf && len)) return COH_EINVAL;
    static const char *const kinds[] = {"launch", "wait", "suspect"};
    char mem[160];
    size_t at = 0;
    mem[0] = '\0';
    for (int i = 0; i < d->nmembers && at + 16 < sizeof(mem); i++)
        at += (size_t)snprintf(mem + at, sizeof(mem) - at, i ? " %d" : "%d", d->members[i]);
    if (at + 16 >= sizeof(mem)) snprintf(mem + at, sizeof(mem) - at, " ...");
    const sc_explain_t *e = &d->ex;
    int n = snprintf(buf, len, "t=%.6f %s", d->t, (unsigned)d->kind < 3 ? kinds[d->kind] : "?");
    if (n < 0) return COH_EINVAL;
    size_t used = (size_t)n;
#define APPEND(...)                                                                                \
    do {                                                                                           \
        int k_ =                                                                                   \
            snprintf(used < len ? buf + used : NULL, used < len ? len - used : 0, __VA_ARGS__);    \
        if (k_ < 0) return COH_EINVAL;                                                             \
        used += (size_t)k_;                                                                        \
    } while (0)
    if (d->kind == SC_DEC_LAUNCH) APPEND(" g%llu", (unsigned long long)d->group_id);
    APPEND(" [%s] (%d) %s: %s; ready %d/%d, p=%d, round=%lld", mem, d->nmembers,
           sc_why_name(d->why), sc_why_message(d->why), e->n_ready, e->n_live, e->p,
           (long long)e->round);
    if (d->kind == SC_DEC_LAUNCH)
        APPEND(", expected %.6f s%s", d->expected_s, d->full ? ", full" : "");
    if (d->why == SC_WHY_BPAWR_LAUNCH || d->why == SC_WHY_BPAWR_WAIT ||
        d->why == SC_WHY_BPAWR_LITERAL || d->why == SC_WHY_STARVE)
        APPEND(", |C|=%d sum(p)=%.4f k=%d b=%.3f, bmin(g)=%.3f bmin(g*)=%.3f |g*|=%d "
               "|g_delta|=%d, t_X=%.6f vs theta*dt=%.6f",
               e->n_cand, e->sum_prob, e->k_virtual, e->b_virtual, e->bmin_g, e->bmin_gstar,
               e->gstar_size, e->n_delta, e->t_x, e->threshold);
    if (d->why == SC_WHY_RELAY_WAIT || d->why == SC_WHY_RELAY_PROCEED)
        APPEND(", waited %.6f s vs buy %.6f s (phase 1 %.6f + phase 2 %.6f), relays %d",
               e->waited_s, e->buy_s, e->phase1_s, e->phase2_s, d->nrelays);
    if (d->why == SC_WHY_RELAY_FAULT)
        APPEND(", phase 1 took %.6f s, %.6f s since", e->phase1_s, e->waited_s);
#undef APPEND
    return (int)used;
}
