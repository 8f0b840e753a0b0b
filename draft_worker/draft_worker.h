/* draft_worker.h: the draft worker process's engine (everything but main).
 *
 * It holds the draft model and one KV cache slot per sequence, owns the
 * shared buffer the draft tokens and q rows go into (common/xfer/xfer.h),
 * and serves the coordinator over a DEALER socket: register, heartbeats,
 * "prefill", "draft" (with the optimistic pre-draft into the other half),
 * "release", "shutdown". See docs/protocol-notes.md for the exact messages.
 *
 * What it is not: it schedules nothing; every position it keeps or drops is
 * named by the coordinator (keep_len). Single-threaded: messages are handled
 * in arrival order on the thread that calls run.
 */
#ifndef TANDEM_DRAFT_WORKER_H
#define TANDEM_DRAFT_WORKER_H

#include "worker_main.h"

/* The draft worker as worker/worker_main.h runs it:
 * - create loads the model (cfg->draft_worker), creates the context with
 *   cfg->coordinator.max_concurrency slots, removes the instance's stale
 *   shared-memory segments, creates the shared buffer (k_max =
 *   cfg->coordinator.spec_k_max; transport shm_transport: cuda_ipc with
 *   backend cuda, with its slab and events on the model's GPU) and the
 *   coordinator link (worker/worker_link.h). cfg is copied. Model and CUDA
 *   errors as kern_backend_create, llama_model_load and
 *   xfer_create report them; ERR_INVALID_ARG for cuda_ipc on the CPU
 *   backend.
 * - a CUDA failure while serving is sticky: run reports it and returns it
 *   (the process exits, the supervisor restarts it).
 * - run serves until *stop becomes nonzero (signal), a "shutdown" arrives
 *   (returns 0) or the coordinator refuses the worker (ERR_MISMATCH, message
 *   in err). Per-request failures are reported to the coordinator and do not
 *   end it.
 * - destroy closes the link, unlinks the shared buffer, frees the model.
 *   NULL-safe. */
extern const struct worker_main_role draft_worker_role;

/* The draft role in the caller's process (docs/one-core.md): the model is
 * m's (worker_main_model_borrow: borrowed, already warm), the settings
 * cfg's (copied) as create reads them, the shared buffer the same, and the
 * link local (worker_link_create_local over `local`, borrowed). Destroy it
 * with draft_worker_role.destroy, which leaves the model to the caller.
 * Errors as create's. */
int draft_worker_create_local(void **out, const struct proc_config *cfg, const struct worker_main_model *m,
                              const struct worker_link_local *local, char *err);

/* The worker's link, for worker_link_announce, _deliver and _step. */
struct worker_link *draft_worker_link(void *worker);

#endif
