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

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "error.h"
#include "llama.h"
#include "logging.h"
#include "protocol.h"
#include "sampling.h"
#include "shm_buffer.h"
#include "specdec.h"

#define JSON_INT_MAX 9007199254740992LL /* 2^53 */
/* A register that could not be sent (socket not connected yet) is retried this often. */
#define REGISTER_RETRY_MS 50

struct draft_worker {
    struct proc_config cfg;
    struct kern_backend *be;
    struct llama_model *model;
    struct llama_ctx *ctx;
    struct specdec_draft *spec;
    struct shm_buffer *shm;
    void *zctx;
    void *sock;
    int vocab, n_slots, k_max, max_seq_len;
    double last_heard_ms;    /* last message from the coordinator */
    double last_beat_ms;     /* last heartbeat we sent */
    double last_register_ms; /* last register we sent */
    bool welcomed;
    bool register_pending;   /* the last register could not be sent: retry soon */
    bool send_failing;       /* sends fail (coordinator away): log once per streak */
};

static int send_msg(struct draft_worker *w, cJSON *h, const struct protocol_frame *frames,
                    int n_frames)
{
    char err[ERR_MSG_MAX];
    if (!h) {
        LOG_ERROR("out of memory building a message");
        return ERR_NOMEM;
    }
    int rc = protocol_send(w->sock, NULL, 0, h, frames, n_frames, PROTOCOL_DONTWAIT, err);
    if (rc != 0 && !w->send_failing) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(h, "type");
        LOG_WARN("cannot send %s to the coordinator (not connected?): %s",
                 cJSON_IsString(t) ? t->valuestring : "?", err);
    } else if (rc == 0 && w->send_failing) {
        LOG_INFO("connected to the coordinator");
    }
    w->send_failing = rc != 0;
    cJSON_Delete(h);
    return rc;
}

static void lower_name(char *dst, size_t n, int code)
{
    snprintf(dst, n, "%s", error_name(code));
    for (char *p = dst; *p; p++)
        if (*p >= 'A' && *p <= 'Z')
            *p = (char)(*p - 'A' + 'a');
}

static void send_error(struct draft_worker *w, const char *in_reply_to, int64_t req, int slot,
                       int code, const char *message)
{
    char cname[32];
    lower_name(cname, sizeof cname, code);
    LOG_WARN("%s req %lld slot %d: %s (%s)", in_reply_to, (long long)req, slot, message, cname);
    cJSON *h = protocol_header_new(PROTOCOL_ERROR);
    if (h && (!cJSON_AddNumberToObject(h, "req", (double)req) ||
              !cJSON_AddNumberToObject(h, "slot", slot) ||
              !cJSON_AddStringToObject(h, "code", cname) ||
              !cJSON_AddStringToObject(h, "message", message) ||
              !cJSON_AddStringToObject(h, "in_reply_to", in_reply_to))) {
        cJSON_Delete(h);
        h = NULL;
    }
    send_msg(w, h, NULL, 0);
}

static void send_register(struct draft_worker *w)
{
    const struct model_config *mc = llama_model_config(w->model);
    cJSON *h = protocol_header_new(PROTOCOL_REGISTER);
    cJSON *eos = cJSON_CreateArray();
    cJSON *shm = shm_buffer_export(w->shm);
    bool ok = h && eos && shm;
    for (int i = 0; ok && i < mc->n_eos_token_ids; i++)
        ok = cJSON_AddItemToArray(eos, cJSON_CreateNumber(mc->eos_token_ids[i]));
    if (ok) {
        ok = cJSON_AddStringToObject(h, "role", "draft") &&
             cJSON_AddNumberToObject(h, "pid", (double)getpid()) &&
             cJSON_AddStringToObject(h, "model", w->cfg.draft_worker.model) &&
             cJSON_AddStringToObject(h, "backend", w->cfg.draft_worker.backend) &&
             cJSON_AddNumberToObject(h, "vocab_size", w->vocab) &&
             cJSON_AddItemToObject(h, "eos_ids", eos) &&
             cJSON_AddNumberToObject(h, "max_seq_len", w->max_seq_len) &&
             cJSON_AddNumberToObject(h, "n_slots", w->n_slots) &&
             cJSON_AddNumberToObject(h, "bos_id", mc->bos_token_id);
        eos = NULL;
        if (ok)
            ok = cJSON_AddItemToObject(h, "shm", shm);
        shm = NULL;
    }
    cJSON_Delete(eos);
    cJSON_Delete(shm);
    if (!ok) {
        cJSON_Delete(h);
        h = NULL;
    }
    w->last_register_ms = protocol_now_ms();
    int rc = send_msg(w, h, NULL, 0);
    w->register_pending = rc != 0;
    if (rc == 0)
        LOG_INFO("registered with %s (%s, vocab %d, %d slots, shm %s)",
                 w->cfg.draft_worker.coordinator_endpoint, w->cfg.draft_worker.model, w->vocab,
                 w->n_slots, shm_buffer_name(w->shm));
}

