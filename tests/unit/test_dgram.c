/*
 * engines/en_dgram.h: the bounded-loss datagram protocol's pure parts.
 *
 * The header's wire layout byte by byte and every field the decoder must
 * refuse; the segment bitmap (duplicates, the next missing segment across
 * word boundaries); the loss bound's accounting with a short last segment
 * and the missing ranges; the rate-control state machine driven period by
 * period; the pacer on a synthetic clock; the tag functions.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include <cmocka.h>

#include "cohort.h"
#include "engines/en_dgram.h"

static const en_dg_hdr_t H = {.flags = EN_DG_PULL,
                              .job = 0x1122334455667788ull,
                              .comm = 7,
                              .step = 3,
                              .seq = 0x0102030405060708ull,
                              .offset = 2 * 1400,
                              .len = 100,
                              .segno = 2};

static void test_header_layout_roundtrip(void **state)
{
    (void)state;
    uint8_t b[EN_DG_HDR + 100];
    memset(b, 0xab, sizeof(b));
    en_dg_encode(&H, b);
    /* job and seq keep their low 48 bits */
    static const uint8_t want[EN_DG_HDR] = {3,    EN_DG_PULL, 0x88, 0x77, 0x66, 0x55, 0x44, 0x33,
                                            7,    0,          0,    0,    0x08, 0x07, 0x06, 0x05,
                                            0x04, 0x03,       3,    0,    0,    2,    0,    0};
    assert_memory_equal(b, want, EN_DG_HDR);
    en_dg_hdr_t out;
    assert_int_equal(en_dg_decode(b, sizeof(b), 1400, &out), 0);
    assert_int_equal(out.flags, EN_DG_PULL);
    assert_true(out.job == (H.job & EN_DG_JOB_MASK) && out.seq == (H.seq & EN_DG_SEQ_MAX) &&
                out.offset == H.offset);
    assert_int_equal(out.comm, 7);
    assert_int_equal(out.step, 3);
    assert_int_equal(out.len, 100);
    assert_int_equal(out.segno, 2);
}

static void test_header_refusals(void **state)
{
    (void)state;
    uint8_t b[EN_DG_HDR + 100];
    en_dg_hdr_t out;
    /* too short; a byte less is a payload a byte shorter */
    en_dg_encode(&H, b);
    assert_int_equal(en_dg_decode(b, EN_DG_HDR - 1, 1400, &out), COH_EPROTO);
    assert_int_equal(en_dg_decode(b, sizeof(b) - 1, 1400, &out), 0);
    assert_int_equal(out.len, 99);
    assert_int_equal(en_dg_decode(b, EN_DG_HDR, 1400, &out), 0);
    assert_int_equal(out.len, 0);
    /* version (2: the 32-byte header), unknown flags */
    int bytes[] = {0, 0, 1};
    uint8_t vals[] = {2, 'C', 0x80};
    for (int i = 0; i < 3; i++) {
        en_dg_encode(&H, b);
        b[bytes[i]] = vals[i];
        assert_int_equal(en_dg_decode(b, sizeof(b), 1400, &out), COH_EPROTO);
    }
    /* a segment longer than one, no segment size */
    en_dg_encode(&H, b);
    assert_int_equal(en_dg_decode(b, sizeof(b), 64, &out), COH_EPROTO);
    assert_int_equal(en_dg_decode(b, sizeof(b), 0, &out), COH_EPROTO);
    /* the largest segment number and size: the offset does not overflow */
    en_dg_hdr_t h = H;
    h.segno = EN_DG_NSEG_MAX - 1;
    en_dg_encode(&h, b);
    assert_int_equal(en_dg_decode(b, sizeof(b), 0xffffffffu, &out), 0);
    assert_int_equal(out.segno, EN_DG_NSEG_MAX - 1);
    assert_true(out.offset == (uint64_t)(EN_DG_NSEG_MAX - 1) * UINT32_MAX);
    /* the widest step tag, op and job */
    h = H;
    h.step = EN_DG_STEP_MAX;
    h.seq = EN_DG_SEQ_MAX;
    h.job = EN_DG_JOB_MASK;
    en_dg_encode(&h, b);
    assert_int_equal(en_dg_decode(b, sizeof(b), 1400, &out), 0);
    assert_true(out.step == EN_DG_STEP_MAX && out.seq == EN_DG_SEQ_MAX &&
                out.job == EN_DG_JOB_MASK);
    assert_true(en_dg_job("a token") <= EN_DG_JOB_MASK);
    /* and the good one still passes */
    en_dg_encode(&H, b);
    assert_int_equal(en_dg_decode(b, sizeof(b), 1400, &out), 0);
}

