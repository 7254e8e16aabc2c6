/*
 * fuzz.h - helpers shared by the fuzz targets.
 *
 * Every target is a libFuzzer LLVMFuzzerTestOneInput. With -DCOHORT_FUZZ=ON
 * (clang) each is linked with -fsanitize=fuzzer into <name>_fuzzer; in every
 * other build replay_main.c drives it over the committed corpus
 * (fuzz/corpus/<name>/), c-ares' test/ares-fuzz.c style, so every CI build,
 * ASan included, replays the corpora.
 *
 * A broken invariant calls FUZZ_CHECK's trap: libFuzzer reports it as a crash
 * and keeps the input.
 */
#ifndef COH_FUZZ_H
#define COH_FUZZ_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_CHECK(cond)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: invariant broken: %s\n", __FILE__, __LINE__, #cond);           \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A heap copy of exactly n bytes, so that ASan sees a read past the end of
 * a prefix (libFuzzer's own buffer is only as long as the whole input). */
static inline uint8_t *fuzz_copy(const uint8_t *data, size_t n)
{
    uint8_t *p = malloc(n ? n : 1);
    FUZZ_CHECK(p != NULL);
    if (n) memcpy(p, data, n);
    return p;
}

/* Split points for feeding an input to a resumable parser in pieces: a
 * xorshift generator seeded from the input, steps of 1..16 bytes. */
typedef struct fuzz_split {
    uint64_t s;
} fuzz_split_t;

static inline void fuzz_split_init(fuzz_split_t *sp, const uint8_t *data, size_t size)
{
    uint64_t h = 1469598103934665603ull ^ size;
    for (size_t i = 0; i < size && i < 64; i++) h = (h ^ data[i]) * 1099511628211ull;
    sp->s = h | 1;
}

static inline size_t fuzz_split_next(fuzz_split_t *sp)
{
    sp->s ^= sp->s << 13;
    sp->s ^= sp->s >> 7;
    sp->s ^= sp->s << 17;
    return 1 + (size_t)(sp->s % 16);
}

/*
 * The checks every resumable message parser gets (store, control plane):
 * the whole input; prefixes of random lengths, which must give the same
 * message or "need more", and whose refusal must stick; and the input as a
 * stream of messages back to back. parse returns the bytes of one message, 0
 * for "need more" or a negative status; check verifies a parsed message.
 */
typedef int (*fuzz_parse_fn)(const uint8_t *buf, size_t len, void *msg);
typedef void (*fuzz_check_fn)(const uint8_t *buf, size_t len, int n, const void *msg);

static inline void fuzz_message_stream(const uint8_t *data, size_t size, void *msg,
                                       fuzz_parse_fn parse, fuzz_check_fn check, int refused)
{
    uint8_t *all = fuzz_copy(data, size);
    int fst = parse(all, size, msg);
    FUZZ_CHECK(fst >= 0 || fst == refused);
    if (fst > 0) check(all, size, fst, msg);
    fuzz_split_t sp;
    fuzz_split_init(&sp, data, size);
    for (size_t n = 0; n <= size; n += fuzz_split_next(&sp)) {
        uint8_t *pre = fuzz_copy(data, n);
        int st = parse(pre, n, msg);
        if (st > 0) {
            check(pre, n, st, msg);
            FUZZ_CHECK(st == fst);
        }
        free(pre);
        if (st == refused) FUZZ_CHECK(fst == refused);
        if (st != 0) break;
    }
    size_t off = 0;
    while (off < size) {
        int st = parse(all + off, size - off, msg);
        if (st <= 0) break;
        check(all + off, size - off, st, msg);
        off += (size_t)st;
    }
    free(all);
}

#endif
