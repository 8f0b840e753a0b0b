/* socket_monitor.c: see socket_monitor.h. */
#include "socket_monitor.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "error.h"
#include "logging.h"

/* How long closing waits for the monitor's last event. Bounded: a stop that
 * never arrives costs at most this, never a hang at shutdown. */
#define SOCKET_MONITOR_STOP_WAIT_MS 1000

struct socket_monitor {
    void *sock;              /* the monitored socket (not owned) */
    void *pair;              /* our end of the monitor's pipe */
};

int socket_monitor_open(struct socket_monitor **out, void *zctx, void *sock, const char *endpoint, int events,
                        char *err)
{
    *out = NULL;
    struct socket_monitor *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return error_set(err, ERR_NOMEM, "socket monitor: out of memory");
    /* MONITOR_STOPPED is what closing waits for (see socket_monitor_close). */
    if (zmq_socket_monitor(sock, endpoint, events | ZMQ_EVENT_MONITOR_STOPPED) != 0) {
        int rc = error_set(err, ERR_SYSTEM, "socket monitor %s: zmq_socket_monitor: %s", endpoint,
                           zmq_strerror(zmq_errno()));
        free(m);
        return rc;
    }
    m->sock = sock;
    int linger_ms = 0, unlimited = 0;
    if ((m->pair = zmq_socket(zctx, ZMQ_PAIR)) == NULL ||
        zmq_setsockopt(m->pair, ZMQ_LINGER, &linger_ms, sizeof(linger_ms)) != 0 ||
        zmq_setsockopt(m->pair, ZMQ_RCVHWM, &unlimited, sizeof(unlimited)) != 0 ||
        zmq_connect(m->pair, endpoint) != 0) {
        int rc = error_set(err, ERR_SYSTEM, "socket monitor %s: %s", endpoint, zmq_strerror(zmq_errno()));
        if (zmq_socket_monitor(sock, NULL, 0) != 0)
            LOG_WARN("socket monitor %s: stopping it: %s", endpoint, zmq_strerror(zmq_errno()));
        if (m->pair != NULL)
            zmq_close(m->pair);
        free(m);
        return rc;
    }
    *out = m;
    return 0;
}

/* Reads one event, waiting as the pair's ZMQ_RCVTIMEO says when flags is 0. */
static int read_event(struct socket_monitor *m, int flags, uint16_t *event, uint32_t *value)
{
    zmq_msg_t frame;
    if (zmq_msg_init(&frame) != 0)
        return -1;
    if (zmq_msg_recv(&frame, m->pair, flags) < 0) {
        int e = zmq_errno();
        zmq_msg_close(&frame);
        errno = e;
        return -1;
    }
    *event = 0;
    *value = 0;
    if (zmq_msg_size(&frame) >= sizeof(*event) + sizeof(*value)) {
        memcpy(event, zmq_msg_data(&frame), sizeof(*event));
        memcpy(value, (const char *)zmq_msg_data(&frame) + sizeof(*event), sizeof(*value));
    }
    /* The endpoint frame follows at once: ZeroMQ delivers a message whole. */
    while (zmq_msg_more(&frame) && zmq_msg_recv(&frame, m->pair, 0) >= 0)
        continue;
    zmq_msg_close(&frame);
    return 0;
}

int socket_monitor_next(struct socket_monitor *m, uint16_t *event, uint32_t *value, char *err)
{
    if (read_event(m, ZMQ_DONTWAIT, event, value) == 0)
        return 1;
    if (errno == EAGAIN)
        return 0;
    return error_set(err, ERR_SYSTEM, "socket monitor: zmq_msg_recv: %s", zmq_strerror(errno));
}

int socket_monitor_drain(struct socket_monitor *m, bool *dropped, char *err)
{
    *dropped = false;
    for (;;) {
        uint16_t event;
        uint32_t value;
        int got = socket_monitor_next(m, &event, &value, err);
        if (got <= 0)
            return got;
        *dropped = *dropped || event == ZMQ_EVENT_DISCONNECTED;
    }
}

bool socket_monitor_is_refusal(uint16_t event)
{
    return event == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL || event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL ||
           event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;
}

void socket_monitor_refusal_text(uint16_t event, uint32_t value, const char *peer, char *buf, size_t size)
{
    if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH && value == 400)
        snprintf(buf, size, "%s refused the connection: it does not admit this side's CURVE key (ZAP status "
                            "400; it admits only the public keys it lists)", peer);
    else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
        snprintf(buf, size, "%s refused the connection: CURVE authentication failed (ZAP status %u)", peer,
                 (unsigned)value);
    else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL && value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
        snprintf(buf, size, "%s refused the connection: one end uses CURVE and the other does not (with CURVE, "
                            "the connecting side needs the server's public key)", peer);
    else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL && value == ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC)
        snprintf(buf, size, "%s refused the connection: the CURVE handshake failed to decrypt (is its public "
                            "key the right one?)", peer);
    else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL)
        snprintf(buf, size, "%s refused the connection: the handshake broke ZeroMQ's protocol (error 0x%08x)",
                 peer, (unsigned)value);
    else
        snprintf(buf, size, "%s refused the connection: it closed it during the handshake (the security of the "
                            "two ends does not match: CURVE on one end only, or not its public key)", peer);
}

void *socket_monitor_pollable(const struct socket_monitor *m)
{
    return m->pair;
}

/* Closing our end while the monitored socket's I/O thread can still send to
 * it (a disconnect reported late) leaks that event's endpoint frame in
 * libzmq 4.3 (LeakSanitizer caught it in test_connections under load). So:
 * stop the monitor, read up to its last event, and only then close. */
void socket_monitor_close(struct socket_monitor *m)
{
    if (m == NULL)
        return;
    int wait_ms = SOCKET_MONITOR_STOP_WAIT_MS;
    if (zmq_socket_monitor(m->sock, NULL, 0) != 0)
        LOG_WARN("socket monitor: stopping it: %s", zmq_strerror(zmq_errno()));
    else if (zmq_setsockopt(m->pair, ZMQ_RCVTIMEO, &wait_ms, sizeof(wait_ms)) != 0)
        LOG_WARN("socket monitor: ZMQ_RCVTIMEO: %s", zmq_strerror(zmq_errno()));
    else
        for (;;) {
            uint16_t event;
            uint32_t value;
            if (read_event(m, 0, &event, &value) != 0) {
                LOG_WARN("socket monitor: no stop event within %d ms: %s", wait_ms, zmq_strerror(errno));
                break;
            }
            if (event == ZMQ_EVENT_MONITOR_STOPPED)
                break;
        }
    if (zmq_close(m->pair) != 0)
        LOG_WARN("socket monitor: zmq_close: %s", zmq_strerror(zmq_errno()));
    free(m);
}
