/* registry.c: owns the two worker records. A worker registers (repeats of
 * one registration are answered again, a new pid is a restart), a draft is
 * checked against the target (vocabulary, EOS ids) and held until a target
 * exists, the target learns where the draft's shared buffer is (attach),
 * heartbeats go both ways and a worker silent for worker_timeout_ms is
 * lost: a lost draft leaves its sequences target-only, a lost target fails
 * them. Messages from registered workers are dispatched to the scheduler.
 */
#include "registry.h"

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "cpulist.h"
#include "error.h"
#include "lanes.h"
#include "logging.h"
#include "scheduler.h"
#include "worker_msg.h"
#include "worker_send.h"

/* Unlinks a draft's segment if its process no longer exists; true when it
 * does not (the segment is then gone either way). */
static bool unlink_if_dead(const char *name, int pid)
{
    if (kill(pid, 0) == 0 || errno != ESRCH)
        return false;
    if (shm_unlink(name) == 0)
        LOG_INFO("removed the dead draft's shared segment %s", name);
    return true;
}

static void forget_orphan(struct coordinator *c, int i)
{
    c->shm_orphans[i] = c->shm_orphans[--c->n_shm_orphans];
}

/* The draft is gone (timeout, refusal, re-registration). */
void registry_draft_lost(struct coordinator *c, int pair, const char *why)
{
    c->pair[pair].k_history_valid = false;
    memset(c->pair[pair].wall_costs, 0, sizeof c->pair[pair].wall_costs);
    struct worker *d = &c->pair[pair].worker[ROLE_DRAFT];
    if (!d->up && !d->held)
        return;
    bool was_up = d->up;
    LOG_WARN("draft worker pid %d (pair %d) %s; its sequences continue target-only until a draft registers",
             d->pid, pair, why);
    if (was_up)
        c->metrics.worker_losses[ROLE_DRAFT]++;
    /* A crashed owner cannot unlink its segment: do it for it. */
    if (d->shm_name[0] != '\0' && d->pid > 0 && !unlink_if_dead(d->shm_name, d->pid)) {
        if (c->n_shm_orphans == COORD_SHM_ORPHANS)
            forget_orphan(c, 0);
        int i = c->n_shm_orphans++;
        /* both 256 bytes; memcpy: the compiler cannot see they never overlap */
        _Static_assert(sizeof c->shm_orphans[i].name == sizeof d->shm_name, "same size");
        memcpy(c->shm_orphans[i].name, d->shm_name, sizeof d->shm_name);
        c->shm_orphans[i].name[sizeof c->shm_orphans[i].name - 1] = '\0';
        c->shm_orphans[i].pid = d->pid;
        c->shm_orphans[i].since_ms = coord_now_ms();
    }
    cJSON_Delete(d->shm);
    cJSON_Delete(d->shm_frames);
    lanes_close_worker(d);
    memset(d, 0, sizeof(*d));
    c->pair[pair].halves_as_frames = false;
    c->pair[pair].draft_gen++;
    if (!was_up)
        return;
    for (int i = 0; i < c->n_seqs; i++) {
        struct seq *s = &c->seqs[i];
        if (s->state == SEQ_ACTIVE && s->pair == pair)
            scheduler_forget_draft(c, s);
    }
}

void registry_target_lost(struct coordinator *c, int pair, const char *why)
{
    c->pair[pair].k_history_valid = false;
    memset(c->pair[pair].wall_costs, 0, sizeof c->pair[pair].wall_costs);
    tree_choice_init(&c->pair[pair].trees); /* what trees cost is the target's */
    struct worker *t = &c->pair[pair].worker[ROLE_TARGET];
    if (!t->up)
        return;
    LOG_ERROR("target worker pid %d (pair %d) %s; failing its requests with target_unavailable", t->pid, pair,
              why);
    c->metrics.worker_losses[ROLE_TARGET]++;
    lanes_close_worker(t);
    memset(t, 0, sizeof(*t));
    c->pair[pair].target_outstanding = 0;
    c->pair[pair].target_idle_since_ms = -1;
    /* its sequences fail; the queued ones wait for another pair, unless
     * no target is left */
    const bool none_left = coord_any_target(c) == NULL;
    for (int i = 0; i < c->n_seqs; i++) {
        struct seq *s = &c->seqs[i];
        if ((s->state == SEQ_ACTIVE && s->pair == pair) || (s->state == SEQ_QUEUED && none_left))
            scheduler_fail(c, s, METRICS_ERR_TARGET_UNAVAILABLE, "the target worker stopped responding");
    }
}

