/* intake.c: owns client messages on their way in: reads one ROUTER message
 * (routing id + one frame, size-capped), parses the envelope, and turns a
 * generate request into a queued sequence: validation (common/wire
 * request.c), tokenization or the chat template, sampling parameters and the
 * starting state of adaptive K (the pair's history). Stats requests are
 * answered here too. Every rejection is an error reply naming the field.
 */
#include "intake.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "error.h"
#include "logging.h"
#include "prompt.h"
#include "replies.h"
#include "scheduler.h"

/* Requests queued or running for one client connection (routing id). */
static int requests_of_client(const struct coordinator *c, const uint8_t *identity, size_t identity_size)
{
    int n = 0;
    for (int i = 0; i < c->n_seqs; i++) {
        const struct seq *s = &c->seqs[i];
        n += s->state != SEQ_FREE && s->client_size == identity_size &&
             memcmp(s->client, identity, identity_size) == 0;
    }
    return n;
}

static uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Tokenizes the request's prompt into s->hist (prompt.h). 0, or an error
 * code with msg for the client's reply. */
static int build_prompt(struct coordinator *c, const struct request *r, struct seq *s, char *msg, size_t msg_size)
{
    const struct worker *t = coord_any_target(c);
    const struct prompt_limits lim = {.vocab = t != NULL ? t->vocab_size : 0,
                                      .context_len = coord_min_context_len(c),
                                      .tokenizer_path = c->cfg.coordinator.tokenizer};
    int rc = prompt_build(c->tk, &lim, r, &s->hist, &s->n_hist, &s->cap_hist, msg, msg_size);
    if (rc == 0)
        s->n_prompt = s->n_hist;
    return rc;
}

/* Who a request came from. */
struct choice_ref {
    const uint8_t *identity;
    size_t identity_size;
    struct conn_ref conn;
};

/* Frees what start_choice built into a free record before it failed (the
 * fields still NULL are left alone). */
static void unbuild(struct seq *s)
{
    free(s->pred);
    s->pred = NULL;
    output_destroy(s->out);
    s->out = NULL;
    free(s->hist);
    s->hist = NULL;
}

/* Queues choice `index` of r as a sequence of its own, with seed. 0, or -1
 * with the client's error sent. */
