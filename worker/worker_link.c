/* worker_link.c: the worker side of the coordinator connection (see
 * worker_link.h): register until welcomed, heartbeats, the liveness
 * countdown, the receive loop and the send policy.
 *
 * Invariants: last_register_ms/last_beat_ms are stamped before each attempt,
 * sent or not, so a failing socket is retried at the documented rates and
 * never in a busy loop; register_pending is true exactly when the last
 * register failed to send; send_failing starts true so the first send, which
 * may precede the connection, warns nobody. After a drop nothing about the
 * old coordinator's work is sent: the role drops it before the next
 * register, and ZMQ_IMMEDIATE discards what was queued for the dead
 * connection, so a new coordinator never reads a reply to a command it did
 * not send (its request numbers start again at 1 and could match).
 */
#include "worker_link.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "curve_keys.h"
#include "error.h"
#include "lane.h"
#include "logging.h"
#include "socket_monitor.h"

#define WORKER_LINK_MONITOR_ENDPOINT "inproc://tandem-worker-link-monitor"

struct worker_link {
    const struct worker_link_role *role;
    const struct worker_link_local *local; /* NULL: the socket (and the lane) */
    void *user;
    char *register_note;
    char endpoint[PROC_CONFIG_PATH_MAX];
    int heartbeat_ms;
    int timeout_ms; /* coordinator.worker_timeout_ms */
    size_t max_message_bytes;
    size_t max_zmq_message_bytes;
    void *zctx;
    void *sock;
    struct socket_monitor *monitor; /* the socket's connection drops */
    int n_drops;             /* connection drops so far: "drops" in register */
    double last_heard_ms;    /* last message from the coordinator */
    double last_beat_ms;     /* last heartbeat we sent */
    double last_register_ms; /* last register we sent */
    bool welcomed;
    bool register_pending;   /* the last register could not be sent: retry soon */
    bool send_failing;       /* sends fail (coordinator away): log once per streak */
    /* The lane (lane.h, docs/protocol-notes.md "Lanes"): NONE until a
     * welcome offers one; HELLO once connected with the key sent, still on
     * ZeroMQ both ways; ON from the coordinator's "lane" marker: read, and
     * every message but register goes on it. lane_lost: a send found it
     * closed, handled as a drop by the loop. */
    enum { LINK_LANE_NONE, LINK_LANE_HELLO, LINK_LANE_ON } lane;
    int lane_fd;
    bool lane_lost;
};

static void lane_close(struct worker_link *link)
{
    if (link->lane != LINK_LANE_NONE && close(link->lane_fd) != 0)
        LOG_WARN("closing the lane: %s", strerror(errno));
    link->lane = LINK_LANE_NONE;
    link->lane_fd = -1;
    link->lane_lost = false;
}

/* Sends on the lane when it is on, else (and always with zmq_only) on the
 * socket. */
static int link_send(struct worker_link *link, cJSON *header, const struct protocol_frame *frames,
                     int n_frames, bool zmq_only)
{
    char err[ERR_MSG_MAX];
    if (!header) {
        LOG_ERROR("out of memory building a message");
        return ERR_NOMEM;
    }
    int rc;
    if (link->local) {
        rc = link->local->send(link->local->user, header, frames, n_frames);
        if (rc != 0)
            (void)error_set(err, rc, "the in-process transport did not take it (%s)", error_name(rc));
    } else if (!zmq_only && link->lane == LINK_LANE_ON) {
        rc = lane_send(link->lane_fd, header, frames, n_frames, err);
        if (rc == ERR_CANCELLED)
            link->lane_lost = true;
    } else {
        rc = protocol_send(link->sock, NULL, 0, header, frames, n_frames, PROTOCOL_DONTWAIT, err);
    }
    if (rc != 0 && !link->send_failing) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(header, "type");
        LOG_WARN("cannot send %s to the coordinator (not connected?): %s",
                 cJSON_IsString(t) ? t->valuestring : "?", err);
    } else if (rc == 0 && link->send_failing) {
        LOG_INFO("connected to the coordinator");
    }
    link->send_failing = rc != 0;
    cJSON_Delete(header);
    return rc;
}

