/* server.h: the gateway's HTTP server: libmicrohttpd in thread-per-connection
 * mode, the routes (docs/http.md), the optional API key, body size limit.
 *
 * Each connection has its own thread, which may block while it waits for
 * the coordinator (through the bridge) and polls its socket meanwhile, so a
 * client that hangs up is noticed and its request cancelled.
 */
#ifndef TANDEM_GATEWAY_SERVER_H
#define TANDEM_GATEWAY_SERVER_H

#include <signal.h>

#include "bridge.h"
#include "http_metrics.h"
#include "proc_config.h"

/* What every handler needs; borrowed: must outlive the server. */
struct server_params {
    const struct gateway_config *cfg;
    const char *api_key;          /* "" = no key required */
    struct bridge *bridge;
    struct http_metrics *metrics;
    long started_s;               /* Unix time the gateway started (/v1/models "created") */
    volatile sig_atomic_t *stop;  /* set when the gateway stops: waits end, requests are cancelled */
};

struct server;

/* Binds cfg->listen and starts serving. ERR_INVALID_ARG (bad address),
 * ERR_SYSTEM (cannot bind). */
int server_start(struct server **out, const struct server_params *p, char *err);
/* Stops accepting, waits for the connection threads. NULL-safe. */
void server_stop(struct server *s);

#endif
