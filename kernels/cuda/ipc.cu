/* ipc.cu: the device side of the draft's shared buffer between two processes
 * (kernels_cuda.h, kern_cuda_ipc_*): a cudaMalloc slab exported by the base
 * handle, one interprocess event per half, the importer's peer probe, the
 * in-place device addresses the workers' sampling kernels write and read q
 * through, and the pinned staging the host sampler reads q from.
 *
 * What it is not: it knows nothing of the half header or the seqlock
 * (common/wire/shm_buffer.c publishes the host face); it moves bytes and
 * orders them. Rules it keeps (docs of CUDA IPC and experience elsewhere):
 * only the base of a plain cudaMalloc allocation is exported (never pool,
 * VMM or managed memory) and offsets travel beside the handle; the GPU is
 * named by UUID, never by ordinal; peer access is used only after a real
 * read and write through the mapping succeeded; the importer closes its
 * mapping before the owner's slab can go.
 *
 * Streams: everything is queued on the backend's stream, so a publish is
 * ordered after the owner's kernels that wrote the data (once q is written
 * on the device) and the importer's verification kernels after its wait.
 *
 * Ordering between the two processes, per half, by two interprocess events
 * the owner creates and exports (either process may record or wait on an
 * opened IPC event):
 *   ready[h]     the owner records it after its writes of the half (the
 *                publish); the importer's stream waits on it before any read;
 *   consumed[h]  the importer records it after its last read of the half
 *                (kern_cuda_ipc_end_read); the owner's stream waits on it
 *                before its kernels write the half again (and, where the
 *                owner stages, its host, bounded, before host code rewrites
 *                the host face).
 * Both waits hold whatever the coordinator's scheduling does; the host
 * waits are bounded (KERN_CUDA_IPC_WAIT_MS), so a peer that died with a
 * record pending costs ERR_TIMEOUT, never a hang.
 *
 * Teardown: an owner whose peer may still map the slab (xfer could not see
 * the peer let go within its bound) closes without freeing the slab or
 * destroying the events: the process's exit returns them once the peer's
 * mapping is gone, which CUDA defines, where freeing mapped memory is not.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "cuda_backend.h"

#define IPC_LOG(call)                                                                  \
    do {                                                                               \
        cudaError_t ipc_log_e_ = (call);                                               \
        if (ipc_log_e_ != cudaSuccess)                                                 \
            LOG_ERROR("%s: %s failed: %s (%s)", __func__, #call,                       \
                      cudaGetErrorString(ipc_log_e_), cudaGetErrorName(ipc_log_e_));   \
    } while (0)

struct kern_cuda_ipc {
    struct cuda_backend *cb;     /* borrowed: must outlive this object */
    bool owner;
    bool staging;                /* reading/writing through the host face only */
    struct kern_cuda_ipc_shape shape;
    bool host_registered;
    char *slab;                  /* owner: cudaMalloc'd; importer: the IPC mapping; or NULL */
    size_t slab_bytes;
    cudaEvent_t *events;         /* [n_halves] ready: the owner's writes of the half are done */
    cudaEvent_t *consumed;       /* [n_halves] the importer's reads of the half are done */
    int n_events;
    bool have_events;            /* importer: the ready events opened (else host face only) */
    bool have_consumed;          /* importer: the consumed events opened */
    bool debug_skip_waits;       /* tests only: the GPU-side waits are left out */
    cudaEvent_t *staged;         /* importer: [n_halves] "staging copy done" */
    cudaEvent_t closed;          /* close: the stream's last work, waited for bounded */
    char *mirror;                /* importer, device mode: pinned [n_halves * half_bytes] */
    struct kern_cuda_ipc_handles handles; /* owner: what export hands out */
    unsigned char *event_handles; /* owner: [n_events][64] ready, then [n_events][64] consumed */
};

static int ipc_check_be(struct kern_backend *be, const char *who, char *err)
{
    if (!be || strcmp(be->name, "cuda") != 0)
        return error_set(err, ERR_INVALID_ARG, "%s: the backend is not cuda", who);
    return 0;
}

