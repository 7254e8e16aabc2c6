/*
 * The registration cache (en_regcache.h): declared ranges in a sorted
 * array under a mutex; per rail, a most-recently-used list of
 * registrations. Lists are short (a handful of declared buffers: weights,
 * gradients, a bucket pool), so searches are linear.
 */
#include "engines/en_regcache.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "base/bs_alloc.h"
#include "cohort.h"

struct en_regtab {
    pthread_mutex_t mu;
    en_region_t *r; /* by base */
    int n, cap;
    uint64_t next_id;
    _Atomic uint64_t removed; /* bumped by every remove: caches sweep when it moved */
};

en_regtab_t *en_regtab_new(void)
{
    en_regtab_t *t = coh_zalloc(sizeof(*t));
    if (!t) return NULL;
    pthread_mutex_init(&t->mu, NULL);
    t->next_id = 1;
    return t;
}

void en_regtab_free(en_regtab_t *t)
{
    if (!t) return;
    pthread_mutex_destroy(&t->mu);
    coh_free(t->r);
    coh_free(t);
}

int en_regtab_add(en_regtab_t *t, const void *ptr, size_t len)
{
    uintptr_t b = (uintptr_t)ptr;
    if (!ptr || len == 0 || b + len < b)
        return bs_fail(COH_EINVAL, "coh_mem_register: an empty or wrapping range");
    pthread_mutex_lock(&t->mu);
    int at = 0;
    while (at < t->n && t->r[at].base < b) at++;
    bool overlaps = (at > 0 && t->r[at - 1].base + t->r[at - 1].len > b) ||
                    (at < t->n && t->r[at].base < b + len);
    if (overlaps) {
        pthread_mutex_unlock(&t->mu);
        return bs_fail(COH_EINVAL, "coh_mem_register: [%p, +%zu) overlaps a registered range", ptr,
                       len);
    }
    if (t->n == t->cap) {
        int cap = t->cap ? t->cap * 2 : 8;
        en_region_t *r = coh_malloc((size_t)cap * sizeof(*r));
        if (!r) {
            pthread_mutex_unlock(&t->mu);
            return bs_fail(COH_ENOMEM, "coh_mem_register: no memory");
        }
        if (t->n) memcpy(r, t->r, (size_t)t->n * sizeof(*r));
        coh_free(t->r);
        t->r = r, t->cap = cap;
    }
    memmove(t->r + at + 1, t->r + at, (size_t)(t->n - at) * sizeof(*t->r));
    t->r[at] = (en_region_t){.id = t->next_id++, .base = b, .len = len};
    t->n++;
    pthread_mutex_unlock(&t->mu);
    return 0;
}

int en_regtab_remove(en_regtab_t *t, const void *ptr)
{
    pthread_mutex_lock(&t->mu);
    int at = 0;
    while (at < t->n && t->r[at].base != (uintptr_t)ptr) at++;
    if (at == t->n) {
        pthread_mutex_unlock(&t->mu);
        return bs_fail(COH_EINVAL, "coh_mem_deregister: %p does not start a registered range", ptr);
    }
    memmove(t->r + at, t->r + at + 1, (size_t)(t->n - at - 1) * sizeof(*t->r));
    t->n--;
    atomic_fetch_add(&t->removed, 1);
    pthread_mutex_unlock(&t->mu);
    return 0;
}

static bool find_locked(en_regtab_t *t, uintptr_t b, size_t len, uint64_t id, en_region_t *out)
{
    for (int i = 0; i < t->n; i++) {
        const en_region_t *r = &t->r[i];
        bool hit = id ? r->id == id : b >= r->base && len <= r->len && b - r->base <= r->len - len;
        if (hit) {
            if (out) *out = *r;
            return true;
        }
    }
    return false;
}

bool en_regtab_find(en_regtab_t *t, const void *ptr, size_t len, en_region_t *out)
{
    pthread_mutex_lock(&t->mu);
    bool hit = find_locked(t, (uintptr_t)ptr, len, 0, out);
    pthread_mutex_unlock(&t->mu);
    return hit;
}

int en_regtab_count(en_regtab_t *t)
{
    pthread_mutex_lock(&t->mu);
    int n = t->n;
    pthread_mutex_unlock(&t->mu);
    return n;
}

