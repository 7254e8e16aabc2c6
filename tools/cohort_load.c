/*
 * cohort-load - a standalone load and soak generator, run under cohortrun
 * (or in the namespace cluster):
 *
 *   cohortrun -n 4 --keep-going -- cohort-load --duration 120 --faults kill:3@40
 *
 * Every rank issues the same seeded, reproducible stream of collectives
 * (allreduce, broadcast, allgather, reduce_scatter, barrier: every dtype and
 * op, sizes log-uniform in --sizes) and coh_sync in every mode, up to
 * --max-inflight at once, with injected stragglers and, when asked, faults
 * (a rank killed or stopped). Every result is checked: the inputs are small
 * integers derived from (seed, op, rank, index) (tests/mp/mp_data.h), so
 * each rank computes every other's input. It prints progress every
 * --progress seconds (ops, ops/s, bytes/s, errors by kind, RSS, fds) and a
 * summary, and exits non-zero on a wrong result (1), a hang: an op pending
 * longer than --hang-s (3), RSS or fd growth past its bound (4), or an error
 * while no rank had failed (5). After a rank's death the survivors shrink
 * the communicator and go on from the same op.
 */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>

#include "base/base.h"
#include "cohort.h"
#include "mp_data.h"

enum { K_ALLREDUCE, K_BCAST, K_ALLGATHER, K_RS, K_BARRIER, K_SYNC, K_COUNT };
static const char *const KNAME[K_COUNT] = {"allreduce",      "broadcast", "allgather",
                                           "reduce_scatter", "barrier",   "sync"};

enum { EXIT_WRONG = 1, EXIT_USAGE = 2, EXIT_HANG = 3, EXIT_GROWTH = 4, EXIT_ERROR = 5 };

typedef struct op_desc {
    int kind;
    coh_dtype dt;
    coh_redop op;
    size_t count; /* elements per rank (reduce_scatter: of the result) */
    int root;
    coh_sync_mode mode;
} op_desc_t;

typedef struct slot {
    op_desc_t d;
    uint64_t idx;
    int n, me; /* the communicator's size and this rank in it at submission */
    coh_request_t *req;
    void *send, *recv;
    double t_submit;
} slot_t;

#define MAX_FAULTS 16
typedef struct fault {
    int kind; /* 'k' kill, 'r' kill and restart, 's' stop, 'c' rail cut, 'l' packet loss */
    int rank;
    double at_s, for_ms;
    double pct;   /* loss */
    char dev[16]; /* cut */
    bool done;
} fault_t;

static struct {
    double duration_s, progress_s, hang_s;
    uint64_t max_ops, seed;
    int max_inflight;
    size_t min_bytes, max_bytes;
    unsigned kinds; /* bit per K_* */
    coh_sync_mode modes[4];
    int nmodes;
    int straggler_rank;
    double straggler_ms, jitter_ms;
    fault_t faults[MAX_FAULTS];
    int nfaults;
    double max_rss_growth_mb;
    int max_fd_growth;
    size_t sync_bytes;
    const char *csv; /* per-rank progress rows, "%d" = the rank */
    int64_t test_corrupt, test_stall;
    int log_level; /* the library's messages up to this level on stderr (-1: none) */
} o = {.log_level = -1,
       .sync_bytes = 256 << 10,
       .duration_s = 30,
       .progress_s = 5,
       .hang_s = 120,
       .seed = 1,
       .max_inflight = 8,
       .min_bytes = 0,
       .max_bytes = 4 << 20,
       .kinds = (1u << K_COUNT) - 1,
       .modes = {COH_SYNC_SELECTIVE},
       .nmodes = 1,
       .straggler_rank = -1,
       .max_rss_growth_mb = 64,
       .max_fd_growth = 8,
       .test_corrupt = -1,
       .test_stall = -1};

static int R0, N0; /* world rank and size */
static coh_comm_t *W, *cur;
static int cur_n, cur_me;
static double t0;
static uint64_t ops_done, bytes_done, wrong, syncs, sync_members;
static uint64_t errs[16];    /* by -status */
static bool faults_seen;     /* a rank failed: errors it causes are expected */
static uint64_t unexplained; /* errors before any rank failed */
static bool rejoined;        /* this process restarted a killed rank (COHORT_REJOIN) */
static char **self_argv;     /* to start a restarted rank with */
static pid_t restarted = -1; /* the rank this process restarted */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void die(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void die(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cohort-load rank %d: ", R0);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(code);
}

/* ---- resources ---- */

static double rss_mb(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, res = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &res) != 2) res = 0;
        fclose(f);
    }
    return (double)res * (double)sysconf(_SC_PAGESIZE) / 1048576.0;
}

static int nfds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    if (!d) return -1;
    while (readdir(d)) n++;
    closedir(d);
    return n - 3; /* ., .., and the DIR's own fd */
}

