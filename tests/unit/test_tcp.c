/*
 * The TCP engine against a hand-driven peer: a real engine rail (rank 0 of
 * 2) on a bare loop thread, its ops reporting to a counting completion (no
 * context, no requests: nothing above engines/), and this test playing
 * rank 1 over a raw socket. Checks
 * the handshake (job token first, garbage dropped), frames matched by
 * sequence even when they arrive before the op is submitted, ABORT
 * delivered ahead of its op, signature mismatch answered with an ABORT, and
 * malformed frames closing the connection without taking the rail down.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include "engines/en_dgram.h"
#include "engines/engine.h"
#include "reactor/reactor.h" /* only for a loop thread: rx_reactor_t */

#define TOKEN "sesame"

/* A counting completion: what the engine reported, and how many times. */
typedef struct tdone {
    en_completion_t c;
    uv_mutex_t mu;
    uv_cond_t cv;
    int calls;
    int status;
    int slice;
    char why[BS_ERR_LEN];
} tdone_t;

static void tdone_fn(en_completion_t *c, const en_result_t *r)
{
    tdone_t *d = (tdone_t *)c;
    uv_mutex_lock(&d->mu);
    d->calls++;
    d->status = r->status;
    d->slice = r->slice;
    snprintf(d->why, sizeof(d->why), "%s", r->why);
    uv_cond_broadcast(&d->cv);
    uv_mutex_unlock(&d->mu);
}

static tdone_t *tdone_new(void)
{
    tdone_t *d = coh_zalloc(sizeof(*d));
    d->c.fn = tdone_fn;
    uv_mutex_init(&d->mu);
    uv_cond_init(&d->cv);
    return d;
}

/* The op's status once its completion ran (exactly once), or COH_EAGAIN. */
static int tdone_wait(tdone_t *d, int timeout_ms)
{
    uint64_t deadline = bs_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    uv_mutex_lock(&d->mu);
    while (d->calls == 0 && bs_now_ns() < deadline)
        uv_cond_timedwait(&d->cv, &d->mu, deadline - bs_now_ns());
    int calls = d->calls, st = d->status;
    uv_mutex_unlock(&d->mu);
    if (calls == 0) return COH_EAGAIN;
    usleep(20000); /* a second call would come right after the first */
    uv_mutex_lock(&d->mu);
    calls = d->calls;
    uv_mutex_unlock(&d->mu);
    assert_int_equal(calls, 1);
    return st;
}

static void tdone_free(tdone_t *d)
{
    uv_cond_destroy(&d->cv);
    uv_mutex_destroy(&d->mu);
    coh_free(d);
}

typedef struct fixture {
    rx_reactor_t rx; /* a loop thread, nothing else */
    en_rail_t rail;
} fixture_t;

static void on_stop(rx_reactor_t *rx)
{
    en_rail_shutdown(rx->owner);
}

static int open_fn(rx_reactor_t *rx, void *arg)
{
    (void)arg;
    return en_rail_open(rx->owner, &rx->loop);
}

/* Rank 0 of 2 on one rail, bound to a (127.0.0.1, any port). */
static en_rail_cfg_t rail_cfg(struct sockaddr_in *a, size_t stash, bool udp, int idle_ms)
{
    uv_ip4_addr("127.0.0.1", 0, a);
    return (en_rail_cfg_t){.index = 0,
                           .rank = 0,
                           .world = 2,
                           .nrails = 1,
                           .token = TOKEN,
                           .timeout_ms = 2000,
                           .stash_bytes = stash,
                           .spare_idle_ms = idle_ms,
                           .local = (struct sockaddr *)a,
                           .udp = udp,
                           .udpcfg = {.seg_bytes = 64,
                                      .rate_mbps = 1000,
                                      .delta = 2,
                                      .period_us = 1000,
                                      .rcvbuf_bytes = 1 << 20}};
}

static fixture_t *start_cfg(size_t stash, bool udp, int idle_ms)
{
    fixture_t *f = coh_zalloc(sizeof(*f));
    struct sockaddr_in a;
    en_rail_cfg_t cfg = rail_cfg(&a, stash, udp, idle_ms);
    assert_int_equal(en_rail_init(&f->rail, &cfg), 0);
    assert_int_equal(rx_reactor_start(&f->rx, "test-rail", on_stop, &f->rail), 0);
    assert_int_equal(rx_reactor_call(&f->rx, open_fn, NULL), 0);
    return f;
}

static fixture_t *start(size_t stash)
{
    return start_cfg(stash, false, 0);
}

