/*
 * The host implementation of the device interface (COHORT_GPU=host): what
 * the staging pipeline and the event polling run against on a machine with
 * no GPU.
 *
 * Faithful where it matters for the code above it:
 * - "device" memory is not host-addressable: dev_alloc hands out an address
 *   range reserved PROT_NONE, backed by an unnamed file mapped elsewhere, so a host
 *   access to a device pointer faults as it would on a GPU; only copy,
 *   reduce and div (which translate) reach the data;
 * - IPC as CUDA's: another process of the same user maps an allocation by
 *   its handle (the owner's pid, the file's descriptor and inode, opened
 *   through /proc/PID/fd), at an address of its own;
 * - a stream is a thread that runs its queue in order, so copies, kernels
 *   and events complete later than they are issued, and an event is
 *   pending until its stream gets there;
 * - pageable host memory (not from host_alloc) as CUDA treats it: a copy
 *   from it reads it when issued, not in stream order; a copy into it
 *   returns only once done, after its stream's earlier work;
 * - the driver's lock, as gpu-lockprobe measured it on an H200: a thread in
 *   a copy into pageable memory holds it until the copy is done, and
 *   making or destroying streams, events, memory and mappings, and
 *   launching kernels, wait for it; freeing memory waits for every stream;
 *   mapping or unmapping a peer's allocation waits while any thread is in
 *   stream_sync or a host function runs (measured 2026-11-28), and so does
 *   enqueuing a host function behind a pageable copy.
 */
#include "gpu/gpu_dev.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "gpu/gpu.h"

static _Thread_local char err_text[160];

/* The driver's lock (above): readers are the pageable copies waiting. */
static pthread_rwlock_t drv_lock = PTHREAD_RWLOCK_INITIALIZER;

static void drv_gate(void)
{
    pthread_rwlock_wrlock(&drv_lock);
    pthread_rwlock_unlock(&drv_lock);
}

/* Threads in stream_sync and host functions running: IPC (un)mapping waits
 * for them all to be out. */
static _Atomic int syncing;

static void ipc_gate(void)
{
    drv_gate();
    while (atomic_load(&syncing) > 0) {
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
    }
}

static void device_sync(void);

static int fail(int st, const char *what)
{
    snprintf(err_text, sizeof(err_text), "%s", what);
    return st;
}

/* ---- emulated device memory ---- */

typedef struct region {
    char *dev; /* the reserved, inaccessible range */
    char *mem; /* where its bytes live (a mapping of fd) */
    size_t n;
    int fd;        /* the memfd (-1 for a peer's allocation mapped here) */
    uint64_t ino;  /* its inode: a handle names it, not a reused descriptor */
    bool imported; /* a peer's (ipc_open): ipc_close unmaps it */
} region_t;

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static region_t *regs;
static size_t nregs, capregs;

/* Under reg_mu: the region holding p, or NULL. */
static region_t *reg_find(const void *p)
{
    const char *c = p;
    for (size_t i = 0; i < nregs; i++)
        if (c >= regs[i].dev && c < regs[i].dev + regs[i].n) return &regs[i];
    return NULL;
}

/* The bytes behind p (a device or host address), or NULL when [p, p+n)
 * leaves its device region. */
static void *xlate(const void *p, size_t n)
{
    pthread_mutex_lock(&reg_mu);
    region_t *r = reg_find(p);
    void *out = (void *)p;
    if (r) {
        size_t off = (size_t)((const char *)p - r->dev);
        out = n <= r->n - off ? r->mem + off : NULL;
    }
    pthread_mutex_unlock(&reg_mu);
    return out;
}

static int h_is_device(const void *p, int *dev)
{
    pthread_mutex_lock(&reg_mu);
    int yes = reg_find(p) != NULL;
    pthread_mutex_unlock(&reg_mu);
    if (dev) *dev = 0;
    return yes;
}

static int h_set_device(int dev, int *prev)
{
    if (prev) *prev = 0;
    return dev == 0 ? 0 : fail(COH_EINVAL, "the host device emulation has device 0 only");
}

