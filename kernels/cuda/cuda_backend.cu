/* cuda_backend.cu: the CUDA backend's lifetime, device selection, memory ops,
 * staging and scratch helpers, and op table.
 *
 * One backend = one device ordinal (resolved from an ordinal or a UUID at
 * create), one non-blocking stream, one cuBLAS handle bound to that stream
 * with its own workspace (no op of the table uses it: only the benchmark
 * path of kern_cuda_matmul_path, see matmul.cu), pinned staging slots for
 * host index arrays, and scratch buffers. No globals: two backends (also
 * on two GPUs) may live in one process; every entry point makes its device
 * current first.
 *
 * Memory ops: alloc is cudaMalloc plus a cudaMemsetAsync on the stream (so
 * the zeros are ordered before any later op); upload, download and
 * map_weights copy with cudaMemcpyAsync on the stream and then wait for it
 * (host memory is involved: the caller may reuse or read it on return);
 * copy is queued without waiting; free and unmap_weights wait for the
 * stream before cudaFree (a queued kernel may still read the buffer).
 *
 * Not here: the ops (one .cu per family), IPC export of buffers (ipc.cu),
 * the step's device-resident inputs and graphs (step.cu).
 */
#include <ctype.h>
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_backend.h"

/* ---- errors ------------------------------------------------------------ */

int cuda_backend_fail(char *err, cudaError_t e, const char *func, const char *call)
{
    return error_set(err, ERR_CUDA, "%s: %s failed: %s (%s)", func, call, cudaGetErrorString(e),
                     cudaGetErrorName(e));
}

int cuda_backend_fail_cublas(char *err, cublasStatus_t s, const char *func, const char *call)
{
    return error_set(err, ERR_CUDA, "%s: %s failed: %s (%s)", func, call,
                     cublasGetStatusString(s), cublasGetStatusName(s));
}

/* For void functions (destroy, free): log instead of returning. */
#define CUDA_LOG(call)                                                                 \
    do {                                                                               \
        cudaError_t cuda_log_e_ = (call);                                              \
        if (cuda_log_e_ != cudaSuccess)                                                \
            LOG_ERROR("%s: %s failed: %s (%s)", __func__, #call,                       \
                      cudaGetErrorString(cuda_log_e_), cudaGetErrorName(cuda_log_e_)); \
    } while (0)

/* cudaMalloc with an error that names the request and the device's memory:
 * "map_weights: cudaMalloc of 524288000 bytes failed: out of memory (free
 * 1.2 GiB of 79.6 GiB)". */
static int cuda_malloc_reported(void **out, size_t size_bytes, const char *what, char *err)
{
    *out = NULL;
    cudaError_t e = cudaMalloc(out, size_bytes);
    if (e == cudaSuccess)
        return 0;
    *out = NULL;
    (void)cudaGetLastError(); /* an allocation failure is not sticky: clear it */
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        free_bytes = total_bytes = 0;
    }
    const double gib = 1024.0 * 1024.0 * 1024.0;
    return error_set(err, e == cudaErrorMemoryAllocation ? ERR_NOMEM : ERR_CUDA,
                     "%s: cudaMalloc of %zu bytes failed: %s (free %.1f GiB of %.1f GiB)", what,
                     size_bytes, cudaGetErrorString(e), (double)free_bytes / gib,
                     (double)total_bytes / gib);
}

int cuda_backend_check_dtype(enum kern_dtype dtype, const char *what, char *err)
{
    switch (dtype) {
    case KERN_DTYPE_BF16:
    case KERN_DTYPE_F16:
    case KERN_DTYPE_F32: return 0;
    case KERN_DTYPE_Q8:
    case KERN_DTYPE_Q4:
        /* only matmul reads them (matmul_quant.cu): the embedding, the
         * norms and the LM head keep the file's precision */
        return error_set(err, ERR_UNSUPPORTED, "cuda %s: %s weights are read by matmul only", what,
                         dtype == KERN_DTYPE_Q8 ? "int8" : "int4");
    }
    return error_set(err, ERR_UNSUPPORTED, "cuda %s: unsupported weight dtype %d", what,
                     (int)dtype);
}

