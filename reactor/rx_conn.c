/* A framed connection and its listener (see rx_conn.h). */
#include "reactor/rx_conn.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "reactor/reactor.h"

static void start_reading(rx_conn_t *c);

/* ---- life and death ---- */

static void handle_closed(uv_handle_t *h)
{
    rx_conn_t *c = h->data;
    if (--c->handles > 0) return;
    coh_free(c->buf);
    coh_free(c);
}

static void unlink_from_listener(rx_conn_t *c)
{
    rx_listener_t *l = c->listener;
    if (!l) return;
    if (c->prev)
        c->prev->next = c->next;
    else
        l->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    if (!c->ready) l->pending--;
    c->prev = c->next = NULL;
    c->listener = NULL;
}

static void close_handles(rx_conn_t *c)
{
    if (c->handles_closing) return;
    c->handles_closing = true;
    unlink_from_listener(c); /* a flushing one stayed on its list */
    uv_close((uv_handle_t *)&c->tcp, handle_closed);
    uv_close((uv_handle_t *)&c->hs_timer, handle_closed);
}

/* The owner's side of a close: after it, c is the transport's alone. A
 * connection that flushes first stays on its listener's list, so that
 * closing the listener (a reactor stopping) ends the flush too. */
static bool close_begin(rx_conn_t *c, int status, const char *why, bool flush)
{
    if (c->closing) return false;
    c->closing = true;
    if (!flush) unlink_from_listener(c);
    uv_read_stop((uv_stream_t *)&c->tcp);
    uv_timer_stop(&c->hs_timer);
    if (c->proto->on_close) c->proto->on_close(c, status, why);
    return true;
}

void rx_conn_close(rx_conn_t *c, int status, const char *why)
{
    if (close_begin(c, status, why, false)) close_handles(c);
}

/* Queued writes done (or failed, or cancelled by the close below). */
static void flushed(uv_shutdown_t *req, int status)
{
    (void)status;
    close_handles(req->handle->data);
}

static void flush_timeout(uv_timer_t *t)
{
    close_handles(t->data);
}

void rx_conn_close_flushed(rx_conn_t *c, int status, const char *why, unsigned ms)
{
    if (!close_begin(c, status, why, true)) return;
    /* The shutdown goes after the queued writes; its FIN tells the peer
     * the rest. A peer that reads nothing holds it up to ms. */
    if (!c->ready || uv_shutdown(&c->shut, (uv_stream_t *)&c->tcp, flushed) != 0) {
        close_handles(c);
        return;
    }
    uv_timer_start(&c->hs_timer, flush_timeout, ms, 0);
}

/* A connection refused at the handshake: counted on its listener (a peer
 * that hangs up before it says anything is not a refusal). */
static void refuse(rx_conn_t *c, int status, const char *why)
{
    if (c->listener && !c->closing) atomic_fetch_add(&c->listener->rejected, 1);
    rx_conn_close(c, status, why);
}

static void hs_timeout(uv_timer_t *t)
{
    refuse(t->data, COH_ETIMEDOUT, "no handshake in time");
}

static rx_conn_t *conn_new(uv_loop_t *loop, const rx_conn_proto_t *p, void *owner,
                           const char *token, int rank, int world)
{
    rx_conn_t *c = coh_zalloc(sizeof(*c));
    if (!c) return NULL;
    uv_tcp_init(loop, &c->tcp);
    uv_timer_init(loop, &c->hs_timer);
    c->tcp.data = c->hs_timer.data = c;
    c->handles = 2;
    c->proto = p;
    c->owner = owner;
    c->peer = -1;
    c->token = token;
    c->rank = rank;
    c->world = world;
    uv_timer_start(&c->hs_timer, hs_timeout, RX_CONN_HELLO_MS, 0);
    return c;
}

/* ---- writing ---- */

typedef struct wr {
    uv_write_t req;
    uint8_t data[];
} wr_t;

static void wrote(uv_write_t *req, int status)
{
    rx_conn_t *c = req->handle->data;
    coh_free(req->data);
    if (status >= 0 || status == UV_ECANCELED || c->closing) return;
    /* The peer closed while its last words wait unread here (a LOST that
     * excluded this rank, read after a stall): the reader takes them, then
     * the close. Nothing more is sent. */
    if (c->ready && c->reading && rx_conn_input_pending(c)) {
        c->wfailed = true;
        return;
    }
    rx_conn_close(c, bs_errno_status(status), uv_strerror(status));
}

int rx_conn_send(rx_conn_t *c, const void *bytes, size_t n)
{
    if (c->closing || c->wfailed) return COH_EPEER;
    wr_t *w = coh_malloc(sizeof(wr_t) + n);
    if (!w) return COH_ENOMEM;
    memcpy(w->data, bytes, n);
    w->req.data = w;
    uv_buf_t b = uv_buf_init((char *)w->data, (unsigned)n);
    int e = uv_write(&w->req, (uv_stream_t *)&c->tcp, &b, 1, wrote);
    if (e) {
        coh_free(w);
        return bs_errno_status(e);
    }
    return 0;
}

