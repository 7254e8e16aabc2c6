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
 * Threading: every function here runs on the rail's loop thread.
 */
#include <netinet/in.h>
#include <string.h>

#include "engines/engine.h"

#define STAGE_CAP    (256 * 1024)
#define DIRECT_MIN   (16 * 1024) /* copy payloads from here up are read in place */
#define HANDSHAKE_MS 10000

typedef struct tcp_conn {
    en_conn_t base; /* first member */
    uv_tcp_t tcp;
    uv_timer_t hs_timer;
    uv_connect_t creq;
    uv_write_t hello_wreq;
    uint8_t hello_out[EN_HELLO_SIZE];
    uint8_t hello_in[EN_HELLO_SIZE];
    size_t hello_got;
    int expect_peer; /* outgoing: the rank dialled */
    int handles;     /* open uv handles; the conn is freed when it reaches 0 */
    bool reading;
    bool direct; /* the pending read goes straight into the sink */
    bool kicking, kick_again;
    uint8_t *stage;
    size_t s_start, s_end;
} tcp_conn_t;

typedef struct tcp_listener {
    uv_tcp_t tcp;
    en_rail_t *rail;
} tcp_listener_t;

static void conn_close(tcp_conn_t *t, int status, const char *why);
static void kick(tcp_conn_t *t);

static void unlink_conn(en_conn_t *c)
{
    en_rail_t *rail = c->rail;
    if (c->all_prev)
        c->all_prev->all_next = c->all_next;
    else if (rail->all == c)
        rail->all = c->all_next;
    if (c->all_next) c->all_next->all_prev = c->all_prev;
    c->all_prev = c->all_next = NULL;
}

static void handle_closed(uv_handle_t *h)
{
    tcp_conn_t *t = h->data;
    if (--t->handles == 0) {
        unlink_conn(&t->base);
        coh_free(t->stage);
        coh_free(t);
    }
}

static void set_socket_options(en_rail_t *rail, tcp_conn_t *t)
{
    /* Frames are written whole (header + payload in one writev): Nagle would
     * only delay the small ones. */
    uv_tcp_nodelay(&t->tcp, 1);
    if (rail->sockbuf_bytes) {
        int v = (int)rail->sockbuf_bytes;
        uv_send_buffer_size((uv_handle_t *)&t->tcp, &v);
        v = (int)rail->sockbuf_bytes;
        uv_recv_buffer_size((uv_handle_t *)&t->tcp, &v);
    }
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
    t->base.peer = -1;
    t->expect_peer = -1;
    if (uv_tcp_init(rail->loop, &t->tcp) != 0) {
        coh_free(t->stage);
        coh_free(t);
        return NULL;
    }
    t->tcp.data = t;
    uv_timer_init(rail->loop, &t->hs_timer);
    t->hs_timer.data = t;
    t->handles = 2;
    t->base.all_next = rail->all;
    if (rail->all) rail->all->all_prev = &t->base;
    rail->all = &t->base;
    return t;
}

static void start_reading(tcp_conn_t *t);

/* ---- reading ---- */

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    tcp_conn_t *t = h->data;
    en_conn_t *c = &t->base;
    if (c->state == EN_CONN_HANDSHAKE) {
        /* Exactly the hello: nothing past it is read before it is checked. */
        buf->base = (char *)t->hello_in + t->hello_got;
        buf->len = EN_HELLO_SIZE - t->hello_got;
        return;
    }
    en_sink_t *s = &c->sink;
    if (c->rstate == EN_RD_PAYLOAD && t->s_start == t->s_end && s->mode == EN_SINK_COPY &&
        s->len - s->done >= DIRECT_MIN) {
        t->direct = true;
        buf->base = (char *)s->dst + s->done;
        buf->len = s->len - s->done;
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
    tcp_conn_t *t = w->data;
    if (status < 0 && t->base.state < EN_CONN_CLOSING)
        conn_close(t, bs_errno_status(status), uv_strerror(status));
}

