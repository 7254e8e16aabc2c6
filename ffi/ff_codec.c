/*
 * The request codec: msgpack config and request maps into plain structs
 * (decoded by msgpack-c, checked field by field here), and the common head of
 * every response. Pure: no context, no I/O, no global state.
 *
 * Every refusal names its field: "field 'dtype': expected a string, got an
 * integer". Text taken from the request (unknown keys, bad names) is echoed
 * only after non-printable bytes are replaced, so that the answer is always
 * valid UTF-8.
 */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ffi/ffi.h"
#include "reactor/reactor.h"
#include "reactor/rx_config.h"

const char *const ff_tensor_names[FF_NTENSORS] = {"buf", "send", "recv"};

static const char *const type_names[FF_TYPE_COUNT] = {
    "allreduce",  "broadcast", "allgather",    "reduce_scatter", "barrier",
    "sync",       "info",      "stats",        "event_clear",    "logs",
    "sync_leave", "lb_table",  "failed_ranks", "probe",          "stream_wait"};

const char *ff_type_name(ff_type t)
{
    return (unsigned)t < FF_TYPE_COUNT ? type_names[t] : "?";
}

static const char *const mode_names[FF_SYNC_MODE_COUNT] = {"default", "allreduce", "partial",
                                                           "selective", "relay"};

const char *ff_sync_mode_name(ff_sync_mode m)
{
    return (unsigned)m < FF_SYNC_MODE_COUNT ? mode_names[m] : "?";
}

static const char *const algo_names[FF_ALGO_COUNT] = {"default", "relay"};

/* coh_mem's values, by index. */
static const char *const mem_names[] = {"auto", "host", "device"};
_Static_assert(COH_MEM_AUTO == 0 && COH_MEM_HOST == 1 && COH_MEM_DEVICE == 2,
               "mem_names follows coh_mem");

const char *ff_algo_name(ff_algo a)
{
    return (unsigned)a < FF_ALGO_COUNT ? algo_names[a] : "?";
}

/* ---- reading values ---- */

/* Copy up to 40 bytes of s as printable ASCII for an error message. */
static void printable(const char *s, size_t n, char *out, size_t cap)
{
    size_t k = 0;
    for (size_t i = 0; i < n && k + 4 < cap; i++) {
        if (i == 40) {
            memcpy(out + k, "...", 3);
            k += 3;
            break;
        }
        unsigned char c = (unsigned char)s[i];
        out[k++] = (c >= 0x20 && c < 0x7f && c != '\'') ? (char)c : '?';
    }
    out[k] = '\0';
}

static bool str_is(const msgpack_object *o, const char *s)
{
    size_t n = strlen(s);
    return o->type == MSGPACK_OBJECT_STR && o->via.str.size == n &&
           memcmp(o->via.str.ptr, s, n) == 0;
}

static int want(const msgpack_object *o, const char *field, const char *what, ff_err_t *e)
{
    return ff_fail(e, COH_EINVAL, field, "field '%s': expected %s, got %s", field, what,
                   ff_mp_type_name(o));
}

static int get_bool(const msgpack_object *o, const char *f, bool *out, ff_err_t *e)
{
    if (o->type != MSGPACK_OBJECT_BOOLEAN) return want(o, f, "a boolean", e);
    *out = o->via.boolean;
    return 0;
}

static int get_int(const msgpack_object *o, const char *f, int64_t lo, int64_t hi, int64_t *out,
                   ff_err_t *e)
{
    int64_t v;
    *out = 0; /* written on every path, as every getter here */
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        if (o->via.u64 > (uint64_t)INT64_MAX) goto range;
        v = (int64_t)o->via.u64;
    } else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        v = o->via.i64;
    } else {
        return want(o, f, "an integer", e);
    }
    if (v < lo || v > hi) goto range;
    *out = v;
    return 0;
range:
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
        return ff_fail(e, COH_EINVAL, f, "field '%s': %lld is outside [%lld, %lld]", f,
                       (long long)o->via.i64, (long long)lo, (long long)hi);
    return ff_fail(e, COH_EINVAL, f, "field '%s': %llu is outside [%lld, %lld]", f,
                   (unsigned long long)o->via.u64, (long long)lo, (long long)hi);
}

static int get_u64(const msgpack_object *o, const char *f, uint64_t *out, ff_err_t *e)
{
    *out = 0;
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
        return ff_fail(e, COH_EINVAL, f, "field '%s': %lld is negative", f, (long long)o->via.i64);
    if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER) return want(o, f, "a non-negative integer", e);
    *out = o->via.u64;
    return 0;
}

static int get_double(const msgpack_object *o, const char *f, double *out, ff_err_t *e)
{
    *out = 0;
    switch (o->type) {
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: *out = o->via.f64; break;
    case MSGPACK_OBJECT_POSITIVE_INTEGER: *out = (double)o->via.u64; break;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: *out = (double)o->via.i64; break;
    default: return want(o, f, "a number", e);
    }
    if (!isfinite(*out)) return ff_fail(e, COH_EINVAL, f, "field '%s': not a finite number", f);
    return 0;
}