static int start_choice(struct coordinator *c, const struct choice_ref *who, const struct request *r,
                        int index, uint64_t seed)
{
    const uint8_t *identity = who->identity;
    const size_t identity_size = who->identity_size;
    const struct conn_ref conn = who->conn;
    char err[ERR_MSG_MAX] = "";
    struct seq *s = NULL;
    for (int i = 0; i < c->n_seqs && s == NULL; i++)
        if (c->seqs[i].state == SEQ_FREE)
            s = &c->seqs[i];
    if (s == NULL) {
        replies_error(c, identity, identity_size, r->id, METRICS_ERR_OVERLOADED, "no free request record");
        return -1;
    }
    char msg[ERR_MSG_MAX + 64];
    int rc = build_prompt(c, r, s, msg, sizeof(msg));
    if (rc != 0) {
        replies_error(c, identity, identity_size, r->id,
                     rc == ERR_CONTEXT_FULL ? METRICS_ERR_CONTEXT_FULL
                     : rc == ERR_NOMEM      ? METRICS_ERR_INTERNAL
                                            : METRICS_ERR_INVALID_REQUEST,
                     msg);
        return -1;
    }
    if (output_create(&s->out, c->tk, r->stop, r->n_stop, err) != 0) {
        unbuild(s);
        replies_error(c, identity, identity_size, r->id, METRICS_ERR_INTERNAL, err);
        return -1;
    }
    /* the prediction as tokens, as the output would spell it (no BOS) */
    if (r->prediction != NULL) {
        size_t n = 0;
        int prc = c->tk == NULL ? ERR_UNAVAILABLE
                                : tokenizer_encode(c->tk, r->prediction, r->prediction_len, 0, &s->pred, &n, err);
        if (prc != 0) {
            unbuild(s);
            replies_error(c, identity, identity_size, r->id,
                          prc == ERR_NOMEM ? METRICS_ERR_INTERNAL : METRICS_ERR_INVALID_REQUEST,
                          c->tk == NULL ? "prediction: the coordinator has no tokenizer" : err);
            return -1;
        }
        s->n_pred = (int)n;
    }
    /* the workers compile it from this text; request_from_json compiled it once already */
    if (r->grammar.kind != GRAMMAR_SPEC_NONE && !(s->grammar = grammar_spec_to_json(&r->grammar))) {
        unbuild(s);
        replies_error(c, identity, identity_size, r->id, METRICS_ERR_INTERNAL, "grammar: out of memory");
        return -1;
    }
    s->req = ++c->next_req;
    memcpy(s->client, identity, identity_size);
    s->client_size = identity_size;
    s->conn = conn;
    snprintf(s->id, sizeof(s->id), "%s", r->id);
    s->stream = r->stream;
    s->max_tokens = r->max_tokens;
    sampling_params_default(&s->sp);
    s->sp.temperature = (float)r->temperature;
    s->sp.top_k = r->top_k;
    s->sp.top_p = (float)r->top_p;
    s->sp.min_p = (float)r->min_p;
    s->sp.seed = seed;
    s->index = index;
    s->n_choices = r->n;
    s->mode = r->spec_mode == REQUEST_SPEC_MODE_POINT_MASS ? SPECULATE_MODE_POINT_MASS
              : r->spec_mode == REQUEST_SPEC_MODE_SAMPLED  ? SPECULATE_MODE_SAMPLED
                                                           : c->default_mode;
    s->draft = r->draft != REQUEST_DRAFT_DEFAULT ? r->draft : c->default_draft;
    s->spec_tree = r->spec_tree != REQUEST_SPEC_TREE_UNSET ? r->spec_tree : c->default_spec_tree;
    /* The draft proposes without the controls: its proposals are checked as
     * point masses, which keeps sampled output the target's (speculate.h) */
    s->ctl = r->ctl;
    if (sampling_controls_active(&s->ctl))
        s->mode = SPECULATE_MODE_POINT_MASS;
    s->ignore_eos = r->ignore_eos;
    s->lp.on = r->logprobs >= 0;
    s->lp.top = r->logprobs >= 0 ? r->logprobs : 0;
    int k_fixed = r->spec_k > 0 ? r->spec_k : c->cfg.coordinator.spec_k;
    int k_max = c->cfg.coordinator.spec_k_max;
    if (k_fixed > k_max)
        k_max = k_fixed;
    /* the pair's history replaces this at admission (scheduler.c) */
    adaptive_k_init_wall(&s->kc, k_fixed, k_max);
    s->t_arrival_ms = coord_now_ms();
    scheduler_enqueue(c, s);
    return 0;
}

