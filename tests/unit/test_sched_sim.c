/*
 * test_sched_sim.c - the discrete-event simulator (sched/sc_sim.h) driving
 * the real scheduler: determinism for a seed, invariants on random runs of
 * every policy (a worker is never in two groups at once, groups of at least
 * p except full syncs, weights sum to 1, no worker waits forever), failures,
 * exact scenarios, and the paper's qualitative result.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "cohort.h"
#include "sched/sc_sim.h"

static sc_sim_result_t run(const sc_sim_cfg_t *c)
{
    sc_sim_result_t r;
    int rc = sc_sim_run(c, &r);
    assert_int_equal(rc, 0);
    if (r.violations)
        fail_msg("%lld invariant violations, first: %s", (long long)r.violations, r.violation);
    return r;
}

static void test_deterministic(void **state)
{
    (void)state;
    for (int pol = 0; pol < SC_POLICY_COUNT; pol++) {
        sc_sim_cfg_t c;
        sc_sim_cfg_default(&c);
        c.sched.policy = (sc_policy)pol;
        c.n = 30;
        c.seed = 42;
        c.bw_error = 0.2;
        c.record = true;
        c.duration_s = 40;
        sc_sim_result_t a = run(&c), b = run(&c);
        assert_true(a.total_sync > 0);
        assert_int_equal(a.total_sync, b.total_sync);
        assert_int_equal(a.total_iteration, b.total_iteration);
        assert_int_equal(a.events, b.events);
        assert_true(a.avg_sync_time_s == b.avg_sync_time_s);
        assert_true(a.wasted_wait_ms_per_worker == b.wasted_wait_ms_per_worker);
        assert_int_equal(a.nsyncs, b.nsyncs);
        for (int i = 0; i < a.nsyncs; i++) {
            assert_true(a.syncs[i].start == b.syncs[i].start);
            assert_int_equal(a.syncs[i].n, b.syncs[i].n);
            assert_memory_equal(a.members + a.syncs[i].off, b.members + b.syncs[i].off,
                                (size_t)a.syncs[i].n * sizeof(int));
        }
        /* Another seed is another run. */
        c.seed = 43;
        sc_sim_result_t d = run(&c);
        assert_true(d.events != a.events || d.avg_sync_time_s != a.avg_sync_time_s);
        sc_sim_result_free(&a);
        sc_sim_result_free(&b);
        sc_sim_result_free(&d);
    }
}

static void test_common_random_numbers(void **state)
{
    (void)state;
    /* Same seed, same bandwidths and compute draws under every scheme: the
     * first sync of allreduce starts when the slowest first iteration ends,
     * which is the same instant for every policy that waits for all. */
    sc_sim_cfg_t c;
    sc_sim_cfg_default(&c);
    c.n = 20;
    c.seed = 9;
    c.record = true;
    c.duration_s = 10;
    c.sched.policy = SC_POLICY_ALLREDUCE;
    sc_sim_result_t a = run(&c);
    c.sched.policy = SC_POLICY_RELAY;
    sc_sim_result_t r = run(&c);
    assert_true(a.nsyncs > 0 && r.nsyncs > 0);
    /* relay proceeds no earlier than break-even, allreduce at the last ready */
    assert_true(r.syncs[0].start <= a.syncs[0].start + 1e-12);
    sc_sim_result_free(&a);
    sc_sim_result_free(&r);
}

/* Random runs over the parameter space; each checks every decision. */
static void test_invariants(void **state)
{
    (void)state;
    static const char *const dists[] = {"cnn", "transformer"};
    int runs = 0;
    for (int pol = 0; pol < SC_POLICY_COUNT; pol++) {
        for (int v = 0; v < 8; v++) {
            sc_sim_cfg_t c;
            sc_sim_cfg_default(&c);
            c.sched.policy = (sc_policy)pol;
            c.check = true;
            c.seed = 100 + (uint64_t)v;
            c.n = 7 + 11 * v;
            sc_dist_from_name(dists[v % 2], &c.dist);
            c.duration_s = 60;
            switch (v) {
            case 1: c.warm = false; break;
            case 2: c.bw_error = 0.5; break;
            case 3: c.sched.c = 5; break;
            case 4: c.sched.p_frac = 0.5; break;
            case 5:
                c.sched.eq4 = SC_EQ4_CONDITIONAL;
                c.sched.eta = 0.8;
                break;
            case 6:
                c.sched.p = 1;
                c.lambda = 0.5;
                break;
            case 7:
                c.sched.theta = 20;
                c.sched.dt_s = 0.1;
                c.warm = false;
                c.bw_error = 1;
                break;
            default: break;
            }
            sc_sim_result_t r = run(&c);
            runs++;
            /* Every worker synchronised, repeatedly. */
            if (r.min_worker_syncs < 2)
                fail_msg("%s v=%d: a worker synced only %lld times", sc_policy_name(c.sched.policy),
                         v, (long long)r.min_worker_syncs);
            /* No worker waits forever: with the starvation guard (10 s) a
             * wait is bounded by the guard, one more group of its peers
             * (their sync, at most 2(n-1) alpha + 2v/1 Gbps < 8.6 s here, and
             * their next compute, < 3 s) and the evaluation slot. */
            if (r.max_wait_s > c.sched.starve_s + 8.6 + 3 + c.sched.dt_s)
                fail_msg("%s v=%d: a worker waited %.3f s", sc_policy_name(c.sched.policy), v,
                         r.max_wait_s);
            assert_true(r.avg_sync_scale >= (pol == SC_POLICY_ALLREDUCE ? c.n : 1));
            if (pol == SC_POLICY_PARTIAL)
                assert_true(r.avg_sync_scale == sc_params_p(&c.sched, c.n));
            assert_int_equal(r.total_iteration, (int64_t)llround(r.avg_sync_scale * r.total_sync));
            sc_sim_result_free(&r);
        }
    }
    assert_int_equal(runs, 32);
}

