/* shm_buffer.h: the draft worker's shared tensor buffer (draft tokens + q rows).
 *
 * One interface, several transports. The owner (the draft worker) creates a
 * buffer, exports a JSON descriptor that travels in its "register" message,
 * and the peer (the target worker) imports it from that descriptor and
 * reads the draft's tokens and q rows in place. Transports:
 *   "posix": shm_open("/tandem-<instance>-<pid>-<tag>", O_CREAT|O_EXCL) +
 *            ftruncate + fallocate + mmap; the owner unlinks on close; the
 *            importer maps read-only.
 *   "cuda_ipc": the same POSIX segment (the host face: what host code
 *            writes and reads) plus a device side the owner describes in a
 *            "cuda" object of the descriptor (struct shm_buffer_cuda_desc):
 *            the owner's GPU by UUID, the IPC handle of the base of a
 *            cudaMalloc slab laid out like the segment (offsets stated), one
 *            interprocess event per half, or "mode": "staging" (no slab: the
 *            segment, registered with cudaHostRegister in both processes,
 *            carries the data). This module only carries and checks that
 *            object (it sees no CUDA header); kernels/cuda/ipc.cu does the
 *            CUDA calls (kernels_cuda.h, kern_cuda_ipc_*).
 *   "frames": private memory of the reader laid out alike, for a draft it
 *            shares no memory with: each half arrives as bytes in a message
 *            (shm_half_wire.h) and is stored through the same seqlock.
 *
 * Layout (identical in every transport): n_slots x 2 halves; each half is
 *   struct shm_half_header + int32 tokens[k_max + 1], padded to 64 bytes,
 *   then q rows f32 [(k_max + 1) x vocab], padded to 64 bytes.
 * The header says what the half holds: the request id, the round, how many
 * draft tokens (k) and the index of the first one (first: 1 for a pre-draft,
 * whose tokens[0] is the draft's guess of the bonus token, else 0); draft
 * token i is tokens[first + i] and its q row is row first + i.
 *
 * Publication (a seqlock per half, C11 atomics, so it holds on weakly
 * ordered hosts such as Arm as well as on x86): the header's seq is odd while
 * the owner rewrites the half and even once it is published.
 *   owner:  shm_buffer_half_begin_write   seq odd, then a release fence, so the
 *                                        odd seq is visible before any data
 *                                        write is;
 *           write tokens and q rows;
 *           shm_buffer_half_publish      fields, then seq even with release:
 *                                        every data write before it is
 *                                        visible to whoever acquires that seq;
 *           send the message naming the half.
 *   reader: shm_buffer_half_read         seq with acquire (refused while odd),
 *                                        then the fields, then seq again:
 *                                        refused unless it is the same;
 *           read tokens and q rows in place;
 *           shm_buffer_half_unchanged    acquire fence, then seq again: the
 *                                        data read meanwhile is a published
 *                                        half only if seq has not moved.
 * A reader that gets a half the owner rewrote meanwhile learns it from
 * shm_buffer_half_unchanged and must discard what it computed from it. The
 * coordinator's protocol makes that an error case, never a routine one.
 *
 * What it is not: it does not decide which half is free; the coordinator's
 * protocol does (see docs/protocol-notes.md).
 */
#ifndef TANDEM_SHM_BUFFER_H
#define TANDEM_SHM_BUFFER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#define SHM_BUFFER_ALIGN 64
#define SHM_BUFFER_NAME_MAX 128
#define SHM_BUFFER_MAX_SLOTS 4096
#define SHM_BUFFER_MAX_K 64
#define SHM_BUFFER_MAX_VOCAB (1 << 24)

/* Header of one half; the tokens follow it directly. Every field is an
 * atomic (lock-free, hence address-free: it works across processes mapping
 * the same segment). Written only through shm_buffer_half_begin_write and
 * shm_buffer_half_publish, read only through shm_buffer_half_read. */
struct shm_half_header {
    _Atomic uint64_t seq;    /* odd: being rewritten; even: published */
    _Atomic uint64_t req;    /* request id the half was written for */
    _Atomic uint32_t round;  /* speculation round */
    _Atomic uint32_t k;      /* number of draft tokens */
    _Atomic uint32_t first;  /* index of draft token 0 in tokens[] and in the q rows */
    _Atomic uint32_t guess;  /* pre-draft: tokens[0], the guessed bonus token; else 0 */
};

/* What a published half holds (a plain copy of the header's fields). */
struct shm_half_info {
    uint64_t req;
    uint32_t round, k, first, guess;
};

