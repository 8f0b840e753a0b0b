/* matmul.c: cpu_matmul, out[i][o] = sum_k in[i][k] * w[o][k] (f32 accumulate).
 *
 * Reduction order: every output element is one dot product of length d_in in
 * the fixed order of cpu_simd.h (8 lanes over k in steps of 8 with FMA, fixed
 * lane fold, scalar FMA tail). Each element has its own accumulator in every
 * tile shape below and the same sequence of operations, so out[i][o] does not
 * depend on n, on the tile or path that computed it, nor on the thread. Never
 * split the reduction across threads (no split-K): that is what would make
 * results depend on shapes. Cutting it into k-blocks with the accumulators
 * parked in memory in between is fine: that changes no bit.
 *
 * Five paths, chosen from (n, d_in) and whether map_matrix packed w
 * (mm_use_panel, MM_IPAIRS_MIN, cpu_backend_packed), all exact:
 *   - packed (AVX-512F+BW; w in the packed layout of packed.h, any n):
 *     octets of 8 weight rows; up to 3 rows several octets side by side,
 *     from 3 rows one octet against up to 6 rows at once, in k-blocks, 3 to
 *     6 rows on 3 octets in turn (mm_task_packed).
 *   - output pairs (AVX-512F+BW; n = 1..5: decode
 *     and short speculative verifications): tasks are blocks of MM_RO
 *     output rows; two weight rows share each 512-bit accumulator (one
 *     8-lane half each, so every output keeps its 8-lane order) and the
 *     block's 4 weight rows are applied to all input rows per read; rows
 *     longer than MM_OKB_MIN_DIN go in k-blocks over 16 blocks at a time from 2 rows
 *     (mm_blocks_opairs_kb).
 *   - input pairs (AVX-512F+BW; n = 6 up to 17: longer verifications,
 *     batches of decode rows): the same tasks, two input rows per 512-bit
 *     accumulator instead, the block's 4 weight rows applied to up to 12
 *     input rows per read.
 *   - direct (AVX2 without AVX-512F+BW: every n, prefill in jobs of
 *     MM_DIRECT_JOB_ROWS rows; scalar: every n; with AVX-512F+BW only the
 *     packed path's rows after its last full octet): the same tasks; the
 *     bf16/f16/f32 weights are read directly over the whole row. Up to 3
 *     rows (AVX2 alone, mm_task_runs): a task's rows cut into runs, one row
 *     in MM_RO_ONE x 1 tiles and 2 or 3 rows in MM_RO x {2,3} tiles whose
 *     weight rows come one from each run, without prefetch. From 4 rows
 *     (AVX2) 2 x {3..6} tiles over adjacent rows (mm_block_w2), later tiles
 *     finding the weights in L1/L2, the first tile over each weight row
 *     prefetching the rows after it (mm_prefetch_ahead), as does the
 *     MM_RO x 1 tile of a 4-row block left after the runs. Full prefill
 *     jobs of rows of at least MM_KB_MIN_DIN columns turn that around
 *     (mm_task_w2_kb): each group of input rows against every pair of the
 *     claim's weight rows, in k-blocks that keep the group's inputs in L1.
 *     Bound by weight bandwidth at n = 1.
 *   - panel (AVX-512F+BW, weights not packed; prefill, n > 17): tasks are
 *     panels of MM_PR output rows, swept in k-blocks sized so that the
 *     packed k-block of all input rows stays in L1; each weight is widened
 *     to f32 once per call (not once per group of input rows) and applied
 *     with 3 x 4 register tiles. Inputs beyond MM_PANEL_MAX rows run as
 *     several jobs.
 * The input rows are never split across threads; the pool's threads claim
 * output blocks/panels.
 */
#include <math.h>
#include <string.h>

#include "cpu_backend.h"
#include "cpu_simd.h"
#include "error.h"
#include "packed.h"

#define MM_RO 4 /* output rows per tile */
#define MM_RO_ONE 8 /* output rows per tile at one input row (AVX2: mm_task_runs) */
#define MM_RI 3 /* max input rows per tile (direct path) */
#define MM_PANEL_MAX 32 /* input rows per panel job (more: several jobs) */
#define MM_PR 12 /* output rows per panel (a multiple of 3) */
#define MM_PXP_BYTES 16384 /* L1 for a k-block of the packed input rows */

