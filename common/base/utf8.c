/* utf8.c: UTF-8 validation, repair and decoding by the Unicode rules
 * (Table 3-7 of the standard: no overlongs, no surrogates, nothing past
 * U+10FFFF), shared by the tokenizer, the detokenizer and every place that
 * must keep text it echoes valid. See utf8.h.
 */
#include "utf8.h"

#include <string.h>

/* Length of the valid UTF-8 sequence at s[0..n), or 0 if invalid there. */
size_t utf8_valid_len(const uint8_t *s, size_t n)
{
    uint8_t b = s[0];
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF;
    if (b < 0x80)
        return 1;
    if (b >= 0xC2 && b <= 0xDF) {
        need = 1;
    } else if (b >= 0xE0 && b <= 0xEF) {
        need = 2;
        if (b == 0xE0)
            lo = 0xA0;
        if (b == 0xED)
            hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
        need = 3;
        if (b == 0xF0)
            lo = 0x90;
        if (b == 0xF4)
            hi = 0x8F;
    } else {
        return 0;
    }
    if (n < need + 1)
        return 0;
    for (size_t k = 1; k <= need; k++) {
        if (s[k] < lo || s[k] > hi)
            return 0;
        lo = 0x80;
        hi = 0xBF;
    }
    return need + 1;
}

/* Lead byte -> number of continuation bytes and the range of the first. */
static int utf8_lead(uint8_t b, size_t *need, uint8_t *lo, uint8_t *hi)
{
    *lo = 0x80;
    *hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) {
        *need = 1;
    } else if (b >= 0xE0 && b <= 0xEF) {
        *need = 2;
        if (b == 0xE0)
            *lo = 0xA0;
        if (b == 0xED)
            *hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
        *need = 3;
        if (b == 0xF0)
            *lo = 0x90;
        if (b == 0xF4)
            *hi = 0x8F;
    } else {
        return 0;
    }
    return 1;
}

size_t utf8_repair(const uint8_t *in, size_t n, uint8_t *out)
{
    size_t i = 0, o = 0;
    while (i < n) {
        uint8_t b = in[i];
        size_t need;
        uint8_t lo, hi;
        if (b < 0x80) {
            out[o++] = b;
            i++;
            continue;
        }
        if (!utf8_lead(b, &need, &lo, &hi)) {
            out[o++] = 0xEF, out[o++] = 0xBF, out[o++] = 0xBD;
            i++;
            continue;
        }
        size_t j = i + 1, k = 0;
        while (k < need && j < n && in[j] >= lo && in[j] <= hi) {
            j++;
            k++;
            lo = 0x80;
            hi = 0xBF;
        }
        if (k == need) {
            memcpy(out + o, in + i, j - i);
            o += j - i;
        } else {
            out[o++] = 0xEF, out[o++] = 0xBF, out[o++] = 0xBD;
        }
        i = j;
    }
    return o;
}

int utf8_valid(const uint8_t *in, size_t n, size_t *bad_offset)
{
    for (size_t i = 0; i < n;) {
        size_t l = utf8_valid_len(in + i, n - i);
        if (l == 0) {
            if (bad_offset)
                *bad_offset = i;
            return 0;
        }
        i += l;
    }
    return 1;
}

size_t utf8_incomplete_tail(const uint8_t *in, size_t n)
{
    for (size_t t = 1; t <= 3 && t <= n; t++) {
        size_t start = n - t, need;
        uint8_t lo, hi;
        if (!utf8_lead(in[start], &need, &lo, &hi))
            continue;
        if (need < t) /* a complete (or over-long) sequence: nothing held */
            return 0;
        for (size_t j = start + 1; j < n; j++) {
            if (in[j] < lo || in[j] > hi)
                return 0;
            lo = 0x80;
            hi = 0xBF;
        }
        return t;
    }
    return 0;
}

/* Decodes one code point of a string known to be valid UTF-8 (cJSON output). */
uint32_t utf8_next_cp(const uint8_t *s, size_t n, size_t *adv)
{
    size_t l = utf8_valid_len(s, n);
    if (l == 0) {
        *adv = 1;
        return 0xFFFFFFFFu;
    }
    *adv = l;
    if (l == 1)
        return s[0];
    if (l == 2)
        return ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
    if (l == 3)
        return ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    return ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
           ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
}

size_t utf8_cut_len(const uint8_t *s, size_t n, size_t max)
{
    size_t i = 0;
    while (i < n) {
        size_t l = utf8_valid_len(s + i, n - i);
        if (l == 0)
            l = 1;
        if (l > max - i)
            break;
        i += l;
    }
    return i;
}
