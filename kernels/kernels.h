/* kernels.h: the op table every compute backend implements (cpu/, cuda/).
 *
 * The Llama model code (common/model/llama.c) is written once against this table.
 * A backend owns its device, threads or streams and its scratch space; the
 * model owns the buffers it asks the backend to allocate.
 *
 * Memory: every `float *`/`void *` tensor argument below lives in the
 * backend's memory space (host memory for cpu, device memory for cuda) and
 * was obtained from alloc() or map_weights(). Small index arrays (`ids`,
 * `positions`) are always host memory: the backend copies them if it must.
 * Layouts are row-major; shapes are given in the comment beside each pointer.
 * Weights are HuggingFace `nn.Linear` layout: w[d_out][d_in].
 *
 * Exactness contract (batch invariance): every op computes each output row
 * with a reduction order that depends only on that row's inputs and sizes
 * (d_in, dim, the row's position), never on `n` (how many rows are in the
 * call) nor on the number of threads. So the logits of a position are
 * bit-identical whether it is computed alone or as one of many rows, and
 * across processes configured with different thread counts. Both backends
 * keep it for every n, matmul included: on CUDA a prefill row is
 * bit-identical to the same row decoded alone, so the KV cache a prompt
 * writes is the one decoding would have written (kernels/cuda/matmul.cu
 * states the order; no op uses cuBLAS).
 *
 * Calls are ordered: a backend may run them asynchronously (cuda) but each
 * observes the results of the previous ones; sync() waits for all of them.
 * Return: 0 or a negative error code (common/base/error.h) with the reason in err
 * (NULL or ERR_MSG_MAX bytes).
 */
#ifndef TANDEM_KERNELS_H
#define TANDEM_KERNELS_H

#include <stddef.h>
#include <stdint.h>

enum kern_dtype {
    KERN_DTYPE_BF16 = 0,
    KERN_DTYPE_F16 = 1,
    KERN_DTYPE_F32 = 2,
    /* int8 weights, one f32 scale per row. A [rows][cols] matrix is
     * rows * cols int8 values, then, from the next multiple of 64 bytes,
     * rows f32 scales (kern_q8_bytes, kern_q8_scales); w[o][k] stands for
     * q[o][k] * scale[o]. Only map_matrix and matmul take it (cpu: against
     * int8 activations, per row and block of 32, kernels/cpu/qdot.h, so its
     * bits are not the f32 product's; cuda: f32 activations, matmul_quant.cu). */
    KERN_DTYPE_Q8 = 3,
    /* 4-bit weights in groups of 32 along a row, each group 16 bytes of
     * nibbles (element j < 16 in the low half of byte j, element 16 + j in
     * its high half, so that 8 neighbours widen from 8 consecutive bytes;
     * a nibble n stands for n - 8) and then its f32 scale: 20 bytes per 32
     * weights, rows back to back (kern_q4_bytes). w = (n - 8) * scale, in
     * f32. cols must be a multiple of 32. Only map_matrix and matmul take it
     * (cpu: int8 activations as for KERN_DTYPE_Q8; cuda: matmul_quant.cu). */
    KERN_DTYPE_Q4 = 4,
};
#define KERN_DTYPE_COUNT 5
#define KERN_Q4_GROUP 32
#define KERN_Q4_GROUP_BYTES 20

/* Bytes per element of a dtype (KERN_DTYPE_Q8: 1, its scales aside). */
size_t kern_dtype_size(enum kern_dtype dtype);
/* Bytes of a [rows][cols] KERN_DTYPE_Q8 matrix, its scales included. */
size_t kern_q8_bytes(int64_t rows, int64_t cols);
/* Offset of the scales of a [rows][cols] KERN_DTYPE_Q8 matrix. */
size_t kern_q8_scales_offset(int64_t rows, int64_t cols);
/* Bytes of a [rows][cols] KERN_DTYPE_Q4 matrix (cols a multiple of 32). */
size_t kern_q4_bytes(int64_t rows, int64_t cols);
const char *kern_dtype_name(enum kern_dtype dtype);

struct kern_backend;

