/*
 * cohort-sim - the scheduler simulator front end (sched/sc_sim.h does the
 * simulating; this file parses flags, reads files, prints, times).
 *
 *   cohort-sim [run] [flags]        random runs over --seeds K seeds
 *   cohort-sim replay FILE [flags]  an exact scenario, no randomness
 *   cohort-sim sweep [flags]        the paper's sweeps -> CSV + PNG plots
 *   cohort-sim bench [flags]        decision time of the scheduler
 *
 * Every scheduler parameter is a flag of the same name (cohort-sim --help).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cohort.h"
#include "base/bs_alloc.h"
#include "sched/sc_lb.h"
#include "sched/sc_sim.h"
#include "sched/sched.h"

#ifndef COHORT_SIM_PLOT
#define COHORT_SIM_PLOT "tools/sim_plot.py"
#endif

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The name of a status code, from the public header's X-macro (cohort-sim
 * links only sched/, not the library that implements coh_strerror). */
static const char *status_str(int rc)
{
    switch (rc) {
#define STATUS_CASE(name, value, msg)                                                              \
    case value: return msg;
        COH_STATUS_MAP(STATUS_CASE)
#undef STATUS_CASE
    }
    return "unknown error";
}

static void die(const char *fmt, const char *arg)
{
    fprintf(stderr, "cohort-sim: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n");
    exit(2);
}

/* ---- options ---- */

#define MAX_SCHEMES 8
#define MAX_FAILS   64

typedef struct opts {
    sc_sim_cfg_t cfg;
    sc_policy schemes[MAX_SCHEMES];
    int nschemes;
    int seeds;
    uint64_t seed_base;
    bool csv, events, no_plot, pfrac_set, p_set, duration_set, scheme_set;
    int trace; /* -1: off; -2: every decision; else decisions naming this worker */
    const char *dist_arg;
    const char *out_dir;
    const char *what;
    const char *plot_script;
    int reps;
    sc_sim_fail_t fails[MAX_FAILS];
    int nfails;
    /* samples of a --dist FILE */
    double *samples;
    int nsamples;
} opts_t;

static void usage(FILE *f)
{
    fprintf(
        f, "usage: cohort-sim [run] [flags]\n"
           "       cohort-sim replay FILE [--events] [flags]\n"
           "       cohort-sim sweep [--what n,p,eta,theta,start,bw-error,lambda,alpha,eq4,dt,\n"
           "                        compute,relay | all]\n"
           "                        [--out DIR] [--no-plot] [flags]\n"
           "       cohort-sim bench [--n N] [--reps R]\n"
           "       cohort-sim rails --rail LAT_US:MBIT [--rail ...] [--size BYTES] [--ops N]\n"
           "                        [--ranks N] [--cut R@OP] [--back R@OP] [--rate R@OP:MBIT]\n"
           "                        [--detect-ms MS] [--table-in FILE] [--table-out FILE] [--csv]\n"
           "                        multi-rail allreduces through the live load balancer\n"
           "                        (sched/sc_lb.h): a rail cut at an op, back at another,\n"
           "                        rates that change\n\n"
           "simulation flags:\n"
           "  --n N               workers (40)\n"
           "  --scheme LIST       allreduce,partial,selective,relay (allreduce,partial,selective)\n"
           "  --seeds K           seeds 1..K (20); --seed-base B: seeds B..B+K-1\n"
           "  --duration-s S      simulated training time (100)\n"
           "  --dist D            cnn, transformer (default) or a CSV file of compute times\n"
           "                      (one per line, or a column named compute_s)\n"
           "  --compute-scale X   multiply every compute time by X (1)\n"
           "  --slow-frac F       a random fraction F of the workers computes\n"
           "  --slow-factor S     S times slower: persistent stragglers (0, 1)\n"
           "  --lambda L          bandwidth round(20u,3) Gbps, u ~ U[L,1] (0.05)\n"
           "  --bw-error E        estimates b(1+E x), x ~ U[-1,1] (0)\n"
           "  --start warm|cold   CDF known in advance, or learned (warm)\n"
           "  --fail W@T          worker W dies at T s (repeatable); --detect-s S (1)\n"
           "  --csv               CSV: one row per (scheme, seed)\n"
           "  --events            replay: print every launched sync\n\n"
           "scheduler parameters (sched/sched.h):\n");
    int np;
    const sc_param_info_t *pi = sc_params_info(&np);
    for (int i = 0; i < np; i++) {
        if (!strcmp(pi[i].name, "scheme")) continue;
        fprintf(f, "  --%-18s %s (%s)\n", pi[i].name, pi[i].help, pi[i].deflt);
    }
}

static double parse_num(const char *flag, const char *v)
{
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (end == v || *end || errno || !isfinite(x)) die("bad value for %s", flag);
    return x;
}

static void parse_schemes(opts_t *o, const char *list)
{
    o->nschemes = 0;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", list);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        if (o->nschemes == MAX_SCHEMES) die("too many schemes in %s", list);
        if (sc_policy_from_name(tok, &o->schemes[o->nschemes++])) die("unknown scheme %s", tok);
    }
    if (!o->nschemes) die("empty --scheme %s", list);
}

/* Read numbers: a CSV with a header holding compute_s, or one per line. */
static int read_samples(const char *path, double **out, int *n)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[4096];
    int col = 0, cap = 0, k = 0;
    double *xs = NULL;
    bool first = true;
    while (fgets(line, sizeof(line), f)) {
        if (line[0] == '#' || line[0] == '\n') continue;
        if (first) {
            first = false;
            char *c = strstr(line, "compute_s");
            if (c) {
                for (char *q = line; q < c; q++) col += *q == ',';
                continue;
            }
        }
        char *p = line;
        for (int i = 0; i < col && p; i++) {
            p = strchr(p, ',');
            if (p) p++;
        }
        if (!p) continue;
        char *end;
        double x = strtod(p, &end);
        if (end == p || !isfinite(x) || x < 0) {
            fclose(f);
            coh_free(xs);
            return -2;
        }
        if (k == cap) {
            cap = cap ? 2 * cap : 1024;
            double *t = coh_realloc(xs, (size_t)cap * sizeof(double));
            if (!t) {
                fclose(f);
                coh_free(xs);
                return -1;
            }
            xs = t;
        }
        xs[k++] = x;
    }
    fclose(f);
    *out = xs;
    *n = k;
    return k > 0 ? 0 : -2;
}

