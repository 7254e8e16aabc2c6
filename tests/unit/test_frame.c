/*
 * engines/en_frame.h: the data-plane header and HELLO codecs.
 *
 * The wire layout is checked byte by byte against the table in en_frame.h
 * (little-endian), the decoders are fed every prefix of a message (they are
 * resumable: 0 means "need more"), and every field that the decoder must
 * refuse is corrupted in turn.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cohort.h"
#include "engines/en_frame.h"

static void expect_hdr_equal(const en_hdr_t *a, const en_hdr_t *b)
{
    assert_int_equal(a->type, b->type);
    assert_int_equal(a->flags, b->flags);
    assert_int_equal(a->comm, b->comm);
    assert_int_equal(a->tag, b->tag);
    assert_int_equal(a->seq, b->seq);
    assert_int_equal(a->sig, b->sig);
    assert_int_equal(a->off, b->off);
    assert_int_equal(a->len, b->len);
}

static const en_hdr_t SAMPLE = {.type = EN_FRAME_DATA,
                                .comm = 0x01020304u,
                                .tag = 0xA1B2C3D4u,
                                .seq = 0x1122334455667788ull,
                                .sig = 0xCAFEBABEDEADBEEFull,
                                .off = 0x0000000102030405ull,
                                .len = 0x0000000A0B0C0D0Eull};

static void test_hdr_layout(void **state)
{
    (void)state;
    uint8_t b[EN_HDR_SIZE];
    memset(b, 0xEE, sizeof(b));
    en_hdr_encode(&SAMPLE, b);
    static const uint8_t want[EN_HDR_SIZE] = {
        'C',  'O',  'H',  'F',                          /* magic */
        0x01,                                           /* type */
        0x00,                                           /* flags */
        0x00, 0x00,                                     /* reserved */
        0x04, 0x03, 0x02, 0x01,                         /* comm */
        0xD4, 0xC3, 0xB2, 0xA1,                         /* tag */
        0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, /* seq */
        0xEF, 0xBE, 0xAD, 0xDE, 0xBE, 0xBA, 0xFE, 0xCA, /* sig */
        0x05, 0x04, 0x03, 0x02, 0x01, 0x00, 0x00, 0x00, /* off */
        0x0E, 0x0D, 0x0C, 0x0B, 0x0A, 0x00, 0x00, 0x00, /* len */
    };
    assert_memory_equal(b, want, EN_HDR_SIZE);
    assert_int_equal(en_get32(b), EN_FRAME_MAGIC);
}

