/*
 * The context: configuration, bootstrap, reactors, the world communicator.
 *
 * Bootstrap (world > 1): rank 0 serves the store on its control reactor;
 * every rank starts its rails (one listener per NIC), publishes
 * "addr/<rail>/<rank>", dials every lower rank on every rail, waits until
 * all peers are connected, connects to the coordinator, then meets the
 * others at a store barrier so that rank 0 keeps the store up until
 * everybody has read what it needs, and the coordinator up until everybody
 * is its member.
 *
 * Re-initialising: every context of a job has an incarnation (which init of
 * the job it is, counted per process); rank 0's store carries it in its
 * handshake, so that a rank that inits again fast never talks to rank 0's
 * store of the previous context, still up while rank 0 finalizes it.
 */
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gpu/gpu.h"
#include "engines/en_dgram.h"
#include "engines/en_regcache.h"
#include "reactor/rx_addr.h"
#include "reactor/rx_ctx.h"
#include "reactor/rx_trace.h"

/* ---- registry of live contexts: finalize twice is an error, not a crash ---- */

#define MAX_CTX 64
static uv_mutex_t reg_mu;
static uv_once_t reg_once = UV_ONCE_INIT;
static struct coh_ctx *registry[MAX_CTX];

static void reg_init(void)
{
    uv_mutex_init(&reg_mu);
}

static int reg_add(struct coh_ctx *ctx)
{
    uv_once(&reg_once, reg_init);
    uv_mutex_lock(&reg_mu);
    bool added = false;
    for (int i = 0; i < MAX_CTX && !added; i++)
        if (!registry[i]) {
            registry[i] = ctx;
            added = true;
        }
    uv_mutex_unlock(&reg_mu);
    /* The last error is the application's until something fails. */
    return added ? 0 : bs_fail(COH_ENOMEM, "more than %d live contexts", MAX_CTX);
}

/* Remove ctx; returns false when it was not registered. */
static bool reg_take(struct coh_ctx *ctx)
{
    uv_once(&reg_once, reg_init);
    uv_mutex_lock(&reg_mu);
    bool found = false;
    for (int i = 0; i < MAX_CTX && ctx; i++)
        if (registry[i] == ctx) {
            registry[i] = NULL;
            found = true;
            break;
        }
    uv_mutex_unlock(&reg_mu);
    return found;
}

int rx_udp_path(const struct coh_ctx *ctx, int r)
{
    for (int k = 0; k < ctx->udp_group.n; k++)
        if (ctx->udp_group.rail[k] == r) return k;
    return -1;
}

bool rx_ctx_alive(struct coh_ctx *ctx)
{
    uv_once(&reg_once, reg_init);
    uv_mutex_lock(&reg_mu);
    bool found = false;
    for (int i = 0; i < MAX_CTX && ctx; i++) found |= registry[i] == ctx;
    uv_mutex_unlock(&reg_mu);
    return found;
}

/* ---- incarnations: which init of its job a context is ---- */

/* Every rank of a job calls coh_init as often, so counting this process's
 * inits per (store, token, rank, world) gives every rank of the job the same
 * number (also for ranks that are threads of one process). Kept for the
 * process's life: a few bytes per job. */
typedef struct incarnation {
    uint64_t key;
    uint32_t n;
} incarnation_t;
static incarnation_t *incs;
static size_t ninc, capinc;

static uint64_t hash_str(uint64_t h, const char *s)
{
    for (; s && *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return bs_fnv64(h, 0); /* a separator: ("ab", "c") is not ("a", "bc") */
}

static int next_incarnation(const struct coh_ctx *ctx, uint32_t *out)
{
    uint64_t key = hash_str(hash_str(BS_FNV_SEED, ctx->store_s), ctx->token_s);
    key = bs_fnv64(bs_fnv64(key, (uint64_t)ctx->rank), (uint64_t)ctx->world);
    uv_once(&reg_once, reg_init);
    uv_mutex_lock(&reg_mu);
    size_t i = 0;
    while (i < ninc && incs[i].key != key) i++;
    if (i == ninc && ninc == capinc) {
        size_t ncap = capinc ? 2 * capinc : 16;
        incarnation_t *n = coh_realloc(incs, ncap * sizeof(*n));
        if (!n) {
            uv_mutex_unlock(&reg_mu);
            return bs_fail(COH_ENOMEM, "coh_init: out of memory");
        }
        incs = n;
        capinc = ncap;
    }
    if (i == ninc) incs[ninc++] = (incarnation_t){.key = key, .n = 0};
    *out = ++incs[i].n;
    uv_mutex_unlock(&reg_mu);
    return 0;
}

/* ---- the store's socket ---- */

/* The launcher's socket (COHORT_STORE_FD) is adopted once per process: the
 * first context closes it at finalize, and by the next init that number may
 * be the application's file or socket. A copy of it (another number) is kept
 * for the life of the process, and a later context adopts a copy of that:
 * binding COHORT_STORE's port again raced with anything that took the port
 * meanwhile (CI: mp.lb.n4.rails2 failed with EADDRINUSE after 2 s of
 * retries). Connections for the next context wait in its backlog. */
static atomic_bool inherited_fd_seen;
static atomic_int inherited_keep = -1;
/* A context's store listens on it (or its copy): a second context at the
 * same time binds the address instead (and finds it taken), as before. */
static atomic_bool inherited_busy;

static bool listening_tcp(int fd)
{
    int v = 0;
    socklen_t l = sizeof(v);
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &v, &l) != 0 || !v) return false;
    l = sizeof(v);
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &v, &l) != 0 || v != SOCK_STREAM) return false;
    l = sizeof(v);
    return getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &v, &l) == 0 && (v == AF_INET || v == AF_INET6);
}

/* The fd rank 0's store adopts, or -1 to bind the store's address. An fd
 * that is not a listening TCP socket is never adopted (nor closed): the
 * launcher's is then replaced by the address, one given otherwise refused. */
static int store_fd_pick(struct coh_ctx *ctx, int *fd)
{
    int want = ctx->cfg.store_fd;
    *fd = -1;
    if (want < 0) return 0;
    const char *env = getenv("COHORT_STORE_FD");
    char *end = NULL;
    bool inherited = env && *env && strtol(env, &end, 10) == want && end && !*end;
    if (inherited && atomic_exchange(&inherited_fd_seen, true)) {
        int keep = atomic_load(&inherited_keep);
        if (keep >= 0 && listening_tcp(keep) && !atomic_exchange(&inherited_busy, true)) {
            int d = fcntl(keep, F_DUPFD_CLOEXEC, 0);
            if (d >= 0) {
                *fd = d;
                ctx->store_inherited = true;
                return 0;
            }
            atomic_store(&inherited_busy, false);
        }
        bs_log(COH_LOG_DEBUG,
               "COHORT_STORE_FD=%d was the store of an earlier context: binding %s instead", want,
               ctx->store_s);
        return 0;
    }
    if (listening_tcp(want)) {
        if (inherited) {
            atomic_store(&inherited_keep, fcntl(want, F_DUPFD_CLOEXEC, 0));
            atomic_store(&inherited_busy, true);
            ctx->store_inherited = true;
        }
        *fd = want;
        return 0;
    }
    if (inherited) {
        bs_log(COH_LOG_WARN,
               "COHORT_STORE_FD=%d is not a listening TCP socket (closed or reused by the "
               "application?): left alone, binding %s instead",
               want, ctx->store_s);
        return 0;
    }
    return bs_fail(COH_EINVAL, "store_fd %d is not a listening TCP socket (left open)", want);
}

/* ---- set-up helpers ---- */

