/*
 * The soft verbs provider (engines/en_softrdma.c) against the RC semantics
 * the verbs engine depends on, two devices on loopback in one process:
 * writes land in order before the immediate that follows them; an
 * immediate with no receive posted waits (RNR) without failing, and goes
 * once one is; a bad rkey or an address outside the region fails the
 * request at the requester (REM_ACCESS_ERR), the rest flushed, and the
 * responder's QP is in error; a bad lkey fails locally (LOC_PROT_ERR); a
 * QP in error flushes what is posted and what is posted after; a peer
 * that went fails the next write (RETRY_EXC_ERR); a responder that never
 * answers fails it after the retry time; the channel gets one event per
 * arming; the port follows its interface, with an event for each change
 * (root only). The GID table holds the interface's addresses (IPv4 mapped
 * first, then IPv6); a QP pair on IPv6 GIDs (::1) works as on IPv4, and a
 * source GID of another family than the destination's is refused.
 */

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "engines/en_ibv.h"

static const en_ibv_t *ib = &en_ibv_soft;

typedef struct side {
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_comp_channel *ch;
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    uint8_t *buf;
    struct ibv_mr *mr;
    struct ibv_port_attr pa;
    union ibv_gid gid;
} side_t;

enum { BUF = 1 << 20 };

static void side_open(side_t *s)
{
    char name[64];
    memset(s, 0, sizeof(*s));
    assert_int_equal(ib->dev_of_netdev("lo", name, sizeof(name)), 0);
    assert_string_equal(name, "soft_lo");
    s->ctx = ib->open_device(name);
    assert_non_null(s->ctx);
    assert_int_equal(ib->query_port(s->ctx, 1, &s->pa), 0);
    assert_int_equal(s->pa.state, IBV_PORT_ACTIVE);
    assert_int_equal(ib->query_gid(s->ctx, 1, 0, &s->gid), 0);
    s->pd = ib->alloc_pd(s->ctx);
    s->ch = ib->create_comp_channel(s->ctx);
    s->cq = ib->create_cq(s->ctx, 1024, s, s->ch, 0);
    assert_non_null(s->cq);
    s->buf = calloc(1, BUF);
    s->mr = ib->reg_mr(s->pd, s->buf, BUF, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    assert_non_null(s->mr);
    struct ibv_qp_init_attr ia = {
        .send_cq = s->cq,
        .recv_cq = s->cq,
        .cap = {.max_send_wr = 64, .max_recv_wr = 64, .max_send_sge = 1, .max_recv_sge = 1},
        .qp_type = IBV_QPT_RC,
        .sq_sig_all = 1};
    s->qp = ib->create_qp(s->pd, &ia);
    assert_non_null(s->qp);
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1};
    assert_int_equal(ib->modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PORT), 0);
}

/* RTR towards a port and QP number at the address of gid, from source
 * GID sgid; then RTS (its status). */
static int side_connect_sgid(side_t *s, uint16_t lid, const union ibv_gid *gid, uint32_t qpn,
                             int sgid)
{
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTR, .dest_qp_num = qpn};
    a.ah_attr.is_global = 1;
    a.ah_attr.dlid = lid;
    a.ah_attr.grh.dgid = *gid;
    a.ah_attr.grh.sgid_index = (uint8_t)sgid;
    assert_int_equal(ib->modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_DEST_QPN), 0);
    struct ibv_qp_attr r = {.qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7};
    return ib->modify_qp(s->qp, &r, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT);
}

/* The same from GID 0 (127.0.0.1), which must work. */
static void side_connect_to(side_t *s, uint16_t lid, const union ibv_gid *gid, uint32_t qpn)
{
    assert_int_equal(side_connect_sgid(s, lid, gid, qpn, 0), 0);
}

static void pair(side_t *a, side_t *b)
{
    side_open(a);
    side_open(b);
    side_connect_to(a, b->pa.lid, &b->gid, b->qp->qp_num);
    side_connect_to(b, a->pa.lid, &a->gid, a->qp->qp_num);
}