/* Register the pair (dev, mem) of n bytes; false when out of memory. */
static bool reg_add(const region_t *r)
{
    pthread_mutex_lock(&reg_mu);
    if (nregs == capregs) {
        size_t cap = capregs ? capregs * 2 : 16;
        region_t *nr = realloc(regs, cap * sizeof(*nr));
        if (nr) {
            regs = nr;
            capregs = cap;
        }
    }
    bool ok = nregs < capregs;
    if (ok) regs[nregs++] = *r;
    pthread_mutex_unlock(&reg_mu);
    return ok;
}

static void region_drop(const region_t *r)
{
    if (r->mem) munmap(r->mem, r->n);
    if (r->dev) munmap(r->dev, r->n);
    if (r->fd >= 0) close(r->fd);
}

/* Map fd's n bytes behind a fresh inaccessible range. */
static int region_map(int fd, size_t n, region_t *r)
{
    *r = (region_t){.fd = -1};
    r->dev = mmap(NULL, n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    r->mem = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    r->n = n;
    if (r->dev == MAP_FAILED || r->mem == MAP_FAILED) {
        if (r->dev == MAP_FAILED) r->dev = NULL;
        if (r->mem == MAP_FAILED) r->mem = NULL;
        region_drop(r);
        return fail(COH_ENOMEM, "cannot map emulated device memory");
    }
    return 0;
}

static int h_dev_alloc(void **p, size_t n)
{
    drv_gate();
    if (!n) n = 1;
    /* An unnamed file in /dev/shm (open, which the sanitizers see: TSan
     * takes a memfd's descriptor for an older file's of the same number);
     * a memfd where that is refused. */
    int fd = open("/dev/shm", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) fd = memfd_create("cohort-gpu-emulation", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)n) != 0) {
        if (fd >= 0) close(fd);
        return fail(COH_ENOMEM, "cannot make emulated device memory (memfd)");
    }
    region_t r;
    if (region_map(fd, n, &r) < 0) {
        close(fd);
        return COH_ENOMEM;
    }
    struct stat st;
    r.fd = fd;
    r.ino = fstat(fd, &st) == 0 ? (uint64_t)st.st_ino : 0;
    if (!reg_add(&r)) {
        region_drop(&r);
        return fail(COH_ENOMEM, "out of emulated device memory");
    }
    *p = r.dev;
    return 0;
}

/* Remove the region that starts at p (imported or not, as asked). */
static void reg_remove(void *p, bool imported)
{
    if (!p) return;
    pthread_mutex_lock(&reg_mu);
    region_t *r = reg_find(p);
    region_t gone = {.fd = -1};
    if (r && r->dev == p && r->imported == imported) {
        gone = *r;
        *r = regs[--nregs];
    }
    pthread_mutex_unlock(&reg_mu);
    if (gone.dev) region_drop(&gone);
}

static void h_dev_free(void *p)
{
    drv_gate();
    device_sync();
    reg_remove(p, false);
}

/* The handle: pid, then the memfd's descriptor and inode. */
static int h_ipc_get(const void *p, gpu_ipc_t *h)
{
    memset(h, 0, sizeof(*h));
    pthread_mutex_lock(&reg_mu);
    region_t *r = reg_find(p);
    region_t copy = r ? *r : (region_t){.fd = -1};
    pthread_mutex_unlock(&reg_mu);
    if (!copy.dev || copy.imported) return fail(COH_EINVAL, "not an emulated device allocation");
    int32_t fd = copy.fd;
    memcpy(h->handle, &fd, sizeof(fd));
    memcpy(h->handle + 8, &copy.ino, sizeof(copy.ino));
    h->offset = (uint64_t)((const char *)p - copy.dev);
    h->size = copy.n;
    h->pid = (int32_t)getpid();
    return 0;
}