/* How long cuda_backend_wait_event spins (yielding) before it sleeps:
 * longer than any decode or verification step, so only waits such as a
 * long prefill chunk or a dead peer's event sleep. */
#define CUDA_WAIT_SPIN_MS 20.0

static double cuda_now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

int cuda_backend_wait_event(cudaEvent_t ev, double timeout_ms, const char *what, char *err)
{
    const double t0 = cuda_now_ms();
    for (;;) {
        cudaError_t e = cudaEventQuery(ev);
        if (e == cudaSuccess)
            return 0;
        if (e != cudaErrorNotReady)
            return cuda_backend_fail(err, e, __func__, what);
        const double waited = cuda_now_ms() - t0;
        if (waited > timeout_ms)
            return error_set(err, ERR_TIMEOUT, "%s: not done after %.0f ms (the GPU work it "
                             "waits for never finished: a peer process that died mid-round, or "
                             "a hung GPU)", what, waited);
        /* cudaStreamSynchronize's default spins as well: a decode step's
         * wait ends within microseconds of the GPU's work, not at the end of
         * a sleep slice (nanosleep overshoots by tens of microseconds) */
        if (waited < CUDA_WAIT_SPIN_MS) {
            sched_yield();
        } else {
            const struct timespec slice = {0, waited < 100.0 ? 20000L : 1000000L};
            nanosleep(&slice, NULL);
        }
    }
}

int cuda_backend_wait_stream(struct cuda_backend *cb, const char *what, char *err)
{
    CUDA_CHECK(cudaEventRecord(cb->synced, cb->stream));
    return cuda_backend_wait_event(cb->synced, CUDA_SYNC_TIMEOUT_MS, what, err);
}

int cuda_backend_enter(struct cuda_backend *cb, char *err)
{
    CUDA_CHECK(cudaSetDevice(cb->device));
    return 0;
}

/* ---- staging and scratch ----------------------------------------------- */

int cuda_backend_stage2(struct cuda_backend *cb, const void *a_host, size_t a_bytes,
                        const void *b_host, size_t b_bytes, const void **dev_out,
                        size_t *b_offset_out, char *err)
{
    if (cb->capturing) /* its copy and its wait cannot be recorded */
        return error_set(err, ERR_INVALID_ARG, "cuda: an op was handed host arrays that are not "
                         "the step's while a graph was recorded");
    const size_t b_off = (a_bytes + 15) & ~(size_t)15;
    const size_t total = b_off + b_bytes;
    struct cuda_stage *s = &cb->stage[cb->stage_next];
    cb->stage_next = (cb->stage_next + 1) % CUDA_STAGE_SLOTS;
    /* The previous copy out of this slot's host bytes must be done. */
    CUDA_CHECK(cudaEventSynchronize(s->done));
    if (total > s->cap_bytes) {
        size_t cap = 4096;
        while (cap < total)
            cap *= 2;
        /* Kernels queued earlier may still read the old device bytes. */
        CUDA_CHECK(cudaStreamSynchronize(cb->stream));
        if (s->host)
            CUDA_CHECK(cudaFreeHost(s->host));
        CUDA_CHECK(cudaFree(s->dev));
        s->host = NULL;
        s->dev = NULL;
        s->cap_bytes = 0;
        CUDA_CHECK(cudaMallocHost(&s->host, cap));
        int rc = cuda_malloc_reported(&s->dev, cap, "cuda staging", err);
        if (rc < 0)
            return rc;
        s->cap_bytes = cap;
    }
    if (a_bytes > 0)
        memcpy(s->host, a_host, a_bytes);
    if (b_bytes > 0)
        memcpy((char *)s->host + b_off, b_host, b_bytes);
    if (total > 0)
        CUDA_CHECK(cudaMemcpyAsync(s->dev, s->host, total, cudaMemcpyHostToDevice, cb->stream));
    CUDA_CHECK(cudaEventRecord(s->done, cb->stream));
    *dev_out = s->dev;
    if (b_offset_out)
        *b_offset_out = b_off;
    return 0;
}

