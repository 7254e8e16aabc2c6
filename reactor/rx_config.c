/*
 * Configuration: documented defaults, then the environment. The launchers
 * cohort understands are recognised by their variables: cohortrun
 * (COHORT_*), torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), Open
 * MPI's mpirun (OMPI_COMM_WORLD_*), Slurm (SLURM_PROCID, SLURM_NTASKS).
 */
#include "reactor/reactor.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int env_int(const char *name, int *out, int lo, int hi)
{
    const char *s = getenv(name);
    if (!s || !*s) return 0;
    errno = 0;
    char *end;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return bs_fail(COH_EINVAL, "%s=\"%s\": expected an integer in [%d, %d]", name, s, lo, hi);
    *out = (int)v;
    return 1;
}

static int env_size(const char *name, size_t *out, uint64_t lo)
{
    const char *s = getenv(name);
    if (!s || !*s) return 0;
    uint64_t v;
    if (bs_parse_size(s, &v) != 0 || v < lo)
        return bs_fail(COH_EINVAL, "%s=\"%s\": expected a size >= %llu (suffixes K, M, G)", name, s,
                       (unsigned long long)lo);
    *out = (size_t)v;
    return 1;
}

static const char *env_str(const char *name)
{
    const char *s = getenv(name);
    return s && *s ? s : NULL;
}

