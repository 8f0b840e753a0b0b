/* generation.h: POST /v1/chat/completions and /v1/completions end to end:
 * OpenAI validation (openai.c), the generate call to the coordinator
 * (bridge.c), and the answer: one JSON response, or Server-Sent Events
 * chunks ending with "data: [DONE]". A client that hangs up (seen when its
 * request is woken, or when a write fails) has its request cancelled at once.
 *
 * Never blocks: it runs on an event-loop thread that serves many
 * connections. While the coordinator has not answered, the connection is
 * parked (watch.h) and the step returns; the bridge's notification wakes it
 * and libmicrohttpd calls the access handler (or, mid-stream, the content
 * reader) again, which looks at the replies that came.
 */
#ifndef TANDEM_GATEWAY_GENERATION_H
#define TANDEM_GATEWAY_GENERATION_H

#include <stddef.h>

#include <microhttpd.h>

#include "openai.h"
#include "server.h"
#include "watch.h"

/* A completion request sent to the coordinator whose response is not queued yet. */
struct generation;

/* The completion request a connection carries, as generation_step reads
 * it: all borrowed for the call. */
struct generation_input {
    struct watch_conn *wc;  /* the connection's record (held while parked) */
    enum openai_kind kind;  /* which endpoint the body came to */
    const char *body;       /* [len], the whole request body */
    size_t len;
};

/* Advances the completion request of a connection whose body is complete.
 * The first call (*g NULL) validates in->body and sends the request; later
 * calls (after a wake) read the replies that came. *status: the HTTP status
 * queued, 0 while parked (MHD_YES, nothing queued: *g holds the request),
 * 499 when the client went away or the gateway stops (MHD_NO: libmicrohttpd
 * closes the connection; the request is cancelled). Once a status is set *g
 * is NULL. */
enum MHD_Result generation_step(struct generation **g, struct MHD_Connection *conn, const struct server_params *p,
                                const struct generation_input *in, int *status);
/* Cancels a request whose connection ended while it was parked (the gateway
 * stopping). NULL-safe. */
void generation_abort(struct generation *g, const struct server_params *p);

#endif
