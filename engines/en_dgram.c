/* The bounded-loss datagram protocol's pure parts (see en_dgram.h). */
#include "engines/en_dgram.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cohort.h"
#include "engines/en_frame.h"
#include "base/base.h"
#include "base/bs_alloc.h"

/* ---- header ---- */

static void put24(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
}

static uint32_t get24(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16;
}

static void put48(uint8_t *p, uint64_t v)
{
    en_put32(p, (uint32_t)v);
    en_put16(p + 4, (uint16_t)(v >> 32));
}

static uint64_t get48(const uint8_t *p)
{
    return (uint64_t)en_get32(p) | (uint64_t)en_get16(p + 4) << 32;
}

void en_dg_encode(const en_dg_hdr_t *h, uint8_t out[EN_DG_HDR])
{
    out[0] = EN_DG_VERSION;
    out[1] = h->flags;
    put48(out + 2, h->job);
    en_put32(out + 8, h->comm);
    put48(out + 12, h->seq);
    put24(out + 18, h->step);
    put24(out + 21, h->segno);
}

uint64_t en_dg_job(const char *token)
{
    uint64_t j = BS_FNV_SEED;
    for (const char *t = token ? token : ""; *t; t++) j = bs_fnv64(j, (uint8_t)*t);
    return bs_fnv64(j, 0x75647020u) & EN_DG_JOB_MASK;
}

int en_dg_decode(const uint8_t *buf, size_t n, uint32_t seg, en_dg_hdr_t *out)
{
    if (n < EN_DG_HDR || n > EN_DG_MAX) return COH_EPROTO;
    if (buf[0] != EN_DG_VERSION || (buf[1] & ~EN_DG_FLAGS)) return COH_EPROTO;
    en_dg_hdr_t h = {.flags = buf[1],
                     .job = get48(buf + 2),
                     .comm = en_get32(buf + 8),
                     .seq = get48(buf + 12),
                     .step = get24(buf + 18),
                     .segno = get24(buf + 21),
                     .len = (uint32_t)(n - EN_DG_HDR)};
    /* A segment is never longer than one; it starts where its number says
     * (a u24 times a u32: no overflow). */
    if (!seg || h.len > seg) return COH_EPROTO;
    h.offset = (uint64_t)h.segno * seg;
    *out = h;
    return 0;
}

/* ---- bitmap ---- */

int en_dg_bitmap_init(en_dg_bitmap_t *b, uint32_t nseg)
{
    size_t words = ((size_t)nseg + 63) / 64;
    b->words = coh_calloc(words ? words : 1, sizeof(uint64_t));
    b->nseg = nseg;
    b->got = 0;
    return b->words ? 0 : COH_ENOMEM;
}

void en_dg_bitmap_fini(en_dg_bitmap_t *b)
{
    coh_free(b->words);
    b->words = NULL;
    b->nseg = b->got = 0;
}

void en_dg_bitmap_clear(en_dg_bitmap_t *b)
{
    memset(b->words, 0, sizeof(uint64_t) * (((size_t)b->nseg + 63) / 64));
    b->got = 0;
}

int en_dg_bitmap_set(en_dg_bitmap_t *b, uint32_t i)
{
    if (i >= b->nseg) return COH_EINVAL;
    uint64_t bit = 1ull << (i % 64);
    if (b->words[i / 64] & bit) return 0;
    b->words[i / 64] |= bit;
    b->got++;
    return 1;
}

bool en_dg_bitmap_test(const en_dg_bitmap_t *b, uint32_t i)
{
    return i < b->nseg && (b->words[i / 64] >> (i % 64)) & 1;
}

uint32_t en_dg_bitmap_next_missing(const en_dg_bitmap_t *b, uint32_t from)
{
    for (uint32_t i = from; i < b->nseg;) {
        uint64_t w = ~b->words[i / 64] >> (i % 64);
        if (w) {
            uint32_t at = i + (uint32_t)__builtin_ctzll(w);
            return at < b->nseg ? at : b->nseg;
        }
        i = (i / 64 + 1) * 64; /* the rest of this word arrived */
    }
    return b->nseg;
}

/* ---- the loss bound ---- */

uint32_t en_dg_nseg(uint64_t total, uint32_t seg)
{
    return seg ? (uint32_t)((total + seg - 1) / seg) : 0;
}

uint64_t en_dg_bytes_got(const en_dg_bitmap_t *b, uint64_t total, uint32_t seg)
{
    if (!b->nseg) return 0;
    uint64_t got = (uint64_t)b->got * seg;
    /* The last segment is short: count what it holds. */
    uint64_t last = total - (uint64_t)(b->nseg - 1) * seg;
    if (en_dg_bitmap_test(b, b->nseg - 1)) got -= seg - last;
    return got;
}

bool en_dg_bound_met(uint64_t got, uint64_t total, double bound)
{
    if (got >= total) return true;
    if (!(bound > 0)) return false;
    if (bound >= 1) return true;
    /* got >= (1 - bound) * total, in integers where that is exact enough:
     * the missing bytes may not exceed floor(bound * total). */
    return (double)(total - got) <= floor(bound * (double)total);
}

