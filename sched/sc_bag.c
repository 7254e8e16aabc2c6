/*
 * BAG (Alg. 1) and BPAWR (Alg. 2) of "Progress and Bandwidth Aware Partial
 * Model Synchronization With Selective Reduce" (seeds/001, Section III-C/D).
 * The readings chosen where the extracted text is ambiguous are written
 * beside the code they govern.
 */
#include "sched/sc_bag.h"

#include <math.h>
#include <string.h>

void sc_cand_sort(sc_cand_t *a, int n, sc_cand_t *tmp)
{
    /* Bottom-up merge sort: stable, no recursion, no allocation. Runs of 16
     * are insertion-sorted first: the scheduler sorts a few hundred entries
     * per decision and this keeps 1024 well under the 100 us budget. */
    const int run = 16;
    for (int lo = 0; lo < n; lo += run) {
        int hi = lo + run < n ? lo + run : n;
        for (int i = lo + 1; i < hi; i++) {
            sc_cand_t x = a[i];
            int j = i;
            while (j > lo && sc_cand_before(&x, &a[j - 1])) {
                a[j] = a[j - 1];
                j--;
            }
            a[j] = x;
        }
    }
    sc_cand_t *src = a, *dst = tmp;
    for (int width = run; width < n; width *= 2) {
        for (int lo = 0; lo < n; lo += 2 * width) {
            int mid = lo + width < n ? lo + width : n;
            int hi = lo + 2 * width < n ? lo + 2 * width : n;
            int i = lo, j = mid, k = lo;
            while (i < mid && j < hi)
                dst[k++] = sc_cand_before(&src[j], &src[i]) ? src[j++] : src[i++];
            while (i < mid) dst[k++] = src[i++];
            while (j < hi) dst[k++] = src[j++];
        }
        sc_cand_t *t = src;
        src = dst;
        dst = t;
    }
    if (src != a) memcpy(a, src, (size_t)n * sizeof(*a));
}

int sc_bag(const sc_cand_t *a, int n, int p, double eta, bool le, int max_groups, int *bounds)
{
    bounds[0] = 0;
    if (n <= 0) return 0;
    int ng = 0, len = 0;
    double bstar = 0;
    for (int i = 0; i < n; i++) {
        /*
         * Line 6 prints "len(g) <= p". Read literally, every group takes p+1
         * workers before the threshold applies, contradicting the prose
         * ("BAG tries to select p workers to generate a group g and records
         * the relaxed threshold b*", III-C) and its limit case (with eta = 0
         * BAG should cut the sorted list into groups of p). The motivating
         * example decides it: with p = 2 and bandwidths 5,1,5,1 (Fig. 3),
         * "<" gives {w1,w3},{w2,w4} = Fig. 3(e), avg CT 6; "<=" gives one
         * group of 4 and BPAWR then launches {w1,w2} at 2 s (avg CT 10).
         * Default "<"; "<=" behind the option bag=literal.
         */
        bool core = le ? len <= p : len < p;
        if (core) {
            len++;
            bstar = a[i].bw * (1.0 - eta); /* line 8: threshold from the p-th member */
        } else if (a[i].bw >= bstar) {
            len++; /* lines 9-10: within (1 - eta) of the core's slowest */
        } else {
            /* Lines 11-14: close g, open the next group with w_i. The new
             * group starts like any group (its first member sets b*); the
             * printed lines leave b* stale, which only matters for p = 1. */
            bounds[++ng] = i;
            if (max_groups > 0 && ng == max_groups) return ng;
            len = 1;
            bstar = a[i].bw * (1.0 - eta);
        }
    }
    bounds[++ng] = n; /* lines 17-19: the last group, possibly below p */
    return ng;
}

void sc_bpawr_run(sc_bpawr_t *b, const sc_cand_t *g, int ng, sc_bpawr_out_t *o)
{
    memset(o, 0, sizeof(*o));
    o->threshold = b->theta * b->dt_s;
    if (ng > 0) o->bmin_g = g[ng - 1].bw;
    if (ng < b->p || ng == 0) {
        /* Lines 2-3: wait for more ready workers; S is returned unchanged. */
        o->verdict = SC_BPAWR_SMALL;
        return;
    }
    double bhat = g[ng - 1].bw; /* line 5 (g is sorted: its last is the slowest) */

    /*
     * PREDICTWORKERS (lines 6, 22-31): in-training workers strictly faster
     * than b-hat (line 25 "b_i > b"; the prose says "not less than", but a
     * worker as slow as b-hat cannot shorten the sync, which is what the
     * replacement is for). Line 7 then removes all of C from S so that later
     * groups do not count on the same workers: with S sorted and groups
     * visited from the fastest, C is the next run of S after pos.
     */
    double sp = 0, spb = 0;
    int j = b->pos;
    for (; j < b->nS && b->S[j].bw > bhat; j++) {
        double pi = b->prob(b->prob_ctx, b->S[j].id);
        sp += pi;
        spb += pi * b->S[j].bw;
        o->n_cand++;
    }
    if (j > b->pos) b->pos = j;
    /* Line 8: floor of the expected number of arrivals. The epsilon keeps a
     * sum like 0.1 * 10 from flooring to 0 by rounding. */
    int k = (int)floor(sp + 1e-9);
    if (k > o->n_cand) k = o->n_cand;
    double bv = sp > 0 ? spb / sp : 0; /* line 9, CALCEXPECTEDBW */
    o->sum_prob = sp;
    o->k_virtual = k;
    o->b_virtual = bv;

    /* Lines 10-11: L = g plus k virtual workers of bandwidth bv, in BAG
     * order (a virtual worker goes after real ones of equal bandwidth). */
    sc_cand_t *L = b->scratch;
    int at = 0;
    while (at < ng && g[at].bw >= bv) at++;
    memcpy(L, g, (size_t)at * sizeof(*L));
    for (int v = 0; v < k; v++) L[at + v] = (sc_cand_t){.bw = bv, .id = -1 - v};
    memcpy(L + at + k, g + at, (size_t)(ng - at) * sizeof(*L));
    int nl = ng + k;

    /* Lines 12-13: g* is the first group BAG forms from L. */
    sc_bag(L, nl, b->p, b->eta, b->bag_le, 1, b->bounds);
    int gs = b->bounds[1];
    int real = 0;
    for (int i = 0; i < gs; i++) real += L[i].id >= 0;
    o->gstar_size = gs;
    o->bmin_gstar = L[gs - 1].bw;

    /*
     * Line 15: the saving of syncing g* instead of g. The printed right-hand
     * side is the approximation 2v/b - 2v/b*; we evaluate T with the
     * configured form of Eq. 2 (alpha terms included), as the left-hand side
     * says.
     */
    o->t_x = sc_cost_ring(&b->cost, ng, bhat) - sc_cost_ring(&b->cost, gs, o->bmin_gstar);
    if (o->t_x > o->threshold) {
        o->verdict = SC_BPAWR_WAIT; /* lines 16-17 */
        o->n_delta = ng - real;     /* line 14: the members of g that g* leaves out */
    } else {
        o->verdict = SC_BPAWR_LAUNCH; /* line 19 */
    }
}
