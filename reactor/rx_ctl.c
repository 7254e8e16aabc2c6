/* Control-plane codec (see rx_ctl.h). */
#include "reactor/rx_ctl.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "engines/en_frame.h"

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

#define READY_LEN  72
#define PLAN_LEN   40 /* + 4 per member */
#define DONE_LEN   32 /* + 24 per measurement */
#define REFUSE_LEN 24
#define LEAVE_LEN  4
#define PING_LEN   4
#define LOST_LEN   12
#define BYE_LEN    4
#define SHRINK_LEN 16 /* + 4 per rank */
#define PROBE_LEN  8  /* + 24 per link */
#define LBTAB_LEN  16 /* + the table */
#define RAIL_LEN   16
#define RPLAN_LEN  80 /* + 4 per ring member and per late rank */
#define COMMIT_LEN 16
#define STATE_LEN  24

size_t rx_ctl_size(const rx_ctl_msg_t *m)
{
    switch (m->type) {
    case RX_CTL_READY: return RX_CTL_HDR + READY_LEN;
    case RX_CTL_PLAN: return RX_CTL_HDR + PLAN_LEN + 4 * (size_t)m->u.plan.nmembers;
    case RX_CTL_DONE: return RX_CTL_HDR + DONE_LEN + 24 * (size_t)m->u.done.nbw;
    case RX_CTL_REFUSE: return RX_CTL_HDR + REFUSE_LEN;
    case RX_CTL_LEAVE: return RX_CTL_HDR + LEAVE_LEN;
    case RX_CTL_PING: return RX_CTL_HDR + PING_LEN;
    case RX_CTL_LOST: return RX_CTL_HDR + LOST_LEN;
    case RX_CTL_BYE: return RX_CTL_HDR + BYE_LEN;
    case RX_CTL_SHRINK:
    case RX_CTL_GROW:
    case RX_CTL_SHRUNK: return RX_CTL_HDR + SHRINK_LEN + 4 * (size_t)m->u.shrink.n;
    case RX_CTL_PROBE: return RX_CTL_HDR + PROBE_LEN + 24 * (size_t)m->u.probe.n;
    case RX_CTL_LBTAB: return RX_CTL_HDR + LBTAB_LEN + (size_t)m->u.lbtab.len;
    case RX_CTL_RAIL: return RX_CTL_HDR + RAIL_LEN;
    case RX_CTL_COMMIT: return RX_CTL_HDR + COMMIT_LEN;
    case RX_CTL_STATE: return RX_CTL_HDR + STATE_LEN;
    case RX_CTL_RPLAN:
        return RX_CTL_HDR + RPLAN_LEN + 4 * ((size_t)m->u.rplan.nring + m->u.rplan.nlate);
    default: return 0;
    }
}

