/* attention.c: cpu_kv_store and cpu_attention, causal grouped-query
 * attention over a paged KV cache (struct kern_kv_layout).
 *
 * Query row i (sequence s, position p), head h, kv head g = h / (n_heads /
 * n_kv_heads), over the positions t = 0..p of s, wherever their blocks sit:
 *   s[t]   = dot(q[i][h], k[t][g]) * scale   (fixed-order dot, cpu_simd.h)
 *   m      = max_t s[t]
 *   e[t]   = cpu_simd_exp(s[t] - m);  sum = the fixed-order sum of the e[t]
 *            (cpu_simd.h: 8 lanes over t, the fixed fold, the tail in order)
 *   out[d] = sum over t in increasing order of (e[t] / sum) * v[t][g][d],
 *            one FMA per t for each d (vectorised across d, never across t).
 * Every step depends only on the row's position, its q and its sequence's
 * cached values, so a row's output is the same whether it is computed alone
 * or beside others, by any thread, from any blocks.
 *
 * Token trees (struct kern_kv_layout's paths): t above is a node's logical
 * position; its context (t < L) is walked as a chain's, and its at most 32
 * path positions one by one at the slots the path names. The scores sit at
 * index t, the softmax's lanes and the V sum run over t, so the node gets
 * the bits the chain of its path gets at the same position (the chains of
 * one call share only the walk over the context). A chain's path_base is
 * its n_pos: it never takes the indirection.
 *
 * Tasks are (block of up to ATTN_ROWS_MAX rows, kv head) pairs. A (row,
 * head) is a "chain"; the chains of one kv head over the rows of one
 * sequence in the block (a verification's K + 1 rows, the query heads that
 * share the kv head: 4 in Llama 3.2 1B, 3 in 3B) read the same K and V
 * rows, so up to ATTN_CHAINS_MAX of them go through one pass over K and one
 * over V, each row loaded once for all, their arithmetic interleaved and
 * each still exactly the sequence above. With AVX-512, two chains share a
 * 512-bit accumulator for the scores (attn_scores_pairs) and a V row is one
 * pass of 64 columns. The scores live in per-thread scratch (grown once to
 * the longest context seen). out may alias q: a chain's q is read before
 * its out slice is written.
 *
 * The cost is the context's: at 2048 positions a 1B-shaped layer's 8 MB of
 * K and V, against 120 MB of weights. In-process, against the previous
 * kernel (a task per row and kv head, libm expf one score at a time, V read
 * 16 columns per pass), 2 threads, the cache cold (a 512 MiB read before
 * each call), 2048 positions, medians of 11 paired calls, both over the
 * same huge-page cache: 1B shape (32/8 heads) 0.42x the time at one row,
 * 0.36-0.38x at 3 rows, 0.34x at 5; the small model's (12/4) 0.40-0.45x at
 * one row, 0.34-0.40x at 3, 0.32-0.39x at 5 (two runs each). The cache's
 * pages matter as much: over 4 KiB pages (the cache before cpu_backend.c
 * gave large buffers huge pages) an earlier form of this kernel took
 * 2.2-2.6x as long at one row, the previous one 1.3x.
 */
#include <math.h>
#include <string.h>

#include "cpu_backend.h"
#include "cpu_simd.h"
#include "error.h"

/* Rows of one sequence share a task (up to ATTN_ROWS_MAX of them): a
 * verification's K + 1 rows read the same cached K and V rows, so each is
 * loaded once for all of them. 2, 4 and 8 timed alike at 3 to 9 rows (1B
 * shape, 2048 positions). */
#define ATTN_ROWS_MAX 4
/* (row, head) chains that share one pass over K and V: their accumulators,
 * one K or V row and a probability in registers (32 vector registers with
 * AVX-512, 16 with AVX2 alone). */
#ifdef __AVX512F__
#define ATTN_CHAINS_MAX 8
#else
#define ATTN_CHAINS_MAX 4
#endif
/* positions ahead whose K row is prefetched (attn_scores): the cache's rows
 * arrive from memory, a few hundred cycles away, and a position takes a few
 * dozen cycles (32 and 64 were no faster; nor was prefetching V ahead in
 * the pass over V instead of during the scores) */
#define ATTN_PREFETCH_ROWS 16
/* the longest head the paired scores take (their q rows on the stack) */
#define ATTN_PAIRS_HD_MAX 256

