/* matmul.cu: cuda_matmul, out[i][o] = sum_k in[i][k] * w[o][k], f32 results,
 * the twin of kernels/cpu/matmul.c. Weights bf16, f16 or f32 in HF layout
 * w[d_out][d_in]; activations f32. Batch-invariant for every n: row i's
 * bits never depend on how many rows share the call, nor on which kernel
 * or tile computed it (kernels.h, exactness contract). Prompt rows become
 * the KV cache that later decode rows read, so prefill must agree with
 * decode bit for bit too; no path of the op table uses cuBLAS.
 *
 * The order (a function of d_in alone). Split k into the 32 classes
 * l = (k / 8) % 32: class l holds the chunks [256 j + 8 l, 256 j + 8 l + 8).
 * Each output element keeps one f32 accumulator per class, starting at
 * +0.0f, and applies __fmaf_rn(w[o][k], in[i][k], acc_l) for the k of
 * class l in increasing order (elements k >= d_in are skipped, never
 * multiplied by a zero: that could turn a -0 accumulator into +0). The 32
 * class sums a_0..a_31 are then added as the xor butterfly 16, 8, 4, 2, 1
 * of cuda_warp_sum does: S16(l) = a_l + a_(l^16), S8(l) = S16(l) + S16(l^8),
 * ..., out = S1(0), each + one __fadd_rn. IEEE addition is commutative
 * bit for bit, so S_d(l) = S_d(l ^ d') for every d' >= d: every lane of
 * the butterfly ends with S1(0).
 *
 * Two kernels compute exactly that order, so either may take any call
 * (the choice is a speed choice only; tests compare them bit for bit):
 *
 * 1. Skinny kernel (mm_skinny_kernel), n below the backend's threshold
 *    (MM_TILED_MIN_ROWS = 18 or the environment's, matmul_skinny.cuh:
 *    decode and every verification), and the fallback: one warp per output
 *    column o (several rows: mm_skinny_cols_kernel, a warp per four
 *    columns, each column's order unchanged), up to 17 rows per launch (more rows:
 *    groups of 17); the columns of up
 *    to four weights sharing the input (cuda_matmul_multi: q, k, v; gate,
 *    up) may share one launch, each column computed as alone. Lane l is class l;
 *    each lane reads its chunks with 16-byte loads when d_in % 8 == 0 and
 *    both pointers are 16-byte aligned, scalar loads otherwise; both feed
 *    the same FMAs, so alignment never changes a bit. The lane sums are
 *    folded by cuda_warp_sum and lane 0 stores S1(0).
 *
 * 2. Tiled kernel (mm_tiled_kernel), n at or above the threshold (prefill,
 *    LM head over many rows): a block computes BM rows x BN
 *    columns, warps of 16 rows x 8 columns, and walks k in tiles of 256
 *    (one chunk per class). A k-tile of the block's input rows (f32) and
 *    weight rows (as stored: bf16, f16 or f32) is copied to shared memory
 *    (cp.async, double-buffered), each weight converted to f32 (exactly)
 *    when read. Lane l of every warp is again class l: it keeps 16 x 8
 *    accumulators, one per (row, column) of its warp, and for its chunk of
 *    the tile applies, element by element in increasing k, one __fmaf_rn
 *    per (row, column). Across tiles that is each accumulator's class-l
 *    sequence of the skinny kernel, operand for operand. The tail tile
 *    masks elements k >= d_in per lane (the skinny kernel's `e < m`).
 *    After the last tile, mm_lane_fold adds the 128 accumulators across the
 *    lanes with recursive halving: at offset d (16, 8, 4, 2, 1) lanes l and
 *    l^d exchange half of their values and each adds the half it keeps,
 *    own + partner's, so each sum is S_2d(l) + S_2d(l^d) for the same
 *    element as the butterfly, with the operands the butterfly adds (the
 *    partners agree on every lane bit used before). The lane that ends
 *    with an element holds S1(lane) = S1(0) for it. Same bits as the skinny
 *    kernel; a fifth of the butterfly's shuffles.
 *    Rows >= n and columns >= d_out of a block tile are computed on zeros
 *    and never stored: every element has its own accumulators, so padding
 *    changes nothing else.
 *
 * Why not tensor cores: an MMA adds several products per step with its own
 * internal alignment and rounding, so it cannot reproduce this chain of f32
 * FMAs (the order decode has always used); a tensor-core order would change
 * the n = 1 results too, and keeping f32 activations would need them split
 * into bf16 high and low parts. The price of the FMA order: 32 accumulators
 * per element keep this kernel on the FP32 pipes (about 67 TFLOP/s peak on
 * an H100 SXM, before loads and conversions), while cuBLAS runs bf16
 * tensor cores: from about 64 rows of the 3B shapes cuBLAS is far faster.
 * tandem-bench-kernels --backend cuda prints both.
 *
 * cuBLAS (cublasGemmEx, CUBLAS_COMPUTE_32F; bf16 weights on bf16-rounded
 * activations, f32 weights in f32, no TF32) stays reachable only through
 * kern_cuda_matmul_path(KERN_CUDA_MM_CUBLAS), for the benchmark: its
 * reduction order depends on n and its precision is not the others'.
 */
#include <cuda_bf16.h>
#include <cuda_pipeline.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_backend.h"
#include "matmul_skinny.cuh"

/* ---- skinny kernel ----------------------------------------------------- */

/* MM_SKINNY_MAX, MM_THREADS, MM_TILED_MIN_ROWS, mm_load8_vec: matmul_skinny.cuh */

/* One 8-element chunk of the one input row, in increasing k: acc takes
 * the chunk's m valid products in order. */
static __device__ __forceinline__ float mm_row_chunk(float acc, const float *__restrict__ in,
                                                     int c, int m, int vec, const float wv[8])
{
    float xv[8];
    mm_load_x8(in + (size_t)c, m, vec, xv);
#pragma unroll
    for (int e = 0; e < 8; e++)
        if (e < m)
            acc = __fmaf_rn(wv[e], xv[e], acc);
    return acc;
}

/* Chunks of a lane's class loaded ahead of their products: a warp keeps
 * MM_SKINNY_AHEAD 16-byte weight loads in flight instead of one, which is
 * what a memory-bound product with few warps (the k and v projections:
 * 512-1024 columns) lacks. The products still run chunk by chunk in
 * increasing k, so no bit changes. */
#define MM_SKINNY_AHEAD 4

/* The weights of one skinny launch: up to MM_PARTS_MAX matrices sharing
 * the input (q, k and v; gate and up), their columns numbered one after
 * the other: part j holds the columns [col_end[j-1], col_end[j]). */