static int ipc_check_half(const struct kern_cuda_ipc *ipc, int hi, const char *who, char *err)
{
    if (hi < 0 || hi >= ipc->shape.n_halves)
        return error_set(err, ERR_RANGE, "%s: half %d outside 0..%d", who, hi,
                         ipc->shape.n_halves - 1);
    return 0;
}

static size_t ipc_host_bytes(const struct kern_cuda_ipc_shape *s)
{
    return (size_t)s->n_halves * s->half_bytes;
}

/* Pins the host face so copies from and to it are DMA, in this process.
 * Read-only mappings need cudaHostRegisterReadOnly, which not every device
 * has: without it the face stays pageable (the host reads it directly; only
 * a future device reader would need it pinned), and that is logged. */
static int ipc_register_host(struct kern_cuda_ipc *ipc, char *err)
{
    unsigned int flags = cudaHostRegisterPortable;
    if (ipc->shape.host_read_only) {
        int ro = 0;
        CUDA_CHECK(cudaDeviceGetAttribute(&ro, cudaDevAttrHostRegisterReadOnlySupported,
                                          ipc->cb->device));
        if (!ro) {
            LOG_WARN("cuda ipc: this GPU cannot register read-only host memory; the staging "
                     "path reads the shared segment unpinned");
            return 0;
        }
        flags |= cudaHostRegisterReadOnly;
    }
    CUDA_CHECK(cudaHostRegister(ipc->shape.host_base, ipc_host_bytes(&ipc->shape), flags));
    ipc->host_registered = true;
    return 0;
}

/* Waits on the host, bounded, for ev: the peer may be dead. */
static int ipc_wait_host(cudaEvent_t ev, const char *what, int hi, char *err)
{
    char call[96];
    snprintf(call, sizeof call, "cuda ipc: %s of half %d", what, hi);
    return cuda_backend_wait_event(ev, KERN_CUDA_IPC_WAIT_MS, call, err);
}

void kern_cuda_ipc_close_ex(struct kern_cuda_ipc *ipc, int peer_may_map)
{
    if (!ipc)
        return;
    bool stream_idle = true;
    if (ipc->cb) {
        IPC_LOG(cudaSetDevice(ipc->cb->device));
        /* queued copies and waits may still touch the slab and the mirror;
         * a wait on a dead peer's event may never end, so bounded */
        char err[ERR_MSG_MAX] = "";
        if (ipc->closed &&
            (cudaEventRecord(ipc->closed, ipc->cb->stream) != cudaSuccess ||
             cuda_backend_wait_event(ipc->closed, KERN_CUDA_IPC_WAIT_MS, "cuda ipc close", err) != 0)) {
            LOG_ERROR("cuda ipc close: the stream did not drain (%s); the slab, mirror and "
                      "events are left to the process's exit", err[0] ? err : "record failed");
            stream_idle = false;
        }
    }
    /* an owner whose peer may still map the slab or hold the events leaves
     * both to its exit (see the file's header) */
    const bool keep_shared = !stream_idle || (ipc->owner && peer_may_map);
    if (keep_shared && ipc->owner && peer_may_map)
        LOG_WARN("cuda ipc: the reader may still map the slab; it is freed at this process's "
                 "exit, once the reader lets go");
    for (int i = 0; !keep_shared && ipc->events && i < ipc->n_events; i++)
        if (ipc->events[i])
            IPC_LOG(cudaEventDestroy(ipc->events[i]));
    for (int i = 0; !keep_shared && ipc->consumed && i < ipc->n_events; i++)
        if (ipc->consumed[i])
            IPC_LOG(cudaEventDestroy(ipc->consumed[i]));
    for (int i = 0; stream_idle && ipc->staged && i < ipc->n_events; i++)
        if (ipc->staged[i])
            IPC_LOG(cudaEventDestroy(ipc->staged[i]));
    if (ipc->slab && !keep_shared) {
        if (ipc->owner)
            IPC_LOG(cudaFree(ipc->slab));
        else
            IPC_LOG(cudaIpcCloseMemHandle(ipc->slab));
    }
    if (ipc->mirror && stream_idle)
        IPC_LOG(cudaFreeHost(ipc->mirror));
    if (ipc->host_registered && stream_idle)
        IPC_LOG(cudaHostUnregister(ipc->shape.host_base));
    if (ipc->closed && stream_idle)
        IPC_LOG(cudaEventDestroy(ipc->closed));
    free(ipc->events);
    free(ipc->consumed);
    free(ipc->staged);
    free(ipc->event_handles);
    free(ipc);
}