struct mm_job {
    float *out;       /* [n, d_out] */
    const float *in;  /* [n, d_in] */
    const void *w;    /* [d_out, d_in] dtype */
    enum kern_dtype dtype;
    int n, d_in, d_out;
    float **scratch;  /* per thread (panel path): see mm_panel_private_bytes */
    const float *xp;  /* panel path: the packed inputs (mm_pack_inputs) */
    const float *xq;  /* input-pair path: the inputs packed in pairs (mm_pack_pairs) */
    int opairs;       /* the output-pair path (mm_block_opairs) */
    int okb;          /* output pairs in k-blocks of this many columns (0: whole rows) */
    ptrdiff_t pf_lead; /* output pairs, whole rows: each row's prefetch lead, in bytes */
    size_t pf_next;   /* ... and how much further once past a row's end (mm_otile) */
    int pkb;          /* panel path: k-block length */
    int packed_rows;  /* w's first rows in the packed layout (packed.h), or 0 */
    int pk_task_octets; /* packed path: octets per pool task (mm_task_packed) */
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
 * compute is several memory latencies. Measured on a 2-core Zen 3 (2
 * threads, bf16, tools/bench_kernels, builds without and with it
 * alternating, two runs, n rows against one at the Llama-1B shapes): 5 rows
 * 1.43-1.62x -> 1.12-1.27x, 2 rows 1.06-1.13x -> 0.97-1.03x, 3 rows
 * 1.09-1.19x -> 1.02-1.08x. One row alone (a stand-alone copy of the tiles
 * timed in one process, alternating, medians of 41): 0-14% less time over
 * three runs at 2048 -> 2048, 2048 -> 8192, 8192 -> 2048 and the 2048 x
 * 128256 head, 7% more in one other run at 2048 -> 2048; two blocks ahead
 * instead of one was within 1-3% of it. One to three rows have since gone
 * to tiles over runs of rows without it (mm_task_runs), faster still; it
 * stays with the 2 x n tiles from 4 rows and the 4-row tiles of leftover
 * blocks. Only the first group of input rows over a block asks: the later
 * ones find the block in L1/L2, and asking again made 4 rows of 8192
 * slower. */
CPU_SIMD_INLINE void mm_prefetch_ahead(enum kern_dtype dt, const void *w, size_t ldw, int rows,
                                       int ahead, int k)
{
    /* not kern_dtype_size: a call in the tile's loop spills its accumulators */
    const size_t esize = dt == KERN_DTYPE_F32 ? 4 : 2;
    if ((((size_t)k * esize) & 63) != 0)
        return;
#pragma GCC unroll 4
    for (int a = 0; a < rows; a++)
        /* past the matrix's end for its last tile: a prefetch never faults,
         * and the address is formed as an integer */
        _mm_prefetch((const char *)((uintptr_t)w + ((size_t)(a + ahead) * ldw + (size_t)k) * esize),
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
static const mm_tile_fn mm_tiles[3][3][MM_RI] = {
    [KERN_DTYPE_BF16] = MM_TILE_ROW(bf16),
    [KERN_DTYPE_F16] = MM_TILE_ROW(f16),
    [KERN_DTYPE_F32] = MM_TILE_ROW(f32),
};

#ifdef __AVX2__
/* One input row (decode): MM_RO_ONE weight rows side by side, without the
 * prefetch. Eight streams keep more of the row's reads in flight than four,
 * and eight FMA chains hide the FMA latency with room to spare. The figures
 * below are of tiles over adjacent rows, which at 2048 columns (a row is
 * 4 KiB) started their streams afresh at every tile; the tiles now take
 * their rows from runs (mm_task_runs), faster again. The prefetch of the
 * next tile only got in the way here: in a stand-alone copy of the tiles
 * (2 threads, cold weights, bf16), prefetching the next eight rows line by
 * line (T0, T1 or T2, one or two tiles ahead) was 4-26% slower than none,
 * prefetching only their first lines half-way through the tile between 4%
 * faster and 15% slower, and 12 rows were no better than 8.
 * Against the prefetching 4 x 1 tile on a 2-core Zen 3: tools/bench_kernels
 * --rows 1, builds alternating, 3 runs, the share of the read 77-82% ->
 * 82-93% at 2048 -> 2048, 79-85% -> 84-88% at 2048 -> 8192, 90-92% -> 93-97%
 * at 8192 -> 2048, 72-82% -> 84-87% for the 2048 x 128256 head; a Llama-1B
 * decode step (one build switched at run time, 4 tokens a turn, medians of
 * 15-21 paired turns) took 0.89-0.96x the time in 4 runs. */
MM_DEFINE_TILE(mm_tile_bf16_one, KERN_DTYPE_BF16, MM_RO_ONE, 1, 0)
MM_DEFINE_TILE(mm_tile_f16_one, KERN_DTYPE_F16, MM_RO_ONE, 1, 0)
MM_DEFINE_TILE(mm_tile_f32_one, KERN_DTYPE_F32, MM_RO_ONE, 1, 0)
static const mm_tile_fn mm_tiles_one[3] = {
    [KERN_DTYPE_BF16] = mm_tile_bf16_one,
    [KERN_DTYPE_F16] = mm_tile_f16_one,
    [KERN_DTYPE_F32] = mm_tile_f32_one,
};

/* Two weight rows against MM_W2_MIN..MM_W2_MAX input rows in one pass over
 * the row: out[b*ldo + a] = dot(w row a, x row b) for a < 2, b < ri. Each
 * weight chunk is widened once for all the input rows, where 4 x 3 + 4 x 2
 * (or 4 x 3 twice) widened it once per group: at 5 and 6 rows the FMAs
 * nearly cover the read, and on a 2-core Zen 3 the widening (two
 * shuffle-port instructions a chunk) is much of what the tiles wait on (all
 * operands in L1: 2 x 5 at 58% of the FMA peak, 4 x 3 + 4 x 2 at 44%). Each
 * input chunk is loaded once for both weight rows; 2 * ri accumulators, 2
 * weight vectors and one input vector fit the 16 registers. Against those
 * tiles there (tools/bench_kernels, old and new builds alternating, medians
 * of 7 pairs, n rows against one): 8192 -> 2048 1.50x against 1.54x at 5
 * rows, 1.57x against 1.66x at 6; rows of 2048 within noise either way.
 * 2 x 7 would not fit the registers. With pf the tile prefetches the two
 * weight rows after its own (mm_prefetch_ahead): with that, 4 rows in one
 * 2 x 4 pass took 1.16-1.22x one row's time at 8192 -> 2048, against
 * 1.37-1.44x in 4 x 3 + 4 x 1 tiles. */
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
static const mm_tile_fn mm_tiles_w2[3][2][MM_W2_MAX - MM_W2_MIN + 1] = MM_W2_TABLE(mm_tile_w2_);

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
static const mm_tile_kb_fn mm_tiles_w2_kb[3][2][MM_W2_MAX - MM_W2_MIN + 1] =
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
    const size_t esize = kern_dtype_size(dt);
    const int n = job->n;
    const int groups = (n + MM_W2_MAX - 1) / MM_W2_MAX;
    for (int a = 0; a < MM_RO; a += 2) {
        const char *wa = (const char *)w + (size_t)a * d_in * esize;
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
static void mm_block(const struct mm_job *job, enum kern_dtype dt, const void *w, int ro, int o0)
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

#if defined(__AVX512F__) && defined(__AVX512BW__)
/* The input-pair path (AVX-512F+BW; n = MM_IPAIRS_MIN up to
 * MM_PAIRED_MAX, the output-pair path below taking the smaller n). A 512-bit
 * FMA does the work of two 256-bit ones in the same issue slot (at full
 * width on Zen 5 and on Intel server cores), so two input rows share one
 * zmm: lanes 0-7 hold the eight lane accumulators of (weight row a, input
 * row 2p) and lanes 8-15 those of (a, 2p+1). Each half
 * sees exactly the FMAs, in the same order, as the 256-bit accumulator of
 * the same output would (FMA is lane by lane), and is folded with
 * cpu_simd_hsum8 and finished with the scalar tail as before: the bits do
 * not change, only half as many FMAs are issued. The weight vector is
 * widened once into both halves (a broadcast load and one widening), and the
 * inputs are packed once per call so that the two rows of a pair are one
 * aligned 64-byte load per k-step (mm_pack_pairs).
 * Which of the two pair paths: measured (one thread, bf16, weights cold,
 * Llama-1B shapes, tools/bench_kernels --cpu-time, both with the prefetch),
 * the output pairs were 10-30% faster at n = 1..4; from n = 5 (d_in = 2048)
 * or 6 (d_in = 8192) the input pairs were 3-20% faster, the output pairs
 * then reading inputs that no longer fit in L1. Since the output pairs go
 * in k-blocks (mm_blocks_opairs_kb), they keep n = 5 too: 2 threads, same
 * session, 5 rows of 2048 -> 8192 took 14% less time and of the 2048 x
 * 128256 head 5% less.
 * The prefetch is the output pairs' (MM_PF, once per 64-byte line of each
 * weight row): measured 8-21% faster at n = 6..17. */
#define MM_PF 512 /* weights: 1 KiB of bf16/f16 ahead (256..1024 measured alike) */
/* Blocks shorter than this (d_in < 768 in bf16) prefetch whole blocks
 * ahead, at least this many bytes: the in-row lead above, carried into the
 * next block, is only about one block (3.3 KiB at d_in = 384) there. The
 * 384 x 128256 head at one row, 2 threads, a stand-alone copy of the tile
 * timed in one process alternating the leads: 6 KiB ahead 15-20% faster than
 * 3 KiB, 9 KiB 5-7% slower than 6; at d_in = 768 the existing lead is
 * already about 6 KiB. */
#define MM_PF_SHORT_AHEAD 6144
#define MM_IPAIRS_MIN 6 /* input pairs from this n */
#define MM_PAIRS4 6 /* most input-row pairs with 4 weight rows (24 + 4 + 1 zmm) */
#define MM_PAIRS 9  /* most pairs with 1 weight row (tail rows of d_out) */

/* Weights idx .. idx+7 widened to f32, in lanes 0-7 and again in 8-15. */
CPU_SIMD_INLINE __m512 mm_load8x2(enum kern_dtype dt, const void *w, size_t idx)
{
    switch (dt) {
    case KERN_DTYPE_BF16: {
        __m256i h = _mm256_broadcastsi128_si256(
            _mm_loadu_si128((const __m128i *)(const void *)((const uint16_t *)w + idx)));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    case KERN_DTYPE_F16: {
        __m256i h = _mm256_broadcastsi128_si256(
            _mm_loadu_si128((const __m128i *)(const void *)((const uint16_t *)w + idx)));
        return _mm512_cvtph_ps(h);
    }
    case KERN_DTYPE_F32: break;
    }
    return _mm512_castpd_ps(_mm512_broadcast_f64x4(
        _mm256_castps_pd(_mm256_loadu_ps((const float *)w + idx))));
}

/* One paired tile: out[b*ldo + a] = dot(w row a, x row b) for a < ro and the
 * rows b < n_valid of np pairs (n_valid is 2*np, or 2*np - 1 when the last
 * pair holds one real row). xq: the pairs packed by mm_pack_pairs, pstride
 * floats apart; x: the same rows unpacked (for the scalar tail). */
CPU_SIMD_INLINE void mm_qtile(enum kern_dtype dt, int ro, int np, const void *w, size_t ldw,
                              const float *xq, size_t pstride, const float *x, size_t ldx,
                              int d_in, int n_valid, float *out, size_t ldo)
{
    const int len8 = d_in & ~7;
    __m512 acc[MM_RO][MM_PAIRS];
#pragma GCC unroll 4
    for (int a = 0; a < ro; a++)
#pragma GCC unroll 9
        for (int p = 0; p < np; p++)
            acc[a][p] = _mm512_setzero_ps();
    const size_t esize = kern_dtype_size(dt);
    for (int k = 0; k < len8; k += 8) {
        __m512 wv[MM_RO];
        if ((k & 31) == 0)
#pragma GCC unroll 4
            for (int a = 0; a < ro; a++)
                _mm_prefetch((const char *)((uintptr_t)w +
                                            esize * ((size_t)a * ldw + (size_t)k + MM_PF)),
                             _MM_HINT_T0);
#pragma GCC unroll 4
        for (int a = 0; a < ro; a++)
            wv[a] = mm_load8x2(dt, w, (size_t)a * ldw + (size_t)k);
#pragma GCC unroll 9
        for (int p = 0; p < np; p++) {
            __m512 xv = _mm512_load_ps(xq + (size_t)p * pstride + 2 * (size_t)k);
            __asm__("" : "+v"(xv)); /* one load, ro uses (see mm_tile) */
#pragma GCC unroll 4
            for (int a = 0; a < ro; a++)
                acc[a][p] = _mm512_fmadd_ps(wv[a], xv, acc[a][p]);
        }
    }
    for (int a = 0; a < ro; a++)
        for (int p = 0; p < np; p++)
            for (int h = 0; h < 2; h++) {
                const int b = 2 * p + h;
                if (b >= n_valid)
                    break;
                const __m256 half = h ? _mm256_castpd_ps(_mm512_extractf64x4_pd(
                                            _mm512_castps_pd(acc[a][p]), 1))
                                      : _mm512_castps512_ps256(acc[a][p]);
                float sum = cpu_simd_hsum8(half);
                for (int k = len8; k < d_in; k++)
                    sum = fmaf(mm_load1(dt, w, (size_t)a * ldw + (size_t)k),
                               x[(size_t)b * ldx + (size_t)k], sum);
                out[(size_t)b * ldo + (size_t)a] = sum;
            }
}

typedef void (*mm_qtile_fn)(const void *w, size_t ldw, const float *xq, size_t pstride,
                            const float *x, size_t ldx, int d_in, int n_valid, float *out,
                            size_t ldo);

#define MM_DEFINE_QTILE(dtname, dt, ro, np)                                                  \
    static void mm_qtile_##dtname##_##ro##x##np(const void *w, size_t ldw, const float *xq,  \
                                                size_t pstride, const float *x, size_t ldx, \
                                                int d_in, int n_valid, float *out, size_t ldo) \
    {                                                                                        \
        mm_qtile(dt, ro, np, w, ldw, xq, pstride, x, ldx, d_in, n_valid, out, ldo);          \
    }
#define MM_DEFINE_QTILES_RO(dtname, dt, ro)                                                  \
    MM_DEFINE_QTILE(dtname, dt, ro, 1) MM_DEFINE_QTILE(dtname, dt, ro, 2)                    \
    MM_DEFINE_QTILE(dtname, dt, ro, 3) MM_DEFINE_QTILE(dtname, dt, ro, 4)                    \
    MM_DEFINE_QTILE(dtname, dt, ro, 5) MM_DEFINE_QTILE(dtname, dt, ro, 6)                    \
    MM_DEFINE_QTILE(dtname, dt, ro, 7) MM_DEFINE_QTILE(dtname, dt, ro, 8)                    \
    MM_DEFINE_QTILE(dtname, dt, ro, 9)
#define MM_DEFINE_QTILES(dtname, dt)                                                         \
    MM_DEFINE_QTILES_RO(dtname, dt, 4) MM_DEFINE_QTILES_RO(dtname, dt, 1)
MM_DEFINE_QTILES(bf16, KERN_DTYPE_BF16)
MM_DEFINE_QTILES(f16, KERN_DTYPE_F16)
MM_DEFINE_QTILES(f32, KERN_DTYPE_F32)

/* mm_qtiles[dtype][ro == 4][np - 1]; 4 x np is used for np <= MM_PAIRS4 only
 * (the larger ones exist to keep the table uniform). */
#define MM_QTILE_RO(dtname, ro)                                                              \
    {mm_qtile_##dtname##_##ro##x1, mm_qtile_##dtname##_##ro##x2,                             \
     mm_qtile_##dtname##_##ro##x3, mm_qtile_##dtname##_##ro##x4,                             \
     mm_qtile_##dtname##_##ro##x5, mm_qtile_##dtname##_##ro##x6,                             \
     mm_qtile_##dtname##_##ro##x7, mm_qtile_##dtname##_##ro##x8,                             \
     mm_qtile_##dtname##_##ro##x9}
#define MM_QTILE_ROW(dtname) {MM_QTILE_RO(dtname, 1), MM_QTILE_RO(dtname, 4)}
static const mm_qtile_fn mm_qtiles[3][2][MM_PAIRS] = {
    [KERN_DTYPE_BF16] = MM_QTILE_ROW(bf16),
    [KERN_DTYPE_F16] = MM_QTILE_ROW(f16),
    [KERN_DTYPE_F32] = MM_QTILE_ROW(f32),
};

/* Floats of packed pairs for n rows of length d_in (see mm_pack_pairs). */
static size_t mm_pairs_floats(int n, int d_in)
{
    return (size_t)((n + 1) / 2) * 2 * (size_t)(d_in & ~7);
}

/* Packs the first len8 columns of n input rows in pairs: pair p is
 * xq[p * 2 * len8 ...], k-step by k-step 16 floats, row 2p's eight then row
 * 2p+1's eight (row 2p's again when n is odd and 2p+1 == n). */
static void mm_pack_pairs(const float *in, int n, int d_in, float *xq)
{
    const size_t len8 = (size_t)(d_in & ~7);
    for (int p = 0; p < (n + 1) / 2; p++) {
        const float *r0 = in + (size_t)(2 * p) * (size_t)d_in;
        const float *r1 = 2 * p + 1 < n ? r0 + d_in : r0;
        float *q = xq + (size_t)p * 2 * len8;
        for (size_t k = 0; k < len8; k += 8) {
            memcpy(q + 2 * k, r0 + k, 8 * sizeof(float));
            memcpy(q + 2 * k + 8, r1 + k, 8 * sizeof(float));
        }
    }
}

/* mm_block for n >= 2 with packed pairs: `ro` (MM_RO or 1) weight rows
 * applied to the pairs in as few groups as fit in registers (sizes as even
 * as can be): up to 2 * MM_PAIRS4 input rows, each weight row is read from
 * memory once and applied to all of them while in registers; more rows find
 * the block in L1/L2 on the later groups. (Splitting the 4 weight rows into
 * two 2-row passes instead, to keep more pairs per tile, measured slower:
 * every input vector is then loaded twice as often.) */
static void mm_block_pairs(const struct mm_job *job, enum kern_dtype dt, const void *w, int ro,
                           int o0)
{
    const size_t d_in = (size_t)job->d_in, d_out = (size_t)job->d_out;
    const size_t pstride = 2 * (d_in & ~(size_t)7);
    const int n = job->n, np_all = (n + 1) / 2;
    const int max_pairs = ro == MM_RO ? MM_PAIRS4 : MM_PAIRS;
    const int n_groups = (np_all + max_pairs - 1) / max_pairs;
    for (int g = 0, p0 = 0; g < n_groups; g++) {
        const int np = np_all / n_groups + (g < np_all % n_groups);
        const int b0 = 2 * p0, n_valid = n - b0 < 2 * np ? n - b0 : 2 * np;
        mm_qtiles[dt][ro == MM_RO][np - 1](w, d_in, job->xq + (size_t)p0 * pstride, pstride,
                                            job->in + (size_t)b0 * d_in, d_in, job->d_in,
                                            n_valid, job->out + (size_t)b0 * d_out + (size_t)o0,
                                            d_out);
        p0 += np;
    }
}
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__)
/* The output-pair path (AVX-512F+BW; n below the input pairs' MM_IPAIRS_MIN:
 * decode and short speculative verifications). One 512-bit
 * accumulator holds two outputs of the same input row: lanes 0-7 the eight
 * lane accumulators of (weight row a, input row b), lanes 8-15 those of
 * (weight row a+1, input row b). Each half sees exactly the FMAs, in the
 * same order, as the 256-bit accumulator of mm_tile would (FMA is lane by
 * lane), is folded with cpu_simd_hsum8 and finished with the scalar tail:
 * the bits are the fixed order's, only half as many FMAs issue and no lane
 * is idle, whatever n.
 * Against the input pairs (each weight chunk widened and duplicated into
 * both halves), the widening costs one uop per 16 weights instead of two
 * (vpmovzxwd + vpslld) per 8: bf16 rows are read 64 bytes (32 weights) at a
 * time, and one zero-masked vpermi2w per chunk moves eight weights of row a
 * and eight of row a+1 into the high halves of the sixteen dwords (bf16 ->
 * f32 is that shift, exact). The input chunk reaches both halves through the
 * load itself (vbroadcastf32x8), so the inputs need no packing and an odd n
 * fills every register. Per 16 weights and input row that is one FMA and one
 * load; the FMAs bound the path from about 5 rows up (tools/bench_kernels
 * --hot), the memory stream below.
 * A tile is the MM_RO = 4 weight rows of a task block (2 pairs) against all
 * the input rows (at most MM_OI = 5: 10 accumulators, 4 raw weight vectors,
 * the widened pair and an input vector in registers; with 12 input rows, 24
 * accumulators, GCC spilled in the loop), so every weight is streamed from
 * memory once.
 * The software prefetch MM_PF weights ahead of each row's stream measured
 * 3-15% faster at n = 1 and 15-30% at n = 2..5 (one thread, the Llama-1B
 * shapes) than the hardware prefetchers alone: a block's four rows are four
 * streams only one page (d_in = 2048) or four long, which the prefetchers
 * pick up late, page after page. Near a row's end it runs on into the same
 * row of the next block (mm_otile's pf_next), and in k-blocks it fetches
 * the next tile's columns: against prefetching each row's own next KiB
 * (which at a row's end touched the next row, fetched anyway), the Llama-1B
 * shapes at one row took 5-25% less time, the 2048 x 128256 head at 2 and 5
 * rows 9-15% less (2 threads, tools/bench_kernels, alternating binaries).
 * Past the matrix a prefetch never faults. */
#define MM_OI (MM_IPAIRS_MIN - 1)
/* The output pairs' k-blocks (mm_blocks_opairs_kb): 512 columns (5 input
 * rows of it are 10 KiB) measured best against 256, 1024 and 2048 at
 * d_in = 8192, 1 to 5 rows. */
#define MM_OKB 512
#define MM_OKB_BLOCKS 16 /* weight row blocks per k-block sweep */
/* Rows up to this long stay whole at 2 to 5 input rows. Since the whole-row
 * prefetch runs into the next block (d5f3cf8), whole rows took 5-18% less
 * time than k-blocks at d_in = 768 and 2048, 2 to 5 rows (768 x 128256,
 * 768 -> 2048, 2048 -> 768, 2048 -> 8192, 2048 x 128256; 2 threads,
 * tools/bench_kernels, 3 alternating runs, best of each), which puts 2 rows
 * at 1.02-1.10x one row and 5 rows at 1.14-1.21x; at d_in = 3072 and 4096
 * they were 0-7% slower, at 8192 5-8% slower (5 input rows of 8192 no
 * longer fit in L1). */
#define MM_OKB_MIN_DIN 2048

/* vpermi2w word indices, [dtype is f16][chunk c]: bf16: word 2i+1 of the
 * result (the high half of dword i) takes word 8c+i of row a (table a, words
 * 0..31) for i < 8 and word 8c+i-8 of row a+1 (table b, words 32..63) for
 * i >= 8; the even words are zeroed by the mask. f16: words 0-15 of the
 * result take the same words, packed, for vcvtph2ps. */
#define MM_OX(c, i) ((i) < 8 ? 8 * (c) + (i) : 32 + 8 * (c) + (i) - 8)
#define MM_OX_BF16(c)                                                                        \
    {0, MM_OX(c, 0),  0, MM_OX(c, 1),  0, MM_OX(c, 2),  0, MM_OX(c, 3),                      \
     0, MM_OX(c, 4),  0, MM_OX(c, 5),  0, MM_OX(c, 6),  0, MM_OX(c, 7),                      \
     0, MM_OX(c, 8),  0, MM_OX(c, 9),  0, MM_OX(c, 10), 0, MM_OX(c, 11),                     \
     0, MM_OX(c, 12), 0, MM_OX(c, 13), 0, MM_OX(c, 14), 0, MM_OX(c, 15)}
#define MM_OX_F16(c)                                                                         \
    {MM_OX(c, 0),  MM_OX(c, 1),  MM_OX(c, 2),  MM_OX(c, 3),  MM_OX(c, 4),  MM_OX(c, 5),      \
     MM_OX(c, 6),  MM_OX(c, 7),  MM_OX(c, 8),  MM_OX(c, 9),  MM_OX(c, 10), MM_OX(c, 11),     \
     MM_OX(c, 12), MM_OX(c, 13), MM_OX(c, 14), MM_OX(c, 15)}
static const uint16_t mm_ox_idx[2][4][32] __attribute__((aligned(64))) = {
    {MM_OX_BF16(0), MM_OX_BF16(1), MM_OX_BF16(2), MM_OX_BF16(3)},
    {MM_OX_F16(0), MM_OX_F16(1), MM_OX_F16(2), MM_OX_F16(3)},
};

/* Chunk c (0..3) of the 32-column block whose raw 16-bit weights of rows a
 * and a+1 are in ra and rb, widened: row a's eight in lanes 0-7, row a+1's
 * in lanes 8-15. */
CPU_SIMD_INLINE __m512 mm_owiden(enum kern_dtype dt, __m512i ra, __m512i rb, int c)
{
    const __m512i idx = _mm512_load_si512((const void *)mm_ox_idx[dt == KERN_DTYPE_F16][c]);
    if (dt == KERN_DTYPE_BF16)
        return _mm512_castsi512_ps(_mm512_maskz_permutex2var_epi16(0xAAAAAAAAu, ra, idx, rb));
    return _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutex2var_epi16(ra, idx, rb)));
}

/* One column block of up to 32 columns from k (nc chunks of 8, nc <= 4; a
 * compile-time 4 in the main loop): acc[p][b] += pair p of w x input row b. */
CPU_SIMD_INLINE void mm_oblock(enum kern_dtype dt, int np, int ri, const void *const *wr,
                               ptrdiff_t pf_lead, const float *x, size_t ldx, size_t k,
                               int nc, __m512 acc[2][MM_OI])
{
    __m512i raw[2][2];
    if (dt != KERN_DTYPE_F32) {
        const __mmask32 m = nc == 4 ? 0xFFFFFFFFu : (1u << (8 * nc)) - 1;
#pragma GCC unroll 2
        for (int p = 0; p < np; p++)
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                raw[p][h] = _mm512_maskz_loadu_epi16(m, (const uint16_t *)wr[2 * p + h] + k);
                /* an address, not a pointer: it may lie past the matrix */
                _mm_prefetch(
                    (const char *)((uintptr_t)wr[2 * p + h] + (uintptr_t)pf_lead + 2 * k),
                    _MM_HINT_T0);
            }
    }
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        if (c >= nc)
            break;
        __m512 wv[2];
#pragma GCC unroll 2
        for (int p = 0; p < np; p++) {
            if (dt == KERN_DTYPE_F32)
                wv[p] = _mm512_insertf32x8(
                    _mm512_castps256_ps512(_mm256_loadu_ps((const float *)wr[2 * p] + k + 8 * c)),
                    _mm256_loadu_ps((const float *)wr[2 * p + 1] + k + 8 * c), 1);
            else
                wv[p] = mm_owiden(dt, raw[p][0], raw[p][1], c);
        }
#pragma GCC unroll 5
        for (int b = 0; b < ri; b++) {
            __m512 xv = _mm512_broadcast_f32x8(_mm256_loadu_ps(x + (size_t)b * ldx + k + 8 * c));
#pragma GCC unroll 2
            for (int p = 0; p < np; p++)
                acc[p][b] = _mm512_fmadd_ps(wv[p], xv, acc[p][b]);
        }
    }
}

