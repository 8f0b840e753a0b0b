/* target_worker.c: the target worker: model, KV slots, the imported draft
 * buffer, and the message loop with the coordinator.
 *
 * Its commands, one per meaning (docs/protocol-notes.md): prefill (the
 * prompt, the first token), run (plain steps), verify_matched (the
 * coordinator's drafts, in the message), verify_tree (the coordinator's
 * token tree, in the message) and verify (the draft's half). Each
 * becomes the same kind of queued job (specdec_verify_job), so all of them
 * batch together.
 *
 * Continuous batching: a command is checked and queued when it arrives; the
 * link then runs one step of all queued jobs at a time
 * (specdec_target_step: one forward call for every sequence, a long prompt
 * a chunk per step beside them), and answers each job as it finishes.
 * Commands arriving meanwhile join the next step.
 *
 * Invariants: every step of a command gets exactly one reply (verify_done
 * or error, naming the command; a run has as many steps as it asks for,
 * every other command one);
 * drafts and q rows are read in place from the draft's buffer only after
 * the half's published header (xfer_half_read, acquire) matched the
 * verify's req and round, and the half's seq is re-checked after the step
 * (xfer_half_unchanged) so a half the draft rewrote meanwhile is
 * reported, never silently used. The imported buffer is replaced, never patched, when
 * the coordinator names a different one (a restarted draft): queued
 * verifications that read the old one are failed first. A release drops the
 * queued verifications of its slot. After a verification's step, its last
 * read of the half is marked (xfer_end_read: the consumed event the draft's
 * next write of the half waits for). A buffer whose draft is going (its
 * name removed: xfer_owner_gone, looked at every heartbeat) is let go of at
 * once, so the draft never frees a slab this process still maps.
 *
 * Device sampling (target_worker.sampler "device", the default on cuda):
 * logits stay on the GPU and accept/reject runs there. Where q rows come
 * from, for a sampled verification:
 *   cuda_ipc, slab mapped: the stream waits for the half's event on the GPU
 *     and the accept/reject reads the rows in the mapping (no host copy, no
 *     host wait between the draft's write and this read);
 *   cuda_ipc staging (shm_staging, or no peer access): the rows are read in
 *     the pinned host face after the event wait and uploaded by the engine
 *     with the drafts (one copy of k rows): the same kernels decide, so a
 *     seeded request gives the same tokens as over the slab;
 *   posix, or a CPU target: the host face as always.
 * A draft that writes q rows only into its slab (descriptor q_rows "slab")
 * to a target that cannot map it gets an error for sampled verifications
 * naming the settings that fix it; greedy and point-mass ones need no q.
 * The transports are common/xfer's: this file holds no CUDA code.
 */
#include "target_worker.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "llama.h"
#include "logging.h"
#include "protocol.h"
#include "sampling.h"
#include "specdec.h"
#include "worker_grammar.h"
#include "worker_link.h"
#include "worker_msg.h"
#include "xfer.h"

/* A verification waiting or in progress, with what its reply needs. */
struct queued_verify {
    struct specdec_verify_job job;
    const char *type;           /* the command (prefill, run, verify_matched, verify_tree, verify): errors name it */
    struct worker_msg_seq seq;
    int64_t round;
    int half;
    bool reads_shm;             /* k > 0: it reads the half (slot, half) in place */
    uint64_t shm_seq;           /* the half's publication it read (xfer_half_read) */
    bool staging_pending;       /* cuda_ipc: its q rows are being copied (xfer_q_rows staged) */
    int32_t *feed;              /* owned copy: the message is gone */
    /* drafts the coordinator made (verify_matched, verify_tree), verified
     * as point masses: they are the job's drafts instead of the half's; a
     * tree's parents beside them */
    int32_t inline_drafts[WORKER_MSG_TREE_NODES_MAX];
    int32_t inline_parents[WORKER_MSG_TREE_NODES_MAX];
    struct sampling_controls ctl; /* the job's controls (job.ctl points here when set) */
    double queued_ms;
    double compute_ms;          /* forward calls it took part in */
    int step, steps;            /* a run of plain steps (run "steps"): the one running, of */
    /* sent beside its draft (verify "await_draft"): the half does not hold
     * the round yet; the verification waits for it until the deadline */
    bool draft_pending;
    double draft_deadline_ms;
};

struct target_worker {
    struct proc_config cfg;
    struct worker_main_model m; /* backend, weights, KV slots */
    struct specdec_target *spec;
    struct worker_grammar *grammar; /* the slots' grammars (structured output) */
    struct xfer *shm; /* the draft's buffer, imported read-only; NULL until attached */
    struct worker_link *link;
    struct worker_fatal fatal;   /* a sticky CUDA failure stops the worker */
    double last_step_end_ms; /* 0 before the first step */
    /* Gathering: slots answered by the last step whose next verification
     * (sent by the coordinator as soon as it reads the answer) has not
     * arrived yet; the next step waits a little for them, so sequences that
     * decode in lockstep stay in one forward call instead of splitting into
     * alternating halves. */
    bool *awaiting;           /* [n_slots] */
    int n_awaiting;
    double last_step_ms;
    struct queued_verify **queue; /* arrival order */
    struct specdec_verify_job **jobs; /* scratch: the queue's jobs for a step */
    int n_queued, queue_cap;
    int64_t steps;            /* forward calls run so far */
};