/* Milliseconds until deadline (0 once past). */
static int left_ms(uint64_t deadline)
{
    uint64_t now = bs_now_ns();
    return now >= deadline ? 0 : (int)((deadline - now) / 1000000ull);
}

static char *dupstr(const char *s)
{
    return s ? coh_strdup(s) : NULL;
}

/* COHORT_TEST_UDP_DROP_PPM (tests only): random datagram loss on loopback. */
static uint32_t test_udp_drop_ppm(void)
{
    int ppm = 0;
    return rx_env_knob_int("test_udp_drop", &ppm) == 0 ? (uint32_t)ppm : 0;
}

/* COHORT_TEST_UDP_SEND_FAIL (tests only): the n-th batch sent fails. */
static int test_udp_send_fail(void)
{
    int n = 0;
    return rx_env_knob_int("test_udp_send_fail", &n) == 0 ? n : 0;
}

/* COHORT_TEST_TCP_DROP_PROBE (tests only): the first move back is dropped. */
static bool test_drop_probe(void)
{
    int on = 0;
    return rx_env_knob_int("test_tcp_drop_probe", &on) == 0 && on == 1;
}

/* COHORT_TEST_RESUME_DELAY_MS (tests only): slow resume dials of the lower rank. */
static int test_resume_delay_ms(void)
{
    int ms = 0;
    return rx_env_knob_int("test_resume_delay", &ms) == 0 ? ms : 0;
}

/* COHORT_TEST_UDP_CTL_DGRAM (tests only): control without its TCP copy. */
static bool test_udp_ctl_dgram(void)
{
    int on = 0;
    return rx_env_knob_int("test_udp_ctl_dgram", &on) == 0 && on;
}

#ifdef COHORT_HAVE_VERBS
/* NIC:verbs where NIC is no interface or address: an RDMA device's name (as
 * the COHORT_NICS=mlx5_0:verbs). The rail takes the interface of its
 * port (COHORT_VERBS_PORT) for addresses, and that device for its QPs. */
static int verbs_by_device(struct coh_ctx *ctx, int n, const char *dev)
{
    const char *provider = NULL;
    int port = 1;
    char nd[64];
    BS_CHECK(rx_env_knob_str("verbs_provider", &provider));
    BS_CHECK(rx_env_knob_int("verbs_port", &port));
    if (en_verbs_netdev_of(provider, dev, port, nd, sizeof(nd)) != 0)
        return bs_fail(COH_EINVAL,
                       "COHORT_NICS: '%s:verbs': no network interface, address or RDMA device "
                       "(with an interface on port %d) is called so",
                       dev, port);
    BS_CHECK(rx_resolve_nic(nd, &ctx->rail_addr[n]));
    snprintf(ctx->rail_verbs_dev[n], sizeof(ctx->rail_verbs_dev[n]), "%s", dev);
    snprintf(ctx->rail_nic[n], sizeof(ctx->rail_nic[n]), "%s", nd);
    snprintf(ctx->rail_netdev[n], sizeof(ctx->rail_netdev[n]), "%s", nd);
    return 0;
}

/* The interface behind a rail named by an interface or one of its addresses
 * (10.0.0.5:verbs, fd00::5:verbs, as TCP rails take them): its RDMA device
 * carries a verbs rail, and the links of another verbs rail may move to it. */
static void verbs_netdev(struct coh_ctx *ctx, int n)
{
    char nm[IF_NAMESIZE];
    const char *nic = ctx->rail_nic[n];
    if (if_nametoindex(nic) == 0 && rx_addr_ifname(&ctx->rail_addr[n], nm, sizeof(nm)) == 0)
        nic = nm;
    snprintf(ctx->rail_netdev[n], sizeof(ctx->rail_netdev[n]), "%s", nic);
}
#endif

static int parse_nics(struct coh_ctx *ctx)
{
    char *list = coh_strdup(ctx->nics_s);
    if (!list) return COH_ENOMEM;
    int n = 0, st = 0;
    char *save = NULL;
    for (char *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ') tok++;
        if (!*tok) continue;
        if (n == RX_MAX_RAILS) {
            st = bs_fail(COH_EINVAL, "COHORT_NICS lists more than %d rails", RX_MAX_RAILS);
            break;
        }
        /* NIC:udp@MBPS: a udp rail's own line rate (an IPv6 literal has
         * no '@'). */
        ctx->udp_rate[n] = 0;
        char *at = strrchr(tok, '@');
        if (at) {
            char *end;
            long r = strtol(at + 1, &end, 10);
            if (end == at + 1 || *end || r < 1 || r > 10000000) {
                st = bs_fail(COH_EINVAL,
                             "COHORT_NICS: '%s': the rate after '@' must be 1..1e7 "
                             "Mbit/s",
                             tok);
                break;
            }
            ctx->udp_rate[n] = (int)r;
            *at = 0;
        }
        /* NIC:udp / NIC:tcp picks the rail's kind (an IPv6 literal never
         * ends so). */
        size_t tl = strlen(tok);
        ctx->rail_udp[n] = ctx->rail_verbs[n] = false;
        if (tl > 4 && !strcmp(tok + tl - 4, ":udp")) {
            ctx->rail_udp[n] = ctx->any_udp = true;
            tok[tl - 4] = 0;
        } else if (tl > 4 && !strcmp(tok + tl - 4, ":tcp")) {
            tok[tl - 4] = 0;
        } else if (tl > 6 && !strcmp(tok + tl - 6, ":verbs")) {
            ctx->rail_verbs[n] = true;
            tok[tl - 6] = 0;
#ifndef COHORT_HAVE_VERBS
            st = bs_fail(COH_EUNSUPPORTED,
                         "COHORT_NICS: '%s:verbs': this build has no verbs engine (it needs "
                         "libibverbs-dev at build time)",
                         tok);
            break;
#endif
        }
        snprintf(ctx->rail_nic[n], sizeof(ctx->rail_nic[n]), "%s", tok);
        ctx->rail_verbs_dev[n][0] = 0;
        if (ctx->rail_verbs[n] && ctx->udp_rate[n]) {
            st = bs_fail(COH_EINVAL, "COHORT_NICS: '%s': a line rate is for udp rails", tok);
            break;
        }
        if (ctx->udp_rate[n] && !ctx->rail_udp[n]) {
            st = bs_fail(COH_EINVAL,
                         "COHORT_NICS: '%s@%d': a line rate is for udp rails (NIC:udp@MBPS)", tok,
                         ctx->udp_rate[n]);
            break;
        }
        st = rx_resolve_nic(tok, &ctx->rail_addr[n]);
#ifdef COHORT_HAVE_VERBS
        if (st == 0) verbs_netdev(ctx, n); /* any kind: verbs links may move to its device */
        if (st < 0 && ctx->rail_verbs[n]) st = verbs_by_device(ctx, n, tok);
#endif
        if (st < 0) break;
        n++;
    }
    coh_free(list);
    if (st == 0 && n == 0) st = bs_fail(COH_EINVAL, "COHORT_NICS names no interface");
    ctx->nrails = n;
    return st;
}

