/*
 * gpu-lockprobe RUNTIME: which calls of the device interface another thread
 * can make while a stream is held (a wait_value on a flag nobody has set
 * yet) and something waits behind it. That is the situation of cohort's
 * GPU reactor while a caller's stream waits for an op
 * (coh_request_stream_wait): a call that blocks there deadlocks, since the
 * op cannot complete. Not a test (its answer is the driver's): a table for
 * docs/gpu.md, one row per call, one column per way of waiting:
 *
 *   copy   the main thread in a copy to pageable memory on the held stream
 *   sync   the main thread in stream_sync of the held stream
 *   hostfn the held stream runs a host function that waits for the flag
 *          (what coh_request_stream_wait did before)
 *   none   nothing held: the call's own time, to tell a slow call from one
 *          that waited
 *
 * A helper thread makes the call, then sets the flag; a watchdog sets it
 * after 1.5 s if the helper has not: "blocked" then means the call waited
 * for the flag. The ipc_open and ipc_close rows map allocations of a child
 * process (forked before the device is touched: CUDA does not survive a
 * fork), since a process cannot open its own handles.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpu/gpu.h"
#include "gpu/gpu_dev.h"

static const gpu_dev_t *D;
static volatile uint32_t *flag;
static _Atomic int helper_done, released_by_watchdog;
static double call_s; /* the helper's call, start to end */
static void *other_stream, *dbuf, *dsrc, *pinned, *spare_ev;
static int action;
/* The child's allocations: one fresh handle per ipc_open cell, one opened
 * in set-up per ipc_close cell. */
#define NCHILD 8
static gpu_ipc_t child_h[NCHILD];
static int child_next;
static void *opened; /* ipc_close's mapping */
static volatile uint32_t *flag2;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static const char *const NAMES[] = {
    "event_new",   "event_record", "event_query", "event_free", "stream_new",  "stream_free",
    "copy_pinned", "reduce",       "dev_alloc",   "dev_free",   "host_alloc",  "host_free",
    "ipc_get",     "ipc_open",     "ipc_close",   "wait_value", "stream_wait", "host_fn"};
#define NACTIONS ((int)(sizeof(NAMES) / sizeof(NAMES[0])))

static void noop_fn(void *arg)
{
    (void)arg;
}

static void do_action(int a)
{
    void *p = NULL;
    gpu_ipc_t h;
    switch (a) {
    case 0:
        if (D->event_new(&p) == 0) D->event_free(p); /* the free runs after the flag */
        break;
    case 1: D->event_record(spare_ev, other_stream); break;
    case 2: D->event_query(spare_ev); break;
    case 3:
        D->event_free(spare_ev);
        spare_ev = NULL;
        break;
    case 4: D->stream_new(&p); break; /* kept: freeing it is row 5 */
    case 5: D->stream_free(other_stream), other_stream = NULL; break;
    case 6: D->copy(dbuf, pinned, 4096, other_stream); break;
    case 7: D->reduce(COH_F32, COH_SUM, dbuf, dbuf, dbuf, 1024, other_stream); break;
    case 8: D->dev_alloc(&p, 1 << 20); break;
    case 9: D->dev_free(dbuf), dbuf = NULL; break;
    case 10: D->host_alloc(&p, 1 << 20); break;
    case 11: D->host_free(pinned), pinned = NULL; break;
    case 12: D->ipc_get(dbuf, &h); break;
    case 13:
        if (D->ipc_open(&child_h[child_next++], &p) == 0) D->ipc_close(p); /* after the flag */
        break;
    case 14: D->ipc_close(opened), opened = NULL; break;
    case 15: D->wait_value(other_stream, flag2, 0); break;
    case 16: D->stream_wait(other_stream, spare_ev); break;
    case 17: D->host_fn(other_stream, noop_fn, NULL); break;
    }
}

static void release(void)
{
    __atomic_store_n(flag, 1, __ATOMIC_RELEASE);
}

static void *helper(void *arg)
{
    (void)arg;
    usleep(30000); /* the main thread is in its wait by now */
    double t = now_s();
    do_action(action);
    call_s = now_s() - t;
    atomic_store(&helper_done, 1);
    release();
    return NULL;
}

static void *watchdog(void *arg)
{
    (void)arg;
    double t0 = now_s();
    while (!atomic_load(&helper_done) && now_s() - t0 < 1.5) usleep(1000);
    if (!atomic_load(&helper_done)) {
        atomic_store(&released_by_watchdog, 1);
        release();
    }
    return NULL;
}

static void hold_fn(void *arg)
{
    (void)arg;
    while (__atomic_load_n(flag, __ATOMIC_ACQUIRE) < 1) usleep(100);
}