static cJSON *build_register(void *user)
{
    struct target_worker *w = user;
    const struct worker_link_facts facts = {
        .model = w->cfg.target_worker.model, .backend = w->cfg.target_worker.backend, .mc = llama_model_config(w->m.model),
        .max_seq_len = w->m.max_seq_len, .n_slots = w->m.n_slots, .kv_blocks = w->m.kv_blocks,
        .kv_block_size = w->m.kv_block_size, .cpu = &w->m.cpu};
    return worker_link_register_new("target", &facts, w->cfg.pair);
}

static void queued_free(struct queued_verify *qv)
{
    if (!qv)
        return;
    free(qv->feed);
    free(qv);
}

/* The longest a step waits for the next verifications of the sequences the
 * previous step answered: a small share of a step, so that waiting never
 * costs much more than it saves, and a few milliseconds at most. */
#define GATHER_MAX_MS 3.0
#define GATHER_STEP_SHARE 0.25

/* The longest a verification sent beside its draft waits for the draft to
 * publish the round: long past any drafting round (a few ms on the CPU
 * pair, tens with a long catch-up), short enough that a draft that failed
 * the round or died costs its request little. At the deadline the
 * verification fails with "timeout", and the coordinator sends it again
 * the usual way once the draft answers (or decodes without it). */
#define DRAFT_AWAIT_MAX_MS 500.0
/* The longest the worker sleeps on a draft's buffer at a time, so that
 * commands from the coordinator (a release, another verification) wait
 * no longer than this. */
#define DRAFT_AWAIT_SLICE_MS 2.0

static void awaiting_clear(struct target_worker *w, int slot)
{
    if (slot >= 0 && slot < w->m.n_slots && w->awaiting[slot]) {
        w->awaiting[slot] = false;
        w->n_awaiting--;
    }
}

static void queue_remove(struct target_worker *w, int i)
{
    queued_free(w->queue[i]);
    memmove(w->queue + i, w->queue + i + 1, (size_t)(w->n_queued - i - 1) * sizeof *w->queue);
    w->n_queued--;
}

static int queue_grow(struct target_worker *w)
{
    int cap = w->queue_cap ? 2 * w->queue_cap : 16;
    struct queued_verify **q = realloc(w->queue, (size_t)cap * sizeof *q);
    if (!q)
        return ERR_NOMEM;
    w->queue = q;
    struct specdec_verify_job **j = realloc(w->jobs, (size_t)cap * sizeof *j);
    if (!j)
        return ERR_NOMEM;
    w->jobs = j;
    w->queue_cap = cap;
    return 0;
}

/* Queued verifications that read drafts from the current buffer get an
 * error and leave the queue (their pointers would outlive the mapping). */
static void fail_queued_readers(struct target_worker *w, const char *why)
{
    for (int i = w->n_queued - 1; i >= 0; i--) {
        if (!w->queue[i]->reads_shm)
            continue;
        worker_link_send_error(w->link, w->queue[i]->type, &w->queue[i]->seq, ERR_UNAVAILABLE, why);
        queue_remove(w, i);
    }
}

/* Closes the device side and the mapping of the draft's buffer: the
 * driver frees a dead draft's slab only once every mapping of it is
 * closed, so this runs as soon as the coordinator names another buffer or
 * the draft removes its name. */
static void detach(struct target_worker *w)
{
    xfer_close(w->shm, 0);
    w->shm = NULL;
}

/* Imports the buffer a descriptor names unless it is the one held already. */
static int attach(struct target_worker *w, const cJSON *desc, char *err)
{
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(desc, "name");
    if (w->shm && cJSON_IsString(name) && strcmp(name->valuestring, xfer_name(w->shm)) == 0)
        return 0;
    /* the vocabulary is checked before anything is mapped on the device */
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(desc, "vocab");
    if (cJSON_IsNumber(vocab) && vocab->valuedouble != (double)w->m.vocab)
        return error_set(err, ERR_MISMATCH, "shm %s: draft vocabulary %.0f differs from the "
                         "target's %d", cJSON_IsString(name) ? name->valuestring : "?",
                         vocab->valuedouble, w->m.vocab);
    /* The old buffer goes first, its readers failed: a restarted draft's
     * predecessor is dead, and its slab stays allocated on the GPU for as
     * long as this process maps it. */
    fail_queued_readers(w, "verify: the draft's buffer was replaced (draft restarted)");
    detach(w);
    struct xfer *buf = NULL;
    int rc = xfer_import(&buf, w->m.be, desc, w->cfg.target_worker.shm_staging != 0, err);
    if (rc)
        return rc;
    const struct shm_layout *lay = xfer_layout(buf);
    LOG_INFO("attached the draft buffer %s (%s, %d slots, k_max %d)", xfer_name(buf),
             xfer_transport(buf), lay->n_slots, lay->k_max);
    w->shm = buf;
    LOG_INFO("sampled verifications take q rows %s",
             xfer_q_path(w->shm, specdec_target_on_device(w->spec)));
    return 0;
}