static void send_heartbeat(struct draft_worker *w)
{
    cJSON *h = protocol_header_new(PROTOCOL_HEARTBEAT);
    if (h && !cJSON_AddStringToObject(h, "role", "draft")) {
        cJSON_Delete(h);
        h = NULL;
    }
    w->last_beat_ms = protocol_now_ms();
    send_msg(w, h, NULL, 0);
}

/* Reads the optional sampling object and mode of a command. */
static int parse_sampling(const cJSON *hdr, struct sampling_params *sp, enum speculate_mode *mode,
                          char *err)
{
    sampling_params_default(sp);
    const cJSON *s = NULL;
    int rc = protocol_get_object_opt(hdr, "sampling", &s, err);
    if (rc)
        return rc;
    if (s) {
        double t, p, mp;
        int64_t seed;
        if ((rc = protocol_get_double_opt(s, "sampling.temperature", 0.0, 1.0e6, 0.0, &t, err)) ||
            (rc = protocol_get_int_opt(s, "sampling.top_k", 0, 1 << 30, 0, &sp->top_k, err)) ||
            (rc = protocol_get_double_opt(s, "sampling.top_p", 0.0, 1.0, 1.0, &p, err)) ||
            (rc = protocol_get_double_opt(s, "sampling.min_p", 0.0, 1.0, 0.0, &mp, err)))
            return rc;
        seed = 0;
        if (cJSON_GetObjectItemCaseSensitive(s, "seed") &&
            (rc = protocol_get_i64(s, "sampling.seed", 0, JSON_INT_MAX, &seed, err)))
            return rc;
        sp->temperature = (float)t;
        sp->top_p = (float)p;
        sp->min_p = (float)mp;
        sp->seed = (uint64_t)seed;
        if ((rc = sampling_params_validate(sp, err)))
            return ERR_PROTOCOL;
    }
    const char *m = NULL;
    if ((rc = protocol_get_string_opt(hdr, "mode", 32, "sampled", &m, err)))
        return rc;
    if (strcmp(m, "sampled") == 0)
        *mode = SPECULATE_MODE_SAMPLED;
    else if (strcmp(m, "point_mass") == 0)
        *mode = SPECULATE_MODE_POINT_MASS;
    else
        return error_set(err, ERR_PROTOCOL, "mode: must be \"sampled\" or \"point_mass\", got \"%s\"",
                         m);
    return 0;
}

