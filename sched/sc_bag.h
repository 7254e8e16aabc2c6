/*
 * sc_bag.h - BAG (Alg. 1) and BPAWR (Alg. 2) of seeds/001 as plain functions
 * on arrays, so that tests can run them on hand-made inputs and the
 * scheduler can run them without allocating.
 */
#ifndef COH_SC_BAG_H
#define COH_SC_BAG_H

#include <stdbool.h>

#include "sched/sc_est.h"

/* A worker as BAG and BPAWR see it. id < 0 marks a virtual worker (BPAWR
 * line 11). */
typedef struct sc_cand {
    double bw; /* Gbps */
    int id;
} sc_cand_t;

/* The order of Alg. 1 line 2 ("non-increasingly"), made total so that every
 * run agrees: higher bandwidth first; on a tie real workers before virtual
 * ones (a worker that is ready beats one that may come), then by id. */
static inline bool sc_cand_before(const sc_cand_t *a, const sc_cand_t *b)
{
    if (a->bw != b->bw) return a->bw > b->bw;
    if ((a->id < 0) != (b->id < 0)) return a->id >= 0;
    return a->id < b->id;
}

/* Stable merge sort by sc_cand_before (tmp holds n entries): how a caller
 * puts candidates in the order sc_bag expects. The scheduler keeps its own
 * order of all workers with a radix sort that must agree with this one
 * (test_order_matches_reference). */
void sc_cand_sort(sc_cand_t *a, int n, sc_cand_t *tmp);

/*
 * BAG (Alg. 1) over candidates already in sc_cand_before order. Group g is
 * sorted[bounds[g] .. bounds[g+1]); bounds needs room for n+1 entries (or
 * max_groups+1). Stops after max_groups groups (<= 0: no limit). Returns the
 * number of groups. le selects the literal "len(g) <= p" of line 6.
 */
int sc_bag(const sc_cand_t *sorted, int n, int p, double eta, bool le, int max_groups, int *bounds);

typedef enum sc_bpawr_verdict {
    SC_BPAWR_LAUNCH = 0, /* Alg. 2 line 19: no waiting, no replacement */
    SC_BPAWR_WAIT = 1,   /* line 17: wait and replace g_Delta */
    SC_BPAWR_SMALL = 2,  /* line 3: fewer than p: wait for more */
} sc_bpawr_verdict;

/* P(in-training worker `id` is ready within dt), Eq. 4 (PREDICTWORKERS). */
typedef double (*sc_prob_fn)(void *ctx, int id);

typedef struct sc_bpawr {
    /* The workers still in training (the set S), in sc_cand_before order.
     * Alg. 2 line 7 removes every candidate it examined from S; as groups are
     * visited in non-increasing bandwidth, the removed ones always form the
     * prefix S[0 .. pos). */
    const sc_cand_t *S;
    int nS;
    int pos;
    sc_prob_fn prob;
    void *prob_ctx;
    int p;
    double eta, theta, dt_s;
    bool bag_le;
    sc_cost_t cost;
    sc_cand_t *scratch; /* room for ng + nS entries */
    int *bounds;        /* room for 2 entries */
} sc_bpawr_t;

typedef struct sc_bpawr_out {
    sc_bpawr_verdict verdict;
    int n_delta; /* WAIT: g_Delta is the last n_delta members of g; else 0 */
    int n_cand;
    double sum_prob;
    int k_virtual;
    double b_virtual;
    double bmin_g, bmin_gstar;
    int gstar_size;
    double t_x, threshold;
} sc_bpawr_out_t;

/* BPAWR (Alg. 2) for group g (sorted, ng members). Advances b->pos. */
void sc_bpawr_run(sc_bpawr_t *b, const sc_cand_t *g, int ng, sc_bpawr_out_t *out);

#endif
