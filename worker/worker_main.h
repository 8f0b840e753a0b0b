/* worker_main.h: what both worker processes (tandem-draft-worker,
 * tandem-target-worker) share besides their link to the coordinator
 * (worker_link.h): main() itself (--help, the config, signals, create, run,
 * destroy, the exit status) and the model a worker holds (backend, weights,
 * one KV cache slot per sequence) with the "release" command on it.
 *
 * Exit status: 0 after SIGTERM/SIGINT or a "shutdown" from the coordinator;
 * WORKER_MAIN_EXIT_CONFIG (78, EX_CONFIG) for config errors, a model that
 * does not load (any create failure but ERR_SYSTEM and ERR_NOMEM) and a
 * refusal by the coordinator (run returning ERR_MISMATCH): the supervisor
 * does not restart those; 1 for other failures.
 *
 * What it is not: it knows nothing of models or messages; the role's
 * functions (draft_worker/, target_worker/) do the work. It installs the
 * process's SIGTERM/SIGINT handlers (which set a flag the role's run polls)
 * and ignores SIGPIPE: call it once per process, from main.
 */
#ifndef TANDEM_WORKER_MAIN_H
#define TANDEM_WORKER_MAIN_H

#include <signal.h>

#include "error.h"
#include "kernels.h"
#include "llama.h"
#include "proc_config.h"
#include "protocol.h"
#include "worker_link.h"
#include "worker_msg.h"

#define WORKER_MAIN_EXIT_CONFIG 78

/* One worker process. Borrowed by worker_main for the whole run. */
struct worker_main_role {
    /* "draft" | "target": the log tag, the program name
     * "tandem-<name>-worker" and the config section "<name>_worker". */
    const char *name;
    /* Creates the worker from the finalized config (copy what you keep).
     * 0 with *out set, or a code with the reason in err. */
    int (*create)(void **out, const struct proc_config *cfg, char *err);
    /* Serves until *stop becomes nonzero or a shutdown (0), or fails
     * (ERR_MISMATCH: refused by the coordinator). */
    int (*run)(void *worker, volatile sig_atomic_t *stop, char *err);
    /* NULL-safe. */
    void (*destroy)(void *worker);
};

/* Runs a worker process: returns its exit status (above). Logs every
 * failure's reason once before returning. */
int worker_main(int argc, char **argv, const struct worker_main_role *role);

/* A worker's model. Plain struct owned by the worker; zero it before load. */
struct worker_main_model {
    struct kern_backend *be;
    struct llama_model *model;
    struct llama_ctx *ctx; /* n_slots sequences of max_seq_len positions */
    int vocab, n_slots, max_seq_len;
    int kv_blocks, kv_block_size; /* the paged KV pool all slots share */
    bool prefix_cache;            /* whether the pool keeps filled blocks for later prompts */
    bool borrowed;                /* be, model, ctx are the caller's (worker_main_model_borrow) */
    /* The cores a CPU backend computes on, for register's "cpu" (cpu.present
     * false on a GPU backend, or where the host or the affinity could not
     * be read: the coordinator then measures instead of knowing). */
    struct worker_msg_cpu cpu;
    char cpu_host[WORKER_MSG_CPU_HOST_MAX + 1];
    char cpu_list[WORKER_MSG_CPU_LIST_MAX + 1];
};

/* Loads wc->model on wc->backend with wc->threads, and creates a context of
 * cfg->coordinator.max_concurrency slots x wc->max_seq_len positions (the
 * fields vocab, n_slots, max_seq_len hold what was allocated).
 * The backend is wc->backend on wc->device (kern_backend_create: "cuda"
 * without a build or a usable GPU is refused there, in one line). Returns
 * what kern_backend_create, llama_model_load and llama_ctx_create report.
 * On failure m is freed and zeroed. */
int worker_main_model_load(struct worker_main_model *m, const struct proc_config *cfg,
                           const struct worker_config *wc, char *err);

/* A worker's model made of what an in-process caller loaded (docs/one-core.md):
 * be, model and ctx are borrowed (they must outlive m) and
 * worker_main_model_free leaves them to the caller. The facts are read as
 * load reads them, the cores for register's "cpu" included. */
void worker_main_model_borrow(struct worker_main_model *m, struct kern_backend *be,
                              struct llama_model *model, struct llama_ctx *ctx);

/* What the prefix cache did for a prompt of looked_up tokens, cached of
 * them found, and where the cache stands, for the prompt's reply (not
 * present with the cache off). */
struct worker_msg_prefix worker_main_prefix(const struct worker_main_model *m, int looked_up,
                                            int cached);

/* llama_ctx_warm_up on the loaded model, timed in the log: a worker runs it
 * once its model is ready for requests (argmax copy made, sampler placed),
 * before it registers with the coordinator. */
int worker_main_model_warm_up(struct worker_main_model *m, char *err);

/* What commands to this worker are checked against: its slots, context
 * length and vocabulary, and k_max drafts per round. */
struct worker_msg_limits worker_main_model_limits(const struct worker_main_model *m, int k_max);

/* Frees what load created and zeroes m; safe on a zeroed struct. */
void worker_main_model_free(struct worker_main_model *m);

/* A failure that leaves the worker unusable (a CUDA error is sticky): the
 * first one is kept, the run loop is told to stop, and the role's run
 * returns it, so the process exits and the supervisor restarts it. */
struct worker_fatal {
    volatile sig_atomic_t *stop; /* run's flag, set by the role's run */
    int rc;                      /* 0, or the first failure */
    char err[ERR_MSG_MAX];
};
void worker_fatal_set(struct worker_fatal *f, int rc, const char *err);
/* What the role's run returns: link_rc, or the kept failure when the link
 * stopped cleanly because of it. */
int worker_fatal_result(const struct worker_fatal *f, int link_rc, char *err);

/* Serves "release {req, slot}": truncates the slot to 0 (its KV blocks go
 * back to the pool). No reply; an "error" (in_reply_to "release") when a
 * field is bad or truncation fails. Returns 0 with the released sequence in
 * *seq_out (the role drops what it queued for the slot), or the error. */
int worker_main_model_release(struct worker_main_model *m, struct worker_link *link,
                              const struct protocol_msg *msg, struct worker_msg_seq *seq_out);

/* Empties every slot (the coordinator that filled them is gone:
 * worker_link_role.on_coordinator_lost), so the paged pool is whole again
 * for the next one. A slot that cannot be truncated is logged; 0 or the
 * first failure's code. */
int worker_main_model_release_all(struct worker_main_model *m);

#endif
