/*
 * The rail balancer's published table (docs/multirail.md): sc_lb_pack /
 * sc_lb_unpack are exact (an unpacked table splits exactly as the original)
 * and refuse malformed bytes; the control messages that carry tables
 * (RX_CTL_LBTAB) and rail events (RX_CTL_RAIL) round-trip and refuse
 * malformed input, as does the heartbeat datagram (BEAT, rx_ctl.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "cohort.h"
#include "reactor/rx_ctl.h"
#include "sched/sc_lb.h"

static sc_lb_t *trained(int n)
{
    sc_lb_t *lb;
    assert_int_equal(sc_lb_create(n, NULL, &lb), 0);
    for (int i = 0; i < 50; i++)
        for (int r = 0; r < n; r++) {
            sc_lb_observe(lb, r, 1000 + (uint64_t)i * 37, 13e-6 + r * 1e-6 + i * 1e-9);
            sc_lb_observe(lb, r, (1u << 20) + (uint64_t)i * 4096, 1e-3 * (r + 1) + i * 1.1e-7);
        }
    sc_lb_set_up(lb, n - 1, false);
    return lb;
}

static void test_pack_is_exact(void **state)
{
    (void)state;
    sc_lb_t *a = trained(3), *b;
    static uint8_t buf[SC_LB_PACK_MAX];
    int len = sc_lb_pack(a, buf, sizeof(buf));
    assert_true(len > 40);
    assert_int_equal(sc_lb_create(3, NULL, &b), 0);
    assert_int_equal(sc_lb_unpack(b, buf, (size_t)len), 0);
    assert_false(sc_lb_is_up(b, 2));
    for (uint64_t bytes = 1; bytes < (64u << 20); bytes = bytes * 3 + 1)
        for (uint64_t idx = 0; idx < 3; idx++) {
            sc_lb_plan_t pa, pb;
            assert_int_equal(sc_lb_split(a, bytes, 4, idx * 64 + 1, &pa), 0);
            assert_int_equal(sc_lb_split(b, bytes, 4, idx * 64 + 1, &pb), 0);
            assert_memory_equal(pa.bytes, pb.bytes, sizeof(pa.bytes));
            assert_true(pa.expect_s == pb.expect_s);
        }
    /* Packing the unpacked table gives the same bytes. */
    static uint8_t again[SC_LB_PACK_MAX];
    assert_int_equal(sc_lb_pack(b, again, sizeof(again)), len);
    assert_memory_equal(buf, again, (size_t)len);
    /* Too small a buffer. */
    assert_int_equal(sc_lb_pack(a, buf, 39), COH_EINVAL);
    assert_int_equal(sc_lb_pack(a, buf, (size_t)len - 1), COH_EINVAL);
    sc_lb_destroy(a);
    sc_lb_destroy(b);
}

static void test_unpack_refuses_malformed(void **state)
{
    (void)state;
    sc_lb_t *a = trained(2), *b, *c4;
    static uint8_t good[SC_LB_PACK_MAX], bad[SC_LB_PACK_MAX];
    int len = sc_lb_pack(a, good, sizeof(good));
    assert_int_equal(sc_lb_create(2, NULL, &b), 0);
    assert_int_equal(sc_lb_create(4, NULL, &c4), 0);
    char before[4096], after[4096];
    assert_true(sc_lb_dump(b, before, sizeof(before)) > 0);
    /* Another rail count. */
    assert_int_equal(sc_lb_unpack(c4, good, (size_t)len), COH_EINVAL);
    /* Truncated, or with a byte too many. */
    for (int l = 0; l < len; l++) assert_int_equal(sc_lb_unpack(b, good, (size_t)l), COH_EINVAL);
    memcpy(bad, good, (size_t)len);
    bad[len] = 0;
    assert_int_equal(sc_lb_unpack(b, bad, (size_t)len + 1), COH_EINVAL);
    struct {
        int off;
        uint8_t v;
    } flips[] = {
        {0, 'X'},     /* magic */
        {5, 1},       /* reserved */
        {6, 0x04},    /* up mask: a rail that does not exist */
        {15, 0x80},   /* tolerance negative */
        {23, 0x7f},   /* gain huge */
        {36, 99},     /* entry count */
        {40, 7},      /* entry: rail 7 */
        {41, 41},     /* entry: bucket 41 */
        {42, 1},      /* entry: reserved */
        {44 + 16, 0}, /* second entry: n = 0 (low byte) */
        {55, 0xff},   /* first entry: value NaN */
    };
    for (size_t i = 0; i < sizeof(flips) / sizeof(flips[0]); i++) {
        memcpy(bad, good, (size_t)len);
        if (flips[i].off == 44 + 16)
            memset(bad + 44 + 16, 0, 4);
        else if (flips[i].off == 55)
            memset(bad + 48, 0xff, 8);
        else
            bad[flips[i].off] = flips[i].v;
        assert_int_equal(sc_lb_unpack(b, bad, (size_t)len), COH_EINVAL);
    }
    /* A duplicate entry. */
    memcpy(bad, good, (size_t)len);
    memcpy(bad + 56, bad + 40, 16);
    assert_int_equal(sc_lb_unpack(b, bad, (size_t)len), COH_EINVAL);
    /* Refused input leaves the table as it was. */
    assert_true(sc_lb_dump(b, after, sizeof(after)) > 0);
    assert_string_equal(before, after);
    assert_int_equal(sc_lb_unpack(b, good, (size_t)len), 0);
    sc_lb_destroy(a);
    sc_lb_destroy(b);
    sc_lb_destroy(c4);
}

