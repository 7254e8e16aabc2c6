/*
 * Bootstrap across processes: re-initialisation and hostile connections,
 * one mode per CTest (each a regression test of a defect found from outside):
 *
 *   reinit C       C cycles of init, finalize, init, allreduce, finalize with
 *                  the store address set explicitly (no inherited socket):
 *                  every one succeeds. Cycles take turns: no delay, rank 0
 *                  slow to finalize (the others reach its previous store, still
 *                  up), rank 0 fast (its new store is up before the others
 *                  finalized). A client of one incarnation used to talk to the
 *                  store of the previous one and read stale addresses.
 *   reinit-fd      under cohortrun (rank 0 inherits the store's socket as
 *                  COHORT_STORE_FD, no other rank does): init, finalize, then
 *                  the application's own file, then its own listening socket,
 *                  on that fd number, around two more inits: each init
 *                  succeeds and the application's descriptors are left alone
 *                  (the second init used to adopt the file and close it). A
 *                  successful init leaves coh_last_error alone.
 *   reinit-taken   under cohortrun: between two contexts rank 0 tries to
 *                  take the store's port; it must still be the job's, and the
 *                  second init must work.
 *   reject N       rank 0 makes N bad connections (wrong token, garbage, a
 *                  hello of the wrong kind) to every listener of the job: the
 *                  store, the coordinator and every rank's rails, one after
 *                  the other, then 100 at once to each. Each rank's
 *                  connections_rejected must count exactly its listeners'.
 *   world          rank 1 believes the world has 3 ranks: its coh_init fails
 *                  naming the world size (not the job token), rank 0's fails.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "engines/en_frame.h"
#include "mp_util.h"
#include "reactor/rx_addr.h"
#include "reactor/rx_ctx.h"

static int R, N;

static void sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* An allreduce whose result depends on the cycle: a stale peer shows. */
static void check_allreduce(coh_ctx_t *ctx, int cycle)
{
    coh_comm_t *w;
    MP_OK(coh_ctx_world(ctx, &w));
    double v[64];
    for (int i = 0; i < 64; i++) v[i] = R + cycle + i;
    MP_OK(coh_allreduce_sync(w, NULL, v, 64, COH_F64, COH_SUM));
    for (int i = 0; i < 64; i++) {
        double want = N * (N - 1) / 2.0 + N * (double)(cycle + i);
        if (v[i] != want) MP_FAIL("cycle %d: v[%d] = %g, expected %g", cycle, i, v[i], want);
    }
}

static coh_ctx_t *init_or_fail(const coh_config_t *cfg, const char *what, int cycle)
{
    coh_ctx_t *ctx;
    int st = coh_init(cfg, &ctx);
    if (st != 0)
        MP_FAIL("cycle %d: %s: coh_init: %s: %s", cycle, what, coh_status_name(st),
                coh_last_error());
    return ctx;
}

static void mode_reinit(int cycles)
{
    /* Rank 0 binds COHORT_STORE itself: the launcher's socket goes. */
    const char *fds = getenv("COHORT_STORE_FD");
    if (fds) {
        close(atoi(fds));
        /* The launcher closes its copy once every rank is started. */
        struct sockaddr_storage a;
        MP_OK(rx_resolve_hostport(getenv("COHORT_STORE"), &a));
        for (int i = 0;; i++) {
            int s = socket(a.ss_family, SOCK_STREAM, 0), one = 1;
            setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
            int ok = bind(s, (struct sockaddr *)&a, sizeof(struct sockaddr_in)) == 0;
            close(s);
            if (ok) break;
            if (i == 500) MP_FAIL("the store's port stays taken: %s", strerror(errno));
            sleep_ms(10);
        }
    }
    coh_config_t cfg;
    MP_OK(coh_config_init(&cfg));
    cfg.store_fd = -1;
    R = mp_rank = cfg.rank;
    N = cfg.world_size;
    for (int c = 0; c < cycles; c++) {
        /* 0: no delay; 1: rank 0 finalizes late; 2: the others do. */
        int slow = c % 3 == 1 ? R == 0 : c % 3 == 2 ? R != 0 : 0;
        coh_ctx_t *ctx = init_or_fail(&cfg, "first init", c);
        if (slow) sleep_ms(200);
        MP_OK(coh_finalize(ctx));
        ctx = init_or_fail(&cfg, "second init", c);
        check_allreduce(ctx, c);
        if (slow) sleep_ms(200);
        MP_OK(coh_finalize(ctx));
    }
    printf("rank %d: %d cycles\nrank %d: OK\n", R, cycles, R);
}

