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
 * or beside others, by any thread, from any blocks.
 *
 * Tasks are (row, kv head) pairs: the query heads that share a kv head (4 in
 * Llama 3.2 1B, 3 in 3B) read the same K and V rows, so they are computed
 * together, each row loaded once for all of them, their chains interleaved.
 * Each head's arithmetic is still exactly the sequence above. The scores
 * live in per-thread scratch (grown once to the longest context seen); the
 * output accumulators stay in registers through a pass over t. One head at a
 * time, with its accumulator in memory (a load and a store per t and 8
 * columns), took 42 us per 1-row call of a 1B-shaped layer at 64 positions
 * and 81 us at 3 rows (2 threads), 1.6% and 2.6% of the forward call, and a
 * share that grows with the context. out may alias q: a task reads its
 * heads' q before it writes their out slices.
 */
#include <math.h>
#include <string.h>

#include "cpu_backend.h"
#include "cpu_simd.h"
#include "error.h"

/* Heads of one kv head computed together: they read the same K and V rows,
 * so one load serves all of them, and their dot products and output lanes
 * are independent chains that hide each other's FMA latency. */
#define ATTN_GROUP_MAX 4
/* positions ahead whose K row is prefetched (attn_scores) */
#define ATTN_PREFETCH_ROWS 4

struct attn_job {
    float *out;
    const float *q;
    const float *k_pool;
    const float *v_pool;
    const struct kern_kv_layout *kv;
    int n_heads, n_kv_heads, head_dim, group;
    float scale;
    float **scratch; /* per thread: ATTN_GROUP_MAX x [max position + 1] scores */
    size_t score_stride; /* floats between two heads' scores */
};

/* Pool row of position t of the sequence whose table is given. */
static inline size_t pool_row(const struct kern_kv_layout *kv, const int32_t *table, int t)
{
    return (size_t)table[t / kv->block_size] * (size_t)kv->block_size +
           (size_t)(t % kv->block_size);
}

/* Scores of nh heads (q: their rows, hd apart) against positions 0..n_pos-1:
 * each one cpu_simd_dot_f32(q_j, k_t) * scale, the K row loaded once for
 * all heads. m[j]: each head's maximum. */
CPU_SIMD_INLINE void attn_scores(const struct attn_job *job, int nh, const float *q,
                                 const int32_t *table, int n_pos, const float *kb,
                                 const float *vb, float *scores, float *m)
{
    const int hd = job->head_dim, len8 = hd & ~7;
    const struct kern_kv_layout *kv = job->kv;
    const size_t kv_stride = (size_t)job->n_kv_heads * (size_t)hd;
    const int bs = kv->block_size;
    for (int j = 0; j < nh; j++)
        m[j] = -INFINITY;
    for (int t0 = 0, b = 0; t0 < n_pos; t0 += bs, b++) {
        const float *kr = kb + (size_t)table[b] * (size_t)bs * kv_stride;
        const int tn = n_pos - t0 < bs ? n_pos - t0 : bs;
        for (int i = 0; i < tn; i++, kr += kv_stride) {
            float s[ATTN_GROUP_MAX];
#ifdef __AVX2__
            /* The cache's rows arrive cold (a layer's weights stream through
             * the caches between two attention calls): the K row a few
             * positions ahead, and this position's V row, read after the
             * softmax, are fetched early. Addresses, not pointers: the K
             * row ahead may lie past the block. */
            const uintptr_t k_ahead = (uintptr_t)kr + ATTN_PREFETCH_ROWS * kv_stride * sizeof(float);
            const uintptr_t v_row = (uintptr_t)(vb + (kr - kb));
            for (int l = 0; l < hd * (int)sizeof(float); l += 64) {
                _mm_prefetch((const char *)(k_ahead + (uintptr_t)l), _MM_HINT_T0);
                _mm_prefetch((const char *)(v_row + (uintptr_t)l), _MM_HINT_T0);
            }
            __m256 acc[ATTN_GROUP_MAX];
#pragma GCC unroll 4
            for (int j = 0; j < nh; j++)
                acc[j] = _mm256_setzero_ps();
            for (int k = 0; k < len8; k += 8) {
                const __m256 kvec = _mm256_loadu_ps(kr + k);
#pragma GCC unroll 4
                for (int j = 0; j < nh; j++)
                    acc[j] = _mm256_fmadd_ps(_mm256_loadu_ps(q + (size_t)j * hd + k), kvec, acc[j]);
            }
#pragma GCC unroll 4
            for (int j = 0; j < nh; j++)
                s[j] = cpu_simd_hsum8(acc[j]);
#else
            for (int j = 0; j < nh; j++) {
                float l[8] = {0};
                for (int k = 0; k < len8; k += 8)
                    for (int e = 0; e < 8; e++)
                        l[e] = fmaf(q[(size_t)j * hd + k + e], kr[k + e], l[e]);
                s[j] = cpu_simd_hsum8_scalar(l);
            }
#endif
            for (int j = 0; j < nh; j++) {
                for (int k = len8; k < hd; k++)
                    s[j] = fmaf(q[(size_t)j * hd + k], kr[k], s[j]);
                s[j] *= job->scale;
                scores[(size_t)j * job->score_stride + (size_t)(t0 + i)] = s[j];
                m[j] = s[j] > m[j] ? s[j] : m[j];
            }
        }
    }
}

