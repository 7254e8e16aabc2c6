/*
 * The verbs transport: a rail's links over RDMA reliable connections
 * (COHORT_NICS=NIC:verbs; docs/verbs.md). Built with libibverbs' headers;
 * its calls go through a provider (en_ibv.h): rdma-core and a NIC (never
 * run here: these machines have no RDMA device), or the soft provider
 * (en_softrdma.c, RC in user space over TCP), which the tests run here.
 *
 * A link is one RC queue pair per peer and a ring per direction, as on
 * shared memory (en_shm.c), except that the ring lives in the reader's
 * memory and the writer fills it from afar:
 *   - the writer copies a frame (header, payload, padding to 8) into its
 *     staging ring at the same offsets, RDMA-writes the bytes into the
 *     reader's ring, then sends a zero-length RDMA write with immediate
 *     whose 31 low bits are its new tail: the reader's completion says the
 *     bytes are there (RC places writes in order);
 *   - the reader parses frames straight out of its ring (match, copy or
 *     reduce into the sink), and gives the space back the same way, with
 *     its head in an immediate (the top bit tells the two apart).
 * A send completes once its frame is in the staging ring. Every work
 * request is signalled, so each yields one completion (flushed ones too)
 * and a link's memory goes only when all of its have come back.
 *
 * Zero copy: a frame of COHORT_VERBS_ZCOPY_BYTES or more whose payload lies
 * in memory the application declared (coh_mem_register) skips the staging
 * ring: its header is copied as always, its payload written to the peer's
 * ring straight from a registration of that memory (en_regcache.h, one
 * cache per rail). It completes when the send completion of its last write
 * comes back (an RC send queue completes in order, so a count of send
 * completions tells which frames are done).
 *
 * Set-up goes over TCP beside the queue pair, to the rail's address, as
 * rdma_cm would: the dialler sends its HELLO (the job token, as on TCP)
 * and its endpoint (QP number, PSN, LID, GID, ring address, key and size),
 * the listener checks it, brings its QP to RTS and answers the same way,
 * the dialler brings its QP up and sends READY, and only then does either
 * write. The socket stays open as the liveness check (a peer that dies
 * closes it). A work completion that fails closes the link with the
 * verbs status as the reason (COH_EPEER), as a broken socket does on TCP;
 * the rail reports the peer gone and the balancer moves the world's ops to
 * the other rails.
 *
 * One completion queue per rail, with a completion channel whose fd a
 * uv_poll_t watches; the rail's poll hook also drains the queue, so a loop
 * that is awake sees completions without a system call.
 *
 * Threading: the rail's loop thread.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/bs_alloc.h"
#include "engines/en_link.h"
#include "engines/en_ibv.h"
#include "engines/en_regcache.h"

#define VB_EP_SIZE      64
#define VB_RQ_DEPTH     128 /* receives posted per QP: immediates in flight */
#define VB_SQ_DEPTH     512
#define VB_SQ_SLACK     8 /* sends kept free for the head's immediate */
#define VB_HANDSHAKE_MS 10000
#define VB_RESUME_TICK  50          /* ms: a resume's dials and deadline are checked */
#define VB_DIAL_MS      1000        /* a resume dial not answered by then is tried again */
#define VB_POKE_MS      200         /* the higher rank, waiting for a dial, pokes this often */
#define VB_IMM_HEAD     0x80000000u /* an immediate carrying the reader's head */
#define VB_POS_MASK     0x7fffffffu
#define VB_READY        0x52 /* the dialler's last handshake byte */
#define VB_REFUSE       0x4e /* alone, then the end: a resume of a link this side has not */
#define VB_QPFAIL       0x51 /* for an answer or READY, then the end: our new QP failed */
#define VB_PIECE        (256u * 1024) /* written per work request at most */

typedef enum vb_kind { VB_WR_RECV = 0, VB_WR_SEND = 1 } vb_kind;
/* A link: set up, live, resuming on a new QP after a failure (failover,
 * below), closed. */
typedef enum vb_phase { VB_SETUP = 0, VB_LIVE, VB_RESUMING, VB_CLOSED } vb_phase;
/* Its TCP socket: connecting (the dialler's connect is in flight, under the
 * handshake's deadline), waiting for the peer's HELLO, waiting for the
 * dialler's READY, live (the liveness check). SK_ANSWER: an accepted
 * resume whose answer waits until this side's new QP exists. */
typedef enum vb_sk_phase {
    SK_CONNECTING = 0,
    SK_HELLO,
    SK_WAIT_READY,
    SK_LIVE,
    SK_ANSWER
} vb_sk_phase;

/* What one side tells the other: its QP and the ring the other writes to. */
typedef struct vb_ep {
    uint32_t qpn, psn;
    uint16_t lid;
    uint8_t gid[16];
    uint64_t ring_addr;
    uint32_t ring_rkey;
    uint64_t ring_size;
    uint32_t mtu; /* enum ibv_mtu */
} vb_ep_t;

/* A TCP socket beside the QP: set-up, then liveness. Separate from the link
 * so that a resume's socket can replace it (the poll handle frees itself
 * once closed). */
typedef struct vb_sock {
    uv_poll_t poll;
    int fd;
    int phase;
    bool resume;         /* it carries a resume */
    bool poke;           /* the higher rank's nudge: a resume HELLO, then the end */
    bool back;           /* the lower rank's test of its own interface, off it */
    int via;             /* a resume's: the rail whose device carries the new QPs */
    uint64_t send_at_ns; /* tests (test_poke_ms): a poke connected, its HELLO sent then */
    struct vb_conn *t;
    uint8_t in[EN_HELLO_SIZE + VB_EP_SIZE];
    size_t got;
} vb_sock_t;

typedef struct vb_conn {
    en_conn_t base; /* first member */
    struct en_verbs *tr;
    struct vb_conn *prev, *next;
    vb_sock_t *sk;    /* set-up, then liveness */
    vb_sock_t *rsk;   /* resuming: our dial, or the peer's waiting for an answer */
    vb_sock_t *psk;   /* resuming, the higher rank: a poke in flight */
    uv_timer_t timer; /* the handshake's deadline; resuming: the resume's tick */
    int handles;
    int phase;
    int expect_peer;
    struct ibv_qp *qp;
    int via; /* the device its QP is on: the rail's own, or another's (moved) */
    vb_ep_t mine, theirs;
    uint8_t *rx_ring, *tx_ring;                               /* ring_size each */
    struct ibv_mr *rx_mr[EN_MAX_RAILS], *tx_mr[EN_MAX_RAILS]; /* per device, once used */
    uint64_t size;
    int wr_out; /* work requests posted and not completed */
    int sq_out; /* of them, sends */
    bool err;   /* the QP failed: post nothing more */
    /* Sending: frames in order; q_off bytes of the head's are in the ring. */
    en_wreq_t *q_head, *q_tail;
    uint64_t q_off;
    uint64_t tx_tail;   /* bytes copied into the staging ring */
    uint64_t tx_posted; /* of them, written to the peer */
    uint64_t tx_told;   /* the tail the peer was last told */
    uint64_t peer_head; /* the peer consumed (its immediates) */
    /* Zero copy: the head frame's registration (NULL: copied); frames whose
     * writes are posted, oldest first, each done when sq_done reaches its
     * tr.vb.mark (with failover: when the peer's head passes its end); send
     * work requests posted and completed, ever. */
    en_reg_t *q_reg;
    en_wreq_t *zc_head, *zc_tail;
    uint64_t sq_posted, sq_done;
    /* Receiving */
    uint64_t rx_tail; /* the peer wrote (its immediates) */
    uint64_t rx_head; /* we consumed */
    uint64_t rx_told; /* the head the peer was last told */
    uint64_t rx_pad;
    en_kick_t kick; /* process and pump, not nested (en_link.h) */
    /* Failover (several rails): a failed QP is replaced and the link goes
     * on from where each side's ring stopped. keep: frames from declared
     * memory complete when consumed, so they can be written again. */
    bool keep;
    struct ibv_qp *old_qp; /* the failed QP, until its work requests flushed */
    struct vb_dev *old_dev;
    int old_out;
    int want;             /* resuming: the device of the next dial (-1: the next usable) */
    int tries;            /* resuming: dials and pokes so far (which device is next) */
    vb_sock_t *bsk;       /* moved, the lower rank: a dial through its own interface */
    bool backing;         /* this resume is a move back */
    bool own_suspect;     /* the own device's path went silent (retries spent): not first */
    uint64_t t_wc_ns;     /* live: the last completion, or when writes began to wait */
    int back_fails;       /* moves back in a row that ended on another device again */
    uint64_t back_at_ns;  /* the next move back is tried from then on */
    bool qp_up;           /* resuming: the new QP is connected */
    uint64_t peer_off;    /* resuming: where the peer's ring stopped (its HELLO) */
    uint64_t t_fail0_ns;  /* the first failure not yet followed by traffic (or a move) */
    uint64_t t_resume_ns; /* this resume began */
    uint64_t t_dial_ns;   /* our resume dial (or poke) began */
    uint64_t epoch;       /* resumes so far */
    bool rx_new;          /* resuming: an immediate came on the new QP (the peer resumed) */
    uint64_t ready_at_ns; /* tests (test_ready_ms): the READY read, taken then */
    bool answered;        /* resuming, the higher rank: our answer went (its READY may not) */
    bool moved;           /* a failover was reported, not its return */
    char why[160];
    uint64_t t_refused_ns; /* the last QP failure, ours or the peer's (0: none) */
    uint64_t t_warned_ns;  /* our last QP failure warned of */
    char refused[160];     /* and why */
} vb_conn_t;

/* An RDMA device the rail's links use: its own, behind the rail's
 * interface; or, with failover, the one behind another rail's interface,
 * opened the first time a link moves there. */
typedef struct vb_dev {
    struct en_verbs *tr;
    char name[IBV_SYSFS_NAME_MAX]; /* "": none known */
    bool tried, ok;                /* opening was tried; it worked */
    uint64_t retry_ns;             /* a failed open is tried again from then on */
    bool gid_stale;                /* its port was down: read the GID again when up */
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_comp_channel *ch;
    struct ibv_cq *cq;
    struct ibv_port_attr pattr;
    int gid_index; /* configured, or picked for this device (en_ibv_pick_gid) */
    union ibv_gid gid;
    uv_poll_t ch_poll;
    bool ch_poll_open;
    uv_poll_t async_poll; /* its asynchronous events (a port down or up, a QP fatal) */
    bool async_open;
} vb_dev_t;

typedef struct en_verbs {
    en_rail_t *rail;
    en_transport_ops_t ops;
    const en_ibv_t *ib;  /* the provider: rdma-core, or soft (en_ibv.h) */
    int port, gid_index; /* gid_index -1: each device picks (en_ibv_pick_gid) */
    size_t ring_bytes;
    size_t zcopy_bytes, reg_cache_bytes; /* 0: no zero copy */
    en_regtab_t *regions;                /* the context's declared memory */
    en_regcache_t *regs;                 /* this rail's registrations of it (own device) */
    int own;                             /* the rail's index: dev[own] is its device */
    int test_down_ms;                    /* tests: a cut takes the own port down this long */
    int test_ready_ms;                   /* tests: a resume's READY is taken this late */
    int test_poke_ms;                    /* tests: poke at once, each HELLO this late */
    int test_lose_ready;                 /* tests: the next READY from this rank is lost... */
    int test_lost_fd;                    /* ...and its socket kept open, unread, till fini */
    int test_rts_fail;                   /* tests: on this rank, the next resume QP's RTS fails */
    int test_rts_left;                   /* tests: how many more; -1: every one */
    bool test_create_fail;               /* tests: ...at the QP's creation instead */
    int test_rts_peer;                   /* tests: ...on the link to this rank only (-1: any) */
    int resume_ms;                       /* a failed link resumes within this, or it ends */
    uint64_t test_down_until_ns;
    vb_dev_t dev[EN_MAX_RAILS];
    int lfd;
    uv_poll_t lpoll;
    bool lpoll_open;
    uv_timer_t watch; /* with failover: links whose writes wait while another rail's go */
    bool watch_open;
    vb_conn_t *conns;
    vb_conn_t *dead; /* closed, waiting for their work requests to flush */
    en_wreq_t *done_head, *done_tail;
} en_verbs_t;

static void conn_close(vb_conn_t *t, int status, const char *why);
static void kick(vb_conn_t *t);
static bool dev_usable(en_verbs_t *tr, int k);
static void on_async(uv_poll_t *h, int status, int events);

static uint64_t pad8(uint64_t n)
{
    return (8 - (n & 7)) & 7;
}

/* ---- the endpoint on the wire ---- */

static void ep_encode(const vb_ep_t *e, uint8_t out[VB_EP_SIZE])
{
    memset(out, 0, VB_EP_SIZE);
    en_put32(out, e->qpn);
    en_put32(out + 4, e->psn);
    en_put16(out + 8, e->lid);
    memcpy(out + 10, e->gid, 16);
    en_put64(out + 26, e->ring_addr);
    en_put32(out + 34, e->ring_rkey);
    en_put64(out + 38, e->ring_size);
    en_put32(out + 46, e->mtu);
}

static void ep_decode(const uint8_t in[VB_EP_SIZE], vb_ep_t *e)
{
    e->qpn = en_get32(in);
    e->psn = en_get32(in + 4);
    e->lid = en_get16(in + 8);
    memcpy(e->gid, in + 10, 16);
    e->ring_addr = en_get64(in + 26);
    e->ring_rkey = en_get32(in + 34);
    e->ring_size = en_get64(in + 38);
    e->mtu = en_get32(in + 46);
}

