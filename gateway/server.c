/* server.c: libmicrohttpd daemon, routing, API key, body limit, and the
 * small endpoints (/v1/models, /health, /metrics); completions are handed
 * to generation.c.
 *
 * The daemon is a few event loops (MHD_USE_EPOLL with a thread pool of
 * gateway.threads), not a thread per connection: an idle or slow connection
 * costs a socket and a small record, and nothing here may block. A request
 * that waits for the coordinator parks its connection (watch.h) and returns;
 * the coordinator's reply wakes it and libmicrohttpd calls again.
 *
 * Per request, the access handler is called first with the headers
 * (framing and target, framing.h; route, method, key and Content-Length:
 * a refused request is answered before its body is read, and one whose
 * framing or target is refused is closed after its answer), then with body
 * pieces (kept up to max_body_bytes; a chunked upload that crosses it is
 * answered 413 at once, see http_reply_error_early; over HTTPS at its end),
 * then once more to answer, again after each wake while it is parked. A
 * connection past the limits (admit.h) is answered as it opens. Every path answers with an OpenAI error object;
 * nothing a client sends can crash the gateway. Over plain HTTP a
 * connection reaches libmicrohttpd through the front (front.h), which
 * answers a malformed first head itself; what libmicrohttpd still answers
 * itself is listed in docs/http.md.
 */
#include "server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <microhttpd.h>

#include "admit.h"
#include "error.h"
#include "framing.h"
#include "front.h"
#include "generation.h"
#include "http_reply.h"
#include "logging.h"
#include "watch.h"

#define SERVER_HEALTH_TIMEOUT_MS 1000
#define SERVER_STATS_TIMEOUT_MS 2000
/* libmicrohttpd's idle timeout: a response the client stops reading. The
 * client's own deadlines for its request are watch.c's. */
#define SERVER_IDLE_TIMEOUT_S 120
/* gateway.threads 0: one event loop per core, at most this many. */
#define SERVER_THREADS_AUTO_MAX 16
/* libmicrohttpd's messages of one kind (a refused connection, a closed
 * one) are logged at most this often: a flood must not flood the log. */
#define SERVER_MHD_LOG_EVERY_S 10.0
#define SERVER_MHD_LOG_KINDS 16
/* libmicrohttpd's memory per connection: a head of HEAD_CHECK_MAX_BYTES,
 * a record per header and the response's headers fit with room to spare
 * (its default, 32 KiB, answered a 16 KiB head 431 itself). */
#define SERVER_CONNECTION_MEMORY_BYTES (64 * 1024)

struct mhd_log_kind {
    const char *fmt;      /* libmicrohttpd's format string: one per kind of message */
    double last_s;
    long suppressed;
};

struct server {
    struct server_params p;
    struct MHD_Daemon *daemon;
    struct watch *watch;
    struct admit *admit;
    struct front *front; /* plain HTTP: accepts and judges each first head (NULL over HTTPS) */
    bool tls;         /* HTTPS: nothing may be written to a socket beside libmicrohttpd */
    pthread_mutex_t log_mu;
    struct mhd_log_kind log_kinds[SERVER_MHD_LOG_KINDS];
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
    bool answered;    /* a response was queued (or written early) */
    bool early;       /* answered in the middle of its body: the rest is discarded, then closed */
    bool too_large;   /* HTTPS: a body past the limit, discarded to its end, then answered 413 */
    bool serving;     /* the body is complete: the request is the gateway's */
    char *body;
    size_t len, cap;
    size_t discarded; /* bytes read and dropped after an early answer */
    struct watch_conn *wc;          /* the connection's record */
    struct generation *gen;         /* a completion parked before its response */
    struct bridge_call *stats_call; /* /health, /metrics: the stats request in flight (holds wc) */
    double stats_deadline_s;
    /* the access log's line (on_completed): never the body, the query, a
     * header or the key */
    char method[16], path[96];
    double t0_s;
};

/* src into dst (size bytes), every byte outside printable ASCII as '?': a
 * log line never carries a client's control characters. */
