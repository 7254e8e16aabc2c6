/*
 * gloo-bench - Gloo allreduce (float sum, tcp transport) measured the way
 * cohort-bench measures cohort, for the side-by-side table of bench/peers/run.sh.
 *
 *   cohortrun -n N -- gloo-bench --store DIR --csv -b 4K -e 64M -f 4 -n 20 -w 5 -c 1
 *
 * Ranks come from RANK/WORLD_SIZE or cohortrun's COHORT_RANK/COHORT_WORLD_SIZE.
 * Rendezvous is a gloo::rendezvous::FileStore in DIR (--store, else $GLOO_BENCH_STORE,
 * else $TMPDIR/gloo-bench-store) under a prefix that is the job's COHORT_TOKEN (or
 * $GLOO_BENCH_PREFIX), so runs sharing a directory never read each other's keys.
 * The tcp device binds --host (default 127.0.0.1).
 *
 * Algorithms (-a):
 *   default           gloo::allreduce() with default options: in this Gloo (0.5.0,
 *                     git 2022-05-18) that is its ring reduce-scatter + allgather with
 *                     1 MiB segments, two in flight. It is what PyTorch's ProcessGroupGloo
 *                     calls for CPU tensors, i.e. what a Gloo user gets. Out of place.
 *   ring, ring_chunked, halving_doubling, bcube
 *                     the older algorithm classes (in place; timed on a buffer whose
 *                     values grow, checked by an extra call on a fresh pattern).
 *   best              halving_doubling, ring_chunked and default per size, and the
 *                     fastest is reported (its name goes to stderr): Gloo at its best for
 *                     the size, which is the fair thing to compare against. A candidate
 *                     whose first call is 4x slower than the best median so far is skipped.
 */
#include <gloo/allreduce.h>
#include <gloo/allreduce_bcube.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "peers_common.h"

