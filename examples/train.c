/*
 * cohort-train - a data-parallel trainer with stragglers: the main job.
 *
 *   cohortrun -n 4 -- cohort-train [--mode allreduce|partial|selective] [options]
 *
 * Softmax regression on Gaussian clusters (10 classes, 128 features with
 * scales spread over a factor 8, so plain SGD needs hundreds of steps). The
 * data set comes from a seed: every rank draws its own training shard and the
 * same validation set. Each rank runs local SGD steps; after every step (or
 * every --sync-every steps) it calls coh_sync with weight = local steps since
 * its last sync and continues from the group's weighted average. Stragglers
 * are injected by sleeping after the real compute so that a step lasts a draw
 * of docs/sched.md's cnn / transformer distributions (sc_dist_draw, the
 * simulator's own sampler), times --compute-scale, times the rank's --slow
 * factor.
 *
 * Stopping is agreed, not guessed: every --eval-every steps a rank evaluates
 * its model and submits a small world allreduce (a "vote": losses, clocks and
 * whether it wants to stop). Votes complete in the background while the rank
 * trains on; all ranks see the same result of vote j, so all stop after the
 * same vote. In allreduce mode votes are consumed at once, so every rank
 * stops after the same step and the replicas stay identical.
 *
 * Rank 0 prints a progress line per vote and a summary (per-rank numbers
 * gathered with coh_allreduce). Exit codes: 0 ok, 1 failure, 2 usage,
 * 3 --check failed.
 */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cohort.h"
#include "sched/sc_sim.h"

#define EXIT_CHECK 3

/* ---- options ---- */

typedef struct opts {
    int mode; /* coh_sync_mode; -1 until known */
    const char *dist_name;
    double compute_scale;
    const char *slow;
    const char *die; /* "R:S": rank R dies (SIGKILL) at its local step S */
    uint64_t seed;
    double target_loss;
    double max_time_s;
    long max_iters;
    double lr;
    int batch, features, classes, samples, val_samples;
    double separation;
    int eval_every, sync_every;
    long model_kb;
    double loss_bound;
    bool csv, check, quiet, collective;
} opts_t;

static const char *const mode_names[] = {"allreduce", "partial", "selective", "relay"};

static int mode_from_name(const char *s)
{
    for (int m = 0; m < 4; m++)
        if (!strcmp(s, mode_names[m])) return m;
    return -1;
}

static void usage(FILE *f)
{
    fprintf(
        f, "usage: cohortrun -n N -- cohort-train [options]\n"
           "  --mode M           allreduce, partial, selective or relay (default:\n"
           "                     $COHORT_SYNC_MODE,\n"
           "                     else the library's default, selective)\n"
           "  --dist D           injected compute time per step: cnn, transformer (docs/sched.md)\n"
           "                     or none (real compute only) [cnn]\n"
           "  --compute-scale X  multiply every injected compute time by X [0.05]\n"
           "  --slow R:F,...     rank R computes F times slower (persistent straggler)\n"
           "  --die R:S          rank R dies (SIGKILL) at its local step S. In relay mode the\n"
           "                     others go on: the dead rank's shard is split among them and\n"
           "                     their batches grow so the global batch stays the same\n"
           "  --seed S           data, initial batches and compute times [1]\n"
           "  --target-loss X    stop when the ranks' mean validation loss reaches X [0.5]\n"
           "  --max-time S       stop after S seconds of training [30]\n"
           "  --max-iters N      stop once a rank has done N local steps (0: no limit) [0]\n"
           "  --lr X             SGD learning rate [0.1]\n"
           "  --batch B          minibatch per step and rank [32]\n"
           "  --features D       input features [128]\n"
           "  --classes C        classes [10]\n"
           "  --samples N        training samples per rank [4096]\n"
           "  --val-samples N    validation samples, the same on every rank [2048]\n"
           "  --separation X     distance scale of the class centres (lower: more overlap) [0.3]\n"
           "  --eval-every K     evaluate and vote every K local steps; the limits above are\n"
           "                     checked there [10]\n"
           "  --sync-every K     coh_sync every K local steps, weight = K [1]\n"
           "  --model-kb K       pad the synchronised buffer with zeros to K KiB [0]\n"
           "  --csv              also print 'csv-header:' and 'csv:' summary lines\n"
           "  --check            exit 3 unless the target was reached (and, in allreduce\n"
           "                     mode, every rank ends with a bit-identical model)\n"
           "  --collective       allreduce mode through coh_allreduce(avg) instead of coh_sync:\n"
           "                     the baseline without a coordinator\n"
           "  --loss-bound X     --collective through a bounded-loss allreduce: on udp rails\n"
           "                     (COHORT_NICS=eth0:udp) each receive may miss up to X of its\n"
           "                     bytes (the pull stage X/4); replicas may then differ [0]\n"
           "  --quiet            no progress lines\n");
}

