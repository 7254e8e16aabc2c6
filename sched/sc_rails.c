/* The split of an op over the rails (see sc_rails.h). */
#include "sched/sc_rails.h"

#include "cohort.h"
#include "sched/sc_plan.h"

int sc_rail_split(const sc_split_in_t *in, sc_slice_t out[SC_MAX_RAILS])
{
    if (!in || in->nrails < 1 || in->nrails > SC_MAX_RAILS) return COH_EINVAL;
    int n = 1;
    if (in->nrails > 1 && in->bytes >= in->rail_min_bytes && in->count >= (uint64_t)in->nrails)
        n = in->nrails;
    if (n == 1) {
        uint64_t k = in->bytes <= in->small_bytes ? in->key / SC_STICKY_OPS : in->key;
        out[0] = (sc_slice_t){.rail = (int)(k % (uint64_t)in->nrails), .lo = 0, .hi = in->count};
        return 1;
    }
    for (int s = 0; s < n; s++)
        out[s] = (sc_slice_t){.rail = s,
                              .lo = sc_split(in->count, (uint64_t)n, (uint64_t)s),
                              .hi = sc_split(in->count, (uint64_t)n, (uint64_t)s + 1)};
    return n;
}
