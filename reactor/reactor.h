/*
 * reactor.h - the runtime core.
 *
 * reactor/ owns: the libuv loop threads (one per NIC rail plus one control
 * reactor), cross-thread submission (an MPSC queue + uv_async_t per loop),
 * the context and its communicators, request lifecycle and completion
 * signalling (wait/test, the pollable event fd), configuration from the
 * environment, bootstrap (rank discovery, the rank-0 key-value store, the
 * job-token handshake) and, later, the coordinator's scheduler fiber.
 *
 * Threading: a reactor's loop and every handle on it are touched only by the
 * thread that holds its run_mu: the reactor's own thread, or a thread waiting
 * for a request that runs a pass of the loop itself (rx_reactor_help). Other
 * threads reach it only through rx_reactor_post().
 */
#ifndef COH_REACTOR_H
#define COH_REACTOR_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <uv.h>

#include "cohort.h"

/* ---- errors ---- */

/* Record a detail for coh_last_error() on this thread and return status. */
int rx_fail(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Propagate a negative status; CHECK_GOTO jumps to a cleanup label. */
#define RX_CHECK(expr)                                                                             \
    do {                                                                                           \
        int rx__s = (expr);                                                                        \
        if (rx__s < 0) return rx__s;                                                               \
    } while (0)
#define RX_CHECK_GOTO(expr, st, label)                                                             \
    do {                                                                                           \
        (st) = (expr);                                                                             \
        if ((st) < 0) goto label;                                                                  \
    } while (0)
/* libuv / errno code to a cohort status. */
int rx_uv_status(int uverr);

uint64_t rx_now_ns(void); /* monotonic */
/* FNV-1a over the 8 bytes of v: op signatures every rank computes alike. */
static inline uint64_t rx_fnv64(uint64_t h, uint64_t v)
{
    for (int i = 0; i < 8; i++) h = (h ^ ((v >> (8 * i)) & 0xff)) * 1099511628211ull;
    return h;
}
/* Hand a message to the application's log handler, if any (any thread). */
void rx_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int rx_parse_size(const char *s, uint64_t *out);

/* ---- MPSC queue of tasks (intrusive, lock-free for producers) ---- */

typedef struct rx_task rx_task_t;
struct rx_reactor;
typedef void (*rx_task_fn)(rx_task_t *task, struct rx_reactor *rx);
struct rx_task {
    _Atomic(rx_task_t *) next;
    rx_task_fn run; /* runs on the loop thread; owns the task from then on */
};

typedef struct rx_mpsc {
    _Atomic(rx_task_t *) head; /* producers swap themselves in here */
    rx_task_t *tail;           /* consumer only */
    rx_task_t stub;
} rx_mpsc_t;

void rx_mpsc_init(rx_mpsc_t *q);
void rx_mpsc_push(rx_mpsc_t *q, rx_task_t *t);
rx_task_t *rx_mpsc_pop(rx_mpsc_t *q); /* NULL when empty or a push is half done */

/* ---- reactor: one loop thread ---- */

typedef enum rx_reactor_state {
    RX_INIT = 0,
    RX_RUNNING,
    RX_STOPPING,
    RX_STOPPED,
} rx_reactor_state;

typedef struct rx_reactor {
    uv_loop_t loop;
    uv_async_t wake;
    uv_thread_t thread;
    rx_mpsc_t queue;
    _Atomic int state;
    char name[32];
    /* Called on the loop thread when the reactor is asked to stop: close
     * every handle the owner registered. The loop ends when they are closed. */
    void (*on_stop)(struct rx_reactor *rx);
    /* Optional: true while the owner has work in flight; the loop then
     * polls for poll_ns before it sleeps (see rx_reactor_start_polling). */
    bool (*busy)(struct rx_reactor *rx);
    uint64_t poll_ns;
    void *owner;
    uv_sem_t started;
    int start_status;
    uv_mutex_t run_mu;   /* held by whichever thread runs the loop right now */
    _Atomic int helpers; /* waiters driving the loop: its thread sleeps meanwhile */
} rx_reactor_t;

/* Start the loop thread. on_stop may be NULL. */
int rx_reactor_start(rx_reactor_t *rx, const char *name, void (*on_stop)(rx_reactor_t *),
                     void *owner);
/* The same, with busy polling: after any activity, while busy(rx) is true,
 * the loop keeps polling for poll_ns before it blocks in epoll again. */
int rx_reactor_start_polling(rx_reactor_t *rx, const char *name, void (*on_stop)(rx_reactor_t *),
                             void *owner, bool (*busy)(rx_reactor_t *), uint64_t poll_ns);
/* Any thread but the loop's: run the task right here if nobody runs the
 * loop (keeping the order of posted tasks), else post it. */
void rx_reactor_run_or_post(rx_reactor_t *rx, rx_task_t *task);
/* Any thread: queue a task for the loop thread. Never blocks. */
void rx_reactor_post(rx_reactor_t *rx, rx_task_t *task);
/* Any thread but the loop's: run fn(arg) on the loop thread and wait for it.
 * Returns what fn returned. For set-up and tear-down paths only. */
int rx_reactor_call(rx_reactor_t *rx, int (*fn)(rx_reactor_t *, void *), void *arg);
/* Ask the loop to stop (on_stop runs on the loop), join the thread, close
 * the loop. Safe on a reactor that never started. */
int rx_reactor_stop(rx_reactor_t *rx);
/* After stop, when the reactor's memory is about to go. */
void rx_reactor_destroy(rx_reactor_t *rx);
/* Any thread but the loop's: if nobody is running the loop, run one
 * non-blocking pass of it here (progress for a waiter). False if busy. */
bool rx_reactor_help(rx_reactor_t *rx);
/* Bracket a series of rx_reactor_help calls: while a helper is active the
 * reactor's own thread sleeps instead of waking on every event. */
void rx_reactor_help_begin(rx_reactor_t *rx);
void rx_reactor_help_end(rx_reactor_t *rx, bool wake);

/* ---- configuration (rx_config.c) ---- */

int rx_config_validate(const coh_config_t *cfg);
int rx_config_spin_us(const coh_config_t *cfg);

/* ---- requests ---- */

typedef enum rx_req_state { RX_REQ_RUNNING = 0, RX_REQ_DONE = 1 } rx_req_state;

struct coh_ctx;
struct en_op;

#define RX_ERR_LEN   256
#define RX_MAX_RAILS 16

struct coh_request {
    _Atomic int refs;    /* the caller's and the runtime's */
    _Atomic int state;   /* rx_req_state */
    _Atomic int status;  /* first failure wins */
    _Atomic int err_set; /* 1 once err holds the first failure's text */
    _Atomic int slices;  /* rail slices still running */
    _Atomic int waiters; /* threads asleep in coh_wait on this request */
    int spin_us;
    struct coh_ctx *ctx;
    uint32_t comm; /* the op every slice runs: (comm, seq) */
    uint64_t seq;
    uint64_t t_submit_ns;
    uint64_t t_done_ns;
    int nslices;
    int slice_rail[RX_MAX_RAILS]; /* the rail of each slice */
    struct rx_syncreq *sync;      /* partial synchronisation (rx_sync.h), else NULL */
    char err[RX_ERR_LEN];
};

coh_request_t *rx_request_new(struct coh_ctx *ctx, int nslices);
/* A rail slice ended (any thread). The last one completes the request. */
void rx_request_slice_done(coh_request_t *req, int status, const char *why);
void rx_request_unref(coh_request_t *req);
/* Free a request that was never handed out (an error path of a submit). */
void rx_request_discard(coh_request_t *req);
/* Mark complete, wake waiters, drop the runtime's reference (any thread). */
void rx_request_complete(coh_request_t *req);
/* Record a failure on the request (first one wins); no completion. */
void rx_request_set_error(coh_request_t *req, int status, const char *why);

#endif
