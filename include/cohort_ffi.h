/*
 * cohort_ffi.h - the language-neutral ABI of cohort: msgpack maps in,
 * msgpack maps out, integer handles in between. Python (ffi/python) and
 * Julia (ffi/julia) drive cohort through these functions only; the schema of
 * every map is documented, with examples, in docs/ffi.md (schema version
 * COH_FFI_SCHEMA, carried as "v" in every response).
 *
 * Conventions:
 *   - Every function returns 0 or a negative coh_status (cohort.h), the same
 *     value as the response's "status". COH_EAGAIN means "not complete yet".
 *   - Responses are msgpack maps allocated by the library: *resp and
 *     *resp_len receive them, release them with coh_ffi_free(). resp may be
 *     NULL when the caller does not want one. A response is always written
 *     when resp is not NULL, except on out-of-memory (then *resp is NULL).
 *   - Handles are opaque non-zero integers checked on every call (a slot
 *     and a generation): a stale, released or made-up handle is refused with
 *     COH_EINVAL and "field": "context" or "request", never a crash.
 *   - Tensors are passed by address ({"addr", "nbytes"}, zero copy: the
 *     memory must stay valid and untouched until the request completes) or
 *     inline as msgpack bin (copied; results come back in the response).
 *   - Thread safety: any thread may call any function; coh_ffi_destroy()
 *     waits for calls that are submitting on the same context to return and
 *     cancels the requests still running.
 */
#ifndef COHORT_FFI_H
#define COHORT_FFI_H

#include <stddef.h>
#include <stdint.h>

#include "cohort.h"

#ifdef __cplusplus
extern "C" {
#endif

#define COH_FFI_SCHEMA 1

/*
 * Create a context from a msgpack config map (len 0: defaults and the
 * environment). Keys are the field names of coh_config_t plus "log_level".
 * Blocks until every rank has joined (coh_init). On success *ctx is the
 * context's handle and the response holds "context", "rank", "size",
 * "nrails", "describe", "version" and "schema".
 */
COH_API int coh_ffi_create(const void *config, size_t len, uint64_t *ctx, void **resp,
                           size_t *resp_len);

/*
 * Decode and run one request map ("type": allreduce, broadcast, allgather,
 * reduce_scatter, barrier, sync, info, stats, event_clear, logs). A
 * collective with "async": true returns at once with a "request" handle for
 * coh_ffi_wait / coh_ffi_test; otherwise the call waits up to "timeout_ms"
 * (-1: forever) and answers with the completion, or with COH_EAGAIN and a
 * "request" handle when the time ran out. Malformed requests are answered
 * with an error whose "field" and "error" name the offending field.
 */
COH_API int coh_ffi_call(uint64_t ctx, const void *request, size_t len, void **resp,
                         size_t *resp_len);

/*
 * Wait up to timeout_ms (-1: forever) for a request. Once a completion has
 * been answered the request handle is released (a later use is COH_EINVAL);
 * COH_EAGAIN answers keep it.
 */
COH_API int coh_ffi_wait(uint64_t ctx, uint64_t request, int timeout_ms, void **resp,
                         size_t *resp_len);
/* Like coh_ffi_wait with a timeout of 0: COH_EAGAIN and "done": false while
 * the request runs. */
COH_API int coh_ffi_test(uint64_t ctx, uint64_t request, void **resp, size_t *resp_len);

/* A descriptor that becomes readable when any request of the context
 * completes (coh_ctx_event_fd): for asyncio, libuv, epoll. Reset it with an
 * "event_clear" request (or by reading 8 bytes from it), then test. Owned by
 * the context: do not close it. */
COH_API int coh_ffi_event_fd(uint64_t ctx, int *fd);

/* Finalize the context (requests still running complete with
 * COH_ECANCELED) and release its handle and every request handle. */
COH_API int coh_ffi_destroy(uint64_t ctx, void **resp, size_t *resp_len);

/* Release a response. NULL is ignored. */
COH_API void coh_ffi_free(void *resp);

#ifdef __cplusplus
}
#endif
#endif /* COHORT_FFI_H */
