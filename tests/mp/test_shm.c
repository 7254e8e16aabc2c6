/*
 * The shared-memory transport (engines/en_shm.c, docs/shm.md) across
 * processes. Modes:
 *
 *   split H      ranks pose as hosts of H ranks each (COHORT_HOST_ID from
 *                the rank): every collective (reduce-scatter too) is exact, and the traffic splits
 *                as it must: only links inside a host go through shared
 *                memory (H = 1: none; H = world size: all).
 *   stranger     rank 0 dials rank 1's shared-memory socket as a stranger
 *                would: a wrong job token, garbage, a hello of the right job
 *                from a rank that may not dial; each is refused and counted
 *                on rank 1, and no ring of a refused dial is used. The job's
 *                directory is this user's alone (0700).
 *   dir          prints COHORT_SHM_DIR (the test script checks that cohortrun
 *                removed it after the job, whatever happened to the ranks).
 */
#include <errno.h>
#include <poll.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <errno.h>
#include <string.h>
#include <linux/capability.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#include "engines/engine.h"
#include "mp_util.h"
#include "reactor/rx_ctx.h"

static int R, N;
static coh_comm_t *W;

static void check_sum(size_t n)
{
    float *v = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) v[i] = (float)(R + (int)(i % 100));
    MP_OK(coh_allreduce_sync(W, NULL, v, n, COH_F32, COH_SUM));
    for (size_t i = 0; i < n; i++) {
        float want = (float)(N * (N - 1) / 2 + N * (int)(i % 100));
        if (v[i] != want) MP_FAIL("allreduce of %zu: v[%zu] = %g, want %g", n, i, v[i], want);
    }
    free(v);
}

static void check_bcast_gather(size_t n)
{
    int *v = malloc(n * sizeof(int)), *all = malloc(n * (size_t)N * sizeof(int));
    for (size_t i = 0; i < n; i++) v[i] = R == 1 % N ? (int)i * 3 : -1;
    coh_request_t *q;
    MP_OK(coh_broadcast(W, v, n, COH_I32, 1 % N, &q));
    MP_OK(coh_wait(q, -1));
    coh_request_free(q);
    for (size_t i = 0; i < n; i++)
        if (v[i] != (int)i * 3) MP_FAIL("broadcast of %zu: v[%zu] = %d", n, i, v[i]);
    for (size_t i = 0; i < n; i++) v[i] = R * 1000 + (int)(i % 1000);
    MP_OK(coh_allgather(W, v, all, n, COH_I32, &q));
    MP_OK(coh_wait(q, -1));
    coh_request_free(q);
    for (int r = 0; r < N; r++)
        for (size_t i = 0; i < n; i++)
            if (all[(size_t)r * n + i] != r * 1000 + (int)(i % 1000))
                MP_FAIL("allgather of %zu: rank %d's element %zu is %d", n, r, i,
                        all[(size_t)r * n + i]);
    free(v);
    free(all);
}

/* Each rank's block b of the input is R + b + i % 100: its own block sums
 * to N(N-1)/2 + N R + N (i % 100). */
static void check_rs(size_t n)
{
    float *in = malloc(n * (size_t)N * sizeof(float)), *out = malloc(n * sizeof(float));
    for (int b = 0; b < N; b++)
        for (size_t i = 0; i < n; i++) in[(size_t)b * n + i] = (float)(R + b + (int)(i % 100));
    coh_request_t *q;
    MP_OK(coh_reduce_scatter(W, in, out, n, COH_F32, COH_SUM, &q));
    MP_OK(coh_wait(q, -1));
    coh_request_free(q);
    for (size_t i = 0; i < n; i++) {
        float want = (float)(N * (N - 1) / 2 + N * R + N * (int)(i % 100));
        if (out[i] != want)
            MP_FAIL("reduce-scatter of %zu: [%zu] = %g, want %g", n, i, out[i], want);
    }
    free(in);
    free(out);
}

