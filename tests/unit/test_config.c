/*
 * coh_config_init: the documented defaults, then the environment of the
 * launchers cohort understands (cohortrun, torchrun, Open MPI, Slurm), their
 * precedence, sizes with suffixes, and refusals that name the variable.
 *
 * Every variable coh_config_init reads is cleared before and after each
 * test; whatever the process inherited is put back at the end.
 */
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "cohort.h"
#include "reactor/reactor.h"

static const char *const VARS[] = {
    "COHORT_RANK",
    "COHORT_WORLD_SIZE",
    "RANK",
    "WORLD_SIZE",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "PMI_RANK",
    "PMI_SIZE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "COHORT_STORE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "COHORT_STORE_PORT_OFFSET",
    "COHORT_TOKEN",
    "COHORT_NICS",
    "COHORT_TIMEOUT_MS",
    "COHORT_CONNECT_TIMEOUT_MS",
    "COHORT_CHUNK_BYTES",
    "COHORT_SMALL_BYTES",
    "COHORT_RAIL_MIN_BYTES",
    "COHORT_SPIN_US",
    "COHORT_LOCAL_SIZE",
    "LOCAL_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "COHORT_STORE_FD",
    "COHORT_POLL_US",
    "COHORT_SOCKBUF_BYTES",
};
#define NVARS (sizeof(VARS) / sizeof(VARS[0]))

static char *saved[NVARS];

static void clear_all(void)
{
    for (size_t i = 0; i < NVARS; i++) unsetenv(VARS[i]);
}

static int setup(void **state)
{
    (void)state;
    clear_all();
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    clear_all();
    return 0;
}

static void set(const char *name, const char *value)
{
    assert_int_equal(setenv(name, value, 1), 0);
}

static void init_ok(coh_config_t *cfg)
{
    int st = coh_config_init(cfg);
    if (st != 0) print_error("coh_config_init: %s\n", coh_last_error());
    assert_int_equal(st, 0);
}

/* Refused with COH_EINVAL, and coh_last_error() names the variable. */
static void init_refused(const char *var)
{
    coh_config_t cfg;
    int st = coh_config_init(&cfg);
    if (st != COH_EINVAL || !strstr(coh_last_error(), var))
        print_error("want EINVAL naming %s; got %d \"%s\"\n", var, st, coh_last_error());
    assert_int_equal(st, COH_EINVAL);
    assert_non_null(strstr(coh_last_error(), var));
}

static void test_defaults(void **state)
{
    (void)state;
    coh_config_t cfg;
    memset(&cfg, 0x5A, sizeof(cfg)); /* every field is set, nothing is left over */
    init_ok(&cfg);
    assert_int_equal(cfg.rank, 0);
    assert_int_equal(cfg.world_size, 1);
    assert_null(cfg.store);
    assert_non_null(cfg.token);
    assert_string_equal(cfg.token, "");
    assert_string_equal(cfg.nics, "lo");
    assert_int_equal(cfg.timeout_ms, 300000);
    assert_int_equal(cfg.connect_timeout_ms, 60000);
    assert_int_equal(cfg.chunk_bytes, 1 << 20);
    assert_int_equal(cfg.small_bytes, 64 << 10);
    assert_int_equal(cfg.rail_min_bytes, 1 << 20);
    assert_int_equal(cfg.spin_us, -1); /* cohort.h: auto (2 ms with a core per local rank) */
    assert_int_equal(cfg.poll_us, 50);
    assert_int_equal(cfg.store_fd, -1);
    assert_int_equal(cfg.sockbuf_bytes, 0);
    /* empty values count as unset */
    for (size_t i = 0; i < NVARS; i++) set(VARS[i], "");
    coh_config_t again;
    init_ok(&again);
    assert_int_equal(again.rank, 0);
    assert_int_equal(again.world_size, 1);
    assert_null(again.store);
    assert_string_equal(again.nics, "lo");
    assert_int_equal(again.timeout_ms, 300000);
    assert_int_equal(again.chunk_bytes, 1 << 20);
    /* NULL is refused */
    assert_int_equal(coh_config_init(NULL), COH_EINVAL);
    assert_non_null(strstr(coh_last_error(), "NULL"));
}