/* A verbs rail's settings (COHORT_VERBS_*). */
static int verbs_cfg(struct coh_ctx *ctx, int r, en_rail_cfg_t *rc)
{
#ifdef COHORT_HAVE_VERBS
    const char *dev = NULL, *provider = NULL;
    int port = 1, gid = -1, move = 1, lose_from = -1, rts_fail_on = -1;
    size_t ring = 0;
    BS_CHECK(rx_env_knob_str("verbs_device", &dev));
    BS_CHECK(rx_env_knob_str("verbs_provider", &provider));
    BS_CHECK(rx_env_knob_int("verbs_port", &port));
    BS_CHECK(rx_env_knob_int("verbs_gid_index", &gid));
    BS_CHECK(rx_env_knob_int("verbs_move", &move));
    BS_CHECK(rx_env_knob_int("verbs_resume_ms", &rc->verbs_resume_ms));
    BS_CHECK(rx_env_knob_int("test_verbs_port_down", &rc->verbs_test_port_down_ms));
    BS_CHECK(rx_env_knob_int("test_verbs_ready_delay", &rc->verbs_test_ready_delay_ms));
    BS_CHECK(rx_env_knob_int("test_verbs_poke_late", &rc->verbs_test_poke_late_ms));
    BS_CHECK(rx_env_knob_int("test_verbs_lose_ready", &lose_from));
    rc->verbs_test_lose_ready = lose_from + 1;
    BS_CHECK(rx_env_knob_int("test_verbs_rts_fail", &rts_fail_on));
    rc->verbs_test_rts_fail = rts_fail_on + 1;
    BS_CHECK(rx_env_knob_int("test_verbs_rts_fail_times", &rc->verbs_test_rts_fail_times));
    BS_CHECK(rx_env_knob_int("test_verbs_rts_fail_peer", &rc->verbs_test_rts_fail_peer));
    int create_fail = 0;
    BS_CHECK(rx_env_knob_int("test_verbs_create_fail", &create_fail));
    rc->verbs_test_create_fail = create_fail == 1;
    BS_CHECK(rx_env_knob_size("verbs_ring_bytes", &ring));
    BS_CHECK(rx_env_knob_size("verbs_zcopy_bytes", &rc->verbs_zcopy_bytes));
    BS_CHECK(rx_env_knob_size("verbs_reg_cache_bytes", &rc->verbs_reg_cache_bytes));
    rc->regions = ctx->regions;
    rc->ops = &en_verbs_ops;
    rc->verbs = true;
    rc->verbs_move = move != 0;
    for (int j = 0; j < ctx->nrails && j < EN_MAX_RAILS; j++) {
        rc->verbs_netdevs[j] = ctx->rail_netdev[j];
        rc->verbs_devs[j] = ctx->rail_verbs_dev[j][0] ? ctx->rail_verbs_dev[j] : NULL;
    }
    rc->verbs_dev = dev;
    rc->verbs_provider = provider;
    rc->verbs_port = port;
    rc->verbs_gid = gid;
    rc->verbs_ring_bytes = ring;
    return 0;
#else
    (void)rc;
    return bs_fail(COH_EUNSUPPORTED, "rail %d (%s:verbs): this build has no verbs engine", r,
                   ctx->rail_nic[r]);
#endif
}

static int store_start_fn(rx_reactor_t *rx, void *arg)
{
    struct coh_ctx *ctx = arg;
    struct sockaddr_storage a;
    int st = 0;
    if (ctx->cfg.store_fd < 0) st = rx_resolve_hostport(ctx->store_s, &a);
    if (st < 0) return st;
    return rx_store_server_start(rx, (struct sockaddr *)&a, ctx->cfg.store_fd, ctx->token_s,
                                 ctx->world, ctx->incarnation, &ctx->store);
}

static int store_close_fn(rx_reactor_t *rx, void *arg)
{
    (void)rx;
    struct coh_ctx *ctx = arg;
    if (ctx->store) rx_store_server_close(ctx->store);
    ctx->store = NULL;
    if (ctx->store_inherited) {
        ctx->store_inherited = false;
        atomic_store(&inherited_busy, false);
    }
    return 0;
}

static void ctrl_on_stop(rx_reactor_t *rx)
{
    struct coh_ctx *ctx = rx->owner;
    store_close_fn(rx, ctx);
    rx_coord_close(ctx->coord);
    ctx->coord = NULL;
}

static int coord_start_fn(rx_reactor_t *rx, void *arg)
{
    struct coh_ctx *ctx = arg;
    return rx_coord_start(ctx, rx, ctx->rank == ctx->cfg.coordinator, &ctx->coord);
}

/* The settings every rank must share, as text: a rank that disagrees would
 * otherwise hang (two coordinators each waiting for the whole world). */
static void conf_text(const struct coh_ctx *ctx, char *out, size_t cap)
{
    const char *tl = NULL;
    (void)rx_env_knob_str("timeline", &tl); /* it measures clocks collectively at init */
    snprintf(out, cap, "coordinator=%d sync_mode=%s nrails=%d lb_epoch=%d timeline=%d",
             ctx->cfg.coordinator, coh_sync_mode_name((coh_sync_mode)ctx->cfg.sync_mode),
             ctx->nrails, ctx->nrails > 1 ? ctx->cfg.lb_epoch : 0, tl && *tl);
}

/* Rank 0 compares every rank's settings with its own and publishes the
 * verdict ("" or what differs); every rank reads it, so they all fail, with
 * the same EMISMATCH, naming the setting. */
static int agree_conf(struct coh_ctx *ctx, rx_store_client_t *sc, uint64_t deadline)
{
    char mine[128], key[64], val[256];
    conf_text(ctx, mine, sizeof(mine));
    snprintf(key, sizeof(key), "conf/%d", ctx->rank);
    BS_CHECK(rx_store_set(sc, key, mine, strlen(mine), deadline));
    if (ctx->rank == 0) {
        char verdict[512] = "";
        for (int r = 1; r < ctx->world && !verdict[0]; r++) {
            size_t vl = 0;
            memset(val, 0, sizeof(val));
            snprintf(key, sizeof(key), "conf/%d", r);
            BS_CHECK(rx_store_get(sc, key, val, sizeof(val) - 1, &vl, left_ms(deadline), deadline));
            if (strcmp(val, mine) != 0)
                snprintf(verdict, sizeof(verdict), "rank %d has %s, rank 0 has %s", r, val, mine);
        }
        BS_CHECK(rx_store_set(sc, "conf", verdict, strlen(verdict), deadline));
    }
    size_t vl = 0;
    char verdict[512];
    memset(verdict, 0, sizeof(verdict));
    BS_CHECK(
        rx_store_get(sc, "conf", verdict, sizeof(verdict) - 1, &vl, left_ms(deadline), deadline));
    if (vl) {
        /* Rank 0 holds the store until every rank has read the verdict. */
        int64_t seen = 0;
        BS_CHECK(rx_store_add(sc, "conf_seen", 1, &seen, deadline));
        if (seen == ctx->world) BS_CHECK(rx_store_set(sc, "conf_done", "1", 1, deadline));
        if (ctx->rank == 0) {
            char one[8];
            rx_store_get(sc, "conf_done", one, sizeof(one), NULL, left_ms(deadline), deadline);
        }
    }
    if (vl)
        return bs_fail(COH_EMISMATCH,
                       "ranks disagree on the job's settings: %s (COHORT_COORDINATOR, "
                       "COHORT_SYNC_MODE, the number of COHORT_NICS, COHORT_LB_EPOCH and whether "
                       "COHORT_TIMELINE is set must be the same on every rank)",
                       verdict);
    return 0;
}

/* An address in the store under key, and back. */
static int store_put_addr(rx_store_client_t *sc, const char *key, const struct sockaddr *a,
                          uint64_t deadline)
{
    char val[128];
    rx_format_addr(a, val, sizeof(val));
    return rx_store_set(sc, key, val, strlen(val), deadline);
}

