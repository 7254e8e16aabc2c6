/*
 * test_sched.c - the scheduler core (sched/sched.h, sc_bag.h, sc_est.h) on
 * small hand-computed cases: estimators, BAG, BPAWR, the ski-rental rule,
 * each policy, the paper's motivating example (seeds/001 Section II-D), the
 * readings of the ambiguous lines, worker loss and input validation.
 */
#include <math.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "cohort.h"
#include "sched/sc_bag.h"
#include "sched/sc_est.h"
#include "sched/sched.h"

#define EPS 1e-9

/* ---- helpers ---- */

static sc_sched_t *mk(const sc_params_t *p, int n)
{
    sc_sched_t *s = NULL;
    assert_int_equal(sc_sched_create(p, n, &s), 0);
    assert_non_null(s);
    return s;
}

static void set_bw(sc_sched_t *s, const double *bw, int n)
{
    for (int i = 0; i < n; i++) assert_int_equal(sc_sched_on_bandwidth(s, i, bw[i]), 0);
}

static void ready(sc_sched_t *s, int w, double t)
{
    assert_int_equal(sc_sched_on_ready(s, w, t, -1), 0);
}

static sc_tick_t tick(sc_sched_t *s, double t)
{
    sc_tick_t tk;
    assert_int_equal(sc_sched_tick(s, t, &tk), 0);
    return tk;
}

/* The k-th decision of kind `kind` in a tick, or NULL. */
static const sc_decision_t *nth(const sc_tick_t *tk, sc_dec_kind kind, int k)
{
    for (int i = 0; i < tk->ndec; i++)
        if (tk->dec[i].kind == kind && k-- == 0) return &tk->dec[i];
    return NULL;
}

static void assert_members(const sc_decision_t *d, const int *want, int n)
{
    assert_non_null(d);
    assert_int_equal(d->nmembers, n);
    for (int i = 0; i < n; i++) assert_int_equal(d->members[i], want[i]);
}

/* Paper units for the motivating example: v = 5 (Gbit), alpha = 0, 2v/b. */
static void example_params(sc_params_t *p, sc_policy policy)
{
    sc_params_default(p);
    p->policy = policy;
    p->p = 2;
    p->model_mb = 625; /* 625 MB * 8 / 1000 = 5 Gbit */
    p->alpha_s = 0;
    p->cost_form = SC_COST_APPROX;
    p->dt_s = 1.0;
}

/* ---- estimators ---- */

static void test_cost_ring(void **state)
{
    (void)state;
    sc_cost_t c = {.alpha_s = 0.001, .model_gbit = 4.0, .form = SC_COST_EXACT};
    /* 2(m-1)a + 2(m-1)/m v/b: m = 4, b = 2 -> 0.006 + 1.5 * 2 = 3.006 */
    assert_float_equal(sc_cost_ring(&c, 4, 2.0), 3.006, EPS);
    assert_float_equal(sc_cost_ring(&c, 2, 8.0), 0.002 + 0.5, EPS);
    assert_float_equal(sc_cost_ring(&c, 1, 8.0), 0, EPS);
    assert_float_equal(sc_cost_ring(&c, 0, 8.0), 0, EPS);
    c.form = SC_COST_APPROX; /* 2ma + 2v/b */
    assert_float_equal(sc_cost_ring(&c, 4, 2.0), 0.008 + 4.0, EPS);
    /* phase 2, the cheaper of: broadcasts (n-1)a + sum(f) v/b, or a ring
     * allreduce of the largest missed prefix. n = 5, v = 4, b = 4: */
    c.form = SC_COST_EXACT;
    /* two late workers that missed everything: 2.004 vs 0.008 + 1.6 */
    assert_float_equal(sc_cost_phase2(&c, 5, 2.0, 1.0, 4.0), 0.008 + 1.6, EPS);
    /* one that missed half: 0.004 + 0.5 vs 0.008 + 0.8 */
    assert_float_equal(sc_cost_phase2(&c, 5, 0.5, 0.5, 4.0), 0.004 + 0.5, EPS);
    assert_float_equal(sc_cost_phase2(&c, 5, 0, 0, 4.0), 0, EPS);
    assert_float_equal(sc_cost_phase2(&c, 1, 1, 1, 4.0), 0, EPS);
}

/* The probe's alpha-beta fit. The second case is what CI once saw on a
 * loaded host (mp.relay.probe.n3.rails2): a median exchange of 1.59 ms beside
 * a 1 MiB transfer of 1.4 ms, which the old fit (transfer - median) turned
 * into a rate of 0 Gbps. */
static void test_fit_alpha_beta(void **state)
{
    (void)state;
    double a, g;
    double lat[5] = {60e-6, 50e-6, 40e-6, 500e-6, 55e-6};
    assert_int_equal(sc_fit_alpha_beta(lat, 5, 1.04e-3, 1u << 20, &a, &g), 0);
    assert_float_equal(a, 55e-6, 1e-12);
    assert_float_equal(g, (1u << 20) * 8 / 1e-3 / 1e9, 1e-9);
    double noisy[5] = {1593e-6, 1700e-6, 1500e-6, 1600e-6, 1650e-6};
    assert_int_equal(sc_fit_alpha_beta(noisy, 5, 1.4e-3, 1u << 20, &a, &g), 0);
    assert_float_equal(a, 1600e-6, 1e-12);
    double plain = (1u << 20) * 8 / 1.4e-3 / 1e9;
    assert_true(g >= plain && g <= 2 * plain + 1e-9);
    double one[1] = {1e-3};
    assert_int_equal(sc_fit_alpha_beta(one, 1, 1.0005e-3, 4096, &a, &g), 0);
    assert_float_equal(g, 4096 * 8 / 0.50025e-3 / 1e9, 1e-9);
    assert_int_equal(sc_fit_alpha_beta(one, 0, 1e-3, 4096, &a, &g), COH_EINVAL);
    assert_int_equal(sc_fit_alpha_beta(one, 1, 0, 4096, &a, &g), COH_EINVAL);
    assert_int_equal(sc_fit_alpha_beta(one, 1, 1e-3, 0, &a, &g), COH_EINVAL);
}

/* A rank's rate estimate. Without a probe: the best of the last 8 frames
 * (a slow partner does not pull it down; old frames age out). With one: the
 * probe's rate, whatever the frames' bursts show (what scrambled the ranks'
 * order at 32 ranks), until 8 frames since agree that the link changed. */
static void test_rate(void **state)
{
    (void)state;
    sc_rate_t r = {0};
    assert_float_equal(sc_rate_get(&r), 0, 0);
    sc_rate_frame(&r, 0.2);
    sc_rate_frame(&r, 0.05); /* a slow partner */
    sc_rate_frame(&r, NAN);
    sc_rate_frame(&r, -1);
    assert_float_equal(sc_rate_get(&r), 0.2, 1e-12);
    for (int i = 0; i < 8; i++) sc_rate_frame(&r, 0.1);
    assert_float_equal(sc_rate_get(&r), 0.1, 1e-12); /* 0.2 aged out */
    /* A probe stands against bursty frames, 0.35-2.2x its rate. */
    sc_rate_probe(&r, 0.3);
    assert_float_equal(sc_rate_get(&r), 0.3, 1e-12);
    const double bursty[] = {0.105, 0.5, 0.3, 0.2, 0.45, 0.6, 0.12, 0.11, 0.3, 0.66};
    for (int i = 0; i < 10; i++) sc_rate_frame(&r, bursty[i]);
    assert_float_equal(sc_rate_get(&r), 0.3, 1e-12);
    /* Seven slow frames are not enough; eight since the last fast one are:
     * the link slowed down, and the frames' best takes over. */
    for (int i = 0; i < 7; i++) sc_rate_frame(&r, 0.1);
    assert_float_equal(sc_rate_get(&r), 0.3, 1e-12);
    sc_rate_frame(&r, 0.12);
    assert_float_equal(sc_rate_get(&r), 0.12, 1e-12);
    /* A new probe: the count starts again; frames all above 1.5x it (the
     * link got faster) replace it after 8. */
    sc_rate_probe(&r, 0.1);
    assert_float_equal(sc_rate_get(&r), 0.1, 1e-12);
    for (int i = 0; i < 7; i++) sc_rate_frame(&r, 0.2);
    assert_float_equal(sc_rate_get(&r), 0.1, 1e-12);
    sc_rate_frame(&r, 0.25);
    assert_float_equal(sc_rate_get(&r), 0.25, 1e-12);
    sc_rate_probe(&r, INFINITY); /* ignored */
    sc_rate_probe(&r, 0);
    assert_float_equal(sc_rate_get(&r), 0.25, 1e-12);
}