static void test_ctl_lbtab_and_rail(void **state)
{
    (void)state;
    uint8_t table[300], buf[RX_CTL_HDR + 16 + sizeof(table)];
    for (size_t i = 0; i < sizeof(table); i++) table[i] = (uint8_t)(i * 7);
    rx_ctl_msg_t m = {.type = RX_CTL_LBTAB};
    m.u.lbtab = (rx_ctl_lbtab_t){
        .epoch = 1234567890123ull, .more = 15, .len = sizeof(table), .table = table};
    int n = rx_ctl_encode(&m, buf, sizeof(buf));
    assert_int_equal(n, (int)sizeof(buf));
    rx_ctl_msg_t d;
    for (int l = 0; l < n; l++) assert_int_equal(rx_ctl_parse(buf, (size_t)l, &d), l < 4 ? 0 : 0);
    assert_int_equal(rx_ctl_parse(buf, (size_t)n, &d), n);
    assert_int_equal(d.type, RX_CTL_LBTAB);
    assert_true(d.u.lbtab.epoch == 1234567890123ull);
    assert_int_equal(d.u.lbtab.more, 15);
    assert_int_equal(d.u.lbtab.len, sizeof(table));
    assert_memory_equal(d.u.lbtab.table, table, sizeof(table));
    /* The inner length must match the frame's; a table covers at most
     * RX_CTL_LB_MORE more epochs. */
    uint8_t bad[sizeof(buf)];
    memcpy(bad, buf, sizeof(buf));
    bad[RX_CTL_HDR + 8] ^= 1;
    assert_int_equal(rx_ctl_parse(bad, sizeof(bad), &d), COH_EPROTO);
    memcpy(bad, buf, sizeof(buf));
    en_put32(bad + RX_CTL_HDR + 12, RX_CTL_LB_MORE);
    assert_int_equal(rx_ctl_parse(bad, sizeof(bad), &d), (int)sizeof(bad));
    en_put32(bad + RX_CTL_HDR + 12, RX_CTL_LB_MORE + 1);
    assert_int_equal(rx_ctl_parse(bad, sizeof(bad), &d), COH_EPROTO);
    /* Too short for its header, or beyond the table limit: refused from the header. */
    uint8_t hdr[RX_CTL_HDR];
    memcpy(hdr, buf, RX_CTL_HDR);
    hdr[8] = 15;
    hdr[9] = hdr[10] = hdr[11] = 0;
    assert_int_equal(rx_ctl_parse(hdr, sizeof(hdr), &d), COH_EPROTO);
    uint32_t big = 16 + RX_CTL_MAXLB + 1;
    memcpy(hdr + 8, &big, 4);
    assert_int_equal(rx_ctl_parse(hdr, sizeof(hdr), &d), COH_EPROTO);
    /* The encoder refuses what the parser would. */
    m.u.lbtab.len = RX_CTL_MAXLB + 1;
    static uint8_t huge[RX_CTL_HDR + 16 + RX_CTL_MAXLB + 1];
    static uint8_t src[RX_CTL_MAXLB + 1];
    m.u.lbtab.table = src;
    assert_int_equal(rx_ctl_encode(&m, huge, sizeof(huge)), COH_EINVAL);
    m.u.lbtab.len = 5;
    m.u.lbtab.table = NULL;
    assert_int_equal(rx_ctl_encode(&m, huge, sizeof(huge)), COH_EINVAL);
    m.u.lbtab.table = src;
    m.u.lbtab.more = RX_CTL_LB_MORE + 1;
    assert_int_equal(rx_ctl_encode(&m, huge, sizeof(huge)), COH_EINVAL);

    /* RAIL */
    rx_ctl_msg_t r = {.type = RX_CTL_RAIL};
    r.u.rail = (rx_ctl_rail_t){.rank = 3, .rail = 1, .peer = 2, .kind = 2};
    uint8_t rb[RX_CTL_HDR + 16];
    assert_int_equal(rx_ctl_encode(&r, rb, sizeof(rb)), (int)sizeof(rb));
    assert_int_equal(rx_ctl_parse(rb, sizeof(rb), &d), (int)sizeof(rb));
    assert_int_equal(d.type, RX_CTL_RAIL);
    assert_int_equal(d.u.rail.rank, 3);
    assert_int_equal(d.u.rail.rail, 1);
    assert_int_equal(d.u.rail.peer, 2);
    assert_int_equal(d.u.rail.kind, 2);
    uint8_t rbad[sizeof(rb)];
    for (uint32_t kind = 0; kind < 6; kind += 4) { /* 0 and 4: no such event */
        memcpy(rbad, rb, sizeof(rb));
        memcpy(rbad + RX_CTL_HDR + 12, &kind, 4);
        assert_int_equal(rx_ctl_parse(rbad, sizeof(rbad), &d), COH_EPROTO);
    }
    memcpy(rbad, rb, sizeof(rb));
    rbad[RX_CTL_HDR + 4] = RX_MAX_RAILS; /* no such rail */
    assert_int_equal(rx_ctl_parse(rbad, sizeof(rbad), &d), COH_EPROTO);
    memcpy(rbad, rb, sizeof(rb));
    rbad[8] = 12; /* wrong length */
    assert_int_equal(rx_ctl_parse(rbad, sizeof(rbad), &d), COH_EPROTO);
}

