/* target_worker.c: the target worker: model, KV slots, the imported draft
 * buffer, and the message loop with the coordinator.
 *
 * Invariants: every verify gets exactly one reply (verify_done or error);
 * drafts and q rows are read in place from the draft's buffer only after
 * the half's header matched the verify's req and round, and the header is
 * re-checked afterwards so a half the draft rewrote meanwhile is reported,
 * never silently used. The imported buffer is replaced, never patched, when
 * the coordinator names a different one (a restarted draft).
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
#include "shm_buffer.h"
#include "specdec.h"
#include "worker_link.h"
#include "worker_msg.h"

struct target_worker {
    struct proc_config cfg;
    struct worker_main_model m; /* backend, weights, KV slots */
    struct specdec_target *spec;
    struct shm_buffer *shm; /* the draft's buffer, imported read-only; NULL until attached */
    struct worker_link *link;
    double last_verify_end_ms; /* 0 before the first verify */
};

static cJSON *build_register(void *user)
{
    struct target_worker *w = user;
    return worker_link_register_new("target", w->cfg.target_worker.model,
                                    w->cfg.target_worker.backend, llama_model_config(w->m.model),
                                    w->m.max_seq_len, w->m.n_slots);
}

/* Imports the buffer a descriptor names unless it is the one held already. */
static int attach(struct target_worker *w, const cJSON *desc, char *err)
{
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(desc, "name");
    if (w->shm && cJSON_IsString(name) && strcmp(name->valuestring, shm_buffer_name(w->shm)) == 0)
        return 0;
    struct shm_buffer *buf = NULL;
    int rc = shm_buffer_import(&buf, desc, err);
    if (rc)
        return rc;
    const struct shm_layout *lay = shm_buffer_layout(buf);
    if (lay->vocab != w->m.vocab) {
        rc = error_set(err, ERR_MISMATCH, "shm %s: draft vocabulary %d differs from the target's %d",
                       shm_buffer_name(buf), lay->vocab, w->m.vocab);
        shm_buffer_close(buf);
        return rc;
    }
    LOG_INFO("attached the draft buffer %s (%d slots, k_max %d)", shm_buffer_name(buf),
             lay->n_slots, lay->k_max);
    shm_buffer_close(w->shm);
    w->shm = buf;
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

static void handle_verify(void *user, const struct protocol_msg *m)
{
    struct target_worker *w = user;
    char err[ERR_MSG_MAX];
    struct worker_msg_limits lim = worker_main_model_limits(&w->m, SPECULATE_K_MAX);
    struct worker_msg_verify v;
    int rc = worker_msg_verify_decode(m, &lim, &v, err);
    const struct worker_msg_seq *seq = &v.seq;
    int64_t req = v.seq.req, round = v.round;
    int slot = v.seq.slot, half = v.half, k = v.k;
    if (rc) {
        worker_link_send_error(w->link, PROTOCOL_VERIFY, seq, rc, err);
        return;
    }
    const int32_t *drafts = NULL;
    const float *q_rows = NULL;
    struct shm_half_header *hh = NULL;
    if (k > 0) {
        if (v.shm && (rc = attach(w, v.shm, err))) {
            worker_link_send_error(w->link, PROTOCOL_VERIFY, seq, rc, err);
            return;
        }
        if (!w->shm) {
            worker_link_send_error(w->link, PROTOCOL_VERIFY, seq, ERR_UNAVAILABLE,
                       "verify: no draft shared buffer attached (k > 0)");
            return;
        }
        const struct shm_layout *lay = shm_buffer_layout(w->shm);
        if (slot >= lay->n_slots) {
            snprintf(err, sizeof err, "slot: must be < %d (draft buffer slots), got %d",
                     lay->n_slots, slot);
            worker_link_send_error(w->link, PROTOCOL_VERIFY, seq, ERR_PROTOCOL, err);
            return;
        }
        shm_buffer_acquire(w->shm);
        hh = shm_buffer_half_header(w->shm, slot, half);
        uint64_t h_req = hh->req;
        uint32_t h_round = hh->round, h_k = hh->k, h_first = hh->first;
        if (h_req != (uint64_t)req || h_round != (uint32_t)round || (uint32_t)k > h_k ||
            h_first > 1 || h_first + (uint32_t)k > (uint32_t)lay->k_max + 1) {
            snprintf(err, sizeof err,
                     "verify: shm slot %d half %d holds req %lld round %u k %u, expected req "
                     "%lld round %lld k >= %d",
                     slot, half, h_req == UINT64_MAX ? -1LL : (long long)h_req, h_round, h_k,
                     (long long)req, (long long)round, k);
            worker_link_send_error(w->link, PROTOCOL_VERIFY, seq, ERR_PROTOCOL, err);
            return;
        }
        drafts = shm_buffer_half_tokens(w->shm, slot, half) + h_first;
        q_rows = shm_buffer_half_q(w->shm, slot, half) + (size_t)h_first * (size_t)lay->vocab;
    }
    int32_t out[SPECULATE_K_MAX + 1];
    int n_accepted = 0;
    double t0 = protocol_now_ms();
    rc = specdec_target_verify(w->spec, slot, v.keep_len, v.feed, v.n_feed, drafts, k, q_rows,
                               &v.sampling.sp, v.sampling.mode, out, &n_accepted, err);
    double t1 = protocol_now_ms(), ms = t1 - t0;
    /* The gap since the previous verification ended: control-plane time and
     * waiting for drafts, the overhead the pipeline exists to hide. */
    double idle_ms = w->last_verify_end_ms > 0 ? t0 - w->last_verify_end_ms : -1;
    w->last_verify_end_ms = t1;
    if (rc) {
        worker_link_send_error(w->link, PROTOCOL_VERIFY, seq, rc, err);
        return;
    }
    if (hh) {
        shm_buffer_acquire(w->shm);
        if (hh->req != (uint64_t)req || hh->round != (uint32_t)round) {
            snprintf(err, sizeof err,
                     "verify: shm slot %d half %d was rewritten by the draft during the verify",
                     slot, half);
            worker_link_send_error(w->link, PROTOCOL_VERIFY, seq, ERR_PROTOCOL, err);
            return;
        }
    }
    LOG_DEBUG("verify req %lld slot %d round %lld: k %d, accepted %d, %.1f ms", (long long)req,
              slot, (long long)round, k, n_accepted, ms);
    struct worker_msg_verify_done done = {
        .seq = *seq, .round = round, .n_accepted = n_accepted, .verify_ms = ms,
        .idle_ms = idle_ms, .draft_k = k, .tokens = out, .n_tokens = n_accepted + 1,
    };
    struct protocol_frame frame;
    cJSON *h = worker_msg_verify_done_encode(&done, &frame);
    worker_link_send(w->link, h, &frame, 1);
}

static void handle_release(void *user, const struct protocol_msg *m)
{
    struct target_worker *w = user;
    worker_main_model_release(&w->m, w->link, m);
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

static const struct worker_link_command target_commands[] = {
    {PROTOCOL_VERIFY, handle_verify},
    {PROTOCOL_ATTACH, handle_attach_cmd},
    {PROTOCOL_RELEASE, handle_release},
    {NULL, NULL},
};

static const struct worker_link_role target_link_role = {
    .name = "target",
    .build_register = build_register,
    .on_welcome = on_welcome,
    .commands = target_commands,
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

static int target_worker_create(void **out, const struct proc_config *cfg, char *err)
{
    *out = NULL;
    const struct worker_config *wc = &cfg->target_worker;
    struct target_worker *w = calloc(1, sizeof *w);
    if (!w)
        return error_set(err, ERR_NOMEM, "target worker: out of memory");
    w->cfg = *cfg;
    int rc;
    if ((rc = worker_main_model_load(&w->m, cfg, wc, err)))
        goto fail;
    if ((rc = specdec_target_create(&w->spec, w->m.ctx, err)))
        goto fail;
    char note[PROC_CONFIG_PATH_MAX + 64];
    snprintf(note, sizeof note, "%s, vocab %d, %d slots", wc->model, w->m.vocab, w->m.n_slots);
    if ((rc = worker_link_create(&w->link, &w->cfg, &target_link_role, w, note, err)))
        goto fail;
    struct specdec_progress progress = {.chunk_tokens = wc->prefill_chunk, .on_chunk = on_chunk,
                                        .user = w};
    specdec_target_set_progress(w->spec, &progress);
    LOG_INFO("target model %s: vocab %d, %d slots x %d positions", wc->model, w->m.vocab,
             w->m.n_slots, w->m.max_seq_len);
    *out = w;
    return 0;
fail:
    target_worker_destroy(w);
    return rc;
}

static int target_worker_run(void *worker, volatile sig_atomic_t *stop, char *err)
{
    struct target_worker *w = worker;
    return worker_link_run(w->link, stop, err);
}

static void target_worker_destroy(void *worker)
{
    struct target_worker *w = worker;
    if (!w)
        return;
    worker_link_destroy(w->link);
    shm_buffer_close(w->shm);
    specdec_target_destroy(w->spec);
    worker_main_model_free(&w->m);
    free(w);
}

const struct worker_main_role target_worker_role = {
    .name = "target",
    .create = target_worker_create,
    .run = target_worker_run,
    .destroy = target_worker_destroy,
};
