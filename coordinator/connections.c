/* connections.c: the client socket's monitor and the table of connections
 * by descriptor number (see connections.h).
 *
 * Invariants: slot[fd].gen counts the connections accepted on descriptor fd
 * (a closed descriptor number is reused by the kernel for the next one);
 * slot[fd].open is false from the drop of the connection until the next is
 * accepted. The monitor's pipe has no high-water mark (RCVHWM 0 on our end):
 * a lost event would be a drop never noticed. It is drained on every pass
 * of the poll loop and before every reply, so it stays short.
 */
#include "connections.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "error.h"
#include "logging.h"

/* Descriptor numbers past this are not tracked (they count as open): the
 * table grows to the highest descriptor seen, and a process has far fewer. */
#define CONNECTIONS_FD_MAX (1 << 20)
#define CONNECTIONS_MONITOR_ENDPOINT "inproc://tandem-coordinator-clients-monitor"

struct conn_slot {
    uint32_t gen;
    bool open;
    uint64_t touched;        /* the update that last saw an event on it */
};

struct connections {
    void *router;            /* the monitored client socket (not owned); NULL until monitoring works */
    void *monitor;           /* PAIR: the ROUTER's events */
    struct conn_slot *slot;  /* (n_slots), indexed by descriptor */
    int n_slots;
    uint64_t updates;
};

int connections_create(struct connections **out, void *zctx, void *router, char *err)
{
    *out = NULL;
    struct connections *cs = calloc(1, sizeof(*cs));
    if (cs == NULL)
        return error_set(err, ERR_NOMEM, "connections: out of memory");
    int linger_ms = 0, unlimited = 0;
    int events = ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_MONITOR_STOPPED;
    if (zmq_socket_monitor(router, CONNECTIONS_MONITOR_ENDPOINT, events) != 0 ||
        (cs->monitor = zmq_socket(zctx, ZMQ_PAIR)) == NULL ||
        zmq_setsockopt(cs->monitor, ZMQ_LINGER, &linger_ms, sizeof(linger_ms)) != 0 ||
        zmq_setsockopt(cs->monitor, ZMQ_RCVHWM, &unlimited, sizeof(unlimited)) != 0 ||
        zmq_connect(cs->monitor, CONNECTIONS_MONITOR_ENDPOINT) != 0) {
        int rc = error_set(err, ERR_SYSTEM, "client socket monitor (zmq_socket_monitor): %s",
                           zmq_strerror(zmq_errno()));
        connections_destroy(cs);
        return rc;
    }
    cs->router = router;
    *out = cs;
    return 0;
}

/* Stops the ROUTER's monitor and reads our end until the monitor's last
 * event. Closing our end while the ROUTER's I/O thread can still send to it
 * (a disconnect reported late) leaks that event's endpoint frame in libzmq
 * 4.3 (seen under load in test_connections); once MONITOR_STOPPED has
 * arrived nothing more is sent. The wait is bounded: a stop that never
 * arrives costs at most that long, never a hang at shutdown. */
static void monitor_stop_and_drain(struct connections *cs)
{
    if (cs->router == NULL)
        return;
    if (zmq_socket_monitor(cs->router, NULL, 0) != 0) {
        LOG_WARN("client socket monitor: stopping it: %s", zmq_strerror(zmq_errno()));
        return;
    }
    int wait_ms = 1000;
    if (zmq_setsockopt(cs->monitor, ZMQ_RCVTIMEO, &wait_ms, sizeof(wait_ms)) != 0) {
        LOG_WARN("client socket monitor: ZMQ_RCVTIMEO: %s", zmq_strerror(zmq_errno()));
        return;
    }
    for (;;) {
        zmq_msg_t frame;
        if (zmq_msg_init(&frame) != 0)
            return;
        if (zmq_msg_recv(&frame, cs->monitor, 0) < 0) {
            LOG_WARN("client socket monitor: no stop event at shutdown: %s", zmq_strerror(zmq_errno()));
            zmq_msg_close(&frame);
            return;
        }
        uint16_t event = 0;
        if (zmq_msg_size(&frame) >= sizeof(event))
            memcpy(&event, zmq_msg_data(&frame), sizeof(event));
        while (zmq_msg_more(&frame) && zmq_msg_recv(&frame, cs->monitor, 0) >= 0)
            continue;
        zmq_msg_close(&frame);
        if (event == ZMQ_EVENT_MONITOR_STOPPED)
            return;
    }
}

