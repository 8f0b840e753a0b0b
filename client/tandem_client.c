/* tandem_client.c: the ZeroMQ client of the coordinator (see tandem_client.h).
 *
 * Invariants: the client owns one ZeroMQ context and one DEALER socket; each
 * message is a single frame of JSON text (docs/protocol.md). Replies are
 * validated to the extent the caller relies on them (a JSON object with a
 * string "type"); anything else is ERR_PROTOCOL, never a crash.
 *
 * Losing the coordinator: its requests live only in its memory, so when the
 * connection drops (the coordinator died or restarted) the replies of every
 * request sent before will never come, and waiting for them is a hang.
 * ZeroMQ reconnects silently; a socket monitor (stable API, an inproc PAIR
 * socket of this client's context) tells us about the drop, and ZMTP
 * heartbeats turn a coordinator that froze or a network path that went dead
 * (no FIN, no RST) into a drop too. A drop while requests are pending (sent,
 * their final reply - done, error or stats - not read yet) is reported once
 * by tandem_client_recv as ERR_UNAVAILABLE; a drop while idle is not (a
 * request sent after it is served once ZeroMQ has reconnected). A cancel
 * does not count as a request: it gets no final reply of its own.
 *
 * Being refused: a handshake that fails (a CURVE key the coordinator does not
 * admit, CURVE on one end only, the wrong server key) is retried by libzmq
 * when the server just closed the connection, but not after a ZAP refusal
 * or a protocol error such as a mechanism mismatch: those can end libzmq's
 * session for good, no reconnect and no pipe, so a DEALER's blocking send
 * would wait forever (6 of 40 plain DEALERs connecting to a CURVE ROUTER
 * had no pipe 0.3 s later). The monitor reports each failure;
 * the client keeps its reason until a handshake succeeds and gives it:
 * requests pending fail with it; a new one fails at once after a definite
 * refusal (ZAP or protocol), which libzmq does not retry (so the client
 * connects again, see reconnect), and otherwise is queued for libzmq's
 * retry, which reports it when refused again. Sends never block: they poll
 * for room together with the monitor.
 */
#include "tandem_client.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "curve_keys.h"
#include "error.h"
#include "socket_monitor.h"

/* ZMTP heartbeats: a PING every interval; no traffic for the timeout drops
 * the connection. The coordinator's I/O thread answers PINGs whatever its
 * main loop is doing, so a busy coordinator is never taken for a dead one;
 * 5 s keeps a loaded 2-core machine well clear of false drops. */
#define CLIENT_HEARTBEAT_IVL_MS 1000
#define CLIENT_HEARTBEAT_TIMEOUT_MS 5000
#define CLIENT_MONITOR_ENDPOINT "inproc://tandem-client-monitor"
/* A send waits at most this for room in ZeroMQ's queue (1,000 messages while
 * the coordinator is away): beyond it, the coordinator is not taking them. */
#define CLIENT_SEND_WAIT_MS 10000
/* A refused client connects again at most this often (see reconnect). */
#define CLIENT_RECONNECT_MS 200

struct tandem_client {
    void *zctx;
    void *sock;
    struct socket_monitor *monitor; /* the DEALER's drops */
    int pending;         /* final replies expected and not read (a request of n choices: n) */
    /* Requests of several choices whose final replies are not all read: an
     * error without "index" ends the whole request, choices left included. */
    struct multi_choice {
        char *id;
        int left;
    } *multi;
    int n_multi, cap_multi;
    bool lost;           /* a drop while requests were pending, not reported yet */
    uint16_t refusal;    /* the last failed handshake's ZMQ_EVENT_HANDSHAKE_FAILED_*, 0 when none */
    uint32_t refusal_value;
    bool handshaken;     /* a handshake succeeded since the client was created */
    char *endpoint;      /* to connect again after a refusal */
    double reconnect_ms; /* when the last one was asked for */
};

