/*
 * Discrete-event simulator (see sc_sim.h). Events are ordered by (time,
 * insertion sequence); all events of one instant are applied before the
 * scheduler is ticked at that instant, as a coordinator that batches the
 * messages of one cycle would.
 */
#include "sched/sc_sim.h"

#include "base/bs_alloc.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "cohort.h"

/* ---- distributions ---- */

int sc_dist_from_name(const char *name, sc_dist_t *out)
{
    if (!name || !out) return COH_EINVAL;
    memset(out, 0, sizeof(*out));
    if (!strcmp(name, "cnn"))
        out->kind = SC_DIST_CNN;
    else if (!strcmp(name, "transformer"))
        out->kind = SC_DIST_TRANSFORMER;
    else
        return COH_EINVAL;
    return 0;
}

const char *sc_dist_name(const sc_dist_t *d)
{
    switch (d->kind) {
    case SC_DIST_CNN: return "cnn";
    case SC_DIST_TRANSFORMER: return "transformer";
    case SC_DIST_SAMPLES: return "trace";
    }
    return "?";
}

double sc_dist_draw(const sc_dist_t *d, sc_rng_t *r)
{
    double x;
    switch (d->kind) {
    case SC_DIST_CNN:
        /* ResNet-50 does the same work every round: a narrow body (median
         * 0.40 s, 4% log-sd) from server jitter, and in 8% of rounds an
         * interference delay (exponential, mean 0.15 s) from co-located
         * load - the "performance variability of cloud servers" of Fig. 1(a).
         * Mean 0.41 s, CV about 0.12. */
        x = 0.40 * exp(0.04 * sc_rng_normal(r));
        if (sc_rng_uniform(r) < 0.08) x += sc_rng_exponential(r, 0.15);
        return x < 0.25 ? 0.25 : (x > 2.0 ? 2.0 : x);
    case SC_DIST_TRANSFORMER:
        /* Work proportional to the sentence lengths of the batch (WMT16):
         * a wide right-skewed spread, lognormal with median 0.42 s and
         * log-sd 0.45 (5th-95th percentile 0.20-0.88 s). Mean 0.46 s, CV
         * about 0.47: much more variable than cnn, as in Fig. 1(b). */
        x = 0.42 * exp(0.45 * sc_rng_normal(r));
        return x < 0.12 ? 0.12 : (x > 3.0 ? 3.0 : x);
    case SC_DIST_SAMPLES:
        if (d->nsamples <= 0) return 0;
        return d->samples[sc_rng_next(r) % (uint64_t)d->nsamples];
    }
    return 0;
}

double sc_sim_draw_bandwidth(sc_rng_t *r, double lambda)
{
    double u = lambda + (1.0 - lambda) * sc_rng_uniform(r);
    return round(20.0 * u * 1000.0) / 1000.0;
}

void sc_sim_cfg_default(sc_sim_cfg_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    sc_params_default(&cfg->sched);
    cfg->n = 40;
    cfg->seed = 1;
    cfg->duration_s = 100;
    cfg->lambda = 0.05;
    cfg->bw_error = 0;
    cfg->warm = true;
    cfg->warm_samples = 10000;
    cfg->dist.kind = SC_DIST_TRANSFORMER;
    cfg->compute_scale = 1.0;
    cfg->slow_frac = 0;
    cfg->slow_factor = 1.0;
    cfg->detect_s = 1.0;
    cfg->max_idle_ticks = 100000;
}

void sc_sim_result_free(sc_sim_result_t *res)
{
    if (!res) return;
    coh_free(res->syncs);
    coh_free(res->members);
    res->syncs = NULL;
    res->members = NULL;
    res->nsyncs = 0;
}

/* ---- the engine ---- */

enum { EV_READY, EV_DONE, EV_P1END, EV_TICK, EV_FAIL, EV_DETECT };

typedef struct ev {
    double t;
    uint64_t seq;
    int type;
    int a;      /* worker or group slot */
    uint64_t b; /* group id (stale-event check) */
} ev_t;