/* The index of GID g in ctx's table, or -1. */
static int gid_index(struct ibv_context *ctx, const union ibv_gid *g)
{
    struct ibv_port_attr pa;
    assert_int_equal(ib->query_port(ctx, 1, &pa), 0);
    for (int i = 0; i < pa.gid_tbl_len; i++) {
        union ibv_gid e;
        if (ib->query_gid(ctx, 1, i, &e) == 0 && !memcmp(e.raw, g->raw, 16)) return i;
    }
    return -1;
}

static void side_close(side_t *s)
{
    if (s->qp) ib->destroy_qp(s->qp);
    ib->dereg_mr(s->mr);
    assert_int_equal(ib->destroy_cq(s->cq), 0);
    ib->destroy_comp_channel(s->ch);
    ib->dealloc_pd(s->pd);
    ib->close_device(s->ctx);
    free(s->buf);
}

static int post_write(side_t *s, uint64_t id, void *src, uint32_t len, uint32_t lkey,
                      uint64_t raddr, uint32_t rkey, bool imm, uint32_t imm_v)
{
    struct ibv_sge sge = {.addr = (uint64_t)(uintptr_t)src, .length = len, .lkey = lkey};
    struct ibv_send_wr wr = {.wr_id = id,
                             .sg_list = len ? &sge : NULL,
                             .num_sge = len ? 1 : 0,
                             .opcode = imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE,
                             .send_flags = IBV_SEND_SIGNALED},
                       *bad;
    wr.imm_data = htonl(imm_v);
    wr.wr.rdma.remote_addr = raddr;
    wr.wr.rdma.rkey = rkey;
    return ib->post_send(s->qp, &wr, &bad);
}

