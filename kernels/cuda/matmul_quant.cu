/* matmul_quant.cu: cuda_matmul_quantized, out[i][o] = sum_k in[i][k] *
 * w[o][k] for int8 and int4 weights (KERN_DTYPE_Q8, KERN_DTYPE_Q4; their
 * layouts in kernels.h), f32 activations and results, any n.
 *
 * The CPU's contract for these weights (kernels/cpu/qdot.h, rules 1-3;
 * docs/quantization.md, "Integer products"), computed the same way, so the
 * GPU gives the CPU's bits:
 *   1. each input row is quantized alone in blocks of 32 columns (the last
 *      padded with zeros) by mmq_quantize_kernel: amax over the block; a
 *      block with an infinity or a NaN gets scale NaN and codes 0; amax
 *      below 2^-96: scale 0, codes 0; else inv = 127 / amax, q =
 *      nearest-even(x * inv), s = amax / 127, each an IEEE f32 operation
 *      rounded once (__fdiv_rn, __fmul_rn, __float2int_rn);
 *   2. isum = sum over the block of w * q in int32 (__dp4a: exact, so the
 *      order is free), int4 nibbles n taken as the signed bytes n - 8;
 *   3. one float epilogue, blocks in increasing order, for every n:
 *        int8: acc = fma((float)isum, s_b, acc), then out = acc * scale[o]
 *        int4: acc = fma((float)isum, scale[o][b] * s_b, acc), out = acc.
 * One warp per output column: lane l forms the isums of blocks 32 j + l,
 * then the warp walks those 32 blocks in order, every lane taking each
 * block's isum and scales by shuffle, so the chain of FMAs is the CPU's
 * chain. A row's bits depend on its own inputs and d_in alone: the same
 * for every n (batch invariance, kernels.h) and equal to the CPU's.
 *
 * One kernel for every n (launches of up to MM_Q_MAX rows): quantized
 * weights are for decode and short verifications, where each weight is
 * read once for all rows; a prefill reads them once per MM_Q_MAX rows (a
 * tiled int8/int4 kernel is not built). d_in % 8 == 0 (int8; int4 rows are
 * whole groups of 32): every 8-byte load of a row is whole and aligned.
 */
#include <float.h>
#include <string.h>

#include "cuda_backend.h"

#define MM_Q_MAX 17    /* rows per launch */
#define MM_Q_THREADS 128
#define MM_Q_COLS_PER_BLOCK (MM_Q_THREADS / 32)
#define MMQ_BLOCK 32          /* qdot.h's QD_BLOCK: activation block, int4 group */
#define MMQ_TINY 0x1p-96f     /* qdot.h's QD_TINY */
#define MMQ_FULL 0xffffffffu

/* Bytes of the activation scratch for n rows of nb blocks: the codes, then
 * (16-byte aligned) the scales. */
static size_t mmq_act_bytes(int n, int nb, size_t *scales_at)
{
    const size_t codes = (size_t)n * (size_t)nb * MMQ_BLOCK;
    *scales_at = (codes + 15) & ~(size_t)15;
    return *scales_at + (size_t)n * (size_t)nb * sizeof(float);
}

/* Rule 1: one warp per (row, block), lane l the block's column l. */
__global__ void mmq_quantize_kernel(int8_t *__restrict__ q, float *__restrict__ s, const float *__restrict__ in,
                                    int n, int d_in, int nb)
{
    const size_t blk = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (blk >= (size_t)n * (size_t)nb)
        return; /* uniform over the warp */
    const size_t r = blk / (size_t)nb;
    const int c = (int)(blk % (size_t)nb) * MMQ_BLOCK + lane;
    const float x = c < d_in ? in[r * (size_t)d_in + (size_t)c] : 0.0f;
    const float v = fabsf(x);
    const bool bad = !(v <= FLT_MAX);
    float amax = bad ? 0.0f : v;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        amax = fmaxf(amax, __shfl_xor_sync(MMQ_FULL, amax, off));
    int code = 0;
    float scale;
    if (__any_sync(MMQ_FULL, bad)) {
        scale = __int_as_float(0x7fc00000); /* NaN, as the CPU's NAN */
    } else if (amax < MMQ_TINY) {
        scale = 0.0f;
    } else {
        const float inv = __fdiv_rn(127.0f, amax);
        code = __float2int_rn(__fmul_rn(x, inv));
        scale = __fdiv_rn(amax, 127.0f);
    }
    q[blk * MMQ_BLOCK + (size_t)lane] = (int8_t)code;
    if (lane == 0)
        s[blk] = scale;
}