/* One tile: out[b*ldo + a] = dot(weight row wr[a], x row b) for a < rows and
 * b < ri; np = (rows + 1) / 2 pairs, wr[] holding 2 * np rows (a row repeated
 * where rows is odd; its duplicate half is computed and dropped).
 * Columns k0 .. k1 only (k0 a multiple of 32; k1 too, or d_in): a tile cut
 * into k-blocks parks its accumulators in park (np * MM_OI vectors) between
 * them and writes out only at the last (k1 == d_in). With park NULL the
 * range is the whole row. Each accumulator sees the same FMAs in the same
 * order either way.
 * Each weight row's prefetch runs pf_lead bytes ahead of its reads. Once
 * that runs past a row's end it would land in the next row, which that
 * row's own stream fetches anyway; with pf_next (whole rows) it moves
 * pf_next bytes further then, into the same row of the block read next. */
CPU_SIMD_INLINE void mm_otile(enum kern_dtype dt, int np, int ri, const void *const *wr,
                              int rows, const float *x, size_t ldx, int d_in, size_t k0,
                              size_t k1, ptrdiff_t pf_lead, size_t pf_next, __m512 *park,
                              float *out, size_t ldo)
{
    /* the first 32-column step whose prefetch is past the row's end */
    const size_t lead_k = pf_lead > 0 ? (size_t)pf_lead / 2 : 0;
    const size_t k_past = (size_t)d_in > lead_k ? ((size_t)d_in - lead_k + 31) & ~(size_t)31 : 0;
    const size_t k_shift = pf_next == 0 ? SIZE_MAX : k_past > k0 ? k_past : k0;
    const size_t len8 = (size_t)(d_in & ~7), len32 = (size_t)(d_in & ~31);
    const size_t end32 = k1 < len32 ? k1 : len32;
    __m512 acc[2][MM_OI];
#pragma GCC unroll 2
    for (int p = 0; p < np; p++)
#pragma GCC unroll 5
        for (int b = 0; b < ri; b++)
            acc[p][b] = park != NULL && k0 > 0 ? park[p * MM_OI + b] : _mm512_setzero_ps();
    for (size_t k = k0; k < end32; k += 32) {
        if (k == k_shift)
            pf_lead += (ptrdiff_t)pf_next;
        mm_oblock(dt, np, ri, wr, pf_lead, x, ldx, k, 4, acc);
    }
    if (k1 < (size_t)d_in) {
#pragma GCC unroll 2
        for (int p = 0; p < np; p++)
#pragma GCC unroll 5
            for (int b = 0; b < ri; b++)
                park[p * MM_OI + b] = acc[p][b];
        return;
    }
    if (len8 > len32)
        mm_oblock(dt, np, ri, wr, pf_lead, x, ldx, len32, (int)(len8 - len32) / 8, acc);
    /* Constant indices only (unrolled loops; rows is checked, not looped
     * over): an accumulator indexed at run time would keep acc[] in memory,
     * and GCC then stores every accumulator on each trip of the loops above. */
#pragma GCC unroll 2
    for (int p = 0; p < np; p++)
#pragma GCC unroll 5
        for (int b = 0; b < ri; b++)
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                const int a = 2 * p + h;
                if (a >= rows)
                    break;
                const __m256 half = h ? _mm256_castpd_ps(_mm512_extractf64x4_pd(
                                            _mm512_castps_pd(acc[p][b]), 1))
                                      : _mm512_castps512_ps256(acc[p][b]);
                float sum = cpu_simd_hsum8(half);
                for (int k = (int)len8; k < d_in; k++)
                    sum = fmaf(mm_load1(dt, wr[a], (size_t)k), x[(size_t)b * ldx + (size_t)k],
                               sum);
                out[(size_t)b * ldo + (size_t)a] = sum;
            }
}

