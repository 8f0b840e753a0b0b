/* draft_worker.c: the draft worker: model, KV slots, shared buffer, and the
 * message loop with the coordinator.
 *
 * Continuous batching, as in the target worker: prefills, rounds and
 * pre-drafts are queued as they arrive, and each step runs one forward call
 * for all of them (every sequence's next drafting step together); a round's
 * pre-draft takes the round's place in the queue when the round is done.
 *
 * Invariants: the shared buffer is created before the first register and
 * lives until destroy (its name goes into every register); a half is marked
 * as being rewritten (shm_buffer_half_begin_write) before anything writes
 * its tokens or q rows, and published (shm_buffer_half_publish) before the
 * draft_ready naming it is sent; every command gets exactly one reply (draft: two when predraft_k > 0)
 * except release, heartbeat, welcome and shutdown.
 *
 * Device sampling (draft_worker.sampler "device", the default on cuda): the
 * drafting picks run on the GPU and only token ids come back. With the
 * cuda_ipc transport in device mode and a target that reads the slab on its
 * GPU, the sampling kernels write the q rows straight into the slab half
 * (q_slab): begin_write, the kernels, then the publish records the half's
 * event after them and before draft_ready leaves; q never touches host
 * memory. Otherwise (posix, staging, a CPU target) q rows land in the host
 * face as with the host sampler.
 */
#include "draft_worker.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "error.h"
#include "llama.h"
#include "logging.h"
#include "protocol.h"
#include "sampling.h"
#include "shm_buffer.h"
#include "specdec.h"
#include "worker_link.h"
#include "worker_msg.h"
#ifdef TANDEM_HAVE_CUDA
#include "kernels_cuda.h"
#endif

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
#ifdef TANDEM_HAVE_CUDA
    struct kern_cuda_ipc *ipc; /* transport cuda_ipc: the slab and events; else NULL */
#endif
    char *q_slab;              /* the slab's base in this GPU's memory when q rows are
                                  written there by the sampling kernels (descriptor
                                  q_rows "slab"); NULL: q rows go to the host face */
    struct worker_link *link;
    struct worker_fatal fatal;   /* a sticky CUDA failure stops the worker */
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
                                        w->m.kv_block_size, &w->m.cpu);
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

/* Before host code rewrites slot/half: the copy the last publish queued
 * from it must be done (cuda_ipc), then the half is marked as rewritten. */
static int half_begin_write(struct draft_worker *w, int slot, int half, char *err)
{
#ifdef TANDEM_HAVE_CUDA
    if (w->ipc) {
        int rc = kern_cuda_ipc_begin_write(w->ipc, slot * 2 + half, err);
        if (rc) {
            worker_fatal_set(&w->fatal, rc, err);
            return rc;
        }
    }
#else
    (void)err;
#endif
    shm_buffer_half_begin_write(w->shm, slot, half);
    return 0;
}

/* Publishes slot/half: with cuda_ipc, first its copy into the slab and its
 * event (queued, not waited for), so the event is recorded before the
 * message that names the half leaves. with_q: the job wrote q rows (sampled
 * mode at temperature > 0) into the host face; otherwise, or when the
 * kernels wrote them into the slab (q_slab), only the header and tokens
 * move, and the event, recorded after those kernels, covers the rows. */
static int half_publish(struct draft_worker *w, int slot, int half,
                        const struct shm_half_info *info, int rows, bool with_q)
{
#ifdef TANDEM_HAVE_CUDA
    if (w->ipc) {
        const struct shm_layout *lay = shm_buffer_layout(w->shm);
        const bool q_moves = with_q && !w->q_slab;
        const size_t bytes =
            lay->q_offset + (q_moves ? (size_t)rows * (size_t)lay->vocab * sizeof(float) : 0);
        char err[ERR_MSG_MAX];
        int rc = kern_cuda_ipc_publish(w->ipc, slot * 2 + half, bytes, err);
        if (rc) {
            worker_fatal_set(&w->fatal, rc, err);
            return rc;
        }
    }
#else
    (void)rows;
    (void)with_q;
#endif
    shm_buffer_half_publish(w->shm, slot, half, info);
    return 0;
}

static bool job_writes_q(const struct specdec_draft_job *j)
{
    return j->mode == SPECULATE_MODE_SAMPLED && !sampling_params_is_greedy(&j->sp);
}

/* Where job j, drafting into slot/half, writes its q rows: into the slab
 * half on this GPU when the kernels write them there (q_slab), else into
 * the host face. Row i sits at the same offset in both. */
