/* socket_monitor.h: a ZeroMQ socket's connection events (accepted,
 * disconnected), read from the inproc PAIR that zmq_socket_monitor feeds.
 *
 * The coordinator, the workers, the gateway and the client library each need
 * to notice a dropped peer; this is the one place that knows the monitor's
 * wire format (two frames: event and value, then the endpoint) and the order
 * it must be stopped in (see socket_monitor_close).
 *
 * The monitor's pipe has no high-water mark: a lost event would be a drop
 * never noticed. Read it on every pass of the owner's poll loop so it stays
 * short.
 */
#ifndef TANDEM_SOCKET_MONITOR_H
#define TANDEM_SOCKET_MONITOR_H

#include <stdbool.h>
#include <stdint.h>

struct socket_monitor;

/* Starts monitoring sock for the ZMQ_EVENT_* bits in events. endpoint is the
 * inproc name, unique within zctx. On error, err names what failed and
 * nothing is left running. */
int socket_monitor_open(struct socket_monitor **out, void *zctx, void *sock, const char *endpoint, int events,
                        char *err);

/* The next queued event, without waiting: 1 with *event and *value (the
 * descriptor, for accepted and disconnected) set; 0 when none is queued;
 * ERR_SYSTEM (negative) when the monitor cannot be read, err set. */
int socket_monitor_next(struct socket_monitor *m, uint16_t *event, uint32_t *value, char *err);

/* Reads every queued event; *dropped tells whether one was a disconnect.
 * 0, or ERR_SYSTEM with err set (the events read until then still count). */
int socket_monitor_drain(struct socket_monitor *m, bool *dropped, char *err);

/* For zmq_poll: readable when an event is queued. */
void *socket_monitor_pollable(const struct socket_monitor *m);

/* Stops the monitor and closes it; call before closing the monitored socket.
 * NULL is a no-op. */
void socket_monitor_close(struct socket_monitor *m);

#endif