static int parse_opts(int argc, char **argv, opts_t *o)
{
    *o = (opts_t){.mode = -1,
                  .dist_name = "cnn",
                  .compute_scale = 0.05,
                  .seed = 1,
                  .target_loss = 0.5,
                  .max_time_s = 30,
                  .lr = 0.1,
                  .batch = 32,
                  .features = 128,
                  .classes = 10,
                  .samples = 4096,
                  .val_samples = 2048,
                  .separation = 0.3,
                  .eval_every = 10,
                  .sync_every = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        }
        if (!strcmp(a, "--csv")) {
            o->csv = true;
            continue;
        }
        if (!strcmp(a, "--check")) {
            o->check = true;
            continue;
        }
        if (!strcmp(a, "--quiet")) {
            o->quiet = true;
            continue;
        }
        if (!strcmp(a, "--collective")) {
            o->collective = true;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "cohort-train: %s needs a value (or is unknown)\n", a);
            return -1;
        }
        const char *v = argv[++i];
        char *end = NULL;
        double x = strtod(v, &end);
        bool num = end != v && *end == '\0';
        if (!strcmp(a, "--mode")) {
            if ((o->mode = mode_from_name(v)) < 0) {
                fprintf(stderr, "cohort-train: unknown mode '%s'\n", v);
                return -1;
            }
        } else if (!strcmp(a, "--dist")) {
            o->dist_name = v;
        } else if (!strcmp(a, "--slow")) {
            o->slow = v;
        } else if (!strcmp(a, "--die")) {
            o->die = v;
        } else if (!num) {
            fprintf(stderr, "cohort-train: %s: '%s' is not a number (or %s is unknown)\n", a, v, a);
            return -1;
        } else if (!strcmp(a, "--compute-scale")) {
            o->compute_scale = x;
        } else if (!strcmp(a, "--seed")) {
            o->seed = (uint64_t)x;
        } else if (!strcmp(a, "--target-loss")) {
            o->target_loss = x;
        } else if (!strcmp(a, "--max-time")) {
            o->max_time_s = x;
        } else if (!strcmp(a, "--max-iters")) {
            o->max_iters = (long)x;
        } else if (!strcmp(a, "--lr")) {
            o->lr = x;
        } else if (!strcmp(a, "--batch")) {
            o->batch = (int)x;
        } else if (!strcmp(a, "--features")) {
            o->features = (int)x;
        } else if (!strcmp(a, "--classes")) {
            o->classes = (int)x;
        } else if (!strcmp(a, "--samples")) {
            o->samples = (int)x;
        } else if (!strcmp(a, "--val-samples")) {
            o->val_samples = (int)x;
        } else if (!strcmp(a, "--separation")) {
            o->separation = x;
        } else if (!strcmp(a, "--eval-every")) {
            o->eval_every = (int)x;
        } else if (!strcmp(a, "--sync-every")) {
            o->sync_every = (int)x;
        } else if (!strcmp(a, "--model-kb")) {
            o->model_kb = (long)x;
        } else if (!strcmp(a, "--loss-bound")) {
            o->loss_bound = x;
            o->collective = x > 0 || o->collective;
        } else {
            fprintf(stderr, "cohort-train: unknown option %s\n", a);
            return -1;
        }
    }
    if (o->compute_scale < 0 || o->max_time_s <= 0 || o->max_iters < 0 || o->lr <= 0 ||
        o->batch < 1 || o->features < 1 || o->classes < 2 || o->samples < 1 || o->val_samples < 1 ||
        o->separation < 0 || o->eval_every < 1 || o->sync_every < 1 || o->model_kb < 0 ||
        !(o->loss_bound >= 0 && o->loss_bound < 1)) {
        fprintf(stderr, "cohort-train: an option is out of range (see --help)\n");
        return -1;
    }
    return 0;
}