typedef void (*mm_otile_fn)(const void *const *wr, int rows, const float *x, size_t ldx,
                            int d_in, size_t k0, size_t k1, ptrdiff_t pf_lead, size_t pf_next,
                            __m512 *park, float *out, size_t ldo);

#define MM_DEFINE_OTILE(dtname, dt, np, ri)                                                  \
    static void mm_otile_##dtname##_##np##x##ri(const void *const *wr, int rows,             \
                                                const float *x, size_t ldx, int d_in,        \
                                                size_t k0, size_t k1, ptrdiff_t pf_lead,     \
                                                size_t pf_next, __m512 *park, float *out,    \
                                                size_t ldo)                                  \
    {                                                                                        \
        mm_otile(dt, np, ri, wr, rows, x, ldx, d_in, k0, k1, pf_lead, pf_next, park, out,   \
                 ldo);                                                                       \
    }
#define MM_DEFINE_OTILES_NP(dtname, dt, np)                                                  \
    MM_DEFINE_OTILE(dtname, dt, np, 1) MM_DEFINE_OTILE(dtname, dt, np, 2)                    \
    MM_DEFINE_OTILE(dtname, dt, np, 3) MM_DEFINE_OTILE(dtname, dt, np, 4)                    \
    MM_DEFINE_OTILE(dtname, dt, np, 5)
#define MM_DEFINE_OTILES(dtname, dt)                                                         \
    MM_DEFINE_OTILES_NP(dtname, dt, 1) MM_DEFINE_OTILES_NP(dtname, dt, 2)
MM_DEFINE_OTILES(bf16, KERN_DTYPE_BF16)
MM_DEFINE_OTILES(f16, KERN_DTYPE_F16)
MM_DEFINE_OTILES(f32, KERN_DTYPE_F32)