#define MM_PARTS_MAX 4
struct mm_parts {
    float *out[MM_PARTS_MAX];      /* [n, d_out_j] */
    const void *w[MM_PARTS_MAX];   /* [d_out_j, d_in] */
    int col_end[MM_PARTS_MAX];
    int count;
};

/* Where column col of the parts lives: its weight matrix and output, its
 * index o in them and the output's width. The loop's indices are constants,
 * so the parameter struct stays in registers (an index computed at run time
 * would copy it to local memory in every thread). A col past the last
 * part resolves into the last. */
struct mm_col {
    float *out;
    const void *w;
    int o, d_out;
};
static __device__ __forceinline__ struct mm_col mm_col_of(const struct mm_parts &parts, int col)
{
    struct mm_col c = {parts.out[0], parts.w[0], col, parts.col_end[0]};
#pragma unroll
    for (int k = 1; k < MM_PARTS_MAX; k++)
        if (k < parts.count && col >= parts.col_end[k - 1]) {
            c.out = parts.out[k];
            c.w = parts.w[k];
            c.o = col - parts.col_end[k - 1];
            c.d_out = parts.col_end[k] - parts.col_end[k - 1];
        }
    return c;
}

/* The parts' columns in all (col_end of the last), constant indices only. */
static __device__ __forceinline__ int mm_parts_cols(const struct mm_parts &parts)
{
    int cols = parts.col_end[0];
#pragma unroll
    for (int k = 1; k < MM_PARTS_MAX; k++)
        if (k < parts.count)
            cols = parts.col_end[k];
    return cols;
}

/* out_j[0][o] for one input row, one warp per column of the parts (see
 * the file header for the order: a column's bits do not depend on its
 * part's neighbours). vec: d_in % 8 == 0 and every w and in 16-byte
 * aligned (then every chunk that starts below d_in is whole). Several rows:
 * mm_skinny_cols_kernel. */
template <int DT>
__global__ void __launch_bounds__(MM_THREADS)
    mm_skinny_kernel(struct mm_parts parts, const float *__restrict__ in, int d_in, int vec)
{
    const int col = (int)(((size_t)blockIdx.x * MM_THREADS + threadIdx.x) >> 5);
    const int lane = threadIdx.x & 31;
    if (col >= mm_parts_cols(parts))
        return; /* uniform over the warp */
    const struct mm_col mc = mm_col_of(parts, col);
    const void *__restrict__ w = mc.w;
    const size_t wrow = (size_t)mc.o * (size_t)d_in;
    float acc = 0.0f;

    int c = lane * 8;
    if (vec) {
        for (; c + (MM_SKINNY_AHEAD - 1) * 256 < d_in; c += MM_SKINNY_AHEAD * 256) {
            float wv[MM_SKINNY_AHEAD][8];
#pragma unroll
            for (int u = 0; u < MM_SKINNY_AHEAD; u++)
                mm_load8_vec<DT>(w, wrow + (size_t)(c + u * 256), wv[u]);
#pragma unroll
            for (int u = 0; u < MM_SKINNY_AHEAD; u++)
                acc = mm_row_chunk(acc, in, c + u * 256, 8, 1, wv[u]);
        }
    }
    for (; c < d_in; c += 256) {
        const int m = d_in - c < 8 ? d_in - c : 8; /* valid elements in this chunk */
        float wv[8];
        if (vec) {
            mm_load8_vec<DT>(w, wrow + (size_t)c, wv);
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++)
                wv[e] = e < m ? cuda_load_weight(w, DT, wrow + (size_t)(c + e)) : 0.0f;
        }
        acc = mm_row_chunk(acc, in, c, m, vec, wv);
    }
    const float v = cuda_warp_sum(acc);
    if (lane == 0)
        mc.out[mc.o] = v;
}

/* One 8-element chunk (m valid) of every row r < n against COLS columns'
 * weights wv: accumulator (q, r) takes the chunk's products in increasing
 * k. */
template <int MAXR, int COLS>
static __device__ __forceinline__ void mm_cols_chunk(float (&acc)[COLS][MAXR],
                                                     const float (&wv)[COLS][8],
                                                     const float *__restrict__ in, int n,
                                                     int d_in, int c, int m, int vec)
{
#pragma unroll
    for (int r = 0; r < MAXR; r++) {
        if (r < n) {
            const float *xr = in + (size_t)r * (size_t)d_in + (size_t)c;
            float xv[8];
            mm_load_x8(xr, m, vec, xv);
#pragma unroll
            for (int q = 0; q < COLS; q++)
#pragma unroll
                for (int e = 0; e < 8; e++)
                    if (e < m)
                        acc[q][r] = __fmaf_rn(wv[q][e], xv[e], acc[q][r]);
        }
    }
}

/* Several rows (2 <= n <= MAXR): each warp computes COLS consecutive
 * columns of the parts, so that every activation chunk it loads serves
 * COLS weight chunks. With one column a warp, n rows of f32 activations
 * were read from L1 per weight chunk: at 8 rows sixteen times the bytes of
 * bf16 weights, more than L1 delivers at the rate HBM delivers the weights.
 * Accumulator (q, r) takes column q's chunks of the lane's class in
 * increasing k, as in mm_skinny_kernel: the same bits. Where the chunks
 * are whole and aligned (vec), a lane loads the weights of two chunks
 * (k and k + 256) before the products of the first, so that two 16-byte
 * loads a column are in flight (MM_COLS_AHEAD); the products still run
 * chunk by chunk in increasing k. */
