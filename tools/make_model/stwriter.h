/* stwriter.h: streaming writer of one .safetensors file.
 *
 * What it is: the header (all names, dtypes, shapes and offsets) is written
 * first from the list of tensors, then the tensor bytes are appended in list
 * order by any number of stwriter_append calls, so a multi-gigabyte model is
 * never held in memory. The file is written as "<path>.partial" and renamed
 * to <path> by stwriter_finish once every byte has arrived; a writer
 * destroyed before that removes the partial file.
 * What it is not: a reader (common/model/safetensors.h reads), nor the in-memory
 * writer safetensors_write (same format; this one streams).
 *
 * Format: 8-byte little-endian header length N, then N bytes of JSON
 * {"__metadata__":{"format":"pt"},"<name>":{"dtype":"BF16","shape":[...],
 * "data_offsets":[begin,end]},...} padded with spaces to a multiple of 8,
 * then the data, each tensor right after the previous one.
 */
#ifndef TANDEM_STWRITER_H
#define TANDEM_STWRITER_H

#include <stddef.h>
#include <stdint.h>

#include "safetensors.h" /* struct safetensors_entry (its data field is ignored here) */

struct stwriter;

/* Creates the partial file and writes the header for tensors[0..n). Names
 * are copied. Returns 0, ERR_INVALID_ARG (empty or duplicate name, bad
 * shape), ERR_IO (create/write failed, path named) or ERR_NOMEM. */
int stwriter_create(struct stwriter **out, const char *path,
                    const struct safetensors_entry *tensors, size_t n, char *err);

/* Appends size_bytes of tensor data after the bytes appended so far.
 * ERR_INVALID_ARG if that runs past the total the header announced; ERR_IO on
 * a failed write. Not to be mixed with concurrent stwriter_write_at calls. */
int stwriter_append(struct stwriter *w, const void *data, size_t size_bytes, char *err);

/* Writes size_bytes at data_offset (bytes from the start of the data
 * region, i.e. a tensor's data_offsets[0] plus an offset inside it).
 * Thread-safe: several threads may write disjoint ranges at once (pwrite).
 * Every byte must be written exactly once before stwriter_finish (the writer
 * counts bytes, it does not track ranges). ERR_INVALID_ARG when the range
 * leaves the data region, ERR_IO on a failed write. */
int stwriter_write_at(struct stwriter *w, uint64_t data_offset, const void *data,
                      size_t size_bytes, char *err);

/* Checks that every announced byte was written, flushes, closes and renames
 * the partial file to its final path. The writer stays owned by the caller
 * (destroy it afterwards). ERR_INVALID_ARG (missing bytes), ERR_IO. */
int stwriter_finish(struct stwriter *w, char *err);

/* Frees the writer; removes the partial file unless finish succeeded.
 * NULL-safe. */
void stwriter_destroy(struct stwriter *w);

#endif