int en_dg_spray_pick(const uint64_t *next_ns, int n, unsigned avail, int first, uint64_t now)
{
    int pick = -1;
    for (int j = 0; j < n; j++) {
        int k = (first + j) % n;
        if (!((avail >> k) & 1) || next_ns[k] > now) continue;
        if (pick < 0 || next_ns[k] < next_ns[pick]) pick = k;
    }
    return pick;
}

int en_dg_missing(const en_dg_bitmap_t *b, en_dg_range_t *out, int cap)
{
    int n = 0;
    uint32_t i = en_dg_bitmap_next_missing(b, 0);
    while (i < b->nseg) {
        uint32_t j = i;
        while (j < b->nseg && !en_dg_bitmap_test(b, j)) j++;
        if (n < cap) out[n] = (en_dg_range_t){.first = i, .count = j - i};
        n++;
        i = en_dg_bitmap_next_missing(b, j);
    }
    return n;
}

/* ---- rate control ---- */

void en_rc_init(en_rc_t *rc, double line_bps, double delta, double ai_frac)
{
    *rc = (en_rc_t){.line_bps = line_bps,
                    .delta = delta > 1 ? delta : 2,
                    .ai_frac = ai_frac > 0 ? ai_frac : 0.05,
                    .rate_bps = line_bps,
                    .state = EN_RC_LINE};
}

void en_rc_report(en_rc_t *rc, double sent_bps, double recv_bps)
{
    if (!(sent_bps > 0) || !isfinite(recv_bps) || recv_bps < 0) return;
    if (sent_bps > rc->delta * recv_bps) {
        rc->state = EN_RC_AVOID;
        rc->rate_bps /= 2;
        /* Not below a thousandth of the line: a flow keeps probing. */
        if (rc->rate_bps < rc->line_bps / 1024) rc->rate_bps = rc->line_bps / 1024;
        rc->halvings++;
    } else if (rc->state == EN_RC_AVOID) {
        rc->rate_bps += rc->ai_frac * rc->line_bps;
        if (rc->rate_bps > rc->line_bps) rc->rate_bps = rc->line_bps;
        rc->increases++;
    }
}

void en_rc_retransmit(en_rc_t *rc)
{
    rc->state = EN_RC_LINE;
    rc->rate_bps = rc->line_bps;
}

uint64_t en_pacer_delay(en_pacer_t *p, uint64_t now_ns, double rate_bps, size_t bytes,
                        uint64_t burst_ns)
{
    if (!(rate_bps > 0)) return 0;
    /* Fallen behind (idle): start from now, less one burst's credit. */
    if (p->next_ns + burst_ns < now_ns) p->next_ns = now_ns - burst_ns;
    uint64_t wait = p->next_ns > now_ns ? p->next_ns - now_ns : 0;
    p->next_ns += (uint64_t)((double)bytes * 8e9 / rate_bps);
    return wait;
}

/* ---- tagging ---- */

int en_tag_prio(int layer, int nlayers, int prios)
{
    if (layer < 0 || nlayers < 1 || prios < 1) return 0;
    if (layer >= nlayers) layer = nlayers - 1;
    return (int)((int64_t)layer * prios / nlayers);
}

uint8_t en_tag_tos(int prio, bool ecn)
{
    if (prio < 0) prio = 0;
    if (prio > 7) prio = 7;
    return (uint8_t)((prio << 3) << 2 | (ecn ? 0x2 : 0x0)); /* DSCP CSn, ECT(0) */
}

static double mag(const void *x, size_t i, size_t es)
{
    if (es == 8) {
        double v;
        memcpy(&v, (const char *)x + i * 8, 8);
        return fabs(v);
    }
    float v;
    memcpy(&v, (const char *)x + i * 4, 4);
    return fabs((double)v);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double en_tag_median(const void *x, size_t n, size_t es, double frac)
{
    if (!n || (es != 4 && es != 8)) return 0;
    size_t k = (size_t)((double)n * (frac > 0 ? frac : 0.001));
    if (k < 16) k = 16;
    if (k > n) k = n;
    double stack[256];
    double *s = k <= 256 ? stack : coh_malloc(sizeof(double) * k);
    if (!s) return 0;
    for (size_t i = 0; i < k; i++) {
        double v = mag(x, (size_t)((unsigned __int128)i * n / k), es);
        s[i] = isnan(v) ? 0 : v;
    }
    qsort(s, k, sizeof(double), cmp_double);
    double m = k % 2 ? s[k / 2] : (s[k / 2 - 1] + s[k / 2]) / 2;
    if (s != stack) coh_free(s);
    return m;
}

bool en_tag_important(const void *x, size_t n, size_t es, double median)
{
    if (!n || (es != 4 && es != 8)) return false;
    /* Four independent sums: one chain of dependent additions was 4% of a
     * udp rank's CPU (every float datagram is weighed). */
    double s[4] = {0, 0, 0, 0};
    size_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (size_t k = 0; k < 4; k++) s[k] += mag(x, i + k, es);
    for (; i < n; i++) s[0] += mag(x, i, es);
    return (s[0] + s[1] + s[2] + s[3]) / (double)n > median;
}
