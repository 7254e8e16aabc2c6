/*
 * The bootstrap store: codec, server (libuv, on the control reactor of
 * rank 0) and a blocking client (used only inside coh_init).
 */
#include "reactor/rx_store.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include "base/bs_alloc.h"
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engines/en_frame.h"

/* ---- codec ---- */

int rx_store_parse(const uint8_t *buf, size_t len, rx_store_msg_t *m)
{
    static const uint8_t magic[4] = {'C', 'O', 'H', 'S'};
    size_t k = len < 4 ? len : 4;
    if (memcmp(buf, magic, k) != 0) return COH_EPROTO;
    if (len < RX_STORE_HDR) return 0;
    uint8_t type = buf[4], status = buf[5];
    size_t klen = en_get16(buf + 6), vlen = en_get32(buf + 8);
    bool req = type >= RX_STORE_SET && type <= RX_STORE_ADD;
    bool resp = type == RX_STORE_RESP;
    if (!req && !resp) return COH_EPROTO;
    if (req && status != 0) return COH_EPROTO;
    if (resp && status > RX_STORE_ERROR) return COH_EPROTO;
    if (klen > RX_STORE_KEY_MAX || vlen > RX_STORE_VAL_MAX) return COH_EPROTO;
    if (req && klen == 0) return COH_EPROTO;
    if ((type == RX_STORE_GET || type == RX_STORE_WAIT || type == RX_STORE_ADD) && vlen != 0)
        return COH_EPROTO;
    if (len < RX_STORE_HDR + klen + vlen) return 0;
    m->type = type;
    m->status = status;
    m->arg = en_get32(buf + 12);
    m->key = buf + RX_STORE_HDR;
    m->klen = klen;
    m->val = buf + RX_STORE_HDR + klen;
    m->vlen = vlen;
    return (int)(RX_STORE_HDR + klen + vlen);
}

int rx_store_encode(uint8_t type, uint8_t status, uint32_t arg, const void *key, size_t klen,
                    const void *val, size_t vlen, uint8_t *out, size_t cap)
{
    if (klen > RX_STORE_KEY_MAX || vlen > RX_STORE_VAL_MAX || RX_STORE_HDR + klen + vlen > cap)
        return COH_EINVAL;
    en_put32(out, RX_STORE_MAGIC);
    out[4] = type;
    out[5] = status;
    en_put16(out + 6, (uint16_t)klen);
    en_put32(out + 8, (uint32_t)vlen);
    en_put32(out + 12, arg);
    if (klen) memcpy(out + RX_STORE_HDR, key, klen);
    if (vlen) memcpy(out + RX_STORE_HDR + klen, val, vlen);
    return (int)(RX_STORE_HDR + klen + vlen);
}

/* ---- server ---- */

#define NBUCKETS 256
#define MSG_MAX  (RX_STORE_HDR + RX_STORE_KEY_MAX + RX_STORE_VAL_MAX)
#define HELLO_MS 10000
#define TICK_MS  50

typedef struct kv {
    struct kv *next;
    uint8_t *key;
    size_t klen;
    uint8_t *val;
    size_t vlen;
} kv_t;

typedef enum { CL_HELLO = 0, CL_READY, CL_CLOSING } cl_state;

typedef struct st_client {
    uv_tcp_t tcp;
    struct rx_store_server *srv;
    struct st_client *prev, *next;
    int state;
    uint8_t hello[EN_HELLO_SIZE];
    size_t hello_got;
    uint8_t *buf;
    size_t len, cap;
    bool waiting; /* a WAIT is pending: later requests wait their turn */
    uint8_t wkey[RX_STORE_KEY_MAX];
    size_t wklen;
    uint64_t wdeadline_ns;
    uint64_t t_accept_ns;
} st_client_t;

struct rx_store_server {
    rx_reactor_t *rx;
    uv_tcp_t listen;
    uv_timer_t tick;
    kv_t *buckets[NBUCKETS];
    st_client_t *clients;
    char token[EN_TOKEN_MAX + 1];
    int world;
    int handles;
    bool closing;
    struct sockaddr_storage addr;
    _Atomic uint64_t rejected;
};

static uint32_t khash(const uint8_t *k, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ k[i]) * 16777619u;
    return h % NBUCKETS;
}

