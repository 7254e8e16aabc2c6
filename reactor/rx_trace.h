/*
 * rx_trace.h - the timeline (COHORT_TIMELINE=FILE): a Chrome trace per rank
 * (JSON, chrome://tracing or Perfetto) of every request (its submission to
 * completion, its slices per rail, bytes, status, loss), every coh_wait,
 * every sync (waiting for a group, then exchanging with it), the
 * coordinator's launches with their reason, and rail failovers. Events are
 * kept in memory (a bounded buffer) and written at finalize; the clock
 * offset to rank 0, measured at bootstrap, goes with them for
 * tools/cohort_timeline.py to merge the ranks. Off (the default) costs one
 * branch per event site.
 */
#ifndef RX_TRACE_H
#define RX_TRACE_H

#include <stddef.h>
#include <stdint.h>

struct coh_ctx;
typedef struct rx_trace rx_trace_t;

/* Pseudo threads of a rank's trace: the application's requests and waits
 * use real thread ids (>= 1000 in practice); these name the rest. */
enum { RX_TR_SYNC = 1, RX_TR_COORD = 2, RX_TR_RAIL0 = 10 };

/* Start recording when COHORT_TIMELINE names a file ("%d": the rank; else
 * FILE.RANK.json). 0 when off or started; COH_EINVAL for a bad knob. */
int rx_trace_open(struct coh_ctx *ctx);
/* Bootstrap: measure this rank's clock offset to rank 0 (a few rounds of a
 * barrier and an allgather of the time each rank left it). Collective: the
 * ranks agree on the timeline being on (the settings check). */
int rx_trace_measure_offset(struct coh_ctx *ctx);
/* Write the file and free the buffer (finalize). */
void rx_trace_close(struct coh_ctx *ctx);

/* One event. ph: 'X' (complete: ts_ns and dur_ns), 'i' (instant), 'b' / 'e'
 * (async begin / end, matched by id). args: a JSON object's members
 * ("\"k\":1,\"s\":\"x\"") or NULL. Any thread. */
void rx_trace_add(rx_trace_t *t, char ph, const char *cat, const char *name, int tid,
                  uint64_t ts_ns, uint64_t dur_ns, uint64_t id, const char *args);
/* A JSON string's contents for s (quotes and control bytes escaped). */
void rx_trace_escape(const char *s, char *out, size_t cap);

#endif
