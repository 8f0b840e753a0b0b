/* attention.cu: cuda_attention, causal grouped-query attention over the KV
 * cache, the twin of kernels/cpu/attention.c.
 *
 * Query row i sits at position p = pos0 + i and attends to cache positions
 * t = 0..p; query head h reads kv head g = h / (n_heads / n_kv_heads).
 * Decode (n = 1), verification (n = K+1) and prefill rows all take the same
 * path, in two kernels:
 *
 * 1. attn_partial_kernel, one block per (split s, head h, row i). Split s
 *    covers t in [s*ATT_SPLIT, min((s+1)*ATT_SPLIT, p+1)). ATT_SPLIT is a
 *    constant: the number of splits of a row is ceil((p+1)/ATT_SPLIT), a
 *    function of the row's position only, never of n. The block computes
 *      s[t]  = dot(q, k[t]) * scale  (one warp per t; lane l sums d = l,
 *              l+32, ... in increasing d with FMA, then the xor butterfly)
 *      m     = max_t s[t]             (exact in any order)
 *      e[t]  = expf(s[t] - m)
 *      l     = sum_t e[t]             (cuda_block_sum: thread j takes t = j,
 *              j + ATT_THREADS, ... in order, then the fixed block tree)
 *      a[d]  = sum_t e[t] * v[t][d]  (thread d, increasing t, one FMA per t)
 *    and stores m, l and a[] for the split.
 * 2. attn_combine_kernel, one block per (head, row): over the row's splits
 *    s = 0, 1, ... in order, M = max m_s, f_s = expf(m_s - M),
 *    L = sum_s f_s * l_s, out[d] = (sum_s f_s * a_s[d]) / L (FMA chains).
 *    With one split this is a[d] / l exactly (f_0 = 1).
 * Every step is a fixed sequence of rounded operations that depends only on
 * the row's position, its q and the cache, so a row's output is bit-identical
 * whether it is computed alone or among n rows. The CPU twin normalises
 * before accumulating (p = e / sum), so CUDA and CPU agree within rounding.
 *
 * Partial results live in backend scratch: rows are processed in groups so
 * that the scratch stays under ATT_SCRATCH_BUDGET bytes for long contexts;
 * the grouping changes no value. out may alias q: a group's partial kernel
 * reads its rows of q before its combine kernel writes the same rows of out.
 * head_dim is at most ATT_HD_MAX.
 */
#include <math.h>

#include "cuda_backend.h"

#define ATT_SPLIT 256   /* cache positions per split: fixed, never derived from n */
#define ATT_THREADS 128 /* 4 warps */
#define ATT_WARPS (ATT_THREADS / 32)
#define ATT_HD_MAX 256
#define ATT_SCRATCH_BUDGET ((size_t)64 << 20)

struct attn_dims {
    int row0;        /* first row of this group within the call */
    int pos0;        /* position of row 0 of the call */
    int n_heads, n_kv_heads, head_dim;
    int max_splits;  /* split stride of the scratch layout (a bound, not a value input) */
    float scale;
};

/* part_acc: [group_rows][n_heads][max_splits][head_dim];
 * part_ml:  [group_rows][n_heads][max_splits][2] (m, l). */
