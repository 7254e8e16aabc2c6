/*
 * reactor/rx_store.h: the bootstrap key-value store.
 *
 * First the codec (resumable parse, limits, field checks), then a live
 * server on its own reactor thread driven by the blocking client and by raw
 * TCP sockets: set/get, overwrite, missing keys, WAIT answered by a SET from
 * another thread, WAIT timeouts, ADD from several clients at once, the job
 * token handshake (a wrong world size named as such), garbage on the wire,
 * pipelined requests behind a WAIT, the caps on keys and bytes, clients of
 * one incarnation against the store of another, and a clean stop (every
 * handle closed: rx_reactor_stop returns 0).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdatomic.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cmocka.h>

#include "engines/en_frame.h"
#include "reactor/reactor.h"
#include "reactor/rx_store.h"

#define TOKEN "tok"
#define WORLD 4
#define INC   1 /* the incarnation of store and clients */
#define SEC   1000000000ull

static uint64_t deadline(unsigned sec)
{
    return bs_now_ns() + sec * SEC;
}

/* ---- codec ---- */

static void test_codec_roundtrip(void **state)
{
    (void)state;
    struct {
        uint8_t type, status;
        uint32_t arg;
        const char *key, *val;
        size_t vlen;
    } k[] = {
        {RX_STORE_SET, 0, 0, "key", "value", 5},
        {RX_STORE_SET, 0, 0, "k", "", 0},
        {RX_STORE_SET, 0, 0, "bin", "a\0b\0c", 5},
        {RX_STORE_GET, 0, 0, "some/key", NULL, 0},
        {RX_STORE_WAIT, 0, 1500, "w", NULL, 0},
        {RX_STORE_ADD, 0, (uint32_t)-3, "counter", NULL, 0},
        {RX_STORE_RESP, RX_STORE_OK, 0, "", "42", 2},
        {RX_STORE_RESP, RX_STORE_NOTFOUND, 0, "", NULL, 0},
        {RX_STORE_RESP, RX_STORE_TIMEOUT, 0, "", NULL, 0},
        {RX_STORE_RESP, RX_STORE_ERROR, 0xFFFFFFFFu, "", NULL, 0},
    };
    for (size_t i = 0; i < sizeof(k) / sizeof(k[0]); i++) {
        size_t klen = strlen(k[i].key);
        uint8_t b[64];
        memset(b, 0xEE, sizeof(b));
        int n = rx_store_encode(k[i].type, k[i].status, k[i].arg, k[i].key, klen, k[i].val,
                                k[i].vlen, b, sizeof(b));
        assert_int_equal(n, RX_STORE_HDR + klen + k[i].vlen);
        /* the header layout of rx_store.h */
        assert_int_equal(en_get32(b), RX_STORE_MAGIC);
        assert_memory_equal(b, "COHS", 4);
        assert_int_equal(b[4], k[i].type);
        assert_int_equal(b[5], k[i].status);
        assert_int_equal(en_get16(b + 6), klen);
        assert_int_equal(en_get32(b + 8), k[i].vlen);
        assert_int_equal(en_get32(b + 12), k[i].arg);
        /* byte by byte: every prefix needs more, from a buffer of exactly that size */
        for (int len = 0; len < n; len++) {
            uint8_t *p = malloc(len ? (size_t)len : 1);
            assert_non_null(p);
            memcpy(p, b, (size_t)len);
            rx_store_msg_t m;
            int r = rx_store_parse(p, (size_t)len, &m);
            free(p);
            if (r != 0) print_error("case %zu: prefix of %d bytes\n", i, len);
            assert_int_equal(r, 0);
        }
        rx_store_msg_t m;
        memset(&m, 0, sizeof(m));
        assert_int_equal(rx_store_parse(b, (size_t)n, &m), n);
        assert_int_equal(m.type, k[i].type);
        assert_int_equal(m.status, k[i].status);
        assert_int_equal(m.arg, k[i].arg);
        assert_int_equal(m.klen, klen);
        assert_ptr_equal(m.key, b + RX_STORE_HDR);
        assert_memory_equal(m.key, k[i].key, klen);
        assert_int_equal(m.vlen, k[i].vlen);
        assert_ptr_equal(m.val, b + RX_STORE_HDR + klen);
        if (k[i].vlen) assert_memory_equal(m.val, k[i].val, k[i].vlen);
        /* bytes of the next message after it are not consumed */
        assert_int_equal(rx_store_parse(b, sizeof(b), &m), n);
    }
}