static kv_t *kv_find(rx_store_server_t *s, const uint8_t *k, size_t n)
{
    for (kv_t *e = s->buckets[khash(k, n)]; e; e = e->next)
        if (e->klen == n && memcmp(e->key, k, n) == 0) return e;
    return NULL;
}

static int kv_set(rx_store_server_t *s, const uint8_t *k, size_t n, const uint8_t *v, size_t vn)
{
    kv_t *e = kv_find(s, k, n);
    uint8_t *nv = coh_malloc(vn ? vn : 1);
    if (!nv) return COH_ENOMEM;
    memcpy(nv, v, vn);
    if (!e) {
        e = coh_zalloc(sizeof(*e));
        uint8_t *nk = coh_malloc(n);
        if (!e || !nk) {
            coh_free(e);
            coh_free(nk);
            coh_free(nv);
            return COH_ENOMEM;
        }
        memcpy(nk, k, n);
        e->key = nk;
        e->klen = n;
        uint32_t b = khash(k, n);
        e->next = s->buckets[b];
        s->buckets[b] = e;
    }
    coh_free(e->val);
    e->val = nv;
    e->vlen = vn;
    return 0;
}

static void srv_handle_closed(uv_handle_t *h)
{
    rx_store_server_t *s = h->data;
    if (--s->handles > 0) return;
    for (int b = 0; b < NBUCKETS; b++) {
        kv_t *e = s->buckets[b];
        while (e) {
            kv_t *n = e->next;
            coh_free(e->key);
            coh_free(e->val);
            coh_free(e);
            e = n;
        }
    }
    coh_free(s);
}

static void client_closed(uv_handle_t *h)
{
    st_client_t *c = h->data;
    rx_store_server_t *s = c->srv;
    coh_free(c->buf);
    coh_free(c);
    srv_handle_closed((uv_handle_t *)&s->listen);
}

static void client_close(st_client_t *c, const char *why)
{
    if (c->state == CL_CLOSING) return;
    rx_store_server_t *s = c->srv;
    if (why) bs_log(COH_LOG_WARN, "store: dropped a client: %s", why);
    c->state = CL_CLOSING;
    if (c->prev)
        c->prev->next = c->next;
    else
        s->clients = c->next;
    if (c->next) c->next->prev = c->prev;
    uv_close((uv_handle_t *)&c->tcp, client_closed);
}

typedef struct wr {
    uv_write_t req;
    uint8_t data[];
} wr_t;

static void wrote(uv_write_t *req, int status)
{
    (void)status;
    coh_free(req->data);
}

static void reply(st_client_t *c, uint8_t status, uint32_t arg, const void *val, size_t vlen)
{
    wr_t *w = coh_malloc(sizeof(wr_t) + RX_STORE_HDR + vlen);
    if (!w) {
        client_close(c, "out of memory");
        return;
    }
    int n = rx_store_encode(RX_STORE_RESP, status, arg, NULL, 0, val, vlen, w->data,
                            RX_STORE_HDR + vlen);
    uv_buf_t b = uv_buf_init((char *)w->data, (unsigned)n);
    w->req.data = w;
    if (uv_write(&w->req, (uv_stream_t *)&c->tcp, &b, 1, wrote) != 0) {
        coh_free(w);
        client_close(c, "write failed");
    }
}

static void process(st_client_t *c);

/* Answer WAITs on key (or all expired ones when key is NULL). */
static void wake_waiters(rx_store_server_t *s, const uint8_t *key, size_t klen, uint64_t now)
{
    st_client_t *next;
    for (st_client_t *c = s->clients; c; c = next) {
        next = c->next;
        if (!c->waiting) continue;
        if (key && c->wklen == klen && memcmp(c->wkey, key, klen) == 0) {
            kv_t *e = kv_find(s, key, klen);
            c->waiting = false;
            reply(c, RX_STORE_OK, 0, e->val, e->vlen);
        } else if (!key && now >= c->wdeadline_ns) {
            c->waiting = false;
            reply(c, RX_STORE_TIMEOUT, 0, NULL, 0);
        } else {
            continue;
        }
        if (c->state == CL_READY) process(c);
    }
}