/* mm_otiles[dtype][np - 1][ri - 1] */
#define MM_OTILE_NP(dtname, np)                                                              \
    {mm_otile_##dtname##_##np##x1,  mm_otile_##dtname##_##np##x2,                            \
     mm_otile_##dtname##_##np##x3,  mm_otile_##dtname##_##np##x4,                            \
     mm_otile_##dtname##_##np##x5}
#define MM_OTILE_ROW(dtname) {MM_OTILE_NP(dtname, 1), MM_OTILE_NP(dtname, 2)}
static const mm_otile_fn mm_otiles[3][2][MM_OI] = {
    [KERN_DTYPE_BF16] = MM_OTILE_ROW(bf16),
    [KERN_DTYPE_F16] = MM_OTILE_ROW(f16),
    [KERN_DTYPE_F32] = MM_OTILE_ROW(f32),
};

/* Weight rows o0 .. o0+rows-1 (rows <= MM_RO; w at row o0) against all
 * input rows, in as few groups of input rows as fit in registers (sizes as
 * even as can be): the first group streams the block from memory, the
 * others find it in L1/L2. */
static void mm_block_opairs(const struct mm_job *job, const void *w, int rows, int o0)
{
    const size_t d_in = (size_t)job->d_in, d_out = (size_t)job->d_out;
    const size_t row_bytes = d_in * kern_dtype_size(job->dtype);
    const void *wr[4];
    for (int a = 0; a < 4; a++) /* odd rows: the last one fills the spare half */
        wr[a] = (const char *)w + (size_t)(a < rows ? a : rows - 1) * row_bytes;
    const mm_otile_fn *fns = mm_otiles[job->dtype][(rows + 1) / 2 - 1];
    const int n = job->n, n_groups = (n + MM_OI - 1) / MM_OI;
    for (int g = 0, i = 0; g < n_groups; g++) {
        const int ri = n / n_groups + (g < n % n_groups);
        fns[ri - 1](wr, rows, job->in + (size_t)i * d_in, d_in, job->d_in, 0, d_in, job->pf_lead,
                    job->pf_next, NULL, job->out + (size_t)i * d_out + (size_t)o0, d_out);
        i += ri;
    }
}

/* The output pairs in k-blocks (job->okb columns; 2 to 5 input rows longer
 * than MM_OKB_MIN_DIN):
 * up to MM_OKB_BLOCKS weight row blocks (64 rows) take one k-block after
 * the other, their accumulators parked in between. The input rows' k-block
 * is then read from L1 by all those blocks, where whole-row tiles read rows
 * that no longer fit in L1 (2 rows of d_in = 8192 are 64 KiB) from L2 again
 * for every block; and the weights are read as 64 short runs (1 KiB of bf16
 * each) at once instead of 4 long ones. Measured against whole-row tiles in
 * the same session (tools/bench_kernels, 2 threads, best of 5, the Llama-1B
 * shapes 2048 -> 8192, 8192 -> 2048 and the 2048 x 128256 head): 2 to 4
 * rows 7-22% less time, 5 rows of 8192 14% less. One row stays on whole
 * rows: alike in that benchmark, but decoding the whole 1B-shaped model
 * (tools/bench runtime) was 12% slower with k-blocks, 17.7-18.3 against
 * 20.2-20.7 tokens/s, alternating runs. (Those figures predate the
 * whole-row prefetch into the next block; with it, rows up to
 * MM_OKB_MIN_DIN are faster whole.)
 * Each weight is still read once, and each accumulator sees the same FMAs
 * in the same order as with whole rows. */
static void mm_blocks_opairs_kb(const struct mm_job *job, long begin, long end)
{
    const size_t d_in = (size_t)job->d_in, d_out = (size_t)job->d_out;
    const size_t row_bytes = d_in * kern_dtype_size(job->dtype);
    const size_t kb = (size_t)job->okb;
    const ptrdiff_t block_bytes = (ptrdiff_t)(MM_RO * row_bytes);
    __m512 park[MM_OKB_BLOCKS][2 * MM_OI];
    for (long b0 = begin; b0 < end; b0 += MM_OKB_BLOCKS) {
        const long b1 = end - b0 < MM_OKB_BLOCKS ? end : b0 + MM_OKB_BLOCKS;
        for (size_t k0 = 0; k0 < d_in; k0 += kb) {
            const size_t k1 = d_in - k0 <= kb ? d_in : k0 + kb;
            for (long blk = b0; blk < b1; blk++) {
                const int o0 = (int)(blk * MM_RO);
                const int rows = job->d_out - o0 < MM_RO ? job->d_out - o0 : MM_RO;
                const char *w = (const char *)job->w + (size_t)o0 * row_bytes;
                const void *wr[4];
                for (int a = 0; a < 4; a++)
                    wr[a] = w + (size_t)(a < rows ? a : rows - 1) * row_bytes;
                /* Prefetch what the next tile reads: the same columns of the
                 * next block, after the sweep's last block the next k-block
                 * of its first, after the last k-block the next sweep. */
                ptrdiff_t lead;
                if (blk + 1 < b1)
                    lead = block_bytes;
                else if (k1 < d_in)
                    lead = 2 * (ptrdiff_t)kb - (ptrdiff_t)(blk - b0) * block_bytes;
                else
                    lead = block_bytes - 2 * (ptrdiff_t)k0;
                mm_otiles[job->dtype][(rows + 1) / 2 - 1][job->n - 1](
                    wr, rows, job->in, d_in, job->d_in, k0, k1, lead, 0, park[blk - b0],
                    job->out + (size_t)o0, d_out);
            }
        }
    }
}
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__)
/* The packed path: w packed by map_matrix (packed.h), any n.
 * A task is an octet of output rows: its 8 rows are one sequential run of
 * 512-byte steps, and each 64-byte line holds, in the lanes the fixed order
 * assigns, two rows' 8-column chunks 2L (high halves) and 2L + 1 (low
 * halves), made f32 by one AND or one shift. Each input row has four
 * accumulators per octet (one per row pair), so four independent FMA chains
 * where the output pairs' 4-row tile had two. With the weights in L2 (2
 * threads, 2048 x 512 and 2048 x 1024, in-process A/B against the
 * row-major output pairs) one row ran at 160 GB/s against 95: the row-major
 * tile is bound by its word permutes (one per two cycles) and by the FMA
 * latency.
 * How many octets are read side by side depends on n:
 *   - 1 row: 4 octets from separate runs of the task's range. One octet at
 *     a time was 26-35% slower than the row-major path at any prefetch lead
 *     from 0 to 16 KiB: on this VM one core's single stream does not keep
 *     enough lines in flight when there is little arithmetic per line (6
 *     octets were 5-15% slower than 4). A task is 4 octets
 *     (pk_task_octets), so a claim cuts into 4 equal runs: with tasks of
 *     one octet every claim whose length was no multiple of 4 left 1-3
 *     octets to the one-octet tile, and a small matrix's guided claims of
 *     2-3 octets were nothing else. In-process A/B (calls alternating, 2
 *     threads, cold copies, medians of 11 paired ratios; 5 rows, whose
 *     tasks stay single octets, as control at 0.99-1.03x): 1 and 2 rows of
 *     2048 -> 512 took 0.91-0.92x the time, 2 rows of 2048 -> 2048 0.95x,
 *     the larger shapes 0.93-0.99x.
 *   - 2 rows: 4 octets too, without software prefetch, 32 accumulators
 *     of which GCC keeps some on the stack (L1): 0.83-0.97x the time of 2
 *     octets with prefetch at the five 1B shapes (medians of 15 paired
 *     slices, the same n of both tiles timed side by side; the unchanged
 *     n = 1 and 3 in the same runs 0.98-1.00x). 4 octets with prefetch
 *     gained less.
 *   - 3 rows: until the rotations below, 2 octets with prefetch, whole
 *     rows. Against that (ratios of medians of 15 paired slices, 3
 *     shapes): 3 octets with prefetch 1.00-1.06x, without 1.08-1.14x; 2
 *     octets without prefetch 1.02-1.13x; 4 octets with spills 1.23-1.38x,
 *     and 1.05-1.12x with the loop reordered so that each accumulator takes
 *     a step's 4 FMAs in a row; 4 octets as two pairs taking turns on
 *     k-blocks of 32-256 columns, accumulators parked, 1.17-1.55x (each
 *     pair's next k-block not prefetched); the rotations of one octet below
 *     0.84-1.02x (median 0.89x), with 2-octet tiles in them 0.92-1.01x.
 *   - 3 rows up: one octet in a tile, all rows of a group (up to
 *     MM_PK_RI = 6: 24 accumulators and 6 inputs; the 6-row tile spills two
 *     accumulators and is still the fastest at 6 rows). From here the FMAs,
 *     not the memory, are the limit: about 7 G FMAs/s per core, so one row
 *     of 2048 -> 8192 costs 0.15x of the time the matrix takes to stream,
 *     and rows are cheap only while their FMAs run under the read. One
 *     group of 5 rows on one octet took 1.05-1.10x one row; the 2-octet
 *     tiles in groups of 3 + 2 took 1.24-1.37x: the second group's FMAs
 *     ran after the read, not under it. Past MM_PK_RI rows the groups take
 *     turns on k-blocks of MM_PK_KB columns (256; 128 and 512 were slower),
 *     the accumulators parked in between, so that the read never waits for
 *     a whole later group.
 *   - 3 to 6 rows (one group): MM_PK_ROT = 3 adjacent octets take turns on
 *     those k-blocks (mm_packed_kblocks), the accumulators parked, each
 *     octet prefetching its own next k-block (MM_PK_ROT_LEAD), and from its
 *     last the first of the octet in its place in the next rotation. A
 *     whole octet at a time is one stream per core, and from 3 or 4 rows the
 *     tile's FMAs take about as long as the read: the stream then stalls the
 *     FMAs and they it, where three streams 32 KiB apart keep the hardware
 *     prefetchers fetching for the tile. In-process A/B on a 2-core Zen 5
 *     (both versions in one process, calls alternating in rotated order,
 *     2 threads, cold packed copies, medians of 3-21 per-round ratios, 6
 *     runs a minute apart; the unchanged 2 rows as control, 0.97-1.01x):
 *     where the old one-octet tile took 1.30-1.47x one row, 4, 5 and 6 rows
 *     took 0.78-0.92x its time at 2048 -> 2048, 2048 -> 8192, 8192 -> 2048
 *     and the 2048 x 128256 head, 0.90-0.97x at 2048 -> 512 (6 rows there
 *     once 1.02x); in a minute where it took 1.18-1.25x (slower memory),
 *     0.97-1.05x. Without the prefetch into the next rotation the rotation
 *     started cold and 2048 -> 512 took 1.05-1.14x; one octet in k-blocks
 *     with the same lead (no rotation) took 1.03-1.33x; rotations of 4
 *     were no better than 3, k-blocks of 128 or 512 columns worse; the
 *     rotation of 2-group jobs (7 to 12 rows) gained at 7 and 8 rows
 *     (0.93-0.96x) but lost at 9 and 12 (1.04-1.14x). 3 rows, same A/B
 *     against the 2-octet tile, 4 runs a minute apart: 0.84-0.95x at the
 *     four larger shapes, 0.96-1.02x at 2048 -> 512.
 * In-process A/B against the 2-octet groups of 3 (both builds loaded in one
 * process, same packed weights, 2 threads, cold, best of 5): 5 rows 0.78x
 * (2048 -> 8192), 0.81-0.83x (8192 -> 2048), 0.72-0.81x (the 2048 x 128256
 * head); 9 and 17 rows 0.79-0.93x; 1 to 3 rows unchanged. Also slower:
 * half octets (2 row pairs, up to 10 input rows per tile: 1.7-1.9x one row
 * at 5 rows) and 2-octet tiles in k-blocks.
 * The row loops must unroll to MM_PK_RI (the pragmas): unrolled less, GCC
 * keeps the accumulators in memory and 6 rows take 4x as long.
 * The prefetch lead MM_PK_LEAD: 8 KiB (4 and 16 KiB, and prefetching to
 * L2, were no faster). This beats the panel path at prefill too: 64 rows of
 * 2048 -> 8192 took 5958 us against the panel's 11772 with the 2-octet
 * groups of 3, which 32-row jobs of the k-blocked groups beat by 2-3%. The
 * rows after the last full octet are row-major: mm_block reads them.
 * One row does not prefetch: its 4 octets are 4 sequential streams the
 * hardware prefetchers follow, and the 32 prefetch instructions per 2 KiB
 * step only took load slots. In-process A/B (one build, the tile switched
 * at run time, 30-40 paired 40 ms slices, medians of the ratios): without
 * them one row took 0.88-0.94x the time at 2048 -> 2048, 2048 -> 8192,
 * 8192 -> 2048 and the head in 3 runs of 4 (in the other, 1.00x), and a
 * 1B-shaped decode step 0.92-0.96x in 3 runs of 3. Nor do 2 rows on 4
 * octets. From 3 rows (2 streams, or 1) dropping them cost 1.1-1.9x; 4 and
 * 5 rows on 2 octets with prefetch were no faster than on one. */
