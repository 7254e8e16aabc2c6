/*
 * The public API on bad input: every misuse gets an error code and a
 * message, never a crash. Single rank (no network), so it also checks that
 * a world of one runs every collective locally. Also: a successful init
 * leaves the last error alone, and a store_fd that is no listening socket is
 * refused and left open.
 */
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/base.h"
#include "cohort.h"

static void clear_env(void)
{
    static const char *vars[] = {"COHORT_RANK",  "COHORT_WORLD_SIZE",    "RANK",
                                 "WORLD_SIZE",   "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                 "SLURM_PROCID", "SLURM_NTASKS",         "PMI_RANK",
                                 "PMI_SIZE",     "COHORT_STORE",         "MASTER_ADDR",
                                 "MASTER_PORT",  "COHORT_NICS",          "COHORT_STORE_FD"};
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) unsetenv(vars[i]);
}

static int setup(void **state)
{
    clear_env();
    coh_ctx_t *ctx;
    assert_int_equal(coh_init(NULL, &ctx), COH_OK);
    *state = ctx;
    return 0;
}

static int teardown(void **state)
{
    if (*state) assert_int_equal(coh_finalize(*state), COH_OK);
    return 0;
}

static coh_comm_t *world(void **state)
{
    coh_comm_t *w;
    assert_int_equal(coh_ctx_world(*state, &w), COH_OK);
    return w;
}

static void expect_einval(int st)
{
    assert_int_equal(st, COH_EINVAL);
    assert_true(strlen(coh_last_error()) > 0);
}

static void test_null_buffer(void **state)
{
    coh_request_t *req = NULL;
    expect_einval(coh_allreduce(world(state), NULL, NULL, 10, COH_F32, COH_SUM, &req));
    assert_non_null(strstr(coh_last_error(), "NULL buffer"));
    assert_null(req);
    expect_einval(coh_broadcast(world(state), NULL, 3, COH_I32, 0, &req));
    expect_einval(coh_allgather(world(state), NULL, NULL, 3, COH_I32, &req));
    expect_einval(coh_reduce_scatter(world(state), NULL, NULL, 3, COH_I32, COH_SUM, &req));
}

static void test_bad_enums(void **state)
{
    float x[4] = {0};
    coh_request_t *req;
    expect_einval(coh_allreduce(world(state), NULL, x, 4, (coh_dtype)99, COH_SUM, &req));
    assert_non_null(strstr(coh_last_error(), "dtype"));
    expect_einval(coh_allreduce(world(state), NULL, x, 4, COH_F32, (coh_redop)-1, &req));
    assert_non_null(strstr(coh_last_error(), "op"));
    expect_einval(coh_broadcast(world(state), x, 4, COH_F32, 1, &req)); /* root 1 of 1 rank */
    expect_einval(coh_broadcast(world(state), x, 4, COH_F32, -1, &req));
}

static void test_null_handles(void **state)
{
    float x[4] = {0};
    expect_einval(coh_allreduce(NULL, NULL, x, 4, COH_F32, COH_SUM, NULL));
    expect_einval(coh_allreduce(world(state), NULL, x, 4, COH_F32, COH_SUM, NULL));
    expect_einval(coh_wait(NULL, 0));
    int done;
    expect_einval(coh_test(NULL, &done));
    expect_einval(coh_request_status(NULL));
    assert_string_equal(coh_request_error(NULL), "");
    coh_request_free(NULL); /* allowed */
    expect_einval(coh_ctx_world(NULL, NULL));
    expect_einval(coh_comm_rank(NULL, NULL));
    expect_einval(coh_init(NULL, NULL));
    expect_einval(coh_finalize(NULL));
    expect_einval(coh_config_init(NULL));
}

static void test_overlap(void **state)
{
    float x[16] = {0};
    coh_request_t *req;
    expect_einval(coh_allreduce(world(state), x, x + 2, 8, COH_F32, COH_SUM, &req));
    assert_non_null(strstr(coh_last_error(), "overlap"));
}

static void test_finalize_twice(void **state)
{
    (void)state;
    coh_ctx_t *ctx;
    assert_int_equal(coh_init(NULL, &ctx), COH_OK);
    assert_int_equal(coh_finalize(ctx), COH_OK);
    assert_int_equal(coh_finalize(ctx), COH_ESTATE);
    assert_non_null(strstr(coh_last_error(), "finalized twice"));
}

