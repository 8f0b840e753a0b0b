/* draft_worker.c: the draft worker: model, KV slots, shared buffer, and the
 * message loop with the coordinator.
 *
 * Continuous batching, as in the target worker: prefills, rounds and
 * pre-drafts are queued as they arrive, and each step runs one forward call
 * for all of them (every sequence's next drafting step together); a round's
 * pre-draft takes the round's place in the queue when the round is done.
 *
 * Invariants: the shared buffer is created before the first register and
 * lives until destroy (its name goes into every register); a half is fully
 * written and fenced (shm_buffer_publish) before the draft_ready naming it is
 * sent; every command gets exactly one reply (draft: two when predraft_k > 0)
 * except release, heartbeat, welcome and shutdown.
 */
#include "draft_worker.h"

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
#include "shm_buffer.h"
#include "specdec.h"
#include "worker_link.h"
#include "worker_msg.h"

/* What a queued job is, for its reply. */
enum draft_kind { QD_PREFILL, QD_DRAFT, QD_PREDRAFT };

struct queued_draft {
    struct specdec_draft_job job;
    enum draft_kind kind;
    struct worker_msg_seq seq;
    int half;                   /* the half it writes (QD_DRAFT, QD_PREDRAFT) */
    int64_t round;
    int predraft_k;
    int32_t *feed;              /* owned copy: the message is gone */
    double compute_ms;          /* forward calls it took part in */
};

struct draft_worker {
    struct proc_config cfg;
    struct worker_main_model m; /* backend, weights, KV slots */
    struct specdec_draft *spec;
    struct shm_buffer *shm;
    struct worker_link *link;
    int k_max;
    struct queued_draft **queue; /* arrival order; one slot's jobs stay in order */
    struct specdec_draft_job **jobs; /* scratch: the queue's jobs for a step */
    int n_queued, queue_cap;
};

static cJSON *build_register(void *user)
{
    struct draft_worker *w = user;
    cJSON *h = worker_link_register_new("draft", w->cfg.draft_worker.model,
                                        w->cfg.draft_worker.backend, llama_model_config(w->m.model),
                                        w->m.max_seq_len, w->m.n_slots, w->m.kv_blocks,
                                        w->m.kv_block_size);
    cJSON *shm = h ? shm_buffer_export(w->shm) : NULL;
    if (!shm || !cJSON_AddItemToObject(h, "shm", shm)) {
        cJSON_Delete(shm);
        cJSON_Delete(h);
        return NULL;
    }
    return h;
}

static void send_draft_ready(struct draft_worker *w, const struct worker_msg_seq *seq, int half,
                             int64_t round, int k, int guess, bool predraft, double ms)
{
    struct worker_msg_draft_ready r = {
        .seq = *seq, .half = half, .round = round, .k = k, .guess = guess,
        .predraft = predraft, .draft_ms = ms,
    };
    worker_link_send(w->link, worker_msg_draft_ready_encode(&r), NULL, 0);
}

static int queue_grow(struct draft_worker *w)
{
    int cap = w->queue_cap ? 2 * w->queue_cap : 16;
    struct queued_draft **q = realloc(w->queue, (size_t)cap * sizeof *q);
    if (!q)
        return ERR_NOMEM;
    w->queue = q;
    struct specdec_draft_job **j = realloc(w->jobs, (size_t)cap * sizeof *j);
    if (!j)
        return ERR_NOMEM;
    w->jobs = j;
    w->queue_cap = cap;
    return 0;
}

static void queued_free(struct queued_draft *qd)
{
    if (!qd)
        return;
    free(qd->feed);
    free(qd);
}

static void queue_remove(struct draft_worker *w, int i)
{
    queued_free(w->queue[i]);
    memmove(w->queue + i, w->queue + i + 1, (size_t)(w->n_queued - i - 1) * sizeof *w->queue);
    w->n_queued--;
}

/* A new queued job with an owned copy of feed; NULL when out of memory. */
static struct queued_draft *queued_new(struct draft_worker *w, enum draft_kind kind,
                                       const struct worker_msg_seq *seq, const int32_t *feed,
                                       int n_feed)
{
    if (w->n_queued == w->queue_cap && queue_grow(w) != 0)
        return NULL;
    struct queued_draft *qd = calloc(1, sizeof *qd);
    int32_t *copy = malloc((size_t)(n_feed > 0 ? n_feed : 1) * sizeof(int32_t));
    if (!qd || !copy) {
        free(qd);
        free(copy);
        return NULL;
    }
    memcpy(copy, feed, (size_t)n_feed * sizeof(int32_t));
    qd->kind = kind;
    qd->seq = *seq;
    qd->feed = copy;
    qd->job.feed = copy;
    qd->job.n_feed = n_feed;
    qd->job.slot = seq->slot;
    return qd;
}

