/*
 * ffi.h - the msgpack ABI (internal).
 *
 * ffi/ owns: the codec that turns msgpack config and request maps into plain
 * structs and answers into msgpack response maps (ff_codec.c, on top of
 * msgpack-c: nothing is hand-parsed; ff_mp.c only bounds container sizes
 * before msgpack-c allocates for them), the handle tables that make the
 * integer handles of include/cohort_ffi.h safe to misuse, and the ABI entry
 * points themselves (ff_abi.c). The language packages live in ffi/python and
 * ffi/julia; the schema is documented in docs/ffi.md.
 *
 * The codec is pure (no context, no I/O) so that it can be unit-tested and
 * fuzzed on its own (tests/unit/test_ffi.c, fuzz/ffi_request_fuzzer.c).
 */
#ifndef COH_FFI_H
#define COH_FFI_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cohort.h"

#define FF_SCHEMA      1           /* "v" of requests and responses */
#define FF_MAX_REQUEST (64u << 20) /* bytes of one request or config map */
#define FF_MAX_ITEMS   1024        /* msgpack items in one request (bins count as one) */
#define FF_MAX_DEPTH   8           /* nesting of maps and arrays */
#define FF_MAX_STR     4096        /* bytes of one string value */
#define FF_FIELD_MAX   48
#define FF_MSG_MAX     384

/* An error answer: status, the field it concerns ("" for the whole request),
 * and a message that names that field. */
typedef struct ff_err {
    int status;
    char field[FF_FIELD_MAX];
    char msg[FF_MSG_MAX];
} ff_err_t;

