/* local.c: see local.h.
 *
 * Invariants: every message crosses as a copy of what a socket would carry
 * (the header tree duplicated, not printed and parsed again: a tiny pair's
 * round spent a tenth of its time in that text; frames copied), checked and
 * decoded by the wire's own decoders; the queue is delivered strictly in the
 * order things were sent, as one ZeroMQ connection per worker would; a
 * role steps only when nothing is queued, so each forward call takes every
 * command the scheduler had to give.
 */
#include "local.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coord_core.h"
#include "draft_worker.h"
#include "error.h"
#include "intake.h"
#include "logging.h"
#include "registry.h"
#include "scheduler.h"
#include "target_worker.h"
#include "worker_link.h"

/* Where a queued message goes: a role (enum worker_role) or the coordinator. */
#define LOCAL_TO_COORDINATOR 2
#define LOCAL_CLIENT "local"

/* The routing ids the roles register with: the registry and the hooks
 * know the two apart by them alone, as on a ROUTER socket. */
static const char *const role_identity[2] = {"local-draft", "local-target"};

struct local_msg {
    int to;
    struct protocol_msg msg;
};

struct local_role {
    struct local *l;
    int role;
    void *worker;                    /* draft_worker / target_worker; NULL: not present */
    struct worker_link *link;        /* the worker's */
    struct worker_link_local to_coordinator;
};

struct local {
    struct coordinator *c;
    struct coord_local hooks;
    struct local_role role[2];
    struct local_msg *q;             /* FIFO: q[head .. head + n) */
    int head, n, cap;
    int queue_rc;                    /* the first message that could not be queued */
    /* the request in flight */
    local_reply_fn on_reply;
    void *user;
    bool finished, cancelled;
};

static int queue_room(struct local *l)
{
    if (l->head + l->n < l->cap)
        return 0;
    if (l->head > 0) {
        memmove(l->q, l->q + l->head, (size_t)l->n * sizeof *l->q);
        l->head = 0;
        if (l->n < l->cap)
            return 0;
    }
    int cap = l->cap ? 2 * l->cap : 16;
    struct local_msg *q = realloc(l->q, (size_t)cap * sizeof *q);
    if (!q)
        return ERR_NOMEM;
    l->q = q;
    l->cap = cap;
    return 0;
}

/* frames into m as protocol_recv leaves them: malloc'd copies. */
static int copy_frames(struct protocol_msg *m, const struct protocol_frame *frames, int n_frames)
{
    if (n_frames > PROTOCOL_MAX_FRAMES)
        return ERR_PROTOCOL;
    for (int i = 0; i < n_frames; i++) {
        m->frame_data[i] = malloc(frames[i].size_bytes > 0 ? frames[i].size_bytes : 1);
        if (!m->frame_data[i])
            return ERR_NOMEM;
        memcpy(m->frame_data[i], frames[i].data, frames[i].size_bytes);
        m->frame_size_bytes[i] = frames[i].size_bytes;
        m->n_frames = i + 1;
        m->total_bytes += frames[i].size_bytes;
    }
    return 0;
}

/* Queues a copy of (hdr, frames) for `to`, from the sender with this
 * routing id (the coordinator reads it; a role ignores it). */
static int queue_push(struct local *l, int to, const char *from, const cJSON *hdr,
                      const struct protocol_frame *frames, int n_frames)
{
    char err[ERR_MSG_MAX];
    int rc = queue_room(l);
    if (rc)
        return rc;
    struct local_msg *e = &l->q[l->head + l->n];
    memset(e, 0, sizeof *e);
    e->to = to;
    rc = protocol_msg_adopt_header(&e->msg, cJSON_Duplicate(hdr, true), err);
    if (!rc)
        rc = copy_frames(&e->msg, frames, n_frames);
    if (rc) {
        LOG_ERROR("in-process message not queued: %s", rc == ERR_PROTOCOL ? err : error_name(rc));
        protocol_msg_free(&e->msg);
        return rc;
    }
    e->msg.identity_size = strlen(from);
    memcpy(e->msg.identity, from, e->msg.identity_size);
    l->n++;
    return 0;
}

