/* genrand.c: counter-based splitmix64 + Box-Muller normals, bf16 rounding.
 * See genrand.h for the stream definition. */
#include "genrand.h"

#include <math.h>
#include <string.h>

#define GENRAND_GAMMA 0x9E3779B97F4A7C15ULL

uint64_t genrand_mix64(uint64_t x)
{
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

uint64_t genrand_key(uint64_t seed, const char *name)
{
    /* FNV-1a over the name, then mixed with the seed so that nearby seeds and
     * similar names give unrelated streams. */
    uint64_t h = 0xCBF29CE484222325ULL;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
        h ^= *p;
        h *= 0x100000001B3ULL;
    }
    return genrand_mix64(genrand_mix64(seed ^ 0x5851F42D4C957F2DULL) ^ h);
}

/* The two normals of pair j. */
static inline void genrand_pair(uint64_t key, uint64_t j, float *z0, float *z1)
{
    uint64_t r = genrand_mix64(key + (j + 1) * GENRAND_GAMMA);
    /* u1 in (0, 1]: never 0, so logf is finite; u2 in [0, 1). */
    float u1 = ((float)(uint32_t)(r >> 40) + 1.0f) * (1.0f / 16777216.0f);
    float u2 = (float)(uint32_t)(r & 0xFFFFFFu) * (1.0f / 16777216.0f);
    float rad = sqrtf(-2.0f * logf(u1));
    float th = 6.28318530717958647692f * u2;
    *z0 = rad * cosf(th);
    *z1 = rad * sinf(th);
}

void genrand_normal_fill(uint64_t key, uint64_t first, size_t n, float mean, float std,
                         float *out)
{
    size_t k = 0;
    float z0, z1;
    if (n == 0)
        return;
    if (first & 1) { /* leading odd index: the sine half of its pair */
        genrand_pair(key, first >> 1, &z0, &z1);
        out[k++] = mean + std * z1;
    }
    uint64_t j = (first + k) >> 1;
    for (; k + 1 < n; k += 2, j++) {
        genrand_pair(key, j, &z0, &z1);
        out[k] = mean + std * z0;
        out[k + 1] = mean + std * z1;
    }
    if (k < n) {
        genrand_pair(key, j, &z0, &z1);
        out[k] = mean + std * z0;
    }
}

float genrand_normal_at(uint64_t key, uint64_t index)
{
    float z0, z1;
    genrand_pair(key, index >> 1, &z0, &z1);
    return (index & 1) ? z1 : z0;
}

uint16_t genrand_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) /* NaN: keep it a (quiet) NaN */
        return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float genrand_bf16_to_f32(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
