/* matmul.cu: cuda_matmul, out[i][o] = sum_k in[i][k] * w[o][k], f32 results,
 * the twin of kernels/cpu/matmul.c. Weights bf16, f16 or f32 in HF layout
 * w[d_out][d_in]; activations f32.
 *
 * Two paths, chosen by n (the number of rows) and the weight dtype:
 *
 * 1. Skinny path, n <= MM_SKINNY_MAX (17): our own batch-invariant kernel.
 *    Speculation verifies [g, t1..tK] in one call of n = K+1 rows (K <= 16)
 *    and needs each of those rows bit-identical to the same row decoded
 *    alone (n = 1); so every n in 1..17 must take this path, and cuBLAS
 *    (whose kernel choice and reduction order depend on n) only n > 17.
 *    One warp per output element column o, all n rows at once (the weight
 *    row is read from memory once per call). Fixed reduction order, a
 *    function of d_in alone: lane l owns the elements k with
 *    (k / 8) % 32 == l and accumulates them in increasing k, one
 *    __fmaf_rn(w[o][k], in[i][k], acc) each, into its own accumulator per
 *    row; then the 32 lane sums are folded by the xor butterfly 16, 8, 4,
 *    2, 1 (cuda_warp_sum). Loads are 16-byte vectors when d_in % 8 == 0 and
 *    both pointers are 16-byte aligned, scalar otherwise; both load paths
 *    feed the same sequence of FMAs, so alignment (e.g. an input pointer
 *    offset by a few rows) never changes a bit. Kernels are instantiated for
 *    up to 1 and up to 17 rows; row i's accumulator sees the same
 *    operations in both.
 *
 * 2. n > 17 (prefill): cuBLAS, cublasGemmEx with CUBLAS_COMPUTE_32F.
 *    - bf16 weights: cuBLAS needs A and B of one type, so the activations
 *      are rounded to bf16 (round to nearest even) in scratch first. Each
 *      product then carries the activation's bf16 rounding (relative error
 *      <= 2^-9 per term); accumulation is f32. This is the precision of a
 *      bf16 HuggingFace forward pass, and coarser than the CPU backend
 *      (which keeps f32 activations): prefill rows agree with the CPU
 *      within |err| <= 2^-8 * sum_k |w[o][k] * in[i][k]|. The hidden
 *      states and the KV cache written by a prefill are deterministic for a
 *      given prompt and chunking, which is all greedy exactness needs:
 *      speculative and plain decoding prefill the same way.
 *    - f32 weights: f32 GEMM with f32 compute (no TF32: default math mode).
 *    - f16 weights: no cuBLAS (f16 activations could overflow at 65504);
 *      the skinny kernel runs over groups of 17 rows instead. Exact and
 *      batch invariant, but it reads the weights once per group: slow for
 *      long prompts. Llama checkpoints are bf16, so this is a test path.
 */
#include <cuda_bf16.h>

#include "cuda_backend.h"

#define MM_SKINNY_MAX 17 /* rows: n = 1..17 never reach cuBLAS (see above) */
#define MM_THREADS 128   /* 4 warps = 4 output columns per block */
#define MM_ROWS_PER_BLOCK (MM_THREADS / 32)

/* Eight consecutive weights w[off .. off+7] as f32; off % 8 == 0 and the
 * address 16-byte aligned (the caller checked). */
template <int DT>
static __device__ __forceinline__ void mm_load8_vec(const void *w, size_t off, float v[8])
{
    if (DT == KERN_DTYPE_F32) {
        const float4 *p = (const float4 *)((const float *)w + off);
        const float4 a = __ldg(p), b = __ldg(p + 1);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
        v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    } else {
        const uint4 u = __ldg((const uint4 *)((const uint16_t *)w + off));
        const unsigned int words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int q = 0; q < 4; q++) {
            /* little endian: element 2q is the low half of word q */
            if (DT == KERN_DTYPE_BF16) {
                v[2 * q] = cuda_bf16_bits_to_f32(words[q] & 0xffffu);
                v[2 * q + 1] = cuda_bf16_bits_to_f32(words[q] >> 16);
            } else {
                v[2 * q] = cuda_f16_bits_to_f32(words[q] & 0xffffu);
                v[2 * q + 1] = cuda_f16_bits_to_f32(words[q] >> 16);
            }
        }
    }
}

/* out[i][o] for i < n <= MAXR, one warp per o (see the file header for the
 * order). vec: d_in % 8 == 0 and w, in 16-byte aligned. */