/* A position from its 31 low bits, given one not far behind it. */
static uint64_t pos_from(uint64_t known, uint32_t low)
{
    return known + ((low - (uint32_t)known) & VB_POS_MASK);
}

/* ---- work requests ---- */

static uint64_t wr_id(vb_conn_t *t, vb_kind k)
{
    return (uint64_t)(uintptr_t)t | (uint64_t)k;
}

static int post_recv(vb_conn_t *t)
{
    struct ibv_recv_wr wr = {.wr_id = wr_id(t, VB_WR_RECV)}, *bad;
    int e = t->tr->ib->post_recv(t->qp, &wr, &bad);
    if (e == 0) t->wr_out++;
    return e;
}

/* RDMA-write n bytes from src (lkey's memory) to the peer's ring at
 * position pos, with an immediate when imm_on. n may be 0 (the immediate
 * alone). */
static int post_write_from(vb_conn_t *t, uint64_t pos, const void *src, uint32_t lkey, uint64_t n,
                           bool imm_on, uint32_t imm)
{
    uint64_t at = pos & (t->size - 1);
    struct ibv_sge sge = {.addr = (uint64_t)(uintptr_t)src, .length = (uint32_t)n, .lkey = lkey};
    struct ibv_send_wr wr = {.wr_id = wr_id(t, VB_WR_SEND),
                             .sg_list = n ? &sge : NULL,
                             .num_sge = n ? 1 : 0,
                             .opcode = imm_on ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE,
                             .send_flags = IBV_SEND_SIGNALED},
                       *bad;
    if (imm_on) wr.imm_data = htonl(imm);
    wr.wr.rdma.remote_addr = t->theirs.ring_addr + at;
    wr.wr.rdma.rkey = t->theirs.ring_rkey;
    int e = t->tr->ib->post_send(t->qp, &wr, &bad);
    if (e == 0) {
        t->wr_out++;
        t->sq_out++;
        t->sq_posted++;
    }
    return e;
}

/* The same from the staging ring, at the same position. */
static int post_write(vb_conn_t *t, uint64_t pos, uint64_t n, bool imm_on, uint32_t imm)
{
    return post_write_from(t, pos, t->tx_ring + (pos & (t->size - 1)), t->tx_mr[t->via]->lkey, n,
                           imm_on, imm);
}

/* Room in the send queue for one more write (the rest waits for a send
 * completion, which pumps again). */
static bool sq_room(const vb_conn_t *t, int slack)
{
    return t->sq_out < VB_SQ_DEPTH - slack;
}

/* ---- sending ---- */

static void ring_put(vb_conn_t *t, const uint8_t *src, uint64_t n)
{
    uint64_t at = t->tx_tail & (t->size - 1), first = t->size - at < n ? t->size - at : n;
    if (src) {
        memcpy(t->tx_ring + at, src, first);
        if (n > first) memcpy(t->tx_ring, src + first, n - first);
    }
    t->tx_tail += n; /* padding: whatever the staging ring holds there */
}

/* Write what was copied since the last call, in pieces that do not cross
 * the ring's end (as far as the send queue takes them). */
static int post_pending(vb_conn_t *t)
{
    while (t->tx_posted < t->tx_tail) {
        if (!sq_room(t, VB_SQ_SLACK + 1)) return 0;
        uint64_t at = t->tx_posted & (t->size - 1), n = t->tx_tail - t->tx_posted;
        if (n > t->size - at) n = t->size - at;
        if (n > VB_PIECE) n = VB_PIECE;
        int e = post_write(t, t->tx_posted, n, false, 0);
        if (e) return e;
        t->tx_posted += n;
    }
    return 0;
}

/* post_pending, then tell the peer the new tail. */
static int flush_tx(vb_conn_t *t)
{
    int e = post_pending(t);
    if (e || t->tx_posted < t->tx_tail) return e;
    if (t->tx_told == t->tx_tail || !sq_room(t, VB_SQ_SLACK)) return 0;
    e = post_write(t, t->tx_tail, 0, true, (uint32_t)t->tx_tail & VB_POS_MASK);
    if (e == 0) t->tx_told = t->tx_tail;
    return e;
}

static en_wreq_t *q_pop(vb_conn_t *t, uint64_t bytes)
{
    en_conn_t *c = &t->base;
    en_wreq_t *w = t->q_head;
    t->q_head = w->tx_next;
    if (!t->q_head) t->q_tail = NULL;
    c->bytes_out += bytes;
    atomic_fetch_add_explicit(&c->rail->stat_bytes_out, bytes, memory_order_relaxed);
    return w;
}

/* Write n payload bytes of the head frame from its registration straight
 * to the peer's ring at tx_tail, in pieces that do not cross the ring's
 * end. Everything before them is posted already. How many went (fewer
 * when the send queue filled), or -1 when posting failed. */
static int64_t zc_write(vb_conn_t *t, const uint8_t *src, uint64_t n)
{
    uint64_t done = 0;
    while (done < n) {
        if (!sq_room(t, VB_SQ_SLACK + 1)) break;
        uint64_t at = t->tx_tail & (t->size - 1), k = n - done;
        if (k > t->size - at) k = t->size - at;
        if (k > VB_PIECE) k = VB_PIECE;
        if (post_write_from(t, t->tx_tail, src + done, t->q_reg->key, k, false, 0) != 0) return -1;
        t->tx_tail += k;
        t->tx_posted = t->tx_tail;
        done += k;
    }
    atomic_fetch_add_explicit(&t->base.rail->stat_zcopy_out, done, memory_order_relaxed);
    return (int64_t)done;
}

/* Copy what fits of the queued frames into the staging ring and write it
 * (the payloads of declared memory straight from there). */
static void pump_tx(vb_conn_t *t)
{
    en_verbs_t *tr = t->tr;
    while (t->q_head && t->phase == VB_LIVE && !t->err) {
        en_wreq_t *w = t->q_head;
        uint64_t total = EN_HDR_SIZE + w->len, padded = total + pad8(total);
        uint64_t room = t->size - (t->tx_tail - t->peer_head);
        if (room < 8 || (t->q_off == 0 && room < EN_HDR_SIZE)) break; /* its head frees room */
        if (t->q_off == 0) {
            w->tx_off = t->tx_tail; /* where it starts in the stream (failover rewrites) */
            ring_put(t, w->hdr, EN_HDR_SIZE);
            t->q_off = EN_HDR_SIZE;
            room -= EN_HDR_SIZE;
            /* regs: only with zcopy_bytes; registered with the own device */
            if (tr->regs && w->len >= tr->zcopy_bytes && t->via == tr->own)
                t->q_reg = en_regcache_get(tr->regs, w->payload, w->len);
        }
        uint64_t left = padded - t->q_off, n = left < room ? left : room;
        if (n < left) n &= ~7ull; /* whole words until the end */
        uint64_t pay_at = t->q_off - EN_HDR_SIZE, pay_n = 0;
        if (pay_at < w->len) pay_n = w->len - pay_at < n ? w->len - pay_at : n;
        if (t->q_reg && pay_n && t->via == tr->own) {
            /* what the staging ring holds goes first, then the payload
             * (moved to another device, whose keys these are not: copied) */
            if (post_pending(t) != 0) break;
            if (t->tx_posted != t->tx_tail) break; /* the send queue is full */
            int64_t k = zc_write(t, w->payload + pay_at, pay_n);
            if (k < 0) {
                t->err = true;
                conn_close(t, COH_ESYS, "posting an RDMA write failed");
                return;
            }
            if ((uint64_t)k < pay_n) { /* the send queue filled: resume from a whole word */
                t->q_off += (uint64_t)k;
                break;
            }
        } else if (pay_n) {
            ring_put(t, w->payload + pay_at, pay_n);
        }
        if (n > pay_n) ring_put(t, NULL, n - pay_n); /* padding, written from the staging ring */
        t->q_off += n;
        if (t->q_off < padded) continue;
        t->q_off = 0;
        en_wreq_t *f = q_pop(t, total);
        if (t->q_reg) { /* done when its last write is, or when consumed (keep) */
            f->tr.vb.mark = t->keep ? f->tx_off + padded : t->sq_posted;
            f->tr.vb.reg = t->q_reg;
            t->q_reg = NULL;
            en_wq_push(&t->zc_head, &t->zc_tail, f);
        } else {
            en_wq_push(&tr->done_head, &tr->done_tail, f); /* its buffer is free */
        }
    }
    if (t->phase == VB_LIVE && !t->err && flush_tx(t) != 0)
        conn_close(t, COH_ESYS, "posting an RDMA write failed");
}

static bool done_run(en_verbs_t *tr)
{
    return en_wq_run_done(&tr->done_head, &tr->done_tail);
}

static int vb_send(en_conn_t *c, en_wreq_t *w)
{
    vb_conn_t *t = (vb_conn_t *)c;
    if (c->state != EN_CONN_READY) return COH_EPEER;
    w->conn = c;
    en_wq_push(&t->q_head, &t->q_tail, w);
    c->writes_out++;
    if (t->q_head == w) pump_tx(t);
    return 0;
}

/* ---- receiving ---- */

static void ring_get(vb_conn_t *t, uint64_t pos, uint8_t *out, uint64_t n)
{
    uint64_t at = pos & (t->size - 1), first = t->size - at < n ? t->size - at : n;
    memcpy(out, t->rx_ring + at, first);
    if (n > first) memcpy(out + first, t->rx_ring, n - first);
}

/* Give the consumed space back: the head in an immediate. */
static void rx_publish(vb_conn_t *t)
{
    if (t->rx_told == t->rx_head || t->err || t->phase != VB_LIVE || !sq_room(t, 0)) return;
    if (post_write(t, 0, 0, true, VB_IMM_HEAD | ((uint32_t)t->rx_head & VB_POS_MASK)) != 0) {
        conn_close(t, COH_ESYS, "posting an RDMA write failed");
        return;
    }
    t->rx_told = t->rx_head;
}

static bool match(vb_conn_t *t)
{
    en_conn_t *c = &t->base;
    int m = en_conn_match(c);
    if (c->state != EN_CONN_READY) return false;
    if (m < 0) conn_close(t, m, "frame refused");
    return m == EN_MATCH_OK;
}

static void count_in(vb_conn_t *t, uint64_t n)
{
    t->base.bytes_in += n;
    atomic_fetch_add_explicit(&t->base.rail->stat_bytes_in, n, memory_order_relaxed);
}

/* Deliver what the peer has written into our ring. */
static void process(vb_conn_t *t)
{
    en_conn_t *c = &t->base;
    en_rail_t *rail = c->rail;
    for (;;) {
        if (c->state != EN_CONN_READY) return;
        if (c->rstate == EN_RD_BLOCKED && !match(t)) break;
        uint64_t avail = t->rx_tail - t->rx_head;
        if (avail > t->size) {
            atomic_fetch_add(&rail->stat_bad_frames, 1);
            conn_close(t, COH_EPROTO, "an RDMA ring out of order");
            return;
        }
        if (c->rstate == EN_RD_HDR) {
            if (avail < EN_HDR_SIZE) break;
            uint8_t hb[EN_HDR_SIZE];
            ring_get(t, t->rx_head, hb, EN_HDR_SIZE);
            if (en_hdr_decode(hb, EN_HDR_SIZE, &c->hdr) != EN_HDR_SIZE ||
                c->hdr.type == EN_FRAME_ACK) {
                atomic_fetch_add(&rail->stat_bad_frames, 1);
                conn_close(t, COH_EPROTO, "malformed frame header");
                return;
            }
            t->rx_head += EN_HDR_SIZE;
            count_in(t, EN_HDR_SIZE);
            t->rx_pad = pad8(EN_HDR_SIZE + c->hdr.len);
            c->t_frame_ns = bs_now_ns();
            if (!match(t)) break;
            continue;
        }
        en_sink_t *s = &c->sink;
        uint64_t need = s->len - s->done;
        if (need > 0) {
            uint64_t at = t->rx_head & (t->size - 1);
            uint64_t n = avail < need ? avail : need;
            if (n > t->size - at) n = t->size - at;
            if (s->mode == EN_SINK_REDUCE) n -= n % s->esize;
            if (n == 0) break;
            en_sink_consume(s, t->rx_ring + at, (size_t)n);
            t->rx_head += n;
            count_in(t, n);
            if (s->done < s->len) continue;
        }
        if (t->rx_tail - t->rx_head < t->rx_pad) break;
        t->rx_head += t->rx_pad;
        t->rx_pad = 0;
        c->rstate = EN_RD_HDR;
        en_exec_recv_done(rail, c);
    }
    rx_publish(t);
}

static bool kick_live(void *arg)
{
    return ((vb_conn_t *)arg)->phase == VB_LIVE;
}

static void kick_step(void *arg)
{
    process(arg);
    pump_tx(arg);
}

static void kick(vb_conn_t *t)
{
    en_kick_run(&t->kick, kick_live, kick_step, t);
}

static void vb_resume(en_conn_t *c)
{
    vb_conn_t *t = (vb_conn_t *)c;
    if (c->state == EN_CONN_READY && c->rstate == EN_RD_BLOCKED) kick(t);
}

/* ---- completions ---- */

static void conn_free(vb_conn_t *t);
static void maybe_free(vb_conn_t *t);
static void fail_link(vb_conn_t *t, const char *why);
static void qp_flushed(vb_conn_t *t);

/* Frames from declared memory that are done: their writes completed, or
 * with failover the peer consumed them (they may have to be written
 * again until then). */
