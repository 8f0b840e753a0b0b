/* registry.h: the coordinator's worker records, two per pair (a register
 * names its pair): registration, the draft/target pairing check, heartbeats and liveness, and the dispatch of
 * worker messages to the scheduler. Sends through worker_send.h. */
#ifndef TANDEM_REGISTRY_H
#define TANDEM_REGISTRY_H

#include "coord_state.h"

/* Reads one message from the worker socket and dispatches it. */
void registry_on_message(struct coordinator *c);
/* Handles one worker message (msg->identity: its sender): a registration,
 * a lane marker, or a registered worker's message, whose replies go to the
 * scheduler. Messages of unknown senders are dropped. */
void registry_dispatch(struct coordinator *c, const struct protocol_msg *msg);

/* Reads what waits on the lane of a worker whose messages come there
 * (lanes.h); an end of file loses the worker, as its silence would. */
void registry_on_lane(struct coordinator *c, int pair, enum worker_role role);
/* Heartbeats to both workers; declares a silent worker lost. */
void registry_tick(struct coordinator *c);
/* A pair's draft is gone (timeout, refusal, re-registration): its sequences
 * continue target-only. */
void registry_draft_lost(struct coordinator *c, int pair, const char *why);
/* A pair's target is gone: its requests fail with target_unavailable (the
 * queued ones too when no other pair has a target). */
void registry_target_lost(struct coordinator *c, int pair, const char *why);

#endif