static void test_bad_config(void **state)
{
    (void)state;
    coh_config_t cfg;
    assert_int_equal(coh_config_init(&cfg), COH_OK);
    coh_ctx_t *ctx = NULL;
    cfg.world_size = 2; /* and no store */
    cfg.rank = 1;
    assert_int_equal(coh_init(&cfg, &ctx), COH_EINVAL);
    assert_non_null(strstr(coh_last_error(), "store"));
    assert_null(ctx);
    assert_int_equal(coh_config_init(&cfg), COH_OK);
    cfg.rank = 3;
    assert_int_equal(coh_init(&cfg, &ctx), COH_EINVAL);
    assert_int_equal(coh_config_init(&cfg), COH_OK);
    cfg.nics = "no-such-interface0";
    assert_int_equal(coh_init(&cfg, &ctx), COH_EINVAL);
    assert_non_null(strstr(coh_last_error(), "no-such-interface0"));
}

/* A world of one: every collective is a local copy, and completes. */
static void test_single_rank(void **state)
{
    coh_comm_t *w = world(state);
    int32_t in[5] = {1, 2, 3, 4, 5}, out[5] = {0};
    coh_request_t *req;
    assert_int_equal(coh_allreduce(w, in, out, 5, COH_I32, COH_AVG, &req), COH_OK);
    assert_int_equal(coh_wait(req, -1), COH_OK);
    assert_memory_equal(in, out, sizeof(in));
    double us = -1;
    assert_int_equal(coh_request_time_us(req, &us), COH_OK);
    assert_true(us >= 0);
    assert_int_equal(coh_request_status(req), COH_OK);
    assert_string_equal(coh_request_error(req), "");
    coh_request_free(req);
    memset(out, 0, sizeof(out));
    assert_int_equal(coh_allgather(w, in, out, 5, COH_I32, &req), COH_OK);
    assert_int_equal(coh_wait(req, -1), COH_OK);
    coh_request_free(req);
    assert_memory_equal(in, out, sizeof(in));
    memset(out, 0, sizeof(out));
    assert_int_equal(coh_reduce_scatter(w, in, out, 5, COH_I32, COH_SUM, &req), COH_OK);
    assert_int_equal(coh_wait(req, -1), COH_OK);
    coh_request_free(req);
    assert_memory_equal(in, out, sizeof(in));
    assert_int_equal(coh_barrier(w, &req), COH_OK);
    assert_int_equal(coh_wait(req, 1000), COH_OK);
    coh_request_free(req);
    assert_int_equal(coh_allreduce(w, NULL, out, 0, COH_I32, COH_SUM, &req), COH_OK);
    assert_int_equal(coh_wait(req, 1000), COH_OK);
    coh_request_free(req);
}

/* The event fd becomes readable when a request completes and clears. */
static void test_event_fd(void **state)
{
    coh_comm_t *w = world(state);
    int fd = -1;
    assert_int_equal(coh_ctx_event_fd(*state, &fd), COH_OK);
    assert_true(fd >= 0);
    assert_int_equal(coh_ctx_event_clear(*state), COH_OK);
    struct pollfd p = {.fd = fd, .events = POLLIN};
    assert_int_equal(poll(&p, 1, 0), 0);
    float x[3] = {1, 2, 3};
    coh_request_t *req;
    assert_int_equal(coh_allreduce(w, NULL, x, 3, COH_F32, COH_SUM, &req), COH_OK);
    assert_int_equal(poll(&p, 1, 5000), 1);
    int done = 0;
    assert_int_equal(coh_test(req, &done), COH_OK);
    assert_int_equal(done, 1);
    coh_request_free(req);
    assert_int_equal(coh_ctx_event_clear(*state), COH_OK);
    assert_int_equal(poll(&p, 1, 0), 0);
    coh_stats_t st;
    assert_int_equal(coh_ctx_stats(*state, &st), COH_OK);
    assert_true(st.requests_completed >= 1);
    assert_int_equal(st.requests_failed, 0);
}

/* The last error is the application's until a call fails: a successful
 * init used to leave "more than 64 live contexts" there. */
