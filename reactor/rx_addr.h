/* rx_addr.h - addresses: resolution of "host:port" and of interface
 * names, and formatting. */
#ifndef COH_RX_ADDR_H
#define COH_RX_ADDR_H

#include <stddef.h>
#include <sys/socket.h>

/* "host:port", "[v6]:port"; the host may be a name (resolved, blocking). */
int rx_resolve_hostport(const char *s, struct sockaddr_storage *out);
/* An interface name or an address (port 0). */
int rx_resolve_nic(const char *s, struct sockaddr_storage *out);
/* "a.b.c.d:port" / "[v6]:port" */
void rx_format_addr(const struct sockaddr *sa, char *out, size_t cap);
/* The name of the interface that holds address a (its port ignored); -1
 * when none does. */
int rx_addr_ifname(const struct sockaddr_storage *a, char *out, size_t cap);
/* The MTU of the interface that holds address a (its port ignored); 1500
 * when it cannot be told. */
int rx_addr_mtu(const struct sockaddr_storage *a);

#endif