static void printable_copy(char *dst, size_t size, const char *src)
{
    size_t i = 0;
    for (; src != NULL && src[i] != '\0' && i + 1 < size; i++)
        dst[i] = src[i] >= 0x20 && src[i] < 0x7f ? src[i] : '?';
    dst[i] = '\0';
}

/* p->tls is set whether or not a certificate was configured. */
static bool serves_tls(const struct server_params *p)
{
    return p->tls != NULL && p->tls->cert_pem != NULL;
}

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
    /* An authentication scheme is case-insensitive (RFC 9110, 11.1):
     * "bearer" and "BEARER" are Bearer. */
    if (h == NULL || strncasecmp(h, "Bearer", 6) != 0 || (h[6] != ' ' && h[6] != '\t'))
        return false;
    h += 6;
    while (*h == ' ' || *h == '\t')
        h++;
    return key_equal(h, api_key);
}

/* Ends the stats request of /health or /metrics, if one is open. */
static void stats_end(struct request_state *st)
{
    if (st->stats_call == NULL)
        return;
    bridge_call_close(st->stats_call); /* no notification after this: the hold can go */
    st->stats_call = NULL;
    watch_conn_release(st->wc);
}

/* Opens and sends the stats request; false with why when it could not. */
static bool stats_send(struct request_state *st, const struct server_params *p, int timeout_ms, char *why,
                       size_t why_size)
{
    char err[ERR_MSG_MAX];
    cJSON *msg = cJSON_CreateObject();
    bool ok = msg != NULL && cJSON_AddNumberToObject(msg, "v", 1) != NULL &&
              cJSON_AddStringToObject(msg, "type", "stats") != NULL &&
              bridge_call_open(p->bridge, "stats", &st->stats_call, err) == 0;
    if (ok) {
        watch_conn_hold(st->wc);
        bridge_call_set_notify(st->stats_call, watch_wake, st->wc);
        ok = bridge_call_send(st->stats_call, msg, err) == 0;
    }
    cJSON_Delete(msg);
    if (!ok) {
        stats_end(st);
        snprintf(why, why_size, "out of memory");
        return false;
    }
    st->stats_deadline_s = watch_now_s() + timeout_ms / 1000.0;
    return true;
}

/* The coordinator's stats for /health and /metrics (st->route, which sets
 * the wait), without blocking the event loop: 1 while parked (nothing
 * queued); 0 with *reply (caller deletes), or NULL and why when the
 * coordinator did not answer; -1 when the client left or the gateway
 * stops. */
static int stats_step(struct MHD_Connection *conn, struct request_state *st, const struct server_params *p,
                      cJSON **reply, char *why, size_t why_size)
{
    const int timeout_ms = st->route == ROUTE_HEALTH ? SERVER_HEALTH_TIMEOUT_MS : SERVER_STATS_TIMEOUT_MS;
    char err[ERR_MSG_MAX];
    *reply = NULL;
    if (st->stats_call == NULL && !stats_send(st, p, timeout_ms, why, why_size))
        return 0;
    for (;;) {
        if (http_reply_client_gone(conn) || *p->stop) {
            stats_end(st);
            return -1;
        }
        if (bridge_call_next(st->stats_call, 0, reply, err) == 0)
            break;
        if (watch_now_s() >= st->stats_deadline_s) {
            snprintf(why, why_size, "the coordinator did not answer within %d ms", timeout_ms);
            stats_end(st);
            return 0;
        }
        enum watch_park park = watch_park(st->wc, st->stats_deadline_s);
        if (park == WATCH_PARKED)
            return 1;
        if (park == WATCH_STOPPING) {
            stats_end(st);
            return -1;
        }
    }
    stats_end(st);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(*reply, "type");
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "stats") != 0) {
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(*reply, "message");
        snprintf(why, why_size, "%s", cJSON_IsString(m) ? m->valuestring : "the coordinator's stats reply is malformed");
        cJSON_Delete(*reply);
        *reply = NULL;
    }
    return 0;
}