/* Block b of an int8 row (d_in bytes) as 8 words of 4 signed bytes,
 * columns 32 b + 4 i + t in byte t of word i; columns past d_in are 0. */
static __device__ __forceinline__ void mmq_block_q8(const unsigned char *row, int b, int d_in, int wq[8])
{
#pragma unroll
    for (int m = 0; m < 4; m++) {
        const int c = b * MMQ_BLOCK + 8 * m;
        uint2 u = make_uint2(0u, 0u);
        if (c < d_in)
            u = __ldg((const uint2 *)(row + c));
        wq[2 * m] = (int)u.x;
        wq[2 * m + 1] = (int)u.y;
    }
}

/* Group b of an int4 row as 8 words of signed bytes n - 8 in the same
 * column order (columns j < 16: the low nibbles of bytes j, 16 + j: their
 * high nibbles), and its scale. */
static __device__ __forceinline__ float mmq_block_q4(const unsigned char *row, int b, int wq[8])
{
    const unsigned char *g = row + (size_t)b * KERN_Q4_GROUP_BYTES;
    const unsigned int *p = (const unsigned int *)g; /* 4-byte aligned: 20 b */
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const unsigned int u = __ldg(p + i);
        wq[i] = (int)__vsub4(u & 0x0f0f0f0fu, 0x08080808u);
        wq[4 + i] = (int)__vsub4((u >> 4) & 0x0f0f0f0fu, 0x08080808u);
    }
    return __ldg((const float *)(g + KERN_Q4_GROUP / 2));
}

/* Rules 2 and 3: out[i][o] for i < n <= MAXR, one warp per o, from the
 * codes q [n][nb * 32] and scales s [n][nb] of mmq_quantize_kernel. */