static void post_recv(side_t *s, uint64_t id)
{
    struct ibv_recv_wr wr = {.wr_id = id}, *bad;
    assert_int_equal(ib->post_recv(s->qp, &wr, &bad), 0);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* The next completion, within secs (fails the test otherwise). */
static struct ibv_wc wait_wc(side_t *s, double secs)
{
    struct ibv_wc wc;
    double end = now_s() + secs;
    while (ib->poll_cq(s->cq, 1, &wc) == 0) {
        if (now_s() > end) fail_msg("no completion in %.1f s", secs);
        usleep(200);
    }
    return wc;
}

static void no_wc(side_t *s, double secs)
{
    struct ibv_wc wc;
    double end = now_s() + secs;
    while (now_s() < end) {
        assert_int_equal(ib->poll_cq(s->cq, 1, &wc), 0);
        usleep(1000);
    }
}

static void test_write_then_imm(void **state)
{
    (void)state;
    side_t a, b;
    pair(&a, &b);
    for (int i = 0; i < BUF; i++) a.buf[i] = (uint8_t)(i * 7 + 3);
    post_recv(&b, 77);
    for (int k = 0; k < 4; k++)
        assert_int_equal(post_write(&a, (uint64_t)k + 1, a.buf + k * 65536, 65536, a.mr->lkey,
                                    (uint64_t)(uintptr_t)b.buf + (uint64_t)k * 65536, b.mr->rkey,
                                    false, 0),
                         0);
    assert_int_equal(
        post_write(&a, 5, NULL, 0, 0, (uint64_t)(uintptr_t)b.buf, b.mr->rkey, true, 0x1234567), 0);
    struct ibv_wc w = wait_wc(&b, 10);
    assert_int_equal(w.status, IBV_WC_SUCCESS);
    assert_int_equal(w.wr_id, 77);
    assert_int_equal(w.opcode, IBV_WC_RECV_RDMA_WITH_IMM);
    assert_true(w.wc_flags & IBV_WC_WITH_IMM);
    assert_int_equal(ntohl(w.imm_data), 0x1234567);
    assert_memory_equal(a.buf, b.buf, 4 * 65536); /* every write before the immediate landed */
    for (uint64_t k = 1; k <= 5; k++) {           /* in order */
        w = wait_wc(&a, 10);
        assert_int_equal(w.status, IBV_WC_SUCCESS);
        assert_int_equal(w.wr_id, k);
    }
    side_close(&a);
    side_close(&b);
}

/* lo's addresses as GIDs: 127.0.0.1 (mapped) at index 0, ::1 after it when
 * IPv6 is on; the entries past them empty (query_gid: zero; query_gid_ex:
 * ENODATA), and none past the table. */
static void test_gid_table(void **state)
{
    (void)state;
    side_t a;
    side_open(&a);
    static const uint8_t v4lo[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1};
    assert_memory_equal(a.gid.raw, v4lo, 16);
    assert_true(a.pa.gid_tbl_len > 1);
    union ibv_gid v6lo = {.raw = {[15] = 1}}, g;
    int i6 = gid_index(a.ctx, &v6lo), last = -1;
    if (i6 >= 0) assert_true(i6 > 0); /* IPv4 first */
    struct ibv_gid_entry e;
    for (int i = 0; i < a.pa.gid_tbl_len; i++) {
        assert_int_equal(ib->query_gid(a.ctx, 1, i, &g), 0);
        static const uint8_t zero[16];
        int r = ib->query_gid_ex(a.ctx, 1, (uint32_t)i, &e);
        if (!memcmp(g.raw, zero, 16)) {
            assert_int_equal(r, ENODATA);
            continue;
        }
        assert_int_equal(r, 0);
        assert_int_equal(e.gid_type, IBV_GID_TYPE_ROCE_V2);
        assert_memory_equal(e.gid.raw, g.raw, 16);
        assert_int_equal(last, i - 1); /* the entries come first, packed */
        last = i;
    }
    assert_true(last >= 0);
    assert_int_not_equal(ib->query_gid(a.ctx, 1, a.pa.gid_tbl_len, &g), 0);
    side_close(&a);
}

/* A pair on ::1 (skipped where lo has no IPv6): writes and the immediate
 * land as on IPv4. A source GID of the other family is refused at RTS:
 * RoCE v2 carries one family end to end. */
static void test_ipv6_pair(void **state)
{
    (void)state;
    side_t a, b;
    side_open(&a);
    side_open(&b);
    union ibv_gid v6lo = {.raw = {[15] = 1}};
    int ia = gid_index(a.ctx, &v6lo), ib6 = gid_index(b.ctx, &v6lo);
    if (ia < 0 || ib6 < 0) {
        side_close(&a);
        side_close(&b);
        skip();
    }
    assert_int_equal(side_connect_sgid(&a, b.pa.lid, &v6lo, b.qp->qp_num, 0), EINVAL);
    side_close(&a);
    side_open(&a);
    assert_int_equal(side_connect_sgid(&a, b.pa.lid, &v6lo, b.qp->qp_num, ia), 0);
    assert_int_equal(side_connect_sgid(&b, a.pa.lid, &v6lo, a.qp->qp_num, ib6), 0);
    for (int i = 0; i < 65536; i++) a.buf[i] = (uint8_t)(i * 5 + 1);
    post_recv(&b, 9);
    assert_int_equal(post_write(&a, 1, a.buf, 65536, a.mr->lkey, (uint64_t)(uintptr_t)b.buf,
                                b.mr->rkey, true, 42),
                     0);
    struct ibv_wc w = wait_wc(&b, 10);
    assert_int_equal(w.status, IBV_WC_SUCCESS);
    assert_int_equal(ntohl(w.imm_data), 42);
    assert_memory_equal(a.buf, b.buf, 65536);
    w = wait_wc(&a, 10);
    assert_int_equal(w.status, IBV_WC_SUCCESS);
    side_close(&a);
    side_close(&b);
}

static void test_rnr_waits(void **state)
{
    (void)state;
    side_t a, b;
    pair(&a, &b);
    assert_int_equal(post_write(&a, 1, NULL, 0, 0, (uint64_t)(uintptr_t)b.buf, b.mr->rkey, true, 9),
                     0);
    no_wc(&a, 1.5); /* past the retry time: an RNR is no failure */
    no_wc(&b, 0.01);
    post_recv(&b, 5);
    struct ibv_wc w = wait_wc(&b, 10);
    assert_int_equal(w.status, IBV_WC_SUCCESS);
    assert_int_equal(ntohl(w.imm_data), 9);
    w = wait_wc(&a, 10);
    assert_int_equal(w.status, IBV_WC_SUCCESS);
    en_soft_stats_t st;
    en_soft_stats(b.ctx, &st);
    assert_true(st.rnr_waits >= 1);
    en_soft_stats(a.ctx, &st);
    assert_int_equal(st.retry_timeouts, 0);
    side_close(&a);
    side_close(&b);
}

static void access_error(uint32_t rkey_delta, uint64_t off, uint32_t len)
{
    side_t a, b;
    pair(&a, &b);
    post_recv(&b, 50);
    assert_int_equal(post_write(&a, 1, a.buf, 4096, a.mr->lkey, (uint64_t)(uintptr_t)b.buf,
                                b.mr->rkey, false, 0),
                     0);
    assert_int_equal(post_write(&a, 2, a.buf, len, a.mr->lkey, (uint64_t)(uintptr_t)b.buf + off,
                                b.mr->rkey + rkey_delta, false, 0),
                     0);
    assert_int_equal(
        post_write(&a, 3, a.buf, 8, a.mr->lkey, (uint64_t)(uintptr_t)b.buf, b.mr->rkey, false, 0),
        0);
    struct ibv_wc w = wait_wc(&a, 10);
    assert_int_equal(w.wr_id, 1);
    assert_int_equal(w.status, IBV_WC_SUCCESS);
    w = wait_wc(&a, 10);
    assert_int_equal(w.wr_id, 2);
    assert_int_equal(w.status, IBV_WC_REM_ACCESS_ERR);
    w = wait_wc(&a, 10);
    assert_int_equal(w.wr_id, 3);
    assert_int_equal(w.status, IBV_WC_WR_FLUSH_ERR);
    w = wait_wc(&b, 10); /* the responder is in error too: its receive flushed */
    assert_int_equal(w.wr_id, 50);
    assert_int_equal(w.status, IBV_WC_WR_FLUSH_ERR);
    side_close(&a);
    side_close(&b);
}

static void test_remote_access_errors(void **state)
{
    (void)state;
    access_error(1, 0, 64);        /* a key nobody has */
    access_error(0, BUF - 32, 64); /* past the region's end */
}

static void test_local_protection(void **state)
{
    (void)state;
    side_t a, b;
    pair(&a, &b);
    assert_int_equal(post_write(&a, 1, a.buf, 64, a.mr->lkey + 1, (uint64_t)(uintptr_t)b.buf,
                                b.mr->rkey, false, 0),
                     0);
    struct ibv_wc w = wait_wc(&a, 10);
    assert_int_equal(w.status, IBV_WC_LOC_PROT_ERR);
    side_close(&a);
    side_close(&b);
}

static void test_error_state_flushes(void **state)
{
    (void)state;
    side_t a, b;
    pair(&a, &b);
    post_recv(&a, 11);
    post_recv(&a, 12);
    struct ibv_qp_attr e = {.qp_state = IBV_QPS_ERR};
    assert_int_equal(ib->modify_qp(a.qp, &e, IBV_QP_STATE), 0);
    struct ibv_wc w = wait_wc(&a, 1);
    assert_int_equal(w.wr_id, 11);
    assert_int_equal(w.status, IBV_WC_WR_FLUSH_ERR);
    w = wait_wc(&a, 1);
    assert_int_equal(w.wr_id, 12);
    /* posted after: flushed too, each with its completion */
    assert_int_equal(
        post_write(&a, 13, NULL, 0, 0, (uint64_t)(uintptr_t)b.buf, b.mr->rkey, true, 1), 0);
    w = wait_wc(&a, 1);
    assert_int_equal(w.wr_id, 13);
    assert_int_equal(w.status, IBV_WC_WR_FLUSH_ERR);
    side_close(&a);
    side_close(&b);
}

static void test_peer_gone(void **state)
{
    (void)state;
    side_t a, b;
    pair(&a, &b);
    post_recv(&b, 1);
    assert_int_equal(post_write(&a, 1, NULL, 0, 0, (uint64_t)(uintptr_t)b.buf, b.mr->rkey, true, 1),
                     0);
    assert_int_equal(wait_wc(&a, 10).status, IBV_WC_SUCCESS);
    side_close(&b); /* its process went: the NIC closes its connections */
    double t0 = now_s();
    struct ibv_wc w;
    for (int i = 2;; i++) { /* the first write may still be taken by the socket */
        assert_int_equal(post_write(&a, (uint64_t)i, a.buf, 64, a.mr->lkey, 4096, 1, false, 0), 0);
        w = wait_wc(&a, 10);
        if (w.status != IBV_WC_SUCCESS) break;
        assert_true(now_s() - t0 < 10);
    }
    assert_int_equal(w.status, IBV_WC_RETRY_EXC_ERR);
    side_close(&a);
}

static void test_retry_timeout(void **state)
{
    (void)state;
    /* A "peer" whose NIC accepts and never answers. */
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sa);
    assert_int_equal(bind(l, (struct sockaddr *)&sa, sl), 0);
    assert_int_equal(listen(l, 4), 0);
    assert_int_equal(getsockname(l, (struct sockaddr *)&sa, &sl), 0);
    side_t a;
    side_open(&a);
    side_connect_to(&a, ntohs(sa.sin_port), &a.gid, 99);
    double t0 = now_s();
    assert_int_equal(post_write(&a, 1, a.buf, 64, a.mr->lkey, 4096, 1, false, 0), 0);
    assert_int_equal(post_write(&a, 2, a.buf, 64, a.mr->lkey, 4096, 1, false, 0), 0);
    struct ibv_wc w = wait_wc(&a, 10);
    double took = now_s() - t0;
    assert_int_equal(w.wr_id, 1);
    assert_int_equal(w.status, IBV_WC_RETRY_EXC_ERR);
    assert_int_equal(wait_wc(&a, 1).status, IBV_WC_WR_FLUSH_ERR);
    assert_true(took >= 0.9 && took < 5); /* 4.096 us << 14 x 8, at least 1 s */
    en_soft_stats_t st;
    en_soft_stats(a.ctx, &st);
    assert_int_equal(st.retry_timeouts, 1);
    side_close(&a);
    close(l);
}