static void job_q_dest(struct draft_worker *w, struct specdec_draft_job *j, int slot, int half)
{
    const struct shm_layout *lay = shm_buffer_layout(w->shm);
    if (w->q_slab) {
        j->q_rows_out = NULL;
        j->q_rows_dev = (float *)(w->q_slab + (size_t)(slot * 2 + half) * lay->half_bytes +
                                  lay->q_offset);
    } else {
        j->q_rows_out = shm_buffer_half_q(w->shm, slot, half);
        j->q_rows_dev = NULL;
    }
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
    if ((rc = half_begin_write(w, d.seq.slot, d.half, err))) {
        queued_free(qd);
        worker_link_send_error(w->link, PROTOCOL_DRAFT, &d.seq, rc, err);
        if (d.predraft_k > 0)
            send_draft_ready(w, &d.seq, 1 - d.half, d.round + 1, 0, -1, true, 0.0);
        return;
    }
    qd->job.keep_len = d.keep_len;
    qd->job.k = d.k;
    qd->job.sp = d.sampling.sp;
    qd->job.mode = d.sampling.mode;
    qd->job.tokens_out = shm_buffer_half_tokens(w->shm, d.seq.slot, d.half);
    job_q_dest(w, &qd->job, d.seq.slot, d.half);
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
    const struct shm_half_info info = {.req = (uint64_t)qd->seq.req, .round = (uint32_t)qd->round,
                                       .k = (uint32_t)k, .first = 0, .guess = 0};
    char err[ERR_MSG_MAX];
    if (half_publish(w, slot, qd->half, &info, k, job_writes_q(j))) {
        worker_link_send_error(w->link, PROTOCOL_DRAFT, &qd->seq, w->fatal.rc, w->fatal.err);
        if (qd->predraft_k > 0)
            send_draft_ready(w, &qd->seq, other, qd->round + 1, 0, -1, true, 0.0);
        return NULL;
    }
    send_draft_ready(w, &qd->seq, qd->half, qd->round, k, -1, false, qd->compute_ms);
    if (qd->predraft_k <= 0)
        return NULL;
    if (half_begin_write(w, slot, other, err)) {
        send_draft_ready(w, &qd->seq, other, qd->round + 1, 0, -1, true, 0.0);
        return NULL;
    }
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
    job_q_dest(w, &pre->job, slot, other);
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
    const struct shm_half_info info = {.req = (uint64_t)qd->seq.req, .round = (uint32_t)qd->round,
                                       .k = (uint32_t)qd->predraft_k, .first = 1,
                                       .guess = (uint32_t)j->tokens_out[0]};
    if (half_publish(w, slot, qd->half, &info, j->k, job_writes_q(j))) {
        send_draft_ready(w, &qd->seq, qd->half, qd->round, 0, -1, true, qd->compute_ms);
        return;
    }
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
    .on_welcome = NULL,
    .commands = draft_commands,
    .run_queued = run_queued,
    .on_coordinator_lost = on_coordinator_lost,
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

#ifdef TANDEM_HAVE_CUDA
/* True when the target's device setting surely names the GPU the draft runs
 * on (the same ordinal, default included, or this GPU's UUID). Only then may
 * q rows live in the slab alone: a target on another GPU may lack peer access
 * and fall back to staging, which reads the host face, so there the rows go
 * to the host face too, and sampled requests keep working on any pair. */
static bool names_this_gpu(const char *target_device, const char *draft_device,
                           const char *draft_uuid)
{
    const char *t = target_device[0] ? target_device : "0";
    const char *d = draft_device[0] ? draft_device : "0";
    return strcasecmp(t, d) == 0 || strcasecmp(t, draft_uuid) == 0;
}
#endif

/* The shared buffer of the transport the config names (shm_transport,
 * shm_staging) and, for cuda_ipc, its device side on the model's GPU. */
static int draft_shm_create(struct draft_worker *w, const struct worker_config *wc, char *err)
{
    const bool cuda = strcmp(wc->backend, "cuda") == 0;
    const char *transport = wc->shm_transport;
    if (strcmp(transport, "auto") == 0)
        transport = cuda ? "cuda_ipc" : "posix";
    const bool ipc = strcmp(transport, "cuda_ipc") == 0;
    if (ipc && !cuda)
        return error_set(err, ERR_INVALID_ARG,
                         "draft_worker.shm_transport: \"cuda_ipc\" needs backend \"cuda\"");
    int rc = shm_buffer_create(&w->shm, transport, w->cfg.instance, "draft", w->m.n_slots, w->k_max,
                               w->m.vocab, err);
    if (rc || !ipc)
        return rc;
#ifdef TANDEM_HAVE_CUDA
    const struct shm_layout *lay = shm_buffer_layout(w->shm);
    const struct kern_cuda_ipc_shape shape = {
        .host_base = shm_buffer_half_header(w->shm, 0, 0), .half_bytes = lay->half_bytes,
        .n_halves = lay->n_slots * 2, .host_read_only = 0};
    const struct kern_cuda_ipc_handles *h = NULL;
    if ((rc = kern_cuda_ipc_export(&w->ipc, w->m.be, &shape, wc->shm_staging, &h, err)))
        return rc;
    struct shm_buffer_cuda_desc cd = {
        .staging = h->staging != 0, .slab_bytes = h->slab_bytes, .probe_offset = h->probe_offset,
        .n_events = h->n_events, .event_handles = (unsigned char *)h->events};
    _Static_assert(sizeof cd.mem_handle == KERN_CUDA_IPC_HANDLE_BYTES &&
                       SHM_BUFFER_IPC_HANDLE_BYTES == KERN_CUDA_IPC_HANDLE_BYTES &&
                       SHM_BUFFER_UUID_MAX >= KERN_CUDA_UUID_MAX,
                   "the descriptor carries the CUDA handles as they are");
    snprintf(cd.device_uuid, sizeof cd.device_uuid, "%s", h->device_uuid);
    memcpy(cd.mem_handle, h->mem, sizeof cd.mem_handle);
    memcpy(cd.probe, h->probe, sizeof cd.probe);
    /* q rows straight into the slab when the target takes them from there
     * on its GPU; a target that stages (its shm_staging) or runs on the CPU
     * reads the host face, so they go there, and so they do for a target on
     * another GPU (names_this_gpu). */
    cd.q_in_slab = !h->staging && specdec_draft_on_device(w->spec) &&
                   strcmp(w->cfg.target_worker.backend, "cuda") == 0 &&
                   !w->cfg.target_worker.shm_staging &&
                   names_this_gpu(w->cfg.target_worker.device, w->cfg.draft_worker.device,
                                  h->device_uuid);
    if (cd.q_in_slab) {
        void *base = NULL;
        if ((rc = kern_cuda_ipc_slab_half(w->ipc, 0, 0, lay->half_bytes, &base, err)))
            return rc;
        w->q_slab = base;
    }
    if ((rc = shm_buffer_set_cuda(w->shm, &cd, err)))
        return rc;
    LOG_INFO("draft buffer over CUDA IPC on %s: %s; q rows %s", h->device_uuid,
             h->staging ? "pinned host staging (shm_staging)" : "device slab + events",
             cd.q_in_slab ? "written by the sampling kernels into the slab (no host copy)"
                          : "written to the host face");
    return 0;
#else
    return error_set(err, ERR_UNSUPPORTED,
                     "draft_worker.shm_transport: cuda_ipc: this binary was built without CUDA");
#endif
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
    LOG_INFO("draft argmax screen: %s",
             !wc->argmax_copy                       ? "off (argmax_copy 0)"
             : specdec_draft_prepare_argmax(w->spec) ? "on"
                                                     : "off (no copy of the LM head)");
    /* before the buffer: where q rows go depends on it */
    if (strcmp(wc->sampler, "device") == 0 &&
        (rc = specdec_draft_use_device(w->spec, true, err)))
        goto fail;
    LOG_INFO("draft sampler: %s", specdec_draft_on_device(w->spec) ? "device" : "host");
    if ((rc = worker_main_model_warm_up(&w->m, err)))
        goto fail;
    w->k_max = cfg->coordinator.spec_k_max;
    char cleanup_err[ERR_MSG_MAX];
    int removed = 0;
    if (shm_buffer_cleanup_stale(cfg->instance, false, &removed, cleanup_err) != 0)
        LOG_WARN("%s", cleanup_err);
    else if (removed > 0)
        LOG_INFO("removed %d stale shared-memory segment(s) of instance %s", removed,
                 cfg->instance);
    if ((rc = draft_shm_create(w, wc, err)))
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
#ifdef TANDEM_HAVE_CUDA
    /* unregisters the host face, so it goes before the segment's unmap */
    kern_cuda_ipc_close(w->ipc);
#endif
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
