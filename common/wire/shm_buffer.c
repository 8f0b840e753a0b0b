/* shm_buffer.c: the shared tensor buffer: the layout, a transport table and
 * the POSIX transport.
 *
 * A transport fills base/size of struct shm_buffer on create and import,
 * adds its fields to the descriptor on export, and undoes everything on
 * close. The layout arithmetic and the slot/half accessors are common to all
 * transports. "cuda_ipc" is the POSIX transport plus the "cuda" object of the
 * descriptor (its device side), which this file encodes and checks but never
 * acts on: no CUDA header is seen here (tests/layering), and the coordinator,
 * which links this library, only forwards descriptors.
 *
 * Invariants: base != NULL and size_bytes == layout.size_bytes for every
 * buffer handed out; an importer's mapping is PROT_READ. The header atomics
 * are lock-free (checked below): a lock-based atomic would put its lock in
 * the process, not in the shared segment.
 */
#include "shm_buffer.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "error.h"
#include "protocol.h"

#define SHM_DEV_DIR "/dev/shm"

_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2 && ATOMIC_LONG_LOCK_FREE == 2 && ATOMIC_INT_LOCK_FREE == 2,
               "the shared half header needs lock-free 32- and 64-bit atomics");

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
    int fd;                         /* the segment, kept open: the owner's flock probe of
                                       its readers, a reader's shared lock; -1 when none */
    bool unlinked;                  /* owner: the name is gone (shm_buffer_await_readers) */
    bool has_cuda;                  /* cuda_ipc: device side set (owner) or read (importer) */
    struct shm_buffer_cuda_desc cuda; /* its event_handles are owned here */
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
    buf->fd = fd;
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
    /* Held until close (the kernel drops it when this process dies): the
     * owner's shm_buffer_await_readers sees a reader by it. */
    if (flock(fd, LOCK_SH | LOCK_NB) != 0) {
        rc = error_set_errno(err, ERR_SYSTEM, errno, "flock(%s, LOCK_SH)", buf->name);
        munmap(p, buf->layout.size_bytes);
        goto done;
    }
    buf->base = p;
    buf->size_bytes = buf->layout.size_bytes;
    buf->fd = fd;
    return 0;
done:
    close(fd);
    return rc;
}

static void posix_close(struct shm_buffer *buf)
{
    if (buf->base)
        munmap(buf->base, buf->size_bytes);
    buf->base = NULL;
    if (buf->fd >= 0)
        close(buf->fd);
    buf->fd = -1;
    if (buf->owner && buf->name[0] && !buf->unlinked)
        shm_unlink(buf->name);
}

static const struct shm_buffer_ops posix_ops = {
    .transport = "posix",
    .create = posix_create,
    .export_fields = posix_export_fields,
    .import = posix_import,
    .close = posix_close,
};

/* ---- cuda_ipc: POSIX host face + the "cuda" object ---- */

static int hex_encode(const unsigned char *b, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[b[i] >> 4];
        out[2 * i + 1] = digits[b[i] & 15];
    }
    out[2 * n] = '\0';
    return 0;
}