static void test_init_keeps_last_error(void **state)
{
    (void)state;
    clear_env();
    assert_int_equal(coh_init(NULL, NULL), COH_EINVAL);
    char before[512];
    snprintf(before, sizeof(before), "%s", coh_last_error());
    assert_true(strlen(before) > 0);
    coh_ctx_t *ctx;
    assert_int_equal(coh_init(NULL, &ctx), COH_OK);
    assert_string_equal(coh_last_error(), before);
    assert_int_equal(coh_finalize(ctx), COH_OK);
    assert_string_equal(coh_last_error(), before);
}

/* A store_fd that is not a listening TCP socket is refused, with a reason,
 * and left open: the descriptor is the application's. */
static void test_store_fd_not_listening(void **state)
{
    (void)state;
    clear_env();
    char path[] = "/tmp/cohort-test-api-XXXXXX";
    int file = mkstemp(path);
    assert_true(file >= 0);
    unlink(path);
    int udp = socket(AF_INET, SOCK_DGRAM, 0);
    int tcp = socket(AF_INET, SOCK_STREAM, 0); /* not listening */
    int fds[] = {file, udp, tcp};
    for (size_t i = 0; i < sizeof(fds) / sizeof(fds[0]); i++) {
        assert_true(fds[i] >= 0);
        coh_config_t cfg;
        assert_int_equal(coh_config_init(&cfg), COH_OK);
        cfg.world_size = 2;
        cfg.rank = 0;
        cfg.store = "127.0.0.1:1";
        cfg.store_fd = fds[i];
        cfg.connect_timeout_ms = 2000;
        coh_ctx_t *ctx = NULL;
        assert_int_equal(coh_init(&cfg, &ctx), COH_EINVAL);
        assert_null(ctx);
        assert_non_null(strstr(coh_last_error(), "not a listening TCP socket"));
        assert_int_not_equal(fcntl(fds[i], F_GETFD), -1);
        close(fds[i]);
    }
}

/* Device buffers without a device runtime, a runtime that cannot be had,
 * and a world of one on the host emulation (docs/gpu.md). */
static void test_device_runtime(void **state)
{
    (void)state;
    clear_env();
    coh_ctx_t *ctx;
    setenv("COHORT_GPU", "off", 1);
    assert_int_equal(coh_init(NULL, &ctx), COH_OK);
    coh_comm_t *w;
    assert_int_equal(coh_ctx_world(ctx, &w), COH_OK);
    float x[4] = {1, 2, 3, 4};
    coh_request_t *req;
    coh_coll_opts_t dev = {.mem = COH_MEM_DEVICE};
    assert_int_equal(coh_broadcast_ex(w, x, 4, COH_F32, 0, &dev, &req), COH_EUNSUPPORTED);
    void *p = NULL;
    assert_int_equal(coh_mem_alloc(ctx, 64, &p), COH_EUNSUPPORTED);
    coh_coll_opts_t host = {.mem = COH_MEM_HOST};
    assert_int_equal(coh_allgather_ex(w, NULL, x, 4, COH_F32, &host, &req), COH_OK);
    assert_int_equal(coh_wait(req, -1), COH_OK);
    assert_int_equal(coh_request_stream_wait(req, NULL), COH_OK); /* complete: nothing to wait */
    coh_request_free(req);
    assert_int_equal(coh_finalize(ctx), COH_OK);
    setenv("COHORT_GPU", "bogus", 1);
    assert_int_equal(coh_init(NULL, &ctx), COH_EINVAL);
    setenv("COHORT_GPU", "cuda", 1); /* no device here, or no CUDA in this build */
    if (coh_init(NULL, &ctx) == COH_OK)
        assert_int_equal(coh_finalize(ctx), COH_OK);
    else
        assert_true(strstr(coh_last_error(), "COHORT_GPU=cuda") != NULL);
    setenv("COHORT_GPU", "host", 1);
    assert_int_equal(coh_init(NULL, &ctx), COH_OK);
    assert_int_equal(coh_mem_alloc(ctx, sizeof(x), &p), COH_OK);
    assert_int_equal(coh_mem_copy(ctx, p, x, sizeof(x)), COH_OK);
    assert_int_equal(coh_ctx_world(ctx, &w), COH_OK);
    assert_int_equal(coh_allreduce(w, p, p, 4, COH_F32, COH_SUM, &req), COH_OK);
    assert_int_equal(coh_wait(req, -1), COH_OK);
    coh_request_free(req);
    float y[4] = {0};
    assert_int_equal(coh_mem_copy(ctx, y, p, sizeof(y)), COH_OK);
    assert_memory_equal(x, y, sizeof(x));
    assert_int_equal(coh_sync(w, p, 4, COH_F32, 0, 1.0, &req), COH_EUNSUPPORTED);
    assert_int_equal(coh_mem_free(ctx, p), COH_OK);
    assert_int_equal(coh_finalize(ctx), COH_OK);
    unsetenv("COHORT_GPU");
}

