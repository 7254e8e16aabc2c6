/*
 * cohort-ffi-bench - what the msgpack ABI costs on top of the C API.
 *
 *   cohortrun -n 2 -- cohort-ffi-bench [-s 4K,64M] [-r rounds (31)] [-t seconds-per-round (0.02)]
 *
 * 1. codec: encode a request map (msgpack-c, as a binding would), decode and
 *    check it (ff_decode_request + ff_resolve), encode a completion response,
 *    decode that (msgpack-c): everything the ABI adds except the call itself.
 * 2. submit: coh_ffi_call with "async": true vs coh_allreduce (barrier-free:
 *    the wait is outside the timed part), per request.
 * 3. allreduce per size, blocking, in short rounds that alternate the C API
 *    (coh_allreduce + coh_wait) and the ABI (encode + coh_ffi_call + decode
 *    the response); the median round of each is reported. A round is at
 *    least one op, so large sizes run one op per round.
 */
#include <inttypes.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cohort.h"
#include "cohort_ffi.h"
#include "ffi/ffi.h"

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_d);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void put_str(msgpack_packer *pk, const char *s)
{
    msgpack_pack_str(pk, strlen(s));
    msgpack_pack_str_body(pk, s, strlen(s));
}

/* The request a binding sends for an in-place f32 allreduce. */
static void encode_request(msgpack_sbuffer *sb, void *buf, size_t nbytes, bool async)
{
    msgpack_sbuffer_clear(sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 4 + async);
    put_str(&pk, "type");
    put_str(&pk, "allreduce");
    put_str(&pk, "dtype");
    put_str(&pk, "f32");
    put_str(&pk, "op");
    put_str(&pk, "sum");
    put_str(&pk, "buf");
    msgpack_pack_map(&pk, 2);
    put_str(&pk, "addr");
    msgpack_pack_uint64(&pk, (uint64_t)(uintptr_t)buf);
    put_str(&pk, "nbytes");
    msgpack_pack_uint64(&pk, nbytes);
    if (async) {
        put_str(&pk, "async");
        msgpack_pack_true(&pk);
    }
}

/* What a binding does with a response: unpack it and read its status. */
static int decode_response(const void *resp, size_t len)
{
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    int st = COH_EPROTO;
    if (msgpack_unpack_next(&u, resp, len, &off) == MSGPACK_UNPACK_SUCCESS &&
        u.data.type == MSGPACK_OBJECT_MAP)
        for (uint32_t i = 0; i < u.data.via.map.size; i++) {
            msgpack_object *k = &u.data.via.map.ptr[i].key, *v = &u.data.via.map.ptr[i].val;
            if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == 6 &&
                !memcmp(k->via.str.ptr, "status", 6))
                st = v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER ? (int)v->via.i64 : 0;
        }
    msgpack_unpacked_destroy(&u);
    return st;
}

/* Time `iters` blocking allreduces of buf either way; returns us per op. */
static double run_c(coh_comm_t *w, float *buf, size_t n, int iters)
{
    double t0 = now_us();
    for (int i = 0; i < iters; i++) {
        coh_request_t *req;
        if (coh_allreduce(w, NULL, buf, n, COH_F32, COH_SUM, &req) < 0 || coh_wait(req, -1) < 0) {
            fprintf(stderr, "coh_allreduce: %s\n", coh_last_error());
            exit(1);
        }
        coh_request_free(req);
    }
    return (now_us() - t0) / iters;
}

static double run_abi(uint64_t h, msgpack_sbuffer *sb, float *buf, size_t n, int iters)
{
    double t0 = now_us();
    for (int i = 0; i < iters; i++) {
        void *resp;
        size_t len;
        encode_request(sb, buf, n * sizeof(float), false);
        coh_ffi_call(h, sb->data, sb->size, &resp, &len);
        int st = decode_response(resp, len);
        coh_ffi_free(resp);
        if (st < 0) {
            fprintf(stderr, "coh_ffi_call: status %d\n", st);
            exit(1);
        }
    }
    return (now_us() - t0) / iters;
}

