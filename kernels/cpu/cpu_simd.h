/* cpu_simd.h: dtype conversion and fixed-order reductions shared by the CPU
 * kernels (private to kernels/cpu; static inline only).
 *
 * The fixed reduction order. Every length-`len` f32 reduction in the CPU
 * backend (dot products, sums of squares) is computed the same way:
 *   1. eight lane accumulators; lane j accumulates the terms k = j, j+8, ...
 *      for k < len8 = len & ~7, in increasing k, each step one fused
 *      multiply-add (or add);
 *   2. the lanes are folded in a fixed tree: (l0+l4, l1+l5, l2+l6, l3+l7),
 *      then (a0+a2, a1+a3), then b0+b1;
 *   3. the tail k = len8 .. len-1 is added one term at a time, in order.
 * The order depends on `len` alone, never on how many rows an op processes or
 * on which thread runs it. (Not here: bf16 matmuls on vdpbf16ps, which take
 * bf16 activations in their own fixed order, bfdot.h.) With AVX2 the lanes are one __m256; without it they
 * are emulated with fmaf on a float[8], which gives the same bits.
 *
 * Conversions: bf16 -> f32 is the 16-bit pattern shifted left by 16; f16 ->
 * f32 is exact (F16C when available). Both are exact, so converting weights to
 * f32 ahead of a reduction never changes a result.
 */
#ifndef TANDEM_KERNELS_CPU_SIMD_H
#define TANDEM_KERNELS_CPU_SIMD_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __AVX2__
#include <immintrin.h>
#endif

#define CPU_SIMD_INLINE static inline __attribute__((always_inline))

CPU_SIMD_INLINE float cpu_simd_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof(f));
    return f;
}

CPU_SIMD_INLINE float cpu_simd_f16_to_f32(uint16_t h)
{
#ifdef __F16C__
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0x1fu) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (mant << 13);
    } else if (mant == 0) {
        bits = sign;
    } else { /* subnormal: normalise */
        int e = -1;
        do {
            e++;
            mant <<= 1;
        } while ((mant & 0x400u) == 0);
        bits = sign | ((uint32_t)(112 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof(f));
    return f;
#endif
}

#ifdef __AVX2__
CPU_SIMD_INLINE __m256 cpu_simd_load8_bf16(const uint16_t *p)
{
    /* The 8 values into both 128-bit halves (a broadcast load), then one
     * byte shuffle puts each in the high half of its lane's dword with the
     * low half zeroed: the same f32 in the same lane as zero-extending and
     * shifting, with one shuffle-port instruction per 8 weights instead of
     * two. Where the FMAs nearly cover the read (5 input rows) those ports
     * are what the tiles wait on: in a stand-alone copy of the AVX2 2 x 5
     * tile (2 threads, cold weights, Llama-1B shapes, the two loads
     * alternating in one process) 5 rows took 1-6% less time at every shape
     * in 2 runs; 6 rows were within 4% either way, one row within noise. */
    const __m256i to_high =
        _mm256_setr_epi8(-1, -1, 0, 1, -1, -1, 2, 3, -1, -1, 4, 5, -1, -1, 6, 7, /* low half */
                         -1, -1, 8, 9, -1, -1, 10, 11, -1, -1, 12, 13, -1, -1, 14, 15);
    const __m256i both =
        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)p));
    return _mm256_castsi256_ps(_mm256_shuffle_epi8(both, to_high));
}

CPU_SIMD_INLINE __m256 cpu_simd_load8_f16(const uint16_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p));
}

/* Step 2 of the fixed order: fold 8 lanes. */
CPU_SIMD_INLINE float cpu_simd_hsum8(__m256 v)
{
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    __m128 b = _mm_add_ps(a, _mm_movehl_ps(a, a));
    __m128 c = _mm_add_ss(b, _mm_movehdup_ps(b));
    return _mm_cvtss_f32(c);
}
#endif

/* Lane emulation of cpu_simd_hsum8 for the scalar path. */
CPU_SIMD_INLINE float cpu_simd_hsum8_scalar(const float l[8])
{
    float a0 = l[0] + l[4], a1 = l[1] + l[5], a2 = l[2] + l[6], a3 = l[3] + l[7];
    float b0 = a0 + a2, b1 = a1 + a3;
    return b0 + b1;
}

