/* bridge.c: the DEALER socket thread and the table of open calls (see
 * bridge.h).
 *
 * Invariants: only the bridge thread touches the ZeroMQ socket. Outgoing
 * messages go through a mutex-guarded FIFO and an eventfd the thread polls
 * beside the socket; incoming replies are parsed on the bridge thread and
 * appended to their call's FIFO under the same mutex, which each call's
 * condition variable waits on. A reply for an id no call holds is dropped
 * (its call was closed: the HTTP client went away or timed out).
 *
 * Losing the coordinator: its requests die with it, so the calls that sent
 * something before the connection dropped would wait for replies that never
 * come (until request_timeout_ms, minutes). A socket monitor reports the
 * drop (ZMTP heartbeats turn a frozen coordinator or a dead path into one)
 * and each such call gets a "coordinator_unavailable" error reply at once.
 */
#include "bridge.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "curve_keys.h"
#include "error.h"
#include "logging.h"
#include "socket_monitor.h"

#define BRIDGE_ID_MAX 64
/* ZMTP heartbeats: the coordinator's I/O thread answers whatever its main
 * loop does, so only a frozen process or a dead path misses 5 s of them. */
#define BRIDGE_HEARTBEAT_IVL_MS 1000
#define BRIDGE_HEARTBEAT_TIMEOUT_MS 5000
#define BRIDGE_MONITOR_ENDPOINT "inproc://tandem-bridge-monitor"
/* A refused gateway connects again at most this often (see reconnect). */
#define BRIDGE_RECONNECT_MS 1000

struct reply_node {
    cJSON *msg;
    struct reply_node *next;
};

struct out_node {
    char *text;                  /* serialized message */
    char id[BRIDGE_ID_MAX];      /* call to tell when the send fails */
    struct out_node *next;
};

struct bridge_call {
    struct bridge *b;
    char id[BRIDGE_ID_MAX];
    pthread_cond_t cond;
    struct reply_node *head, *tail;  /* guarded by b->mu */
    bool sent;                       /* a message went out since the last drop; b->mu */
    void (*notify)(void *arg);       /* called under b->mu for each queued reply */
    void *notify_arg;
    struct bridge_call *next;        /* in b->calls */
};

struct bridge {
    void *zctx;
    void *sock;
    struct socket_monitor *monitor; /* sock's drops */
    int wake_fd;                 /* eventfd: outgoing messages or stop */
    pthread_t thread;
    bool thread_started;
    pthread_mutex_t mu;
    struct bridge_call *calls;   /* open calls */
    struct out_node *out_head, *out_tail;
    bool stop;
    uint64_t next_id;
    char refusal[ERR_MSG_MAX];   /* why the last handshake was refused, "" when none (bridge thread only) */
    char *endpoint;              /* to connect again after a refusal */
    pthread_cond_t link_cv;      /* under mu: connected or refused changed */
    bool cv_ready;
    bool connected;              /* under mu: a handshake succeeded and no drop since */
    bool refused;                /* under mu: the last handshake was refused */
    size_t max_message_bytes;    /* the coordinator's limit; larger messages are not sent */
    struct timespec reconnected; /* when the last one was asked for (bridge thread only) */
};

/* Condition variables here wait on the monotonic clock: a wall-clock step
 * must not cut a wait short or stretch it. */
static int monotonic_cond_init(pthread_cond_t *cv)
{
    pthread_condattr_t attr;
    if (pthread_condattr_init(&attr) != 0)
        return -1;
    int rc = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    if (rc == 0)
        rc = pthread_cond_init(cv, &attr);
    pthread_condattr_destroy(&attr);
    return rc;
}

static struct timespec monotonic_deadline(int timeout_ms)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    t.tv_sec += timeout_ms / 1000;
    t.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (t.tv_nsec >= 1000000000L) {
        t.tv_sec++;
        t.tv_nsec -= 1000000000L;
    }
    return t;
}

static void wake(struct bridge *b)
{
    uint64_t one = 1;
    ssize_t n = write(b->wake_fd, &one, sizeof(one));
    (void)n; /* a full counter already wakes the thread */
}

/* Under b->mu. */
static struct bridge_call *call_find(struct bridge *b, const char *id)
{
    for (struct bridge_call *c = b->calls; c != NULL; c = c->next)
        if (strcmp(c->id, id) == 0)
            return c;
    return NULL;
}

