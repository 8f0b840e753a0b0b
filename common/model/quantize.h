/* quantize.h: weights quantized at load time, from the bf16/f16/f32
 * tensors of the safetensors files (no conversion step).
 *
 * int8 (KERN_DTYPE_Q8, kernels.h): one scale per output row, symmetric:
 * scale = max |w| / 127 over the row (1 for a row of zeros), q = w / scale
 * rounded to nearest (halves away from zero), within [-127, 127]. Every
 * weight comes back within half a step: |q * scale - w| <= scale / 2.
 * A per-row scale keeps the matrix product one fixed-order dot product per
 * output and one multiply after it (kernels/cpu/matmul.c), so the
 * project's exactness contract holds for quantized weights too.
 *
 * int4 (KERN_DTYPE_Q4): groups of 32 along a row, each with its own scale:
 * scale = max |w| / 7 over the group (1 for zeros), q = w / scale rounded
 * to nearest within [-7, 7], stored as the nibble q + 8 (kernels.h has the
 * layout): every weight within
 * half a step of its group's scale. The product widens each weight to
 * (n - 8) * scale in f32, the same multiply in every path.
 */
#ifndef TANDEM_QUANTIZE_H
#define TANDEM_QUANTIZE_H

#include <stdint.h>

#include "kernels.h"

enum quantize_mode {
    QUANTIZE_NONE = 0,
    QUANTIZE_INT8 = 1,
    QUANTIZE_INT4 = 2,
};

/* "none" | "int8" | "int4" -> *out; ERR_INVALID_ARG naming the value
 * otherwise. */
int quantize_mode_parse(const char *name, enum quantize_mode *out, char *err);
const char *quantize_mode_name(enum quantize_mode mode);

/* A [rows][cols] matrix of src_dtype (bf16, f16 or f32) as KERN_DTYPE_Q8:
 * *out (malloc'd, kern_q8_bytes(rows, cols) bytes) holds the values then
 * the scales. ERR_NOMEM; ERR_FORMAT for a NaN or an infinity (naming row
 * and column); ERR_UNSUPPORTED for another dtype. */
int quantize_q8(const void *src, enum kern_dtype src_dtype, int64_t rows, int64_t cols, void **out,
                char *err);
/* The same as KERN_DTYPE_Q4 (kern_q4_bytes(rows, cols) bytes); cols must
 * be a multiple of 32 (ERR_INVALID_ARG). */
int quantize_q4(const void *src, enum kern_dtype src_dtype, int64_t rows, int64_t cols, void **out,
                char *err);

#endif
