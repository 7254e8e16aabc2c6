/*
 * gpu_dev.h - the device interface: memory, streams, events, copies and
 * reductions, the few calls the reactor's device ops need (rx_gpu.c).
 *
 * Two implementations behind one table:
 *   cuda - the CUDA runtime (gpu_dev_cuda.c, kernels in gpu_kernels.cu),
 *          built when the toolkit is found;
 *   host - device memory emulated in host memory, each stream a thread that
 *          runs its work in order (gpu_dev_host.c). It exists so that the
 *          staging pipeline and the event polling run, and are tested, on
 *          machines without a GPU (COHORT_GPU=host); it is never chosen on
 *          its own.
 * Handles are opaque pointers: a cudaStream_t / cudaEvent_t for cuda. A NULL
 * stream is the implementation's default stream (CUDA's legacy stream).
 * Every call may come from any thread; none blocks on device work except
 * the *_sync ones (tests, set-up) and copies of pageable host memory.
 */
#ifndef COH_GPU_DEV_H
#define COH_GPU_DEV_H

#include <stddef.h>
#include <stdint.h>

#include "cohort.h"

/* A device allocation another process on the host can map (CUDA IPC). */
#define GPU_IPC_BYTES 64
typedef struct gpu_ipc {
    uint8_t handle[GPU_IPC_BYTES]; /* cudaIpcMemHandle_t; the emulation's (pid, fd, inode) */
    uint64_t offset;               /* of the pointer in its allocation */
    uint64_t size;                 /* of the allocation (the emulation maps it) */
    int32_t pid;
    int32_t dev;
} gpu_ipc_t;

/* An operand read when the work runs, not when it is queued: tab[i] + off,
 * tab being device memory (a pointer table that a copy queued before the
 * work fills). Work on such operands does nothing when tab[0] != 0. The IPC
 * path queues its kernels at submission this way, before it knows the
 * peers' addresses: launched later from the GPU reactor, a kernel waited
 * for a caller's copy into pageable memory ordered after the op (the
 * driver's lock, gpu-lockprobe), and the op never ended. */
typedef struct gpu_ref {
    uint32_t i;
    uint64_t off;
} gpu_ref_t;

typedef struct gpu_dev {
    const char *name;
    /* 1: p is device memory (of device *dev), 0: host memory, < 0: error. */
    int (*is_device)(const void *p, int *dev);
    /* Make dev the calling thread's current device (cuda), the one before
     * in *prev (may be NULL); 0 or < 0. */
    int (*set_device)(int dev, int *prev);
    int (*dev_alloc)(void **p, size_t n);
    void (*dev_free)(void *p);
    /* Pinned where that means something, and mapped: wait_value's flags. A
     * copy between the device and other host memory (pageable) returns only
     * once done, after the stream's earlier work (CUDA's rule). */
    int (*host_alloc)(void **p, size_t n);
    void (*host_free)(void *p);
    int (*stream_new)(void **s); /* non-blocking with respect to the default stream */
    void (*stream_free)(void *s);
    int (*event_new)(void **e);
    void (*event_free)(void *e);
    /* e completes when the stream's work queued so far has. */
    int (*event_record)(void *e, void *stream);
    /* 1: complete (or never recorded), 0: pending, < 0: the device failed. */
    int (*event_query)(void *e);
    /* Work queued on stream after this waits for e's completion. */
    int (*stream_wait)(void *stream, void *e);
    /* Copy n bytes in either direction, in stream order. */
    int (*copy)(void *dst, const void *src, size_t n, void *stream);
    /* dst[i] = a[i] op b[i] on device memory, in stream order (the CPU
     * kernels' rules: gpu.h). */
    int (*reduce)(coh_dtype dt, coh_redop op, void *dst, const void *a, const void *b, size_t n,
                  void *stream);
    /* buf[i] /= divisor in stream order (gpu_cpu_div's rules). */
    int (*div)(coh_dtype dt, void *buf, size_t n, double divisor, void *stream);
    /* Copy n bytes from host_alloc memory to the device, reading the source
     * when the copy runs, not when it is queued (CUDA: a kernel reading it
     * through its mapping): a pointer table filled after the copy was queued. */
    int (*copy_mapped)(void *dst, const void *src, size_t n, void *stream);
    /* reduce, copy (n bytes) and div on gpu_ref_t operands of table tab. */
    int (*reduce_ref)(coh_dtype dt, coh_redop op, const uint64_t *tab, gpu_ref_t dst, gpu_ref_t a,
                      gpu_ref_t b, size_t n, void *stream);
    int (*copy_ref)(const uint64_t *tab, gpu_ref_t dst, gpu_ref_t src, size_t n, void *stream);
    int (*div_ref)(coh_dtype dt, const uint64_t *tab, gpu_ref_t buf, size_t n, double divisor,
                   void *stream);
    /* IPC: the handle of the allocation holding p; map a peer's allocation
     * (*base: its start here; add h->offset); unmap it. NULL: not offered. */
    int (*ipc_get)(const void *p, gpu_ipc_t *h);
    int (*ipc_open)(const gpu_ipc_t *h, void **base);
    void (*ipc_close)(void *base);
    /* Run fn(arg) on a host thread once the stream's earlier work is done;
     * fn must not call this interface (CUDA's rule for host functions). */
    int (*host_fn)(void *stream, void (*fn)(void *), void *arg);
    /* Work queued on stream after this waits until *flag >= value, flag
     * being host_alloc memory that a host thread writes (CUDA:
     * cuStreamWaitValue32 on mapped pinned memory). Unlike a host function
     * that waits, it holds no host thread and none of the runtime's locks. */
    int (*wait_value)(void *stream, volatile uint32_t *flag, uint32_t value);
    int (*stream_sync)(void *stream);
    /* Why the last failing call on this thread failed. */
    const char *(*last_error)(void);
} gpu_dev_t;

/* The implementations: NULL when not built (cuda without the toolkit). */
const gpu_dev_t *gpu_dev_host(void);
const gpu_dev_t *gpu_dev_cuda(void);
/* COHORT_GPU's values: "auto" (cuda when a device is present, else none),
 * "cuda", "host", "off". Returns the table or NULL; *why says why none. */
const gpu_dev_t *gpu_dev_pick(const char *mode, const char **why);

/* The CUDA kernels (gpu_kernels.cu), launched on a cudaStream_t. */
int gpu_cuda_reduce(coh_dtype dt, coh_redop op, void *dst, const void *a, const void *b, size_t n,
                    void *stream);
int gpu_cuda_div(coh_dtype dt, void *buf, size_t n, double divisor, void *stream);
int gpu_cuda_reduce_ref(coh_dtype dt, coh_redop op, const uint64_t *tab, gpu_ref_t dst, gpu_ref_t a,
                        gpu_ref_t b, size_t n, void *stream);
int gpu_cuda_copy(void *dst, const void *src, size_t n, void *stream);
int gpu_cuda_copy_ref(const uint64_t *tab, gpu_ref_t dst, gpu_ref_t src, size_t n, void *stream);
int gpu_cuda_div_ref(coh_dtype dt, const uint64_t *tab, gpu_ref_t buf, size_t n, double divisor,
                     void *stream);

#endif
