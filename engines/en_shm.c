/*
 * Shared-memory transport: the links of a rail to peers on the same host
 * (issue 12, docs/shm.md).
 *
 * A link is two rings in shared memory, one per direction. Each is a memfd
 * its writer creates and hands to the reader over a UNIX socket (SCM_RIGHTS)
 * with the socket's HELLO, so nothing but the two processes can map it and
 * nothing of it outlives them: there is no name in /dev/shm to leak. The
 * socket is reached in a directory only this user can enter
 * (COHORT_SHM_DIR/cohort-<uid>-<hash of the job token>, mode 0700), and the
 * HELLO carries the job token as on TCP.
 *
 * The UNIX socket stays open beside the rings:
 *   - as the doorbell: the rings are looked at after every pass of the
 *     rail's loop (en_shm_poll, the reactor's poll hook), by the loop thread
 *     or a waiter driving it; only when the loop thread is about to block
 *     does it set a flag in each ring (en_shm_arm), and a writer that finds
 *     the flag set after publishing sends one byte (the same, the other
 *     way, for a writer waiting for room). So the loop sleeps in epoll like
 *     on TCP and no thread spins, while a loop that is awake pays no system
 *     call per frame;
 *   - as the liveness check: a peer that dies closes it (its ops fail, no
 *     hang).
 *
 * Frames go into a ring as on a TCP stream (header + payload), each padded
 * to 8 bytes, so that payloads stay aligned for the reduce kernels. The
 * reader decodes the header, matches it (en_exec_match) and copies or
 * reduces the payload straight out of the ring into its destination: one
 * copy in, one copy out, the reduction reading shared memory.
 *
 * A send completes once its frame is in the ring (the caller's buffer is
 * free then), from the poll hook that follows: never inside tr_send.
 *
 * Single copy (COHORT_SHM_CMA_BYTES): a data frame at least that large goes
 * into the ring as its header and a descriptor (the payload's address in the
 * sender), and the receiver reads the payload straight from the sender's
 * memory with process_vm_readv: into its destination for a copy, through a
 * small buffer for a reduction. It then counts the frame in its ring's
 * cma_done, and the sender's send completes (in order: descriptors are read
 * in order). Each reader first proves it can read the writer's memory (a
 * nonce at an address the writer publishes) and only then lets the writer
 * send descriptors (cma_ok); where the kernel refuses (another user, a
 * ptrace policy, a seccomp filter), frames keep going through the ring.
 *
 * Threading: every function here runs on the rail's loop thread.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/random.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include "base/bs_alloc.h"
#include "engines/en_link.h"

#define SHM_MAGIC        0x474e495248534f43ull /* "COSHRING" */
#define SHM_RING_HDR     256                   /* the indices, then the data */
#define SHM_PUBLISH      (64 * 1024)           /* a long payload is published in pieces */
#define SHM_HANDSHAKE_MS 10000
#define SHM_HDR_CMA      0x80       /* in the header's flags byte: a descriptor follows */
#define SHM_CMA_DESC     24         /* u64 address, u64 length, u64 reserved */
#define SHM_CMA_PIECE    (1u << 20) /* read at most this much at once into a destination */
/* A reduction reads through this buffer. It stays in a core's L2; each read
 * pins the peer's pages anew, so fewer, larger reads cost less: 4 ranks on
 * one core, 1 MiB allreduce, 1130 -> 1080 us going from 64 KiB to 256 KiB. */
#define SHM_CMA_BOUNCE (256u * 1024)

/* At the start of a ring's mapping. head and tail count bytes since the
 * start (never wrap); the data index is (count & (size - 1)). */
typedef struct shm_ring {
    _Atomic uint64_t head; /* the reader consumed */
    char pad0[56];
    _Atomic uint64_t tail; /* the writer published (a multiple of 8) */
    char pad1[56];
    _Atomic uint32_t rsleep; /* the reader waits for a doorbell */
    _Atomic uint32_t wsleep; /* the writer waits for room */
    uint64_t size;           /* data bytes: a power of two */
    uint64_t magic;
    /* Single copy. The writer's: its pid, and where in its memory cma_nonce
     * is; cma_revoked once it gave unread payloads back to their owners (a
     * link closing). The reader's: cma_ok once it read the nonce there,
     * cma_done the descriptors whose payload it has read. */
    _Atomic uint64_t cma_done;
    _Atomic uint64_t cma_revoked;
    uint64_t cma_addr;
    uint64_t cma_nonce;
    int32_t cma_pid;
    _Atomic uint32_t cma_ok;
} shm_ring_t;

typedef enum shm_phase { SH_HELLO = 0, SH_LIVE, SH_CLOSED } shm_phase;

typedef struct shm_conn {
    en_conn_t base; /* first member */
    struct en_shm *tr;
    int fd;
    uv_poll_t poll;
    uv_timer_t timer; /* the handshake's deadline */
    int handles;      /* open libuv handles: freed when the last closes */
    int phase;
    int expect_peer; /* dialled: the rank that must answer */
    uint8_t hello_in[EN_HELLO_SIZE];
    size_t hello_got;
    int peer_memfd;
    shm_ring_t *tx, *rx;
    size_t tx_map, rx_map;
    /* Sending: frames in order; q_off bytes of the head's are in the ring. */
    en_wreq_t *q_head, *q_tail;
    uint64_t q_off;
    uint64_t tx_tail; /* our tail (published or not) */
    /* Receiving */
    uint64_t rx_head; /* our head (published or not) */
    uint64_t rx_pad;  /* bytes of padding after the current payload */
    /* Single copy. Sending: frames whose descriptor is in the ring, until
     * the peer's cma_done passes them (cma_acked of them completed so far).
     * Receiving: the current frame's payload is at rx_cma_addr in the peer. */
    bool q_cma; /* the frame at q_head goes as a descriptor */
    en_wreq_t *cma_head, *cma_tail;
    uint64_t cma_acked;
    bool rx_cma;
    uint64_t rx_cma_addr;
    pid_t peer_pid;
    uint8_t *bounce;
    en_kick_t kick;               /* process and pump, not nested (en_link.h) */
    struct shm_conn *prev, *next; /* the transport's conns */
} shm_conn_t;