static int store_get_addr(rx_store_client_t *sc, const char *key, struct sockaddr_storage *out,
                          uint64_t deadline)
{
    char val[128] = "";
    BS_CHECK(rx_store_get(sc, key, val, sizeof(val) - 1, NULL, left_ms(deadline), deadline));
    return rx_resolve_hostport(val, out);
}

/* Failover: a link of rail r may move to interface j, where the peer's rail
 * r listens too (on every address): give every rail every peer's routes. */
static int set_routes(struct coh_ctx *ctx, rx_store_client_t *sc, uint64_t deadline)
{
    char key[64], val[128];
    struct sockaddr_storage addr[RX_MAX_RAILS], route[RX_MAX_RAILS];
    for (int peer = 0; peer < ctx->world; peer++) {
        if (peer == ctx->rank) continue;
        for (int r = 0; r < ctx->nrails; r++) {
            size_t vl;
            snprintf(key, sizeof(key), "addr/%d/%d", r, peer);
            memset(val, 0, sizeof(val));
            BS_CHECK(rx_store_get(sc, key, val, sizeof(val) - 1, &vl, left_ms(deadline), deadline));
            BS_CHECK(rx_resolve_hostport(val, &addr[r]));
        }
        for (int r = 0; r < ctx->nrails; r++) {
            for (int j = 0; j < ctx->nrails; j++) {
                route[j] = addr[j];
                en_sa_set_port(&route[j], en_sa_port(&addr[r]));
            }
            BS_CHECK(en_rail_set_routes(&ctx->rails[r].en, peer, route, ctx->nrails));
        }
    }
    return 0;
}

/* Exchange addresses through the store, dial lower ranks, wait for all. */
/* This host's identity: COHORT_HOST_ID, else the kernel's boot id (every
 * process of a machine has it, whatever its namespaces). */
static int host_identity(struct coh_ctx *ctx)
{
    const char *id = "";
    BS_CHECK(rx_env_knob_str("host_id", &id));
    if (id[0]) {
        snprintf(ctx->host_id, sizeof(ctx->host_id), "%s", id);
        return 0;
    }
    snprintf(ctx->host_id, sizeof(ctx->host_id), "unknown-host");
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        char b[64];
        if (fgets(b, sizeof(b), f)) {
            b[strcspn(b, "\n")] = 0;
            if (b[0]) snprintf(ctx->host_id, sizeof(ctx->host_id), "boot:%s", b);
        }
        fclose(f);
    }
    return 0;
}

static uint64_t host_hash_of(const char *id)
{
    uint64_t h = BS_FNV_SEED;
    for (const char *p = id; *p; p++) h = bs_fnv64(h, (uint8_t)*p);
    return h;
}

/* Every rank's host_hash known: host_idx, the lowest rank on each one's host. */
static void group_hosts(struct coh_ctx *ctx)
{
    ctx->host_hash[ctx->rank] = host_hash_of(ctx->host_id);
    for (int q = 0; q < ctx->world; q++) {
        int first = 0;
        while (ctx->host_hash[first] != ctx->host_hash[q]) first++;
        ctx->host_idx[q] = first;
    }
}

/* "NAME:ID": NAME is the context's shared-memory listeners' ("-" without
 * shared memory), ID its host. */
static int put_host(struct coh_ctx *ctx, rx_store_client_t *sc, uint64_t deadline)
{
    char key[64], val[320];
    snprintf(key, sizeof(key), "host/%d", ctx->rank);
    int n = snprintf(val, sizeof(val), "%s:%s", ctx->shm_dir ? ctx->shm_name : "-", ctx->host_id);
    return rx_store_set(sc, key, val, (size_t)n, deadline);
}

static int get_host(struct coh_ctx *ctx, rx_store_client_t *sc, int peer, uint64_t deadline)
{
    char key[64], val[320];
    size_t vl = 0;
    snprintf(key, sizeof(key), "host/%d", peer);
    memset(val, 0, sizeof(val));
    BS_CHECK(rx_store_get(sc, key, val, sizeof(val) - 1, &vl, left_ms(deadline), deadline));
    char *colon = strchr(val, ':');
    if (!colon || colon - val >= EN_SHM_NAME)
        return bs_fail(COH_EBOOTSTRAP, "rank %d published a malformed host entry", peer);
    *colon = 0;
    bool same = !strcmp(colon + 1, ctx->host_id);
    ctx->host_hash[peer] = host_hash_of(colon + 1);
    ctx->same_host[peer] = same;
    ctx->shm_peer[peer] = same && strcmp(val, "-") && ctx->shm_dir;
    snprintf(ctx->shm_names[peer], EN_SHM_NAME, "%s", val);
    if (same) ctx->local_n++;
    return 0;
}

static int connect_mesh(struct coh_ctx *ctx, rx_store_client_t *sc, uint64_t deadline)
{
    char key[64], val[128];
    BS_CHECK(agree_conf(ctx, sc, deadline));
    BS_CHECK(put_host(ctx, sc, deadline));
    snprintf(key, sizeof(key), "nrails/%d", ctx->rank);
    snprintf(val, sizeof(val), "%d", ctx->nrails);
    BS_CHECK(rx_store_set(sc, key, val, strlen(val), deadline));
    for (int r = 0; r < ctx->nrails; r++) {
        rx_format_addr((struct sockaddr *)&ctx->rails[r].en.bound, val, sizeof(val));
        snprintf(key, sizeof(key), "addr/%d/%d", r, ctx->rank);
        BS_CHECK(rx_store_set(sc, key, val, strlen(val), deadline));
    }
    for (int peer = 0; peer < ctx->rank; peer++) {
        size_t vl;
        snprintf(key, sizeof(key), "nrails/%d", peer);
        memset(val, 0, sizeof(val));
        BS_CHECK(rx_store_get(sc, key, val, sizeof(val) - 1, &vl, left_ms(deadline), deadline));
        if (atoi(val) != ctx->nrails)
            return bs_fail(COH_EBOOTSTRAP,
                           "rank %d has %s rails, this rank (%d) has %d: COHORT_NICS must list "
                           "the same number of rails on every rank",
                           peer, val, ctx->rank, ctx->nrails);
        BS_CHECK(get_host(ctx, sc, peer, deadline));
        for (int r = 0; r < ctx->nrails; r++) {
            if (ctx->shm_peer[peer])
                en_rail_set_shm_peer(&ctx->rails[r].en, peer, ctx->shm_names[peer]);
            snprintf(key, sizeof(key), "addr/%d/%d", r, peer);
            memset(val, 0, sizeof(val));
            BS_CHECK(rx_store_get(sc, key, val, sizeof(val) - 1, &vl, left_ms(deadline), deadline));
            struct sockaddr_storage a;
            BS_CHECK(rx_resolve_hostport(val, &a));
            BS_CHECK(rx_rail_dial(&ctx->rails[r], peer, (struct sockaddr *)&a));
        }
    }
    for (int r = 0; r < ctx->nrails; r++)
        BS_CHECK(en_rail_wait_connected(&ctx->rails[r].en, deadline));
    for (int peer = ctx->rank + 1; peer < ctx->world; peer++)
        BS_CHECK(get_host(ctx, sc, peer, deadline));
    group_hosts(ctx);
    if (ctx->nrails > 1 || ctx->any_udp) BS_CHECK(set_routes(ctx, sc, deadline));
    /* Every rank's control address: the coordinator's now, any other's
     * should the survivors have to elect it. */
    struct sockaddr_storage a;
    rx_coord_addr(ctx->coord, &a);
    snprintf(key, sizeof(key), "ctrl/%d", ctx->rank);
    BS_CHECK(store_put_addr(sc, key, (struct sockaddr *)&a, deadline));
    for (int peer = 0; peer < ctx->world; peer++) {
        snprintf(key, sizeof(key), "ctrl/%d", peer);
        BS_CHECK(store_get_addr(sc, key, &ctx->ctrl_addrs[peer], deadline));
    }
    ctx->coord_addr = ctx->ctrl_addrs[ctx->cfg.coordinator];
    return 0;
}