static void mode_split(int per_host)
{
    /* Before init: which pretend host this rank is on. */
    const char *rs = getenv("COHORT_RANK");
    int rank = rs ? atoi(rs) : 0;
    char host[32];
    snprintf(host, sizeof(host), "host-%d", rank / per_host);
    setenv("COHORT_HOST_ID", host, 1);
    /* A process others may not read (as under a strict ptrace policy, or a
     * setuid one): the single-copy probe fails and the rings carry it all. */
    const char *und = getenv("COHORT_TEST_UNDUMPABLE");
    bool undumpable = und && atoi(und);
    if (undumpable) {
        if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) MP_FAIL("prctl: %s", strerror(errno));
        /* Root reads any process through CAP_SYS_PTRACE: give it up. */
        struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3};
        struct __user_cap_data_struct d[2];
        if (syscall(SYS_capget, &h, d) != 0) MP_FAIL("capget: %s", strerror(errno));
        d[CAP_SYS_PTRACE / 32].effective &= ~(1u << (CAP_SYS_PTRACE % 32));
        d[CAP_SYS_PTRACE / 32].permitted &= ~(1u << (CAP_SYS_PTRACE % 32));
        if (syscall(SYS_capset, &h, d) != 0) MP_FAIL("capset: %s", strerror(errno));
    }
    coh_ctx_t *ctx = mp_init(&W, &R, &N);
    struct coh_ctx *c = ctx;
    int local = 0;
    for (int p = 0; p < N; p++) local += p != R && c->same_host[p];
    int want_local =
        (R / per_host + 1) * per_host <= N ? per_host - 1 : N - R / per_host * per_host - 1;
    MP_EQ_INT(local, want_local);
    MP_EQ_INT(c->local_n, want_local + 1);
    const size_t sizes[] = {0, 1, 7, 1000, 65536, 1 << 20, 3 << 20};
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        if (sizes[k]) check_sum(sizes[k]);
        check_bcast_gather(sizes[k] ? sizes[k] : 1);
        check_rs(sizes[k] ? sizes[k] : 1);
        coh_request_t *q;
        MP_OK(coh_barrier(W, &q));
        MP_OK(coh_wait(q, -1));
        coh_request_free(q);
    }
    coh_stats_t s;
    MP_OK(coh_ctx_stats(ctx, &s));
    printf("rank %d: %d peer(s) on its host; sent %llu bytes, %llu through shared memory; "
           "received %llu, %llu\n",
           R, local, (unsigned long long)s.bytes_sent, (unsigned long long)s.shm_bytes_sent,
           (unsigned long long)s.bytes_received, (unsigned long long)s.shm_bytes_received);
    if (local == 0 && (s.shm_bytes_sent || s.shm_bytes_received))
        MP_FAIL("no peer on this host, but %llu bytes went through shared memory",
                (unsigned long long)s.shm_bytes_sent);
    if (local > 0 && (!s.shm_bytes_sent || !s.shm_bytes_received))
        MP_FAIL("%d peer(s) on this host, but nothing went through shared memory", local);
    if (local == N - 1 &&
        (s.shm_bytes_sent != s.bytes_sent || s.shm_bytes_received != s.bytes_received))
        MP_FAIL(
            "every peer is on this host, but only %llu of %llu bytes went through shared memory",
            (unsigned long long)s.shm_bytes_sent, (unsigned long long)s.bytes_sent);
    /* Frames of 256 KiB and more (the 1 and 3 MiB allreduces) are read from
     * the sender's memory where the kernel lets a process read another of
     * the same user (here: the test says so), never with the knob at 0. A
     * rank whose ring neighbour is on another host gets little this way. */
    const char *cma = getenv("COHORT_SHM_CMA_BYTES");
    bool cma_off = cma && atoll(cma) == 0;
    const char *want_cma = getenv("COHORT_TEST_EXPECT_CMA");
    printf("rank %d: %llu bytes read from the senders' memory\n", R,
           (unsigned long long)s.shm_cma_bytes_received);
    if ((cma_off || undumpable) && s.shm_cma_bytes_received)
        MP_FAIL("%s, but %llu bytes were read from peers' memory",
                cma_off ? "COHORT_SHM_CMA_BYTES=0" : "no rank may be read",
                (unsigned long long)s.shm_cma_bytes_received);
    if (!cma_off && want_cma && atoi(want_cma) && s.shm_bytes_received >= (1u << 20) &&
        !s.shm_cma_bytes_received)
        MP_FAIL("%llu bytes came through shared memory, none read from a peer's memory",
                (unsigned long long)s.shm_bytes_received);
    if (s.shm_cma_bytes_received > s.shm_bytes_received)
        MP_FAIL("%llu bytes read from peers' memory, of %llu received through shared memory",
                (unsigned long long)s.shm_cma_bytes_received,
                (unsigned long long)s.shm_bytes_received);
    if (local > 0 && local < N - 1 && s.shm_bytes_sent >= s.bytes_sent)
        MP_FAIL("peers on other hosts, but all %llu bytes went through shared memory",
                (unsigned long long)s.bytes_sent);
    MP_OK(coh_finalize(ctx));
    printf("rank %d: OK\n", R);
}