int rx_ctl_encode(const rx_ctl_msg_t *m, uint8_t *out, size_t cap)
{
    size_t n = rx_ctl_size(m);
    if (!n || n > cap || n - RX_CTL_HDR > RX_CTL_MAX) return COH_EINVAL;
    if (m->type == RX_CTL_DONE && m->u.done.nbw > RX_CTL_MAXBW) return COH_EINVAL;
    if (m->type == RX_CTL_LBTAB &&
        (m->u.lbtab.len > RX_CTL_MAXLB || m->u.lbtab.more > RX_CTL_LB_MORE ||
         (m->u.lbtab.len && !m->u.lbtab.table)))
        return COH_EINVAL;
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
        en_put32(p + 28, r->redop | r->plain << 8);
        put_f64(p + 32, r->compute_s);
        put_f64(p + 40, r->weight);
        en_put64(p + 48, r->attempt);
        en_put64(p + 56, r->last_gid);
        en_put32(p + 64, r->join);
        en_put32(p + 68, 0);
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
    case RX_CTL_PING: en_put32(p, m->u.ping_rank); break;
    case RX_CTL_LOST:
        en_put32(p, m->u.lost.rank);
        en_put32(p + 4, m->u.lost.silent_ms);
        en_put32(p + 8, m->u.lost.why);
        break;
    case RX_CTL_BYE: en_put32(p, m->u.bye_rank); break;
    case RX_CTL_SHRINK:
    case RX_CTL_GROW:
    case RX_CTL_SHRUNK: {
        const rx_ctl_shrink_t *k = &m->u.shrink;
        bool req = m->type != RX_CTL_SHRUNK;
        en_put32(p, req ? k->rank : k->comm);
        en_put32(p + 4, req ? k->comm : k->newcomm);
        en_put32(p + 8, req ? k->top : (uint32_t)k->status);
        en_put32(p + 12, k->n);
        for (uint32_t i = 0; i < k->n; i++) en_put32(p + SHRINK_LEN + 4 * i, k->ranks_in[i]);
        break;
    }
    case RX_CTL_PROBE: {
        const rx_ctl_probe_t *pr = &m->u.probe;
        en_put32(p, pr->rank);
        en_put32(p + 4, pr->n);
        for (uint32_t i = 0; i < pr->n; i++) {
            uint8_t *e = p + PROBE_LEN + 24 * i;
            en_put32(e, pr->links_in[i].peer);
            en_put32(e + 4, pr->links_in[i].rail);
            put_f64(e + 8, pr->links_in[i].latency_s);
            put_f64(e + 16, pr->links_in[i].gbps);
        }
        break;
    }
    case RX_CTL_LBTAB:
        en_put64(p, m->u.lbtab.epoch);
        en_put32(p + 8, m->u.lbtab.len);
        en_put32(p + 12, m->u.lbtab.more);
        if (m->u.lbtab.len) memcpy(p + LBTAB_LEN, m->u.lbtab.table, m->u.lbtab.len);
        break;
    case RX_CTL_RAIL:
        en_put32(p, m->u.rail.rank);
        en_put32(p + 4, m->u.rail.rail);
        en_put32(p + 8, m->u.rail.peer);
        en_put32(p + 12, m->u.rail.kind);
        break;
    case RX_CTL_COMMIT:
        en_put64(p, m->u.commit.group_id);
        en_put32(p + 8, (uint32_t)m->u.commit.status);
        en_put32(p + 12, 0);
        break;
    case RX_CTL_STATE:
        en_put32(p, m->u.state.rank);
        en_put32(p + 4, 0);
        en_put64(p + 8, m->u.state.committed);
        en_put64(p + 16, m->u.state.awaiting);
        break;
    case RX_CTL_RPLAN: {
        const rx_ctl_rplan_t *r = &m->u.rplan;
        en_put64(p, r->group_id);
        en_put64(p + 8, r->attempt);
        en_put32(p + 16, r->phase);
        en_put32(p + 20, r->method);
        en_put64(p + 24, r->count);
        en_put32(p + 32, r->dtype);
        en_put32(p + 36, r->redop | r->plain << 8);
        en_put32(p + 40, (uint32_t)r->exp);
        en_put32(p + 44, r->final);
        put_f64(p + 48, r->total_weight);
        en_put32(p + 56, r->nring);
        en_put32(p + 60, r->nlate);
        en_put32(p + 64, r->nseg);
        en_put32(p + 68, 0);
        en_put64(p + 72, r->prefix);
        for (uint32_t i = 0; i < r->nring; i++) en_put32(p + RPLAN_LEN + 4 * i, r->ring_in[i]);
        for (uint32_t i = 0; i < r->nlate; i++)
            en_put32(p + RPLAN_LEN + 4 * (r->nring + i), r->late_in[i]);
        break;
    }
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
    case RX_CTL_PING:
        if (plen != PING_LEN) return COH_EPROTO;
        break;
    case RX_CTL_LOST:
        if (plen != LOST_LEN) return COH_EPROTO;
        break;
    case RX_CTL_BYE:
        if (plen != BYE_LEN) return COH_EPROTO;
        break;
    case RX_CTL_SHRINK:
    case RX_CTL_GROW:
    case RX_CTL_SHRUNK:
        if (plen < SHRINK_LEN || (plen - SHRINK_LEN) % 4) return COH_EPROTO;
        break;
    case RX_CTL_PROBE:
        if (plen < PROBE_LEN || (plen - PROBE_LEN) % 24) return COH_EPROTO;
        break;
    case RX_CTL_LBTAB:
        if (plen < LBTAB_LEN || plen - LBTAB_LEN > RX_CTL_MAXLB) return COH_EPROTO;
        break;
    case RX_CTL_RAIL:
        if (plen != RAIL_LEN) return COH_EPROTO;
        break;
    case RX_CTL_RPLAN:
        if (plen < RPLAN_LEN || (plen - RPLAN_LEN) % 4) return COH_EPROTO;
        break;
    case RX_CTL_COMMIT:
        if (plen != COMMIT_LEN) return COH_EPROTO;
        break;
    case RX_CTL_STATE:
        if (plen != STATE_LEN) return COH_EPROTO;
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
        r->last_gid = en_get64(p + 56);
        r->join = en_get32(p + 64);
        uint32_t op = en_get32(p + 28);
        r->redop = op & 0xff;
        r->plain = op >> 8;
        if (r->redop >= COH_REDOP_COUNT || r->plain > 1 || !finite_nonneg(r->compute_s) ||
            !finite_nonneg(r->weight) || en_get32(p + 68) != 0 ||
            (r->join != RX_JOIN_NONE && r->join >= RX_MAX_SEGS))
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
        if (en_get32(p + 36) != 0 || pl->nmembers != (plen - PLAN_LEN) / 4 ||
            pl->full >= (pl->status < 0 ? (uint32_t)RX_CTL_WHY_COUNT_MAX : 2u) ||
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
    case RX_CTL_PING: m->u.ping_rank = en_get32(p); break;
    case RX_CTL_LOST:
        m->u.lost.rank = en_get32(p);
        m->u.lost.silent_ms = en_get32(p + 4);
        m->u.lost.why = en_get32(p + 8);
        if (m->u.lost.why < 1 || m->u.lost.why >= RX_LOST_WHY_MAX) return COH_EPROTO;
        break;
    case RX_CTL_BYE: m->u.bye_rank = en_get32(p); break;
    case RX_CTL_SHRINK:
    case RX_CTL_GROW:
    case RX_CTL_SHRUNK: {
        rx_ctl_shrink_t *sk = &m->u.shrink;
        bool req = type != RX_CTL_SHRUNK;
        uint32_t a = en_get32(p), b = en_get32(p + 4), c = en_get32(p + 8);
        if (req) {
            sk->rank = a;
            sk->comm = b;
            sk->top = c;
        } else {
            sk->comm = a;
            sk->newcomm = b;
            sk->status = (int32_t)c;
        }
        sk->n = en_get32(p + 12);
        sk->ranks = p + SHRINK_LEN;
        if (sk->n != (plen - SHRINK_LEN) / 4 || sk->status > 0) return COH_EPROTO;
        break;
    }
    case RX_CTL_PROBE: {
        rx_ctl_probe_t *pr = &m->u.probe;
        pr->rank = en_get32(p);
        pr->n = en_get32(p + 4);
        pr->links = p + PROBE_LEN;
        if (pr->n != (plen - PROBE_LEN) / 24) return COH_EPROTO;
        for (uint32_t i = 0; i < pr->n; i++) {
            rx_ctl_link_t l;
            rx_ctl_probe_link(pr, i, &l);
            if (l.rail >= RX_MAX_RAILS || !finite_nonneg(l.latency_s) || !finite_nonneg(l.gbps))
                return COH_EPROTO;
        }
        break;
    }
    case RX_CTL_LBTAB:
        m->u.lbtab.epoch = en_get64(p);
        m->u.lbtab.len = en_get32(p + 8);
        m->u.lbtab.table = p + LBTAB_LEN;
        m->u.lbtab.more = en_get32(p + 12);
        if (m->u.lbtab.more > RX_CTL_LB_MORE || m->u.lbtab.len != plen - LBTAB_LEN)
            return COH_EPROTO;
        break;
    case RX_CTL_RAIL:
        m->u.rail.rank = en_get32(p);
        m->u.rail.rail = en_get32(p + 4);
        m->u.rail.peer = en_get32(p + 8);
        m->u.rail.kind = en_get32(p + 12);
        if (m->u.rail.rail >= RX_MAX_RAILS || m->u.rail.kind < 1 || m->u.rail.kind > 3)
            return COH_EPROTO;
        break;
    case RX_CTL_RPLAN: {
        rx_ctl_rplan_t *r = &m->u.rplan;
        r->group_id = en_get64(p);
        r->attempt = en_get64(p + 8);
        r->phase = en_get32(p + 16);
        r->method = en_get32(p + 20);
        r->count = en_get64(p + 24);
        r->dtype = en_get32(p + 32);
        uint32_t op = en_get32(p + 36);
        r->redop = op & 0xff;
        r->plain = op >> 8;
        r->exp = (int32_t)en_get32(p + 40);
        r->final = en_get32(p + 44);
        r->total_weight = get_f64(p + 48);
        r->nring = en_get32(p + 56);
        r->nlate = en_get32(p + 60);
        r->nseg = en_get32(p + 64);
        r->prefix = en_get64(p + 72);
        r->ring = p + RPLAN_LEN;
        r->late = p + RPLAN_LEN + 4 * (size_t)r->nring;
        if (r->phase < 1 || r->phase > 2 || r->method > RX_RELAY_ALLREDUCE || r->final > 1 ||
            r->dtype >= COH_DTYPE_COUNT || r->redop >= COH_REDOP_COUNT || r->plain > 1 ||
            r->exp < -1100 || r->exp > 1100 || !finite_nonneg(r->total_weight) || r->nring < 1 ||
            r->nseg < 1 || r->nseg > RX_MAX_SEGS || en_get32(p + 68) != 0 || r->prefix > r->count ||
            (uint64_t)r->nring + r->nlate != (plen - RPLAN_LEN) / 4)
            return COH_EPROTO;
        break;
    }
    case RX_CTL_COMMIT:
        m->u.commit.group_id = en_get64(p);
        m->u.commit.status = (int32_t)en_get32(p + 8);
        if (en_get32(p + 12) != 0 || m->u.commit.status > 0 || m->u.commit.group_id == 0)
            return COH_EPROTO;
        break;
    case RX_CTL_STATE:
        m->u.state.rank = en_get32(p);
        m->u.state.committed = en_get64(p + 8);
        m->u.state.awaiting = en_get64(p + 16);
        if (en_get32(p + 4) != 0) return COH_EPROTO;
        break;
    }
    return (int)(RX_CTL_HDR + plen);
}