/* Where the cached keys and values of a call's sequences live (paged
 * attention): a pool of n_blocks blocks of block_size positions. Position t
 * of sequence s is pool row
 *   tables[s * table_stride + t / block_size] * block_size + t % block_size.
 * Row i of the call belongs to sequence rows[2i] and sits at position
 * rows[2i + 1]. All arrays are host memory; the backend copies what it needs.
 * A contiguous cache is the special case block_size >= n_ctx, tables = {0}. */
struct kern_kv_layout {
    int block_size;        /* >= 1 */
    int n_blocks;          /* blocks in the pool: every table entry used is < n_blocks */
    int n_seqs;            /* sequences named by the call */
    int table_stride;      /* table entries per sequence */
    const int32_t *tables; /* host [n_seqs][table_stride] */
    const int32_t *rows;   /* host [n][2]: (sequence, position) of each row */
    /* Token trees (docs/token-trees.md); both NULL for a call of chains,
     * which then runs exactly as without them. Row i is a tree node when
     * path_offset[i + 1] > path_offset[i]: with p = rows[2i + 1] (its
     * logical position, L + depth - 1) and d = that difference (its depth),
     * its logical positions L .. p, L = p + 1 - d, sit at the pool positions
     * path_phys[path_offset[i] ..] of its sequence (its ancestors in depth
     * order, then its own slot: strictly increasing, all >= L), and its
     * positions below L at themselves. kv_store writes a node at its own
     * slot (the path's last entry); attention reads logical position t
     * where the path puts it and orders every reduction by t, so a node's
     * output is bit for bit what the chain of its path gives at p. Other
     * rows (equal offsets) are chains. */
    const int32_t *path_offset; /* host [n + 1], path_offset[0] = 0 */
    const int32_t *path_phys;   /* host [path_offset[n]] */
};

/* The pool position row i of the call writes its keys and values at: its
 * position, or for a tree node the last entry of its path. */
static inline int32_t kern_kv_row_slot(const struct kern_kv_layout *kv, int i)
{
    if (kv->path_offset && kv->path_offset[i + 1] > kv->path_offset[i])
        return kv->path_phys[kv->path_offset[i + 1] - 1];
    return kv->rows[2 * i + 1];
}

/* Checks that every row of kv names a sequence of the layout, a position
 * covered by its table, and blocks inside the pool, up to and including the
 * row's own position (a tree node's: its slot), and that a tree node's path
 * is as struct kern_kv_layout says. 0 or ERR_INVALID_ARG / ERR_RANGE naming
 * the row. Shared by the backends so that both refuse exactly the same
 * calls (a backend without trees refuses path_offset on its own). */
int kern_kv_layout_check(const struct kern_kv_layout *kv, int n, const char *op, char *err);

/* One forward step's small host inputs, handed to a backend at once
 * (step_begin): a device backend copies them in one transfer, into memory
 * whose address never changes, instead of one copy per op; a graph
 * captured over the step's ops reads them there on every replay. */
struct kern_step {
    int n;                           /* rows of the step */
    const int32_t *ids;              /* host [n]: embed's ids */
    const int32_t *positions;        /* host [n]: rope's positions */
    const float *inv_freq;           /* host [n_freq]: rope's frequencies */
    int n_freq;
    const struct kern_kv_layout *kv; /* kv_store's and attention's layout */
    /* A bound above every row's position + 1: attention sizes its grid by
     * it, not by the rows' positions, so the launches of two steps of the
     * same shape are the same (the kernels read the positions on the
     * device and skip what lies past them: no value changes). */
    int max_positions;
};

/* The largest step a backend must take without allocating (step_reserve). */
struct kern_step_limits {
    int max_rows;      /* rows of a step */
    int max_seqs;      /* sequences of its layout */
    int table_stride;  /* largest table_stride of its layout */
    int max_positions; /* largest kern_step.max_positions */
    int max_freq;      /* largest n_freq */
    int n_heads, head_dim; /* attention's query heads and head size */
};

/* A recorded sequence of ops (graph_capture_begin .. graph_capture_end). */
struct kern_graph;