static void parse_args(opts_t *o, int argc, char **argv, int first, const char **positional)
{
    sc_sim_cfg_default(&o->cfg);
    o->cfg.n = 200; /* the paper's default scale (IV-B1) */
    o->seeds = 20;
    o->seed_base = 1;
    o->reps = 200;
    o->trace = -1;
    parse_schemes(o, "allreduce,partial,selective");
    sc_dist_from_name("transformer", &o->cfg.dist);
    for (int i = first; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2)) {
            if (positional && !*positional) {
                *positional = a;
                continue;
            }
            die("unexpected argument %s", a);
        }
        const char *name = a + 2;
        if (!strcmp(name, "help")) {
            usage(stdout);
            exit(0);
        }
        if (!strcmp(name, "csv")) {
            o->csv = true;
            continue;
        }
        if (!strcmp(name, "events")) {
            o->events = true;
            continue;
        }
        if (!strcmp(name, "no-plot")) {
            o->no_plot = true;
            continue;
        }
        if (i + 1 >= argc) die("%s needs a value", a);
        const char *v = argv[++i];
        if (!strcmp(name, "n")) {
            o->cfg.n = (int)parse_num(a, v);
            if (o->cfg.n < 1) die("bad --n %s", v);
        } else if (!strcmp(name, "scheme")) {
            parse_schemes(o, v);
            o->scheme_set = true;
        } else if (!strcmp(name, "seeds")) {
            o->seeds = (int)parse_num(a, v);
            if (o->seeds < 1) die("bad --seeds %s", v);
        } else if (!strcmp(name, "seed-base")) {
            o->seed_base = (uint64_t)parse_num(a, v);
        } else if (!strcmp(name, "duration-s")) {
            o->cfg.duration_s = parse_num(a, v);
            o->duration_set = true;
        } else if (!strcmp(name, "lambda")) {
            o->cfg.lambda = parse_num(a, v);
        } else if (!strcmp(name, "compute-scale")) {
            o->cfg.compute_scale = parse_num(a, v);
        } else if (!strcmp(name, "slow-frac")) {
            o->cfg.slow_frac = parse_num(a, v);
        } else if (!strcmp(name, "slow-factor")) {
            o->cfg.slow_factor = parse_num(a, v);
        } else if (!strcmp(name, "bw-error")) {
            o->cfg.bw_error = parse_num(a, v);
        } else if (!strcmp(name, "detect-s")) {
            o->cfg.detect_s = parse_num(a, v);
        } else if (!strcmp(name, "start")) {
            if (!strcmp(v, "warm"))
                o->cfg.warm = true;
            else if (!strcmp(v, "cold"))
                o->cfg.warm = false;
            else
                die("--start is warm or cold, not %s", v);
        } else if (!strcmp(name, "dist")) {
            o->dist_arg = v;
        } else if (!strcmp(name, "fail")) {
            const char *at = strchr(v, '@');
            if (!at || o->nfails == MAX_FAILS) die("bad --fail %s (W@T)", v);
            o->fails[o->nfails].worker = atoi(v);
            o->fails[o->nfails].t = parse_num(a, at + 1);
            o->nfails++;
        } else if (!strcmp(name, "trace")) {
            o->trace = !strcmp(v, "all") ? -2 : (int)parse_num(a, v);
        } else if (!strcmp(name, "out")) {
            o->out_dir = v;
        } else if (!strcmp(name, "what")) {
            o->what = v;
        } else if (!strcmp(name, "plot-script")) {
            o->plot_script = v;
        } else if (!strcmp(name, "reps")) {
            o->reps = (int)parse_num(a, v);
        } else {
            if (!strcmp(name, "p")) o->p_set = true;
            if (!strcmp(name, "p-frac")) o->pfrac_set = true;
            if (sc_params_set(&o->cfg.sched, name, v)) die("unknown flag or bad value: %s", a);
        }
    }
    if (o->p_set && o->pfrac_set) die("%s", "give --p or --p-frac, not both");
    if (o->dist_arg && sc_dist_from_name(o->dist_arg, &o->cfg.dist)) {
        int rc = read_samples(o->dist_arg, &o->samples, &o->nsamples);
        if (rc) die("cannot read compute times from %s", o->dist_arg);
        o->cfg.dist =
            (sc_dist_t){.kind = SC_DIST_SAMPLES, .samples = o->samples, .nsamples = o->nsamples};
    }
    o->cfg.fails = o->fails;
    o->cfg.nfails = o->nfails;
}

/* ---- statistics ---- */

enum { M_TIME, M_SCALE, M_SYNC, M_ITER, M_WASTE, M_COUNT };
static const char *const metric_names[M_COUNT] = {"avg_sync_time_s", "avg_sync_scale", "total_sync",
                                                  "total_iteration", "wasted_wait_ms_per_worker"};