static int setup(void **state)
{
    *state = start(0);
    return 0;
}

/* A udp rail (bounded loss): datagrams of 64 bytes, early ones kept. */
static int setup_udp(void **state)
{
    *state = start_cfg(1 << 20, true, 0);
    return 0;
}

/* The same rail, keeping early frames in memory (COHORT_STASH_BYTES). */
static int setup_stash(void **state)
{
    *state = start(1 << 20);
    return 0;
}

/* Early frames kept, and the kept buffers freed after 300 ms without an
 * op start (COHORT_SPARE_IDLE_MS). */
static int setup_trim(void **state)
{
    *state = start_cfg(1 << 20, false, 300);
    return 0;
}

static int teardown(void **state)
{
    fixture_t *f = *state;
    assert_int_equal(rx_reactor_stop(&f->rx), 0);
    rx_reactor_fini(&f->rx);
    en_rail_fini(&f->rail);
    coh_free(f);
    return 0;
}

static int start_fn(rx_reactor_t *rx, void *op)
{
    en_rail_start_op(rx->owner, op);
    return 0;
}

static void submit(fixture_t *f, en_op_t *op)
{
    rx_reactor_call(&f->rx, start_fn, op);
}

static int dial(fixture_t *f)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&f->rail.bound, sizeof(struct sockaddr_in)), 0);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

static void send_all(int fd, const void *p, size_t n)
{
    assert_int_equal(send(fd, p, n, MSG_NOSIGNAL), (ssize_t)n);
}

/* Read exactly n bytes; returns n, or 0 when the peer closed first. */
static size_t recv_all(int fd, void *p, size_t n, int timeout_ms)
{
    size_t got = 0;
    while (got < n) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (poll(&pf, 1, timeout_ms) != 1) fail_msg("no data within %d ms", timeout_ms);
        ssize_t r = recv(fd, (char *)p + got, n - got, 0);
        if (r <= 0) return 0;
        got += (size_t)r;
    }
    return got;
}

/* Did the rail close the connection (EOF or reset) within the time? */
static int closed_by_peer(int fd, int timeout_ms)
{
    char c;
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    if (poll(&pf, 1, timeout_ms) != 1) return 0;
    ssize_t r = recv(fd, &c, 1, 0);
    return r == 0 || (r < 0 && errno == ECONNRESET);
}

static void hello(int fd, const char *token, uint32_t rank)
{
    en_hello_t h = {.version = EN_PROTO_VERSION,
                    .kind = EN_HELLO_DATA,
                    .rank = rank,
                    .world = 2,
                    .rail = 0,
                    .nrails = 1};
    en_hello_set_token(&h, token);
    uint8_t b[EN_HELLO_SIZE];
    en_hello_encode(&h, b);
    send_all(fd, b, sizeof(b));
}

/* Handshake as rank 1 and wait until the rail counts us connected. */
static int join(fixture_t *f)
{
    int fd = dial(f);
    hello(fd, TOKEN, 1);
    uint8_t b[EN_HELLO_SIZE];
    assert_int_equal(recv_all(fd, b, sizeof(b), 2000), sizeof(b));
    en_hello_t h;
    assert_int_equal(en_hello_decode(b, sizeof(b), &h), EN_HELLO_SIZE);
    assert_int_equal(h.rank, 0);
    assert_true(en_hello_token_ok(&h, TOKEN));
    assert_int_equal(en_rail_wait_connected(&f->rail, bs_now_ns() + 2000000000ull), 0);
    return fd;
}

static void frame(int fd, uint8_t type, uint64_t seq, uint64_t sig, uint32_t tag, const void *p,
                  size_t len)
{
    en_hdr_t h = {.type = type, .seq = seq, .sig = sig, .tag = tag, .len = len};
    uint8_t b[EN_HDR_SIZE];
    en_hdr_encode(&h, b);
    send_all(fd, b, sizeof(b));
    if (len) send_all(fd, p, len);
}

static void read_frame(int fd, en_hdr_t *h, void *payload, size_t cap)
{
    uint8_t b[EN_HDR_SIZE];
    assert_int_equal(recv_all(fd, b, sizeof(b), 3000), sizeof(b));
    assert_int_equal(en_hdr_decode(b, sizeof(b), h), EN_HDR_SIZE);
    assert_true(h->len <= cap);
    if (h->len) assert_int_equal(recv_all(fd, payload, h->len, 3000), h->len);
}

static void wait_stat(_Atomic uint64_t *counter, uint64_t want)
{
    for (int i = 0; i < 200 && atomic_load(counter) < want; i++) usleep(10000);
    assert_int_equal(atomic_load(counter), want);
}

