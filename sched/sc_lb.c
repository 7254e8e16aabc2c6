/* The multi-rail load balancer (see sc_lb.h). */
#include "sched/sc_lb.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/bs_alloc.h"
#include "cohort.h"

/* Transfers this small measure the rail's latency, not its rate. */
#define LAT_BYTES   4096
#define DEFAULT_BPS 1e9 /* no rail measured yet: all alike */

struct sc_lb {
    int n;
    sc_lb_params_t p;
    bool up[SC_MAX_RAILS];
    double lat[SC_MAX_RAILS];
    uint32_t nlat[SC_MAX_RAILS];
    double rate[SC_MAX_RAILS][SC_LB_BUCKETS];
    uint32_t nrate[SC_MAX_RAILS][SC_LB_BUCKETS];
    uint64_t measured[SC_MAX_RAILS]; /* bit b: nrate[r][b] > 0 (own_rate's search) */
};

void sc_lb_params_default(sc_lb_params_t *p)
{
    *p = (sc_lb_params_t){
        .tolerance = 5.0, .gain = 0.3, .stripe_overhead_s = 20e-6, .probe_every = 64};
}

int sc_lb_create(int nrails, const sc_lb_params_t *p, sc_lb_t **out)
{
    if (!out || nrails < 1 || nrails > SC_MAX_RAILS) return COH_EINVAL;
    sc_lb_params_t d;
    sc_lb_params_default(&d);
    if (p) d = *p;
    if (!(d.tolerance >= 1) || !(d.gain > 0 && d.gain <= 1) || !(d.stripe_overhead_s >= 0))
        return COH_EINVAL;
    sc_lb_t *lb = coh_zalloc(sizeof(*lb));
    if (!lb) return COH_ENOMEM;
    lb->n = nrails;
    lb->p = d;
    for (int r = 0; r < nrails; r++) lb->up[r] = true;
    *out = lb;
    return 0;
}

void sc_lb_destroy(sc_lb_t *lb)
{
    coh_free(lb);
}

static int bucket(uint64_t bytes)
{
    int b = 0;
    while (bytes > 1 && b < SC_LB_BUCKETS - 1) {
        bytes >>= 1;
        b++;
    }
    return b;
}

static double lat_of(const sc_lb_t *lb, int r)
{
    if (lb->nlat[r]) return lb->lat[r];
    double sum = 0;
    int k = 0;
    for (int i = 0; i < lb->n; i++)
        if (lb->nlat[i]) {
            sum += lb->lat[i];
            k++;
        }
    return k ? sum / k : 0;
}

/* The rate of rail r's measured bucket nearest to b (the lower one at equal
 * distance), 0 when none is. A bit search: scanning the buckets outwards,
 * every split of a small op (a few calls per rail) cost a sixth of the CPU
 * of 4 KiB allreduces over two rails, whose rates are never measured. */
static double own_rate(const sc_lb_t *lb, int r, int b)
{
    uint64_t m = lb->measured[r];
    if (!m) return 0;
    uint64_t below = m & ((2ull << b) - 1), above = m >> b >> 1;
    int lo = below ? 63 - __builtin_clzll(below) : -1;
    int hi = above ? b + 1 + __builtin_ctzll(above) : -1;
    int at = lo >= 0 && (hi < 0 || b - lo <= hi - b) ? lo : hi;
    return lb->rate[r][at];
}

/* A loaded measurement (sc_lb_load, sc_lb_unpack), with its bit in measured. */
static void put_rate(sc_lb_t *t, int r, int b, double v, uint32_t cnt)
{
    t->rate[r][b] = v;
    t->nrate[r][b] = cnt;
    t->measured[r] |= 1ull << b;
}

static double rate_at(const sc_lb_t *lb, int r, uint64_t bytes)
{
    int b = bucket(bytes);
    double own = own_rate(lb, r, b);
    if (own > 0) return own;
    /* Never measured: like the others, so that it gets a share and is measured. */
    double sum = 0;
    int k = 0;
    for (int i = 0; i < lb->n; i++) {
        double o = own_rate(lb, i, b);
        if (o > 0) {
            sum += o;
            k++;
        }
    }
    return k ? sum / k : DEFAULT_BPS;
}

double sc_lb_expect(const sc_lb_t *lb, int rail, uint64_t bytes)
{
    if (!lb || rail < 0 || rail >= lb->n) return INFINITY;
    return lat_of(lb, rail) + (double)bytes / rate_at(lb, rail, bytes);
}