static void test_bitmap(void **state)
{
    (void)state;
    en_dg_bitmap_t b;
    assert_int_equal(en_dg_bitmap_init(&b, 130), 0);
    assert_int_equal(en_dg_bitmap_next_missing(&b, 0), 0);
    for (uint32_t i = 0; i < 130; i++)
        if (i != 64 && i != 129) assert_int_equal(en_dg_bitmap_set(&b, i), 1);
    assert_int_equal(en_dg_bitmap_set(&b, 3), 0); /* a duplicate */
    assert_int_equal(en_dg_bitmap_set(&b, 130), COH_EINVAL);
    assert_int_equal(b.got, 128);
    assert_true(en_dg_bitmap_test(&b, 63));
    assert_false(en_dg_bitmap_test(&b, 64));
    assert_false(en_dg_bitmap_test(&b, 500));
    assert_int_equal(en_dg_bitmap_next_missing(&b, 0), 64);
    assert_int_equal(en_dg_bitmap_next_missing(&b, 65), 129);
    assert_int_equal(en_dg_bitmap_set(&b, 64), 1);
    assert_int_equal(en_dg_bitmap_set(&b, 129), 1);
    assert_int_equal(en_dg_bitmap_next_missing(&b, 0), 130);
    en_dg_bitmap_clear(&b);
    assert_int_equal(b.got, 0);
    assert_int_equal(en_dg_bitmap_next_missing(&b, 5), 5);
    en_dg_bitmap_fini(&b);
}

static void test_bound_accounting(void **state)
{
    (void)state;
    /* 10 segments of 1000 bytes, the last one 500: 9500 bytes. */
    uint64_t total = 9500;
    assert_int_equal(en_dg_nseg(total, 1000), 10);
    assert_int_equal(en_dg_nseg(9000, 1000), 9);
    assert_int_equal(en_dg_nseg(0, 1000), 0);
    en_dg_bitmap_t b;
    assert_int_equal(en_dg_bitmap_init(&b, 10), 0);
    for (uint32_t i = 0; i < 10; i++)
        if (i != 2 && i != 3 && i != 7) en_dg_bitmap_set(&b, i);
    assert_int_equal(en_dg_bytes_got(&b, total, 1000), 6500); /* 6 whole + the short last */
    en_dg_range_t r[4];
    assert_int_equal(en_dg_missing(&b, r, 4), 2);
    assert_int_equal(r[0].first, 2);
    assert_int_equal(r[0].count, 2);
    assert_int_equal(r[1].first, 7);
    assert_int_equal(r[1].count, 1);
    assert_int_equal(en_dg_missing(&b, r, 1), 2); /* counts past cap */
    /* 3000 of 9500 missing: 31.6% */
    assert_false(en_dg_bound_met(6500, total, 0.30));
    assert_true(en_dg_bound_met(6500, total, 0.32));
    assert_false(en_dg_bound_met(6500, total, 0));
    en_dg_bitmap_set(&b, 2);
    en_dg_bitmap_set(&b, 3);
    en_dg_bitmap_set(&b, 7);
    assert_int_equal(en_dg_bytes_got(&b, total, 1000), total);
    assert_true(en_dg_bound_met(total, total, 0));
    /* the bound is on bytes: 1% of 100000 is 1000 missing at most */
    assert_true(en_dg_bound_met(99000, 100000, 0.01));
    assert_false(en_dg_bound_met(98999, 100000, 0.01));
    en_dg_bitmap_fini(&b);
}

