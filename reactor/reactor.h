/*
 * reactor.h - the runtime core.
 *
 * reactor/ owns: the libuv loop threads (one per NIC rail, one control
 * reactor, and a GPU reactor when device buffers are possible: rx_gpu.c),
 * cross-thread submission (an MPSC queue + uv_async_t per loop),
 * the context and its communicators, request lifecycle and completion
 * signalling (wait/test, the pollable event fd, the countdown of an op's
 * rail slices), configuration (rx_config.h), bootstrap (rank discovery, the
 * rank-0 key-value store, the job-token handshake), the control plane and
 * the coordinator that hosts the scheduler fiber (rx_sync.h).
 *
 * Below it: engines/ (transports, the plan executor), which reactor/ drives
 * on its loops and which reports back only through completion objects;
 * sched/ (plans, splits, policies); gpu/ and base/.
 *
 * Threading: a reactor's loop and every handle on it are touched only by the
 * thread that holds its run_mu: the reactor's own thread, or a thread waiting
 * for a request that runs a pass of the loop itself (rx_reactor_help). Other
 * threads reach it only through rx_reactor_post().
 *
 * Lifecycles, the same words everywhere (nng's): close = stop accepting
 * work, never blocks; stop = wait until quiet (threads joined, handles
 * closed); fini = free. Each is safe on a half-initialised object and a
 * second call does nothing. Objects that live on a loop (the store server,
 * the coordinator, connections) have close only: their memory goes in their
 * last handle's close callback, which the loop's stop waits for.
 */
#ifndef COH_REACTOR_H
#define COH_REACTOR_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <uv.h>

#include "base/base.h"
#include "cohort.h"

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

struct rx_reactor;

/* What an owner tells its loop beyond file descriptors (all optional, all
 * called with the loop held, by whichever thread runs it):
 *   busy: work is in flight: after activity the loop keeps polling for
 *         poll_ns before it blocks in epoll again, and it does not linger
 *         (help_left_ns) but arms at once: it is that work's progress;
 *   poll: look at what no fd announces (rings in shared memory, completions
 *         queued without a wake-up); true when it did something. Runs after
 *         every pass of the loop, also a waiter's (rx_reactor_help);
 *   arm:  the loop thread is about to block: ask to be woken from then on
 *         (a flag a writer reads, then rings a doorbell fd); false when work
 *         is already there, and the loop does not block;
 *   progress: a count that grows whenever work is done (bytes moved), so a
 *         waiter running the loop knows a pass that did nothing and gives
 *         the CPU away (rx_reactor_help);
 *   streams: the loop has stream sockets (TCP): a waiter's pass must ask
 *         epoll. False: everything is seen by poll (shared memory, verbs),
 *         and a waiter's passes skip the system call. NULL: true. Any
 *         thread; once true, true for good.
 *   writes: libuv has writes queued on those sockets, which a pass may
 *         flush with write(2): an application thread running it must hold
 *         SIGPIPE (bs_sigpipe_hold). The owner holds it itself around the
 *         writes it starts. NULL: whenever there are streams. Any thread. */
typedef struct rx_reactor_hooks {
    bool (*busy)(struct rx_reactor *rx);
    bool (*poll)(struct rx_reactor *rx);
    bool (*arm)(struct rx_reactor *rx);
    uint64_t (*progress)(struct rx_reactor *rx);
    bool (*streams)(struct rx_reactor *rx);
    bool (*writes)(struct rx_reactor *rx);
} rx_reactor_hooks_t;

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
    rx_reactor_hooks_t hooks; /* see rx_reactor_hooks_t */
    uint64_t poll_ns;
    void *owner;
    uv_sem_t started;
    int start_status;
    uv_mutex_t run_mu;   /* held by whichever thread runs the loop right now */
    _Atomic int helpers; /* waiters driving the loop: its thread sleeps meanwhile */
    /* The loop thread sleeps on this word (a futex) while helpers run the
     * loop; a helper that leaves work behind bumps it. Not on helpers
     * itself: that changes twice per op, and every change made the
     * sleeping thread's wait return at once to fight a helper for run_mu. */
    _Atomic int park;
    /* When the last helper left, or a submission ran the loop inline
     * (bs_now_ns). Such a thread is usually back within microseconds with
     * its next op; the loop thread lingers (parked) that long before it arms
     * and blocks in epoll, where that op's submission would kick it out. */
    _Atomic uint64_t help_left_ns;
    /* The loop thread armed (hooks.arm) and blocks in epoll: another
     * thread's pass may use up what it armed, and kicks it (kick_fd, an
     * eventfd only it reads) so that it arms again. */
    _Atomic int asleep;
    int kick_fd;
    _Atomic int closed;    /* rx_reactor_close posted its stop task */
    _Atomic int accepting; /* posts are taken (until the loop begins to stop) */
    _Atomic int posters;   /* threads inside rx_reactor_post right now */
    rx_task_t stop_task;
} rx_reactor_t;

