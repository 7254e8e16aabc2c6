/*
 * TCP transport.
 *
 * Reads go through a per-connection staging buffer so that one read() can
 * bring several small frames; a large copy payload is read straight into its
 * destination (no staging copy), and a reduce payload is reduced out of the
 * staging buffer while it is still in cache. Writes go straight from the
 * source with writev (header + payload). A frame whose receive is not posted
 * yet is kept by the executor (the rail's stash, up to COHORT_STASH_BYTES);
 * only beyond that budget does the connection stop reading, and TCP flow
 * control holds the sender back.
 *
 * A connection (tcp_conn_t, the link to one peer) and its socket
 * (tcp_sock_t) are separate, so that with failover (several rails) the link
 * can move to another socket, through another interface, without the
 * executor noticing:
 *   - the receiver counts the bytes of frames it has consumed and says so
 *     (ACK frames, not counted themselves) after every batch it reads, and
 *     every stall_ms / 4 while it is paused, so a live link always acks;
 *   - the sender keeps every frame until it is acknowledged (its send step
 *     completes then, not when written: the plan's write-after-send
 *     dependencies keep the bytes unchanged until then, so nothing is
 *     copied but control frames);
 *   - a socket error, or sent bytes unacknowledged for stall_ms while
 *     another rail progresses, moves the link: a new socket through the
 *     next interface, a HELLO with the RESUME flag and the bytes consumed,
 *     and each side sends again from exactly where the other stopped
 *     reading. Unconsumed bytes in the staging buffer are dropped, since
 *     they come again, so a reduction never applies a byte twice;
 *   - the lower rank tries the link's own interface every probe_ms and
 *     moves it back when it answers.
 *
 * Threading: every function here runs on the rail's loop thread.
 */
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

#include "engines/engine.h"

#define STAGE_CAP    (256 * 1024)
#define DIRECT_MIN   (16 * 1024) /* copy payloads from here up are read in place */
#define HANDSHAKE_MS 10000

typedef struct tcp_conn tcp_conn_t;

typedef enum sock_phase { SK_CONNECTING = 0, SK_HELLO, SK_LIVE, SK_CLOSED } sock_phase;

typedef struct tcp_sock {
    uv_tcp_t tcp;
    uv_timer_t timer; /* the handshake's deadline */
    uv_connect_t creq;
    uv_write_t hello_wreq;
    struct tcp_sock *prev, *next; /* the transport's list of open sockets */
    en_rail_t *rail;
    tcp_conn_t *conn; /* the link it serves or joins; NULL: not known yet, or dropped */
    uint8_t hello_out[EN_HELLO_SIZE];
    uint8_t hello_in[EN_HELLO_SIZE];
    size_t hello_got;
    int phase;
    int handles;
    bool outgoing;
    bool resume; /* dialled to move an existing link here */
    int via;     /* the interface (rail index) it leaves through */
    int expect_peer;
    struct sockaddr_storage to; /* a resume dial's destination */
} tcp_sock_t;

struct tcp_conn {
    en_conn_t base; /* first member */
    uv_timer_t watch;
    tcp_sock_t *sock; /* the live socket; NULL while the link moves */
    tcp_sock_t *dial; /* a resume being dialled */
    int refs;         /* 1 for the conn itself (its watch timer), 1 per socket naming it */
    bool reading;
    bool direct; /* the pending read goes straight into the sink */
    bool kicking, kick_again;
    bool frozen; /* a resume is negotiated: consume nothing (the offset is sent) */
    uint8_t *stage;
    size_t s_start, s_end;
    /* failover */
    int via; /* interface the link uses now */
    en_wreq_t *tx_head, *tx_tail;
    uint64_t tx_end;   /* stream bytes queued */
    uint64_t tx_acked; /* stream bytes the peer has consumed */
    uint64_t tx_sent;  /* stream bytes some socket took */
    uint64_t rx_off;   /* stream bytes this side has consumed */
    uint64_t ack_sent;
    /* Where the last frame too large to be copied (EN_TX_COPY_MAX) ends in
     * the stream: its sender completes it at the ACK, so it is acked at
     * once (ack_soon); smaller ones at the watch timer's next look. */
    uint64_t rx_big_end;
    bool ack_writing;
    uint8_t ack_hdr[EN_HDR_SIZE];
    uv_write_t ack_wreq;
    uint64_t t_progress_ns; /* last ACK, or when waiting began */
    uint64_t t_ack_ns;      /* last ACK sent */
    uint64_t t_probe_ns;
    uint64_t t_dial_ns;
    int tries;            /* resume dials since the link was last live */
    uint64_t t_fail0_ns;  /* when it stopped being live (0: it is) */
    uint64_t retry_at_ns; /* the next resume dial, when the last failed fast (watch_cb) */
    uint64_t epoch;       /* moves of this link so far: a dial from an older one is stale */
    int old_closing;      /* replaced sockets whose writes are not cancelled yet */
    bool replay_pending;
    uint64_t replay_from;
    char why[160];
};

typedef struct tcp_tr {
    uv_tcp_t listen;
    en_rail_t *rail;
    tcp_sock_t *socks;
} tcp_tr_t;

static void conn_close(tcp_conn_t *t, int status, const char *why);
static void kick(tcp_conn_t *t);
static void sock_close(tcp_sock_t *s);
static void move_link(tcp_conn_t *t, const char *why);
static void start_reading(tcp_conn_t *t);
static void replay(tcp_conn_t *t);
static void watch_cb(uv_timer_t *h);
static void unfreeze(tcp_conn_t *t);
static void send_ack(tcp_conn_t *t, bool keepalive);

static uint64_t wlen(const en_wreq_t *w)
{
    return EN_HDR_SIZE + w->len;
}

/* ---- sockets ---- */

static void conn_unref(tcp_conn_t *t);

static void sock_handle_closed(uv_handle_t *h)
{
    tcp_sock_t *s = h->data;
    if (--s->handles > 0) return;
    if (s->conn) conn_unref(s->conn);
    tcp_tr_t *tr = s->rail->listener;
    if (s->prev)
        s->prev->next = s->next;
    else if (tr && tr->socks == s)
        tr->socks = s->next;
    if (s->next) s->next->prev = s->prev;
    coh_free(s);
}

static void set_socket_options(en_rail_t *rail, tcp_sock_t *s)
{
    /* Frames are written whole (header + payload in one writev): Nagle would
     * only delay the small ones. */
    uv_tcp_nodelay(&s->tcp, 1);
    if (rail->sockbuf_bytes) {
        int v = (int)rail->sockbuf_bytes;
        uv_send_buffer_size((uv_handle_t *)&s->tcp, &v);
        v = (int)rail->sockbuf_bytes;
        uv_recv_buffer_size((uv_handle_t *)&s->tcp, &v);
    }
}

static tcp_sock_t *sock_new(en_rail_t *rail)
{
    tcp_tr_t *tr = rail->listener;
    tcp_sock_t *s = coh_zalloc(sizeof(*s));
    if (!s) return NULL;
    if (uv_tcp_init(rail->loop, &s->tcp) != 0) {
        coh_free(s);
        return NULL;
    }
    atomic_store(&rail->stream_socks, 1);
    s->rail = rail;
    s->tcp.data = s;
    uv_timer_init(rail->loop, &s->timer);
    s->timer.data = s;
    s->handles = 2;
    s->expect_peer = -1;
    s->via = rail->index;
    if (tr) {
        s->next = tr->socks;
        if (tr->socks) tr->socks->prev = s;
        tr->socks = s;
    }
    return s;
}