static void test_hdr_roundtrip(void **state)
{
    (void)state;
    const en_hdr_t cases[] = {
        SAMPLE,
        {.type = EN_FRAME_DATA}, /* all zero: an empty DATA frame */
        {.type = EN_FRAME_DATA,
         .comm = UINT32_MAX,
         .tag = UINT32_MAX,
         .seq = UINT64_MAX,
         .sig = UINT64_MAX,
         .off = EN_MAX_PAYLOAD,
         .len = EN_MAX_PAYLOAD},
        {.type = EN_FRAME_ABORT, .comm = 7, .seq = 9, .len = 4},
        {.type = EN_FRAME_ABORT, .comm = 7, .seq = 9, .len = EN_MAX_ABORT},
        {.type = EN_FRAME_BYE, .comm = 1, .seq = 2, .len = 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        uint8_t b[EN_HDR_SIZE + 16];
        en_hdr_encode(&cases[i], b);
        memset(b + EN_HDR_SIZE, 0x55, 16); /* payload bytes after the header are not read */
        en_hdr_t out;
        memset(&out, 0xEE, sizeof(out));
        assert_int_equal(en_hdr_decode(b, EN_HDR_SIZE, &out), EN_HDR_SIZE);
        expect_hdr_equal(&out, &cases[i]);
        memset(&out, 0xEE, sizeof(out));
        assert_int_equal(en_hdr_decode(b, sizeof(b), &out), EN_HDR_SIZE);
        expect_hdr_equal(&out, &cases[i]);
    }
}

/* Every prefix of a valid header asks for more and leaves the output alone. */
static void test_hdr_resumable(void **state)
{
    (void)state;
    uint8_t b[EN_HDR_SIZE];
    en_hdr_encode(&SAMPLE, b);
    for (size_t len = 0; len < EN_HDR_SIZE; len++) {
        /* a heap buffer of exactly len bytes, so a read past it shows under ASan */
        uint8_t *copy = malloc(len ? len : 1);
        assert_non_null(copy);
        memcpy(copy, b, len);
        en_hdr_t out, before;
        memset(&out, 0xEE, sizeof(out));
        memcpy(&before, &out, sizeof(out));
        int r = en_hdr_decode(copy, len, &out);
        free(copy);
        if (r != 0) print_error("prefix of %zu bytes\n", len);
        assert_int_equal(r, 0);
        assert_memory_equal(&out, &before, sizeof(out));
    }
    en_hdr_t out;
    assert_int_equal(en_hdr_decode(b, EN_HDR_SIZE, &out), EN_HDR_SIZE);
    expect_hdr_equal(&out, &SAMPLE);
}

/* A wrong magic byte is refused as soon as it is present. */
static void test_hdr_bad_magic(void **state)
{
    (void)state;
    for (int pos = 0; pos < 4; pos++) {
        uint8_t b[EN_HDR_SIZE];
        en_hdr_encode(&SAMPLE, b);
        b[pos] ^= 0x20; /* "cOHF", "ChHF", ... */
        en_hdr_t out;
        for (size_t len = 0; len <= EN_HDR_SIZE; len++) {
            int want = len <= (size_t)pos ? 0 : COH_EPROTO;
            int r = en_hdr_decode(b, len, &out);
            if (r != want) print_error("magic byte %d wrong, %zu bytes\n", pos, len);
            assert_int_equal(r, want);
        }
    }
    /* the HELLO magic is not a frame magic */
    uint8_t h[EN_HDR_SIZE];
    en_hdr_encode(&SAMPLE, h);
    en_put32(h, EN_HELLO_MAGIC);
    en_hdr_t out;
    assert_int_equal(en_hdr_decode(h, 4, &out), COH_EPROTO);
}

/* Header fields that cannot be valid: refused once the whole header is in. */
static void test_hdr_invalid_fields(void **state)
{
    (void)state;
    struct {
        const char *what;
        en_hdr_t h;
        int pokepos; /* a raw byte to set, or -1 */
        uint8_t pokeval;
        int want;
    } k[] = {
        {"type 0", {.type = 0}, -1, 0, COH_EPROTO},
        {"type 5", {.type = 5}, -1, 0, COH_EPROTO},
        {"ACK len 0", {.type = EN_FRAME_ACK, .off = 12345}, -1, 0, EN_HDR_SIZE},
        {"ACK len 1", {.type = EN_FRAME_ACK, .len = 1}, -1, 0, COH_EPROTO},
        {"type 0x81", {.type = 0x81}, -1, 0, COH_EPROTO},
        {"type 255", {.type = 255}, -1, 0, COH_EPROTO},
        {"flags 1", {.type = EN_FRAME_DATA, .flags = 1}, -1, 0, COH_EPROTO},
        {"flags 0x80", {.type = EN_FRAME_DATA, .flags = 0x80}, -1, 0, COH_EPROTO},
        {"reserved byte 6", {.type = EN_FRAME_DATA}, 6, 1, COH_EPROTO},
        {"reserved byte 7", {.type = EN_FRAME_DATA}, 7, 0x80, COH_EPROTO},
        {"DATA len max+1", {.type = EN_FRAME_DATA, .len = EN_MAX_PAYLOAD + 1}, -1, 0, COH_EPROTO},
        {"DATA len 2^64-1", {.type = EN_FRAME_DATA, .len = UINT64_MAX}, -1, 0, COH_EPROTO},
        {"DATA off max+1", {.type = EN_FRAME_DATA, .off = EN_MAX_PAYLOAD + 1}, -1, 0, COH_EPROTO},
        {"DATA len max", {.type = EN_FRAME_DATA, .len = EN_MAX_PAYLOAD}, -1, 0, EN_HDR_SIZE},
        {"ABORT len 0", {.type = EN_FRAME_ABORT, .len = 0}, -1, 0, COH_EPROTO},
        {"ABORT len 3", {.type = EN_FRAME_ABORT, .len = 3}, -1, 0, COH_EPROTO},
        {"ABORT len 4", {.type = EN_FRAME_ABORT, .len = 4}, -1, 0, EN_HDR_SIZE},
        {"ABORT len max", {.type = EN_FRAME_ABORT, .len = EN_MAX_ABORT}, -1, 0, EN_HDR_SIZE},
        {"ABORT len max+1", {.type = EN_FRAME_ABORT, .len = EN_MAX_ABORT + 1}, -1, 0, COH_EPROTO},
        {"ABORT len 2^40", {.type = EN_FRAME_ABORT, .len = 1ull << 40}, -1, 0, COH_EPROTO},
        {"BYE len 0", {.type = EN_FRAME_BYE, .len = 0}, -1, 0, EN_HDR_SIZE},
        {"BYE len 1", {.type = EN_FRAME_BYE, .len = 1}, -1, 0, COH_EPROTO},
        {"BYE len 2^63", {.type = EN_FRAME_BYE, .len = 1ull << 63}, -1, 0, COH_EPROTO},
    };
    for (size_t i = 0; i < sizeof(k) / sizeof(k[0]); i++) {
        uint8_t b[EN_HDR_SIZE];
        en_hdr_encode(&k[i].h, b);
        if (k[i].pokepos >= 0) b[k[i].pokepos] = k[i].pokeval;
        en_hdr_t out, before;
        memset(&out, 0xEE, sizeof(out));
        memcpy(&before, &out, sizeof(out));
        int r = en_hdr_decode(b, EN_HDR_SIZE, &out);
        if (r != k[i].want) print_error("case \"%s\"\n", k[i].what);
        assert_int_equal(r, k[i].want);
        if (r < 0) assert_memory_equal(&out, &before, sizeof(out)); /* untouched on refusal */
        /* a prefix of the bad header still only asks for more: the fields are not in yet */
        assert_int_equal(en_hdr_decode(b, EN_HDR_SIZE - 1, &out), 0);
    }
}

/* ---- HELLO ---- */

static en_hello_t sample_hello(void)
{
    en_hello_t h = {.version = EN_PROTO_VERSION,
                    .kind = EN_HELLO_DATA,
                    .rank = 0x01020304u,
                    .world = 0x05060708u,
                    .rail = 0x0A0B0C0Du,
                    .nrails = 0x11121314u};
    en_hello_set_token(&h, "job-token");
    return h;
}

static void expect_hello_equal(const en_hello_t *a, const en_hello_t *b)
{
    assert_int_equal(a->version, b->version);
    assert_int_equal(a->kind, b->kind);
    assert_int_equal(a->rank, b->rank);
    assert_int_equal(a->world, b->world);
    assert_int_equal(a->rail, b->rail);
    assert_int_equal(a->nrails, b->nrails);
    assert_memory_equal(a->token, b->token, EN_TOKEN_MAX);
}

static void test_hello_layout_roundtrip(void **state)
{
    (void)state;
    en_hello_t h = sample_hello();
    uint8_t b[EN_HELLO_SIZE];
    memset(b, 0xEE, sizeof(b));
    en_hello_encode(&h, b);
    static const uint8_t head[24] = {
        'C',  'O',  'H',  'H',  /* magic */
        0x02, 0x00,             /* version */
        0x01, 0x00,             /* kind */
        0x04, 0x03, 0x02, 0x01, /* rank */
        0x08, 0x07, 0x06, 0x05, /* world */
        0x0D, 0x0C, 0x0B, 0x0A, /* rail */
        0x14, 0x13, 0x12, 0x11, /* nrails */
    };
    assert_memory_equal(b, head, sizeof(head));
    uint8_t tok[EN_TOKEN_MAX] = "job-token"; /* zero padded */
    assert_memory_equal(b + 24, tok, EN_TOKEN_MAX);
    static const uint8_t tail[24] = {0}; /* flags, via, resume_off, epoch: no resume */
    assert_memory_equal(b + 24 + EN_TOKEN_MAX, tail, sizeof(tail));
    assert_int_equal(24 + EN_TOKEN_MAX + 24, EN_HELLO_SIZE);

    en_hello_t out;
    memset(&out, 0xEE, sizeof(out));
    assert_int_equal(en_hello_decode(b, EN_HELLO_SIZE, &out), EN_HELLO_SIZE);
    expect_hello_equal(&out, &h);
    assert_true(en_hello_token_ok(&out, "job-token"));

    /* every kind, and the largest valid rank */
    for (uint16_t kind = EN_HELLO_DATA; kind <= EN_HELLO_CTRL; kind++) {
        en_hello_t k = {.version = EN_PROTO_VERSION, .kind = kind, .rank = 2, .world = 3};
        en_hello_encode(&k, b);
        assert_int_equal(en_hello_decode(b, EN_HELLO_SIZE, &out), EN_HELLO_SIZE);
        expect_hello_equal(&out, &k);
    }
    en_hello_t one = {.version = EN_PROTO_VERSION, .kind = EN_HELLO_STORE, .rank = 0, .world = 1};
    en_hello_encode(&one, b);
    assert_int_equal(en_hello_decode(b, EN_HELLO_SIZE, &out), EN_HELLO_SIZE);

    /* a resume carries its flag, the interface and the bytes consumed */
    en_hello_t r = sample_hello();
    r.rank = 1;
    r.world = 4;
    r.flags = EN_HELLO_RESUME;
    r.via = 2;
    r.resume_off = 0x0102030405060708ull;
    r.epoch = 9;
    en_hello_encode(&r, b);
    assert_int_equal(b[104], 9);
    static const uint8_t rt[16] = {0x01, 0,    0,    0,    0x02, 0,    0,    0,
                                   0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01};
    assert_memory_equal(b + 88, rt, sizeof(rt));
    assert_int_equal(en_hello_decode(b, EN_HELLO_SIZE, &out), EN_HELLO_SIZE);
    assert_int_equal(out.flags, EN_HELLO_RESUME);
    assert_int_equal(out.via, 2);
    assert_true(out.resume_off == r.resume_off);
    assert_true(out.epoch == 9);
    /* REJOIN is a flag; unknown flags and absurd interfaces are refused */
    b[88] = EN_HELLO_REJOIN;
    assert_int_equal(en_hello_decode(b, EN_HELLO_SIZE, &out), EN_HELLO_SIZE);
    assert_int_equal(out.flags, EN_HELLO_REJOIN);
    b[88] = 0x04;
    assert_int_equal(en_hello_decode(b, EN_HELLO_SIZE, &out), COH_EPROTO);
    en_hello_encode(&r, b);
    b[93] = 0x10; /* via 4096 */
    assert_int_equal(en_hello_decode(b, EN_HELLO_SIZE, &out), COH_EPROTO);
}

static void test_hello_resumable_and_magic(void **state)
{
    (void)state;
    en_hello_t h = sample_hello();
    uint8_t b[EN_HELLO_SIZE], copy[EN_HELLO_SIZE];
    en_hello_encode(&h, b);
    en_hello_t out;
    for (size_t len = 0; len < EN_HELLO_SIZE; len++) {
        uint8_t *p = malloc(len ? len : 1);
        assert_non_null(p);
        memcpy(p, b, len);
        int r = en_hello_decode(p, len, &out);
        free(p);
        if (r != 0) print_error("prefix of %zu bytes\n", len);
        assert_int_equal(r, 0);
    }
    assert_int_equal(en_hello_decode(b, EN_HELLO_SIZE, &out), EN_HELLO_SIZE);
    for (int pos = 0; pos < 4; pos++) {
        memcpy(copy, b, sizeof(b));
        copy[pos] = 'X';
        for (size_t len = 0; len <= EN_HELLO_SIZE; len++) {
            int want = len <= (size_t)pos ? 0 : COH_EPROTO;
            int r = en_hello_decode(copy, len, &out);
            if (r != want) print_error("magic byte %d wrong, %zu bytes\n", pos, len);
            assert_int_equal(r, want);
        }
    }
    /* a frame header is not a HELLO */
    uint8_t f[EN_HELLO_SIZE] = {0};
    en_hdr_encode(&SAMPLE, f);
    assert_int_equal(en_hello_decode(f, 4, &out), COH_EPROTO);
}

static void test_hello_invalid(void **state)
{
    (void)state;
    struct {
        const char *what;
        uint16_t version, kind;
        uint32_t rank, world;
    } k[] = {
        {"version 0", 0, EN_HELLO_DATA, 0, 2},
        {"version 2", EN_PROTO_VERSION + 1, EN_HELLO_DATA, 0, 2},
        {"version 0xffff", 0xffff, EN_HELLO_DATA, 0, 2},
        {"kind 0", EN_PROTO_VERSION, 0, 0, 2},
        {"kind 4", EN_PROTO_VERSION, EN_HELLO_CTRL + 1, 0, 2},
        {"kind 0xffff", EN_PROTO_VERSION, 0xffff, 0, 2},
        {"rank == world", EN_PROTO_VERSION, EN_HELLO_DATA, 2, 2},
        {"rank > world", EN_PROTO_VERSION, EN_HELLO_DATA, 7, 2},
        {"rank 2^32-1", EN_PROTO_VERSION, EN_HELLO_DATA, UINT32_MAX, 4},
        {"world 0", EN_PROTO_VERSION, EN_HELLO_DATA, 0, 0},
    };
    for (size_t i = 0; i < sizeof(k) / sizeof(k[0]); i++) {
        en_hello_t h = {
            .version = k[i].version, .kind = k[i].kind, .rank = k[i].rank, .world = k[i].world};
        uint8_t b[EN_HELLO_SIZE];
        en_hello_encode(&h, b);
        en_hello_t out, before;
        memset(&out, 0xEE, sizeof(out));
        memcpy(&before, &out, sizeof(out));
        int r = en_hello_decode(b, EN_HELLO_SIZE, &out);
        if (r != COH_EPROTO) print_error("case \"%s\"\n", k[i].what);
        assert_int_equal(r, COH_EPROTO);
        assert_memory_equal(&out, &before, sizeof(out));
        assert_int_equal(en_hello_decode(b, EN_HELLO_SIZE - 1, &out), 0);
    }
}

static void test_hello_token(void **state)
{
    (void)state;
    en_hello_t h;
    memset(&h, 0xEE, sizeof(h));
    en_hello_set_token(&h, "secret");
    uint8_t want[EN_TOKEN_MAX] = "secret";
    assert_memory_equal(h.token, want, EN_TOKEN_MAX); /* zero padded, old bytes gone */
    assert_int_equal(en_hello_token_ok(&h, "secret"), 1);
    assert_int_equal(en_hello_token_ok(&h, "secreT"), 0);
    assert_int_equal(en_hello_token_ok(&h, "other!"), 0);
    assert_int_equal(en_hello_token_ok(&h, "secre"), 0);   /* a prefix */
    assert_int_equal(en_hello_token_ok(&h, "secrets"), 0); /* longer */
    assert_int_equal(en_hello_token_ok(&h, ""), 0);
    assert_int_equal(en_hello_token_ok(&h, NULL), 0);

    /* empty and NULL are the same token: all zero */
    en_hello_set_token(&h, NULL);
    uint8_t zero[EN_TOKEN_MAX] = {0};
    assert_memory_equal(h.token, zero, EN_TOKEN_MAX);
    assert_int_equal(en_hello_token_ok(&h, NULL), 1);
    assert_int_equal(en_hello_token_ok(&h, ""), 1);
    assert_int_equal(en_hello_token_ok(&h, "x"), 0);
    en_hello_set_token(&h, "");
    assert_memory_equal(h.token, zero, EN_TOKEN_MAX);
    assert_int_equal(en_hello_token_ok(&h, NULL), 1);

    /* 64 bytes fill the field; longer tokens are cut at 64 on both sides */
    char t64[EN_TOKEN_MAX + 1], t70[EN_TOKEN_MAX + 7], u70[EN_TOKEN_MAX + 7];
    memset(t64, 'a', EN_TOKEN_MAX);
    t64[EN_TOKEN_MAX] = 0;
    memcpy(t70, t64, EN_TOKEN_MAX);
    strcpy(t70 + EN_TOKEN_MAX, "XYZXYZ");
    memcpy(u70, t64, EN_TOKEN_MAX);
    strcpy(u70 + EN_TOKEN_MAX, "123456");
    en_hello_set_token(&h, t64);
    assert_memory_equal(h.token, t64, EN_TOKEN_MAX);
    assert_int_equal(en_hello_token_ok(&h, t64), 1);
    assert_int_equal(en_hello_token_ok(&h, t70), 1); /* same first 64 bytes */
    t64[EN_TOKEN_MAX - 1] = 'b';
    assert_int_equal(en_hello_token_ok(&h, t64), 0); /* the 64th byte counts */
    en_hello_set_token(&h, t70);
    assert_int_equal(en_hello_token_ok(&h, u70), 1);
    assert_int_equal(en_hello_token_ok(&h, t64), 0);
    t64[EN_TOKEN_MAX - 1] = 'a';
    assert_int_equal(en_hello_token_ok(&h, t64), 1);

    /* through the wire: bytes after a NUL in the field make it a different token */
    en_hello_t s = sample_hello(), out;
    uint8_t b[EN_HELLO_SIZE];
    en_hello_encode(&s, b);
    assert_int_equal(en_hello_decode(b, EN_HELLO_SIZE, &out), EN_HELLO_SIZE);
    assert_int_equal(en_hello_token_ok(&out, "job-token"), 1);
    b[24 + 20] = 'z'; /* past the NUL that ends "job-token" */
    assert_int_equal(en_hello_decode(b, EN_HELLO_SIZE, &out), EN_HELLO_SIZE);
    assert_int_equal(en_hello_token_ok(&out, "job-token"), 0);
}

/* The little-endian helpers, at their extremes. */
static void test_le_helpers(void **state)
{
    (void)state;
    uint8_t b[8];
    en_put16(b, 0xBEEF);
    assert_int_equal(b[0], 0xEF);
    assert_int_equal(b[1], 0xBE);
    assert_int_equal(en_get16(b), 0xBEEF);
    en_put32(b, 0xFFFFFFFFu);
    assert_int_equal(en_get32(b), 0xFFFFFFFFu);
    en_put64(b, 0x8000000000000001ull);
    assert_int_equal(b[0], 0x01);
    assert_int_equal(b[7], 0x80);
    assert_int_equal(en_get64(b), 0x8000000000000001ull);
    en_put64(b, UINT64_MAX);
    assert_int_equal(en_get64(b), UINT64_MAX);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hdr_layout),
        cmocka_unit_test(test_hdr_roundtrip),
        cmocka_unit_test(test_hdr_resumable),
        cmocka_unit_test(test_hdr_bad_magic),
        cmocka_unit_test(test_hdr_invalid_fields),
        cmocka_unit_test(test_hello_layout_roundtrip),
        cmocka_unit_test(test_hello_resumable_and_magic),
        cmocka_unit_test(test_hello_invalid),
        cmocka_unit_test(test_hello_token),
        cmocka_unit_test(test_le_helpers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