struct en_shm {
    en_rail_t *rail;
    int lfd;
    uv_poll_t lpoll;
    bool lpoll_open;
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    size_t ring_bytes;
    size_t cma_bytes; /* COHORT_SHM_CMA_BYTES (0: off) */
    shm_conn_t *conns;
    /* Completions (sends whose frame is in the ring), delivered by the poll
     * hook, which runs after every pass of the loop, by whichever thread
     * runs it (an op started inline, a waiter helping): the reactor does not
     * block while some are queued (en_shm_arm). */
    en_wreq_t *done_head, *done_tail;
    en_transport_ops_t ops; /* completed: what a conn's ops point to */
    char dir[128];          /* COHORT_SHM_DIR */
};
typedef struct en_shm shm_tr_t;

static void conn_close(shm_conn_t *t, int status, const char *why);
static void kick(shm_conn_t *t);

static uint64_t pad8(uint64_t n)
{
    return (8 - (n & 7)) & 7;
}

/* ---- the job's directory and a rail's socket path ---- */

int en_shm_path(const char *dir, const char *token, const char *name, int rail, char *out,
                size_t cap)
{
    uint64_t h = BS_FNV_SEED;
    for (const char *t = token ? token : ""; *t; t++) h = bs_fnv64(h, (uint8_t)*t);
    int n = snprintf(out, cap, "%s/cohort-%u-%016llx/%s.%d", dir, (unsigned)geteuid(),
                     (unsigned long long)h, name, rail);
    return n > 0 && (size_t)n < cap ? 0 : COH_EINVAL;
}

/* The directory of path (cut at the last '/'), made if missing: ours, and
 * nobody else's to enter. Another context of the job that finalizes
 * removes it with its last socket (shm_shutdown), possibly between our
 * mkdir (EEXIST) and our look at it: gone is not foreign, make it again
 * (mp.boot.reinit.n2 in CI: "not a private directory"). */
int en_shm_job_dir(const char *path)
{
    char d[sizeof(((struct sockaddr_un *)0)->sun_path)];
    snprintf(d, sizeof(d), "%s", path);
    char *slash = strrchr(d, '/');
    if (!slash) return bs_fail(COH_EINVAL, "shm: no directory in %s", path);
    *slash = 0;
    for (int attempt = 0; attempt < 100; attempt++) {
        if (mkdir(d, 0700) != 0 && errno != EEXIST)
            return bs_fail(COH_ESYS, "shm: cannot make %s: %s", d, strerror(errno));
        struct stat st;
        if (lstat(d, &st) != 0) {
            if (errno == ENOENT) continue;
            return bs_fail(COH_ESYS, "shm: %s: %s", d, strerror(errno));
        }
        if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077))
            return bs_fail(COH_ESYS, "shm: %s is not a private directory of this user", d);
        return 0;
    }
    return bs_fail(COH_ESYS, "shm: %s keeps disappearing", d);
}

/* ---- rings ---- */

static int ring_new(shm_tr_t *tr, shm_conn_t *t, int *fd_out)
{
    size_t map = SHM_RING_HDR + tr->ring_bytes;
    int fd = memfd_create("cohort-shm", MFD_CLOEXEC);
    if (fd < 0) return bs_fail(COH_ESYS, "shm: memfd_create: %s", strerror(errno));
    if (ftruncate(fd, (off_t)map) != 0) {
        close(fd);
        return bs_fail(COH_ENOMEM, "shm: %zu bytes of shared memory: %s", map, strerror(errno));
    }
    /* Populated now: the first lap of a ring otherwise takes a page fault
     * per 4 KiB on both sides (a 4 KiB op ran at 2.4x its later time). */
    void *p = mmap(NULL, map, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) {
        close(fd);
        return bs_fail(COH_ENOMEM, "shm: mmap: %s", strerror(errno));
    }
    shm_ring_t *r = p;
    r->size = tr->ring_bytes;
    r->magic = SHM_MAGIC;
    if (getrandom(&r->cma_nonce, sizeof(r->cma_nonce), GRND_NONBLOCK) != sizeof(r->cma_nonce))
        r->cma_nonce = bs_now_ns() ^ (uint64_t)(uintptr_t)p;
    r->cma_nonce |= 1; /* never 0: a read of zeroed memory proves nothing */
    r->cma_addr = (uint64_t)(uintptr_t)&r->cma_nonce;
    r->cma_pid = (int32_t)getpid();
    t->tx = r;
    t->tx_map = map;
    *fd_out = fd;
    return 0;
}

/* The peer's ring, handed over by fd: its size checked before it is used. */
static int ring_map_peer(shm_conn_t *t, int fd, char *why, size_t whylen)
{
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size < SHM_RING_HDR + 4096 ||
        (uint64_t)st.st_size > SHM_RING_HDR + (1ull << 31)) {
        snprintf(why, whylen, "a ring of a bad size");
        return COH_EPROTO;
    }
    size_t map = (size_t)st.st_size;
    /* Populated now: the first lap of a ring otherwise takes a page fault
     * per 4 KiB on both sides (a 4 KiB op ran at 2.4x its later time). */
    void *p = mmap(NULL, map, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) {
        snprintf(why, whylen, "mmap of the peer's ring: %s", strerror(errno));
        return COH_ESYS;
    }
    shm_ring_t *r = p;
    uint64_t size = r->size;
    if (r->magic != SHM_MAGIC || size < 4096 || (size & (size - 1)) || size != map - SHM_RING_HDR) {
        munmap(p, map);
        snprintf(why, whylen, "not a ring");
        return COH_EPROTO;
    }
    t->rx = r;
    t->rx_map = map;
    t->rx_head = atomic_load(&r->head);
    return 0;
}

