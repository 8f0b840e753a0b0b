/* target_worker.h: the target worker process's engine (everything but main).
 *
 * It holds the target model and one KV cache slot per sequence, imports the
 * draft's shared buffer (from the descriptor the coordinator forwards in
 * "welcome" or "attach", or in a verify) and serves the coordinator over a
 * DEALER socket: register, heartbeats, "verify" (k = 0: prefill / plain
 * decoding; k > 0: verification of drafts read in place from the shared
 * buffer), "release", "shutdown". See docs/protocol-notes.md.
 *
 * What it is not: it schedules nothing. Single-threaded: messages are
 * handled in arrival order on the thread that calls target_worker_run.
 */
#ifndef TANDEM_TARGET_WORKER_H
#define TANDEM_TARGET_WORKER_H

#include <signal.h>

#include "proc_config.h"

/* Exit status for config errors, unloadable models and a refusal. */
#define TARGET_WORKER_EXIT_CONFIG 78

struct target_worker;

/* Loads the model (cfg->target_worker), creates the context with
 * cfg->coordinator.max_concurrency slots and the socket. cfg is copied.
 * ERR_UNSUPPORTED for backend "cuda" (not built yet). */
int target_worker_create(struct target_worker **out, const struct proc_config *cfg, char *err);

/* Serves until *stop becomes nonzero, a "shutdown" arrives (returns 0) or
 * the coordinator refuses the worker (ERR_MISMATCH). Per-request failures
 * are reported to the coordinator and do not end it. */
int target_worker_run(struct target_worker *w, volatile sig_atomic_t *stop, char *err);

/* Closes the socket and the imported buffer, frees the model. NULL-safe. */
void target_worker_destroy(struct target_worker *w);

#endif