static void metrics_of(const sc_sim_result_t *r, double *m)
{
    m[M_TIME] = r->avg_sync_time_s;
    m[M_SCALE] = r->avg_sync_scale;
    m[M_SYNC] = (double)r->total_sync;
    m[M_ITER] = (double)r->total_iteration;
    m[M_WASTE] = r->wasted_wait_ms_per_worker;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* min, median, max of k values (sorted in place). */
static void mmm(double *v, int k, double out[3])
{
    qsort(v, (size_t)k, sizeof(double), cmp_d);
    out[0] = v[0];
    out[1] = k % 2 ? v[k / 2] : 0.5 * (v[k / 2 - 1] + v[k / 2]);
    out[2] = v[k - 1];
}

static void print_row(FILE *f, sc_policy scheme, int n, uint64_t seed, const sc_sim_result_t *r)
{
    fprintf(f, "%s,%d,%llu,%.9g,%.9g,%lld,%lld,%.9g\n", sc_policy_name(scheme), n,
            (unsigned long long)seed, r->avg_sync_time_s, r->avg_sync_scale,
            (long long)r->total_sync, (long long)r->total_iteration, r->wasted_wait_ms_per_worker);
}

static const char csv_header[] = "scheme,n,seed,avg_sync_time_s,avg_sync_scale,total_sync,"
                                 "total_iteration,wasted_wait_ms_per_worker";

/* ---- trace ---- */

static void trace_cb(void *ctx, const sc_decision_t *d)
{
    int w = *(const int *)ctx;
    bool hit = w == -2;
    for (int i = 0; !hit && i < d->nmembers; i++) hit = d->members[i] == w;
    for (int i = 0; !hit && i < d->nrelays; i++) hit = d->relays[i] == w;
    if (!hit) return;
    char line[1024];
    sc_decision_explain(d, line, sizeof(line));
    fprintf(stderr, "%s\n", line);
}

/* ---- run ---- */

static int cmd_run(opts_t *o)
{
    int K = o->seeds, S = o->nschemes;
    double *vals = coh_calloc((size_t)S * M_COUNT * K, sizeof(double));
    double *walls = coh_calloc((size_t)S, sizeof(double));
    if (!vals || !walls) return 1;
    if (o->csv) printf("%s\n", csv_header);
    int bad = 0;
    for (int si = 0; si < S; si++) {
        double t0 = now_s();
        for (int k = 0; k < K; k++) {
            sc_sim_cfg_t cfg = o->cfg;
            cfg.sched.policy = o->schemes[si];
            cfg.seed = o->seed_base + (uint64_t)k;
            cfg.check = true;
            if (o->trace != -1) {
                cfg.trace = trace_cb;
                cfg.trace_ctx = &o->trace;
            }
            sc_sim_result_t r;
            int rc = sc_sim_run(&cfg, &r);
            if (rc) {
                fprintf(stderr, "cohort-sim: %s seed %llu: %s\n", sc_policy_name(cfg.sched.policy),
                        (unsigned long long)cfg.seed, status_str(rc));
                return 1;
            }
            if (r.violations) {
                fprintf(stderr, "cohort-sim: %s seed %llu: %lld invariant violations, first: %s\n",
                        sc_policy_name(cfg.sched.policy), (unsigned long long)cfg.seed,
                        (long long)r.violations, r.violation);
                bad = 1;
            }
            double m[M_COUNT];
            metrics_of(&r, m);
            for (int j = 0; j < M_COUNT; j++) vals[((size_t)si * M_COUNT + j) * K + k] = m[j];
            if (o->csv) print_row(stdout, cfg.sched.policy, cfg.n, cfg.seed, &r);
            sc_sim_result_free(&r);
        }
        walls[si] = now_s() - t0;
    }
    if (!o->csv) {
        const sc_sim_cfg_t *c = &o->cfg;
        printf("cohort-sim: n=%d p=%d dist=%s x%g duration=%gs seeds=%d..%llu lambda=%g "
               "bw-error=%g start=%s alpha=%gms model=%gMB eta=%g theta=%g dt=%gms c=%d eq4=%s\n",
               c->n, sc_params_p(&c->sched, c->n), sc_dist_name(&c->dist), c->compute_scale,
               c->duration_s, (int)o->seed_base,
               (unsigned long long)(o->seed_base + (uint64_t)K - 1), c->lambda, c->bw_error,
               c->warm ? "warm" : "cold", c->sched.alpha_s * 1e3, c->sched.model_mb, c->sched.eta,
               c->sched.theta, c->sched.dt_s * 1e3, c->sched.c,
               c->sched.eq4 == SC_EQ4_CONDITIONAL ? "conditional" : "printed");
        printf("%-10s %-26s %12s %12s %12s\n", "scheme", "metric (over seeds)", "min", "median",
               "max");
        double med[MAX_SCHEMES][M_COUNT];
        for (int si = 0; si < S; si++) {
            for (int j = 0; j < M_COUNT; j++) {
                double q[3];
                mmm(&vals[((size_t)si * M_COUNT + j) * K], K, q);
                med[si][j] = q[1];
                printf("%-10s %-26s %12.4f %12.4f %12.4f\n", sc_policy_name(o->schemes[si]),
                       metric_names[j], q[0], q[1], q[2]);
            }
            printf("%-10s %-26s %12.3f s for %d seeds\n", sc_policy_name(o->schemes[si]),
                   "wall time", walls[si], K);
        }
        int ip = -1, is = -1;
        for (int si = 0; si < S; si++) {
            if (o->schemes[si] == SC_POLICY_PARTIAL) ip = si;
            if (o->schemes[si] == SC_POLICY_SELECTIVE) is = si;
        }
        if (ip >= 0 && is >= 0 && med[is][M_TIME] > 0 && med[ip][M_SCALE] > 0 &&
            med[ip][M_ITER] > 0)
            printf("selective vs partial (medians): sync time %.2fx lower, scale %.2fx larger, "
                   "total iteration %.2fx larger\n",
                   med[ip][M_TIME] / med[is][M_TIME], med[is][M_SCALE] / med[ip][M_SCALE],
                   med[is][M_ITER] / med[ip][M_ITER]);
    }
    coh_free(vals);
    coh_free(walls);
    return bad;
}

/* ---- replay ---- */

typedef struct scenario {
    int n, nrows;
    int *off;
    double *bw, *compute;
} scenario_t;

/* FILE: header worker,bandwidth_gbps,compute_s (any column order), then one
 * row per (worker, iteration) in iteration order. */
static int read_scenario(const char *path, scenario_t *sc, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    char line[4096];
    int col[3] = {-1, -1, -1}, ncol = 0, lineno = 0, cap = 0, k = 0;
    int *wk = NULL;
    double *bw = NULL, *cs = NULL;
    static const char *const names[3] = {"worker", "bandwidth_gbps", "compute_s"};
    bool header = false;
    int rc = 0;
    while (fgets(line, sizeof(line), f)) {
        lineno++;
        line[strcspn(line, "\r\n")] = '\0';
        if (line[0] == '\0' || line[0] == '#') continue;
        char *fields[16];
        int nf = 0;
        for (char *save = NULL, *tok = strtok_r(line, ",", &save); tok && nf < 16;
             tok = strtok_r(NULL, ",", &save))
            fields[nf++] = tok;
        if (!header) {
            for (int i = 0; i < nf; i++) {
                char *t = fields[i];
                while (*t == ' ') t++;
                for (int j = 0; j < 3; j++)
                    if (!strcmp(t, names[j])) col[j] = i;
            }
            if (col[0] < 0 || col[1] < 0 || col[2] < 0) {
                snprintf(err, errlen, "%s:%d: header must name worker,bandwidth_gbps,compute_s",
                         path, lineno);
                rc = -1;
                break;
            }
            ncol = nf;
            header = true;
            continue;
        }
        if (nf != ncol) {
            snprintf(err, errlen, "%s:%d: %d fields, expected %d", path, lineno, nf, ncol);
            rc = -1;
            break;
        }
        char *e0, *e1, *e2;
        long w = strtol(fields[col[0]], &e0, 10);
        double b = strtod(fields[col[1]], &e1);
        double c = strtod(fields[col[2]], &e2);
        if (*e0 || *e1 || *e2 || w < 0 || w > 1000000 || !(b > 0) || !(c >= 0) || !isfinite(b) ||
            !isfinite(c)) {
            snprintf(err, errlen, "%s:%d: bad row (worker >= 0, bandwidth > 0, compute >= 0)", path,
                     lineno);
            rc = -1;
            break;
        }
        if (k == cap) {
            cap = cap ? 2 * cap : 64;
            int *wk2 = coh_reallocn(wk, (size_t)cap, sizeof(int));
            if (wk2) wk = wk2;
            double *bw2 = coh_reallocn(bw, (size_t)cap, sizeof(double));
            if (bw2) bw = bw2;
            double *cs2 = coh_reallocn(cs, (size_t)cap, sizeof(double));
            if (cs2) cs = cs2;
            if (!wk2 || !bw2 || !cs2) {
                snprintf(err, errlen, "out of memory");
                rc = -1;
                break;
            }
        }
        wk[k] = (int)w;
        bw[k] = b;
        cs[k] = c;
        k++;
    }
    fclose(f);
    if (!rc && k == 0) {
        snprintf(err, errlen, "%s: no rows", path);
        rc = -1;
    }
    if (!rc) {
        int n = 0;
        for (int i = 0; i < k; i++)
            if (wk[i] + 1 > n) n = wk[i] + 1;
        sc->n = n;
        sc->nrows = k;
        sc->off = coh_calloc((size_t)n + 1, sizeof(int));
        sc->bw = coh_malloc((size_t)k * sizeof(double));
        sc->compute = coh_malloc((size_t)k * sizeof(double));
        int *fill = coh_calloc((size_t)n, sizeof(int));
        if (!sc->off || !sc->bw || !sc->compute || !fill) {
            snprintf(err, errlen, "out of memory");
            rc = -1;
        } else {
            for (int i = 0; i < k; i++) sc->off[wk[i] + 1]++;
            for (int i = 0; i < n; i++) {
                if (sc->off[i + 1] == 0) {
                    snprintf(err, errlen, "%s: worker %d has no rows (ids must be 0..n-1)", path,
                             i);
                    rc = -1;
                }
                sc->off[i + 1] += sc->off[i];
            }
            for (int i = 0; i < k; i++) {
                int at = sc->off[wk[i]] + fill[wk[i]]++;
                sc->bw[at] = bw[i];
                sc->compute[at] = cs[i];
            }
        }
        coh_free(fill);
    }
    coh_free(wk);
    coh_free(bw);
    coh_free(cs);
    return rc;
}

static int cmd_replay(opts_t *o, const char *path)
{
    if (!path) die("%s", "replay needs a FILE");
    scenario_t sc = {0};
    char err[256];
    if (read_scenario(path, &sc, err, sizeof(err))) die("%s", err);
    sc_replay_t rp = {.n = sc.n, .off = sc.off, .bw_gbps = sc.bw, .compute_s = sc.compute};
    if (!o->scheme_set) parse_schemes(o, "selective");
    if (o->nschemes != 1) die("%s", "replay takes one --scheme");
    sc_sim_cfg_t cfg = o->cfg;
    cfg.replay = &rp;
    cfg.sched.policy = o->schemes[0];
    cfg.seed = 0;
    cfg.record = o->events;
    cfg.check = true;
    if (o->trace != -1) {
        cfg.trace = trace_cb;
        cfg.trace_ctx = &o->trace;
    }
    /* A scenario runs until nothing moves unless a duration is given. */
    if (!o->duration_set) cfg.duration_s = INFINITY;
    sc_sim_result_t r;
    int rc = sc_sim_run(&cfg, &r);
    if (rc) {
        fprintf(stderr, "cohort-sim: replay: %s\n", status_str(rc));
        return 1;
    }
    if (o->events) {
        printf("start_s,end_s,members\n");
        for (int i = 0; i < r.nsyncs; i++) {
            const sc_sim_sync_t *s = &r.syncs[i];
            printf("%.9g,%.9g,", s->start, s->end);
            for (int j = 0; j < s->n; j++) printf(j ? " %d" : "%d", r.members[s->off + j]);
            printf("\n");
        }
    }
    double m[M_COUNT];
    metrics_of(&r, m);
    printf("scheme,%s\nn,%d\nseed,0\n", sc_policy_name(cfg.sched.policy), rp.n);
    printf("avg_sync_time_s,%.9g\navg_sync_scale,%.9g\ntotal_sync,%lld\ntotal_iteration,%lld\n"
           "wasted_wait_ms_per_worker,%.9g\n",
           m[M_TIME], m[M_SCALE], (long long)r.total_sync, (long long)r.total_iteration,
           m[M_WASTE]);
    int bad = 0;
    if (r.violations) {
        fprintf(stderr, "cohort-sim: %lld invariant violations, first: %s\n",
                (long long)r.violations, r.violation);
        bad = 1;
    }
    sc_sim_result_free(&r);
    coh_free(sc.off);
    coh_free(sc.bw);
    coh_free(sc.compute);
    return bad;
}

/* ---- sweep ---- */

typedef struct sweep_run {
    const char *sweep, *variant;
    double x;
    sc_sim_cfg_t cfg;
} sweep_run_t;

typedef struct sweep_list {
    sweep_run_t *r;
    int n, cap;
} sweep_list_t;

static sweep_run_t *add_run(sweep_list_t *l, const char *sweep, const char *variant, double x,
                            const sc_sim_cfg_t *base, sc_policy scheme)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        sweep_run_t *r = coh_reallocn(l->r, (size_t)l->cap, sizeof(*l->r));
        if (!r) die("%s", "out of memory");
        l->r = r;
    }
    sweep_run_t *r = &l->r[l->n++];
    r->sweep = sweep;
    r->variant = variant;
    r->x = x;
    r->cfg = *base;
    r->cfg.sched.policy = scheme;
    return r;
}

