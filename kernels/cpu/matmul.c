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
#define MM_DIRECT_MAX 16 /* n up to this reads the weights directly (decode, verification) */
#endif
#define MM_IB 16 /* input rows per i-block (batched path) */

struct mm_job {
    float *out;       /* [n, d_out] */
    const float *in;  /* [n, d_in] */
    const void *w;    /* [d_out, d_in] dtype */
    enum kern_dtype dtype;
    int n, d_in, d_out;
    float **scratch;  /* per thread: [MM_RO, d_in] f32 */
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

/* acc[b * MM_RO + a] += w row a . x row b over k in [k0, k1), k1 - k0 % 8 == 0. */
CPU_SIMD_INLINE void mm_kb_tile(int ri, const float *w, size_t ldw, const float *x, size_t ldx,
                                int k0, int k1, __m256 *acc)
{
    __m256 r[MM_RO][MM_RI_KB];
#pragma GCC unroll 4
    for (int a = 0; a < MM_RO; a++)
#pragma GCC unroll 3
        for (int b = 0; b < ri; b++)
            r[a][b] = _mm256_loadu_ps((const float *)&acc[b * MM_RO + a]);
    for (int k = k0; k < k1; k += 8) {
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
            _mm256_storeu_ps((float *)&acc[b * MM_RO + a], r[a][b]);
}

static void mm_kb_tile3(const float *w, size_t ldw, const float *x, size_t ldx, int k0, int k1,
                        __m256 *acc)
{
    mm_kb_tile(3, w, ldw, x, ldx, k0, k1, acc);
}

static void mm_kb_tile2(const float *w, size_t ldw, const float *x, size_t ldx, int k0, int k1,
                        __m256 *acc)
{
    mm_kb_tile(2, w, ldw, x, ldx, k0, k1, acc);
}

static void mm_kb_tile1(const float *w, size_t ldw, const float *x, size_t ldx, int k0, int k1,
                        __m256 *acc)
{
    mm_kb_tile(1, w, ldw, x, ldx, k0, k1, acc);
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
            int b = 0;
            for (; b + 3 <= nb; b += 3)
                mm_kb_tile3(w, ldw, x + (size_t)b * ld, ld, k0, k1, acc + b * MM_RO);
            if (nb - b == 2)
                mm_kb_tile2(w, ldw, x + (size_t)b * ld, ld, k0, k1, acc + b * MM_RO);
            else if (nb - b == 1)
                mm_kb_tile1(w, ldw, x + (size_t)b * ld, ld, k0, k1, acc + b * MM_RO);
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
    struct mm_job job = {
        .out = out, .in = in, .w = w, .dtype = dtype,
        .n = n, .d_in = d_in, .d_out = d_out, .scratch = cb->scratch,
    };
    long n_blocks = (d_out + MM_RO - 1) / MM_RO;
    /* Claims of up to 16 blocks, at least ~16 claims per thread to balance. */
    long chunk = n_blocks / ((long)cb->n_threads * 16);
    chunk = chunk < 1 ? 1 : chunk > 16 ? 16 : chunk;
    /* Tiny products are not worth waking the workers. */
    if ((long)n * d_in * d_out < 32768)
        chunk = n_blocks;
    cpu_pool_run(cb->pool, n_blocks, chunk, mm_task, &job);
    return 0;
}
