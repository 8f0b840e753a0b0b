/* argmax.c: cpu_matmul_argmax and cpu_prepare_argmax, the index of the
 * largest logit without computing every logit exactly.
 *
 * Why: a greedy (or point-mass) draft only needs the argmax of its logits,
 * and so does greedy verification; the LM head is most of what a small
 * draft reads: 525 MB of bf16 in a draft of 760 MB at the Llama-1B shape (2
 * layers and the 2048 x 128256 head), and a fifth of the 1B target. A
 * one-byte copy of the head halves that read, and it can still give
 * the exact answer: its scores bound every exact logit from both sides, so
 * only the few rows whose upper bound reaches the best lower bound can be
 * the argmax, and those are computed exactly from the real weights, in the
 * fixed order of cpu_simd.h. The index returned is bit for bit the one the
 * full matmul and argmax_f32 (base/argmax.h) give (the lowest index of the largest
 * value), whatever the bounds: they only decide how many rows are redone.
 *
 * The bound, per row v of W (input row h, d = d_in):
 *   - the shadow: Q_v = round(W_v / s_v), s_v = max |W_v| / 127, int8;
 *   - the input: hq = round(h / s_h), s_h = max |h| / QMAX_H, int16, so the
 *     score I_v = sum_k hq_k Q_vk is an exact integer (no rounding at all),
 *     and A_v = s_h s_v I_v is the exact product of the two approximations;
 *   - |L_v - A_v| <= e_h |W_v|_1 + |s_h hq|_2 |W_v - s_v Q_v|_2
 *                    + gamma_d |h|_2 |W_v|_2 = eps_v
 *     where L_v is the float logit matmul computes: the first two terms are
 *     the error of the approximations (e_h = max_k |h_k - s_h hq_k|, then
 *     Cauchy-Schwarz), the last the float rounding of L_v against the real
 *     dot product (any order of d fused multiply-adds: gamma_d = 2 d 2^-24).
 *     The norms are computed once per row in double and stored rounded up,
 *     and eps_v is widened for the double arithmetic that computes it.
 * A bf16 head on vdpbf16ps (bfdot.h) computes L_v from h rounded to bf16:
 * the screen then takes that rounded h as h, the last term still bounds
 * its roundings (d steps of one rounding or two per pair, and the fold's
 * 15 additions, fewer than 2d), and eps_v gains 2^-126 (d_pad + |h|_1) for
 * its flushing (a denormal weight read as zero, each step's denormal result
 * flushed).
 * With M = max_v (A_v - eps_v), a row with A_v + eps_v < M has L_v < M <= the
 * largest L, so every row that holds the largest L (ties included) is among
 * the candidates A_v + eps_v >= M. On random bf16 rows the bound is about
 * 0.4 standard deviations of the logits each side.
 *
 * Up to ARGMAX_GROUP input rows share one pass over the copy (a batch of
 * drafting sequences, a verification's rows); up to ARGMAX_SCREEN_ROWS_MAX
 * rows are screened, more take one product over the head, which is cheaper
 * by then.
 *
 * A draft's copy (prepare_argmax with draft set): half a byte a weight,
 *   Q_v = round(W_v / s_v) in -7..7, s_v = max |W_v| / 7, stored as Q_v + 8,
 * the input in bytes, hq = round(h / s_h), s_h = max |h| / 127, and
 * statistical margins in place of the worst case for both errors:
 *   eps_v = ARGMAX_DRAFT_Z (|s_h hq|_2 |W_v - s_v Q_v|_2
 *                           + |h - s_h hq|_2 |W_v|_2) / sqrt(d)
 *           + gamma_d |h|_2 |W_v|_2,
 * ARGMAX_DRAFT_Z standard deviations of sum_k h_k e_vk for rounding errors
 * e_vk of the copy that are independent of h, and of sum_k e_k W_vk for the
 * input's rounding errors e_k, which do not depend on the row (Cauchy-Schwarz
 * would be sqrt(d) = 20-45 of them at the draft shapes, and would keep every
 * row). A row is then dropped wrongly only when its error and the best
 * row's are together more than 2 ARGMAX_DRAFT_Z of their spread apart: the
 * index is the exact one but for a chance below 1e-7 a competing row (none
 * missed in 15,000 inputs at 384, 2048 and 128 columns with an outlier
 * column 20 times the rest, nor in 6,000 with one 300 times the rest, where
 * most of the input's bytes are 0 or 1). Why that is enough: a draft's
 * argmax is a proposal the target verifies, and a wrong proposal costs one
 * rejected token, never a token of output; the copy halves the read that
 * is most of a small draft's step (the 384 x 128256 head: 24.6 MB against
 * 49.2 MB, beside a 12.6 MB body), and bytes against bytes take half the
 * products and none of the widening (scores_rows_draft).
 *
 * Not screened (the whole row of logits is computed and scanned, same
 * answer): a matrix without a shadow, an input row with a NaN or infinity or
 * all zeros, and a row with too many candidates to be worth it
 * (ARGMAX_CANDIDATES_MIN, ARGMAX_CANDIDATES_SHARE).
 *
 * Files: this one holds the contract, the screen and cpu_matmul_argmax;
 * argmax_shadow.c makes the copies (cpu_prepare_argmax); argmax_internal.h
 * is what they share. Figures behind the screen's shape:
 * docs/perf/cpu-matmul.md, "matmul_argmax".
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "argmax.h"
#include "argmax_internal.h"
#include "bfdot.h"
#include "cpu_simd.h"
#include "error.h"
#include "packed.h"

#define ARGMAX_ROWS_PER_TASK 64
#define ARGMAX_QMAX_H 32767
#define ARGMAX_QMAX_H_DRAFT 127 /* a draft copy's input is bytes (scores_rows_draft) */
/* Candidates beyond this share of the rows (or this floor) cost more to redo
 * than the full product saves: the row is computed whole instead. */