static int port_of(int fd)
{
    struct sockaddr_storage a;
    socklen_t l = sizeof(a);
    if (getsockname(fd, (struct sockaddr *)&a, &l) != 0) return -1;
    return ntohs(((struct sockaddr_in *)&a)->sin_port);
}

static void mode_reinit_fd(void)
{
    const char *fds = getenv("COHORT_STORE_FD");
    int fd0 = fds ? atoi(fds) : -1;
    if (R == 0 && fd0 < 0) MP_FAIL("rank 0 inherited no COHORT_STORE_FD");
    /* The launcher's socket is rank 0's alone: no other rank holds the port. */
    for (int fd = 3; R != 0 && fd < 1024; fd++) {
        int acc = 0;
        socklen_t l = sizeof(acc);
        if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &l) == 0 && acc)
            MP_FAIL("rank %d inherited a listening socket (fd %d)", R, fd);
    }
    /* A failure earlier leaves its text; a successful init must not change it. */
    coh_ctx_t *ctx;
    if (coh_init(NULL, NULL) != COH_EINVAL) MP_FAIL("coh_init(NULL, NULL) did not fail");
    char before[512];
    snprintf(before, sizeof(before), "%s", coh_last_error());
    ctx = init_or_fail(NULL, "init", 0);
    if (strcmp(coh_last_error(), before) != 0)
        MP_FAIL("a successful coh_init set the last error to \"%s\"", coh_last_error());
    check_allreduce(ctx, 0);
    MP_OK(coh_finalize(ctx));

    /* The application's own file, on the inherited socket's old number. */
    char path[] = "/tmp/cohort-reinit-XXXXXX";
    if (R == 0) {
        int f = mkstemp(path);
        if (f < 0) MP_FAIL("mkstemp: %s", strerror(errno));
        unlink(path);
        if (write(f, "user data", 9) != 9) MP_FAIL("write: %s", strerror(errno));
        if (f != fd0) {
            if (dup2(f, fd0) != fd0) MP_FAIL("dup2: %s", strerror(errno));
            close(f);
        }
    }
    ctx = init_or_fail(NULL, "init with a file on the old fd", 1);
    check_allreduce(ctx, 1);
    MP_OK(coh_finalize(ctx));
    if (R == 0) {
        char buf[16] = "";
        if (pread(fd0, buf, sizeof(buf) - 1, 0) != 9 || strcmp(buf, "user data") != 0)
            MP_FAIL("the application's file on fd %d: %s (read \"%s\")", fd0, strerror(errno), buf);
        close(fd0);
    }

    /* The application's own listening socket there: not the launcher's. */
    int port = -1;
    if (R == 0) {
        int s = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(s, 4) != 0)
            MP_FAIL("listen: %s", strerror(errno));
        if (s != fd0) {
            if (dup2(s, fd0) != fd0) MP_FAIL("dup2: %s", strerror(errno));
            close(s);
        }
        port = port_of(fd0);
    }
    ctx = init_or_fail(NULL, "init with a listening socket on the old fd", 2);
    check_allreduce(ctx, 2);
    MP_OK(coh_finalize(ctx));
    if (R == 0) {
        int acc = 0;
        socklen_t l = sizeof(acc);
        if (getsockopt(fd0, SOL_SOCKET, SO_ACCEPTCONN, &acc, &l) != 0 || !acc ||
            port_of(fd0) != port)
            MP_FAIL("the application's listening socket on fd %d is gone: %s", fd0,
                    strerror(errno));
        close(fd0);
    }
    printf("rank %d: OK\n", R);
}

/* Under cohortrun: between two contexts rank 0 tries to take the store's
 * port, as any process on the host may. It must stay the job's (the
 * launcher's socket is kept for the process), and the second init must
 * work. Rank 0 used to bind the port again at the second init, and failed
 * with EADDRINUSE when something else had it (mp.lb.n4.rails2 in CI). */