static uint8_t *ring_data(shm_ring_t *r)
{
    return (uint8_t *)r + SHM_RING_HDR;
}

/* n bytes of the ring at stream position pos (two pieces across its end). */
static void ring_get(shm_ring_t *r, uint64_t pos, uint8_t *out, uint64_t n)
{
    uint64_t at = pos & (r->size - 1), first = r->size - at < n ? r->size - at : n;
    memcpy(out, ring_data(r) + at, first);
    if (n > first) memcpy(out + first, ring_data(r), n - first);
}

/* n bytes at addr in process pid into dst, whole or not at all. */
static bool vm_read(pid_t pid, void *dst, uint64_t addr, size_t n)
{
    struct iovec l = {.iov_base = dst, .iov_len = n};
    struct iovec rm = {.iov_base = (void *)(uintptr_t)addr, .iov_len = n};
    ssize_t k;
    do k = process_vm_readv(pid, &l, 1, &rm, 1, 0);
    while (k < 0 && errno == EINTR);
    return k == (ssize_t)n;
}

/* One byte on the socket: the peer looks at both rings again. */
static void doorbell(shm_conn_t *t)
{
    uint8_t b = 1;
    ssize_t n;
    do n = send(t->fd, &b, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    /* EAGAIN: bytes are pending already, the peer will look. A dead peer
     * shows as a hangup on the socket. */
}

/* ---- handles and the conn's life ---- */

static void handle_closed(uv_handle_t *h)
{
    shm_conn_t *t = h->data;
    if (--t->handles > 0) return;
    if (t->fd >= 0) close(t->fd);
    if (t->peer_memfd >= 0) close(t->peer_memfd);
    if (t->tx) munmap(t->tx, t->tx_map);
    if (t->rx) munmap(t->rx, t->rx_map);
    coh_free(t->bounce);
    coh_free(t);
}

static shm_conn_t *conn_new(shm_tr_t *tr, int fd)
{
    en_rail_t *rail = tr->rail;
    shm_conn_t *t = coh_zalloc(sizeof(*t));
    if (!t) return NULL;
    t->tr = tr;
    t->fd = fd;
    t->peer_memfd = -1;
    t->base.rail = rail;
    t->base.peer = -1;
    t->base.ops = &tr->ops;
    t->base.state = EN_CONN_HANDSHAKE;
    en_rail_conn_link(rail, &t->base);
    if (uv_poll_init(rail->loop, &t->poll, fd) != 0) {
        en_rail_conn_unlink(&t->base);
        coh_free(t);
        return NULL;
    }
    t->poll.data = t;
    uv_timer_init(rail->loop, &t->timer);
    t->timer.data = t;
    t->handles = 2;
    t->next = tr->conns;
    if (tr->conns) tr->conns->prev = t;
    tr->conns = t;
    return t;
}

/* The oldest frame sent as a descriptor ends with status (a closing link). */
static void cma_pop(shm_conn_t *t, int status)
{
    en_wreq_t *w = t->cma_head;
    t->cma_head = w->tx_next;
    if (!t->cma_head) t->cma_tail = NULL;
    w->tx_next = NULL;
    t->base.writes_out--;
    t->cma_acked++;
    w->done(w, status);
}

static void conn_close(shm_conn_t *t, int status, const char *why)
{
    en_conn_t *c = &t->base;
    if (t->phase == SH_CLOSED) return;
    int was = c->state;
    t->phase = SH_CLOSED;
    c->state = EN_CONN_CLOSING;
    shm_tr_t *tr = t->tr;
    if (t->prev)
        t->prev->next = t->next;
    else if (tr->conns == t)
        tr->conns = t->next;
    if (t->next) t->next->prev = t->prev;
    t->prev = t->next = NULL;
    uv_poll_stop(&t->poll);
    uv_timer_stop(&t->timer);
    en_rail_conn_unlink(c);
    /* Frames already in the ring were sent, as a write TCP took is: their
     * completions (queued) come first, so the ops they finish do not fail
     * with the link (a peer that read them and finalized closes it). */
    en_wq_done_of(c, &tr->done_head, &tr->done_tail);
    /* Descriptors: those the peer read are sent; the others' payload never
     * left this process. Those go back to their owners, who may write them
     * at once: say so first, and a peer still reading one (a link closed
     * while both live) throws away what it read (cma_payload). */
    if (t->tx && t->cma_head) atomic_fetch_add(&t->tx->cma_revoked, 1);
    uint64_t read = t->tx ? atomic_load(&t->tx->cma_done) : 0;
    /* Those the peer read are sent (an op they finish does not fail with the
     * link: a peer that read them and finalized closes it). Then the ops
     * learn why (EPEER, naming the peer) before the unread ones come back
     * cancelled: a dead peer's ops failed ECANCELED, which a relay sync does
     * not try again. */
    while (t->cma_head && t->cma_acked < read) cma_pop(t, 0);
    en_rail_conn_lost(c->rail, c, was == EN_CONN_READY ? status : (status ? status : COH_EPROTO),
                      why);
    while (t->cma_head) cma_pop(t, COH_ECANCELED);
    en_wq_fail_all(&t->base, &t->q_head, &t->q_tail, COH_ECANCELED);
    c->state = EN_CONN_CLOSED;
    uv_close((uv_handle_t *)&t->poll, handle_closed);
    uv_close((uv_handle_t *)&t->timer, handle_closed);
}

static void hs_timeout(uv_timer_t *h)
{
    shm_conn_t *t = h->data;
    atomic_fetch_add(&t->base.rail->stat_rejected, 1);
    conn_close(t, COH_ETIMEDOUT, "no shared-memory handshake in time");
}

/* ---- sending ---- */

/* Copy n bytes into the ring at our tail (two pieces across its end). */
static void ring_put(shm_conn_t *t, const uint8_t *src, uint64_t n)
{
    shm_ring_t *r = t->tx;
    uint64_t at = t->tx_tail & (r->size - 1), first = r->size - at < n ? r->size - at : n;
    if (src) {
        memcpy(ring_data(r) + at, src, first);
        if (n > first) memcpy(ring_data(r), src + first, n - first);
    } else {
        memset(ring_data(r) + at, 0, first);
        if (n > first) memset(ring_data(r), 0, n - first);
    }
    t->tx_tail += n;
}

static void publish(shm_conn_t *t)
{
    shm_ring_t *r = t->tx;
    atomic_store(&r->tail, t->tx_tail); /* seq_cst: against the reader's rsleep */
    if (atomic_load(&r->rsleep) && atomic_exchange(&r->rsleep, 0)) doorbell(t);
}

/* The frame at the head of the queue is written (bytes of it counted). */
static en_wreq_t *q_sent(shm_conn_t *t, uint64_t bytes)
{
    en_conn_t *c = &t->base;
    en_wreq_t *w = t->q_head;
    t->q_head = w->tx_next;
    if (!t->q_head) t->q_tail = NULL;
    c->bytes_out += bytes;
    atomic_fetch_add_explicit(&c->rail->stat_bytes_out, bytes, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->rail->stat_shm_out, bytes, memory_order_relaxed);
    return w;
}

/* Does frame w go as a descriptor (single copy)? */
static bool by_cma(const shm_conn_t *t, const en_wreq_t *w)
{
    return t->tr->cma_bytes && w->len >= t->tr->cma_bytes && w->payload &&
           w->hdr[4] == EN_FRAME_DATA && atomic_load_explicit(&t->tx->cma_ok, memory_order_acquire);
}

/* Room the frame at the head of the queue needs before pump_tx writes any
 * of it: its header (and descriptor) at once, then whole words. */
static uint64_t q_need(const shm_conn_t *t)
{
    if (t->q_off) return 8;
    return EN_HDR_SIZE + (by_cma(t, t->q_head) ? SHM_CMA_DESC : 0);
}

/* Write what fits of the queued frames. A frame is header + payload +
 * padding to 8; payloads are published in pieces of whole 8-byte words. */
static void pump_tx(shm_conn_t *t)
{
    shm_ring_t *r = t->tx;
    while (t->q_head && t->phase == SH_LIVE) {
        en_wreq_t *w = t->q_head;
        if (t->q_off == 0) t->q_cma = by_cma(t, w);
        uint64_t total = EN_HDR_SIZE + (t->q_cma ? SHM_CMA_DESC : w->len),
                 padded = total + pad8(total);
        uint64_t first = q_need(t);
        uint64_t room =
            r->size - (t->tx_tail - atomic_load_explicit(&r->head, memory_order_acquire));
        if (room < 8 || (t->q_off == 0 && room < first)) {
            /* Full: the reader rings when it makes room. */
            atomic_store(&r->wsleep, 1);
            room = r->size - (t->tx_tail - atomic_load(&r->head));
            if (room < 8 || (t->q_off == 0 && room < first)) break;
            atomic_store(&r->wsleep, 0);
        }
        if (t->q_cma) {
            uint8_t b[EN_HDR_SIZE + SHM_CMA_DESC] = {0};
            memcpy(b, w->hdr, EN_HDR_SIZE);
            b[5] |= SHM_HDR_CMA;
            en_put64(b + EN_HDR_SIZE, (uint64_t)(uintptr_t)w->payload);
            en_put64(b + EN_HDR_SIZE + 8, w->len);
            ring_put(t, b, sizeof(b));
            publish(t);
            /* The payload stays the caller's until the peer has read it. */
            en_wq_push(&t->cma_head, &t->cma_tail, q_sent(t, EN_HDR_SIZE + w->len));
            continue;
        }
        if (t->q_off == 0) {
            ring_put(t, w->hdr, EN_HDR_SIZE);
            t->q_off = EN_HDR_SIZE;
            room -= EN_HDR_SIZE;
        }
        uint64_t left = padded - t->q_off;
        uint64_t n = left < room ? left : room;
        if (n > SHM_PUBLISH) n = SHM_PUBLISH;
        if (n < left) n &= ~7ull; /* whole words until the end */
        uint64_t pay_at = t->q_off - EN_HDR_SIZE, pay_n = 0;
        if (pay_at < w->len) {
            pay_n = w->len - pay_at < n ? w->len - pay_at : n;
            ring_put(t, w->payload + pay_at, pay_n);
        }
        if (n > pay_n) ring_put(t, NULL, n - pay_n); /* the padding */
        t->q_off += n;
        publish(t);
        if (t->q_off < padded) continue;
        /* In the ring: the caller's buffer is free. */
        t->q_off = 0;
        en_wq_push(&t->tr->done_head, &t->tr->done_tail, q_sent(t, total));
    }
}

/* Sends whose payload the peer has read (its cma_done): completed. */
static bool cma_reap(shm_conn_t *t)
{
    if (!t->cma_head) return false;
    uint64_t read = atomic_load_explicit(&t->tx->cma_done, memory_order_acquire);
    bool any = false;
    while (t->cma_head && t->cma_acked < read) {
        en_wreq_t *w = t->cma_head;
        t->cma_head = w->tx_next;
        if (!t->cma_head) t->cma_tail = NULL;
        t->cma_acked++;
        en_wq_push(&t->tr->done_head, &t->tr->done_tail, w);
        any = true;
    }
    return any;
}

static bool done_run(shm_tr_t *tr)
{
    return en_wq_run_done(&tr->done_head, &tr->done_tail);
}

static int shm_send(en_conn_t *c, en_wreq_t *w)
{
    shm_conn_t *t = (shm_conn_t *)c;
    if (c->state != EN_CONN_READY) return COH_EPEER;
    w->conn = c;
    en_wq_push(&t->q_head, &t->q_tail, w);
    c->writes_out++;
    if (t->q_head == w) pump_tx(t);
    return 0;
}

/* ---- receiving ---- */

static void rx_publish(shm_conn_t *t)
{
    shm_ring_t *r = t->rx;
    atomic_store(&r->head, t->rx_head);
    if (atomic_load(&r->wsleep) && atomic_exchange(&r->wsleep, 0)) doorbell(t);
}

static bool match(shm_conn_t *t)
{
    en_conn_t *c = &t->base;
    int m = en_conn_match(c);
    if (c->state != EN_CONN_READY) return false;
    if (m < 0) conn_close(t, m, "frame refused");
    return m == EN_MATCH_OK;
}

/* n bytes of the current single-copy payload, from offset off, into dst. */
static bool cma_read(shm_conn_t *t, void *dst, uint64_t off, size_t n)
{
    return vm_read(t->peer_pid, dst, t->rx_cma_addr + off, n);
}

/* The payload of a descriptor frame, read from the peer's memory: straight
 * into a copy's destination, through the bounce buffer for a reduction.
 * False when the conn closed. */
static bool cma_payload(shm_conn_t *t)
{
    en_conn_t *c = &t->base;
    en_sink_t *s = &c->sink;
    while (s->done < s->len) {
        uint64_t need = s->len - s->done;
        size_t n;
        bool ok = true;
        if (en_sink_direct(s)) {
            n = (size_t)(need < SHM_CMA_PIECE ? need : SHM_CMA_PIECE);
            if (s->mode == EN_SINK_COPY) ok = cma_read(t, s->dst + s->done, s->done, n);
            if (ok) en_sink_placed(s, n);
        } else {
            if (!t->bounce && !(t->bounce = coh_malloc(SHM_CMA_BOUNCE))) {
                conn_close(t, COH_ENOMEM, "out of memory");
                return false;
            }
            n = (size_t)(need < SHM_CMA_BOUNCE ? need : SHM_CMA_BOUNCE);
            if (s->mode == EN_SINK_REDUCE && n < need) n -= n % s->esize;
            ok = cma_read(t, t->bounce, s->done, n);
            if (ok) en_sink_consume(s, t->bounce, n);
        }
        if (!ok) {
            char why[160];
            snprintf(why, sizeof(why), "reading rank %d's memory: %s", c->peer, strerror(errno));
            conn_close(t, COH_EPEER, why);
            return false;
        }
        /* After the read (seq_cst): a revocation not seen here came after
         * every byte of it, and so did the owner's next write. */
        if (atomic_load(&t->rx->cma_revoked)) {
            conn_close(t, COH_EPEER, "the peer withdrew a frame as its link closed");
            return false;
        }
        c->bytes_in += n;
        atomic_fetch_add_explicit(&c->rail->stat_bytes_in, n, memory_order_relaxed);
        atomic_fetch_add_explicit(&c->rail->stat_shm_in, n, memory_order_relaxed);
        if (s->mode != EN_SINK_DISCARD)
            atomic_fetch_add_explicit(&c->rail->stat_cma_in, n, memory_order_relaxed);
    }
    return true;
}

/* Deliver what the peer's ring holds. */
static void process(shm_conn_t *t)
{
    en_conn_t *c = &t->base;
    en_rail_t *rail = c->rail;
    shm_ring_t *r = t->rx;
    const uint64_t size = r->size;
    for (;;) {
        if (c->state != EN_CONN_READY) return;
        if (c->rstate == EN_RD_BLOCKED && !match(t)) break;
        uint64_t tail = atomic_load_explicit(&r->tail, memory_order_acquire);
        uint64_t avail = tail - t->rx_head;
        if (avail > size || (tail & 7)) {
            atomic_fetch_add(&rail->stat_bad_frames, 1);
            conn_close(t, COH_EPROTO, "a shared-memory ring out of order");
            return;
        }
        bool need_bytes =
            c->rstate == EN_RD_HDR || (!t->rx_cma && (c->sink.done < c->sink.len || t->rx_pad));
        if (avail == 0 && need_bytes) break; /* the poll hook looks again */
        uint64_t at = t->rx_head & (size - 1);
        if (c->rstate == EN_RD_HDR) {
            if (avail < EN_HDR_SIZE) break;
            /* Header and descriptor are published together. */
            uint8_t hb[EN_HDR_SIZE + SHM_CMA_DESC];
            ring_get(r, t->rx_head, hb, EN_HDR_SIZE);
            bool cma = hb[5] & SHM_HDR_CMA;
            hb[5] &= (uint8_t)~SHM_HDR_CMA;
            if (cma) ring_get(r, t->rx_head + EN_HDR_SIZE, hb + EN_HDR_SIZE, SHM_CMA_DESC);
            int d = en_hdr_decode(hb, EN_HDR_SIZE, &c->hdr);
            if (d != EN_HDR_SIZE || c->hdr.type == EN_FRAME_ACK ||
                (cma && (!t->peer_pid || avail < sizeof(hb) || c->hdr.type != EN_FRAME_DATA ||
                         en_get64(hb + EN_HDR_SIZE + 8) != c->hdr.len))) {
                atomic_fetch_add(&rail->stat_bad_frames, 1);
                conn_close(t, COH_EPROTO, "malformed frame header");
                return;
            }
            uint64_t hl = cma ? sizeof(hb) : EN_HDR_SIZE;
            t->rx_head += hl;
            c->bytes_in += EN_HDR_SIZE;
            atomic_fetch_add_explicit(&rail->stat_bytes_in, EN_HDR_SIZE, memory_order_relaxed);
            atomic_fetch_add_explicit(&rail->stat_shm_in, EN_HDR_SIZE, memory_order_relaxed);
            t->rx_cma = cma;
            t->rx_cma_addr = cma ? en_get64(hb + EN_HDR_SIZE) : 0;
            t->rx_pad = cma ? 0 : pad8(EN_HDR_SIZE + c->hdr.len);
            c->t_frame_ns = bs_now_ns();
            if (!match(t)) break;
            continue;
        }
        if (t->rx_cma) {
            /* From the peer's memory; then its send may complete. */
            if (!cma_payload(t)) return;
            t->rx_cma = false;
            atomic_fetch_add(&r->cma_done, 1); /* seq_cst: against the writer's wsleep */
            rx_publish(t);
            c->rstate = EN_RD_HDR;
            en_exec_recv_done(rail, c);
            continue;
        }
        /* EN_RD_PAYLOAD: straight from the ring into the sink. */
        en_sink_t *s = &c->sink;
        uint64_t need = s->len - s->done;
        if (need > 0) {
            uint64_t n = avail < need ? avail : need;
            if (n > size - at) n = size - at;
            if (s->mode == EN_SINK_REDUCE) n -= n % s->esize;
            if (n == 0) break;
            en_sink_consume(s, ring_data(r) + at, (size_t)n);
            t->rx_head += n;
            c->bytes_in += n;
            atomic_fetch_add_explicit(&rail->stat_bytes_in, n, memory_order_relaxed);
            atomic_fetch_add_explicit(&rail->stat_shm_in, n, memory_order_relaxed);
            if (s->done < s->len) continue;
        }
        /* The padding was published with the payload's last word. */
        if (tail - t->rx_head < t->rx_pad) break;
        t->rx_head += t->rx_pad;
        t->rx_pad = 0;
        rx_publish(t);
        c->rstate = EN_RD_HDR;
        en_exec_recv_done(rail, c);
    }
    rx_publish(t);
}

static bool kick_live(void *arg)
{
    return ((shm_conn_t *)arg)->phase == SH_LIVE;
}

static void kick_step(void *arg)
{
    process(arg);
    pump_tx(arg);
}

/* A completion can reach back into a conn that is processing: run once more
 * instead of nesting. */
static void kick(shm_conn_t *t)
{
    en_kick_run(&t->kick, kick_live, kick_step, t);
}

static void shm_resume(en_conn_t *c)
{
    shm_conn_t *t = (shm_conn_t *)c;
    if (c->state == EN_CONN_READY && c->rstate == EN_RD_BLOCKED) kick(t);
}

/* ---- the socket: handshake, doorbells, hangups ---- */

static int send_hello(shm_conn_t *t)
{
    en_rail_t *rail = t->base.rail;
    int memfd = -1;
    BS_CHECK(ring_new(t->tr, t, &memfd));
    en_hello_t h;
    en_rail_fill_hello(rail, &h);
    uint8_t out[EN_HELLO_SIZE];
    en_hello_encode(&h, out);
    struct iovec iov = {.iov_base = out, .iov_len = sizeof(out)};
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } cm;
    memset(&cm, 0, sizeof(cm));
    struct msghdr mh = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.buf, .msg_controllen = sizeof(cm.buf)};
    struct cmsghdr *cmh = CMSG_FIRSTHDR(&mh);
    cmh->cmsg_level = SOL_SOCKET;
    cmh->cmsg_type = SCM_RIGHTS;
    cmh->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cmh), &memfd, sizeof(int));
    ssize_t n;
    do n = sendmsg(t->fd, &mh, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    close(memfd); /* the mapping and the peer's copy keep it */
    if (n != (ssize_t)sizeof(out))
        return bs_fail(COH_ESYS, "shm: sending the handshake: %s",
                       n < 0 ? strerror(errno) : "short write");
    return 0;
}

