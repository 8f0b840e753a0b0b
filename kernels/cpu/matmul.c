/* matmul.c: cpu_matmul, out[i][o] = sum_k in[i][k] * w[o][k] (f32 accumulate).
 *
 * Reduction order: every output element is one dot product of length d_in in
 * the fixed order of cpu_simd.h (8 lanes over k in steps of 8 with FMA, fixed
 * lane fold, scalar FMA tail). Each element has its own accumulator in every
 * tile shape below and the same sequence of operations, so out[i][o] does not
 * depend on n, on the tile that computed it, nor on the thread. Never split the
 * reduction (no split-K): that is what would make results depend on shapes.
 *
 * Work split: tasks are blocks of MM_RO output rows (d_out), claimed by the
 * pool's threads; the input rows and the reduction are never split. For each
 * block the weight rows come from memory once and are applied to all n input
 * rows. n <= MM_DIRECT_MAX (decode, verification: bound by weight bandwidth)
 * reads the bf16/f16/f32 weights directly in MM_RO x {3,2,1} tiles, later
 * tiles finding the block in L1/L2. Larger n (prefill: compute bound) widens
 * the block to f32 in per-thread scratch (exact) and sweeps the input rows in
 * k-blocks that stay in L1; the accumulators are parked in scratch between
 * k-blocks, which changes no bit of the per-element order.
 */
#include <math.h>
#include <string.h>

#include "cpu_backend.h"
#include "cpu_simd.h"
#include "error.h"

#define MM_RO 4 /* output rows per tile */
#define MM_RI 3 /* max input rows per tile (direct path) */
#ifndef MM_DIRECT_MAX
#define MM_DIRECT_MAX MM_PANEL_MAX /* TEMP */
#endif
#define MM_IB 16 /* input rows per i-block (batched path) */
#define MM_PANEL_MIN 2  /* n from this ... */
#define MM_PANEL_MAX 24 /* ... to this takes the panel path (AVX2 only) */
#ifndef MM_PR
#define MM_PR 12 /* output rows per panel */
#endif
#ifndef MM_PKB
#define MM_PKB 128 /* k per block in the panel path */
#endif
#ifndef MM_PF_ON
#define MM_PF_ON 1
#endif
#ifndef MM_PF_HINT
#define MM_PF_HINT _MM_HINT_T0
#endif
#define MM_PLD (MM_PKB + 16) /* row stride of a widened panel block (floats) */

struct mm_job {
    float *out;       /* [n, d_out] */
    const float *in;  /* [n, d_in] */
    const void *w;    /* [d_out, d_in] dtype */
    enum kern_dtype dtype;
    int n, d_in, d_out;
    float **scratch;  /* per thread: see mm_scratch_acc_offset, mm_panel_scratch_bytes */
    int panel;        /* 1: the panel path (tasks of MM_PR rows), else MM_RO rows */
    const float *xp;  /* panel path: the packed inputs (mm_pack_inputs) */
};

CPU_SIMD_INLINE float mm_load1(enum kern_dtype dt, const void *w, size_t idx)
{
    switch (dt) {
    case KERN_DTYPE_BF16: return cpu_simd_bf16_to_f32(((const uint16_t *)w)[idx]);
    case KERN_DTYPE_F16: return cpu_simd_f16_to_f32(((const uint16_t *)w)[idx]);
    case KERN_DTYPE_F32: break;
    }
    return ((const float *)w)[idx];
}

#ifdef __AVX2__
CPU_SIMD_INLINE __m256 mm_load8(enum kern_dtype dt, const void *w, size_t idx)
{
    switch (dt) {
    case KERN_DTYPE_BF16: return cpu_simd_load8_bf16((const uint16_t *)w + idx);
    case KERN_DTYPE_F16: return cpu_simd_load8_f16((const uint16_t *)w + idx);
    case KERN_DTYPE_F32: break;
    }
    return _mm256_loadu_ps((const float *)w + idx);
}
#endif