/* Every rank is a member of the coordinator: nobody's init returns before
 * that (rank 0 would otherwise finalize, closing the store and the
 * coordinator, while the others still dial it). The last rank in opens the
 * barrier and does not wait for its own answer, which rank 0 may no longer
 * give. */
static int store_barrier(struct coh_ctx *ctx, rx_store_client_t *sc, uint64_t deadline)
{
    int64_t joined = 0;
    BS_CHECK(rx_store_add(sc, "joined", 1, &joined, deadline));
    if (joined == ctx->world) return rx_store_set(sc, "go", "1", 1, deadline);
    char val[8];
    return rx_store_get(sc, "go", val, sizeof(val), NULL, left_ms(deadline), deadline);
}

/*
 * COHORT_REJOIN: this process restarts a rank that failed, while the job
 * runs: no agreement and no barrier (the others are busy training). It
 * publishes this incarnation's addresses, learns every rank's and finds the
 * coordinator; its data links come at coh_comm_grow.
 */
static int rejoin_addrs(struct coh_ctx *ctx, rx_store_client_t *sc, uint64_t deadline)
{
    char key[64];
    int nr = ctx->nrails;
    ctx->rejoin_addrs =
        coh_calloc((size_t)ctx->world * (size_t)nr, sizeof(struct sockaddr_storage));
    if (!ctx->rejoin_addrs) return bs_fail(COH_ENOMEM, "out of memory");
    for (int r = 0; r < nr; r++) {
        snprintf(key, sizeof(key), "addr/%d/%d", r, ctx->rank);
        BS_CHECK(store_put_addr(sc, key, (struct sockaddr *)&ctx->rails[r].en.bound, deadline));
    }
    struct sockaddr_storage a;
    rx_coord_addr(ctx->coord, &a);
    snprintf(key, sizeof(key), "ctrl/%d", ctx->rank);
    BS_CHECK(store_put_addr(sc, key, (struct sockaddr *)&a, deadline));
    for (int peer = 0; peer < ctx->world; peer++) {
        if (peer == ctx->rank) continue;
        for (int r = 0; r < nr; r++) {
            snprintf(key, sizeof(key), "addr/%d/%d", r, peer);
            BS_CHECK(store_get_addr(sc, key, &ctx->rejoin_addrs[peer * nr + r], deadline));
        }
        snprintf(key, sizeof(key), "ctrl/%d", peer);
        BS_CHECK(store_get_addr(sc, key, &ctx->ctrl_addrs[peer], deadline));
        /* The hosts as the job began (the others group ranks by them). */
        BS_CHECK(get_host(ctx, sc, peer, deadline));
    }
    group_hosts(ctx);
    if (nr > 1 || ctx->any_udp) BS_CHECK(set_routes(ctx, sc, deadline));
    ctx->coord_addr = ctx->ctrl_addrs[ctx->cfg.coordinator];
    return 0;
}

/* The bootstrap of a world > 1, after the rails and the coordinator started. */
static int bootstrap(struct coh_ctx *ctx, uint64_t deadline)
{
    rx_store_client_t sc;
    struct sockaddr_storage store_addr;
    BS_CHECK(rx_resolve_hostport(ctx->store_s, &store_addr));
    BS_CHECK(rx_store_connect(&sc, (struct sockaddr *)&store_addr, ctx->token_s, ctx->rank,
                              ctx->world, ctx->incarnation, deadline));
    int st = ctx->cfg.rejoin ? rejoin_addrs(ctx, &sc, deadline) : connect_mesh(ctx, &sc, deadline);
    if (st == 0) st = rx_member_start(ctx);
    if (st == 0) st = rx_member_wait_ready(ctx, deadline);
    if (st == 0 && !ctx->cfg.rejoin) st = store_barrier(ctx, &sc, deadline);
    rx_store_close(&sc);
    return st;
}

static void describe(struct coh_ctx *ctx)
{
    size_t n = 0, cap = sizeof(ctx->describe);
    n += (size_t)snprintf(ctx->describe + n, cap - n,
                          "cohort %d.%d.%d rank %d/%d, %d rail(s):", COH_VERSION_MAJOR,
                          COH_VERSION_MINOR, COH_VERSION_PATCH, ctx->rank, ctx->world, ctx->nrails);
    for (int r = 0; r < ctx->nrails && n < cap; r++) {
        char a[96];
        rx_format_addr((struct sockaddr *)&ctx->rails[r].en.bound, a, sizeof(a));
        n += (size_t)snprintf(ctx->describe + n, cap - n, " %s/%s", ctx->rails[r].en.ops->name, a);
    }
    if (n < cap) {
        const char *dev = rx_gpu_name(ctx);
        if (dev)
            snprintf(ctx->describe + n, cap - n,
                     "; device buffers through %s (staged in host memory), CPU reductions", dev);
        else
            snprintf(ctx->describe + n, cap - n, "; %s",
                     gpu_device_count() > 0 ? "GPU present but COHORT_GPU=off: host buffers only"
                                            : "no GPU: host buffers, CPU reduction kernels");
    }
}

static void ctx_fini(struct coh_ctx *ctx)
{
    rx_trace_close(ctx); /* an init that failed after opening it */
    rx_lb_fini(ctx);
    rx_gpu_fini(ctx);
    for (int r = 0; ctx->rails && r < ctx->nrails; r++) rx_rail_fini(&ctx->rails[r]);
    rx_reactor_fini(&ctx->ctrl);
    if (ctx->event_fd >= 0) close(ctx->event_fd);
    coh_free(ctx->rails);
    rx_sched_cfg_fini(&ctx->sched_cfg);
    coh_free(ctx->store_s);
    coh_free(ctx->token_s);
    coh_free(ctx->nics_s);
    coh_free(ctx->sched_s);
    rx_ctx_free_comms(ctx);
    coh_free(ctx->failed);
    coh_free(ctx->back);
    coh_free(ctx->rejoin_addrs);
    coh_free(ctx->ctrl_addrs);
    coh_free(ctx->same_host);
    coh_free(ctx->shm_peer);
    coh_free(ctx->shm_names);
    coh_free(ctx->host_hash);
    coh_free(ctx->host_idx);
    uv_mutex_destroy(&ctx->fail_mu);
    uv_mutex_destroy(&ctx->links_mu);
    coh_free(ctx->links);
    en_regtab_free(ctx->regions); /* after the rails: their caches look it up */
    coh_free(ctx);
}

static void ctx_stop(struct coh_ctx *ctx)
{
    /* The control link first (no new plans), then the rails (their ops end
     * and hand sync attempts to the control reactor), then that reactor. */
    rx_member_close(ctx);
    /* A dead peer must not hold us: BYEs get half a second to leave. */
    uint64_t quiet = bs_now_ns() + 500000000ull;
    for (int r = 0; r < ctx->nrails; r++) rx_rail_stop(&ctx->rails[r], quiet);
    rx_gpu_stop(ctx); /* its chunks' collectives have ended with the rails */
    if (ctx->ctrl_started) rx_reactor_stop(&ctx->ctrl);
    ctx->ctrl_started = false;
    rx_member_fini(ctx);
}