void kern_cuda_ipc_close(struct kern_cuda_ipc *ipc) { kern_cuda_ipc_close_ex(ipc, 0); }

extern "C" void kern_cuda_ipc_debug_skip_waits(struct kern_cuda_ipc *ipc, int skip)
{
    ipc->debug_skip_waits = skip != 0;
}

static int ipc_new(struct kern_cuda_ipc **out, struct kern_backend *be,
                   const struct kern_cuda_ipc_shape *shape, bool owner, const char *who, char *err)
{
    *out = NULL;
    int rc = ipc_check_be(be, who, err);
    if (rc < 0)
        return rc;
    if (!shape->host_base || shape->half_bytes == 0 || shape->n_halves < 1)
        return error_set(err, ERR_INVALID_ARG, "%s: empty host face", who);
    struct kern_cuda_ipc *ipc = (struct kern_cuda_ipc *)calloc(1, sizeof *ipc);
    if (ipc) {
        ipc->events = (cudaEvent_t *)calloc((size_t)shape->n_halves, sizeof(cudaEvent_t));
        ipc->consumed = (cudaEvent_t *)calloc((size_t)shape->n_halves, sizeof(cudaEvent_t));
    }
    if (!ipc || !ipc->events || !ipc->consumed) {
        if (ipc) {
            free(ipc->events);
            free(ipc->consumed);
        }
        free(ipc);
        return error_set(err, ERR_NOMEM, "%s: out of memory", who);
    }
    ipc->cb = cuda_backend_of(be);
    ipc->owner = owner;
    ipc->shape = *shape;
    ipc->n_events = shape->n_halves;
    *out = ipc;
    rc = cuda_backend_enter(ipc->cb, err);
    if (rc < 0)
        return rc;
    CUDA_CHECK(cudaEventCreateWithFlags(&ipc->closed, cudaEventDisableTiming));
    return 0;
}

/* ---- owner ---------------------------------------------------------------- */