static void handle_prefill(void *user, const struct protocol_msg *m)
{
    struct draft_worker *w = user;
    char err[ERR_MSG_MAX];
    struct worker_msg_limits lim = worker_main_model_limits(&w->m, w->k_max);
    struct worker_msg_prefill p;
    int rc = worker_msg_prefill_decode(m, &lim, &p, err);
    if (rc) {
        worker_link_send_error(w->link, PROTOCOL_PREFILL, &p.seq, rc, err);
        return;
    }
    struct queued_draft *qd = queued_new(w, QD_PREFILL, &p.seq, p.prompt, p.n_prompt);
    if (!qd) {
        worker_link_send_error(w->link, PROTOCOL_PREFILL, &p.seq, ERR_NOMEM,
                               "prefill: out of memory queueing the prompt");
        return;
    }
    qd->job.keep_len = 0;
    qd->job.k = 0;
    qd->job.sp = p.sampling.sp;
    qd->job.mode = p.sampling.mode;
    specdec_draft_job_init(&qd->job);
    w->queue[w->n_queued++] = qd;
}

static void handle_draft(void *user, const struct protocol_msg *m)
{
    struct draft_worker *w = user;
    char err[ERR_MSG_MAX];
    struct worker_msg_limits lim = worker_main_model_limits(&w->m, w->k_max);
    struct worker_msg_draft d;
    int rc = worker_msg_draft_decode(m, &lim, &d, err);
    if (rc) {
        worker_link_send_error(w->link, PROTOCOL_DRAFT, &d.seq, rc, err);
        /* the coordinator waits for the pre-draft's reply too */
        if (d.seq.req >= 0 && d.seq.slot >= 0 && d.predraft_k > 0)
            send_draft_ready(w, &d.seq, 1 - d.half, d.round + 1, 0, -1, true, 0.0);
        return;
    }
    struct queued_draft *qd = queued_new(w, QD_DRAFT, &d.seq, d.feed, d.n_feed);
    if (!qd) {
        worker_link_send_error(w->link, PROTOCOL_DRAFT, &d.seq, ERR_NOMEM,
                               "draft: out of memory queueing the round");
        if (d.predraft_k > 0)
            send_draft_ready(w, &d.seq, 1 - d.half, d.round + 1, 0, -1, true, 0.0);
        return;
    }
    qd->half = d.half;
    qd->round = d.round;
    qd->predraft_k = d.predraft_k;
    /* Mark the half as being rewritten before anything touches it. */
    shm_buffer_half_header(w->shm, d.seq.slot, d.half)->req = UINT64_MAX;
    qd->job.keep_len = d.keep_len;
    qd->job.k = d.k;
    qd->job.sp = d.sampling.sp;
    qd->job.mode = d.sampling.mode;
    qd->job.tokens_out = shm_buffer_half_tokens(w->shm, d.seq.slot, d.half);
    qd->job.q_rows_out = shm_buffer_half_q(w->shm, d.seq.slot, d.half);
    specdec_draft_job_init(&qd->job);
    w->queue[w->n_queued++] = qd;
}

/* A finished round: publish its half and answer; then (optimistic
 * pre-draft) assume all k accepted, feed t_k, draw a guess of the bonus token
 * and predraft_k drafts after it into the other half. Returns the pre-draft
 * job that takes the round's place in the queue, or NULL. */