static void test_cdf(void **state)
{
    (void)state;
    sc_cdf_t c;
    sc_cdf_init(&c, 4);
    assert_float_equal(sc_cdf_eval(&c, 1.0), 0, EPS); /* empty */
    assert_float_equal(sc_cdf_prob_ready(&c, 0.5, 0.1, SC_EQ4_PRINTED, 2), 0, EPS);
    double xs[] = {0.3, 0.1, 0.4, 0.2};
    for (int i = 0; i < 4; i++) assert_int_equal(sc_cdf_add(&c, xs[i]), 0);
    assert_float_equal(sc_cdf_eval(&c, 0.05), 0.0, EPS);
    assert_float_equal(sc_cdf_eval(&c, 0.1), 0.25, EPS); /* #{<= x} / n */
    assert_float_equal(sc_cdf_eval(&c, 0.25), 0.5, EPS);
    assert_float_equal(sc_cdf_eval(&c, 0.4), 1.0, EPS);
    /* Window of 4: adding 0.5 evicts the oldest (0.3). */
    assert_int_equal(sc_cdf_add(&c, 0.5), 0);
    assert_int_equal(c.count, 4);
    assert_float_equal(sc_cdf_eval(&c, 0.35), 0.5, EPS); /* {0.1, 0.2} of {0.1,0.2,0.4,0.5} */
    assert_float_equal(sc_cdf_max(&c), 0.5, EPS);
    assert_int_equal(sc_cdf_add(&c, -1), COH_EINVAL);
    assert_int_equal(sc_cdf_add(&c, NAN), COH_EINVAL);

    /* Eq. 4, both readings, on {0.1, 0.2, 0.4, 0.5}: elapsed 0.15, dt 0.1.
     * printed: F(0.25) = 0.5; conditional: (F(0.25) - F(0.15)) / (1 - F(0.15))
     * = (0.5 - 0.25) / 0.75 = 1/3. */
    assert_float_equal(sc_cdf_prob_ready(&c, 0.15, 0.1, SC_EQ4_PRINTED, 2), 0.5, EPS);
    assert_float_equal(sc_cdf_prob_ready(&c, 0.15, 0.1, SC_EQ4_CONDITIONAL, 2), 1.0 / 3, EPS);
    /* Past every sample: printed says 1, conditional has no information (0). */
    assert_float_equal(sc_cdf_prob_ready(&c, 0.6, 0.1, SC_EQ4_PRINTED, 2), 1.0, EPS);
    assert_float_equal(sc_cdf_prob_ready(&c, 0.6, 0.1, SC_EQ4_CONDITIONAL, 2), 0.0, EPS);
    /* Overdue: beyond 2 * max (1.0) nobody waits for it, under either reading. */
    assert_float_equal(sc_cdf_prob_ready(&c, 1.01, 0.1, SC_EQ4_PRINTED, 2), 0.0, EPS);
    assert_float_equal(sc_cdf_prob_ready(&c, 1.01, 0.1, SC_EQ4_PRINTED, 0), 1.0, EPS);

    /* Warm start: load replaces and freezes. */
    double warm[] = {2.0, 1.0};
    assert_int_equal(sc_cdf_load(&c, warm, 2), 0);
    assert_true(c.frozen);
    assert_float_equal(sc_cdf_eval(&c, 1.5), 0.5, EPS);
    assert_int_equal(sc_cdf_add(&c, 0.1), 0); /* ignored */
    assert_int_equal(c.count, 2);
    assert_float_equal(sc_cdf_eval(&c, 0.5), 0.0, EPS);
    double bad[] = {1.0, -2.0};
    assert_int_equal(sc_cdf_load(&c, bad, 2), COH_EINVAL);
    sc_cdf_free(&c);
}

static void test_cdf_window_long(void **state)
{
    (void)state;
    /* Many insertions through a small window stay sorted and exact. */
    sc_cdf_t c;
    sc_cdf_init(&c, 16);
    for (int i = 0; i < 1000; i++) assert_int_equal(sc_cdf_add(&c, (double)((i * 37) % 101)), 0);
    assert_int_equal(c.count, 16);
    for (int i = 1; i < c.count; i++) assert_true(c.sorted[i - 1] <= c.sorted[i]);
    /* The window holds exactly the last 16 values. */
    int hits = 0;
    for (int i = 984; i < 1000; i++) {
        double v = (double)((i * 37) % 101);
        for (int j = 0; j < c.count; j++)
            if (c.sorted[j] == v) {
                hits++;
                break;
            }
    }
    assert_int_equal(hits, 16);
    sc_cdf_free(&c);
}

static void test_weights(void **state)
{
    (void)state;
    uint64_t it[] = {3, 1, 0, 4};
    double w[4];
    sc_weights_from_iters(it, 4, w);
    /* 0 counts as 1: 3,1,1,4 over 9 */
    assert_float_equal(w[0], 3.0 / 9, EPS);
    assert_float_equal(w[1], 1.0 / 9, EPS);
    assert_float_equal(w[2], 1.0 / 9, EPS);
    assert_float_equal(w[3], 4.0 / 9, EPS);
}

/* ---- BAG ---- */

static void cands(sc_cand_t *c, const double *bw, int n)
{
    for (int i = 0; i < n; i++) c[i] = (sc_cand_t){.bw = bw[i], .id = i};
}

static void test_cand_sort(void **state)
{
    (void)state;
    sc_cand_t a[40], tmp[40];
    /* Ties: real before virtual, then by id. */
    a[0] = (sc_cand_t){.bw = 5, .id = -1};
    a[1] = (sc_cand_t){.bw = 5, .id = 7};
    a[2] = (sc_cand_t){.bw = 9, .id = 3};
    a[3] = (sc_cand_t){.bw = 5, .id = 2};
    a[4] = (sc_cand_t){.bw = 1, .id = 0};
    sc_cand_sort(a, 5, tmp);
    int want[] = {3, 2, 7, -1, 0};
    for (int i = 0; i < 5; i++) assert_int_equal(a[i].id, want[i]);
    /* Longer than one insertion run: non-increasing and stable. */
    for (int i = 0; i < 40; i++) a[i] = (sc_cand_t){.bw = (double)((i * 7) % 5), .id = i};
    sc_cand_sort(a, 40, tmp);
    for (int i = 1; i < 40; i++) {
        assert_true(a[i - 1].bw >= a[i].bw);
        if (a[i - 1].bw == a[i].bw) assert_true(a[i - 1].id < a[i].id);
    }
}

static void test_order_matches_reference(void **state)
{
    (void)state;
    /* The scheduler keeps its bandwidth order with a radix sort on the IEEE
     * bits; a group of everyone (p = n, all ready, nobody to wait for) comes
     * out in that order. It must be the order of sc_cand_before, ties by id. */
    enum { N = 300 };
    sc_params_t p;
    sc_params_default(&p);
    p.p = N;
    sc_sched_t *s = mk(&p, N);
    sc_cand_t ref[N], tmp[N];
    uint64_t x = 12345;
    for (int i = 0; i < N; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        /* few distinct values: many ties; spans several binades */
        double bw = 0.5 + (double)((x >> 33) % 37) * 0.731;
        ref[i] = (sc_cand_t){.bw = bw, .id = i};
        assert_int_equal(sc_sched_on_bandwidth(s, i, bw), 0);
        ready(s, i, 1);
    }
    sc_cand_sort(ref, N, tmp);
    sc_tick_t tk = tick(s, 1);
    const sc_decision_t *d = nth(&tk, SC_DEC_LAUNCH, 0);
    assert_non_null(d);
    assert_int_equal(d->nmembers, N);
    for (int i = 0; i < N; i++) assert_int_equal(d->members[i], ref[i].id);
    sc_sched_destroy(s);
}