static void handle_attach(struct target_worker *w, const struct protocol_msg *m, const char *type)
{
    char err[ERR_MSG_MAX];
    const cJSON *desc = NULL;
    int rc = protocol_get_object_opt(m->header, "shm", &desc, err);
    if (rc == 0 && desc)
        rc = attach(w, desc, err);
    else if (rc == 0 && strcmp(type, PROTOCOL_ATTACH) == 0)
        rc = error_set(err, ERR_PROTOCOL, "shm: required");
    if (rc)
        worker_link_send_error(w->link, type, NULL, rc, err);
}

/* Points qv's job at its drafts (and q rows) in the draft's buffer, once
 * the half holds the round it names. ERR_UNAVAILABLE with *not_yet set
 * when the half does not hold it yet and qv may wait for it (a verify sent
 * beside its draft: "await_draft"); any other failure is the verify's
 * error, in err. */
static int bind_drafts(struct target_worker *w, struct queued_verify *qv, bool may_wait, bool *not_yet,
                       char *err)
{
    struct specdec_verify_job *j = &qv->job;
    const int slot = qv->seq.slot, half = qv->half, k = j->k;
    const int64_t req = qv->seq.req, round = qv->round;
    *not_yet = false;
    if (!w->shm)
        return error_set(err, ERR_UNAVAILABLE, "verify: no draft shared buffer attached (k > 0)");
    const struct shm_layout *lay = xfer_layout(w->shm);
    if (slot >= lay->n_slots)
        return error_set(err, ERR_PROTOCOL, "slot: must be < %d (draft buffer slots), got %d",
                         lay->n_slots, slot);
    struct shm_half_info hi = {0};
    int hr = xfer_half_read(w->shm, slot, half, &hi, &qv->shm_seq);
    const bool holds_round = hr == 0 && hi.req == (uint64_t)req && hi.round == (uint32_t)round;
    if (!holds_round && may_wait) {
        *not_yet = true;
        return ERR_UNAVAILABLE;
    }
    if (!holds_round || (uint32_t)k > hi.k || hi.first > 1 ||
        hi.first + (uint32_t)k > (uint32_t)lay->k_max + 1) {
        if (hr != 0)
            return error_set(err, ERR_PROTOCOL,
                             "verify: shm slot %d half %d is being rewritten by the draft, expected "
                             "req %lld round %lld", slot, half, (long long)req, (long long)round);
        return error_set(err, ERR_PROTOCOL,
                         "verify: shm slot %d half %d holds req %llu round %u k %u, expected req "
                         "%lld round %lld k >= %d",
                         slot, half, (unsigned long long)hi.req, hi.round, hi.k, (long long)req,
                         (long long)round, k);
    }
    const uint32_t h_first = hi.first;
    /* q rows (the cases in the file's header): a device address in the
     * mapped slab, a staged copy, or the host face */
    struct xfer_q q = {0};
    const bool wants_q = j->mode == SPECULATE_MODE_SAMPLED && !sampling_params_is_greedy(&j->sp);
    if (wants_q) {
        int rc = xfer_q_rows(w->shm, slot, half, h_first, k, specdec_target_on_device(w->spec), &q,
                             err);
        if (rc) {
            /* only a failed device call is the worker's end; a draft whose
             * rows this target cannot read is this verification's error */
            if (rc != ERR_UNAVAILABLE)
                worker_fatal_set(&w->fatal, rc, err);
            return rc;
        }
    }
    j->draft = xfer_half_tokens(w->shm, slot, half) + h_first;
    j->q_rows = q.host;
    j->q_rows_dev = q.dev;
    qv->staging_pending = q.staged;
    qv->draft_pending = false;
    return 0;
}

/* Queues the job of a target command: the call's feed (copied) after its
 * keep_len, then k drafts (none for prefill and run; bound below for a
 * verify, copied here for a verify_matched). The caller finishes the job's
 * fields its command sets, then queue_push. NULL (after an error reply)
 * when out of memory. */
