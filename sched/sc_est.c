/*
 * Estimators: ring cost (Eq. 2), AdapCC phase 2, runtime CDF (Eq. 4),
 * weights. See sc_est.h.
 */
#include "sched/sc_est.h"

#include "base/bs_alloc.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cohort.h"

double sc_cost_ring(const sc_cost_t *c, int m, double bmin_gbps)
{
    if (m <= 1) return 0;
    double vb = c->model_gbit / bmin_gbps;
    if (c->form == SC_COST_APPROX) return 2.0 * m * c->alpha_s + 2.0 * vb;
    return 2.0 * (m - 1) * c->alpha_s + 2.0 * (double)(m - 1) / m * vb;
}

double sc_cost_phase2(const sc_cost_t *c, int n_all, double sum_missed, double max_missed,
                      double bmin_gbps)
{
    if (n_all <= 1 || !(sum_missed > 0) || !(max_missed > 0)) return 0;
    double bcast = (n_all - 1) * c->alpha_s + sum_missed * c->model_gbit / bmin_gbps;
    sc_cost_t part = *c;
    part.model_gbit = c->model_gbit * max_missed;
    double ring = sc_cost_ring(&part, n_all, bmin_gbps);
    return bcast < ring ? bcast : ring;
}

void sc_cdf_init(sc_cdf_t *c, int window)
{
    memset(c, 0, sizeof(*c));
    c->window = window > 0 ? window : 1;
}

void sc_cdf_free(sc_cdf_t *c)
{
    coh_free(c->sorted);
    coh_free(c->ring);
    int w = c->window;
    sc_cdf_init(c, w);
}

/* First index whose sample is > x (so #{<= x} == index). Branchless: the
 * comparison becomes a conditional move, so a query over a 4096-sample
 * window costs 12 predictable steps; BPAWR asks one per candidate. */
static int cmp_dbl(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

void sc_rate_probe(sc_rate_t *r, double gbps)
{
    if (!(gbps > 0) || !isfinite(gbps)) return;
    r->probe = gbps;
    r->count = 0; /* the frames from here on are held against it */
}

static double rate_best(const sc_rate_t *r, double *worst)
{
    double best = 0, w = INFINITY;
    int n = r->count < SC_RATE_HIST ? (int)r->count : SC_RATE_HIST;
    for (int k = 0; k < n; k++) {
        if (r->hist[k] > best) best = r->hist[k];
        if (r->hist[k] < w) w = r->hist[k];
    }
    if (worst) *worst = w;
    return best;
}

void sc_rate_frame(sc_rate_t *r, double gbps)
{
    if (!(gbps > 0) || !isfinite(gbps)) return;
    /* A probe restarts the count: the ring fills from its start again, so
     * its first count entries are the frames since the probe. */
    r->hist[r->count++ % SC_RATE_HIST] = gbps;
    double worst, best = rate_best(r, &worst);
    if (r->probe > 0 && r->count >= SC_RATE_HIST &&
        (worst > 1.5 * r->probe || best < 0.5 * r->probe))
        r->probe = 0;
}

double sc_rate_get(const sc_rate_t *r)
{
    return r->probe > 0 ? r->probe : rate_best(r, NULL);
}

int sc_fit_alpha_beta(double *lat, int n, double bulk_s, uint64_t bytes, double *alpha_s,
                      double *gbps)
{
    if (n < 1 || bytes == 0 || !(bulk_s > 0)) return COH_EINVAL;
    qsort(lat, (size_t)n, sizeof(double), cmp_dbl);
    double t = bulk_s - lat[0];
    if (!(t >= bulk_s / 2)) t = bulk_s / 2;
    *alpha_s = lat[n / 2];
    *gbps = (double)bytes * 8 / t / 1e9;
    return 0;
}

static int upper_bound(const double *a, int n, double x)
{
    if (n <= 0) return 0;
    const double *base = a;
    while (n > 1) {
        int half = n / 2;
        base = base[half] <= x ? base + half : base;
        n -= half;
    }
    return (int)(base - a) + (*base <= x);
}

/* First index whose sample is >= x. */
static int lower_bound(const double *a, int n, double x)
{
    int lo = 0, hi = n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (a[mid] < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

int sc_cdf_add(sc_cdf_t *c, double x)
{
    if (!isfinite(x) || x < 0) return COH_EINVAL;
    if (c->frozen) return 0;
    if (!c->sorted) {
        c->sorted = coh_reallocn(NULL, c->window, sizeof(double));
        c->ring = coh_reallocn(NULL, c->window, sizeof(double));
        if (!c->sorted || !c->ring) {
            sc_cdf_free(c);
            return COH_ENOMEM;
        }
    }
    if (c->count == c->window) {
        /* Evict the oldest sample: its slot in the ring takes the new one. */
        double old = c->ring[c->head];
        int i = lower_bound(c->sorted, c->count, old);
        memmove(&c->sorted[i], &c->sorted[i + 1], (size_t)(c->count - i - 1) * sizeof(double));
        c->count--;
    }
    c->ring[c->head] = x;
    c->head = (c->head + 1) % c->window;
    int i = upper_bound(c->sorted, c->count, x);
    memmove(&c->sorted[i + 1], &c->sorted[i], (size_t)(c->count - i) * sizeof(double));
    c->sorted[i] = x;
    c->count++;
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int sc_cdf_load(sc_cdf_t *c, const double *x, int n)
{
    if (n < 0 || (n > 0 && !x)) return COH_EINVAL;
    for (int i = 0; i < n; i++)
        if (!isfinite(x[i]) || x[i] < 0) return COH_EINVAL;
    double *s = NULL;
    if (n > 0) {
        s = coh_reallocn(NULL, (size_t)n, sizeof(double));
        if (!s) return COH_ENOMEM;
        memcpy(s, x, (size_t)n * sizeof(double));
        qsort(s, (size_t)n, sizeof(double), cmp_double);
    }
    coh_free(c->sorted);
    coh_free(c->ring);
    c->sorted = s;
    c->ring = NULL;
    c->count = n;
    c->head = 0;
    c->window = n > 0 ? n : 1;
    c->frozen = true;
    return 0;
}

double sc_cdf_eval(const sc_cdf_t *c, double x)
{
    if (c->count == 0) return 0;
    return (double)upper_bound(c->sorted, c->count, x) / c->count;
}

double sc_cdf_prob_ready(const sc_cdf_t *c, double elapsed, double dt, sc_eq4_reading reading,
                         double overdue)
{
    if (c->count == 0) return 0;
    if (elapsed < 0) elapsed = 0;
    if (overdue > 0 && elapsed > overdue * sc_cdf_max(c)) return 0;
    double f_next = sc_cdf_eval(c, elapsed + dt);
    if (reading == SC_EQ4_PRINTED) return f_next;
    double f_now = sc_cdf_eval(c, elapsed);
    if (f_now >= 1.0) return 0;
    double p = (f_next - f_now) / (1.0 - f_now);
    return p < 0 ? 0 : (p > 1 ? 1 : p);
}

void sc_weights_from_iters(const uint64_t *iters, int m, double *w)
{
    double sum = 0;
    for (int i = 0; i < m; i++) sum += iters[i] ? (double)iters[i] : 1.0;
    for (int i = 0; i < m; i++) w[i] = (iters[i] ? (double)iters[i] : 1.0) / sum;
}