static void zc_reap(vb_conn_t *t)
{
    en_verbs_t *tr = t->tr;
    while (t->zc_head && t->zc_head->tr.vb.mark <= (t->keep ? t->peer_head : t->sq_done)) {
        en_wreq_t *f = t->zc_head;
        t->zc_head = f->tx_next;
        if (!t->zc_head) t->zc_tail = NULL;
        en_regcache_put(tr->regs, f->tr.vb.reg);
        en_wq_push(&tr->done_head, &tr->done_tail, f);
    }
}

/* The peer's new tail (data for us) or head (room) from an immediate;
 * false when it cannot be (the link is closed then). */
static bool take_imm(vb_conn_t *t, uint32_t imm)
{
    if (imm & VB_IMM_HEAD) {
        uint64_t h = pos_from(t->peer_head, imm & VB_POS_MASK);
        if (h - t->peer_head > t->tx_tail - t->peer_head) {
            conn_close(t, COH_EPROTO, "the peer's head passed what was written");
            return false;
        }
        t->peer_head = h;
        if (t->keep) zc_reap(t);
    } else {
        uint64_t tl = pos_from(t->rx_tail, imm & VB_POS_MASK);
        if (tl - t->rx_head > t->size || (tl & 7)) {
            conn_close(t, COH_EPROTO, "the peer's tail is outside the ring");
            return false;
        }
        t->rx_tail = tl;
    }
    return true;
}

static bool on_wc(const vb_dev_t *d, const struct ibv_wc *wc, uint64_t now)
{
    vb_conn_t *t = (vb_conn_t *)(uintptr_t)(wc->wr_id & ~(uint64_t)1);
    vb_kind k = (vb_kind)(wc->wr_id & 1);
    /* QP numbers are per device: the old QP may be on another. */
    if (t->old_qp && d == t->old_dev && wc->qp_num == t->old_qp->qp_num) {
        /* The failed QP's: what arrived before it failed still counts (the
         * ring's tail and head); the rest are flushes. */
        t->old_out--;
        if (wc->status == IBV_WC_SUCCESS && k == VB_WR_RECV && t->phase != VB_CLOSED &&
            !take_imm(t, ntohl(wc->imm_data)))
            return false;
        if (t->old_out > 0) return false;
        if (t->phase == VB_CLOSED)
            maybe_free(t);
        else
            qp_flushed(t);
        return false;
    }
    t->wr_out--;
    if (k == VB_WR_SEND) t->sq_out--;
    if (t->phase == VB_CLOSED) {
        maybe_free(t);
        return false;
    }
    if (wc->status != IBV_WC_SUCCESS) {
        char why[160];
        snprintf(why, sizeof(why), "RDMA %s to rank %d failed: %s (vendor error 0x%x)",
                 k == VB_WR_RECV ? "receive" : "write", t->base.peer, ibv_wc_status_str(wc->status),
                 wc->vendor_err);
        t->err = true;
        /* Retries spent with the port up: the path through the own
         * interface delivers nothing (a blackhole, the peer's interface
         * down), and a first dial through it would wait VB_DIAL_MS
         * unanswered. Another rail's device is tried first. */
        if (wc->status == IBV_WC_RETRY_EXC_ERR && t->via == t->tr->own) t->own_suspect = true;
        fail_link(t, why);
        return false;
    }
    /* Progress, for this link's stall watch (the other rails' is told
     * once per batch, in drain: true). */
    t->t_wc_ns = now;
    if (k == VB_WR_SEND) { /* room in the send queue: what waited for it */
        t->sq_done++;
        if (!t->keep) zc_reap(t);
        if (t->tx_posted != t->tx_tail || t->tx_told != t->tx_tail || t->rx_told != t->rx_head ||
            t->q_head)
            kick(t);
        return true;
    }
    /* An immediate: the peer's new tail (data for us) or head (room). */
    if (post_recv(t) != 0) {
        conn_close(t, COH_ESYS, "posting an RDMA receive failed");
        return true;
    }
    if (!take_imm(t, ntohl(wc->imm_data))) return true;
    /* Traffic: a later failure starts afresh. One that comes while we
     * resume (the peer's head, told as it went live, can beat its READY)
     * counts once we are live too: an idle link's only immediate came so,
     * and its next failure, minutes later, was "no resume in time" at once. */
    if (t->phase == VB_LIVE)
        t->t_fail0_ns = 0;
    else
        t->rx_new = true;
    kick(t);
    return true;
}

/* Drain the completion queues (the own device's, and those links moved
 * to). True when there was anything. */
static bool drain(en_verbs_t *tr)
{
    struct ibv_wc wc[32];
    bool any = false;
    int n;
    for (int k = 0; k < tr->rail->nrails && k < EN_MAX_RAILS; k++) {
        const vb_dev_t *d = &tr->dev[k];
        while (d->cq && (n = tr->ib->poll_cq(d->cq, 32, wc)) > 0) {
            /* One clock read per batch, not per completion. Progress, for
             * the other rails' stall watch too (theirs judge a silent link
             * only while this rail's completions come): a live link's
             * successful completion, not a flush. */
            uint64_t now = bs_now_ns();
            bool progress = false;
            any = true;
            for (int i = 0; i < n; i++) progress |= on_wc(d, &wc[i], now);
            if (progress) en_rail_progress(tr->rail, now);
        }
    }
    if (tr->regs) en_regcache_sweep(tr->regs); /* declarations taken back */
    return done_run(tr) || any;
}

static void on_channel(uv_poll_t *h, int status, int events)
{
    (void)status;
    (void)events;
    vb_dev_t *d = h->data;
    en_verbs_t *tr = d->tr;
    struct ibv_cq *cq;
    void *cctx;
    while (tr->ib->get_cq_event(d->ch, &cq, &cctx) == 0) tr->ib->ack_cq_events(cq, 1);
    /* Ask again, then drain: a completion between the two is not lost. */
    tr->ib->req_notify_cq(d->cq, 0);
    drain(tr);
}

bool en_verbs_poll(en_rail_t *rail)
{
    return rail->verbs && drain(rail->verbs);
}

/* ---- links ---- */

static void sock_closed(uv_handle_t *h)
{
    vb_sock_t *s = h->data;
    if (s->fd >= 0) close(s->fd);
    coh_free(s);
}

static void poll_cb(uv_poll_t *h, int status, int events);

/* A socket of link t on fd, polled for ev. NULL when it cannot be (fd is
 * closed then). */
static vb_sock_t *sock_new(vb_conn_t *t, int fd, int phase, int ev)
{
    vb_sock_t *s = coh_zalloc(sizeof(*s));
    if (!s || uv_poll_init(t->base.rail->loop, &s->poll, fd) != 0) {
        coh_free(s);
        close(fd);
        return NULL;
    }
    s->fd = fd;
    s->t = t;
    s->phase = phase;
    s->poll.data = s;
    if (uv_poll_start(&s->poll, ev, poll_cb) != 0) {
        s->t = NULL;
        uv_close((uv_handle_t *)&s->poll, sock_closed);
        return NULL;
    }
    return s;
}

static void sock_close(vb_sock_t *s)
{
    if (!s) return;
    s->t = NULL;
    uv_poll_stop(&s->poll);
    uv_close((uv_handle_t *)&s->poll, sock_closed);
}

static void handle_closed(uv_handle_t *h)
{
    vb_conn_t *t = h->data;
    t->handles--;
    maybe_free(t);
}

static void maybe_free(vb_conn_t *t)
{
    if (t->phase == VB_CLOSED && t->wr_out == 0 && t->old_out == 0 && t->handles == 0) conn_free(t);
}

static void conn_free(vb_conn_t *t)
{
    en_verbs_t *tr = t->tr;
    if (t->prev)
        t->prev->next = t->next;
    else if (tr->dead == t)
        tr->dead = t->next;
    if (t->next) t->next->prev = t->prev;
    if (t->qp) tr->ib->destroy_qp(t->qp);
    if (t->old_qp) tr->ib->destroy_qp(t->old_qp);
    for (int k = 0; k < EN_MAX_RAILS; k++) {
        if (t->rx_mr[k]) tr->ib->dereg_mr(t->rx_mr[k]);
        if (t->tx_mr[k]) tr->ib->dereg_mr(t->tx_mr[k]);
    }
    free(t->rx_ring);
    free(t->tx_ring);
    coh_free(t);
}

/* From the live list to the dead one: closed, until its work requests and
 * timer are back. */
static void to_dead(vb_conn_t *t)
{
    en_verbs_t *tr = t->tr;
    if (t->prev)
        t->prev->next = t->next;
    else if (tr->conns == t)
        tr->conns = t->next;
    if (t->next) t->next->prev = t->prev;
    t->prev = NULL;
    t->next = tr->dead;
    if (tr->dead) tr->dead->prev = t;
    tr->dead = t;
    t->phase = VB_CLOSED;
    sock_close(t->sk);
    sock_close(t->rsk);
    sock_close(t->psk);
    sock_close(t->bsk);
    t->sk = t->rsk = t->psk = t->bsk = NULL;
    uv_timer_stop(&t->timer);
    uv_close((uv_handle_t *)&t->timer, handle_closed);
}

static void conn_close(vb_conn_t *t, int status, const char *why)
{
    en_conn_t *c = &t->base;
    if (t->phase == VB_CLOSED) return;
    int was = c->state;
    en_verbs_t *tr = t->tr;
    c->state = EN_CONN_CLOSING;
    to_dead(t);
    en_rail_conn_unlink(c);
    if (t->moved) en_rail_event(c->rail, EN_RAIL_GONE, c->peer, -1, 0, why);
    /* Frames in the staging ring were sent, as a write TCP took is. */
    en_wq_done_of(c, &tr->done_head, &tr->done_tail);
    en_rail_conn_lost(c->rail, c, was == EN_CONN_READY ? status : (status ? status : COH_EPROTO),
                      why);
    /* Frames written from declared memory whose writes had not completed
     * may not have arrived: they fail with the queued ones. */
    if (t->q_reg) en_regcache_put(tr->regs, t->q_reg);
    t->q_reg = NULL;
    for (en_wreq_t *f = t->zc_head; f; f = f->tx_next) en_regcache_put(tr->regs, f->tr.vb.reg);
    en_wq_fail_all(&t->base, &t->zc_head, &t->zc_tail, COH_ECANCELED);
    en_wq_fail_all(&t->base, &t->q_head, &t->q_tail, COH_ECANCELED);
    c->state = EN_CONN_CLOSED;
    /* The error state flushes every posted work request back to us. */
    if (t->qp) {
        struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
        tr->ib->modify_qp(t->qp, &a, IBV_QP_STATE);
    }
}

/* A connection accepted for a resume that another link took over: it goes
 * without a word to the rail (it never was a link). */
static void conn_forget(vb_conn_t *t)
{
    t->base.state = EN_CONN_CLOSED;
    to_dead(t);
    en_rail_conn_unlink(&t->base);
}

static void hs_timeout(uv_timer_t *h)
{
    vb_conn_t *t = h->data;
    atomic_fetch_add(&t->base.rail->stat_rejected, 1);
    conn_close(t, COH_ETIMEDOUT, "no RDMA handshake in time");
}

static vb_conn_t *conn_new(en_verbs_t *tr)
{
    en_rail_t *rail = tr->rail;
    vb_conn_t *t = coh_zalloc(sizeof(*t));
    if (!t) return NULL;
    t->tr = tr;
    t->base.rail = rail;
    t->base.peer = -1;
    t->base.ops = &tr->ops;
    t->base.state = EN_CONN_HANDSHAKE;
    t->keep = rail->failover;
    t->via = tr->own;
    t->want = -1;
    en_rail_conn_link(rail, &t->base);
    uv_timer_init(rail->loop, &t->timer);
    t->timer.data = t;
    t->handles = 1;
    t->next = tr->conns;
    if (tr->conns) tr->conns->prev = t;
    tr->conns = t;
    return t;
}

/* The rings and their registrations (once per link: a resume keeps them). */
static int rings_create(vb_conn_t *t)
{
    en_verbs_t *tr = t->tr;
    t->size = tr->ring_bytes;
    if (posix_memalign((void **)&t->rx_ring, 4096, t->size) != 0 ||
        posix_memalign((void **)&t->tx_ring, 4096, t->size) != 0)
        return bs_fail(COH_ENOMEM, "verbs: out of memory for the rings");
    memset(t->tx_ring, 0, t->size);
    return 0;
}

/* The rings' registrations with device k (once per device: a link that
 * moves back keeps them). */