#define MM_PK_LEAD 8192
#define MM_PK_STREAMS 4   /* octets read side by side at 1 and 2 input rows */
#define MM_PK_RI 6        /* most input rows per one-octet tile */
#define MM_PK_KB 256      /* columns per k-block from MM_PK_ONE_FROM rows */
#define MM_PK_JOB_ROWS 32 /* input rows per job (more: several jobs) */
#define MM_PK_ONE_FROM 3  /* one octet per tile from this many input rows */
#define MM_PK_RI_MIN 3    /* ... the fewest rows a group then has (3; 7 rows: 4 + 3) */
#define MM_PK_ROT 3       /* octets taking turns on k-blocks at one group of rows */
/* each octet's prefetch in a rotation: its next k-block */
#define MM_PK_ROT_LEAD (MM_PK_KB * CPU_PACKED_STEP_BYTES / CPU_PACKED_STEP)

/* Columns [k_begin, k_end) of q_streams octets (their first bytes in
 * octets[]) against ri input rows. prefetch: whether this tile prefetches
 * its octets, lead bytes ahead of its reads (the later groups of a k-block
 * find it in L1). park: NULL for whole rows; else the accumulators live
 * there between k-blocks (loaded unless first, stored unless last), which
 * changes no bit. */
CPU_SIMD_INLINE void mm_pktile(int q_streams, int ri, int prefetch, const char *const *octets,
                               size_t k_begin, size_t k_end, size_t lead, const float *x,
                               size_t ldx, __m512 *park, int first, int last, float *const *outs,
                               size_t ldo)
{
    __m512 acc[MM_PK_STREAMS][4][MM_PK_RI];
#pragma GCC unroll 4
    for (int q = 0; q < q_streams; q++)
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++)
#pragma GCC unroll 6
            for (int b = 0; b < ri; b++)
                acc[q][p][b] = park && !first ? park[(q * 4 + p) * ri + b] : _mm512_setzero_ps();
    const __m512i high = _mm512_set1_epi32((int)0xFFFF0000u);
    const char *o[MM_PK_STREAMS];
#pragma GCC unroll 4
    for (int q = 0; q < q_streams; q++)
        o[q] = octets[q] + k_begin * (CPU_PACKED_STEP_BYTES / CPU_PACKED_STEP);
    for (size_t k = k_begin; k < k_end; k += CPU_PACKED_STEP) {
        if (prefetch) {
#pragma GCC unroll 4
            for (int q = 0; q < q_streams; q++)
#pragma GCC unroll 8
                for (int l = 0; l < CPU_PACKED_STEP_BYTES / 64; l++)
                    /* an address, not a pointer: it may lie past the matrix */
                    _mm_prefetch((const char *)((uintptr_t)o[q] + lead + 64 * (uintptr_t)l),
                                 _MM_HINT_T0);
        }
#pragma GCC unroll 2
        for (int line = 0; line < 2; line++)
#pragma GCC unroll 2
            for (int low = 0; low < 2; low++) {
                const size_t kc = k + 16 * (size_t)line + 8 * (size_t)low;
                __m512 xv[MM_PK_RI];
#pragma GCC unroll 6
                for (int b = 0; b < ri; b++)
                    xv[b] = _mm512_broadcast_f32x8(_mm256_loadu_ps(x + (size_t)b * ldx + kc));
#pragma GCC unroll 4
                for (int q = 0; q < q_streams; q++)
#pragma GCC unroll 4
                    for (int p = 0; p < 4; p++) {
                        const __m512i raw =
                            _mm512_load_si512((const void *)(o[q] + 128 * p + 64 * line));
                        const __m512 wv = _mm512_castsi512_ps(
                            low ? _mm512_slli_epi32(raw, 16) : _mm512_and_si512(raw, high));
#pragma GCC unroll 6
                        for (int b = 0; b < ri; b++)
                            acc[q][p][b] = _mm512_fmadd_ps(wv, xv[b], acc[q][p][b]);
                    }
            }
#pragma GCC unroll 4
        for (int q = 0; q < q_streams; q++)
            o[q] += CPU_PACKED_STEP_BYTES;
    }
    if (park && !last) {
#pragma GCC unroll 4
        for (int q = 0; q < q_streams; q++)
#pragma GCC unroll 4
            for (int p = 0; p < 4; p++)
#pragma GCC unroll 6
                for (int b = 0; b < ri; b++)
                    park[(q * 4 + p) * ri + b] = acc[q][p][b];
        return;
    }
#pragma GCC unroll 4
    for (int q = 0; q < q_streams; q++)
#pragma GCC unroll 4
        for (int p = 0; p < 4; p++)
#pragma GCC unroll 6
            for (int b = 0; b < ri; b++) {
                float *y = outs[q] + (size_t)b * ldo + (size_t)(2 * p);
                y[0] = cpu_simd_hsum8(_mm512_castps512_ps256(acc[q][p][b]));
                y[1] = cpu_simd_hsum8(_mm256_castpd_ps(
                    _mm512_extractf64x4_pd(_mm512_castps_pd(acc[q][p][b]), 1)));
            }
}

typedef void (*mm_pktile_fn)(const char *const *octets, size_t k_begin, size_t k_end,
                             size_t lead, const float *x, size_t ldx, __m512 *park, int first,
                             int last, float *const *outs, size_t ldo);
#define MM_DEFINE_PKTILE(q, ri, prefetch, sfx)                                              \
    static void mm_pktile_##q##x##ri##sfx(const char *const *octets, size_t k_begin,          \
                                          size_t k_end, size_t lead, const float *x,          \
                                          size_t ldx, __m512 *park, int first, int last,      \
                                          float *const *outs, size_t ldo)                     \
    {                                                                                        \
        mm_pktile(q, ri, prefetch, octets, k_begin, k_end, lead, x, ldx, park, first, last,  \
                  outs, ldo);                                                                \
    }
MM_DEFINE_PKTILE(4, 1, 0, )
MM_DEFINE_PKTILE(4, 2, 0, )
MM_DEFINE_PKTILE(1, 1, 1, _p)
MM_DEFINE_PKTILE(1, 2, 1, _p)
#define MM_DEFINE_PKTILES_KB(ri) MM_DEFINE_PKTILE(1, ri, 1, _p) MM_DEFINE_PKTILE(1, ri, 0, )
MM_DEFINE_PKTILES_KB(3)
MM_DEFINE_PKTILES_KB(4)
MM_DEFINE_PKTILES_KB(5)
MM_DEFINE_PKTILES_KB(6)
/* one octet, whole rows, prefetching: the rows after the 4-octet runs of 1
 * or 2 input rows; [ri - 1] */
static const mm_pktile_fn mm_pktiles_tail[2] = {mm_pktile_1x1_p, mm_pktile_1x2_p};
/* one octet over a k-block, [prefetching][ri - MM_PK_RI_MIN] */
static const mm_pktile_fn mm_pktiles_kb[2][MM_PK_RI - MM_PK_RI_MIN + 1] = {
    {mm_pktile_1x3, mm_pktile_1x4, mm_pktile_1x5, mm_pktile_1x6},
    {mm_pktile_1x3_p, mm_pktile_1x4_p, mm_pktile_1x5_p, mm_pktile_1x6_p},
};

/* q_streams octets (MM_PK_STREAMS or 1; their first bytes in octets[],
 * blks their indices) against the job's 1 or 2 input rows, whole rows. */
static void mm_packed_step(const struct mm_job *job, int q_streams, const char *const *octets,
                           const long *blks)
{
    const size_t d_in = (size_t)job->d_in, d_out = (size_t)job->d_out;
    const int n = job->n;
    float *outs[MM_PK_STREAMS];
    for (int q = 0; q < q_streams; q++)
        outs[q] = job->out + (size_t)blks[q] * CPU_PACKED_ROWS;
    const mm_pktile_fn tile = q_streams == 1 ? mm_pktiles_tail[n - 1]
                              : n == 1       ? mm_pktile_4x1
                                             : mm_pktile_4x2;
    tile(octets, 0, d_in, MM_PK_LEAD, job->in, d_in, NULL, 1, 1, outs, d_out);
}

/* Octets [o_begin, o_end), all packed, against 1 or 2 input rows:
 * MM_PK_STREAMS runs of the range walked in lockstep, then what is left one
 * by one. */
static void mm_packed_octets(const struct mm_job *job, long o_begin, long o_end)
{
    const size_t octet_bytes = CPU_PACKED_ROWS * 2 * (size_t)job->d_in;
    const long run = (o_end - o_begin) / MM_PK_STREAMS;
    const char *w = job->w;
    for (long i = 0; i < run; i++) {
        const char *octets[MM_PK_STREAMS];
        long blks[MM_PK_STREAMS];
        for (int q = 0; q < MM_PK_STREAMS; q++) {
            blks[q] = o_begin + (long)q * run + i;
            octets[q] = w + (size_t)blks[q] * octet_bytes;
        }
        mm_packed_step(job, MM_PK_STREAMS, octets, blks);
    }
    for (long blk = o_begin + MM_PK_STREAMS * run; blk < o_end; blk++) {
        const char *octet = w + (size_t)blk * octet_bytes;
        mm_packed_step(job, 1, &octet, &blk);
    }
}

/* Octets [o_begin, o_end), all packed, against n >= MM_PK_ONE_FROM input
 * rows, in k-blocks of MM_PK_KB columns: on each octet's k-block the groups
 * of input rows take turns, the first prefetching; one group: MM_PK_ROT
 * adjacent octets take turns on each k-block (see the packed path). The
 * accumulators are parked between k-blocks (no bit changes). */
