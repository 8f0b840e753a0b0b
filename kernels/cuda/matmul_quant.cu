/* matmul_quant.cu: cuda_matmul_quantized, out[i][o] = sum_k in[i][k] *
 * w[o][k] for int8 and int4 weights (KERN_DTYPE_Q8, KERN_DTYPE_Q4; their
 * layouts in kernels.h), f32 activations and results, any n.
 *
 * The order is matmul.cu's skinny order (read its header): lane l of the
 * warp of output column o is class l, the chunks [256 j + 8 l, + 8) in
 * increasing k, one f32 accumulator per class and row, folded by
 * cuda_warp_sum. What differs is the weight an FMA takes:
 *   int8: the value q[o][k] widened to f32 (exact); the row's scale is
 *         applied once to the folded sum: out = __fmul_rn(sum, scale[o]),
 *         as the CPU's direct path does;
 *   int4: (n - 8) * scale of its group, computed as the CPU computes it,
 *         __fmaf_rn(n, scale, -8 * scale) (-8 * scale is exact): the same
 *         f32 weight bits as the CPU, element for element.
 * So a row's bits depend on d_in alone, never on n (batch invariance, the
 * exactness contract of kernels.h); they differ from the CPU's bits only by
 * the summation order (the CPU adds in its own fixed order), within the f32
 * bound the GPU tests check.
 *
 * One kernel for every n (launches of up to MM_Q_MAX rows): quantized
 * weights are for decode and short verifications, where each weight is
 * read once for all rows; a prefill reads them once per MM_Q_MAX rows (a
 * tiled int8/int4 kernel is not built). d_in % 8 == 0 (int8; int4 rows are
 * whole groups of 32): every chunk is whole and 8-byte aligned.
 */
#include <string.h>

#include "cuda_backend.h"

#define MM_Q_MAX 17    /* rows per launch */
#define MM_Q_THREADS 128
#define MM_Q_COLS_PER_BLOCK (MM_Q_THREADS / 32)

/* Eight int8 weights at byte offset off (8-byte aligned) as f32. */
static __device__ __forceinline__ void mmq_load8_q8(const int8_t *w, size_t off, float v[8])
{
    const uint2 u = __ldg((const uint2 *)(w + off));
    const unsigned int words[2] = {u.x, u.y};
#pragma unroll
    for (int q = 0; q < 2; q++)
#pragma unroll
        for (int b = 0; b < 4; b++)
            v[4 * q + b] = (float)(int)(signed char)((words[q] >> (8 * b)) & 0xffu);
}

/* Elements c .. c + 7 (c % 8 == 0) of an int4 row as f32: group c / 32,
 * place c % 32 in it (0 and 8: low nibbles of bytes 0..7 and 8..15; 16 and
 * 24: the high nibbles of the same bytes). */
static __device__ __forceinline__ void mmq_load8_q4(const unsigned char *row, int c, float v[8])
{
    const unsigned char *g = row + (size_t)(c / KERN_Q4_GROUP) * KERN_Q4_GROUP_BYTES;
    const int j = c % KERN_Q4_GROUP;
    const float scale = __ldg((const float *)(g + KERN_Q4_GROUP / 2));
    const float bias = -8.0f * scale; /* exact: a power of two */
    const unsigned int *p = (const unsigned int *)(g + (j & 15)); /* 4-byte aligned: 20 g + 0 or 8 */
    const unsigned int words[2] = {__ldg(p), __ldg(p + 1)};
    const int shift = j >= 16 ? 4 : 0;
#pragma unroll
    for (int q = 0; q < 2; q++)
#pragma unroll
        for (int b = 0; b < 4; b++) {
            const unsigned int n = (words[q] >> (8 * b + shift)) & 15u;
            v[4 * q + b] = __fmaf_rn((float)n, scale, bias);
        }
}

/* out[i][o] for i < n <= MAXR, one warp per o. */
template <int DT, int MAXR>
__global__ void __launch_bounds__(MM_Q_THREADS)
    mmq_kernel(float *__restrict__ out, const float *__restrict__ in, const void *__restrict__ w, int n,
               int d_in, int d_out)
{
    const int o = (int)(((size_t)blockIdx.x * MM_Q_THREADS + threadIdx.x) >> 5);
    const int lane = threadIdx.x & 31;
    if (o >= d_out)
        return; /* uniform over the warp */
    float acc[MAXR];
#pragma unroll
    for (int r = 0; r < MAXR; r++)
        acc[r] = 0.0f;
    const size_t row_bytes = DT == KERN_DTYPE_Q8 ? (size_t)d_in
                                                 : (size_t)(d_in / KERN_Q4_GROUP) * KERN_Q4_GROUP_BYTES;
    const unsigned char *wrow = (const unsigned char *)w + (size_t)o * row_bytes;
    for (int c = lane * 8; c < d_in; c += 256) {
        float wv[8];
        if (DT == KERN_DTYPE_Q8)
            mmq_load8_q8((const int8_t *)wrow, (size_t)c, wv);
        else
            mmq_load8_q4(wrow, c, wv);
#pragma unroll
        for (int r = 0; r < MAXR; r++) {
            if (r < n) {
                const float4 *xr = (const float4 *)(in + (size_t)r * (size_t)d_in + (size_t)c);
                const float4 a = __ldg(xr), b = __ldg(xr + 1);
                const float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
                for (int e = 0; e < 8; e++)
                    acc[r] = __fmaf_rn(wv[e], xv[e], acc[r]);
            }
        }
    }
    float scale = 1.0f;
    if (DT == KERN_DTYPE_Q8)
        scale = __ldg((const float *)((const unsigned char *)w + kern_q8_scales_offset_dev(d_out, d_in)) + o);
#pragma unroll
    for (int r = 0; r < MAXR; r++) {
        if (r < n) {
            float v = cuda_warp_sum(acc[r]);
            if (DT == KERN_DTYPE_Q8)
                v = __fmul_rn(v, scale);
            if (lane == 0)
                out[(size_t)r * (size_t)d_out + (size_t)o] = v;
        }
    }
}

template <int DT>
static void mmq_launch_dt(cudaStream_t stream, unsigned int blocks, float *out, const float *in, const void *w,
                          int n, int d_in, int d_out)
{
    if (n == 1)
        mmq_kernel<DT, 1><<<blocks, MM_Q_THREADS, 0, stream>>>(out, in, w, n, d_in, d_out);
    else
        mmq_kernel<DT, MM_Q_MAX><<<blocks, MM_Q_THREADS, 0, stream>>>(out, in, w, n, d_in, d_out);
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
    const unsigned int blocks = (unsigned int)((d_out + MM_Q_COLS_PER_BLOCK - 1) / MM_Q_COLS_PER_BLOCK);
    for (int r0 = 0; r0 < n; r0 += MM_Q_MAX) {
        const int rows = n - r0 < MM_Q_MAX ? n - r0 : MM_Q_MAX;
        float *o = out + (size_t)r0 * (size_t)d_out;
        const float *x = in + (size_t)r0 * (size_t)d_in;
        if (dtype == KERN_DTYPE_Q8)
            mmq_launch_dt<KERN_DTYPE_Q8>(cb->stream, blocks, o, x, w, rows, d_in, d_out);
        else
            mmq_launch_dt<KERN_DTYPE_Q4>(cb->stream, blocks, o, x, w, rows, d_in, d_out);
        CUDA_CHECK_LAUNCH("mmq_kernel");
    }
    return 0;
}