/* server_public NULL: plain TCP/IPC; otherwise CURVE (see the header). */
static int client_create(struct tandem_client **out, const char *endpoint, const char *server_public,
                         const char *client_secret, char *err)
{
    *out = NULL;
    if (endpoint == NULL || endpoint[0] == '\0')
        return error_set(err, ERR_INVALID_ARG, "endpoint: must not be empty");
    struct tandem_client *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return error_set(err, ERR_NOMEM, "client: out of memory");
    c->zctx = zmq_ctx_new();
    if (c->zctx == NULL) {
        free(c);
        return error_set(err, ERR_SYSTEM, "zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
    }
    c->sock = zmq_socket(c->zctx, ZMQ_DEALER);
    if (c->sock == NULL) {
        int rc = error_set(err, ERR_SYSTEM, "zmq_socket(DEALER): %s", zmq_strerror(zmq_errno()));
        tandem_client_destroy(c);
        return rc;
    }
    int linger_ms = 0, ivl_ms = CLIENT_HEARTBEAT_IVL_MS, hb_timeout_ms = CLIENT_HEARTBEAT_TIMEOUT_MS;
    if (zmq_setsockopt(c->sock, ZMQ_LINGER, &linger_ms, sizeof(linger_ms)) != 0 ||
        zmq_setsockopt(c->sock, ZMQ_HEARTBEAT_IVL, &ivl_ms, sizeof(ivl_ms)) != 0 ||
        zmq_setsockopt(c->sock, ZMQ_HEARTBEAT_TIMEOUT, &hb_timeout_ms, sizeof(hb_timeout_ms)) != 0) {
        int rc = error_set(err, ERR_SYSTEM, "zmq_setsockopt(LINGER, HEARTBEAT): %s", zmq_strerror(zmq_errno()));
        tandem_client_destroy(c);
        return rc;
    }
    /* One context per client: the fixed inproc name cannot clash. */
    int mrc = socket_monitor_open(&c->monitor, c->zctx, c->sock, CLIENT_MONITOR_ENDPOINT,
                                  ZMQ_EVENT_DISCONNECTED | SOCKET_MONITOR_HANDSHAKE_EVENTS, err);
    if (mrc != 0) {
        tandem_client_destroy(c);
        return mrc;
    }
    if (server_public != NULL && (mrc = curve_client_setup(c->sock, server_public, client_secret, err)) != 0) {
        tandem_client_destroy(c);
        return mrc;
    }
    if ((c->endpoint = strdup(endpoint)) == NULL) {
        tandem_client_destroy(c);
        return error_set(err, ERR_NOMEM, "client: out of memory");
    }
    if (zmq_connect(c->sock, endpoint) != 0) {
        int rc = error_set(err, ERR_INVALID_ARG, "endpoint %s: zmq_connect: %s", endpoint,
                           zmq_strerror(zmq_errno()));
        tandem_client_destroy(c);
        return rc;
    }
    *out = c;
    return 0;
}

int tandem_client_create(struct tandem_client **out, const char *endpoint, char *err)
{
    return client_create(out, endpoint, NULL, NULL, err);
}

int tandem_client_create_curve(struct tandem_client **out, const char *endpoint,
                               const char *server_public, const char *client_secret, char *err)
{
    if (server_public == NULL)
        return error_set(err, ERR_INVALID_ARG, "server public key: required for CURVE");
    return client_create(out, endpoint, server_public, client_secret, err);
}

static const char *string_field(const cJSON *obj, const char *name);

static void multi_clear(struct tandem_client *client)
{
    for (int i = 0; i < client->n_multi; i++)
        free(client->multi[i].id);
    client->n_multi = 0;
}

/* Room for one more request of several choices and a copy of its id
 * (*copy, the caller's until multi_commit), taken before the request is
 * sent so that nothing can fail after it went out. 0 or ERR_NOMEM. */
static int multi_reserve(struct tandem_client *client, const char *id, char **copy, char *err)
{
    if (client->n_multi == client->cap_multi) {
        int cap = client->cap_multi ? 2 * client->cap_multi : 8;
        struct multi_choice *m = realloc(client->multi, (size_t)cap * sizeof *m);
        if (m == NULL)
            return error_set(err, ERR_NOMEM, "request: out of memory");
        client->multi = m;
        client->cap_multi = cap;
    }
    *copy = strdup(id);
    return *copy != NULL ? 0 : error_set(err, ERR_NOMEM, "request: out of memory");
}

/* The request of n > 1 choices whose id copy multi_reserve made was sent. */
static void multi_commit(struct tandem_client *client, char *copy, int n)
{
    client->multi[client->n_multi++] = (struct multi_choice){.id = copy, .left = n};
    client->pending += n - 1; /* the send counted one */
}

/* A final reply (done or error) read: how many expected replies it ends. */
static int finals_ended(struct tandem_client *client, const cJSON *root, bool is_error)
{
    const char *id = string_field(root, "id");
    for (int i = 0; i < client->n_multi; i++) {
        struct multi_choice *m = &client->multi[i];
        if (strcmp(m->id, id) != 0)
            continue;
        const bool whole = is_error && cJSON_GetObjectItemCaseSensitive(root, "index") == NULL;
        const int ended = whole ? m->left : 1;
        m->left -= ended;
        if (m->left <= 0) {
            free(m->id);
            *m = client->multi[--client->n_multi];
        }
        return ended;
    }
    return 1;
}

void tandem_client_destroy(struct tandem_client *client)
{
    if (client == NULL)
        return;
    multi_clear(client);
    free(client->multi);
    socket_monitor_close(client->monitor);
    if (client->sock != NULL)
        zmq_close(client->sock);
    if (client->zctx != NULL)
        zmq_ctx_term(client->zctx);
    free(client->endpoint);
    free(client);
}

void tandem_client_request_init(struct tandem_client_request *req)
{
    memset(req, 0, sizeof(*req));
    req->temperature = NAN;
    req->top_k = -1;
    req->top_p = NAN;
    req->min_p = NAN;
    req->spec_k = -1;
    req->logprobs = -1;
    req->presence_penalty = NAN;
    req->frequency_penalty = NAN;
    req->repetition_penalty = NAN;
}

int tandem_client_request_to_json(const struct tandem_client_request *req, cJSON **out, char *err)
{
    *out = NULL;
    int n_inputs = (req->prompt != NULL) + (req->chat != NULL) + (req->ids != NULL);
    if (n_inputs != 1)
        return error_set(err, ERR_INVALID_ARG, "request: give exactly one of prompt, chat, ids");
    if (req->n_stop < 0 || req->n_stop > TANDEM_CLIENT_STOP_MAX)
        return error_set(err, ERR_INVALID_ARG, "stop: at most %d strings", TANDEM_CLIENT_STOP_MAX);
    cJSON *m = cJSON_CreateObject();
    if (m == NULL)
        return error_set(err, ERR_NOMEM, "request: out of memory");
    int ok = cJSON_AddNumberToObject(m, "v", 1) != NULL &&
             cJSON_AddStringToObject(m, "type", "generate") != NULL &&
             cJSON_AddStringToObject(m, "id", req->id ? req->id : "") != NULL;
    if (req->prompt != NULL) {
        ok = ok && cJSON_AddStringToObject(m, "prompt", req->prompt) != NULL;
    } else if (req->chat != NULL) {
        cJSON *msgs = cJSON_AddArrayToObject(m, "messages");
        cJSON *msg = cJSON_CreateObject();
        ok = ok && msgs != NULL && msg != NULL;
        if (msg != NULL && !cJSON_AddItemToArray(msgs, msg)) {
            cJSON_Delete(msg);
            ok = 0;
        }
        ok = ok && cJSON_AddStringToObject(msg, "role", "user") != NULL &&
             cJSON_AddStringToObject(msg, "content", req->chat) != NULL;
    } else {
        cJSON *ids = cJSON_AddArrayToObject(m, "prompt_ids");
        ok = ok && ids != NULL;
        for (int i = 0; ok && i < req->n_ids; i++) {
            cJSON *n = cJSON_CreateNumber(req->ids[i]);
            if (n == NULL || !cJSON_AddItemToArray(ids, n)) {
                cJSON_Delete(n);
                ok = 0;
            }
        }
    }
    if (req->max_tokens > 0)
        ok = ok && cJSON_AddNumberToObject(m, "max_tokens", req->max_tokens) != NULL;
    if (!isnan(req->temperature))
        ok = ok && cJSON_AddNumberToObject(m, "temperature", req->temperature) != NULL;
    if (req->top_k >= 0)
        ok = ok && cJSON_AddNumberToObject(m, "top_k", req->top_k) != NULL;
    if (!isnan(req->top_p))
        ok = ok && cJSON_AddNumberToObject(m, "top_p", req->top_p) != NULL;
    if (!isnan(req->min_p))
        ok = ok && cJSON_AddNumberToObject(m, "min_p", req->min_p) != NULL;
    if (req->has_seed) {
        char seed[24];
        snprintf(seed, sizeof(seed), "%llu", (unsigned long long)req->seed);
        ok = ok && cJSON_AddStringToObject(m, "seed", seed) != NULL;
    }
    if (req->n_stop > 0) {
        cJSON *stop = cJSON_AddArrayToObject(m, "stop");
        ok = ok && stop != NULL;
        for (int i = 0; ok && i < req->n_stop; i++) {
            cJSON *s = cJSON_CreateString(req->stop[i] ? req->stop[i] : "");
            if (s == NULL || !cJSON_AddItemToArray(stop, s)) {
                cJSON_Delete(s);
                ok = 0;
            }
        }
    }
    if (req->stream)
        ok = ok && cJSON_AddBoolToObject(m, "stream", 1) != NULL;
    if (req->spec_k >= 0)
        ok = ok && cJSON_AddNumberToObject(m, "spec_k", req->spec_k) != NULL;
    if (req->spec_mode != NULL)
        ok = ok && cJSON_AddStringToObject(m, "spec_mode", req->spec_mode) != NULL;
    if (req->draft != NULL)
        ok = ok && cJSON_AddStringToObject(m, "draft", req->draft) != NULL;
    if (req->logprobs >= 0)
        ok = ok && cJSON_AddNumberToObject(m, "logprobs", req->logprobs) != NULL;
    if (req->n > 1)
        ok = ok && cJSON_AddNumberToObject(m, "n", req->n) != NULL;
    if (!isnan(req->presence_penalty))
        ok = ok && cJSON_AddNumberToObject(m, "presence_penalty", req->presence_penalty) != NULL;
    if (!isnan(req->frequency_penalty))
        ok = ok && cJSON_AddNumberToObject(m, "frequency_penalty", req->frequency_penalty) != NULL;
    if (!isnan(req->repetition_penalty))
        ok = ok && cJSON_AddNumberToObject(m, "repetition_penalty", req->repetition_penalty) != NULL;
    if (ok && req->grammar != NULL) {
        cJSON *g = cJSON_Duplicate(req->grammar, 1);
        ok = g != NULL && cJSON_AddItemToObject(m, "grammar", g);
        if (!ok)
            cJSON_Delete(g);
    }
    if (!ok) {
        cJSON_Delete(m);
        return error_set(err, ERR_NOMEM, "request: out of memory");
    }
    *out = m;
    return 0;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1000.0 + (double)ts.tv_nsec / 1e6;
}

/* Reads the monitor's queued events: a drop or a failed handshake while
 * requests are pending marks the client lost (and those requests gone); a
 * failed handshake is kept as the refusal until one succeeds. ERR_SYSTEM
 * when the monitor cannot be read. */
static int read_monitor(struct tandem_client *client, char *err)
{
    for (;;) {
        uint16_t event;
        uint32_t value;
        int got = socket_monitor_next(client->monitor, &event, &value, err);
        if (got <= 0)
            return got;
        if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
            client->refusal = 0;
            client->handshaken = true;
            continue;
        }
        if (socket_monitor_is_refusal(event)) {
            client->refusal = event;
            client->refusal_value = value;
        }
        if (client->pending > 0) {
            client->lost = true;
            client->pending = 0;
        }
        multi_clear(client);
    }
}

