/* bfdot_avx512bf16.c: the bf16 product's tiles (bfdot.h) on vdpbf16ps.
 * Built in every x86-64 build with a target attribute, so a portable (AVX2)
 * build still runs them where bd_supported finds the instructions.
 *
 * A tile is T weight rows against R input rows: T x R accumulators of 16
 * lanes, each taking one vdpbf16ps per 32-column step in increasing order
 * (the weights' last, partial step read through a mask, as zeros), then
 * folded by rule 3. Every accumulator goes through the same operations
 * whatever T and R and wherever its weight lines lie, so no bit depends on
 * the tile or the layout.
 *
 * Where the weights lie: a tile's row t reads its step s at
 * w + t * row_stride + s * step_stride (elements): row-major, row_stride =
 * d_in and step_stride = 32; in line octets (packed.h), row_stride = 32 and
 * step_stride = 256, so an octet's 8 rows are one sequential run.
 *
 * The shapes, by input rows in a job (bd_rows_avx512bf16):
 *   - 1 row, line octets: BD_STREAMS octets from separate runs of the
 *     task's rows read side by side, 8 weight rows each, without software
 *     prefetch. The product does one vdpbf16ps per 64-byte line: nothing
 *     but the memory bounds it, and one core keeps enough lines in flight
 *     only with several sequential streams (row-major rows are 8 short
 *     streams that restart at every tile, and read well below the bus).
 *   - 2 to 18 rows, line octets: BD_ROT octets take turns on k-blocks, the
 *     accumulators parked in between (bd_octets_rot); up to BD_WHOLE_MAX
 *     rows a tile is a whole octet against up to 3 rows, more rows take
 *     the octet in two halves of 4 rows against up to BD_RMAX.
 *   - more (prefill): halves of octets against groups of BD_RMAX rows,
 *     whole rows, the first group prefetching.
 *   - row-major rows (a caller's own bytes, the rows after the last full
 *     octet, rows not a multiple of 32 columns): 8 x 1 tiles at one row,
 *     else 4 x R against groups of up to BD_RMAX.
 * Figures: docs/perf/cpu-matmul.md, "bf16 on vdpbf16ps".
 */
#include "bfdot.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define BD_TGT __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512bf16")))
#define BD_OCT 8                   /* rows in an octet (packed.h) */
#define BD_OCT_STEP (BD_OCT * BD_STEP) /* elements of one octet step */
#define BD_GROUPS_MAX 3 /* groups of rows whose accumulators are parked (18 rows) */

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

/* Where a tile's weights lie and which columns it takes: row t's step s at
 * w + t * rs + s * ss (elements); columns [k0, k1) (k1 = d_in: to the end,
 * the partial step included). lead: 0, or how many elements ahead of each
 * row's reads its lines are prefetched. park: NULL for whole rows; else
 * the accumulators live there between k-blocks (loaded unless k0 = 0,
 * stored unless k1 = d_in), which changes no bit. */
struct bd_span {
    const uint16_t *w;
    size_t rs, ss, lead;
    int k0, k1;
    __m512 *park;
};

/* T weight rows against input rows i0 .. i0 + R - 1, into the outputs of
 * rows o0 .. o0 + T - 1. */
BD_TGT static inline __attribute__((always_inline)) void
bd_tile(const struct bd_job *job, const int T, const int R, const struct bd_span *sp, int o0,
        int i0)
{
    const int d_in = job->d_in, dp = job->dp;
    const int last = sp->k1 >= d_in;
    const int full = last ? d_in / BD_STEP * BD_STEP : sp->k1;
    const size_t rs = sp->rs, lead = sp->lead;
    const uint16_t *x = job->xb + (size_t)i0 * (size_t)dp;
    __m512 acc[BD_TMAX][BD_RMAX];
#pragma GCC unroll 8
    for (int t = 0; t < T; t++)
#pragma GCC unroll 6
        for (int r = 0; r < R; r++)
            acc[t][r] = sp->park && sp->k0 > 0 ? sp->park[t * R + r] : _mm512_setzero_ps();
    const uint16_t *ws = sp->w + (size_t)(sp->k0 / BD_STEP) * sp->ss;
    for (int k = sp->k0; k < full; k += BD_STEP, ws += sp->ss) {
        __m512i wv[BD_TMAX];
        if (lead) {
#pragma GCC unroll 8
            for (int t = 0; t < T; t++)
                /* an address, not a pointer: it may lie past the matrix */
                _mm_prefetch((const char *)((uintptr_t)(ws + (size_t)t * rs) + 2 * lead),
                             _MM_HINT_T0);
        }
#pragma GCC unroll 8
        for (int t = 0; t < T; t++)
            wv[t] = _mm512_loadu_si512((const void *)(ws + (size_t)t * rs));
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            const __m512i xv = _mm512_loadu_si512((const void *)(x + (size_t)r * (size_t)dp + k));
#pragma GCC unroll 8
            for (int t = 0; t < T; t++)
                acc[t][r] = bd_dp(acc[t][r], wv[t], xv);
        }
    }
    if (last && full < dp) {
        const __mmask32 m = (__mmask32)((1ull << (d_in - full)) - 1);
        __m512i wv[BD_TMAX];
#pragma GCC unroll 8
        for (int t = 0; t < T; t++)
            wv[t] = _mm512_maskz_loadu_epi16(m, ws + (size_t)t * rs);
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            const __m512i xv = _mm512_loadu_si512((const void *)(x + (size_t)r * (size_t)dp + full));
#pragma GCC unroll 8
            for (int t = 0; t < T; t++)
                acc[t][r] = bd_dp(acc[t][r], wv[t], xv);
        }
    }
    if (!last) {
#pragma GCC unroll 8
        for (int t = 0; t < T; t++)
#pragma GCC unroll 6
            for (int r = 0; r < R; r++)
                sp->park[t * R + r] = acc[t][r];
        return;
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++)
            job->out[(size_t)(i0 + r) * (size_t)job->d_out + (size_t)(o0 + t)] = bd_fold(acc[t][r]);
}