static void test_codec_limits(void **state)
{
    (void)state;
    static uint8_t big[RX_STORE_HDR + RX_STORE_KEY_MAX + RX_STORE_VAL_MAX + 8];
    static uint8_t key[RX_STORE_KEY_MAX + 1], val[RX_STORE_VAL_MAX + 1];
    memset(key, 'k', sizeof(key));
    memset(val, 'v', sizeof(val));
    /* the largest message is fine */
    int n = rx_store_encode(RX_STORE_SET, 0, 0, key, RX_STORE_KEY_MAX, val, RX_STORE_VAL_MAX, big,
                            sizeof(big));
    assert_int_equal(n, RX_STORE_HDR + RX_STORE_KEY_MAX + RX_STORE_VAL_MAX);
    rx_store_msg_t m;
    assert_int_equal(rx_store_parse(big, (size_t)n, &m), n);
    assert_int_equal(rx_store_parse(big, (size_t)n - 1, &m), 0);
    /* the encoder refuses one more byte of key or value, or a short buffer */
    assert_int_equal(
        rx_store_encode(RX_STORE_SET, 0, 0, key, RX_STORE_KEY_MAX + 1, val, 1, big, sizeof(big)),
        COH_EINVAL);
    assert_int_equal(
        rx_store_encode(RX_STORE_SET, 0, 0, key, 1, val, RX_STORE_VAL_MAX + 1, big, sizeof(big)),
        COH_EINVAL);
    assert_int_equal(rx_store_encode(RX_STORE_SET, 0, 0, key, 3, val, 4, big, RX_STORE_HDR + 6),
                     COH_EINVAL);
    assert_int_equal(rx_store_encode(RX_STORE_SET, 0, 0, key, 3, val, 4, big, RX_STORE_HDR + 7),
                     RX_STORE_HDR + 7);

    /* the parser refuses over-long fields as soon as the header is in: it
     * must not wait for (or buffer) bytes it would refuse anyway */
    uint8_t h[RX_STORE_HDR + 1];
    assert_int_equal(rx_store_encode(RX_STORE_SET, 0, 0, "k", 1, NULL, 0, h, sizeof(h)),
                     RX_STORE_HDR + 1);
    en_put16(h + 6, RX_STORE_KEY_MAX + 1);
    assert_int_equal(rx_store_parse(h, RX_STORE_HDR, &m), COH_EPROTO);
    assert_int_equal(rx_store_parse(h, RX_STORE_HDR - 1, &m), 0);
    en_put16(h + 6, 0xFFFF);
    assert_int_equal(rx_store_parse(h, RX_STORE_HDR, &m), COH_EPROTO);
    en_put16(h + 6, 1);
    en_put32(h + 8, RX_STORE_VAL_MAX + 1);
    assert_int_equal(rx_store_parse(h, RX_STORE_HDR, &m), COH_EPROTO);
    en_put32(h + 8, 0xFFFFFFFFu);
    assert_int_equal(rx_store_parse(h, RX_STORE_HDR, &m), COH_EPROTO);
    en_put32(h + 8, RX_STORE_VAL_MAX);
    assert_int_equal(rx_store_parse(h, RX_STORE_HDR + 1, &m), 0); /* valid: wants the rest */
}

static void test_codec_invalid(void **state)
{
    (void)state;
    struct {
        const char *what;
        uint8_t type, status;
        size_t klen, vlen;
    } k[] = {
        {"type 0", 0, 0, 1, 0},
        {"type 5", 5, 0, 1, 0},
        {"type 0x81", 0x81, 0, 0, 0},
        {"type 0xFF", 0xFF, 0, 0, 0},
        {"SET with status 1", RX_STORE_SET, 1, 1, 1},
        {"GET with status 3", RX_STORE_GET, 3, 1, 0},
        {"ADD with status 0x80", RX_STORE_ADD, 0x80, 1, 0},
        {"GET with a value", RX_STORE_GET, 0, 1, 1},
        {"WAIT with a value", RX_STORE_WAIT, 0, 1, 2},
        {"ADD with a value", RX_STORE_ADD, 0, 1, 3},
        {"SET without a key", RX_STORE_SET, 0, 0, 1},
        {"GET without a key", RX_STORE_GET, 0, 0, 0},
        {"response status 4", RX_STORE_RESP, 4, 0, 0},
        {"response status 0xFF", RX_STORE_RESP, 0xFF, 0, 0},
    };
    uint8_t kv[8] = "kkkkvvv";
    for (size_t i = 0; i < sizeof(k) / sizeof(k[0]); i++) {
        uint8_t b[64];
        int n = rx_store_encode(k[i].type, k[i].status, 0, kv, k[i].klen, kv + 4, k[i].vlen, b,
                                sizeof(b));
        assert_true(n >= RX_STORE_HDR);
        rx_store_msg_t m;
        int r = rx_store_parse(b, (size_t)n, &m);
        if (r != COH_EPROTO) print_error("case \"%s\"\n", k[i].what);
        assert_int_equal(r, COH_EPROTO);
        /* refused at the header already */
        assert_int_equal(rx_store_parse(b, RX_STORE_HDR, &m), COH_EPROTO);
        assert_int_equal(rx_store_parse(b, RX_STORE_HDR - 1, &m), 0);
    }
    /* a wrong magic byte is refused as soon as it is in */
    for (int pos = 0; pos < 4; pos++) {
        uint8_t b[RX_STORE_HDR + 1];
        rx_store_encode(RX_STORE_GET, 0, 0, "k", 1, NULL, 0, b, sizeof(b));
        b[pos] = 'x';
        for (size_t len = 0; len <= sizeof(b); len++) {
            rx_store_msg_t m;
            int want = len <= (size_t)pos ? 0 : COH_EPROTO;
            assert_int_equal(rx_store_parse(b, len, &m), want);
        }
    }
}

/* ---- a live server ---- */

typedef struct fixture {
    rx_reactor_t rx;
    rx_store_server_t *srv;
    struct sockaddr_storage addr;
    int stop_calls;
} fixture_t;

static void on_stop(rx_reactor_t *rx)
{
    fixture_t *f = rx->owner;
    f->stop_calls++;
    if (f->srv) rx_store_server_close(f->srv);
    f->srv = NULL;
}

static int start_server(rx_reactor_t *rx, void *arg)
{
    fixture_t *f = arg;
    struct sockaddr_in a;
    uv_ip4_addr("127.0.0.1", 0, &a);
    return rx_store_server_start(rx, (const struct sockaddr *)&a, -1, TOKEN, WORLD, INC, &f->srv);
}

static int setup(void **state)
{
    fixture_t *f = calloc(1, sizeof(*f));
    assert_non_null(f);
    assert_int_equal(rx_reactor_start(&f->rx, "store-test", on_stop, f), 0);
    assert_int_equal(rx_reactor_call(&f->rx, start_server, f), 0);
    assert_non_null(f->srv);
    assert_int_equal(rx_store_server_addr(f->srv, &f->addr), 0);
    const struct sockaddr_in *in = (const struct sockaddr_in *)&f->addr;
    assert_int_equal(in->sin_family, AF_INET);
    assert_int_equal(ntohl(in->sin_addr.s_addr), INADDR_LOOPBACK);
    assert_int_not_equal(ntohs(in->sin_port), 0);
    assert_int_equal(rx_store_server_rejected(f->srv), 0);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *f = *state;
    /* every handle of the server is closed by on_stop: no leftovers */
    int st = rx_reactor_stop(&f->rx);
    if (st != 0) print_error("rx_reactor_stop: %s\n", coh_last_error());
    assert_int_equal(st, 0);
    assert_int_equal(f->stop_calls, 1);
    assert_int_equal(rx_reactor_stop(&f->rx), 0); /* a second stop is a no-op */
    assert_int_equal(f->stop_calls, 1);
    free(f);
    return 0;
}

