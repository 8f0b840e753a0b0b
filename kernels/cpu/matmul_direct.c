/* matmul_direct.c: cpu_matmul's direct path, and the scalar code of every
 * build (matmul.c holds the contract and the choice of path).
 *
 * Tasks are blocks of MM_RO output rows; the bf16/f16/f32 weights are read
 * directly over the whole row. The path serves every n with AVX2 but
 * without AVX-512F+BW (prefill in jobs of MM_DIRECT_JOB_ROWS rows), every n
 * in a build without AVX2, and with AVX-512F+BW only the packed path's rows
 * after its last full octet. With AVX2, up to 3 input rows go in tiles
 * over runs of rows (mm_task_runs); from 4 rows, 2 x {3..6} tiles over
 * adjacent rows (mm_block_w2), the first tile over each weight row
 * prefetching the rows after it (mm_prefetch_ahead); full prefill jobs of
 * long rows in k-blocks that keep a group's inputs in L1 (mm_task_w2_kb).
 * Bound by weight bandwidth at n = 1.
 *
 * Invariant: every output is one dot product in the fixed order of
 * cpu_simd.h, with its own accumulator in every tile shape; without AVX2
 * the eight lane accumulators are emulated with fmaf, which gives the same
 * bits; k-blocks park the accumulators in memory, which changes no bit.
 * Figures behind the shapes: docs/perf/cpu-matmul.md, "Direct path".
 */
#include <math.h>
#include <string.h>

#include "matmul_internal.h"

#ifdef __AVX2__
/* The AVX2 direct path's prefetch: while a tile reads its weight rows, it
 * asks for the same columns of the `ahead` rows that follow them (the next
 * tile's), one request per 64-byte line. Without it every weight row began
 * cold: a row of 2048 bf16 is 4 KiB, the span within which the hardware
 * prefetcher follows a stream (the weight copies do sit on huge pages: it is
 * the prefetcher's span, not the TLB's), so each row paid a memory latency
 * before its stream was found, and at 5 input rows, where the FMAs take
 * about as long as the read, the reads and the FMAs took turns instead of
 * overlapping. One tile ahead is enough lead at every row count: a tile's
 * compute is several memory latencies. One to three rows go to tiles over
 * runs of rows without it (mm_task_runs); it stays with the 2 x n tiles from
 * 4 rows and the 4-row tiles of leftover blocks. Only the first group of
 * input rows over a block asks: the later ones find the block in L1/L2, and
 * asking again made 4 rows of 8192 slower. */
CPU_SIMD_INLINE void mm_prefetch_ahead(enum kern_dtype dt, const void *w, size_t ldw, int rows,
                                       int ahead, int k)
{
    /* mm_bytes, inlined: a call in the tile's loop spills its accumulators */
    if ((mm_bytes(dt, (size_t)k) & 63) != 0)
        return;
#pragma GCC unroll 4
    for (int a = 0; a < rows; a++)
        /* past the matrix's end for its last tile: a prefetch never faults,
         * and the address is formed as an integer */
        _mm_prefetch((const char *)((uintptr_t)w + mm_bytes(dt, (size_t)(a + ahead) * ldw + (size_t)k)),
                     _MM_HINT_T0);
}
#endif

/* One tile: out[b*ldo + a] = dot(w row a, x row b) for a < ro, b < ri; with
 * pf (AVX2) it prefetches the ro rows after its own (mm_prefetch_ahead).
 * ro, ri, pf and dt are compile-time constants at every call site. */
