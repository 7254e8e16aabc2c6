/*
 * Configuration: documented defaults, then the environment, all from the
 * one table in rx_config.h. The launchers cohort understands are recognised
 * by their variables: cohortrun (COHORT_*), torchrun (RANK, WORLD_SIZE,
 * MASTER_ADDR, MASTER_PORT), Open MPI's mpirun (OMPI_COMM_WORLD_*), PMI,
 * Slurm (SLURM_PROCID, SLURM_NTASKS).
 */
#include "reactor/rx_config.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "reactor/reactor.h"

static const rx_knob_t knobs[] = {
#define RX__FIELD(f, k, d, e, lo, hi, h) {#f, k, d, e, lo, hi, h, offsetof(coh_config_t, f)},
    RX_CONFIG_MAP(RX__FIELD)
#undef RX__FIELD
#define RX__ENV(f, k, d, e, lo, hi, h) {#f, k, d, e, lo, hi, h, -1},
        RX_ENV_MAP(RX__ENV)
#undef RX__ENV
};
#define NKNOBS ((int)(sizeof(knobs) / sizeof(knobs[0])))

const rx_knob_t *rx_knobs(int *count)
{
    if (count) *count = NKNOBS;
    return knobs;
}

const rx_knob_t *rx_knob_find(const char *name)
{
    for (int i = 0; name && i < NKNOBS; i++)
        if (knobs[i].off >= 0 && !strcmp(knobs[i].name, name)) return &knobs[i];
    return NULL;
}

static const rx_knob_t *env_knob(const char *name)
{
    for (int i = 0; i < NKNOBS; i++)
        if (knobs[i].off < 0 && !strcmp(knobs[i].name, name)) return &knobs[i];
    return NULL;
}

static int knob_parse(const rx_knob_t *k, const char *text, const char *where, void *out);

int rx_env_knob_int(const char *name, int *out)
{
    const rx_knob_t *k = env_knob(name);
    if (!k || k->kind != RX_K_INT) return bs_fail(COH_EINVAL, "no int knob %s", name);
    const char *v = getenv(k->env);
    return knob_parse(k, v && *v ? v : k->deflt, v && *v ? k->env : "default", out);
}

int rx_env_knob_size(const char *name, size_t *out)
{
    const rx_knob_t *k = env_knob(name);
    if (!k || k->kind != RX_K_SIZE) return bs_fail(COH_EINVAL, "no size knob %s", name);
    const char *v = getenv(k->env);
    return knob_parse(k, v && *v ? v : k->deflt, v && *v ? k->env : "default", out);
}

int rx_env_knob_str(const char *name, const char **out)
{
    const rx_knob_t *k = env_knob(name);
    if (!k || k->kind != RX_K_STR) return bs_fail(COH_EINVAL, "no string knob %s", name);
    const char *v = getenv(k->env);
    return knob_parse(k, v ? v : k->deflt, v ? k->env : "default", out);
}

static bool in_range(long long v, const rx_knob_t *k)
{
    return v >= k->lo && (v < 0 || (unsigned long long)v <= k->hi);
}

/* Parse text as k's kind into out (int, size_t or const char *). Messages
 * name the source and quote the value. */
static int knob_parse(const rx_knob_t *k, const char *text, const char *where, void *out)
{
    const char *t = text ? text : "";
    switch (k->kind) {
    case RX_K_INT: {
        errno = 0;
        char *end;
        long v = strtol(t, &end, 10);
        if (errno || end == t || *end || v < INT_MIN || v > INT_MAX)
            return bs_fail(COH_EINVAL, "%s: '%s' is not an integer in [%lld, %llu]", where, t,
                           k->lo, k->hi);
        if (!in_range(v, k))
            return bs_fail(COH_EINVAL, "%s: %ld is outside [%lld, %llu]", where, v, k->lo, k->hi);
        *(int *)out = (int)v;
        return 0;
    }
    case RX_K_SIZE: {
        uint64_t v;
        if (bs_parse_size(t, &v) != 0 || v > SIZE_MAX)
            return bs_fail(COH_EINVAL,
                           "%s: '%s' is not a size (an integer with an optional K, M or G)", where,
                           t);
        if ((long long)v < k->lo || v > k->hi)
            return bs_fail(COH_EINVAL, "%s: %llu is outside [%lld, %llu]", where,
                           (unsigned long long)v, k->lo, k->hi);
        *(size_t *)out = (size_t)v;
        return 0;
    }
    case RX_K_STR: {
        size_t n = strlen(t);
        if ((long long)n < k->lo)
            return k->lo == 1 ? bs_fail(COH_EINVAL, "%s: empty", where)
                              : bs_fail(COH_EINVAL, "%s: shorter than %lld bytes", where, k->lo);
        if (n > k->hi)
            return bs_fail(COH_EINVAL, "%s: %zu bytes, longer than the limit of %llu", where, n,
                           k->hi);
        *(const char **)out = text;
        return 0;
    }
    case RX_K_MODE: {
        coh_sync_mode m;
        if (coh_sync_mode_from_name(t, &m) < 0)
            return bs_fail(COH_EINVAL,
                           "%s: unknown value '%s' (one of allreduce, partial, selective, relay)",
                           where, t);
        *(int *)out = (int)m;
        return 0;
    }
    }
    return bs_fail(COH_EINTERNAL, "%s: unknown knob kind", where);
}