static const struct sockaddr *sa(const fixture_t *f)
{
    return (const struct sockaddr *)&f->addr;
}

static void connect_ok(fixture_t *f, rx_store_client_t *c)
{
    int st = rx_store_connect(c, sa(f), TOKEN, 1, WORLD, INC, deadline(5));
    if (st != 0) print_error("rx_store_connect: %s\n", coh_last_error());
    assert_int_equal(st, 0);
    assert_true(c->fd >= 0);
}

static void test_set_get(void **state)
{
    fixture_t *f = *state;
    rx_store_client_t c;
    connect_ok(f, &c);
    char buf[256];
    size_t vlen = 999;
    assert_int_equal(rx_store_set(&c, "addr/0", "10.0.0.1:5000", 13, deadline(5)), 0);
    assert_int_equal(rx_store_get(&c, "addr/0", buf, sizeof(buf), &vlen, -1, deadline(5)), 0);
    assert_int_equal(vlen, 13);
    assert_memory_equal(buf, "10.0.0.1:5000", 13);

    /* overwrite with a shorter, then a longer value */
    assert_int_equal(rx_store_set(&c, "addr/0", "x", 1, deadline(5)), 0);
    assert_int_equal(rx_store_get(&c, "addr/0", buf, sizeof(buf), &vlen, -1, deadline(5)), 0);
    assert_int_equal(vlen, 1);
    assert_int_equal(buf[0], 'x');
    assert_int_equal(rx_store_set(&c, "addr/0", "0123456789abcdef", 16, deadline(5)), 0);
    memset(buf, 0, sizeof(buf));
    assert_int_equal(rx_store_get(&c, "addr/0", buf, sizeof(buf), &vlen, -1, deadline(5)), 0);
    assert_int_equal(vlen, 16);
    assert_memory_equal(buf, "0123456789abcdef", 16);

    /* a value cut to the caller's buffer still reports its full length */
    memset(buf, '#', sizeof(buf));
    assert_int_equal(rx_store_get(&c, "addr/0", buf, 4, &vlen, -1, deadline(5)), 0);
    assert_int_equal(vlen, 16);
    assert_memory_equal(buf, "0123####", 8);

    /* empty and binary values, keys that differ by one byte */
    assert_int_equal(rx_store_set(&c, "empty", "", 0, deadline(5)), 0);
    vlen = 999;
    assert_int_equal(rx_store_get(&c, "empty", buf, sizeof(buf), &vlen, -1, deadline(5)), 0);
    assert_int_equal(vlen, 0);
    assert_int_equal(rx_store_set(&c, "bin", "\0\1\2\0", 4, deadline(5)), 0);
    assert_int_equal(rx_store_get(&c, "bin", buf, sizeof(buf), &vlen, -1, deadline(5)), 0);
    assert_int_equal(vlen, 4);
    assert_memory_equal(buf, "\0\1\2\0", 4);
    assert_int_equal(rx_store_set(&c, "bio", "other", 5, deadline(5)), 0);
    assert_int_equal(rx_store_get(&c, "bin", buf, sizeof(buf), &vlen, -1, deadline(5)), 0);
    assert_int_equal(vlen, 4);

    /* the largest value */
    static uint8_t large[RX_STORE_VAL_MAX], back[RX_STORE_VAL_MAX];
    for (size_t i = 0; i < sizeof(large); i++) large[i] = (uint8_t)(i * 7 + 3);
    assert_int_equal(rx_store_set(&c, "large", large, sizeof(large), deadline(5)), 0);
    assert_int_equal(rx_store_get(&c, "large", back, sizeof(back), &vlen, -1, deadline(5)), 0);
    assert_int_equal(vlen, sizeof(large));
    assert_memory_equal(back, large, sizeof(large));

    /* a second client sees the same data */
    rx_store_client_t d;
    connect_ok(f, &d);
    assert_int_equal(rx_store_get(&d, "addr/0", buf, sizeof(buf), &vlen, -1, deadline(5)), 0);
    assert_int_equal(vlen, 16);
    assert_memory_equal(buf, "0123456789abcdef", 16);
    rx_store_close(&d);
    rx_store_close(&c);
    assert_int_equal(c.fd, -1);
    assert_int_equal(rx_store_server_rejected(f->srv), 0);
}

static void test_get_missing(void **state)
{
    fixture_t *f = *state;
    rx_store_client_t c;
    connect_ok(f, &c);
    char buf[16];
    size_t vlen = 123;
    assert_int_equal(rx_store_get(&c, "nope", buf, sizeof(buf), &vlen, -1, deadline(5)),
                     COH_EAGAIN);
    assert_int_equal(rx_store_set(&c, "nopf", "1", 1, deadline(5)), 0);
    assert_int_equal(rx_store_get(&c, "nope", buf, sizeof(buf), &vlen, -1, deadline(5)),
                     COH_EAGAIN);
    /* the connection is still good after a miss */
    assert_int_equal(rx_store_get(&c, "nopf", buf, sizeof(buf), &vlen, -1, deadline(5)), 0);
    assert_int_equal(vlen, 1);
    /* WAIT on a key that exists answers at once */
    uint64_t t0 = bs_now_ns();
    assert_int_equal(rx_store_get(&c, "nopf", buf, sizeof(buf), &vlen, 10000, deadline(5)), 0);
    assert_true(bs_now_ns() - t0 < 2 * SEC);
    /* a key longer than the limit is refused by the client itself */
    char longkey[RX_STORE_KEY_MAX + 2];
    memset(longkey, 'k', sizeof(longkey) - 1);
    longkey[sizeof(longkey) - 1] = 0;
    assert_int_equal(rx_store_set(&c, longkey, "1", 1, deadline(5)), COH_EINVAL);
    rx_store_close(&c);
}