static struct queued_draft *finish_draft(struct draft_worker *w, struct queued_draft *qd)
{
    const struct specdec_draft_job *j = &qd->job;
    const int slot = qd->seq.slot, other = 1 - qd->half, k = j->k;
    if (j->rc) {
        worker_link_send_error(w->link, PROTOCOL_DRAFT, &qd->seq, j->rc, j->err);
        if (qd->predraft_k > 0)
            send_draft_ready(w, &qd->seq, other, qd->round + 1, 0, -1, true, 0.0);
        return NULL;
    }
    struct shm_half_header *hh = shm_buffer_half_header(w->shm, slot, qd->half);
    hh->round = (uint32_t)qd->round;
    hh->k = (uint32_t)k;
    hh->first = 0;
    hh->guess = 0;
    hh->req = (uint64_t)qd->seq.req;
    shm_buffer_publish(w->shm);
    send_draft_ready(w, &qd->seq, qd->half, qd->round, k, -1, false, qd->compute_ms);
    if (qd->predraft_k <= 0)
        return NULL;
    shm_buffer_half_header(w->shm, slot, other)->req = UINT64_MAX;
    if (k == 0) {
        send_draft_ready(w, &qd->seq, other, qd->round + 1, 0, -1, true, 0.0);
        return NULL;
    }
    const int32_t last = j->tokens_out[k - 1];
    struct queued_draft *pre = calloc(1, sizeof *pre);
    int32_t *feed = malloc(sizeof *feed);
    if (!pre || !feed) {
        free(pre);
        free(feed);
        LOG_DEBUG("pre-draft req %lld slot %d skipped: out of memory", (long long)qd->seq.req,
                  slot);
        send_draft_ready(w, &qd->seq, other, qd->round + 1, 0, -1, true, 0.0);
        return NULL;
    }
    feed[0] = last;
    *pre = (struct queued_draft){.kind = QD_PREDRAFT, .seq = qd->seq, .half = other,
                                 .round = qd->round + 1, .predraft_k = qd->predraft_k,
                                 .feed = feed};
    pre->job = (struct specdec_draft_job){
        .slot = slot, .keep_len = j->keep_len + j->n_feed + k - 1, .feed = feed, .n_feed = 1,
        .k = qd->predraft_k + 1, .sp = j->sp, .mode = j->mode,
        .tokens_out = shm_buffer_half_tokens(w->shm, slot, other),
        .q_rows_out = shm_buffer_half_q(w->shm, slot, other)};
    specdec_draft_job_init(&pre->job);
    return pre;
}

static void finish_predraft(struct draft_worker *w, struct queued_draft *qd)
{
    const struct specdec_draft_job *j = &qd->job;
    const int slot = qd->seq.slot;
    if (j->rc) {
        LOG_DEBUG("pre-draft req %lld slot %d skipped: %s", (long long)qd->seq.req, slot, j->err);
        send_draft_ready(w, &qd->seq, qd->half, qd->round, 0, -1, true, qd->compute_ms);
        return;
    }
    struct shm_half_header *oh = shm_buffer_half_header(w->shm, slot, qd->half);
    oh->round = (uint32_t)qd->round;
    oh->k = (uint32_t)qd->predraft_k;
    oh->first = 1;
    oh->guess = (uint32_t)j->tokens_out[0];
    oh->req = (uint64_t)qd->seq.req;
    shm_buffer_publish(w->shm);
    send_draft_ready(w, &qd->seq, qd->half, qd->round, qd->predraft_k, j->tokens_out[0], true,
                     qd->compute_ms);
}

/* worker_link_role.run_queued: one forward call for every queued prefill,
 * round and pre-draft that can take part (each drafting step of every
 * sequence together), then the replies of those finished. */
static long run_queued(void *user)
{
    struct draft_worker *w = user;
    if (w->n_queued == 0)
        return -1;
    for (int i = 0; i < w->n_queued; i++)
        w->jobs[i] = &w->queue[i]->job;
    struct specdec_step_info info;
    char err[ERR_MSG_MAX];
    int rc = specdec_draft_step(w->spec, w->jobs, w->n_queued, &info, err);
    if (rc) {
        /* nothing could run (out of memory): every queued job fails */
        for (int i = 0; i < w->n_queued; i++) {
            w->queue[i]->job.rc = rc;
            snprintf(w->queue[i]->job.err, sizeof w->queue[i]->job.err, "%s", err);
            w->queue[i]->job.done = true;
        }
    }
    for (int i = 0; i < w->n_queued; i++)
        if (w->queue[i]->job.in_step)
            w->queue[i]->compute_ms += info.ms;
    for (int i = 0; i < w->n_queued;) {
        struct queued_draft *qd = w->queue[i];
        if (!qd->job.done) {
            i++;
            continue;
        }
        struct queued_draft *next = NULL;
        if (qd->kind == QD_PREFILL) {
            if (qd->job.rc) {
                worker_link_send_error(w->link, PROTOCOL_PREFILL, &qd->seq, qd->job.rc,
                                       qd->job.err);
            } else {
                LOG_DEBUG("prefill req %lld slot %d: %d tokens in %.1f ms", (long long)qd->seq.req,
                          qd->seq.slot, qd->job.n_feed, qd->compute_ms);
                struct worker_msg_prefill_done done = {.seq = qd->seq,
                                                       .prefill_ms = qd->compute_ms};
                worker_link_send(w->link, worker_msg_prefill_done_encode(&done), NULL, 0);
            }
        } else if (qd->kind == QD_DRAFT) {
            next = finish_draft(w, qd);
        } else {
            finish_predraft(w, qd);
        }
        if (next) {
            /* the pre-draft takes the round's place: the slot's order holds */
            queued_free(qd);
            w->queue[i++] = next;
        } else {
            queue_remove(w, i);
        }
    }
    return w->n_queued > 0 ? 0 : -1;
}

