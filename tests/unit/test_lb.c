/*
 * The multi-rail load balancer (sched/sc_lb.c) on synthetic rails: each rail
 * has a true latency and rate; an op's slice on it takes lat + bytes / rate,
 * which is fed back as a measurement, as the live rails would.
 *   - cold: small ops go whole on the rail of lowest latency (not round robin);
 *   - the cold/hot threshold follows the measurements (it is where striping's
 *     expected time meets the best single rail's), not a constant;
 *   - hot: shares converge to the rate ratio, and again after a rate change,
 *     within 100 ops;
 *   - divergence: a rail beyond the tolerance gets nothing, and is probed;
 *   - a rail down gets nothing, and is used again when it is back;
 *   - the table dumps and loads (a second run starts hot), the split is
 *     deterministic, and slices cover the op exactly.
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
#include "sched/sc_lb.h"
#include "sched/sc_rails.h"

typedef struct rail_true {
    double lat, bps;
} rail_true_t;

/* Run one op of `bytes` through the balancer against the true rails; returns
 * its time (the slowest slice) and leaves the plan in *plan. */
static double run_op(sc_lb_t *lb, const rail_true_t *tr, int n, uint64_t bytes, uint64_t index,
                     sc_lb_plan_t *plan)
{
    assert_int_equal(sc_lb_split(lb, bytes, 4, index, plan), 0);
    double worst = 0;
    uint64_t sum = 0;
    for (int r = 0; r < n; r++) {
        if (!plan->bytes[r]) continue;
        double t = tr[r].lat + (double)plan->bytes[r] / tr[r].bps;
        assert_int_equal(sc_lb_observe(lb, r, plan->bytes[r], t), 0);
        if (t > worst) worst = t;
        sum += plan->bytes[r];
    }
    assert_true(sum == bytes);
    return worst;
}

static void warm(sc_lb_t *lb, const rail_true_t *tr, int n)
{
    sc_lb_plan_t p;
    for (int i = 1; i < 200; i++) run_op(lb, tr, n, (i % 2) ? 1024 : (16u << 20), (uint64_t)i, &p);
}

static void test_cold_small_ops_take_the_fastest_rail(void **state)
{
    (void)state;
    rail_true_t tr[2] = {{50e-6, 50e6}, {20e-6, 50e6}};
    sc_lb_t *lb;
    assert_int_equal(sc_lb_create(2, NULL, &lb), 0);
    warm(lb, tr, 2);
    sc_lb_plan_t p;
    for (uint64_t i = 1; i < 20; i++) {
        run_op(lb, tr, 2, 4096, i, &p);
        assert_false(p.striped);
        assert_true(p.bytes[1] == 4096); /* latency, not round robin */
    }
    sc_lb_destroy(lb);
}

/* The smallest power-of-two size the balancer stripes. */
static uint64_t threshold(sc_lb_t *lb)
{
    for (uint64_t s = 1024; s <= (1ull << 30); s *= 2) {
        sc_lb_plan_t p;
        assert_int_equal(sc_lb_split(lb, s, 4, 1, &p), 0);
        if (p.striped) return s;
    }
    return 0;
}

static void test_threshold_follows_the_measurements(void **state)
{
    (void)state;
    /* Two equal rails: striping pays once halving the transfer time beats
     * the striping overhead; the crossover of lat + S/B against
     * lat + S/(2B) + overhead is S = 2 B overhead. */
    sc_lb_params_t prm;
    sc_lb_params_default(&prm);
    rail_true_t slow[2] = {{100e-6, 50e6}, {100e-6, 50e6}};
    rail_true_t fast[2] = {{100e-6, 5e9}, {100e-6, 5e9}};
    sc_lb_t *a, *b;
    assert_int_equal(sc_lb_create(2, &prm, &a), 0);
    assert_int_equal(sc_lb_create(2, &prm, &b), 0);
    sc_lb_plan_t p;
    for (int i = 1; i < 400; i++) {
        uint64_t s = 1024ull << (i % 16);
        run_op(a, slow, 2, s, (uint64_t)i, &p);
        run_op(b, fast, 2, s, (uint64_t)i, &p);
    }
    uint64_t ta = threshold(a), tb = threshold(b);
    double want_a = 2 * 50e6 * prm.stripe_overhead_s, want_b = 2 * 5e9 * prm.stripe_overhead_s;
    printf("threshold: slow rails %llu B (model %.0f), fast rails %llu B (model %.0f)\n",
           (unsigned long long)ta, want_a, (unsigned long long)tb, want_b);
    assert_true(ta > 0 && tb > 0);
    assert_true(tb > ta); /* faster rails: striping pays only for larger ops */
    assert_true((double)ta >= want_a / 2 && (double)ta <= want_a * 4);
    assert_true((double)tb >= want_b / 2 && (double)tb <= want_b * 4);
    sc_lb_destroy(a);
    sc_lb_destroy(b);
}