int rx_knob_set(coh_config_t *cfg, const rx_knob_t *k, const char *text, const char *where)
{
    union {
        int i;
        size_t z;
        const char *s;
    } tmp;
    void *out = k->off >= 0 ? (char *)cfg + k->off : (void *)&tmp;
    return knob_parse(k, text, where, out);
}

static const char *env_str(const char *name)
{
    const char *s = getenv(name);
    return s && *s ? s : NULL;
}

/* An integer environment variable, bounds [lo, hi]: 1 when set and good,
 * 0 when unset, COH_EINVAL naming the variable. */
static int env_int(const char *name, int *out, long lo, long hi)
{
    const char *s = env_str(name);
    if (!s) return 0;
    errno = 0;
    char *end;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return bs_fail(COH_EINVAL, "%s=\"%s\": expected an integer in [%ld, %ld]", name, s, lo, hi);
    *out = (int)v;
    return 1;
}

COH_API int coh_config_init(coh_config_t *cfg)
{
    if (!cfg) return bs_fail(COH_EINVAL, "coh_config_init: cfg is NULL");
    memset(cfg, 0, sizeof(*cfg));
    for (int i = 0; i < NKNOBS && knobs[i].off >= 0; i++)
        BS_CHECK(rx_knob_set(cfg, &knobs[i], knobs[i].deflt, "default"));
    cfg->store = NULL; /* "" is the table's way of saying "none" */

    /* Rank and world size: the first launcher whose variables are set. */
    static const char *const launchers[][2] = {{"COHORT_RANK", "COHORT_WORLD_SIZE"},
                                               {"RANK", "WORLD_SIZE"},
                                               {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
                                               {"PMI_RANK", "PMI_SIZE"},
                                               {"SLURM_PROCID", "SLURM_NTASKS"}};
    for (size_t i = 0; i < sizeof(launchers) / sizeof(launchers[0]); i++) {
        if (!env_str(launchers[i][0]) || !env_str(launchers[i][1])) continue;
        int r, w;
        if (env_int(launchers[i][1], &w, 1, RX_MAX_WORLD) < 0) return COH_EINVAL;
        if (env_int(launchers[i][0], &r, 0, w - 1) < 0) return COH_EINVAL;
        cfg->rank = r;
        cfg->world_size = w;
        break;
    }

    const char *store = env_str("COHORT_STORE");
    if (store) {
        BS_CHECK(rx_knob_set(cfg, rx_knob_find("store"), store, "COHORT_STORE"));
    } else if (env_str("MASTER_ADDR") && env_str("MASTER_PORT")) {
        /* torchrun's agent already serves its own store on MASTER_PORT. */
        int port, off = 1;
        if (env_int("MASTER_PORT", &port, 1, 65535) < 0) return COH_EINVAL;
        const rx_knob_t *ko = env_knob("store_port_offset");
        if (env_str(ko->env) && knob_parse(ko, env_str(ko->env), ko->env, &off) < 0)
            return COH_EINVAL;
        if (port + off > 65535)
            return bs_fail(COH_EINVAL, "MASTER_PORT + COHORT_STORE_PORT_OFFSET > 65535");
        const char *addr = env_str("MASTER_ADDR");
        snprintf(cfg->_storage, sizeof(cfg->_storage), strchr(addr, ':') ? "[%s]:%d" : "%s:%d",
                 addr, port + off);
        cfg->store = cfg->_storage;
    }
    /* Every other field from its variable, parsed and bounded by the table. */
    for (int i = 0; i < NKNOBS && knobs[i].off >= 0; i++) {
        const rx_knob_t *k = &knobs[i];
        if (k->off == offsetof(coh_config_t, rank) ||
            k->off == offsetof(coh_config_t, world_size) || k->off == offsetof(coh_config_t, store))
            continue;
        const char *v = env_str(k->env);
        if (v) BS_CHECK(rx_knob_set(cfg, k, v, k->env));
    }
    return 0;
}

int rx_config_validate(const coh_config_t *cfg)
{
    for (int i = 0; i < NKNOBS && knobs[i].off >= 0; i++) {
        const rx_knob_t *k = &knobs[i];
        const char *p = (const char *)cfg + k->off;
        char where[64];
        snprintf(where, sizeof(where), "config field %s", k->name);
        switch (k->kind) {
        case RX_K_INT:
        case RX_K_MODE: {
            int v = *(const int *)p;
            if (!in_range(v, k))
                return bs_fail(COH_EINVAL, "%s = %d is outside [%lld, %llu]", where, v, k->lo,
                               k->hi);
            break;
        }
        case RX_K_SIZE: {
            size_t v = *(const size_t *)p;
            if ((long long)v < k->lo || v > k->hi)
                return bs_fail(COH_EINVAL, "%s = %zu is outside [%lld, %llu]", where, v, k->lo,
                               k->hi);
            break;
        }
        case RX_K_STR: {
            const char *s = *(const char *const *)p;
            size_t n = s ? strlen(s) : 0;
            if ((long long)n < k->lo || n > k->hi)
                return bs_fail(COH_EINVAL, "%s: %zu bytes, expected %lld to %llu (%s)", where, n,
                               k->lo, k->hi, k->env);
            break;
        }
        }
    }
    if (cfg->rank >= cfg->world_size)
        return bs_fail(COH_EINVAL, "rank %d is outside [0, %d)", cfg->rank, cfg->world_size);
    if (cfg->world_size > 1 && (!cfg->store || !*cfg->store))
        return bs_fail(COH_EINVAL,
                       "world_size %d needs a store address: set COHORT_STORE=host:port "
                       "(or MASTER_ADDR and MASTER_PORT)",
                       cfg->world_size);
    if (cfg->coordinator >= cfg->world_size)
        return bs_fail(COH_EINVAL, "coordinator %d is not a rank of %d", cfg->coordinator,
                       cfg->world_size);
    return 0;
}

/* Ranks on this host, as the launcher says (COHORT_LOCAL_SIZE, torchrun's
 * LOCAL_WORLD_SIZE, Open MPI's OMPI_COMM_WORLD_LOCAL_SIZE); 1 if none does. */
int rx_config_local_size(void)
{
    static const char *const vars[] = {"COHORT_LOCAL_SIZE", "LOCAL_WORLD_SIZE",
                                       "OMPI_COMM_WORLD_LOCAL_SIZE"};
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
        const char *v = getenv(vars[i]);
        if (v && atol(v) > 0 && atol(v) <= RX_MAX_WORLD) return (int)atol(v);
    }
    return 1;
}

