/*
 * The rdma-core provider of the verbs engine (en_ibv.h): libibverbs' calls
 * as they are, and the lookup of providers by name.
 */
#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cohort.h"
#include "engines/en_ibv.h"

/* The device behind an interface (/sys/class/net/IF/device/infiniband). */
static int rc_dev_of_netdev(const char *ifname, char *out, size_t cap)
{
    char path[256];
    snprintf(path, sizeof(path), "/sys/class/net/%s/device/infiniband", ifname);
    struct ibv_device **list = ibv_get_device_list(NULL);
    if (!list) return COH_EUNSUPPORTED;
    int st = COH_EUNSUPPORTED;
    for (int i = 0; list[i] && st; i++) {
        char p[320];
        snprintf(p, sizeof(p), "%s/%s", path, ibv_get_device_name(list[i]));
        if (access(p, F_OK) == 0) {
            snprintf(out, cap, "%s", ibv_get_device_name(list[i]));
            st = 0;
        }
    }
    ibv_free_device_list(list);
    return st;
}

/* RoCE: the interface of the port's first GID (its gid_attrs); else (an
 * IPoIB or iWARP device) the first interface of the device's PCI function. */
static int rc_netdev_of_dev(const char *dev, int port, char *out, size_t cap)
{
    char path[320];
    if (!dev || !*dev || strchr(dev, '/') || dev[0] == '.') return COH_EINVAL;
    snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/%d/gid_attrs/ndevs/0", dev, port);
    FILE *f = fopen(path, "r");
    if (f) {
        char name[64] = {0};
        bool ok = fgets(name, sizeof(name), f) != NULL;
        fclose(f);
        name[strcspn(name, "\n")] = 0;
        if (ok && name[0]) {
            snprintf(out, cap, "%s", name);
            return 0;
        }
    }
    snprintf(path, sizeof(path), "/sys/class/infiniband/%s/device/net", dev);
    DIR *d = opendir(path);
    if (!d) return COH_EUNSUPPORTED;
    char best[64] = {0};
    for (struct dirent *e; (e = readdir(d));)
        if (e->d_name[0] != '.' && (!best[0] || strcmp(e->d_name, best) < 0))
            snprintf(best, sizeof(best), "%s", e->d_name);
    closedir(d);
    if (!best[0]) return COH_EUNSUPPORTED;
    snprintf(out, cap, "%s", best);
    return 0;
}

static struct ibv_context *rc_open_device(const char *name)
{
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    struct ibv_context *ctx = NULL;
    for (int i = 0; list && i < n && !ctx; i++)
        if (!strcmp(ibv_get_device_name(list[i]), name)) ctx = ibv_open_device(list[i]);
    if (list) ibv_free_device_list(list);
    if (!ctx && errno == 0) errno = ENODEV;
    return ctx;
}

static int rc_query_gid_ex(struct ibv_context *ctx, uint32_t port, uint32_t index,
                           struct ibv_gid_entry *e)
{
    return ibv_query_gid_ex(ctx, port, index, e, 0);
}

int en_ibv_pick_gid(const en_ibv_t *ib, struct ibv_context *ctx, int port,
                    const struct ibv_port_attr *pa, const struct sockaddr *addr)
{
    if (pa->link_layer != IBV_LINK_LAYER_ETHERNET) return 0;
    static const uint8_t zero[16];
    /* The interface's address as a GID would hold it (IPv4: mapped). */
    uint8_t want[16] = {0};
    bool have = false, want_v4 = true;
    if (addr && addr->sa_family == AF_INET) {
        want[10] = want[11] = 0xff;
        memcpy(want + 12, &((const struct sockaddr_in *)(const void *)addr)->sin_addr, 4);
        have = memcmp(want + 12, zero, 4) != 0;
    } else if (addr && addr->sa_family == AF_INET6) {
        memcpy(want, &((const struct sockaddr_in6 *)(const void *)addr)->sin6_addr, 16);
        have = memcmp(want, zero, 16) != 0;
        want_v4 = en_gid_is_v4mapped(want);
    }
    int best = 0, best_score = -1;
    for (int i = 0; i < pa->gid_tbl_len; i++) {
        struct ibv_gid_entry e;
        memset(&e, 0, sizeof(e));
        if (ib->query_gid_ex(ctx, (uint32_t)port, (uint32_t)i, &e) != 0) continue;
        if (!memcmp(e.gid.raw, zero, 16)) continue;
        bool v4 = en_gid_is_v4mapped(e.gid.raw);
        bool link_local = e.gid.raw[0] == 0xfe && (e.gid.raw[1] & 0xc0) == 0x80;
        /* The rail's family: an IPv6 rail (its fabric may route IPv6
         * only) took an IPv4-mapped entry before its own address. */
        int score = (e.gid_type == IBV_GID_TYPE_ROCE_V2 ? 8 : 0) + (link_local ? 0 : 4) +
                    (v4 == want_v4 ? 2 : 0) + (have && !memcmp(e.gid.raw, want, 16) ? 1 : 0);
        if (score > best_score) {
            best = i;
            best_score = score;
        }
    }
    return best;
}

/* libibverbs' inline calls, as functions for the table. */
static int rc_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
    return ibv_req_notify_cq(cq, solicited_only);
}

static int rc_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
    return ibv_poll_cq(cq, n, wc);
}

static int rc_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
    return ibv_post_send(qp, wr, bad);
}

static int rc_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
    return ibv_post_recv(qp, wr, bad);
}

static struct ibv_mr *rc_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access)
{
    return ibv_reg_mr(pd, addr, len, access); /* a macro in newer headers */
}

static int rc_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr)
{
    return ibv_query_port(ctx, port, attr); /* a macro too */
}

const en_ibv_t en_ibv_rdma_core = {
    .name = "rdma-core",
    .dev_of_netdev = rc_dev_of_netdev,
    .netdev_of_dev = rc_netdev_of_dev,
    .open_device = rc_open_device,
    .close_device = ibv_close_device,
    .query_device = ibv_query_device,
    .query_port = rc_query_port,
    .query_gid = ibv_query_gid,
    .query_gid_ex = rc_query_gid_ex,
    .alloc_pd = ibv_alloc_pd,
    .dealloc_pd = ibv_dealloc_pd,
    .reg_mr = rc_reg_mr,
    .dereg_mr = ibv_dereg_mr,
    .create_comp_channel = ibv_create_comp_channel,
    .destroy_comp_channel = ibv_destroy_comp_channel,
    .create_cq = ibv_create_cq,
    .destroy_cq = ibv_destroy_cq,
    .req_notify_cq = rc_req_notify_cq,
    .get_cq_event = ibv_get_cq_event,
    .ack_cq_events = ibv_ack_cq_events,
    .poll_cq = rc_poll_cq,
    .get_async_event = ibv_get_async_event,
    .ack_async_event = ibv_ack_async_event,
    .create_qp = ibv_create_qp,
    .modify_qp = ibv_modify_qp,
    .destroy_qp = ibv_destroy_qp,
    .post_send = rc_post_send,
    .post_recv = rc_post_recv,
};

const en_ibv_t *en_ibv_find(const char *name)
{
    if (!name || !*name || !strcmp(name, en_ibv_rdma_core.name)) return &en_ibv_rdma_core;
    if (!strcmp(name, en_ibv_soft.name)) return &en_ibv_soft;
    return NULL;
}
