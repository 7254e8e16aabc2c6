/*
 * The device interface (gpu/gpu_dev.h), run against one implementation:
 *
 *   test_gpu_dev host   the emulation (every machine)
 *   test_gpu_dev cuda   the CUDA runtime and kernels (label gpu; 77 without
 *                       a device)
 *
 * What the staging pipeline relies on: events stay pending until their
 * stream gets there, a stream runs its work in order, stream_wait orders
 * one stream after another's event, wait_value holds a stream until the
 * host sets a flag, is_device tells device from host
 * memory, work on table operands reads the table when it runs, and the device reduction equals the
 * CPU kernel bit for bit for every dtype and op (random bit patterns: NaN, infinities, subnormals,
 * integer overflow), a NaN result matching any NaN (IEEE leaves payloads
 * open; a GPU gives its canonical NaN).
 */
#include <setjmp.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "gpu/gpu.h"
#include "gpu/gpu_dev.h"

static const gpu_dev_t *D;

#define OK(expr) assert_int_equal((expr), 0)

typedef struct gate {
    _Atomic int open;
    _Atomic int ran;
} gate_t;

/* Holds its stream until the test opens the gate. */
static void gate_fn(void *arg)
{
    gate_t *g = arg;
    while (!g->open) usleep(100);
    g->ran = 1;
}

static int wait_event(void *ev, int ms)
{
    for (int i = 0; i < ms * 10; i++) {
        int q = D->event_query(ev);
        if (q != 0) return q;
        usleep(100);
    }
    return 0;
}

static void test_event_pending_until_stream_gets_there(void **state)
{
    (void)state;
    void *s, *ev;
    OK(D->stream_new(&s));
    OK(D->event_new(&ev));
    assert_int_equal(D->event_query(ev), 1); /* never recorded: complete */
    gate_t g = {0};
    OK(D->host_fn(s, gate_fn, &g));
    OK(D->event_record(ev, s));
    usleep(20000);
    assert_int_equal(D->event_query(ev), 0);
    g.open = 1;
    assert_int_equal(wait_event(ev, 5000), 1);
    assert_int_equal(g.ran, 1);
    D->event_free(ev);
    D->stream_free(s);
}

static void test_stream_order_and_wait(void **state)
{
    (void)state;
    const size_t n = 1 << 20;
    void *s1, *s2, *ev, *d;
    OK(D->stream_new(&s1));
    OK(D->stream_new(&s2));
    OK(D->event_new(&ev));
    OK(D->dev_alloc(&d, n));
    /* Pinned: CUDA copies pageable memory synchronously, after the stream's
     * earlier work, so this thread would wait for the gate it opens. */
    unsigned char *a, *b;
    OK(D->host_alloc((void **)&a, n));
    OK(D->host_alloc((void **)&b, n));
    memset(a, 0x5a, n);
    memset(b, 0, n);
    gate_t g = {0};
    /* s1: wait at the gate, then a -> d; s2 waits for s1's event, then d -> b. */
    OK(D->host_fn(s1, gate_fn, &g));
    OK(D->copy(d, a, n, s1));
    OK(D->event_record(ev, s1));
    OK(D->stream_wait(s2, ev));
    OK(D->copy(b, d, n, s2));
    usleep(20000);
    assert_int_equal(b[0], 0); /* nothing moved while s1 is held */
    g.open = 1;
    OK(D->stream_sync(s2));
    assert_memory_equal(a, b, n);
    D->dev_free(d);
    D->event_free(ev);
    D->stream_free(s1);
    D->stream_free(s2);
    D->host_free(a);
    D->host_free(b);
}

/* wait_value holds the stream until the host sets the flag; nothing on the
 * host waits meanwhile (coh_request_stream_wait's mechanism). */
static void test_wait_value(void **state)
{
    (void)state;
    const size_t n = 1 << 16;
    void *s, *ev, *d, *f;
    OK(D->stream_new(&s));
    OK(D->event_new(&ev));
    OK(D->dev_alloc(&d, n));
    OK(D->host_alloc(&f, 64));
    unsigned char *a, *b;
    OK(D->host_alloc((void **)&a, n));
    OK(D->host_alloc((void **)&b, n));
    memset(a, 0x33, n);
    memset(b, 0, n);
    volatile uint32_t *flag = f;
    *flag = 0;
    OK(D->wait_value(s, flag, 2));
    OK(D->copy(d, a, n, s));
    OK(D->copy(b, d, n, s));
    OK(D->event_record(ev, s));
    usleep(20000);
    assert_int_equal(D->event_query(ev), 0);
    __atomic_store_n(flag, 1u, __ATOMIC_RELEASE); /* below the value: still held */
    usleep(20000);
    assert_int_equal(D->event_query(ev), 0);
    assert_int_equal(b[0], 0);
    __atomic_store_n(flag, 2u, __ATOMIC_RELEASE);
    assert_int_equal(wait_event(ev, 5000), 1);
    assert_memory_equal(a, b, n);
    D->host_free(a);
    D->host_free(b);
    D->host_free(f);
    D->dev_free(d);
    D->event_free(ev);
    D->stream_free(s);
}