int worker_link_send(struct worker_link *link, cJSON *header, const struct protocol_frame *frames,
                     int n_frames)
{
    return link_send(link, header, frames, n_frames, false);
}

void worker_link_send_error(struct worker_link *link, const char *in_reply_to,
                            const struct worker_msg_seq *seq, int code, const char *message)
{
    struct worker_msg_seq unknown = {.req = -1, .slot = -1};
    if (!seq)
        seq = &unknown;
    LOG_WARN("%s req %lld slot %d: %s (%s)", in_reply_to, (long long)seq->req, seq->slot, message,
             error_name(code));
    worker_link_send(link, worker_msg_error_encode(seq, code, message, in_reply_to), NULL, 0);
}

/* "<boot id>:<dev>:<inode>" of /dev/shm: the same in two processes exactly
 * when a segment one creates there is one the other can open (one kernel,
 * one /dev/shm mount: not so across hosts, nor between containers with
 * /dev/shm mounts of their own). "" when it cannot be read: the coordinator
 * then assumes the memory is shared, as before the field existed. */
static void shm_domain(char *out, size_t size)
{
    out[0] = '\0';
    char boot[64] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (fgets(boot, sizeof boot, f) == NULL)
            boot[0] = '\0';
        if (fclose(f) != 0)
            boot[0] = '\0';
        boot[strcspn(boot, "\n")] = '\0';
    }
    struct stat st;
    if (boot[0] == '\0' || stat("/dev/shm", &st) != 0)
        return;
    snprintf(out, size, "%s:%llu:%llu", boot, (unsigned long long)st.st_dev, (unsigned long long)st.st_ino);
}

cJSON *worker_link_register_new(const char *role, const struct worker_link_facts *f, int pair)
{
    const struct model_config *mc = f->mc;
    struct worker_msg_register r = {
        .role = role, .pid = (int)getpid(), .model = f->model, .backend = f->backend,
        .vocab_size = mc->vocab_size, .max_seq_len = f->max_seq_len, .n_slots = f->n_slots,
        .bos_id = mc->bos_token_id, .kv_blocks = f->kv_blocks, .kv_block_size = f->kv_block_size,
        .cpu = *f->cpu, .pair = pair,
    };
    char domain[WORKER_MSG_SHM_DOMAIN_MAX];
    shm_domain(domain, sizeof domain);
    r.shm_domain = domain;
    for (int i = 0; i < mc->n_eos_token_ids && i < WORKER_MSG_EOS_MAX; i++)
        r.eos_ids[r.n_eos++] = mc->eos_token_ids[i];
    return worker_msg_register_encode(&r);
}

/* 0 or the send's code; the run loop reads the outcome from
 * register_pending instead, and retries on it. */
static int send_register(struct worker_link *link)
{
    cJSON *h = link->role->build_register(link->user);
    if (h && !cJSON_AddNumberToObject(h, "drops", link->n_drops)) {
        cJSON_Delete(h);
        h = NULL;
    }
    link->last_register_ms = protocol_now_ms();
    /* always on the socket: the coordinator learns the routing id from it */
    int rc = link_send(link, h, NULL, 0, true);
    link->register_pending = rc != 0;
    if (rc == 0)
        LOG_INFO("registered with %s (%s)", link->endpoint, link->register_note);
    return rc;
}

static void send_heartbeat(struct worker_link *link)
{
    cJSON *h = protocol_header_new(PROTOCOL_HEARTBEAT);
    if (h && !cJSON_AddStringToObject(h, "role", link->role->name)) {
        cJSON_Delete(h);
        h = NULL;
    }
    link->last_beat_ms = protocol_now_ms();
    worker_link_send(link, h, NULL, 0);
}

void worker_link_keepalive(struct worker_link *link)
{
    if (!link->local && protocol_now_ms() - link->last_beat_ms >= link->heartbeat_ms)
        send_heartbeat(link);
}