/* A plan knob (COHORT_ALGO, COHORT_SMALL_ALGO): auto or one of two plans. */
static int plan_knob(const char *knob, const char *env, const char *a, int va, const char *b,
                     int vb, int *out)
{
    const char *v = "auto";
    int st = rx_env_knob_str(knob, &v);
    if (st) return st;
    if (!strcmp(v, "auto") || !strcmp(v, a) || !strcmp(v, b)) {
        *out = !strcmp(v, a) ? va : !strcmp(v, b) ? vb : SC_ALGO_AUTO;
        return 0;
    }
    return bs_fail(COH_EINVAL, "coh_init: %s must be auto, %s or %s (%s)", env, a, b, v);
}

COH_API int coh_init(const coh_config_t *cfg_in, coh_ctx_t **out)
{
    if (!out) return bs_fail(COH_EINVAL, "coh_init: ctx pointer is NULL");
    *out = NULL;
    coh_config_t envcfg;
    if (!cfg_in) {
        BS_CHECK(coh_config_init(&envcfg));
        cfg_in = &envcfg;
    }
    BS_CHECK(rx_config_validate(cfg_in));
    struct coh_ctx *ctx = coh_zalloc(sizeof(*ctx));
    if (!ctx) return bs_fail(COH_ENOMEM, "coh_init: out of memory");
    ctx->cfg = *cfg_in;
    ctx->event_fd = -1;
    ctx->store_s = dupstr(cfg_in->store);
    ctx->token_s = dupstr(cfg_in->token ? cfg_in->token : "");
    ctx->nics_s = dupstr(cfg_in->nics);
    ctx->sched_s = dupstr(cfg_in->sched ? cfg_in->sched : "");
    ctx->cfg.sched = ctx->sched_s;
    ctx->cfg.store = ctx->store_s;
    ctx->cfg.token = ctx->token_s;
    ctx->cfg.nics = ctx->nics_s;
    atomic_init(&ctx->refs, 1);
    ctx->rank = cfg_in->rank;
    ctx->spin_us = rx_config_spin_us(cfg_in);
    ctx->oversubscribed = rx_config_oversubscribed();
    ctx->world = cfg_in->world_size;
    uv_mutex_init(&ctx->fail_mu);
    uv_mutex_init(&ctx->links_mu);
    ctx->failed = coh_calloc((size_t)(ctx->world > 0 ? ctx->world : 1), 1);
    ctx->back = coh_calloc((size_t)(ctx->world > 0 ? ctx->world : 1), sizeof(uint32_t));
    ctx->ctrl_addrs =
        coh_calloc((size_t)(ctx->world > 0 ? ctx->world : 1), sizeof(struct sockaddr_storage));
    ctx->same_host = coh_calloc((size_t)(ctx->world > 0 ? ctx->world : 1), 1);
    ctx->shm_peer = coh_calloc((size_t)(ctx->world > 0 ? ctx->world : 1), 1);
    ctx->shm_names = coh_calloc((size_t)(ctx->world > 0 ? ctx->world : 1), EN_SHM_NAME);
    ctx->host_hash = coh_calloc((size_t)(ctx->world > 0 ? ctx->world : 1), sizeof(uint64_t));
    ctx->host_idx = coh_calloc((size_t)(ctx->world > 0 ? ctx->world : 1), sizeof(int));
    ctx->regions = en_regtab_new();
    ctx->local_n = 1;
    ctx->world_comm.ctx = ctx;
    ctx->world_comm.id = 0;
    ctx->world_comm.rank = ctx->rank;
    ctx->world_comm.size = ctx->world;
    ctx->comms = &ctx->world_comm;
    int st = 0;
    uint64_t deadline = bs_now_ns() + (uint64_t)cfg_in->connect_timeout_ms * 1000000ull;
    if (!ctx->token_s || !ctx->nics_s || !ctx->sched_s || (cfg_in->store && !ctx->store_s) ||
        !ctx->failed || !ctx->back || !ctx->ctrl_addrs || !ctx->same_host || !ctx->shm_peer ||
        !ctx->regions || !ctx->shm_names || !ctx->host_hash || !ctx->host_idx) {
        st = bs_fail(COH_ENOMEM, "coh_init: out of memory");
        goto fail;
    }
    BS_CHECK_GOTO(host_identity(ctx), st, fail);
    BS_CHECK_GOTO(
        plan_knob("algo", "COHORT_ALGO", "ring", SC_ALGO_RING, "hd", SC_ALGO_HD, &ctx->ar_algo), st,
        fail);
    BS_CHECK_GOTO(plan_knob("small_algo", "COHORT_SMALL_ALGO", "rd", SC_ALGO_RD, "star",
                            SC_ALGO_STAR, &ctx->small_algo),
                  st, fail);
    BS_CHECK_GOTO(rx_env_knob_int("hier_local_msg_us", &ctx->msg_cpu_us), st, fail);
    ctx->cores = rx_config_cores();
    if (ctx->cfg.shm && ctx->world > 1 && !ctx->cfg.rejoin) {
        BS_CHECK_GOTO(rx_env_knob_str("shm_dir", &ctx->shm_dir), st, fail);
        /* Unique on the host: two jobs with one token (or two contexts of
         * one process) never share a socket. */
        static _Atomic unsigned nctx;
        snprintf(ctx->shm_name, sizeof(ctx->shm_name), "%d-%ld-%u", ctx->rank, (long)getpid(),
                 atomic_fetch_add(&nctx, 1));
    }
    ctx->event_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (ctx->event_fd < 0) {
        st = bs_fail(COH_ESYS, "eventfd: %s", strerror(errno));
        goto fail;
    }
    BS_CHECK_GOTO(parse_nics(ctx), st, fail);
    /* The scheduler's parameters and trace: here, on the caller's thread. */
    BS_CHECK_GOTO(rx_sched_cfg_load(&ctx->cfg, ctx->world, ctx->rank == ctx->cfg.coordinator,
                                    &ctx->sched_cfg),
                  st, fail);
    ctx->rails = coh_zalloc(sizeof(rx_rail_t) * (size_t)ctx->nrails);
    if (!ctx->rails) {
        st = bs_fail(COH_ENOMEM, "coh_init: out of memory");
        goto fail;
    }
    /* Before any thread that records into it starts. */
    BS_CHECK_GOTO(rx_trace_open(ctx), st, fail);
    if (ctx->world > 1) {
        /* Every rank's control reactor: its link to the coordinator; rank 0's
         * also serves the store, the coordinator's hosts the scheduler. */
        BS_CHECK_GOTO(rx_reactor_start(&ctx->ctrl, "cohort-ctrl", ctrl_on_stop, ctx), st, fail);
        ctx->ctrl_started = true;
        BS_CHECK_GOTO(next_incarnation(ctx, &ctx->incarnation), st, fail);
        if (ctx->rank == 0 && ctx->cfg.rejoin) {
            st = bs_fail(COH_EINVAL, "rank 0 cannot rejoin (COHORT_REJOIN): the job's store "
                                     "ran in its process and is gone");
            goto fail;
        }
        if (ctx->rank == 0) {
            int fd;
            BS_CHECK_GOTO(store_fd_pick(ctx, &fd), st, fail);
            ctx->cfg.store_fd = fd;
            /* A later init binds COHORT_STORE again, and the previous one's
             * listener can hold the port a moment longer (CI saw mp.lb.*
             * fail with EADDRINUSE at the second init): retry for up to 2 s
             * before failing with the bind's error. */
            st = rx_reactor_call(&ctx->ctrl, store_start_fn, ctx);
            for (int tries = 0; st < 0 && fd < 0 && tries < 40; tries++) {
                usleep(50000);
                st = rx_reactor_call(&ctx->ctrl, store_start_fn, ctx);
            }
            if (st < 0) goto fail;
        }
    }
    for (int r = 0; r < ctx->nrails; r++) {
        ctx->rail_locals[r] = (struct sockaddr *)&ctx->rail_addr[r];
        atomic_store(&ctx->rail_progress[r], bs_now_ns());
    }
    for (int r = 0; r < ctx->nrails; r++) {
        /* A datagram fills the interface's MTU (less the IP, UDP and cohort
         * headers): 1448 on Ethernet, 65k on loopback, where a syscall per
         * 1.4 KB costs more than the copy. */
        size_t seg = ctx->cfg.udp_seg_bytes;
        if (!seg) {
            int ip = ctx->rail_addr[r].ss_family == AF_INET6 ? 48 : 28;
            seg = (size_t)(rx_addr_mtu(&ctx->rail_addr[r]) - ip - EN_DG_HDR);
        }
        if (seg > 65000) seg = 65000;
        if (seg < 64) seg = 64;
        ctx->udp_seg[r] = (uint32_t)(seg & ~(size_t)7);
    }
    /* Spraying: the udp rails with the first one's datagram size (a flow's
     * segments are numbered in one size), up to EN_DG_PATHS of them. */
    ctx->udp_group = (en_udp_group_t){0};
    for (int r = 0; ctx->cfg.udp_spray && r < ctx->nrails; r++) {
        en_udp_group_t *g = &ctx->udp_group;
        if (ctx->rail_udp[r] && g->n < EN_DG_PATHS &&
            (g->n == 0 || ctx->udp_seg[r] == ctx->udp_seg[g->rail[0]]))
            g->rail[g->n++] = r;
    }
    if (ctx->udp_group.n < 2) ctx->udp_group.n = 0;
    for (int r = 0; r < ctx->nrails; r++) {
        en_rail_cfg_t rc = {
            .index = r,
            .rank = ctx->rank,
            .world = ctx->world,
            .nrails = ctx->nrails,
            .token = ctx->token_s,
            .timeout_ms = ctx->cfg.timeout_ms,
            .max_inflight = ctx->cfg.max_inflight,
            .sockbuf_bytes = ctx->cfg.sockbuf_bytes,
            .stash_bytes = ctx->cfg.stash_bytes,
            .spare_idle_ms = ctx->cfg.spare_idle_ms,
            .local = (struct sockaddr *)&ctx->rail_addr[r],
            /* A TCP link moves to another interface; a verbs link resumes
             * on a new QP of its device (en_verbs.c). */
            .failover = ctx->cfg.rail_failover != 0,
            .stall_ms = ctx->cfg.rail_stall_ms,
            .probe_ms = ctx->cfg.rail_probe_ms,
            .test_resume_delay_ms = test_resume_delay_ms(),
            .test_drop_probe = test_drop_probe(),
            .rejoin = ctx->cfg.rejoin != 0,
            .progress_ns = ctx->rail_progress,
            .locals = ctx->rail_locals,
            .observer = rx_lb_observer(ctx),
            .udp = ctx->rail_udp[r],
            .udpcfg = {.group = &ctx->udp_group,
                       .gidx = rx_udp_path(ctx, r),
                       .seg_bytes = ctx->udp_seg[r],
                       .rate_mbps = ctx->udp_rate[r] ? ctx->udp_rate[r] : ctx->cfg.udp_rate_mbps,
                       .delta = ctx->cfg.udp_delta_pct / 100.0,
                       .period_us = ctx->cfg.udp_period_us,
                       .rcvbuf_bytes = ctx->cfg.udp_rcvbuf_bytes,
                       .test_drop_ppm = test_udp_drop_ppm(),
                       .test_send_fail = test_udp_send_fail(),
                       .test_ctl_dgram_only = test_udp_ctl_dgram()},
            .shm_dir = ctx->shm_dir,
            .shm_name = ctx->shm_name,
            /* The launcher says how many ranks share the host before the mesh
             * does (COHORT_LOCAL_SIZE, LOCAL_WORLD_SIZE, ...). */
            .shm_ring_bytes =
                rx_config_shm_ring_bytes(&ctx->cfg, rx_config_local_size(), ctx->oversubscribed),
            .shm_cma_bytes = ctx->cfg.shm_cma_bytes};
        if (ctx->rail_verbs[r]) {
            st = verbs_cfg(ctx, r, &rc);
            if (st < 0) {
                ctx->nrails = r;
                goto fail;
            }
        }
        st = rx_rail_start(&ctx->rails[r], &rc, ctx->cfg.poll_us);
        if (st < 0) {
            char why[512];
            snprintf(why, sizeof(why), "%s", coh_last_error());
            ctx->nrails = r; /* stop only those that started */
            bs_fail(st, "%s", why);
            goto fail;
        }
    }
    if (ctx->world > 1) BS_CHECK_GOTO(rx_reactor_call(&ctx->ctrl, coord_start_fn, ctx), st, fail);
    BS_CHECK_GOTO(rx_lb_start(ctx), st, fail); /* before a table can arrive */
    BS_CHECK_GOTO(rx_gpu_init(ctx), st, fail);
    if (ctx->world > 1) BS_CHECK_GOTO(bootstrap(ctx, deadline), st, fail);
    describe(ctx);
    BS_CHECK_GOTO(reg_add(ctx), st, fail);
    atomic_store(&ctx->state, RX_CTX_RUNNING);
    *out = ctx;
    if (ctx->trace && rx_trace_measure_offset(ctx) < 0)
        bs_log(COH_LOG_WARN, "COHORT_TIMELINE: no clock offset measured (%s): 0 assumed",
               coh_last_error());
    return 0;
fail : {
    char why[512];
    snprintf(why, sizeof(why), "%s", coh_last_error());
    ctx_stop(ctx);
    ctx_fini(ctx);
    return bs_fail(st, "coh_init (rank %d of %d): %s", cfg_in->rank, cfg_in->world_size, why);
}
}

