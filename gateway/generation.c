/* generation.c: a completion request from HTTP to the coordinator and back
 * (see generation.h).
 *
 * Flow: parse and validate -> open a bridge call whose replies wake the
 * connection, send "generate" -> look for the first reply, parking the
 * connection while there is none. An error before any token is an HTTP
 * error status (so a streamed request that is refused gets a 4xx/5xx, not an
 * SSE body). Non-streamed: the "done" reply is the answer. Streamed: a 200
 * text/event-stream response whose reader turns each coordinator reply into
 * one chunk, parking the connection between replies; its free callback
 * cancels the request when the stream did not end (the client hung up and a
 * write failed, or the reader saw the hang-up). The coordinator's silence is
 * bounded by request_timeout_ms per wait, as before any event loop: a 504.
 */
#include "generation.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "error.h"
#include "http_reply.h"
#include "logging.h"
#include "request.h"

#define GENERATION_BLOCK_BYTES 4096

struct generation {
    struct bridge_call *call;
    struct watch_conn *wc;       /* held: the call's notification wakes it */
    bool stream, include_usage;
    double t0, deadline_s;
    long created;
    char ignored[OPENAI_IGNORED_MAX]; /* openai_request.ignored: the 200's Tandem-Ignored-Fields */
    int n, n_done;               /* choices asked for, and ended (their done replies below) */
    cJSON *dones[REQUEST_N_MAX];
    struct openai_tools tools;   /* openai_request.tools, moved here */
};

/* Keeps a done reply of choice "index" (taken); returns how many of the n
 * have ended. A repeated or out-of-range index is dropped. */
static int done_keep(cJSON **dones, int n, int *n_done, cJSON *done)
{
    const cJSON *i = cJSON_GetObjectItemCaseSensitive(done, "index");
    const int index = cJSON_IsNumber(i) ? i->valueint : 0;
    if (index < 0 || index >= n || dones[index] != NULL) {
        cJSON_Delete(done);
        return *n_done;
    }
    dones[index] = done;
    return ++*n_done;
}

static void dones_free(cJSON **dones, int n)
{
    for (int i = 0; i < n; i++) {
        cJSON_Delete(dones[i]);
        dones[i] = NULL;
    }
}

static const char *type_of(const cJSON *m)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(m, "type");
    return cJSON_IsString(t) ? t->valuestring : "";
}

static int count_ids(const cJSON *m)
{
    return cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(m, "ids"));
}

static double timing_ms(const cJSON *done, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(done, "timing"), key);
    return cJSON_IsNumber(v) ? v->valuedouble : 0.0;
}

/* A finished request's tokens (the done reply's usage) for its access line. */
static void note_usage(struct watch_conn *wc, const cJSON *done)
{
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(done, "usage");
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens");
    const cJSON *gt = cJSON_GetObjectItemCaseSensitive(u, "generated_tokens");
    if (cJSON_IsNumber(pt) && cJSON_IsNumber(gt))
        watch_conn_set_usage(wc, pt->valueint, gt->valueint);
}

/* A streamed choice whose text may still be a tool call: its token replies
 * are held (a call is sent whole, as one delta.tool_calls chunk, once the
 * done reply shows that the text parses as one); once the text cannot be a
 * call they go out as content, and the rest passes through. */
struct tool_hold {
    bool content;   /* decided: content */
    cJSON *held;    /* the token replies held (an array), NULL when none */
    char *text;     /* their texts joined */
    size_t len;
};

struct stream {
    const struct server_params *p;
    struct MHD_Connection *conn;
    struct bridge_call *call;
    struct watch_conn *wc;       /* held, as in struct generation */
    double deadline_s;           /* the coordinator's silence ends the stream with a 504 event */
    enum openai_kind kind;
    bool include_usage;
    char resp_id[64];
    char model[PROC_CONFIG_PATH_MAX];
    long created;
    char *pending;               /* SSE bytes not yet handed to MHD */
    size_t pending_len, pending_off, pending_cap;
    bool ended;                  /* the coordinator ended the request (done or error) */
    bool finished;               /* "data: [DONE]" is in pending */
    double t0, t_first, t_last;
    int n_tokens;
    char ignored[OPENAI_IGNORED_MAX];
    int n, n_done;               /* as in struct generation */
    cJSON *dones[REQUEST_N_MAX];
    struct openai_tools tools;   /* as in struct generation */
    struct tool_hold holds[REQUEST_N_MAX]; /* per choice, while tools may turn its text into a call */
};