/* The connection or the lane to the coordinator dropped: forgets its work
 * and registers again (see the top of worker_link.h). */
static void coordinator_dropped(struct worker_link *link, const char *what)
{
    link->n_drops++;
    LOG_WARN("lost %s to the coordinator: dropping its work; registering again as soon as it is "
             "back",
             what);
    lane_close(link);
    if (link->role->on_coordinator_lost)
        link->role->on_coordinator_lost(link->user);
    link->welcomed = false;
    send_register(link);
}

/* A welcome's "lane" {path, key}: connect and send the key, unless a lane
 * is already there (a repeated welcome). Any failure leaves ZeroMQ alone. */
static void take_lane_offer(struct worker_link *link, const struct protocol_msg *m)
{
    const cJSON *offer = cJSON_GetObjectItemCaseSensitive(m->header, "lane");
    if (link->lane != LINK_LANE_NONE || !cJSON_IsObject(offer))
        return;
    char err[ERR_MSG_MAX];
    const char *path = NULL, *key = NULL;
    int rc = protocol_get_string(offer, "path", LANE_PATH_MAX, &path, err);
    if (rc == 0)
        rc = protocol_get_string(offer, "key", LANE_KEY_LEN, &key, err);
    int fd = -1;
    if (rc == 0)
        rc = lane_connect(path, &fd, err);
    if (rc == 0)
        rc = lane_fit(fd, link->max_message_bytes, err);
    cJSON *hello = rc == 0 ? protocol_header_new(PROTOCOL_LANE) : NULL;
    if (rc == 0 && (!hello || !cJSON_AddStringToObject(hello, "key", key)))
        rc = error_set(err, ERR_NOMEM, "out of memory");
    if (rc == 0)
        rc = lane_send(fd, hello, NULL, 0, err);
    cJSON_Delete(hello);
    if (rc != 0) {
        LOG_WARN("the coordinator's lane not taken (ZeroMQ only): %s", err);
        if (fd >= 0)
            close(fd);
        return;
    }
    link->lane_fd = fd;
    link->lane = LINK_LANE_HELLO;
}

/* The coordinator's "lane" marker: everything it sent before came on the
 * socket, everything after comes on the lane. Answered with our own marker
 * on the socket, after which we send on the lane. */
static void on_lane_marker(struct worker_link *link)
{
    if (link->lane != LINK_LANE_HELLO)
        return;
    char err[ERR_MSG_MAX];
    cJSON *marker = protocol_header_new(PROTOCOL_LANE);
    int rc = !marker || !cJSON_AddStringToObject(marker, "role", link->role->name)
                 ? error_set(err, ERR_NOMEM, "out of memory")
                 : protocol_send(link->sock, NULL, 0, marker, NULL, 0, PROTOCOL_DONTWAIT, err);
    cJSON_Delete(marker);
    /* the coordinator already sends on the lane: without the answer it
     * never reads ours, so a failure here is a drop */
    link->lane = LINK_LANE_ON;
    if (rc != 0) {
        LOG_WARN("lane: the answer to the coordinator's marker failed: %s", err);
        link->lane_lost = true;
        return;
    }
    LOG_INFO("on the coordinator's lane");
}

/* Reads the monitor's events; on a drop, forgets the coordinator's work
 * and registers again (see the top of worker_link.h). */
static void watch_connection(struct worker_link *link)
{
    bool dropped = false;
    char err[ERR_MSG_MAX];
    if (socket_monitor_drain(link->monitor, &dropped, err) != 0)
        LOG_WARN("coordinator socket monitor: %s", err);
    if (dropped)
        coordinator_dropped(link, "the connection");
}

/* Handles one well-formed message; returns 1 to stop serving (shutdown),
 * ERR_MISMATCH when refused, 0 otherwise. */
