/* worker_send.h: the one way out to the workers. Below both the registry
 * and the scheduler (neither calls the other to send): a registered
 * worker's messages go on its lane once it has one (lanes.h), else on the
 * worker socket; a message to a process that is not registered (a refusal)
 * goes on the socket to its routing id. In-process (coordinator.local set,
 * docs/one-core.md) every message goes to the caller's transport instead,
 * by the same routing id. Never blocks. A unit test of the
 * scheduler or the registry links its own record of these two instead.
 */
#ifndef TANDEM_WORKER_SEND_H
#define TANDEM_WORKER_SEND_H

#include "coord_state.h"

/* Sends hdr (deleted here, whatever happens) and an optional frame (NULL:
 * none) to the worker of this role in this pair. 0 or protocol_send's code
 * (logged). */
int worker_send(struct coordinator *c, int pair, enum worker_role role, cJSON *hdr,
                const struct protocol_frame *frame);

/* The same with n_frames frames (a verify with the feed and a half). */
int worker_send_frames(struct coordinator *c, int pair, enum worker_role role, cJSON *hdr,
                       const struct protocol_frame *frames, int n_frames);

/* Sends hdr (deleted here) to the process with this routing id on the
 * worker socket. 0 or protocol_send's code (logged). */
int worker_send_to_identity(struct coordinator *c, const uint8_t *identity, size_t identity_size, cJSON *hdr);

#endif