static void mode_reinit_taken(void)
{
    coh_ctx_t *ctx = init_or_fail(NULL, "first init", 0);
    check_allreduce(ctx, 0);
    MP_OK(coh_finalize(ctx));
    int s = -1;
    if (R == 0) {
        const char *st = getenv("COHORT_STORE"), *colon = st ? strrchr(st, ':') : NULL;
        if (!colon) MP_FAIL("no COHORT_STORE host:port");
        struct sockaddr_in a = {.sin_family = AF_INET,
                                .sin_port = htons((uint16_t)atoi(colon + 1)),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int one = 1;
        setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (s >= 0 && bind(s, (struct sockaddr *)&a, sizeof(a)) == 0 && listen(s, 4) == 0)
            MP_FAIL("port %d was free between two contexts: anything could take it",
                    ntohs(a.sin_port));
    }
    ctx = init_or_fail(NULL, "second init", 1);
    check_allreduce(ctx, 1);
    MP_OK(coh_finalize(ctx));
    if (s >= 0) close(s);
    printf("rank %d: OK\n", R);
}

/* ---- hostile connections ---- */

/* A bad connection of kind k, its bytes sent. */
static int bad_open(const struct sockaddr_storage *to, int k, uint16_t kind)
{
    int fd = socket(to->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    socklen_t l =
        to->ss_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
    if (fd < 0 || connect(fd, (const struct sockaddr *)to, l) != 0)
        MP_FAIL("connect: %s", strerror(errno));
    uint8_t b[EN_HELLO_SIZE];
    size_t n = sizeof(b);
    if (k == 1) {
        memcpy(b, "GET / HTTP/1.0\r\n\r\n", 18);
        n = 18;
    } else {
        /* 0: a stranger's token; 2: the job's token on a hello of another kind */
        en_hello_t h = {.version = EN_PROTO_VERSION,
                        .kind = k == 0 ? kind
                                       : (kind == EN_HELLO_DATA ? EN_HELLO_STORE : EN_HELLO_DATA),
                        .rank = (uint32_t)(N - 1),
                        .world = (uint32_t)N,
                        .nrails = 1};
        en_hello_set_token(&h, k == 0 ? "not the job's token" : getenv("COHORT_TOKEN"));
        en_hello_encode(&h, b);
    }
    /* A listener that drops a connection at once (too many handshakes)
     * may have reset it already. */
    if (send(fd, b, n, MSG_NOSIGNAL) != (ssize_t)n && errno != ECONNRESET && errno != EPIPE)
        MP_FAIL("send: %s", strerror(errno));
    return fd;
}

/* Wait until the listener has hung up on fd, then close it. */
static void bad_close(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    uint8_t b[EN_HELLO_SIZE];
    for (;;) {
        if (poll(&p, 1, 20000) != 1) MP_FAIL("a listener kept a bad connection");
        if (recv(fd, b, sizeof(b), 0) <= 0) break; /* a refusal may answer a hello first */
    }
    close(fd);
}

static void bad_connection(const struct sockaddr_storage *to, int k, uint16_t kind)
{
    bad_close(bad_open(to, k, kind));
}

static uint64_t rejected(coh_ctx_t *ctx)
{
    coh_stats_t s;
    MP_OK(coh_ctx_stats(ctx, &s));
    return s.connections_rejected;
}

static void mode_reject(int n)
{
    coh_comm_t *w;
    coh_ctx_t *ctx = mp_init(&w, &R, &N);
    struct coh_ctx *c = ctx;
    /* Every rank's rail addresses, gathered. */
    struct sockaddr_storage mine[RX_MAX_RAILS];
    memset(mine, 0, sizeof(mine));
    for (int r = 0; r < c->nrails; r++) mine[r] = c->rails[r].en.bound;
    struct sockaddr_storage *all = calloc((size_t)N, sizeof(mine));
    coh_request_t *q;
    MP_OK(coh_allgather(w, mine, all, sizeof(mine), COH_U8, &q));
    mp_wait(q);
    /* Not always 0: under -j2 a process of another test may redial a port
     * this job's listener now holds (a fault test resuming a dead peer's
     * link) and be refused for its job token (TSan CI, 2026-11-26). */
    uint64_t base = rejected(ctx);
    /* Rank 0 dials once every rank has its base: its allgather can end
     * before another's, whose listener then counted 4 of its dials in base
     * (236 of 240 counted, 2026-11-26). */
    MP_OK(coh_barrier(w, &q));
    mp_wait(q);
    if (base != 0)
        printf("rank %d: %llu connections rejected before the test (strangers)\n", R,
               (unsigned long long)base);
    uint64_t want = 0;
    if (R == 0) {
        struct sockaddr_storage store;
        MP_OK(rx_resolve_hostport(getenv("COHORT_STORE"), &store));
        for (int i = 0; i < n; i++) {
            bad_connection(&store, i % 3, EN_HELLO_STORE);
            bad_connection(&c->coord_addr, i % 3, EN_HELLO_CTRL);
            for (int p = 0; p < N; p++)
                for (int r = 0; r < c->nrails; r++)
                    bad_connection(&all[p * RX_MAX_RAILS + r], i % 3, EN_HELLO_DATA);
        }
        /* Then a burst: more at once than a listener lets handshake. */
        enum { BURST = 100 };
        static int fds[BURST];
        for (int l = 0; l < 2 + N * c->nrails; l++) {
            const struct sockaddr_storage *to =
                l == 0   ? &store
                : l == 1 ? &c->coord_addr
                         : &all[(l - 2) / c->nrails * RX_MAX_RAILS + (l - 2) % c->nrails];
            uint16_t kind = l == 0 ? EN_HELLO_STORE : l == 1 ? EN_HELLO_CTRL : EN_HELLO_DATA;
            for (int i = 0; i < BURST; i++) fds[i] = bad_open(to, i % 3, kind);
            for (int i = 0; i < BURST; i++) bad_close(fds[i]);
        }
        want = (uint64_t)(n + BURST) * (2 + (uint64_t)c->nrails);
    } else {
        want = (uint64_t)(n + 100) * (uint64_t)c->nrails;
    }
    /* Every hang-up was seen by rank 0 before this barrier. */
    MP_OK(coh_barrier(w, &q));
    mp_wait(q);
    uint64_t got = 0;
    for (int i = 0; i < 500 && (got = rejected(ctx) - base) < want; i++) sleep_ms(10);
    sleep_ms(200);
    got = rejected(ctx) - base;
    printf("rank %d: %llu of %llu bad connections counted\n", R, (unsigned long long)got,
           (unsigned long long)want);
    MP_EQ_INT(got, want);
    check_allreduce(ctx, 0); /* the job goes on */
    free(all);
    MP_OK(coh_barrier(w, &q));
    mp_wait(q);
    MP_OK(coh_finalize(ctx));
    printf("rank %d: OK\n", R);
}

static void mode_world(void)
{
    coh_config_t cfg;
    MP_OK(coh_config_init(&cfg));
    R = mp_rank = cfg.rank;
    if (R == 1) cfg.world_size = 3;
    cfg.connect_timeout_ms = R == 0 ? 3000 : 20000;
    coh_ctx_t *ctx;
    int st = coh_init(&cfg, &ctx);
    if (st == 0) MP_FAIL("coh_init succeeded with world sizes 2 and 3");
    const char *why = coh_last_error();
    printf("rank %d: %s: %s\n", R, coh_status_name(st), why);
    if (R == 1 && (!strstr(why, "world size") || strstr(why, "TOKEN")))
        MP_FAIL("the error does not name the world size: %s", why);
    printf("rank %d: OK\n", R);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: test_bootstrap MODE [args]\n");
        return 2;
    }
    const char *r = getenv("COHORT_RANK"), *n_ = getenv("COHORT_WORLD_SIZE");
    R = mp_rank = r ? atoi(r) : -1;
    N = n_ ? atoi(n_) : 0;
    const char *m = argv[1];
    int n = argc > 2 ? atoi(argv[2]) : 10;
    if (!strcmp(m, "reinit"))
        mode_reinit(n);
    else if (!strcmp(m, "reinit-fd"))
        mode_reinit_fd();
    else if (!strcmp(m, "reinit-taken"))
        mode_reinit_taken();
    else if (!strcmp(m, "reject"))
        mode_reject(n);
    else if (!strcmp(m, "world"))
        mode_world();
    else
        MP_FAIL("unknown mode %s", m);
    return 0;
}
