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
 * pool's threads; the input rows are never split. For each block the weight
 * rows are read from memory once and applied to all n input rows: n <= 2 reads
 * the bf16/f16 weights directly in MM_RO x MM_RI tiles; n > 2 first widens the
 * block to f32 in per-thread scratch (exact, so bit-identical results) and
 * then sweeps the input rows in tiles from cache. Decode and verification
 * (n = 1..16) are bound by weight bandwidth; prefill reuses the same kernel.
 */
#include <math.h>
#include <string.h>

#include "cpu_backend.h"
#include "cpu_simd.h"
#include "error.h"

#define MM_RO 4 /* output rows per tile */
#define MM_RI 2 /* input rows per tile */

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
#pragma GCC unroll 2
        for (int b = 0; b < ri; b++)
            acc[a][b] = _mm256_setzero_ps();
    for (int k = 0; k < len8; k += 8) {
        __m256 xv[MM_RI];
#pragma GCC unroll 2
        for (int b = 0; b < ri; b++)
            xv[b] = _mm256_loadu_ps(x + (size_t)b * ldx + k);
#pragma GCC unroll 4
        for (int a = 0; a < ro; a++) {
            __m256 wv = mm_load8(dt, w, (size_t)a * ldw + (size_t)k);
#pragma GCC unroll 2
            for (int b = 0; b < ri; b++)
                acc[a][b] = _mm256_fmadd_ps(wv, xv[b], acc[a][b]);
        }
    }
#pragma GCC unroll 4
    for (int a = 0; a < ro; a++)
#pragma GCC unroll 2
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

MM_DEFINE_TILE(mm_tile_bf16_4x2, KERN_DTYPE_BF16, 4, 2)
MM_DEFINE_TILE(mm_tile_bf16_4x1, KERN_DTYPE_BF16, 4, 1)
MM_DEFINE_TILE(mm_tile_bf16_1x2, KERN_DTYPE_BF16, 1, 2)
MM_DEFINE_TILE(mm_tile_bf16_1x1, KERN_DTYPE_BF16, 1, 1)
MM_DEFINE_TILE(mm_tile_f16_4x2, KERN_DTYPE_F16, 4, 2)
MM_DEFINE_TILE(mm_tile_f16_4x1, KERN_DTYPE_F16, 4, 1)
MM_DEFINE_TILE(mm_tile_f16_1x2, KERN_DTYPE_F16, 1, 2)
MM_DEFINE_TILE(mm_tile_f16_1x1, KERN_DTYPE_F16, 1, 1)
MM_DEFINE_TILE(mm_tile_f32_4x2, KERN_DTYPE_F32, 4, 2)
MM_DEFINE_TILE(mm_tile_f32_4x1, KERN_DTYPE_F32, 4, 1)
MM_DEFINE_TILE(mm_tile_f32_1x2, KERN_DTYPE_F32, 1, 2)
MM_DEFINE_TILE(mm_tile_f32_1x1, KERN_DTYPE_F32, 1, 1)

/* tiles[dtype][ro == MM_RO][ri == MM_RI] */
static const mm_tile_fn mm_tiles[3][2][2] = {
    [KERN_DTYPE_BF16] = {{mm_tile_bf16_1x1, mm_tile_bf16_1x2}, {mm_tile_bf16_4x1, mm_tile_bf16_4x2}},
    [KERN_DTYPE_F16] = {{mm_tile_f16_1x1, mm_tile_f16_1x2}, {mm_tile_f16_4x1, mm_tile_f16_4x2}},
    [KERN_DTYPE_F32] = {{mm_tile_f32_1x1, mm_tile_f32_1x2}, {mm_tile_f32_4x1, mm_tile_f32_4x2}},
};

/* Widens `rows` weight rows of length d_in to f32 (exact). */
static void mm_widen(enum kern_dtype dt, const void *w, int rows, int d_in, float *dst)
{
    size_t count = (size_t)rows * (size_t)d_in;
    if (dt == KERN_DTYPE_F32) {
        memcpy(dst, w, count * sizeof(float));
        return;
    }
    size_t i = 0;
#ifdef __AVX2__
    if (dt == KERN_DTYPE_BF16)
        for (; i + 8 <= count; i += 8)
            _mm256_storeu_ps(dst + i, cpu_simd_load8_bf16((const uint16_t *)w + i));
    else
        for (; i + 8 <= count; i += 8)
            _mm256_storeu_ps(dst + i, cpu_simd_load8_f16((const uint16_t *)w + i));
#endif
    for (; i < count; i++)
        dst[i] = mm_load1(dt, w, i);
}

/* Applies `ro` weight rows (dtype dt, row stride d_in) to all input rows. */
static void mm_block(const struct mm_job *job, enum kern_dtype dt, const void *w, int ro, int o0)
{
    const mm_tile_fn *row = mm_tiles[dt][ro == MM_RO];
    const size_t d_in = (size_t)job->d_in, d_out = (size_t)job->d_out;
    int i = 0;
    for (; i + MM_RI <= job->n; i += MM_RI)
        row[1](w, d_in, job->in + (size_t)i * d_in, d_in, job->d_in,
               job->out + (size_t)i * d_out + (size_t)o0, d_out);
    for (; i < job->n; i++)
        row[0](w, d_in, job->in + (size_t)i * d_in, d_in, job->d_in,
               job->out + (size_t)i * d_out + (size_t)o0, d_out);
}

static void mm_task(void *ctx, long begin, long end, int thread_idx)
{
    const struct mm_job *job = ctx;
    const size_t esize = kern_dtype_size(job->dtype);
    const int widen = job->n > MM_RI && job->dtype != KERN_DTYPE_F32;
    for (long blk = begin; blk < end; blk++) {
        int o0 = (int)(blk * MM_RO);
        int rows = job->d_out - o0 < MM_RO ? job->d_out - o0 : MM_RO;
        const char *w = (const char *)job->w + (size_t)o0 * (size_t)job->d_in * esize;
        if (rows == MM_RO && widen) {
            float *wf = job->scratch[thread_idx];
            mm_widen(job->dtype, w, MM_RO, job->d_in, wf);
            mm_block(job, KERN_DTYPE_F32, wf, MM_RO, o0);
        } else if (rows == MM_RO) {
            mm_block(job, job->dtype, w, MM_RO, o0);
        } else {
            for (int r = 0; r < rows; r++)
                mm_block(job, job->dtype, w + (size_t)r * (size_t)job->d_in * esize, 1, o0 + r);
        }
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
    if (n > MM_RI && dtype != KERN_DTYPE_F32) {
        rc = cpu_backend_scratch_reserve(cb, (size_t)MM_RO * (size_t)d_in * sizeof(float), err);
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