__global__ void __launch_bounds__(ATT_THREADS)
    attn_partial_kernel(float *part_acc, float *part_ml, const float *q, const float *k_cache,
                        const float *v_cache, struct attn_dims dm)
{
    const int s = blockIdx.x, h = blockIdx.y, r = blockIdx.z;
    const int i = dm.row0 + r;
    const int n_pos = dm.pos0 + i + 1;
    const int t0 = s * ATT_SPLIT;
    if (t0 >= n_pos)
        return; /* past the causal limit: uniform over the block */
    const int len = min(ATT_SPLIT, n_pos - t0);
    const int hd = dm.head_dim;
    const int g = h / (dm.n_heads / dm.n_kv_heads);
    const size_t kv_stride = (size_t)dm.n_kv_heads * (size_t)hd;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    __shared__ float qs[ATT_HD_MAX];
    __shared__ float sc[ATT_SPLIT];
    const float *qrow = q + ((size_t)i * (size_t)dm.n_heads + (size_t)h) * (size_t)hd;
    for (int d = tid; d < hd; d += ATT_THREADS)
        qs[d] = qrow[d];
    __syncthreads();

    const float *kb = k_cache + (size_t)t0 * kv_stride + (size_t)g * (size_t)hd;
    for (int t = warp; t < len; t += ATT_WARPS) {
        const float *kr = kb + (size_t)t * kv_stride;
        float a = 0.0f;
        for (int d = lane; d < hd; d += 32)
            a = __fmaf_rn(qs[d], kr[d], a);
        a = cuda_warp_sum(a);
        if (lane == 0)
            sc[t] = __fmul_rn(a, dm.scale);
    }
    __syncthreads();

    float m = -INFINITY;
    for (int t = tid; t < len; t += ATT_THREADS)
        m = fmaxf(m, sc[t]);
    m = cuda_block_max<ATT_THREADS>(m);

    float l = 0.0f;
    for (int t = tid; t < len; t += ATT_THREADS) {
        const float e = expf(__fsub_rn(sc[t], m));
        sc[t] = e;
        l = __fadd_rn(l, e);
    }
    l = cuda_block_sum<ATT_THREADS>(l); /* its barriers publish sc[] */

    const size_t part = ((size_t)r * (size_t)dm.n_heads + (size_t)h) * (size_t)dm.max_splits +
                        (size_t)s;
    const float *vb = v_cache + (size_t)t0 * kv_stride + (size_t)g * (size_t)hd;
    for (int d = tid; d < hd; d += ATT_THREADS) {
        float acc = 0.0f;
        for (int t = 0; t < len; t++)
            acc = __fmaf_rn(sc[t], vb[(size_t)t * kv_stride + (size_t)d], acc);
        part_acc[part * (size_t)hd + (size_t)d] = acc;
    }
    if (tid == 0) {
        part_ml[part * 2] = m;
        part_ml[part * 2 + 1] = l;
    }
}

__global__ void __launch_bounds__(ATT_THREADS)
    attn_combine_kernel(float *out, const float *part_acc, const float *part_ml,
                        struct attn_dims dm)
{
    const int h = blockIdx.x, r = blockIdx.y;
    const int i = dm.row0 + r;
    const int n_split = (dm.pos0 + i + 1 + ATT_SPLIT - 1) / ATT_SPLIT;
    const int hd = dm.head_dim;
    const size_t part0 = ((size_t)r * (size_t)dm.n_heads + (size_t)h) * (size_t)dm.max_splits;
    const float *ml = part_ml + part0 * 2;

    float mx = -INFINITY;
    for (int s = 0; s < n_split; s++)
        mx = fmaxf(mx, ml[2 * s]);
    float sum = 0.0f;
    for (int s = 0; s < n_split; s++)
        sum = __fmaf_rn(expf(__fsub_rn(ml[2 * s], mx)), ml[2 * s + 1], sum);

    float *o = out + ((size_t)i * (size_t)dm.n_heads + (size_t)h) * (size_t)hd;
    for (int d = threadIdx.x; d < hd; d += ATT_THREADS) {
        float a = 0.0f;
        for (int s = 0; s < n_split; s++)
            a = __fmaf_rn(expf(__fsub_rn(ml[2 * s], mx)),
                          part_acc[(part0 + (size_t)s) * (size_t)hd + (size_t)d], a);
        o[d] = __fdiv_rn(a, sum);
    }
}