static struct queued_verify *queued_new(struct target_worker *w, const char *type,
                                        const struct worker_msg_target_call *call, int k, int steps)
{
    struct queued_verify *qv = calloc(1, sizeof *qv);
    int32_t *feed = malloc((size_t)call->n_feed * sizeof(int32_t));
    if (!qv || !feed || (w->n_queued == w->queue_cap && queue_grow(w) != 0)) {
        free(qv);
        free(feed);
        worker_link_send_error(w->link, type, &call->seq, ERR_NOMEM, "out of memory queueing the verification");
        return NULL;
    }
    memcpy(feed, call->feed, (size_t)call->n_feed * sizeof(int32_t));
    const double now = protocol_now_ms();
    *qv = (struct queued_verify){.type = type, .seq = call->seq, .round = call->round, .feed = feed,
                                 .queued_ms = now, .step = 1, .steps = steps,
                                 .draft_deadline_ms = now + DRAFT_AWAIT_MAX_MS};
    qv->job = (struct specdec_verify_job){
        .slot = call->seq.slot, .keep_len = call->keep_len, .feed = feed, .n_feed = call->n_feed, .k = k,
        .sp = call->sampling.sp, .mode = call->sampling.mode, .logprobs = call->logprobs.on,
        .top_logprobs = call->logprobs.top};
    qv->ctl = call->sampling.ctl;
    if (sampling_controls_active(&qv->ctl))
        qv->job.ctl = &qv->ctl;
    qv->job.gram = worker_grammar_slot(w->grammar, call->seq.slot);
    return qv;
}

static void queue_push(struct target_worker *w, struct queued_verify *qv)
{
    specdec_verify_job_init(&qv->job);
    w->queue[w->n_queued++] = qv;
    awaiting_clear(w, qv->seq.slot);
}

/* prefill: the prompt from position 0, the first token chosen. */
static void handle_prefill(void *user, const struct protocol_msg *m)
{
    struct target_worker *w = user;
    char err[ERR_MSG_MAX];
    struct worker_msg_limits lim = worker_main_model_limits(&w->m, SPECULATE_K_MAX);
    struct worker_msg_prefill p;
    int rc = worker_msg_prefill_decode(m, &lim, &p, err);
    if (rc) {
        worker_link_send_error(w->link, PROTOCOL_PREFILL, &p.seq, rc, err);
        return;
    }
    /* the prompt sets the slot's grammar (or none) for the sequence's life */
    if ((rc = worker_grammar_set(w->grammar, p.seq.slot, p.grammar, p.n_prompt, err))) {
        worker_link_send_error(w->link, PROTOCOL_PREFILL, &p.seq, rc, err);
        return;
    }
    const struct worker_msg_target_call call = {
        .seq = p.seq, .round = p.round, .keep_len = 0, .sampling = p.sampling, .feed = p.prompt,
        .n_feed = p.n_prompt, .logprobs = p.logprobs};
    struct queued_verify *qv = queued_new(w, PROTOCOL_PREFILL, &call, 0, 1);
    if (qv)
        queue_push(w, qv);
}

/* run: plain decoding steps, no drafts. */
static void handle_run(void *user, const struct protocol_msg *m)
{
    struct target_worker *w = user;
    char err[ERR_MSG_MAX];
    struct worker_msg_limits lim = worker_main_model_limits(&w->m, SPECULATE_K_MAX);
    struct worker_msg_run r;
    int rc = worker_msg_run_decode(m, &lim, &r, err);
    if (rc) {
        worker_link_send_error(w->link, PROTOCOL_RUN, &r.call.seq, rc, err);
        return;
    }
    struct queued_verify *qv = queued_new(w, PROTOCOL_RUN, &r.call, 0, r.steps);
    if (qv)
        queue_push(w, qv);
}

/* verify_matched: the coordinator's drafts, in the message. */
static void handle_verify_matched(void *user, const struct protocol_msg *m)
{
    struct target_worker *w = user;
    char err[ERR_MSG_MAX];
    struct worker_msg_limits lim = worker_main_model_limits(&w->m, SPECULATE_K_MAX);
    struct worker_msg_verify_matched v;
    int rc = worker_msg_verify_matched_decode(m, &lim, &v, err);
    if (rc) {
        worker_link_send_error(w->link, PROTOCOL_VERIFY_MATCHED, &v.call.seq, rc, err);
        return;
    }
    struct queued_verify *qv = queued_new(w, PROTOCOL_VERIFY_MATCHED, &v.call, v.n_drafts, 1);
    if (!qv)
        return;
    /* no draft distribution exists for them: each is a point mass, so the
     * output stays the target's (speculate.h) */
    memcpy(qv->inline_drafts, v.drafts, (size_t)v.n_drafts * sizeof(int32_t));
    qv->job.draft = qv->inline_drafts;
    qv->job.mode = SPECULATE_MODE_POINT_MASS;
    queue_push(w, qv);
}

/* verify_tree: the coordinator's token tree, in the message, verified in
 * one forward and its accepted path kept (specdec_verify_job.parents). */