/* Takes ownership of msg; under b->mu. */
static void call_push(struct bridge_call *call, cJSON *msg)
{
    struct reply_node *n = malloc(sizeof(*n));
    if (n == NULL) {
        cJSON_Delete(msg);
        return;
    }
    n->msg = msg;
    n->next = NULL;
    if (call->tail != NULL)
        call->tail->next = n;
    else
        call->head = n;
    call->tail = n;
    pthread_cond_signal(&call->cond);
    if (call->notify != NULL)
        call->notify(call->notify_arg);
}

static void deliver(struct bridge *b, const char *id, cJSON *msg)
{
    pthread_mutex_lock(&b->mu);
    struct bridge_call *call = call_find(b, id);
    if (call != NULL)
        call_push(call, msg);
    else
        cJSON_Delete(msg);
    pthread_mutex_unlock(&b->mu);
}

static void deliver_unavailable(struct bridge *b, const char *id, const char *why)
{
    cJSON *m = cJSON_CreateObject();
    if (m == NULL || cJSON_AddStringToObject(m, "type", "error") == NULL || cJSON_AddStringToObject(m, "id", id) == NULL ||
        cJSON_AddStringToObject(m, "code", BRIDGE_UNAVAILABLE_CODE) == NULL ||
        cJSON_AddStringToObject(m, "message", why) == NULL) {
        cJSON_Delete(m);
        return;
    }
    deliver(b, id, m);
}

/* After a ZAP refusal or a protocol error libzmq does not try again, so a
 * coordinator that admits the gateway later would never hear from it: a
 * request refused asks for a new connection, at most every
 * BRIDGE_RECONNECT_MS; a later request finds its handshake's outcome. */
static void reconnect(struct bridge *b)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    double since_ms = (double)(now.tv_sec - b->reconnected.tv_sec) * 1e3 +
                      (double)(now.tv_nsec - b->reconnected.tv_nsec) / 1e6;
    if (b->reconnected.tv_sec != 0 && since_ms < BRIDGE_RECONNECT_MS)
        return;
    b->reconnected = now;
    /* ENOENT: libzmq already dropped the endpoint with its session */
    if ((zmq_disconnect(b->sock, b->endpoint) != 0 && zmq_errno() != ENOENT) ||
        zmq_connect(b->sock, b->endpoint) != 0)
        LOG_WARN("bridge: connecting again to %s: %s", b->endpoint, zmq_strerror(zmq_errno()));
}

static void flush_out(struct bridge *b)
{
    for (;;) {
        pthread_mutex_lock(&b->mu);
        struct out_node *n = b->out_head;
        if (n != NULL) {
            b->out_head = n->next;
            if (b->out_head == NULL)
                b->out_tail = NULL;
        }
        pthread_mutex_unlock(&b->mu);
        if (n == NULL)
            return;
        if (zmq_send(b->sock, n->text, strlen(n->text), ZMQ_DONTWAIT) < 0) {
            int e = zmq_errno();
            char why[ERR_MSG_MAX];
            if (e == EAGAIN && b->refusal[0] != '\0') {
                snprintf(why, sizeof(why), "%s", b->refusal);
                reconnect(b);
            } else
                snprintf(why, sizeof(why), "the coordinator is not reachable (zmq_send: %s)", zmq_strerror(e));
            LOG_WARN("to the coordinator: %s", why);
            deliver_unavailable(b, n->id, why);
        } else {
            pthread_mutex_lock(&b->mu);
            struct bridge_call *call = call_find(b, n->id);
            if (call != NULL)
                call->sent = true;
            pthread_mutex_unlock(&b->mu);
        }
        free(n->text);
        free(n);
    }
}

static void read_replies(struct bridge *b)
{
    for (;;) {
        zmq_msg_t part;
        zmq_msg_init(&part);
        if (zmq_msg_recv(&part, b->sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&part);
            return;
        }
        /* One JSON frame per reply; anything else is logged and dropped. */
        cJSON *root = NULL;
        if (zmq_msg_size(&part) > 0)
            root = cJSON_ParseWithLength(zmq_msg_data(&part), zmq_msg_size(&part));
        while (zmq_msg_more(&part)) {
            if (zmq_msg_recv(&part, b->sock, 0) < 0)
                break;
        }
        zmq_msg_close(&part);
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(root, "id");
        if (!cJSON_IsObject(root) || !cJSON_IsString(id)) {
            LOG_WARN("from the coordinator: a reply that is not a JSON object with a string id; dropped");
            cJSON_Delete(root);
            continue;
        }
        char key[BRIDGE_ID_MAX];
        snprintf(key, sizeof(key), "%s", id->valuestring);
        deliver(b, key, root);
    }
}

