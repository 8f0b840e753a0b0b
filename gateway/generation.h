/* generation.h: POST /v1/chat/completions and /v1/completions end to end:
 * OpenAI validation (openai.c), the generate call to the coordinator
 * (bridge.c), and the answer: one JSON response, or Server-Sent Events
 * chunks ending with "data: [DONE]". A client that hangs up (seen while
 * waiting, or when a write fails) has its request cancelled at once.
 * Runs on the connection's thread. */
#ifndef TANDEM_GATEWAY_GENERATION_H
#define TANDEM_GATEWAY_GENERATION_H

#include <stddef.h>

#include <microhttpd.h>

#include "openai.h"
#include "server.h"

/* Handles one request whose body is complete; *status_out is the HTTP
 * status queued (0 when the connection was dropped). */
enum MHD_Result generation_handle(struct MHD_Connection *conn, const struct server_params *p, enum openai_kind kind,
                                  const char *body, size_t len, int *status_out);

#endif
