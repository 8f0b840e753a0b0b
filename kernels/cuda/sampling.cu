/* sampling.cu: sampling and speculative accept/reject on the device, the
 * twins of common/spec/sampling.c and speculate.c (API and contract in
 * kernels_cuda.h; the rules themselves in sampling.h and speculate.h).
 *
 * What it is: argmax, the adjusted distribution (temperature, top-k, top-p,
 * min-p), the Philox draw, plain sampling and the speculative accept/reject
 * (greedy and sampled, residual, bonus, point mass) over rows in device
 * memory, so that only ids, counts and status words go to the host.
 * What it is not: an op of struct kern_ops (the engine calls these entries
 * directly), nor the forward pass.
 *
 * One block of SMP_THREADS threads per row (argmax, adjust, sample, draw) or
 * per (sequence, row) of a verification, so no result depends on how many
 * rows share a launch. Within a block, every reduction has a fixed order:
 *
 *   argmax     (value, index) pairs combined by "larger value, then lower
 *              index", a total order: the result is the CPU's exactly,
 *              whatever the combination order. NaN is never chosen.
 *   adjust     m = max logit (the argmax pass, which also flags NaN / +inf).
 *              e[v] = expf((x[v] - m) / T): __fsub_rn, __fdiv_rn and CUDA's
 *              expf (at most 2 ulp from the exact value; glibc's is within
 *              0.502 ulp, so e agrees with the CPU's within 2 ulp; e = 1 at
 *              the argmax on both). Sums of e are exact: each e is rounded
 *              to an integer multiple of 2^-Q, Q = 63 - ceil(log2(vocab)) (so
 *              a row's sum fits 64 bits), and integers are added, in any
 *              order with the same result. The CPU adds in double, which is
 *              exact to 1e-16 relative; the 2^-Q rounding adds at most
 *              vocab * 2^-(Q+1) (<= 2^-30 at vocab 128256) to sums >= 1.
 *              top-k and top-p boundaries are found by radix selection over
 *              the canonical order (logit descending, then index ascending;
 *              -0 keyed as +0): four 8-bit passes over the logit's
 *              order-preserving key, histograms of counts (top-k) or of
 *              fixed-point mass (top-p) built with shared-memory atomics
 *              (integers: order-free), bins walked in canonical order; ties
 *              at the boundary are resolved by the rank inside the tie
 *              group (equal logits have equal e) and, when a group is cut,
 *              8-bit passes over the token index. top-p keeps the shortest
 *              canonical prefix whose exact cumulative mass, as a double,
 *              is >= (double)top_p * (double)S; min-p keeps e >= min_p;
 *              probs = (float)((double)e / S) over the survivors.
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
 *   verify     the accept test u * q(t) < p(t) in double (exact: two 24-bit
 *              significands) or u < p(t) in point-mass mode, thread 0 of
 *              each block walking t_1.. in order; the block whose row is the
 *              first rejection (or the bonus row) draws the correction from
 *              max(0, p - q) (float subtraction per entry, computed while
 *              scanning: no scratch row), or from p without t (point mass),
 *              falling back to p when that has no positive entry. Greedy
 *              sequences: one block per row takes the argmax, then a second
 *              kernel walks the rows and compares with the drafts.
 *
 * So argmax, the Philox uniforms, every accept/reject decision and every
 * draw from identical rows equal the CPU's; adjusted rows equal the CPU's
 * within a relative 1e-6 (the bound is 2 ulp of e, the same in the sum, and
 * two roundings: < 6e-7; subnormal results within 2^-126 absolute), with
 * the same kept set except where the CPU's own top-p running sum or e lies
 * within that rounding of its threshold (top-k sets are always identical:
 * they compare logits only).
 *
 * Cost: one block per row is right for verification batches (many rows);
 * a single decode row uses one SM (adjust with top-k and top-p makes ~12
 * passes over the row). The launch count per call is one (two for a
 * verification with greedy sequences).
 */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <string.h>

#include "cuda_backend.h"

#define SMP_THREADS 512
#define SMP_WARPS (SMP_THREADS / 32)
#define SMP_BINS 256
#define SMP_HIST_COPIES 8 /* shared histograms, one per 2 warps: less atomic contention */
#define SMP_FULL_MASK 0xffffffffu
#define SMP_FINISH_THREADS 128 /* greedy finishing kernel: one thread per sequence */
static_assert(SMP_THREADS % 32 == 0 && SMP_THREADS <= 1024, "whole warps, one block");

/* ---- Philox-4x32-10 --------------------------------------------------------
 * Restated from common/spec/philox.c (the kernels may not include the spec
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

/* ---- the canonical order and radix selection ------------------------------ */

/* Order-preserving key of a logit: larger logit, larger key. -0 is keyed as
 * +0 (the CPU compares them equal, so their order is by index). NaN never
 * reaches here (adjust refuses it). */
