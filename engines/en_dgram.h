/*
 * en_dgram.h - the bounded-loss datagram protocol's pure parts (DLCP,
 * issue 11): no sockets, no clocks of their own, so every piece is tested
 * alone.
 *
 *   header   the fixed header of a data datagram (encode, checked decode)
 *   bitmap   which segments of a transfer arrived (duplicates found)
 *   bound    whether the received fraction meets a loss bound, and the
 *            missing ranges to ask for again
 *   rate     the minimal rate control of DLCP's Figure 7, driven by the
 *            receiver's reports, and a pacer that turns a rate into delays
 *   tag      per-datagram DSCP priority (layer x of L -> floor(x*P/L)) and
 *            ECN capability (mean magnitude above the tensor's median,
 *            estimated from a 0.1% sample)
 *
 * Data datagram layout (little-endian, EN_DG_HDR bytes, then the payload):
 *   0 u8 version    1 u8 flags (EN_DG_*)
 *   2 u48 job: a value derived from the job token (strangers cannot guess it)
 *   8 u32 comm     12 u48 seq (the op)    18 u24 step (the op's step tag)
 *  21 u24 segno
 * The payload is the rest of the datagram (len); it starts segno segment
 * sizes into the step's buffer (offset). Neither goes on the wire. 24
 * bytes leave a 1500-byte packet 1448 of payload, what a TCP segment with
 * timestamps carries: version 2's 32 (a u16 magic, u64 job and seq, u32
 * step and segno) cost udp 0.55% of its rate against tcp's; version 1
 * spelled out the offset and length (48 bytes). The job value stands for
 * the magic. Limits: EN_DG_SEQ_MAX ops, EN_DG_STEP_MAX tags, EN_DG_NSEG_MAX
 * segments a step (24 GB at 1448 bytes).
 */
#ifndef COH_EN_DGRAM_H
#define COH_EN_DGRAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define EN_DG_VERSION  3
#define EN_DG_HDR      24
#define EN_DG_MAX      65507 /* a UDP payload's limit */
#define EN_DG_JOB_MASK 0xffffffffffffull
#define EN_DG_SEQ_MAX  0xffffffffffffull
#define EN_DG_STEP_MAX 0xffffffu
#define EN_DG_NSEG_MAX 0x1000000u

/* flags */
#define EN_DG_PULL 1u /* a gather (pull) stage's data; else push (reduce) */
#define EN_DG_LAST 2u /* the sender's last datagram of this pass */
/* A rate report (receiver -> sender, DLCP's every-period report): offset and
 * segno 0, payload u64 bytes received, u64 over how many ns. Unreliable on
 * purpose: a lost one skips a period. */
#define EN_DG_RATE 4u
/* A copy of a control message of the TCP link (DONE, NACK, FIN; the same
 * payload): it usually arrives first; the TCP copy is the reliable one. */
#define EN_DG_CTL   8u
#define EN_DG_FLAGS (EN_DG_PULL | EN_DG_LAST | EN_DG_RATE | EN_DG_CTL)

typedef struct en_dg_hdr {
    uint8_t flags;
    uint64_t job;
    uint32_t comm, step;
    uint64_t seq;
    uint64_t offset;
    uint32_t len;
    uint32_t segno;
} en_dg_hdr_t;

/* offset and len are not encoded: the decoder derives them. job, seq, step
 * and segno are cut to their widths (the caller keeps within the limits). */
void en_dg_encode(const en_dg_hdr_t *h, uint8_t out[EN_DG_HDR]);
/* The job value of a token (48 bits): what every datagram of the job carries. */
uint64_t en_dg_job(const char *token);
/* A datagram of n bytes: its header, checked, with len (n - EN_DG_HDR) and
 * offset (segno * seg) derived. Returns 0, or COH_EPROTO for a bad version
 * or flags, or a payload longer than one segment. seg: the
 * transfer's segment size. The job, the op and the bounds of the posted
 * buffer are the caller's to check. */
int en_dg_decode(const uint8_t *buf, size_t n, uint32_t seg, en_dg_hdr_t *out);

/* ---- which segments arrived ---- */

typedef struct en_dg_bitmap {
    uint64_t *words;
    uint32_t nseg;
    uint32_t got;
} en_dg_bitmap_t;