typedef struct setter {
    const struct sockaddr *addr;
    unsigned delay_ms;
    const char *key, *val;
    int status;
} setter_t;

static void setter_main(void *arg)
{
    setter_t *s = arg;
    rx_store_client_t c;
    s->status = rx_store_connect(&c, s->addr, TOKEN, 2, WORLD, INC, deadline(5));
    if (s->status) return;
    uv_sleep(s->delay_ms);
    s->status = rx_store_set(&c, s->key, s->val, strlen(s->val), deadline(5));
    rx_store_close(&c);
}

static void test_wait_then_set(void **state)
{
    fixture_t *f = *state;
    rx_store_client_t c;
    connect_ok(f, &c);
    setter_t s = {.addr = sa(f), .delay_ms = 200, .key = "late", .val = "here", .status = -100};
    uv_thread_t th;
    uint64_t t0 = bs_now_ns();
    assert_int_equal(uv_thread_create(&th, setter_main, &s), 0);
    char buf[16];
    size_t vlen = 0;
    int st = rx_store_get(&c, "late", buf, sizeof(buf), &vlen, 10000, deadline(15));
    uint64_t took = bs_now_ns() - t0;
    assert_int_equal(uv_thread_join(&th), 0);
    assert_int_equal(s.status, 0);
    assert_int_equal(st, 0);
    assert_int_equal(vlen, 4);
    assert_memory_equal(buf, "here", 4);
    /* answered by the SET, not by the 10 s timeout */
    assert_true(took >= 150000000ull);
    assert_true(took < 5 * SEC);
    rx_store_close(&c);
}

static void test_wait_timeout(void **state)
{
    fixture_t *f = *state;
    rx_store_client_t c;
    connect_ok(f, &c);
    char buf[16];
    size_t vlen = 0;
    uint64_t t0 = bs_now_ns();
    assert_int_equal(rx_store_get(&c, "never", buf, sizeof(buf), &vlen, 300, deadline(10)),
                     COH_ETIMEDOUT);
    uint64_t took = bs_now_ns() - t0;
    if (took < 300000000ull || took > 2 * SEC)
        print_error("WAIT(300 ms) took %llu ns\n", (unsigned long long)took);
    assert_true(took >= 300000000ull);
    assert_true(took <= 2 * SEC);
    /* a zero timeout times out at the next tick */
    t0 = bs_now_ns();
    assert_int_equal(rx_store_get(&c, "never", buf, sizeof(buf), &vlen, 0, deadline(10)),
                     COH_ETIMEDOUT);
    assert_true(bs_now_ns() - t0 <= 2 * SEC);
    /* the connection still works, and a WAIT on a key that appears later still works */
    assert_int_equal(rx_store_set(&c, "never", "now", 3, deadline(5)), 0);
    assert_int_equal(rx_store_get(&c, "never", buf, sizeof(buf), &vlen, 300, deadline(10)), 0);
    assert_int_equal(vlen, 3);
    /* the client's own deadline also bounds a WAIT the server would answer later */
    t0 = bs_now_ns();
    assert_int_equal(
        rx_store_get(&c, "later", buf, sizeof(buf), &vlen, 60000, bs_now_ns() + 200000000ull),
        COH_ETIMEDOUT);
    assert_true(bs_now_ns() - t0 <= 2 * SEC);
    rx_store_close(&c);
}

#define ADDERS    4
#define ADDS_EACH 50

typedef struct adder {
    const struct sockaddr *addr;
    int status;
    int64_t got[ADDS_EACH];
} adder_t;

static void adder_main(void *arg)
{
    adder_t *a = arg;
    rx_store_client_t c;
    a->status = rx_store_connect(&c, a->addr, TOKEN, 3, WORLD, INC, deadline(5));
    if (a->status) return;
    for (int i = 0; i < ADDS_EACH && !a->status; i++)
        a->status = rx_store_add(&c, "ctr", 1, &a->got[i], deadline(5));
    rx_store_close(&c);
}

static void test_add(void **state)
{
    fixture_t *f = *state;
    rx_store_client_t c;
    connect_ok(f, &c);
    int64_t v = 0;
    assert_int_equal(rx_store_add(&c, "a", 5, &v, deadline(5)), 0);
    assert_int_equal(v, 5); /* a missing counter starts at 0 */
    assert_int_equal(rx_store_add(&c, "a", -7, &v, deadline(5)), 0);
    assert_int_equal(v, -2);
    assert_int_equal(rx_store_add(&c, "a", 0, &v, deadline(5)), 0);
    assert_int_equal(v, -2);
    assert_int_equal(rx_store_add(&c, "a", INT32_MAX, &v, deadline(5)), 0);
    assert_int_equal(v, (int64_t)INT32_MAX - 2);
    assert_int_equal(rx_store_add(&c, "a", INT32_MAX, &v, deadline(5)), 0);
    assert_int_equal(v, 2 * (int64_t)INT32_MAX - 2); /* the counter is 64-bit */
    /* the counter is a decimal string that GET returns */
    char buf[32];
    size_t vlen;
    assert_int_equal(rx_store_get(&c, "a", buf, sizeof(buf), &vlen, -1, deadline(5)), 0);
    assert_int_equal(vlen, 10);
    assert_memory_equal(buf, "4294967292", 10);

    /* several clients at once: every increment lands once */
    adder_t ad[ADDERS];
    uv_thread_t th[ADDERS];
    memset(ad, 0, sizeof(ad));
    for (int i = 0; i < ADDERS; i++) {
        ad[i].addr = sa(f);
        ad[i].status = -100;
        assert_int_equal(uv_thread_create(&th[i], adder_main, &ad[i]), 0);
    }
    for (int i = 0; i < ADDERS; i++) assert_int_equal(uv_thread_join(&th[i]), 0);
    static bool seen[ADDERS * ADDS_EACH + 1];
    memset(seen, 0, sizeof(seen));
    for (int i = 0; i < ADDERS; i++) {
        assert_int_equal(ad[i].status, 0);
        for (int j = 0; j < ADDS_EACH; j++) {
            int64_t g = ad[i].got[j];
            assert_true(g >= 1 && g <= ADDERS * ADDS_EACH);
            assert_false(seen[g]); /* each value answered exactly once */
            seen[g] = true;
            if (j) assert_true(g > ad[i].got[j - 1]); /* one client sees it grow */
        }
    }
    assert_int_equal(rx_store_add(&c, "ctr", 0, &v, deadline(5)), 0);
    assert_int_equal(v, ADDERS * ADDS_EACH);
    rx_store_close(&c);
}

