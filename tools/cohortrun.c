/*
 * cohortrun - start N local ranks of a cohort program.
 *
 *   cohortrun -n N [options] -- prog [args...]
 *
 * Each rank gets COHORT_RANK, COHORT_WORLD_SIZE, COHORT_LOCAL_RANK,
 * COHORT_STORE (host:port of the bootstrap store), COHORT_TOKEN (a random job
 * token unless one is set) and COHORT_NICS (with --nics), and torch's
 * variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and
 * MASTER_PORT, a free port for torch's own store), so a torch program starts
 * under it unchanged. The launcher binds
 * the store's listening socket itself and hands it to rank 0 as an inherited
 * descriptor (COHORT_STORE_FD), so no port can be taken between choosing it
 * and using it. Output lines are prefixed with "[rank] ". When a rank fails
 * the others are terminated (unless --keep-going), and cohortrun exits with
 * the first failure's code (128 + signal for a signal). With --bind core
 * each rank (every thread of it) is held to one CPU of the launcher's own
 * set, rank r to the (r mod count)-th, as mpirun --bind-to core does.
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <ftw.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

/* The knob tables, for --help and --knobs: X-macros, nothing to link. */
#include "reactor/rx_config.h"
#include "sched/sched.h"

extern char **environ;

typedef struct out_stream {
    uv_pipe_t pipe;
    struct rank *rank;
    FILE *dst;
    char line[4096];
    size_t len;
    bool open;
} out_stream_t;

typedef struct rank {
    int id;
    uv_process_t proc;
    out_stream_t out, err;
    bool running;
    int64_t status;
    int term_signal;
    bool stopped; /* running when cohortrun was interrupted: it stopped this rank */
} rank_t;

static struct {
    int n;
    const char *nics;
    const char *token;
    const char *store_host;
    const char *wrap;
    double timeout_s;
    bool keep_going;
    bool prefix;
    bool bind; /* --bind core */
    char **argv;
    rank_t *ranks;
    int alive;
    int first_fail;
    bool killing;
    int interrupted; /* the signal that interrupted cohortrun, 0 if none */
    uv_timer_t kill_timer, timeout_timer;
    uv_signal_t sigint, sigterm;
    uv_loop_t *loop;
} g = {.prefix = true, .store_host = "127.0.0.1"};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: cohortrun -n N [options] -- prog [args...]\n"
            "  -n, --np N         number of ranks to start on this host\n"
            "  --nics LIST        COHORT_NICS for every rank (comma list of interfaces or\n"
            "                     addresses, one rail each; default: the rank's own setting)\n"
            "  --token T          job token (default: $COHORT_TOKEN or a random one)\n"
            "  --store-host H     address the bootstrap store listens on (default 127.0.0.1)\n"
            "  --wrap CMD         run each rank as CMD prog..., where {rank} in CMD is replaced\n"
            "                     by the rank (e.g. --wrap 'ip netns exec coh{rank}')\n"
            "  --timeout SEC      kill every rank after SEC seconds and exit 124\n"
            "  --keep-going       do not kill the other ranks when one fails\n"
            "  --bind none|core   core: hold each rank to one CPU of cohortrun's own set,\n"
            "                     rank r to the (r mod count)-th (default none: the kernel\n"
            "                     places and moves them)\n"
            "  (torch programs start unchanged: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,\n"
            "  MASTER_ADDR and MASTER_PORT, a free port, are set for every rank)\n"
            "  --no-prefix        do not prefix output lines with [rank]\n"
            "  --knobs [config|sched]  print the knobs the ranks read, as markdown tables\n"
            "\nThe ranks read these variables (defaults in brackets):\n");
#define KNOB_HELP(fld, k, d, env, lo, hi, h) fprintf(f, "  %-26s [%s] %s\n", env, *d ? d : "-", h);
    RX_CONFIG_MAP(KNOB_HELP)
    RX_ENV_MAP(KNOB_HELP)
#undef KNOB_HELP
    fprintf(f, "  %-26s scheduler parameters, also COHORT_SCHED_<NAME> each:\n", "COHORT_SCHED");
#define SCHED_HELP(nm, fl, k, sc, d, r, h) fprintf(f, "    %-24s [%s] %s\n", nm, d, h);
    SC_PARAM_MAP(SCHED_HELP)
#undef SCHED_HELP
}