/* A string value copied into out (NUL-terminated). */
static int get_str(const msgpack_object *o, const char *f, char *out, size_t cap, ff_err_t *e)
{
    if (o->type != MSGPACK_OBJECT_STR) return want(o, f, "a string", e);
    if (o->via.str.size >= cap)
        return ff_fail(e, COH_EINVAL, f, "field '%s': %u bytes is longer than the limit of %zu", f,
                       o->via.str.size, cap - 1);
    if (memchr(o->via.str.ptr, '\0', o->via.str.size))
        return ff_fail(e, COH_EINVAL, f, "field '%s': contains a NUL byte", f);
    memcpy(out, o->via.str.ptr, o->via.str.size);
    out[o->via.str.size] = '\0';
    return 0;
}

/* A string that must be one of names[0..n) (or an alias). */
static int get_enum(const msgpack_object *o, const char *f, const char *const *names, int n,
                    int *out, ff_err_t *e)
{
    *out = -1; /* written on every path: callers read it only on success */
    if (o->type != MSGPACK_OBJECT_STR) return want(o, f, "a string", e);
    for (int i = 0; i < n; i++)
        if (names[i] && str_is(o, names[i])) {
            *out = i;
            return 0;
        }
    char shown[64], list[256] = "";
    printable(o->via.str.ptr, o->via.str.size, shown, sizeof(shown));
    size_t k = 0;
    for (int i = 0; i < n && k < sizeof(list); i++)
        if (names[i])
            k += (size_t)snprintf(list + k, sizeof(list) - k, "%s%s", k ? ", " : "", names[i]);
    return ff_fail(e, COH_EINVAL, f, "field '%s': unknown value '%s' (one of %s)", f, shown, list);
}

/* dtype names: cohort's, then numpy's. */
static const char *const dtype_names[] = {"f32",      "f64",   "f16",     "bf16",    "i32",
                                          "i64",      "u8",    "float32", "float64", "float16",
                                          "bfloat16", "int32", "int64",   "uint8"};
static int get_dtype(const msgpack_object *o, const char *f, coh_dtype *out, ff_err_t *e)
{
    int i;
    int n = (int)(sizeof(dtype_names) / sizeof(dtype_names[0]));
    if (get_enum(o, f, dtype_names, n, &i, e) < 0) return e->status;
    *out = (coh_dtype)(i % COH_DTYPE_COUNT);
    return 0;
}

static const char *const redop_names[COH_REDOP_COUNT] = {"sum", "avg", "min", "max", "prod"};

static int get_tensor(const msgpack_object *o, const char *f, const void *buf, size_t len,
                      ff_tensor_t *t, ff_err_t *e)
{
    memset(t, 0, sizeof(*t));
    if (o->type == MSGPACK_OBJECT_BIN) {
        const char *p = o->via.bin.ptr, *b = buf;
        /* Inline data stays in the caller's bytes (msgpack-c references its
         * input for bin); make sure, since the unpacked zone dies first. */
        if (o->via.bin.size && (p < b || p + o->via.bin.size > b + len))
            return ff_fail(e, COH_EINTERNAL, f, "field '%s': msgpack-c copied a bin", f);
        t->kind = FF_TENSOR_INLINE;
        t->data = p;
        t->nbytes = o->via.bin.size;
        return 0;
    }
    if (o->type != MSGPACK_OBJECT_MAP)
        return want(o, f, "binary (inline data) or a map {addr, nbytes}", e);
    bool has_addr = false, has_n = false;
    for (uint32_t i = 0; i < o->via.map.size; i++) {
        const msgpack_object *k = &o->via.map.ptr[i].key, *v = &o->via.map.ptr[i].val;
        char sub[FF_FIELD_MAX];
        if (str_is(k, "addr")) {
            snprintf(sub, sizeof(sub), "%s.addr", f);
            if (has_addr) return ff_fail(e, COH_EINVAL, sub, "field '%s': given twice", sub);
            if (get_u64(v, sub, &t->addr, e) < 0) return e->status;
            has_addr = true;
        } else if (str_is(k, "nbytes")) {
            snprintf(sub, sizeof(sub), "%s.nbytes", f);
            if (has_n) return ff_fail(e, COH_EINVAL, sub, "field '%s': given twice", sub);
            if (get_u64(v, sub, &t->nbytes, e) < 0) return e->status;
            has_n = true;
        } else if (k->type == MSGPACK_OBJECT_STR) {
            char shown[64];
            printable(k->via.str.ptr, k->via.str.size, shown, sizeof(shown));
            return ff_fail(e, COH_EINVAL, f, "field '%s': unknown key '%s' (expected addr, nbytes)",
                           f, shown);
        } else {
            return ff_fail(e, COH_EINVAL, f, "field '%s': a key is %s, expected a string", f,
                           ff_mp_type_name(k));
        }
    }
    if (!has_addr) return ff_fail(e, COH_EINVAL, f, "field '%s': missing 'addr'", f);
    if (!has_n) return ff_fail(e, COH_EINVAL, f, "field '%s': missing 'nbytes'", f);
    if (t->nbytes && !t->addr)
        return ff_fail(e, COH_EINVAL, f, "field '%s': addr is 0 (NULL) with nbytes %llu", f,
                       (unsigned long long)t->nbytes);
    if (t->addr > UINTPTR_MAX || t->nbytes > SIZE_MAX || t->nbytes > UINTPTR_MAX - t->addr)
        return ff_fail(e, COH_EINVAL, f, "field '%s': addr + nbytes is past the address space", f);
    t->kind = FF_TENSOR_ADDR;
    return 0;
}

