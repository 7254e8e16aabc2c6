/*
 * The reactor loop on its own (reactor/rx_loop.c), run under TSan in CI:
 *   - the MPSC queue: several producers, every task run once, each
 *     producer's tasks in its order;
 *   - run-or-post: a task run inline never overtakes one posted before it;
 *   - rx_reactor_call runs on the loop (holding run_mu) and returns the
 *     function's value;
 *   - waiters driving the loop (rx_reactor_help) while another thread stops
 *     it: no crash, no race, help refuses once the loop is stopping;
 *   - the lifecycle: close and stop are idempotent, stop of a reactor that
 *     never started is a no-op, a handle left open is closed and reported;
 *   - SIGPIPE: a task that writes to a closed socket on the application's
 *     thread (run inline, or by a helping waiter) must not kill the process
 *     (SIGPIPE's default action here), leaves no SIGPIPE pending and the
 *     thread's signal mask as it was.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include "reactor/reactor.h"

#define PRODUCERS    4
#define PER_PRODUCER 20000

typedef struct order_task {
    rx_task_t task;
    int producer;
    int seq;
} order_task_t;

typedef struct order_state {
    int next[PRODUCERS];
    _Atomic int ran;
    _Atomic int bad; /* tasks seen out of order */
} order_state_t;

static order_state_t g_order;

static void order_run(rx_task_t *t, rx_reactor_t *rx)
{
    (void)rx;
    order_task_t *ot = (order_task_t *)t;
    /* next[] is touched only by whoever runs the loop: run_mu orders them. */
    if (ot->seq != g_order.next[ot->producer]) atomic_fetch_add(&g_order.bad, 1);
    g_order.next[ot->producer] = ot->seq + 1;
    atomic_fetch_add(&g_order.ran, 1);
}

typedef struct producer_arg {
    rx_reactor_t *rx;
    int id;
    order_task_t *tasks;
    bool inline_too; /* alternate post and run_or_post */
} producer_arg_t;

static void producer(void *p)
{
    producer_arg_t *a = p;
    for (int i = 0; i < PER_PRODUCER; i++) {
        order_task_t *t = &a->tasks[i];
        t->task.run = order_run;
        t->producer = a->id;
        t->seq = i;
        if (a->inline_too && (i & 1))
            rx_reactor_run_or_post(a->rx, &t->task);
        else
            rx_reactor_post(a->rx, &t->task);
    }
}

static void wait_ran(int want)
{
    for (int i = 0; i < 2000 && atomic_load(&g_order.ran) < want; i++) usleep(1000);
}

static void run_producers(bool inline_too)
{
    memset(&g_order, 0, sizeof(g_order));
    rx_reactor_t rx;
    assert_int_equal(rx_reactor_start(&rx, "test-loop", NULL, NULL), 0);
    order_task_t *tasks = calloc((size_t)PRODUCERS * PER_PRODUCER, sizeof(order_task_t));
    producer_arg_t args[PRODUCERS];
    uv_thread_t th[PRODUCERS];
    for (int p = 0; p < PRODUCERS; p++) {
        args[p] = (producer_arg_t){&rx, p, tasks + (size_t)p * PER_PRODUCER, inline_too};
        assert_int_equal(uv_thread_create(&th[p], producer, &args[p]), 0);
    }
    for (int p = 0; p < PRODUCERS; p++) uv_thread_join(&th[p]);
    wait_ran(PRODUCERS * PER_PRODUCER);
    assert_int_equal(atomic_load(&g_order.ran), PRODUCERS * PER_PRODUCER);
    assert_int_equal(atomic_load(&g_order.bad), 0);
    assert_int_equal(rx_reactor_stop(&rx), 0);
    rx_reactor_fini(&rx);
    free(tasks);
}

static void test_mpsc_order(void **state)
{
    (void)state;
    run_producers(false);
}

/* Inline runs drain what was posted before them: per-producer order holds
 * even when every other task skips the queue. */