static int ipc_export_init(struct kern_cuda_ipc *ipc, bool staging, char *err)
{
    struct kern_cuda_ipc_handles *h = &ipc->handles;
    memcpy(h->device_uuid, ipc->cb->uuid, KERN_CUDA_UUID_MAX);
    h->staging = staging;
    ipc->staging = staging;
    int rc = ipc_register_host(ipc, err);
    if (rc < 0)
        return rc;
    ipc->event_handles =
        (unsigned char *)calloc(2 * (size_t)ipc->n_events, KERN_CUDA_IPC_HANDLE_BYTES);
    if (!ipc->event_handles)
        return error_set(err, ERR_NOMEM, "cuda ipc export: out of memory");
    for (int set = 0; set < 2; set++)
        for (int i = 0; i < ipc->n_events; i++) {
            cudaEvent_t *ev = set == 0 ? &ipc->events[i] : &ipc->consumed[i];
            CUDA_CHECK(cudaEventCreateWithFlags(ev, cudaEventInterprocess | cudaEventDisableTiming));
            cudaIpcEventHandle_t eh;
            CUDA_CHECK(cudaIpcGetEventHandle(&eh, *ev));
            memcpy(ipc->event_handles + ((size_t)set * ipc->n_events + i) * KERN_CUDA_IPC_HANDLE_BYTES,
                   &eh, KERN_CUDA_IPC_HANDLE_BYTES);
        }
    h->n_events = ipc->n_events;
    h->events = ipc->event_handles;
    h->consumed = ipc->event_handles + (size_t)ipc->n_events * KERN_CUDA_IPC_HANDLE_BYTES;
    /* probe words an importer must read back through its mapping: from this
     * process and this slab, so a stale or foreign mapping cannot match */
    h->probe[0] = 0x7a4d0000u ^ (uint32_t)getpid();
    h->probe[1] = (uint32_t)((uintptr_t)ipc >> 4);
    h->probe[2] = (uint32_t)ipc->n_events * 2654435761u;
    h->probe[3] = 0xc0dec0deu;
    if (staging)
        return 0;
    const size_t face = ipc_host_bytes(&ipc->shape);
    ipc->slab_bytes = face + KERN_CUDA_IPC_PROBE_BYTES;
    /* a plain cudaMalloc: its base is what cudaIpcGetMemHandle may export */
    CUDA_CHECK(cudaMalloc((void **)&ipc->slab, ipc->slab_bytes));
    CUDA_CHECK(cudaMemsetAsync(ipc->slab, 0, ipc->slab_bytes, ipc->cb->stream));
    CUDA_CHECK(cudaMemcpyAsync(ipc->slab + face, h->probe, sizeof h->probe,
                               cudaMemcpyHostToDevice, ipc->cb->stream));
    /* the probe words must be in place before any importer can read them */
    int src = cuda_backend_wait_stream(ipc->cb, "cuda ipc export: the slab's probe words", err);
    if (src < 0)
        return src;
    cudaIpcMemHandle_t mh;
    CUDA_CHECK(cudaIpcGetMemHandle(&mh, ipc->slab));
    memcpy(h->mem, &mh, KERN_CUDA_IPC_HANDLE_BYTES);
    h->slab_bytes = ipc->slab_bytes;
    h->probe_offset = face;
    return 0;
}

extern "C" int kern_cuda_ipc_export(struct kern_cuda_ipc **out, struct kern_backend *be,
                                    const struct kern_cuda_ipc_shape *shape, int staging,
                                    const struct kern_cuda_ipc_handles **handles_out, char *err)
{
    struct kern_cuda_ipc *ipc = NULL;
    *handles_out = NULL;
    int rc = ipc_new(&ipc, be, shape, true, "cuda ipc export", err);
    if (rc == 0)
        rc = ipc_export_init(ipc, staging != 0, err);
    if (rc < 0) {
        kern_cuda_ipc_close(ipc);
        *out = NULL;
        return rc;
    }
    *out = ipc;
    *handles_out = &ipc->handles;
    return 0;
}

extern "C" int kern_cuda_ipc_begin_write(struct kern_cuda_ipc *ipc, int hi, char *err)
{
    int rc = ipc_check_half(ipc, hi, "cuda ipc begin_write", err);
    if (rc < 0)
        return rc;
    rc = cuda_backend_enter(ipc->cb, err);
    if (rc < 0)
        return rc;
    /* On the GPU, no host wait: this stream's kernels and copies into the
     * slab half wait for the reader's last read of it. */
    if (!ipc->debug_skip_waits)
        CUDA_CHECK(cudaStreamWaitEvent(ipc->cb->stream, ipc->consumed[hi], 0));
    /* On the host, before host code rewrites the host face: the last
     * publish's copy reads it. A staging reader reads the host face itself
     * (its copies to its GPU): there the host waits for its consumed event
     * too. A reader of the slab reads the host face's header and tokens
     * with the CPU, done before it answers the round. */
    if ((rc = ipc_wait_host(ipc->events[hi], "the last publish's copy", hi, err)) < 0)
        return rc;
    if (ipc->staging && !ipc->debug_skip_waits)
        return ipc_wait_host(ipc->consumed[hi], "the reader's last read", hi, err);
    return 0;
}