/* ---- requests ---- */

typedef struct field {
    const char *name;
    uint32_t bit;
} field_t;

static const field_t req_fields[] = {
    {"v", FF_F_V},
    {"type", FF_F_TYPE},
    {"id", FF_F_ID},
    {"async", FF_F_ASYNC},
    {"timeout_ms", FF_F_TIMEOUT},
    {"dtype", FF_F_DTYPE},
    {"op", FF_F_OP},
    {"root", FF_F_ROOT},
    {"count", FF_F_COUNT},
    {"buf", FF_F_BUF},
    {"send", FF_F_SEND},
    {"recv", FF_F_RECV},
    {"iteration", FF_F_ITERATION},
    {"weight", FF_F_WEIGHT},
    {"mode", FF_F_MODE},
    {"algo", FF_F_ALGO},
    {"loss_bound", FF_F_LOSS},
    {"pull_loss_bound", FF_F_PULL_LOSS},
    {"layer", FF_F_LAYER},
    {"nlayers", FF_F_NLAYERS},
    {"mem", FF_F_MEM},
    {"stream", FF_F_STREAM},
    {"request", FF_F_REQUEST},
};
#define NFIELDS ((int)(sizeof(req_fields) / sizeof(req_fields[0])))

#define F_COMMON (FF_F_V | FF_F_TYPE | FF_F_ID | FF_F_ASYNC | FF_F_TIMEOUT)
#define F_DEVICE (FF_F_MEM | FF_F_STREAM) /* the collectives that take device buffers */
static const uint32_t allowed[FF_TYPE_COUNT] = {
    [FF_ALLREDUCE] = F_COMMON | F_DEVICE | FF_F_DTYPE | FF_F_OP | FF_F_COUNT | FF_F_BUF |
                     FF_F_SEND | FF_F_RECV | FF_F_ALGO | FF_F_ITERATION | FF_F_LOSS |
                     FF_F_PULL_LOSS | FF_F_LAYER | FF_F_NLAYERS,
    [FF_BROADCAST] = F_COMMON | F_DEVICE | FF_F_DTYPE | FF_F_ROOT | FF_F_COUNT | FF_F_BUF,
    [FF_ALLGATHER] = F_COMMON | F_DEVICE | FF_F_DTYPE | FF_F_COUNT | FF_F_SEND | FF_F_RECV,
    [FF_REDUCE_SCATTER] =
        F_COMMON | F_DEVICE | FF_F_DTYPE | FF_F_OP | FF_F_COUNT | FF_F_SEND | FF_F_RECV,
    [FF_BARRIER] = F_COMMON,
    [FF_SYNC] =
        F_COMMON | FF_F_DTYPE | FF_F_COUNT | FF_F_BUF | FF_F_ITERATION | FF_F_WEIGHT | FF_F_MODE,
    [FF_INFO] = FF_F_V | FF_F_TYPE | FF_F_ID,
    [FF_STATS] = FF_F_V | FF_F_TYPE | FF_F_ID,
    [FF_EVENT_CLEAR] = FF_F_V | FF_F_TYPE | FF_F_ID,
    [FF_LOGS] = FF_F_V | FF_F_TYPE | FF_F_ID,
    [FF_SYNC_LEAVE] = FF_F_V | FF_F_TYPE | FF_F_ID,
    [FF_LB_TABLE] = FF_F_V | FF_F_TYPE | FF_F_ID,
    [FF_FAILED_RANKS] = FF_F_V | FF_F_TYPE | FF_F_ID,
    [FF_PROBE] = FF_F_V | FF_F_TYPE | FF_F_ID,
    [FF_STREAM_WAIT] = FF_F_V | FF_F_TYPE | FF_F_ID | FF_F_REQUEST | FF_F_STREAM,
};

static const char *field_name(uint32_t bit)
{
    for (int i = 0; i < NFIELDS; i++)
        if (req_fields[i].bit == bit) return req_fields[i].name;
    return "?";
}

