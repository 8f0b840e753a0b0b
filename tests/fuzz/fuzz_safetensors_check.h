/* fuzz_safetensors_check.h: the promises of safetensors.h, checked on an
 * opened set by the two safetensors targets. The data lives in a mapping,
 * which ASan does not track, so reading a tensor's bytes catches only gross
 * errors; the checks below catch a wrong offset or size directly: the dtype
 * is one of the three accepted, size_bytes is product(shape) * dtype size,
 * data is aligned to the element, names are unique and sorted, and no two
 * non-empty tensors of one file share a byte. */
#ifndef TANDEM_FUZZ_SAFETENSORS_CHECK_H
#define TANDEM_FUZZ_SAFETENSORS_CHECK_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "kernels.h"
#include "safetensors.h"

static inline int fuzz_st_cmp_data(const void *a, const void *b)
{
    const struct safetensors_tensor *x = *(const struct safetensors_tensor *const *)a;
    const struct safetensors_tensor *y = *(const struct safetensors_tensor *const *)b;
    int c = strcmp(x->file_path, y->file_path);
    if (c)
        return c;
    return (uintptr_t)x->data < (uintptr_t)y->data ? -1 : (uintptr_t)x->data > (uintptr_t)y->data;
}

static inline void fuzz_safetensors_check(const struct safetensors *st)
{
    size_t n = safetensors_count(st);
    const struct safetensors_tensor **by_data = calloc(n ? n : 1, sizeof *by_data);
    if (!by_data)
        return;
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < n; i++) {
        const struct safetensors_tensor *t = safetensors_at(st, i);
        if (!t || !t->name || !t->file_path || safetensors_find(st, t->name) != t)
            abort();
        if (i > 0 && strcmp(safetensors_at(st, i - 1)->name, t->name) >= 0)
            abort(); /* sorted, unique */
        if (t->dtype != KERN_DTYPE_BF16 && t->dtype != KERN_DTYPE_F16 && t->dtype != KERN_DTYPE_F32)
            abort();
        if (t->n_dims < 0 || t->n_dims > SAFETENSORS_MAX_DIMS)
            abort();
        size_t elem = kern_dtype_size(t->dtype);
        uint64_t bytes = elem;
        int zero = 0;
        for (int d = 0; d < SAFETENSORS_MAX_DIMS; d++) {
            if (t->shape[d] < 0 || (d >= t->n_dims && t->shape[d] != 0))
                abort();
            if (d >= t->n_dims)
                continue;
            uint64_t v = (uint64_t)t->shape[d];
            zero |= v == 0;
            if (!zero && bytes > UINT64_MAX / v)
                abort(); /* a tensor this large cannot be in the file */
            bytes = zero ? 0 : bytes * v;
        }
        if (bytes != t->size_bytes)
            abort();
        if ((uintptr_t)t->data % elem != 0)
            abort();
        if (t->size_bytes > 0) {
            const uint8_t *b = t->data;
            sink ^= b[0] ^ b[t->size_bytes - 1];
        }
        char err[ERR_MSG_MAX];
        if (safetensors_expect(st, t->name, t->n_dims, t->shape, NULL, err) != 0)
            abort();
        by_data[i] = t;
    }
    (void)sink;
    if (n > 1)
        qsort(by_data, n, sizeof *by_data, fuzz_st_cmp_data);
    const struct safetensors_tensor *prev = NULL;
    for (size_t i = 0; i < n; i++) {
        const struct safetensors_tensor *t = by_data[i];
        if (t->size_bytes == 0)
            continue;
        if (prev && strcmp(prev->file_path, t->file_path) == 0 &&
            (uintptr_t)prev->data + prev->size_bytes > (uintptr_t)t->data)
            abort(); /* overlap */
        prev = t;
    }
    free(by_data);
}

#endif