static __device__ __forceinline__ uint32_t smp_key(float x)
{
    uint32_t b = __float_as_uint(x);
    if ((b << 1) == 0u)
        b = 0u;
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

/* A position in the canonical order: token v is at or before it when
 * key(v) > key, or key(v) == key and v <= index. {0, INT_MAX} holds every
 * token (no logit has key 0: that is a NaN's bit pattern). */
struct smp_boundary {
    uint32_t key;
    int index;
};

static __device__ __forceinline__ bool smp_at_or_before(uint32_t key, int v, struct smp_boundary b)
{
    return key > b.key || (key == b.key && v <= b.index);
}

/* e in [0, 1] as an integer multiple of 2^-Q (q_scale = 2^Q): exact scaling,
 * one rounding. */
static __device__ __forceinline__ unsigned long long smp_quant(float e, double q_scale)
{
    return __double2ull_rn(__dmul_rn((double)e, q_scale));
}

struct smp_select_smem {
    unsigned int cnt[SMP_HIST_COPIES][SMP_BINS];
    unsigned long long mass[SMP_HIST_COPIES][SMP_BINS];
    uint32_t prefix, mask;         /* digits chosen so far */
    unsigned long long goal;       /* count mode: rank still to find, 1-based */
    unsigned long long cum_before; /* mass mode: mass of the tokens before the prefix */
    unsigned int bin_count;        /* in-set tokens in the chosen bin */
    unsigned long long bin_mass;
    int found;
};

/* One histogram pass of the selection. In-set tokens (at or before
 * `within`) whose source digits match the prefix so far are binned by
 * (src >> shift) & 255, where src is the logit key (by_index = 0; bins are
 * walked from 255 down: canonical order) or, among the tokens whose key is
 * key_eq, the index (by_index = 1; bins walked upwards). Thread 0 then picks
 * the bin where the running count reaches sm->goal (count mode) or the
 * running mass, as a double, reaches target (mass mode), and extends the
 * prefix. Ends with a barrier. */
static __device__ void smp_hist_pass(struct smp_select_smem *sm, const float *x, const float *e,
                                     int n, struct smp_boundary within, int by_index,
                                     uint32_t key_eq, int shift, int use_mass, double target,
                                     double q_scale)
{
    const int tid = threadIdx.x;
    for (int i = tid; i < SMP_HIST_COPIES * SMP_BINS; i += SMP_THREADS) {
        (&sm->cnt[0][0])[i] = 0u;
        (&sm->mass[0][0])[i] = 0ull;
    }
    __syncthreads();
    const uint32_t prefix = sm->prefix, mask = sm->mask;
    const int copy = (tid >> 5) % SMP_HIST_COPIES;
    for (int v = tid; v < n; v += SMP_THREADS) {
        const uint32_t key = smp_key(x[v]);
        if (!smp_at_or_before(key, v, within))
            continue;
        uint32_t src = key;
        if (by_index) {
            if (key != key_eq)
                continue;
            src = (uint32_t)v;
        }
        if ((src & mask) != prefix)
            continue;
        const unsigned int bin = (src >> shift) & 0xffu;
        atomicAdd(&sm->cnt[copy][bin], 1u);
        if (use_mass)
            atomicAdd(&sm->mass[copy][bin], smp_quant(e[v], q_scale));
    }
    __syncthreads();
    for (int b = tid; b < SMP_BINS; b += SMP_THREADS) { /* one thread per column */
        unsigned int c = 0;
        unsigned long long m = 0;
        for (int k = 0; k < SMP_HIST_COPIES; k++) {
            c += sm->cnt[k][b];
            m += sm->mass[k][b];
        }
        sm->cnt[0][b] = c;
        sm->mass[0][b] = m;
    }
    __syncthreads();
    if (tid == 0) {
        int chosen = -1;
        for (int j = 0; j < SMP_BINS; j++) {
            const int b = by_index ? j : SMP_BINS - 1 - j;
            if (use_mass) {
                const unsigned long long through = sm->cum_before + sm->mass[0][b];
                if (__ull2double_rn(through) >= target) {
                    chosen = b;
                    break;
                }
                sm->cum_before = through;
            } else {
                if (sm->goal <= sm->cnt[0][b]) {
                    chosen = b;
                    break;
                }
                sm->goal -= sm->cnt[0][b];
            }
        }
        if (chosen < 0) {
            sm->found = 0;
        } else {
            sm->prefix |= (uint32_t)chosen << shift;
            sm->mask |= 0xffu << shift;
            sm->bin_count = sm->cnt[0][chosen];
            sm->bin_mass = sm->mass[0][chosen];
        }
    }
    __syncthreads();
}

/* The boundary token among the in-set tokens (at or before `within`), in
 * canonical order: the goal_count-th (count mode, goal_count >= 1), or the
 * first at which the cumulative mass (exact, in 2^-Q units, converted to
 * double) is >= target (mass mode). Returns {0, INT_MAX} (everything) if no
 * token qualifies, which the callers' arguments rule out. All threads call
 * it with the same arguments. */
static __device__ struct smp_boundary smp_select(struct smp_select_smem *sm, const float *x,
                                                 const float *e, int n, struct smp_boundary within,
                                                 int use_mass, unsigned long long goal_count,
                                                 double target, double q_scale)
{
    const struct smp_boundary all = {0u, INT_MAX};
    __syncthreads(); /* every thread is done reading the previous selection */
    if (threadIdx.x == 0) {
        sm->prefix = 0u;
        sm->mask = 0u;
        sm->goal = goal_count;
        sm->cum_before = 0ull;
        sm->found = 1;
    }
    for (int shift = 24; shift >= 0; shift -= 8)
        smp_hist_pass(sm, x, e, n, within, 0, 0u, shift, use_mass, target, q_scale);
    if (!sm->found || sm->bin_count == 0u)
        return all;
    const uint32_t key_star = sm->prefix;
    const unsigned long long ties = sm->bin_count;
    unsigned long long rank;
    if (use_mass) {
        /* Equal logits have equal e: the group's mass is ties * e_q exactly.
         * The smallest j in 1..ties with cum_before + j * e_q >= target. */
        const unsigned long long e_q = sm->bin_mass / ties, before = sm->cum_before;
        unsigned long long lo = 1, hi = ties;
        while (lo < hi) {
            const unsigned long long mid = lo + (hi - lo) / 2;
            if (__ull2double_rn(before + mid * e_q) >= target)
                hi = mid;
            else
                lo = mid + 1;
        }
        rank = lo;
    } else {
        rank = sm->goal;
    }
    struct smp_boundary b = {key_star, INT_MAX};
    if (rank >= ties)
        return b; /* the whole tie group is kept */
    __syncthreads(); /* reads of sm above are done before thread 0 rewrites it */
    if (threadIdx.x == 0) {
        sm->prefix = 0u;
        sm->mask = 0u;
        sm->goal = rank;
        sm->found = 1;
    }
    const int bits = 32 - __clz((unsigned int)(n - 1)); /* n >= 2 here: a group was cut */
    for (int shift = ((bits - 1) / 8) * 8; shift >= 0; shift -= 8)
        smp_hist_pass(sm, x, e, n, within, 1, key_star, shift, 0, 0.0, q_scale);
    if (!sm->found)
        return b;
    b.index = (int)sm->prefix;
    return b;
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

/* ---- kernels ----------------------------------------------------------------- */

__global__ void __launch_bounds__(SMP_THREADS, 1)
    smp_argmax_kernel(int32_t *out, const float *x, int n)
{
    int bad;
    const int a = smp_block_argmax(x + (size_t)blockIdx.x * (size_t)n, n, &bad);
    if (threadIdx.x == 0)
        out[blockIdx.x] = a;
}

/* One block per row: sampling_adjust into probs; with tokens != NULL also
 * the token (argmax, or the draw at philox_uniform(seed, stream,
 * positions[r], 0)). probs doubles as the e scratch: each entry is only
 * ever touched by the thread v % SMP_THREADS. */
__global__ void __launch_bounds__(SMP_THREADS, 1)
    smp_adjust_kernel(float *probs, int32_t *tokens, int32_t *status, const float *logits,
                      int vocab, const struct kern_cuda_sample_params *params,
                      const uint64_t *positions, uint32_t stream, double q_scale)
{
    __shared__ struct smp_select_smem sel;
    const int r = blockIdx.x, tid = threadIdx.x;
    const size_t off = (size_t)r * (size_t)vocab;
    const float *x = logits + off;
    float *y = probs + off;
    const struct kern_cuda_sample_params p = params[r];

    int bad = 0;
    const int arg = smp_block_argmax(x, vocab, &bad);
    int st = KERN_CUDA_SAMPLE_OK;
    if (bad)
        st = KERN_CUDA_SAMPLE_BAD_LOGIT;
    else if (arg < 0 || x[arg] == -INFINITY)
        st = KERN_CUDA_SAMPLE_ALL_MASKED;
    if (st != KERN_CUDA_SAMPLE_OK || p.temperature == 0.0f) {
        /* An error leaves zeros; greedy is one-hot at the argmax. */
        for (int v = tid; v < vocab; v += SMP_THREADS)
            y[v] = (st == KERN_CUDA_SAMPLE_OK && v == arg) ? 1.0f : 0.0f;
        if (tid == 0) {
            if (status)
                status[r] = st;
            if (tokens)
                tokens[r] = st == KERN_CUDA_SAMPLE_OK ? arg : -1;
        }
        return;
    }
    const float m = x[arg];
    const struct smp_boundary all = {0u, INT_MAX};

    /* top-k: the first top_k tokens in canonical order. */
    const int use_k = p.top_k > 0 && p.top_k < vocab;
    struct smp_boundary topk = all;
    if (use_k)
        topk = smp_select(&sel, x, y, vocab, all, 0, (unsigned long long)p.top_k, 0.0, q_scale);

    /* e for the kept tokens, 0 elsewhere; S exact. */
    unsigned long long s = 0;
    for (int v = tid; v < vocab; v += SMP_THREADS) {
        float e = 0.0f;
        if (!use_k || smp_at_or_before(smp_key(x[v]), v, topk))
            e = expf(__fdiv_rn(__fsub_rn(x[v], m), p.temperature));
        y[v] = e;
        s += smp_quant(e, q_scale);
    }
    s = smp_block_sum_u64(s);

    /* top-p: the shortest canonical prefix of the kept tokens whose mass
     * reaches top_p * S. */
    const int use_p = p.top_p < 1.0f;
    struct smp_boundary topp = all;
    if (use_p)
        topp = smp_select(&sel, x, y, vocab, topk, 1, 0ull,
                          __dmul_rn((double)p.top_p, __ull2double_rn(s)), q_scale);

    /* min-p (e >= min_p; the argmax's e is 1 and survives), then the
     * survivors' exact sum. */
    unsigned long long s2 = 0;
    for (int v = tid; v < vocab; v += SMP_THREADS) {
        float e = y[v];
        if (e > 0.0f && ((use_p && !smp_at_or_before(smp_key(x[v]), v, topp)) || e < p.min_p)) {
            e = 0.0f;
            y[v] = 0.0f;
        }
        s2 += smp_quant(e, q_scale);
    }
    s2 = smp_block_sum_u64(s2);
    const double total = __ddiv_rn(__ull2double_rn(s2), q_scale); /* exact scaling; >= 1 */
    for (int v = tid; v < vocab; v += SMP_THREADS)
        y[v] = __double2float_rn(__ddiv_rn((double)y[v], total));

    int tok = arg;
    if (tokens) {
        __syncthreads(); /* the row is complete for every thread of the block */
        const struct smp_src src = {y, NULL, SMP_SRC_PLAIN, 0};
        tok = smp_block_draw(src, vocab, smp_philox_uniform(p.seed, stream, positions[r], 0u));
    }
    if (tid == 0) {
        if (status)
            status[r] = tok >= 0 ? KERN_CUDA_SAMPLE_OK : KERN_CUDA_SAMPLE_NO_MASS;
        if (tokens)
            tokens[r] = tok;
    }
}

__global__ void __launch_bounds__(SMP_THREADS, 1)
    smp_draw_kernel(int32_t *tokens, const float *probs, int vocab, const uint64_t *seeds,
                    const uint64_t *positions, uint32_t stream)
{
    const int r = blockIdx.x;
    const struct smp_src src = {probs + (size_t)r * (size_t)vocab, NULL, SMP_SRC_PLAIN, 0};
    const float u = smp_philox_uniform(seeds[r], stream, positions[r], 0u);
    const int tok = smp_block_draw(src, vocab, u);
    if (threadIdx.x == 0)
        tokens[r] = tok;
}

/* Block (s, i): row i of sequence s. Sampled sequences: every block's thread
 * 0 replays the accept tests t_1.. (cheap: one p and one q value each) to
 * find the first rejection n; block n alone draws and writes the result.
 * Greedy sequences: block i writes argmax p_i into tokens[i]; the finishing
 * kernel compares. */
__global__ void __launch_bounds__(SMP_THREADS, 1)
    smp_verify_kernel(struct kern_cuda_spec_result *results, const struct kern_cuda_spec_seq *seqs,
                      const float *p_rows, const float *q_rows, const int32_t *drafts, int vocab)
{
    __shared__ int n_acc_sh, bad_sh;
    const int s = blockIdx.x, i = blockIdx.y, tid = threadIdx.x;
    const struct kern_cuda_spec_seq sq = seqs[s];
    if (i > sq.k)
        return;
    const int32_t *dr = sq.k > 0 ? drafts + sq.draft0 : NULL;
    const float *prow = p_rows + ((size_t)sq.p_row0 + (size_t)i) * (size_t)vocab;
    struct kern_cuda_spec_result *out = &results[s];

    if (sq.greedy) {
        int ignored;
        const int a = smp_block_argmax(prow, vocab, &ignored);
        if (tid == 0)
            out->tokens[i] = a;
        return;
    }
    if (tid == 0) {
        int bad = 0, n = sq.k;
        for (int j = 0; j < sq.k; j++)
            if (dr[j] < 0 || dr[j] >= vocab)
                bad = 1;
        for (int j = 0; !bad && j < sq.k; j++) {
            const int32_t t = dr[j];
            const uint64_t pos = sq.position0 + (uint64_t)j;
            const float pt = p_rows[((size_t)sq.p_row0 + (size_t)j) * (size_t)vocab + (size_t)t];
            const float u =
                smp_philox_uniform(sq.seed, KERN_CUDA_PHILOX_STREAM_TARGET_ACCEPT, pos, 0u);
            bool accept;
            if (!(pt > 0.0f)) {
                accept = false;
            } else if (sq.mode == KERN_CUDA_SPEC_MODE_POINT_MASS) {
                accept = u < pt;
            } else {
                const float qt =
                    q_rows[((size_t)sq.q_row0 + (size_t)j) * (size_t)vocab + (size_t)t];
                /* exact: u and q(t) have 24-bit significands */
                accept = __dmul_rn((double)u, (double)(qt > 0.0f ? qt : 0.0f)) < (double)pt;
            }
            if (!accept) {
                n = j;
                break;
            }
        }
        n_acc_sh = n;
        bad_sh = bad;
    }
    __syncthreads();
    const int n = n_acc_sh;
    if (bad_sh) {
        if (i == 0 && tid == 0) {
            out->n_accepted = 0;
            out->status = KERN_CUDA_SAMPLE_BAD_DRAFT;
            out->tokens[0] = -1;
        }
        return;
    }
    if (i != n)
        return;
    const float u = smp_philox_uniform(sq.seed, KERN_CUDA_PHILOX_STREAM_TARGET_SAMPLE,
                                       sq.position0 + (uint64_t)i, 0u);
    const struct smp_src plain = {prow, NULL, SMP_SRC_PLAIN, 0};
    int tok;
    if (i < sq.k && sq.debug_fault != KERN_CUDA_SPEC_DEBUG_RESIDUAL_FROM_P) {
        struct smp_src corr = {prow, NULL, SMP_SRC_EXCLUDE, dr[i]};
        if (sq.mode != KERN_CUDA_SPEC_MODE_POINT_MASS) {
            corr.q = q_rows + ((size_t)sq.q_row0 + (size_t)i) * (size_t)vocab;
            corr.mode = SMP_SRC_RESIDUAL;
        }
        tok = smp_block_draw(corr, vocab, u);
        if (tok < 0) /* residual empty through rounding: rejection had probability ~0 */
            tok = smp_block_draw(plain, vocab, u);
    } else {
        tok = smp_block_draw(plain, vocab, u); /* bonus, or the broken variant */
    }
    if (tid == 0) {
        for (int j = 0; j < i; j++)
            out->tokens[j] = dr[j];
        out->tokens[i] = tok;
        out->n_accepted = i;
        out->status = tok >= 0 ? KERN_CUDA_SAMPLE_OK : KERN_CUDA_SAMPLE_NO_MASS;
    }
}

/* Greedy sequences after smp_verify_kernel: accept while argmax p_i == t_i. */
__global__ void __launch_bounds__(SMP_FINISH_THREADS)
    smp_verify_greedy_kernel(struct kern_cuda_spec_result *results,
                             const struct kern_cuda_spec_seq *seqs, const int32_t *drafts,
                             int n_seqs, int vocab)
{
    const int s = blockIdx.x * SMP_FINISH_THREADS + threadIdx.x;
    if (s >= n_seqs)
        return;
    const struct kern_cuda_spec_seq sq = seqs[s];
    if (!sq.greedy)
        return;
    const int32_t *dr = sq.k > 0 ? drafts + sq.draft0 : NULL;
    struct kern_cuda_spec_result *out = &results[s];
    for (int j = 0; j < sq.k; j++)
        if (dr[j] < 0 || dr[j] >= vocab) {
            out->n_accepted = 0;
            out->status = KERN_CUDA_SAMPLE_BAD_DRAFT;
            out->tokens[0] = -1;
            return;
        }
    for (int i = 0; i <= sq.k; i++) {
        const int32_t tok = out->tokens[i];
        if (tok < 0) {
            out->n_accepted = i;
            out->status = KERN_CUDA_SAMPLE_NO_MASS;
            return;
        }
        if (i == sq.k || tok != dr[i]) {
            out->n_accepted = i;
            out->status = KERN_CUDA_SAMPLE_OK;
            return;
        }
    }
}

/* Grid-stride (cuda_grid_1d caps the grid). */
__global__ void smp_philox_uniform_kernel(float *out, const struct kern_cuda_philox_arg *in, int n)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const struct kern_cuda_philox_arg a = in[i];
        out[i] = smp_philox_uniform(a.seed, a.stream, a.position, a.index);
    }
}