void rx_ctl_probe_link(const rx_ctl_probe_t *p, uint32_t i, rx_ctl_link_t *out)
{
    const uint8_t *e = p->links + 24 * (size_t)i;
    out->peer = en_get32(e);
    out->rail = en_get32(e + 4);
    out->latency_s = get_f64(e + 8);
    out->gbps = get_f64(e + 16);
}

const char *rx_lost_why_text(int why)
{
    switch (why) {
    case RX_LOST_SILENT: return "unresponsive";
    case RX_LOST_CLOSED: return "its connection closed (the process died or was killed)";
    case RX_LOST_FAULT: return "it missed its fault deadline (T_fault)";
    case RX_LOST_REPORTED: return "a peer found its connections gone";
    default: return "excluded by the coordinator";
    }
}

/* ---- on a connection ---- */

int rx_ctl_send(rx_conn_t *c, const rx_ctl_msg_t *m)
{
    if (!c || c->closing || !c->ready) return COH_EPEER;
    size_t n = rx_ctl_size(m);
    uint8_t stack[512];
    uint8_t *b = n <= sizeof(stack) ? stack : coh_malloc(n);
    if (!b) return COH_ENOMEM;
    int len = rx_ctl_encode(m, b, n);
    int st = len < 0 ? len : rx_conn_send(c, b, (size_t)len);
    if (b != stack) coh_free(b);
    return st;
}