static void test_paper_starvation_bounded_by_c(void **state)
{
    (void)state;
    /* Without the guard the paper's algorithm can keep the slowest workers
     * waiting for a long time (see sc_sched.c); its full sync every c rounds
     * bounds that. */
    sc_sim_cfg_t c;
    sc_sim_cfg_default(&c);
    c.n = 72;
    c.seed = 1;
    c.check = true;
    sc_dist_from_name("cnn", &c.dist);
    c.sched.starve_s = 0;
    sc_sim_result_t a = run(&c);
    c.sched.c = 4;
    sc_sim_result_t b = run(&c);
    assert_true(b.max_wait_s < a.max_wait_s);
    assert_true(b.max_wait_s < 15);
    assert_true(b.min_worker_syncs >= 2);
    sc_sim_result_free(&a);
    sc_sim_result_free(&b);
}

static void test_failures(void **state)
{
    (void)state;
    /* Two workers die; each policy carries on without them. */
    sc_sim_fail_t f[] = {{3, 10.0}, {11, 25.0}};
    for (int pol = 0; pol < SC_POLICY_COUNT; pol++) {
        sc_sim_cfg_t c;
        sc_sim_cfg_default(&c);
        c.sched.policy = (sc_policy)pol;
        c.n = 24;
        c.seed = 5;
        c.fails = f;
        c.nfails = 2;
        c.check = true;
        c.record = true;
        sc_sim_result_t r = run(&c);
        /* Syncs keep finishing after the last failure, without the dead. */
        int after = 0;
        for (int i = 0; i < r.nsyncs; i++) {
            const sc_sim_sync_t *s = &r.syncs[i];
            if (s->start < 40 || isnan(s->end)) continue;
            after++;
            for (int j = 0; j < s->n; j++) {
                int w = r.members[s->off + j];
                assert_true(w != 3 && w != 11);
            }
        }
        if (after < 3)
            fail_msg("%s: %d syncs after the failures", sc_policy_name(c.sched.policy), after);
        assert_true(r.min_worker_syncs >= 3);
        sc_sim_result_free(&r);
    }
}

static void test_replay_motivating(void **state)
{
    (void)state;
    /* Fig. 3 through the simulator API (the CLI runs it in the sim.* tests). */
    int off[] = {0, 1, 2, 3, 4, 5};
    double bw[] = {5, 1, 5, 1, 5}, cs[] = {1, 2, 3, 3, 13};
    sc_replay_t rp = {.n = 5, .off = off, .bw_gbps = bw, .compute_s = cs};
    struct {
        sc_policy pol;
        double avg;
        int scale_x2, nsync;
    } want[] = {{SC_POLICY_ALLREDUCE, 10, 10, 1},
                {SC_POLICY_PARTIAL, 10, 4, 2},
                {SC_POLICY_SELECTIVE, 6, 4, 2}};
    for (size_t k = 0; k < 3; k++) {
        sc_sim_cfg_t c;
        sc_sim_cfg_default(&c);
        c.replay = &rp;
        c.duration_s = INFINITY;
        c.sched.policy = want[k].pol;
        c.sched.p = 2;
        c.sched.model_mb = 625;
        c.sched.alpha_s = 0;
        c.sched.cost_form = SC_COST_APPROX;
        c.sched.dt_s = 1;
        c.check = true;
        c.record = true;
        sc_sim_result_t r = run(&c);
        assert_float_equal(r.avg_sync_time_s, want[k].avg, 1e-9);
        assert_float_equal(2 * r.avg_sync_scale, want[k].scale_x2, 1e-9);
        assert_int_equal(r.total_sync, want[k].nsync);
        assert_float_equal(r.wasted_wait_ms_per_worker, 0, 1e-9);
        sc_sim_result_free(&r);
    }
}

