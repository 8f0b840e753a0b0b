/* rope.cu: cuda_rope, rotary position embedding in place (HuggingFace
 * "rotate_half" convention), the twin of kernels/cpu/rope.c.
 *
 * For row i, head h and j < head_dim/2, with x1 = x[j], x2 = x[j + hd/2]:
 *   angle = (float)positions[i] * inv_freq[j]     (one f32 product, as HF)
 *   x[j]        = x1 * cos(angle) - x2 * sin(angle)
 *   x[j + hd/2] = x2 * cos(angle) + x1 * sin(angle)
 * each product and sum rounded separately (no FMA), as the CPU twin does.
 * cos/sin come from CUDA's sincosf (within 2 ulp, not the same bits as
 * glibc), so CUDA and CPU agree within rounding. Each value depends only on
 * its row's position: no reduction, nothing depends on n.
 *
 * positions and inv_freq are host arrays: both travel in one staged copy per
 * call (a few hundred bytes), or are a step's (step.cu), on the device
 * already. One block per row; threads stride over the
 * (head, j) pairs, each pair read and written by one thread.
 */
#include "cuda_backend.h"

#define ROPE_THREADS 256

__global__ void __launch_bounds__(ROPE_THREADS)
    rope_kernel(float *x, const int32_t *positions, const float *inv_freq, int n_heads,
                int head_dim)
{
    const int half = head_dim / 2;
    const float pos = (float)positions[blockIdx.x];
    float *row = x + (size_t)blockIdx.x * (size_t)n_heads * (size_t)head_dim;
    for (int idx = threadIdx.x; idx < n_heads * half; idx += ROPE_THREADS) {
        const int h = idx / half, j = idx - h * half;
        float *v = row + (size_t)h * (size_t)head_dim;
        float x1 = v[j], x2 = v[j + half];
        cuda_rope_pair(pos, inv_freq[j], &x1, &x2);
        v[j] = x1;
        v[j + half] = x2;
    }
}

static int rope_launch(struct cuda_backend *cb, float *x, const int32_t *positions_dev,
                       const float *inv_freq_dev, int n, int n_heads, int head_dim, char *err)
{
    rope_kernel<<<n, ROPE_THREADS, 0, cb->stream>>>(x, positions_dev, inv_freq_dev, n_heads,
                                                     head_dim);
    CUDA_CHECK_LAUNCH("rope_kernel");
    return 0;
}

int cuda_rope_inputs(struct cuda_backend *cb, const int32_t *positions, int n,
                     const float *inv_freq, int n_freq, const int32_t **positions_dev,
                     const float **freq_dev, char *err)
{
    if (cuda_step_rope(cb, positions, n, inv_freq, n_freq, positions_dev, freq_dev))
        return 0;
    const void *dev = NULL;
    size_t freq_off = 0;
    int rc = cuda_backend_stage2(cb, positions, (size_t)n * sizeof(int32_t), inv_freq,
                                 (size_t)n_freq * sizeof(float), &dev, &freq_off, err);
    if (rc < 0)
        return rc;
    *positions_dev = (const int32_t *)dev;
    *freq_dev = (const float *)(const void *)((const char *)dev + freq_off);
    return 0;
}

int cuda_rope(struct kern_backend *be, float *x, const int32_t *positions, int n, int n_heads,
              int head_dim, const float *inv_freq, char *err)
{
    struct cuda_backend *cb = cuda_backend_of(be);
    if (n < 0 || n_heads <= 0 || head_dim <= 0 || head_dim % 2 != 0 ||
        (long)n_heads * head_dim > (1L << 30))
        return error_set(err, ERR_INVALID_ARG,
                         "cuda rope: bad shape n=%d n_heads=%d head_dim=%d (head_dim must be even)",
                         n, n_heads, head_dim);
    if (n == 0)
        return 0;
    if (!x || !positions || !inv_freq)
        return error_set(err, ERR_INVALID_ARG, "cuda rope: NULL argument");
    int rc = cuda_backend_enter(cb, err);
    if (rc < 0)
        return rc;
    const int32_t *positions_dev = NULL;
    const float *freq_dev = NULL;
    if ((rc = cuda_rope_inputs(cb, positions, n, inv_freq, head_dim / 2, &positions_dev,
                               &freq_dev, err)) < 0)
        return rc;
    return rope_launch(cb, x, positions_dev, freq_dev, n, n_heads, head_dim, err);
}
