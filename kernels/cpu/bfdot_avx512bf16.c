/* bfdot_avx512bf16.c: the bf16 product's tiles (bfdot.h) on vdpbf16ps.
 * Built in every x86-64 build with a target attribute, so a portable (AVX2)
 * build still runs them where bd_supported finds the instructions.
 *
 * A tile is T weight rows against R input rows: T x R accumulators of 16
 * lanes, each taking one vdpbf16ps per 32-column step in increasing order
 * (the weights' last, partial step read through a mask, as zeros), then
 * folded by rule 3. Every accumulator goes through the same operations
 * whatever T and R, so no bit depends on the tile.
 */
#include "bfdot.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define BD_TGT __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512bf16")))

BD_TGT void bd_round_rows_avx512bf16(const float *in, int d_in, uint16_t *xb, int dp, int i0, int i1)
{
    for (int i = i0; i < i1; i++) {
        const float *x = in + (size_t)i * (size_t)d_in;
        uint16_t *y = xb + (size_t)i * (size_t)dp;
        for (int k = 0; k < dp; k += 16) {
            const int left = d_in - k;
            const __mmask16 m = left >= 16 ? (__mmask16)0xffff
                                : left <= 0 ? (__mmask16)0
                                            : (__mmask16)((1u << left) - 1);
            /* vcvtneps2bf16 is rule 1 itself; the masked lanes are +0 */
            const __m256bh b = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, x + k));
            _mm256_storeu_si256((__m256i *)(void *)(y + k), (__m256i)b);
        }
    }
}

/* Rule 3: 16 lanes to one float. */
BD_TGT static inline __attribute__((always_inline)) float bd_fold(__m512 v)
{
    const __m256 lo = _mm512_castps512_ps256(v);
    const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    const __m256 m = _mm256_add_ps(lo, hi);
    const __m128 a = _mm_add_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    const __m128 b = _mm_add_ps(a, _mm_movehl_ps(a, a));
    return _mm_cvtss_f32(_mm_add_ss(b, _mm_movehdup_ps(b)));
}

BD_TGT static inline __attribute__((always_inline)) __m512 bd_dp(__m512 acc, __m512i w, __m512i x)
{
    return _mm512_dpbf16_ps(acc, (__m512bh)w, (__m512bh)x);
}

BD_TGT static inline __attribute__((always_inline)) void
bd_tile(const struct bd_job *job, const int T, const int R, int o0, int i0)
{
    const int d_in = job->d_in, dp = job->dp;
    const int full = d_in / BD_STEP * BD_STEP;
    const uint16_t *w = job->w + (size_t)o0 * (size_t)d_in;
    const uint16_t *x = job->xb + (size_t)i0 * (size_t)dp;
    __m512 acc[BD_TMAX][BD_RMAX];
#pragma GCC unroll 8
    for (int t = 0; t < T; t++)
#pragma GCC unroll 6
        for (int r = 0; r < R; r++)
            acc[t][r] = _mm512_setzero_ps();
    for (int k = 0; k < full; k += BD_STEP) {
        __m512i wv[BD_TMAX];
#pragma GCC unroll 8
        for (int t = 0; t < T; t++)
            wv[t] = _mm512_loadu_si512((const void *)(w + (size_t)t * (size_t)d_in + k));
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            const __m512i xv = _mm512_loadu_si512((const void *)(x + (size_t)r * (size_t)dp + k));
#pragma GCC unroll 8
            for (int t = 0; t < T; t++)
                acc[t][r] = bd_dp(acc[t][r], wv[t], xv);
        }
    }
    if (full < dp) {
        const __mmask32 m = (__mmask32)((1ull << (d_in - full)) - 1);
        __m512i wv[BD_TMAX];
#pragma GCC unroll 8
        for (int t = 0; t < T; t++)
            wv[t] = _mm512_maskz_loadu_epi16(m, w + (size_t)t * (size_t)d_in + full);
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            const __m512i xv = _mm512_loadu_si512((const void *)(x + (size_t)r * (size_t)dp + full));
#pragma GCC unroll 8
            for (int t = 0; t < T; t++)
                acc[t][r] = bd_dp(acc[t][r], wv[t], xv);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++)
            job->out[(size_t)(i0 + r) * (size_t)job->d_out + (size_t)(o0 + t)] = bd_fold(acc[t][r]);
}

/* The tile of T x R with both constant (one copy per shape, its
 * accumulators in registers). */
BD_TGT static void bd_tile_any(const struct bd_job *job, int T, int R, int o0, int i0)
{
#define BD_CASE(t, r)                                                                              \
    case (t) * 8 + (r):                                                                            \
        bd_tile(job, t, r, o0, i0);                                                                \
        return;
    switch (T * 8 + R) {
        BD_CASE(8, 1)
        BD_CASE(1, 1)
        BD_CASE(4, 1)
        BD_CASE(4, 2)
        BD_CASE(4, 3)
        BD_CASE(4, 4)
        BD_CASE(4, 5)
        BD_CASE(4, 6)
        BD_CASE(1, 2)
        BD_CASE(1, 3)
        BD_CASE(1, 4)
        BD_CASE(1, 5)
        BD_CASE(1, 6)
    default: break;
    }
#undef BD_CASE
}

/* One input row: 8 weight rows a tile (8 streams side by side). More rows:
 * 4 weight rows a tile against groups of at most BD_RMAX input rows, as
 * even as can be, the later groups finding the 4 rows in L1/L2. */
BD_TGT void bd_rows_avx512bf16(const struct bd_job *job, int o0, int o1)
{
    const int n = job->n;
    if (n == 1) {
        int o = o0;
        for (; o + 8 <= o1; o += 8)
            bd_tile_any(job, 8, 1, o, 0);
        for (; o < o1; o++)
            bd_tile_any(job, 1, 1, o, 0);
        return;
    }
    const int groups = (n + BD_RMAX - 1) / BD_RMAX;
    for (int o = o0, t; o < o1; o += t) {
        t = o1 - o >= 4 ? 4 : 1;
        for (int g = 0, i = 0; g < groups; g++) {
            const int ri = n / groups + (g < n % groups ? 1 : 0);
            bd_tile_any(job, t, ri, o, i);
            i += ri;
        }
    }
}

BD_TGT float bd_dot_avx512bf16(const uint16_t *w, const uint16_t *xb, int d_in)
{
    float out;
    const struct bd_job one = {
        .out = &out, .xb = xb, .w = w, .n = 1, .d_in = d_in, .dp = bd_padded(d_in), .d_out = 1};
    bd_tile(&one, 1, 1, 0, 0);
    return out;
}
#endif
