/* safetensors.c: validating mmap reader and single-file writer for the
 * safetensors format (https://github.com/huggingface/safetensors).
 *
 * File layout: u64 little-endian N, then N bytes of JSON header (an object
 * mapping tensor names to {"dtype","shape","data_offsets":[begin,end]}, plus
 * an optional "__metadata__" object), then the data region; offsets are
 * relative to the start of the data region.
 *
 * What it is not: a general reader. Only BF16/F16/F32 tensors of at most
 * SAFETENSORS_MAX_DIMS dims are accepted (that is what Llama checkpoints use
 * and what the kernels read); anything else is rejected by name.
 *
 * Invariants once safetensors_open returns 0: every tensor's bytes lie inside
 * its file's data region, no two tensors of a file overlap, size_bytes ==
 * product(shape) * dtype size, data is aligned to the element size, names are
 * unique and the tensor array is sorted by name (safetensors_find bisects).
 */
#include "safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"

/* The format's own limit on the header (the reference implementation refuses
 * larger ones); anything above is a corrupt length, not a real header. */
#define SAFETENSORS_HEADER_MAX_BYTES (100u * 1024u * 1024u)
/* Largest integer a JSON number (a double) holds exactly. */
#define SAFETENSORS_JSON_INT_MAX 9007199254740992.0
/* An index json is a few tens of KiB; refuse absurd ones before reading. */
#define SAFETENSORS_INDEX_MAX_BYTES (64u * 1024u * 1024u)

struct st_file {
    char *path;
    void *map;
    size_t size_bytes;
};

struct st_tensor {
    struct safetensors_tensor pub; /* first: safetensors_at hands out &pub */
    uint64_t begin;                /* data_offsets[0], for overlap messages */
};

struct safetensors {
    char *source; /* path given to safetensors_open */
    struct st_file *files;
    size_t n_files;
    struct st_tensor *tensors;
    size_t n_tensors;
    size_t cap_tensors;
};

/* ---------------------------------------------------------------- helpers */

static char *st_strdup(const char *s)
{
    size_t len = strlen(s) + 1;
    char *copy = malloc(len);
    if (copy)
        memcpy(copy, s, len);
    return copy;
}

static char *st_path_join(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p)
        return NULL;
    memcpy(p, dir, a);
    size_t at = a;
    if (a > 0 && dir[a - 1] != '/')
        p[at++] = '/';
    memcpy(p + at, name, b + 1);
    return p;
}

static int st_dtype_parse(const char *s, enum kern_dtype *out)
{
    if (strcmp(s, "BF16") == 0) {
        *out = KERN_DTYPE_BF16;
        return 0;
    }
    if (strcmp(s, "F16") == 0) {
        *out = KERN_DTYPE_F16;
        return 0;
    }
    if (strcmp(s, "F32") == 0) {
        *out = KERN_DTYPE_F32;
        return 0;
    }
    return -1;
}

static int st_dtype_valid(enum kern_dtype d)
{
    return d == KERN_DTYPE_BF16 || d == KERN_DTYPE_F16 || d == KERN_DTYPE_F32;
}

/* A JSON number that is a non-negative integer exactly representable. */
static int st_json_u64(const cJSON *item, uint64_t *out)
{
    if (!cJSON_IsNumber(item))
        return -1;
    double v = item->valuedouble;
    if (!(v >= 0.0) || v > SAFETENSORS_JSON_INT_MAX || v != (double)(uint64_t)v)
        return -1;
    *out = (uint64_t)v;
    return 0;
}

static void st_shape_format(char *buf, size_t cap, int n_dims, const int64_t *shape)
{
    size_t at = 0;
    int n = snprintf(buf, cap, "[");
    if (n < 0)
        return;
    at = (size_t)n;
    for (int i = 0; i < n_dims && at < cap; i++) {
        n = snprintf(buf + at, cap - at, "%s%" PRId64, i ? ", " : "", shape[i]);
        if (n < 0)
            return;
        at += (size_t)n;
    }
    if (at < cap)
        snprintf(buf + at, cap - at, "]");
}