/* out_j[d] = sum over t in increasing order of p_j[t] * v_t[d], one FMA per
 * t (p: the heads' probabilities, score_stride apart), for nh heads. The
 * accumulators stay in registers for a whole pass over t, 16 columns of
 * every head at a time, each V row loaded once per pass for all heads. */
CPU_SIMD_INLINE void attn_values(const struct attn_job *job, int nh, const float *p,
                                 const int32_t *table, int n_pos, const float *vb, float *out)
{
    const int hd = job->head_dim;
    const struct kern_kv_layout *kv = job->kv;
    const size_t kv_stride = (size_t)job->n_kv_heads * (size_t)hd;
    const size_t ps = job->score_stride;
    const int bs = kv->block_size;
    int d = 0;
#ifdef __AVX2__
    for (; d + 16 <= hd; d += 16) {
        __m256 lo[ATTN_GROUP_MAX], hi[ATTN_GROUP_MAX];
#pragma GCC unroll 4
        for (int j = 0; j < nh; j++)
            lo[j] = hi[j] = _mm256_setzero_ps();
        for (int t0 = 0, b = 0; t0 < n_pos; t0 += bs, b++) {
            const float *v = vb + (size_t)table[b] * (size_t)bs * kv_stride + d;
            const int t_end = n_pos - t0 < bs ? n_pos : t0 + bs;
            for (int t = t0; t < t_end; t++, v += kv_stride) {
                const __m256 v0 = _mm256_loadu_ps(v), v1 = _mm256_loadu_ps(v + 8);
#pragma GCC unroll 4
                for (int j = 0; j < nh; j++) {
                    const __m256 pj = _mm256_set1_ps(p[(size_t)j * ps + (size_t)t]);
                    lo[j] = _mm256_fmadd_ps(pj, v0, lo[j]);
                    hi[j] = _mm256_fmadd_ps(pj, v1, hi[j]);
                }
            }
        }
#pragma GCC unroll 4
        for (int j = 0; j < nh; j++) {
            _mm256_storeu_ps(out + (size_t)j * hd + d, lo[j]);
            _mm256_storeu_ps(out + (size_t)j * hd + d + 8, hi[j]);
        }
    }
#endif
    for (; d < hd; d++)
        for (int j = 0; j < nh; j++) {
            float acc = 0.0f;
            for (int t0 = 0, b = 0; t0 < n_pos; t0 += bs, b++) {
                const float *v = vb + (size_t)table[b] * (size_t)bs * kv_stride + d;
                const int t_end = n_pos - t0 < bs ? n_pos : t0 + bs;
                for (int t = t0; t < t_end; t++, v += kv_stride)
                    acc = fmaf(p[(size_t)j * ps + (size_t)t], *v, acc);
            }
            out[(size_t)j * hd + d] = acc;
        }
}

/* nh heads (at most ATTN_GROUP_MAX) of one row sharing kv head g: their q
 * rows lie hd apart at q, their outputs at out. */