/* One (row, head): its q row, its scores (then probabilities) in scratch,
 * its output slice and how many positions it attends. A tree node's
 * positions from path_base on are read at path[t - path_base] (struct
 * kern_kv_layout); a chain's path is NULL and its path_base n_pos, so its
 * walks never reach the indirection. */
struct attn_chain {
    const float *q;
    float *scores;
    float *out;
    int n_pos;
    int path_base;
    const int32_t *path;
};

struct attn_job {
    float *out;
    const float *q;
    const float *k_pool;
    const float *v_pool;
    const struct kern_kv_layout *kv;
    int n, n_heads, n_kv_heads, head_dim, group;
    float scale;
    float **scratch; /* per thread: ATTN_CHAINS_MAX x [max position + 1] scores */
    size_t score_stride; /* floats between two chains' scores */
};

/* Pool row of position t of the sequence whose table is given. */
static inline size_t pool_row(const struct kern_kv_layout *kv, const int32_t *table, int t)
{
    return (size_t)table[t / kv->block_size] * (size_t)kv->block_size +
           (size_t)(t % kv->block_size);
}

/* The cache row of position t (base: the pool plus the kv head's offset). */
static inline const float *attn_row(const struct attn_job *job, const float *base,
                                    const int32_t *table, int t)
{
    return base + pool_row(job->kv, table, t) * (size_t)job->n_kv_heads * (size_t)job->head_dim;
}

/* attn_row of chain c's logical position t: a tree node's path positions at
 * their slots (a chain's path_base is its n_pos: never taken). */
static inline const float *attn_row_of(const struct attn_job *job, const float *base,
                                       const int32_t *table, const struct attn_chain *c, int t)
{
    return attn_row(job, base, table, t < c->path_base ? t : c->path[t - c->path_base]);
}

#ifdef __AVX2__
/* The cache's rows arrive cold (a layer's weights stream through the caches
 * between two attention calls): the K row some positions ahead (another
 * block's, or past the pool: an address, not a pointer, never dereferenced)
 * and this position's V row, read after the softmax, are fetched early. kr:
 * this position's K row in the pool at kb; vb: the same kv head's V. */
CPU_SIMD_INLINE void attn_prefetch(const struct attn_job *job, const float *kr, const float *kb,
                                   const float *vb)
{
    const size_t kv_stride = (size_t)job->n_kv_heads * (size_t)job->head_dim;
    const uintptr_t k_ahead = (uintptr_t)kr + ATTN_PREFETCH_ROWS * kv_stride * sizeof(float);
    const uintptr_t v_row = (uintptr_t)(vb + (kr - kb));
    for (int l = 0; l < job->head_dim * (int)sizeof(float); l += 64) {
        _mm_prefetch((const char *)(k_ahead + (uintptr_t)l), _MM_HINT_T0);
        _mm_prefetch((const char *)(v_row + (uintptr_t)l), _MM_HINT_T0);
    }
}
#endif

/* Position t's dot products s[c] of nc chains, scaled, into their scores
 * (score_stride apart from scores: attn_task lays them out so), each
 * chain's largest kept in m[c]. */
CPU_SIMD_INLINE void attn_keep_scores(const struct attn_job *job, int nc, float *s, float *scores,
                                      int t, float *m)
{
#pragma GCC unroll 8
    for (int c = 0; c < nc; c++) {
        s[c] *= job->scale;
        scores[(size_t)c * job->score_stride + (size_t)t] = s[c];
        m[c] = s[c] > m[c] ? s[c] : m[c];
    }
}

/* Position t's scores of nc chains, cpu_simd_dot_f32(q, k_t) * scale with
 * kr the K row it reads, loaded once for all chains; m[c] raised to each
 * chain's largest. */