static bool wants(const char *what, const char *name)
{
    if (!what || !strcmp(what, "all")) return true;
    size_t len = strlen(name);
    for (const char *p = what; (p = strstr(p, name)); p += len)
        if ((p == what || p[-1] == ',') && (p[len] == ',' || p[len] == '\0')) return true;
    return false;
}

static const sc_policy three[] = {SC_POLICY_ALLREDUCE, SC_POLICY_PARTIAL, SC_POLICY_SELECTIVE};
static const sc_policy two[] = {SC_POLICY_PARTIAL, SC_POLICY_SELECTIVE};
static const double ns[] = {40, 80, 120, 160, 200};

static void build_sweeps(const opts_t *o, sweep_list_t *l)
{
    sc_sim_cfg_t base = o->cfg;
    sc_dist_t cnn, tr;
    sc_dist_from_name("cnn", &cnn);
    sc_dist_from_name("transformer", &tr);
    /* Figs. 5-7: cluster scale, both traces, the three schemes. */
    if (wants(o->what, "n"))
        for (int d = 0; d < 2; d++)
            for (int i = 0; i < 5; i++)
                for (int s = 0; s < 3; s++) {
                    sweep_run_t *r =
                        add_run(l, d ? "n_transformer" : "n_cnn", "", ns[i], &base, three[s]);
                    r->cfg.n = (int)ns[i];
                    r->cfg.dist = d ? tr : cnn;
                }
    /* The remaining figures use the Transformer trace and n = 200 (IV-B1). */
    base.dist = tr;
    base.n = 200;
    if (wants(o->what, "p"))
        for (int i = 1; i <= 5; i++)
            for (int s = 0; s < 2; s++) {
                sweep_run_t *r = add_run(l, "p", "", i / 10.0, &base, two[s]);
                r->cfg.sched.p = 0;
                r->cfg.sched.p_frac = i / 10.0;
            }
    if (wants(o->what, "eta"))
        for (int i = 0; i <= 4; i++)
            for (int s = 0; s < 2; s++) {
                sweep_run_t *r = add_run(l, "eta", "", 0.2 * i, &base, two[s]);
                r->cfg.sched.eta = 0.2 * i;
            }
    if (wants(o->what, "theta")) {
        static const double th[] = {1, 5, 10, 15, 20};
        for (int i = 0; i < 5; i++)
            for (int s = 0; s < 2; s++) {
                sweep_run_t *r = add_run(l, "theta", "", th[i], &base, two[s]);
                r->cfg.sched.theta = th[i];
            }
    }
    if (wants(o->what, "start"))
        for (int i = 0; i < 5; i++)
            for (int w = 0; w < 2; w++) {
                sweep_run_t *r =
                    add_run(l, "start", w ? "warm" : "cold", ns[i], &base, SC_POLICY_SELECTIVE);
                r->cfg.n = (int)ns[i];
                r->cfg.warm = w;
            }
    if (wants(o->what, "bw-error"))
        for (int i = 0; i <= 5; i++) {
            for (int w = 0; w < 2; w++) {
                sweep_run_t *r = add_run(l, "bw_error", w ? "warm" : "cold", 0.1 * i, &base,
                                         SC_POLICY_SELECTIVE);
                r->cfg.bw_error = 0.1 * i;
                r->cfg.warm = w;
            }
            sweep_run_t *r = add_run(l, "bw_error", "", 0.1 * i, &base, SC_POLICY_PARTIAL);
            r->cfg.bw_error = 0.1 * i;
        }
    if (wants(o->what, "lambda")) {
        static const double la[] = {0.05, 0.1, 0.2};
        for (int i = 0; i < 3; i++)
            for (int s = 0; s < 3; s++) {
                sweep_run_t *r = add_run(l, "lambda", "", la[i], &base, three[s]);
                r->cfg.lambda = la[i];
            }
    }
    if (wants(o->what, "alpha")) {
        static const double al[] = {0, 1, 5, 50};
        for (int i = 0; i < 4; i++)
            for (int s = 0; s < 3; s++) {
                sweep_run_t *r = add_run(l, "alpha", "", al[i], &base, three[s]);
                r->cfg.sched.alpha_s = al[i] * 1e-3;
            }
    }
    /* Both readings of Eq. 4, on both traces. */
    if (wants(o->what, "eq4"))
        for (int d = 0; d < 2; d++)
            for (int i = 0; i < 5; i++)
                for (int e = 0; e < 2; e++) {
                    sweep_run_t *r =
                        add_run(l, d ? "eq4_transformer" : "eq4_cnn", e ? "printed" : "conditional",
                                ns[i], &base, SC_POLICY_SELECTIVE);
                    r->cfg.n = (int)ns[i];
                    r->cfg.dist = d ? tr : cnn;
                    r->cfg.sched.eq4 = e ? SC_EQ4_PRINTED : SC_EQ4_CONDITIONAL;
                }
    if (wants(o->what, "dt")) {
        static const double dts[] = {1, 5, 10, 50, 100};
        for (int i = 0; i < 5; i++) {
            sweep_run_t *r = add_run(l, "dt", "", dts[i], &base, SC_POLICY_SELECTIVE);
            r->cfg.sched.dt_s = dts[i] * 1e-3;
        }
    }
    /* The traces' absolute scale is unknown: compute time x1, x3, x10. */
    if (wants(o->what, "compute")) {
        static const double cs[] = {1, 3, 10};
        for (int i = 0; i < 3; i++)
            for (int s = 0; s < 3; s++) {
                sweep_run_t *r = add_run(l, "compute", "", cs[i], &base, three[s]);
                r->cfg.compute_scale = cs[i];
            }
    }
    /* AdapCC's relay policy against allreduce (not in seeds/001), where it
     * applies: one persistent straggler (1 of 40 workers computes x times
     * slower), a 25 MB model, cold start. */
    if (wants(o->what, "relay")) {
        static const double sf[] = {1, 2, 4, 8};
        for (int i = 0; i < 4; i++)
            for (int s = 0; s < 2; s++) {
                sweep_run_t *r = add_run(l, "relay", "", sf[i], &base,
                                         s ? SC_POLICY_RELAY : SC_POLICY_ALLREDUCE);
                r->cfg.n = 40;
                r->cfg.sched.model_mb = 25;
                r->cfg.slow_frac = 1.0 / 40;
                r->cfg.slow_factor = sf[i];
                /* Cold start: each worker's CDF learns its own pace; a
                 * known pooled distribution would not know the straggler. */
                r->cfg.warm = false;
            }
    }
}

