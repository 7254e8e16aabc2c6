/*
 * The soft verbs provider (COHORT_VERBS_PROVIDER=soft; en_ibv.h): RC queue
 * pairs in user space, over TCP between the hosts' interfaces, as the
 * kernel's rxe (RoCE) and siw (iWARP) are over Ethernet. The verbs engine
 * runs on it unchanged where there is no RDMA device.
 *
 * What it keeps of RC, because the engine depends on it:
 *   - RDMA write and write with immediate, placed in the target's
 *     registered memory in order; an immediate consumes a posted receive,
 *     so its completion says that every write before it has landed;
 *   - a send completes when the responder acknowledged it (cumulative
 *     ACKs, as RC's), in order;
 *   - keys checked: a local buffer outside an MR of its lkey fails the
 *     request (IBV_WC_LOC_PROT_ERR), a remote one outside an MR of its rkey
 *     with remote write fails it at the requester (IBV_WC_REM_ACCESS_ERR)
 *     and puts both QPs in error;
 *   - an immediate with no receive posted waits (RNR, retried without end,
 *     as rnr_retry = 7 says), and the requester's timer stops meanwhile;
 *   - no acknowledgement for timeout x (retry_cnt + 1) (4.096 us << timeout
 *     each, at least SR_MIN_RETRY_NS here: a TCP link under a busy host),
 *     or the connection to the peer's NIC broken: IBV_WC_RETRY_EXC_ERR for
 *     the oldest request, the rest flushed;
 *   - a QP in error completes every request posted with IBV_WC_WR_FLUSH_ERR
 *     (those already there and those posted after);
 *   - completions go to the CQ, and to its channel's fd once armed
 *     (ibv_req_notify_cq), one event per arming.
 * What it does not model: UD, SRQ, sends and reads, atomics, several SGEs,
 * inline data, memory windows, speeds, PSNs (TCP orders and retransmits).
 *
 * Each opened device is a NIC thread (cohort-softrdma) with a listener (one
 * port, both families). Its GID table holds the interface's addresses, as
 * RoCE v2 entries: the IPv4 ones (mapped) first, then the IPv6 ones, read
 * again at each query (they come and go with the interface). A QP brought
 * to RTS connects from the address of its source GID to the peer's NIC
 * (the address in the destination GID, the port in its LID), says which QP
 * it wants, and sends requests: a 24-byte header (op, length, remote
 * address, rkey, immediate) and the payload. The responder's thread checks
 * the key and receives the payload straight into the registered memory,
 * and answers on the same socket with 8-byte ACK, RNR or NAK messages.
 *
 * Threading: the application's calls and the NIC thread share one mutex
 * per device. Only the NIC thread closes a socket or frees a QP (it may be
 * polling them), so destroy_qp hands the QP over and returns; memory is
 * touched only under the mutex after its key was checked, so once
 * dereg_mr returns the thread does not touch that memory again.
 */

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "base/base.h"
#include "engines/en_frame.h"
#include "engines/en_ibv.h"

#define SR_PREFIX       "soft_"
#define SR_MAGIC        0x53524d41u /* the first word of a QP's connection */
#define SR_HELLO_SIZE   12
#define SR_REQ_SIZE     24
#define SR_MSG_SIZE     8
#define SR_MIN_RETRY_NS 1000000000ull
#define SR_POLL_MS      20 /* the retry timer's tick while requests wait */
#define SR_MAX_WR       16384
#define SR_MAX_GIDS     16 /* the GID table's length (entries past the addresses: zero) */

enum { SR_OP_WRITE = 1, SR_OP_WRITE_IMM = 2 };
enum { SR_MSG_ACK = 1, SR_MSG_RNR = 2, SR_MSG_NAK = 3 };
enum { SR_OUT_NONE = 0, SR_OUT_CONNECTING, SR_OUT_OPEN };

#define SR_OF(type, member, p) ((type *)(void *)((char *)(p)-offsetof(type, member)))

typedef struct sr_dev sr_dev_t;

typedef struct sr_mr {
    struct ibv_mr mr;
    int access;
    struct sr_mr *next;
} sr_mr_t;

typedef struct sr_chan {
    struct ibv_comp_channel ch; /* .fd: the read end */
    int wfd;
} sr_chan_t;

typedef struct sr_cq {
    struct ibv_cq cq;
    sr_chan_t *chan;
    struct ibv_wc *e;
    int cap, head, n;
    bool armed;
} sr_cq_t;

typedef struct sr_swqe {
    uint64_t wr_id, laddr, raddr;
    uint32_t len, lkey, rkey, imm; /* imm: network order, as posted */
    uint8_t op;
} sr_swqe_t;

typedef struct sr_qp {
    struct ibv_qp qp;
    struct sr_qp *next;
    sr_dev_t *dev;
    sr_cq_t *scq, *rcq;
    bool destroyed;
    /* Send queue: [head, next) transmitted and not acknowledged, [next,
     * tail) not transmitted yet (ever-growing counters). */
    sr_swqe_t *sq;
    uint32_t sq_cap;
    uint64_t sq_head, sq_next, sq_tail;
    uint64_t *rq;
    uint32_t rq_cap;
    uint64_t rq_head, rq_tail;
    struct sockaddr_storage peer;
    socklen_t peer_len;
    int sgid; /* the source GID's index */
    uint32_t dest_qpn;
    uint64_t retry_ns;
    /* Requester: the connection to the peer's NIC. */
    int out_fd, out_state;
    uint8_t hello[SR_HELLO_SIZE];
    size_t hello_off;
    uint8_t txh[SR_REQ_SIZE];
    size_t txh_off;
    bool tx_started, tx_blocked;
    uint64_t txp_off;
    uint8_t msg[SR_MSG_SIZE];
    size_t msg_got;
    uint64_t waited_ns; /* the oldest request's timer started */
    bool rnr, peer_gone;
    /* Responder: the peer's connection to us. */
    int in_fd;
    uint8_t rxh[SR_REQ_SIZE];
    size_t rxh_got;
    bool rx_hdr, rx_rnr, in_shut;
    uint8_t rx_op;
    uint32_t rx_len, rx_rkey, rx_imm;
    uint64_t rx_addr, rx_got;
    uint32_t in_done, acked;
    bool want_rnr;
    uint8_t out_msg[SR_MSG_SIZE];
    size_t out_msg_off, out_msg_len;
} sr_qp_t;

typedef struct sr_pend {
    int fd;
    uint8_t b[SR_HELLO_SIZE];
    size_t got;
    struct sr_pend *next;
} sr_pend_t;