static int dispatch(struct worker_link *link, const struct protocol_msg *m, char *err)
{
    const char *type = m->type;
    if (strcmp(type, PROTOCOL_WELCOME) == 0) {
        if (!link->welcomed)
            LOG_INFO("welcomed by the coordinator");
        link->welcomed = true;
        take_lane_offer(link, m);
        if (link->role->on_welcome)
            link->role->on_welcome(link->user, m);
    } else if (strcmp(type, PROTOCOL_HEARTBEAT) == 0) {
        /* liveness only */
    } else if (strcmp(type, PROTOCOL_LANE) == 0) {
        on_lane_marker(link);
    } else if (strcmp(type, PROTOCOL_SHUTDOWN) == 0) {
        LOG_INFO("shutdown requested by the coordinator");
        return 1;
    } else if (strcmp(type, PROTOCOL_REFUSED) == 0) {
        const char *why = "no reason given";
        char ignore[ERR_MSG_MAX];
        protocol_get_string(m->header, "message", 400, &why, ignore);
        return error_set(err, ERR_MISMATCH, "refused by the coordinator: %s", why);
    } else {
        for (const struct worker_link_command *c = link->role->commands; c->type; c++)
            if (strcmp(type, c->type) == 0) {
                c->handle(link->user, m);
                return 0;
            }
        char msg[160];
        snprintf(msg, sizeof msg, "type: unknown message type \"%.64s\"", type);
        worker_link_send_error(link, type, NULL, ERR_PROTOCOL, msg);
    }
    return 0;
}

/* Receives and handles what is queued on the socket or (from_lane) the
 * lane; returns 1 to stop serving, a negative code to fail, 0 when there is
 * nothing more. A lane that ended or failed is marked lost. */
static int drain(struct worker_link *link, bool from_lane, volatile sig_atomic_t *stop, char *err)
{
    while (!*stop && (!from_lane || link->lane == LINK_LANE_ON)) {
        struct protocol_msg m;
        char merr[ERR_MSG_MAX];
        int rc = from_lane ? lane_recv(link->lane_fd, link->max_message_bytes, &m, merr)
                           : protocol_recv(link->sock, false, link->max_zmq_message_bytes,
                                           PROTOCOL_DONTWAIT, &m, merr);
        if (from_lane && rc != 0 && rc != ERR_TIMEOUT && rc != ERR_PROTOCOL) {
            LOG_WARN("%s", merr);
            protocol_msg_free(&m);
            link->lane_lost = true;
            return 0;
        }
        if (rc == ERR_TIMEOUT || rc == ERR_CANCELLED) {
            protocol_msg_free(&m);
            return 0;
        }
        link->last_heard_ms = protocol_now_ms();
        if (rc == ERR_PROTOCOL) {
            worker_link_send_error(link, m.type ? m.type : "?", NULL, rc, merr);
        } else if (rc != 0) {
            protocol_msg_free(&m);
            return error_set(err, rc, "receiving from the coordinator: %s", merr);
        } else {
            int hrc = dispatch(link, &m, err);
            if (hrc != 0) {
                protocol_msg_free(&m);
                return hrc;
            }
        }
        protocol_msg_free(&m);
    }
    return 0;
}