static void handle(st_client_t *c, const rx_store_msg_t *m)
{
    rx_store_server_t *s = c->srv;
    switch (m->type) {
    case RX_STORE_SET:
        if (kv_set(s, m->key, m->klen, m->val, m->vlen) != 0) {
            reply(c, RX_STORE_ERROR, 0, NULL, 0);
            return;
        }
        reply(c, RX_STORE_OK, 0, NULL, 0);
        wake_waiters(s, m->key, m->klen, 0);
        return;
    case RX_STORE_GET:
    case RX_STORE_WAIT: {
        kv_t *e = kv_find(s, m->key, m->klen);
        if (e) {
            reply(c, RX_STORE_OK, 0, e->val, e->vlen);
        } else if (m->type == RX_STORE_GET) {
            reply(c, RX_STORE_NOTFOUND, 0, NULL, 0);
        } else {
            c->waiting = true;
            memcpy(c->wkey, m->key, m->klen);
            c->wklen = m->klen;
            c->wdeadline_ns = bs_now_ns() + (uint64_t)m->arg * 1000000ull;
        }
        return;
    }
    case RX_STORE_ADD: {
        kv_t *e = kv_find(s, m->key, m->klen);
        int64_t v = 0;
        if (e) {
            char tmp[32];
            size_t n = e->vlen < sizeof(tmp) - 1 ? e->vlen : sizeof(tmp) - 1;
            memcpy(tmp, e->val, n);
            tmp[n] = 0;
            v = strtoll(tmp, NULL, 10);
        }
        v += (int32_t)m->arg;
        char out[32];
        int n = snprintf(out, sizeof(out), "%" PRId64, v);
        if (kv_set(s, m->key, m->klen, (const uint8_t *)out, (size_t)n) != 0) {
            reply(c, RX_STORE_ERROR, 0, NULL, 0);
            return;
        }
        reply(c, RX_STORE_OK, 0, out, (size_t)n);
        wake_waiters(s, m->key, m->klen, 0);
        return;
    }
    default: client_close(c, "a response sent to the store");
    }
}

static void process(st_client_t *c)
{
    size_t off = 0;
    while (c->state == CL_READY && !c->waiting && off < c->len) {
        rx_store_msg_t m;
        int n = rx_store_parse(c->buf + off, c->len - off, &m);
        if (n == 0) break;
        if (n < 0) {
            client_close(c, "malformed store message");
            return;
        }
        handle(c, &m);
        off += (size_t)n;
    }
    if (off && c->state != CL_CLOSING) {
        memmove(c->buf, c->buf + off, c->len - off);
        c->len -= off;
    }
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    st_client_t *c = h->data;
    if (c->state == CL_HELLO) {
        buf->base = (char *)c->hello + c->hello_got;
        buf->len = EN_HELLO_SIZE - c->hello_got;
        return;
    }
    if (c->cap - c->len < 4096 && c->cap < MSG_MAX + 4096) {
        size_t ncap = c->cap ? c->cap * 2 : 8192;
        if (ncap > MSG_MAX + 4096) ncap = MSG_MAX + 4096;
        uint8_t *nb = coh_realloc(c->buf, ncap);
        if (nb) {
            c->buf = nb;
            c->cap = ncap;
        }
    }
    buf->base = (char *)c->buf + c->len;
    buf->len = c->cap - c->len;
}