struct sr_dev {
    struct ibv_context ctx;
    struct ibv_device ibdev;
    uint16_t port; /* the NIC thread's listener's (the port's LID) */
    int lfd, wfd;
    /* The port follows the interface: link changes come on nlfd (netlink),
     * and a change of the port's state goes to the application as an
     * asynchronous event (one uint32 event type per write on aev[1];
     * ctx.async_fd is aev[0]), as rxe's do. */
    int nlfd, aev[2];
    bool port_up;
    union ibv_gid gids[SR_MAX_GIDS]; /* the table as last told (watch_port) */
    int ngids;
    pthread_t thr;
    bool thr_on, stop;
    pthread_mutex_t mu;
    sr_mr_t *mrs;
    uint32_t next_key;
    sr_qp_t *qps;
    uint32_t next_qpn;
    sr_pend_t *pend;
    en_soft_stats_t st;
};

static sr_dev_t *dev_of(struct ibv_context *c)
{
    return SR_OF(sr_dev_t, ctx, c);
}

static sr_qp_t *qp_of(struct ibv_qp *q)
{
    return SR_OF(sr_qp_t, qp, q);
}

static sr_cq_t *cq_of(struct ibv_cq *c)
{
    return SR_OF(sr_cq_t, cq, c);
}

static void wake(sr_dev_t *d)
{
    uint64_t one = 1;
    ssize_t r = write(d->wfd, &one, sizeof(one));
    (void)r; /* a full counter is awake already */
}

static void close_fd(int *fd)
{
    if (*fd >= 0) close(*fd);
    *fd = -1;
}

/* ---- the interface ---- */

/* Whether an interface has an address (IPv4 or IPv6; routable: not an IPv6
 * link-local one, which an interface keeps while up), and its flags (may be
 * NULL): 0 when it has. */
static int if_flags(const char *ifname, bool routable, unsigned *flags)
{
    struct ifaddrs *ifs = NULL, *i;
    if (getifaddrs(&ifs) != 0) return -1;
    int st = -1;
    for (i = ifs; i; i = i->ifa_next)
        if (i->ifa_addr && !strcmp(i->ifa_name, ifname) &&
            (i->ifa_addr->sa_family == AF_INET ||
             (i->ifa_addr->sa_family == AF_INET6 &&
              !(routable && IN6_IS_ADDR_LINKLOCAL(
                                &((struct sockaddr_in6 *)(void *)i->ifa_addr)->sin6_addr))))) {
            if (flags) *flags = i->ifa_flags;
            st = 0;
            break;
        }
    freeifaddrs(ifs);
    return st;
}

/* The GID table: the interface's addresses, IPv4 (mapped) first, then
 * IPv6; how many (at most cap). */
static int gid_table(const sr_dev_t *d, union ibv_gid *out, int cap)
{
    const char *ifname = d->ibdev.name + strlen(SR_PREFIX);
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0) return 0;
    int n = 0;
    for (int fam = 0; fam < 2; fam++)
        for (struct ifaddrs *i = ifs; i && n < cap; i = i->ifa_next) {
            if (!i->ifa_addr || strcmp(i->ifa_name, ifname) != 0) continue;
            union ibv_gid *g = &out[n];
            memset(g, 0, sizeof(*g));
            if (fam == 0 && i->ifa_addr->sa_family == AF_INET) {
                g->raw[10] = g->raw[11] = 0xff;
                memcpy(g->raw + 12, &((struct sockaddr_in *)(void *)i->ifa_addr)->sin_addr, 4);
                n++;
            } else if (fam == 1 && i->ifa_addr->sa_family == AF_INET6) {
                memcpy(g->raw, &((struct sockaddr_in6 *)(void *)i->ifa_addr)->sin6_addr, 16);
                n++;
            }
        }
    freeifaddrs(ifs);
    return n;
}

/* A GID as a socket address (port 0): IPv4-mapped ones as IPv4, link-local
 * ones scoped to the device's interface. */
static socklen_t gid_sockaddr(const sr_dev_t *d, const union ibv_gid *g,
                              struct sockaddr_storage *out)
{
    memset(out, 0, sizeof(*out));
    if (en_gid_is_v4mapped(g->raw)) {
        struct sockaddr_in *a = (struct sockaddr_in *)out;
        a->sin_family = AF_INET;
        memcpy(&a->sin_addr, g->raw + 12, 4);
        return sizeof(*a);
    }
    struct sockaddr_in6 *a = (struct sockaddr_in6 *)out;
    a->sin6_family = AF_INET6;
    memcpy(&a->sin6_addr, g->raw, 16);
    if (IN6_IS_ADDR_LINKLOCAL(&a->sin6_addr))
        a->sin6_scope_id = if_nametoindex(d->ibdev.name + strlen(SR_PREFIX));
    return sizeof(*a);
}

/* The device's interface is up and running, with a routable address (the
 * last one gone, only the link-local one left: down, as it was when the GID
 * was the IPv4 address alone). */
static bool port_up(const sr_dev_t *d)
{
    unsigned fl = 0;
    return if_flags(d->ibdev.name + strlen(SR_PREFIX), true, &fl) == 0 && (fl & IFF_UP) &&
           (fl & IFF_RUNNING);
}

static void async_event(sr_dev_t *d, uint32_t ev)
{
    ssize_t w = write(d->aev[1], &ev, sizeof(ev));
    (void)w; /* a full pipe: the application has a backlog of events */
}

/* A link or address message came (any interface's): tell the application
 * when this port's state changed, and when its GID table did (an address
 * added or removed; IBV_EVENT_GID_CHANGE, as rdma-core says it), after. */
static void watch_port(sr_dev_t *d)
{
    char buf[8192];
    while (recv(d->nlfd, buf, sizeof(buf), MSG_DONTWAIT) > 0) {
    }
    bool up = port_up(d);
    if (up != d->port_up) {
        d->port_up = up;
        async_event(d, up ? IBV_EVENT_PORT_ACTIVE : IBV_EVENT_PORT_ERR);
    }
    union ibv_gid g[SR_MAX_GIDS];
    int n = gid_table(d, g, SR_MAX_GIDS);
    if (n == d->ngids && !memcmp(g, d->gids, sizeof(g[0]) * (size_t)n)) return;
    memcpy(d->gids, g, sizeof(g[0]) * (size_t)n);
    d->ngids = n;
    async_event(d, IBV_EVENT_GID_CHANGE);
}

static int sr_dev_of_netdev(const char *ifname, char *out, size_t cap)
{
    if (!ifname || if_flags(ifname, false, NULL) != 0) return COH_EUNSUPPORTED;
    snprintf(out, cap, SR_PREFIX "%s", ifname);
    return 0;
}

static int sr_netdev_of_dev(const char *dev, int port, char *out, size_t cap)
{
    size_t n = strlen(SR_PREFIX);
    if (!dev || strncmp(dev, SR_PREFIX, n) != 0 || port != 1 || if_flags(dev + n, false, NULL) != 0)
        return COH_EUNSUPPORTED;
    snprintf(out, cap, "%s", dev + n);
    return 0;
}

/* ---- memory ---- */

