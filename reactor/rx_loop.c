/*
 * Reactor threads: a libuv loop per thread, fed by an intrusive MPSC queue
 * (Vyukov's algorithm) and one uv_async_t that coalesces wake-ups; the loop
 * drains everything queued on each wake.
 */
#include "reactor/reactor.h"

#include <errno.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

void rx_mpsc_init(rx_mpsc_t *q)
{
    atomic_store_explicit(&q->stub.next, NULL, memory_order_relaxed);
    atomic_store_explicit(&q->head, &q->stub, memory_order_relaxed);
    q->tail = &q->stub;
}

void rx_mpsc_push(rx_mpsc_t *q, rx_task_t *t)
{
    atomic_store_explicit(&t->next, NULL, memory_order_relaxed);
    rx_task_t *prev = atomic_exchange_explicit(&q->head, t, memory_order_acq_rel);
    /* Between the exchange and this store the queue is briefly cut; the
     * consumer sees that as "empty for now" and the wake-up that follows
     * this push brings it back.
     * An exchange, not a release store: a full barrier (a locked instruction
     * on x86; a fence would do, but TSan refuses fences). The wake-up that
     * follows (uv_async_send) first reads libuv's pending flag, plainly, and
     * x86 may do that read before a plain store is visible (store-load
     * reordering). Seeing a wake-up pending, it sends none; the loop, woken
     * by that earlier one, clears the flag, finds the queue cut here and
     * sleeps: the task waits for the loop's next pass (50 ms). Not caught in
     * a test (2.4 million contended posts); a known hazard of that read. */
    atomic_exchange_explicit(&prev->next, t, memory_order_seq_cst);
}

rx_task_t *rx_mpsc_pop(rx_mpsc_t *q)
{
    rx_task_t *tail = q->tail;
    rx_task_t *next = atomic_load_explicit(&tail->next, memory_order_acquire);
    if (tail == &q->stub) {
        if (!next) return NULL;
        q->tail = next;
        tail = next;
        next = atomic_load_explicit(&tail->next, memory_order_acquire);
    }
    if (next) {
        q->tail = next;
        return tail;
    }
    if (tail != atomic_load_explicit(&q->head, memory_order_acquire)) return NULL;
    rx_mpsc_push(q, &q->stub);
    next = atomic_load_explicit(&tail->next, memory_order_acquire);
    if (next) {
        q->tail = next;
        return tail;
    }
    return NULL;
}

/* Consumer only: nothing queued and no push half done. pop returns NULL in
 * both cases; only here is it safe to run a task ahead of the queue. */
static bool mpsc_drained(rx_mpsc_t *q)
{
    return q->tail == atomic_load_explicit(&q->head, memory_order_acquire) &&
           atomic_load_explicit(&q->tail->next, memory_order_acquire) == NULL;
}

/* Wake the loop thread (any thread): as a post, so that no wake-up reaches
 * a loop whose async handle is closing (see rx_reactor_post). */
static void wake_loop(rx_reactor_t *rx)
{
    atomic_fetch_add(&rx->posters, 1);
    if (atomic_load(&rx->accepting)) uv_async_send(&rx->wake);
    atomic_fetch_sub(&rx->posters, 1);
}

/* A thread other than the loop's ran (or will run) the loop while the loop
 * thread is blocked in epoll on the doorbells it armed: that pass may have
 * read a doorbell, cleared a flag (a writer waiting for room or for its
 * single-copy frames to be read) or queued frames whose completion needs a
 * flag armed. Kick the loop thread: it arms again before it blocks (or,
 * with helpers running, waits for them instead). Through an eventfd only
 * that thread reads: a helper's pass would consume the async handle's
 * wake-up. Free while it is awake or waiting for helpers, the steady state
 * of back-to-back ops. */
static void wake_if_asleep(rx_reactor_t *rx)
{
    if (rx->kick_fd >= 0 && atomic_load(&rx->asleep)) {
        uint64_t one = 1;
        ssize_t n;
        do n = write(rx->kick_fd, &one, sizeof(one));
        while (n < 0 && errno == EINTR);
    }
}

/* The owner's poll hook until it finds nothing more (bounded: the loop's
 * fds get their turn). Run_mu held. */
