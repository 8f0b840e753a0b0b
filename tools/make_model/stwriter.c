/* stwriter.c: streaming safetensors writer (see stwriter.h). */
#include "stwriter.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "error.h"
#include "kernels.h"

struct stwriter {
    int fd;             /* -1 when closed */
    char *path;         /* final path */
    char *partial_path; /* path + ".partial" while writing */
    uint64_t data_start; /* file offset of the data region: 8 + header length */
    uint64_t data_total_bytes;
    uint64_t append_pos; /* next stwriter_append offset */
    _Atomic uint64_t data_written_bytes;
    int created;  /* the partial file exists and is ours */
    int finished;
};

/* Growable text buffer for the JSON header. */
struct stwriter_text {
    char *buf;
    size_t len, cap;
};

static int text_append(struct stwriter_text *t, const char *s, size_t n)
{
    if (t->len + n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 4096;
        while (t->len + n + 1 > cap)
            cap *= 2;
        char *nb = realloc(t->buf, cap);
        if (!nb)
            return -1;
        t->buf = nb;
        t->cap = cap;
    }
    memcpy(t->buf + t->len, s, n);
    t->len += n;
    t->buf[t->len] = '\0';
    return 0;
}

static int text_str(struct stwriter_text *t, const char *s)
{
    return text_append(t, s, strlen(s));
}

static const char *dtype_tag(enum kern_dtype d)
{
    switch (d) {
    case KERN_DTYPE_BF16: return "BF16";
    case KERN_DTYPE_F16: return "F16";
    case KERN_DTYPE_F32: return "F32";
    case KERN_DTYPE_Q8:
    case KERN_DTYPE_Q4: break; /* not a safetensors dtype */
    }
    return NULL;
}

/* Tensor names go into JSON: allow printable ASCII other than quote and
 * backslash, which is every name a HF Llama checkpoint uses. */
static int name_ok(const char *s)
{
    if (!s || !*s)
        return 0;
    for (; *s; s++)
        if (*s < 0x20 || *s > 0x7E || *s == '"' || *s == '\\')
            return 0;
    return 1;
}

static int build_header(struct stwriter_text *t, const struct safetensors_entry *tensors,
                        size_t n, uint64_t *total_bytes, char *err)
{
    char num[64];
    uint64_t off = 0;
    if (text_str(t, "{\"__metadata__\":{\"format\":\"pt\"}"))
        return error_set(err, ERR_NOMEM, "safetensors header: out of memory");
    for (size_t i = 0; i < n; i++) {
        const struct safetensors_entry *e = &tensors[i];
        const char *tag = dtype_tag(e->dtype);
        if (!name_ok(e->name))
            return error_set(err, ERR_INVALID_ARG, "safetensors entry %zu: bad name", i);
        for (size_t k = 0; k < i; k++)
            if (strcmp(tensors[k].name, e->name) == 0)
                return error_set(err, ERR_INVALID_ARG, "tensor %s: duplicate name", e->name);
        if (!tag)
            return error_set(err, ERR_INVALID_ARG, "tensor %s: bad dtype", e->name);
        if (e->n_dims < 0 || e->n_dims > SAFETENSORS_MAX_DIMS)
            return error_set(err, ERR_INVALID_ARG, "tensor %s: n_dims %d", e->name, e->n_dims);
        uint64_t count = 1;
        int bad = 0;
        if (text_str(t, ",\"") || text_str(t, e->name) || text_str(t, "\":{\"dtype\":\"") ||
            text_str(t, tag) || text_str(t, "\",\"shape\":["))
            bad = 1;
        for (int d = 0; d < e->n_dims && !bad; d++) {
            if (e->shape[d] < 0)
                return error_set(err, ERR_INVALID_ARG, "tensor %s: negative extent", e->name);
            count *= (uint64_t)e->shape[d];
            snprintf(num, sizeof num, "%s%" PRId64, d ? "," : "", e->shape[d]);
            bad = text_str(t, num) != 0;
        }
        uint64_t bytes = count * kern_dtype_size(e->dtype);
        snprintf(num, sizeof num, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", off,
                 off + bytes);
        if (bad || text_str(t, num))
            return error_set(err, ERR_NOMEM, "safetensors header: out of memory");
        off += bytes;
    }
    if (text_str(t, "}"))
        return error_set(err, ERR_NOMEM, "safetensors header: out of memory");
    while (t->len % 8)
        if (text_str(t, " "))
            return error_set(err, ERR_NOMEM, "safetensors header: out of memory");
    *total_bytes = off;
    return 0;
}