static void test_channel_events(void **state)
{
    (void)state;
    side_t a, b;
    pair(&a, &b);
    assert_int_equal(ib->req_notify_cq(b.cq, 0), 0);
    post_recv(&b, 1);
    post_recv(&b, 2);
    assert_int_equal(post_write(&a, 1, NULL, 0, 0, (uint64_t)(uintptr_t)b.buf, b.mr->rkey, true, 1),
                     0);
    struct pollfd p = {.fd = b.ch->fd, .events = POLLIN};
    assert_int_equal(poll(&p, 1, 10000), 1);
    struct ibv_cq *cq;
    void *cctx;
    assert_int_equal(ib->get_cq_event(b.ch, &cq, &cctx), 0);
    assert_ptr_equal(cq, b.cq);
    assert_ptr_equal(cctx, &b);
    ib->ack_cq_events(cq, 1);
    assert_int_equal(wait_wc(&b, 1).wr_id, 1);
    /* not armed again: a second completion makes no event */
    assert_int_equal(post_write(&a, 2, NULL, 0, 0, (uint64_t)(uintptr_t)b.buf, b.mr->rkey, true, 2),
                     0);
    assert_int_equal(wait_wc(&b, 10).wr_id, 2);
    assert_int_equal(poll(&p, 1, 50), 0);
    side_close(&a);
    side_close(&b);
}