/* ---- the op stream ---- */

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Op idx of the stream, the same on every rank of a communicator of n. */
static op_desc_t op_at(uint64_t idx, int n)
{
    uint64_t h = mix(o.seed * 0x100000001b3ull ^ idx);
    op_desc_t d = {0};
    int enabled[K_COUNT], ne = 0;
    for (int k = 0; k < K_COUNT; k++)
        if (o.kinds & (1u << k)) enabled[ne++] = k;
    d.kind = enabled[h % (uint64_t)ne];
    h = mix(h);
    d.dt = (coh_dtype)(h % COH_DTYPE_COUNT);
    h = mix(h);
    d.op = (coh_redop)(h % COH_REDOP_COUNT);
    h = mix(h);

    h = mix(h);
    /* bytes log-uniform in [min, max] (min 0: 1 in 16 ops is empty) */
    double lo = o.min_bytes ? (double)o.min_bytes : 1, hi = (double)o.max_bytes;
    double u = (double)(h >> 11) / 9007199254740992.0;
    size_t bytes = (size_t)exp(log(lo) + u * (log(hi > lo ? hi : lo) - log(lo)));
    if (o.min_bytes == 0 && (h & 15) == 0) bytes = 0;
    size_t es = coh_dtype_size(d.dt);
    d.count = bytes / es;
    if (d.kind == K_ALLGATHER || d.kind == K_RS) d.count /= (size_t)n; /* n blocks */
    h = mix(h);
    d.root = (int)(h % (uint64_t)n);
    if (d.kind == K_SYNC) {
        /* A rank's syncs may meet others' earlier or later ones in a group:
         * like a model, the buffer keeps its size and dtype for the run */
        d.dt = COH_F32;
        d.count = o.sync_bytes / 4;
    }
    return d;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) die(EXIT_ERROR, "out of memory (%zu bytes)", n);
    return p;
}

static unsigned seed_of(uint64_t idx)
{
    return (unsigned)(mix(o.seed ^ (idx << 1)) & 0xffffff);
}

static size_t payload(const slot_t *s)
{
    size_t es = coh_dtype_size(s->d.dt);
    switch (s->d.kind) {
    case K_ALLGATHER:
    case K_RS: return s->d.count * es * (size_t)s->n;
    case K_BARRIER: return 0;
    default: return s->d.count * es;
    }
}

/* Fill the inputs and start the op. */
static int submit(slot_t *s)
{
    op_desc_t *d = &s->d;
    size_t es = coh_dtype_size(d->dt), c = d->count;
    unsigned sd = seed_of(s->idx);
    int n = s->n, me = s->me;
    coh_redop vop = d->kind == K_ALLREDUCE || d->kind == K_RS ? d->op : COH_SUM;
    s->send = s->recv = NULL;
    s->t_submit = now_s();
    switch (d->kind) {
    case K_ALLREDUCE:
        s->recv = xmalloc(c * es);
        for (size_t i = 0; i < c; i++)
            mpd_put(s->recv, d->dt, i, mpd_val(d->dt, vop, me, i, sd, n));
        return coh_allreduce(cur, s->recv, s->recv, c, d->dt, d->op, &s->req);
    case K_BCAST:
        s->recv = xmalloc(c * es);
        for (size_t i = 0; i < c; i++)
            mpd_put(s->recv, d->dt, i, me == d->root ? mpd_val(d->dt, vop, me, i, sd, n) : 0);
        return coh_broadcast(cur, s->recv, c, d->dt, d->root, &s->req);
    case K_ALLGATHER:
        s->send = xmalloc(c * es);
        s->recv = xmalloc(c * es * (size_t)n);
        for (size_t i = 0; i < c; i++)
            mpd_put(s->send, d->dt, i, mpd_val(d->dt, vop, me, i, sd, n));
        return coh_allgather(cur, s->send, s->recv, c, d->dt, &s->req);
    case K_RS:
        s->send = xmalloc(c * es * (size_t)n);
        s->recv = xmalloc(c * es);
        for (size_t i = 0; i < c * (size_t)n; i++)
            mpd_put(s->send, d->dt, i, mpd_val(d->dt, vop, me, i, sd, n));
        return coh_reduce_scatter(cur, s->send, s->recv, c, d->dt, d->op, &s->req);
    case K_BARRIER: return coh_barrier(cur, &s->req);
    default: return COH_EINVAL;
    }
}

static void wrong_at(const slot_t *s, size_t i, double got, double want)
{
    wrong++;
    fprintf(stderr,
            "cohort-load rank %d: WRONG RESULT op #%llu %s %s %s count %zu (root %d, %d ranks): "
            "element %zu is %.9g, expected %.9g\n",
            R0, (unsigned long long)s->idx, KNAME[s->d.kind], coh_dtype_name(s->d.dt),
            coh_redop_name(s->d.op), s->d.count, s->d.root, s->n, i, got, want);
}

/* Check a completed op's output; false (and reported) when wrong. */
static bool verify(slot_t *s)
{
    const op_desc_t *d = &s->d;
    unsigned sd = seed_of(s->idx);
    int n = s->n;
    if (o.test_corrupt >= 0 && (int64_t)s->idx == o.test_corrupt && R0 == 0 && d->count &&
        s->recv) /* test only: the corruption cohort-load must catch */
        mpd_put(s->recv, d->dt, 0, mpd_get(s->recv, d->dt, 0) + 3);
    switch (d->kind) {
    case K_ALLREDUCE:
        for (size_t i = 0; i < d->count; i++) {
            double got = mpd_get(s->recv, d->dt, i), want = mpd_expect(d->dt, d->op, i, sd, n);
            if (!mpd_close(d->dt, got, want)) return wrong_at(s, i, got, want), false;
        }
        return true;
    case K_BCAST:
        for (size_t i = 0; i < d->count; i++) {
            double got = mpd_get(s->recv, d->dt, i),
                   want = mpd_val(d->dt, COH_SUM, d->root, i, sd, n);
            if (got != want) return wrong_at(s, i, got, want), false;
        }
        return true;
    case K_ALLGATHER:
        for (int r = 0; r < n; r++)
            for (size_t i = 0; i < d->count; i++) {
                size_t k = (size_t)r * d->count + i;
                double got = mpd_get(s->recv, d->dt, k),
                       want = mpd_val(d->dt, COH_SUM, r, i, sd, n);
                if (got != want) return wrong_at(s, k, got, want), false;
            }
        return true;
    case K_RS:
        for (size_t i = 0; i < d->count; i++) {
            double got = mpd_get(s->recv, d->dt, i);
            double want = mpd_expect(d->dt, d->op, (size_t)s->me * d->count + i, sd, n);
            if (!mpd_close(d->dt, got, want)) return wrong_at(s, i, got, want), false;
        }
        return true;
    default: return true;
    }
}

