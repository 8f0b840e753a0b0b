/* attention.c: cpu_kv_store and cpu_attention, causal grouped-query
 * attention over a paged KV cache (struct kern_kv_layout).
 *
 * Query row i (sequence s, position p), head h, kv head g = h / (n_heads /
 * n_kv_heads), over the positions t = 0..p of s, wherever their blocks sit:
 *   s[t]   = dot(q[i][h], k[t][g]) * scale   (fixed-order dot, cpu_simd.h)
 *   m      = max_t s[t]
 *   e[t]   = expf(s[t] - m);  sum = e[0] + e[1] + ... in increasing t
 *   out[d] = sum over t in increasing order of (e[t] / sum) * v[t][g][d],
 *            one FMA per t for each d (vectorised across d, never across t).
 * Every step depends only on the row's position, its q and its sequence's
 * cached values, so a row's output is the same whether it is computed alone
 * or beside others, by any thread, from any blocks. Tasks are (row, head) pairs; scores and the output accumulator
 * live in per-thread scratch (grown once to the longest context seen). out
 * may alias q: a task reads its q before it writes its out slice.
 */
#include <math.h>
#include <string.h>

#include "cpu_backend.h"
#include "cpu_simd.h"
#include "error.h"

struct attn_job {
    float *out;
    const float *q;
    const float *k_pool;
    const float *v_pool;
    const struct kern_kv_layout *kv;
    int n_heads, n_kv_heads, head_dim, group;
    float scale;
    float **scratch; /* per thread: [head_dim] accumulator, then [max position + 1] scores */
};

/* Pool row of position t of the sequence whose table is given. */
static inline size_t pool_row(const struct kern_kv_layout *kv, const int32_t *table, int t)
{
    return (size_t)table[t / kv->block_size] * (size_t)kv->block_size +
           (size_t)(t % kv->block_size);
}

static void attn_task(void *ctx, long begin, long end, int thread_idx)
{
    const struct attn_job *job = ctx;
    const int hd = job->head_dim;
    const size_t kv_stride = (size_t)job->n_kv_heads * (size_t)hd;
    float *acc = job->scratch[thread_idx];
    float *scores = acc + ((hd + 15) & ~15);
    for (long task = begin; task < end; task++) {
        const long i = task / job->n_heads;
        const int h = (int)(task % job->n_heads);
        const int g = h / job->group;
        const struct kern_kv_layout *kv = job->kv;
        const int32_t *table = kv->tables + (size_t)kv->rows[2 * i] * (size_t)kv->table_stride;
        const int n_pos = kv->rows[2 * i + 1] + 1;
        const size_t qoff = ((size_t)i * (size_t)job->n_heads + (size_t)h) * (size_t)hd;
        const float *q = job->q + qoff;
        const float *kb = job->k_pool + (size_t)g * (size_t)hd;
        const float *vb = job->v_pool + (size_t)g * (size_t)hd;

        /* Positions are walked block by block (one table lookup per block,
         * not a division per position), still in increasing t. */
        const int bs = kv->block_size;
        float m = -INFINITY;
        for (int t0 = 0, b = 0; t0 < n_pos; t0 += bs, b++) {
            const float *kr = kb + (size_t)table[b] * (size_t)bs * kv_stride;
            const int tn = n_pos - t0 < bs ? n_pos - t0 : bs;
            for (int j = 0; j < tn; j++, kr += kv_stride) {
                float s = cpu_simd_dot_f32(q, kr, hd) * job->scale;
                scores[t0 + j] = s;
                m = s > m ? s : m;
            }
        }
        float sum = 0.0f;
        for (int t = 0; t < n_pos; t++) {
            float e = expf(scores[t] - m);
            scores[t] = e;
            sum += e;
        }
        memset(acc, 0, (size_t)hd * sizeof(float));
        for (int t0 = 0, b = 0; t0 < n_pos; t0 += bs, b++) {
            const float *v = vb + (size_t)table[b] * (size_t)bs * kv_stride;
            const int t_end = n_pos - t0 < bs ? n_pos : t0 + bs;
            for (int t = t0; t < t_end; t++, v += kv_stride) {
                const float p = scores[t] / sum;
                int d = 0;
#ifdef __AVX2__
                const __m256 pv = _mm256_set1_ps(p);
                for (; d + 8 <= hd; d += 8)
                    _mm256_storeu_ps(acc + d, _mm256_fmadd_ps(pv, _mm256_loadu_ps(v + d),
                                                              _mm256_loadu_ps(acc + d)));
#endif
                for (; d < hd; d++)
                    acc[d] = fmaf(p, v[d], acc[d]);
            }
        }
        memcpy(job->out + qoff, acc, (size_t)hd * sizeof(float));
    }
}