/* Field "v": the schema version this library speaks, in requests and configs. */
static int check_version(const msgpack_object *v, const char *f, ff_err_t *e)
{
    int64_t i64;
    if (get_int(v, f, 0, INT32_MAX, &i64, e) < 0) return e->status;
    if (i64 != FF_SCHEMA)
        return ff_fail(e, COH_EUNSUPPORTED, f,
                       "field 'v': schema version %lld is not supported (this library speaks %d)",
                       (long long)i64, FF_SCHEMA);
    return 0;
}

static int decode_field(const field_t *fd, const msgpack_object *v, const void *buf, size_t len,
                        ff_req_t *r, ff_err_t *e)
{
    const char *f = fd->name;
    int64_t i64;
    int k;
    switch (fd->bit) {
    case FF_F_V: return check_version(v, f, e);
    case FF_F_TYPE:
        if (get_enum(v, f, type_names, FF_TYPE_COUNT, &k, e) < 0) return e->status;
        r->type = (ff_type)k;
        return 0;
    case FF_F_ID: return get_int(v, f, INT64_MIN, INT64_MAX, &r->id, e);
    case FF_F_ASYNC: return get_bool(v, f, &r->async, e);
    case FF_F_TIMEOUT:
        if (get_int(v, f, -1, INT_MAX, &i64, e) < 0) return e->status;
        r->timeout_ms = (int)i64;
        return 0;
    case FF_F_DTYPE: return get_dtype(v, f, &r->dtype, e);
    case FF_F_OP:
        if (get_enum(v, f, redop_names, COH_REDOP_COUNT, &k, e) < 0) return e->status;
        r->op = (coh_redop)k;
        return 0;
    case FF_F_ROOT:
        if (get_int(v, f, 0, INT_MAX, &i64, e) < 0) return e->status;
        r->root = (int)i64;
        return 0;
    case FF_F_COUNT: return get_u64(v, f, &r->count, e);
    case FF_F_BUF: return get_tensor(v, f, buf, len, &r->t[FF_T_BUF], e);
    case FF_F_SEND: return get_tensor(v, f, buf, len, &r->t[FF_T_SEND], e);
    case FF_F_RECV: return get_tensor(v, f, buf, len, &r->t[FF_T_RECV], e);
    case FF_F_ITERATION: return get_int(v, f, 0, INT64_MAX, &r->iteration, e);
    case FF_F_WEIGHT:
        if (get_double(v, f, &r->weight, e) < 0) return e->status;
        if (!(r->weight > 0))
            return ff_fail(e, COH_EINVAL, f, "field 'weight': %g is not > 0", r->weight);
        return 0;
    case FF_F_MODE:
        if (get_enum(v, f, mode_names, FF_SYNC_MODE_COUNT, &k, e) < 0) return e->status;
        r->mode = (ff_sync_mode)k;
        return 0;
    case FF_F_ALGO:
        if (get_enum(v, f, algo_names, FF_ALGO_COUNT, &k, e) < 0) return e->status;
        r->algo = (ff_algo)k;
        return 0;
    case FF_F_LOSS:
    case FF_F_PULL_LOSS: {
        double *d = fd->bit == FF_F_LOSS ? &r->loss_bound : &r->pull_loss_bound;
        if (get_double(v, f, d, e) < 0) return e->status;
        if (!(*d >= 0 && *d < 1))
            return ff_fail(e, COH_EINVAL, f, "field '%s': %g is not in [0, 1)", f, *d);
        return 0;
    }
    case FF_F_LAYER:
    case FF_F_NLAYERS:
        if (get_int(v, f, 0, INT_MAX, &i64, e) < 0) return e->status;
        *(fd->bit == FF_F_LAYER ? &r->layer : &r->nlayers) = (int)i64;
        return 0;
    case FF_F_MEM:
        if (get_enum(v, f, mem_names, 3, &k, e) < 0) return e->status;
        r->mem = k; /* the names are coh_mem's order */
        return 0;
    case FF_F_STREAM: return get_u64(v, f, &r->stream, e);
    case FF_F_REQUEST: return get_u64(v, f, &r->request, e);
    default: return ff_fail(e, COH_EINTERNAL, f, "field '%s': no decoder", f);
    }
}

static int unpack_map(const void *buf, size_t len, const char *what, msgpack_unpacked *mp,
                      ff_err_t *e)
{
    if (ff_mp_bounds(buf, len, what, e) < 0) return e->status;
    size_t off = 0;
    msgpack_unpack_return ur = msgpack_unpack_next(mp, buf, len, &off);
    if (ur == MSGPACK_UNPACK_NOMEM_ERROR)
        return ff_fail(e, COH_ENOMEM, "", "%s: out of memory while unpacking", what);
    if (ur != MSGPACK_UNPACK_SUCCESS)
        return ff_fail(e, COH_EINVAL, "", "%s: malformed msgpack", what);
    if (mp->data.type != MSGPACK_OBJECT_MAP)
        return ff_fail(e, COH_EINVAL, "", "%s: expected a msgpack map, got %s", what,
                       ff_mp_type_name(&mp->data));
    return 0;
}

