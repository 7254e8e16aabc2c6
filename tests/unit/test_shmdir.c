/*
 * The shared-memory job directory (engines/en_shm.c, en_shm_job_dir) while
 * another context of the job removes it: a context that finalizes takes the
 * directory with its last socket, and the next init of a rank beside it
 * must make it again, not call it foreign. Before the fix, mp.boot.reinit.n2
 * failed in CI with "... is not a private directory of this user" (the
 * directory vanished between mkdir's EEXIST and the check).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <uv.h>

#include "base/base.h"
#include "engines/engine.h"

static char dir[256], sock[300];
static atomic_bool stop;

/* The other context: removes the (empty) directory as fast as it can. */
static void remover(void *arg)
{
    (void)arg;
    while (!atomic_load(&stop)) (void)rmdir(dir);
}

static void test_dir_removed_meanwhile(void **state)
{
    (void)state;
    snprintf(dir, sizeof(dir), "/tmp/cohort-shmdir-%ld", (long)getpid());
    snprintf(sock, sizeof(sock), "%s/ctx.0", dir);
    uv_thread_t th;
    atomic_store(&stop, false);
    assert_int_equal(uv_thread_create(&th, remover, NULL), 0);
    int bad = 0;
    for (int i = 0; i < 20000; i++)
        if (en_shm_job_dir(sock) != 0) {
            if (!bad) print_message("call %d: %s\n", i, coh_last_error());
            bad++;
        }
    atomic_store(&stop, true);
    uv_thread_join(&th);
    assert_int_equal(bad, 0);
    /* Still refused: a directory someone else may enter. */
    assert_int_equal(en_shm_job_dir(sock), 0);
    assert_int_equal(chmod(dir, 0755), 0);
    assert_int_equal(en_shm_job_dir(sock), COH_ESYS);
    assert_non_null(strstr(coh_last_error(), "not a private directory"));
    (void)rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dir_removed_meanwhile),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
