/*
 * The bootstrap store: codec, server (its table, on a framed-connection
 * listener of rank 0's control reactor: reactor/rx_conn.h) and a blocking
 * client (used only inside coh_init).
 */
#include "reactor/rx_store.h"

#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engines/en_frame.h"
#include "reactor/rx_conn.h"

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
#define TICK_MS  50

typedef struct kv {
    struct kv *next;
    uint8_t *key;
    size_t klen;
    uint8_t *val;
    size_t vlen;
} kv_t;

/* A client's state, beside its connection (rx_conn_t.data). */
typedef struct st_client {
    rx_conn_t *conn;
    struct st_client *prev, *next;
    bool waiting; /* a WAIT is pending: later requests wait their turn */
    uint8_t wkey[RX_STORE_KEY_MAX];
    size_t wklen;
    uint64_t wdeadline_ns;
} st_client_t;

struct rx_store_server {
    rx_listener_t *listener;
    uv_timer_t tick;
    kv_t *buckets[NBUCKETS];
    st_client_t *clients;
    char token[EN_TOKEN_MAX + 1];
    int world;
    size_t nkeys, nbytes;       /* what the table holds (bytes as RX_STORE_MAX_BYTES counts) */
    size_t max_keys, max_bytes; /* RX_STORE_MAX_KEYS/BYTES(world) */
    bool closing;
    struct sockaddr_storage addr;
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

/* kv_set: the table is at its caps (not an error status: the store goes on). */
#define KV_FULL 1

static int kv_set(rx_store_server_t *s, const uint8_t *k, size_t n, const uint8_t *v, size_t vn)
{
    kv_t *e = kv_find(s, k, n);
    size_t keys = s->nkeys + (e ? 0 : 1);
    size_t bytes = s->nbytes - (e ? e->vlen : 0) + vn + (e ? 0 : n + RX_STORE_KV_OVERHEAD);
    if (keys > s->max_keys || bytes > s->max_bytes) return KV_FULL;
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
    s->nkeys = keys;
    s->nbytes = bytes;
    return 0;
}

static void reply(st_client_t *c, uint8_t status, uint32_t arg, const void *val, size_t vlen)
{
    uint8_t stack[256];
    size_t n = RX_STORE_HDR + vlen;
    uint8_t *b = n <= sizeof(stack) ? stack : coh_malloc(n);
    int len = b ? rx_store_encode(RX_STORE_RESP, status, arg, NULL, 0, val, vlen, b, n) : -1;
    if (len < 0 || rx_conn_send(c->conn, b, (size_t)len) != 0)
        rx_conn_close(c->conn, COH_ENOMEM, "cannot answer");
    if (b != stack) coh_free(b);
}

/* A SET or ADD that kv_set refused: say why. */
static void reply_refused(st_client_t *c, rx_store_server_t *s, int st)
{
    char why[160];
    int n = st == KV_FULL ? snprintf(why, sizeof(why),
                                     "store full: it holds %zu keys and %zu bytes, at most %zu "
                                     "keys and %zu bytes for a world of %d",
                                     s->nkeys, s->nbytes, s->max_keys, s->max_bytes, s->world)
                          : snprintf(why, sizeof(why), "out of memory");
    reply(c, RX_STORE_ERROR, 0, why, (size_t)n);
}

/* Answer WAITs on key (or all expired ones when key is NULL); each client
 * answered goes on with the requests it sent meanwhile. */
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
        /* Resuming may answer, close or free others: start over. */
        rx_conn_resume(c->conn);
        next = s->clients;
    }
}

static void handle(st_client_t *c, rx_store_server_t *s, const rx_store_msg_t *m)
{
    switch (m->type) {
    case RX_STORE_SET: {
        int st = kv_set(s, m->key, m->klen, m->val, m->vlen);
        if (st != 0) {
            reply_refused(c, s, st);
            return;
        }
        reply(c, RX_STORE_OK, 0, NULL, 0);
        wake_waiters(s, m->key, m->klen, 0);
        return;
    }
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
        int st = kv_set(s, m->key, m->klen, (const uint8_t *)out, (size_t)n);
        if (st != 0) {
            reply_refused(c, s, st);
            return;
        }
        reply(c, RX_STORE_OK, 0, out, (size_t)n);
        wake_waiters(s, m->key, m->klen, 0);
        return;
    }
    default: rx_conn_close(c->conn, COH_EPROTO, "a response sent to the store");
    }
}

