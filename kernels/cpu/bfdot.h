/* bfdot.h: the CPU matrix product of bf16 weights on vdpbf16ps (AVX512_BF16),
 * with the activations rounded to bf16 (private to kernels/cpu; bfdot.c
 * holds the dispatch and the ISA check, bfdot_avx512bf16.c the tiles).
 *
 * The contract (docs/quantization.md, "bf16 products"), for out[i][o] =
 * sum_k in[i][k] * w[o][k], w a row-major [d_out][d_in] bf16 matrix:
 *   1. Each input row is rounded alone to bf16, as vcvtneps2bf16 does: a
 *      zero or denormal f32 becomes a zero of its sign; a NaN a quiet NaN
 *      (its high half with the quiet bit set); anything else to nearest,
 *      ties to even (which takes values past the largest bf16 to infinity).
 *      The row is padded with zeros to dp = d_in rounded up to 32 columns
 *      (the weights too: those columns are read as zeros).
 *   2. Sixteen f32 lanes, lane j taking the column pairs (32s + 2j,
 *      32s + 2j + 1) for s = 0 .. dp/32 - 1 in increasing s, each pair one
 *      vdpbf16ps step, which (measured on this machine against the
 *      instruction, tests/unit/test_kernels_cpu.c, and as Intel's
 *      pseudocode says) is:
 *        a = DAZ(acc); x0, x1, w0, w1 = DAZ of the four bf16 values;
 *        t = FTZ(a + x1 * w1)      (one rounding, to nearest even)
 *        acc = FTZ(t + x0 * w0)    (one rounding)
 *      the odd column first; DAZ takes a denormal input as a zero of its
 *      sign, FTZ a denormal result to a zero of its sign; each product of
 *      two bf16 is exact, so each step is fmaf(x, w, a) flushed.
 *   3. The lanes are folded with plain f32 additions (no flushing): m_j =
 *      l_j + l_{j+8} for j < 8, then cpu_simd.h's fold of eight lanes:
 *      (m0+m4, m1+m5, m2+m6, m3+m7), (a0+a2, a1+a3), b0+b1.
 * So a row's output bits depend on its own inputs and d_in alone: not on
 * the batch, the tile, the path (1 row, 2-17 rows, prefill), the weights'
 * layout (row-major or line octets, packed.h) nor the thread count. K is
 * never split across threads.
 *
 * This is every bf16 product of a backend where the CPU has AVX512_BF16
 * (the default, kernels.h). Where it lacks it (or TANDEM_CPU_BF16_DOT=0,
 * kern_cpu_set_bf16_dot turned it off) bf16 weights take the f32 paths of
 * matmul.c (weights widened, f32 activations), which give other bits: a
 * bf16 model's outputs differ between CPUs with and without the
 * instruction (the f32 paths give the same bits on every ISA).
 */
#ifndef TANDEM_KERNELS_CPU_BFDOT_H
#define TANDEM_KERNELS_CPU_BFDOT_H

#include <stddef.h>
#include <stdint.h>

#define BD_STEP 32 /* columns per step: 16 lanes of pairs */
#define BD_RMAX 6  /* most input rows one tile takes */
#define BD_TMAX 8  /* most weight rows one tile takes */
#define BD_STREAMS 3 /* octets one input row's tile reads side by side */
#define BD_ROT 3     /* octets taking turns on k-blocks at 2..18 rows */
#define BD_KB 256    /* ... columns per k-block */
#define BD_WHOLE_MAX 6 /* up to this many rows a tile takes a whole octet (in groups of 3) */
#define BD_LEAD 4096 /* elements a prefetching tile reads ahead (8 KiB) */

/* One product's work as the tiles see it. */
struct bd_job {
    float *out;         /* [n, d_out] */
    const uint16_t *xb; /* [n, dp] the rounded input rows (rule 1) */
    const uint16_t *w;  /* [d_out, d_in] bf16, the first packed_rows rows in line octets (packed.h) */
    int n, d_in, dp, d_out;
    int packed_rows;    /* a multiple of 8, or 0: all row-major */
    int task_rows;      /* output rows per pool task, a multiple of 8 */
};

/* Columns of a rounded row: d_in rounded up to BD_STEP. */
static inline int bd_padded(int d_in)
{
    return (d_in + BD_STEP - 1) / BD_STEP * BD_STEP;
}

/* Whether this CPU (and build) runs vdpbf16ps. */
int bd_supported(void);

/* Rule 1 on rows [i0, i1) of in ([n][d_in]) into xb ([n][dp]). */
void bd_round_rows_avx512bf16(const float *in, int d_in, uint16_t *xb, int dp, int i0, int i1);
/* Output rows [o0, o1) of the job for all its input rows. */
void bd_rows_avx512bf16(const struct bd_job *job, int o0, int o1);
/* One output: a row of d_in bf16 whose 32-column steps lie step elements
 * apart from w on (32: row-major; cpu_lines_step) against one rounded row
 * xb (dp). */
float bd_dot_avx512bf16(const uint16_t *w, size_t step, const uint16_t *xb, int d_in);

#endif
