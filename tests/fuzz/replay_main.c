/* replay_main.c: runs a fuzz target's LLVMFuzzerTestOneInput on files, without
 * libFuzzer, so the ordinary build (gcc, ASan + UBSan under scripts/test.sh)
 * replays the seed corpus and every crash that was ever found and fixed.
 *
 *   fuzz_replay_<target> PATH...
 *
 * Each PATH is a file or a directory whose regular files (not recursive,
 * dot files skipped) are each fed once, in name order, as one input. A
 * missing directory counts as empty (a target may have no regressions yet).
 * Exits 0 when every input ran (a crash aborts the process with the
 * sanitizer's report), 1 when a file could not be read or no input was
 * found at all.
 */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
        return -1;
    }
    size_t cap = 4096, len = 0;
    uint8_t *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            fclose(f);
            fprintf(stderr, "replay: %s: out of memory\n", path);
            return -1;
        }
        len += fread(buf + len, 1, cap - len, f);
        if (len < cap)
            break;
        cap *= 2;
        uint8_t *grown = realloc(buf, cap);
        if (!grown)
            free(buf);
        buf = grown;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        fprintf(stderr, "replay: %s: read error\n", path);
        return -1;
    }
    /* An exact-size copy, as libFuzzer passes it: ASan then catches a read
     * one byte past the input. */
    uint8_t *exact = malloc(len > 0 ? len : 1);
    if (!exact) {
        free(buf);
        return -1;
    }
    memcpy(exact, buf, len);
    free(buf);
    fprintf(stderr, "replay: %s (%zu bytes)\n", path, len);
    LLVMFuzzerTestOneInput(exact, len);
    free(exact);
    return 0;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Returns the number of inputs run, or -1. */
static int replay_path(const char *path)
{
    struct stat sb;
    if (stat(path, &sb) != 0)
        return errno == ENOENT ? 0 : -1;
    if (!S_ISDIR(sb.st_mode))
        return replay_file(path) == 0 ? 1 : -1;
    DIR *d = opendir(path);
    if (!d)
        return -1;
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            char **grown = realloc(names, cap * sizeof *names);
            if (!grown)
                break;
            names = grown;
        }
        size_t len = strlen(path) + strlen(e->d_name) + 2;
        names[n] = malloc(len);
        if (!names[n])
            break;
        snprintf(names[n], len, "%s/%s", path, e->d_name);
        n++;
    }
    closedir(d);
    if (n > 1)
        qsort(names, n, sizeof *names, cmp_names);
    int count = 0;
    for (size_t i = 0; i < n; i++) {
        if (stat(names[i], &sb) == 0 && S_ISREG(sb.st_mode)) {
            if (count >= 0 && replay_file(names[i]) == 0)
                count++;
            else
                count = -1;
        }
        free(names[i]);
    }
    free(names);
    return count;
}

int main(int argc, char **argv)
{
    int total = 0;
    for (int i = 1; i < argc; i++) {
        int n = replay_path(argv[i]);
        if (n < 0) {
            fprintf(stderr, "replay: %s: could not be read\n", argv[i]);
            return 1;
        }
        total += n;
    }
    if (total == 0) {
        fprintf(stderr, "replay: no inputs found\n");
        return 1;
    }
    printf("replay: %d inputs ran\n", total);
    return 0;
}
