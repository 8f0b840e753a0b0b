/* matmul_opairs.c: cpu_matmul's output-pair path (AVX-512F+BW; n below the
 * input pairs' MM_IPAIRS_MIN: decode and short speculative verifications;
 * the contract and the choice of path are in matmul.c).
 *
 * Tasks are blocks of MM_RO output rows. One 512-bit accumulator holds two
 * outputs of the same input row: lanes 0-7 the eight lane accumulators of
 * (weight row a, input row b), lanes 8-15 those of (weight row a+1, input
 * row b). Each half sees exactly the FMAs, in the same order, as the
 * 256-bit accumulator of mm_tile would (FMA is lane by lane), is folded with
 * cpu_simd_hsum8 and finished with the scalar tail: the bits are the fixed
 * order's, only half as many FMAs issue and no lane is idle, whatever n.
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
 * The software prefetch MM_PF weights ahead of each row's stream beats the
 * hardware prefetchers alone: a block's four rows are four streams only one
 * page (d_in = 2048) or four long, which the prefetchers pick up late, page
 * after page. Near a row's end it runs on into the same row of the next
 * block (mm_otile's pf_next), and in k-blocks it fetches the next tile's
 * columns, where prefetching each row's own next KiB touched, at a row's
 * end, the next row, fetched anyway. Past the matrix a prefetch never
 * faults.
 * Figures: docs/perf/cpu-matmul.md, "Output pairs".
 */
#include <math.h>
#include <string.h>

#include "matmul_internal.h"

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define MM_OKB_BLOCKS 16 /* weight row blocks per k-block sweep */

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
void mm_block_opairs(const struct mm_job *job, const void *w, int rows, int o0)
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
 * each) at once instead of 4 long ones. One row stays on whole rows: alike
 * in the kernel benchmark, it decoded a whole model slower in k-blocks; and
 * since the whole-row prefetch runs into the next block, rows up to
 * MM_OKB_MIN_DIN are faster whole.
 * Each weight is still read once, and each accumulator sees the same FMAs
 * in the same order as with whole rows. */
void mm_blocks_opairs_kb(const struct mm_job *job, long begin, long end)
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
