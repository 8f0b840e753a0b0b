/* cpu_backend.h: the CPU backend's private state and its op functions
 * (private to kernels/cpu; the public entry points are in kernels.h).
 *
 * Each op lives in its own file (matmul.c: cpu_matmul, ...) and has exactly the
 * signature of its slot in struct kern_ops; cpu_backend.c fills the table.
 * Ops are called from one thread at a time (the model's), which is the only
 * thread that grows the scratch space; workers only use it.
 */
#ifndef TANDEM_KERNELS_CPU_BACKEND_H
#define TANDEM_KERNELS_CPU_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "cpu_pool.h"
#include "kernels.h"
#include "packed.h"

struct cpu_backend {
    struct kern_backend base; /* must stay first */
    struct cpu_pool *pool;
    int n_threads;
    /* Per-thread scratch: scratch[t] holds scratch_bytes bytes (64-aligned). */
    float **scratch;
    size_t scratch_bytes;
    /* Weights copied into huge-page memory by map_weights (see
     * cpu_backend.c); unmap_weights and destroy release them. */
    int weight_copy;                 /* copy at all: transparent huge pages exist */
    struct cpu_weight_copy *copies;  /* [n_copies], capacity cap_copies */
    int n_copies, cap_copies;
    struct cpu_argmax *argmax;       /* matmul_argmax's shadows and buffers (argmax_internal.h) */
    int qdot_isa;                    /* int8/int4 matmul's integer dot (enum qd_isa, qdot.h) */
    int bf16_dot;                    /* bf16 matmul on vdpbf16ps (bfdot.h); 0: the f32 paths */
};

/* Whether w is a [rows][d_in] matrix of dtype that map_matrix copied into
 * the int8/int4 panels of qdot.h. */
int cpu_backend_qpanels(const struct cpu_backend *cb, const void *w, enum kern_dtype dtype, int rows,
                        int d_in);

/* Whether w is a matrix map_matrix packed (kernels/cpu/packed.h): returns
 * its layout (enum cpu_layout: CPU_LAYOUT_OCTETS or CPU_LAYOUT_LINES) and
 * its packed rows (a multiple of 8) and row length, or 0
 * (CPU_LAYOUT_ROWS), leaving them as they were. */
int cpu_backend_packed(const struct cpu_backend *cb, const void *w, int *packed_rows, int *d_in);

/* Whether a product of a matrix of dtype in this layout (cpu_backend_packed)
 * runs on vdpbf16ps (bfdot.h): bf16 in line octets always, bf16 row-major
 * where the backend's bf16 dot is on; row octets never. */
static inline int cpu_backend_on_bd(const struct cpu_backend *cb, enum kern_dtype dtype, int layout)
{
    return dtype == KERN_DTYPE_BF16 &&
           (layout == CPU_LAYOUT_LINES || (layout == CPU_LAYOUT_ROWS && cb->bf16_dot));
}

static inline struct cpu_backend *cpu_backend_of(struct kern_backend *be)
{
    return (struct cpu_backend *)be;
}

/* Makes every thread's scratch at least bytes_per_thread bytes (keeps the
 * larger size; contents are not preserved). Call from the op's calling thread
 * before dispatch. Returns 0 or ERR_NOMEM. */
int cpu_backend_scratch_reserve(struct cpu_backend *cb, size_t bytes_per_thread, char *err);

/* Checks a weight dtype: 0 or ERR_UNSUPPORTED naming `what`. */
int cpu_backend_check_dtype(enum kern_dtype dtype, const char *what, char *err);

int cpu_embed(struct kern_backend *be, float *out, const void *table, enum kern_dtype dtype,
              const int32_t *ids, int n, int dim, char *err);
int cpu_rmsnorm(struct kern_backend *be, float *out, const float *in, const void *weight,
                enum kern_dtype dtype, int n, int dim, float eps, char *err);
int cpu_matmul(struct kern_backend *be, float *out, const float *in, const void *w,
               enum kern_dtype dtype, int n, int d_in, int d_out, char *err);
int cpu_rope(struct kern_backend *be, float *x, const int32_t *positions, int n, int n_heads,
             int head_dim, const float *inv_freq, char *err);
int cpu_kv_store(struct kern_backend *be, float *k_pool, float *v_pool, const float *k,
                 const float *v, int n, const struct kern_kv_layout *kv, int kv_dim, char *err);
int cpu_attention(struct kern_backend *be, float *out, const float *q, const float *k_pool,
                  const float *v_pool, int n, const struct kern_kv_layout *kv, int n_heads,
                  int n_kv_heads, int head_dim, float scale, char *err);
int cpu_swiglu(struct kern_backend *be, float *out, const float *gate, const float *up,
               size_t count, char *err);
int cpu_add(struct kern_backend *be, float *x, const float *y, size_t count, char *err);
/* cpu_matmul for KERN_DTYPE_Q8 and Q4 weights (qdot.c), arguments checked. */
int cpu_matmul_int(struct cpu_backend *cb, float *out, const float *in, const void *w,
                   enum kern_dtype dtype, int n, int d_in, int d_out, char *err);
/* cpu_matmul for KERN_DTYPE_BF16 weights on vdpbf16ps (bfdot.c), arguments
 * checked: w row-major, or its first packed_rows rows in line octets
 * (packed.h). */
int cpu_matmul_bf16(struct cpu_backend *cb, float *out, const float *in, const uint16_t *w, int n,
                    int d_in, int d_out, int packed_rows, char *err);
int cpu_matmul_argmax(struct kern_backend *be, int32_t *idx_out, const float *in, const void *w,
                      enum kern_dtype dtype, int n, int d_in, int d_out,
                      const uint64_t *const *allow, char *err);
int cpu_prepare_argmax(struct kern_backend *be, const void *w, enum kern_dtype dtype, int64_t rows,
                       int64_t cols, int draft, char *err);
/* Drops the shadow prepare_argmax made of w, if any (unmap_weights). */
void cpu_argmax_release(struct cpu_backend *cb, const void *w);
/* Frees everything argmax_shadow.c holds (destroy). */
void cpu_argmax_destroy(struct cpu_backend *cb);
/* Rows the last matmul_argmax computed exactly for its last input row; -1
 * when it computed the whole row of logits. */
int cpu_argmax_last_candidates(const struct cpu_backend *cb);
/* Bits a weight of the copy of w (8, 4), 0 where there is none. */
int cpu_argmax_copy_bits(const struct cpu_backend *cb, const void *w);

#endif
