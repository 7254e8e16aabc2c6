/*
 * msgpack helpers: the bounds check that runs before msgpack-c, type names
 * for error messages, and an output buffer on the library's allocator.
 *
 * Why a bounds check: msgpack-c's C unpacker allocates a container's element
 * array from its declared count before it reads a single element, so five
 * bytes ("dd ff ff ff ff", an array of 2^32 - 1) ask its zone for ~100 GB.
 * The C API has no limit for that (the C++ one has). ff_mp_bounds walks the
 * type bytes only (no value is decoded here) and refuses counts that the
 * remaining bytes cannot hold, deep nesting, too many items and trailing
 * bytes, so msgpack-c never allocates more than FF_MAX_ITEMS elements.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ffi/ffi.h"
#include "base/bs_alloc.h"

int ff_fail(ff_err_t *e, int status, const char *field, const char *fmt, ...)
{
    if (!e || e->status < 0) return e ? e->status : status;
    e->status = status;
    snprintf(e->field, sizeof(e->field), "%s", field ? field : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
    va_end(ap);
    return status;
}

static uint64_t be(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = (v << 8) | p[i];
    return v;
}

int ff_mp_bounds(const void *buf, size_t len, const char *what, ff_err_t *err)
{
    const uint8_t *p = buf;
    if (!p && len) return ff_fail(err, COH_EINVAL, "", "%s: NULL bytes with length %zu", what, len);
    if (len == 0) return ff_fail(err, COH_EINVAL, "", "%s: empty (expected a msgpack map)", what);
    if (len > FF_MAX_REQUEST)
        return ff_fail(err, COH_EINVAL, "", "%s: %zu bytes is over the limit of %u bytes", what,
                       len, FF_MAX_REQUEST);
    uint64_t left[FF_MAX_DEPTH + 1]; /* items still to read at each level */
    int depth = 0;
    size_t off = 0, items = 0;
    left[0] = 1;
    while (depth >= 0) {
        if (left[depth] == 0) {
            depth--;
            continue;
        }
        left[depth]--;
        if (off >= len) goto truncated;
        if (++items > FF_MAX_ITEMS)
            return ff_fail(err, COH_EINVAL, "", "%s: more than %d msgpack items", what,
                           FF_MAX_ITEMS);
        size_t at = off;
        uint8_t b = p[off++];
        int lenbytes = 0;   /* big-endian length that follows the type byte */
        uint64_t fixed = 0; /* payload bytes that follow */
        uint64_t extra = 0; /* ext: the type byte */
        int container = 0;  /* 1 array, 2 map */
        uint64_t n = 0;
        if (b <= 0x7f || b >= 0xe0) {
            /* fixint */
        } else if (b <= 0x8f) {
            container = 2, n = b & 0x0f;
        } else if (b <= 0x9f) {
            container = 1, n = b & 0x0f;
        } else if (b <= 0xbf) {
            fixed = b & 0x1f;
        } else {
            switch (b) {
            case 0xc0: /* nil */
            case 0xc2: /* false */
            case 0xc3: break;
            case 0xc1:
                return ff_fail(err, COH_EINVAL, "", "%s: byte %zu is 0xc1, never used by msgpack",
                               what, at);
            case 0xc4:
            case 0xd9: lenbytes = 1; break;
            case 0xc5:
            case 0xda: lenbytes = 2; break;
            case 0xc6:
            case 0xdb: lenbytes = 4; break;
            case 0xc7: lenbytes = 1, extra = 1; break;
            case 0xc8: lenbytes = 2, extra = 1; break;
            case 0xc9: lenbytes = 4, extra = 1; break;
            case 0xca: fixed = 4; break;
            case 0xcb: fixed = 8; break;
            case 0xcc:
            case 0xd0: fixed = 1; break;
            case 0xcd:
            case 0xd1: fixed = 2; break;
            case 0xce:
            case 0xd2: fixed = 4; break;
            case 0xcf:
            case 0xd3: fixed = 8; break;
            case 0xd4: fixed = 2; break;
            case 0xd5: fixed = 3; break;
            case 0xd6: fixed = 5; break;
            case 0xd7: fixed = 9; break;
            case 0xd8: fixed = 17; break;
            case 0xdc: container = 1, lenbytes = 2; break;
            case 0xdd: container = 1, lenbytes = 4; break;
            case 0xde: container = 2, lenbytes = 2; break;
            case 0xdf: container = 2, lenbytes = 4; break;
            default: break;
            }
        }
        if (lenbytes) {
            if (len - off < (size_t)lenbytes) goto truncated;
            uint64_t v = be(p + off, lenbytes);
            off += (size_t)lenbytes;
            if (container)
                n = v;
            else
                fixed = v + extra;
        }
        if (container) {
            uint64_t elems = container == 2 ? 2 * n : n;
            if (elems > len - off)
                return ff_fail(err, COH_EINVAL, "",
                               "%s: truncated: %s at byte %zu declares %llu entries but only "
                               "%zu bytes follow",
                               what, container == 2 ? "a map" : "an array", at,
                               (unsigned long long)n, len - off);
            if (elems) {
                if (depth + 1 > FF_MAX_DEPTH)
                    return ff_fail(err, COH_EINVAL, "", "%s: nested deeper than %d levels", what,
                                   FF_MAX_DEPTH);
                left[++depth] = elems;
            }
        } else {
            if (fixed > len - off) goto truncated;
            off += (size_t)fixed;
        }
    }
    if (off != len)
        return ff_fail(err, COH_EINVAL, "", "%s: %zu trailing bytes after the msgpack object", what,
                       len - off);
    return 0;
