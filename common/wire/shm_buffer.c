/* shm_buffer.c: the shared tensor buffer: the layout, a transport table and
 * the POSIX transport.
 *
 * A transport fills base/size of struct shm_buffer on create and import,
 * adds its fields to the descriptor on export, and undoes everything on
 * close. The layout arithmetic and the slot/half accessors are common to all
 * transports. A CUDA IPC transport will be a second entry of the table.
 *
 * Invariants: base != NULL and size_bytes == layout.size_bytes for every
 * buffer handed out; an importer's mapping is PROT_READ.
 */
#include "shm_buffer.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"

#define SHM_DEV_DIR "/dev/shm"

struct shm_buffer;

struct shm_buffer_ops {
    const char *transport;
    int (*create)(struct shm_buffer *buf, const char *instance, const char *tag, char *err);
    int (*export_fields)(const struct shm_buffer *buf, cJSON *desc);
    int (*import)(struct shm_buffer *buf, const cJSON *desc, char *err);
    void (*close)(struct shm_buffer *buf);
};

struct shm_buffer {
    const struct shm_buffer_ops *ops;
    struct shm_layout layout;
    bool owner;
    void *base;
    size_t size_bytes;
    char name[SHM_BUFFER_NAME_MAX]; /* POSIX: "/tandem-..." */
};

static size_t align_up(size_t n) { return (n + SHM_BUFFER_ALIGN - 1) / SHM_BUFFER_ALIGN * SHM_BUFFER_ALIGN; }

int shm_layout_init(struct shm_layout *lay, int n_slots, int k_max, int vocab, char *err)
{
    if (n_slots < 1 || n_slots > SHM_BUFFER_MAX_SLOTS)
        return error_set(err, ERR_RANGE, "shm.n_slots: must be in 1..%d, got %d",
                         SHM_BUFFER_MAX_SLOTS, n_slots);
    if (k_max < 1 || k_max > SHM_BUFFER_MAX_K)
        return error_set(err, ERR_RANGE, "shm.k_max: must be in 1..%d, got %d", SHM_BUFFER_MAX_K,
                         k_max);
    if (vocab < 1 || vocab > SHM_BUFFER_MAX_VOCAB)
        return error_set(err, ERR_RANGE, "shm.vocab: must be in 1..%d, got %d",
                         SHM_BUFFER_MAX_VOCAB, vocab);
    memset(lay, 0, sizeof *lay);
    lay->n_slots = n_slots;
    lay->k_max = k_max;
    lay->vocab = vocab;
    size_t rows = (size_t)k_max + 1;
    lay->tokens_offset = sizeof(struct shm_half_header);
    lay->q_offset = align_up(lay->tokens_offset + rows * sizeof(int32_t));
    lay->half_bytes = lay->q_offset + align_up(rows * (size_t)vocab * sizeof(float));
    /* bounded by the limits above: < 2^12 * 2 * 2^6 * 2^24 * 4 = 2^45 */
    lay->size_bytes = (size_t)n_slots * 2 * lay->half_bytes;
    return 0;
}

/* ---- POSIX transport ---- */

static int posix_name_ok(const char *name)
{
    if (strncmp(name, "/tandem-", 8) != 0 || strlen(name) >= SHM_BUFFER_NAME_MAX)
        return 0;
    for (const char *p = name + 1; *p; p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
              *p == '-' || *p == '_' || *p == '.'))
            return 0;
    return 1;
}