/* A dial to path as a stranger: hello (token tok, rank from) and a ring's fd. */
static int stranger_dial(const char *path, const char *tok, int from, bool garbage)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0)
        MP_FAIL("connect %s: %s", path, strerror(errno));
    uint8_t b[EN_HELLO_SIZE];
    if (garbage) {
        memset(b, 'x', sizeof(b));
    } else {
        en_hello_t h = {.version = EN_PROTO_VERSION,
                        .kind = EN_HELLO_DATA,
                        .rank = (uint32_t)from,
                        .world = (uint32_t)N,
                        .nrails = 1};
        en_hello_set_token(&h, tok);
        en_hello_encode(&h, b);
    }
    /* A ring that must never be used: poisoned indices. (A file, not a
     * memfd: TSan does not see memfd_create, and took the number for an
     * older descriptor of the reactor's.) */
    int mfd = open("/tmp", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    uint64_t tail = 12345; /* 12345 bytes of garbage "frames" */
    if (mfd < 0 || ftruncate(mfd, 256 + 65536) != 0 ||
        pwrite(mfd, &tail, sizeof(tail), 64) != (ssize_t)sizeof(tail))
        MP_FAIL("a ring file: %s", strerror(errno));
    struct iovec iov = {.iov_base = b, .iov_len = sizeof(b)};
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } cm;
    memset(&cm, 0, sizeof(cm));
    struct msghdr mh = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.buf, .msg_controllen = sizeof(cm.buf)};
    struct cmsghdr *ch = CMSG_FIRSTHDR(&mh);
    ch->cmsg_level = SOL_SOCKET;
    ch->cmsg_type = SCM_RIGHTS;
    ch->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(ch), &mfd, sizeof(int));
    if (sendmsg(fd, &mh, MSG_NOSIGNAL) != (ssize_t)sizeof(b))
        MP_FAIL("sendmsg: %s", strerror(errno));
    close(mfd);
    /* The listener hangs up: nothing comes back but the end. */
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    if (poll(&pf, 1, 5000) != 1) MP_FAIL("rank 1 did not hang up on a stranger");
    char x[EN_HELLO_SIZE];
    ssize_t n = recv(fd, x, sizeof(x), 0);
    if (n > 0) MP_FAIL("rank 1 answered a stranger (%zd bytes)", n);
    close(fd);
    return 0;
}

static void mode_stranger(void)
{
    coh_ctx_t *ctx = mp_init(&W, &R, &N);
    struct coh_ctx *c = ctx;
    if (N < 3) MP_FAIL("needs 3 ranks");
    if (!c->shm_peer[1 - (R == 1)]) MP_FAIL("shared memory is off between ranks 0 and 1");
    char path[256];
    MP_OK(en_shm_path(c->shm_dir, c->token_s, c->shm_names[1], 0, path, sizeof(path)));
    coh_stats_t s0;
    MP_OK(coh_ctx_stats(ctx, &s0));
    coh_request_t *q;
    MP_OK(coh_barrier(W, &q)); /* every rank has its s0 before rank 0 dials */
    MP_OK(coh_wait(q, -1));
    coh_request_free(q);
    if (R == 0) {
        /* The directory: ours alone. */
        char d[256];
        snprintf(d, sizeof(d), "%s", path);
        *strrchr(d, '/') = 0;
        struct stat st;
        if (stat(d, &st) != 0 || (st.st_mode & 0777) != 0700 || st.st_uid != geteuid())
            MP_FAIL("%s is not a private directory (mode %o)", d, st.st_mode & 0777);
        stranger_dial(path, "not the job's token", N - 1, false);
        stranger_dial(path, NULL, N - 1, true);
        /* The job's token, but rank 0 may not dial rank 1 (the higher rank
         * dials), and rank 2 is connected already. */
        stranger_dial(path, getenv("COHORT_TOKEN"), 0, false);
        stranger_dial(path, getenv("COHORT_TOKEN"), 2, false);
    }
    MP_OK(coh_barrier(W, &q));
    MP_OK(coh_wait(q, -1));
    coh_request_free(q);
    coh_stats_t s;
    for (int i = 0; i < 200; i++) {
        MP_OK(coh_ctx_stats(ctx, &s));
        if (R != 1 || s.connections_rejected - s0.connections_rejected >= 4) break;
        usleep(10000);
    }
    if (R == 1) MP_EQ_INT(s.connections_rejected - s0.connections_rejected, 4);
    check_sum(1 << 16); /* the job goes on, through the same rings */
    if (R == 1 && !s.shm_bytes_received) MP_FAIL("nothing came through shared memory");
    MP_OK(coh_finalize(ctx));
    printf("rank %d: OK\n", R);
}