static int peer_lost(fixture_t *f, int p)
{
    return en_rail_peer_lost(&f->rail, p);
}

/* rank 0 receives a 4-float broadcast from rank 1 (root), plus its fence. */
static en_op_t *bcast_op(fixture_t *f, uint64_t seq, uint64_t sig, float *buf, tdone_t **done)
{
    (void)f;
    sc_coll_t c = {.kind = SC_BROADCAST,
                   .algo = SC_ALGO_RD,
                   .nranks = 2,
                   .rank = 0,
                   .root = 1,
                   .count = 4,
                   .lo = 0,
                   .hi = 4,
                   .chunk_elems = 1024};
    sc_plan_t plan;
    sc_plan_init(&plan);
    assert_int_equal(sc_plan_build(&c, &plan), 0);
    *done = tdone_new();
    en_op_t *op;
    assert_int_equal(en_op_new(&(*done)->c, 3, 0, seq, sig, "broadcast(test)", COH_F32, COH_SUM,
                               NULL, buf, &plan, &op),
                     0);
    sc_plan_free(&plan);
    return op;
}

static void test_wrong_token_dropped(void **state)
{
    fixture_t *f = *state;
    int fd = dial(f);
    hello(fd, "not-the-token", 1);
    /* Bytes after the hello must never be looked at: they would be a frame. */
    send_all(fd, "COHF", 4);
    assert_true(closed_by_peer(fd, 2000));
    close(fd);
    wait_stat(&f->rail.stat_rejected, 1);
    /* The rail still accepts the real rank 1. */
    fd = join(f);
    close(fd);
}

static void test_garbage_instead_of_hello(void **state)
{
    fixture_t *f = *state;
    int fd = dial(f);
    send_all(fd, "GET / HTTP/1.1\r\n\r\n", 18);
    assert_true(closed_by_peer(fd, 2000));
    close(fd);
    wait_stat(&f->rail.stat_rejected, 1);
    fd = dial(f);
    hello(fd, TOKEN, 0); /* rank 0 is the rail itself: refused */
    assert_true(closed_by_peer(fd, 2000));
    close(fd);
    wait_stat(&f->rail.stat_rejected, 2);
}

static void test_bad_magic_closes(void **state)
{
    fixture_t *f = *state;
    int fd = join(f);
    send_all(fd, "XXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX", 48);
    assert_true(closed_by_peer(fd, 2000));
    close(fd);
    wait_stat(&f->rail.stat_bad_frames, 1);
}

static void test_unknown_type_closes(void **state)
{
    fixture_t *f = *state;
    int fd = join(f);
    frame(fd, 9, 0, 0, 0, NULL, 0);
    assert_true(closed_by_peer(fd, 2000));
    close(fd);
    wait_stat(&f->rail.stat_bad_frames, 1);
}

/* Data for an op this rank has not submitted yet waits in the socket and
 * is delivered when the op arrives; the fence completes the broadcast. */
static void test_early_frame_matched_by_seq(void **state)
{
    fixture_t *f = *state;
    int fd = join(f);
    float data[4] = {1.5f, -2, 3, 1e9f};
    frame(fd, EN_FRAME_DATA, 0, 77, 0, data, sizeof(data));
    frame(fd, EN_FRAME_DATA, 0, 77, 0x40000000u, NULL, 0); /* the fence */
    usleep(50000);
    float buf[4] = {0};
    tdone_t *req;
    en_op_t *op = bcast_op(f, 0, 77, buf, &req);
    submit(f, op);
    assert_int_equal(tdone_wait(req, 3000), COH_OK);
    assert_int_equal(req->slice, 3); /* the slice index it was given */
    assert_string_equal(req->why, "");
    assert_memory_equal(buf, data, sizeof(data));
    en_hdr_t h;
    read_frame(fd, &h, NULL, 0); /* our fence to rank 1 */
    assert_int_equal(h.type, EN_FRAME_DATA);
    assert_int_equal(h.tag, 0x40000000u);
    assert_int_equal(h.seq, 0);
    tdone_free(req);
    /* A truncated frame, then the peer goes away: the rail survives. */
    send_all(fd, "COHF\1\0", 6);
    close(fd);
    for (int i = 0; i < 200 && !peer_lost(f, 1); i++) usleep(10000);
    assert_int_equal(peer_lost(f, 1), 1);
}

