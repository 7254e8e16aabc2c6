/* Addresses: "host:port" and interface names to sockaddrs, and back. */
#include "reactor/rx_addr.h"

#include <netdb.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <sys/ioctl.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "base/base.h"

int rx_resolve_hostport(const char *s, struct sockaddr_storage *out)
{
    char host[256];
    const char *port;
    if (!s || !*s) return bs_fail(COH_EINVAL, "empty address");
    if (s[0] == '[') {
        const char *end = strchr(s, ']');
        if (!end || end[1] != ':' || (size_t)(end - s - 1) >= sizeof(host))
            return bs_fail(COH_EINVAL, "bad address \"%s\" (want [v6]:port)", s);
        memcpy(host, s + 1, (size_t)(end - s - 1));
        host[end - s - 1] = 0;
        port = end + 2;
    } else {
        const char *colon = strrchr(s, ':');
        if (!colon || (size_t)(colon - s) >= sizeof(host))
            return bs_fail(COH_EINVAL, "bad address \"%s\" (want host:port)", s);
        memcpy(host, s, (size_t)(colon - s));
        host[colon - s] = 0;
        port = colon + 1;
    }
    char *end;
    long p = strtol(port, &end, 10);
    if (*port == 0 || *end || p < 0 || p > 65535)
        return bs_fail(COH_EINVAL, "bad port in \"%s\"", s);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int e = getaddrinfo(host, port, &hints, &res);
    if (e || !res) return bs_fail(COH_EINVAL, "cannot resolve \"%s\": %s", host, gai_strerror(e));
    memset(out, 0, sizeof(*out));
    /* Prefer IPv4: the interfaces cohort binds are usually IPv4. */
    struct addrinfo *pick = res;
    for (struct addrinfo *a = res; a; a = a->ai_next)
        if (a->ai_family == AF_INET) {
            pick = a;
            break;
        }
    memcpy(out, pick->ai_addr, pick->ai_addrlen);
    freeaddrinfo(res);
    return 0;
}

int rx_resolve_nic(const char *s, struct sockaddr_storage *out)
{
    memset(out, 0, sizeof(*out));
    if (uv_ip4_addr(s, 0, (struct sockaddr_in *)out) == 0) return 0;
    if (uv_ip6_addr(s, 0, (struct sockaddr_in6 *)out) == 0) return 0;
    uv_interface_address_t *ifs;
    int n;
    if (uv_interface_addresses(&ifs, &n) != 0)
        return bs_fail(COH_ESYS, "cannot list network interfaces");
    int found = -1;
    for (int i = 0; i < n; i++) {
        if (strcmp(ifs[i].name, s) != 0) continue;
        if (ifs[i].address.address4.sin_family == AF_INET) {
            found = i;
            break;
        }
        if (found < 0) found = i;
    }
    if (found >= 0) {
        if (ifs[found].address.address4.sin_family == AF_INET)
            memcpy(out, &ifs[found].address.address4, sizeof(struct sockaddr_in));
        else
            memcpy(out, &ifs[found].address.address6, sizeof(struct sockaddr_in6));
        ((struct sockaddr_in *)out)->sin_port = 0;
    }
    uv_free_interface_addresses(ifs, n);
    if (found < 0) return bs_fail(COH_EINVAL, "no network interface or address named \"%s\"", s);
    return 0;
}

int rx_addr_ifname(const struct sockaddr_storage *a, char *out, size_t cap)
{
    uv_interface_address_t *ifs;
    int n, st = -1;
    if (uv_interface_addresses(&ifs, &n) != 0) return -1;
    for (int i = 0; i < n && st < 0; i++) {
        bool same = false;
        if (a->ss_family == AF_INET && ifs[i].address.address4.sin_family == AF_INET)
            same = ifs[i].address.address4.sin_addr.s_addr ==
                   ((const struct sockaddr_in *)a)->sin_addr.s_addr;
        else if (a->ss_family == AF_INET6 && ifs[i].address.address6.sin6_family == AF_INET6)
            same = !memcmp(&ifs[i].address.address6.sin6_addr,
                           &((const struct sockaddr_in6 *)a)->sin6_addr, 16);
        if (!same) continue;
        snprintf(out, cap, "%s", ifs[i].name);
        st = 0;
    }
    uv_free_interface_addresses(ifs, n);
    return st;
}

int rx_addr_mtu(const struct sockaddr_storage *a)
{
    char name[IF_NAMESIZE];
    int mtu = 1500;
    if (rx_addr_ifname(a, name, sizeof(name)) != 0) return mtu;
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct ifreq ifr;
    memset(&ifr, 0, sizeof(ifr));
    snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", name);
    if (fd >= 0 && ioctl(fd, SIOCGIFMTU, &ifr) == 0 && ifr.ifr_mtu > 0) mtu = ifr.ifr_mtu;
    if (fd >= 0) close(fd);
    return mtu;
}

void rx_format_addr(const struct sockaddr *sa, char *out, size_t cap)
{
    char ip[64] = "?";
    int port = 0;
    if (sa->sa_family == AF_INET) {
        uv_ip4_name((const struct sockaddr_in *)sa, ip, sizeof(ip));
        port = ntohs(((const struct sockaddr_in *)sa)->sin_port);
        snprintf(out, cap, "%s:%d", ip, port);
    } else if (sa->sa_family == AF_INET6) {
        uv_ip6_name((const struct sockaddr_in6 *)sa, ip, sizeof(ip));
        port = ntohs(((const struct sockaddr_in6 *)sa)->sin6_port);
        snprintf(out, cap, "[%s]:%d", ip, port);
    } else {
        snprintf(out, cap, "?");
    }
}
