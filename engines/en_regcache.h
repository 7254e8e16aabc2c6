/*
 * en_regcache.h - memory the application declared for zero copy
 * (coh_mem_register) and, per rail, the registrations a transport makes of
 * it on demand: a registration cache (the verbs engine's memory regions).
 *
 * Only declared memory is ever registered. A cache that registered any
 * buffer it was given could not tell when the application frees it: the
 * same address, reallocated, would be written through the old pages. The
 * declaration is the application's promise that the range stays mapped
 * until it takes it back (as NCCL's ncclCommRegister).
 *
 * Threading: the table (en_regtab_t) is shared, under its own lock: the
 * application's thread adds and removes, the rails' loops look up. Each
 * cache (en_regcache_t) belongs to one rail's loop thread.
 */
#ifndef COH_EN_REGCACHE_H
#define COH_EN_REGCACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- the declared ranges of a context ---- */

typedef struct en_regtab en_regtab_t;

typedef struct en_region {
    uint64_t id; /* unique for the table's life: never reused */
    uintptr_t base;
    size_t len;
} en_region_t;

en_regtab_t *en_regtab_new(void);
void en_regtab_free(en_regtab_t *t);
/* Declare [ptr, ptr+len): COH_EINVAL when empty, wrapping or overlapping a
 * declared range (reason set). Ranges never overlap, so ptr names it. */
int en_regtab_add(en_regtab_t *t, const void *ptr, size_t len);
/* Take back the declaration starting at ptr: COH_EINVAL when there is none.
 * Caches drop their registrations of it at their next use (en_regcache_get
 * / _sweep). */
int en_regtab_remove(en_regtab_t *t, const void *ptr);
/* The declared range holding all of [ptr, ptr+len), if any. */
bool en_regtab_find(en_regtab_t *t, const void *ptr, size_t len, en_region_t *out);
int en_regtab_count(en_regtab_t *t);

/* ---- one rail's registrations of declared memory ---- */

/* How a transport registers memory: reg makes a registration of
 * [addr, addr+len) (*handle, *key: the transport's, e.g. an ibv_mr and its
 * lkey) and returns 0 or a status; dereg undoes one. */
typedef struct en_regcache_ops {
    void *arg;
    int (*reg)(void *arg, void *addr, size_t len, void **handle, uint32_t *key);
    void (*dereg)(void *arg, void *handle);
} en_regcache_ops_t;

typedef struct en_reg {
    void *handle;
    uint32_t key;
    uintptr_t base; /* the whole declared range is registered */
    size_t len;
    /* private */
    uint64_t id;
    int refs;
    bool stale;                 /* its declaration was taken back: deregistered at the last put */
    struct en_reg *prev, *next; /* most recently used first */
} en_reg_t;

typedef struct en_regcache_stats {
    uint64_t hits, misses; /* gets of declared memory: registered already, or not */
    uint64_t undeclared;   /* gets of memory nobody declared */
    uint64_t regs, deregs, evictions, failures;
    size_t pinned_bytes; /* registered now */
    int entries;
} en_regcache_stats_t;

typedef struct en_regcache en_regcache_t;

/* cap_bytes bounds what stays registered: least recently used registrations
 * that nothing holds go first; 0 = no bound. */
en_regcache_t *en_regcache_new(en_regtab_t *tab, const en_regcache_ops_t *ops, size_t cap_bytes);
/* Deregisters everything; every get must have been put. */
void en_regcache_free(en_regcache_t *c);
/* A registration covering [ptr, ptr+len), held until en_regcache_put, or
 * NULL: the range is not declared, registering failed, or it would pass
 * the bound with everything registered in use (the caller copies). */
en_reg_t *en_regcache_get(en_regcache_t *c, const void *ptr, size_t len);
void en_regcache_put(en_regcache_t *c, en_reg_t *r);
/* Drop the registrations whose declaration was taken back (those in use
 * at their last put). */
void en_regcache_sweep(en_regcache_t *c);
void en_regcache_stats(const en_regcache_t *c, en_regcache_stats_t *out);

#endif