/* A plan knob (COHORT_ALGO, COHORT_SMALL_ALGO): an unknown plan is refused
 * at init, naming the variable; every named one runs an allreduce of count
 * floats (one rank: the knob is read and checked, the plan is a copy). */
static void check_plan_knob(const char *var, const char *const *ok, size_t nok, size_t count)
{
    clear_env();
    coh_ctx_t *ctx;
    setenv(var, "tree", 1);
    assert_int_equal(coh_init(NULL, &ctx), COH_EINVAL);
    assert_non_null(strstr(coh_last_error(), var));
    static float x[1 << 16], y[1 << 16];
    x[7] = 3;
    for (size_t i = 0; i < nok; i++) {
        setenv(var, ok[i], 1);
        assert_int_equal(coh_init(NULL, &ctx), COH_OK);
        coh_comm_t *w;
        assert_int_equal(coh_ctx_world(ctx, &w), COH_OK);
        coh_request_t *req;
        assert_int_equal(coh_allreduce(w, x, y, count, COH_F32, COH_SUM, &req), COH_OK);
        assert_int_equal(coh_wait(req, -1), COH_OK);
        coh_request_free(req);
        assert_true(y[7] == 3);
        assert_int_equal(coh_finalize(ctx), COH_OK);
    }
    unsetenv(var);
}

static void test_algo_knob(void **state)
{
    (void)state;
    static const char *const large[] = {"ring", "hd", "auto"}, *const small[] = {"rd", "star",
                                                                                 "auto"};
    check_plan_knob("COHORT_ALGO", large, 3, 1 << 16); /* above COHORT_SMALL_BYTES */
    check_plan_knob("COHORT_SMALL_ALGO", small, 3, 16);
}

/* COHORT_NICS=nics: coh_init works (RDMA is there) or is refused with a
 * message holding both what and naming (or saying the build has no verbs). */
static void verbs_refused(const char *nics, const char *what, const char *naming)
{
    coh_ctx_t *ctx = NULL;
    setenv("COHORT_NICS", nics, 1);
    int st = coh_init(NULL, &ctx);
    unsetenv("COHORT_NICS");
    if (st == COH_OK) {
        assert_int_equal(coh_finalize(ctx), COH_OK);
        return;
    }
    const char *why = coh_last_error();
    if (strstr(why, "no verbs engine")) return;
    assert_non_null(strstr(why, what));
    assert_non_null(strstr(why, naming));
}

/* A verbs rail on a machine without an RDMA device (or a build without
 * the engine) fails coh_init, saying why, and leaves nothing running. */
static void test_verbs_without_device(void **state)
{
    (void)state;
    clear_env();
    setenv("COHORT_NICS", "lo:verbs", 1);
    coh_ctx_t *ctx = NULL;
    int st = coh_init(NULL, &ctx);
    unsetenv("COHORT_NICS");
    if (st == COH_OK) { /* a machine with RDMA behind lo: nothing to check here */
        assert_int_equal(coh_finalize(ctx), COH_OK);
        return;
    }
    assert_int_equal(st, COH_EUNSUPPORTED);
    assert_null(ctx);
    const char *why = coh_last_error();
    assert_true(strstr(why, "RDMA") || strstr(why, "no verbs engine"));
    /* A rail named by an RDMA device that is not there (COHORT_NICS=mlx5_0:verbs
     * names the device, not its interface): refused, saying what was looked for. */
    verbs_refused("mlx5_9:verbs", "RDMA device", "mlx5_9");
    /* A rail named by an address: the device behind the interface holding
     * it is looked for (the message said "interface 127.0.0.1"). */
    verbs_refused("127.0.0.1:verbs", "interface lo ", "interface lo ");
    /* and a context after it works */
    assert_int_equal(coh_init(NULL, &ctx), COH_OK);
    assert_int_equal(coh_finalize(ctx), COH_OK);
}