static int refused(const struct tandem_client *client, char *err)
{
    char why[ERR_MSG_MAX];
    socket_monitor_refusal_text(client->refusal, client->refusal_value, "the coordinator", why, sizeof why);
    return error_set(err, ERR_UNAVAILABLE, "%s", why);
}

/* After a definite refusal libzmq does not try again (no handshake came in
 * the 3 s after a ZAP refusal), so a coordinator that admits the key later
 * would never hear from this client: a refused send asks for a new
 * connection, whose handshake the next send finds succeeded or refused. */
static int reconnect(struct tandem_client *client, char *err)
{
    double now = now_ms();
    if (now - client->reconnect_ms < CLIENT_RECONNECT_MS)
        return 0;
    client->reconnect_ms = now;
    /* ENOENT: libzmq already dropped the endpoint with its session */
    if ((zmq_disconnect(client->sock, client->endpoint) != 0 && zmq_errno() != ENOENT) ||
        zmq_connect(client->sock, client->endpoint) != 0)
        return error_set(err, ERR_SYSTEM, "connecting again to %s: %s", client->endpoint,
                         zmq_strerror(zmq_errno()));
    return 0;
}

/* The refusal, and a reconnect for the next send (see reconnect). */
static int refused_send(struct tandem_client *client, char *err)
{
    char why[ERR_MSG_MAX];
    if (reconnect(client, why) != 0)
        return error_set(err, ERR_SYSTEM, "%s", why);
    return refused(client, err);
}