enum {
    W_COMPUTING, /* READY event pending (unless dead or out of rows) */
    W_READY,
    W_SYNCING,
    W_RELAY,       /* computing, relay of a running relay group */
    W_RELAY_READY, /* relay whose data waits for phase 2 */
    W_IDLE,        /* replay: out of rows */
};

typedef struct simw {
    int state;
    double slow;   /* compute-time multiplier of this worker */
    bool dead;     /* failed: never ready again */
    bool excluded; /* reported lost to the scheduler */
    double fail_t;
    double bw; /* true bandwidth */
    double compute;
    double t_ready;
    double wait_ep; /* start of a BPAWR wait episode, < 0 none */
    int64_t syncs;
    int row; /* replay: current row */
    int slot;
    sc_rng_t rng;
} simw_t;

typedef struct simg {
    uint64_t id; /* 0: free */
    double start, p1_end, t1;
    int *ids; /* members then relays */
    int m, nr;
    bool relay, p1_done, p2_started;
    int log; /* index in the sync log, -1 */
} simg_t;

typedef struct sim {
    const sc_sim_cfg_t *cfg;
    sc_sim_result_t *res;
    sc_sched_t *s;
    sc_cost_t cost;
    int n, p, n_live;
    simw_t *w;
    simg_t *g;
    ev_t *heap;
    int nheap, capheap;
    uint64_t seq;
    int64_t real_pending;
    double tick_at;
    sc_rng_t rng_est;
    /* metrics */
    double sum_time, sum_scale, wasted;
    int64_t nsync, iters;
    double now;
    /* log */
    int cap_syncs, nmem, cap_mem;
} sim_t;

static void violate(sim_t *m, const char *fmt, ...)
{
    if (m->res->violations++ == 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(m->res->violation, sizeof(m->res->violation), fmt, ap);
        va_end(ap);
    }
}

static bool ev_less(const ev_t *a, const ev_t *b)
{
    return a->t < b->t || (a->t == b->t && a->seq < b->seq);
}

static int push(sim_t *m, double t, int type, int a, uint64_t b)
{
    if (m->nheap == m->capheap) {
        int cap = m->capheap ? 2 * m->capheap : 1024;
        ev_t *h = coh_reallocn(m->heap, (size_t)cap, sizeof(ev_t));
        if (!h) return COH_ENOMEM;
        m->heap = h;
        m->capheap = cap;
    }
    ev_t e = {.t = t, .seq = m->seq++, .type = type, .a = a, .b = b};
    int i = m->nheap++;
    while (i > 0) {
        int parent = (i - 1) / 2;
        if (!ev_less(&e, &m->heap[parent])) break;
        m->heap[i] = m->heap[parent];
        i = parent;
    }
    m->heap[i] = e;
    if (type != EV_TICK) m->real_pending++;
    return 0;
}

static ev_t pop(sim_t *m)
{
    ev_t top = m->heap[0];
    ev_t last = m->heap[--m->nheap];
    int i = 0;
    for (;;) {
        int l = 2 * i + 1, r = l + 1, k = i;
        const ev_t *best = &last;
        if (l < m->nheap && ev_less(&m->heap[l], best)) {
            k = l;
            best = &m->heap[l];
        }
        if (r < m->nheap && ev_less(&m->heap[r], best)) k = r;
        if (k == i) break;
        m->heap[i] = m->heap[k];
        i = k;
    }
    if (m->nheap > 0) m->heap[i] = last;
    if (top.type != EV_TICK) m->real_pending--;
    return top;
}

static int replay_rows(const sim_t *m, int w)
{
    const sc_replay_t *r = m->cfg->replay;
    return r->off[w + 1] - r->off[w];
}

/* The bandwidth estimate handed to the scheduler: exact, or with the error
 * of IV-B5. Clamped positive (e = 1 can draw 0). */
static double estimate(sim_t *m, double b)
{
    if (m->cfg->bw_error <= 0) return b;
    double x = 2.0 * sc_rng_uniform(&m->rng_est) - 1.0;
    double e = b * (1.0 + m->cfg->bw_error * x);
    return e > 1e-3 * b ? e : 1e-3 * b;
}