static sr_mr_t *mr_find(sr_dev_t *d, uint32_t key, bool remote, uint64_t addr, uint64_t len)
{
    for (sr_mr_t *m = d->mrs; m; m = m->next) {
        if ((remote ? m->mr.rkey : m->mr.lkey) != key) continue;
        if (remote && !(m->access & IBV_ACCESS_REMOTE_WRITE)) return NULL;
        uint64_t lo = (uint64_t)(uintptr_t)m->mr.addr;
        if (addr < lo || len > m->mr.length || addr - lo > m->mr.length - len) return NULL;
        return m;
    }
    return NULL;
}

static struct ibv_mr *sr_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access)
{
    sr_dev_t *d = dev_of(pd->context);
    if (!addr || len == 0) {
        errno = EINVAL;
        return NULL;
    }
    sr_mr_t *m = calloc(1, sizeof(*m));
    if (!m) return NULL;
    m->access = access;
    m->mr.context = pd->context;
    m->mr.pd = pd;
    m->mr.addr = addr;
    m->mr.length = len;
    pthread_mutex_lock(&d->mu);
    m->mr.lkey = m->mr.rkey = d->next_key++;
    m->next = d->mrs;
    d->mrs = m;
    pthread_mutex_unlock(&d->mu);
    return &m->mr;
}

static int sr_dereg_mr(struct ibv_mr *mr)
{
    sr_dev_t *d = dev_of(mr->context);
    sr_mr_t *m = SR_OF(sr_mr_t, mr, mr);
    pthread_mutex_lock(&d->mu);
    for (sr_mr_t **p = &d->mrs; *p; p = &(*p)->next)
        if (*p == m) {
            *p = m->next;
            break;
        }
    pthread_mutex_unlock(&d->mu);
    free(m);
    return 0;
}

/* ---- completions ---- */

static void cq_push(sr_cq_t *c, uint64_t wr_id, enum ibv_wc_status st, enum ibv_wc_opcode op,
                    uint32_t qpn, uint32_t len, uint32_t imm, bool with_imm)
{
    if (c->n == c->cap) {
        /* The hardware raises a CQ error; the engine sizes its queue so that
         * this cannot happen, so it is a bug worth stopping on. */
        fprintf(stderr, "cohort softrdma: completion queue of %d overflowed\n", c->cap);
        abort();
    }
    struct ibv_wc *w = &c->e[(c->head + c->n) % c->cap];
    memset(w, 0, sizeof(*w));
    w->wr_id = wr_id;
    w->status = st;
    w->opcode = op;
    w->qp_num = qpn;
    w->byte_len = len;
    if (with_imm) {
        w->wc_flags = IBV_WC_WITH_IMM;
        w->imm_data = imm;
    }
    c->n++;
    if (c->armed && c->chan) {
        c->armed = false;
        struct ibv_cq *p = &c->cq;
        ssize_t r = write(c->chan->wfd, &p, sizeof(p));
        (void)r; /* a full pipe holds events enough to wake the reader */
    }
}

/* Request number bad fails with st, every other one and every receive are
 * flushed (in order), and the QP is in error (its sockets close on the
 * thread). */
static void qp_error_at(sr_qp_t *q, enum ibv_wc_status st, uint64_t bad)
{
    if (q->qp.state == IBV_QPS_ERR) return;
    q->qp.state = IBV_QPS_ERR;
    for (; q->sq_head < q->sq_tail; q->sq_head++) {
        sr_swqe_t *w = &q->sq[q->sq_head % q->sq_cap];
        cq_push(q->scq, w->wr_id, q->sq_head == bad ? st : IBV_WC_WR_FLUSH_ERR, IBV_WC_RDMA_WRITE,
                q->qp.qp_num, 0, 0, false);
    }
    q->sq_next = q->sq_tail;
    for (; q->rq_head < q->rq_tail; q->rq_head++)
        cq_push(q->rcq, q->rq[q->rq_head % q->rq_cap], IBV_WC_WR_FLUSH_ERR,
                IBV_WC_RECV_RDMA_WITH_IMM, q->qp.qp_num, 0, 0, false);
}

/* The oldest request fails with st (the rest as above). */
static void qp_error(sr_qp_t *q, enum ibv_wc_status st)
{
    qp_error_at(q, st, q->sq_head);
}

/* ---- the requester ---- */

static void tx(sr_dev_t *d, sr_qp_t *q)
{
    if (q->out_state == SR_OUT_CONNECTING) {
        int r = connect(q->out_fd, (struct sockaddr *)&q->peer, q->peer_len);
        if (r != 0 && (errno == EINPROGRESS || errno == EALREADY || errno == EINTR)) return;
        if (r != 0 && errno != EISCONN) {
            q->peer_gone = true;
            if (q->sq_head < q->sq_tail) qp_error(q, IBV_WC_RETRY_EXC_ERR);
            return;
        }
        q->out_state = SR_OUT_OPEN;
    }
    q->tx_blocked = false;
    while (q->out_state == SR_OUT_OPEN && q->qp.state == IBV_QPS_RTS) {
        struct iovec iov[3];
        int k = 0;
        if (q->hello_off < SR_HELLO_SIZE)
            iov[k++] = (struct iovec){q->hello + q->hello_off, SR_HELLO_SIZE - q->hello_off};
        sr_swqe_t *w = NULL;
        if (q->sq_next < q->sq_tail) {
            w = &q->sq[q->sq_next % q->sq_cap];
            if (q->peer_gone) {
                qp_error(q, IBV_WC_RETRY_EXC_ERR);
                return;
            }
            /* The memory is checked on every pass: it may have gone since. */
            if (w->len && !mr_find(d, w->lkey, false, w->laddr, w->len)) {
                qp_error_at(q, IBV_WC_LOC_PROT_ERR, q->sq_next);
                return;
            }
            if (!q->tx_started) {
                q->txh[0] = w->op;
                memset(q->txh + 1, 0, 3);
                en_put32(q->txh + 4, w->len);
                en_put64(q->txh + 8, w->raddr);
                en_put32(q->txh + 16, w->rkey);
                memcpy(q->txh + 20, &w->imm, 4);
                q->tx_started = true;
                q->txh_off = 0;
                q->txp_off = 0;
            }
            if (q->txh_off < SR_REQ_SIZE)
                iov[k++] = (struct iovec){q->txh + q->txh_off, SR_REQ_SIZE - q->txh_off};
            if (q->txp_off < w->len)
                iov[k++] =
                    (struct iovec){(void *)(uintptr_t)(w->laddr + q->txp_off), w->len - q->txp_off};
        }
        if (k == 0) return;
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)k};
        ssize_t n = sendmsg(q->out_fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            q->tx_blocked = true;
            return;
        }
        if (n <= 0) {
            q->peer_gone = true;
            qp_error(q, IBV_WC_RETRY_EXC_ERR);
            return;
        }
        size_t left = (size_t)n, h = SR_HELLO_SIZE - q->hello_off;
        h = h < left ? h : left;
        q->hello_off += h;
        left -= h;
        if (!w) continue;
        h = SR_REQ_SIZE - q->txh_off;
        h = h < left ? h : left;
        q->txh_off += h;
        left -= h;
        q->txp_off += left;
        if (q->txh_off < SR_REQ_SIZE || q->txp_off < w->len) {
            q->tx_blocked = true; /* the socket took part: it is full */
            return;
        }
        if (q->sq_head == q->sq_next) q->waited_ns = bs_now_ns();
        q->sq_next++;
        q->tx_started = false;
    }
}

