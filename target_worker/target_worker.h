/* target_worker.h: the target worker process's engine (everything but main).
 *
 * It holds the target model and one KV cache slot per sequence, imports the
 * draft's shared buffer (from the descriptor the coordinator forwards in
 * "welcome" or "attach", or in a verify) and serves the coordinator over a
 * DEALER socket: register, heartbeats, "prefill" (the prompt and the first
 * token), "run" (plain decoding steps), "verify_matched" (drafts the
 * coordinator made, in the message), "verify" (drafts read in place from the
 * shared buffer), "release", "shutdown". See docs/protocol-notes.md.
 *
 * What it is not: it schedules nothing. Single-threaded: messages are
 * handled in arrival order on the thread that calls run.
 */
#ifndef TANDEM_TARGET_WORKER_H
#define TANDEM_TARGET_WORKER_H

#include "worker_main.h"

/* The target worker as worker/worker_main.h runs it:
 * - create loads the model (cfg->target_worker), creates the context with
 *   cfg->coordinator.max_concurrency slots and the coordinator link
 *   (worker/worker_link.h). cfg is copied. Model errors as
 *   kern_backend_create and llama_model_load report them.
 * - a cuda_ipc draft buffer is mapped on the target's GPU (slab, events;
 *   staging through pinned host memory where that cannot work or
 *   shm_staging is set) and closed as soon as the coordinator names another
 *   buffer; a CUDA failure while serving is sticky: run returns it.
 * - run serves until *stop becomes nonzero (signal), a "shutdown" arrives
 *   (returns 0) or the coordinator refuses the worker (ERR_MISMATCH).
 *   Per-request failures are reported to the coordinator and do not end it.
 * - destroy closes the link and the imported buffer, frees the model.
 *   NULL-safe. */
extern const struct worker_main_role target_worker_role;

/* The target role in the caller's process (docs/one-core.md): the model
 * is m's (worker_main_model_borrow: borrowed, already warm), the settings
 * cfg's (copied) as create reads them, and the link local
 * (worker_link_create_local over `local`, borrowed); the draft's buffer is
 * attached from the welcome, as over a socket. Destroy it with
 * target_worker_role.destroy, which leaves the model to the caller. Errors
 * as create's. */
int target_worker_create_local(void **out, const struct proc_config *cfg, const struct worker_main_model *m,
                               const struct worker_link_local *local, char *err);

/* The worker's link, for worker_link_announce, _deliver and _step. */
struct worker_link *target_worker_link(void *worker);

#endif
