/*
 * sched.h - sched/: the decisions of cohort, pure and deterministic.
 *
 * sched/ owns
 *   - the scheduler (this header, sc_sched.c): who synchronises with whom,
 *     when and how, under four policies: allreduce, partial, selective (BAG +
 *     BPAWR + SELECTIVEREDUCE of Luo et al., seeds/001) and relay (AdapCC's
 *     wait-or-proceed with relays and a phase 2, seeds/004 IV-C);
 *   - the estimators (sc_est.h): ring cost model (Eq. 2), runtime CDF of the
 *     compute time per worker (Eq. 4), weights for weighted averaging, the
 *     ski-rental rule, a seeded PRNG for the simulator (sc_rng.h);
 *   - BAG and BPAWR as plain functions (sc_bag.h);
 *   - the discrete-event simulator that drives this same scheduler (sc_sim.h);
 *   - the collective plan builders (sc_plan.h): ring, weighted ring over a
 *     subset, relay, phase 2.
 *
 * Nothing in sched/ does I/O, reads a clock, prints or aborts on input. Time
 * comes in as arguments (seconds, as a double, from the caller's monotonic
 * clock or the simulator's virtual one); errors go out as negative COH_*
 * codes. The scheduler is single-threaded: one owner calls all functions.
 *
 * How the live coordinator uses it: create one scheduler per scheduled
 * communicator, feed it events as they arrive (ready, group done, bandwidth,
 * worker lost), call sc_sched_tick() every few ms and turn each LAUNCH
 * decision into a plan. Decisions stay valid until the next call on the
 * scheduler: copy what you keep.
 */
#ifndef COH_SCHED_H
#define COH_SCHED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sched/sc_est.h"

typedef enum sc_policy {
    SC_POLICY_ALLREDUCE = 0, /* wait for every live worker, then sync all */
    SC_POLICY_PARTIAL = 1,   /* launch the first p ready workers (FIFO) */
    SC_POLICY_SELECTIVE = 2, /* Alg. 3 with BAG (Alg. 1) and BPAWR (Alg. 2) */
    SC_POLICY_RELAY = 3,     /* AdapCC: ski-rental wait-or-proceed, relays, phase 2 */
    SC_POLICY_COUNT
} sc_policy;

/*
 * Parameters, written once: SC_PARAM_MAP is the table from which the
 * struct's defaults (sc_params_default), the setter by name (sc_params_set,
 * what cohort-sim's flags, COHORT_SCHED and COHORT_SCHED_<NAME> go
 * through), the range checks (sc_params_validate) and the help
 * (sc_params_info: cohort-sim --help, docs/sched.md) are generated. Readings
 * of the paper that change results are options here; the defaults are
 * argued in docs/sched.md and beside the code.
 *
 * Columns: name (cohort-sim's flag without "--"; the variable is
 * COHORT_SCHED_<NAME> with '-' as '_'), field, kind, scale (the field holds
 * value * scale: milliseconds in, seconds stored), default as text, range
 * (an interval for numbers, "a|b|c" for names: the value is the index),
 * help.
 */
typedef enum sc_param_kind {
    SC_PK_DBL = 0, /* double */
    SC_PK_INT,     /* int */
    SC_PK_BOOL,    /* bool: 1/0, true/false, yes/no, on/off */
    SC_PK_ENUM,    /* an int-sized enum, by name */
    SC_PK_ENUMB,   /* a bool, by name (index 0 false, 1 true) */
} sc_param_kind;