/* An op failed. Explained when a rank has failed (a fault's doing); any
 * other error fails the run. */
static void count_error(int st, const char *what, const char *why)
{
    int k = -st;
    if (k < 0 || k >= 16) k = 15;
    errs[k]++;
    if (!faults_seen && coh_comm_failed_ranks(W, NULL, 0) > 0) faults_seen = true;
    if (!faults_seen) {
        unexplained++;
        fprintf(stderr, "cohort-load rank %d: %s: %s: %s\n", R0, what, coh_status_name(st), why);
    }
}

/* Wait for slot s to complete (or report a hang); check it; free it. Returns
 * its status. */
static int finish(slot_t *s)
{
    int st;
    while ((st = coh_wait(s->req, 200)) == COH_EAGAIN) {
        if (now_s() - s->t_submit > o.hang_s)
            die(EXIT_HANG,
                "HANG: op #%llu (%s %s count %zu, %d ranks) pending for %.0f s (--hang-s %.0f)",
                (unsigned long long)s->idx, KNAME[s->d.kind], coh_dtype_name(s->d.dt), s->d.count,
                s->n, now_s() - s->t_submit, o.hang_s);
    }
    if (st == 0) {
        verify(s);
        ops_done++;
        bytes_done += payload(s);
    } else {
        count_error(st, KNAME[s->d.kind], coh_request_error(s->req));
    }
    coh_request_free(s->req);
    free(s->send);
    free(s->recv);
    s->req = NULL;
    return st;
}

/* ---- syncs ---- */

static double sync_weight(int r)
{
    return 1.0 + r % 3;
}

static int do_sync(uint64_t idx, const op_desc_t *d)
{
    /* A group may join this rank's sync with another rank's earlier or
     * later one: the input depends on the rank only, so any member's is
     * known from the group's member list. */
    unsigned sd = (unsigned)(o.seed & 0xffffff);
    size_t c = d->count;
    void *buf = xmalloc(c * coh_dtype_size(d->dt));
    for (size_t i = 0; i < c; i++) mpd_put(buf, d->dt, i, mpd_val(d->dt, COH_SUM, R0, i, sd, N0));
    /* the rank's "compute" before its sync: a straggler, and jitter */
    double ms = R0 == o.straggler_rank ? o.straggler_ms : 0;
    if (o.jitter_ms > 0)
        ms += o.jitter_ms * (double)(mix(idx ^ ((uint64_t)R0 << 40)) % 1000) / 1000;
    if (ms > 0) usleep((useconds_t)(ms * 1000));
    coh_request_t *req;
    double ts = now_s();
    int st = coh_sync_ex(W, buf, c, d->dt, syncs, sync_weight(R0), d->mode, &req);
    if (st == 0) {
        while ((st = coh_wait(req, 200)) == COH_EAGAIN)
            if (now_s() - ts > o.hang_s)
                die(EXIT_HANG, "HANG: sync op #%llu (%s) pending for %.0f s",
                    (unsigned long long)idx, coh_sync_mode_name(d->mode), now_s() - ts);
    }
    syncs++;
    if (st == 0) {
        coh_group_info_t g;
        if (coh_request_group(req, &g) == 0) {
            sync_members += (uint64_t)g.size;
            double tw = 0;
            for (int m = 0; m < g.size; m++) tw += sync_weight(g.members[m]);
            for (size_t i = 0; i < c; i++) {
                double want = 0;
                for (int m = 0; m < g.size; m++)
                    want += sync_weight(g.members[m]) *
                            mpd_val(d->dt, COH_SUM, g.members[m], i, sd, N0);
                want /= tw;
                double got = mpd_get(buf, d->dt, i), tol = d->dt == COH_F32 ? 1e-5 : 1e-12;
                if (!(fabs(got - want) <= tol * (fabs(want) > 1 ? fabs(want) : 1))) {
                    slot_t s = {.d = *d, .idx = idx, .n = g.size};
                    wrong_at(&s, i, got, want);
                    break;
                }
            }
        }
        ops_done++;
        bytes_done += c * coh_dtype_size(d->dt);
    } else {
        count_error(st, "sync", coh_request_error(req));
    }
    coh_request_free(req);
    free(buf);
    /* out of the schedule until the next sync: the collectives that follow
     * need every rank, and the ranks still waiting for a group must not
     * wait for this one */
    coh_sync_leave(W);
    return st;
}

/* ---- faults ---- */

