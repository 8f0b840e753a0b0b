/* lanes.c: see lanes.h. */
#include "lanes.h"

#include <string.h>
#include <unistd.h>

#include "error.h"
#include "logging.h"

#define LANES_WHAT_LISTENER (-1)
#define LANES_WHAT_ROLE 100

void lanes_open(struct coordinator *c)
{
    c->lane_listening = false;
    c->lane_listen_fd = -1;
    c->n_lane_pending = 0;
    for (int p = 0; p < COORD_PAIRS_MAX; p++)
        for (int r = 0; r < 2; r++)
            c->pair[p].worker[r].lane_fd = -1;
    if (!c->cfg.coordinator.worker_lane)
        return;
    if (!lane_path_for(c->cfg.coordinator.worker_endpoint, c->lane_path, sizeof c->lane_path)) {
        LOG_INFO("worker lanes off: %s is not an ipc:// path of at most %d bytes",
                 c->cfg.coordinator.worker_endpoint, LANE_PATH_MAX - 5);
        return;
    }
    char err[ERR_MSG_MAX];
    if (lane_listen(c->lane_path, &c->lane_listen_fd, err) != 0) {
        LOG_WARN("worker lanes off: %s", err);
        return;
    }
    c->lane_listening = true;
}

void lanes_close_worker(struct worker *w)
{
    if (w->lane_sending && close(w->lane_fd) != 0)
        LOG_WARN("closing a worker lane failed");
    w->lane_sending = false;
    w->lane_reading = false;
    w->lane_fd = -1;
}

/* Takes waiting connection i off the list (the last one moves into its
 * place); returns its fd. */
static int take_pending(struct coordinator *c, int i)
{
    const int fd = c->lane_pending[i];
    c->n_lane_pending--;
    c->lane_pending[i] = c->lane_pending[c->n_lane_pending];
    c->lane_pending_ms[i] = c->lane_pending_ms[c->n_lane_pending];
    return fd;
}

static void drop_pending(struct coordinator *c, int i)
{
    close(take_pending(c, i));
}

void lanes_close(struct coordinator *c)
{
    for (int p = 0; p < c->n_pairs; p++)
        for (int r = 0; r < 2; r++)
            lanes_close_worker(&c->pair[p].worker[r]);
    while (c->n_lane_pending > 0)
        drop_pending(c, c->n_lane_pending - 1);
    if (c->lane_listening) {
        close(c->lane_listen_fd);
        unlink(c->lane_path);
        c->lane_listening = false;
    }
}

static void accept_waiting(struct coordinator *c)
{
    for (;;) {
        char err[ERR_MSG_MAX];
        int fd;
        int rc = lane_accept(c->lane_listen_fd, &fd, err);
        if (rc == ERR_TIMEOUT)
            return;
        if (rc != 0) {
            LOG_WARN("worker lane: %s", err);
            return;
        }
        if (c->n_lane_pending == COORD_LANE_PENDING) {
            /* the oldest goes: a worker retries with its next welcome */
            int oldest = 0;
            for (int i = 1; i < c->n_lane_pending; i++)
                if (c->lane_pending_ms[i] < c->lane_pending_ms[oldest])
                    oldest = i;
            drop_pending(c, oldest);
        }
        c->lane_pending[c->n_lane_pending] = fd;
        c->lane_pending_ms[c->n_lane_pending] = coord_now_ms();
        c->n_lane_pending++;
    }
}

/* The first datagram of a waiting connection: {"type":"lane","key":...}
 * with the key of a welcomed worker that has no lane yet. The lane takes
 * that worker's messages from the coordinator once the "lane" marker has
 * gone out before them on ZeroMQ (the worker reads the lane only after
 * it). */
