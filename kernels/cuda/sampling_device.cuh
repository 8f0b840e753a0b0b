/* sampling_device.cuh: the block primitives that sampling.cu and
 * speculate.cu share (private to kernels/cuda): the Philox-4x32-10
 * generator, block reductions, the block argmax and the inverse-CDF draw,
 * plus the entries' backend check. Every function is static: each .cu that
 * includes this compiles its own copy, so no relocatable device code is
 * needed and each kernel compiles as it did in one file.
 *
 * All threads of a block call the block functions (each contains
 * barriers); one block serves one row, so no result depends on how many
 * rows share a launch. Their fixed orders:
 *
 *   argmax     (value, index) pairs combined by "larger value, then lower
 *              index", a total order: the result is the CPU's exactly,
 *              whatever the combination order. NaN is never chosen.
 *   draw       inverse CDF with the CPU's rule (smallest index whose running
 *              sum exceeds u * S; entries <= 0 or NaN skipped; the last
 *              positive entry if rounding runs off the end), in double, in
 *              this order: the row is cut into SMP_WARPS contiguous
 *              segments; warp w sums segment w (lane l takes entries l,
 *              l + 32, ... of it, then the xor butterfly); thread 0 chains
 *              the segment sums in segment order (S, and each segment's
 *              base); the first segment whose chained end exceeds u * S is
 *              scanned by the block: thread t sums a contiguous chunk, a
 *              shuffle scan in lane order and a chain over warps give each
 *              chunk's start, and the thread adds its entries in index order
 *              until the sum exceeds u * S; the lowest such index wins (the
 *              next segments are scanned if rounding left none). For
 *              vocab <= SMP_WARPS this is the CPU's own sequence of
 *              additions, and wherever the double sums are exact (values
 *              within 2^29 of each other, as in every hand-made test row)
 *              the draw equals the CPU's bit for bit; otherwise the sums
 *              differ by ~1e-16 relative and a draw can differ only where
 *              u * S lies that close to a cumulative boundary.
 */
#ifndef TANDEM_KERNELS_CUDA_SAMPLING_DEVICE_CUH
#define TANDEM_KERNELS_CUDA_SAMPLING_DEVICE_CUH

#include <limits.h>
#include <math.h>
#include <string.h>

#include "cuda_backend.h"

#define SMP_THREADS 512
#define SMP_WARPS (SMP_THREADS / 32)
#define SMP_FULL_MASK 0xffffffffu
static_assert(SMP_THREADS % 32 == 0 && SMP_THREADS <= 1024, "whole warps, one block");

/* ---- Philox-4x32-10 --------------------------------------------------------
 * Restated from common/speculation/philox.c (the kernels may not include the speculation
 * room): same multipliers, Weyl constants, rounds, counter and key layout
 * and 24-bit uniform. tests/gpu/test_cuda_sampling.c checks the host build
 * of these functions against philox4x32_10 and philox_uniform (no device
 * needed) and the device build bit for bit on the GPU. */
#define SMP_PHILOX_M0 0xD2511F53u
#define SMP_PHILOX_M1 0xCD9E8D57u
#define SMP_PHILOX_W0 0x9E3779B9u
#define SMP_PHILOX_W1 0xBB67AE85u
#define SMP_PHILOX_ROUNDS 10

static __host__ __device__ __forceinline__ void smp_philox4x32_10(const uint32_t ctr[4],
                                                                  const uint32_t key[2],
                                                                  uint32_t out[4])
{
    uint32_t x0 = ctr[0], x1 = ctr[1], x2 = ctr[2], x3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int r = 0; r < SMP_PHILOX_ROUNDS; r++) {
        if (r > 0) {
            k0 += SMP_PHILOX_W0;
            k1 += SMP_PHILOX_W1;
        }
        const uint64_t p0 = (uint64_t)SMP_PHILOX_M0 * x0;
        const uint64_t p1 = (uint64_t)SMP_PHILOX_M1 * x2;
        const uint32_t y0 = (uint32_t)(p1 >> 32) ^ x1 ^ k0;
        const uint32_t y2 = (uint32_t)(p0 >> 32) ^ x3 ^ k1;
        x0 = y0;
        x1 = (uint32_t)p1;
        x2 = y2;
        x3 = (uint32_t)p0;
    }
    out[0] = x0;
    out[1] = x1;
    out[2] = x2;
    out[3] = x3;
}