/* Can this process read the peer's memory? Read the nonce the peer wrote
 * in its ring from where the peer says it is; if it is there, let the peer
 * send descriptors. */
static void cma_probe(shm_conn_t *t)
{
    shm_ring_t *r = t->rx;
    if (!t->tr->cma_bytes || r->cma_pid <= 0 || !r->cma_nonce) return;
    uint64_t v = 0;
    if (!vm_read((pid_t)r->cma_pid, &v, r->cma_addr, sizeof(v)) || v != r->cma_nonce) return;
    t->peer_pid = (pid_t)r->cma_pid;
    atomic_store_explicit(&r->cma_ok, 1, memory_order_release);
}

static void on_hello(shm_conn_t *t)
{
    en_conn_t *c = &t->base;
    en_rail_t *rail = c->rail;
    en_hello_t h;
    char why[BS_ERR_LEN];
    int r = en_link_hello(c, t->hello_in, t->expect_peer, "a shared-memory", &h, why, sizeof(why));
    if (r == 0 && t->peer_memfd < 0) {
        snprintf(why, sizeof(why), "no ring came with the handshake");
        r = COH_EPROTO;
    }
    if (r == 0) r = ring_map_peer(t, t->peer_memfd, why, sizeof(why));
    if (r == 0) cma_probe(t);
    if (t->peer_memfd >= 0) {
        close(t->peer_memfd);
        t->peer_memfd = -1;
    }
    if (r == 0 && !c->outgoing && send_hello(t) != 0) {
        snprintf(why, sizeof(why), "%s", coh_last_error());
        r = COH_ESYS;
    }
    if (r < 0) {
        atomic_fetch_add(&rail->stat_rejected, 1);
        conn_close(t, r, why);
        return;
    }
    uv_timer_stop(&t->timer);
    c->peer = (int)h.rank;
    t->phase = SH_LIVE;
    c->state = EN_CONN_READY;
    c->rstate = EN_RD_HDR;
    en_rail_conn_ready(rail, c);
    kick(t);
}