static void handle_verify_tree(void *user, const struct protocol_msg *m)
{
    struct target_worker *w = user;
    char err[ERR_MSG_MAX];
    struct worker_msg_limits lim = worker_main_model_limits(&w->m, SPECULATE_K_MAX);
    struct worker_msg_verify_tree v;
    int rc = worker_msg_verify_tree_decode(m, &lim, &v, err);
    if (rc) {
        worker_link_send_error(w->link, PROTOCOL_VERIFY_TREE, &v.call.seq, rc, err);
        return;
    }
    struct queued_verify *qv = queued_new(w, PROTOCOL_VERIFY_TREE, &v.call, v.n_nodes, 1);
    if (!qv)
        return;
    memcpy(qv->inline_drafts, v.drafts, (size_t)v.n_nodes * sizeof(int32_t));
    memcpy(qv->inline_parents, v.parents, (size_t)v.n_nodes * sizeof(int32_t));
    qv->job.draft = qv->inline_drafts;
    qv->job.parents = qv->inline_parents;
    qv->job.mode = SPECULATE_MODE_POINT_MASS;
    queue_push(w, qv);
}

/* verify: the drafts (and q rows) of the draft's half. */
static void handle_verify(void *user, const struct protocol_msg *m)
{
    struct target_worker *w = user;
    char err[ERR_MSG_MAX];
    struct worker_msg_limits lim = worker_main_model_limits(&w->m, SPECULATE_K_MAX);
    struct worker_msg_verify v;
    int rc = worker_msg_verify_decode(m, &lim, &v, err);
    const struct worker_msg_seq *seq = &v.call.seq;
    if (!rc && v.shm)
        rc = attach(w, v.shm, err);
    /* A draft that shares no memory with us: the half rides as the second
     * frame (the first is the feed), into our "frames" buffer. */
    if (!rc && m->n_frames >= 2)
        rc = w->shm ? xfer_half_store(w->shm, seq->slot, v.half, m->frame_data[1], m->frame_size_bytes[1], err)
                    : error_set(err, ERR_UNAVAILABLE, "verify: a half's bytes but no draft buffer attached");
    if (rc) {
        worker_link_send_error(w->link, PROTOCOL_VERIFY, seq, rc, err);
        return;
    }
    struct queued_verify *qv = queued_new(w, PROTOCOL_VERIFY, &v.call, v.k, 1);
    if (!qv)
        return;
    qv->half = v.half;
    qv->reads_shm = true;
    bool not_yet = false;
    rc = bind_drafts(w, qv, v.await_draft, &not_yet, err);
    if (not_yet) {
        qv->draft_pending = true;
    } else if (rc) {
        worker_link_send_error(w->link, PROTOCOL_VERIFY, seq, rc, err);
        queued_free(qv);
        return;
    }
    queue_push(w, qv);
}

/* The reply of a finished verification. */
static void reply_verify(struct target_worker *w, struct queued_verify *qv,
                         const struct specdec_step_info *info, double idle_ms)
{
    char err[ERR_MSG_MAX];
    struct specdec_verify_job *j = &qv->job;
    if (qv->reads_shm && w->shm) {
        /* every read of the half was queued by the step that finished it,
         * failed or not */
        int rc = xfer_end_read(w->shm, qv->seq.slot, qv->half, err);
        if (rc) {
            worker_fatal_set(&w->fatal, rc, err);
            worker_link_send_error(w->link, qv->type, &qv->seq, rc, err);
            return;
        }
    }
    if (j->rc) {
        worker_link_send_error(w->link, qv->type, &qv->seq, j->rc, j->err);
        return;
    }
    if (qv->reads_shm) {
        if (!xfer_half_unchanged(w->shm, qv->seq.slot, qv->half, qv->shm_seq)) {
            snprintf(err, sizeof err,
                     "verify: shm slot %d half %d was rewritten by the draft during the verify",
                     qv->seq.slot, qv->half);
            worker_link_send_error(w->link, qv->type, &qv->seq, ERR_PROTOCOL, err);
            return;
        }
    }
    LOG_DEBUG("verify req %lld slot %d round %lld: k %d, accepted %d, %.1f ms in a call of %d "
              "sequences", (long long)qv->seq.req, qv->seq.slot, (long long)qv->round, j->k,
              j->n_accepted, qv->compute_ms, info->seqs);
    struct worker_msg_verify_done done = {
        .seq = qv->seq, .round = qv->round, .n_accepted = j->n_accepted,
        .verify_ms = qv->compute_ms, .idle_ms = idle_ms, .draft_k = j->k, .step = qv->step,
        .tokens = j->tokens_out, .n_tokens = j->n_accepted + 1, .call = w->steps,
        .call_seqs = info->seqs, .call_rows = info->rows, .call_ms = info->ms,
    };
    if (j->keep_len == 0) /* a prompt */
        done.prefix = worker_main_prefix(&w->m, j->n_feed, j->cached);
    if (j->logprobs) {
        done.has_logprobs = true;
        memcpy(done.logprobs, j->logprobs_out, (size_t)done.n_tokens * sizeof done.logprobs[0]);
    }
    struct protocol_frame frame;
    cJSON *h = worker_msg_verify_done_encode(&done, &frame);
    worker_link_send(w->link, h, &frame, 1);
}

