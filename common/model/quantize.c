/* quantize.c: see quantize.h. */
#include "quantize.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

int quantize_mode_parse(const char *name, enum quantize_mode *out, char *err)
{
    if (name == NULL || name[0] == '\0' || strcmp(name, "none") == 0)
        *out = QUANTIZE_NONE;
    else if (strcmp(name, "int8") == 0)
        *out = QUANTIZE_INT8;
    else if (strcmp(name, "int4") == 0)
        *out = QUANTIZE_INT4;
    else
        return error_set(err, ERR_INVALID_ARG,
                         "quantize: must be \"none\", \"int8\" or \"int4\", got \"%.32s\"", name);
    return 0;
}

const char *quantize_mode_name(enum quantize_mode mode)
{
    return mode == QUANTIZE_INT8 ? "int8" : mode == QUANTIZE_INT4 ? "int4" : "none";
}

static float to_f32(const void *src, enum kern_dtype dt, size_t i)
{
    uint32_t bits;
    float f;
    if (dt == KERN_DTYPE_F32) {
        memcpy(&f, (const float *)src + i, sizeof f);
        return f;
    }
    const uint16_t h = ((const uint16_t *)src)[i];
    if (dt == KERN_DTYPE_BF16) {
        bits = (uint32_t)h << 16;
    } else { /* f16: exact in f32 */
        const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu,
                       mant = h & 0x3ffu;
        if (exp == 0x1fu)
            bits = sign | 0x7f800000u | (mant << 13);
        else if (exp != 0)
            bits = sign | ((exp + 112u) << 23) | (mant << 13);
        else {
            f = ldexpf((float)mant, -24);
            return sign ? -f : f;
        }
    }
    memcpy(&f, &bits, sizeof f);
    return f;
}

int quantize_q8(const void *src, enum kern_dtype src_dtype, int64_t rows, int64_t cols, void **out,
                char *err)
{
    *out = NULL;
    if (src_dtype != KERN_DTYPE_BF16 && src_dtype != KERN_DTYPE_F16 && src_dtype != KERN_DTYPE_F32)
        return error_set(err, ERR_UNSUPPORTED, "quantize int8: weights of dtype %s",
                         kern_dtype_name(src_dtype));
    char *buf = malloc(kern_q8_bytes(rows, cols));
    if (buf == NULL)
        return error_set(err, ERR_NOMEM, "quantize int8: out of memory for [%lld, %lld]",
                         (long long)rows, (long long)cols);
    int8_t *q = (int8_t *)buf;
    float *scale = (float *)(void *)(buf + kern_q8_scales_offset(rows, cols));
    for (int64_t r = 0; r < rows; r++) {
        const size_t base = (size_t)r * (size_t)cols;
        float amax = 0.0f;
        for (int64_t c = 0; c < cols; c++) {
            const float w = to_f32(src, src_dtype, base + (size_t)c);
            if (!isfinite(w)) {
                free(buf);
                return error_set(err, ERR_FORMAT, "quantize int8: weight [%lld, %lld] is not finite",
                                 (long long)r, (long long)c);
            }
            amax = fabsf(w) > amax ? fabsf(w) : amax;
        }
        const float s = amax > 0.0f ? amax / 127.0f : 1.0f;
        scale[r] = s;
        for (int64_t c = 0; c < cols; c++) {
            float v = roundf(to_f32(src, src_dtype, base + (size_t)c) / s);
            v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
            q[base + (size_t)c] = (int8_t)v;
        }
    }
    memset(buf + (size_t)rows * (size_t)cols, 0, kern_q8_scales_offset(rows, cols) - (size_t)rows * (size_t)cols);
    *out = buf;
    return 0;
}

int quantize_q4(const void *src, enum kern_dtype src_dtype, int64_t rows, int64_t cols, void **out,
                char *err)
{
    *out = NULL;
    if (src_dtype != KERN_DTYPE_BF16 && src_dtype != KERN_DTYPE_F16 && src_dtype != KERN_DTYPE_F32)
        return error_set(err, ERR_UNSUPPORTED, "quantize int4: weights of dtype %s",
                         kern_dtype_name(src_dtype));
    if (cols % KERN_Q4_GROUP != 0)
        return error_set(err, ERR_INVALID_ARG, "quantize int4: rows of %lld columns, not a multiple of %d",
                         (long long)cols, KERN_Q4_GROUP);
    uint8_t *buf = malloc(kern_q4_bytes(rows, cols));
    if (buf == NULL)
        return error_set(err, ERR_NOMEM, "quantize int4: out of memory for [%lld, %lld]",
                         (long long)rows, (long long)cols);
    const size_t groups = (size_t)rows * (size_t)cols / KERN_Q4_GROUP;
    for (size_t g = 0; g < groups; g++) {
        const size_t base = g * KERN_Q4_GROUP;
        uint8_t *grp = buf + g * KERN_Q4_GROUP_BYTES;
        float w[KERN_Q4_GROUP], amax = 0.0f;
        for (int j = 0; j < KERN_Q4_GROUP; j++) {
            w[j] = to_f32(src, src_dtype, base + (size_t)j);
            if (!isfinite(w[j])) {
                free(buf);
                return error_set(err, ERR_FORMAT, "quantize int4: weight [%lld, %lld] is not finite",
                                 (long long)((base + (size_t)j) / (size_t)cols),
                                 (long long)((base + (size_t)j) % (size_t)cols));
            }
            amax = fabsf(w[j]) > amax ? fabsf(w[j]) : amax;
        }
        const float s = amax > 0.0f ? amax / 7.0f : 1.0f;
        memset(grp, 0, KERN_Q4_GROUP / 2);
        for (int j = 0; j < KERN_Q4_GROUP; j++) {
            float v = roundf(w[j] / s);
            v = v > 7.0f ? 7.0f : v < -7.0f ? -7.0f : v;
            const uint8_t nib = (uint8_t)((int)v + 8);
            grp[j % (KERN_Q4_GROUP / 2)] |= (uint8_t)(j < KERN_Q4_GROUP / 2 ? nib : nib << 4);
        }
        memcpy(grp + KERN_Q4_GROUP / 2, &s, sizeof s);
    }
    *out = buf;
    return 0;
}