/* ---- BEAT datagrams ---- */

uint64_t rx_beat_value(const char *token)
{
    uint64_t v = BS_FNV_SEED;
    for (const char *t = token ? token : ""; *t; t++) v = bs_fnv64(v, (uint8_t)*t);
    return bs_fnv64(v, RX_BEAT_MAGIC);
}

void rx_beat_encode(uint8_t out[RX_BEAT_LEN], rx_beat_kind kind, uint32_t rank, uint32_t world,
                    uint64_t value)
{
    memset(out, 0, RX_BEAT_LEN);
    en_put32(out, RX_BEAT_MAGIC);
    out[4] = 1;
    out[5] = (uint8_t)kind;
    en_put32(out + 8, rank);
    en_put32(out + 12, world);
    en_put64(out + 16, value);
}

int rx_beat_decode(const uint8_t *buf, size_t len, uint32_t world, uint64_t value,
                   rx_beat_kind *kind, uint32_t *rank)
{
    if (len != RX_BEAT_LEN || en_get32(buf) != RX_BEAT_MAGIC || buf[4] != 1 || buf[6] || buf[7])
        return COH_EPROTO;
    if (buf[5] != RX_BEAT_TO_COORD && buf[5] != RX_BEAT_TO_MEMBER) return COH_EPROTO;
    uint32_t r = en_get32(buf + 8);
    if (en_get32(buf + 12) != world || r >= world || en_get64(buf + 16) != value) return COH_EPROTO;
    *kind = (rx_beat_kind)buf[5];
    *rank = r;
    return 0;
}
