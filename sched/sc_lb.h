/*
 * sc_lb.h - the multi-rail load balancer (Nezha's data-length table), pure.
 *
 * Per rail and per size bucket (powers of two of bytes) it keeps what the
 * rail's slices cost: a latency per rail and a rate per (rail, bucket), both
 * smoothed over completed slices. From that table it answers how many bytes
 * of an op go on which rail:
 *   - cold (Nezha's cold start): the whole op on the one rail with the lowest
 *     expected time, when striping would not be faster. The threshold is not
 *     a constant: striping is chosen exactly where its expected time
 *     (the slowest share, plus the striping overhead) drops below the best
 *     single rail's, both from the measurements;
 *   - hot: shares proportional to the rails' measured rates for the size of
 *     their share (solved by a few fixed-point rounds, since a rail's rate
 *     depends on how much it carries); a rail whose efficiency ratio to the
 *     best exceeds the divergence tolerance (Nezha's 5) gets nothing.
 * The update is a smoothed ratio, not Nezha's gradient step: an EWMA of each
 * rail's measured rate (gain `gain`) makes the shares the rate ratio, which is
 * the fixed point Nezha's gradient descent converges to, without a step size
 * to tune, and one slow sample moves a share by `gain` of the way only.
 * Rails without measurements are given the mean of the measured ones, and
 * every `probe_every`-th decision stripes over every rail that is up, so a
 * rail cut off by the tolerance is measured again and can come back.
 *
 * Deterministic: the same table and the same arguments give the same split
 * (every rank must split an op the same way). No clock, no I/O.
 */
#ifndef COH_SC_LB_H
#define COH_SC_LB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sched/sc_rails.h"

#define SC_LB_BUCKETS 40 /* 2^0 .. 2^39 bytes */

typedef struct sc_lb_params {
    double tolerance;         /* divergence tolerance: best rate / rate above it: no share (5) */
    double gain;              /* EWMA gain of a new measurement (0.3) */
    double stripe_overhead_s; /* fixed cost of striping one op over several rails (20e-6) */
    uint32_t
        probe_every; /* every n-th decision stripes over all rails that are up (64; 0: never) */
} sc_lb_params_t;

void sc_lb_params_default(sc_lb_params_t *p);

typedef struct sc_lb sc_lb_t;

int sc_lb_create(int nrails, const sc_lb_params_t *p, sc_lb_t **out);
void sc_lb_destroy(sc_lb_t *lb);

/* A slice of `bytes` took `seconds` on rail (from its start to its end). */
int sc_lb_observe(sc_lb_t *lb, int rail, uint64_t bytes, double seconds);
/* A rail failed (no share until it is up again) or came back. */
int sc_lb_set_up(sc_lb_t *lb, int rail, bool up);
bool sc_lb_is_up(const sc_lb_t *lb, int rail);

typedef struct sc_lb_plan {
    int nrails_used;
    bool striped;                 /* false: cold, the whole op on one rail */
    uint64_t bytes[SC_MAX_RAILS]; /* per rail; sums to the op's bytes */
    double expect_s;              /* the expected time of the choice */
    double single_s;              /* the best single rail's expected time */
} sc_lb_plan_t;

/* How `bytes` of an op are split, for decision number `index` (the same on
 * every rank: an op sequence). Shares are multiples of `align` bytes (an
 * element size) except the last. COH_EPEER when no rail is up. */
int sc_lb_split(const sc_lb_t *lb, uint64_t bytes, uint64_t align, uint64_t index,
                sc_lb_plan_t *out);
/* The same plan as element ranges of a dimension of `count` elements of
 * `esize` bytes: slices in rail order, at least one. */
int sc_lb_slices(const sc_lb_plan_t *plan, uint64_t count, uint64_t esize,
                 sc_slice_t out[SC_MAX_RAILS]);

/* Expected seconds for `bytes` on one rail (the table's model). */
double sc_lb_expect(const sc_lb_t *lb, int rail, uint64_t bytes);

/* The table as text ("cohort-lb 1" then "rail R latency S" and
 * "rail R bucket B rate BPS n N" lines): inspect it, save it, load it into a
 * balancer of the same rail count so that a second run starts hot. */
int sc_lb_dump(const sc_lb_t *lb, char *buf, size_t cap);
int sc_lb_load(sc_lb_t *lb, const char *text);

/* The table (parameters, up/down rails and every measurement) in an exact
 * binary form, for a table authority to publish: a balancer unpacked from
 * it splits exactly as one unpacked from the same bytes anywhere else
 * (the text form rounds). sc_lb_pack returns the length, or COH_EINVAL when
 * cap is too small (SC_LB_PACK_MAX always suffices); sc_lb_unpack rejects
 * (COH_EINVAL) anything malformed or of another rail count and leaves lb
 * as it was then. */
#define SC_LB_PACK_MAX (40 + 16 * SC_MAX_RAILS * (SC_LB_BUCKETS + 1))
int sc_lb_pack(const sc_lb_t *lb, uint8_t *buf, size_t cap);
int sc_lb_unpack(sc_lb_t *lb, const uint8_t *buf, size_t len);
int sc_lb_nrails(const sc_lb_t *lb);

#endif