static void on_generate(struct coordinator *c, const uint8_t *identity, size_t identity_size, struct conn_ref conn,
                        const cJSON *root)
{
    char err[ERR_MSG_MAX] = "";
    c->metrics.requests_total++;
    struct request_limits limits = {.max_tokens_max = coord_any_target(c) != NULL ? coord_min_context_len(c) : 1 << 20,
                                    .spec_k_max = c->cfg.coordinator.spec_k_max};
    struct request *r = NULL;
    if (request_from_json(&r, root, &limits, err) != 0) {
        replies_error(c, identity, identity_size, request_peek_id(root), METRICS_ERR_INVALID_REQUEST, err);
        return;
    }
    if (r->has_seed && r->seed > COORD_SEED_MAX) {
        snprintf(err, sizeof(err), "seed: must be <= %llu, got %llu", (unsigned long long)COORD_SEED_MAX,
                 (unsigned long long)r->seed);
        replies_error(c, identity, identity_size, r->id, METRICS_ERR_INVALID_REQUEST, err);
        request_destroy(r);
        return;
    }
    if (coord_any_target(c) == NULL) {
        replies_error(c, identity, identity_size, r->id, METRICS_ERR_TARGET_UNAVAILABLE,
                     "no target worker is registered; try again later");
        request_destroy(r);
        return;
    }
    if (c->n_active >= c->n_pairs * c->cfg.coordinator.max_concurrency &&
        c->n_queued >= c->cfg.coordinator.max_queue) {
        char m[160];
        snprintf(m, sizeof(m), "%d requests active and %d queued (max_concurrency %d, max_queue %d)", c->n_active,
                 c->n_queued, c->cfg.coordinator.max_concurrency, c->cfg.coordinator.max_queue);
        replies_error(c, identity, identity_size, r->id, METRICS_ERR_OVERLOADED, m);
        request_destroy(r);
        return;
    }
    int per_client = c->cfg.coordinator.max_requests_per_client;
    if (per_client > 0 && requests_of_client(c, identity, identity_size) >= per_client) {
        char m[160];
        snprintf(m, sizeof(m), "this client has %d requests in flight (coordinator.max_requests_per_client)",
                 per_client);
        replies_error(c, identity, identity_size, r->id, METRICS_ERR_OVERLOADED, m);
        request_destroy(r);
        return;
    }
    int n_free = 0;
    for (int i = 0; i < c->n_seqs; i++)
        n_free += c->seqs[i].state == SEQ_FREE;
    if (n_free < r->n) {
        char m[160];
        snprintf(m, sizeof(m), "n: %d choices need as many request records, %d are free", r->n, n_free);
        replies_error(c, identity, identity_size, r->id, METRICS_ERR_OVERLOADED, m);
        request_destroy(r);
        return;
    }
    /* one sequence per choice, each with its own seed (docs/protocol.md, n) */
    const struct choice_ref who = {.identity = identity, .identity_size = identity_size, .conn = conn};
    const uint64_t seed = r->has_seed ? r->seed : splitmix64(&c->rng_state) & COORD_SEED_MAX;
    for (int i = 0; i < r->n; i++)
        if (start_choice(c, &who, r, i, seed + (uint64_t)i) != 0)
            break;
    request_destroy(r);
}

/* What the stats render of the coordinator's state now. */
static void stats_gauges(const struct coordinator *c, struct metrics_gauges *g)
{
    *g = (struct metrics_gauges){
        .active = c->n_active,
        .queued = c->n_queued,
        .max_concurrency = c->cfg.coordinator.max_concurrency,
        .max_queue = c->cfg.coordinator.max_queue,
        .uptime_s = (coord_now_ms() - c->t_start_ms) / 1000.0,
        .busy_ms = c->metrics.busy_ms_total + (c->busy_since_ms >= 0 ? coord_now_ms() - c->busy_since_ms : 0.0),
        .n_pairs = c->n_pairs,
        .draft_configured = c->cfg.draft_configured,
    };
    bool brief[2] = {false, false}; /* the brief fields name a worker already */
    for (int p = 0; p < c->n_pairs && p < METRICS_PAIRS_MAX; p++) {
        const struct pair *pr = &c->pair[p];
        struct metrics_pair_gauges *pg = &g->pairs[p];
        for (int r = 0; r < 2; r++) {
            const struct worker *w = &pr->worker[r];
            pg->up[r] = w->up;
            pg->lane[r] = w->lane_reading;
            pg->pid[r] = w->pid;
            pg->model[r] = w->model;
            pg->kv_blocks[r] = w->kv_blocks;
            pg->kv_reserved[r] = pr->kv_reserved[r];
            g->kv_blocks[r] += w->kv_blocks;
            g->kv_reserved[r] += pr->kv_reserved[r];
            if (w->up && !brief[r]) {
                brief[r] = true;
                *(r == ROLE_DRAFT ? &g->draft_up : &g->target_up) = 1;
                *(r == ROLE_DRAFT ? &g->draft_lane : &g->target_lane) = w->lane_reading;
                *(r == ROLE_DRAFT ? &g->draft_pid : &g->target_pid) = w->pid;
                *(r == ROLE_DRAFT ? &g->draft_model : &g->target_model) = w->model;
            }
        }
        pg->cores_shared = pr->cores_shared && pr->worker[ROLE_DRAFT].up && pr->worker[ROLE_TARGET].up;
        g->cores_shared = g->cores_shared || pg->cores_shared;
        pg->active = pr->n_active;
        pg->target_calls = pr->target_calls;
        pg->admitted = pr->requests_admitted;
    }
}

