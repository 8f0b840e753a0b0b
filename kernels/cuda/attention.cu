/* attention.cu: cuda_kv_store and cuda_attention, causal grouped-query
 * attention over a paged KV cache (struct kern_kv_layout), the twins of
 * kernels/cpu/attention.c; cuda_rope_kv_store, the rope of q and k and the
 * store of k and v in one launch (the bits of rope, rope, kv_store).
 *
 * Query row i (sequence s, position p) attends to the positions t = 0..p of
 * s; position t is read from pool row table_s[t / block_size] * block_size +
 * t % block_size, so which blocks hold a sequence never changes a value.
 * Query head h reads kv head g = h / (n_heads / n_kv_heads).
 * Decode (n = 1), verification (n = K+1) and prefill rows all take the same
 * path, in two kernels:
 *
 * 1. attn_partial_kernel, one block per (split s, head h, row i) (or per kv
 *    head, see below). Split s
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
 *    A block may take every query head of one kv head instead (a key or
 *    value loaded once for all of them), every head's sums in the order
 *    above: the same bits. That is chosen where those blocks fill the GPU
 *    (long contexts, where the cache is most of a step's reads), or by
 *    kern_cuda_set_attention_path.
 * 2. attn_combine_kernel, one block per (head, row): over the row's splits
 *    s = 0, 1, ... in order, M = max m_s, f_s = expf(m_s - M),
 *    L = sum_s f_s * l_s, out[d] = (sum_s f_s * a_s[d]) / L (FMA chains).
 *    With one split this is a[d] / l exactly (f_0 = 1).
 * Every step is a fixed sequence of rounded operations that depends only on
 * the row's position, its q and its sequence's cached values, so a row's output is bit-identical
 * whether it is computed alone or among n rows. The CPU twin normalises
 * before accumulating (p = e / sum), so CUDA and CPU agree within rounding.
 *
 * Partial results live in backend scratch: rows are processed in groups so
 * that the scratch stays under ATT_SCRATCH_BUDGET bytes for long contexts;
 * the grouping changes no value. The layout's tables and (sequence,
 * position) pairs travel to the device in one staged copy per call, or are
 * a step's (step.cu): then the grid's splits come from the step's bound on
 * positions, not from the rows, so that every step of one shape launches
 * the same grid (a recorded graph replays it); the splits past a row's
 * position return at once and the combine reads only the row's own, so the
 * values are the same either way. out may
 * alias q: a group's partial kernel
 * reads its rows of q before its combine kernel writes the same rows of out.
 * head_dim is at most ATT_HD_MAX.
 *
 * Token trees (struct kern_kv_layout's paths), the CPU twin's rule: a
 * node's logical position t is read at the slot its path names
 * (attn_path_slot, when pool_off is filled) and every index above (the
 * scores, the splits, the sums) stays t, so a node gets the bits the chain
 * of its path gets; kv_store and rope_kv_store write a node at its slot.
 * Eager calls only: a step refuses paths (llama_step.c runs a tree's chunk
 * op by op). Compiled, not yet run on a GPU (tests/unit/
 * test_tree_attention.c checks the CPU; its GPU twin is to come).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_backend.h"

#define ATT_SPLIT 256   /* cache positions per split: fixed, never derived from n */
#define ATT_THREADS 128 /* 4 warps */
#define ATT_WARPS (ATT_THREADS / 32)
#define ATT_HD_MAX 256
#define ATT_SCRATCH_BUDGET ((size_t)64 << 20)
#define ATT_GROUP_MAX 8 /* query heads per kv head the grouped kernel takes */
/* Loads in flight per thread in the partial kernel (speed only: no
 * operation or its order depends on them). Keys: a lane holds
 * ATT_KEY_REGS key elements, ATT_KEY_REGS / KC positions of KC each (8
 * positions at head_dim <= 128, 4 up to 256). Values: ATT_VAL_AHEAD
 * positions. */
#define ATT_KEY_REGS 32
#define ATT_VAL_AHEAD 16

struct attn_dims {
    int row0;        /* first row of this group within the call */
    const int32_t *rows;   /* device [n][2]: (sequence, position) */
    const int32_t *paths;  /* device, NULL without trees: attn_stage_layout's */
    const int32_t *tables; /* device [n_seqs][table_stride] */
    int block_size, table_stride;
    int n_heads, n_kv_heads, head_dim;
    int max_splits;  /* split stride of the scratch layout (a bound, not a value input) */
    float scale;
};

