/*
 * The registration cache (engines/en_regcache.h) against a recording
 * registrar: only declared memory is registered, once, as a whole; hits
 * move to the front; the bound evicts the least recently used unused
 * registration and never one in use; a declaration taken back is
 * deregistered at once when unused and at its last put when in use, and
 * is never handed out again; overlapping declarations are refused; the
 * table is safe to change from another thread while a rail looks up.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cohort.h"
#include "engines/en_regcache.h"

/* The registrar: what is registered now, and how often it was asked. */
enum { MAX_REGS = 1 << 18 }; /* test_threads registers once per declaration it meets */

typedef struct fake {
    int regs, deregs, fail_next;
    uintptr_t *live; /* [MAX_REGS]: 0 once deregistered */
    int nlive;
} fake_t;

static int fake_reg(void *arg, void *addr, size_t len, void **handle, uint32_t *key)
{
    fake_t *f = arg;
    if (f->fail_next) {
        f->fail_next--;
        return COH_ESYS;
    }
    assert_true(f->nlive < MAX_REGS);
    f->live[f->nlive] = (uintptr_t)addr;
    *handle = &f->live[f->nlive];
    *key = (uint32_t)(0x1000 + f->regs);
    f->nlive++;
    f->regs++;
    return 0;
}

static void fake_dereg(void *arg, void *handle)
{
    fake_t *f = arg;
    uintptr_t *h = handle;
    assert_true(h >= f->live && h < f->live + f->nlive);
    assert_int_not_equal(*h, 0); /* never twice */
    *h = 0;
    f->deregs++;
}

typedef struct fx {
    fake_t f;
    en_regtab_t *tab;
    en_regcache_t *c;
    char *mem; /* 1 MiB to carve ranges from */
} fx_t;

static fx_t *fx_new(size_t cap)
{
    fx_t *x = calloc(1, sizeof(*x));
    x->f.live = calloc(MAX_REGS, sizeof(uintptr_t));
    x->tab = en_regtab_new();
    en_regcache_ops_t ops = {.arg = &x->f, .reg = fake_reg, .dereg = fake_dereg};
    x->c = en_regcache_new(x->tab, &ops, cap);
    x->mem = malloc(1 << 20);
    return x;
}

static void fx_free(fx_t *x)
{
    en_regcache_free(x->c);
    assert_int_equal(x->f.regs, x->f.deregs); /* nothing left registered */
    en_regtab_free(x->tab);
    free(x->mem);
    free(x->f.live);
    free(x);
}

static en_regcache_stats_t stats(fx_t *x)
{
    en_regcache_stats_t s;
    en_regcache_stats(x->c, &s);
    return s;
}

static void test_only_declared(void **state)
{
    fx_t *x = fx_new(0);
    assert_null(en_regcache_get(x->c, x->mem, 100)); /* nothing declared */
    assert_int_equal(en_regtab_add(x->tab, x->mem + 4096, 8192), 0);
    assert_null(en_regcache_get(x->c, x->mem + 4000, 200));  /* starts before */
    assert_null(en_regcache_get(x->c, x->mem + 12000, 400)); /* runs past the end */
    assert_int_equal(x->f.regs, 0);
    en_reg_t *r = en_regcache_get(x->c, x->mem + 5000, 1000);
    assert_non_null(r);
    /* the whole declared range, registered once */
    assert_int_equal(r->base, (uintptr_t)(x->mem + 4096));
    assert_int_equal(r->len, 8192);
    assert_int_equal(r->key, 0x1000);
    en_reg_t *r2 = en_regcache_get(x->c, x->mem + 4096, 8192); /* exactly the range */
    assert_ptr_equal(r, r2);
    assert_int_equal(x->f.regs, 1);
    en_regcache_stats_t s = stats(x);
    assert_int_equal(s.hits, 1);
    assert_int_equal(s.misses, 1);
    assert_int_equal(s.undeclared, 3);
    assert_int_equal(s.pinned_bytes, 8192);
    en_regcache_put(x->c, r);
    en_regcache_put(x->c, r2);
    assert_int_equal(x->f.deregs, 0); /* cached, not dropped */
    fx_free(x);
}

