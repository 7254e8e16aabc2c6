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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *all = fuzz_copy(data, size);
    rx_store_msg_t full;
    int fst = rx_store_parse(all, size, &full);
    FUZZ_CHECK(fst >= 0 || fst == COH_EPROTO);
    if (fst > 0) check_msg(all, size, fst, &full);
    fuzz_split_t sp;
    fuzz_split_init(&sp, data, size);
    for (size_t n = 0; n <= size; n += fuzz_split_next(&sp)) {
        uint8_t *pre = fuzz_copy(data, n);
        rx_store_msg_t m;
        int st = rx_store_parse(pre, n, &m);
        if (st > 0) {
            check_msg(pre, n, st, &m);
            FUZZ_CHECK(st == fst);
        }
        free(pre);
        if (st == COH_EPROTO) FUZZ_CHECK(fst == COH_EPROTO);
        if (st != 0) break;
    }
    size_t off = 0;
    while (off < size) {
        rx_store_msg_t m;
        int st = rx_store_parse(all + off, size - off, &m);
        if (st <= 0) break;
        check_msg(all + off, size - off, st, &m);
        off += (size_t)st;
    }
    free(all);
    return 0;
}