/* coord_local.send: a command, routed by the identity the role registered with. */
static int coord_send(void *user, const uint8_t *identity, size_t identity_size, const cJSON *hdr,
                      const struct protocol_frame *frames, int n_frames)
{
    struct local *l = user;
    for (int r = 0; r < 2; r++)
        if (l->role[r].worker && identity_size == strlen(role_identity[r]) &&
            memcmp(identity, role_identity[r], identity_size) == 0)
            return queue_push(l, r, "", hdr, frames, n_frames);
    return ERR_NOT_FOUND;
}

/* coord_local.reply: handed on at once; the request ends with done or error. */
static int coord_reply(void *user, const uint8_t *identity, size_t identity_size, const cJSON *msg)
{
    struct local *l = user;
    (void)identity, (void)identity_size;
    const char *type = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(msg, "type"));
    if (type && (strcmp(type, "done") == 0 || strcmp(type, "error") == 0))
        l->finished = true;
    if (l->on_reply && l->on_reply(l->user, msg) != 0)
        l->cancelled = true;
    return 0;
}

/* worker_link_local.send of either role: to the coordinator, from its identity. */
static int role_send(void *user, const cJSON *header, const struct protocol_frame *frames, int n_frames)
{
    struct local_role *lr = user;
    int rc = queue_push(lr->l, LOCAL_TO_COORDINATOR, role_identity[lr->role], header, frames, n_frames);
    if (rc && !lr->l->queue_rc)
        lr->l->queue_rc = rc;
    return rc;
}

/* Delivers what is queued, in order, including what delivering queues.
 * 0, or why it cannot go on: a role shut down or refused, a message lost. */
static int pump(struct local *l, char *err)
{
    int rc = 0;
    while (!rc && l->n > 0) {
        struct local_msg e = l->q[l->head++];
        l->n--;
        if (e.to == LOCAL_TO_COORDINATOR) {
            registry_dispatch(l->c, &e.msg);
        } else if ((rc = worker_link_deliver(l->role[e.to].link, &e.msg, err)) == 1) {
            rc = error_set(err, ERR_UNAVAILABLE, "the in-process %s worker was shut down",
                           coord_role_name((enum worker_role)e.to));
        }
        protocol_msg_free(&e.msg);
    }
    if (!rc && l->queue_rc)
        rc = error_set(err, l->queue_rc, "in-process transport: a message was lost (%s)", error_name(l->queue_rc));
    return rc;
}

/* One step of each role's queued work; whether any role has work left. */
static bool step_roles(struct local *l)
{
    bool busy = false;
    for (int r = 0; r < 2; r++)
        if (l->role[r].worker && worker_link_step(l->role[r].link) >= 0)
            busy = true;
    return busy;
}

static int role_create(struct local *l, int r, const struct proc_config *cfg, const struct worker_main_model *m,
                       char *err)
{
    struct local_role *lr = &l->role[r];
    lr->l = l;
    lr->role = r;
    lr->to_coordinator = (struct worker_link_local){.send = role_send, .user = lr};
    int rc = r == ROLE_DRAFT ? draft_worker_create_local(&lr->worker, cfg, m, &lr->to_coordinator, err)
                             : target_worker_create_local(&lr->worker, cfg, m, &lr->to_coordinator, err);
    if (rc)
        return rc;
    lr->link = r == ROLE_DRAFT ? draft_worker_link(lr->worker) : target_worker_link(lr->worker);
    if ((rc = worker_link_announce(lr->link)))
        return error_set(err, rc, "in-process %s worker: its register was not queued",
                         coord_role_name((enum worker_role)r));
    return 0;
}

/* The target, then its draft, registered through the registry's own path. */
static int register_roles(struct local *l, const struct local_params *p, const struct proc_config *cfg,
                          char *err)
{
    int rc = role_create(l, ROLE_TARGET, cfg, p->target, err);
    if (!rc && p->draft)
        rc = role_create(l, ROLE_DRAFT, cfg, p->draft, err);
    if (!rc)
        rc = pump(l, err);
    if (rc)
        return rc;
    const struct pair *pair = &l->c->pair[0];
    if (!pair->worker[ROLE_TARGET].up)
        return error_set(err, ERR_INTERNAL, "in-process target worker: not registered");
    if (p->draft && !pair->worker[ROLE_DRAFT].up)
        return error_set(err, ERR_MISMATCH, "in-process draft worker: refused by the registry (see the log)");
    return 0;
}