CPU_SIMD_INLINE void mm_tile(enum kern_dtype dt, int ro, int ri, int pf, const void *w, size_t ldw,
                             const float *x, size_t ldx, int d_in, float *out, size_t ldo)
{
    const int len8 = d_in & ~7;
    float sums[MM_RO_ONE][MM_RI];
#ifdef __AVX2__
    __m256 acc[MM_RO_ONE][MM_RI];
#pragma GCC unroll 8
    for (int a = 0; a < ro; a++)
#pragma GCC unroll 3
        for (int b = 0; b < ri; b++)
            acc[a][b] = _mm256_setzero_ps();
    for (int k = 0; k < len8; k += 8) {
        if (pf)
            mm_prefetch_ahead(dt, w, ldw, ro, ro, k);
        __m256 xv[MM_RI];
#pragma GCC unroll 3
        for (int b = 0; b < ri; b++)
            xv[b] = _mm256_loadu_ps(x + (size_t)b * ldx + k);
#pragma GCC unroll 8
        for (int a = 0; a < ro; a++) {
            __m256 wv = mm_load8(dt, w, (size_t)a * ldw + (size_t)k);
#pragma GCC unroll 3
            for (int b = 0; b < ri; b++)
                acc[a][b] = _mm256_fmadd_ps(wv, xv[b], acc[a][b]);
        }
    }
#pragma GCC unroll 8
    for (int a = 0; a < ro; a++)
#pragma GCC unroll 3
        for (int b = 0; b < ri; b++)
            sums[a][b] = cpu_simd_hsum8(acc[a][b]);
#else
    (void)pf;
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

#define MM_DEFINE_TILE(name, dt, ro, ri, pf)                                               \
    static void name(const void *w, size_t ldw, const float *x, size_t ldx, int d_in,      \
                     float *out, size_t ldo)                                               \
    {                                                                                      \
        mm_tile(dt, ro, ri, pf, w, ldw, x, ldx, d_in, out, ldo);                           \
    }

#define MM_DEFINE_TILES(dtname, dt)                                                        \
    MM_DEFINE_TILE(mm_tile_##dtname##_4x3p, dt, 4, 3, 1)                                   \
    MM_DEFINE_TILE(mm_tile_##dtname##_4x2p, dt, 4, 2, 1)                                   \
    MM_DEFINE_TILE(mm_tile_##dtname##_4x1p, dt, 4, 1, 1)                                   \
    MM_DEFINE_TILE(mm_tile_##dtname##_4x3, dt, 4, 3, 0)                                    \
    MM_DEFINE_TILE(mm_tile_##dtname##_4x2, dt, 4, 2, 0)                                    \
    MM_DEFINE_TILE(mm_tile_##dtname##_4x1, dt, 4, 1, 0)                                    \
    MM_DEFINE_TILE(mm_tile_##dtname##_1x3, dt, 1, 3, 0)                                    \
    MM_DEFINE_TILE(mm_tile_##dtname##_1x2, dt, 1, 2, 0)                                    \
    MM_DEFINE_TILE(mm_tile_##dtname##_1x1, dt, 1, 1, 0)

MM_DEFINE_TILES(bf16, KERN_DTYPE_BF16)
MM_DEFINE_TILES(f16, KERN_DTYPE_F16)
MM_DEFINE_TILES(f32, KERN_DTYPE_F32)

/* mm_tiles[dtype][0: one row, 1: MM_RO rows, 2: MM_RO rows prefetching the
 * next MM_RO][ri - 1] */
#define MM_TILE_ROW(dtname)                                                                  \
    {{mm_tile_##dtname##_1x1, mm_tile_##dtname##_1x2, mm_tile_##dtname##_1x3},               \
     {mm_tile_##dtname##_4x1, mm_tile_##dtname##_4x2, mm_tile_##dtname##_4x3},               \
     {mm_tile_##dtname##_4x1p, mm_tile_##dtname##_4x2p, mm_tile_##dtname##_4x3p}}
static const mm_tile_fn mm_tiles[KERN_DTYPE_COUNT][3][MM_RI] = {
    [KERN_DTYPE_BF16] = MM_TILE_ROW(bf16),
    [KERN_DTYPE_F16] = MM_TILE_ROW(f16),
    [KERN_DTYPE_F32] = MM_TILE_ROW(f32),
};

#ifdef __AVX2__
/* One input row (decode): MM_RO_ONE weight rows side by side, without the
 * prefetch. Eight streams keep more of the row's reads in flight than four,
 * and eight FMA chains hide the FMA latency with room to spare; 12 rows were
 * no better than 8. The tiles take their rows from runs (mm_task_runs). The
 * prefetch of the next tile only got in the way here. */
MM_DEFINE_TILE(mm_tile_bf16_one, KERN_DTYPE_BF16, MM_RO_ONE, 1, 0)
MM_DEFINE_TILE(mm_tile_f16_one, KERN_DTYPE_F16, MM_RO_ONE, 1, 0)
MM_DEFINE_TILE(mm_tile_f32_one, KERN_DTYPE_F32, MM_RO_ONE, 1, 0)
static const mm_tile_fn mm_tiles_one[KERN_DTYPE_COUNT] = {
    [KERN_DTYPE_BF16] = mm_tile_bf16_one,
    [KERN_DTYPE_F16] = mm_tile_f16_one,
    [KERN_DTYPE_F32] = mm_tile_f32_one,
};

/* Two weight rows against MM_W2_MIN..MM_W2_MAX input rows in one pass over
 * the row: out[b*ldo + a] = dot(w row a, x row b) for a < 2, b < ri. Each
 * weight chunk is widened once for all the input rows, where 4 x 3 + 4 x 2
 * (or 4 x 3 twice) widened it once per group: at 5 and 6 rows the FMAs
 * nearly cover the read, and on a 2-core Zen 3 the widening (two
 * shuffle-port instructions a chunk) is much of what the tiles wait on. Each
 * input chunk is loaded once for both weight rows; 2 * ri accumulators, 2
 * weight vectors and one input vector fit the 16 registers (2 x 7 would
 * not). With pf the tile prefetches the two weight rows after its own
 * (mm_prefetch_ahead), which is what made 4 rows in one 2 x 4 pass cheaper
 * than 4 x 3 + 4 x 1 tiles. */
#define MM_W2_MIN 3 /* the smallest group (n = 7: 4 + 3) */
#define MM_W2_FROM 4 /* the 2-row tiles from this n */
#define MM_W2_MAX 6
/* The 2 x ri tile's FMAs over len columns (a multiple of 8) of w and x into
 * acc0 (weight row 0) and acc1 (row 1), which stay in registers where this
 * is inlined with ri constant. */
CPU_SIMD_INLINE void mm_w2_steps(enum kern_dtype dt, int ri, int pf, const void *w, size_t ldw,
                                 const float *x, size_t ldx, int len, __m256 *acc0, __m256 *acc1)
{
    for (int k = 0; k < len; k += 8) {
        /* the next tile's two rows: in the block's second tile, the next block's first two */
        if (pf)
            mm_prefetch_ahead(dt, w, ldw, 2, 2, k);
        const __m256 w0 = mm_load8(dt, w, (size_t)k), w1 = mm_load8(dt, w, ldw + (size_t)k);
#pragma GCC unroll 6
        for (int b = 0; b < ri; b++) {
            __m256 xv = _mm256_loadu_ps(x + (size_t)b * ldx + (size_t)k);
            /* one load for both rows: folded into each FMA it would be two */
            __asm__("" : "+x"(xv));
            acc0[b] = _mm256_fmadd_ps(w0, xv, acc0[b]);
            acc1[b] = _mm256_fmadd_ps(w1, xv, acc1[b]);
        }
    }
}

/* out[b*ldo + a] for the 2 x ri tile: its accumulators folded, then the
 * columns from len8 to d_in in order (the fixed order's scalar tail). */
CPU_SIMD_INLINE void mm_w2_finish(enum kern_dtype dt, int ri, const void *w, size_t ldw,
                                  const float *x, size_t ldx, int len8, int d_in,
                                  const __m256 *acc0, const __m256 *acc1, float *out, size_t ldo)
{
    for (int b = 0; b < ri; b++) {
        const float *xr = x + (size_t)b * ldx;
        float s0 = cpu_simd_hsum8(acc0[b]), s1 = cpu_simd_hsum8(acc1[b]);
        for (int k = len8; k < d_in; k++) {
            s0 = fmaf(mm_load1(dt, w, (size_t)k), xr[k], s0);
            s1 = fmaf(mm_load1(dt, w, ldw + (size_t)k), xr[k], s1);
        }
        out[(size_t)b * ldo] = s0;
        out[(size_t)b * ldo + 1] = s1;
    }
}

CPU_SIMD_INLINE void mm_tile_w2(enum kern_dtype dt, int ri, int pf, const void *w, size_t ldw,
                                const float *x, size_t ldx, int d_in, float *out, size_t ldo)
{
    const int len8 = d_in & ~7;
    __m256 acc0[MM_W2_MAX], acc1[MM_W2_MAX];
#pragma GCC unroll 6
    for (int b = 0; b < ri; b++)
        acc0[b] = acc1[b] = _mm256_setzero_ps();
    mm_w2_steps(dt, ri, pf, w, ldw, x, ldx, len8, acc0, acc1);
    mm_w2_finish(dt, ri, w, ldw, x, ldx, len8, d_in, acc0, acc1, out, ldo);
}

/* mm_tile_w2 over one k-block of len columns (a multiple of 8; w and x
 * already offset to it), its accumulators parked in acc between blocks:
 * acc[b] of weight row 0, acc[MM_W2_MAX + b] of row 1 (mm_task_w2_kb).
 * Parking changes no bit. */
CPU_SIMD_INLINE void mm_tile_w2_kb(enum kern_dtype dt, int ri, int pf, const void *w, size_t ldw,
                                   const float *x, size_t ldx, int len, __m256 *acc)
{
    __m256 acc0[MM_W2_MAX], acc1[MM_W2_MAX];
#pragma GCC unroll 6
    for (int b = 0; b < ri; b++) {
        acc0[b] = acc[b];
        acc1[b] = acc[MM_W2_MAX + b];
    }
    mm_w2_steps(dt, ri, pf, w, ldw, x, ldx, len, acc0, acc1);
#pragma GCC unroll 6
    for (int b = 0; b < ri; b++) {
        acc[b] = acc0[b];
        acc[MM_W2_MAX + b] = acc1[b];
    }
}

#define MM_DEFINE_TILE_W2(dtname, dt, ri, pf, sfx)                                           \
    static void mm_tile_w2_##dtname##_##ri##sfx(const void *w, size_t ldw, const float *x,    \
                                                size_t ldx, int d_in, float *out, size_t ldo) \
    {                                                                                        \
        mm_tile_w2(dt, ri, pf, w, ldw, x, ldx, d_in, out, ldo);                              \
    }
/* Every 2 x n tile kind: define(dtname, dt, ri, prefetching, name suffix). */
#define MM_W2_KINDS(define, dtname, dt)                                                      \
    define(dtname, dt, 3, 0, ) define(dtname, dt, 4, 0, ) define(dtname, dt, 5, 0, )        \
    define(dtname, dt, 6, 0, ) define(dtname, dt, 3, 1, p) define(dtname, dt, 4, 1, p)      \
    define(dtname, dt, 5, 1, p) define(dtname, dt, 6, 1, p)
MM_W2_KINDS(MM_DEFINE_TILE_W2, bf16, KERN_DTYPE_BF16)
MM_W2_KINDS(MM_DEFINE_TILE_W2, f16, KERN_DTYPE_F16)
MM_W2_KINDS(MM_DEFINE_TILE_W2, f32, KERN_DTYPE_F32)

/* A table of 2 x n tiles named prefix<dtname>_<ri>[p]:
 * [dtype][prefetching][ri - MM_W2_MIN] */
#define MM_W2_ROW(prefix, dtname)                                                            \
    {{prefix##dtname##_3, prefix##dtname##_4, prefix##dtname##_5, prefix##dtname##_6},       \
     {prefix##dtname##_3p, prefix##dtname##_4p, prefix##dtname##_5p, prefix##dtname##_6p}}
#define MM_W2_TABLE(prefix)                                                                  \
    {[KERN_DTYPE_BF16] = MM_W2_ROW(prefix, bf16), [KERN_DTYPE_F16] = MM_W2_ROW(prefix, f16),  \
     [KERN_DTYPE_F32] = MM_W2_ROW(prefix, f32)}
static const mm_tile_fn mm_tiles_w2[KERN_DTYPE_COUNT][2][MM_W2_MAX - MM_W2_MIN + 1] =
    MM_W2_TABLE(mm_tile_w2_);

#if !(defined(__AVX512F__) && defined(__AVX512BW__))
typedef void (*mm_tile_kb_fn)(const void *w, size_t ldw, const float *x, size_t ldx, int len,
                              __m256 *acc);
#define MM_DEFINE_TILE_W2_KB(dtname, dt, ri, pf, sfx)                                        \
    static void mm_tile_w2kb_##dtname##_##ri##sfx(const void *w, size_t ldw, const float *x,  \
                                                  size_t ldx, int len, __m256 *acc)           \
    {                                                                                        \
        mm_tile_w2_kb(dt, ri, pf, w, ldw, x, ldx, len, acc);                                 \
    }
MM_W2_KINDS(MM_DEFINE_TILE_W2_KB, bf16, KERN_DTYPE_BF16)
MM_W2_KINDS(MM_DEFINE_TILE_W2_KB, f16, KERN_DTYPE_F16)
MM_W2_KINDS(MM_DEFINE_TILE_W2_KB, f32, KERN_DTYPE_F32)
static const mm_tile_kb_fn mm_tiles_w2_kb[KERN_DTYPE_COUNT][2][MM_W2_MAX - MM_W2_MIN + 1] =
    MM_W2_TABLE(mm_tile_w2kb_);
#endif

/* Applies a block's MM_RO weight rows to all n >= MM_W2_FROM input rows in
 * 2-row tiles: the input rows in as few groups of at most MM_W2_MAX as
 * there can be, as even as can be (7: 4 + 3, 13: 5 + 4 + 4), each pair of
 * weight rows against every group while it is in L1/L2, the first group
 * prefetching the next pair. */
static void mm_block_w2(const struct mm_job *job, enum kern_dtype dt, const void *w, int o0)
{
    const size_t d_in = (size_t)job->d_in, d_out = (size_t)job->d_out;
    const int n = job->n;
    const int groups = (n + MM_W2_MAX - 1) / MM_W2_MAX;
    for (int a = 0; a < MM_RO; a += 2) {
        const char *wa = (const char *)w + mm_bytes(dt, (size_t)a * d_in);
        for (int g = 0, i = 0; g < groups; g++) {
            const int ri = n / groups + (g < n % groups ? 1 : 0);
            mm_tiles_w2[dt][g == 0][ri - MM_W2_MIN](wa, d_in, job->in + (size_t)i * d_in, d_in,
                                                    job->d_in,
                                                    job->out + (size_t)i * d_out + (size_t)o0 +
                                                        (size_t)a,
                                                    d_out);
            i += ri;
        }
    }
}
#endif

/* Applies `ro` weight rows (dtype dt, row stride d_in) to all input rows. */
void mm_block(const struct mm_job *job, enum kern_dtype dt, const void *w, int ro, int o0)
{
    const mm_tile_fn *row = mm_tiles[dt][ro == MM_RO];
    const mm_tile_fn *first = mm_tiles[dt][ro == MM_RO ? 2 : 0];
    const size_t d_in = (size_t)job->d_in, d_out = (size_t)job->d_out;
#ifdef __AVX2__
    if (ro == MM_RO && job->n >= MM_W2_FROM) {
        mm_block_w2(job, dt, w, o0);
        return;
    }
#endif
    for (int i = 0; i < job->n;) {
        int ri = job->n - i < MM_RI ? job->n - i : MM_RI;
        (i == 0 ? first : row)[ri - 1](w, d_in, job->in + (size_t)i * d_in, d_in, job->d_in,
                                       job->out + (size_t)i * d_out + (size_t)o0, d_out);
        i += ri;
    }
}
#ifdef __AVX2__
/* Up to MM_RI input rows (AVX2) over the blocks [begin, end): the range's
 * rows cut into `ro` runs of equal length (MM_RO_ONE at one input row,
 * MM_RO at two or three), each tile taking the next row of every run, so
 * that the tile's weight streams go on through consecutive rows instead of
 * all ending with a row; the rows left after the runs go through mm_block.
 * Why: at 2048 columns a row is 4 KiB, and a tile over adjacent rows
 * started all its streams afresh at every tile. A run of rows is one
 * sequential stream, which the hardware prefetchers keep ahead of the
 * reads across rows. From 4 rows runs did not pay (neither the 2 x n tiles
 * over two runs nor the 4 x n tiles over four), so those keep adjacent rows
 * and their prefetch. */
void mm_task_runs(const struct mm_job *job, long begin, long end)
{
    const enum kern_dtype dt = job->dtype;
    const int n = job->n;
    const int ro = n == 1 ? MM_RO_ONE : MM_RO;
    const mm_tile_fn tile = n == 1 ? mm_tiles_one[dt] : mm_tiles[dt][1][n - 1];
    const size_t d_in = (size_t)job->d_in, d_out = (size_t)job->d_out;
    const size_t row_bytes = mm_bytes(dt, d_in);
    const int o_begin = (int)(begin * MM_RO);
    const int o_end = end * MM_RO < job->d_out ? (int)(end * MM_RO) : job->d_out;
    const int run = (o_end - o_begin) / ro;
    const char *w = (const char *)job->w + (size_t)o_begin * row_bytes;
    for (int i = 0; i < run; i++) {
        float sums[MM_RI * MM_RO_ONE];
        /* row a of the tile: row i of run a, `run` rows after row i of run a - 1 */
        tile(w + (size_t)i * row_bytes, (size_t)run * d_in, job->in, d_in, job->d_in, sums,
             (size_t)ro);
        for (int b = 0; b < n; b++)
            for (int a = 0; a < ro; a++)
                job->out[(size_t)b * d_out + (size_t)(o_begin + a * run + i)] =
                    sums[b * ro + a];
    }
    for (int o0 = o_begin + ro * run; o0 < o_end;) {
        const int rows = o_end - o0 >= MM_RO ? MM_RO : 1;
        mm_block(job, dt, w + (size_t)(o0 - o_begin) * row_bytes, rows, o0);
        o0 += rows;
    }
}
#endif

#if defined(__AVX2__) && !(defined(__AVX512F__) && defined(__AVX512BW__))
#define MM_KB_COLS 512 /* columns per k-block: 6 input rows' block is 12 KiB */
#define MM_KB_PAIRS 32 /* weight-row pairs whose accumulators one sweep parks */
/* A prefill job (n >= MM_KB_ROWS_MIN input rows, AVX2) over the blocks
 * [begin, end): mm_block_w2's groups of input rows in turn against every
 * pair of the claim's weight rows, in k-blocks of MM_KB_COLS columns, each
 * group's k-block first copied to a contiguous buffer. mm_block_w2 instead
 * takes each pair of weight rows against all groups while the pair is in
 * L1, so every group's whole rows come through L1 again for every pair:
 * 48 KiB for 6 rows of 2048 columns, more than L1 holds, the rows also
 * 8 KiB apart on the same L1 sets. Here a group's k-block stays in L1 for
 * all the claim's pairs (up to 32, 16 KiB of bf16 rows at 2048 columns
 * a k-block, from L2 after the first group). The accumulators are parked
 * between k-blocks (no bit changes). The first group prefetches as
 * mm_block_w2's does (its pairs come from memory). With fewer rows the
 * pairs' second reads from L2 cost more than the inputs' reads save, so
 * verifications (n <= 17) and a prefill's last, shorter job keep
 * mm_block_w2. So do rows shorter than MM_KB_MIN_DIN, whose group fits L1
 * whole. Claims capped to stay in L2 and other k-block lengths were no
 * better. */
void mm_task_w2_kb(const struct mm_job *job, long begin, long end)
{
    const enum kern_dtype dt = job->dtype;
    const int n = job->n;
    const size_t d_in = (size_t)job->d_in, d_out = (size_t)job->d_out;
    const size_t row_bytes = mm_bytes(dt, d_in);
    const int o_begin = (int)(begin * MM_RO);
    const int o_end = end * MM_RO < job->d_out ? (int)(end * MM_RO) : job->d_out;
    const int pairs = (o_end - o_begin) / MM_RO * (MM_RO / 2); /* the full blocks' rows */
    const int groups = (n + MM_W2_MAX - 1) / MM_W2_MAX;
    const int len8 = job->d_in & ~7;
    __m256 acc[MM_KB_PAIRS][2 * MM_W2_MAX];
    float xb[MM_W2_MAX * MM_KB_COLS] __attribute__((aligned(32)));
    const char *w = (const char *)job->w + (size_t)o_begin * row_bytes;
    for (int p0 = 0; p0 < pairs; p0 += MM_KB_PAIRS) {
        const int np = pairs - p0 < MM_KB_PAIRS ? pairs - p0 : MM_KB_PAIRS;
        const char *wp = w + (size_t)(2 * p0) * row_bytes;
        for (int g = 0, i = 0; g < groups; g++) {
            const int ri = n / groups + (g < n % groups ? 1 : 0);
            const float *x = job->in + (size_t)i * d_in;
            const mm_tile_kb_fn tile = mm_tiles_w2_kb[dt][g == 0][ri - MM_W2_MIN];
            for (int p = 0; p < np; p++)
                for (int v = 0; v < 2 * MM_W2_MAX; v++)
                    acc[p][v] = _mm256_setzero_ps();
            for (int k0 = 0; k0 < len8; k0 += MM_KB_COLS) {
                const int len = len8 - k0 < MM_KB_COLS ? len8 - k0 : MM_KB_COLS;
                for (int b = 0; b < ri; b++)
                    memcpy(xb + (size_t)b * (size_t)len, x + (size_t)b * d_in + (size_t)k0,
                           (size_t)len * sizeof(float));
                for (int p = 0; p < np; p++)
                    tile(wp + (size_t)(2 * p) * row_bytes + mm_bytes(dt, (size_t)k0), d_in, xb,
                         (size_t)len, len, acc[p]);
            }
            for (int p = 0; p < np; p++)
                mm_w2_finish(dt, ri, wp + (size_t)(2 * p) * row_bytes, d_in, x, d_in, len8,
                             job->d_in, acc[p], acc[p] + MM_W2_MAX,
                             job->out + (size_t)i * d_out + (size_t)(o_begin + 2 * (p0 + p)),
                             d_out);
            i += ri;
        }
    }
    for (int o = o_begin + 2 * pairs; o < o_end; o++)
        mm_block(job, dt, w + (size_t)(o - o_begin) * row_bytes, 1, o);
}
#endif