struct kern_ops {
    /* Frees the backend and everything it allocated internally (not the
     * buffers handed out by alloc: the caller frees those first). */
    void (*destroy)(struct kern_backend *be);

    /* Zero-filled buffer of size_bytes in backend memory. */
    int (*alloc)(struct kern_backend *be, size_t size_bytes, void **out, char *err);
    void (*free)(struct kern_backend *be, void *ptr); /* NULL-safe */
    int (*upload)(struct kern_backend *be, void *dst, const void *src_host, size_t size_bytes,
                  char *err);
    int (*download)(struct kern_backend *be, void *dst_host, const void *src, size_t size_bytes,
                    char *err);
    /* Copy within backend memory; regions must not overlap. */
    int (*copy)(struct kern_backend *be, void *dst, const void *src, size_t size_bytes, char *err);
    /* Makes host weight bytes (e.g. an mmapped safetensors region) usable by
     * the ops. cpu returns host_ptr itself for small tensors and copies large
     * ones into huge-page host memory (see cpu_backend.c); cuda copies to device.
     * unmap_weights releases what map_weights made (no-op on cpu). */
    int (*map_weights)(struct kern_backend *be, const void *host_ptr, size_t size_bytes,
                       const void **out, char *err);
    void (*unmap_weights)(struct kern_backend *be, const void *ptr);
    int (*sync)(struct kern_backend *be, char *err);

    /* out[i] = table[ids[i]] converted to f32.
     * out: [n, dim] f32; table: [vocab, dim] dtype; ids: host [n], each < vocab
     * (checked by the caller). */
    int (*embed)(struct kern_backend *be, float *out, const void *table, enum kern_dtype dtype,
                 const int32_t *ids, int n, int dim, char *err);

    /* out[i] = in[i] / sqrt(mean(in[i]^2) + eps) * weight.
     * out, in: [n, dim] f32 (may alias); weight: [dim] dtype. */
    int (*rmsnorm)(struct kern_backend *be, float *out, const float *in, const void *weight,
                   enum kern_dtype dtype, int n, int dim, float eps, char *err);

    /* out[i][o] = sum_k in[i][k] * w[o][k], f32 accumulation.
     * out: [n, d_out] f32; in: [n, d_in] f32; w: [d_out, d_in] dtype.
     * out must not alias in. */
    int (*matmul)(struct kern_backend *be, float *out, const float *in, const void *w,
                  enum kern_dtype dtype, int n, int d_in, int d_out, char *err);

    /* Rotary embedding in place, HuggingFace "rotate_half" convention: for
     * each head, pairs (j, j + head_dim/2), angle = positions[i] * inv_freq[j].
     * x: [n, n_heads, head_dim] f32; positions: host [n];
     * inv_freq: host [head_dim/2] (already Llama-3 scaled by the caller). */
    int (*rope)(struct kern_backend *be, float *x, const int32_t *positions, int n, int n_heads,
                int head_dim, const float *inv_freq, char *err);

    /* Writes the keys and values of n rows into the paged cache: row i goes
     * to its sequence's position kv->rows[i] (a tree node: its slot,
     * kern_kv_row_slot; see struct kern_kv_layout), in every one of the
     * kv_dim columns.
     * k_pool, v_pool: [n_blocks * block_size, kv_dim] f32 (one layer's pool);
     * k, v: [n, kv_dim] f32. */
    int (*kv_store)(struct kern_backend *be, float *k_pool, float *v_pool, const float *k,
                    const float *v, int n, const struct kern_kv_layout *kv, int kv_dim,
                    char *err);