static void test_bag(void **state)
{
    (void)state;
    sc_cand_t c[8];
    int b[9];
    /* p = 2, eta = 0.3, sorted 10 9 8 5 4 3.9 1:
     * 10, 9 core (b* = 9 * 0.7 = 6.3), 8 >= 6.3 joins, 5 < 6.3 opens g2;
     * 5, 4 core (b* = 2.8), 3.9 joins, 1 < 2.8 opens g3 (below p). */
    double bw[] = {10, 9, 8, 5, 4, 3.9, 1};
    cands(c, bw, 7);
    assert_int_equal(sc_bag(c, 7, 2, 0.3, false, 0, b), 3);
    assert_int_equal(b[0], 0);
    assert_int_equal(b[1], 3);
    assert_int_equal(b[2], 6);
    assert_int_equal(b[3], 7);
    /* max_groups = 1: only g* */
    assert_int_equal(sc_bag(c, 7, 2, 0.3, false, 1, b), 1);
    assert_int_equal(b[1], 3);
    /* eta = 0: "slice the sorted workers into groups of p" (III-C). */
    double bw0[] = {10, 9, 8, 7, 6};
    cands(c, bw0, 5);
    assert_int_equal(sc_bag(c, 5, 2, 0.0, false, 0, b), 3);
    assert_int_equal(b[1], 2);
    assert_int_equal(b[2], 4);
    /* Literal line 6 ("len(g) <= p") takes p+1 before any threshold. */
    assert_int_equal(sc_bag(c, 5, 2, 0.0, true, 0, b), 2);
    assert_int_equal(b[1], 3);
    /* Fig. 3: 5 5 1 1 with p = 2 -> {5,5},{1,1}; literal -> one group of 4. */
    double fig3[] = {5, 5, 1, 1};
    cands(c, fig3, 4);
    assert_int_equal(sc_bag(c, 4, 2, 0.3, false, 0, b), 2);
    assert_int_equal(b[1], 2);
    assert_int_equal(sc_bag(c, 4, 2, 0.3, true, 0, b), 1);
    assert_int_equal(b[1], 4);
    /* Empty and single. */
    assert_int_equal(sc_bag(c, 0, 2, 0.3, false, 0, b), 0);
    assert_int_equal(sc_bag(c, 1, 2, 0.3, false, 0, b), 1);
    assert_int_equal(b[1], 1);
}

/* ---- BPAWR ---- */

static double probs[16];
static double prob_of(void *ctx, int id)
{
    (void)ctx;
    return probs[id];
}

static void bpawr_init(sc_bpawr_t *b, const sc_cand_t *S, int nS, sc_cand_t *scratch, int *gb)
{
    memset(b, 0, sizeof(*b));
    b->S = S;
    b->nS = nS;
    b->prob = prob_of;
    b->p = 2;
    b->eta = 0.3;
    b->theta = 1;
    b->dt_s = 0.1;
    b->cost = (sc_cost_t){.alpha_s = 0, .model_gbit = 5, .form = SC_COST_APPROX};
    b->scratch = scratch;
    b->bounds = gb;
}

static void test_bpawr(void **state)
{
    (void)state;
    /* In training, sorted: C (id 2, 8 Gbps, p .7), D (3, 6, .6), E (4, 1, .9). */
    sc_cand_t S[] = {{8, 2}, {6, 3}, {1, 4}};
    probs[2] = 0.7;
    probs[3] = 0.6;
    probs[4] = 0.9;
    sc_cand_t scratch[16];
    int gb[2];
    sc_bpawr_t b;
    bpawr_init(&b, S, 3, scratch, gb);

    /* Too small: line 3, S untouched. */
    sc_cand_t g1[] = {{10, 0}};
    sc_bpawr_out_t o;
    sc_bpawr_run(&b, g1, 1, &o);
    assert_int_equal(o.verdict, SC_BPAWR_SMALL);
    assert_int_equal(b.pos, 0);

    /* g = {A 10, B 2}: b-hat 2; C = {C, D} (E is slower); sum p = 1.3 -> k = 1,
     * b = (.7*8 + .6*6) / 1.3 = 9.2/1.3. L = A, v, B; BAG: A, v core
     * (b* = 0.7 * 9.2/1.3 = 4.95), B = 2 out: g* = {A, v}, g_Delta = {B}.
     * t_X = 2*5/2 - 2*5/(9.2/1.3) = 5 - 13/9.2 = 3.5869... > theta*dt = 0.1. */
    sc_cand_t g[] = {{10, 0}, {2, 1}};
    sc_bpawr_run(&b, g, 2, &o);
    assert_int_equal(o.verdict, SC_BPAWR_WAIT);
    assert_int_equal(o.n_cand, 2);
    assert_float_equal(o.sum_prob, 1.3, EPS);
    assert_int_equal(o.k_virtual, 1);
    assert_float_equal(o.b_virtual, 9.2 / 1.3, EPS);
    assert_int_equal(o.gstar_size, 2);
    assert_float_equal(o.bmin_gstar, 9.2 / 1.3, EPS);
    assert_int_equal(o.n_delta, 1);
    assert_float_equal(o.t_x, 5.0 - 13.0 / 9.2, EPS);
    assert_int_equal(b.pos, 2); /* line 7: C and D are claimed */

    /* A later group faster than E cannot count on C or D any more. */
    sc_cand_t g3[] = {{3, 5}, {2.5, 6}};
    sc_bpawr_run(&b, g3, 2, &o);
    assert_int_equal(o.n_cand, 0);
    assert_int_equal(o.verdict, SC_BPAWR_LAUNCH);
    assert_float_equal(o.t_x, 0, EPS);

    /* Same first case with theta*dt = 4 > 3.587: launch, g_Delta empty. */
    bpawr_init(&b, S, 3, scratch, gb);
    b.theta = 40;
    sc_bpawr_run(&b, g, 2, &o);
    assert_int_equal(o.verdict, SC_BPAWR_LAUNCH);
    assert_int_equal(o.n_delta, 0);
    assert_float_equal(o.threshold, 4.0, EPS);

    /* Ten candidates of 0.1 sum to 1 (not 0.99999...): one virtual worker. */
    sc_cand_t S10[10];
    for (int i = 0; i < 10; i++) {
        S10[i] = (sc_cand_t){.bw = 20 - i * 0.1, .id = 6 + i};
        if (6 + i < 16) probs[6 + i] = 0.1;
    }
    bpawr_init(&b, S10, 10, scratch, gb);
    b.prob = prob_of;
    sc_bpawr_run(&b, g, 2, &o);
    assert_int_equal(o.n_cand, 10);
    assert_int_equal(o.k_virtual, 1);
}

/* ---- the motivating example, through the scheduler ---- */

static void load_example(sc_sched_t *s)
{
    /* Fig. 3: ready at 1, 2, 3, 3, 13 s; per-worker CDFs are point masses
     * (the controller "is aware that w3 and w4 would be ready at 3 s"). */
    double c[] = {1, 2, 3, 3, 13};
    double bw[] = {5, 1, 5, 1, 5};
    for (int i = 0; i < 5; i++) assert_int_equal(sc_sched_load_cdf(s, i, &c[i], 1), 0);
    set_bw(s, bw, 5);
}