static enum MHD_Result handle_health(struct MHD_Connection *conn, struct request_state *st,
                                     const struct server_params *p, int *status)
{
    char why[256];
    cJSON *stats = NULL;
    int w = stats_step(conn, st, p, &stats, why, sizeof(why));
    if (w != 0) {
        *status = w > 0 ? 0 : 499;
        return w > 0 ? MHD_YES : MHD_NO;
    }
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
    if (ok != NULL && cJSON_AddStringToObject(ok, "status", "ok") == NULL) {
        cJSON_Delete(ok);
        ok = NULL; /* http_reply_json answers 500 */
    }
    return http_reply_json(conn, 200, ok);
}

static enum MHD_Result handle_metrics(struct MHD_Connection *conn, struct request_state *st,
                                      const struct server_params *p, int *status)
{
    char why[256], err[ERR_MSG_MAX];
    cJSON *stats = NULL;
    int w = stats_step(conn, st, p, &stats, why, sizeof(why));
    if (w != 0) {
        *status = w > 0 ? 0 : 499;
        return w > 0 ? MHD_YES : MHD_NO;
    }
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
    /* the engine gauges only from an answer of this scrape: absent, not stale, when there is none */
    bool failed = buf == NULL || http_metrics_render_engine(stats, p->cfg->served_model_name, &buf, &len, err) != 0;
    cJSON_Delete(stats);
    if (failed || http_metrics_render(p->metrics, p->cfg->served_model_name, &buf, &len, err) != 0) {
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
    watch_conn_phase(st->wc, WATCH_SERVING);
    http_metrics_request_done(p->metrics, endpoint_of(st->route), e->status);
    return http_reply_error(conn, e, allow);
}

/* Like refuse, and the connection is closed once the answer is sent. */
static enum MHD_Result refuse_close(struct MHD_Connection *conn, const struct openai_error *e, struct request_state *st,
                                    const struct server_params *p)
{
    st->answered = true;
    watch_conn_phase(st->wc, WATCH_SERVING);
    http_metrics_request_done(p->metrics, endpoint_of(st->route), e->status);
    return http_reply_error_close(conn, e);
}

/* The first call, with the headers: framing, target, route, method, key,
 * Content-Length. */
static enum MHD_Result on_headers(struct server *s, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, void **con_cls)
{
    const struct server_params *p = &s->p;
    struct openai_error e;
    struct request_state *st = calloc(1, sizeof(*st));
    if (st == NULL)
        return MHD_NO;
    *con_cls = st;
    st->t0_s = watch_now_s();
    printable_copy(st->method, sizeof st->method, method);
    printable_copy(st->path, sizeof st->path, url);
    st->wc = watch_conn_of(conn);
    if (st->wc == NULL)
        return MHD_NO; /* being shut down: its record could not be made */
    if (watch_conn_closing(st->wc)) {
        if (!s->tls)
            return MHD_NO; /* answered at connect */
        /* past the limits at connect: a TLS connection is answered once its handshake is done */
        openai_error_set(&e, 503, "server_error", "too_many_connections", NULL,
                         "the gateway has too many connections open (gateway.max_connections or "
                         "gateway.max_connections_per_ip); retry later");
        return refuse_close(conn, &e, st, p);
    }
    watch_conn_phase(st->wc, WATCH_BODY);
    if (p->tls != NULL && p->tls->client_ca_pem != NULL) {
        char why[256];
        if (!tls_client_verified(conn, why, sizeof(why))) {
            openai_error_set(&e, 401, "authentication_error", "invalid_client_certificate", NULL, "%s", why);
            return refuse_close(conn, &e, st, p);
        }
    }
    if (framing_refused(conn, url, version, &e))
        return refuse_close(conn, &e, st, p);
    url = framing_path_of(url);
    const char *want = NULL;
    st->route = route_of(url, &want);
    if (st->route == ROUTE_NONE) {
        openai_error_set(&e, 404, "not_found_error", "not_found", NULL, "%.200s %.200s: no such endpoint", method, url);
        return refuse(conn, &e, NULL, st, p);
    }
    bool head_ok = strcmp(want, "GET") == 0 && strcmp(method, "HEAD") == 0;
    if (strcmp(method, want) != 0 && !head_ok) {
        openai_error_set(&e, 405, "invalid_request_error", "method_not_allowed", NULL,
                         "%.200s: method %.32s not allowed (use %s)", url, method, want);
        return refuse(conn, &e, want, st, p);
    }
    bool guarded = st->route != ROUTE_HEALTH && (st->route != ROUTE_METRICS || p->cfg->metrics_require_key);
    if (guarded && !authorized(conn, p->api_key)) {
        openai_error_set(&e, 401, "authentication_error", "invalid_api_key", NULL,
                         "a valid API key is required: send \"Authorization: Bearer <key>\"");
        return refuse(conn, &e, NULL, st, p);
    }
    const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl != NULL && strtoull(cl, NULL, 10) > (unsigned long long)p->cfg->max_body_bytes) {
        openai_error_set(&e, 413, "invalid_request_error", "request_too_large", NULL,
                         "request body of %.24s bytes is larger than the limit of %d bytes (gateway.max_body_bytes)",
                         cl, p->cfg->max_body_bytes);
        return refuse(conn, &e, NULL, st, p);
    }
    return MHD_YES;
}