static void test_run_or_post_order(void **state)
{
    (void)state;
    run_producers(true);
}

static uv_thread_t g_loop_thread;
static int on_loop(rx_reactor_t *rx, void *arg)
{
    /* The caller holds run_mu: trylock from here must fail. */
    int locked = uv_mutex_trylock(&rx->run_mu) == 0;
    if (locked) uv_mutex_unlock(&rx->run_mu);
    g_loop_thread = uv_thread_self();
    return locked ? -1 : *(int *)arg + 1;
}

static void test_call(void **state)
{
    (void)state;
    rx_reactor_t rx;
    assert_int_equal(rx_reactor_start(&rx, "test-call", NULL, NULL), 0);
    int v = 41;
    assert_int_equal(rx_reactor_call(&rx, on_loop, &v), 42);
    uv_thread_t self = uv_thread_self();
    assert_false(uv_thread_equal(&g_loop_thread, &self));
    assert_int_equal(rx_reactor_stop(&rx), 0);
    assert_int_equal(rx_reactor_call(&rx, on_loop, &v), COH_ESTATE);
    rx_reactor_fini(&rx);
}

/* ---- waiters driving the loop while it stops ---- */

typedef struct helper_arg {
    rx_reactor_t *rx;
    _Atomic int *stop;
    int helped, refused;
    order_task_t *tasks;
} helper_arg_t;

static void helper(void *p)
{
    helper_arg_t *a = p;
    int i = 0;
    while (!atomic_load(a->stop)) {
        rx_reactor_help_begin(a->rx);
        for (int k = 0; k < 50; k++) {
            if (rx_reactor_help(a->rx, bs_now_ns()))
                a->helped++;
            else
                a->refused++;
        }
        /* Work for the loop meanwhile, inline when the loop is free. */
        if (i < PER_PRODUCER) {
            order_task_t *t = &a->tasks[i];
            t->task.run = order_run;
            t->producer = 0;
            t->seq = i++;
            rx_reactor_run_or_post(a->rx, &t->task);
        }
        rx_reactor_help_end(a->rx, true);
    }
}

static void stopper_on_stop(rx_reactor_t *rx)
{
    (void)rx;
}

static void test_help_races_stop(void **state)
{
    (void)state;
    for (int round = 0; round < 20; round++) {
        memset(&g_order, 0, sizeof(g_order));
        rx_reactor_t rx;
        assert_int_equal(rx_reactor_start(&rx, "test-help", stopper_on_stop, NULL), 0);
        _Atomic int stop = 0;
        order_task_t *tasks = calloc(PER_PRODUCER, sizeof(order_task_t));
        helper_arg_t a = {.rx = &rx, .stop = &stop, .tasks = tasks};
        uv_thread_t th;
        assert_int_equal(uv_thread_create(&th, helper, &a), 0);
        usleep((useconds_t)(200 + 300 * (round % 5)));
        /* Stop while the helper drives the loop; it keeps trying after. */
        assert_int_equal(rx_reactor_stop(&rx), 0);
        usleep(2000);
        assert_false(rx_reactor_help(&rx, bs_now_ns())); /* a stopped loop is never run */
        order_task_t late = {.task.run = order_run};
        assert_false(rx_reactor_post(&rx, &late.task)); /* refused, not sent to libuv */
        assert_false(rx_reactor_run_or_post(&rx, &late.task));
        atomic_store(&stop, 1);
        uv_thread_join(&th);
        /* What ran, ran in order; nothing after the stop ran at all. */
        assert_int_equal(atomic_load(&g_order.bad), 0);
        rx_reactor_fini(&rx);
        free(tasks);
    }
}

/* ---- lifecycle ---- */

static uv_timer_t g_leftover;
static int open_leftover(rx_reactor_t *rx, void *arg)
{
    (void)arg;
    uv_timer_init(&rx->loop, &g_leftover); /* open, inactive, never closed */
    return 0;
}

