/* metrics_http.c: GET /metrics on the coordinator's own port (see
 * metrics_http.h).
 *
 * A connection goes: reading its head (in[]) -> writing its answer (out)
 * -> closed. Nothing here blocks: the sockets are non-blocking and every
 * read or write is one the poll said would not wait. */
#define _GNU_SOURCE
#include "metrics_http.h"

#include <errno.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "error.h"
#include "logging.h"
#include "proc_config.h"
#include "tcp_listen.h"

#define METRICS_HTTP_HEAD_MAX 4096

struct metrics_http_conn {
    int fd;                 /* -1: free */
    char in[METRICS_HTTP_HEAD_MAX];
    size_t in_len;
    char *out;              /* the whole answer once the head is in; NULL while reading */
    size_t out_len, out_off;
    double deadline_ms;
};

struct metrics_http {
    int listen_fd;
    struct metrics_http_conn conns[METRICS_HTTP_CONNS];
};

int metrics_http_create(struct metrics_http **out, const char *listen_addr, char *err)
{
    *out = NULL;
    struct sockaddr_in sa;
    char why[ERR_MSG_MAX];
    int rc = proc_config_listen_addr(listen_addr, &sa, why);
    if (rc != 0)
        return error_set(err, rc, "coordinator.metrics_listen: %s", why);
    struct metrics_http *h = calloc(1, sizeof *h);
    if (h == NULL)
        return error_set(err, ERR_NOMEM, "metrics_http: out of memory");
    for (int i = 0; i < METRICS_HTTP_CONNS; i++)
        h->conns[i].fd = -1;
    if ((rc = tcp_listen_open(&sa, METRICS_HTTP_CONNS, listen_addr, &h->listen_fd, why)) != 0) {
        rc = error_set(err, rc, "coordinator.metrics_listen: %s", why);
        metrics_http_destroy(h);
        return rc;
    }
    *out = h;
    return 0;
}

static void conn_close(struct metrics_http_conn *c)
{
    if (close(c->fd) != 0)
        LOG_WARN("metrics_http: close: %s", strerror(errno));
    free(c->out);
    c->out = NULL;
    c->fd = -1;
}

void metrics_http_destroy(struct metrics_http *h)
{
    if (h == NULL)
        return;
    for (int i = 0; i < METRICS_HTTP_CONNS; i++)
        if (h->conns[i].fd >= 0)
            conn_close(&h->conns[i]);
    if (h->listen_fd >= 0 && close(h->listen_fd) != 0)
        LOG_WARN("metrics_http: close: %s", strerror(errno));
    free(h);
}

int metrics_http_poll_items(const struct metrics_http *h, zmq_pollitem_t *items)
{
    int n = 0;
    items[n++] = (zmq_pollitem_t){.fd = h->listen_fd, .events = ZMQ_POLLIN};
    for (int i = 0; i < METRICS_HTTP_CONNS; i++)
        if (h->conns[i].fd >= 0)
            items[n++] = (zmq_pollitem_t){.fd = h->conns[i].fd,
                                          .events = h->conns[i].out != NULL ? ZMQ_POLLOUT : ZMQ_POLLIN};
    return n;
}

/* The whole answer: status line, headers, body (len bytes of body). */
static void conn_answer(struct metrics_http_conn *c, int status, const char *reason, const char *type,
                        const char *body, size_t len)
{
    char head[256];
    int n = snprintf(head, sizeof head,
                     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
                     status, reason, type, len);
    c->out = malloc((size_t)n + len);
    if (c->out == NULL) {
        LOG_WARN("metrics_http: out of memory for an answer");
        conn_close(c);
        return;
    }
    memcpy(c->out, head, (size_t)n);
    memcpy(c->out + n, body, len);
    c->out_len = (size_t)n + len;
    c->out_off = 0;
}

