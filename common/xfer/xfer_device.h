/* xfer_device.h: the device side of a transport, as xfer.c calls it
 * (private to common/xfer). One table per transport with a device side;
 * "posix" has none. The cuda_ipc entry (xfer_cuda_ipc.c) is the only file
 * of the room that sees CUDA's entry points; in a build without CUDA its
 * create and import say so.
 */
#ifndef TANDEM_XFER_DEVICE_H
#define TANDEM_XFER_DEVICE_H

#include <stdbool.h>
#include <stddef.h>

#include "kernels.h"
#include "shm_buffer.h"
#include "xfer.h"

struct xfer_device;

/* What a writer's device side says of itself once created. */
struct xfer_device_info {
    bool q_in_slab; /* q rows live in the slab alone (xfer_params' rule) */
    char note[256]; /* what the log says of it */
};

struct xfer_device_ops {
    /* Writer: the device side of shm (which it describes in shm's "cuda"
     * object: shm_buffer_set_cuda), on be; *info filled (q_in_slab false
     * on an error). */
    int (*create)(struct xfer_device **out, struct kern_backend *be, struct shm_buffer *shm,
                  const struct xfer_params *p, struct xfer_device_info *info, char *err);
    /* Reader: opens shm's device side on be (falling back to staging). */
    int (*import)(struct xfer_device **out, struct kern_backend *be, struct shm_buffer *shm,
                  bool force_staging, char *err);
    int (*begin_write)(struct xfer_device *d, int half, char *err);
    /* Writer: the slab's base in device memory (q rows in the slab). */
    char *(*slab_base)(struct xfer_device *d);
    int (*publish)(struct xfer_device *d, int half, size_t bytes, char *err);
    /* Reader: the slab is mapped (else it stages through the host face). */
    bool (*maps_slab)(const struct xfer_device *d);
    int (*read_device)(struct xfer_device *d, int half, size_t offset, size_t bytes,
                       const void **dev, char *err);
    int (*stage)(struct xfer_device *d, int half, size_t offset, size_t bytes, const void **host,
                 char *err);
    int (*staged)(struct xfer_device *d, int half, char *err);
    int (*end_read)(struct xfer_device *d, int half, char *err);
    void (*close)(struct xfer_device *d, bool peer_may_map);
    void (*debug_skip_waits)(struct xfer_device *d, bool skip);
};

extern const struct xfer_device_ops xfer_cuda_ipc_ops;

#endif
