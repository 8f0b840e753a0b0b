/* fuzz_common.h: helpers shared by the fuzz targets (tests/fuzz/fuzz_*.c).
 *
 * Each target defines LLVMFuzzerTestOneInput and is linked two ways: with
 * libFuzzer (clang, TANDEM_FUZZ=ON, scripts/fuzz.sh) and with replay_main.c
 * (any compiler, the ordinary CTest suite, which feeds it every file of the
 * target's corpus/ and regressions/). So nothing here may depend on libFuzzer.
 *
 * The loaders of model files take paths, so those targets write the input
 * to a private temporary directory (made once per process, removed at exit;
 * under $TMPDIR, else /dev/shm, else /tmp).
 * A target aborts only on a broken invariant of the code under test (an
 * oracle such as decode(encode(text)) == text), never on a rejected input.
 */
#ifndef TANDEM_FUZZ_COMMON_H
#define TANDEM_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_MAX_FILES 8

static char fuzz_dir_path[256];
static char fuzz_file_names[FUZZ_MAX_FILES][64];
static int fuzz_n_file_names;

static inline void fuzz_dir_remove(void)
{
    char path[512];
    for (int i = 0; i < fuzz_n_file_names; i++) {
        snprintf(path, sizeof path, "%.255s/%.63s", fuzz_dir_path, fuzz_file_names[i]);
        unlink(path);
    }
    rmdir(fuzz_dir_path);
}

/* The process's scratch directory (created on first use); aborts when it
 * cannot be made: that is the machine, not the input. */
static inline const char *fuzz_dir(void)
{
    if (fuzz_dir_path[0])
        return fuzz_dir_path;
    /* Memory-backed by preference: a file per input on disk makes the
     * file-based targets ten times slower. */
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !tmp[0])
        tmp = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(fuzz_dir_path, sizeof fuzz_dir_path, "%s/tandem-fuzz-XXXXXX", tmp);
    if (!mkdtemp(fuzz_dir_path)) {
        perror("fuzz: mkdtemp");
        abort();
    }
    atexit(fuzz_dir_remove);
    return fuzz_dir_path;
}

/* Writes data[0..size) to <fuzz_dir>/<name> (replacing it) and returns the
 * full path in path_out. name must be one of at most FUZZ_MAX_FILES names
 * used by the target (they are removed at exit). */
static inline void fuzz_write_file(const char *name, const uint8_t *data, size_t size, char *path_out,
                            size_t path_cap)
{
    snprintf(path_out, path_cap, "%s/%s", fuzz_dir(), name);
    int known = 0;
    for (int i = 0; i < fuzz_n_file_names; i++)
        known |= strcmp(fuzz_file_names[i], name) == 0;
    if (!known && fuzz_n_file_names < FUZZ_MAX_FILES)
        snprintf(fuzz_file_names[fuzz_n_file_names++], sizeof fuzz_file_names[0], "%s", name);
    FILE *f = fopen(path_out, "wb");
    if (!f || (size > 0 && fwrite(data, 1, size, f) != size) || fclose(f) != 0) {
        perror("fuzz: writing the input file");
        abort();
    }
}

/* Removes <fuzz_dir>/<name> if present. */
static inline void fuzz_remove_file(const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", fuzz_dir(), name);
    unlink(path);
}

/* Splits data at each occurrence of sep (not included in the parts). At most
 * max_parts parts; the last part takes the rest. Returns the number of parts
 * (>= 1). */
static inline int fuzz_split(const uint8_t *data, size_t size, const char *sep, const uint8_t **parts,
                      size_t *sizes, int max_parts)
{
    size_t sep_len = strlen(sep);
    int n = 0;
    const uint8_t *p = data;
    size_t left = size;
    while (n < max_parts - 1) {
        const uint8_t *hit = NULL;
        for (size_t i = 0; sep_len <= left && i + sep_len <= left; i++) {
            if (memcmp(p + i, sep, sep_len) == 0) {
                hit = p + i;
                break;
            }
        }
        if (!hit)
            break;
        parts[n] = p;
        sizes[n] = (size_t)(hit - p);
        n++;
        left -= sizes[n - 1] + sep_len;
        p = hit + sep_len;
    }
    parts[n] = p;
    sizes[n] = left;
    return n + 1;
}

#endif