/* One cell: 0 the call went through, 1 it waited for the flag (call_s:
 * how long it took). */
static int cell(int how, int a)
{
    void *s;
    if (D->stream_new(&s) < 0 || D->stream_new(&other_stream) < 0 ||
        D->dev_alloc(&dbuf, 1 << 20) < 0 || D->dev_alloc(&dsrc, 1 << 16) < 0 ||
        D->host_alloc(&pinned, 1 << 20) < 0 || D->event_new(&spare_ev) < 0) {
        fprintf(stderr, "set-up: %s\n", D->last_error());
        exit(1);
    }
    memset(pinned, 0, 1 << 20);
    if (a == 14 && D->ipc_open(&child_h[child_next++], &opened) < 0) {
        fprintf(stderr, "set-up: ipc_open: %s\n", D->last_error());
        exit(1);
    }
    *flag = 0;
    atomic_store(&helper_done, 0);
    atomic_store(&released_by_watchdog, 0);
    action = a;
    if (how == 3) *flag = 1; /* nothing held */
    int st = how == 2 ? D->host_fn(s, hold_fn, NULL) : D->wait_value(s, flag, 1);
    if (st < 0) {
        fprintf(stderr, "hold: %s\n", D->last_error());
        exit(1);
    }
    pthread_t th, tw;
    pthread_create(&th, NULL, helper, NULL);
    pthread_create(&tw, NULL, watchdog, NULL);
    char *page = malloc(1 << 16);
    if (how == 0) D->copy(page, dsrc, 1 << 16, s);
    if (how == 1) D->stream_sync(s);
    pthread_join(tw, NULL);
    pthread_join(th, NULL);
    D->stream_sync(s);
    free(page);
    D->stream_free(s);
    if (other_stream) D->stream_free(other_stream);
    if (dbuf) D->dev_free(dbuf);
    D->dev_free(dsrc);
    if (pinned) D->host_free(pinned);
    if (spare_ev) D->event_free(spare_ev);
    if (opened) D->ipc_close(opened), opened = NULL;
    return atomic_load(&released_by_watchdog);
}

/* The child: NCHILD allocations, their handles down the pipe, then it
 * waits for the parent to close its end. */
static void child_main(const char *mode, int wr, int done_rd)
{
    const char *why = "";
    const gpu_dev_t *d = gpu_dev_pick(mode, &why);
    gpu_ipc_t h[NCHILD];
    memset(h, 0, sizeof(h));
    for (int i = 0; d && i < NCHILD; i++) {
        void *p;
        if (d->dev_alloc(&p, 1 << 20) < 0 || d->ipc_get(p, &h[i]) < 0) break;
    }
    if (write(wr, h, sizeof(h)) != (ssize_t)sizeof(h)) _exit(1);
    char c;
    while (read(done_rd, &c, 1) > 0) {
    }
    _exit(0);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "cuda";
    int hp[2], dp[2];
    if (pipe(hp) != 0 || pipe(dp) != 0) return 1;
    pid_t kid = fork();
    if (kid == 0) {
        close(hp[0]);
        close(dp[1]);
        child_main(mode, hp[1], dp[0]);
    }
    close(hp[1]);
    close(dp[0]);
    const char *why = "";
    D = gpu_dev_pick(mode, &why);
    if (!D) {
        printf("SKIP: %s\n", why);
        close(dp[1]);
        waitpid(kid, NULL, 0);
        return 77;
    }
    if (read(hp[0], child_h, sizeof(child_h)) != (ssize_t)sizeof(child_h) ||
        !child_h[NCHILD - 1].size) {
        fprintf(stderr, "the child's allocations failed\n");
        return 1;
    }
    void *f;
    if (D->host_alloc(&f, 64) < 0) return 1;
    flag = f;
    if (D->host_alloc(&f, 64) < 0) return 1;
    flag2 = f;
    *flag2 = 0;
    printf("# %s: may another thread make the call while a stream is held?\n", D->name);
    printf("# each cell: ok or BLOCKED, and how long the call took (ms)\n");
    printf("%-14s %-16s %-16s %-16s %-16s\n", "call", "copy", "sync", "hostfn", "none");
    for (int a = 0; a < NACTIONS; a++) {
        printf("%-14s", NAMES[a]);
        for (int how = 0; how < 4; how++) {
            char c[32];
            int b = cell(how, a);
            snprintf(c, sizeof(c), "%s %.1f", b ? "BLOCKED" : "ok", call_s * 1e3);
            printf(" %-16s", c);
        }
        printf("\n");
        fflush(stdout);
    }
    close(dp[1]);
    waitpid(kid, NULL, 0);
    return 0;
}