static void test_abort_before_submit(void **state)
{
    fixture_t *f = *state;
    int fd = join(f);
    uint8_t payload[32];
    en_put32(payload, (uint32_t)COH_EMISMATCH);
    memcpy(payload + 4, "rank 1: test says no", 20);
    frame(fd, EN_FRAME_ABORT, 5, 0, 0, payload, 24);
    usleep(50000);
    float buf[4];
    tdone_t *req;
    en_op_t *op = bcast_op(f, 5, 77, buf, &req);
    submit(f, op);
    assert_int_equal(tdone_wait(req, 3000), COH_EMISMATCH);
    assert_non_null(strstr(req->why, "test says no"));
    tdone_free(req);
    close(fd);
}

static void test_signature_mismatch_aborts_peer(void **state)
{
    fixture_t *f = *state;
    int fd = join(f);
    float buf[4], data[4] = {1, 2, 3, 4};
    tdone_t *req;
    en_op_t *op = bcast_op(f, 0, 77, buf, &req);
    submit(f, op);
    frame(fd, EN_FRAME_DATA, 0, 78, 0, data, sizeof(data)); /* a different op */
    assert_int_equal(tdone_wait(req, 3000), COH_EMISMATCH);
    tdone_free(req);
    en_hdr_t h;
    uint8_t p[EN_MAX_ABORT];
    read_frame(fd, &h, p, sizeof(p));
    assert_int_equal(h.type, EN_FRAME_ABORT);
    assert_int_equal(h.seq, 0);
    assert_int_equal((int32_t)en_get32(p), COH_EMISMATCH);
    /* The connection is still good: the next op works. */
    float buf2[4] = {0};
    op = bcast_op(f, 1, 77, buf2, &req);
    submit(f, op);
    frame(fd, EN_FRAME_DATA, 1, 77, 0, data, sizeof(data));
    frame(fd, EN_FRAME_DATA, 1, 77, 0x40000000u, NULL, 0);
    assert_int_equal(tdone_wait(req, 3000), COH_OK);
    assert_memory_equal(buf2, data, sizeof(data));
    tdone_free(req);
    close(fd);
}

/* A peer that stops sending: the op fails after the rail's timeout (2 s). */
static void test_timeout(void **state)
{
    fixture_t *f = *state;
    int fd = join(f);
    float buf[4];
    tdone_t *req;
    en_op_t *op = bcast_op(f, 0, 77, buf, &req);
    uint64_t t0 = bs_now_ns();
    submit(f, op);
    assert_int_equal(tdone_wait(req, 5000), COH_ETIMEDOUT);
    double s = (double)(bs_now_ns() - t0) / 1e9;
    assert_true(s >= 1.9 && s < 3.5);
    assert_non_null(strstr(req->why, "waiting on rank(s) 1"));
    tdone_free(req);
    close(fd);
}

/* Ops submitted in a different order on the two sides (partial sync does
 * that): a frame for an op not submitted yet is kept, and the frames behind
 * it on the connection still reach the op that is waiting for them. */
static void test_out_of_order_ops(void **state)
{
    fixture_t *f = *state;
    int fd = join(f);
    float d0[4] = {1, 2, 3, 4}, d1[4] = {5, 6, 7, 8};
    float b0[4] = {0}, b1[4] = {0};
    tdone_t *r0, *r1;
    submit(f, bcast_op(f, 1, 77, b1, &r1));
    frame(fd, EN_FRAME_DATA, 0, 77, 0, d0, sizeof(d0)); /* op 0: not submitted */
    frame(fd, EN_FRAME_DATA, 0, 77, 0x40000000u, NULL, 0);
    frame(fd, EN_FRAME_DATA, 1, 77, 0, d1, sizeof(d1)); /* op 1: waiting */
    frame(fd, EN_FRAME_DATA, 1, 77, 0x40000000u, NULL, 0);
    assert_int_equal(tdone_wait(r1, 3000), COH_OK);
    assert_memory_equal(b1, d1, sizeof(d1));
    submit(f, bcast_op(f, 0, 77, b0, &r0));
    assert_int_equal(tdone_wait(r0, 3000), COH_OK);
    assert_memory_equal(b0, d0, sizeof(d0));
    tdone_free(r0);
    tdone_free(r1);
    /* A kept frame with another op's signature fails the op at once. */
    frame(fd, EN_FRAME_DATA, 2, 99, 0, d0, sizeof(d0));
    usleep(50000);
    tdone_t *r2;
    submit(f, bcast_op(f, 2, 77, b0, &r2));
    assert_int_equal(tdone_wait(r2, 3000), COH_EMISMATCH);
    tdone_free(r2);
    close(fd);
}

