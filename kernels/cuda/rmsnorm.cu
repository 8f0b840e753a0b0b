/* rmsnorm.cu: cuda_rmsnorm, out[i] = in[i] / sqrt(mean(in[i]^2) + eps) * weight.
 *
 * HuggingFace LlamaRMSNorm semantics in f32, like the CPU twin:
 * r = 1 / sqrt(sum_sq / dim + eps), out[k] = (in[k] * r) * w[k], each step
 * one correctly rounded operation (__fdiv_rn, __fsqrt_rn, __fmul_rn).
 *
 * Reduction order (fixed by dim alone): one block of RMS_THREADS threads per
 * row; thread t accumulates in[k]^2 for k = t, t + RMS_THREADS, ... in
 * increasing k with one FMA each; then cuda_block_sum (warp butterflies,
 * warp sums added in warp order). A row's result never depends on n. The
 * order differs from the CPU's 8-lane order, so CUDA and CPU agree within
 * rounding, not bit for bit. out may alias in: every thread reads its
 * elements for the sum before the block-wide barrier, and each element is
 * later read and written by the same thread.
 */
#include "cuda_backend.h"

#define RMS_THREADS 256

__global__ void __launch_bounds__(RMS_THREADS)
    rmsnorm_kernel(float *out, const float *in, const void *weight, int dtype, int dim, float eps)
{
    const float *x = in + (size_t)blockIdx.x * (size_t)dim;
    float *y = out + (size_t)blockIdx.x * (size_t)dim;
    float ss = 0.0f;
    for (int k = threadIdx.x; k < dim; k += RMS_THREADS)
        ss = __fmaf_rn(x[k], x[k], ss);
    ss = cuda_block_sum<RMS_THREADS>(ss);
    const float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)dim), eps)));
    for (int k = threadIdx.x; k < dim; k += RMS_THREADS)
        y[k] = __fmul_rn(__fmul_rn(x[k], r), cuda_load_weight(weight, dtype, (size_t)k));
}

static int rmsnorm_launch(struct cuda_backend *cb, float *out, const float *in,
                          const void *weight, enum kern_dtype dtype, int n, int dim, float eps,
                          char *err)
{
    rmsnorm_kernel<<<n, RMS_THREADS, 0, cb->stream>>>(out, in, weight, (int)dtype, dim, eps);
    CUDA_CHECK_LAUNCH("rmsnorm_kernel");
    return 0;
}

int cuda_rmsnorm(struct kern_backend *be, float *out, const float *in, const void *weight,
                 enum kern_dtype dtype, int n, int dim, float eps, char *err)
{
    struct cuda_backend *cb = cuda_backend_of(be);
    int rc = cuda_backend_check_dtype(dtype, "rmsnorm", err);
    if (rc < 0)
        return rc;
    if (n < 0 || dim <= 0)
        return error_set(err, ERR_INVALID_ARG, "cuda rmsnorm: bad shape n=%d dim=%d", n, dim);
    if (n == 0)
        return 0;
    if (!out || !in || !weight)
        return error_set(err, ERR_INVALID_ARG, "cuda rmsnorm: NULL tensor");
    if ((rc = cuda_backend_enter(cb, err)) < 0)
        return rc;
    return rmsnorm_launch(cb, out, in, weight, dtype, n, dim, eps, err);
}