static int hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* 0, or -1 unless s is exactly 2n hex digits. */
static int hex_decode(const char *s, unsigned char *out, size_t n)
{
    if (strlen(s) != 2 * n)
        return -1;
    for (size_t i = 0; i < n; i++) {
        int hi = hex_value(s[2 * i]), lo = hex_value(s[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return -1;
        out[i] = (unsigned char)(hi << 4 | lo);
    }
    return 0;
}

/* "GPU-" then 8-4-4-4-12 hex digits, as nvidia-smi and kern_cuda_device_uuid write it. */
static bool uuid_ok(const char *u)
{
    if (strncmp(u, "GPU-", 4) != 0 || strlen(u) != 40)
        return false;
    for (int i = 4; i < 40; i++) {
        bool dash = i == 12 || i == 17 || i == 22 || i == 27;
        if (dash ? u[i] != '-' : hex_value(u[i]) < 0)
            return false;
    }
    return true;
}

static int cuda_export_fields(const struct shm_buffer *buf, cJSON *desc)
{
    if (!buf->has_cuda || posix_export_fields(buf, desc) != 0)
        return ERR_NOMEM;
    const struct shm_buffer_cuda_desc *c = &buf->cuda;
    const struct shm_layout *lay = &buf->layout;
    char hex[2 * SHM_BUFFER_IPC_HANDLE_BYTES + 1];
    cJSON *o = cJSON_AddObjectToObject(desc, "cuda");
    cJSON *ev = o ? cJSON_AddArrayToObject(o, "events") : NULL;
    cJSON *cons = o && c->consumed_handles ? cJSON_AddArrayToObject(o, "consumed_events") : NULL;
    if (o && c->consumed_handles && !cons)
        return ERR_NOMEM;
    cJSON *probe = o ? cJSON_AddArrayToObject(o, "probe") : NULL;
    if (!ev || !probe || !cJSON_AddStringToObject(o, "device_uuid", c->device_uuid) ||
        !cJSON_AddStringToObject(o, "mode", c->staging ? "staging" : "device") ||
        !cJSON_AddNumberToObject(o, "slab_bytes", (double)c->slab_bytes) ||
        !cJSON_AddNumberToObject(o, "half_bytes", (double)lay->half_bytes) ||
        !cJSON_AddNumberToObject(o, "tokens_offset", (double)lay->tokens_offset) ||
        !cJSON_AddNumberToObject(o, "q_offset", (double)lay->q_offset) ||
        !cJSON_AddNumberToObject(o, "probe_offset", (double)c->probe_offset) ||
        !cJSON_AddStringToObject(o, "q_rows", c->q_in_slab ? "slab" : "host_face"))
        return ERR_NOMEM;
    if (!c->staging) {
        hex_encode(c->mem_handle, SHM_BUFFER_IPC_HANDLE_BYTES, hex);
        if (!cJSON_AddStringToObject(o, "mem_handle", hex))
            return ERR_NOMEM;
    }
    for (int i = 0; i < 4; i++) {
        cJSON *n = cJSON_CreateNumber((double)c->probe[i]);
        if (!n || !cJSON_AddItemToArray(probe, n)) {
            cJSON_Delete(n);
            return ERR_NOMEM;
        }
    }
    for (int set = 0; set < (cons ? 2 : 1); set++)
        for (int i = 0; i < c->n_events; i++) {
            const unsigned char *handles = set == 0 ? c->event_handles : c->consumed_handles;
            hex_encode(handles + (size_t)i * SHM_BUFFER_IPC_HANDLE_BYTES,
                       SHM_BUFFER_IPC_HANDLE_BYTES, hex);
            cJSON *str = cJSON_CreateString(hex);
            if (!str || !cJSON_AddItemToArray(set == 0 ? ev : cons, str)) {
                cJSON_Delete(str);
                return ERR_NOMEM;
            }
        }
    return 0;
}

/* n_events hex handles from o[key] into a new array *out. */
static int cuda_handles(const cJSON *o, const char *key, int n_events, unsigned char **out,
                        char *err)
{
    const cJSON *ev = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsArray(ev) || cJSON_GetArraySize(ev) != n_events)
        return error_set(err, ERR_PROTOCOL, "shm.cuda.%s: expected %d event handles (2 per "
                         "slot)", key, n_events);
    *out = malloc((size_t)n_events * SHM_BUFFER_IPC_HANDLE_BYTES);
    if (!*out)
        return error_set(err, ERR_NOMEM, "shm: out of memory");
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, ev)
    {
        if (!cJSON_IsString(e) ||
            hex_decode(e->valuestring, *out + (size_t)i * SHM_BUFFER_IPC_HANDLE_BYTES,
                       SHM_BUFFER_IPC_HANDLE_BYTES) != 0)
            return error_set(err, ERR_PROTOCOL, "shm.cuda.%s[%d]: expected %d hex digits", key, i,
                             2 * SHM_BUFFER_IPC_HANDLE_BYTES);
        i++;
    }
    return 0;
}

/* A non-negative integral number of o[key] that fits in a uint64_t below 2^53. */
static int cuda_u64(const cJSON *o, const char *key, uint64_t *out, char *err)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble) || it->valuedouble < 0 ||
        it->valuedouble != floor(it->valuedouble) || it->valuedouble > 9007199254740992.0)
        return error_set(err, ERR_PROTOCOL, "shm.cuda.%s: expected a non-negative integer", key);
    *out = (uint64_t)it->valuedouble;
    return 0;
}