static void pending_add(struct stream *st, const char *data, size_t n)
{
    if (st->pending_off == st->pending_len)
        st->pending_off = st->pending_len = 0;
    if (st->pending_len + n > st->pending_cap) {
        size_t cap = (st->pending_len + n) * 2;
        char *b = realloc(st->pending, cap);
        if (b == NULL)
            return; /* the chunk is lost; the stream goes on */
        st->pending = b;
        st->pending_cap = cap;
    }
    memcpy(st->pending + st->pending_len, data, n);
    st->pending_len += n;
}

/* Appends "data: <json>\n\n" and deletes obj. */
static void pending_event(struct stream *st, cJSON *obj)
{
    char *text = obj ? cJSON_PrintUnformatted(obj) : NULL;
    cJSON_Delete(obj);
    if (text == NULL)
        return;
    pending_add(st, "data: ", 6);
    pending_add(st, text, strlen(text));
    pending_add(st, "\n\n", 2);
    cJSON_free(text);
}

static void pending_done_marker(struct stream *st)
{
    static const char done[] = "data: [DONE]\n\n";
    pending_add(st, done, sizeof(done) - 1);
    st->finished = true;
}

/* A chunk of st's stream for a token reply or the done reply (the other
 * NULL; both NULL: an empty delta). */
static cJSON *stream_chunk(const struct stream *st, const cJSON *token, const cJSON *done)
{
    const struct openai_chunk c = {.token = token, .done = done, .with_usage_null = st->include_usage};
    return openai_chunk_json(st->kind, st->resp_id, st->created, st->model, &c);
}

/* Sends a choice's held token replies as content chunks and empties the hold. */
static void tool_hold_flush(struct stream *st, struct tool_hold *h)
{
    cJSON *r = NULL;
    cJSON_ArrayForEach(r, h->held)
        pending_event(st, stream_chunk(st, r, NULL));
    cJSON_Delete(h->held);
    h->held = NULL;
}

static struct tool_hold *tool_hold_of(struct stream *st, const cJSON *reply)
{
    const cJSON *i = cJSON_GetObjectItemCaseSensitive(reply, "index");
    int index = cJSON_IsNumber(i) ? i->valueint : 0;
    if (st->tools.choice == OPENAI_TOOLS_OFF || st->tools.choice == OPENAI_TOOL_CHOICE_NONE || index < 0 ||
        index >= st->n || index >= REQUEST_N_MAX)
        return NULL;
    return &st->holds[index];
}

/* A token reply of a stream with tools: true when it is held (taken);
 * false when it goes out now (the held ones went out before it). */
static bool tool_hold_token(struct stream *st, cJSON *reply)
{
    struct tool_hold *h = tool_hold_of(st, reply);
    if (h == NULL || h->content)
        return false;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(reply, "text");
    const char *text = cJSON_IsString(t) ? t->valuestring : "";
    size_t n = strlen(text);
    char *joined = realloc(h->text, h->len + n + 1);
    if (joined == NULL || (h->held == NULL && (h->held = cJSON_CreateArray()) == NULL)) {
        if (joined != NULL)
            h->text = joined;
        h->content = true; /* out of memory: the text goes out as it is */
        tool_hold_flush(st, h);
        return false;
    }
    memcpy(joined + h->len, text, n + 1);
    h->text = joined;
    h->len += n;
    if (!openai_tools_may_be_call(&st->tools, h->text)) {
        h->content = true;
        tool_hold_flush(st, h);
        return false;
    }
    cJSON_AddItemToArray(h->held, reply);
    return true;
}

/* A choice's done reply in a stream with tools: its text a call (one
 * delta.tool_calls chunk sent, true) or content (the held chunks sent). */