typedef struct add_once {
    rx_store_client_t *c;
    int status;
} add_once_t;

static void add_once_main(void *arg)
{
    add_once_t *a = arg;
    int64_t v;
    uv_sleep(100);
    a->status = rx_store_add(a->c, "joined", 3, &v, deadline(5));
}

/* A WAIT on a counter is answered by the ADD that creates it. */
static void test_wait_on_add(void **state)
{
    fixture_t *f = *state;
    rx_store_client_t c, d;
    connect_ok(f, &c);
    connect_ok(f, &d);
    add_once_t a = {.c = &d, .status = -100};
    uv_thread_t th;
    assert_int_equal(uv_thread_create(&th, add_once_main, &a), 0);
    char buf[32];
    size_t vlen = 0;
    assert_int_equal(rx_store_get(&c, "joined", buf, sizeof(buf), &vlen, 10000, deadline(15)), 0);
    assert_int_equal(uv_thread_join(&th), 0);
    assert_int_equal(a.status, 0);
    assert_int_equal(vlen, 1);
    assert_int_equal(buf[0], '3');
    rx_store_close(&c);
    rx_store_close(&d);
}

/* ---- caps: a token holder cannot grow the store without bound ---- */

/* Keys beyond RX_STORE_MAX_KEYS are refused with a reason; the client's
 * connection and the keys already there stay, overwrites still work. */
static void test_cap_keys(void **state)
{
    fixture_t *f = *state;
    rx_store_client_t c;
    connect_ok(f, &c);
    const size_t max = RX_STORE_MAX_KEYS(WORLD);
    char key[32], buf[32];
    size_t vlen;
    for (size_t i = 0; i < max; i++) {
        snprintf(key, sizeof(key), "k/%zu", i);
        int st = rx_store_set(&c, key, "v", 1, deadline(5));
        if (st) print_error("key %zu of %zu: %s\n", i, max, coh_last_error());
        assert_int_equal(st, 0);
    }
    assert_int_equal(rx_store_set(&c, "one/more", "v", 1, deadline(5)), COH_EBOOTSTRAP);
    assert_non_null(strstr(coh_last_error(), "store full"));
    int64_t v = 0;
    assert_int_equal(rx_store_add(&c, "new/counter", 1, &v, deadline(5)), COH_EBOOTSTRAP);
    assert_non_null(strstr(coh_last_error(), "store full"));
    assert_int_equal(rx_store_get(&c, "one/more", buf, sizeof(buf), &vlen, -1, deadline(5)),
                     COH_EAGAIN);
    /* what is there stays usable */
    assert_int_equal(rx_store_set(&c, "k/0", "changed", 7, deadline(5)), 0);
    assert_int_equal(rx_store_get(&c, "k/0", buf, sizeof(buf), &vlen, -1, deadline(5)), 0);
    assert_int_equal(vlen, 7);
    assert_int_equal(rx_store_add(&c, "k/1", 3, &v, deadline(5)), 0);
    assert_int_equal(v, 3);
    rx_store_close(&c);
    /* so does the server, for another client */
    connect_ok(f, &c);
    snprintf(key, sizeof(key), "k/%zu", max - 1);
    assert_int_equal(rx_store_get(&c, key, buf, sizeof(buf), &vlen, -1, deadline(5)), 0);
    rx_store_close(&c);
    assert_int_equal(rx_store_server_rejected(f->srv), 0);
}

/* Bytes beyond RX_STORE_MAX_BYTES are refused; room freed by a shorter
 * value is taken again. (4,000 values of 64 KiB used to grow rank 0 by
 * 256 MB.) */
static void test_cap_bytes(void **state)
{
    fixture_t *f = *state;
    rx_store_client_t c;
    connect_ok(f, &c);
    static uint8_t big[RX_STORE_VAL_MAX];
    memset(big, 'b', sizeof(big));
    char key[32];
    size_t used = 0, n = 0;
    for (;; n++) {
        snprintf(key, sizeof(key), "big/%zu", n);
        size_t cost = strlen(key) + sizeof(big) + RX_STORE_KV_OVERHEAD;
        if (used + cost > RX_STORE_MAX_BYTES(WORLD)) break;
        assert_int_equal(rx_store_set(&c, key, big, sizeof(big), deadline(5)), 0);
        used += cost;
    }
    assert_true(n > 100 && n < 1000);
    assert_int_equal(rx_store_set(&c, key, big, sizeof(big), deadline(5)), COH_EBOOTSTRAP);
    assert_non_null(strstr(coh_last_error(), "store full"));
    /* a longer value for a key that is there is refused too */
    assert_int_equal(rx_store_set(&c, "small", "s", 1, deadline(5)), 0);
    assert_int_equal(rx_store_set(&c, "small", big, sizeof(big), deadline(5)), COH_EBOOTSTRAP);
    /* a shorter one makes room */
    assert_int_equal(rx_store_set(&c, "big/0", "x", 1, deadline(5)), 0);
    assert_int_equal(rx_store_set(&c, key, big, sizeof(big), deadline(5)), 0);
    char buf[8];
    size_t vlen = 0;
    assert_int_equal(rx_store_get(&c, key, buf, sizeof(buf), &vlen, -1, deadline(5)), 0);
    assert_int_equal(vlen, sizeof(big));
    rx_store_close(&c);
}