static void mm_packed_kblocks(const struct mm_job *job, long o_begin, long o_end)
{
    const size_t d_in = (size_t)job->d_in, d_out = (size_t)job->d_out;
    const size_t octet_bytes = CPU_PACKED_ROWS * 2 * d_in;
    const size_t col_bytes = CPU_PACKED_STEP_BYTES / CPU_PACKED_STEP; /* an octet's column */
    const int n = job->n, n_groups = (n + MM_PK_RI - 1) / MM_PK_RI;
    const int rot = n_groups == 1 ? MM_PK_ROT : 1;
    __m512 park[MM_PK_ROT][(MM_PK_JOB_ROWS + MM_PK_RI - 1) / MM_PK_RI][4 * MM_PK_RI];
    for (long o0 = o_begin; o0 < o_end; o0 += rot) {
        const int n_octets = o_end - o0 < rot ? (int)(o_end - o0) : rot;
        for (size_t k0 = 0; k0 < d_in; k0 += MM_PK_KB) {
            const size_t k1 = d_in - k0 < MM_PK_KB ? d_in : k0 + MM_PK_KB;
            /* each octet's next k-block; from the last, the first of the
             * octet in its place in the next rotation */
            const size_t lead = rot == 1    ? MM_PK_LEAD
                                : k1 < d_in ? MM_PK_ROT_LEAD
                                            : (size_t)rot * octet_bytes - k0 * col_bytes;
            for (int q = 0; q < n_octets; q++) {
                const char *octet = (const char *)job->w + (size_t)(o0 + q) * octet_bytes;
                for (int g = 0, i = 0; g < n_groups; g++) {
                    const int ri = n / n_groups + (g < n % n_groups);
                    float *out =
                        job->out + (size_t)i * d_out + (size_t)(o0 + q) * CPU_PACKED_ROWS;
                    mm_pktiles_kb[g == 0][ri - MM_PK_RI_MIN](&octet, k0, k1, lead,
                                                             job->in + (size_t)i * d_in, d_in,
                                                             park[q][g], k0 == 0, k1 == d_in,
                                                             &out, d_out);
                    i += ri;
                }
            }
        }
    }
}

/* Tasks of the packed path: job->pk_task_octets octets of output rows each. */
static void mm_task_packed(void *ctx, long begin, long end, int thread_idx)
{
    const struct mm_job *job = ctx;
    const size_t row_bytes = 2 * (size_t)job->d_in;
    const int n = job->n;
    (void)thread_idx;
    const long n_octets = (job->d_out + CPU_PACKED_ROWS - 1) / CPU_PACKED_ROWS;
    begin *= job->pk_task_octets;
    end = end * job->pk_task_octets < n_octets ? end * job->pk_task_octets : n_octets;
    const long packed_end = job->packed_rows / CPU_PACKED_ROWS;
    const long o_end = end < packed_end ? end : packed_end;
    if (begin < o_end && n >= MM_PK_ONE_FROM)
        mm_packed_kblocks(job, begin, o_end);
    else if (begin < o_end)
        mm_packed_octets(job, begin, o_end);
    /* the rows after the last full octet, row-major */
    for (long blk = begin > packed_end ? begin : packed_end; blk < end; blk++) {
        const int o0 = (int)(blk * CPU_PACKED_ROWS);
        const int rows = job->d_out - o0 < CPU_PACKED_ROWS ? job->d_out - o0 : CPU_PACKED_ROWS;
        const char *w = (const char *)job->w + (size_t)o0 * row_bytes;
        for (int r = 0; r < rows;) {
            const int ro = rows - r >= MM_RO ? MM_RO : 1;
            mm_block(job, job->dtype, w + (size_t)r * row_bytes, ro, o0 + r);
            r += ro;
        }
    }
}
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__)
/* The panel path (see mm_use_panel; up to MM_PANEL_MAX input rows per job,
 * more rows run as several jobs). A task is a panel of up to MM_PR output rows, swept in
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
 * power of two, would fall into the same L1 sets). */

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
static int mm_panel_kb(int n)
{
    int kb = (int)(MM_PXP_BYTES / sizeof(float)) / n & ~63;
    return kb < 128 ? 128 : kb > 2048 ? 2048 : kb;
}

/* Packs the input's first len8 columns k-block by k-block:
 * xp[kb][i][0 .. pkb) = in[i][kb * pkb ...]. */
static void mm_pack_inputs(const float *in, int n, int d_in, int pkb, float *xp)
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
static size_t mm_panel_private_bytes(int n, int pkb)
{
    return (size_t)n * MM_PR * sizeof(__m256) + (size_t)3 * ((size_t)pkb + 16) * sizeof(float);
}

static size_t mm_panel_xp_floats(int n, int d_in, int pkb)
{
    return (size_t)n * (size_t)(((d_in & ~7) + pkb - 1) / pkb * pkb);
}
#endif

/* Which path computes n rows of length d_in: all give the same bits, so
 * this is only a speed choice.
 * With AVX-512F+BW (the output and input pairs up to MM_PAIRED_MAX rows,
 * split at MM_IPAIRS_MIN): the input pairs were measured faster than the
 * panel at every n = 2..17 and Llama-1B shape (2-core Zen 5 VM, 2 threads),
 * up to 1.5-2x at n >= 9, because every weight is read once for up to 12
 * rows and applied with half the FMAs; the output pairs beat the input pairs
 * below 9 rows. The panel keeps prefill (n > 17), where converting each
 * weight once and k-blocking the inputs in L1 pay off.
 * AVX2 only, until the change below: the same split. On a 2-core Zen 3 (2
 * threads), the direct path's 2-row tiles with their prefetch (mm_block_w2,
 * mm_prefetch_ahead) beat the panel at every n = 4..17 and Llama-1B shape
 * (tools/bench_kernels, n rows against one, two runs each way alternating):
 * 4 rows 1.09-1.13x against 1.35-1.54x, 7 rows 1.60-1.93x against
 * 1.79-2.03x, 17 rows 3.04-3.30x against 3.63-4.06x (d_in 2048) and
 * 3.21-3.68x against 4.55x (d_in 8192). Before the prefetch the panel won at
 * n = 4 and from n = 7 at d_in 2048. Prefill (n > 17) stayed on the panel
 * then, unmeasured against the 2-row tiles (tools/bench_kernels stops at 17
 * rows); since measured:
 * AVX2 without AVX-512F+BW: no panel; prefill goes to the direct path too,
 * in jobs of MM_DIRECT_JOB_ROWS input rows (mm_block_w2's groups taking
 * turns on each pair of weight rows). Against the panel on the same 2-core
 * Zen 3 (2 threads, bf16, cold weights, one build switched at run time,
 * paired calls alternating, medians of 9 ratios, 3 at 128-512 rows), at
 * 18, 32 and 64 rows: 0.72-0.81x the time at 2048 -> 2048, 2048 -> 512,
 * 2048 -> 8192, 8192 -> 2048 and 2048 -> 16384; in one job, 128 to 512
 * rows 0.74-0.85x, but 512 rows of 8192 (16 MiB of inputs against every
 * pair of weight rows) 0.97x, and a row cost 0.32-0.34 ms up to 64 rows,
 * 0.34-0.45 from 128 at 2048 -> 8192 and 8192 -> 2048: hence the jobs.
 * The panel stays with AVX-512F+BW, where the input pairs above are not
 * measured against it at prefill (nor is it used for packed weights). */
#ifdef __AVX2__
#define MM_PAIRED_MAX 17 /* the largest verification: K = 16 drafts + 1 */
#define MM_DIRECT_JOB_ROWS 64 /* AVX2 without AVX-512F+BW: input rows per direct job */
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__)
static int mm_use_panel(int n)
{
    return n > MM_PAIRED_MAX;
}
#endif

#ifdef __AVX2__
/* Up to MM_RI input rows (AVX2) over the blocks [begin, end): the range's
 * rows cut into `ro` runs of equal length (MM_RO_ONE at one input row,
 * MM_RO at two or three), each tile taking the next row of every run, so
 * that the tile's weight streams go on through consecutive rows instead of
 * all ending with a row; the rows left after the runs go through mm_block.
 * Why: at 2048 columns a row is 4 KiB, and a tile over adjacent rows
 * started all its streams afresh at every tile. A run of rows is one
 * sequential stream, which the hardware prefetchers keep ahead of the
 * reads across rows. Against adjacent rows on a 2-core Zen 3 (2 threads,
 * bf16, cold weights, one build switched at run time, paired calls
 * alternating, medians of 40 ratios): one row took 0.90-0.94x the time at
 * 2048 -> 2048, 2048 -> 512, 2048 -> 8192 and the 2048 x 128256 head and
 * 0.99x at 8192 -> 2048; 2 and 3 rows, against the 4 x n tiles that
 * prefetched the next block, 0.85-0.92x at all five shapes; a Llama-1B
 * decode step 0.91-0.93x in 3 runs. Claims of 32 or 64 blocks instead of
 * 16 changed nothing (0.99-1.05x). From 4 rows runs did not pay: the 2 x n
 * tiles (mm_block_w2) over two runs were mixed, 0.85x to 1.06x, and the
 * 4 x n tiles over four runs in groups of up to 3 input rows took 1.02-1.27x
 * the time of the 2 x n tiles at 4 to 9 rows (0.95-1.01x at 2048 -> 512
 * only), so those keep adjacent rows and their prefetch. */