/* is_request: the message will get a final reply (everything but a cancel). */
static int client_send(struct tandem_client *client, const void *data, size_t len, bool is_request, char *err)
{
    /* A drop seen now concerns the messages sent before this one only. */
    int rc = read_monitor(client, err);
    if (rc != 0)
        return rc;
    double deadline_ms = now_ms() + CLIENT_SEND_WAIT_MS;
    for (;;) {
        /* A definite refusal stands until a handshake succeeds; a connection
         * closed mid-handshake may have been a coordinator going down. */
        if (client->refusal && client->refusal != ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL)
            return refused_send(client, err);
        if (zmq_send(client->sock, data, len, ZMQ_DONTWAIT) >= 0)
            break;
        if (zmq_errno() != EAGAIN)
            return error_set(err, ERR_SYSTEM, "zmq_send: %s", zmq_strerror(zmq_errno()));
        if (client->refusal) /* no room while refused: no pipe, or none that drains */
            return refused_send(client, err);
        long wait_ms = (long)(deadline_ms - now_ms());
        if (wait_ms <= 0)
            return error_set(err, ERR_UNAVAILABLE,
                             "the coordinator took no message within %d ms (not connected, or ZeroMQ's queue "
                             "for it is full)", CLIENT_SEND_WAIT_MS);
        zmq_pollitem_t items[2] = {
            {.socket = client->sock, .events = ZMQ_POLLOUT},
            {.socket = socket_monitor_pollable(client->monitor), .events = ZMQ_POLLIN},
        };
        if (zmq_poll(items, 2, wait_ms) < 0)
            return error_set(err, errno == EINTR ? ERR_CANCELLED : ERR_SYSTEM, "zmq_poll: %s",
                             zmq_strerror(zmq_errno()));
        if ((items[1].revents & ZMQ_POLLIN) && (rc = read_monitor(client, err)) != 0)
            return rc;
    }
    client->pending += is_request;
    return 0;
}