static void progress(int done, int total, double t0)
{
    /* Redraw when the bar moves or a second passed: a log file (not a tty)
     * gets a few dozen updates, not one per run. */
    static int last_fill = -1;
    static double last_t;
    int width = 40, fill = total ? done * width / total : width;
    double el = now_s() - t0;
    if (fill == last_fill && el - last_t < 1.0 && done != total) return;
    last_fill = fill;
    last_t = el;
    double eta = done ? el / done * (total - done) : 0;
    fprintf(stderr, "\r[");
    for (int i = 0; i < width; i++) fputc(i < fill ? '#' : '.', stderr);
    fprintf(stderr, "] %d/%d runs, %.0f s elapsed, ~%.0f s left ", done, total, el, eta);
    if (done == total) fputc('\n', stderr);
    fflush(stderr);
}

static int cmd_sweep(opts_t *o)
{
    const char *dir = o->out_dir ? o->out_dir : "sim-sweep";
    if (mkdir(dir, 0777) && errno != EEXIST) die("cannot create %s", dir);
    sweep_list_t l = {0};
    build_sweeps(o, &l);
    if (!l.n) die("nothing to sweep in --what %s", o->what ? o->what : "");
    char path[1024];
    snprintf(path, sizeof(path), "%s/sweep.csv", dir);
    FILE *f = fopen(path, "w");
    if (!f) die("cannot write %s", path);
    fprintf(f, "sweep,variant,dist,x,%s\n", csv_header);
    int K = o->seeds, total = l.n * K, done = 0, bad = 0;
    double t0 = now_s();
    progress(0, total, t0);
    for (int i = 0; i < l.n; i++) {
        for (int k = 0; k < K; k++) {
            sc_sim_cfg_t cfg = l.r[i].cfg;
            cfg.seed = o->seed_base + (uint64_t)k;
            cfg.check = true;
            sc_sim_result_t r;
            int rc = sc_sim_run(&cfg, &r);
            if (rc) {
                fprintf(stderr, "\ncohort-sim: sweep %s x=%g: %s\n", l.r[i].sweep, l.r[i].x,
                        status_str(rc));
                fclose(f);
                return 1;
            }
            if (r.violations) {
                fprintf(stderr, "\ncohort-sim: sweep %s x=%g seed %llu: %s\n", l.r[i].sweep,
                        l.r[i].x, (unsigned long long)cfg.seed, r.violation);
                bad = 1;
            }
            fprintf(f, "%s,%s,%s,%g,", l.r[i].sweep, l.r[i].variant, sc_dist_name(&cfg.dist),
                    l.r[i].x);
            print_row(f, cfg.sched.policy, cfg.n, cfg.seed, &r);
            sc_sim_result_free(&r);
            progress(++done, total, t0);
        }
    }
    fclose(f);
    coh_free(l.r);
    fprintf(stderr, "cohort-sim: wrote %s (%d configurations x %d seeds, %.1f s)\n", path, l.n, K,
            now_s() - t0);
    if (o->no_plot) return bad;
    const char *script = o->plot_script ? o->plot_script : COHORT_SIM_PLOT;
    const char *py = access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
    char cmd[2200];
    snprintf(cmd, sizeof(cmd), "'%s' '%s' '%s'", py, script, dir);
    int st = system(cmd);
    if (st != 0)
        fprintf(stderr,
                "cohort-sim: plotting failed (%s needs python3-matplotlib); the CSV is in %s\n",
                script, dir);
    return bad;
}

