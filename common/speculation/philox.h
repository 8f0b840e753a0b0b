/* philox.h: Philox-4x32-10 counter-based random numbers (Salmon, Moraes, Dror,
 * Shaw, "Parallel random numbers: as easy as 1, 2, 3", SC 2011), the generator
 * of cuRAND and PyTorch, plus the keyed uniform Tandem draws all its
 * randomness from.
 *
 * What it is: a pure function of (counter, key). No state, no globals: the
 * same inputs give the same bits on every machine, thread and backend, which
 * is what makes a seeded request reproducible and lets the CUDA backend draw
 * exactly the numbers the CPU draws.
 * What it is not: a cryptographic generator, nor a stateful stream object.
 *
 * Keyed uniform, the exact mapping (the CUDA backend must reproduce it bit for
 * bit; tests/unit/test_philox.c pins it):
 *
 *   key[0]     = (uint32_t)(seed & 0xffffffff)      low half of the seed
 *   key[1]     = (uint32_t)(seed >> 32)             high half of the seed
 *   counter[0] = (uint32_t)(position & 0xffffffff)  low half of the position
 *   counter[1] = (uint32_t)(position >> 32)         high half of the position
 *   counter[2] = stream                             one of PHILOX_STREAM_*
 *   counter[3] = index / 4
 *   word       = philox4x32_10(counter, key)[index % 4]
 *   u          = (float)(word >> 8) * 2^-24         (exact: 24 bits fit a float)
 *
 * so u is in [0, 1), a multiple of 2^-24, never 1.0.
 *
 * "position" is the absolute position in the sequence (prompt included, 0 =
 * first prompt token) of the token being produced: the draw that decides
 * token x at position n uses position n, whether that token is drafted,
 * accepted, corrected or a bonus. "index" numbers several draws made for the
 * same (stream, position); Tandem's own code uses index 0 only.
 *
 * Independence: distinct (seed, stream, position, index/4) give distinct
 * counters and keys, hence independent numbers. Draft and target draw from
 * different streams, and the target's accept test and its sampling use
 * different streams, so no uniform is ever used for two decisions.
 */
#ifndef TANDEM_PHILOX_H
#define TANDEM_PHILOX_H

#include <stdint.h>

/* Streams (counter[2]). The values are part of the reproducibility contract:
 * never renumber them. */
enum philox_stream {
    PHILOX_STREAM_TARGET_SAMPLE = 1, /* target: plain sampling, correction, bonus */
    PHILOX_STREAM_TARGET_ACCEPT = 2, /* target: u_i of the accept test at t_i */
    PHILOX_STREAM_DRAFT_SAMPLE = 3,  /* draft: sampling t_i from q_i */
};

/* One Philox-4x32-10 block: 10 rounds, key bumped between rounds with the
 * Weyl constants 0x9E3779B9, 0xBB67AE85; multipliers 0xD2511F53, 0xCD9E8D57.
 * Matches Random123's philox4x32_10 (its kat_vectors). out may not alias. */
void philox4x32_10(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]);

/* Uniform in [0, 1) with 24 random bits, keyed as documented above. */
float philox_uniform(uint64_t seed, uint32_t stream, uint64_t position, uint32_t index);

#endif