static void sched_row(const char *name, const char *deflt, const char *range, const char *help)
{
    char r[128];
    size_t n = 0;
    /* "a|b" would split the markdown cell: "a, b" */
    for (const char *q = *range ? range : "0 or 1"; *q && n + 3 < sizeof(r); q++) {
        if (*q == '|') {
            r[n++] = ',';
            r[n++] = ' ';
        } else {
            r[n++] = *q;
        }
    }
    r[n] = 0;
    printf("| `%s` | `%s` | %s | %s |\n", name, deflt, r, help);
}

/* The README's knob table and docs/sched.md's parameter table are these,
 * verbatim (the docs.knobs test compares them). */
static void print_knobs(const char *which)
{
    if (!which || !strcmp(which, "config")) {
        printf("| variable | field | default | meaning |\n|---|---|---|---|\n");
#define KNOB_ROW(f, k, d, env, lo, hi, h)                                                          \
    printf("| `%s` | `%s` | %s%s%s | %s |\n", env, #f, *d ? "`" : "", *d ? d : "none",             \
           *d ? "`" : "", h);
        RX_CONFIG_MAP(KNOB_ROW)
#undef KNOB_ROW
#define ENV_ROW(f, k, d, env, lo, hi, h)                                                           \
    printf("| `%s` | - | %s%s%s | %s |\n", env, *d ? "`" : "", *d ? d : "none", *d ? "`" : "", h);
        RX_ENV_MAP(ENV_ROW)
#undef ENV_ROW
    }
    if (!which) printf("\n");
    if (!which || !strcmp(which, "sched")) {
        printf("| parameter | default | range | meaning |\n|---|---|---|---|\n");
#define SCHED_ROW(nm, fl, k, sc, d, r, h) sched_row(nm, d, r, h);
        SC_PARAM_MAP(SCHED_ROW)
#undef SCHED_ROW
    }
}

static void emit(out_stream_t *s, const char *p, size_t n)
{
    if (g.prefix) fprintf(s->dst, "[%d] ", s->rank->id);
    fwrite(p, 1, n, s->dst);
    fflush(s->dst);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    out_stream_t *s = h->data;
    if (s->len == sizeof(s->line)) { /* a line longer than the buffer: emit it in pieces */
        emit(s, s->line, s->len);
        if (g.prefix) fputc('\n', s->dst);
        s->len = 0;
    }
    buf->base = s->line + s->len;
    buf->len = sizeof(s->line) - s->len;
}

static void stream_closed(uv_handle_t *h)
{
    (void)h;
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    (void)buf;
    out_stream_t *s = st->data;
    if (nread < 0) {
        if (s->len) {
            emit(s, s->line, s->len);
            fputc('\n', s->dst);
            s->len = 0;
        }
        if (s->open) uv_close((uv_handle_t *)&s->pipe, stream_closed);
        s->open = false;
        return;
    }
    s->len += (size_t)nread;
    char *start = s->line, *nl;
    while ((nl = memchr(start, '\n', (size_t)(s->line + s->len - start))) != NULL) {
        emit(s, start, (size_t)(nl - start + 1));
        start = nl + 1;
    }
    size_t rest = (size_t)(s->line + s->len - start);
    memmove(s->line, start, rest);
    s->len = rest;
}

static void kill_all(int sig)
{
    for (int i = 0; i < g.n; i++)
        if (g.ranks[i].running) uv_process_kill(&g.ranks[i].proc, sig);
}

static void kill_timer_cb(uv_timer_t *t)
{
    (void)t;
    kill_all(SIGKILL);
}

static void start_killing(void)
{
    if (g.killing) return;
    g.killing = true;
    kill_all(SIGTERM);
    uv_timer_start(&g.kill_timer, kill_timer_cb, 3000, 0);
}

static void proc_closed(uv_handle_t *h)
{
    (void)h;
}

static void all_done(void)
{
    uv_timer_stop(&g.kill_timer);
    uv_timer_stop(&g.timeout_timer);
    uv_close((uv_handle_t *)&g.kill_timer, NULL);
    uv_close((uv_handle_t *)&g.timeout_timer, NULL);
    uv_close((uv_handle_t *)&g.sigint, NULL);
    uv_close((uv_handle_t *)&g.sigterm, NULL);
}

