/* matmul_swiglu.cu: cuda_matmul_swiglu, gate = silu(in x w_gate^T) *
 * (in x w_up^T), the MLP's two products and its SwiGLU in one launch where
 * the skinny kernels take the call (decode, small verifications).
 *
 * One warp per column o computes the column of both products, each
 * accumulator in the skinny order (matmul.cu's header: lane l is class l,
 * chunks in increasing k, then the xor butterfly), so g and u are the bits
 * cuda_matmul gives them; lane 0 then applies cuda_swiglu's formula,
 * g / (1 + expf(-g)) * u, each operation rounded as there. So the result is
 * the bits of matmul, matmul and swiglu, without writing u and g to memory
 * and reading them back, and with one launch instead of two. Elsewhere
 * (more rows: the tiled kernel; int8 and int4 weights) it runs exactly
 * those three ops, up as their scratch.
 */
#include "cuda_backend.h"
#include "matmul_skinny.cuh"

/* One 8-element chunk (m valid) of every row r < n: acc_g[r] and
 * acc_u[r] take the chunk's products in increasing k. */
template <int MAXR>
static __device__ __forceinline__ void mm_swiglu_chunk(float (&acc_g)[MAXR], float (&acc_u)[MAXR],
                                                       const float (&gv)[8], const float (&uv)[8],
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
            for (int e = 0; e < 8; e++)
                if (e < m) {
                    acc_g[r] = __fmaf_rn(gv[e], xv[e], acc_g[r]);
                    acc_u[r] = __fmaf_rn(uv[e], xv[e], acc_u[r]);
                }
        }
    }
}

/* gate[i][o] for i < n <= MAXR; vec as in mm_skinny_kernel. */
template <int DT, int MAXR>
__global__ void __launch_bounds__(MM_THREADS)
    mm_swiglu_kernel(float *__restrict__ gate, const float *__restrict__ in,
                     const void *__restrict__ wg, const void *__restrict__ wu, int n, int d_in,
                     int d_out, int vec)
{
    const int o = (int)(((size_t)blockIdx.x * MM_THREADS + threadIdx.x) >> 5);
    const int lane = threadIdx.x & 31;
    if (o >= d_out)
        return; /* uniform over the warp */
    const size_t wrow = (size_t)o * (size_t)d_in;
    float acc_g[MAXR], acc_u[MAXR];
#pragma unroll
    for (int r = 0; r < MAXR; r++)
        acc_g[r] = acc_u[r] = 0.0f;

    /* AHEAD chunks' weights loaded before their products; not above 8
     * rows, where ptxas spilled the 17-row kernel with two */
    constexpr int AHEAD = MAXR <= 8 ? MM_COLS_AHEAD : 1;
    int c = lane * 8;
    if (vec) {
        for (; c + (AHEAD - 1) * 256 < d_in; c += AHEAD * 256) {
            float gv[AHEAD][8], uv[AHEAD][8];
#pragma unroll
            for (int u = 0; u < AHEAD; u++) {
                mm_load8_vec<DT>(wg, wrow + (size_t)(c + u * 256), gv[u]);
                mm_load8_vec<DT>(wu, wrow + (size_t)(c + u * 256), uv[u]);
            }
#pragma unroll
            for (int u = 0; u < AHEAD; u++)
                mm_swiglu_chunk<MAXR>(acc_g, acc_u, gv[u], uv[u], in, n, d_in, c + u * 256, 8,
                                      1);
        }
    }
    for (; c < d_in; c += 256) {
        const int m = d_in - c < 8 ? d_in - c : 8; /* valid elements in this chunk */
        float gv[8], uv[8];
        if (vec) {
            mm_load8_vec<DT>(wg, wrow + (size_t)c, gv);
            mm_load8_vec<DT>(wu, wrow + (size_t)c, uv);
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++) {
                gv[e] = e < m ? cuda_load_weight(wg, DT, wrow + (size_t)(c + e)) : 0.0f;
                uv[e] = e < m ? cuda_load_weight(wu, DT, wrow + (size_t)(c + e)) : 0.0f;
            }
        }
        mm_swiglu_chunk<MAXR>(acc_g, acc_u, gv, uv, in, n, d_in, c, m, vec);
    }