static void send_welcome(struct coordinator *c, int pair, enum worker_role role)
{
    cJSON *h = protocol_header_new(PROTOCOL_WELCOME);
    if (h == NULL)
        return;
    cJSON_AddStringToObject(h, "role", coord_role_name(role));
    cJSON_AddNumberToObject(h, "heartbeat_ms", c->cfg.coordinator.heartbeat_ms);
    const struct worker *d = &c->pair[pair].worker[ROLE_DRAFT];
    const cJSON *desc = coord_draft_descriptor(&c->pair[pair]);
    if (role == ROLE_TARGET && d->up && desc != NULL)
        cJSON_AddItemToObject(h, "shm", cJSON_Duplicate(desc, 1));
    /* how the draft's halves reach the target (note_memory_sharing) */
    if (role == ROLE_DRAFT && c->pair[pair].halves_as_frames)
        cJSON_AddStringToObject(h, "halves", "frames");
    /* the lane offer (lanes.h): a worker already on it ignores a repeat */
    const struct worker *w = &c->pair[pair].worker[role];
    if (c->lane_listening && w->lane_key[0] != '\0') {
        cJSON *lane = cJSON_AddObjectToObject(h, "lane");
        if (lane == NULL || !cJSON_AddStringToObject(lane, "path", c->lane_path) ||
            !cJSON_AddStringToObject(lane, "key", w->lane_key))
            cJSON_DeleteItemFromObjectCaseSensitive(h, "lane");
    }
    worker_send(c, pair, role, h, NULL);
}

static void send_refused(struct coordinator *c, const uint8_t *identity, size_t identity_size, const char *message)
{
    cJSON *h = protocol_header_new(PROTOCOL_REFUSED);
    if (h == NULL)
        return;
    cJSON_AddStringToObject(h, "message", message);
    worker_send_to_identity(c, identity, identity_size, h);
}

/* Tells the target where the draft's shared buffer is. */
static void send_attach(struct coordinator *c, int pair)
{
    struct worker *d = &c->pair[pair].worker[ROLE_DRAFT];
    const cJSON *desc = coord_draft_descriptor(&c->pair[pair]);
    if (!c->pair[pair].worker[ROLE_TARGET].up || !d->up || desc == NULL)
        return;
    cJSON *h = protocol_header_new(PROTOCOL_ATTACH);
    cJSON *shm = cJSON_Duplicate(desc, 1);
    if (h == NULL || shm == NULL) {
        cJSON_Delete(h);
        cJSON_Delete(shm);
        return;
    }
    cJSON_AddItemToObject(h, "shm", shm);
    worker_send(c, pair, ROLE_TARGET, h, NULL);
}

/* 0 when w has ref's vocabulary and EOS ids; else the reason in why, w
 * named as w_name and ref as ref_poss ("the target's"). */
static int check_same_model(const struct worker *ref, const char *ref_poss, const struct worker *w,
                            const char *w_name, char *why, size_t why_size)
{
    if (w->vocab_size != ref->vocab_size) {
        snprintf(why, why_size, "%s vocab_size %d differs from %s %d", w_name, w->vocab_size, ref_poss,
                 ref->vocab_size);
        return -1;
    }
    bool same = w->n_eos == ref->n_eos;
    for (int i = 0; same && i < w->n_eos; i++)
        same = w->eos_ids[i] == ref->eos_ids[i];
    if (!same) {
        char a[128] = "", b[128] = "";
        size_t la = 0, lb = 0;
        for (int i = 0; i < w->n_eos && la < sizeof(a) - 16; i++)
            la += (size_t)snprintf(a + la, sizeof(a) - la, "%s%d", i ? "," : "", w->eos_ids[i]);
        for (int i = 0; i < ref->n_eos && lb < sizeof(b) - 16; i++)
            lb += (size_t)snprintf(b + lb, sizeof(b) - lb, "%s%d", i ? "," : "", ref->eos_ids[i]);
        snprintf(why, why_size, "%s eos_ids [%s] differ from %s [%s]", w_name, a, ref_poss, b);
        return -1;
    }
    return 0;
}