#define ARGMAX_CANDIDATES_MIN 256
#define ARGMAX_CANDIDATES_SHARE 32
#define ARGMAX_GROUP 8          /* input rows screened in one pass over the copy */
#define ARGMAX_SCREEN_ROWS_MAX 8 /* more rows: one product over the whole head */
#define ARGMAX_THREADS_MAX 64   /* pools larger than this compute rows whole */
#define ARGMAX_PREFETCH_ROWS 2  /* how far ahead the screen prefetches each stream, in rows */
#define ARGMAX_STREAMS 4        /* rows read side by side, each from its own run of a claim */

/* ---- memory ---- */

static int grow_buffer(void **buf, size_t *cap, size_t want, size_t elem, char *err)
{
    if (want <= *cap)
        return 0;
    void *p = NULL;
    if (posix_memalign(&p, 64, want * elem) != 0)
        return error_set(err, ERR_NOMEM, "cpu matmul_argmax: out of memory for %zu bytes",
                         want * elem);
    free(*buf);
    *buf = p;
    *cap = want;
    return 0;
}

/* ---- reading W exactly ---- */

/* Logit v exactly as matmul computes it: the fixed-order dot product of the
 * row and h (matmul's every path gives these bits; cpu_simd.h), or, with hb
 * (h rounded, bfdot.h), vdpbf16ps's product of the row and hb. */
static float exact_logit(const struct cpu_argmax_shadow *s, int v, const float *h,
                         const uint16_t *hb, float *row)
{
    if (hb)
        return bd_dot_avx512bf16((const uint16_t *)s->w +
                                     cpu_lines_row_offset(s->layout, s->packed, s->cols, v),
                                 cpu_lines_step(s->layout, s->packed, v), hb, s->cols);
#if defined(__AVX512F__) && defined(__AVX512BW__)
    if (s->layout == CPU_LAYOUT_OCTETS && v < s->packed) {
        /* Straight from the packed octet: step by step its 64-byte lines
         * hold this row's 8-column chunks 2L (high halves) and 2L + 1 (low
         * halves) in lanes (v % 2) * 8 .. + 7, in increasing column order,
         * so the chunks reach the 8 lane accumulators in the fixed order. */
        const char *octet = (const char *)s->w + (size_t)(v / CPU_PACKED_ROWS) *
                                                     CPU_PACKED_ROWS * 2 * (size_t)s->cols;
        const size_t at = (size_t)(v % CPU_PACKED_ROWS / 2) * 128 + (size_t)(v % 2) * 32;
        const __m256i high = _mm256_set1_epi32((int)0xFFFF0000u);
        __m256 acc = _mm256_setzero_ps();
        for (int k = 0; k < s->cols; k += CPU_PACKED_STEP, octet += CPU_PACKED_STEP_BYTES)
            for (int line = 0; line < 2; line++) {
                const __m256i raw =
                    _mm256_loadu_si256((const __m256i *)(const void *)(octet + at + 64 * line));
                const float *x = h + k + 16 * line;
                acc = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(raw, high)),
                                      _mm256_loadu_ps(x), acc);
                acc = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(raw, 16)),
                                      _mm256_loadu_ps(x + 8), acc);
            }
        return cpu_simd_hsum8(acc); /* packed rows are whole steps: no tail */
    }
#endif
    cpu_matrix_row_f32(s->w, s->dtype, s->cols, s->packed, s->layout, v, row);
    return cpu_simd_dot_f32(row, h, s->cols);
}

/* ---- the screen ---- */

/* One input row as the screen reads it: hq = round(h / s_h) (int16, in the
 * group's hq buffer; for a draft copy int8, in the first cols_pad bytes of
 * the row's place there) and the terms of its bound: e_h weighs |W_v|_1
 * (the worst case), e_h2 |W_v|_2 times the copy's dq_factor (a draft's
 * statistical margin). */
struct screen_input {
    double s_h, e_h, e_h2, hn2, gamma_hx2, flush;
    int64_t hq_sum; /* sum_k hq_k: a draft copy's scores carry ARGMAX_DRAFT_OFFSET times it */
};

/* Quantizes h into hq [stride]; 1 where the screen cannot serve it (a NaN,
 * an infinity, all zeros, or rows too long for the integer lanes). */
