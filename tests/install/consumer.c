/* A C trainer embedding cohort, as a user builds it against an installed
 * tree (pkg-config or find_package) or with add_subdirectory: only the
 * public header. A world of one: the allreduce leaves the data as it was. */
#include <cohort.h>
#include <stdio.h>

int main(void)
{
    coh_ctx_t *ctx;
    coh_comm_t *world;
    if (coh_init(NULL, &ctx) != COH_OK) {
        fprintf(stderr, "coh_init: %s\n", coh_last_error());
        return 1;
    }
    coh_ctx_world(ctx, &world);
    float g[4] = {1, 2, 3, 4};
    int st = coh_allreduce_sync(world, NULL, g, 4, COH_F32, COH_SUM);
    int ok = st == COH_OK && g[0] == 1 && g[3] == 4;
    printf("consumer: %s (%s)\n", ok ? "OK" : "FAILED", coh_ctx_describe(ctx));
    coh_finalize(ctx);
    return ok ? 0 : 1;
}