static int posix_create(struct shm_buffer *buf, const char *instance, const char *tag, char *err)
{
    int n = snprintf(buf->name, sizeof buf->name, "/tandem-%s-%ld-%s", instance, (long)getpid(),
                     tag);
    if (n < 0 || (size_t)n >= sizeof buf->name || !posix_name_ok(buf->name))
        return error_set(err, ERR_INVALID_ARG, "shm: bad segment name for instance \"%s\", tag \"%s\"",
                         instance, tag);
    int fd = shm_open(buf->name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0)
        return error_set_errno(err, errno == EEXIST ? ERR_IO : ERR_SYSTEM, errno,
                               "shm_open(%s, O_CREAT|O_EXCL)", buf->name);
    int rc = 0;
    if (ftruncate(fd, (off_t)buf->layout.size_bytes) != 0) {
        rc = error_set_errno(err, ERR_SYSTEM, errno, "ftruncate(%s, %zu)", buf->name,
                             buf->layout.size_bytes);
        goto fail;
    }
    int fa = posix_fallocate(fd, 0, (off_t)buf->layout.size_bytes);
    if (fa != 0 && fa != EOPNOTSUPP && fa != EINVAL) {
        rc = error_set_errno(err, fa == ENOSPC ? ERR_NOMEM : ERR_SYSTEM, fa,
                             "posix_fallocate(%s, %zu bytes; is /dev/shm large enough?)",
                             buf->name, buf->layout.size_bytes);
        goto fail;
    }
    void *p = mmap(NULL, buf->layout.size_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        rc = error_set_errno(err, ERR_SYSTEM, errno, "mmap(%s, %zu)", buf->name,
                             buf->layout.size_bytes);
        goto fail;
    }
    close(fd);
    buf->base = p;
    buf->size_bytes = buf->layout.size_bytes;
    return 0;
fail:
    close(fd);
    shm_unlink(buf->name);
    buf->name[0] = '\0';
    return rc;
}

static int posix_export_fields(const struct shm_buffer *buf, cJSON *desc)
{
    return cJSON_AddStringToObject(desc, "name", buf->name) ? 0 : ERR_NOMEM;
}

static int posix_import(struct shm_buffer *buf, const cJSON *desc, char *err)
{
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(desc, "name");
    if (!cJSON_IsString(name))
        return error_set(err, ERR_PROTOCOL, "shm.name: expected a string");
    if (!posix_name_ok(name->valuestring))
        return error_set(err, ERR_PROTOCOL, "shm.name: \"%.100s\" is not a Tandem segment name",
                         name->valuestring);
    snprintf(buf->name, sizeof buf->name, "%s", name->valuestring);
    int fd = shm_open(buf->name, O_RDONLY, 0);
    if (fd < 0)
        return error_set_errno(err, errno == ENOENT ? ERR_NOT_FOUND : ERR_SYSTEM, errno,
                               "shm_open(%s, O_RDONLY)", buf->name);
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) != 0) {
        rc = error_set_errno(err, ERR_SYSTEM, errno, "fstat(%s)", buf->name);
        goto done;
    }
    if ((size_t)st.st_size < buf->layout.size_bytes) {
        rc = error_set(err, ERR_FORMAT, "shm %s: segment has %lld bytes, descriptor says %zu",
                       buf->name, (long long)st.st_size, buf->layout.size_bytes);
        goto done;
    }
    void *p = mmap(NULL, buf->layout.size_bytes, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        rc = error_set_errno(err, ERR_SYSTEM, errno, "mmap(%s, %zu, PROT_READ)", buf->name,
                             buf->layout.size_bytes);
        goto done;
    }
    buf->base = p;
    buf->size_bytes = buf->layout.size_bytes;
done:
    close(fd);
    return rc;
}

static void posix_close(struct shm_buffer *buf)
{
    if (buf->base)
        munmap(buf->base, buf->size_bytes);
    buf->base = NULL;
    if (buf->owner && buf->name[0])
        shm_unlink(buf->name);
}

static const struct shm_buffer_ops posix_ops = {
    .transport = "posix",
    .create = posix_create,
    .export_fields = posix_export_fields,
    .import = posix_import,
    .close = posix_close,
};

static const struct shm_buffer_ops *const transports[] = {&posix_ops};

static const struct shm_buffer_ops *transport_find(const char *name)
{
    for (size_t i = 0; i < sizeof transports / sizeof transports[0]; i++)
        if (strcmp(transports[i]->transport, name) == 0)
            return transports[i];
    return NULL;
}

