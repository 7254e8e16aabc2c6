/*
 * ctl_fuzzer - the control plane's message parser (rx_ctl_parse: READY, PLAN,
 * DONE, REFUSE, LEAVE between ranks and the coordinator), fed as a stream in
 * pieces of random size, then as a stream of messages.
 *
 * Invariants: the parser never claims more bytes than it was given; a
 * refused prefix stays refused; a parsed message re-encodes to the same
 * bytes; a plan's member list lies inside the buffer.
 */
#include "cohort.h"
#include "fuzz/fuzz.h"
#include "reactor/rx_ctl.h"

static void check_msg(const uint8_t *buf, size_t len, int n, const rx_ctl_msg_t *m)
{
    FUZZ_CHECK(n >= RX_CTL_HDR && (size_t)n <= len);
    FUZZ_CHECK(rx_ctl_size(m) == (size_t)n);
    rx_ctl_msg_t copy = *m;
    uint32_t *members = NULL;
    if (m->type == RX_CTL_PLAN) {
        FUZZ_CHECK(m->u.plan.members + 4 * (size_t)m->u.plan.nmembers == buf + n);
        members = malloc(sizeof(uint32_t) * (m->u.plan.nmembers ? m->u.plan.nmembers : 1));
        FUZZ_CHECK(members != NULL);
        for (uint32_t i = 0; i < m->u.plan.nmembers; i++)
            members[i] = (uint32_t)m->u.plan.members[4 * i] |
                         (uint32_t)m->u.plan.members[4 * i + 1] << 8 |
                         (uint32_t)m->u.plan.members[4 * i + 2] << 16 |
                         (uint32_t)m->u.plan.members[4 * i + 3] << 24;
        copy.u.plan.members_in = members;
    }
    uint8_t *re = malloc((size_t)n);
    FUZZ_CHECK(re != NULL);
    int e = rx_ctl_encode(&copy, re, (size_t)n);
    FUZZ_CHECK(e == n && memcmp(re, buf, (size_t)n) == 0);
    free(re);
    free(members);
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
    return 0;
}