template <int DT, int MAXR>
__global__ void __launch_bounds__(MM_Q_THREADS)
    mmq_kernel(float *__restrict__ out, const int8_t *__restrict__ q, const float *__restrict__ s,
               const void *__restrict__ w, int n, int d_in, int d_out, int nb)
{
    const int o = (int)(((size_t)blockIdx.x * MM_Q_THREADS + threadIdx.x) >> 5);
    const int lane = threadIdx.x & 31;
    if (o >= d_out)
        return; /* uniform over the warp */
    float acc[MAXR];
#pragma unroll
    for (int r = 0; r < MAXR; r++)
        acc[r] = 0.0f;
    const size_t row_bytes = DT == KERN_DTYPE_Q8 ? (size_t)d_in : (size_t)nb * KERN_Q4_GROUP_BYTES;
    const unsigned char *wrow = (const unsigned char *)w + (size_t)o * row_bytes;
    for (int b0 = 0; b0 < nb; b0 += 32) {
        const int b = b0 + lane;
        int isum[MAXR];
        float sb[MAXR];
        float wsc = 0.0f;
        if (b < nb) {
            int wq[8];
            if (DT == KERN_DTYPE_Q8)
                mmq_block_q8(wrow, b, d_in, wq);
            else
                wsc = mmq_block_q4(wrow, b, wq);
#pragma unroll
            for (int r = 0; r < MAXR; r++) {
                isum[r] = 0;
                sb[r] = 0.0f;
                if (r < n) {
                    const int4 *qa = (const int4 *)(q + ((size_t)r * (size_t)nb + (size_t)b) * MMQ_BLOCK);
                    const int4 lo = __ldg(qa), hi = __ldg(qa + 1);
                    const int xq[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
                    int sum = 0;
#pragma unroll
                    for (int i = 0; i < 8; i++)
                        sum = __dp4a(wq[i], xq[i], sum);
                    isum[r] = sum;
                    sb[r] = __ldg(s + (size_t)r * (size_t)nb + (size_t)b);
                }
            }
        } else {
#pragma unroll
            for (int r = 0; r < MAXR; r++) {
                isum[r] = 0;
                sb[r] = 0.0f;
            }
        }
        /* the epilogue in block order: block b0 + j's figures from lane j */
        const int count = nb - b0 < 32 ? nb - b0 : 32;
        for (int j = 0; j < count; j++) {
            const float wj = __shfl_sync(MMQ_FULL, wsc, j);
#pragma unroll
            for (int r = 0; r < MAXR; r++) {
                const float ij = (float)__shfl_sync(MMQ_FULL, isum[r], j);
                const float sj = __shfl_sync(MMQ_FULL, sb[r], j);
                if (r < n)
                    acc[r] = DT == KERN_DTYPE_Q8 ? __fmaf_rn(ij, sj, acc[r])
                                                 : __fmaf_rn(ij, __fmul_rn(wj, sj), acc[r]);
            }
        }
    }
    float scale = 1.0f;
    if (DT == KERN_DTYPE_Q8)
        scale = __ldg((const float *)((const unsigned char *)w + kern_q8_scales_offset_dev(d_out, d_in)) + o);
#pragma unroll
    for (int r = 0; r < MAXR; r++) {
        if (r < n && lane == 0)
            out[(size_t)r * (size_t)d_out + (size_t)o] = DT == KERN_DTYPE_Q8 ? __fmul_rn(acc[r], scale) : acc[r];
    }
}

template <int DT>
static void mmq_launch_dt(cudaStream_t stream, unsigned int blocks, float *out, const int8_t *q, const float *s,
                          const void *w, int n, int d_in, int d_out, int nb)
{
    if (n == 1)
        mmq_kernel<DT, 1><<<blocks, MM_Q_THREADS, 0, stream>>>(out, q, s, w, n, d_in, d_out, nb);
    else
        mmq_kernel<DT, MM_Q_MAX><<<blocks, MM_Q_THREADS, 0, stream>>>(out, q, s, w, n, d_in, d_out, nb);
}

int cuda_matmul_quantized(struct cuda_backend *cb, float *out, const float *in, const void *w,
                          enum kern_dtype dtype, int n, int d_in, int d_out, char *err)
{
    if (dtype != KERN_DTYPE_Q8 && dtype != KERN_DTYPE_Q4)
        return error_set(err, ERR_INVALID_ARG, "cuda matmul: dtype %d is not a quantized one", (int)dtype);
    const int group = dtype == KERN_DTYPE_Q8 ? 8 : KERN_Q4_GROUP;
    if (d_in % group != 0)
        return error_set(err, ERR_UNSUPPORTED, "cuda matmul: %s weights need d_in %% %d == 0, got d_in %d",
                         (dtype == KERN_DTYPE_Q8 ? "int8" : "int4"), group, d_in);
    if ((uintptr_t)w % 16 != 0 || (uintptr_t)in % 16 != 0)
        return error_set(err, ERR_INVALID_ARG, "cuda matmul: %s weights and activations must be 16-byte "
                         "aligned (w %p, in %p)", (dtype == KERN_DTYPE_Q8 ? "int8" : "int4"), w, (const void *)in);
    if (n <= 0 || d_out <= 0)
        return 0;
    /* every row quantized once (rule 1), into the backend's scratch: grown
     * by the first call of a shape, before any graph records it */
    const int nb = (d_in + MMQ_BLOCK - 1) / MMQ_BLOCK;
    size_t scales_at = 0;
    const size_t act_bytes = mmq_act_bytes(n, nb, &scales_at);
    int rc = cuda_backend_scratch(cb, &cb->mmq_act, &cb->mmq_act_bytes, act_bytes, "cuda int8 activations", err);
    if (rc < 0)
        return rc;
    int8_t *qcodes = (int8_t *)cb->mmq_act;
    float *qscales = (float *)((unsigned char *)cb->mmq_act + scales_at);
    const size_t warps = (size_t)n * (size_t)nb;
    mmq_quantize_kernel<<<cuda_grid_1d(warps * 32, 256), 256, 0, cb->stream>>>(qcodes, qscales, in, n, d_in, nb);
    CUDA_CHECK_LAUNCH("mmq_quantize_kernel");
    const unsigned int blocks = (unsigned int)((d_out + MM_Q_COLS_PER_BLOCK - 1) / MM_Q_COLS_PER_BLOCK);
    for (int r0 = 0; r0 < n; r0 += MM_Q_MAX) {
        const int rows = n - r0 < MM_Q_MAX ? n - r0 : MM_Q_MAX;
        float *o = out + (size_t)r0 * (size_t)d_out;
        const int8_t *xq = qcodes + (size_t)r0 * (size_t)nb * MMQ_BLOCK;
        const float *xs = qscales + (size_t)r0 * (size_t)nb;
        if (dtype == KERN_DTYPE_Q8)
            mmq_launch_dt<KERN_DTYPE_Q8>(cb->stream, blocks, o, xq, xs, w, rows, d_in, d_out, nb);
        else
            mmq_launch_dt<KERN_DTYPE_Q4>(cb->stream, blocks, o, xq, xs, w, rows, d_in, d_out, nb);
        CUDA_CHECK_LAUNCH("mmq_kernel");
    }
    return 0;
}