extern "C" int kern_cuda_ipc_publish(struct kern_cuda_ipc *ipc, int hi, size_t bytes, char *err)
{
    int rc = ipc_check_half(ipc, hi, "cuda ipc publish", err);
    if (rc < 0)
        return rc;
    if (bytes > ipc->shape.half_bytes)
        return error_set(err, ERR_RANGE, "cuda ipc publish: %zu bytes of a %zu-byte half", bytes,
                         ipc->shape.half_bytes);
    rc = cuda_backend_enter(ipc->cb, err);
    if (rc < 0)
        return rc;
    const size_t off = (size_t)hi * ipc->shape.half_bytes;
    /* What host code wrote goes up; q rows the sampling kernels wrote into
     * the slab lie past `bytes` and are ordered by the stream alone. */
    if (!ipc->staging && bytes > 0)
        CUDA_CHECK(cudaMemcpyAsync(ipc->slab + off, (const char *)ipc->shape.host_base + off,
                                   bytes, cudaMemcpyHostToDevice, ipc->cb->stream));
    CUDA_CHECK(cudaEventRecord(ipc->events[hi], ipc->cb->stream));
    return 0;
}

/* Bytes [offset, offset + bytes) of half hi in the slab, checked. */
static int ipc_slab_range(const struct kern_cuda_ipc *ipc, int hi, size_t offset, size_t bytes,
                          const char *who, char **out, char *err)
{
    *out = NULL;
    int rc = ipc_check_half(ipc, hi, who, err);
    if (rc < 0)
        return rc;
    if (ipc->staging || !ipc->slab)
        return error_set(err, ERR_UNSUPPORTED, "%s: no slab (the buffer stages through host "
                         "memory)", who);
    if (offset > ipc->shape.half_bytes || bytes > ipc->shape.half_bytes - offset)
        return error_set(err, ERR_RANGE, "%s: bytes %zu..%zu of a %zu-byte half", who, offset,
                         offset + bytes, ipc->shape.half_bytes);
    *out = ipc->slab + (size_t)hi * ipc->shape.half_bytes + offset;
    return 0;
}

extern "C" int kern_cuda_ipc_slab_half(struct kern_cuda_ipc *ipc, int hi, size_t offset,
                                       size_t bytes, void **dev_out, char *err)
{
    char *p = NULL;
    *dev_out = NULL;
    if (!ipc->owner)
        return error_set(err, ERR_INVALID_ARG, "cuda ipc slab_half: only the owner writes");
    int rc = ipc_slab_range(ipc, hi, offset, bytes, "cuda ipc slab_half", &p, err);
    if (rc < 0)
        return rc;
    *dev_out = p;
    return 0;
}

/* ---- importer ------------------------------------------------------------- */

/* The ordinal of a GPU UUID in this process, or -1 when it is not visible. */
static int ipc_ordinal_of(const char *uuid, int *ordinal, char *err)
{
    *ordinal = -1;
    int count = 0;
    int rc = kern_cuda_device_count(&count, err);
    if (rc < 0)
        return rc;
    for (int i = 0; i < count; i++) {
        cudaDeviceProp prop;
        CUDA_CHECK(cudaGetDeviceProperties(&prop, i));
        const unsigned char *b = (const unsigned char *)prop.uuid.bytes;
        char u[KERN_CUDA_UUID_MAX];
        snprintf(u, sizeof u,
                 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                 b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                 b[14], b[15]);
        if (strcasecmp(u, uuid) == 0) {
            *ordinal = i;
            return 0;
        }
    }
    return 0;
}

/* Reads the owner's probe words through the mapping and writes and reads
 * back a pattern of ours beside them: 0 when both came back right, else a
 * reason in why (not an error: the caller falls back to staging). Runs on
 * the importer's device, so across GPUs it exercises the peer path itself,
 * whatever cudaDeviceCanAccessPeer claimed. */
