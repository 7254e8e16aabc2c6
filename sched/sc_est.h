/*
 * sc_est.h - estimators of sched/: the ring cost model (Eq. 2 of seeds/001),
 * the runtime CDF of compute time (Eq. 4), weights for weighted averaging,
 * AdapCC's phase-2 cost and ski-rental rule (seeds/004 IV-C). Pure functions
 * and small value types; no I/O, no clock.
 */
#ifndef COH_SC_EST_H
#define COH_SC_EST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- ring cost model ---- */

typedef enum sc_cost_form {
    /* Eq. 2, first line: 2(m-1)alpha + 2(m-1)/m * v / b_min. What a ring
     * allreduce of m members moves; the simulator's ground truth. */
    SC_COST_EXACT = 0,
    /* Eq. 2, second line: 2m alpha + 2v / b_min. The paper's approximation,
     * used by its motivating example (Section II-D, Fig. 3). */
    SC_COST_APPROX = 1,
} sc_cost_form;

typedef struct sc_cost {
    double alpha_s;    /* per-hop latency, seconds */
    double model_gbit; /* v, in gigabits (MB * 8 / 1000) */
    sc_cost_form form;
} sc_cost_t;

/* Seconds for a ring allreduce of m members whose slowest has bmin_gbps.
 * m <= 1 costs 0 (nothing to exchange) in both forms. */
double sc_cost_ring(const sc_cost_t *c, int m, double bmin_gbps);
/*
 * AdapCC phase 2 (seeds/004 IV-C): a relay that becomes ready during phase 1
 * joins the chunks still to come; the chunks it missed (a prefix of the
 * tensor, fraction f_i of it) are aggregated in phase 2 and reach all n_all
 * workers. Two ways to do that, the cheaper one is used: every late worker
 * broadcasts its missed chunks around the ring, (n_all-1) alpha + sum(f_i) v
 * / b; or one ring allreduce over all of the largest missed prefix,
 * Eq. 2 with m = n_all and v * max(f_i). 0 when nothing was missed.
 */
double sc_cost_phase2(const sc_cost_t *c, int n_all, double sum_missed, double max_missed,
                      double bmin_gbps);
/* AdapCC's break-even rule: proceed when the accumulated waiting cost has
 * reached the cost of proceeding (phase 1 + phase 2). Competitive ratio 2. */
static inline bool sc_ski_proceed(double waited_s, double buy_s)
{
    return waited_s >= buy_s;
}

/* ---- alpha-beta fit of one probed link ---- */

/*
 * From n one-word exchange times (lat, seconds; sorted in place) and the
 * mean time of a `bytes` transfer (bulk_s): alpha = the median exchange,
 * and the rate of what the transfer took beyond the fastest exchange (noise
 * only ever adds to an exchange, so its minimum is the best latency to take
 * off). On a loaded host the exchanges can be as slow as the transfer
 * itself; then the two cannot be told apart, and the transfer is charged at
 * least half its time: the rate is at most twice the plain bytes / bulk_s,
 * never 0 nor unbounded. Returns COH_EINVAL for n < 1, bytes 0 or a bulk
 * time that is not positive.
 */
int sc_fit_alpha_beta(double *lat, int n, double bulk_s, uint64_t bytes, double *alpha_s,
                      double *gbps);

/* ---- a rank's link rate, from its frames and its probes ---- */

/*
 * A frame measures the slower of its two ends, and a shaper's burst lets a
 * short one through at line rate: at 32 ranks on tbf links, frames showed
 * 0.35-2.2x a rank's true rate. Without a probe the estimate is the best of
 * the last SC_RATE_HIST frames (a slow partner pulls one measurement down,
 * not the estimate). A probe moves a long transfer each way with several
 * partners and keeps the best (1.13x the true rate for 30 ranks of 32, the
 * same for all): its rate stands until SC_RATE_HIST frames since contradict
 * it, every one above 1.5x or every one below half of it (the link
 * changed); then the frames' best again, until the next probe.
 */