static void test_example_selective(void **state)
{
    (void)state;
    sc_params_t p;
    example_params(&p, SC_POLICY_SELECTIVE);
    sc_sched_t *s = mk(&p, 5);
    load_example(s);

    ready(s, 0, 1);
    sc_tick_t tk = tick(s, 1);
    assert_int_equal(tk.nlaunch, 0);
    assert_int_equal(nth(&tk, SC_DEC_WAIT, 0)->why, SC_WHY_BELOW_P);
    assert_true(isinf(tk.next_tick));

    /* t = 2: {w1, w2} would sync in 2v/1 = 10 s; w3 (5 Gbps) is due within
     * dt = 1 s (F_3(2 + 1) = 1), w5 is not (F_5(3) = 0): k = 1, b = 5, g* =
     * {w1, v}, t_X = 10 - 2 = 8 > 1: wait and replace w2. */
    ready(s, 1, 2);
    tk = tick(s, 2);
    assert_int_equal(tk.nlaunch, 0);
    const sc_decision_t *w = nth(&tk, SC_DEC_WAIT, 0);
    assert_non_null(w);
    assert_int_equal(w->why, SC_WHY_BPAWR_WAIT);
    int both[] = {0, 1};
    assert_members(w, both, 2);
    assert_int_equal(w->ex.n_cand, 2); /* w3 and w5 are faster than 1 */
    assert_float_equal(w->ex.sum_prob, 1.0, EPS);
    assert_int_equal(w->ex.k_virtual, 1);
    assert_float_equal(w->ex.b_virtual, 5.0, EPS);
    assert_float_equal(w->ex.bmin_g, 1.0, EPS);
    assert_float_equal(w->ex.bmin_gstar, 5.0, EPS);
    assert_int_equal(w->ex.n_delta, 1);
    assert_float_equal(w->ex.t_x, 8.0, EPS);
    assert_float_equal(w->ex.threshold, 1.0, EPS);
    assert_float_equal(tk.next_tick, 3.0, EPS); /* Alg. 3 line 24: again after dt */
    char line[512];
    assert_true(sc_decision_explain(w, line, sizeof(line)) > 0);
    assert_non_null(strstr(line, "BPAWR_WAIT"));
    assert_non_null(strstr(line, "t_X=8.000000"));

    /* Nothing new before 3: the verdict stands. */
    tk = tick(s, 2.5);
    assert_false(tk.evaluated);

    /* t = 3: BAG splits {w1,w3} (5, 5) and {w2,w4} (1, 1); nobody faster is
     * due: launch both. avg CT (2 + 10) / 2 = 6 = Fig. 3(e). */
    ready(s, 2, 3);
    ready(s, 3, 3);
    tk = tick(s, 3);
    assert_int_equal(tk.nlaunch, 2);
    const sc_decision_t *a = nth(&tk, SC_DEC_LAUNCH, 0), *b = nth(&tk, SC_DEC_LAUNCH, 1);
    int g1[] = {0, 2}, g2[] = {1, 3};
    assert_members(a, g1, 2);
    assert_members(b, g2, 2);
    assert_float_equal(a->expected_s, 2.0, EPS);
    assert_float_equal(b->expected_s, 10.0, EPS);
    assert_int_equal(a->why, SC_WHY_BPAWR_LAUNCH);
    assert_false(a->full);
    assert_float_equal(a->weights[0] + a->weights[1], 1.0, EPS);
    assert_true(a->group_id != b->group_id);
    for (int i = 0; i < 4; i++) assert_int_equal(sc_sched_worker_state(s, i), SC_W_SYNCING);
    assert_int_equal(sc_sched_worker_state(s, 4), SC_W_COMPUTING);

    /* Done: back to computing; an unknown or repeated id is rejected. */
    assert_int_equal(sc_sched_on_group_done(s, a->group_id, 5, 2.0), 0);
    assert_int_equal(sc_sched_worker_state(s, 0), SC_W_COMPUTING);
    assert_int_equal(sc_sched_on_group_done(s, a->group_id, 5, 2.0), COH_EINVAL);
    sc_sched_destroy(s);
}

static void test_example_bag_literal(void **state)
{
    (void)state;
    /* With the literal "<=" BAG, g* keeps w2 and BPAWR launches {w1,w2} at 2 s:
     * the partial-reduce outcome of Fig. 3(c), not the paper's 3(e). */
    sc_params_t p;
    example_params(&p, SC_POLICY_SELECTIVE);
    p.bag_le = true;
    sc_sched_t *s = mk(&p, 5);
    load_example(s);
    ready(s, 0, 1);
    tick(s, 1);
    ready(s, 1, 2);
    sc_tick_t tk = tick(s, 2);
    assert_int_equal(tk.nlaunch, 1);
    int g[] = {0, 1};
    assert_members(nth(&tk, SC_DEC_LAUNCH, 0), g, 2);
    assert_float_equal(nth(&tk, SC_DEC_LAUNCH, 0)->expected_s, 10.0, EPS);
    sc_sched_destroy(s);
}

static void test_example_partial_allreduce(void **state)
{
    (void)state;
    sc_params_t p;
    example_params(&p, SC_POLICY_PARTIAL);
    sc_sched_t *s = mk(&p, 5);
    load_example(s);
    ready(s, 0, 1);
    assert_int_equal(tick(s, 1).nlaunch, 0);
    ready(s, 1, 2);
    sc_tick_t tk = tick(s, 2);
    int g1[] = {0, 1};
    assert_members(nth(&tk, SC_DEC_LAUNCH, 0), g1, 2);
    assert_int_equal(nth(&tk, SC_DEC_LAUNCH, 0)->why, SC_WHY_FIFO);
    /* Arrival order, not id order, is the FIFO (and ring) order. */
    ready(s, 3, 3);
    ready(s, 2, 3);
    tk = tick(s, 3);
    int g2[] = {3, 2};
    assert_members(nth(&tk, SC_DEC_LAUNCH, 0), g2, 2);
    assert_float_equal(nth(&tk, SC_DEC_LAUNCH, 0)->expected_s, 10.0, EPS);
    sc_sched_destroy(s);

    example_params(&p, SC_POLICY_ALLREDUCE);
    s = mk(&p, 5);
    load_example(s);
    double at[] = {1, 2, 3, 3, 13};
    for (int i = 0; i < 5; i++) {
        ready(s, i, at[i]);
        tk = tick(s, at[i]);
        assert_int_equal(tk.nlaunch, i == 4 ? 1 : 0);
    }
    const sc_decision_t *d = nth(&tk, SC_DEC_LAUNCH, 0);
    int all[] = {0, 1, 2, 3, 4};
    assert_members(d, all, 5);
    assert_true(d->full);
    assert_float_equal(d->expected_s, 10.0, EPS); /* Fig. 3(b): 13 -> 23 */
    for (int i = 0; i < 5; i++) assert_float_equal(d->weights[i], 0.2, EPS);
    sc_sched_destroy(s);
}

/* ---- policies ---- */

static void test_weights_in_groups(void **state)
{
    (void)state;
    sc_params_t p;
    sc_params_default(&p);
    p.policy = SC_POLICY_PARTIAL;
    p.p = 2;
    sc_sched_t *s = mk(&p, 3);
    ready(s, 0, 1);
    ready(s, 1, 2);
    sc_tick_t tk = tick(s, 2);
    const sc_decision_t *d = nth(&tk, SC_DEC_LAUNCH, 0);
    assert_float_equal(d->weights[0], 0.5, EPS);
    uint64_t id = d->group_id;
    assert_int_equal(sc_sched_on_group_done(s, id, 3, 1), 0);
    ready(s, 0, 4); /* second iteration of w0 */
    ready(s, 2, 5); /* first of w2 */
    tk = tick(s, 5);
    d = nth(&tk, SC_DEC_LAUNCH, 0);
    int g[] = {0, 2};
    assert_members(d, g, 2);
    assert_float_equal(d->weights[0], 2.0 / 3, EPS);
    assert_float_equal(d->weights[1], 1.0 / 3, EPS);
    sc_sched_destroy(s);
}

static void test_allreduce_worker_lost(void **state)
{
    (void)state;
    sc_params_t p;
    sc_params_default(&p);
    p.policy = SC_POLICY_ALLREDUCE;
    sc_sched_t *s = mk(&p, 3);
    ready(s, 0, 1);
    ready(s, 1, 2);
    sc_tick_t tk = tick(s, 2);
    assert_int_equal(tk.nlaunch, 0);
    assert_int_equal(nth(&tk, SC_DEC_WAIT, 0)->why, SC_WHY_WAIT_ALL);
    /* w2 never comes back: once it is reported lost, the others go on. */
    assert_int_equal(sc_sched_on_worker_lost(s, 2), 0);
    tk = tick(s, 3);
    int g[] = {0, 1};
    assert_members(nth(&tk, SC_DEC_LAUNCH, 0), g, 2);
    assert_true(nth(&tk, SC_DEC_LAUNCH, 0)->full);
    assert_int_equal(sc_sched_worker_state(s, 2), SC_W_LOST);
    assert_int_equal(sc_sched_on_ready(s, 2, 4, 1), COH_ESTATE);
    sc_sched_stats_t st;
    assert_int_equal(sc_sched_stats(s, &st), 0);
    assert_int_equal(st.n_live, 2);
    sc_sched_destroy(s);
}

/* Pooled CDF where every iteration takes 100 s: nobody is predicted soon. */
static void never_soon(sc_sched_t *s)
{
    double c = 100;
    assert_int_equal(sc_sched_load_cdf(s, -1, &c, 1), 0);
}