/* Worker w starts an iteration at m->now: draw (or read) its compute time. */
static int start_iteration(sim_t *m, int w)
{
    simw_t *x = &m->w[w];
    if (m->cfg->replay) {
        const sc_replay_t *r = m->cfg->replay;
        if (x->row >= replay_rows(m, w)) {
            x->state = W_IDLE;
            return 0;
        }
        int row = r->off[w] + x->row;
        x->compute = r->compute_s[row];
        double b = r->bw_gbps[row];
        if (b != x->bw || x->row == 0) {
            x->bw = b;
            int rc = sc_sched_on_bandwidth(m->s, w, b);
            if (rc) return rc;
        }
    } else {
        x->compute = m->cfg->compute_scale * x->slow * sc_dist_draw(&m->cfg->dist, &x->rng);
        if (m->cfg->bw_error > 0 || m->now == 0) {
            int rc = sc_sched_on_bandwidth(m->s, w, estimate(m, x->bw));
            if (rc) return rc;
        }
    }
    x->state = W_COMPUTING;
    return push(m, m->now + x->compute, EV_READY, w, 0);
}

static double true_min_bw(const sim_t *m, const int *ids, int k)
{
    double b = INFINITY;
    for (int i = 0; i < k; i++)
        if (m->w[ids[i]].bw < b) b = m->w[ids[i]].bw;
    return b;
}

static int log_sync(sim_t *m, simg_t *g)
{
    sc_sim_result_t *res = m->res;
    g->log = -1;
    if (!m->cfg->record) return 0;
    if (res->nsyncs == m->cap_syncs) {
        int cap = m->cap_syncs ? 2 * m->cap_syncs : 64;
        sc_sim_sync_t *s = coh_reallocn(res->syncs, (size_t)cap, sizeof(*s));
        if (!s) return COH_ENOMEM;
        res->syncs = s;
        m->cap_syncs = cap;
    }
    int k = g->m + g->nr;
    if (m->nmem + k > m->cap_mem) {
        int cap = m->cap_mem ? 2 * m->cap_mem : 256;
        while (cap < m->nmem + k) cap *= 2;
        int *p = coh_reallocn(res->members, (size_t)cap, sizeof(int));
        if (!p) return COH_ENOMEM;
        res->members = p;
        m->cap_mem = cap;
    }
    memcpy(res->members + m->nmem, g->ids, (size_t)k * sizeof(int));
    res->syncs[res->nsyncs] =
        (sc_sim_sync_t){.start = g->start, .end = NAN, .off = m->nmem, .n = k};
    g->log = res->nsyncs++;
    m->nmem += k;
    return 0;
}

/* Relay group: phase 2 starts once phase 1 is over and every relay that
 * was not excluded has its data ready. A relay ready at r during phase 1
 * took part in the chunks after r: it missed the fraction (r - start) / T1;
 * one ready after phase 1 missed everything. */
static int maybe_phase2(sim_t *m, int slot)
{
    simg_t *g = &m->g[slot];
    if (!g->id || !g->relay || g->p2_started || !g->p1_done) return 0;
    double sum = 0, max = 0, b = INFINITY;
    int all = 0;
    for (int i = 0; i < g->m + g->nr; i++) {
        const simw_t *x = &m->w[g->ids[i]];
        if (i >= g->m) {
            if (x->excluded) continue;
            if (x->state != W_RELAY_READY) return 0;
            double f = g->t1 > 0 ? (x->t_ready - g->start) / g->t1 : 1.0;
            f = f < 0 ? 0 : (f > 1 ? 1 : f);
            sum += f;
            if (f > max) max = f;
        }
        if (x->bw < b) b = x->bw;
        all++;
    }
    g->p2_started = true;
    double t2 = sc_cost_phase2(&m->cost, all, sum, max, b);
    return push(m, m->now + t2, EV_DONE, slot, g->id);
}

static void note_wait_end(sim_t *m, const int *ids, int k)
{
    double latest = -INFINITY;
    for (int i = 0; i < k; i++)
        if (m->w[ids[i]].t_ready > latest) latest = m->w[ids[i]].t_ready;
    for (int i = 0; i < k; i++) {
        simw_t *x = &m->w[ids[i]];
        double wait = m->now - x->t_ready;
        if (wait > m->res->max_wait_s) m->res->max_wait_s = wait;
        if (x->wait_ep >= 0) {
            /* IV-A2: a BPAWR wait is wasted when no newly ready worker joins
             * the group it finally launches with. */
            if (!(latest > x->wait_ep) && m->now <= m->cfg->duration_s)
                m->wasted += m->now - x->wait_ep;
            x->wait_ep = -1;
        }
    }
}