CPU_SIMD_INLINE void attn_score_at(const struct attn_job *job, int nc, const struct attn_chain *ch,
                                   const float *kr, int t, float *m)
{
    const int hd = job->head_dim, len8 = hd & ~7;
    float *scores = ch[0].scores;
    float s[ATTN_CHAINS_MAX];
#ifdef __AVX2__
    __m256 acc[ATTN_CHAINS_MAX];
#pragma GCC unroll 8
    for (int c = 0; c < nc; c++)
        acc[c] = _mm256_setzero_ps();
    for (int k = 0; k < len8; k += 8) {
        const __m256 kvec = _mm256_loadu_ps(kr + k);
#pragma GCC unroll 8
        for (int c = 0; c < nc; c++)
            acc[c] = _mm256_fmadd_ps(_mm256_loadu_ps(ch[c].q + k), kvec, acc[c]);
    }
#pragma GCC unroll 8
    for (int c = 0; c < nc; c++)
        s[c] = cpu_simd_hsum8(acc[c]);
#else
    for (int c = 0; c < nc; c++) {
        float l[8] = {0};
        for (int k = 0; k < len8; k += 8)
            for (int e = 0; e < 8; e++)
                l[e] = fmaf(ch[c].q[k + e], kr[k + e], l[e]);
        s[c] = cpu_simd_hsum8_scalar(l);
    }
#endif
    if (len8 < hd)
        for (int c = 0; c < nc; c++)
            for (int k = len8; k < hd; k++)
                s[c] = fmaf(ch[c].q[k], kr[k], s[c]);
    attn_keep_scores(job, nc, s, scores, t, m);
}

/* Scores of nc chains at positions [t_begin, t_end) (attn_score_at), a
 * block's run of K rows at a time. */
CPU_SIMD_INLINE void attn_scores(const struct attn_job *job, int nc, const struct attn_chain *ch,
                                 const int32_t *table, int t_begin, int t_end, const float *kb,
                                 const float *vb, float *m)
{
    const struct kern_kv_layout *kv = job->kv;
    const size_t kv_stride = (size_t)job->n_kv_heads * (size_t)job->head_dim;
    const int bs = kv->block_size;
    (void)vb;
    for (int t0 = t_begin; t0 < t_end;) {
        const int tn = bs - t0 % bs < t_end - t0 ? bs - t0 % bs : t_end - t0;
        const float *kr = attn_row(job, kb, table, t0);
        for (int i = 0; i < tn; i++, kr += kv_stride) {
#ifdef __AVX2__
            attn_prefetch(job, kr, kb, vb);
#endif
            attn_score_at(job, nc, ch, kr, t0 + i, m);
        }
        t0 += tn;
    }
}

/* One tree node's scores at its path's positions [c->path_base, c->n_pos),
 * each K row read at the slot the path gives it: the same arithmetic as
 * attn_scores, by logical position. At most 32 rows, just written: no
 * prefetch. */
static void attn_scores_path(const struct attn_job *job, const struct attn_chain *c,
                             const int32_t *table, const float *kb, float *m)
{
    for (int t = c->path_base; t < c->n_pos; t++)
        attn_score_at(job, 1, c, attn_row(job, kb, table, c->path[t - c->path_base]), t, m);
}

#ifdef __AVX512F__
/* attn_scores for positions [0, t_end) with two chains per 512-bit
 * accumulator: chain 2i's 8 lanes in the low half, chain 2i + 1's in the
 * high half (qp: their q rows so interleaved, 8 columns of each per 64
 * bytes), and each 8 columns of the K row broadcast to both halves: half
 * the multiply-adds, and each half the same chain of them, in the same
 * order, as one chain's 8-lane accumulator. Needs head_dim % 8 == 0. */
CPU_SIMD_INLINE void attn_scores_pairs(const struct attn_job *job, int nc, int chunks,
                                       const float *qp, float *scores, const int32_t *table,
                                       int t_end, const float *kb, const float *vb, float *m)
{
    const int hd = job->head_dim, np = (nc + 1) / 2;
    const struct kern_kv_layout *kv = job->kv;
    const size_t kv_stride = (size_t)job->n_kv_heads * (size_t)hd;
    const int bs = kv->block_size;
    for (int t0 = 0; t0 < t_end;) {
        const int tn = bs - t0 % bs < t_end - t0 ? bs - t0 % bs : t_end - t0;
        const float *kr = attn_row(job, kb, table, t0);
        for (int i = 0; i < tn; i++, kr += kv_stride) {
            const int t = t0 + i;
            attn_prefetch(job, kr, kb, vb);
            __m512 acc[ATTN_CHAINS_MAX / 2];
#pragma GCC unroll 4
            for (int p = 0; p < np; p++)
                acc[p] = _mm512_setzero_ps();
#pragma GCC unroll 16
            for (int k = 0; k < chunks; k++) {
                const __m512 kk = _mm512_broadcast_f32x8(_mm256_loadu_ps(kr + 8 * k));
#pragma GCC unroll 4
                for (int p = 0; p < np; p++)
                    acc[p] = _mm512_fmadd_ps(
                        _mm512_loadu_ps(qp + ((size_t)p * (size_t)chunks + (size_t)k) * 16), kk,
                        acc[p]);
            }
            float s[ATTN_CHAINS_MAX];
            if (np == 1) {
                s[0] = cpu_simd_hsum8(_mm512_castps512_ps256(acc[0]));
                s[1] = cpu_simd_hsum8(
                    _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[0]), 1)));
                attn_keep_scores(job, nc, s, scores, t, m);
                continue;
            }
            /* From 2 pairs, the 8 lanes of up to 8 chains are folded side by
             * side, each chain in exactly cpu_simd_hsum8's tree: the same
             * two operands in every addition. Stage 1, a_i = l_i + l_i+4:
             * the 128-bit quarters l_0..3 and l_4..7 of each chain, added. */
            __m512 pr[ATTN_CHAINS_MAX / 2];