static void poll_pass(rx_reactor_t *rx)
{
    if (!rx->hooks.poll) return;
    int i = 0;
    while (rx->hooks.poll(rx))
        if (++i == 64) {
            /* Still going: the loop thread (perhaps asleep) takes over. */
            wake_loop(rx);
            break;
        }
}

/* One non-blocking pass of the loop, then the poll hook. Run_mu held.
 * SIGPIPE holds kept for writes queued before or during it end here. */
static int run_pass(rx_reactor_t *rx)
{
    int alive = uv_run(&rx->loop, UV_RUN_NOWAIT);
    poll_pass(rx);
    bs_sigpipe_settle();
    return alive;
}

static bool has_streams(rx_reactor_t *rx)
{
    return !rx->hooks.streams || rx->hooks.streams(rx);
}

/* How long the loop thread stays parked after the last helper left with
 * its op done (reactor.h, help_left_ns): 2 ranks, 4 KiB back to back over
 * shared memory woke it about 20000 times a second without. */
#define RX_LINGER_NS 50000ull

/* Loop thread: sleep while helpers run the loop, until one leaving with
 * work in flight bumps park (it was pk when helpers was read), or
 * RX_PARK_NS. The timeout only looks again (a helper that leaves always
 * bumps park); at 1 ms it woke each rank's loop thread 1000 times a second
 * while its waiter worked, and on a host with more ranks than cores those
 * wake-ups took the cores from the ranks: 4 ranks on 2 cores, 1 MiB over
 * shared memory, 410-470 us instead of 470-760 (docs/shm.md). */
#define RX_PARK_NS 20000000L

static void park_wait_ns(rx_reactor_t *rx, int pk, long ns)
{
    struct timespec ts = {.tv_sec = ns / 1000000000L, .tv_nsec = ns % 1000000000L};
    syscall(SYS_futex, (int *)&rx->park, FUTEX_WAIT_PRIVATE, pk, &ts, NULL, 0);
}

static void park_wait(rx_reactor_t *rx, int pk)
{
    park_wait_ns(rx, pk, RX_PARK_NS);
}

/* Threading: loop thread. */
static void wake_cb(uv_async_t *h)
{
    rx_reactor_t *rx = h->data;
    rx_task_t *t;
    while ((t = rx_mpsc_pop(&rx->queue)) != NULL) t->run(t, rx);
}