/* ---- the datagram engine (engines/en_udp.c) against a hand-driven rank 1 ---- */

static en_udp_stats_t udp_stats(fixture_t *f)
{
    en_udp_stats_t s;
    en_udp_stats(&f->rail, &s);
    return s;
}

/* Wait until a counter of the rail's udp stats reaches want (and not past). */
#define WAIT_UDP(f, field, want)                                                                   \
    do {                                                                                           \
        for (int i_ = 0; i_ < 300 && udp_stats(f).field < (want); i_++) usleep(10000);             \
        assert_int_equal(udp_stats(f).field, (want));                                              \
    } while (0)

static int udp_socket(struct sockaddr_in *bound)
{
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a;
    uv_ip4_addr("127.0.0.1", 0, &a);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    socklen_t l = sizeof(*bound);
    getsockname(fd, (struct sockaddr *)bound, &l);
    return fd;
}

static void dg_send(fixture_t *f, int fd, const en_dg_hdr_t *h, const float *v, size_t nv)
{
    uint8_t b[EN_DG_HDR + 256];
    en_dg_encode(h, b);
    memcpy(b + EN_DG_HDR, v, nv * sizeof(float));
    assert_int_equal(sendto(fd, b, EN_DG_HDR + nv * sizeof(float), 0,
                            (struct sockaddr *)&f->rail.bound, sizeof(struct sockaddr_in)),
                     (ssize_t)(EN_DG_HDR + nv * sizeof(float)));
}

/* The next datagram; false for a rate report (rank 0 sends one each period
 * while it receives our data) or a datagram copy of a control message
 * (the TCP copy is what this test reads). */
static bool dg_recv(int fd, en_dg_hdr_t *h, float *v)
{
    uint8_t b[EN_DG_HDR + EN_MAX_ABORT];
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    assert_int_equal(poll(&pf, 1, 3000), 1);
    ssize_t n = recv(fd, b, sizeof(b), 0);
    assert_true(n >= EN_DG_HDR);
    if (b[1] & (EN_DG_RATE | EN_DG_CTL)) return false; /* the flags byte */
    assert_int_equal(en_dg_decode(b, (size_t)n, 64, h), 0);
    memcpy(v, b + EN_DG_HDR, h->len);
    return true;
}

/* A DGCTL frame: kind (1 DONE, 3 FIN) of step tag. */
static void dg_ctl(int fd, uint64_t seq, uint32_t tag, int kind, uint32_t nseg)
{
    uint8_t p[24] = {0};
    p[0] = (uint8_t)kind;
    en_put64(p + 8, nseg);
    frame(fd, EN_FRAME_DGCTL, seq, 0, tag, p, sizeof(p));
}

/* Rank 1's side of one datagram transfer to rank 0: two segments of 16
 * floats, then DONE; rank 0 answers FIN. */
static void dg_push(fixture_t *f, int tcp, int us, uint64_t seq, uint32_t tag, bool pull, float x)
{
    float v[16];
    for (int i = 0; i < 16; i++) v[i] = x;
    for (uint32_t s = 0; s < 2; s++) {
        en_dg_hdr_t h = {.flags = (uint8_t)(pull ? EN_DG_PULL : 0) | (s ? EN_DG_LAST : 0),
                         .job = en_dg_job(TOKEN),
                         .step = tag,
                         .seq = seq,
                         .offset = 64u * s,
                         .len = 64,
                         .segno = s};
        dg_send(f, us, &h, v, 16);
    }
    dg_ctl(tcp, seq, tag, 1, 2);
    en_hdr_t h;
    uint8_t p[EN_MAX_ABORT];
    do { /* RATE reports may come first */
        read_frame(tcp, &h, p, sizeof(p));
        assert_int_equal(h.type, EN_FRAME_DGCTL);
    } while (p[0] == 4);
    assert_int_equal(h.tag, tag);
    assert_int_equal(p[0], 3); /* FIN */
}

/*
 * A bounded-loss allreduce of 64 floats between the rail (rank 0) and this
 * test (rank 1), push and pull in datagrams, while hostile datagrams come
 * in: each is dropped and counted (invalid, stranger, duplicate, late), none
 * writes anything, and the result is exact.
 */