static int ipc_probe(struct kern_cuda_ipc *ipc, const struct kern_cuda_ipc_handles *h, char *why,
                     size_t why_len, char *err)
{
    uint32_t *dev = NULL;
    uint32_t got[8], mine[4];
    cudaStream_t s = ipc->cb->stream;
    for (int i = 0; i < 4; i++)
        mine[i] = ~h->probe[i] ^ (uint32_t)(0x9e3779b9u * (unsigned)(i + 1));
    char *probe = ipc->slab + h->probe_offset;
    CUDA_CHECK(cudaMalloc((void **)&dev, sizeof got));
    /* peer (or same-device) reads and writes, both done by this device */
    cudaError_t e = cudaMemcpyAsync(dev, probe, 4 * sizeof(uint32_t), cudaMemcpyDeviceToDevice, s);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(dev + 4, mine, sizeof mine, cudaMemcpyHostToDevice, s);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(probe + 16, dev + 4, sizeof mine, cudaMemcpyDeviceToDevice, s);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(dev + 4, probe + 16, sizeof mine, cudaMemcpyDeviceToDevice, s);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(got, dev, sizeof got, cudaMemcpyDeviceToHost, s);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(s);
    cudaError_t ef = cudaFree(dev);
    if (e != cudaSuccess) {
        snprintf(why, why_len, "a copy through the mapping failed: %s", cudaGetErrorString(e));
        (void)cudaGetLastError();
        return 1;
    }
    if (ef != cudaSuccess)
        return cuda_backend_fail(err, ef, __func__, "cudaFree(dev)");
    if (memcmp(got, h->probe, sizeof h->probe) != 0) {
        snprintf(why, why_len, "the owner's probe words read back wrong (%08x, want %08x)", got[0],
                 h->probe[0]);
        return 1;
    }
    if (memcmp(got + 4, mine, sizeof mine) != 0) {
        snprintf(why, why_len, "a pattern written through the mapping read back wrong");
        return 1;
    }
    return 0;
}

/* Opens the slab for device mode; 0 with ipc->slab set, or 0 with a reason
 * in why when device mode cannot work here (the caller stages instead). */
static int ipc_open_slab(struct kern_cuda_ipc *ipc, const struct kern_cuda_ipc_handles *h,
                         char *why, size_t why_len, char *err)
{
    int owner_dev = -1;
    int rc = ipc_ordinal_of(h->device_uuid, &owner_dev, err);
    if (rc < 0)
        return rc;
    if (owner_dev < 0) {
        snprintf(why, why_len, "the draft's GPU %s is not visible to this process",
                 h->device_uuid);
        return 0;
    }
    const int mine = ipc->cb->device;
    if (owner_dev != mine) {
        int can = 0;
        CUDA_CHECK(cudaDeviceCanAccessPeer(&can, mine, owner_dev));
        if (!can) {
            snprintf(why, why_len, "no peer access from GPU %d to the draft's GPU %d (%s)", mine,
                     owner_dev, h->device_uuid);
            return 0;
        }
    }
    cudaIpcMemHandle_t mh;
    memcpy(&mh, h->mem, KERN_CUDA_IPC_HANDLE_BYTES);
    void *p = NULL;
    cudaError_t e = cudaIpcOpenMemHandle(&p, mh, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(why, why_len, "cudaIpcOpenMemHandle failed: %s", cudaGetErrorString(e));
        return 0;
    }
    ipc->slab = (char *)p;
    ipc->slab_bytes = (size_t)h->slab_bytes;
    if (ipc_probe(ipc, h, why, why_len, err) == 0)
        return 0;
    IPC_LOG(cudaIpcCloseMemHandle(ipc->slab));
    ipc->slab = NULL;
    return 0;
}