static int cuda_parse(struct shm_buffer *buf, const cJSON *desc, char *err)
{
    const struct shm_layout *lay = &buf->layout;
    struct shm_buffer_cuda_desc *c = &buf->cuda;
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(desc, "cuda");
    if (!cJSON_IsObject(o))
        return error_set(err, ERR_PROTOCOL, "shm.cuda: expected an object (transport cuda_ipc)");
    const cJSON *uuid = cJSON_GetObjectItemCaseSensitive(o, "device_uuid");
    if (!cJSON_IsString(uuid) || !uuid_ok(uuid->valuestring))
        return error_set(err, ERR_PROTOCOL, "shm.cuda.device_uuid: expected \"GPU-\" and a UUID");
    snprintf(c->device_uuid, sizeof c->device_uuid, "%s", uuid->valuestring);
    const cJSON *mode = cJSON_GetObjectItemCaseSensitive(o, "mode");
    if (!cJSON_IsString(mode) ||
        (strcmp(mode->valuestring, "device") != 0 && strcmp(mode->valuestring, "staging") != 0))
        return error_set(err, ERR_PROTOCOL, "shm.cuda.mode: expected \"device\" or \"staging\"");
    c->staging = strcmp(mode->valuestring, "staging") == 0;
    /* The slab is laid out like the segment: the offsets must be the ones
     * this side computes, or the two processes disagree about the bytes. */
    uint64_t half = 0, tok = 0, qo = 0;
    int rc;
    if ((rc = cuda_u64(o, "slab_bytes", &c->slab_bytes, err)) ||
        (rc = cuda_u64(o, "probe_offset", &c->probe_offset, err)) ||
        (rc = cuda_u64(o, "half_bytes", &half, err)) ||
        (rc = cuda_u64(o, "tokens_offset", &tok, err)) || (rc = cuda_u64(o, "q_offset", &qo, err)))
        return rc;
    if (half != lay->half_bytes || tok != lay->tokens_offset || qo != lay->q_offset)
        return error_set(err, ERR_PROTOCOL,
                         "shm.cuda: offsets (half %llu, tokens %llu, q %llu) differ from the "
                         "layout's (%zu, %zu, %zu)", (unsigned long long)half,
                         (unsigned long long)tok, (unsigned long long)qo, lay->half_bytes,
                         lay->tokens_offset, lay->q_offset);
    if (!c->staging) {
        if (c->probe_offset < lay->size_bytes || c->probe_offset % SHM_BUFFER_ALIGN != 0 ||
            c->slab_bytes < c->probe_offset + SHM_BUFFER_ALIGN)
            return error_set(err, ERR_PROTOCOL,
                             "shm.cuda: slab_bytes %llu / probe_offset %llu do not hold the "
                             "%zu-byte layout and the probe", (unsigned long long)c->slab_bytes,
                             (unsigned long long)c->probe_offset, lay->size_bytes);
        const cJSON *mh = cJSON_GetObjectItemCaseSensitive(o, "mem_handle");
        if (!cJSON_IsString(mh) ||
            hex_decode(mh->valuestring, c->mem_handle, SHM_BUFFER_IPC_HANDLE_BYTES) != 0)
            return error_set(err, ERR_PROTOCOL, "shm.cuda.mem_handle: expected %d hex digits",
                             2 * SHM_BUFFER_IPC_HANDLE_BYTES);
    }
    /* Absent: a draft from before device sampling, whose q rows are always
     * in the host face. */
    const cJSON *qr = cJSON_GetObjectItemCaseSensitive(o, "q_rows");
    if (qr && (!cJSON_IsString(qr) || (strcmp(qr->valuestring, "slab") != 0 &&
                                       strcmp(qr->valuestring, "host_face") != 0)))
        return error_set(err, ERR_PROTOCOL, "shm.cuda.q_rows: expected \"slab\" or \"host_face\"");
    c->q_in_slab = qr && strcmp(qr->valuestring, "slab") == 0;
    if (c->q_in_slab && c->staging)
        return error_set(err, ERR_PROTOCOL, "shm.cuda.q_rows: \"slab\" with mode \"staging\" (no slab)");
    const cJSON *probe = cJSON_GetObjectItemCaseSensitive(o, "probe");
    if (!cJSON_IsArray(probe) || cJSON_GetArraySize(probe) != 4)
        return error_set(err, ERR_PROTOCOL, "shm.cuda.probe: expected 4 integers");
    for (int i = 0; i < 4; i++) {
        const cJSON *p = cJSON_GetArrayItem(probe, i);
        if (!cJSON_IsNumber(p) || p->valuedouble < 0 || p->valuedouble > 4294967295.0 ||
            p->valuedouble != floor(p->valuedouble))
            return error_set(err, ERR_PROTOCOL, "shm.cuda.probe: expected 4 integers");
        c->probe[i] = (uint32_t)p->valuedouble;
    }
    const int want = lay->n_slots * 2;
    c->n_events = want;
    rc = cuda_handles(o, "events", want, &c->event_handles, err);
    /* absent: an owner that orders nothing after the reader's reads (the
     * reader then stays on the host face, kernels_cuda.h) */
    if (rc == 0 && cJSON_GetObjectItemCaseSensitive(o, "consumed_events"))
        rc = cuda_handles(o, "consumed_events", want, &c->consumed_handles, err);
    if (rc)
        return rc;
    buf->has_cuda = true;
    return 0;
}

