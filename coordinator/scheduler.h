/* scheduler.h: the coordinator's sequences: queue and admission into worker
 * slots, speculation rounds (draft -> verify, pre-drafts), accepted tokens
 * and stop conditions, endings. The round protocol is described at the top
 * of scheduler.c. */
#ifndef TANDEM_SCHEDULER_H
#define TANDEM_SCHEDULER_H

#include "coord_state.h"

/* Queues a filled-in sequence (prompt, sampling, K control) and admits
 * what fits. */
void scheduler_enqueue(struct coordinator *c, struct seq *s);
/* Admits queued sequences while slots and a target are available. */
void scheduler_admit(struct coordinator *c);
/* Fails requests past request_timeout_ms, then admits. */
void scheduler_tick(struct coordinator *c);
/* Ends a sequence with an error reply (code) and frees its slot. */
void scheduler_fail(struct coordinator *c, struct seq *s, enum metrics_error code, const char *message);
/* Ends a queued or active sequence without a reply: releases its slot on
 * both workers (as a finished sequence does), counts it as cancelled and
 * admits what waits. Replies the workers still send for it are dropped as
 * stale. */
void scheduler_cancel(struct coordinator *c, struct seq *s);
/* Cancels every request of the clients noted in c->gone (their replies
 * cannot be delivered) and empties the list. Called from the poll loop,
 * never from inside a reply. */
void scheduler_cancel_gone(struct coordinator *c);
/* Frees what the record owns and marks it free (keeps its slot number). */
void scheduler_seq_reset(struct seq *s);
/* Drops everything the sequence expected from the draft and moves it on. */
void scheduler_forget_draft(struct coordinator *c, struct seq *s);

/* Worker replies of pair `pair`'s workers, from the registry's dispatch
 * (a reply naming another pair's sequence is stale). */
void scheduler_on_verify_done(struct coordinator *c, int pair, const struct protocol_msg *msg);
void scheduler_on_draft_ready(struct coordinator *c, int pair, const struct protocol_msg *msg);
void scheduler_on_prefill_done(struct coordinator *c, int pair, const struct protocol_msg *msg);
void scheduler_on_worker_error(struct coordinator *c, int pair, enum worker_role role,
                               const struct protocol_msg *msg);

#endif