static void on_hello(st_client_t *c)
{
    rx_store_server_t *s = c->srv;
    en_hello_t h;
    const char *why = NULL;
    if (en_hello_decode(c->hello, EN_HELLO_SIZE, &h) != EN_HELLO_SIZE)
        why = "malformed handshake";
    else if (!en_hello_token_ok(&h, s->token))
        why = "wrong job token";
    else if (h.kind != EN_HELLO_STORE || (int)h.world != s->world)
        why = "not a store client of this job";
    if (why) {
        atomic_fetch_add(&s->rejected, 1);
        client_close(c, why);
        return;
    }
    en_hello_t me = {.version = EN_PROTO_VERSION,
                     .kind = EN_HELLO_STORE,
                     .rank = 0,
                     .world = (uint32_t)s->world};
    en_hello_set_token(&me, s->token);
    wr_t *w = coh_malloc(sizeof(wr_t) + EN_HELLO_SIZE);
    if (!w) {
        client_close(c, "out of memory");
        return;
    }
    en_hello_encode(&me, w->data);
    uv_buf_t b = uv_buf_init((char *)w->data, EN_HELLO_SIZE);
    w->req.data = w;
    if (uv_write(&w->req, (uv_stream_t *)&c->tcp, &b, 1, wrote) != 0) {
        coh_free(w);
        client_close(c, "write failed");
        return;
    }
    c->state = CL_READY;
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    (void)buf;
    st_client_t *c = st->data;
    if (nread == 0 || nread == UV_ENOBUFS || c->state == CL_CLOSING) {
        if (nread == UV_ENOBUFS) client_close(c, "message too large");
        return;
    }
    if (nread < 0) {
        client_close(c, NULL); /* clients hang up when they are done */
        return;
    }
    if (c->state == CL_HELLO) {
        c->hello_got += (size_t)nread;
        en_hello_t h;
        if (en_hello_decode(c->hello, c->hello_got, &h) < 0) {
            atomic_fetch_add(&c->srv->rejected, 1);
            client_close(c, "malformed handshake");
            return;
        }
        if (c->hello_got == EN_HELLO_SIZE) on_hello(c);
        return;
    }
    c->len += (size_t)nread;
    process(c);
}

static void on_conn(uv_stream_t *server, int status)
{
    rx_store_server_t *s = server->data;
    if (status < 0 || s->closing) return;
    st_client_t *c = coh_zalloc(sizeof(*c));
    if (!c) return;
    c->srv = s;
    uv_tcp_init(&s->rx->loop, &c->tcp);
    c->tcp.data = c;
    s->handles++;
    c->state = CL_HELLO;
    c->t_accept_ns = bs_now_ns();
    c->next = s->clients;
    if (s->clients) s->clients->prev = c;
    s->clients = c;
    if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0 ||
        uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) != 0)
        client_close(c, "accept failed");
}

static void on_tick(uv_timer_t *t)
{
    rx_store_server_t *s = t->data;
    uint64_t now = bs_now_ns();
    wake_waiters(s, NULL, 0, now);
    /* A connection that never says HELLO does not keep a slot. */
    st_client_t *next;
    for (st_client_t *c = s->clients; c; c = next) {
        next = c->next;
        if (c->state == CL_HELLO && now - c->t_accept_ns > HELLO_MS * 1000000ull) {
            atomic_fetch_add(&s->rejected, 1);
            client_close(c, "no handshake in time");
        }
    }
}

int rx_store_server_start(rx_reactor_t *rx, const struct sockaddr *addr, int fd, const char *token,
                          int world, rx_store_server_t **out)
{
    rx_store_server_t *s = coh_zalloc(sizeof(*s));
    if (!s) return COH_ENOMEM;
    s->rx = rx;
    s->world = world;
    snprintf(s->token, sizeof(s->token), "%s", token ? token : "");
    uv_tcp_init(&rx->loop, &s->listen);
    s->listen.data = s;
    uv_timer_init(&rx->loop, &s->tick);
    s->tick.data = s;
    s->handles = 2;
    int e = fd >= 0 ? uv_tcp_open(&s->listen, fd) : uv_tcp_bind(&s->listen, addr, 0);
    if (!e) e = uv_listen((uv_stream_t *)&s->listen, 1024, on_conn);
    if (e) {
        uv_close((uv_handle_t *)&s->listen, srv_handle_closed);
        uv_close((uv_handle_t *)&s->tick, srv_handle_closed);
        char a[128] = "inherited socket";
        if (fd < 0) rx_format_addr(addr, a, sizeof(a));
        return bs_fail(bs_errno_status(e), "store: cannot listen on %s: %s", a, uv_strerror(e));
    }
    int len = sizeof(s->addr);
    uv_tcp_getsockname(&s->listen, (struct sockaddr *)&s->addr, &len);
    uv_timer_start(&s->tick, on_tick, TICK_MS, TICK_MS);
    *out = s;
    return 0;
}

int rx_store_server_addr(rx_store_server_t *s, struct sockaddr_storage *addr)
{
    *addr = s->addr;
    return 0;
}