#pragma unroll
    for (int r = 0; r < MAXR; r++) {
        if (r < n) {
            const float g = cuda_warp_sum(acc_g[r]);
            const float u = cuda_warp_sum(acc_u[r]);
            if (lane == 0)
                gate[(size_t)r * (size_t)d_out + (size_t)o] =
                    __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
        }
    }
}

template <int DT>
static void mm_swiglu_launch_dt(cudaStream_t stream, float *gate, const float *in, const void *wg,
                                const void *wu, int n, int d_in, int d_out, int vec)
{
    const unsigned int blocks =
        (unsigned int)((d_out + MM_ROWS_PER_BLOCK - 1) / MM_ROWS_PER_BLOCK);
    if (n == 1)
        mm_swiglu_kernel<DT, 1><<<blocks, MM_THREADS, 0, stream>>>(gate, in, wg, wu, n, d_in,
                                                                    d_out, vec);
    else if (n <= 8)
        mm_swiglu_kernel<DT, 8><<<blocks, MM_THREADS, 0, stream>>>(gate, in, wg, wu, n, d_in,
                                                                    d_out, vec);
    else
        mm_swiglu_kernel<DT, MM_SKINNY_MAX><<<blocks, MM_THREADS, 0, stream>>>(
            gate, in, wg, wu, n, d_in, d_out, vec);
}

int cuda_matmul_swiglu(struct kern_backend *be, float *gate, float *up, const float *in,
                       const void *w_gate, const void *w_up, enum kern_dtype dtype, int n,
                       int d_in, int d_out, char *err)
{
    struct cuda_backend *cb = cuda_backend_of(be);
    if (n < 0 || d_in <= 0 || d_out <= 0)
        return error_set(err, ERR_INVALID_ARG,
                         "cuda matmul_swiglu: bad shape n=%d d_in=%d d_out=%d", n, d_in, d_out);
    if (n == 0)
        return 0;
    if (!gate || !up || !in || !w_gate || !w_up)
        return error_set(err, ERR_INVALID_ARG, "cuda matmul_swiglu: NULL tensor");
    int rc = cuda_backend_enter(cb, err);
    if (rc < 0)
        return rc;
    if (!cuda_matmul_is_skinny(cb, dtype, n, d_out)) {
        float *const outs[2] = {gate, up};
        const void *const ws[2] = {w_gate, w_up};
        const int d_outs[2] = {d_out, d_out};
        if ((rc = cuda_matmul_multi(be, 2, outs, in, ws, dtype, n, d_in, d_outs, err)))
            return rc;
        return cuda_swiglu(be, gate, gate, up, (size_t)n * (size_t)d_out, err);
    }
    if ((rc = cuda_backend_check_dtype(dtype, "matmul_swiglu", err)) < 0)
        return rc;
    const int vec = d_in % 8 == 0 && (uintptr_t)in % 16 == 0 && (uintptr_t)w_gate % 16 == 0 &&
                    (uintptr_t)w_up % 16 == 0;
    for (int r0 = 0; r0 < n; r0 += MM_SKINNY_MAX) {
        const int rows = n - r0 < MM_SKINNY_MAX ? n - r0 : MM_SKINNY_MAX;
        float *g = gate + (size_t)r0 * (size_t)d_out;
        const float *x = in + (size_t)r0 * (size_t)d_in;
        switch (dtype) {
        case KERN_DTYPE_BF16:
            mm_swiglu_launch_dt<KERN_DTYPE_BF16>(cb->stream, g, x, w_gate, w_up, rows, d_in, d_out,
                                                 vec);
            break;
        case KERN_DTYPE_F16:
            mm_swiglu_launch_dt<KERN_DTYPE_F16>(cb->stream, g, x, w_gate, w_up, rows, d_in, d_out,
                                                vec);
            break;
        default:
            mm_swiglu_launch_dt<KERN_DTYPE_F32>(cb->stream, g, x, w_gate, w_up, rows, d_in, d_out,
                                                vec);
            break;
        }
        CUDA_CHECK_LAUNCH("mm_swiglu_kernel");
    }
    return 0;
}
