/*
 * store_fuzzer - the bootstrap store's message parser (rx_store_parse), fed
 * as a stream in pieces of random size, then as a stream of messages.
 *
 * Invariants: the parser never claims more bytes than it was given; a
 * refused prefix stays refused; a parsed message re-encodes to the same
 * bytes and its key and value lie inside the buffer.
 */
#include "cohort.h"
#include "fuzz/fuzz.h"
#include "reactor/rx_store.h"

static void check_msg(const uint8_t *buf, size_t len, int n, const rx_store_msg_t *m)
{
    FUZZ_CHECK(n >= RX_STORE_HDR && (size_t)n <= len);
    FUZZ_CHECK(m->klen <= RX_STORE_KEY_MAX && m->vlen <= RX_STORE_VAL_MAX);
    FUZZ_CHECK(m->key == buf + RX_STORE_HDR && m->val == m->key + m->klen);
    FUZZ_CHECK((size_t)n == RX_STORE_HDR + m->klen + m->vlen);
    uint8_t *re = malloc((size_t)n);
    FUZZ_CHECK(re != NULL);
    int e = rx_store_encode(m->type, m->status, m->arg, m->key, m->klen, m->val, m->vlen, re,
                            (size_t)n);
    FUZZ_CHECK(e == n && memcmp(re, buf, (size_t)n) == 0);
    free(re);
}

static int parse(const uint8_t *buf, size_t len, void *m)
{
    return rx_store_parse(buf, len, m);
}

static void check(const uint8_t *buf, size_t len, int n, const void *m)
{
    check_msg(buf, len, n, m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    rx_store_msg_t m;
    fuzz_message_stream(data, size, &m, parse, check, COH_EPROTO);
    return 0;
}
