/* draft_worker.c: the draft worker: model, KV slots, shared buffer, and the
 * message loop with the coordinator.
 *
 * Continuous batching, as in the target worker: prefills, rounds and
 * pre-drafts are queued as they arrive, and each step runs one forward call
 * for all of them (every sequence's next drafting step together); a round's
 * pre-draft takes the round's place in the queue when the round is done.
 *
 * Invariants: the shared buffer is created before the first register and
 * lives until destroy (its name goes into every register); a half is made
 * ready for writing (xfer_begin_write: the reader's last read of it is
 * done, and the seqlock marks it) before anything writes its tokens or q
 * rows, and published (xfer_publish) before the draft_ready naming it is
 * sent; every command gets exactly one reply (draft: two when predraft_k > 0)
 * except release, heartbeat, welcome and shutdown.
 *
 * Device sampling (draft_worker.sampler "device", the default on cuda): the
 * drafting picks run on the GPU and only token ids come back. With the
 * cuda_ipc transport in device mode and a target that reads the slab on its
 * GPU, the sampling kernels write the q rows straight into the slab half
 * (xfer_q_dest gives a device address): begin_write, the kernels, then the
 * publish records the half's ready event after them and before draft_ready
 * leaves; q never touches host memory. Otherwise (posix, staging, a CPU
 * target) q rows land in the host face as with the host sampler. The
 * transports are common/xfer's: this file holds no CUDA code.
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
#include "specdec.h"
#include "worker_grammar.h"
#include "worker_link.h"
#include "worker_msg.h"
#include "xfer.h"

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
    struct worker_grammar *grammar; /* the slots' grammars (structured output) */
    struct xfer *buf;          /* the shared halves (host face + the transport's device side) */
    struct worker_link *link;
    struct worker_fatal fatal;   /* a sticky CUDA failure stops the worker */
    bool halves_as_frames;       /* the target reads no memory of ours (its welcome) */
    int k_max;
    struct queued_draft **queue; /* arrival order; one slot's jobs stay in order */
    struct specdec_draft_job **jobs; /* scratch: the queue's jobs for a step */
    int n_queued, queue_cap;
};

static cJSON *build_register(void *user)
{
    struct draft_worker *w = user;
    const struct worker_link_facts facts = {
        .model = w->cfg.draft_worker.model, .backend = w->cfg.draft_worker.backend, .mc = llama_model_config(w->m.model),
        .max_seq_len = w->m.max_seq_len, .n_slots = w->m.n_slots, .kv_blocks = w->m.kv_blocks,
        .kv_block_size = w->m.kv_block_size, .cpu = &w->m.cpu};
    cJSON *h = worker_link_register_new("draft", &facts, w->cfg.pair);
    cJSON *shm = h ? xfer_export(w->buf) : NULL;
    if (!shm || !cJSON_AddItemToObject(h, "shm", shm)) {
        cJSON_Delete(shm);
        cJSON_Delete(h);
        return NULL;
    }
    return h;
}

/* Nothing was published for the reply (a failed or empty draft). */
#define NOT_PUBLISHED (-1)

/* q_rows: the q rows published in the half (0: tokens alone), or
 * NOT_PUBLISHED. A target that shares no memory with this draft (the
 * welcome's "halves": "frames") gets the published half as the message's
 * frame, through the coordinator. */
static void send_draft_ready(struct draft_worker *w, struct worker_msg_draft_ready r, int q_rows)
{
    const struct worker_msg_seq *seq = &r.seq;
    const int half = r.half;
    if (w->halves_as_frames && q_rows != NOT_PUBLISHED) {
        char err[ERR_MSG_MAX];
        void *bytes = NULL;
        size_t len = 0;
        if (xfer_half_pack(w->buf, seq->slot, half, q_rows, &bytes, &len, err) == 0) {
            const struct protocol_frame frame = {.data = bytes, .size_bytes = len};
            worker_link_send(w->link, worker_msg_draft_ready_encode(&r), &frame, 1);
            free(bytes);
            return;
        }
        /* no target could read what it names: a draft that failed */
        LOG_ERROR("req %lld slot %d half %d: %s; the round's drafts are dropped", (long long)seq->req, seq->slot,
                  half, err);
        r.k = 0;
        r.guess = -1;
    }
    worker_link_send(w->link, worker_msg_draft_ready_encode(&r), NULL, 0);
}