/* 0 when the draft matches the target; else the reason in why. */
static int check_pair(const struct worker *t, const struct worker *d, char *why, size_t why_size)
{
    return check_same_model(t, "the target's", d, "draft", why, why_size);
}

/* Decides c->pair[pair].cores_shared for the pair just formed, and says so: the log
 * is where an operator learns why the pipeline drafts as it does. */
static void note_core_sharing(struct coordinator *c, int pair)
{
    const struct worker *d = &c->pair[pair].worker[ROLE_DRAFT], *t = &c->pair[pair].worker[ROLE_TARGET];
    /* One thread runs both roles in process (docs/one-core.md): the draft
     * cannot work beside the target whatever cores they name. */
    if (c->local != NULL) {
        c->pair[pair].cores_shared = true;
        LOG_INFO("draft and target in one process: the draft works only while the target waits");
        return;
    }
    c->pair[pair].cores_shared = false;
    if (!d->cpu_known || !t->cpu_known) {
        LOG_INFO("draft (%s) and target (%s): not both on CPU cores they named; pre-drafts only where "
                 "measured to pay", d->backend, t->backend);
        return;
    }
    char dl[64] = "", tl[64] = "";
    if (cpulist_format(&d->cpus, dl, sizeof dl, NULL) != 0)
        snprintf(dl, sizeof dl, "%d CPUs", cpulist_count(&d->cpus));
    if (cpulist_format(&t->cpus, tl, sizeof tl, NULL) != 0)
        snprintf(tl, sizeof tl, "%d CPUs", cpulist_count(&t->cpus));
    c->pair[pair].cores_shared = strcmp(d->cpu_host, t->cpu_host) == 0 &&
                      cpulist_oversubscribed(&d->cpus, d->cpu_threads, &t->cpus, t->cpu_threads);
    if (c->pair[pair].cores_shared)
        LOG_INFO("draft (%d threads on CPUs %s) and target (%d threads on CPUs %s) share cores: the draft "
                 "works only while the target waits (no pre-drafts)", d->cpu_threads, dl, t->cpu_threads, tl);
    else
        LOG_INFO("draft (%d threads on CPUs %s) and target (%d threads on CPUs %s) %s: pre-drafts only where "
                 "measured to pay", d->cpu_threads, dl, t->cpu_threads, tl,
                 strcmp(d->cpu_host, t->cpu_host) != 0 ? "run on different hosts" : "have cores enough");
}

/* Decides halves_as_frames for the pair just formed: the target maps the
 * draft's buffer only where both name the same shm domain (an unknown one
 * counts as the same: workers from before the field); elsewhere it gets a
 * "frames" descriptor and each half in a message. Says so in the log. */
static void note_memory_sharing(struct coordinator *c, int pair)
{
    struct pair *p = &c->pair[pair];
    struct worker *d = &p->worker[ROLE_DRAFT], *t = &p->worker[ROLE_TARGET];
    const bool frames = d->shm_domain[0] != '\0' && t->shm_domain[0] != '\0' &&
                        strcmp(d->shm_domain, t->shm_domain) != 0;
    if (frames && d->shm_frames == NULL && d->shm != NULL) {
        cJSON *f = cJSON_Duplicate(d->shm, 1);
        if (f == NULL || !cJSON_ReplaceItemInObjectCaseSensitive(f, "transport", cJSON_CreateString("frames"))) {
            cJSON_Delete(f);
            LOG_ERROR("pair %d: out of memory; the target will try to map the draft's buffer", pair);
            p->halves_as_frames = false;
            return;
        }
        cJSON_DeleteItemFromObjectCaseSensitive(f, "cuda");
        d->shm_frames = f;
    }
    LOG_INFO("pair %d: draft and target %s", pair,
                 frames ? "share no memory (other hosts or /dev/shm mounts): each half of the draft goes in its "
                          "messages, through here"
                        : "share memory: the target maps the draft's buffer");
    p->halves_as_frames = frames && d->shm_frames != NULL;
}