uint64_t rx_store_server_rejected(rx_store_server_t *s)
{
    return atomic_load(&s->rejected);
}

void rx_store_server_close(rx_store_server_t *s)
{
    s->closing = true;
    st_client_t *next;
    for (st_client_t *c = s->clients; c; c = next) {
        next = c->next;
        client_close(c, NULL);
    }
    uv_close((uv_handle_t *)&s->tick, srv_handle_closed);
    uv_close((uv_handle_t *)&s->listen, srv_handle_closed);
}

/* ---- blocking client ---- */

static int wait_fd(int fd, short events, uint64_t deadline_ns)
{
    for (;;) {
        uint64_t now = bs_now_ns();
        if (now >= deadline_ns) return COH_ETIMEDOUT;
        int ms = (int)((deadline_ns - now + 999999) / 1000000);
        struct pollfd p = {.fd = fd, .events = events};
        int r = poll(&p, 1, ms);
        if (r > 0) return 0;
        if (r < 0 && errno != EINTR) return COH_ESYS;
    }
}

static int send_all(int fd, const uint8_t *b, size_t n, uint64_t deadline_ns)
{
    while (n) {
        ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
        if (w > 0) {
            b += w;
            n -= (size_t)w;
        } else if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
            int e = wait_fd(fd, POLLOUT, deadline_ns);
            if (e) return e;
        } else {
            return COH_EPEER;
        }
    }
    return 0;
}

static int recv_all(int fd, uint8_t *b, size_t n, uint64_t deadline_ns)
{
    while (n) {
        ssize_t r = recv(fd, b, n, 0);
        if (r > 0) {
            b += r;
            n -= (size_t)r;
        } else if (r < 0 && (errno == EAGAIN || errno == EINTR)) {
            int e = wait_fd(fd, POLLIN, deadline_ns);
            if (e) return e;
        } else {
            return COH_EPEER;
        }
    }
    return 0;
}

static socklen_t sa_len(const struct sockaddr *a)
{
    return a->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
}

int rx_store_connect(rx_store_client_t *c, const struct sockaddr *addr, const char *token, int rank,
                     int world, uint64_t deadline_ns)
{
    memset(c, 0, sizeof(*c));
    c->fd = -1;
    char where[128];
    rx_format_addr(addr, where, sizeof(where));
    int delay_ms = 10, last = 0;
    for (;;) {
        int fd = socket(addr->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) return bs_fail(COH_ESYS, "store: socket: %s", strerror(errno));
        int r = connect(fd, addr, sa_len(addr));
        if (r < 0 && errno == EINPROGRESS) {
            r = wait_fd(fd, POLLOUT, deadline_ns);
            if (r == 0) {
                int err = 0;
                socklen_t l = sizeof(err);
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &l);
                errno = err;
                r = err ? -1 : 0;
            } else {
                errno = ETIMEDOUT;
                r = -1;
            }
        }
        if (r == 0) {
            c->fd = fd;
            break;
        }
        last = errno;
        close(fd);
        /* Rank 0 may not be listening yet: try again until the deadline. */
        if (bs_now_ns() + (uint64_t)delay_ms * 1000000ull >= deadline_ns)
            return bs_fail(COH_EBOOTSTRAP, "store %s unreachable: %s", where, strerror(last));
        uv_sleep((unsigned)delay_ms);
        if (delay_ms < 200) delay_ms *= 2;
    }
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    en_hello_t h = {.version = EN_PROTO_VERSION,
                    .kind = EN_HELLO_STORE,
                    .rank = (uint32_t)rank,
                    .world = (uint32_t)world};
    en_hello_set_token(&h, token);
    uint8_t hb[EN_HELLO_SIZE];
    en_hello_encode(&h, hb);
    int e = send_all(c->fd, hb, sizeof(hb), deadline_ns);
    if (!e) e = recv_all(c->fd, hb, sizeof(hb), deadline_ns);
    en_hello_t got;
    if (!e && (en_hello_decode(hb, sizeof(hb), &got) != EN_HELLO_SIZE ||
               !en_hello_token_ok(&got, token) || got.kind != EN_HELLO_STORE))
        e = COH_EAUTH;
    if (e) {
        rx_store_close(c);
        if (e == COH_EPEER || e == COH_EAUTH)
            return bs_fail(COH_EAUTH,
                           "store %s refused the handshake (is COHORT_TOKEN the "
                           "same on every rank?)",
                           where);
        return bs_fail(e, "store %s: handshake: %s", where, coh_strerror(e));
    }
    c->cap = RX_STORE_HDR + RX_STORE_VAL_MAX;
    c->buf = coh_malloc(c->cap);
    if (!c->buf) {
        rx_store_close(c);
        return COH_ENOMEM;
    }
    return 0;
}