static int ipc_import_init(struct kern_cuda_ipc *ipc, const struct kern_cuda_ipc_handles *h,
                           bool force_staging, char *err)
{
    if (h->n_events != ipc->n_events || !h->events)
        return error_set(err, ERR_INVALID_ARG, "cuda ipc import: %d events for %d halves",
                         h->n_events, ipc->n_events);
    if (!h->staging && h->slab_bytes < ipc_host_bytes(&ipc->shape) + KERN_CUDA_IPC_PROBE_BYTES)
        return error_set(err, ERR_INVALID_ARG, "cuda ipc import: a %llu-byte slab is smaller "
                         "than the host face", (unsigned long long)h->slab_bytes);
    char why[256] = "forced by the config (shm_staging)";
    ipc->have_events = true;
    for (int i = 0; i < ipc->n_events && ipc->have_events; i++) {
        cudaIpcEventHandle_t eh;
        memcpy(&eh, h->events + (size_t)i * KERN_CUDA_IPC_HANDLE_BYTES, KERN_CUDA_IPC_HANDLE_BYTES);
        cudaError_t e = cudaIpcOpenEventHandle(&ipc->events[i], eh);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            snprintf(why, sizeof why, "cudaIpcOpenEventHandle of ready event %d failed: %s", i,
                     cudaGetErrorString(e));
            ipc->have_events = false;
        }
    }
    ipc->have_consumed = ipc->have_events && h->consumed;
    if (ipc->have_events && !h->consumed)
        snprintf(why, sizeof why, "the draft exported no consumed events (an older draft)");
    for (int i = 0; i < ipc->n_events && ipc->have_consumed; i++) {
        cudaIpcEventHandle_t eh;
        memcpy(&eh, h->consumed + (size_t)i * KERN_CUDA_IPC_HANDLE_BYTES,
               KERN_CUDA_IPC_HANDLE_BYTES);
        cudaError_t e = cudaIpcOpenEventHandle(&ipc->consumed[i], eh);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            snprintf(why, sizeof why, "cudaIpcOpenEventHandle of consumed event %d failed: %s", i,
                     cudaGetErrorString(e));
            ipc->have_consumed = false;
        }
    }
    if (!ipc->have_events || !ipc->have_consumed) {
        /* without them the slab's reads are unordered: the host face alone,
         * ordered by its seqlock and the coordinator's rounds */
        ipc->have_events = ipc->have_consumed = false;
    } else if (h->staging)
        snprintf(why, sizeof why, "the draft exported no slab (its shm_staging)");
    else if (!force_staging) {
        why[0] = '\0';
        int rc = ipc_open_slab(ipc, h, why, sizeof why, err);
        if (rc < 0)
            return rc;
    }
    ipc->staging = ipc->slab == NULL;
    ipc->staged = (cudaEvent_t *)calloc((size_t)ipc->n_events, sizeof(cudaEvent_t));
    if (!ipc->staged)
        return error_set(err, ERR_NOMEM, "cuda ipc import: out of memory");
    for (int i = 0; i < ipc->n_events; i++)
        CUDA_CHECK(cudaEventCreateWithFlags(&ipc->staged[i], cudaEventDisableTiming));
    if (ipc->staging) {
        LOG_INFO("cuda ipc: staging through pinned host memory: %s", why);
        return ipc_register_host(ipc, err);
    }
    /* the host-side accept/reject reads q from here (see kernels_cuda.h) */
    CUDA_CHECK(cudaMallocHost((void **)&ipc->mirror, ipc_host_bytes(&ipc->shape)));
    LOG_INFO("cuda ipc: the draft's slab (%zu bytes on %s) is mapped and probed", ipc->slab_bytes,
             h->device_uuid);
    return 0;
}

extern "C" int kern_cuda_ipc_import(struct kern_cuda_ipc **out, struct kern_backend *be,
                                    const struct kern_cuda_ipc_shape *shape,
                                    const struct kern_cuda_ipc_handles *handles, int force_staging,
                                    char *err)
{
    struct kern_cuda_ipc *ipc = NULL;
    int rc = ipc_new(&ipc, be, shape, false, "cuda ipc import", err);
    if (rc == 0)
        rc = ipc_import_init(ipc, handles, force_staging != 0, err);
    if (rc < 0) {
        kern_cuda_ipc_close(ipc);
        *out = NULL;
        return rc;
    }
    *out = ipc;
    return 0;
}