/* The socket's writes are cancelled (their callbacks run) before its close
 * callback: a link waits for that before it writes its frames again. */
static void old_sock_closed(uv_handle_t *h)
{
    tcp_sock_t *s = h->data;
    tcp_conn_t *t = s->conn;
    if (--t->old_closing == 0 && t->replay_pending && t->base.state == EN_CONN_READY) replay(t);
    sock_handle_closed(h);
}

static void sock_close(tcp_sock_t *s)
{
    if (!s || s->phase == SK_CLOSED) return;
    s->phase = SK_CLOSED;
    uv_timer_stop(&s->timer);
    tcp_conn_t *t = s->conn;
    if (t && t->sock == s) {
        t->sock = NULL;
        t->reading = false;
        t->direct = false;
    }
    if (t && t->dial == s) t->dial = NULL;
    if (t) {
        t->old_closing++;
        uv_close((uv_handle_t *)&s->tcp, old_sock_closed);
    } else {
        uv_close((uv_handle_t *)&s->tcp, sock_handle_closed);
    }
    uv_close((uv_handle_t *)&s->timer, sock_handle_closed);
}

/* ---- connections ---- */

static void conn_unref(tcp_conn_t *t)
{
    if (--t->refs > 0) return;
    en_rail_conn_unlink(&t->base);
    coh_free(t->stage);
    coh_free(t);
}

static void conn_freed(uv_handle_t *h)
{
    conn_unref(h->data);
}

static tcp_conn_t *conn_new(en_rail_t *rail)
{
    tcp_conn_t *t = coh_zalloc(sizeof(*t));
    if (!t) return NULL;
    t->stage = coh_aligned(STAGE_CAP, 64);
    if (!t->stage) {
        coh_free(t);
        return NULL;
    }
    t->base.rail = rail;
    t->base.ops = rail->ops;
    t->base.peer = -1;
    t->via = rail->index;
    t->refs = 1;
    uv_timer_init(rail->loop, &t->watch);
    t->watch.data = t;
    en_rail_conn_link(rail, &t->base);
    return t;
}

/* s serves (or joins) t: it holds t until its handles are closed. */
static void sock_bind(tcp_sock_t *s, tcp_conn_t *t)
{
    if (s->conn == t) return;
    s->conn = t;
    t->refs++;
}

static void attach(tcp_conn_t *t, tcp_sock_t *s)
{
    sock_bind(s, t);
    t->sock = s;
}

/* ---- failover: frames kept until acknowledged ---- */

static bool failover(const tcp_conn_t *t)
{
    return t->base.rail->failover;
}

static void tx_finish(en_wreq_t *w, int status)
{
    if (w->tx_own) {
        if (w->tx_orig) w->tx_orig->done(w->tx_orig, status);
        coh_free(w);
        return;
    }
    w->done(w, status);
}

/* Complete the acknowledged frames whose writes have ended. */
static void tx_reap(tcp_conn_t *t)
{
    while (t->tx_head && !t->tx_head->tx_writing &&
           t->tx_head->tx_off + wlen(t->tx_head) <= t->tx_acked) {
        en_wreq_t *w = t->tx_head;
        t->tx_head = w->tx_next;
        if (!t->tx_head) t->tx_tail = NULL;
        w->tx_next = NULL;
        tx_finish(w, 0);
    }
}

static void tx_fail_all(tcp_conn_t *t, int status)
{
    /* Frames whose write is still queued end in its (cancelled) callback. */
    en_wreq_t *w = t->tx_head, *keep = NULL, *keep_tail = NULL;
    t->tx_head = t->tx_tail = NULL;
    while (w) {
        en_wreq_t *n = w->tx_next;
        w->tx_next = NULL;
        if (w->tx_writing) {
            if (keep_tail)
                keep_tail->tx_next = w;
            else
                keep = w;
            keep_tail = w;
        } else {
            tx_finish(w, status);
        }
        w = n;
    }
    t->tx_head = keep;
    t->tx_tail = keep_tail;
}

static void on_write(uv_write_t *req, int status);

/* Every libuv write of the rail starts here. libuv writes with write(2),
 * which raises SIGPIPE on a dead peer: the calling thread holds it (an
 * application thread running the loop does not otherwise), and the count
 * tells later passes, which flush the queued rest, to hold it too. The rest
 * may go in this very pass (the socket's POLLOUT is armed at its epoll
 * step): then the hold stays until the pass ends (bs_sigpipe_settle in
 * reactor/rx_loop.c, run_pass). Each callback (on_write, ack_written,
 * hello_written) takes its write off the count. */
static int tcp_write(en_rail_t *rail, uv_write_t *req, uv_stream_t *st, const uv_buf_t *bufs,
                     unsigned n, uv_write_cb cb)
{
    bs_sigpipe_hold();
    atomic_fetch_add(&rail->uv_writes, 1);
    int e = uv_write(req, st, bufs, n, cb);
    if (e) atomic_fetch_sub(&rail->uv_writes, 1);
    if (!e && uv_stream_get_write_queue_size(st) != 0)
        bs_sigpipe_keep();
    else
        bs_sigpipe_release();
    return e;
}

static void tcp_written(en_rail_t *rail)
{
    atomic_fetch_sub(&rail->uv_writes, 1);
}

static void count_sent(en_conn_t *c, const en_wreq_t *w)
{
    c->bytes_out += EN_HDR_SIZE + w->len;
    atomic_fetch_add_explicit(&c->rail->stat_bytes_out, EN_HDR_SIZE + w->len, memory_order_relaxed);
}

/* Write what the socket takes now of bufs, with MSG_NOSIGNAL (a peer that
 * died leaves EPIPE, no signal), when libuv has nothing queued on it (the
 * order is kept). bufs then describe the rest (*nbufs 0: all went). */
static void write_now(tcp_conn_t *t, uv_buf_t *bufs, unsigned *nbufs)
{
    uv_os_fd_t fd;
    if (uv_stream_get_write_queue_size((uv_stream_t *)&t->sock->tcp) != 0 ||
        uv_fileno((uv_handle_t *)&t->sock->tcp, &fd) != 0)
        return;
    struct iovec iov[2];
    for (unsigned i = 0; i < *nbufs; i++) iov[i] = (struct iovec){bufs[i].base, bufs[i].len};
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = *nbufs};
    ssize_t n;
    do n = sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    if (n <= 0) return; /* full, or an error uv_write will report */
    size_t left = (size_t)n;
    unsigned k = 0;
    for (unsigned i = 0; i < *nbufs; i++) {
        size_t skip = left < bufs[i].len ? left : bufs[i].len;
        left -= skip;
        if (skip < bufs[i].len)
            bufs[k++] = uv_buf_init(bufs[i].base + skip, (unsigned)(bufs[i].len - skip));
    }
    *nbufs = k;
}

/* A kept frame's write ended well: the socket has taken it, and a copy's
 * original counts as sent (BYE's wait; a small frame's send step). */
static void kept_written(tcp_conn_t *t, en_wreq_t *w)
{
    if (w->tx_off + wlen(w) > t->tx_sent) t->tx_sent = w->tx_off + wlen(w);
    if (w->tx_own && w->tx_orig) {
        en_wreq_t *o = w->tx_orig;
        w->tx_orig = NULL;
        o->done(o, 0);
    }
}