__global__ void smp_philox_block_kernel(uint32_t *out, const uint32_t *in, int n)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const uint32_t ctr[4] = {in[6 * i], in[6 * i + 1], in[6 * i + 2], in[6 * i + 3]};
        const uint32_t key[2] = {in[6 * i + 4], in[6 * i + 5]};
        uint32_t o[4];
        smp_philox4x32_10(ctr, key, o);
        for (int j = 0; j < 4; j++)
            out[4 * i + j] = o[j];
    }
}

/* ---- launchers and public entries ----------------------------------------- */

/* 2^Q with Q = 63 - ceil(log2(vocab)): vocab values of at most 2^Q add up
 * to at most 2^63. */
static double smp_q_scale(int vocab)
{
    int c = 0;
    while (((int64_t)1 << c) < (int64_t)vocab)
        c++;
    return ldexp(1.0, 63 - c);
}

static int smp_enter(struct kern_backend *be, const char *what, struct cuda_backend **cb_out,
                     char *err)
{
    if (!be || strcmp(be->name, "cuda") != 0)
        return error_set(err, ERR_INVALID_ARG, "%s: not a cuda backend", what);
    *cb_out = cuda_backend_of(be);
    return cuda_backend_enter(*cb_out, err);
}

static int smp_check_params(const struct kern_cuda_sample_params *params, int n_rows, char *err)
{
    for (int r = 0; r < n_rows; r++) {
        const struct kern_cuda_sample_params *p = &params[r];
        if (!(p->temperature >= 0.0f && p->temperature <= FLT_MAX))
            return error_set(err, ERR_INVALID_ARG,
                             "params[%d].temperature: must be finite and >= 0, got %g", r,
                             (double)p->temperature);
        if (p->top_k < 0)
            return error_set(err, ERR_INVALID_ARG, "params[%d].top_k: must be >= 0, got %d", r,
                             (int)p->top_k);
        if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
            return error_set(err, ERR_INVALID_ARG, "params[%d].top_p: must be in (0, 1], got %g",
                             r, (double)p->top_p);
        if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
            return error_set(err, ERR_INVALID_ARG, "params[%d].min_p: must be in [0, 1], got %g",
                             r, (double)p->min_p);
    }
    return 0;
}