/* Start the loop thread. on_stop may be NULL. */
int rx_reactor_start(rx_reactor_t *rx, const char *name, void (*on_stop)(rx_reactor_t *),
                     void *owner);
/* The same, with the owner's hooks (busy polling for poll_ns while
 * hooks->busy says so; 0: none). */
int rx_reactor_start_hooked(rx_reactor_t *rx, const char *name, void (*on_stop)(rx_reactor_t *),
                            void *owner, const rx_reactor_hooks_t *hooks, uint64_t poll_ns);
/* Any thread but the loop's: run the task right here if nobody runs the
 * loop (keeping the order of posted tasks), else post it. False when the
 * reactor no longer accepts tasks (see rx_reactor_post). */
bool rx_reactor_run_or_post(rx_reactor_t *rx, rx_task_t *task);
/* Any thread: queue a task for the loop thread. Never blocks. False when
 * the reactor is stopping or stopped: the task will not run and stays the
 * caller's (a post to a stopped loop must not reach libuv, which aborts on
 * a wake-up of a closed loop). */
bool rx_reactor_post(rx_reactor_t *rx, rx_task_t *task);
/* Any thread but the loop's: run fn(arg) on the loop thread and wait for it.
 * Returns what fn returned, with fn's error text as this thread's last error.
 * For set-up and tear-down paths only. */
int rx_reactor_call(rx_reactor_t *rx, int (*fn)(rx_reactor_t *, void *), void *arg);
/* Any thread but the loop's: ask the loop to stop (on_stop runs on the
 * loop, then the loop ends when every handle is closed). Never blocks. */
void rx_reactor_close(rx_reactor_t *rx);
/* close, then join the thread and close the loop. Returns COH_EINTERNAL if
 * an owner left a handle open (it is closed here). */
int rx_reactor_stop(rx_reactor_t *rx);
/* After stop, when the reactor's memory is about to go. */
void rx_reactor_fini(rx_reactor_t *rx);
/* Any thread but the loop's: if nobody is running the loop, run one
 * non-blocking pass of it here (progress for a waiter); now_ns is the
 * caller's bs_now_ns() (a clock read costs 80 ns and more in a VM, and the
 * waiter has just made one). RX_HELP_BUSY when
 * another thread runs it (or it stopped); RX_HELP_IDLE when the pass did
 * nothing (with a progress hook), RX_HELP_DID otherwise. */
enum { RX_HELP_BUSY = 0, RX_HELP_IDLE = 1, RX_HELP_DID = 2 };
int rx_reactor_help(rx_reactor_t *rx, uint64_t now_ns);
/* Bracket a series of rx_reactor_help calls: while a helper is active the
 * reactor's own thread sleeps instead of waking on every event (and SIGPIPE
 * is held for the caller while writes are queued, see bs_sigpipe_hold). */
void rx_reactor_help_begin(rx_reactor_t *rx);
void rx_reactor_help_end(rx_reactor_t *rx, bool wake);

/* ---- rails: a reactor thread per NIC running an engine rail (rx_rail.c) ---- */

#include "engines/engine.h"

#define RX_MAX_RAILS EN_MAX_RAILS

typedef struct rx_rail {
    rx_reactor_t rx;
    en_rail_t en;
} rx_rail_t;

struct coh_request;

/* One rail's slice of a request, handed to the rail's loop without an
 * allocation: the task lives in the request. */
typedef struct rx_slice {
    rx_task_t task;
    struct coh_request *req;
    en_op_t *op; /* until the rail takes it */
    int rail;
    uint64_t bytes; /* of the op's bytes, this slice's share (the balancer's measurements) */
    uint64_t lost_bytes[3], stage_bytes[3]; /* bounded loss, by sc_stage (en_result_t) */
} rx_slice_t;