static void thread_main(void *arg)
{
    rx_reactor_t *rx = arg;
    /* Signals are the application's business: a loop thread takes none. In
     * particular a write to a peer that just died raises SIGPIPE on the
     * writing thread; blocked here, it only leaves EPIPE for libuv. */
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    bs_sigpipe_blocked();
    uv_sem_post(&rx->started);
    /*
     * The loop is embedded: this thread waits for readiness on the loop's
     * backend fd without holding the loop, then takes run_mu and runs one
     * non-blocking pass. A thread waiting for a request (coh_wait) can take
     * run_mu in between and run the pass itself (rx_reactor_help): on a
     * small op the waiter then sends, receives and completes on its own,
     * with no wake-up of this thread and none of the waiter, which is what
     * small-message latency is made of on an oversubscribed host. One thread
     * at a time runs the loop; run_mu is what makes it "the" loop thread.
     */
    int fd = uv_backend_fd(&rx->loop);
    for (;;) {
        /* A helper runs the loop: it does this thread's work. Sleep until
         * the last one leaves work behind (or 1 ms), rather than take the
         * loop over between its passes. */
        int pk0 = atomic_load(&rx->park);
        if (atomic_load(&rx->helpers) > 0) {
            park_wait(rx, pk0);
            continue;
        }
        uv_mutex_lock(&rx->run_mu);
        int alive = run_pass(rx);
        /* Posted tasks run from their wake-up (wake_cb). The kill trials
         * caught a sync's task on the control reactor that never ran: its
         * READY never left, and the coordinator excluded the live rank as
         * late (cause not found; docs/relay.md). The loop thread also runs
         * whatever it finds queued after a pass, at least every 50 ms. */
        rx_task_t *t;
        while ((t = rx_mpsc_pop(&rx->queue)) != NULL) t->run(t, rx);
        /* Busy polling (COHORT_POLL_US): while the owner has work in flight,
         * run again soon instead of sleeping, so that a frame landing inside
         * the window is seen without a wake-up. */
        uint64_t until = rx->hooks.busy && rx->poll_ns ? bs_now_ns() + rx->poll_ns : 0;
        while (alive && until && rx->hooks.busy(rx) && bs_now_ns() < until &&
               atomic_load(&rx->helpers) == 0) {
            uv_mutex_unlock(&rx->run_mu);
            sched_yield();
            uv_mutex_lock(&rx->run_mu);
            alive = run_pass(rx);
        }
        int timeout = alive ? uv_backend_timeout(&rx->loop) : 0;
        /* Blocking in epoll from here on: ask for doorbells, unless helpers
         * run the loop (they look; this thread waits for them to leave, then
         * arms). asleep, then helpers, against a helper's helpers, then
         * asleep (seq_cst both): one of the two sees the other. Work already
         * there means another pass at once. */
        int pk = atomic_load(&rx->park);
        int h = atomic_load(&rx->helpers);
        /* Nothing in flight and a waiter just left: it is likely back with
         * its next op within RX_LINGER_NS (then it runs the loop, and this
         * thread sleeps on). With ops in flight and nobody helping, this
         * thread is their progress: it arms and sleeps in epoll. */
        bool linger = h == 0 && alive && rx->hooks.arm && !(rx->hooks.busy && rx->hooks.busy(rx)) &&
                      bs_now_ns() - atomic_load(&rx->help_left_ns) < RX_LINGER_NS;
        if (alive && rx->hooks.arm && h == 0 && !linger) {
            /* asleep only now: a submission that sees it kicks, and a kick
             * nobody needed makes the next sleep end at once. */
            atomic_store(&rx->asleep, 1);
            h = atomic_load(&rx->helpers);
            if (h > 0)
                atomic_store(&rx->asleep, 0);
            else if (!rx->hooks.arm(rx))
                timeout = 0;
        }
        uv_mutex_unlock(&rx->run_mu);
        if (!alive) return;
        /* A helper may have armed a timer this pass did not see: look again
         * at least every 50 ms. */
        if (timeout < 0 || timeout > 50) timeout = 50;
        if (h > 0) {
            /* A waiter is running the loop: do not wake on every event it is
             * handling; sleep until it leaves (or the timeout). */
            park_wait(rx, pk);
            continue;
        }
        if (linger) {
            /* A waiter just left: likely back with its next op before this
             * ends; then it is its loop again and nothing was armed. */
            park_wait_ns(rx, pk, (long)RX_LINGER_NS);
            continue;
        }
        struct pollfd p[2] = {{.fd = fd, .events = POLLIN}, {.fd = rx->kick_fd, .events = POLLIN}};
        poll(p, rx->kick_fd >= 0 ? 2 : 1, timeout);
        atomic_store(&rx->asleep, 0);
        if (rx->kick_fd >= 0 && (p[1].revents & POLLIN)) {
            uint64_t v;
            ssize_t n = read(rx->kick_fd, &v, sizeof(v));
            (void)n;
        }
    }
}

/* A waiter's help holds SIGPIPE (bs_sigpipe_hold) only while libuv has
 * writes queued on the loop it helps (rx_reactor_hooks_t.writes): three
 * system calls per op fewer whenever frames leave at once. */
static _Thread_local bool help_pipe;
static _Thread_local uint64_t help_epoll_ns;
/* Without stream sockets a helper asks epoll (timers, hang-ups) this often:
 * every 16th pass was 0.7 epoll_wait per 4 KiB op at 2 ranks. */
#define RX_HELP_EPOLL_NS 50000ull

/* Hold SIGPIPE while libuv may write(2) in a pass of rx (writes queued),
 * unless *held says it is held already; whether rx has stream sockets. */
static bool hold_for_streams(rx_reactor_t *rx, bool *held)
{
    bool streams = has_streams(rx);
    if (streams && !*held && (!rx->hooks.writes || rx->hooks.writes(rx))) {
        bs_sigpipe_hold();
        *held = true;
    }
    return streams;
}

void rx_reactor_help_begin(rx_reactor_t *rx)
{
    atomic_fetch_add(&rx->helpers, 1);
    /* From epoll to the helpers' futex: helpers look at everything, and the
     * loop thread arms again only once they are gone. */
    wake_if_asleep(rx);
}

