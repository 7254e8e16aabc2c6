/*
 * The multi-rail balancer live (reactor/rx_lb.c, docs/multirail.md): world
 * ops of mixed sizes (4 KiB .. 8 MiB) split by the coordinator's published
 * tables, several in flight, checked exactly (integer-valued floats); the
 * other ranks start ahead of the coordinator, so their first ops wait for
 * their epoch's table. Then every rank's newest table must be the same text
 * and show measurements on every rail; a stream of small ops after that
 * must bring few table messages. A second context in the same process
 * starts from the table the first saved (COHORT_LB_TABLE).
 *
 *   test_rails_lb [ops]
 */
#include <stdint.h>
#include <unistd.h>

#include "mp_util.h"
#include "reactor/rx_ctx.h"
#include "reactor/rx_lb.h"

static int R, N, NR;
static coh_comm_t *W;

static float v(int r, size_t i, int k)
{
    return (float)((i * 7 + (size_t)r * 3 + (size_t)k * 5) % 61);
}

static uint64_t fnv(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

typedef struct op {
    coh_request_t *req;
    float *buf;
    size_t n;
    int k;
} op_t;

static void check_allreduce(const op_t *o)
{
    for (size_t i = 0; i < o->n; i++) {
        float want = 0;
        for (int r = 0; r < N; r++) want += v(r, i, o->k);
        if (o->buf[i] != want)
            MP_FAIL("allreduce %d (n=%zu): [%zu] = %g, want %g", o->k, o->n, i, o->buf[i], want);
    }
}

static void allreduces(int nops, int k0, double delay_s)
{
    /* 4 KiB .. 8 MiB; odd counts too. */
    static const size_t sizes[] = {1024, 3001, 16384, 65537, 262144, 1 << 20, 777777, 2 << 20};
    enum { INFLIGHT = 4 };
    op_t ops[INFLIGHT] = {0};
    int k = 0;
    while (k < nops) {
        int m = 0;
        for (; m < INFLIGHT && k < nops; m++, k++) {
            op_t *o = &ops[m];
            o->k = k0 + k;
            o->n = sizes[(size_t)o->k % (sizeof(sizes) / sizeof(sizes[0]))];
            o->buf = malloc(o->n * sizeof(float));
            for (size_t i = 0; i < o->n; i++) o->buf[i] = v(R, i, o->k);
            MP_OK(coh_allreduce(W, NULL, o->buf, o->n, COH_F32, COH_SUM, &o->req));
        }
        if (delay_s > 0) {
            usleep((useconds_t)(delay_s * 1e6)); /* ops 0..: before the coordinator's */
            delay_s = 0;
        }
        for (int j = 0; j < m; j++) {
            mp_wait(ops[j].req);
            check_allreduce(&ops[j]);
            free(ops[j].buf);
        }
    }
}

static void others(int k)
{
    size_t n = 1000 + (size_t)k * 4099 % 200000; /* per-rank block */
    float *in = malloc(n * (size_t)N * sizeof(float)), *out = malloc(n * (size_t)N * sizeof(float));
    /* allgather */
    for (size_t i = 0; i < n; i++) in[i] = v(R, i, k);
    coh_request_t *req;
    MP_OK(coh_allgather(W, in, out, n, COH_F32, &req));
    mp_wait(req);
    for (int r = 0; r < N; r++)
        for (size_t i = 0; i < n; i++)
            if (out[(size_t)r * n + i] != v(r, i, k))
                MP_FAIL("allgather %d: rank %d [%zu]", k, r, i);
    /* reduce_scatter */
    for (size_t i = 0; i < n * (size_t)N; i++) in[i] = v(R, i, k + 1);
    MP_OK(coh_reduce_scatter(W, in, out, n, COH_F32, COH_SUM, &req));
    mp_wait(req);
    for (size_t i = 0; i < n; i++) {
        float want = 0;
        for (int r = 0; r < N; r++) want += v(r, (size_t)R * n + i, k + 1);
        if (out[i] != want) MP_FAIL("reduce_scatter %d: [%zu] = %g, want %g", k, i, out[i], want);
    }
    /* broadcast */
    int root = k % N;
    for (size_t i = 0; i < n * 2; i++) out[i] = R == root ? v(root, i, k + 2) : -1;
    MP_OK(coh_broadcast(W, out, n * 2, COH_F32, root, &req));
    mp_wait(req);
    for (size_t i = 0; i < n * 2; i++)
        if (out[i] != v(root, i, k + 2)) MP_FAIL("broadcast %d: [%zu]", k, i);
    free(in);
    free(out);
}

/* The newest table: the same on every rank; returns it. */
static char *agree_on_table(coh_ctx_t *ctx)
{
    coh_request_t *req;
    MP_OK(coh_barrier(W, &req));
    mp_wait(req);
    usleep(300 * 1000); /* the last published table reaches every rank */
    static char text[1 << 16];
    int len = coh_lb_table(ctx, text, sizeof(text));
    if (len <= 0) MP_FAIL("coh_lb_table: %d: %s", len, coh_last_error());
    int64_t mine = (int64_t)fnv(text), *all = calloc((size_t)N, sizeof(int64_t));
    MP_OK(coh_allgather(W, &mine, all, 1, COH_I64, &req));
    mp_wait(req);
    for (int r = 0; r < N; r++)
        if (all[r] != all[0]) {
            fprintf(stderr, "rank %d's table:\n%s", R, text);
            MP_FAIL("rank %d's rail table differs from rank 0's", r);
        }
    free(all);
    return text;
}

int main(int argc, char **argv)
{
    int nops = argc > 1 ? atoi(argv[1]) : 240;
    char path[256];
    snprintf(path, sizeof(path), "%s/cohort-lb-test-%d.txt",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getppid());
    setenv("COHORT_LB_TABLE", path, 1);
    coh_ctx_t *ctx = mp_init(&W, &R, &N);
    MP_OK(coh_ctx_nrails(ctx, &NR));
    if (NR < 2) MP_FAIL("run with several rails (--nics lo,lo)");
    int coord = 0;
    if (getenv("COHORT_COORDINATOR")) coord = atoi(getenv("COHORT_COORDINATOR"));
    if (R == coord) unlink(path); /* a cold start */
    char text0[64];
    MP_EQ_INT(coh_lb_table(ctx, text0, sizeof(text0)), COH_EAGAIN);

    /* The others run ahead: their first ops wait for the coordinator's table. */
    if (R == coord) usleep(300 * 1000);
    double t0 = mp_now_s();
    allreduces(8, 0, 0);
    for (int k = 0; k < nops; k += 40) {
        allreduces(40, 8 + k, 0);
        others(k);
    }
    /* Then only small ops (1 KiB, 128 epochs of the default 16 ops): the
     * quiet balancer's tables cover more epochs per message (rx_lb.c,
     * publish), so a rank other than the coordinator gets a few messages,
     * not one per epoch (it got 128 before). */
    uint64_t in0 = rx_lb_tables_in(ctx);
    for (int k = 0; k < 2048; k++) {
        float x[256];
        for (int i = 0; i < 256; i++) x[i] = v(R, (size_t)i, k);
        coh_request_t *q;
        MP_OK(coh_allreduce(W, NULL, x, 256, COH_F32, COH_SUM, &q));
        mp_wait(q);
        for (int i = 0; i < 256; i++) {
            float want = 0;
            for (int r = 0; r < N; r++) want += v(r, (size_t)i, k);
            if (x[i] != want) MP_FAIL("small allreduce %d: [%d] = %g, want %g", k, i, x[i], want);
        }
    }
    uint64_t tables = rx_lb_tables_in(ctx) - in0;
    if (R != coord && (tables == 0 || tables > 32))
        MP_FAIL("%llu table messages for 2048 small ops (128 epochs): want 1..32",
                (unsigned long long)tables);
    if (R == (coord + 1) % N)
        printf("rank %d: 2048 small ops, %llu table messages\n", R, (unsigned long long)tables);
    char *text = agree_on_table(ctx);
    for (int r = 0; r < NR; r++) {
        char want[32];
        snprintf(want, sizeof(want), "rail %d bucket ", r);
        if (!strstr(text, want)) {
            fprintf(stderr, "%s", text);
            MP_FAIL("the table has no measurement of rail %d", r);
        }
    }
    if (R == 0) printf("rank 0: %d ops in %.2f s; table:\n%s", nops, mp_now_s() - t0, text);
    MP_OK(coh_finalize(ctx));

    /* Again, hot: the coordinator loads what it saved at finalize; the
     * first tables it publishes are that one. */
    ctx = mp_init(&W, &R, &N);
    static char filetext[1 << 16];
    if (R == coord) {
        FILE *f = fopen(path, "r");
        if (!f) MP_FAIL("the coordinator saved no table at %s", path);
        size_t n = fread(filetext, 1, sizeof(filetext) - 1, f);
        fclose(f);
        filetext[n] = 0;
        if (!strstr(filetext, "rail 1 bucket ")) MP_FAIL("the saved table is empty:\n%s", filetext);
    }
    coh_request_t *req;
    float x[4] = {1, 2, 3, 4};
    MP_OK(coh_allreduce(W, NULL, x, 4, COH_F32, COH_SUM, &req));
    mp_wait(req);
    text = agree_on_table(ctx);
    if (R == coord && strcmp(text, filetext) != 0)
        MP_FAIL("the second run did not start from the saved table:\n%s\nsaved:\n%s", text,
                filetext);
    MP_OK(coh_finalize(ctx));
    if (R == coord) unlink(path);
    printf("rank %d: OK\n", R);
    return 0;
}