static int smp_adjust_launch(struct cuda_backend *cb, float *probs, int32_t *tokens,
                             int32_t *status, const float *logits, int n_rows, int vocab,
                             const struct kern_cuda_sample_params *params,
                             const uint64_t *positions, uint32_t stream, char *err)
{
    const size_t p_bytes = (size_t)n_rows * sizeof(*params);
    const void *dev = NULL;
    size_t pos_off = 0;
    int rc = cuda_backend_stage2(cb, params, p_bytes, positions,
                                 positions ? (size_t)n_rows * sizeof(uint64_t) : 0, &dev, &pos_off,
                                 err);
    if (rc < 0)
        return rc;
    const struct kern_cuda_sample_params *d_params = (const struct kern_cuda_sample_params *)dev;
    const uint64_t *d_pos = positions ? (const uint64_t *)((const char *)dev + pos_off) : NULL;
    smp_adjust_kernel<<<n_rows, SMP_THREADS, 0, cb->stream>>>(
        probs, tokens, status, logits, vocab, d_params, d_pos, stream, smp_q_scale(vocab));
    CUDA_CHECK_LAUNCH("smp_adjust_kernel");
    return 0;
}

static int smp_check_rows(const char *what, int n_rows, int vocab, char *err)
{
    if (n_rows < 0 || vocab < 1)
        return error_set(err, ERR_INVALID_ARG, "%s: bad shape n_rows=%d vocab=%d", what, n_rows,
                         vocab);
    return 0;
}

