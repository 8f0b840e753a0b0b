/* cuda_backend.h: the CUDA backend's private state, error macros, staging
 * and scratch helpers, device-side helpers and op functions (private to
 * kernels/cuda; included only by its .cu files; the public entry points are
 * in kernels_cuda.h).
 *
 * Each op family lives in its own .cu file in three layers: the kernel(s),
 * a launcher that sizes the grid, and the public entry (cuda_matmul, ...)
 * with exactly the signature of its slot in struct kern_ops; cuda_backend.cu
 * fills the table. Every entry validates its arguments like its CPU twin,
 * makes the backend's device current, queues its work on the backend's
 * stream and returns without waiting (only upload, download, free, sync and
 * the growth of scratch space wait for the stream).
 *
 * Exactness: every reduction below is written out in a fixed order with
 * explicit round-to-nearest intrinsics (__fmaf_rn, __fadd_rn, ...), so
 * neither the compiler's contraction of a*b+c nor the number of rows in a
 * call can change a bit. Fixed orders are stated in each file's header.
 */
#ifndef TANDEM_KERNELS_CUDA_BACKEND_H
#define TANDEM_KERNELS_CUDA_BACKEND_H

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "error.h"
#include "kernels.h"
#include "logging.h"
}
#include "kernels_cuda.h"

/* Pinned host staging slots for small host arrays (ids, positions,
 * inv_freq), used round robin. A slot is refilled only after the copy
 * queued from it CUDA_STAGE_SLOTS calls ago has finished (its event), so
 * the host never overwrites bytes a pending copy still reads. */
#define CUDA_STAGE_SLOTS 8

/* cuBLAS workspace handed to the handle (cublasSetWorkspace): no hidden
 * allocations during a GEMM, and the same workspace every call. */
#define CUDA_CUBLAS_WORKSPACE_BYTES ((size_t)32 << 20)

struct cuda_stage {
    void *host;         /* pinned, cap_bytes */
    void *dev;          /* device, cap_bytes */
    size_t cap_bytes;
    cudaEvent_t done;   /* recorded after the last copy from host */
};

/* A step's inputs on the device (step.cu): pinned host buffers and one
 * device buffer, each at a fixed address between reservations (graphs
 * recorded over a step read the device one), filled by one copy per step. */
struct cuda_step {
    /* Two pinned buffers in turn: a step waits only for the copy out of the
     * one two steps back, so the host can queue a step while the GPU has
     * not yet reached the previous one's copy. One device buffer: its
     * copies are ordered on the stream behind the kernels reading it. */
    void *host[2];            /* pinned, cap_bytes each */
    cudaEvent_t copied[2];    /* recorded after the copy out of host[i] */
    int next;                 /* the host buffer the next step fills */
    void *dev;                /* device, cap_bytes */
    size_t cap_bytes;
    struct kern_step_limits lim; /* the largest of every reservation so far */
    int reserved;             /* step_reserve ran */
    int active;               /* between step_begin and step_end */
    /* The active step's host arrays (what the ops compare with) and their
     * device copies. */
    struct kern_step in;
    struct kern_kv_layout kv; /* the layout's fields (in.kv points here) */
    const int32_t *ids_dev, *positions_dev, *rows_dev, *tables_dev;
    const float *freq_dev;
};

struct cuda_backend {
    struct kern_backend base; /* must stay first */
    int device;               /* ordinal in this process */
    char uuid[KERN_CUDA_UUID_MAX];
    cudaStream_t stream;      /* non-blocking: every op and copy goes here */
    cublasHandle_t cublas;    /* bound to stream and cublas_ws */
    void *cublas_ws;
    struct cuda_stage stage[CUDA_STAGE_SLOTS];
    int stage_next;           /* next slot to fill */
    /* Device limits read at create (matmul.cu picks its tiles by them). */
    int sm_count;             /* multiprocessors */
    size_t smem_optin_bytes;  /* dynamic shared memory a block may opt in to */
    /* Rows from which matmul takes the tiled kernel (speed only, the same
     * bits): MM_TILED_MIN_ROWS, or TANDEM_CUDA_MM_TILED_MIN_ROWS read once
     * at create (matmul_skinny.cuh). */
    int mm_tiled_min_rows;
    /* Scratch, grown on demand (never shrunk), freed by destroy. */
    void *mm_act;             /* matmul: [n, d_in] bf16 activations for the cuBLAS
                                 path (benchmarks only, see matmul.cu) */
    size_t mm_act_bytes;
    void *mmq_act;            /* matmul_quant.cu: int8 codes and block scales of the
                               * activations of int8/int4 products */
    size_t mmq_act_bytes;
    void *attn_part;          /* attention: per-split partial results */
    size_t attn_part_bytes;
    cudaEvent_t synced;       /* recorded by cuda_backend_wait_stream */
    int attn_path;            /* enum kern_cuda_attn_path (tests and benchmarks) */
    struct cuda_step step;
    int capturing;            /* between graph_capture_begin and _end */
    /* Bumped whenever memory a recorded graph may read moves (the step
     * buffers or a scratch buffer regrown): older graphs are refused. */
    unsigned long memory_generation;
};

