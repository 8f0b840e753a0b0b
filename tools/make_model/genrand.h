/* genrand.h: counter-based normal random numbers and bf16 conversion for the
 * model generator.
 *
 * What it is: a stateless generator. Value i of a stream is a pure function of
 * (stream key, i): key = genrand_key(seed, name). Pair j = i / 2 draws one
 * 64-bit splitmix64 output at counter j (state key + (j + 1) * golden gamma,
 * then the splitmix64 finaliser); two 24-bit fields of it are the uniforms of a
 * Box-Muller transform, whose cosine branch is value 2j and sine branch value
 * 2j + 1. So any slice of a tensor can be generated alone, in any order, on
 * any number of threads, and the bytes do not change.
 * What it is not: a cryptographic or a statistically "research grade" source
 * (24-bit uniforms cap |z| at about 5.8), nor the Philox generator the
 * samplers use.
 *
 * Determinism: same seed and name give the same values on one build; the
 * math is libm's logf, sqrtf, cosf and sinf, compiled without FP contraction
 * (ISO C mode), so results are identical across runs and thread counts on one
 * machine and libm.
 */
#ifndef TANDEM_GENRAND_H
#define TANDEM_GENRAND_H

#include <stddef.h>
#include <stdint.h>

/* Stream key of tensor `name` (or any label) under `seed`. */
uint64_t genrand_key(uint64_t seed, const char *name);

/* The splitmix64 finaliser (a bijective 64-bit mixer). */
uint64_t genrand_mix64(uint64_t x);

/* out[k] = mean + std * N_key(first + k) for k in [0, n). */
void genrand_normal_fill(uint64_t key, uint64_t first, size_t n, float mean, float std,
                         float *out);

/* N_key(index): one standard normal value at `index` of the stream. */
float genrand_normal_at(uint64_t key, uint64_t index);

/* Round-to-nearest-even float -> bf16 bits (NaN stays a quiet NaN). */
uint16_t genrand_f32_to_bf16(float f);
/* Exact bf16 bits -> float. */
float genrand_bf16_to_f32(uint16_t b);

#endif