#define SC_RATE_HIST 8
typedef struct sc_rate {
    double hist[SC_RATE_HIST]; /* the latest frames' measurements, Gbit/s (a ring) */
    uint64_t count;            /* frames since the probe (or ever) */
    double probe;              /* the probe's rate while the frames agree; 0: none */
} sc_rate_t;

/* A probe's measurement (ignored unless positive and finite). */
void sc_rate_probe(sc_rate_t *r, double gbps);
/* A frame's measurement (ignored unless positive and finite). */
void sc_rate_frame(sc_rate_t *r, double gbps);
/* The estimate, Gbit/s; 0 before any measurement. */
double sc_rate_get(const sc_rate_t *r);

/* ---- runtime CDF of compute time (Eq. 4) ---- */

/*
 * Eq. 4 asks for P(T <= t+dt | T > t), the probability that a worker still
 * computing after t is ready within dt, and then equates it with F(t+dt) by
 * setting P(T > t) = 1; Alg. 2 line 26 computes F(t_i + dt). The two differ
 * a lot: F(t+dt) counts a worker near its median as half an arrival whatever
 * dt is, the conditional probability counts it as about hazard * dt.
 * Default: the printed F(t+dt). It is what Alg. 2 computes (twice printed:
 * Eq. 4's last line and line 26), and only it reproduces the paper's numbers
 * in our simulator: with the conditional reading at dt = 10 ms BPAWR almost
 * never predicts an arrival, never waits, and selective reduce is partial
 * reduce plus BAG (docs/sched.md, "Eq. 4", has both readings side by side).
 */
typedef enum sc_eq4_reading {
    SC_EQ4_CONDITIONAL = 0, /* (F(t+dt) - F(t)) / (1 - F(t)) */
    SC_EQ4_PRINTED = 1,     /* F(t+dt), the default */
} sc_eq4_reading;

/*
 * Empirical CDF over a sliding window of the last `window` samples (exact:
 * F(x) = #{samples <= x} / count). Kept sorted for O(log n) queries; an
 * insertion costs one memmove of the window. A loaded (warm) CDF is frozen.
 */
typedef struct sc_cdf {
    double *sorted; /* count samples, non-decreasing */
    double *ring;   /* insertion order, for eviction (NULL when frozen) */
    int count, window, head;
    bool frozen;
} sc_cdf_t;

void sc_cdf_init(sc_cdf_t *c, int window);
void sc_cdf_free(sc_cdf_t *c);
/* Add one observation (ignored when frozen). Returns 0, COH_EINVAL for a
 * non-finite or negative x, COH_ENOMEM. */
int sc_cdf_add(sc_cdf_t *c, double x);
/* Replace by these samples and freeze. COH_EINVAL, COH_ENOMEM. */
int sc_cdf_load(sc_cdf_t *c, const double *x, int n);
/* F(x); 0 for an empty CDF. */
double sc_cdf_eval(const sc_cdf_t *c, double x);
static inline double sc_cdf_max(const sc_cdf_t *c)
{
    return c->count ? c->sorted[c->count - 1] : 0;
}
/*
 * Probability that a worker computing for `elapsed` seconds is ready within
 * the next dt, under `reading`. Two guards keep a silent, dead or abnormally
 * slow worker from being waited for forever: an empty CDF, or an elapsed time
 * beyond overdue * max sample (overdue > 0), give 0; and under the
 * conditional reading F(elapsed) = 1 (past every sample: no information)
 * gives 0 rather than 0/0.
 */
double sc_cdf_prob_ready(const sc_cdf_t *c, double elapsed, double dt, sc_eq4_reading reading,
                         double overdue);

/* ---- weights for weighted averaging ---- */

/*
 * Weights of a weighted allreduce from the members' iteration counts: w_i =
 * it_i / sum(it). Section II-C (after [14], [33]): "dynamic weights concerning
 * the relative iteration counts": a member that has done fewer local
 * iterations carries a staler model and weighs less. Counts of 0 count as 1
 * so that a fresh worker is not silenced. Writes m weights summing to 1.
 */
void sc_weights_from_iters(const uint64_t *iters, int m, double *w);

#endif