static void test_bad_setups(void **state)
{
    (void)state;
    char name[64];
    assert_true(ib->dev_of_netdev("no-such-if0", name, sizeof(name)) < 0);
    assert_null(ib->open_device("mlx5_0"));
    /* A device's interface (a rail named soft_lo:verbs): its port 1 only. */
    assert_int_equal(ib->netdev_of_dev("soft_lo", 1, name, sizeof(name)), 0);
    assert_string_equal(name, "lo");
    assert_true(ib->netdev_of_dev("soft_lo", 2, name, sizeof(name)) < 0);
    assert_true(ib->netdev_of_dev("soft_no-such-if0", 1, name, sizeof(name)) < 0);
    assert_true(ib->netdev_of_dev("mlx5_0", 1, name, sizeof(name)) < 0);
    /* rdma-core reads sysfs: no such device here, and no path games. */
    const en_ibv_t *rc = en_ibv_find("rdma-core");
    assert_non_null(rc);
    assert_true(rc->netdev_of_dev("no_such_dev9", 1, name, sizeof(name)) < 0);
    assert_true(rc->netdev_of_dev("../../../etc", 1, name, sizeof(name)) < 0);
    side_t a;
    side_open(&a);
    struct ibv_qp_init_attr ia = {.send_cq = a.cq,
                                  .recv_cq = a.cq,
                                  .cap = {.max_send_wr = 4, .max_send_sge = 2},
                                  .qp_type = IBV_QPT_RC,
                                  .sq_sig_all = 1};
    assert_null(ib->create_qp(a.pd, &ia)); /* several SGEs: not modelled */
    /* RTS before RTR, and a send before RTS, are refused */
    struct ibv_qp_attr r = {.qp_state = IBV_QPS_RTS};
    assert_int_not_equal(ib->modify_qp(a.qp, &r, IBV_QP_STATE), 0);
    assert_int_not_equal(post_write(&a, 1, a.buf, 8, a.mr->lkey, 0, 0, false, 0), 0);
    assert_int_equal(ib->destroy_cq(a.cq), EBUSY); /* a QP uses it */
    side_close(&a);
}

