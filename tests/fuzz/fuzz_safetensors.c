/* fuzz_safetensors.c: one .safetensors file from fuzz bytes (the 8-byte
 * header length, the JSON header, the data region) through safetensors_open.
 * On success every tensor is looked up by name and its bytes are read, so
 * ASan checks that each handed-out pointer lies inside the mapping. */
#include "fuzz_common.h"

#include "error.h"
#include "safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[512], err[ERR_MSG_MAX];
    fuzz_write_file("model.safetensors", data, size, path, sizeof path);
    struct safetensors *st = NULL;
    if (safetensors_open(&st, path, err) != 0)
        return 0;
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < safetensors_count(st); i++) {
        const struct safetensors_tensor *t = safetensors_at(st, i);
        if (safetensors_find(st, t->name) != t)
            abort(); /* names are unique and the table sorted */
        if (t->size_bytes > 0) {
            const uint8_t *b = t->data;
            sink ^= b[0] ^ b[t->size_bytes - 1];
        }
        (void)safetensors_expect(st, t->name, t->n_dims, t->shape, NULL, err);
    }
    (void)sink;
    safetensors_close(st);
    return 0;
}