static int st_tensor_cmp_name(const void *a, const void *b)
{
    const struct st_tensor *x = a, *y = b;
    return strcmp(x->pub.name, y->pub.name);
}

static int st_tensor_cmp_begin(const void *a, const void *b)
{
    const struct st_tensor *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    /* Equal starts: the shorter (possibly empty) range first, so an empty
     * tensor never hides an overlap between two non-empty ones. */
    if (x->pub.size_bytes != y->pub.size_bytes)
        return x->pub.size_bytes < y->pub.size_bytes ? -1 : 1;
    return 0;
}

static int st_push_tensor(struct safetensors *st, struct st_tensor *t, char *err)
{
    if (st->n_tensors == st->cap_tensors) {
        size_t cap = st->cap_tensors ? st->cap_tensors * 2 : 64;
        struct st_tensor *grown = realloc(st->tensors, cap * sizeof(*grown));
        if (!grown)
            return error_set(err, ERR_NOMEM, "safetensors: out of memory for the tensor table");
        st->tensors = grown;
        st->cap_tensors = cap;
    }
    st->tensors[st->n_tensors++] = *t;
    return 0;
}

/* ------------------------------------------------------------ one file */

/* Parses one header entry, the tensor info->string, into t (its name is
 * the caller's to set). data/data_size describe the file's data region. */
static int st_parse_entry(const char *path, const cJSON *info, const unsigned char *data,
                          uint64_t data_size, struct st_tensor *t, char *err)
{
    const char *name = info->string;
    if (!cJSON_IsObject(info))
        return error_set(err, ERR_FORMAT, "%s: tensor %s: header entry is not an object", path,
                         name);

    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(info, "dtype");
    if (!cJSON_IsString(dtype))
        return error_set(err, ERR_FORMAT, "%s: tensor %s: dtype missing or not a string", path,
                         name);
    if (st_dtype_parse(dtype->valuestring, &t->pub.dtype) != 0)
        return error_set(err, ERR_UNSUPPORTED,
                         "%s: tensor %s: dtype %s unsupported (BF16, F16 or F32 only)", path, name,
                         dtype->valuestring);

    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(info, "shape");
    if (!cJSON_IsArray(shape))
        return error_set(err, ERR_FORMAT, "%s: tensor %s: shape missing or not an array", path,
                         name);
    int n_dims = cJSON_GetArraySize(shape);
    if (n_dims > SAFETENSORS_MAX_DIMS)
        return error_set(err, ERR_UNSUPPORTED, "%s: tensor %s: %d dims (at most %d supported)",
                         path, name, n_dims, SAFETENSORS_MAX_DIMS);
    t->pub.n_dims = n_dims;
    uint64_t numel = 1;
    int overflow = 0;
    int d = 0;
    const cJSON *ext;
    cJSON_ArrayForEach(ext, shape)
    {
        uint64_t v;
        if (st_json_u64(ext, &v) != 0)
            return error_set(err, ERR_FORMAT,
                             "%s: tensor %s: shape[%d] is not a non-negative integer", path, name,
                             d);
        t->pub.shape[d++] = (int64_t)v;
        if (v != 0 && numel > UINT64_MAX / v)
            overflow = 1;
        else
            numel *= v;
    }
    if (overflow)
        numel = UINT64_MAX; /* only matters if no extent is 0; caught below */
    for (int i = 0; i < n_dims; i++)
        if (t->pub.shape[i] == 0)
            numel = 0;

    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(info, "data_offsets");
    uint64_t begin, end;
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 ||
        st_json_u64(cJSON_GetArrayItem(offs, 0), &begin) != 0 ||
        st_json_u64(cJSON_GetArrayItem(offs, 1), &end) != 0)
        return error_set(err, ERR_FORMAT,
                         "%s: tensor %s: data_offsets missing or not two non-negative integers",
                         path, name);
    if (begin > end || end > data_size)
        return error_set(err, ERR_FORMAT,
                         "%s: tensor %s: data_offsets [%" PRIu64 ", %" PRIu64
                         "] out of range (data region is %" PRIu64 " bytes)",
                         path, name, begin, end, data_size);

    size_t elem = kern_dtype_size(t->pub.dtype);
    char shape_txt[128];
    st_shape_format(shape_txt, sizeof(shape_txt), n_dims, t->pub.shape);
    if (numel > UINT64_MAX / elem || numel * elem != end - begin)
        return error_set(err, ERR_FORMAT,
                         "%s: tensor %s: %" PRIu64 " bytes at data_offsets but %s %s needs %" PRIu64
                         " x %zu",
                         path, name, end - begin, dtype->valuestring, shape_txt, numel, elem);
    if ((uintptr_t)(data + begin) % elem != 0)
        return error_set(err, ERR_UNSUPPORTED,
                         "%s: tensor %s: data not aligned to its %zu-byte elements", path, name,
                         elem);

    t->pub.data = data + begin;
    t->pub.size_bytes = (size_t)(end - begin);
    t->begin = begin;
    return 0;
}