static int ops_to_converge(sc_lb_t *lb, const rail_true_t *tr, double want0, uint64_t *index)
{
    sc_lb_plan_t p;
    int stable = 0;
    for (int k = 1; k <= 500; k++) {
        run_op(lb, tr, 2, 16u << 20, (*index)++, &p);
        double f0 = (double)p.bytes[0] / (16u << 20);
        if (p.striped && fabs(f0 - want0) < 0.03) {
            if (++stable == 5) return k - 4;
        } else {
            stable = 0;
        }
    }
    return -1;
}

static void test_hot_converges_and_follows_a_change(void **state)
{
    (void)state;
    rail_true_t tr[2] = {{100e-6, 100e6}, {100e-6, 300e6}};
    sc_lb_params_t prm;
    sc_lb_params_default(&prm);
    prm.probe_every = 0;
    sc_lb_t *lb;
    assert_int_equal(sc_lb_create(2, &prm, &lb), 0);
    uint64_t idx = 1;
    int k1 = ops_to_converge(lb, tr, 0.25, &idx);
    tr[0].bps = 300e6; /* the slow rail becomes as fast */
    int k2 = ops_to_converge(lb, tr, 0.5, &idx);
    tr[1].bps = 30e6; /* now the other one is 10x slower: beyond the tolerance */
    sc_lb_plan_t p;
    for (int i = 0; i < 100; i++) run_op(lb, tr, 2, 16u << 20, idx++, &p);
    printf("ops to converge: cold to 1:3 %d, after 1:3 -> 1:1 %d\n", k1, k2);
    assert_true(k1 > 0 && k1 <= 100);
    assert_true(k2 > 0 && k2 <= 100);
    assert_false(p.striped);
    assert_true(p.bytes[0] == (16u << 20));
    sc_lb_destroy(lb);
}

static void test_divergence_and_probe(void **state)
{
    (void)state;
    sc_lb_params_t prm;
    sc_lb_params_default(&prm);
    prm.probe_every = 16;
    sc_lb_t *lb;
    assert_int_equal(sc_lb_create(2, &prm, &lb), 0);
    rail_true_t tr[2] = {{100e-6, 400e6}, {100e-6, 400e6 / 8}}; /* 8 > 5 */
    sc_lb_plan_t p;
    for (uint64_t i = 1; i < 200; i++) run_op(lb, tr, 2, 16u << 20, i, &p);
    assert_int_equal(sc_lb_split(lb, 16u << 20, 4, 17, &p), 0);
    assert_false(p.striped); /* cut off */
    assert_int_equal(sc_lb_split(lb, 16u << 20, 4, 32, &p), 0);
    assert_true(p.striped); /* probed: measured again */
    assert_true(p.bytes[1] > 0 && p.bytes[1] < p.bytes[0]);
    /* It recovers: at 1:4 (within the tolerance) it is used again. */
    tr[1].bps = 400e6 / 4;
    for (uint64_t i = 200; i < 400; i++) run_op(lb, tr, 2, 16u << 20, i, &p);
    assert_int_equal(sc_lb_split(lb, 16u << 20, 4, 401, &p), 0);
    assert_true(p.striped);
    double f1 = (double)p.bytes[1] / (16u << 20);
    assert_true(fabs(f1 - 0.2) < 0.05);
    sc_lb_destroy(lb);
}

static void test_rail_down_and_back(void **state)
{
    (void)state;
    rail_true_t tr[3] = {{100e-6, 200e6}, {100e-6, 200e6}, {100e-6, 200e6}};
    sc_lb_t *lb;
    assert_int_equal(sc_lb_create(3, NULL, &lb), 0);
    warm(lb, tr, 3);
    sc_lb_plan_t p;
    run_op(lb, tr, 3, 16u << 20, 3, &p);
    assert_int_equal(p.nrails_used, 3);
    assert_int_equal(sc_lb_set_up(lb, 1, false), 0);
    for (uint64_t i = 0; i < 70; i++) { /* probes included: never the rail that is down */
        run_op(lb, tr, 3, 16u << 20, i, &p);
        assert_true(p.bytes[1] == 0);
        assert_int_equal(p.nrails_used, 2);
    }
    assert_int_equal(sc_lb_set_up(lb, 0, false), 0);
    assert_int_equal(sc_lb_set_up(lb, 2, false), 0);
    assert_int_equal(sc_lb_split(lb, 1024, 4, 1, &p), COH_EPEER);
    assert_int_equal(sc_lb_set_up(lb, 0, true), 0);
    assert_int_equal(sc_lb_set_up(lb, 1, true), 0);
    assert_int_equal(sc_lb_set_up(lb, 2, true), 0);
    run_op(lb, tr, 3, 16u << 20, 3, &p);
    assert_int_equal(p.nrails_used, 3);
    sc_lb_destroy(lb);
}