/* A piece of the body. One that takes it past max_body_bytes can only be
 * chunked (a Content-Length over it was refused with the headers): it is
 * answered now, before the rest is read, and the rest is discarded. */
static enum MHD_Result on_body(struct MHD_Connection *conn, struct request_state *st, const struct server_params *p,
                               const char *data, size_t n)
{
    size_t limit = (size_t)p->cfg->max_body_bytes;
    if (st->len + n > limit && serves_tls(p)) {
        /* no answer can be written beside libmicrohttpd's TLS session: the
         * rest is read and dropped (within body_timeout_ms), then answered */
        st->too_large = true;
        return MHD_YES;
    }
    if (st->len + n > limit) {
        struct openai_error e;
        openai_error_set(&e, 413, "invalid_request_error", "request_too_large", NULL,
                         "request body is larger than the limit of %d bytes (gateway.max_body_bytes)",
                         p->cfg->max_body_bytes);
        st->answered = st->early = true;
        http_metrics_request_done(p->metrics, endpoint_of(st->route), 413);
        if (http_reply_error_early(conn, &e) != 0)
            return MHD_NO;
        watch_conn_phase(st->wc, WATCH_CLOSING);
        return MHD_YES;
    }
    if (st->len + n + 1 > st->cap) {
        size_t cap = (st->len + n + 1) * 2;
        if (cap > limit + 1)
            cap = limit + 1;
        char *b = realloc(st->body, cap);
        if (b == NULL)
            return MHD_NO;
        st->body = b;
        st->cap = cap;
    }
    memcpy(st->body + st->len, data, n);
    st->len += n;
    return MHD_YES;
}

/* The call once the body is complete, and again after each wake. */
static enum MHD_Result on_request(struct MHD_Connection *conn, const char *url, struct request_state *st,
                                  const struct server_params *p)
{
    if (!st->serving) {
        st->serving = true;
        watch_conn_phase(st->wc, WATCH_SERVING);
    }
    int status = 0;
    enum MHD_Result rc;
    switch (st->route) {
    case ROUTE_CHAT:
    case ROUTE_COMPLETIONS: {
        const struct generation_input in = {
            .wc = st->wc, .kind = st->route == ROUTE_CHAT ? OPENAI_CHAT : OPENAI_COMPLETION,
            .body = st->body, .len = st->len};
        rc = generation_step(&st->gen, conn, p, &in, &status);
        break;
    }
    case ROUTE_HEALTH:
        rc = handle_health(conn, st, p, &status);
        break;
    case ROUTE_METRICS:
        rc = handle_metrics(conn, st, p, &status);
        break;
    default:
        rc = handle_models(conn, p, url, st->route, &status);
        break;
    }
    if (status == 0)
        return rc; /* parked: called again when woken */
    st->answered = true;
    http_metrics_request_done(p->metrics, endpoint_of(st->route), status);
    return rc;
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                 const char *version, const char *upload_data, size_t *upload_data_size,
                                 void **con_cls)
{
    struct server *s = cls;
    struct request_state *st = *con_cls;
    if (st == NULL)
        return on_headers(s, conn, url, method, version, con_cls);
    size_t n = *upload_data_size;
    *upload_data_size = 0;
    if (st->early) {
        /* Closed once the upload ends, or once it goes on past what a client
         * that read the answer would still have in flight. */
        st->discarded += n;
        return n == 0 || st->discarded > (size_t)s->p.cfg->max_body_bytes ? MHD_NO : MHD_YES;
    }
    if (st->too_large) {
        if (n > 0)
            return MHD_YES;
        struct openai_error e;
        openai_error_set(&e, 413, "invalid_request_error", "request_too_large", NULL,
                         "request body is larger than the limit of %d bytes (gateway.max_body_bytes)",
                         s->p.cfg->max_body_bytes);
        st->too_large = false;
        return refuse_close(conn, &e, st, &s->p);
    }
    if (st->answered) /* the body of a request refused with its headers */
        return MHD_YES;
    if (n > 0)
        return on_body(conn, st, &s->p, upload_data, n);
    return on_request(conn, framing_path_of(url), st, &s->p); /* not NULL: on_headers refused those */
}