/* Handshake bytes (and the ring's fd) from the socket. */
static void read_hello(shm_conn_t *t)
{
    for (;;) {
        struct iovec iov = {.iov_base = t->hello_in + t->hello_got,
                            .iov_len = EN_HELLO_SIZE - t->hello_got};
        union {
            char buf[CMSG_SPACE(sizeof(int) * 4)];
            struct cmsghdr align;
        } cm;
        struct msghdr mh = {
            .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.buf, .msg_controllen = sizeof(cm)};
        ssize_t n = recvmsg(t->fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        for (struct cmsghdr *ch = n > 0 ? CMSG_FIRSTHDR(&mh) : NULL; ch; ch = CMSG_NXTHDR(&mh, ch))
            if (ch->cmsg_level == SOL_SOCKET && ch->cmsg_type == SCM_RIGHTS) {
                int nfd = (int)((ch->cmsg_len - CMSG_LEN(0)) / sizeof(int));
                for (int i = 0; i < nfd; i++) {
                    int fd;
                    memcpy(&fd, CMSG_DATA(ch) + sizeof(int) * (size_t)i, sizeof(int));
                    if (t->peer_memfd < 0)
                        t->peer_memfd = fd;
                    else
                        close(fd); /* one ring per side */
                }
            }
        if (n <= 0) {
            conn_close(t, COH_EPEER,
                       n == 0 ? "connection closed by peer"
                              : "reading the shared-memory handshake");
            return;
        }
        t->hello_got += (size_t)n;
        if (t->hello_got == EN_HELLO_SIZE) {
            on_hello(t);
            return;
        }
    }
}

static void poll_cb(uv_poll_t *h, int status, int events)
{
    shm_conn_t *t = h->data;
    if (t->phase == SH_CLOSED) return;
    if (t->phase == SH_HELLO) {
        if (status < 0) {
            conn_close(t, COH_EPEER, uv_strerror(status));
            return;
        }
        read_hello(t);
        return;
    }
    /* Doorbells: drain them, then look at both rings. EOF or an error is
     * the peer gone (a BYE before it: finalized). */
    uint8_t buf[256];
    ssize_t n;
    bool gone = status < 0 || (events & UV_DISCONNECT);
    while ((n = recv(t->fd, buf, sizeof(buf), MSG_DONTWAIT)) > 0) {
    }
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) gone = true;
    kick(t); /* what the peer wrote before it went is still delivered */
    if (gone && t->phase == SH_LIVE) {
        en_conn_t *c = &t->base;
        conn_close(t, COH_EPEER, c->peer_bye ? "peer finalized" : "connection closed by peer");
    }
}