static void on_exit_cb(uv_process_t *p, int64_t status, int sig)
{
    rank_t *r = p->data;
    r->running = false;
    r->status = status;
    r->term_signal = sig;
    uv_close((uv_handle_t *)p, proc_closed);
    int code = sig ? 128 + sig : (int)status;
    if (code != 0) {
        if (!g.killing) {
            fprintf(stderr, "cohortrun: rank %d %s %d%s\n", r->id,
                    sig ? "was killed by signal" : "exited with status", sig ? sig : (int)status,
                    g.keep_going ? "" : "; stopping the other ranks");
        }
        if (g.first_fail == 0) g.first_fail = code;
        if (!g.keep_going) start_killing();
    }
    if (--g.alive == 0) all_done();
}

static void on_timeout(uv_timer_t *t)
{
    (void)t;
    fprintf(stderr, "cohortrun: timed out after %.0f s; killing every rank\n", g.timeout_s);
    if (g.first_fail == 0) g.first_fail = 124;
    start_killing();
}

/* Interrupted (Ctrl-C, a scheduler's SIGTERM): say which ranks it stops. */
static void on_signal(uv_signal_t *h, int sig)
{
    (void)h;
    if (g.first_fail == 0) g.first_fail = 128 + sig;
    if (!g.interrupted) {
        g.interrupted = sig;
        fprintf(stderr, "cohortrun: %s: stopping rank%s", sig == SIGINT ? "SIGINT" : "SIGTERM",
                g.alive == 1 ? "" : "s");
        const char *sep = " ";
        for (int i = 0; i < g.n; i++) {
            if (!g.ranks[i].running) continue;
            g.ranks[i].stopped = true;
            fprintf(stderr, "%s%d", sep, i);
            sep = ", ";
        }
        fprintf(stderr, " (SIGTERM, SIGKILL after 3 s)\n");
    }
    start_killing();
}

/* After an interruption: how each stopped rank ended. */
static void report_interrupted(void)
{
    if (!g.interrupted) return;
    fprintf(stderr, "cohortrun: interrupted:");
    const char *sep = " ";
    for (int i = 0; i < g.n; i++) {
        rank_t *r = &g.ranks[i];
        if (!r->stopped) continue;
        if (r->term_signal)
            fprintf(stderr, "%srank %d ended by %s", sep, i, strsignal(r->term_signal));
        else
            fprintf(stderr, "%srank %d exited with status %d", sep, i, (int)r->status);
        sep = ", ";
    }
    fprintf(stderr, "%s\n", *sep == ' ' ? " no rank was running" : "");
}

static char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *xasprintf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    if (vasprintf(&s, fmt, ap) < 0) {
        perror("cohortrun");
        exit(1);
    }
    va_end(ap);
    return s;
}

/* Split a --wrap command on spaces, with {rank} replaced. */
static int wrap_args(int rank, char **out, int max)
{
    if (!g.wrap) return 0;
    char *copy = strdup(g.wrap), *save = NULL;
    int n = 0;
    for (char *tok = strtok_r(copy, " ", &save); tok && n < max; tok = strtok_r(NULL, " ", &save)) {
        char *at = strstr(tok, "{rank}");
        out[n++] = at ? xasprintf("%.*s%d%s", (int)(at - tok), tok, rank, at + 6) : strdup(tok);
    }
    free(copy);
    return n;
}

/* rm -r path (what the ranks left: their sockets, after a crash). */
static int remove_one(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    (void)remove(p); /* what cannot go stays; the rest still goes */
    return 0;
}

static void remove_tree(const char *path)
{
    nftw(path, remove_one, 8, FTW_DEPTH | FTW_PHYS);
}

static void set_port(struct sockaddr_storage *sa, uint16_t port)
{
    if (sa->ss_family == AF_INET)
        ((struct sockaddr_in *)sa)->sin_port = htons(port);
    else
        ((struct sockaddr_in6 *)sa)->sin6_port = htons(port);
}

static int get_port(const struct sockaddr_storage *sa)
{
    return ntohs(sa->ss_family == AF_INET ? ((const struct sockaddr_in *)sa)->sin_port
                                          : ((const struct sockaddr_in6 *)sa)->sin6_port);
}

/* Bind fd to a random free port below the kernel's ephemeral range: a
 * later init in the job binds COHORT_STORE again, and an ephemeral port can
 * meanwhile be any connection's source port (mp.lb.n4.rails2 once failed
 * with "address already in use"). On failure the port is left 0 (the
 * kernel's pick at bind). */
