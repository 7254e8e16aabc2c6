/*
 * verbs_probe: the interface of the first RDMA device with an active port
 * (what COHORT_NICS=IF:verbs needs), on stdout; exit 77 when there is none,
 * so the tests labelled verbs skip on machines without RDMA.
 */
#include <dirent.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <string.h>

int main(void)
{
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    for (int i = 0; list && i < n; i++) {
        const char *name = ibv_get_device_name(list[i]);
        struct ibv_context *ctx = ibv_open_device(list[i]);
        struct ibv_port_attr pa;
        int active = ctx && ibv_query_port(ctx, 1, &pa) == 0 && pa.state == IBV_PORT_ACTIVE;
        if (ctx) ibv_close_device(ctx);
        if (!active) continue;
        char path[256];
        snprintf(path, sizeof(path), "/sys/class/infiniband/%s/device/net", name);
        DIR *d = opendir(path);
        struct dirent *e;
        while (d && (e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.') continue;
            printf("%s\n", e->d_name);
            closedir(d);
            ibv_free_device_list(list);
            return 0;
        }
        if (d) closedir(d);
    }
    if (list) ibv_free_device_list(list);
    fprintf(stderr, "SKIP: no RDMA device with an active port and an interface\n");
    return 77;
}