static int parse_faults(const char *s)
{
    char *copy = strdup(s), *save = NULL;
    for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        fault_t f = {0};
        if (o.nfaults == MAX_FAULTS) return -1;
        if (sscanf(t, "kill:%d@%lf", &f.rank, &f.at_s) == 2)
            f.kind = 'k';
        else if (sscanf(t, "restart:%d@%lf", &f.rank, &f.at_s) == 2)
            f.kind = 'r';
        else if (sscanf(t, "stop:%d@%lf:%lf", &f.rank, &f.at_s, &f.for_ms) == 3)
            f.kind = 's';
        else if (sscanf(t, "cut:%d@%lf:%15[a-zA-Z0-9_.-]:%lf", &f.rank, &f.at_s, f.dev,
                        &f.for_ms) == 4)
            f.kind = 'c';
        else if (sscanf(t, "loss:%d@%lf:%lf:%lf", &f.rank, &f.at_s, &f.pct, &f.for_ms) == 4 &&
                 f.pct > 0 && f.pct <= 100)
            f.kind = 'l';
        else
            return free(copy), -1;
        o.faults[o.nfaults++] = f;
    }
    free(copy);
    return 0;
}

/* Rail cuts and packet loss change the network: only in a network
 * namespace of its own (the namespace cluster), never the host's. */
static bool own_netns(void)
{
    /* A named namespace (`ip netns`, as the cluster's are): `ip netns
     * identify` names it; in the host's it prints nothing. (Comparing with
     * /proc/1/ns/net is not enough: in a container init's may not be
     * visible even from the host's namespace.) */
    char cmd[64], name[128] = "";
    snprintf(cmd, sizeof(cmd), "ip netns identify %d 2>/dev/null", (int)getpid());
    FILE *p = popen(cmd, "r");
    if (!p) return false;
    if (!fgets(name, sizeof(name), p)) name[0] = 0;
    pclose(p);
    return name[0] && name[0] != '\n';
}

/* A child does the network fault and undoes it MS later, so this rank keeps
 * running its ops meanwhile: `ip link set DEV down` / `up`, or an nftables
 * table dropping PCT% of the packets that arrive (numgen random). */
static void network_fault(const fault_t *f)
{
    if (!own_netns()) {
        fprintf(stderr,
                "cohort-load rank %d: %s fault ignored: not in a network namespace of its "
                "own (the namespace cluster)\n",
                R0, f->kind == 'c' ? "cut" : "loss");
        return;
    }
    char on[256], off[256];
    if (f->kind == 'c') {
        snprintf(on, sizeof(on), "ip link set %s down", f->dev);
        snprintf(off, sizeof(off), "ip link set %s up", f->dev);
    } else {
        snprintf(on, sizeof(on),
                 "nft add table inet cohort_load && nft add chain inet cohort_load in "
                 "'{ type filter hook input priority 0; }' && nft add rule inet cohort_load in "
                 "numgen random mod 10000 '<' %d drop",
                 (int)(f->pct * 100));
        snprintf(off, sizeof(off), "nft delete table inet cohort_load");
    }
    if (fork() == 0) {
        signal(SIGPIPE, SIG_DFL);
        int a = system(on);
        usleep((useconds_t)(f->for_ms * 1000));
        int b = system(off);
        _exit(a || b ? 1 : 0);
    }
}

/* This rank's due faults: SIGKILL itself, SIGSTOP itself with a child that
 * sends SIGCONT after the given time, or a network fault (a child). */
static void run_faults(void)
{
    double t = now_s() - t0;
    if (rejoined) return; /* a restarted rank's faults have happened */
    for (int i = 0; i < o.nfaults; i++) {
        fault_t *f = &o.faults[i];
        if (f->done || f->rank != R0 || t < f->at_s) continue;
        f->done = true;
        if (f->kind == 'r') {
            fprintf(stderr, "cohort-load rank %d: fault: SIGKILL at %.1f s, to be restarted\n", R0,
                    t);
            fflush(stderr);
            raise(SIGKILL);
        }
        if (f->kind == 'c' || f->kind == 'l') {
            if (f->kind == 'c')
                fprintf(stderr, "cohort-load rank %d: fault: %s down for %.0f ms at %.1f s\n", R0,
                        f->dev, f->for_ms, t);
            else
                fprintf(stderr,
                        "cohort-load rank %d: fault: %.1f%% of arriving packets dropped "
                        "for %.0f ms at %.1f s\n",
                        R0, f->pct, f->for_ms, t);
            network_fault(f);
            continue;
        }
        fprintf(stderr, "cohort-load rank %d: fault: %s at %.1f s\n", R0,
                f->kind == 'k' ? "SIGKILL" : "SIGSTOP", t);
        fflush(stderr);
        if (f->kind == 'k') raise(SIGKILL);
        pid_t me = getpid(), c = fork();
        if (c == 0) {
            usleep((useconds_t)(f->for_ms * 1000));
            kill(me, SIGCONT);
            _exit(0);
        }
        raise(SIGSTOP);
        waitpid(c, NULL, 0);
    }
}

/* Go on in communicator nc (after a shrink or a grow): every member, a
 * restarted rank too, agrees on the op to go on from (the largest next). */