template <int DT, int MAXR, int COLS>
__global__ void __launch_bounds__(MM_THREADS)
    mm_skinny_cols_kernel(struct mm_parts parts, const float *__restrict__ in, int n, int d_in,
                          int vec)
{
    const int c_first = (int)((((size_t)blockIdx.x * MM_THREADS + threadIdx.x) >> 5) * COLS);
    const int lane = threadIdx.x & 31;
    const int total = mm_parts_cols(parts);
    if (c_first >= total)
        return; /* uniform over the warp */
    float *outp[COLS];
    const void *wp[COLS];
    size_t wrow[COLS];
    int o_of[COLS], d_out_of[COLS];
    bool live[COLS];
#pragma unroll
    for (int q = 0; q < COLS; q++) {
        const int col = c_first + q;
        live[q] = col < total;
        const struct mm_col mc = mm_col_of(parts, col);
        o_of[q] = mc.o;
        d_out_of[q] = mc.d_out;
        outp[q] = mc.out;
        wp[q] = mc.w;
        wrow[q] = (size_t)(live[q] ? o_of[q] : 0) * (size_t)d_in;
    }
    float acc[COLS][MAXR];
#pragma unroll
    for (int q = 0; q < COLS; q++)
#pragma unroll
        for (int r = 0; r < MAXR; r++)
            acc[q][r] = 0.0f;

    int c = lane * 8;
    if (vec) {
        for (; c + (MM_COLS_AHEAD - 1) * 256 < d_in; c += MM_COLS_AHEAD * 256) {
            float wv[MM_COLS_AHEAD][COLS][8];
#pragma unroll
            for (int u = 0; u < MM_COLS_AHEAD; u++)
#pragma unroll
                for (int q = 0; q < COLS; q++) {
                    if (live[q]) {
                        mm_load8_vec<DT>(wp[q], wrow[q] + (size_t)(c + u * 256), wv[u][q]);
                    } else {
#pragma unroll
                        for (int e = 0; e < 8; e++)
                            wv[u][q][e] = 0.0f;
                    }
                }
#pragma unroll
            for (int u = 0; u < MM_COLS_AHEAD; u++)
                mm_cols_chunk<MAXR, COLS>(acc, wv[u], in, n, d_in, c + u * 256, 8, 1);
        }
    }
    for (; c < d_in; c += 256) {
        const int m = d_in - c < 8 ? d_in - c : 8; /* valid elements in this chunk */
        float wv[COLS][8];
#pragma unroll
        for (int q = 0; q < COLS; q++) {
            if (vec && live[q]) {
                mm_load8_vec<DT>(wp[q], wrow[q] + (size_t)c, wv[q]);
            } else {
#pragma unroll
                for (int e = 0; e < 8; e++)
                    wv[q][e] = live[q] && e < m ? cuda_load_weight(wp[q], DT, wrow[q] + (size_t)(c + e))
                                                : 0.0f;
            }
        }
        mm_cols_chunk<MAXR, COLS>(acc, wv, in, n, d_in, c, m, vec);
    }
#pragma unroll
    for (int q = 0; q < COLS; q++) {
#pragma unroll
        for (int r = 0; r < MAXR; r++) {
            if (r < n) {
                /* every lane runs the butterfly (all 32 must); dead columns
                 * are summed and dropped */
                const float v = cuda_warp_sum(acc[q][r]);
                if (lane == 0 && live[q])
                    outp[q][(size_t)r * (size_t)d_out_of[q] + (size_t)o_of[q]] = v;
            }
        }
    }
}

/* ---- tiled kernel ------------------------------------------------------ */

#define MM_KT 256               /* k per tile: one 8-element chunk per class */
#define MM_WM 16                /* rows per warp tile */
#define MM_WN 8                 /* output columns per warp tile */
#define MM_ACC (MM_WM * MM_WN)  /* accumulators per lane (a multiple of 32) */
#define MM_STAGES 2             /* shared-memory k-tiles (the pipeline below is
                                   written for exactly two: load t+1, use t) */

/* Bytes per weight element. */
static __host__ __device__ constexpr int mm_wbytes(int dt)
{
    return dt == KERN_DTYPE_F32 ? 4 : 2;
}

/* Shared memory of one stage: BM input rows of MM_KT f32, BN weight rows of
 * MM_KT elements as stored. */
static __host__ __device__ constexpr size_t mm_stage_bytes(int dt, int bm, int bn)
{
    return (size_t)bm * MM_KT * 4 + (size_t)bn * MM_KT * (size_t)mm_wbytes(dt);
}

/* Where element kk (0..255) of a k-tile row sits in shared memory: class
 * l's chunk 8l..8l+7 is stored as two quads, 8l..8l+3 at 4l and
 * 8l+4..8l+7 at 128 + 4l, so that the 32 lanes' quads of one half are
 * contiguous (conflict-free 16-byte reads). */
static __device__ __forceinline__ int mm_swz(int kk)
{
    return ((kk >> 2) & 1) * 128 + (kk >> 3) * 4 + (kk & 3);
}

/* Queues the copy of k-tile [k0, k0 + 256) of input rows row0.. and weight
 * rows col0.. into one stage; positions past n, d_out or d_in get zeros
 * (read, never used for a stored element). vec_x: in 16-byte aligned and
 * d_in % 4 == 0; vec_w: w aligned to 4 elements and d_in % 4 == 0; then a
 * quad is wholly inside or outside d_in and moves with one cp.async,
 * otherwise element by element. */
template <int DT, int BM, int BN, int THREADS>
static __device__ __forceinline__ void mm_tile_load(unsigned char *stage,
                                                    const float *__restrict__ in,
                                                    const void *__restrict__ w, int n, int d_in,
                                                    int d_out, int row0, int col0, int k0,
                                                    int vec_x, int vec_w)
{
    constexpr int WB = mm_wbytes(DT);
    float *xs = (float *)stage;
    unsigned char *ws = stage + (size_t)BM * MM_KT * 4;
    for (int u = threadIdx.x; u < BM * (MM_KT / 4); u += THREADS) {
        const int r = u / (MM_KT / 4), kk = (u % (MM_KT / 4)) * 4;
        const int row = row0 + r, k = k0 + kk;
        float *dst = xs + r * MM_KT + mm_swz(kk);
        if (vec_x) {
            if (row < n && k < d_in)
                __pipeline_memcpy_async(dst, in + (size_t)row * (size_t)d_in + (size_t)k, 16);
            else
                *(float4 *)dst = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        } else {
#pragma unroll
            for (int e = 0; e < 4; e++)
                dst[e] = row < n && k + e < d_in ? in[(size_t)row * (size_t)d_in + (size_t)(k + e)]
                                                 : 0.0f;
        }
    }
    for (int u = threadIdx.x; u < BN * (MM_KT / 4); u += THREADS) {
        const int c = u / (MM_KT / 4), kk = (u % (MM_KT / 4)) * 4;
        const int col = col0 + c, k = k0 + kk;
        unsigned char *dst = ws + (size_t)(c * MM_KT + mm_swz(kk)) * WB;
        const size_t src = (size_t)col * (size_t)d_in + (size_t)k; /* element index */
        if (vec_w) {
            if (col < d_out && k < d_in) {
                __pipeline_memcpy_async(dst, (const unsigned char *)w + src * WB, 4 * WB);
            } else if (WB == 4) {
                *(float4 *)dst = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            } else {
                *(uint2 *)dst = make_uint2(0u, 0u);
            }
        } else {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const bool ok = col < d_out && k + e < d_in;
                if (WB == 4)
                    ((float *)dst)[e] = ok ? ((const float *)w)[src + e] : 0.0f;
                else
                    ((uint16_t *)dst)[e] = ok ? ((const uint16_t *)w)[src + e] : (uint16_t)0;
            }
        }
    }
}

/* Four consecutive weights of a stage as f32 (exact conversions); idx is
 * an element index, a multiple of 4. */
