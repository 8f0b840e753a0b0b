/* xfer.c: the seam over the draft's halves (contracts in xfer.h): the host
 * face through shm_buffer, the device side through the transport's entry
 * (xfer_device.h). "posix" has no device side; neither has a cuda_ipc
 * buffer read by a CPU reader, which reads its host face.
 *
 * Invariants: dev != NULL only for cuda_ipc on a cuda backend; q_in_slab is
 * the descriptor's q_rows "slab" (the writer's choice, carried to the
 * reader); a writer's q_slab is the slab's base exactly when q_in_slab.
 */
#include "xfer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "logging.h"
#include "shm_half_wire.h"
#include "xfer_device.h"

struct xfer {
    struct shm_buffer *shm;
    const struct xfer_device_ops *ops; /* NULL: the host face alone */
    struct xfer_device *dev;
    bool writer;
    bool q_in_slab;
    char *q_slab;                      /* writer, q_in_slab: the slab's base (device) */
};

static int xfer_new(struct xfer **out, char *err)
{
    *out = calloc(1, sizeof **out);
    return *out ? 0 : error_set(err, ERR_NOMEM, "xfer: out of memory");
}

int xfer_create(struct xfer **out, struct kern_backend *be, const struct xfer_params *p,
                char *err)
{
    *out = NULL;
    const bool cuda = be && strcmp(be->name, "cuda") == 0;
    const char *transport = p->transport && p->transport[0] ? p->transport : "auto";
    if (strcmp(transport, "auto") == 0)
        transport = cuda ? "cuda_ipc" : "posix";
    const bool ipc = strcmp(transport, "cuda_ipc") == 0;
    if (ipc && !cuda)
        return error_set(err, ERR_INVALID_ARG,
                         "draft_worker.shm_transport: \"cuda_ipc\" needs backend \"cuda\"");
    struct xfer *x;
    int rc = xfer_new(&x, err);
    if (rc)
        return rc;
    x->writer = true;
    rc = shm_buffer_create(&x->shm, transport, p->instance, p->tag, p->n_slots, p->k_max, p->vocab,
                           err);
    if (rc == 0 && ipc) {
        struct xfer_device_info info = {.note = ""};
        x->ops = &xfer_cuda_ipc_ops;
        rc = x->ops->create(&x->dev, be, x->shm, p, &info, err);
        x->q_in_slab = info.q_in_slab;
        if (rc == 0) {
            x->q_slab = x->q_in_slab ? x->ops->slab_base(x->dev) : NULL;
            LOG_INFO("draft buffer over CUDA IPC on %s; q rows %s", info.note,
                     x->q_in_slab ? "written by the sampling kernels into the slab (no host copy)"
                                  : "written to the host face");
        }
    }
    if (rc) {
        xfer_close(x, 0);
        return rc;
    }
    *out = x;
    return 0;
}

int xfer_import(struct xfer **out, struct kern_backend *be, const cJSON *descriptor,
                bool force_staging, char *err)
{
    *out = NULL;
    struct xfer *x;
    int rc = xfer_new(&x, err);
    if (rc)
        return rc;
    if ((rc = shm_buffer_import(&x->shm, descriptor, err))) {
        free(x);
        return rc;
    }
    const struct shm_buffer_cuda_desc *cd = shm_buffer_cuda(x->shm);
    x->q_in_slab = cd && cd->q_in_slab;
    if (cd && be && strcmp(be->name, "cuda") == 0) {
        x->ops = &xfer_cuda_ipc_ops;
        rc = x->ops->import(&x->dev, be, x->shm, force_staging, err);
    } else if (cd) {
        LOG_INFO("draft buffer %s is cuda_ipc; this target runs on the CPU and reads its host "
                 "face", shm_buffer_name(x->shm));
    }
    if (rc) {
        xfer_close(x, 0);
        return rc;
    }
    *out = x;
    return 0;
}

cJSON *xfer_export(const struct xfer *x) { return shm_buffer_export(x->shm); }

void xfer_close(struct xfer *x, double timeout_ms)
{
    if (!x)
        return;
    bool reader_may_map = false;
    if (x->writer && x->dev && x->shm) {
        char err[ERR_MSG_MAX];
        if (shm_buffer_await_readers(x->shm, timeout_ms, err) != 0) {
            LOG_WARN("%s", err);
            reader_may_map = true;
        }
    }
    /* the device side first: it unregisters the host face before the
     * segment's unmap, and a reader closes its mapping of the slab before it
     * lets go of the segment (what the writer waits for) */
    if (x->dev)
        x->ops->close(x->dev, reader_may_map);
    shm_buffer_close(x->shm);
    free(x);
}

const struct shm_layout *xfer_layout(const struct xfer *x) { return shm_buffer_layout(x->shm); }
const char *xfer_name(const struct xfer *x) { return shm_buffer_name(x->shm); }
const char *xfer_transport(const struct xfer *x) { return shm_buffer_transport(x->shm); }

/* ---- writer ---- */

int xfer_half_pack(struct xfer *x, int slot, int half, int q_rows, void **out, size_t *out_len, char *err)
{
    if (q_rows > 0 && x->q_in_slab)
        return error_set(err, ERR_UNAVAILABLE,
                         "the q rows of %s live in its GPU slab alone: a target without shared memory needs "
                         "them on the host (draft_worker.sampler \"host\", or shm_staging)", shm_buffer_name(x->shm));
    return shm_half_pack(x->shm, slot, half, q_rows, out, out_len, err);
}