static bool bind_low_port(int fd, struct sockaddr_storage *sa, socklen_t sl)
{
    int lo_eph = 32768;
    FILE *pr = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (pr) {
        if (fscanf(pr, "%d", &lo_eph) != 1) lo_eph = 32768;
        fclose(pr);
    }
    for (int k = 0; fd >= 0 && k < 64 && lo_eph > 11024; k++) {
        unsigned r = 0;
        if (getrandom(&r, sizeof(r), 0) != (ssize_t)sizeof(r)) break;
        set_port(sa, (uint16_t)(10000 + r % (unsigned)(lo_eph - 10000)));
        if (bind(fd, (struct sockaddr *)sa, sl) == 0) return true;
    }
    set_port(sa, 0);
    return false;
}

/* A free port for torch's store (MASTER_PORT): bound, then released just
 * before the ranks start, so nothing else of ours takes it meanwhile. */
static int reserve_port(const struct sockaddr_storage *store_sa, socklen_t sl)
{
    struct sockaddr_storage sa = *store_sa;
    int fd = socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    set_port(&sa, 0);
    bool ok = fd >= 0 && (bind_low_port(fd, &sa, sl) || bind(fd, (struct sockaddr *)&sa, sl) == 0);
    int port = ok && getsockname(fd, (struct sockaddr *)&sa, &sl) == 0 ? get_port(&sa) : 0;
    if (fd >= 0) close(fd);
    return port;
}