/* ---- incarnations: a client talks only to the store of its own init ---- */

typedef struct later {
    const struct sockaddr *addr;
    int status;
    char why[512];
} later_t;

static void later_main(void *arg)
{
    later_t *l = arg;
    rx_store_client_t c;
    l->status = rx_store_connect(&c, l->addr, TOKEN, 1, WORLD, INC + 1, deadline(20));
    if (l->status == 0) l->status = rx_store_set(&c, "seen/by", "2", 1, deadline(5));
    if (l->status) snprintf(l->why, sizeof(l->why), "%s", coh_last_error());
    rx_store_close(&c);
}

static int start_second(rx_reactor_t *rx, void *arg)
{
    fixture_t *g = arg;
    return rx_store_server_start(rx, (const struct sockaddr *)&g->addr, -1, TOKEN, WORLD, INC + 1,
                                 &g->srv);
}

/* A client of the next incarnation reaches the store of the previous one
 * (rank 0 still finalizing it): it leaves it and keeps trying until the
 * next store is up on the same address, and talks only to that one. */
static void test_incarnation_older_store(void **state)
{
    fixture_t *f = *state;
    later_t l = {.addr = sa(f), .status = -100};
    uv_thread_t th;
    assert_int_equal(uv_thread_create(&th, later_main, &l), 0);
    uv_sleep(300); /* it finds the old store, again and again */
    rx_store_client_t c;
    connect_ok(f, &c);
    char buf[8];
    size_t vlen;
    assert_int_equal(rx_store_get(&c, "seen/by", buf, sizeof(buf), &vlen, -1, deadline(5)),
                     COH_EAGAIN);
    rx_store_close(&c);
    assert_int_equal(rx_reactor_stop(&f->rx), 0); /* the old store goes */
    uv_sleep(100);
    fixture_t *g = calloc(1, sizeof(*g));
    assert_non_null(g);
    g->addr = f->addr;
    assert_int_equal(rx_reactor_start(&g->rx, "store-test-2", on_stop, g), 0);
    assert_int_equal(rx_reactor_call(&g->rx, start_second, g), 0);
    assert_int_equal(uv_thread_join(&th), 0);
    if (l.status) print_error("the later client: %s\n", l.why);
    assert_int_equal(l.status, 0);
    /* the key went to the new store */
    assert_int_equal(rx_store_connect(&c, sa(g), TOKEN, 2, WORLD, INC + 1, deadline(5)), 0);
    assert_int_equal(rx_store_get(&c, "seen/by", buf, sizeof(buf), &vlen, -1, deadline(5)), 0);
    rx_store_close(&c);
    /* an old client finds a newer store: not worth waiting for */
    assert_int_equal(rx_store_connect(&c, sa(g), TOKEN, 1, WORLD, INC, deadline(5)), COH_EMISMATCH);
    assert_non_null(strstr(coh_last_error(), "incarnation 2"));
    assert_int_equal(rx_store_server_rejected(g->srv), 0);
    assert_int_equal(rx_reactor_stop(&g->rx), 0);
    free(g);
}

/* A client whose store never comes in time says which incarnation it saw. */
static void test_incarnation_deadline(void **state)
{
    fixture_t *f = *state;
    rx_store_client_t c;
    uint64_t t0 = bs_now_ns();
    assert_int_equal(
        rx_store_connect(&c, sa(f), TOKEN, 1, WORLD, INC + 1, bs_now_ns() + 500000000ull),
        COH_EBOOTSTRAP);
    assert_true(bs_now_ns() - t0 < 2 * SEC);
    assert_non_null(strstr(coh_last_error(), "still serves incarnation 1"));
    assert_int_equal(c.fd, -1);
    assert_int_equal(rx_store_server_rejected(f->srv), 0);
}

/* ---- the handshake and hostile clients ---- */

static void test_wrong_token(void **state)
{
    fixture_t *f = *state;
    rx_store_client_t c;
    int st = rx_store_connect(&c, sa(f), "not-the-token", 1, WORLD, INC, deadline(5));
    assert_int_equal(st, COH_EAUTH);
    assert_int_equal(c.fd, -1);
    assert_non_null(strstr(coh_last_error(), "refused"));
    assert_int_equal(rx_store_server_rejected(f->srv), 1);
    /* a prefix of the token is not the token */
    assert_int_equal(rx_store_connect(&c, sa(f), "to", 1, WORLD, INC, deadline(5)), COH_EAUTH);
    assert_int_equal(rx_store_server_rejected(f->srv), 2);
    /* the right token with another world size: refused, and the client is
     * told what differs (it used to blame the token) */
    assert_int_equal(rx_store_connect(&c, sa(f), TOKEN, 1, WORLD + 1, INC, deadline(5)),
                     COH_EMISMATCH);
    assert_int_equal(c.fd, -1);
    assert_non_null(strstr(coh_last_error(), "serves a world of 4 ranks"));
    assert_non_null(strstr(coh_last_error(), "world size 5"));
    assert_null(strstr(coh_last_error(), "TOKEN"));
    assert_int_equal(rx_store_server_rejected(f->srv), 3);
    /* the server goes on serving */
    connect_ok(f, &c);
    assert_int_equal(rx_store_set(&c, "k", "v", 1, deadline(5)), 0);
    rx_store_close(&c);
    assert_int_equal(rx_store_server_rejected(f->srv), 3);
}

static int raw_connect(const fixture_t *f)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    assert_int_equal(connect(fd, sa(f), sizeof(struct sockaddr_in)), 0);
    return fd;
}

static void raw_send(int fd, const void *b, size_t n)
{
    assert_int_equal(send(fd, b, n, MSG_NOSIGNAL), (ssize_t)n);
}