/* Record an error (the first one wins) and return its status. */
int ff_fail(ff_err_t *e, int status, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* ---- msgpack helpers (ff_mp.c) ---- */

/* Check that buf[0, len) is exactly one msgpack object of at most
 * FF_MAX_ITEMS items and FF_MAX_DEPTH levels whose containers declare no
 * more elements than there are bytes left. what names it in errors
 * ("request", "config"). Then msgpack-c may unpack it without allocating
 * for elements that are not there. */
int ff_mp_bounds(const void *buf, size_t len, const char *what, ff_err_t *err);
/* "integer", "string", ... for error messages. */
const char *ff_mp_type_name(const msgpack_object *o);

/* A growable output buffer on the library's allocator, and a packer that
 * writes into it. ok turns false on the first allocation failure. */
typedef struct ff_out {
    char *data;
    size_t len, cap;
    bool ok;
} ff_out_t;
void ff_out_init(ff_out_t *o, msgpack_packer *pk);
void ff_out_fini(ff_out_t *o);
void ff_pack_str(msgpack_packer *pk, const char *s);
void ff_pack_kv_str(msgpack_packer *pk, const char *k, const char *v);
void ff_pack_kv_int(msgpack_packer *pk, const char *k, int64_t v);
void ff_pack_kv_uint(msgpack_packer *pk, const char *k, uint64_t v);
void ff_pack_kv_double(msgpack_packer *pk, const char *k, double v);
void ff_pack_kv_bool(msgpack_packer *pk, const char *k, bool v);

/* ---- requests (ff_codec.c) ---- */

typedef enum ff_type {
    FF_ALLREDUCE = 0,
    FF_BROADCAST,
    FF_ALLGATHER,
    FF_REDUCE_SCATTER,
    FF_BARRIER,
    FF_SYNC,
    FF_INFO,         /* rank, size, rails, describe line, versions */
    FF_STATS,        /* coh_ctx_stats */
    FF_EVENT_CLEAR,  /* coh_ctx_event_clear */
    FF_LOGS,         /* drain the messages captured by the config's log_level */
    FF_SYNC_LEAVE,   /* coh_sync_leave: this rank stops synchronising */
    FF_LB_TABLE,     /* coh_lb_table: the rail balancer's newest table, as text */
    FF_FAILED_RANKS, /* coh_comm_failed_ranks of the world */
    FF_PROBE,        /* coh_probe: every link's latency and rate (collective) */
    FF_STREAM_WAIT,  /* coh_request_stream_wait: a device stream waits for a request */
    FF_TYPE_COUNT
} ff_type;
const char *ff_type_name(ff_type t);

/* Partial-synchronisation modes of a sync request (the names of the C API's
 * coh_sync_mode; "default" is the context's sync_mode). */
typedef enum ff_sync_mode {
    FF_SYNC_DEFAULT = 0, /* the context's configured mode */
    FF_SYNC_ALLREDUCE,   /* every live rank (a weighted average of all) */
    FF_SYNC_PARTIAL,     /* the first p ready ranks (FIFO) */
    FF_SYNC_SELECTIVE,   /* groups by bandwidth (BAG) and predicted progress (BPAWR) */
    FF_SYNC_RELAY,       /* every live rank, late ones relaying (AdapCC) */
    FF_SYNC_MODE_COUNT
} ff_sync_mode;
const char *ff_sync_mode_name(ff_sync_mode m);

/* Algorithms of an allreduce request (coh_allreduce_ex's coh_allreduce_algo). */
typedef enum ff_algo {
    FF_ALGO_DEFAULT = 0, /* coh_allreduce */
    FF_ALGO_RELAY,       /* a relay group: coordinator-driven, late ranks relay */
    FF_ALGO_COUNT
} ff_algo;
const char *ff_algo_name(ff_algo a);

/* The three tensor fields. buf: in place; send/recv: out of place. */
enum { FF_T_BUF = 0, FF_T_SEND, FF_T_RECV, FF_NTENSORS };
extern const char *const ff_tensor_names[FF_NTENSORS];

typedef enum ff_tkind {
    FF_TENSOR_NONE = 0,
    FF_TENSOR_ADDR,   /* {"addr": u64, "nbytes": u64}: zero copy, the caller's memory */
    FF_TENSOR_INLINE, /* msgpack bin: copied in, results sent back in the response */
} ff_tkind;

typedef struct ff_tensor {
    ff_tkind kind;
    uint64_t addr;    /* ADDR */
    const void *data; /* INLINE: points into the request bytes */
    uint64_t nbytes;
} ff_tensor_t;

/* A decoded request. Strings and inline data point into the request bytes,
 * which must outlive it. */
typedef struct ff_req {
    ff_type type;
    uint32_t seen; /* FF_F_* bits of the fields present */
    int64_t id;    /* echoed back */
    bool async;
    int timeout_ms;
    coh_dtype dtype;
    coh_redop op;
    int root;
    uint64_t count;
    ff_tensor_t t[FF_NTENSORS];
    int64_t iteration;
    double weight;
    ff_sync_mode mode;
    ff_algo algo;
    double loss_bound, pull_loss_bound; /* allreduce: coh_allreduce_opts_t's */
    int layer, nlayers;
    int mem;          /* coh_mem: where addr tensors live (inline ones are host) */
    uint64_t stream;  /* the cudaStream_t the op follows (stream_wait: that waits) */
    uint64_t request; /* stream_wait: the request handle */
} ff_req_t;

/* Field bits of ff_req_t.seen. */
enum {
    FF_F_V = 1u << 0,
    FF_F_TYPE = 1u << 1,
    FF_F_ID = 1u << 2,
    FF_F_ASYNC = 1u << 3,
    FF_F_TIMEOUT = 1u << 4,
    FF_F_DTYPE = 1u << 5,
    FF_F_OP = 1u << 6,
    FF_F_ROOT = 1u << 7,
    FF_F_COUNT = 1u << 8,
    FF_F_BUF = 1u << 9,
    FF_F_SEND = 1u << 10,
    FF_F_RECV = 1u << 11,
    FF_F_ITERATION = 1u << 12,
    FF_F_WEIGHT = 1u << 13,
    FF_F_MODE = 1u << 14,
    FF_F_ALGO = 1u << 15,
    FF_F_LOSS = 1u << 16,
    FF_F_PULL_LOSS = 1u << 17,
    FF_F_LAYER = 1u << 18,
    FF_F_NLAYERS = 1u << 19,
    FF_F_MEM = 1u << 20,
    FF_F_STREAM = 1u << 21,
    FF_F_REQUEST = 1u << 22,
};

/* Decode a request map. Returns 0, or a negative status with err filled
 * (err->field names the offending field). On failure req->seen/id still say
 * whether an id was read, so the error answer can echo it. */
int ff_decode_request(const void *buf, size_t len, ff_req_t *req, ff_err_t *err);

/* What a collective needs once the communicator's size is known. */
typedef struct ff_shape {
    size_t count;               /* the C API's count (allgather: per rank; reduce_scatter:
                                   recvcount) */
    size_t nbytes[FF_NTENSORS]; /* bytes each tensor holds (0 when not used) */
    bool alloc_recv;            /* recv absent: the ABI allocates it and returns it inline */
} ff_shape_t;

/* Check the tensors against each other, the dtype and the communicator's
 * size; derive count when absent and check it when present. */
int ff_resolve(const ff_req_t *req, int comm_size, ff_shape_t *shape, ff_err_t *err);

/* ---- config (ff_codec.c) ---- */

#define FF_CFG_MAX 128 /* knobs of reactor/rx_config.h (64 in 2026-11), with room to grow */

typedef struct ff_config {
    coh_config_t cfg;        /* string fields point at the copies below */
    char *owned[FF_CFG_MAX]; /* by knob index: copies of string values */
    int log_level;           /* -2: not given (leave the log handler alone); -1: "off" */
} ff_config_t;

/* Fill the defaults and the environment (coh_config_init), then apply the
 * map. Every coh_config_t field can be set by its name: the fields, their
 * kinds and bounds are the knob table's (reactor/rx_config.h), plus
 * "log_level" and "v". */
int ff_decode_config(const void *buf, size_t len, ff_config_t *c, ff_err_t *err);
void ff_config_fini(ff_config_t *c);

/* ---- responses (ff_codec.c) ---- */

/* The common head of every response: "v", "status", "code", and, on
 * failure, "error" and "field"; then "type" and "id" when known. extra is
 * the number of key/value pairs the caller packs after it. */
void ff_pack_head(msgpack_packer *pk, int status, const ff_err_t *err, int type, bool has_id,
                  int64_t id, uint32_t extra);
/* A whole error response. */
int ff_error_response(const ff_err_t *err, int type, bool has_id, int64_t id, void **resp,
                      size_t *resp_len);
/* Find an integer "id" in a request map that failed to decode (best effort). */
bool ff_peek_id(const void *buf, size_t len, int64_t *id);

/* ---- ABI internals (ff_abi.c) ---- */

/* The world communicator behind a context handle, for benchmarks and tests
 * that compare the ABI with the C API on the same context. */
int ff_world_of(uint64_t ctx, coh_comm_t **world);

#endif