#define SC_PARAM_MAP(X)                                                                            \
    X("scheme", policy, SC_PK_ENUM, 1, "selective", "allreduce|partial|selective|relay",           \
      "policy: allreduce, partial, selective or relay")                                            \
    X("p", p, SC_PK_INT, 1, "0", "[0, inf)", "minimum group size (0: round(p-frac * n))")          \
    X("p-frac", p_frac, SC_PK_DBL, 1, "0.3", "(0, 1]",                                             \
      "minimum group size as a fraction of n (the paper's p = 0.3n)")                              \
    X("eta", eta, SC_PK_DBL, 1, "0.3", "[0, 1)",                                                   \
      "BAG: a group takes workers within (1-eta) of its p-th bandwidth")                           \
    X("theta", theta, SC_PK_DBL, 1, "1", "[0, inf)",                                               \
      "BPAWR: wait only if the expected saving exceeds theta*dt")                                  \
    X("dt-ms", dt_s, SC_PK_DBL, 1e-3, "10", "(0, inf)",                                            \
      "BPAWR time slot and selective re-evaluation period, ms")                                    \
    X("c", c, SC_PK_INT, 1, "0", "[0, inf)",                                                       \
      "selective: full weighted allreduce every c rounds (0: never)")                              \
    X("alpha-ms", alpha_s, SC_PK_DBL, 1e-3, "1", "[0, inf)",                                       \
      "per-hop latency of the ring cost model (Eq. 2), ms")                                        \
    X("model-mb", model_mb, SC_PK_DBL, 1, "500", "(0, inf)", "model size, MB (10^6 bytes)")        \
    X("cost", cost_form, SC_PK_ENUM, 1, "exact", "exact|approx",                                   \
      "Eq. 2 form: exact (2(m-1)a + 2(m-1)/m v/b) or approx (2ma + 2v/b)")                         \
    X("default-gbps", default_gbps, SC_PK_DBL, 1, "10", "(0, inf)",                                \
      "bandwidth assumed for a worker with no estimate yet, Gbps")                                 \
    X("eq4", eq4, SC_PK_ENUM, 1, "printed", "conditional|printed",                                 \
      "P(ready in dt): printed F(t+dt) or conditional (F(t+dt)-F(t))/(1-F(t))")                    \
    X("bag", bag_le, SC_PK_ENUMB, 1, "strict", "strict|literal",                                   \
      "BAG line 6: strict (len < p) or literal (len <= p)")                                        \
    X("flag", flag_launches, SC_PK_ENUMB, 1, "wait", "wait|literal",                               \
      "BPAWR's flag: wait (true = wait, launch otherwise) or literal (if F launch)")               \
    X("full-counts", full_counts, SC_PK_BOOL, 1, "1", "",                                          \
      "1: a full sync advances Alg. 3's round k; 0: literal (never)")                              \
    X("overdue", overdue_factor, SC_PK_DBL, 1, "2", "[0, inf)",                                    \
      "do not wait for a worker computing longer than this * its largest sample")                  \
    X("starve-s", starve_s, SC_PK_DBL, 1, "10", "[0, inf)",                                        \
      "selective: a ready worker waiting longer than this is not held back by BAG's leftover "     \
      "group or BPAWR (0: off, the paper's behaviour)")                                            \
    X("cdf-per-worker", cdf_per_worker, SC_PK_BOOL, 1, "1", "",                                    \
      "1: a worker's own CDF once it has cdf-min-samples; 0: pooled only")                         \
    X("cdf-window", cdf_window, SC_PK_INT, 1, "256", "[1, inf)", "samples kept per worker")        \
    X("cdf-pool-window", cdf_pool_window, SC_PK_INT, 1, "4096", "[1, inf)",                        \
      "samples kept in the pooled CDF")                                                            \
    X("cdf-min-samples", cdf_min_samples, SC_PK_INT, 1, "8", "[1, inf)",                           \
      "samples before a worker's own CDF is used")                                                 \
    X("tick-ms", tick_s, SC_PK_DBL, 1e-3, "5", "(0, inf)",                                         \
      "relay: coordinator cycle (one unit of waiting cost), ms")                                   \
    X("fault-factor", fault_factor, SC_PK_DBL, 1, "5", "[0, inf)",                                 \
      "relay: suspect relays not ready this * (phase-1 end - first ready) after phase 1 (0: off)") \
    X("fault-min-ms", fault_min_s, SC_PK_DBL, 1e-3, "200", "[0, inf)",                             \
      "relay: never suspect a relay sooner than this after phase 1 (exclusion is for good)")       \
    X("calib-gain", calib_gain, SC_PK_DBL, 1, "0.1", "[0, 1]",                                     \
      "gain of the measured/expected correction of the cost model (0: off)")