/* The tile of T x R with both constant (one copy per shape, its
 * accumulators in registers). */
BD_TGT static void bd_tile_any(const struct bd_job *job, int T, int R, const struct bd_span *sp,
                               int o0, int i0)
{
#define BD_CASE(t, r)                                                                              \
    case (t) * 8 + (r):                                                                            \
        bd_tile(job, t, r, sp, o0, i0);                                                            \
        return;
    switch (T * 8 + R) {
        BD_CASE(8, 1)
        BD_CASE(8, 2)
        BD_CASE(8, 3)
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

/* Q octets (their first elements in oct[], output rows o[q] ..) side by
 * side against the job's one input row: Q sequential streams. */
BD_TGT static inline __attribute__((always_inline)) void
bd_streams(const struct bd_job *job, const int Q, const uint16_t *const *oct, const int *o)
{
    const int d_in = job->d_in;
    const uint16_t *x = job->xb;
    __m512 acc[BD_STREAMS][BD_OCT];
#pragma GCC unroll 4
    for (int q = 0; q < Q; q++)
#pragma GCC unroll 8
        for (int t = 0; t < BD_OCT; t++)
            acc[q][t] = _mm512_setzero_ps();
    const uint16_t *p[BD_STREAMS];
#pragma GCC unroll 4
    for (int q = 0; q < Q; q++)
        p[q] = oct[q];
    for (int k = 0; k < d_in; k += BD_STEP) {
        const __m512i xv = _mm512_loadu_si512((const void *)(x + k));
#pragma GCC unroll 4
        for (int q = 0; q < Q; q++) {
#pragma GCC unroll 8
            for (int t = 0; t < BD_OCT; t++)
                acc[q][t] = bd_dp(acc[q][t],
                                  _mm512_load_si512((const void *)(p[q] + (size_t)t * BD_STEP)), xv);
            p[q] += BD_OCT_STEP;
        }
    }
#pragma GCC unroll 4
    for (int q = 0; q < Q; q++)
#pragma GCC unroll 8
        for (int t = 0; t < BD_OCT; t++)
            job->out[o[q] + t] = bd_fold(acc[q][t]);
}

BD_TGT static void bd_streams_all(const struct bd_job *job, const uint16_t *const *oct, const int *o)
{
    bd_streams(job, BD_STREAMS, oct, o);
}

BD_TGT static void bd_streams_one(const struct bd_job *job, const uint16_t *const *oct, const int *o)
{
    bd_streams(job, 1, oct, o);
}

/* Row-major rows [o0, o1) against all the job's input rows. */
BD_TGT static void bd_rows_major(const struct bd_job *job, int o0, int o1)
{
    const int n = job->n;
    const size_t rs = (size_t)job->d_in;
    struct bd_span sp = {.rs = rs, .ss = BD_STEP, .k0 = 0, .k1 = job->d_in};
    if (n == 1) {
        int o = o0;
        for (; o + 8 <= o1; o += 8) {
            sp.w = job->w + (size_t)o * rs;
            bd_tile_any(job, 8, 1, &sp, o, 0);
        }
        for (; o < o1; o++) {
            sp.w = job->w + (size_t)o * rs;
            bd_tile_any(job, 1, 1, &sp, o, 0);
        }
        return;
    }
    const int groups = (n + BD_RMAX - 1) / BD_RMAX;
    for (int o = o0, t; o < o1; o += t) {
        t = o1 - o >= 4 ? 4 : 1;
        sp.w = job->w + (size_t)o * rs;
        for (int g = 0, i = 0; g < groups; g++) {
            const int ri = n / groups + (g < n % groups ? 1 : 0);
            bd_tile_any(job, t, ri, &sp, o, i);
            i += ri;
        }
    }
}

/* Octets [b0, b1) (line octets) against the job's one input row:
 * BD_STREAMS runs of the range walked in lockstep, then the rest. */
BD_TGT static void bd_octets_one(const struct bd_job *job, int b0, int b1)
{
    const size_t octet = (size_t)BD_OCT * (size_t)job->d_in;
    const int Q = BD_STREAMS;
    const int run = (b1 - b0) / Q;
    for (int i = 0; i < run; i++) {
        const uint16_t *oct[BD_STREAMS];
        int o[BD_STREAMS];
        for (int q = 0; q < Q; q++) {
            const int b = b0 + q * run + i;
            oct[q] = job->w + (size_t)b * octet;
            o[q] = b * BD_OCT;
        }
        bd_streams_all(job, oct, o);
    }
    for (int b = b0 + Q * run; b < b1; b++) {
        const uint16_t *oct = job->w + (size_t)b * octet;
        const int o = b * BD_OCT;
        bd_streams_one(job, &oct, &o);
    }
}

/* Octets [b0, b1) (line octets) against the job's n >= 2 input rows: up to
 * BD_WHOLE_MAX rows each octet whole against groups of up to 3 rows, more
 * as two halves (4 rows) against groups of up to BD_RMAX. Up to
 * BD_GROUPS_MAX groups (verification), BD_ROT adjacent octets take turns
 * on k-blocks of BD_KB columns, the accumulators parked between them, the
 * first tile over each k-block prefetching its octet's next k-block, and
 * from its last the first of the octet in its place in the next rotation
 * (one octet at a time is one stream a core, too few lines in flight).
 * More groups (prefill): whole rows, one octet at a time, the first group
 * prefetching BD_LEAD ahead. */
BD_TGT static void bd_octets_rot(const struct bd_job *job, int b0, int b1)
{
    const int n = job->n, d_in = job->d_in;
    const size_t octet = (size_t)BD_OCT * (size_t)d_in;
    const int whole = n <= BD_WHOLE_MAX;
    const int T = whole ? BD_OCT : 4, halves = whole ? 1 : 2;
    const int groups = whole ? (n + 2) / 3 : (n + BD_RMAX - 1) / BD_RMAX;
    const int parked = groups <= BD_GROUPS_MAX;
    const int rot = parked ? BD_ROT : 1, kb = parked ? BD_KB : d_in;
    __m512 park[BD_ROT][2][BD_GROUPS_MAX][BD_TMAX * BD_RMAX / 2];
    for (int b = b0; b < b1; b += rot) {
        const int nb = b1 - b < rot ? b1 - b : rot;
        for (int k0 = 0; k0 < d_in; k0 += kb) {
            const int k1 = d_in - k0 < kb ? d_in : k0 + kb;
            const size_t lead = !parked    ? (size_t)BD_LEAD
                                : k1 < d_in ? (size_t)kb * BD_OCT
                                            : (size_t)rot * octet - (size_t)k0 * BD_OCT;
            for (int q = 0; q < nb; q++)
                for (int h = 0; h < halves; h++) {
                    struct bd_span sp = {
                        .w = job->w + (size_t)(b + q) * octet + (size_t)h * 4 * BD_STEP,
                        .rs = BD_STEP, .ss = BD_OCT_STEP, .k0 = k0, .k1 = k1};
                    for (int g = 0, i = 0; g < groups; g++) {
                        const int ri = n / groups + (g < n % groups ? 1 : 0);
                        sp.lead = g == 0 ? lead : 0;
                        sp.park = parked ? park[q][h][g] : NULL;
                        bd_tile_any(job, T, ri, &sp, (b + q) * BD_OCT + h * 4, i);
                        i += ri;
                    }
                }
        }
    }
}

BD_TGT void bd_rows_avx512bf16(const struct bd_job *job, int o0, int o1)
{
    /* tasks start on octets (task_rows is a multiple of 8) */
    const int packed_end = o1 < job->packed_rows ? o1 : job->packed_rows;
    if (o0 < packed_end && job->n == 1)
        bd_octets_one(job, o0 / BD_OCT, packed_end / BD_OCT);
    else if (o0 < packed_end)
        bd_octets_rot(job, o0 / BD_OCT, packed_end / BD_OCT);
    const int rest = o0 > job->packed_rows ? o0 : job->packed_rows;
    if (rest < o1)
        bd_rows_major(job, rest, o1);
}

BD_TGT float bd_dot_avx512bf16(const uint16_t *w, size_t step, const uint16_t *xb, int d_in)
{
    float out;
    const struct bd_job one = {
        .out = &out, .xb = xb, .w = w, .n = 1, .d_in = d_in, .dp = bd_padded(d_in), .d_out = 1};
    const struct bd_span sp = {.w = w, .ss = step, .k0 = 0, .k1 = d_in};
    bd_tile(&one, 1, 1, &sp, 0, 0);
    return out;
}
#endif