static __host__ __device__ __forceinline__ float smp_philox_uniform(uint64_t seed, uint32_t stream,
                                                                    uint64_t position,
                                                                    uint32_t index)
{
    const uint32_t key[2] = {(uint32_t)(seed & 0xffffffffu), (uint32_t)(seed >> 32)};
    const uint32_t ctr[4] = {(uint32_t)(position & 0xffffffffu), (uint32_t)(position >> 32),
                             stream, index / 4u};
    uint32_t out[4];
    smp_philox4x32_10(ctr, key, out);
    const uint32_t j = index % 4u;
    const uint32_t word = j == 0 ? out[0] : j == 1 ? out[1] : j == 2 ? out[2] : out[3];
    /* 24 bits times 2^-24: both steps exact, so u < 1. */
    return (float)(word >> 8) * (1.0f / 16777216.0f);
}

/* ---- block reductions (all threads call; each contains barriers) -------- */

static __device__ __forceinline__ unsigned long long smp_block_sum_u64(unsigned long long v)
{
    __shared__ unsigned long long part[SMP_WARPS];
    __shared__ unsigned long long total;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        v += __shfl_xor_sync(SMP_FULL_MASK, v, off);
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned long long s = 0;
        for (int w = 0; w < SMP_WARPS; w++)
            s += part[w];
        total = s;
    }
    __syncthreads();
    return total;
}

static __device__ __forceinline__ int smp_block_max_int(int v)
{
    __shared__ int part[SMP_WARPS];
    __shared__ int total;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        v = max(v, __shfl_xor_sync(SMP_FULL_MASK, v, off));
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        int m = part[0];
        for (int w = 1; w < SMP_WARPS; w++)
            m = max(m, part[w]);
        total = m;
    }
    __syncthreads();
    return total;
}

/* b beats a: a valid index, and a larger value, or an equal one at a lower
 * index. A strict total order on valid pairs, so the block's winner does not
 * depend on the order of combination. */
static __device__ __forceinline__ bool smp_arg_beats(float bv, int bi, float av, int ai)
{
    if (bi < 0)
        return false;
    if (ai < 0)
        return true;
    return bv > av || (bv == av && bi < ai);
}

/* sampling_argmax of x [n]: the lowest index among equal maxima, NaN never
 * chosen, -1 when every entry is NaN. *bad_out: some entry is NaN or +inf
 * (the logits check of sampling_adjust). */
static __device__ int smp_block_argmax(const float *x, int n, int *bad_out)
{
    __shared__ float wv[SMP_WARPS];
    __shared__ int wi[SMP_WARPS];
    __shared__ int result;
    float bv = 0.0f;
    int bi = -1, bad = 0;
    for (int v = threadIdx.x; v < n; v += SMP_THREADS) {
        const float a = x[v];
        if (isnan(a)) {
            bad = 1;
            continue;
        }
        if (a == INFINITY)
            bad = 1;
        if (bi < 0 || a > bv) { /* v increases: ties keep the lower index */
            bv = a;
            bi = v;
        }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const float ov = __shfl_xor_sync(SMP_FULL_MASK, bv, off);
        const int oi = __shfl_xor_sync(SMP_FULL_MASK, bi, off);
        if (smp_arg_beats(ov, oi, bv, bi)) {
            bv = ov;
            bi = oi;
        }
    }
    if ((threadIdx.x & 31) == 0) {
        wv[threadIdx.x >> 5] = bv;
        wi[threadIdx.x >> 5] = bi;
    }
    *bad_out = __syncthreads_or(bad);
    if (threadIdx.x == 0) {
        float v0 = wv[0];
        int i0 = wi[0];
        for (int w = 1; w < SMP_WARPS; w++)
            if (smp_arg_beats(wv[w], wi[w], v0, i0)) {
                v0 = wv[w];
                i0 = wi[w];
            }
        result = i0;
    }
    __syncthreads();
    return result;
}

/* ---- the inverse-CDF draw ------------------------------------------------- */

enum smp_src_mode {
    SMP_SRC_PLAIN = 0,    /* p[v] */
    SMP_SRC_RESIDUAL = 1, /* max(0, p[v] - q[v]) */
    SMP_SRC_EXCLUDE = 2,  /* p[v], 0 at v == exclude */
};

struct smp_src {
    const float *p;
    const float *q;
    int mode;
    int exclude;
};

static __device__ __forceinline__ float smp_value(const struct smp_src &s, int v)
{
    const float a = s.p[v];
    if (s.mode == SMP_SRC_RESIDUAL) {
        const float r = __fsub_rn(a, s.q[v]);
        return r > 0.0f ? r : 0.0f;
    }
    if (s.mode == SMP_SRC_EXCLUDE && v == s.exclude)
        return 0.0f;
    return a;
}