static int rings_reg(vb_conn_t *t, int k)
{
    en_verbs_t *tr = t->tr;
    vb_dev_t *d = &tr->dev[k];
    if (!t->rx_mr[k])
        t->rx_mr[k] = tr->ib->reg_mr(d->pd, t->rx_ring, t->size,
                                     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (!t->tx_mr[k])
        t->tx_mr[k] = tr->ib->reg_mr(d->pd, t->tx_ring, t->size, IBV_ACCESS_LOCAL_WRITE);
    if (!t->rx_mr[k] || !t->tx_mr[k])
        return bs_fail(COH_ESYS, "verbs: registering the rings with %s: %s", d->name,
                       strerror(errno));
    return 0;
}

/* Tests (test_rts_fail): this resume QP fails at this stage (its creation,
 * or RTS), as by a device out of memory or a GID entry gone. */
static bool test_qp_fails(vb_conn_t *t, bool create)
{
    en_verbs_t *tr = t->tr;
    if (tr->test_rts_fail != tr->rail->rank || t->phase != VB_RESUMING || tr->test_rts_left == 0 ||
        tr->test_create_fail != create ||
        (tr->test_rts_peer >= 0 && tr->test_rts_peer != t->base.peer))
        return false;
    if (tr->test_rts_left > 0) tr->test_rts_left--;
    return true;
}

/* A QP on device t->via in INIT with its receives posted; our endpoint in
 * t->mine. */
static int qp_new(vb_conn_t *t)
{
    en_verbs_t *tr = t->tr;
    vb_dev_t *d = &tr->dev[t->via];
    BS_CHECK(rings_reg(t, t->via));
    if (test_qp_fails(t, true))
        return bs_fail(COH_ESYS, "verbs: ibv_create_qp: %s (by the test)", strerror(ENOMEM));
    struct ibv_qp_init_attr ia = {.send_cq = d->cq,
                                  .recv_cq = d->cq,
                                  .cap = {.max_send_wr = VB_SQ_DEPTH,
                                          .max_recv_wr = VB_RQ_DEPTH,
                                          .max_send_sge = 1,
                                          .max_recv_sge = 1},
                                  .qp_type = IBV_QPT_RC,
                                  .sq_sig_all = 1};
    t->qp = tr->ib->create_qp(d->pd, &ia);
    if (!t->qp) return bs_fail(COH_ESYS, "verbs: ibv_create_qp: %s", strerror(errno));
    t->qp_up = false;
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT,
                            .pkey_index = 0,
                            .port_num = (uint8_t)tr->port,
                            .qp_access_flags = IBV_ACCESS_REMOTE_WRITE};
    /* modify_qp returns the error (errno is not always set) */
    int e = tr->ib->modify_qp(t->qp, &a,
                              IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
    if (e != 0) return bs_fail(COH_ESYS, "verbs: QP to INIT: %s", strerror(e));
    for (int i = 0; i < VB_RQ_DEPTH; i++)
        if (post_recv(t) != 0) return bs_fail(COH_ESYS, "verbs: posting receives failed");
    uint32_t psn = 0;
    if (getrandom(&psn, sizeof(psn), 0) != sizeof(psn)) psn = (uint32_t)bs_now_ns();
    t->mine = (vb_ep_t){.qpn = t->qp->qp_num,
                        .psn = psn & 0xffffff,
                        .lid = d->pattr.lid,
                        .ring_addr = (uint64_t)(uintptr_t)t->rx_ring,
                        .ring_rkey = t->rx_mr[t->via]->rkey,
                        .ring_size = t->size,
                        .mtu = (uint32_t)d->pattr.active_mtu};
    memcpy(t->mine.gid, d->gid.raw, 16);
    return 0;
}

static int qp_create(vb_conn_t *t)
{
    BS_CHECK(rings_create(t));
    return qp_new(t);
}

/* RTR then RTS towards the peer's endpoint. */
static int qp_connect(vb_conn_t *t)
{
    en_verbs_t *tr = t->tr;
    const vb_dev_t *d = &tr->dev[t->via];
    const vb_ep_t *p = &t->theirs;
    /* The GID was picked again since the peer was told ours (another link's
     * dev_usable, or the GID_CHANGE event, between our dial and its answer):
     * our packets would leave from one address and its answers go to another. */
    if (memcmp(t->mine.gid, d->gid.raw, 16) != 0)
        return bs_fail(COH_ESYS,
                       "verbs: QP's GID picked again (now index %d) since the peer was told",
                       d->gid_index);
    enum ibv_mtu mtu = (enum ibv_mtu)(p->mtu < t->mine.mtu ? p->mtu : t->mine.mtu);
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTR,
                            .path_mtu = mtu,
                            .dest_qp_num = p->qpn,
                            .rq_psn = p->psn,
                            .max_dest_rd_atomic = 1,
                            .min_rnr_timer = 12};
    a.ah_attr.port_num = (uint8_t)tr->port;
    a.ah_attr.dlid = p->lid;
    if (d->pattr.link_layer == IBV_LINK_LAYER_ETHERNET || d->gid_index > 0) {
        a.ah_attr.is_global = 1;
        memcpy(a.ah_attr.grh.dgid.raw, p->gid, 16);
        a.ah_attr.grh.sgid_index = (uint8_t)d->gid_index;
        a.ah_attr.grh.hop_limit = 64;
    }
    int e = tr->ib->modify_qp(t->qp, &a,
                              IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    if (e != 0)
        return bs_fail(COH_ESYS, "verbs: QP to RTR (GID %d): %s", d->gid_index, strerror(e));
    if (test_qp_fails(t, false))
        return bs_fail(COH_ESYS, "verbs: QP to RTS (GID %d): refused by the test", d->gid_index);
    struct ibv_qp_attr s = {.qp_state = IBV_QPS_RTS,
                            .timeout = 14,
                            .retry_cnt = 7,
                            .rnr_retry = 7, /* a receive not reposted yet: retry, never fail */
                            .sq_psn = t->mine.psn,
                            .max_rd_atomic = 1};
    e = tr->ib->modify_qp(t->qp, &s,
                          IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                              IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
    if (e != 0)
        return bs_fail(COH_ESYS, "verbs: QP to RTS (GID %d): %s", d->gid_index, strerror(e));
    t->qp_up = true;
    return 0;
}

static int send_all(int fd, const uint8_t *b, size_t n)
{
    while (n) {
        ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return bs_fail(COH_EPEER, "verbs: the handshake: %s", strerror(errno));
        b += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Our HELLO and endpoint on s; a resume's carries where our ring stopped
 * (the bytes of the peer's stream it holds). */
static int send_hello(vb_conn_t *t, vb_sock_t *s)
{
    uint8_t out[EN_HELLO_SIZE + VB_EP_SIZE];
    en_hello_t h;
    en_rail_fill_hello(t->base.rail, &h);
    if (s->resume) {
        h.flags |= EN_HELLO_RESUME;
        h.resume_off = t->rx_tail;
        /* A poke after our answer's socket died: the dialler may have
         * resumed (sent READY, its epoch one on) without our knowing, and
         * would drop a poke of the epoch before as stale. */
        h.epoch = t->epoch + (s->poke && t->answered ? 1 : 0);
        h.via = (uint32_t)s->via; /* the device of the new QPs (a poke: one we can use) */
    }
    en_hello_encode(&h, out);
    ep_encode(&t->mine, out + EN_HELLO_SIZE);
    /* Small and the socket is fresh: it goes at once or the link fails. */
    return send_all(s->fd, out, sizeof(out));
}

static void go_live(vb_conn_t *t)
{
    en_conn_t *c = &t->base;
    uv_timer_stop(&t->timer);
    t->phase = VB_LIVE;
    t->sk->phase = SK_LIVE;
    c->state = EN_CONN_READY;
    c->rstate = EN_RD_HDR;
    t->t_wc_ns = bs_now_ns();
    en_rail_conn_ready(c->rail, c);
    kick(t);
}

/* ---- failover: a failed QP replaced, the link resumed ---- */

/* The rings outlive the QP: each side's ring holds every byte the other
 * told it of (its immediates), and the writer's staging ring every byte
 * the reader has not consumed. So after a failure the link needs a new QP
 * pair, and each writer writes again from where the reader's ring stopped
 * (its resume_off): the same bytes at the same places, so a byte that had
 * landed lands again unchanged and none is consumed twice. Frames from
 * declared memory complete only when consumed (keep), and their payloads
 * are copied into the staging ring to be written again.
 *
 * The side that notices closes the liveness socket, so the other notices
 * too. Each moves its QP to error and waits for its work requests to come
 * back (then its ring's tail is final), then makes a new QP. The lower
 * rank dials the peer's listener of this rail with a RESUME HELLO; the
 * other answers the same way once its QP exists; READY, and both write
 * again. A dial refused (nothing listens: the peer's process is gone)
 * ends the link at once; otherwise it ends when resume_ms (COHORT_VERBS_RESUME_MS) have passed
 * since the first failure without traffic (or a move) in between. The rail reports
 * the failover and the return, so the balancer moves the world's ops off
 * this rail meanwhile. */

static void resume_gone(vb_conn_t *t, const char *what)
{
    char why[BS_ERR_LEN];
    /* A QP refused since the first failure says why no resume held (only
     * the warn log said so). */
    bool qp = t->t_refused_ns && t->t_refused_ns >= t->t_fail0_ns;
    snprintf(why, sizeof(why), "RDMA link to rank %d not resumed: %s (after: %s%s%s)", t->base.peer,
             what, t->why, qp ? "; last QP failure: " : "", qp ? t->refused : "");
    conn_close(t, COH_EPEER, why);
}

static void resume_step(vb_conn_t *t);
static void resume_sock_failed(vb_sock_t *s, bool refused);

/* Tests (test_poke_ms): the held poke's HELLO goes, and the poke ends. */
static void poke_go(vb_conn_t *t)
{
    vb_sock_t *s = t->psk;
    (void)send_hello(t, s);
    t->psk = NULL;
    sock_close(s);
}
static void resumed(vb_conn_t *t);

static void resume_tick(uv_timer_t *h)
{
    resume_step(h->data);
}

/* The QP to error, to flush its work requests (then the ring's tail is
 * final, and qp_flushed goes on). True when there is no old QP left to
 * wait for. */
static bool retire_qp(vb_conn_t *t)
{
    en_verbs_t *tr = t->tr;
    if (t->qp && !t->old_qp) {
        struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
        tr->ib->modify_qp(t->qp, &a, IBV_QP_STATE);
        t->old_qp = t->qp;
        t->old_dev = &tr->dev[t->via];
        t->old_out = t->wr_out;
        t->qp = NULL;
        t->wr_out = t->sq_out = 0;
    }
    t->qp_up = false;
    if (t->old_qp && t->old_out == 0) {
        tr->ib->destroy_qp(t->old_qp);
        t->old_qp = NULL;
        t->old_dev = NULL;
    }
    return t->old_qp == NULL;
}

/* The resume's QP was refused RTR or RTS (its GID entry went from under
 * it, a device being reset), or not made: it is spent (one refused RTS
 * stays in RTR, and RTR again is refused too), and the device's GID is
 * read again for the next QP. The attempt fails, not the link: its
 * deadline still holds. */
static void qp_refused(vb_conn_t *t)
{
    en_rail_t *rail = t->base.rail;
    /* A lasting refusal comes again at each dial (every few ms): the first
     * since the link failed warns, the rest are for the debug log. */
    bool first = !t->t_warned_ns || t->t_warned_ns < t->t_fail0_ns;
    bs_log(first ? COH_LOG_WARN : COH_LOG_DEBUG,
           "rank %d rail %d: link to rank %d: %s; the resume goes on with a new QP", rail->rank,
           rail->index, t->base.peer, coh_last_error());
    snprintf(t->refused, sizeof(t->refused), "%s", coh_last_error());
    t->t_refused_ns = t->t_warned_ns = bs_now_ns();
    t->tr->dev[t->via].gid_stale = true;
    retire_qp(t);
}

/* Our new QP failed: the peer hears so on s (for our answer or READY),
 * and its end names it too should the link end. */
static void tell_qp_failed(vb_sock_t *s)
{
    uint8_t f = VB_QPFAIL;
    if (s) (void)send_all(s->fd, &f, 1);
}

/* The peer's new QP failed (VB_QPFAIL): its log says why. */
static void peer_qp_failed(vb_conn_t *t)
{
    snprintf(t->refused, sizeof(t->refused), "rank %d's new QP failed (its log says why)",
             t->base.peer);
    t->t_refused_ns = bs_now_ns();
}

static void begin_resume(vb_conn_t *t, const char *why)
{
    en_rail_t *rail = t->base.rail;
    uint64_t now = bs_now_ns();
    if (t->phase == VB_LIVE) {
        if (why != t->why) snprintf(t->why, sizeof(t->why), "%s", why);
        if (!t->moved) en_rail_event(rail, EN_RAIL_FAILOVER, t->base.peer, rail->index, 0, why);
        t->moved = true;
    }
    if (t->phase == VB_LIVE) t->tries = t->own_suspect ? 1 : 0; /* next_via: from the own */
    t->own_suspect = t->rx_new = t->answered = false;
    t->ready_at_ns = 0;
    t->phase = VB_RESUMING;
    t->t_resume_ns = t->t_dial_ns = now;
    if (!t->t_fail0_ns) t->t_fail0_ns = now;
    sock_close(t->sk); /* the peer notices */
    sock_close(t->rsk);
    t->sk = t->rsk = NULL;
    uv_timer_start(&t->timer, resume_tick, VB_RESUME_TICK, VB_RESUME_TICK);
    if (retire_qp(t)) resume_step(t);
}

/* A link failed: resume it when the rail fails over, else close it. */
static void fail_link(vb_conn_t *t, const char *why)
{
    en_rail_t *rail = t->base.rail;
    if (!rail->failover || rail->closing || t->base.peer_bye ||
        (t->phase != VB_LIVE && t->phase != VB_RESUMING)) {
        conn_close(t, COH_EPEER, why);
        return;
    }
    begin_resume(t, why);
}

/* The old QP's work requests are all back: the ring's tail is final. */
static void qp_flushed(vb_conn_t *t)
{
    t->tr->ib->destroy_qp(t->old_qp);
    t->old_qp = NULL;
    t->old_dev = NULL;
    resume_step(t);
}

/* A QP on device k for the resume: true when there is one (made now, or
 * there already); false while another QP of the link flushes (the step
 * comes again then), or when the link closed. */
static int ensure_qp(vb_conn_t *t, int k)
{
    /* Not one that tells the peer a GID the device no longer uses (picked
     * again since: dev_usable): the peer's RTR to it would be refused. */
    if (t->qp && t->via == k && (t->qp_up || !memcmp(t->mine.gid, t->tr->dev[k].gid.raw, 16)))
        return 1;
    if (!retire_qp(t)) return 0;
    t->via = k;
    /* A QP not made (the device out of memory or being reset, its rings
     * not registered with a device moved to) fails the attempt, as a QP
     * refused RTS does: it ended the link at once. */
    if (qp_new(t) != 0) {
        qp_refused(t);
        return -1;
    }
    return 1;
}

/* The device of the next dial or poke: the own one first, then the other
 * rails' in turn, each while its port is active. -1: none is. */
static int next_via(vb_conn_t *t)
{
    en_verbs_t *tr = t->tr;
    int n = t->base.rail->nrails;
    for (int i = 0; i < n; i++) {
        int k = (tr->own + t->tries++) % n;
        if (dev_usable(tr, k)) return k;
    }
    return -1;
}

/* A non-blocking TCP connect to `to`, leaving through the rail's interface:
 * the socket (its connect completes in poll_cb, under a deadline: an
 * unreachable peer costs that, not the kernel's SYN retries, minutes), or
 * -1 with errno (-2: no socket). The set-up dial and the resume's dials and
 * pokes. */
static int dial_fd(const struct sockaddr_storage *from, const struct sockaddr *to)
{
    int fd = socket(to->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -2;
    socklen_t al =
        to->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
    struct sockaddr_storage local = *from;
    en_sa_set_port(&local, 0); /* any port */
    int r = bind(fd, (struct sockaddr *)&local, al);
    if (r == 0) {
        do r = connect(fd, to, al);
        while (r != 0 && errno == EINTR);
        if (r != 0 && errno == EINPROGRESS) r = 0;
    }
    if (r != 0) {
        int err = errno;
        close(fd);
        errno = err;
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

/* What a dial is for: a resume, the higher rank's poke, or (moved) a test
 * of the own interface, to move back. */
typedef enum vb_dial { VB_DIAL_RESUME = 0, VB_DIAL_POKE, VB_DIAL_BACK } vb_dial;

/* Dial the peer's listener of this rail through rail via's interface
 * (where the peer's device of that rail is). */
static vb_sock_t *dial_via(vb_conn_t *t, int via, vb_dial kind)
{
    en_rail_t *rail = t->base.rail;
    struct sockaddr_storage to;
    if (!en_rail_route(rail, t->base.peer, via, &to) || to.ss_family == 0) {
        if (kind != VB_DIAL_BACK) resume_gone(t, "no route to its listener");
        return NULL;
    }
    int fd = dial_fd(&rail->locals[via], (struct sockaddr *)&to);
    if (fd < 0) { /* refused: gone; else the next tick tries again */
        if (errno == ECONNREFUSED && kind != VB_DIAL_BACK && via == t->tr->own)
            resume_gone(t, "its listener refused (the process is gone)");
        return NULL;
    }
    vb_sock_t *s = sock_new(t, fd, SK_CONNECTING, UV_WRITABLE);
    if (!s) return NULL;
    s->resume = kind != VB_DIAL_BACK;
    s->poke = kind == VB_DIAL_POKE;
    s->back = kind == VB_DIAL_BACK;
    s->via = via;
    return s;
}

static void dial_resume(vb_conn_t *t, bool poke, int via)
{
    vb_sock_t *s = dial_via(t, via, poke ? VB_DIAL_POKE : VB_DIAL_RESUME);
    if (!s) return;
    if (poke)
        t->psk = s;
    else
        t->rsk = s;
    t->t_dial_ns = bs_now_ns();
}

/* Our answer to the peer's resume (the listener's side), once our QP is. */
static void answer_resume(vb_conn_t *t)
{
    vb_sock_t *s = t->rsk;
    if (!t->qp_up && qp_connect(t) != 0) {
        qp_refused(t);
        tell_qp_failed(s);
        resume_sock_failed(s, false); /* the dialler tries again */
        return;
    }
    if (send_hello(t, s) != 0) {
        sock_close(s); /* the dialler tries again */
        t->rsk = NULL;
        return;
    }
    s->phase = SK_WAIT_READY;
    t->answered = true;
    /* A poke still connecting is moot now, and once it connected it would
     * name the next epoch (answered): the dialler, live by then, would take
     * it for a new failure and resume the link again. */
    sock_close(t->psk);
    t->psk = NULL;
}

static void resume_step(vb_conn_t *t)
{
    if (t->phase != VB_RESUMING) return;
    en_rail_t *rail = t->base.rail;
    uint64_t now = bs_now_ns();
    if (now - t->t_fail0_ns > (uint64_t)t->tr->resume_ms * 1000000ull) {
        resume_gone(t, "no resume in time");
        return;
    }
    if (t->psk && t->psk->send_at_ns && now >= t->psk->send_at_ns) /* tests: a poke held */
        poke_go(t);
    if (t->ready_at_ns) { /* tests: the READY read, taken late */
        if (now >= t->ready_at_ns && t->rsk) resumed(t);
        return;
    }
    if (t->old_qp) return; /* the old QP is flushing */
    if (rail->rank < t->base.peer) {
        if (t->rsk && t->rsk->phase != SK_LIVE && now - t->t_dial_ns > VB_DIAL_MS * 1000000ull) {
            sock_close(t->rsk); /* unanswered: again, maybe through another device */
            t->rsk = NULL;
        }
        if (t->rsk) return;
        /* A QP failed just now (ours, or the peer's: VB_QPFAIL): the next
         * dial waits a tick, or the old QP's flush dialled again at once (a
         * lasting refusal: hundreds of QPs a second until the link ended). */
        if (t->t_refused_ns && now - t->t_refused_ns < VB_RESUME_TICK * 1000000ull) return;
        if (t->bsk && t->bsk->phase == SK_HELLO) { /* moving back */
            if (dev_usable(t->tr, t->bsk->via)) {
                t->want = t->bsk->via;
            } else {
                sock_close(t->bsk);
                t->bsk = NULL;
            }
        }
        if (t->want < 0) t->want = next_via(t);
        /* no port is up, or flushing, or no QP (the next tick tries again) */
        if (t->want < 0 || ensure_qp(t, t->want) <= 0) return;
        t->want = -1;
        if (t->bsk && t->bsk->phase == SK_HELLO && t->bsk->via == t->via) {
            /* The test of the own interface connected: it carries the dial. */
            vb_sock_t *s = t->bsk;
            t->bsk = NULL;
            s->back = false;
            s->resume = true;
            t->tries = 1; /* the own device is tried: next, the others */
            if (send_hello(t, s) != 0 ||
                uv_poll_start(&s->poll, UV_READABLE | UV_DISCONNECT, poll_cb) != 0) {
                sock_close(s);
                return;
            }
            t->rsk = s;
            t->t_dial_ns = now;
            return;
        }
        dial_resume(t, false, t->via);
    } else if (t->psk && now - t->t_dial_ns > VB_DIAL_MS * 1000000ull) {
        /* A poke unanswered (its SYN lost on a dead interface: the
         * kernel's retries take minutes): the next goes through the next
         * device, or one poke held the others back until the link ended. */
        sock_close(t->psk);
        t->psk = NULL;
    } else if (t->rsk && t->rsk->phase == SK_ANSWER) {
        /* The dial says which device: the new QPs are on the same rail's. */
        if (!dev_usable(t->tr, t->rsk->via)) {
            resume_sock_failed(t->rsk, false); /* the dialler tries another */
            return;
        }
        int q = ensure_qp(t, t->rsk->via);
        if (q > 0)
            answer_resume(t);
        else if (q < 0) {
            tell_qp_failed(t->rsk);
            resume_sock_failed(t->rsk, false); /* the dialler tries again */
        }
    } else if (!t->rsk && !t->psk &&
               (t->tr->test_poke_ms > 0 || now - t->t_dial_ns > VB_POKE_MS * 1000000ull)) {
        /* No dial yet: the lower rank may not know. A failure that took the
         * interface down first (a NIC reset) leaves its sockets and QP
         * looking fine, and the balancer gives it nothing to write on this
         * rail that would tell it (cluster.rails.failover.verbs: such a
         * link waited out its 5 s and was lost). Through the devices in
         * turn, as the dials: the own interface may be what failed. */
        int k = next_via(t);
        if (k >= 0) dial_resume(t, true, k);
    }
}

/* The first n payload bytes of frame f, written from declared memory,
 * into the staging ring at their places, from stream position off on. Only
 * from off: the staging ring holds no more than the bytes from the peer's
 * head, and before it the slots may carry later bytes already (copying a
 * whole frame that began before the head overwrote the next frame's
 * header: mp.verbs.soft.cut.zcopy). */
static void restage(vb_conn_t *t, const en_wreq_t *f, uint64_t n, uint64_t off)
{
    uint64_t p0 = f->tx_off + EN_HDR_SIZE, skip = off > p0 ? off - p0 : 0;
    if (skip >= n) return;
    uint64_t keep_tail = t->tx_tail;
    t->tx_tail = p0 + skip;
    ring_put(t, f->payload + skip, n - skip);
    t->tx_tail = keep_tail;
}

/* Moved, the lower rank: while the own device's port is active, dial the
 * peer through the own interface; once that connects (poll_cb), the link
 * moves back on that connection. A test unanswered for VB_DIAL_MS (the
 * peer's interface still down) is dropped and made again. */
static void back_tick(uv_timer_t *h)
{
    vb_conn_t *t = h->data;
    en_verbs_t *tr = t->tr;
    if (t->phase != VB_LIVE || t->via == tr->own) {
        uv_timer_stop(h);
        return;
    }
    if (t->bsk) {
        if (bs_now_ns() - t->t_dial_ns <= VB_DIAL_MS * 1000000ull) return;
        sock_close(t->bsk);
        t->bsk = NULL;
    }
    if (bs_now_ns() < t->back_at_ns || !dev_usable(tr, tr->own)) return;
    t->bsk = dial_via(t, tr->own, VB_DIAL_BACK);
    t->t_dial_ns = bs_now_ns();
}

/* Both QPs are up and READY went: write again from where the peer's ring
 * stopped. */
static void resumed(vb_conn_t *t)
{
    en_rail_t *rail = t->base.rail;
    uint64_t off = t->peer_off;
    if (off < t->peer_head || off > t->tx_tail || (off & 7)) {
        char why[160];
        snprintf(why, sizeof(why), "resume at byte %llu, outside the %llu..%llu not consumed",
                 (unsigned long long)off, (unsigned long long)t->peer_head,
                 (unsigned long long)t->tx_tail);
        conn_close(t, COH_EPROTO, why);
        return;
    }
    /* What was written from declared memory and not consumed comes again
     * from the staging ring, at its place in the stream. */
    for (en_wreq_t *f = t->zc_head; f; f = f->tx_next) restage(t, f, f->len, off);
    if (t->q_reg && t->q_off > EN_HDR_SIZE) /* the head frame, written in part from it */
        restage(t, t->q_head, t->q_off - EN_HDR_SIZE, off);
    sock_close(t->sk);
    sock_close(t->psk); /* a poke still connecting would resume the link again later */
    sock_close(t->bsk);
    t->sk = t->rsk;
    t->rsk = t->psk = t->bsk = NULL;
    t->sk->phase = SK_LIVE;
    atomic_fetch_add(&rail->stat_resent, t->tx_tail - off);
    t->tx_posted = t->tx_told = off;
    t->rx_told = t->rx_head - 1; /* tell our head again */
    t->err = false;
    t->phase = VB_LIVE;
    t->t_wc_ns = bs_now_ns(); /* the stall watch starts afresh */
    t->epoch++;
    if (t->rx_new) t->t_fail0_ns = 0;
    t->rx_new = t->answered = false;
    t->ready_at_ns = 0;
    t->tries = 0;
    t->want = -1;
    uv_timer_stop(&t->timer);
    /* A move back that ended on another device again (the peer's side of
     * the own device was not usable though its interface answered): the
     * next one waits longer, up to 16 probes. */
    t->back_fails = t->via == t->tr->own ? 0 : t->back_fails + (t->backing ? 1 : 0);
    t->backing = false;
    t->back_at_ns =
        bs_now_ns() +
        ((uint64_t)rail->probe_ms << (t->back_fails < 4 ? t->back_fails : 4)) * 1000000ull;
    if (t->via != t->tr->own) {
        /* Moved to another rail's device: the rail stays out of the
         * balancer's table (no return yet), and the lower rank tests its
         * own interface every probe_ms to move back. The move is the
         * failure's end: the move back, or a failure here, gets its own
         * resume_ms (a moved link carries little or nothing, and its
         * move back after a port down over 5 s was "no resume in time":
         * mp.verbs.soft.move.idle.n4.rails2). */
        t->t_fail0_ns = 0;
        bs_log(COH_LOG_INFO,
               "rank %d rail %d: RDMA link to rank %d moved to %s (rail %d's) at byte %llu "
               "(after: %s)",
               rail->rank, rail->index, t->base.peer, t->tr->dev[t->via].name, t->via,
               (unsigned long long)off, t->why);
        atomic_fetch_add(&rail->stat_moved, 1);
        if (rail->rank < t->base.peer)
            uv_timer_start(&t->timer, back_tick, (uint64_t)rail->probe_ms,
                           (uint64_t)rail->probe_ms);
        kick(t);
        return;
    }
    double pause = (double)(bs_now_ns() - t->t_resume_ns) / 1e9;
    char why[224];
    snprintf(why, sizeof(why), "RDMA link resumed on a new queue pair at byte %llu (after: %s)",
             (unsigned long long)off, t->why);
    t->moved = false;
    en_rail_event(rail, EN_RAIL_RETURN, t->base.peer, rail->index, pause, why);
    kick(t);
}

/* A resume this side cannot take (the link is gone here, or this rank is
 * finalizing): say so, so that the dialler gives up at once instead of
 * dialling until resume_ms (a peer that finalized while a link was
 * failing kept an op 5 s: mp.verbs.soft.kill.n4.rails2). */
static void refuse_resume(vb_conn_t *t, vb_sock_t *s, const char *why)
{
    uint8_t no = VB_REFUSE;
    (void)send(s->fd, &no, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    atomic_fetch_add(&t->base.rail->stat_rejected, 1);
    conn_close(t, COH_EPROTO, why);
}

/* A resume HELLO and endpoint on s: the peer's dial (accepted: s is still
 * the temporary link's) or its answer to ours. */
static void on_resume_hello(vb_sock_t *s, const en_hello_t *h)
{
    vb_conn_t *t = s->t;
    en_rail_t *rail = t->base.rail;
    if (s->resume) { /* the answer to our dial */
        if ((int)h->rank != t->base.peer) {
            resume_gone(t, "another rank answered");
            return;
        }
        ep_decode(s->in + EN_HELLO_SIZE, &t->theirs);
        t->peer_off = h->resume_off;
        uint8_t ready = VB_READY;
        bool refused = qp_connect(t) != 0;
        if (refused) tell_qp_failed(s);
        if (refused || send_all(s->fd, &ready, 1) != 0) {
            sock_close(s); /* the next tick dials again */
            t->rsk = NULL;
            if (refused)
                qp_refused(t);
            else if (t->qp_up)
                begin_resume(t, t->why); /* this QP is spent */
            return;
        }
        resumed(t);
        return;
    }
    /* The peer dials: the link it resumes is ours to that rank. */
    int p = (int)h->rank;
    vb_conn_t *l = p >= 0 && p < rail->world ? (vb_conn_t *)rail->peers[p] : NULL;
    if (!l || l == t || (l->phase != VB_LIVE && l->phase != VB_RESUMING)) {
        refuse_resume(t, s, "a resume of no link");
        return;
    }
    /* A dial or poke from a resume that is over (its epoch is behind the
     * link's: the dialler's epoch is never behind the answerer's) is
     * dropped; taken, it would fail a live link again. */
    if (h->epoch < l->epoch) {
        conn_forget(t);
        return;
    }
    if (h->via >= (uint32_t)rail->nrails || h->via >= EN_MAX_RAILS) {
        refuse_resume(t, s, "a resume through no rail");
        return;
    }
    if (p > rail->rank) { /* the higher rank's poke: we dial (if we did not know yet) */
        conn_forget(t);
        /* It names a device it can use: its own interface may be what is
         * down, and a dial through ours to it would go unanswered (1 s). */
        int via = (int)h->via;
        bool usable = dev_usable(l->tr, via);
        if (l->phase == VB_LIVE) {
            if (usable) l->want = via;
            begin_resume(l, "the peer resumes the link (it poked)");
        } else if (usable && l->rsk && l->rsk->phase == SK_CONNECTING && l->rsk->via != via) {
            sock_close(l->rsk);
            l->rsk = NULL;
            l->want = via;
            resume_step(l);
        }
        return;
    }
    vb_ep_t ep;
    ep_decode(s->in + EN_HELLO_SIZE, &ep);
    if (l->phase == VB_RESUMING && l->qp_up && (ep.qpn != l->theirs.qpn || (int)h->via != l->via)) {
        /* our QP went up for another of its QPs (a live link's is up too:
         * below, with the dial as the reason, not the last failure's) */
        sock_close(l->rsk);
        l->rsk = NULL;
        begin_resume(l, l->why);
    }
    /* The answerer takes the dialler's epoch: a READY lost left the dialler
     * one ahead, and every poke of ours after would be dropped as stale. */
    if (h->epoch > l->epoch) l->epoch = h->epoch;
    t->sk = NULL; /* the socket moves to the link */
    s->t = l;
    s->resume = true;
    s->via = (int)h->via;
    s->phase = SK_ANSWER;
    conn_forget(t);
    if (l->phase == VB_LIVE) begin_resume(l, "the peer resumes the link");
    if (l->rsk) sock_close(l->rsk);
    l->rsk = s;
    l->theirs = ep;
    l->peer_off = h->resume_off;
    resume_step(l);
}

/* The peer's HELLO and endpoint are in. */
static void on_hello(vb_sock_t *s)
{
    vb_conn_t *t = s->t;
    en_conn_t *c = &t->base;
    en_rail_t *rail = c->rail;
    en_hello_t h;
    char why[BS_ERR_LEN];
    if (en_hello_decode(s->in, EN_HELLO_SIZE, &h) == EN_HELLO_SIZE && (h.flags & EN_HELLO_RESUME)) {
        if (en_rail_check_hello(rail, &h, !s->resume && !c->outgoing, why, sizeof(why)) != 0) {
            if (s->resume)
                resume_sock_failed(s, false);
            else
                refuse_resume(t, s, why);
            return;
        }
        on_resume_hello(s, &h);
        return;
    }
    int r = en_link_hello(c, s->in, t->expect_peer, "an RDMA", &h, why, sizeof(why));
    ep_decode(s->in + EN_HELLO_SIZE, &t->theirs);
    if (r == 0 && t->theirs.ring_size != t->tr->ring_bytes) {
        snprintf(why, sizeof(why), "rings of %llu and %llu bytes (COHORT_VERBS_RING_BYTES)",
                 (unsigned long long)t->theirs.ring_size, (unsigned long long)t->tr->ring_bytes);
        r = COH_EPROTO;
    }
    if (r == 0 && !c->outgoing && qp_create(t) != 0) r = COH_ESYS;
    if (r == 0 && qp_connect(t) != 0) r = COH_ESYS;
    if (r == 0 && !c->outgoing && send_hello(t, s) != 0) r = COH_ESYS;
    if (r == COH_ESYS) snprintf(why, sizeof(why), "%s", coh_last_error());
    if (r < 0) {
        atomic_fetch_add(&rail->stat_rejected, 1);
        conn_close(t, r, why);
        return;
    }
    c->peer = (int)h.rank;
    if (c->outgoing) { /* our QP is up: the listener may write now */
        uint8_t ready = VB_READY;
        if (send_all(s->fd, &ready, 1) != 0) {
            conn_close(t, COH_EPEER, coh_last_error());
            return;
        }
        go_live(t);
    } else {
        s->phase = SK_WAIT_READY;
    }
}

/* An accepted connection whose HELLO is already wrong (garbage, another
 * job's token, another kind of connection) is refused as soon as that
 * shows, not when its endpoint would have followed: a stranger's short
 * hello held the handshake until its 10 s deadline (mp.boot.reject.n2
 * over verbs rails timed out). True when it was. */
static bool early_refusal(vb_conn_t *t, vb_sock_t *s)
{
    en_rail_t *rail = t->base.rail;
    en_hello_t h;
    char why[BS_ERR_LEN];
    size_t n = s->got < EN_HELLO_SIZE ? s->got : EN_HELLO_SIZE;
    int d = en_hello_decode(s->in, n, &h);
    if (d == 0) return false;
    if (d < 0)
        snprintf(why, sizeof(why), "malformed handshake");
    else if (en_rail_check_hello(rail, &h, true, why, sizeof(why)) == 0)
        return false;
    atomic_fetch_add(&rail->stat_rejected, 1);
    conn_close(t, COH_EPROTO, why);
    return true;
}

/* A resume's socket failed before the link was live on it: drop it; the
 * dialler tries again (a refused dial: the peer is gone). */
static void resume_sock_failed(vb_sock_t *s, bool refused)
{
    vb_conn_t *t = s->t;
    if (t->rsk == s) {
        t->rsk = NULL;
        t->ready_at_ns = 0;
    }
    sock_close(s);
    if (refused) resume_gone(t, "refused (the process or its link is gone)");
}

static void poll_cb(uv_poll_t *h, int status, int events)
{
    vb_sock_t *s = h->data;
    vb_conn_t *t = s->t;
    if (!t || t->phase == VB_CLOSED) return;
    if (s->back) { /* the own interface answers (or not) */
        if (status >= 0 && !(events & (UV_WRITABLE | UV_DISCONNECT))) return;
        int err = 0;
        socklen_t el = sizeof(err);
        if (getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0) err = errno;
        if (status < 0 || err || t->phase != VB_LIVE || s->phase != SK_CONNECTING) {
            if (t->bsk == s) t->bsk = NULL;
            sock_close(s);
            return;
        }
        uv_poll_stop(&s->poll);
        s->phase = SK_HELLO; /* connected, nothing said: the move back's dial */
        t->backing = true;
        t->t_fail0_ns = 0; /* not a failure: its own time to resume */
        begin_resume(t, "its own device answers again");
        return;
    }
    if (s->poke) { /* connected (or not): say RESUME and go */
        if (status >= 0 && !(events & (UV_WRITABLE | UV_DISCONNECT))) return;
        int err = 0;
        socklen_t el = sizeof(err);
        if (getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0) err = 0;
        if (status >= 0 && !err && t->tr->test_poke_ms > 0) { /* tests: held */
            s->send_at_ns = bs_now_ns() + (uint64_t)t->tr->test_poke_ms * 1000000ull;
            uv_poll_stop(&s->poll);
            return;
        }
        if (status >= 0 && !err) (void)send_hello(t, s);
        t->psk = NULL;
        sock_close(s);
        /* Refused through the own interface: the process is gone. Through
         * another, its listener may not be there (another address family). */
        if (err == ECONNREFUSED && s->via == t->tr->own)
            resume_gone(t, "refused (the process is gone)");
        return;
    }
    bool resuming = s != t->sk; /* a resume's socket (t->rsk) */
    if (status < 0) {
        /* libuv reports POLLERR so (UV_EBADF): a refused connect among them. */
        int err = 0;
        socklen_t el = sizeof(err);
        if (s->phase != SK_CONNECTING || getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0)
            err = 0;
        if (resuming)
            resume_sock_failed(s, err == ECONNREFUSED && s->via == t->tr->own);
        else if (s->phase == SK_LIVE)
            fail_link(t, uv_strerror(status));
        else
            conn_close(t, COH_EPEER, uv_strerror(status));
        return;
    }
    if (s->phase == SK_CONNECTING) {
        if (!(events & (UV_WRITABLE | UV_DISCONNECT))) return;
        int err = 0;
        socklen_t el = sizeof(err);
        if (getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0) err = errno;
        char why[BS_ERR_LEN];
        if (err) {
            if (resuming) {
                resume_sock_failed(s, err == ECONNREFUSED && s->via == t->tr->own);
                return;
            }
            snprintf(why, sizeof(why), "connecting to rank %d: %s", t->expect_peer, strerror(err));
            conn_close(t, COH_EPEER, why);
            return;
        }
        if (send_hello(t, s) != 0) {
            if (resuming) {
                resume_sock_failed(s, false);
                return;
            }
            snprintf(why, sizeof(why), "%s", coh_last_error());
            conn_close(t, COH_EPEER, why);
            return;
        }
        int e = uv_poll_start(&s->poll, UV_READABLE | UV_DISCONNECT, poll_cb);
        if (e) {
            conn_close(t, COH_ESYS, uv_strerror(e));
            return;
        }
        s->phase = SK_HELLO;
        return;
    }
    if (s->phase == SK_HELLO || s->phase == SK_WAIT_READY) {
        for (;;) {
            bool hello = s->phase == SK_HELLO;
            uint8_t b;
            uint8_t *dst = hello ? s->in + s->got : &b;
            ssize_t n = recv(s->fd, dst, hello ? sizeof(s->in) - s->got : 1, MSG_DONTWAIT);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
            if (n <= 0) {
                if (resuming && hello && s->got == 1 && s->in[0] == VB_QPFAIL) peer_qp_failed(t);
                if (resuming)
                    resume_sock_failed(s, hello && s->got == 1 && s->in[0] == VB_REFUSE);
                else
                    conn_close(t, COH_EPEER, "connection closed during the RDMA handshake");
                return;
            }
            if (!hello) {
                if (resuming && b == VB_QPFAIL) { /* the dialler dials again */
                    peer_qp_failed(t);
                    resume_sock_failed(s, false);
                    return;
                }
                if (b != VB_READY) {
                    conn_close(t, COH_EPROTO, "bad RDMA handshake");
                    return;
                }
                if (resuming && t->tr->test_lose_ready == t->base.peer && s == t->rsk) {
                    /* Tests: lost, and the socket died silently: the dialler
                     * is live and one epoch on, this side still resumes. */
                    t->tr->test_lose_ready = -1;
                    t->tr->test_lost_fd = fcntl(s->fd, F_DUPFD_CLOEXEC, 0);
                    resume_sock_failed(s, false);
                    return;
                }
                if (resuming && t->tr->test_ready_ms > 0 && s == t->rsk) /* tests */
                    t->ready_at_ns = bs_now_ns() + (uint64_t)t->tr->test_ready_ms * 1000000ull;
                else if (resuming)
                    resumed(t);
                else
                    go_live(t);
                return;
            }
            s->got += (size_t)n;
            if (s->got == sizeof(s->in)) {
                on_hello(s);
                return;
            }
            if (!resuming && !t->base.outgoing && early_refusal(t, s)) return;
        }
    }
    if (s->phase == SK_ANSWER) { /* the peer gave up this dial before our answer */
        uint8_t b;
        ssize_t n = recv(s->fd, &b, 1, MSG_DONTWAIT | MSG_PEEK);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            resume_sock_failed(s, false);
        return;
    }
    /* Live: the socket carries nothing more; readable means the peer went
     * (or, with failover, resumes the link). */
    uint8_t buf[64];
    ssize_t n;
    bool gone = (events & UV_DISCONNECT) != 0;
    while ((n = recv(s->fd, buf, sizeof(buf), MSG_DONTWAIT)) > 0) {
    }
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) gone = true;
    drain(t->tr); /* what the peer wrote before it went is still delivered */
    if (gone && t->phase == VB_LIVE && t->sk == s) {
        if (t->base.peer_bye)
            conn_close(t, COH_EPEER, "peer finalized");
        else
            fail_link(t, "connection closed by peer");
    }
}

static int conn_start(vb_conn_t *t, int fd, int phase)
{
    int ev = phase == SK_CONNECTING ? UV_WRITABLE : UV_READABLE | UV_DISCONNECT;
    t->sk = sock_new(t, fd, phase, ev);
    if (!t->sk) return bs_fail(COH_ESYS, "verbs: poll on a socket failed");
    uv_timer_start(&t->timer, hs_timeout, VB_HANDSHAKE_MS, 0);
    return 0;
}

static void on_accept(uv_poll_t *h, int status, int events)
{
    (void)events;
    en_verbs_t *tr = h->data;
    if (status < 0) return;
    for (;;) {
        int fd = accept4(tr->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return;
        vb_conn_t *t = conn_new(tr);
        if (!t) {
            close(fd);
            continue;
        }
        t->base.outgoing = false;
        if (conn_start(t, fd, SK_HELLO) != 0) conn_close(t, COH_ESYS, coh_last_error());
    }
}

/* ---- the device ---- */

/* The registration cache's registrar: the rail's protection domain. The
 * memory is only ever read by the device (the source of RDMA writes). */
static int mr_reg(void *arg, void *addr, size_t len, void **handle, uint32_t *key)
{
    en_verbs_t *tr = arg;
    struct ibv_mr *mr = tr->ib->reg_mr(tr->dev[tr->own].pd, addr, len, 0);
    if (!mr) {
        bs_log(COH_LOG_WARN, "rank %d rail %d: registering %zu bytes of declared memory: %s",
               tr->rail->rank, tr->rail->index, len, strerror(errno));
        return COH_ESYS;
    }
    *handle = mr;
    *key = mr->lkey;
    atomic_fetch_add_explicit(&tr->rail->stat_regs, 1, memory_order_relaxed);
    return 0;
}

static void mr_dereg(void *arg, void *handle)
{
    en_verbs_t *tr = arg;
    tr->ib->dereg_mr(handle);
}

/* Device k's GID (picked when not configured): at open, and again when its
 * port comes back (RoCE removes the entries with the interface's
 * addresses and adds them again, maybe at other indexes) or its table
 * changed (IBV_EVENT_GID_CHANGE: an address came or went). */
static int dev_gid(en_verbs_t *tr, int k)
{
    vb_dev_t *d = &tr->dev[k];
    en_rail_t *rail = tr->rail;
    /* RoCE: the GID whose address is the interface's (that of rail k). */
    const struct sockaddr_storage *ifa = k == tr->own ? &rail->local : &rail->locals[k];
    int was_index = d->gid_index;
    d->gid_index = tr->gid_index >= 0 ? tr->gid_index
                                      : en_ibv_pick_gid(tr->ib, d->ctx, tr->port, &d->pattr,
                                                        (const struct sockaddr *)ifa);
    union ibv_gid was = d->gid;
    if (tr->ib->query_gid(d->ctx, (uint8_t)tr->port, d->gid_index, &d->gid) != 0)
        return bs_fail(COH_ESYS, "verbs: %s GID %d: %s", d->name, d->gid_index, strerror(errno));
    d->gid_stale = false;
    /* Which address the QPs use, as NCCL says; again when it or its index
     * changed (an address removed moves the entries after it). */
    if (memcmp(was.raw, d->gid.raw, 16) != 0 || was_index != d->gid_index) {
        char a[INET6_ADDRSTRLEN] = "?";
        bool m = en_gid_is_v4mapped(d->gid.raw);
        inet_ntop(m ? AF_INET : AF_INET6, d->gid.raw + (m ? 12 : 0), a, sizeof(a));
        bs_log(COH_LOG_INFO, "rank %d rail %d: RDMA device %s port %d (rail %d's), GID %d: %s",
               rail->rank, rail->index, d->name, tr->port, k, d->gid_index, a);
    }
    return 0;
}

/* Open device k: its context, PD, completion channel (watched by the
 * rail's loop) and CQ. */
static int dev_open(en_verbs_t *tr, int k)
{
    vb_dev_t *d = &tr->dev[k];
    en_rail_t *rail = tr->rail;
    d->tr = tr;
    d->tried = true;
    d->ctx = tr->ib->open_device(d->name);
    if (!d->ctx)
        return bs_fail(COH_EUNSUPPORTED, "verbs: no RDMA device %s (provider %s)", d->name,
                       tr->ib->name);
    if (tr->ib->query_port(d->ctx, (uint8_t)tr->port, &d->pattr) != 0)
        return bs_fail(COH_ESYS, "verbs: %s port %d: %s", d->name, tr->port, strerror(errno));
    /* The own device must be up at start; another rail's may be down now
     * (dev_usable reads its port each time, and its GID once it is up). */
    bool up = d->pattr.state == IBV_PORT_ACTIVE;
    if (!up && k == tr->own)
        return bs_fail(COH_EUNSUPPORTED, "verbs: %s port %d is not active", d->name, tr->port);
    d->gid_stale = true;
    if (up) BS_CHECK(dev_gid(tr, k));
    d->pd = tr->ib->alloc_pd(d->ctx);
    d->ch = tr->ib->create_comp_channel(d->ctx);
    if (!d->pd || !d->ch) return bs_fail(COH_ESYS, "verbs: PD / channel: %s", strerror(errno));
    if (k == tr->own && tr->regions && tr->zcopy_bytes) {
        en_regcache_ops_t ro = {.arg = tr, .reg = mr_reg, .dereg = mr_dereg};
        tr->regs = en_regcache_new(tr->regions, &ro, tr->reg_cache_bytes);
        if (!tr->regs) return bs_fail(COH_ENOMEM, "verbs: out of memory");
    }
    /* Room for every link's work requests at once. */
    struct ibv_device_attr da;
    int cqe = (rail->world > 1 ? rail->world : 2) * (VB_RQ_DEPTH + VB_SQ_DEPTH) + 64;
    if (tr->ib->query_device(d->ctx, &da) == 0 && cqe > da.max_cqe) cqe = da.max_cqe;
    d->cq = tr->ib->create_cq(d->ctx, cqe, d, d->ch, 0);
    if (!d->cq) return bs_fail(COH_ESYS, "verbs: ibv_create_cq: %s", strerror(errno));
    int fl = fcntl(d->ch->fd, F_GETFL);
    if (fl < 0 || fcntl(d->ch->fd, F_SETFL, fl | O_NONBLOCK) != 0)
        return bs_fail(COH_ESYS, "verbs: fcntl: %s", strerror(errno));
    if (tr->ib->req_notify_cq(d->cq, 0) != 0) return bs_fail(COH_ESYS, "verbs: ibv_req_notify_cq");
    if (uv_poll_init(rail->loop, &d->ch_poll, d->ch->fd) != 0)
        return bs_fail(COH_ESYS, "verbs: poll on the completion channel");
    d->ch_poll.data = d;
    d->ch_poll_open = true;
    uv_poll_start(&d->ch_poll, UV_READABLE, on_channel);
    /* Asynchronous events: a port that goes down fails the links on it at
     * once, instead of when their work requests run out of retries (the
     * retry timer: seconds). */
    int afd = d->ctx->async_fd;
    if (afd >= 0 && (fl = fcntl(afd, F_GETFL)) >= 0 && fcntl(afd, F_SETFL, fl | O_NONBLOCK) == 0 &&
        uv_poll_init(rail->loop, &d->async_poll, afd) == 0) {
        d->async_poll.data = d;
        d->async_open = true;
        uv_poll_start(&d->async_poll, UV_READABLE, on_async);
    }
    d->ok = true;
    return 0;
}

/* Device k's port went down (or the device failed): its live links fail
 * now, and a resume dialling through it tries another device. */
static void dev_down(en_verbs_t *tr, int k, const char *what)
{
    char why[160];
    snprintf(why, sizeof(why), "%s (an asynchronous event of %s)", what, tr->dev[k].name);
    tr->dev[k].gid_stale = true;
    for (vb_conn_t *t = tr->conns, *next; t; t = next) {
        next = t->next;                   /* fail_link may close t */
        if (t->bsk && t->bsk->via == k) { /* a way back through it: not now */
            sock_close(t->bsk);
            t->bsk = NULL;
        }
        if (t->psk && t->psk->via == k) { /* a poke through it: the next goes another way */
            sock_close(t->psk);
            t->psk = NULL;
        }
        if (t->want == k) t->want = -1;
        if (t->via != k) continue;
        if (t->phase == VB_LIVE && t->qp) {
            fail_link(t, why);
        } else if (t->phase == VB_RESUMING && t->rsk && t->rsk->phase != SK_LIVE &&
                   t->rsk->phase != SK_ANSWER) {
            sock_close(t->rsk); /* our dial through it: the next goes another way */
            t->rsk = NULL;
            resume_step(t);
        }
    }
}

static void on_async(uv_poll_t *h, int status, int events)
{
    (void)status;
    (void)events;
    vb_dev_t *d = h->data;
    en_verbs_t *tr = d->tr;
    int k = (int)(d - tr->dev);
    struct ibv_async_event ev;
    while (d->ctx && tr->ib->get_async_event(d->ctx, &ev) == 0) {
        enum ibv_event_type ty = ev.event_type;
        bool port = ty == IBV_EVENT_PORT_ERR || ty == IBV_EVENT_PORT_ACTIVE;
        bool ours = !port || ev.element.port_num == tr->port;
        struct ibv_qp *qp =
            ty == IBV_EVENT_QP_FATAL || ty == IBV_EVENT_QP_REQ_ERR || ty == IBV_EVENT_QP_ACCESS_ERR
                ? ev.element.qp
                : NULL;
        /* Acked first: destroying a QP waits for its events' acks. */
        tr->ib->ack_async_event(&ev);
        if (!ours) continue;
        if (ty == IBV_EVENT_DEVICE_FATAL || (ty == IBV_EVENT_PORT_ERR && tr->rail->failover)) {
            /* Without failover a port's flap is left to the QPs' retries:
             * one shorter than they last costs nothing. */
            dev_down(tr, k, ty == IBV_EVENT_PORT_ERR ? "the port went down" : "the device failed");
        } else if (ty == IBV_EVENT_GID_CHANGE) {
            /* An address came or went: the next QP re-picks (dev_usable).
             * Live QPs keep theirs; one whose address went fails on its own. */
            d->gid_stale = true;
        } else if (ty == IBV_EVENT_PORT_ACTIVE && k == tr->own) {
            /* Moved links try their own device now, not at the next probe. */
            for (vb_conn_t *t = tr->conns; t; t = t->next)
                if (t->phase == VB_LIVE && t->via != k && !t->bsk && tr->rail->rank < t->base.peer)
                    back_tick(&t->timer);
        } else if (qp) {
            for (vb_conn_t *t = tr->conns; t; t = t->next)
                if (t->qp == qp && t->phase == VB_LIVE) {
                    fail_link(t, ibv_event_type_str(ty));
                    break;
                }
        }
    }
}

static void dev_close(en_verbs_t *tr, vb_dev_t *d)
{
    if (d->cq) tr->ib->destroy_cq(d->cq);
    if (d->ch) tr->ib->destroy_comp_channel(d->ch);
    if (d->pd) tr->ib->dealloc_pd(d->pd);
    if (d->ctx) tr->ib->close_device(d->ctx);
    d->cq = NULL;
    d->ch = NULL;
    d->pd = NULL;
    d->ctx = NULL;
    d->ok = false;
}

/* Device k can carry a link now: it exists (another rail's is opened the
 * first time it is asked for) and its port is active. A port that went
 * down (a NIC's link, an rxe's interface) is why a link moves. */
static bool dev_usable(en_verbs_t *tr, int k)
{
    if (k < 0 || k >= tr->rail->nrails || k >= EN_MAX_RAILS) return false;
    vb_dev_t *d = &tr->dev[k];
    uint64_t now = bs_now_ns();
    if (!d->ok && d->name[0] && now >= d->retry_ns) {
        /* Not at all, or it failed: again, at most every probe_ms (a card
         * being reset fails to open for a while). */
        bool first = !d->tried;
        if (dev_open(tr, k) != 0) {
            if (first)
                bs_log(COH_LOG_INFO, "rank %d rail %d: links cannot move to %s now: %s",
                       tr->rail->rank, tr->rail->index, d->name, coh_last_error());
            /* Nothing it opened is watched yet: close it all. */
            if (!d->ch_poll_open) dev_close(tr, d);
            d->retry_ns = now + (uint64_t)tr->rail->probe_ms * 1000000ull;
        }
    }
    if (!d->ok) return false;
    if (k == tr->own && now < tr->test_down_until_ns) return false;
    struct ibv_port_attr pa;
    if (tr->ib->query_port(d->ctx, (uint8_t)tr->port, &pa) != 0) return false;
    d->pattr.lid = pa.lid;
    d->pattr.active_mtu = pa.active_mtu;
    if (pa.state != IBV_PORT_ACTIVE) {
        d->gid_stale = true;
        return false;
    }
    /* Its entry may have moved before the GID_CHANGE event is read (an
     * address removed in front of it): a QP made now must not take the
     * index of another address, or of none. */
    union ibv_gid g;
    if (!d->gid_stale && (tr->ib->query_gid(d->ctx, (uint8_t)tr->port, d->gid_index, &g) != 0 ||
                          memcmp(g.raw, d->gid.raw, 16) != 0))
        d->gid_stale = true;
    return !d->gid_stale || dev_gid(tr, k) == 0;
}

/* ---- the transport ---- */

/* With failover, every stall_ms / 4: a live link whose writes have waited
 * stall_ms for a completion while another rail's completions or ACKs came
 * is taken for failed, as a TCP link whose ACKs stop. Its QP would say so
 * only when its retries are spent (timeout and retry_cnt: about 0.5 s on a
 * NIC, 1 s on the soft provider), and a blackholed path held the op in
 * flight that long. When every rail is silent the peer is, and the QP's
 * retries and the liveness socket judge it. */
static void watch_cb(uv_timer_t *h)
{
    en_verbs_t *tr = h->data;
    en_rail_t *rail = tr->rail;
    if (rail->closing || !rail->progress_ns) return;
    uint64_t now = bs_now_ns(), stall = (uint64_t)rail->stall_ms * 1000000ull;
    bool others = en_rail_others_progress(rail, now);
    for (vb_conn_t *t = tr->conns, *next; t; t = next) {
        next = t->next; /* fail_link may close t */
        if (t->phase != VB_LIVE || !t->qp || t->err) continue;
        if (t->sq_out == 0) {
            t->t_wc_ns = now; /* nothing waits */
            continue;
        }
        if (!others || now - t->t_wc_ns < stall) continue;
        char why[96];
        snprintf(why, sizeof(why), "no RDMA completion for %.0f ms while another rail's came",
                 (double)(now - t->t_wc_ns) / 1e6);
        t->own_suspect = t->via == tr->own;
        fail_link(t, why);
    }
}

static int vb_listen(en_rail_t *rail, const struct sockaddr *addr, struct sockaddr_storage *bound)
{
    en_verbs_t *tr = rail->verbs;
    BS_CHECK(dev_open(tr, tr->own));
    tr->lfd = socket(addr->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (tr->lfd < 0) return bs_fail(COH_ESYS, "verbs: socket: %s", strerror(errno));
    int one = 1;
    setsockopt(tr->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    socklen_t al =
        addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
    /* With failover a resume may come through any interface (a link moved
     * to another rail's device), as to a TCP rail's listener. */
    struct sockaddr_storage at;
    en_rail_listen_at(rail, addr, &at);
    int v6only = 0; /* dual stack, as libuv binds the TCP rails' */
    if (at.ss_family == AF_INET6)
        setsockopt(tr->lfd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof(v6only));
    if (bind(tr->lfd, (struct sockaddr *)&at, al) != 0 || listen(tr->lfd, 256) != 0)
        return bs_fail(COH_ESYS, "verbs: listening: %s", strerror(errno));
    socklen_t bl = sizeof(*bound);
    if (getsockname(tr->lfd, (struct sockaddr *)bound, &bl) != 0)
        return bs_fail(COH_ESYS, "verbs: getsockname: %s", strerror(errno));
    en_rail_listen_named(addr, bound);
    if (uv_poll_init(rail->loop, &tr->lpoll, tr->lfd) != 0)
        return bs_fail(COH_ESYS, "verbs: poll on the listener");
    tr->lpoll.data = tr;
    tr->lpoll_open = true;
    uv_poll_start(&tr->lpoll, UV_READABLE, on_accept);
    if (rail->failover && rail->nrails > 1 && rail->progress_ns &&
        uv_timer_init(rail->loop, &tr->watch) == 0) {
        uint64_t every = (uint64_t)rail->stall_ms / 4;
        tr->watch.data = tr;
        tr->watch_open = true;
        uv_timer_start(&tr->watch, watch_cb, every ? every : 1, every ? every : 1);
    }
    return 0;
}

static int vb_connect(en_rail_t *rail, int peer, const struct sockaddr *addr)
{
    en_verbs_t *tr = rail->verbs;
    int fd = dial_fd(&rail->local, addr); /* the handshake's deadline: VB_HANDSHAKE_MS */
    if (fd == -2) return bs_fail(COH_ESYS, "verbs: socket: %s", strerror(errno));
    if (fd < 0)
        return bs_fail(COH_EPEER, "verbs: connecting to rank %d: %s", peer, strerror(errno));
    vb_conn_t *t = conn_new(tr);
    if (!t) {
        close(fd);
        return bs_fail(COH_ENOMEM, "out of memory");
    }
    t->base.outgoing = true;
    t->expect_peer = peer;
    if (qp_create(t) != 0) {
        close(fd);
        fd = -1;
    }
    if (fd < 0 || conn_start(t, fd, SK_CONNECTING) != 0) {
        char why[BS_ERR_LEN];
        snprintf(why, sizeof(why), "%s", coh_last_error());
        conn_close(t, COH_ESYS, why);
        return bs_fail(COH_ESYS, "%s", why);
    }
    return 0;
}

static void vb_close(en_conn_t *c, int status, const char *why)
{
    conn_close((vb_conn_t *)c, status, why);
}

/* Tests: the link fails as with a failing NIC: every work request in
 * flight is flushed with an error, and the liveness socket ends. */
static void vb_cut(en_conn_t *c)
{
    vb_conn_t *t = (vb_conn_t *)c;
    if (t->tr->test_down_ms > 0)
        t->tr->test_down_until_ns = bs_now_ns() + (uint64_t)t->tr->test_down_ms * 1000000ull;
    if (t->qp && t->phase == VB_LIVE) {
        struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
        t->tr->ib->modify_qp(t->qp, &a, IBV_QP_STATE);
    }
    if (t->sk) shutdown(t->sk->fd, SHUT_RDWR);
}

static bool flushing(const en_verbs_t *tr)
{
    for (const vb_conn_t *t = tr->dead; t; t = t->next)
        if (t->wr_out > 0 || t->old_out > 0) return true;
    return false;
}

/* The listener closes with the rail, not at fini: a peer's resume dial to a
 * rank that is finalizing is refused at once, instead of waiting in the
 * backlog of a socket nobody accepts from any more (until its deadline). */
static void listener_closed(uv_handle_t *h)
{
    en_verbs_t *tr = h->data;
    if (tr->lfd >= 0) close(tr->lfd);
    tr->lfd = -1;
}

/* A live link with frames not yet written, or written and not yet
 * acknowledged by the peer's NIC. */
static bool unsent(const en_verbs_t *tr)
{
    for (const vb_conn_t *t = tr->conns; t; t = t->next)
        if (t->phase == VB_LIVE && !t->err &&
            (t->q_head || t->tx_posted != t->tx_tail || t->tx_told != t->tx_tail || t->sq_out > 0))
            return true;
    return false;
}

static void vb_shutdown(en_rail_t *rail)
{
    en_verbs_t *tr = rail->verbs;
    if (!tr) return;
    /* What the links hold goes out first, and is acknowledged: a frame
     * counts as sent once in the staging ring (as a write TCP took does),
     * but TCP delivers that after a close and a QP in error does not. A
     * barrier's last message to a peer still in the barrier was lost so,
     * and the peer failed (mp.verbs.soft.churn.n4.rails3 in CI). Bounded:
     * a peer that stopped reading keeps it at most 1 s. */
    for (int i = 0; i < 1000 && unsent(tr); i++) {
        for (vb_conn_t *t = tr->conns; t; t = t->next)
            if (t->phase == VB_LIVE) kick(t);
        drain(tr);
        if (unsent(tr)) usleep(1000);
    }
    while (tr->conns) conn_close(tr->conns, COH_ECANCELED, "rail stopping");
    if (tr->watch_open) {
        uv_close((uv_handle_t *)&tr->watch, NULL);
        tr->watch_open = false;
    }
    if (tr->lpoll_open) {
        uv_close((uv_handle_t *)&tr->lpoll, listener_closed);
        tr->lpoll_open = false;
    }
    /* The flushes of the closed links come back before the channel goes
     * (bounded: a device that stopped answering keeps them). */
    for (int i = 0; i < 1000 && flushing(tr); i++) {
        drain(tr);
        if (flushing(tr)) usleep(1000);
    }
    for (int k = 0; k < EN_MAX_RAILS; k++) {
        vb_dev_t *d = &tr->dev[k];
        if (d->ch_poll_open) uv_close((uv_handle_t *)&d->ch_poll, NULL);
        if (d->async_open) uv_close((uv_handle_t *)&d->async_poll, NULL);
        d->ch_poll_open = d->async_open = false;
    }
    done_run(tr);
}

const en_transport_ops_t en_verbs_ops = {
    .name = "verbs",
    .tr_listen = vb_listen,
    .tr_connect = vb_connect,
    .tr_send = vb_send,
    .tr_resume = vb_resume,
    .tr_close = vb_close,
    .tr_shutdown = vb_shutdown,
    .tr_cut = vb_cut,
};

int en_verbs_netdev_of(const char *provider, const char *dev, int port, char *out, size_t cap)
{
    const en_ibv_t *ib = en_ibv_find(provider);
    return ib ? ib->netdev_of_dev(dev, port, out, cap) : COH_EINVAL;
}

int en_verbs_init(en_rail_t *rail, const en_rail_cfg_t *cfg)
{
    const char *netdev = cfg->verbs_netdevs[rail->index], *dev = cfg->verbs_devs[rail->index];
    if (!dev || !*dev) dev = cfg->verbs_dev;
    en_verbs_t *tr = coh_zalloc(sizeof(*tr));
    if (!tr) return bs_fail(COH_ENOMEM, "out of memory");
    tr->rail = rail;
    tr->lfd = -1;
    tr->ib = en_ibv_find(cfg->verbs_provider);
    if (!tr->ib) {
        coh_free(tr);
        return bs_fail(COH_EINVAL, "COHORT_VERBS_PROVIDER: '%s' is none of rdma-core, soft",
                       cfg->verbs_provider);
    }
    tr->port = cfg->verbs_port > 0 ? cfg->verbs_port : 1;
    tr->gid_index = cfg->verbs_gid;
    tr->test_down_ms = cfg->verbs_test_port_down_ms;
    tr->test_ready_ms = cfg->verbs_test_ready_delay_ms;
    tr->test_poke_ms = cfg->verbs_test_poke_late_ms;
    tr->test_lose_ready = cfg->verbs_test_lose_ready - 1;
    tr->test_lost_fd = -1;
    tr->test_rts_fail = cfg->verbs_test_rts_fail - 1;
    tr->test_rts_left = cfg->verbs_test_rts_fail_times > 0 ? cfg->verbs_test_rts_fail_times : -1;
    tr->test_create_fail = cfg->verbs_test_create_fail;
    tr->test_rts_peer = cfg->verbs_test_rts_fail_peer;
    tr->resume_ms = cfg->verbs_resume_ms > 0 ? cfg->verbs_resume_ms : 5000;
    tr->regions = cfg->regions;
    tr->zcopy_bytes = cfg->verbs_zcopy_bytes;
    tr->reg_cache_bytes = cfg->verbs_reg_cache_bytes;
    size_t rb = 64 * 1024; /* a power of two, at least 64 KiB */
    while (rb < cfg->verbs_ring_bytes && rb < (1u << 30)) rb <<= 1;
    tr->ring_bytes = rb;
    tr->own = rail->index;
    vb_dev_t *own = &tr->dev[tr->own];
    int st = 0;
    if (dev && *dev)
        snprintf(own->name, sizeof(own->name), "%s", dev);
    else if (!netdev || tr->ib->dev_of_netdev(netdev, own->name, sizeof(own->name)) != 0)
        st = bs_fail(COH_EUNSUPPORTED,
                     "verbs: no RDMA device behind interface %s (COHORT_VERBS_DEVICE names one)",
                     netdev ? netdev : "?");
    if (st < 0) {
        coh_free(tr);
        return st;
    }
    /* Where a link may move: the devices behind the other rails'
     * interfaces (none: it resumes on its own device only). */
    for (int k = 0; rail->failover && cfg->verbs_move && k < rail->nrails && k < EN_MAX_RAILS;
         k++) {
        const char *nd = cfg->verbs_netdevs[k], *named = cfg->verbs_devs[k];
        if (k == tr->own) continue;
        if (named && *named)
            snprintf(tr->dev[k].name, sizeof(tr->dev[k].name), "%s", named);
        else if (nd && *nd &&
                 tr->ib->dev_of_netdev(nd, tr->dev[k].name, sizeof(tr->dev[k].name)) != 0)
            tr->dev[k].name[0] = 0;
    }
    tr->ops = en_verbs_ops;
    en_ops_complete(&tr->ops);
    rail->verbs = tr;
    return 0;
}

void en_verbs_fini(en_rail_t *rail)
{
    en_verbs_t *tr = rail->verbs;
    if (!tr) return;
    /* Links still flushing when the rail stopped: their memory goes now. */
    while (tr->dead) {
        vb_conn_t *t = tr->dead;
        t->wr_out = t->old_out = 0;
        conn_free(t);
    }
    en_regcache_free(tr->regs); /* every link is gone: nothing holds one */
    for (int k = 0; k < EN_MAX_RAILS; k++) dev_close(tr, &tr->dev[k]);
    if (tr->lfd >= 0) close(tr->lfd);
    if (tr->test_lost_fd >= 0) close(tr->test_lost_fd);
    coh_free(tr);
    rail->verbs = NULL;
}