namespace
{

using Reduce = void (*)(void *, const void *, const void *, size_t);

const char *const kExtraHelp =
    "  -a, --algo NAME         default | ring | ring_chunked | halving_doubling | bcube | best\n"
    "                          (default: default = gloo::allreduce's own choice)\n"
    "      --store DIR         FileStore directory shared by the ranks\n"
    "      --host ADDR         address the tcp device binds (default 127.0.0.1)\n";

const char *const kAlgos[] = {"default", "ring", "ring_chunked", "halving_doubling", "bcube"};

struct Bench {
    std::shared_ptr<gloo::rendezvous::Context> ctx;
    pb_opts_t o;
    int rank = 0, nranks = 1;
    std::vector<float> send, recv;
    std::vector<double> times;
};

double max_over_ranks(Bench &b, double *v, size_t n)
{
    gloo::AllreduceOptions opts(b.ctx);
    opts.setOutput(v, n);
    opts.setReduceFunction(static_cast<Reduce>(&gloo::max<double>));
    opts.setTag(2);
    gloo::allreduce(opts);
    return v[0];
}

/* Allreduce of the first `count` elements with algorithm `algo` into b.recv, timed
   as cohort-bench times (warm-up and timed iterations back to back, no barrier).
   Returns the median of the per-iteration max over ranks; *wrong gets the global
   count of wrong elements (0 when not checked). When probe_limit_us > 0, one
   untimed iteration runs first and the algorithm is abandoned (returns -1, the same
   decision on every rank since it uses the max over ranks) if it took longer: with
   4 ranks on 2 cores gloo::allreduce's ring can take seconds per call (see the
   report of run.sh), and -a best must not spend minutes confirming a loser. */
double run_algo(Bench &b, const std::string &algo, size_t count, double probe_limit_us,
                long long *wrong, double *cpu_all)
{
    float *recv = b.recv.data();
    std::function<void()> once;
    gloo::AllreduceOptions opts(b.ctx);
    std::unique_ptr<gloo::Algorithm> a;
    if (algo == "default") {
        /* Options are built once and reused: the per-call cost left is Gloo's own. */
        opts.setInput(b.send.data(), count);
        opts.setOutput(recv, count);
        opts.setReduceFunction(static_cast<Reduce>(&gloo::sum<float>));
        opts.setTag(1);
        std::fill(recv, recv + count, 0.0f);
        once = [&] { gloo::allreduce(opts); };
    } else {
        std::vector<float *> ptrs{recv};
        const int n = static_cast<int>(count);
        if (algo == "ring")
            a.reset(new gloo::AllreduceRing<float>(b.ctx, ptrs, n));
        else if (algo == "ring_chunked")
            a.reset(new gloo::AllreduceRingChunked<float>(b.ctx, ptrs, n));
        else if (algo == "halving_doubling")
            a.reset(new gloo::AllreduceHalvingDoubling<float>(b.ctx, ptrs, n));
        else
            a.reset(new gloo::AllreduceBcube<float>(b.ctx, ptrs, n));
        std::copy(b.send.begin(), b.send.begin() + (long)count, recv);
        once = [&] { a->run(); };
    }

    if (probe_limit_us > 0) {
        double t0 = pb_now_us();
        once();
        double probe = pb_now_us() - t0;
        if (max_over_ranks(b, &probe, 1) > probe_limit_us) {
            *wrong = 0;
            return -1;
        }
    }
    double cpu0 = 0;
    for (int it = 0; it < b.o.warmup + b.o.iters; it++) {
        if (it == b.o.warmup) cpu0 = pb_cpu_s();
        double t0 = pb_now_us();
        once();
        double t1 = pb_now_us();
        if (it >= b.o.warmup) b.times[(size_t)(it - b.o.warmup)] = t1 - t0;
    }
    *cpu_all = pb_cpu_s() - cpu0;
    gloo::AllreduceOptions copts(b.ctx);
    copts.setOutput(cpu_all, 1);
    copts.setReduceFunction(static_cast<Reduce>(&gloo::sum<double>));
    copts.setTag(4);
    gloo::allreduce(copts);
    /* The legacy classes work in place, so their timed output is not the pattern's
       sum any more: one more call on a fresh pattern is checked instead. */
    if (a && b.o.check) {
        pb_fill(recv, count, b.rank);
        a->run();
    }
    long long mine = b.o.check ? (long long)pb_count_wrong(recv, count, b.nranks) : 0;
    max_over_ranks(b, b.times.data(), b.times.size());

    long long all = mine;
    gloo::AllreduceOptions wopts(b.ctx);
    wopts.setOutput(&all, 1);
    wopts.setReduceFunction(static_cast<Reduce>(&gloo::sum<long long>));
    wopts.setTag(3);
    gloo::allreduce(wopts);
    *wrong = all;
    return pb_median(b.times.data(), b.o.iters);
}

int run(int argc, char **argv)
{
    Bench b;
    int prc = pb_parse(argc, argv, &b.o, kExtraHelp);
    if (prc != 0) return prc > 0 ? 0 : 2;
    if (b.o.compute_threads) {
        /* bench/contention.sh compares cohort with Open MPI only. */
        fprintf(stderr, "gloo-bench: --compute-threads is not supported\n");
        return 2;
    }
    const std::string algo = b.o.algo ? b.o.algo : "default";
    bool known = algo == "best";
    for (const char *k : kAlgos) known = known || algo == k;
    if (!known) {
        fprintf(stderr, "gloo-bench: unknown algorithm '%s'\n", algo.c_str());
        return 2;
    }
    if (!pb_env_rank(&b.rank, &b.nranks)) {
        fprintf(stderr, "gloo-bench: set RANK and WORLD_SIZE (or run under cohortrun)\n");
        return 2;
    }

    std::string dir;
    if (b.o.store)
        dir = b.o.store;
    else if (const char *e = getenv("GLOO_BENCH_STORE"))
        dir = e;
    else
        dir = std::string(getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp") + "/gloo-bench-store";
    /* FileStore resolves the path with realpath(3), so it must exist; every rank may
       race to create it. */
    if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
        fprintf(stderr, "gloo-bench: mkdir %s: %s\n", dir.c_str(), strerror(errno));
        return 2;
    }
    const char *prefix = getenv("GLOO_BENCH_PREFIX");
    if (!prefix) prefix = getenv("COHORT_TOKEN");
    if (!prefix) prefix = "gloo-bench";

    gloo::transport::tcp::attr attr;
    attr.hostname = b.o.host ? b.o.host : "127.0.0.1";
    attr.ai_family = AF_INET;
    if (attr.hostname.find(':') != std::string::npos) attr.ai_family = AF_INET6;
    auto dev = gloo::transport::tcp::CreateDevice(attr);

    gloo::rendezvous::FileStore fstore(dir);
    gloo::rendezvous::PrefixStore store(prefix, fstore);
    b.ctx = std::make_shared<gloo::rendezvous::Context>(b.rank, b.nranks);
    /* Large sizes on an oversubscribed machine can take seconds; the default 30 s
       end-to-end timeout would turn slowness into failures. */
    b.ctx->setTimeout(std::chrono::seconds(300));
    b.ctx->connectFullMesh(store, dev);

    const size_t max_count = b.o.max_bytes / sizeof(float);
    b.send.resize(max_count);
    b.recv.assign(max_count, 0.0f);
    b.times.resize((size_t)b.o.iters);
    pb_fill(b.send.data(), max_count, b.rank);

    std::vector<std::string> algos;
    if (algo == "best")
        algos = {"halving_doubling", "ring_chunked", "default"};
    else
        algos = {algo};

    if (b.rank == 0) {
        std::string what = "gloo-bench (Gloo tcp, algo " + algo + ")";
        pb_print_header(&b.o, what.c_str(), b.nranks);
    }
    long long total_wrong = 0;
    for (size_t bytes = b.o.min_bytes; bytes; bytes = pb_next_size(&b.o, bytes)) {
        const size_t count = bytes / sizeof(float);
        const size_t nbytes = count * sizeof(float);
        double best_t = 0, best_cpu = 0;
        std::string best_name;
        long long wrong_sum = 0;
        for (const auto &a : algos) {
            long long wrong = 0;
            double cpu = 0;
            /* Probe only once a time to beat exists, against 4x that time. */
            double limit = (algos.size() > 1 && !best_name.empty()) ? 4 * best_t : 0;
            double t = run_algo(b, a, count, limit, &wrong, &cpu);
            if (t < 0) {
                if (b.rank == 0)
                    fprintf(stderr, "gloo-bench: %zu bytes %s skipped (one call > %.0f us)\n",
                            nbytes, a.c_str(), limit);
                continue;
            }
            wrong_sum += wrong;
            if (wrong && b.rank == 0)
                fprintf(stderr, "gloo-bench: CHECK FAILED at %zu bytes (%s): %lld wrong\n", nbytes,
                        a.c_str(), wrong);
            if (algos.size() > 1 && b.rank == 0)
                fprintf(stderr, "gloo-bench: %zu bytes %s %.2f us\n", nbytes, a.c_str(), t);
            if (best_name.empty() || t < best_t) {
                best_t = t;
                best_cpu = cpu;
                best_name = a;
            }
        }
        total_wrong += wrong_sum;
        if (algos.size() > 1 && b.rank == 0)
            fprintf(stderr, "gloo-bench: %zu bytes best=%s\n", nbytes, best_name.c_str());
        if (b.rank == 0) pb_print_row(&b.o, nbytes, b.nranks, best_t, b.o.check ? wrong_sum : -1);
        if (b.rank == 0) pb_print_cpu(b.o.csv, b.o.iters, nbytes, best_cpu);
    }
    return total_wrong ? 1 : 0;
}

} // namespace

int main(int argc, char **argv)
{
    /* Gloo reports transport and timeout failures as exceptions. */
    try {
        return run(argc, argv);
    } catch (const std::exception &e) {
        fprintf(stderr, "gloo-bench: %s\n", e.what());
        return 3;
    }
}
