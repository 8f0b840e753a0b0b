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
 * Returns 0, ERR_INVALID_ARG (malformed device string, or a malformed
 * TANDEM_CUDA_MM_TILED_MIN_ROWS: kern_cuda_matmul_tiled_min_rows), ERR_NOT_FOUND (no
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

/* Copies size_bytes of host memory to dst_dev (device memory of this
 * backend) without waiting, where ops->upload waits for the stream: the
 * bytes go through one of the backend's pinned staging slots, so src_host
 * may be reused as soon as this returns, and reach dst_dev in stream order,
 * before any op queued after this call reads them. For small arrays (a
 * round's draft ids): a slot holds what it is given until it is reused
 * (CUDA_STAGE_SLOTS calls later). Refused while a graph is recorded.
 * Returns 0, ERR_INVALID_ARG (not a CUDA backend, a NULL pointer, or
 * recording) or ERR_CUDA. */
int kern_cuda_upload_staged(struct kern_backend *be, void *dst_dev, const void *src_host,
                            size_t size_bytes, char *err);

/* ---- attention paths (tests and benchmarks) -----------------------------
 * Both partial kernels compute every element in the same order: the same
 * bits. AUTO takes the grouped one (a block per kv head, keys and values
 * read once for its query heads) where its blocks fill the GPU. */
enum kern_cuda_attn_path {
    KERN_CUDA_ATTN_AUTO = 0,
    KERN_CUDA_ATTN_PER_HEAD = 1, /* a block per (split, query head, row) */
    KERN_CUDA_ATTN_GROUPED = 2,  /* a block per (split, kv head, row); up to 8 query
                                    heads a kv head, else per head */
};
/* Sets the path ops->attention takes from now on (graphs recorded before
 * are refused at launch and recorded again); ERR_INVALID_ARG when be is not
 * a CUDA backend or path unknown. */
int kern_cuda_set_attention_path(struct kern_backend *be, enum kern_cuda_attn_path path, char *err);

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

/* Rows from which this backend's KERN_CUDA_MM_AUTO (ops->matmul, and
 * matmul_multi and matmul_swiglu, which follow it) takes the tiled kernel
 * instead of the skinny ones: 18 (every verification of K + 1 <= 17 rows
 * skinny), or the environment variable TANDEM_CUDA_MM_TILED_MIN_ROWS
 * (an integer in 1..1000000) as kern_cuda_create read it; create fails
 * with ERR_INVALID_ARG on any other value. A speed choice only: every
 * kernel gives the same bits. Returns the count, or ERR_INVALID_ARG when
 * be is not a CUDA backend. */
int kern_cuda_matmul_tiled_min_rows(const struct kern_backend *be);

/* Queues `calls` matmuls through a path back to back on the backend's
 * stream, call i with weights w[i % n_w] (device buffers of one shape,
 * rotated so that a benchmark does not find its matrix in L2), times them
 * with CUDA events and waits: *ms_per_call is the mean time per call. */
int kern_cuda_matmul_time(struct kern_backend *be, enum kern_cuda_mm_path path, float *out,
                          const float *in, const void *const *w, int n_w, enum kern_dtype dtype,
                          int n, int d_in, int d_out, int calls, double *ms_per_call, char *err);

/* ---- memory read bandwidth (benchmarks) ----------------------------------
 * The floor of a decode step: it reads every weight once and writes almost
 * nothing, so its time is held against bytes / read bandwidth. */
struct kern_cuda_read_bw {
    size_t size_bytes;   /* buffer read per pass */
    int passes;          /* timed passes (one more warms up) */
    double best_ms;      /* fastest pass */
    double read_gbs;     /* size_bytes / best pass, in 1e9 bytes per second */
    size_t free_bytes, total_bytes; /* device memory before the buffer was made */
};

/* Reads a buffer of min(size_bytes, half the free device memory) bytes,
 * passes + 1 times with one kernel per pass on the backend's stream (16-byte
 * loads, nothing written), times each pass with CUDA events and keeps the
 * fastest. Waits; frees the buffer. ERR_INVALID_ARG when be is not a CUDA
 * backend or passes is outside 1..1000, ERR_NOMEM when the device has less
 * than 128 MiB free, ERR_CUDA naming a failed call. */
int kern_cuda_read_bandwidth(struct kern_backend *be, size_t size_bytes, int passes,
                             struct kern_cuda_read_bw *out, char *err);

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
 * Where q is written and read on the device (the workers' device sampling),
 * the owner's sampling kernels write the q rows straight into its slab half
 * (kern_cuda_ipc_slab_half) between begin_write and publish, which then
 * copies only what host code wrote (header, tokens) and records the event
 * after those kernels; the importer makes its stream wait for the event and
 * hands the half's address in its mapping to the accept/reject kernels
 * (kern_cuda_ipc_read_device): no host copy of q, no host wait between the
 * owner's write and the importer's read. Where the accept/reject runs on
 * the host (the host sampler), the importer copies the q rows it needs from
 * the slab into pinned host memory after the event wait
 * (kern_cuda_ipc_stage), and the host waits for that copy
 * (kern_cuda_ipc_staged) before reading it.
 *
 * Calls are made by the thread that drives the backend; every CUDA return
 * code is checked (ERR_CUDA naming the call). The importer closes its
 * mapping (kern_cuda_ipc_close) before it maps a restarted owner's slab: the
 * driver frees a dead owner's slab only once every mapping is closed. */

#define KERN_CUDA_IPC_HANDLE_BYTES 64 /* cudaIpcMemHandle_t, cudaIpcEventHandle_t */
#define KERN_CUDA_IPC_PROBE_BYTES 64  /* at the slab's end: 16 owner words + room */
/* The longest a host wait on the peer's side of the buffer takes (its ready
 * or consumed event, a staging copy behind its event, the stream at close)
 * before it gives up with ERR_TIMEOUT: far beyond any round, short enough
 * that a peer that died mid-record costs seconds, not a hung worker. */
#define KERN_CUDA_IPC_WAIT_MS 5000.0

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
    const unsigned char *events;                   /* ready: [n_events][KERN_CUDA_IPC_HANDLE_BYTES] */
    const unsigned char *consumed;                 /* consumed: the same; NULL from an owner
                                                      that exports none (the importer then
                                                      reads the host face only) */
};

/* Owner: registers the host face, allocates the slab (not when staging),
 * writes the probe words, creates the events. *handles_out points into the
 * object (valid until close). ERR_INVALID_ARG when be is not a CUDA backend. */
int kern_cuda_ipc_export(struct kern_cuda_ipc **out, struct kern_backend *be,
                         const struct kern_cuda_ipc_shape *shape, int staging,
                         const struct kern_cuda_ipc_handles **handles_out, char *err);

/* Owner, before anything rewrites half i: makes the backend's stream wait
 * (on the GPU, no host wait) for the half's consumed event, so kernels and
 * copies writing the slab half start only after the reader's last read of
 * it; then waits on the host, at most KERN_CUDA_IPC_WAIT_MS, for the copy
 * the last publish queued from the host face, and (staging, where the
 * reader copies from the host face itself) for the consumed event, before
 * host code rewrites the host face. ERR_TIMEOUT when one never completes
 * (a peer that died mid-round), ERR_CUDA. */
int kern_cuda_ipc_begin_write(struct kern_cuda_ipc *ipc, int half, char *err);

/* Owner, after writing the first `bytes` of half i of the host face: device
 * mode queues their copy into the slab; both modes then record the half's
 * event on the backend's stream (after every kernel queued before it, so
 * q rows a kernel wrote into the slab are covered). Returns without
 * waiting. Bytes of the slab past `bytes` are left as the kernels wrote
 * them. */
int kern_cuda_ipc_publish(struct kern_cuda_ipc *ipc, int half, size_t bytes, char *err);

/* Owner, device mode: *dev_out = the slab's address of bytes [offset,
 * offset + bytes) of half i, in the owner's device memory, for kernels on
 * the backend's stream to write in place between kern_cuda_ipc_begin_write
 * and kern_cuda_ipc_publish. ERR_UNSUPPORTED when the owner stages (no
 * slab), ERR_RANGE outside the half. Queues nothing. */
int kern_cuda_ipc_slab_half(struct kern_cuda_ipc *ipc, int half, size_t offset, size_t bytes,
                            void **dev_out, char *err);

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

/* Importer, device mode: makes the backend's stream wait for half i's event
 * (on the GPU; the host does not wait) and sets *dev_out to bytes [offset,
 * offset + bytes) of the half in this process's mapping of the slab, for
 * kernels queued after this call on the backend's stream to read in place
 * (across GPUs through the probed peer mapping). ERR_UNSUPPORTED when the
 * importer stages, ERR_RANGE outside the half. */
int kern_cuda_ipc_read_device(struct kern_cuda_ipc *ipc, int half, size_t offset, size_t bytes,
                              const void **dev_out, char *err);

/* Importer: waits on the host, at most KERN_CUDA_IPC_WAIT_MS (ERR_TIMEOUT),
 * until what the last kern_cuda_ipc_stage of half i queued is done. */
int kern_cuda_ipc_staged(struct kern_cuda_ipc *ipc, int half, char *err);

/* Importer, after queueing its last read of half i (kernels or copies that
 * read the slab half, the staging copy, uploads from the host face): records
 * the half's consumed event on the backend's stream, which the owner's next
 * kern_cuda_ipc_begin_write of the half waits for. A no-op where the
 * consumed events could not be opened (the importer then reads the host
 * face only). */
int kern_cuda_ipc_end_read(struct kern_cuda_ipc *ipc, int half, char *err);

/* Both sides: waits for the stream (bounded), closes the mapping and the
 * events, unregisters the host face, frees the slab (owner) and the mirror.
 * peer_may_map (owner): the reader may still map the slab and hold the
 * events, so both are left to this process's exit (which frees them once
 * the reader lets go) instead of being freed under it. A stream that does
 * not drain within KERN_CUDA_IPC_WAIT_MS (a wait on a dead peer's event)
 * leaves everything it may still touch to the exit too. Logs failures.
 * NULL-safe. kern_cuda_ipc_close(ipc) is kern_cuda_ipc_close_ex(ipc, 0). */
void kern_cuda_ipc_close_ex(struct kern_cuda_ipc *ipc, int peer_may_map);
void kern_cuda_ipc_close(struct kern_cuda_ipc *ipc);

/* Tests only: leaves out the GPU-side waits (the importer's on ready, the
 * owner's on consumed), so a stress test can show it catches their absence.
 * Never set outside tests/gpu. */
void kern_cuda_ipc_debug_skip_waits(struct kern_cuda_ipc *ipc, int skip);

/* ---- test helpers (tests/gpu) ---------------------------------------------
 * kernels/cuda/debug.cu: device work of a known duration and content, for
 * tests that must make a writer or reader slow on purpose. All queue on the
 * backend's stream and return without waiting. */

/* A kernel that runs for about `us` microseconds (one thread). */
int kern_cuda_debug_spin(struct kern_backend *be, unsigned us, char *err);

/* out_dev[i] = kern_cuda_debug_value(tag, i) for i in [0, n): the float of
 * (tag * 2654435761 + i) mod 2^24, exact in f32, so two tags differ at
 * every index. */
int kern_cuda_debug_fill(struct kern_backend *be, float *out_dev, size_t n, uint32_t tag,
                         char *err);

/* *count_dev += the number of i in [0, n) with in_dev[i] !=
 * kern_cuda_debug_value(tag, i) (atomic; count_dev device memory). */
int kern_cuda_debug_count_mismatches(struct kern_backend *be, const float *in_dev, size_t n,
                                     uint32_t tag, unsigned long long *count_dev, char *err);

/* ---- sampling and speculative accept/reject on the device ----------------
 * kernels/cuda/sampling.cu and speculate.cu: the device twins of common/speculation/sampling.c
 * (sampling_adjust, argmax_f32 (base/argmax.h), sampling_draw, sampling_sample) and
 * common/speculation/speculate.c (speculate_verify), with the rules stated in
 * sampling.h and speculate.h, so that per token only ids and a few scalars
 * cross between host and device: logits and probability rows stay in device
 * memory, the host downloads token ids, counts and status words.
 *
 * Calls queue work on the backend's stream and return without waiting (like
 * the ops). Host arrays (parameters, positions, sequence descriptors) are
 * copied to the device before return through the backend's staging slots;
 * everything named *_dev (or documented "device") lives in device memory.
 * Errors that only the data can reveal (a NaN logit, a draft id outside the
 * vocabulary, a row with no mass) are reported per row or per sequence in a
 * device status word (enum kern_cuda_sample_status) that the caller
 * downloads with the tokens; the call itself returns 0, ERR_INVALID_ARG for
 * bad host-side arguments (named), or ERR_CUDA.
 *
 * Exactness: every result is a function of its own row only (never of how
 * many rows or sequences share a launch) and is the same bits on every run.
 * argmax, the Philox uniforms and the accept test equal the CPU's bit for
 * bit. Adjusted rows agree with sampling_adjust within a stated tolerance
 * (sampling.cu's header: expf differs by up to 2 ulp between CUDA and glibc,
 * sums are exact integers here and double sums there), so a top-p, min-p or
 * draw boundary can differ only where the CPU's own value lies within that
 * rounding of its threshold.
 *
 * Restated constants (kernels may not include the spec room's headers):
 * the values below equal their common/speculation twins; tests/gpu/
 * test_cuda_sampling.c checks each against the spec header at compile time,
 * and the Philox round constants (sampling_device.cuh) against philox4x32_10 on the
 * host before it looks for a device. */

/* = SPECULATE_K_MAX: most drafts in one sequence's round. */
#define KERN_CUDA_SPEC_K_MAX 16

/* = enum philox_stream (philox.h). */
enum kern_cuda_philox_stream {
    KERN_CUDA_PHILOX_STREAM_TARGET_SAMPLE = 1,
    KERN_CUDA_PHILOX_STREAM_TARGET_ACCEPT = 2,
    KERN_CUDA_PHILOX_STREAM_DRAFT_SAMPLE = 3,
};

/* = enum speculate_mode and enum speculate_debug_fault (speculate.h). */
enum kern_cuda_spec_mode {
    KERN_CUDA_SPEC_MODE_SAMPLED = 0,
    KERN_CUDA_SPEC_MODE_POINT_MASS = 1,
};
enum kern_cuda_spec_debug_fault {
    KERN_CUDA_SPEC_DEBUG_NONE = 0,
    KERN_CUDA_SPEC_DEBUG_RESIDUAL_FROM_P = 1, /* tests only: correction drawn from p */
};

/* Per-row and per-sequence outcome, written by the device. */
enum kern_cuda_sample_status {
    KERN_CUDA_SAMPLE_OK = 0,
    KERN_CUDA_SAMPLE_BAD_LOGIT = 1,   /* a logit is NaN or +inf */
    KERN_CUDA_SAMPLE_ALL_MASKED = 2,  /* every logit is -inf */
    KERN_CUDA_SAMPLE_NO_MASS = 3,     /* a row to draw from (or take the argmax of) has
                                         no positive (no non-NaN) entry */
    KERN_CUDA_SAMPLE_BAD_DRAFT = 4,   /* a draft id outside 0..vocab-1 */
};

/* One row's sampling parameters: the fields and meaning of struct
 * sampling_params (sampling.h). Host memory. */
struct kern_cuda_sample_params {
    float temperature; /* finite, >= 0; 0 = greedy */
    int32_t top_k;     /* >= 0; 0 or >= vocab = off */
    float top_p;       /* (0, 1]; 1 = off */
    float min_p;       /* [0, 1]; 0 = off */
    uint64_t seed;     /* Philox key (kern_cuda_sample only) */
};

/* One sequence's verification round: the fields of struct speculate_input
 * (speculate.h) that are not arrays, plus where its rows and drafts sit in
 * the call's device arrays. Host memory. */
struct kern_cuda_spec_seq {
    int32_t k;           /* drafts, 0..KERN_CUDA_SPEC_K_MAX */
    int32_t greedy;      /* nonzero: the argmax rule, no randomness, q not read */
    int32_t mode;        /* enum kern_cuda_spec_mode */
    int32_t debug_fault; /* enum kern_cuda_spec_debug_fault; tests only, leave 0 */
    uint64_t seed;       /* the request's Philox key */
    uint64_t position0;  /* absolute position of t_1 */
    int32_t p_row0;      /* rows p_row0 .. p_row0 + k of p_rows: p_1 .. p_(k+1) */
    int32_t q_row0;      /* rows q_row0 .. q_row0 + k - 1 of q_rows (sampled mode) */
    int32_t draft0;      /* ids draft0 .. draft0 + k - 1 of draft_tokens: t_1 .. t_k */
    int32_t reserved;    /* 0 */
};

/* One sequence's outcome, written by the device (the caller downloads
 * n_seqs of them: the only per-round traffic). On KERN_CUDA_SAMPLE_OK,
 * tokens[0 .. n_accepted] hold t_1..t_n and the correction or bonus token,
 * as speculate_verify's tokens_out; later entries are unspecified. */
struct kern_cuda_spec_result {
    int32_t n_accepted; /* 0..k */
    int32_t status;     /* enum kern_cuda_sample_status */
    int32_t tokens[KERN_CUDA_SPEC_K_MAX + 1];
};

/* Short text of a status value ("a logit is NaN or +inf"); never NULL. */
const char *kern_cuda_sample_status_str(int32_t status);

/* 0 when every status[0..n) is KERN_CUDA_SAMPLE_OK, else ERR_INVALID_ARG
 * naming the first bad row: "<what>[3]: every logit is -inf". Host memory. */
int kern_cuda_sample_status_check(const int32_t *status, int n, const char *what, char *err);

/* out_dev[r] = argmax_f32 (base/argmax.h) of row r of x_dev [n_rows, n] (the lowest
 * index among equal maxima, NaN never chosen, -1 for a row of NaN). */
int kern_cuda_argmax(struct kern_backend *be, int32_t *out_dev, const float *x_dev, int n_rows,
                     int n, char *err);

/* probs_dev [n_rows, vocab] = sampling_adjust of each row of logits_dev
 * [n_rows, vocab] with params[r] (host, n_rows entries); status_dev [n_rows]
 * (may be NULL) receives each row's status (BAD_LOGIT, ALL_MASKED: the row
 * is then all zeros). probs_dev must not alias logits_dev. ERR_INVALID_ARG
 * names a parameter outside its range (params[r].top_p ...). */
int kern_cuda_sampling_adjust(struct kern_backend *be, float *probs_dev, int32_t *status_dev,
                              const float *logits_dev, int n_rows, int vocab,
                              const struct kern_cuda_sample_params *params, char *err);

/* sampling_sample per row: kern_cuda_sampling_adjust into probs_dev, then
 * tokens_dev[r] = the argmax (temperature 0) or the inverse-CDF draw of
 * kern_cuda_draw with u = philox_uniform(params[r].seed, stream,
 * positions[r], 0). positions: host, n_rows entries. A row with a bad
 * status gets token -1. */
int kern_cuda_sample(struct kern_backend *be, int32_t *tokens_dev, int32_t *status_dev,
                     float *probs_dev, const float *logits_dev, int n_rows, int vocab,
                     const struct kern_cuda_sample_params *params, const uint64_t *positions,
                     uint32_t stream, char *err);

/* tokens_dev[r] = sampling_draw(row r of probs_dev [n_rows, vocab],
 * philox_uniform(seeds[r], stream, positions[r], 0)): entries <= 0 or NaN
 * count as 0, rows need not be normalised, -1 for a row with no positive
 * entry. seeds, positions: host, n_rows entries. */
int kern_cuda_draw(struct kern_backend *be, int32_t *tokens_dev, const float *probs_dev,
                   int n_rows, int vocab, const uint64_t *seeds, const uint64_t *positions,
                   uint32_t stream, char *err);

/* speculate_verify for n_seqs sequences in one launch. seqs: host, n_seqs
 * descriptors. p_rows_dev, q_rows_dev: device [rows, vocab] adjusted
 * distributions (sampling_adjust's rules; for a greedy sequence its p rows
 * may be logits or one-hot rows: only their argmax is read); q_rows_dev may
 * be NULL when no sequence is sampled-mode with k > 0. draft_tokens_dev:
 * device ids (may be NULL when every k is 0). results_dev: device, n_seqs
 * entries. Rows are addressed by the offsets in seqs; the caller guarantees
 * they lie inside the arrays. Randomness: the Philox streams and positions
 * of speculate.h. ERR_INVALID_ARG names a bad descriptor (seqs[2].k ...). */
int kern_cuda_speculate_verify(struct kern_backend *be, struct kern_cuda_spec_result *results_dev,
                               const struct kern_cuda_spec_seq *seqs, int n_seqs,
                               const float *p_rows_dev, const float *q_rows_dev,
                               const int32_t *draft_tokens_dev, int vocab, char *err);

/* ---- Philox on the device (tests) ---------------------------------------
 * One input of kern_cuda_philox_uniforms: philox_uniform(seed, stream,
 * position, index) in device code. */
struct kern_cuda_philox_arg {
    uint64_t seed;
    uint64_t position;
    uint32_t stream;
    uint32_t index;
};

/* out_dev[i] = the device's philox_uniform of in_dev[i] (both device, n). */
int kern_cuda_philox_uniforms(struct kern_backend *be, float *out_dev,
                              const struct kern_cuda_philox_arg *in_dev, int n, char *err);

/* out_dev[4i..4i+3] = philox4x32_10(counter = in_dev[6i..6i+3], key =
 * in_dev[6i+4..6i+5]) on the device (both device, n blocks). */
int kern_cuda_philox_blocks(struct kern_backend *be, uint32_t *out_dev, const uint32_t *in_dev,
                            int n, char *err);

/* The same Philox code the kernels run, compiled for the host (no device
 * needed): lets a build without a GPU check sampling_device.cuh's restated round
 * constants against common/speculation/philox.c. */
void kern_cuda_philox4x32_10_host(const uint32_t counter[4], const uint32_t key[2],
                                  uint32_t out[4]);
float kern_cuda_philox_uniform_host(uint64_t seed, uint32_t stream, uint64_t position,
                                    uint32_t index);

#ifdef __cplusplus
}
#endif

#endif