/* ---- bench ---- */

typedef struct bench_case {
    const char *name;
    sc_policy policy;
    int n, ready; /* workers, of which ready; the others computing */
    int p;        /* 0: the default p = 0.3n */
} bench_case_t;

/* Time one decision: a scheduler with `ready` workers ready (arrived over
 * the last second) and the others computing for up to a second, bandwidths
 * as in IV-A, the pooled CDF warm. Creation and events are not timed; the
 * tick is (it includes sorting the bandwidth order). */
static int bench_one(const bench_case_t *bc, int reps, double out[3], int *groups)
{
    double *t = coh_malloc((size_t)reps * sizeof(double));
    if (!t) return 1;
    sc_rng_t r;
    sc_rng_seed(&r, 7, 0);
    sc_dist_t dist;
    sc_dist_from_name("transformer", &dist);
    static double cdf[4096];
    for (int i = 0; i < 4096; i++) cdf[i] = sc_dist_draw(&dist, &r);
    for (int rep = 0; rep < reps; rep++) {
        sc_params_t p;
        sc_params_default(&p);
        p.policy = bc->policy;
        p.p = bc->p;
        sc_sched_t *s;
        if (sc_sched_create(&p, bc->n, &s)) return 1;
        int rc = sc_sched_load_cdf(s, -1, cdf, 4096);
        for (int w = 0; w < bc->n && !rc; w++)
            rc = sc_sched_on_bandwidth(s, w, sc_sim_draw_bandwidth(&r, 0.05));
        for (int w = 0; w < bc->n && !rc; w++)
            rc = sc_sched_on_compute_start(s, w, sc_rng_uniform(&r));
        for (int w = 0; w < bc->ready && !rc; w++)
            rc = sc_sched_on_ready(s, w, 1.0 + w * (1.0 / bc->ready), -1);
        sc_tick_t tk;
        double a = now_s();
        if (!rc) rc = sc_sched_tick(s, 2.0, &tk);
        double b = now_s();
        sc_sched_destroy(s);
        if (rc) {
            coh_free(t);
            return 1;
        }
        t[rep] = (b - a) * 1e6;
        *groups = tk.nlaunch;
    }
    mmm(t, reps, out);
    out[2] = t[(int)(0.99 * (reps - 1))]; /* t is sorted by mmm */
    coh_free(t);
    return 0;
}

