/* coordinator.h: the Tandem coordinator, the process that owns requests.
 *
 * What it is: one thread around one zmq_poll loop over two ROUTER sockets,
 * clients (docs/protocol.md) and workers (docs/protocol-notes.md and
 * common/wire/protocol.h). It validates and tokenizes client requests, admits
 * them into worker slots (max_concurrency active, max_queue waiting, past
 * that `overloaded`), schedules speculation rounds (draft -> verify, with
 * the draft worker's pre-draft of the next round used when its guess of the
 * bonus token holds), applies stop conditions to accepted tokens, streams
 * text, keeps metrics, and watches both workers with heartbeats: without a
 * draft it decodes target-only; without a target its requests end with
 * `target_unavailable`.
 * What it is not: a model host (no weights here), multi-threaded, or a
 * supervisor (it never starts or kills workers).
 *
 * Invariants per active sequence (history H, n tokens): the target caches
 * H[0..n-1) after each verification (the last token is fed by the next
 * call); the draft's cache agrees with H on its first draft_valid positions.
 */
#ifndef TANDEM_COORDINATOR_H
#define TANDEM_COORDINATOR_H

#include <signal.h>

#include "proc_config.h"

struct coordinator;

/* Binds both sockets, loads the tokenizer (a missing tokenizer.json is a
 * warning: prompt_ids still work) and removes stale shared-memory segments
 * of this instance whose owner is gone. Copies cfg. Returns 0,
 * ERR_INVALID_ARG / ERR_SYSTEM (bind failed: the endpoint is named),
 * ERR_NOMEM, or the tokenizer's error for a malformed tokenizer file. */
int coordinator_create(struct coordinator **out, const struct proc_config *cfg, char *err);
void coordinator_destroy(struct coordinator *c);  /* NULL-safe */

/* Serves until *stop becomes nonzero (set by a signal handler). Returns 0
 * on a requested stop, ERR_SYSTEM when polling fails for good, the error of
 * metrics_http_create when coordinator.metrics_listen cannot be served
 * (ERR_INVALID_ARG: in use, not this host's). */
int coordinator_run(struct coordinator *c, volatile sig_atomic_t *stop, char *err);

#endif
