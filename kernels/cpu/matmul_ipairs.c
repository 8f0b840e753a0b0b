/* matmul_ipairs.c: cpu_matmul's input-pair path (AVX-512F+BW; n =
 * MM_IPAIRS_MIN up to MM_PAIRED_MAX: longer verifications, batches of
 * decode rows; the output pairs of matmul_opairs.c take the smaller n, the
 * contract and the choice of path are in matmul.c).
 *
 * Tasks are blocks of MM_RO output rows. A 512-bit FMA does the work of two
 * 256-bit ones in the same issue slot (at full width on Zen 5 and on Intel
 * server cores), so two input rows share one zmm: lanes 0-7 hold the eight
 * lane accumulators of (weight row a, input row 2p) and lanes 8-15 those of
 * (a, 2p+1). Each half sees exactly the FMAs, in the same order, as the
 * 256-bit accumulator of the same output would (FMA is lane by lane), and is
 * folded with cpu_simd_hsum8 and finished with the scalar tail as before:
 * the bits do not change, only half as many FMAs are issued. The weight
 * vector is widened once into both halves (a broadcast load and one
 * widening), and the inputs are packed once per call so that the two rows
 * of a pair are one aligned 64-byte load per k-step (mm_pack_pairs). The
 * block's 4 weight rows are applied to up to 12 input rows per read.
 * Which of the two pair paths: the output pairs win while the input rows
 * still fit in L1 beside their stream; from about 5 or 6 rows the input
 * pairs win, and with the output pairs in k-blocks (mm_blocks_opairs_kb)
 * n = 5 stays with them too.
 * The prefetch is the output pairs' (MM_PF, once per 64-byte line of each
 * weight row).
 * Figures: docs/perf/cpu-matmul.md, "Input pairs".
 */
#include <math.h>
#include <string.h>

#include "matmul_internal.h"

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define MM_PAIRS4 6 /* most input-row pairs with 4 weight rows (24 + 4 + 1 zmm) */
#define MM_PAIRS 9  /* most pairs with 1 weight row (tail rows of d_out) */