/* Reads the monitor's events: a refused handshake is kept (and logged when
 * its reason changes) until one succeeds; on a dropped connection, every
 * call that sent something before gets a coordinator_unavailable error
 * reply. */
static void read_monitor(struct bridge *b)
{
    bool dropped = false;
    char err[ERR_MSG_MAX];
    for (;;) {
        uint16_t event;
        uint32_t value;
        int got = socket_monitor_next(b->monitor, &event, &value, err);
        if (got < 0)
            LOG_WARN("bridge: connection monitor: %s", err);
        if (got <= 0)
            break;
        pthread_mutex_lock(&b->mu);
        if (event == ZMQ_EVENT_DISCONNECTED || event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED)
            b->connected = event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED;
        b->refused = socket_monitor_is_refusal(event);
        pthread_cond_broadcast(&b->link_cv);
        pthread_mutex_unlock(&b->mu);
        if (event == ZMQ_EVENT_DISCONNECTED) {
            dropped = true;
        } else if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
            if (b->refusal[0] != '\0')
                LOG_INFO("the coordinator accepted the connection");
            b->refusal[0] = '\0';
        } else if (socket_monitor_is_refusal(event)) {
            char why[ERR_MSG_MAX];
            socket_monitor_refusal_text(event, value, "the coordinator", why, sizeof why);
            /* tried again at each refused request (reconnect): one line per reason, not per try */
            if (strcmp(why, b->refusal) != 0)
                LOG_ERROR("%s", why);
            snprintf(b->refusal, sizeof b->refusal, "%s", why);
        }
    }
    if (!dropped)
        return;
    /* Replies that came before the drop were read first (bridge_main). */
    int n = 0;
    pthread_mutex_lock(&b->mu);
    for (struct bridge_call *c = b->calls; c != NULL; c = c->next) {
        if (!c->sent)
            continue;
        c->sent = false;
        cJSON *m = cJSON_CreateObject();
        if (m == NULL || cJSON_AddStringToObject(m, "type", "error") == NULL ||
            cJSON_AddStringToObject(m, "id", c->id) == NULL ||
            cJSON_AddStringToObject(m, "code", BRIDGE_UNAVAILABLE_CODE) == NULL ||
            cJSON_AddStringToObject(m, "message",
                                    "lost the connection to the coordinator (it stopped or restarted); "
                                    "the request is lost, send it again") == NULL) {
            cJSON_Delete(m);
            continue;
        }
        call_push(c, m);
        n++;
    }
    pthread_mutex_unlock(&b->mu);
    if (n > 0 || b->refusal[0] == '\0') /* a refused try carried no request */
        LOG_WARN("lost the connection to the coordinator: %d request(s) in flight failed with %s", n,
                 BRIDGE_UNAVAILABLE_CODE);
}

static void *bridge_main(void *arg)
{
    struct bridge *b = arg;
    for (;;) {
        zmq_pollitem_t items[3] = {
            {.socket = b->sock, .events = ZMQ_POLLIN},
            {.fd = b->wake_fd, .events = ZMQ_POLLIN},
            {.socket = socket_monitor_pollable(b->monitor), .events = ZMQ_POLLIN},
        };
        if (zmq_poll(items, 3, -1) < 0) {
            if (zmq_errno() == EINTR)
                continue;
            LOG_ERROR("bridge: zmq_poll: %s", zmq_strerror(zmq_errno()));
            return NULL;
        }
        if (items[1].revents & ZMQ_POLLIN) {
            uint64_t v;
            ssize_t n = read(b->wake_fd, &v, sizeof(v));
            (void)n;
        }
        pthread_mutex_lock(&b->mu);
        bool stop = b->stop;
        pthread_mutex_unlock(&b->mu);
        if (stop)
            return NULL;
        flush_out(b);
        if (items[0].revents & ZMQ_POLLIN)
            read_replies(b);
        if (items[2].revents & ZMQ_POLLIN)
            read_monitor(b);
    }
}