static int on_launch(sim_t *m, const sc_decision_t *d)
{
    const sc_sim_cfg_t *cfg = m->cfg;
    int k = d->nmembers + d->nrelays;
    if (cfg->check) {
        double wsum = 0;
        for (int i = 0; i < k; i++) {
            int id = i < d->nmembers ? d->members[i] : d->relays[i - d->nmembers];
            if (id < 0 || id >= m->n) {
                violate(m, "t=%.6f group %llu: worker id %d out of range", m->now,
                        (unsigned long long)d->group_id, id);
                return 0;
            }
            const simw_t *x = &m->w[id];
            if (i < d->nmembers && x->state != W_READY)
                violate(m, "t=%.6f worker %d launched while not ready (state %d): in two groups?",
                        m->now, id, x->state);
            if (i >= d->nmembers && x->state != W_COMPUTING)
                violate(m, "t=%.6f relay %d is not computing (state %d)", m->now, id, x->state);
            if (x->excluded) violate(m, "t=%.6f lost worker %d planned", m->now, id);
            double wt = i < d->nmembers ? d->weights[i] : d->relay_weights[i - d->nmembers];
            if (!(wt > 0)) violate(m, "t=%.6f worker %d has weight %g", m->now, id, wt);
            wsum += wt;
        }
        if (fabs(wsum - 1.0) > 1e-9) violate(m, "t=%.6f weights sum to %.12f", m->now, wsum);
        sc_policy pol = cfg->sched.policy;
        if ((pol == SC_POLICY_PARTIAL || pol == SC_POLICY_SELECTIVE) && !d->full &&
            !cfg->sched.flag_launches) {
            int p = m->p < m->n_live ? m->p : m->n_live;
            if (d->nmembers < p)
                violate(m, "t=%.6f group of %d below p=%d", m->now, d->nmembers, p);
        }
        if (d->full && d->nmembers != m->n_live)
            violate(m, "t=%.6f full sync of %d with %d live", m->now, d->nmembers, m->n_live);
        if ((pol == SC_POLICY_ALLREDUCE || pol == SC_POLICY_RELAY) && k != m->n_live)
            violate(m, "t=%.6f %s group of %d with %d live", m->now, sc_policy_name(pol), k,
                    m->n_live);
    }
    int slot = -1;
    for (int i = 0; i < m->n; i++)
        if (!m->g[i].id) {
            slot = i;
            break;
        }
    if (slot < 0) {
        violate(m, "t=%.6f more groups than workers", m->now);
        return 0;
    }
    simg_t *g = &m->g[slot];
    memset(g, 0, sizeof(*g));
    g->ids = coh_reallocn(NULL, (size_t)k, sizeof(int));
    if (!g->ids) return COH_ENOMEM;
    memcpy(g->ids, d->members, (size_t)d->nmembers * sizeof(int));
    if (d->nrelays) memcpy(g->ids + d->nmembers, d->relays, (size_t)d->nrelays * sizeof(int));
    g->id = d->group_id;
    g->m = d->nmembers;
    g->nr = d->nrelays;
    g->relay = d->nrelays > 0;
    g->start = m->now;
    note_wait_end(m, g->ids, g->m);
    for (int i = 0; i < k; i++) {
        simw_t *x = &m->w[g->ids[i]];
        x->slot = slot;
        x->state = i < g->m ? W_SYNCING : W_RELAY;
    }
    int rc = log_sync(m, g);
    if (rc) return rc;
    m->res->launched++;
    double t1 = sc_cost_ring(&m->cost, g->m, true_min_bw(m, g->ids, g->m));
    g->t1 = t1;
    if (!g->relay) return push(m, m->now + t1, EV_DONE, slot, g->id);
    return push(m, m->now + t1, EV_P1END, slot, g->id);
}