/* Broadcasts of `bytes` (1 MiB unless given) from every root in turn,
 * nobody spinning (the knob is set by the test): the root only sends, and
 * its single-copy frames complete when the readers count them. The loop
 * thread sleeps in epoll meanwhile, and a small op is started by the
 * caller's thread: the loop thread must be woken to arm for those
 * completions, or each op waits for its 50 ms poll timeout. */
static void mode_wakeups(int ops, size_t bytes)
{
    coh_ctx_t *ctx = mp_init(&W, &R, &N);
    const size_t n = bytes / sizeof(float);
    float *b = malloc(n * sizeof(float));
    if (!b) MP_FAIL("out of memory");
    int slow = 0;
    double worst = 0;
    for (int op = 0; op < ops; op++) {
        int root = op % N;
        for (size_t i = 0; i < n; i++) b[i] = R == root ? (float)(op + (int)(i % 7)) : -1.0f;
        double t0 = mp_now_s();
        coh_request_t *q;
        MP_OK(coh_broadcast(W, b, n, COH_F32, root, &q));
        MP_EQ_INT(mp_wait(q), 0);
        double dt = mp_now_s() - t0;
        if (dt > worst) worst = dt;
        slow += dt > 0.020;
        for (size_t i = 0; i < n; i += 4099)
            if (b[i] != (float)(op + (int)(i % 7)))
                MP_FAIL("op %d: element %zu is %g", op, i, (double)b[i]);
    }
    free(b);
    coh_stats_t s;
    MP_OK(coh_ctx_stats(ctx, &s));
    printf("rank %d: %d broadcasts of %zu bytes, worst %.1f ms, %d over 20 ms; %llu bytes read "
           "from peers' memory\n",
           R, ops, bytes, worst * 1e3, slow, (unsigned long long)s.shm_cma_bytes_received);
    const char *tc = getenv("COHORT_TIMING_CHECKS");
    if (!(tc && !strcmp(tc, "0")) && slow > 3)
        MP_FAIL("%d of %d broadcasts took over 20 ms: a wake-up was lost", slow, ops);
    MP_OK(coh_finalize(ctx));
    printf("rank %d: OK\n", R);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: test_shm split H | wakeups OPS [BYTES] | stranger | dir\n");
        return 2;
    }
    if (!strcmp(argv[1], "split") && argc > 2) {
        mode_split(atoi(argv[2]));
    } else if (!strcmp(argv[1], "wakeups") && argc > 2) {
        mode_wakeups(atoi(argv[2]), argc > 3 ? (size_t)atoll(argv[3]) : (size_t)1 << 20);
    } else if (!strcmp(argv[1], "stranger")) {
        mode_stranger();
    } else if (!strcmp(argv[1], "dir")) {
        const char *d = getenv("COHORT_SHM_DIR");
        printf("shm dir: %s\n", d ? d : "(none)");
        coh_ctx_t *ctx = mp_init(&W, &R, &N);
        check_sum(1000);
        MP_OK(coh_finalize(ctx));
        printf("rank %d: OK\n", R);
    } else {
        fprintf(stderr, "unknown mode %s\n", argv[1]);
        return 2;
    }
    return 0;
}