int cuda_backend_stage(struct cuda_backend *cb, const void *src_host, size_t size_bytes,
                       const void **dev_out, char *err)
{
    return cuda_backend_stage2(cb, src_host, size_bytes, NULL, 0, dev_out, NULL, err);
}

int cuda_backend_scratch(struct cuda_backend *cb, void **buf, size_t *cap_bytes,
                         size_t size_bytes, const char *what, char *err)
{
    if (size_bytes <= *cap_bytes)
        return 0;
    if (cb->capturing)
        return error_set(err, ERR_RANGE, "%s: %zu bytes needed while a graph was recorded, %zu "
                         "reserved (step_reserve)", what, size_bytes, *cap_bytes);
    cb->memory_generation++;
    const size_t mib = (size_t)1 << 20;
    size_t want = *cap_bytes + *cap_bytes / 2;
    if (want < size_bytes)
        want = size_bytes;
    want = (want + mib - 1) / mib * mib;
    CUDA_CHECK(cudaStreamSynchronize(cb->stream));
    CUDA_CHECK(cudaFree(*buf));
    *buf = NULL;
    *cap_bytes = 0;
    int rc = cuda_malloc_reported(buf, want, what, err);
    if (rc < 0)
        return rc;
    *cap_bytes = want;
    return 0;
}

/* ---- lifetime ---------------------------------------------------------- */

static void cuda_destroy(struct kern_backend *be)
{
    if (!be)
        return;
    struct cuda_backend *cb = cuda_backend_of(be);
    if (!cb->stream) { /* create failed before any CUDA object existed */
        free(cb);
        return;
    }
    CUDA_LOG(cudaSetDevice(cb->device));
    CUDA_LOG(cudaStreamSynchronize(cb->stream));
    for (int i = 0; i < CUDA_STAGE_SLOTS; i++) {
        struct cuda_stage *s = &cb->stage[i];
        if (s->host)
            CUDA_LOG(cudaFreeHost(s->host));
        CUDA_LOG(cudaFree(s->dev));
        if (s->done)
            CUDA_LOG(cudaEventDestroy(s->done));
    }
    cuda_step_release(cb);
    CUDA_LOG(cudaFree(cb->mm_act));
    CUDA_LOG(cudaFree(cb->mmq_act));
    CUDA_LOG(cudaFree(cb->attn_part));
    if (cb->cublas) {
        cublasStatus_t st = cublasDestroy(cb->cublas);
        if (st != CUBLAS_STATUS_SUCCESS)
            LOG_ERROR("cuda_destroy: cublasDestroy failed: %s", cublasGetStatusString(st));
    }
    CUDA_LOG(cudaFree(cb->cublas_ws));
    if (cb->synced)
        CUDA_LOG(cudaEventDestroy(cb->synced));
    CUDA_LOG(cudaStreamDestroy(cb->stream));
    free(cb);
}

static void cuda_format_uuid(const cudaUUID_t *u, char *out)
{
    const unsigned char *b = (const unsigned char *)u->bytes;
    snprintf(out, KERN_CUDA_UUID_MAX,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
             b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14],
             b[15]);
}

static int cuda_str_ieq(const char *a, const char *b)
{
    for (; *a && *b; a++, b++)
        if (tolower((unsigned char)*a) != tolower((unsigned char)*b))
            return 0;
    return *a == *b;
}