    /* Causal grouped-query attention of n query rows over a paged cache
     * that already holds keys/values for every position each row attends
     * to: row i, of sequence s = kv->rows[2i] at position p = kv->rows[2i+1],
     * attends positions 0..p of s. Query head h reads kv head
     * h / (n_heads / n_kv_heads). Positions are visited in increasing order
     * whatever blocks hold them, so a row's output depends on its position,
     * its q and its sequence's cached values only: not on n, the other rows,
     * or which blocks were allocated. A tree node (kv->path_offset) attends
     * its logical positions 0..p, those of its path read at their slots, and
     * gets the bits the chain of its path would (cuda: outside a step
     * only; step_begin refuses paths with ERR_UNSUPPORTED).
     * out: [n, n_heads, head_dim] f32 (may alias q); q: [n, n_heads, head_dim];
     * k_pool, v_pool: [n_blocks * block_size, n_kv_heads, head_dim] f32;
     * scale: usually 1/sqrt(head_dim). */
    int (*attention)(struct kern_backend *be, float *out, const float *q, const float *k_pool,
                     const float *v_pool, int n, const struct kern_kv_layout *kv, int n_heads,
                     int n_kv_heads, int head_dim, float scale, char *err);

    /* out = silu(gate) * up, elementwise over count values (may alias gate). */
    int (*swiglu)(struct kern_backend *be, float *out, const float *gate, const float *up,
                  size_t count, char *err);

    /* x += y, elementwise over count values. */
    int (*add)(struct kern_backend *be, float *x, const float *y, size_t count, char *err);

    /* Optional (NULL: map_weights serves). map_weights for a [rows][cols]
     * weight matrix of this dtype that only matmul (as w, with d_out = rows,
     * d_in = cols) and embed (as the table, dim = cols) will read, always
     * from the returned pointer: the backend may keep it in a layout of its
     * own (cpu: kernels/cpu/packed.h), so its bytes are not the caller's.
     * Released with unmap_weights. */
    int (*map_matrix)(struct kern_backend *be, const void *host_ptr, enum kern_dtype dtype,
                      int64_t rows, int64_t cols, const void **out, char *err);

    /* Optional (NULL: the caller runs matmul and scans the logits).
     * idx_out[i] = the index of the largest of the d_out values matmul(in, w)
     * writes for row i, bit for bit those values: the lowest such index,
     * NaN values skipped, -1 when all are NaN (argmax_f32's rule, base/argmax.h). A
     * greedy draft, and greedy verification, need nothing else of the LM
     * head. Where prepare_argmax
     * readied w, the backend may find the few rows that can hold the largest
     * value from a cheaper copy and compute only those exactly (cpu:
     * kernels/cpu/argmax.c); the answer is the same either way, but for a
     * head prepared as a draft's (prepare_argmax).
     * allow: NULL, or host [n] pointers, each NULL (every index allowed) or
     * a bitset of (d_out + 63) / 64 words, bit v of word v / 64 set where
     * index v is allowed (a grammar's mask): row i's answer is then the
     * argmax among its allowed indices alone, as if the others were absent
     * (-1 when none is allowed or every allowed value is NaN).
     * idx_out: host [n]; in: [n, d_in] f32; w: [d_out, d_in] dtype. */
    int (*matmul_argmax)(struct kern_backend *be, int32_t *idx_out, const float *in,
                         const void *w, enum kern_dtype dtype, int n, int d_in, int d_out,
                         const uint64_t *const *allow, char *err);
    /* Optional (NULL: nothing to prepare). Readies matmul_argmax for w, a
     * [rows][cols] matrix of this dtype from map_matrix or map_weights (cpu:
     * a one-byte copy of it and four floats a row). Refuses a matrix holding a
     * NaN or an infinity. Released with unmap_weights(w) or destroy.
     * draft != 0: the head of a draft, whose argmax is only a proposal the
     * target verifies. The backend may then answer from a cheaper copy with
     * margins that hold with overwhelming probability rather than always
     * (cpu with AVX-512: half a byte a weight, margins of four standard
     * deviations; kernels/cpu/argmax.c): the index is the exact one but for
     * a vanishing chance of a competing row. Never for a target's head. */
    int (*prepare_argmax)(struct kern_backend *be, const void *w, enum kern_dtype dtype,
                          int64_t rows, int64_t cols, int draft, char *err);

    /* Optional (NULL: one matmul per weight). matmul of count (1..4)
     * weights that share one input, all of dtype with d_in columns:
     * outs[j] = in x ws[j]^T, ws[j] of d_outs[j] rows (the q, k and v
     * projections; gate and up). Each output holds exactly the bits matmul
     * would give it; a backend may run the products as one pass (cuda: one
     * launch, the small k and v products no longer a grid of their own). */
    int (*matmul_multi)(struct kern_backend *be, int count, float *const *outs, const float *in,
                        const void *const *ws, enum kern_dtype dtype, int n, int d_in,
                        const int *d_outs, char *err);

