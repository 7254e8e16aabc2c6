/*
 * en_frame.h - wire formats of the data plane (pure codecs, fuzzed).
 *
 * Every connection starts with a HELLO in each direction (job token, rank,
 * rail; 112 bytes: magic, u16 version, u16 kind, u32 rank, world, rail,
 * nrails, 64-byte token, u32 flags, u32 via, u64 resume_off, u64 epoch); after that a stream
 * carries frames: a fixed 48-byte header, then `len` payload bytes. All integers are little-endian
 * on the wire.
 *
 *   off  size  field
 *   0    4     magic "COHF"
 *   4    1     type (EN_FRAME_*)
 *   5    1     flags (0)
 *   6    2     reserved (0)
 *   8    4     comm   communicator id
 *   12   4     tag    plan step tag (sched/sc_plan.h)
 *   16   8     seq    op sequence number in the communicator
 *   24   8     sig    op signature: kind, dtype, op, count, root, size
 *   32   8     off    byte offset of the payload within the message
 *   40   8     len    payload bytes
 */
#ifndef COH_EN_FRAME_H
#define COH_EN_FRAME_H

#include <stddef.h>
#include <stdint.h>

#define EN_FRAME_MAGIC   0x46484f43u /* "COHF" */
#define EN_HELLO_MAGIC   0x48484f43u /* "COHH" */
#define EN_HDR_SIZE      48
#define EN_HELLO_SIZE    112
#define EN_TOKEN_MAX     64
#define EN_PROTO_VERSION 2
#define EN_MAX_PAYLOAD   (1ull << 40)
#define EN_MAX_ABORT     512

typedef enum en_frame_type {
    EN_FRAME_DATA = 1,  /* tensor bytes for (comm, seq, tag) */
    EN_FRAME_ABORT = 2, /* the sender failed op (comm, seq): i32 status + reason text */
    EN_FRAME_BYE = 3,   /* the sender is finalizing: a close that follows is not a failure */
    /* The receiver has consumed `off` bytes of the sender's frames (ACKs
     * excluded): they need never be sent again. Only with failover. */
    EN_FRAME_ACK = 4,
    /* Bounded-loss control of a datagram step (comm, seq, tag): a kind
     * (DONE, NACK, FIN, RATE), counters, missing ranges (engines/en_udp.c). */
    EN_FRAME_DGCTL = 5,
} en_frame_type;

typedef struct en_hdr {
    uint8_t type;
    uint8_t flags;
    uint32_t comm;
    uint32_t tag;
    uint64_t seq;
    uint64_t sig;
    uint64_t off;
    uint64_t len;
} en_hdr_t;

typedef enum en_hello_kind {
    EN_HELLO_DATA = 1,  /* a data rail connection */
    EN_HELLO_STORE = 2, /* a client of the bootstrap store */
    EN_HELLO_CTRL = 3,  /* a control-plane connection to the coordinator */
} en_hello_kind;

typedef struct en_hello {
    uint16_t version;
    uint16_t kind;
    uint32_t rank;
    uint32_t world;
    uint32_t rail;
    uint32_t nrails;
    uint8_t token[EN_TOKEN_MAX]; /* zero padded */
    uint32_t flags;              /* EN_HELLO_RESUME, EN_HELLO_REJOIN */
    uint32_t via;                /* RESUME: the interface (rail index) the dialler left by */
    uint64_t resume_off;         /* RESUME: bytes of the peer's frames this side consumed */
    uint64_t epoch; /* RESUME: moves of the link this side has seen (stale dials lose) */
} en_hello_t;

/* The connection continues an existing link on a new socket (failover, or
 * its return): each side sends again from the other's resume_off. */
#define EN_HELLO_RESUME 1u
/* The sender restarts a rank that failed (COHORT_REJOIN): a new incarnation
 * takes the failed one's place, whichever side dials (docs/relay.md). */
#define EN_HELLO_REJOIN 2u

void en_hdr_encode(const en_hdr_t *h, uint8_t out[EN_HDR_SIZE]);
/* Returns EN_HDR_SIZE when buf holds a valid header, 0 when it needs more
 * bytes, COH_EPROTO when the bytes cannot be a header. Resumable: call again
 * with more bytes. */
int en_hdr_decode(const uint8_t *buf, size_t len, en_hdr_t *out);

void en_hello_encode(const en_hello_t *h, uint8_t out[EN_HELLO_SIZE]);
int en_hello_decode(const uint8_t *buf, size_t len, en_hello_t *out);
/* Fill the token field from a string (at most EN_TOKEN_MAX bytes). */
void en_hello_set_token(en_hello_t *h, const char *token);
/* Constant-time comparison of the token field against a string. 1 if equal. */
int en_hello_token_ok(const en_hello_t *h, const char *token);

/* Little-endian helpers shared by the codecs. */
static inline void en_put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline void en_put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void en_put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t en_get16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}
static inline uint32_t en_get32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint64_t en_get64(const uint8_t *p)
{
    return (uint64_t)en_get32(p) | ((uint64_t)en_get32(p + 4) << 32);
}

#endif
