/* matmul_panel.c: cpu_matmul's panel path (AVX-512F+BW, weights not
 * packed; prefill, n > MM_PAIRED_MAX: see mm_use_panel in matmul.c, which
 * also holds the contract; up to MM_PANEL_MAX input rows per job, more rows
 * run as several jobs).
 *
 * A task is a panel of up to MM_PR output rows, swept in
 * k-blocks of job->pkb columns; within a k-block, three weight rows at a time
 * are applied to all n input rows with register tiles of 3 weight rows x up
 * to 4 input rows (12 accumulators, 3 weight vectors and 1 input vector in
 * registers: 7 loads per 12 FMAs). The first tile of a row triple reads the
 * bf16/f16 weights and widens them (exact) into L1-resident scratch, where
 * the tiles for the other input rows find them: each weight is converted once
 * per call instead of once per group of input rows. Accumulators are parked
 * in scratch between k-blocks, bit for bit, so k-blocking changes no result.
 * The input rows are packed once per call, k-block by k-block, so that a
 * k-block of all of them is one contiguous piece of L1 (rows d_in apart, a
 * power of two, would fall into the same L1 sets).
 */
#include <math.h>
#include <string.h>

#include "matmul_internal.h"

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define MM_PXP_BYTES 16384 /* L1 for a k-block of the packed input rows */

/* acc[b * ldacc + a] += w row a . x row b over k in [0, len), len % 8 == 0,
 * for a < ro, b < ri; w (dtype dt, row stride ldw elements) and x at the
 * k-block's first column. With `store` the widened weights are also stored
 * to wdst (row stride ldd), for the next input rows to reuse. */
CPU_SIMD_INLINE void mm_ptile(enum kern_dtype dt, int store, int ro, int ri, const void *w,
                              size_t ldw, float *wdst, size_t ldd, const float *x, size_t ldx,
                              int len, __m256 *acc, size_t ldacc)
{
    __m256 r[3][4];
#pragma GCC unroll 3
    for (int a = 0; a < ro; a++)
#pragma GCC unroll 4
        for (int b = 0; b < ri; b++)
            r[a][b] = _mm256_load_ps((const float *)&acc[(size_t)b * ldacc + (size_t)a]);
    for (int k = 0; k < len; k += 8) {
        /* The empty asm statements keep each loaded vector in a register:
         * folded into the FMAs that use it, one load would become ro or ri
         * loads, and loads, not FMAs, would set the pace. */
        __m256 wv[3];
#pragma GCC unroll 3
        for (int a = 0; a < ro; a++) {
            wv[a] = mm_load8(dt, w, (size_t)a * ldw + (size_t)k);
            __asm__("" : "+x"(wv[a]));
            if (store)
                _mm256_store_ps(wdst + (size_t)a * ldd + (size_t)k, wv[a]);
        }
#pragma GCC unroll 4
        for (int b = 0; b < ri; b++) {
            __m256 xv = _mm256_load_ps(x + (size_t)b * ldx + (size_t)k);
            __asm__("" : "+x"(xv));
#pragma GCC unroll 3
            for (int a = 0; a < ro; a++)
                r[a][b] = _mm256_fmadd_ps(wv[a], xv, r[a][b]);
        }
    }
#pragma GCC unroll 3
    for (int a = 0; a < ro; a++)
#pragma GCC unroll 4
        for (int b = 0; b < ri; b++)
            _mm256_store_ps((float *)&acc[(size_t)b * ldacc + (size_t)a], r[a][b]);
}

typedef void (*mm_ptile_fn)(const void *w, size_t ldw, float *wdst, size_t ldd, const float *x,
                            size_t ldx, int len, __m256 *acc, size_t ldacc);

#define MM_DEFINE_PTILE(name, dt, store, ro, ri)                                            \
    static void mm_ptile_##name##_##ro##x##ri(const void *w, size_t ldw, float *wdst,         \
                                              size_t ldd, const float *x, size_t ldx,        \
                                              int len, __m256 *acc, size_t ldacc)            \
    {                                                                                        \
        mm_ptile(dt, store, ro, ri, w, ldw, wdst, ldd, x, ldx, len, acc, ldacc);             \
    }
#define MM_DEFINE_PTILES(name, dt, store)                                                    \
    MM_DEFINE_PTILE(name, dt, store, 3, 4)                                                   \
    MM_DEFINE_PTILE(name, dt, store, 3, 3)                                                   \
    MM_DEFINE_PTILE(name, dt, store, 3, 2)                                                   \
    MM_DEFINE_PTILE(name, dt, store, 3, 1)                                                   \
    MM_DEFINE_PTILE(name, dt, store, 1, 4)                                                   \
    MM_DEFINE_PTILE(name, dt, store, 1, 3)                                                   \
    MM_DEFINE_PTILE(name, dt, store, 1, 2)                                                   \
    MM_DEFINE_PTILE(name, dt, store, 1, 1)
MM_DEFINE_PTILES(bf16, KERN_DTYPE_BF16, 0)
MM_DEFINE_PTILES(bf16_st, KERN_DTYPE_BF16, 1)
MM_DEFINE_PTILES(f16, KERN_DTYPE_F16, 0)
MM_DEFINE_PTILES(f16_st, KERN_DTYPE_F16, 1)
MM_DEFINE_PTILES(f32, KERN_DTYPE_F32, 0)