/* Write w from stream offset `from` (inside it, or its start). What the
 * socket takes at once goes by sendmsg (write_now), the rest by uv_write;
 * a frame written whole has no write in flight and waits for its ACK in
 * the list. Not at once: a copied control frame whose original must not
 * end inside tr_send. */
static int issue(tcp_conn_t *t, en_wreq_t *w, uint64_t from)
{
    uint64_t skip = from > w->tx_off ? from - w->tx_off : 0;
    uv_buf_t bufs[2];
    int n = 0;
    if (skip < EN_HDR_SIZE)
        bufs[n++] = uv_buf_init((char *)w->hdr + skip, (unsigned)(EN_HDR_SIZE - skip));
    uint64_t pskip = skip > EN_HDR_SIZE ? skip - EN_HDR_SIZE : 0;
    if (w->len > pskip)
        bufs[n++] = uv_buf_init((char *)w->payload + pskip, (unsigned)(w->len - pskip));
    if (n == 0) return 0;
    w->conn = &t->base;
    unsigned nb = (unsigned)n;
    if (!(w->tx_own && w->tx_orig && !w->tx_orig->done_inline)) write_now(t, bufs, &nb);
    if (nb == 0) {
        count_sent(&t->base, w);
        kept_written(t, w);
        return 0;
    }
    w->tr.tcp.data = w;
    int e = tcp_write(t->base.rail, &w->tr.tcp, (uv_stream_t *)&t->sock->tcp, bufs, nb, on_write);
    if (e) return bs_errno_status(e);
    w->tx_writing = true;
    t->base.writes_out++;
    return 0;
}

/* The link is live on a new socket and the peer consumed `from`: send the
 * rest of every kept frame again, in order. */
static void replay(tcp_conn_t *t)
{
    if (!t->sock || t->sock->phase != SK_LIVE) {
        t->replay_pending = false;
        return;
    }
    uint64_t from = t->replay_from;
    if (from > t->tx_acked) t->tx_acked = from;
    /* Still pending while it runs: nothing may be written ahead of it. */
    for (en_wreq_t *w = t->tx_head; w; w = w->tx_next) {
        if (w->tx_off + wlen(w) <= from) continue; /* acked: reaped below */
        uint64_t start = w->tx_off > from ? w->tx_off : from;
        /* Frames the old socket had not taken yet are not "sent again". */
        if (start < t->tx_sent) {
            uint64_t end = w->tx_off + wlen(w) < t->tx_sent ? w->tx_off + wlen(w) : t->tx_sent;
            atomic_fetch_add(&t->base.rail->stat_resent, end - start);
        }
        int e = issue(t, w, from);
        if (e < 0) {
            t->replay_pending = false;
            move_link(t, "cannot write on the new socket");
            return;
        }
    }
    t->replay_pending = false;
    t->t_progress_ns = bs_now_ns();
    send_ack(t, true);
    /* Completing sends may start the next steps, whose frames now follow. */
    tx_reap(t);
}

static void ack_written(uv_write_t *req, int status);

/* After reading: an ACK now only when the sender waits for it (a frame it
 * did not copy) or holds copies of EN_TX_ACK_BYTES; otherwise the watch
 * timer's next look (a tenth of the stall time) sends it. An ACK per frame
 * doubled the packets of small ops over several rails. */
static void ack_soon(tcp_conn_t *t)
{
    if (t->rx_off != t->ack_sent &&
        (t->ack_sent < t->rx_big_end || t->rx_off - t->ack_sent >= EN_TX_ACK_BYTES))
        send_ack(t, false);
}

static void send_ack(tcp_conn_t *t, bool keepalive)
{
    /* After a move the stream may restart inside a frame: until the replay
     * has queued that frame's rest, an ACK would land in its payload. */
    if (!failover(t) || !t->sock || t->sock->phase != SK_LIVE || t->ack_writing ||
        t->replay_pending)
        return;
    if (t->rx_off == t->ack_sent && !keepalive) return;
    en_hdr_t h = {.type = EN_FRAME_ACK, .off = t->rx_off};
    en_hdr_encode(&h, t->ack_hdr);
    uv_buf_t b = uv_buf_init((char *)t->ack_hdr, EN_HDR_SIZE);
    unsigned nb = 1;
    write_now(t, &b, &nb);
    if (nb == 0) { /* taken whole: ack_hdr is free again */
        t->ack_sent = t->rx_off;
        t->t_ack_ns = bs_now_ns();
        return;
    }
    t->ack_wreq.data = t;
    if (tcp_write(t->base.rail, &t->ack_wreq, (uv_stream_t *)&t->sock->tcp, &b, 1, ack_written) ==
        0) {
        t->ack_writing = true;
        t->ack_sent = t->rx_off;
        t->t_ack_ns = bs_now_ns();
    }
}

/* A write's error is the link's only if it was on the link's socket now
 * (one replaced meanwhile reports its error late: the new one is fine). */
static bool write_failed_link(tcp_conn_t *t, uv_write_t *req, int status)
{
    return status < 0 && status != UV_ECANCELED && t->base.state == EN_CONN_READY && t->sock &&
           req->handle == (uv_stream_t *)&t->sock->tcp;
}

static void ack_written(uv_write_t *req, int status)
{
    tcp_conn_t *t = req->data;
    tcp_written(t->base.rail);
    t->ack_writing = false;
    if (status == 0 && t->base.state == EN_CONN_READY) ack_soon(t);
    /* A side that only acks (its reads paused on a frame with no receive
     * yet) learns of a dead socket here; it learned at its next frame. */
    if (write_failed_link(t, req, status)) move_link(t, uv_strerror(status));
}

static void on_ack(tcp_conn_t *t, uint64_t off)
{
    if (off > t->tx_end) {
        conn_close(t, COH_EPROTO, "acknowledged bytes never sent");
        return;
    }
    /* Any ACK (keepalives too) shows the link alive. */
    uint64_t now = bs_now_ns();
    t->t_progress_ns = now;
    en_rail_t *rail = t->base.rail;
    en_rail_progress(rail, now);
    if (off > t->tx_acked) {
        t->tx_acked = off;
        tx_reap(t);
    }
}

/* ---- reading ---- */

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    tcp_sock_t *s = h->data;
    if (s->phase == SK_HELLO || !s->conn) {
        /* Exactly the hello: nothing past it is read before it is checked. */
        buf->base = (char *)s->hello_in + s->hello_got;
        buf->len = EN_HELLO_SIZE - s->hello_got;
        return;
    }
    tcp_conn_t *t = s->conn;
    en_conn_t *c = &t->base;
    en_sink_t *k = &c->sink;
    if (c->rstate == EN_RD_PAYLOAD && t->s_start == t->s_end && k->mode == EN_SINK_COPY &&
        k->len - k->done >= DIRECT_MIN) {
        t->direct = true;
        buf->base = (char *)k->dst + k->done;
        buf->len = k->len - k->done;
        return;
    }
    t->direct = false;
    if (t->s_start > 0) {
        memmove(t->stage, t->stage + t->s_start, t->s_end - t->s_start);
        t->s_end -= t->s_start;
        t->s_start = 0;
    }
    buf->base = (char *)t->stage + t->s_end;
    buf->len = STAGE_CAP - t->s_end; /* 0 only while blocked: libuv reports ENOBUFS */
}