void rx_reactor_help_end(rx_reactor_t *rx, bool wake)
{
    /* The loop thread sleeps (up to RX_PARK_NS) while helpers run the loop.
     * When the last helper leaves with work still in flight, wake the
     * thread now: the helper's own (it gave up waiting), or another op of
     * the loop (a second allreduce in flight while the caller computes:
     * it waited up to 20 ms, mp.overlap.n2). With nothing in flight, let
     * the thread wake on its own: the helper is likely back with its next
     * op first. A loop someone else runs right now needs no wake-up. */
    if (!wake) atomic_store(&rx->help_left_ns, bs_now_ns());
    if (atomic_fetch_sub(&rx->helpers, 1) == 1) {
        if (!wake && rx->hooks.busy && uv_mutex_trylock(&rx->run_mu) == 0) {
            wake = atomic_load(&rx->state) == RX_RUNNING && rx->hooks.busy(rx);
            uv_mutex_unlock(&rx->run_mu);
        }
        if (wake) {
            atomic_fetch_add(&rx->park, 1);
            syscall(SYS_futex, (int *)&rx->park, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
        }
    }
    if (help_pipe) {
        help_pipe = false;
        bs_sigpipe_release();
    }
}

int rx_reactor_help(rx_reactor_t *rx, uint64_t now)
{
    if (uv_mutex_trylock(&rx->run_mu) != 0) return RX_HELP_BUSY;
    int r = RX_HELP_BUSY;
    if (atomic_load(&rx->state) == RX_RUNNING) {
        bool streams = hold_for_streams(rx, &help_pipe);
        uint64_t before = rx->hooks.progress ? rx->hooks.progress(rx) : 0;
        /* Submissions first: the wake-up they sent may not have been seen. */
        rx_task_t *t;
        bool tasks = false;
        while ((t = rx_mpsc_pop(&rx->queue)) != NULL) {
            t->run(t, rx);
            tasks = true;
        }
        /* Again: a task may have made a socket, which this pass can write. */
        if (tasks) streams = hold_for_streams(rx, &help_pipe);
        /* Without stream sockets the poll hook sees every frame: epoll (a
         * system call) only every 16th pass, for timers and the sockets'
         * hang-ups. 2 ranks, 4 KiB over shared memory: 4.4 -> 2.8-3.2 us
         * with the SIGPIPE hold above left out. */
        if (streams || tasks || now - help_epoll_ns >= RX_HELP_EPOLL_NS) {
            help_epoll_ns = now;
            run_pass(rx);
        } else {
            poll_pass(rx);
        }
        r = !tasks && rx->hooks.progress && rx->hooks.progress(rx) == before ? RX_HELP_IDLE
                                                                             : RX_HELP_DID;
        bs_sigpipe_settle(); /* when no run_pass came after the tasks */
    }
    uv_mutex_unlock(&rx->run_mu);
    return r;
}

int rx_reactor_start(rx_reactor_t *rx, const char *name, void (*on_stop)(rx_reactor_t *),
                     void *owner)
{
    return rx_reactor_start_hooked(rx, name, on_stop, owner, NULL, 0);
}

int rx_reactor_start_hooked(rx_reactor_t *rx, const char *name, void (*on_stop)(rx_reactor_t *),
                            void *owner, const rx_reactor_hooks_t *hooks, uint64_t poll_ns)
{
    memset(rx, 0, sizeof(*rx));
    rx->kick_fd = -1;
    if (hooks) rx->hooks = *hooks;
    rx->poll_ns = poll_ns;
    snprintf(rx->name, sizeof(rx->name), "%s", name);
    rx->on_stop = on_stop;
    rx->owner = owner;
    rx_mpsc_init(&rx->queue);
    int e = uv_loop_init(&rx->loop);
    if (e) return bs_fail(bs_errno_status(e), "%s: uv_loop_init: %s", name, uv_strerror(e));
    rx->loop.data = rx;
    e = uv_async_init(&rx->loop, &rx->wake, wake_cb);
    if (e) {
        uv_loop_close(&rx->loop);
        return bs_fail(bs_errno_status(e), "%s: uv_async_init: %s", name, uv_strerror(e));
    }
    rx->wake.data = rx;
    int st;
    if (uv_mutex_init(&rx->run_mu) != 0) {
        st = bs_fail(COH_ESYS, "%s: uv_mutex_init failed", name);
        goto no_mu;
    }
    if (uv_sem_init(&rx->started, 0) != 0) {
        st = bs_fail(COH_ESYS, "%s: uv_sem_init failed", name);
        goto no_sem;
    }
    if (rx->hooks.arm && (rx->kick_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0) {
        st = bs_fail(COH_ESYS, "%s: eventfd: %s", name, strerror(errno));
        goto no_kick;
    }
    /* Loops need little stack; a smaller one keeps many rails cheap. */
    uv_thread_options_t opts = {.flags = UV_THREAD_HAS_STACK_SIZE, .stack_size = 1 << 20};
    atomic_store(&rx->state, RX_RUNNING);
    atomic_store(&rx->accepting, 1);
    e = uv_thread_create_ex(&rx->thread, &opts, thread_main, rx);
    if (e) {
        atomic_store(&rx->state, RX_INIT);
        atomic_store(&rx->accepting, 0);
        st = bs_fail(bs_errno_status(e), "%s: thread: %s", name, uv_strerror(e));
        goto no_thread;
    }
    uv_sem_wait(&rx->started);
    return 0;
no_thread:
    if (rx->kick_fd >= 0) close(rx->kick_fd);
    rx->kick_fd = -1;
no_kick:
    uv_sem_destroy(&rx->started);
no_sem:
    uv_mutex_destroy(&rx->run_mu);
no_mu:
    uv_close((uv_handle_t *)&rx->wake, NULL);
    uv_run(&rx->loop, UV_RUN_DEFAULT);
    uv_loop_close(&rx->loop);
    return st;
}

bool rx_reactor_post(rx_reactor_t *rx, rx_task_t *task)
{
    /* A poster announces itself, then looks at `accepting`; the stop task
     * clears `accepting`, then waits for the posters to leave (seq_cst on
     * both sides: one of them sees the other). So no wake-up is ever sent
     * to a loop whose async handle is closing. */
    atomic_fetch_add(&rx->posters, 1);
    bool ok = atomic_load(&rx->accepting) != 0;
    if (ok) {
        rx_mpsc_push(&rx->queue, task);
        uv_async_send(&rx->wake);
    }
    atomic_fetch_sub(&rx->posters, 1);
    return ok;
}

bool rx_reactor_run_or_post(rx_reactor_t *rx, rx_task_t *task)
{
    /* Nobody runs the loop right now: run the task here, after whatever was
     * posted before it (order is kept). No wake-up of the loop thread. When
     * another thread's push is half done, a task of ours may sit behind it:
     * then queue this one too, after it (test_loop caught the overtaking). */
    if (uv_mutex_trylock(&rx->run_mu) == 0) {
        if (atomic_load(&rx->state) == RX_RUNNING && atomic_load(&rx->accepting)) {
            bool held = false;
            hold_for_streams(rx, &held);
            rx_task_t *t;
            while ((t = rx_mpsc_pop(&rx->queue)) != NULL) t->run(t, rx);
            bool ran = mpsc_drained(&rx->queue);
            if (ran) {
                task->run(task, rx);
                /* One pass of the loop before letting go: libuv defers the
                 * callbacks of writes that completed at once (uv__io_feed)
                 * and the epoll registration of new watchers to the next
                 * pass, which the loop thread, asleep in poll(), would only
                 * run at its 50 ms timeout when no frame wakes it. A small
                 * op whose peer's frames were already in (stashed) then
                 * waited ~50 ms for its own send's completion. */
                /* The task may have made a socket, or queued writes. */
                bool streams = hold_for_streams(rx, &held);
                /* Without stream sockets the poll hook delivers everything;
                 * a watcher the task added is registered by the loop thread,
                 * which the kick below wakes. */
                if (streams)
                    run_pass(rx);
                else
                    poll_pass(rx);
                /* As a helper leaving: back soon with the next op (a rank
                 * whose ops all complete in this pass never waits). */
                atomic_store(&rx->help_left_ns, bs_now_ns());
                wake_if_asleep(rx);
            }
            bs_sigpipe_settle(); /* the tasks' writes, when no run_pass came after them */
            if (held) bs_sigpipe_release();
            if (ran) {
                uv_mutex_unlock(&rx->run_mu);
                return true;
            }
        }
        uv_mutex_unlock(&rx->run_mu);
    }
    return rx_reactor_post(rx, task);
}

typedef struct call_task {
    rx_task_t task;
    int (*fn)(rx_reactor_t *, void *);
    void *arg;
    int result;
    char why[BS_ERR_LEN]; /* fn's error text: set on the loop's thread, carried back */
    uv_sem_t done;
} call_task_t;

static void call_run(rx_task_t *t, rx_reactor_t *rx)
{
    call_task_t *c = (call_task_t *)t;
    c->result = c->fn(rx, c->arg);
    if (c->result < 0) snprintf(c->why, sizeof(c->why), "%s", coh_last_error());
    uv_sem_post(&c->done);
}

int rx_reactor_call(rx_reactor_t *rx, int (*fn)(rx_reactor_t *, void *), void *arg)
{
    if (atomic_load(&rx->state) != RX_RUNNING)
        return bs_fail(COH_ESTATE, "reactor %s is not running", rx->name);
    call_task_t c = {.task.run = call_run, .fn = fn, .arg = arg};
    if (uv_sem_init(&c.done, 0) != 0) return bs_fail(COH_ESYS, "uv_sem_init failed");
    if (!rx_reactor_post(rx, &c.task)) {
        uv_sem_destroy(&c.done);
        return bs_fail(COH_ESTATE, "reactor %s is stopping", rx->name);
    }
    uv_sem_wait(&c.done);
    uv_sem_destroy(&c.done);
    /* The last error is per thread: fn's is the caller's now. */
    if (c.result < 0) return bs_fail(c.result, "%s", c.why[0] ? c.why : coh_strerror(c.result));
    return c.result;
}

static void stop_run(rx_task_t *t, rx_reactor_t *rx)
{
    (void)t;
    /* No more posts; those already in rx_reactor_post finish first, and
     * what they queued runs now, before the owner closes its handles. */
    atomic_store(&rx->accepting, 0);
    while (atomic_load(&rx->posters) > 0) sched_yield();
    rx_task_t *q;
    while ((q = rx_mpsc_pop(&rx->queue)) != NULL) q->run(q, rx);
    atomic_store(&rx->state, RX_STOPPING);
    if (rx->on_stop) rx->on_stop(rx);
    /* Once the owner's handles and this one are closed, uv_run returns. */
    uv_close((uv_handle_t *)&rx->wake, NULL);
}

static void close_leftover(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h)) uv_close(h, NULL);
}