template <int DT>
static __device__ __forceinline__ void mm_lds4_w(const unsigned char *ws, int idx, float v[4])
{
    if (DT == KERN_DTYPE_F32) {
        const float4 a = *(const float4 *)(ws + (size_t)idx * 4);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
    } else {
        const uint2 u = *(const uint2 *)(ws + (size_t)idx * 2);
        if (DT == KERN_DTYPE_BF16) {
            v[0] = cuda_bf16_bits_to_f32(u.x & 0xffffu);
            v[1] = __uint_as_float(u.x & 0xffff0000u);
            v[2] = cuda_bf16_bits_to_f32(u.y & 0xffffu);
            v[3] = __uint_as_float(u.y & 0xffff0000u);
        } else {
            v[0] = cuda_f16_bits_to_f32(u.x & 0xffffu);
            v[1] = cuda_f16_bits_to_f32(u.x >> 16);
            v[2] = cuda_f16_bits_to_f32(u.y & 0xffffu);
            v[3] = cuda_f16_bits_to_f32(u.y >> 16);
        }
    }
}

/* One k-tile of one warp: lane (= class) applies its chunk's elements, in
 * increasing k, to its 16 x 8 accumulators acc[r * MM_WN + c]. TAIL: the
 * tile ends past d_in; only the first `valid` elements of the chunk count
 * (valid <= 0: none). */
template <int DT, int BM, bool TAIL>
static __device__ __forceinline__ void mm_tile_compute(const unsigned char *stage, int wm, int wn,
                                                       int lane, int valid, float acc[MM_ACC])
{
    constexpr int WB = mm_wbytes(DT);
    const float *xs = (const float *)stage + (size_t)wm * MM_WM * MM_KT;
    const unsigned char *ws = stage + (size_t)BM * MM_KT * 4 + (size_t)wn * MM_WN * MM_KT * WB;
#pragma unroll
    for (int h = 0; h < 2; h++) { /* chunk elements 4h .. 4h+3 */
        const int q = h * 128 + lane * 4;
        float wv[MM_WN][4];
#pragma unroll
        for (int c = 0; c < MM_WN; c++)
            mm_lds4_w<DT>(ws, c * MM_KT + q, wv[c]);
#pragma unroll
        for (int r = 0; r < MM_WM; r++) {
            const float4 x4 = *(const float4 *)(xs + r * MM_KT + q);
            const float xv[4] = {x4.x, x4.y, x4.z, x4.w};
#pragma unroll
            for (int e = 0; e < 4; e++) {
                if (!TAIL || h * 4 + e < valid) {
#pragma unroll
                    for (int c = 0; c < MM_WN; c++)
                        acc[r * MM_WN + c] = __fmaf_rn(wv[c][e], xv[e], acc[r * MM_WN + c]);
                }
            }
        }
    }
}

/* One step of mm_lane_fold: lanes l and l ^ D pair up; the lane with bit D
 * clear keeps v[0 .. HALF), the other v[HALF .. 2 HALF), moved down to
 * v[0 .. HALF); each adds the partner's value of every element it keeps to
 * its own. */
template <int HALF, int D>
static __device__ __forceinline__ void mm_fold_step(float v[MM_ACC], int lane)
{
    const bool upper = (lane & D) != 0;
#pragma unroll
    for (int i = 0; i < HALF; i++) {
        const float send = upper ? v[i] : v[i + HALF];
        const float keep = upper ? v[i + HALF] : v[i];
        v[i] = __fadd_rn(keep, __shfl_xor_sync(0xffffffffu, send, D));
    }
}

/* Adds each of the MM_ACC accumulators over the 32 lanes (the classes)
 * with the butterfly's additions (file header), by recursive halving.
 * Afterwards v[0..3] of a lane hold the sums of accumulators
 * ((lane >> 1) & 15) * MM_WN + (lane & 1) * 4 + 0..3, i.e. row
 * (lane >> 1) & 15 and columns (lane & 1) * 4 + 0..3 of the warp tile.
 * All 32 lanes must call it. */
static __device__ __forceinline__ void mm_lane_fold(float v[MM_ACC], int lane)
{
    static_assert(MM_ACC == 128, "the steps below halve 128 values five times");
    mm_fold_step<64, 16>(v, lane);
    mm_fold_step<32, 8>(v, lane);
    mm_fold_step<16, 4>(v, lane);
    mm_fold_step<8, 2>(v, lane);
    mm_fold_step<4, 1>(v, lane);
}

/* out for a grid of row_blocks x ceil(d_out / BN) blocks, row blocks
 * fastest (the blocks in flight share weight tiles in L2). Dynamic shared
 * memory: MM_STAGES * mm_stage_bytes(DT, BM, BN). */
template <int DT, int WARPS_M, int WARPS_N>
__global__ void __launch_bounds__(32 * WARPS_M * WARPS_N)
    mm_tiled_kernel(float *__restrict__ out, const float *__restrict__ in,
                    const void *__restrict__ w, int n, int d_in, int d_out, int row_blocks,
                    int vec_x, int vec_w)
{
    constexpr int BM = MM_WM * WARPS_M, BN = MM_WN * WARPS_N, THREADS = 32 * WARPS_M * WARPS_N;
    constexpr size_t STAGE = mm_stage_bytes(DT, BM, BN);
    static_assert(MM_STAGES == 2, "wait_prior(1) and the barriers assume double buffering");
    extern __shared__ __align__(16) unsigned char mm_smem[];
    const int warp = (int)(threadIdx.x >> 5), lane = (int)(threadIdx.x & 31);
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;
    const int row0 = (int)(blockIdx.x % (unsigned int)row_blocks) * BM;
    const int col0 = (int)(blockIdx.x / (unsigned int)row_blocks) * BN;

    float acc[MM_ACC];
#pragma unroll
    for (int i = 0; i < MM_ACC; i++)
        acc[i] = 0.0f;

    const int tiles = (d_in + MM_KT - 1) / MM_KT;
    if (tiles > 0)
        mm_tile_load<DT, BM, BN, THREADS>(mm_smem, in, w, n, d_in, d_out, row0, col0, 0, vec_x,
                                          vec_w);
    __pipeline_commit();
    for (int t = 0; t < tiles; t++) {
        /* The stage written here was last read in iteration t - 1, which
         * ended with a barrier. */
        if (t + 1 < tiles)
            mm_tile_load<DT, BM, BN, THREADS>(mm_smem + (size_t)((t + 1) % MM_STAGES) * STAGE, in,
                                              w, n, d_in, d_out, row0, col0, (t + 1) * MM_KT,
                                              vec_x, vec_w);
        __pipeline_commit();
        __pipeline_wait_prior(1); /* this thread's copies of tile t have landed */
        __syncthreads();          /* everyone's copies and plain stores of tile t */
        const unsigned char *st = mm_smem + (size_t)(t % MM_STAGES) * STAGE;
        const int k0 = t * MM_KT;
        if (k0 + MM_KT <= d_in)
            mm_tile_compute<DT, BM, false>(st, wm, wn, lane, 8, acc);
        else
            mm_tile_compute<DT, BM, true>(st, wm, wn, lane, d_in - k0 - lane * 8, acc);
        __syncthreads(); /* tile t's stage is free for tile t + 2 */
    }

    mm_lane_fold(acc, lane);
    const int row = row0 + wm * MM_WM + ((lane >> 1) & 15);
    const int col = col0 + wn * MM_WN + (lane & 1) * 4;
    if (row < n) {
        float *dst = out + (size_t)row * (size_t)d_out;
#pragma unroll
        for (int i = 0; i < 4; i++)
            if (col + i < d_out)
                dst[col + i] = acc[i];
    }
}