static void hello_written(uv_write_t *w, int status)
{
    tcp_sock_t *s = w->data;
    tcp_written(s->rail);
    if (status >= 0 || s->phase == SK_CLOSED) return;
    tcp_conn_t *t = s->conn;
    if (!t) {
        sock_close(s);
    } else if (t->base.state != EN_CONN_READY) {
        conn_close(t, bs_errno_status(status), uv_strerror(status));
    } else if (t->sock == s) {
        move_link(t, uv_strerror(status));
    } else if (t->dial == s) {
        sock_close(s);
        if (t->sock)
            unfreeze(t);
        else
            move_link(t, uv_strerror(status));
    }
}

static int send_hello(tcp_sock_t *s, bool resume, uint64_t resume_off, int via, uint64_t epoch)
{
    en_hello_t h;
    en_rail_fill_hello(s->rail, &h);
    if (resume) {
        h.flags = EN_HELLO_RESUME;
        h.resume_off = resume_off;
        h.via = (uint32_t)via;
        h.epoch = epoch;
    }
    en_hello_encode(&h, s->hello_out);
    uv_buf_t b = uv_buf_init((char *)s->hello_out, EN_HELLO_SIZE);
    s->hello_wreq.data = s;
    return tcp_write(s->rail, &s->hello_wreq, (uv_stream_t *)&s->tcp, &b, 1, hello_written);
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf);

static int sock_read(tcp_sock_t *s)
{
    return uv_read_start((uv_stream_t *)&s->tcp, on_alloc, on_read);
}

static void start_reading(tcp_conn_t *t)
{
    if (t->reading || t->frozen || t->base.state >= EN_CONN_CLOSING || !t->sock ||
        t->sock->phase != SK_LIVE)
        return;
    int e = sock_read(t->sock);
    if (e) {
        if (failover(t) && t->base.state == EN_CONN_READY)
            move_link(t, uv_strerror(e));
        else
            conn_close(t, bs_errno_status(e), uv_strerror(e));
        return;
    }
    t->reading = true;
}

static void stop_reading(tcp_conn_t *t)
{
    if (!t->reading) return;
    if (t->sock) uv_read_stop((uv_stream_t *)&t->sock->tcp);
    t->reading = false;
}

/* Stop consuming: a resume is being negotiated, and the count of consumed
 * bytes it sends must stay true. */
static void freeze(tcp_conn_t *t)
{
    stop_reading(t);
    t->frozen = true;
}

/* A probe that failed: go on with the socket we have. */
static void unfreeze(tcp_conn_t *t)
{
    if (!t->frozen) return;
    t->frozen = false;
    if (t->base.state != EN_CONN_READY) return;
    kick(t);
    if (t->base.rstate != EN_RD_BLOCKED) start_reading(t);
}

static const char *event_name(int kind)
{
    return kind == EN_RAIL_RETURN ? "back" : "moved";
}

/* The link is live on s (resume done on either side): send the kept frames
 * from where the peer stopped, and report the move. */
static void resumed(tcp_conn_t *t, tcp_sock_t *s, int via, uint64_t peer_off)
{
    en_rail_t *rail = t->base.rail;
    if (peer_off < t->tx_acked || peer_off > t->tx_end) {
        char why[160];
        snprintf(why, sizeof(why), "resume at byte %llu, outside the %llu..%llu not acknowledged",
                 (unsigned long long)peer_off, (unsigned long long)t->tx_acked,
                 (unsigned long long)t->tx_end);
        conn_close(t, COH_EPROTO, why);
        return;
    }
    double pause = (double)(bs_now_ns() - t->t_progress_ns) / 1e9;
    if (t->sock && t->sock != s) sock_close(t->sock);
    attach(t, s);
    s->phase = SK_LIVE;
    /* What the staging buffer holds beyond the consumed count comes again. */
    t->frozen = false;
    t->direct = false;
    t->s_start = t->s_end = 0;
    uv_timer_stop(&s->timer);
    int was = t->via;
    t->via = via;
    /* A link that left the interface (whichever side noticed) makes it
     * suspect for its siblings here. */
    if (was == rail->index && via != rail->index)
        rail->suspect_until_ns = bs_now_ns() + (uint64_t)rail->stall_ms * 10000000ull;
    t->tries = 0;
    t->t_fail0_ns = t->retry_at_ns = 0;
    t->t_probe_ns = bs_now_ns();
    t->replay_from = peer_off;
    t->replay_pending = true;
    t->t_progress_ns = bs_now_ns();
    if (t->old_closing == 0) replay(t);
    int kind = via == rail->index ? EN_RAIL_RETURN : EN_RAIL_FAILOVER;
    char why[224];
    snprintf(why, sizeof(why), "%s (was on the interface of rail %d)",
             t->why[0] ? t->why : event_name(kind), was);
    if (was != via || kind == EN_RAIL_FAILOVER)
        en_rail_event(rail, kind, t->base.peer, via, pause, why);
    t->why[0] = 0;
    /* Reading again; and a link paused on a frame whose receive was posted
     * while it was frozen (that kick found it frozen) delivers it now: it
     * waited for COHORT_TIMEOUT_MS. */
    kick(t);
}

static void on_hello(tcp_sock_t *s)
{
    en_rail_t *rail = s->rail;
    en_hello_t h;
    char why[BS_ERR_LEN];
    int r = en_hello_decode(s->hello_in, EN_HELLO_SIZE, &h);
    if (r < 0) {
        atomic_fetch_add(&rail->stat_rejected, 1);
        if (s->conn && !s->resume && s->conn->sock == s)
            conn_close(s->conn, COH_EPROTO, "malformed handshake");
        else
            sock_close(s);
        return;
    }
    r = en_rail_check_hello(rail, &h, !s->outgoing, why, sizeof(why));
    if (r == 0 && s->outgoing && (int)h.rank != s->expect_peer) {
        snprintf(why, sizeof(why), "dialled rank %d but rank %u answered", s->expect_peer, h.rank);
        r = COH_EPROTO;
    }
    if (r == 0 && s->resume != !!(h.flags & EN_HELLO_RESUME) && s->outgoing) {
        snprintf(why, sizeof(why), "the answer to a %s is not one", s->resume ? "resume" : "dial");
        r = COH_EPROTO;
    }
    if (r < 0) {
        atomic_fetch_add(&rail->stat_rejected, 1);
        tcp_conn_t *t = s->conn;
        if (t && !s->resume && t->base.state != EN_CONN_READY) {
            conn_close(t, r, why);
        } else {
            if (!s->outgoing)
                bs_log(COH_LOG_WARN, "rank %d rail %d: dropped an incoming connection: %s",
                       rail->rank, rail->index, why);
            sock_close(s);
        }
        return;
    }
    uv_timer_stop(&s->timer);
    if (h.flags & EN_HELLO_RESUME) {
        if (s->outgoing) {
            /* Our resume was answered. */
            tcp_conn_t *t = s->conn;
            if (!t || t->dial != s || h.epoch <= t->epoch) {
                sock_close(s);
                return;
            }
            t->dial = NULL;
            t->epoch = h.epoch;
            resumed(t, s, s->via, h.resume_off);
            return;
        }
        tcp_conn_t *t = (tcp_conn_t *)rail->peers[h.rank];
        /* A dial from before the link's last move (one abandoned when both
         * sides dialled) would resume from an old offset. */
        if (h.epoch < t->epoch || (t->dial && rail->rank < (int)h.rank)) {
            sock_close(s); /* both sides dialled: the lower rank's dial wins */
            return;
        }
        if (rail->test_drop_probe && t->sock && t->via != rail->index &&
            (int)h.via == rail->index) {
            rail->test_drop_probe = false; /* tests: a move back's dial, closed unanswered */
            sock_close(s);
            return;
        }
        if (t->dial) sock_close(t->dial);
        freeze(t);
        sock_bind(s, t);
        t->epoch = (h.epoch > t->epoch ? h.epoch : t->epoch) + 1;
        if (send_hello(s, true, t->rx_off, (int)h.via, t->epoch) != 0) {
            sock_close(s);
            if (!t->sock) move_link(t, "cannot answer a resume");
            return;
        }
        if (!t->why[0]) snprintf(t->why, sizeof(t->why), "rank %u moved the link", h.rank);
        resumed(t, s, (int)h.via, h.resume_off);
        return;
    }
    tcp_conn_t *t = s->conn;
    if (!t) {
        t = conn_new(rail);
        if (!t) {
            sock_close(s);
            return;
        }
        t->base.outgoing = false;
        attach(t, s);
    }
    en_conn_t *c = &t->base;
    c->peer = (int)h.rank;
    if (!c->outgoing && send_hello(s, false, 0, 0, 0) != 0) {
        conn_close(t, COH_ESYS, "could not answer the handshake");
        return;
    }
    s->phase = SK_LIVE;
    c->state = EN_CONN_READY;
    c->rstate = EN_RD_HDR;
    t->t_progress_ns = bs_now_ns();
    en_rail_conn_ready(rail, c);
    if (failover(t)) {
        /* A tenth of the stall time: a failure is seen at most 10% late. */
        uint64_t period = (uint64_t)rail->stall_ms / 10;
        if (period < 2) period = 2;
        uv_timer_start(&t->watch, watch_cb, period, period);
    }
    start_reading(t);
}