static inline struct cuda_backend *cuda_backend_of(struct kern_backend *be)
{
    return (struct cuda_backend *)be;
}

/* The longest the host waits for the backend's stream (a download, sync,
 * free). A stream that waits on another process's event (the draft's
 * buffer, kernels_cuda.h) never finishes when that process died mid-record:
 * then the worker gets ERR_TIMEOUT and stops, never hangs. Far above any
 * one call's work (a 512-row prefill chunk of the 3B shape is milliseconds). */
#define CUDA_SYNC_TIMEOUT_MS 60000.0

/* Waits on the host until ev has completed or timeout_ms have passed:
 * 0, ERR_TIMEOUT naming `what`, or ERR_CUDA (an error the event reports).
 * Spins (yielding) for the first milliseconds, as cudaStreamSynchronize
 * does, then sleeps in short slices. */
int cuda_backend_wait_event(cudaEvent_t ev, double timeout_ms, const char *what, char *err);

/* Everything queued on the backend's stream so far is done, within
 * CUDA_SYNC_TIMEOUT_MS (cuda_backend_wait_event on a fresh record). */
int cuda_backend_wait_stream(struct cuda_backend *cb, const char *what, char *err);

/* Error reporting. Both return their code (ERR_CUDA) after writing
 * "<func>: <call> failed: <reason> (<name>)" into err. */
int cuda_backend_fail(char *err, cudaError_t e, const char *func, const char *call);
int cuda_backend_fail_cublas(char *err, cublasStatus_t s, const char *func, const char *call);

/* The macros return from the enclosing function, which must have a
 * `char *err` in scope. */
