/*
 * en_ibv.h - the verbs calls the verbs engine (en_verbs.c) makes, behind a
 * table, so that the same engine runs on two providers
 * (COHORT_VERBS_PROVIDER):
 *   - rdma-core: libibverbs and an RDMA NIC (InfiniBand, RoCE, iWARP);
 *   - soft: en_softrdma.c, reliable connections in user space over TCP
 *     between the hosts' interfaces, as the kernel's rxe and siw are over
 *     Ethernet. It lets the engine run on machines without an RDMA device
 *     (these: no device, and no rxe or siw module), and through the
 *     namespace cluster's shaped and lossy links.
 * Every object is libibverbs' own struct, so the engine's code does not
 * change with the provider; only the calls go through the table.
 */
#ifndef COH_EN_IBV_H
#define COH_EN_IBV_H

#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>

typedef struct en_ibv {
    const char *name;
    /* The device behind a network interface, its name into out; <0 (a
     * COH_ status) when there is none. */
    int (*dev_of_netdev)(const char *ifname, char *out, size_t cap);
    /* The reverse: the network interface of a device's port (a rail named
     * by its device, COHORT_NICS=mlx5_0:verbs), its name into out; <0 when
     * the device or its interface is not there. */
    int (*netdev_of_dev)(const char *dev, int port, char *out, size_t cap);
    /* Open the device called name; NULL (errno set) when there is none. */
    struct ibv_context *(*open_device)(const char *name);
    int (*close_device)(struct ibv_context *ctx);
    int (*query_device)(struct ibv_context *ctx, struct ibv_device_attr *attr);
    int (*query_port)(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr);
    int (*query_gid)(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid);
    /* One GID table entry with its type (RoCE v1 or v2, IB); nonzero when
     * the entry is empty or there is none. */
    int (*query_gid_ex)(struct ibv_context *ctx, uint32_t port, uint32_t index,
                        struct ibv_gid_entry *e);
    struct ibv_pd *(*alloc_pd)(struct ibv_context *ctx);
    int (*dealloc_pd)(struct ibv_pd *pd);
    struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t len, int access);
    int (*dereg_mr)(struct ibv_mr *mr);
    struct ibv_comp_channel *(*create_comp_channel)(struct ibv_context *ctx);
    int (*destroy_comp_channel)(struct ibv_comp_channel *ch);
    struct ibv_cq *(*create_cq)(struct ibv_context *ctx, int cqe, void *cq_ctx,
                                struct ibv_comp_channel *ch, int vector);
    int (*destroy_cq)(struct ibv_cq *cq);
    int (*req_notify_cq)(struct ibv_cq *cq, int solicited_only);
    int (*get_cq_event)(struct ibv_comp_channel *ch, struct ibv_cq **cq, void **cq_ctx);
    void (*ack_cq_events)(struct ibv_cq *cq, unsigned int n);
    int (*poll_cq)(struct ibv_cq *cq, int n, struct ibv_wc *wc);
    /* The device's asynchronous events (ctx->async_fd: port up or down, a
     * QP or the device fatal); each one got is acked. */
    int (*get_async_event)(struct ibv_context *ctx, struct ibv_async_event *ev);
    void (*ack_async_event)(struct ibv_async_event *ev);
    struct ibv_qp *(*create_qp)(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
    int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask);
    int (*destroy_qp)(struct ibv_qp *qp);
    int (*post_send)(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
    int (*post_recv)(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
} en_ibv_t;

extern const en_ibv_t en_ibv_rdma_core; /* en_verbs.c */
extern const en_ibv_t en_ibv_soft;      /* en_softrdma.c */

/* The provider called name ("rdma-core", "soft"), or NULL. */
const en_ibv_t *en_ibv_find(const char *name);

/* The GID index a port's QPs should use when none is configured
 * (COHORT_VERBS_GID_INDEX=-1): 0 on InfiniBand; on Ethernet (RoCE) the
 * entry that routes: RoCE v2 before v1, then a routable address before a
 * link-local one (fe80::/10 does not cross subnets), one of the rail
 * address's family before another (IPv4-mapped for an IPv4 rail or none,
 * other IPv6 for an IPv6 one), the interface's own address (addr; NULL:
 * any) before another; the lowest index among equals; 0 when the table
 * says nothing. */
int en_ibv_pick_gid(const en_ibv_t *ib, struct ibv_context *ctx, int port,
                    const struct ibv_port_attr *pa, const struct sockaddr *addr);

/* A GID that holds an IPv4 address: ::ffff:a.b.c.d, as RoCE v2's do. */
static inline bool en_gid_is_v4mapped(const uint8_t raw[16])
{
    static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return memcmp(raw, mapped, sizeof(mapped)) == 0;
}

/* The soft provider's device for an interface is "soft_IFNAME". Its GID
 * table holds the interface's addresses as RoCE v2 entries (IPv4-mapped
 * first, then IPv6), and its LID is the TCP port its NIC thread listens on. Test hooks, for the
 * provider's own tests only: */
typedef struct en_soft_stats {
    uint64_t requests_in, rnr_waits, retry_timeouts, access_errors;
} en_soft_stats_t;
void en_soft_stats(struct ibv_context *ctx, en_soft_stats_t *out);

#endif