static void test_dump_load_and_determinism(void **state)
{
    (void)state;
    rail_true_t tr[2] = {{30e-6, 100e6}, {80e-6, 250e6}};
    sc_lb_t *a, *b, *c;
    assert_int_equal(sc_lb_create(2, NULL, &a), 0);
    assert_int_equal(sc_lb_create(2, NULL, &b), 0);
    assert_int_equal(sc_lb_create(2, NULL, &c), 0);
    warm(a, tr, 2);
    warm(c, tr, 2); /* the same history: the same table */
    char text[8192];
    assert_true(sc_lb_dump(a, text, sizeof(text)) > 0);
    assert_non_null(strstr(text, "cohort-lb 1 rails 2"));
    assert_int_equal(sc_lb_load(b, text), 0);
    for (uint64_t s = 1024; s <= (256u << 20); s *= 2) {
        sc_lb_plan_t pa, pb, pc;
        assert_int_equal(sc_lb_split(a, s, 4, s, &pa), 0);
        assert_int_equal(sc_lb_split(b, s, 4, s, &pb), 0);
        assert_int_equal(sc_lb_split(c, s, 4, s, &pc), 0);
        assert_memory_equal(pa.bytes, pb.bytes, sizeof(pa.bytes));
        assert_memory_equal(pa.bytes, pc.bytes, sizeof(pa.bytes));
    }
    /* Refused: another rail count, garbage, a bad value. */
    sc_lb_t *three;
    assert_int_equal(sc_lb_create(3, NULL, &three), 0);
    assert_int_equal(sc_lb_load(three, text), COH_EINVAL);
    assert_int_equal(sc_lb_load(b, "cohort-lb 1 rails 2\nrail 0 bucket 20 rate -1 n 1\n"),
                     COH_EINVAL);
    assert_int_equal(sc_lb_load(b, "nonsense"), COH_EINVAL);
    sc_lb_destroy(three);
    sc_lb_destroy(a);
    sc_lb_destroy(b);
    sc_lb_destroy(c);
}

static void test_slices_cover_the_op(void **state)
{
    (void)state;
    rail_true_t tr[3] = {{50e-6, 100e6}, {50e-6, 200e6}, {50e-6, 300e6}};
    sc_lb_t *lb;
    assert_int_equal(sc_lb_create(3, NULL, &lb), 0);
    warm(lb, tr, 3);
    for (uint64_t count = 1; count < (8u << 20); count = count * 3 + 1) {
        sc_lb_plan_t p;
        assert_int_equal(sc_lb_split(lb, count * 4, 4, 5, &p), 0);
        sc_slice_t sl[SC_MAX_RAILS];
        int n = sc_lb_slices(&p, count, 4, sl);
        assert_true(n >= 1);
        uint64_t lo = 0;
        for (int i = 0; i < n; i++) {
            assert_true(sl[i].lo == lo);
            assert_true(sl[i].hi >= sl[i].lo);
            if (i) assert_true(sl[i].rail > sl[i - 1].rail);
            lo = sl[i].hi;
        }
        assert_true(lo == count);
    }
    sc_lb_destroy(lb);
}

/* The rate at a size: from two sizes of one bucket (2^b .. 2^(b+1) - 1),
 * the latency cancels. */
static double rate_of(const sc_lb_t *lb, int rail, int b)
{
    uint64_t x = 1ull << b, y = x + x / 2;
    return (double)(y - x) / (sc_lb_expect(lb, rail, y) - sc_lb_expect(lb, rail, x));
}

/* A size takes the rate of the nearest measured bucket, the lower one at
 * equal distance (own_rate's bit search, which replaced a scan). */