static void cuda_desc_free(struct shm_buffer *buf)
{
    free(buf->cuda.event_handles);
    free(buf->cuda.consumed_handles);
    buf->cuda.event_handles = NULL;
    buf->cuda.consumed_handles = NULL;
    buf->has_cuda = false;
}

static int cuda_import(struct shm_buffer *buf, const cJSON *desc, char *err)
{
    int rc = cuda_parse(buf, desc, err);
    if (rc == 0)
        rc = posix_import(buf, desc, err);
    if (rc)
        cuda_desc_free(buf);
    return rc;
}

static void cuda_close(struct shm_buffer *buf)
{
    posix_close(buf);
    cuda_desc_free(buf);
}

static const struct shm_buffer_ops cuda_ipc_ops = {
    .transport = "cuda_ipc",
    .create = posix_create,
    .export_fields = cuda_export_fields,
    .import = cuda_import,
    .close = cuda_close,
};

/* ---- frames: private memory laid out alike, filled from messages ---- */

/* A reader whose draft shares no memory with it (another host, another
 * /dev/shm) keeps the halves in memory of its own; each arrives as a frame
 * beside the verification that reads it (shm_half_wire.h) and is stored
 * through the same seqlock, so everything downstream reads it as it reads
 * a mapped half. Created by the reader itself (import of a "frames"
 * descriptor) or, in tests, by create. */