static void read_failed(tcp_conn_t *t, ssize_t nread)
{
    en_conn_t *c = &t->base;
    if (nread == UV_EOF && c->peer_bye) {
        conn_close(t, COH_EPEER, "peer finalized");
        return;
    }
    const char *why = nread == UV_EOF ? "connection closed by peer" : uv_strerror((int)nread);
    if (failover(t) && c->state == EN_CONN_READY && !c->rail->closing) {
        move_link(t, why);
        return;
    }
    conn_close(t, COH_EPEER, why);
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    (void)buf;
    tcp_sock_t *s = st->data;
    if (nread == 0 || nread == UV_ENOBUFS || s->phase == SK_CLOSED) return;
    en_rail_t *rail = s->rail;
    if (s->phase == SK_HELLO || s->phase == SK_CONNECTING) {
        if (nread < 0) {
            tcp_conn_t *t = s->conn;
            if (t && !s->resume && t->base.state != EN_CONN_READY)
                conn_close(t, COH_EPEER,
                           nread == UV_EOF ? "connection closed by peer" : uv_strerror((int)nread));
            else {
                sock_close(s);
                if (t && t->base.state == EN_CONN_READY && !t->sock && !t->dial)
                    move_link(t, "the resumed connection closed");
            }
            return;
        }
        s->hello_got += (size_t)nread;
        /* Reject garbage as soon as the magic is wrong. */
        en_hello_t h;
        if (en_hello_decode(s->hello_in, s->hello_got, &h) < 0) {
            atomic_fetch_add(&rail->stat_rejected, 1);
            if (s->conn && !s->resume && s->conn->base.state != EN_CONN_READY)
                conn_close(s->conn, COH_EPROTO, "malformed handshake");
            else
                sock_close(s);
            return;
        }
        if (s->hello_got == EN_HELLO_SIZE) {
            uv_read_stop(st);
            on_hello(s);
        }
        return;
    }
    tcp_conn_t *t = s->conn;
    if (!t || t->sock != s || t->frozen) return;
    en_conn_t *c = &t->base;
    if (c->state >= EN_CONN_CLOSING) return;
    if (nread < 0) {
        read_failed(t, nread);
        return;
    }
    c->bytes_in += (uint64_t)nread;
    atomic_fetch_add_explicit(&rail->stat_bytes_in, (uint64_t)nread, memory_order_relaxed);
    /* The peer's ACKs travel behind its own frames: while those arrive the
     * link moves, however long its ACKs queue (watch_cb). */
    t->t_progress_ns = bs_now_ns();
    if (t->direct) {
        t->direct = false;
        c->sink.done += (uint64_t)nread;
        t->rx_off += (uint64_t)nread;
        if (c->sink.done == c->sink.len) {
            c->rstate = EN_RD_HDR;
            en_exec_recv_done(rail, c);
        }
        if (c->state == EN_CONN_READY) kick(t);
        ack_soon(t);
        return;
    }
    t->s_end += (size_t)nread;
    kick(t);
    ack_soon(t);
}

/* Find where the frame whose header c holds goes. False when reading must
 * stop here: the connection closed (a refused frame), or the frame waits for
 * its receive (paused). */
static bool match(tcp_conn_t *t)
{
    en_conn_t *c = &t->base;
    int m = en_conn_match(c);
    if (c->state != EN_CONN_READY) return false;
    if (m < 0) conn_close(t, m, "frame refused");
    if (m == EN_MATCH_BLOCK) stop_reading(t);
    return m == EN_MATCH_OK;
}

/* Parse and deliver what the staging buffer holds. */
static void process(tcp_conn_t *t)
{
    en_conn_t *c = &t->base;
    en_rail_t *rail = c->rail;
    for (;;) {
        if (c->state != EN_CONN_READY || t->frozen) return;
        if (c->rstate == EN_RD_BLOCKED && !match(t)) return;
        size_t avail = t->s_end - t->s_start;
        if (c->rstate == EN_RD_HDR) {
            if (avail == 0) break;
            int r = en_hdr_decode(t->stage + t->s_start, avail, &c->hdr);
            if (r == 0) break;
            if (r < 0) {
                atomic_fetch_add(&rail->stat_bad_frames, 1);
                conn_close(t, COH_EPROTO, "malformed frame header");
                return;
            }
            t->s_start += EN_HDR_SIZE;
            avail -= EN_HDR_SIZE;
            if (c->hdr.type == EN_FRAME_ACK) {
                if (!failover(t)) {
                    atomic_fetch_add(&rail->stat_bad_frames, 1);
                    conn_close(t, COH_EPROTO, "ACK on a link without failover");
                    return;
                }
                on_ack(t, c->hdr.off);
                continue;
            }
            if (failover(t) && c->hdr.off != t->rx_off) {
                atomic_fetch_add(&rail->stat_bad_frames, 1);
                conn_close(t, COH_EPROTO, "a frame out of its place in the stream");
                return;
            }
            t->rx_off += EN_HDR_SIZE;
            if (c->hdr.len > EN_TX_COPY_MAX) t->rx_big_end = t->rx_off + c->hdr.len;
            if (!match(t)) return;
        }
        /* EN_RD_PAYLOAD */
        en_sink_t *s = &c->sink;
        uint64_t need = s->len - s->done;
        if (need > 0) {
            size_t n = avail < need ? avail : (size_t)need;
            if (s->mode == EN_SINK_REDUCE) {
                n -= n % s->esize;
                /* Kernels load elements directly: keep the payload aligned. */
                if (n && ((uintptr_t)(t->stage + t->s_start) % s->esize) != 0) {
                    memmove(t->stage, t->stage + t->s_start, avail);
                    t->s_end = avail;
                    t->s_start = 0;
                }
            }
            if (n) {
                en_sink_consume(s, t->stage + t->s_start, n);
                t->s_start += n;
                t->rx_off += n;
            }
            if (s->done < s->len) break;
        }
        c->rstate = EN_RD_HDR;
        en_exec_recv_done(rail, c);
    }
    if (t->s_start == t->s_end) t->s_start = t->s_end = 0;
    if (c->state == EN_CONN_READY && c->rstate != EN_RD_BLOCKED) start_reading(t);
}

