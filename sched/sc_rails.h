/*
 * sc_rails.h - how an op is split over the rails (pure).
 *
 * One function decides, for world collectives and sync groups alike, which
 * rails carry which part of an op; every rank computes the same split from
 * the same arguments, so the slices on both ends of a rail match: an even
 * split above a size threshold and one rail (by a key all ranks share)
 * below it. World ops split by the multi-rail balancer instead (rx_lb.h);
 * sub-communicators, sync groups and COHORT_LB_EPOCH=0 come here.
 */
#ifndef COH_SC_RAILS_H
#define COH_SC_RAILS_H

#include <stdint.h>

#define SC_MAX_RAILS 16

typedef struct sc_slice {
    int rail;
    uint64_t lo, hi; /* elements [lo, hi) of the op's split dimension */
} sc_slice_t;

typedef struct sc_split_in {
    uint64_t count;          /* elements of the dimension split (whole op, or per-rank block) */
    uint64_t bytes;          /* bytes the op moves, for the threshold */
    int nrails;              /* rails available, 1..SC_MAX_RAILS */
    uint64_t rail_min_bytes; /* below: one rail */
    uint64_t small_bytes;    /* at or below: the same rail for SC_STICKY_OPS keys in a row */
    uint64_t key;            /* same on every rank (op sequence, group id): picks the one rail */
} sc_split_in_t;

/* Small ops keep to one rail for this many keys in a row: alternating them
 * over two rails woke the other rail's thread for the next op's early
 * frames (2 ranks, 4 KiB over two rails on loopback: p90 66-71 us against
 * 22-25 sticky, a single rail's 17-25). Larger single-rail ops alternate,
 * so that several in flight use every NIC. */
#define SC_STICKY_OPS 64

/* Fill out[0..n) and return n (>= 1), or COH_EINVAL. */
int sc_rail_split(const sc_split_in_t *in, sc_slice_t out[SC_MAX_RAILS]);

#endif