/* Online CPUs of this host (every rank on it reads the same); 0 if unknown. */
int rx_config_cores(void)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    return cpus > 0 && cpus <= INT_MAX ? (int)cpus : 0;
}

/* More ranks on this host than cores. */
bool rx_config_oversubscribed(void)
{
    int cores = rx_config_cores();
    return cores > 0 && rx_config_local_size() > cores;
}

/* How long coh_wait drives the loop before sleeping. Auto (-1): 5 ms.
 * Longer than the kernel's time slice (a 4 ms tick here): with one runnable
 * thread more than cores (2 ranks, a busy process, 2 cores), a 2 ms spin ran
 * out while the peer waited for the busy process's slice; the waiter slept,
 * was woken on its peer's core, and the two stayed there (the busy process
 * had the other core), each op then waiting for the other rank's spin to run
 * out: 4 KiB mean 370-1470 us, p90 4 ms; spinning 5 ms, 45-105 us, p90
 * 16-135 us, Open MPI 56-105 (docs/perf.md "Waiting under contention",
 * tests/mp/contention.sh). It also covers ops up to a few MiB: a waiter that
 * gives up earlier hands the op back to the loop thread mid-way, and that
 * hand-off cost 256 KiB on 2 ranks half its bandwidth at 100 us. On a host
 * with more ranks than cores the waiter yields after every pass that moved
 * nothing (coh_wait): 4 ranks on 2 cores, 4 KiB over shared memory, 25 us
 * against 126 us without spinning (and 400-1200 us when the spin did not
 * yield). */
int rx_config_spin_us(const coh_config_t *cfg)
{
    return cfg->spin_us >= 0 ? cfg->spin_us : 5000;
}

/* Each rank populates a ring per peer on its host per rail. A ring that
 * stays in cache costs little to copy through: 4 ranks on 2 cores, 1 MiB
 * allreduce, 4 MiB rings took about 1.7x the time of 1 MiB ones (and more
 * than reading the sender's memory, which pins its pages on every read:
 * docs/shm.md). But with more ranks than cores a writer and its reader
 * rarely run at once: a larger ring is fewer sleeps and wake-ups per byte.
 * 4 ranks on 2 cores with 2 MiB rings (2026-11-28): 4 / 16 / 64 MiB 20%,
 * 10%, 15% faster, 4 KiB-1 MiB unchanged; 2 ranks on 2 cores 20-40% slower
 * from 16 MiB. Auto: 1 MiB (2 MiB oversubscribed) up to 65 (33) ranks on
 * the host, then halving so a rank's rings on one rail stay within 64 MiB,
 * down to 256 KiB. Frames of
 * COHORT_SHM_CMA_BYTES and more do not pass through the ring (a descriptor
 * does). local_n is the launcher's count of ranks on the host
 * (COHORT_LOCAL_SIZE): the mesh learns who shares it only after the first
 * rings exist. A reader maps a ring by
 * its own size, so the two ends need not agree. */
size_t rx_config_shm_ring_bytes(const coh_config_t *cfg, int local_n, bool oversubscribed)
{
    if (cfg->shm_ring_bytes) return cfg->shm_ring_bytes;
    size_t cap = (size_t)1 << (oversubscribed ? 21 : 20);
    size_t per = local_n > 1 ? ((size_t)64 << 20) / (size_t)(local_n - 1) : cap;
    size_t rb = (size_t)256 << 10;
    while (rb * 2 <= per && rb < cap) rb *= 2;
    return rb;
}