static void test_udp_bad_datagrams(void **state)
{
    fixture_t *f = *state;
    int tcp = join(f);
    struct sockaddr_in ua, oa;
    int us = udp_socket(&ua), other = udp_socket(&oa);
    struct sockaddr_storage route;
    memcpy(&route, &ua, sizeof(ua));
    assert_int_equal(en_rail_set_routes(&f->rail, 1, &route, 1), 0);
    float buf[64];
    for (int i = 0; i < 64; i++) buf[i] = 1;
    sc_coll_t c = {.kind = SC_ALLREDUCE,
                   .algo = SC_ALGO_DIRECT,
                   .nranks = 2,
                   .rank = 0,
                   .count = 64,
                   .lo = 0,
                   .hi = 64,
                   .chunk_elems = 1 << 20};
    sc_plan_t plan;
    sc_plan_init(&plan);
    assert_int_equal(sc_plan_build(&c, &plan), 0);
    tdone_t *done = tdone_new();
    en_op_t *op;
    assert_int_equal(
        en_op_new(&done->c, 0, 0, 5, 0, "allreduce(test)", COH_F32, COH_SUM, NULL, buf, &plan, &op),
        0);
    sc_plan_free(&plan);
    en_op_set_loss(op, 1e-9, 1e-9, -1, 0, false);
    submit(f, op);

    /* Rank 0 pushes block 1 (floats 32..63) to us at once (zero RTT). */
    float v[16];
    for (int s = 0; s < 2;) {
        en_dg_hdr_t h;
        if (!dg_recv(us, &h, v)) continue;
        s++;
        assert_int_equal(h.job, en_dg_job(TOKEN));
        assert_int_equal(h.step, 1);
        assert_int_equal(h.seq, 5);
        assert_int_equal(h.len, 64);
        assert_true(v[0] == 1 && v[15] == 1);
    }
    en_hdr_t fh;
    uint8_t p[EN_MAX_ABORT];
    read_frame(tcp, &fh, p, sizeof(p));
    assert_int_equal(fh.type, EN_FRAME_DGCTL);
    assert_int_equal(p[0], 1); /* DONE */
    dg_ctl(tcp, 5, 1, 3, 0);   /* FIN: its push is in */

    /* Hostile datagrams at rank 0's push receive (block 0, tag 1). */
    for (int i = 0; i < 16; i++) v[i] = 1000;
    en_dg_hdr_t good = {.job = en_dg_job(TOKEN), .step = 1, .seq = 5, .len = 64};
    uint8_t junk[10] = "not cohort";
    assert_int_equal(sendto(us, junk, sizeof(junk), 0, (struct sockaddr *)&f->rail.bound,
                            sizeof(struct sockaddr_in)),
                     (ssize_t)sizeof(junk));
    WAIT_UDP(f, dg_bad, 1);
    en_dg_hdr_t h = good;
    h.job ^= 1; /* not this job's value */
    dg_send(f, us, &h, v, 16);
    WAIT_UDP(f, dg_stranger, 1);
    dg_send(f, other, &good, v, 16); /* not from rank 1's address */
    WAIT_UDP(f, dg_stranger, 2);
    h = good;
    h.segno = 5; /* past the receive's two segments */
    h.offset = 5 * 64;
    dg_send(f, us, &h, v, 16);
    WAIT_UDP(f, dg_bad, 2);
    h = good;
    h.step = 9; /* no such step */
    dg_send(f, us, &h, v, 16);
    WAIT_UDP(f, dg_bad, 3);
    h = good;
    h.flags = EN_DG_PULL; /* the push stage's step */
    dg_send(f, us, &h, v, 16);
    WAIT_UDP(f, dg_bad, 4);
    h = good;
    h.len = 32; /* a full segment is 64 bytes here */
    dg_send(f, us, &h, v, 8);
    WAIT_UDP(f, dg_bad, 5);
    assert_int_equal(udp_stats(f).dg_recv, 0);

    /* Our push of block 0 (2.0 each), one segment twice. */
    for (int i = 0; i < 16; i++) v[i] = 2;
    h = good;
    dg_send(f, us, &h, v, 16);
    WAIT_UDP(f, dg_recv, 1);
    dg_send(f, us, &h, v, 16);
    WAIT_UDP(f, dg_dup, 1);
    h.offset = 64;
    h.segno = 1;
    h.flags = EN_DG_LAST;
    dg_send(f, us, &h, v, 16);
    WAIT_UDP(f, dg_recv, 2);
    dg_ctl(tcp, 5, 1, 1, 2); /* DONE: rank 0 has it all */

    /* Then in any order: FIN of our push, and rank 0's pull of block 0 with
     * its DONE (which we answer with FIN). */
    int fins = 0, pulled = 0, dones = 0;
    while (fins < 1 || pulled < 2 || dones < 1) {
        struct pollfd pf[2] = {{.fd = tcp, .events = POLLIN}, {.fd = us, .events = POLLIN}};
        assert_true(poll(pf, 2, 3000) > 0);
        if ((pf[1].revents & POLLIN) && dg_recv(us, &h, v)) {
            assert_int_equal(h.step, 2);
            assert_true(h.flags & EN_DG_PULL);
            for (int i = 0; i < 16; i++) assert_true(v[i] == 3); /* 1 + 2 */
            pulled++;
        }
        if (pf[0].revents & POLLIN) {
            read_frame(tcp, &fh, p, sizeof(p));
            assert_int_equal(fh.type, EN_FRAME_DGCTL);
            if (p[0] == 4) {
                /* RATE: what rank 0 receives of our push, each period */
            } else if (p[0] == 3) {
                assert_int_equal(fh.tag, 1);
                fins++;
            } else {
                assert_int_equal(p[0], 1); /* DONE of its pull */
                assert_int_equal(fh.tag, 2);
                dg_ctl(tcp, 5, 2, 3, 0);
                dones++;
            }
        }
    }
    /* Our pull of block 1: 7.0 each. */
    dg_push(f, tcp, us, 5, 2, true, 7);
    assert_int_equal(tdone_wait(done, 3000), COH_OK);
    for (int i = 0; i < 64; i++) assert_true(buf[i] == (i < 32 ? 3 : 7));

    /* A replay after the op: late, nothing written. */
    h = good;
    dg_send(f, us, &h, v, 16);
    WAIT_UDP(f, dg_late, 1);
    for (int i = 0; i < 64; i++) assert_true(buf[i] == (i < 32 ? 3 : 7));
    tdone_free(done);
    close(us);
    close(other);
    close(tcp);
}

