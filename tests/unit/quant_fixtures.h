/* quant_fixtures.h: seeded random inputs for the kernel tests (a splitmix64
 * generator) and random int8 / int4 matrices in the layouts of kernels.h,
 * shared by the CPU kernel tests and the CUDA kernel tests (which compare
 * against the CPU). Include after <cmocka.h>. */
#ifndef TANDEM_TESTS_QUANT_FIXTURES_H
#define TANDEM_TESTS_QUANT_FIXTURES_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

struct rng {
    uint64_t s;
};

static inline uint64_t rng_next(struct rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1). */
static inline float rng_float(struct rng *r)
{
    return (float)((double)(rng_next(r) >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

/* A random [d_out][d_in] matrix of quantized dtype dt (KERN_DTYPE_Q8 or
 * Q4): returns its bytes (malloc'd); wf gets each weight as the kernels
 * widen it ((float)q for int8, whose row scale multiplies the finished dot,
 * scale set; (n - 8) * scale for int4, scale 1). */
static inline void *make_quantized(struct rng *r, enum kern_dtype dt, int d_out, int d_in, float *wf, float *scale)
{
    if (dt == KERN_DTYPE_Q8) {
        char *w = malloc(kern_q8_bytes(d_out, d_in));
        assert_non_null(w);
        float *sc = (float *)(void *)(w + kern_q8_scales_offset(d_out, d_in));
        for (int o = 0; o < d_out; o++) {
            sc[o] = scale[o] = 0.001f + rng_float(r) * 0.01f;
            for (int k = 0; k < d_in; k++) {
                const int v = (int)(rng_next(r) % 255) - 127;
                ((int8_t *)w)[(size_t)o * d_in + k] = (int8_t)v;
                wf[(size_t)o * d_in + k] = (float)v;
            }
        }
        return w;
    }
    uint8_t *w = malloc(kern_q4_bytes(d_out, d_in));
    assert_non_null(w);
    for (int o = 0; o < d_out; o++)
        scale[o] = 1.0f; /* int4 scales sit in the groups */
    for (size_t g = 0; g < (size_t)d_out * d_in / KERN_Q4_GROUP; g++) {
        uint8_t *grp = w + g * KERN_Q4_GROUP_BYTES;
        const float sc = 0.001f + rng_float(r) * 0.05f;
        memcpy(grp + KERN_Q4_GROUP / 2, &sc, sizeof sc);
        for (int j = 0; j < KERN_Q4_GROUP; j++) {
            const int nib = (int)(rng_next(r) % 16);
            if (j < KERN_Q4_GROUP / 2)
                grp[j] = (uint8_t)nib;
            else
                grp[j - KERN_Q4_GROUP / 2] |= (uint8_t)(nib << 4);
            wf[g * KERN_Q4_GROUP + (size_t)j] = (float)(nib - 8) * sc;
        }
    }
    return w;
}

#endif
