/*
 * rx_store.h - the bootstrap key-value store: rank 0 serves it on its
 * control reactor, every rank uses it through a blocking client during
 * coh_init to exchange per-rail addresses. Connections open with the same
 * HELLO as data connections (job token first).
 *
 * Incarnations: a process may init, finalize and init again, and rank 0's
 * store of the previous context may still be up (rank 0 still finalizing)
 * when another rank's next init dials it. The store answers the HELLO with
 * its incarnation in the rail field; a client talks only to the store of its
 * own incarnation and keeps trying until that one is up.
 *
 * Message: a 16-byte header, then key, then value (little-endian).
 *   0  u32 magic "COHS"     4  u8 type    5  u8 status   6  u16 key length
 *   8  u32 value length     12 u32 arg (WAIT: timeout ms; ADD: signed delta)
 */
#ifndef COH_RX_STORE_H
#define COH_RX_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "reactor/reactor.h"

#define RX_STORE_MAGIC   0x53484f43u /* "COHS" */
#define RX_STORE_HDR     16
#define RX_STORE_KEY_MAX 512
#define RX_STORE_VAL_MAX (64 * 1024)

/* What the store holds at most, so that a token holder cannot grow rank 0
 * without bound: a bootstrap needs a few keys of some tens of bytes per rank
 * (2 + rails). Bytes count keys, values and RX_STORE_KV_OVERHEAD per key. A
 * SET or ADD that would go beyond is answered RX_STORE_ERROR ("store full");
 * the connection stays. */
#define RX_STORE_KEYS_BASE       1024
#define RX_STORE_KEYS_PER_RANK   32
#define RX_STORE_BYTES_BASE      (16u << 20)
#define RX_STORE_BYTES_PER_RANK  (4u << 10)
#define RX_STORE_KV_OVERHEAD     64
#define RX_STORE_MAX_KEYS(world) (RX_STORE_KEYS_BASE + RX_STORE_KEYS_PER_RANK * (size_t)(world))
#define RX_STORE_MAX_BYTES(world)                                                                  \
    ((size_t)RX_STORE_BYTES_BASE + RX_STORE_BYTES_PER_RANK * (size_t)(world))

typedef enum rx_store_type {
    RX_STORE_SET = 1,
    RX_STORE_GET = 2,  /* answers NOTFOUND at once when missing */
    RX_STORE_WAIT = 3, /* answers when the key exists, or TIMEOUT */
    RX_STORE_ADD = 4,  /* atomic add to a decimal counter; answers the new value */
    RX_STORE_RESP = 0x80,
} rx_store_type;

typedef enum rx_store_status {
    RX_STORE_OK = 0,
    RX_STORE_NOTFOUND = 1,
    RX_STORE_TIMEOUT = 2,
    RX_STORE_ERROR = 3,
} rx_store_status;

typedef struct rx_store_msg {
    uint8_t type;
    uint8_t status;
    uint32_t arg;
    const uint8_t *key; /* points into the parsed buffer */
    size_t klen;
    const uint8_t *val;
    size_t vlen;
} rx_store_msg_t;

/* Returns the bytes the message takes when buf holds all of it, 0 when more
 * bytes are needed, COH_EPROTO for bytes that cannot be a message. */
int rx_store_parse(const uint8_t *buf, size_t len, rx_store_msg_t *m);
/* Encode into out (cap bytes); returns the length or COH_EINVAL. */
int rx_store_encode(uint8_t type, uint8_t status, uint32_t arg, const void *key, size_t klen,
                    const void *val, size_t vlen, uint8_t *out, size_t cap);

/* ---- server (runs on a reactor) ---- */
typedef struct rx_store_server rx_store_server_t;
/* On rx's loop thread (use rx_reactor_call): listen on addr, or adopt the
 * listening socket fd when fd >= 0 (the caller has checked that it is one).
 * incarnation: which init of the job this is (see above). */
int rx_store_server_start(rx_reactor_t *rx, const struct sockaddr *addr, int fd, const char *token,
                          int world, uint32_t incarnation, rx_store_server_t **out);
/* On the loop thread: close the listener and every client; frees itself. */
void rx_store_server_close(rx_store_server_t *s);
/* The address it listens on (any thread, after start). */
int rx_store_server_addr(rx_store_server_t *s, struct sockaddr_storage *addr);
/* Connections refused at the handshake so far (any thread). */
uint64_t rx_store_server_rejected(rx_store_server_t *s);

/* ---- blocking client ---- */
typedef struct rx_store_client {
    int fd;
    uint8_t *buf; /* response buffer */
    size_t cap;
} rx_store_client_t;

/* Connect and handshake, retrying until the server of this incarnation is
 * up (an older one is left at once). COH_EAUTH: refused (the token);
 * COH_EMISMATCH: the store serves another world size, or a later
 * incarnation; COH_EBOOTSTRAP: not reached by the deadline. */
int rx_store_connect(rx_store_client_t *c, const struct sockaddr *addr, const char *token, int rank,
                     int world, uint32_t incarnation, uint64_t deadline_ns);
int rx_store_set(rx_store_client_t *c, const char *key, const void *val, size_t vlen,
                 uint64_t deadline_ns);
/* GET (timeout_ms < 0) or WAIT (timeout_ms >= 0). *vlen gets the value's
 * length, which may exceed cap (the value is cut). COH_EAGAIN: not found;
 * COH_ETIMEDOUT: WAIT timed out. */
int rx_store_get(rx_store_client_t *c, const char *key, void *val, size_t cap, size_t *vlen,
                 int timeout_ms, uint64_t deadline_ns);
int rx_store_add(rx_store_client_t *c, const char *key, int32_t delta, int64_t *value,
                 uint64_t deadline_ns);
void rx_store_close(rx_store_client_t *c);

#endif