int sc_lb_observe(sc_lb_t *lb, int rail, uint64_t bytes, double seconds)
{
    if (!lb || rail < 0 || rail >= lb->n || !isfinite(seconds) || seconds <= 0) return COH_EINVAL;
    double g = lb->p.gain;
    if (bytes <= LAT_BYTES) {
        /* The latency is the intercept: what the bytes took at the rail's
         * known rate does not belong to it. */
        double own = own_rate(lb, rail, bucket(bytes));
        double lat = own > 0 ? seconds - (double)bytes / own : seconds;
        if (lat < 0) lat = 0;
        lb->lat[rail] = lb->nlat[rail] ? (1 - g) * lb->lat[rail] + g * lat : lat;
        lb->nlat[rail]++;
        return 0;
    }
    /* The time beyond the latency is what the bytes took (at least a tenth
     * of the whole, so that a noisy latency cannot make the rate infinite). */
    double moving = seconds - lat_of(lb, rail);
    if (moving < seconds * 0.1) moving = seconds * 0.1;
    double sample = (double)bytes / moving;
    int b = bucket(bytes);
    lb->rate[rail][b] = lb->nrate[rail][b] ? (1 - g) * lb->rate[rail][b] + g * sample : sample;
    lb->nrate[rail][b]++;
    lb->measured[rail] |= 1ull << b;
    return 0;
}

int sc_lb_set_up(sc_lb_t *lb, int rail, bool up)
{
    if (!lb || rail < 0 || rail >= lb->n) return COH_EINVAL;
    lb->up[rail] = up;
    return 0;
}

bool sc_lb_is_up(const sc_lb_t *lb, int rail)
{
    return lb && rail >= 0 && rail < lb->n && lb->up[rail];
}

/* Shares proportional to the rates at the size each rail carries; rails of
 * active[] only. Returns the expected time of the slowest share. */
static double solve_shares(const sc_lb_t *lb, uint64_t bytes, const bool *active, double *share)
{
    int na = 0;
    for (int r = 0; r < lb->n; r++) na += active[r];
    for (int r = 0; r < lb->n; r++) share[r] = active[r] ? (double)bytes / na : 0;
    double rate[SC_MAX_RAILS] = {0};
    for (int round = 0; round < 4; round++) {
        double sum = 0;
        for (int r = 0; r < lb->n; r++)
            if (active[r]) {
                rate[r] = rate_at(lb, r, (uint64_t)(share[r] > 1 ? share[r] : 1));
                sum += rate[r];
            }
        for (int r = 0; r < lb->n; r++) share[r] = active[r] ? (double)bytes * rate[r] / sum : 0;
    }
    double worst = 0;
    for (int r = 0; r < lb->n; r++)
        if (active[r]) {
            double t = lat_of(lb, r) + share[r] / rate_at(lb, r, (uint64_t)(share[r] + 1));
            if (t > worst) worst = t;
        }
    return worst;
}

int sc_lb_split(const sc_lb_t *lb, uint64_t bytes, uint64_t align, uint64_t index,
                sc_lb_plan_t *out)
{
    if (!lb || !out) return COH_EINVAL;
    if (!align) align = 1;
    memset(out, 0, sizeof(*out));
    int best = -1, nup = 0;
    double best_t = INFINITY;
    for (int r = 0; r < lb->n; r++) {
        if (!lb->up[r]) continue;
        nup++;
        double t = sc_lb_expect(lb, r, bytes);
        if (t < best_t) {
            best_t = t;
            best = r;
        }
    }
    if (best < 0) return COH_EPEER;
    out->single_s = best_t;
    bool probe = lb->p.probe_every && index % lb->p.probe_every == 0;
    /* A stripe takes at least its overhead: when one rail is that fast, no
     * split can win, and solving the shares (every call scans the rate
     * buckets) was 16% of the CPU of 2 ranks' 4 KiB allreduces over two
     * rails. The decision is the same without this test. */
    if (nup > 1 && bytes >= 2 * align && (probe || best_t > lb->p.stripe_overhead_s)) {
        bool active[SC_MAX_RAILS];
        double share[SC_MAX_RAILS];
        for (int r = 0; r < lb->n; r++) active[r] = lb->up[r];
        solve_shares(lb, bytes, active, share);
        if (!probe) {
            /* Divergence: a rail far slower than the best for its share only
             * holds the op back (Nezha's tolerance). */
            double top = 0;
            for (int r = 0; r < lb->n; r++)
                if (active[r]) {
                    double rt = rate_at(lb, r, (uint64_t)(share[r] + 1));
                    if (rt > top) top = rt;
                }
            for (int r = 0; r < lb->n; r++)
                if (active[r] && top / rate_at(lb, r, (uint64_t)(share[r] + 1)) > lb->p.tolerance)
                    active[r] = false;
        }
        int na = 0;
        for (int r = 0; r < lb->n; r++) na += active[r];
        double t =
            na > 1 ? solve_shares(lb, bytes, active, share) + lb->p.stripe_overhead_s : INFINITY;
        if (na > 1 && (probe || t < best_t)) {
            uint64_t left = bytes;
            int last = -1;
            for (int r = 0; r < lb->n; r++)
                if (active[r]) last = r;
            for (int r = 0; r < lb->n; r++) {
                if (!active[r]) continue;
                uint64_t b = r == last ? left : (uint64_t)share[r] / align * align;
                if (b > left) b = left;
                out->bytes[r] = b;
                left -= b;
                out->nrails_used += b > 0;
            }
            if (out->nrails_used > 1) {
                out->striped = true;
                out->expect_s = t;
                return 0;
            }
            memset(out->bytes, 0, sizeof(out->bytes));
        }
    }
    out->nrails_used = 1;
    out->bytes[best] = bytes;
    out->expect_s = best_t;
    return 0;
}

