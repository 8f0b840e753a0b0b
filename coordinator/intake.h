/* intake.h: client messages in: the envelope, generate requests (validation,
 * tokenization, the sequence record) and stats requests. */
#ifndef TANDEM_INTAKE_H
#define TANDEM_INTAKE_H

#include "coord_state.h"

/* Reads one client message (routing id + one frame) and answers it. */
void intake_on_message(struct coordinator *c);

/* Reads the client socket's connection events and cancels the requests of
 * connections that dropped (no reply: nobody is there to read it). Called
 * from the poll loop and before each client message is read, never from
 * inside a scheduler call. */
void intake_watch_connections(struct coordinator *c);

#endif