static void test_cohort_vars(void **state)
{
    (void)state;
    set("COHORT_RANK", "3");
    set("COHORT_WORLD_SIZE", "8");
    set("COHORT_STORE", "10.1.2.3:7000");
    set("COHORT_TOKEN", "s3cret");
    set("COHORT_NICS", "eth0,eth1");
    set("COHORT_TIMEOUT_MS", "2500");
    set("COHORT_CONNECT_TIMEOUT_MS", "1");
    set("COHORT_SPIN_US", "1000000");
    set("COHORT_POLL_US", "0");
    set("COHORT_STORE_FD", "7");
    coh_config_t cfg;
    init_ok(&cfg);
    assert_int_equal(cfg.rank, 3);
    assert_int_equal(cfg.world_size, 8);
    assert_string_equal(cfg.store, "10.1.2.3:7000");
    assert_string_equal(cfg.token, "s3cret");
    assert_string_equal(cfg.nics, "eth0,eth1");
    assert_int_equal(cfg.timeout_ms, 2500);
    assert_int_equal(cfg.connect_timeout_ms, 1);
    assert_int_equal(cfg.spin_us, 1000000);
    assert_int_equal(cfg.poll_us, 0);
    assert_int_equal(cfg.store_fd, 7);
    /* COHORT_STORE wins over torchrun's MASTER_* */
    set("MASTER_ADDR", "node0");
    set("MASTER_PORT", "29500");
    init_ok(&cfg);
    assert_string_equal(cfg.store, "10.1.2.3:7000");
    /* the extremes of the ranges */
    set("COHORT_RANK", "0");
    set("COHORT_WORLD_SIZE", "1");
    set("COHORT_TIMEOUT_MS", "2147483647");
    set("COHORT_STORE_FD", "-1");
    init_ok(&cfg);
    assert_int_equal(cfg.rank, 0);
    assert_int_equal(cfg.world_size, 1);
    assert_int_equal(cfg.timeout_ms, INT_MAX);
    assert_int_equal(cfg.store_fd, -1);
    set("COHORT_RANK", "1048575");
    set("COHORT_WORLD_SIZE", "1048576");
    init_ok(&cfg);
    assert_int_equal(cfg.rank, 1048575);
    assert_int_equal(cfg.world_size, 1048576);
}

static void test_torchrun(void **state)
{
    (void)state;
    set("RANK", "2");
    set("WORLD_SIZE", "4");
    set("MASTER_ADDR", "node0.cluster");
    set("MASTER_PORT", "29500");
    coh_config_t cfg;
    init_ok(&cfg);
    assert_int_equal(cfg.rank, 2);
    assert_int_equal(cfg.world_size, 4);
    /* torchrun's own store is on MASTER_PORT: cohort's is on the next port */
    assert_string_equal(cfg.store, "node0.cluster:29501");
    set("COHORT_STORE_PORT_OFFSET", "10");
    init_ok(&cfg);
    assert_string_equal(cfg.store, "node0.cluster:29510");
    set("COHORT_STORE_PORT_OFFSET", "0");
    init_ok(&cfg);
    assert_string_equal(cfg.store, "node0.cluster:29500");
    unsetenv("COHORT_STORE_PORT_OFFSET");
    /* an IPv6 address gets brackets */
    set("MASTER_ADDR", "fe80::1");
    init_ok(&cfg);
    assert_string_equal(cfg.store, "[fe80::1]:29501");
    /* the largest port that leaves room for the offset */
    set("MASTER_ADDR", "10.0.0.1");
    set("MASTER_PORT", "65534");
    init_ok(&cfg);
    assert_string_equal(cfg.store, "10.0.0.1:65535");
    set("COHORT_STORE_PORT_OFFSET", "2");
    init_refused("COHORT_STORE_PORT_OFFSET");
    unsetenv("COHORT_STORE_PORT_OFFSET");
    set("MASTER_PORT", "0");
    init_refused("MASTER_PORT");
    set("MASTER_PORT", "65535");
    init_refused("MASTER_PORT");
    set("MASTER_PORT", "http");
    init_refused("MASTER_PORT");
    set("MASTER_PORT", "29500");
    set("COHORT_STORE_PORT_OFFSET", "1001");
    init_refused("COHORT_STORE_PORT_OFFSET");
    set("COHORT_STORE_PORT_OFFSET", "-1");
    init_refused("COHORT_STORE_PORT_OFFSET");
    unsetenv("COHORT_STORE_PORT_OFFSET");
    /* an address without a port is no store */
    unsetenv("MASTER_PORT");
    init_ok(&cfg);
    assert_null(cfg.store);
}