struct shm_layout {
    int n_slots, k_max, vocab;
    size_t tokens_offset;  /* from the half's start */
    size_t q_offset;       /* from the half's start */
    size_t half_bytes;
    size_t size_bytes;     /* n_slots * 2 * half_bytes */
};

/* ERR_RANGE naming the parameter when outside 1..SHM_BUFFER_MAX_*. */
int shm_layout_init(struct shm_layout *lay, int n_slots, int k_max, int vocab, char *err);

struct shm_buffer;

/* Creates a buffer of the layout (n_slots, k_max, vocab), zero-filled.
 * transport: "posix" or "cuda_ipc" (others: ERR_UNSUPPORTED; a cuda_ipc
 * owner then attaches its device side, shm_buffer_set_cuda). The POSIX name is
 * "/tandem-<instance>-<pid>-<tag>"; an existing segment of that name is an
 * error (O_EXCL). Memory is reserved up front so a full /dev/shm fails here
 * (ERR_NOMEM naming the size), not with SIGBUS later. */
int shm_buffer_create(struct shm_buffer **out, const char *transport, const char *instance,
                      const char *tag, int n_slots, int k_max, int vocab, char *err);

/* New descriptor object {transport, name, size_bytes, n_slots, k_max, vocab}
 * plus, for cuda_ipc, "cuda": {device_uuid, mode: "device"|"staging",
 * mem_handle (hex), slab_bytes, half_bytes, tokens_offset, q_offset,
 * probe_offset, probe [4], events [hex per half], q_rows: "host_face"|
 * "slab"} (docs/protocol-notes.md says what each is for); the caller owns it
 * (cJSON_Delete). NULL on out of memory, or a cuda_ipc buffer whose device
 * side was never set. */
cJSON *shm_buffer_export(const struct shm_buffer *buf);

/* Maps the buffer a descriptor names, read-only. ERR_PROTOCOL naming the
 * field for a bad descriptor ("shm.size_bytes: ... does not match the
 * layout", "shm.cuda.events: ..."), ERR_NOT_FOUND when the segment does not exist, ERR_FORMAT when
 * the segment is smaller than the descriptor says, ERR_UNSUPPORTED for an
 * unknown transport, ERR_SYSTEM otherwise. */
int shm_buffer_import(struct shm_buffer **out, const cJSON *descriptor, char *err);

/* The device side of a "cuda_ipc" buffer as the descriptor carries it.
 * Handles are the opaque bytes of cudaIpcMemHandle_t / cudaIpcEventHandle_t
 * (SHM_BUFFER_IPC_HANDLE_BYTES each, hex in the JSON). */
#define SHM_BUFFER_IPC_HANDLE_BYTES 64
#define SHM_BUFFER_UUID_MAX 64
struct shm_buffer_cuda_desc {
    char device_uuid[SHM_BUFFER_UUID_MAX]; /* the owner's GPU: "GPU-" + 36 characters */
    bool staging;                /* no slab: the host face carries the data */
    unsigned char mem_handle[SHM_BUFFER_IPC_HANDLE_BYTES]; /* slab base; unused when staging */
    uint64_t slab_bytes;         /* >= the layout's size_bytes + 64 probe bytes; 0 when staging */
    uint64_t probe_offset;       /* probe[] sits there in the slab (peer-access probe) */
    uint32_t probe[4];
    int n_events;                /* n_slots * 2: half h of slot s is event 2s + h */
    unsigned char *event_handles; /* ready: [n_events][SHM_BUFFER_IPC_HANDLE_BYTES] */
    /* consumed: the same count ("consumed_events"), recorded by the reader
     * after its last read of a half and waited for by the owner before it
     * writes the half again; NULL (absent) from an owner that exports none */
    unsigned char *consumed_handles;
    /* Where the q rows of a half are: false ("q_rows": "host_face", also
     * when absent) in the host face (and, in device mode, copied into the
     * slab by the publish); true ("slab") only in the slab, written there
     * by the draft's sampling kernels: a reader that cannot map the slab
     * (staging, a CPU target) has no q rows to read. Only with mode device. */
    bool q_in_slab;
};

/* Owner of a "cuda_ipc" buffer: attaches the device side (copied) so that
 * shm_buffer_export carries it. ERR_INVALID_ARG when the buffer is not
 * cuda_ipc or n_events is not n_slots * 2, ERR_NOMEM. */
int shm_buffer_set_cuda(struct shm_buffer *buf, const struct shm_buffer_cuda_desc *desc,
                        char *err);

/* The device side of a "cuda_ipc" buffer: the owner's once set, the
 * importer's as read (and checked) from the descriptor; NULL otherwise. */
const struct shm_buffer_cuda_desc *shm_buffer_cuda(const struct shm_buffer *buf);