/* A pre-draft of (seq, half, round) that was not made: nothing to read. */
static void send_no_predraft(struct draft_worker *w, const struct worker_msg_seq *seq, int half, int64_t round,
                             double ms)
{
    send_draft_ready(w, (struct worker_msg_draft_ready){.seq = *seq, .half = half, .round = round, .k = 0,
                                                        .guess = -1, .predraft = true, .draft_ms = ms},
                     NOT_PUBLISHED);
}

/* A welcome says how the target reads this draft's halves (registry.c). */
static void on_welcome(void *user, const struct protocol_msg *m)
{
    struct draft_worker *w = user;
    const char *halves = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m->header, "halves"));
    const bool frames = halves != NULL && strcmp(halves, "frames") == 0;
    if (frames != w->halves_as_frames)
        LOG_INFO("the target %s: %s", frames ? "shares no memory with this draft" : "maps this draft's buffer",
                 frames ? "each published half goes with its draft_ready" : "halves stay in the buffer");
    w->halves_as_frames = frames;
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
    qd->job.gram = worker_grammar_slot(w->grammar, seq->slot);
    return qd;
}

/* Before anything rewrites slot/half (xfer_begin_write); a failure is a
 * device failure (or a reader that died mid-round) and stops the worker. */
static int half_begin_write(struct draft_worker *w, int slot, int half, char *err)
{
    int rc = xfer_begin_write(w->buf, slot, half, err);
    if (rc)
        worker_fatal_set(&w->fatal, rc, err);
    return rc;
}

/* Publishes slot/half (xfer_publish: queued, not waited for, before the
 * message that names the half leaves). with_q: the job wrote q rows
 * (sampled mode at temperature > 0); where they went to the host face they
 * move with the header and tokens. */
static int half_publish(struct draft_worker *w, int slot, int half,
                        const struct shm_half_info *info, int rows, bool with_q)
{
    char err[ERR_MSG_MAX];
    int rc = xfer_publish(w->buf, slot, half, info, rows, with_q, err);
    if (rc)
        worker_fatal_set(&w->fatal, rc, err);
    return rc;
}

static bool job_writes_q(const struct specdec_draft_job *j)
{
    return j->mode == SPECULATE_MODE_SAMPLED && !sampling_params_is_greedy(&j->sp);
}

/* Where job j, drafting into slot/half, writes its tokens and q rows: the
 * tokens into the host face, the q rows where xfer_q_dest says (a device
 * address in the slab, or the host face; row i at the same offset in both). */