int cpu_kv_store(struct kern_backend *be, float *k_pool, float *v_pool, const float *k,
                 const float *v, int n, const struct kern_kv_layout *kv, int kv_dim, char *err)
{
    (void)be;
    if (n < 0 || kv_dim <= 0)
        return error_set(err, ERR_INVALID_ARG, "cpu kv_store: bad shape n=%d kv_dim=%d", n, kv_dim);
    if (n == 0)
        return 0;
    if (!k_pool || !v_pool || !k || !v)
        return error_set(err, ERR_INVALID_ARG, "cpu kv_store: NULL tensor");
    int rc = kern_kv_layout_check(kv, n, "cpu kv_store", err);
    if (rc)
        return rc;
    const size_t row_bytes = (size_t)kv_dim * sizeof(float);
    for (int i = 0; i < n; i++) {
        const int32_t *table = kv->tables + (size_t)kv->rows[2 * i] * (size_t)kv->table_stride;
        const size_t dst = pool_row(kv, table, kv->rows[2 * i + 1]) * (size_t)kv_dim;
        memcpy(k_pool + dst, k + (size_t)i * (size_t)kv_dim, row_bytes);
        memcpy(v_pool + dst, v + (size_t)i * (size_t)kv_dim, row_bytes);
    }
    return 0;
}

int cpu_attention(struct kern_backend *be, float *out, const float *q, const float *k_pool,
                  const float *v_pool, int n, const struct kern_kv_layout *kv, int n_heads,
                  int n_kv_heads, int head_dim, float scale, char *err)
{
    struct cpu_backend *cb = cpu_backend_of(be);
    if (n < 0 || n_heads <= 0 || n_kv_heads <= 0 || head_dim <= 0)
        return error_set(err, ERR_INVALID_ARG,
                         "cpu attention: bad shape n=%d n_heads=%d n_kv_heads=%d head_dim=%d", n,
                         n_heads, n_kv_heads, head_dim);
    if (n_heads % n_kv_heads != 0)
        return error_set(err, ERR_INVALID_ARG,
                         "cpu attention: n_heads=%d is not a multiple of n_kv_heads=%d", n_heads,
                         n_kv_heads);
    if (n == 0)
        return 0;
    if (!out || !q || !k_pool || !v_pool)
        return error_set(err, ERR_INVALID_ARG, "cpu attention: NULL tensor");
    int rc = kern_kv_layout_check(kv, n, "cpu attention", err);
    if (rc)
        return rc;
    int max_pos = 0;
    long work_positions = 0;
    for (int i = 0; i < n; i++) {
        const int pos = kv->rows[2 * i + 1];
        max_pos = pos > max_pos ? pos : max_pos;
        work_positions += pos + 1;
    }
    size_t floats = (size_t)((head_dim + 15) & ~15) + (size_t)max_pos + 1;
    rc = cpu_backend_scratch_reserve(cb, floats * sizeof(float), err);
    if (rc < 0)
        return rc;
    struct attn_job job = {
        .out = out, .q = q, .k_pool = k_pool, .v_pool = v_pool, .kv = kv,
        .n_heads = n_heads, .n_kv_heads = n_kv_heads, .head_dim = head_dim,
        .group = n_heads / n_kv_heads, .scale = scale, .scratch = cb->scratch,
    };
    long n_tasks = (long)n * n_heads;
    /* Work per task grows with the context; tiny problems stay on the caller. */
    long work = work_positions * n_heads * (long)head_dim;
    long chunk = work < 65536 ? n_tasks : 1;
    cpu_pool_run(cb->pool, n_tasks, chunk, attn_task, &job);
    return 0;
}
