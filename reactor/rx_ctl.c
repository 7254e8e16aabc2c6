/* Control-plane codec and framed connection (see rx_ctl.h). */
#include "reactor/rx_ctl.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "engines/en_frame.h"
#include "base/bs_alloc.h"

/* ---- codec ---- */

static void put_f64(uint8_t *p, double v)
{
    uint64_t x;
    memcpy(&x, &v, 8);
    en_put64(p, x);
}

static double get_f64(const uint8_t *p)
{
    uint64_t x = en_get64(p);
    double v;
    memcpy(&v, &x, 8);
    return v;
}

#define READY_LEN  56
#define PLAN_LEN   40 /* + 4 per member */
#define DONE_LEN   32 /* + 24 per measurement */
#define REFUSE_LEN 24
#define LEAVE_LEN  4

size_t rx_ctl_size(const rx_ctl_msg_t *m)
{
    switch (m->type) {
    case RX_CTL_READY: return RX_CTL_HDR + READY_LEN;
    case RX_CTL_PLAN: return RX_CTL_HDR + PLAN_LEN + 4 * (size_t)m->u.plan.nmembers;
    case RX_CTL_DONE: return RX_CTL_HDR + DONE_LEN + 24 * (size_t)m->u.done.nbw;
    case RX_CTL_REFUSE: return RX_CTL_HDR + REFUSE_LEN;
    case RX_CTL_LEAVE: return RX_CTL_HDR + LEAVE_LEN;
    default: return 0;
    }
}

int rx_ctl_encode(const rx_ctl_msg_t *m, uint8_t *out, size_t cap)
{
    size_t n = rx_ctl_size(m);
    if (!n || n > cap || n - RX_CTL_HDR > RX_CTL_MAX) return COH_EINVAL;
    if (m->type == RX_CTL_DONE && m->u.done.nbw > RX_CTL_MAXBW) return COH_EINVAL;
    en_put32(out, RX_CTL_MAGIC);
    out[4] = m->type;
    out[5] = 0;
    en_put16(out + 6, 0);
    en_put32(out + 8, (uint32_t)(n - RX_CTL_HDR));
    en_put32(out + 12, m->comm);
    uint8_t *p = out + RX_CTL_HDR;
    switch (m->type) {
    case RX_CTL_READY: {
        const rx_ctl_ready_t *r = &m->u.ready;
        en_put32(p, r->rank);
        en_put32(p + 4, r->mode);
        en_put64(p + 8, r->iteration);
        en_put64(p + 16, r->count);
        en_put32(p + 24, r->dtype);
        en_put32(p + 28, 0);
        put_f64(p + 32, r->compute_s);
        put_f64(p + 40, r->weight);
        en_put64(p + 48, r->attempt);
        break;
    }
    case RX_CTL_PLAN: {
        const rx_ctl_plan_t *pl = &m->u.plan;
        en_put64(p, pl->group_id);
        en_put64(p + 8, pl->attempt);
        en_put32(p + 16, (uint32_t)pl->status);
        en_put32(p + 20, pl->full);
        put_f64(p + 24, pl->total_weight);
        en_put32(p + 32, pl->nmembers);
        en_put32(p + 36, 0);
        for (uint32_t i = 0; i < pl->nmembers; i++) en_put32(p + 40 + 4 * i, pl->members_in[i]);
        break;
    }
    case RX_CTL_DONE: {
        const rx_ctl_done_t *d = &m->u.done;
        en_put64(p, d->group_id);
        en_put32(p + 8, d->rank);
        en_put32(p + 12, (uint32_t)d->status);
        put_f64(p + 16, d->duration_s);
        en_put32(p + 24, d->nbw);
        en_put32(p + 28, 0);
        for (uint32_t i = 0; i < d->nbw; i++) {
            uint8_t *e = p + 32 + 24 * i;
            en_put32(e, d->bw[i].peer);
            en_put32(e + 4, 0);
            en_put64(e + 8, d->bw[i].bytes);
            put_f64(e + 16, d->bw[i].seconds);
        }
        break;
    }
    case RX_CTL_REFUSE: {
        const rx_ctl_refuse_t *r = &m->u.refuse;
        en_put64(p, r->group_id);
        en_put64(p + 8, r->attempt);
        en_put32(p + 16, r->rank);
        en_put32(p + 20, r->gone);
        break;
    }
    case RX_CTL_LEAVE: en_put32(p, m->u.leave_rank); break;
    default: return COH_EINVAL;
    }
    return (int)n;
}