static void job_dest(struct draft_worker *w, struct specdec_draft_job *j, int slot, int half)
{
    float *host = NULL, *dev = NULL;
    j->tokens_out = (int32_t *)xfer_half_tokens(w->buf, slot, half);
    xfer_q_dest(w->buf, slot, half, &host, &dev);
    j->q_rows_out = host;
    j->q_rows_dev = dev;
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
    /* the slot's grammar (or none) for the sequence's life; a draft that
     * cannot mask drafts unmasked (the target's masks keep the output) */
    if ((rc = worker_grammar_set(w->grammar, p.seq.slot, p.grammar, p.n_prompt, err)))
        LOG_WARN("req %lld slot %d: drafting without the grammar: %s", (long long)p.seq.req,
                 p.seq.slot, err);
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
            send_no_predraft(w, &d.seq, 1 - d.half, d.round + 1, 0.0);
        return;
    }
    struct queued_draft *qd = queued_new(w, QD_DRAFT, &d.seq, d.feed, d.n_feed);
    if (!qd) {
        worker_link_send_error(w->link, PROTOCOL_DRAFT, &d.seq, ERR_NOMEM,
                               "draft: out of memory queueing the round");
        if (d.predraft_k > 0)
            send_no_predraft(w, &d.seq, 1 - d.half, d.round + 1, 0.0);
        return;
    }
    qd->half = d.half;
    qd->round = d.round;
    qd->predraft_k = d.predraft_k;
    if ((rc = half_begin_write(w, d.seq.slot, d.half, err))) {
        queued_free(qd);
        worker_link_send_error(w->link, PROTOCOL_DRAFT, &d.seq, rc, err);
        if (d.predraft_k > 0)
            send_no_predraft(w, &d.seq, 1 - d.half, d.round + 1, 0.0);
        return;
    }
    qd->job.keep_len = d.keep_len;
    qd->job.k = d.k;
    qd->job.sp = d.sampling.sp;
    qd->job.mode = d.sampling.mode;
    job_dest(w, &qd->job, d.seq.slot, d.half);
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
            send_no_predraft(w, &qd->seq, other, qd->round + 1, 0.0);
        return NULL;
    }
    const struct shm_half_info info = {.req = (uint64_t)qd->seq.req, .round = (uint32_t)qd->round,
                                       .k = (uint32_t)k, .first = 0, .guess = 0};
    char err[ERR_MSG_MAX];
    if (half_publish(w, slot, qd->half, &info, k, job_writes_q(j))) {
        worker_link_send_error(w->link, PROTOCOL_DRAFT, &qd->seq, w->fatal.rc, w->fatal.err);
        if (qd->predraft_k > 0)
            send_no_predraft(w, &qd->seq, other, qd->round + 1, 0.0);
        return NULL;
    }
    send_draft_ready(w,
                     (struct worker_msg_draft_ready){.seq = qd->seq, .half = qd->half, .round = qd->round, .k = k,
                                                     .guess = -1, .draft_ms = qd->compute_ms},
                     job_writes_q(j) ? k : 0);
    if (qd->predraft_k <= 0)
        return NULL;
    if (half_begin_write(w, slot, other, err)) {
        send_no_predraft(w, &qd->seq, other, qd->round + 1, 0.0);
        return NULL;
    }
    if (k == 0) {
        send_no_predraft(w, &qd->seq, other, qd->round + 1, 0.0);
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
        send_no_predraft(w, &qd->seq, other, qd->round + 1, 0.0);
        return NULL;
    }
    feed[0] = last;
    *pre = (struct queued_draft){.kind = QD_PREDRAFT, .seq = qd->seq, .half = other,
                                 .round = qd->round + 1, .predraft_k = qd->predraft_k,
                                 .feed = feed};
    pre->job = (struct specdec_draft_job){
        .slot = slot, .keep_len = j->keep_len + j->n_feed + k - 1, .feed = feed, .n_feed = 1,
        .k = qd->predraft_k + 1, .sp = j->sp, .mode = j->mode, .gram = j->gram};
    job_dest(w, &pre->job, slot, other);
    specdec_draft_job_init(&pre->job);
    return pre;
}