int sc_lb_slices(const sc_lb_plan_t *plan, uint64_t count, uint64_t esize,
                 sc_slice_t out[SC_MAX_RAILS])
{
    if (!plan || !out || !esize) return COH_EINVAL;
    int n = 0, last = -1;
    for (int r = 0; r < SC_MAX_RAILS; r++)
        if (plan->bytes[r]) last = r;
    if (last < 0) return COH_EINVAL;
    uint64_t lo = 0;
    for (int r = 0; r <= last; r++) {
        if (!plan->bytes[r]) continue;
        uint64_t hi = r == last ? count : lo + plan->bytes[r] / esize;
        if (hi > count) hi = count;
        if (hi == lo && r != last) continue;
        out[n++] = (sc_slice_t){.rail = r, .lo = lo, .hi = hi};
        lo = hi;
    }
    return n;
}

int sc_lb_dump(const sc_lb_t *lb, char *buf, size_t cap)
{
    if (!lb || !buf || !cap) return COH_EINVAL;
    size_t n = (size_t)snprintf(buf, cap, "cohort-lb 1 rails %d\n", lb->n);
    for (int r = 0; r < lb->n && n < cap; r++) {
        if (lb->nlat[r])
            n += (size_t)snprintf(buf + n, cap - n, "rail %d latency %.9g n %u\n", r, lb->lat[r],
                                  lb->nlat[r]);
        for (int b = 0; b < SC_LB_BUCKETS && n < cap; b++)
            if (lb->nrate[r][b])
                n += (size_t)snprintf(buf + n, cap - n, "rail %d bucket %d rate %.9g n %u\n", r, b,
                                      lb->rate[r][b], lb->nrate[r][b]);
    }
    return n < cap ? (int)n : COH_EINVAL;
}

int sc_lb_load(sc_lb_t *lb, const char *text)
{
    if (!lb || !text) return COH_EINVAL;
    int rails;
    if (sscanf(text, "cohort-lb 1 rails %d", &rails) != 1 || rails != lb->n) return COH_EINVAL;
    sc_lb_t t = *lb;
    memset(t.nlat, 0, sizeof(t.nlat));
    memset(t.nrate, 0, sizeof(t.nrate));
    memset(t.measured, 0, sizeof(t.measured));
    for (const char *l = strchr(text, '\n'); l && l[1]; l = strchr(l + 1, '\n')) {
        int r, b;
        unsigned cnt;
        double v;
        if (sscanf(l + 1, "rail %d latency %lf n %u", &r, &v, &cnt) == 3) {
            if (r < 0 || r >= t.n || !isfinite(v) || v < 0 || !cnt) return COH_EINVAL;
            t.lat[r] = v;
            t.nlat[r] = cnt;
        } else if (sscanf(l + 1, "rail %d bucket %d rate %lf n %u", &r, &b, &v, &cnt) == 4) {
            if (r < 0 || r >= t.n || b < 0 || b >= SC_LB_BUCKETS || !isfinite(v) || v <= 0 || !cnt)
                return COH_EINVAL;
            put_rate(&t, r, b, v, cnt);
        } else {
            return COH_EINVAL;
        }
    }
    *lb = t;
    return 0;
}