static void test_refuses_bad_declarations(void **state)
{
    fx_t *x = fx_new(0);
    en_regtab_t *t = x->tab;
    char *m = x->mem;
    assert_int_equal(en_regtab_add(t, m + 1000, 1000), 0);
    assert_int_equal(en_regtab_add(t, m + 1999, 10), COH_EINVAL);  /* overlaps its end */
    assert_int_equal(en_regtab_add(t, m + 990, 11), COH_EINVAL);   /* overlaps its start */
    assert_int_equal(en_regtab_add(t, m + 500, 5000), COH_EINVAL); /* holds it */
    assert_int_equal(en_regtab_add(t, m + 1200, 10), COH_EINVAL);  /* inside it */
    assert_int_equal(en_regtab_add(t, m, 0), COH_EINVAL);
    assert_int_equal(en_regtab_add(t, NULL, 10), COH_EINVAL);
    assert_int_equal(en_regtab_add(t, (void *)(UINTPTR_MAX - 10), 100), COH_EINVAL);
    /* adjacent on both sides is fine */
    assert_int_equal(en_regtab_add(t, m + 2000, 10), 0);
    assert_int_equal(en_regtab_add(t, m + 900, 100), 0);
    assert_int_equal(en_regtab_count(t), 3);
    assert_int_equal(en_regtab_remove(t, m + 1001), COH_EINVAL); /* not its start */
    assert_int_equal(en_regtab_remove(t, m + 1000), 0);
    assert_int_equal(en_regtab_remove(t, m + 1000), COH_EINVAL); /* twice */
    /* the space is free again, under a new identity */
    en_region_t a, b;
    assert_true(en_regtab_find(t, m + 2000, 10, &a));
    assert_int_equal(en_regtab_add(t, m + 1000, 1000), 0);
    assert_true(en_regtab_find(t, m + 1000, 1000, &b));
    assert_true(b.id > a.id);
    assert_false(en_regtab_find(t, m + 1000, 1001, &b)); /* runs into the next */
    fx_free(x);
}

static void test_lru_bound(void **state)
{
    fx_t *x = fx_new(3 * 4096); /* room for three */
    for (int i = 0; i < 4; i++) assert_int_equal(en_regtab_add(x->tab, x->mem + i * 8192, 4096), 0);
    en_reg_t *r[4];
    for (int i = 0; i < 3; i++) {
        r[i] = en_regcache_get(x->c, x->mem + i * 8192, 10);
        assert_non_null(r[i]);
    }
    /* all three in use: the fourth would pass the bound */
    assert_null(en_regcache_get(x->c, x->mem + 3 * 8192, 10));
    assert_int_equal(stats(x).failures, 1);
    assert_int_equal(x->f.deregs, 0);
    for (int i = 0; i < 3; i++) en_regcache_put(x->c, r[i]);
    /* use 0 again: 1 is now the least recently used */
    en_regcache_put(x->c, en_regcache_get(x->c, x->mem, 10));
    r[3] = en_regcache_get(x->c, x->mem + 3 * 8192, 10);
    assert_non_null(r[3]);
    en_regcache_stats_t s = stats(x);
    assert_int_equal(s.evictions, 1);
    assert_int_equal(s.entries, 3);
    assert_int_equal(s.pinned_bytes, 3 * 4096);
    assert_int_equal(x->f.live[1], 0); /* 1 went, 0 and 2 stayed */
    assert_int_not_equal(x->f.live[0], 0);
    assert_int_not_equal(x->f.live[2], 0);
    en_regcache_put(x->c, r[3]);
    /* 1 comes back as a new registration */
    int before = x->f.regs;
    en_regcache_put(x->c, en_regcache_get(x->c, x->mem + 8192, 10));
    assert_int_equal(x->f.regs, before + 1);
    fx_free(x);
}