#pragma GCC unroll 4
            for (int p = 0; p < ATTN_CHAINS_MAX / 2; p++)
                pr[p] = p < np ? acc[p] : _mm512_setzero_ps();
            const __m512 a03 = _mm512_add_ps(                       /* chains 0-3 */
                _mm512_shuffle_f32x4(pr[0], pr[1], _MM_SHUFFLE(2, 0, 2, 0)),
                _mm512_shuffle_f32x4(pr[0], pr[1], _MM_SHUFFLE(3, 1, 3, 1)));
            const __m512 a47 = _mm512_add_ps(                       /* chains 4-7 */
                _mm512_shuffle_f32x4(pr[2], pr[3], _MM_SHUFFLE(2, 0, 2, 0)),
                _mm512_shuffle_f32x4(pr[2], pr[3], _MM_SHUFFLE(3, 1, 3, 1)));
            /* stage 2, b_0 = a_0 + a_2 and b_1 = a_1 + a_3: quarter j holds
             * them for chain j, then for chain j + 4 */
            const __m512 b = _mm512_add_ps(_mm512_shuffle_ps(a03, a47, _MM_SHUFFLE(1, 0, 1, 0)),
                                           _mm512_shuffle_ps(a03, a47, _MM_SHUFFLE(3, 2, 3, 2)));
            /* stage 3, b_0 + b_1: chain j in lane 4j, chain j + 4 in 4j + 1 */
            const __m512 sum = _mm512_add_ps(_mm512_shuffle_ps(b, b, _MM_SHUFFLE(2, 0, 2, 0)),
                                             _mm512_shuffle_ps(b, b, _MM_SHUFFLE(3, 1, 3, 1)));
            const __m512i order = _mm512_set_epi32(15, 14, 11, 10, 7, 6, 3, 2, 13, 9, 5, 1, 12, 8, 4, 0);
            _mm256_storeu_ps(s, _mm512_castps512_ps256(_mm512_permutexvar_ps(order, sum)));
            attn_keep_scores(job, nc, s, scores, t, m);
        }
        t0 += tn;
    }
}
#endif

/* out_c[d] = sum over t in increasing order of p_c[t] * v_t[d], one FMA per
 * t, for nc chains: positions below the shortest chain's count with each V
 * row loaded once for all chains, then each chain's own last positions.
 * The accumulators stay in registers for a whole pass over t: 64 or 32
 * columns of every chain at a time with AVX-512, 16 with AVX2, the columns
 * left one at a time. */
