/* connections.c: the client socket's monitor and the table of connections
 * by descriptor number (see connections.h).
 *
 * Invariants: slot[fd].gen counts the connections accepted on descriptor fd
 * (a closed descriptor number is reused by the kernel for the next one);
 * slot[fd].open is false from the drop of the connection until the next is
 * accepted. The monitor is drained on every pass of the poll loop and before
 * every reply, so it stays short.
 */
#include "connections.h"

#include <stdlib.h>
#include <zmq.h>

#include "error.h"
#include "logging.h"
#include "socket_monitor.h"

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
    struct socket_monitor *monitor; /* the ROUTER's accepts and drops */
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
    int rc = socket_monitor_open(&cs->monitor, zctx, router, CONNECTIONS_MONITOR_ENDPOINT,
                                 ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED, err);
    if (rc != 0) {
        free(cs);
        return rc;
    }
    *out = cs;
    return 0;
}

void connections_destroy(struct connections *cs)
{
    if (cs == NULL)
        return;
    socket_monitor_close(cs->monitor);
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
    char err[ERR_MSG_MAX];
    for (;;) {
        uint16_t event;
        uint32_t value;
        int got = socket_monitor_next(cs->monitor, &event, &value, err);
        if (got < 0)
            LOG_WARN("client socket monitor: %s", err);
        if (got <= 0)
            return dropped;
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