static bool finite_nonneg(double v)
{
    return isfinite(v) && v >= 0;
}

int rx_ctl_parse(const uint8_t *buf, size_t len, rx_ctl_msg_t *m)
{
    static const uint8_t magic[4] = {'C', 'O', 'H', 'C'};
    size_t k = len < 4 ? len : 4;
    if (memcmp(buf, magic, k) != 0) return COH_EPROTO;
    if (len < RX_CTL_HDR) return 0;
    uint8_t type = buf[4];
    uint32_t plen = en_get32(buf + 8);
    if (buf[5] != 0 || en_get16(buf + 6) != 0 || plen > RX_CTL_MAX) return COH_EPROTO;
    /* Check the length against the type before waiting for the payload, so
     * a bogus length is refused at once. */
    switch (type) {
    case RX_CTL_READY:
        if (plen != READY_LEN) return COH_EPROTO;
        break;
    case RX_CTL_PLAN:
        if (plen < PLAN_LEN || (plen - PLAN_LEN) % 4) return COH_EPROTO;
        break;
    case RX_CTL_DONE:
        if (plen < DONE_LEN || (plen - DONE_LEN) % 24 || (plen - DONE_LEN) / 24 > RX_CTL_MAXBW)
            return COH_EPROTO;
        break;
    case RX_CTL_REFUSE:
        if (plen != REFUSE_LEN) return COH_EPROTO;
        break;
    case RX_CTL_LEAVE:
        if (plen != LEAVE_LEN) return COH_EPROTO;
        break;
    default: return COH_EPROTO;
    }
    if (len < RX_CTL_HDR + (size_t)plen) return 0;
    const uint8_t *p = buf + RX_CTL_HDR;
    memset(m, 0, sizeof(*m));
    m->type = type;
    m->comm = en_get32(buf + 12);
    switch (type) {
    case RX_CTL_READY: {
        rx_ctl_ready_t *r = &m->u.ready;
        r->rank = en_get32(p);
        r->mode = en_get32(p + 4);
        r->iteration = en_get64(p + 8);
        r->count = en_get64(p + 16);
        r->dtype = en_get32(p + 24);
        r->compute_s = get_f64(p + 32);
        r->weight = get_f64(p + 40);
        r->attempt = en_get64(p + 48);
        if (en_get32(p + 28) != 0 || !finite_nonneg(r->compute_s) || !finite_nonneg(r->weight))
            return COH_EPROTO;
        break;
    }
    case RX_CTL_PLAN: {
        rx_ctl_plan_t *pl = &m->u.plan;
        pl->group_id = en_get64(p);
        pl->attempt = en_get64(p + 8);
        pl->status = (int32_t)en_get32(p + 16);
        pl->full = en_get32(p + 20);
        pl->total_weight = get_f64(p + 24);
        pl->nmembers = en_get32(p + 32);
        pl->members = p + 40;
        if (en_get32(p + 36) != 0 || pl->nmembers != (plen - PLAN_LEN) / 4 || pl->full > 1 ||
            !finite_nonneg(pl->total_weight) || pl->status > 0)
            return COH_EPROTO;
        break;
    }
    case RX_CTL_DONE: {
        rx_ctl_done_t *d = &m->u.done;
        d->group_id = en_get64(p);
        d->rank = en_get32(p + 8);
        d->status = (int32_t)en_get32(p + 12);
        d->duration_s = get_f64(p + 16);
        d->nbw = en_get32(p + 24);
        if (en_get32(p + 28) != 0 || d->nbw != (plen - DONE_LEN) / 24 ||
            !finite_nonneg(d->duration_s) || d->status > 0)
            return COH_EPROTO;
        for (uint32_t i = 0; i < d->nbw; i++) {
            const uint8_t *e = p + 32 + 24 * i;
            d->bw[i].peer = en_get32(e);
            d->bw[i].bytes = en_get64(e + 8);
            d->bw[i].seconds = get_f64(e + 16);
            if (en_get32(e + 4) != 0 || !finite_nonneg(d->bw[i].seconds)) return COH_EPROTO;
        }
        break;
    }
    case RX_CTL_REFUSE: {
        rx_ctl_refuse_t *r = &m->u.refuse;
        r->group_id = en_get64(p);
        r->attempt = en_get64(p + 8);
        r->rank = en_get32(p + 16);
        r->gone = en_get32(p + 20);
        break;
    }
    case RX_CTL_LEAVE: m->u.leave_rank = en_get32(p); break;
    }
    return (int)(RX_CTL_HDR + plen);
}