static void welcome_draft(struct coordinator *c, int pair)
{
    struct worker *d = &c->pair[pair].worker[ROLE_DRAFT];
    struct worker *t = &c->pair[pair].worker[ROLE_TARGET];
    char why[400];
    if (check_pair(t, d, why, sizeof(why)) != 0) {
        LOG_ERROR("refusing draft worker pid %d (%s): %s", d->pid, d->model, why);
        c->metrics.draft_refusals++;
        send_refused(c, d->identity, d->identity_size, why);
        cJSON_Delete(d->shm);
        cJSON_Delete(d->shm_frames);
        lanes_close_worker(d);
        memset(d, 0, sizeof(*d));
        return;
    }
    d->held = false;
    d->up = true;
    d->last_seen_ms = coord_now_ms();
    c->pair[pair].draft_gen++;
    d->gen = c->pair[pair].draft_gen;
    c->metrics.worker_registrations[ROLE_DRAFT]++;
    LOG_INFO("draft worker pid %d (pair %d) registered: %s, %s, vocab %d, %d slots, max_seq_len %d", d->pid, pair,
             d->model, d->backend, d->vocab_size, d->n_slots, d->max_seq_len);
    note_core_sharing(c, pair);
    note_memory_sharing(c, pair);
    send_welcome(c, pair, ROLE_DRAFT);
    send_attach(c, pair);
}

/* 0 when target t of pair `pair` has the vocabulary and EOS ids of every
 * other pair's registered target (a request may go to any of them). */
static int check_other_targets(const struct coordinator *c, int pair, const struct worker *t, char *err)
{
    char why[400], w_name[40], ref_poss[40];
    snprintf(w_name, sizeof w_name, "the target of pair %d:", pair);
    for (int p = 0; p < c->n_pairs; p++) {
        const struct worker *o = &c->pair[p].worker[ROLE_TARGET];
        snprintf(ref_poss, sizeof ref_poss, "pair %d's target's", p);
        if (p != pair && o->up && check_same_model(o, ref_poss, t, w_name, why, sizeof why) != 0)
            return error_set(err, ERR_INVALID_ARG, "every pair must serve the same model: %s", why);
    }
    return 0;
}

/* Whether w comes from the process already registered as known (or held). */
static bool same_process(const struct worker *known, const struct worker *w)
{
    return (known->up || known->held) && known->pid == w->pid && strcmp(known->shm_name, w->shm_name) == 0;
}

/* The worker record a register message describes (its facts only: the
 * routing id, times and lane are the registration's). */
static void worker_of_register(const struct worker_msg_register *r, struct worker *w)
{
    memset(w, 0, sizeof *w);
    w->pid = r->pid;
    w->vocab_size = r->vocab_size;
    memcpy(w->eos_ids, r->eos_ids, sizeof(w->eos_ids));
    w->n_eos = r->n_eos;
    w->max_seq_len = r->max_seq_len;
    w->n_slots = r->n_slots;
    w->bos_id = r->bos_id;
    w->kv_blocks = r->kv_blocks;
    w->kv_block_size = r->kv_block_size;
    w->drops = r->drops;
    w->cpu_known = r->cpu.present;
    snprintf(w->shm_domain, sizeof w->shm_domain, "%s", r->shm_domain);
    snprintf(w->model, sizeof(w->model), "%s", r->model);
    snprintf(w->backend, sizeof(w->backend), "%s", r->backend);
    if (w->cpu_known) {
        snprintf(w->cpu_host, sizeof(w->cpu_host), "%s", r->cpu.host);
        w->cpu_threads = r->cpu.threads;
        w->cpus = r->cpu.set;
    }
    if (r->shm != NULL) {
        char err[ERR_MSG_MAX];
        const char *name = "";
        if (protocol_get_string_opt(r->shm, "shm.name", sizeof(w->shm_name) - 1, "", &name, err) == 0)
            snprintf(w->shm_name, sizeof(w->shm_name), "%s", name);
        const char *transport = "";
        w->shm_posix = protocol_get_string_opt(r->shm, "shm.transport", 32, "", &transport, err) == 0 &&
                       strcmp(transport, "posix") == 0;
    }
}

