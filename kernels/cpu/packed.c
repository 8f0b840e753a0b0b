/* packed.c: see packed.h. Packing and unpacking are plain copies (scalar:
 * they run once per load, or per row an embedding lookup reads); the kernels
 * that read the layout are in matmul_packed.c. */
#include "packed.h"

#include <string.h>

#include "cpu_simd.h"

/* Offset, in 16-bit values from the octet's start, of column k of row a
 * (0..7) of an octet. */
static size_t packed_index(int a, int k)
{
    const int s = k / CPU_PACKED_STEP, within = k % CPU_PACKED_STEP;
    const int line = within / 16, low = (within % 16) / 8, j = within % 8;
    const int dword = (a & 1) * 8 + j;
    /* little endian: the high half of a dword is its second value */
    return (size_t)s * (CPU_PACKED_STEP_BYTES / 2) + (size_t)(a / 2) * 64 + (size_t)line * 32 +
           (size_t)dword * 2 + (low ? 0 : 1);
}

int cpu_packed_supported(enum kern_dtype dtype, long rows, long d_in)
{
#if defined(__AVX512F__) && defined(__AVX512BW__)
    return dtype == KERN_DTYPE_BF16 && rows >= CPU_PACKED_ROWS && d_in >= CPU_PACKED_STEP &&
           d_in % CPU_PACKED_STEP == 0 && d_in <= (1L << 24);
#else
    (void)dtype;
    (void)rows;
    (void)d_in;
    return 0;
#endif
}

int cpu_lines_supported(enum kern_dtype dtype, long rows, long d_in)
{
    return dtype == KERN_DTYPE_BF16 && rows >= CPU_PACKED_ROWS && d_in >= CPU_PACKED_STEP &&
           d_in % CPU_PACKED_STEP == 0 && d_in <= (1L << 24);
}

void cpu_lines_pack(uint16_t *w, int rows, int d_in, uint16_t *tmp)
{
    const size_t octet = (size_t)CPU_PACKED_ROWS * (size_t)d_in;
    for (int b = 0; b < rows / CPU_PACKED_ROWS; b++) {
        uint16_t *o = w + (size_t)b * octet;
        memcpy(tmp, o, octet * sizeof *tmp);
        for (int k0 = 0; k0 < d_in; k0 += CPU_PACKED_STEP)
            for (int a = 0; a < CPU_PACKED_ROWS; a++, o += CPU_PACKED_STEP)
                memcpy(o, tmp + (size_t)a * (size_t)d_in + (size_t)k0,
                       CPU_PACKED_STEP * sizeof *tmp);
    }
}

void cpu_packed_pack(uint16_t *w, int rows, int d_in, uint16_t *tmp)
{
    const size_t octet = (size_t)CPU_PACKED_ROWS * (size_t)d_in;
    for (int b = 0; b < rows / CPU_PACKED_ROWS; b++) {
        uint16_t *o = w + (size_t)b * octet;
        memcpy(tmp, o, octet * sizeof *tmp);
        /* written in order: step, pair, line, dword */
        for (int k0 = 0; k0 < d_in; k0 += CPU_PACKED_STEP)
            for (int a = 0; a < CPU_PACKED_ROWS; a += 2)
                for (int line = 0; line < 2; line++)
                    for (int i = 0; i < 16; i++, o += 2) {
                        const uint16_t *src = tmp + (size_t)(a + i / 8) * (size_t)d_in +
                                              (size_t)(k0 + 16 * line + i % 8);
                        o[0] = src[8]; /* the low half */
                        o[1] = src[0];
                    }
    }
}

void cpu_matrix_row_f32(const void *w, enum kern_dtype dtype, int d_in, int packed_rows,
                        enum cpu_layout layout, long r, float *y)
{
    if (r < packed_rows && layout == CPU_LAYOUT_OCTETS) {
        cpu_packed_row_f32(w, d_in, (int)r, y);
        return;
    }
    if (r < packed_rows && layout == CPU_LAYOUT_LINES) {
        const uint16_t *src = (const uint16_t *)w + cpu_lines_row_offset(layout, packed_rows, d_in, r);
        const size_t step = cpu_lines_step(layout, packed_rows, r);
        for (int k = 0; k < d_in; k += CPU_PACKED_STEP, src += step)
            for (int j = 0; j < CPU_PACKED_STEP; j++)
                y[k + j] = cpu_simd_bf16_to_f32(src[j]);
        return;
    }
    const size_t row = (size_t)r * (size_t)d_in;
    if (dtype == KERN_DTYPE_F32) {
        memcpy(y, (const float *)w + row, (size_t)d_in * sizeof(float));
        return;
    }
    const uint16_t *src = (const uint16_t *)w + row;
    int k = 0;
#ifdef __AVX2__
    for (; k + 8 <= d_in; k += 8)
        _mm256_storeu_ps(y + k, dtype == KERN_DTYPE_BF16 ? cpu_simd_load8_bf16(src + k)
                                                         : cpu_simd_load8_f16(src + k));
#endif
    for (; k < d_in; k++)
        y[k] = dtype == KERN_DTYPE_BF16 ? cpu_simd_bf16_to_f32(src[k]) : cpu_simd_f16_to_f32(src[k]);
}

void cpu_packed_row_f32(const uint16_t *w, int d_in, int r, float *y)
{
    const uint16_t *o = w + (size_t)(r / CPU_PACKED_ROWS) * CPU_PACKED_ROWS * (size_t)d_in;
    const int a = r % CPU_PACKED_ROWS;
    for (int k = 0; k < d_in; k++) {
        const uint32_t bits = (uint32_t)o[packed_index(a, k)] << 16;
        memcpy(&y[k], &bits, sizeof bits);
    }
}