static int attn_launch_group(struct cuda_backend *cb, float *out, const float *q,
                             const float *k_cache, const float *v_cache, int rows,
                             const struct attn_dims *dm, char *err)
{
    const size_t acc_floats =
        (size_t)rows * (size_t)dm->n_heads * (size_t)dm->max_splits * (size_t)dm->head_dim;
    float *part_acc = (float *)cb->attn_part;
    float *part_ml = part_acc + acc_floats;
    const dim3 grid_p((unsigned int)dm->max_splits, (unsigned int)dm->n_heads,
                      (unsigned int)rows);
    attn_partial_kernel<<<grid_p, ATT_THREADS, 0, cb->stream>>>(part_acc, part_ml, q, k_cache,
                                                                v_cache, *dm);
    CUDA_CHECK_LAUNCH("attn_partial_kernel");
    const dim3 grid_c((unsigned int)dm->n_heads, (unsigned int)rows);
    attn_combine_kernel<<<grid_c, ATT_THREADS, 0, cb->stream>>>(out, part_acc, part_ml, *dm);
    CUDA_CHECK_LAUNCH("attn_combine_kernel");
    return 0;
}

int cuda_attention(struct kern_backend *be, float *out, const float *q, const float *k_cache,
                   const float *v_cache, int n, int pos0, int n_heads, int n_kv_heads,
                   int head_dim, float scale, char *err)
{
    struct cuda_backend *cb = cuda_backend_of(be);
    if (n < 0 || pos0 < 0 || n_heads <= 0 || n_kv_heads <= 0 || head_dim <= 0)
        return error_set(err, ERR_INVALID_ARG,
                         "cuda attention: bad shape n=%d pos0=%d n_heads=%d n_kv_heads=%d "
                         "head_dim=%d", n, pos0, n_heads, n_kv_heads, head_dim);
    if (n_heads % n_kv_heads != 0)
        return error_set(err, ERR_INVALID_ARG,
                         "cuda attention: n_heads=%d is not a multiple of n_kv_heads=%d", n_heads,
                         n_kv_heads);
    if (head_dim > ATT_HD_MAX || n_heads > 65535)
        return error_set(err, ERR_UNSUPPORTED,
                         "cuda attention: head_dim=%d n_heads=%d (supported: head_dim <= %d, "
                         "n_heads <= 65535)", head_dim, n_heads, ATT_HD_MAX);
    if (n == 0)
        return 0;
    if (pos0 > INT32_MAX - n)
        return error_set(err, ERR_RANGE, "cuda attention: pos0=%d + n=%d overflows", pos0, n);
    if (!out || !q || !k_cache || !v_cache)
        return error_set(err, ERR_INVALID_ARG, "cuda attention: NULL tensor");
    int rc = cuda_backend_enter(cb, err);
    if (rc < 0)
        return rc;

    struct attn_dims dm;
    dm.row0 = 0;
    dm.pos0 = pos0;
    dm.n_heads = n_heads;
    dm.n_kv_heads = n_kv_heads;
    dm.head_dim = head_dim;
    dm.max_splits = (int)(((long)pos0 + n + ATT_SPLIT - 1) / ATT_SPLIT);
    dm.scale = scale;
    const size_t row_bytes = (size_t)n_heads * (size_t)dm.max_splits *
                             ((size_t)head_dim + 2) * sizeof(float);
    size_t group = ATT_SCRATCH_BUDGET / row_bytes;
    group = group < 1 ? 1 : group > 65535 ? 65535 : group;
    if (group > (size_t)n)
        group = (size_t)n;
    rc = cuda_backend_scratch(cb, &cb->attn_part, &cb->attn_part_bytes, group * row_bytes,
                              "cuda attention scratch", err);
    if (rc < 0)
        return rc;
    for (int r0 = 0; r0 < n; r0 += (int)group) {
        const int rows = n - r0 < (int)group ? n - r0 : (int)group;
        dm.row0 = r0;
        if ((rc = attn_launch_group(cb, out, q, k_cache, v_cache, rows, &dm, err)) < 0)
            return rc;
    }
    return 0;
}