/* ---- exact binary form (sc_lb_pack) ----
 *   0 "CLB1"  4 u8 nrails  5 u8 0  6 u16 up mask  8 f64 tolerance
 *  16 f64 gain  24 f64 stripe overhead  32 u32 probe_every  36 u32 entries
 *  40 entries of 16 bytes: u8 rail, u8 bucket (255: latency), u16 0,
 *     u32 n, f64 value. Little-endian. */
#define PACK_HDR 40
#define PACK_LAT 255

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}

static void put_f64(uint8_t *p, double d)
{
    uint64_t v;
    memcpy(&v, &d, 8);
    put_u32(p, (uint32_t)v);
    put_u32(p + 4, (uint32_t)(v >> 32));
}

static double get_f64(const uint8_t *p)
{
    uint64_t v = (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32;
    double d;
    memcpy(&d, &v, 8);
    return d;
}

int sc_lb_nrails(const sc_lb_t *lb)
{
    return lb ? lb->n : 0;
}

int sc_lb_pack(const sc_lb_t *lb, uint8_t *buf, size_t cap)
{
    if (!lb || !buf || cap < PACK_HDR) return COH_EINVAL;
    uint32_t up = 0, k = 0;
    for (int r = 0; r < lb->n; r++) up |= lb->up[r] ? 1u << r : 0;
    memcpy(buf, "CLB1", 4);
    buf[4] = (uint8_t)lb->n;
    buf[5] = 0;
    buf[6] = (uint8_t)up;
    buf[7] = (uint8_t)(up >> 8);
    put_f64(buf + 8, lb->p.tolerance);
    put_f64(buf + 16, lb->p.gain);
    put_f64(buf + 24, lb->p.stripe_overhead_s);
    put_u32(buf + 32, lb->p.probe_every);
    size_t n = PACK_HDR;
    for (int r = 0; r < lb->n; r++)
        for (int b = -1; b < SC_LB_BUCKETS; b++) {
            uint32_t cnt = b < 0 ? lb->nlat[r] : lb->nrate[r][b];
            if (!cnt) continue;
            if (n + 16 > cap) return COH_EINVAL;
            buf[n] = (uint8_t)r;
            buf[n + 1] = (uint8_t)(b < 0 ? PACK_LAT : b);
            buf[n + 2] = buf[n + 3] = 0;
            put_u32(buf + n + 4, cnt);
            put_f64(buf + n + 8, b < 0 ? lb->lat[r] : lb->rate[r][b]);
            n += 16;
            k++;
        }
    put_u32(buf + 36, k);
    return (int)n;
}

int sc_lb_unpack(sc_lb_t *lb, const uint8_t *buf, size_t len)
{
    if (!lb || !buf || len < PACK_HDR || memcmp(buf, "CLB1", 4) != 0) return COH_EINVAL;
    if (buf[4] != lb->n || buf[5] != 0) return COH_EINVAL;
    uint32_t up = (uint32_t)buf[6] | (uint32_t)buf[7] << 8;
    uint32_t k = get_u32(buf + 36);
    if (up >> lb->n || k > (uint32_t)lb->n * (SC_LB_BUCKETS + 1) || len != PACK_HDR + 16 * k)
        return COH_EINVAL;
    sc_lb_t t;
    memset(&t, 0, sizeof(t));
    t.n = lb->n;
    t.p.tolerance = get_f64(buf + 8);
    t.p.gain = get_f64(buf + 16);
    t.p.stripe_overhead_s = get_f64(buf + 24);
    t.p.probe_every = get_u32(buf + 32);
    if (!(t.p.tolerance >= 1) || !isfinite(t.p.tolerance) || !(t.p.gain > 0 && t.p.gain <= 1) ||
        !(t.p.stripe_overhead_s >= 0) || !isfinite(t.p.stripe_overhead_s))
        return COH_EINVAL;
    for (int r = 0; r < t.n; r++) t.up[r] = (up >> r) & 1u;
    for (uint32_t i = 0; i < k; i++) {
        const uint8_t *e = buf + PACK_HDR + 16 * i;
        int r = e[0], b = e[1];
        uint32_t cnt = get_u32(e + 4);
        double v = get_f64(e + 8);
        if (r >= t.n || e[2] || e[3] || !cnt || !isfinite(v)) return COH_EINVAL;
        if (b == PACK_LAT) {
            if (v < 0 || t.nlat[r]) return COH_EINVAL;
            t.lat[r] = v;
            t.nlat[r] = cnt;
        } else {
            if (b >= SC_LB_BUCKETS || v <= 0 || t.nrate[r][b]) return COH_EINVAL;
            put_rate(&t, r, b, v, cnt);
        }
    }
    *lb = t;
    return 0;
}
