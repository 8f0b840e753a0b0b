/* sampling.cu: sampling on the device, the twin of
 * common/speculation/sampling.c (API and contract in kernels_cuda.h; the
 * rules themselves in sampling.h).
 *
 * What it is: argmax, the adjusted distribution (temperature, top-k, top-p,
 * min-p), the Philox draw and plain sampling over rows in device memory, so
 * that only ids, counts and status words go to the host; the speculative
 * accept/reject (greedy and sampled, residual, bonus, point mass) is in
 * speculate.cu, the block primitives both use in sampling_device.cuh.
 * What it is not: an op of struct kern_ops (the engine calls these entries
 * directly), nor the forward pass.
 *
 * One block of SMP_THREADS threads per row (argmax, adjust, sample, draw),
 * so no result depends on how many rows share a launch. Within a block,
 * every reduction has a fixed order. argmax and draw are block primitives
 * shared with speculate.cu: sampling_device.cuh states their orders. Here:
 *
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

#include "sampling_device.cuh"

#define SMP_BINS 256
#define SMP_HIST_COPIES 8 /* shared histograms, one per 2 warps: less atomic contention */

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