/* pwrite all of buf at off, retrying short writes and EINTR. */
static int pwrite_all(int fd, const void *buf, size_t n, uint64_t off)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t k = pwrite(fd, p, n, (off_t)off);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (k == 0) {
            errno = EIO;
            return -1;
        }
        p += k;
        n -= (size_t)k;
        off += (uint64_t)k;
    }
    return 0;
}

int stwriter_create(struct stwriter **out, const char *path,
                    const struct safetensors_entry *tensors, size_t n, char *err)
{
    struct stwriter_text hdr = {0};
    struct stwriter *w = calloc(1, sizeof *w);
    int rc;
    *out = NULL;
    if (!w)
        return error_set(err, ERR_NOMEM, "%s: out of memory", path);
    w->fd = -1;
    size_t plen = strlen(path);
    w->path = malloc(plen + 1);
    w->partial_path = malloc(plen + sizeof ".partial");
    if (!w->path || !w->partial_path) {
        rc = error_set(err, ERR_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    memcpy(w->path, path, plen + 1);
    memcpy(w->partial_path, path, plen);
    memcpy(w->partial_path + plen, ".partial", sizeof ".partial");

    rc = build_header(&hdr, tensors, n, &w->data_total_bytes, err);
    if (rc)
        goto fail;
    w->fd = open(w->partial_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        rc = error_set_errno(err, ERR_IO, errno, "%s: cannot create", w->partial_path);
        goto fail;
    }
    w->created = 1;
    unsigned char len_le[8];
    uint64_t hlen = hdr.len;
    for (int i = 0; i < 8; i++)
        len_le[i] = (unsigned char)(hlen >> (8 * i));
    w->data_start = 8 + hlen;
    if (pwrite_all(w->fd, len_le, 8, 0) != 0 || pwrite_all(w->fd, hdr.buf, hdr.len, 8) != 0) {
        rc = error_set_errno(err, ERR_IO, errno, "%s: write failed", w->partial_path);
        goto fail;
    }
    free(hdr.buf);
    *out = w;
    return 0;
fail:
    free(hdr.buf);
    stwriter_destroy(w);
    return rc;
}

int stwriter_write_at(struct stwriter *w, uint64_t data_offset, const void *data,
                      size_t size_bytes, char *err)
{
    if (data_offset > w->data_total_bytes || size_bytes > w->data_total_bytes - data_offset)
        return error_set(err, ERR_INVALID_ARG, "%s: bytes %" PRIu64 "..%" PRIu64
                         " past the %" PRIu64 " the header announced", w->path, data_offset,
                         data_offset + size_bytes, w->data_total_bytes);
    if (w->fd < 0)
        return error_set(err, ERR_INVALID_ARG, "%s: writer already finished", w->path);
    if (size_bytes && pwrite_all(w->fd, data, size_bytes, w->data_start + data_offset) != 0)
        return error_set_errno(err, ERR_IO, errno, "%s: write failed", w->partial_path);
    atomic_fetch_add(&w->data_written_bytes, (uint64_t)size_bytes);
    return 0;
}

int stwriter_append(struct stwriter *w, const void *data, size_t size_bytes, char *err)
{
    int rc = stwriter_write_at(w, w->append_pos, data, size_bytes, err);
    if (rc == 0)
        w->append_pos += size_bytes;
    return rc;
}

int stwriter_finish(struct stwriter *w, char *err)
{
    uint64_t written = atomic_load(&w->data_written_bytes);
    if (w->fd < 0)
        return error_set(err, ERR_INVALID_ARG, "%s: writer already finished", w->path);
    if (written != w->data_total_bytes)
        return error_set(err, ERR_INVALID_ARG, "%s: %" PRIu64 " of %" PRIu64
                         " data bytes written", w->path, written, w->data_total_bytes);
    int fd = w->fd;
    w->fd = -1;
    if (close(fd) != 0)
        return error_set_errno(err, ERR_IO, errno, "%s: close failed", w->partial_path);
    if (rename(w->partial_path, w->path) != 0)
        return error_set_errno(err, ERR_IO, errno, "%s: rename to %s failed",
                               w->partial_path, w->path);
    w->finished = 1;
    return 0;
}

void stwriter_destroy(struct stwriter *w)
{
    if (!w)
        return;
    if (w->fd >= 0)
        close(w->fd);
    if (w->created && !w->finished)
        remove(w->partial_path);
    free(w->path);
    free(w->partial_path);
    free(w);
}