/* The responder's ACK, RNR and NAK messages. */
static void rx_msgs(sr_dev_t *d, sr_qp_t *q)
{
    while (q->out_state == SR_OUT_OPEN && q->qp.state != IBV_QPS_ERR) {
        ssize_t n = recv(q->out_fd, q->msg + q->msg_got, SR_MSG_SIZE - q->msg_got, MSG_DONTWAIT);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (n <= 0) { /* the peer's NIC closed: its QP is in error or gone */
            q->peer_gone = true;
            if (q->sq_head < q->sq_tail) qp_error(q, IBV_WC_RETRY_EXC_ERR);
            return;
        }
        q->msg_got += (size_t)n;
        if (q->msg_got < SR_MSG_SIZE) continue;
        q->msg_got = 0;
        uint8_t kind = q->msg[0];
        uint32_t count = en_get32(q->msg + 4);
        if (kind == SR_MSG_RNR) {
            q->rnr = true;
            continue;
        }
        while ((uint32_t)q->sq_head != count && q->sq_head < q->sq_next) {
            sr_swqe_t *w = &q->sq[q->sq_head % q->sq_cap];
            cq_push(q->scq, w->wr_id, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, q->qp.qp_num, w->len, 0,
                    false);
            q->sq_head++;
            q->waited_ns = bs_now_ns();
            q->rnr = false;
        }
        if (kind == SR_MSG_NAK) {
            d->st.access_errors++;
            qp_error(q, IBV_WC_REM_ACCESS_ERR);
            return;
        }
    }
}

static void retry_check(sr_dev_t *d, sr_qp_t *q, uint64_t now)
{
    if (q->qp.state != IBV_QPS_RTS || q->sq_head == q->sq_tail || q->rnr) return;
    if (q->sq_head == q->sq_next && q->out_state == SR_OUT_OPEN && !q->tx_blocked) return;
    if (q->waited_ns == 0) q->waited_ns = now;
    if (now <= q->waited_ns || now - q->waited_ns < q->retry_ns)
        return; /* set after now was read */
    d->st.retry_timeouts++;
    qp_error(q, IBV_WC_RETRY_EXC_ERR);
}

/* ---- the responder ---- */

static void msg_queue(sr_qp_t *q, uint8_t kind, uint32_t count)
{
    memset(q->out_msg, 0, SR_MSG_SIZE);
    q->out_msg[0] = kind;
    en_put32(q->out_msg + 4, count);
    q->out_msg_off = 0;
    q->out_msg_len = SR_MSG_SIZE;
}

/* Send what the requester is owed: a message half sent first, then the
 * latest ACK (cumulative: one says it all), then an RNR notice. */
