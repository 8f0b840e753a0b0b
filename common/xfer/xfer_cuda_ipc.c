/* xfer_cuda_ipc.c: the cuda_ipc entry of xfer (xfer_device.h): the slab,
 * the ready and consumed events and staging of kernels/cuda/ipc.cu
 * (kernels_cuda.h, kern_cuda_ipc_*), and the descriptor's "cuda" object
 * that carries them (shm_buffer_cuda_desc). The only file of the room, and
 * of the processes above it, that calls CUDA's entry points; built without
 * CUDA, its create and import say the binary has none.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "error.h"
#include "logging.h"
#include "xfer_device.h"

#ifdef TANDEM_HAVE_CUDA

#include "kernels_cuda.h"

_Static_assert(SHM_BUFFER_IPC_HANDLE_BYTES == KERN_CUDA_IPC_HANDLE_BYTES &&
                   SHM_BUFFER_UUID_MAX >= KERN_CUDA_UUID_MAX,
               "the descriptor carries the CUDA handles as they are");

struct xfer_device {
    struct kern_cuda_ipc *ipc;
};

/* The host face both sides map, as the device side sees it. */
static struct kern_cuda_ipc_shape ipc_shape(struct shm_buffer *shm, bool reader)
{
    const struct shm_layout *lay = shm_buffer_layout(shm);
    return (struct kern_cuda_ipc_shape){.host_base = shm_buffer_half_header(shm, 0, 0),
                                        .half_bytes = lay->half_bytes,
                                        .n_halves = lay->n_slots * 2,
                                        .host_read_only = reader};
}

/* True when the reader's device setting surely names the writer's GPU (the
 * same ordinal, default included, or this GPU's UUID). Only then may q rows
 * live in the slab alone: a reader on another GPU may lack peer access and
 * fall back to staging, which reads the host face. */
static bool names_this_gpu(const char *reader_device, const char *writer_device,
                           const char *writer_uuid)
{
    const char *t = reader_device && reader_device[0] ? reader_device : "0";
    const char *d = writer_device && writer_device[0] ? writer_device : "0";
    return strcasecmp(t, d) == 0 || strcasecmp(t, writer_uuid) == 0;
}

static int ipc_create(struct xfer_device **out, struct kern_backend *be, struct shm_buffer *shm,
                      const struct xfer_params *p, struct xfer_device_info *info, char *err)
{
    *out = NULL;
    info->q_in_slab = false;
    struct xfer_device *d = calloc(1, sizeof *d);
    if (!d)
        return error_set(err, ERR_NOMEM, "xfer cuda_ipc: out of memory");
    const struct kern_cuda_ipc_shape shape = ipc_shape(shm, false);
    const struct kern_cuda_ipc_handles *h = NULL;
    int rc = kern_cuda_ipc_export(&d->ipc, be, &shape, p->staging, &h, err);
    if (rc) {
        free(d);
        return rc;
    }
    *out = d;
    struct shm_buffer_cuda_desc cd = {
        .staging = h->staging != 0, .slab_bytes = h->slab_bytes, .probe_offset = h->probe_offset,
        .n_events = h->n_events, .event_handles = (unsigned char *)h->events,
        .consumed_handles = (unsigned char *)h->consumed};
    snprintf(cd.device_uuid, sizeof cd.device_uuid, "%s", h->device_uuid);
    memcpy(cd.mem_handle, h->mem, sizeof cd.mem_handle);
    memcpy(cd.probe, h->probe, sizeof cd.probe);
    cd.q_in_slab = !h->staging && p->writer_samples_on_device && p->reader_backend &&
                   strcmp(p->reader_backend, "cuda") == 0 && !p->reader_staging &&
                   names_this_gpu(p->reader_device, p->writer_device, h->device_uuid);
    if ((rc = shm_buffer_set_cuda(shm, &cd, err)))
        return rc;
    info->q_in_slab = cd.q_in_slab;
    snprintf(info->note, sizeof info->note, "%s: %s", h->device_uuid,
             h->staging ? "pinned host staging (shm_staging)" : "device slab + events");
    return 0;
}

