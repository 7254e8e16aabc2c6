/*
 * en_ibv_pick_gid (engines/en_ibv.c): the GID a RoCE port's QPs use when
 * COHORT_VERBS_GID_INDEX is -1, against scripted GID tables (a provider
 * whose only call is query_gid_ex). A RoCE NIC's table holds, per address
 * of its interface, a RoCE v1 and a RoCE v2 entry, the link-local IPv6 ones
 * first; only a RoCE v2 entry of an IPv4 (or routable IPv6) address
 * crosses subnets, and index 0 (the old default) is the link-local v1 one.
 */
#include <arpa/inet.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "engines/en_ibv.h"

typedef struct row {
    const char *addr; /* NULL: an empty entry (the call fails) */
    int type;
} row_t;

static const row_t *table;
static int rows;

static void gid_of(const char *addr, union ibv_gid *g)
{
    memset(g, 0, sizeof(*g));
    struct in_addr a;
    if (inet_pton(AF_INET, addr, &a) == 1) {
        g->raw[10] = g->raw[11] = 0xff;
        memcpy(g->raw + 12, &a, 4);
    } else {
        assert_int_equal(inet_pton(AF_INET6, addr, g->raw), 1);
    }
}

static int fake_query_gid_ex(struct ibv_context *ctx, uint32_t port, uint32_t index,
                             struct ibv_gid_entry *e)
{
    (void)ctx;
    assert_int_equal(port, 1);
    if ((int)index >= rows || !table[index].addr) return ENODATA;
    memset(e, 0, sizeof(*e));
    gid_of(table[index].addr, &e->gid);
    e->gid_index = index;
    e->port_num = port;
    e->gid_type = (uint32_t)table[index].type;
    return 0;
}

static const en_ibv_t fake = {.name = "fake", .query_gid_ex = fake_query_gid_ex};

static int pick(const row_t *t, int n, int len, int link, const char *want)
{
    table = t;
    rows = n;
    struct ibv_port_attr pa = {.gid_tbl_len = len, .link_layer = (uint8_t)link};
    struct sockaddr_storage a;
    memset(&a, 0, sizeof(a));
    if (want && inet_pton(AF_INET, want, &((struct sockaddr_in *)&a)->sin_addr) == 1)
        a.ss_family = AF_INET;
    else if (want && inet_pton(AF_INET6, want, &((struct sockaddr_in6 *)&a)->sin6_addr) == 1)
        a.ss_family = AF_INET6;
    else
        assert_null(want);
    return en_ibv_pick_gid(&fake, NULL, 1, &pa, want ? (struct sockaddr *)&a : NULL);
}

enum { V1 = IBV_GID_TYPE_ROCE_V1, V2 = IBV_GID_TYPE_ROCE_V2, ETH = IBV_LINK_LAYER_ETHERNET };

/* A ConnectX port with two IPv4 addresses: fe80 v1/v2, then each address's
 * v1/v2 pair. */
static const row_t roce[] = {
    {"fe80::1", V1},  {"fe80::1", V2},  {"10.0.0.5", V1},
    {"10.0.0.5", V2}, {"10.1.0.5", V1}, {"10.1.0.5", V2},
};

static void test_roce_v2_ipv4(void **state)
{
    (void)state;
    assert_int_equal(pick(roce, 6, 6, ETH, NULL), 3);       /* the first v2 IPv4 entry */
    assert_int_equal(pick(roce, 6, 6, ETH, "10.1.0.5"), 5); /* the interface's own address */
    assert_int_equal(pick(roce, 6, 6, ETH, "10.0.0.5"), 3);
    assert_int_equal(pick(roce, 6, 6, ETH, "10.9.9.9"), 3); /* not in the table: any v2 IPv4 */
}

/* Only v1 entries (an old kernel or a RoCE v1 fabric): the IPv4 one. */
static void test_v1_only(void **state)
{
    (void)state;
    static const row_t t[] = {{"fe80::2", V1}, {"10.0.0.7", V1}};
    assert_int_equal(pick(t, 2, 2, ETH, NULL), 1);
}

/* No IPv4 address: a routable IPv6 RoCE v2 entry, before the link-local
 * ones of either type. */
static void test_ipv6_only(void **state)
{
    (void)state;
    static const row_t t[] = {{"fe80::3", V1}, {"2001:db8::3", V1}, {"2001:db8::3", V2}};
    assert_int_equal(pick(t, 3, 3, ETH, NULL), 2);
    static const row_t u[] = {{"fe80::3", V1}, {"fe80::3", V2}, {"2001:db8::3", V2}};
    assert_int_equal(pick(u, 3, 3, ETH, NULL), 2);
    static const row_t w[] = {{"fe80::3", V1}, {"fe80::3", V2}};
    assert_int_equal(pick(w, 2, 2, ETH, NULL), 1); /* only link-local: v2 still */
}

/* An interface with an IPv4 and two IPv6 addresses: an IPv6 rail takes its
 * own address's v2 entry (it took the IPv4-mapped one before 2026-11-30,
 * which an IPv6-only fabric does not route); an IPv4 rail the IPv4 one. */
static void test_ipv6_rail(void **state)
{
    (void)state;
    static const row_t t[] = {{"fe80::5", V1},       {"fe80::5", V2},      {"10.3.0.5", V1},
                              {"10.3.0.5", V2},      {"2001:db8::5", V1},  {"2001:db8::5", V2},
                              {"2001:db8:1::5", V1}, {"2001:db8:1::5", V2}};
    assert_int_equal(pick(t, 8, 8, ETH, "2001:db8:1::5"), 7);
    assert_int_equal(pick(t, 8, 8, ETH, "2001:db8::5"), 5);
    assert_int_equal(pick(t, 8, 8, ETH, "2001:db8:9::9"), 5); /* not in it: any routable v6 */
    assert_int_equal(pick(t, 8, 8, ETH, "10.3.0.5"), 3);
    assert_int_equal(pick(t, 8, 8, ETH, "::ffff:10.3.0.5"), 3); /* mapped: an IPv4 rail */
    assert_int_equal(pick(t, 8, 8, ETH, NULL), 3);
}

/* Empty slots (entries removed with an address) are skipped. */
static void test_holes(void **state)
{
    (void)state;
    static const row_t t[] = {{"fe80::4", V1}, {NULL, 0}, {NULL, 0}, {"10.2.0.1", V2}};
    assert_int_equal(pick(t, 4, 8, ETH, "10.2.0.1"), 3);
}

/* InfiniBand: index 0, the table is not read; an empty RoCE table: 0. */
static void test_infiniband_and_empty(void **state)
{
    (void)state;
    assert_int_equal(pick(roce, 6, 6, IBV_LINK_LAYER_INFINIBAND, "10.1.0.5"), 0);
    assert_int_equal(pick(roce, 0, 4, ETH, NULL), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roce_v2_ipv4), cmocka_unit_test(test_v1_only),
        cmocka_unit_test(test_ipv6_only),    cmocka_unit_test(test_ipv6_rail),
        cmocka_unit_test(test_holes),        cmocka_unit_test(test_infiniband_and_empty),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