int bridge_create(struct bridge **out, const char *endpoint, const char *server_public, const char *client_secret,
                  size_t max_message_bytes, char *err)
{
    *out = NULL;
    struct bridge *b = calloc(1, sizeof(*b));
    if (b == NULL)
        return error_set(err, ERR_NOMEM, "bridge: out of memory");
    b->wake_fd = -1;
    b->max_message_bytes = max_message_bytes;
    int rc = 0;
    if (pthread_mutex_init(&b->mu, NULL) != 0) {
        free(b);
        return error_set(err, ERR_SYSTEM, "bridge: pthread_mutex_init failed");
    }
    if (monotonic_cond_init(&b->link_cv) != 0) {
        rc = error_set(err, ERR_SYSTEM, "bridge: pthread_cond_init failed");
        goto fail;
    }
    b->cv_ready = true;
    b->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (b->wake_fd < 0) {
        rc = error_set_errno(err, ERR_SYSTEM, errno, "bridge: eventfd");
        goto fail;
    }
    if ((b->zctx = zmq_ctx_new()) == NULL) {
        rc = error_set(err, ERR_SYSTEM, "zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
        goto fail;
    }
    if ((b->sock = zmq_socket(b->zctx, ZMQ_DEALER)) == NULL) {
        rc = error_set(err, ERR_SYSTEM, "zmq_socket(DEALER): %s", zmq_strerror(zmq_errno()));
        goto fail;
    }
    /* IMMEDIATE: no queueing for a coordinator that is not there, so a
     * request fails at once with 503 instead of waiting for a timeout. */
    int linger_ms = 0, immediate = 1, ivl_ms = BRIDGE_HEARTBEAT_IVL_MS, hb_ms = BRIDGE_HEARTBEAT_TIMEOUT_MS;
    if (zmq_setsockopt(b->sock, ZMQ_LINGER, &linger_ms, sizeof(linger_ms)) != 0 ||
        zmq_setsockopt(b->sock, ZMQ_IMMEDIATE, &immediate, sizeof(immediate)) != 0 ||
        zmq_setsockopt(b->sock, ZMQ_HEARTBEAT_IVL, &ivl_ms, sizeof(ivl_ms)) != 0 ||
        zmq_setsockopt(b->sock, ZMQ_HEARTBEAT_TIMEOUT, &hb_ms, sizeof(hb_ms)) != 0) {
        rc = error_set(err, ERR_SYSTEM, "zmq_setsockopt: %s", zmq_strerror(zmq_errno()));
        goto fail;
    }
    /* One context per bridge: the fixed inproc name cannot clash. */
    if ((rc = socket_monitor_open(&b->monitor, b->zctx, b->sock, BRIDGE_MONITOR_ENDPOINT,
                                  ZMQ_EVENT_DISCONNECTED | SOCKET_MONITOR_HANDSHAKE_EVENTS, err)))
        goto fail;
    if (server_public != NULL && (rc = curve_client_setup(b->sock, server_public, client_secret, err)))
        goto fail;
    if ((b->endpoint = strdup(endpoint)) == NULL) {
        rc = error_set(err, ERR_NOMEM, "bridge: out of memory");
        goto fail;
    }
    if (zmq_connect(b->sock, endpoint) != 0) {
        rc = error_set(err, ERR_INVALID_ARG, "coordinator endpoint %s: zmq_connect: %s", endpoint,
                       zmq_strerror(zmq_errno()));
        goto fail;
    }
    if (pthread_create(&b->thread, NULL, bridge_main, b) != 0) {
        rc = error_set(err, ERR_SYSTEM, "bridge: pthread_create failed");
        goto fail;
    }
    b->thread_started = true;
    *out = b;
    return 0;
fail:
    bridge_destroy(b);
    return rc;
}

void bridge_destroy(struct bridge *b)
{
    if (b == NULL)
        return;
    if (b->thread_started) {
        pthread_mutex_lock(&b->mu);
        b->stop = true;
        pthread_mutex_unlock(&b->mu);
        wake(b);
        pthread_join(b->thread, NULL);
    }
    while (b->out_head != NULL) {
        struct out_node *n = b->out_head;
        b->out_head = n->next;
        free(n->text);
        free(n);
    }
    socket_monitor_close(b->monitor);
    if (b->sock != NULL)
        zmq_close(b->sock);
    if (b->zctx != NULL)
        zmq_ctx_term(b->zctx);
    if (b->wake_fd >= 0)
        close(b->wake_fd);
    if (b->cv_ready)
        pthread_cond_destroy(&b->link_cv);
    pthread_mutex_destroy(&b->mu);
    free(b->endpoint);
    free(b);
}

bool bridge_wait_connected(struct bridge *b, int timeout_ms)
{
    const struct timespec until = monotonic_deadline(timeout_ms);
    pthread_mutex_lock(&b->mu);
    while (!b->connected && !b->refused)
        if (pthread_cond_timedwait(&b->link_cv, &b->mu, &until) != 0)
            break; /* ETIMEDOUT */
    bool connected = b->connected;
    pthread_mutex_unlock(&b->mu);
    return connected;
}

int bridge_call_open(struct bridge *b, const char *prefix, struct bridge_call **out, char *err)
{
    *out = NULL;
    struct bridge_call *call = calloc(1, sizeof(*call));
    if (call == NULL)
        return error_set(err, ERR_NOMEM, "bridge: out of memory");
    int rc = monotonic_cond_init(&call->cond);
    if (rc != 0) {
        free(call);
        return error_set(err, ERR_SYSTEM, "bridge: pthread_cond_init failed");
    }
    call->b = b;
    pthread_mutex_lock(&b->mu);
    snprintf(call->id, sizeof(call->id), "%.16s-%" PRIu64, prefix, ++b->next_id);
    call->next = b->calls;
    b->calls = call;
    pthread_mutex_unlock(&b->mu);
    *out = call;
    return 0;
}

void bridge_call_close(struct bridge_call *call)
{
    if (call == NULL)
        return;
    struct bridge *b = call->b;
    pthread_mutex_lock(&b->mu);
    for (struct bridge_call **pp = &b->calls; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == call) {
            *pp = call->next;
            break;
        }
    }
    pthread_mutex_unlock(&b->mu);
    while (call->head != NULL) {
        struct reply_node *n = call->head;
        call->head = n->next;
        cJSON_Delete(n->msg);
        free(n);
    }
    pthread_cond_destroy(&call->cond);
    free(call);
}