/* Maps `path`, validates its header and appends its tensors to st. */
/* No two tensors of one file (those from index first on) may share a
 * byte: sorted by start, each non-empty range must begin at or after the
 * end of the previous non-empty one (empty tensors own no bytes). */
static int st_check_no_overlap(struct safetensors *st, size_t first, const char *path, char *err)
{
    size_t n_here = st->n_tensors - first;
    if (n_here > 1)
        qsort(st->tensors + first, n_here, sizeof(*st->tensors), st_tensor_cmp_begin);
    uint64_t max_end = 0;
    const struct st_tensor *max_owner = NULL;
    for (size_t i = first; i < st->n_tensors; i++) {
        const struct st_tensor *cur = &st->tensors[i];
        if (cur->pub.size_bytes == 0)
            continue;
        if (max_owner && cur->begin < max_end)
            return error_set(err, ERR_FORMAT,
                             "%s: tensor %s: data_offsets [%" PRIu64 ", %" PRIu64
                             "] overlap tensor %s [%" PRIu64 ", %" PRIu64 "]",
                             path, cur->pub.name, cur->begin, cur->begin + cur->pub.size_bytes,
                             max_owner->pub.name, max_owner->begin, max_end);
        max_end = cur->begin + cur->pub.size_bytes;
        max_owner = cur;
    }
    return 0;
}

/* Maps path whole (read-only, private) into st's files: 0, or the error.
 * Once added, the mapping is st's (safetensors_close unmaps it). */
static int st_map_file(struct safetensors *st, const char *path, char *err)
{
    struct st_file f = {0};
    int rc;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return error_set_errno(err, errno == ENOENT ? ERR_NOT_FOUND : ERR_IO, errno, "%s: open", path);
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        rc = error_set_errno(err, ERR_IO, errno, "%s: fstat", path);
        close(fd);
        return rc;
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return error_set(err, ERR_FORMAT, "%s: not a regular file", path);
    }
    if (sb.st_size < 8) {
        close(fd);
        return error_set(err, ERR_FORMAT, "%s: truncated: %lld bytes, shorter than the 8-byte header length", path,
                         (long long)sb.st_size);
    }
    f.size_bytes = (size_t)sb.st_size;
    f.map = mmap(NULL, f.size_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    int mmap_errno = errno;
    if (close(fd) != 0 && f.map != MAP_FAILED) {
        rc = error_set_errno(err, ERR_IO, errno, "%s: close", path);
        munmap(f.map, f.size_bytes);
        return rc;
    }
    if (f.map == MAP_FAILED)
        return error_set_errno(err, ERR_SYSTEM, mmap_errno, "%s: mmap", path);
    f.path = st_strdup(path);
    struct st_file *grown = f.path ? realloc(st->files, (st->n_files + 1) * sizeof(*grown)) : NULL;
    if (!grown) {
        munmap(f.map, f.size_bytes);
        free(f.path);
        return error_set(err, ERR_NOMEM, "%s: out of memory", path);
    }
    st->files = grown;
    st->files[st->n_files++] = f;
    return 0;
}

