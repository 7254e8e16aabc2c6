/*
 * hello_fuzzer - the connection handshake: en_hello_decode and the job-token
 * check, the first bytes any peer (or stranger) sends.
 *
 * Input: byte 0 = length of the expected token (mod 65), then that many
 * token bytes, then the HELLO bytes. Invariants: prefixes are "need more" or
 * refused; a decoded HELLO re-encodes to the same bytes and respects the
 * limits the decoder promises; the token check agrees with a plain
 * comparison of the zero-padded tokens.
 */
#include "cohort.h"
#include "engines/en_frame.h"
#include "fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    size_t tlen = data[0] % (EN_TOKEN_MAX + 1);
    if (size < 1 + tlen) return 0;
    char token[EN_TOKEN_MAX + 1];
    memcpy(token, data + 1, tlen);
    token[tlen] = '\0';
    const uint8_t *hb = data + 1 + tlen;
    size_t hn = size - 1 - tlen;

    uint8_t *all = fuzz_copy(hb, hn);
    en_hello_t h;
    int fst = en_hello_decode(all, hn, &h);
    FUZZ_CHECK(fst == 0 || fst == EN_HELLO_SIZE || fst == COH_EPROTO);
    if (fst == 0) FUZZ_CHECK(hn < EN_HELLO_SIZE);
    if (fst == EN_HELLO_SIZE) {
        FUZZ_CHECK(h.version == EN_PROTO_VERSION);
        FUZZ_CHECK(h.kind >= EN_HELLO_DATA && h.kind <= EN_HELLO_CTRL);
        FUZZ_CHECK(h.world > 0 && h.rank < h.world);
        uint8_t re[EN_HELLO_SIZE];
        en_hello_encode(&h, re);
        FUZZ_CHECK(memcmp(re, hb, EN_HELLO_SIZE) == 0);
        uint8_t want[EN_TOKEN_MAX] = {0};
        memcpy(want, token, strlen(token));
        int same = memcmp(want, h.token, EN_TOKEN_MAX) == 0;
        FUZZ_CHECK(en_hello_token_ok(&h, token) == same);
        /* Setting the token and checking it again must agree. */
        en_hello_t mine = h;
        en_hello_set_token(&mine, token);
        FUZZ_CHECK(en_hello_token_ok(&mine, token) == 1);
    }
    fuzz_split_t sp;
    fuzz_split_init(&sp, data, size);
    for (size_t n = 0; n <= hn; n += fuzz_split_next(&sp)) {
        uint8_t *pre = fuzz_copy(hb, n);
        en_hello_t p;
        int st = en_hello_decode(pre, n, &p);
        free(pre);
        if (n < EN_HELLO_SIZE) FUZZ_CHECK(st == 0 || st == COH_EPROTO);
        if (st == COH_EPROTO) FUZZ_CHECK(fst == COH_EPROTO);
        if (st == EN_HELLO_SIZE) FUZZ_CHECK(fst == EN_HELLO_SIZE);
        if (st != 0) break;
    }
    free(all);
    return 0;
}