/* Pool row of position t through a sequence's block table. */
static __device__ __forceinline__ size_t attn_pool_row(const int32_t *table, int block_size, int t)
{
    return (size_t)table[t / block_size] * (size_t)block_size + (size_t)(t % block_size);
}

/* Token trees (struct kern_kv_layout), as attn_stage_layout stages them:
 * paths[i] .. paths[i + 1] - 1 index row i's path within paths itself
 * (empty for a chain). The sequence position row i's logical position t
 * is read at (n_pos = its logical position + 1), and the one it is stored
 * at. */
static __device__ __forceinline__ int attn_path_slot(const int32_t *paths, int i, int n_pos, int t)
{
    if (!paths)
        return t;
    const int base = n_pos - (paths[i + 1] - paths[i]);
    return t < base ? t : paths[paths[i] + t - base];
}

static __device__ __forceinline__ int attn_row_slot(const int32_t *rows, const int32_t *paths,
                                                    int i)
{
    return paths && paths[i + 1] > paths[i] ? paths[paths[i + 1] - 1] : rows[2 * i + 1];
}

/* The partial results of hpb query heads of one row over one split, a
 * block per (split, head group, row): hpb is 1 (a block per query head) or
 * G = n_heads / n_kv_heads (every query head of kv head g, each key and
 * value loaded once for all of them; at long contexts the f32 cache, not
 * the weights, is most of what a step reads). Every head's sums run in the
 * order of the file's header whatever hpb is (per head: the lane's d chain
 * and the butterfly per position, the block max, the block sum, one FMA
 * chain over t per d), so hpb is a speed choice that changes no bit.
 * KC: key elements per lane, ceil(head_dim / 32) rounded up to 4 or 8
 * (registers only: elements past head_dim are neither loaded nor used).
 * part_acc: [group_rows][n_heads][max_splits][head_dim];
 * part_ml:  [group_rows][n_heads][max_splits][2] (m, l). */