/* The JSON header of the mapped file f: its object in *root (the caller
 * deletes it) and its length in *header_len; 0, or the error. */
static int st_parse_header(const struct st_file *f, cJSON **root, uint64_t *header_len, char *err)
{
    *root = NULL;
    const unsigned char *bytes = f->map;
    uint64_t len = 0;
    for (int i = 7; i >= 0; i--)
        len = (len << 8) | bytes[i];
    const uint64_t after_len = (uint64_t)f->size_bytes - 8;
    if (len > SAFETENSORS_HEADER_MAX_BYTES)
        return error_set(err, ERR_FORMAT, "%s: header length %" PRIu64 " is absurd (limit %u bytes); corrupt file?",
                         f->path, len, SAFETENSORS_HEADER_MAX_BYTES);
    if (len > after_len)
        return error_set(err, ERR_FORMAT,
                         "%s: truncated: header length %" PRIu64 " exceeds the %" PRIu64 " bytes after it", f->path,
                         len, after_len);
    const char *header = (const char *)bytes + 8;
    if (len < 2 || header[0] != '{')
        return error_set(err, ERR_FORMAT, "%s: header does not start with a JSON object", f->path);
    const char *parse_end = NULL;
    cJSON *json = cJSON_ParseWithLengthOpts(header, (size_t)len, &parse_end, 0);
    if (!json) {
        size_t at = parse_end ? (size_t)(parse_end - header) : 0;
        return error_set(err, ERR_FORMAT, "%s: header is not valid JSON (near byte %zu of %" PRIu64 ")", f->path,
                         at, len);
    }
    for (const char *p = parse_end; p < header + len; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            cJSON_Delete(json);
            return error_set(err, ERR_FORMAT, "%s: header has trailing bytes after its JSON object (byte %zu)",
                             f->path, (size_t)(p - header));
        }
    }
    if (!cJSON_IsObject(json)) {
        cJSON_Delete(json);
        return error_set(err, ERR_FORMAT, "%s: header is not a JSON object", f->path);
    }
    *root = json;
    *header_len = len;
    return 0;
}

/* One header entry (name: item) of file f, its data data_size bytes at
 * data: a tensor added to st, or __metadata__ checked and skipped. */
static int st_add_entry(struct safetensors *st, const struct st_file *f, const cJSON *item,
                        const unsigned char *data, uint64_t data_size, char *err)
{
    const char *name = item->string;
    if (!name || name[0] == '\0')
        return error_set(err, ERR_FORMAT, "%s: header has a tensor with an empty name", f->path);
    if (strcmp(name, "__metadata__") == 0) {
        if (!cJSON_IsObject(item) && !cJSON_IsNull(item))
            return error_set(err, ERR_FORMAT, "%s: __metadata__ is not an object", f->path);
        return 0;
    }
    struct st_tensor t;
    memset(&t, 0, sizeof(t));
    int rc = st_parse_entry(f->path, item, data, data_size, &t, err);
    if (rc != 0)
        return rc;
    t.pub.name = st_strdup(name);
    if (!t.pub.name)
        return error_set(err, ERR_NOMEM, "%s: out of memory", f->path);
    t.pub.file_path = f->path;
    rc = st_push_tensor(st, &t, err);
    if (rc != 0)
        free((char *)t.pub.name);
    return rc;
}

static int st_load_file(struct safetensors *st, const char *path, char *err)
{
    const size_t first = st->n_tensors;
    int rc = st_map_file(st, path, err);
    if (rc != 0)
        return rc;
    const struct st_file *f = &st->files[st->n_files - 1];
    cJSON *root = NULL;
    uint64_t header_len = 0;
    if ((rc = st_parse_header(f, &root, &header_len, err)) != 0)
        return rc;
    const unsigned char *data = (const unsigned char *)f->map + 8 + header_len;
    const uint64_t data_size = (uint64_t)f->size_bytes - 8 - header_len;
    const cJSON *item;
    cJSON_ArrayForEach(item, root)
    {
        if ((rc = st_add_entry(st, f, item, data, data_size, err)) != 0)
            break;
    }
    if (rc == 0)
        rc = st_check_no_overlap(st, first, path, err);
    cJSON_Delete(root);
    return rc;
}

