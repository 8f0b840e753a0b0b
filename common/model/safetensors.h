/* safetensors.h: read-only, memory-mapped access to HuggingFace .safetensors
 * files (one file or a sharded set with model.safetensors.index.json), and a
 * writer for single files.
 *
 * What it is: a validating loader. Every header field is checked against the
 * file before any pointer is handed out: the 8-byte little-endian header
 * length, the JSON header, each tensor's dtype, shape and data_offsets
 * (inside the data region, no two tensors overlapping, byte length equal to
 * product(shape) * dtype size, aligned to the element size). A bad file gives
 * one error line naming the file (and the tensor), never a crash.
 * What it is not: a converter. Tensor data is used in place from the mapping
 * (no copy); only BF16, F16 and F32 are accepted.
 *
 * Invariants: tensors are kept sorted by name; names are unique across all
 * shards; data pointers stay valid until safetensors_close.
 */
#ifndef TANDEM_SAFETENSORS_H
#define TANDEM_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels.h" /* enum kern_dtype */

#define SAFETENSORS_MAX_DIMS 4

/* One tensor of an open set. All pointers are owned by the set. */
struct safetensors_tensor {
    const char *name;
    enum kern_dtype dtype;
    int n_dims;                              /* 0..SAFETENSORS_MAX_DIMS */
    int64_t shape[SAFETENSORS_MAX_DIMS];     /* unused trailing extents are 0 */
    const void *data;                        /* read-only, inside the mapping */
    size_t size_bytes;                       /* product(shape) * dtype size */
    const char *file_path;                   /* the file that holds it */
};

struct safetensors; /* opaque: one or more mmapped files */

/* Opens `path`: a model directory (model.safetensors.index.json and its
 * shards, or else model.safetensors) or a single .safetensors file. The
 * files stay mapped until safetensors_close.
 * Returns 0 and *out, or ERR_NOT_FOUND (no such file/directory, nothing
 * loadable in the directory), ERR_IO / ERR_SYSTEM (read or mmap failed),
 * ERR_FORMAT (truncated file, bad header length, malformed JSON, bad or
 * overlapping offsets, byte length mismatch, duplicate tensor),
 * ERR_UNSUPPORTED (dtype other than BF16/F16/F32, more than 4 dims),
 * ERR_NOMEM. The message in err names the file and, where there is one, the
 * tensor. */
int safetensors_open(struct safetensors **out, const char *path, char *err);

/* Unmaps every file and frees the set. NULL-safe. */
void safetensors_close(struct safetensors *st);

/* Number of tensors across all files. */
size_t safetensors_count(const struct safetensors *st);

/* Tensor by index (0 .. count-1, in name order); NULL when out of range. */
const struct safetensors_tensor *safetensors_at(const struct safetensors *st, size_t index);

/* Tensor by exact name; NULL if absent. */
const struct safetensors_tensor *safetensors_find(const struct safetensors *st, const char *name);

/* Finds `name` and checks n_dims and each extent against shape[0..n_dims-1].
 * On success stores the tensor in *out (when out is not NULL) and returns 0.
 * ERR_NOT_FOUND when absent, ERR_MISMATCH when the shape differs; errors name
 * the file and tensor, e.g.
 * "model.safetensors: tensor model.layers.3.mlp.up_proj.weight: shape [8192, 2048] expected [8192, 3072]" */
int safetensors_expect(const struct safetensors *st, const char *name, int n_dims,
                       const int64_t *shape, const struct safetensors_tensor **out, char *err);

/* One tensor to write. data holds product(shape) * dtype size bytes (may be
 * NULL only when that is 0). */
struct safetensors_entry {
    const char *name;
    enum kern_dtype dtype;
    int n_dims;
    int64_t shape[SAFETENSORS_MAX_DIMS];
    const void *data;
};

/* Writes one .safetensors file at `path` (replaced if it exists): the header
 * holds {"__metadata__":{"format":"pt"}} and the entries in the given order,
 * padded with spaces to a multiple of 8 bytes; the data follows, each tensor
 * right after the previous one. Names must be non-empty and unique.
 * Returns 0, ERR_INVALID_ARG (bad entry, named), ERR_IO (create/write
 * failed; a partial file is removed) or ERR_NOMEM. */
int safetensors_write(const char *path, const struct safetensors_entry *entries, size_t n,
                      char *err);

#endif
