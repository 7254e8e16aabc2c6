/*
 * frame_fuzzer - the data-plane frame header decoder (en_hdr_decode) fed as a
 * TCP stream would feed it: in pieces of random size, and as a stream of
 * frames.
 *
 * Invariants: a prefix shorter than a header is "need more" or a refusal,
 * never a header; a refused prefix stays refused with more bytes; a decoded
 * header re-encodes to the same 48 bytes.
 */
#include "cohort.h"
#include "engines/en_frame.h"
#include "fuzz/fuzz.h"

static int same(const en_hdr_t *a, const en_hdr_t *b)
{
    return a->type == b->type && a->flags == b->flags && a->comm == b->comm && a->tag == b->tag &&
           a->seq == b->seq && a->sig == b->sig && a->off == b->off && a->len == b->len;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    en_hdr_t full;
    uint8_t *all = fuzz_copy(data, size);
    int fst = en_hdr_decode(all, size, &full);
    FUZZ_CHECK(fst == 0 || fst == EN_HDR_SIZE || fst == COH_EPROTO);
    if (fst == 0) FUZZ_CHECK(size < EN_HDR_SIZE);
    if (fst == EN_HDR_SIZE) {
        uint8_t re[EN_HDR_SIZE];
        en_hdr_encode(&full, re);
        FUZZ_CHECK(memcmp(re, data, EN_HDR_SIZE) == 0);
    }
    /* Resumable: the bytes arrive in pieces. */
    fuzz_split_t sp;
    fuzz_split_init(&sp, data, size);
    for (size_t n = 0; n <= size; n += fuzz_split_next(&sp)) {
        uint8_t *pre = fuzz_copy(data, n);
        en_hdr_t h;
        int st = en_hdr_decode(pre, n, &h);
        free(pre);
        if (n < EN_HDR_SIZE) FUZZ_CHECK(st == 0 || st == COH_EPROTO);
        if (st == COH_EPROTO) FUZZ_CHECK(fst == COH_EPROTO);
        if (st == EN_HDR_SIZE) FUZZ_CHECK(fst == EN_HDR_SIZE && same(&h, &full));
        if (st != 0) break;
    }
    /* A stream: header, payload (as much as there is), next header. */
    size_t off = 0;
    while (off < size) {
        en_hdr_t h;
        int st = en_hdr_decode(all + off, size - off, &h);
        if (st <= 0) break;
        off += EN_HDR_SIZE;
        FUZZ_CHECK(h.len <= EN_MAX_PAYLOAD);
        off += h.len < size - off ? (size_t)h.len : size - off;
    }
    free(all);
    return 0;
}