static int send_hello(rx_conn_t *c)
{
    en_hello_t h = {.version = EN_PROTO_VERSION,
                    .kind = c->proto->hello_kind,
                    .rank = (uint32_t)c->rank,
                    .world = (uint32_t)c->world,
                    .rail = c->listener ? c->listener->hello_rail : 0,
                    .flags = c->hello_flags};
    en_hello_set_token(&h, c->token);
    uint8_t b[EN_HELLO_SIZE];
    en_hello_encode(&h, b);
    return rx_conn_send(c, b, sizeof(b));
}

/* ---- reading ---- */

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    rx_conn_t *c = h->data;
    if (!c->ready) {
        /* Exactly the hello: nothing past it is read before it is checked. */
        buf->base = (char *)c->hello + c->hello_got;
        buf->len = EN_HELLO_SIZE - c->hello_got;
        return;
    }
    size_t limit = c->proto->max_msg + 4096;
    if (c->cap - c->len < 4096 && c->cap < limit) {
        size_t ncap = c->cap ? c->cap * 2 : 8192;
        if (ncap > limit) ncap = limit;
        uint8_t *nb = coh_realloc(c->buf, ncap);
        if (nb) {
            c->buf = nb;
            c->cap = ncap;
        }
    }
    buf->base = (char *)c->buf + c->len;
    buf->len = c->cap - c->len; /* 0 only when a message exceeds max_msg */
}

static void on_hello(rx_conn_t *c)
{
    en_hello_t h;
    const char *why = NULL;
    bool answer = false;
    if (en_hello_decode(c->hello, EN_HELLO_SIZE, &h) != EN_HELLO_SIZE)
        why = "malformed handshake";
    else if (!en_hello_token_ok(&h, c->token))
        why = "wrong job token";
    else if (h.kind != c->proto->hello_kind)
        why = "not a connection of this kind";
    else if ((int)h.world != c->world || (int)h.rank >= c->world) {
        why = "a rank of another world size";
        answer = !c->outgoing;
    }
    if (answer) {
        /* The token was right: our hello tells the peer what differs.
         * Counted first: the peer may look as soon as it has the answer. */
        if (c->listener) atomic_fetch_add(&c->listener->rejected, 1);
        send_hello(c);
        rx_conn_close(c, COH_EAUTH, why);
        return;
    }
    if (why) {
        refuse(c, COH_EAUTH, why);
        return;
    }
    if (!c->outgoing && send_hello(c) != 0) {
        rx_conn_close(c, COH_ESYS, "cannot answer the handshake");
        return;
    }
    uv_timer_stop(&c->hs_timer);
    c->peer = (int)h.rank;
    c->peer_flags = h.flags;
    c->ready = true;
    if (c->listener) c->listener->pending--;
    if (c->proto->on_ready) c->proto->on_ready(c);
}

/* Take whole messages off the buffer until it holds only part of one. */
static void parse_buffered(rx_conn_t *c)
{
    if (c->parsing) return; /* a handler resumed us: the outer loop goes on */
    c->parsing = true;
    size_t off = 0;
    while (!c->closing && off < c->len) {
        int n = c->proto->parse(c, c->buf + off, c->len - off);
        if (n == 0) break;
        if (n < 0) {
            char why[96];
            snprintf(why, sizeof(why), "malformed %s message", c->proto->name);
            rx_conn_close(c, COH_EPROTO, why);
            break;
        }
        off += (size_t)n;
    }
    c->parsing = false;
    if (c->closing) return;
    if (off) {
        memmove(c->buf, c->buf + off, c->len - off);
        c->len -= off;
    }
    /* A full buffer the protocol holds off on: TCP holds the peer back until
     * rx_conn_resume. */
    if (c->len == c->cap && c->cap >= c->proto->max_msg + 4096) {
        uv_read_stop((uv_stream_t *)&c->tcp);
        c->reading = false;
    } else {
        start_reading(c);
    }
}

void rx_conn_resume(rx_conn_t *c)
{
    if (!c->closing && c->ready) parse_buffered(c);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *b)
{
    (void)b;
    rx_conn_t *c = s->data;
    if (nread == 0 || c->closing) return;
    if (nread == UV_ENOBUFS) {
        char why[96];
        snprintf(why, sizeof(why), "%s message larger than %zu bytes", c->proto->name,
                 c->proto->max_msg);
        rx_conn_close(c, COH_EPROTO, why);
        return;
    }
    if (nread < 0) {
        rx_conn_close(c, COH_EPEER, nread == UV_EOF ? "closed by peer" : uv_strerror((int)nread));
        return;
    }
    if (!c->ready) {
        c->hello_got += (size_t)nread;
        /* Garbage is refused as soon as the magic is wrong. */
        en_hello_t h;
        if (en_hello_decode(c->hello, c->hello_got, &h) < 0) {
            refuse(c, COH_EAUTH, "malformed handshake");
            return;
        }
        if (c->hello_got == EN_HELLO_SIZE) on_hello(c);
        return;
    }
    c->len += (size_t)nread;
    parse_buffered(c);
}