/* One request, one response. */
static int roundtrip(rx_store_client_t *c, uint8_t type, uint32_t arg, const char *key,
                     const void *val, size_t vlen, rx_store_msg_t *resp, uint64_t deadline_ns)
{
    if (c->fd < 0) return bs_fail(COH_ESTATE, "store client is closed");
    size_t klen = strlen(key);
    if (klen == 0 || klen > RX_STORE_KEY_MAX)
        return bs_fail(COH_EINVAL, "store key must have 1 to %d bytes", RX_STORE_KEY_MAX);
    uint8_t *out = coh_malloc(RX_STORE_HDR + klen + vlen);
    if (!out) return COH_ENOMEM;
    int n = rx_store_encode(type, 0, arg, key, klen, val, vlen, out, RX_STORE_HDR + klen + vlen);
    int e = n < 0 ? n : send_all(c->fd, out, (size_t)n, deadline_ns);
    coh_free(out);
    if (!e) e = recv_all(c->fd, c->buf, RX_STORE_HDR, deadline_ns);
    if (!e) {
        size_t rest = en_get32(c->buf + 8) + en_get16(c->buf + 6);
        if (rest > c->cap - RX_STORE_HDR)
            e = COH_EPROTO;
        else
            e = recv_all(c->fd, c->buf + RX_STORE_HDR, rest, deadline_ns);
    }
    if (!e && (rx_store_parse(c->buf, c->cap, resp) <= 0 || resp->type != RX_STORE_RESP))
        e = COH_EPROTO;
    if (e) return bs_fail(e, "store request for \"%s\": %s", key, coh_strerror(e));
    return 0;
}

int rx_store_set(rx_store_client_t *c, const char *key, const void *val, size_t vlen,
                 uint64_t deadline_ns)
{
    rx_store_msg_t m;
    BS_CHECK(roundtrip(c, RX_STORE_SET, 0, key, val, vlen, &m, deadline_ns));
    return m.status == RX_STORE_OK ? 0 : bs_fail(COH_EBOOTSTRAP, "store refused to set %s", key);
}

int rx_store_get(rx_store_client_t *c, const char *key, void *val, size_t cap, size_t *vlen,
                 int timeout_ms, uint64_t deadline_ns)
{
    rx_store_msg_t m;
    uint8_t type = timeout_ms < 0 ? RX_STORE_GET : RX_STORE_WAIT;
    BS_CHECK(roundtrip(c, type, timeout_ms < 0 ? 0 : (uint32_t)timeout_ms, key, NULL, 0, &m,
                       deadline_ns));
    if (m.status == RX_STORE_NOTFOUND) return COH_EAGAIN;
    if (m.status == RX_STORE_TIMEOUT)
        return bs_fail(COH_ETIMEDOUT, "store: timed out waiting for key %s", key);
    if (m.status != RX_STORE_OK) return bs_fail(COH_EBOOTSTRAP, "store error for key %s", key);
    if (vlen) *vlen = m.vlen;
    if (val) memcpy(val, m.val, m.vlen < cap ? m.vlen : cap);
    return 0;
}

int rx_store_add(rx_store_client_t *c, const char *key, int32_t delta, int64_t *value,
                 uint64_t deadline_ns)
{
    rx_store_msg_t m;
    BS_CHECK(roundtrip(c, RX_STORE_ADD, (uint32_t)delta, key, NULL, 0, &m, deadline_ns));
    if (m.status != RX_STORE_OK) return bs_fail(COH_EBOOTSTRAP, "store error for key %s", key);
    char tmp[32];
    size_t n = m.vlen < sizeof(tmp) - 1 ? m.vlen : sizeof(tmp) - 1;
    memcpy(tmp, m.val, n);
    tmp[n] = 0;
    if (value) *value = strtoll(tmp, NULL, 10);
    return 0;
}