/* Callbacks can reach back into a connection that is already processing
 * (a receive completes, the next step posts a receive on the same peer):
 * run once more instead of nesting. */
static void kick(tcp_conn_t *t)
{
    if (t->kicking) {
        t->kick_again = true;
        return;
    }
    t->kicking = true;
    do {
        t->kick_again = false;
        process(t);
    } while (t->kick_again && t->base.state == EN_CONN_READY);
    t->kicking = false;
}

/* ---- moving a link ---- */

static void on_connect(uv_connect_t *req, int status);
static void dial_timeout(uv_timer_t *h);
static void late_connect(uv_timer_t *h);
static void next_dial(tcp_conn_t *t, bool refused);

/* How long a resume dial may take: a link that is down drops the SYN. */
static uint64_t dial_ms(const en_rail_t *rail)
{
    uint64_t ms = (uint64_t)rail->stall_ms * 4;
    return ms < 200 ? 200 : ms;
}

/* Dial peer's listener of this rail through interface via, to resume. */
static int dial_resume(tcp_conn_t *t, int via)
{
    en_rail_t *rail = t->base.rail;
    struct sockaddr_storage to;
    if (!en_rail_route(rail, t->base.peer, via, &to)) return COH_EINVAL;
    tcp_sock_t *s = sock_new(rail);
    if (!s) return COH_ENOMEM;
    s->outgoing = true;
    s->resume = true;
    s->via = via;
    s->expect_peer = t->base.peer;
    sock_bind(s, t);
    struct sockaddr_storage local = rail->locals[via];
    en_sa_set_port(&local, 0);
    int e = uv_tcp_bind(&s->tcp, (struct sockaddr *)&local, 0);
    s->creq.data = s;
    s->to = to;
    bool late = rail->test_resume_delay_ms > 0 && rail->rank < t->base.peer;
    if (!e && !late) e = uv_tcp_connect(&s->creq, &s->tcp, (struct sockaddr *)&to, on_connect);
    if (e) {
        sock_close(s);
        return bs_errno_status(e);
    }
    t->dial = s;
    t->t_dial_ns = bs_now_ns();
    if (late)
        uv_timer_start(&s->timer, late_connect, (uint64_t)rail->test_resume_delay_ms, 0);
    else
        uv_timer_start(&s->timer, dial_timeout, dial_ms(rail), 0);
    return 0;
}

/* COHORT_TEST_RESUME_DELAY_MS: the dial connects now (tests only). */
static void late_connect(uv_timer_t *h)
{
    tcp_sock_t *s = h->data;
    tcp_conn_t *t = s->conn;
    int e = uv_tcp_connect(&s->creq, &s->tcp, (struct sockaddr *)&s->to, on_connect);
    if (e) {
        sock_close(s);
        if (t && t->base.state == EN_CONN_READY && !t->sock && !t->dial) next_dial(t, false);
        return;
    }
    uv_timer_start(&s->timer, dial_timeout, dial_ms(s->rail), 0);
}

/* Try the next interface, own one last. The peer is gone when a dial is
 * refused (its host answers and nothing listens: the process is dead), or
 * when every interface has failed twice and as long as 2 x nrails dials
 * that time out take. A dial that fails fast does not shorten that: one
 * the peer turns away because it is dialling us (the lower rank's dial
 * wins), or one through an interface that is down. After such a failure
 * the next dial waits out the dial time (watch_cb starts it), which also
 * gives the peer's own dial time to land: a burst of fast refusals used to
 * end a live link in milliseconds ("no interface reaches", cluster.load
 * and cluster.rails.nics3 in CI). */
static void next_dial(tcp_conn_t *t, bool refused)
{
    en_rail_t *rail = t->base.rail;
    int n = rail->nrails;
    uint64_t now = bs_now_ns(), dial = dial_ms(rail) * 1000000ull;
    if (!t->t_fail0_ns) t->t_fail0_ns = now;
    bool spent = false;
    if (!refused) {
        if (t->tries > 0 && now - t->t_dial_ns < dial) { /* the last one failed fast */
            t->retry_at_ns = t->t_dial_ns + dial;
            return;
        }
        t->retry_at_ns = 0;
        for (int i = 0; i < n; i++) { /* interfaces that fail at once: the next one */
            spent = t->tries >= 2 * n && now - t->t_fail0_ns >= (uint64_t)(2 * n) * dial;
            if (spent) break;
            int k = t->tries++;
            int via = (rail->index + 1 + k % n) % n;
            if (dial_resume(t, via) == 0) return;
        }
        if (!spent) {
            t->retry_at_ns = now + dial;
            return;
        }
    }
    char why[BS_ERR_LEN];
    snprintf(why, sizeof(why), "no interface reaches rank %d (%s)", t->base.peer,
             t->why[0] ? t->why : "link failed");
    en_rail_event(rail, EN_RAIL_GONE, t->base.peer, -1, 0, why);
    conn_close(t, COH_EPEER, why);
}

static void dial_timeout(uv_timer_t *h)
{
    tcp_sock_t *s = h->data;
    tcp_conn_t *t = s->conn;
    sock_close(s);
    if (!t || t->base.state != EN_CONN_READY) return;
    if (t->sock) {
        unfreeze(t); /* a probe that did not answer: stay where we are */
        return;
    }
    next_dial(t, false);
}

/* The link's socket failed or stalled: move it to another interface. */
static void move_link(tcp_conn_t *t, const char *why)
{
    if (t->base.state != EN_CONN_READY) return;
    en_rail_t *rail = t->base.rail;
    if (t->via == rail->index)
        rail->suspect_until_ns = bs_now_ns() + (uint64_t)rail->stall_ms * 10000000ull;
    if (!t->why[0]) snprintf(t->why, sizeof(t->why), "%s", why);
    freeze(t);
    if (t->sock) sock_close(t->sock);
    if (t->dial) return; /* already dialling */
    next_dial(t, false);
}