    /* Optional (NULL: rope of q, rope of k, then kv_store). rope(q),
     * rope(k) and kv_store(k, v) of a layer in one pass, the same bits: q
     * and k are left rotated in place as rope leaves them, and the pools
     * hold what kv_store writes. Shapes as those ops'; k, v: [n, kv_dim],
     * kv_dim = n_kv_heads * head_dim. */
    int (*rope_kv_store)(struct kern_backend *be, float *q, float *k, const float *v,
                         const int32_t *positions, int n, int n_heads, int n_kv_heads,
                         int head_dim, const float *inv_freq, float *k_pool, float *v_pool,
                         const struct kern_kv_layout *kv, char *err);

    /* Optional (NULL: matmul_multi or matmul of both, then swiglu).
     * gate = silu(in x w_gate^T) * (in x w_up^T): the MLP's two products
     * and its SwiGLU, exactly the bits of matmul, matmul and swiglu; up
     * ([n, d_out]) is scratch the backend may write. gate, up: [n, d_out];
     * in: [n, d_in]; both weights [d_out, d_in] of dtype. */
    int (*matmul_swiglu)(struct kern_backend *be, float *gate, float *up, const float *in,
                         const void *w_gate, const void *w_up, enum kern_dtype dtype, int n,
                         int d_in, int d_out, char *err);

    /* Optional (NULL: add, then rmsnorm). x += y, then out = rmsnorm(x)
     * (out, x, y: [n, dim] f32; out must not alias x or y): the residual
     * add and the next norm of a layer, with exactly the bits of the two
     * ops, in one pass. */
    int (*add_rmsnorm)(struct kern_backend *be, float *out, float *x, const float *y,
                       const void *weight, enum kern_dtype dtype, int n, int dim, float eps,
                       char *err);

    /* Optional, all four or none (NULL: every op reads its host arrays
     * itself, as documented above). step_reserve sizes, once, everything a
     * step up to lim needs (its inputs, attention's scratch), so that no op
     * of a step allocates. step_begin copies the step's arrays to the
     * backend and checks its layout once; until step_end, an op handed
     * exactly the step's arrays (the same pointers, the same n) reads the
     * copy, and the host arrays must not change. Results are the same bits
     * as without a step. ERR_RANGE when the step exceeds the reservation. */
    int (*step_reserve)(struct kern_backend *be, const struct kern_step_limits *lim, char *err);
    int (*step_begin)(struct kern_backend *be, const struct kern_step *step, char *err);
    void (*step_end)(struct kern_backend *be);

    /* Optional, all four or none (NULL: no graphs). Between
     * graph_capture_begin and graph_capture_end the ops are recorded, not
     * run; graph_launch then runs the recording, with the very arguments
     * and buffers it was recorded with: only what those buffers hold may
     * differ (the step's inputs, copied by a step_begin before the launch).
     * Only the ops of a step may be recorded (embed .. add with the step's
     * arrays; no upload, download, sync or allocation). A replay computes
     * the same bits as running the ops. graph_capture_end always ends the
     * recording; on an error (an op failed while recording, or the
     * recording was broken) *out is NULL. */
    int (*graph_capture_begin)(struct kern_backend *be, char *err);
    int (*graph_capture_end)(struct kern_backend *be, struct kern_graph **out, char *err);
    int (*graph_launch)(struct kern_backend *be, struct kern_graph *g, char *err);
    void (*graph_destroy)(struct kern_backend *be, struct kern_graph *g); /* NULL-safe */
};

/* Every backend starts with this header; the private state follows it. */
struct kern_backend {
    const struct kern_ops *ops;
    const char *name; /* "cpu" or "cuda" */
};

/* CPU backend with n_threads worker threads (0 = one per online core).
 * Thread count never changes results (see the exactness contract). */