static void finish_predraft(struct draft_worker *w, struct queued_draft *qd)
{
    const struct specdec_draft_job *j = &qd->job;
    const int slot = qd->seq.slot;
    if (j->rc) {
        LOG_DEBUG("pre-draft req %lld slot %d skipped: %s", (long long)qd->seq.req, slot, j->err);
        send_no_predraft(w, &qd->seq, qd->half, qd->round, qd->compute_ms);
        return;
    }
    const struct shm_half_info info = {.req = (uint64_t)qd->seq.req, .round = (uint32_t)qd->round,
                                       .k = (uint32_t)qd->predraft_k, .first = 1,
                                       .guess = (uint32_t)j->tokens_out[0]};
    if (half_publish(w, slot, qd->half, &info, j->k, job_writes_q(j))) {
        send_no_predraft(w, &qd->seq, qd->half, qd->round, qd->compute_ms);
        return;
    }
    send_draft_ready(w,
                     (struct worker_msg_draft_ready){.seq = qd->seq, .half = qd->half, .round = qd->round,
                                                     .k = qd->predraft_k, .guess = j->tokens_out[0],
                                                     .predraft = true, .draft_ms = qd->compute_ms},
                     job_writes_q(j) ? j->k : 0);
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
                LOG_DEBUG("prefill req %lld slot %d: %d tokens (%d cached) in %.1f ms",
                          (long long)qd->seq.req, qd->seq.slot, qd->job.n_feed, qd->job.cached,
                          qd->compute_ms);
                struct worker_msg_prefill_done done = {
                    .seq = qd->seq, .prefill_ms = qd->compute_ms,
                    .prefix = worker_main_prefix(&w->m, qd->job.n_feed, qd->job.cached)};
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

/* worker_link_role.on_coordinator_lost: its rounds and prefills go, no
 * reply; the buffer's halves stay as they are (a verify names the request
 * and round it expects, and a new coordinator's first round for a slot
 * follows a draft that rewrites the half). */
static void on_coordinator_lost(void *user)
{
    struct draft_worker *w = user;
    int n = w->n_queued;
    while (w->n_queued > 0)
        queue_remove(w, w->n_queued - 1);
    worker_main_model_release_all(&w->m);
    LOG_INFO("dropped %d queued jobs and emptied every slot", n);
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
    .on_welcome = on_welcome,
    .commands = draft_commands,
    .run_queued = run_queued,
    .on_coordinator_lost = on_coordinator_lost,
};

static void draft_worker_destroy(void *worker);

/* How long destroy waits for the target to let go of the buffer, beyond two
 * of its heartbeats (it checks at each): bounded, so a stuck target cannot
 * hold the draft's exit. */
#define DRAFT_RELEASE_WAIT_MS 3000.0

/* Between the chunks of a long feed: the coordinator keeps hearing from us. */
static void on_chunk(void *user, int n_done, int n_total)
{
    struct draft_worker *w = user;
    (void)n_done;
    (void)n_total;
    worker_link_keepalive(w->link);
}

/* The shared buffer of the transport the config names (shm_transport,
 * shm_staging) and, for cuda_ipc, its device side on the model's GPU; q
 * rows go into the slab alone only for a target that surely reads it there
 * (xfer_params). */
static int draft_shm_create(struct draft_worker *w, const struct worker_config *wc, char *err)
{
    const struct worker_config *tc = &w->cfg.target_worker;
    const struct xfer_params p = {
        .transport = wc->shm_transport, .staging = wc->shm_staging != 0,
        .instance = w->cfg.instance, .tag = "draft", .n_slots = w->m.n_slots, .k_max = w->k_max,
        .vocab = w->m.vocab, .writer_samples_on_device = specdec_draft_on_device(w->spec),
        .writer_device = wc->device, .reader_backend = tc->backend, .reader_device = tc->device,
        .reader_staging = tc->shm_staging != 0};
    return xfer_create(&w->buf, w->m.be, &p, err);
}

/* The engine over the model w->m holds: the halves' drafting, the slots'
 * grammars, the argmax screen and the sampler the config names; a model
 * of our own is warmed up (a borrowed one is the caller's, warm). */
static int draft_engine_create(struct draft_worker *w, const struct worker_config *wc, char *err)
{
    int rc;
    if ((rc = specdec_draft_create(&w->spec, w->m.ctx, err)) ||
        (rc = worker_grammar_create(&w->grammar, wc->model, llama_model_config(w->m.model),
                                    w->m.n_slots, err)))
        return rc;
    /* outside the log call: LOG_INFO skips its arguments below the level,
     * and a worker logging at "warn" read whole LM heads for it */
    const bool screen = wc->argmax_copy && specdec_draft_prepare_argmax(w->spec);
    LOG_INFO("draft argmax screen: %s", screen ? "on" : !wc->argmax_copy ? "off (argmax_copy 0)"
                                                               : "off (no copy of the LM head)");
    /* before the buffer: where q rows go depends on it */
    if (strcmp(wc->sampler, "device") == 0 &&
        (rc = specdec_draft_use_device(w->spec, true, err)))
        return rc;
    LOG_INFO("draft sampler: %s", specdec_draft_on_device(w->spec) ? "device" : "host");
    if (!w->m.borrowed && (rc = worker_main_model_warm_up(&w->m, err)))
        return rc;
    w->k_max = w->cfg.coordinator.spec_k_max;
    return 0;
}

/* The link (the socket's, or the in-process one over `local`) and the
 * progress callback that keeps it alive through long feeds. */
static int draft_link_create(struct draft_worker *w, const struct worker_link_local *local, char *err)
{
    const struct worker_config *wc = &w->cfg.draft_worker;
    char note[PROC_CONFIG_PATH_MAX + 160];
    snprintf(note, sizeof note, "%s, vocab %d, %d slots, shm %s", wc->model, w->m.vocab,
             w->m.n_slots, xfer_name(w->buf));
    int rc = local ? worker_link_create_local(&w->link, &draft_link_role, w, local, err)
                   : worker_link_create(&w->link, &w->cfg, &draft_link_role, w, note, err);
    if (rc)
        return rc;
    struct specdec_progress progress = {.chunk_tokens = wc->prefill_chunk, .on_chunk = on_chunk,
                                        .user = w};
    specdec_draft_set_progress(w->spec, &progress);
    LOG_INFO("draft model %s: vocab %d, %d slots x %d positions, shm %s (%.1f MiB)", wc->model,
             w->m.vocab, w->m.n_slots, w->m.max_seq_len, xfer_name(w->buf),
             (double)xfer_layout(w->buf)->size_bytes / (1024.0 * 1024.0));
    return 0;
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
    if ((rc = worker_main_model_load(&w->m, cfg, wc, err)) || (rc = draft_engine_create(w, wc, err)))
        goto fail;
    char cleanup_err[ERR_MSG_MAX];
    int removed = 0;
    if (shm_buffer_cleanup_stale(cfg->instance, false, &removed, cleanup_err) != 0)
        LOG_WARN("%s", cleanup_err);
    else if (removed > 0)
        LOG_INFO("removed %d stale shared-memory segment(s) of instance %s", removed,
                 cfg->instance);
    if ((rc = draft_shm_create(w, wc, err)) || (rc = draft_link_create(w, NULL, err)))
        goto fail;
    *out = w;
    return 0;
fail:
    draft_worker_destroy(w);
    return rc;
}

int draft_worker_create_local(void **out, const struct proc_config *cfg, const struct worker_main_model *m,
                              const struct worker_link_local *local, char *err)
{
    *out = NULL;
    struct draft_worker *w = calloc(1, sizeof *w);
    if (!w)
        return error_set(err, ERR_NOMEM, "draft worker: out of memory");
    w->cfg = *cfg;
    w->m = *m;
    int rc;
    if ((rc = draft_engine_create(w, &cfg->draft_worker, err)) ||
        (rc = draft_shm_create(w, &cfg->draft_worker, err)) || (rc = draft_link_create(w, local, err))) {
        draft_worker_destroy(w);
        return rc;
    }
    *out = w;
    return 0;
}

struct worker_link *draft_worker_link(void *worker)
{
    return ((struct draft_worker *)worker)->link;
}

static int draft_worker_run(void *worker, volatile sig_atomic_t *stop, char *err)
{
    struct draft_worker *w = worker;
    w->fatal.stop = stop;
    return worker_fatal_result(&w->fatal, worker_link_run(w->link, stop, err), err);
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
    /* the target lets go of the buffer once it sees its name gone (it looks
     * every heartbeat); a slab it still maps past the bound is left to this
     * process's exit rather than freed under it */
    xfer_close(w->buf, DRAFT_RELEASE_WAIT_MS + 2.0 * w->cfg.target_worker.heartbeat_ms);
    specdec_draft_destroy(w->spec);
    worker_grammar_destroy(w->grammar);
    worker_main_model_free(&w->m);
    free(w);
}

const struct worker_main_role draft_worker_role = {
    .name = "draft",
    .create = draft_worker_create,
    .run = draft_worker_run,
    .destroy = draft_worker_destroy,
};
