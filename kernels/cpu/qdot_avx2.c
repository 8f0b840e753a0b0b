/* qdot_avx2.c: the int8/int4 product's tiles (qdot_tiles.h) without VNNI:
 * each unsigned-by-signed byte dot of 4 is two vpmaddwd on the bytes
 * widened to 16 bits (even and odd bytes apart), which sum pairs of
 * products into 32 bits exactly. Not vpmaddubsw: it saturates its 16-bit
 * sums (255 * 127 * 2 > 32767), and a saturated sum would differ from the
 * reference. Half a panel line per vector; target attribute as in
 * qdot_avx512vnni.c. */
#include "qdot.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#include <string.h>

#define QD_TGT __attribute__((target("avx2,fma")))

QD_TGT static inline __attribute__((always_inline)) __m256i qd_dp_avx2(__m256i acc, __m256i u, __m256i s)
{
    const __m256i ue = _mm256_and_si256(u, _mm256_set1_epi16(0xff)), uo = _mm256_srli_epi16(u, 8);
    const __m256i se = _mm256_srai_epi16(_mm256_slli_epi16(s, 8), 8), so = _mm256_srai_epi16(s, 8);
    return _mm256_add_epi32(acc, _mm256_add_epi32(_mm256_madd_epi16(ue, se), _mm256_madd_epi16(uo, so)));
}

#define QD_FN(name) name##_avx2
#define QD_VB 32
#define QD_TMAX 2
#define QD_R 3
#define QD_PAIR 1
#define QD_WIDE_MAX 0
typedef __m256i qd_vi;
typedef __m256 qd_vf;
#define QD_LOADI(p) _mm256_loadu_si256((const __m256i *)(const void *)(p))
#define QD_SET1I(x) _mm256_set1_epi32(x)
#define QD_DP(acc, u, s) qd_dp_avx2((acc), (u), (s))
#define QD_ANDI(a, b) _mm256_and_si256((a), (b))
#define QD_SRLI16(a, n) _mm256_srli_epi16((a), (n))
#define QD_CVT(v) _mm256_cvtepi32_ps(v)
#define QD_ZEROF() _mm256_setzero_ps()
#define QD_SET1F(x) _mm256_set1_ps(x)
#define QD_LOADF(p) _mm256_loadu_ps(p)
#define QD_MULF(a, b) _mm256_mul_ps((a), (b))
#define QD_FMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define QD_STOREF(p, v) _mm256_storeu_ps((p), (v))

#include "qdot_tiles.h"
#endif