typedef struct sc_params {
    sc_policy policy;       /* "scheme" */
    int p;                  /* "p" */
    double p_frac;          /* "p-frac" */
    double eta;             /* "eta" */
    double theta;           /* "theta" */
    double dt_s;            /* "dt-ms" */
    int c;                  /* "c" */
    double alpha_s;         /* "alpha-ms" */
    double model_mb;        /* "model-mb" */
    sc_cost_form cost_form; /* "cost" */
    double default_gbps;    /* "default-gbps" */

    /* Readings of the paper (see the comments in sc_bag.c and sc_sched.c). */
    sc_eq4_reading eq4;    /* "eq4" */
    bool bag_le;           /* "bag" */
    bool flag_launches;    /* "flag" */
    bool full_counts;      /* "full-counts" */
    double overdue_factor; /* "overdue" */
    double starve_s;       /* "starve-s" */

    /* Runtime CDF (Eq. 4). */
    bool cdf_per_worker; /* "cdf-per-worker" */
    int cdf_window;      /* "cdf-window" */
    int cdf_pool_window; /* "cdf-pool-window" */
    int cdf_min_samples; /* "cdf-min-samples" */

    /* relay */
    double tick_s;       /* "tick-ms" */
    double fault_factor; /* "fault-factor" */
    double fault_min_s;  /* "fault-min-ms" */

    /* Gain of the running correction of the cost model from measured group
     * durations (expected_s and the relay's buying cost). */
    double calib_gain; /* "calib-gain" */
} sc_params_t;

void sc_params_default(sc_params_t *p);
/* Set one parameter by name ("eta", "dt-ms", "scheme", "eq4"; environment
 * style "DT_MS" too). Returns 0, COH_EINVAL for an unknown name or a value
 * that does not parse or is out of range (p is not changed then). */
int sc_params_set(sc_params_t *p, const char *name, const char *value);
/* Check ranges; n is the number of workers (p <= n). */
int sc_params_validate(const sc_params_t *p, int n);
/* The effective minimum group size for n workers. */
int sc_params_p(const sc_params_t *p, int n);

typedef struct sc_param_info {
    const char *name;  /* as accepted by sc_params_set */
    const char *deflt; /* default, as text */
    const char *range; /* interval, or "a|b|c", or "" (bool) */
    const char *help;  /* one line */
    sc_param_kind kind;
    double scale;
    size_t off; /* in sc_params_t */
} sc_param_info_t;
/* The table of every parameter, for --help, docs and the environment. */
const sc_param_info_t *sc_params_info(int *count);

int sc_policy_from_name(const char *name, sc_policy *out); /* COH_EINVAL if unknown */
const char *sc_policy_name(sc_policy policy);

/* ---- decisions ---- */

typedef enum sc_dec_kind {
    SC_DEC_LAUNCH = 0,  /* start a synchronisation group now */
    SC_DEC_WAIT = 1,    /* these workers wait (a record of why; nothing to do) */
    SC_DEC_SUSPECT = 2, /* relay: this worker missed T_fault; the caller decides
                           (normally sc_sched_on_worker_lost) */
} sc_dec_kind;

/* Why a decision was taken: code, message. */
#define SC_WHY_MAP(X)                                                                              \
    X(IDLE, "nothing changed since the last evaluation")                                           \
    X(ALL_READY, "every live worker is ready: sync all")                                           \
    X(WAIT_ALL, "waiting for every live worker")                                                   \
    X(FIFO, "the first p ready workers in arrival order")                                          \
    X(BELOW_P, "fewer than p workers ready")                                                       \
    X(FULL_SYNC, "full weighted allreduce due (k mod c = 0) and every live worker is ready")       \
    X(WAIT_FULL, "full weighted allreduce due (k mod c = 0): waiting for every live worker")       \
    X(HOLD_FULL, "a full sync fell due earlier in this pass: group held for it")                   \
    X(BPAWR_LAUNCH, "BPAWR: the expected saving t_X does not exceed theta*dt: launch")             \
    X(BPAWR_WAIT, "BPAWR: the expected saving t_X exceeds theta*dt: wait and replace")             \
    X(BPAWR_SMALL, "BPAWR: group smaller than p: wait for more ready workers")                     \
    X(BPAWR_LITERAL, "literal Alg. 3 (option flag=literal): launched because F is true")           \
    X(STARVE, "a member waited longer than starve-s: launched without waiting for replacements")   \
    X(RELAY_WAIT, "ski rental: waiting cost below the phase 1 + phase 2 cost")                     \
    X(RELAY_PROCEED, "ski rental: waiting cost reached the phase 1 + phase 2 cost: proceed")       \
    X(RELAY_FAULT, "relay not ready T_fault after phase 1: suspected faulty")

