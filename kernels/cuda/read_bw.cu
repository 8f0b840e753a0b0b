/* read_bw.cu: kern_cuda_read_bandwidth, the device's memory read bandwidth,
 * the floor a decode step is held to (tandem-bench runtime --backend cuda).
 *
 * What it is: one kernel that reads every byte of a buffer several GB large
 * (far past L2, so every pass comes from HBM) with 16-byte loads, timed with
 * CUDA events on the backend's stream; the best of several passes. A decode
 * step reads its weights once and writes almost nothing, so bytes read per
 * second is the figure to hold it against (a copy's read+write rate is not).
 * What it is not: an op (nothing in the model calls it) nor a test of
 * correctness: the loaded words are folded into a value that is stored only
 * when it equals a constant the fill never produces, so the compiler cannot
 * drop the loads and the kernel writes nothing.
 */
#include <string.h>

#include "cuda_backend.h"

#define RBW_THREADS 256
#define RBW_UNROLL 4

__global__ void __launch_bounds__(RBW_THREADS)
    read_bw_kernel(const uint4 *__restrict__ buf, size_t n_vec, unsigned int *sink)
{
    const size_t stride = (size_t)gridDim.x * RBW_THREADS;
    size_t i = (size_t)blockIdx.x * RBW_THREADS + threadIdx.x;
    unsigned int acc = 0;
    /* RBW_UNROLL independent loads in flight per thread per iteration */
    for (; i + (RBW_UNROLL - 1) * stride < n_vec; i += RBW_UNROLL * stride) {
        uint4 v[RBW_UNROLL];
#pragma unroll
        for (int u = 0; u < RBW_UNROLL; u++)
            v[u] = __ldcs(buf + i + (size_t)u * stride);
#pragma unroll
        for (int u = 0; u < RBW_UNROLL; u++)
            acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < n_vec; i += stride) {
        const uint4 v = __ldcs(buf + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    /* the buffer is filled with 0x5a bytes: the xor of 4 equal words per
     * load is 0, never this */
    if (acc == 0xdeadbeefu)
        *sink = acc;
}

/* Frees what kern_cuda_read_bandwidth made; returns rc (the first error
 * wins; a cleanup failure after success is reported). */
static int rbw_cleanup(int rc, void *buf, cudaEvent_t e0, cudaEvent_t e1, char *err)
{
    cudaError_t e;
    if (e0 && (e = cudaEventDestroy(e0)) != cudaSuccess && rc == 0)
        rc = cuda_backend_fail(err, e, __func__, "cudaEventDestroy(e0)");
    if (e1 && (e = cudaEventDestroy(e1)) != cudaSuccess && rc == 0)
        rc = cuda_backend_fail(err, e, __func__, "cudaEventDestroy(e1)");
    if (buf && (e = cudaFree(buf)) != cudaSuccess && rc == 0)
        rc = cuda_backend_fail(err, e, __func__, "cudaFree(buf)");
    return rc;
}

extern "C" int kern_cuda_read_bandwidth(struct kern_backend *be, size_t size_bytes, int passes,
                                        struct kern_cuda_read_bw *out, char *err)
{
    memset(out, 0, sizeof *out);
    if (!be || strcmp(be->name, "cuda") != 0)
        return error_set(err, ERR_INVALID_ARG, "read bandwidth: not a CUDA backend");
    if (passes < 1 || passes > 1000)
        return error_set(err, ERR_INVALID_ARG, "read bandwidth: passes must be in 1..1000, got %d",
                         passes);
    struct cuda_backend *cb = cuda_backend_of(be);
    int rc = cuda_backend_enter(cb, err);
    if (rc < 0)
        return rc;
    size_t free_bytes = 0, total_bytes = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    /* at most half of what is free: the benchmark's models share the device */
    size_t bytes = size_bytes < free_bytes / 2 ? size_bytes : free_bytes / 2;
    bytes &= ~(size_t)((1u << 20) - 1);
    if (bytes < ((size_t)64 << 20))
        return error_set(err, ERR_NOMEM,
                         "read bandwidth: %zu bytes free on the device, need at least 128 MiB",
                         free_bytes);
    void *buf = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    cudaError_t e = cudaMalloc(&buf, bytes + 256);
    if (e != cudaSuccess) {
        buf = NULL;
        (void)cudaGetLastError();
        return error_set(err, ERR_NOMEM, "read bandwidth: cudaMalloc of %zu bytes failed: %s",
                         bytes + 256, cudaGetErrorString(e));
    }
#define RBW_CHECK(call)                                                             \
    do {                                                                            \
        cudaError_t rbw_e_ = (call);                                                \
        if (rbw_e_ != cudaSuccess)                                                  \
            return rbw_cleanup(cuda_backend_fail(err, rbw_e_, __func__, #call), buf, e0, \
                               e1, err);                                            \
    } while (0)
    RBW_CHECK(cudaEventCreate(&e0));
    RBW_CHECK(cudaEventCreate(&e1));
    RBW_CHECK(cudaMemsetAsync(buf, 0x5a, bytes + 256, cb->stream));
    unsigned int *sink = (unsigned int *)((char *)buf + bytes);
    const size_t n_vec = bytes / sizeof(uint4);
    /* enough blocks to keep every SM's load queue full */
    const unsigned int blocks = (unsigned int)(cb->sm_count > 0 ? cb->sm_count * 8 : 1024);
    double best_ms = 0;
    for (int p = 0; p <= passes; p++) { /* pass 0 warms up and is not counted */
        RBW_CHECK(cudaEventRecord(e0, cb->stream));
        read_bw_kernel<<<blocks, RBW_THREADS, 0, cb->stream>>>((const uint4 *)buf, n_vec, sink);
        RBW_CHECK(cudaGetLastError());
        RBW_CHECK(cudaEventRecord(e1, cb->stream));
        RBW_CHECK(cudaEventSynchronize(e1));
        float ms = 0;
        RBW_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        if (p > 0 && (best_ms == 0 || ms < best_ms))
            best_ms = ms;
    }
#undef RBW_CHECK
    out->size_bytes = bytes;
    out->passes = passes;
    out->best_ms = best_ms;
    out->read_gbs = best_ms > 0 ? (double)bytes / (best_ms * 1e6) : 0;
    out->free_bytes = free_bytes;
    out->total_bytes = total_bytes;
    return rbw_cleanup(0, buf, e0, e1, err);
}
