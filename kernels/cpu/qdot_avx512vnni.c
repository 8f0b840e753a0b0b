/* qdot_avx512vnni.c: the int8/int4 product's tiles (qdot_tiles.h) on
 * 512-bit vpdpbusd (AVX-512 VNNI). Built in every x86-64 build with a
 * target attribute, so a portable (AVX2) build still runs them where
 * qd_isa_supported finds the instructions: one line of a panel is one
 * vector, 16 output rows. */
#include "qdot.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#include <string.h>

#define QD_FN(name) name##_avx512vnni
#define QD_TGT __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vnni")))
#define QD_VB 64
#define QD_TMAX 4
#define QD_R QD_RMAX
#define QD_PAIR 2
#define QD_WIDE_MAX QD_WIDE_ROWS
typedef __m512i qd_vi;
typedef __m512 qd_vf;
#define QD_LOADI(p) _mm512_loadu_si512((const void *)(p))
#define QD_SET1I(x) _mm512_set1_epi32(x)
#define QD_DP(acc, u, s) _mm512_dpbusd_epi32((acc), (u), (s))
#define QD_ANDI(a, b) _mm512_and_si512((a), (b))
#define QD_SRLI16(a, n) _mm512_srli_epi16((a), (n))
#define QD_CVT(v) _mm512_cvtepi32_ps(v)
#define QD_ZEROF() _mm512_setzero_ps()
#define QD_SET1F(x) _mm512_set1_ps(x)
#define QD_LOADF(p) _mm512_loadu_ps(p)
#define QD_MULF(a, b) _mm512_mul_ps((a), (b))
#define QD_FMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define QD_STOREF(p, v) _mm512_storeu_ps((p), (v))

#include "qdot_tiles.h"
#endif
