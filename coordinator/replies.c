/* replies.c: owns what goes back to clients: token events, the done reply
 * with usage, timing and speculation figures, error replies (which are also
 * counted in the metrics). Replies never block: a client that went away
 * loses its reply, the coordinator carries on.
 */
#include "replies.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "error.h"
#include "logging.h"
#include "utf8.h"

/* Adds a string that came from a client (an id, a message quoting a field)
 * as valid UTF-8: invalid bytes become U+FFFD, so no reply is ever invalid
 * JSON text, whatever slipped through upstream. */
static void add_client_string(cJSON *m, const char *key, const char *s)
{
    size_t n = strlen(s);
    char *fixed = NULL;
    if (!utf8_valid((const uint8_t *)s, n, NULL) && (fixed = malloc(3 * n + 1)) != NULL) {
        fixed[utf8_repair((const uint8_t *)s, n, (uint8_t *)fixed)] = '\0';
        s = fixed;
    }
    cJSON_AddStringToObject(m, key, s);
    free(fixed);
}

/* False when the routing id's requests came on a connection that dropped:
 * the id may by now lead to another client. The events are read first: a
 * drop is reported before libzmq frees the id for a newcomer. All requests
 * of one id share one connection (intake cancels a dropped connection's
 * requests before it reads a message of the next). */
static bool connection_still_there(struct coordinator *c, const uint8_t *identity, size_t identity_size)
{
    c->n_conn_drops += connections_update(c->conns);
    /* A reply to the message being read (an error, stats, a cancel's
     * answer) goes by its own connection only: a request of an earlier
     * connection under the same routing id, dropped but not cancelled yet,
     * must not swallow the newcomer's answer. */
    if (c->answering.active && c->answering.identity_size == identity_size &&
        memcmp(c->answering.identity, identity, identity_size) == 0)
        return connections_open(c->conns, c->answering.conn);
    for (int i = 0; i < c->n_seqs; i++) {
        const struct seq *s = &c->seqs[i];
        if (s->state != SEQ_FREE && s->client_size == identity_size &&
            memcmp(s->client, identity, identity_size) == 0 && !connections_open(c->conns, s->conn)) {
            /* the id may lead to a newcomer by now: withheld, counted (the
             * routing-id test proves by it that it met this case) */
            c->metrics.replies_withheld_total++;
            return false;
        }
    }
    return true;
}

enum reply_sent replies_send(struct coordinator *c, const uint8_t *identity, size_t identity_size,
                             const cJSON *msg)
{
    char err[ERR_MSG_MAX];
    if (identity_size == 0)
        return REPLY_GONE;
    /* in-process there is no connection to watch: the caller holds it */
    if (c->local != NULL) {
        if (c->local->reply(c->local->user, identity, identity_size, msg) == 0)
            return REPLY_SENT;
        LOG_WARN("reply to the in-process caller dropped: it did not take it");
        return REPLY_FAILED;
    }
    if (!connection_still_there(c, identity, identity_size))
        return REPLY_GONE; /* intake_watch_connections cancels its requests */
    if (protocol_send(c->clients, identity, identity_size, msg, NULL, 0, PROTOCOL_DONTWAIT, err) == 0)
        return REPLY_SENT;
    /* a ROUTER_MANDATORY socket refuses a peer whose queue is at its
     * high-water mark with EAGAIN: the client does not read */
    if (zmq_errno() == EAGAIN)
        return REPLY_FULL;
    /* The client socket is ZMQ_ROUTER_MANDATORY: EHOSTUNREACH means the peer
     * is gone (zmq_errno is still the failed send's: nothing after it in
     * protocol_send sets errno). Its requests are cancelled by the poll loop,
     * not here: the caller may be in the middle of a sequence. */
    if (zmq_errno() == EHOSTUNREACH) {
        bool known = false;
        for (int g = 0; g < c->n_gone && !known; g++)
            known = c->gone_size[g] == identity_size && memcmp(c->gone[g], identity, identity_size) == 0;
        if (!known && c->n_gone < COORD_GONE_MAX) {
            memcpy(c->gone[c->n_gone], identity, identity_size);
            c->gone_size[c->n_gone++] = identity_size;
            LOG_INFO("client gone (its reply is undeliverable): cancelling its requests");
        }
        return REPLY_GONE;
    }
    LOG_WARN("reply to client dropped: %s", err);
    return REPLY_FAILED;
}

/* A final reply: one a full queue refuses, or that could not be sent at all
 * (memory ran out encoding it), is held and sent again later, so a client
 * that reads slowly still learns how its request ended. */
static void send_final(struct coordinator *c, const uint8_t *identity, size_t identity_size, cJSON *msg)
{
    const enum reply_sent r = replies_send(c, identity, identity_size, msg);
    if (r != REPLY_FULL && r != REPLY_FAILED) {
        cJSON_Delete(msg);
        return;
    }
    if (c->n_held == COORD_HELD_REPLIES_MAX || identity_size > PROTOCOL_IDENTITY_MAX) {
        c->metrics.replies_undelivered_total++;
        LOG_WARN("final reply to a client that does not read dropped: %d replies already held", c->n_held);
        cJSON_Delete(msg);
        return;
    }
    struct held_reply *h = &c->held[c->n_held++];
    memcpy(h->identity, identity, identity_size);
    h->identity_size = identity_size;
    h->msg = msg;
    h->since_ms = coord_now_ms();
}

