/* registry.h: the coordinator's two worker records: registration, the
 * draft/target pairing check, heartbeats and liveness, and the dispatch of
 * worker messages to the scheduler. */
#ifndef TANDEM_REGISTRY_H
#define TANDEM_REGISTRY_H

#include "coord_state.h"

/* Sends hdr (deleted here, whatever happens) and an optional frame (NULL:
 * none) to the worker of this role without blocking. 0 or protocol_send's
 * code (logged). */
int registry_send(struct coordinator *c, enum worker_role role, cJSON *hdr, const struct protocol_frame *frame);
/* Reads one message from the worker socket and handles it. */
void registry_on_message(struct coordinator *c);

/* Reads what waits on the lane of a worker whose messages come there
 * (lanes.h); an end of file loses the worker, as its silence would. */
void registry_on_lane(struct coordinator *c, enum worker_role role);
/* Heartbeats to both workers; declares a silent worker lost. */
void registry_tick(struct coordinator *c);
/* The draft is gone (timeout, refusal, re-registration): its sequences
 * continue target-only. */
void registry_draft_lost(struct coordinator *c, const char *why);
/* The target is gone: every request fails with target_unavailable. */
void registry_target_lost(struct coordinator *c, const char *why);

#endif