static void test_selective_full_sync(void **state)
{
    (void)state;
    sc_params_t p;
    sc_params_default(&p);
    p.p = 2;
    p.c = 2;
    sc_sched_t *s = mk(&p, 4);
    never_soon(s);
    double bw[] = {10, 10, 1, 1};
    set_bw(s, bw, 4);
    /* Round 0 is a full sync (Alg. 3: k <- 0, k % c = 0): wait for all. */
    for (int i = 0; i < 3; i++) ready(s, i, 1 + i * 0.1);
    sc_tick_t tk = tick(s, 1.2);
    assert_int_equal(tk.nlaunch, 0);
    assert_int_equal(nth(&tk, SC_DEC_WAIT, 0)->why, SC_WHY_WAIT_FULL);
    ready(s, 3, 1.3);
    tk = tick(s, 1.3);
    const sc_decision_t *d = nth(&tk, SC_DEC_LAUNCH, 0);
    assert_int_equal(d->why, SC_WHY_FULL_SYNC);
    assert_true(d->full);
    assert_int_equal(d->nmembers, 4);
    assert_int_equal(sc_sched_on_group_done(s, d->group_id, 2, 0.7), 0);
    /* Round 1: all four ready together; BAG gives {0,1} and {2,3}. The first
     * launch makes k = 2, a full sync is due: {2,3} is held for it rather
     * than launched (which would carry k to 3 and skip the full sync). */
    for (int i = 0; i < 4; i++) ready(s, i, 3);
    tk = tick(s, 3);
    assert_int_equal(tk.nlaunch, 1);
    int g[] = {0, 1};
    assert_members(nth(&tk, SC_DEC_LAUNCH, 0), g, 2);
    const sc_decision_t *h = nth(&tk, SC_DEC_WAIT, 0);
    assert_int_equal(h->why, SC_WHY_HOLD_FULL);
    uint64_t id = nth(&tk, SC_DEC_LAUNCH, 0)->group_id;
    assert_int_equal(sc_sched_on_group_done(s, id, 4, 1), 0);
    ready(s, 0, 5);
    tk = tick(s, 5);
    assert_int_equal(tk.nlaunch, 0);
    ready(s, 1, 5.5);
    tk = tick(s, 5.5);
    assert_int_equal(nth(&tk, SC_DEC_LAUNCH, 0)->why, SC_WHY_FULL_SYNC);
    sc_sched_stats_t st;
    sc_sched_stats(s, &st);
    assert_int_equal(st.round, 3);
    sc_sched_destroy(s);
}

static void test_selective_full_counts_literal(void **state)
{
    (void)state;
    /* Alg. 3 as printed never advances k on a full sync: every round after the
     * first is a full sync again - selective becomes allreduce. */
    sc_params_t p;
    sc_params_default(&p);
    p.p = 2;
    p.c = 3;
    p.full_counts = false;
    sc_sched_t *s = mk(&p, 4);
    never_soon(s);
    double t = 1;
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < 4; i++) {
            ready(s, i, t);
            sc_tick_t tk = tick(s, t);
            assert_int_equal(tk.nlaunch, i == 3 ? 1 : 0);
            if (i == 3) {
                assert_int_equal(nth(&tk, SC_DEC_LAUNCH, 0)->why, SC_WHY_FULL_SYNC);
                assert_int_equal(
                    sc_sched_on_group_done(s, nth(&tk, SC_DEC_LAUNCH, 0)->group_id, t + 1, 1), 0);
            }
            t += 0.5;
        }
        t += 1;
    }
    sc_sched_destroy(s);
}

static void test_selective_flag_literal_stalls(void **state)
{
    (void)state;
    /* Alg. 3's "if F then launch" with Alg. 2's flag as printed: once every
     * worker is ready (S empty, t_X = 0, F = False) nothing ever launches. */
    sc_params_t p;
    sc_params_default(&p);
    p.p = 2;
    p.flag_launches = true;
    sc_sched_t *s = mk(&p, 2);
    ready(s, 0, 1);
    ready(s, 1, 1);
    for (int i = 0; i < 100; i++) {
        sc_tick_t tk = tick(s, 1 + i * 0.01);
        assert_int_equal(tk.nlaunch, 0);
    }
    sc_sched_destroy(s);
    /* The default reading launches at once. */
    p.flag_launches = false;
    s = mk(&p, 2);
    ready(s, 0, 1);
    ready(s, 1, 1);
    assert_int_equal(tick(s, 1).nlaunch, 1);
    sc_sched_destroy(s);
}

static void test_selective_overdue_and_lost(void **state)
{
    (void)state;
    /* w2 (10 Gbps) is computing and, per the CDF (every iteration takes 1 s),
     * due; {w1 10, w0 1} would rather wait for it than sync at 1 Gbps. */
    sc_params_t p;
    sc_params_default(&p); /* eq4 printed, overdue 2, dt 10 ms */
    p.p = 2;
    for (int lost = 0; lost < 2; lost++) {
        sc_sched_t *s = mk(&p, 3);
        double one = 1.0;
        assert_int_equal(sc_sched_load_cdf(s, -1, &one, 1), 0);
        double bw[] = {1, 10, 10};
        set_bw(s, bw, 3);
        ready(s, 0, 0.995);
        ready(s, 1, 0.995);
        sc_tick_t tk = tick(s, 0.995);
        assert_int_equal(tk.nlaunch, 0);
        const sc_decision_t *w = nth(&tk, SC_DEC_WAIT, 0);
        assert_int_equal(w->why, SC_WHY_BPAWR_WAIT);
        assert_int_equal(w->ex.k_virtual, 1);
        /* t_X = T({w1,w0}) - T({w1,v}) = 4/1 - 4/10 = 3.6 (alpha terms cancel) */
        assert_float_equal(w->ex.t_x, 3.6, 1e-9);
        if (lost) {
            /* Reported lost: not waited for any more. */
            assert_int_equal(sc_sched_on_worker_lost(s, 2), 0);
            tk = tick(s, 1.5);
            assert_int_equal(tk.nlaunch, 1);
        } else {
            /* Never reported: waited for while plausible (elapsed <= 2 s =
             * overdue * max sample), then given up on. */
            tk = tick(s, 1.99);
            assert_int_equal(tk.nlaunch, 0);
            assert_float_equal(sc_sched_prob_ready(s, 2, 1.99), 1.0, EPS);
            assert_float_equal(sc_sched_prob_ready(s, 2, 2.01), 0.0, EPS);
            tk = tick(s, 2.01);
            assert_int_equal(tk.nlaunch, 1);
        }
        int g[] = {1, 0};
        assert_members(nth(&tk, SC_DEC_LAUNCH, 0), g, 2);
        sc_sched_destroy(s);
    }
    /* The conditional reading gives a worker past its last sample no
     * probability at all: no wait even at 1.5 s. */
    p.eq4 = SC_EQ4_CONDITIONAL;
    sc_sched_t *s = mk(&p, 3);
    double one = 1.0;
    sc_sched_load_cdf(s, -1, &one, 1);
    double bw[] = {1, 10, 10};
    set_bw(s, bw, 3);
    assert_float_equal(sc_sched_prob_ready(s, 2, 0.995), 1.0, EPS);
    assert_float_equal(sc_sched_prob_ready(s, 2, 0.5), 0.0, EPS);
    ready(s, 0, 1.5);
    ready(s, 1, 1.5);
    assert_int_equal(tick(s, 1.5).nlaunch, 1);
    sc_sched_destroy(s);
}

static void test_selective_starvation_guard(void **state)
{
    (void)state;
    /* w2 (1 Gbps) is BAG's leftover below p next to two 10 Gbps workers. The
     * paper's algorithm leaves it there as long as that holds; with starve-s
     * it joins the group once it has waited longer than starve-s. */
    for (int guard = 0; guard < 2; guard++) {
        sc_params_t p;
        sc_params_default(&p);
        p.p = 2;
        p.starve_s = guard ? 10 : 0;
        sc_sched_t *s = mk(&p, 5);
        never_soon(s);
        double bw[] = {10, 10, 1, 10, 10};
        set_bw(s, bw, 5);
        for (int i = 0; i < 3; i++) ready(s, i, 1);
        sc_tick_t tk = tick(s, 1);
        int fast[] = {0, 1}, all3[] = {0, 1, 2};
        assert_members(nth(&tk, SC_DEC_LAUNCH, 0), fast, 2);
        assert_int_equal(nth(&tk, SC_DEC_WAIT, 0)->why, SC_WHY_BPAWR_SMALL);
        assert_int_equal(sc_sched_on_group_done(s, nth(&tk, SC_DEC_LAUNCH, 0)->group_id, 2, 1), 0);
        ready(s, 0, 20);
        ready(s, 1, 20);
        tk = tick(s, 20);
        if (guard) {
            const sc_decision_t *d = nth(&tk, SC_DEC_LAUNCH, 0);
            assert_members(d, all3, 3);
            assert_int_equal(d->why, SC_WHY_STARVE);
            assert_true(d->ex.t_x > d->ex.threshold); /* BPAWR would have waited */
        } else {
            assert_members(nth(&tk, SC_DEC_LAUNCH, 0), fast, 2);
            assert_int_equal(nth(&tk, SC_DEC_WAIT, 0)->why, SC_WHY_BPAWR_SMALL);
        }
        sc_sched_destroy(s);
    }
}