/* What one process changes in the settings the three would read: one
 * pair; an instance of its own; the draft's buffer in POSIX memory, which
 * the process maps twice (CUDA IPC cannot open a handle in the process that
 * made it); "auto" samplers resolved as proc_config_finalize would. */
static void in_process_settings(struct proc_config *cfg, const struct local_params *p)
{
    cfg->n_pairs = 1;
    /* one per pipeline: a process may hold several (tests, benchmarks) */
    static atomic_int made;
    snprintf(cfg->instance, sizeof cfg->instance, "local%ld-%d", (long)getpid(), atomic_fetch_add(&made, 1));
    snprintf(cfg->draft_worker.shm_transport, sizeof cfg->draft_worker.shm_transport, "posix");
    struct worker_config *wc[2] = {&cfg->draft_worker, &cfg->target_worker};
    const struct worker_main_model *m[2] = {p->draft, p->target};
    for (int r = 0; r < 2; r++) {
        if (m[r])
            snprintf(wc[r]->backend, sizeof wc[r]->backend, "%s", m[r]->be->name);
        if (strcmp(wc[r]->sampler, "auto") == 0)
            snprintf(wc[r]->sampler, sizeof wc[r]->sampler, "%s",
                     strcmp(wc[r]->backend, "cuda") == 0 ? "device" : "host");
    }
}

int local_create(struct local **out, const struct local_params *p, char *err)
{
    *out = NULL;
    struct local *l = calloc(1, sizeof *l);
    struct proc_config *cfg = malloc(sizeof *cfg);
    if (!l || !cfg) {
        free(l);
        free(cfg);
        return error_set(err, ERR_NOMEM, "in-process pipeline: out of memory");
    }
    *cfg = *p->cfg;
    in_process_settings(cfg, p);
    l->hooks = (struct coord_local){.send = coord_send, .reply = coord_reply, .user = l};
    int rc = coord_core_create(&l->c, cfg, err);
    if (!rc) {
        l->c->local = &l->hooks;
        rc = register_roles(l, p, cfg, err);
    }
    free(cfg);
    if (rc) {
        local_destroy(l);
        return rc;
    }
    *out = l;
    return 0;
}

/* Delivers and steps until the request ended, was cancelled or stalled. */
static int drive(struct local *l, char *err)
{
    while (!l->finished && !l->cancelled) {
        int rc = pump(l, err);
        if (rc)
            return rc;
        if (l->finished || l->cancelled)
            break;
        if (!step_roles(l) && l->n == 0)
            return error_set(err, ERR_INTERNAL,
                             "in-process pipeline stalled: nothing queued, no work, request unfinished");
    }
    return 0;
}

int local_run(struct local *l, const char *request, local_reply_fn on_reply, void *user, char *err)
{
    l->on_reply = on_reply;
    l->user = user;
    l->finished = l->cancelled = false;
    intake_dispatch(l->c, (const uint8_t *)LOCAL_CLIENT, strlen(LOCAL_CLIENT), (struct conn_ref){.fd = -1},
                    request, strlen(request));
    int rc = drive(l, err);
    /* what the ending sent (the slots' releases) reaches the roles now, so
     * the next request finds them empty */
    if (!rc && !l->cancelled)
        rc = pump(l, err);
    if (!rc && l->cancelled) {
        for (int i = 0; i < l->c->n_seqs; i++)
            if (l->c->seqs[i].state != SEQ_FREE)
                scheduler_cancel(l->c, &l->c->seqs[i]);
        rc = pump(l, err);
        if (!rc)
            rc = error_set(err, ERR_CANCELLED, "generation cancelled");
    }
    l->on_reply = NULL;
    l->user = NULL;
    return rc;
}

double local_cost_ratio(const struct local *l)
{
    const struct pair *p = &l->c->pair[0];
    return p->k_history_valid ? adaptive_k_cost_ratio(&p->k_history) : 0.0;
}

void local_destroy(struct local *l)
{
    if (!l)
        return;
    /* the target first: it lets go of the draft's buffer, which the
     * draft's destroy would otherwise wait for */
    target_worker_role.destroy(l->role[ROLE_TARGET].worker);
    draft_worker_role.destroy(l->role[ROLE_DRAFT].worker);
    for (int i = 0; i < l->n; i++)
        protocol_msg_free(&l->q[l->head + i].msg);
    free(l->q);
    coord_core_destroy(l->c);
    free(l);
}
