/* server.c: libmicrohttpd daemon, routing, API key, body limit, and the
 * small endpoints (/v1/models, /health, /metrics); completions are handed
 * to generation.c.
 *
 * Per request, the access handler is called first with the headers (route,
 * method, key and Content-Length are checked there, so a refused request is
 * answered before its body is read), then with body pieces (kept up to
 * max_body_bytes), then once more to answer. Every path answers with an
 * OpenAI error object; nothing a client sends can crash the gateway.
 */
#include "server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <microhttpd.h>

#include "error.h"
#include "generation.h"
#include "http_reply.h"
#include "logging.h"

#define SERVER_HEALTH_TIMEOUT_MS 1000
#define SERVER_STATS_TIMEOUT_MS 2000
#define SERVER_IDLE_TIMEOUT_S 120

struct server {
    struct server_params p;
    struct MHD_Daemon *daemon;
};

enum route {
    ROUTE_NONE = 0,
    ROUTE_CHAT,
    ROUTE_COMPLETIONS,
    ROUTE_MODELS,
    ROUTE_MODEL,      /* /v1/models/<name> */
    ROUTE_HEALTH,
    ROUTE_METRICS,
};

struct request_state {
    enum route route;
    bool answered;    /* a response was queued on the first call */
    bool too_large;
    char *body;
    size_t len, cap;
};

static enum http_metrics_endpoint endpoint_of(enum route r)
{
    switch (r) {
    case ROUTE_CHAT:
        return HTTP_METRICS_CHAT;
    case ROUTE_COMPLETIONS:
        return HTTP_METRICS_COMPLETIONS;
    case ROUTE_MODELS:
    case ROUTE_MODEL:
        return HTTP_METRICS_MODELS;
    case ROUTE_HEALTH:
        return HTTP_METRICS_HEALTH;
    case ROUTE_METRICS:
        return HTTP_METRICS_METRICS;
    default:
        return HTTP_METRICS_OTHER;
    }
}

/* The route of url and the method it takes ("GET" / "POST"). */
static enum route route_of(const char *url, const char **method)
{
    *method = "GET";
    if (strcmp(url, "/v1/chat/completions") == 0 || strcmp(url, "/v1/completions") == 0) {
        *method = "POST";
        return url[4] == 'c' && url[5] == 'h' ? ROUTE_CHAT : ROUTE_COMPLETIONS;
    }
    if (strcmp(url, "/v1/models") == 0)
        return ROUTE_MODELS;
    if (strncmp(url, "/v1/models/", 11) == 0 && url[11] != '\0')
        return ROUTE_MODEL;
    if (strcmp(url, "/health") == 0)
        return ROUTE_HEALTH;
    if (strcmp(url, "/metrics") == 0)
        return ROUTE_METRICS;
    return ROUTE_NONE;
}

/* Constant-time comparison: the key's bytes do not leak through timing. */
static bool key_equal(const char *a, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    unsigned char d = (unsigned char)(na != nb);
    for (size_t i = 0; i < na; i++)
        d |= (unsigned char)(a[i] ^ b[i < nb ? i : 0]);
    return d == 0;
}

static bool authorized(struct MHD_Connection *conn, const char *api_key)
{
    if (api_key[0] == '\0')
        return true;
    const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (h == NULL || strncmp(h, "Bearer ", 7) != 0)
        return false;
    h += 7;
    while (*h == ' ')
        h++;
    return key_equal(h, api_key);
}

/* Sends a stats request; the reply (caller deletes) or NULL with why. */
static cJSON *coordinator_stats(const struct server_params *p, int timeout_ms, char *why, size_t why_size)
{
    char err[ERR_MSG_MAX];
    struct bridge_call *call = NULL;
    cJSON *msg = cJSON_CreateObject();
    cJSON *reply = NULL;
    if (msg == NULL || cJSON_AddNumberToObject(msg, "v", 1) == NULL ||
        cJSON_AddStringToObject(msg, "type", "stats") == NULL || bridge_call_open(p->bridge, "stats", &call, err) != 0 ||
        bridge_call_send(call, msg, err) != 0) {
        snprintf(why, why_size, "out of memory");
    } else if (bridge_call_next(call, timeout_ms, &reply, err) != 0) {
        snprintf(why, why_size, "the coordinator did not answer within %d ms", timeout_ms);
    } else if (!cJSON_IsString(cJSON_GetObjectItemCaseSensitive(reply, "type")) ||
               strcmp(cJSON_GetObjectItemCaseSensitive(reply, "type")->valuestring, "stats") != 0) {
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(reply, "message");
        snprintf(why, why_size, "%s", cJSON_IsString(m) ? m->valuestring : "the coordinator's stats reply is malformed");
        cJSON_Delete(reply);
        reply = NULL;
    }
    cJSON_Delete(msg);
    bridge_call_close(call);
    return reply;
}

