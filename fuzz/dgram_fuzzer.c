/*
 * dgram_fuzzer - the bounded-loss transport's datagram header decoder
 * (en_dg_decode), fed whole datagrams as a UDP socket delivers them, with
 * the segment size taken from the input's last two bytes (so the fuzzer
 * explores it too).
 *
 * Invariants: a decoded header describes exactly the payload it came with
 * (len is the bytes after the header, never more than one segment), starts
 * where its segment number says, cannot overflow, and re-encodes to the
 * same bytes; cut by a byte, it is a payload a byte shorter (or too short
 * for a header); the bitmap a receiver keeps never counts a segment twice.
 */
#include "cohort.h"
#include "engines/en_dgram.h"
#include "fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2) return 0;
    uint32_t seg = (uint32_t)data[size - 2] << 8 | data[size - 1];
    size_t n = size - 2;
    uint8_t *b = fuzz_copy(data, n);
    en_dg_hdr_t h;
    int st = en_dg_decode(b, n, seg, &h);
    FUZZ_CHECK(st == 0 || st == COH_EPROTO);
    if (st == 0) {
        FUZZ_CHECK(n >= EN_DG_HDR && (size_t)h.len == n - EN_DG_HDR);
        FUZZ_CHECK(seg > 0 && h.len <= seg && h.offset == (uint64_t)h.segno * seg);
        FUZZ_CHECK(h.offset <= UINT64_MAX - h.len);
        uint8_t re[EN_DG_HDR];
        en_dg_encode(&h, re);
        FUZZ_CHECK(memcmp(re, b, EN_DG_HDR) == 0);
        /* One byte less: a payload a byte shorter, or no header at all. */
        en_dg_hdr_t c;
        int cut = en_dg_decode(b, n - 1, seg, &c);
        FUZZ_CHECK(n > EN_DG_HDR ? cut == 0 && c.len + 1 == h.len && c.segno == h.segno
                                 : cut == COH_EPROTO);
        /* A receiver's bitmap over a transfer of 64 segments: a datagram
         * for a segment past it is refused, a repeat is a duplicate. */
        en_dg_bitmap_t bm;
        FUZZ_CHECK(en_dg_bitmap_init(&bm, 64) == 0);
        int first = en_dg_bitmap_set(&bm, h.segno);
        FUZZ_CHECK(h.segno < 64 ? first == 1 : first == COH_EINVAL);
        FUZZ_CHECK(en_dg_bitmap_set(&bm, h.segno) != 1);
        FUZZ_CHECK(bm.got == (h.segno < 64 ? 1u : 0u));
        en_dg_bitmap_fini(&bm);
    }
    free(b);
    return 0;
}