static int h_ipc_open(const gpu_ipc_t *h, void **base)
{
    ipc_gate();
    int32_t fd;
    uint64_t ino;
    memcpy(&fd, h->handle, sizeof(fd));
    memcpy(&ino, h->handle + 8, sizeof(ino));
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)h->pid, (int)fd);
    int mine = open(path, O_RDWR | O_CLOEXEC);
    struct stat st;
    if (mine < 0 || fstat(mine, &st) != 0 || (uint64_t)st.st_ino != ino) {
        if (mine >= 0) close(mine);
        snprintf(err_text, sizeof(err_text), "opening %s: %s", path,
                 mine < 0 ? strerror(errno) : "another file (the allocation was freed)");
        return COH_EINVAL;
    }
    region_t r;
    int st2 = region_map(mine, (size_t)h->size, &r);
    close(mine); /* the mapping keeps it */
    if (st2 < 0) return st2;
    r.imported = true;
    if (!reg_add(&r)) {
        region_drop(&r);
        return fail(COH_ENOMEM, "out of memory");
    }
    *base = r.dev;
    return 0;
}

static void h_ipc_close(void *base)
{
    ipc_gate();
    reg_remove(base, true);
}

/* host_alloc's blocks ("pinned"): a copy of anything else is synchronous. */
typedef struct pinned {
    struct pinned *next;
    char *p;
    size_t n;
} pinned_t;
static pthread_mutex_t pin_mu = PTHREAD_MUTEX_INITIALIZER;
static pinned_t *pins;

static int h_host_alloc(void **p, size_t n)
{
    drv_gate();
    pinned_t *b = malloc(sizeof(*b));
    *p = malloc(n ? n : 1);
    if (!*p || !b) {
        free(*p);
        free(b);
        return fail(COH_ENOMEM, "out of host memory");
    }
    *b = (pinned_t){.p = *p, .n = n ? n : 1};
    pthread_mutex_lock(&pin_mu);
    b->next = pins;
    pins = b;
    pthread_mutex_unlock(&pin_mu);
    return 0;
}

/* COHORT_TEST_GPU_FREE_US (tests): how long a pinned free takes before it
 * synchronizes the device (cudaFreeHost takes about a millisecond); long,
 * it opens the window in which another thread queues work that the free's
 * synchronization then waits for (mp.gpu.host.graves). */
static long free_delay_us(void)
{
    static _Atomic long v = -1;
    long d = atomic_load(&v);
    if (d < 0) {
        const char *e = getenv("COHORT_TEST_GPU_FREE_US");
        d = e ? atol(e) : 0;
        atomic_store(&v, d > 0 ? d : 0);
    }
    return d;
}

static void h_host_free(void *p)
{
    if (!p) return;
    drv_gate();
    long us = free_delay_us();
    if (us > 0) {
        struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
        nanosleep(&ts, NULL);
    }
    device_sync();
    pthread_mutex_lock(&pin_mu);
    pinned_t *gone = NULL;
    for (pinned_t **pp = &pins; *pp; pp = &(*pp)->next)
        if ((*pp)->p == p) {
            gone = *pp;
            *pp = gone->next;
            break;
        }
    pthread_mutex_unlock(&pin_mu);
    free(gone);
    free(p);
}

/* [p, p+n) is device memory or inside a host_alloc block. */
static bool dev_or_pinned(const void *p, size_t n)
{
    pthread_mutex_lock(&reg_mu);
    bool dev = reg_find(p) != NULL;
    pthread_mutex_unlock(&reg_mu);
    if (dev) return true;
    const char *c = p;
    bool in = false;
    pthread_mutex_lock(&pin_mu);
    for (pinned_t *b = pins; b && !in; b = b->next) in = c >= b->p && c + n <= b->p + b->n;
    pthread_mutex_unlock(&pin_mu);
    return in;
}

/* ---- streams and events ---- */

typedef struct hevent {
    _Atomic uint64_t recorded;  /* records issued */
    _Atomic uint64_t completed; /* the newest record its stream reached */
} hevent_t;

typedef enum {
    W_COPY,
    W_REDUCE,
    W_DIV,
    W_RECORD,
    W_WAIT,
    W_WAITV,
    W_FN,
    W_COPY_REF, /* the same three on gpu_ref_t operands, resolved when run */
    W_REDUCE_REF,
    W_DIV_REF
} work_kind;