/* The client's address as text ("-" when unknown). */
static void client_address_text(struct MHD_Connection *conn, char *out, size_t size)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    snprintf(out, size, "-");
    if (ci == NULL || ci->client_addr == NULL)
        return;
    const struct sockaddr *sa = ci->client_addr;
    const void *a = sa->sa_family == AF_INET    ? (const void *)&((const struct sockaddr_in *)(const void *)sa)->sin_addr
                    : sa->sa_family == AF_INET6 ? (const void *)&((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr
                                                : NULL;
    if (a == NULL || inet_ntop(sa->sa_family, a, out, (socklen_t)size) == NULL)
        snprintf(out, size, "-");
}

/* One line per request at INFO, when it ends: who, what, the status
 * queued (0: none, the client left first), how long from its headers, and
 * a completion's tokens (prompt and completion from its usage; completion
 * only, as far as it got, for a stream cut short). */
static void access_log(struct MHD_Connection *conn, const struct request_state *st,
                       enum MHD_RequestTerminationCode toe)
{
    if ((int)LOGGING_INFO > logging_level_current)
        return;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_HTTP_STATUS);
    char addr[64], tokens[64] = "";
    client_address_text(conn, addr, sizeof addr);
    int prompt, completion;
    if (st->wc != NULL && watch_conn_usage(st->wc, &prompt, &completion)) {
        if (prompt >= 0)
            snprintf(tokens, sizeof tokens, " prompt_tokens=%d completion_tokens=%d", prompt, completion);
        else
            snprintf(tokens, sizeof tokens, " completion_tokens=%d", completion);
    }
    LOG_INFO("access: %s \"%s %s\" %u %.1f ms%s%s", addr, st->method, st->path, ci ? ci->http_status : 0u,
             (watch_now_s() - st->t0_s) * 1e3, tokens,
             toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " (the connection ended first)");
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    struct server *s = cls;
    struct request_state *st = *con_cls;
    if (st != NULL) {
        access_log(conn, st, toe);
        generation_abort(st->gen, &s->p); /* the connection ended while it was parked */
        stats_end(st);
        free(st->body);
        free(st);
        *con_cls = NULL;
    }
    /* a kept-alive connection waits for its next request, under its deadline */
    struct watch_conn *wc = watch_conn_of(conn);
    if (wc != NULL)
        watch_conn_phase(wc, WATCH_HEADERS);
}

/* The client's IPv4 address, network byte order; 0 when unknown. */
static uint32_t client_address(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (ci == NULL || ci->client_addr == NULL || ci->client_addr->sa_family != AF_INET)
        return 0;
    return ((const struct sockaddr_in *)(const void *)ci->client_addr)->sin_addr.s_addr;
}

/* A connection past the limits is answered at once, before libmicrohttpd
 * reads anything (a 503 or 429 written to its socket, whatever it asks),
 * and closed once the client has read it or WATCH_LINGER_MS has passed:
 * a close at accept would reach the client as a reset, with no word of
 * why or when to come back. */