COH_API int coh_config_init(coh_config_t *cfg)
{
    if (!cfg) return bs_fail(COH_EINVAL, "coh_config_init: cfg is NULL");
    memset(cfg, 0, sizeof(*cfg));
    cfg->rank = 0;
    cfg->world_size = 1;
    cfg->nics = "lo";
    cfg->token = "";
    cfg->timeout_ms = 10000;
    cfg->connect_timeout_ms = 60000;
    cfg->chunk_bytes = 1 << 20;
    cfg->small_bytes = 64 << 10;
    cfg->rail_min_bytes = 1 << 20;
    cfg->spin_us = -1; /* auto: see rx_config_spin_us */
    cfg->stash_bytes = 64 << 20;
    cfg->sync_mode = COH_SYNC_SELECTIVE;
    cfg->coordinator = 0;
    cfg->tick_ms = 2;
    cfg->sched = "";
    cfg->poll_us = 50;
    cfg->store_fd = -1;
    cfg->sockbuf_bytes = 0;

    /* Rank and world size: the first launcher whose variables are set. */
    static const char *const launchers[][2] = {{"COHORT_RANK", "COHORT_WORLD_SIZE"},
                                               {"RANK", "WORLD_SIZE"},
                                               {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
                                               {"PMI_RANK", "PMI_SIZE"},
                                               {"SLURM_PROCID", "SLURM_NTASKS"}};
    for (size_t i = 0; i < sizeof(launchers) / sizeof(launchers[0]); i++) {
        if (!env_str(launchers[i][0]) || !env_str(launchers[i][1])) continue;
        int r, w;
        if (env_int(launchers[i][1], &w, 1, 1 << 20) < 0) return COH_EINVAL;
        if (env_int(launchers[i][0], &r, 0, w - 1) < 0) return COH_EINVAL;
        cfg->rank = r;
        cfg->world_size = w;
        break;
    }

    const char *store = env_str("COHORT_STORE");
    if (store) {
        cfg->store = store;
    } else if (env_str("MASTER_ADDR") && env_str("MASTER_PORT")) {
        /* torchrun's agent already serves its own store on MASTER_PORT. */
        int port;
        if (env_int("MASTER_PORT", &port, 1, 65535) < 0) return COH_EINVAL;
        int off = 1;
        if (env_int("COHORT_STORE_PORT_OFFSET", &off, 0, 1000) < 0) return COH_EINVAL;
        if (port + off > 65535)
            return bs_fail(COH_EINVAL, "MASTER_PORT + COHORT_STORE_PORT_OFFSET > 65535");
        const char *addr = env_str("MASTER_ADDR");
        snprintf(cfg->_storage, sizeof(cfg->_storage), strchr(addr, ':') ? "[%s]:%d" : "%s:%d",
                 addr, port + off);
        cfg->store = cfg->_storage;
    }
    if (env_str("COHORT_TOKEN")) cfg->token = env_str("COHORT_TOKEN");
    if (env_str("COHORT_NICS")) cfg->nics = env_str("COHORT_NICS");
    if (env_int("COHORT_TIMEOUT_MS", &cfg->timeout_ms, 1, INT_MAX) < 0) return COH_EINVAL;
    if (env_int("COHORT_CONNECT_TIMEOUT_MS", &cfg->connect_timeout_ms, 1, INT_MAX) < 0)
        return COH_EINVAL;
    if (env_size("COHORT_CHUNK_BYTES", &cfg->chunk_bytes, 1) < 0) return COH_EINVAL;
    if (env_size("COHORT_SMALL_BYTES", &cfg->small_bytes, 0) < 0) return COH_EINVAL;
    if (env_size("COHORT_RAIL_MIN_BYTES", &cfg->rail_min_bytes, 0) < 0) return COH_EINVAL;
    if (env_int("COHORT_SPIN_US", &cfg->spin_us, -1, 1000000) < 0) return COH_EINVAL;
    if (env_int("COHORT_STORE_FD", &cfg->store_fd, -1, INT_MAX) < 0) return COH_EINVAL;
    if (env_int("COHORT_POLL_US", &cfg->poll_us, 0, 1000000) < 0) return COH_EINVAL;
    if (env_str("COHORT_SYNC_MODE")) {
        coh_sync_mode m;
        if (coh_sync_mode_from_name(env_str("COHORT_SYNC_MODE"), &m) < 0)
            return bs_fail(COH_EINVAL,
                           "COHORT_SYNC_MODE=\"%s\": expected allreduce, partial or "
                           "selective",
                           env_str("COHORT_SYNC_MODE"));
        cfg->sync_mode = m;
    }
    if (env_int("COHORT_COORDINATOR", &cfg->coordinator, 0, INT_MAX) < 0) return COH_EINVAL;
    if (env_int("COHORT_TICK_MS", &cfg->tick_ms, 1, 10000) < 0) return COH_EINVAL;
    if (env_str("COHORT_SCHED")) cfg->sched = env_str("COHORT_SCHED");
    if (env_size("COHORT_SOCKBUF_BYTES", &cfg->sockbuf_bytes, 0) < 0) return COH_EINVAL;
    if (env_size("COHORT_STASH_BYTES", &cfg->stash_bytes, 0) < 0) return COH_EINVAL;
    return 0;
}

int rx_config_validate(const coh_config_t *cfg)
{
    if (cfg->world_size < 1) return bs_fail(COH_EINVAL, "world_size %d < 1", cfg->world_size);
    if (cfg->rank < 0 || cfg->rank >= cfg->world_size)
        return bs_fail(COH_EINVAL, "rank %d is outside [0, %d)", cfg->rank, cfg->world_size);
    if (cfg->world_size > 1 && (!cfg->store || !*cfg->store))
        return bs_fail(COH_EINVAL,
                       "world_size %d needs a store address: set COHORT_STORE=host:port "
                       "(or MASTER_ADDR and MASTER_PORT)",
                       cfg->world_size);
    if (!cfg->nics || !*cfg->nics) return bs_fail(COH_EINVAL, "no NIC configured (COHORT_NICS)");
    if (cfg->timeout_ms < 1) return bs_fail(COH_EINVAL, "timeout_ms must be >= 1");
    if (cfg->connect_timeout_ms < 1) return bs_fail(COH_EINVAL, "connect_timeout_ms must be >= 1");
    if (cfg->chunk_bytes < 1) return bs_fail(COH_EINVAL, "chunk_bytes must be >= 1");
    if (cfg->spin_us < -1) return bs_fail(COH_EINVAL, "spin_us must be >= -1 (auto)");
    if (cfg->poll_us < 0) return bs_fail(COH_EINVAL, "poll_us must be >= 0");
    if (cfg->sync_mode < 0 || cfg->sync_mode >= COH_SYNC_MODE_COUNT)
        return bs_fail(COH_EINVAL, "sync_mode %d is not a mode", cfg->sync_mode);
    if (cfg->coordinator < 0 || cfg->coordinator >= cfg->world_size)
        return bs_fail(COH_EINVAL, "coordinator %d is not a rank of %d", cfg->coordinator,
                       cfg->world_size);
    if (cfg->tick_ms < 1) return bs_fail(COH_EINVAL, "tick_ms must be >= 1");
    if (cfg->token && strlen(cfg->token) > 64)
        return bs_fail(COH_EINVAL, "the job token is longer than 64 bytes");
    return 0;
}

/* How long coh_wait drives the loop before sleeping. Auto (-1): 2 ms when
 * this host has a core per local rank, else 0: a waiter that spins on an
 * oversubscribed host takes the core its peers need (measured: 4 ranks on 2
 * cores, 4 KiB allreduce 230 us without, 400-1200 us with). 2 ms covers ops up
 * to a few MiB: a waiter that gives up earlier hands the op back to the loop
 * thread mid-way, and that hand-off cost 256 KiB on 2 ranks half its
 * bandwidth at 100 us. The local rank
 * count comes from the launcher (COHORT_LOCAL_SIZE, torchrun's
 * LOCAL_WORLD_SIZE, Open MPI's OMPI_COMM_WORLD_LOCAL_SIZE). */
int rx_config_spin_us(const coh_config_t *cfg)
{
    if (cfg->spin_us >= 0) return cfg->spin_us;
    static const char *const vars[] = {"COHORT_LOCAL_SIZE", "LOCAL_WORLD_SIZE",
                                       "OMPI_COMM_WORLD_LOCAL_SIZE"};
    long local = 1;
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
        const char *v = getenv(vars[i]);
        if (v && atol(v) > 0) {
            local = atol(v);
            break;
        }
    }
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    return cpus > 0 && local <= cpus ? 2000 : 0;
}