static int quantize_input(const struct cpu_argmax_shadow *s, const float *h, int16_t *hq,
                          struct screen_input *si)
{
    double maxabs = 0, hx2 = 0, hx1 = 0;
    for (int k = 0; k < s->cols; k++) {
        if (!isfinite(h[k]))
            return 1;
        maxabs = fmax(maxabs, fabs((double)h[k]));
        hx2 += (double)h[k] * h[k];
        hx1 += fabs((double)h[k]);
    }
    if (maxabs == 0)
        return 1;
    /* keep every 32-bit lane of the scores below 2^31 */
    const double lane_terms = (double)(s->cols_pad / 8);
    const double code_max = s->draft ? 2 * ARGMAX_DRAFT_OFFSET - 1 : ARGMAX_QMAX_W;
    const double qmax_cap = s->draft ? ARGMAX_QMAX_H_DRAFT : ARGMAX_QMAX_H;
    double qmax_h = floor(2147483647.0 / (lane_terms * code_max));
    qmax_h = qmax_h > qmax_cap ? qmax_cap : qmax_h;
    /* past 4128 columns the int16 input takes fewer levels (8192: 16512),
     * still far finer than the copy; a byte input has none to spare */
    if (qmax_h < (s->draft ? ARGMAX_QMAX_H_DRAFT : 255))
        return 1;
    const double s_h = maxabs / qmax_h;
    double e_h = 0, e_h2 = 0, hn2 = 0;
    int64_t hq_sum = 0;
    int8_t *hq8 = (int8_t *)hq;
    for (int k = 0; k < s->cols; k++) {
        long r = lrint((double)h[k] / s_h);
        r = r > (long)qmax_h ? (long)qmax_h : r < -(long)qmax_h ? -(long)qmax_h : r;
        if (s->draft)
            hq8[k] = (int8_t)r;
        else
            hq[k] = (int16_t)r;
        hq_sum += r;
        const double hat = s_h * (double)r;
        const double e = fabs((double)h[k] - hat);
        e_h = fmax(e_h, e);
        e_h2 += e * e;
        hn2 += hat * hat;
    }
    if (s->draft)
        memset(hq8 + s->cols, 0, (size_t)(s->cols_pad - s->cols));
    else
        memset(hq + s->cols, 0, (size_t)(s->cols_pad - s->cols) * sizeof *hq);
    /* e_h and hn2 are taken from s_h * r rounded to double: the 2^-50 covers
     * that rounding where e_h itself is about 0 */
    const double gamma = 2.0 * (double)s->cols * 0x1p-24;
    e_h = (e_h + maxabs * 0x1p-50) * (1 + 1e-9);
    *si = (struct screen_input){.s_h = s_h, .hn2 = sqrt(hn2) * (1 + 1e-9),
                                .gamma_hx2 = gamma * sqrt(hx2) * (1 + 1e-9),
                                .flush = 0x1p-126 * ((double)s->cols_pad + hx1) * (1 + 1e-9),
                                .hq_sum = hq_sum};
    /* A draft's input in bytes errs by up to s_h / 2 a column, 128 times
     * what the int16 input does: weighed at its worst case (e_h |W_v|_1,
     * d / sqrt(d) times the spread of a sum of d such errors against
     * weights that do not depend on them) it would keep most rows. It is
     * weighed as the copy's own error is, by ARGMAX_DRAFT_Z standard
     * deviations of sum_k e_k W_vk, |e|_2 |W_v|_2 / sqrt(d) each. */
    if (s->draft)
        si->e_h2 = (sqrt(e_h2) + sqrt((double)s->cols) * maxabs * 0x1p-50) * (1 + 1e-9);
    else
        si->e_h = e_h;
    return 0;
}

/* The copy's rows v[0..nj) into q; returns the prefetch lead in bytes. */
CPU_SIMD_INLINE uintptr_t shadow_rows(const struct cpu_argmax_shadow *s, int nj, const long *v,
                                      const int8_t *q[4])
{
    for (int j = 0; j < nj; j++)
        q[j] = s->q + (size_t)v[j] * (size_t)s->stride;
    return ARGMAX_PREFETCH_ROWS * (uintptr_t)s->stride;
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
CPU_SIMD_INLINE void scores_zero512(__m512i acc[4][ARGMAX_GROUP], int nj, int ni)
{
#pragma GCC unroll 4
    for (int j = 0; j < nj; j++)
#pragma GCC unroll 8
        for (int i = 0; i < ni; i++)
            acc[j][i] = _mm512_setzero_si512();
}

/* The accumulators' 32-bit lanes summed in 64 bits. */
CPU_SIMD_INLINE void scores_sum512(__m512i acc[4][ARGMAX_GROUP], int nj, int ni,
                                   int64_t out[][ARGMAX_GROUP])
{
#pragma GCC unroll 4
    for (int j = 0; j < nj; j++)
#pragma GCC unroll 8
        for (int i = 0; i < ni; i++)
            out[j][i] = _mm512_reduce_add_epi64(
                _mm512_add_epi64(_mm512_cvtepi32_epi64(_mm512_castsi512_si256(acc[j][i])),
                                 _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(acc[j][i], 1))));
}
#endif

/* I[j][i] = sum_k hq_i,k Q_(v[j]),k for nj (1, 2 or 4) copy rows v[] and the ni input
 * rows of hq (stride apart), exact: one read of the rows serves every
 * input. Each 32-bit lane sums at most stride / 8 products (AVX2; stride /
 * 16 with AVX-512) of |hq| <= qmax_h and |Q| <= 127, which quantize_input
 * keeps below 2^31; the lanes are summed in 64 bits. Each row's stream is
 * prefetched ARGMAX_PREFETCH_ROWS rows ahead (an address, not a pointer:
 * it may lie past the copy). */