/* ------------------------------------------------------------ index json */

static int st_read_small_file(const char *path, size_t limit, char **out, size_t *len, char *err)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return error_set_errno(err, errno == ENOENT ? ERR_NOT_FOUND : ERR_IO, errno, "%s: open",
                               path);
    int rc = 0;
    char *buf = NULL;
    if (fseek(fp, 0, SEEK_END) != 0) {
        rc = error_set_errno(err, ERR_IO, errno, "%s: seek", path);
        goto done;
    }
    long size = ftell(fp);
    if (size < 0) {
        rc = error_set_errno(err, ERR_IO, errno, "%s: ftell", path);
        goto done;
    }
    if ((unsigned long)size > limit) {
        rc = error_set(err, ERR_FORMAT, "%s: %ld bytes, larger than the %zu-byte limit", path,
                       size, limit);
        goto done;
    }
    if (fseek(fp, 0, SEEK_SET) != 0) {
        rc = error_set_errno(err, ERR_IO, errno, "%s: seek", path);
        goto done;
    }
    buf = malloc((size_t)size + 1);
    if (!buf) {
        rc = error_set(err, ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    if (size > 0 && fread(buf, 1, (size_t)size, fp) != (size_t)size) {
        rc = error_set(err, ERR_IO, "%s: short read", path);
        free(buf);
        buf = NULL;
        goto done;
    }
    buf[size] = '\0';
    *out = buf;
    *len = (size_t)size;
done:
    if (fclose(fp) != 0 && rc == 0) {
        free(buf);
        rc = error_set_errno(err, ERR_IO, errno, "%s: close", path);
    }
    return rc;
}

/* A shard name from an index must stay inside the model directory. */
static int st_shard_name_ok(const char *s)
{
    return s[0] != '\0' && strchr(s, '/') == NULL && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

static const struct st_tensor *st_find_internal(const struct safetensors *st, const char *name)
{
    size_t lo = 0, hi = st->n_tensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(name, st->tensors[mid].pub.name);
        if (c == 0)
            return &st->tensors[mid];
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

static int st_sort_and_check_names(struct safetensors *st, char *err)
{
    if (st->n_tensors > 1)
        qsort(st->tensors, st->n_tensors, sizeof(*st->tensors), st_tensor_cmp_name);
    for (size_t i = 1; i < st->n_tensors; i++) {
        const struct st_tensor *a = &st->tensors[i - 1], *b = &st->tensors[i];
        if (strcmp(a->pub.name, b->pub.name) == 0)
            return error_set(err, ERR_FORMAT, "%s: tensor %s: duplicate (also in %s)",
                             b->pub.file_path, b->pub.name, a->pub.file_path);
    }
    return 0;
}

static int st_load_index(struct safetensors *st, const char *dir, const char *index_path,
                         char *err)
{
    char *text = NULL;
    size_t len = 0;
    cJSON *root = NULL;
    char **shards = NULL;
    size_t n_shards = 0;
    int rc = st_read_small_file(index_path, SAFETENSORS_INDEX_MAX_BYTES, &text, &len, err);
    if (rc != 0)
        return rc;
    root = cJSON_ParseWithLength(text, len);
    if (!root) {
        rc = error_set(err, ERR_FORMAT, "%s: not valid JSON", index_path);
        goto done;
    }
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(map)) {
        rc = error_set(err, ERR_FORMAT, "%s: weight_map missing or not an object", index_path);
        goto done;
    }
    size_t n_entries = (size_t)cJSON_GetArraySize(map);
    if (n_entries == 0) {
        rc = error_set(err, ERR_FORMAT, "%s: weight_map is empty", index_path);
        goto done;
    }
    shards = calloc(n_entries, sizeof(*shards));
    if (!shards) {
        rc = error_set(err, ERR_NOMEM, "%s: out of memory", index_path);
        goto done;
    }
    const cJSON *entry;
    cJSON_ArrayForEach(entry, map)
    {
        if (!cJSON_IsString(entry) || !st_shard_name_ok(entry->valuestring)) {
            rc = error_set(err, ERR_FORMAT,
                           "%s: weight_map.%s: not a file name in the model directory",
                           index_path, entry->string ? entry->string : "?");
            goto done;
        }
        size_t k = 0;
        while (k < n_shards && strcmp(shards[k], entry->valuestring) != 0)
            k++;
        if (k == n_shards)
            shards[n_shards++] = entry->valuestring; /* borrowed from root */
    }
    for (size_t k = 0; k < n_shards; k++) {
        char *shard_path = st_path_join(dir, shards[k]);
        if (!shard_path) {
            rc = error_set(err, ERR_NOMEM, "%s: out of memory", index_path);
            goto done;
        }
        rc = st_load_file(st, shard_path, err);
        free(shard_path);
        if (rc != 0)
            goto done;
    }
    rc = st_sort_and_check_names(st, err);
    if (rc != 0)
        goto done;
    /* Every tensor the index promises is where it says. */
    cJSON_ArrayForEach(entry, map)
    {
        const struct st_tensor *t = st_find_internal(st, entry->string);
        const char *slash = t ? strrchr(t->pub.file_path, '/') : NULL;
        const char *base = t ? (slash ? slash + 1 : t->pub.file_path) : NULL;
        if (!t || strcmp(base, entry->valuestring) != 0) {
            rc = error_set(err, ERR_FORMAT, "%s: tensor %s: listed in %s but missing there",
                           index_path, entry->string, entry->valuestring);
            goto done;
        }
    }
done:
    free(shards);
    cJSON_Delete(root);
    free(text);
    return rc;
}

/* ------------------------------------------------------------ public */

int safetensors_open(struct safetensors **out, const char *path, char *err)
{
    *out = NULL;
    if (!path || !path[0])
        return error_set(err, ERR_INVALID_ARG, "safetensors: empty path");
    struct stat sb;
    if (stat(path, &sb) != 0)
        return error_set_errno(err, errno == ENOENT ? ERR_NOT_FOUND : ERR_IO, errno, "%s", path);

    struct safetensors *st = calloc(1, sizeof(*st));
    if (!st)
        return error_set(err, ERR_NOMEM, "%s: out of memory", path);
    st->source = st_strdup(path);
    if (!st->source) {
        free(st);
        return error_set(err, ERR_NOMEM, "%s: out of memory", path);
    }

    int rc;
    if (S_ISDIR(sb.st_mode)) {
        char *index_path = st_path_join(path, "model.safetensors.index.json");
        char *single_path = st_path_join(path, "model.safetensors");
        if (!index_path || !single_path) {
            rc = error_set(err, ERR_NOMEM, "%s: out of memory", path);
        } else if (access(index_path, F_OK) == 0) {
            rc = st_load_index(st, path, index_path, err);
        } else if (access(single_path, F_OK) == 0) {
            rc = st_load_file(st, single_path, err);
            if (rc == 0)
                rc = st_sort_and_check_names(st, err);
        } else {
            rc = error_set(err, ERR_NOT_FOUND,
                           "%s: no model.safetensors or model.safetensors.index.json", path);
        }
        free(index_path);
        free(single_path);
    } else {
        rc = st_load_file(st, path, err);
        if (rc == 0)
            rc = st_sort_and_check_names(st, err);
    }
    if (rc != 0) {
        safetensors_close(st);
        return rc;
    }
    *out = st;
    return 0;
}

void safetensors_close(struct safetensors *st)
{
    if (!st)
        return;
    for (size_t i = 0; i < st->n_tensors; i++)
        free((char *)st->tensors[i].pub.name);
    free(st->tensors);
    for (size_t i = 0; i < st->n_files; i++) {
        munmap(st->files[i].map, st->files[i].size_bytes);
        free(st->files[i].path);
    }
    free(st->files);
    free(st->source);
    free(st);
}

size_t safetensors_count(const struct safetensors *st)
{
    return st ? st->n_tensors : 0;
}

const struct safetensors_tensor *safetensors_at(const struct safetensors *st, size_t index)
{
    if (!st || index >= st->n_tensors)
        return NULL;
    return &st->tensors[index].pub;
}

const struct safetensors_tensor *safetensors_find(const struct safetensors *st, const char *name)
{
    if (!st || !name)
        return NULL;
    const struct st_tensor *t = st_find_internal(st, name);
    return t ? &t->pub : NULL;
}

int safetensors_expect(const struct safetensors *st, const char *name, int n_dims,
                       const int64_t *shape, const struct safetensors_tensor **out, char *err)
{
    if (out)
        *out = NULL;
    const struct safetensors_tensor *t = safetensors_find(st, name);
    if (!t)
        return error_set(err, ERR_NOT_FOUND, "%s: tensor %s: missing", st ? st->source : "?",
                         name);
    int same = t->n_dims == n_dims;
    for (int i = 0; same && i < n_dims; i++)
        same = t->shape[i] == shape[i];
    if (!same) {
        char have[128], want[128];
        st_shape_format(have, sizeof(have), t->n_dims, t->shape);
        st_shape_format(want, sizeof(want), n_dims, shape);
        return error_set(err, ERR_MISMATCH, "%s: tensor %s: shape %s expected %s", t->file_path,
                         name, have, want);
    }
    if (out)
        *out = t;
    return 0;
}

/* ------------------------------------------------------------ writer */

struct st_buf {
    char *data;
    size_t len, cap;
};

static int st_buf_put(struct st_buf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (b->len + n + 1 > cap)
            cap *= 2;
        char *grown = realloc(b->data, cap);
        if (!grown)
            return -1;
        b->data = grown;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

static int st_buf_puts(struct st_buf *b, const char *s)
{
    return st_buf_put(b, s, strlen(s));
}

static int st_buf_json_string(struct st_buf *b, const char *s)
{
    if (st_buf_put(b, "\"", 1) != 0)
        return -1;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char esc[8];
        if (*p == '"' || *p == '\\') {
            esc[0] = '\\';
            esc[1] = (char)*p;
            if (st_buf_put(b, esc, 2) != 0)
                return -1;
        } else if (*p < 0x20) {
            snprintf(esc, sizeof(esc), "\\u%04x", *p);
            if (st_buf_put(b, esc, 6) != 0)
                return -1;
        } else if (st_buf_put(b, (const char *)p, 1) != 0) {
            return -1;
        }
    }
    return st_buf_put(b, "\"", 1);
}

/* Builds the header text (unpadded) and each entry's byte size. */
static int st_write_header(struct st_buf *b, const struct safetensors_entry *entries, size_t n,
                           uint64_t *sizes, const char *path, char *err)
{
    if (st_buf_puts(b, "{\"__metadata__\":{\"format\":\"pt\"}") != 0)
        return error_set(err, ERR_NOMEM, "%s: out of memory", path);
    uint64_t offset = 0;
    for (size_t i = 0; i < n; i++) {
        const struct safetensors_entry *e = &entries[i];
        if (!e->name || !e->name[0] || strcmp(e->name, "__metadata__") == 0)
            return error_set(err, ERR_INVALID_ARG, "%s: entry %zu: bad tensor name", path, i);
        for (size_t j = 0; j < i; j++)
            if (strcmp(entries[j].name, e->name) == 0)
                return error_set(err, ERR_INVALID_ARG, "%s: tensor %s: duplicate name", path,
                                 e->name);
        if (!st_dtype_valid(e->dtype))
            return error_set(err, ERR_INVALID_ARG, "%s: tensor %s: invalid dtype %d", path,
                             e->name, (int)e->dtype);
        if (e->n_dims < 0 || e->n_dims > SAFETENSORS_MAX_DIMS)
            return error_set(err, ERR_INVALID_ARG, "%s: tensor %s: n_dims %d not in 0..%d", path,
                             e->name, e->n_dims, SAFETENSORS_MAX_DIMS);
        size_t elem = kern_dtype_size(e->dtype);
        uint64_t bytes = elem;
        for (int d = 0; d < e->n_dims; d++) {
            int64_t x = e->shape[d];
            if (x < 0 || (double)x > SAFETENSORS_JSON_INT_MAX)
                return error_set(err, ERR_INVALID_ARG, "%s: tensor %s: shape[%d] = %" PRId64
                                 " out of range", path, e->name, d, x);
            if (x != 0 && bytes > (uint64_t)SAFETENSORS_JSON_INT_MAX / (uint64_t)x)
                return error_set(err, ERR_INVALID_ARG, "%s: tensor %s: too large", path,
                                 e->name);
            bytes *= (uint64_t)x;
        }
        if (bytes > 0 && !e->data)
            return error_set(err, ERR_INVALID_ARG, "%s: tensor %s: data is NULL", path, e->name);
        if (offset % elem != 0)
            return error_set(err, ERR_INVALID_ARG,
                             "%s: tensor %s: would start at byte %" PRIu64
                             ", not aligned to its %zu-byte elements (order wider dtypes first)",
                             path, e->name, offset, elem);
        sizes[i] = bytes;
        char num[160];
        int ok = st_buf_puts(b, ",") == 0 && st_buf_json_string(b, e->name) == 0 &&
                 st_buf_puts(b, ":{\"dtype\":\"") == 0 &&
                 st_buf_puts(b, kern_dtype_name(e->dtype)) == 0 &&
                 st_buf_puts(b, "\",\"shape\":[") == 0;
        for (int d = 0; ok && d < e->n_dims; d++) {
            snprintf(num, sizeof(num), "%s%" PRId64, d ? "," : "", e->shape[d]);
            ok = st_buf_puts(b, num) == 0;
        }
        snprintf(num, sizeof(num), "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", offset,
                 offset + bytes);
        if (!ok || st_buf_puts(b, num) != 0)
            return error_set(err, ERR_NOMEM, "%s: out of memory", path);
        offset += bytes;
    }
    if (st_buf_puts(b, "}") != 0)
        return error_set(err, ERR_NOMEM, "%s: out of memory", path);
    /* Pad with spaces so the data region starts 8-byte aligned. */
    while ((8 + b->len) % 8 != 0)
        if (st_buf_puts(b, " ") != 0)
            return error_set(err, ERR_NOMEM, "%s: out of memory", path);
    return 0;
}

int safetensors_write(const char *path, const struct safetensors_entry *entries, size_t n,
                      char *err)
{
    if (!path || !path[0])
        return error_set(err, ERR_INVALID_ARG, "safetensors_write: empty path");
    if (n > 0 && !entries)
        return error_set(err, ERR_INVALID_ARG, "%s: entries is NULL", path);
    struct st_buf b = {0};
    uint64_t *sizes = calloc(n ? n : 1, sizeof(*sizes));
    if (!sizes)
        return error_set(err, ERR_NOMEM, "%s: out of memory", path);
    int rc = st_write_header(&b, entries, n, sizes, path, err);
    if (rc != 0) {
        free(sizes);
        free(b.data);
        return rc;
    }

    FILE *fp = fopen(path, "wb");
    if (!fp) {
        rc = error_set_errno(err, ERR_IO, errno, "%s: create", path);
        goto done;
    }
    unsigned char len_le[8];
    uint64_t header_len = b.len;
    for (int i = 0; i < 8; i++)
        len_le[i] = (unsigned char)(header_len >> (8 * i));
    int ok = fwrite(len_le, 1, 8, fp) == 8 && fwrite(b.data, 1, b.len, fp) == b.len;
    for (size_t i = 0; ok && i < n; i++)
        if (sizes[i] > 0)
            ok = fwrite(entries[i].data, 1, (size_t)sizes[i], fp) == (size_t)sizes[i];
    int write_errno = errno;
    if (fclose(fp) != 0 && ok) {
        ok = 0;
        write_errno = errno;
    }
    if (!ok) {
        rc = error_set_errno(err, ERR_IO, write_errno, "%s: write", path);
        unlink(path);
    }
done:
    free(sizes);
    free(b.data);
    return rc;
}
