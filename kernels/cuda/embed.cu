/* embed.cu: cuda_embed, out[i] = table[ids[i]] widened to f32 (exact).
 *
 * Pure conversion, no arithmetic: results cannot depend on n. One block per
 * row, threads stride over dim. ids are host memory: negative ids are
 * rejected on the host (vocab is not known here; the caller checks the upper
 * bound), then they reach the device through a pinned staging slot; a
 * step's ids (step.cu) are on the device already.
 */
#include "cuda_backend.h"

#define EMBED_THREADS 256

__global__ void __launch_bounds__(EMBED_THREADS)
    embed_kernel(float *out, const void *table, int dtype, const int32_t *ids, int dim)
{
    const size_t row = (size_t)ids[blockIdx.x] * (size_t)dim;
    float *y = out + (size_t)blockIdx.x * (size_t)dim;
    for (int k = threadIdx.x; k < dim; k += EMBED_THREADS)
        y[k] = cuda_load_weight(table, dtype, row + (size_t)k);
}

static int embed_launch(struct cuda_backend *cb, float *out, const void *table,
                        enum kern_dtype dtype, const int32_t *ids_dev, int n, int dim, char *err)
{
    embed_kernel<<<n, EMBED_THREADS, 0, cb->stream>>>(out, table, (int)dtype, ids_dev, dim);
    CUDA_CHECK_LAUNCH("embed_kernel");
    return 0;
}

int cuda_embed(struct kern_backend *be, float *out, const void *table, enum kern_dtype dtype,
               const int32_t *ids, int n, int dim, char *err)
{
    struct cuda_backend *cb = cuda_backend_of(be);
    int rc = cuda_backend_check_dtype(dtype, "embed", err);
    if (rc < 0)
        return rc;
    if (n < 0 || dim <= 0)
        return error_set(err, ERR_INVALID_ARG, "cuda embed: bad shape n=%d dim=%d", n, dim);
    if (n == 0)
        return 0;
    if (!out || !table || !ids)
        return error_set(err, ERR_INVALID_ARG, "cuda embed: NULL argument");
    if ((rc = cuda_backend_enter(cb, err)) < 0)
        return rc;
    /* the step's ids were checked and copied by step_begin */
    const void *ids_dev = cuda_step_ids(cb, ids, n);
    if (!ids_dev) {
        for (int i = 0; i < n; i++)
            if (ids[i] < 0)
                return error_set(err, ERR_INVALID_ARG, "cuda embed: ids[%d] = %d is negative", i,
                                 (int)ids[i]);
        if ((rc = cuda_backend_stage(cb, ids, (size_t)n * sizeof(int32_t), &ids_dev, err)) < 0)
            return rc;
    }
    return embed_launch(cb, out, table, dtype, (const int32_t *)ids_dev, n, dim, err);
}
