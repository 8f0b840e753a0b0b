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
#include <stddef.h>
#include <stdint.h>

#include <zmq.h>

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

/* The events of a connecting side's handshakes: failed (the peer refused
 * this side: a CURVE key it does not admit, CURVE on one end only, a wrong
 * server key) and succeeded (any refusal is over). */
#define SOCKET_MONITOR_HANDSHAKE_EVENTS                                                            \
    (ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |                  \
     ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_SUCCEEDED)

/* true for the ZMQ_EVENT_HANDSHAKE_FAILED_* events. */
bool socket_monitor_is_refusal(uint16_t event);

/* What a user can act on, for a connecting side's failed handshake (event,
 * value): "<peer> refused the connection: <why>". A refusal other than
 * ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL is definite (ZAP said no, or the
 * protocol broke): retrying the same way fails again. */
void socket_monitor_refusal_text(uint16_t event, uint32_t value, const char *peer, char *buf, size_t size);

/* For zmq_poll: readable when an event is queued. */
void *socket_monitor_pollable(const struct socket_monitor *m);

/* Stops the monitor and closes it; call before closing the monitored socket.
 * NULL is a no-op. */
void socket_monitor_close(struct socket_monitor *m);

#endif