void rx_store_close(rx_store_client_t *c)
{
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    coh_free(c->buf);
    c->buf = NULL;
}

/* ---- addresses ---- */

int rx_resolve_hostport(const char *s, struct sockaddr_storage *out)
{
    char host[256];
    const char *port;
    if (!s || !*s) return bs_fail(COH_EINVAL, "empty address");
    if (s[0] == '[') {
        const char *end = strchr(s, ']');
        if (!end || end[1] != ':' || (size_t)(end - s - 1) >= sizeof(host))
            return bs_fail(COH_EINVAL, "bad address \"%s\" (want [v6]:port)", s);
        memcpy(host, s + 1, (size_t)(end - s - 1));
        host[end - s - 1] = 0;
        port = end + 2;
    } else {
        const char *colon = strrchr(s, ':');
        if (!colon || (size_t)(colon - s) >= sizeof(host))
            return bs_fail(COH_EINVAL, "bad address \"%s\" (want host:port)", s);
        memcpy(host, s, (size_t)(colon - s));
        host[colon - s] = 0;
        port = colon + 1;
    }
    char *end;
    long p = strtol(port, &end, 10);
    if (*port == 0 || *end || p < 0 || p > 65535)
        return bs_fail(COH_EINVAL, "bad port in \"%s\"", s);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int e = getaddrinfo(host, port, &hints, &res);
    if (e || !res) return bs_fail(COH_EINVAL, "cannot resolve \"%s\": %s", host, gai_strerror(e));
    memset(out, 0, sizeof(*out));
    /* Prefer IPv4: the interfaces cohort binds are usually IPv4. */
    struct addrinfo *pick = res;
    for (struct addrinfo *a = res; a; a = a->ai_next)
        if (a->ai_family == AF_INET) {
            pick = a;
            break;
        }
    memcpy(out, pick->ai_addr, pick->ai_addrlen);
    freeaddrinfo(res);
    return 0;
}

int rx_resolve_nic(const char *s, struct sockaddr_storage *out)
{
    memset(out, 0, sizeof(*out));
    if (uv_ip4_addr(s, 0, (struct sockaddr_in *)out) == 0) return 0;
    if (uv_ip6_addr(s, 0, (struct sockaddr_in6 *)out) == 0) return 0;
    uv_interface_address_t *ifs;
    int n;
    if (uv_interface_addresses(&ifs, &n) != 0)
        return bs_fail(COH_ESYS, "cannot list network interfaces");
    int found = -1;
    for (int i = 0; i < n; i++) {
        if (strcmp(ifs[i].name, s) != 0) continue;
        if (ifs[i].address.address4.sin_family == AF_INET) {
            found = i;
            break;
        }
        if (found < 0) found = i;
    }
    if (found >= 0) {
        if (ifs[found].address.address4.sin_family == AF_INET)
            memcpy(out, &ifs[found].address.address4, sizeof(struct sockaddr_in));
        else
            memcpy(out, &ifs[found].address.address6, sizeof(struct sockaddr_in6));
        ((struct sockaddr_in *)out)->sin_port = 0;
    }
    uv_free_interface_addresses(ifs, n);
    if (found < 0) return bs_fail(COH_EINVAL, "no network interface or address named \"%s\"", s);
    return 0;
}

void rx_format_addr(const struct sockaddr *sa, char *out, size_t cap)
{
    char ip[64] = "?";
    int port = 0;
    if (sa->sa_family == AF_INET) {
        uv_ip4_name((const struct sockaddr_in *)sa, ip, sizeof(ip));
        port = ntohs(((const struct sockaddr_in *)sa)->sin_port);
        snprintf(out, cap, "%s:%d", ip, port);
    } else if (sa->sa_family == AF_INET6) {
        uv_ip6_name((const struct sockaddr_in6 *)sa, ip, sizeof(ip));
        port = ntohs(((const struct sockaddr_in6 *)sa)->sin6_port);
        snprintf(out, cap, "[%s]:%d", ip, port);
    } else {
        snprintf(out, cap, "?");
    }
}