void replies_retry_held(struct coordinator *c, double now)
{
    for (int i = 0; i < c->n_held;) {
        struct held_reply *h = &c->held[i];
        enum reply_sent r = replies_send(c, h->identity, h->identity_size, h->msg);
        if ((r == REPLY_FULL || r == REPLY_FAILED) && now - h->since_ms < COORD_HELD_REPLY_MS) {
            i++;
            continue;
        }
        if (r != REPLY_SENT) {
            c->metrics.replies_undelivered_total++;
            LOG_WARN("final reply undeliverable (%s): dropped",
                     r == REPLY_FULL     ? "the client read nothing for 60 s"
                     : r == REPLY_FAILED ? "it could not be sent for 60 s"
                                         : "the client is gone");
        }
        cJSON_Delete(h->msg);
        *h = c->held[--c->n_held];
    }
}

void replies_free_held(struct coordinator *c)
{
    for (int i = 0; i < c->n_held; i++)
        cJSON_Delete(c->held[i].msg);
    c->n_held = 0;
}

/* error {id, code, message} and, for one choice of several, its index
 * (< 0: none). */
struct error_reply {
    const char *id;
    int index;
    enum metrics_error code;
    const char *message;
};

/* Sends e to the client with this routing id, counts and logs it. */
static void send_error(struct coordinator *c, const uint8_t *identity, size_t identity_size,
                       const struct error_reply *e)
{
    c->metrics.requests_failed[e->code]++;
    cJSON *m = cJSON_CreateObject();
    if (m == NULL)
        return;
    const char *id = e->id ? e->id : "";
    cJSON_AddStringToObject(m, "type", "error");
    add_client_string(m, "id", id);
    if (e->index >= 0)
        cJSON_AddNumberToObject(m, "index", e->index);
    cJSON_AddStringToObject(m, "code", metrics_error_name(e->code));
    add_client_string(m, "message", e->message);
    send_final(c, identity, identity_size, m);
    LOG_INFO("request \"%s\"%s: %s: %s", id, e->index >= 0 ? " (a choice)" : "", metrics_error_name(e->code),
             e->message);
}

void replies_error(struct coordinator *c, const uint8_t *identity, size_t identity_size, const char *id,
                         enum metrics_error code, const char *message)
{
    send_error(c, identity, identity_size,
               &(struct error_reply){.id = id, .index = -1, .code = code, .message = message});
}

void replies_error_of(struct coordinator *c, const struct seq *s, enum metrics_error code, const char *message)
{
    send_error(c, s->client, s->client_size,
               &(struct error_reply){.id = s->id, .index = s->n_choices > 1 ? s->index : -1, .code = code,
                                     .message = message});
}

static cJSON *ids_array(const int32_t *ids, int n)
{
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a != NULL && i < n; i++) {
        cJSON *v = cJSON_CreateNumber(ids[i]);
        if (v == NULL || !cJSON_AddItemToArray(a, v)) {
            cJSON_Delete(v);
            cJSON_Delete(a);
            return NULL;
        }
    }
    return a;
}

/* Adds a string that may contain NUL bytes (cut there: JSON strings from
 * cJSON are C strings; detokenized text with NUL is rare and not printable). */
static bool add_text(cJSON *m, const char *key, const char *text, size_t len)
{
    char *copy = malloc(len + 1);
    if (copy == NULL)
        return false;
    memcpy(copy, text, len);
    copy[len] = '\0';
    const bool added = cJSON_AddStringToObject(m, key, copy) != NULL;
    free(copy);
    return added;
}

/* The parts of a token or done reply a client needs to read its output
 * (output_reply): false when memory ran out for one of them. */
static bool add_output(const struct coordinator *c, struct seq *s, cJSON *m,
                       const char *text, size_t len, int from)
{
    add_client_string(m, "id", s->id);
    bool whole = cJSON_GetObjectItemCaseSensitive(m, "id") != NULL;
    if (s->n_choices > 1)
        whole = whole && cJSON_AddNumberToObject(m, "index", s->index) != NULL;
    whole = whole && add_text(m, "text", text, len);
    cJSON *ids = whole ? ids_array(s->hist + s->n_prompt + from, s->generated - from) : NULL;
    if (ids == NULL || !cJSON_AddItemToObject(m, "ids", ids)) {
        cJSON_Delete(ids);
        return false;
    }
    return logprobs_add_json(m, c->tk, &s->lp, s->hist + s->n_prompt, from, s->generated - from);
}

/* A reply of type ("token" or "done") holding s's output from its token
 * from on, text its text: NULL when memory ran out for any part. */
static cJSON *output_reply(const struct coordinator *c, struct seq *s, const char *type,
                           const char *text, size_t len, int from)
{
    cJSON *m = cJSON_CreateObject();
    if (m == NULL || cJSON_AddStringToObject(m, "type", type) == NULL ||
        !add_output(c, s, m, text, len, from)) {
        cJSON_Delete(m);
        return NULL;
    }
    return m;
}

