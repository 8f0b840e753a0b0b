/* http_reply.h: answering one libmicrohttpd connection: JSON bodies, OpenAI
 * error objects, plain text, and whether the client has hung up.
 * Called from the connection's own libmicrohttpd callbacks (the event-loop
 * thread that owns it), which is where libmicrohttpd queues responses. */
#ifndef TANDEM_GATEWAY_HTTP_REPLY_H
#define TANDEM_GATEWAY_HTTP_REPLY_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "openai.h"

/* Retry-After of every 429 and 503, in seconds: the coordinator's queue and
 * the connection limits drain in about that. */
#define HTTP_REPLY_RETRY_AFTER_TEXT "1"

/* Queues body (consumed: deleted here) with status; NULL body = out of memory (500). */
enum MHD_Result http_reply_json(struct MHD_Connection *conn, int status, cJSON *body);
/* The same with one more header, hname: hvalue (none when hname is NULL). */
enum MHD_Result http_reply_json_header(struct MHD_Connection *conn, int status, cJSON *body, const char *hname,
                                       const char *hvalue);

/* The header that names the request fields the gateway accepted without
 * effect (openai_request.ignored), on a completion's 200 response. */
#define HTTP_REPLY_IGNORED_FIELDS_HEADER "Tandem-Ignored-Fields"
/* Queues e as {"error":{...}} with e->status (plus WWW-Authenticate on 401,
 * Allow on 405 when allow is not NULL). */
enum MHD_Result http_reply_error(struct MHD_Connection *conn, const struct openai_error *e, const char *allow);
/* Queues e like http_reply_error, with "Connection: close": libmicrohttpd
 * closes the connection once it is sent. For a request whose framing is in
 * doubt: whatever follows its headers cannot be trusted to be a request. */
enum MHD_Result http_reply_error_close(struct MHD_Connection *conn, const struct openai_error *e);
/* Queues len bytes of text (copied) with content_type. */
enum MHD_Result http_reply_text(struct MHD_Connection *conn, int status, const char *content_type, const char *text,
                                size_t len);
/* True when the client closed its side of the connection (or it broke):
 * polled without waiting, so a blocked handler can notice a hang-up while
 * it waits for the coordinator. */
bool http_reply_client_gone(struct MHD_Connection *conn);
/* Writes e as a whole response ("Connection: close") straight to the
 * connection's socket and ends the gateway's side of it (shutdown SHUT_WR).
 * For a refusal in the middle of a body, from the access handler, and for
 * a connection past the limits, from the connection notification (before
 * libmicrohttpd has read or written anything on it):
 * libmicrohttpd 0.9 queues a response only before a body or after all of it,
 * and an upload over the limit must be answered without reading the rest.
 * libmicrohttpd writes nothing while it reads a body, so the bytes cannot
 * mix; plain HTTP only (over HTTPS server.c answers through libmicrohttpd). The caller then discards what still
 * arrives for a moment (WATCH_CLOSING) rather than closing at once: a close
 * with unread bytes resets the connection, and the reset can reach the
 * client before it has read the answer. 0, or -1 when the socket did not
 * take all of it (the connection is then just closed). */
int http_reply_error_early(struct MHD_Connection *conn, const struct openai_error *e);
/* The same on a socket libmicrohttpd does not hold (front.h: a connection
 * refused before it is handed over): e as a whole response with
 * "Connection: close", then shutdown(SHUT_WR). 0, or -1 as above. */
int http_reply_error_to_socket(int fd, const struct openai_error *e);

#endif
