/* Status names and messages, the per-thread last error, the log handler,
 * dtype and op names, the clock, size parsing. */
#include "base/base.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <time.h>

static _Thread_local char last_error[512];

/* The handler and its argument change together, rarely: a mutex keeps the
 * pair consistent; the level is read without it to skip formatting. */
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static coh_log_fn log_fn;
static void *log_arg;
static _Atomic int log_level = -1;

COH_API void coh_set_log_handler(coh_log_fn fn, void *arg, int max_level)
{
    pthread_mutex_lock(&log_mu);
    log_fn = fn;
    log_arg = arg;
    atomic_store(&log_level, fn ? max_level : -1);
    pthread_mutex_unlock(&log_mu);
}

void bs_log(int level, const char *fmt, ...)
{
    if (level > atomic_load_explicit(&log_level, memory_order_relaxed)) return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&log_mu);
    if (log_fn && level <= atomic_load(&log_level)) log_fn(level, msg, log_arg);
    pthread_mutex_unlock(&log_mu);
}

int bs_fail(int status, const char *fmt, ...)
{
    /* Formatted aside first: callers wrap the last error in a new one
     * (bs_fail(st, "%s: %s", fn, coh_last_error())), and printing a buffer
     * into itself garbled the text ("coh_allreduce: =5003, f64, sum)"). */
    char text[sizeof(last_error)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    memcpy(last_error, text, sizeof(text));
    return status;
}

COH_API const char *coh_last_error(void)
{
    return last_error;
}

COH_API const char *coh_status_name(int status)
{
    switch (status) {
#define COH__NAME(name, value, msg)                                                                \
    case value: return #name;
        COH_STATUS_MAP(COH__NAME)
#undef COH__NAME
    default: return "UNKNOWN";
    }
}

COH_API const char *coh_strerror(int status)
{
    switch (status) {
#define COH__MSG(name, value, msg)                                                                 \
    case value: return msg;
        COH_STATUS_MAP(COH__MSG)
#undef COH__MSG
    default: return "unknown status";
    }
}

int bs_errno_status(int e)
{
    switch (-e) {
    case 0: return COH_OK;
    case ENOMEM:
    case ENOBUFS: return COH_ENOMEM;
    case ETIMEDOUT: return COH_ETIMEDOUT;
    case ECANCELED: return COH_ECANCELED;
    case EINVAL: return COH_EINVAL;
    case ECONNRESET:
    case EPIPE:
    case ECONNREFUSED:
    case ECONNABORTED:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case ENETDOWN:
    case ENOTCONN:
    case 4095: /* libuv's UV_EOF: the peer closed */ return COH_EPEER;
    default: return COH_ESYS;
    }
}

uint64_t bs_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int bs_parse_size(const char *s, uint64_t *out)
{
    /* strtoull would skip blanks and accept a sign (" -5" is 2^64 - 5): digits first. */
    if (!s || *s < '0' || *s > '9') return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s) return -1;
    uint64_t mul = 1;
    switch (*end) {
    case 'k':
    case 'K': mul = 1ull << 10; break;
    case 'm':
    case 'M': mul = 1ull << 20; break;
    case 'g':
    case 'G': mul = 1ull << 30; break;
    default: break;
    }
    if (mul > 1) end++;
    if (*end == 'B' || *end == 'b') end++;
    if (*end) return -1;
    if (v > UINT64_MAX / mul) return -1;
    *out = v * mul;
    return 0;
}

/* ---- dtypes and ops ---- */

COH_API size_t coh_dtype_size(coh_dtype dtype)
{
    static const size_t sizes[COH_DTYPE_COUNT] = {
        [COH_F32] = 4, [COH_F64] = 8, [COH_F16] = 2, [COH_BF16] = 2,
        [COH_I32] = 4, [COH_I64] = 8, [COH_U8] = 1,
    };
    return (unsigned)dtype < COH_DTYPE_COUNT ? sizes[dtype] : 0;
}

COH_API const char *coh_dtype_name(coh_dtype dtype)
{
    static const char *names[] = {"f32", "f64", "f16", "bf16", "i32", "i64", "u8"};
    return (unsigned)dtype < COH_DTYPE_COUNT ? names[dtype] : "?";
}

COH_API const char *coh_redop_name(coh_redop op)
{
    static const char *names[] = {"sum", "avg", "min", "max", "prod"};
    return (unsigned)op < COH_REDOP_COUNT ? names[op] : "?";
}

/*
 * SIGPIPE on threads that are not ours. A write to a peer that just died
 * raises SIGPIPE on the writing thread, and libuv writes with write(2), not
 * send(MSG_NOSIGNAL). Loop threads block every signal; an application thread
 * that runs loop code (a waiter helping, a small op started inline) blocks
 * SIGPIPE while it may write, then takes any SIGPIPE it raised off its
 * pending set before the application's mask comes back: the write has
 * already seen EPIPE, and the signal must not kill (or reach) the host
 * process. Nested: only the outermost hold does the work.
 */
static _Thread_local int pipe_depth, pipe_kept;
static _Thread_local bool pipe_owned, pipe_blocked;
static _Thread_local sigset_t pipe_old;

void bs_sigpipe_blocked(void)
{
    pipe_blocked = true;
}

void bs_sigpipe_hold(void)
{
    if (pipe_blocked || pipe_depth++ > 0) return;
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &s, &pipe_old);
    pipe_owned = !sigismember(&pipe_old, SIGPIPE);
}

void bs_sigpipe_release(void)
{
    if (pipe_blocked || --pipe_depth > 0 || !pipe_owned) return;
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGPIPE);
    struct timespec zero = {0, 0};
    while (sigtimedwait(&s, NULL, &zero) == SIGPIPE) {
    }
    pthread_sigmask(SIG_SETMASK, &pipe_old, NULL);
    pipe_owned = false;
}

void bs_sigpipe_keep(void)
{
    if (!pipe_blocked) pipe_kept++;
}

void bs_sigpipe_settle(void)
{
    for (; pipe_kept > 0; pipe_kept--) bs_sigpipe_release();
}