static void test_cold_start_cdf(void **state)
{
    (void)state;
    /* Cold start: the worker's own CDF takes over after cdf-min-samples. */
    sc_params_t p;
    sc_params_default(&p);
    p.policy = SC_POLICY_PARTIAL;
    p.p = 1;
    p.cdf_min_samples = 3;
    p.dt_s = 0.1;
    sc_sched_t *s = mk(&p, 2);
    double t = 0;
    /* w1 always takes 2 s; w0 always 0.5 s. Pool mixes both. */
    for (int it = 0; it < 3; it++) {
        assert_int_equal(sc_sched_on_compute_start(s, 0, t), 0);
        assert_int_equal(sc_sched_on_ready(s, 0, t + 0.5, 0.5), 0);
        sc_tick_t tk = tick(s, t + 0.5);
        assert_int_equal(
            sc_sched_on_group_done(s, nth(&tk, SC_DEC_LAUNCH, 0)->group_id, t + 0.6, 0.1), 0);
        if (it < 2) {
            /* own CDF not trusted yet: the pool {0.5 ...} answers for w0 */
            assert_float_equal(sc_sched_prob_ready(s, 0, 0.45), 1.0, EPS);
        }
        t += 1;
    }
    assert_int_equal(sc_sched_on_ready(s, 1, t, 2.0), 0);
    /* w0 has 3 samples of 0.5: F(0.45 + 0.1) = 1 */
    assert_float_equal(sc_sched_prob_ready(s, 0, 0.45), 1.0, EPS);
    /* w1 has one sample: pool {0.5 x3, 2.0}: F(1.0 + 0.1) = 0.75 */
    assert_float_equal(sc_sched_prob_ready(s, 1, 1.0), 0.75, EPS);
    sc_sched_destroy(s);
}

/* A member computes again from its own end (its DONE), not from the group's:
 * the compute time learnt from its next READY, and how long it has been
 * computing, count from there. Without a member's end, from the group's. */
static void test_member_done(void **state)
{
    (void)state;
    sc_params_t p;
    sc_params_default(&p);
    p.policy = SC_POLICY_PARTIAL;
    p.p = 2;
    p.cdf_min_samples = 1;
    p.cdf_per_worker = true;
    p.dt_s = 0.05;
    sc_sched_t *s = mk(&p, 2);
    ready(s, 0, 1);
    ready(s, 1, 1);
    sc_tick_t tk = tick(s, 1);
    uint64_t id = nth(&tk, SC_DEC_LAUNCH, 0)->group_id;
    assert_int_equal(sc_sched_on_member_done(s, 0, 1.5), 0); /* w0 ends first */
    assert_int_equal(sc_sched_on_member_done(s, 1, 2.0), 0);
    assert_int_equal(sc_sched_on_group_done(s, id, 2.0, 1.0), 0);
    assert_int_equal(sc_sched_on_member_done(s, 0, 2.1), COH_ESTATE); /* computing */
    assert_int_equal(sc_sched_on_member_done(s, 7, 2.1), COH_EINVAL);
    /* Both ready at 2.6: w0 computed 1.1 s (from 1.5), w1 0.6 s. Each
     * also has its first iteration, 1.0 s (from 0 to 1). */
    assert_int_equal(sc_sched_on_ready(s, 0, 2.6, -1), 0);
    assert_int_equal(sc_sched_on_ready(s, 1, 2.6, -1), 0);
    /* w0 {1.0, 1.1}: F(1.05) = 1/2 (counted from the group's end, 0.6 s,
     * it would be 1) */
    assert_float_equal(sc_sched_prob_ready(s, 0, 1.0), 0.5, EPS);
    assert_float_equal(sc_sched_prob_ready(s, 0, 1.06), 1.0, EPS);
    /* w1 {0.6, 1.0}: F(0.55) = 0, F(0.61) = 1/2 */
    assert_float_equal(sc_sched_prob_ready(s, 1, 0.5), 0.0, EPS);
    assert_float_equal(sc_sched_prob_ready(s, 1, 0.56), 0.5, EPS);
    /* The next group reports no member's end: both from its end (3.0). */
    tk = tick(s, 2.6);
    id = nth(&tk, SC_DEC_LAUNCH, 0)->group_id;
    assert_int_equal(sc_sched_on_group_done(s, id, 3.0, 0.4), 0);
    assert_int_equal(sc_sched_on_ready(s, 0, 3.2, -1), 0);
    /* w0 {0.2, 1.0, 1.1}: F(0.19) = 0, F(0.21) = 1/3 */
    assert_float_equal(sc_sched_prob_ready(s, 0, 0.14), 0.0, EPS);
    assert_float_equal(sc_sched_prob_ready(s, 0, 0.16), 1.0 / 3, EPS);
    sc_sched_destroy(s);
}

/* ---- relay (AdapCC) ---- */

static void relay_params(sc_params_t *p, int n)
{
    (void)n;
    sc_params_default(p);
    p->policy = SC_POLICY_RELAY;
    p->alpha_s = 0;
    p->model_mb = 625; /* 5 Gbit */
    p->tick_s = 0.005;
}

static void test_relay_decision(void **state)
{
    (void)state;
    sc_params_t p;
    relay_params(&p, 3);
    sc_sched_t *s = mk(&p, 3);
    double bw[] = {5, 5, 5};
    set_bw(s, bw, 3);
    ready(s, 0, 1);
    /* Proceeding now: phase 1 among {w0} costs 0; phase 2 moves two late
     * tensors: broadcasts 2 * 5/5 = 2 s or an allreduce of all three
     * 2 * 2/3 * 5/5 = 4/3 s. Waited 0 < 4/3: wait. */
    sc_tick_t tk = tick(s, 1);
    const sc_decision_t *w = nth(&tk, SC_DEC_WAIT, 0);
    assert_int_equal(w->why, SC_WHY_RELAY_WAIT);
    assert_float_equal(w->ex.buy_s, 4.0 / 3, EPS);
    assert_float_equal(w->ex.phase2_s, 4.0 / 3, EPS);
    assert_float_equal(tk.next_tick, 1.005, EPS);
    ready(s, 1, 2.6);
    /* {w0, w1}: phase 1 = 2(1)/2 * 5/5 = 1, phase 2 = one broadcast 5/5 = 1;
     * buy 2, waited 1.6 */
    tk = tick(s, 2.6);
    assert_int_equal(tk.nlaunch, 0);
    w = nth(&tk, SC_DEC_WAIT, 0);
    assert_float_equal(w->ex.phase1_s, 1.0, EPS);
    assert_float_equal(w->ex.phase2_s, 1.0, EPS);
    assert_float_equal(w->ex.waited_s, 1.6, EPS);
    /* At 3.0 the accumulated waiting cost reaches the buying cost: proceed,
     * w2 relays in phase 1 and contributes in phase 2. */
    tk = tick(s, 3.0);
    const sc_decision_t *d = nth(&tk, SC_DEC_LAUNCH, 0);
    assert_non_null(d);
    assert_int_equal(d->why, SC_WHY_RELAY_PROCEED);
    int g[] = {0, 1};
    assert_members(d, g, 2);
    assert_int_equal(d->nrelays, 1);
    assert_int_equal(d->relays[0], 2);
    assert_float_equal(d->expected_s, 2.0, EPS);
    assert_float_equal(d->phase1_s, 1.0, EPS);
    assert_false(d->full);
    assert_float_equal(d->weights[0] + d->weights[1] + d->relay_weights[0], 1.0, EPS);
    assert_int_equal(sc_sched_worker_state(s, 2), SC_W_RELAY);
    uint64_t gid = d->group_id; /* decisions live until the next call */
    /* T_fault = 5 * (phase-1 end 4 - first ready 1) = 15 after 4: 19, and
     * w2 is overdue by the CDF {1, 2.6} learned from w0 and w1 from 5.2;
     * but this is w2's first step, and the others' steps say nothing about
     * it: not suspected (the live coordinator's op timeout bounds it). */
    tk = tick(s, 19.0);
    assert_null(nth(&tk, SC_DEC_SUSPECT, 0));
    tk = tick(s, 19.9);
    assert_null(nth(&tk, SC_DEC_SUSPECT, 0));
    assert_int_equal(sc_sched_on_worker_lost(s, 2), 0);
    assert_int_equal(sc_sched_on_group_done(s, gid, 20, 17), 0);
    ready(s, 0, 21);
    ready(s, 1, 21);
    tk = tick(s, 21);
    assert_true(nth(&tk, SC_DEC_LAUNCH, 0)->full); /* the 2 live workers */
    sc_sched_destroy(s);
}