#if defined(__AVX512F__) && defined(__AVX512BW__)
CPU_SIMD_INLINE void scores_rows(const struct cpu_argmax_shadow *s, const int16_t *hq, int nj,
                                 int ni, const long *v, int64_t out[][ARGMAX_GROUP])
{
    const int8_t *q[4];
    const uintptr_t lead = shadow_rows(s, nj, v, q);
    __m512i acc[4][ARGMAX_GROUP];
    scores_zero512(acc, nj, ni);
    for (int k = 0; k < s->stride; k += 64) {
        __m512i w[4][2];
#pragma GCC unroll 4
        for (int j = 0; j < nj; j++) {
            const int8_t *qj = q[j] + k;
            _mm_prefetch((const char *)((uintptr_t)qj + lead), _MM_HINT_T0);
            w[j][0] = _mm512_cvtepi8_epi16(_mm256_load_si256((const __m256i *)(const void *)qj));
            w[j][1] =
                _mm512_cvtepi8_epi16(_mm256_load_si256((const __m256i *)(const void *)(qj + 32)));
        }
#pragma GCC unroll 8
        for (int i = 0; i < ni; i++) {
            const int16_t *hi = hq + (size_t)i * (size_t)s->cols_pad + k;
            const __m512i h0 = _mm512_load_si512((const void *)hi);
            const __m512i h1 = _mm512_load_si512((const void *)(hi + 32));
#pragma GCC unroll 4
            for (int j = 0; j < nj; j++) {
#ifdef __AVX512VNNI__
                acc[j][i] = _mm512_dpwssd_epi32(acc[j][i], w[j][0], h0);
                acc[j][i] = _mm512_dpwssd_epi32(acc[j][i], w[j][1], h1);
#else
                acc[j][i] = _mm512_add_epi32(acc[j][i], _mm512_madd_epi16(w[j][0], h0));
                acc[j][i] = _mm512_add_epi32(acc[j][i], _mm512_madd_epi16(w[j][1], h1));
#endif
            }
        }
    }
    scores_sum512(acc, nj, ni, out);
}
#elif defined(__AVX2__)
CPU_SIMD_INLINE void scores_rows(const struct cpu_argmax_shadow *s, const int16_t *hq, int nj,
                                 int ni, const long *v, int64_t out[][ARGMAX_GROUP])
{
    const int8_t *q[4];
    const uintptr_t lead = shadow_rows(s, nj, v, q);
    __m256i acc[4][ARGMAX_GROUP];
#pragma GCC unroll 4
    for (int j = 0; j < nj; j++)
#pragma GCC unroll 8
        for (int i = 0; i < ni; i++)
            acc[j][i] = _mm256_setzero_si256();
    for (int k = 0; k < s->stride; k += 32) {
        __m256i w[4][2];
#pragma GCC unroll 4
        for (int j = 0; j < nj; j++) {
            const int8_t *qj = q[j] + k;
            _mm_prefetch((const char *)((uintptr_t)qj + lead), _MM_HINT_T0);
            w[j][0] = _mm256_cvtepi8_epi16(_mm_load_si128((const __m128i *)(const void *)qj));
            w[j][1] = _mm256_cvtepi8_epi16(_mm_load_si128((const __m128i *)(const void *)(qj + 16)));
        }
#pragma GCC unroll 8
        for (int i = 0; i < ni; i++) {
            const int16_t *hi = hq + (size_t)i * (size_t)s->cols_pad + k;
            const __m256i h0 = _mm256_load_si256((const __m256i *)(const void *)hi);
            const __m256i h1 = _mm256_load_si256((const __m256i *)(const void *)(hi + 16));
#pragma GCC unroll 4
            for (int j = 0; j < nj; j++) {
                acc[j][i] = _mm256_add_epi32(acc[j][i], _mm256_madd_epi16(w[j][0], h0));
                acc[j][i] = _mm256_add_epi32(acc[j][i], _mm256_madd_epi16(w[j][1], h1));
            }
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < nj; j++)
#pragma GCC unroll 8
        for (int i = 0; i < ni; i++) {
            int64_t lanes[4];
            _mm256_storeu_si256(
                (__m256i *)(void *)lanes,
                _mm256_add_epi64(_mm256_cvtepi32_epi64(_mm256_castsi256_si128(acc[j][i])),
                                 _mm256_cvtepi32_epi64(_mm256_extracti128_si256(acc[j][i], 1))));
            out[j][i] = lanes[0] + lanes[1] + lanes[2] + lanes[3];
        }
}
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__)
/* scores_rows on the draft copy: each 64-byte block of a row is 128 codes, the
 * low halves of its bytes columns 0..63 of the block, the high halves
 * 64..127, and the input is bytes (quantize_input), so a block's codes meet
 * their inputs as they lie: the low halves the block's first 64 input
 * bytes, the high halves the next 64, four products a 32-bit lane an
 * instruction (VNNI's unsigned-by-signed byte dot product; without it two
 * byte products summed in 16 bits, which 2 x 15 x 127 fits, then widened).
 * Faster than codes unpacked to 16 bits against a 16-bit input, though
 * the bytes' wider margin keeps about twice the candidates. The sums carry
 * ARGMAX_DRAFT_OFFSET * sum_k hq_k (the stored codes are Q + 8), which
 * screen_task takes off.
 * Each 32-bit lane sums 8 products of a block, stride / 8 in all
 * (quantize_input's bound). */
CPU_SIMD_INLINE void scores_rows_draft(const struct cpu_argmax_shadow *s, const int16_t *hq,
                                       int nj, int ni, const long *v, int64_t out[][ARGMAX_GROUP])
{
    const int8_t *q[4];
    const uintptr_t lead = shadow_rows(s, nj, v, q);
    const __m512i nibble = _mm512_set1_epi8(0x0F);
#ifndef __AVX512VNNI__
    const __m512i ones = _mm512_set1_epi16(1);
#endif
    __m512i acc[4][ARGMAX_GROUP];
    scores_zero512(acc, nj, ni);
    for (int k = 0; k < s->stride; k += 64) {
        __m512i lo[4], hi[4];
#pragma GCC unroll 4
        for (int j = 0; j < nj; j++) {
            const int8_t *qj = q[j] + k;
            _mm_prefetch((const char *)((uintptr_t)qj + lead), _MM_HINT_T0);
            const __m512i raw = _mm512_load_si512((const void *)qj);
            lo[j] = _mm512_and_si512(raw, nibble);
            hi[j] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), nibble);
        }
#pragma GCC unroll 8
        for (int i = 0; i < ni; i++) {
            const int8_t *hb = (const int8_t *)(hq + (size_t)i * (size_t)s->cols_pad) + 2 * (size_t)k;
            const __m512i h0 = _mm512_load_si512((const void *)hb);
            const __m512i h1 = _mm512_load_si512((const void *)(hb + 64));
#pragma GCC unroll 4
            for (int j = 0; j < nj; j++) {
#ifdef __AVX512VNNI__
                acc[j][i] = _mm512_dpbusd_epi32(acc[j][i], lo[j], h0);
                acc[j][i] = _mm512_dpbusd_epi32(acc[j][i], hi[j], h1);
#else
                const __m512i pairs = _mm512_add_epi16(_mm512_maddubs_epi16(lo[j], h0),
                                                       _mm512_maddubs_epi16(hi[j], h1));
                acc[j][i] = _mm512_add_epi32(acc[j][i], _mm512_madd_epi16(pairs, ones));
#endif
            }
        }
    }
    scores_sum512(acc, nj, ni, out);
}
#endif