static void msg_flush(sr_qp_t *q)
{
    while (q->in_fd >= 0) {
        if (q->out_msg_off == q->out_msg_len) {
            if (q->acked != q->in_done) { /* before an RNR: an ACK's progress clears it */
                q->acked = q->in_done;
                msg_queue(q, SR_MSG_ACK, q->in_done);
            } else if (q->want_rnr) {
                q->want_rnr = false;
                msg_queue(q, SR_MSG_RNR, q->in_done);
            } else {
                return;
            }
        }
        ssize_t n = send(q->in_fd, q->out_msg + q->out_msg_off, q->out_msg_len - q->out_msg_off,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (n <= 0) {
            close_fd(&q->in_fd); /* the requester went; it fails its own requests */
            return;
        }
        q->out_msg_off += (size_t)n;
    }
}

/* A request this QP may not take: the requester fails it, and both QPs
 * are in error (RC's remote access error). */
static void rx_refuse(sr_dev_t *d, sr_qp_t *q)
{
    d->st.access_errors++;
    msg_queue(q, SR_MSG_NAK, q->in_done);
    (void)send(q->in_fd, q->out_msg, SR_MSG_SIZE, MSG_NOSIGNAL | MSG_DONTWAIT);
    qp_error(q, IBV_WC_WR_FLUSH_ERR);
}

static void rx(sr_dev_t *d, sr_qp_t *q)
{
    while (q->in_fd >= 0 && !q->rx_rnr &&
           (q->qp.state == IBV_QPS_RTR || q->qp.state == IBV_QPS_RTS)) {
        if (!q->rx_hdr) {
            ssize_t n = recv(q->in_fd, q->rxh + q->rxh_got, SR_REQ_SIZE - q->rxh_got, MSG_DONTWAIT);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
            if (n <= 0) {
                close_fd(&q->in_fd);
                return;
            }
            q->rxh_got += (size_t)n;
            if (q->rxh_got < SR_REQ_SIZE) continue;
            q->rx_op = q->rxh[0];
            q->rx_len = en_get32(q->rxh + 4);
            q->rx_addr = en_get64(q->rxh + 8);
            q->rx_rkey = en_get32(q->rxh + 16);
            memcpy(&q->rx_imm, q->rxh + 20, 4);
            q->rx_got = 0;
            q->rx_hdr = true;
            if ((q->rx_op != SR_OP_WRITE && q->rx_op != SR_OP_WRITE_IMM) ||
                (q->rx_len && !mr_find(d, q->rx_rkey, true, q->rx_addr, q->rx_len))) {
                rx_refuse(d, q);
                return;
            }
        }
        if (q->rx_got < q->rx_len) {
            if (!mr_find(d, q->rx_rkey, true, q->rx_addr, q->rx_len)) { /* deregistered since */
                rx_refuse(d, q);
                return;
            }
            ssize_t n = recv(q->in_fd, (void *)(uintptr_t)(q->rx_addr + q->rx_got),
                             q->rx_len - q->rx_got, MSG_DONTWAIT);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
            if (n <= 0) {
                close_fd(&q->in_fd);
                return;
            }
            q->rx_got += (uint64_t)n;
            continue;
        }
        if (q->rx_op == SR_OP_WRITE_IMM) {
            if (q->rq_head == q->rq_tail) { /* RNR: until a receive is posted */
                q->rx_rnr = true;
                q->want_rnr = true;
                d->st.rnr_waits++;
                return;
            }
            uint64_t id = q->rq[q->rq_head++ % q->rq_cap];
            cq_push(q->rcq, id, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM, q->qp.qp_num, q->rx_len,
                    q->rx_imm, true);
        }
        d->st.requests_in++;
        q->in_done++;
        q->rx_hdr = false;
        q->rxh_got = 0;
    }
}

/* ---- the NIC thread ---- */

static void accept_new(sr_dev_t *d)
{
    for (;;) {
        int fd = accept4(d->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        sr_pend_t *p = calloc(1, sizeof(*p));
        if (!p) {
            close(fd);
            continue;
        }
        p->fd = fd;
        p->next = d->pend;
        d->pend = p;
    }
}

/* Accepted connections: their first words name the QP they are for. */
static void pend_step(sr_dev_t *d)
{
    for (sr_pend_t **pp = &d->pend; *pp;) {
        sr_pend_t *p = *pp;
        ssize_t n = recv(p->fd, p->b + p->got, SR_HELLO_SIZE - p->got, MSG_DONTWAIT);
        if (n > 0) p->got += (size_t)n;
        bool drop = n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
        if (!drop && p->got < SR_HELLO_SIZE) {
            pp = &p->next;
            continue;
        }
        if (!drop) {
            uint32_t qpn = en_get32(p->b + 4);
            sr_qp_t *q = d->qps;
            while (q && (q->destroyed || q->qp.qp_num != qpn)) q = q->next;
            drop = en_get32(p->b) != SR_MAGIC || !q || q->in_fd >= 0 ||
                   q->qp.state == IBV_QPS_ERR || q->qp.state == IBV_QPS_RESET;
            if (!drop) {
                q->in_fd = p->fd;
                p->fd = -1;
            }
        }
        close_fd(&p->fd);
        *pp = p->next;
        free(p);
    }
}

/* A QP in error: its peer's connection is shut for writing (the peer sees
 * the end after any NAK) and read to its end, then closed. Closed with
 * bytes unread, it would be reset, and a reset drops what the peer had not
 * read yet: the NAK that tells it why. */
static void drain_in(sr_qp_t *q)
{
    if (q->in_fd < 0) return;
    if (!q->in_shut) {
        shutdown(q->in_fd, SHUT_WR);
        q->in_shut = true;
    }
    uint8_t junk[4096];
    for (;;) {
        ssize_t n = recv(q->in_fd, junk, sizeof(junk), MSG_DONTWAIT);
        if (n > 0 || (n < 0 && errno == EINTR)) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        close_fd(&q->in_fd);
        return;
    }
}

static void qp_free(sr_qp_t *q)
{
    close_fd(&q->out_fd);
    close_fd(&q->in_fd);
    free(q->sq);
    free(q->rq);
    free(q);
}

static void step(sr_dev_t *d)
{
    uint64_t now = bs_now_ns();
    for (sr_qp_t **pq = &d->qps; *pq;) {
        sr_qp_t *q = *pq;
        if (q->destroyed) {
            *pq = q->next;
            qp_free(q);
            continue;
        }
        pq = &q->next;
        if (q->qp.state == IBV_QPS_ERR) {
            close_fd(&q->out_fd);
            drain_in(q);
            continue;
        }
        rx(d, q);
        msg_flush(q);
        tx(d, q);
        rx_msgs(d, q);
        retry_check(d, q, now);
    }
    pend_step(d);
}

static void *nic_thread(void *arg)
{
    sr_dev_t *d = arg;
    struct pollfd *pf = NULL;
    size_t cap = 0;
    pthread_mutex_lock(&d->mu);
    while (!d->stop) {
        step(d);
        size_t need = 3, n = 0;
        for (sr_qp_t *q = d->qps; q; q = q->next) need += 2;
        for (sr_pend_t *p = d->pend; p; p = p->next) need++;
        if (need > cap) {
            struct pollfd *np = realloc(pf, need * sizeof(*pf));
            if (!np) break;
            pf = np;
            cap = need;
        }
        pf[n++] = (struct pollfd){.fd = d->wfd, .events = POLLIN};
        pf[n++] = (struct pollfd){.fd = d->lfd, .events = POLLIN};
        pf[n++] = (struct pollfd){.fd = d->nlfd, .events = POLLIN}; /* -1: ignored */
        bool timed = false;
        for (sr_qp_t *q = d->qps; q; q = q->next) {
            if (q->out_fd >= 0) {
                short ev = POLLIN;
                if (q->out_state == SR_OUT_CONNECTING || q->tx_blocked) ev |= POLLOUT;
                pf[n++] = (struct pollfd){.fd = q->out_fd, .events = ev};
            }
            if (q->in_fd >= 0) {
                short ev = q->rx_rnr && q->qp.state != IBV_QPS_ERR ? 0 : POLLIN;
                if (q->out_msg_off < q->out_msg_len) ev |= POLLOUT;
                pf[n++] = (struct pollfd){.fd = q->in_fd, .events = ev};
            }
            if (q->sq_head < q->sq_tail && q->qp.state == IBV_QPS_RTS) timed = true;
        }
        for (sr_pend_t *p = d->pend; p; p = p->next)
            pf[n++] = (struct pollfd){.fd = p->fd, .events = POLLIN};
        pthread_mutex_unlock(&d->mu);
        int r = poll(pf, (nfds_t)n, timed ? SR_POLL_MS : -1);
        pthread_mutex_lock(&d->mu);
        if (r > 0 && (pf[0].revents & POLLIN)) {
            uint64_t v;
            ssize_t k = read(d->wfd, &v, sizeof(v));
            (void)k;
        }
        if (r > 0 && (pf[1].revents & POLLIN)) accept_new(d);
        if (r > 0 && (pf[2].revents & POLLIN)) watch_port(d);
    }
    pthread_mutex_unlock(&d->mu);
    free(pf);
    return NULL;
}

/* ---- the device ---- */

static struct ibv_context *sr_open_device(const char *name)
{
    size_t pl = strlen(SR_PREFIX);
    if (!name || strncmp(name, SR_PREFIX, pl) != 0 || if_flags(name + pl, false, NULL) != 0) {
        errno = ENODEV;
        return NULL;
    }
    sr_dev_t *d = calloc(1, sizeof(*d));
    if (!d) return NULL;
    snprintf(d->ibdev.name, sizeof(d->ibdev.name), "%s", name);
    d->ibdev.node_type = IBV_NODE_RNIC;
    d->ibdev.transport_type = IBV_TRANSPORT_IWARP;
    d->ctx.device = &d->ibdev;
    d->ctx.async_fd = -1;
    d->ctx.cmd_fd = -1;
    d->lfd = d->wfd = d->nlfd = d->aev[0] = d->aev[1] = -1;
    pthread_mutex_init(&d->mu, NULL);
    uint32_t r = 0;
    if (getrandom(&r, sizeof(r), 0) != sizeof(r)) r = (uint32_t)bs_now_ns();
    d->next_key = (r & 0xffff) << 8 | 1; /* keys of different runs differ */
    d->next_qpn = (r >> 16 & 0xfff) << 8 | 0x11;
    /* One port for every address of the interface, both families (IPv4
     * alone where IPv6 is off): the GID says which address a peer dials. */
    struct sockaddr_storage la;
    memset(&la, 0, sizeof(la));
    socklen_t al = sizeof(struct sockaddr_in6);
    la.ss_family = AF_INET6; /* in6addr_any */
    d->lfd = socket(AF_INET6, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int v6only = 0;
    if (d->lfd >= 0 && setsockopt(d->lfd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof(v6only)) != 0)
        close_fd(&d->lfd);
    if (d->lfd < 0) {
        la.ss_family = AF_INET; /* INADDR_ANY */
        al = sizeof(struct sockaddr_in);
        d->lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    }
    d->wfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (d->lfd < 0 || d->wfd < 0 || bind(d->lfd, (struct sockaddr *)&la, al) != 0 ||
        listen(d->lfd, 256) != 0 || getsockname(d->lfd, (struct sockaddr *)&la, &al) != 0 ||
        pipe2(d->aev, O_NONBLOCK | O_CLOEXEC) != 0)
        goto fail;
    d->port = ntohs(la.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&la)->sin6_port
                                             : ((struct sockaddr_in *)&la)->sin_port);
    d->ctx.async_fd = d->aev[0];
    /* Link changes (no netlink, as in some sandboxes: no port events, the
     * state is still read at each query). */
    d->nlfd = socket(AF_NETLINK, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, NETLINK_ROUTE);
    struct sockaddr_nl nl = {.nl_family = AF_NETLINK,
                             .nl_groups = RTMGRP_LINK | RTMGRP_IPV4_IFADDR |
                                          RTMGRP_IPV6_IFADDR}; /* an address back */
    if (d->nlfd >= 0 && bind(d->nlfd, (struct sockaddr *)&nl, sizeof(nl)) != 0) close_fd(&d->nlfd);
    d->port_up = port_up(d);
    d->ngids = gid_table(d, d->gids, SR_MAX_GIDS);
    if (pthread_create(&d->thr, NULL, nic_thread, d) != 0) goto fail;
    pthread_setname_np(d->thr, "cohort-softrdma");
    d->thr_on = true;
    return &d->ctx;
fail:;
    int e = errno;
    close_fd(&d->lfd);
    close_fd(&d->wfd);
    close_fd(&d->nlfd);
    close_fd(&d->aev[0]);
    close_fd(&d->aev[1]);
    pthread_mutex_destroy(&d->mu);
    free(d);
    errno = e;
    return NULL;
}

static int sr_close_device(struct ibv_context *c)
{
    sr_dev_t *d = dev_of(c);
    pthread_mutex_lock(&d->mu);
    d->stop = true;
    pthread_mutex_unlock(&d->mu);
    wake(d);
    if (d->thr_on) pthread_join(d->thr, NULL);
    while (d->qps) {
        sr_qp_t *q = d->qps;
        d->qps = q->next;
        qp_free(q);
    }
    while (d->pend) {
        sr_pend_t *p = d->pend;
        d->pend = p->next;
        close_fd(&p->fd);
        free(p);
    }
    while (d->mrs) { /* the application's leak; the hardware would drop them too */
        sr_mr_t *m = d->mrs;
        d->mrs = m->next;
        free(m);
    }
    close_fd(&d->lfd);
    close_fd(&d->wfd);
    close_fd(&d->nlfd);
    close_fd(&d->aev[0]);
    close_fd(&d->aev[1]);
    pthread_mutex_destroy(&d->mu);
    free(d);
    return 0;
}

static int sr_query_device(struct ibv_context *c, struct ibv_device_attr *a)
{
    (void)c;
    memset(a, 0, sizeof(*a));
    snprintf(a->fw_ver, sizeof(a->fw_ver), "cohort-soft");
    a->max_mr_size = UINT64_MAX;
    a->max_qp = 1 << 16;
    a->max_qp_wr = SR_MAX_WR;
    a->max_sge = 1;
    a->max_cq = 1 << 16;
    a->max_cqe = 1 << 22;
    a->max_mr = 1 << 20;
    a->max_pd = 1 << 16;
    a->phys_port_cnt = 1;
    return 0;
}

static int sr_query_port(struct ibv_context *c, uint8_t port, struct ibv_port_attr *a)
{
    sr_dev_t *d = dev_of(c);
    if (port != 1) return EINVAL;
    memset(a, 0, sizeof(*a));
    /* The port follows its interface, as rxe's does: down (or not
     * running) is IBV_PORT_DOWN. The engine's failover reads it. */
    bool up = port_up(d);
    a->state = up ? IBV_PORT_ACTIVE : IBV_PORT_DOWN;
    a->max_mtu = a->active_mtu = IBV_MTU_4096;
    a->gid_tbl_len = SR_MAX_GIDS;
    a->lid = d->port;
    a->link_layer = IBV_LINK_LAYER_ETHERNET;
    a->active_width = 1;
    a->active_speed = 1;
    a->phys_state = up ? 5 : 3; /* LinkUp, Disabled */
    return 0;
}

static int sr_query_gid(struct ibv_context *c, uint8_t port, int index, union ibv_gid *gid)
{
    sr_dev_t *d = dev_of(c);
    if (port != 1 || index < 0 || index >= SR_MAX_GIDS) return EINVAL;
    union ibv_gid t[SR_MAX_GIDS];
    int n = gid_table(d, t, SR_MAX_GIDS);
    if (index < n)
        *gid = t[index];
    else
        memset(gid, 0, sizeof(*gid)); /* an empty entry, as a NIC's */
    return 0;
}

static int sr_query_gid_ex(struct ibv_context *c, uint32_t port, uint32_t index,
                           struct ibv_gid_entry *e)
{
    memset(e, 0, sizeof(*e));
    static const uint8_t zero[16];
    if (index >= SR_MAX_GIDS || sr_query_gid(c, (uint8_t)port, (int)index, &e->gid) != 0 ||
        !memcmp(e->gid.raw, zero, 16))
        return ENODATA;
    sr_dev_t *d = dev_of(c);
    e->gid_index = index;
    e->port_num = port;
    e->gid_type = IBV_GID_TYPE_ROCE_V2; /* an address over IP */
    e->ndev_ifindex = if_nametoindex(d->ibdev.name + strlen(SR_PREFIX));
    return 0;
}

static struct ibv_pd *sr_alloc_pd(struct ibv_context *c)
{
    struct ibv_pd *pd = calloc(1, sizeof(*pd));
    if (pd) pd->context = c;
    return pd;
}

static int sr_dealloc_pd(struct ibv_pd *pd)
{
    free(pd);
    return 0;
}

static struct ibv_comp_channel *sr_create_comp_channel(struct ibv_context *c)
{
    sr_chan_t *ch = calloc(1, sizeof(*ch));
    int p[2];
    if (!ch) return NULL;
    if (pipe2(p, O_CLOEXEC) != 0) {
        free(ch);
        return NULL;
    }
    fcntl(p[1], F_SETFL, fcntl(p[1], F_GETFL) | O_NONBLOCK);
    ch->ch.context = c;
    ch->ch.fd = p[0];
    ch->wfd = p[1];
    return &ch->ch;
}

static int sr_destroy_comp_channel(struct ibv_comp_channel *c)
{
    sr_chan_t *ch = SR_OF(sr_chan_t, ch, c);
    close(ch->ch.fd);
    close(ch->wfd);
    free(ch);
    return 0;
}

static struct ibv_cq *sr_create_cq(struct ibv_context *c, int cqe, void *cq_ctx,
                                   struct ibv_comp_channel *chan, int vector)
{
    (void)vector;
    if (cqe < 1) {
        errno = EINVAL;
        return NULL;
    }
    sr_cq_t *q = calloc(1, sizeof(*q));
    if (!q || !(q->e = calloc((size_t)cqe, sizeof(*q->e)))) {
        free(q);
        errno = ENOMEM;
        return NULL;
    }
    q->cap = cqe;
    q->chan = chan ? SR_OF(sr_chan_t, ch, chan) : NULL;
    q->cq.context = c;
    q->cq.channel = chan;
    q->cq.cq_context = cq_ctx;
    q->cq.cqe = cqe;
    return &q->cq;
}

static int sr_destroy_cq(struct ibv_cq *cq)
{
    sr_dev_t *d = dev_of(cq->context);
    sr_cq_t *q = cq_of(cq);
    pthread_mutex_lock(&d->mu);
    for (sr_qp_t *p = d->qps; p; p = p->next)
        if (!p->destroyed && (p->scq == q || p->rcq == q)) {
            pthread_mutex_unlock(&d->mu);
            return EBUSY;
        }
    pthread_mutex_unlock(&d->mu);
    free(q->e);
    free(q);
    return 0;
}

static int sr_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
    (void)solicited_only;
    sr_dev_t *d = dev_of(cq->context);
    pthread_mutex_lock(&d->mu);
    cq_of(cq)->armed = true;
    pthread_mutex_unlock(&d->mu);
    return 0;
}

static int sr_get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq, void **cq_ctx)
{
    struct ibv_cq *p;
    ssize_t n = read(ch->fd, &p, sizeof(p));
    if (n != (ssize_t)sizeof(p)) return -1; /* errno: EAGAIN when non-blocking */
    *cq = p;
    *cq_ctx = p->cq_context;
    return 0;
}

