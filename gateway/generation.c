/* generation.c: a completion request from HTTP to the coordinator and back
 * (see generation.h).
 *
 * Flow: parse and validate -> open a bridge call, send "generate" -> wait
 * for the first reply, polling the client's socket every
 * GENERATION_SLICE_MS. An error before any token is an HTTP error status
 * (so a streamed request that is refused gets a 4xx/5xx, not an SSE body).
 * Non-streamed: wait for "done". Streamed: a 200 text/event-stream response
 * whose reader callback turns each coordinator reply into one chunk; its
 * free callback cancels the request when the stream did not end (the client
 * hung up and a write failed, or the reader saw the hang-up).
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

#define GENERATION_SLICE_MS 50
#define GENERATION_BLOCK_BYTES 4096

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
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

/* Waits for the call's next reply: 0 with *reply, 1 when the client hung
 * up or the gateway is stopping, 2 after request_timeout_ms of silence. */
static int wait_reply(struct MHD_Connection *conn, const struct server_params *p, struct bridge_call *call,
                      cJSON **reply)
{
    char err[ERR_MSG_MAX];
    double deadline = now_s() + p->cfg->request_timeout_ms / 1000.0;
    for (;;) {
        if (bridge_call_next(call, GENERATION_SLICE_MS, reply, err) == 0)
            return 0;
        if ((conn != NULL && http_reply_client_gone(conn)) || *p->stop)
            return 1;
        if (now_s() > deadline)
            return 2;
    }
}

