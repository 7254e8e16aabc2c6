/*
 * base.h - the bottom layer every folder may use.
 *
 * base/ owns what has no place higher up: the one allocator (bs_alloc.h),
 * status names and messages, the per-thread last error, the log handler,
 * dtype and reduction-op tables, the monotonic clock, size parsing, the
 * signature hash, and SIGPIPE held around socket writes. It depends on
 * nothing of cohort but the public header and on no library but libc (and
 * mimalloc, through bs_alloc.h): sched/ and gpu/ build on it without seeing
 * libuv.
 */
#ifndef COH_BASE_H
#define COH_BASE_H

#include <stdint.h>
#include <string.h>

#include "base/bs_alloc.h"
#include "cohort.h"

#define BS_ERR_LEN 256 /* error texts kept on requests and ops */

/* Record a detail for coh_last_error() on this thread and return status. */
int bs_fail(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Propagate a negative status; CHECK_GOTO jumps to a cleanup label. */
#define BS_CHECK(expr)                                                                             \
    do {                                                                                           \
        int bs__s = (expr);                                                                        \
        if (bs__s < 0) return bs__s;                                                               \
    } while (0)
#define BS_CHECK_GOTO(expr, st, label)                                                             \
    do {                                                                                           \
        (st) = (expr);                                                                             \
        if ((st) < 0) goto label;                                                                  \
    } while (0)

/* Hand a message to the application's log handler, if any (any thread). */
void bs_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

uint64_t bs_now_ns(void); /* monotonic */

/* Any thread: block SIGPIPE while this thread may write(2) to a socket
 * (nested); release takes a SIGPIPE raised meanwhile off the thread's
 * pending set, so it never reaches the application. A thread that blocks
 * every signal for good says so once (bs_sigpipe_blocked): its holds cost
 * nothing. */
void bs_sigpipe_hold(void);
void bs_sigpipe_release(void);
void bs_sigpipe_blocked(void);
/* Instead of release: keep the hold until bs_sigpipe_settle, for writes
 * left queued that the rest of a loop pass may flush with write(2). */
void bs_sigpipe_keep(void);
void bs_sigpipe_settle(void);

/* FNV-1a over the 8 bytes of v: op signatures every rank computes alike. */
#define BS_FNV_SEED 1469598103934665603ull
static inline uint64_t bs_fnv64(uint64_t h, uint64_t v)
{
    for (int i = 0; i < 8; i++) h = (h ^ ((v >> (8 * i)) & 0xff)) * 1099511628211ull;
    return h;
}

/* Copy src into dst[cap], cut to fit, always terminated: per-op strings,
 * where snprintf's formatting machinery showed in small ops' profiles. */
static inline void bs_strcpy(char *dst, size_t cap, const char *src)
{
    if (!cap) return;
    size_t n = strnlen(src, cap - 1);
    memcpy(dst, src, n);
    dst[n] = 0;
}

/* An integer or a size with an optional K/M/G suffix (powers of 2), digits
 * first. 0, or -1 when s is not one. */
int bs_parse_size(const char *s, uint64_t *out);

/* A status for a negative errno value (as libuv reports them too). */
int bs_errno_status(int neg_errno);

#endif