int tandem_client_send_raw(struct tandem_client *client, const void *data, size_t len, char *err)
{
    return client_send(client, data, len, true, err);
}

int tandem_client_send_json(struct tandem_client *client, const cJSON *msg, char *err)
{
    char *text = cJSON_PrintUnformatted(msg);
    if (text == NULL)
        return error_set(err, ERR_NOMEM, "request: out of memory");
    int rc = tandem_client_send_raw(client, text, strlen(text), err);
    cJSON_free(text);
    return rc;
}

int tandem_client_generate(struct tandem_client *client, const struct tandem_client_request *req,
                           char *err)
{
    cJSON *m = NULL;
    int rc = tandem_client_request_to_json(req, &m, err);
    if (rc != 0)
        return rc;
    char *id_copy = NULL;
    if (req->n > 1 && (rc = multi_reserve(client, req->id != NULL ? req->id : "", &id_copy, err)) != 0) {
        cJSON_Delete(m);
        return rc;
    }
    rc = tandem_client_send_json(client, m, err);
    cJSON_Delete(m);
    if (rc == 0 && id_copy != NULL)
        multi_commit(client, id_copy, req->n);
    else
        free(id_copy);
    return rc;
}

int tandem_client_cancel(struct tandem_client *client, const char *id, char *err)
{
    cJSON *m = cJSON_CreateObject();
    if (m == NULL || cJSON_AddNumberToObject(m, "v", 1) == NULL || cJSON_AddStringToObject(m, "type", "cancel") == NULL ||
        cJSON_AddStringToObject(m, "id", id != NULL ? id : "") == NULL) {
        cJSON_Delete(m);
        return error_set(err, ERR_NOMEM, "cancel: out of memory");
    }
    char *text = cJSON_PrintUnformatted(m);
    cJSON_Delete(m);
    if (text == NULL)
        return error_set(err, ERR_NOMEM, "cancel: out of memory");
    int rc = client_send(client, text, strlen(text), false, err);
    cJSON_free(text);
    return rc;
}

