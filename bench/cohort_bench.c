/*
 * cohort-bench - collective bandwidth and latency, nccl-tests style.
 *
 *   cohortrun -n 4 -- cohort-bench -b 4K -e 64M -f 2 -n 20 -w 5 -c 1 -o sum -d float
 *
 * Every iteration is timed on every rank; an iteration's time is the
 * slowest rank's, and a size's time is the median over iterations (robust
 * to the noise of a shared machine). algbw = bytes / time; busbw scales it
 * by what each link must carry: 2(n-1)/n for allreduce, (n-1)/n for
 * allgather and reduce-scatter, 1 for broadcast (nccl-tests' definitions).
 * As in nccl-tests, allgather and reduce-scatter sizes are the whole
 * gathered buffer.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "cohort.h"
#include "peers/peers_common.h" /* pb_cpu_s */

typedef enum { C_ALLREDUCE, C_BROADCAST, C_ALLGATHER, C_REDUCE_SCATTER } coll_t;

static struct {
    uint64_t minb, maxb, step;
    double factor;
    int iters, warmup, check, csv, root, pct, times, device, span, compute_threads;
    double loss_bound, pull_bound;
    coh_redop op;
    coh_dtype dtype;
    coll_t coll;
} o = {.minb = 32 << 20,
       .maxb = 32 << 20,
       .factor = 2,
       .iters = 20,
       .warmup = 5,
       .check = 1,
       .op = COH_SUM,
       .dtype = COH_F32,
       .coll = C_ALLREDUCE};

static int R, N;
static coh_comm_t *W;

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int parse_size(const char *s, uint64_t *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || v < 0) return -1;
    switch (*end) {
    case 'k':
    case 'K':
        v *= 1024;
        end++;
        break;
    case 'm':
    case 'M':
        v *= 1024 * 1024;
        end++;
        break;
    case 'g':
    case 'G':
        v *= 1024.0 * 1024 * 1024;
        end++;
        break;
    default: break;
    }
    if (*end == 'B' || *end == 'b') end++;
    if (*end) return -1;
    *out = (uint64_t)v;
    return 0;
}

static int parse_dtype(const char *s, coh_dtype *d)
{
    static const struct {
        const char *name;
        coh_dtype d;
    } t[] = {{"float", COH_F32}, {"f32", COH_F32},  {"double", COH_F64},    {"f64", COH_F64},
             {"half", COH_F16},  {"f16", COH_F16},  {"bfloat16", COH_BF16}, {"bf16", COH_BF16},
             {"int32", COH_I32}, {"int", COH_I32},  {"i32", COH_I32},       {"int64", COH_I64},
             {"i64", COH_I64},   {"uint8", COH_U8}, {"u8", COH_U8}};
    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
        if (!strcmp(s, t[i].name)) {
            *d = t[i].d;
            return 0;
        }
    return -1;
}

static int parse_op(const char *s, coh_redop *op)
{
    static const char *names[] = {"sum", "avg", "min", "max", "prod"};
    for (int i = 0; i < COH_REDOP_COUNT; i++)
        if (!strcmp(s, names[i])) {
            *op = (coh_redop)i;
            return 0;
        }
    return -1;
}

