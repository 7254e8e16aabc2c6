/*
 * ffi_request_fuzzer - the msgpack request and config decoders of ffi/.
 *
 * Any bytes must decode or be refused with a negative status and a message;
 * messages are printable ASCII (they go back to bindings as msgpack str);
 * a decoded request resolves (or is refused) for several group sizes, and a
 * resolved shape agrees with the tensors it was given; the error response
 * built for any refusal unpacks as a msgpack map.
 */
#include <msgpack.h>
#include <stdbool.h>

#include "cohort_ffi.h"
#include "ffi/ffi.h"
#include "fuzz/fuzz.h"

static void check_msg(const ff_err_t *e)
{
    FUZZ_CHECK(e->status < 0);
    FUZZ_CHECK(e->msg[0] != '\0');
    for (const char *p = e->msg; *p; p++) FUZZ_CHECK(*p >= 0x20 && *p < 0x7f);
    for (const char *p = e->field; *p; p++) FUZZ_CHECK(*p >= 0x20 && *p < 0x7f);
}

static void check_response(const ff_err_t *e, int type, bool has_id, int64_t id)
{
    void *resp = NULL;
    size_t len = 0;
    int st = ff_error_response(e, type, has_id, id, &resp, &len);
    FUZZ_CHECK(st == e->status);
    FUZZ_CHECK(resp != NULL);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    FUZZ_CHECK(msgpack_unpack_next(&u, resp, len, &off) == MSGPACK_UNPACK_SUCCESS);
    FUZZ_CHECK(off == len && u.data.type == MSGPACK_OBJECT_MAP);
    msgpack_unpacked_destroy(&u);
    coh_ffi_free(resp);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ff_req_t r;
    ff_err_t e = {0};
    int st = ff_decode_request(data, size, &r, &e);
    if (st < 0) {
        check_msg(&e);
        int64_t id = r.id;
        bool has_id = (r.seen & FF_F_ID) || ff_peek_id(data, size, &id);
        check_response(&e, r.seen & FF_F_TYPE ? (int)r.type : -1, has_id, id);
    } else {
        FUZZ_CHECK(st == 0 && (unsigned)r.type < FF_TYPE_COUNT);
        for (int t = 0; t < FF_NTENSORS; t++)
            if (r.t[t].kind == FF_TENSOR_INLINE && r.t[t].nbytes) /* inside the input */
                FUZZ_CHECK((const uint8_t *)r.t[t].data >= data &&
                           (const uint8_t *)r.t[t].data + r.t[t].nbytes <= data + size);
        static const int sizes[] = {1, 2, 3, 7, 1 << 20};
        for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
            ff_shape_t s;
            ff_err_t e2 = {0};
            if (ff_resolve(&r, sizes[k], &s, &e2) < 0) {
                check_msg(&e2);
                check_response(&e2, r.type, r.seen & FF_F_ID, r.id);
                continue;
            }
            for (int t = 0; t < FF_NTENSORS; t++)
                if (r.t[t].kind != FF_TENSOR_NONE) FUZZ_CHECK(s.nbytes[t] == r.t[t].nbytes);
            if (s.alloc_recv) FUZZ_CHECK(r.t[FF_T_RECV].kind == FF_TENSOR_NONE);
        }
    }
    ff_config_t c;
    ff_err_t ec = {0};
    if (ff_decode_config(data, size, &c, &ec) == 0) {
        FUZZ_CHECK(c.cfg.rank >= 0 && c.cfg.rank < c.cfg.world_size);
        ff_config_fini(&c);
    } else {
        check_msg(&ec);
    }
    return 0;
}
