/* kernels_cuda.h: the CUDA backend's public entry points (a C header; no CUDA
 * types appear here, so C code can include it without the CUDA toolkit's
 * headers). The functions exist only when the build has the CUDA backend:
 * users of tandem_kernels then see TANDEM_HAVE_CUDA=1. The op table itself
 * is the one of kernels.h.
 *
 * Exactness: the CUDA ops keep the batch-invariance contract of kernels.h
 * for every n: matmul computes each element in one fixed order that
 * depends on d_in alone, whichever of its kernels runs (see
 * kernels/cuda/matmul.cu), so prefill, verification and decode rows of the
 * same input are bit-identical. cuBLAS is used by no op; it is reachable
 * only through kern_cuda_matmul_path, as a benchmark reference.
 *
 * GPUs are named to other processes by UUID ("GPU-1a2b3c4d-..."), never by
 * ordinal: ordinals differ between processes (CUDA_VISIBLE_DEVICES, device
 * order settings), UUIDs do not.
 */
#ifndef TANDEM_KERNELS_CUDA_H
#define TANDEM_KERNELS_CUDA_H

#include "kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Length of a buffer that holds any UUID string this backend writes
 * ("GPU-" + 36 characters + NUL fits with room to spare). */
#define KERN_CUDA_UUID_MAX 64

/* CUDA backend on one GPU. device: a decimal ordinal as this process sees
 * it ("0", "1") or a GPU UUID as nvidia-smi prints it ("GPU-" followed by
 * 8-4-4-4-12 hex digits, case-insensitive); NULL or "" means "0".
 * The backend owns one non-blocking stream, one cuBLAS handle and its
 * scratch space; every op is queued on that stream in call order. One
 * thread at a time may call a backend; several backends (also on several
 * GPUs) may live in one process.
 * Returns 0, ERR_INVALID_ARG (malformed device string), ERR_NOT_FOUND (no
 * such ordinal or UUID) or ERR_CUDA (no driver or device, or a CUDA/cuBLAS
 * call failed), the reason in err. On failure *out is NULL. */
int kern_cuda_create(struct kern_backend **out, const char *device, char *err);

/* Number of CUDA devices this process can see. A machine without a GPU
 * gives 0 and returns 0 (cudaErrorNoDevice); a missing or too old driver
 * returns ERR_CUDA with the reason in err and *count = 0. */
int kern_cuda_device_count(int *count, char *err);

/* Writes the UUID of the backend's GPU ("GPU-xxxxxxxx-xxxx-xxxx-xxxx-
 * xxxxxxxxxxxx", lower-case hex, NUL-terminated) into uuid_out, which holds
 * KERN_CUDA_UUID_MAX bytes. Returns 0 or ERR_INVALID_ARG when be is not a
 * CUDA backend. */
int kern_cuda_device_uuid(const struct kern_backend *be, char *uuid_out, char *err);

/* ---- matmul paths (tests and benchmarks) --------------------------------
 * The op table's matmul is KERN_CUDA_MM_AUTO. Every path but CUBLAS
 * computes each element in the same fixed order, so their results are bit
 * for bit the same for any n; tests compare them, benchmarks time them. */
enum kern_cuda_mm_path {
    KERN_CUDA_MM_AUTO = 0,        /* what ops->matmul does */
    KERN_CUDA_MM_SKINNY = 1,      /* one warp per column, launches of <= 17 rows */
    KERN_CUDA_MM_TILED = 2,       /* tiled kernel, block shape chosen as AUTO does */
    KERN_CUDA_MM_TILED_32X32 = 3, /* tiled kernel, 32 rows x 32 columns per block */
    KERN_CUDA_MM_TILED_16X32 = 4, /* 16 rows x 32 columns */
    KERN_CUDA_MM_TILED_16X16 = 5, /* 16 rows x 16 columns */
    KERN_CUDA_MM_CUBLAS = 6,      /* cublasGemmEx (bf16 weights: on bf16-rounded
                                     activations; f32 weights: f32, no TF32; f16:
                                     ERR_UNSUPPORTED). Not batch-invariant. */
};

/* ops->matmul (same arguments, checks and stream) through a named path.
 * Returns what matmul returns, ERR_INVALID_ARG when be is not a CUDA
 * backend, ERR_UNSUPPORTED when the path cannot take the call (cuBLAS with
 * f16 weights, a tile whose shared memory the device lacks). */
int kern_cuda_matmul_path(struct kern_backend *be, enum kern_cuda_mm_path path, float *out,
                          const float *in, const void *w, enum kern_dtype dtype, int n, int d_in,
                          int d_out, char *err);

/* Queues `calls` matmuls through a path back to back on the backend's
 * stream, call i with weights w[i % n_w] (device buffers of one shape,
 * rotated so that a benchmark does not find its matrix in L2), times them
 * with CUDA events and waits: *ms_per_call is the mean time per call. */
int kern_cuda_matmul_time(struct kern_backend *be, enum kern_cuda_mm_path path, float *out,
                          const float *in, const void *const *w, int n_w, enum kern_dtype dtype,
                          int n, int d_in, int d_out, int calls, double *ms_per_call, char *err);

#ifdef __cplusplus
}
#endif

#endif