static int conn_start(shm_conn_t *t)
{
    int e = uv_poll_start(&t->poll, UV_READABLE | UV_DISCONNECT, poll_cb);
    if (e) return bs_fail(COH_ESYS, "shm: poll: %s", uv_strerror(e));
    uv_timer_start(&t->timer, hs_timeout, SHM_HANDSHAKE_MS, 0);
    return 0;
}

static void on_accept(uv_poll_t *h, int status, int events)
{
    (void)events;
    shm_tr_t *tr = h->data;
    if (status < 0) return;
    for (;;) {
        int fd = accept4(tr->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return;
        shm_conn_t *t = conn_new(tr, fd);
        if (!t) {
            close(fd);
            continue;
        }
        t->base.outgoing = false;
        if (conn_start(t) != 0) conn_close(t, COH_ESYS, coh_last_error());
    }
}

/* ---- the transport ---- */

static int shm_listen(en_rail_t *rail, const struct sockaddr *addr, struct sockaddr_storage *bound)
{
    (void)addr;
    (void)bound;
    shm_tr_t *tr = rail->shm;
    tr->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (tr->lfd < 0) return bs_fail(COH_ESYS, "shm: socket: %s", strerror(errno));
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof(a.sun_path), "%s", tr->path);
    /* The job's directory goes with its last socket (shm_shutdown): another
     * context of the job that finalizes between our mkdir and our bind
     * removes it (mp.boot.reinit.n3 under ASan: ENOENT). Once our socket is
     * in it, it stays: make it again and retry. */
    int r = -1;
    for (int attempt = 0; attempt < 100 && r != 0; attempt++) {
        BS_CHECK(en_shm_job_dir(tr->path));
        (void)unlink(tr->path); /* a crashed run's, in our private directory */
        r = bind(tr->lfd, (struct sockaddr *)&a, sizeof(a));
        if (r != 0 && errno != ENOENT) break;
    }
    if (r != 0 || listen(tr->lfd, 256) != 0)
        return bs_fail(COH_ESYS, "shm: listening on %s: %s", tr->path, strerror(errno));
    int e = uv_poll_init(rail->loop, &tr->lpoll, tr->lfd);
    if (e) return bs_fail(COH_ESYS, "shm: poll: %s", uv_strerror(e));
    tr->lpoll.data = tr;
    tr->lpoll_open = true;
    uv_poll_start(&tr->lpoll, UV_READABLE, on_accept);
    return 0;
}

