/* qdot_avxvnni.c: the int8/int4 product's tiles (qdot_tiles.h) on 256-bit
 * vpdpbusd (AVX-VNNI), for CPUs that have it without AVX-512 VNNI. Half a
 * panel line per vector (8 output rows); target attribute as in
 * qdot_avx512vnni.c. */
#include "qdot.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#include <string.h>

#define QD_FN(name) name##_avxvnni
#define QD_TGT __attribute__((target("avx2,fma,avxvnni")))
#define QD_VB 32
#define QD_TMAX 2
#define QD_R 3
#define QD_PAIR 1
#define QD_WIDE_MAX 0
typedef __m256i qd_vi;
typedef __m256 qd_vf;
#define QD_LOADI(p) _mm256_loadu_si256((const __m256i *)(const void *)(p))
#define QD_SET1I(x) _mm256_set1_epi32(x)
#define QD_DP(acc, u, s) _mm256_dpbusd_avx_epi32((acc), (u), (s))
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