typedef struct work {
    struct work *next;
    work_kind kind;
    void *dst;
    const void *a, *b;
    size_t n;
    coh_dtype dt;
    coh_redop op;
    double divisor;
    hevent_t *ev;
    uint64_t gen;
    void (*fn)(void *);
    void *arg;
    volatile uint32_t *flag; /* W_WAITV: until *flag >= gen */
    const uint64_t *tab;     /* W_*_REF: the device table, and dst, a, b in it */
    gpu_ref_t ref[3];
} work_t;

typedef struct hstream {
    struct hstream *next_all; /* every stream, for device_sync */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    work_t *head, *tail;
    bool stop;
    _Atomic int failed; /* a copy or kernel failed: later events fail too */
} hstream_t;

/* A W_*_REF's operands into dst, a, b (host addresses of n bytes each);
 * false when the table says skip (tab[0] != 0) or an operand leaves its
 * emulated allocation (the stream fails, as a kernel's fault would). */
static bool resolve(hstream_t *s, const work_t *w, size_t n, void **out)
{
    const uint64_t *tab = xlate(w->tab, sizeof(uint64_t));
    if (!tab) {
        atomic_store(&s->failed, 1);
        return false;
    }
    if (tab[0]) return false;
    int nops = w->kind == W_DIV_REF ? 1 : w->kind == W_COPY_REF ? 2 : 3;
    for (int k = 0; k < nops; k++) {
        const gpu_ref_t *r = &w->ref[k];
        const uint64_t *e = xlate(w->tab + r->i, sizeof(uint64_t));
        out[k] = e ? xlate((const char *)(uintptr_t)*e + r->off, n) : NULL;
        if (!out[k]) {
            atomic_store(&s->failed, 1);
            return false;
        }
    }
    return true;
}

static void run_work(hstream_t *s, work_t *w)
{
    switch (w->kind) {
    case W_COPY:
        memmove(w->dst, w->a, w->n);
        free(w->arg); /* a pageable source's snapshot */
        break;
    case W_REDUCE:
        if (gpu_cpu_reduce(w->dt, w->op, w->dst, w->a, w->b, w->n) < 0) atomic_store(&s->failed, 1);
        break;
    case W_DIV:
        if (gpu_cpu_div(w->dt, w->dst, w->n, w->divisor) < 0) atomic_store(&s->failed, 1);
        break;
    case W_RECORD: {
        /* CUDA's event is its newest record: an older one ending later
         * changes nothing. */
        uint64_t c = atomic_load(&w->ev->completed);
        while (c < w->gen && !atomic_compare_exchange_weak(&w->ev->completed, &c, w->gen)) {
        }
        break;
    }
    case W_WAIT:
        while (atomic_load(&w->ev->completed) < w->gen) {
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
        }
        break;
    case W_WAITV:
        while (__atomic_load_n(w->flag, __ATOMIC_ACQUIRE) < (uint32_t)w->gen) {
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
        }
        break;
    case W_COPY_REF:
    case W_REDUCE_REF:
    case W_DIV_REF: { /* resolved, it runs as the direct kind */
        void *p[3] = {0};
        size_t bytes = w->kind == W_COPY_REF ? w->n : w->n * coh_dtype_size(w->dt);
        if (!resolve(s, w, bytes, p)) break;
        w->kind = w->kind == W_COPY_REF ? W_COPY : w->kind == W_REDUCE_REF ? W_REDUCE : W_DIV;
        w->dst = p[0], w->a = p[1], w->b = p[2];
        run_work(s, w);
        break;
    }
    case W_FN:
        atomic_fetch_add(&syncing, 1);
        w->fn(w->arg);
        atomic_fetch_sub(&syncing, 1);
        break;
    }
}

