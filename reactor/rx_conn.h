/*
 * rx_conn.h - a framed TCP connection on a reactor, and a listener for it:
 * the one reader behind the control plane (rx_ctl.h) and the bootstrap
 * store (rx_store.h), as libuv's stream.c serves tcp, pipes and ttys alike.
 *
 * A connection opens with a HELLO in each direction (engines/en_frame.h:
 * job token first, then kind and world size, checked before any other byte
 * is read; the dialler speaks first, the listener answers). Then the
 * protocol's parse function takes messages off the stream: it is given the
 * buffered bytes and returns how many one message took (it has handled it),
 * 0 when it needs more or holds off (rx_conn_resume goes on), or a negative
 * status for bytes that cannot be a message (the connection closes). A
 * hello with the job's token but another world size is answered before the
 * connection closes, so that the dialler can say what differs. A
 * connection that never says HELLO is closed after RX_CONN_HELLO_MS; a
 * message may not exceed the protocol's max_msg.
 *
 * Threading: everything here runs on the loop's thread. Memory: a
 * connection is freed after its on_close ran and its handles closed; a
 * listener after rx_listener_close and its connections' close.
 */
#ifndef COH_RX_CONN_H
#define COH_RX_CONN_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <uv.h>

#include "engines/en_frame.h"

#define RX_CONN_HELLO_MS 10000
#define RX_CONN_PENDING  64 /* connections a listener lets handshake at once */

typedef struct rx_conn rx_conn_t;
typedef struct rx_listener rx_listener_t;

typedef struct rx_conn_proto {
    const char *name;    /* "control", "store": for messages */
    uint16_t hello_kind; /* EN_HELLO_CTRL, EN_HELLO_STORE */
    size_t max_msg;      /* bytes of one message, header included */
    /* One message off buf[0, len): see above. May close c. */
    int (*parse)(rx_conn_t *c, const uint8_t *buf, size_t len);
    /* The handshake passed: c->peer is the peer's rank. May close c. */
    void (*on_ready)(rx_conn_t *c);
    /* Once: the connection is gone (after on_ready, or a failed handshake
     * with ready false). c is freed after this returns. */
    void (*on_close)(rx_conn_t *c, int status, const char *why);
} rx_conn_proto_t;

struct rx_conn {
    uv_tcp_t tcp;
    uv_timer_t hs_timer;
    uv_connect_t creq;
    const rx_conn_proto_t *proto;
    rx_listener_t *listener; /* accepted on, or NULL (dialled) */
    rx_conn_t *prev, *next;  /* the listener's connections */
    void *owner;             /* the listener's owner, or the dialler's */
    void *data;              /* the protocol user's, per connection */
    int peer;                /* the peer's rank, -1 until the handshake */
    bool ready, closing, outgoing, reading;
    bool wfailed;   /* a write failed with input unread: closed once it is read */
    bool connected; /* dialled: the TCP connect succeeded (a close before ready
                       with connected false means nobody listens there) */
    const char *token;
    int rank, world;
    uint32_t hello_flags; /* sent in this side's hello (set before it goes) */
    uint32_t peer_flags;  /* the peer's hello's flags */
    uint8_t hello[EN_HELLO_SIZE];
    size_t hello_got;
    uint8_t *buf;
    size_t len, cap;
    int handles;
    bool parsing;
    bool handles_closing; /* uv_close called on both handles */
    uv_shutdown_t shut;   /* rx_conn_close_flushed */
};

struct rx_listener {
    uv_tcp_t tcp;
    const rx_conn_proto_t *proto;
    void *owner;
    const char *token;
    int rank, world;
    bool closing, open;
    int pending; /* connections still in their handshake */
    rx_conn_t *conns;
    struct sockaddr_storage addr;
    _Atomic uint64_t rejected; /* handshakes refused: wrong token, garbage, too slow, too many */
    uint32_t hello_rail; /* the rail field of every answering hello (the store's incarnation) */
};

/* Listen on addr (port 0: any), or adopt the listening socket fd >= 0. The
 * token, ranks and world answer and check every hello; token must outlive
 * the listener. */
int rx_listener_start(uv_loop_t *loop, const struct sockaddr *addr, int fd,
                      const rx_conn_proto_t *proto, void *owner, const char *token, int rank,
                      int world, rx_listener_t **out);
/* close: stop accepting and close every connection accepted on it. */
void rx_listener_close(rx_listener_t *l);
uint64_t rx_listener_rejected(rx_listener_t *l); /* any thread */

/* Dial addr from local (port 0; NULL: any) and handshake as rank. */
int rx_conn_dial(uv_loop_t *loop, const struct sockaddr *local, const struct sockaddr *addr,
                 const rx_conn_proto_t *proto, void *owner, const char *token, int rank, int world,
                 rx_conn_t **out);
/* Queue n bytes (copied); COH_EPEER once the connection is closing. */
int rx_conn_send(rx_conn_t *c, const void *bytes, size_t n);
/* Close; on_close runs from here (or has run). */
void rx_conn_close(rx_conn_t *c, int status, const char *why);
/* The same for the owner (on_close runs from here, nothing more is read or
 * sent), but what was queued still goes out before the socket closes, for
 * at most ms (or until its listener closes): the last words to a peer sent
 * away (the LOST that excludes it). rx_conn_close drops queued bytes. */
void rx_conn_close_flushed(rx_conn_t *c, int status, const char *why, unsigned ms);
/* Parse what is buffered again: the protocol held off and can go on. */
void rx_conn_resume(rx_conn_t *c);
/* Whether the peer's bytes (or its close) wait unread in c's socket. A
 * silence check asks first: after this process stalled (stopped, or a loop
 * thread busy for longer than the liveness time) the timer that checks runs
 * before the loop reads, and the peer only seems silent. */
bool rx_conn_input_pending(const rx_conn_t *c);

#endif