static void raw_recv(int fd, void *b, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = recv(fd, (char *)b + got, n - got, 0);
        if (r <= 0) print_error("recv: %zd (%s)\n", r, r < 0 ? strerror(errno) : "EOF");
        assert_true(r > 0);
        got += (size_t)r;
    }
}

/* The server hangs up: EOF or a reset, and not a receive timeout. */
static void expect_hangup(int fd)
{
    char b[256];
    for (;;) {
        ssize_t r = recv(fd, b, sizeof(b), 0);
        if (r > 0) continue; /* e.g. the server's HELLO */
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            if (errno == EAGAIN) print_error("the server did not hang up within 5 s\n");
            assert_int_equal(errno, ECONNRESET);
        }
        return;
    }
}

static void raw_handshake(int fd)
{
    en_hello_t h = {.version = EN_PROTO_VERSION, .kind = EN_HELLO_STORE, .rank = 1, .world = WORLD};
    en_hello_set_token(&h, TOKEN);
    uint8_t b[EN_HELLO_SIZE];
    en_hello_encode(&h, b);
    raw_send(fd, b, sizeof(b));
    raw_recv(fd, b, sizeof(b));
    en_hello_t got;
    assert_int_equal(en_hello_decode(b, sizeof(b), &got), EN_HELLO_SIZE);
    assert_int_equal(got.kind, EN_HELLO_STORE);
    assert_int_equal(got.world, WORLD);
    assert_int_equal(got.rank, 0);
    assert_true(en_hello_token_ok(&got, TOKEN));
}

/* Read one response; returns its status, value into val. */
static int raw_response(int fd, char *val, size_t cap, size_t *vlen)
{
    uint8_t h[RX_STORE_HDR];
    raw_recv(fd, h, sizeof(h));
    size_t klen = en_get16(h + 6), vl = en_get32(h + 8);
    assert_true(klen + vl <= cap);
    uint8_t *rest = malloc(klen + vl + 1);
    assert_non_null(rest);
    raw_recv(fd, rest, klen + vl);
    uint8_t *all = malloc(RX_STORE_HDR + klen + vl);
    assert_non_null(all);
    memcpy(all, h, RX_STORE_HDR);
    memcpy(all + RX_STORE_HDR, rest, klen + vl);
    rx_store_msg_t m;
    assert_int_equal(rx_store_parse(all, RX_STORE_HDR + klen + vl, &m),
                     (int)(RX_STORE_HDR + klen + vl));
    assert_int_equal(m.type, RX_STORE_RESP);
    memcpy(val, m.val, m.vlen);
    *vlen = m.vlen;
    int st = m.status;
    free(rest);
    free(all);
    return st;
}

static void test_garbage_clients(void **state)
{
    fixture_t *f = *state;
    rx_store_client_t good;
    connect_ok(f, &good);
    assert_int_equal(rx_store_set(&good, "k", "v1", 2, deadline(5)), 0);

    /* garbage instead of a HELLO: dropped and counted as a refused handshake */
    int g = raw_connect(f);
    raw_send(g, "GARBAGE GARBAGE GARBAGE", 23);
    expect_hangup(g);
    close(g);
    assert_int_equal(rx_store_server_rejected(f->srv), 1);

    /* a HELLO with a bad version */
    g = raw_connect(f);
    en_hello_t h = {.version = 99, .kind = EN_HELLO_STORE, .rank = 0, .world = WORLD};
    en_hello_set_token(&h, TOKEN);
    uint8_t hb[EN_HELLO_SIZE];
    en_hello_encode(&h, hb);
    raw_send(g, hb, sizeof(hb));
    expect_hangup(g);
    close(g);
    assert_int_equal(rx_store_server_rejected(f->srv), 2);

    /* a data-rail HELLO at the store */
    g = raw_connect(f);
    h.version = EN_PROTO_VERSION;
    h.kind = EN_HELLO_DATA;
    en_hello_encode(&h, hb);
    raw_send(g, hb, sizeof(hb));
    expect_hangup(g);
    close(g);
    assert_int_equal(rx_store_server_rejected(f->srv), 3);

    /* a good HELLO, then garbage: dropped as a malformed message */
    g = raw_connect(f);
    raw_handshake(g);
    raw_send(g, "COHSXXXXXXXXXXXXXXXX", 20); /* type 'X' */
    expect_hangup(g);
    close(g);
    /* a good HELLO, then a response sent to the server */
    g = raw_connect(f);
    raw_handshake(g);
    uint8_t m[64];
    int n = rx_store_encode(RX_STORE_RESP, 0, 0, NULL, 0, "v", 1, m, sizeof(m));
    raw_send(g, m, (size_t)n);
    expect_hangup(g);
    close(g);
    /* a key longer than the limit: refused at the header */
    g = raw_connect(f);
    raw_handshake(g);
    n = rx_store_encode(RX_STORE_GET, 0, 0, "k", 1, NULL, 0, m, sizeof(m));
    en_put16(m + 6, RX_STORE_KEY_MAX + 1);
    raw_send(g, m, RX_STORE_HDR);
    expect_hangup(g);
    close(g);
    /* a client that connects and hangs up at once */
    g = raw_connect(f);
    close(g);
    /* those were handshakes that succeeded: not counted as refused */
    assert_int_equal(rx_store_server_rejected(f->srv), 3);

    /* the good client never noticed */
    char buf[8];
    size_t vlen;
    assert_int_equal(rx_store_get(&good, "k", buf, sizeof(buf), &vlen, -1, deadline(5)), 0);
    assert_int_equal(vlen, 2);
    assert_memory_equal(buf, "v1", 2);
    rx_store_close(&good);
}

/* Requests sent back to back: answered in order, and a pending WAIT holds
 * back the requests behind it. */