CPU_SIMD_INLINE void attn_values(const struct attn_job *job, int nc, const struct attn_chain *ch,
                                 const int32_t *table, int n_common, const float *vb)
{
    const int hd = job->head_dim;
    int d = 0;
#ifdef __AVX2__ /* the SIMD passes walk V a block at a time; the scalar tail does not */
    const size_t kv_stride = (size_t)job->n_kv_heads * (size_t)hd;
    const int bs = job->kv->block_size;
#endif
#ifdef __AVX512F__
    /* 64 columns per pass up to 4 chains, 32 beyond: a 1-row head's V row
     * in one pass (each further pass reads all of V again, from L2 at best) */
    const int cw = nc <= 4 ? 64 : 32;
    for (; d + cw <= hd; d += cw) {
        __m512 acc[ATTN_CHAINS_MAX][4];
#pragma GCC unroll 8
        for (int c = 0; c < nc; c++)
#pragma GCC unroll 4
            for (int u = 0; u < cw / 16; u++)
                acc[c][u] = _mm512_setzero_ps();
        for (int t0 = 0; t0 < n_common;) {
            const int tn = bs - t0 % bs < n_common - t0 ? bs - t0 % bs : n_common - t0;
            const float *v = attn_row(job, vb, table, t0) + d;
            for (int t = t0; t < t0 + tn; t++, v += kv_stride) {
                __m512 vv[4];
#pragma GCC unroll 4
                for (int u = 0; u < cw / 16; u++)
                    vv[u] = _mm512_loadu_ps(v + 16 * u);
#pragma GCC unroll 8
                for (int c = 0; c < nc; c++) {
                    const __m512 pc = _mm512_set1_ps(ch[c].scores[t]);
#pragma GCC unroll 4
                    for (int u = 0; u < cw / 16; u++)
                        acc[c][u] = _mm512_fmadd_ps(pc, vv[u], acc[c][u]);
                }
            }
            t0 += tn;
        }
#pragma GCC unroll 8
        for (int c = 0; c < nc; c++) {
            for (int t = n_common; t < ch[c].n_pos; t++) {
                const float *v = attn_row_of(job, vb, table, &ch[c], t) + d;
                const __m512 pc = _mm512_set1_ps(ch[c].scores[t]);
#pragma GCC unroll 4
                for (int u = 0; u < cw / 16; u++)
                    acc[c][u] = _mm512_fmadd_ps(pc, _mm512_loadu_ps(v + 16 * u), acc[c][u]);
            }
#pragma GCC unroll 4
            for (int u = 0; u < cw / 16; u++)
                _mm512_storeu_ps(ch[c].out + d + 16 * u, acc[c][u]);
        }
    }
#endif
#ifdef __AVX2__
    for (; d + 16 <= hd; d += 16) {
        __m256 lo[ATTN_CHAINS_MAX], hi[ATTN_CHAINS_MAX];
#pragma GCC unroll 8
        for (int c = 0; c < nc; c++)
            lo[c] = hi[c] = _mm256_setzero_ps();
        for (int t0 = 0; t0 < n_common;) {
            const int tn = bs - t0 % bs < n_common - t0 ? bs - t0 % bs : n_common - t0;
            const float *v = attn_row(job, vb, table, t0) + d;
            for (int t = t0; t < t0 + tn; t++, v += kv_stride) {
                const __m256 v0 = _mm256_loadu_ps(v), v1 = _mm256_loadu_ps(v + 8);
#pragma GCC unroll 8
                for (int c = 0; c < nc; c++) {
                    const __m256 pc = _mm256_set1_ps(ch[c].scores[t]);
                    lo[c] = _mm256_fmadd_ps(pc, v0, lo[c]);
                    hi[c] = _mm256_fmadd_ps(pc, v1, hi[c]);
                }
            }
            t0 += tn;
        }
#pragma GCC unroll 8
        for (int c = 0; c < nc; c++) {
            for (int t = n_common; t < ch[c].n_pos; t++) {
                const float *v = attn_row_of(job, vb, table, &ch[c], t) + d;
                const __m256 pc = _mm256_set1_ps(ch[c].scores[t]);
                lo[c] = _mm256_fmadd_ps(pc, _mm256_loadu_ps(v), lo[c]);
                hi[c] = _mm256_fmadd_ps(pc, _mm256_loadu_ps(v + 8), hi[c]);
            }
            _mm256_storeu_ps(ch[c].out + d, lo[c]);
            _mm256_storeu_ps(ch[c].out + d + 8, hi[c]);
        }
    }
#endif
    for (; d < hd; d++)
        for (int c = 0; c < nc; c++) {
            float acc = 0.0f;
            for (int t = 0; t < ch[c].n_pos; t++)
                acc = fmaf(ch[c].scores[t], attn_row_of(job, vb, table, &ch[c], t)[d], acc);
            ch[c].out[d] = acc;
        }
}

/* s[t] = e[t] / sum for t < n_pos, where e[t] = cpu_simd_exp(s[t] - m) and
 * sum is the fixed-order sum of the e[t] (cpu_simd.h: 8 lanes, the fixed
 * fold, the tail in order). */