static uint64_t adopt(coh_comm_t *nc, uint64_t next, const char *after)
{
    if (cur != W && cur != nc) coh_comm_free(cur);
    cur = nc;
    coh_comm_size(cur, &cur_n);
    coh_comm_rank(cur, &cur_me);
    int64_t at = (int64_t)next;
    coh_request_t *req;
    int st = coh_allreduce(cur, &at, &at, 1, COH_I64, COH_MAX, &req);
    if (st == 0) st = coh_wait(req, -1), coh_request_free(req);
    if (st) die(EXIT_ERROR, "agreeing after the %s: %s", after, coh_status_name(st));
    return (uint64_t)at;
}

static void restart_victims(void);

/* --log: what the library says, for a run that fails in CI. */
static void lib_log(int level, const char *msg, void *arg)
{
    (void)arg;
    fprintf(stderr, "cohort-load rank %d: library[%d]: %s\n", R0, level, msg);
}

/* A collective failed for a lost rank: wait out the window, shrink, and
 * agree on the op to go on from. */
static uint64_t recover(slot_t *win, int *nin, uint64_t next)
{
    faults_seen = true;
    for (int k = 0; k < *nin; k++) finish(&win[k]);
    *nin = 0;
    coh_comm_t *nc;
    int st = coh_comm_shrink(cur, &nc);
    if (st) die(EXIT_ERROR, "coh_comm_shrink: %s: %s", coh_status_name(st), coh_last_error());
    uint64_t at = adopt(nc, next, "shrink");
    fprintf(stderr, "cohort-load rank %d: a rank failed; %d ranks go on from op #%llu\n", R0, cur_n,
            (unsigned long long)at);
    restart_victims();
    return at;
}

/* A world rank that a restart fault killed and that is not back in cur. */
static int missing_restart(void)
{
    for (int i = 0; i < o.nfaults; i++) {
        if (o.faults[i].kind != 'r') continue;
        int r = o.faults[i].rank, n = 0;
        int fr[64];
        n = coh_comm_failed_ranks(W, fr, 64);
        for (int k = 0; k < n && k < 64; k++)
            if (fr[k] == r && cur_n < N0) return r;
    }
    return -1;
}

/* After a shrink: the restarter (the lowest survivor above rank 0) starts
 * a new process for each rank a restart fault killed: the same program and
 * arguments, the same rank, COHORT_REJOIN=1 (docs/relay.md). */
static void restart_victims(void)
{
    int fr[64], n = coh_comm_failed_ranks(W, fr, 64);
    int restarter = -1;
    for (int r = 1; r < N0 && restarter < 0; r++) {
        bool failed = false;
        for (int k = 0; k < n && k < 64; k++) failed |= fr[k] == r;
        if (!failed) restarter = r;
    }
    if (R0 != restarter || restarted > 0) return;
    for (int i = 0; i < o.nfaults; i++) {
        const fault_t *f = &o.faults[i];
        bool dead = false;
        for (int k = 0; k < n && k < 64; k++) dead |= fr[k] == f->rank;
        if (f->kind != 'r' || !dead || f->rank == 0) continue;
        char rank[16];
        snprintf(rank, sizeof(rank), "%d", f->rank);
        pid_t c = fork();
        if (c == 0) {
            setenv("COHORT_RANK", rank, 1);
            setenv("COHORT_REJOIN", "1", 1);
            execv("/proc/self/exe", self_argv);
            _exit(127);
        }
        fprintf(stderr, "cohort-load rank %d: restarting rank %d (pid %d)\n", R0, f->rank, (int)c);
        restarted = c;
        return; /* one restart per run */
    }
}

/* A grow point (every rank of cur at the same op): take a restarted rank
 * back; everyone, the newcomer too, agrees on the op to go on from. */
static uint64_t grow_back(uint64_t next)
{
    coh_comm_t *g;
    int st = coh_comm_grow(cur, &g);
    if (st) die(EXIT_ERROR, "coh_comm_grow: %s: %s", coh_status_name(st), coh_last_error());
    int n = 0;
    coh_comm_size(g, &n);
    if (n == cur_n) {
        coh_comm_free(g);
        return next;
    }
    uint64_t at = adopt(g, next, "grow");
    fprintf(stderr, "cohort-load rank %d: a restarted rank is back; %d ranks go on from op #%llu\n",
            R0, cur_n, (unsigned long long)at);
    return at;
}

/* The op a sync's mode is drawn from: the last collective before it. A
 * function of idx alone, so a restarted rank, or survivors that were at
 * different ops when a rank died, draw the same mode after they agree on
 * the op to go on from (a per-rank "last collective submitted" gave a
 * rejoined rank mode 0's draw: a partial sync against the others' relay). */
static uint64_t sync_epoch(uint64_t idx)
{
    uint64_t j = idx;
    while (j > 0 && op_at(j - 1, 1).kind == K_SYNC) j--;
    return j ? j - 1 : 0;
}

/* ---- main ---- */

/* "4M", "256K", "0": base/'s parser (the knobs' own). */
static int parse_size(const char *s, size_t *out)
{
    uint64_t v;
    if (bs_parse_size(s, &v) != 0 || v > SIZE_MAX) return -1;
    *out = (size_t)v;
    return 0;
}

