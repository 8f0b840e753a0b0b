/* read_bw.h: this machine's memory READ bandwidth, the ceiling for a decode
 * step (a decode step reads the weights and writes almost nothing).
 *
 * Not memcpy: a copy also writes (and on most x86 reads the destination
 * before writing it), so "bytes copied / time" is neither the read nor the
 * write ceiling. read_bw_measure() runs vectorised read-only loops (AVX2
 * loads summed into independent accumulators; one stream per thread with
 * and without software prefetch, and four streams per thread) on n_threads
 * threads, each over its own share of a buffer far larger than the caches,
 * and keeps the best pass of each shape and the best shape: the figure is
 * what this machine can read, not what one particular loop reaches. A pass
 * is timed by the readers' own clocks (first start to last end).
 */
#ifndef TANDEM_TOOLS_READ_BW_H
#define TANDEM_TOOLS_READ_BW_H

#include <stddef.h>

struct read_bw_result {
    double read_gbs;    /* best read-only bandwidth, GB/s (1e9 bytes) */
    double memcpy_gbs;  /* best memcpy, (bytes read + bytes written) / time, for reference */
    int n_threads;
    size_t size_bytes;  /* buffer size */
    unsigned long long checksum; /* of what was read: keeps the loops observable */
};

/* Measures with n_threads threads (>= 1) over size_bytes (0: 1 GiB), passes
 * passes per loop shape (0: 5). Returns 0, or -1 with the reason in err
 * (err_size bytes) when memory or threads cannot be had. */
int read_bw_measure(struct read_bw_result *out, int n_threads, size_t size_bytes, int passes,
                    char *err, size_t err_size);

/* The same read-only loops over memory that exists already (regions[i],
 * bytes[i] long, 32-byte aligned; each is read up to a multiple of 256
 * bytes): the n_threads threads split their concatenation into contiguous
 * shares. For a decode step's own weights, whose pages were placed when the
 * model was loaded: a fresh buffer's may sit closer to the cores. memcpy_gbs
 * is not measured (0). */
int read_bw_measure_regions(struct read_bw_result *out, int n_threads, const void *const *regions,
                            const size_t *bytes, int n_regions, int passes, char *err,
                            size_t err_size);

#endif