static void test_selective_beats_partial(void **state)
{
    (void)state;
    /* The paper's qualitative result on a small cluster: selective reduce
     * syncs faster, in larger groups, and iterates more (medians, 5 seeds). */
    double t[2][5], sc[2][5], it[2][5];
    for (int k = 0; k < 2; k++) {
        for (int seed = 0; seed < 5; seed++) {
            sc_sim_cfg_t c;
            sc_sim_cfg_default(&c);
            c.sched.policy = k ? SC_POLICY_SELECTIVE : SC_POLICY_PARTIAL;
            c.n = 100;
            c.seed = 1 + (uint64_t)seed;
            sc_sim_result_t r = run(&c);
            t[k][seed] = r.avg_sync_time_s;
            sc[k][seed] = r.avg_sync_scale;
            it[k][seed] = (double)r.total_iteration;
            sc_sim_result_free(&r);
        }
    }
    int wins_t = 0, wins_s = 0, wins_i = 0;
    for (int seed = 0; seed < 5; seed++) {
        wins_t += t[1][seed] < t[0][seed];
        wins_s += sc[1][seed] > sc[0][seed];
        wins_i += it[1][seed] > it[0][seed];
    }
    assert_int_equal(wins_t, 5);
    assert_int_equal(wins_s, 5);
    assert_int_equal(wins_i, 5);
}

static void test_eq4_readings_differ(void **state)
{
    (void)state;
    /* The printed F(t+dt) predicts many more arrivals than the conditional
     * probability: BPAWR waits more, groups grow, wasted waits appear. */
    sc_sim_cfg_t c;
    sc_sim_cfg_default(&c);
    c.n = 100;
    c.seed = 3;
    c.sched.eq4 = SC_EQ4_PRINTED;
    sc_sim_result_t pr = run(&c);
    c.sched.eq4 = SC_EQ4_CONDITIONAL;
    sc_sim_result_t co = run(&c);
    assert_true(pr.avg_sync_scale > co.avg_sync_scale);
    assert_true(pr.avg_sync_time_s < co.avg_sync_time_s);
    sc_sim_result_free(&pr);
    sc_sim_result_free(&co);
}

static void test_bad_config(void **state)
{
    (void)state;
    sc_sim_cfg_t c;
    sc_sim_result_t r;
    sc_sim_cfg_default(&c);
    c.n = 0;
    assert_int_equal(sc_sim_run(&c, &r), COH_EINVAL);
    sc_sim_cfg_default(&c);
    c.duration_s = -1;
    assert_int_equal(sc_sim_run(&c, &r), COH_EINVAL);
    sc_sim_cfg_default(&c);
    c.lambda = 2;
    assert_int_equal(sc_sim_run(&c, &r), COH_EINVAL);
    sc_sim_cfg_default(&c);
    c.sched.eta = 1;
    assert_int_equal(sc_sim_run(&c, &r), COH_EINVAL);
    sc_sim_fail_t f = {99, 1};
    sc_sim_cfg_default(&c);
    c.n = 10;
    c.fails = &f;
    c.nfails = 1;
    assert_int_equal(sc_sim_run(&c, &r), COH_EINVAL);
    int off[] = {0, 1, 0};
    double bw[] = {1}, cs[] = {1};
    sc_replay_t rp = {.n = 2, .off = off, .bw_gbps = bw, .compute_s = cs};
    sc_sim_cfg_default(&c);
    c.replay = &rp;
    assert_int_equal(sc_sim_run(&c, &r), COH_EINVAL);
}

static void test_bandwidth_draw(void **state)
{
    (void)state;
    /* round(20u, 3) Gbps, u ~ U[lambda, 1]: within [20 lambda, 20], on a
     * 1 Mbps grid, mean near 20 (1 + lambda) / 2. */
    sc_rng_t r;
    sc_rng_seed(&r, 1, 1);
    double sum = 0;
    for (int i = 0; i < 100000; i++) {
        double b = sc_sim_draw_bandwidth(&r, 0.05);
        assert_true(b >= 1.0 && b <= 20.0);
        assert_float_equal(b * 1000, round(b * 1000), 1e-6);
        sum += b;
    }
    assert_float_equal(sum / 100000, 10.5, 0.05);
    /* The synthetic traces: transformer far more variable than cnn. */
    sc_dist_t cnn, tr;
    sc_dist_from_name("cnn", &cnn);
    sc_dist_from_name("transformer", &tr);
    double m[2] = {0, 0}, s2[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < 100000; i++) {
            double x = sc_dist_draw(k ? &tr : &cnn, &r);
            m[k] += x;
            s2[k] += x * x;
        }
        m[k] /= 100000;
        s2[k] = sqrt(s2[k] / 100000 - m[k] * m[k]) / m[k]; /* CV */
    }
    assert_float_equal(m[0], 0.41, 0.02);
    assert_float_equal(m[1], 0.46, 0.02);
    assert_true(s2[1] > 3 * s2[0]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_common_random_numbers),
        cmocka_unit_test(test_invariants),
        cmocka_unit_test(test_paper_starvation_bounded_by_c),
        cmocka_unit_test(test_failures),
        cmocka_unit_test(test_replay_motivating),
        cmocka_unit_test(test_selective_beats_partial),
        cmocka_unit_test(test_eq4_readings_differ),
        cmocka_unit_test(test_bad_config),
        cmocka_unit_test(test_bandwidth_draw),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
