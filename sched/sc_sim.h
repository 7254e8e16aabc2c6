/*
 * sc_sim.h - trace-driven discrete-event simulator of n workers under one
 * scheduler policy, with the methodology of seeds/001 Section IV-A: workers
 * compute (times drawn from a distribution), report ready, wait for the
 * scheduler, synchronise in rings whose duration follows Eq. 2 with the
 * members' true bandwidths, and start again. The decisions come from the
 * real scheduler (sched.h), fed exactly as the live coordinator feeds it.
 *
 * Pure: no I/O, no clock. Deterministic: one seed gives one run.
 */
#ifndef COH_SC_SIM_H
#define COH_SC_SIM_H

#include <stdbool.h>
#include <stdint.h>

#include "sched/sched.h"
#include "sched/sc_rng.h"

/* ---- compute-time distributions ---- */

typedef enum sc_dist_kind {
    /* Synthetic stand-ins for the paper's two traces (its Fig. 1, from [13]),
     * which are not available; see docs/sched.md. */
    SC_DIST_CNN = 0,         /* ResNet-50: steady work, cloud interference tail */
    SC_DIST_TRANSFORMER = 1, /* Transformer on WMT16: sentence lengths vary widely */
    SC_DIST_SAMPLES = 2,     /* draw uniformly from given samples (a CSV trace) */
} sc_dist_kind;

typedef struct sc_dist {
    sc_dist_kind kind;
    const double *samples; /* SC_DIST_SAMPLES */
    int nsamples;
} sc_dist_t;

int sc_dist_from_name(const char *name, sc_dist_t *out); /* "cnn", "transformer" */
const char *sc_dist_name(const sc_dist_t *d);
/* One compute time, seconds. */
double sc_dist_draw(const sc_dist_t *d, sc_rng_t *r);

/* ---- scenario ---- */

/* An exact scenario: the rows of worker w are [off[w], off[w+1]); row k
 * gives the compute time of its k-th iteration and its bandwidth during the
 * sync that follows. A worker out of rows stops after its last sync. */
typedef struct sc_replay {
    int n;
    const int *off;
    const double *bw_gbps;
    const double *compute_s;
} sc_replay_t;

/* Worker `worker` dies at t: it never reports ready again. */
typedef struct sc_sim_fail {
    int worker;
    double t;
} sc_sim_fail_t;

typedef struct sc_sim_cfg {
    sc_params_t sched; /* policy and its parameters */
    int n;             /* workers (replay: taken from the scenario) */
    uint64_t seed;
    double duration_s;    /* simulated training time, 100 (INFINITY: until nothing moves) */
    double lambda;        /* bandwidth round(20u, 3) Gbps, u ~ U[lambda, 1]; 0.05 */
    double bw_error;      /* estimate b(1 + e x), x ~ U[-1, 1], redrawn per sync; 0 */
    bool warm;            /* warm start: the CDF is known in advance (true) */
    int warm_samples;     /* samples of the known distribution loaded, 10000 */
    sc_dist_t dist;       /* compute times */
    double compute_scale; /* every compute time is multiplied by this, 1 */
    /* Persistent stragglers (AdapCC's mixed GPU generations): a random
     * round(slow_frac * n) workers compute slow_factor times slower. 0, 1. */
    double slow_frac, slow_factor;
    const sc_replay_t *replay; /* exact scenario instead of random draws */
    const sc_sim_fail_t *fails;
    int nfails;
    double detect_s;        /* a dead worker is reported lost this long after it dies, 1 s */
    bool record;            /* keep every launched sync in the result */
    bool check;             /* check invariants on every decision */
    int64_t max_idle_ticks; /* stop after this many ticks with no pending event, 100000 */
    /* Observer: called with every decision of every evaluating tick (the
     * decision is valid during the call only). NULL: none. */
    void (*trace)(void *ctx, const sc_decision_t *d);
    void *trace_ctx;
} sc_sim_cfg_t;

typedef struct sc_sim_sync {
    double start, end; /* end is NAN for a sync that never finished */
    int off, n;        /* members (relay: phase-1 members then relays) in result.members */
} sc_sim_sync_t;

typedef struct sc_sim_result {
    /* The paper's metrics (IV-A2), over syncs finished within duration_s. */
    double avg_sync_time_s;  /* mean of (end - start) */
    double avg_sync_scale;   /* mean number of workers whose data a sync aggregates */
    int64_t total_sync;      /* syncs finished */
    int64_t total_iteration; /* iterations finished by all workers (one per sync taken part in) */
    double wasted_wait_ms_per_worker; /* BPAWR waits that no newcomer joined, per worker */
    /* diagnostics */
    int64_t launched, events, ticks, evaluations;
    double sim_end_s;
    double max_wait_s;        /* longest ready-to-launch wait, unfinished waits included */
    int64_t min_worker_syncs; /* fewest syncs of a worker that never failed */
    int64_t violations;       /* invariant violations (check) */
    char violation[200];      /* the first one */
    /* log (record) */
    sc_sim_sync_t *syncs;
    int nsyncs;
    int *members;
} sc_sim_result_t;

void sc_sim_cfg_default(sc_sim_cfg_t *cfg);
/* Run one simulation. Returns 0, COH_EINVAL, COH_ENOMEM, or a scheduler
 * error (which is a bug: the simulator feeds only valid events). */
int sc_sim_run(const sc_sim_cfg_t *cfg, sc_sim_result_t *res);
void sc_sim_result_free(sc_sim_result_t *res);

/* Bandwidth of the paper's methodology: round(20u, 3) Gbps, u ~ U[lambda, 1]. */
double sc_sim_draw_bandwidth(sc_rng_t *r, double lambda);

#endif