static void test_mpi_and_slurm(void **state)
{
    (void)state;
    coh_config_t cfg;
    set("OMPI_COMM_WORLD_RANK", "5");
    set("OMPI_COMM_WORLD_SIZE", "6");
    init_ok(&cfg);
    assert_int_equal(cfg.rank, 5);
    assert_int_equal(cfg.world_size, 6);
    unsetenv("OMPI_COMM_WORLD_RANK");
    unsetenv("OMPI_COMM_WORLD_SIZE");

    set("SLURM_PROCID", "11");
    set("SLURM_NTASKS", "12");
    init_ok(&cfg);
    assert_int_equal(cfg.rank, 11);
    assert_int_equal(cfg.world_size, 12);

    set("PMI_RANK", "1");
    set("PMI_SIZE", "2");
    init_ok(&cfg); /* MPICH's PMI comes before Slurm */
    assert_int_equal(cfg.rank, 1);
    assert_int_equal(cfg.world_size, 2);
    unsetenv("PMI_RANK");
    unsetenv("PMI_SIZE");

    set("SLURM_PROCID", "12");
    init_refused("SLURM_PROCID");
    set("SLURM_PROCID", "0");
    set("SLURM_NTASKS", "0");
    init_refused("SLURM_NTASKS");
}

/* COHORT_* first, then torchrun, Open MPI, PMI, Slurm; a launcher counts
 * only when both its rank and its size are set. */
static void test_precedence(void **state)
{
    (void)state;
    coh_config_t cfg;
    set("SLURM_PROCID", "4");
    set("SLURM_NTASKS", "5");
    set("OMPI_COMM_WORLD_RANK", "3");
    set("OMPI_COMM_WORLD_SIZE", "6");
    set("RANK", "2");
    set("WORLD_SIZE", "7");
    set("COHORT_RANK", "1");
    set("COHORT_WORLD_SIZE", "8");
    init_ok(&cfg);
    assert_int_equal(cfg.rank, 1);
    assert_int_equal(cfg.world_size, 8);
    unsetenv("COHORT_WORLD_SIZE"); /* half a pair: skipped */
    init_ok(&cfg);
    assert_int_equal(cfg.rank, 2);
    assert_int_equal(cfg.world_size, 7);
    unsetenv("COHORT_RANK");
    unsetenv("WORLD_SIZE");
    init_ok(&cfg);
    assert_int_equal(cfg.rank, 3);
    assert_int_equal(cfg.world_size, 6);
    unsetenv("OMPI_COMM_WORLD_SIZE");
    init_ok(&cfg);
    assert_int_equal(cfg.rank, 4);
    assert_int_equal(cfg.world_size, 5);
    /* the first complete pair decides, even when a later one is also valid:
     * an invalid COHORT pair is an error, not a fall-through */
    set("COHORT_RANK", "9");
    set("COHORT_WORLD_SIZE", "9");
    init_refused("COHORT_RANK");
}