static void test_is_device(void **state)
{
    (void)state;
    void *d;
    int dev = -1;
    OK(D->dev_alloc(&d, 4096));
    assert_int_equal(D->is_device(d, &dev), 1);
    assert_int_equal(dev, 0);
    assert_int_equal(D->is_device((char *)d + 4000, NULL), 1);
    char host[16];
    assert_int_equal(D->is_device(host, NULL), 0);
    void *p;
    OK(D->host_alloc(&p, 4096));
    assert_int_equal(D->is_device(p, NULL), 0);
    D->host_free(p);
    D->dev_free(d);
}

/* Element i of two buffers is the same: the same bits, or both NaN (a
 * NaN's payload is left open by IEEE: a GPU returns its canonical NaN,
 * x86 the first operand's). */
static bool is_nan(coh_dtype dt, const unsigned char *p)
{
    uint64_t u = 0;
    memcpy(&u, p, coh_dtype_size(dt));
    switch (dt) {
    case COH_F32: return (u & 0x7f800000u) == 0x7f800000u && (u & 0x7fffffu);
    case COH_F64:
        return (u & 0x7ff0000000000000ull) == 0x7ff0000000000000ull && (u & 0xfffffffffffffull);
    case COH_F16: return (u & 0x7c00u) == 0x7c00u && (u & 0x3ffu);
    case COH_BF16: return (u & 0x7f80u) == 0x7f80u && (u & 0x7fu);
    default: return false;
    }
}

/* The first element where want and got differ (NaN = NaN), or n. */
static size_t first_diff(coh_dtype dt, const unsigned char *want, const unsigned char *got,
                         size_t n)
{
    size_t es = coh_dtype_size(dt);
    for (size_t i = 0; i < n; i++) {
        const unsigned char *w = want + i * es, *g = got + i * es;
        if (memcmp(w, g, es) && !(is_nan(dt, w) && is_nan(dt, g))) return i;
    }
    return n;
}

/* Random bits: every float class appears (NaN, inf, subnormals, zeros). */
static void fill_random(void *buf, size_t bytes, unsigned *seed)
{
    unsigned char *p = buf;
    for (size_t i = 0; i < bytes; i++) p[i] = (unsigned char)(rand_r(seed) >> 7);
}

static void test_reduce_matches_cpu(void **state)
{
    (void)state;
    static const coh_dtype dts[] = {COH_F32, COH_F64, COH_F16, COH_BF16, COH_I32, COH_I64, COH_U8};
    static const coh_redop ops[] = {COH_SUM, COH_AVG, COH_PROD, COH_MIN, COH_MAX};
    const size_t n = 100003; /* not a multiple of a block */
    unsigned seed = 7;
    for (size_t t = 0; t < sizeof(dts) / sizeof(dts[0]); t++) {
        size_t bytes = n * coh_dtype_size(dts[t]);
        unsigned char *a = malloc(bytes), *b = malloc(bytes), *want = malloc(bytes),
                      *got = malloc(bytes);
        void *da, *db, *dd;
        OK(D->dev_alloc(&da, bytes));
        OK(D->dev_alloc(&db, bytes));
        OK(D->dev_alloc(&dd, bytes));
        for (size_t o = 0; o < sizeof(ops) / sizeof(ops[0]); o++) {
            fill_random(a, bytes, &seed);
            fill_random(b, bytes, &seed);
            OK(gpu_cpu_reduce(dts[t], ops[o], want, a, b, n));
            OK(D->copy(da, a, bytes, NULL));
            OK(D->copy(db, b, bytes, NULL));
            OK(D->reduce(dts[t], ops[o], dd, da, db, n, NULL));
            OK(D->copy(got, dd, bytes, NULL));
            OK(D->stream_sync(NULL));
            size_t i = first_diff(dts[t], want, got, n);
            if (i < n)
                fail_msg("%s %s: element %zu differs from the CPU kernel's", coh_dtype_name(dts[t]),
                         coh_redop_name(ops[o]), i);
            /* in place, dst == a */
            OK(D->reduce(dts[t], ops[o], da, da, db, n, NULL));
            OK(D->copy(got, da, bytes, NULL));
            OK(D->stream_sync(NULL));
            assert_int_equal(first_diff(dts[t], want, got, n), n);
            /* one element in: not 16-byte aligned (CUDA: the element-wise kernel) */
            size_t es = coh_dtype_size(dts[t]);
            OK(D->copy(da, a, bytes, NULL));
            OK(D->reduce(dts[t], ops[o], (char *)dd + es, (char *)da + es, (char *)db + es, n - 1,
                         NULL));
            OK(D->copy(got, dd, bytes, NULL));
            OK(D->stream_sync(NULL));
            assert_int_equal(first_diff(dts[t], want + es, got + es, n - 1), n - 1);
        }
        D->dev_free(da);
        D->dev_free(db);
        D->dev_free(dd);
        free(a);
        free(b);
        free(want);
        free(got);
    }
}