/* Resolves "3" or "GPU-..." to an ordinal of this process. */
static int cuda_resolve_device(const char *device, int *ordinal, char *uuid_out, char *err)
{
    int count = 0;
    int rc = kern_cuda_device_count(&count, err);
    if (rc < 0)
        return rc;
    if (count == 0)
        return error_set(err, ERR_CUDA, "cuda device \"%s\": no CUDA device is visible", device);
    cudaDeviceProp prop;
    if (strncmp(device, "GPU-", 4) == 0 || strncmp(device, "gpu-", 4) == 0) {
        char uuid[KERN_CUDA_UUID_MAX];
        for (int i = 0; i < count; i++) {
            CUDA_CHECK(cudaGetDeviceProperties(&prop, i));
            cuda_format_uuid(&prop.uuid, uuid);
            if (cuda_str_ieq(uuid, device)) {
                *ordinal = i;
                memcpy(uuid_out, uuid, KERN_CUDA_UUID_MAX);
                return 0;
            }
        }
        return error_set(err, ERR_NOT_FOUND, "cuda device \"%s\": no visible GPU has this UUID "
                         "(%d visible)", device, count);
    }
    char *end = NULL;
    errno = 0;
    long v = strtol(device, &end, 10);
    if (!isdigit((unsigned char)device[0]) || errno != 0 || *end != '\0')
        return error_set(err, ERR_INVALID_ARG, "cuda device \"%s\": expected an ordinal such as "
                         "\"0\" or a UUID such as \"GPU-...\"", device);
    if (v >= count)
        return error_set(err, ERR_NOT_FOUND, "cuda device \"%s\": ordinal out of range, %d "
                         "visible", device, count);
    *ordinal = (int)v;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, *ordinal));
    cuda_format_uuid(&prop.uuid, uuid_out);
    return 0;
}

static int cuda_init(struct cuda_backend *cb, const char *device, char *err)
{
    int rc = cuda_resolve_device(device, &cb->device, cb->uuid, err);
    if (rc < 0)
        return rc;
    CUDA_CHECK(cudaSetDevice(cb->device));
    CUDA_CHECK(cudaStreamCreateWithFlags(&cb->stream, cudaStreamNonBlocking));
    for (int i = 0; i < CUDA_STAGE_SLOTS; i++)
        CUDA_CHECK(cudaEventCreateWithFlags(&cb->stage[i].done, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&cb->synced, cudaEventDisableTiming));
    for (int i = 0; i < 2; i++)
        CUDA_CHECK(cudaEventCreateWithFlags(&cb->step.copied[i], cudaEventDisableTiming));
    CUBLAS_CHECK(cublasCreate(&cb->cublas));
    CUBLAS_CHECK(cublasSetStream(cb->cublas, cb->stream));
    rc = cuda_malloc_reported(&cb->cublas_ws, CUDA_CUBLAS_WORKSPACE_BYTES, "cuda cuBLAS workspace",
                              err);
    if (rc < 0)
        return rc;
    CUBLAS_CHECK(cublasSetWorkspace(cb->cublas, cb->cublas_ws, CUDA_CUBLAS_WORKSPACE_BYTES));
    /* No TF32 for f32 GEMMs: CUBLAS_COMPUTE_32F with the default math mode. */
    CUBLAS_CHECK(cublasSetMathMode(cb->cublas, CUBLAS_DEFAULT_MATH));
    return cuda_matmul_prepare(cb, err);
}

/* ---- memory ops -------------------------------------------------------- */

static int cuda_alloc(struct kern_backend *be, size_t size_bytes, void **out, char *err)
{
    struct cuda_backend *cb = cuda_backend_of(be);
    *out = NULL;
    if (cb->capturing)
        return error_set(err, ERR_INVALID_ARG, "cuda alloc: called while a graph was recorded");
    int rc = cuda_backend_enter(cb, err);
    if (rc < 0)
        return rc;
    /* Never a NULL buffer, also for 0 bytes (like the CPU backend). */
    const size_t bytes = size_bytes < 256 ? 256 : size_bytes;
    void *p = NULL;
    rc = cuda_malloc_reported(&p, bytes, "cuda alloc", err);
    if (rc < 0)
        return rc;
    cudaError_t e = cudaMemsetAsync(p, 0, bytes, cb->stream);
    if (e != cudaSuccess) {
        CUDA_LOG(cudaFree(p));
        return cuda_backend_fail(err, e, __func__, "cudaMemsetAsync(p, 0, bytes, cb->stream)");
    }
    *out = p;
    return 0;
}

