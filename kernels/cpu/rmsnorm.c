/* rmsnorm.c: cpu_rmsnorm, out[i] = in[i] / sqrt(mean(in[i]^2) + eps) * weight.
 *
 * HuggingFace LlamaRMSNorm semantics in f32 throughout: variance = sum of
 * squares / dim, r = 1 / sqrtf(variance + eps), out[k] = (in[k] * r) * w[k].
 * The sum of squares is the fixed-order reduction of cpu_simd.h over dim, so a
 * row's result depends only on that row; rows are independent tasks and the
 * per-element products are exactly rounded whether done in a vector or not.
 * out may alias in: a row's sum is finished before its first write.
 */
#include <math.h>

#include "cpu_backend.h"
#include "cpu_simd.h"
#include "error.h"

struct rmsnorm_job {
    float *out;
    const float *in;
    const void *weight;
    enum kern_dtype dtype;
    int dim;
    float eps;
};

static float rmsnorm_weight(enum kern_dtype dt, const void *w, int k)
{
    switch (dt) {
    case KERN_DTYPE_BF16: return cpu_simd_bf16_to_f32(((const uint16_t *)w)[k]);
    case KERN_DTYPE_F16: return cpu_simd_f16_to_f32(((const uint16_t *)w)[k]);
    case KERN_DTYPE_F32: break;
    case KERN_DTYPE_Q8:
    case KERN_DTYPE_Q4: break; /* refused by cpu_backend_check_dtype */
    }
    return ((const float *)w)[k];
}

static void rmsnorm_task(void *ctx, long begin, long end, int thread_idx)
{
    const struct rmsnorm_job *job = ctx;
    const int dim = job->dim;
    for (long i = begin; i < end; i++) {
        const float *x = job->in + (size_t)i * (size_t)dim;
        float *y = job->out + (size_t)i * (size_t)dim;
        float ss = cpu_simd_dot_f32(x, x, dim);
        float r = 1.0f / sqrtf(ss / (float)dim + job->eps);
        int k = 0;
#ifdef __AVX2__
        const __m256 rv = _mm256_set1_ps(r);
        for (; k + 8 <= dim; k += 8) {
            __m256 wv;
            if (job->dtype == KERN_DTYPE_BF16)
                wv = cpu_simd_load8_bf16((const uint16_t *)job->weight + k);
            else if (job->dtype == KERN_DTYPE_F16)
                wv = cpu_simd_load8_f16((const uint16_t *)job->weight + k);
            else
                wv = _mm256_loadu_ps((const float *)job->weight + k);
            __m256 xv = _mm256_mul_ps(_mm256_loadu_ps(x + k), rv);
            _mm256_storeu_ps(y + k, _mm256_mul_ps(xv, wv));
        }
#endif
        for (; k < dim; k++)
            y[k] = (x[k] * r) * rmsnorm_weight(job->dtype, job->weight, k);
    }
}

int cpu_rmsnorm(struct kern_backend *be, float *out, const float *in, const void *weight,
                enum kern_dtype dtype, int n, int dim, float eps, char *err)
{
    struct cpu_backend *cb = cpu_backend_of(be);
    int rc = cpu_backend_check_dtype(dtype, "rmsnorm", err);
    if (rc < 0)
        return rc;
    if (n < 0 || dim <= 0)
        return error_set(err, ERR_INVALID_ARG, "cpu rmsnorm: bad shape n=%d dim=%d", n, dim);
    if (n == 0)
        return 0;
    if (!out || !in || !weight)
        return error_set(err, ERR_INVALID_ARG, "cpu rmsnorm: NULL tensor");
    struct rmsnorm_job job = {
        .out = out, .in = in, .weight = weight, .dtype = dtype, .dim = dim, .eps = eps,
    };
    /* Rows are independent: small calls stay on the caller. */
    long chunk = (long)n * dim < 65536 ? n : (16384 + dim - 1) / dim;
    cpu_pool_run(cb->pool, n, chunk, rmsnorm_task, &job);
    return 0;
}
