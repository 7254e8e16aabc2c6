/*
 * cohort-idlebench - what an idle rank costs (issue 15, item 4): after init
 * and a barrier, every rank does nothing for --seconds while its runtime's
 * threads keep it alive (reactors, the coordinator's tick, heartbeats).
 * Measured per rank over that window, from the kernel's own counters:
 *   - CPU time (user + system, every thread: getrusage);
 *   - context switches of every thread, voluntary and not (/proc/self/task/
 *     * /status): a thread that
 *     wakes up and sleeps again costs one, so this is wake-ups per second;
 *   - threads and resident memory at the end (/proc/self/status).
 * Rank 0 prints the mean and the max over ranks (and the coordinator's own
 * line: rank 0 runs it), so 32-48 ranks on one host can be sized.
 *
 *   cohortrun -n N -- cohort-idlebench [--seconds 5] [--csv] [--max-wakeups W]
 *
 * --max-wakeups: exit 1 when a rank's threads went to sleep (voluntary
 * switches) more than W times a second (mp.idle.n4 checks the idle
 * coordinator: it woke 500 times a second before it slowed its tick).
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "cohort.h"
#include "peers/peers_common.h" /* pb_cpu_s */

enum { F_CPU, F_VCSW, F_NVCSW, F_THREADS, F_RSS_KB, F_COUNT };

/* A counter of a status file of /proc ("voluntary_ctxt_switches", "Threads",
 * "VmRSS"), or -1. */
static double file_field(const char *path, const char *name)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[256];
    double v = -1;
    size_t n = strlen(name);
    while (fgets(line, sizeof(line), f))
        if (!strncmp(line, name, n) && line[n] == ':') {
            v = atof(line + n + 1);
            break;
        }
    fclose(f);
    return v;
}

static double status_field(const char *name)
{
    return file_field("/proc/self/status", name);
}

/* Context switches of every thread: /proc/self/status counts the main
 * thread's only. */
static double switches(const char *name)
{
    DIR *d = opendir("/proc/self/task");
    if (!d) return -1;
    double sum = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[300];
        snprintf(path, sizeof(path), "/proc/self/task/%s/status", e->d_name);
        double v = file_field(path, name);
        if (v > 0) sum += v;
    }
    closedir(d);
    return sum;
}

static void log_to_stderr(int level, const char *msg, void *arg)
{
    (void)arg;
    fprintf(stderr, "cohort[%d]: %s\n", level, msg);
}

static void die(const char *what, int st)
{
    fprintf(stderr, "cohort-idlebench: %s: %s: %s\n", what, coh_status_name(st), coh_last_error());
    exit(1);
}

int main(int argc, char **argv)
{
    double seconds = 5, max_wakeups = 0;
    int csv = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
            seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--csv"))
            csv = 1;
        else if (!strcmp(argv[i], "--max-wakeups") && i + 1 < argc)
            max_wakeups = atof(argv[++i]);
        else {
            fprintf(stderr, "usage: cohortrun -n N -- cohort-idlebench [--seconds S] [--csv] "
                            "[--max-wakeups W]\n");
            return 2;
        }
    }
    if (getenv("COHORT_LOG")) coh_set_log_handler(log_to_stderr, NULL, atoi(getenv("COHORT_LOG")));
    coh_config_t cfg;
    int st = coh_config_init(&cfg);
    if (st) die("config", st);
    coh_ctx_t *ctx;
    if ((st = coh_init(&cfg, &ctx))) die("init", st);
    coh_comm_t *w;
    coh_ctx_world(ctx, &w);
    int rank, n;
    coh_comm_rank(w, &rank);
    coh_comm_size(w, &n);
    coh_request_t *req;
    if ((st = coh_barrier(w, &req)) || (st = coh_wait(req, -1))) die("barrier", st);
    coh_request_free(req);

    double c0 = pb_cpu_s(), v0 = switches("voluntary_ctxt_switches"),
           nv0 = switches("nonvoluntary_ctxt_switches");
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    while (nanosleep(&ts, &ts) != 0) {
    }
    double mine[F_COUNT] = {
        [F_CPU] = (pb_cpu_s() - c0) / seconds,
        [F_VCSW] = (switches("voluntary_ctxt_switches") - v0) / seconds,
        [F_NVCSW] = (switches("nonvoluntary_ctxt_switches") - nv0) / seconds,
        [F_THREADS] = status_field("Threads"),
        [F_RSS_KB] = status_field("VmRSS"),
    };
    double *all = malloc(sizeof(double) * F_COUNT * (size_t)n);
    if (!all) die("allgather", COH_ENOMEM);
    if ((st = coh_allgather(w, mine, all, F_COUNT, COH_F64, &req)) || (st = coh_wait(req, -1)))
        die("allgather", st);
    coh_request_free(req);
    if (rank == 0) {
        double sum[F_COUNT] = {0}, max[F_COUNT] = {0};
        for (int r = 0; r < n; r++)
            for (int k = 0; k < F_COUNT; k++) {
                double v = all[r * F_COUNT + k];
                sum[k] += v;
                if (v > max[k]) max[k] = v;
            }
        if (csv) {
            printf("ranks,seconds,cpu_frac_mean,cpu_frac_max,cpu_frac_rank0,wakeups_mean,"
                   "wakeups_max,wakeups_rank0,threads,rss_mb_mean,cpu_frac_total\n");
            printf("%d,%.1f,%.5f,%.5f,%.5f,%.1f,%.1f,%.1f,%.0f,%.1f,%.4f\n", n, seconds,
                   sum[F_CPU] / n, max[F_CPU], all[F_CPU], (sum[F_VCSW] + sum[F_NVCSW]) / n,
                   max[F_VCSW] + max[F_NVCSW], all[F_VCSW] + all[F_NVCSW], max[F_THREADS],
                   sum[F_RSS_KB] / n / 1024, sum[F_CPU]);
        } else {
            printf("%d idle ranks, %.1f s: per rank CPU %.3f%% of a core (max %.3f%%, rank 0 "
                   "with the coordinator %.3f%%), %.1f wake-ups/s (max %.1f, rank 0 %.1f), "
                   "%.0f threads, %.1f MB resident; all ranks together %.2f%% of a core\n",
                   n, seconds, 100 * sum[F_CPU] / n, 100 * max[F_CPU], 100 * all[F_CPU],
                   (sum[F_VCSW] + sum[F_NVCSW]) / n, max[F_VCSW] + max[F_NVCSW],
                   all[F_VCSW] + all[F_NVCSW], max[F_THREADS], sum[F_RSS_KB] / n / 1024,
                   100 * sum[F_CPU]);
        }
    }
    int over = -1;
    for (int r = 0; r < n && max_wakeups > 0; r++)
        if (all[r * F_COUNT + F_VCSW] > max_wakeups) over = r;
    if (rank == 0 && over >= 0)
        fprintf(stderr, "cohort-idlebench: rank %d slept and woke %.1f times a second, over %.0f\n",
                over, all[over * F_COUNT + F_VCSW], max_wakeups);
    free(all);
    if ((st = coh_finalize(ctx))) die("finalize", st);
    return over >= 0 ? 1 : 0;
}