static void test_nearest_measured_bucket(void **state)
{
    (void)state;
    sc_lb_t *lb;
    assert_int_equal(sc_lb_create(2, NULL, &lb), 0);
    assert_int_equal(sc_lb_observe(lb, 0, 1 << 20, 1e-3), 0);   /* bucket 20 */
    assert_int_equal(sc_lb_observe(lb, 0, 1 << 24, 4e-3), 0);   /* bucket 24 */
    assert_int_equal(sc_lb_observe(lb, 0, 1ull << 39, 100), 0); /* the last bucket */
    double r20 = rate_of(lb, 0, 20), r24 = rate_of(lb, 0, 24), r39 = rate_of(lb, 0, 38);
    assert_true(r20 > 0 && r24 > 0 && r20 != r24 && r39 != r24);
    assert_true(fabs(rate_of(lb, 0, 12) - r20) < 1e-6 * r20);
    assert_true(fabs(rate_of(lb, 0, 21) - r20) < 1e-6 * r20);
    assert_true(fabs(rate_of(lb, 0, 22) - r20) < 1e-6 * r20); /* a tie: the lower */
    assert_true(fabs(rate_of(lb, 0, 23) - r24) < 1e-6 * r24);
    assert_true(fabs(rate_of(lb, 0, 31) - r24) < 1e-6 * r24);
    assert_true(fabs(rate_of(lb, 0, 32) - r39) < 1e-6 * r39);
    /* Rail 1 was never measured: the mean of the others' at that size. */
    assert_true(fabs(rate_of(lb, 1, 22) - r20) < 1e-6 * r20);
    /* The same after a round trip through the packed form. */
    uint8_t buf[SC_LB_PACK_MAX];
    int n = sc_lb_pack(lb, buf, sizeof(buf));
    assert_true(n > 0);
    sc_lb_t *cp;
    assert_int_equal(sc_lb_create(2, NULL, &cp), 0);
    assert_int_equal(sc_lb_unpack(cp, buf, (size_t)n), 0);
    assert_true(fabs(rate_of(cp, 0, 22) - r20) < 1e-6 * r20);
    assert_true(fabs(rate_of(cp, 0, 23) - r24) < 1e-6 * r24);
    sc_lb_destroy(cp);
    sc_lb_destroy(lb);
}

/* Without the balancer (sub-communicators, sync groups, COHORT_LB_EPOCH=0):
 * small ops keep to one rail for SC_STICKY_OPS keys in a row, larger
 * single-rail ops alternate, ops from rail_min_bytes split over all. */
static void test_split_without_balancer(void **state)
{
    (void)state;
    sc_split_in_t in = {
        .count = 1024, .nrails = 2, .rail_min_bytes = 1 << 20, .small_bytes = 65536};
    sc_slice_t sl[SC_MAX_RAILS];
    int changes = 0, prev = -1, on[2] = {0, 0};
    in.bytes = 4096;
    for (uint64_t k = 0; k < 4 * SC_STICKY_OPS; k++) {
        in.key = k;
        assert_int_equal(sc_rail_split(&in, sl), 1);
        assert_int_equal(sl[0].lo, 0);
        assert_int_equal(sl[0].hi, 1024);
        if (prev >= 0 && sl[0].rail != prev) changes++;
        prev = sl[0].rail;
        on[sl[0].rail]++;
    }
    assert_int_equal(changes, 3); /* every SC_STICKY_OPS keys, not every op */
    assert_int_equal(on[0], on[1]);
    in.bytes = 65536; /* small_bytes itself is small */
    in.key = SC_STICKY_OPS - 1;
    sc_rail_split(&in, sl);
    int r = sl[0].rail;
    in.key = SC_STICKY_OPS - 2;
    sc_rail_split(&in, sl);
    assert_int_equal(sl[0].rail, r);
    in.bytes = 65537; /* larger: each op the next rail */
    for (uint64_t k = 0; k < 8; k++) {
        in.key = k;
        assert_int_equal(sc_rail_split(&in, sl), 1);
        assert_int_equal(sl[0].rail, (int)(k % 2));
    }
    in.bytes = 1 << 20;
    assert_int_equal(sc_rail_split(&in, sl), 2);
    assert_int_equal(sl[0].hi, sl[1].lo);
    assert_int_equal(sl[1].hi, 1024);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_without_balancer),
        cmocka_unit_test(test_nearest_measured_bucket),
        cmocka_unit_test(test_cold_small_ops_take_the_fastest_rail),
        cmocka_unit_test(test_threshold_follows_the_measurements),
        cmocka_unit_test(test_hot_converges_and_follows_a_change),
        cmocka_unit_test(test_divergence_and_probe),
        cmocka_unit_test(test_rail_down_and_back),
        cmocka_unit_test(test_dump_load_and_determinism),
        cmocka_unit_test(test_slices_cover_the_op),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
