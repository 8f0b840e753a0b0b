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
    int64_t req = -1;
    int slot = -1, n_prompt = 0, rc;
    const int32_t *prompt = NULL;
    struct sampling_params sp;
    enum speculate_mode mode = SPECULATE_MODE_SAMPLED;
    if ((rc = worker_link_get_req_slot(m->header, w->m.n_slots, &req, &slot, err)) ||
        (rc = worker_link_parse_sampling(m->header, &sp, &mode, err)) ||
        (rc = protocol_frame_tokens(m, 0, "prompt", 1, w->m.max_seq_len, &prompt, &n_prompt,
                                    err))) {
        worker_link_send_error(w->link, PROTOCOL_PREFILL, req, slot, rc, err);
        return;
    }
    double t0 = protocol_now_ms();
    rc = specdec_draft_propose(w->spec, slot, 0, prompt, n_prompt, 0, &sp, mode, NULL, NULL, err);
    double ms = protocol_now_ms() - t0;
    if (rc) {
        worker_link_send_error(w->link, PROTOCOL_PREFILL, req, slot, rc, err);
        return;
    }
    LOG_DEBUG("prefill req %lld slot %d: %d tokens in %.1f ms", (long long)req, slot, n_prompt, ms);
    cJSON *h = protocol_header_new(PROTOCOL_PREFILL_DONE);
    if (h && (!cJSON_AddNumberToObject(h, "req", (double)req) ||
              !cJSON_AddNumberToObject(h, "slot", slot) ||
              !cJSON_AddNumberToObject(h, "prefill_ms", ms))) {
        cJSON_Delete(h);
        h = NULL;
    }
    worker_link_send(w->link, h, NULL, 0);
}

static void send_draft_ready(struct draft_worker *w, int64_t req, int slot, int half,
                             int64_t round, int k, int guess, bool predraft, double ms)
{
    cJSON *h = protocol_header_new(PROTOCOL_DRAFT_READY);
    if (h && (!cJSON_AddNumberToObject(h, "req", (double)req) ||
              !cJSON_AddNumberToObject(h, "slot", slot) ||
              !cJSON_AddNumberToObject(h, "half", half) ||
              !cJSON_AddNumberToObject(h, "round", (double)round) ||
              !cJSON_AddNumberToObject(h, "k", k) ||
              !cJSON_AddNumberToObject(h, "guess", guess) ||
              !cJSON_AddBoolToObject(h, "predraft", predraft) ||
              !cJSON_AddNumberToObject(h, "draft_ms", ms))) {
        cJSON_Delete(h);
        h = NULL;
    }
    worker_link_send(w->link, h, NULL, 0);
}

static void handle_draft(void *user, const struct protocol_msg *m)
{
    struct draft_worker *w = user;
    char err[ERR_MSG_MAX];
    int64_t req = -1, round = 0;
    int slot = -1, half = 0, keep_len = 0, k = 0, predraft_k = 0, n_feed = 0, rc;
    const int32_t *feed = NULL;
    struct sampling_params sp;
    enum speculate_mode mode = SPECULATE_MODE_SAMPLED;
    int k_limit = w->k_max < SPECULATE_K_MAX ? w->k_max : SPECULATE_K_MAX;
    /* the pre-draft proposes predraft_k + 1 tokens (guess + drafts) */
    int predraft_limit = w->k_max < SPECULATE_K_MAX - 1 ? w->k_max : SPECULATE_K_MAX - 1;
    if ((rc = worker_link_get_req_slot(m->header, w->m.n_slots, &req, &slot, err)) ||
        (rc = protocol_get_int(m->header, "half", 0, 1, &half, err)) ||
        (rc = protocol_get_i64(m->header, "round", 0, UINT32_MAX - 1, &round, err)) ||
        (rc = protocol_get_int(m->header, "keep_len", 0, w->m.max_seq_len, &keep_len, err)) ||
        (rc = protocol_get_int(m->header, "k", 0, k_limit, &k, err)) ||
        (rc = protocol_get_int_opt(m->header, "predraft_k", 0, predraft_limit, 0, &predraft_k,
                                   err)) ||
        (rc = worker_link_parse_sampling(m->header, &sp, &mode, err)) ||
        (rc = protocol_frame_tokens(m, 0, "feed", 1, w->m.max_seq_len, &feed, &n_feed, err))) {
        worker_link_send_error(w->link, PROTOCOL_DRAFT, req, slot, rc, err);
        if (req >= 0 && slot >= 0 && predraft_k > 0)
            send_draft_ready(w, req, slot, 1 - half, round + 1, 0, -1, true, 0.0);
        return;
    }
    struct shm_half_header *hh = shm_buffer_half_header(w->shm, slot, half);
    int32_t *tokens = shm_buffer_half_tokens(w->shm, slot, half);
    float *q = shm_buffer_half_q(w->shm, slot, half);
    /* Mark the half as being rewritten before touching it. */
    hh->req = UINT64_MAX;
    double t0 = protocol_now_ms();
    rc = specdec_draft_propose(w->spec, slot, keep_len, feed, n_feed, k, &sp, mode, tokens, q, err);
    double ms = protocol_now_ms() - t0;
    if (rc) {
        worker_link_send_error(w->link, PROTOCOL_DRAFT, req, slot, rc, err);
        if (predraft_k > 0)
            send_draft_ready(w, req, slot, 1 - half, round + 1, 0, -1, true, 0.0);
        return;
    }
    hh->round = (uint32_t)round;
    hh->k = (uint32_t)k;
    hh->first = 0;
    hh->guess = 0;
    hh->req = (uint64_t)req;
    shm_buffer_publish(w->shm);
    send_draft_ready(w, req, slot, half, round, k, -1, false, ms);
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
        send_draft_ready(w, req, slot, other, round + 1, 0, -1, true, 0.0);
        return;
    }
    int32_t last = tokens[k - 1];
    t0 = protocol_now_ms();
    rc = specdec_draft_propose(w->spec, slot, keep_len + n_feed + k - 1, &last, 1, predraft_k + 1,
                               &sp, mode, otokens, oq, err);
    ms = protocol_now_ms() - t0;
    if (rc) {
        LOG_DEBUG("pre-draft req %lld slot %d skipped: %s", (long long)req, slot, err);
        send_draft_ready(w, req, slot, other, round + 1, 0, -1, true, ms);
        return;
    }
    oh->round = (uint32_t)(round + 1);
    oh->k = (uint32_t)predraft_k;
    oh->first = 1;
    oh->guess = (uint32_t)otokens[0];
    oh->req = (uint64_t)req;
    shm_buffer_publish(w->shm);
    send_draft_ready(w, req, slot, other, round + 1, predraft_k, otokens[0], true, ms);
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
