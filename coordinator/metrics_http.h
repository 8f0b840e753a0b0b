/* metrics_http.h: GET /metrics on a small HTTP port of the coordinator's
 * own (coordinator.metrics_listen), so that an instance without a gateway
 * can be scraped by Prometheus.
 *
 * What it is: a listening socket and a few connections in the
 * coordinator's poll loop, non-blocking, each answered once (the
 * Prometheus text, or 404/405/431) and closed. What it is not: a web
 * server. No keep-alive, no TLS, no key: bind it where only the scraper
 * reaches (docs/operations.md). A connection that has not sent its head
 * within METRICS_HTTP_DEADLINE_MS, or not read its answer in that time, is
 * closed. Single-threaded: the poll loop's thread only.
 */
#ifndef TANDEM_METRICS_HTTP_H
#define TANDEM_METRICS_HTTP_H

#include <zmq.h>

/* Connections served at once; one more waits in the listen backlog. */
#define METRICS_HTTP_CONNS 4
/* The poll items it adds: the listening socket and its connections. */
#define METRICS_HTTP_POLL_MAX (1 + METRICS_HTTP_CONNS)
#define METRICS_HTTP_DEADLINE_MS 2000

struct metrics_http;

/* The Prometheus text of now (*text malloc'd, the caller's to free): 0 or
 * a negative error code with err set. */
typedef int (*metrics_http_render_fn)(void *cls, char **text, char *err);

/* Binds listen ("host:port"). ERR_INVALID_ARG for a bad address or one it
 * cannot bind (in use, not this host's), ERR_SYSTEM naming another failed
 * call, ERR_NOMEM. */
int metrics_http_create(struct metrics_http **out, const char *listen, char *err);
void metrics_http_destroy(struct metrics_http *h); /* NULL-safe */
/* Fills up to METRICS_HTTP_POLL_MAX items for the next poll; their count. */
int metrics_http_poll_items(const struct metrics_http *h, zmq_pollitem_t *items);
/* Serves what the poll found in items (as filled by poll_items, n of
 * them) and closes connections past their deadline; render makes the text
 * of each GET /metrics. */
void metrics_http_on_poll(struct metrics_http *h, const zmq_pollitem_t *items, int n, double now_ms,
                          metrics_http_render_fn render, void *cls);

#endif
