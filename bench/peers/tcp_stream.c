/*
 * tcp-stream - single-stream TCP throughput over loopback right now: the B in
 * bench/peers/run.sh's ideal ring time 2(n-1)/n * S / B.
 *
 *   tcp-stream [-t SECONDS] [-s WRITE_SIZE] [--host ADDR] [-q]
 *
 * One sender thread writes WRITE_SIZE buffers (default 4 MiB) to one receiver
 * thread for SECONDS (default 1.5) over one connection, one direction, with the
 * kernel's default socket buffers (what the benchmarks get too). The receiver
 * times from its first byte to end of stream, so connection set-up is not
 * counted. Prints decimal GB/s (1e9 bytes), the unit of algbw/busbw; -q prints
 * only the number.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

typedef struct ts_recv {
    int listen_fd;
    size_t bufsize;
    uint64_t bytes;
    bool started;
    double t_first, t_last;
    int err;
} ts_recv_t;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
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
            /* The clock starts at the first read's return, so its bytes are not
               counted: the rate is bytes after t_first over the time after it. */
            double t = now_s();
            if (!r->started)
                r->t_first = t, r->started = true;
            else
                r->bytes += (uint64_t)n;
            r->t_last = t;
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
    fprintf(f, "usage: tcp-stream [-t SECONDS] [-s WRITE_SIZE] [--host ADDR] [-q]\n"
               "  single-stream TCP throughput from one thread to another, in GB/s (1e9 B/s)\n");
}

int main(int argc, char **argv)
{
    double seconds = 1.5;
    size_t wsize = 4u << 20;
    const char *host = "127.0.0.1";
    bool quiet = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-q")) {
            quiet = true;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (v && !strcmp(a, "-t")) {
            seconds = atof(v), i++;
        } else if (v && !strcmp(a, "-s")) {
            wsize = parse_size(v), i++;
        } else if (v && !strcmp(a, "--host")) {
            host = v, i++;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (seconds <= 0 || wsize == 0) {
        usage(stderr);
        return 2;
    }

    struct sockaddr_in sa = {.sin_family = AF_INET};
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
        fprintf(stderr, "tcp-stream: bad IPv4 address %s\n", host);
        return 2;
    }
    socklen_t salen = sizeof(sa);
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, salen) < 0 || listen(lfd, 1) < 0 ||
        getsockname(lfd, (struct sockaddr *)&sa, &salen) < 0) {
        perror("tcp-stream: listen");
        return 1;
    }

    ts_recv_t r = {.listen_fd = lfd, .bufsize = wsize};
    pthread_t th;
    if (pthread_create(&th, NULL, recv_main, &r) != 0) {
        fprintf(stderr, "tcp-stream: pthread_create failed\n");
        return 1;
    }
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, salen) < 0) {
        perror("tcp-stream: connect");
        return 1;
    }
    /* Every benchmark's transport sets TCP_NODELAY; with full-size writes it changes
       nothing here, but the stream should be configured like theirs. */
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));

    char *buf = malloc(wsize);
    if (!buf) {
        fprintf(stderr, "tcp-stream: out of memory\n");
        return 1;
    }
    memset(buf, 0x5a, wsize); /* touch every page so faults are not timed */
    double end = now_s() + seconds;
    int rc = 0;
    while (now_s() < end) {
        size_t off = 0;
        while (off < wsize) {
            ssize_t n = write(fd, buf + off, wsize - off);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0) {
                perror("tcp-stream: write");
                rc = 1;
                goto done;
            }
            off += (size_t)n;
        }
    }
done:
    close(fd);
    pthread_join(th, NULL);
    close(lfd);
    free(buf);
    if (rc) return rc;
    if (r.err) {
        fprintf(stderr, "tcp-stream: receive: %s\n", strerror(r.err));
        return 1;
    }
    double dt = r.t_last - r.t_first;
    if (dt <= 0) {
        fprintf(stderr, "tcp-stream: too little data to time\n");
        return 1;
    }
    double gbps = (double)r.bytes / dt / 1e9;
    if (quiet)
        printf("%.4f\n", gbps);
    else
        printf("tcp-stream: %s single stream %.3f GB/s (%llu bytes in %.3f s, %zu-byte writes)\n",
               host, gbps, (unsigned long long)r.bytes, dt, wsize);
    return 0;
}