static void test_rate_control(void **state)
{
    (void)state;
    en_rc_t rc;
    en_rc_init(&rc, 1e9, 2, 0.05);
    assert_int_equal(rc.state, EN_RC_LINE);
    assert_true(rc.rate_bps == 1e9);
    /* The receiver keeps up: a line-rate flow stays there. */
    en_rc_report(&rc, 1e9, 0.9e9);
    assert_int_equal(rc.state, EN_RC_LINE);
    assert_true(rc.rate_bps == 1e9);
    /* Sending more than delta x receiving: halve, congestion avoidance. */
    en_rc_report(&rc, 1e9, 0.4e9);
    assert_int_equal(rc.state, EN_RC_AVOID);
    assert_true(rc.rate_bps == 0.5e9);
    /* In avoidance, a healthy period adds 5% of the line rate. */
    en_rc_report(&rc, 0.5e9, 0.5e9);
    assert_true(fabs(rc.rate_bps - 0.55e9) < 1);
    en_rc_report(&rc, 0.55e9, 0.2e9); /* 0.55 > 2 x 0.2: halve again */
    assert_true(fabs(rc.rate_bps - 0.275e9) < 1);
    assert_int_equal(rc.halvings, 2);
    /* Never above the line rate. */
    for (int i = 0; i < 100; i++) en_rc_report(&rc, rc.rate_bps, rc.rate_bps);
    assert_true(rc.rate_bps == 1e9);
    assert_int_equal(rc.state, EN_RC_AVOID);
    /* A period with nothing sent says nothing; a floor under halving. */
    en_rc_report(&rc, 0, 0);
    assert_true(rc.rate_bps == 1e9);
    for (int i = 0; i < 40; i++) en_rc_report(&rc, 1e9, 0);
    assert_true(rc.rate_bps == 1e9 / 1024);
    /* Retransmission: back to line rate start. */
    en_rc_retransmit(&rc);
    assert_int_equal(rc.state, EN_RC_LINE);
    assert_true(rc.rate_bps == 1e9);
}

static void test_pacer(void **state)
{
    (void)state;
    /* 1500-byte datagrams at 12 Mbit/s: one per millisecond. */
    en_pacer_t p = {0};
    uint64_t now = 1000000000ull, burst = 2000000; /* 2 ms of credit at most */
    assert_int_equal(en_pacer_delay(&p, now, 12e6, 1500, burst), 0);
    assert_int_equal(en_pacer_delay(&p, now, 12e6, 1500, burst), 0); /* the burst credit */
    assert_int_equal(en_pacer_delay(&p, now, 12e6, 1500, burst), 0);
    assert_int_equal(en_pacer_delay(&p, now, 12e6, 1500, burst), 1000000);
    assert_int_equal(en_pacer_delay(&p, now, 12e6, 1500, burst), 2000000);
    /* Idle for a second: no backlog of credit beyond the burst. */
    now += 1000000000ull;
    int sent_now = 0;
    while (en_pacer_delay(&p, now, 12e6, 1500, burst) == 0) sent_now++;
    assert_int_equal(sent_now, 3);
    /* No rate: no pacing. */
    assert_int_equal(en_pacer_delay(&p, now, 0, 1500, burst), 0);
}