static void test_sizes(void **state)
{
    (void)state;
    static const struct {
        const char *s;
        size_t v;
    } k[] = {
        {"1", 1},         {"4096", 4096},     {"4K", 4096},
        {"4k", 4096},     {"4KB", 4096},      {"64KB", 65536},
        {"64kb", 65536},  {"1M", 1 << 20},    {"1MB", 1 << 20},
        {"3m", 3u << 20}, {"2G", 2ull << 30}, {"2GB", 2ull << 30},
        {"1B", 1},        {"007", 7},         {"16777216G", 1ull << 54},
    };
    for (size_t i = 0; i < sizeof(k) / sizeof(k[0]); i++) {
        set("COHORT_CHUNK_BYTES", k[i].s);
        set("COHORT_SMALL_BYTES", k[i].s);
        set("COHORT_RAIL_MIN_BYTES", k[i].s);
        /* Socket buffers are an int for setsockopt. */
        if (k[i].v <= INT_MAX) set("COHORT_SOCKBUF_BYTES", k[i].s);
        coh_config_t cfg;
        init_ok(&cfg);
        if (cfg.chunk_bytes != k[i].v) print_error("\"%s\"\n", k[i].s);
        assert_int_equal(cfg.chunk_bytes, k[i].v);
        assert_int_equal(cfg.small_bytes, k[i].v);
        assert_int_equal(cfg.rail_min_bytes, k[i].v);
        if (k[i].v <= INT_MAX) assert_int_equal(cfg.sockbuf_bytes, k[i].v);
        unsetenv("COHORT_SOCKBUF_BYTES");
    }
    /* Accepted before and cast to a negative int for SO_SNDBUF. */
    set("COHORT_SOCKBUF_BYTES", "2G");
    init_refused("COHORT_SOCKBUF_BYTES");
    unsetenv("COHORT_SOCKBUF_BYTES");
    /* 0 is a valid small/rail/sockbuf size, not a valid chunk */
    clear_all();
    set("COHORT_SMALL_BYTES", "0");
    set("COHORT_RAIL_MIN_BYTES", "0K");
    set("COHORT_SOCKBUF_BYTES", "0");
    coh_config_t cfg;
    init_ok(&cfg);
    assert_int_equal(cfg.small_bytes, 0);
    assert_int_equal(cfg.rail_min_bytes, 0);
    assert_int_equal(cfg.sockbuf_bytes, 0);
    set("COHORT_CHUNK_BYTES", "0");
    init_refused("COHORT_CHUNK_BYTES");
    set("COHORT_CHUNK_BYTES", "0M");
    init_refused("COHORT_CHUNK_BYTES");

    static const char *const bad[] = {
        "abc",          "-1",  "-1K",  "1.5M", "1MiB", "1T",    "K",   "1KK",
        "1 K",          "1K ", "0x10", "1e6",  " -5",  "\t-5K", "+-1", "18446744073709551616",
        "17179869184G", "16EB"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        clear_all();
        set("COHORT_SMALL_BYTES", bad[i]);
        coh_config_t c;
        int st = coh_config_init(&c);
        if (st != COH_EINVAL)
            print_error("COHORT_SMALL_BYTES=\"%s\" gave %d (small_bytes %zu)\n", bad[i], st,
                        c.small_bytes);
        assert_int_equal(st, COH_EINVAL);
        assert_non_null(strstr(coh_last_error(), "COHORT_SMALL_BYTES"));
        assert_non_null(strstr(coh_last_error(), bad[i])); /* and quotes the value */
    }
}

/* spin_us = -1 resolves to 5000 (longer than a time slice: tests/mp/contention.sh);
 * oversubscription (which makes the waiter yield after an empty pass) comes from the local rank
 * count. */