static void *stream_main(void *arg)
{
    hstream_t *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->stop) pthread_cond_wait(&s->cv, &s->mu);
        if (!s->head) break; /* stopped and drained */
        work_t *w = s->head;
        s->head = w->next;
        if (!s->head) s->tail = NULL;
        pthread_mutex_unlock(&s->mu);
        run_work(s, w);
        free(w);
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static pthread_mutex_t all_mu = PTHREAD_MUTEX_INITIALIZER;
static hstream_t *all_streams;

static int h_stream_new(void **out)
{
    drv_gate();
    hstream_t *s = calloc(1, sizeof(*s));
    if (!s) return fail(COH_ENOMEM, "out of memory");
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (pthread_create(&s->thread, NULL, stream_main, s) != 0) {
        free(s);
        return fail(COH_ENOMEM, "cannot start an emulated stream's thread");
    }
    pthread_mutex_lock(&all_mu);
    s->next_all = all_streams;
    all_streams = s;
    pthread_mutex_unlock(&all_mu);
    *out = s;
    return 0;
}

static void h_stream_free(void *p)
{
    drv_gate();
    hstream_t *s = p;
    if (!s) return;
    pthread_mutex_lock(&all_mu);
    for (hstream_t **pp = &all_streams; *pp; pp = &(*pp)->next_all)
        if (*pp == s) {
            *pp = s->next_all;
            break;
        }
    pthread_mutex_unlock(&all_mu);
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}

/* The default stream (NULL): made on first use, lives as long as the
 * process. */
static hstream_t *default_stream;
static pthread_once_t default_once = PTHREAD_ONCE_INIT;
static void make_default(void)
{
    void *s = NULL;
    if (h_stream_new(&s) == 0) default_stream = s;
}

static hstream_t *stream_of(void *s)
{
    if (s) return s;
    pthread_once(&default_once, make_default);
    return default_stream;
}