typedef enum sc_why {
#define SC__WHY_ENUM(name, msg) SC_WHY_##name,
    SC_WHY_MAP(SC__WHY_ENUM)
#undef SC__WHY_ENUM
        SC_WHY_COUNT
} sc_why;

const char *sc_why_name(sc_why why);
const char *sc_why_message(sc_why why);

/* The numbers behind a decision; fields that do not apply are 0. */
typedef struct sc_explain {
    int n_ready;   /* ready workers when evaluated */
    int n_live;    /* live workers */
    int p;         /* effective minimum group size */
    int64_t round; /* Alg. 3's k when evaluated */
    /* BPAWR */
    int n_cand;        /* |C|: in-training workers faster than the group's slowest */
    double sum_prob;   /* sum of their probabilities of being ready within dt */
    int k_virtual;     /* floor(sum_prob): virtual workers inserted */
    double b_virtual;  /* their bandwidth (probability-weighted mean of C) */
    double bmin_g;     /* slowest bandwidth in g */
    double bmin_gstar; /* slowest bandwidth in g* (virtual workers included) */
    int gstar_size;    /* |g*| (virtual workers included) */
    int n_delta;       /* |g_Delta|: real workers g* leaves out */
    double t_x;        /* T(g) - T(g*) */
    double threshold;  /* theta * dt */
    /* relay */
    double waited_s; /* accumulated waiting cost since the first ready worker */
    double buy_s;    /* estimated phase 1 + phase 2 */
    double phase1_s, phase2_s;
} sc_explain_t;

typedef struct sc_decision {
    sc_dec_kind kind;
    sc_why why;
    double t;          /* time of the decision */
    uint64_t group_id; /* LAUNCH: the id sc_sched_on_group_done expects */
    /* LAUNCH: members in ring order (phase-1 members for relay); WAIT: the
     * workers told to wait; SUSPECT: the suspected worker. */
    int nmembers;
    const int *members;
    const double *weights; /* LAUNCH: per member, sums to 1 (over members and relays) */
    /* relay LAUNCH: live workers not ready, who relay in phase 1 and
     * contribute in phase 2 when ready. */
    int nrelays;
    const int *relays;
    const double *relay_weights;
    double expected_s; /* LAUNCH: expected duration (relay: phase 1 + phase 2) */
    double phase1_s;   /* relay LAUNCH: expected phase-1 duration */
    bool full;         /* LAUNCH: every live worker takes part */
    sc_explain_t ex;
} sc_decision_t;

/* A human-readable line for a decision: "launch g7 [3 5 1] why=... t_X=...".
 * Returns the length it needed (like snprintf) or COH_EINVAL. */
int sc_decision_explain(const sc_decision_t *d, char *buf, size_t len);

typedef struct sc_tick {
    const sc_decision_t *dec; /* ndec decisions, launches and waits in evaluation order */
    int ndec;
    int nlaunch;
    bool evaluated;   /* false: nothing changed, the previous decisions stand */
    double next_tick; /* when the decisions may change with no new event (INFINITY: never) */
} sc_tick_t;

/* ---- the scheduler ---- */

typedef struct sc_sched sc_sched_t;

/* Every worker starts computing at time 0 (see sc_sched_on_compute_start).
 * n in [1, 2^20]. Returns 0, COH_EINVAL, COH_ENOMEM. */
int sc_sched_create(const sc_params_t *params, int n, sc_sched_t **out);
void sc_sched_destroy(sc_sched_t *s);

/* Worker w started an iteration at t (default: 0 at creation, and the end of
 * each of its syncs). Only the elapsed time of computing workers uses it. */
int sc_sched_on_compute_start(sc_sched_t *s, int w, double t);
/* Worker w is ready at t after an iteration of compute_s seconds (< 0:
 * derived from its compute start). Feeds the cold-start CDF. COH_ESTATE if w
 * is not computing (already ready, syncing or lost). */