static void test_div_matches_cpu(void **state)
{
    (void)state;
    static const coh_dtype dts[] = {COH_F32, COH_F64, COH_F16, COH_BF16, COH_I32, COH_I64, COH_U8};
    static const double divs[] = {3, 7, -1, 255};
    const size_t n = 50001;
    unsigned seed = 11;
    for (size_t t = 0; t < sizeof(dts) / sizeof(dts[0]); t++)
        for (size_t k = 0; k < sizeof(divs) / sizeof(divs[0]); k++) {
            if (gpu_div_check(dts[t], divs[k]) < 0) {
                void *d;
                OK(D->dev_alloc(&d, 64));
                assert_true(D->div(dts[t], d, 4, divs[k], NULL) < 0);
                D->dev_free(d);
                continue;
            }
            size_t bytes = n * coh_dtype_size(dts[t]);
            unsigned char *want = malloc(bytes), *got = malloc(bytes);
            fill_random(want, bytes, &seed);
            void *d;
            OK(D->dev_alloc(&d, bytes));
            OK(D->copy(d, want, bytes, NULL));
            OK(D->div(dts[t], d, n, divs[k], NULL));
            OK(D->copy(got, d, bytes, NULL));
            OK(D->stream_sync(NULL));
            OK(gpu_cpu_div(dts[t], want, n, divs[k]));
            if (first_diff(dts[t], want, got, n) < n)
                fail_msg("div %s by %g differs from the CPU's", coh_dtype_name(dts[t]), divs[k]);
            D->dev_free(d);
            free(want);
            free(got);
        }
}

/* Work on table operands (gpu_ref_t), queued before the table holds the
 * addresses, as the IPC path queues its kernels at submission: behind a
 * flag, then the table copied from pinned memory to the device
 * (copy_mapped: read when it runs). The host fills the table and sets the
 * flag later. Each dtype with SUM and MAX, at
 * aligned and odd offsets; a copy; a division; and a table that says skip
 * leaves everything as it was. */
