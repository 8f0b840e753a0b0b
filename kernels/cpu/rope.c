/* rope.c: cpu_rope, rotary position embedding in place (HuggingFace
 * "rotate_half" convention).
 *
 * For each row i, head h and j < head_dim/2, with x1 = x[j], x2 = x[j + hd/2]:
 *   angle = (float)positions[i] * inv_freq[j]   (f32, as HF computes it)
 *   x[j]        = x1 * cos(angle) - x2 * sin(angle)
 *   x[j + hd/2] = x2 * cos(angle) + x1 * sin(angle)
 * with cosf/sinf. Every value depends only on its row's position and inputs:
 * rows are independent tasks; each task computes its row's cos/sin table once
 * (in per-thread scratch) and applies it to every head.
 */
#include <math.h>

#include "cpu_backend.h"
#include "error.h"

struct rope_job {
    float *x;
    const int32_t *positions;
    const float *inv_freq;
    int n_heads, head_dim;
    float **scratch; /* per thread: [head_dim] = cos[half], sin[half] */
};

static void rope_task(void *ctx, long begin, long end, int thread_idx)
{
    const struct rope_job *job = ctx;
    const int half = job->head_dim / 2;
    float *cs = job->scratch[thread_idx];
    float *sn = cs + half;
    for (long i = begin; i < end; i++) {
        const float pos = (float)job->positions[i];
        for (int j = 0; j < half; j++) {
            float angle = pos * job->inv_freq[j];
            cs[j] = cosf(angle);
            sn[j] = sinf(angle);
        }
        for (int h = 0; h < job->n_heads; h++) {
            float *v = job->x + ((size_t)i * (size_t)job->n_heads + (size_t)h) * (size_t)job->head_dim;
            for (int j = 0; j < half; j++) {
                float x1 = v[j], x2 = v[j + half];
                v[j] = x1 * cs[j] - x2 * sn[j];
                v[j + half] = x2 * cs[j] + x1 * sn[j];
            }
        }
    }
}

int cpu_rope(struct kern_backend *be, float *x, const int32_t *positions, int n, int n_heads,
             int head_dim, const float *inv_freq, char *err)
{
    struct cpu_backend *cb = cpu_backend_of(be);
    if (n < 0 || n_heads <= 0 || head_dim <= 0 || head_dim % 2 != 0)
        return error_set(err, ERR_INVALID_ARG,
                         "cpu rope: bad shape n=%d n_heads=%d head_dim=%d (head_dim must be even)",
                         n, n_heads, head_dim);
    if (n == 0)
        return 0;
    if (!x || !positions || !inv_freq)
        return error_set(err, ERR_INVALID_ARG, "cpu rope: NULL argument");
    int rc = cpu_backend_scratch_reserve(cb, (size_t)head_dim * sizeof(float), err);
    if (rc < 0)
        return rc;
    struct rope_job job = {
        .x = x, .positions = positions, .inv_freq = inv_freq,
        .n_heads = n_heads, .head_dim = head_dim, .scratch = cb->scratch,
    };
    long per_row = (long)n_heads * head_dim;
    long chunk = (long)n * per_row < 32768 ? n : (8192 + per_row - 1) / per_row;
    cpu_pool_run(cb->pool, n, chunk, rope_task, &job);
    return 0;
}