static int push(void *stream, work_t *w)
{
    hstream_t *s = stream_of(stream);
    if (!s) {
        free(w);
        return fail(COH_ENOMEM, "no default stream");
    }
    pthread_mutex_lock(&s->mu);
    if (s->tail)
        s->tail->next = w;
    else
        s->head = w;
    s->tail = w;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

static work_t *work_new(work_kind k)
{
    work_t *w = calloc(1, sizeof(*w));
    if (w) w->kind = k;
    return w;
}

static int h_event_new(void **out)
{
    drv_gate();
    hevent_t *e = calloc(1, sizeof(*e));
    if (!e) return fail(COH_ENOMEM, "out of memory");
    *out = e;
    return 0;
}

static void h_event_free(void *e)
{
    drv_gate();
    free(e);
}

static int h_event_record(void *ev, void *stream)
{
    hevent_t *e = ev;
    work_t *w = work_new(W_RECORD);
    if (!w) return fail(COH_ENOMEM, "out of memory");
    w->ev = e;
    w->gen = atomic_fetch_add(&e->recorded, 1) + 1;
    return push(stream, w);
}

static int h_event_query(void *ev)
{
    hevent_t *e = ev;
    return atomic_load(&e->completed) >= atomic_load(&e->recorded) ? 1 : 0;
}

static int h_stream_wait(void *stream, void *ev)
{
    hevent_t *e = ev;
    work_t *w = work_new(W_WAIT);
    if (!w) return fail(COH_ENOMEM, "out of memory");
    w->ev = e;
    w->gen = atomic_load(&e->recorded);
    return push(stream, w);
}

static int h_stream_sync(void *stream);

static int h_copy(void *dst, const void *src, size_t n, void *stream)
{
    void *d = xlate(dst, n);
    const void *s = xlate(src, n);
    if (!d || !s) return fail(COH_EINVAL, "a copy leaves its emulated device allocation");
    work_t *w = work_new(W_COPY);
    if (!w) return fail(COH_ENOMEM, "out of memory");
    w->dst = d;
    w->a = s;
    w->n = n;
    /* Pageable memory, as CUDA: a source is read now, when the copy is
     * issued (staged), and a destination is written before the call returns. */
    if (!dev_or_pinned(src, n)) {
        w->arg = malloc(n ? n : 1);
        if (!w->arg) {
            free(w);
            return fail(COH_ENOMEM, "out of memory");
        }
        memcpy(w->arg, s, n);
        w->a = w->arg;
    }
    bool sync = !dev_or_pinned(dst, n);
    int st = push(stream, w);
    if (st < 0 || !sync) return st;
    pthread_rwlock_rdlock(&drv_lock);
    st = h_stream_sync(stream);
    pthread_rwlock_unlock(&drv_lock);
    return st;
}

static int h_reduce(coh_dtype dt, coh_redop op, void *dst, const void *a, const void *b, size_t n,
                    void *stream)
{
    drv_gate();
    size_t bytes = n * coh_dtype_size(dt);
    void *d = xlate(dst, bytes);
    const void *x = xlate(a, bytes), *y = xlate(b, bytes);
    if (!d || !x || !y) return fail(COH_EINVAL, "a reduction leaves its emulated allocation");
    if (!coh_dtype_size(dt) || (unsigned)op >= COH_REDOP_COUNT)
        return fail(COH_EINVAL, "unknown dtype or op");
    work_t *w = work_new(W_REDUCE);
    if (!w) return fail(COH_ENOMEM, "out of memory");
    *w = (work_t){.kind = W_REDUCE, .dst = d, .a = x, .b = y, .n = n, .dt = dt, .op = op};
    return push(stream, w);
}

static int h_div(coh_dtype dt, void *buf, size_t n, double divisor, void *stream)
{
    drv_gate();
    void *d = xlate(buf, n * coh_dtype_size(dt));
    if (!d) return fail(COH_EINVAL, "a division leaves its emulated allocation");
    if (gpu_div_check(dt, divisor) < 0) return fail(COH_EINVAL, "bad divisor");
    work_t *w = work_new(W_DIV);
    if (!w) return fail(COH_ENOMEM, "out of memory");
    *w = (work_t){.kind = W_DIV, .dst = d, .n = n, .dt = dt, .divisor = divisor};
    return push(stream, w);
}

/* CUDA's is a kernel (the driver's lock); a pinned source is read when
 * the copy runs here anyway. */
static int h_copy_mapped(void *dst, const void *src, size_t n, void *stream)
{
    drv_gate();
    if (!dev_or_pinned(src, n)) return fail(COH_EINVAL, "copy_mapped: not host_alloc memory");
    return h_copy(dst, src, n, stream);
}

/* Kernels on table operands: launched (the driver's lock) now, resolved
 * when the stream runs them. */
static int push_ref(work_kind k, const uint64_t *tab, const gpu_ref_t *refs, int nrefs, size_t n,
                    coh_dtype dt, coh_redop op, double divisor, void *stream)
{
    drv_gate();
    if (k != W_COPY_REF && !coh_dtype_size(dt)) return fail(COH_EINVAL, "unknown dtype");
    if (k == W_REDUCE_REF && (unsigned)op >= COH_REDOP_COUNT) return fail(COH_EINVAL, "unknown op");
    if (k == W_DIV_REF && gpu_div_check(dt, divisor) < 0) return fail(COH_EINVAL, "bad divisor");
    work_t *w = work_new(k);
    if (!w) return fail(COH_ENOMEM, "out of memory");
    w->tab = tab;
    for (int i = 0; i < nrefs; i++) w->ref[i] = refs[i];
    w->n = n;
    w->dt = dt;
    w->op = op;
    w->divisor = divisor;
    return push(stream, w);
}

static int h_reduce_ref(coh_dtype dt, coh_redop op, const uint64_t *tab, gpu_ref_t dst, gpu_ref_t a,
                        gpu_ref_t b, size_t n, void *stream)
{
    gpu_ref_t r[3] = {dst, a, b};
    return push_ref(W_REDUCE_REF, tab, r, 3, n, dt, op, 0, stream);
}

static int h_copy_ref(const uint64_t *tab, gpu_ref_t dst, gpu_ref_t src, size_t n, void *stream)
{
    gpu_ref_t r[2] = {dst, src};
    return push_ref(W_COPY_REF, tab, r, 2, n, COH_U8, COH_SUM, 0, stream);
}

static int h_div_ref(coh_dtype dt, const uint64_t *tab, gpu_ref_t buf, size_t n, double divisor,
                     void *stream)
{
    return push_ref(W_DIV_REF, tab, &buf, 1, n, dt, COH_SUM, divisor, stream);
}

static int h_host_fn(void *stream, void (*fn)(void *), void *arg)
{
    drv_gate();
    work_t *w = work_new(W_FN);
    if (!w) return fail(COH_ENOMEM, "out of memory");
    w->fn = fn;
    w->arg = arg;
    return push(stream, w);
}

static int h_stream_sync(void *stream)
{
    hevent_t e = {0};
    int st = h_event_record(&e, stream);
    if (st < 0) return st;
    while (!h_event_query(&e)) {
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    }
    return atomic_load(&stream_of(stream)->failed) ? fail(COH_EINVAL, "a kernel failed") : 0;
}

/* The interface's stream_sync: counted (ipc_gate). */
static int h_stream_sync_api(void *stream)
{
    atomic_fetch_add(&syncing, 1);
    int st = h_stream_sync(stream);
    atomic_fetch_sub(&syncing, 1);
    return st;
}

/* cudaFree's: every stream's work queued so far is done. */
static void device_sync(void)
{
    pthread_mutex_lock(&all_mu);
    for (hstream_t *s = all_streams; s; s = s->next_all) h_stream_sync(s);
    pthread_mutex_unlock(&all_mu);
}

static int h_wait_value(void *stream, volatile uint32_t *flag, uint32_t value)
{
    work_t *w = work_new(W_WAITV);
    if (!w) return fail(COH_ENOMEM, "out of memory");
    w->flag = flag;
    w->gen = value;
    return push(stream, w);
}

static const char *h_last_error(void)
{
    return err_text;
}

static const gpu_dev_t host_dev = {
    .name = "host",
    .is_device = h_is_device,
    .set_device = h_set_device,
    .dev_alloc = h_dev_alloc,
    .dev_free = h_dev_free,
    .host_alloc = h_host_alloc,
    .host_free = h_host_free,
    .stream_new = h_stream_new,
    .stream_free = h_stream_free,
    .event_new = h_event_new,
    .event_free = h_event_free,
    .event_record = h_event_record,
    .event_query = h_event_query,
    .stream_wait = h_stream_wait,
    .copy = h_copy,
    .reduce = h_reduce,
    .div = h_div,
    .copy_mapped = h_copy_mapped,
    .reduce_ref = h_reduce_ref,
    .copy_ref = h_copy_ref,
    .div_ref = h_div_ref,
    .ipc_get = h_ipc_get,
    .ipc_open = h_ipc_open,
    .ipc_close = h_ipc_close,
    .host_fn = h_host_fn,
    .wait_value = h_wait_value,
    .stream_sync = h_stream_sync_api,
    .last_error = h_last_error,
};

const gpu_dev_t *gpu_dev_host(void)
{
    return &host_dev;
}

const gpu_dev_t *gpu_dev_pick(const char *mode, const char **why)
{
    static const char *none = "";
    *why = none;
    if (!mode || !*mode || !strcmp(mode, "auto")) {
        const gpu_dev_t *c = gpu_dev_cuda();
        if (c && gpu_device_count() > 0) return c;
        *why = c ? "no CUDA device is visible" : "this build has no CUDA";
        return NULL;
    }
    if (!strcmp(mode, "off")) {
        *why = "COHORT_GPU=off";
        return NULL;
    }
    if (!strcmp(mode, "host")) return gpu_dev_host();
    if (!strcmp(mode, "cuda")) {
        const gpu_dev_t *c = gpu_dev_cuda();
        if (!c)
            *why = "COHORT_GPU=cuda but this build has no CUDA";
        else if (gpu_device_count() <= 0)
            *why = "COHORT_GPU=cuda but no CUDA device is visible";
        return *why == none ? c : NULL;
    }
    *why = "COHORT_GPU must be auto, cuda, host or off";
    return NULL;
}
