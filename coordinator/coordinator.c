/* coordinator.c: the coordinator's lifetime: creation (sockets, tokenizer,
 * stale shared segments), the poll loop over the worker and client sockets,
 * and the timer. The work is done by the modules listed in coord_state.h.
 */
#include "coordinator.h"

#include "coord_core.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "coord_state.h"
#include "error.h"
#include "exposure.h"
#include "intake.h"
#include "lanes.h"
#include "logging.h"
#include "metrics_http.h"
#include "readiness.h"
#include "registry.h"
#include "replies.h"
#include "scheduler.h"

/* Heartbeats and liveness first: a lost target fails its requests before
 * the timeout check looks at them. */
static void on_tick(struct coordinator *c)
{
    registry_tick(c);
    lanes_tick(c);
    scheduler_tick(c);
    replies_retry_held(c, coord_now_ms());
    readiness_publish(c);
}

/* Removes /dev/shm/tandem-<instance>-<pid>-* segments whose pid is gone. */
static void remove_stale_segments(const char *instance)
{
    DIR *dir = opendir("/dev/shm");
    if (dir == NULL)
        return;
    char prefix[PROC_CONFIG_NAME_MAX + 16];
    snprintf(prefix, sizeof(prefix), "tandem-%s-", instance);
    size_t plen = strlen(prefix);
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
        if (strncmp(e->d_name, prefix, plen) != 0)
            continue;
        char *end = NULL;
        long pid = strtol(e->d_name + plen, &end, 10);
        if (end == e->d_name + plen || *end != '-' || pid <= 0)
            continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue;
        char name[300];
        snprintf(name, sizeof(name), "/%s", e->d_name);
        if (shm_unlink(name) == 0)
            LOG_INFO("removed stale shared segment %s (pid %ld is gone)", name, pid);
        else
            LOG_WARN("cannot remove stale shared segment %s: %s", name, strerror(errno));
    }
    closedir(dir);
}

static void unlink_ipc(const char *endpoint)
{
    if (strncmp(endpoint, "ipc://", 6) == 0 && unlink(endpoint + 6) != 0 && errno != ENOENT)
        LOG_WARN("cannot remove %s: %s", endpoint + 6, strerror(errno));
}

/* One ROUTER socket of the coordinator's: where it binds and how. */
struct router_bind {
    const char *endpoint;
    const char *key;  /* the config key of endpoint, for messages */
    int max_msg;      /* ZMQ_MAXMSGSIZE in bytes; 0: no limit */
    /* the endpoint's exposure (CURVE), applied before the bind so no
     * connection is ever accepted without it */
    int (*secure)(struct exposure *, void *, char *);
    /* NULL, or where to start the connection monitor, also before the bind
     * so that every connection is seen */
    struct connections **conns;
};

static int bind_router(struct coordinator *c, void **sock, const struct router_bind *b, char *err)
{
    const char *endpoint = b->endpoint, *key = b->key;
    *sock = zmq_socket(c->zctx, ZMQ_ROUTER);
    if (*sock == NULL)
        return error_set(err, ERR_SYSTEM, "zmq_socket(ROUTER): %s", zmq_strerror(zmq_errno()));
    int linger_ms = 0;
    int64_t max_bytes = b->max_msg;
    if (zmq_setsockopt(*sock, ZMQ_LINGER, &linger_ms, sizeof(linger_ms)) != 0 ||
        (max_bytes > 0 && zmq_setsockopt(*sock, ZMQ_MAXMSGSIZE, &max_bytes, sizeof(max_bytes)) != 0))
        return error_set(err, ERR_SYSTEM, "%s: zmq_setsockopt: %s", key, zmq_strerror(zmq_errno()));
    int rc = b->secure(c->exposure, *sock, err);
    if (rc == 0 && b->conns != NULL)
        rc = connections_create(b->conns, c->zctx, *sock, err);
    if (rc != 0)
        return rc;
    /* An address in use or not ours is a configuration error: a restart
     * would fail the same way, so it is not ERR_SYSTEM (exit 1, restarted). */
    if (zmq_bind(*sock, endpoint) != 0) {
        const int e = zmq_errno();
        return error_set(err, ERR_INVALID_ARG, "%s: cannot bind %s: %s%s", key, endpoint, zmq_strerror(e),
                         e == EADDRINUSE ? " (another process listens there: stop it or choose another port)"
                                                   : "");
    }
    return 0;
}