static int cmd_bench(opts_t *o)
{
    int reps = o->reps > 0 ? o->reps : 200;
    static const bench_case_t cases[] = {
        {"selective, 1024 ready (all)", SC_POLICY_SELECTIVE, 1024, 1024, 0},
        {"selective, 1024 ready + 1024 computing", SC_POLICY_SELECTIVE, 2048, 1024, 0},
        {"selective, 1024 ready + 1024 computing, p=2", SC_POLICY_SELECTIVE, 2048, 1024, 2},
        {"partial, 1024 ready (all)", SC_POLICY_PARTIAL, 1024, 1024, 0},
        {"allreduce, 1024 ready (all)", SC_POLICY_ALLREDUCE, 1024, 1024, 0},
        {"relay, 1024 ready + 1 computing", SC_POLICY_RELAY, 1025, 1024, 0},
    };
    printf("decision time of one sc_sched_tick, %d repetitions per case\n", reps);
    printf("%-46s %10s %10s %10s %7s\n", "case", "min us", "median us", "p99 us", "groups");
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        double q[3];
        int groups = 0;
        if (bench_one(&cases[i], reps, q, &groups)) return 1;
        printf("%-46s %10.1f %10.1f %10.1f %7d\n", cases[i].name, q[0], q[1], q[2], groups);
    }
    return 0;
}

/* ---- cohort-sim rails: the multi-rail balancer on modelled rails ---- */

typedef struct rail_ev {
    int kind; /* 0 cut, 1 back, 2 rate */
    int rail;
    int op;
    double mbit;
} rail_ev_t;

/* A ring allreduce of `share` bytes over n ranks on one rail: 2(n-1) steps,
 * each a latency and a chunk of share/n bytes at the rail's rate. */
static double ring_time(double lat_s, double bps, double share, int n)
{
    if (share <= 0) return 0;
    if (n < 2) return lat_s + share / bps;
    return 2.0 * (n - 1) * (lat_s + share / n / bps);
}