static void sr_ack_cq_events(struct ibv_cq *cq, unsigned int n)
{
    (void)cq;
    (void)n;
}

/* The port's events only (PORT_ACTIVE, PORT_ERR on port 1). */
static int sr_get_async_event(struct ibv_context *c, struct ibv_async_event *ev)
{
    uint32_t t;
    ssize_t n = read(c->async_fd, &t, sizeof(t));
    if (n != (ssize_t)sizeof(t)) return -1; /* errno: EAGAIN when non-blocking */
    memset(ev, 0, sizeof(*ev));
    ev->event_type = (enum ibv_event_type)t;
    ev->element.port_num = 1;
    return 0;
}

static void sr_ack_async_event(struct ibv_async_event *ev)
{
    (void)ev;
}

static int sr_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
    sr_dev_t *d = dev_of(cq->context);
    sr_cq_t *q = cq_of(cq);
    int k = 0;
    pthread_mutex_lock(&d->mu);
    for (; k < n && q->n > 0; k++) {
        wc[k] = q->e[q->head];
        q->head = (q->head + 1) % q->cap;
        q->n--;
    }
    pthread_mutex_unlock(&d->mu);
    return k;
}

static struct ibv_qp *sr_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *a)
{
    sr_dev_t *d = dev_of(pd->context);
    if (a->qp_type != IBV_QPT_RC || !a->send_cq || !a->recv_cq || a->srq ||
        a->cap.max_send_wr == 0 || a->cap.max_send_wr > SR_MAX_WR ||
        a->cap.max_recv_wr > SR_MAX_WR || a->cap.max_send_sge > 1 || a->cap.max_recv_sge > 1 ||
        a->cap.max_inline_data > 0 || !a->sq_sig_all) {
        errno = EINVAL; /* what this provider models (above) */
        return NULL;
    }
    sr_qp_t *q = calloc(1, sizeof(*q));
    if (!q) return NULL;
    q->sq_cap = a->cap.max_send_wr;
    q->rq_cap = a->cap.max_recv_wr ? a->cap.max_recv_wr : 1;
    q->sq = calloc(q->sq_cap, sizeof(*q->sq));
    q->rq = calloc(q->rq_cap, sizeof(*q->rq));
    if (!q->sq || !q->rq) {
        free(q->sq);
        free(q->rq);
        free(q);
        errno = ENOMEM;
        return NULL;
    }
    q->dev = d;
    q->scq = cq_of(a->send_cq);
    q->rcq = cq_of(a->recv_cq);
    q->out_fd = q->in_fd = -1;
    q->qp.context = pd->context;
    q->qp.qp_context = a->qp_context;
    q->qp.pd = pd;
    q->qp.send_cq = a->send_cq;
    q->qp.recv_cq = a->recv_cq;
    q->qp.qp_type = IBV_QPT_RC;
    q->qp.state = IBV_QPS_RESET;
    pthread_mutex_lock(&d->mu);
    q->qp.qp_num = d->next_qpn++ & 0xffffff;
    q->next = d->qps;
    d->qps = q;
    pthread_mutex_unlock(&d->mu);
    return &q->qp;
}

