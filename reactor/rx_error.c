/* Status names and messages, the per-thread last error, small utilities. */
#include "reactor/reactor.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <time.h>

static _Thread_local char last_error[512];

/* The handler and its argument change together, rarely: a mutex keeps the
 * pair consistent; the level is read without it to skip formatting. */
static uv_mutex_t log_mu;
static uv_once_t log_once = UV_ONCE_INIT;
static coh_log_fn log_fn;
static void *log_arg;
static _Atomic int log_level = -1;

static void log_init(void)
{
    uv_mutex_init(&log_mu);
}

COH_API void coh_set_log_handler(coh_log_fn fn, void *arg, int max_level)
{
    uv_once(&log_once, log_init);
    uv_mutex_lock(&log_mu);
    log_fn = fn;
    log_arg = arg;
    atomic_store(&log_level, fn ? max_level : -1);
    uv_mutex_unlock(&log_mu);
}

void rx_log(int level, const char *fmt, ...)
{
    if (level > atomic_load_explicit(&log_level, memory_order_relaxed)) return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    uv_once(&log_once, log_init);
    uv_mutex_lock(&log_mu);
    if (log_fn && level <= atomic_load(&log_level)) log_fn(level, msg, log_arg);
    uv_mutex_unlock(&log_mu);
}

int rx_fail(int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof(last_error), fmt, ap);
    va_end(ap);
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

int rx_uv_status(int uverr)
{
    switch (uverr) {
    case 0: return COH_OK;
    case UV_ENOMEM: return COH_ENOMEM;
    case UV_ETIMEDOUT: return COH_ETIMEDOUT;
    case UV_ECANCELED: return COH_ECANCELED;
    case UV_EINVAL: return COH_EINVAL;
    case UV_ECONNRESET:
    case UV_EPIPE:
    case UV_EOF:
    case UV_ECONNREFUSED:
    case UV_ECONNABORTED:
    case UV_EHOSTUNREACH:
    case UV_ENETUNREACH: return COH_EPEER;
    default: return COH_ESYS;
    }
}

uint64_t rx_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

COH_API size_t coh_dtype_size(coh_dtype dtype)
{
    switch (dtype) {
    case COH_F32:
    case COH_I32: return 4;
    case COH_F64:
    case COH_I64: return 8;
    case COH_F16:
    case COH_BF16: return 2;
    case COH_U8: return 1;
    default: return 0;
    }
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
