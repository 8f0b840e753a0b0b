/* qdot.h: the CPU matrix product of int8 and int4 weights (KERN_DTYPE_Q8,
 * KERN_DTYPE_Q4) with int8 activations, in integer dot products (private to
 * kernels/cpu; qdot.c holds the contract's code, qdot_tiles.h the tiles,
 * built once per instruction set by qdot_<isa>.c).
 *
 * The contract (docs/quantization.md, "Integer products"):
 *   1. Each input row is quantized alone, in blocks of QD_BLOCK = 32
 *      columns (the last block padded with zeros): amax = max |x| over the
 *      block; a block whose amax is below QD_TINY is all zero (scale 0); a
 *      block holding an infinity or a NaN gets scale NaN and codes 0, so
 *      the row's outputs come out NaN as f32 products would; otherwise
 *      inv = 127 / amax, q = nearest-even(x * inv) in [-127, 127] and the
 *      scale is s = amax / 127 (each an f32 operation, rounded once). The
 *      scale is the block's own: never the batch's, never another row's.
 *   2. For output o and block b, isum = sum over the block of w * q, in
 *      int32. Integer addition is exact and associative: every order, tile,
 *      instruction set and thread split gives the same isum.
 *   3. One float epilogue, the same for every row count, path and ISA:
 *      acc = 0; for b in increasing order
 *        int8: acc = fma((float)isum, s_b, acc)              then out = acc * wscale[o]
 *        int4: acc = fma((float)isum, wscale[o][b] * s_b, acc) then out = acc
 *      (float)isum is exact (|isum| <= 32 * 255 * 127 < 2^24).
 * So a row's output bits depend on its own inputs and d_in alone: not on
 * the batch, the path, the ISA (scalar, AVX2, AVX-VNNI, AVX-512 VNNI all give
 * the same bits) nor the thread count. K is never split across threads.
 *
 * How the integers are formed: vpdpbusd multiplies unsigned by signed
 * bytes, so the weights are stored unsigned with an offset (int8: w + 128;
 * int4: the nibble n, standing for n - 8) and the block's sum of codes,
 * times the offset, is taken off: sum (w + off) q - off * sum q = sum w q,
 * exactly. No step saturates: no 16-bit intermediate (vpmaddubsw) is used;
 * without VNNI the bytes are widened to 16 bits and vpmaddwd sums pairs
 * into 32 bits, exactly.
 *
 * The weights' layout (made by map_matrix, qd_pack): panels of QD_ROWS = 16
 * output rows (the last padded with zero rows), each a run of bytes:
 *   int8: 16 f32 row scales (64 bytes), then per block b 8 lines of 64
 *         bytes: line l, byte 4r + t = w[r][32b + 4l + t] + 128;
 *   int4: per block b 4 lines of 64 bytes, line l, byte 4r + t = nibble of
 *         column 32b + 8l + t, its high half that of 32b + 8l + 4 + t; then
 *         the 16 rows' f32 scales of the block (64 bytes).
 * One 64-byte line is 16 rows x 4 columns: one vpdpbusd against the
 * input's 4 codes broadcast adds them into 16 row sums, no horizontal sum.
 */
#ifndef TANDEM_KERNELS_CPU_QDOT_H
#define TANDEM_KERNELS_CPU_QDOT_H

#include <stddef.h>
#include <stdint.h>

#include "kernels.h"

#define QD_ROWS 16  /* output rows per panel */
#define QD_BLOCK 32 /* columns per activation block (and int4 group) */
#define QD_LINE 64  /* bytes of one line: QD_ROWS x 4 columns */
#define QD_TINY 0x1p-96f /* blocks with a smaller amax quantize to zero */
#define QD_RMAX 6   /* most input rows one tile takes (AVX-512) */
#define QD_WIDE_ROWS 6 /* AVX-512: up to this many rows, 4 panels a tile in groups of 3 rows */

/* Which integer dot product a backend runs; every one gives the same bits. */
enum qd_isa {
    QD_ISA_SCALAR = 0,
    QD_ISA_AVX2 = 1,       /* bytes widened to 16 bits, vpmaddwd */
    QD_ISA_AVXVNNI = 2,    /* 256-bit vpdpbusd */
    QD_ISA_AVX512VNNI = 3, /* 512-bit vpdpbusd */
};
#define QD_ISA_COUNT 4

/* The quantized input rows: codes [n][nb * QD_BLOCK], scales and sums of
 * codes [n][nb]. */
struct qd_act {
    const int8_t *q;
    const float *s;
    const int32_t *sum;
    int nb;
};

/* One product's work as the tiles see it. */
struct qd_job {
    float *out;            /* [n, d_out] */
    const struct qd_act *a;
    const uint8_t *w;      /* panels, qd_pack's layout */
    enum kern_dtype dtype; /* KERN_DTYPE_Q8 or KERN_DTYPE_Q4 */
    int n, d_out;
    size_t panel_bytes;    /* qd_panel_bytes */
    int isa;               /* enum qd_isa */
    int task_panels;       /* panels per pool task */
};

/* Bytes the quantized activations of n rows of d_in take (64-aligned parts). */
size_t qd_act_bytes(int n, int d_in);
/* a describes n rows of d_in in buf (qd_act_bytes, 64-aligned). */
void qd_act_layout(void *buf, int n, int d_in, struct qd_act *a);
/* Quantizes rows [i0, i1) of in ([n][d_in] floats) into a, by rule 1 above:
 * each row alone, so any split of the rows gives the same codes. */
void qd_act_quantize_rows(const float *in, int d_in, const struct qd_act *a, int i0, int i1);

size_t qd_panel_bytes(enum kern_dtype dt, int d_in);
size_t qd_packed_bytes(enum kern_dtype dt, int rows, int d_in);
/* Writes the [rows][d_in] matrix w (kernels.h's layout of dt) into dst
 * (qd_packed_bytes) in the panel layout above. */
void qd_pack(enum kern_dtype dt, const void *w, int rows, int d_in, void *dst);

/* Panels [p0, p0 + np) of the job for all its rows, one ISA each (the
 * names are qd_panels_<isa>); the AVX ones exist in builds for x86-64
 * compilers that know the instructions, and must only run where
 * qd_isa_supported says the CPU has them. */
typedef void (*qd_panels_fn)(const struct qd_job *job, int p0, int np);
void qd_panels_scalar(const struct qd_job *job, int p0, int np);
void qd_panels_avx2(const struct qd_job *job, int p0, int np);
void qd_panels_avxvnni(const struct qd_job *job, int p0, int np);
void qd_panels_avx512vnni(const struct qd_job *job, int p0, int np);

/* Whether this CPU (and build) can run isa. */
int qd_isa_supported(int isa);
/* The fastest ISA this CPU can run. */
int qd_isa_best(void);
const char *qd_isa_name(int isa);

#endif