static int to_rts(sr_qp_t *q, const struct ibv_qp_attr *a, int mask)
{
    if (q->qp.state != IBV_QPS_RTR) return EINVAL;
    unsigned t = (mask & IBV_QP_TIMEOUT) ? a->timeout : 14;
    unsigned rc = (mask & IBV_QP_RETRY_CNT) ? a->retry_cnt : 7;
    q->retry_ns = t == 0 || t > 31 ? UINT64_MAX / 2 : (4096ull << t) * (rc + 1);
    if (q->retry_ns < SR_MIN_RETRY_NS) q->retry_ns = SR_MIN_RETRY_NS;
    /* Leave from the source GID's address, as the NIC would: it must be
     * of the destination's family (RoCE v2 does not translate). */
    union ibv_gid gids[SR_MAX_GIDS];
    int n = gid_table(q->dev, gids, SR_MAX_GIDS);
    if (q->sgid >= n) return EINVAL;
    struct sockaddr_storage me;
    socklen_t ml = gid_sockaddr(q->dev, &gids[q->sgid], &me);
    if (me.ss_family != q->peer.ss_family) return EINVAL;
    q->out_fd = socket(me.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (q->out_fd < 0) return errno;
    int one = 1;
    setsockopt(q->out_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (bind(q->out_fd, (struct sockaddr *)&me, ml) != 0) {
        int e = errno;
        close_fd(&q->out_fd);
        return e;
    }
    int r = connect(q->out_fd, (struct sockaddr *)&q->peer, q->peer_len);
    if (r != 0 && errno != EINPROGRESS) q->peer_gone = true; /* fails its first request */
    q->out_state = SR_OUT_CONNECTING;
    en_put32(q->hello, SR_MAGIC);
    en_put32(q->hello + 4, q->dest_qpn);
    en_put32(q->hello + 8, q->qp.qp_num);
    q->hello_off = 0;
    q->qp.state = IBV_QPS_RTS;
    return 0;
}

static int sr_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask)
{
    sr_qp_t *q = qp_of(qp);
    sr_dev_t *d = q->dev;
    if (!(mask & IBV_QP_STATE)) return EINVAL;
    int e = 0;
    pthread_mutex_lock(&d->mu);
    switch (a->qp_state) {
    case IBV_QPS_INIT:
        if (q->qp.state != IBV_QPS_RESET && q->qp.state != IBV_QPS_INIT) e = EINVAL;
        if (!e && (mask & IBV_QP_PORT) && a->port_num != 1) e = EINVAL;
        if (!e) q->qp.state = IBV_QPS_INIT;
        break;
    case IBV_QPS_RTR: {
        const struct ibv_ah_attr *ah = &a->ah_attr;
        static const uint8_t zero[16];
        if (q->qp.state != IBV_QPS_INIT ||
            (mask & (IBV_QP_AV | IBV_QP_DEST_QPN)) != (IBV_QP_AV | IBV_QP_DEST_QPN) ||
            !ah->is_global || !memcmp(ah->grh.dgid.raw, zero, 16) || ah->dlid == 0 ||
            ah->grh.sgid_index >= SR_MAX_GIDS) {
            e = EINVAL;
            break;
        }
        q->peer_len = gid_sockaddr(d, &ah->grh.dgid, &q->peer);
        if (q->peer.ss_family == AF_INET)
            ((struct sockaddr_in *)&q->peer)->sin_port = htons(ah->dlid);
        else
            ((struct sockaddr_in6 *)&q->peer)->sin6_port = htons(ah->dlid);
        q->sgid = ah->grh.sgid_index;
        q->dest_qpn = a->dest_qp_num;
        q->qp.state = IBV_QPS_RTR;
        break;
    }
    case IBV_QPS_RTS: e = to_rts(q, a, mask); break;
    case IBV_QPS_ERR: qp_error(q, IBV_WC_WR_FLUSH_ERR); break;
    default: e = EINVAL;
    }
    pthread_mutex_unlock(&d->mu);
    wake(d);
    return e;
}

static int sr_destroy_qp(struct ibv_qp *qp)
{
    sr_qp_t *q = qp_of(qp);
    sr_dev_t *d = q->dev;
    pthread_mutex_lock(&d->mu);
    q->destroyed = true; /* the thread frees it: it may be polling its sockets */
    pthread_mutex_unlock(&d->mu);
    wake(d);
    return 0;
}

static int sr_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
    sr_qp_t *q = qp_of(qp);
    sr_dev_t *d = q->dev;
    int e = 0;
    pthread_mutex_lock(&d->mu);
    for (; wr; wr = wr->next) {
        if (q->qp.state != IBV_QPS_RTS && q->qp.state != IBV_QPS_ERR) e = EINVAL;
        if (wr->opcode != IBV_WR_RDMA_WRITE && wr->opcode != IBV_WR_RDMA_WRITE_WITH_IMM) e = EINVAL;
        if (wr->num_sge > 1 || (wr->num_sge == 1 && !wr->sg_list)) e = EINVAL;
        if (!e && q->sq_tail - q->sq_head >= q->sq_cap) e = ENOMEM;
        if (e) break;
        sr_swqe_t *w = &q->sq[q->sq_tail % q->sq_cap];
        *w = (sr_swqe_t){.wr_id = wr->wr_id,
                         .raddr = wr->wr.rdma.remote_addr,
                         .rkey = wr->wr.rdma.rkey,
                         .imm = wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM ? wr->imm_data : 0,
                         .op = wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM ? SR_OP_WRITE_IMM
                                                                        : SR_OP_WRITE};
        if (wr->num_sge == 1) {
            w->laddr = wr->sg_list[0].addr;
            w->len = wr->sg_list[0].length;
            w->lkey = wr->sg_list[0].lkey;
        }
        if (q->qp.state == IBV_QPS_ERR) {
            cq_push(q->scq, w->wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RDMA_WRITE, q->qp.qp_num, 0, 0,
                    false);
            continue;
        }
        if (q->sq_head == q->sq_tail) q->waited_ns = bs_now_ns();
        q->sq_tail++;
    }
    pthread_mutex_unlock(&d->mu);
    if (e) *bad = wr;
    wake(d);
    return e;
}

