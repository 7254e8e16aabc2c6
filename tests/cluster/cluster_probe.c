/*
 * cluster-probe - one end of a TCP throughput measurement, for checking the
 * shaped links of tests/cluster (run each end in its own namespace with
 * `ip netns exec`, or in the root namespace).
 *
 *   cluster-probe recv --bind ADDR [--port-file F] [--warmup S] [--timeout S]
 *   cluster-probe send --to ADDR:PORT [-t SECONDS] [-s WRITE_SIZE]
 *   cluster-probe recv --udp --bind ADDR [--port-file F] [--timeout S]
 *   cluster-probe send --udp --to ADDR:PORT [--count N] [-s SIZE] [--gap-us G]
 *
 * recv listens on ADDR (port 0: the kernel picks one; it is written to F, or to
 * stdout, as soon as the socket listens), accepts one connection, reads until
 * the sender closes and prints
 *
 *   mbit=<Mbit/s> bytes=<n> secs=<s>
 *
 * where the rate counts only what arrived after the first WARMUP seconds
 * (default 0.3): that leaves out TCP slow start and the token bucket's initial
 * burst, which would otherwise overstate a short measurement of a shaped link.
 * Mbit is 1e6 bits, the unit of `tc ... rate Nmbit`. send connects, writes
 * WRITE_SIZE buffers (default 256 KiB) for SECONDS (default 2) and closes.
 *
 * With --udp (checking `cluster.sh up --loss`): send writes COUNT datagrams
 * (default 5000) of SIZE bytes (default 1000), one every G microseconds
 * (default 200, i.e. 42 Mbit/s of 1042-byte frames: pace below the link's
 * rate, so that tbf itself drops none),
 * and prints sent=<n>; recv counts datagrams until 0.3 s pass without one and
 * prints received=<n>.
 * Exit status 0 on success, 1 on any error (printed to stderr).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int fail(const char *what)
{
    fprintf(stderr, "cluster-probe: %s: %s\n", what, strerror(errno));
    return 1;
}

static int usage(void)
{
    fprintf(stderr, "usage: cluster-probe recv [--udp] --bind ADDR [--port-file F] [--warmup S] "
                    "[--timeout S]\n"
                    "       cluster-probe send --to ADDR:PORT [-t SECONDS] [-s WRITE_SIZE]\n"
                    "       cluster-probe send --udp --to ADDR:PORT [--count N] [-s SIZE] "
                    "[--gap-us G]\n");
    return 2;
}

static int parse_addr(const char *s, int port, struct sockaddr_in *sa)
{
    memset(sa, 0, sizeof(*sa));
    sa->sin_family = AF_INET;
    sa->sin_port = htons((uint16_t)port);
    return inet_pton(AF_INET, s, &sa->sin_addr) == 1 ? 0 : -1;
}

static int write_port(const char *port_file, int port)
{
    if (!port_file) {
        printf("port=%d\n", port);
        fflush(stdout);
        return 0;
    }
    /* Written under a temporary name and renamed: a reader never sees half a port. */
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp", port_file);
    FILE *f = fopen(tmp, "w");
    if (!f || fprintf(f, "%d\n", port) < 0 || fclose(f) != 0 || rename(tmp, port_file) != 0)
        return fail(port_file);
    return 0;
}

static int parse_to(const char *to, struct sockaddr_in *sa)
{
    char host[64];
    const char *colon = strrchr(to, ':');
    if (!colon || (size_t)(colon - to) >= sizeof(host)) {
        fprintf(stderr, "cluster-probe: --to %s is not IPv4ADDR:PORT\n", to);
        return -1;
    }
    memcpy(host, to, (size_t)(colon - to));
    host[colon - to] = 0;
    if (parse_addr(host, atoi(colon + 1), sa) != 0) {
        fprintf(stderr, "cluster-probe: --to %s is not IPv4ADDR:PORT\n", to);
        return -1;
    }
    return 0;
}

static int do_recv(const char *bind_addr, const char *port_file, double warmup, double timeout)
{
    struct sockaddr_in sa;
    if (parse_addr(bind_addr, 0, &sa) != 0) {
        fprintf(stderr, "cluster-probe: --bind %s is not an IPv4 address\n", bind_addr);
        return 2;
    }
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    socklen_t sl = sizeof(sa);
    if (lfd < 0) return fail("socket");
    if (bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) != 0) return fail("bind");
    if (listen(lfd, 1) != 0 || getsockname(lfd, (struct sockaddr *)&sa, &sl) != 0)
        return fail("listen");
    if (write_port(port_file, ntohs(sa.sin_port)) != 0) return 1;
    struct pollfd pfd = {.fd = lfd, .events = POLLIN};
    int pr = poll(&pfd, 1, (int)(timeout * 1000));
    if (pr == 0) {
        fprintf(stderr, "cluster-probe: no sender connected within %.0f s\n", timeout);
        return 1;
    }
    int fd = pr > 0 ? accept(lfd, NULL, NULL) : -1;
    if (fd < 0) return fail("accept");
    close(lfd);
    struct timeval tv = {.tv_sec = (time_t)timeout};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));

    static char buf[1 << 20];
    uint64_t total = 0, counted = 0;
    double t_first = 0, t_mark = 0, t_last = 0;
    for (;;) {
        ssize_t n = read(fd, buf, sizeof(buf));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return fail("read");
        if (n == 0) break;
        double t = now_s();
        if (total == 0) t_first = t;
        total += (uint64_t)n;
        if (t - t_first < warmup) continue;
        if (t_mark == 0) {
            t_mark = t; /* the rate window opens at the end of this read */
        } else {
            counted += (uint64_t)n;
        }
        t_last = t;
    }
    close(fd);
    if (t_last <= t_mark || counted == 0) {
        fprintf(stderr, "cluster-probe: stream too short to measure (%llu bytes in %.3f s)\n",
                (unsigned long long)total, t_last - t_first);
        return 1;
    }
    double secs = t_last - t_mark;
    printf("mbit=%.1f bytes=%llu secs=%.3f\n", (double)counted * 8 / secs / 1e6,
           (unsigned long long)total, secs);
    return 0;
}

