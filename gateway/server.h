/* server.h: the gateway's HTTP server: libmicrohttpd as a few event loops
 * (epoll, a thread pool), the routes (docs/http.md), the optional API key,
 * the body size limit, the connection limits and the client's deadlines.
 *
 * No handler blocks: a request waiting for the coordinator suspends its
 * connection until a reply, a hang-up or its deadline wakes it (watch.h), so
 * a client that hangs up is noticed and its request cancelled, and
 * thousands of idle connections cost a socket each, not a thread.
 */
#ifndef TANDEM_GATEWAY_SERVER_H
#define TANDEM_GATEWAY_SERVER_H

#include <signal.h>

#include "bridge.h"
#include "http_metrics.h"
#include "proc_config.h"
#include "tls.h"

/* What every handler needs; borrowed: must outlive the server. */
struct server_params {
    const struct gateway_config *cfg;
    const char *api_key;          /* "" = no key required */
    struct bridge *bridge;
    struct http_metrics *metrics;
    long started_s;               /* Unix time the gateway started (/v1/models "created") */
    volatile sig_atomic_t *stop;  /* set when the gateway stops: waits end, requests are cancelled */
    const struct tls_files *tls;  /* HTTPS when tls->cert_pem is set; NULL = plain HTTP */
};

struct server;

/* libmicrohttpd's own connection limit, this many times max_connections:
 * connections past max_connections (or max_connections_per_ip) are still
 * accepted, to be answered 503 (429) and closed; past this many sockets
 * libmicrohttpd closes them at accept, as the last guard of the
 * descriptors. */
#define SERVER_ANSWERED_PAST_LIMIT 2
/* The sockets the gateway may hold at once (for the open-files limit). */
unsigned server_socket_limit(const struct gateway_config *cfg);

/* Binds cfg->listen and starts serving. ERR_INVALID_ARG (bad address),
 * ERR_SYSTEM (cannot bind, no thread), ERR_NOMEM. */
int server_start(struct server **out, const struct server_params *p, char *err);
/* Stops accepting; requests still parked end (those sent are cancelled at
 * the coordinator); waits for the event-loop threads. NULL-safe. */
void server_stop(struct server *s);

#endif