int coordinator_create(struct coordinator **out, const struct proc_config *cfg, char *err)
{
    *out = NULL;
    struct coordinator *c = NULL;
    int rc = coord_core_create(&c, cfg, err);
    if (rc != 0)
        return rc;
    const struct coordinator_config *cc = &c->cfg.coordinator;
    remove_stale_segments(c->cfg.instance);
    c->zctx = zmq_ctx_new();
    if (c->zctx == NULL) {
        rc = error_set(err, ERR_SYSTEM, "zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
        goto fail;
    }
    int hard_max = cc->max_message_bytes > INT32_MAX / COORD_HARD_MESSAGE_FACTOR
                       ? INT32_MAX
                       : cc->max_message_bytes * COORD_HARD_MESSAGE_FACTOR;
    /* The default worker socket lives in the instance's private directory. */
    if ((rc = proc_config_prepare_run_dir(&c->cfg, err)) != 0)
        goto fail;
    if ((rc = exposure_create(&c->exposure, c->zctx, cc, err)) != 0)
        goto fail;
    const struct router_bind clients = {.endpoint = cc->client_endpoint,
                                        .key = "coordinator.client_endpoint", .max_msg = hard_max,
                                        .secure = exposure_apply, .conns = &c->conns};
    if ((rc = bind_router(c, &c->clients, &clients, err)) != 0)
        goto fail;
    c->clients_bound = true;
    /* Replies to a vanished client fail (EHOSTUNREACH) instead of vanishing:
     * its requests are then cancelled (replies.c, scheduler_cancel_gone). */
    int mandatory = 1;
    if (zmq_setsockopt(c->clients, ZMQ_ROUTER_MANDATORY, &mandatory, sizeof(mandatory)) != 0) {
        rc = error_set(err, ERR_SYSTEM, "coordinator.client_endpoint: zmq_setsockopt(ZMQ_ROUTER_MANDATORY): %s",
                       zmq_strerror(zmq_errno()));
        goto fail;
    }
    const struct router_bind workers = {.endpoint = cc->worker_endpoint,
                                        .key = "coordinator.worker_endpoint",
                                        .secure = exposure_apply_workers};
    if ((rc = bind_router(c, &c->workers, &workers, err)) != 0)
        goto fail;
    c->workers_bound = true;
    lanes_open(c);
    *out = c;
    return 0;
fail:
    coordinator_destroy(c);
    return rc;
}

void coordinator_destroy(struct coordinator *c)
{
    if (c == NULL)
        return;
    readiness_withdraw(c);
    lanes_close(c);
    connections_destroy(c->conns);
    if (c->clients != NULL)
        zmq_close(c->clients);
    if (c->workers != NULL)
        zmq_close(c->workers);
    exposure_destroy(c->exposure);
    /* ZeroMQ leaves an ipc:// socket file behind; only a socket we bound is
     * ours to remove (a failed bind may mean another coordinator holds it). */
    if (c->clients_bound)
        unlink_ipc(c->cfg.coordinator.client_endpoint);
    if (c->workers_bound)
        unlink_ipc(c->cfg.coordinator.worker_endpoint);
    if (c->zctx != NULL)
        zmq_ctx_term(c->zctx);
    coord_core_destroy(c);
}

int coordinator_run(struct coordinator *c, volatile sig_atomic_t *stop, char *err)
{
    LOG_INFO("coordinator serving clients on %s, workers on %s", c->cfg.coordinator.client_endpoint,
             c->cfg.coordinator.worker_endpoint);
    int tick_ms = c->cfg.coordinator.heartbeat_ms / 2;
    if (tick_ms < 10)
        tick_ms = 10;
    double next_tick = coord_now_ms();
    struct metrics_http *mh = NULL;
    if (c->cfg.coordinator.metrics_listen[0] != '\0') {
        int rc = metrics_http_create(&mh, c->cfg.coordinator.metrics_listen, err);
        if (rc != 0)
            return rc;
        LOG_INFO("Prometheus text at http://%s/metrics", c->cfg.coordinator.metrics_listen);
    }
    while (!*stop) {
        void *zap = exposure_zap_socket(c->exposure);
        zmq_pollitem_t items[3 + LANES_POLL_MAX + METRICS_HTTP_POLL_MAX] = {
            {.socket = c->workers, .events = ZMQ_POLLIN},
            {.socket = c->clients, .events = ZMQ_POLLIN},
            {.socket = zap, .events = ZMQ_POLLIN},
        };
        const int n_zmq = zap ? 3 : 2;
        struct lanes_polled polled;
        const int n_lanes_end = n_zmq + lanes_poll_items(c, items + n_zmq, &polled);
        const int n_items = n_lanes_end + (mh != NULL ? metrics_http_poll_items(mh, items + n_lanes_end) : 0);
        double wait = next_tick - coord_now_ms();
        int n = zmq_poll(items, n_items, wait > 0 ? (long)wait : 0);
        if (n < 0) {
            if (zmq_errno() == EINTR)
                continue;
            metrics_http_destroy(mh);
            return error_set(err, ERR_SYSTEM, "zmq_poll: %s", zmq_strerror(zmq_errno()));
        }
        if (mh != NULL)
            metrics_http_on_poll(mh, items + n_lanes_end, n_items - n_lanes_end, coord_now_ms(), intake_prometheus, c);
        /* Workers first: their replies free slots and move rounds along.
         * Bounded batches keep one busy socket from starving the other. */
        for (int p = 0; p < c->n_pairs; p++)
            for (int r = 0; r < 2; r++)
                if (lanes_readable(c, items + n_zmq, &polled, p, (enum worker_role)r))
                    registry_on_lane(c, p, (enum worker_role)r);
        lanes_on_poll(c, items + n_zmq, &polled);
        for (int i = 0; i < 64 && (items[0].revents & ZMQ_POLLIN); i++) {
            registry_on_message(c);
            int ev = 0;
            size_t sz = sizeof(ev);
            if (zmq_getsockopt(c->workers, ZMQ_EVENTS, &ev, &sz) != 0 || !(ev & ZMQ_POLLIN))
                break;
        }
        for (int i = 0; i < 64 && (items[1].revents & ZMQ_POLLIN); i++) {
            intake_on_message(c);
            int ev = 0;
            size_t sz = sizeof(ev);
            if (zmq_getsockopt(c->clients, ZMQ_EVENTS, &ev, &sz) != 0 || !(ev & ZMQ_POLLIN))
                break;
        }
        /* Handshakes wait on these answers: serve them every pass. */
        for (int i = 0; zap && i < 64 && (items[2].revents & ZMQ_POLLIN); i++) {
            exposure_on_zap(c->exposure);
            int ev = 0;
            size_t sz = sizeof(ev);
            if (zmq_getsockopt(zap, ZMQ_EVENTS, &ev, &sz) != 0 || !(ev & ZMQ_POLLIN))
                break;
        }
        intake_watch_connections(c);
        if (c->n_gone > 0)
            scheduler_cancel_gone(c);
        if (coord_now_ms() >= next_tick) {
            on_tick(c);
            next_tick = coord_now_ms() + tick_ms;
        }
    }
    LOG_INFO("coordinator stopping");
    metrics_http_destroy(mh);
    return 0;
}
