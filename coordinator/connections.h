/* connections.h: which client connection a request came from, and whether
 * that connection is still the one its routing id leads to.
 *
 * Why: the client ROUTER routes a reply by routing id, and a client may pick
 * its own. When a client drops, another may connect under the same id and
 * would receive the first one's remaining replies. A request is therefore
 * bound to its connection (the socket's file descriptor, ZMQ_SRCFD, and how
 * many connections that descriptor number has carried), and a socket monitor
 * on the ROUTER reports each connection accepted and dropped. libzmq reports
 * a drop before it frees the routing id, so a caller that reads the events
 * before each reply learns of the drop before a newcomer can hold the id.
 *
 * What it is not: a routing table. The ROUTER still routes; this only says
 * whether a connection is the one a request was bound to. Single-threaded,
 * like the coordinator.
 */
#ifndef TANDEM_CONNECTIONS_H
#define TANDEM_CONNECTIONS_H

#include <stdbool.h>
#include <stdint.h>

/* One connection: its descriptor (-1: unknown, e.g. inproc) and the count
 * of connections accepted on that descriptor number when it was seen. */
struct conn_ref {
    int fd;
    uint32_t gen;
};

struct connections;

/* Starts a monitor of router (accepted and dropped connections) in zctx.
 * Call it before router binds, so that no connection goes unseen.
 * ERR_SYSTEM naming the zmq call, ERR_NOMEM. */
int connections_create(struct connections **out, void *zctx, void *router, char *err);
/* Stops the monitor. NULL-safe. */
void connections_destroy(struct connections *cs);

/* Applies the events queued since the last call. Returns how many
 * connections dropped (callers then look for requests to cancel). */
int connections_update(struct connections *cs);

/* The connection of descriptor fd as known now (fd < 0: unknown). */
struct conn_ref connections_ref(const struct connections *cs, int fd);

/* False once ref's connection dropped (or its descriptor number carries a
 * newer one). An unknown connection (fd < 0) counts as open. */
bool connections_open(const struct connections *cs, struct conn_ref ref);

/* True when the last connections_update saw an event on fd: a message read
 * just before it may have come from either connection of that number. */
bool connections_changed(const struct connections *cs, int fd);

#endif