int ff_decode_request(const void *buf, size_t len, ff_req_t *r, ff_err_t *e)
{
    memset(r, 0, sizeof(*r));
    r->type = FF_TYPE_COUNT;
    r->op = COH_SUM;
    r->timeout_ms = -1;
    r->weight = 1.0;
    e->status = 0;
    msgpack_unpacked mp;
    msgpack_unpacked_init(&mp);
    int st = unpack_map(buf, len, "request", &mp, e);
    if (st < 0) goto out;
    const msgpack_object_map *m = &mp.data.via.map;
    for (uint32_t i = 0; i < m->size && st == 0; i++) {
        const msgpack_object *k = &m->ptr[i].key, *v = &m->ptr[i].val;
        if (k->type != MSGPACK_OBJECT_STR) {
            st = ff_fail(e, COH_EINVAL, "", "request: key %u is %s, expected a string", i,
                         ff_mp_type_name(k));
            break;
        }
        const field_t *fd = NULL;
        for (int j = 0; j < NFIELDS && !fd; j++)
            if (str_is(k, req_fields[j].name)) fd = &req_fields[j];
        if (!fd) {
            char shown[64];
            printable(k->via.str.ptr, k->via.str.size, shown, sizeof(shown));
            st = ff_fail(e, COH_EINVAL, shown, "unknown field '%s'", shown);
            break;
        }
        if (r->seen & fd->bit) {
            st = ff_fail(e, COH_EINVAL, fd->name, "field '%s': given twice", fd->name);
            break;
        }
        if (v->type == MSGPACK_OBJECT_NIL) continue; /* nil: as if absent */
        st = decode_field(fd, v, buf, len, r, e);
        if (st == 0) r->seen |= fd->bit;
    }
    if (st < 0) goto out;
    if (!(r->seen & FF_F_TYPE)) {
        st = ff_fail(e, COH_EINVAL, "type", "missing field 'type'");
        goto out;
    }
    uint32_t extra = r->seen & ~allowed[r->type];
    if (extra) {
        uint32_t bit = extra & -extra;
        const char *fn = field_name(bit);
        st = ff_fail(e, COH_EINVAL, fn, "field '%s': not used by a %s request", fn,
                     ff_type_name(r->type));
        goto out;
    }
    bool tensors = r->type < FF_BARRIER || r->type == FF_SYNC;
    if (tensors && !(r->seen & FF_F_DTYPE)) {
        st = ff_fail(e, COH_EINVAL, "dtype", "missing field 'dtype'");
        goto out;
    }
    if (r->type == FF_SYNC && !(r->seen & FF_F_ITERATION)) {
        st = ff_fail(e, COH_EINVAL, "iteration", "missing field 'iteration'");
        goto out;
    }
    /* Loss bounds are the default algorithm's; a layer needs its count. */
    if (r->type == FF_ALLREDUCE && (r->seen & (FF_F_LOSS | FF_F_PULL_LOSS)) &&
        r->algo == FF_ALGO_RELAY) {
        st = ff_fail(e, COH_EINVAL, "loss_bound",
                     "field 'loss_bound': a relay allreduce is reliable (algo 'default' only)");
        goto out;
    }
    if ((r->seen & FF_F_LAYER) && !(r->seen & FF_F_NLAYERS && r->layer < r->nlayers)) {
        st = ff_fail(e, COH_EINVAL, "layer", "field 'layer': needs 'nlayers' above it");
        goto out;
    }
    if (r->type == FF_STREAM_WAIT && !(r->seen & FF_F_REQUEST)) {
        st = ff_fail(e, COH_EINVAL, "request", "missing field 'request'");
        goto out;
    }
    /* Inline tensors are the ABI's own copies, in host memory. */
    if (r->mem == COH_MEM_DEVICE)
        for (int t = 0; t < FF_NTENSORS; t++)
            if (r->t[t].kind == FF_TENSOR_INLINE) {
                st = ff_fail(e, COH_EINVAL, "mem",
                             "field 'mem': 'device' needs addr tensors ('%s' is inline data, "
                             "copied to host memory)",
                             ff_tensor_names[t]);
                goto out;
            }
    /* An allreduce's iteration is the relay group's step number. */
    if (r->type == FF_ALLREDUCE && (r->seen & FF_F_ITERATION) && r->algo != FF_ALGO_RELAY) {
        st = ff_fail(e, COH_EINVAL, "iteration",
                     "field 'iteration': used by an allreduce request only with algo 'relay'");
        goto out;
    }
out:
    msgpack_unpacked_destroy(&mp);
    return st;
}