static int cmd_rails(int argc, char **argv, int first)
{
    double lat[SC_MAX_RAILS], bps[SC_MAX_RAILS];
    int nr = 0, ops = 300, ranks = 4, nev = 0;
    double size = 16.0 * (1 << 20), detect_ms = 100;
    rail_ev_t ev[64];
    const char *tin = NULL, *tout = NULL;
    bool csv = false;
    for (int i = first; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        double x = 0, y = 0;
        int r = 0, k = 0;
        if (!strcmp(a, "--csv")) {
            csv = true;
            continue;
        }
        if (!v) die("%s needs a value", a);
        i++;
        if (!strcmp(a, "--rail")) {
            if (nr == SC_MAX_RAILS || sscanf(v, "%lf:%lf", &x, &y) != 2 || x < 0 || y <= 0)
                die("bad --rail %s (LAT_US:MBIT)", v);
            lat[nr] = x * 1e-6;
            bps[nr++] = y * 1e6 / 8;
        } else if (!strcmp(a, "--size")) {
            size = parse_num(a, v);
        } else if (!strcmp(a, "--ops")) {
            ops = (int)parse_num(a, v);
        } else if (!strcmp(a, "--ranks")) {
            ranks = (int)parse_num(a, v);
        } else if (!strcmp(a, "--detect-ms")) {
            detect_ms = parse_num(a, v);
        } else if (!strcmp(a, "--table-in")) {
            tin = v;
        } else if (!strcmp(a, "--table-out")) {
            tout = v;
        } else if ((!strcmp(a, "--cut") || !strcmp(a, "--back")) && nev < 64) {
            if (sscanf(v, "%d@%d", &r, &k) != 2) die("bad %s (R@OP)", a);
            ev[nev++] = (rail_ev_t){.kind = a[2] == 'c' ? 0 : 1, .rail = r, .op = k};
        } else if (!strcmp(a, "--rate") && nev < 64) {
            if (sscanf(v, "%d@%d:%lf", &r, &k, &x) != 3 || x <= 0) die("bad --rate %s", v);
            ev[nev++] = (rail_ev_t){.kind = 2, .rail = r, .op = k, .mbit = x};
        } else {
            die("unknown flag %s", a);
        }
    }
    if (nr < 1 || ops < 1 || ranks < 1 || size < 1) die("%s", "cohort-sim rails needs --rail");
    for (int e = 0; e < nev; e++)
        if (ev[e].rail < 0 || ev[e].rail >= nr)
            die("%s", "an event names a rail that is not there");
    sc_lb_t *lb;
    if (sc_lb_create(nr, NULL, &lb) < 0) die("%s", "cannot create the balancer");
    if (tin) {
        FILE *f = fopen(tin, "r");
        static char text[1 << 16];
        size_t n = f ? fread(text, 1, sizeof(text) - 1, f) : 0;
        if (f) fclose(f);
        text[n] = 0;
        if (!n || sc_lb_load(lb, text) < 0) die("cannot load the table %s", tin);
    }
    bool up[SC_MAX_RAILS];
    for (int r = 0; r < nr; r++) up[r] = true;
    if (csv) printf("op,ms,striped,rails_up%s\n", nr > 1 ? ",share0,share1,..." : ",share0");
    double total = 0, best_single = 0, worst_failover = 0;
    int failovers = 0, last_change = 0, converged_at = -1;
    double prev_f0 = -1;
    for (int op = 1; op <= ops; op++) {
        int cut = -1;
        for (int e = 0; e < nev; e++) {
            if (ev[e].op != op) continue;
            if (ev[e].kind == 0) cut = ev[e].rail;
            if (ev[e].kind == 1) {
                up[ev[e].rail] = true;
                sc_lb_set_up(lb, ev[e].rail, true);
                last_change = op;
                converged_at = -1;
            }
            if (ev[e].kind == 2) {
                bps[ev[e].rail] = ev[e].mbit * 1e6 / 8;
                last_change = op;
                converged_at = -1;
            }
        }
        sc_lb_plan_t p;
        if (sc_lb_split(lb, (uint64_t)size, 4, (uint64_t)op, &p) < 0) {
            printf("op %d: no rail is up: the op fails (EPEER)\n", op);
            continue;
        }
        double t = 0;
        for (int r = 0; r < nr; r++) {
            double tr = ring_time(lat[r], bps[r], (double)p.bytes[r], ranks);
            if (p.bytes[r]) sc_lb_observe(lb, r, p.bytes[r], tr);
            if (r != cut && tr > t) t = tr;
        }
        if (cut >= 0) {
            /* The rail dies under the op: noticed after detect_ms, its share
             * re-run on the rails still up (split by the balancer). */
            up[cut] = false;
            sc_lb_set_up(lb, cut, false);
            double extra = detect_ms / 1e3;
            sc_lb_plan_t q;
            if (p.bytes[cut] && sc_lb_split(lb, p.bytes[cut], 4, (uint64_t)op, &q) == 0)
                for (int r = 0; r < nr; r++) {
                    double tr = ring_time(lat[r], bps[r], (double)q.bytes[r], ranks);
                    if (tr > 0) extra = fmax(extra, detect_ms / 1e3 + tr);
                }
            else if (p.bytes[cut])
                extra = INFINITY;
            if (p.bytes[cut]) {
                failovers++;
                worst_failover = fmax(worst_failover, extra);
            }
            t = fmax(t, extra);
            last_change = op;
            converged_at = -1;
        }
        double single = INFINITY;
        for (int r = 0; r < nr; r++)
            if (up[r]) single = fmin(single, ring_time(lat[r], bps[r], size, ranks));
        total += t;
        best_single += single;
        double f0 = (double)p.bytes[0] / size;
        if (converged_at < 0 && op > last_change + 1 && fabs(f0 - prev_f0) < 0.01)
            converged_at = op - last_change;
        prev_f0 = f0;
        if (csv) {
            int nup = 0;
            for (int r = 0; r < nr; r++) nup += up[r];
            printf("%d,%.3f,%d,%d", op, t * 1e3, p.striped, nup);
            for (int r = 0; r < nr; r++) printf(",%.4f", (double)p.bytes[r] / size);
            printf("\n");
        }
    }
    char table[1 << 14];
    sc_lb_dump(lb, table, sizeof(table));
    if (tout) {
        FILE *f = fopen(tout, "w");
        if (!f || fputs(table, f) < 0) die("cannot write %s", tout);
        fclose(f);
    }
    printf("# %d ops of %.0f bytes on %d ranks, %d rail(s): mean %.3f ms, best single rail %.3f "
           "ms (%.2fx)\n",
           ops, size, ranks, nr, total / ops * 1e3, best_single / ops * 1e3, best_single / total);
    printf("# failovers %d, worst extra time %.1f ms; ops to converge after the last change: %d\n",
           failovers, worst_failover * 1e3, converged_at);
    if (!csv) fputs(table, stdout);
    sc_lb_destroy(lb);
    return 0;
}

int main(int argc, char **argv)
{
    const char *cmd = argc > 1 && strncmp(argv[1], "--", 2) ? argv[1] : "run";
    int first = argc > 1 && strncmp(argv[1], "--", 2) ? 2 : 1;
    static opts_t o;
    const char *positional = NULL;
    if (!strcmp(cmd, "run")) {
        parse_args(&o, argc, argv, first, NULL);
        return cmd_run(&o);
    }
    if (!strcmp(cmd, "replay")) {
        parse_args(&o, argc, argv, first, &positional);
        return cmd_replay(&o, positional);
    }
    if (!strcmp(cmd, "sweep")) {
        parse_args(&o, argc, argv, first, NULL);
        return cmd_sweep(&o);
    }
    if (!strcmp(cmd, "bench")) {
        parse_args(&o, argc, argv, first, NULL);
        return cmd_bench(&o);
    }
    if (!strcmp(cmd, "rails")) return cmd_rails(argc, argv, first);
    if (!strcmp(cmd, "help") || !strcmp(cmd, "-h")) {
        usage(stdout);
        return 0;
    }
    usage(stderr);
    return 2;
}