/* What the rail keeps for later ops, read on its loop thread. */
typedef struct kept {
    int nspare;
    uint64_t spare_bytes, scratch_bytes, trimmed;
    size_t scratch_put; /* in: a scratch buffer of this size to keep (0: none) */
} kept_t;

static int kept_fn(rx_reactor_t *rx, void *arg)
{
    en_rail_t *rail = rx->owner;
    kept_t *k = arg;
    if (k->scratch_put) {
        /* As scratch_put leaves a reduce-scatter's scratch (3+ ranks). */
        assert_null(rail->scratch_spare[0]);
        rail->scratch_spare[0] = coh_aligned(k->scratch_put, 64);
        rail->scratch_spare_cap[0] = k->scratch_put;
        k->scratch_put = 0;
    }
    k->nspare = rail->nspare;
    k->spare_bytes = rail->spare_bytes;
    k->scratch_bytes = 0;
    for (int i = 0; i < EN_SCRATCH_KEEP; i++) k->scratch_bytes += rail->scratch_spare_cap[i];
    k->trimmed = atomic_load(&rail->stat_trimmed);
    return 0;
}

static kept_t kept(fixture_t *f, size_t scratch_put)
{
    kept_t k = {.scratch_put = scratch_put};
    assert_int_equal(rx_reactor_call(&f->rx, kept_fn, &k), 0);
    return k;
}

/* rank 1 sends op seq's 4 floats and its fence. */
static void bcast_frames(int fd, uint64_t seq, const float *d)
{
    frame(fd, EN_FRAME_DATA, seq, 77, 0, d, 4 * sizeof(float));
    frame(fd, EN_FRAME_DATA, seq, 77, 0x40000000u, NULL, 0);
}

/* COHORT_SPARE_IDLE_MS (300 here): the buffers of delivered early frames
 * and the reduce-scatter scratch are kept while ops keep starting, also
 * across an op that runs longer than the idle time, and freed once no op
 * started for that long. Before, they stayed until the rail closed. */