/* The stored code of column k of a draft copy's row q (Q + 8). */
static int draft_code(const int8_t *q, int k)
{
    const int j = k % ARGMAX_DRAFT_COLS;
    const uint8_t byte = (uint8_t)q[(size_t)(k / ARGMAX_DRAFT_COLS) * 64 + (size_t)(j % 64)];
    return j < 64 ? byte & 0x0F : byte >> 4;
}

/* scores_rows for count rows (where fewer than 4 are left), in plain integers. */
static void scores_plain(const struct cpu_argmax_shadow *s, const int16_t *hq, int ni,
                         const long v[4], int count, int64_t out[4][ARGMAX_GROUP])
{
    for (int j = 0; j < count; j++) {
        const int8_t *q = s->q + (size_t)v[j] * (size_t)s->stride;
        for (int i = 0; i < ni; i++) {
            const int16_t *hi = hq + (size_t)i * (size_t)s->cols_pad;
            const int8_t *hb = (const int8_t *)hi; /* a draft's input is bytes */
            int64_t sum = 0;
            for (int k = 0; k < s->cols; k++)
                sum += s->draft ? (int64_t)hb[k] * draft_code(q, k) : (int64_t)hi[k] * q[k];
            out[j][i] = sum;
        }
    }
}

#if defined(__AVX512F__) && defined(__AVX512BW__) || defined(__AVX2__)
/* The scores of four copy rows v[] (one from each stream of a claim) for
 * the group's ni input rows, with the row counts constant so that the
 * accumulators stay in registers: up to 4 input rows against the four copy
 * rows at once; more against two at a time (AVX-512: 4 x 8 accumulators
 * would be all 32 registers) or one at a time (AVX2, 16 registers). Each
 * copy row is read once either way: one pass over the copy serves up to
 * ARGMAX_GROUP rows, where groups of 4 made a 5-row verification read the
 * copy twice. */
#if defined(__AVX512F__) && defined(__AVX512BW__)
#define SCORES_WIDE 2
#else
#define SCORES_WIDE 1
#endif
/* ni and draft are constants where this is inlined (screen_task picks one
 * screen_claims per row count and copy kind), so the branches fold away. */
CPU_SIMD_INLINE void scores_claim(const struct cpu_argmax_shadow *s, const int16_t *hq, int ni,
                                  int draft, const long v[4], int64_t out[4][ARGMAX_GROUP])
{
    const int nj = ni <= 4 ? 4 : SCORES_WIDE;
#if defined(__AVX512F__) && defined(__AVX512BW__)
    if (draft) {
        for (int j0 = 0; j0 < 4; j0 += nj)
            scores_rows_draft(s, hq, nj, ni, v + j0, out + j0);
        return;
    }
#else
    (void)draft;
#endif
    for (int j0 = 0; j0 < 4; j0 += nj)
        scores_rows(s, hq, nj, ni, v + j0, out + j0);
}
#endif

/* The margin eps_v of a row whose norms are n1, n2 and dq, for input si,
 * less its share of |A_v| (see screen_task). Monotone in each norm, in the
 * rounded arithmetic too (each step is), so at the copy's largest norms it
 * is at least every row's. */
static inline double screen_margin(const struct cpu_argmax_shadow *s, const struct screen_input *si,
                                   double n1, double n2, double dq)
{
    return (si->e_h * n1 + (si->hn2 * dq + si->e_h2 * n2) * s->dq_factor + si->gamma_hx2 * n2 +
            si->flush) *
               (1 + 1e-6) +
           1e-30;
}

struct screen_job {
    const struct cpu_argmax_shadow *s;
    const int16_t *hq;      /* ni rows, stride apart */
    int ni;
    const uint64_t *allow[ARGMAX_GROUP]; /* each input row's mask, NULL: all allowed */
    int masked;             /* some input row has a mask */
    struct screen_input in[ARGMAX_GROUP];
    double eps_max[ARGMAX_GROUP]; /* screen_margin at the copy's largest norms */
    int32_t *kept;          /* cpu_argmax.kept */
    double *kept_upper;
    int *n_kept;            /* [threads][ARGMAX_GROUP * 16]: each thread's on its own lines */
    double *lower_max;      /* [ni][threads * 8]: each thread's on its own cache line */
};

/* Thread t's list for input row i: its count in n_kept, its first entry in
 * kept and kept_upper. */
static size_t kept_count_at(int t, int i)
{
    return ((size_t)t * ARGMAX_GROUP + (size_t)i) * 16;
}

static size_t kept_list_at(const struct cpu_argmax_shadow *s, int t, int i)
{
    return ((size_t)t * ARGMAX_GROUP + (size_t)i) * (size_t)s->rows;
}

static inline int row_allowed(const uint64_t *allow, long r)
{
    return !allow || (int)((allow[r >> 6] >> (r & 63)) & 1u);
}

/* allowed[i]: which of the claim's rows v[0..count) input row i allows, a
 * bit each; returns whether any input row allows any of them. */
static inline int claim_allowed(const struct screen_job *job, const long *v, int count, int ni,
                                unsigned *allowed)
{
    unsigned any = 0;
    for (int i = 0; i < ni; i++) {
        unsigned bits = 0;
        for (int j = 0; j < count; j++)
            bits |= (unsigned)row_allowed(job->allow[i], v[j]) << j;
        allowed[i] = bits;
        any |= bits;
    }
    return any != 0;
}

/* A claim of tasks is ARGMAX_STREAMS runs of rows read side by side
 * (faster than one sequential run prefetched ahead, and than the runs
 * interleaved in one run of the copy's own layout). Each row's bound is
 * weighed at once against the best lower bound this thread has seen: a row
 * whose upper bound is below it can not hold the largest logit, and only
 * the others are kept (a few hundred rows), where writing every row's bound
 * and scanning them all after the pass cost a share of the screen's time. */