static void test_beat(void **state)
{
    (void)state;
    uint64_t v = rx_beat_value("job-token");
    assert_true(v != rx_beat_value("job-tokeN")); /* another job's beats do not count */
    uint8_t b[RX_BEAT_LEN];
    rx_beat_encode(b, RX_BEAT_TO_MEMBER, 2, 4, v);
    rx_beat_kind kind = 0;
    uint32_t rank = 99;
    assert_int_equal(rx_beat_decode(b, sizeof(b), 4, v, &kind, &rank), 0);
    assert_int_equal(kind, RX_BEAT_TO_MEMBER);
    assert_int_equal(rank, 2);
    rx_beat_encode(b, RX_BEAT_TO_COORD, 3, 4, v);
    assert_int_equal(rx_beat_decode(b, sizeof(b), 4, v, &kind, &rank), 0);
    assert_int_equal(kind, RX_BEAT_TO_COORD);
    assert_int_equal(rank, 3);
    /* Every byte matters: any one changed is refused. */
    for (size_t i = 0; i < sizeof(b); i++) {
        uint8_t bad[RX_BEAT_LEN];
        memcpy(bad, b, sizeof(b));
        bad[i] ^= (uint8_t)(i == 5 ? 2 : 0x40); /* kind 1 -> 3: no such kind */
        assert_int_equal(rx_beat_decode(bad, sizeof(bad), 4, v, &kind, &rank), COH_EPROTO);
    }
    assert_int_equal(rx_beat_decode(b, sizeof(b) - 1, 4, v, &kind, &rank), COH_EPROTO);
    uint8_t longer[RX_BEAT_LEN + 1] = {0};
    memcpy(longer, b, sizeof(b));
    assert_int_equal(rx_beat_decode(longer, sizeof(longer), 4, v, &kind, &rank), COH_EPROTO);
    assert_int_equal(rx_beat_decode(b, sizeof(b), 5, v, &kind, &rank), COH_EPROTO); /* world */
    assert_int_equal(rx_beat_decode(b, sizeof(b), 4, v + 1, &kind, &rank), COH_EPROTO);
    rx_beat_encode(b, RX_BEAT_TO_COORD, 4, 4, v); /* rank outside the world */
    assert_int_equal(rx_beat_decode(b, sizeof(b), 4, v, &kind, &rank), COH_EPROTO);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pack_is_exact),
        cmocka_unit_test(test_unpack_refuses_malformed),
        cmocka_unit_test(test_ctl_lbtab_and_rail),
        cmocka_unit_test(test_beat),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