static enum MHD_Result handle_health(struct MHD_Connection *conn, const struct server_params *p, int *status)
{
    char why[256];
    cJSON *stats = coordinator_stats(p, SERVER_HEALTH_TIMEOUT_MS, why, sizeof(why));
    const cJSON *target = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(stats, "workers"), "target");
    bool up = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(target, "up"));
    struct openai_error e;
    if (stats == NULL)
        openai_error_set(&e, 503, "server_error", "coordinator_unavailable", NULL, "%s", why);
    else if (!up)
        openai_error_set(&e, 503, "server_error", "target_unavailable", NULL, "no target worker is registered");
    cJSON_Delete(stats);
    if (stats == NULL || !up) {
        *status = 503;
        return http_reply_error(conn, &e, NULL);
    }
    *status = 200;
    cJSON *ok = cJSON_CreateObject();
    cJSON_AddStringToObject(ok, "status", "ok");
    return http_reply_json(conn, 200, ok);
}

static enum MHD_Result handle_metrics(struct MHD_Connection *conn, const struct server_params *p, int *status)
{
    char why[256], err[ERR_MSG_MAX];
    cJSON *stats = coordinator_stats(p, SERVER_STATS_TIMEOUT_MS, why, sizeof(why));
    const cJSON *prom = cJSON_GetObjectItemCaseSensitive(stats, "prometheus");
    char *buf = NULL;
    size_t len = 0;
    const char *coord = cJSON_IsString(prom) ? prom->valuestring : "";
    size_t n = strlen(coord);
    static const char up_fmt[] = "# HELP tandem_gateway_coordinator_up Whether the coordinator answered the "
                                 "gateway's stats request.\n# TYPE tandem_gateway_coordinator_up gauge\n"
                                 "tandem_gateway_coordinator_up %d\n";
    buf = malloc(n + sizeof(up_fmt) + 2);
    if (buf != NULL) {
        memcpy(buf, coord, n);
        if (n > 0 && coord[n - 1] != '\n')
            buf[n++] = '\n';
        len = n + (size_t)sprintf(buf + n, up_fmt, stats != NULL);
    }
    cJSON_Delete(stats);
    if (buf == NULL || http_metrics_render(p->metrics, &buf, &len, err) != 0) {
        free(buf);
        struct openai_error e;
        openai_error_set(&e, 500, "server_error", NULL, NULL, "out of memory");
        *status = 500;
        return http_reply_error(conn, &e, NULL);
    }
    *status = 200;
    enum MHD_Result rc = http_reply_text(conn, 200, "text/plain; version=0.0.4; charset=utf-8", buf, len);
    free(buf);
    return rc;
}

static cJSON *model_json(const struct server_params *p)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", p->cfg->served_model_name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)p->started_s);
    cJSON_AddStringToObject(m, "owned_by", "tandem");
    return m;
}