/* A repeat of a registration already taken (the same process, no
 * connection lost since): answered again, never taken for a restart.
 * True when w was one. */
static bool answered_again(struct coordinator *c, const struct protocol_msg *msg, int pair, enum worker_role role,
                           const struct worker *w)
{
    struct worker *known = &c->pair[pair].worker[role];
    if (!same_process(known, w) || known->drops != w->drops)
        return false;
    memcpy(known->identity, msg->identity, msg->identity_size);
    known->identity_size = msg->identity_size;
    known->last_seen_ms = coord_now_ms();
    if (known->up) {
        send_welcome(c, pair, role);
        if (role == ROLE_DRAFT)
            send_attach(c, pair);
    }
    return true;
}

/* A target takes pair's place: the one before it lost, the draft held for
 * it welcomed, or the draft already up checked against it again. */
static void target_registered(struct coordinator *c, int pair, const struct worker *w, bool same)
{
    if (c->pair[pair].worker[ROLE_TARGET].up)
        registry_target_lost(c, pair, same ? "registered again after a connection drop (its sequences are gone)"
                                           : "registered again (restarted)");
    c->pair[pair].worker[ROLE_TARGET] = *w;
    c->pair[pair].worker[ROLE_TARGET].up = true;
    c->metrics.worker_registrations[ROLE_TARGET]++;
    LOG_INFO("target worker pid %d (pair %d) registered: %s, %s, vocab %d, %d slots, max_seq_len %d", w->pid, pair,
             w->model, w->backend, w->vocab_size, w->n_slots, w->max_seq_len);
    send_welcome(c, pair, ROLE_TARGET);
    struct worker *d = &c->pair[pair].worker[ROLE_DRAFT];
    if (d->held) {
        welcome_draft(c, pair);
        return;
    }
    if (!d->up)
        return;
    char why[400];
    if (check_pair(&c->pair[pair].worker[ROLE_TARGET], d, why, sizeof(why)) != 0) {
        LOG_ERROR("dropping draft worker pid %d (%s): %s", d->pid, d->model, why);
        send_refused(c, d->identity, d->identity_size, why);
        c->metrics.draft_refusals++;
        registry_draft_lost(c, pair, "does not match the new target");
        return;
    }
    note_core_sharing(c, pair);
    const bool was_frames = c->pair[pair].halves_as_frames;
    note_memory_sharing(c, pair);
    if (was_frames != c->pair[pair].halves_as_frames)
        send_welcome(c, pair, ROLE_DRAFT); /* the draft learns how its halves travel */
    send_attach(c, pair);
}

/* A draft takes pair's place: welcomed, or held until its target registers. */
static void draft_registered(struct coordinator *c, int pair, const struct worker *w, bool same)
{
    struct worker *d = &c->pair[pair].worker[ROLE_DRAFT];
    if (d->up || d->held)
        registry_draft_lost(c, pair, same ? "registered again after a connection drop (its sequences are gone)"
                                          : "registered again (restarted)");
    *d = *w;
    if (!c->pair[pair].worker[ROLE_TARGET].up) {
        d->held = true;
        LOG_INFO("draft worker pid %d (%s) registered before the target: held until the target registers", w->pid,
                 w->model);
        return;
    }
    welcome_draft(c, pair);
}