extern "C" const char *kern_cuda_sample_status_str(int32_t status)
{
    switch (status) {
    case KERN_CUDA_SAMPLE_OK: return "ok";
    case KERN_CUDA_SAMPLE_BAD_LOGIT: return "a logit is NaN or +inf";
    case KERN_CUDA_SAMPLE_ALL_MASKED: return "every logit is -inf";
    case KERN_CUDA_SAMPLE_NO_MASS: return "no positive probability";
    case KERN_CUDA_SAMPLE_BAD_DRAFT: return "a draft token is outside the vocabulary";
    }
    return "unknown status";
}

extern "C" int kern_cuda_sample_status_check(const int32_t *status, int n, const char *what,
                                             char *err)
{
    for (int r = 0; r < n; r++)
        if (status[r] != KERN_CUDA_SAMPLE_OK)
            return error_set(err, ERR_INVALID_ARG, "%s[%d]: %s", what ? what : "row", r,
                             kern_cuda_sample_status_str(status[r]));
    return 0;
}

extern "C" int kern_cuda_argmax(struct kern_backend *be, int32_t *out_dev, const float *x_dev,
                                int n_rows, int n, char *err)
{
    int rc = smp_check_rows("cuda argmax", n_rows, n, err);
    if (rc < 0 || n_rows == 0)
        return rc;
    if (!out_dev || !x_dev)
        return error_set(err, ERR_INVALID_ARG, "cuda argmax: NULL tensor");
    struct cuda_backend *cb = NULL;
    if ((rc = smp_enter(be, "kern_cuda_argmax", &cb, err)) < 0)
        return rc;
    smp_argmax_kernel<<<n_rows, SMP_THREADS, 0, cb->stream>>>(out_dev, x_dev, n);
    CUDA_CHECK_LAUNCH("smp_argmax_kernel");
    return 0;
}

