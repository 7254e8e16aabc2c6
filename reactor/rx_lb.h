/*
 * rx_lb.h - the world communicator's rail balancer, live (docs/multirail.md).
 *
 * One table authority: the coordinator rank owns an sc_lb_t (sched/sc_lb.h)
 * and feeds it the times of its own world-op slices. World op s belongs to
 * epoch s / E (E = COHORT_LB_EPOCH) and every rank splits it with the table
 * of that epoch, so every rank splits it the same way. When the
 * coordinator's application thread submits op s with s % E == 0 and its
 * tables end with epoch e, it publishes the next (at op 0 also table 0): a
 * packed copy of its balancer, sent to every rank as a control message
 * (RX_CTL_LBTAB) and installed in its own history the same way. One
 * message covers epochs e + 1 .. e + span: span 1 after an op larger than
 * COHORT_SMALL_BYTES or a rail event, else twice the last, up to 16. A rank
 * whose op's table has not arrived yet queues the launch (in order, behind
 * any queued one) and launches it when the table arrives; the queue fails
 * (EPEER) when the coordinator is lost and
 * (ECANCELED) at finalize. Rail failover events (the rails' observer) are
 * logged, counted and reported to the coordinator (RX_CTL_RAIL), which keeps
 * a rail out of its table while any link on it is failed over.
 *
 * Sub-communicators and sync groups do not use it (sc_rail_split): they
 * share no sequence with the coordinator.
 */
#ifndef COH_RX_LB_H
#define COH_RX_LB_H

#include "reactor/rx_ctl.h"

struct coh_ctx;
typedef struct rx_lb rx_lb_t;

/* Init thread, before the rails start: set up ctx->rail_obs and, with
 * several rails, several ranks and COHORT_LB_EPOCH > 0, ctx->lb (the
 * coordinator loads COHORT_LB_TABLE if the file exists). */
int rx_lb_start(struct coh_ctx *ctx);
/* The rails' observer (ctx->rail_obs), for en_rail_cfg_t.observer. */
en_rail_observer_t *rx_lb_observer(struct coh_ctx *ctx);
/* Any thread: no more tables will come: fail every queued launch. */
void rx_lb_close(struct coh_ctx *ctx, int status, const char *why);
/* Any thread: a member of communicator comm failed: its launches still
 * waiting for a table fail now (the coordinator fails the op at submission
 * and will publish no table for it). */
void rx_lb_revoke(struct coh_ctx *ctx, uint32_t comm, int status, const char *why);
/* Finalize (application thread): close, and the coordinator saves its
 * table to COHORT_LB_TABLE. */
void rx_lb_finalize(struct coh_ctx *ctx);
/* After every thread has stopped. */
void rx_lb_fini(struct coh_ctx *ctx);
/* Any thread: table messages this rank (not the coordinator) received. */
uint64_t rx_lb_tables_in(struct coh_ctx *ctx);

/* Application thread: a world op, split with its epoch's table (now, or
 * when the table arrives). Returns like rx_launch; 0 also when queued. */
int rx_lb_launch(struct coh_ctx *ctx, coh_request_t *req, const rx_launch_t *L);
/* World ops seq .. seq + n - 1 were reserved by a device op (rx_gpu.c) and
 * will not pass rx_lb_launch: the coordinator publishes the tables their
 * epochs would have. */
void rx_lb_reserve(struct coh_ctx *ctx, uint64_t seq, uint64_t n);
/* Rail thread: a slice of req ended well (the coordinator measures). */
void rx_lb_observe(struct coh_ctx *ctx, const coh_request_t *req, const en_result_t *r);

/* Control loop (member side): a table arrived. COH_EPROTO when malformed. */
int rx_lb_on_table(struct coh_ctx *ctx, const rx_ctl_lbtab_t *t);
/* Control loop (member side, with the heartbeats: every COHORT_LIVENESS_MS
 * / 10, not at all when it is 0): queued launches older than
 * COHORT_TIMEOUT_MS fail with ETIMEDOUT (the coordinator never submitted
 * the op that publishes their table). */
void rx_lb_check_timeouts(struct coh_ctx *ctx);
/* Control loop (coordinator): rank reported a rail event. */
void rx_lb_on_rail(struct coh_ctx *ctx, int rank, const rx_ctl_rail_t *ev);
/* Control loop (coordinator): a rank connected: send it the recent tables. */
void rx_lb_greet(struct coh_ctx *ctx, rx_conn_t *conn);

/* A probe measured `rail` (coh_probe): its slowest link's rate and its
 * latency, turned into what a ring allreduce of a few sizes would take over
 * `world` ranks and fed to the coordinator's table (authority only). */
void rx_lb_probe(struct coh_ctx *ctx, int rail, double alpha_s, double gbps, int world);

#endif