/* Submission cost only: async request vs coh_allreduce; waits untimed. */
static void run_submit(uint64_t h, coh_comm_t *w, msgpack_sbuffer *sb, float *buf, size_t n,
                       int iters, double *c_us, double *abi_us)
{
    double tc = 0, ta = 0;
    for (int i = 0; i < iters; i++) {
        coh_request_t *req;
        double t0 = now_us();
        coh_allreduce(w, NULL, buf, n, COH_F32, COH_SUM, &req);
        tc += now_us() - t0;
        coh_wait(req, -1);
        coh_request_free(req);

        void *resp;
        size_t len;
        t0 = now_us();
        encode_request(sb, buf, n * sizeof(float), true);
        coh_ffi_call(h, sb->data, sb->size, &resp, &len);
        msgpack_unpacked u;
        msgpack_unpacked_init(&u);
        size_t off = 0;
        uint64_t rh = 0;
        if (msgpack_unpack_next(&u, resp, len, &off) == MSGPACK_UNPACK_SUCCESS)
            for (uint32_t k = 0; k < u.data.via.map.size; k++) {
                msgpack_object *key = &u.data.via.map.ptr[k].key;
                if (key->via.str.size == 7 && !memcmp(key->via.str.ptr, "request", 7))
                    rh = u.data.via.map.ptr[k].val.via.u64;
            }
        msgpack_unpacked_destroy(&u);
        ta += now_us() - t0;
        coh_ffi_free(resp);
        coh_ffi_wait(h, rh, -1, &resp, &len);
        coh_ffi_free(resp);
    }
    *c_us = tc / iters;
    *abi_us = ta / iters;
}

static int info(uint64_t h, msgpack_sbuffer *sb, int *rank, int *size)
{
    msgpack_sbuffer_clear(sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 1);
    put_str(&pk, "type");
    put_str(&pk, "info");
    void *resp;
    size_t len;
    int st = coh_ffi_call(h, sb->data, sb->size, &resp, &len);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    if (st == 0 && msgpack_unpack_next(&u, resp, len, &off) == MSGPACK_UNPACK_SUCCESS)
        for (uint32_t i = 0; i < u.data.via.map.size; i++) {
            msgpack_object *k = &u.data.via.map.ptr[i].key, *v = &u.data.via.map.ptr[i].val;
            if (k->via.str.size == 4 && !memcmp(k->via.str.ptr, "rank", 4)) *rank = (int)v->via.u64;
            if (k->via.str.size == 4 && !memcmp(k->via.str.ptr, "size", 4)) *size = (int)v->via.u64;
        }
    msgpack_unpacked_destroy(&u);
    coh_ffi_free(resp);
    return st;
}