template <int DT, int MAXR>
__global__ void __launch_bounds__(MM_THREADS)
    mm_skinny_kernel(float *__restrict__ out, const float *__restrict__ in,
                     const void *__restrict__ w, int n, int d_in, int d_out, int vec)
{
    const int o = (int)(((size_t)blockIdx.x * MM_THREADS + threadIdx.x) >> 5);
    const int lane = threadIdx.x & 31;
    if (o >= d_out)
        return; /* uniform over the warp */
    const size_t wrow = (size_t)o * (size_t)d_in;
    float acc[MAXR];
#pragma unroll
    for (int r = 0; r < MAXR; r++)
        acc[r] = 0.0f;

    for (int c = lane * 8; c < d_in; c += 256) {
        const int m = d_in - c < 8 ? d_in - c : 8; /* valid elements in this chunk */
        float wv[8];
        if (vec) {
            mm_load8_vec<DT>(w, wrow + (size_t)c, wv);
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++)
                wv[e] = e < m ? cuda_load_weight(w, DT, wrow + (size_t)(c + e)) : 0.0f;
        }
#pragma unroll
        for (int r = 0; r < MAXR; r++) {
            if (r < n) {
                const float *xr = in + (size_t)r * (size_t)d_in + (size_t)c;
                float xv[8];
                if (vec) {
                    const float4 a = __ldg((const float4 *)xr), b = __ldg((const float4 *)xr + 1);
                    xv[0] = a.x, xv[1] = a.y, xv[2] = a.z, xv[3] = a.w;
                    xv[4] = b.x, xv[5] = b.y, xv[6] = b.z, xv[7] = b.w;
                } else {
#pragma unroll
                    for (int e = 0; e < 8; e++)
                        xv[e] = e < m ? xr[e] : 0.0f;
                }
#pragma unroll
                for (int e = 0; e < 8; e++)
                    if (e < m)
                        acc[r] = __fmaf_rn(wv[e], xv[e], acc[r]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < MAXR; r++) {
        if (r < n) {
            const float v = cuda_warp_sum(acc[r]);
            if (lane == 0)
                out[(size_t)r * (size_t)d_out + (size_t)o] = v;
        }
    }
}

__global__ void f32_to_bf16_kernel(__nv_bfloat16 *dst, const float *src, size_t count)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < count; k += stride)
        dst[k] = __float2bfloat16_rn(src[k]);
}

template <int DT>
static void mm_skinny_launch_dt(cudaStream_t stream, unsigned int blocks, float *out,
                                const float *in, const void *w, int n, int d_in, int d_out, int vec)
{
    if (n == 1)
        mm_skinny_kernel<DT, 1><<<blocks, MM_THREADS, 0, stream>>>(out, in, w, n, d_in, d_out, vec);
    else
        mm_skinny_kernel<DT, MM_SKINNY_MAX>
            <<<blocks, MM_THREADS, 0, stream>>>(out, in, w, n, d_in, d_out, vec);
}

/* Rows [0, n) with n <= MM_SKINNY_MAX. */
static int mm_skinny_launch(struct cuda_backend *cb, float *out, const float *in, const void *w,
                            enum kern_dtype dtype, int n, int d_in, int d_out, char *err)
{
    const int vec = d_in % 8 == 0 && (uintptr_t)w % 16 == 0 && (uintptr_t)in % 16 == 0;
    const unsigned int blocks =
        (unsigned int)((d_out + MM_ROWS_PER_BLOCK - 1) / MM_ROWS_PER_BLOCK);
    switch (dtype) {
    case KERN_DTYPE_BF16:
        mm_skinny_launch_dt<KERN_DTYPE_BF16>(cb->stream, blocks, out, in, w, n, d_in, d_out, vec);
        break;
    case KERN_DTYPE_F16:
        mm_skinny_launch_dt<KERN_DTYPE_F16>(cb->stream, blocks, out, in, w, n, d_in, d_out, vec);
        break;
    case KERN_DTYPE_F32:
        mm_skinny_launch_dt<KERN_DTYPE_F32>(cb->stream, blocks, out, in, w, n, d_in, d_out, vec);
        break;
    }
    CUDA_CHECK_LAUNCH("mm_skinny_kernel");
    return 0;
}

/* n > MM_SKINNY_MAX through cuBLAS. Row-major out[n][d_out] is column-major
 * out^T (d_out x n, ld d_out) = op(A) * B with A = w seen column-major as
 * (d_in x d_out, ld d_in) transposed, B = in seen as (d_in x n, ld d_in). */
static int mm_cublas(struct cuda_backend *cb, float *out, const float *in, const void *w,
                     enum kern_dtype dtype, int n, int d_in, int d_out, char *err)
{
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

int cuda_matmul(struct kern_backend *be, float *out, const float *in, const void *w,
                enum kern_dtype dtype, int n, int d_in, int d_out, char *err)
{
    struct cuda_backend *cb = cuda_backend_of(be);
    int rc = cuda_backend_check_dtype(dtype, "matmul", err);
    if (rc < 0)
        return rc;
    if (n < 0 || d_in < 0 || d_out < 0)
        return error_set(err, ERR_INVALID_ARG, "cuda matmul: negative shape n=%d d_in=%d d_out=%d",
                         n, d_in, d_out);
    if (n == 0 || d_out == 0)
        return 0;
    if (!out || !in || !w)
        return error_set(err, ERR_INVALID_ARG, "cuda matmul: NULL tensor (out=%p in=%p w=%p)",
                         (void *)out, (const void *)in, w);
    if ((rc = cuda_backend_enter(cb, err)) < 0)
        return rc;
    if (n > MM_SKINNY_MAX && dtype != KERN_DTYPE_F16 && d_in > 0)
        return mm_cublas(cb, out, in, w, dtype, n, d_in, d_out, err);
    for (int r0 = 0; r0 < n; r0 += MM_SKINNY_MAX) {
        const int rows = n - r0 < MM_SKINNY_MAX ? n - r0 : MM_SKINNY_MAX;
        rc = mm_skinny_launch(cb, out + (size_t)r0 * (size_t)d_out, in + (size_t)r0 * (size_t)d_in,
                              w, dtype, rows, d_in, d_out, err);
        if (rc < 0)
            return rc;
    }
    return 0;
}