/* One tile: out[b*ldo + a] = dot(w row a, x row b) for a < ro, b < ri.
 * ro, ri and dt are compile-time constants at every call site. */
CPU_SIMD_INLINE void mm_tile(enum kern_dtype dt, int ro, int ri, const void *w, size_t ldw,
                             const float *x, size_t ldx, int d_in, float *out, size_t ldo)
{
    const int len8 = d_in & ~7;
    float sums[MM_RO][MM_RI];
#ifdef __AVX2__
    __m256 acc[MM_RO][MM_RI];
#pragma GCC unroll 4
    for (int a = 0; a < ro; a++)
#pragma GCC unroll 3
        for (int b = 0; b < ri; b++)
            acc[a][b] = _mm256_setzero_ps();
    for (int k = 0; k < len8; k += 8) {
        __m256 xv[MM_RI];
#pragma GCC unroll 3
        for (int b = 0; b < ri; b++)
            xv[b] = _mm256_loadu_ps(x + (size_t)b * ldx + k);
#pragma GCC unroll 4
        for (int a = 0; a < ro; a++) {
            __m256 wv = mm_load8(dt, w, (size_t)a * ldw + (size_t)k);
#pragma GCC unroll 3
            for (int b = 0; b < ri; b++)
                acc[a][b] = _mm256_fmadd_ps(wv, xv[b], acc[a][b]);
        }
    }
#pragma GCC unroll 4
    for (int a = 0; a < ro; a++)
#pragma GCC unroll 3
        for (int b = 0; b < ri; b++)
            sums[a][b] = cpu_simd_hsum8(acc[a][b]);
#else
    for (int a = 0; a < ro; a++)
        for (int b = 0; b < ri; b++) {
            float l[8] = {0};
            const float *xr = x + (size_t)b * ldx;
            for (int k = 0; k < len8; k += 8)
                for (int j = 0; j < 8; j++)
                    l[j] = fmaf(mm_load1(dt, w, (size_t)a * ldw + (size_t)(k + j)), xr[k + j], l[j]);
            sums[a][b] = cpu_simd_hsum8_scalar(l);
        }
#endif
    for (int a = 0; a < ro; a++)
        for (int b = 0; b < ri; b++) {
            float s = sums[a][b];
            for (int k = len8; k < d_in; k++)
                s = fmaf(mm_load1(dt, w, (size_t)a * ldw + (size_t)k), x[(size_t)b * ldx + k], s);
            out[(size_t)b * ldo + a] = s;
        }
}

typedef void (*mm_tile_fn)(const void *w, size_t ldw, const float *x, size_t ldx, int d_in,
                           float *out, size_t ldo);

#define MM_DEFINE_TILE(name, dt, ro, ri)                                                   \
    static void name(const void *w, size_t ldw, const float *x, size_t ldx, int d_in,      \
                     float *out, size_t ldo)                                               \
    {                                                                                      \
        mm_tile(dt, ro, ri, w, ldw, x, ldx, d_in, out, ldo);                               \
    }