CPU_SIMD_INLINE void screen_claims(const struct screen_job *job, long begin, long end,
                                   int thread_idx, int ni, int draft)
{
    const struct cpu_argmax_shadow *s = job->s;
    double lower_max[ARGMAX_GROUP];
    int n_kept[ARGMAX_GROUP];
    int32_t *kept[ARGMAX_GROUP];
    double *kept_upper[ARGMAX_GROUP];
    for (int i = 0; i < ni; i++) {
        lower_max[i] = job->lower_max[(size_t)i * ARGMAX_THREADS_MAX * 8 + 8 * (size_t)thread_idx];
        n_kept[i] = job->n_kept[kept_count_at(thread_idx, i)];
        kept[i] = job->kept + kept_list_at(s, thread_idx, i);
        kept_upper[i] = job->kept_upper + kept_list_at(s, thread_idx, i);
    }
    const long r0 = begin * ARGMAX_ROWS_PER_TASK;
    const long r1 = end * ARGMAX_ROWS_PER_TASK < s->rows ? end * ARGMAX_ROWS_PER_TASK : s->rows;
    const long run = (r1 - r0) / ARGMAX_STREAMS;
    for (long x = 0; x < run + (r1 - r0) % ARGMAX_STREAMS; x++) {
        int64_t isum[4][ARGMAX_GROUP];
        long v[4];
        int count = 4;
        unsigned allowed[ARGMAX_GROUP]; /* per input row, a bit per row of the claim */
        if (x < run) {
            for (int j = 0; j < 4; j++)
                v[j] = r0 + j * run + x;
            /* under a grammar most rows are refused: a claim no input row
             * allows is neither read nor scored */
            if (job->masked && !claim_allowed(job, v, 4, ni, allowed))
                continue;
#if defined(__AVX512F__) && defined(__AVX512BW__) || defined(__AVX2__)
            scores_claim(s, job->hq, ni, draft, v, isum);
#else
            scores_plain(s, job->hq, ni, v, 4, isum);
#endif
        } else { /* the rows after the runs, one at a time */
            count = 1;
            v[0] = r0 + ARGMAX_STREAMS * run + (x - run);
            if (job->masked && !claim_allowed(job, v, 1, ni, allowed))
                continue;
            scores_plain(s, job->hq, ni, v, 1, isum);
        }
        /* Input rows are independent (each its own lower bound and list):
         * for each, the claim's rows in order. */
#ifdef __AVX2__
        __m256d scale4 = _mm256_setzero_pd();
        if (count == 4)
            scale4 = _mm256_set_pd(s->scale[v[3]], s->scale[v[2]], s->scale[v[1]], s->scale[v[0]]);
#endif
        for (int i = 0; i < ni; i++) {
            const struct screen_input *si = &job->in[i];
            const int64_t offset = draft ? ARGMAX_DRAFT_OFFSET * si->hq_sum : 0;
            unsigned todo = (1u << count) - 1; /* the rows still to look at, a bit each */
#ifdef __AVX2__
            /* The test below for the four rows at once, in the same
             * operations lane by lane (the same bits): only the rows that
             * pass it are looked at one by one (a row that falls short
             * still does when the lower bound has risen since): few rows
             * pass, so most claims cost one vector test per input row. */
            if (count == 4) {
                const __m256d score = _mm256_set_pd(
                    (double)(isum[3][i] - offset), (double)(isum[2][i] - offset),
                    (double)(isum[1][i] - offset), (double)(isum[0][i] - offset));
                const __m256d approx =
                    _mm256_mul_pd(_mm256_mul_pd(_mm256_set1_pd(si->s_h), scale4), score);
                const __m256d slack = _mm256_mul_pd(
                    _mm256_set1_pd(1e-12), _mm256_andnot_pd(_mm256_set1_pd(-0.0), approx));
                const __m256d upper =
                    _mm256_add_pd(approx, _mm256_add_pd(_mm256_set1_pd(job->eps_max[i]), slack));
                todo = ~(unsigned)_mm256_movemask_pd(
                           _mm256_cmp_pd(upper, _mm256_set1_pd(lower_max[i]), _CMP_LT_OQ)) &
                       0xFu;
            }
#endif
            if (job->masked)
                todo &= allowed[i];
            for (int j = 0; todo; j++, todo >>= 1) {
                if (!(todo & 1u))
                    continue;
                const long r = v[j];
                const int64_t score = isum[j][i] - offset;
                const double approx = si->s_h * (double)s->scale[r] * (double)score;
                /* Most rows fall short even with the largest margin any row
                 * has: they are neither kept nor raise the lower bound, and
                 * the row's own margin (four more loads and a dozen double
                 * operations: in a profile of the small draft's head, more
                 * of the screen's time than its products) is not needed. */
                const double slack = 1e-12 * fabs(approx);
                if (approx + (job->eps_max[i] + slack) < lower_max[i])
                    continue;
                const double eps = screen_margin(s, si, s->n1[r], s->n2[r], s->dq[r]) + slack;
                if (approx - eps > lower_max[i])
                    lower_max[i] = approx - eps;
                if (approx + eps >= lower_max[i]) {
                    kept[i][n_kept[i]] = (int32_t)r;
                    kept_upper[i][n_kept[i]++] = approx + eps;
                }
            }
        }
    }
    for (int i = 0; i < ni; i++) {
        job->lower_max[(size_t)i * ARGMAX_THREADS_MAX * 8 + 8 * (size_t)thread_idx] = lower_max[i];
        job->n_kept[kept_count_at(thread_idx, i)] = n_kept[i];
    }
}

/* screen_claims with the group's row count and the copy's kind constant, so
 * that the scores of a claim stay in registers from the products to the
 * comparison, without a call and a switch per claim of four rows. */