int worker_link_run(struct worker_link *link, volatile sig_atomic_t *stop, char *err)
{
    if (link->local)
        return error_set(err, ERR_INVALID_ARG, "%s worker link: an in-process link has no loop to run",
                         link->role->name);
    send_register(link);
    link->last_heard_ms = protocol_now_ms();
    send_heartbeat(link);
    long queued_wait_ms = -1;
    while (!*stop) {
        zmq_pollitem_t items[3] = {
            {.socket = link->sock, .events = ZMQ_POLLIN},
            {.socket = socket_monitor_pollable(link->monitor), .events = ZMQ_POLLIN},
            {.socket = NULL, .fd = link->lane_fd, .events = ZMQ_POLLIN},
        };
        const int n_items = link->lane == LINK_LANE_ON ? 3 : 2;
        double now = protocol_now_ms();
        long wait_ms = (long)(link->last_beat_ms + link->heartbeat_ms - now);
        if (link->register_pending && wait_ms > WORKER_LINK_REGISTER_RETRY_MS)
            wait_ms = WORKER_LINK_REGISTER_RETRY_MS;
        if (queued_wait_ms >= 0 && wait_ms > queued_wait_ms)
            wait_ms = queued_wait_ms;
        if (wait_ms < 0)
            wait_ms = 0;
        int n = zmq_poll(items, n_items, wait_ms);
        if (n < 0) {
            if (zmq_errno() == EINTR)
                continue;
            return error_set(err, ERR_SYSTEM, "zmq_poll: %s", zmq_strerror(zmq_errno()));
        }
        /* The socket before the drop: what it holds came from the old
         * coordinator (ZeroMQ delivers what arrived before a drop). Replies
         * to it either fail (no connection) or reach a new coordinator
         * before this worker's register, and it drops messages of a worker
         * it does not know. Then the drop empties the role and registers. */
        /* The socket first: the coordinator's marker comes there, before
         * anything on the lane. */
        if (items[0].revents & ZMQ_POLLIN) {
            int rc = drain(link, false, stop, err);
            if (rc != 0)
                return rc > 0 ? 0 : rc;
        }
        if (n_items == 3 && (items[2].revents & (ZMQ_POLLIN | ZMQ_POLLERR))) {
            int rc = drain(link, true, stop, err);
            if (rc != 0)
                return rc > 0 ? 0 : rc;
        }
        if (items[1].revents & ZMQ_POLLIN)
            watch_connection(link);
        if (link->lane_lost)
            coordinator_dropped(link, "the lane");
        if (link->role->run_queued)
            queued_wait_ms = link->role->run_queued(link->user);
        now = protocol_now_ms();
        if (now - link->last_beat_ms >= link->heartbeat_ms) {
            send_heartbeat(link);
            if (link->role->on_tick)
                link->role->on_tick(link->user);
        }
        if ((link->register_pending &&
             now - link->last_register_ms >= WORKER_LINK_REGISTER_RETRY_MS) ||
            (!link->welcomed && now - link->last_register_ms >= link->heartbeat_ms)) {
            send_register(link);
        } else if (now - link->last_heard_ms >= link->timeout_ms &&
                   now - link->last_register_ms >= link->timeout_ms) {
            LOG_WARN("no word from the coordinator for %.0f ms; registering again",
                     now - link->last_heard_ms);
            link->welcomed = false;
            send_register(link);
        }
    }
    return 0;
}