static void usage(FILE *f)
{
    fprintf(
        f, "usage: cohortrun -n N [--keep-going] -- cohort-load [options]\n"
           "  --duration S        run this long (30)\n"
           "  --ops N             stop after N ops (0: no limit)\n"
           "  --seed S            the op stream and the data (1)\n"
           "  --max-inflight K    collectives in flight at once (8)\n"
           "  --sizes MIN:MAX     bytes per rank, log-uniform (0:4M; k, M suffixes)\n"
           "  --colls LIST        allreduce,broadcast,allgather,reduce_scatter,barrier,sync (all)\n"
           "  --sync-modes LIST   allreduce,partial,selective,relay (selective)\n"
           "  --straggler R:MS    rank R computes MS ms before each sync\n"
           "  --jitter-ms J       every rank computes up to J ms more before each sync\n"
           "  --faults LIST       kill:R@S (SIGKILL rank R at S s), restart:R@S (killed, then\n"
           "                      started again: COHORT_REJOIN, coh_comm_grow), stop:R@S:MS\n"
           "                      (SIGSTOP for MS ms); in the namespace cluster also\n"
           "                      cut:R@S:DEV:MS (ip link set DEV down for MS ms) and\n"
           "                      loss:R@S:PCT:MS (nftables drops PCT%% of what arrives)\n"
           "  --hang-s S          an op pending this long is a hang: exit 3 (120)\n"
           "  --progress S        a progress line every S s (5)\n"
           "  --max-rss-growth MB RSS growth past the first progress line allowed (64)\n"
           "  --max-fd-growth N   open fds growth allowed (8)\n"
           "  --log L             the library's messages up to level L on stderr (0 errors,\n"
           "                      1 warnings, 2 info, 3 debug; default none)\n"
           "  --test-corrupt K    test only: rank 0 alters op K's result (must exit 1)\n"
           "  --test-stall K      test only: the last rank stops submitting at op K (exit 3)\n");
}

static int parse_kinds(const char *s)
{
    unsigned m = 0;
    char *copy = strdup(s), *save = NULL;
    for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int k = 0;
        while (k < K_COUNT && strcmp(KNAME[k], t)) k++;
        if (k == K_COUNT) return free(copy), -1;
        m |= 1u << k;
    }
    free(copy);
    o.kinds = m;
    return m ? 0 : -1;
}

static int parse_modes(const char *s)
{
    char *copy = strdup(s), *save = NULL;
    o.nmodes = 0;
    for (char *t = strtok_r(copy, ",", &save); t && o.nmodes < 4; t = strtok_r(NULL, ",", &save))
        if (coh_sync_mode_from_name(t, &o.modes[o.nmodes++]) != 0) return free(copy), -1;
    free(copy);
    return o.nmodes ? 0 : -1;
}

/* A CSV row of the counters so far (tools/load_plot.py): the rates come
 * from the differences between rows. */
static void csv_row(FILE *f, coh_ctx_t *ctx, double t)
{
    if (!f) return;
    coh_stats_t cs;
    memset(&cs, 0, sizeof(cs));
    coh_ctx_stats(ctx, &cs);
    uint64_t nerr = 0;
    for (int e = 1; e < 16; e++) nerr += errs[e];
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    fprintf(f, "%.3f,%.3f,%d,%llu,%llu,%llu,%llu,%.1f,%d,%d,%llu,%llu,%llu,%llu", t,
            (double)wall.tv_sec + wall.tv_nsec * 1e-9, R0, (unsigned long long)ops_done,
            (unsigned long long)bytes_done, (unsigned long long)wrong, (unsigned long long)nerr,
            rss_mb(), nfds(), cur_n, (unsigned long long)cs.syncs,
            (unsigned long long)cs.sync_wait_us, (unsigned long long)cs.sync_comm_us,
            (unsigned long long)cs.sync_members);
    int nr = 0;
    coh_ctx_nrails(ctx, &nr);
    for (int r = 0; r < nr; r++) {
        coh_stats_t rs;
        memset(&rs, 0, sizeof(rs));
        coh_ctx_rail_stats(ctx, r, &rs);
        fprintf(f, ",%llu", (unsigned long long)rs.bytes_sent);
    }
    fprintf(f, "\n");
    fflush(f);
}

static FILE *csv_open(coh_ctx_t *ctx)
{
    if (!o.csv) return NULL;
    char path[512];
    snprintf(path, sizeof(path), o.csv, R0);
    FILE *f = fopen(path, "w");
    if (!f) die(EXIT_USAGE, "--csv %s: %s", path, strerror(errno));
    int nr = 0;
    coh_ctx_nrails(ctx, &nr);
    fprintf(f, "t_s,unix_s,rank,ops,bytes,wrong,errors,rss_mb,fds,ranks,syncs,sync_wait_us,"
               "sync_comm_us,sync_members");
    for (int r = 0; r < nr; r++) fprintf(f, ",rail%d_bytes_sent", r);
    fprintf(f, "\n");
    return f;
}

/* 1 when any rank of cur is past --duration, else 0 (a small allreduce, in
 * sequence with the ops in flight); a status when it failed. */
static int time_up(bool mine)
{
    int32_t v = mine;
    coh_request_t *req;
    int st = coh_allreduce(cur, &v, &v, 1, COH_I32, COH_MAX, &req);
    if (st == 0) {
        while ((st = coh_wait(req, 200)) == COH_EAGAIN) {
        }
        coh_request_free(req);
    }
    return st ? st : v != 0;
}