/* sampling_draw of the row src describes (n entries) at uniform u, in the
 * order stated in the file header. -1 when no entry is positive. All threads
 * call it; every thread gets the result. */
static __device__ int smp_block_draw(const struct smp_src src, int n, float u)
{
    __shared__ double seg_sum[SMP_WARPS];
    __shared__ double seg_base[SMP_WARPS + 1];
    __shared__ double warp_tot[SMP_WARPS];
    __shared__ double warp_off[SMP_WARPS];
    __shared__ double target_sh;
    __shared__ int first_seg;
    __shared__ int cand;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int seg_len = (n + SMP_WARPS - 1) / SMP_WARPS;

    /* Pass 1: segment sums (lane-strided, then the xor butterfly) and the
     * last positive entry. */
    int last = -1;
    {
        const int s0 = min(n, warp * seg_len), s1 = min(n, s0 + seg_len);
        double s = 0.0;
        for (int v = s0 + lane; v < s1; v += 32) {
            const float a = smp_value(src, v);
            if (a > 0.0f) {
                s = __dadd_rn(s, (double)a);
                last = v;
            }
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1)
            s = __dadd_rn(s, __shfl_xor_sync(SMP_FULL_MASK, s, off));
        if (lane == 0)
            seg_sum[warp] = s;
    }
    last = smp_block_max_int(last); /* its barriers publish seg_sum */
    if (last < 0)
        return -1;
    if (tid == 0) {
        double b = 0.0;
        for (int w = 0; w < SMP_WARPS; w++) {
            seg_base[w] = b;
            b = __dadd_rn(b, seg_sum[w]);
        }
        seg_base[SMP_WARPS] = b;
        const double target = __dmul_rn((double)u, b);
        int first = SMP_WARPS;
        for (int w = 0; w < SMP_WARPS; w++)
            if (seg_sum[w] > 0.0 && seg_base[w + 1] > target) {
                first = w;
                break;
            }
        target_sh = target;
        first_seg = first;
    }
    __syncthreads();
    const double target = target_sh;
    int result = -1;
    for (int w = first_seg; w < SMP_WARPS; w++) { /* uniform across the block */
        const int s0 = min(n, w * seg_len), s1 = min(n, s0 + seg_len);
        if (s1 <= s0)
            continue;
        const int chunk = (s1 - s0 + SMP_THREADS - 1) / SMP_THREADS;
        const int c0 = min(s1, s0 + tid * chunk), c1 = min(s1, c0 + chunk);
        double local = 0.0;
        for (int v = c0; v < c1; v++) {
            const float a = smp_value(src, v);
            if (a > 0.0f)
                local = __dadd_rn(local, (double)a);
        }
        /* Exclusive prefix of the chunk sums: shuffle scan in lane order,
         * then the warp totals chained by thread 0. */
        double incl = local;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            const double o = __shfl_up_sync(SMP_FULL_MASK, incl, off);
            if (lane >= off)
                incl = __dadd_rn(incl, o);
        }
        double excl = __shfl_up_sync(SMP_FULL_MASK, incl, 1);
        if (lane == 0)
            excl = 0.0;
        if (lane == 31)
            warp_tot[warp] = incl;
        __syncthreads();
        if (tid == 0) {
            double o = 0.0;
            for (int j = 0; j < SMP_WARPS; j++) {
                warp_off[j] = o;
                o = __dadd_rn(o, warp_tot[j]);
            }
            cand = INT_MAX;
        }
        __syncthreads();
        double cum = __dadd_rn(seg_base[w], __dadd_rn(warp_off[warp], excl));
        for (int v = c0; v < c1; v++) {
            const float a = smp_value(src, v);
            if (a > 0.0f) {
                cum = __dadd_rn(cum, (double)a);
                if (cum > target) {
                    atomicMin(&cand, v); /* min: order-free */
                    break;
                }
            }
        }
        __syncthreads();
        const int c = cand;
        __syncthreads(); /* every thread has read cand before it is reset */
        if (c != INT_MAX) {
            result = c;
            break;
        }
    }
    return result >= 0 ? result : last;
}

/* The entries' check of be (a cuda backend) and cuda_backend_enter. */
static inline int smp_enter(struct kern_backend *be, const char *what,
                            struct cuda_backend **cb_out, char *err)
{
    if (!be || strcmp(be->name, "cuda") != 0)
        return error_set(err, ERR_INVALID_ARG, "%s: not a cuda backend", what);
    *cb_out = cuda_backend_of(be);
    return cuda_backend_enter(*cb_out, err);
}

#endif