static const char *string_field(const cJSON *obj, const char *name)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, name);
    return cJSON_IsString(item) ? item->valuestring : "";
}

int tandem_client_recv(struct tandem_client *client, int timeout_ms, struct tandem_client_event *ev,
                       char *err)
{
    memset(ev, 0, sizeof(*ev));
    zmq_pollitem_t items[2] = {
        {.socket = client->sock, .events = ZMQ_POLLIN},
        {.socket = socket_monitor_pollable(client->monitor), .events = ZMQ_POLLIN},
    };
    /* Replies that arrived before a drop are still good: they go first. */
    double deadline_ms = now_ms() + timeout_ms;
    for (;;) {
        long wait_ms = timeout_ms < 0 ? -1 : (long)(deadline_ms - now_ms());
        if ((timeout_ms >= 0 && wait_ms < 0) || client->lost)
            wait_ms = 0;
        int n = zmq_poll(items, 2, wait_ms);
        if (n < 0)
            return error_set(err, errno == EINTR ? ERR_CANCELLED : ERR_SYSTEM, "zmq_poll: %s",
                             zmq_strerror(zmq_errno()));
        if (items[0].revents & ZMQ_POLLIN)
            break;
        if (items[1].revents & ZMQ_POLLIN) {
            int rc = read_monitor(client, err);
            if (rc != 0)
                return rc;
            if (!client->lost)
                continue; /* a drop with nothing in flight: keep waiting */
        }
        if (client->lost && client->refusal) {
            client->lost = false;
            return refused(client, err);
        }
        if (client->lost) {
            client->lost = false;
            return error_set(err, ERR_UNAVAILABLE,
                             "lost the connection to the coordinator (it stopped or restarted): requests "
                             "sent before get no reply; the client reconnects by itself, send them again");
        }
        return error_set(err, ERR_TIMEOUT, "no reply from the coordinator within %d ms", timeout_ms);
    }
    zmq_msg_t msg;
    if (zmq_msg_init(&msg) != 0)
        return error_set(err, ERR_SYSTEM, "zmq_msg_init: %s", zmq_strerror(zmq_errno()));
    /* The reply is one frame; a stray delimiter frame (from a REQ-style
     * peer) is skipped. */
    cJSON *root = NULL;
    int more = 0;
    do {
        if (zmq_msg_recv(&msg, client->sock, 0) < 0) {
            zmq_msg_close(&msg);
            cJSON_Delete(root);
            return error_set(err, ERR_SYSTEM, "zmq_msg_recv: %s", zmq_strerror(zmq_errno()));
        }
        more = zmq_msg_more(&msg);
        if (root == NULL && zmq_msg_size(&msg) > 0)
            root = cJSON_ParseWithLength(zmq_msg_data(&msg), zmq_msg_size(&msg));
    } while (more);
    zmq_msg_close(&msg);
    if (!cJSON_IsObject(root) || !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(root, "type"))) {
        cJSON_Delete(root);
        return error_set(err, ERR_PROTOCOL, "reply is not a JSON object with a \"type\"");
    }
    const char *type = string_field(root, "type");
    if (strcmp(type, "token") == 0)
        ev->type = TANDEM_CLIENT_EVENT_TOKEN;
    else if (strcmp(type, "done") == 0)
        ev->type = TANDEM_CLIENT_EVENT_DONE;
    else if (strcmp(type, "error") == 0)
        ev->type = TANDEM_CLIENT_EVENT_ERROR;
    else if (strcmp(type, "stats") == 0)
        ev->type = TANDEM_CLIENT_EVENT_STATS;
    else
        ev->type = TANDEM_CLIENT_EVENT_OTHER;
    if (ev->type == TANDEM_CLIENT_EVENT_DONE || ev->type == TANDEM_CLIENT_EVENT_ERROR) {
        const int ended = finals_ended(client, root, ev->type == TANDEM_CLIENT_EVENT_ERROR);
        client->pending = client->pending > ended ? client->pending - ended : 0;
    } else if (ev->type == TANDEM_CLIENT_EVENT_STATS && client->pending > 0) {
        client->pending--;
    }
    ev->id = string_field(root, "id");
    ev->text = string_field(root, "text");
    ev->code = string_field(root, "code");
    ev->message = string_field(root, "message");
    ev->json = root;
    return 0;
}