static int shm_connect(en_rail_t *rail, int peer, const struct sockaddr *addr)
{
    (void)addr;
    shm_tr_t *tr = rail->shm;
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (en_shm_path(tr->dir, rail->token, rail->shm_names + (size_t)peer * EN_SHM_NAME, rail->index,
                    a.sun_path, sizeof(a.sun_path)) != 0)
        return bs_fail(COH_EINVAL, "shm: the socket path is too long");
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return bs_fail(COH_ESYS, "shm: socket: %s", strerror(errno));
    /* A UNIX socket connects at once (or the listener's backlog is full). */
    int r;
    do r = connect(fd, (struct sockaddr *)&a, sizeof(a));
    while (r != 0 && errno == EINTR);
    if (r != 0) {
        int err = errno;
        close(fd);
        return bs_fail(COH_EPEER, "shm: connecting to rank %d at %s: %s", peer, a.sun_path,
                       strerror(err));
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0) {
        close(fd);
        return bs_fail(COH_ESYS, "shm: fcntl: %s", strerror(errno));
    }
    shm_conn_t *t = conn_new(tr, fd);
    if (!t) {
        close(fd);
        return bs_fail(COH_ENOMEM, "out of memory");
    }
    t->base.outgoing = true;
    t->expect_peer = peer;
    if (send_hello(t) != 0 || conn_start(t) != 0) {
        char why[BS_ERR_LEN];
        snprintf(why, sizeof(why), "%s", coh_last_error());
        conn_close(t, COH_ESYS, why);
        return bs_fail(COH_ESYS, "%s", why);
    }
    return 0;
}