int en_dg_bitmap_init(en_dg_bitmap_t *b, uint32_t nseg); /* COH_ENOMEM */
void en_dg_bitmap_fini(en_dg_bitmap_t *b);
void en_dg_bitmap_clear(en_dg_bitmap_t *b);
/* 1: newly set; 0: a duplicate; COH_EINVAL: out of range. */
int en_dg_bitmap_set(en_dg_bitmap_t *b, uint32_t i);
bool en_dg_bitmap_test(const en_dg_bitmap_t *b, uint32_t i);
/* The first segment >= from that has not arrived, or nseg. */
uint32_t en_dg_bitmap_next_missing(const en_dg_bitmap_t *b, uint32_t from);

/* ---- the loss bound ---- */

/* Segments of seg bytes over total bytes (the last may be short). */
uint32_t en_dg_nseg(uint64_t total, uint32_t seg);
/* Bytes of the segments that arrived. */
uint64_t en_dg_bytes_got(const en_dg_bitmap_t *b, uint64_t total, uint32_t seg);
/* The received fraction meets the bound: got >= (1 - bound) * total. A
 * bound of 0 asks for every byte. */
bool en_dg_bound_met(uint64_t got, uint64_t total, double bound);

typedef struct en_dg_range {
    uint32_t first, count; /* segments */
} en_dg_range_t;
/* The missing segments as ranges, in order, up to cap of them; returns how
 * many there are (may exceed cap). */
int en_dg_missing(const en_dg_bitmap_t *b, en_dg_range_t *out, int cap);

/* ---- minimal rate control (DLCP Fig. 7) ---- */

typedef enum en_rc_state {
    EN_RC_LINE = 0,  /* line rate start */
    EN_RC_AVOID = 1, /* congestion avoidance */
} en_rc_state;

typedef struct en_rc {
    double line_bps; /* the link's rate: where a flow starts */
    double delta;    /* sending > delta x receiving: congestion (DLCP: 2) */
    double ai_frac;  /* additive increase per period, of line_bps (DLCP: 0.05) */
    double rate_bps; /* the sending rate now */
    en_rc_state state;
    uint64_t halvings, increases; /* for tests and stats */
} en_rc_t;

void en_rc_init(en_rc_t *rc, double line_bps, double delta, double ai_frac);
/*
 * One period's report from the receiver: what this side sent and what the
 * receiver received, both in bits per second over that period. The reading
 * of the paper used (its second bullet is garbled: it says halve when the
 * sending rate is *smaller* than delta x the receiving rate, which would
 * halve a healthy flow forever): in either state, sending > delta x
 * receiving means congestion, so the rate halves (and a line-rate flow
 * enters congestion avoidance); in congestion avoidance, otherwise, the rate
 * grows by ai_frac x line rate, up to the line rate. A period with nothing
 * sent says nothing.
 */
void en_rc_report(en_rc_t *rc, double sent_bps, double recv_bps);
/* A retransmission pass starts: back to line rate start. */
void en_rc_retransmit(en_rc_t *rc);

/* Paces datagrams at a rate: when the next may leave. */
typedef struct en_pacer {
    uint64_t next_ns;
} en_pacer_t;
/* Nanoseconds to wait before sending `bytes` at rate_bps from now_ns (0:
 * now); the send is then accounted. A pacer that fell behind does not
 * burst to catch up by more than one period's worth (burst_ns). */
uint64_t en_pacer_delay(en_pacer_t *p, uint64_t now_ns, double rate_bps, size_t bytes,
                        uint64_t burst_ns);
/* Spraying: the path of n the next datagram takes. Of those in avail, the
 * one whose pacers let it out first (next_ns[k]: the later of the flow's and
 * the path's line pacer), when that is not after now; a tie goes to the
 * first in turn from path `first`. -1: none may send now. Per datagram, so
 * equal paths alternate and one of a quarter of the rate carries every
 * fifth. */
int en_dg_spray_pick(const uint64_t *next_ns, int n, unsigned avail, int first, uint64_t now);

/* ---- tagging ---- */

/* Priority of layer x of L over P priorities: floor(x * P / L), in [0, P);
 * 0 without a layer (x < 0 or L < 1). */
int en_tag_prio(int layer, int nlayers, int prios);
/* The IP TOS byte: DSCP class selector of prio (CS0..CS7: prio << 3) and
 * ECT(0) when ecn. */
uint8_t en_tag_tos(int prio, bool ecn);
/* The median of |x| over a sample of about frac of n values (at least 16,
 * or all of them), taken at evenly spaced positions. f32 or f64 values
 * (es 4 or 8); 0 for an empty tensor. */
double en_tag_median(const void *x, size_t n, size_t es, double frac);
/* The mean |x| of a datagram's values is above the median: mark it
 * ECN-capable (a RED/ECN switch then marks instead of dropping it). */
bool en_tag_important(const void *x, size_t n, size_t es, double median);

#endif