static void watch_cb(uv_timer_t *h)
{
    tcp_conn_t *t = h->data;
    en_conn_t *c = &t->base;
    en_rail_t *rail = c->rail;
    if (c->state != EN_CONN_READY || rail->closing) return;
    uint64_t now = bs_now_ns(), stall = (uint64_t)rail->stall_ms * 1000000ull;
    /* Moving: dial timeouts drive it, and this the dial after a fast
     * failure, or after a dial whose answer was turned down (no socket, no
     * dial: nothing else would). */
    if (!t->sock && !t->dial && (!t->retry_at_ns || now >= t->retry_at_ns)) {
        next_dial(t, false);
        return;
    }
    /* Frozen with a socket and no dial: a probe that ended other than by
     * its timeout or a failed write (closed by the peer, its answer refused
     * or stale). Frozen, the link read nothing and probed no more (never
     * back; ops on it waited for their timeout). */
    if (t->sock && t->frozen && !t->dial) unfreeze(t);
    if (!t->sock || t->frozen) return;
    /* Every live link acks now and then, paused or idle: a link is taken
     * for dead only when its ACKs stop while another rail's go on. */
    uint64_t period = stall / 8;
    if (t->rx_off != t->ack_sent || now - t->t_ack_ns >= period) send_ack(t, true);
    bool waiting = t->tx_head && t->tx_acked < t->tx_end;
    /* The peer's ACKs come behind its frames: while those still arrive
     * (on_read counts every read as progress) the ACKs' silence says
     * nothing about the link. Halving-doubling over two shaped rails sends
     * both ways at once; judged by ACKs alone, links failed over and back
     * 538-590 times in 70 s and the ops never came back to speed. (Not
     * judging a link this side had stopped reading hid a cut link:
     * cluster.rails.failover.hd saw no failover for a soft cut.) */
    if (!waiting) t->t_progress_ns = now;
    /* Once one link of this rail failed on its interface, the interface is
     * suspect for a while: a sibling waiting on it for ACKs moves after half
     * the stall time, so a NIC that dies under several links does not cost
     * each of them a whole stall time in turn. */
    bool suspect = now < rail->suspect_until_ns && t->via == rail->index;
    uint64_t limit = suspect ? stall / 2 : stall;
    bool stalled = waiting && now - t->t_progress_ns >= limit;
    if (stalled && !t->dial) {
        /* Only a link that stalls while another rail moves is at fault; when
         * every rail stalls the peer is (op timeouts and liveness judge it). */
        if (en_rail_others_progress(rail, now)) {
            char why[96];
            snprintf(why, sizeof(why), "no progress for %.0f ms%s",
                     (double)(now - t->t_progress_ns) / 1e6,
                     suspect ? " (another link on the interface failed)" : "");
            move_link(t, why);
            return;
        }
    }
    /* Off its interface: the lower rank tries it again now and then. */
    if (t->via != rail->index && rail->rank < c->peer && !t->dial &&
        now - t->t_probe_ns >= (uint64_t)rail->probe_ms * 1000000ull) {
        t->t_probe_ns = now;
        snprintf(t->why, sizeof(t->why), "its interface answers again");
        if (dial_resume(t, rail->index) != 0) t->why[0] = 0;
    }
}

/* ---- closing ---- */

static void conn_close(tcp_conn_t *t, int status, const char *why)
{
    en_conn_t *c = &t->base;
    if (c->state >= EN_CONN_CLOSING) return;
    int was = c->state;
    c->state = EN_CONN_CLOSING;
    stop_reading(t);
    if (t->sock) sock_close(t->sock);
    if (t->dial) sock_close(t->dial);
    /* The rail forgets the conn now; the memory goes in the close callback.
     * Kept frames whose writes were cancelled end there too. */
    en_rail_conn_lost(c->rail, c, was == EN_CONN_READY ? status : (status ? status : COH_EPROTO),
                      why);
    tx_fail_all(t, COH_ECANCELED);
    uv_close((uv_handle_t *)&t->watch, conn_freed);
}

static void hs_timeout(uv_timer_t *h)
{
    tcp_sock_t *s = h->data;
    atomic_fetch_add(&s->rail->stat_rejected, 1);
    if (s->conn && !s->resume && s->conn->base.state != EN_CONN_READY) {
        char why[96];
        snprintf(why, sizeof(why), "no handshake in time (%s rank %d, %s)",
                 s->outgoing ? "dialling" : "dialled by", s->expect_peer,
                 s->phase == SK_CONNECTING ? "not connected" : "connected");
        conn_close(s->conn, COH_ETIMEDOUT, why);
    } else
        sock_close(s);
}

/* ---- accepting and dialling ---- */

static void free_handle(uv_handle_t *h)
{
    coh_free(h);
}

void en_drop_accept(uv_stream_t *server)
{
    uv_tcp_t *t = coh_malloc(sizeof(*t));
    if (t && uv_tcp_init(server->loop, t) == 0) {
        uv_accept(server, (uv_stream_t *)t);
        uv_close((uv_handle_t *)t, free_handle);
    } else {
        coh_free(t);
    }
}

static void on_connection(uv_stream_t *server, int status)
{
    tcp_tr_t *tr = server->data;
    en_rail_t *rail = tr->rail;
    if (status < 0) {
        bs_log(COH_LOG_WARN, "rail %d: accept failed: %s", rail->index, uv_strerror(status));
        return;
    }
    tcp_sock_t *s = sock_new(rail);
    if (!s) {
        en_drop_accept(server); /* so it does not linger on the backlog */
        return;
    }
    if (uv_accept(server, (uv_stream_t *)&s->tcp) != 0) {
        sock_close(s);
        return;
    }
    set_socket_options(rail, s);
    s->phase = SK_HELLO;
    s->outgoing = false;
    uv_timer_start(&s->timer, hs_timeout, HANDSHAKE_MS, 0);
    if (sock_read(s) != 0) sock_close(s);
}

static void on_connect(uv_connect_t *req, int status)
{
    tcp_sock_t *s = req->data;
    if (s->phase == SK_CLOSED) return;
    tcp_conn_t *t = s->conn;
    if (status < 0) {
        if (t && s->resume) {
            sock_close(s);
            if (t->base.state == EN_CONN_READY && !t->sock && !t->dial)
                next_dial(t, status == UV_ECONNREFUSED);
            return;
        }
        if (t) conn_close(t, COH_EPEER, uv_strerror(status));
        return;
    }
    set_socket_options(s->rail, s);
    s->phase = SK_HELLO;
    if (!s->resume) uv_timer_start(&s->timer, hs_timeout, HANDSHAKE_MS, 0);
    /* A resume's offset must be final: stop consuming on the old socket. */
    if (s->resume) freeze(t);
    int e = send_hello(s, s->resume, s->resume ? t->rx_off : 0, s->via, s->resume ? t->epoch : 0);
    if (!e) e = sock_read(s);
    if (e) {
        if (s->resume) {
            sock_close(s);
            if (t->sock)
                unfreeze(t);
            else
                next_dial(t, false);
        } else {
            conn_close(t, bs_errno_status(e), uv_strerror(e));
        }
    }
}

static void listener_closed(uv_handle_t *h)
{
    coh_free(h->data);
}

static int tcp_listen(en_rail_t *rail, const struct sockaddr *addr, struct sockaddr_storage *bound)
{
    tcp_tr_t *tr = coh_zalloc(sizeof(*tr));
    if (!tr) return COH_ENOMEM;
    tr->rail = rail;
    uv_tcp_init(rail->loop, &tr->listen);
    tr->listen.data = tr;
    struct sockaddr_storage at;
    en_rail_listen_at(rail, addr, &at);
    int e = uv_tcp_bind(&tr->listen, (struct sockaddr *)&at, 0); /* IPv6: dual stack */
    if (!e) e = uv_listen((uv_stream_t *)&tr->listen, 1024, on_connection);
    if (e) {
        uv_close((uv_handle_t *)&tr->listen, listener_closed);
        return bs_fail(bs_errno_status(e), "rail %d: listen: %s", rail->index, uv_strerror(e));
    }
    int len = sizeof(*bound);
    uv_tcp_getsockname(&tr->listen, (struct sockaddr *)bound, &len);
    en_rail_listen_named(addr, bound);
    rail->listener = tr;
    return 0;
}

