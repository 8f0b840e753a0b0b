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

#include <stddef.h>
#include <stdint.h>

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

/* ---- shared half buffers between processes (CUDA IPC) -------------------
 * The device side of the draft's shared buffer (common/wire/shm_buffer.h,
 * transport "cuda_ipc"). The host side is the POSIX segment that module
 * maps in both processes (the "host face": headers, tokens, q rows, written
 * by host code today); this adds, on the owner's GPU, a cudaMalloc slab laid
 * out like the host face (half i at i * half_bytes) and one interprocess
 * event per half (cudaEventInterprocess | cudaEventDisableTiming).
 *
 * Two modes:
 *   device:  the owner copies a half it wrote into the slab on its stream and
 *            records the half's event; the importer, on its own GPU, opens
 *            the slab once (cudaIpcOpenMemHandle on the base; offsets
 *            travel beside it), makes its stream wait for the event on the
 *            GPU (cudaStreamWaitEvent) and reads the half in place. Between
 *            two GPUs this needs peer access, probed for real at import
 *            (the owner's probe words read through the mapping, then a
 *            write and read-back) before it is used.
 *   staging: no slab: the host face, registered with cudaHostRegister in
 *            both processes, carries the data; the events still order the
 *            owner's GPU work before the importer's. Chosen by the owner
 *            (config) or by the importer when the device mode cannot work
 *            (GPU not visible, no peer access, a failed probe).
 * While the accept/reject runs on the host (device accept/reject is the GPU
 * runtime issue's), the importer copies the q rows it needs from the slab
 * into pinned host memory after the event wait (kern_cuda_ipc_stage), and
 * the host waits for that copy (kern_cuda_ipc_staged) before reading it.
 *
 * Calls are made by the thread that drives the backend; every CUDA return
 * code is checked (ERR_CUDA naming the call). The importer closes its
 * mapping (kern_cuda_ipc_close) before it maps a restarted owner's slab: the
 * driver frees a dead owner's slab only once every mapping is closed. */

#define KERN_CUDA_IPC_HANDLE_BYTES 64 /* cudaIpcMemHandle_t, cudaIpcEventHandle_t */
#define KERN_CUDA_IPC_PROBE_BYTES 64  /* at the slab's end: 16 owner words + room */

struct kern_cuda_ipc;

/* The host face both sides map: n_halves halves of half_bytes each. */
struct kern_cuda_ipc_shape {
    void *host_base;
    size_t half_bytes;
    int n_halves;
    int host_read_only;   /* the importer maps the segment PROT_READ */
};

/* What crosses in the descriptor (the owner fills it, the importer reads it). */
struct kern_cuda_ipc_handles {
    char device_uuid[KERN_CUDA_UUID_MAX];
    int staging;                                   /* 1: no slab */
    unsigned char mem[KERN_CUDA_IPC_HANDLE_BYTES]; /* slab base */
    uint64_t slab_bytes, probe_offset;
    uint32_t probe[4];
    int n_events;                                  /* == n_halves */
    const unsigned char *events;                   /* [n_events][KERN_CUDA_IPC_HANDLE_BYTES] */
};

/* Owner: registers the host face, allocates the slab (not when staging),
 * writes the probe words, creates the events. *handles_out points into the
 * object (valid until close). ERR_INVALID_ARG when be is not a CUDA backend. */
int kern_cuda_ipc_export(struct kern_cuda_ipc **out, struct kern_backend *be,
                         const struct kern_cuda_ipc_shape *shape, int staging,
                         const struct kern_cuda_ipc_handles **handles_out, char *err);

/* Owner, before host code rewrites half i of the host face: waits until the
 * copy queued from it by the last publish is done. */
int kern_cuda_ipc_begin_write(struct kern_cuda_ipc *ipc, int half, char *err);

/* Owner, after writing the first `bytes` of half i of the host face: device
 * mode queues their copy into the slab; both modes then record the half's
 * event on the backend's stream. Returns without waiting. */
int kern_cuda_ipc_publish(struct kern_cuda_ipc *ipc, int half, size_t bytes, char *err);

/* Importer: opens the events and, unless staging is forced or the owner
 * exported no slab, the slab (by the owner's UUID, with a real peer probe
 * across devices); falls back to staging (logged, with the reason) when the
 * device mode cannot work. ERR_CUDA for CUDA failures that leave neither
 * mode usable. */
int kern_cuda_ipc_import(struct kern_cuda_ipc **out, struct kern_backend *be,
                         const struct kern_cuda_ipc_shape *shape,
                         const struct kern_cuda_ipc_handles *handles, int force_staging,
                         char *err);

/* Whether the importer reads through the host face (staging) or the slab. */
int kern_cuda_ipc_is_staging(const struct kern_cuda_ipc *ipc);

/* Importer: makes the backend's stream wait for half i's event (on the GPU),
 * then, in device mode, queues the copy of bytes [offset, offset + bytes) of
 * the half from the slab into the pinned host mirror and returns its
 * address in *host_out; in staging mode *host_out is the host face's. The
 * host must call kern_cuda_ipc_staged before reading *host_out. */
int kern_cuda_ipc_stage(struct kern_cuda_ipc *ipc, int half, size_t offset, size_t bytes,
                        const void **host_out, char *err);

/* Importer: waits on the host until what the last kern_cuda_ipc_stage of
 * half i queued is done. */
int kern_cuda_ipc_staged(struct kern_cuda_ipc *ipc, int half, char *err);

/* Both sides: waits for the stream, closes the mapping and the events,
 * unregisters the host face, frees the slab (owner) and the mirror. Logs
 * failures. NULL-safe. */
void kern_cuda_ipc_close(struct kern_cuda_ipc *ipc);

#ifdef __cplusplus
}
#endif

#endif