void replies_stream(struct coordinator *c, struct seq *s, bool final)
{
    if (!s->stream || (!final && s->stream_from >= s->generated))
        return;
    size_t n = 0;
    const char *piece = output_take_stream(s->out, final, &n);
    if (n == 0 && s->stream_from >= s->generated)
        return;
    cJSON *m = output_reply(c, s, "token", piece, n, s->stream_from);
    if (m == NULL) {
        /* not sent half: the ids and logprobs go with the next event, and
         * the done reply carries the whole text */
        cJSON_Delete(m);
        LOG_WARN("request \"%s\": out of memory for a token event, its tokens wait for the next",
                 s->id);
        return;
    }
    if (replies_send(c, s->client, s->client_size, m) == REPLY_FULL)
        s->replies_stalled = true;
    cJSON_Delete(m);
    s->stream_from = s->generated;
}

/* spec.accepted_at: rounds whose draft position i was accepted, up to the
 * last position ever accepted (Leviathan's per-position acceptance). */
static void add_accepted_at(cJSON *spec, const struct seq *s)
{
    int n = SPECULATE_K_MAX;
    while (n > 0 && s->accepted_at[n - 1] == 0)
        n--;
    cJSON *a = cJSON_AddArrayToObject(spec, "accepted_at");
    for (int i = 0; a && i < n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(s->accepted_at[i]));
}

void replies_done(struct coordinator *c, struct seq *s, enum metrics_finish reason, double t)
{
    replies_stream(c, s, true);
    size_t text_len = 0;
    const char *text = output_text(s->out, &text_len);
    double prefill_ms = s->t_first_ms - s->t_admit_ms;
    double decode_ms = t - s->t_first_ms;
    double queue_ms = s->t_admit_ms - s->t_arrival_ms;
    cJSON *m = output_reply(c, s, "done", text, text_len, 0);
    if (m == NULL ||
        !cJSON_AddStringToObject(m, "finish_reason", metrics_finish_name(reason))) {
        /* a done reply without its output would read as an empty answer */
        cJSON_Delete(m);
        replies_error_of(c, s, METRICS_ERR_INTERNAL,
                         "out of memory building the reply: the request's output is lost");
        return;
    }
    cJSON *u = cJSON_AddObjectToObject(m, "usage");
    if (u != NULL) {
        cJSON_AddNumberToObject(u, "prompt_tokens", s->n_prompt);
        cJSON_AddNumberToObject(u, "cached_prompt_tokens", s->prompt_cached);
        cJSON_AddNumberToObject(u, "generated_tokens", s->generated);
        if (s->pred != NULL) { /* OpenAI's names: prediction drafts the target took and refused */
            cJSON_AddNumberToObject(u, "accepted_prediction_tokens", s->pred_accepted);
            cJSON_AddNumberToObject(u, "rejected_prediction_tokens", s->pred_rejected);
        }
    }
    cJSON *tm = cJSON_AddObjectToObject(m, "timing");
    if (tm != NULL) {
        cJSON_AddNumberToObject(tm, "queue_ms", queue_ms);
        cJSON_AddNumberToObject(tm, "prefill_ms", prefill_ms);
        cJSON_AddNumberToObject(tm, "decode_ms", decode_ms);
        cJSON_AddNumberToObject(tm, "total_ms", t - s->t_arrival_ms);
        /* as tandem-generate: tokens after the first over the decode time */
        cJSON_AddNumberToObject(tm, "tokens_per_s",
                                decode_ms > 0 && s->generated > 1 ? (s->generated - 1) * 1000.0 / decode_ms : 0.0);
    }
    cJSON *sp = cJSON_AddObjectToObject(m, "spec");
    if (sp != NULL) {
        cJSON_AddNumberToObject(sp, "rounds", s->rounds);
        cJSON_AddNumberToObject(sp, "drafted", s->drafted);
        cJSON_AddNumberToObject(sp, "accepted", s->accepted);
        cJSON_AddNumberToObject(sp, "acceptance_rate", s->drafted ? (double)s->accepted / s->drafted : 0.0);
        cJSON_AddNumberToObject(sp, "mean_accepted_per_round", s->rounds ? (double)s->accepted / s->rounds : 0.0);
        /* token trees (verify_tree): rounds, nodes verified, accepted path lengths */
        cJSON_AddNumberToObject(sp, "tree_rounds", s->tree_rounds);
        cJSON_AddNumberToObject(sp, "tree_nodes", s->tree_nodes);
        cJSON_AddNumberToObject(sp, "tree_accepted", s->tree_accepted);
        cJSON_AddNumberToObject(sp, "predraft_offered", s->predraft_offered);
        cJSON_AddNumberToObject(sp, "predraft_used", s->predraft_used);
        cJSON_AddNumberToObject(sp, "draft_ms", s->draft_ms);
        cJSON_AddNumberToObject(sp, "verify_ms", s->verify_ms);
        add_accepted_at(sp, s);
    }
    send_final(c, s->client, s->client_size, m);
}