static void test_pipelined(void **state)
{
    fixture_t *f = *state;
    int g = raw_connect(f);
    raw_handshake(g);
    uint8_t m[256];
    size_t off = 0;
    int n = rx_store_encode(RX_STORE_SET, 0, 0, "a", 1, "1", 1, m + off, sizeof(m) - off);
    off += (size_t)n;
    n = rx_store_encode(RX_STORE_GET, 0, 0, "a", 1, NULL, 0, m + off, sizeof(m) - off);
    off += (size_t)n;
    n = rx_store_encode(RX_STORE_WAIT, 0, 10000, "p", 1, NULL, 0, m + off, sizeof(m) - off);
    off += (size_t)n;
    n = rx_store_encode(RX_STORE_GET, 0, 0, "q", 1, NULL, 0, m + off, sizeof(m) - off);
    off += (size_t)n;
    n = rx_store_encode(RX_STORE_ADD, 0, 2, "c", 1, NULL, 0, m + off, sizeof(m) - off);
    off += (size_t)n;
    /* in two pieces that split a header */
    raw_send(g, m, 21);
    uv_sleep(20);
    raw_send(g, m + 21, off - 21);
    char val[64];
    size_t vlen;
    assert_int_equal(raw_response(g, val, sizeof(val), &vlen), RX_STORE_OK); /* SET */
    assert_int_equal(vlen, 0);
    assert_int_equal(raw_response(g, val, sizeof(val), &vlen), RX_STORE_OK); /* GET a */
    assert_int_equal(vlen, 1);
    assert_int_equal(val[0], '1');
    /* the WAIT holds everything behind it */
    struct pollfd p = {.fd = g, .events = POLLIN};
    assert_int_equal(poll(&p, 1, 200), 0);
    rx_store_client_t c;
    connect_ok(f, &c);
    int64_t v;
    /* the GET of q and the ADD of c have not run yet: c is still missing */
    assert_int_equal(rx_store_get(&c, "c", val, sizeof(val), &vlen, -1, deadline(5)), COH_EAGAIN);
    assert_int_equal(rx_store_set(&c, "p", "pv", 2, deadline(5)), 0);
    assert_int_equal(raw_response(g, val, sizeof(val), &vlen), RX_STORE_OK); /* WAIT p */
    assert_int_equal(vlen, 2);
    assert_memory_equal(val, "pv", 2);
    assert_int_equal(raw_response(g, val, sizeof(val), &vlen), RX_STORE_NOTFOUND); /* GET q */
    assert_int_equal(raw_response(g, val, sizeof(val), &vlen), RX_STORE_OK);       /* ADD c */
    assert_int_equal(vlen, 1);
    assert_int_equal(val[0], '2');
    assert_int_equal(rx_store_add(&c, "c", 1, &v, deadline(5)), 0);
    assert_int_equal(v, 3);
    rx_store_close(&c);
    close(g);
    assert_int_equal(rx_store_server_rejected(f->srv), 0);
}

typedef struct waiter {
    const struct sockaddr *addr;
    _Atomic int connected;
    int status;
} waiter_t;

static void waiter_main(void *arg)
{
    waiter_t *w = arg;
    rx_store_client_t c;
    w->status = rx_store_connect(&c, w->addr, TOKEN, 1, WORLD, INC, deadline(5));
    if (w->status) return;
    atomic_store(&w->connected, 1);
    char buf[8];
    size_t vlen;
    w->status = rx_store_get(&c, "forever", buf, sizeof(buf), &vlen, 60000, deadline(30));
    rx_store_close(&c);
}

/* Stopping the reactor with clients still connected, one of them in a
 * WAIT: every handle closes (stop returns 0 in teardown) and the waiting
 * client sees the connection end instead of hanging. */
static void test_stop_with_clients(void **state)
{
    fixture_t *f = *state;
    rx_store_client_t idle;
    connect_ok(f, &idle);
    int half = raw_connect(f); /* connected, HELLO half sent */
    uint8_t hb[EN_HELLO_SIZE];
    en_hello_t h = {.version = EN_PROTO_VERSION, .kind = EN_HELLO_STORE, .rank = 1, .world = WORLD};
    en_hello_encode(&h, hb);
    raw_send(half, hb, 10);
    waiter_t w = {.addr = sa(f), .status = -100};
    uv_thread_t th;
    assert_int_equal(uv_thread_create(&th, waiter_main, &w), 0);
    /* once connected, the client's WAIT is on its way: whether or not the
     * server has read it, the stop must end it */
    for (int i = 0; i < 500 && !atomic_load(&w.connected); i++) uv_sleep(10);
    uv_sleep(100);
    uint64_t t0 = bs_now_ns();
    int st = rx_reactor_stop(&f->rx);
    if (st) print_error("rx_reactor_stop: %s\n", coh_last_error());
    assert_int_equal(st, 0);
    assert_int_equal(uv_thread_join(&th), 0);
    assert_int_equal(atomic_load(&w.connected), 1);
    assert_int_equal(w.status, COH_EPEER);
    assert_true(bs_now_ns() - t0 < 10 * SEC);
    expect_hangup(half);
    close(half);
    /* the idle client finds the connection gone */
    char buf[4];
    size_t vlen;
    assert_int_not_equal(rx_store_get(&idle, "k", buf, sizeof(buf), &vlen, -1, deadline(5)), 0);
    rx_store_close(&idle);
    /* teardown stops again: a no-op */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_codec_roundtrip),
        cmocka_unit_test(test_codec_limits),
        cmocka_unit_test(test_codec_invalid),
        cmocka_unit_test_setup_teardown(test_set_get, setup, teardown),
        cmocka_unit_test_setup_teardown(test_get_missing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wait_then_set, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wait_timeout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_add, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wait_on_add, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cap_keys, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cap_bytes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_incarnation_older_store, setup, teardown),
        cmocka_unit_test_setup_teardown(test_incarnation_deadline, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wrong_token, setup, teardown),
        cmocka_unit_test_setup_teardown(test_garbage_clients, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pipelined, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stop_with_clients, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