int main(int argc, char **argv)
{
    size_t sizes[8] = {4096, 64u << 20};
    int nsizes = 2, rounds = 31;
    double round_s = 0.02;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-r") && i + 1 < argc) {
            rounds = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "-t") && i + 1 < argc) {
            round_s = atof(argv[++i]);
        } else if (!strcmp(argv[i], "-s") && i + 1 < argc) {
            nsizes = 0;
            for (char *t = strtok(argv[++i], ","); t && nsizes < 8; t = strtok(NULL, ",")) {
                char *end;
                double v = strtod(t, &end);
                if (*end == 'K' || *end == 'k') v *= 1024;
                if (*end == 'M' || *end == 'm') v *= 1024 * 1024;
                sizes[nsizes++] = (size_t)v;
            }
        } else {
            fprintf(stderr, "usage: %s [-s 4K,64M] [-r rounds] [-t seconds-per-round]\n", argv[0]);
            return 2;
        }
    }
    if (rounds < 1) rounds = 1;
    if (rounds > 255) rounds = 255;

    uint64_t h;
    void *resp;
    size_t rlen;
    if (coh_ffi_create(NULL, 0, &h, &resp, &rlen) < 0) {
        fprintf(stderr, "coh_ffi_create failed (status %d)\n", decode_response(resp, rlen));
        return 1;
    }
    coh_ffi_free(resp);
    coh_comm_t *w;
    if (ff_world_of(h, &w) < 0) return 1;
    int rank = 0, size = 1;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    if (info(h, &sb, &rank, &size) < 0) return 1;

    /* 1. the codec alone */
    float small[1024];
    memset(small, 0, sizeof(small));
    double v[256], u[256];
    for (int r = 0; r < rounds; r++) {
        int iters = 2000;
        double t0 = now_us();
        for (int i = 0; i < iters; i++) {
            encode_request(&sb, small, sizeof(small), false);
            ff_req_t req;
            ff_err_t e = {0};
            ff_shape_t s;
            if (ff_decode_request(sb.data, sb.size, &req, &e) < 0 ||
                ff_resolve(&req, size, &s, &e) < 0) {
                fprintf(stderr, "codec: %s\n", e.msg);
                return 1;
            }
            ff_out_t o;
            msgpack_packer pk;
            ff_out_init(&o, &pk);
            ff_pack_head(&pk, 0, NULL, FF_ALLREDUCE, false, 0, 4);
            ff_pack_kv_bool(&pk, "done", true);
            ff_pack_kv_double(&pk, "time_us", 1.0);
            ff_pack_kv_double(&pk, "abi_us", 1.0);
            ff_pack_str(&pk, "group");
            msgpack_pack_map(&pk, 2);
            ff_pack_kv_int(&pk, "rank", 0);
            ff_pack_kv_int(&pk, "size", size);
            if (decode_response(o.data, o.len) != 0) return 1;
            ff_out_fini(&o);
        }
        v[r] = (now_us() - t0) / iters;
    }
    if (rank == 0)
        printf("# cohort-ffi-bench: world of %d, %d rounds; medians\n"
               "codec: encode request + decode + check + encode response + decode it: "
               "%.2f us\n",
               size, rounds, median(v, rounds));

    /* 2. submission */
    for (int r = 0; r < rounds; r++) run_submit(h, w, &sb, small, 1024, 200, &v[r], &u[r]);
    if (rank == 0)
        printf("submit 4 KiB allreduce: C coh_allreduce %.2f us, ABI (encode + coh_ffi_call "
               "async + decode) %.2f us, overhead %.2f us\n",
               median(v, rounds), median(u, rounds), median(u, rounds) - median(v, rounds));
    fflush(stdout);

    /* 3. blocking allreduce: short rounds that alternate the C API and the
     * ABI, so that the noise of a shared machine lands on both alike. */
    for (int k = 0; k < nsizes; k++) {
        size_t n = sizes[k] / sizeof(float);
        float *buf = calloc(n ? n : 1, sizeof(float));
        if (!buf) return 1;
        run_c(w, buf, n, 3); /* warm up */
        double per = run_c(w, buf, n, 3);
        /* Every rank must run the same count: rank 0's estimate decides. */
        int iters = (int)(round_s * 1e6 / (per > 1 ? per : 1));
        if (iters < 1) iters = 1;
        coh_request_t *req;
        int32_t it = iters;
        coh_broadcast(w, &it, 1, COH_I32, 0, &req);
        coh_wait(req, -1);
        coh_request_free(req);
        iters = it;
        for (int r = 0; r < rounds; r++) {
            v[r] = run_c(w, buf, n, iters);
            u[r] = run_abi(h, &sb, buf, n, iters);
        }
        double c = median(v, rounds), a = median(u, rounds);
        if (rank == 0)
            printf("allreduce %9zu B: C %10.2f us/op, ABI %10.2f us/op, overhead %+8.2f us "
                   "(%+.1f%%); %d rounds of %d ops\n",
                   sizes[k], c, a, a - c, 100 * (a - c) / c, rounds, iters);
        fflush(stdout);
        free(buf);
    }
    msgpack_sbuffer_destroy(&sb);
    coh_ffi_destroy(h, NULL, NULL);
    return 0;
}