static enum MHD_Result handle_models(struct MHD_Connection *conn, const struct server_params *p, const char *url,
                                     enum route route, int *status)
{
    if (route == ROUTE_MODEL) {
        if (strcmp(url + 11, p->cfg->served_model_name) != 0) {
            struct openai_error e;
            openai_error_set(&e, 404, "invalid_request_error", "model_not_found", "model",
                             "model \"%.200s\" does not exist; this server serves \"%.200s\"", url + 11,
                             p->cfg->served_model_name);
            *status = 404;
            return http_reply_error(conn, &e, NULL);
        }
        *status = 200;
        return http_reply_json(conn, 200, model_json(p));
    }
    cJSON *list = cJSON_CreateObject();
    cJSON_AddStringToObject(list, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(list, "data");
    cJSON_AddItemToArray(data, model_json(p));
    *status = 200;
    return http_reply_json(conn, 200, list);
}

/* Answers a refused request on the first call; *status is its status. */
static enum MHD_Result refuse(struct MHD_Connection *conn, const struct openai_error *e, const char *allow,
                              struct request_state *st, const struct server_params *p)
{
    st->answered = true;
    http_metrics_request_done(p->metrics, endpoint_of(st->route), e->status);
    return http_reply_error(conn, e, allow);
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                 const char *version, const char *upload_data, size_t *upload_data_size,
                                 void **con_cls)
{
    struct server *s = cls;
    const struct server_params *p = &s->p;
    struct request_state *st = *con_cls;
    struct openai_error e;
    (void)version;
    if (st == NULL) {
        st = calloc(1, sizeof(*st));
        if (st == NULL)
            return MHD_NO;
        *con_cls = st;
        const char *want = NULL;
        st->route = route_of(url, &want);
        if (st->route == ROUTE_NONE) {
            openai_error_set(&e, 404, "not_found_error", "not_found", NULL, "%.200s %.200s: no such endpoint", method,
                             url);
            return refuse(conn, &e, NULL, st, p);
        }
        bool head_ok = strcmp(want, "GET") == 0 && strcmp(method, "HEAD") == 0;
        if (strcmp(method, want) != 0 && !head_ok) {
            openai_error_set(&e, 405, "invalid_request_error", "method_not_allowed", NULL,
                             "%.200s: method %.32s not allowed (use %s)", url, method, want);
            return refuse(conn, &e, want, st, p);
        }
        bool guarded = st->route != ROUTE_HEALTH && st->route != ROUTE_METRICS;
        if (guarded && !authorized(conn, p->api_key)) {
            openai_error_set(&e, 401, "authentication_error", "invalid_api_key", NULL,
                             "a valid API key is required: send \"Authorization: Bearer <key>\"");
            return refuse(conn, &e, NULL, st, p);
        }
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl != NULL && strtoull(cl, NULL, 10) > (unsigned long long)p->cfg->max_body_bytes) {
            openai_error_set(&e, 413, "invalid_request_error", "request_too_large", NULL,
                             "request body of %.24s bytes is larger than the limit of %d bytes", cl,
                             p->cfg->max_body_bytes);
            return refuse(conn, &e, NULL, st, p);
        }
        return MHD_YES;
    }
    if (st->answered) { /* the body of a refused request: discard */
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (*upload_data_size > 0) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (st->too_large || st->len + n > (size_t)p->cfg->max_body_bytes) {
            st->too_large = true;
            return MHD_YES;
        }
        if (st->len + n + 1 > st->cap) {
            size_t cap = (st->len + n + 1) * 2;
            if (cap > (size_t)p->cfg->max_body_bytes + 1)
                cap = (size_t)p->cfg->max_body_bytes + 1;
            char *b = realloc(st->body, cap);
            if (b == NULL)
                return MHD_NO;
            st->body = b;
            st->cap = cap;
        }
        memcpy(st->body + st->len, upload_data, n);
        st->len += n;
        return MHD_YES;
    }
    if (st->too_large) {
        openai_error_set(&e, 413, "invalid_request_error", "request_too_large", NULL,
                         "request body is larger than the limit of %d bytes", p->cfg->max_body_bytes);
        return refuse(conn, &e, NULL, st, p);
    }
    int status = 0;
    enum MHD_Result rc;
    switch (st->route) {
    case ROUTE_CHAT:
        rc = generation_handle(conn, p, OPENAI_CHAT, st->body, st->len, &status);
        break;
    case ROUTE_COMPLETIONS:
        rc = generation_handle(conn, p, OPENAI_COMPLETION, st->body, st->len, &status);
        break;
    case ROUTE_HEALTH:
        rc = handle_health(conn, p, &status);
        break;
    case ROUTE_METRICS:
        rc = handle_metrics(conn, p, &status);
        break;
    default:
        rc = handle_models(conn, p, url, st->route, &status);
        break;
    }
    st->answered = true;
    http_metrics_request_done(p->metrics, endpoint_of(st->route), status ? status : 499);
    return rc;
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    struct request_state *st = *con_cls;
    (void)cls;
    (void)conn;
    (void)toe;
    if (st != NULL) {
        free(st->body);
        free(st);
        *con_cls = NULL;
    }
}

static int parse_listen(const char *listen, struct sockaddr_in *sa, char *err)
{
    char host[PROC_CONFIG_NAME_MAX];
    const char *colon = strrchr(listen, ':');
    if (colon == NULL || (size_t)(colon - listen) >= sizeof(host))
        return error_set(err, ERR_INVALID_ARG, "gateway.listen: expected host:port, got \"%s\"", listen);
    memcpy(host, listen, (size_t)(colon - listen));
    host[colon - listen] = '\0';
    memset(sa, 0, sizeof(*sa));
    sa->sin_family = AF_INET;
    sa->sin_port = htons((uint16_t)atoi(colon + 1));
    if (strcmp(host, "*") == 0 || strcmp(host, "0.0.0.0") == 0)
        sa->sin_addr.s_addr = htonl(INADDR_ANY);
    else if (strcmp(host, "localhost") == 0)
        sa->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    else if (inet_pton(AF_INET, host, &sa->sin_addr) != 1)
        return error_set(err, ERR_INVALID_ARG, "gateway.listen: \"%s\" is not an IPv4 address", host);
    return 0;
}

int server_start(struct server **out, const struct server_params *p, char *err)
{
    *out = NULL;
    struct sockaddr_in sa;
    int rc = parse_listen(p->cfg->listen, &sa, err);
    if (rc != 0)
        return rc;
    struct server *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return error_set(err, ERR_NOMEM, "server: out of memory");
    s->p = *p;
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ERROR_LOG;
    s->daemon = MHD_start_daemon(flags, ntohs(sa.sin_port), NULL, NULL, on_access, s, MHD_OPTION_SOCK_ADDR,
                                 (struct sockaddr *)&sa, MHD_OPTION_CONNECTION_LIMIT,
                                 (unsigned)p->cfg->max_connections, MHD_OPTION_CONNECTION_TIMEOUT,
                                 (unsigned)SERVER_IDLE_TIMEOUT_S, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                                 MHD_OPTION_END);
    if (s->daemon == NULL) {
        free(s);
        return error_set(err, ERR_SYSTEM, "gateway.listen: cannot serve HTTP on %s (address in use?)",
                         p->cfg->listen);
    }
    *out = s;
    return 0;
}

void server_stop(struct server *s)
{
    if (s == NULL)
        return;
    MHD_stop_daemon(s->daemon);
    free(s);
}