/* T_fault judges a worker by its own steps (or a loaded CDF), not by the
 * others': four workers, w3 400 ms late to its first sync (loading its
 * data) while the others' first steps took 10 ms. Live, it was excluded
 * for good 200 ms after phase 1 (mp.relay.join.n4, CI 2026-11-28). Once it
 * has a step of its own, a second step far beyond it is a fault. */
static void test_relay_first_step_not_judged_by_others(void **state)
{
    (void)state;
    sc_params_t p;
    relay_params(&p, 4);
    p.model_mb = 16.8; /* 16 MiB: phase 2 is short, the group proceeds */
    sc_sched_t *s = mk(&p, 4);
    for (int w = 0; w < 3; w++) assert_int_equal(sc_sched_on_ready(s, w, 0.010, 0.010), 0);
    sc_tick_t tk = tick(s, 0.010);
    double t = 0.010;
    for (; t < 1 && !tk.nlaunch; t += p.tick_s) tk = tick(s, t);
    const sc_decision_t *d = nth(&tk, SC_DEC_LAUNCH, 0);
    assert_non_null(d);
    assert_int_equal(d->nrelays, 1);
    assert_int_equal(d->relays[0], 3);
    uint64_t gid = d->group_id;
    assert_int_equal(sc_sched_on_phase1_done(s, gid, 0.050), 0);
    /* fault-min 200 ms after phase 1, the CDF's 2 * 10 ms long past */
    tk = tick(s, 0.300);
    assert_null(nth(&tk, SC_DEC_SUSPECT, 0));
    assert_int_equal(sc_sched_on_ready(s, 3, 0.400, 0.400), 0);
    assert_int_equal(sc_sched_on_group_done(s, gid, 0.450, 0.45), 0);
    /* Step 2: w0-w2 again after 10 ms, w3 never comes. By its own step
     * (0.4 s) it is overdue at 0.45 + 2 * 0.4 = 1.25 s. */
    for (int w = 0; w < 3; w++) assert_int_equal(sc_sched_on_ready(s, w, 0.460, 0.010), 0);
    tk = tick(s, 0.460);
    for (t = 0.460; t < 1.25 && !tk.nlaunch; t += p.tick_s) tk = tick(s, t);
    d = nth(&tk, SC_DEC_LAUNCH, 0);
    assert_non_null(d);
    assert_int_equal(d->nrelays, 1);
    gid = d->group_id;
    assert_int_equal(sc_sched_on_phase1_done(s, gid, t + 0.040), 0);
    tk = tick(s, 1.2);
    assert_null(nth(&tk, SC_DEC_SUSPECT, 0));
    tk = tick(s, 1.26);
    const sc_decision_t *x = nth(&tk, SC_DEC_SUSPECT, 0);
    assert_non_null(x);
    assert_int_equal(x->members[0], 3);
    assert_int_equal(x->why, SC_WHY_RELAY_FAULT);
    /* Reported once. */
    tk = tick(s, 1.5);
    assert_null(nth(&tk, SC_DEC_SUSPECT, 0));
    sc_sched_destroy(s);
}

static void test_relay_fault_needs_overdue(void **state)
{
    (void)state;
    /* T_fault alone would suspect w1 at 1.5 + 5 * 0.5 = 4 s; its iterations
     * take up to 10 s (CDF), so it is suspected only once overdue: 2 * 10. */
    sc_params_t p;
    relay_params(&p, 2);
    sc_sched_t *s = mk(&p, 2);
    double ten = 10;
    assert_int_equal(sc_sched_load_cdf(s, -1, &ten, 1), 0);
    ready(s, 0, 1);
    assert_int_equal(tick(s, 1).nlaunch, 0);
    sc_tick_t tk = tick(s, 1.5); /* waited 0.5 = buy (5/10 Gbps) */
    assert_int_equal(tk.nlaunch, 1);
    tk = tick(s, 4.0);
    assert_null(nth(&tk, SC_DEC_SUSPECT, 0));
    assert_float_equal(tk.next_tick, 20.0, EPS);
    tk = tick(s, 20.0);
    assert_non_null(nth(&tk, SC_DEC_SUSPECT, 0));
    sc_sched_destroy(s);
}

static void test_relay_late_contributor(void **state)
{
    (void)state;
    sc_params_t p;
    relay_params(&p, 2);
    sc_sched_t *s = mk(&p, 2);
    ready(s, 0, 0);
    /* buy = 0 + 1 * 5/10 = 0.5 (default 10 Gbps) */
    sc_tick_t tk = tick(s, 0.5);
    assert_int_equal(tk.nlaunch, 1);
    uint64_t id = nth(&tk, SC_DEC_LAUNCH, 0)->group_id;
    /* The relay becomes ready during the group: it joins phase 2, not the queue. */
    ready(s, 1, 0.7);
    assert_int_equal(sc_sched_worker_state(s, 1), SC_W_RELAY_READY);
    tk = tick(s, 0.7);
    assert_int_equal(tk.nlaunch, 0);
    assert_int_equal(sc_sched_on_group_done(s, id, 1.2, 1.2), 0);
    assert_int_equal(sc_sched_worker_state(s, 1), SC_W_COMPUTING);
    sc_sched_destroy(s);
}

static void test_ski_rental_ratio(void **state)
{
    (void)state;
    /* Two workers: w0 ready at 0, buying costs B = 5/10 = 0.5 s while alone.
     * For any arrival x of w1 the online cost (time waited, plus B if it
     * bought) is within 2 * OPT = 2 min(x, B), plus one tick of granularity. */
    assert_true(sc_ski_proceed(1.0, 1.0));
    assert_false(sc_ski_proceed(0.999, 1.0));
    double xs[] = {0.1, 0.3, 0.49, 0.5, 0.51, 0.8, 2.0, 10.0};
    sc_params_t p;
    relay_params(&p, 2);
    const double B = 0.5;
    for (size_t k = 0; k < sizeof(xs) / sizeof(xs[0]); k++) {
        sc_sched_t *s = mk(&p, 2);
        ready(s, 0, 0);
        double cost = -1, t = 0;
        for (int i = 0; cost < 0; i++) {
            t = i * p.tick_s;
            if (t >= xs[k]) { /* w1 arrives before this cycle: all ready */
                ready(s, 1, xs[k]);
                sc_tick_t tk = tick(s, t);
                assert_true(nth(&tk, SC_DEC_LAUNCH, 0)->full);
                cost = xs[k];
                break;
            }
            sc_tick_t tk = tick(s, t);
            if (tk.nlaunch) {
                assert_int_equal(nth(&tk, SC_DEC_LAUNCH, 0)->why, SC_WHY_RELAY_PROCEED);
                assert_float_equal(nth(&tk, SC_DEC_LAUNCH, 0)->expected_s, B, EPS);
                cost = t + B;
            }
        }
        double opt = xs[k] < B ? xs[k] : B;
        assert_true(cost <= 2 * opt + p.tick_s + 1e-12);
        if (xs[k] >= B + p.tick_s) assert_float_equal(cost, 2 * B, p.tick_s);
        sc_sched_destroy(s);
    }
}

/* ---- interface ---- */

