/*
 * tcp-stream - TCP throughput over loopback right now: the B in
 * bench/peers/run.sh's ideal ring time 2(n-1)/n * S / B, and with -p N the
 * A_N of issue 15: what N streams at once carry together, so that a ring of
 * N ranks cannot exceed A_N / N busbw on this host.
 *
 *   tcp-stream [-t SECONDS] [-s WRITE_SIZE] [-p STREAMS] [--host ADDR] [-q]
 *
 * Each stream is one sender thread writing WRITE_SIZE buffers (default 4 MiB)
 * to one receiver thread for SECONDS (default 1.5) over one connection, one
 * direction, with the kernel's default socket buffers (what the benchmarks
 * get too). A receiver times from its first byte to end of stream, so
 * connection set-up is not counted. Prints decimal GB/s (1e9 bytes), the sum
 * of the streams' rates; -q prints only the number.
 *
 * With -r N instead: a ring of N nodes, each one thread with two
 * non-blocking sockets, writing to the next node while it reads from the
 * previous one (poll), as a rank of a TCP ring does: R_N, the sum of the
 * nodes' receive rates. -p N runs 2N threads that each block on one
 * direction; on some kernels a ring's N full-duplex loops carry more than
 * that, so R_N / N is the tighter ceiling of a ring's busbw. With -x N
 * (N even): N/2 pairs of nodes, each node writing to and reading from its
 * partner over one connection at once, as a step of halving-doubling does
 * (X_N): each direction's ACKs ride on the other's data.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* What one receiver read: the clock starts at its first read's return, so
 * that read's bytes are not counted; the rate is the bytes after t_first over
 * the time after it. */
typedef struct ts_meter {
    uint64_t bytes;
    bool started;
    double t_first, t_last;
} ts_meter_t;

typedef struct ts_recv {
    int listen_fd;
    size_t bufsize;
    ts_meter_t m;
    int err;
} ts_recv_t;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void meter_add(ts_meter_t *m, ssize_t n)
{
    double t = now_s();
    if (!m->started)
        m->t_first = t, m->started = true;
    else
        m->bytes += (uint64_t)n;
    m->t_last = t;
}

/* GB/s, or < 0 with too little data to time. */
static double meter_rate(const ts_meter_t *m)
{
    double dt = m->t_last - m->t_first;
    return dt > 0 ? (double)m->bytes / dt / 1e9 : -1;
}

static void *recv_main(void *arg)
{
    ts_recv_t *r = arg;
    int fd = accept(r->listen_fd, NULL, NULL);
    if (fd < 0) {
        r->err = errno;
        return NULL;
    }
    char *buf = malloc(r->bufsize);
    if (!buf) {
        r->err = ENOMEM;
        close(fd);
        return NULL;
    }
    for (;;) {
        ssize_t n = read(fd, buf, r->bufsize);
        if (n > 0) {
            meter_add(&r->m, n);
        } else if (n == 0) {
            break;
        } else if (errno != EINTR) {
            r->err = errno;
            break;
        }
    }
    free(buf);
    close(fd);
    return NULL;
}

#define TS_MAX 64

typedef struct ts_send {
    int fd;
    size_t bufsize;
    double end;
    int err;
} ts_send_t;

static void *send_main(void *arg)
{
    ts_send_t *w = arg;
    char *buf = malloc(w->bufsize);
    if (!buf) {
        w->err = ENOMEM;
        close(w->fd);
        return NULL;
    }
    memset(buf, 0x5a, w->bufsize); /* touch every page so faults are not timed */
    while (now_s() < w->end && !w->err) {
        size_t off = 0;
        while (off < w->bufsize) {
            ssize_t n = write(w->fd, buf + off, w->bufsize - off);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0) {
                w->err = errno;
                break;
            }
            off += (size_t)n;
        }
    }
    close(w->fd);
    free(buf);
    return NULL;
}

/* One node of the ring: writes to out (the next node) until end, reads from
 * in (the previous one) until it closes; counts what it read after its first
 * read, as recv_main does. */
typedef struct ts_node {
    int in, out;
    size_t bufsize;
    double end;
    ts_meter_t m;
    int err;
} ts_node_t;

