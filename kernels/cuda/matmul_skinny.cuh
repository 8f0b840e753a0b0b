/* matmul_skinny.cuh: what the skinny matrix-vector kernels share
 * (matmul.cu: the op and matmul_multi; matmul_swiglu.cu: gate and up with
 * SwiGLU applied). Private to kernels/cuda; include after cuda_backend.h.
 * The order every skinny kernel keeps is stated in matmul.cu's header. */
#ifndef TANDEM_KERNELS_CUDA_MATMUL_SKINNY_CUH
#define TANDEM_KERNELS_CUDA_MATMUL_SKINNY_CUH

#define MM_SKINNY_MAX 17 /* rows per skinny launch */
#define MM_THREADS 128   /* skinny: 4 warps = 4 output columns per block */
#define MM_ROWS_PER_BLOCK (MM_THREADS / 32)

/* Rows from which cuda_matmul takes the tiled kernel by default (a speed
 * choice; both kernels give the same bits). The skinny kernels read each
 * weight once for all rows; the tiled kernel pads rows to 16 and is built
 * for prefill. 18: every verification (K + 1 <= 17 rows) takes the skinny
 * kernels (issue 56 item 3). A guess made without a GPU: the backend reads
 * TANDEM_CUDA_MM_TILED_MIN_ROWS once at create (cuda_backend's
 * mm_tiled_min_rows), so a GPU window compares thresholds without a
 * rebuild (tests/gpu/README.md); tandem-bench-kernels --backend cuda
 * prints the crossover. */
#define MM_TILED_MIN_ROWS 18
#define MM_TILED_MIN_ROWS_ENV "TANDEM_CUDA_MM_TILED_MIN_ROWS"

/* Chunks of a lane's class whose weights the several-row kernels
 * (mm_skinny_cols_kernel, mm_swiglu_kernel) load before the first one's
 * products, where the chunks are whole and aligned: two 16-byte loads a
 * column in flight instead of one (the one-row kernel keeps four,
 * MM_SKINNY_AHEAD; these kernels' accumulators, up to 4 x 17 or 2 x 17,
 * already hold most of a thread's registers). The products still run
 * chunk by chunk in increasing k: no bit changes. */
#define MM_COLS_AHEAD 2

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

/* Eight activations in[c .. c+7] of one row as f32, the m < 8 past the
 * row's end zero: 16-byte loads where vec (the row is whole and aligned). */
static __device__ __forceinline__ void mm_load_x8(const float *__restrict__ xr, int m, int vec,
                                                  float xv[8])
{
    if (vec) {
        const float4 a = __ldg((const float4 *)xr), b = __ldg((const float4 *)xr + 1);
        xv[0] = a.x, xv[1] = a.y, xv[2] = a.z, xv[3] = a.w;
        xv[4] = b.x, xv[5] = b.y, xv[6] = b.z, xv[7] = b.w;
    } else {
#pragma unroll
        for (int e = 0; e < 8; e++)
            xv[e] = e < m ? xr[e] : 0.0f;
    }
}

#endif