static void test_idle_trim(void **state)
{
    fixture_t *f = *state;
    int fd = join(f);
    float d[4] = {1, 2, 3, 4}, b[4];
    tdone_t *r;
    /* Op 0's frames come early: stashed, then delivered, their buffers kept. */
    bcast_frames(fd, 0, d);
    usleep(50000);
    submit(f, bcast_op(f, 0, 77, b, &r));
    assert_int_equal(tdone_wait(r, 3000), COH_OK);
    tdone_free(r);
    kept_t k = kept(f, 1 << 20);
    assert_true(k.nspare >= 1);
    assert_int_equal(k.scratch_bytes, 1 << 20);
    /* Op 1 runs 800 ms, waiting for rank 1: nothing is freed meanwhile. */
    submit(f, bcast_op(f, 1, 77, b, &r));
    usleep(800000);
    k = kept(f, 0);
    assert_true(k.nspare >= 1);
    assert_int_equal(k.scratch_bytes, 1 << 20);
    assert_int_equal(k.trimmed, 0);
    bcast_frames(fd, 1, d);
    assert_int_equal(tdone_wait(r, 3000), COH_OK);
    tdone_free(r);
    /* Short ops every 100 ms, each over between two of the timer's looks
     * (every 250 ms here): still nothing freed. */
    for (uint64_t seq = 2; seq < 14; seq++) {
        submit(f, bcast_op(f, seq, 77, b, &r));
        bcast_frames(fd, seq, d);
        assert_int_equal(tdone_wait(r, 3000), COH_OK);
        assert_memory_equal(b, d, sizeof(d));
        tdone_free(r);
        usleep(80000); /* tdone_wait itself waits 20 ms */
    }
    k = kept(f, 0);
    assert_int_equal(k.trimmed, 0);
    assert_int_equal(k.scratch_bytes, 1 << 20);
    uint64_t had = k.spare_bytes + k.scratch_bytes;
    /* Then nothing: within 300 ms and a timer period, all of it is freed. */
    for (int i = 0; i < 150 && kept(f, 0).trimmed == 0; i++) usleep(10000);
    k = kept(f, 0);
    assert_int_equal(k.nspare, 0);
    assert_int_equal(k.spare_bytes, 0);
    assert_int_equal(k.scratch_bytes, 0);
    assert_int_equal(k.trimmed, had);
    /* The next op works as before (its early frames kept again). */
    bcast_frames(fd, 14, d);
    usleep(50000);
    submit(f, bcast_op(f, 14, 77, b, &r));
    assert_int_equal(tdone_wait(r, 3000), COH_OK);
    assert_memory_equal(b, d, sizeof(d));
    tdone_free(r);
    assert_true(kept(f, 0).nspare >= 1);
    close(fd);
}

/* The rail's record of ended ops keeps the last EN_FIN_MAX, found by
 * (comm, seq) through an index that must forget exactly the evicted ones,
 * also when their keys collide and wrap around the table. */
static void test_fin_index(void **state)
{
    (void)state;
    en_rail_t *rail = coh_zalloc(sizeof(*rail));
    struct sockaddr_in a;
    en_rail_cfg_t cfg = rail_cfg(&a, 0, false, 0);
    assert_int_equal(en_rail_init(rail, &cfg), 0);
    enum { N = EN_FIN_MAX * 5 + 17 };
    /* Keys from three comms, seqs spread so that many share home slots. */
    uint32_t comm[N];
    uint64_t seq[N];
    uint64_t x = 12345;
    for (int i = 0; i < N; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        comm[i] = (uint32_t)(x >> 62);
        seq[i] = (i % 3 == 0) ? (uint64_t)i : (x >> 20) << 12;
    }
    for (int i = 0; i < N; i++) {
        int st = -1 - (i % 7);
        en_exec_cancel(rail, comm[i], seq[i], st, "gone");
        int got = 0;
        assert_true(en_exec_ended(rail, comm[i], seq[i], &got));
        assert_int_equal(got, st);
        /* A second record of the same op keeps one entry. */
        if (i % 11 == 0) en_exec_cancel(rail, comm[i], seq[i], st, "again");
        if (i % 97 == 0 || i == N - 1) {
            for (int j = 0; j <= i; j++) {
                bool dup = false; /* the same key again later */
                for (int k = j + 1; k <= i && !dup; k++)
                    dup = comm[k] == comm[j] && seq[k] == seq[j];
                if (dup) continue;
                bool want = j > i - EN_FIN_MAX;
                assert_int_equal(en_exec_ended(rail, comm[j], seq[j], &got), want);
                if (want) assert_int_equal(got, -1 - (j % 7));
            }
        }
    }
    en_rail_fini(rail);
    coh_free(rail);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fin_index),
        cmocka_unit_test_setup_teardown(test_wrong_token_dropped, setup, teardown),
        cmocka_unit_test_setup_teardown(test_garbage_instead_of_hello, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_magic_closes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unknown_type_closes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_early_frame_matched_by_seq, setup, teardown),
        cmocka_unit_test_setup_teardown(test_abort_before_submit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_signature_mismatch_aborts_peer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_timeout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_early_frame_matched_by_seq, setup_stash, teardown),
        cmocka_unit_test_setup_teardown(test_out_of_order_ops, setup_stash, teardown),
        cmocka_unit_test_setup_teardown(test_udp_bad_datagrams, setup_udp, teardown),
        cmocka_unit_test_setup_teardown(test_idle_trim, setup_trim, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
