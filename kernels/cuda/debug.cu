/* debug.cu: device work of a known duration and content for the GPU tests
 * (kernels_cuda.h, kern_cuda_debug_*): a spin of a given length, a fill with
 * a pattern named by a tag, and a count of the elements that differ from
 * that pattern. tests/gpu/test_cuda_xfer.c makes a writer or a reader of the
 * draft's buffer slow with them, so a missing cross-process wait shows up as
 * counted mismatches.
 *
 * What it is not: no op of the table; nothing outside tests/gpu calls it.
 */
#include "cuda_backend.h"

static __device__ __forceinline__ float debug_value(uint32_t tag, size_t i)
{
    return (float)((tag * 2654435761u + (uint32_t)i) & 0xffffffu);
}

static __global__ void debug_spin_kernel(unsigned long long ns)
{
    /* globaltimer counts nanoseconds (clock64 counts cycles of a varying clock) */
    unsigned long long start;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    for (;;) {
        unsigned long long now;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
        if (now - start >= ns)
            break;
        __nanosleep(1000);
    }
}

static __global__ void debug_fill_kernel(float *out, size_t n, uint32_t tag)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = debug_value(tag, i);
}

static __global__ void debug_count_kernel(const float *in, size_t n, uint32_t tag,
                                          unsigned long long *count)
{
    unsigned long long bad = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        bad += in[i] != debug_value(tag, i);
    if (bad)
        atomicAdd(count, bad);
}

static int debug_grid(size_t n)
{
    const size_t blocks = (n + 255) / 256;
    return blocks > 1024 ? 1024 : (blocks < 1 ? 1 : (int)blocks);
}

extern "C" int kern_cuda_debug_spin(struct kern_backend *be, unsigned us, char *err)
{
    struct cuda_backend *cb = cuda_backend_of(be);
    int rc = cuda_backend_enter(cb, err);
    if (rc < 0)
        return rc;
    debug_spin_kernel<<<1, 1, 0, cb->stream>>>((unsigned long long)us * 1000ull);
    CUDA_CHECK(cudaGetLastError());
    return 0;
}

extern "C" int kern_cuda_debug_fill(struct kern_backend *be, float *out_dev, size_t n,
                                    uint32_t tag, char *err)
{
    struct cuda_backend *cb = cuda_backend_of(be);
    int rc = cuda_backend_enter(cb, err);
    if (rc < 0 || n == 0)
        return rc;
    debug_fill_kernel<<<debug_grid(n), 256, 0, cb->stream>>>(out_dev, n, tag);
    CUDA_CHECK(cudaGetLastError());
    return 0;
}

extern "C" int kern_cuda_debug_count_mismatches(struct kern_backend *be, const float *in_dev,
                                                size_t n, uint32_t tag,
                                                unsigned long long *count_dev, char *err)
{
    struct cuda_backend *cb = cuda_backend_of(be);
    int rc = cuda_backend_enter(cb, err);
    if (rc < 0 || n == 0)
        return rc;
    debug_count_kernel<<<debug_grid(n), 256, 0, cb->stream>>>(in_dev, n, tag, count_dev);
    CUDA_CHECK(cudaGetLastError());
    return 0;
}