static void on_register(struct coordinator *c, const struct protocol_msg *msg)
{
    char err[ERR_MSG_MAX] = "";
    struct worker_msg_register r;
    struct worker w;
    memset(&w, 0, sizeof(w));
    int rc = worker_msg_register_decode(msg, &r, err);
    enum worker_role role = rc == 0 && strcmp(r.role, "target") == 0 ? ROLE_TARGET : ROLE_DRAFT;
    if (rc == 0)
        worker_of_register(&r, &w);
    if (rc == 0 && r.pair >= c->n_pairs)
        rc = error_set(err, ERR_INVALID_ARG,
                       "pair %d: this coordinator serves %d pair%s (pairs 0..%d, its config's \"pairs\"); "
                       "start the coordinator with the same config as the worker", r.pair, c->n_pairs,
                       c->n_pairs == 1 ? "" : "s", c->n_pairs - 1);
    const int pair = rc == 0 ? r.pair : 0;
    if (rc == 0 && role == ROLE_TARGET)
        rc = check_other_targets(c, pair, &w, err);
    if (rc != 0) {
        LOG_ERROR("refusing a worker registration: %s", err);
        send_refused(c, msg->identity, msg->identity_size, err);
        return;
    }
    /* A worker repeats register until it is welcomed (its first one may
     * leave before the connection is up): a repeat from the same process is
     * answered again. One that lost its connection meanwhile (more drops)
     * emptied its slots: for the requests it served that is a restart. */
    if (answered_again(c, msg, pair, role, &w))
        return;
    const bool same = same_process(&c->pair[pair].worker[role], &w);
    memcpy(w.identity, msg->identity, msg->identity_size);
    w.identity_size = msg->identity_size;
    w.last_seen_ms = coord_now_ms();
    if (r.shm != NULL && (w.shm = cJSON_Duplicate(r.shm, 1)) == NULL) {
        LOG_ERROR("draft registration: out of memory");
        return;
    }
    w.lane_fd = -1;
    if (c->lane_listening && lane_key_new(w.lane_key, err) != 0) {
        LOG_WARN("%s: no lane offered to this worker", err);
        w.lane_key[0] = '\0';
    }
    if (role == ROLE_TARGET)
        target_registered(c, pair, &w, same);
    else
        draft_registered(c, pair, &w, same);
}

static void on_worker_message(struct coordinator *c, int pair, enum worker_role role,
                              const struct protocol_msg *msg);

void registry_on_message(struct coordinator *c)
{
    char err[ERR_MSG_MAX] = "";
    struct protocol_msg msg;
    memset(&msg, 0, sizeof(msg));
    const size_t limit = c->max_message_bytes > COORD_WORKER_ZMQ_MESSAGE_MAX ? c->max_message_bytes
                                                                            : COORD_WORKER_ZMQ_MESSAGE_MAX;
    int rc = protocol_recv(c->workers, true, limit, PROTOCOL_DONTWAIT, &msg, err);
    if (rc == ERR_TIMEOUT || rc == ERR_CANCELLED) {
        protocol_msg_free(&msg);
        return;
    }
    if (rc != 0) {
        LOG_ERROR("bad message from a worker: %s", err);
        protocol_msg_free(&msg);
        return;
    }
    registry_dispatch(c, &msg);
    protocol_msg_free(&msg);
}

void registry_dispatch(struct coordinator *c, const struct protocol_msg *msg)
{
    if (strcmp(msg->type, PROTOCOL_REGISTER) == 0) {
        on_register(c, msg);
        return;
    }
    struct worker *w = NULL;
    int pair = 0;
    enum worker_role role = ROLE_DRAFT;
    for (int p = 0; p < c->n_pairs && w == NULL; p++)
        for (int r = 0; r < 2 && w == NULL; r++) {
            struct worker *cand = &c->pair[p].worker[r];
            if ((cand->up || cand->held) && cand->identity_size == msg->identity_size &&
                memcmp(cand->identity, msg->identity, msg->identity_size) == 0) {
                w = cand;
                pair = p;
                role = (enum worker_role)r;
            }
        }
    if (w == NULL) {
        LOG_DEBUG("message \"%s\" from an unregistered worker dropped", msg->type);
        return;
    }
    w->last_seen_ms = coord_now_ms();
    if (strcmp(msg->type, PROTOCOL_LANE) == 0) {
        /* the worker's marker: what it sends from here on comes on its lane */
        if (w->lane_sending && !w->lane_reading) {
            w->lane_reading = true;
            LOG_INFO("%s worker pid %d: on its lane", coord_role_name(role), w->pid);
        }
        return;
    }
    on_worker_message(c, pair, role, msg);
}