bool ff_peek_id(const void *buf, size_t len, int64_t *id)
{
    ff_err_t e = {0};
    if (ff_mp_bounds(buf, len, "request", &e) < 0) return false;
    msgpack_unpacked mp;
    msgpack_unpacked_init(&mp);
    size_t off = 0;
    bool found = false;
    if (msgpack_unpack_next(&mp, buf, len, &off) == MSGPACK_UNPACK_SUCCESS &&
        mp.data.type == MSGPACK_OBJECT_MAP) {
        const msgpack_object_map *m = &mp.data.via.map;
        for (uint32_t i = 0; i < m->size && !found; i++)
            if (str_is(&m->ptr[i].key, "id") &&
                get_int(&m->ptr[i].val, "id", INT64_MIN, INT64_MAX, id, &e) == 0)
                found = true;
    }
    msgpack_unpacked_destroy(&mp);
    return found;
}

/* ---- shapes ---- */

static int elems(const ff_req_t *r, int t, size_t es, uint64_t *n, ff_err_t *e)
{
    const char *f = ff_tensor_names[t];
    if (r->t[t].nbytes % es)
        return ff_fail(e, COH_EINVAL, f,
                       "field '%s': %llu bytes is not a whole number of %s elements (%zu bytes "
                       "each)",
                       f, (unsigned long long)r->t[t].nbytes, coh_dtype_name(r->dtype), es);
    *n = r->t[t].nbytes / es;
    return 0;
}

static int mismatch(const char *f, uint64_t got, uint64_t want_n, const char *why, ff_err_t *e)
{
    return ff_fail(e, COH_EINVAL, f, "field '%s': holds %llu elements, expected %llu (%s)", f,
                   (unsigned long long)got, (unsigned long long)want_n, why);
}

int ff_resolve(const ff_req_t *r, int size, ff_shape_t *s, ff_err_t *e)
{
    memset(s, 0, sizeof(*s));
    if (r->type == FF_BARRIER || r->type >= FF_INFO) return 0;
    if (size < 1) return ff_fail(e, COH_EINVAL, "", "communicator size %d < 1", size);
    size_t es = coh_dtype_size(r->dtype);
    if (!es) return ff_fail(e, COH_EINVAL, "dtype", "field 'dtype': unknown dtype");
    if (r->type == FF_BROADCAST && r->root >= size)
        return ff_fail(e, COH_EINVAL, "root", "field 'root': %d is not a rank of a size-%d group",
                       r->root, size);
    bool has[FF_NTENSORS];
    uint64_t n[FF_NTENSORS] = {0};
    for (int t = 0; t < FF_NTENSORS; t++) {
        has[t] = r->t[t].kind != FF_TENSOR_NONE;
        if (has[t] && elems(r, t, es, &n[t], e) < 0) return e->status;
    }
    uint64_t count = 0, usize = (uint64_t)size;
    switch (r->type) {
    case FF_ALLREDUCE:
    case FF_BROADCAST:
    case FF_SYNC:
        if (has[FF_T_BUF] && (has[FF_T_SEND] || has[FF_T_RECV]))
            return ff_fail(e, COH_EINVAL, has[FF_T_SEND] ? "send" : "recv",
                           "field '%s': give either 'buf' (in place) or 'send' and 'recv'",
                           has[FF_T_SEND] ? "send" : "recv");
        if (has[FF_T_BUF]) {
            count = n[FF_T_BUF];
            s->nbytes[FF_T_BUF] = count * es;
        } else if (has[FF_T_SEND]) {
            count = n[FF_T_SEND];
            if (has[FF_T_RECV] && n[FF_T_RECV] != count)
                return mismatch("recv", n[FF_T_RECV], count, "as many as 'send'", e);
            s->alloc_recv = !has[FF_T_RECV];
            s->nbytes[FF_T_SEND] = s->nbytes[FF_T_RECV] = count * es;
        } else if (has[FF_T_RECV]) {
            return ff_fail(e, COH_EINVAL, "send",
                           "missing field 'send' (or give only 'buf' for in place)");
        } else {
            return ff_fail(e, COH_EINVAL, "buf", "missing field 'buf'");
        }
        break;
    case FF_ALLGATHER:
        if (has[FF_T_SEND]) {
            count = n[FF_T_SEND];
            if (count > UINT64_MAX / usize)
                return ff_fail(e, COH_EINVAL, "send", "field 'send': too large");
            if (has[FF_T_RECV] && n[FF_T_RECV] != count * usize)
                return mismatch("recv", n[FF_T_RECV], count * usize, "size x 'send'", e);
            s->alloc_recv = !has[FF_T_RECV];
        } else if (has[FF_T_RECV]) {
            if (n[FF_T_RECV] % usize)
                return ff_fail(e, COH_EINVAL, "recv",
                               "field 'recv': %llu elements do not split into %d equal blocks",
                               (unsigned long long)n[FF_T_RECV], size);
            count = n[FF_T_RECV] / usize;
        } else {
            return ff_fail(e, COH_EINVAL, "send", "missing field 'send' (or 'recv' for in place)");
        }
        s->nbytes[FF_T_SEND] = has[FF_T_SEND] ? count * es : 0;
        s->nbytes[FF_T_RECV] = count * usize * es;
        break;
    case FF_REDUCE_SCATTER: {
        int in = has[FF_T_SEND] ? FF_T_SEND : FF_T_RECV;
        if (!has[in])
            return ff_fail(e, COH_EINVAL, "send", "missing field 'send' (or 'recv' for in place)");
        if (n[in] % usize)
            return ff_fail(e, COH_EINVAL, ff_tensor_names[in],
                           "field '%s': %llu elements do not split into %d equal blocks",
                           ff_tensor_names[in], (unsigned long long)n[in], size);
        count = n[in] / usize;
        if (in == FF_T_SEND && has[FF_T_RECV] && n[FF_T_RECV] != count)
            return mismatch("recv", n[FF_T_RECV], count, "'send' / size", e);
        s->alloc_recv = in == FF_T_SEND && !has[FF_T_RECV];
        s->nbytes[FF_T_SEND] = in == FF_T_SEND ? count * usize * es : 0;
        s->nbytes[FF_T_RECV] = in == FF_T_SEND ? count * es : count * usize * es;
        break;
    }
    default: return 0;
    }
    if ((r->seen & FF_F_COUNT) && r->count != count)
        return ff_fail(e, COH_EINVAL, "count",
                       "field 'count': %llu does not match the tensors (%llu elements)",
                       (unsigned long long)r->count, (unsigned long long)count);
    if (count > SIZE_MAX / es / usize)
        return ff_fail(e, COH_EINVAL, "count", "field 'count': %llu elements overflow",
                       (unsigned long long)count);
    s->count = (size_t)count;
    return 0;
}