static void test_ref_ops(void **state)
{
    (void)state;
    static const coh_dtype dts[] = {COH_F32, COH_F64, COH_F16, COH_BF16, COH_I32, COH_I64, COH_U8};
    static const coh_redop ops[] = {COH_SUM, COH_MAX};
    const size_t n = 70001;
    unsigned seed = 13;
    void *s, *f, *ht, *dt;
    OK(D->stream_new(&s));
    OK(D->host_alloc(&f, 64));
    OK(D->host_alloc(&ht, 8 * sizeof(uint64_t)));
    OK(D->dev_alloc(&dt, 8 * sizeof(uint64_t)));
    volatile uint32_t *flag = f;
    uint64_t *tab = ht;
    for (size_t t = 0; t < sizeof(dts) / sizeof(dts[0]); t++)
        for (size_t o = 0; o < 2; o++)
            for (int skip = 0; skip < 2; skip++) {
                size_t es = coh_dtype_size(dts[t]), bytes = n * es;
                size_t off = (o + (size_t)skip) % 2 ? es : 0; /* odd: the element-wise path */
                size_t m = n - off / es;
                unsigned char *a = malloc(bytes), *b = malloc(bytes), *want = malloc(bytes),
                              *got = malloc(bytes), *c = malloc(bytes);
                void *da, *db, *dd, *dc;
                OK(D->dev_alloc(&da, bytes));
                OK(D->dev_alloc(&db, bytes));
                OK(D->dev_alloc(&dd, bytes));
                OK(D->dev_alloc(&dc, bytes));
                fill_random(a, bytes, &seed);
                fill_random(b, bytes, &seed);
                fill_random(c, bytes, &seed);
                OK(D->copy(da, a, bytes, NULL));
                OK(D->copy(db, b, bytes, NULL));
                OK(D->copy(dd, c, bytes, NULL));
                OK(D->copy(dc, c, bytes, NULL));
                OK(D->stream_sync(NULL));
                *flag = 0;
                memset(tab, 0, 8 * sizeof(uint64_t));
                OK(D->wait_value(s, flag, 1));
                OK(D->copy_mapped(dt, tab, 8 * sizeof(uint64_t), s));
                /* dd = a op b; dc = dd (bytes); dc /= 3 where the dtype allows */
                gpu_ref_t rd = {1, off}, ra = {2, off}, rb = {3, off}, rc = {4, off};
                OK(D->reduce_ref(dts[t], ops[o], dt, rd, ra, rb, m, s));
                OK(D->copy_ref(dt, rc, rd, m * es, s));
                bool div = gpu_div_check(dts[t], 3) == 0;
                if (div) OK(D->div_ref(dts[t], dt, rc, m, 3, s));
                usleep(10000); /* the work is queued, the table not yet filled */
                tab[0] = (uint64_t)skip;
                tab[1] = (uint64_t)(uintptr_t)dd;
                tab[2] = (uint64_t)(uintptr_t)da;
                tab[3] = (uint64_t)(uintptr_t)db;
                tab[4] = (uint64_t)(uintptr_t)dc;
                __atomic_store_n(flag, 1u, __ATOMIC_RELEASE);
                OK(D->stream_sync(s));
                if (skip) {
                    memcpy(want, c, bytes);
                } else {
                    memcpy(want, c, off);
                    OK(gpu_cpu_reduce(dts[t], ops[o], want + off, a + off, b + off, m));
                }
                OK(D->copy(got, dd, bytes, NULL));
                OK(D->stream_sync(NULL));
                if (first_diff(dts[t], want, got, n) < n)
                    fail_msg("%s %s at %zu (skip %d): the reduction differs",
                             coh_dtype_name(dts[t]), coh_redop_name(ops[o]), off, skip);
                if (div && !skip) OK(gpu_cpu_div(dts[t], want + off, m, 3));
                OK(D->copy(got, dc, bytes, NULL));
                OK(D->stream_sync(NULL));
                if (first_diff(dts[t], want, got, n) < n)
                    fail_msg("%s %s at %zu (skip %d): the copy or division differs",
                             coh_dtype_name(dts[t]), coh_redop_name(ops[o]), off, skip);
                D->dev_free(da);
                D->dev_free(db);
                D->dev_free(dd);
                D->dev_free(dc);
                free(a);
                free(b);
                free(c);
                free(want);
                free(got);
            }
    D->dev_free(dt);
    D->host_free(ht);
    D->host_free(f);
    D->stream_free(s);
}

/* The emulation's IPC within one process (CUDA refuses a process its own
 * handles; mp.gpu.cuda runs it across processes): a second mapping of the
 * same allocation sees what the first wrote, at the handle's offset. */
static void test_ipc_emulated(void **state)
{
    (void)state;
    if (strcmp(D->name, "host")) skip();
    void *d, *base;
    OK(D->dev_alloc(&d, 1 << 16));
    gpu_ipc_t h;
    OK(D->ipc_get((char *)d + 4096, &h));
    assert_int_equal(h.offset, 4096);
    OK(D->ipc_open(&h, &base));
    assert_ptr_not_equal(base, d);
    assert_int_equal(D->is_device(base, NULL), 1);
    char msg[] = "through another mapping", out[sizeof(msg)] = {0};
    OK(D->copy((char *)d + 4096, msg, sizeof(msg), NULL));
    OK(D->copy(out, (char *)base + h.offset, sizeof(out), NULL));
    OK(D->stream_sync(NULL));
    assert_string_equal(out, msg);
    D->ipc_close(base);
    D->dev_free(d);
    /* A freed allocation's handle does not open another that took its place. */
    void *d2;
    OK(D->dev_alloc(&d2, 1 << 16));
    assert_true(D->ipc_open(&h, &base) < 0);
    D->dev_free(d2);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    void *d;
    OK(D->dev_alloc(&d, 64));
    assert_true(D->reduce((coh_dtype)99, COH_SUM, d, d, d, 4, NULL) < 0);
    assert_true(D->reduce(COH_F32, (coh_redop)99, d, d, d, 4, NULL) < 0);
    if (!strcmp(D->name, "host")) { /* the emulation bounds copies by their allocation */
        char h[128];
        assert_true(D->copy(h, d, 128, NULL) < 0);
        assert_true(D->last_error()[0] != 0);
    }
    D->dev_free(d);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "host", *why = "";
    D = gpu_dev_pick(mode, &why);
    if (!D) {
        printf("SKIP: %s: %s\n", mode, why);
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_event_pending_until_stream_gets_there),
        cmocka_unit_test(test_stream_order_and_wait),
        cmocka_unit_test(test_wait_value),
        cmocka_unit_test(test_is_device),
        cmocka_unit_test(test_reduce_matches_cpu),
        cmocka_unit_test(test_div_matches_cpu),
        cmocka_unit_test(test_ref_ops),
        cmocka_unit_test(test_ipc_emulated),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests_name(D->name, tests, NULL, NULL);
}