static bool tool_hold_done(struct stream *st, const cJSON *done)
{
    struct tool_hold *h = tool_hold_of(st, done);
    if (h == NULL || h->content)
        return false;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(done, "text");
    char prefix[96];
    snprintf(prefix, sizeof prefix, "call_%s_%d", st->resp_id, (int)(h - st->holds));
    cJSON *calls = openai_tools_parse(&st->tools, cJSON_IsString(t) ? t->valuestring : "", prefix);
    cJSON *chunk = calls ? stream_chunk(st, NULL, NULL) : NULL;
    cJSON *choice = chunk ? cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(chunk, "choices"), 0) : NULL;
    cJSON *delta = choice ? cJSON_GetObjectItemCaseSensitive(choice, "delta") : NULL;
    if (delta == NULL) {
        cJSON_Delete(calls);
        cJSON_Delete(chunk);
        tool_hold_flush(st, h);
        h->content = true;
        return false;
    }
    cJSON_ReplaceItemInObjectCaseSensitive(choice, "index", cJSON_CreateNumber((double)(h - st->holds)));
    int k = 0;
    cJSON *c = NULL;
    cJSON_ArrayForEach(c, calls) { /* delta.tool_calls[k].index: which call a delta extends */
        cJSON_AddNumberToObject(c, "index", k++);
    }
    cJSON_AddItemToObject(delta, "tool_calls", calls);
    /* the call's chunk carries the ids of its text, as every chunk does */
    cJSON *tandem = cJSON_AddObjectToObject(chunk, "tandem");
    cJSON *ids = tandem ? cJSON_AddArrayToObject(tandem, "ids") : NULL;
    cJSON *r = NULL;
    cJSON_ArrayForEach(r, h->held) {
        const cJSON *id = NULL;
        cJSON_ArrayForEach(id, cJSON_GetObjectItemCaseSensitive(r, "ids")) {
            if (ids != NULL)
                cJSON_AddItemToArray(ids, cJSON_CreateNumber(id->valuedouble));
        }
    }
    pending_event(st, chunk);
    cJSON_Delete(h->held);
    h->held = NULL;
    h->content = true;
    return true;
}

/* Turns one coordinator reply into SSE bytes; takes reply. */
static void stream_on_reply(struct stream *st, cJSON *reply)
{
    const char *type = type_of(reply);
    double t = watch_now_s();
    if (strcmp(type, "token") == 0 || strcmp(type, "done") == 0) {
        if (st->t_first == 0) {
            st->t_first = t;
            http_metrics_generation_first(st->p->metrics, t - st->t0);
        }
        st->t_last = t;
    }
    if (strcmp(type, "token") == 0) {
        st->n_tokens += count_ids(reply);
        watch_conn_set_usage(st->wc, -1, st->n_tokens); /* what a stream cut short had */
        if (tool_hold_token(st, reply))
            return; /* held: the reply is the hold's now */
        pending_event(st, stream_chunk(st, reply, NULL));
    } else if (strcmp(type, "done") == 0) {
        /* each choice's last chunk; the usage and [DONE] after the last choice */
        bool called = tool_hold_done(st, reply);
        cJSON *last = stream_chunk(st, NULL, reply);
        if (called && last != NULL) /* the finish_reason of a call */
            cJSON_ReplaceItemInObjectCaseSensitive(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(last, "choices"), 0),
                                                   "finish_reason", cJSON_CreateString("tool_calls"));
        pending_event(st, last);
        if (done_keep(st->dones, st->n, &st->n_done, reply) < st->n)
            return;
        st->ended = true;
        cJSON *all = openai_merge_dones(st->dones, st->n);
        note_usage(st->wc, all != NULL ? all : reply);
        if (st->include_usage && all)
            pending_event(st, openai_usage_chunk_json(st->kind, st->resp_id, st->created, st->model, all));
        cJSON_Delete(all);
        pending_done_marker(st);
        return;
    } else if (strcmp(type, "error") == 0) {
        /* After the 200 is out, an error can only travel in the stream; the
         * other choices are cancelled (stream_free) */
        st->ended = st->n == 1;
        struct openai_error e;
        openai_error_from_reply(reply, &e);
        pending_event(st, openai_error_json(&e));
        pending_done_marker(st);
    }
    cJSON_Delete(reply);
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct stream *st = cls;
    char err[ERR_MSG_MAX];
    (void)pos;
    while (st->pending_off == st->pending_len) {
        if (st->finished)
            return MHD_CONTENT_READER_END_OF_STREAM;
        if (http_reply_client_gone(st->conn) || *st->p->stop)
            return MHD_CONTENT_READER_END_WITH_ERROR; /* stream_free cancels */
        cJSON *reply = NULL;
        if (bridge_call_next(st->call, 0, &reply, err) == 0) {
            st->deadline_s = watch_now_s() + st->p->cfg->request_timeout_ms / 1000.0;
            stream_on_reply(st, reply);
            continue;
        }
        if (watch_now_s() >= st->deadline_s) {
            struct openai_error e;
            openai_error_set(&e, 504, "server_error", "timeout", NULL, "no reply from the coordinator within %d ms",
                             st->p->cfg->request_timeout_ms);
            pending_event(st, openai_error_json(&e));
            pending_done_marker(st);
            continue;
        }
        enum watch_park park = watch_park(st->wc, st->deadline_s);
        if (park == WATCH_PARKED)
            return 0; /* suspended: libmicrohttpd calls again once woken */
        if (park == WATCH_STOPPING)
            return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = st->pending_len - st->pending_off;
    if (n > max)
        n = max;
    memcpy(buf, st->pending + st->pending_off, n);
    st->pending_off += n;
    return (ssize_t)n;
}