/* A plain run's next step, when one is due: it feeds the token this step
 * chose, on the KV this step left (k is 0: nothing was accepted past the
 * feed). Not after an error, the run's last step or an end-of-sequence
 * token (the coordinator ends the request there). A step past the context
 * fails in the engine, and its error reply ends the request: the
 * coordinator never waits for a step that will not come. */
static bool plain_run_next(struct target_worker *w, struct queued_verify *qv)
{
    struct specdec_verify_job *j = &qv->job;
    if (j->rc || qv->step >= qv->steps)
        return false;
    const int32_t token = j->tokens_out[0];
    const struct model_config *mc = llama_model_config(w->m.model);
    for (int i = 0; i < mc->n_eos_token_ids; i++)
        if (mc->eos_token_ids[i] == token)
            return false;
    qv->feed[0] = token;
    j->keep_len += j->n_feed;
    j->feed = qv->feed;
    j->n_feed = 1;
    specdec_verify_job_init(j);
    qv->step++;
    qv->compute_ms = 0;
    qv->queued_ms = protocol_now_ms();
    return true;
}

/* Verifications sent beside their drafts: bound once the draft has
 * published their round, failed at their deadline. Returns how many
 * queued verifications can run now; *wait_on is one still waiting (NULL if
 * none), with the half's seq read before its last check in *seen. */
static int bind_pending(struct target_worker *w, struct queued_verify **wait_on, uint64_t *seen)
{
    *wait_on = NULL;
    int ready = 0;
    const double now = protocol_now_ms();
    for (int i = 0; i < w->n_queued;) {
        struct queued_verify *qv = w->queue[i];
        if (!qv->draft_pending) {
            ready++;
            i++;
            continue;
        }
        char err[ERR_MSG_MAX];
        bool not_yet = false;
        const uint64_t before = w->shm ? xfer_half_seq(w->shm, qv->seq.slot, qv->half) : 0;
        int rc = bind_drafts(w, qv, true, &not_yet, err);
        if (not_yet && now < qv->draft_deadline_ms) {
            if (!*wait_on) {
                *wait_on = qv;
                *seen = before;
            }
            i++;
            continue;
        }
        if (not_yet)
            rc = error_set(err, ERR_TIMEOUT,
                           "verify: the draft did not publish round %lld in slot %d half %d within %.0f ms",
                           (long long)qv->round, qv->seq.slot, qv->half, DRAFT_AWAIT_MAX_MS);
        if (rc) {
            worker_link_send_error(w->link, qv->type, &qv->seq, rc, err);
            queue_remove(w, i);
            continue;
        }
        ready++;
        i++;
    }
    return ready;
}

/* worker_link_role.run_queued: one forward call for every queued
 * verification that can take part, then the replies of those finished. */
static long run_queued(void *user)
{
    struct target_worker *w = user;
    if (w->n_queued == 0)
        return -1;
    struct queued_verify *wait_on = NULL;
    uint64_t seen = 0;
    if (bind_pending(w, &wait_on, &seen) == 0) {
        if (wait_on) {
            /* nothing else to run: sleep until the draft publishes (woken
             * by it), a slice at a time so commands are still read */
            double left = wait_on->draft_deadline_ms - protocol_now_ms();
            int wr = xfer_half_wait(w->shm, wait_on->seq.slot, wait_on->half, seen,
                                          left < DRAFT_AWAIT_SLICE_MS ? left : DRAFT_AWAIT_SLICE_MS);
            if (wr != 0 && wr != ERR_TIMEOUT)
                LOG_WARN("waiting on the draft's buffer: %s", error_name(wr));
        }
        return w->n_queued > 0 ? 0 : -1;
    }
    if (w->n_awaiting > 0 && w->last_step_end_ms > 0) {
        double window = w->last_step_ms * GATHER_STEP_SHARE;
        if (window > GATHER_MAX_MS)
            window = GATHER_MAX_MS;
        const double left = w->last_step_end_ms + window - protocol_now_ms();
        if (left >= 0.5)
            return (long)(left + 0.5);
    }
    for (int s = 0; s < w->m.n_slots; s++)
        w->awaiting[s] = false;
    w->n_awaiting = 0;
    /* the host reads q rows in this step: their copies must have landed
     * (a copy stuck behind a dead draft's event leaves this process's
     * stream stuck too: fatal, the supervisor restarts the worker) */
    for (int i = 0; i < w->n_queued; i++) {
        struct queued_verify *qv = w->queue[i];
        if (!qv->staging_pending)
            continue;
        char serr[ERR_MSG_MAX];
        int src = xfer_wait_staged(w->shm, qv->seq.slot, qv->half, serr);
        if (src) {
            worker_fatal_set(&w->fatal, src, serr);
            return -1;
        }
        qv->staging_pending = false;
    }
    int n_jobs = 0;
    for (int i = 0; i < w->n_queued; i++)
        if (!w->queue[i]->draft_pending)
            w->jobs[n_jobs++] = &w->queue[i]->job;
    struct specdec_step_info info;
    char err[ERR_MSG_MAX];
    const double t0 = protocol_now_ms();
    /* The gap since the previous call ended: control-plane time and
     * waiting for drafts, the overhead the pipeline exists to hide. */
    const double idle_ms = w->last_step_end_ms > 0 ? t0 - w->last_step_end_ms : -1;
    int rc = specdec_target_step(w->spec, w->jobs, n_jobs, &info, err);
    w->last_step_end_ms = protocol_now_ms();
    w->last_step_ms = w->last_step_end_ms - t0;
    if (rc) {
        /* nothing could run (out of memory): every queued verification fails */
        for (int i = w->n_queued - 1; i >= 0; i--) {
            worker_link_send_error(w->link, w->queue[i]->type, &w->queue[i]->seq, rc, err);
            queue_remove(w, i);
        }
        return -1;
    }
    if (info.seqs > 0)
        w->steps++;
    for (int i = 0; i < w->n_queued; i++)
        if (w->queue[i]->job.in_step)
            w->queue[i]->compute_ms += info.ms;
    for (int i = 0; i < w->n_queued;) {
        struct queued_verify *qv = w->queue[i];
        if (!qv->job.done) {
            i++;
            continue;
        }
        reply_verify(w, qv, &info, idle_ms);
        if (plain_run_next(w, qv)) {
            i++; /* queued for the next step: the slot waits for nothing */
            continue;
        }
        if (!qv->job.rc && !w->awaiting[qv->seq.slot]) {
            w->awaiting[qv->seq.slot] = true;
            w->n_awaiting++;
        }
        queue_remove(w, i);
    }
    return w->n_queued > 0 ? 0 : -1;
}

