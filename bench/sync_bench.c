/*
 * cohort-syncbench - partial synchronisation measured live, with the
 * metrics of the selective-reduce paper (seeds/001 IV-A2).
 *
 *   cohortrun -n 8 -- cohort-syncbench --mode selective --duration 60 --model-mb 4 \
 *       --dist transformer --bw-list 0.12,0.05,... --replay-out run.csv
 *
 * Every rank "computes" for a time drawn from the simulator's distribution
 * (sched/sc_sim.h: the same cnn / transformer stand-ins cohort-sim uses), then
 * calls coh_sync on a model of --model-mb MB, until --duration seconds have
 * passed. Rank 0 gathers every sync and prints:
 *   average sync time   mean over groups of the group's duration (the longest
 *                       member's time from its plan to its completion)
 *   average sync scale  mean group size
 *   total sync          groups finished
 *   total iteration     syncs finished, summed over ranks
 *   wait                mean time from READY to the plan, per sync
 *   time in sync        mean time a rank spends in coh_sync (call to completion):
 *                       what the straggler costs the others, in every mode
 *   iterations/s        per rank
 * --straggler R --tail A makes rank R a heavy-tailed straggler: each of its
 * compute times is multiplied by a Pareto(A) factor (>= 1, at most 8;
 * A = 1.5: a long tail). --mode relay runs relay groups (COH_SYNC_RELAY).
 * --replay-out writes the run as a cohort-sim replay scenario (each rank's
 * compute times in order, with its bandwidth from --bw-list), so the
 * simulator can predict the same run.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cohort.h"
#include "sched/sc_sim.h"

enum { F_GID, F_SIZE, F_COMM, F_WAIT, F_COMPUTE, F_END, F_MASK, F_BLOCK, NF };

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void die(const char *what, int st)
{
    fprintf(stderr, "cohort-syncbench: %s: %s: %s\n", what, coh_status_name(st), coh_last_error());
    exit(1);
}

static void log_stderr(int level, const char *msg, void *arg)
{
    (void)arg;
    fprintf(stderr, "cohort[%d]: %s\n", level, msg);
}

/* Where group id sits in gid[0..n), or n. */
static size_t group_at(const double *gid, size_t n, double id)
{
    size_t j = 0;
    while (j < n && gid[j] != id) j++;
    return j;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: cohortrun -n N -- cohort-syncbench [--mode allreduce|partial|selective|relay]\n"
            "  [--duration S] [--model-mb M] [--dist cnn|transformer] [--compute-scale X]\n"
            "  [--straggler R --tail A]\n"
            "  [--seed K] [--bw-list G0,G1,...] [--replay-out FILE] [--groups-out FILE]\n"
            "  [--csv]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    double duration = 30, model_mb = 4, scale = 1;
    const char *dist_name = "transformer", *bw_list = NULL, *replay = NULL, *mode_name = NULL;
    const char *groups_out = NULL;
    uint64_t seed = 1;
    int straggler = -1;
    double tail = 1.5;
    int csv = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--csv")) {
            csv = 1;
            continue;
        }
        if (!v) usage();
        i++;
        if (!strcmp(a, "--duration"))
            duration = atof(v);
        else if (!strcmp(a, "--model-mb"))
            model_mb = atof(v);
        else if (!strcmp(a, "--compute-scale"))
            scale = atof(v);
        else if (!strcmp(a, "--dist"))
            dist_name = v;
        else if (!strcmp(a, "--seed"))
            seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--bw-list"))
            bw_list = v;
        else if (!strcmp(a, "--replay-out"))
            replay = v;
        else if (!strcmp(a, "--mode"))
            mode_name = v;
        else if (!strcmp(a, "--groups-out"))
            groups_out = v;
        else if (!strcmp(a, "--straggler"))
            straggler = atoi(v);
        else if (!strcmp(a, "--tail"))
            tail = atof(v);
        else
            usage();
    }
    sc_dist_t dist;
    if (sc_dist_from_name(dist_name, &dist) < 0) usage();
    coh_sync_mode mode = COH_SYNC_DEFAULT;
    if (mode_name && coh_sync_mode_from_name(mode_name, &mode) < 0) usage();

    if (getenv("COHORT_LOG")) coh_set_log_handler(log_stderr, NULL, atoi(getenv("COHORT_LOG")));
    coh_ctx_t *ctx;
    int st = coh_init(NULL, &ctx);
    if (st) die("coh_init", st);
    coh_comm_t *w;
    int rank, n;
    coh_ctx_world(ctx, &w);
    coh_comm_rank(w, &rank);
    coh_comm_size(w, &n);
    size_t count = (size_t)(model_mb * 1e6 / sizeof(float));
    float *model = calloc(count ? count : 1, sizeof(float));
    sc_rng_t rng;
    sc_rng_seed(&rng, seed, (uint64_t)rank);
    size_t cap = 1024, nrec = 0;
    double *rec = malloc(sizeof(double) * NF * cap);

    /* Everyone starts together. */
    coh_request_t *req;
    if ((st = coh_barrier(w, &req)) || (st = coh_wait(req, -1))) die("barrier", st);
    coh_request_free(req);
    double t0 = now_s();
    for (uint64_t it = 0; now_s() - t0 < duration; it++) {
        double c = sc_dist_draw(&dist, &rng) * scale;
        if (rank == straggler && tail > 0) c *= fmin(8, pow(1 - sc_rng_uniform(&rng), -1 / tail));
        usleep((useconds_t)(c * 1e6));
        for (size_t j = 0; j < count; j += 1024) model[j] += 1.0f; /* touch the model */
        double tb = now_s();
        if ((st = coh_sync_ex(w, model, count, COH_F32, it, 1.0, mode, &req))) die("coh_sync", st);
        if ((st = coh_wait(req, -1))) {
            fprintf(stderr, "cohort-syncbench rank %d: sync failed: %s\n", rank,
                    coh_request_error(req));
            return 1;
        }
        coh_group_info_t g;
        coh_request_group(req, &g); /* g.members lives as long as req */
        if (nrec == cap) {
            cap *= 2;
            rec = realloc(rec, sizeof(double) * NF * cap);
        }
        double *r = rec + NF * nrec++;
        r[F_GID] = (double)g.group_id;
        r[F_SIZE] = g.size;
        r[F_COMM] = g.comm_us / 1e6;
        r[F_WAIT] = g.wait_us / 1e6;
        r[F_COMPUTE] = c;
        r[F_END] = now_s() - t0;
        r[F_BLOCK] = now_s() - tb;
        double mask = 0; /* members as a bit set (exact in a double up to 52 ranks) */
        for (int i = 0; i < g.size && n <= 52; i++) mask += ldexp(1.0, g.members[i]);
        r[F_MASK] = mask;
        coh_request_free(req);
    }
    coh_sync_leave(w);

    /* Gather every rank's records at every rank (padded to the longest). */
    double mine = (double)nrec, most = mine;
    if ((st = coh_allreduce_sync(w, NULL, &most, 1, COH_F64, COH_MAX))) die("allreduce", st);
    size_t m = (size_t)most;
    double *pad = calloc(NF * (m ? m : 1) + 1, sizeof(double));
    pad[0] = mine;
    memcpy(pad + 1, rec, sizeof(double) * NF * nrec);
    size_t per = NF * (m ? m : 1) + 1;
    double *all = malloc(sizeof(double) * per * (size_t)n);
    if ((st = coh_allgather(w, pad, all, per, COH_F64, &req)) || (st = coh_wait(req, -1)))
        die("allgather", st);
    coh_request_free(req);

    if (rank == 0) {
        /* Groups: key gid; duration = longest member comm time. */
        size_t total_iter = 0, ngroups = 0;
        double sum_time = 0, sum_scale = 0, sum_wait = 0, sum_block = 0;
        size_t cap_g = 1024;
        double *gid = malloc(sizeof(double) * cap_g), *gdur = malloc(sizeof(double) * cap_g),
               *gsize = malloc(sizeof(double) * cap_g);
        for (int r = 0; r < n; r++) {
            const double *b = all + per * (size_t)r;
            size_t k = (size_t)b[0];
            total_iter += k;
            for (size_t i = 0; i < k; i++) {
                const double *x = b + 1 + NF * i;
                sum_wait += x[F_WAIT];
                sum_block += x[F_BLOCK];
                size_t j = group_at(gid, ngroups, x[F_GID]);
                if (j == ngroups) {
                    if (ngroups == cap_g) {
                        cap_g *= 2;
                        gid = realloc(gid, sizeof(double) * cap_g);
                        gdur = realloc(gdur, sizeof(double) * cap_g);
                        gsize = realloc(gsize, sizeof(double) * cap_g);
                    }
                    gid[ngroups] = x[F_GID];
                    gdur[ngroups] = 0;
                    gsize[ngroups] = x[F_SIZE];
                    ngroups++;
                }
                if (x[F_COMM] > gdur[j]) gdur[j] = x[F_COMM];
            }
        }
        for (size_t j = 0; j < ngroups; j++) {
            sum_time += gdur[j];
            sum_scale += gsize[j];
        }
        double avg_time = ngroups ? sum_time / (double)ngroups : 0;
        double avg_scale = ngroups ? sum_scale / (double)ngroups : 0;
        double avg_wait = total_iter ? sum_wait / (double)total_iter : 0;
        double avg_block = total_iter ? sum_block / (double)total_iter : 0;
        double ips = (double)total_iter / (double)n / duration;
        const char *mname =
            coh_sync_mode_name(mode == COH_SYNC_DEFAULT ? COH_SYNC_SELECTIVE : mode);
        if (mode_name) mname = mode_name;
        if (csv) {
            printf("scheme,n,avg_sync_time_s,avg_sync_scale,total_sync,total_iteration,"
                   "avg_wait_s,avg_in_sync_s,iter_per_s\n");
            printf("%s,%d,%.4f,%.3f,%zu,%zu,%.4f,%.4f,%.3f\n", mname, n, avg_time, avg_scale,
                   ngroups, total_iter, avg_wait, avg_block, ips);
        } else {
            printf("cohort-syncbench: %s, %d ranks, %.0f s, model %.1f MB, %s x %.2f\n", mname, n,
                   duration, model_mb, dist_name, scale);
            printf("  average sync time  %.3f s\n  average sync scale %.2f\n  total sync         "
                   "%zu\n  total iteration    %zu\n  average wait       %.3f s\n"
                   "  time in sync       %.3f s\n  iterations/s       %.2f per rank\n",
                   avg_time, avg_scale, ngroups, total_iter, avg_wait, avg_block, ips);
        }
        if (replay) {
            /* cohort-sim replay: rows in iteration order, each rank's k-th
             * compute time and its bandwidth. */
            FILE *f = fopen(replay, "w");
            if (!f) {
                perror(replay);
                return 1;
            }
            double bw[1024];
            int nb = 0;
            for (const char *p = bw_list; p && *p && nb < 1024;) {
                bw[nb++] = atof(p);
                p = strchr(p, ',');
                if (p) p++;
            }
            fprintf(f, "worker,bandwidth_gbps,compute_s\n");
            for (size_t i = 0; i < m; i++)
                for (int r = 0; r < n; r++) {
                    const double *b = all + per * (size_t)r;
                    if (i >= (size_t)b[0]) continue;
                    fprintf(f, "%d,%.6f,%.6f\n", r, r < nb ? bw[r] : 10.0,
                            b[1 + NF * i + F_COMPUTE]);
                }
            fclose(f);
        }
        if (groups_out) {
            /* One line per group: id, end time, members (for the cluster test
             * that checks selective groups ranks of similar bandwidth), and its
             * duration (the longest member's comm time: what "average sync
             * time" averages, to hold against Eq. 2 group by group). */
            FILE *f = fopen(groups_out, "w");
            if (!f) {
                perror(groups_out);
                return 1;
            }
            fprintf(f, "group_id,end_s,members,comm_s\n");
            for (int r = 0; r < n; r++) {
                const double *b = all + per * (size_t)r;
                for (size_t i = 0; i < (size_t)b[0]; i++) {
                    const double *x = b + 1 + NF * i;
                    /* Each group once: reported by its lowest member. */
                    double mask = x[F_MASK];
                    int low = 0;
                    while (low < 52 && fmod(floor(mask / ldexp(1.0, low)), 2.0) == 0) low++;
                    if (low != r) continue;
                    fprintf(f, "%.0f,%.3f,", x[F_GID], x[F_END]);
                    for (int q = 0; q < n && q < 52; q++)
                        if (fmod(floor(mask / ldexp(1.0, q)), 2.0) == 1) fprintf(f, "%d ", q);
                    size_t j = group_at(gid, ngroups, x[F_GID]);
                    fprintf(f, ",%.6f\n", j < ngroups ? gdur[j] : 0.0);
                }
            }
            fclose(f);
        }
        free(gid);
        free(gdur);
        free(gsize);
    }
    free(all);
    free(pad);
    free(rec);
    free(model);
    coh_finalize(ctx);
    return 0;
}