void tandem_client_event_free(struct tandem_client_event *ev)
{
    if (ev == NULL)
        return;
    cJSON_Delete(ev->json);
    memset(ev, 0, sizeof(*ev));
}

int tandem_client_has_connected(struct tandem_client *client, bool *connected, char *err)
{
    int rc = read_monitor(client, err);
    *connected = client->handshaken;
    return rc;
}

int tandem_client_stats(struct tandem_client *client, int timeout_ms, cJSON **stats_out, char *err)
{
    *stats_out = NULL;
    static const char msg[] = "{\"v\":1,\"type\":\"stats\"}";
    int rc = tandem_client_send_raw(client, msg, sizeof(msg) - 1, err);
    if (rc != 0)
        return rc;
    for (;;) {
        struct tandem_client_event ev;
        rc = tandem_client_recv(client, timeout_ms, &ev, err);
        if (rc != 0)
            return rc;
        if (ev.type == TANDEM_CLIENT_EVENT_STATS) {
            *stats_out = ev.json;
            return 0;
        }
        if (ev.type == TANDEM_CLIENT_EVENT_ERROR && ev.id[0] == '\0') {
            rc = error_set(err, ERR_PROTOCOL, "stats: %s: %s", ev.code, ev.message);
            tandem_client_event_free(&ev);
            return rc;
        }
        tandem_client_event_free(&ev);
    }
}

int tandem_client_event_ids(const struct tandem_client_event *ev, int32_t **ids_out, int *n_out,
                            char *err)
{
    *ids_out = NULL;
    *n_out = 0;
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(ev->json, "ids");
    if (!cJSON_IsArray(ids))
        return error_set(err, ERR_PROTOCOL, "reply: \"ids\" is missing or not an array");
    int n = cJSON_GetArraySize(ids);
    int32_t *v = malloc(sizeof(*v) * (size_t)(n > 0 ? n : 1));
    if (v == NULL)
        return error_set(err, ERR_NOMEM, "ids: out of memory");
    int i = 0;
    const cJSON *e = NULL;
    cJSON_ArrayForEach(e, ids) {
        if (!cJSON_IsNumber(e)) {
            free(v);
            return error_set(err, ERR_PROTOCOL, "reply: ids[%d] is not a number", i);
        }
        v[i++] = (int32_t)e->valuedouble;
    }
    *ids_out = v;
    *n_out = n;
    return 0;
}