extern "C" int kern_cuda_sampling_adjust(struct kern_backend *be, float *probs_dev,
                                         int32_t *status_dev, const float *logits_dev, int n_rows,
                                         int vocab, const struct kern_cuda_sample_params *params,
                                         char *err)
{
    int rc = smp_check_rows("cuda sampling_adjust", n_rows, vocab, err);
    if (rc < 0 || n_rows == 0)
        return rc;
    if (!probs_dev || !logits_dev || !params)
        return error_set(err, ERR_INVALID_ARG, "cuda sampling_adjust: NULL argument");
    if (probs_dev == logits_dev)
        return error_set(err, ERR_INVALID_ARG, "cuda sampling_adjust: probs may not alias logits");
    if ((rc = smp_check_params(params, n_rows, err)) < 0)
        return rc;
    struct cuda_backend *cb = NULL;
    if ((rc = smp_enter(be, "kern_cuda_sampling_adjust", &cb, err)) < 0)
        return rc;
    return smp_adjust_launch(cb, probs_dev, NULL, status_dev, logits_dev, n_rows, vocab, params,
                             NULL, 0u, err);
}

extern "C" int kern_cuda_sample(struct kern_backend *be, int32_t *tokens_dev, int32_t *status_dev,
                                float *probs_dev, const float *logits_dev, int n_rows, int vocab,
                                const struct kern_cuda_sample_params *params,
                                const uint64_t *positions, uint32_t stream, char *err)
{
    int rc = smp_check_rows("cuda sample", n_rows, vocab, err);
    if (rc < 0 || n_rows == 0)
        return rc;
    if (!tokens_dev || !probs_dev || !logits_dev || !params || !positions)
        return error_set(err, ERR_INVALID_ARG, "cuda sample: NULL argument");
    if (probs_dev == logits_dev)
        return error_set(err, ERR_INVALID_ARG, "cuda sample: probs may not alias logits");
    if ((rc = smp_check_params(params, n_rows, err)) < 0)
        return rc;
    struct cuda_backend *cb = NULL;
    if ((rc = smp_enter(be, "kern_cuda_sample", &cb, err)) < 0)
        return rc;
    return smp_adjust_launch(cb, probs_dev, tokens_dev, status_dev, logits_dev, n_rows, vocab,
                             params, positions, stream, err);
}