static void stream_free(void *cls)
{
    struct stream *st = cls;
    char err[ERR_MSG_MAX];
    if (!st->ended) {
        LOG_INFO("%s: the HTTP client went away mid-stream; cancelling", bridge_call_id(st->call));
        if (bridge_call_cancel(st->call, err) != 0)
            LOG_WARN("%s: cancel: %s", bridge_call_id(st->call), err);
    }
    double t = watch_now_s();
    http_metrics_generation_end(st->p->metrics, st->t_first > 0, st->n_tokens, st->t_last - st->t_first, t - st->t0);
    bridge_call_close(st->call); /* no notification after this: the hold can go */
    watch_conn_release(st->wc);
    dones_free(st->dones, st->n);
    for (int i = 0; i < REQUEST_N_MAX; i++) {
        cJSON_Delete(st->holds[i].held);
        free(st->holds[i].text);
    }
    openai_tools_free(&st->tools);
    free(st->pending);
    free(st);
}

/* Frees g, its call closed; cancels it at the coordinator first when asked. */
static void generation_end(struct generation *g, const struct server_params *p, bool cancel, bool started)
{
    char err[ERR_MSG_MAX];
    if (cancel && bridge_call_cancel(g->call, err) != 0)
        LOG_WARN("%s: cancel: %s", bridge_call_id(g->call), err);
    if (started)
        http_metrics_generation_end(p->metrics, 0, 0, 0, watch_now_s() - g->t0);
    bridge_call_close(g->call);
    watch_conn_release(g->wc);
    dones_free(g->dones, g->n);
    openai_tools_free(&g->tools);
    free(g);
}

void generation_abort(struct generation *g, const struct server_params *p)
{
    if (g == NULL)
        return;
    LOG_INFO("%s: the HTTP connection ended before its answer; cancelling", bridge_call_id(g->call));
    generation_end(g, p, true, true);
}

static enum MHD_Result answer_error(struct MHD_Connection *conn, const struct openai_error *e, int *status)
{
    *status = e->status;
    return http_reply_error(conn, e, NULL);
}

/* Validates the body and sends the request: *out set, or an error queued
 * (*status set). */