static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    struct server *s = cls;
    watch_on_connection(s->watch, conn, socket_context, code);
    if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        admit_leave(s->admit, client_address(conn));
        front_handed_closed(s->front);
        return;
    }
    if (code != MHD_CONNECTION_NOTIFY_STARTED || s->front != NULL) /* the front admitted it */
        return;
    enum admit_verdict v = admit_enter(s->admit, client_address(conn));
    struct watch_conn *wc = *socket_context;
    if (v == ADMIT_OK || wc == NULL) /* without a record it is being shut down already */
        return;
    struct openai_error e;
    admit_refusal(s->admit, v, &e);
    watch_conn_phase(wc, WATCH_CLOSING);
    if (s->tls)
        return; /* answered by on_headers once the handshake is done */
    http_metrics_request_done(s->p.metrics, HTTP_METRICS_OTHER, e.status);
    (void)http_reply_error_early(conn, &e); /* not taken whole: the client is gone, it closes anyway */
}

/* libmicrohttpd's own messages (a refused connection, a closed one), one
 * line each, at most one of a kind per SERVER_MHD_LOG_EVERY_S. */
static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    struct server *s = cls;
    double now = watch_now_s();
    long suppressed = 0;
    bool emit = true;
    pthread_mutex_lock(&s->log_mu);
    struct mhd_log_kind *k = NULL, *oldest = &s->log_kinds[0];
    for (int i = 0; i < SERVER_MHD_LOG_KINDS && k == NULL; i++) {
        if (s->log_kinds[i].fmt == fmt)
            k = &s->log_kinds[i];
        else if (s->log_kinds[i].last_s < oldest->last_s)
            oldest = &s->log_kinds[i];
    }
    if (k == NULL) {
        k = oldest;
        *k = (struct mhd_log_kind){.fmt = fmt, .last_s = now};
    } else if (now - k->last_s < SERVER_MHD_LOG_EVERY_S) {
        k->suppressed++;
        emit = false;
    } else {
        suppressed = k->suppressed;
        k->suppressed = 0;
        k->last_s = now;
    }
    pthread_mutex_unlock(&s->log_mu);
    if (!emit || !(LOGGING_INFO <= logging_level_current))
        return;
    char line[512];
    vsnprintf(line, sizeof(line), fmt, ap);
    size_t n = strlen(line);
    while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
        line[--n] = '\0';
    if (suppressed > 0)
        LOG_INFO("libmicrohttpd: %s (and %ld more like it since the last such line)", line, suppressed);
    else
        LOG_INFO("libmicrohttpd: %s", line);
}

static int parse_listen(const char *listen, struct sockaddr_in *sa, char *err)
{
    char why[ERR_MSG_MAX];
    int rc = proc_config_listen_addr(listen, sa, why);
    return rc == 0 ? 0 : error_set(err, rc, "gateway.listen: %s", why);
}

unsigned server_socket_limit(const struct gateway_config *cfg)
{
    return (unsigned)cfg->max_connections * SERVER_ANSWERED_PAST_LIMIT;
}

static unsigned event_threads(const struct gateway_config *cfg)
{
    if (cfg->threads > 0)
        return (unsigned)cfg->threads;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1)
        n = 1;
    return (unsigned)(n < SERVER_THREADS_AUTO_MAX ? n : SERVER_THREADS_AUTO_MAX);
}

/* libmicrohttpd's event loops. Over plain HTTP it listens on nothing: the
 * front accepts and hands it the connections (front.h). NULL on failure. */