void connections_destroy(struct connections *cs)
{
    if (cs == NULL)
        return;
    if (cs->monitor != NULL) {
        monitor_stop_and_drain(cs);
        zmq_close(cs->monitor);
    }
    free(cs->slot);
    free(cs);
}

/* The slot of fd, grown on demand; NULL when fd is not tracked. */
static struct conn_slot *slot_of(struct connections *cs, int fd)
{
    if (fd < 0 || fd >= CONNECTIONS_FD_MAX)
        return NULL;
    if (fd >= cs->n_slots) {
        int n = cs->n_slots > 0 ? cs->n_slots : 64;
        while (n <= fd)
            n *= 2;
        struct conn_slot *grown = realloc(cs->slot, sizeof(*grown) * (size_t)n);
        if (grown == NULL) {
            LOG_ERROR("connections: out of memory for descriptor %d; its drops go unseen", fd);
            return NULL;
        }
        /* Never seen: open, generation 0 (connections accepted before the
         * monitor started, if any, are taken as they are). */
        for (int i = cs->n_slots; i < n; i++)
            grown[i] = (struct conn_slot){.gen = 0, .open = true, .touched = 0};
        cs->slot = grown;
        cs->n_slots = n;
    }
    return &cs->slot[fd];
}

int connections_update(struct connections *cs)
{
    cs->updates++;
    int dropped = 0;
    for (;;) {
        zmq_msg_t frame;
        if (zmq_msg_init(&frame) != 0)
            return dropped;
        if (zmq_msg_recv(&frame, cs->monitor, ZMQ_DONTWAIT) < 0) {
            if (zmq_errno() != EAGAIN)
                LOG_WARN("client socket monitor: zmq_msg_recv: %s", zmq_strerror(zmq_errno()));
            zmq_msg_close(&frame);
            return dropped;
        }
        /* Frame 1: event (16 bits) and value (32 bits: the descriptor for
         * these two events); frame 2, at once: the endpoint. */
        uint16_t event = 0;
        uint32_t value = 0;
        if (zmq_msg_size(&frame) >= sizeof(event) + sizeof(value)) {
            memcpy(&event, zmq_msg_data(&frame), sizeof(event));
            memcpy(&value, (const char *)zmq_msg_data(&frame) + sizeof(event), sizeof(value));
        }
        while (zmq_msg_more(&frame) && zmq_msg_recv(&frame, cs->monitor, 0) >= 0)
            continue;
        zmq_msg_close(&frame);
        struct conn_slot *s = slot_of(cs, (int)value);
        if (s == NULL)
            continue;
        s->touched = cs->updates;
        if (event == ZMQ_EVENT_ACCEPTED) {
            s->gen++;
            s->open = true;
        } else if (event == ZMQ_EVENT_DISCONNECTED) {
            s->open = false;
            dropped++;
        }
    }
}

struct conn_ref connections_ref(const struct connections *cs, int fd)
{
    if (fd < 0 || fd >= cs->n_slots)
        return (struct conn_ref){.fd = fd < CONNECTIONS_FD_MAX ? fd : -1, .gen = 0};
    return (struct conn_ref){.fd = fd, .gen = cs->slot[fd].gen};
}

bool connections_open(const struct connections *cs, struct conn_ref ref)
{
    if (ref.fd < 0)
        return true;
    if (ref.fd >= cs->n_slots)
        return ref.gen == 0; /* never an event on it: the first connection, open */
    return cs->slot[ref.fd].open && cs->slot[ref.fd].gen == ref.gen;
}

bool connections_changed(const struct connections *cs, int fd)
{
    return fd >= 0 && fd < cs->n_slots && cs->slot[fd].touched == cs->updates;
}