/* Slowdown factor of `rank` from "R:F,R:F". Returns -1 on a malformed list. */
static int slow_factor(const char *list, int rank, int nranks, double *factor)
{
    *factor = 1;
    for (const char *p = list; p && *p;) {
        char *end;
        long r = strtol(p, &end, 10);
        if (end == p || *end != ':' || r < 0) return -1;
        p = end + 1;
        double f = strtod(p, &end);
        if (end == p || !(f > 0) || (*end && *end != ',')) return -1;
        if (r == rank) *factor = f;
        if (r >= nranks && rank == 0)
            fprintf(stderr, "cohort-train: --slow names rank %ld of %d, ignored\n", r, nranks);
        p = *end ? end + 1 : end;
    }
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_until(double t)
{
    struct timespec ts = {.tv_sec = (time_t)t, .tv_nsec = (long)((t - floor(t)) * 1e9)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

/* ---- the data set: Gaussian clusters with per-feature scales ---- */

/* RNG streams: one per purpose, so a rank's shard does not depend on the
 * world size and the validation set is the same everywhere. */
enum { RNG_CENTRES = 1, RNG_SCALES = 2, RNG_VAL = 3, RNG_SHARD = 1000 };
enum { RNG_BATCH = 1 << 20, RNG_COMPUTE = 2 << 20 };

typedef struct problem {
    int d, c;
    float *centre; /* c x d */
    float *scale;  /* d */
} problem_t;

typedef struct dataset {
    int n;
    float *x; /* n x d */
    int *y;
} dataset_t;

static int problem_init(problem_t *pb, const opts_t *o)
{
    pb->d = o->features;
    pb->c = o->classes;
    pb->centre = malloc(sizeof(float) * (size_t)pb->c * (size_t)pb->d);
    pb->scale = malloc(sizeof(float) * (size_t)pb->d);
    if (!pb->centre || !pb->scale) return -1;
    sc_rng_t r;
    sc_rng_seed(&r, o->seed, RNG_CENTRES);
    for (int i = 0; i < pb->c * pb->d; i++)
        pb->centre[i] = (float)(o->separation * sc_rng_normal(&r));
    /* Log-uniform scales in [0.25, 2]: the loss is ill-conditioned (condition
     * number ~64), which is what makes SGD take hundreds of steps. */
    sc_rng_seed(&r, o->seed, RNG_SCALES);
    for (int j = 0; j < pb->d; j++)
        pb->scale[j] = (float)(0.25 * exp(sc_rng_uniform(&r) * log(8.0)));
    return 0;
}

static int dataset_init(dataset_t *ds, const problem_t *pb, uint64_t seed, uint64_t stream, int n)
{
    ds->n = n;
    ds->x = malloc(sizeof(float) * (size_t)n * (size_t)pb->d);
    ds->y = malloc(sizeof(int) * (size_t)n);
    if (!ds->x || !ds->y) return -1;
    sc_rng_t r;
    sc_rng_seed(&r, seed, stream);
    for (int i = 0; i < n; i++) {
        int c = (int)(sc_rng_next(&r) % (uint64_t)pb->c);
        ds->y[i] = c;
        float *x = ds->x + (size_t)i * (size_t)pb->d;
        const float *mu = pb->centre + (size_t)c * (size_t)pb->d;
        for (int j = 0; j < pb->d; j++) x[j] = pb->scale[j] * (mu[j] + (float)sc_rng_normal(&r));
    }
    return 0;
}

/* ---- the model: W (c x d) then b (c), one contiguous f32 buffer ---- */

/* Class probabilities of one sample into p; returns log-sum-exp of the logits. */
static double forward(const problem_t *pb, const float *w, const float *x, double *p)
{
    const float *b = w + (size_t)pb->c * (size_t)pb->d;
    double zmax = -INFINITY;
    for (int k = 0; k < pb->c; k++) {
        const float *wk = w + (size_t)k * (size_t)pb->d;
        float z = b[k];
        for (int j = 0; j < pb->d; j++) z += wk[j] * x[j];
        p[k] = z;
        if (z > zmax) zmax = z;
    }
    double s = 0;
    for (int k = 0; k < pb->c; k++) s += (p[k] = exp(p[k] - zmax));
    for (int k = 0; k < pb->c; k++) p[k] /= s;
    return zmax + log(s);
}

/* One SGD step on a minibatch drawn from ds; grad and p are scratch. */
static void sgd_step(const problem_t *pb, float *w, const dataset_t *ds, int batch, double lr,
                     sc_rng_t *r, float *grad, double *p)
{
    size_t nw = (size_t)pb->c * (size_t)pb->d;
    memset(grad, 0, sizeof(float) * (nw + (size_t)pb->c));
    for (int s = 0; s < batch; s++) {
        int i = (int)(sc_rng_next(r) % (uint64_t)ds->n);
        const float *x = ds->x + (size_t)i * (size_t)pb->d;
        forward(pb, w, x, p);
        p[ds->y[i]] -= 1; /* d(cross-entropy)/d(logits) = p - onehot */
        for (int k = 0; k < pb->c; k++) {
            float g = (float)p[k];
            float *gk = grad + (size_t)k * (size_t)pb->d;
            for (int j = 0; j < pb->d; j++) gk[j] += g * x[j];
            grad[nw + (size_t)k] += g;
        }
    }
    float step = (float)(lr / batch);
    for (size_t i = 0; i < nw + (size_t)pb->c; i++) w[i] -= step * grad[i];
}

static void evaluate(const problem_t *pb, const float *w, const dataset_t *ds, double *p,
                     double *loss, double *acc)
{
    double l = 0;
    int right = 0;
    for (int i = 0; i < ds->n; i++) {
        const float *x = ds->x + (size_t)i * (size_t)pb->d;
        forward(pb, w, x, p);
        int best = 0;
        for (int k = 1; k < pb->c; k++)
            if (p[k] > p[best]) best = k;
        right += best == ds->y[i];
        l -= log(p[ds->y[i]] > 1e-300 ? p[ds->y[i]] : 1e-300);
    }
    *loss = l / ds->n;
    *acc = (double)right / ds->n;
}

/* ---- synchronisation ---- */

static void log_to_stderr(int level, const char *msg, void *arg)
{
    (void)arg;
    static const char *names[] = {"error", "warn", "info", "debug"};
    fprintf(stderr, "cohort %s: %s\n", names[level & 3], msg);
}

/* Per-rank counters; summed / maxed over ranks at the end. */
typedef struct stats {
    long steps;
    long syncs;     /* syncs this rank took part in */
    double groups;  /* sum of 1 / group size: the number of distinct groups */
    double members; /* sum of group sizes */
    double sync_s;  /* wait + comm, per sync, summed */
    double wait_s;  /* from coh_request_group, when it has them */
    double comm_s;
    long group_info;             /* syncs that had coh_request_group numbers */
    double sync_wall_s;          /* measured around the sync, submission to completion */
    double compute_s;            /* injected + real compute */
    double dg_bytes, lost_bytes; /* --loss-bound: datagram receive bytes, and lost */
} stats_t;

/* Vote layout: SUM part, then MAX part (two allreduces, submitted together). */
enum { VS_LOSS, VS_ACC, VS_STEPS, VS_N };
enum { VM_STOP, VM_T_EVAL, VM_LOSS, VM_STEPS, VM_NEG_STEPS, VM_N };

typedef struct vote {
    double sum[VS_N], max[VM_N];
    coh_request_t *rs, *rm;
    bool pending;
    int n; /* ranks the vote averages over */
} vote_t;

typedef struct trainer {
    opts_t o;
    coh_ctx_t *ctx;
    coh_comm_t *world;
    coh_comm_t *comm; /* the survivors (the world until a rank dies, relay mode) */
    int rank, nranks;
    int *alive, nalive; /* world ranks still training (relay mode) */
    int batch;          /* this rank's minibatch: --batch, more after a death */
    long die_step;      /* --die: this rank's last step (-1: none) */
    problem_t pb;
    dataset_t train, val;
    float *w, *grad;
    size_t n_model, n_buf; /* model parameters, synchronised floats (padded) */
    double *p;
    sc_dist_t dist;
    bool inject;
    double slow;
    sc_rng_t batch_rng, compute_rng;
    double t0;
    stats_t st;
    vote_t v;
    /* results of the agreed votes */
    bool stop, reached;
    double t_target, best_loss, loss_at_target;
    long steps_at_target;
} trainer_t;

static int fail(trainer_t *t, const char *what, int st, coh_request_t *req)
{
    fprintf(stderr, "cohort-train rank %d: %s: %s: %s\n", t->rank, what, coh_status_name(st),
            req ? coh_request_error(req) : coh_last_error());
    return 1;
}

static int wait_free(coh_request_t *req)
{
    int st = coh_wait(req, -1);
    coh_request_free(req);
    return st;
}

static int vote_submit(trainer_t *t, double loss, double acc, double t_eval, bool wish_stop)
{
    vote_t *v = &t->v;
    v->sum[VS_LOSS] = loss;
    v->sum[VS_ACC] = acc;
    v->sum[VS_STEPS] = (double)t->st.steps;
    v->max[VM_STOP] = wish_stop;
    v->max[VM_T_EVAL] = t_eval;
    v->max[VM_LOSS] = loss;
    v->max[VM_STEPS] = (double)t->st.steps;
    v->max[VM_NEG_STEPS] = -(double)t->st.steps;
    v->n = t->nalive;
    if (t->o.mode == COH_SYNC_RELAY) {
        /* Relay allreduces: a rank that dies is excluded by the coordinator
         * instead of failing the vote on some ranks and not others. One
         * relay op at a time per rank: the second after the first. */
        coh_allreduce_opts_t ro = {.algo = COH_ALLREDUCE_RELAY, .iteration = (uint64_t)t->st.steps};
        int st = coh_allreduce_ex(t->world, NULL, v->sum, VS_N, COH_F64, COH_SUM, &ro, &v->rs);
        if (!st) st = coh_wait(v->rs, -1);
        coh_group_info_t gi;
        if (!st && coh_request_group(v->rs, &gi) == COH_OK) v->n = gi.size;
        if (!st) st = coh_allreduce_ex(t->world, NULL, v->max, VM_N, COH_F64, COH_MAX, &ro, &v->rm);
        if (st) return fail(t, "vote", st, NULL);
        v->pending = true;
        return 0;
    }
    int st = coh_allreduce(t->world, NULL, v->sum, VS_N, COH_F64, COH_SUM, &v->rs);
    if (st) return fail(t, "vote", st, NULL);
    st = coh_allreduce(t->world, NULL, v->max, VM_N, COH_F64, COH_MAX, &v->rm);
    if (st) return fail(t, "vote", st, NULL);
    v->pending = true;
    return 0;
}

/* Consume the pending vote if it has completed (block: wait for it). */
static int vote_poll(trainer_t *t, bool block)
{
    vote_t *v = &t->v;
    if (!v->pending) return 0;
    int a = 0, b = 0;
    if (!block) {
        coh_test(v->rs, &a);
        coh_test(v->rm, &b);
        if (!a || !b) return 0;
    }
    int st1 = coh_wait(v->rs, -1), st2 = coh_wait(v->rm, -1);
    if (st1 || st2) return fail(t, "vote", st1 ? st1 : st2, st1 ? v->rs : v->rm);
    coh_request_free(v->rs);
    coh_request_free(v->rm);
    v->pending = false;
    double loss = v->sum[VS_LOSS] / v->n;
    if (loss < t->best_loss) t->best_loss = loss;
    if (!t->reached && loss <= t->o.target_loss) {
        t->reached = true;
        /* The moment the last replica was measured, not when the vote ended:
         * a vote waits for the slowest rank's next evaluation. */
        t->t_target = v->max[VM_T_EVAL];
        t->loss_at_target = loss;
        t->steps_at_target = (long)v->sum[VS_STEPS];
    }
    if (t->reached || v->max[VM_STOP] > 0) t->stop = true;
    if (t->alive[0] == t->rank && !t->o.quiet)
        printf("cohort-train: t=%6.2f s  steps %6ld [%ld..%ld]  val loss %.4f (worst %.4f)  acc "
               "%.3f%s\n",
               v->max[VM_T_EVAL], (long)v->sum[VS_STEPS], (long)-v->max[VM_NEG_STEPS],
               (long)v->max[VM_STEPS], loss, v->max[VM_LOSS], v->sum[VS_ACC] / v->n,
               t->reached ? "  target reached" : "");
    fflush(stdout);
    return 0;
}

static int cmp_int(const void *a, const void *b)
{
    return *(const int *)a - *(const int *)b;
}

/*
 * Relay mode, after a sync whose group lacks ranks that were training: they
 * failed (the coordinator excluded them; every survivor sees the same group,
 * so every survivor does this after the same sync). The survivors shrink the
 * world for their final collectives, split the dead ranks' shards among
 * themselves (survivor i of n takes the i-th n-th of each) and grow their
 * batches so that the global batch (--batch x the original world) stays
 * the same.
 */
static int redistribute(trainer_t *t, const int *members, int n)
{
    const opts_t *o = &t->o;
    int *alive = malloc(sizeof(int) * (size_t)n);
    if (!alive) return fail(t, "malloc", COH_ENOMEM, NULL);
    memcpy(alive, members, sizeof(int) * (size_t)n);
    qsort(alive, (size_t)n, sizeof(int), cmp_int);
    coh_comm_t *nc;
    int st = coh_comm_shrink(t->comm, &nc);
    if (st) {
        free(alive);
        return fail(t, "coh_comm_shrink", st, NULL);
    }
    int ncs, idx = -1;
    coh_comm_size(nc, &ncs);
    coh_comm_rank(nc, &idx);
    if (ncs != n) {
        fprintf(stderr, "cohort-train rank %d: the shrunk world has %d ranks, the group %d\n",
                t->rank, ncs, n);
        free(alive);
        return 1;
    }
    if (t->comm != t->world) coh_comm_free(t->comm);
    t->comm = nc;
    /* This rank's own shard, and its part of every dead rank's. */
    long total = o->samples;
    int dead = 0;
    for (int r = 0; r < t->nranks; r++)
        if (!bsearch(&r, alive, (size_t)n, sizeof(int), cmp_int)) {
            total += (long)o->samples * (idx + 1) / n - (long)o->samples * idx / n;
            dead++;
        }
    dataset_t ds = {.n = (int)total};
    ds.x = malloc(sizeof(float) * (size_t)total * (size_t)t->pb.d);
    ds.y = malloc(sizeof(int) * (size_t)total);
    if (!ds.x || !ds.y) return fail(t, "malloc", COH_ENOMEM, NULL);
    long at = 0;
    for (int r = 0; r < t->nranks; r++) {
        bool mine = r == t->rank;
        if (!mine && bsearch(&r, alive, (size_t)n, sizeof(int), cmp_int)) continue;
        dataset_t sh;
        if (dataset_init(&sh, &t->pb, o->seed, RNG_SHARD + (uint64_t)r, o->samples))
            return fail(t, "data", COH_ENOMEM, NULL);
        long lo = mine ? 0 : (long)o->samples * idx / n;
        long hi = mine ? o->samples : (long)o->samples * (idx + 1) / n;
        memcpy(ds.x + (size_t)at * (size_t)t->pb.d, sh.x + (size_t)lo * (size_t)t->pb.d,
               sizeof(float) * (size_t)(hi - lo) * (size_t)t->pb.d);
        memcpy(ds.y + at, sh.y + lo, sizeof(int) * (size_t)(hi - lo));
        at += hi - lo;
        free(sh.x);
        free(sh.y);
    }
    free(t->train.x);
    free(t->train.y);
    t->train = ds;
    long global = (long)o->batch * t->nranks;
    t->batch = (int)(global / n + (idx < global % n));
    free(t->alive);
    t->alive = alive;
    t->nalive = n;
    if (idx == 0)
        printf("cohort-train: %d rank(s) failed by step %ld: %d survivors share their shards; "
               "batch %ld..%ld per rank, global batch %ld\n",
               dead, t->st.steps, n, global / n, global / n + (global % n != 0), global);
    fflush(stdout);
    return 0;
}

/* Synchronise the model: coh_sync, or with --collective a plain
 * coh_allreduce(AVG) over every rank (the baseline without a coordinator). */
static int sync_model(trainer_t *t, double weight)
{
    coh_request_t *req;
    double ts = now_s();
    int st;
    coh_group_info_t gi = {.size = t->nranks};
    bool have_gi = false;
    if (t->o.collective) {
        coh_allreduce_opts_t ao = {.loss_bound = t->o.loss_bound};
        st = coh_allreduce_ex(t->world, NULL, t->w, t->n_buf, COH_F32, COH_AVG, &ao, &req);
        if (st) return fail(t, "coh_allreduce", st, NULL);
        if ((st = coh_wait(req, -1))) return fail(t, "coh_allreduce", st, req);
        coh_loss_info_t li;
        if (coh_request_loss(req, &li) == COH_OK) {
            t->st.dg_bytes += (double)(li.push_bytes + li.pull_bytes);
            t->st.lost_bytes += (double)(li.push_lost_bytes + li.pull_lost_bytes);
        }
    } else {
        st = coh_sync_ex(t->world, t->w, t->n_buf, COH_F32, (uint64_t)t->st.steps, weight,
                         (coh_sync_mode)t->o.mode, &req);
        if (st) return fail(t, "coh_sync", st, NULL);
        /* No timeout of our own: a sync whose partners stopped still ends,
         * because they leave the schedule (coh_sync_leave) and the
         * coordinator stops waiting for them. */
        if ((st = coh_wait(req, -1))) return fail(t, "coh_sync", st, req);
        have_gi = coh_request_group(req, &gi) == COH_OK && gi.size > 0;
        if (!have_gi) gi.size = 1;
        if (have_gi && t->o.mode == COH_SYNC_RELAY && gi.size < t->nalive) {
            int rc = redistribute(t, gi.members, gi.size);
            if (rc) {
                coh_request_free(req);
                return rc;
            }
        }
    }
    double dt = now_s() - ts;
    coh_request_free(req);
    t->st.syncs++;
    t->st.groups += 1.0 / gi.size;
    t->st.members += gi.size;
    t->st.sync_wall_s += dt;
    if (have_gi) {
        t->st.group_info++;
        t->st.wait_s += gi.wait_us / 1e6;
        t->st.comm_s += gi.comm_us / 1e6;
        t->st.sync_s += (gi.wait_us + gi.comm_us) / 1e6;
    } else {
        t->st.sync_s += dt;
    }
    return 0;
}

static int train(trainer_t *t)
{
    const opts_t *o = &t->o;
    long since_sync = 0;
    /* Votes block in allreduce mode: every rank then stops after the same
     * step and the replicas stay identical. Elsewhere they run behind the
     * training so fast ranks never wait for a straggler's evaluation. */
    bool lockstep = o->mode == COH_SYNC_ALLREDUCE || o->mode == COH_SYNC_RELAY;
    while (!t->stop) {
        double ts = now_s();
        if (t->st.steps % o->eval_every == 0 && !t->v.pending) {
            double loss, acc;
            evaluate(&t->pb, t->w, &t->val, t->p, &loss, &acc);
            bool wish =
                ts - t->t0 >= o->max_time_s || (o->max_iters > 0 && t->st.steps >= o->max_iters);
            if (vote_submit(t, loss, acc, ts - t->t0, wish)) return 1;
            if (vote_poll(t, lockstep)) return 1;
            if (t->stop) break;
        }
        if (t->st.steps == t->die_step) raise(SIGKILL); /* --die: as a crash would */
        sgd_step(&t->pb, t->w, &t->train, t->batch, o->lr, &t->batch_rng, t->grad, t->p);
        double real = now_s() - ts;
        /* Draw every step even when not injecting: the compute times of a
         * seed stay the same whatever the flags. */
        double base = sc_dist_draw(&t->dist, &t->compute_rng);
        double want = t->inject ? o->compute_scale * t->slow * base : t->slow * real;
        if (want > real) sleep_until(ts + want);
        t->st.compute_s += now_s() - ts;
        t->st.steps++;
        if (++since_sync >= o->sync_every) {
            int rc = sync_model(t, (double)since_sync);
            if (rc) return rc;
            since_sync = 0;
        }
        if (vote_poll(t, false)) return 1;
    }
    /* Local steps not yet averaged in (--sync-every > 1) go in with a last
     * sync; in allreduce mode every rank has the same count, so the
     * replicas stay identical. */
    if (since_sync > 0) {
        int rc = sync_model(t, (double)since_sync);
        if (rc) return rc;
    }
    /* Out of the schedule: a group that would wait for this rank forms
     * without it, so the others' last syncs end. */
    int st = o->collective ? 0 : coh_sync_leave(t->world);
    return st ? fail(t, "coh_sync_leave", st, NULL) : 0;
}

/* Gather the per-rank numbers, check the replicas, average the final model
 * and print the summary (rank 0). Returns the exit code. */
static int finish(trainer_t *t, double t_end)
{
    const opts_t *o = &t->o;
    const stats_t *s = &t->st;
    size_t nm = t->n_model;
    float *local = t->w, *ref = malloc(sizeof(float) * nm);
    if (!ref) return fail(t, "malloc", COH_ENOMEM, NULL);
    double sum[] = {(double)s->steps, (double)s->syncs, s->groups,   s->members,
                    s->sync_s,        s->wait_s,        s->comm_s,   (double)s->group_info,
                    s->sync_wall_s,   s->compute_s,     s->dg_bytes, s->lost_bytes};
    double mx[] = {
        (double)s->steps, -(double)s->steps, (double)s->syncs, -(double)s->syncs, t_end, 0, 0};
    /* Replicas: max |w - w(rank 0)| over the model, and any non-zero padding
     * (zeros averaged must stay zeros; a sync that wrote them is broken). */
    memcpy(ref, local, sizeof(float) * nm);
    int st = coh_allreduce_sync(t->comm, NULL, sum, sizeof(sum) / sizeof(sum[0]), COH_F64, COH_SUM);
    if (!st) {
        coh_request_t *req;
        st = coh_broadcast(t->comm, ref, nm, COH_F32, 0, &req);
        if (!st) st = wait_free(req);
    }
    if (st) return fail(t, "final gather", st, NULL);
    for (size_t i = 0; i < nm; i++) mx[5] = fmax(mx[5], fabs((double)local[i] - ref[i]));
    for (size_t i = nm; i < t->n_buf; i++) mx[6] = fmax(mx[6], fabs((double)local[i]));
    st = coh_allreduce_sync(t->comm, NULL, mx, sizeof(mx) / sizeof(mx[0]), COH_F64, COH_MAX);
    /* The job's model: the average of the replicas (in allreduce mode they
     * are equal already). */
    if (!st) st = coh_allreduce_sync(t->comm, NULL, local, nm, COH_F32, COH_AVG);
    /* The data the survivors train on: the global batch and every shard,
     * whoever died. */
    double data[2] = {t->batch, t->train.n};
    if (!st) st = coh_allreduce_sync(t->comm, NULL, data, 2, COH_F64, COH_SUM);
    if (st) return fail(t, "final gather", st, NULL);
    bool data_ok =
        data[0] == (double)o->batch * t->nranks && data[1] == (double)o->samples * t->nranks;
    double loss, acc;
    evaluate(&t->pb, local, &t->val, t->p, &loss, &acc);
    free(ref);

    double syncs = sum[1], groups = sum[2];
    bool identical = mx[5] == 0 && mx[6] == 0;
    const char *mode = o->collective ? "collective" : mode_names[o->mode];
    if (t->alive[0] == t->rank) {
        char target[96];
        if (t->reached)
            snprintf(target, sizeof(target), "%.2f s (loss %.4f <= %.4f after %ld steps)",
                     t->t_target, t->loss_at_target, o->target_loss, t->steps_at_target);
        else
            snprintf(target, sizeof(target), "not reached in %.2f s (best %.4f > %.4f)", mx[4],
                     t->best_loss, o->target_loss);
        printf("cohort-train summary\n");
        printf("  mode             %s\n",
               o->collective ? "allreduce (coh_allreduce avg, no coordinator)" : mode);
        printf("  ranks            %d\n", t->nranks);
        printf("  time to target   %s\n", target);
        printf("  iterations       %.0f total, per rank %.0f..%.0f\n", sum[0], -mx[1], mx[0]);
        printf("  syncs            %.0f groups, %.0f rank-syncs (per rank %.0f..%.0f)\n", groups,
               syncs, -mx[3], mx[2]);
        if (syncs > 0) {
            printf("  avg sync time    %.2f ms per rank-sync", 1e3 * sum[4] / syncs);
            if (sum[7] > 0)
                printf(" (wait %.2f + comm %.2f ms)", 1e3 * sum[5] / sum[7], 1e3 * sum[6] / sum[7]);
            else
                printf(" (measured around the allreduce: waiting for the slowest included)");
            printf("\n  avg sync scale   %.2f ranks per group\n", sum[3] / syncs);
        }
        printf("  compute          %.1f ms per step (mean over ranks, injected included)\n",
               sum[0] > 0 ? 1e3 * sum[9] / sum[0] : 0.0);
        printf("  final model      val loss %.4f, accuracy %.3f (average of the replicas)\n", loss,
               acc);
        printf("  replicas         %s (max |w - w0| %.3g before the final average)\n",
               identical ? "identical" : "differ", mx[5]);
        if (o->loss_bound > 0)
            printf("  bounded loss     bound %.4g: %.4f%% of %.1f MB of datagram receives lost\n",
                   o->loss_bound, sum[10] > 0 ? 100 * sum[11] / sum[10] : 0.0, sum[10] / 1e6);
        printf("  data             %d of %d ranks; global batch %.0f (of %d x %d), %.0f of %d x "
               "%d samples%s\n",
               t->nalive, t->nranks, data[0], o->batch, t->nranks, data[1], o->samples, t->nranks,
               data_ok ? "" : ": WRONG");
        coh_stats_t ls; /* what the library counted on this rank (coh_ctx_stats) */
        if (coh_ctx_stats(t->ctx, &ls) == 0)
            printf("  library, rank 0  %llu syncs, mean group %.2f, wait %.2f + comm %.2f ms per "
                   "sync, %llu relayed, %llu retried, %llu failed ranks, %llu rail failovers\n",
                   (unsigned long long)ls.syncs,
                   ls.syncs ? (double)ls.sync_members / (double)ls.syncs : 0.0,
                   ls.syncs ? (double)ls.sync_wait_us / 1e3 / (double)ls.syncs : 0.0,
                   ls.syncs ? (double)ls.sync_comm_us / 1e3 / (double)ls.syncs : 0.0,
                   (unsigned long long)ls.sync_relayed, (unsigned long long)ls.sync_retries,
                   (unsigned long long)ls.ranks_failed, (unsigned long long)ls.rail_failovers);
        if (o->csv) {
            printf("csv-header:mode,ranks,reached,time_to_target_s,best_loss,iters_total,"
                   "iters_min,iters_max,groups,rank_syncs,avg_sync_ms,avg_scale,final_loss,"
                   "final_acc,wall_s\n");
            printf("csv:%s,%d,%d,%.3f,%.4f,%.0f,%.0f,%.0f,%.0f,%.0f,%.3f,%.3f,%.4f,%.4f,%.2f\n",
                   mode, t->nranks, t->reached, t->reached ? t->t_target : NAN, t->best_loss,
                   sum[0], -mx[1], mx[0], groups, syncs, syncs > 0 ? 1e3 * sum[4] / syncs : 0,
                   syncs > 0 ? sum[3] / syncs : 0, loss, acc, mx[4]);
        }
        fflush(stdout);
    }
    if (o->check) {
        /* A bounded-loss allreduce may leave a rank its own value of a
         * segment: replicas may differ by design. */
        bool lock =
            (o->mode == COH_SYNC_ALLREDUCE || o->mode == COH_SYNC_RELAY) && !(o->loss_bound > 0);
        bool ok = t->reached && (!lock || identical) && data_ok;
        if (!ok && t->alive[0] == t->rank)
            fprintf(stderr, "cohort-train: check failed: %s\n",
                    !t->reached ? "target loss not reached"
                    : !data_ok  ? "the survivors do not cover the global batch and every shard"
                                : "replicas differ");
        if (!ok) return EXIT_CHECK;
        if (t->alive[0] == t->rank)
            printf("cohort-train: check OK: %d of %d ranks, global batch %.0f, %.0f samples\n",
                   t->nalive, t->nranks, data[0], data[1]);
    }
    return 0;
}

static int setup(trainer_t *t)
{
    opts_t *o = &t->o;
    coh_config_t cfg;
    int st = coh_config_init(&cfg);
    if (st) return fail(t, "coh_config_init", st, NULL);
    if (o->mode < 0) o->mode = cfg.sync_mode; /* COHORT_SYNC_MODE, else the library's default */
    cfg.sync_mode = o->mode;
    t->rank = cfg.rank;
    if (o->collective && o->mode != COH_SYNC_ALLREDUCE) {
        fprintf(stderr, "cohort-train: --collective is allreduce mode's baseline only\n");
        return 2;
    }
    if ((st = coh_init(&cfg, &t->ctx))) return fail(t, "coh_init", st, NULL);
    coh_ctx_world(t->ctx, &t->world);
    coh_comm_rank(t->world, &t->rank);
    coh_comm_size(t->world, &t->nranks);
    t->comm = t->world;
    t->batch = o->batch;
    t->nalive = t->nranks;
    t->alive = malloc(sizeof(int) * (size_t)t->nranks);
    if (!t->alive) return fail(t, "malloc", COH_ENOMEM, NULL);
    for (int r = 0; r < t->nranks; r++) t->alive[r] = r;
    t->die_step = -1;
    if (o->die) {
        int dr = -1;
        long ds = -1;
        if (sscanf(o->die, "%d:%ld", &dr, &ds) != 2 || dr < 0 || ds < 0) {
            fprintf(stderr, "cohort-train: --die wants RANK:STEP\n");
            return 2;
        }
        if (dr == t->rank) t->die_step = ds;
    }

    if (!strcmp(o->dist_name, "none")) {
        sc_dist_from_name("cnn", &t->dist); /* drawn, not used: see train() */
    } else if (sc_dist_from_name(o->dist_name, &t->dist)) {
        fprintf(stderr, "cohort-train: unknown --dist %s (cnn, transformer, none)\n", o->dist_name);
        return 2;
    } else {
        t->inject = true;
    }
    if (slow_factor(o->slow, t->rank, t->nranks, &t->slow)) {
        fprintf(stderr, "cohort-train: --slow wants RANK:FACTOR,... (factor > 0)\n");
        return 2;
    }
    if (problem_init(&t->pb, o) ||
        dataset_init(&t->train, &t->pb, o->seed, RNG_SHARD + (uint64_t)t->rank, o->samples) ||
        dataset_init(&t->val, &t->pb, o->seed, RNG_VAL, o->val_samples))
        return fail(t, "data", COH_ENOMEM, NULL);
    t->n_model = (size_t)o->classes * (size_t)o->features + (size_t)o->classes;
    t->n_buf = (size_t)o->model_kb * 1024 / sizeof(float);
    if (t->n_buf < t->n_model) t->n_buf = t->n_model;
    /* Zero start on every rank: the replicas begin equal without a broadcast. */
    t->w = calloc(t->n_buf, sizeof(float));
    t->grad = malloc(sizeof(float) * t->n_model);
    t->p = malloc(sizeof(double) * (size_t)o->classes);
    if (!t->w || !t->grad || !t->p) return fail(t, "malloc", COH_ENOMEM, NULL);
    sc_rng_seed(&t->batch_rng, o->seed, RNG_BATCH + (uint64_t)t->rank);
    sc_rng_seed(&t->compute_rng, o->seed, RNG_COMPUTE + (uint64_t)t->rank);
    t->best_loss = INFINITY;

    if (t->rank == 0) {
        printf("cohort-train: %s\n", coh_ctx_describe(t->ctx));
        printf("cohort-train: mode %s, %d ranks; softmax regression %d features x %d classes "
               "(%zu parameters, %zu KiB synchronised); %d samples per rank, %d validation\n",
               mode_names[o->mode], t->nranks, o->features, o->classes, t->n_model,
               t->n_buf * sizeof(float) / 1024, o->samples, o->val_samples);
        printf("cohort-train: compute %s", o->dist_name);
        if (t->inject) printf(" x %g", o->compute_scale);
        printf(", slow %s; lr %g, batch %d, sync every %d step(s); target loss %g, max %g s\n",
               o->slow ? o->slow : "none", o->lr, o->batch, o->sync_every, o->target_loss,
               o->max_time_s);
        fflush(stdout);
    }
    /* Start the clocks together: time to target is measured from here. */
    coh_request_t *req;
    if ((st = coh_barrier(t->world, &req)) || (st = wait_free(req)))
        return fail(t, "barrier", st, NULL);
    t->t0 = now_s();
    return 0;
}

int main(int argc, char **argv)
{
    trainer_t t = {.rank = 0};
    if (parse_opts(argc, argv, &t.o)) {
        usage(stderr);
        return 2;
    }
    if (getenv("COHORT_LOG")) coh_set_log_handler(log_to_stderr, NULL, atoi(getenv("COHORT_LOG")));
    int rc = setup(&t);
    if (!rc) rc = train(&t);
    if (!rc) rc = finish(&t, now_s() - t.t0);
    if (t.ctx) coh_finalize(t.ctx);
    free(t.w);
    free(t.grad);
    free(t.p);
    free(t.alive);
    free(t.pb.centre);
    free(t.pb.scale);
    free(t.train.x);
    free(t.train.y);
    free(t.val.x);
    free(t.val.y);
    return rc;
}