/* ---- a rail's registrations ---- */

struct en_regcache {
    en_regtab_t *tab;
    en_regcache_ops_t ops;
    size_t cap;
    en_reg_t *head, *tail; /* most recently used first */
    uint64_t seen_removed; /* tab->removed at the last sweep */
    en_regcache_stats_t st;
};

en_regcache_t *en_regcache_new(en_regtab_t *tab, const en_regcache_ops_t *ops, size_t cap_bytes)
{
    en_regcache_t *c = coh_zalloc(sizeof(*c));
    if (!c) return NULL;
    c->tab = tab;
    c->ops = *ops;
    c->cap = cap_bytes;
    return c;
}

static void unlink_reg(en_regcache_t *c, en_reg_t *r)
{
    if (r->prev)
        r->prev->next = r->next;
    else
        c->head = r->next;
    if (r->next)
        r->next->prev = r->prev;
    else
        c->tail = r->prev;
    r->prev = r->next = NULL;
}

static void push_front(en_regcache_t *c, en_reg_t *r)
{
    r->prev = NULL;
    r->next = c->head;
    if (c->head) c->head->prev = r;
    c->head = r;
    if (!c->tail) c->tail = r;
}

static void drop(en_regcache_t *c, en_reg_t *r)
{
    unlink_reg(c, r);
    c->ops.dereg(c->ops.arg, r->handle);
    c->st.deregs++;
    c->st.pinned_bytes -= r->len;
    c->st.entries--;
    coh_free(r);
}

void en_regcache_free(en_regcache_t *c)
{
    if (!c) return;
    while (c->head) drop(c, c->head);
    coh_free(c);
}

void en_regcache_sweep(en_regcache_t *c)
{
    uint64_t removed = atomic_load(&c->tab->removed);
    if (removed == c->seen_removed) return;
    c->seen_removed = removed;
    pthread_mutex_lock(&c->tab->mu);
    for (en_reg_t *r = c->head, *nx; r; r = nx) {
        nx = r->next;
        if (!r->stale && !find_locked(c->tab, 0, 0, r->id, NULL)) r->stale = true;
    }
    pthread_mutex_unlock(&c->tab->mu);
    for (en_reg_t *r = c->head, *nx; r; r = nx) {
        nx = r->next;
        if (r->stale && r->refs == 0) drop(c, r);
    }
}

/* Make room for len more bytes: unused registrations, least recent first. */
static bool make_room(en_regcache_t *c, size_t len)
{
    if (!c->cap) return true;
    for (en_reg_t *r = c->tail, *pv; r && c->st.pinned_bytes + len > c->cap; r = pv) {
        pv = r->prev;
        if (r->refs) continue;
        drop(c, r);
        c->st.evictions++;
    }
    return c->st.pinned_bytes + len <= c->cap;
}

en_reg_t *en_regcache_get(en_regcache_t *c, const void *ptr, size_t len)
{
    en_regcache_sweep(c);
    en_region_t reg;
    if (!en_regtab_find(c->tab, ptr, len, &reg)) {
        c->st.undeclared++;
        return NULL;
    }
    for (en_reg_t *r = c->head; r; r = r->next) {
        if (r->id != reg.id || r->stale) continue;
        c->st.hits++;
        r->refs++;
        if (r != c->head) unlink_reg(c, r), push_front(c, r);
        return r;
    }
    c->st.misses++;
    if (!make_room(c, reg.len)) {
        c->st.failures++;
        return NULL;
    }
    en_reg_t *r = coh_zalloc(sizeof(*r));
    if (!r) return NULL;
    if (c->ops.reg(c->ops.arg, (void *)reg.base, reg.len, &r->handle, &r->key) != 0) {
        c->st.failures++;
        coh_free(r);
        return NULL;
    }
    r->base = reg.base, r->len = reg.len, r->id = reg.id, r->refs = 1;
    push_front(c, r);
    c->st.regs++;
    c->st.pinned_bytes += r->len;
    c->st.entries++;
    return r;
}

void en_regcache_put(en_regcache_t *c, en_reg_t *r)
{
    if (--r->refs == 0 && r->stale) drop(c, r);
}

void en_regcache_stats(const en_regcache_t *c, en_regcache_stats_t *out)
{
    *out = c->st;
}