static int ipc_import(struct xfer_device **out, struct kern_backend *be, struct shm_buffer *shm,
                      bool force_staging, char *err)
{
    *out = NULL;
    const struct shm_buffer_cuda_desc *cd = shm_buffer_cuda(shm);
    struct xfer_device *d = calloc(1, sizeof *d);
    if (!d)
        return error_set(err, ERR_NOMEM, "xfer cuda_ipc: out of memory");
    const struct kern_cuda_ipc_shape shape = ipc_shape(shm, true);
    struct kern_cuda_ipc_handles h = {
        .staging = cd->staging, .slab_bytes = cd->slab_bytes, .probe_offset = cd->probe_offset,
        .n_events = cd->n_events, .events = cd->event_handles, .consumed = cd->consumed_handles};
    snprintf(h.device_uuid, sizeof h.device_uuid, "%s", cd->device_uuid);
    memcpy(h.mem, cd->mem_handle, sizeof h.mem);
    memcpy(h.probe, cd->probe, sizeof h.probe);
    int rc = kern_cuda_ipc_import(&d->ipc, be, &shape, &h, force_staging, err);
    if (rc) {
        free(d);
        return rc;
    }
    *out = d;
    return 0;
}

static int ipc_begin_write(struct xfer_device *d, int half, char *err)
{
    return kern_cuda_ipc_begin_write(d->ipc, half, err);
}

static char *ipc_slab_base(struct xfer_device *d)
{
    void *base = NULL;
    char err[ERR_MSG_MAX];
    /* only asked for with a slab (q_in_slab), so this cannot fail */
    if (kern_cuda_ipc_slab_half(d->ipc, 0, 0, 0, &base, err) != 0)
        LOG_ERROR("%s", err);
    return base;
}

static int ipc_publish(struct xfer_device *d, int half, size_t bytes, char *err)
{
    return kern_cuda_ipc_publish(d->ipc, half, bytes, err);
}

static bool ipc_maps_slab(const struct xfer_device *d)
{
    return !kern_cuda_ipc_is_staging(d->ipc);
}

static int ipc_read_device(struct xfer_device *d, int half, size_t offset, size_t bytes,
                           const void **dev, char *err)
{
    return kern_cuda_ipc_read_device(d->ipc, half, offset, bytes, dev, err);
}

static int ipc_stage(struct xfer_device *d, int half, size_t offset, size_t bytes,
                     const void **host, char *err)
{
    return kern_cuda_ipc_stage(d->ipc, half, offset, bytes, host, err);
}

static int ipc_staged(struct xfer_device *d, int half, char *err)
{
    return kern_cuda_ipc_staged(d->ipc, half, err);
}

static int ipc_end_read(struct xfer_device *d, int half, char *err)
{
    return kern_cuda_ipc_end_read(d->ipc, half, err);
}

static void ipc_close(struct xfer_device *d, bool peer_may_map)
{
    if (!d)
        return;
    kern_cuda_ipc_close_ex(d->ipc, peer_may_map);
    free(d);
}

static void ipc_debug_skip_waits(struct xfer_device *d, bool skip)
{
    kern_cuda_ipc_debug_skip_waits(d->ipc, skip);
}

const struct xfer_device_ops xfer_cuda_ipc_ops = {
    .create = ipc_create,
    .import = ipc_import,
    .begin_write = ipc_begin_write,
    .slab_base = ipc_slab_base,
    .publish = ipc_publish,
    .maps_slab = ipc_maps_slab,
    .read_device = ipc_read_device,
    .stage = ipc_stage,
    .staged = ipc_staged,
    .end_read = ipc_end_read,
    .close = ipc_close,
    .debug_skip_waits = ipc_debug_skip_waits,
};

#else /* a build without CUDA */

static int no_cuda(char *err)
{
    return error_set(err, ERR_UNSUPPORTED,
                     "shm transport cuda_ipc: this binary was built without CUDA");
}

static int ipc_create(struct xfer_device **out, struct kern_backend *be, struct shm_buffer *shm,
                      const struct xfer_params *p, struct xfer_device_info *info, char *err)
{
    (void)be, (void)shm, (void)p;
    *out = NULL;
    info->q_in_slab = false;
    return no_cuda(err);
}

static int ipc_import(struct xfer_device **out, struct kern_backend *be, struct shm_buffer *shm,
                      bool force_staging, char *err)
{
    (void)be, (void)shm, (void)force_staging;
    *out = NULL;
    return no_cuda(err);
}

/* Neither create nor import hands out a device side, so xfer.c calls only
 * the two above. */
const struct xfer_device_ops xfer_cuda_ipc_ops = {
    .create = ipc_create,
    .import = ipc_import,
};

#endif