static int tcp_connect(en_rail_t *rail, int peer, const struct sockaddr *addr)
{
    tcp_conn_t *t = conn_new(rail);
    if (!t) return COH_ENOMEM;
    tcp_sock_t *s = sock_new(rail);
    if (!s) {
        t->base.state = EN_CONN_CLOSING;
        uv_close((uv_handle_t *)&t->watch, conn_freed);
        return COH_ENOMEM;
    }
    t->base.outgoing = true;
    t->base.state = EN_CONN_CONNECTING;
    s->outgoing = true;
    s->phase = SK_CONNECTING;
    s->expect_peer = peer;
    attach(t, s);
    /* Leave through the configured interface, not whatever the route picks. */
    struct sockaddr_storage local = rail->local;
    en_sa_set_port(&local, 0);
    int e = uv_tcp_bind(&s->tcp, (struct sockaddr *)&local, 0);
    s->creq.data = s;
    if (!e) e = uv_tcp_connect(&s->creq, &s->tcp, addr, on_connect);
    if (e) {
        t->base.state = EN_CONN_CLOSING;
        sock_close(s);
        uv_close((uv_handle_t *)&t->watch, conn_freed);
        return bs_fail(bs_errno_status(e), "rail %d: connect to rank %d: %s", rail->index, peer,
                       uv_strerror(e));
    }
    uv_timer_start(&s->timer, hs_timeout, HANDSHAKE_MS, 0);
    return 0;
}

/* ---- writing ---- */

static void on_write(uv_write_t *req, int status)
{
    en_wreq_t *w = req->data;
    en_conn_t *c = w->conn;
    tcp_conn_t *t = (tcp_conn_t *)c;
    tcp_written(c->rail);
    c->writes_out--;
    if (status == 0) count_sent(c, w);
    if (!failover(t)) {
        w->done(w, status ? bs_errno_status(status) : 0);
        return;
    }
    w->tx_writing = false;
    if (status == 0) kept_written(t, w);
    if (c->state >= EN_CONN_CLOSING) {
        /* The link is gone: its kept frames end now (this one last written). */
        en_wreq_t **pp = &t->tx_head, *prev = NULL;
        while (*pp && *pp != w) {
            prev = *pp;
            pp = &(*pp)->tx_next;
        }
        if (*pp == w) {
            *pp = w->tx_next;
            if (t->tx_tail == w) t->tx_tail = prev;
            w->tx_next = NULL;
            tx_finish(w, COH_ECANCELED);
        }
        return;
    }
    if (write_failed_link(t, req, status)) move_link(t, uv_strerror(status));
    tx_reap(t);
}

static int tcp_send(en_conn_t *c, en_wreq_t *w)
{
    tcp_conn_t *t = (tcp_conn_t *)c;
    if (c->state != EN_CONN_READY) return COH_EPEER;
    w->conn = c;
    if (!failover(t)) {
        uv_buf_t bufs[2] = {{.base = (char *)w->hdr, .len = EN_HDR_SIZE},
                            {.base = (char *)w->payload, .len = (size_t)w->len}};
        unsigned nbufs = w->len ? 2 : 1;
        /* A frame the socket takes whole ends here: through uv_write its
         * callback waited for the loop's next pass, and libuv re-armed the
         * socket's epoll entry (one epoll_ctl per frame). */
        if (w->done_inline) write_now(t, bufs, &nbufs);
        if (nbufs == 0) {
            count_sent(c, w);
            w->done(w, 0);
            return 0;
        }
        w->tr.tcp.data = w;
        int e = tcp_write(c->rail, &w->tr.tcp, (uv_stream_t *)&t->sock->tcp, bufs, nbufs, on_write);
        if (e) return bs_errno_status(e);
        c->writes_out++;
        return 0;
    }
    en_wreq_t *k = w;
    if (!w->op || w->len <= EN_TX_COPY_MAX) {
        /* A control frame is freed once sent: keep a copy until acknowledged.
         * So is every small frame, whose send then ends once written, not at
         * the peer's ACK: 2 ranks, 4 KiB over two rails waited for the ACK
         * after their own data had come (the peer acks these late: ack_soon). */
        size_t extra = w->len > sizeof(k->ctl) ? (size_t)w->len : 0;
        k = coh_malloc(sizeof(*k) + extra);
        if (!k) return COH_ENOMEM;
        memcpy(k->hdr, w->hdr, EN_HDR_SIZE);
        k->payload = extra ? (const uint8_t *)(k + 1) : k->ctl;
        if (w->len) memcpy((uint8_t *)k->payload, w->payload, (size_t)w->len);
        k->len = w->len;
        k->op = NULL;
        k->done_inline = false;
        k->tx_own = true;
        k->tx_orig = w;
    } else {
        k->tx_own = false;
        k->tx_orig = NULL;
    }
    k->conn = c;
    k->tx_next = NULL;
    k->tx_writing = false;
    k->tx_off = t->tx_end;
    t->tx_end += wlen(k);
    /* Every frame names its place in the stream: a receiver that is not
     * there refuses it before a byte of it is applied. */
    en_put64(k->hdr + 32, k->tx_off);
    if (!t->tx_head || t->tx_acked >= k->tx_off) t->t_progress_ns = bs_now_ns();
    if (t->tx_tail)
        t->tx_tail->tx_next = k;
    else
        t->tx_head = k;
    t->tx_tail = k;
    /* While the link moves, the replay writes it. */
    if (t->sock && t->sock->phase == SK_LIVE && !t->replay_pending) {
        int e = issue(t, k, k->tx_off);
        if (e < 0) move_link(t, uv_strerror(e));
    }
    return 0;
}

static void tcp_resume(en_conn_t *c)
{
    tcp_conn_t *t = (tcp_conn_t *)c;
    if (c->state == EN_CONN_READY && c->rstate == EN_RD_BLOCKED) kick(t);
}

static void tcp_cut(en_conn_t *c)
{
    tcp_conn_t *t = (tcp_conn_t *)c;
    uv_os_fd_t fd;
    if (t->sock && uv_fileno((uv_handle_t *)&t->sock->tcp, &fd) == 0) shutdown(fd, SHUT_RDWR);
}

static void tcp_close(en_conn_t *c, int status, const char *why)
{
    conn_close((tcp_conn_t *)c, status, why);
}

static void tcp_shutdown(en_rail_t *rail)
{
    tcp_tr_t *tr = rail->listener;
    for (en_conn_t *c = rail->all; c; c = c->all_next)
        if (c->ops == rail->ops) conn_close((tcp_conn_t *)c, COH_ECANCELED, "rail stopping");
    if (tr) {
        /* Detach them all first: they free themselves in any order. */
        tcp_sock_t *s = tr->socks;
        tr->socks = NULL;
        while (s) {
            tcp_sock_t *n = s->next;
            s->prev = s->next = NULL;
            sock_close(s);
            s = n;
        }
        uv_close((uv_handle_t *)&tr->listen, listener_closed);
        rail->listener = NULL;
    }
}

const en_transport_ops_t en_tcp_ops = {
    .name = "tcp",
    .tr_listen = tcp_listen,
    .tr_connect = tcp_connect,
    .tr_send = tcp_send,
    .tr_resume = tcp_resume,
    .tr_close = tcp_close,
    .tr_shutdown = tcp_shutdown,
    .tr_cut = tcp_cut,
};
