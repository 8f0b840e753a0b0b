/* local.h: the server's speculation in one process (docs/one-core.md): the
 * coordinator's scheduler and the draft and target roles, joined by a
 * queue below worker_send instead of sockets, so that an in-process tool
 * (tandem-generate) runs the policy the server runs: the same intake, the
 * same rounds, adaptive K, draft sources (model, ngram, suffix, auto, none)
 * and endings, the same messages through their encoders and decoders.
 *
 * The transport is one FIFO, no threads: a message sent by either side is
 * queued; local_run delivers the queue in order (a command to its role's
 * handler, a worker's reply to registry_dispatch, which may queue the next
 * commands), and when the queue is empty runs a step of each role's queued
 * work (one forward call), until the request's done or error reply.
 *
 * What it is not: a server. One request at a time, no liveness (nothing
 * here can die but the process), no lanes, no pre-drafts or verification
 * beside the draft (one thread: the pair is cores_shared, registry.c).
 * Not part of tandem-coordinator, which links no model code
 * (tests/layering): the library is tandem_local, beside tandem_coord_core.
 */
#ifndef TANDEM_LOCAL_H
#define TANDEM_LOCAL_H

#include <cjson/cJSON.h>

#include "proc_config.h"
#include "worker_main.h"

struct local;

struct local_params {
    /* The settings, as the three processes would read them (copied): the
     * coordinator section (policy: spec_k, spec_k_max, draft, suffix
     * cache, max_concurrency 1 is enough), the draft_worker and
     * target_worker sections (model directories for grammars, sampler,
     * argmax_copy). instance is replaced by one of this process's, so the
     * draft's shared buffer never meets a server's. */
    const struct proc_config *cfg;
    /* The models, borrowed (worker_main_model_borrow; warm). draft NULL:
     * no draft model (drafts made by the coordinator, or none). */
    const struct worker_main_model *target;
    const struct worker_main_model *draft;
};

/* Creates the coordinator and the roles over p's models and registers
 * them (the registry's own path: the pair is checked and welcomed as a
 * server's would be). 0, or the failing part's code: a draft the
 * registry refuses is ERR_MISMATCH with its reason. */
int local_create(struct local **out, const struct local_params *p, char *err);

/* A client reply: token (streamed requests), done, or error, as
 * docs/protocol.md writes them; borrowed for the call. Returns 0, or
 * nonzero to cancel the request (local_run then returns ERR_CANCELLED). */
typedef int (*local_reply_fn)(void *user, const cJSON *reply);

/* Runs one generate request (request: its JSON text, docs/protocol.md) to
 * its end, handing every reply to on_reply. 0 once the done or error reply
 * was handed over (an error reply is the request's outcome, not a failure
 * of the run); ERR_CANCELLED when on_reply asked to stop; ERR_INTERNAL
 * when the pipeline stopped with the request unfinished (a bug: nothing
 * is queued and no role has work). */
int local_run(struct local *l, const char *request, local_reply_fn on_reply, void *user, char *err);

/* The draft/target cost ratio c the pair's K controller measured so far
 * (adaptive_k_cost_ratio of the pair's history), 0 before any. */
double local_cost_ratio(const struct local *l);

/* Destroys the roles (leaving the models to the caller) and the
 * coordinator. NULL-safe. */
void local_destroy(struct local *l);

#endif
