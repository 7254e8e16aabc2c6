/*
 * ctl_fuzzer - the control plane's message parser (rx_ctl_parse: READY, PLAN,
 * RPLAN, DONE, REFUSE, LEAVE, ... between ranks and the coordinator), fed as a stream in
 * pieces of random size, then as a stream of messages.
 *
 * Invariants: the parser never claims more bytes than it was given; a
 * refused prefix stays refused; a parsed message re-encodes to the same
 * bytes; a plan's member list (a relay plan's ring and late ranks) lies
 * inside the buffer. The input is also a heartbeat datagram (BEAT): one
 * that decodes re-encodes to the same bytes.
 */

#include "cohort.h"
#include "fuzz/fuzz.h"
#include "reactor/rx_ctl.h"

static uint32_t *ranks_of(const uint8_t *p, uint32_t n)
{
    uint32_t *r = malloc(sizeof(uint32_t) * (n ? n : 1));
    FUZZ_CHECK(r != NULL);
    for (uint32_t i = 0; i < n; i++)
        r[i] = (uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 | (uint32_t)p[4 * i + 2] << 16 |
               (uint32_t)p[4 * i + 3] << 24;
    return r;
}

static void check_msg(const uint8_t *buf, size_t len, int n, const rx_ctl_msg_t *m)
{
    FUZZ_CHECK(n >= RX_CTL_HDR && (size_t)n <= len);
    FUZZ_CHECK(rx_ctl_size(m) == (size_t)n);
    rx_ctl_msg_t copy = *m;
    uint32_t *members = NULL, *late = NULL;
    if (m->type == RX_CTL_PLAN) {
        FUZZ_CHECK(m->u.plan.members + 4 * (size_t)m->u.plan.nmembers == buf + n);
        members = ranks_of(m->u.plan.members, m->u.plan.nmembers);
        copy.u.plan.members_in = members;
    }
    if (m->type == RX_CTL_SHRINK || m->type == RX_CTL_GROW || m->type == RX_CTL_SHRUNK) {
        FUZZ_CHECK(m->u.shrink.ranks + 4 * (size_t)m->u.shrink.n == buf + n);
        members = ranks_of(m->u.shrink.ranks, m->u.shrink.n);
        copy.u.shrink.ranks_in = members;
    }
    rx_ctl_link_t *probe = NULL;
    if (m->type == RX_CTL_PROBE) {
        FUZZ_CHECK(m->u.probe.links + 24 * (size_t)m->u.probe.n == buf + n);
        probe = malloc(sizeof(rx_ctl_link_t) * (m->u.probe.n ? m->u.probe.n : 1));
        FUZZ_CHECK(probe != NULL);
        for (uint32_t i = 0; i < m->u.probe.n; i++) rx_ctl_probe_link(&m->u.probe, i, &probe[i]);
        copy.u.probe.links_in = probe;
    }
    if (m->type == RX_CTL_RPLAN) {
        const rx_ctl_rplan_t *r = &m->u.rplan;
        FUZZ_CHECK(r->ring + 4 * (size_t)r->nring == r->late);
        FUZZ_CHECK(r->late + 4 * (size_t)r->nlate == buf + n);
        members = ranks_of(r->ring, r->nring);
        late = ranks_of(r->late, r->nlate);
        copy.u.rplan.ring_in = members;
        copy.u.rplan.late_in = late;
    }
    uint8_t *re = malloc((size_t)n);
    FUZZ_CHECK(re != NULL);
    int e = rx_ctl_encode(&copy, re, (size_t)n);
    FUZZ_CHECK(e == n && memcmp(re, buf, (size_t)n) == 0);
    free(re);
    free(members);
    free(late);
    free(probe);
}

static int parse(const uint8_t *buf, size_t len, void *m)
{
    return rx_ctl_parse(buf, len, m);
}

static void check(const uint8_t *buf, size_t len, int n, const void *m)
{
    check_msg(buf, len, n, m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    rx_ctl_msg_t m;
    fuzz_message_stream(data, size, &m, parse, check, COH_EPROTO);
    /* The world and job value are the input's own, so decodable beats are
     * reached. */
    if (size >= RX_BEAT_LEN) {
        uint32_t world = (uint32_t)data[12] | (uint32_t)data[13] << 8 | (uint32_t)data[14] << 16 |
                         (uint32_t)data[15] << 24;
        uint64_t v = 0;
        for (int i = 7; i >= 0; i--) v = v << 8 | data[16 + i];
        rx_beat_kind kind;
        uint32_t rank;
        if (rx_beat_decode(data, size, world, v, &kind, &rank) == 0) {
            uint8_t re[RX_BEAT_LEN];
            rx_beat_encode(re, kind, rank, world, v);
            FUZZ_CHECK(size == RX_BEAT_LEN && memcmp(re, data, RX_BEAT_LEN) == 0);
            FUZZ_CHECK(rank < world);
        }
    }
    return 0;
}