/* ---- config ---- */

static const char *const log_names[] = {"error", "warn", "info", "debug"};

/* A config field: one of the knob table's (reactor/rx_config.h). */
static int cfg_knob(int idx, const rx_knob_t *k, const msgpack_object *v, ff_config_t *c,
                    ff_err_t *e)
{
    const char *f = k->name;
    char where[FF_FIELD_MAX + 16];
    snprintf(where, sizeof(where), "field '%s'", f);
    char text[FF_MAX_STR];
    int64_t i64 = 0;
    uint64_t u = 0;
    /* Strings go to the table's parser as they are ("64K", "selective");
     * numbers are written out for it. */
    if (k->kind == RX_K_STR || (k->kind != RX_K_INT && v->type == MSGPACK_OBJECT_STR)) {
        if (get_str(v, f, text, sizeof(text), e) < 0) return e->status;
    } else if (k->kind == RX_K_SIZE) {
        if (get_u64(v, f, &u, e) < 0) return e->status;
        snprintf(text, sizeof(text), "%llu", (unsigned long long)u);
    } else {
        if (get_int(v, f, k->lo, (int64_t)k->hi, &i64, e) < 0) return e->status;
        if (k->kind == RX_K_MODE)
            snprintf(text, sizeof(text), "%s", coh_sync_mode_name((coh_sync_mode)i64));
        else
            snprintf(text, sizeof(text), "%lld", (long long)i64);
    }
    char *copy = k->kind == RX_K_STR ? coh_strdup(text) : NULL;
    if (k->kind == RX_K_STR && !copy)
        return ff_fail(e, COH_ENOMEM, f, "field '%s': out of memory", f);
    if (rx_knob_set(&c->cfg, k, copy ? copy : text, where) < 0) {
        coh_free(copy);
        /* The table's message quotes the value: keep it printable for bindings. */
        char msg[FF_MSG_MAX];
        snprintf(msg, sizeof(msg), "%s", coh_last_error());
        for (char *q = msg; *q; q++)
            if ((unsigned char)*q < 0x20 || (unsigned char)*q >= 0x7f) *q = '?';
        return ff_fail(e, COH_EINVAL, f, "%s", msg);
    }
    if (copy) {
        coh_free(c->owned[idx]);
        c->owned[idx] = copy;
    }
    return 0;
}

/* The ABI's own fields: "log_level" and "v". */
static int cfg_extra(const char *f, const msgpack_object *v, ff_config_t *c, ff_err_t *e)
{
    if (!strcmp(f, "v")) return check_version(v, f, e);
    int64_t i64;
    if (v->type == MSGPACK_OBJECT_STR) {
        if (str_is(v, "off")) {
            c->log_level = -1;
            return 0;
        }
        int k;
        if (get_enum(v, f, log_names, 4, &k, e) < 0) return e->status;
        c->log_level = k;
        return 0;
    }
    if (get_int(v, f, -1, 3, &i64, e) < 0) return e->status;
    c->log_level = (int)i64;
    return 0;
}