static void handle_release(void *user, const struct protocol_msg *m)
{
    struct target_worker *w = user;
    struct worker_msg_seq seq;
    if (worker_main_model_release(&w->m, w->link, m, &seq) == 0) {
        awaiting_clear(w, seq.slot);
        for (int i = w->n_queued - 1; i >= 0; i--)
            if (w->queue[i]->seq.slot == seq.slot)
                queue_remove(w, i); /* its request is over: no reply wanted */
    }
}

/* A welcome may name the draft's buffer (worker_link_role.on_welcome). */
static void on_welcome(void *user, const struct protocol_msg *m)
{
    handle_attach(user, m, PROTOCOL_WELCOME);
}

static void handle_attach_cmd(void *user, const struct protocol_msg *m)
{
    handle_attach(user, m, PROTOCOL_ATTACH);
}

/* worker_link_role.on_coordinator_lost: its verifications go, no reply.
 * The draft's buffer stays attached: the draft outlives the coordinator,
 * and the next welcome names the buffer again (attach keeps the same one). */
static void on_coordinator_lost(void *user)
{
    struct target_worker *w = user;
    int n = w->n_queued;
    while (w->n_queued > 0)
        queue_remove(w, w->n_queued - 1);
    for (int s = 0; s < w->m.n_slots; s++)
        awaiting_clear(w, s);
    worker_main_model_release_all(&w->m);
    LOG_INFO("dropped %d queued verifications and emptied every slot", n);
}

static const struct worker_link_command target_commands[] = {
    {PROTOCOL_PREFILL, handle_prefill},
    {PROTOCOL_RUN, handle_run},
    {PROTOCOL_VERIFY_MATCHED, handle_verify_matched},
    {PROTOCOL_VERIFY_TREE, handle_verify_tree},
    {PROTOCOL_VERIFY, handle_verify},
    {PROTOCOL_ATTACH, handle_attach_cmd},
    {PROTOCOL_RELEASE, handle_release},
    {NULL, NULL},
};

/* worker_link_role.on_tick: a draft that is going (it removed its buffer's
 * name and waits, bounded, for this process to let go before it frees its
 * slab) is let go of; its queued readers fail first. */
static void on_tick(void *user)
{
    struct target_worker *w = user;
    if (!w->shm || !xfer_owner_gone(w->shm))
        return;
    LOG_INFO("the draft's buffer %s was removed (the draft is stopping or gone): letting go of it",
             xfer_name(w->shm));
    fail_queued_readers(w, "verify: the draft's buffer went away (draft stopping)");
    detach(w);
}

static const struct worker_link_role target_link_role = {
    .name = "target",
    .build_register = build_register,
    .on_welcome = on_welcome,
    .commands = target_commands,
    .run_queued = run_queued,
    .on_coordinator_lost = on_coordinator_lost,
    .on_tick = on_tick,
};

static void target_worker_destroy(void *worker);

/* Between the chunks of a long feed: the coordinator keeps hearing from us. */
static void on_chunk(void *user, int n_done, int n_total)
{
    struct target_worker *w = user;
    (void)n_done;
    (void)n_total;
    worker_link_keepalive(w->link);
}

