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

struct target_worker {
    struct proc_config cfg;
    struct kern_backend *be;
    struct llama_model *model;
    struct llama_ctx *ctx;
    struct specdec_target *spec;
    struct shm_buffer *shm; /* the draft's buffer, imported read-only; NULL until attached */
    void *zctx;
    void *sock;
    int vocab, n_slots, max_seq_len;
    double last_heard_ms;
    double last_beat_ms;
    double last_register_ms;
    double last_verify_end_ms; /* 0 before the first verify */
    bool welcomed;
    bool register_pending;   /* the last register could not be sent: retry soon */
    bool send_failing;       /* sends fail (coordinator away): log once per streak */
};

static int send_msg(struct target_worker *w, cJSON *h, const struct protocol_frame *frames,
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

static void send_error(struct target_worker *w, const char *in_reply_to, int64_t req, int slot,
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

static void send_register(struct target_worker *w)
{
    const struct model_config *mc = llama_model_config(w->model);
    cJSON *h = protocol_header_new(PROTOCOL_REGISTER);
    cJSON *eos = cJSON_CreateArray();
    bool ok = h && eos;
    for (int i = 0; ok && i < mc->n_eos_token_ids; i++)
        ok = cJSON_AddItemToArray(eos, cJSON_CreateNumber(mc->eos_token_ids[i]));
    if (ok) {
        ok = cJSON_AddStringToObject(h, "role", "target") &&
             cJSON_AddNumberToObject(h, "pid", (double)getpid()) &&
             cJSON_AddStringToObject(h, "model", w->cfg.target_worker.model) &&
             cJSON_AddStringToObject(h, "backend", w->cfg.target_worker.backend) &&
             cJSON_AddNumberToObject(h, "vocab_size", w->vocab) &&
             cJSON_AddItemToObject(h, "eos_ids", eos) &&
             cJSON_AddNumberToObject(h, "max_seq_len", w->max_seq_len) &&
             cJSON_AddNumberToObject(h, "n_slots", w->n_slots) &&
             cJSON_AddNumberToObject(h, "bos_id", mc->bos_token_id);
        eos = NULL;
    }
    cJSON_Delete(eos);
    if (!ok) {
        cJSON_Delete(h);
        h = NULL;
    }
    w->last_register_ms = protocol_now_ms();
    int rc = send_msg(w, h, NULL, 0);
    w->register_pending = rc != 0;
    if (rc == 0)
        LOG_INFO("registered with %s (%s, vocab %d, %d slots)",
                 w->cfg.target_worker.coordinator_endpoint, w->cfg.target_worker.model, w->vocab,
                 w->n_slots);
}

static void send_heartbeat(struct target_worker *w)
{
    cJSON *h = protocol_header_new(PROTOCOL_HEARTBEAT);
    if (h && !cJSON_AddStringToObject(h, "role", "target")) {
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
    if (lay->vocab != w->vocab) {
        rc = error_set(err, ERR_MISMATCH, "shm %s: draft vocabulary %d differs from the target's %d",
                       shm_buffer_name(buf), lay->vocab, w->vocab);
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
        send_error(w, type, -1, -1, rc, err);
}

static void send_verify_done(struct target_worker *w, int64_t req, int slot, int64_t round,
                             int n_accepted, double ms, double idle_ms, int k,
                             const int32_t *tokens)
{
    cJSON *h = protocol_header_new(PROTOCOL_VERIFY_DONE);
    if (h && (!cJSON_AddNumberToObject(h, "req", (double)req) ||
              !cJSON_AddNumberToObject(h, "slot", slot) ||
              !cJSON_AddNumberToObject(h, "round", (double)round) ||
              !cJSON_AddNumberToObject(h, "n_accepted", n_accepted) ||
              !cJSON_AddNumberToObject(h, "verify_ms", ms) ||
              (idle_ms >= 0 && !cJSON_AddNumberToObject(h, "idle_ms", idle_ms)) ||
              !cJSON_AddNumberToObject(h, "draft_k", k))) {
        cJSON_Delete(h);
        h = NULL;
    }
    struct protocol_frame fr = {tokens, (size_t)(n_accepted + 1) * sizeof(int32_t)};
    send_msg(w, h, &fr, 1);
}

static void handle_verify(struct target_worker *w, const struct protocol_msg *m)
{
    char err[ERR_MSG_MAX];
    int64_t req = -1, round = 0;
    int slot = -1, half = 0, keep_len = 0, k = 0, n_feed = 0, rc;
    const int32_t *feed = NULL;
    const cJSON *desc = NULL;
    struct sampling_params sp;
    enum speculate_mode mode = SPECULATE_MODE_SAMPLED;
    if ((rc = protocol_get_i64(m->header, "req", 0, JSON_INT_MAX, &req, err)) ||
        (rc = protocol_get_int(m->header, "slot", 0, w->n_slots - 1, &slot, err)) ||
        (rc = protocol_get_i64(m->header, "round", 0, UINT32_MAX, &round, err)) ||
        (rc = protocol_get_int(m->header, "keep_len", 0, w->max_seq_len, &keep_len, err)) ||
        (rc = protocol_get_int(m->header, "k", 0, SPECDEC_K_MAX, &k, err)) ||
        (rc = parse_sampling(m->header, &sp, &mode, err)) ||
        (rc = protocol_get_object_opt(m->header, "shm", &desc, err)) ||
        (rc = protocol_frame_tokens(m, 0, "feed", 1, w->max_seq_len, &feed, &n_feed, err))) {
        send_error(w, PROTOCOL_VERIFY, req, slot, rc, err);
        return;
    }
    const int32_t *drafts = NULL;
    const float *q_rows = NULL;
    struct shm_half_header *hh = NULL;
    if (k > 0) {
        if ((rc = protocol_get_int(m->header, "half", 0, 1, &half, err)) ||
            (desc && (rc = attach(w, desc, err)))) {
            send_error(w, PROTOCOL_VERIFY, req, slot, rc, err);
            return;
        }
        if (!w->shm) {
            send_error(w, PROTOCOL_VERIFY, req, slot, ERR_UNAVAILABLE,
                       "verify: no draft shared buffer attached (k > 0)");
            return;
        }
        const struct shm_layout *lay = shm_buffer_layout(w->shm);
        if (slot >= lay->n_slots) {
            snprintf(err, sizeof err, "slot: must be < %d (draft buffer slots), got %d",
                     lay->n_slots, slot);
            send_error(w, PROTOCOL_VERIFY, req, slot, ERR_PROTOCOL, err);
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
            send_error(w, PROTOCOL_VERIFY, req, slot, ERR_PROTOCOL, err);
            return;
        }
        drafts = shm_buffer_half_tokens(w->shm, slot, half) + h_first;
        q_rows = shm_buffer_half_q(w->shm, slot, half) + (size_t)h_first * (size_t)lay->vocab;
    }
    int32_t out[SPECDEC_K_MAX + 1];
    int n_accepted = 0;
    double t0 = protocol_now_ms();
    rc = specdec_target_verify(w->spec, slot, keep_len, feed, n_feed, drafts, k, q_rows, &sp, mode,
                               out, &n_accepted, err);
    double t1 = protocol_now_ms(), ms = t1 - t0;
    /* The gap since the previous verification ended: control-plane time and
     * waiting for drafts, the overhead the pipeline exists to hide. */
    double idle_ms = w->last_verify_end_ms > 0 ? t0 - w->last_verify_end_ms : -1;
    w->last_verify_end_ms = t1;
    if (rc) {
        send_error(w, PROTOCOL_VERIFY, req, slot, rc, err);
        return;
    }
    if (hh) {
        shm_buffer_acquire(w->shm);
        if (hh->req != (uint64_t)req || hh->round != (uint32_t)round) {
            snprintf(err, sizeof err,
                     "verify: shm slot %d half %d was rewritten by the draft during the verify",
                     slot, half);
            send_error(w, PROTOCOL_VERIFY, req, slot, ERR_PROTOCOL, err);
            return;
        }
    }
    LOG_DEBUG("verify req %lld slot %d round %lld: k %d, accepted %d, %.1f ms", (long long)req,
              slot, (long long)round, k, n_accepted, ms);
    send_verify_done(w, req, slot, round, n_accepted, ms, idle_ms, k, out);
}

static void handle_release(struct target_worker *w, const struct protocol_msg *m)
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
static int handle(struct target_worker *w, const struct protocol_msg *m, char *err)
{
    const char *type = m->type;
    if (strcmp(type, PROTOCOL_WELCOME) == 0) {
        if (!w->welcomed)
            LOG_INFO("welcomed by the coordinator");
        w->welcomed = true;
        handle_attach(w, m, type);
    } else if (strcmp(type, PROTOCOL_ATTACH) == 0) {
        handle_attach(w, m, type);
    } else if (strcmp(type, PROTOCOL_HEARTBEAT) == 0) {
        /* liveness only */
    } else if (strcmp(type, PROTOCOL_VERIFY) == 0) {
        handle_verify(w, m);
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

int target_worker_run(struct target_worker *w, volatile sig_atomic_t *stop, char *err)
{
    const int heartbeat_ms = w->cfg.target_worker.heartbeat_ms;
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

int target_worker_create(struct target_worker **out, const struct proc_config *cfg, char *err)
{
    *out = NULL;
    const struct worker_config *wc = &cfg->target_worker;
    if (strcmp(wc->backend, "cpu") != 0)
        return error_set(err, ERR_UNSUPPORTED, "backend %s: not built into this binary",
                         wc->backend);
    struct target_worker *w = calloc(1, sizeof *w);
    if (!w)
        return error_set(err, ERR_NOMEM, "target worker: out of memory");
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
    if ((rc = specdec_target_create(&w->spec, w->ctx, err)))
        goto fail;
    w->vocab = llama_model_config(w->model)->vocab_size;
    w->n_slots = llama_ctx_n_slots(w->ctx);
    w->max_seq_len = llama_ctx_max_seq_len(w->ctx);
    w->zctx = zmq_ctx_new();
    if (!w->zctx) {
        rc = error_set(err, ERR_SYSTEM, "zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
        goto fail;
    }
    if ((rc = protocol_dealer_connect(w->zctx, wc->coordinator_endpoint, &w->sock, err)))
        goto fail;
    LOG_INFO("target model %s: vocab %d, %d slots x %d positions", wc->model, w->vocab,
             w->n_slots, w->max_seq_len);
    *out = w;
    return 0;
fail:
    target_worker_destroy(w);
    return rc;
}

void target_worker_destroy(struct target_worker *w)
{
    if (!w)
        return;
    if (w->sock)
        zmq_close(w->sock);
    if (w->zctx)
        zmq_ctx_term(w->zctx);
    shm_buffer_close(w->shm);
    specdec_target_destroy(w->spec);
    llama_ctx_destroy(w->ctx);
    llama_model_destroy(w->model);
    if (w->be)
        w->be->ops->destroy(w->be);
    free(w);
}