static void screen_task(void *ctx, long begin, long end, int thread_idx)
{
    const struct screen_job *job = ctx;
#if defined(__AVX512F__) && defined(__AVX512BW__)
#define SCREEN_CASE(n)                                                     \
    case n:                                                                \
        if (job->s->draft)                                                 \
            screen_claims(job, begin, end, thread_idx, n, 1);              \
        else                                                               \
            screen_claims(job, begin, end, thread_idx, n, 0);              \
        break
#else /* only AVX-512 builds make a draft's copy */
#define SCREEN_CASE(n)                                                     \
    case n:                                                                \
        screen_claims(job, begin, end, thread_idx, n, 0);                  \
        break
#endif
    switch (job->ni) {
        SCREEN_CASE(1);
        SCREEN_CASE(2);
        SCREEN_CASE(3);
        SCREEN_CASE(4);
        SCREEN_CASE(5);
        SCREEN_CASE(6);
        SCREEN_CASE(7);
    default: /* ARGMAX_GROUP */
        SCREEN_CASE(8);
    }
#undef SCREEN_CASE
}

static int compare_row(const void *a, const void *b)
{
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* The argmax of input row i of the group from the rows the threads kept for
 * it and the best lower bound m: 0 and *idx, 1 where the screen does not
 * serve it (too many candidates, logits near the float range), or an
 * error. */
static int pick_row(struct cpu_backend *cb, const struct cpu_argmax_shadow *s, const float *h,
                    const uint16_t *hb, const struct screen_job *job, int i, double m,
                    int32_t *idx, int *n_candidates, char *err)
{
    struct cpu_argmax *a = cb->argmax;
    /* logits near the float range could round to infinity: not screened */
    if (!(fabs(m) < 1e37))
        return 1;
    const int cap = s->rows / ARGMAX_CANDIDATES_SHARE > ARGMAX_CANDIDATES_MIN
                        ? s->rows / ARGMAX_CANDIDATES_SHARE
                        : ARGMAX_CANDIDATES_MIN;
    int n = 0;
    for (int t = 0; t < cb->n_threads; t++) {
        const size_t list = kept_list_at(s, t, i);
        const int kept = job->n_kept[kept_count_at(t, i)];
        for (int e = 0; e < kept; e++) {
            const double upper = job->kept_upper[list + (size_t)e];
            if (upper >= m) {
                if (n == cap || !(upper < 1e37))
                    return 1;
                a->candidates[n++] = job->kept[list + (size_t)e];
            }
        }
    }
    /* the threads' lists and a claim's runs interleave the rows: in
     * increasing order, the first of equal logits is the lowest index */
    qsort(a->candidates, (size_t)n, sizeof *a->candidates, compare_row);
    int32_t best = -1;
    float best_logit = 0;
    for (int c = 0; c < n; c++) {
        const int32_t v = a->candidates[c];
        const float l = exact_logit(s, v, h, hb, a->logits);
        if (!isfinite(l))
            return 1; /* past the float range: the whole row decides */
        if (best < 0 || l > best_logit) {
            best = v;
            best_logit = l;
        }
    }
    if (best < 0)
        return error_set(err, ERR_INTERNAL, "cpu matmul_argmax: the screen kept no row");
    *idx = best;
    *n_candidates = n;
    return 0;
}

/* Screens input rows rows[0..ni) (indices into in) in one pass over the
 * copy: idx_out and served (candidates, or -1 where the caller must compute
 * the row whole) for each. */
static int screen_group(struct cpu_backend *cb, const struct cpu_argmax_shadow *s, const float *in,
                        const uint16_t *hb, const int *rows, int ni, const struct screen_input *si,
                        const uint64_t *const *allow, int32_t *idx_out, int *served, char *err)
{
    struct cpu_argmax *a = cb->argmax;
    double lower_max[ARGMAX_GROUP * ARGMAX_THREADS_MAX * 8];
    int n_kept[ARGMAX_THREADS_MAX * ARGMAX_GROUP * 16];
    struct screen_job job = {.s = s, .hq = a->hq, .ni = ni, .kept = a->kept,
                             .kept_upper = a->kept_upper, .n_kept = n_kept,
                             .lower_max = lower_max};
    for (int i = 0; i < ni; i++) {
        job.in[i] = si[i];
        job.allow[i] = allow ? allow[rows[i]] : NULL;
        job.masked |= job.allow[i] != NULL;
        job.eps_max[i] = screen_margin(s, &si[i], s->n1_max, s->n2_max, s->dq_max);
        for (int t = 0; t < cb->n_threads; t++) {
            lower_max[(size_t)i * ARGMAX_THREADS_MAX * 8 + 8 * (size_t)t] = -INFINITY;
            n_kept[kept_count_at(t, i)] = 0;
        }
    }
    const long n_tasks = (s->rows + ARGMAX_ROWS_PER_TASK - 1) / ARGMAX_ROWS_PER_TASK;
    cpu_pool_run_guided(cb->pool, n_tasks, 4, screen_task, &job);
    for (int i = 0; i < ni; i++) {
        double m = -INFINITY;
        for (int t = 0; t < cb->n_threads; t++)
            m = fmax(m, lower_max[(size_t)i * ARGMAX_THREADS_MAX * 8 + 8 * (size_t)t]);
        const float *h = in + (size_t)rows[i] * (size_t)s->cols;
        int n_candidates = 0;
        const uint16_t *hbi = hb ? hb + (size_t)rows[i] * (size_t)bd_padded(s->cols) : NULL;
        const int rc = pick_row(cb, s, h, hbi, &job, i, m, &idx_out[rows[i]], &n_candidates, err);
        if (rc < 0)
            return rc;
        served[rows[i]] = rc == 0 ? n_candidates : -1;
    }
    return 0;
}

/* argmax_f32 (base/argmax.h) among the indices allow admits (all when
 * NULL): the lowest index of the largest value, NaN skipped, -1 for none. */
static int32_t argmax_allowed(const float *row, int n, const uint64_t *allow)
{
    if (!allow)
        return argmax_f32(row, n);
    int32_t best = -1;
    for (int v = 0; v < n; v++)
        if (row_allowed(allow, v) && row[v] == row[v] && (best < 0 || row[v] > row[best]))
            best = v;
    return best;
}

int cpu_matmul_argmax(struct kern_backend *be, int32_t *idx_out, const float *in, const void *w,
                      enum kern_dtype dtype, int n, int d_in, int d_out,
                      const uint64_t *const *allow, char *err)
{
    struct cpu_backend *cb = cpu_backend_of(be);
    if (n < 0 || d_in < 0 || d_out < 1)
        return error_set(err, ERR_INVALID_ARG,
                         "cpu matmul_argmax: bad shape n=%d d_in=%d d_out=%d (d_out >= 1)", n,
                         d_in, d_out);
    if (n == 0)
        return 0;
    if (!idx_out || !in || !w)
        return error_set(err, ERR_INVALID_ARG, "cpu matmul_argmax: NULL argument");
    struct cpu_argmax *a = cpu_argmax_state(cb, err);
    if (!a)
        return ERR_NOMEM;
    const struct cpu_argmax_shadow *s = cpu_argmax_shadow_find(cb, w);
    if (s && (s->rows != d_out || s->cols != d_in || s->dtype != dtype))
        s = NULL; /* prepared for another shape: the whole product serves */
    a->last_candidates = -1;
    int served[ARGMAX_SCREEN_ROWS_MAX];
    int rc = 0;
    if (s && n <= ARGMAX_SCREEN_ROWS_MAX && cb->n_threads <= ARGMAX_THREADS_MAX) {
        if ((rc = grow_buffer((void **)&a->hq, &a->hq_cap, (size_t)ARGMAX_GROUP * s->cols_pad,
                              sizeof *a->hq, err)) ||
            (rc = grow_buffer((void **)&a->kept, &a->kept_cap,
                              (size_t)cb->n_threads * ARGMAX_GROUP * s->rows, sizeof *a->kept,
                              err)) ||
            (rc = grow_buffer((void **)&a->kept_upper, &a->kept_upper_cap,
                              (size_t)cb->n_threads * ARGMAX_GROUP * s->rows,
                              sizeof *a->kept_upper, err)) ||
            (rc = grow_buffer((void **)&a->candidates, &a->candidates_cap, (size_t)s->rows,
                              sizeof *a->candidates, err)) ||
            (rc = grow_buffer((void **)&a->logits, &a->logits_cap, (size_t)s->cols, sizeof(float),
                              err)))
            return rc;
        /* A bf16 head on vdpbf16ps computes its logits from the input
         * rounded to bf16: the screen bounds them from that input. */
        const uint16_t *hb = NULL;
        if (cpu_backend_on_bd(cb, dtype, s->layout)) {
            const int dp = bd_padded(d_in);
            if ((rc = grow_buffer((void **)&a->hb, &a->hb_cap, (size_t)n * (size_t)dp,
                                  sizeof *a->hb, err)) ||
                (rc = grow_buffer((void **)&a->hround, &a->hround_cap, (size_t)n * (size_t)d_in,
                                  sizeof *a->hround, err)))
                return rc;
            bd_round_rows_avx512bf16(in, d_in, a->hb, dp, 0, n);
            for (int i = 0; i < n; i++)
                for (int k = 0; k < d_in; k++)
                    a->hround[(size_t)i * (size_t)d_in + (size_t)k] =
                        cpu_simd_bf16_to_f32(a->hb[(size_t)i * (size_t)dp + (size_t)k]);
            hb = a->hb;
        }
        const float *hin = hb ? a->hround : in;
        /* groups of up to ARGMAX_GROUP rows the screen can read, one pass each */
        int group[ARGMAX_GROUP], ni = 0;
        struct screen_input si[ARGMAX_GROUP];
        for (int i = 0; i < n; i++) {
            served[i] = -1;
            if (quantize_input(s, hin + (size_t)i * (size_t)d_in, a->hq + (size_t)ni * s->cols_pad,
                               &si[ni]) == 0)
                group[ni++] = i;
            if (ni == ARGMAX_GROUP || (i == n - 1 && ni > 0)) {
                if ((rc = screen_group(cb, s, hin, hb, group, ni, si, allow, idx_out, served, err)))
                    return rc;
                ni = 0;
            }
        }
        /* what the screen did not serve, row by row, whole */
        for (int i = 0; i < n; i++) {
            if (served[i] >= 0)
                continue;
            if ((rc = grow_buffer((void **)&a->logits, &a->logits_cap, (size_t)d_out,
                                  sizeof(float), err)) ||
                (rc = cpu_matmul(be, a->logits, in + (size_t)i * (size_t)d_in, w, dtype, 1, d_in,
                                 d_out, err)))
                return rc;
            idx_out[i] = argmax_allowed(a->logits, d_out, allow ? allow[i] : NULL);
        }
        a->last_candidates = served[n - 1];
        return 0;
    }
    /* Past ARGMAX_SCREEN_ROWS_MAX rows one product over the bf16 head costs
     * less than a pass over the copy per ARGMAX_GROUP rows. */
    if ((rc = grow_buffer((void **)&a->logits, &a->logits_cap, (size_t)n * (size_t)d_out,
                          sizeof(float), err)) ||
        (rc = cpu_matmul(be, a->logits, in, w, dtype, n, d_in, d_out, err)))
        return rc;
    for (int i = 0; i < n; i++)
        idx_out[i] = argmax_allowed(a->logits + (size_t)i * (size_t)d_out, d_out,
                                    allow ? allow[i] : NULL);
    return 0;
}

int cpu_argmax_last_candidates(const struct cpu_backend *cb)
{
    return cb->argmax ? cb->argmax->last_candidates : -1;
}
