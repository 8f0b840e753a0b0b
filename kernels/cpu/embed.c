/* embed.c: cpu_embed, out[i] = table[ids[i]] widened to f32 (exact).
 *
 * Pure conversion, no arithmetic: results cannot depend on n or threads.
 * A table map_matrix packed (packed.h) is read in its layout.
 * ids are host memory and are range-checked by the caller (vocab is not known
 * here); a negative id is still rejected rather than read out of bounds.
 */
#include "cpu_backend.h"
#include "packed.h"
#include "error.h"

struct embed_job {
    float *out;
    const void *table;
    enum kern_dtype dtype;
    const int32_t *ids;
    int dim;
    int packed_rows; /* the table's rows in a packed layout (packed.h), or 0 */
    enum cpu_layout layout;
};

static void embed_task(void *ctx, long begin, long end, int thread_idx)
{
    const struct embed_job *job = ctx;
    for (long i = begin; i < end; i++)
        cpu_matrix_row_f32(job->table, job->dtype, job->dim, job->packed_rows, job->layout,
                           job->ids[i], job->out + (size_t)i * (size_t)job->dim);
}

int cpu_embed(struct kern_backend *be, float *out, const void *table, enum kern_dtype dtype,
              const int32_t *ids, int n, int dim, char *err)
{
    struct cpu_backend *cb = cpu_backend_of(be);
    int rc = cpu_backend_check_dtype(dtype, "embed", err);
    if (rc < 0)
        return rc;
    if (n < 0 || dim <= 0)
        return error_set(err, ERR_INVALID_ARG, "cpu embed: bad shape n=%d dim=%d", n, dim);
    if (n == 0)
        return 0;
    if (!out || !table || !ids)
        return error_set(err, ERR_INVALID_ARG, "cpu embed: NULL argument");
    for (int i = 0; i < n; i++)
        if (ids[i] < 0)
            return error_set(err, ERR_INVALID_ARG, "cpu embed: ids[%d] = %d is negative", i,
                             (int)ids[i]);
    struct embed_job job = { .out = out, .table = table, .dtype = dtype, .ids = ids, .dim = dim };
    int packed_d_in;
    job.layout = (enum cpu_layout)cpu_backend_packed(cb, table, &job.packed_rows, &packed_d_in);
    if (job.layout != CPU_LAYOUT_ROWS &&
        (packed_d_in != dim || dtype != KERN_DTYPE_BF16))
        return error_set(err, ERR_INVALID_ARG,
                         "cpu embed: the table was mapped as bf16 rows of %d, called as %s rows "
                         "of %d",
                         packed_d_in, kern_dtype_name(dtype), dim);
    long chunk = (long)n * dim < 262144 ? n : (65536 + dim - 1) / dim;
    cpu_pool_run(cb->pool, n, chunk, embed_task, &job);
    return 0;
}