static int do_recv_udp(const char *bind_addr, const char *port_file, double timeout)
{
    struct sockaddr_in sa;
    if (parse_addr(bind_addr, 0, &sa) != 0) {
        fprintf(stderr, "cluster-probe: --bind %s is not an IPv4 address\n", bind_addr);
        return 2;
    }
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    socklen_t sl = sizeof(sa);
    int rcvbuf = 4 << 20;
    if (fd < 0) return fail("socket");
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) return fail("bind");
    if (getsockname(fd, (struct sockaddr *)&sa, &sl) != 0) return fail("getsockname");
    if (write_port(port_file, ntohs(sa.sin_port)) != 0) return 1;
    static char buf[65536];
    uint64_t got = 0;
    for (;;) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int pr = poll(&pfd, 1, got ? 300 : (int)(timeout * 1000));
        if (pr < 0 && errno == EINTR) continue;
        if (pr < 0) return fail("poll");
        if (pr == 0) break;
        if (recv(fd, buf, sizeof(buf), 0) >= 0) got++;
    }
    close(fd);
    printf("received=%llu\n", (unsigned long long)got);
    return 0;
}

static int do_send_udp(const char *to, long count, size_t size, long gap_us)
{
    struct sockaddr_in sa;
    if (parse_to(to, &sa) != 0) return 2;
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    if (fd < 0) return fail("socket");
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) return fail("connect");
    char *buf = calloc(1, size);
    if (!buf) return fail("calloc");
    double t0 = now_s();
    long sent = 0;
    for (long i = 0; i < count; i++) {
        /* Paced against the clock, not by sleeping per datagram: no drift. */
        double due = t0 + (double)i * (double)gap_us * 1e-6, t;
        while ((t = now_s()) < due) {
            struct timespec ts = {0, (long)((due - t) * 1e9)};
            nanosleep(&ts, NULL);
        }
        memcpy(buf, &i, sizeof(i) < size ? sizeof(i) : size);
        if (send(fd, buf, size, 0) == (ssize_t)size) sent++;
    }
    free(buf);
    close(fd);
    printf("sent=%ld\n", sent);
    return 0;
}

static int do_send(const char *to, double seconds, size_t wsize)
{
    struct sockaddr_in sa;
    if (parse_to(to, &sa) != 0) return 2;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return fail("socket");
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) return fail("connect");
    char *buf = calloc(1, wsize);
    if (!buf) return fail("calloc");
    double t_end = now_s() + seconds;
    uint64_t sent = 0;
    while (now_s() < t_end) {
        ssize_t n = write(fd, buf, wsize);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return fail("write");
        sent += (uint64_t)n;
    }
    free(buf);
    if (close(fd) != 0) return fail("close");
    fprintf(stderr, "cluster-probe: sent %llu bytes\n", (unsigned long long)sent);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) return usage();
    const char *mode = argv[1], *bind_addr = NULL, *port_file = NULL, *to = NULL;
    double warmup = 0.3, timeout = 30, seconds = 2;
    size_t wsize = 0;
    long count = 5000, gap_us = 200;
    bool udp = false;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--udp")) {
            udp = true;
            continue;
        }
        if (!v) return usage();
        if (!strcmp(a, "--bind"))
            bind_addr = v;
        else if (!strcmp(a, "--port-file"))
            port_file = v;
        else if (!strcmp(a, "--warmup"))
            warmup = atof(v);
        else if (!strcmp(a, "--timeout"))
            timeout = atof(v);
        else if (!strcmp(a, "--to"))
            to = v;
        else if (!strcmp(a, "-t"))
            seconds = atof(v);
        else if (!strcmp(a, "-s"))
            wsize = (size_t)strtoull(v, NULL, 10);
        else if (!strcmp(a, "--count"))
            count = atol(v);
        else if (!strcmp(a, "--gap-us"))
            gap_us = atol(v);
        else
            return usage();
        i++;
    }
    if (!strcmp(mode, "recv") && bind_addr)
        return udp ? do_recv_udp(bind_addr, port_file, timeout)
                   : do_recv(bind_addr, port_file, warmup, timeout);
    if (!strcmp(mode, "send") && to && udp && count > 0 && gap_us >= 0 && wsize <= 65507)
        return do_send_udp(to, count, wsize ? wsize : 1000, gap_us);
    if (!strcmp(mode, "send") && to && !udp && seconds > 0)
        return do_send(to, seconds, wsize ? wsize : 256 * 1024);
    return usage();
}
