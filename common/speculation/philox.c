/* philox.c: Philox-4x32-10 and the keyed uniform (see philox.h for the exact
 * mapping). Written from the paper's description: each round multiplies words
 * 0 and 2 by the two constants, keeps the 64-bit products' halves, and mixes
 * the high halves with words 1 and 3 and the round key.
 */
#include "philox.h"

#define PHILOX_M0 UINT32_C(0xD2511F53)
#define PHILOX_M1 UINT32_C(0xCD9E8D57)
#define PHILOX_W0 UINT32_C(0x9E3779B9)
#define PHILOX_W1 UINT32_C(0xBB67AE85)
#define PHILOX_ROUNDS 10

static void philox_round(uint32_t x[4], const uint32_t k[2])
{
    uint64_t p0 = (uint64_t)PHILOX_M0 * x[0];
    uint64_t p1 = (uint64_t)PHILOX_M1 * x[2];
    uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
    uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    uint32_t y0 = hi1 ^ x[1] ^ k[0];
    uint32_t y2 = hi0 ^ x[3] ^ k[1];
    x[0] = y0;
    x[1] = lo1;
    x[2] = y2;
    x[3] = lo0;
}

void philox4x32_10(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t x[4] = {counter[0], counter[1], counter[2], counter[3]};
    uint32_t k[2] = {key[0], key[1]};
    for (int r = 0; r < PHILOX_ROUNDS; r++) {
        if (r > 0) {
            k[0] += PHILOX_W0;
            k[1] += PHILOX_W1;
        }
        philox_round(x, k);
    }
    out[0] = x[0];
    out[1] = x[1];
    out[2] = x[2];
    out[3] = x[3];
}

float philox_uniform(uint64_t seed, uint32_t stream, uint64_t position, uint32_t index)
{
    const uint32_t key[2] = {(uint32_t)(seed & 0xffffffffu), (uint32_t)(seed >> 32)};
    const uint32_t counter[4] = {(uint32_t)(position & 0xffffffffu), (uint32_t)(position >> 32),
                                 stream, index / 4u};
    uint32_t out[4];
    philox4x32_10(counter, key, out);
    /* 24 high bits times 2^-24: exact in float, so u < 1 always. */
    return (float)(out[index % 4u] >> 8) * (1.0f / 16777216.0f);
}