/* mm_ptiles[dtype][store][ro == 3][ri - 1]; f32 weights are never stored. */
#define MM_PTILE_ROW(name)                                                                   \
    {{mm_ptile_##name##_1x1, mm_ptile_##name##_1x2, mm_ptile_##name##_1x3,                   \
      mm_ptile_##name##_1x4},                                                                \
     {mm_ptile_##name##_3x1, mm_ptile_##name##_3x2, mm_ptile_##name##_3x3,                   \
      mm_ptile_##name##_3x4}}
static const mm_ptile_fn mm_ptiles[3][2][2][4] = {
    [KERN_DTYPE_BF16] = {MM_PTILE_ROW(bf16), MM_PTILE_ROW(bf16_st)},
    [KERN_DTYPE_F16] = {MM_PTILE_ROW(f16), MM_PTILE_ROW(f16_st)},
    [KERN_DTYPE_F32] = {MM_PTILE_ROW(f32), MM_PTILE_ROW(f32)},
};

/* k-block length for n input rows: the packed k-block of all of them takes
 * about MM_PXP_BYTES of L1 (longer blocks park the accumulators less often). */
int mm_panel_kb(int n)
{
    int kb = (int)(MM_PXP_BYTES / sizeof(float)) / n & ~63;
    return kb < 128 ? 128 : kb > 2048 ? 2048 : kb;
}

/* Packs the input's first len8 columns k-block by k-block:
 * xp[kb][i][0 .. pkb) = in[i][kb * pkb ...]. */
void mm_pack_inputs(const float *in, int n, int d_in, int pkb, float *xp)
{
    const int len8 = d_in & ~7;
    for (int k0 = 0; k0 < len8; k0 += pkb) {
        const int len = len8 - k0 < pkb ? len8 - k0 : pkb;
        for (int i = 0; i < n; i++)
            memcpy(xp + ((size_t)k0 * (size_t)n + (size_t)i * (size_t)pkb),
                   in + (size_t)i * (size_t)d_in + (size_t)k0, (size_t)len * sizeof(float));
    }
}

/* Output rows o0 .. o0+rows-1 (rows <= MM_PR) for all n input rows.
 * wf: [3][pkb + 16] floats of scratch; acc: [n][MM_PR] vectors of scratch. */
static void mm_panel(const struct mm_job *job, int o0, int rows, float *wf, __m256 *acc)
{
    const enum kern_dtype dt = job->dtype;
    const int n = job->n, d_in = job->d_in, len8 = d_in & ~7, pkb = job->pkb;
    const size_t ld = (size_t)d_in, d_out = (size_t)job->d_out, ldd = (size_t)pkb + 16;
    const size_t esize = kern_dtype_size(dt);
    const char *w = (const char *)job->w + (size_t)o0 * ld * esize;
    const int n_groups = (n + 3) / 4; /* of input rows, sizes as even as can be */
    const int store = n_groups > 1 && dt != KERN_DTYPE_F32;
    for (int j = 0; j < n * MM_PR; j++)
        acc[j] = _mm256_setzero_ps();
    for (int k0 = 0; k0 < len8; k0 += pkb) {
        const int len = len8 - k0 < pkb ? len8 - k0 : pkb;
        const float *xk = job->xp + (size_t)k0 * (size_t)n;
        for (int a = 0; a < rows;) {
            const int ro = rows - a >= 3 ? 3 : 1;
            /* The first group of input rows reads the weights themselves and
             * leaves them widened in wf for the other groups. */
            const void *ws = w + ((size_t)a * ld + (size_t)k0) * esize;
            size_t ldw = ld;
            const mm_ptile_fn *tiles = mm_ptiles[dt][store][ro == 3];
            for (int g = 0, i = 0; g < n_groups; g++) {
                const int ri = n / n_groups + (g < n % n_groups);
                tiles[ri - 1](ws, ldw, wf, ldd, xk + (size_t)i * (size_t)pkb, (size_t)pkb, len,
                              acc + (size_t)i * MM_PR + (size_t)a, MM_PR);
                if (store) {
                    ws = wf;
                    ldw = ldd;
                    tiles = mm_ptiles[KERN_DTYPE_F32][0][ro == 3];
                }
                i += ri;
            }
            a += ro;
        }
    }
    for (int i = 0; i < n; i++) {
        const float *xr = job->in + (size_t)i * ld;
        float *y = job->out + (size_t)i * d_out + (size_t)o0;
        for (int a = 0; a < rows; a++) {
            float sum = cpu_simd_hsum8(acc[(size_t)i * MM_PR + (size_t)a]);
            for (int k = len8; k < d_in; k++)
                sum = fmaf(mm_load1(dt, w, (size_t)a * ld + (size_t)k), xr[k], sum);
            y[a] = sum;
        }
    }
}

/* Scratch of the panel path, per thread: [n][MM_PR] accumulator vectors,
 * then [3][pkb + 16] widened weights; thread 0's scratch continues with the
 * packed inputs that all threads read, mm_panel_xp_floats() floats. */
size_t mm_panel_private_bytes(int n, int pkb)
{
    return (size_t)n * MM_PR * sizeof(__m256) + (size_t)3 * ((size_t)pkb + 16) * sizeof(float);
}

size_t mm_panel_xp_floats(int n, int d_in, int pkb)
{
    return (size_t)n * (size_t)(((d_in & ~7) + pkb - 1) / pkb * pkb);
}

/* Tasks of the panel path: panels of MM_PR output rows. */
void mm_task_panel(void *ctx, long begin, long end, int thread_idx)
{
    const struct mm_job *job = ctx;
    __m256 *acc = (__m256 *)(void *)job->scratch[thread_idx];
    float *wf = (float *)(void *)(acc + (size_t)job->n * MM_PR);
    for (long blk = begin; blk < end; blk++) {
        const int o0 = (int)(blk * MM_PR);
        const int rows = job->d_out - o0 < MM_PR ? job->d_out - o0 : MM_PR;
        mm_panel(job, o0, rows, wf, acc);
    }
}
#endif