CPU_SIMD_INLINE void attn_heads(const struct attn_job *job, int nh, float *scores,
                                const float *q, const int32_t *table, int n_pos, int g,
                                float *out)
{
    const int hd = job->head_dim;
    const float *kb = job->k_pool + (size_t)g * (size_t)hd;
    const float *vb = job->v_pool + (size_t)g * (size_t)hd;
    float m[ATTN_GROUP_MAX];
    attn_scores(job, nh, q, table, n_pos, kb, vb, scores, m);
    for (int j = 0; j < nh; j++) {
        float *sj = scores + (size_t)j * job->score_stride;
        float sum = 0.0f;
        for (int t = 0; t < n_pos; t++) {
            float e = expf(sj[t] - m[j]);
            sj[t] = e;
            sum += e;
        }
        for (int t = 0; t < n_pos; t++)
            sj[t] = sj[t] / sum;
    }
    /* q is read in full above, so out may alias it */
    attn_values(job, nh, scores, table, n_pos, vb, out);
}

typedef void (*attn_heads_fn)(const struct attn_job *job, float *scores, const float *q,
                              const int32_t *table, int n_pos, int g, float *out);
#define ATTN_DEFINE_HEADS(nh)                                                              \
    static void attn_heads_##nh(const struct attn_job *job, float *scores, const float *q, \
                                const int32_t *table, int n_pos, int g, float *out)        \
    {                                                                                      \
        attn_heads(job, nh, scores, q, table, n_pos, g, out);                              \
    }
ATTN_DEFINE_HEADS(1)
ATTN_DEFINE_HEADS(2)
ATTN_DEFINE_HEADS(3)
ATTN_DEFINE_HEADS(4)
static const attn_heads_fn attn_heads_of[ATTN_GROUP_MAX] = {attn_heads_1, attn_heads_2,
                                                              attn_heads_3, attn_heads_4};

/* Tasks are (row, kv head) pairs: all the query heads of that kv head, in
 * runs of up to ATTN_GROUP_MAX. */
static void attn_task(void *ctx, long begin, long end, int thread_idx)
{
    const struct attn_job *job = ctx;
    const int hd = job->head_dim;
    float *scores = job->scratch[thread_idx];
    for (long task = begin; task < end; task++) {
        const long i = task / job->n_kv_heads;
        const int g = (int)(task % job->n_kv_heads);
        const struct kern_kv_layout *kv = job->kv;
        const int32_t *table = kv->tables + (size_t)kv->rows[2 * i] * (size_t)kv->table_stride;
        const int n_pos = kv->rows[2 * i + 1] + 1;
        for (int h = g * job->group; h < (g + 1) * job->group;) {
            const int nh = (g + 1) * job->group - h < ATTN_GROUP_MAX ? (g + 1) * job->group - h
                                                                     : ATTN_GROUP_MAX;
            const size_t qoff = ((size_t)i * (size_t)job->n_heads + (size_t)h) * (size_t)hd;
            attn_heads_of[nh - 1](job, scores, job->q + qoff, table, n_pos, g, job->out + qoff);
            h += nh;
        }
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
    /* each head's scores start on a 64-byte line */
    const size_t score_stride = ((size_t)max_pos + 1 + 15) & ~(size_t)15;
    rc = cpu_backend_scratch_reserve(cb, ATTN_GROUP_MAX * score_stride * sizeof(float), err);
    if (rc < 0)
        return rc;
    struct attn_job job = {
        .out = out, .q = q, .k_pool = k_pool, .v_pool = v_pool, .kv = kv,
        .n_heads = n_heads, .n_kv_heads = n_kv_heads, .head_dim = head_dim,
        .group = n_heads / n_kv_heads, .scale = scale, .scratch = cb->scratch,
        .score_stride = score_stride,
    };
    long n_tasks = (long)n * n_kv_heads;
    /* Work per task grows with the context; tiny problems stay on the caller. */
    long work = work_positions * n_heads * (long)head_dim;
    long chunk = work < 65536 ? n_tasks : 1;
    cpu_pool_run(cb->pool, n_tasks, chunk, attn_task, &job);
    return 0;
}
