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
 *
 * cuda_add_rmsnorm fuses the residual add before it (x += y, then the norm
 * of x): one launch where the forward pass queued two, the same bits.
 */
#include "cuda_backend.h"

#define RMS_THREADS 256

/* ADD: first in[k] += res[k] (stored; cuda_add's one rounded addition),
 * then the norm of the sums: the bits of cuda_add followed by cuda_rmsnorm,
 * in one launch. in is then read and written: it must not alias out. */
template <bool ADD>
__global__ void __launch_bounds__(RMS_THREADS)
    rmsnorm_kernel(float *out, float *in, const float *res, const void *weight, int dtype, int dim,
                   float eps)
{
    float *x = in + (size_t)blockIdx.x * (size_t)dim;
    float *y = out + (size_t)blockIdx.x * (size_t)dim;
    float ss = 0.0f;
    for (int k = threadIdx.x; k < dim; k += RMS_THREADS) {
        if (ADD)
            x[k] = __fadd_rn(x[k], res[(size_t)blockIdx.x * (size_t)dim + (size_t)k]);
        ss = __fmaf_rn(x[k], x[k], ss);
    }
    ss = cuda_block_sum<RMS_THREADS>(ss);
    const float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)dim), eps)));
    for (int k = threadIdx.x; k < dim; k += RMS_THREADS)
        y[k] = __fmul_rn(__fmul_rn(x[k], r), cuda_load_weight(weight, dtype, (size_t)k));
}

/* Checks shared by both entries; 1 when there is nothing to do. */
static int rmsnorm_check(struct cuda_backend *cb, const char *op, float *out, const float *in,
                         const void *weight, enum kern_dtype dtype, int n, int dim, char *err)
{
    int rc = cuda_backend_check_dtype(dtype, op, err);
    if (rc < 0)
        return rc;
    if (n < 0 || dim <= 0)
        return error_set(err, ERR_INVALID_ARG, "cuda %s: bad shape n=%d dim=%d", op, n, dim);
    if (n == 0)
        return 1;
    if (!out || !in || !weight)
        return error_set(err, ERR_INVALID_ARG, "cuda %s: NULL tensor", op);
    return cuda_backend_enter(cb, err);
}

int cuda_rmsnorm(struct kern_backend *be, float *out, const float *in, const void *weight,
                 enum kern_dtype dtype, int n, int dim, float eps, char *err)
{
    struct cuda_backend *cb = cuda_backend_of(be);
    int rc = rmsnorm_check(cb, "rmsnorm", out, in, weight, dtype, n, dim, err);
    if (rc)
        return rc < 0 ? rc : 0;
    /* without ADD the kernel only reads in (out may alias it) */
    rmsnorm_kernel<false><<<n, RMS_THREADS, 0, cb->stream>>>(out, (float *)in, NULL, weight,
                                                             (int)dtype, dim, eps);
    CUDA_CHECK_LAUNCH("rmsnorm_kernel");
    return 0;
}

int cuda_add_rmsnorm(struct kern_backend *be, float *out, float *x, const float *y,
                     const void *weight, enum kern_dtype dtype, int n, int dim, float eps,
                     char *err)
{
    struct cuda_backend *cb = cuda_backend_of(be);
    int rc = rmsnorm_check(cb, "add_rmsnorm", out, x, weight, dtype, n, dim, err);
    if (rc)
        return rc < 0 ? rc : 0;
    if (!y || out == x)
        return error_set(err, ERR_INVALID_ARG, "cuda add_rmsnorm: %s",
                         !y ? "NULL tensor" : "out aliases x");
    rmsnorm_kernel<true><<<n, RMS_THREADS, 0, cb->stream>>>(out, x, y, weight, (int)dtype, dim,
                                                            eps);
    CUDA_CHECK_LAUNCH("rmsnorm_kernel");
    return 0;
}
