/* fuzz_safetensors_index.c: a sharded model directory from fuzz bytes.
 *
 * Input: parts separated by the line "\n--shard--\n": the first part is
 * model.safetensors.index.json, the next ones are the shard files a.safetensors,
 * b.safetensors and c.safetensors (absent when there are fewer parts). The
 * directory is opened with safetensors_open, which reads the index, maps each
 * shard it names and checks that every tensor it promises is there. */
#include "fuzz_common.h"
#include "fuzz_safetensors_check.h"

#include "error.h"
#include "safetensors.h"

static const char *const shard_names[] = {"a.safetensors", "b.safetensors", "c.safetensors"};
#define N_SHARDS (int)(sizeof shard_names / sizeof shard_names[0])

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *parts[1 + N_SHARDS];
    size_t sizes[1 + N_SHARDS];
    int n = fuzz_split(data, size, "\n--shard--\n", parts, sizes, 1 + N_SHARDS);
    char path[512], err[ERR_MSG_MAX];
    fuzz_write_file("model.safetensors.index.json", parts[0], sizes[0], path, sizeof path);
    for (int i = 0; i < N_SHARDS; i++) {
        if (1 + i < n)
            fuzz_write_file(shard_names[i], parts[1 + i], sizes[1 + i], path, sizeof path);
        else
            fuzz_remove_file(shard_names[i]);
    }
    struct safetensors *st = NULL;
    if (safetensors_open(&st, fuzz_dir(), err) != 0)
        return 0;
    fuzz_safetensors_check(st);
    safetensors_close(st);
    return 0;
}