extern "C" int kern_cuda_draw(struct kern_backend *be, int32_t *tokens_dev, const float *probs_dev,
                              int n_rows, int vocab, const uint64_t *seeds,
                              const uint64_t *positions, uint32_t stream, char *err)
{
    int rc = smp_check_rows("cuda draw", n_rows, vocab, err);
    if (rc < 0 || n_rows == 0)
        return rc;
    if (!tokens_dev || !probs_dev || !seeds || !positions)
        return error_set(err, ERR_INVALID_ARG, "cuda draw: NULL argument");
    struct cuda_backend *cb = NULL;
    if ((rc = smp_enter(be, "kern_cuda_draw", &cb, err)) < 0)
        return rc;
    const size_t bytes = (size_t)n_rows * sizeof(uint64_t);
    const void *dev = NULL;
    size_t pos_off = 0;
    if ((rc = cuda_backend_stage2(cb, seeds, bytes, positions, bytes, &dev, &pos_off, err)) < 0)
        return rc;
    smp_draw_kernel<<<n_rows, SMP_THREADS, 0, cb->stream>>>(
        tokens_dev, probs_dev, vocab, (const uint64_t *)dev,
        (const uint64_t *)((const char *)dev + pos_off), stream);
    CUDA_CHECK_LAUNCH("smp_draw_kernel");
    return 0;
}