/* The exponential of the CPU backend's softmax (attention), for x <= 0:
 *   x < -87 (e^x below 1.7e-38, next to nothing beside the largest term's 1):
 *   0; x > 0 is taken as 0; NaN stays NaN. Otherwise, with fused
 *   multiply-adds (one rounding each) and plain float operations:
 *     n = (fma(x, LOG2E, 1.5 * 2^23) - 1.5 * 2^23)   x / ln 2 to the nearest integer
 *     r = fma(n, -LN2_LO, fma(n, -LN2_HI, x))        x - n ln 2, |r| <= 0.35
 *     p = Horner of the Taylor series of e^r to r^7, fma at each step
 *     e^x = p * 2^n                                  (2^n built from its bits)
 * within 2 ulp of e^x. Every step is an IEEE operation, so the scalar and the
 * vector forms give the same bits: 8 lanes take 8 exponentials at the cost
 * of about one libm expf call. */
#define CPU_SIMD_EXP_MIN (-87.0f)
#define CPU_SIMD_EXP_LOG2E 1.44269504088896341f
#define CPU_SIMD_EXP_SHIFT 12582912.0f /* 1.5 * 2^23 */
#define CPU_SIMD_EXP_LN2_HI 0.693145751953125f /* ln 2 to 16 bits: n * LN2_HI is exact */
#define CPU_SIMD_EXP_LN2_LO 1.42860682030941723212e-6f

CPU_SIMD_INLINE float cpu_simd_exp_scalar(float x)
{
    if (x != x)
        return x;
    if (x < CPU_SIMD_EXP_MIN)
        return 0.0f;
    const float xc = x < 0.0f ? x : 0.0f; /* as _mm256_min_ps(x, 0) */
    const float n = fmaf(xc, CPU_SIMD_EXP_LOG2E, CPU_SIMD_EXP_SHIFT) - CPU_SIMD_EXP_SHIFT;
    const float r = fmaf(n, -CPU_SIMD_EXP_LN2_LO, fmaf(n, -CPU_SIMD_EXP_LN2_HI, xc));
    float p = 1.0f / 5040.0f;
    p = fmaf(p, r, 1.0f / 720.0f);
    p = fmaf(p, r, 1.0f / 120.0f);
    p = fmaf(p, r, 1.0f / 24.0f);
    p = fmaf(p, r, 1.0f / 6.0f);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    const uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float two_n;
    memcpy(&two_n, &bits, sizeof two_n);
    return p * two_n;
}

#ifdef __AVX2__
/* cpu_simd_exp_scalar on 8 lanes, bit for bit. */
CPU_SIMD_INLINE __m256 cpu_simd_exp8(__m256 x)
{
    const __m256 lowest = _mm256_set1_ps(CPU_SIMD_EXP_MIN);
    /* clamped into the range the steps below are exact for; the lanes
     * outside it are replaced at the end */
    const __m256 xc = _mm256_max_ps(_mm256_min_ps(x, _mm256_setzero_ps()), lowest);
    const __m256 shift = _mm256_set1_ps(CPU_SIMD_EXP_SHIFT);
    const __m256 n =
        _mm256_sub_ps(_mm256_fmadd_ps(xc, _mm256_set1_ps(CPU_SIMD_EXP_LOG2E), shift), shift);
    const __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-CPU_SIMD_EXP_LN2_LO),
                                     _mm256_fmadd_ps(n, _mm256_set1_ps(-CPU_SIMD_EXP_LN2_HI), xc));
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i bits = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
    y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, lowest, _CMP_LT_OQ));
    return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}
#endif

/* Fixed-order dot product of two f32 vectors. */
CPU_SIMD_INLINE float cpu_simd_dot_f32(const float *a, const float *b, int len)
{
    const int len8 = len & ~7;
    float s;
#ifdef __AVX2__
    __m256 acc = _mm256_setzero_ps();
    for (int k = 0; k < len8; k += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k), acc);
    s = cpu_simd_hsum8(acc);
#else
    float l[8] = {0};
    for (int k = 0; k < len8; k += 8)
        for (int j = 0; j < 8; j++)
            l[j] = fmaf(a[k + j], b[k + j], l[j]);
    s = cpu_simd_hsum8_scalar(l);
#endif
    for (int k = len8; k < len; k++)
        s = fmaf(a[k], b[k], s);
    return s;
}

#endif