static int frames_map(struct shm_buffer *buf, char *err)
{
    void *p = mmap(NULL, buf->layout.size_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return error_set_errno(err, ERR_NOMEM, errno, "mmap(%zu bytes of private memory for the draft's halves)",
                               buf->layout.size_bytes);
    buf->base = p;
    buf->size_bytes = buf->layout.size_bytes;
    return 0;
}

static int frames_create(struct shm_buffer *buf, const char *instance, const char *tag, char *err)
{
    snprintf(buf->name, sizeof buf->name, "frames-%.40s-%.40s", instance, tag);
    return frames_map(buf, err);
}

static int frames_export_fields(const struct shm_buffer *buf, cJSON *desc)
{
    return cJSON_AddStringToObject(desc, "name", buf->name) ? 0 : ERR_NOMEM;
}

static int frames_import(struct shm_buffer *buf, const cJSON *desc, char *err)
{
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(desc, "name");
    snprintf(buf->name, sizeof buf->name, "%.100s", cJSON_IsString(name) ? name->valuestring : "frames");
    return frames_map(buf, err);
}

static void frames_close(struct shm_buffer *buf)
{
    if (buf->base)
        munmap(buf->base, buf->size_bytes);
    buf->base = NULL;
}

static const struct shm_buffer_ops frames_ops = {
    .transport = "frames",
    .create = frames_create,
    .export_fields = frames_export_fields,
    .import = frames_import,
    .close = frames_close,
};

static const struct shm_buffer_ops *const transports[] = {&posix_ops, &cuda_ipc_ops, &frames_ops};

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
    buf->fd = -1;
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
    buf->fd = -1;
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

int shm_buffer_set_cuda(struct shm_buffer *buf, const struct shm_buffer_cuda_desc *desc,
                        char *err)
{
    if (buf->ops != &cuda_ipc_ops || !buf->owner)
        return error_set(err, ERR_INVALID_ARG, "shm %s: not a cuda_ipc buffer of ours", buf->name);
    if (desc->n_events != buf->layout.n_slots * 2 || !desc->event_handles)
        return error_set(err, ERR_INVALID_ARG, "shm %s: %d event handles for %d halves", buf->name,
                         desc->n_events, buf->layout.n_slots * 2);
    if (!uuid_ok(desc->device_uuid))
        return error_set(err, ERR_INVALID_ARG, "shm %s: bad device UUID \"%.64s\"", buf->name,
                         desc->device_uuid);
    if (desc->q_in_slab && desc->staging)
        return error_set(err, ERR_INVALID_ARG, "shm %s: q rows in a slab that staging lacks",
                         buf->name);
    const size_t bytes = (size_t)desc->n_events * SHM_BUFFER_IPC_HANDLE_BYTES;
    unsigned char *ev = malloc(bytes);
    if (!ev)
        return error_set(err, ERR_NOMEM, "shm: out of memory");
    memcpy(ev, desc->event_handles, bytes);
    unsigned char *cons = NULL;
    if (desc->consumed_handles) {
        cons = malloc(bytes);
        if (!cons) {
            free(ev);
            return error_set(err, ERR_NOMEM, "shm: out of memory");
        }
        memcpy(cons, desc->consumed_handles, bytes);
    }
    cuda_desc_free(buf);
    buf->cuda = *desc;
    buf->cuda.event_handles = ev;
    buf->cuda.consumed_handles = cons;
    buf->has_cuda = true;
    return 0;
}

const struct shm_buffer_cuda_desc *shm_buffer_cuda(const struct shm_buffer *buf)
{
    return buf && buf->has_cuda ? &buf->cuda : NULL;
}

const char *shm_buffer_transport(const struct shm_buffer *buf) { return buf->ops->transport; }

const struct shm_layout *shm_buffer_layout(const struct shm_buffer *buf) { return &buf->layout; }
const char *shm_buffer_name(const struct shm_buffer *buf) { return buf->name; }
bool shm_buffer_is_owner(const struct shm_buffer *buf) { return buf->owner; }

bool shm_buffer_owner_gone(const struct shm_buffer *buf)
{
    struct stat st;
    if (buf->owner || buf->fd < 0)
        return false;
    return fstat(buf->fd, &st) == 0 && st.st_nlink == 0;
}

int shm_buffer_await_readers(struct shm_buffer *buf, double timeout_ms, char *err)
{
    if (!buf->owner || buf->fd < 0)
        return error_set(err, ERR_INVALID_ARG, "shm %s: only its owner awaits its readers",
                         buf->name);
    if (!buf->unlinked) {
        if (shm_unlink(buf->name) != 0 && errno != ENOENT)
            return error_set_errno(err, ERR_SYSTEM, errno, "shm_unlink(%s)", buf->name);
        buf->unlinked = true;
    }
    const double t0 = protocol_now_ms();
    for (;;) {
        if (flock(buf->fd, LOCK_EX | LOCK_NB) == 0)
            return 0;
        if (errno != EWOULDBLOCK && errno != EINTR)
            return error_set_errno(err, ERR_SYSTEM, errno, "flock(%s, LOCK_EX)", buf->name);
        if (protocol_now_ms() - t0 >= timeout_ms)
            return error_set(err, ERR_TIMEOUT, "shm %s: a reader still maps it after %.0f ms",
                             buf->name, timeout_ms);
        const struct timespec slice = {0, 5 * 1000 * 1000};
        nanosleep(&slice, NULL);
    }
}

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

/* The seqlock of the header comment in shm_buffer.h. The fields are
 * relaxed atomics: the ordering comes from seq's release/acquire and the two
 * fences, as in Boehm's "Can seqlocks get along with programming language
 * memory models?" (2012). */

void shm_buffer_half_begin_write(struct shm_buffer *buf, int slot, int half)
{
    struct shm_half_header *h = shm_buffer_half_header(buf, slot, half);
    if (!h)
        return;
    const uint64_t s = atomic_load_explicit(&h->seq, memory_order_relaxed);
    /* odd from here on; already odd (a rewrite that never published): a new
     * odd value, so a reader holding any earlier value sees a change */
    atomic_store_explicit(&h->seq, s + ((s & 1) ? 2 : 1), memory_order_relaxed);
    /* the odd seq is ordered before every data write that follows */
    atomic_thread_fence(memory_order_release);
}

/* The 32-bit word of seq that a futex waits on: its low half, wherever the
 * byte order puts it. */
static uint32_t *seq_word(struct shm_half_header *h)
{
    return (uint32_t *)(void *)((char *)&h->seq +
                                (__BYTE_ORDER__ == __ORDER_BIG_ENDIAN__ ? sizeof(uint32_t) : 0));
}

void shm_buffer_half_publish(struct shm_buffer *buf, int slot, int half,
                             const struct shm_half_info *info)
{
    struct shm_half_header *h = shm_buffer_half_header(buf, slot, half);
    if (!h)
        return;
    const uint64_t s = atomic_load_explicit(&h->seq, memory_order_relaxed);
    atomic_store_explicit(&h->req, info->req, memory_order_relaxed);
    atomic_store_explicit(&h->round, info->round, memory_order_relaxed);
    atomic_store_explicit(&h->k, info->k, memory_order_relaxed);
    atomic_store_explicit(&h->first, info->first, memory_order_relaxed);
    atomic_store_explicit(&h->guess, info->guess, memory_order_relaxed);
    /* even: every write above and since begin_write happens before it */
    atomic_store_explicit(&h->seq, (s | 1) + 1, memory_order_release);
    /* a target that got its verify before the draft finished sleeps on it
     * (shm_buffer_half_wait); a failed wake only leaves it to its timeout */
    (void)syscall(SYS_futex, seq_word(h), FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

uint64_t shm_buffer_half_seq(struct shm_buffer *buf, int slot, int half)
{
    struct shm_half_header *h = shm_buffer_half_header(buf, slot, half);
    return h ? atomic_load_explicit(&h->seq, memory_order_acquire) : 0;
}

int shm_buffer_half_wait(struct shm_buffer *buf, int slot, int half, uint64_t seen, double timeout_ms)
{
    struct shm_half_header *h = shm_buffer_half_header(buf, slot, half);
    if (!h)
        return ERR_RANGE;
    if (atomic_load_explicit(&h->seq, memory_order_acquire) != seen)
        return 0;
    if (timeout_ms <= 0)
        return ERR_TIMEOUT;
    struct timespec ts = {.tv_sec = (time_t)(timeout_ms / 1000.0),
                          .tv_nsec = (long)(fmod(timeout_ms, 1000.0) * 1e6)};
    /* The word compared is the seq's low half: it changes with every
     * begin_write and publish (seq moves by one or two each time). */
    long rc = syscall(SYS_futex, seq_word(h), FUTEX_WAIT, (uint32_t)seen, &ts, NULL, 0);
    if (rc != 0 && errno == ETIMEDOUT)
        return atomic_load_explicit(&h->seq, memory_order_acquire) != seen ? 0 : ERR_TIMEOUT;
    return 0; /* woken, the word had moved already (EAGAIN), or a signal: the caller re-reads */
}

int shm_buffer_half_read(struct shm_buffer *buf, int slot, int half, struct shm_half_info *info,
                         uint64_t *seq_out)
{
    struct shm_half_header *h = shm_buffer_half_header(buf, slot, half);
    if (!h)
        return ERR_RANGE;
    const uint64_t s0 = atomic_load_explicit(&h->seq, memory_order_acquire);
    if (s0 & 1)
        return ERR_UNAVAILABLE;
    info->req = atomic_load_explicit(&h->req, memory_order_relaxed);
    info->round = atomic_load_explicit(&h->round, memory_order_relaxed);
    info->k = atomic_load_explicit(&h->k, memory_order_relaxed);
    info->first = atomic_load_explicit(&h->first, memory_order_relaxed);
    info->guess = atomic_load_explicit(&h->guess, memory_order_relaxed);
    if (!shm_buffer_half_unchanged(buf, slot, half, s0))
        return ERR_UNAVAILABLE;
    *seq_out = s0;
    return 0;
}

bool shm_buffer_half_unchanged(struct shm_buffer *buf, int slot, int half, uint64_t seq)
{
    struct shm_half_header *h = shm_buffer_half_header(buf, slot, half);
    if (!h)
        return false;
    /* the reads of the half before this point cannot move after the load */
    atomic_thread_fence(memory_order_acquire);
    return atomic_load_explicit(&h->seq, memory_order_relaxed) == seq;
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