static void progress(double t, const slot_t *win, int nin, double dt_s, uint64_t ops_before,
                     uint64_t bytes_before)
{
    (void)win;
    char eb[256] = "";
    size_t k = 0;
    for (int e = 1; e < 16; e++)
        if (errs[e])
            k += (size_t)snprintf(eb + k, sizeof(eb) - k, " %s=%llu", coh_status_name(-e),
                                  (unsigned long long)errs[e]);
    printf("t=%.0fs ops %llu (%.0f/s) %.1f MB/s inflight %d wrong %llu errors%s rss %.1f MB "
           "fds %d ranks %d\n",
           t, (unsigned long long)ops_done, (double)(ops_done - ops_before) / dt_s,
           (double)(bytes_done - bytes_before) / dt_s / 1e6, nin, (unsigned long long)wrong,
           k ? eb : " 0", rss_mb(), nfds(), cur_n);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    self_argv = argv;
    for (int i = 1; i < argc; i += 2) { /* every option takes a value */
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!v) {
            ok = false;
        } else if (!strcmp(a, "--duration")) {
            o.duration_s = atof(v);
        } else if (!strcmp(a, "--ops")) {
            o.max_ops = strtoull(v, NULL, 10);
        } else if (!strcmp(a, "--seed")) {
            o.seed = strtoull(v, NULL, 10);
        } else if (!strcmp(a, "--max-inflight")) {
            o.max_inflight = atoi(v);
            ok = o.max_inflight >= 1 && o.max_inflight <= 1024;
        } else if (!strcmp(a, "--sizes")) {
            char lo[32], hi[32];
            ok = sscanf(v, "%31[^:]:%31s", lo, hi) == 2 && !parse_size(lo, &o.min_bytes) &&
                 !parse_size(hi, &o.max_bytes) && o.min_bytes <= o.max_bytes;
        } else if (!strcmp(a, "--colls")) {
            ok = parse_kinds(v) == 0;
        } else if (!strcmp(a, "--sync-modes")) {
            ok = parse_modes(v) == 0;
        } else if (!strcmp(a, "--sync-bytes")) {
            ok = parse_size(v, &o.sync_bytes) == 0 && o.sync_bytes >= 4;
        } else if (!strcmp(a, "--straggler")) {
            ok = sscanf(v, "%d:%lf", &o.straggler_rank, &o.straggler_ms) == 2;
        } else if (!strcmp(a, "--jitter-ms")) {
            o.jitter_ms = atof(v);
        } else if (!strcmp(a, "--faults")) {
            ok = parse_faults(v) == 0;
        } else if (!strcmp(a, "--hang-s")) {
            o.hang_s = atof(v);
        } else if (!strcmp(a, "--progress")) {
            o.progress_s = atof(v);
        } else if (!strcmp(a, "--max-rss-growth")) {
            o.max_rss_growth_mb = atof(v);
        } else if (!strcmp(a, "--max-fd-growth")) {
            o.max_fd_growth = atoi(v);
        } else if (!strcmp(a, "--csv")) {
            o.csv = v;
        } else if (!strcmp(a, "--test-corrupt")) {
            o.test_corrupt = atoll(v);
        } else if (!strcmp(a, "--test-stall")) {
            o.test_stall = atoll(v);
        } else if (!strcmp(a, "--log")) {
            o.log_level = atoi(v);
        } else {
            ok = false;
        }
        if (!ok) {
            fprintf(stderr, "cohort-load: bad option %s %s\n", a, v ? v : "");
            usage(stderr);
            return EXIT_USAGE;
        }
    }
    signal(SIGPIPE, SIG_IGN);
    if (o.log_level >= 0) coh_set_log_handler(lib_log, NULL, o.log_level);
    coh_ctx_t *ctx;
    int st = coh_init(NULL, &ctx);
    if (st) die(EXIT_ERROR, "coh_init: %s: %s", coh_status_name(st), coh_last_error());
    coh_ctx_world(ctx, &W);
    coh_comm_rank(W, &R0);
    coh_comm_size(W, &N0);
    cur = W;
    cur_n = N0;
    cur_me = R0;
    const char *rj = getenv("COHORT_REJOIN");
    rejoined = rj && atoi(rj) == 1;
    FILE *csv = csv_open(ctx);
    slot_t *win = calloc((size_t)o.max_inflight, sizeof(slot_t));
    int nin = 0;
    t0 = now_s();
    double next_progress = o.progress_s, last_t = 0;
    uint64_t last_ops = 0, last_bytes = 0;
    double rss0 = -1, rss_max = 0;
    int fd0 = -1, fd_max = 0;
    uint64_t idx = 0;
    if (rejoined) { /* back in through the survivors' next grow point */
        faults_seen = true;
        coh_comm_t *g;
        st = coh_comm_grow(W, &g);
        if (st)
            die(EXIT_ERROR, "coh_comm_grow (restarted): %s: %s", coh_status_name(st),
                coh_last_error());
        idx = adopt(g, 0, "grow");
        fprintf(stderr, "cohort-load rank %d: restarted, back in at op #%llu with %d ranks\n", R0,
                (unsigned long long)idx, cur_n);
    }
    for (;;) {
        double t = now_s() - t0;
        if (o.max_ops && idx >= o.max_ops) break;
        /* time is up when any rank says so: they all stop at the same op */
        if (idx % 128 == 0) {
            if (missing_restart() >= 0) { /* grow points until it is back */
                for (int k = 0; k < nin; k++) finish(&win[k]);
                nin = 0;
                idx = grow_back(idx);
            }
            int up = time_up(t >= o.duration_s);
            if (up == COH_EPEER) {
                idx = recover(win, &nin, idx);
                continue;
            }
            if (up < 0) count_error(up, "the duration check", coh_last_error());
            if (up != 0) break;
        }
        run_faults();
        if (o.test_stall >= 0 && (int64_t)idx == o.test_stall && R0 == N0 - 1) {
            fprintf(stderr, "cohort-load rank %d: test: stalling at op #%llu\n", R0,
                    (unsigned long long)idx);
            for (;;) pause(); /* alive, silent: the others must report a hang */
        }
        if (t >= next_progress) {
            progress(t, win, nin, t - last_t, last_ops, last_bytes);
            csv_row(csv, ctx, t);
            last_t = t, last_ops = ops_done, last_bytes = bytes_done;
            next_progress += o.progress_s;
            double r = rss_mb();
            int f = nfds();
            if (rss0 < 0) rss0 = r, fd0 = f; /* the baseline: after the first interval */
            if (r > rss_max) rss_max = r;
            if (f > fd_max) fd_max = f;
        }
        op_desc_t d = op_at(idx, cur_n);
        if (d.kind == K_SYNC) {
            /* syncs run alone: the window drains first */
            int lost = 0;
            for (int k = 0; k < nin; k++) lost |= finish(&win[k]) == COH_EPEER;
            nin = 0;
            if (lost) {
                idx = recover(win, &nin, idx);
                continue;
            }
            /* the mode changes only across a collective: the syncs between
             * two collectives may meet each other in groups */
            d.mode = o.modes[mix(sync_epoch(idx)) % (uint64_t)o.nmodes];
            do_sync(idx, &d);
            idx++;
            continue;
        }
        if (nin == o.max_inflight) { /* the oldest completes first */
            int s2 = finish(&win[0]);
            memmove(win, win + 1, sizeof(slot_t) * (size_t)(nin - 1));
            nin--;
            if (s2 == COH_EPEER) {
                idx = recover(win, &nin, idx);
                continue;
            }
        }
        slot_t *s = &win[nin];
        *s = (slot_t){.d = d, .idx = idx, .n = cur_n, .me = cur_me};
        st = submit(s);
        if (st) {
            count_error(st, KNAME[d.kind], coh_last_error());
            free(s->send);
            free(s->recv);
            if (st == COH_EPEER) {
                idx = recover(win, &nin, idx);
                continue;
            }
        } else {
            nin++;
        }
        idx++;
    }
    for (int k = 0; k < nin; k++) finish(&win[k]);
    nin = 0;
    /* everyone done before anyone leaves */
    coh_request_t *req;
    if (coh_barrier(cur, &req) == 0) coh_wait(req, -1), coh_request_free(req);
    double t = now_s() - t0;
    double r = rss_mb();
    int f = nfds();
    if (r > rss_max) rss_max = r;
    if (f > fd_max) fd_max = f;
    if (rss0 < 0) rss0 = r, fd0 = f;
    uint64_t nerr = 0;
    for (int e = 1; e < 16; e++) nerr += errs[e];
    coh_stats_t cs;
    memset(&cs, 0, sizeof(cs));
    coh_ctx_stats(ctx, &cs);
    printf("SUMMARY rank %d: %llu ops in %.1f s (%.0f/s), %.1f MB (%.1f MB/s), %llu wrong, "
           "%llu errors%s, %llu syncs (mean group %.2f), rss %.1f -> %.1f MB (max %.1f), "
           "fds %d -> %d (max %d), ranks %d of %d; library: %.1f MB sent, %llu requests "
           "failed, %llu rail failovers, %llu returns\n",
           R0, (unsigned long long)ops_done, t, (double)ops_done / t, (double)bytes_done / 1e6,
           (double)bytes_done / t / 1e6, (unsigned long long)wrong, (unsigned long long)nerr,
           faults_seen ? " (a rank failed)" : "", (unsigned long long)syncs,
           syncs ? (double)sync_members / (double)syncs : 0.0, rss0, r, rss_max, fd0, f, fd_max,
           cur_n, N0, (double)cs.bytes_sent / 1e6, (unsigned long long)cs.requests_failed,
           (unsigned long long)cs.rail_failovers, (unsigned long long)cs.rail_returns);
    fflush(stdout);
    int code = 0;
    /* growth: where the run ends (every op's buffers freed) against the
     * first progress line; the maximum only says how high in-flight ops went */
    if (wrong) {
        code = EXIT_WRONG;
    } else if (r - rss0 > o.max_rss_growth_mb || f - fd0 > o.max_fd_growth) {
        fprintf(stderr,
                "cohort-load rank %d: GROWTH: rss +%.1f MB (bound %.0f), fds %+d (bound %d)\n", R0,
                r - rss0, o.max_rss_growth_mb, f - fd0, o.max_fd_growth);
        code = EXIT_GROWTH;
    } else if (unexplained) {
        code = EXIT_ERROR;
    }
    csv_row(csv, ctx, t);
    if (csv) fclose(csv);
    if (restarted > 0) { /* its result is part of this run's */
        int ws = 0;
        fflush(stdout);
        if (waitpid(restarted, &ws, 0) != restarted || !WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
            fprintf(stderr, "cohort-load rank %d: the restarted rank failed (status %d)\n", R0, ws);
            if (code == 0) code = EXIT_ERROR;
        }
    }
    if (cur != W) coh_comm_free(cur);
    free(win);
    coh_finalize(ctx);
    return code;
}