static void start_reading(rx_conn_t *c)
{
    if (c->reading || c->closing) return;
    int e = uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
    if (e) {
        rx_conn_close(c, COH_ESYS, uv_strerror(e));
        return;
    }
    c->reading = true;
}

/* ---- dialling ---- */

static void on_connect(uv_connect_t *req, int status)
{
    rx_conn_t *c = req->data;
    if (c->closing) return;
    if (status < 0) {
        rx_conn_close(c, COH_EPEER, uv_strerror(status));
        return;
    }
    c->connected = true;
    uv_tcp_nodelay(&c->tcp, 1);
    if (send_hello(c) != 0) {
        rx_conn_close(c, COH_ESYS, "cannot start the handshake");
        return;
    }
    start_reading(c);
}

int rx_conn_dial(uv_loop_t *loop, const struct sockaddr *local, const struct sockaddr *addr,
                 const rx_conn_proto_t *proto, void *owner, const char *token, int rank, int world,
                 rx_conn_t **out)
{
    rx_conn_t *c = conn_new(loop, proto, owner, token, rank, world);
    if (!c) return bs_fail(COH_ENOMEM, "%s: out of memory", proto->name);
    c->outgoing = true;
    int e = local ? uv_tcp_bind(&c->tcp, local, 0) : 0;
    c->creq.data = c;
    if (!e) e = uv_tcp_connect(&c->creq, &c->tcp, addr, on_connect);
    if (e) {
        c->closing = true;
        uv_close((uv_handle_t *)&c->tcp, handle_closed);
        uv_close((uv_handle_t *)&c->hs_timer, handle_closed);
        return bs_fail(bs_errno_status(e), "%s: cannot dial: %s", proto->name, uv_strerror(e));
    }
    *out = c;
    return 0;
}

/* ---- listening ---- */

static void on_connection(uv_stream_t *server, int status)
{
    rx_listener_t *l = server->data;
    if (status < 0 || l->closing) return;
    rx_conn_t *c = l->pending < RX_CONN_PENDING
                       ? conn_new(server->loop, l->proto, l->owner, l->token, l->rank, l->world)
                       : NULL;
    if (!c) {
        /* Too many handshakes at once (or no memory): take it off the
         * backlog and drop it; the handle lives until its close callback. */
        atomic_fetch_add(&l->rejected, 1);
        en_drop_accept(server);
        return;
    }
    c->listener = l;
    l->pending++;
    c->next = l->conns;
    if (l->conns) l->conns->prev = c;
    l->conns = c;
    if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0) {
        rx_conn_close(c, COH_ESYS, "accept failed");
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    start_reading(c);
}

static void listener_closed(uv_handle_t *h)
{
    coh_free(h->data);
}

int rx_listener_start(uv_loop_t *loop, const struct sockaddr *addr, int fd,
                      const rx_conn_proto_t *proto, void *owner, const char *token, int rank,
                      int world, rx_listener_t **out)
{
    rx_listener_t *l = coh_zalloc(sizeof(*l));
    if (!l) return bs_fail(COH_ENOMEM, "%s: out of memory", proto->name);
    l->proto = proto;
    l->owner = owner;
    l->token = token;
    l->rank = rank;
    l->world = world;
    uv_tcp_init(loop, &l->tcp);
    l->tcp.data = l;
    l->open = true;
    int e = fd >= 0 ? uv_tcp_open(&l->tcp, fd) : uv_tcp_bind(&l->tcp, addr, 0);
    if (!e) e = uv_listen((uv_stream_t *)&l->tcp, 1024, on_connection);
    if (e) {
        uv_close((uv_handle_t *)&l->tcp, listener_closed);
        char a[128] = "an inherited socket";
        if (fd < 0) rx_format_addr(addr, a, sizeof(a));
        return bs_fail(bs_errno_status(e), "%s: cannot listen on %s: %s", proto->name, a,
                       uv_strerror(e));
    }
    int len = sizeof(l->addr);
    uv_tcp_getsockname(&l->tcp, (struct sockaddr *)&l->addr, &len);
    *out = l;
    return 0;
}

void rx_listener_close(rx_listener_t *l)
{
    if (!l || l->closing) return;
    l->closing = true;
    while (l->conns) {
        if (l->conns->closing)
            close_handles(l->conns); /* flushing (rx_conn_close_flushed): no longer */
        else
            rx_conn_close(l->conns, COH_ECANCELED, "closing");
    }
    uv_close((uv_handle_t *)&l->tcp, listener_closed);
}

uint64_t rx_listener_rejected(rx_listener_t *l)
{
    return atomic_load(&l->rejected);
}

bool rx_conn_input_pending(const rx_conn_t *c)
{
    uv_os_fd_t fd;
    if (!c || c->closing || uv_fileno((const uv_handle_t *)&c->tcp, &fd) != 0) return false;
    char b;
    ssize_t n;
    do n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    return n >= 0; /* a byte, or the peer's FIN (0); -1: nothing (EAGAIN) or an error */
}