/* The head is in (or too large): answers it. */
static void conn_route(struct metrics_http_conn *c, bool too_large, metrics_http_render_fn render, void *cls)
{
    static const char text_type[] = "text/plain; charset=utf-8";
    if (too_large) {
        static const char m[] = "request head too large\n";
        conn_answer(c, 431, "Request Header Fields Too Large", text_type, m, sizeof m - 1);
        return;
    }
    const bool get = strncmp(c->in, "GET ", 4) == 0;
    const char *path = c->in + 4;
    size_t plen = strcspn(path, " ?\r\n");
    if (!get) {
        static const char m[] = "only GET /metrics is served here\n";
        conn_answer(c, 405, "Method Not Allowed", text_type, m, sizeof m - 1);
    } else if (plen != 8 || strncmp(path, "/metrics", 8) != 0) {
        static const char m[] = "not found: the Prometheus text is at /metrics\n";
        conn_answer(c, 404, "Not Found", text_type, m, sizeof m - 1);
    } else {
        char err[ERR_MSG_MAX], *text = NULL;
        if (render(cls, &text, err) != 0) {
            LOG_WARN("metrics_http: %s", err);
            static const char m[] = "the metrics could not be rendered\n";
            conn_answer(c, 500, "Internal Server Error", text_type, m, sizeof m - 1);
        } else {
            conn_answer(c, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", text, strlen(text));
        }
        free(text);
    }
}

static void conn_read(struct metrics_http_conn *c, metrics_http_render_fn render, void *cls)
{
    ssize_t n = recv(c->fd, c->in + c->in_len, sizeof c->in - 1 - c->in_len, 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    if (n <= 0) {
        conn_close(c);
        return;
    }
    c->in_len += (size_t)n;
    c->in[c->in_len] = '\0';
    if (strstr(c->in, "\r\n\r\n") != NULL || strstr(c->in, "\n\n") != NULL)
        conn_route(c, false, render, cls);
    else if (c->in_len == sizeof c->in - 1)
        conn_route(c, true, render, cls);
}

static void conn_write(struct metrics_http_conn *c)
{
    ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    if (n < 0) {
        conn_close(c);
        return;
    }
    c->out_off += (size_t)n;
    if (c->out_off == c->out_len)
        conn_close(c); /* the head was read whole: the close is a FIN, not a reset */
}

static void accept_one(struct metrics_http *h, double now_ms)
{
    int fd = accept4(h->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
            LOG_WARN("metrics_http: accept4: %s", strerror(errno));
        return;
    }
    for (int i = 0; i < METRICS_HTTP_CONNS; i++) {
        struct metrics_http_conn *c = &h->conns[i];
        if (c->fd < 0) {
            c->fd = fd;
            c->in_len = 0;
            c->deadline_ms = now_ms + METRICS_HTTP_DEADLINE_MS;
            return;
        }
    }
    if (close(fd) != 0) /* every slot busy: a scraper retries at its next interval */
        LOG_WARN("metrics_http: close: %s", strerror(errno));
}

void metrics_http_on_poll(struct metrics_http *h, const zmq_pollitem_t *items, int n, double now_ms,
                          metrics_http_render_fn render, void *cls)
{
    /* items[1..] are the open connections in slot order, as poll_items made them */
    for (int i = 0, k = 1; i < METRICS_HTTP_CONNS && k < n; i++) {
        struct metrics_http_conn *c = &h->conns[i];
        if (c->fd < 0 || items[k].fd != c->fd)
            continue;
        short ev = items[k++].revents;
        if ((ev & ZMQ_POLLERR) != 0)
            conn_close(c);
        else if ((ev & ZMQ_POLLOUT) != 0)
            conn_write(c);
        else if ((ev & ZMQ_POLLIN) != 0)
            conn_read(c, render, cls);
    }
    for (int i = 0; i < METRICS_HTTP_CONNS; i++)
        if (h->conns[i].fd >= 0 && now_ms >= h->conns[i].deadline_ms)
            conn_close(&h->conns[i]);
    if (n > 0 && (items[0].revents & ZMQ_POLLIN) != 0)
        accept_one(h, now_ms);
}