static void *node_main(void *arg)
{
    ts_node_t *n = arg;
    char *wbuf = malloc(n->bufsize), *rbuf = malloc(n->bufsize);
    size_t woff = 0;
    bool writing = true;
    if (!wbuf || !rbuf) n->err = ENOMEM;
    if (wbuf) memset(wbuf, 0x5a, n->bufsize); /* faults are not timed */
    if (rbuf) memset(rbuf, 0, n->bufsize);
    fcntl(n->in, F_SETFL, fcntl(n->in, F_GETFL) | O_NONBLOCK);
    fcntl(n->out, F_SETFL, fcntl(n->out, F_GETFL) | O_NONBLOCK);
    while (!n->err) {
        if (writing && now_s() >= n->end) {
            shutdown(n->out, SHUT_WR); /* the next node reads to the end */
            writing = false;
        }
        struct pollfd p[2] = {{.fd = n->in, .events = POLLIN}, {.fd = n->out, .events = POLLOUT}};
        if (poll(p, writing ? 2 : 1, 100) < 0 && errno != EINTR) {
            n->err = errno;
            break;
        }
        if (p[0].revents) {
            ssize_t r = read(n->in, rbuf, n->bufsize);
            if (r > 0) {
                meter_add(&n->m, r);
            } else if (r == 0) {
                break; /* the previous node is done */
            } else if (errno != EAGAIN && errno != EINTR) {
                n->err = errno;
            }
        }
        if (writing && p[1].revents) {
            ssize_t w = write(n->out, wbuf + woff, n->bufsize - woff);
            if (w > 0)
                woff = (woff + (size_t)w) % n->bufsize;
            else if (w < 0 && errno != EAGAIN && errno != EINTR)
                n->err = errno;
        }
    }
    if (writing) shutdown(n->out, SHUT_WR);
    free(wbuf);
    free(rbuf);
    return NULL;
}

/* The ring of -r (pairs: the pairs of -x): returns GB/s summed over the
 * nodes, < 0 on failure. */
static double run_ring(const struct sockaddr_in *sa, int nodes, bool pairs, size_t wsize,
                       double seconds, uint64_t *total)
{
    ts_node_t nd[TS_MAX];
    pthread_t th[TS_MAX];
    int lfd[TS_MAX];
    struct sockaddr_in addr[TS_MAX];
    for (int i = 0; i < nodes; i++) {
        addr[i] = *sa;
        socklen_t alen = sizeof(addr[i]);
        lfd[i] = socket(AF_INET, SOCK_STREAM, 0);
        if (lfd[i] < 0 || bind(lfd[i], (struct sockaddr *)&addr[i], alen) < 0 ||
            listen(lfd[i], 1) < 0 || getsockname(lfd[i], (struct sockaddr *)&addr[i], &alen) < 0) {
            perror("tcp-stream: listen");
            return -1;
        }
    }
    double end = now_s() + seconds + 0.05 * nodes; /* set-up is not timed */
    for (int i = 0; i < nodes; i++) {   /* node i writes to node i + 1, or to its partner */
        if (pairs && (i & 1)) continue; /* the even node of a pair dials */
        int next = pairs ? i ^ 1 : (i + 1) % nodes, one = 1;
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0 || connect(fd, (struct sockaddr *)&addr[next], sizeof(addr[next])) < 0) {
            perror("tcp-stream: connect");
            return -1;
        }
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        nd[i] = (ts_node_t){.out = fd, .bufsize = wsize, .end = end};
    }
    for (int i = 0; i < nodes; i++) {
        if (pairs && !(i & 1)) { /* one connection both ways */
            close(lfd[i]);
            nd[i].in = nd[i].out;
            continue;
        }
        int fd = accept(lfd[i], NULL, NULL); /* from node i - 1 (backlog: done) */
        close(lfd[i]);
        if (fd < 0) {
            perror("tcp-stream: accept");
            return -1;
        }
        if (pairs) {
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
            nd[i] = (ts_node_t){.in = fd, .out = fd, .bufsize = wsize, .end = end};
        } else {
            nd[i].in = fd;
        }
    }
    for (int i = 0; i < nodes; i++)
        if (pthread_create(&th[i], NULL, node_main, &nd[i]) != 0) {
            fprintf(stderr, "tcp-stream: pthread_create failed\n");
            return -1;
        }
    double gbps = 0;
    int bad = 0;
    for (int i = 0; i < nodes; i++) {
        pthread_join(th[i], NULL);
        close(nd[i].in);
        if (nd[i].out != nd[i].in) close(nd[i].out);
        double rate = meter_rate(&nd[i].m);
        if (nd[i].err || rate < 0) {
            fprintf(stderr, "tcp-stream: node %d: %s\n", i,
                    nd[i].err ? strerror(nd[i].err) : "too little data to time");
            bad = 1;
            continue;
        }
        gbps += rate;
        *total += nd[i].m.bytes;
    }
    return bad ? -1 : gbps;
}