#define CUDA_CHECK(call)                                                          \
    do {                                                                          \
        cudaError_t cuda_check_e_ = (call);                                       \
        if (cuda_check_e_ != cudaSuccess)                                         \
            return cuda_backend_fail(err, cuda_check_e_, __func__, #call);        \
    } while (0)

#define CUBLAS_CHECK(call)                                                        \
    do {                                                                          \
        cublasStatus_t cublas_check_s_ = (call);                                  \
        if (cublas_check_s_ != CUBLAS_STATUS_SUCCESS)                             \
            return cuda_backend_fail_cublas(err, cublas_check_s_, __func__, #call); \
    } while (0)

/* After every <<<>>> launch: reports launch errors (bad configuration,
 * sticky errors from earlier work) naming the kernel. */
#define CUDA_CHECK_LAUNCH(kernel_name)                                            \
    do {                                                                          \
        cudaError_t cuda_launch_e_ = cudaGetLastError();                          \
        if (cuda_launch_e_ != cudaSuccess)                                        \
            return cuda_backend_fail(err, cuda_launch_e_, __func__,               \
                                     "launch of " kernel_name);                   \
    } while (0)

/* Makes the backend's device current on the calling thread (the current
 * device is per thread, and several backends may share a process). */
int cuda_backend_enter(struct cuda_backend *cb, char *err);

/* Copies size_bytes of host memory to the device through the next pinned
 * staging slot and returns the device address (*dev_out, valid for kernels
 * queued on the backend's stream after this call and before
 * CUDA_STAGE_SLOTS further staging calls). The copy is asynchronous; the
 * host bytes may be reused as soon as this returns. */
int cuda_backend_stage(struct cuda_backend *cb, const void *src_host, size_t size_bytes,
                       const void **dev_out, char *err);

/* Same, for two host arrays packed into one copy: a at offset 0, b at
 * offset *b_offset_out (a_bytes rounded up to 16). */
int cuda_backend_stage2(struct cuda_backend *cb, const void *a_host, size_t a_bytes,
                        const void *b_host, size_t b_bytes, const void **dev_out,
                        size_t *b_offset_out, char *err);

/* Makes *buf (capacity *cap_bytes) hold at least size_bytes of device
 * memory. Growing waits for the stream (queued kernels may still use the
 * old buffer), does not preserve contents, bumps memory_generation, and is
 * refused while a graph is recorded. */
int cuda_backend_scratch(struct cuda_backend *cb, void **buf, size_t *cap_bytes,
                         size_t size_bytes, const char *what, char *err);

/* The device copies of a step's arrays (step.cu), for an op handed host
 * arrays: NULL (or 0) where they are not the active step's, and the op
 * stages them itself. cuda_step_layout also gives the step's attention
 * bound (*max_positions). */
const int32_t *cuda_step_ids(const struct cuda_backend *cb, const int32_t *ids, int n);
int cuda_step_rope(const struct cuda_backend *cb, const int32_t *positions, int n,
                   const float *inv_freq, int n_freq, const int32_t **positions_dev,
                   const float **freq_dev);
int cuda_step_layout(const struct cuda_backend *cb, const struct kern_kv_layout *kv, int n,
                     const int32_t **rows_dev, const int32_t **tables_dev, int *max_positions);

/* Grows attention's scratch (attention.cu) to what a call of max_rows rows
 * of n_heads x head_dim over max_positions positions uses. */
int cuda_attention_reserve(struct cuda_backend *cb, int max_rows, int n_heads, int head_dim,
                           int max_positions, char *err);

/* rope's positions and frequencies on the device (rope.cu): the step's
 * copies, else staged (valid as cuda_backend_stage2 says). */
int cuda_rope_inputs(struct cuda_backend *cb, const int32_t *positions, int n,
                     const float *inv_freq, int n_freq, const int32_t **positions_dev,
                     const float **freq_dev, char *err);

/* The step and graph ops of the table (step.cu). */
int cuda_step_reserve(struct kern_backend *be, const struct kern_step_limits *lim, char *err);
int cuda_step_begin(struct kern_backend *be, const struct kern_step *step, char *err);
void cuda_step_end(struct kern_backend *be);
int cuda_graph_capture_begin(struct kern_backend *be, char *err);
int cuda_graph_capture_end(struct kern_backend *be, struct kern_graph **out, char *err);
int cuda_graph_launch(struct kern_backend *be, struct kern_graph *g, char *err);
void cuda_graph_destroy(struct kern_backend *be, struct kern_graph *g);
/* Frees the step buffers (destroy). */
void cuda_step_release(struct cuda_backend *cb);

/* Weight dtype check: 0 or ERR_UNSUPPORTED naming `what`. */
int cuda_backend_check_dtype(enum kern_dtype dtype, const char *what, char *err);

/* Blocks for a 1-D grid-stride loop over count elements. */
static inline unsigned int cuda_grid_1d(size_t count, unsigned int threads)
{
    size_t blocks = (count + threads - 1) / threads;
    const size_t max_blocks = (size_t)1 << 16;
    return (unsigned int)(blocks < 1 ? 1 : blocks > max_blocks ? max_blocks : blocks);
}

/* ---- device helpers ---------------------------------------------------- */

/* bf16 and f16 to f32 are exact; dtype is uniform across a launch. */
static __device__ __forceinline__ float cuda_bf16_bits_to_f32(unsigned int bits16)
{
    return __uint_as_float(bits16 << 16);
}

static __device__ __forceinline__ float cuda_f16_bits_to_f32(unsigned int bits16)
{
    return __half2float(__ushort_as_half((unsigned short)bits16));
}

static __device__ __forceinline__ float cuda_load_weight(const void *w, int dtype, size_t idx)
{
    if (dtype == KERN_DTYPE_BF16)
        return cuda_bf16_bits_to_f32(((const uint16_t *)w)[idx]);
    if (dtype == KERN_DTYPE_F16)
        return cuda_f16_bits_to_f32(((const uint16_t *)w)[idx]);
    return ((const float *)w)[idx];
}

/* One rotary pair (rope.cu's header): angle = pos * inv_freq, one f32
 * product; x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin, every product and
 * sum rounded separately. Shared by rope.cu and the fused rope_kv_store,
 * which takes the angle's sine and cosine once for all heads
 * (cuda_rope_angle, cuda_rope_rotate: the same operations, so the same
 * bits). */
static __device__ __forceinline__ void cuda_rope_angle(float pos, float inv_freq, float *s,
                                                       float *c)
{
    sincosf(__fmul_rn(pos, inv_freq), s, c);
}

static __device__ __forceinline__ void cuda_rope_rotate(float s, float c, float *x1, float *x2)
{
    const float a = *x1, b = *x2;
    *x1 = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    *x2 = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
}

static __device__ __forceinline__ void cuda_rope_pair(float pos, float inv_freq, float *x1,
                                                      float *x2)
{
    float s, c;
    cuda_rope_angle(pos, inv_freq, &s, &c);
    cuda_rope_rotate(s, c, x1, x2);
}

/* kern_q8_scales_offset on the device: the scales of a [rows][cols] int8
 * matrix start at the next multiple of 64 bytes after its values. */
static __device__ __forceinline__ size_t kern_q8_scales_offset_dev(int rows, int cols)
{
    return ((size_t)rows * (size_t)cols + 63) & ~(size_t)63;
}

/* Sum over the 32 lanes of a warp by the fixed xor butterfly 16, 8, 4, 2, 1.
 * Every lane ends with the same bits (a + b == b + a exactly). All 32 lanes
 * must call it. */
static __device__ __forceinline__ float cuda_warp_sum(float v)
{
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

/* Block-wide sum for blocks of THREADS threads (a multiple of 32, at most
 * 1024): warp butterflies, then thread 0 adds the warp sums in warp order.
 * The order depends only on THREADS. All threads must call it; every thread
 * gets the result. Contains __syncthreads (callable repeatedly). */
template <int THREADS>
static __device__ __forceinline__ float cuda_block_sum(float v)
{
    __shared__ float warp_part[THREADS / 32];
    __shared__ float total;
    v = cuda_warp_sum(v);
    if ((threadIdx.x & 31) == 0)
        warp_part[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        float s = warp_part[0];
        for (int w = 1; w < THREADS / 32; w++)
            s = __fadd_rn(s, warp_part[w]);
        total = s;
    }
    __syncthreads();
    return total;
}

/* Block-wide maximum (exact in any order; same shape as cuda_block_sum). */
template <int THREADS>
static __device__ __forceinline__ float cuda_block_max(float v)
{
    __shared__ float warp_part[THREADS / 32];
    __shared__ float total;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    if ((threadIdx.x & 31) == 0)
        warp_part[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        float m = warp_part[0];
        for (int w = 1; w < THREADS / 32; w++)
            m = fmaxf(m, warp_part[w]);
        total = m;
    }
    __syncthreads();
    return total;
}

/* Called once by create, device current: reads the device limits above and
 * lets the tiled matmul kernels use more than 48 KiB of shared memory
 * (cudaFuncSetAttribute), so that no launch makes host calls of its own.
 * Reads TANDEM_CUDA_MM_TILED_MIN_ROWS into mm_tiled_min_rows: a value that
 * is not an integer in 1..1000000 fails create (ERR_INVALID_ARG, naming
 * the variable and the value). */
int cuda_matmul_prepare(struct cuda_backend *cb, char *err);

/* ---- ops (signatures of struct kern_ops) ------------------------------- */

int cuda_embed(struct kern_backend *be, float *out, const void *table, enum kern_dtype dtype,
               const int32_t *ids, int n, int dim, char *err);
int cuda_rmsnorm(struct kern_backend *be, float *out, const float *in, const void *weight,
                 enum kern_dtype dtype, int n, int dim, float eps, char *err);
int cuda_add_rmsnorm(struct kern_backend *be, float *out, float *x, const float *y,
                     const void *weight, enum kern_dtype dtype, int n, int dim, float eps,
                     char *err);
/* int8 and int4 weights (matmul_quant.cu): every path of cuda_matmul
 * takes these, in the skinny order. */
int cuda_matmul_quantized(struct cuda_backend *cb, float *out, const float *in, const void *w,
                          enum kern_dtype dtype, int n, int d_in, int d_out, char *err);
int cuda_matmul(struct kern_backend *be, float *out, const float *in, const void *w,
                enum kern_dtype dtype, int n, int d_in, int d_out, char *err);
/* Whether cuda_matmul runs a call of n rows on the skinny kernels
 * (matmul.cu; speed only: every path gives the same bits). */
bool cuda_matmul_is_skinny(struct cuda_backend *cb, enum kern_dtype dtype, int n, int d_out);
int cuda_matmul_swiglu(struct kern_backend *be, float *gate, float *up, const float *in,
                       const void *w_gate, const void *w_up, enum kern_dtype dtype, int n,
                       int d_in, int d_out, char *err);
int cuda_matmul_multi(struct kern_backend *be, int count, float *const *outs, const float *in,
                      const void *const *ws, enum kern_dtype dtype, int n, int d_in,
                      const int *d_outs, char *err);
int cuda_rope(struct kern_backend *be, float *x, const int32_t *positions, int n, int n_heads,
              int head_dim, const float *inv_freq, char *err);
int cuda_kv_store(struct kern_backend *be, float *k_pool, float *v_pool, const float *k,
                  const float *v, int n, const struct kern_kv_layout *kv, int kv_dim, char *err);
int cuda_attention(struct kern_backend *be, float *out, const float *q, const float *k_pool,
                   const float *v_pool, int n, const struct kern_kv_layout *kv, int n_heads,
                   int n_kv_heads, int head_dim, float scale, char *err);
int cuda_rope_kv_store(struct kern_backend *be, float *q, float *k, const float *v,
                       const int32_t *positions, int n, int n_heads, int n_kv_heads, int head_dim,
                       const float *inv_freq, float *k_pool, float *v_pool,
                       const struct kern_kv_layout *kv, char *err);
int cuda_swiglu(struct kern_backend *be, float *out, const float *gate, const float *up,
                size_t count, char *err);
int cuda_add(struct kern_backend *be, float *x, const float *y, size_t count, char *err);

#endif