static void handle_release(void *user, const struct protocol_msg *m)
{
    struct draft_worker *w = user;
    struct worker_msg_seq seq;
    if (worker_main_model_release(&w->m, w->link, m, &seq) == 0)
        for (int i = w->n_queued - 1; i >= 0; i--)
            if (w->queue[i]->seq.slot == seq.slot)
                queue_remove(w, i); /* its request is over: no reply wanted */
}

static const struct worker_link_command draft_commands[] = {
    {PROTOCOL_DRAFT, handle_draft},
    {PROTOCOL_PREFILL, handle_prefill},
    {PROTOCOL_RELEASE, handle_release},
    {NULL, NULL},
};

static const struct worker_link_role draft_link_role = {
    .name = "draft",
    .build_register = build_register,
    .on_welcome = NULL,
    .commands = draft_commands,
    .run_queued = run_queued,
};

static void draft_worker_destroy(void *worker);

/* Between the chunks of a long feed: the coordinator keeps hearing from us. */
static void on_chunk(void *user, int n_done, int n_total)
{
    struct draft_worker *w = user;
    (void)n_done;
    (void)n_total;
    worker_link_keepalive(w->link);
}

static int draft_worker_create(void **out, const struct proc_config *cfg, char *err)
{
    *out = NULL;
    const struct worker_config *wc = &cfg->draft_worker;
    struct draft_worker *w = calloc(1, sizeof *w);
    if (!w)
        return error_set(err, ERR_NOMEM, "draft worker: out of memory");
    w->cfg = *cfg;
    int rc;
    if ((rc = worker_main_model_load(&w->m, cfg, wc, err)))
        goto fail;
    if ((rc = specdec_draft_create(&w->spec, w->m.ctx, err)))
        goto fail;
    w->k_max = cfg->coordinator.spec_k_max;
    char cleanup_err[ERR_MSG_MAX];
    int removed = 0;
    if (shm_buffer_cleanup_stale(cfg->instance, false, &removed, cleanup_err) != 0)
        LOG_WARN("%s", cleanup_err);
    else if (removed > 0)
        LOG_INFO("removed %d stale shared-memory segment(s) of instance %s", removed,
                 cfg->instance);
    if ((rc = shm_buffer_create(&w->shm, "posix", cfg->instance, "draft", w->m.n_slots, w->k_max,
                                w->m.vocab, err)))
        goto fail;
    char note[PROC_CONFIG_PATH_MAX + 160];
    snprintf(note, sizeof note, "%s, vocab %d, %d slots, shm %s", wc->model, w->m.vocab,
             w->m.n_slots, shm_buffer_name(w->shm));
    if ((rc = worker_link_create(&w->link, &w->cfg, &draft_link_role, w, note, err)))
        goto fail;
    struct specdec_progress progress = {.chunk_tokens = wc->prefill_chunk, .on_chunk = on_chunk,
                                        .user = w};
    specdec_draft_set_progress(w->spec, &progress);
    LOG_INFO("draft model %s: vocab %d, %d slots x %d positions, shm %s (%.1f MiB)", wc->model,
             w->m.vocab, w->m.n_slots, w->m.max_seq_len, shm_buffer_name(w->shm),
             (double)shm_buffer_layout(w->shm)->size_bytes / (1024.0 * 1024.0));
    *out = w;
    return 0;
fail:
    draft_worker_destroy(w);
    return rc;
}

static int draft_worker_run(void *worker, volatile sig_atomic_t *stop, char *err)
{
    struct draft_worker *w = worker;
    return worker_link_run(w->link, stop, err);
}

static void draft_worker_destroy(void *worker)
{
    struct draft_worker *w = worker;
    if (!w)
        return;
    worker_link_destroy(w->link);
    for (int i = 0; i < w->n_queued; i++)
        queued_free(w->queue[i]);
    free(w->queue);
    free(w->jobs);
    shm_buffer_close(w->shm);
    specdec_draft_destroy(w->spec);
    worker_main_model_free(&w->m);
    free(w);
}

const struct worker_main_role draft_worker_role = {
    .name = "draft",
    .create = draft_worker_create,
    .run = draft_worker_run,
    .destroy = draft_worker_destroy,
};