int ff_decode_config(const void *buf, size_t len, ff_config_t *c, ff_err_t *e)
{
    memset(c, 0, sizeof(*c));
    c->log_level = -2;
    e->status = 0;
    if (coh_config_init(&c->cfg) < 0)
        return ff_fail(e, COH_EINVAL, "", "environment: %s", coh_last_error());
    if (len == 0) return 0; /* no map: defaults and the environment */
    int nk;
    const rx_knob_t *knobs = rx_knobs(&nk);
    if (nk > FF_CFG_MAX - 2) return ff_fail(e, COH_EINTERNAL, "", "config: too many knobs");
    msgpack_unpacked mp;
    msgpack_unpacked_init(&mp);
    int st = unpack_map(buf, len, "config", &mp, e);
    bool seen[FF_CFG_MAX] = {false};
    if (st == 0) {
        const msgpack_object_map *m = &mp.data.via.map;
        for (uint32_t i = 0; i < m->size && st == 0; i++) {
            const msgpack_object *k = &m->ptr[i].key, *v = &m->ptr[i].val;
            if (k->type != MSGPACK_OBJECT_STR) {
                st = ff_fail(e, COH_EINVAL, "", "config: key %u is %s, expected a string", i,
                             ff_mp_type_name(k));
                break;
            }
            /* The table's fields, then "log_level" and "v". */
            int j = 0;
            while (j < nk && knobs[j].off >= 0 && !str_is(k, knobs[j].name)) j++;
            const char *name = j < nk && knobs[j].off >= 0 ? knobs[j].name
                               : str_is(k, "log_level")    ? "log_level"
                               : str_is(k, "v")            ? "v"
                                                           : NULL;
            if (!name) {
                char shown[64];
                printable(k->via.str.ptr, k->via.str.size, shown, sizeof(shown));
                st = ff_fail(e, COH_EINVAL, shown, "config: unknown field '%s'", shown);
                break;
            }
            if (!(j < nk && knobs[j].off >= 0))
                j = name[0] == 'v' ? FF_CFG_MAX - 1 : FF_CFG_MAX - 2;
            if (seen[j]) {
                st = ff_fail(e, COH_EINVAL, name, "field '%s': given twice", name);
                break;
            }
            seen[j] = true;
            if (v->type == MSGPACK_OBJECT_NIL) continue;
            st = j < nk && knobs[j].off >= 0 ? cfg_knob(j, &knobs[j], v, c, e)
                                             : cfg_extra(name, v, c, e);
        }
    }
    msgpack_unpacked_destroy(&mp);
    if (st == 0 && c->cfg.rank >= c->cfg.world_size)
        st = ff_fail(e, COH_EINVAL, "rank", "field 'rank': %d is not below world_size %d",
                     c->cfg.rank, c->cfg.world_size);
    if (st == 0 && c->cfg.coordinator >= c->cfg.world_size)
        st = ff_fail(e, COH_EINVAL, "coordinator",
                     "field 'coordinator': %d is not below world_size %d", c->cfg.coordinator,
                     c->cfg.world_size);
    if (st < 0) ff_config_fini(c);
    return st;
}

void ff_config_fini(ff_config_t *c)
{
    for (int i = 0; i < FF_CFG_MAX; i++) {
        coh_free(c->owned[i]);
        c->owned[i] = NULL;
    }
}

/* ---- responses ---- */

/* Pack s as printable ASCII: messages may quote text from the request or
 * the environment, and a binding must always be able to decode them. */
static void pack_kv_ascii(msgpack_packer *pk, const char *k, const char *s)
{
    char out[FF_MSG_MAX];
    size_t n = 0;
    for (; s[n] && n < sizeof(out) - 1; n++) {
        unsigned char c = (unsigned char)s[n];
        out[n] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
    }
    out[n] = '\0';
    ff_pack_kv_str(pk, k, out);
}

void ff_pack_head(msgpack_packer *pk, int status, const ff_err_t *err, int type, bool has_id,
                  int64_t id, uint32_t extra)
{
    bool field = status < 0 && err && err->field[0];
    uint32_t n = 3 + (status < 0) + field + (type >= 0 && type < FF_TYPE_COUNT) + has_id + extra;
    msgpack_pack_map(pk, n);
    ff_pack_kv_int(pk, "v", FF_SCHEMA);
    ff_pack_kv_int(pk, "status", status);
    ff_pack_kv_str(pk, "code", coh_status_name(status));
    if (status < 0)
        pack_kv_ascii(pk, "error", err && err->msg[0] ? err->msg : coh_strerror(status));
    if (field) pack_kv_ascii(pk, "field", err->field);
    if (type >= 0 && type < FF_TYPE_COUNT) ff_pack_kv_str(pk, "type", ff_type_name((ff_type)type));
    if (has_id) ff_pack_kv_int(pk, "id", id);
}

int ff_error_response(const ff_err_t *err, int type, bool has_id, int64_t id, void **resp,
                      size_t *resp_len)
{
    int st = err->status < 0 ? err->status : COH_EINTERNAL;
    if (!resp) return st;
    *resp = NULL;
    if (resp_len) *resp_len = 0;
    ff_out_t o;
    msgpack_packer pk;
    ff_out_init(&o, &pk);
    ff_pack_head(&pk, st, err, type, has_id, id, 0);
    if (!o.ok) {
        ff_out_fini(&o);
        return st;
    }
    *resp = o.data;
    if (resp_len) *resp_len = o.len;
    return st;
}