/* ---- launchers --------------------------------------------------------- */

/* Block shapes of the tiled kernel (rows x columns); the order of
 * enum kern_cuda_mm_path's TILED_ values. */
enum mm_cfg {
    MM_CFG_32X32 = 0, /* 2 x 4 warps: large n, least L2 traffic per FMA */
    MM_CFG_16X32 = 1, /* 1 x 4 warps */
    MM_CFG_16X16 = 2, /* 1 x 2 warps: small n or few columns, more blocks */
    MM_CFG_COUNT = 3,
};

static const int mm_cfg_rows[MM_CFG_COUNT] = {32, 16, 16};
static const int mm_cfg_cols[MM_CFG_COUNT] = {32, 32, 16};

static size_t mm_cfg_smem(enum mm_cfg cfg, enum kern_dtype dtype)
{
    return MM_STAGES * mm_stage_bytes((int)dtype, mm_cfg_rows[cfg], mm_cfg_cols[cfg]);
}

/* The kernel of a (dtype, block shape), as the address cudaFuncSetAttribute
 * and the launch take. */
template <int DT>
static const void *mm_tiled_fn_dt(enum mm_cfg cfg)
{
    switch (cfg) {
    case MM_CFG_32X32: return (const void *)mm_tiled_kernel<DT, 2, 4>;
    case MM_CFG_16X32: return (const void *)mm_tiled_kernel<DT, 1, 4>;
    case MM_CFG_16X16: return (const void *)mm_tiled_kernel<DT, 1, 2>;
    case MM_CFG_COUNT: break;
    }
    return NULL;
}

static const void *mm_tiled_fn(enum mm_cfg cfg, enum kern_dtype dtype)
{
    switch (dtype) {
    case KERN_DTYPE_BF16: return mm_tiled_fn_dt<KERN_DTYPE_BF16>(cfg);
    case KERN_DTYPE_F16: return mm_tiled_fn_dt<KERN_DTYPE_F16>(cfg);
    case KERN_DTYPE_F32: return mm_tiled_fn_dt<KERN_DTYPE_F32>(cfg);
    case KERN_DTYPE_Q8:
    case KERN_DTYPE_Q4: break; /* matmul_quant.cu, never tiled */
    }
    return NULL;
}

static int mm_cfg_fits(const struct cuda_backend *cb, enum mm_cfg cfg, enum kern_dtype dtype)
{
    return mm_cfg_smem(cfg, dtype) <= cb->smem_optin_bytes;
}

/* The tiled kernel's threshold: MM_TILED_MIN_ROWS, or the environment's
 * (matmul_skinny.cuh), read once so that every call of a backend, and every
 * graph recorded on it, takes the same kernels. */
static int mm_read_tiled_min_rows(struct cuda_backend *cb, char *err)
{
    cb->mm_tiled_min_rows = MM_TILED_MIN_ROWS;
    const char *s = getenv(MM_TILED_MIN_ROWS_ENV);
    if (!s || !*s)
        return 0;
    char *end = NULL;
    errno = 0;
    const long v = strtol(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < 1 || v > 1000000)
        return error_set(err, ERR_INVALID_ARG,
                         "%s: must be an integer in 1..1000000 (rows from which matmul takes "
                         "the tiled kernel), got \"%s\"", MM_TILED_MIN_ROWS_ENV, s);
    cb->mm_tiled_min_rows = (int)v;
    if (v != MM_TILED_MIN_ROWS)
        LOG_INFO("cuda matmul: the tiled kernel from %ld rows (%s; default %d)", v,
                 MM_TILED_MIN_ROWS_ENV, MM_TILED_MIN_ROWS);
    return 0;
}

int cuda_matmul_prepare(struct cuda_backend *cb, char *err)
{
    int rc = mm_read_tiled_min_rows(cb, err);
    if (rc < 0)
        return rc;
    int v = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, cb->device));
    cb->sm_count = v;
    CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, cb->device));
    cb->smem_optin_bytes = (size_t)v;
    static const enum kern_dtype dts[3] = {KERN_DTYPE_BF16, KERN_DTYPE_F16, KERN_DTYPE_F32};
    for (int d = 0; d < 3; d++)
        for (int c = 0; c < MM_CFG_COUNT; c++) {
            const enum mm_cfg cfg = (enum mm_cfg)c;
            if (!mm_cfg_fits(cb, cfg, dts[d]))
                continue; /* never launched on this device (mm_pick_cfg) */
            CUDA_CHECK(cudaFuncSetAttribute(mm_tiled_fn(cfg, dts[d]),
                                            cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            (int)mm_cfg_smem(cfg, dts[d])));
        }
    return 0;
}

/* Columns per warp of the several-row kernels: four for rows 2..8 and for
 * 9..17 (acc[4][17], 68 accumulators, stays in registers: ptxas -v shows no
 * spills on sm_90; check again when changing either). */
#define MM_COLS_FEW 4
#define MM_COLS_MANY 4
#define MM_FEW_ROWS 8

/* Rows [0, n) with n <= MM_SKINNY_MAX; cols: the launch's columns. */
template <int DT>
static void mm_skinny_launch_dt(cudaStream_t stream, int cols, const struct mm_parts &parts,
                                const float *in, int n, int d_in, int vec)
{
    const int per_warp = n == 1 ? 1 : n <= MM_FEW_ROWS ? MM_COLS_FEW : MM_COLS_MANY;
    const int per_block = MM_ROWS_PER_BLOCK * per_warp;
    const unsigned int blocks = (unsigned int)((cols + per_block - 1) / per_block);
    if (n == 1)
        mm_skinny_kernel<DT><<<blocks, MM_THREADS, 0, stream>>>(parts, in, d_in, vec);
    else if (n <= MM_FEW_ROWS)
        mm_skinny_cols_kernel<DT, MM_FEW_ROWS, MM_COLS_FEW>
            <<<blocks, MM_THREADS, 0, stream>>>(parts, in, n, d_in, vec);
    else
        mm_skinny_cols_kernel<DT, MM_SKINNY_MAX, MM_COLS_MANY>
            <<<blocks, MM_THREADS, 0, stream>>>(parts, in, n, d_in, vec);
}

