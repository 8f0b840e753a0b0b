/* xfer.h: the draft's halves between two processes, through one seam: the
 * host face (common/wire/shm_buffer.h: POSIX shared memory, the seqlock per
 * half, the descriptor) plus the device side of its transport:
 *   "posix"     the host face alone;
 *   "cuda_ipc"  a cudaMalloc slab laid out like the host face, exported by
 *               its IPC handle, with two interprocess events per half
 *               (kernels_cuda.h, kern_cuda_ipc_*): ready (the writer's
 *               writes of the half are done) and consumed (the reader's
 *               reads of it are done); or pinned staging through the host
 *               face where the slab cannot be used.
 * The writer is the draft worker (it creates and exports the buffer), the
 * reader the target worker (it imports the descriptor the coordinator
 * forwards). The worker processes hold no CUDA code: everything that
 * depends on the transport is behind these calls.
 *
 * Ordering, per half (the file header of shm_buffer.h has the seqlock):
 *   writer: xfer_begin_write   device: its stream waits (on the GPU) for the
 *                              half's consumed event, and the host waits,
 *                              bounded, before host code rewrites the face;
 *           write tokens (host face) and q rows (host face, or the slab's
 *           device address from xfer_q_dest, written by kernels);
 *           xfer_publish       device: the host face's bytes go up into the
 *                              slab and the ready event is recorded after
 *                              them and after every kernel queued before;
 *                              then the seqlock publishes the header;
 *           send the message naming the half.
 *   reader: xfer_half_read     the header (seqlock);
 *           xfer_q_rows        q rows as a device address in the mapped
 *                              slab (the stream waits for ready on the GPU),
 *                              a host address being staged (a copy queued
 *                              behind ready: xfer_wait_staged before reading
 *                              it), or the host face as it is;
 *           read; then xfer_end_read (the consumed event, after the reads
 *           queued so far), and xfer_half_unchanged.
 * Every host wait on the peer is bounded (KERN_CUDA_IPC_WAIT_MS): a peer
 * that died mid-round costs ERR_TIMEOUT, never a hung worker.
 *
 * Teardown: the writer's xfer_close removes the segment's name (the reader
 * sees xfer_owner_gone and closes its import), waits up to its bound for
 * every reader to let go, and only then frees the slab; past the bound it
 * leaves the slab to the process's exit, never frees memory a reader maps.
 *
 * Thread: one thread per object (the worker's loop thread).
 */
#ifndef TANDEM_XFER_H
#define TANDEM_XFER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "kernels.h"
#include "shm_buffer.h"

struct xfer;

/* What the writer needs to choose its transport and where q rows go. */
struct xfer_params {
    const char *transport;   /* "auto" (cuda_ipc on a cuda backend, else posix) | "posix" |
                                "cuda_ipc" */
    bool staging;            /* cuda_ipc: no slab, the pinned host face carries the data */
    const char *instance;    /* the segment's name: "/tandem-<instance>-<pid>-<tag>" */
    const char *tag;
    int n_slots, k_max, vocab;
    /* Whether q rows may live in the slab alone (written there by the
     * writer's sampling kernels): only when the writer samples on the
     * device and the reader surely maps the slab on this GPU: a cuda reader
     * without staging whose device setting names the writer's GPU (the
     * same ordinal, default included, or its UUID). Otherwise q rows go to
     * the host face, which every reader can read. */
    bool writer_samples_on_device;
    const char *writer_device;   /* the writer's device setting ("" = "0") */
    const char *reader_backend;  /* "cuda" | "cpu" */
    const char *reader_device;
    bool reader_staging;
};

/* Writer: creates the buffer (zero-filled) on be (the writer's model
 * backend; for cuda_ipc a cuda backend) and, for cuda_ipc, its device side.
 * Logs the transport and where q rows go ("draft buffer over CUDA IPC on
 * <uuid>: ...; q rows ..."). ERR_INVALID_ARG (cuda_ipc on a CPU backend),
 * ERR_UNSUPPORTED (cuda_ipc in a build without CUDA), or the failing
 * call's code, named in err. */
int xfer_create(struct xfer **out, struct kern_backend *be, const struct xfer_params *p,
                char *err);

/* Reader: maps the buffer a descriptor names. be: the reader's model
 * backend. A cuda_ipc buffer on a cuda backend opens its device side
 * (falling back to staging, logged with the reason, where the slab or the
 * events cannot be opened; force_staging: staging always); on a CPU
 * backend it reads the host face. Errors: those of shm_buffer_import, and
 * the device side's. */