static int lose(sim_t *m, int w)
{
    simw_t *x = &m->w[w];
    if (x->excluded) return 0;
    x->excluded = true;
    m->n_live--;
    int rc = sc_sched_on_worker_lost(m->s, w);
    if (rc) return rc;
    if (x->state == W_READY) x->state = W_IDLE;
    if (x->state == W_RELAY && x->slot >= 0) return maybe_phase2(m, x->slot);
    return 0;
}

static int on_tick(sim_t *m)
{
    sc_tick_t tk;
    int rc = sc_sched_tick(m->s, m->now, &tk);
    if (rc) return rc;
    int acted = tk.nlaunch > 0;
    m->res->ticks++;
    if (tk.evaluated) m->res->evaluations++;
    for (int i = 0; i < tk.ndec; i++) {
        const sc_decision_t *d = &tk.dec[i];
        if (m->cfg->trace) m->cfg->trace(m->cfg->trace_ctx, d);
        if (d->kind == SC_DEC_LAUNCH) {
            rc = on_launch(m, d);
        } else if (d->kind == SC_DEC_WAIT && d->why == SC_WHY_BPAWR_WAIT) {
            for (int j = 0; j < d->nmembers; j++)
                if (m->w[d->members[j]].wait_ep < 0) m->w[d->members[j]].wait_ep = m->now;
        } else if (d->kind == SC_DEC_SUSPECT) {
            /* The coordinator acts on AdapCC's T_fault: the relay is excluded. */
            rc = lose(m, d->members[0]);
            acted = 1;
        }
        if (rc) return rc;
    }
    double nt = tk.next_tick;
    if (isfinite(nt) && nt > m->now && nt != m->tick_at) {
        m->tick_at = nt;
        rc = push(m, nt, EV_TICK, 0, 0);
        if (rc) return rc;
    }
    return acted;
}

static int handle(sim_t *m, const ev_t *e)
{
    int rc = 0;
    switch (e->type) {
    case EV_READY: {
        simw_t *x = &m->w[e->a];
        if (x->dead || x->excluded) return 0;
        x->t_ready = m->now;
        rc = sc_sched_on_ready(m->s, e->a, m->now, x->compute);
        if (rc) return rc;
        if (x->state == W_RELAY) {
            x->state = W_RELAY_READY;
            return maybe_phase2(m, x->slot);
        }
        x->state = W_READY;
        return 0;
    }
    case EV_P1END: {
        simg_t *g = &m->g[e->a];
        if (g->id != e->b) return 0;
        g->p1_done = true;
        rc = sc_sched_on_phase1_done(m->s, g->id, m->now);
        if (rc) return rc;
        return maybe_phase2(m, e->a);
    }
    case EV_DONE: {
        simg_t *g = &m->g[e->a];
        if (g->id != e->b) return 0;
        rc = sc_sched_on_group_done(m->s, g->id, m->now, m->now - g->start);
        if (rc) return rc;
        int scale = 0;
        for (int i = 0; i < g->m + g->nr; i++)
            if (i < g->m || !m->w[g->ids[i]].excluded) scale++;
        if (m->now <= m->cfg->duration_s) {
            m->nsync++;
            m->sum_time += m->now - g->start;
            m->sum_scale += scale;
            m->iters += scale;
        }
        if (g->log >= 0) m->res->syncs[g->log].end = m->now;
        for (int i = 0; i < g->m + g->nr; i++) {
            int w = g->ids[i];
            simw_t *x = &m->w[w];
            x->slot = -1;
            if (x->excluded) continue;
            if (m->now <= m->cfg->duration_s) x->syncs++;
            x->row++;
            if (x->dead) {
                x->state = W_IDLE;
                continue;
            }
            rc = start_iteration(m, w);
            if (rc) return rc;
        }
        coh_free(g->ids);
        memset(g, 0, sizeof(*g));
        return 0;
    }
    case EV_FAIL: {
        simw_t *x = &m->w[e->a];
        x->dead = true;
        return push(m, m->now + m->cfg->detect_s, EV_DETECT, e->a, 0);
    }
    case EV_DETECT: return lose(m, e->a);
    case EV_TICK: return 0;
    }
    return COH_EINTERNAL;
}