int sc_sched_on_ready(sc_sched_t *s, int w, double t, double compute_s);
/* Group group_id finished at t after duration_s (measured). Its members go
 * back to computing from t, or from their own end (sc_sched_on_member_done).
 * COH_EINVAL for an unknown id. */
int sc_sched_on_group_done(sc_sched_t *s, uint64_t group_id, double t, double duration_s);
/* Worker w, a member of a running plain group, finished its part at t (its
 * DONE): it computes again from t, not from the group's end. At 32 ranks a
 * group's DONEs came over 200 ms (median), and counting the early members'
 * computation from the last one made BPAWR expect fewer of them soon.
 * COH_ESTATE if w is not in a running group. */
int sc_sched_on_member_done(sc_sched_t *s, int w, double t);
/* Relay groups: phase 1 finished at t (optional; otherwise the expected end
 * is used for T_fault). */
int sc_sched_on_phase1_done(sc_sched_t *s, uint64_t group_id, double t);
/* Relay groups: how phase 2 should fold k late workers' data into the
 * phase-1 result over the n workers of ring[]: 1 = each late worker
 * broadcasts around the ring (k * v / b), 2 = an allreduce in which the
 * others contribute the identity (Eq. 2) -- whichever the cost model says
 * is cheaper (the same comparison as the ski rental's phase-2 cost);
 * broadcasting is only chosen for k = 1. 0 when k = 0. frac (0, 1]: the
 * part of the model phase 2 moves (a late worker that joined phase 1 part
 * way only misses its start): the latency terms weigh more then. */
int sc_sched_phase2_method(const sc_sched_t *s, const int *ring, int n, int k, double frac);
/* A measured per-hop latency (alpha-beta probe): the cost model's alpha. */
int sc_sched_set_alpha(sc_sched_t *s, double alpha_s);
/* New bandwidth estimate for w in Gbps (> 0). */
int sc_sched_on_bandwidth(sc_sched_t *s, int w, double gbps);
/* w is gone: never planned, waited for or counted again. A lost member of a
 * running group stays in it until the group is done. */
int sc_sched_on_worker_lost(sc_sched_t *s, int w);
/* w, lost or left, takes part again: computing from t (a rank that left the
 * schedule and syncs again). COH_ESTATE while it is still in a running group. */
int sc_sched_on_worker_back(sc_sched_t *s, int w, double t);
/* Warm start: replace the CDF of worker w (w = -1: the pooled CDF used for
 * every worker without enough samples of its own) by these samples, and
 * freeze it (later observations do not change it). */
int sc_sched_load_cdf(sc_sched_t *s, int w, const double *samples, int count);

/* Decide at time t. Times must not go backwards (COH_EINVAL). */
int sc_sched_tick(sc_sched_t *s, double t, sc_tick_t *out);
/* When a tick is next needed if no event arrives (INFINITY: none). */
double sc_sched_next_tick(const sc_sched_t *s);

typedef enum sc_wstate {
    SC_W_COMPUTING = 0,
    SC_W_READY = 1,       /* queued, waiting for a group */
    SC_W_SYNCING = 2,     /* member of a running group */
    SC_W_RELAY = 3,       /* computing, and relay of a running relay group */
    SC_W_RELAY_READY = 4, /* relay that became ready: contributes in phase 2 */
    SC_W_LOST = 5,
} sc_wstate;

typedef struct sc_sched_stats {
    int n, n_live, n_ready, n_groups; /* groups running */
    int p;
    int64_t round;       /* Alg. 3's k */
    int64_t evaluations; /* ticks that evaluated the policy */
    int64_t launches, waits, suspects;
    double calib; /* measured / expected duration, running */
} sc_sched_stats_t;

int sc_sched_stats(const sc_sched_t *s, sc_sched_stats_t *st);
int sc_sched_worker_state(const sc_sched_t *s, int w); /* sc_wstate or COH_EINVAL */
/* Current estimates, for tests and traces. */
double sc_sched_bandwidth(const sc_sched_t *s, int w);
/* P(w ready within dt | computing for `elapsed`) under the configured
 * reading, from the CDF the scheduler would use for w. */
double sc_sched_prob_ready(const sc_sched_t *s, int w, double elapsed);

#endif