static struct MHD_Daemon *start_daemon(struct server *s, const struct sockaddr_in *sa, unsigned threads)
{
    const struct server_params *p = &s->p;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    struct MHD_OptionItem opts[5];
    int k = 0;
    if (s->tls) {
        flags |= MHD_USE_TLS;
        opts[k++] = (struct MHD_OptionItem){MHD_OPTION_SOCK_ADDR, 0, (void *)sa};
        opts[k++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_KEY, 0, (void *)p->tls->key_pem};
        opts[k++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_CERT, 0, (void *)p->tls->cert_pem};
        if (p->tls->client_ca_pem != NULL) /* libmicrohttpd then asks each client for a certificate */
            opts[k++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_TRUST, 0, (void *)p->tls->client_ca_pem};
    } else {
        flags |= MHD_USE_NO_LISTEN_SOCKET;
    }
    opts[k] = (struct MHD_OptionItem){MHD_OPTION_END, 0, NULL};
    return MHD_start_daemon(
        flags, ntohs(sa->sin_port), NULL, NULL, on_access, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s,
        MHD_OPTION_THREAD_POOL_SIZE, threads, MHD_OPTION_CONNECTION_LIMIT, server_socket_limit(p->cfg),
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)SERVER_IDLE_TIMEOUT_S, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
        (size_t)SERVER_CONNECTION_MEMORY_BYTES, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
        MHD_OPTION_UNESCAPE_CALLBACK, framing_unescape, s, MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
        MHD_OPTION_ARRAY, opts, MHD_OPTION_END);
}

/* Frees what server_start made; the daemon is stopped already or was not started. */
static void server_free(struct server *s)
{
    front_destroy(s->front);
    admit_destroy(s->admit);
    watch_destroy(s->watch);
    pthread_mutex_destroy(&s->log_mu);
    free(s);
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
    s->tls = serves_tls(p);
    if (pthread_mutex_init(&s->log_mu, NULL) != 0) {
        free(s);
        return error_set(err, ERR_SYSTEM, "server: pthread_mutex_init failed");
    }
    const struct watch_params wp = {.header_timeout_ms = p->cfg->header_timeout_ms,
                                    .body_timeout_ms = p->cfg->body_timeout_ms};
    if ((rc = watch_create(&s->watch, &wp, err)) != 0 ||
        (rc = admit_create(&s->admit, p->cfg->max_connections, p->cfg->max_connections_per_ip, err)) != 0)
        goto fail;
    if (!s->tls) {
        const struct front_params fp = {.addr = sa, .max_sockets = server_socket_limit(p->cfg),
                                        .header_timeout_ms = p->cfg->header_timeout_ms, .admit = s->admit,
                                        .metrics = p->metrics};
        char why[ERR_MSG_MAX];
        if ((rc = front_create(&s->front, &fp, why)) != 0) {
            rc = error_set(err, rc, "gateway.listen: cannot serve HTTP on %s (%s)", p->cfg->listen, why);
            goto fail;
        }
    }
    const unsigned threads = event_threads(p->cfg);
    s->daemon = start_daemon(s, &sa, threads);
    if (s->daemon == NULL) {
        rc = error_set(err, ERR_SYSTEM, "gateway.listen: cannot serve %s on %s (%s)", s->tls ? "HTTPS" : "HTTP",
                       p->cfg->listen,
                       s->tls ? "address in use? or libmicrohttpd refused the certificate: see the log above"
                              : "libmicrohttpd did not start: see the log above");
        goto fail;
    }
    if (s->front != NULL && (rc = front_start(s->front, s->daemon, err)) != 0) {
        MHD_stop_daemon(s->daemon);
        goto fail;
    }
    LOG_INFO("%s: %u event-loop thread(s), at most %d connections, %d per client address%s (past them "
             "answered 503/429 up to %u sockets); headers within %d ms, bodies within %d ms, bodies up to %d bytes",
             s->tls ? "HTTPS" : "HTTP", threads, p->cfg->max_connections, p->cfg->max_connections_per_ip,
             p->cfg->max_connections_per_ip == 0 ? " (no limit)" : "", server_socket_limit(p->cfg),
             p->cfg->header_timeout_ms,
             p->cfg->body_timeout_ms, p->cfg->max_body_bytes);
    *out = s;
    return 0;
fail:
    server_free(s);
    return rc;
}

void server_stop(struct server *s)
{
    if (s == NULL)
        return;
    /* nothing is handed to libmicrohttpd once it stops */
    front_stop(s->front);
    /* libmicrohttpd must find no suspended connection when it stops */
    watch_stop(s->watch);
    MHD_stop_daemon(s->daemon);
    server_free(s);
}