static int setup(sim_t *m)
{
    const sc_sim_cfg_t *cfg = m->cfg;
    int rc = sc_sched_create(&cfg->sched, m->n, &m->s);
    if (rc) return rc;
    m->cost = (sc_cost_t){.alpha_s = cfg->sched.alpha_s,
                          .model_gbit = cfg->sched.model_mb * 8.0 / 1000.0,
                          .form = cfg->sched.cost_form};
    m->p = sc_params_p(&cfg->sched, m->n);
    m->n_live = m->n;
    m->tick_at = -1;
    sc_rng_seed(&m->rng_est, cfg->seed, 2);
    sc_rng_t rbw;
    sc_rng_seed(&rbw, cfg->seed, 1);
    for (int i = 0; i < m->n; i++) {
        simw_t *x = &m->w[i];
        x->slot = -1;
        x->wait_ep = -1;
        x->fail_t = INFINITY;
        sc_rng_seed(&x->rng, cfg->seed, 1000 + (uint64_t)i);
        if (!cfg->replay) x->bw = sc_sim_draw_bandwidth(&rbw, cfg->lambda);
        x->slow = 1.0;
    }
    if (!cfg->replay && cfg->slow_frac > 0) {
        /* A partial Fisher-Yates shuffle picks the slow ones. */
        int k = (int)lround(cfg->slow_frac * m->n);
        int *ids = coh_reallocn(NULL, (size_t)m->n, sizeof(int));
        if (!ids) return COH_ENOMEM;
        for (int i = 0; i < m->n; i++) ids[i] = i;
        sc_rng_t rs;
        sc_rng_seed(&rs, cfg->seed, 4);
        for (int i = 0; i < k && i < m->n; i++) {
            int j = i + (int)(sc_rng_next(&rs) % (uint64_t)(m->n - i));
            int t = ids[i];
            ids[i] = ids[j];
            ids[j] = t;
            m->w[ids[i]].slow = cfg->slow_factor;
        }
        coh_free(ids);
    }
    if (cfg->warm && cfg->replay) {
        /* Warm start of a scenario: each worker's CDF is its own rows, the
         * pool is all rows. */
        const sc_replay_t *r = cfg->replay;
        for (int i = 0; i < m->n && !rc; i++)
            rc = sc_sched_load_cdf(m->s, i, r->compute_s + r->off[i], replay_rows(m, i));
        if (!rc) rc = sc_sched_load_cdf(m->s, -1, r->compute_s, r->off[m->n]);
    } else if (cfg->warm) {
        /* Warm start (IV-B5): the distribution is known in advance. Every
         * simulated worker draws from it, so it is loaded as the pooled CDF
         * (frozen); per-worker learning is not used. */
        /* A trace (CSV) is its own known distribution: loaded as is. */
        bool trace = cfg->dist.kind == SC_DIST_SAMPLES;
        int k = trace ? cfg->dist.nsamples : (cfg->warm_samples > 0 ? cfg->warm_samples : 1);
        double *xs = coh_reallocn(NULL, (size_t)k, sizeof(double));
        if (!xs) return COH_ENOMEM;
        sc_rng_t rw;
        sc_rng_seed(&rw, cfg->seed, 3);
        for (int i = 0; i < k; i++)
            xs[i] =
                cfg->compute_scale * (trace ? cfg->dist.samples[i] : sc_dist_draw(&cfg->dist, &rw));
        rc = sc_sched_load_cdf(m->s, -1, xs, k);
        coh_free(xs);
    }
    if (rc) return rc;
    for (int i = 0; i < cfg->nfails; i++) {
        const sc_sim_fail_t *f = &cfg->fails[i];
        if (f->worker < 0 || f->worker >= m->n || !(f->t >= 0)) return COH_EINVAL;
        rc = push(m, f->t, EV_FAIL, f->worker, 0);
        if (rc) return rc;
    }
    m->now = 0;
    for (int i = 0; i < m->n && !rc; i++) rc = start_iteration(m, i);
    return rc;
}