/* The engine over the model w->m holds: verification, the slots'
 * grammars, the argmax screen, the sampler the config names, the slots'
 * gathering marks; a model of our own is warmed up (a borrowed one is the
 * caller's, warm). */
static int target_engine_create(struct target_worker *w, const struct worker_config *wc, char *err)
{
    int rc;
    if ((rc = specdec_target_create(&w->spec, w->m.ctx, err)) ||
        (rc = worker_grammar_create(&w->grammar, wc->model, llama_model_config(w->m.model),
                                    w->m.n_slots, err)))
        return rc;
    /* outside the log call: LOG_INFO skips its arguments below the level,
     * and a worker logging at "warn" read whole LM heads for it */
    const bool screen = wc->argmax_copy && specdec_target_prepare_argmax(w->spec);
    LOG_INFO("target argmax screen: %s", screen ? "on" : !wc->argmax_copy ? "off (argmax_copy 0)"
                                                               : "off (no copy of the LM head)");
    if (strcmp(wc->sampler, "device") == 0 &&
        (rc = specdec_target_use_device(w->spec, true, err)))
        return rc;
    LOG_INFO("target sampler: %s", specdec_target_on_device(w->spec) ? "device" : "host");
    if (!w->m.borrowed && (rc = worker_main_model_warm_up(&w->m, err)))
        return rc;
    w->awaiting = calloc((size_t)w->m.n_slots, sizeof *w->awaiting);
    if (!w->awaiting)
        return error_set(err, ERR_NOMEM, "target worker: out of memory");
    return 0;
}

/* The link (the socket's, or the in-process one over `local`) and the
 * progress callback that keeps it alive through long feeds. */
static int target_link_create(struct target_worker *w, const struct worker_link_local *local, char *err)
{
    const struct worker_config *wc = &w->cfg.target_worker;
    char note[PROC_CONFIG_PATH_MAX + 64];
    snprintf(note, sizeof note, "%s, vocab %d, %d slots", wc->model, w->m.vocab, w->m.n_slots);
    int rc = local ? worker_link_create_local(&w->link, &target_link_role, w, local, err)
                   : worker_link_create(&w->link, &w->cfg, &target_link_role, w, note, err);
    if (rc)
        return rc;
    struct specdec_progress progress = {.chunk_tokens = wc->prefill_chunk, .on_chunk = on_chunk,
                                        .user = w};
    specdec_target_set_progress(w->spec, &progress);
    LOG_INFO("target model %s: vocab %d, %d slots x %d positions", wc->model, w->m.vocab,
             w->m.n_slots, w->m.max_seq_len);
    return 0;
}

static int target_worker_create(void **out, const struct proc_config *cfg, char *err)
{
    *out = NULL;
    const struct worker_config *wc = &cfg->target_worker;
    struct target_worker *w = calloc(1, sizeof *w);
    if (!w)
        return error_set(err, ERR_NOMEM, "target worker: out of memory");
    w->cfg = *cfg;
    int rc;
    if ((rc = worker_main_model_load(&w->m, cfg, wc, err)) || (rc = target_engine_create(w, wc, err)) ||
        (rc = target_link_create(w, NULL, err))) {
        target_worker_destroy(w);
        return rc;
    }
    *out = w;
    return 0;
}

int target_worker_create_local(void **out, const struct proc_config *cfg, const struct worker_main_model *m,
                               const struct worker_link_local *local, char *err)
{
    *out = NULL;
    struct target_worker *w = calloc(1, sizeof *w);
    if (!w)
        return error_set(err, ERR_NOMEM, "target worker: out of memory");
    w->cfg = *cfg;
    w->m = *m;
    int rc;
    if ((rc = target_engine_create(w, &cfg->target_worker, err)) || (rc = target_link_create(w, local, err))) {
        target_worker_destroy(w);
        return rc;
    }
    *out = w;
    return 0;
}

struct worker_link *target_worker_link(void *worker)
{
    return ((struct target_worker *)worker)->link;
}

static int target_worker_run(void *worker, volatile sig_atomic_t *stop, char *err)
{
    struct target_worker *w = worker;
    w->fatal.stop = stop;
    return worker_fatal_result(&w->fatal, worker_link_run(w->link, stop, err), err);
}

static void target_worker_destroy(void *worker)
{
    struct target_worker *w = worker;
    if (!w)
        return;
    worker_link_destroy(w->link);
    for (int i = 0; i < w->n_queued; i++)
        queued_free(w->queue[i]);
    free(w->queue);
    free(w->jobs);
    free(w->awaiting);
    detach(w);
    specdec_target_destroy(w->spec);
    worker_grammar_destroy(w->grammar);
    worker_main_model_free(&w->m);
    free(w);
}

const struct worker_main_role target_worker_role = {
    .name = "target",
    .create = target_worker_create,
    .run = target_worker_run,
    .destroy = target_worker_destroy,
};