/* One request off the stream; 0 while a WAIT of this client is pending. */
static int st_parse(rx_conn_t *conn, const uint8_t *buf, size_t len)
{
    st_client_t *c = conn->data;
    if (!c || c->waiting) return 0;
    rx_store_msg_t m;
    int n = rx_store_parse(buf, len, &m);
    if (n > 0) handle(c, conn->owner, &m);
    return n;
}

static void st_ready(rx_conn_t *conn)
{
    rx_store_server_t *s = conn->owner;
    st_client_t *c = coh_zalloc(sizeof(*c));
    if (!c) {
        rx_conn_close(conn, COH_ENOMEM, "out of memory");
        return;
    }
    c->conn = conn;
    conn->data = c;
    c->next = s->clients;
    if (s->clients) s->clients->prev = c;
    s->clients = c;
}

static void st_close(rx_conn_t *conn, int status, const char *why)
{
    rx_store_server_t *s = conn->owner;
    st_client_t *c = conn->data;
    /* Clients hang up when they are done; only refusals are news. */
    if (!conn->ready && status != COH_ECANCELED)
        bs_log(COH_LOG_WARN, "store: dropped a client: %s", why);
    if (!c) return;
    if (c->prev)
        c->prev->next = c->next;
    else
        s->clients = c->next;
    if (c->next) c->next->prev = c->prev;
    coh_free(c);
    conn->data = NULL;
}

static const rx_conn_proto_t store_proto = {.name = "store",
                                            .hello_kind = EN_HELLO_STORE,
                                            .max_msg = MSG_MAX,
                                            .parse = st_parse,
                                            .on_ready = st_ready,
                                            .on_close = st_close};

static void on_tick(uv_timer_t *t)
{
    wake_waiters(t->data, NULL, 0, bs_now_ns());
}

static void tick_closed(uv_handle_t *h)
{
    rx_store_server_t *s = h->data;
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

int rx_store_server_start(rx_reactor_t *rx, const struct sockaddr *addr, int fd, const char *token,
                          int world, uint32_t incarnation, rx_store_server_t **out)
{
    rx_store_server_t *s = coh_zalloc(sizeof(*s));
    if (!s) return COH_ENOMEM;
    s->world = world;
    s->max_keys = RX_STORE_MAX_KEYS(world);
    s->max_bytes = RX_STORE_MAX_BYTES(world);
    snprintf(s->token, sizeof(s->token), "%s", token ? token : "");
    uv_timer_init(&rx->loop, &s->tick);
    s->tick.data = s;
    int st =
        rx_listener_start(&rx->loop, addr, fd, &store_proto, s, s->token, 0, world, &s->listener);
    if (st < 0) {
        uv_close((uv_handle_t *)&s->tick, tick_closed);
        return st;
    }
    s->addr = s->listener->addr;
    /* Before this callback returns, so before any client is answered. */
    s->listener->hello_rail = incarnation;
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
    return s->listener ? rx_listener_rejected(s->listener) : 0;
}

void rx_store_server_close(rx_store_server_t *s)
{
    if (s->closing) return;
    s->closing = true;
    rx_listener_close(s->listener); /* every client's st_close runs now */
    s->listener = NULL;
    uv_close((uv_handle_t *)&s->tick, tick_closed);
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

/* send_all and recv_all: COH_EPEER when the server closed the connection,
 * COH_EAGAIN when it reset it (it dropped us unread: too many handshakes at
 * once, or the store is closing), which is worth another try. */
static int hang_up(void)
{
    return errno == ECONNRESET || errno == EPIPE ? COH_EAGAIN : COH_EPEER;
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
            return hang_up();
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
            return r == 0 ? COH_EPEER : hang_up();
        }
    }
    return 0;
}

static socklen_t sa_len(const struct sockaddr *a)
{
    return a->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
}

/* A TCP connection to addr, retrying while nobody listens (rank 0 may not
 * be up yet, or between two incarnations). */
static int dial(const struct sockaddr *addr, const char *where, int *delay_ms, uint64_t deadline_ns)
{
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
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
            return fd;
        }
        int last = errno;
        close(fd);
        if (bs_now_ns() + (uint64_t)*delay_ms * 1000000ull >= deadline_ns)
            return bs_fail(COH_EBOOTSTRAP, "store %s unreachable: %s", where, strerror(last));
        uv_sleep((unsigned)*delay_ms);
        if (*delay_ms < 200) *delay_ms *= 2;
    }
}

