/*
 * mpi-bench - MPI_Allreduce (float sum) measured the way cohort-bench measures
 * cohort, for the side-by-side table of bench/peers/run.sh.
 *
 *   mpirun --oversubscribe --bind-to none --mca pml ob1 --mca btl self,tcp \
 *       --mca btl_tcp_if_include lo --mca btl_tcp_disable_family 6 -np N \
 *       mpi-bench --csv -b 4K -e 64M -f 4 -n 20 -w 5 -c 1 -o sum -d float
 *
 * The algorithm is whatever Open MPI's coll/tuned decision function picks for the
 * size and rank count; the transport is chosen on the mpirun line, not here.
 */
#include <mpi.h>

#include "peers_common.h"

static void die_mpi(int rc, const char *what)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    fprintf(stderr, "mpi-bench: %s: %s\n", what, msg);
    MPI_Abort(MPI_COMM_WORLD, 2);
}

#define MPI_CHECK(call)                                                                            \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ != MPI_SUCCESS) die_mpi(rc_, #call);                                               \
    } while (0)

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    /* Errors come back as codes so they are reported with their text. */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    int rank = 0, nranks = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);

    pb_opts_t o;
    int prc = pb_parse(argc, argv, &o, NULL);
    if (prc != 0) {
        MPI_Finalize();
        return prc > 0 ? 0 : 2;
    }

    size_t max_count = o.max_bytes / sizeof(float);
    /* Out of place, like cohort-bench and nccl-tests: the inputs stay the check pattern. */
    float *send = malloc(max_count * sizeof(float));
    float *recv = malloc(max_count * sizeof(float));
    double *times = malloc((size_t)o.iters * sizeof(double));
    double *span_in = malloc((size_t)o.iters * sizeof(double));
    double *span_out = malloc((size_t)o.iters * sizeof(double));
    if (!send || !recv || !times || !span_in || !span_out) {
        fprintf(stderr, "mpi-bench: out of memory for %zu bytes\n", o.max_bytes);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    pb_fill(send, max_count, rank);
    memset(recv, 0, max_count * sizeof(float));

    pb_compute_t comp;
    if (pb_compute_start(&comp, o.compute_threads) != 0) {
        fprintf(stderr, "mpi-bench: cannot start the compute threads\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    if (rank == 0) pb_print_header(&o, "mpi-bench (Open MPI)", nranks);
    long long total_wrong = 0;
    for (size_t bytes = o.min_bytes; bytes; bytes = pb_next_size(&o, bytes)) {
        int count = (int)(bytes / sizeof(float));
        size_t nbytes = (size_t)count * sizeof(float);
        /* The same loop as cohort-bench: warm-up and timed iterations back to back, one
           timestamp pair per iteration, no barrier. A rank that finishes early waits for
           the others inside the next call, so the max over ranks is the iteration period. */
        memset(recv, 0, nbytes);
        double cpu0 = 0, f0 = 0, w0 = 0;
        for (int it = 0; it < o.warmup + o.iters; it++) {
            if (it == o.warmup) cpu0 = pb_cpu_s(), f0 = pb_compute_flops(&comp), w0 = pb_now_us();
            double t0 = pb_now_us();
            MPI_CHECK(MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
            double t1 = pb_now_us();
            if (it >= o.warmup) pb_record(times, span_in, span_out, it - o.warmup, t0, t1);
        }
        /* This rank's compute rate over the timed iterations. */
        double rate = (pb_compute_flops(&comp) - f0) / ((pb_now_us() - w0) * 1e-6);
        if (o.span) {
            double period = (span_out[o.iters - 1] - span_in[0]) / o.iters; /* this rank's */
            MPI_CHECK(
                MPI_Allreduce(MPI_IN_PLACE, span_in, o.iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
            MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, span_out, o.iters, MPI_DOUBLE, MPI_MAX,
                                    MPI_COMM_WORLD));
            if (rank == 0) pb_print_span(nbytes, span_in, span_out, o.iters, period);
        }
        /* Every rank's CPU seconds and compute rate, summed. */
        double mine2[2] = {pb_cpu_s() - cpu0, rate}, all2[2];
        MPI_CHECK(MPI_Allreduce(mine2, all2, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
        /* Checked on the last timed result, as cohort-bench does. */
        long long mine = o.check ? (long long)pb_count_wrong(recv, (size_t)count, nranks) : 0;
        MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, times, o.iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
        long long wrong = 0;
        MPI_CHECK(MPI_Allreduce(&mine, &wrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD));
        if (rank == 0 && o.pct) pb_print_pct(nbytes, times, o.iters);
        double t_us = pb_median(times, o.iters);
        total_wrong += wrong;
        if (wrong && rank == 0)
            fprintf(stderr, "mpi-bench: CHECK FAILED at %zu bytes: %lld wrong elements\n", nbytes,
                    wrong);
        if (!o.check) wrong = -1;
        if (rank == 0) pb_print_row(&o, nbytes, nranks, t_us, wrong);
        if (rank == 0) pb_print_cpu(o.csv, o.iters, nbytes, all2[0]);
        if (rank == 0 && comp.n) pb_print_compute(o.csv, nbytes, all2[1]);
    }
    pb_compute_stop(&comp);

    free(span_out);
    free(span_in);
    free(times);
    free(recv);
    free(send);
    MPI_Finalize();
    return total_wrong ? 1 : 0;
}