/* Weights idx .. idx+7 widened to f32, in lanes 0-7 and again in 8-15. */
CPU_SIMD_INLINE __m512 mm_load8x2(enum kern_dtype dt, const void *w, size_t idx)
{
    switch (dt) {
    case KERN_DTYPE_BF16: {
        __m256i h = _mm256_broadcastsi128_si256(
            _mm_loadu_si128((const __m128i *)(const void *)((const uint16_t *)w + idx)));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    case KERN_DTYPE_F16: {
        __m256i h = _mm256_broadcastsi128_si256(
            _mm_loadu_si128((const __m128i *)(const void *)((const uint16_t *)w + idx)));
        return _mm512_cvtph_ps(h);
    }
    case KERN_DTYPE_F32: break;
    case KERN_DTYPE_Q8:
    case KERN_DTYPE_Q4: break; /* never here: int8/int4 take qdot.c's integer product */
    }
    return _mm512_castpd_ps(_mm512_broadcast_f64x4(
        _mm256_castps_pd(_mm256_loadu_ps((const float *)w + idx))));
}

/* One paired tile: out[b*ldo + a] = dot(w row a, x row b) for a < ro and the
 * rows b < n_valid of np pairs (n_valid is 2*np, or 2*np - 1 when the last
 * pair holds one real row). xq: the pairs packed by mm_pack_pairs, pstride
 * floats apart; x: the same rows unpacked (for the scalar tail). */
CPU_SIMD_INLINE void mm_qtile(enum kern_dtype dt, int ro, int np, const void *w, size_t ldw,
                              const float *xq, size_t pstride, const float *x, size_t ldx,
                              int d_in, int n_valid, float *out, size_t ldo)
{
    const int len8 = d_in & ~7;
    __m512 acc[MM_RO][MM_PAIRS];
#pragma GCC unroll 4
    for (int a = 0; a < ro; a++)
#pragma GCC unroll 9
        for (int p = 0; p < np; p++)
            acc[a][p] = _mm512_setzero_ps();
    const size_t esize = kern_dtype_size(dt);
    for (int k = 0; k < len8; k += 8) {
        __m512 wv[MM_RO];
        if ((k & 31) == 0)
#pragma GCC unroll 4
            for (int a = 0; a < ro; a++)
                _mm_prefetch((const char *)((uintptr_t)w +
                                            esize * ((size_t)a * ldw + (size_t)k + MM_PF)),
                             _MM_HINT_T0);
#pragma GCC unroll 4
        for (int a = 0; a < ro; a++)
            wv[a] = mm_load8x2(dt, w, (size_t)a * ldw + (size_t)k);
#pragma GCC unroll 9
        for (int p = 0; p < np; p++) {
            __m512 xv = _mm512_load_ps(xq + (size_t)p * pstride + 2 * (size_t)k);
            __asm__("" : "+v"(xv)); /* one load, ro uses (see mm_tile) */
#pragma GCC unroll 4
            for (int a = 0; a < ro; a++)
                acc[a][p] = _mm512_fmadd_ps(wv[a], xv, acc[a][p]);
        }
    }
    for (int a = 0; a < ro; a++)
        for (int p = 0; p < np; p++)
            for (int h = 0; h < 2; h++) {
                const int b = 2 * p + h;
                if (b >= n_valid)
                    break;
                const __m256 half = h ? _mm256_castpd_ps(_mm512_extractf64x4_pd(
                                            _mm512_castps_pd(acc[a][p]), 1))
                                      : _mm512_castps512_ps256(acc[a][p]);
                float sum = cpu_simd_hsum8(half);
                for (int k = len8; k < d_in; k++)
                    sum = fmaf(mm_load1(dt, w, (size_t)a * ldw + (size_t)k),
                               x[(size_t)b * ldx + (size_t)k], sum);
                out[(size_t)b * ldo + (size_t)a] = sum;
            }
}

typedef void (*mm_qtile_fn)(const void *w, size_t ldw, const float *xq, size_t pstride,
                            const float *x, size_t ldx, int d_in, int n_valid, float *out,
                            size_t ldo);

#define MM_DEFINE_QTILE(dtname, dt, ro, np)                                                  \
    static void mm_qtile_##dtname##_##ro##x##np(const void *w, size_t ldw, const float *xq,  \
                                                size_t pstride, const float *x, size_t ldx, \
                                                int d_in, int n_valid, float *out, size_t ldo) \
    {                                                                                        \
        mm_qtile(dt, ro, np, w, ldw, xq, pstride, x, ldx, d_in, n_valid, out, ldo);          \
    }
#define MM_DEFINE_QTILES_RO(dtname, dt, ro)                                                  \
    MM_DEFINE_QTILE(dtname, dt, ro, 1) MM_DEFINE_QTILE(dtname, dt, ro, 2)                    \
    MM_DEFINE_QTILE(dtname, dt, ro, 3) MM_DEFINE_QTILE(dtname, dt, ro, 4)                    \
    MM_DEFINE_QTILE(dtname, dt, ro, 5) MM_DEFINE_QTILE(dtname, dt, ro, 6)                    \
    MM_DEFINE_QTILE(dtname, dt, ro, 7) MM_DEFINE_QTILE(dtname, dt, ro, 8)                    \
    MM_DEFINE_QTILE(dtname, dt, ro, 9)
#define MM_DEFINE_QTILES(dtname, dt)                                                         \
    MM_DEFINE_QTILES_RO(dtname, dt, 4) MM_DEFINE_QTILES_RO(dtname, dt, 1)
MM_DEFINE_QTILES(bf16, KERN_DTYPE_BF16)
MM_DEFINE_QTILES(f16, KERN_DTYPE_F16)
MM_DEFINE_QTILES(f32, KERN_DTYPE_F32)