int intake_prometheus(void *cls, char **text, char *err)
{
    const struct coordinator *c = cls;
    struct metrics_gauges g;
    stats_gauges(c, &g);
    return metrics_prometheus(&c->metrics, &g, text, err);
}

static void on_stats(struct coordinator *c, const uint8_t *identity, size_t identity_size, const cJSON *root)
{
    char err[ERR_MSG_MAX];
    struct metrics_gauges g;
    stats_gauges(c, &g);
    cJSON *m = cJSON_CreateObject();
    char *prom = NULL;
    if (m == NULL || cJSON_AddStringToObject(m, "type", "stats") == NULL ||
        cJSON_AddStringToObject(m, "id", request_peek_id(root)) == NULL || metrics_add_json(&c->metrics, &g, m, err) != 0 ||
        metrics_prometheus(&c->metrics, &g, &prom, err) != 0 || cJSON_AddStringToObject(m, "prometheus", prom) == NULL) {
        cJSON_Delete(m);
        free(prom);
        replies_error(c, identity, identity_size, request_peek_id(root), METRICS_ERR_INTERNAL, "stats: out of memory");
        return;
    }
    free(prom);
    replies_send(c, identity, identity_size, m);
    cJSON_Delete(m);
}

/* A cancel stops the sender's queued or running requests with that id (ids
 * are per client: another client's request of the same id is untouched).
 * Each ends with an error reply of code "cancelled"; an id with nothing
 * running is not an error (the request may have just finished). */
static void on_cancel(struct coordinator *c, const uint8_t *identity, size_t identity_size, const cJSON *root)
{
    char err[ERR_MSG_MAX] = "";
    char id[REQUEST_ID_MAX + 1];
    if (request_cancel_from_json(root, id, err) != 0) {
        c->metrics.requests_total++;
        replies_error(c, identity, identity_size, request_peek_id(root), METRICS_ERR_INVALID_REQUEST, err);
        return;
    }
    for (int i = 0; i < c->n_seqs; i++) {
        struct seq *s = &c->seqs[i];
        if (s->state == SEQ_FREE || s->client_size != identity_size ||
            memcmp(s->client, identity, identity_size) != 0 || strcmp(s->id, id) != 0)
            continue;
        cJSON *m = cJSON_CreateObject();
        if (m != NULL && cJSON_AddStringToObject(m, "type", "error") != NULL &&
            cJSON_AddStringToObject(m, "id", id) != NULL &&
            cJSON_AddStringToObject(m, "code", metrics_error_name(METRICS_ERR_CANCELLED)) != NULL &&
            cJSON_AddStringToObject(m, "message", "cancelled by the client") != NULL)
            replies_send(c, identity, identity_size, m);
        cJSON_Delete(m);
        scheduler_cancel(c, s);
    }
}


static void handle_message(struct coordinator *c, size_t *received_bytes);

void intake_watch_connections(struct coordinator *c)
{
    c->n_conn_drops += connections_update(c->conns);
    if (c->n_conn_drops == 0)
        return;
    c->n_conn_drops = 0;
    for (int i = 0; i < c->n_seqs; i++) {
        struct seq *s = &c->seqs[i];
        if (s->state != SEQ_FREE && !connections_open(c->conns, s->conn)) {
            LOG_INFO("request \"%s\" (#%llu): its client's connection dropped", s->id, (unsigned long long)s->req);
            scheduler_cancel(c, s);
        }
    }
}

/* Reads one client message (routing id + one frame) and answers it; then,
 * after a large one, gives the freed memory back to the OS. */
void intake_on_message(struct coordinator *c)
{
    size_t received = 0;
    handle_message(c, &received);
    c->answering.active = false;
#ifdef __GLIBC__
    if (received >= COORD_TRIM_AFTER_BYTES)
        malloc_trim(0);
#endif
}