template <int KC>
__global__ void __launch_bounds__(ATT_THREADS)
    attn_partial_kernel(float *part_acc, float *part_ml, const float *q, const float *k_pool,
                        const float *v_pool, struct attn_dims dm, int hpb)
{
    const int s = blockIdx.x, r = blockIdx.z;
    const int h0 = blockIdx.y * hpb; /* the block's first query head */
    const int i = dm.row0 + r;
    const int32_t *table = dm.tables + (size_t)dm.rows[2 * i] * (size_t)dm.table_stride;
    const int n_pos = dm.rows[2 * i + 1] + 1;
    const int t0 = s * ATT_SPLIT;
    if (t0 >= n_pos)
        return; /* past the causal limit: uniform over the block */
    const int len = min(ATT_SPLIT, n_pos - t0);
    const int hd = dm.head_dim;
    const int g = h0 / (dm.n_heads / dm.n_kv_heads); /* the kv head */
    const size_t kv_stride = (size_t)dm.n_kv_heads * (size_t)hd;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    __shared__ float qs[ATT_GROUP_MAX][ATT_HD_MAX];
    __shared__ float sc[ATT_GROUP_MAX][ATT_SPLIT];
    __shared__ size_t pool_off[ATT_SPLIT];
    for (int gq = 0; gq < hpb; gq++) {
        const float *qrow =
            q + ((size_t)i * (size_t)dm.n_heads + (size_t)(h0 + gq)) * (size_t)hd;
        for (int d = tid; d < hd; d += ATT_THREADS)
            qs[gq][d] = qrow[d];
    }
    /* a tree node's path positions at their slots; every index below
     * (scores, splits, sums) stays the logical position */
    for (int t = tid; t < len; t += ATT_THREADS)
        pool_off[t] = attn_pool_row(table, dm.block_size, attn_path_slot(dm.paths, i, n_pos, t0 + t)) *
                      kv_stride;
    __syncthreads();

    /* Scores: warp w takes the positions t = w, w + ATT_WARPS, ...; it
     * loads KA of them (every lane's KC key elements each) before the
     * first dot product, so KA row loads are in flight instead of one
     * round trip per position. Each position's score is still its own
     * chain (lane's d in increasing order, butterfly, scale): loading
     * ahead moves loads, never an operation. A position past len loads
     * row len - 1 again (a valid address, no branch) and is not scored. */
    constexpr int KA = ATT_KEY_REGS / KC;
    const float *kb = k_pool + (size_t)g * (size_t)hd;
    for (int t = warp; t < len; t += ATT_WARPS * KA) {
        float kv[KA][KC];
#pragma unroll
        for (int u = 0; u < KA; u++) {
            const float *kr = kb + pool_off[min(t + u * ATT_WARPS, len - 1)];
#pragma unroll
            for (int c = 0; c < KC; c++)
                kv[u][c] = lane + 32 * c < hd ? kr[lane + 32 * c] : 0.0f;
        }
        for (int gq = 0; gq < hpb; gq++) {
#pragma unroll
            for (int u = 0; u < KA; u++) {
                const int tu = t + u * ATT_WARPS;
                if (tu < len) { /* uniform over the warp */
                    float a = 0.0f;
#pragma unroll
                    for (int c = 0; c < KC; c++)
                        if (lane + 32 * c < hd)
                            a = __fmaf_rn(qs[gq][lane + 32 * c], kv[u][c], a);
                    a = cuda_warp_sum(a);
                    if (lane == 0)
                        sc[gq][tu] = __fmul_rn(a, dm.scale);
                }
            }
        }
    }
    __syncthreads();

    for (int gq = 0; gq < hpb; gq++) {
        float m = -INFINITY;
        for (int t = tid; t < len; t += ATT_THREADS)
            m = fmaxf(m, sc[gq][t]);
        m = cuda_block_max<ATT_THREADS>(m);
        float l = 0.0f;
        for (int t = tid; t < len; t += ATT_THREADS) {
            const float e = expf(__fsub_rn(sc[gq][t], m));
            sc[gq][t] = e;
            l = __fadd_rn(l, e);
        }
        l = cuda_block_sum<ATT_THREADS>(l); /* its barriers publish sc[gq][] */
        if (tid == 0) {
            const size_t part =
                ((size_t)r * (size_t)dm.n_heads + (size_t)(h0 + gq)) * (size_t)dm.max_splits +
                (size_t)s;
            part_ml[part * 2] = m;
            part_ml[part * 2 + 1] = l;
        }
    }

    /* Values: thread d loads ATT_VAL_AHEAD positions' v[t][d] before their
     * FMAs, which then run in increasing t as before (one chain per head,
     * the same operands in the same order). Positions past len load row
     * len - 1 again and are skipped. */
    const float *vb = v_pool + (size_t)g * (size_t)hd;
    for (int d = tid; d < hd; d += ATT_THREADS) {
        float acc[ATT_GROUP_MAX];
#pragma unroll
        for (int gq = 0; gq < ATT_GROUP_MAX; gq++)
            acc[gq] = 0.0f;
        for (int t = 0; t < len; t += ATT_VAL_AHEAD) {
            float v[ATT_VAL_AHEAD];
#pragma unroll
            for (int u = 0; u < ATT_VAL_AHEAD; u++)
                v[u] = vb[pool_off[min(t + u, len - 1)] + (size_t)d];
#pragma unroll
            for (int u = 0; u < ATT_VAL_AHEAD; u++)
                if (t + u < len) {
#pragma unroll
                    for (int gq = 0; gq < ATT_GROUP_MAX; gq++)
                        if (gq < hpb)
                            acc[gq] = __fmaf_rn(sc[gq][t + u], v[u], acc[gq]);
                }
        }
#pragma unroll
        for (int gq = 0; gq < ATT_GROUP_MAX; gq++)
            if (gq < hpb) {
                const size_t part =
                    ((size_t)r * (size_t)dm.n_heads + (size_t)(h0 + gq)) *
                        (size_t)dm.max_splits +
                    (size_t)s;
                part_acc[part * (size_t)hd + (size_t)d] = acc[gq];
            }
    }
}