static bool params_equal(const sc_params_t *a, const sc_params_t *b)
{
    return a->policy == b->policy && a->p == b->p && a->p_frac == b->p_frac && a->eta == b->eta &&
           a->theta == b->theta && fabs(a->dt_s - b->dt_s) < 1e-15 && a->c == b->c &&
           fabs(a->alpha_s - b->alpha_s) < 1e-15 && a->model_mb == b->model_mb &&
           a->cost_form == b->cost_form && a->default_gbps == b->default_gbps && a->eq4 == b->eq4 &&
           a->bag_le == b->bag_le && a->flag_launches == b->flag_launches &&
           a->full_counts == b->full_counts && a->overdue_factor == b->overdue_factor &&
           a->cdf_per_worker == b->cdf_per_worker && a->cdf_window == b->cdf_window &&
           a->cdf_pool_window == b->cdf_pool_window && a->cdf_min_samples == b->cdf_min_samples &&
           fabs(a->tick_s - b->tick_s) < 1e-15 && a->fault_factor == b->fault_factor &&
           a->calib_gain == b->calib_gain;
}

static void test_params(void **state)
{
    (void)state;
    sc_params_t p;
    sc_params_default(&p);
    assert_int_equal(p.policy, SC_POLICY_SELECTIVE);
    assert_int_equal(sc_params_p(&p, 200), 60);
    assert_int_equal(sc_params_p(&p, 40), 12);
    assert_int_equal(sc_params_set(&p, "eta", "0.5"), 0);
    assert_float_equal(p.eta, 0.5, EPS);
    assert_int_equal(sc_params_set(&p, "dt-ms", "25"), 0);
    assert_float_equal(p.dt_s, 0.025, EPS);
    assert_int_equal(sc_params_set(&p, "DT_MS", "30"), 0); /* environment style */
    assert_float_equal(p.dt_s, 0.030, EPS);
    assert_int_equal(sc_params_set(&p, "scheme", "relay"), 0);
    assert_int_equal(p.policy, SC_POLICY_RELAY);
    assert_int_equal(sc_params_set(&p, "eq4", "conditional"), 0);
    assert_int_equal(p.eq4, SC_EQ4_CONDITIONAL);
    assert_int_equal(sc_params_set(&p, "p", "7"), 0);
    assert_int_equal(sc_params_p(&p, 200), 7);
    assert_int_equal(sc_params_p(&p, 5), 5);
    /* rejected, and left unchanged */
    assert_int_equal(sc_params_set(&p, "eta", "1.5"), COH_EINVAL);
    assert_float_equal(p.eta, 0.5, EPS);
    assert_int_equal(sc_params_set(&p, "eta", "abc"), COH_EINVAL);
    assert_int_equal(sc_params_set(&p, "nope", "1"), COH_EINVAL);
    assert_int_equal(sc_params_set(&p, "scheme", "fastest"), COH_EINVAL);
    assert_int_equal(sc_params_set(&p, "dt-ms", "0"), COH_EINVAL);
    sc_policy pol;
    assert_int_equal(sc_policy_from_name("partial", &pol), 0);
    assert_int_equal(pol, SC_POLICY_PARTIAL);
    assert_string_equal(sc_policy_name(SC_POLICY_ALLREDUCE), "allreduce");
    assert_int_equal(sc_policy_from_name("PARTIAL", &pol), COH_EINVAL);
    int np = 0;
    const sc_param_info_t *info = sc_params_info(&np);
    assert_true(np >= 20);
    /* Every documented name is accepted, and its documented default is the
     * default: setting it changes nothing. */
    for (int i = 0; i < np; i++) {
        sc_params_t q, r;
        sc_params_default(&q);
        sc_params_default(&r);
        assert_int_equal(sc_params_set(&q, info[i].name, info[i].deflt), 0);
        assert_true(params_equal(&q, &r));
    }
}

static void test_errors(void **state)
{
    (void)state;
    sc_params_t p;
    sc_params_default(&p);
    sc_sched_t *s = NULL;
    assert_int_equal(sc_sched_create(&p, 0, &s), COH_EINVAL);
    assert_null(s);
    assert_int_equal(sc_sched_create(NULL, 4, &s), COH_EINVAL);
    p.p = 9;
    assert_int_equal(sc_sched_create(&p, 4, &s), COH_EINVAL);
    p.p = 0;
    s = mk(&p, 4);
    assert_int_equal(sc_sched_on_ready(s, 4, 1, 1), COH_EINVAL);
    assert_int_equal(sc_sched_on_ready(s, -1, 1, 1), COH_EINVAL);
    assert_int_equal(sc_sched_on_ready(s, 0, NAN, 1), COH_EINVAL);
    assert_int_equal(sc_sched_on_ready(s, 0, 5, 1), 0);
    assert_int_equal(sc_sched_on_ready(s, 0, 6, 1), COH_ESTATE); /* already ready */
    assert_int_equal(sc_sched_on_ready(s, 1, 4, 1), COH_EINVAL); /* time went back */
    sc_tick_t tk;
    assert_int_equal(sc_sched_tick(s, 4.9, &tk), COH_EINVAL);
    assert_int_equal(sc_sched_tick(s, INFINITY, &tk), COH_EINVAL);
    assert_int_equal(sc_sched_on_bandwidth(s, 0, 0), COH_EINVAL);
    assert_int_equal(sc_sched_on_bandwidth(s, 0, -3), COH_EINVAL);
    assert_int_equal(sc_sched_on_group_done(s, 12345, 6, 1), COH_EINVAL);
    assert_int_equal(sc_sched_on_worker_lost(s, 7), COH_EINVAL);
    assert_int_equal(sc_sched_load_cdf(s, 4, NULL, 0), COH_EINVAL);
    assert_int_equal(sc_sched_on_worker_lost(s, 0), 0);
    assert_int_equal(sc_sched_on_worker_lost(s, 0), 0); /* idempotent */
    sc_sched_stats_t st;
    sc_sched_stats(s, &st);
    assert_int_equal(st.n_live, 3);
    assert_int_equal(st.n_ready, 0);
    sc_sched_destroy(s);
    sc_sched_destroy(NULL);
}

static void test_idle_ticks(void **state)
{
    (void)state;
    sc_params_t p;
    sc_params_default(&p);
    p.policy = SC_POLICY_PARTIAL;
    p.p = 2;
    sc_sched_t *s = mk(&p, 3);
    ready(s, 0, 1);
    sc_tick_t tk = tick(s, 1);
    assert_true(tk.evaluated);
    assert_true(isinf(sc_sched_next_tick(s)));
    tk = tick(s, 2);
    assert_false(tk.evaluated);
    assert_int_equal(tk.ndec, 0);
    ready(s, 1, 3);
    assert_float_equal(sc_sched_next_tick(s), 3.0, EPS); /* an event: tick now */
    tk = tick(s, 3);
    assert_int_equal(tk.nlaunch, 1);
    sc_sched_destroy(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cost_ring),
        cmocka_unit_test(test_fit_alpha_beta),
        cmocka_unit_test(test_rate),
        cmocka_unit_test(test_cdf),
        cmocka_unit_test(test_cdf_window_long),
        cmocka_unit_test(test_weights),
        cmocka_unit_test(test_cand_sort),
        cmocka_unit_test(test_order_matches_reference),
        cmocka_unit_test(test_bag),
        cmocka_unit_test(test_bpawr),
        cmocka_unit_test(test_example_selective),
        cmocka_unit_test(test_example_bag_literal),
        cmocka_unit_test(test_example_partial_allreduce),
        cmocka_unit_test(test_weights_in_groups),
        cmocka_unit_test(test_allreduce_worker_lost),
        cmocka_unit_test(test_selective_full_sync),
        cmocka_unit_test(test_selective_full_counts_literal),
        cmocka_unit_test(test_selective_flag_literal_stalls),
        cmocka_unit_test(test_selective_overdue_and_lost),
        cmocka_unit_test(test_selective_starvation_guard),
        cmocka_unit_test(test_cold_start_cdf),
        cmocka_unit_test(test_member_done),
        cmocka_unit_test(test_relay_decision),
        cmocka_unit_test(test_relay_first_step_not_judged_by_others),
        cmocka_unit_test(test_relay_fault_needs_overdue),
        cmocka_unit_test(test_relay_late_contributor),
        cmocka_unit_test(test_ski_rental_ratio),
        cmocka_unit_test(test_params),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_idle_ticks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
