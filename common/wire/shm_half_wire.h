/* shm_half_wire.h: one half of the draft's buffer as bytes, for a target
 * that shares no memory with its draft (another host, another /dev/shm).
 * The draft packs a half it published; the bytes travel as a frame of its
 * draft_ready and then of the verify that reads the half (the coordinator
 * keeps them in between); the target stores them into its "frames" buffer
 * (shm_buffer.h) through the seqlock, and reads them as it reads a mapped
 * half. Layout (little-endian host order, both ends the same build):
 *   struct shm_half_wire_header, int32 tokens[first + k],
 *   then rows f32 q rows [rows x vocab] (rows: 0, or first + k).
 * Sizes, for the Llama 3 vocabulary (128,256): 24 + 4 (first + k) bytes
 * without q rows (greedy, point-mass); about 513 kB a row with them.
 */
#ifndef TANDEM_SHM_HALF_WIRE_H
#define TANDEM_SHM_HALF_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "shm_buffer.h"

struct shm_half_wire_header {
    uint64_t req;
    uint32_t round, k, first, guess;
    uint32_t rows;   /* q rows that follow the tokens: 0 or first + k */
    uint32_t vocab;  /* the row width, checked against the reader's layout */
};

/* The bytes of slot/half as the owner published it, with q_rows rows of
 * q (0: tokens alone). *out is malloc'd (the caller frees). ERR_UNAVAILABLE
 * while the half is being rewritten, ERR_RANGE for a slot/half or q_rows out
 * of range, ERR_NOMEM. */
int shm_half_pack(struct shm_buffer *buf, int slot, int half, int q_rows, void **out, size_t *out_len,
                  char *err);

/* Stores packed bytes into slot/half of a "frames" buffer and publishes
 * them. ERR_INVALID_ARG for another transport, ERR_PROTOCOL naming what is
 * wrong with bytes that do not fit the layout. */
int shm_half_store(struct shm_buffer *buf, int slot, int half, const void *bytes, size_t len, char *err);

#endif