static void attn_softmax(float *s, int n_pos, float m)
{
    const int len8 = n_pos & ~7;
    float sum;
#ifdef __AVX2__
    const __m256 mv = _mm256_set1_ps(m);
    __m256 acc = _mm256_setzero_ps();
    for (int t = 0; t < len8; t += 8) {
        const __m256 e = cpu_simd_exp8(_mm256_sub_ps(_mm256_loadu_ps(s + t), mv));
        _mm256_storeu_ps(s + t, e);
        acc = _mm256_add_ps(acc, e);
    }
    sum = cpu_simd_hsum8(acc);
#else
    float l[8] = {0};
    for (int t = 0; t < len8; t += 8)
        for (int j = 0; j < 8; j++) {
            s[t + j] = cpu_simd_exp_scalar(s[t + j] - m);
            l[j] += s[t + j];
        }
    sum = cpu_simd_hsum8_scalar(l);
#endif
    for (int t = len8; t < n_pos; t++) {
        s[t] = cpu_simd_exp_scalar(s[t] - m);
        sum += s[t];
    }
    for (int t = 0; t < n_pos; t++)
        s[t] = s[t] / sum;
}

/* nc chains (at most ATTN_CHAINS_MAX) of one sequence and one kv head g. */
CPU_SIMD_INLINE void attn_chains(const struct attn_job *job, int nc, const struct attn_chain *ch,
                                 const int32_t *table, int g)
{
    const int hd = job->head_dim;
    const float *kb = job->k_pool + (size_t)g * (size_t)hd;
    const float *vb = job->v_pool + (size_t)g * (size_t)hd;
    float m[ATTN_CHAINS_MAX];
    /* the positions every chain reads at the same rows: a tree's context */
    int n_common = ch[0].path_base;
    for (int c = 0; c < nc; c++) {
        m[c] = -INFINITY;
        n_common = ch[c].path_base < n_common ? ch[c].path_base : n_common;
    }
#ifdef __AVX512F__
    if (hd % 8 == 0 && hd <= ATTN_PAIRS_HD_MAX) {
        /* the chains' q rows in pairs (attn_scores_pairs); an odd chain
         * count leaves a high half of zeros, computed and dropped */
        float qp[ATTN_CHAINS_MAX / 2 * ATTN_PAIRS_HD_MAX * 2] __attribute__((aligned(64)));
        const int chunks = hd / 8;
        for (int c = 0; c < (nc + 1) / 2 * 2; c++)
            for (int k = 0; k < chunks; k++)
                for (int j = 0; j < 8; j++)
                    qp[((size_t)(c / 2) * (size_t)chunks + (size_t)k) * 16 + (size_t)(c % 2) * 8 +
                       (size_t)j] = c < nc ? ch[c].q[8 * k + j] : 0.0f;
        /* Llama's head sizes as constants: the loop over a row unrolled */
        if (hd == 64)
            attn_scores_pairs(job, nc, 8, qp, ch[0].scores, table, n_common, kb, vb, m);
        else if (hd == 128)
            attn_scores_pairs(job, nc, 16, qp, ch[0].scores, table, n_common, kb, vb, m);
        else
            attn_scores_pairs(job, nc, chunks, qp, ch[0].scores, table, n_common, kb, vb, m);
    } else
#endif
        attn_scores(job, nc, ch, table, 0, n_common, kb, vb, m);
    for (int c = 0; c < nc; c++) {
        if (ch[c].path_base > n_common)
            attn_scores(job, 1, &ch[c], table, n_common, ch[c].path_base, kb, vb, &m[c]);
        if (ch[c].path)
            attn_scores_path(job, &ch[c], table, kb, &m[c]);
    }
    for (int c = 0; c < nc; c++)
        attn_softmax(ch[c].scores, ch[c].n_pos, m[c]);
    /* every chain's q is read in full above, so out may alias it */
    attn_values(job, nc, ch, table, n_common, vb);
}

typedef void (*attn_chains_fn)(const struct attn_job *job, const struct attn_chain *ch,
                               const int32_t *table, int g);
#define ATTN_DEFINE_CHAINS(nc)                                                              \
    static void attn_chains_##nc(const struct attn_job *job, const struct attn_chain *ch, \
                                 const int32_t *table, int g)                              \
    {                                                                                       \
        attn_chains(job, nc, ch, table, g);                                                 \
    }
