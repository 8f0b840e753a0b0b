/* lanes.h: the coordinator's side of worker lanes (common/wire/lane.h): the
 * listening socket, connections waiting to show their key, and the lanes of
 * the registered workers in its poll loop. The handshake is in
 * docs/protocol-notes.md ("Lanes"); what a worker's lane carries is decided
 * by worker_send (out) and registry_on_lane (in).
 */
#ifndef TANDEM_COORD_LANES_H
#define TANDEM_COORD_LANES_H

#include <zmq.h>

#include "coord_state.h"

/* Poll items lanes adds at most: the listener, the waiting connections and
 * one lane per worker. */
#define LANES_POLL_MAX (1 + COORD_LANE_PENDING + 2 * COORD_PAIRS_MAX)

/* What lanes_poll_items put where, for lanes_on_poll. */
struct lanes_polled {
    int n;
    int fd[LANES_POLL_MAX];
    int what[LANES_POLL_MAX]; /* -1 listener, 0.. pending index, 100 + 2 * pair + role: a worker's lane */
};

/* Listens beside the worker endpoint when coordinator.worker_lane is on and
 * the endpoint is ipc://. A lane that cannot be had is logged and the
 * workers keep ZeroMQ alone: never an error. */
void lanes_open(struct coordinator *c);

/* Closes every lane and the listener, and removes its socket file. */
void lanes_close(struct coordinator *c);

/* Closes w's lane (if any) and clears its lane state; the welcome keeps
 * offering lane_key. */
void lanes_close_worker(struct worker *w);

/* Appends the lanes' items to items (room for LANES_POLL_MAX); returns how
 * many. */
int lanes_poll_items(struct coordinator *c, zmq_pollitem_t *items, struct lanes_polled *polled);

/* Whether the poll found messages (or an end) on the lane of this pair's
 * worker of this role, and that lane is still the one polled (handling another's
 * messages may have closed it). The caller reads them (registry_on_lane):
 * this module only carries bytes. */
bool lanes_readable(const struct coordinator *c, const zmq_pollitem_t *items,
                    const struct lanes_polled *polled, int pair, enum worker_role role);

/* Serves what the poll reported on the listener and the connections
 * waiting to show their key (items as lanes_poll_items filled them). */
void lanes_on_poll(struct coordinator *c, const zmq_pollitem_t *items,
                   const struct lanes_polled *polled);

/* Closes connections that did not show a key within COORD_LANE_HELLO_MS. */
void lanes_tick(struct coordinator *c);

#endif