extern "C" int kern_cuda_ipc_is_staging(const struct kern_cuda_ipc *ipc) { return ipc->staging; }

extern "C" int kern_cuda_ipc_stage(struct kern_cuda_ipc *ipc, int hi, size_t offset,
                                   size_t bytes, const void **host_out, char *err)
{
    *host_out = NULL;
    int rc = ipc_check_half(ipc, hi, "cuda ipc stage", err);
    if (rc < 0)
        return rc;
    if (offset > ipc->shape.half_bytes || bytes > ipc->shape.half_bytes - offset)
        return error_set(err, ERR_RANGE, "cuda ipc stage: bytes %zu..%zu of a %zu-byte half",
                         offset, offset + bytes, ipc->shape.half_bytes);
    rc = cuda_backend_enter(ipc->cb, err);
    if (rc < 0)
        return rc;
    const size_t off = (size_t)hi * ipc->shape.half_bytes + offset;
    /* on the GPU: nothing after this on the stream starts before the
     * draft's copy (and, later, its kernels) for this half is done */
    if (ipc->have_events && !ipc->debug_skip_waits)
        CUDA_CHECK(cudaStreamWaitEvent(ipc->cb->stream, ipc->events[hi], 0));
    if (!ipc->staging && bytes > 0)
        CUDA_CHECK(cudaMemcpyAsync(ipc->mirror + off, ipc->slab + off, bytes,
                                   cudaMemcpyDeviceToHost, ipc->cb->stream));
    CUDA_CHECK(cudaEventRecord(ipc->staged[hi], ipc->cb->stream));
    /* staging: the host face holds the data and the wait only orders the
     * draft's GPU work (none today) before ours */
    *host_out = ipc->staging ? (const char *)ipc->shape.host_base + off : ipc->mirror + off;
    return 0;
}

extern "C" int kern_cuda_ipc_read_device(struct kern_cuda_ipc *ipc, int hi, size_t offset,
                                         size_t bytes, const void **dev_out, char *err)
{
    char *p = NULL;
    *dev_out = NULL;
    if (ipc->owner)
        return error_set(err, ERR_INVALID_ARG, "cuda ipc read_device: the owner reads its slab "
                         "directly");
    int rc = ipc_slab_range(ipc, hi, offset, bytes, "cuda ipc read_device", &p, err);
    if (rc == 0)
        rc = cuda_backend_enter(ipc->cb, err);
    if (rc < 0)
        return rc;
    /* on the GPU: the kernels queued after this read the half only once the
     * owner's kernels and copy for it, recorded before its message, are done */
    if (!ipc->debug_skip_waits)
        CUDA_CHECK(cudaStreamWaitEvent(ipc->cb->stream, ipc->events[hi], 0));
    *dev_out = p;
    return 0;
}

extern "C" int kern_cuda_ipc_end_read(struct kern_cuda_ipc *ipc, int hi, char *err)
{
    int rc = ipc_check_half(ipc, hi, "cuda ipc end_read", err);
    if (rc < 0)
        return rc;
    if (ipc->owner)
        return error_set(err, ERR_INVALID_ARG, "cuda ipc end_read: only the reader ends reads");
    if (!ipc->have_consumed)
        return 0;
    rc = cuda_backend_enter(ipc->cb, err);
    if (rc < 0)
        return rc;
    /* after every read of the half queued so far on this stream */
    CUDA_CHECK(cudaEventRecord(ipc->consumed[hi], ipc->cb->stream));
    return 0;
}

extern "C" int kern_cuda_ipc_staged(struct kern_cuda_ipc *ipc, int hi, char *err)
{
    int rc = ipc_check_half(ipc, hi, "cuda ipc staged", err);
    if (rc < 0)
        return rc;
    rc = cuda_backend_enter(ipc->cb, err);
    if (rc < 0)
        return rc;
    /* behind the wait for the draft's ready event: bounded */
    return ipc_wait_host(ipc->staged[hi], "the staging copy", hi, err);
}