/* The transport's name ("posix", "cuda_ipc"). */
const char *shm_buffer_transport(const struct shm_buffer *buf);

/* Unmaps; the owner also removes the segment. NULL-safe. */
void shm_buffer_close(struct shm_buffer *buf);

/* Readers are seen: an importer holds a shared flock on the segment from
 * import to close (the kernel drops it when the process dies), and sees the
 * owner going by the segment's name being removed.
 *
 * Owner, before it frees what readers may map beside the segment (the
 * cuda_ipc slab): removes the segment's name, so readers learn the owner is
 * going (shm_buffer_owner_gone) and no new one can import it, then waits up
 * to timeout_ms until no reader holds it. 0; ERR_TIMEOUT when a reader still
 * holds it; ERR_INVALID_ARG for an importer; ERR_SYSTEM. */
int shm_buffer_await_readers(struct shm_buffer *buf, double timeout_ms, char *err);

/* Importer: whether the segment's name is gone: its owner is closing
 * (shm_buffer_await_readers), closed, or died and a restarted owner removed
 * its stale segment (shm_buffer_cleanup_stale). The reader should then
 * close its import, which is what the owner waits for. false for an owner. */
bool shm_buffer_owner_gone(const struct shm_buffer *buf);

const struct shm_layout *shm_buffer_layout(const struct shm_buffer *buf);
const char *shm_buffer_name(const struct shm_buffer *buf);
bool shm_buffer_is_owner(const struct shm_buffer *buf);

/* Accessors of slot/half (half 0 or 1); NULL when out of range. The
 * importer's mapping is read-only: writing through these pointers there
 * faults, so importers use them as const. */
struct shm_half_header *shm_buffer_half_header(struct shm_buffer *buf, int slot, int half);
int32_t *shm_buffer_half_tokens(struct shm_buffer *buf, int slot, int half);
float *shm_buffer_half_q(struct shm_buffer *buf, int slot, int half);

/* Owner: marks slot/half as being rewritten (seq odd) before anything
 * touches its tokens or q rows. Calling it again on a half that was never
 * published keeps it odd and moves seq on, so a reader that saw an earlier
 * value still notices. Out-of-range slot/half: no-op. */
void shm_buffer_half_begin_write(struct shm_buffer *buf, int slot, int half);

/* Owner: stores info in the header and publishes the half (seq even, with
 * release ordering: the data written since begin_write is visible to any
 * reader that reads the new seq). Call it before sending the message that
 * names the half. */
void shm_buffer_half_publish(struct shm_buffer *buf, int slot, int half,
                             const struct shm_half_info *info);

/* Reader: copies the header of a published half into *info and its seq
 * into *seq_out (for shm_buffer_half_unchanged). Returns 0, ERR_UNAVAILABLE while
 * the owner is rewriting the half (seq odd, or it moved while the fields
 * were read), ERR_RANGE for a slot/half out of range. */
int shm_buffer_half_read(struct shm_buffer *buf, int slot, int half, struct shm_half_info *info,
                         uint64_t *seq_out);

/* Reader: the half's seq now (acquire), for shm_buffer_half_wait; 0 for a
 * slot/half out of range. */
uint64_t shm_buffer_half_seq(struct shm_buffer *buf, int slot, int half);

/* Reader: sleeps until the half's seq is no longer `seen` (the owner began
 * rewriting it or published it) or timeout_ms have passed: 0, or
 * ERR_TIMEOUT when nothing moved; ERR_RANGE for a slot/half out of range.
 * It may return 0 early (a wake for another reader): callers re-read the
 * half and wait again. The owner wakes the half's sleepers when it
 * publishes (a futex on the seq's low 32 bits, shared between the
 * processes that map the segment). */
int shm_buffer_half_wait(struct shm_buffer *buf, int slot, int half, uint64_t seen, double timeout_ms);

/* Reader, after reading a half's tokens and q rows: whether the half is
 * still the publication shm_buffer_half_read returned seq for (so what was
 * read is that publication's data, not a mix). An acquire fence orders the
 * data reads before the check. */
bool shm_buffer_half_unchanged(struct shm_buffer *buf, int slot, int half, uint64_t seq);

/* Removes POSIX segments /dev/shm/tandem-<instance>-<pid>-<tag> left by
 * processes that no longer exist (a live pid's segment is kept, so a
 * coordinator starting after its draft worker does not pull the buffer from
 * under it). all_pids: remove them even when the pid is alive (the
 * supervisor, once every process is stopped). *n_removed may be NULL. */
int shm_buffer_cleanup_stale(const char *instance, bool all_pids, int *n_removed, char *err);

#endif