/* ---- common part ---- */

int shm_buffer_create(struct shm_buffer **out, const char *transport, const char *instance,
                      const char *tag, int n_slots, int k_max, int vocab, char *err)
{
    *out = NULL;
    const struct shm_buffer_ops *ops = transport_find(transport ? transport : "");
    if (!ops)
        return error_set(err, ERR_UNSUPPORTED, "shm transport \"%s\": not built into this binary",
                         transport ? transport : "");
    struct shm_buffer *buf = calloc(1, sizeof *buf);
    if (!buf)
        return error_set(err, ERR_NOMEM, "shm: out of memory");
    buf->ops = ops;
    buf->owner = true;
    int rc = shm_layout_init(&buf->layout, n_slots, k_max, vocab, err);
    if (rc == 0)
        rc = ops->create(buf, instance, tag, err);
    if (rc != 0) {
        free(buf);
        return rc;
    }
    *out = buf;
    return 0;
}

cJSON *shm_buffer_export(const struct shm_buffer *buf)
{
    cJSON *d = cJSON_CreateObject();
    if (!d)
        return NULL;
    if (!cJSON_AddStringToObject(d, "transport", buf->ops->transport) ||
        buf->ops->export_fields(buf, d) != 0 ||
        !cJSON_AddNumberToObject(d, "size_bytes", (double)buf->layout.size_bytes) ||
        !cJSON_AddNumberToObject(d, "n_slots", buf->layout.n_slots) ||
        !cJSON_AddNumberToObject(d, "k_max", buf->layout.k_max) ||
        !cJSON_AddNumberToObject(d, "vocab", buf->layout.vocab)) {
        cJSON_Delete(d);
        return NULL;
    }
    return d;
}

static int desc_int(const cJSON *desc, const char *key, int *out, char *err)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(desc, key);
    if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble) ||
        it->valuedouble != floor(it->valuedouble) || it->valuedouble < -2147483648.0 ||
        it->valuedouble > 2147483647.0)
        return error_set(err, ERR_PROTOCOL, "shm.%s: expected an integer", key);
    *out = (int)it->valuedouble;
    return 0;
}

int shm_buffer_import(struct shm_buffer **out, const cJSON *descriptor, char *err)
{
    *out = NULL;
    if (!cJSON_IsObject(descriptor))
        return error_set(err, ERR_PROTOCOL, "shm: expected a descriptor object");
    const cJSON *tr = cJSON_GetObjectItemCaseSensitive(descriptor, "transport");
    if (!cJSON_IsString(tr))
        return error_set(err, ERR_PROTOCOL, "shm.transport: expected a string");
    const struct shm_buffer_ops *ops = transport_find(tr->valuestring);
    if (!ops)
        return error_set(err, ERR_UNSUPPORTED, "shm.transport: \"%.64s\" not built into this binary",
                         tr->valuestring);
    int n_slots = 0, k_max = 0, vocab = 0, rc;
    if ((rc = desc_int(descriptor, "n_slots", &n_slots, err)) != 0 ||
        (rc = desc_int(descriptor, "k_max", &k_max, err)) != 0 ||
        (rc = desc_int(descriptor, "vocab", &vocab, err)) != 0)
        return rc;
    struct shm_layout lay;
    if ((rc = shm_layout_init(&lay, n_slots, k_max, vocab, err)) != 0)
        return ERR_PROTOCOL;
    const cJSON *sz = cJSON_GetObjectItemCaseSensitive(descriptor, "size_bytes");
    if (!cJSON_IsNumber(sz) || sz->valuedouble != (double)lay.size_bytes)
        return error_set(err, ERR_PROTOCOL,
                         "shm.size_bytes: does not match the layout (%d slots, k_max %d, vocab "
                         "%d: %zu bytes)",
                         n_slots, k_max, vocab, lay.size_bytes);
    struct shm_buffer *buf = calloc(1, sizeof *buf);
    if (!buf)
        return error_set(err, ERR_NOMEM, "shm: out of memory");
    buf->ops = ops;
    buf->owner = false;
    buf->layout = lay;
    if ((rc = ops->import(buf, descriptor, err)) != 0) {
        free(buf);
        return rc;
    }
    *out = buf;
    return 0;
}