int kern_cpu_create(struct kern_backend **out, int n_threads, char *err);

/* Number of threads a CPU backend runs with. */
int kern_cpu_threads(const struct kern_backend *be);

/* The weight copies a CPU backend holds (what map_weights and map_matrix
 * copied: the bytes a decode step reads), at most max of them into ptrs and
 * bytes, in no particular order. Returns how many it holds (0 for a backend
 * that is not the CPU one). For tools that time a read of the very memory
 * the model's weights sit in. */
int kern_cpu_weight_copies(const struct kern_backend *be, const void **ptrs, size_t *bytes, int max);

/* Rows the CPU backend's last matmul_argmax computed exactly for its last
 * input row, or -1 where it computed the whole row of logits (no shadow, or
 * the screen did not serve that row) or be is not the CPU backend. For tests
 * and tools that check the screen is what answered. */
int kern_cpu_argmax_candidates(const struct kern_backend *be);

/* Bits a weight of the copy the CPU backend's prepare_argmax made of w: 8,
 * 4 (a draft's head where the build has AVX-512), or 0 where it holds none
 * (or be is not the CPU backend). */
int kern_cpu_argmax_copy_bits(const struct kern_backend *be, const void *w);

/* The integer dot product a CPU backend's int8/int4 matmul runs on: 0
 * scalar, 1 AVX2, 2 AVX-VNNI, 3 AVX-512 VNNI (kernels/cpu/qdot.h). Every one
 * gives the same bits; a backend starts on the fastest this CPU has.
 * kern_cpu_int_dot: the current one (-1: not the CPU backend);
 * kern_cpu_set_int_dot: 0, or ERR_UNSUPPORTED where this CPU or build lacks
 * it (for tests and benchmarks). */
int kern_cpu_int_dot(const struct kern_backend *be);
int kern_cpu_set_int_dot(struct kern_backend *be, int isa, char *err);
const char *kern_cpu_int_dot_name(int isa);

/* Whether a CPU backend's bf16 matmul runs on vdpbf16ps (AVX512_BF16), the
 * activations rounded to bf16 (kernels/cpu/bfdot.h), or, 0, on the f32
 * paths (weights widened, f32 activations). A backend starts on vdpbf16ps
 * wherever the CPU has it: every bf16 product (one decode row, 2-17
 * verification rows, prefill) then takes it, so a row's bits do not depend
 * on the batch. The two give different bits, so a bf16 model's outputs
 * differ between CPUs with and without AVX512_BF16 (each is the same on
 * every CPU of its kind). Set it before mapping bf16 matrices: map_matrix
 * lays a matrix out for the path that is on then, and the matrix is always
 * multiplied on that path (a row-major one, used in place, on the path on
 * at the call).
 * TANDEM_CPU_BF16_DOT=0 in the environment makes kern_cpu_create start on
 * the f32 paths, =1 on vdpbf16ps (refused where the CPU lacks it); unset:
 * vdpbf16ps where the CPU has it.
 * kern_cpu_bf16_dot: 1, 0, or -1 (not the CPU backend);
 * kern_cpu_set_bf16_dot: 0, or ERR_UNSUPPORTED turning it on where this CPU
 * or build lacks it (for tests and benchmarks). */
int kern_cpu_bf16_dot(const struct kern_backend *be);
int kern_cpu_set_bf16_dot(struct kern_backend *be, int on, char *err);

/* The backend a user named: "cpu" (n_threads as kern_cpu_create; device
 * ignored) or "cuda" (device as kern_cuda_create: an ordinal or a GPU UUID,
 * "" = "0"; n_threads ignored). Refuses, with one line naming the reason in
 * err, a name it does not know (ERR_INVALID_ARG), "cuda" in a build without
 * the CUDA backend (ERR_UNSUPPORTED), and "cuda" where no usable GPU is
 * visible (ERR_UNAVAILABLE: no driver, no device, or no such device). */
int kern_backend_create(struct kern_backend **out, const char *name, const char *device,
                        int n_threads, char *err);

/* Frees a backend made by any create function; NULL-safe. */
void kern_backend_destroy(struct kern_backend *be);

#endif