static int mm_skinny_launch(struct cuda_backend *cb, const struct mm_parts &parts, const float *in,
                            enum kern_dtype dtype, int n, int d_in, char *err)
{
    int vec = d_in % 8 == 0 && (uintptr_t)in % 16 == 0;
    for (int j = 0; j < parts.count; j++)
        vec = vec && (uintptr_t)parts.w[j] % 16 == 0;
    const int cols = parts.col_end[parts.count - 1];
    switch (dtype) {
    case KERN_DTYPE_BF16:
        mm_skinny_launch_dt<KERN_DTYPE_BF16>(cb->stream, cols, parts, in, n, d_in, vec);
        break;
    case KERN_DTYPE_F16:
        mm_skinny_launch_dt<KERN_DTYPE_F16>(cb->stream, cols, parts, in, n, d_in, vec);
        break;
    case KERN_DTYPE_F32:
        mm_skinny_launch_dt<KERN_DTYPE_F32>(cb->stream, cols, parts, in, n, d_in, vec);
        break;
    case KERN_DTYPE_Q8:
    case KERN_DTYPE_Q4:
        return error_set(err, ERR_INTERNAL, "cuda matmul: quantized weights go to matmul_quant.cu");
    }
    CUDA_CHECK_LAUNCH("mm_skinny_kernel");
    return 0;
}

/* Any n, in launches of up to MM_SKINNY_MAX rows, every part at once. */
static int mm_skinny_parts(struct cuda_backend *cb, const struct mm_parts &parts, const float *in,
                           enum kern_dtype dtype, int n, int d_in, char *err)
{
    for (int r0 = 0; r0 < n; r0 += MM_SKINNY_MAX) {
        const int rows = n - r0 < MM_SKINNY_MAX ? n - r0 : MM_SKINNY_MAX;
        struct mm_parts at = parts;
        for (int j = 0; j < parts.count; j++) {
            const int d_out = parts.col_end[j] - (j > 0 ? parts.col_end[j - 1] : 0);
            at.out[j] = parts.out[j] + (size_t)r0 * (size_t)d_out;
        }
        int rc = mm_skinny_launch(cb, at, in + (size_t)r0 * (size_t)d_in, dtype, rows, d_in, err);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int mm_skinny(struct cuda_backend *cb, float *out, const float *in, const void *w,
                     enum kern_dtype dtype, int n, int d_in, int d_out, char *err)
{
    struct mm_parts parts = {};
    parts.out[0] = out;
    parts.w[0] = w;
    parts.col_end[0] = d_out;
    parts.count = 1;
    return mm_skinny_parts(cb, parts, in, dtype, n, d_in, err);
}

static long mm_cfg_blocks(enum mm_cfg cfg, int n, int d_out)
{
    return (long)((n + mm_cfg_rows[cfg] - 1) / mm_cfg_rows[cfg]) *
           (long)((d_out + mm_cfg_cols[cfg] - 1) / mm_cfg_cols[cfg]);
}

/* Block shape for a call (speed only: every shape gives the same bits).
 * The widest tile that still fills the GPU: bytes read from L2 per FMA
 * fall with the tile (the f32 input rows are re-read once per column
 * block, the weights once per row block), but a 32 x 32 block takes a whole
 * SM's registers (254 per thread), a 16 x 32 block half, a 16 x 16 block a
 * quarter. 16-row tiles also waste less on n <= 16. MM_CFG_COUNT when none
 * fits the device's shared memory. A guess made without a GPU: the
 * benchmark times every shape. */
static enum mm_cfg mm_pick_cfg(const struct cuda_backend *cb, enum kern_dtype dtype, int n,
                               int d_out)
{
    const long sms = cb->sm_count > 0 ? cb->sm_count : 1;
    if (n > 16 && mm_cfg_fits(cb, MM_CFG_32X32, dtype) &&
        mm_cfg_blocks(MM_CFG_32X32, n, d_out) >= 2 * sms)
        return MM_CFG_32X32;
    if (mm_cfg_fits(cb, MM_CFG_16X32, dtype) && mm_cfg_blocks(MM_CFG_16X32, n, d_out) >= sms)
        return MM_CFG_16X32;
    if (mm_cfg_fits(cb, MM_CFG_16X16, dtype))
        return MM_CFG_16X16;
    if (mm_cfg_fits(cb, MM_CFG_16X32, dtype))
        return MM_CFG_16X32;
    return MM_CFG_COUNT;
}

template <int DT, int WARPS_M, int WARPS_N>
static int mm_tiled_launch_dt(struct cuda_backend *cb, float *out, const float *in, const void *w,
                              int n, int d_in, int d_out, char *err)
{
    constexpr int BM = MM_WM * WARPS_M, BN = MM_WN * WARPS_N;
    const int vec_x = (uintptr_t)in % 16 == 0 && d_in % 4 == 0;
    const int vec_w = (uintptr_t)w % (size_t)(4 * mm_wbytes(DT)) == 0 && d_in % 4 == 0;
    const long row_blocks = (n + BM - 1) / BM;
    const long blocks = row_blocks * (long)((d_out + BN - 1) / BN);
    if (blocks > 0x7fffffffL)
        return error_set(err, ERR_INVALID_ARG, "cuda matmul: %ld blocks for n=%d d_out=%d", blocks,
                         n, d_out);
    const size_t smem = MM_STAGES * mm_stage_bytes(DT, BM, BN);
    mm_tiled_kernel<DT, WARPS_M, WARPS_N><<<(unsigned int)blocks, 32 * WARPS_M * WARPS_N, smem,
                                            cb->stream>>>(out, in, w, n, d_in, d_out,
                                                          (int)row_blocks, vec_x, vec_w);
    CUDA_CHECK_LAUNCH("mm_tiled_kernel");
    return 0;
}

template <int DT>
static int mm_tiled_cfg_dt(struct cuda_backend *cb, enum mm_cfg cfg, float *out, const float *in,
                           const void *w, int n, int d_in, int d_out, char *err)
{
    switch (cfg) {
    case MM_CFG_32X32: return mm_tiled_launch_dt<DT, 2, 4>(cb, out, in, w, n, d_in, d_out, err);
    case MM_CFG_16X32: return mm_tiled_launch_dt<DT, 1, 4>(cb, out, in, w, n, d_in, d_out, err);
    case MM_CFG_16X16: return mm_tiled_launch_dt<DT, 1, 2>(cb, out, in, w, n, d_in, d_out, err);
    case MM_CFG_COUNT: break;
    }
    return error_set(err, ERR_INVALID_ARG, "cuda matmul: bad tile configuration %d", (int)cfg);
}

static int mm_tiled(struct cuda_backend *cb, enum mm_cfg cfg, float *out, const float *in,
                    const void *w, enum kern_dtype dtype, int n, int d_in, int d_out, char *err)
{
    if (cfg == MM_CFG_COUNT || !mm_cfg_fits(cb, cfg, dtype))
        return error_set(err, ERR_UNSUPPORTED,
                         "cuda matmul: the tiled kernel needs %zu bytes of shared memory per "
                         "block, the device allows %zu",
                         mm_cfg_smem(cfg == MM_CFG_COUNT ? MM_CFG_16X16 : cfg, dtype),
                         cb->smem_optin_bytes);
    switch (dtype) {
    case KERN_DTYPE_BF16:
        return mm_tiled_cfg_dt<KERN_DTYPE_BF16>(cb, cfg, out, in, w, n, d_in, d_out, err);
    case KERN_DTYPE_F16:
        return mm_tiled_cfg_dt<KERN_DTYPE_F16>(cb, cfg, out, in, w, n, d_in, d_out, err);
    case KERN_DTYPE_F32:
        return mm_tiled_cfg_dt<KERN_DTYPE_F32>(cb, cfg, out, in, w, n, d_in, d_out, err);
    case KERN_DTYPE_Q8:
    case KERN_DTYPE_Q4: break;
    }
    return error_set(err, ERR_UNSUPPORTED, "cuda matmul: unsupported weight dtype %d", (int)dtype);
}

/* ---- cuBLAS (benchmark reference only) --------------------------------- */

__global__ void f32_to_bf16_kernel(__nv_bfloat16 *dst, const float *src, size_t count)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < count; k += stride)
        dst[k] = __float2bfloat16_rn(src[k]);
}