/* The port follows its interface, and says so (root only: a veth pair in a
 * network namespace of its own, made in a child process). Down (the link,
 * its address, the carrier) is IBV_PORT_DOWN and one IBV_EVENT_PORT_ERR on
 * the async fd; up again is IBV_PORT_ACTIVE and one IBV_EVENT_PORT_ACTIVE.
 * The verbs engine fails a link at once on the first, and moves it back on
 * the second. */
static int next_event(struct ibv_context *ctx, int ms)
{
    struct pollfd p = {.fd = ctx->async_fd, .events = POLLIN};
    if (poll(&p, 1, ms) != 1) return -1;
    struct ibv_async_event ev;
    if (ib->get_async_event(ctx, &ev) != 0) return -1;
    int t = (int)ev.event_type;
    if (ev.element.port_num != 1) t = -2;
    ib->ack_async_event(&ev);
    return t;
}

static int port_state(struct ibv_context *ctx)
{
    struct ibv_port_attr pa;
    return ib->query_port(ctx, 1, &pa) == 0 ? (int)pa.state : -1;
}

/* The next port event, GID changes (an address came or went) passed over. */
static int next_port_event(struct ibv_context *ctx, int ms)
{
    for (;;) {
        int t = next_event(ctx, ms);
        if (t != IBV_EVENT_GID_CHANGE) return t;
    }
}

/* GID changes until the table holds gid (or, present false, no longer
 * does), the port active throughout: 0, else -1. */
static int gid_change_to(struct ibv_context *ctx, const union ibv_gid *gid, bool present)
{
    for (int i = 0; i < 10; i++) {
        if (next_event(ctx, 3000) != IBV_EVENT_GID_CHANGE) return -1;
        if (port_state(ctx) != IBV_PORT_ACTIVE) return -1;
        if ((gid_index(ctx, gid) >= 0) == present) return 0;
    }
    return -1;
}