int xfer_import(struct xfer **out, struct kern_backend *be, const cJSON *descriptor,
                bool force_staging, char *err);

/* Writer: the descriptor for the register message (the caller owns it);
 * NULL when out of memory. */
cJSON *xfer_export(const struct xfer *x);

/* Writer: see the file's header. timeout_ms bounds the wait for readers.
 * Reader: closes the device side, then the mapping. NULL-safe. */
void xfer_close(struct xfer *x, double timeout_ms);

const struct shm_layout *xfer_layout(const struct xfer *x);
const char *xfer_name(const struct xfer *x);
const char *xfer_transport(const struct xfer *x);

/* ---- writer ---- */

/* Before anything writes slot/half: see the file's header. Then the half
 * is marked as being rewritten (seqlock). */
int xfer_begin_write(struct xfer *x, int slot, int half, char *err);

/* Where a job writes the q rows of slot/half (row 0 of the half): *dev a
 * device address in the slab when q rows live there alone, else *host in
 * the host face (the other NULL). */
void xfer_q_dest(struct xfer *x, int slot, int half, float **host, float **dev);

/* Publishes slot/half: for cuda_ipc first the host face's header, tokens
 * and (q_on_host) the first q_rows rows go up into the slab and the ready
 * event is recorded (queued, not waited for), then the seqlock publishes
 * info. Call before sending the message naming the half. */
int xfer_publish(struct xfer *x, int slot, int half, const struct shm_half_info *info,
                 int q_rows, bool q_on_host, char *err);

/* For a reader that shares no memory with this writer (the coordinator
 * decides at registration: docs/scale-out.md): the bytes of slot/half as
 * published, with q_rows q rows (shm_half_wire.h); *out malloc'd.
 * ERR_UNAVAILABLE when q rows were asked for but live only in the slab. */
int xfer_half_pack(struct xfer *x, int slot, int half, int q_rows, void **out, size_t *out_len, char *err);

/* ---- reader ---- */

/* A "frames" import: stores the bytes of a half that arrived in a message
 * (xfer_half_pack's), then it reads as a mapped half does. */
int xfer_half_store(struct xfer *x, int slot, int half, const void *bytes, size_t len, char *err);

/* The seqlock of the host face (shm_buffer_half_read, _seq, _wait,
 * _unchanged) and the drafts in place. */
int xfer_half_read(struct xfer *x, int slot, int half, struct shm_half_info *info,
                   uint64_t *seq_out);
uint64_t xfer_half_seq(struct xfer *x, int slot, int half);
int xfer_half_wait(struct xfer *x, int slot, int half, uint64_t seen, double timeout_ms);
bool xfer_half_unchanged(struct xfer *x, int slot, int half, uint64_t seq);
const int32_t *xfer_half_tokens(struct xfer *x, int slot, int half);

/* Where a reader takes k q rows of slot/half from row `first`. */
struct xfer_q {
    const float *host; /* host memory (read after xfer_wait_staged when staged) */
    const float *dev;  /* device memory in this process's mapping of the slab */
    bool staged;       /* host: a copy was queued; xfer_wait_staged first */
};

/* device_reader: the reader accepts a device address (it decides on the
 * GPU). ERR_UNAVAILABLE naming the settings that fix it when the writer
 * put the q rows only into a slab this reader cannot read; a failed CUDA
 * call's code. */
int xfer_q_rows(struct xfer *x, int slot, int half, uint32_t first, int k, bool device_reader,
                struct xfer_q *out, char *err);

/* The staged copy of slot/half's q rows has landed (bounded wait). */
int xfer_wait_staged(struct xfer *x, int slot, int half, char *err);

/* After the reader queued its last read of slot/half (see the header). */
int xfer_end_read(struct xfer *x, int slot, int half, char *err);

/* The writer is closing, closed or gone (shm_buffer_owner_gone): the reader
 * should close its import. */
bool xfer_owner_gone(const struct xfer *x);

/* How sampled verifications take q rows from this buffer, for the log
 * (tests and operators look for these words). */
const char *xfer_q_path(const struct xfer *x, bool device_reader);

/* ---- tests ---- */

/* Leaves out the GPU-side waits of the cuda_ipc entry (kern_cuda_ipc_debug_
 * skip_waits) so a stress test shows it would catch their absence; a no-op
 * for posix. Never set outside tests. */
void xfer_debug_skip_waits(struct xfer *x, bool skip);

#endif