struct stream {
    const struct server_params *p;
    struct MHD_Connection *conn;
    struct bridge_call *call;
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

/* Turns one coordinator reply into SSE bytes; takes reply. */
static void stream_on_reply(struct stream *st, cJSON *reply)
{
    const char *type = type_of(reply);
    double t = now_s();
    if (strcmp(type, "token") == 0 || strcmp(type, "done") == 0) {
        if (st->t_first == 0) {
            st->t_first = t;
            http_metrics_generation_first(st->p->metrics, t - st->t0);
        }
        st->t_last = t;
    }
    if (strcmp(type, "token") == 0) {
        st->n_tokens += count_ids(reply);
        pending_event(st, openai_chunk_json(st->kind, st->resp_id, st->created, st->model, reply, false, NULL,
                                            st->include_usage));
    } else if (strcmp(type, "done") == 0) {
        st->ended = true;
        pending_event(st, openai_chunk_json(st->kind, st->resp_id, st->created, st->model, NULL, false, reply,
                                            st->include_usage));
        if (st->include_usage)
            pending_event(st, openai_usage_chunk_json(st->kind, st->resp_id, st->created, st->model, reply));
        pending_done_marker(st);
    } else if (strcmp(type, "error") == 0) {
        /* After the 200 is out, an error can only travel in the stream. */
        st->ended = true;
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
    (void)pos;
    while (st->pending_off == st->pending_len) {
        if (st->finished)
            return MHD_CONTENT_READER_END_OF_STREAM;
        cJSON *reply = NULL;
        int w = wait_reply(st->conn, st->p, st->call, &reply);
        if (w == 1)
            return MHD_CONTENT_READER_END_WITH_ERROR; /* hung up: stream_free cancels */
        if (w == 2) {
            struct openai_error e;
            openai_error_set(&e, 504, "server_error", "timeout", NULL, "no reply from the coordinator within %d ms",
                             st->p->cfg->request_timeout_ms);
            pending_event(st, openai_error_json(&e));
            pending_done_marker(st);
            continue;
        }
        stream_on_reply(st, reply);
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
    double t = now_s();
    http_metrics_generation_end(st->p->metrics, st->t_first > 0, st->n_tokens, st->t_last - st->t_first, t - st->t0);
    bridge_call_close(st->call);
    free(st->pending);
    free(st);
}

enum MHD_Result generation_handle(struct MHD_Connection *conn, const struct server_params *p, enum openai_kind kind,
                                  const char *body, size_t len, int *status_out)
{
    char err[ERR_MSG_MAX];
    struct openai_error e;
    struct openai_request req;
    *status_out = 0;
    if (openai_parse_request(kind, body, len, p->cfg->served_model_name, &req, &e) != 0) {
        *status_out = e.status;
        return http_reply_error(conn, &e, NULL);
    }
    struct bridge_call *call = NULL;
    if (bridge_call_open(p->bridge, "gw", &call, err) != 0 ||
        bridge_call_send(call, req.generate, err) != 0) {
        openai_request_free(&req);
        bridge_call_close(call);
        openai_error_set(&e, 500, "server_error", NULL, NULL, "%s", err);
        *status_out = e.status;
        return http_reply_error(conn, &e, NULL);
    }
    bool stream = req.stream, include_usage = req.include_usage;
    openai_request_free(&req);
    double t0 = now_s();
    long created = (long)time(NULL);
    http_metrics_generation_start(p->metrics);

    /* The first reply decides the status. */
    cJSON *reply = NULL;
    int w = wait_reply(conn, p, call, &reply);
    for (;;) {
        if (w != 0)
            break;
        const char *type = type_of(reply);
        if (strcmp(type, "error") == 0 || strcmp(type, "done") == 0 || (stream && strcmp(type, "token") == 0))
            break;
        cJSON_Delete(reply); /* not for us (a token of a non-streamed request cannot come) */
        reply = NULL;
        w = wait_reply(conn, p, call, &reply);
    }
    if (w == 1) {
        LOG_INFO("%s: the HTTP client went away before its answer; cancelling", bridge_call_id(call));
        bridge_call_cancel(call, err);
        http_metrics_generation_end(p->metrics, 0, 0, 0, now_s() - t0);
        bridge_call_close(call);
        return MHD_NO;
    }
    if (w == 2 || strcmp(type_of(reply), "error") == 0) {
        if (w == 2) {
            bridge_call_cancel(call, err);
            openai_error_set(&e, 504, "server_error", "timeout", NULL, "no reply from the coordinator within %d ms",
                             p->cfg->request_timeout_ms);
        } else {
            openai_error_from_reply(reply, &e);
        }
        cJSON_Delete(reply);
        http_metrics_generation_end(p->metrics, 0, 0, 0, now_s() - t0);
        bridge_call_close(call);
        *status_out = e.status;
        return http_reply_error(conn, &e, NULL);
    }
    const char *prefix = kind == OPENAI_CHAT ? "chatcmpl-" : "cmpl-";
    if (!stream) {
        double t = now_s();
        double decode_s = timing_ms(reply, "decode_ms") / 1000.0;
        http_metrics_generation_first(p->metrics, (t - t0) - decode_s);
        char resp_id[80];
        snprintf(resp_id, sizeof(resp_id), "%s%s", prefix, bridge_call_id(call));
        cJSON *out = openai_response_json(kind, resp_id, created, p->cfg->served_model_name, reply);
        http_metrics_generation_end(p->metrics, 1, count_ids(reply), decode_s, t - t0);
        cJSON_Delete(reply);
        bridge_call_close(call);
        *status_out = 200;
        return http_reply_json(conn, 200, out);
    }
    struct stream *st = calloc(1, sizeof(*st));
    if (st == NULL) {
        cJSON_Delete(reply);
        bridge_call_cancel(call, err);
        http_metrics_generation_end(p->metrics, 0, 0, 0, now_s() - t0);
        bridge_call_close(call);
        openai_error_set(&e, 500, "server_error", NULL, NULL, "out of memory");
        *status_out = 500;
        return http_reply_error(conn, &e, NULL);
    }
    st->p = p;
    st->conn = conn;
    st->call = call;
    st->kind = kind;
    st->include_usage = include_usage;
    st->created = created;
    st->t0 = t0;
    snprintf(st->resp_id, sizeof(st->resp_id), "%s%s", prefix, bridge_call_id(call));
    snprintf(st->model, sizeof(st->model), "%s", p->cfg->served_model_name);
    if (kind == OPENAI_CHAT) /* the opening chunk carries the role, as OpenAI's does */
        pending_event(st, openai_chunk_json(kind, st->resp_id, created, st->model, NULL, true, NULL, include_usage));
    stream_on_reply(st, reply);
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, GENERATION_BLOCK_BYTES, stream_read, st, stream_free);
    if (r == NULL) {
        stream_free(st);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result rc = MHD_queue_response(conn, 200, r);
    MHD_destroy_response(r); /* MHD keeps its reference; stream_free runs when it is done */
    *status_out = 200;
    return rc;
}