static enum MHD_Result generation_begin(struct generation **out, struct MHD_Connection *conn,
                                        const struct server_params *p, const struct generation_input *in,
                                        int *status)
{
    struct watch_conn *wc = in->wc;
    char err[ERR_MSG_MAX];
    struct openai_error e;
    struct openai_request req;
    *out = NULL;
    const struct openai_policy policy = {.served_model = p->cfg->served_model_name,
                                         .strict_fields = p->cfg->strict_fields != 0};
    if (openai_parse_request(in->kind, in->body, in->len, &policy, &req, &e) != 0)
        return answer_error(conn, &e, status);
    struct generation *g = calloc(1, sizeof(*g));
    if (g == NULL || bridge_call_open(p->bridge, "gw", &g->call, err) != 0) {
        openai_request_free(&req);
        free(g);
        openai_error_set(&e, 500, "server_error", NULL, NULL, "out of memory");
        return answer_error(conn, &e, status);
    }
    watch_conn_hold(wc);
    g->wc = wc;
    bridge_call_set_notify(g->call, watch_wake, wc);
    int rc = bridge_call_send(g->call, req.generate, err);
    g->stream = req.stream;
    g->include_usage = req.include_usage;
    g->n = req.n;
    g->tools = req.tools; /* moved: the request's copy is not freed twice */
    memset(&req.tools, 0, sizeof req.tools);
    snprintf(g->ignored, sizeof(g->ignored), "%s", req.ignored);
    if (req.ignored[0] != '\0') /* one line a request; the list is cleaned in openai.c */
        LOG_WARN("%s: fields accepted without effect: %s (gateway.strict_fields: 1 refuses them)",
                 bridge_call_id(g->call), req.ignored);
    openai_request_free(&req);
    if (rc != 0) {
        generation_end(g, p, false, false);
        if (rc == ERR_RANGE) /* the body grew in translation past the coordinator's limit */
            openai_error_set(&e, 413, "invalid_request_error", "request_too_large", NULL, "%s", err);
        else
            openai_error_set(&e, 500, "server_error", NULL, NULL, "%s", err);
        return answer_error(conn, &e, status);
    }
    g->t0 = watch_now_s();
    g->deadline_s = g->t0 + p->cfg->request_timeout_ms / 1000.0;
    g->created = (long)time(NULL);
    http_metrics_generation_start(p->metrics);
    *out = g;
    return MHD_YES;
}

/* The 200 event stream from the first token (or the done) reply; takes g and reply. */
static enum MHD_Result start_stream(struct generation *g, struct MHD_Connection *conn, const struct server_params *p,
                                    enum openai_kind kind, cJSON *reply, int *status)
{
    struct stream *st = calloc(1, sizeof(*st));
    if (st == NULL) {
        cJSON_Delete(reply);
        generation_end(g, p, true, true);
        struct openai_error e;
        openai_error_set(&e, 500, "server_error", NULL, NULL, "out of memory");
        return answer_error(conn, &e, status);
    }
    st->p = p;
    st->conn = conn;
    st->call = g->call;
    st->wc = g->wc; /* the hold moves with the call */
    st->kind = kind;
    st->include_usage = g->include_usage;
    st->created = g->created;
    st->n = g->n;
    st->n_done = g->n_done;
    memcpy(st->dones, g->dones, sizeof st->dones);
    memset(g->dones, 0, sizeof g->dones);
    st->tools = g->tools;
    memset(&g->tools, 0, sizeof g->tools);
    st->t0 = g->t0;
    snprintf(st->ignored, sizeof(st->ignored), "%s", g->ignored);
    st->deadline_s = watch_now_s() + p->cfg->request_timeout_ms / 1000.0;
    free(g);
    snprintf(st->resp_id, sizeof(st->resp_id), "%s%s", kind == OPENAI_CHAT ? "chatcmpl-" : "cmpl-",
             bridge_call_id(st->call));
    snprintf(st->model, sizeof(st->model), "%s", p->cfg->served_model_name);
    if (kind == OPENAI_CHAT) /* the opening chunk carries the role, as OpenAI's does */
        pending_event(st, openai_chunk_json(kind, st->resp_id, st->created, st->model,
                                            &(struct openai_chunk){.role_first = true,
                                                                   .with_usage_null = st->include_usage}));
    stream_on_reply(st, reply);
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, GENERATION_BLOCK_BYTES, stream_read, st, stream_free);
    if (r == NULL) {
        stream_free(st);
        *status = 499;
        return MHD_NO;
    }
    if (MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream") != MHD_YES ||
        MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache") != MHD_YES ||
        (st->ignored[0] != '\0' && MHD_add_response_header(r, HTTP_REPLY_IGNORED_FIELDS_HEADER, st->ignored) != MHD_YES))
        LOG_WARN("%s: could not add the event stream's headers", bridge_call_id(st->call));
    enum MHD_Result rc = MHD_queue_response(conn, 200, r);
    MHD_destroy_response(r); /* MHD keeps its reference; stream_free runs when it is done */
    *status = 200;
    return rc;
}