void rx_reactor_close(rx_reactor_t *rx)
{
    int st = atomic_load(&rx->state);
    if (st == RX_INIT || st == RX_STOPPED) return;
    int was = 0;
    if (!atomic_compare_exchange_strong(&rx->closed, &was, 1)) return;
    rx->stop_task.run = stop_run;
    rx_reactor_post(rx, &rx->stop_task); /* accepted: only stop_run stops accepting */
}

int rx_reactor_stop(rx_reactor_t *rx)
{
    int st = atomic_load(&rx->state);
    if (st == RX_INIT || st == RX_STOPPED) return 0;
    rx_reactor_close(rx);
    uv_thread_join(&rx->thread);
    atomic_store(&rx->state, RX_STOPPED);
    int status = 0;
    if (uv_loop_close(&rx->loop) == UV_EBUSY) {
        /* An owner left a handle open: a bug, but close it rather than leak
         * the loop, and say so. */
        uv_walk(&rx->loop, close_leftover, NULL);
        uv_run(&rx->loop, UV_RUN_DEFAULT);
        uv_loop_close(&rx->loop);
        status = bs_fail(COH_EINTERNAL, "reactor %s: handles left open at stop", rx->name);
    }
    uv_sem_destroy(&rx->started);
    /* run_mu stays: a waiter may still try it (and find the loop stopped)
     * until the reactor's memory goes (rx_reactor_fini). */
    return status;
}

void rx_reactor_fini(rx_reactor_t *rx)
{
    int st = atomic_load(&rx->state);
    if (st == RX_STOPPED) uv_mutex_destroy(&rx->run_mu);
    if (st == RX_STOPPED && rx->kick_fd >= 0) {
        close(rx->kick_fd);
        rx->kick_fd = -1;
    }
    atomic_store(&rx->state, RX_INIT);
}