static void on_hello(struct coordinator *c, int i)
{
    const int fd = c->lane_pending[i];
    char err[ERR_MSG_MAX];
    struct protocol_msg msg;
    int rc = lane_recv(fd, c->max_message_bytes, &msg, err);
    if (rc == ERR_TIMEOUT) {
        protocol_msg_free(&msg);
        return;
    }
    const char *key = NULL;
    struct worker *w = NULL;
    enum worker_role role = ROLE_DRAFT;
    if (rc == 0 && strcmp(msg.type, PROTOCOL_LANE) == 0 &&
        protocol_get_string(msg.header, "key", LANE_KEY_LEN, &key, err) == 0)
        for (int p = 0; p < c->n_pairs; p++)
            for (int r = 0; r < 2; r++) {
                struct worker *cand = &c->pair[p].worker[r];
                if (cand->up && !cand->lane_sending && cand->lane_key[0] != '\0' &&
                    strcmp(cand->lane_key, key) == 0) {
                    w = cand;
                    role = (enum worker_role)r;
                }
            }
    if (w == NULL) {
        LOG_WARN("worker lane connection closed: %s",
                 rc != 0 ? err : "its first message names no welcomed worker's key");
        protocol_msg_free(&msg);
        drop_pending(c, i);
        return;
    }
    protocol_msg_free(&msg);
    cJSON *marker = protocol_header_new(PROTOCOL_LANE);
    rc = marker == NULL ? error_set(err, ERR_NOMEM, "out of memory")
                        : lane_fit(fd, c->max_message_bytes, err);
    if (rc == 0)
        rc = protocol_send(c->workers, w->identity, w->identity_size, marker, NULL, 0,
                           PROTOCOL_DONTWAIT, err);
    cJSON_Delete(marker);
    if (rc != 0) {
        LOG_WARN("%s worker pid %d: lane not taken: %s", coord_role_name(role), w->pid, err);
        drop_pending(c, i);
        return;
    }
    w->lane_fd = take_pending(c, i);
    w->lane_sending = true;
    LOG_INFO("%s worker pid %d: its messages go on its lane", coord_role_name(role), w->pid);
}

int lanes_poll_items(struct coordinator *c, zmq_pollitem_t *items, struct lanes_polled *polled)
{
    polled->n = 0;
    if (c->lane_listening) {
        polled->fd[polled->n] = c->lane_listen_fd;
        polled->what[polled->n++] = LANES_WHAT_LISTENER;
    }
    for (int i = 0; i < c->n_lane_pending; i++) {
        polled->fd[polled->n] = c->lane_pending[i];
        polled->what[polled->n++] = i;
    }
    /* a lane is read only once its worker's marker came (lanes.h) */
    for (int p = 0; p < c->n_pairs; p++)
        for (int r = 0; r < 2; r++)
            if (c->pair[p].worker[r].lane_reading) {
                polled->fd[polled->n] = c->pair[p].worker[r].lane_fd;
                polled->what[polled->n++] = LANES_WHAT_ROLE + 2 * p + r;
            }
    for (int k = 0; k < polled->n; k++)
        items[k] = (zmq_pollitem_t){.socket = NULL, .fd = polled->fd[k], .events = ZMQ_POLLIN};
    return polled->n;
}

bool lanes_readable(const struct coordinator *c, const zmq_pollitem_t *items,
                    const struct lanes_polled *polled, int pair, enum worker_role role)
{
    const struct worker *w = &c->pair[pair].worker[role];
    for (int k = 0; k < polled->n; k++)
        if (polled->what[k] == LANES_WHAT_ROLE + 2 * pair + (int)role &&
            (items[k].revents & (ZMQ_POLLIN | ZMQ_POLLERR)))
            return w->lane_reading && w->lane_fd == polled->fd[k];
    return false;
}

void lanes_on_poll(struct coordinator *c, const zmq_pollitem_t *items,
                   const struct lanes_polled *polled)
{
    for (int k = polled->n - 1; k >= 0; k--) {
        const int what = polled->what[k];
        if (what < 0 || what >= LANES_WHAT_ROLE || !(items[k].revents & (ZMQ_POLLIN | ZMQ_POLLERR)))
            continue;
        /* from the last: drop_pending moves the last one into the gap */
        if (what < c->n_lane_pending && c->lane_pending[what] == polled->fd[k])
            on_hello(c, what);
    }
    if (c->lane_listening && polled->n > 0 && polled->what[0] == LANES_WHAT_LISTENER &&
        (items[0].revents & ZMQ_POLLIN))
        accept_waiting(c);
}

void lanes_tick(struct coordinator *c)
{
    const double now = coord_now_ms();
    for (int i = c->n_lane_pending - 1; i >= 0; i--)
        if (now - c->lane_pending_ms[i] > COORD_LANE_HELLO_MS) {
            LOG_WARN("worker lane connection closed: no key within %.0f ms", COORD_LANE_HELLO_MS);
            drop_pending(c, i);
        }
}
