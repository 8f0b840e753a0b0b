/* cpu_backend.c: the CPU backend's lifetime, memory ops and op table.
 *
 * Memory is plain host memory. alloc() returns 64-byte aligned, zero-filled
 * buffers from calloc (large ones come from fresh anonymous mappings and stay
 * uncommitted until touched); the pointer calloc gave is kept in the 8 bytes
 * just before the aligned block so free() can find it. map_weights() hands
 * back the host pointer itself: weights are read straight from the caller's
 * (usually mmapped) bytes. upload/download/copy are memcpy; sync is a no-op
 * because every op finishes before it returns.
 *
 * Not here: the ops themselves (one file each), the thread pool (cpu_pool.c).
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu_backend.h"
#include "error.h"

#define CPU_ALIGN 64

int cpu_backend_check_dtype(enum kern_dtype dtype, const char *what, char *err)
{
    switch (dtype) {
    case KERN_DTYPE_BF16:
    case KERN_DTYPE_F16:
    case KERN_DTYPE_F32: return 0;
    }
    return error_set(err, ERR_UNSUPPORTED, "cpu %s: unsupported weight dtype %d", what, (int)dtype);
}

static void *cpu_aligned_calloc(size_t size_bytes)
{
    if (size_bytes > SIZE_MAX - CPU_ALIGN - sizeof(void *))
        return NULL;
    char *raw = calloc(1, size_bytes + CPU_ALIGN + sizeof(void *));
    if (!raw)
        return NULL;
    uintptr_t p = ((uintptr_t)raw + sizeof(void *) + CPU_ALIGN - 1) & ~(uintptr_t)(CPU_ALIGN - 1);
    memcpy((char *)p - sizeof(void *), &raw, sizeof(raw));
    return (void *)p;
}

static void cpu_aligned_free(void *ptr)
{
    if (!ptr)
        return;
    char *raw;
    memcpy(&raw, (char *)ptr - sizeof(void *), sizeof(raw));
    free(raw);
}

int cpu_backend_scratch_reserve(struct cpu_backend *cb, size_t bytes_per_thread, char *err)
{
    if (bytes_per_thread <= cb->scratch_bytes)
        return 0;
    size_t want = cb->scratch_bytes ? cb->scratch_bytes : 4096;
    while (want < bytes_per_thread)
        want = want > SIZE_MAX / 2 ? bytes_per_thread : want * 2;
    for (int t = 0; t < cb->n_threads; t++) {
        cpu_aligned_free(cb->scratch[t]);
        cb->scratch[t] = NULL;
    }
    cb->scratch_bytes = 0;
    for (int t = 0; t < cb->n_threads; t++) {
        cb->scratch[t] = cpu_aligned_calloc(want);
        if (!cb->scratch[t])
            return error_set(err, ERR_NOMEM, "cpu backend: out of memory for %zu bytes of scratch",
                             want);
    }
    cb->scratch_bytes = want;
    return 0;
}

static void cpu_destroy(struct kern_backend *be)
{
    if (!be)
        return;
    struct cpu_backend *cb = cpu_backend_of(be);
    cpu_pool_destroy(cb->pool);
    if (cb->scratch) {
        for (int t = 0; t < cb->n_threads; t++)
            cpu_aligned_free(cb->scratch[t]);
        free(cb->scratch);
    }
    free(cb);
}

static int cpu_alloc(struct kern_backend *be, size_t size_bytes, void **out, char *err)
{
    *out = cpu_aligned_calloc(size_bytes);
    if (!*out)
        return error_set(err, ERR_NOMEM, "cpu alloc: out of memory for %zu bytes", size_bytes);
    return 0;
}

static void cpu_free(struct kern_backend *be, void *ptr)
{
    cpu_aligned_free(ptr);
}

static int cpu_memcpy_op(const char *what, void *dst, const void *src, size_t size_bytes,
                         char *err)
{
    if (size_bytes == 0)
        return 0;
    if (!dst || !src)
        return error_set(err, ERR_INVALID_ARG, "cpu %s: NULL pointer for %zu bytes", what,
                         size_bytes);
    memcpy(dst, src, size_bytes);
    return 0;
}

static int cpu_upload(struct kern_backend *be, void *dst, const void *src_host, size_t size_bytes,
                      char *err)
{
    return cpu_memcpy_op("upload", dst, src_host, size_bytes, err);
}

static int cpu_download(struct kern_backend *be, void *dst_host, const void *src, size_t size_bytes,
                        char *err)
{
    return cpu_memcpy_op("download", dst_host, src, size_bytes, err);
}

static int cpu_copy(struct kern_backend *be, void *dst, const void *src, size_t size_bytes,
                    char *err)
{
    return cpu_memcpy_op("copy", dst, src, size_bytes, err);
}

static int cpu_map_weights(struct kern_backend *be, const void *host_ptr, size_t size_bytes,
                           const void **out, char *err)
{
    *out = NULL;
    if (!host_ptr && size_bytes > 0)
        return error_set(err, ERR_INVALID_ARG, "cpu map_weights: NULL pointer for %zu bytes",
                         size_bytes);
    *out = host_ptr;
    return 0;
}

static void cpu_unmap_weights(struct kern_backend *be, const void *ptr)
{
}

static int cpu_sync(struct kern_backend *be, char *err)
{
    return 0;
}

static const struct kern_ops cpu_ops = {
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_upload,
    .download = cpu_download,
    .copy = cpu_copy,
    .map_weights = cpu_map_weights,
    .unmap_weights = cpu_unmap_weights,
    .sync = cpu_sync,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .matmul = cpu_matmul,
    .rope = cpu_rope,
    .attention = cpu_attention,
    .swiglu = cpu_swiglu,
    .add = cpu_add,
};

int kern_cpu_create(struct kern_backend **out, int n_threads, char *err)
{
    *out = NULL;
    if (n_threads < 0 || n_threads > 1024)
        return error_set(err, ERR_INVALID_ARG, "cpu backend: n_threads must be in 0..1024, got %d",
                         n_threads);
    if (n_threads == 0) {
        long online = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = online < 1 ? 1 : online > 1024 ? 1024 : (int)online;
    }
    struct cpu_backend *cb = calloc(1, sizeof(*cb));
    if (!cb)
        return error_set(err, ERR_NOMEM, "cpu backend: out of memory");
    cb->base.ops = &cpu_ops;
    cb->base.name = "cpu";
    cb->n_threads = n_threads;
    cb->scratch = calloc((size_t)n_threads, sizeof(*cb->scratch));
    if (!cb->scratch) {
        free(cb);
        return error_set(err, ERR_NOMEM, "cpu backend: out of memory");
    }
    int rc = cpu_pool_create(&cb->pool, n_threads, err);
    if (rc < 0) {
        cpu_destroy(&cb->base);
        return rc;
    }
    *out = &cb->base;
    return 0;
}

int kern_cpu_threads(const struct kern_backend *be)
{
    if (!be || be->ops != &cpu_ops)
        return 0;
    return ((const struct cpu_backend *)be)->n_threads;
}
