/* http_reply.h: answering one libmicrohttpd connection: JSON bodies, OpenAI
 * error objects, plain text, and whether the client has hung up.
 * Called on the connection's own thread (thread-per-connection mode). */
#ifndef TANDEM_GATEWAY_HTTP_REPLY_H
#define TANDEM_GATEWAY_HTTP_REPLY_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "openai.h"

/* Queues body (consumed: deleted here) with status; NULL body = out of memory (500). */
enum MHD_Result http_reply_json(struct MHD_Connection *conn, int status, cJSON *body);
/* Queues e as {"error":{...}} with e->status (plus WWW-Authenticate on 401,
 * Allow on 405 when allow is not NULL). */
enum MHD_Result http_reply_error(struct MHD_Connection *conn, const struct openai_error *e, const char *allow);
/* Queues len bytes of text (copied) with content_type. */
enum MHD_Result http_reply_text(struct MHD_Connection *conn, int status, const char *content_type, const char *text,
                                size_t len);
/* True when the client closed its side of the connection (or it broke):
 * polled without waiting, so a blocked handler can notice a hang-up while
 * it waits for the coordinator. */
bool http_reply_client_gone(struct MHD_Connection *conn);

#endif