static void test_lifecycle(void **state)
{
    (void)state;
    rx_reactor_t rx;
    memset(&rx, 0, sizeof(rx));
    /* Never started: every step is a no-op. */
    rx_reactor_close(&rx);
    assert_int_equal(rx_reactor_stop(&rx), 0);
    rx_reactor_fini(&rx);
    /* close, then stop, then stop again. */
    assert_int_equal(rx_reactor_start(&rx, "test-life", NULL, NULL), 0);
    rx_reactor_close(&rx);
    rx_reactor_close(&rx);
    assert_int_equal(rx_reactor_stop(&rx), 0);
    assert_int_equal(rx_reactor_stop(&rx), 0);
    rx_reactor_fini(&rx);
    rx_reactor_fini(&rx);
    /* An owner that leaves a handle open: closed anyway, and reported. */
    assert_int_equal(rx_reactor_start(&rx, "test-leak", NULL, NULL), 0);
    assert_int_equal(rx_reactor_call(&rx, open_leftover, NULL), 0);
    assert_int_equal(rx_reactor_stop(&rx), COH_EINTERNAL);
    assert_non_null(strstr(coh_last_error(), "handles left open"));
    rx_reactor_fini(&rx);
}

/* ---- SIGPIPE on the application's thread ---- */

typedef struct pipe_task {
    rx_task_t task;
    int fd;
    _Atomic int ran;
    int err;
    pthread_t by;
} pipe_task_t;

static void pipe_run(rx_task_t *t, rx_reactor_t *rx)
{
    (void)rx;
    pipe_task_t *pt = (pipe_task_t *)t;
    char b[64] = {0};
    pt->err = write(pt->fd, b, sizeof(b)) < 0 ? errno : 0; /* the peer end is closed */
    pt->by = pthread_self();
    atomic_store(&pt->ran, 1);
}

static void check_no_sigpipe_left(void)
{
    sigset_t pending, mask;
    sigpending(&pending);
    assert_false(sigismember(&pending, SIGPIPE));
    pthread_sigmask(SIG_BLOCK, NULL, &mask);
    assert_false(sigismember(&mask, SIGPIPE)); /* the mask is the application's again */
}

static void test_sigpipe(void **state)
{
    (void)state;
    signal(SIGPIPE, SIG_DFL); /* what a C program has: the signal kills */
    rx_reactor_t rx;
    assert_int_equal(rx_reactor_start(&rx, "test-pipe", NULL, NULL), 0);
    int inline_runs = 0, helped_runs = 0;
    /* Until the write happened on this thread both ways (the loop thread
     * may take a task first; then it proves nothing and we try again). */
    for (int i = 0; i < 200 && (inline_runs < 3 || helped_runs < 3); i++) {
        int sv[2];
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
        close(sv[1]);
        pipe_task_t pt = {.task.run = pipe_run, .fd = sv[0]};
        if (i % 2 == 0) {
            assert_true(rx_reactor_run_or_post(&rx, &pt.task));
            while (!atomic_load(&pt.ran)) usleep(100);
            if (pthread_equal(pt.by, pthread_self())) inline_runs++;
        } else {
            rx_reactor_help_begin(&rx);
            assert_true(rx_reactor_post(&rx, &pt.task));
            while (!atomic_load(&pt.ran)) rx_reactor_help(&rx, bs_now_ns());
            rx_reactor_help_end(&rx, false);
            if (pthread_equal(pt.by, pthread_self())) helped_runs++;
        }
        assert_int_equal(pt.err, EPIPE);
        check_no_sigpipe_left();
        close(sv[0]);
    }
    assert_true(inline_runs >= 3);
    assert_true(helped_runs >= 3);
    assert_int_equal(rx_reactor_stop(&rx), 0);
    rx_reactor_fini(&rx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mpsc_order), cmocka_unit_test(test_run_or_post_order),
        cmocka_unit_test(test_call),       cmocka_unit_test(test_help_races_stop),
        cmocka_unit_test(test_lifecycle),  cmocka_unit_test(test_sigpipe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