int sc_sim_run(const sc_sim_cfg_t *cfg_in, sc_sim_result_t *res)
{
    if (!cfg_in || !res) return COH_EINVAL;
    memset(res, 0, sizeof(*res));
    sc_sim_cfg_t cfg = *cfg_in;
    if (cfg.replay) {
        const sc_replay_t *r = cfg.replay;
        if (r->n < 1 || !r->off || !r->bw_gbps || !r->compute_s) return COH_EINVAL;
        for (int i = 0; i < r->n; i++)
            if (r->off[i + 1] < r->off[i]) return COH_EINVAL;
        for (int i = 0; i < r->off[r->n]; i++)
            if (!(r->bw_gbps[i] > 0) || !(r->compute_s[i] >= 0) || !isfinite(r->compute_s[i]))
                return COH_EINVAL;
        cfg.n = r->n;
    } else {
        if (cfg.n < 1 || !(cfg.lambda >= 0 && cfg.lambda <= 1)) return COH_EINVAL;
        if (cfg.dist.kind == SC_DIST_SAMPLES && (cfg.dist.nsamples < 1 || !cfg.dist.samples))
            return COH_EINVAL;
    }
    if (!(cfg.duration_s > 0) || !(cfg.bw_error >= 0) || !(cfg.detect_s >= 0) ||
        !(cfg.compute_scale > 0) || !isfinite(cfg.compute_scale) ||
        !(cfg.slow_frac >= 0 && cfg.slow_frac <= 1) || !(cfg.slow_factor > 0) ||
        !isfinite(cfg.slow_factor))
        return COH_EINVAL;
    if (cfg.warm && !cfg.replay) cfg.sched.cdf_per_worker = false;
    if (cfg.max_idle_ticks <= 0) cfg.max_idle_ticks = 100000;

    sim_t m = {.cfg = &cfg, .res = res, .n = cfg.n};
    m.w = coh_calloc((size_t)m.n, sizeof(simw_t));
    m.g = coh_calloc((size_t)m.n, sizeof(simg_t));
    int rc = (!m.w || !m.g) ? COH_ENOMEM : setup(&m);
    int64_t idle = 0;
    while (!rc && m.nheap > 0) {
        double t = m.heap[0].t;
        if (t > cfg.duration_s) break;
        m.now = t;
        while (!rc && m.nheap > 0 && m.heap[0].t == t) {
            ev_t e = pop(&m);
            res->events++;
            rc = handle(&m, &e);
        }
        if (rc) break;
        int acted = on_tick(&m);
        if (acted < 0) {
            rc = acted;
            break;
        }
        /* Nothing pending but ticks: a policy that keeps waiting on workers
         * that will never report (out of rows, dead and unreported) would
         * tick forever; stop after max_idle_ticks. */
        if (m.real_pending == 0) {
            idle = acted ? 0 : idle + 1;
            if (idle >= cfg.max_idle_ticks) break;
        } else {
            idle = 0;
        }
    }
    if (!rc) {
        res->sim_end_s = isfinite(cfg.duration_s) && m.nheap > 0 ? cfg.duration_s : m.now;
        res->total_sync = m.nsync;
        res->total_iteration = m.iters;
        res->avg_sync_time_s = m.nsync ? m.sum_time / m.nsync : 0;
        res->avg_sync_scale = m.nsync ? m.sum_scale / m.nsync : 0;
        res->wasted_wait_ms_per_worker = m.wasted / m.n * 1000.0;
        res->min_worker_syncs = INT64_MAX;
        for (int i = 0; i < m.n; i++) {
            const simw_t *x = &m.w[i];
            if (x->state == W_READY) {
                double wait = res->sim_end_s - x->t_ready;
                if (wait > res->max_wait_s) res->max_wait_s = wait;
            }
            if (!x->dead && !x->excluded && x->syncs < res->min_worker_syncs)
                res->min_worker_syncs = x->syncs;
        }
        if (res->min_worker_syncs == INT64_MAX) res->min_worker_syncs = 0;
    }
    if (m.g)
        for (int i = 0; i < m.n; i++) coh_free(m.g[i].ids);
    coh_free(m.g);
    coh_free(m.w);
    coh_free(m.heap);
    sc_sched_destroy(m.s);
    if (rc) sc_sim_result_free(res);
    return rc;
}