static void test_spin_auto(void **state)
{
    (void)state;
    coh_config_t cfg;
    assert_int_equal(coh_config_init(&cfg), 0);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    char many[32];
    snprintf(many, sizeof(many), "%ld", cpus + 1);
    set("COHORT_LOCAL_SIZE", "1");
    assert_int_equal(rx_config_spin_us(&cfg), 5000);
    assert_false(rx_config_oversubscribed());
    set("COHORT_LOCAL_SIZE", many);
    assert_int_equal(rx_config_spin_us(&cfg), 5000);
    assert_true(rx_config_oversubscribed());
    unsetenv("COHORT_LOCAL_SIZE");
    assert_false(rx_config_oversubscribed());
    set("LOCAL_WORLD_SIZE", many);
    assert_true(rx_config_oversubscribed());
    unsetenv("LOCAL_WORLD_SIZE");
    cfg.spin_us = 7;
    assert_int_equal(rx_config_spin_us(&cfg), 7);
}

/* Rings sized by the ranks on the host: 4 MiB up to 17, then within 64 MiB
 * per rank and rail, never below 256 KiB; a set value is kept. */
static void test_shm_ring_auto(void **state)
{
    (void)state;
    coh_config_t cfg;
    assert_int_equal(coh_config_init(&cfg), 0);
    assert_int_equal(cfg.shm_ring_bytes, 0);
    assert_int_equal(rx_config_shm_ring_bytes(&cfg, 1, false), 1u << 20);
    assert_int_equal(rx_config_shm_ring_bytes(&cfg, 2, false), 1u << 20);
    assert_int_equal(rx_config_shm_ring_bytes(&cfg, 65, false), 1u << 20);
    assert_int_equal(rx_config_shm_ring_bytes(&cfg, 66, false), 512u << 10);
    assert_int_equal(rx_config_shm_ring_bytes(&cfg, 129, false), 512u << 10);
    assert_int_equal(rx_config_shm_ring_bytes(&cfg, 130, false), 256u << 10);
    assert_int_equal(rx_config_shm_ring_bytes(&cfg, 1000, false), 256u << 10);
    /* More ranks than cores: 2 MiB while a rank's rings fit in 64 MiB. */
    assert_int_equal(rx_config_shm_ring_bytes(&cfg, 1, true), 2u << 20);
    assert_int_equal(rx_config_shm_ring_bytes(&cfg, 4, true), 2u << 20);
    assert_int_equal(rx_config_shm_ring_bytes(&cfg, 33, true), 2u << 20);
    assert_int_equal(rx_config_shm_ring_bytes(&cfg, 34, true), 1u << 20);
    assert_int_equal(rx_config_shm_ring_bytes(&cfg, 1000, true), 256u << 10);
    for (int over = 0; over < 2; over++)
        for (int n = 2; n < 300; n++)
            assert_true(rx_config_shm_ring_bytes(&cfg, n, over) * (size_t)(n - 1) <= (64u << 20) ||
                        rx_config_shm_ring_bytes(&cfg, n, over) == (256u << 10));
    cfg.shm_ring_bytes = 1u << 20;
    assert_int_equal(rx_config_shm_ring_bytes(&cfg, 2, true), 1u << 20);
    assert_int_equal(rx_config_shm_ring_bytes(&cfg, 100, false), 1u << 20);
}

/* The knob table lists every field of coh_config_t: when the struct grows,
 * add the field to RX_CONFIG_MAP (reactor/rx_config.h), which gives it a
 * default, its variable, validation, the ABI field and the README row. */
static void test_table_covers_the_struct(void **state)
{
    (void)state;
    if (sizeof(coh_config_t) != 592)
        fail_msg("coh_config_t is %zu bytes, was 592 when RX_CONFIG_MAP last listed every field",
                 sizeof(coh_config_t));
    int n;
    const rx_knob_t *k = rx_knobs(&n);
    int fields = 0;
    for (int i = 0; i < n; i++) {
        if (k[i].off < 0) continue;
        fields++;
        assert_non_null(rx_knob_find(k[i].name));
        assert_true(strncmp(k[i].env, "COHORT_", 7) == 0);
        /* Every default parses as its own kind and passes validation. */
        coh_config_t cfg;
        assert_int_equal(coh_config_init(&cfg), 0);
        assert_int_equal(rx_knob_set(&cfg, &k[i], k[i].deflt, "default"), 0);
    }
    assert_int_equal(fields, 48);
    /* tick_ms had an upper bound through the environment and the ABI but
     * none through C: the table gives all three the same. */
    coh_config_t cfg;
    assert_int_equal(coh_config_init(&cfg), 0);
    cfg.tick_ms = 10001;
    assert_int_equal(rx_config_validate(&cfg), COH_EINVAL);
    assert_non_null(strstr(coh_last_error(), "tick_ms"));
    cfg.tick_ms = 10000;
    assert_int_equal(rx_config_validate(&cfg), 0);
}