static void cuda_free(struct kern_backend *be, void *ptr)
{
    if (!ptr)
        return;
    struct cuda_backend *cb = cuda_backend_of(be);
    CUDA_LOG(cudaSetDevice(cb->device));
    CUDA_LOG(cudaStreamSynchronize(cb->stream));
    CUDA_LOG(cudaFree(ptr));
}

static int cuda_memcpy_op(struct cuda_backend *cb, const char *what, void *dst, const void *src,
                          size_t size_bytes, cudaMemcpyKind kind, int wait, char *err)
{
    if (size_bytes == 0)
        return 0;
    if (!dst || !src)
        return error_set(err, ERR_INVALID_ARG, "cuda %s: NULL pointer for %zu bytes", what,
                         size_bytes);
    if (cb->capturing && kind != cudaMemcpyDeviceToDevice)
        return error_set(err, ERR_INVALID_ARG, "cuda %s: called while a graph was recorded (only "
                         "device-to-device copies can be)", what);
    int rc = cuda_backend_enter(cb, err);
    if (rc < 0)
        return rc;
    CUDA_CHECK(cudaMemcpyAsync(dst, src, size_bytes, kind, cb->stream));
    if (wait)
        return cuda_backend_wait_stream(cb, what, err);
    return 0;
}

static int cuda_upload(struct kern_backend *be, void *dst, const void *src_host, size_t size_bytes,
                       char *err)
{
    return cuda_memcpy_op(cuda_backend_of(be), "upload", dst, src_host, size_bytes,
                          cudaMemcpyHostToDevice, 1, err);
}

extern "C" int kern_cuda_upload_staged(struct kern_backend *be, void *dst_dev,
                                       const void *src_host, size_t size_bytes, char *err)
{
    if (!be || strcmp(be->name, "cuda") != 0)
        return error_set(err, ERR_INVALID_ARG, "kern_cuda_upload_staged: not a cuda backend");
    if (size_bytes == 0)
        return 0;
    if (!dst_dev || !src_host)
        return error_set(err, ERR_INVALID_ARG,
                         "kern_cuda_upload_staged: NULL pointer for %zu bytes", size_bytes);
    struct cuda_backend *cb = cuda_backend_of(be);
    int rc = cuda_backend_enter(cb, err);
    if (rc < 0)
        return rc;
    const void *staged = NULL;
    if ((rc = cuda_backend_stage(cb, src_host, size_bytes, &staged, err)) < 0)
        return rc;
    /* behind the staging copy on the stream: the slot's device bytes are
     * whole when this copy reads them */
    CUDA_CHECK(cudaMemcpyAsync(dst_dev, staged, size_bytes, cudaMemcpyDeviceToDevice,
                               cb->stream));
    return 0;
}

static int cuda_download(struct kern_backend *be, void *dst_host, const void *src,
                         size_t size_bytes, char *err)
{
    return cuda_memcpy_op(cuda_backend_of(be), "download", dst_host, src, size_bytes,
                          cudaMemcpyDeviceToHost, 1, err);
}

static int cuda_copy(struct kern_backend *be, void *dst, const void *src, size_t size_bytes,
                     char *err)
{
    return cuda_memcpy_op(cuda_backend_of(be), "copy", dst, src, size_bytes,
                          cudaMemcpyDeviceToDevice, 0, err);
}

static int cuda_map_weights(struct kern_backend *be, const void *host_ptr, size_t size_bytes,
                            const void **out, char *err)
{
    struct cuda_backend *cb = cuda_backend_of(be);
    *out = NULL;
    if (!host_ptr && size_bytes > 0)
        return error_set(err, ERR_INVALID_ARG, "cuda map_weights: NULL pointer for %zu bytes",
                         size_bytes);
    int rc = cuda_backend_enter(cb, err);
    if (rc < 0)
        return rc;
    const size_t bytes = size_bytes < 256 ? 256 : size_bytes;
    void *p = NULL;
    rc = cuda_malloc_reported(&p, bytes, "map_weights", err);
    if (rc < 0)
        return rc;
    if (size_bytes > 0) {
        rc = cuda_memcpy_op(cb, "map_weights", p, host_ptr, size_bytes, cudaMemcpyHostToDevice, 1,
                            err);
        if (rc < 0) {
            CUDA_LOG(cudaFree(p));
            return rc;
        }
    }
    *out = p;
    return 0;
}

