/* draft_worker.c: the draft worker: model, KV slots, shared buffer, and the
 * message loop with the coordinator.
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

struct draft_worker {
    struct proc_config cfg;
    struct worker_main_model m; /* backend, weights, KV slots */
    struct specdec_draft *spec;
    struct shm_buffer *shm;
    struct worker_link *link;
    int k_max;
};

static cJSON *build_register(void *user)
{
    struct draft_worker *w = user;
    cJSON *h = worker_link_register_new("draft", w->cfg.draft_worker.model,
                                        w->cfg.draft_worker.backend, llama_model_config(w->m.model),
                                        w->m.max_seq_len, w->m.n_slots);
    cJSON *shm = h ? shm_buffer_export(w->shm) : NULL;
    if (!shm || !cJSON_AddItemToObject(h, "shm", shm)) {
        cJSON_Delete(shm);
        cJSON_Delete(h);
        return NULL;
    }
    return h;
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
    double t0 = protocol_now_ms();
    rc = specdec_draft_propose(w->spec, p.seq.slot, 0, p.prompt, p.n_prompt, 0, &p.sampling.sp,
                               p.sampling.mode, NULL, NULL, err);
    double ms = protocol_now_ms() - t0;
    if (rc) {
        worker_link_send_error(w->link, PROTOCOL_PREFILL, &p.seq, rc, err);
        return;
    }
    LOG_DEBUG("prefill req %lld slot %d: %d tokens in %.1f ms", (long long)p.seq.req, p.seq.slot,
              p.n_prompt, ms);
    struct worker_msg_prefill_done done = {.seq = p.seq, .prefill_ms = ms};
    worker_link_send(w->link, worker_msg_prefill_done_encode(&done), NULL, 0);
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

static void handle_draft(void *user, const struct protocol_msg *m)
{
    struct draft_worker *w = user;
    char err[ERR_MSG_MAX];
    struct worker_msg_limits lim = worker_main_model_limits(&w->m, w->k_max);
    struct worker_msg_draft d;
    int rc = worker_msg_draft_decode(m, &lim, &d, err);
    const struct worker_msg_seq *seq = &d.seq;
    int slot = d.seq.slot, half = d.half, keep_len = d.keep_len, k = d.k;
    int predraft_k = d.predraft_k, n_feed = d.n_feed;
    int64_t req = d.seq.req, round = d.round;
    const int32_t *feed = d.feed;
    const struct sampling_params *sp = &d.sampling.sp;
    enum speculate_mode mode = d.sampling.mode;
    if (rc) {
        worker_link_send_error(w->link, PROTOCOL_DRAFT, seq, rc, err);
        /* the coordinator waits for the pre-draft's reply too */
        if (req >= 0 && slot >= 0 && predraft_k > 0)
            send_draft_ready(w, seq, 1 - half, round + 1, 0, -1, true, 0.0);
        return;
    }
    struct shm_half_header *hh = shm_buffer_half_header(w->shm, slot, half);
    int32_t *tokens = shm_buffer_half_tokens(w->shm, slot, half);
    float *q = shm_buffer_half_q(w->shm, slot, half);
    /* Mark the half as being rewritten before touching it. */
    hh->req = UINT64_MAX;
    double t0 = protocol_now_ms();
    rc = specdec_draft_propose(w->spec, slot, keep_len, feed, n_feed, k, sp, mode, tokens, q, err);
    double ms = protocol_now_ms() - t0;
    if (rc) {
        worker_link_send_error(w->link, PROTOCOL_DRAFT, seq, rc, err);
        if (predraft_k > 0)
            send_draft_ready(w, seq, 1 - half, round + 1, 0, -1, true, 0.0);
        return;
    }
    hh->round = (uint32_t)round;
    hh->k = (uint32_t)k;
    hh->first = 0;
    hh->guess = 0;
    hh->req = (uint64_t)req;
    shm_buffer_publish(w->shm);
    send_draft_ready(w, seq, half, round, k, -1, false, ms);
    if (predraft_k <= 0)
        return;

    /* Optimistic pre-draft: assume all k accepted, feed t_k, draw a guess of
     * the bonus token and predraft_k drafts after it into the other half. */
    int other = 1 - half;
    struct shm_half_header *oh = shm_buffer_half_header(w->shm, slot, other);
    int32_t *otokens = shm_buffer_half_tokens(w->shm, slot, other);
    float *oq = shm_buffer_half_q(w->shm, slot, other);
    oh->req = UINT64_MAX;
    if (k == 0) {
        send_draft_ready(w, seq, other, round + 1, 0, -1, true, 0.0);
        return;
    }
    int32_t last = tokens[k - 1];
    t0 = protocol_now_ms();
    rc = specdec_draft_propose(w->spec, slot, keep_len + n_feed + k - 1, &last, 1, predraft_k + 1,
                               sp, mode, otokens, oq, err);
    ms = protocol_now_ms() - t0;
    if (rc) {
        LOG_DEBUG("pre-draft req %lld slot %d skipped: %s", (long long)req, slot, err);
        send_draft_ready(w, seq, other, round + 1, 0, -1, true, ms);
        return;
    }
    oh->round = (uint32_t)(round + 1);
    oh->k = (uint32_t)predraft_k;
    oh->first = 1;
    oh->guess = (uint32_t)otokens[0];
    oh->req = (uint64_t)req;
    shm_buffer_publish(w->shm);
    send_draft_ready(w, seq, other, round + 1, predraft_k, otokens[0], true, ms);
}

static void handle_release(void *user, const struct protocol_msg *m)
{
    struct draft_worker *w = user;
    worker_main_model_release(&w->m, w->link, m);
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
