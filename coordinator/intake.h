/* intake.h: client messages in: the envelope, generate requests (validation,
 * tokenization, the sequence record) and stats requests. */
#ifndef TANDEM_INTAKE_H
#define TANDEM_INTAKE_H

#include "coord_state.h"

/* Reads one client message (routing id + one frame) and answers it. */
void intake_on_message(struct coordinator *c);

/* Answers one client message: payload (payload_bytes, not necessarily
 * terminated) from the client with this routing id on connection conn. A
 * generate request becomes a queued sequence or an error reply naming what
 * was wrong; stats and cancel are answered. Any payload is safe. */
void intake_dispatch(struct coordinator *c, const uint8_t *identity, size_t identity_size, struct conn_ref conn,
                     const char *payload, size_t payload_bytes);

/* Reads the client socket's connection events and cancels the requests of
 * connections that dropped (no reply: nobody is there to read it). Called
 * from the poll loop and before each client message is read, never from
 * inside a scheduler call. */
void intake_watch_connections(struct coordinator *c);

/* The Prometheus text a stats request carries (*text malloc'd: the caller
 * frees it), for the coordinator's own /metrics (metrics_http.h). 0 or
 * ERR_NOMEM. cls is the coordinator. */
int intake_prometheus(void *cls, char **text, char *err);

#endif