static void cuda_unmap_weights(struct kern_backend *be, const void *ptr)
{
    cuda_free(be, (void *)ptr);
}

static int cuda_sync(struct kern_backend *be, char *err)
{
    struct cuda_backend *cb = cuda_backend_of(be);
    if (cb->capturing)
        return error_set(err, ERR_INVALID_ARG, "cuda sync: called while a graph was recorded");
    int rc = cuda_backend_enter(cb, err);
    if (rc < 0)
        return rc;
    return cuda_backend_wait_stream(cb, "sync", err);
}

static const struct kern_ops cuda_ops = {
    /* .destroy = */ cuda_destroy,
    /* .alloc = */ cuda_alloc,
    /* .free = */ cuda_free,
    /* .upload = */ cuda_upload,
    /* .download = */ cuda_download,
    /* .copy = */ cuda_copy,
    /* .map_weights = */ cuda_map_weights,
    /* .unmap_weights = */ cuda_unmap_weights,
    /* .sync = */ cuda_sync,
    /* .embed = */ cuda_embed,
    /* .rmsnorm = */ cuda_rmsnorm,
    /* .matmul = */ cuda_matmul,
    /* .rope = */ cuda_rope,
    /* .kv_store = */ cuda_kv_store,
    /* .attention = */ cuda_attention,
    /* .swiglu = */ cuda_swiglu,
    /* .add = */ cuda_add,
    /* .map_matrix = */ NULL, /* map_weights: the device kernels read row-major */
    /* .matmul_argmax = */ NULL, /* a device draft picks on the device (specdec_device.c) */
    /* .prepare_argmax = */ NULL,
    /* .matmul_multi = */ cuda_matmul_multi,
    /* .rope_kv_store = */ cuda_rope_kv_store,
    /* .matmul_swiglu = */ cuda_matmul_swiglu,
    /* .add_rmsnorm = */ cuda_add_rmsnorm,
    /* .step_reserve = */ cuda_step_reserve,
    /* .step_begin = */ cuda_step_begin,
    /* .step_end = */ cuda_step_end,
    /* .graph_capture_begin = */ cuda_graph_capture_begin,
    /* .graph_capture_end = */ cuda_graph_capture_end,
    /* .graph_launch = */ cuda_graph_launch,
    /* .graph_destroy = */ cuda_graph_destroy,
};

/* ---- public entry points ----------------------------------------------- */

extern "C" int kern_cuda_device_count(int *count, char *err)
{
    *count = 0;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaErrorNoDevice) {
        (void)cudaGetLastError();
        return 0;
    }
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return cuda_backend_fail(err, e, __func__, "cudaGetDeviceCount(&n)");
    }
    *count = n;
    return 0;
}

extern "C" int kern_cuda_create(struct kern_backend **out, const char *device, char *err)
{
    *out = NULL;
    if (!device || !*device)
        device = "0";
    struct cuda_backend *cb = (struct cuda_backend *)calloc(1, sizeof(*cb));
    if (!cb)
        return error_set(err, ERR_NOMEM, "cuda backend: out of memory");
    cb->base.ops = &cuda_ops;
    cb->base.name = "cuda";
    int rc = cuda_init(cb, device, err);
    if (rc < 0) {
        cuda_destroy(&cb->base);
        return rc;
    }
    *out = &cb->base;
    return 0;
}

extern "C" int kern_cuda_device_uuid(const struct kern_backend *be, char *uuid_out, char *err)
{
    if (!be || be->ops != &cuda_ops || !uuid_out)
        return error_set(err, ERR_INVALID_ARG, "kern_cuda_device_uuid: not a cuda backend");
    memcpy(uuid_out, ((const struct cuda_backend *)be)->uuid, KERN_CUDA_UUID_MAX);
    return 0;
}