int worker_link_create(struct worker_link **out, const struct proc_config *cfg,
                       const struct worker_link_role *role, void *user, const char *register_note,
                       char *err)
{
    *out = NULL;
    const struct worker_config *wc;
    if (strcmp(role->name, "draft") == 0)
        wc = &cfg->draft_worker;
    else if (strcmp(role->name, "target") == 0)
        wc = &cfg->target_worker;
    else
        return error_set(err, ERR_INVALID_ARG, "worker role \"%s\": must be draft or target",
                         role->name);
    struct worker_link *link = calloc(1, sizeof *link);
    if (!link)
        return error_set(err, ERR_NOMEM, "worker link: out of memory");
    link->role = role;
    link->user = user;
    snprintf(link->endpoint, sizeof link->endpoint, "%s", wc->coordinator_endpoint);
    link->heartbeat_ms = wc->heartbeat_ms;
    link->timeout_ms = cfg->coordinator.worker_timeout_ms;
    /* The coordinator's commands carry a prompt or a whole history as a
     * frame of int32 ids: max_seq_len of them must pass whatever limit the
     * coordinator sets on its clients' messages (a prefill refused here
     * would leave its request waiting for request_timeout_ms). */
    const size_t tokens = wc->max_seq_len > 0 ? (size_t)wc->max_seq_len : (size_t)1 << 17;
    const size_t need = tokens * sizeof(int32_t) + 65536;
    link->max_message_bytes = (size_t)cfg->coordinator.max_message_bytes > need
                                  ? (size_t)cfg->coordinator.max_message_bytes
                                  : need;
    /* Over ZeroMQ a verify may also carry one of the draft's halves with
     * its q rows (a draft without shared memory: docs/scale-out.md), up to
     * SPECULATE_K_MAX + 2 rows of the vocabulary; a lane (local workers)
     * never does, and keeps its socket buffers to the smaller limit. */
    link->max_zmq_message_bytes = link->max_message_bytes > WORKER_LINK_HALF_MESSAGE_MAX
                                      ? link->max_message_bytes
                                      : WORKER_LINK_HALF_MESSAGE_MAX;
    link->send_failing = true; /* the first send may precede the connection: no warning */
    link->lane = LINK_LANE_NONE;
    link->lane_fd = -1;
    int rc;
    link->register_note = strdup(register_note ? register_note : "");
    if (!link->register_note) {
        rc = error_set(err, ERR_NOMEM, "worker link: out of memory");
        goto fail;
    }
    link->zctx = zmq_ctx_new();
    if (!link->zctx) {
        rc = error_set(err, ERR_SYSTEM, "zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
        goto fail;
    }
    char server_pub[CURVE_KEY_Z85_SIZE] = "", secret[CURVE_KEY_Z85_SIZE] = "", why[ERR_MSG_MAX];
    if (wc->coordinator_curve_public_key_file[0] != '\0') {
        if ((rc = curve_key_load(wc->coordinator_curve_public_key_file, false, server_pub, why)) ||
            (rc = curve_key_load(wc->curve_secret_key_file, true, secret, why))) {
            rc = error_set(err, rc, "%s worker: CURVE to the coordinator: %s", role->name, why);
            goto fail;
        }
    }
    rc = protocol_dealer_connect(link->zctx, link->endpoint, server_pub[0] ? server_pub : NULL,
                                 server_pub[0] ? secret : NULL, &link->sock, err);
    memset(secret, 0, sizeof secret);
    if (rc)
        goto fail;
    /* Started after the connect: a drop before the first connection is up
     * cannot happen, and the monitor only needs drops. */
    if ((rc = socket_monitor_open(&link->monitor, link->zctx, link->sock, WORKER_LINK_MONITOR_ENDPOINT,
                                  ZMQ_EVENT_DISCONNECTED, err)))
        goto fail;
    *out = link;
    return 0;
fail:
    worker_link_destroy(link);
    return rc;
}

int worker_link_create_local(struct worker_link **out, const struct worker_link_role *role, void *user,
                             const struct worker_link_local *local, char *err)
{
    *out = NULL;
    struct worker_link *link = calloc(1, sizeof *link);
    if (!link || !(link->register_note = strdup("in-process"))) {
        free(link);
        return error_set(err, ERR_NOMEM, "worker link: out of memory");
    }
    link->role = role;
    link->user = user;
    link->local = local;
    snprintf(link->endpoint, sizeof link->endpoint, "%s", "the in-process coordinator");
    link->lane = LINK_LANE_NONE;
    link->lane_fd = -1;
    *out = link;
    return 0;
}

int worker_link_announce(struct worker_link *link)
{
    return send_register(link);
}

int worker_link_deliver(struct worker_link *link, const struct protocol_msg *m, char *err)
{
    link->last_heard_ms = protocol_now_ms();
    return dispatch(link, m, err);
}

long worker_link_step(struct worker_link *link)
{
    return link->role->run_queued ? link->role->run_queued(link->user) : -1;
}

void worker_link_destroy(struct worker_link *link)
{
    if (!link)
        return;
    lane_close(link);
    socket_monitor_close(link->monitor);
    if (link->sock && zmq_close(link->sock) != 0)
        LOG_WARN("zmq_close: %s", zmq_strerror(zmq_errno()));
    if (link->zctx && zmq_ctx_term(link->zctx) != 0)
        LOG_WARN("zmq_ctx_term: %s", zmq_strerror(zmq_errno()));
    free(link->register_note);
    free(link);
}