/* ---- connection ---- */

static void conn_closed(uv_handle_t *h)
{
    rx_ctl_conn_t *c = h->data;
    coh_free(c->buf);
    coh_free(c);
}

void rx_ctl_close(rx_ctl_conn_t *c, int status, const char *why)
{
    if (c->closing) return;
    c->closing = true;
    uv_read_stop((uv_stream_t *)&c->tcp);
    if (c->h->on_close) c->h->on_close(c, status, why);
    uv_close((uv_handle_t *)&c->tcp, conn_closed);
}

typedef struct wr {
    uv_write_t req;
    uint8_t data[];
} wr_t;

static void wrote(uv_write_t *req, int status)
{
    wr_t *w = req->data;
    rx_ctl_conn_t *c = (rx_ctl_conn_t *)req->handle->data;
    coh_free(w);
    if (status < 0 && status != UV_ECANCELED) rx_ctl_close(c, COH_EPEER, uv_strerror(status));
}

static int write_bytes(rx_ctl_conn_t *c, const void *p, size_t n)
{
    wr_t *w = coh_malloc(sizeof(wr_t) + n);
    if (!w) return COH_ENOMEM;
    memcpy(w->data, p, n);
    w->req.data = w;
    uv_buf_t b = {.base = (char *)w->data, .len = n};
    int e = uv_write(&w->req, (uv_stream_t *)&c->tcp, &b, 1, wrote);
    if (e) {
        coh_free(w);
        return bs_errno_status(e);
    }
    return 0;
}

int rx_ctl_send(rx_ctl_conn_t *c, const rx_ctl_msg_t *m)
{
    if (c->closing || !c->ready) return COH_EPEER;
    size_t n = rx_ctl_size(m);
    if (!n) return COH_EINVAL;
    wr_t *w = coh_malloc(sizeof(wr_t) + n);
    if (!w) return COH_ENOMEM;
    int len = rx_ctl_encode(m, w->data, n);
    if (len < 0) {
        coh_free(w);
        return len;
    }
    w->req.data = w;
    uv_buf_t b = {.base = (char *)w->data, .len = (size_t)len};
    int e = uv_write(&w->req, (uv_stream_t *)&c->tcp, &b, 1, wrote);
    if (e) {
        coh_free(w);
        return bs_errno_status(e);
    }
    return 0;
}

static int send_hello(rx_ctl_conn_t *c)
{
    en_hello_t h = {.version = EN_PROTO_VERSION,
                    .kind = EN_HELLO_CTRL,
                    .rank = (uint32_t)c->rank,
                    .world = (uint32_t)c->world};
    en_hello_set_token(&h, c->token);
    uint8_t b[EN_HELLO_SIZE];
    en_hello_encode(&h, b);
    return write_bytes(c, b, sizeof(b));
}

static void on_alloc(uv_handle_t *hd, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    rx_ctl_conn_t *c = hd->data;
    if (!c->ready) {
        /* Exactly the hello: nothing past it is read before it is checked. */
        buf->base = (char *)c->hello + c->hello_got;
        buf->len = EN_HELLO_SIZE - c->hello_got;
        return;
    }
    if (c->cap - c->len < 4096) {
        size_t ncap = c->cap ? c->cap * 2 : 16384;
        if (ncap > RX_CTL_HDR + RX_CTL_MAX) ncap = RX_CTL_HDR + RX_CTL_MAX;
        uint8_t *nb = ncap > c->cap ? coh_realloc(c->buf, ncap) : NULL;
        if (nb) {
            c->buf = nb;
            c->cap = ncap;
        }
    }
    buf->base = (char *)c->buf + c->len;
    buf->len = c->cap - c->len;
}