truncated:
    return ff_fail(err, COH_EINVAL, "", "%s: truncated msgpack (%zu bytes)", what, len);
}

const char *ff_mp_type_name(const msgpack_object *o)
{
    switch (o->type) {
    case MSGPACK_OBJECT_NIL: return "nil";
    case MSGPACK_OBJECT_BOOLEAN: return "a boolean";
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: return "an integer";
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: return "a float";
    case MSGPACK_OBJECT_STR: return "a string";
    case MSGPACK_OBJECT_BIN: return "binary";
    case MSGPACK_OBJECT_ARRAY: return "an array";
    case MSGPACK_OBJECT_MAP: return "a map";
    case MSGPACK_OBJECT_EXT: return "an ext";
    default: return "an unknown type";
    }
}

/* ---- output ---- */

static int out_write(void *data, const char *buf, size_t len)
{
    ff_out_t *o = data;
    if (!o->ok) return -1;
    if (len > o->cap - o->len) {
        size_t cap = o->cap ? o->cap : 256;
        while (cap - o->len < len) {
            if (cap > SIZE_MAX / 2) {
                o->ok = false;
                return -1;
            }
            cap *= 2;
        }
        char *d = coh_realloc(o->data, cap);
        if (!d) {
            o->ok = false;
            return -1;
        }
        o->data = d;
        o->cap = cap;
    }
    memcpy(o->data + o->len, buf, len);
    o->len += len;
    return 0;
}

void ff_out_init(ff_out_t *o, msgpack_packer *pk)
{
    memset(o, 0, sizeof(*o));
    o->ok = true;
    msgpack_packer_init(pk, o, out_write);
}

void ff_out_fini(ff_out_t *o)
{
    coh_free(o->data);
    memset(o, 0, sizeof(*o));
}

void ff_pack_str(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

void ff_pack_kv_str(msgpack_packer *pk, const char *k, const char *v)
{
    ff_pack_str(pk, k);
    ff_pack_str(pk, v);
}

void ff_pack_kv_int(msgpack_packer *pk, const char *k, int64_t v)
{
    ff_pack_str(pk, k);
    msgpack_pack_int64(pk, v);
}

void ff_pack_kv_uint(msgpack_packer *pk, const char *k, uint64_t v)
{
    ff_pack_str(pk, k);
    msgpack_pack_uint64(pk, v);
}

void ff_pack_kv_double(msgpack_packer *pk, const char *k, double v)
{
    ff_pack_str(pk, k);
    msgpack_pack_double(pk, v);
}

void ff_pack_kv_bool(msgpack_packer *pk, const char *k, bool v)
{
    ff_pack_str(pk, k);
    if (v)
        msgpack_pack_true(pk);
    else
        msgpack_pack_false(pk);
}