/* Answers with the first reply that decides the status; takes g and reply. */
static enum MHD_Result generation_answer(struct generation *g, struct MHD_Connection *conn,
                                         const struct server_params *p, enum openai_kind kind, cJSON *reply,
                                         int *status)
{
    if (strcmp(type_of(reply), "error") == 0) {
        struct openai_error e;
        openai_error_from_reply(reply, &e);
        cJSON_Delete(reply);
        generation_end(g, p, g->n > 1, true); /* the other choices stop too */
        return answer_error(conn, &e, status);
    }
    if (g->stream)
        return start_stream(g, conn, p, kind, reply, status);
    if (g->n > 1) { /* every choice has ended: one reply for them all */
        cJSON *all = openai_merge_dones(g->dones, g->n);
        cJSON_Delete(reply);
        if (all == NULL) {
            struct openai_error e;
            openai_error_set(&e, 500, "server_error", NULL, NULL, "out of memory");
            generation_end(g, p, false, true);
            return answer_error(conn, &e, status);
        }
        reply = all;
    }
    double t = watch_now_s();
    double decode_s = timing_ms(reply, "decode_ms") / 1000.0;
    http_metrics_generation_first(p->metrics, (t - g->t0) - decode_s);
    char resp_id[80];
    snprintf(resp_id, sizeof(resp_id), "%s%s", kind == OPENAI_CHAT ? "chatcmpl-" : "cmpl-", bridge_call_id(g->call));
    cJSON *out = openai_response_json(kind, resp_id, g->created, p->cfg->served_model_name, reply);
    if (out != NULL && kind == OPENAI_CHAT)
        openai_tools_apply_response(&g->tools, out);
    http_metrics_generation_end(p->metrics, 1, count_ids(reply), decode_s, t - g->t0);
    note_usage(g->wc, reply);
    cJSON_Delete(reply);
    char g_ignored[OPENAI_IGNORED_MAX];
    snprintf(g_ignored, sizeof(g_ignored), "%s", g->ignored);
    generation_end(g, p, false, false); /* frees g */
    *status = 200;
    return http_reply_json_header(conn, 200, out, g_ignored[0] != '\0' ? HTTP_REPLY_IGNORED_FIELDS_HEADER : NULL,
                                  g_ignored);
}

enum MHD_Result generation_step(struct generation **gp, struct MHD_Connection *conn, const struct server_params *p,
                                const struct generation_input *in, int *status)
{
    char err[ERR_MSG_MAX];
    *status = 0;
    if (*gp == NULL) {
        enum MHD_Result rc = generation_begin(gp, conn, p, in, status);
        if (*gp == NULL)
            return rc;
    }
    struct generation *g = *gp;
    for (;;) {
        if (http_reply_client_gone(conn) || *p->stop) {
            LOG_INFO("%s: the HTTP client went away before its answer; cancelling", bridge_call_id(g->call));
            break;
        }
        cJSON *reply = NULL;
        if (bridge_call_next(g->call, 0, &reply, err) == 0) {
            const char *type = type_of(reply);
            if (!g->stream && g->n > 1 && strcmp(type, "done") == 0) {
                /* wait for every choice; the last one answers */
                if (done_keep(g->dones, g->n, &g->n_done, reply) < g->n)
                    continue;
                reply = cJSON_CreateObject(); /* generation_answer uses the kept ones */
                if (reply == NULL || !cJSON_AddStringToObject(reply, "type", "done")) {
                    cJSON_Delete(reply);
                    break;
                }
            }
            if (strcmp(type_of(reply), "error") == 0 || strcmp(type_of(reply), "done") == 0 ||
                (g->stream && strcmp(type_of(reply), "token") == 0)) {
                *gp = NULL;
                return generation_answer(g, conn, p, in->kind, reply, status);
            }
            cJSON_Delete(reply); /* not for us (a token of a non-streamed request cannot come) */
            continue;
        }
        if (watch_now_s() >= g->deadline_s) {
            *gp = NULL;
            generation_end(g, p, true, true);
            struct openai_error e;
            openai_error_set(&e, 504, "server_error", "timeout", NULL, "no reply from the coordinator within %d ms",
                             p->cfg->request_timeout_ms);
            return answer_error(conn, &e, status);
        }
        enum watch_park park = watch_park(in->wc, g->deadline_s);
        if (park == WATCH_PARKED)
            return MHD_YES;
        if (park == WATCH_STOPPING)
            break;
    }
    *gp = NULL;
    generation_end(g, p, true, true);
    *status = 499;
    return MHD_NO;
}
