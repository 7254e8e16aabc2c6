/*
 * cohort-gpubench - the device runtime's reduction kernels against its
 * memory bandwidth (issue 16's kernel figure), and the pinned copies the
 * staged path pays:
 *
 *   COHORT_GPU=cuda cohort-gpubench [-b 1M] [-e 256M] [-n 20]
 *
 * Per size (f32 sum, then every dtype at the largest size):
 *   reduce  dst = a + b on the device: 3 bytes moved per byte of dst;
 *   copy    device to device: 2 bytes moved per byte;
 *   d2h/h2d pinned host memory to and from the device.
 * GB/s are bytes moved per second; "of copy" is reduce's rate over the
 * copy's: how close the kernel comes to what the memory gives. With
 * COHORT_GPU=host it measures the emulation (the CPU kernels on a stream
 * thread), not a GPU.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu/gpu_dev.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static size_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'K': v *= 1024; break;
    case 'M': v *= 1024 * 1024; break;
    case 'G': v *= 1024.0 * 1024 * 1024; break;
    default: break;
    }
    return (size_t)v;
}

static const gpu_dev_t *D;

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

__attribute__((noreturn)) static void die(const char *what)
{
    fprintf(stderr, "cohort-gpubench: %s: %s\n", what, D->last_error());
    exit(1);
}

/* Seconds per call of fn over iters calls (after one warm-up), synced. */
typedef int (*op_fn)(void *dst, void *a, void *b, size_t bytes, coh_dtype dt);

static int do_reduce(void *dst, void *a, void *b, size_t bytes, coh_dtype dt)
{
    return D->reduce(dt, COH_SUM, dst, a, b, bytes / coh_dtype_size(dt), NULL);
}

static int do_copy(void *dst, void *a, void *b, size_t bytes, coh_dtype dt)
{
    (void)b;
    (void)dt;
    return D->copy(dst, a, bytes, NULL);
}

static double time_op(op_fn fn, void *dst, void *a, void *b, size_t bytes, coh_dtype dt, int iters)
{
    if (fn(dst, a, b, bytes, dt) < 0 || D->stream_sync(NULL) < 0) die("warm-up");
    double t0 = now_s();
    for (int i = 0; i < iters; i++)
        if (fn(dst, a, b, bytes, dt) < 0) die("launch");
    if (D->stream_sync(NULL) < 0) die("sync");
    return (now_s() - t0) / iters;
}

int main(int argc, char **argv)
{
    size_t lo = 1u << 20, hi = 256u << 20;
    int iters = 20;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-b"))
            lo = parse_size(argv[i + 1]);
        else if (!strcmp(argv[i], "-e"))
            hi = parse_size(argv[i + 1]);
        else if (!strcmp(argv[i], "-n"))
            iters = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: cohort-gpubench [-b SIZE] [-e SIZE] [-n ITERS]\n");
            return 2;
        }
    }
    const char *why = "";
    const char *mode = getenv("COHORT_GPU") ? getenv("COHORT_GPU") : "auto";
    D = gpu_dev_pick(mode, &why);
    if (!D) {
        fprintf(stderr, "cohort-gpubench: COHORT_GPU=%s: %s\n", mode, why);
        return 77;
    }
    void *a = NULL, *b = NULL, *d = NULL, *h = NULL;
    if (D->dev_alloc(&a, hi) < 0 || D->dev_alloc(&b, hi) < 0 || D->dev_alloc(&d, hi) < 0 ||
        D->host_alloc(&h, hi) < 0)
        die("allocating");
    memset(h, 0, hi);
    if (D->copy(a, h, hi, NULL) < 0 || D->copy(b, h, hi, NULL) < 0 || D->stream_sync(NULL) < 0)
        die("filling");
    printf("# runtime %s, %d iterations per size\n", D->name, iters);
    printf("# %12s %10s %10s %8s %10s %10s\n", "bytes", "reduce", "copy", "of copy", "d2h", "h2d");
    printf("# %12s %10s %10s %8s %10s %10s\n", "", "(GB/s)", "(GB/s)", "", "(GB/s)", "(GB/s)");
    for (size_t n = lo; n <= hi; n *= 2) {
        double tr = time_op(do_reduce, d, a, b, n, COH_F32, iters);
        double tc = time_op(do_copy, d, a, NULL, n, COH_F32, iters);
        double td = time_op(do_copy, h, a, NULL, n, COH_F32, iters);
        double tu = time_op(do_copy, d, h, NULL, n, COH_F32, iters);
        double gr = 3.0 * (double)n / tr / 1e9, gc = 2.0 * (double)n / tc / 1e9;
        printf("  %12zu %10.1f %10.1f %8.2f %10.1f %10.1f\n", n, gr, gc, gr / gc,
               (double)n / td / 1e9, (double)n / tu / 1e9);
    }
    static const coh_dtype dts[] = {COH_F32, COH_F64, COH_F16, COH_BF16, COH_I32, COH_I64, COH_U8};
    printf("# reduce (sum) by dtype at %zu bytes, GB/s moved\n", hi);
    for (size_t t = 0; t < sizeof(dts) / sizeof(dts[0]); t++)
        printf("  %-6s %10.1f\n", coh_dtype_name(dts[t]),
               3.0 * (double)hi / time_op(do_reduce, d, a, b, hi, dts[t], iters) / 1e9);
    /* What a small op on the IPC path pays per step (docs/gpu.md): a
     * tiny kernel from launch to its event seen complete by polling, the
     * IPC handle of a buffer, one event query. Medians of 200. */
    enum { LAT = 200 };
    double lat[3][LAT];
    void *s = NULL, *ev = NULL;
    if (D->stream_new(&s) < 0 || D->event_new(&ev) < 0) die("stream");
    for (int i = 0; i < LAT; i++) {
        double t0 = now_s();
        if (D->reduce(COH_F32, COH_SUM, d, a, b, 256, s) < 0 || D->event_record(ev, s) < 0)
            die("launch");
        while (D->event_query(ev) == 0) {
        }
        double t1 = now_s();
        gpu_ipc_t hd;
        if (D->ipc_get && D->ipc_get(d, &hd) < 0) die("ipc_get");
        double t2 = now_s();
        D->event_query(ev);
        double t3 = now_s();
        lat[0][i] = t1 - t0;
        lat[1][i] = t2 - t1;
        lat[2][i] = t3 - t2;
    }
    static const char *const lname[] = {"kernel launch to event seen",
                                        "ipc_get (a buffer's handle)", "event_query"};
    printf("# per-call latency (us, median of %d)\n", LAT);
    for (int k = 0; k < 3; k++) {
        qsort(lat[k], LAT, sizeof(double), cmp_double);
        printf("  %-30s %8.2f\n", lname[k], lat[k][LAT / 2] * 1e6);
    }
    D->event_free(ev);
    D->stream_free(s);
    D->dev_free(a);
    D->dev_free(b);
    D->dev_free(d);
    D->host_free(h);
    return 0;
}