static void handle_prefill(struct draft_worker *w, const struct protocol_msg *m)
{
    char err[ERR_MSG_MAX];
    int64_t req = -1;
    int slot = -1, n_prompt = 0, rc;
    const int32_t *prompt = NULL;
    struct sampling_params sp;
    enum speculate_mode mode = SPECULATE_MODE_SAMPLED;
    if ((rc = protocol_get_i64(m->header, "req", 0, JSON_INT_MAX, &req, err)) ||
        (rc = protocol_get_int(m->header, "slot", 0, w->n_slots - 1, &slot, err)) ||
        (rc = parse_sampling(m->header, &sp, &mode, err)) ||
        (rc = protocol_frame_tokens(m, 0, "prompt", 1, w->max_seq_len, &prompt, &n_prompt, err))) {
        send_error(w, PROTOCOL_PREFILL, req, slot, rc, err);
        return;
    }
    double t0 = protocol_now_ms();
    rc = specdec_draft_propose(w->spec, slot, 0, prompt, n_prompt, 0, &sp, mode, NULL, NULL, err);
    double ms = protocol_now_ms() - t0;
    if (rc) {
        send_error(w, PROTOCOL_PREFILL, req, slot, rc, err);
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
    send_msg(w, h, NULL, 0);
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
    send_msg(w, h, NULL, 0);
}

static void handle_draft(struct draft_worker *w, const struct protocol_msg *m)
{
    char err[ERR_MSG_MAX];
    int64_t req = -1, round = 0;
    int slot = -1, half = 0, keep_len = 0, k = 0, predraft_k = 0, n_feed = 0, rc;
    const int32_t *feed = NULL;
    struct sampling_params sp;
    enum speculate_mode mode = SPECULATE_MODE_SAMPLED;
    int k_limit = w->k_max < SPECDEC_K_MAX ? w->k_max : SPECDEC_K_MAX;
    /* the pre-draft proposes predraft_k + 1 tokens (guess + drafts) */
    int predraft_limit = w->k_max < SPECDEC_K_MAX - 1 ? w->k_max : SPECDEC_K_MAX - 1;
    if ((rc = protocol_get_i64(m->header, "req", 0, JSON_INT_MAX, &req, err)) ||
        (rc = protocol_get_int(m->header, "slot", 0, w->n_slots - 1, &slot, err)) ||
        (rc = protocol_get_int(m->header, "half", 0, 1, &half, err)) ||
        (rc = protocol_get_i64(m->header, "round", 0, UINT32_MAX - 1, &round, err)) ||
        (rc = protocol_get_int(m->header, "keep_len", 0, w->max_seq_len, &keep_len, err)) ||
        (rc = protocol_get_int(m->header, "k", 0, k_limit, &k, err)) ||
        (rc = protocol_get_int_opt(m->header, "predraft_k", 0, predraft_limit, 0, &predraft_k,
                                   err)) ||
        (rc = parse_sampling(m->header, &sp, &mode, err)) ||
        (rc = protocol_frame_tokens(m, 0, "feed", 1, w->max_seq_len, &feed, &n_feed, err))) {
        send_error(w, PROTOCOL_DRAFT, req, slot, rc, err);
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
        send_error(w, PROTOCOL_DRAFT, req, slot, rc, err);
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

static void handle_release(struct draft_worker *w, const struct protocol_msg *m)
{
    char err[ERR_MSG_MAX];
    int slot = -1;
    int64_t req = -1;
    int rc;
    if ((rc = protocol_get_i64(m->header, "req", 0, JSON_INT_MAX, &req, err)) ||
        (rc = protocol_get_int(m->header, "slot", 0, w->n_slots - 1, &slot, err))) {
        send_error(w, PROTOCOL_RELEASE, req, slot, rc, err);
        return;
    }
    if ((rc = llama_ctx_truncate(w->ctx, slot, 0, err)))
        send_error(w, PROTOCOL_RELEASE, req, slot, rc, err);
}

/* Handles one message; returns 1 to stop serving (shutdown), ERR_MISMATCH
 * when refused, 0 otherwise. */
static int handle(struct draft_worker *w, const struct protocol_msg *m, char *err)
{
    const char *type = m->type;
    if (strcmp(type, PROTOCOL_WELCOME) == 0) {
        if (!w->welcomed)
            LOG_INFO("welcomed by the coordinator");
        w->welcomed = true;
    } else if (strcmp(type, PROTOCOL_HEARTBEAT) == 0) {
        /* liveness only */
    } else if (strcmp(type, PROTOCOL_DRAFT) == 0) {
        handle_draft(w, m);
    } else if (strcmp(type, PROTOCOL_PREFILL) == 0) {
        handle_prefill(w, m);
    } else if (strcmp(type, PROTOCOL_RELEASE) == 0) {
        handle_release(w, m);
    } else if (strcmp(type, PROTOCOL_SHUTDOWN) == 0) {
        LOG_INFO("shutdown requested by the coordinator");
        return 1;
    } else if (strcmp(type, PROTOCOL_REFUSED) == 0) {
        const char *why = "no reason given";
        char ignore[ERR_MSG_MAX];
        protocol_get_string(m->header, "message", 400, &why, ignore);
        return error_set(err, ERR_MISMATCH, "refused by the coordinator: %s", why);
    } else {
        char msg[160];
        snprintf(msg, sizeof msg, "type: unknown message type \"%.64s\"", type);
        send_error(w, type, -1, -1, ERR_PROTOCOL, msg);
    }
    return 0;
}

int draft_worker_run(struct draft_worker *w, volatile sig_atomic_t *stop, char *err)
{
    const int heartbeat_ms = w->cfg.draft_worker.heartbeat_ms;
    const int timeout_ms = w->cfg.coordinator.worker_timeout_ms;
    const size_t max_bytes = (size_t)w->cfg.coordinator.max_message_bytes;
    send_register(w);
    w->last_heard_ms = protocol_now_ms();
    send_heartbeat(w);
    while (!*stop) {
        zmq_pollitem_t item = {.socket = w->sock, .events = ZMQ_POLLIN};
        double now = protocol_now_ms();
        long wait_ms = (long)(w->last_beat_ms + heartbeat_ms - now);
        if (w->register_pending && wait_ms > REGISTER_RETRY_MS)
            wait_ms = REGISTER_RETRY_MS;
        if (wait_ms < 0)
            wait_ms = 0;
        int n = zmq_poll(&item, 1, wait_ms);
        if (n < 0) {
            if (zmq_errno() == EINTR)
                continue;
            return error_set(err, ERR_SYSTEM, "zmq_poll: %s", zmq_strerror(zmq_errno()));
        }
        while (n > 0 && !*stop) {
            struct protocol_msg m;
            char merr[ERR_MSG_MAX];
            int rc = protocol_recv(w->sock, false, max_bytes, PROTOCOL_DONTWAIT, &m, merr);
            if (rc == ERR_TIMEOUT || rc == ERR_CANCELLED) {
                protocol_msg_free(&m);
                break;
            }
            w->last_heard_ms = protocol_now_ms();
            if (rc == ERR_PROTOCOL) {
                send_error(w, m.type ? m.type : "?", -1, -1, rc, merr);
            } else if (rc != 0) {
                protocol_msg_free(&m);
                return error_set(err, rc, "receiving from the coordinator: %s", merr);
            } else {
                int hrc = handle(w, &m, err);
                if (hrc != 0) {
                    protocol_msg_free(&m);
                    return hrc > 0 ? 0 : hrc;
                }
            }
            protocol_msg_free(&m);
        }
        now = protocol_now_ms();
        if (now - w->last_beat_ms >= heartbeat_ms)
            send_heartbeat(w);
        if ((w->register_pending && now - w->last_register_ms >= REGISTER_RETRY_MS) ||
            (!w->welcomed && now - w->last_register_ms >= heartbeat_ms)) {
            send_register(w);
        } else if (now - w->last_heard_ms >= timeout_ms &&
                   now - w->last_register_ms >= timeout_ms) {
            LOG_WARN("no word from the coordinator for %.0f ms; registering again",
                     now - w->last_heard_ms);
            w->welcomed = false;
            send_register(w);
        }
    }
    return 0;
}

int draft_worker_create(struct draft_worker **out, const struct proc_config *cfg, char *err)
{
    *out = NULL;
    const struct worker_config *wc = &cfg->draft_worker;
    if (strcmp(wc->backend, "cpu") != 0)
        return error_set(err, ERR_UNSUPPORTED, "backend %s: not built into this binary",
                         wc->backend);
    struct draft_worker *w = calloc(1, sizeof *w);
    if (!w)
        return error_set(err, ERR_NOMEM, "draft worker: out of memory");
    w->cfg = *cfg;
    w->send_failing = true; /* the first send may precede the connection: no warning */
    int rc;
    if ((rc = kern_cpu_create(&w->be, wc->threads, err)))
        goto fail;
    if ((rc = llama_model_load(&w->model, wc->model, w->be, err)))
        goto fail;
    struct llama_ctx_params cp = {.n_slots = cfg->coordinator.max_concurrency,
                                  .max_seq_len = wc->max_seq_len, .max_rows = 0};
    if ((rc = llama_ctx_create(&w->ctx, w->model, &cp, err)))
        goto fail;
    if ((rc = specdec_draft_create(&w->spec, w->ctx, err)))
        goto fail;
    w->vocab = llama_model_config(w->model)->vocab_size;
    w->n_slots = llama_ctx_n_slots(w->ctx);
    w->max_seq_len = llama_ctx_max_seq_len(w->ctx);
    w->k_max = cfg->coordinator.spec_k_max;
    char cleanup_err[ERR_MSG_MAX];
    int removed = 0;
    if (shm_buffer_cleanup_stale(cfg->instance, false, &removed, cleanup_err) != 0)
        LOG_WARN("%s", cleanup_err);
    else if (removed > 0)
        LOG_INFO("removed %d stale shared-memory segment(s) of instance %s", removed,
                 cfg->instance);
    if ((rc = shm_buffer_create(&w->shm, "posix", cfg->instance, "draft", w->n_slots, w->k_max,
                                w->vocab, err)))
        goto fail;
    w->zctx = zmq_ctx_new();
    if (!w->zctx) {
        rc = error_set(err, ERR_SYSTEM, "zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
        goto fail;
    }
    if ((rc = protocol_dealer_connect(w->zctx, wc->coordinator_endpoint, &w->sock, err)))
        goto fail;
    LOG_INFO("draft model %s: vocab %d, %d slots x %d positions, shm %s (%.1f MiB)", wc->model,
             w->vocab, w->n_slots, w->max_seq_len, shm_buffer_name(w->shm),
             (double)shm_buffer_layout(w->shm)->size_bytes / (1024.0 * 1024.0));
    *out = w;
    return 0;
fail:
    draft_worker_destroy(w);
    return rc;
}

void draft_worker_destroy(struct draft_worker *w)
{
    if (!w)
        return;
    if (w->sock)
        zmq_close(w->sock);
    if (w->zctx)
        zmq_ctx_term(w->zctx);
    shm_buffer_close(w->shm);
    specdec_draft_destroy(w->spec);
    llama_ctx_destroy(w->ctx);
    llama_model_destroy(w->model);
    if (w->be)
        w->be->ops->destroy(w->be);
    free(w);
}
