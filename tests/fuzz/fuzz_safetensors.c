/* fuzz_safetensors.c: one .safetensors file from fuzz bytes (the 8-byte
 * header length, the JSON header, the data region) through safetensors_open.
 * A set that opens is held to the promises of safetensors.h
 * (fuzz_safetensors_check.h: sizes, alignment, no overlap, sorted names). */
#include "fuzz_common.h"
#include "fuzz_safetensors_check.h"

#include "error.h"
#include "safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[512], err[ERR_MSG_MAX];
    fuzz_write_file("model.safetensors", data, size, path, sizeof path);
    struct safetensors *st = NULL;
    if (safetensors_open(&st, path, err) != 0)
        return 0;
    fuzz_safetensors_check(st);
    safetensors_close(st);
    return 0;
}