const char *bridge_call_id(const struct bridge_call *call)
{
    return call->id;
}

void bridge_call_set_notify(struct bridge_call *call, void (*fn)(void *arg), void *arg)
{
    pthread_mutex_lock(&call->b->mu);
    call->notify = fn;
    call->notify_arg = arg;
    pthread_mutex_unlock(&call->b->mu);
}

int bridge_call_send(struct bridge_call *call, cJSON *msg, char *err)
{
    struct bridge *b = call->b;
    cJSON_DeleteItemFromObjectCaseSensitive(msg, "id");
    if (cJSON_AddStringToObject(msg, "id", call->id) == NULL)
        return error_set(err, ERR_NOMEM, "bridge: out of memory");
    char *text = cJSON_PrintUnformatted(msg);
    if (text == NULL)
        return error_set(err, ERR_NOMEM, "bridge: out of memory");
    /* Measured as sent: a body can grow in translation (numbers are printed
     * again: 1e9 becomes 1000000000), so the HTTP body's size alone does not
     * tell whether the coordinator takes the message. */
    size_t size = strlen(text);
    if (b->max_message_bytes > 0 && size > b->max_message_bytes) {
        cJSON_free(text);
        return error_set(err, ERR_RANGE,
                         "the request becomes a coordinator message of %zu bytes, over its limit of %zu "
                         "(coordinator.max_message_bytes)",
                         size, b->max_message_bytes);
    }
    struct out_node *n = calloc(1, sizeof(*n));
    if (n == NULL) {
        cJSON_free(text);
        return error_set(err, ERR_NOMEM, "bridge: out of memory");
    }
    n->text = text;
    snprintf(n->id, sizeof(n->id), "%s", call->id);
    pthread_mutex_lock(&b->mu);
    if (b->out_tail != NULL)
        b->out_tail->next = n;
    else
        b->out_head = n;
    b->out_tail = n;
    pthread_mutex_unlock(&b->mu);
    wake(b);
    return 0;
}

int bridge_call_cancel(struct bridge_call *call, char *err)
{
    cJSON *m = cJSON_CreateObject();
    if (m == NULL || cJSON_AddNumberToObject(m, "v", 1) == NULL || cJSON_AddStringToObject(m, "type", "cancel") == NULL) {
        cJSON_Delete(m);
        return error_set(err, ERR_NOMEM, "bridge: out of memory");
    }
    int rc = bridge_call_send(call, m, err);
    cJSON_Delete(m);
    return rc;
}

int bridge_call_next(struct bridge_call *call, int timeout_ms, cJSON **reply, char *err)
{
    *reply = NULL;
    struct bridge *b = call->b;
    const struct timespec deadline = monotonic_deadline(timeout_ms);
    pthread_mutex_lock(&b->mu);
    while (call->head == NULL) {
        if (pthread_cond_timedwait(&call->cond, &b->mu, &deadline) == ETIMEDOUT && call->head == NULL) {
            pthread_mutex_unlock(&b->mu);
            return error_set(err, ERR_TIMEOUT, "no reply from the coordinator within %d ms", timeout_ms);
        }
    }
    struct reply_node *n = call->head;
    call->head = n->next;
    if (call->head == NULL)
        call->tail = NULL;
    pthread_mutex_unlock(&b->mu);
    *reply = n->msg;
    free(n);
    return 0;
}