/* Row-major out[n][d_out] is column-major out^T (d_out x n, ld d_out) =
 * op(A) * B with A = w seen column-major as (d_in x d_out, ld d_in)
 * transposed, B = in seen as (d_in x n, ld d_in). bf16 weights: cuBLAS
 * needs A and B of one type, so the activations are rounded to bf16 in
 * scratch first (what the op table did for n > 17 before the tiled kernel). */
static int mm_cublas(struct cuda_backend *cb, float *out, const float *in, const void *w,
                     enum kern_dtype dtype, int n, int d_in, int d_out, char *err)
{
    if (dtype == KERN_DTYPE_F16)
        return error_set(err, ERR_UNSUPPORTED,
                         "cuda matmul: the cuBLAS path takes bf16 or f32 weights, not f16");
    if (d_in == 0)
        return error_set(err, ERR_INVALID_ARG, "cuda matmul: the cuBLAS path needs d_in > 0");
    const float alpha = 1.0f, beta = 0.0f;
    const void *b = in;
    cudaDataType_t ab_type = CUDA_R_32F;
    if (dtype == KERN_DTYPE_BF16) {
        const size_t count = (size_t)n * (size_t)d_in;
        int rc = cuda_backend_scratch(cb, &cb->mm_act, &cb->mm_act_bytes,
                                      count * sizeof(__nv_bfloat16), "cuda matmul scratch", err);
        if (rc < 0)
            return rc;
        f32_to_bf16_kernel<<<cuda_grid_1d(count, 256), 256, 0, cb->stream>>>(
            (__nv_bfloat16 *)cb->mm_act, in, count);
        CUDA_CHECK_LAUNCH("f32_to_bf16_kernel");
        b = cb->mm_act;
        ab_type = CUDA_R_16BF;
    }
    CUBLAS_CHECK(cublasGemmEx(cb->cublas, CUBLAS_OP_T, CUBLAS_OP_N, d_out, n, d_in, &alpha, w,
                              ab_type, d_in, b, ab_type, d_in, &beta, out, CUDA_R_32F, d_out,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return 0;
}

/* ---- entry points ------------------------------------------------------ */

/* Argument checks shared by the entries; 1 when there is nothing to do. */
static int mm_check(struct cuda_backend *cb, float *out, const float *in, const void *w,
                    enum kern_dtype dtype, int n, int d_in, int d_out, char *err)
{
    int rc = dtype == KERN_DTYPE_Q8 || dtype == KERN_DTYPE_Q4 ? 0 : cuda_backend_check_dtype(dtype, "matmul", err);
    if (rc < 0)
        return rc;
    if (n < 0 || d_in < 0 || d_out < 0)
        return error_set(err, ERR_INVALID_ARG, "cuda matmul: negative shape n=%d d_in=%d d_out=%d",
                         n, d_in, d_out);
    if (n == 0 || d_out == 0)
        return 1;
    if (!out || !in || !w)
        return error_set(err, ERR_INVALID_ARG, "cuda matmul: NULL tensor (out=%p in=%p w=%p)",
                         (void *)out, (const void *)in, w);
    return cuda_backend_enter(cb, err);
}

/* One call through a path (arguments checked, device current). */
static int mm_run(struct cuda_backend *cb, enum kern_cuda_mm_path path, float *out,
                  const float *in, const void *w, enum kern_dtype dtype, int n, int d_in,
                  int d_out, char *err)
{
    /* int8 and int4: one kernel for every path (matmul_quant.cu); cuBLAS
     * has no such weights */
    if (dtype == KERN_DTYPE_Q8 || dtype == KERN_DTYPE_Q4) {
        if (path == KERN_CUDA_MM_CUBLAS)
            return error_set(err, ERR_UNSUPPORTED, "cuda matmul: the cuBLAS path takes no %s weights",
                             (dtype == KERN_DTYPE_Q8 ? "int8" : "int4"));
        return cuda_matmul_quantized(cb, out, in, w, dtype, n, d_in, d_out, err);
    }
    switch (path) {
    case KERN_CUDA_MM_AUTO:
    case KERN_CUDA_MM_TILED: {
        const enum mm_cfg cfg = mm_pick_cfg(cb, dtype, n, d_out);
        if (path == KERN_CUDA_MM_AUTO && (n < cb->mm_tiled_min_rows || cfg == MM_CFG_COUNT))
            return mm_skinny(cb, out, in, w, dtype, n, d_in, d_out, err);
        return mm_tiled(cb, cfg, out, in, w, dtype, n, d_in, d_out, err);
    }
    case KERN_CUDA_MM_SKINNY: return mm_skinny(cb, out, in, w, dtype, n, d_in, d_out, err);
    case KERN_CUDA_MM_TILED_32X32:
        return mm_tiled(cb, MM_CFG_32X32, out, in, w, dtype, n, d_in, d_out, err);
    case KERN_CUDA_MM_TILED_16X32:
        return mm_tiled(cb, MM_CFG_16X32, out, in, w, dtype, n, d_in, d_out, err);
    case KERN_CUDA_MM_TILED_16X16:
        return mm_tiled(cb, MM_CFG_16X16, out, in, w, dtype, n, d_in, d_out, err);
    case KERN_CUDA_MM_CUBLAS: return mm_cublas(cb, out, in, w, dtype, n, d_in, d_out, err);
    }
    return error_set(err, ERR_INVALID_ARG, "cuda matmul: unknown path %d", (int)path);
}

int cuda_matmul(struct kern_backend *be, float *out, const float *in, const void *w,
                enum kern_dtype dtype, int n, int d_in, int d_out, char *err)
{
    struct cuda_backend *cb = cuda_backend_of(be);
    int rc = mm_check(cb, out, in, w, dtype, n, d_in, d_out, err);
    if (rc != 0)
        return rc < 0 ? rc : 0;
    return mm_run(cb, KERN_CUDA_MM_AUTO, out, in, w, dtype, n, d_in, d_out, err);
}

bool cuda_matmul_is_skinny(struct cuda_backend *cb, enum kern_dtype dtype, int n, int d_out)
{
    return dtype != KERN_DTYPE_Q8 && dtype != KERN_DTYPE_Q4 &&
           (n < cb->mm_tiled_min_rows || mm_pick_cfg(cb, dtype, n, d_out) == MM_CFG_COUNT);
}

int cuda_matmul_multi(struct kern_backend *be, int count, float *const *outs, const float *in,
                      const void *const *ws, enum kern_dtype dtype, int n, int d_in,
                      const int *d_outs, char *err)
{
    struct cuda_backend *cb = cuda_backend_of(be);
    if (count < 1 || count > MM_PARTS_MAX || !outs || !ws || !d_outs)
        return error_set(err, ERR_INVALID_ARG, "cuda matmul_multi: %d weights (1..%d)", count,
                         MM_PARTS_MAX);
    struct mm_parts parts = {};
    long cols = 0;
    for (int j = 0; j < count; j++) {
        int rc = mm_check(cb, outs[j], in, ws[j], dtype, n, d_in, d_outs[j], err);
        if (rc < 0)
            return rc;
        if (rc > 0) /* nothing to do for any part (n == 0) or for this one */
            continue;
        cols += d_outs[j];
        parts.out[parts.count] = outs[j];
        parts.w[parts.count] = ws[j];
        parts.col_end[parts.count] = (int)cols;
        parts.count++;
    }
    if (parts.count == 0)
        return 0;
    /* one launch where the skinny kernel takes the call (cuda_matmul's
     * choice, the same bits), else one product per weight */
    const bool skinny = cols <= INT32_MAX && cuda_matmul_is_skinny(cb, dtype, n, d_outs[0]);
    if (skinny)
        return mm_skinny_parts(cb, parts, in, dtype, n, d_in, err);
    for (int j = 0; j < parts.count; j++) {
        const int d_out = parts.col_end[j] - (j > 0 ? parts.col_end[j - 1] : 0);
        int rc = mm_run(cb, KERN_CUDA_MM_AUTO, parts.out[j], in, parts.w[j], dtype, n, d_in,
                        d_out, err);
        if (rc < 0)
            return rc;
    }
    return 0;
}

extern "C" int kern_cuda_matmul_path(struct kern_backend *be, enum kern_cuda_mm_path path,
                                     float *out, const float *in, const void *w,
                                     enum kern_dtype dtype, int n, int d_in, int d_out, char *err)
{
    if (!be || strcmp(be->name, "cuda") != 0)
        return error_set(err, ERR_INVALID_ARG, "kern_cuda_matmul_path: not a cuda backend");
    struct cuda_backend *cb = cuda_backend_of(be);
    int rc = mm_check(cb, out, in, w, dtype, n, d_in, d_out, err);
    if (rc != 0)
        return rc < 0 ? rc : 0;
    return mm_run(cb, path, out, in, w, dtype, n, d_in, d_out, err);
}

extern "C" int kern_cuda_matmul_tiled_min_rows(const struct kern_backend *be)
{
    if (!be || strcmp(be->name, "cuda") != 0)
        return ERR_INVALID_ARG;
    return ((const struct cuda_backend *)be)->mm_tiled_min_rows;
}

extern "C" int kern_cuda_matmul_time(struct kern_backend *be, enum kern_cuda_mm_path path,
                                     float *out, const float *in, const void *const *w, int n_w,
                                     enum kern_dtype dtype, int n, int d_in, int d_out, int calls,
                                     double *ms_per_call, char *err)
{
    *ms_per_call = 0.0;
    if (!be || strcmp(be->name, "cuda") != 0)
        return error_set(err, ERR_INVALID_ARG, "kern_cuda_matmul_time: not a cuda backend");
    if (!w || n_w < 1 || calls < 1)
        return error_set(err, ERR_INVALID_ARG,
                         "kern_cuda_matmul_time: need weights (n_w=%d) and calls >= 1 (%d)", n_w,
                         calls);
    struct cuda_backend *cb = cuda_backend_of(be);
    int rc = mm_check(cb, out, in, w[0], dtype, n, d_in, d_out, err);
    if (rc != 0)
        return rc < 0 ? rc : 0;
    cudaEvent_t start = NULL, stop = NULL;
    float ms = 0.0f;
    cudaError_t e = cudaEventCreate(&start);
    if (e == cudaSuccess)
        e = cudaEventCreate(&stop);
    if (e == cudaSuccess)
        e = cudaEventRecord(start, cb->stream);
    if (e != cudaSuccess) {
        rc = cuda_backend_fail(err, e, __func__, "cudaEventCreate/cudaEventRecord(start)");
        goto done;
    }
    for (int i = 0; i < calls && rc == 0; i++)
        rc = mm_run(cb, path, out, in, w[i % n_w], dtype, n, d_in, d_out, err);
    if (rc < 0)
        goto done;
    e = cudaEventRecord(stop, cb->stream);
    if (e == cudaSuccess)
        e = cudaEventSynchronize(stop);
    if (e == cudaSuccess)
        e = cudaEventElapsedTime(&ms, start, stop);
    if (e != cudaSuccess) {
        rc = cuda_backend_fail(err, e, __func__, "cudaEventRecord/Synchronize/ElapsedTime(stop)");
        goto done;
    }
    *ms_per_call = (double)ms / (double)calls;
done:
    if (start)
        (void)cudaEventDestroy(start);
    if (stop)
        (void)cudaEventDestroy(stop);
    return rc;
}