ATTN_DEFINE_CHAINS(1)
ATTN_DEFINE_CHAINS(2)
ATTN_DEFINE_CHAINS(3)
ATTN_DEFINE_CHAINS(4)
#if ATTN_CHAINS_MAX > 4
ATTN_DEFINE_CHAINS(5)
ATTN_DEFINE_CHAINS(6)
ATTN_DEFINE_CHAINS(7)
ATTN_DEFINE_CHAINS(8)
#endif
static const attn_chains_fn attn_chains_of[ATTN_CHAINS_MAX] = {
    attn_chains_1, attn_chains_2, attn_chains_3, attn_chains_4,
#if ATTN_CHAINS_MAX > 4
    attn_chains_5, attn_chains_6, attn_chains_7, attn_chains_8,
#endif
};

/* Tasks are (block of ATTN_ROWS_MAX rows, kv head) pairs: within the block,
 * each run of rows of one sequence against all the query heads of that kv
 * head, as chains taken ATTN_CHAINS_MAX at a time. */
static void attn_task(void *ctx, long begin, long end, int thread_idx)
{
    const struct attn_job *job = ctx;
    const struct kern_kv_layout *kv = job->kv;
    const int hd = job->head_dim;
    float *scores = job->scratch[thread_idx];
    for (long task = begin; task < end; task++) {
        const int g = (int)(task % job->n_kv_heads);
        const int i_end = (int)((task / job->n_kv_heads + 1) * ATTN_ROWS_MAX) < job->n
                              ? (int)((task / job->n_kv_heads + 1) * ATTN_ROWS_MAX)
                              : job->n;
        for (int i = (int)(task / job->n_kv_heads * ATTN_ROWS_MAX); i < i_end;) {
            const int seq = kv->rows[2 * i];
            int run_end = i + 1;
            while (run_end < i_end && kv->rows[2 * run_end] == seq)
                run_end++;
            const int32_t *table = kv->tables + (size_t)seq * (size_t)kv->table_stride;
            struct attn_chain ch[ATTN_CHAINS_MAX];
            int nc = 0;
            for (int r = i; r < run_end; r++) {
                const int n_pos = kv->rows[2 * r + 1] + 1;
                const int depth = kv->path_offset ? kv->path_offset[r + 1] - kv->path_offset[r] : 0;
                for (int h = g * job->group; h < (g + 1) * job->group; h++) {
                    const size_t qoff = ((size_t)r * (size_t)job->n_heads + (size_t)h) * (size_t)hd;
                    ch[nc] = (struct attn_chain){
                        .q = job->q + qoff, .out = job->out + qoff,
                        .scores = scores + (size_t)nc * job->score_stride, .n_pos = n_pos,
                        .path_base = n_pos - depth,
                        .path = depth ? kv->path_phys + kv->path_offset[r] : NULL};
                    if (++nc == ATTN_CHAINS_MAX) {
                        attn_chains_of[nc - 1](job, ch, table, g);
                        nc = 0;
                    }
                }
            }
            if (nc)
                attn_chains_of[nc - 1](job, ch, table, g);
            i = run_end;
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
        const size_t dst = pool_row(kv, table, kern_kv_row_slot(kv, i)) * (size_t)kv_dim;
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
    /* each chain's scores start on a 64-byte line */
    const size_t score_stride = ((size_t)max_pos + 1 + 15) & ~(size_t)15;
    rc = cpu_backend_scratch_reserve(cb, ATTN_CHAINS_MAX * score_stride * sizeof(float), err);
    if (rc < 0)
        return rc;
    struct attn_job job = {
        .out = out, .q = q, .k_pool = k_pool, .v_pool = v_pool, .kv = kv, .n = n,
        .n_heads = n_heads, .n_kv_heads = n_kv_heads, .head_dim = head_dim,
        .group = n_heads / n_kv_heads, .scale = scale, .scratch = cb->scratch,
        .score_stride = score_stride,
    };
    long n_tasks = (long)((n + ATTN_ROWS_MAX - 1) / ATTN_ROWS_MAX) * n_kv_heads;
    /* Work per task grows with the context; tiny problems stay on the caller. */
    long work = work_positions * n_heads * (long)head_dim;
    long chunk = work < 65536 ? n_tasks : 1;
    cpu_pool_run(cb->pool, n_tasks, chunk, attn_task, &job);
    return 0;
}
