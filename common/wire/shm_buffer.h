/* shm_buffer.h: the draft worker's shared tensor buffer (draft tokens + q rows).
 *
 * One interface, several transports. The owner (the draft worker) creates a
 * buffer, exports a JSON descriptor that travels in its "register" message,
 * and the peer (the target worker) imports it from that descriptor and
 * reads the draft's tokens and q rows in place. Transports:
 *   "posix": shm_open("/tandem-<instance>-<pid>-<tag>", O_CREAT|O_EXCL) +
 *            ftruncate + fallocate + mmap; the owner unlinks on close; the
 *            importer maps read-only.
 *   "cuda" (later): a cudaMalloc slab + cudaIpcMemHandle and an interprocess
 *            event, carried in the same JSON descriptor.
 *
 * Layout (identical in every transport): n_slots x 2 halves; each half is
 *   struct shm_half_header + int32 tokens[k_max + 1], padded to 64 bytes,
 *   then q rows f32 [(k_max + 1) x vocab], padded to 64 bytes.
 * The header says what the half holds: the request id, the round, how many
 * draft tokens (k) and the index of the first one (first: 1 for a pre-draft,
 * whose tokens[0] is the draft's guess of the bonus token, else 0); draft
 * token i is tokens[first + i] and its q row is row first + i.
 *
 * Ordering: the owner writes a half, issues a release fence, then sends the
 * ZeroMQ message naming it; the reader issues an acquire fence after
 * receiving the message (shm_buffer_publish / shm_buffer_acquire).
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

/* Header of one half; the tokens follow it directly. */
struct shm_half_header {
    uint64_t req;    /* request id the half was written for */
    uint32_t round;  /* speculation round */
    uint32_t k;      /* number of draft tokens */
    uint32_t first;  /* index of draft token 0 in tokens[] and in the q rows */
    uint32_t guess;  /* pre-draft: tokens[0], the guessed bonus token; else 0 */
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
 * transport: "posix" (others: ERR_UNSUPPORTED). The POSIX name is
 * "/tandem-<instance>-<pid>-<tag>"; an existing segment of that name is an
 * error (O_EXCL). Memory is reserved up front so a full /dev/shm fails here
 * (ERR_NOMEM naming the size), not with SIGBUS later. */
int shm_buffer_create(struct shm_buffer **out, const char *transport, const char *instance,
                      const char *tag, int n_slots, int k_max, int vocab, char *err);

/* New descriptor object {transport, name, size_bytes, n_slots, k_max, vocab};
 * the caller owns it (cJSON_Delete). NULL on out of memory. */
cJSON *shm_buffer_export(const struct shm_buffer *buf);

/* Maps the buffer a descriptor names, read-only. ERR_PROTOCOL naming the
 * field for a bad descriptor ("shm.size_bytes: ... does not match the
 * layout"), ERR_NOT_FOUND when the segment does not exist, ERR_FORMAT when
 * the segment is smaller than the descriptor says, ERR_UNSUPPORTED for an
 * unknown transport, ERR_SYSTEM otherwise. */
int shm_buffer_import(struct shm_buffer **out, const cJSON *descriptor, char *err);

/* Unmaps; the owner also removes the segment. NULL-safe. */
void shm_buffer_close(struct shm_buffer *buf);

const struct shm_layout *shm_buffer_layout(const struct shm_buffer *buf);
const char *shm_buffer_name(const struct shm_buffer *buf);
bool shm_buffer_is_owner(const struct shm_buffer *buf);

/* Accessors of slot/half (half 0 or 1); NULL when out of range. The
 * importer's mapping is read-only: writing through these pointers there
 * faults, so importers use them as const. */
struct shm_half_header *shm_buffer_half_header(struct shm_buffer *buf, int slot, int half);
int32_t *shm_buffer_half_tokens(struct shm_buffer *buf, int slot, int half);
float *shm_buffer_half_q(struct shm_buffer *buf, int slot, int half);

/* Release fence after writing a half (before sending its message). */
void shm_buffer_publish(struct shm_buffer *buf);
/* Acquire fence after receiving the message that names a half. */
void shm_buffer_acquire(struct shm_buffer *buf);

/* Removes POSIX segments /dev/shm/tandem-<instance>-<pid>-<tag> left by
 * processes that no longer exist (a live pid's segment is kept, so a
 * coordinator starting after its draft worker does not pull the buffer from
 * under it). all_pids: remove them even when the pid is alive (the
 * supervisor, once every process is stopped). *n_removed may be NULL. */
int shm_buffer_cleanup_stale(const char *instance, bool all_pids, int *n_removed, char *err);

#endif