static void shm_close(en_conn_t *c, int status, const char *why)
{
    conn_close((shm_conn_t *)c, status, why);
}

static void shm_cut(en_conn_t *c)
{
    shutdown(((shm_conn_t *)c)->fd, SHUT_RDWR);
}

static void shm_shutdown(en_rail_t *rail)
{
    shm_tr_t *tr = rail->shm;
    if (!tr) return;
    while (tr->conns) conn_close(tr->conns, COH_ECANCELED, "rail stopping");
    if (tr->lpoll_open) {
        uv_close((uv_handle_t *)&tr->lpoll, NULL);
        tr->lpoll_open = false;
        (void)unlink(tr->path);
        /* The job's directory goes with its last socket. */
        char d[sizeof(tr->path)];
        snprintf(d, sizeof(d), "%s", tr->path);
        char *slash = strrchr(d, '/');
        if (slash) {
            *slash = 0;
            (void)rmdir(d);
        }
    }
    done_run(tr); /* sends of conns closed above completed already */
}

/* Something for process() or pump_tx(): unread bytes it can take (not a
 * frame waiting for its receive), or queued frames and room for them. */
static bool conn_ready(shm_conn_t *t)
{
    if (t->phase != SH_LIVE) return false;
    /* seq_cst, not acquire: en_shm_arm stores a sleep flag, then reads
     * here (Dekker's pattern with the writer's publish). */
    if (t->base.rstate != EN_RD_BLOCKED && atomic_load(&t->rx->tail) != t->rx_head) return true;
    if (t->cma_head && atomic_load(&t->tx->cma_done) != t->cma_acked) return true;
    return t->q_head && t->tx->size - (t->tx_tail - atomic_load(&t->tx->head)) >= q_need(t);
}

bool en_shm_poll(en_rail_t *rail)
{
    shm_tr_t *tr = rail->shm;
    bool did = done_run(tr);
    /* A conn closed by a kick is unlinked, its memory kept until the loop's
     * next pass: its next is then NULL, and this round ends early. */
    for (shm_conn_t *t = tr->conns, *next; t; t = next) {
        next = t->next;
        if (!conn_ready(t)) continue;
        cma_reap(t);
        kick(t);
        did = true;
    }
    return done_run(tr) || did;
}

bool en_shm_arm(en_rail_t *rail)
{
    shm_tr_t *tr = rail->shm;
    if (tr->done_head) return false;
    for (shm_conn_t *t = tr->conns; t; t = t->next) {
        if (t->phase != SH_LIVE) continue;
        /* seq_cst both ways: the writer publishes, then reads the flag (and
         * the reader counts what it read, then reads wsleep). */
        atomic_store(&t->rx->rsleep, 1);
        if (t->cma_head) atomic_store(&t->tx->wsleep, 1);
        if (conn_ready(t)) return false;
    }
    return true;
}

const en_transport_ops_t en_shm_ops = {
    .name = "shm",
    .tr_listen = shm_listen,
    .tr_connect = shm_connect,
    .tr_send = shm_send,
    .tr_resume = shm_resume,
    .tr_close = shm_close,
    .tr_shutdown = shm_shutdown,
    .tr_cut = shm_cut,
};

int en_shm_init(en_rail_t *rail, const char *dir, const char *name, size_t ring_bytes,
                size_t cma_bytes)
{
    shm_tr_t *tr = coh_zalloc(sizeof(*tr));
    if (!tr) return bs_fail(COH_ENOMEM, "out of memory");
    tr->rail = rail;
    tr->lfd = -1;
    /* A power of two, at least 64 KiB. */
    size_t rb = 64 * 1024;
    while (rb < ring_bytes && rb < (1u << 30)) rb <<= 1;
    tr->ring_bytes = rb;
    tr->cma_bytes = cma_bytes;
    snprintf(tr->dir, sizeof(tr->dir), "%s", dir);
    if (en_shm_path(dir, rail->token, name, rail->index, tr->path, sizeof(tr->path)) != 0) {
        coh_free(tr);
        return bs_fail(COH_EINVAL, "COHORT_SHM_DIR %s: the socket path is too long", dir);
    }
    tr->ops = en_shm_ops;
    en_ops_complete(&tr->ops);
    rail->shm = tr;
    return 0;
}

void en_shm_fini(en_rail_t *rail)
{
    shm_tr_t *tr = rail->shm;
    if (!tr) return;
    if (tr->lfd >= 0) close(tr->lfd);
    coh_free(tr);
    rail->shm = NULL;
}