static void usage(void)
{
    fprintf(
        stderr,
        "usage: cohortrun -n N -- cohort-bench [options]\n"
        "  -b SIZE   minimum size in bytes (4K, 1M, ...; default 32M)\n"
        "  -e SIZE   maximum size (default 32M)\n"
        "  -f F      multiply the size by F between runs (default 2)\n"
        "  -i SIZE   add SIZE between runs instead of -f\n"
        "  -n N      timed iterations per size (default 20)\n"
        "  -w N      warm-up iterations (default 5)\n"
        "  -c 0|1    check the results (default 1)\n"
        "  -o OP     sum, avg, min, max, prod (default sum)\n"
        "  -d TYPE   float, double, half, bfloat16, int32, int64, uint8 (default float)\n"
        "  -C COLL   allreduce, broadcast, allgather, reduce_scatter (default allreduce)\n"
        "  -r ROOT   broadcast root (default 0)\n"
        "  --csv     rank 0 prints CSV: op,bytes,count,dtype,nranks,time_us,algbw_GBps,"
        "busbw_GBps\n"
        "  --pct     rank 0 also prints 'pct,bytes,p50_us,p90_us,p99_us,max_us,lost,mean_us' per "
        "size\n"
        "            (iteration times: the slowest rank's; lost: the fraction of datagram\n"
        "            receive bytes lost, over every rank)\n"
        "  --span    rank 0 also prints 'span,bytes,p50_us,p90_us,mean_us,period_us': per\n"
        "            iteration the last rank in to the last rank out (one host only), and\n"
        "            rank 0's time per iteration over the run (peers_common.h)\n"
        "  --times   rank 0 also prints 'times,bytes,t1_us,t2_us,...': every timed iteration,\n"
        "            the slowest rank's, in order (where a tail comes from)\n"
        "  --compute-threads K  K threads per rank compute for the whole run (a trainer's\n"
        "            compute beside its collectives); rank 0 prints 'compute,bytes,gflops'\n"
        "            per size: what they did over the timed iterations, all ranks "
        "(peers_common.h)\n"
        "  --mem M   host (default) or device: the buffers are device memory (coh_mem_alloc;\n"
        "            COHORT_GPU, docs/gpu.md), staged through pinned host memory\n"
        "  --loss-bound X  allreduce through coh_allreduce_ex with this loss bound (udp\n"
        "            rails, docs/udp.md); the check then counts short elements, not failures\n");
    exit(2);
}

/* Small integers: exact in every dtype, so the check is exact. */
static double in_val(int r, size_t i)
{
    return (double)((r + (int)(i % 7)) % 5) - 2.0;
}

static void put(void *b, size_t i, double v)
{
    switch (o.dtype) {
    case COH_F32: ((float *)b)[i] = (float)v; break;
    case COH_F64: ((double *)b)[i] = v; break;
    case COH_I32: ((int32_t *)b)[i] = (int32_t)v; break;
    case COH_I64: ((int64_t *)b)[i] = (int64_t)v; break;
    case COH_U8: ((uint8_t *)b)[i] = (uint8_t)(v + 2); break;
    default: { /* f16 / bf16: exact small integers */
        float f = (float)v;
        uint32_t x;
        memcpy(&x, &f, 4);
        uint16_t h;
        if (o.dtype == COH_BF16) {
            h = (uint16_t)(x >> 16);
        } else if (v == 0) {
            h = 0;
        } else {
            int e;
            double m = frexp(fabs(v), &e); /* v = m * 2^e, m in [0.5,1) */
            h = (uint16_t)((v < 0 ? 0x8000 : 0) | ((e - 1 + 15) << 10) |
                           ((unsigned)((m * 2 - 1) * 1024) & 0x3ff));
        }
        ((uint16_t *)b)[i] = h;
    }
    }
}

static double get(const void *b, size_t i)
{
    switch (o.dtype) {
    case COH_F32: return ((const float *)b)[i];
    case COH_F64: return ((const double *)b)[i];
    case COH_I32: return ((const int32_t *)b)[i];
    case COH_I64: return (double)((const int64_t *)b)[i];
    case COH_U8: return ((const uint8_t *)b)[i] - 2.0 * 1; /* see put */
    default: {
        uint16_t h = ((const uint16_t *)b)[i];
        if (o.dtype == COH_BF16) {
            uint32_t x = (uint32_t)h << 16;
            float f;
            memcpy(&f, &x, 4);
            return f;
        }
        int e = (h >> 10) & 0x1f, m = h & 0x3ff;
        double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
        return (h & 0x8000) ? -v : v;
    }
    }
}