void shm_buffer_close(struct shm_buffer *buf)
{
    if (!buf)
        return;
    buf->ops->close(buf);
    free(buf);
}

const struct shm_layout *shm_buffer_layout(const struct shm_buffer *buf) { return &buf->layout; }
const char *shm_buffer_name(const struct shm_buffer *buf) { return buf->name; }
bool shm_buffer_is_owner(const struct shm_buffer *buf) { return buf->owner; }

static char *half_base(struct shm_buffer *buf, int slot, int half)
{
    if (!buf || slot < 0 || slot >= buf->layout.n_slots || half < 0 || half > 1)
        return NULL;
    return (char *)buf->base + ((size_t)slot * 2 + (size_t)half) * buf->layout.half_bytes;
}

struct shm_half_header *shm_buffer_half_header(struct shm_buffer *buf, int slot, int half)
{
    return (struct shm_half_header *)half_base(buf, slot, half);
}

int32_t *shm_buffer_half_tokens(struct shm_buffer *buf, int slot, int half)
{
    char *p = half_base(buf, slot, half);
    return p ? (int32_t *)(p + buf->layout.tokens_offset) : NULL;
}

float *shm_buffer_half_q(struct shm_buffer *buf, int slot, int half)
{
    char *p = half_base(buf, slot, half);
    return p ? (float *)(p + buf->layout.q_offset) : NULL;
}

void shm_buffer_publish(struct shm_buffer *buf)
{
    (void)buf;
    __atomic_thread_fence(__ATOMIC_RELEASE);
}

void shm_buffer_acquire(struct shm_buffer *buf)
{
    (void)buf;
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
}

/* "tandem-<instance>-<digits>-<tag>": returns the pid, or -1 when the name
 * is not one of this instance's segments. */
static long segment_pid(const char *entry, const char *instance)
{
    size_t ilen = strlen(instance);
    if (strncmp(entry, "tandem-", 7) != 0 || strncmp(entry + 7, instance, ilen) != 0 ||
        entry[7 + ilen] != '-')
        return -1;
    const char *p = entry + 8 + ilen;
    long pid = 0;
    int digits = 0;
    while (*p >= '0' && *p <= '9' && digits < 10) {
        pid = pid * 10 + (*p - '0');
        p++;
        digits++;
    }
    if (digits == 0 || *p != '-' || p[1] == '\0')
        return -1;
    for (const char *t = p + 1; *t; t++)
        if (!((*t >= 'a' && *t <= 'z') || (*t >= '0' && *t <= '9') || *t == '_'))
            return -1;
    return pid;
}

int shm_buffer_cleanup_stale(const char *instance, bool all_pids, int *n_removed, char *err)
{
    if (n_removed)
        *n_removed = 0;
    DIR *d = opendir(SHM_DEV_DIR);
    if (!d) {
        if (errno == ENOENT)
            return 0;
        return error_set_errno(err, ERR_SYSTEM, errno, "opendir(%s)", SHM_DEV_DIR);
    }
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long pid = segment_pid(e->d_name, instance);
        if (pid < 0)
            continue;
        if (!all_pids && pid > 0 && (kill((pid_t)pid, 0) == 0 || errno == EPERM))
            continue; /* its owner is alive */
        char name[SHM_BUFFER_NAME_MAX + 2];
        int n = snprintf(name, sizeof name, "/%s", e->d_name);
        if (n < 0 || (size_t)n >= sizeof name)
            continue;
        if (shm_unlink(name) != 0) {
            if (errno != ENOENT && rc == 0)
                rc = error_set_errno(err, ERR_SYSTEM, errno, "shm_unlink(%s)", name);
            continue;
        }
        if (n_removed)
            (*n_removed)++;
    }
    closedir(d);
    return rc;
}