static int port_events_child(void)
{
    if (unshare(CLONE_NEWNET) != 0) return 77;
    if (system("ip link add cohva type veth peer name cohvb && ip addr add 10.251.0.1/24 dev "
               "cohva && ip link set cohva up && ip link set cohvb up") != 0)
        return 77;
    struct ibv_context *ctx = NULL;
    for (int i = 0; i < 100 && !ctx; i++) { /* the veth comes up (carrier) in a moment */
        if (i) usleep(20000);
        ctx = ib->open_device("soft_cohva");
        if (ctx && port_state(ctx) != IBV_PORT_ACTIVE) {
            ib->close_device(ctx);
            ctx = NULL;
        }
    }
    if (!ctx) return 10;
    int fl = fcntl(ctx->async_fd, F_GETFL);
    if (fl < 0 || fcntl(ctx->async_fd, F_SETFL, fl | O_NONBLOCK) != 0) return 11;
    if (next_port_event(ctx, 100) != -1) return 12; /* nothing happened yet */
    if (system("ip link set cohva down") != 0) return 13;
    if (next_port_event(ctx, 3000) != IBV_EVENT_PORT_ERR) return 14;
    if (port_state(ctx) != IBV_PORT_DOWN) return 15;
    if (system("ip link set cohva up") != 0) return 16;
    if (next_port_event(ctx, 3000) != IBV_EVENT_PORT_ACTIVE) return 17;
    if (port_state(ctx) != IBV_PORT_ACTIVE) return 18;
    /* Its address gone is down too (the device's GID is that address), and
     * back when the address is (no link message comes then). */
    if (system("ip addr flush dev cohva") != 0) return 22;
    if (next_port_event(ctx, 3000) != IBV_EVENT_PORT_ERR) return 23;
    if (system("ip addr add 10.251.0.1/24 dev cohva") != 0) return 24;
    if (next_port_event(ctx, 3000) != IBV_EVENT_PORT_ACTIVE) return 25;
    /* Addresses come and go with the port up: GID_CHANGE each time, as
     * rdma-core says it (the engine re-picks its GID). An IPv6 address
     * added; the IPv4 one removed (still up: a routable address is left);
     * the IPv6 one removed too: down (a link-local one does not count). */
    if (system("ip -6 addr add fd00:c1::1/64 dev cohva nodad 2>/dev/null") == 0) {
        union ibv_gid v6 = {.raw = {0xfd, 0, 0, 0xc1, [15] = 1}};
        union ibv_gid v4 = {.raw = {[10] = 0xff, 0xff, 10, 251, 0, 1}};
        if (gid_change_to(ctx, &v6, true) != 0) return 26;
        if (system("ip addr del 10.251.0.1/24 dev cohva") != 0) return 27;
        if (gid_change_to(ctx, &v4, false) != 0) return 28;
        if (system("ip -6 addr del fd00:c1::1/64 dev cohva") != 0) return 29;
        if (next_port_event(ctx, 3000) != IBV_EVENT_PORT_ERR) return 30;
        if (system("ip addr add 10.251.0.1/24 dev cohva") != 0) return 31;
        if (next_port_event(ctx, 3000) != IBV_EVENT_PORT_ACTIVE) return 32;
    }
    /* The peer's end down takes the carrier (not running): down too. */
    if (system("ip link set cohvb down") != 0) return 19;
    if (next_port_event(ctx, 3000) != IBV_EVENT_PORT_ERR) return 20;
    if (port_state(ctx) != IBV_PORT_DOWN) return 21;
    ib->close_device(ctx);
    return 0;
}

static void test_port_events(void **state)
{
    (void)state;
    if (geteuid() != 0) skip();
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) _exit(port_events_child());
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    if (WEXITSTATUS(st) == 77) skip(); /* no namespaces or no ip(8) here */
    assert_int_equal(WEXITSTATUS(st), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_write_then_imm),
        cmocka_unit_test(test_gid_table),
        cmocka_unit_test(test_ipv6_pair),
        cmocka_unit_test(test_rnr_waits),
        cmocka_unit_test(test_remote_access_errors),
        cmocka_unit_test(test_local_protection),
        cmocka_unit_test(test_error_state_flushes),
        cmocka_unit_test(test_peer_gone),
        cmocka_unit_test(test_retry_timeout),
        cmocka_unit_test(test_channel_events),
        cmocka_unit_test(test_bad_setups),
        cmocka_unit_test(test_port_events),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