static double reduce_expect(size_t i)
{
    double acc = in_val(0, i);
    for (int r = 1; r < N; r++) {
        double v = in_val(r, i);
        switch (o.op) {
        case COH_SUM:
        case COH_AVG: acc += v; break;
        case COH_MIN: acc = v < acc ? v : acc; break;
        case COH_MAX: acc = v > acc ? v : acc; break;
        case COH_PROD: acc *= v; break;
        default: break;
        }
    }
    return acc;
}

static int run_one(void *send, void *recv, size_t count, coh_request_t **req)
{
    coh_coll_opts_t co = {.mem = o.device ? COH_MEM_DEVICE : COH_MEM_HOST};
    switch (o.coll) {
    case C_ALLREDUCE: {
        coh_allreduce_opts_t ao = {
            .loss_bound = o.loss_bound, .pull_loss_bound = o.pull_bound, .mem = co.mem};
        return coh_allreduce_ex(W, send, recv, count, o.dtype, o.op, &ao, req);
    }
    case C_BROADCAST: return coh_broadcast_ex(W, recv, count, o.dtype, o.root, &co, req);
    case C_ALLGATHER: return coh_allgather_ex(W, send, recv, count, o.dtype, &co, req);
    case C_REDUCE_SCATTER:
        return coh_reduce_scatter_ex(W, send, recv, count, o.dtype, o.op, &co, req);
    }
    return COH_EINVAL;
}

static void die(const char *what, int st, coh_request_t *req)
{
    fprintf(stderr, "cohort-bench rank %d: %s: %s: %s\n", R, what, coh_status_name(st),
            req ? coh_request_error(req) : coh_last_error());
    exit(1);
}