int rx_store_connect(rx_store_client_t *c, const struct sockaddr *addr, const char *token, int rank,
                     int world, uint32_t incarnation, uint64_t deadline_ns)
{
    memset(c, 0, sizeof(*c));
    c->fd = -1;
    char where[128];
    rx_format_addr(addr, where, sizeof(where));
    int delay_ms = 10, drops = 0;
    uint32_t older = 0; /* an older incarnation answered: its store is going */
    for (;;) {
        int fd = dial(addr, where, &delay_ms, deadline_ns);
        if (fd < 0 && older) {
            char why[BS_ERR_LEN];
            snprintf(why, sizeof(why), "%s", coh_last_error());
            return bs_fail(fd,
                           "%s (it served incarnation %u of the job before, this rank is at %u)",
                           why, older, incarnation);
        }
        if (fd < 0) return fd;
        c->fd = fd;
        en_hello_t h = {.version = EN_PROTO_VERSION,
                        .kind = EN_HELLO_STORE,
                        .rank = (uint32_t)rank,
                        .world = (uint32_t)world,
                        .rail = incarnation};
        en_hello_set_token(&h, token);
        uint8_t hb[EN_HELLO_SIZE];
        en_hello_encode(&h, hb);
        int e = send_all(c->fd, hb, sizeof(hb), deadline_ns);
        if (!e) e = recv_all(c->fd, hb, sizeof(hb), deadline_ns);
        en_hello_t got;
        if (!e && (en_hello_decode(hb, sizeof(hb), &got) != EN_HELLO_SIZE ||
                   !en_hello_token_ok(&got, token) || got.kind != EN_HELLO_STORE))
            e = COH_EAUTH;
        if (!e && (int)got.world != world) {
            rx_store_close(c);
            return bs_fail(COH_EMISMATCH,
                           "store %s serves a world of %u ranks, this rank (%d) has world size %d: "
                           "every rank needs the same world size (COHORT_WORLD_SIZE)",
                           where, got.world, rank, world);
        }
        if (!e && got.rail > incarnation) {
            rx_store_close(c);
            return bs_fail(COH_EMISMATCH,
                           "store %s serves incarnation %u of the job, this rank is at %u: every "
                           "rank must call coh_init as often",
                           where, got.rail, incarnation);
        }
        if (!e && got.rail == incarnation) break;
        /* Try again: an older store (rank 0 still finalizing it); a reset
         * (a store with too many handshakes at once, or one closing); a
         * store that closed on us after it answered an older incarnation,
         * or (twice) when this is not the first init. A first init has no
         * older store: a close there is a refusal. */
        bool retry = !e || e == COH_EAGAIN ||
                     (e == COH_EPEER && (older || (incarnation > 1 && drops++ < 2)));
        if (!e) older = got.rail;
        rx_store_close(c);
        if (retry && bs_now_ns() + (uint64_t)delay_ms * 1000000ull < deadline_ns) {
            uv_sleep((unsigned)delay_ms);
            if (delay_ms < 200) delay_ms *= 2;
            continue;
        }
        if (older)
            return bs_fail(COH_EBOOTSTRAP,
                           "store %s still serves incarnation %u of the job at the deadline, this "
                           "rank is at %u (every rank must call coh_init as often)",
                           where, older, incarnation);
        if (e == COH_EAGAIN)
            return bs_fail(COH_EBOOTSTRAP, "store %s kept resetting the connection", where);
        if (e == COH_EPEER || e == COH_EAUTH)
            return bs_fail(COH_EAUTH,
                           "store %s refused the handshake (a wrong job token? COHORT_TOKEN must "
                           "be the same on every rank)",
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
    if (e == COH_EAGAIN) e = COH_EPEER; /* EAGAIN means "not found" to the callers */
    if (e) return bs_fail(e, "store request for \"%s\": %s", key, coh_strerror(e));
    return 0;
}

/* The reason an error response carries (older servers send none). */
static const char *resp_why(const rx_store_msg_t *m)
{
    return m->vlen ? (const char *)m->val : "error";
}

static int resp_why_len(const rx_store_msg_t *m)
{
    return m->vlen ? (int)m->vlen : 5;
}

int rx_store_set(rx_store_client_t *c, const char *key, const void *val, size_t vlen,
                 uint64_t deadline_ns)
{
    rx_store_msg_t m;
    BS_CHECK(roundtrip(c, RX_STORE_SET, 0, key, val, vlen, &m, deadline_ns));
    if (m.status == RX_STORE_OK) return 0;
    return bs_fail(COH_EBOOTSTRAP, "store refused to set %s: %.*s", key, resp_why_len(&m),
                   resp_why(&m));
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
    if (m.status != RX_STORE_OK)
        return bs_fail(COH_EBOOTSTRAP, "store refused to add to %s: %.*s", key, resp_why_len(&m),
                       resp_why(&m));
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