#define MM_DEFINE_TILES(dtname, dt)                                                        \
    MM_DEFINE_TILE(mm_tile_##dtname##_4x3, dt, 4, 3)                                       \
    MM_DEFINE_TILE(mm_tile_##dtname##_4x2, dt, 4, 2)                                       \
    MM_DEFINE_TILE(mm_tile_##dtname##_4x1, dt, 4, 1)                                       \
    MM_DEFINE_TILE(mm_tile_##dtname##_1x3, dt, 1, 3)                                       \
    MM_DEFINE_TILE(mm_tile_##dtname##_1x2, dt, 1, 2)                                       \
    MM_DEFINE_TILE(mm_tile_##dtname##_1x1, dt, 1, 1)

MM_DEFINE_TILES(bf16, KERN_DTYPE_BF16)
MM_DEFINE_TILES(f16, KERN_DTYPE_F16)
MM_DEFINE_TILES(f32, KERN_DTYPE_F32)

/* mm_tiles[dtype][ro == MM_RO][ri - 1] */
#define MM_TILE_ROW(dtname)                                                                  \
    {{mm_tile_##dtname##_1x1, mm_tile_##dtname##_1x2, mm_tile_##dtname##_1x3},               \
     {mm_tile_##dtname##_4x1, mm_tile_##dtname##_4x2, mm_tile_##dtname##_4x3}}
static const mm_tile_fn mm_tiles[3][2][MM_RI] = {
    [KERN_DTYPE_BF16] = MM_TILE_ROW(bf16),
    [KERN_DTYPE_F16] = MM_TILE_ROW(f16),
    [KERN_DTYPE_F32] = MM_TILE_ROW(f32),
};

#ifdef __AVX2__
/* The cache-blocked f32 path for n > MM_RI. The same per-element FMA sequence
 * as mm_tile, cut into k-blocks of MM_KB: a tile's accumulators are stored to
 * memory between k-blocks and reloaded bit for bit, so blocking changes
 * nothing but which cache the operands come from (L1 instead of L2). */
#define MM_KB 256  /* k per block: 4 weight rows + 16 input rows in L1 */
#define MM_RI_KB 3 /* input rows per tile in this path */

/* acc[b * ldacc + a] += w row a . x row b over k in [0, len), len % 8 == 0,
 * for a < MM_RO, b < ri. w and x point at the k-block's first column. */
CPU_SIMD_INLINE void mm_kb_tile(int ri, const float *w, size_t ldw, const float *x, size_t ldx,
                                int len, __m256 *acc, size_t ldacc)
{
    __m256 r[MM_RO][MM_RI_KB];
#pragma GCC unroll 4
    for (int a = 0; a < MM_RO; a++)
#pragma GCC unroll 3
        for (int b = 0; b < ri; b++)
            r[a][b] = _mm256_load_ps((const float *)&acc[(size_t)b * ldacc + (size_t)a]);
    for (int k = 0; k < len; k += 8) {
        __m256 xv[MM_RI_KB];
#pragma GCC unroll 3
        for (int b = 0; b < ri; b++)
            xv[b] = _mm256_loadu_ps(x + (size_t)b * ldx + k);
#pragma GCC unroll 4
        for (int a = 0; a < MM_RO; a++) {
            __m256 wv = _mm256_loadu_ps(w + (size_t)a * ldw + (size_t)k);
#pragma GCC unroll 3
            for (int b = 0; b < ri; b++)
                r[a][b] = _mm256_fmadd_ps(wv, xv[b], r[a][b]);
        }
    }
#pragma GCC unroll 4
    for (int a = 0; a < MM_RO; a++)
#pragma GCC unroll 3
        for (int b = 0; b < ri; b++)
            _mm256_store_ps((float *)&acc[(size_t)b * ldacc + (size_t)a], r[a][b]);
}

static void mm_kb_tile3(const float *w, size_t ldw, const float *x, size_t ldx, int len,
                        __m256 *acc, size_t ldacc)
{
    mm_kb_tile(3, w, ldw, x, ldx, len, acc, ldacc);
}

static void mm_kb_tile2(const float *w, size_t ldw, const float *x, size_t ldx, int len,
                        __m256 *acc, size_t ldacc)
{
    mm_kb_tile(2, w, ldw, x, ldx, len, acc, ldacc);
}

static void mm_kb_tile1(const float *w, size_t ldw, const float *x, size_t ldx, int len,
                        __m256 *acc, size_t ldacc)
{
    mm_kb_tile(1, w, ldw, x, ldx, len, acc, ldacc);
}

/* MM_RO f32 weight rows (stride d_in) applied to all input rows; acc is
 * scratch for MM_IB * MM_RO vectors. */
static void mm_block_kb(const struct mm_job *job, const float *w, size_t ldw, int o0, __m256 *acc)
{
    const int d_in = job->d_in, len8 = d_in & ~7;
    const size_t ld = (size_t)d_in, d_out = (size_t)job->d_out;
    for (int ib = 0; ib < job->n; ib += MM_IB) {
        const int nb = job->n - ib < MM_IB ? job->n - ib : MM_IB;
        const float *x = job->in + (size_t)ib * ld;
        for (int j = 0; j < nb * MM_RO; j++)
            acc[j] = _mm256_setzero_ps();
        for (int k0 = 0; k0 < len8; k0 += MM_KB) {
            const int k1 = len8 - k0 < MM_KB ? len8 : k0 + MM_KB;
            const float *wk = w + k0, *xk = x + k0;
            int b = 0;
            for (; b + 3 <= nb; b += 3)
                mm_kb_tile3(wk, ldw, xk + (size_t)b * ld, ld, k1 - k0, acc + b * MM_RO, MM_RO);
            if (nb - b == 2)
                mm_kb_tile2(wk, ldw, xk + (size_t)b * ld, ld, k1 - k0, acc + b * MM_RO, MM_RO);
            else if (nb - b == 1)
                mm_kb_tile1(wk, ldw, xk + (size_t)b * ld, ld, k1 - k0, acc + b * MM_RO, MM_RO);
        }
        for (int b = 0; b < nb; b++) {
            const float *xr = x + (size_t)b * ld;
            float *y = job->out + (size_t)(ib + b) * d_out + (size_t)o0;
            for (int a = 0; a < MM_RO; a++) {
                float s = cpu_simd_hsum8(acc[b * MM_RO + a]);
                const float *wr = w + (size_t)a * ldw;
                for (int k = len8; k < d_in; k++)
                    s = fmaf(wr[k], xr[k], s);
                y[a] = s;
            }
        }
    }
}
#endif

#ifdef __AVX2__
/* Widens MM_RO bf16/f16 weight rows of length d_in to f32 (exact), row
 * stride ldw floats in dst. */
static void mm_widen(enum kern_dtype dt, const void *w, int d_in, float *dst, size_t ldw)
{
    const uint16_t *src = w;
    const size_t ld = (size_t)d_in;
    int k = 0;
    /* All rows advance together: four memory streams in flight, like the
     * direct tiles, instead of one row after another. */
    for (; k + 8 <= d_in; k += 8)
#pragma GCC unroll 4
        for (int r = 0; r < MM_RO; r++)
            _mm256_storeu_ps(dst + (size_t)r * ldw + (size_t)k,
                             dt == KERN_DTYPE_BF16 ? cpu_simd_load8_bf16(src + (size_t)r * ld + (size_t)k)
                                                   : cpu_simd_load8_f16(src + (size_t)r * ld + (size_t)k));
    for (int r = 0; r < MM_RO; r++)
        for (int kk = k; kk < d_in; kk++)
            dst[(size_t)r * ldw + (size_t)kk] = mm_load1(dt, src, (size_t)r * ld + (size_t)kk);
}
#endif

/* Row stride of widened weights: a multiple of 16 floats plus 16, so the
 * rows do not fall into the same L1 sets (power-of-two d_in would). */
static size_t mm_widen_stride(int d_in)
{
    return (((size_t)d_in + 15) & ~(size_t)15) + 16;
}

/* Applies `ro` weight rows (dtype dt, row stride d_in) to all input rows. */
static void mm_block(const struct mm_job *job, enum kern_dtype dt, const void *w, int ro, int o0)
{
    const mm_tile_fn *row = mm_tiles[dt][ro == MM_RO];
    const size_t d_in = (size_t)job->d_in, d_out = (size_t)job->d_out;
    for (int i = 0; i < job->n;) {
        int ri = job->n - i < MM_RI ? job->n - i : MM_RI;
        row[ri - 1](w, d_in, job->in + (size_t)i * d_in, d_in, job->d_in,
                    job->out + (size_t)i * d_out + (size_t)o0, d_out);
        i += ri;
    }
}

#ifdef __AVX2__
/* The panel path for MM_PANEL_MIN <= n <= MM_PANEL_MAX (speculative
 * verification). A task is a panel of up to MM_PR output rows. The panel is
 * swept in k-blocks of MM_PKB: the k-block of its weight rows is widened to
 * f32 once into L1-resident scratch and then applied to every input row with
 * 3 x 4 register tiles (12 accumulators, 3 weight vectors, 1 input vector:
 * 7 loads per 12 FMAs), whose accumulators are parked in scratch between
 * k-blocks, bit for bit, like the batched path. So each bf16 weight is
 * converted once per call instead of once per group of input rows. The input
 * rows are packed once per call, k-block by k-block, so that a k-block of all
 * of them is one contiguous piece of L1 (rows d_in apart, a power of two,
 * would fall into the same L1 sets). While a panel is computed, the next one
 * is prefetched, so the memory bus stays busy while the FMA units work. */

/* acc[b * ldacc + a] += w row a . x row b over k in [0, len), len % 8 == 0,
 * for a < ro, b < ri; w (dtype dt, row stride ldw elements) and x at the
 * k-block's first column. For a 16-bit dt the widened weights are also
 * stored to wdst (row stride MM_PLD), for the next input rows to reuse. */
CPU_SIMD_INLINE void mm_ptile(enum kern_dtype dt, int ro, int ri, const void *w, size_t ldw,
                              float *wdst, const float *x, size_t ldx, int len, __m256 *acc,
                              size_t ldacc)
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
            if (dt != KERN_DTYPE_F32)
                _mm256_store_ps(wdst + (size_t)a * MM_PLD + (size_t)k, wv[a]);
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

typedef void (*mm_ptile_fn)(const void *w, size_t ldw, float *wdst, const float *x, size_t ldx,
                            int len, __m256 *acc, size_t ldacc);

#define MM_DEFINE_PTILE(dtname, dt, ro, ri)                                                  \
    static void mm_ptile_##dtname##_##ro##x##ri(const void *w, size_t ldw, float *wdst,       \
                                                const float *x, size_t ldx, int len,         \
                                                __m256 *acc, size_t ldacc)                   \
    {                                                                                        \
        mm_ptile(dt, ro, ri, w, ldw, wdst, x, ldx, len, acc, ldacc);                         \
    }
#define MM_DEFINE_PTILES(dtname, dt)                                                         \
    MM_DEFINE_PTILE(dtname, dt, 3, 4)                                                        \
    MM_DEFINE_PTILE(dtname, dt, 3, 3)                                                        \
    MM_DEFINE_PTILE(dtname, dt, 3, 2)                                                        \
    MM_DEFINE_PTILE(dtname, dt, 3, 1)                                                        \
    MM_DEFINE_PTILE(dtname, dt, 1, 4)                                                        \
    MM_DEFINE_PTILE(dtname, dt, 1, 3)                                                        \
    MM_DEFINE_PTILE(dtname, dt, 1, 2)                                                        \
    MM_DEFINE_PTILE(dtname, dt, 1, 1)
MM_DEFINE_PTILES(bf16, KERN_DTYPE_BF16)
MM_DEFINE_PTILES(f16, KERN_DTYPE_F16)
MM_DEFINE_PTILES(f32, KERN_DTYPE_F32)

/* mm_ptiles[dtype][ro == 3][ri - 1] */
#define MM_PTILE_ROW(dtname)                                                                 \
    {{mm_ptile_##dtname##_1x1, mm_ptile_##dtname##_1x2, mm_ptile_##dtname##_1x3,             \
      mm_ptile_##dtname##_1x4},                                                              \
     {mm_ptile_##dtname##_3x1, mm_ptile_##dtname##_3x2, mm_ptile_##dtname##_3x3,             \
      mm_ptile_##dtname##_3x4}}
static const mm_ptile_fn mm_ptiles[3][2][4] = {
    [KERN_DTYPE_BF16] = MM_PTILE_ROW(bf16),
    [KERN_DTYPE_F16] = MM_PTILE_ROW(f16),
    [KERN_DTYPE_F32] = MM_PTILE_ROW(f32),
};

/* Packs the input's first len8 columns k-block by k-block:
 * xp[kb][i][0 .. MM_PKB) = in[i][kb * MM_PKB ...]. */
static void mm_pack_inputs(const float *in, int n, int d_in, float *xp)
{
    const int len8 = d_in & ~7;
    for (int k0 = 0; k0 < len8; k0 += MM_PKB) {
        const int len = len8 - k0 < MM_PKB ? len8 - k0 : MM_PKB;
        for (int i = 0; i < n; i++)
            memcpy(xp + ((size_t)k0 * (size_t)n + (size_t)i * MM_PKB),
                   in + (size_t)i * (size_t)d_in + (size_t)k0, (size_t)len * sizeof(float));
    }
}

/* A walk over the weights of the panel computed next, in the order the
 * panel path will read them (k-block by k-block, row by row), a few cache
 * lines at a time between tiles: spread over the whole panel, the prefetches
 * keep the memory bus busy while the FMA units work without ever waiting
 * for a free miss buffer all at once. */
struct mm_pf {
    const char *base;  /* the next panel's first row; NULL when done */
    size_t row_bytes;  /* weight row stride */
    size_t kb_bytes;   /* bytes of one row in a full k-block */
    size_t len_bytes;  /* bytes of a row that the k-blocks cover */
    int rows, n_kb;    /* rows of the next panel, k-blocks per row */
    int kb, r;         /* position of the walk */
    size_t off;        /* byte offset in the row's k-block */
};

CPU_SIMD_INLINE void mm_pf_issue(struct mm_pf *pf, int lines)
{
    for (int c = 0; c < lines && pf->base; c++) {
        _mm_prefetch(pf->base + (size_t)pf->r * pf->row_bytes + (size_t)pf->kb * pf->kb_bytes +
                         pf->off,
                     MM_PF_HINT);
        pf->off += 64;
        if (pf->off < pf->kb_bytes && (size_t)pf->kb * pf->kb_bytes + pf->off < pf->len_bytes)
            continue;
        pf->off = 0;
        if (++pf->r < pf->rows)
            continue;
        pf->r = 0;
        if (++pf->kb == pf->n_kb)
            pf->base = NULL;
    }
}

/* Output rows o0 .. o0+rows-1 (rows <= MM_PR) for all n input rows.
 * next: the weights of the panel this thread computes next, next_rows rows
 * (0 if none), prefetched in shares between tiles. wf: [MM_PR][MM_PLD]
 * scratch; acc: [n][MM_PR] vectors of scratch. */
static void mm_panel(const struct mm_job *job, int o0, int rows, const char *next,
                     int next_rows, float *wf, __m256 *acc)
{
    const enum kern_dtype dt = job->dtype;
    const int n = job->n, d_in = job->d_in, len8 = d_in & ~7;
    const size_t ld = (size_t)d_in, d_out = (size_t)job->d_out;
    const size_t esize = kern_dtype_size(dt);
    const char *w = (const char *)job->w + (size_t)o0 * ld * esize;
    const int n_kb = (len8 + MM_PKB - 1) / MM_PKB;
    for (int j = 0; j < n * MM_PR; j++)
        acc[j] = _mm256_setzero_ps();
    /* Tile calls per panel, and prefetched lines per call to cover the next
     * panel by the time this one is done. */
    const int n_groups = (n + 3) / 4; /* of input rows, as even as can be */
    const int n_calls = n_kb * ((rows + 2) / 3) * n_groups;
    const size_t kb_bytes = (size_t)MM_PKB * esize;
    struct mm_pf pf = {
        .base = next_rows > 0 ? next : NULL, .row_bytes = ld * esize, .kb_bytes = kb_bytes,
        .len_bytes = (size_t)len8 * esize,
        .rows = next_rows, .n_kb = n_kb,
    };
    const int pf_lines = n_calls == 0 || !MM_PF_ON ? 0
                                      : (int)(((size_t)next_rows * (size_t)n_kb * kb_bytes / 64 +
                                               (size_t)n_calls - 1) / (size_t)n_calls);
    for (int kb = 0; kb < n_kb; kb++) {
        const int k0 = kb * MM_PKB, len = len8 - k0 < MM_PKB ? len8 - k0 : MM_PKB;
        const float *xk = job->xp + (size_t)k0 * (size_t)n;
        for (int a = 0; a < rows;) {
            const int ro = rows - a >= 3 ? 3 : 1;
            /* The first group of input rows reads the weights themselves and
             * leaves them widened in wf for the other groups. */
            const void *ws = w + ((size_t)a * ld + (size_t)k0) * esize;
            size_t ldw = ld;
            enum kern_dtype wdt = dt;
            for (int g = 0, i = 0; g < n_groups; g++) {
                const int ri = n / n_groups + (g < n % n_groups);
                mm_pf_issue(&pf, pf_lines);
                mm_ptiles[wdt][ro == 3][ri - 1](ws, ldw, wf + (size_t)a * MM_PLD,
                                                xk + (size_t)i * MM_PKB, MM_PKB, len,
                                                acc + (size_t)i * MM_PR + (size_t)a, MM_PR);
                if (wdt != KERN_DTYPE_F32) {
                    ws = wf + (size_t)a * MM_PLD;
                    ldw = MM_PLD;
                    wdt = KERN_DTYPE_F32;
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

/* Scratch of the panel path, per thread: [MM_PR][MM_PLD] widened weights,
 * then [n][MM_PR] accumulator vectors; thread 0's scratch continues with the
 * packed inputs that all threads read, mm_panel_xp_floats(n, d_in) floats. */
static size_t mm_panel_private_bytes(int n)
{
    return (size_t)MM_PR * MM_PLD * sizeof(float) + (size_t)n * MM_PR * sizeof(__m256);
}

static size_t mm_panel_xp_floats(int n, int d_in)
{
    return (size_t)n * (size_t)(((d_in & ~7) + MM_PKB - 1) / MM_PKB * MM_PKB);
}
#endif

/* Per-thread scratch layout for n > MM_RI: [MM_RO][mm_widen_stride] widened weights,
 * then MM_IB * MM_RO accumulator vectors (64-byte aligned). */
static size_t mm_scratch_acc_offset(int d_in)
{
    return ((size_t)MM_RO * mm_widen_stride(d_in) * sizeof(float) + 63) & ~(size_t)63;
}

static void mm_task(void *ctx, long begin, long end, int thread_idx)
{
    const struct mm_job *job = ctx;
    const size_t esize = kern_dtype_size(job->dtype);
    const int batched = job->n > MM_DIRECT_MAX;
#ifdef __AVX2__
    if (job->panel) {
        float *wf = job->scratch[thread_idx];
        __m256 *acc = (__m256 *)(void *)(wf + (size_t)MM_PR * MM_PLD);
        const size_t row_bytes = (size_t)job->d_in * esize;
        for (long blk = begin; blk < end; blk++) {
            const int o0 = (int)(blk * MM_PR);
            const int rows = job->d_out - o0 < MM_PR ? job->d_out - o0 : MM_PR;
            const int left = job->d_out - o0 - rows;
            const char *next = (const char *)job->w + (size_t)(o0 + rows) * row_bytes;
            int next_rows = 0;
            if (blk + 1 < end && left > 0)
                next_rows = left < MM_PR ? left : MM_PR;
            mm_panel(job, o0, rows, next, next_rows, wf, acc);
        }
        return;
    }
#endif
    for (long blk = begin; blk < end; blk++) {
        int o0 = (int)(blk * MM_RO);
        int rows = job->d_out - o0 < MM_RO ? job->d_out - o0 : MM_RO;
        const char *w = (const char *)job->w + (size_t)o0 * (size_t)job->d_in * esize;
        if (rows < MM_RO) {
            for (int r = 0; r < rows; r++)
                mm_block(job, job->dtype, w + (size_t)r * (size_t)job->d_in * esize, 1, o0 + r);
            continue;
        }
#ifdef __AVX2__
        if (batched) {
            char *scratch = (char *)job->scratch[thread_idx];
            const float *wf = (const float *)(const void *)w;
            size_t ldw = (size_t)job->d_in;
            if (job->dtype != KERN_DTYPE_F32) {
                ldw = mm_widen_stride(job->d_in);
                mm_widen(job->dtype, w, job->d_in, (float *)(void *)scratch, ldw);
                wf = (const float *)(void *)scratch;
            }
            mm_block_kb(job, wf, ldw, o0,
                        (__m256 *)(void *)(scratch + mm_scratch_acc_offset(job->d_in)));
            continue;
        }
#else
        (void)batched;
#endif
        mm_block(job, job->dtype, w, MM_RO, o0);
    }
}

int cpu_matmul(struct kern_backend *be, float *out, const float *in, const void *w,
               enum kern_dtype dtype, int n, int d_in, int d_out, char *err)
{
    struct cpu_backend *cb = cpu_backend_of(be);
    int rc = cpu_backend_check_dtype(dtype, "matmul", err);
    if (rc < 0)
        return rc;
    if (n < 0 || d_in < 0 || d_out < 0)
        return error_set(err, ERR_INVALID_ARG, "cpu matmul: negative shape n=%d d_in=%d d_out=%d",
                         n, d_in, d_out);
    if (n == 0 || d_out == 0)
        return 0;
    if (!out || !in || !w)
        return error_set(err, ERR_INVALID_ARG, "cpu matmul: NULL tensor (out=%p in=%p w=%p)",
                         (void *)out, (const void *)in, w);
    if (n > MM_DIRECT_MAX) {
        rc = cpu_backend_scratch_reserve(cb, mm_scratch_acc_offset(d_in) + 32 * MM_RO * MM_IB,
                                         err);
        if (rc < 0)
            return rc;
    }
    int panel = 0;
#ifdef __AVX2__
    float *xp = NULL;
    if (n >= MM_PANEL_MIN && n <= MM_PANEL_MAX) {
        const size_t priv = mm_panel_private_bytes(n);
        rc = cpu_backend_scratch_reserve(cb, priv + mm_panel_xp_floats(n, d_in) * sizeof(float),
                                         err);
        if (rc < 0)
            return rc;
        xp = (float *)(void *)((char *)cb->scratch[0] + priv);
        mm_pack_inputs(in, n, d_in, xp);
        panel = 1;
    }
#endif
    struct mm_job job = {
        .out = out, .in = in, .w = w, .dtype = dtype,
        .n = n, .d_in = d_in, .d_out = d_out, .scratch = cb->scratch, .panel = panel,
        .xp = NULL,
    };
#ifdef __AVX2__
    job.xp = xp;
#endif
    const int rows_per_task = panel ? MM_PR : MM_RO;
    long n_blocks = (d_out + rows_per_task - 1) / rows_per_task;
    /* Claims of up to 16 blocks, at least ~16 claims per thread to balance. */
    long chunk = n_blocks / ((long)cb->n_threads * 16);
    chunk = chunk < 1 ? 1 : chunk > 16 ? 16 : chunk;
    /* Tiny products are not worth waking the workers. */
    if ((long)n * d_in * d_out < 32768)
        chunk = n_blocks;
    cpu_pool_run(cb->pool, n_blocks, chunk, mm_task, &job);
    return 0;
}