static int sr_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
    sr_qp_t *q = qp_of(qp);
    sr_dev_t *d = q->dev;
    int e = 0;
    bool was_rnr = false;
    pthread_mutex_lock(&d->mu);
    for (; wr; wr = wr->next) {
        if (q->qp.state == IBV_QPS_RESET) e = EINVAL;
        if (wr->num_sge > 1) e = EINVAL;
        if (!e && q->rq_tail - q->rq_head >= q->rq_cap) e = ENOMEM;
        if (e) break;
        if (q->qp.state == IBV_QPS_ERR) {
            cq_push(q->rcq, wr->wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV_RDMA_WITH_IMM, q->qp.qp_num,
                    0, 0, false);
            continue;
        }
        q->rq[q->rq_tail++ % q->rq_cap] = wr->wr_id;
        if (q->rx_rnr) {
            q->rx_rnr = false;
            was_rnr = true;
        }
    }
    pthread_mutex_unlock(&d->mu);
    if (e) *bad = wr;
    if (was_rnr) wake(d);
    return e;
}

void en_soft_stats(struct ibv_context *ctx, en_soft_stats_t *out)
{
    sr_dev_t *d = dev_of(ctx);
    pthread_mutex_lock(&d->mu);
    *out = d->st;
    pthread_mutex_unlock(&d->mu);
}

const en_ibv_t en_ibv_soft = {
    .name = "soft",
    .dev_of_netdev = sr_dev_of_netdev,
    .netdev_of_dev = sr_netdev_of_dev,
    .open_device = sr_open_device,
    .close_device = sr_close_device,
    .query_device = sr_query_device,
    .query_port = sr_query_port,
    .query_gid = sr_query_gid,
    .query_gid_ex = sr_query_gid_ex,
    .alloc_pd = sr_alloc_pd,
    .dealloc_pd = sr_dealloc_pd,
    .reg_mr = sr_reg_mr,
    .dereg_mr = sr_dereg_mr,
    .create_comp_channel = sr_create_comp_channel,
    .destroy_comp_channel = sr_destroy_comp_channel,
    .create_cq = sr_create_cq,
    .destroy_cq = sr_destroy_cq,
    .req_notify_cq = sr_req_notify_cq,
    .get_cq_event = sr_get_cq_event,
    .ack_cq_events = sr_ack_cq_events,
    .get_async_event = sr_get_async_event,
    .ack_async_event = sr_ack_async_event,
    .poll_cq = sr_poll_cq,
    .create_qp = sr_create_qp,
    .modify_qp = sr_modify_qp,
    .destroy_qp = sr_destroy_qp,
    .post_send = sr_post_send,
    .post_recv = sr_post_recv,
};