static void mm_task_runs(const struct mm_job *job, long begin, long end)
{
    const enum kern_dtype dt = job->dtype;
    const int n = job->n;
    const int ro = n == 1 ? MM_RO_ONE : MM_RO;
    const mm_tile_fn tile = n == 1 ? mm_tiles_one[dt] : mm_tiles[dt][1][n - 1];
    const size_t d_in = (size_t)job->d_in, d_out = (size_t)job->d_out;
    const size_t row_bytes = d_in * kern_dtype_size(dt);
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
#define MM_KB_ROWS_MIN MM_DIRECT_JOB_ROWS /* prefill: jobs of this many rows take k-blocks */
#define MM_KB_MIN_DIN 2048 /* ... with rows this long: a group of 6 is 48 KiB, more than L1 */
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
 * mm_block_w2's does (its pairs come from memory). Measured on a 2-core
 * Zen 3 (2 threads, bf16, one build switched at run time, paired calls
 * alternating, medians of 9 ratios), 64 rows against mm_block_w2:
 * 0.89-0.94x the time at 2048 -> 2048, 0.94-0.97x at 2048 -> 8192,
 * 0.89-0.95x at 8192 -> 2048, 0.97-1.05x at 2048 -> 512; a 128- and a
 * 256-token prefill of the Llama-1B shape (medians of 5 paired prefills):
 * 0.85-0.91x. With fewer rows the pairs' second reads from L2 cost more
 * than the inputs' reads save: 18 and 32 rows took 1.00-1.18x the time,
 * so verifications (n <= 17) and a prefill's last, shorter job keep
 * mm_block_w2. So do rows shorter than MM_KB_MIN_DIN, whose group fits L1
 * whole: 64 rows of 384 to 1024 columns took 1.02-1.9x the time. Claims
 * capped at 256 KiB of weight rows (so that they stay
 * in L2 for every group at 8192 columns) were slower at 8192 -> 2048
 * (1.08x), and k-blocks of 256 or 1024 columns no better than 512. */
static void mm_task_w2_kb(const struct mm_job *job, long begin, long end)
{
    const enum kern_dtype dt = job->dtype;
    const int n = job->n;
    const size_t d_in = (size_t)job->d_in, d_out = (size_t)job->d_out;
    const size_t esize = kern_dtype_size(dt), row_bytes = d_in * esize;
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
                    tile(wp + (size_t)(2 * p) * row_bytes + (size_t)k0 * esize, d_in, xb,
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

/* Tasks of the direct path: blocks of MM_RO output rows. */
static void mm_task_direct(void *ctx, long begin, long end, int thread_idx)
{
    const struct mm_job *job = ctx;
    const size_t esize = kern_dtype_size(job->dtype);
    (void)thread_idx;
#ifdef __AVX2__
    if (job->n <= MM_RI && !job->opairs) {
        mm_task_runs(job, begin, end);
        return;
    }
#endif
#if defined(__AVX2__) && !(defined(__AVX512F__) && defined(__AVX512BW__))
    if (job->n >= MM_KB_ROWS_MIN && job->d_in >= MM_KB_MIN_DIN) {
        mm_task_w2_kb(job, begin, end);
        return;
    }
#endif
    for (long blk = begin; blk < end; blk++) {
        const int o0 = (int)(blk * MM_RO);
        const int rows = job->d_out - o0 < MM_RO ? job->d_out - o0 : MM_RO;
        const char *w = (const char *)job->w + (size_t)o0 * (size_t)job->d_in * esize;
#if defined(__AVX512F__) && defined(__AVX512BW__)
        if (job->okb > 0) {
            mm_blocks_opairs_kb(job, blk, end);
            break;
        }
        if (job->opairs) {
            mm_block_opairs(job, w, rows, o0);
            continue;
        }
        if (job->xq) {
            if (rows == MM_RO) {
                mm_block_pairs(job, job->dtype, w, MM_RO, o0);
                continue;
            }
            for (int r = 0; r < rows; r++)
                mm_block_pairs(job, job->dtype, w + (size_t)r * (size_t)job->d_in * esize, 1,
                               o0 + r);
            continue;
        }
#endif
        if (rows == MM_RO) {
            mm_block(job, job->dtype, w, MM_RO, o0);
            continue;
        }
        for (int r = 0; r < rows; r++)
            mm_block(job, job->dtype, w + (size_t)r * (size_t)job->d_in * esize, 1, o0 + r);
    }
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
/* Tasks of the panel path: panels of MM_PR output rows. */
static void mm_task_panel(void *ctx, long begin, long end, int thread_idx)
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

/* Runs one job over all output rows on the pool. */
static void mm_run(struct cpu_backend *cb, struct mm_job *job, int rows_per_task, cpu_pool_fn fn)
{
    const long n_blocks = (job->d_out + rows_per_task - 1) / rows_per_task;
    /* Claims of up to 16 blocks, at least ~16 claims per thread to balance.
     * The pair paths claim guided instead (a quarter of what is left with 2
     * threads, down to those 16): a claim is one weight stream, and its first
     * blocks start cold, before the prefetch is ahead. Fixed claims of 64
     * blocks (before) made the 384 x 128256 head at one row 20-25% slower
     * than one run per thread, 2 threads, in a stand-alone copy of the tile
     * timed in one process alternating the two; guided claims were as fast as
     * one run per thread. The input pairs' fixed claims of 16 against guided
     * ones (tools/bench_kernels, 3 alternating runs): the 768 x 128256 head
     * at 9 and 17 rows 2-12% slower, 768 -> 2048, 2048 -> 8192 and
     * 8192 -> 2048 alike within noise. */
    long chunk = n_blocks / ((long)cb->n_threads * 16);
    chunk = chunk < 1 ? 1 : chunk > 16 ? 16 : chunk;
    /* Tiny products are not worth waking the workers. */
    if ((long)job->n * job->d_in * job->d_out < 32768)
        chunk = n_blocks;
    if (job->opairs || job->xq || job->packed_rows)
        cpu_pool_run_guided(cb->pool, n_blocks, chunk, fn, job);
    else
        cpu_pool_run(cb->pool, n_blocks, chunk, fn, job);
}

#ifdef __AVX2__
/* Runs job over its n input rows as jobs of at most job_rows rows (rows are
 * independent: chunking changes no bit); job is left at the last chunk. */
static void mm_run_jobs(struct cpu_backend *cb, struct mm_job *job, int job_rows,
                        int rows_per_task, cpu_pool_fn fn)
{
    const int n = job->n;
    const float *in = job->in;
    float *out = job->out;
    for (int i0 = 0; i0 < n; i0 += job_rows) {
        job->n = n - i0 < job_rows ? n - i0 : job_rows;
        job->in = in + (size_t)i0 * (size_t)job->d_in;
        job->out = out + (size_t)i0 * (size_t)job->d_out;
        mm_run(cb, job, rows_per_task, fn);
    }
}
#endif

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
    struct mm_job job = {
        .out = out, .in = in, .w = w, .dtype = dtype,
        .n = n, .d_in = d_in, .d_out = d_out, .scratch = cb->scratch,
    };
    int packed_d_in = 0;
    if (cpu_backend_packed(cb, w, &job.packed_rows, &packed_d_in) &&
        (packed_d_in != d_in || dtype != KERN_DTYPE_BF16 || d_out < job.packed_rows))
        return error_set(err, ERR_INVALID_ARG,
                         "cpu matmul: w was mapped as a bf16 matrix of at least %d rows of %d, "
                         "called as %s [%d, %d]",
                         job.packed_rows, packed_d_in, kern_dtype_name(dtype), d_out, d_in);
#if defined(__AVX512F__) && defined(__AVX512BW__)
    if (job.packed_rows) {
        /* Jobs of at most MM_PK_JOB_ROWS input rows keep a job's inputs in
         * L2 while every octet is applied to them. At 1 and 2 rows a claim
         * is cut into MM_PK_STREAMS runs read side by side, so tasks of
         * that many octets (see the packed path); a call of more rows than
         * one job keeps single octets for all its jobs, the last of which
         * may have 1 or 2 rows. */
        job.pk_task_octets = n < MM_PK_ONE_FROM ? MM_PK_STREAMS : 1;
        mm_run_jobs(cb, &job, MM_PK_JOB_ROWS, CPU_PACKED_ROWS * job.pk_task_octets,
                    mm_task_packed);
        return 0;
    }
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__)
    if (mm_use_panel(n)) {
        /* Chunks of at most MM_PANEL_MAX input rows bound the scratch (rows
         * are independent: chunking changes no bit). */
        const int n_max = n < MM_PANEL_MAX ? n : MM_PANEL_MAX;
        const int pkb = mm_panel_kb(n_max);
        const size_t priv = mm_panel_private_bytes(n_max, pkb);
        rc = cpu_backend_scratch_reserve(
            cb, priv + mm_panel_xp_floats(n_max, d_in, pkb) * sizeof(float), err);
        if (rc < 0)
            return rc;
        float *xp = (float *)(void *)((char *)cb->scratch[0] + priv);
        for (int i0 = 0; i0 < n; i0 += MM_PANEL_MAX) {
            job.n = n - i0 < MM_PANEL_MAX ? n - i0 : MM_PANEL_MAX;
            job.in = in + (size_t)i0 * (size_t)d_in;
            job.out = out + (size_t)i0 * (size_t)d_out;
            job.pkb = mm_panel_kb(job.n);
            mm_pack_inputs(job.in, job.n, d_in, job.pkb, xp);
            job.xp = xp;
            mm_run(cb, &job, MM_PR, mm_task_panel);
        }
        return 0;
    }
#elif defined(__AVX2__)
    if (n > MM_DIRECT_JOB_ROWS) {
        mm_run_jobs(cb, &job, MM_DIRECT_JOB_ROWS, MM_RO, mm_task_direct);
        return 0;
    }
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__)
    if (d_in >= 8 && n >= MM_IPAIRS_MIN) {
        rc = cpu_backend_scratch_reserve(cb, mm_pairs_floats(n, d_in) * sizeof(float), err);
        if (rc < 0)
            return rc;
        mm_pack_pairs(in, n, d_in, cb->scratch[0]);
        job.xq = cb->scratch[0];
    } else {
        job.opairs = 1;
        if (n >= 2 && n <= MM_OI && d_in > MM_OKB_MIN_DIN)
            job.okb = MM_OKB;
        const size_t row_bytes = (size_t)d_in * kern_dtype_size(dtype);
        const size_t block_bytes = MM_RO * row_bytes;
        job.pf_lead = 2 * MM_PF;
        job.pf_next = (MM_RO - 1) * row_bytes;
        if (block_bytes > 0 && block_bytes < MM_PF_SHORT_AHEAD) { /* whole blocks ahead */
            job.pf_lead =
                (ptrdiff_t)(block_bytes * ((MM_PF_SHORT_AHEAD + block_bytes - 1) / block_bytes));
            job.pf_next = 0;
        }
    }
#endif
    mm_run(cb, &job, MM_RO, mm_task_direct);
    return 0;
}