/* Spraying per datagram: the path whose pacers free first, in turn on a tie. */
static void test_spray_pick(void **state)
{
    (void)state;
    uint64_t now = 1000000000ull, burst = 1000000; /* 1 ms of credit */
    uint64_t next[2] = {now, now};
    assert_int_equal(en_dg_spray_pick(next, 2, 3, 0, now), 0);
    assert_int_equal(en_dg_spray_pick(next, 2, 3, 1, now), 1); /* tie: in turn */
    assert_int_equal(en_dg_spray_pick(next, 2, 2, 0, now), 1); /* path 0 not available */
    next[1] = now + 1;
    assert_int_equal(en_dg_spray_pick(next, 2, 2, 0, now), -1); /* not yet */
    assert_int_equal(en_dg_spray_pick(next, 2, 0, 0, now), -1);
    /* Two paths at 400 and 100 Mbit/s, 1500-byte datagrams, for 50 ms. */
    double rate[2] = {400e6, 100e6};
    for (int equal = 0; equal < 2; equal++) {
        en_pacer_t pc[2] = {{now - burst}, {now - burst}};
        int count[2] = {0, 0}, run = 0, maxrun = 0, prev = -1, turn = 0;
        for (uint64_t t = now; t < now + 50000000ull; t += 100000) { /* 0.1 ms ticks */
            for (;;) {
                for (int k = 0; k < 2; k++) next[k] = pc[k].next_ns;
                int k = en_dg_spray_pick(next, 2, 3, turn++ % 2, t);
                if (k < 0) break;
                en_pacer_delay(&pc[k], t, equal ? 400e6 : rate[k], 1500, burst);
                count[k]++;
                run = k == prev ? run + 1 : 1;
                if (run > maxrun) maxrun = run;
                prev = k;
            }
        }
        int total = count[0] + count[1];
        if (equal) {
            /* Alternating: halves, and never two in a row on one path
             * once both pacers are running. */
            assert_true(abs(count[0] - count[1]) <= 1);
            assert_true(maxrun <= 2);
        } else {
            /* A fifth on the slow path, in runs of about 4 on the fast one. */
            assert_true(count[1] * 100 >= total * 19 && count[1] * 100 <= total * 21);
            assert_true(maxrun <= 5);
        }
    }
}

static void test_tags(void **state)
{
    (void)state;
    /* 20 layers over 8 priorities: floor(x * 8 / 20) */
    assert_int_equal(en_tag_prio(0, 20, 8), 0);
    assert_int_equal(en_tag_prio(2, 20, 8), 0);
    assert_int_equal(en_tag_prio(3, 20, 8), 1);
    assert_int_equal(en_tag_prio(10, 20, 8), 4);
    assert_int_equal(en_tag_prio(19, 20, 8), 7);
    assert_int_equal(en_tag_prio(25, 20, 8), 7); /* past the last layer */
    assert_int_equal(en_tag_prio(-1, 20, 8), 0); /* no layer */
    assert_int_equal(en_tag_prio(3, 0, 8), 0);
    assert_int_equal(en_tag_tos(0, false), 0x00);
    assert_int_equal(en_tag_tos(5, false), 0xa0); /* CS5 */
    assert_int_equal(en_tag_tos(7, true), 0xe2);  /* CS7, ECT(0) */
    assert_int_equal(en_tag_tos(9, false), 0xe0);
    /* The median of |x| from a sample: values 0..9999 (signs alternate). */
    size_t n = 10000;
    float *x = malloc(n * sizeof(float));
    double *d = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) {
        x[i] = (float)(i % 2 ? -(double)i : (double)i);
        d[i] = x[i];
    }
    double m = en_tag_median(x, n, 4, 0.001); /* 16 samples: about 5000 */
    assert_true(m > 4000 && m < 6000);
    assert_true(fabs(en_tag_median(d, n, 8, 1.0) - 4999.5) < 1e-9); /* every value */
    assert_true(en_tag_median(x, 0, 4, 0.001) == 0);
    /* A datagram's mean magnitude against it. */
    assert_true(en_tag_important(x + 9000, 100, 4, m));
    assert_false(en_tag_important(x, 100, 4, m));
    assert_false(en_tag_important(x, 0, 4, m));
    /* Lengths that are no multiple of the four sums: the rest counts too. */
    float v[7] = {1, -1, 1, -1, 1, -1, -8};
    assert_true(en_tag_important(v, 7, 4, 1.9)); /* mean 2 */
    assert_false(en_tag_important(v, 7, 4, 2.1));
    assert_false(en_tag_important(v, 6, 4, 1.0)); /* mean 1: not above */
    double w[3] = {-3, 3, 3};
    assert_true(en_tag_important(w, 3, 8, 2.9));
    assert_false(en_tag_important(w, 3, 8, 3.0));
    free(x);
    free(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_header_layout_roundtrip),
        cmocka_unit_test(test_header_refusals),
        cmocka_unit_test(test_bitmap),
        cmocka_unit_test(test_bound_accounting),
        cmocka_unit_test(test_rate_control),
        cmocka_unit_test(test_pacer),
        cmocka_unit_test(test_spray_pick),
        cmocka_unit_test(test_tags),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