/* Any thread. Initialise the engine rail, start its thread, listen. On
 * failure everything is undone. */
int rx_rail_start(rx_rail_t *r, const en_rail_cfg_t *cfg, int poll_us);
/* Any thread: post a dial of peer. */
int rx_rail_dial(rx_rail_t *r, int peer, const struct sockaddr *addr);
/* Any thread: start s->op on the rail; inline when allowed and the loop is
 * free (small ops), else posted. */
void rx_rail_submit(rx_rail_t *r, rx_slice_t *s, bool inline_ok);
/* Any thread: fail (comm, seq) on this rail if it still runs (or when it
 * arrives), and with peers, send them ABORT so they stop waiting for us. */
void rx_rail_cancel(rx_rail_t *r, uint32_t comm, uint64_t seq, int status, const char *why);
void rx_rail_abort(rx_rail_t *r, uint32_t comm, uint64_t seq, int status, const char *why,
                   const int *peers, int npeers);
/* Any thread: a member of communicator comm is out of the job: its ops on
 * this rail fail (status, why), now and when they come. */
void rx_rail_revoke(rx_rail_t *r, uint32_t comm, int status, const char *why);
/* Any thread: the peer is unresponsive: drop its connection on this rail
 * (what waits on it fails with status and why; so do later ops). */
void rx_rail_drop_peer(rx_rail_t *r, int peer, int status, const char *why);
/* Tests: break the link to peer on this rail as a failing NIC would (the
 * socket is shut down under the engine); with failover it moves. */
void rx_rail_debug_cut(rx_rail_t *r, int peer);
/* close: cancel what runs, say BYE (blocks for one loop round trip). */
void rx_rail_close(rx_rail_t *r);
/* stop: close, wait for the BYEs (until quiet_deadline_ns), join. */
void rx_rail_stop(rx_rail_t *r, uint64_t quiet_deadline_ns);
void rx_rail_fini(rx_rail_t *r);

/* ---- addresses: reactor/rx_addr.h ---- */

#include "reactor/rx_addr.h"

/* ---- configuration: reactor/rx_config.h ---- */

#include "reactor/rx_config.h"

/* ---- requests ---- */

typedef enum rx_req_state { RX_REQ_RUNNING = 0, RX_REQ_DONE = 1 } rx_req_state;

struct coh_ctx;

/* A device stream waiting for a request (coh_request_stream_wait, rx_gpu.c):
 * completion stores 1 into its flag, which the stream polls. */
typedef struct rx_flagwait {
    struct rx_flagwait *next;
    volatile uint32_t *flag;
} rx_flagwait_t;
#define RX_FLAGWAITS_CLOSED ((rx_flagwait_t *)1) /* completed: set the flag yourself */

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
    /* The engine reports each slice's end here (rx_request.c): the request
     * counts them down, keeps the first error, cancels the other slices and
     * hands a sync attempt to the control reactor. */
    en_completion_t done;
    int nslices;
    rx_slice_t slice[RX_MAX_RAILS];
    struct rx_syncreq *sync; /* partial synchronisation (rx_sync.h), else NULL */
    const char *what;        /* the timeline's name of the op (static), NULL: "request" */
    uint64_t bytes;          /* the timeline's: the op's bytes */
    _Atomic(rx_flagwait_t *) flagwaits; /* streams waiting; RX_FLAGWAITS_CLOSED once complete */
    void (*on_done)(void *arg);         /* called once complete (any thread; keep it short) */
    void *on_done_arg;
    bool deferred; /* launched later, by whichever thread brings its rail table (rx_lb.c):
                      its slices are not the waiter's to read */
    char err[BS_ERR_LEN];
};

coh_request_t *rx_request_new(struct coh_ctx *ctx, int nslices);
void rx_request_unref(coh_request_t *req);
/* Free a request that was never handed out (an error path of a submit). */
void rx_request_discard(coh_request_t *req);
/* Mark complete, wake waiters, drop the runtime's reference (any thread). */
void rx_request_complete(coh_request_t *req);
/* Record a failure on the request (first one wins); no completion. */
void rx_request_set_error(coh_request_t *req, int status, const char *why);

#endif