extern "C" int kern_cuda_speculate_verify(struct kern_backend *be,
                                          struct kern_cuda_spec_result *results_dev,
                                          const struct kern_cuda_spec_seq *seqs, int n_seqs,
                                          const float *p_rows_dev, const float *q_rows_dev,
                                          const int32_t *draft_tokens_dev, int vocab, char *err)
{
    if (n_seqs < 0 || vocab < 1)
        return error_set(err, ERR_INVALID_ARG, "cuda speculate_verify: bad shape n_seqs=%d "
                         "vocab=%d", n_seqs, vocab);
    if (n_seqs == 0)
        return 0;
    if (!results_dev || !seqs || !p_rows_dev)
        return error_set(err, ERR_INVALID_ARG,
                         "cuda speculate_verify: results, seqs and p_rows are required");
    int k_max = 0;
    for (int s = 0; s < n_seqs; s++) {
        const struct kern_cuda_spec_seq *q = &seqs[s];
        if (q->k < 0 || q->k > KERN_CUDA_SPEC_K_MAX)
            return error_set(err, ERR_INVALID_ARG, "seqs[%d].k: must be in 0..%d, got %d", s,
                             KERN_CUDA_SPEC_K_MAX, (int)q->k);
        if (q->mode != KERN_CUDA_SPEC_MODE_SAMPLED && q->mode != KERN_CUDA_SPEC_MODE_POINT_MASS)
            return error_set(err, ERR_INVALID_ARG, "seqs[%d].mode: unknown mode %d", s,
                             (int)q->mode);
        if (q->debug_fault != KERN_CUDA_SPEC_DEBUG_NONE &&
            q->debug_fault != KERN_CUDA_SPEC_DEBUG_RESIDUAL_FROM_P)
            return error_set(err, ERR_INVALID_ARG, "seqs[%d].debug_fault: unknown fault %d", s,
                             (int)q->debug_fault);
        if (q->p_row0 < 0)
            return error_set(err, ERR_INVALID_ARG, "seqs[%d].p_row0: negative (%d)", s,
                             (int)q->p_row0);
        if (q->k > 0 && (q->draft0 < 0 || !draft_tokens_dev))
            return error_set(err, ERR_INVALID_ARG,
                             "seqs[%d].draft0: draft_tokens required at a nonnegative offset "
                             "for k = %d", s, (int)q->k);
        if (!q->greedy && q->mode == KERN_CUDA_SPEC_MODE_SAMPLED && q->k > 0 &&
            (q->q_row0 < 0 || !q_rows_dev))
            return error_set(err, ERR_INVALID_ARG,
                             "seqs[%d].q_row0: q_rows required at a nonnegative offset in "
                             "sampled mode", s);
        if (q->k > k_max)
            k_max = q->k;
    }
    struct cuda_backend *cb = NULL;
    int rc = smp_enter(be, "kern_cuda_speculate_verify", &cb, err);
    if (rc < 0)
        return rc;
    const void *dev = NULL;
    if ((rc = cuda_backend_stage(cb, seqs, (size_t)n_seqs * sizeof(*seqs), &dev, err)) < 0)
        return rc;
    const struct kern_cuda_spec_seq *d_seqs = (const struct kern_cuda_spec_seq *)dev;
    const dim3 grid((unsigned int)n_seqs, (unsigned int)(k_max + 1));
    smp_verify_kernel<<<grid, SMP_THREADS, 0, cb->stream>>>(results_dev, d_seqs, p_rows_dev,
                                                            q_rows_dev, draft_tokens_dev, vocab);
    CUDA_CHECK_LAUNCH("smp_verify_kernel");
    const unsigned int blocks =
        (unsigned int)((n_seqs + SMP_FINISH_THREADS - 1) / SMP_FINISH_THREADS);
    smp_verify_greedy_kernel<<<blocks, SMP_FINISH_THREADS, 0, cb->stream>>>(
        results_dev, d_seqs, draft_tokens_dev, n_seqs, vocab);
    CUDA_CHECK_LAUNCH("smp_verify_greedy_kernel");
    return 0;
}

extern "C" int kern_cuda_philox_uniforms(struct kern_backend *be, float *out_dev,
                                         const struct kern_cuda_philox_arg *in_dev, int n,
                                         char *err)
{
    if (n < 0 || (n > 0 && (!out_dev || !in_dev)))
        return error_set(err, ERR_INVALID_ARG, "cuda philox_uniforms: bad arguments (n=%d)", n);
    if (n == 0)
        return 0;
    struct cuda_backend *cb = NULL;
    int rc = smp_enter(be, "kern_cuda_philox_uniforms", &cb, err);
    if (rc < 0)
        return rc;
    smp_philox_uniform_kernel<<<cuda_grid_1d((size_t)n, 256), 256, 0, cb->stream>>>(out_dev,
                                                                                    in_dev, n);
    CUDA_CHECK_LAUNCH("smp_philox_uniform_kernel");
    return 0;
}

extern "C" int kern_cuda_philox_blocks(struct kern_backend *be, uint32_t *out_dev,
                                       const uint32_t *in_dev, int n, char *err)
{
    if (n < 0 || (n > 0 && (!out_dev || !in_dev)))
        return error_set(err, ERR_INVALID_ARG, "cuda philox_blocks: bad arguments (n=%d)", n);
    if (n == 0)
        return 0;
    struct cuda_backend *cb = NULL;
    int rc = smp_enter(be, "kern_cuda_philox_blocks", &cb, err);
    if (rc < 0)
        return rc;
    smp_philox_block_kernel<<<cuda_grid_1d((size_t)n, 256), 256, 0, cb->stream>>>(out_dev, in_dev,
                                                                                  n);
    CUDA_CHECK_LAUNCH("smp_philox_block_kernel");
    return 0;
}

extern "C" void kern_cuda_philox4x32_10_host(const uint32_t counter[4], const uint32_t key[2],
                                             uint32_t out[4])
{
    smp_philox4x32_10(counter, key, out);
}

extern "C" float kern_cuda_philox_uniform_host(uint64_t seed, uint32_t stream, uint64_t position,
                                               uint32_t index)
{
    return smp_philox_uniform(seed, stream, position, index);
}
