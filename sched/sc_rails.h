/*
 * sc_rails.h - how an op is split over the rails (pure).
 *
 * One function decides, for world collectives and sync groups alike, which
 * rails carry which part of an op; every rank computes the same split from
 * the same arguments, so the slices on both ends of a rail match. Today an
 * even split above a size threshold and one rail (by a key all ranks share)
 * below it; the multi-rail load balancer replaces the policy here.
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
    uint64_t key;            /* same on every rank (op sequence, group id): picks the one rail */
} sc_split_in_t;

/* Fill out[0..n) and return n (>= 1), or COH_EINVAL. */
int sc_rail_split(const sc_split_in_t *in, sc_slice_t out[SC_MAX_RAILS]);

#endif