static int send_hello(tcp_conn_t *t)
{
    en_hello_t h;
    en_rail_fill_hello(t->base.rail, &h);
    en_hello_encode(&h, t->hello_out);
    uv_buf_t b = uv_buf_init((char *)t->hello_out, EN_HELLO_SIZE);
    t->hello_wreq.data = t;
    return uv_write(&t->hello_wreq, (uv_stream_t *)&t->tcp, &b, 1, hello_written);
}

static void on_hello(tcp_conn_t *t)
{
    en_conn_t *c = &t->base;
    en_rail_t *rail = c->rail;
    en_hello_t h;
    char why[BS_ERR_LEN];
    int r = en_hello_decode(t->hello_in, EN_HELLO_SIZE, &h);
    if (r < 0) {
        atomic_fetch_add(&rail->stat_rejected, 1);
        conn_close(t, COH_EPROTO, "malformed handshake");
        return;
    }
    r = en_rail_check_hello(rail, &h, !c->outgoing, why, sizeof(why));
    if (r == 0 && c->outgoing && (int)h.rank != t->expect_peer) {
        snprintf(why, sizeof(why), "dialled rank %d but rank %u answered", t->expect_peer, h.rank);
        r = COH_EPROTO;
    }
    if (r < 0) {
        atomic_fetch_add(&rail->stat_rejected, 1);
        conn_close(t, r, why);
        return;
    }
    uv_timer_stop(&t->hs_timer);
    c->peer = (int)h.rank;
    if (!c->outgoing && send_hello(t) != 0) {
        conn_close(t, COH_ESYS, "could not answer the handshake");
        return;
    }
    c->state = EN_CONN_READY;
    c->rstate = EN_RD_HDR;
    en_rail_conn_ready(rail, c);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    (void)buf;
    tcp_conn_t *t = s->data;
    en_conn_t *c = &t->base;
    if (nread == 0 || nread == UV_ENOBUFS) return;
    if (c->state >= EN_CONN_CLOSING) return;
    if (nread < 0) {
        if (nread == UV_EOF && c->peer_bye)
            conn_close(t, COH_EPEER, "peer finalized");
        else
            conn_close(t, COH_EPEER,
                       nread == UV_EOF ? "connection closed by peer" : uv_strerror((int)nread));
        return;
    }
    c->bytes_in += (uint64_t)nread;
    atomic_fetch_add_explicit(&c->rail->stat_bytes_in, (uint64_t)nread, memory_order_relaxed);
    if (c->state == EN_CONN_HANDSHAKE) {
        t->hello_got += (size_t)nread;
        /* Reject garbage as soon as the magic is wrong. */
        en_hello_t h;
        if (en_hello_decode(t->hello_in, t->hello_got, &h) < 0) {
            atomic_fetch_add(&c->rail->stat_rejected, 1);
            conn_close(t, COH_EPROTO, "malformed handshake");
            return;
        }
        if (t->hello_got == EN_HELLO_SIZE) on_hello(t);
        return;
    }
    if (t->direct) {
        t->direct = false;
        c->sink.done += (uint64_t)nread;
        if (c->sink.done == c->sink.len) {
            c->rstate = EN_RD_HDR;
            en_exec_recv_done(c->rail, c);
        }
        if (c->state == EN_CONN_READY) kick(t);
        return;
    }
    t->s_end += (size_t)nread;
    kick(t);
}

static void start_reading(tcp_conn_t *t)
{
    if (t->reading || t->base.state >= EN_CONN_CLOSING) return;
    int e = uv_read_start((uv_stream_t *)&t->tcp, on_alloc, on_read);
    if (e) {
        conn_close(t, bs_errno_status(e), uv_strerror(e));
        return;
    }
    t->reading = true;
}

static void stop_reading(tcp_conn_t *t)
{
    if (!t->reading) return;
    uv_read_stop((uv_stream_t *)&t->tcp);
    t->reading = false;
}

/* Find where the frame whose header c holds goes. False when reading must
 * stop here: the connection closed (a refused frame), or the frame waits for
 * its receive (paused). */