static void test_deregister(void **state)
{
    fx_t *x = fx_new(0);
    assert_int_equal(en_regtab_add(x->tab, x->mem, 4096), 0);
    assert_int_equal(en_regtab_add(x->tab, x->mem + 8192, 4096), 0);
    en_reg_t *ra = en_regcache_get(x->c, x->mem, 10);
    en_reg_t *rb = en_regcache_get(x->c, x->mem + 8192, 10);
    en_regcache_put(x->c, rb); /* b unused, a in use */
    assert_int_equal(en_regtab_remove(x->tab, x->mem), 0);
    assert_int_equal(en_regtab_remove(x->tab, x->mem + 8192), 0);
    en_regcache_sweep(x->c);
    assert_int_equal(x->f.deregs, 1); /* b at once */
    assert_int_equal(x->f.live[1], 0);
    /* a is not handed out again, though its registration lives on */
    assert_null(en_regcache_get(x->c, x->mem, 10));
    /* declared again at the same address: a new registration beside the old */
    assert_int_equal(en_regtab_add(x->tab, x->mem, 4096), 0);
    en_reg_t *ra2 = en_regcache_get(x->c, x->mem, 10);
    assert_non_null(ra2);
    assert_ptr_not_equal(ra2, ra);
    assert_int_equal(x->f.regs, 3);
    en_regcache_put(x->c, ra); /* the last put of the stale one drops it */
    assert_int_equal(x->f.deregs, 2);
    assert_int_equal(x->f.live[0], 0);
    en_regcache_put(x->c, ra2);
    assert_int_equal(stats(x).entries, 1);
    fx_free(x);
}

static void test_register_failure(void **state)
{
    fx_t *x = fx_new(0);
    assert_int_equal(en_regtab_add(x->tab, x->mem, 4096), 0);
    x->f.fail_next = 1;
    assert_null(en_regcache_get(x->c, x->mem, 10));
    assert_int_equal(stats(x).failures, 1);
    assert_int_equal(stats(x).entries, 0);
    en_reg_t *r = en_regcache_get(x->c, x->mem, 10); /* tried again next time */
    assert_non_null(r);
    en_regcache_put(x->c, r);
    fx_free(x);
}

/* Another thread declares and takes back ranges while this one looks up:
 * every registration handed out lies inside a range declared at that time
 * (TSan sees the table's lock). */
typedef struct churn {
    en_regtab_t *tab;
    char *mem;
    _Atomic int stop;
} churn_t;

static void *churner(void *arg)
{
    churn_t *ch = arg;
    for (int i = 0; !ch->stop; i++) {
        char *p = ch->mem + (i % 8) * 65536;
        if (en_regtab_add(ch->tab, p, 65536) == 0) en_regtab_remove(ch->tab, p);
    }
    return NULL;
}

static void test_threads(void **state)
{
    fx_t *x = fx_new(4 * 65536);
    churn_t ch = {.tab = x->tab, .mem = x->mem};
    pthread_t th;
    pthread_create(&th, NULL, churner, &ch);
    int got = 0;
    for (int i = 0; i < 200000; i++) {
        char *p = x->mem + (i % 8) * 65536 + 100;
        en_reg_t *r = en_regcache_get(x->c, p, 1000);
        if (!r) continue;
        got++;
        assert_true((uintptr_t)p >= r->base && (uintptr_t)p + 1000 <= r->base + r->len);
        en_regcache_put(x->c, r);
    }
    ch.stop = 1;
    pthread_join(th, NULL);
    en_regcache_sweep(x->c);
    /* the churner took back all it declared: nothing stays registered */
    assert_int_equal(en_regtab_count(x->tab), 0);
    assert_int_equal(stats(x).entries, 0);
    print_message("%d of 200000 lookups found a declared range\n", got);
    fx_free(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_only_declared),    cmocka_unit_test(test_refuses_bad_declarations),
        cmocka_unit_test(test_lru_bound),        cmocka_unit_test(test_deregister),
        cmocka_unit_test(test_register_failure), cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