static size_t parse_size(const char *s)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    switch (*end) {
    case 'k':
    case 'K':
        v <<= 10;
        end++;
        break;
    case 'm':
    case 'M':
        v <<= 20;
        end++;
        break;
    default: break;
    }
    return *end ? 0 : (size_t)v;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tcp-stream [-t SECONDS] [-s WRITE_SIZE] [-p STREAMS | -r NODES | -x NODES]\n"
            "                  [--host ADDR] [-q]\n"
            "  TCP throughput of STREAMS (1) streams at once, each from one thread to another,\n"
            "  summed, in GB/s (1e9 B/s); -r: a ring of NODES threads, each writing to the next\n"
            "  and reading from the previous at once; -x: NODES/2 pairs, each node writing to\n"
            "  and reading from its partner over one connection\n");
}

int main(int argc, char **argv)
{
    double seconds = 1.5;
    size_t wsize = 4u << 20;
    const char *host = "127.0.0.1";
    bool quiet = false;
    int streams = 1, ring = 0;
    bool pairs = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-q")) {
            quiet = true;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (v && !strcmp(a, "-t")) {
            seconds = atof(v), i++;
        } else if (v && !strcmp(a, "-p")) {
            streams = atoi(v), i++;
        } else if (v && (!strcmp(a, "-r") || !strcmp(a, "-x"))) {
            pairs = !strcmp(a, "-x");
            ring = atoi(v), i++;
        } else if (v && !strcmp(a, "-s")) {
            wsize = parse_size(v), i++;
        } else if (v && !strcmp(a, "--host")) {
            host = v, i++;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (seconds <= 0 || wsize == 0 || streams < 1 || streams > TS_MAX || ring < 0 || ring == 1 ||
        ring > TS_MAX || (pairs && ring % 2)) {
        usage(stderr);
        return 2;
    }

    struct sockaddr_in sa = {.sin_family = AF_INET};
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
        fprintf(stderr, "tcp-stream: bad IPv4 address %s\n", host);
        return 2;
    }
    if (ring) {
        uint64_t total = 0;
        double g = run_ring(&sa, ring, pairs, wsize, seconds, &total);
        if (g < 0) return 1;
        if (quiet)
            printf("%.4f\n", g);
        else
            printf(
                "tcp-stream: %s %s of %d nodes %.3f GB/s together (%llu bytes, %zu-byte writes)\n",
                host, pairs ? "pairs" : "ring", ring, g, (unsigned long long)total, wsize);
        return 0;
    }
    ts_recv_t r[TS_MAX];
    ts_send_t w[TS_MAX];
    pthread_t rt[TS_MAX], wt[TS_MAX];
    double end = now_s() + seconds + 0.05 * streams; /* set-up is not timed */
    for (int i = 0; i < streams; i++) {
        struct sockaddr_in a = sa;
        socklen_t alen = sizeof(a);
        int lfd = socket(AF_INET, SOCK_STREAM, 0);
        if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, alen) < 0 || listen(lfd, 1) < 0 ||
            getsockname(lfd, (struct sockaddr *)&a, &alen) < 0) {
            perror("tcp-stream: listen");
            return 1;
        }
        r[i] = (ts_recv_t){.listen_fd = lfd, .bufsize = wsize};
        if (pthread_create(&rt[i], NULL, recv_main, &r[i]) != 0) {
            fprintf(stderr, "tcp-stream: pthread_create failed\n");
            return 1;
        }
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0 || connect(fd, (struct sockaddr *)&a, alen) < 0) {
            perror("tcp-stream: connect");
            return 1;
        }
        /* Every benchmark's transport sets TCP_NODELAY; with full-size writes it
           changes nothing here, but the stream should be configured like theirs. */
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        w[i] = (ts_send_t){.fd = fd, .bufsize = wsize, .end = end};
    }
    for (int i = 0; i < streams; i++)
        if (pthread_create(&wt[i], NULL, send_main, &w[i]) != 0) {
            fprintf(stderr, "tcp-stream: pthread_create failed\n");
            return 1;
        }
    double gbps = 0;
    uint64_t bytes = 0;
    int rc = 0;
    for (int i = 0; i < streams; i++) {
        pthread_join(wt[i], NULL);
        pthread_join(rt[i], NULL);
        close(r[i].listen_fd);
        if (w[i].err || r[i].err) {
            fprintf(stderr, "tcp-stream: stream %d: %s\n", i,
                    strerror(w[i].err ? w[i].err : r[i].err));
            rc = 1;
            continue;
        }
        double rate = meter_rate(&r[i].m);
        if (rate < 0) {
            fprintf(stderr, "tcp-stream: too little data to time\n");
            rc = 1;
            continue;
        }
        gbps += rate;
        bytes += r[i].m.bytes;
    }
    if (rc) return rc;
    if (quiet)
        printf("%.4f\n", gbps);
    else
        printf("tcp-stream: %s %d stream(s) %.3f GB/s together (%llu bytes, %zu-byte writes)\n",
               host, streams, gbps, (unsigned long long)bytes, wsize);
    return 0;
}
