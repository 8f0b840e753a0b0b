/* front.h: the gateway's own accept loop for plain HTTP, in front of
 * libmicrohttpd, so that a malformed request is answered with the
 * gateway's JSON and not with libmicrohttpd's HTML.
 *
 * One thread, one epoll: it accepts, counts the connection against the
 * limits (admit.h; a connection past them is answered 503/429 at once),
 * then peeks (MSG_PEEK: nothing is consumed) at what the client sends until
 * its first request head is complete, judges it (head_check.h) and either
 * answers it (an OpenAI error object, "Connection: close"; the request is
 * then read and dropped before the close, within WATCH_LINGER_MS, so the
 * close does not reset the answer) or hands the socket to libmicrohttpd
 * (MHD_add_connection), which reads the same bytes. A connection whose head
 * is not complete within header_timeout_ms is closed, as libmicrohttpd's
 * side does (watch.h).
 *
 * What it is not: a proxy. After the hand-over libmicrohttpd owns the
 * socket; a later request on a kept-alive connection, and a chunked body,
 * are parsed by libmicrohttpd alone (docs/http.md lists what it still
 * answers itself). Not used over HTTPS: the bytes are ciphertext until
 * libmicrohttpd's TLS session reads them.
 */
#ifndef TANDEM_GATEWAY_FRONT_H
#define TANDEM_GATEWAY_FRONT_H

#include <netinet/in.h>

#include <microhttpd.h>

#include "admit.h"
#include "http_metrics.h"

struct front_params {
    struct sockaddr_in addr;       /* where to listen */
    unsigned max_sockets;          /* held here and by libmicrohttpd together; past it closed at accept */
    int header_timeout_ms;         /* for the first head, from accept */
    struct admit *admit;           /* borrowed; counted here at accept, left by the server at close */
    struct http_metrics *metrics;  /* borrowed: the refused requests are counted */
};

struct front;

/* Binds and listens (so that "address in use" is known before anything
 * starts). ERR_SYSTEM with the call that failed, ERR_NOMEM. */
int front_create(struct front **out, const struct front_params *p, char *err);
/* Starts the thread; daemon (MHD_USE_NO_LISTEN_SOCKET) takes the
 * connections that pass. ERR_SYSTEM. */
int front_start(struct front *f, struct MHD_Daemon *daemon, char *err);
/* A socket handed over was closed by libmicrohttpd (its connection
 * notification): one fewer counted against max_sockets. Any thread. */
void front_handed_closed(struct front *f);
/* Stops the thread and closes every socket it holds; nothing is handed
 * over after it returns. Call before stopping the daemon. NULL-safe. */
void front_stop(struct front *f);
/* Frees f (after the daemon stopped: front_handed_closed may run until
 * then). NULL-safe. */
void front_destroy(struct front *f);

#endif