static void handle_message(struct coordinator *c, size_t *received_bytes)
{
    uint8_t identity[PROTOCOL_IDENTITY_MAX];
    size_t identity_size = 0;
    int fd = -1;
    /* A connection that dropped loses its requests before a message of a
     * newcomer (perhaps under the same routing id) is read. */
    intake_watch_connections(c);
    zmq_msg_t part;
    if (zmq_msg_init(&part) != 0)
        return;
    int n_parts = 0;
    size_t payload_bytes = 0;
    char *payload = NULL;
    bool oversized = false;
    char oversized_id[REQUEST_ID_MAX + 1] = "";
    int more = 1;
    while (more) {
        if (zmq_msg_recv(&part, c->clients, ZMQ_DONTWAIT) < 0) {
            if (zmq_errno() != EAGAIN)
                LOG_WARN("client socket: zmq_msg_recv: %s", zmq_strerror(zmq_errno()));
            break;
        }
        more = zmq_msg_more(&part);
        size_t size = zmq_msg_size(&part);
        *received_bytes += size;
        /* The ROUTER makes the routing-id frame itself: the source
         * descriptor is on the frames that came from the peer. */
        if (n_parts == 1)
            fd = zmq_msg_get(&part, ZMQ_SRCFD);
        if (n_parts == 0) {
            identity_size = size < sizeof(identity) ? size : sizeof(identity);
            memcpy(identity, zmq_msg_data(&part), identity_size);
        } else if (size > 0 && payload == NULL && !oversized) {
            /* The first non-empty frame is the message (an empty REQ-style delimiter is skipped). */
            if (size > c->max_message_bytes) {
                oversized = true;
                payload_bytes = size;
                /* too large to parse, not to answer by its id: a gateway
                 * waiting on that id learns at once */
                request_peek_id_text(zmq_msg_data(&part), size, oversized_id, sizeof oversized_id);
            } else if ((payload = malloc(size + 1)) != NULL) {
                memcpy(payload, zmq_msg_data(&part), size);
                payload[size] = '\0';
                payload_bytes = size;
            }
        } else if (size > 0) {
            oversized = oversized || payload != NULL; /* more than one frame */
        }
        n_parts++;
    }
    zmq_msg_close(&part);
    if (n_parts < 2) {
        free(payload);
        return;
    }
    /* A connection accepted or dropped on this descriptor number since the
     * events were last read: the message may be the old connection's or the
     * new one's, so it is bound to neither. The sender (if alive) is told. */
    c->n_conn_drops += connections_update(c->conns);
    if (connections_changed(c->conns, fd)) {
        c->metrics.requests_total++;
        replies_error(c, identity, identity_size, "", METRICS_ERR_INTERNAL,
                      "the connection changed while this message was read; send it again");
        free(payload);
        return;
    }
    struct conn_ref conn = connections_ref(c->conns, fd);
    c->answering.active = true;
    c->answering.identity = identity;
    c->answering.identity_size = identity_size;
    c->answering.conn = conn;
    if (oversized) {
        char m[160];
        snprintf(m, sizeof(m), "message too large or in several frames: %zu bytes, at most %zu in one frame",
                 payload_bytes, c->max_message_bytes);
        c->metrics.requests_total++;
        if (payload != NULL) /* its first frame was the message, the rest too many */
            request_peek_id_text(payload, payload_bytes, oversized_id, sizeof oversized_id);
        replies_error(c, identity, identity_size, oversized_id, METRICS_ERR_INVALID_REQUEST, m);
        free(payload);
        return;
    }
    intake_dispatch(c, identity, identity_size, conn, payload, payload ? payload_bytes : 0);
    free(payload);
}

void intake_dispatch(struct coordinator *c, const uint8_t *identity, size_t identity_size, struct conn_ref conn,
                     const char *payload, size_t payload_bytes)
{
    char err[ERR_MSG_MAX] = "";
    cJSON *root = NULL;
    enum request_kind kind = REQUEST_KIND_GENERATE;
    int rc = request_parse_envelope(payload, payload_bytes, &root, &kind, err);
    if (rc != 0) {
        c->metrics.requests_total++;
        replies_error(c, identity, identity_size, request_peek_id(root), METRICS_ERR_INVALID_REQUEST, err);
        cJSON_Delete(root);
        return;
    }
    if (kind == REQUEST_KIND_STATS)
        on_stats(c, identity, identity_size, root);
    else if (kind == REQUEST_KIND_CANCEL)
        on_cancel(c, identity, identity_size, root);
    else
        on_generate(c, identity, identity_size, conn, root);
    cJSON_Delete(root);
}