COH_API int coh_finalize(coh_ctx_t *ctx)
{
    if (!ctx) return bs_fail(COH_EINVAL, "coh_finalize: ctx is NULL");
    if (!reg_take(ctx))
        return bs_fail(COH_ESTATE, "coh_finalize: not a live context (finalized twice?)");
    atomic_store(&ctx->state, RX_CTX_FINALIZING);
    rx_lb_finalize(ctx);    /* world ops still waiting for a rail table fail */
    rx_gpu_finalizing(ctx); /* device ops fail; their peers hear while the rails carry it */
    /* close: what still runs ends now, cancelled (not after its timeout),
     * and every peer hears BYE. */
    for (int r = 0; r < ctx->nrails; r++) rx_rail_close(&ctx->rails[r]);
    /* Leave the schedule; the coordinator's rank then waits (up to the op
     * timeout) for the others to leave too, or they would lose it mid-run. */
    rx_member_close(ctx);
    if (ctx->coord)
        rx_coord_wait_idle(ctx->coord, bs_now_ns() + (uint64_t)ctx->cfg.timeout_ms * 1000000ull);
    /* Rails first: their running ops end (cancelled) and complete their
     * requests; then the store that may still serve late peers. */
    ctx_stop(ctx);
    rx_trace_close(ctx); /* every request has completed (and been recorded) */
    rx_ctx_unref(ctx);
    return 0;
}

void rx_ctx_ref(struct coh_ctx *ctx)
{
    atomic_fetch_add(&ctx->refs, 1);
}

void rx_ctx_unref(struct coh_ctx *ctx)
{
    if (atomic_fetch_sub(&ctx->refs, 1) == 1) ctx_fini(ctx);
}