static bool match(tcp_conn_t *t)
{
    en_conn_t *c = &t->base;
    int m = en_exec_match(c->rail, c);
    if (c->state != EN_CONN_READY) return false;
    if (m < 0) {
        atomic_fetch_add(&c->rail->stat_bad_frames, 1);
        conn_close(t, m, "frame refused");
        return false;
    }
    if (m == EN_MATCH_BLOCK) {
        c->rstate = EN_RD_BLOCKED;
        stop_reading(t);
        return false;
    }
    c->rstate = EN_RD_PAYLOAD;
    return true;
}

/* Parse and deliver what the staging buffer holds. */
static void process(tcp_conn_t *t)
{
    en_conn_t *c = &t->base;
    en_rail_t *rail = c->rail;
    for (;;) {
        if (c->state != EN_CONN_READY) return;
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

/* ---- closing ---- */

static void conn_close(tcp_conn_t *t, int status, const char *why)
{
    en_conn_t *c = &t->base;
    if (c->state >= EN_CONN_CLOSING) return;
    int was = c->state;
    c->state = EN_CONN_CLOSING;
    stop_reading(t);
    uv_timer_stop(&t->hs_timer);
    /* The rail forgets the conn now; the memory goes in the close callbacks,
     * after libuv has cancelled the pending writes. */
    en_rail_conn_lost(c->rail, c, was == EN_CONN_READY ? status : (status ? status : COH_EPROTO),
                      why);
    uv_close((uv_handle_t *)&t->tcp, handle_closed);
    uv_close((uv_handle_t *)&t->hs_timer, handle_closed);
}

static void hs_timeout(uv_timer_t *h)
{
    tcp_conn_t *t = h->data;
    atomic_fetch_add(&t->base.rail->stat_rejected, 1);
    conn_close(t, COH_ETIMEDOUT, "no handshake in time");
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
    tcp_listener_t *l = server->data;
    en_rail_t *rail = l->rail;
    if (status < 0) {
        bs_log(COH_LOG_WARN, "rail %d: accept failed: %s", rail->index, uv_strerror(status));
        return;
    }
    tcp_conn_t *t = conn_new(rail);
    if (!t) {
        en_drop_accept(server); /* so it does not linger on the backlog */
        return;
    }
    if (uv_accept(server, (uv_stream_t *)&t->tcp) != 0) {
        t->base.state = EN_CONN_CLOSING;
        uv_close((uv_handle_t *)&t->tcp, handle_closed);
        uv_close((uv_handle_t *)&t->hs_timer, handle_closed);
        return;
    }
    set_socket_options(rail, t);
    t->base.state = EN_CONN_HANDSHAKE;
    t->base.outgoing = false;
    uv_timer_start(&t->hs_timer, hs_timeout, HANDSHAKE_MS, 0);
    start_reading(t);
}

static void on_connect(uv_connect_t *req, int status)
{
    tcp_conn_t *t = req->data;
    if (t->base.state >= EN_CONN_CLOSING) return;
    if (status < 0) {
        conn_close(t, COH_EPEER, uv_strerror(status));
        return;
    }
    set_socket_options(t->base.rail, t);
    t->base.state = EN_CONN_HANDSHAKE;
    int e = send_hello(t);
    if (e) {
        conn_close(t, bs_errno_status(e), uv_strerror(e));
        return;
    }
    start_reading(t);
}

static void listener_closed(uv_handle_t *h);

static int tcp_listen(en_rail_t *rail, const struct sockaddr *addr, struct sockaddr_storage *bound)
{
    tcp_listener_t *l = coh_zalloc(sizeof(*l));
    if (!l) return COH_ENOMEM;
    l->rail = rail;
    uv_tcp_init(rail->loop, &l->tcp);
    l->tcp.data = l;
    int e = uv_tcp_bind(&l->tcp, addr, 0);
    if (!e) e = uv_listen((uv_stream_t *)&l->tcp, 1024, on_connection);
    if (e) {
        uv_close((uv_handle_t *)&l->tcp, listener_closed);
        return bs_fail(bs_errno_status(e), "rail %d: listen: %s", rail->index, uv_strerror(e));
    }
    int len = sizeof(*bound);
    uv_tcp_getsockname(&l->tcp, (struct sockaddr *)bound, &len);
    rail->listener = l;
    return 0;
}

static int tcp_connect(en_rail_t *rail, int peer, const struct sockaddr *addr)
{
    tcp_conn_t *t = conn_new(rail);
    if (!t) return COH_ENOMEM;
    t->base.outgoing = true;
    t->base.state = EN_CONN_CONNECTING;
    t->expect_peer = peer;
    /* Leave through the configured interface, not whatever the route picks. */
    struct sockaddr_storage local = rail->local;
    if (local.ss_family == AF_INET)
        ((struct sockaddr_in *)&local)->sin_port = 0;
    else
        ((struct sockaddr_in6 *)&local)->sin6_port = 0;
    int e = uv_tcp_bind(&t->tcp, (struct sockaddr *)&local, 0);
    t->creq.data = t;
    if (!e) e = uv_tcp_connect(&t->creq, &t->tcp, addr, on_connect);
    if (e) {
        t->base.state = EN_CONN_CLOSING;
        uv_close((uv_handle_t *)&t->tcp, handle_closed);
        uv_close((uv_handle_t *)&t->hs_timer, handle_closed);
        return bs_fail(bs_errno_status(e), "rail %d: connect to rank %d: %s", rail->index, peer,
                       uv_strerror(e));
    }
    uv_timer_start(&t->hs_timer, hs_timeout, HANDSHAKE_MS, 0);
    return 0;
}

/* ---- writing ---- */

static void on_write(uv_write_t *req, int status)
{
    en_wreq_t *w = req->data;
    en_conn_t *c = w->conn;
    c->writes_out--;
    if (status == 0) {
        c->bytes_out += EN_HDR_SIZE + w->len;
        atomic_fetch_add_explicit(&c->rail->stat_bytes_out, EN_HDR_SIZE + w->len,
                                  memory_order_relaxed);
    }
    w->done(w, status ? bs_errno_status(status) : 0);
}

static int tcp_send(en_conn_t *c, en_wreq_t *w)
{
    tcp_conn_t *t = (tcp_conn_t *)c;
    if (c->state != EN_CONN_READY) return COH_EPEER;
    uv_buf_t bufs[2] = {{.base = (char *)w->hdr, .len = EN_HDR_SIZE},
                        {.base = (char *)w->payload, .len = (size_t)w->len}};
    w->conn = c;
    w->tr.tcp.data = w;
    int e = uv_write(&w->tr.tcp, (uv_stream_t *)&t->tcp, bufs, w->len ? 2 : 1, on_write);
    if (e) return bs_errno_status(e);
    c->writes_out++;
    return 0;
}

static void tcp_resume(en_conn_t *c)
{
    tcp_conn_t *t = (tcp_conn_t *)c;
    if (c->state == EN_CONN_READY && c->rstate == EN_RD_BLOCKED) kick(t);
}

static void tcp_close(en_conn_t *c, int status, const char *why)
{
    conn_close((tcp_conn_t *)c, status, why);
}

static void listener_closed(uv_handle_t *h)
{
    coh_free(h->data);
}

static void tcp_shutdown(en_rail_t *rail)
{
    tcp_listener_t *l = rail->listener;
    if (l) {
        uv_close((uv_handle_t *)&l->tcp, listener_closed);
        rail->listener = NULL;
    }
    for (en_conn_t *c = rail->all; c; c = c->all_next)
        conn_close((tcp_conn_t *)c, COH_ECANCELED, "rail stopping");
}

const en_transport_ops_t en_tcp_ops = {
    .name = "tcp",
    .tr_listen = tcp_listen,
    .tr_connect = tcp_connect,
    .tr_send = tcp_send,
    .tr_resume = tcp_resume,
    .tr_close = tcp_close,
    .tr_shutdown = tcp_shutdown,
};
