/* draft_worker.h: the draft worker process's engine (everything but main).
 *
 * It holds the draft model and one KV cache slot per sequence, owns the
 * shared buffer the draft tokens and q rows go into (common/shm_buffer.h),
 * and serves the coordinator over a DEALER socket: register, heartbeats,
 * "prefill", "draft" (with the optimistic pre-draft into the other half),
 * "release", "shutdown". See docs/protocol-notes.md for the exact messages.
 *
 * What it is not: it schedules nothing; every position it keeps or drops is
 * named by the coordinator (keep_len). Single-threaded: messages are handled
 * in arrival order on the thread that calls draft_worker_run.
 */
#ifndef TANDEM_DRAFT_WORKER_H
#define TANDEM_DRAFT_WORKER_H

#include <signal.h>

#include "proc_config.h"

/* Exit status of a worker refused by the coordinator or misconfigured:
 * the supervisor does not restart it (EX_CONFIG). */
#define DRAFT_WORKER_EXIT_CONFIG 78

struct draft_worker;

/* Loads the model (cfg->draft_worker), creates the context with
 * cfg->coordinator.max_concurrency slots, the shared buffer (k_max =
 * cfg->coordinator.spec_k_max) and the socket. cfg is copied.
 * ERR_UNSUPPORTED for backend "cuda" (not built yet), model errors as
 * llama_model_load reports them. */
int draft_worker_create(struct draft_worker **out, const struct proc_config *cfg, char *err);

/* Serves until *stop becomes nonzero (signal), a "shutdown" arrives (returns
 * 0) or the coordinator refuses the worker (ERR_MISMATCH, message in err).
 * Per-request failures are reported to the coordinator and do not end it. */
int draft_worker_run(struct draft_worker *w, volatile sig_atomic_t *stop, char *err);

/* Closes the socket, unlinks the shared buffer, frees the model. NULL-safe. */
void draft_worker_destroy(struct draft_worker *w);

#endif