static int ctx_ok(coh_ctx_t *ctx, const char *fn)
{
    if (!ctx) return bs_fail(COH_EINVAL, "%s: ctx is NULL", fn);
    if (atomic_load(&ctx->state) != RX_CTX_RUNNING)
        return bs_fail(COH_ESTATE, "%s: the context is finalizing", fn);
    return 0;
}

COH_API int coh_ctx_world(coh_ctx_t *ctx, coh_comm_t **world)
{
    BS_CHECK(ctx_ok(ctx, "coh_ctx_world"));
    if (!world) return bs_fail(COH_EINVAL, "coh_ctx_world: world is NULL");
    *world = &ctx->world_comm;
    return 0;
}

COH_API int coh_ctx_nrails(coh_ctx_t *ctx, int *nrails)
{
    BS_CHECK(ctx_ok(ctx, "coh_ctx_nrails"));
    if (!nrails) return bs_fail(COH_EINVAL, "coh_ctx_nrails: nrails is NULL");
    *nrails = ctx->nrails;
    return 0;
}

COH_API const char *coh_ctx_describe(coh_ctx_t *ctx)
{
    return ctx ? ctx->describe : "";
}

COH_API int coh_ctx_event_fd(coh_ctx_t *ctx, int *fd)
{
    BS_CHECK(ctx_ok(ctx, "coh_ctx_event_fd"));
    if (!fd) return bs_fail(COH_EINVAL, "coh_ctx_event_fd: fd is NULL");
    atomic_store(&ctx->event_fd_used, 1);
    *fd = ctx->event_fd;
    return 0;
}

COH_API int coh_ctx_event_clear(coh_ctx_t *ctx)
{
    BS_CHECK(ctx_ok(ctx, "coh_ctx_event_clear"));
    uint64_t v;
    while (read(ctx->event_fd, &v, sizeof(v)) > 0) {
    }
    return 0;
}

/* Adds rail en's counters to s. */
static void rail_stats_add(const en_rail_t *en, coh_stats_t *s)
{
    s->bytes_sent += atomic_load(&en->stat_bytes_out);
    s->bytes_received += atomic_load(&en->stat_bytes_in);
    s->connections_rejected += atomic_load(&en->stat_rejected);
    s->frames_invalid += atomic_load(&en->stat_bad_frames);
    s->rail_failovers += atomic_load(&en->stat_failovers);
    s->rail_returns += atomic_load(&en->stat_returns);
    s->rail_resent_bytes += atomic_load(&en->stat_resent);
    en_udp_stats_t us;
    en_udp_stats(en, &us);
    s->dg_sent += us.dg_sent;
    s->dg_received += us.dg_recv;
    s->dg_duplicate += us.dg_dup;
    s->dg_invalid += us.dg_bad;
    s->dg_stranger += us.dg_stranger;
    s->dg_late += us.dg_late;
    s->dg_kept += us.dg_kept;
    s->dg_dropped += us.dg_dropped;
    s->udp_nacks += us.nacks;
    s->udp_resent_bytes += us.resent_bytes;
    s->shm_bytes_sent += atomic_load(&en->stat_shm_out);
    s->shm_bytes_received += atomic_load(&en->stat_shm_in);
    s->shm_cma_bytes_received += atomic_load(&en->stat_cma_in);
    s->zcopy_bytes_sent += atomic_load(&en->stat_zcopy_out);
    s->mem_registrations += atomic_load(&en->stat_regs);
    s->rail_moves += atomic_load(&en->stat_moved);
}

COH_API int coh_ctx_rail_stats(coh_ctx_t *ctx, int rail, coh_stats_t *s)
{
    BS_CHECK(ctx_ok(ctx, "coh_ctx_rail_stats"));
    if (!s) return bs_fail(COH_EINVAL, "coh_ctx_rail_stats: stats is NULL");
    if (rail < 0 || rail >= ctx->nrails)
        return bs_fail(COH_EINVAL, "coh_ctx_rail_stats: rail %d of %d", rail, ctx->nrails);
    memset(s, 0, sizeof(*s));
    rail_stats_add(&ctx->rails[rail].en, s);
    return 0;
}

COH_API int coh_ctx_stats(coh_ctx_t *ctx, coh_stats_t *s)
{
    BS_CHECK(ctx_ok(ctx, "coh_ctx_stats"));
    if (!s) return bs_fail(COH_EINVAL, "coh_ctx_stats: stats is NULL");
    memset(s, 0, sizeof(*s));
    for (int r = 0; r < ctx->nrails; r++) rail_stats_add(&ctx->rails[r].en, s);
    /* Every listener's refusals: the rails', the store's and the coordinator's. */
    if (ctx->store) s->connections_rejected += rx_store_server_rejected(ctx->store);
    s->connections_rejected += rx_coord_rejected(ctx->coord);
    s->requests_completed = atomic_load(&ctx->n_completed);
    s->requests_failed = atomic_load(&ctx->n_failed);
    s->probes = atomic_load(&ctx->n_probes);
    s->syncs = atomic_load(&ctx->n_syncs);
    s->sync_wait_us = atomic_load(&ctx->sync_wait_ns) / 1000;
    s->sync_comm_us = atomic_load(&ctx->sync_comm_ns) / 1000;
    s->sync_members = atomic_load(&ctx->sync_members);
    s->sync_full = atomic_load(&ctx->sync_full);
    s->sync_relayed = atomic_load(&ctx->sync_relayed);
    s->sync_retries = atomic_load(&ctx->sync_retries);
    int nf = coh_comm_failed_ranks(&ctx->world_comm, NULL, 0);
    s->ranks_failed = nf > 0 ? (uint64_t)nf : 0;
    s->loss_bytes_expected = atomic_load(&ctx->loss_expected);
    s->loss_bytes_missed = atomic_load(&ctx->loss_missed);
    rx_gpu_stats(ctx, s);
    return 0;
}

COH_API int coh_ctx_links(coh_ctx_t *ctx, coh_link_probe_t *links, int cap)
{
    BS_CHECK(ctx_ok(ctx, "coh_ctx_links"));
    if (cap < 0 || (cap > 0 && !links)) return bs_fail(COH_EINVAL, "coh_ctx_links: bad buffer");
    uv_mutex_lock(&ctx->links_mu);
    int n = ctx->nlinks;
    if (n > 0 && cap > 0) memcpy(links, ctx->links, sizeof(*links) * (size_t)(n < cap ? n : cap));
    uv_mutex_unlock(&ctx->links_mu);
    return n;
}

COH_API int coh_comm_rank(const coh_comm_t *comm, int *rank)
{
    if (!comm || !rank) return bs_fail(COH_EINVAL, "coh_comm_rank: NULL argument");
    *rank = comm->rank;
    return 0;
}

COH_API int coh_comm_size(const coh_comm_t *comm, int *size)
{
    if (!comm || !size) return bs_fail(COH_EINVAL, "coh_comm_size: NULL argument");
    *size = comm->size;
    return 0;
}

/* ---- memory declared for zero copy ---- */

COH_API int coh_mem_register(coh_ctx_t *ctx, const void *ptr, size_t bytes)
{
    if (!ctx || !rx_ctx_alive(ctx))
        return bs_fail(COH_EINVAL, "coh_mem_register: not a live context");
    return en_regtab_add(ctx->regions, ptr, bytes);
}

COH_API int coh_mem_deregister(coh_ctx_t *ctx, const void *ptr)
{
    if (!ctx || !rx_ctx_alive(ctx))
        return bs_fail(COH_EINVAL, "coh_mem_deregister: not a live context");
    return en_regtab_remove(ctx->regions, ptr);
}
