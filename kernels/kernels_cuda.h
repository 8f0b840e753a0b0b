/* kernels_cuda.h: the CUDA backend's public entry points (a C header; no CUDA
 * types appear here, so C code can include it without the CUDA toolkit's
 * headers). The functions exist only when the build has the CUDA backend:
 * users of tandem_kernels then see TANDEM_HAVE_CUDA=1. The op table itself
 * is the one of kernels.h.
 *
 * Exactness: the CUDA ops keep the batch-invariance contract of kernels.h
 * for every n, except matmul with n > 17 rows (prefill), which goes through
 * cuBLAS: such rows are deterministic but not bit-identical to the same row
 * computed with n <= 17 (see kernels/cuda/matmul.cu). Decode (n = 1) and
 * verification (n = K+1 <= 17) rows are bit-identical.
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

#ifdef __cplusplus
}
#endif

#endif