__global__ void __launch_bounds__(ATT_THREADS)
    attn_combine_kernel(float *out, const float *part_acc, const float *part_ml,
                        struct attn_dims dm)
{
    const int h = blockIdx.x, r = blockIdx.y;
    const int i = dm.row0 + r;
    const int n_split = (dm.rows[2 * i + 1] + 1 + ATT_SPLIT - 1) / ATT_SPLIT;
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

static int attn_splits(int n_positions)
{
    return (int)(((long)n_positions + ATT_SPLIT - 1) / ATT_SPLIT);
}

/* Scratch bytes of one row's partial results. */
static size_t attn_row_bytes(int n_heads, int head_dim, int max_splits)
{
    return (size_t)n_heads * (size_t)max_splits * ((size_t)head_dim + 2) * sizeof(float);
}

/* Rows per group: the scratch stays under ATT_SCRATCH_BUDGET. */
static size_t attn_group_rows(int n, int n_heads, int head_dim, int max_splits)
{
    size_t group = ATT_SCRATCH_BUDGET / attn_row_bytes(n_heads, head_dim, max_splits);
    group = group < 1 ? 1 : group > 65535 ? 65535 : group;
    return group > (size_t)n ? (size_t)n : group;
}

int cuda_attention_reserve(struct cuda_backend *cb, int max_rows, int n_heads, int head_dim,
                           int max_positions, char *err)
{
    /* A call of n <= max_rows rows with at most these heads uses
     * min(n, budget / row) rows of at most row bytes: never more than
     * min(max_rows * row, budget), or one row where a row alone is more. */
    const size_t row = attn_row_bytes(n_heads, head_dim, attn_splits(max_positions));
    size_t bytes = (size_t)max_rows * row;
    bytes = bytes < ATT_SCRATCH_BUDGET ? bytes : ATT_SCRATCH_BUDGET;
    bytes = bytes > row ? bytes : row;
    return cuda_backend_scratch(cb, &cb->attn_part, &cb->attn_part_bytes, bytes,
                                "cuda attention scratch", err);
}

static int attn_launch_group(struct cuda_backend *cb, float *out, const float *q,
                             const float *k_pool, const float *v_pool, int rows,
                             const struct attn_dims *dm, char *err)
{
    const size_t acc_floats =
        (size_t)rows * (size_t)dm->n_heads * (size_t)dm->max_splits * (size_t)dm->head_dim;
    float *part_acc = (float *)cb->attn_part;
    float *part_ml = part_acc + acc_floats;
    /* a kv head's query heads in one block where those blocks alone fill
     * the GPU (a speed choice: the same bits either way) */
    const int group = dm->n_heads / dm->n_kv_heads;
    const long grouped_blocks = (long)dm->max_splits * dm->n_kv_heads * rows;
    const bool grouped =
        group <= ATT_GROUP_MAX &&
        (cb->attn_path == KERN_CUDA_ATTN_GROUPED ||
         (cb->attn_path == KERN_CUDA_ATTN_AUTO && group > 1 && grouped_blocks >= cb->sm_count));
    const int hpb = grouped ? group : 1;
    const dim3 grid_p((unsigned int)dm->max_splits, (unsigned int)(dm->n_heads / hpb),
                      (unsigned int)rows);
    if (dm->head_dim <= 128)
        attn_partial_kernel<4><<<grid_p, ATT_THREADS, 0, cb->stream>>>(part_acc, part_ml, q,
                                                                       k_pool, v_pool, *dm, hpb);
    else
        attn_partial_kernel<ATT_HD_MAX / 32><<<grid_p, ATT_THREADS, 0, cb->stream>>>(
            part_acc, part_ml, q, k_pool, v_pool, *dm, hpb);
    CUDA_CHECK_LAUNCH("attn_partial_kernel");
    const dim3 grid_c((unsigned int)dm->n_heads, (unsigned int)rows);
    attn_combine_kernel<<<grid_c, ATT_THREADS, 0, cb->stream>>>(out, part_acc, part_ml, *dm);
    CUDA_CHECK_LAUNCH("attn_combine_kernel");
    return 0;
}

/* The layout's tables and rows on the device: the step's copies (checked
 * by step_begin; *max_positions its bound), else checked here and staged
 * (*max_positions 0), valid for the kernels queued next (see
 * cuda_backend_stage2). A tree's paths (never in a step: step_begin
 * refuses them) travel behind the rows in the same copy, as *dev_paths:
 * [n + 1] offsets into that same array, then the slots
 * (attn_path_slot); *dev_paths is NULL for a call of chains. */
static int attn_stage_layout(struct cuda_backend *cb, const struct kern_kv_layout *kv, int n,
                             const char *op, const int32_t **dev_rows, const int32_t **dev_tables,
                             const int32_t **dev_paths, int *max_positions, char *err)
{
    *max_positions = 0;
    *dev_paths = NULL;
    if (cuda_step_layout(cb, kv, n, dev_rows, dev_tables, max_positions))
        return 0;
    int rc = kern_kv_layout_check(kv, n, op, err);
    if (rc)
        return rc;
    const size_t rows_ints = (size_t)n * 2;
    size_t ints = rows_ints;
    int32_t *packed = NULL;
    if (kv->path_offset) {
        const size_t total = (size_t)kv->path_offset[n];
        ints += (size_t)n + 1 + total;
        if (!(packed = (int32_t *)malloc(ints * sizeof(int32_t))))
            return error_set(err, ERR_NOMEM, "%s: out of memory for the tree's paths", op);
        memcpy(packed, kv->rows, rows_ints * sizeof(int32_t));
        for (int i = 0; i <= n; i++)
            packed[rows_ints + (size_t)i] = n + 1 + kv->path_offset[i];
        memcpy(packed + rows_ints + (size_t)n + 1, kv->path_phys, total * sizeof(int32_t));
    }
    const void *dev = NULL;
    size_t tables_off = 0;
    rc = cuda_backend_stage2(cb, packed ? packed : kv->rows, ints * sizeof(int32_t), kv->tables,
                             (size_t)kv->n_seqs * (size_t)kv->table_stride * sizeof(int32_t), &dev,
                             &tables_off, err);
    free(packed); /* staged: the host bytes are free again */
    if (rc < 0)
        return rc;
    *dev_rows = (const int32_t *)dev;
    *dev_tables = (const int32_t *)((const char *)dev + tables_off);
    if (kv->path_offset)
        *dev_paths = *dev_rows + rows_ints;
    return 0;
}

/* One block per row: the row's kv_dim keys and values to their pool row. */
__global__ void __launch_bounds__(ATT_THREADS)
    kv_store_kernel(float *k_pool, float *v_pool, const float *k, const float *v,
                    const int32_t *rows, const int32_t *paths, const int32_t *tables,
                    int block_size, int table_stride, int kv_dim)
{
    const int i = blockIdx.x;
    const int32_t *table = tables + (size_t)rows[2 * i] * (size_t)table_stride;
    const size_t dst =
        attn_pool_row(table, block_size, attn_row_slot(rows, paths, i)) * (size_t)kv_dim;
    const size_t src = (size_t)i * (size_t)kv_dim;
    for (int d = threadIdx.x; d < kv_dim; d += ATT_THREADS) {
        k_pool[dst + (size_t)d] = k[src + (size_t)d];
        v_pool[dst + (size_t)d] = v[src + (size_t)d];
    }
}

int cuda_kv_store(struct kern_backend *be, float *k_pool, float *v_pool, const float *k,
                  const float *v, int n, const struct kern_kv_layout *kv, int kv_dim, char *err)
{
    struct cuda_backend *cb = cuda_backend_of(be);
    if (n < 0 || kv_dim <= 0)
        return error_set(err, ERR_INVALID_ARG, "cuda kv_store: bad shape n=%d kv_dim=%d", n,
                         kv_dim);
    if (n == 0)
        return 0;
    if (!k_pool || !v_pool || !k || !v || !kv)
        return error_set(err, ERR_INVALID_ARG, "cuda kv_store: NULL tensor");
    int rc = cuda_backend_enter(cb, err);
    if (rc < 0)
        return rc;
    const int32_t *rows = NULL, *tables = NULL, *paths = NULL;
    int step_positions = 0;
    if ((rc = attn_stage_layout(cb, kv, n, "cuda kv_store", &rows, &tables, &paths,
                                &step_positions, err)))
        return rc;
    kv_store_kernel<<<(unsigned int)n, ATT_THREADS, 0, cb->stream>>>(
        k_pool, v_pool, k, v, rows, paths, tables, kv->block_size, kv->table_stride, kv_dim);
    CUDA_CHECK_LAUNCH("kv_store_kernel");
    return 0;
}

#define RKV_THREADS 256

/* One block per row: rope of the row's query heads and key heads in place
 * (rope.cu's arithmetic), the rotated keys and the values to the row's
 * pool row (kv_store's copy). A thread owns one frequency j and a stride of
 * heads: it takes sincosf of the row's angle j once (cuda_rope_angle)
 * and rotates the pair j of each of its heads with it (cuda_rope_rotate),
 * instead of once per (head, j): the same operations on the same operands,
 * so the bits of cuda_rope_pair. Consecutive threads still take
 * consecutive j of one head (coalesced). */
__global__ void __launch_bounds__(RKV_THREADS)
    rope_kv_store_kernel(float *q, float *k, const float *v, const int32_t *positions,
                         const float *inv_freq, int n_heads, int n_kv_heads, int head_dim,
                         float *k_pool, float *v_pool, const int32_t *rows, const int32_t *paths,
                         const int32_t *tables, int block_size, int table_stride)
{
    const int i = blockIdx.x;
    const int half = head_dim / 2;
    const size_t kv_dim = (size_t)n_kv_heads * (size_t)head_dim;
    const float pos = (float)positions[i];
    const int32_t *table = tables + (size_t)rows[2 * i] * (size_t)table_stride;
    const size_t dst = attn_pool_row(table, block_size, attn_row_slot(rows, paths, i)) * kv_dim;
    float *qr = q + (size_t)i * (size_t)n_heads * (size_t)head_dim;
    float *kr = k + (size_t)i * kv_dim;
    /* heads in parallel: RKV_THREADS / half of them (one when half is
     * larger, then a thread takes several j) */
    const int h_step = half < RKV_THREADS ? RKV_THREADS / half : 1;
    const int n_all = n_heads + n_kv_heads;
    for (int idx = threadIdx.x; idx < h_step * half; idx += RKV_THREADS) {
        const int h_first = idx / half, j = idx - h_first * half;
        float sn, cs;
        cuda_rope_angle(pos, inv_freq[j], &sn, &cs);
        for (int h = h_first; h < n_all; h += h_step) {
            const bool is_q = h < n_heads;
            float *x = is_q ? qr + (size_t)h * (size_t)head_dim
                            : kr + (size_t)(h - n_heads) * (size_t)head_dim;
            float x1 = x[j], x2 = x[j + half];
            cuda_rope_rotate(sn, cs, &x1, &x2);
            x[j] = x1;
            x[j + half] = x2;
            if (!is_q) {
                float *kp = k_pool + dst + (size_t)(h - n_heads) * (size_t)head_dim;
                kp[j] = x1;
                kp[j + half] = x2;
            }
        }
    }
    const float *vr = v + (size_t)i * kv_dim;
    for (size_t d = threadIdx.x; d < kv_dim; d += RKV_THREADS)
        v_pool[dst + d] = vr[d];
}

int cuda_rope_kv_store(struct kern_backend *be, float *q, float *k, const float *v,
                       const int32_t *positions, int n, int n_heads, int n_kv_heads, int head_dim,
                       const float *inv_freq, float *k_pool, float *v_pool,
                       const struct kern_kv_layout *kv, char *err)
{
    struct cuda_backend *cb = cuda_backend_of(be);
    if (n < 0 || n_heads <= 0 || n_kv_heads <= 0 || head_dim <= 0 || head_dim % 2 != 0 ||
        (long)(n_heads + n_kv_heads) * head_dim > (1L << 30))
        return error_set(err, ERR_INVALID_ARG,
                         "cuda rope_kv_store: bad shape n=%d n_heads=%d n_kv_heads=%d "
                         "head_dim=%d (head_dim must be even)", n, n_heads, n_kv_heads, head_dim);
    if (n == 0)
        return 0;
    if (!q || !k || !v || !positions || !inv_freq || !k_pool || !v_pool || !kv)
        return error_set(err, ERR_INVALID_ARG, "cuda rope_kv_store: NULL argument");
    int rc = cuda_backend_enter(cb, err);
    if (rc < 0)
        return rc;
    const int32_t *pos_dev = NULL;
    const float *freq_dev = NULL;
    if ((rc = cuda_rope_inputs(cb, positions, n, inv_freq, head_dim / 2, &pos_dev, &freq_dev,
                               err)) < 0)
        return rc;
    const int32_t *rows = NULL, *tables = NULL, *paths = NULL;
    int step_positions = 0;
    if ((rc = attn_stage_layout(cb, kv, n, "cuda rope_kv_store", &rows, &tables, &paths,
                                &step_positions, err)))
        return rc;
    rope_kv_store_kernel<<<(unsigned int)n, RKV_THREADS, 0, cb->stream>>>(
        q, k, v, pos_dev, freq_dev, n_heads, n_kv_heads, head_dim, k_pool, v_pool, rows, paths,
        tables, kv->block_size, kv->table_stride);
    CUDA_CHECK_LAUNCH("rope_kv_store_kernel");
    return 0;
}

int cuda_attention(struct kern_backend *be, float *out, const float *q, const float *k_pool,
                   const float *v_pool, int n, const struct kern_kv_layout *kv, int n_heads,
                   int n_kv_heads, int head_dim, float scale, char *err)
{
    struct cuda_backend *cb = cuda_backend_of(be);
    if (n < 0 || n_heads <= 0 || n_kv_heads <= 0 || head_dim <= 0)
        return error_set(err, ERR_INVALID_ARG,
                         "cuda attention: bad shape n=%d n_heads=%d n_kv_heads=%d head_dim=%d", n,
                         n_heads, n_kv_heads, head_dim);
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
    if (!out || !q || !k_pool || !v_pool || !kv)
        return error_set(err, ERR_INVALID_ARG, "cuda attention: NULL tensor");
    int rc = cuda_backend_enter(cb, err);
    if (rc < 0)
        return rc;
    struct attn_dims dm;
    dm.row0 = 0;
    int n_positions = 0;
    if ((rc = attn_stage_layout(cb, kv, n, "cuda attention", &dm.rows, &dm.tables, &dm.paths,
                                &n_positions, err)))
        return rc;
    if (n_positions == 0) /* not a step: the grid follows the rows' positions */
        for (int i = 0; i < n; i++)
            n_positions = kv->rows[2 * i + 1] + 1 > n_positions ? kv->rows[2 * i + 1] + 1
                                                                : n_positions;
    dm.block_size = kv->block_size;
    dm.table_stride = kv->table_stride;
    dm.n_heads = n_heads;
    dm.n_kv_heads = n_kv_heads;
    dm.head_dim = head_dim;
    dm.max_splits = attn_splits(n_positions);
    dm.scale = scale;
    const size_t group = attn_group_rows(n, n_heads, head_dim, dm.max_splits);
    rc = cuda_backend_scratch(cb, &cb->attn_part, &cb->attn_part_bytes,
                              group * attn_row_bytes(n_heads, head_dim, dm.max_splits),
                              "cuda attention scratch", err);
    if (rc < 0)
        return rc;
    for (int r0 = 0; r0 < n; r0 += (int)group) {
        const int rows = n - r0 < (int)group ? n - r0 : (int)group;
        dm.row0 = r0;
        if ((rc = attn_launch_group(cb, out, q, k_pool, v_pool, rows, &dm, err)) < 0)
            return rc;
    }
    return 0;
}

extern "C" int kern_cuda_set_attention_path(struct kern_backend *be,
                                            enum kern_cuda_attn_path path, char *err)
{
    if (!be || strcmp(be->name, "cuda") != 0)
        return error_set(err, ERR_INVALID_ARG, "kern_cuda_set_attention_path: not a cuda backend");
    if (path != KERN_CUDA_ATTN_AUTO && path != KERN_CUDA_ATTN_PER_HEAD &&
        path != KERN_CUDA_ATTN_GROUPED)
        return error_set(err, ERR_INVALID_ARG, "kern_cuda_set_attention_path: unknown path %d",
                         (int)path);
    struct cuda_backend *cb = cuda_backend_of(be);
    if (cb->attn_path != (int)path)
        cb->memory_generation++; /* recorded graphs hold the old choice: record again */
    cb->attn_path = (int)path;
    return 0;
}