/* mm_qtiles[dtype][ro == 4][np - 1]; 4 x np is used for np <= MM_PAIRS4 only
 * (the larger ones exist to keep the table uniform). */
#define MM_QTILE_RO(dtname, ro)                                                              \
    {mm_qtile_##dtname##_##ro##x1, mm_qtile_##dtname##_##ro##x2,                             \
     mm_qtile_##dtname##_##ro##x3, mm_qtile_##dtname##_##ro##x4,                             \
     mm_qtile_##dtname##_##ro##x5, mm_qtile_##dtname##_##ro##x6,                             \
     mm_qtile_##dtname##_##ro##x7, mm_qtile_##dtname##_##ro##x8,                             \
     mm_qtile_##dtname##_##ro##x9}
#define MM_QTILE_ROW(dtname) {MM_QTILE_RO(dtname, 1), MM_QTILE_RO(dtname, 4)}
static const mm_qtile_fn mm_qtiles[3][2][MM_PAIRS] = {
    [KERN_DTYPE_BF16] = MM_QTILE_ROW(bf16),
    [KERN_DTYPE_F16] = MM_QTILE_ROW(f16),
    [KERN_DTYPE_F32] = MM_QTILE_ROW(f32),
};

/* Floats of packed pairs for n rows of length d_in (see mm_pack_pairs). */
size_t mm_pairs_floats(int n, int d_in)
{
    return (size_t)((n + 1) / 2) * 2 * (size_t)(d_in & ~7);
}

/* Packs the first len8 columns of n input rows in pairs: pair p is
 * xq[p * 2 * len8 ...], k-step by k-step 16 floats, row 2p's eight then row
 * 2p+1's eight (row 2p's again when n is odd and 2p+1 == n). */
void mm_pack_pairs(const float *in, int n, int d_in, float *xq)
{
    const size_t len8 = (size_t)(d_in & ~7);
    for (int p = 0; p < (n + 1) / 2; p++) {
        const float *r0 = in + (size_t)(2 * p) * (size_t)d_in;
        const float *r1 = 2 * p + 1 < n ? r0 + d_in : r0;
        float *q = xq + (size_t)p * 2 * len8;
        for (size_t k = 0; k < len8; k += 8) {
            memcpy(q + 2 * k, r0 + k, 8 * sizeof(float));
            memcpy(q + 2 * k + 8, r1 + k, 8 * sizeof(float));
        }
    }
}

/* mm_block for n >= 2 with packed pairs: `ro` (MM_RO or 1) weight rows
 * applied to the pairs in as few groups as fit in registers (sizes as even
 * as can be): up to 2 * MM_PAIRS4 input rows, each weight row is read from
 * memory once and applied to all of them while in registers; more rows find
 * the block in L1/L2 on the later groups. (Splitting the 4 weight rows into
 * two 2-row passes instead, to keep more pairs per tile, measured slower:
 * every input vector is then loaded twice as often.) */
void mm_block_pairs(const struct mm_job *job, enum kern_dtype dt, const void *w, int ro, int o0)
{
    const size_t d_in = (size_t)job->d_in, d_out = (size_t)job->d_out;
    const size_t pstride = 2 * (d_in & ~(size_t)7);
    const int n = job->n, np_all = (n + 1) / 2;
    const int max_pairs = ro == MM_RO ? MM_PAIRS4 : MM_PAIRS;
    const int n_groups = (np_all + max_pairs - 1) / max_pairs;
    for (int g = 0, p0 = 0; g < n_groups; g++) {
        const int np = np_all / n_groups + (g < np_all % n_groups);
        const int b0 = 2 * p0, n_valid = n - b0 < 2 * np ? n - b0 : 2 * np;
        mm_qtiles[dt][ro == MM_RO][np - 1](w, d_in, job->xq + (size_t)p0 * pstride, pstride,
                                            job->in + (size_t)b0 * d_in, d_in, job->d_in,
                                            n_valid, job->out + (size_t)b0 * d_out + (size_t)o0,
                                            d_out);
        p0 += np;
    }
}
#endif