int xfer_half_store(struct xfer *x, int slot, int half, const void *bytes, size_t len, char *err)
{
    return shm_half_store(x->shm, slot, half, bytes, len, err);
}

int xfer_begin_write(struct xfer *x, int slot, int half, char *err)
{
    if (x->dev) {
        int rc = x->ops->begin_write(x->dev, slot * 2 + half, err);
        if (rc)
            return rc;
    }
    shm_buffer_half_begin_write(x->shm, slot, half);
    return 0;
}

void xfer_q_dest(struct xfer *x, int slot, int half, float **host, float **dev)
{
    const struct shm_layout *lay = shm_buffer_layout(x->shm);
    if (x->q_slab) {
        *host = NULL;
        *dev = (float *)(x->q_slab + (size_t)(slot * 2 + half) * lay->half_bytes + lay->q_offset);
    } else {
        *host = shm_buffer_half_q(x->shm, slot, half);
        *dev = NULL;
    }
}

int xfer_publish(struct xfer *x, int slot, int half, const struct shm_half_info *info,
                 int q_rows, bool q_on_host, char *err)
{
    if (x->dev) {
        const struct shm_layout *lay = shm_buffer_layout(x->shm);
        /* q rows the kernels wrote into the slab lie past the bytes that
         * move, and are ordered by the stream alone */
        const bool q_moves = q_on_host && !x->q_slab;
        const size_t bytes =
            lay->q_offset + (q_moves ? (size_t)q_rows * (size_t)lay->vocab * sizeof(float) : 0);
        int rc = x->ops->publish(x->dev, slot * 2 + half, bytes, err);
        if (rc)
            return rc;
    }
    shm_buffer_half_publish(x->shm, slot, half, info);
    return 0;
}

/* ---- reader ---- */

int xfer_half_read(struct xfer *x, int slot, int half, struct shm_half_info *info,
                   uint64_t *seq_out)
{
    return shm_buffer_half_read(x->shm, slot, half, info, seq_out);
}

uint64_t xfer_half_seq(struct xfer *x, int slot, int half)
{
    return shm_buffer_half_seq(x->shm, slot, half);
}

int xfer_half_wait(struct xfer *x, int slot, int half, uint64_t seen, double timeout_ms)
{
    return shm_buffer_half_wait(x->shm, slot, half, seen, timeout_ms);
}

bool xfer_half_unchanged(struct xfer *x, int slot, int half, uint64_t seq)
{
    return shm_buffer_half_unchanged(x->shm, slot, half, seq);
}

const int32_t *xfer_half_tokens(struct xfer *x, int slot, int half)
{
    return shm_buffer_half_tokens(x->shm, slot, half);
}

int xfer_q_rows(struct xfer *x, int slot, int half, uint32_t first, int k, bool device_reader,
                struct xfer_q *out, char *err)
{
    const struct shm_layout *lay = shm_buffer_layout(x->shm);
    const size_t row_bytes = (size_t)lay->vocab * sizeof(float);
    *out = (struct xfer_q){.host = shm_buffer_half_q(x->shm, slot, half) + (size_t)first * lay->vocab};
    const char *why = "it does not map the slab";
    if (x->dev) {
        why = "it stages through host memory";
        const size_t off = lay->q_offset + (size_t)first * row_bytes;
        const size_t bytes = (size_t)k * row_bytes;
        const bool mapped = x->ops->maps_slab(x->dev);
        if (mapped && device_reader) {
            out->host = NULL;
            return x->ops->read_device(x->dev, slot * 2 + half, off, bytes,
                                       (const void **)&out->dev, err);
        }
        if (mapped || !x->q_in_slab) {
            /* the host sampler reads q on the host; staging reads it in the
             * host face (which a device reader uploads) */
            out->staged = true;
            return x->ops->stage(x->dev, slot * 2 + half, off, bytes, (const void **)&out->host,
                                 err);
        }
    }
    if (x->q_in_slab)
        return error_set(err, ERR_UNAVAILABLE,
                         "verify: the draft writes its q rows only into its GPU slab, which this "
                         "target cannot read (%s): set target_worker.shm_staging or "
                         "draft_worker.shm_staging to 1 in the config both workers read (or "
                         "draft_worker.sampler \"host\")", why);
    return 0;
}

int xfer_wait_staged(struct xfer *x, int slot, int half, char *err)
{
    return x->dev ? x->ops->staged(x->dev, slot * 2 + half, err) : 0;
}

int xfer_end_read(struct xfer *x, int slot, int half, char *err)
{
    return x->dev ? x->ops->end_read(x->dev, slot * 2 + half, err) : 0;
}

bool xfer_owner_gone(const struct xfer *x) { return shm_buffer_owner_gone(x->shm); }

const char *xfer_q_path(const struct xfer *x, bool device_reader)
{
    if (x->dev && x->ops->maps_slab(x->dev))
        return device_reader
                   ? "in place from the draft's slab on the GPU (device accept/reject, no host copy)"
                   : "from the draft's slab through pinned host memory (host accept/reject)";
    if (x->dev && !x->q_in_slab)
        return device_reader
                   ? "from the pinned host face, uploaded for the device accept/reject (staging)"
                   : "from the pinned host face (staging, host accept/reject)";
    if (x->q_in_slab)
        return "nowhere: the draft writes them only into a slab this target cannot read "
               "(sampled verifications will fail; see the config's shm_staging)";
    return "from the host face";
}

void xfer_debug_skip_waits(struct xfer *x, bool skip)
{
    if (x->dev)
        x->ops->debug_skip_waits(x->dev, skip);
}