static long check(const void *recv, size_t count)
{
    long wrong = 0;
    for (size_t i = 0; i < count; i++) {
        double want;
        switch (o.coll) {
        case C_ALLREDUCE: want = reduce_expect(i); break;
        case C_BROADCAST: want = in_val(o.root, i); break;
        case C_ALLGATHER:
            want = in_val((int)(i / (count / (size_t)N)), i % (count / (size_t)N));
            break;
        default: want = reduce_expect((size_t)R * count + i); break;
        }
        if (o.coll != C_BROADCAST && o.coll != C_ALLGATHER && o.op == COH_AVG) {
            want /= N;
            if (o.dtype == COH_I32 || o.dtype == COH_I64 || o.dtype == COH_U8) want = trunc(want);
        }
        if (o.dtype == COH_U8 && o.coll != C_BROADCAST && o.coll != C_ALLGATHER) continue;
        double got = get(recv, i);
        if (fabs(got - want) > 1e-3 * (fabs(want) > 1 ? fabs(want) : 1)) wrong++;
    }
    return wrong;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--csv")) {
            o.csv = 1;
            continue;
        }
        if (!strcmp(a, "--mem") && v) {
            if (strcmp(v, "host") && strcmp(v, "device")) usage();
            o.device = !strcmp(v, "device");
            i++;
            continue;
        }
        if (!strcmp(a, "--pct")) {
            o.pct = 1;
            continue;
        }
        if (!strcmp(a, "--times")) {
            o.times = 1;
            continue;
        }
        if (!strcmp(a, "--span")) {
            o.span = 1;
            continue;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help") || !v) usage();
        i++;
        if (!strcmp(a, "-b")) {
            if (parse_size(v, &o.minb)) usage();
        } else if (!strcmp(a, "-e")) {
            if (parse_size(v, &o.maxb)) usage();
        } else if (!strcmp(a, "-i")) {
            if (parse_size(v, &o.step)) usage();
        } else if (!strcmp(a, "-f")) {
            o.factor = atof(v);
        } else if (!strcmp(a, "-n")) {
            o.iters = atoi(v);
        } else if (!strcmp(a, "-w")) {
            o.warmup = atoi(v);
        } else if (!strcmp(a, "-c")) {
            o.check = atoi(v);
        } else if (!strcmp(a, "--compute-threads")) {
            o.compute_threads = atoi(v);
        } else if (!strcmp(a, "--loss-bound")) {
            o.loss_bound = atof(v);
        } else if (!strcmp(a, "--pull-bound")) {
            o.pull_bound = atof(v);
        } else if (!strcmp(a, "-r")) {
            o.root = atoi(v);
        } else if (!strcmp(a, "-o")) {
            if (parse_op(v, &o.op)) usage();
        } else if (!strcmp(a, "-d")) {
            if (parse_dtype(v, &o.dtype)) usage();
        } else if (!strcmp(a, "-C")) {
            if (!strcmp(v, "allreduce"))
                o.coll = C_ALLREDUCE;
            else if (!strcmp(v, "broadcast"))
                o.coll = C_BROADCAST;
            else if (!strcmp(v, "allgather"))
                o.coll = C_ALLGATHER;
            else if (!strcmp(v, "reduce_scatter"))
                o.coll = C_REDUCE_SCATTER;
            else
                usage();
        } else {
            usage();
        }
    }
    if (o.iters < 1 || o.warmup < 0 || (o.step == 0 && o.factor <= 1) || o.minb > o.maxb ||
        o.compute_threads < 0 || o.compute_threads > PB_COMPUTE_MAX)
        usage();

    coh_ctx_t *ctx;
    int st = coh_init(NULL, &ctx);
    if (st) die("coh_init", st, NULL);
    coh_ctx_world(ctx, &W);
    coh_comm_rank(W, &R);
    coh_comm_size(W, &N);
    size_t es = coh_dtype_size(o.dtype);
    static const double busf[] = {0, 1, 0, 0};
    double bus = o.coll == C_ALLREDUCE   ? 2.0 * (N - 1) / N
                 : o.coll == C_BROADCAST ? busf[1]
                                         : (double)(N - 1) / N;
    if (R == 0) {
        if (o.csv) {
            printf("op,bytes,count,dtype,nranks,time_us,algbw_GBps,busbw_GBps\n");
        } else {
            printf("# %s\n", coh_ctx_describe(ctx));
            printf("# %s, %s, %s, %d ranks, %d iterations (median), %d warm-up\n",
                   o.coll == C_ALLREDUCE   ? "allreduce"
                   : o.coll == C_BROADCAST ? "broadcast"
                   : o.coll == C_ALLGATHER ? "allgather"
                                           : "reduce_scatter",
                   coh_dtype_name(o.dtype), coh_redop_name(o.op), N, o.iters, o.warmup);
            printf("#%12s %12s %7s %6s %10s %8s %8s %7s\n", "size", "count", "type", "redop",
                   "time", "algbw", "busbw", "#wrong");
            printf("#%12s %12s %7s %6s %10s %8s %8s %7s\n", "(B)", "(elements)", "", "", "(us)",
                   "(GB/s)", "(GB/s)", "");
        }
        fflush(stdout);
    }
    double *times = malloc(sizeof(double) * (size_t)o.iters);
    double *span_in = malloc(sizeof(double) * (size_t)o.iters);
    double *span_out = malloc(sizeof(double) * (size_t)o.iters);
    if (!times || !span_in || !span_out) die("out of memory for the times", COH_ENOMEM, NULL);
    double lossacc[2] = {0, 0}; /* datagram receive bytes lost, of how many */
    pb_compute_t comp;
    if (pb_compute_start(&comp, o.compute_threads) != 0)
        die("starting the compute threads", COH_ENOMEM, NULL);
    long total_wrong = 0;
    for (uint64_t bytes = o.minb; bytes <= o.maxb;
         bytes = o.step ? bytes + o.step : (uint64_t)ceil((double)bytes * o.factor)) {
        /* count: elements of the op's argument (per rank for allgather / reduce-scatter) */
        size_t total = (size_t)(bytes / es);
        size_t per =
            (o.coll == C_ALLGATHER || o.coll == C_REDUCE_SCATTER) ? total / (size_t)N : total;
        total = (o.coll == C_ALLGATHER || o.coll == C_REDUCE_SCATTER) ? per * (size_t)N : per;
        size_t send_n = o.coll == C_ALLGATHER ? per : total;
        size_t recv_n = o.coll == C_REDUCE_SCATTER ? per : total;
        char *send = malloc(send_n * es + 64), *recv = malloc(recv_n * es + 64);
        if (!send || !recv) die("out of memory", COH_ENOMEM, NULL);
        for (size_t i = 0; i < send_n; i++)
            put(send, i, o.coll == C_ALLGATHER ? in_val(R, i) : in_val(R, i));
        for (size_t i = 0; i < recv_n; i++)
            put(recv, i, o.coll == C_BROADCAST ? in_val(R == o.root ? o.root : 99, i) : 0);
        /* Device buffers: the same data, copied in; results copied out to check. */
        char *hsend = send, *hrecv = recv;
        if (o.device) {
            if ((st = coh_mem_alloc(ctx, send_n * es + 64, (void **)&send)) ||
                (st = coh_mem_alloc(ctx, recv_n * es + 64, (void **)&recv)) ||
                (st = coh_mem_copy(ctx, send, hsend, send_n * es)) ||
                (st = coh_mem_copy(ctx, recv, hrecv, recv_n * es)))
                die("device buffers", st, NULL);
        }
        double cpu0 = 0, f0 = 0, w0 = 0;
        for (int it = 0; it < o.warmup + o.iters; it++) {
            if (it == o.warmup) cpu0 = pb_cpu_s(), f0 = pb_compute_flops(&comp), w0 = now_us();
            if (o.coll == C_BROADCAST && R == o.root && it == 0) {
                for (size_t i = 0; i < recv_n; i++) put(hrecv, i, in_val(o.root, i));
                if (o.device && (st = coh_mem_copy(ctx, recv, hrecv, recv_n * es)))
                    die("device buffers", st, NULL);
            }
            coh_request_t *req;
            double t0 = now_us();
            st = run_one(send, recv, per, &req);
            if (st) die("submit", st, NULL);
            st = coh_wait(req, -1);
            double t1 = now_us();
            if (st) die("collective", st, req);
            coh_loss_info_t li;
            if (it >= o.warmup && coh_request_loss(req, &li) == COH_OK) {
                lossacc[0] += (double)(li.push_lost_bytes + li.pull_lost_bytes);
                lossacc[1] += (double)(li.push_bytes + li.pull_bytes);
            }
            coh_request_free(req);
            if (it >= o.warmup) pb_record(times, span_in, span_out, it - o.warmup, t0, t1);
        }
        /* Each rank's CPU over the timed iterations, read before the check
         * (checking 16 MiB took longer than two of its allreduces) and summed
         * over the ranks before any rank checks, as mpi-bench and gloo-bench
         * do: that allreduce holds every rank until all have read theirs, so
         * no rank's check overlaps another's last wait (on 2 cores the
         * waiting rank spun while the checker held a CPU, and at -n 2 its
         * figure rose 1.7x; mp.bench.cpu_window). */
        double cr[2] = {pb_cpu_s() - cpu0,
                        (pb_compute_flops(&comp) - f0) / ((now_us() - w0) * 1e-6)};
        st = coh_allreduce_sync(W, NULL, cr, 2, COH_F64, COH_SUM);
        if (st) die("gathering the CPU figures", st, NULL);
        if (o.device) {
            if (o.check && (st = coh_mem_copy(ctx, hrecv, recv, recv_n * es)))
                die("device buffers", st, NULL);
            coh_mem_free(ctx, send);
            coh_mem_free(ctx, recv);
            send = hsend;
            recv = hrecv;
        }
        long wrong = o.check ? check(recv, recv_n) : 0;
        /* Slowest rank per iteration, and the total of wrong elements. */
        st = coh_allreduce_sync(W, NULL, times, (size_t)o.iters, COH_F64, COH_MAX);
        if (st) die("gathering times", st, NULL);
        double w3[3] = {(double)wrong, lossacc[0], lossacc[1]};
        st = coh_allreduce_sync(W, NULL, w3, 3, COH_F64, COH_SUM);
        if (st) die("gathering checks", st, NULL);
        double w = w3[0];
        /* With a loss bound, short elements are the point, not a failure. */
        if (!(o.loss_bound > 0)) total_wrong += (long)w;
        lossacc[0] = lossacc[1] = 0;
        if (R == 0 && o.times) {
            printf("times,%llu", (unsigned long long)(total * es));
            for (int k = 0; k < o.iters; k++) printf(",%.1f", times[k]);
            printf("\n");
        }
        if (o.span) {
            double period = (span_out[o.iters - 1] - span_in[0]) / o.iters; /* this rank's */
            if ((st = coh_allreduce_sync(W, NULL, span_in, (size_t)o.iters, COH_F64, COH_MAX)) ||
                (st = coh_allreduce_sync(W, NULL, span_out, (size_t)o.iters, COH_F64, COH_MAX)))
                die("gathering spans", st, NULL);
            if (R == 0) pb_print_span(total * es, span_in, span_out, o.iters, period);
        }
        double tsum = 0;
        for (int k = 0; k < o.iters; k++) tsum += times[k];
        qsort(times, (size_t)o.iters, sizeof(double), cmp_double);
        double t =
            o.iters % 2 ? times[o.iters / 2] : (times[o.iters / 2 - 1] + times[o.iters / 2]) / 2;
        uint64_t b = (uint64_t)total * es;
        double algbw = (double)b / (t * 1e3); /* GB/s: bytes / (us * 1e3) */
        if (R == 0 && o.pct) {
            int n = o.iters;
            printf("pct,%llu,%.1f,%.1f,%.1f,%.1f,%.6f,%.1f\n", (unsigned long long)(total * es),
                   times[(n - 1) / 2], times[(int)ceil(0.9 * n) - 1],
                   times[(int)ceil(0.99 * n) - 1], times[n - 1], w3[2] > 0 ? w3[1] / w3[2] : 0.0,
                   tsum / n);
        }
        if (R == 0) {
            if (o.csv)
                printf("%s,%llu,%zu,%s,%d,%.2f,%.4f,%.4f\n",
                       o.coll == C_ALLREDUCE   ? coh_redop_name(o.op)
                       : o.coll == C_BROADCAST ? "broadcast"
                       : o.coll == C_ALLGATHER ? "allgather"
                                               : "reduce_scatter",
                       (unsigned long long)b, total, coh_dtype_name(o.dtype), N, t, algbw,
                       algbw * bus);
            else
                printf(" %12llu %12zu %7s %6s %10.2f %8.3f %8.3f %7s\n", (unsigned long long)b,
                       total, coh_dtype_name(o.dtype), coh_redop_name(o.op), t, algbw, algbw * bus,
                       o.check ? (w ? "WRONG" : "0") : "n/a");
            pb_print_cpu(o.csv, o.iters, (size_t)b, cr[0]);
            if (comp.n) pb_print_compute(o.csv, (size_t)b, cr[1]);
            fflush(stdout);
        }
        free(send);
        free(recv);
        if (bytes == 0 && o.step == 0) break;
    }
    free(span_out);
    free(span_in);
    pb_compute_stop(&comp);
    free(times);
    if (R == 0 && !o.csv) {
        /* The multi-rail balancer's table the last ops were split with. */
        static char table[1 << 16];
        int tl = coh_lb_table(ctx, table, sizeof(table));
        if (tl > 0) {
            printf("# rail balancer table (COHORT_LB_TABLE format):\n");
            for (char *line = strtok(table, "\n"); line; line = strtok(NULL, "\n"))
                printf("#   %s\n", line);
        }
    }
    coh_finalize(ctx);
    if (total_wrong) {
        if (R == 0) fprintf(stderr, "cohort-bench: %ld wrong elements\n", total_wrong);
        return 1;
    }
    return 0;
}