static void test_invalid_ints(void **state)
{
    (void)state;
    static const struct {
        const char *var, *val;
    } k[] = {
        {"COHORT_TIMEOUT_MS", "abc"},
        {"COHORT_TIMEOUT_MS", "0"},
        {"COHORT_TIMEOUT_MS", "-5"},
        {"COHORT_TIMEOUT_MS", "10s"},
        {"COHORT_TIMEOUT_MS", "1.5"},
        {"COHORT_TIMEOUT_MS", "2147483648"},
        {"COHORT_TIMEOUT_MS", "99999999999999999999"},
        {"COHORT_CONNECT_TIMEOUT_MS", "0"},
        {"COHORT_SPIN_US", "-2"},
        {"COHORT_SPIN_US", "1000001"},
        {"COHORT_POLL_US", "-1"},
        {"COHORT_POLL_US", "fast"},
        {"COHORT_STORE_FD", "-2"},
        {"COHORT_STORE_FD", "three"},
    };
    for (size_t i = 0; i < sizeof(k) / sizeof(k[0]); i++) {
        clear_all();
        set(k[i].var, k[i].val);
        init_refused(k[i].var);
        assert_non_null(strstr(coh_last_error(), k[i].val));
    }
    /* rank and size */
    static const struct {
        const char *rank, *size, *named;
    } r[] = {
        {"5", "4", "COHORT_RANK"},
        {"4", "4", "COHORT_RANK"},
        {"-1", "4", "COHORT_RANK"},
        {"x", "4", "COHORT_RANK"},
        {"0", "0", "COHORT_WORLD_SIZE"},
        {"0", "-3", "COHORT_WORLD_SIZE"},
        {"0", "1048577", "COHORT_WORLD_SIZE"},
        {"0", "four", "COHORT_WORLD_SIZE"},
    };
    for (size_t i = 0; i < sizeof(r) / sizeof(r[0]); i++) {
        clear_all();
        set("COHORT_RANK", r[i].rank);
        set("COHORT_WORLD_SIZE", r[i].size);
        init_refused(r[i].named);
    }
    clear_all();
    set("RANK", "4");
    set("WORLD_SIZE", "4");
    init_refused("RANK");
    /* the message says what would be accepted */
    clear_all();
    set("COHORT_RANK", "5");
    set("COHORT_WORLD_SIZE", "4");
    init_refused("COHORT_RANK");
    assert_non_null(strstr(coh_last_error(), "[0, 3]"));
}

int main(void)
{
    for (size_t i = 0; i < NVARS; i++) {
        const char *v = getenv(VARS[i]);
        saved[i] = v ? strdup(v) : NULL;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_defaults, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cohort_vars, setup, teardown),
        cmocka_unit_test_setup_teardown(test_torchrun, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mpi_and_slurm, setup, teardown),
        cmocka_unit_test_setup_teardown(test_precedence, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sizes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_invalid_ints, setup, teardown),
        cmocka_unit_test_setup_teardown(test_table_covers_the_struct, setup, teardown),
        cmocka_unit_test_setup_teardown(test_spin_auto, setup, teardown),
        cmocka_unit_test(test_shm_ring_auto),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    for (size_t i = 0; i < NVARS; i++) {
        if (saved[i]) setenv(VARS[i], saved[i], 1);
        free(saved[i]);
    }
    return rc;
}