static void on_hello(rx_ctl_conn_t *c)
{
    en_hello_t h;
    const char *why = NULL;
    if (en_hello_decode(c->hello, EN_HELLO_SIZE, &h) != EN_HELLO_SIZE)
        why = "malformed handshake";
    else if (!en_hello_token_ok(&h, c->token))
        why = "wrong job token";
    else if (h.kind != EN_HELLO_CTRL || (int)h.world != c->world)
        why = "not a control connection of this job";
    if (why) {
        rx_ctl_close(c, COH_EAUTH, why);
        return;
    }
    if (!c->outgoing && send_hello(c) != 0) {
        rx_ctl_close(c, COH_ESYS, "cannot answer the handshake");
        return;
    }
    c->peer = (int)h.rank;
    c->ready = true;
    if (c->h->on_ready) c->h->on_ready(c, c->peer);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *b)
{
    (void)b;
    rx_ctl_conn_t *c = s->data;
    if (nread == 0 || c->closing) return;
    if (nread == UV_ENOBUFS) {
        rx_ctl_close(c, COH_EPROTO, "control message too large");
        return;
    }
    if (nread < 0) {
        rx_ctl_close(c, COH_EPEER, nread == UV_EOF ? "closed by peer" : uv_strerror((int)nread));
        return;
    }
    if (!c->ready) {
        c->hello_got += (size_t)nread;
        en_hello_t h;
        if (en_hello_decode(c->hello, c->hello_got, &h) < 0) {
            rx_ctl_close(c, COH_EAUTH, "malformed handshake");
            return;
        }
        if (c->hello_got == EN_HELLO_SIZE) on_hello(c);
        return;
    }
    c->len += (size_t)nread;
    size_t off = 0;
    while (!c->closing && off < c->len) {
        rx_ctl_msg_t m;
        int n = rx_ctl_parse(c->buf + off, c->len - off, &m);
        if (n == 0) break;
        if (n < 0) {
            rx_ctl_close(c, COH_EPROTO, "malformed control message");
            return;
        }
        c->h->on_msg(c, &m);
        off += (size_t)n;
    }
    if (!c->closing && off) {
        memmove(c->buf, c->buf + off, c->len - off);
        c->len -= off;
    }
}

static rx_ctl_conn_t *conn_new(uv_loop_t *loop, const char *token, int rank, int world,
                               const rx_ctl_handlers_t *h, void *owner)
{
    rx_ctl_conn_t *c = coh_zalloc(sizeof(*c));
    if (!c) return NULL;
    uv_tcp_init(loop, &c->tcp);
    c->tcp.data = c;
    c->h = h;
    c->owner = owner;
    c->peer = -1;
    c->token = token;
    c->rank = rank;
    c->world = world;
    c->t_open_ns = bs_now_ns();
    return c;
}

static void on_connect(uv_connect_t *req, int status)
{
    rx_ctl_conn_t *c = req->data;
    if (c->closing) return;
    if (status < 0) {
        rx_ctl_close(c, COH_EPEER, uv_strerror(status));
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    int e = send_hello(c);
    if (!e) e = uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
    if (e) rx_ctl_close(c, COH_ESYS, "cannot start the handshake");
}

int rx_ctl_dial(uv_loop_t *loop, const struct sockaddr *local, const struct sockaddr *addr,
                const char *token, int rank, int world, const rx_ctl_handlers_t *h, void *owner,
                rx_ctl_conn_t **out)
{
    rx_ctl_conn_t *c = conn_new(loop, token, rank, world, h, owner);
    if (!c) return COH_ENOMEM;
    c->outgoing = true;
    int e = local ? uv_tcp_bind(&c->tcp, local, 0) : 0;
    c->creq.data = c;
    if (!e) e = uv_tcp_connect(&c->creq, &c->tcp, addr, on_connect);
    if (e) {
        c->closing = true;
        uv_close((uv_handle_t *)&c->tcp, conn_closed);
        return bs_fail(bs_errno_status(e), "control: cannot dial the coordinator: %s",
                       uv_strerror(e));
    }
    *out = c;
    return 0;
}

int rx_ctl_accept(uv_stream_t *server, const char *token, int rank, int world,
                  const rx_ctl_handlers_t *h, void *owner, rx_ctl_conn_t **out)
{
    rx_ctl_conn_t *c = conn_new(server->loop, token, rank, world, h, owner);
    if (!c) return COH_ENOMEM;
    if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0 ||
        uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) != 0) {
        c->closing = true;
        uv_close((uv_handle_t *)&c->tcp, conn_closed);
        return COH_ESYS;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    *out = c;
    return 0;
}