/* Declared memory (coh_mem_register): bad ranges refused with a reason,
 * a collective sends from declared memory as from any other (TCP ignores
 * the declaration), and a declaration is taken back once. */
static void test_mem_register(void **state)
{
    coh_ctx_t *ctx = *state;
    static int32_t mem[1040], out[1024];
    int32_t *buf = mem + 8;
    for (int i = 0; i < 1024; i++) buf[i] = i;
    expect_einval(coh_mem_register(NULL, buf, sizeof(out)));
    expect_einval(coh_mem_register(ctx, NULL, 64));
    expect_einval(coh_mem_register(ctx, buf, 0));
    assert_int_equal(coh_mem_register(ctx, buf, sizeof(out)), COH_OK);
    expect_einval(coh_mem_register(ctx, buf + 100, 64)); /* inside the first */
    expect_einval(coh_mem_register(ctx, mem, 40));       /* overlaps its start */
    coh_request_t *req;
    assert_int_equal(coh_allreduce(world(state), buf, out, 1024, COH_I32, COH_SUM, &req), COH_OK);
    assert_int_equal(coh_wait(req, -1), COH_OK);
    coh_request_free(req);
    assert_memory_equal(buf, out, sizeof(out));
    expect_einval(coh_mem_deregister(ctx, buf + 1)); /* not its start */
    assert_int_equal(coh_mem_deregister(ctx, buf), COH_OK);
    expect_einval(coh_mem_deregister(ctx, buf));
    assert_int_equal(coh_mem_register(ctx, buf + 100, 64), COH_OK); /* free space again */
    /* left declared: finalize takes it back */
}

/* An error that wraps the last one (bs_fail(st, "%s: %s", fn,
 * coh_last_error()), as a failed launch does) reads it whole: formatted
 * into itself it came out as "coh_allreduce: =5003, f64, sum)". */
static void test_error_wraps_last(void **state)
{
    (void)state;
    assert_int_equal(bs_fail(COH_EPEER, "allreduce(count=%d, f64, sum): %s", 5003, "gone"),
                     COH_EPEER);
    assert_int_equal(bs_fail(COH_EPEER, "%s: %s", "coh_allreduce", coh_last_error()), COH_EPEER);
    assert_string_equal(coh_last_error(), "coh_allreduce: allreduce(count=5003, f64, sum): gone");
    assert_int_equal(bs_fail(COH_EINVAL, "%s, then %s", coh_last_error(), "more"), COH_EINVAL);
    assert_string_equal(coh_last_error(),
                        "coh_allreduce: allreduce(count=5003, f64, sum): gone, then more");
}

static void test_status_names(void **state)
{
    (void)state;
    assert_string_equal(coh_status_name(COH_EMISMATCH), "EMISMATCH");
    assert_string_equal(coh_status_name(12345), "UNKNOWN");
    assert_string_equal(coh_strerror(COH_OK), "success");
    assert_string_equal(coh_dtype_name(COH_BF16), "bf16");
    assert_int_equal(coh_dtype_size((coh_dtype)77), 0);
    assert_string_equal(coh_redop_name(COH_PROD), "prod");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_null_buffer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_enums, setup, teardown),
        cmocka_unit_test_setup_teardown(test_null_handles, setup, teardown),
        cmocka_unit_test_setup_teardown(test_overlap, setup, teardown),
        cmocka_unit_test_setup_teardown(test_single_rank, setup, teardown),
        cmocka_unit_test_setup_teardown(test_event_fd, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mem_register, setup, teardown),
        cmocka_unit_test(test_finalize_twice),
        cmocka_unit_test(test_bad_config),
        cmocka_unit_test(test_status_names),
        cmocka_unit_test(test_error_wraps_last),
        cmocka_unit_test(test_device_runtime),
        cmocka_unit_test(test_algo_knob),
        cmocka_unit_test(test_verbs_without_device),
        cmocka_unit_test(test_init_keeps_last_error),
        cmocka_unit_test(test_store_fd_not_listening),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