int main(int argc, char **argv)
{
    int i = 1;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--")) {
            i++;
            break;
        } else if ((!strcmp(a, "-n") || !strcmp(a, "--np")) && i + 1 < argc) {
            g.n = atoi(argv[++i]);
        } else if (!strcmp(a, "--nics") && i + 1 < argc) {
            g.nics = argv[++i];
        } else if (!strcmp(a, "--token") && i + 1 < argc) {
            g.token = argv[++i];
        } else if (!strcmp(a, "--store-host") && i + 1 < argc) {
            g.store_host = argv[++i];
        } else if (!strcmp(a, "--wrap") && i + 1 < argc) {
            g.wrap = argv[++i];
        } else if (!strcmp(a, "--timeout") && i + 1 < argc) {
            g.timeout_s = atof(argv[++i]);
        } else if (!strcmp(a, "--bind") && i + 1 < argc) {
            const char *b = argv[++i];
            if (strcmp(b, "none") && strcmp(b, "core")) {
                fprintf(stderr, "cohortrun: --bind none or --bind core\n");
                return 2;
            }
            g.bind = !strcmp(b, "core");
        } else if (!strcmp(a, "--keep-going")) {
            g.keep_going = true;
        } else if (!strcmp(a, "--no-prefix")) {
            g.prefix = false;
        } else if (!strcmp(a, "--knobs")) {
            const char *which = i + 1 < argc && argv[i + 1][0] != '-' ? argv[++i] : NULL;
            if (which && strcmp(which, "config") && strcmp(which, "sched")) {
                fprintf(stderr, "cohortrun: --knobs config or --knobs sched\n");
                return 2;
            }
            print_knobs(which);
            return 0;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (a[0] != '-') {
            break; /* the program, without "--" */
        } else {
            fprintf(stderr, "cohortrun: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (g.n < 1 || i >= argc) {
        usage(stderr);
        return 2;
    }
    g.argv = argv + i;
    int nargs = argc - i;

    char token[65];
    if (!g.token) g.token = getenv("COHORT_TOKEN");
    if (!g.token || !*g.token) {
        unsigned char raw[16];
        if (getrandom(raw, sizeof(raw), 0) != (ssize_t)sizeof(raw)) {
            perror("cohortrun: getrandom");
            return 1;
        }
        for (int k = 0; k < 16; k++) snprintf(token + 2 * k, 3, "%02x", raw[k]);
        g.token = token;
    }

    /* The store's listening socket, handed to rank 0. */
    struct sockaddr_storage sa;
    memset(&sa, 0, sizeof(sa));
    if (uv_ip4_addr(g.store_host, 0, (struct sockaddr_in *)&sa) != 0 &&
        uv_ip6_addr(g.store_host, 0, (struct sockaddr_in6 *)&sa) != 0) {
        fprintf(stderr, "cohortrun: --store-host %s is not an IP address\n", g.store_host);
        return 2;
    }
    /* CLOEXEC: only rank 0 gets it (as fd 3), no other child keeps the port. */
    int lfd = socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    socklen_t sl =
        sa.ss_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
    bool bound = bind_low_port(lfd, &sa, sl);
    if (lfd < 0 || (!bound && bind(lfd, (struct sockaddr *)&sa, sl) != 0) ||
        listen(lfd, 1024) != 0 || getsockname(lfd, (struct sockaddr *)&sa, &sl) != 0) {
        fprintf(stderr, "cohortrun: cannot listen on %s: %s\n", g.store_host, strerror(errno));
        return 1;
    }
    int port = get_port(&sa);
    int master_port = reserve_port(&sa, sl);
    if (master_port == 0) {
        fprintf(stderr, "cohortrun: no free port for MASTER_PORT on %s\n", g.store_host);
        return 1;
    }

    g.loop = uv_default_loop();
    uv_timer_init(g.loop, &g.kill_timer);
    uv_timer_init(g.loop, &g.timeout_timer);
    uv_signal_init(g.loop, &g.sigint);
    uv_signal_init(g.loop, &g.sigterm);
    uv_signal_start(&g.sigint, on_signal, SIGINT);
    uv_signal_start(&g.sigterm, on_signal, SIGTERM);
    if (g.timeout_s > 0)
        uv_timer_start(&g.timeout_timer, on_timeout, (uint64_t)(g.timeout_s * 1000), 0);

    /* The ranks' shared-memory sockets go in a directory of this run's, removed
     * at the end whatever happened to them (unless COHORT_SHM_DIR says where). */
    char shm_dir[64] = "";
    if (!getenv("COHORT_SHM_DIR")) {
        snprintf(shm_dir, sizeof(shm_dir), "%s/cohortrun-XXXXXX",
                 access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
        if (!mkdtemp(shm_dir)) shm_dir[0] = 0;
    }

    /* The environment every rank shares, minus the variables set per rank. */
    size_t nenv = 0;
    while (environ[nenv]) nenv++;
    static const char *const ours[] = {"COHORT_RANK=",  "COHORT_WORLD_SIZE=", "COHORT_LOCAL_RANK=",
                                       "COHORT_STORE=", "COHORT_STORE_FD=",   "COHORT_TOKEN=",
                                       "COHORT_NICS=",  "COHORT_LOCAL_SIZE=", "RANK=",
                                       "WORLD_SIZE=",   "LOCAL_RANK=",        "LOCAL_WORLD_SIZE=",
                                       "MASTER_ADDR=",  "MASTER_PORT="};
    /* --bind core: a child inherits the spawning thread's CPU set, so this
     * thread takes each rank's CPU for its spawn and its own set back after. */
    cpu_set_t own;
    int ncpu = 0, cpus[CPU_SETSIZE];
    if (g.bind) {
        if (sched_getaffinity(0, sizeof(own), &own) != 0) {
            perror("cohortrun: sched_getaffinity");
            return 1;
        }
        for (int c = 0; c < CPU_SETSIZE; c++)
            if (CPU_ISSET(c, &own)) cpus[ncpu++] = c;
    }
    g.ranks = calloc((size_t)g.n, sizeof(rank_t));
    for (int r = 0; r < g.n; r++) {
        rank_t *rk = &g.ranks[r];
        rk->id = r;
        char **env = calloc(nenv + 24, sizeof(char *));
        size_t e = 0, ours_from;
        for (size_t k = 0; k < nenv; k++) {
            bool skip = false;
            for (size_t o = 0; o < sizeof(ours) / sizeof(ours[0]); o++)
                if (!strncmp(environ[k], ours[o], strlen(ours[o]))) skip = true;
            if (g.nics == NULL && !strncmp(environ[k], "COHORT_NICS=", 12)) skip = false;
            if (!skip) env[e++] = environ[k];
        }
        ours_from = e; /* env[ours_from..] are ours to free */
        env[e++] = xasprintf("COHORT_RANK=%d", r);
        env[e++] = xasprintf("COHORT_WORLD_SIZE=%d", g.n);
        env[e++] = xasprintf("COHORT_LOCAL_RANK=%d", r);
        env[e++] = xasprintf("COHORT_LOCAL_SIZE=%d", g.n);
        env[e++] =
            xasprintf(sa.ss_family == AF_INET ? "COHORT_STORE=%s:%d" : "COHORT_STORE=[%s]:%d",
                      g.store_host, port);
        env[e++] = xasprintf("COHORT_TOKEN=%s", g.token);
        /* torch's (torch.distributed's env:// rendezvous, torchrun's names) */
        env[e++] = xasprintf("RANK=%d", r);
        env[e++] = xasprintf("WORLD_SIZE=%d", g.n);
        env[e++] = xasprintf("LOCAL_RANK=%d", r);
        env[e++] = xasprintf("LOCAL_WORLD_SIZE=%d", g.n);
        env[e++] = xasprintf("MASTER_ADDR=%s", g.store_host);
        env[e++] = xasprintf("MASTER_PORT=%d", master_port);
        if (g.nics) env[e++] = xasprintf("COHORT_NICS=%s", g.nics);
        if (r == 0) env[e++] = xasprintf("COHORT_STORE_FD=%d", 3);
        if (shm_dir[0]) env[e++] = xasprintf("COHORT_SHM_DIR=%s", shm_dir);
        env[e] = NULL;

        char **args = calloc((size_t)nargs + 33, sizeof(char *));
        int na = wrap_args(r, args, 32), nwrap = na;
        for (int k = 0; k < nargs; k++) args[na++] = g.argv[k];
        args[na] = NULL;

        uv_stdio_container_t stdio[4];
        stdio[0].flags = UV_INHERIT_FD;
        stdio[0].data.fd = 0;
        rk->out = (out_stream_t){.rank = rk, .dst = stdout, .open = true};
        rk->err = (out_stream_t){.rank = rk, .dst = stderr, .open = true};
        uv_pipe_init(g.loop, &rk->out.pipe, 0);
        uv_pipe_init(g.loop, &rk->err.pipe, 0);
        rk->out.pipe.data = &rk->out;
        rk->err.pipe.data = &rk->err;
        stdio[1].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
        stdio[1].data.stream = (uv_stream_t *)&rk->out.pipe;
        stdio[2].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
        stdio[2].data.stream = (uv_stream_t *)&rk->err.pipe;
        stdio[3].flags = r == 0 ? UV_INHERIT_FD : UV_IGNORE;
        stdio[3].data.fd = lfd;
        uv_process_options_t opts = {.file = args[0],
                                     .args = args,
                                     .env = env,
                                     .exit_cb = on_exit_cb,
                                     .stdio = stdio,
                                     .stdio_count = r == 0 ? 4 : 3};
        rk->proc.data = rk;
        if (ncpu > 0) {
            cpu_set_t one;
            CPU_ZERO(&one);
            CPU_SET(cpus[r % ncpu], &one);
            if (sched_setaffinity(0, sizeof(one), &one) != 0)
                fprintf(stderr, "cohortrun: rank %d: cannot bind to CPU %d: %s\n", r,
                        cpus[r % ncpu], strerror(errno));
        }
        int err = uv_spawn(g.loop, &rk->proc, &opts);
        if (ncpu > 0) sched_setaffinity(0, sizeof(own), &own);
        if (err) {
            fprintf(stderr, "cohortrun: cannot start rank %d (%s): %s\n", r, args[0],
                    uv_strerror(err));
            uv_close((uv_handle_t *)&rk->out.pipe, NULL);
            uv_close((uv_handle_t *)&rk->err.pipe, NULL);
            rk->out.open = rk->err.open = false;
            uv_close((uv_handle_t *)&rk->proc, NULL);
            if (g.first_fail == 0) g.first_fail = 127;
            start_killing();
            for (int k = 0; k < nwrap; k++) free(args[k]);
            for (size_t k = ours_from; k < e; k++) free(env[k]);
            free(args);
            free(env);
            break;
        }
        rk->running = true;
        g.alive++;
        uv_read_start((uv_stream_t *)&rk->out.pipe, on_alloc, on_read);
        uv_read_start((uv_stream_t *)&rk->err.pipe, on_alloc, on_read);
        for (int k = 0; k < nwrap; k++) free(args[k]);
        for (size_t k = ours_from; k < e; k++) free(env[k]);
        free(args);
        free(env);
    }
    close(lfd); /* rank 0 holds its own copy */
    if (g.alive == 0) all_done();
    uv_run(g.loop, UV_RUN_DEFAULT);
    uv_loop_close(g.loop);
    report_interrupted(); /* reads g.ranks */
    free(g.ranks);
    if (shm_dir[0]) remove_tree(shm_dir);
    return g.first_fail;
}