void registry_on_lane(struct coordinator *c, int pair, enum worker_role role)
{
    struct worker *w = &c->pair[pair].worker[role];
    /* bounded, as the worker socket's batches; a handler may lose the worker */
    for (int i = 0; i < 64 && w->lane_reading; i++) {
        char err[ERR_MSG_MAX] = "";
        struct protocol_msg msg;
        int rc = lane_recv(w->lane_fd, c->max_message_bytes, &msg, err);
        if (rc == ERR_TIMEOUT) {
            protocol_msg_free(&msg);
            return;
        }
        if (rc == ERR_PROTOCOL) {
            LOG_ERROR("bad message on the %s worker's lane: %s", coord_role_name(role), err);
            protocol_msg_free(&msg);
            continue;
        }
        if (rc != 0) {
            protocol_msg_free(&msg);
            /* end of file: the process is gone (a live worker closes its
             * lane only when it lost the coordinator, and then registers
             * again) */
            char why[ERR_MSG_MAX + 32];
            snprintf(why, sizeof why, "closed its lane (%s)", err);
            lanes_close_worker(w);
            if (role == ROLE_TARGET)
                registry_target_lost(c, pair, why);
            else
                registry_draft_lost(c, pair, why);
            return;
        }
        w->last_seen_ms = coord_now_ms();
        on_worker_message(c, pair, role, &msg);
        protocol_msg_free(&msg);
    }
}

/* A message of a known worker, from its socket or its lane. */
static void on_worker_message(struct coordinator *c, int pair, enum worker_role role,
                              const struct protocol_msg *msg)
{
    /* Every verify gets one reply (verify_done or error): the target is
     * idle when none is outstanding. */
    if (role == ROLE_TARGET && c->pair[pair].target_outstanding > 0 &&
        (strcmp(msg->type, PROTOCOL_VERIFY_DONE) == 0 || strcmp(msg->type, PROTOCOL_ERROR) == 0) &&
        --c->pair[pair].target_outstanding == 0)
        c->pair[pair].target_idle_since_ms = coord_now_ms();
    if (strcmp(msg->type, PROTOCOL_HEARTBEAT) == 0) {
        /* liveness already noted */
    } else if (c->pair[pair].worker[role].held) {
        LOG_DEBUG("message \"%s\" from the held draft dropped", msg->type);
    } else if (role == ROLE_TARGET && strcmp(msg->type, PROTOCOL_VERIFY_DONE) == 0) {
        scheduler_on_verify_done(c, pair, msg);
    } else if (role == ROLE_DRAFT && strcmp(msg->type, PROTOCOL_DRAFT_READY) == 0) {
        scheduler_on_draft_ready(c, pair, msg);
    } else if (role == ROLE_DRAFT && strcmp(msg->type, PROTOCOL_PREFILL_DONE) == 0) {
        scheduler_on_prefill_done(c, pair, msg);
    } else if (strcmp(msg->type, PROTOCOL_ERROR) == 0) {
        scheduler_on_worker_error(c, pair, role, msg);
    } else {
        LOG_WARN("%s worker sent an unexpected \"%.32s\" message", coord_role_name(role), msg->type);
    }
}

void registry_tick(struct coordinator *c)
{
    double t = coord_now_ms();
    for (int i = c->n_shm_orphans - 1; i >= 0; i--)
        if (unlink_if_dead(c->shm_orphans[i].name, c->shm_orphans[i].pid) ||
            t - c->shm_orphans[i].since_ms > COORD_SHM_ORPHAN_MS)
            forget_orphan(c, i);
    const struct coordinator_config *cc = &c->cfg.coordinator;
    const bool beat = t - c->last_heartbeat_ms >= cc->heartbeat_ms;
    if (beat)
        c->last_heartbeat_ms = t;
    for (int pair = 0; pair < c->n_pairs; pair++) {
        for (int r = 0; beat && r < 2; r++) {
            struct worker *w = &c->pair[pair].worker[r];
            if (!w->up && !w->held)
                continue;
            cJSON *h = protocol_header_new(PROTOCOL_HEARTBEAT);
            if (h != NULL)
                worker_send(c, pair, (enum worker_role)r, h, NULL);
        }
        struct worker *t_w = &c->pair[pair].worker[ROLE_TARGET];
        if (t_w->up && t - t_w->last_seen_ms > cc->worker_timeout_ms)
            registry_target_lost(c, pair, "sent nothing for worker_timeout_ms");
        struct worker *d_w = &c->pair[pair].worker[ROLE_DRAFT];
        if ((d_w->up || d_w->held) && t - d_w->last_seen_ms > cc->worker_timeout_ms)
            registry_draft_lost(c, pair, "sent nothing for worker_timeout_ms");
    }
}
