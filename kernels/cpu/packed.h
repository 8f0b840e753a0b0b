/* packed.h: the CPU backend's two packed layouts of bf16 weight matrices,
 * made by map_matrix and read by matmul, embed and matmul_argmax: "row
 * octets" for the f32 paths (below) and "line octets" for vdpbf16ps
 * (bfdot.h; at the end of this comment). Which one a matrix gets is decided
 * when it is mapped: line octets where the backend's bf16 dot is on.
 *
 * Why: a decode step is one pass over the weights, and the row-major layout
 * made the matrix-vector product compute-bound on an AVX-512 core before the
 * memory was: each group of four rows was four streams, and spreading
 * sixteen bf16 weights of two rows over the halves of a 512-bit register took
 * a two-source word permute (one per two cycles on Zen 5) per sixteen
 * weights. In this layout the weights of two rows that one 512-bit
 * accumulator needs lie in one aligned 64-byte line, already in its lanes:
 * widening to f32 is one AND (the high halves) or one shift (the low
 * halves), and an octet's eight rows are one sequential run (matmul_packed.c
 * reads several runs side by side: see its packed path).
 *
 * The layout, for a [rows][d_in] matrix with d_in a multiple of 32: rows
 * 0 .. 8 * (rows / 8) - 1 go in blocks of eight (an "octet"), each in the
 * bytes its rows held before; the rows after the last full octet stay as
 * they were. Octet b is 32-column steps of 512 bytes: step s holds, for
 * pair p = 0..3 (rows 8b + 2p and 8b + 2p + 1) at byte 128p, two lines L = 0,
 * 1 at byte 64L, of 16 dwords i: lanes i < 8 belong to row 8b + 2p, lanes
 * i >= 8 to row 8b + 2p + 1, j = i % 8, and the dword's high half is column
 * 32s + 16L + j, its low half column 32s + 16L + 8 + j. A bf16 value in a
 * dword's high half with the low half cleared is that value as an f32, so
 * line L gives the column chunks 2L (AND) and 2L + 1 (shift left by 16), each
 * in the lanes the fixed reduction order of cpu_simd.h assigns: the products
 * are the same FMAs in the same order as on the row-major matrix, bit for
 * bit.
 *
 * Line octets (CPU_LAYOUT_LINES), for a [rows][d_in] matrix with d_in a
 * multiple of 32: the same octets of eight rows, the rows after the last
 * full octet left as they were. Octet b is 32-column steps of 512 bytes:
 * step s holds row 8b + a's columns 32s .. 32s + 31 as they were, at byte
 * 64a. One vdpbf16ps takes a 64-byte line of one row as it is (lane j the
 * columns 2j, 2j + 1), so an octet's eight rows are one sequential run of
 * whole lines in the order the tiles use them: a one-row decode reads each
 * octet as one stream instead of eight 4 KiB streams that restart at every
 * tile. The layout moves whole lines only: no bit of a product depends on
 * it.
 */
#ifndef TANDEM_KERNELS_CPU_PACKED_H
#define TANDEM_KERNELS_CPU_PACKED_H

#include <stddef.h>
#include <stdint.h>

#include "kernels.h"

#define CPU_PACKED_ROWS 8      /* rows per octet */
#define CPU_PACKED_STEP 32     /* columns per step */
#define CPU_PACKED_STEP_BYTES 512

/* How map_matrix laid a matrix out. */
enum cpu_layout {
    CPU_LAYOUT_ROWS = 0,   /* row-major, as the caller wrote it */
    CPU_LAYOUT_OCTETS = 1, /* row octets (the f32 paths) */
    CPU_LAYOUT_LINES = 2,  /* line octets (vdpbf16ps) */
};

/* Whether matrices of this dtype and shape are packed in this build: bf16,
 * d_in a multiple of 32, at least one full octet, and the AVX-512F+BW
 * kernels that read the layout compiled in. */
int cpu_packed_supported(enum kern_dtype dtype, long rows, long d_in);

/* Packs the [rows][d_in] bf16 matrix at w in place; tmp holds
 * CPU_PACKED_ROWS * d_in values. Requires cpu_packed_supported. */
void cpu_packed_pack(uint16_t *w, int rows, int d_in, uint16_t *tmp);

/* Whether matrices of this dtype and shape can take line octets: bf16, d_in
 * a multiple of 32, at least one full octet (the kernels that read them
 * are chosen at run time: bd_supported). */
int cpu_lines_supported(enum kern_dtype dtype, long rows, long d_in);

/* Packs the [rows][d_in] bf16 matrix at w in place into line octets; tmp
 * holds CPU_PACKED_ROWS * d_in values. Requires cpu_lines_supported. */
void cpu_lines_pack(uint16_t *w, int rows, int d_in, uint16_t *tmp);

/* Row r of a packed matrix (r below its packed rows) widened to f32. */
void cpu_packed_row_f32(const uint16_t *w, int d_in, int r, float *y);

/* Elements from one 32-column step of row r to the next, and the offset of
 * its first step, in a matrix of layout whose first packed_rows rows are
 * packed (rows past them, and CPU_LAYOUT_ROWS, are row-major). Not for row
 * octets, whose lines mix two rows. */
static inline size_t cpu_lines_step(enum cpu_layout layout, int packed_rows, long r)
{
    return layout == CPU_LAYOUT_LINES && r < packed_rows ? CPU_PACKED_STEP_BYTES / 2
                                                         : CPU_PACKED_STEP;
}
static inline size_t cpu_lines_row_offset(enum cpu_layout layout, int packed_rows, int d_in,
                                          long r)
{
    if (layout == CPU_LAYOUT_LINES && r < packed_rows)
        return (size_t)(r / CPU_PACKED_ROWS) * CPU_PACKED_ROWS * (size_t)d_in +
               (size_t)(r % CPU_PACKED_ROWS) * CPU_PACKED_STEP;
    return (size_t)r * (size_t)d_in;
}

/* Row r of a [rows][d_in] matrix of dtype, its first packed_rows rows in
 * the packed layout given (0 rows or CPU_LAYOUT_ROWS: all row-major),
 * widened to f32: exact for every dtype (embed's rows, the argmax screen's
 * exact logits). */
void cpu_matrix_row_f32(const void *w, enum kern_dtype dtype, int d_in, int packed_rows,
                        enum cpu_layout layout, long r, float *y);

#endif
