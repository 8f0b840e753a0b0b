/* coordinator.c: poll loop, worker registry, admission and round scheduling.
 *
 * Scheduling, per sequence (H = history, n tokens; see coordinator.h for the
 * cache invariants):
 *   admit:   prefill {prompt} to the draft and verify {k=0, feed=prompt} to
 *            the target at the same time.
 *   round:   K from the sequence's controller (fixed when the request or the
 *            config sets it). K = 0 or no draft: verify {k=0, feed=[H[n-1]]}.
 *            Otherwise draft {keep=draft_valid, feed=H[draft_valid..n), k,
 *            predraft_k} into half 0; on draft_ready, verify {keep=n-1,
 *            feed=[H[n-1]], k, half 0}. Meanwhile the draft worker pre-drafts
 *            the next round into half 1, assuming all k accepted, with its
 *            guess b' of the bonus token. On verify_done with all k accepted
 *            and bonus == b' the pre-draft is verified at once (from half 1,
 *            past the guess); otherwise it is dropped and the next
 *            draft call rolls the draft back through keep_len.
 * Workers handle their messages in order, so commands may be queued behind
 * each other: while the target verifies one sequence the draft drafts
 * another. A reply is used only if it matches what the sequence waits for
 * (request id, slot, round); anything else is stale and dropped.
 *
 * Halves: fresh drafts always go to half 0 and pre-drafts to half 1. A
 * fresh draft is sent only when no verification of that sequence is in
 * flight, and a pre-draft is written while the target reads half 0, so the
 * draft never writes a half the target is reading.
 */
#include "coordinator.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "chat_template.h"
#include "error.h"
#include "logging.h"
#include "metrics.h"
#include "output.h"
#include "protocol.h"
#include "request.h"
#include "sampling.h"
#include "adaptive_k.h"
#include "tokenizer.h"

#define COORD_EOS_MAX 8
#define COORD_HALF_FRESH 0
#define COORD_HALF_PREDRAFT 1
#define COORD_DRAFT_ERRORS_MAX 3
/* Hard cap on one client message (ZMQ_MAXMSGSIZE) as a multiple of
 * max_message_bytes: between the two the client gets an error reply, past
 * it ZeroMQ drops the connection. */
#define COORD_HARD_MESSAGE_FACTOR 16
/* Seeds travel as JSON numbers between processes: exact up to 2^53. */
#define COORD_SEED_MAX ((1ull << 53) - 1)

enum worker_role { ROLE_DRAFT = 0, ROLE_TARGET = 1 };
static const char *const role_names[2] = {"draft", "target"};

struct worker {
    bool up;                 /* registered and welcomed */
    bool held;               /* draft registered before the target: waiting */
    uint8_t identity[PROTOCOL_IDENTITY_MAX];
    size_t identity_size;
    int pid;
    char model[PROC_CONFIG_PATH_MAX];
    char backend[PROC_CONFIG_NAME_MAX];
    int vocab_size;
    int32_t eos_ids[COORD_EOS_MAX];
    int n_eos;
    int max_seq_len;
    int n_slots;
    int bos_id;
    cJSON *shm;              /* draft's shared-buffer descriptor (owned) */
    char shm_name[256];
    double last_seen_ms;
    uint64_t gen;            /* bumped at each registration */
};

enum seq_state {
    SEQ_FREE = 0,
    SEQ_QUEUED,
    SEQ_ACTIVE,
};

struct seq {
    enum seq_state state;
    uint64_t req;            /* coordinator-wide request number */
    int slot;
    uint8_t client[PROTOCOL_IDENTITY_MAX];
    size_t client_size;
    char id[REQUEST_ID_MAX + 1];
    bool stream;
    int max_tokens;
    struct sampling_params sp;
    enum speculate_mode mode;
    struct adaptive_k kc;
    bool spec_off;           /* draft errors: target-only for this sequence */
    int draft_errors;

    int32_t *hist;           /* prompt + generated */
    int n_hist, cap_hist, n_prompt;
    int generated;
    int target_len;
    int draft_valid;
    uint64_t draft_gen;      /* draft registration the draft_valid refers to */
    struct output *out;
    int stream_from;         /* first generated index not yet streamed */

    /* in flight */
    bool prefilled;          /* the target's prefill answered */
    bool wait_target;
    int verify_round, verify_k, verify_L, verify_cached, verify_keep, verify_feed;
    bool verify_from_draft;
    double verify_sent_ms;
    bool wait_draft;
    int draft_round, draft_k, draft_predraft_k;
    double draft_sent_ms;
    double last_draft_ms;    /* measured for the K controller */
    double verify_done_ms;   /* when the target last finished a verification of this sequence */
    int draft_n_feed;        /* tokens the current draft call catches up on */
    bool predraft_expected;  /* a pre-draft will arrive (round > draft_round) */
    bool predraft_have;
    bool wait_predraft;      /* all drafts accepted: decide when it arrives */
    int predraft_round, predraft_k, predraft_half;
    int32_t predraft_guess;
    int32_t pending_bonus;   /* bonus token while waiting for the pre-draft */
    int round_counter;

    /* stats */
    double t_arrival_ms, t_admit_ms, t_first_ms;
    int rounds, drafted, accepted, predraft_offered, predraft_used;
    double draft_ms, verify_ms;
    struct seq *next_queued; /* FIFO of queued sequences */
};

struct coordinator {
    struct proc_config cfg;
    /* adaptive-K state of the current draft/target pair: each sequence
     * starts from it and hands its final state back (reset when a worker
     * changes, since costs and acceptance belong to the pair) */
    struct adaptive_k k_history;
    bool k_history_valid;
    void *zctx;
    void *clients;
    void *workers;
    struct tokenizer *tk;    /* NULL: no tokenizer.json */
    struct worker worker[2];
    uint64_t draft_gen;
    struct seq *seqs;        /* cfg.max_concurrency active + max_queue queued */
    int n_seqs;
    int n_active, n_queued;
    struct seq *queue_head, *queue_tail;
    uint64_t next_req;
    enum speculate_mode default_mode;
    struct metrics metrics;
    double t_start_ms;
    double last_heartbeat_ms;
    uint64_t rng_state;
    size_t max_message_bytes;
    int target_outstanding;      /* verifies sent, not yet answered */
    double target_idle_since_ms; /* < 0: not idle (or unknown) */
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1000.0 + (double)ts.tv_nsec / 1e6;
}

static uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* ------------------------------------------------------------------ */
/* Client replies                                                      */

static void client_send(struct coordinator *c, const uint8_t *identity, size_t identity_size, const cJSON *msg)
{
    char err[ERR_MSG_MAX];
    if (identity_size == 0)
        return;
    if (protocol_send(c->clients, identity, identity_size, msg, NULL, 0, PROTOCOL_DONTWAIT, err) != 0)
        LOG_WARN("reply to client dropped: %s", err);
}

static void client_error(struct coordinator *c, const uint8_t *identity, size_t identity_size, const char *id,
                         enum metrics_error code, const char *message)
{
    c->metrics.requests_failed[code]++;
    cJSON *m = cJSON_CreateObject();
    if (m == NULL)
        return;
    cJSON_AddStringToObject(m, "type", "error");
    cJSON_AddStringToObject(m, "id", id ? id : "");
    cJSON_AddStringToObject(m, "code", metrics_error_name(code));
    cJSON_AddStringToObject(m, "message", message);
    client_send(c, identity, identity_size, m);
    cJSON_Delete(m);
    LOG_INFO("request \"%s\": %s: %s", id ? id : "", metrics_error_name(code), message);
}

static cJSON *ids_array(const int32_t *ids, int n)
{
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a != NULL && i < n; i++) {
        cJSON *v = cJSON_CreateNumber(ids[i]);
        if (v == NULL || !cJSON_AddItemToArray(a, v)) {
            cJSON_Delete(v);
            cJSON_Delete(a);
            return NULL;
        }
    }
    return a;
}

/* Adds a string that may contain NUL bytes (cut there: JSON strings from
 * cJSON are C strings; detokenized text with NUL is rare and not printable). */
static void add_text(cJSON *m, const char *key, const char *text, size_t len)
{
    char *copy = malloc(len + 1);
    if (copy == NULL)
        return;
    memcpy(copy, text, len);
    copy[len] = '\0';
    cJSON_AddStringToObject(m, key, copy);
    free(copy);
}

/* ------------------------------------------------------------------ */
/* Worker messages                                                     */

static int worker_send(struct coordinator *c, enum worker_role role, cJSON *hdr, const int32_t *tokens, int n_tokens)
{
    char err[ERR_MSG_MAX];
    struct worker *w = &c->worker[role];
    struct protocol_frame frame = {.data = tokens, .size_bytes = (size_t)n_tokens * sizeof(int32_t)};
    int rc = protocol_send(c->workers, w->identity, w->identity_size, hdr, tokens ? &frame : NULL,
                           tokens ? 1 : 0, PROTOCOL_DONTWAIT, err);
    if (rc != 0)
        LOG_WARN("%s worker: send %s failed: %s", role_names[role],
                 cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(hdr, "type")), err);
    cJSON_Delete(hdr);
    return rc;
}

static cJSON *sampling_json(const struct seq *s)
{
    cJSON *o = cJSON_CreateObject();
    if (o == NULL)
        return NULL;
    cJSON_AddNumberToObject(o, "temperature", s->sp.temperature);
    cJSON_AddNumberToObject(o, "top_k", s->sp.top_k);
    cJSON_AddNumberToObject(o, "top_p", s->sp.top_p);
    cJSON_AddNumberToObject(o, "min_p", s->sp.min_p);
    cJSON_AddNumberToObject(o, "seed", (double)s->sp.seed);  /* <= COORD_SEED_MAX: exact */
    return o;
}

static cJSON *seq_header(const struct seq *s, const char *type, bool with_sampling)
{
    cJSON *h = protocol_header_new(type);
    if (h == NULL)
        return NULL;
    cJSON_AddNumberToObject(h, "req", (double)s->req);
    cJSON_AddNumberToObject(h, "slot", s->slot);
    if (with_sampling) {
        cJSON *sp = sampling_json(s);
        if (sp != NULL)
            cJSON_AddItemToObject(h, "sampling", sp);
        cJSON_AddStringToObject(h, "mode", s->mode == SPECULATE_MODE_POINT_MASS ? "point_mass" : "sampled");
    }
    return h;
}

static bool draft_usable(const struct coordinator *c, const struct seq *s)
{
    const struct worker *d = &c->worker[ROLE_DRAFT];
    return d->up && !s->spec_off && s->slot < d->n_slots;
}

static int ctx_len(const struct coordinator *c)
{
    return c->worker[ROLE_TARGET].max_seq_len;
}

/* ------------------------------------------------------------------ */
/* Sequence lifecycle                                                  */

static void seq_reset(struct seq *s)
{
    output_destroy(s->out);
    free(s->hist);
    int slot = s->slot;
    memset(s, 0, sizeof(*s));
    s->slot = slot;
    s->state = SEQ_FREE;
}

static void send_release(struct coordinator *c, struct seq *s)
{
    for (int r = 0; r < 2; r++) {
        if (!c->worker[r].up)
            continue;
        cJSON *h = seq_header(s, PROTOCOL_RELEASE, false);
        if (h != NULL)
            worker_send(c, (enum worker_role)r, h, NULL, 0);
    }
}

static void try_admit_queued(struct coordinator *c);
static void seq_start(struct coordinator *c, struct seq *s);

static void queue_remove(struct coordinator *c, struct seq *s)
{
    struct seq **pp = &c->queue_head;
    struct seq *prev = NULL;
    while (*pp != NULL && *pp != s) {
        prev = *pp;
        pp = &(*pp)->next_queued;
    }
    if (*pp == NULL)
        return;
    *pp = s->next_queued;
    if (c->queue_tail == s)
        c->queue_tail = prev;
    s->next_queued = NULL;
    c->n_queued--;
}

/* Ends a sequence with an error reply (code) and frees its slot. */
static void seq_fail(struct coordinator *c, struct seq *s, enum metrics_error code, const char *message)
{
    client_error(c, s->client, s->client_size, s->id, code, message);
    if (s->state == SEQ_ACTIVE) {
        send_release(c, s);
        c->n_active--;
    } else if (s->state == SEQ_QUEUED) {
        queue_remove(c, s);
    }
    seq_reset(s);
}

static void seq_finish(struct coordinator *c, struct seq *s, enum metrics_finish reason)
{
    double t = now_ms();
    if (s->kc.rounds_observed > 0) {
        c->k_history = s->kc;
        c->k_history_valid = true;
    }
    char err[ERR_MSG_MAX];
    bool stopped = false;
    if (output_finish(s->out, &stopped, err) != 0)
        LOG_WARN("request \"%s\": detokenizer: %s", s->id, err);
    if (stopped)
        reason = METRICS_FINISH_STOP_STRING;
    size_t text_len = 0;
    const char *text = output_text(s->out, &text_len);
    if (s->stream) {
        size_t n = 0;
        const char *piece = output_take_stream(s->out, true, &n);
        if (n > 0 || s->stream_from < s->generated) {
            cJSON *m = cJSON_CreateObject();
            if (m != NULL) {
                cJSON_AddStringToObject(m, "type", "token");
                cJSON_AddStringToObject(m, "id", s->id);
                add_text(m, "text", piece, n);
                cJSON *ids = ids_array(s->hist + s->n_prompt + s->stream_from, s->generated - s->stream_from);
                if (ids != NULL)
                    cJSON_AddItemToObject(m, "ids", ids);
                client_send(c, s->client, s->client_size, m);
                cJSON_Delete(m);
            }
            s->stream_from = s->generated;
        }
    }
    double prefill_ms = s->t_first_ms - s->t_admit_ms;
    double decode_ms = t - s->t_first_ms;
    double queue_ms = s->t_admit_ms - s->t_arrival_ms;
    cJSON *m = cJSON_CreateObject();
    if (m != NULL) {
        cJSON_AddStringToObject(m, "type", "done");
        cJSON_AddStringToObject(m, "id", s->id);
        add_text(m, "text", text, text_len);
        cJSON *ids = ids_array(s->hist + s->n_prompt, s->generated);
        if (ids != NULL)
            cJSON_AddItemToObject(m, "ids", ids);
        cJSON_AddStringToObject(m, "finish_reason", metrics_finish_name(reason));
        cJSON *u = cJSON_AddObjectToObject(m, "usage");
        if (u != NULL) {
            cJSON_AddNumberToObject(u, "prompt_tokens", s->n_prompt);
            cJSON_AddNumberToObject(u, "generated_tokens", s->generated);
        }
        cJSON *tm = cJSON_AddObjectToObject(m, "timing");
        if (tm != NULL) {
            cJSON_AddNumberToObject(tm, "queue_ms", queue_ms);
            cJSON_AddNumberToObject(tm, "prefill_ms", prefill_ms);
            cJSON_AddNumberToObject(tm, "decode_ms", decode_ms);
            cJSON_AddNumberToObject(tm, "total_ms", t - s->t_arrival_ms);
            /* as tandem-generate: tokens after the first over the decode time */
            cJSON_AddNumberToObject(tm, "tokens_per_s",
                                    decode_ms > 0 && s->generated > 1 ? (s->generated - 1) * 1000.0 / decode_ms : 0.0);
        }
        cJSON *sp = cJSON_AddObjectToObject(m, "spec");
        if (sp != NULL) {
            cJSON_AddNumberToObject(sp, "rounds", s->rounds);
            cJSON_AddNumberToObject(sp, "drafted", s->drafted);
            cJSON_AddNumberToObject(sp, "accepted", s->accepted);
            cJSON_AddNumberToObject(sp, "acceptance_rate", s->drafted ? (double)s->accepted / s->drafted : 0.0);
            cJSON_AddNumberToObject(sp, "mean_accepted_per_round", s->rounds ? (double)s->accepted / s->rounds : 0.0);
            cJSON_AddNumberToObject(sp, "predraft_offered", s->predraft_offered);
            cJSON_AddNumberToObject(sp, "predraft_used", s->predraft_used);
            cJSON_AddNumberToObject(sp, "draft_ms", s->draft_ms);
            cJSON_AddNumberToObject(sp, "verify_ms", s->verify_ms);
        }
        client_send(c, s->client, s->client_size, m);
        cJSON_Delete(m);
    }
    struct metrics *mt = &c->metrics;
    mt->requests_finished[reason]++;
    mt->generated_tokens_total += (uint64_t)s->generated;
    mt->queue_ms_total += queue_ms;
    mt->prefill_ms_total += prefill_ms;
    mt->decode_ms_total += decode_ms;
    LOG_INFO("request \"%s\" (#%llu): %d prompt + %d generated tokens, %s, %d rounds, acceptance %.3f, "
             "pre-draft %d/%d, %.1f ms",
             s->id, (unsigned long long)s->req, s->n_prompt, s->generated, metrics_finish_name(reason), s->rounds,
             s->drafted ? (double)s->accepted / s->drafted : 0.0, s->predraft_used, s->predraft_offered,
             t - s->t_arrival_ms);
    send_release(c, s);
    c->n_active--;
    seq_reset(s);
    try_admit_queued(c);
}

static bool is_eos(const struct coordinator *c, int32_t id)
{
    const struct worker *t = &c->worker[ROLE_TARGET];
    for (int i = 0; i < t->n_eos; i++)
        if (t->eos_ids[i] == id)
            return true;
    return false;
}

/* Positions the sequence may still grow by (see adaptive_k_next). */
static int seq_room(const struct coordinator *c, const struct seq *s)
{
    int by_tokens = s->max_tokens - s->generated;
    int by_ctx = ctx_len(c) - s->n_hist + 1;
    return by_tokens < by_ctx ? by_tokens : by_ctx;
}

static void send_verify(struct coordinator *c, struct seq *s, int k, int half, int round, bool from_draft,
                        int cached_drafts)
{
    cJSON *h = seq_header(s, PROTOCOL_VERIFY, true);
    if (h == NULL) {
        seq_fail(c, s, METRICS_ERR_INTERNAL, "out of memory");
        return;
    }
    s->verify_keep = s->n_hist - 1;
    s->verify_feed = 1;
    cJSON_AddNumberToObject(h, "round", round);
    cJSON_AddNumberToObject(h, "keep_len", s->verify_keep);
    cJSON_AddNumberToObject(h, "k", k);
    cJSON_AddNumberToObject(h, "half", half);
    /* The draft's buffer rides along, so a target that missed an attach
     * (or restarted) can import it. The half's header tells the target where
     * the drafts start (after the guess in a pre-drafted half). */
    const cJSON *shm = c->worker[ROLE_DRAFT].shm;
    if (k > 0 && shm != NULL)
        cJSON_AddItemToObject(h, "shm", cJSON_Duplicate(shm, 1));
    s->wait_target = true;
    s->verify_round = round;
    s->verify_k = k;
    s->verify_L = s->n_hist;
    s->verify_cached = cached_drafts;
    s->verify_from_draft = from_draft;
    s->verify_sent_ms = now_ms();
    if (c->target_outstanding == 0 && c->target_idle_since_ms >= 0) {
        double gap = s->verify_sent_ms - c->target_idle_since_ms;
        c->metrics.target_gap_samples++;
        c->metrics.target_gap_ms_total += gap;
        if (gap > c->metrics.target_gap_ms_max)
            c->metrics.target_gap_ms_max = gap;
    }
    c->target_idle_since_ms = -1;
    c->target_outstanding++;
    worker_send(c, ROLE_TARGET, h, &s->hist[s->n_hist - 1], 1);
}

/* Sends a fresh draft of k tokens (and asks for a pre-draft when useful). */
static void send_draft(struct coordinator *c, struct seq *s, int k, int room)
{
    if (s->draft_gen != c->draft_gen)
        s->draft_valid = 0;
    if (s->draft_valid > s->n_hist - 1)
        s->draft_valid = s->n_hist - 1;
    /* Pre-draft the next round when it fits and no other sequence is queued
     * for the draft (then its time is better spent there). */
    int predraft_k = 0;
    int room_after = room - (k + 1);
    const struct worker *d = &c->worker[ROLE_DRAFT];
    int draft_room = d->max_seq_len - (s->n_hist + k);
    if (room_after > 1 && draft_room > 1) {
        predraft_k = k;
        if (predraft_k > room_after - 1)
            predraft_k = room_after - 1;
        if (predraft_k > draft_room - 1)
            predraft_k = draft_room - 1;
        int busy = 0;
        for (int i = 0; i < c->n_seqs; i++)
            busy += c->seqs[i].state == SEQ_ACTIVE && c->seqs[i].wait_draft;
        if (busy > 0)
            predraft_k = 0;
    }
    cJSON *h = seq_header(s, PROTOCOL_DRAFT, true);
    if (h == NULL) {
        seq_fail(c, s, METRICS_ERR_INTERNAL, "out of memory");
        return;
    }
    s->round_counter += 2;  /* round r for the draft, r + 1 for its pre-draft */
    s->draft_round = s->round_counter - 1;
    s->draft_k = k;
    s->draft_predraft_k = predraft_k;
    cJSON_AddNumberToObject(h, "half", COORD_HALF_FRESH);
    cJSON_AddNumberToObject(h, "round", s->draft_round);
    cJSON_AddNumberToObject(h, "keep_len", s->draft_valid);
    cJSON_AddNumberToObject(h, "k", k);
    cJSON_AddNumberToObject(h, "predraft_k", predraft_k);
    s->wait_draft = true;
    s->predraft_expected = predraft_k > 0;
    s->predraft_have = false;
    s->draft_sent_ms = now_ms();
    s->draft_n_feed = s->n_hist - s->draft_valid;
    s->draft_gen = c->draft_gen;
    worker_send(c, ROLE_DRAFT, h, &s->hist[s->draft_valid], s->n_hist - s->draft_valid);
}

/* Decides and sends the next round of an active sequence that waits for
 * nothing. */
static void seq_advance(struct coordinator *c, struct seq *s)
{
    if (s->state != SEQ_ACTIVE || s->wait_target || s->wait_draft || s->wait_predraft || !s->prefilled)
        return;
    int room = seq_room(c, s);
    if (room <= 0) {
        seq_finish(c, s, METRICS_FINISH_LENGTH);
        return;
    }
    int k = 0;
    if (draft_usable(c, s)) {
        int draft_room = c->worker[ROLE_DRAFT].max_seq_len - s->n_hist + 1;
        k = adaptive_k_next(&s->kc, room < draft_room ? room : draft_room);
    } else {
        c->metrics.target_only_rounds_total++;
    }
    if (k <= 0) {
        send_verify(c, s, 0, COORD_HALF_FRESH, ++s->round_counter, false, 0);
        return;
    }
    send_draft(c, s, k, room);
}

/* Appends accepted tokens; returns true when the sequence ended (reason set). */
static bool seq_accept_tokens(struct coordinator *c, struct seq *s, const int32_t *tokens, int n,
                              enum metrics_finish *reason)
{
    char err[ERR_MSG_MAX];
    for (int i = 0; i < n; i++) {
        if (s->n_hist == s->cap_hist) {
            int cap = s->cap_hist * 2;
            int32_t *h = realloc(s->hist, sizeof(*h) * (size_t)cap);
            if (h == NULL) {
                *reason = METRICS_FINISH_LENGTH;
                return true;
            }
            s->hist = h;
            s->cap_hist = cap;
        }
        s->hist[s->n_hist++] = tokens[i];
        s->generated++;
        bool stopped = false;
        if (output_push(s->out, tokens[i], &stopped, err) != 0)
            LOG_WARN("request \"%s\": detokenizer: %s", s->id, err);
        if (stopped) {
            *reason = METRICS_FINISH_STOP_STRING;
            return true;
        }
        if (is_eos(c, tokens[i])) {
            *reason = METRICS_FINISH_STOP;
            return true;
        }
        if (s->generated >= s->max_tokens || s->n_hist > ctx_len(c)) {
            *reason = METRICS_FINISH_LENGTH;
            return true;
        }
    }
    return false;
}

static void seq_stream(struct coordinator *c, struct seq *s)
{
    if (!s->stream || s->stream_from >= s->generated)
        return;
    size_t n = 0;
    const char *piece = output_take_stream(s->out, false, &n);
    cJSON *m = cJSON_CreateObject();
    if (m == NULL)
        return;
    cJSON_AddStringToObject(m, "type", "token");
    cJSON_AddStringToObject(m, "id", s->id);
    add_text(m, "text", piece, n);
    cJSON *ids = ids_array(s->hist + s->n_prompt + s->stream_from, s->generated - s->stream_from);
    if (ids != NULL)
        cJSON_AddItemToObject(m, "ids", ids);
    client_send(c, s->client, s->client_size, m);
    cJSON_Delete(m);
    s->stream_from = s->generated;
}

/* Uses or drops the pre-draft after a fully accepted round whose bonus is
 * s->pending_bonus (already in the history). */
static void seq_resolve_predraft(struct coordinator *c, struct seq *s)
{
    s->wait_predraft = false;
    if (!s->predraft_have || s->draft_gen != c->draft_gen || !draft_usable(c, s)) {
        seq_advance(c, s);
        return;
    }
    s->predraft_have = false;
    /* The pre-draft fed t_k: the draft now holds everything but the bonus. */
    s->draft_valid = s->n_hist - 1;
    int room = seq_room(c, s);
    if (s->predraft_guess == s->pending_bonus && room > 1) {
        int k = s->predraft_k < room - 1 ? s->predraft_k : room - 1;
        s->predraft_used++;
        c->metrics.predraft_used_total++;
        /* The K controller is charged only the drafting the target waited
         * for: a pre-draft made during the verification cost it nothing. */
        s->last_draft_ms = s->verify_done_ms > 0 && now_ms() > s->verify_done_ms
                               ? now_ms() - s->verify_done_ms
                               : 0.0;
        /* The draft cached the guess and predraft_k - 1 drafts after it. */
        send_verify(c, s, k, s->predraft_half, s->predraft_round, true, s->predraft_k - 1);
        s->draft_valid = s->n_hist; /* the guess equals the bonus: cached too */
        return;
    }
    seq_advance(c, s);
}

/* ------------------------------------------------------------------ */
/* Worker message handlers                                             */

static struct seq *seq_for(struct coordinator *c, const cJSON *h, enum worker_role role, char *err)
{
    int64_t req = 0;
    int slot = 0;
    if (protocol_get_i64(h, "req", 0, INT64_MAX, &req, err) != 0 ||
        protocol_get_int(h, "slot", 0, c->n_seqs > 0 ? c->n_seqs - 1 : 0, &slot, err) != 0)
        return NULL;
    for (int i = 0; i < c->n_seqs; i++) {
        struct seq *s = &c->seqs[i];
        if (s->state == SEQ_ACTIVE && s->req == (uint64_t)req && s->slot == slot)
            return s;
    }
    snprintf(err, ERR_MSG_MAX, "req %lld slot %d: no such active request (finished or stale)", (long long)req, slot);
    (void)role;
    return NULL;
}

static void on_verify_done(struct coordinator *c, const struct protocol_msg *msg)
{
    char err[ERR_MSG_MAX] = "";
    struct seq *s = seq_for(c, msg->header, ROLE_TARGET, err);
    if (s == NULL) {
        LOG_DEBUG("target verify_done dropped: %s", err);
        return;
    }
    s->verify_done_ms = now_ms();
    int round = 0, n_acc = 0, n_tok = 0;
    double verify_ms = 0, idle_ms = -1;
    const int32_t *tokens = NULL;
    int vocab = c->worker[ROLE_TARGET].vocab_size;
    if (protocol_get_int(msg->header, "round", 0, INT32_MAX, &round, err) != 0 || !s->wait_target ||
        round != s->verify_round) {
        LOG_DEBUG("target verify_done for \"%s\" dropped: %s", s->id, err[0] ? err : "not the awaited round");
        return;
    }
    if (protocol_get_int(msg->header, "n_accepted", 0, s->verify_k, &n_acc, err) != 0 ||
        protocol_get_double_opt(msg->header, "verify_ms", 0, 1e12, 0, &verify_ms, err) != 0 ||
        protocol_get_double_opt(msg->header, "idle_ms", -1, 1e12, -1, &idle_ms, err) != 0 ||
        protocol_frame_tokens(msg, 0, "tokens", n_acc + 1, n_acc + 1, &tokens, &n_tok, err) != 0) {
        LOG_ERROR("target verify_done for \"%s\" is malformed: %s", s->id, err);
        seq_fail(c, s, METRICS_ERR_INTERNAL, "the target worker sent a malformed reply");
        return;
    }
    for (int i = 0; i < n_tok; i++) {
        if (tokens[i] < 0 || tokens[i] >= vocab) {
            LOG_ERROR("target verify_done for \"%s\": token %d out of the vocabulary", s->id, tokens[i]);
            seq_fail(c, s, METRICS_ERR_INTERNAL, "the target worker sent a token outside the vocabulary");
            return;
        }
    }
    s->wait_target = false;
    struct metrics *mt = &c->metrics;
    if (idle_ms >= 0) {
        mt->target_idle_samples++;
        mt->target_idle_ms_total += idle_ms;
        if (idle_ms > mt->target_idle_ms_max)
            mt->target_idle_ms_max = idle_ms;
    }
    mt->verify_ms_total += verify_ms;
    s->verify_ms += verify_ms;
    int k = s->verify_k;
    if (!s->prefilled) {
        s->prefilled = true;
        s->t_first_ms = now_ms();
        s->target_len = s->n_prompt;
    } else {
        s->rounds++;
        mt->verify_rounds_total++;
        s->target_len = s->verify_keep + s->verify_feed + n_acc;
        if (k > 0) {
            s->drafted += k;
            s->accepted += n_acc;
            mt->num_drafts_total++;
            mt->num_draft_tokens_total += (uint64_t)k;
            mt->num_accepted_tokens_total += (uint64_t)n_acc;
            for (int i = 0; i < n_acc && i < METRICS_POS_MAX; i++)
                mt->accepted_per_pos[i]++;
            adaptive_k_update(&s->kc, k, n_acc, s->last_draft_ms, verify_ms);
        }
    }
    if (k > 0 && s->verify_from_draft && s->draft_gen == c->draft_gen) {
        int cached = s->verify_cached < n_acc ? s->verify_cached : n_acc;
        s->draft_valid = s->verify_L + cached;
    }
    enum metrics_finish reason = METRICS_FINISH_STOP;
    bool ended = seq_accept_tokens(c, s, tokens, n_tok, &reason);
    seq_stream(c, s);
    if (ended) {
        seq_finish(c, s, reason);
        return;
    }
    if (k > 0 && n_acc == k && s->predraft_expected && s->verify_from_draft) {
        s->pending_bonus = tokens[n_acc];
        s->predraft_expected = false;
        if (s->predraft_have) {
            seq_resolve_predraft(c, s);
        } else {
            s->wait_predraft = true;  /* it is on its way: the draft handles messages in order */
        }
        return;
    }
    s->predraft_have = false;
    s->predraft_expected = false;
    s->wait_predraft = false;
    seq_advance(c, s);
}

static void on_draft_ready(struct coordinator *c, const struct protocol_msg *msg)
{
    char err[ERR_MSG_MAX] = "";
    struct seq *s = seq_for(c, msg->header, ROLE_DRAFT, err);
    if (s == NULL) {
        LOG_DEBUG("draft draft_ready dropped: %s", err);
        return;
    }
    int round = 0, half = 0, k = 0, guess = -1;
    bool predraft = false;
    double draft_ms = -1;
    if (protocol_get_int(msg->header, "round", 0, INT32_MAX, &round, err) != 0 ||
        protocol_get_int(msg->header, "half", 0, 1, &half, err) != 0 ||
        protocol_get_int(msg->header, "k", 0, SPECULATE_K_MAX + 1, &k, err) != 0 ||
        protocol_get_int_opt(msg->header, "guess", -1, c->worker[ROLE_TARGET].vocab_size - 1, -1, &guess, err) != 0 ||
        protocol_get_bool_opt(msg->header, "predraft", false, &predraft, err) != 0 ||
        protocol_get_double_opt(msg->header, "draft_ms", -1, 1e12, -1, &draft_ms, err) != 0) {
        LOG_ERROR("draft draft_ready for \"%s\" is malformed: %s", s->id, err);
        return;
    }
    if (draft_ms >= 0) {
        c->metrics.draft_ms_total += draft_ms;
        s->draft_ms += draft_ms;
    }
    if (predraft) {
        if (round <= s->draft_round || round > s->round_counter || (!s->predraft_expected && !s->wait_predraft)) {
            LOG_DEBUG("draft pre-draft for \"%s\" round %d dropped (stale)", s->id, round);
            return;
        }
        /* k counts the drafts after the guess; tolerate workers that count the guess too. */
        int pk = k;
        if (pk > s->draft_predraft_k)
            pk = s->draft_predraft_k;
        s->predraft_offered++;
        c->metrics.predraft_offered_total++;
        s->predraft_have = pk > 0 && guess >= 0;
        s->predraft_round = round;
        s->predraft_k = pk;
        s->predraft_half = half;
        s->predraft_guess = guess;
        if (s->wait_predraft)
            seq_resolve_predraft(c, s);
        return;
    }
    if (!s->wait_draft || round != s->draft_round) {
        LOG_DEBUG("draft draft_ready for \"%s\" round %d dropped (stale)", s->id, round);
        return;
    }
    if (k != s->draft_k) {
        LOG_ERROR("draft draft_ready for \"%s\": k %d, asked for %d", s->id, k, s->draft_k);
        s->wait_draft = false;
        s->draft_valid = 0;
        s->predraft_expected = false;
        seq_advance(c, s);
        return;
    }
    s->wait_draft = false;
    s->last_draft_ms = draft_ms >= 0 ? draft_ms : now_ms() - s->draft_sent_ms;
    /* Catching up on tokens the draft skipped (rounds at K = 0, a restart)
     * is a one-off: the K controller wants the cost of drafting itself. */
    if (s->draft_n_feed > 1)
        s->last_draft_ms *= (double)k / (double)(k + s->draft_n_feed - 1);
    s->draft_valid = s->n_hist + k - 1;
    send_verify(c, s, k, half, round, true, k - 1);
}

static void on_prefill_done(struct coordinator *c, const struct protocol_msg *msg)
{
    char err[ERR_MSG_MAX] = "";
    struct seq *s = seq_for(c, msg->header, ROLE_DRAFT, err);
    if (s == NULL) {
        LOG_DEBUG("draft prefill_done dropped: %s", err);
        return;
    }
    double ms = 0;
    if (protocol_get_double_opt(msg->header, "prefill_ms", 0, 1e12, 0, &ms, err) == 0)
        LOG_DEBUG("request \"%s\": draft prefill %.1f ms", s->id, ms);
}

/* Drops everything the sequence expected from the draft (its cache, a
 * pending draft or pre-draft) and, if it was waiting for one, moves it on. */
static void seq_forget_draft(struct coordinator *c, struct seq *s)
{
    s->draft_valid = 0;
    s->predraft_expected = false;
    s->predraft_have = false;
    if (s->wait_draft || s->wait_predraft) {
        s->wait_draft = false;
        s->wait_predraft = false;
        seq_advance(c, s);
    }
}

static void on_worker_error(struct coordinator *c, enum worker_role role, const struct protocol_msg *msg)
{
    char err[ERR_MSG_MAX] = "";
    const char *code = "", *message = "";
    protocol_get_string_opt(msg->header, "code", 64, "", &code, err);
    protocol_get_string_opt(msg->header, "message", 1024, "", &message, err);
    struct seq *s = seq_for(c, msg->header, role, err);
    if (s == NULL) {
        LOG_WARN("%s worker error (no active request): %s: %s", role_names[role], code, message);
        return;
    }
    LOG_WARN("%s worker error for request \"%s\": %s: %s", role_names[role], s->id, code, message);
    if (role == ROLE_TARGET) {
        bool ctx = strcmp(code, "context_full") == 0;
        seq_fail(c, s, ctx ? METRICS_ERR_CONTEXT_FULL : METRICS_ERR_INTERNAL,
                 ctx ? "the sequence no longer fits the target's context" : "the target worker failed this request");
        return;
    }
    /* Draft trouble never fails a request: fall back to a full re-feed, and
     * to target-only decoding if it keeps failing. */
    if (++s->draft_errors >= COORD_DRAFT_ERRORS_MAX)
        s->spec_off = true;
    seq_forget_draft(c, s);
}

/* The draft is gone (timeout, refusal, re-registration). */
static void draft_lost(struct coordinator *c, const char *why)
{
    c->k_history_valid = false;
    struct worker *d = &c->worker[ROLE_DRAFT];
    if (!d->up && !d->held)
        return;
    bool was_up = d->up;
    LOG_WARN("draft worker pid %d %s; continuing target-only until a draft registers", d->pid, why);
    if (was_up)
        c->metrics.worker_losses[ROLE_DRAFT]++;
    /* A crashed owner cannot unlink its segment: do it for it. */
    if (d->shm_name[0] != '\0' && d->pid > 0 && kill(d->pid, 0) != 0 && errno == ESRCH) {
        if (shm_unlink(d->shm_name) == 0)
            LOG_INFO("removed the dead draft's shared segment %s", d->shm_name);
    }
    cJSON_Delete(d->shm);
    memset(d, 0, sizeof(*d));
    c->draft_gen++;
    if (!was_up)
        return;
    for (int i = 0; i < c->n_seqs; i++) {
        struct seq *s = &c->seqs[i];
        if (s->state == SEQ_ACTIVE)
            seq_forget_draft(c, s);
    }
}

static void target_lost(struct coordinator *c, const char *why)
{
    c->k_history_valid = false;
    struct worker *t = &c->worker[ROLE_TARGET];
    if (!t->up)
        return;
    LOG_ERROR("target worker pid %d %s; failing its requests with target_unavailable", t->pid, why);
    c->metrics.worker_losses[ROLE_TARGET]++;
    memset(t, 0, sizeof(*t));
    c->target_outstanding = 0;
    c->target_idle_since_ms = -1;
    for (int i = 0; i < c->n_seqs; i++) {
        struct seq *s = &c->seqs[i];
        if (s->state != SEQ_FREE)
            seq_fail(c, s, METRICS_ERR_TARGET_UNAVAILABLE, "the target worker stopped responding");
    }
}

static void send_welcome(struct coordinator *c, enum worker_role role)
{
    cJSON *h = protocol_header_new(PROTOCOL_WELCOME);
    if (h == NULL)
        return;
    cJSON_AddStringToObject(h, "role", role_names[role]);
    cJSON_AddNumberToObject(h, "heartbeat_ms", c->cfg.coordinator.heartbeat_ms);
    const struct worker *d = &c->worker[ROLE_DRAFT];
    if (role == ROLE_TARGET && d->up && d->shm != NULL)
        cJSON_AddItemToObject(h, "shm", cJSON_Duplicate(d->shm, 1));
    worker_send(c, role, h, NULL, 0);
}

static void send_refused(struct coordinator *c, const uint8_t *identity, size_t identity_size, const char *message)
{
    char err[ERR_MSG_MAX];
    cJSON *h = protocol_header_new(PROTOCOL_REFUSED);
    if (h == NULL)
        return;
    cJSON_AddStringToObject(h, "message", message);
    if (protocol_send(c->workers, identity, identity_size, h, NULL, 0, PROTOCOL_DONTWAIT, err) != 0)
        LOG_WARN("refusal not sent: %s", err);
    cJSON_Delete(h);
}

/* Tells the target where the draft's shared buffer is. */
static void send_attach(struct coordinator *c)
{
    struct worker *d = &c->worker[ROLE_DRAFT];
    if (!c->worker[ROLE_TARGET].up || !d->up || d->shm == NULL)
        return;
    cJSON *h = protocol_header_new(PROTOCOL_ATTACH);
    cJSON *shm = cJSON_Duplicate(d->shm, 1);
    if (h == NULL || shm == NULL) {
        cJSON_Delete(h);
        cJSON_Delete(shm);
        return;
    }
    cJSON_AddItemToObject(h, "shm", shm);
    worker_send(c, ROLE_TARGET, h, NULL, 0);
}

/* 0 when the draft matches the target; else the reason in why. */
static int check_pair(const struct worker *t, const struct worker *d, char *why, size_t why_size)
{
    if (d->vocab_size != t->vocab_size) {
        snprintf(why, why_size, "draft vocab_size %d differs from the target's %d", d->vocab_size, t->vocab_size);
        return -1;
    }
    bool same = d->n_eos == t->n_eos;
    for (int i = 0; same && i < d->n_eos; i++)
        same = d->eos_ids[i] == t->eos_ids[i];
    if (!same) {
        char a[128] = "", b[128] = "";
        size_t la = 0, lb = 0;
        for (int i = 0; i < d->n_eos && la < sizeof(a) - 16; i++)
            la += (size_t)snprintf(a + la, sizeof(a) - la, "%s%d", i ? "," : "", d->eos_ids[i]);
        for (int i = 0; i < t->n_eos && lb < sizeof(b) - 16; i++)
            lb += (size_t)snprintf(b + lb, sizeof(b) - lb, "%s%d", i ? "," : "", t->eos_ids[i]);
        snprintf(why, why_size, "draft eos_ids [%s] differ from the target's [%s]", a, b);
        return -1;
    }
    return 0;
}

static void welcome_draft(struct coordinator *c)
{
    struct worker *d = &c->worker[ROLE_DRAFT];
    struct worker *t = &c->worker[ROLE_TARGET];
    char why[400];
    if (check_pair(t, d, why, sizeof(why)) != 0) {
        LOG_ERROR("refusing draft worker pid %d (%s): %s", d->pid, d->model, why);
        c->metrics.draft_refusals++;
        send_refused(c, d->identity, d->identity_size, why);
        cJSON_Delete(d->shm);
        memset(d, 0, sizeof(*d));
        return;
    }
    d->held = false;
    d->up = true;
    d->last_seen_ms = now_ms();
    c->draft_gen++;
    d->gen = c->draft_gen;
    c->metrics.worker_registrations[ROLE_DRAFT]++;
    LOG_INFO("draft worker pid %d registered: %s, %s, vocab %d, %d slots, max_seq_len %d", d->pid, d->model,
             d->backend, d->vocab_size, d->n_slots, d->max_seq_len);
    send_welcome(c, ROLE_DRAFT);
    send_attach(c);
}

static void on_register(struct coordinator *c, const struct protocol_msg *msg)
{
    char err[ERR_MSG_MAX] = "";
    const cJSON *h = msg->header;
    const char *role_s = NULL, *model = "", *backend = "";
    struct worker w;
    memset(&w, 0, sizeof(w));
    int rc = protocol_get_string(h, "role", 16, &role_s, err);
    enum worker_role role = ROLE_DRAFT;
    if (rc == 0) {
        if (strcmp(role_s, "draft") == 0)
            role = ROLE_DRAFT;
        else if (strcmp(role_s, "target") == 0)
            role = ROLE_TARGET;
        else
            rc = error_set(err, ERR_PROTOCOL, "role: expected \"draft\" or \"target\", got \"%.16s\"", role_s);
    }
    if (rc == 0)
        rc = protocol_get_int(h, "pid", 1, INT32_MAX, &w.pid, err);
    if (rc == 0)
        rc = protocol_get_string_opt(h, "model", sizeof(w.model) - 1, "", &model, err);
    if (rc == 0)
        rc = protocol_get_string_opt(h, "backend", sizeof(w.backend) - 1, "", &backend, err);
    if (rc == 0)
        rc = protocol_get_int(h, "vocab_size", 1, INT32_MAX, &w.vocab_size, err);
    if (rc == 0)
        rc = protocol_get_int_array(h, "eos_ids", 0, INT32_MAX, w.eos_ids, COORD_EOS_MAX, &w.n_eos, err);
    if (rc == 0)
        rc = protocol_get_int(h, "max_seq_len", 2, INT32_MAX, &w.max_seq_len, err);
    if (rc == 0)
        rc = protocol_get_int(h, "n_slots", 1, 65536, &w.n_slots, err);
    if (rc == 0)
        rc = protocol_get_int_opt(h, "bos_id", -1, INT32_MAX, -1, &w.bos_id, err);
    const cJSON *shm = NULL;
    if (rc == 0 && role == ROLE_DRAFT)
        rc = protocol_get_object(h, "shm", &shm, err);
    if (rc == 0 && shm != NULL) {
        const char *name = "";
        if (protocol_get_string_opt(shm, "shm.name", sizeof(w.shm_name) - 1, "", &name, err) == 0)
            snprintf(w.shm_name, sizeof(w.shm_name), "%s", name);
    }
    if (rc != 0) {
        LOG_ERROR("refusing a worker registration: %s", err);
        send_refused(c, msg->identity, msg->identity_size, err);
        return;
    }
    /* A worker repeats register until it is welcomed (its first one may
     * leave before the connection is up): a repeat from the same process is
     * answered again, never taken for a restart. */
    struct worker *known = &c->worker[role];
    if ((known->up || known->held) && known->pid == w.pid &&
        strcmp(known->shm_name, w.shm_name) == 0) {
        memcpy(known->identity, msg->identity, msg->identity_size);
        known->identity_size = msg->identity_size;
        known->last_seen_ms = now_ms();
        if (known->up) {
            send_welcome(c, role);
            if (role == ROLE_DRAFT)
                send_attach(c);
        }
        return;
    }
    snprintf(w.model, sizeof(w.model), "%s", model);
    snprintf(w.backend, sizeof(w.backend), "%s", backend);
    memcpy(w.identity, msg->identity, msg->identity_size);
    w.identity_size = msg->identity_size;
    w.last_seen_ms = now_ms();
    if (shm != NULL && (w.shm = cJSON_Duplicate(shm, 1)) == NULL) {
        LOG_ERROR("draft registration: out of memory");
        return;
    }

    if (role == ROLE_TARGET) {
        if (c->worker[ROLE_TARGET].up)
            target_lost(c, "registered again (restarted)");
        w.up = true;
        c->worker[ROLE_TARGET] = w;
        c->metrics.worker_registrations[ROLE_TARGET]++;
        LOG_INFO("target worker pid %d registered: %s, %s, vocab %d, %d slots, max_seq_len %d", w.pid, w.model,
                 w.backend, w.vocab_size, w.n_slots, w.max_seq_len);
        send_welcome(c, ROLE_TARGET);
        struct worker *d = &c->worker[ROLE_DRAFT];
        if (d->held) {
            welcome_draft(c);
        } else if (d->up) {
            char why[400];
            if (check_pair(&c->worker[ROLE_TARGET], d, why, sizeof(why)) != 0) {
                LOG_ERROR("dropping draft worker pid %d (%s): %s", d->pid, d->model, why);
                send_refused(c, d->identity, d->identity_size, why);
                c->metrics.draft_refusals++;
                draft_lost(c, "does not match the new target");
            } else {
                send_attach(c);
            }
        }
        return;
    }
    struct worker *d = &c->worker[ROLE_DRAFT];
    if (d->up || d->held)
        draft_lost(c, "registered again (restarted)");
    *d = w;
    if (!c->worker[ROLE_TARGET].up) {
        d->held = true;
        LOG_INFO("draft worker pid %d (%s) registered before the target: held until the target registers", w.pid,
                 w.model);
        return;
    }
    welcome_draft(c);
}

static void on_worker_message(struct coordinator *c)
{
    char err[ERR_MSG_MAX] = "";
    struct protocol_msg msg;
    memset(&msg, 0, sizeof(msg));
    int rc = protocol_recv(c->workers, true, c->max_message_bytes, PROTOCOL_DONTWAIT, &msg, err);
    if (rc == ERR_TIMEOUT || rc == ERR_CANCELLED) {
        protocol_msg_free(&msg);
        return;
    }
    if (rc != 0) {
        LOG_ERROR("bad message from a worker: %s", err);
        protocol_msg_free(&msg);
        return;
    }
    if (strcmp(msg.type, PROTOCOL_REGISTER) == 0) {
        on_register(c, &msg);
        protocol_msg_free(&msg);
        return;
    }
    enum worker_role role = ROLE_DRAFT;
    bool known = false;
    for (int r = 0; r < 2; r++) {
        struct worker *w = &c->worker[r];
        if ((w->up || w->held) && w->identity_size == msg.identity_size &&
            memcmp(w->identity, msg.identity, msg.identity_size) == 0) {
            role = (enum worker_role)r;
            known = true;
            w->last_seen_ms = now_ms();
        }
    }
    if (!known) {
        LOG_DEBUG("message \"%s\" from an unregistered worker dropped", msg.type);
        protocol_msg_free(&msg);
        return;
    }
    /* Every verify gets one reply (verify_done or error): the target is
     * idle when none is outstanding. */
    if (role == ROLE_TARGET && c->target_outstanding > 0 &&
        (strcmp(msg.type, PROTOCOL_VERIFY_DONE) == 0 || strcmp(msg.type, PROTOCOL_ERROR) == 0) &&
        --c->target_outstanding == 0)
        c->target_idle_since_ms = now_ms();
    if (strcmp(msg.type, PROTOCOL_HEARTBEAT) == 0) {
        /* liveness already noted */
    } else if (c->worker[role].held) {
        LOG_DEBUG("message \"%s\" from the held draft dropped", msg.type);
    } else if (role == ROLE_TARGET && strcmp(msg.type, PROTOCOL_VERIFY_DONE) == 0) {
        on_verify_done(c, &msg);
    } else if (role == ROLE_DRAFT && strcmp(msg.type, PROTOCOL_DRAFT_READY) == 0) {
        on_draft_ready(c, &msg);
    } else if (role == ROLE_DRAFT && strcmp(msg.type, PROTOCOL_PREFILL_DONE) == 0) {
        on_prefill_done(c, &msg);
    } else if (strcmp(msg.type, PROTOCOL_ERROR) == 0) {
        on_worker_error(c, role, &msg);
    } else {
        LOG_WARN("%s worker sent an unexpected \"%.32s\" message", role_names[role], msg.type);
    }
    protocol_msg_free(&msg);
}

/* ------------------------------------------------------------------ */
/* Client requests                                                     */

static void seq_start(struct coordinator *c, struct seq *s)
{
    s->state = SEQ_ACTIVE;
    s->t_admit_ms = now_ms();
    c->n_active++;
    c->metrics.prompt_tokens_total += (uint64_t)s->n_prompt;
    s->target_len = 0;
    s->draft_valid = 0;
    s->draft_gen = c->draft_gen;
    if (draft_usable(c, s) && s->n_prompt < c->worker[ROLE_DRAFT].max_seq_len) {
        cJSON *h = seq_header(s, PROTOCOL_PREFILL, true);
        if (h != NULL && worker_send(c, ROLE_DRAFT, h, s->hist, s->n_prompt) == 0)
            s->draft_valid = s->n_prompt;
    }
    /* The target's prefill is a verification with k = 0 and the prompt as feed. */
    cJSON *h = seq_header(s, PROTOCOL_VERIFY, true);
    if (h == NULL) {
        seq_fail(c, s, METRICS_ERR_INTERNAL, "out of memory");
        return;
    }
    s->round_counter = 1;
    cJSON_AddNumberToObject(h, "round", s->round_counter);
    cJSON_AddNumberToObject(h, "keep_len", 0);
    cJSON_AddNumberToObject(h, "k", 0);
    cJSON_AddNumberToObject(h, "half", COORD_HALF_FRESH);
    s->wait_target = true;
    s->verify_round = s->round_counter;
    s->verify_k = 0;
    s->verify_keep = 0;
    s->verify_feed = s->n_prompt;
    s->verify_from_draft = false;
    s->verify_sent_ms = now_ms();
    c->target_idle_since_ms = -1;  /* a prefill is not a round: no gap measured */
    c->target_outstanding++;
    worker_send(c, ROLE_TARGET, h, s->hist, s->n_prompt);
}

static void try_admit_queued(struct coordinator *c)
{
    while (c->queue_head != NULL && c->n_active < c->cfg.coordinator.max_concurrency &&
           c->worker[ROLE_TARGET].up) {
        struct seq *s = c->queue_head;
        c->queue_head = s->next_queued;
        if (c->queue_head == NULL)
            c->queue_tail = NULL;
        s->next_queued = NULL;
        c->n_queued--;
        /* Its slot: the lowest free slot below the workers' slot count. */
        int n_slots = c->cfg.coordinator.max_concurrency;
        if (c->worker[ROLE_TARGET].n_slots < n_slots)
            n_slots = c->worker[ROLE_TARGET].n_slots;
        int slot = -1;
        for (int i = 0; i < n_slots && slot < 0; i++) {
            bool used = false;
            for (int j = 0; j < c->n_seqs && !used; j++)
                used = c->seqs[j].state == SEQ_ACTIVE && c->seqs[j].slot == i;
            if (!used)
                slot = i;
        }
        if (slot < 0) {
            /* Fewer worker slots than max_concurrency: wait for one. */
            s->next_queued = c->queue_head;
            c->queue_head = s;
            if (c->queue_tail == NULL)
                c->queue_tail = s;
            c->n_queued++;
            return;
        }
        s->slot = slot;
        seq_start(c, s);
    }
}

/* Tokenizes the request's prompt into s->hist. 0 or an error code with the
 * reply already sent. */
static int build_prompt(struct coordinator *c, const struct request *r, struct seq *s, char *msg, size_t msg_size)
{
    char err[ERR_MSG_MAX] = "";
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = 0;
    int vocab = c->worker[ROLE_TARGET].vocab_size;
    if (r->input == REQUEST_INPUT_IDS) {
        for (int i = 0; i < r->n_prompt_ids; i++) {
            if (r->prompt_ids[i] >= vocab) {
                snprintf(msg, msg_size, "prompt_ids[%d]: token id %d is outside the vocabulary (0..%d)", i,
                         r->prompt_ids[i], vocab - 1);
                return ERR_INVALID_ARG;
            }
        }
        ids = malloc(sizeof(*ids) * (size_t)r->n_prompt_ids);
        if (ids == NULL) {
            snprintf(msg, msg_size, "out of memory");
            return ERR_NOMEM;
        }
        memcpy(ids, r->prompt_ids, sizeof(*ids) * (size_t)r->n_prompt_ids);
        n = (size_t)r->n_prompt_ids;
    } else if (c->tk == NULL) {
        snprintf(msg, msg_size, "%s: this server has no tokenizer (no tokenizer.json in %.200s); send prompt_ids",
                 r->input == REQUEST_INPUT_PROMPT ? "prompt" : "messages", c->cfg.coordinator.tokenizer);
        return ERR_INVALID_ARG;
    } else if (r->input == REQUEST_INPUT_PROMPT) {
        rc = tokenizer_encode(c->tk, r->prompt, r->prompt_len, TOKENIZER_ADD_BOS, &ids, &n, err);
        if (rc != 0) {
            snprintf(msg, msg_size, "prompt: %s", err);
            return rc;
        }
    } else {
        struct chat_message *m = calloc((size_t)r->n_messages, sizeof(*m));
        if (m == NULL) {
            snprintf(msg, msg_size, "out of memory");
            return ERR_NOMEM;
        }
        for (int i = 0; i < r->n_messages; i++) {
            m[i].role = r->messages[i].role;
            m[i].content = r->messages[i].content;
            m[i].content_len = strlen(r->messages[i].content);
        }
        rc = chat_template_encode(c->tk, m, (size_t)r->n_messages, 1, NULL, &ids, &n, err);
        free(m);
        if (rc != 0) {
            snprintf(msg, msg_size, "messages: %s", err);
            return rc;
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= vocab) {
            snprintf(msg, msg_size, "prompt: the tokenizer produced id %d outside the target's vocabulary of %d",
                     ids[i], vocab);
            free(ids);
            return ERR_MISMATCH;
        }
    }
    if (n == 0) {
        free(ids);
        snprintf(msg, msg_size, "prompt: encodes to no tokens");
        return ERR_INVALID_ARG;
    }
    int ctx = ctx_len(c);
    if ((long long)n >= ctx) {
        snprintf(msg, msg_size, "prompt: %zu tokens do not fit the context of %d tokens (at most %d)", n, ctx,
                 ctx - 1);
        free(ids);
        return ERR_CONTEXT_FULL;
    }
    int cap = (int)n + r->max_tokens + SPECULATE_K_MAX + 2;
    if (cap > ctx + SPECULATE_K_MAX + 2)
        cap = ctx + SPECULATE_K_MAX + 2;
    int32_t *hist = realloc(ids, sizeof(*hist) * (size_t)cap);
    if (hist == NULL) {
        free(ids);
        snprintf(msg, msg_size, "out of memory");
        return ERR_NOMEM;
    }
    s->hist = hist;
    s->cap_hist = cap;
    s->n_hist = (int)n;
    s->n_prompt = (int)n;
    return 0;
}

static void on_generate(struct coordinator *c, const uint8_t *identity, size_t identity_size, const cJSON *root)
{
    char err[ERR_MSG_MAX] = "";
    c->metrics.requests_total++;
    struct request_limits limits = {.max_tokens_max = c->worker[ROLE_TARGET].up ? ctx_len(c) : 1 << 20};
    struct request *r = NULL;
    if (request_from_json(&r, root, &limits, err) != 0) {
        client_error(c, identity, identity_size, request_peek_id(root), METRICS_ERR_INVALID_REQUEST, err);
        return;
    }
    if (r->has_seed && r->seed > COORD_SEED_MAX) {
        snprintf(err, sizeof(err), "seed: must be <= %llu, got %llu", (unsigned long long)COORD_SEED_MAX,
                 (unsigned long long)r->seed);
        client_error(c, identity, identity_size, r->id, METRICS_ERR_INVALID_REQUEST, err);
        request_destroy(r);
        return;
    }
    if (!c->worker[ROLE_TARGET].up) {
        client_error(c, identity, identity_size, r->id, METRICS_ERR_TARGET_UNAVAILABLE,
                     "no target worker is registered; try again later");
        request_destroy(r);
        return;
    }
    if (c->n_active >= c->cfg.coordinator.max_concurrency && c->n_queued >= c->cfg.coordinator.max_queue) {
        char m[160];
        snprintf(m, sizeof(m), "%d requests active and %d queued (max_concurrency %d, max_queue %d)", c->n_active,
                 c->n_queued, c->cfg.coordinator.max_concurrency, c->cfg.coordinator.max_queue);
        client_error(c, identity, identity_size, r->id, METRICS_ERR_OVERLOADED, m);
        request_destroy(r);
        return;
    }
    struct seq *s = NULL;
    for (int i = 0; i < c->n_seqs && s == NULL; i++)
        if (c->seqs[i].state == SEQ_FREE)
            s = &c->seqs[i];
    if (s == NULL) {
        client_error(c, identity, identity_size, r->id, METRICS_ERR_OVERLOADED, "no free request record");
        request_destroy(r);
        return;
    }
    char msg[ERR_MSG_MAX + 64];
    int rc = build_prompt(c, r, s, msg, sizeof(msg));
    if (rc != 0) {
        client_error(c, identity, identity_size, r->id,
                     rc == ERR_CONTEXT_FULL ? METRICS_ERR_CONTEXT_FULL
                     : rc == ERR_NOMEM      ? METRICS_ERR_INTERNAL
                                            : METRICS_ERR_INVALID_REQUEST,
                     msg);
        request_destroy(r);
        return;
    }
    if (output_create(&s->out, c->tk, r->stop, r->n_stop, err) != 0) {
        free(s->hist);
        s->hist = NULL;
        client_error(c, identity, identity_size, r->id, METRICS_ERR_INTERNAL, err);
        request_destroy(r);
        return;
    }
    s->req = ++c->next_req;
    memcpy(s->client, identity, identity_size);
    s->client_size = identity_size;
    snprintf(s->id, sizeof(s->id), "%s", r->id);
    s->stream = r->stream;
    s->max_tokens = r->max_tokens;
    sampling_params_default(&s->sp);
    s->sp.temperature = (float)r->temperature;
    s->sp.top_k = r->top_k;
    s->sp.top_p = (float)r->top_p;
    s->sp.min_p = (float)r->min_p;
    s->sp.seed = r->has_seed ? r->seed : splitmix64(&c->rng_state) & COORD_SEED_MAX;
    s->mode = r->spec_mode == REQUEST_SPEC_MODE_POINT_MASS ? SPECULATE_MODE_POINT_MASS
              : r->spec_mode == REQUEST_SPEC_MODE_SAMPLED  ? SPECULATE_MODE_SAMPLED
                                                           : c->default_mode;
    int k_fixed = r->spec_k > 0 ? r->spec_k : c->cfg.coordinator.spec_k;
    int k_max = c->cfg.coordinator.spec_k_max;
    if (k_fixed > k_max)
        k_max = k_fixed;
    if (c->k_history_valid) {
        s->kc = c->k_history;
        s->kc.k_fixed = k_fixed;
        s->kc.k_max = k_max < SPECULATE_K_MAX ? k_max : SPECULATE_K_MAX;
    } else {
        adaptive_k_init(&s->kc, k_fixed, k_max);
    }
    s->t_arrival_ms = now_ms();
    request_destroy(r);
    s->state = SEQ_QUEUED;
    s->next_queued = NULL;
    if (c->queue_tail != NULL)
        c->queue_tail->next_queued = s;
    else
        c->queue_head = s;
    c->queue_tail = s;
    c->n_queued++;
    try_admit_queued(c);
}

static void on_stats(struct coordinator *c, const uint8_t *identity, size_t identity_size, const cJSON *root)
{
    char err[ERR_MSG_MAX];
    struct metrics_gauges g = {
        .active = c->n_active,
        .queued = c->n_queued,
        .max_concurrency = c->cfg.coordinator.max_concurrency,
        .max_queue = c->cfg.coordinator.max_queue,
        .draft_up = c->worker[ROLE_DRAFT].up,
        .target_up = c->worker[ROLE_TARGET].up,
        .draft_pid = c->worker[ROLE_DRAFT].pid,
        .target_pid = c->worker[ROLE_TARGET].pid,
        .draft_model = c->worker[ROLE_DRAFT].model,
        .target_model = c->worker[ROLE_TARGET].model,
        .uptime_s = (now_ms() - c->t_start_ms) / 1000.0,
    };
    cJSON *m = cJSON_CreateObject();
    char *prom = NULL;
    if (m == NULL || cJSON_AddStringToObject(m, "type", "stats") == NULL ||
        cJSON_AddStringToObject(m, "id", request_peek_id(root)) == NULL || metrics_add_json(&c->metrics, &g, m, err) != 0 ||
        metrics_prometheus(&c->metrics, &g, &prom, err) != 0 || cJSON_AddStringToObject(m, "prometheus", prom) == NULL) {
        cJSON_Delete(m);
        free(prom);
        client_error(c, identity, identity_size, request_peek_id(root), METRICS_ERR_INTERNAL, "stats: out of memory");
        return;
    }
    free(prom);
    client_send(c, identity, identity_size, m);
    cJSON_Delete(m);
}

/* Reads one client message (routing id + one frame) and answers it. */
static void on_client_message(struct coordinator *c)
{
    uint8_t identity[PROTOCOL_IDENTITY_MAX];
    size_t identity_size = 0;
    zmq_msg_t part;
    if (zmq_msg_init(&part) != 0)
        return;
    int n_parts = 0;
    size_t payload_bytes = 0;
    char *payload = NULL;
    bool oversized = false;
    int more = 1;
    while (more) {
        if (zmq_msg_recv(&part, c->clients, ZMQ_DONTWAIT) < 0) {
            if (zmq_errno() != EAGAIN)
                LOG_WARN("client socket: zmq_msg_recv: %s", zmq_strerror(zmq_errno()));
            break;
        }
        more = zmq_msg_more(&part);
        size_t size = zmq_msg_size(&part);
        if (n_parts == 0) {
            identity_size = size < sizeof(identity) ? size : sizeof(identity);
            memcpy(identity, zmq_msg_data(&part), identity_size);
        } else if (size > 0 && payload == NULL && !oversized) {
            /* The first non-empty frame is the message (an empty REQ-style delimiter is skipped). */
            if (size > c->max_message_bytes) {
                oversized = true;
                payload_bytes = size;
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
    char err[ERR_MSG_MAX] = "";
    if (oversized) {
        char m[160];
        snprintf(m, sizeof(m), "message too large or in several frames: %zu bytes, at most %zu in one frame",
                 payload_bytes, c->max_message_bytes);
        c->metrics.requests_total++;
        client_error(c, identity, identity_size, "", METRICS_ERR_INVALID_REQUEST, m);
        free(payload);
        return;
    }
    cJSON *root = NULL;
    enum request_kind kind = REQUEST_KIND_GENERATE;
    int rc = request_parse_envelope(payload, payload ? payload_bytes : 0, &root, &kind, err);
    free(payload);
    if (rc != 0) {
        c->metrics.requests_total++;
        client_error(c, identity, identity_size, request_peek_id(root), METRICS_ERR_INVALID_REQUEST, err);
        cJSON_Delete(root);
        return;
    }
    if (kind == REQUEST_KIND_STATS)
        on_stats(c, identity, identity_size, root);
    else
        on_generate(c, identity, identity_size, root);
    cJSON_Delete(root);
}

/* ------------------------------------------------------------------ */
/* Timers                                                              */

static void on_tick(struct coordinator *c)
{
    double t = now_ms();
    const struct coordinator_config *cc = &c->cfg.coordinator;
    if (t - c->last_heartbeat_ms >= cc->heartbeat_ms) {
        c->last_heartbeat_ms = t;
        for (int r = 0; r < 2; r++) {
            struct worker *w = &c->worker[r];
            if (!w->up && !w->held)
                continue;
            cJSON *h = protocol_header_new(PROTOCOL_HEARTBEAT);
            if (h != NULL)
                worker_send(c, (enum worker_role)r, h, NULL, 0);
        }
    }
    struct worker *t_w = &c->worker[ROLE_TARGET];
    if (t_w->up && t - t_w->last_seen_ms > cc->worker_timeout_ms)
        target_lost(c, "sent nothing for worker_timeout_ms");
    struct worker *d_w = &c->worker[ROLE_DRAFT];
    if ((d_w->up || d_w->held) && t - d_w->last_seen_ms > cc->worker_timeout_ms)
        draft_lost(c, "sent nothing for worker_timeout_ms");
    for (int i = 0; i < c->n_seqs; i++) {
        struct seq *s = &c->seqs[i];
        if (s->state != SEQ_FREE && t - s->t_arrival_ms > cc->request_timeout_ms)
            seq_fail(c, s, METRICS_ERR_INTERNAL, "request_timeout_ms exceeded");
    }
    try_admit_queued(c);
}

/* ------------------------------------------------------------------ */
/* Setup                                                               */

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

static int bind_router(struct coordinator *c, void **sock, const char *endpoint, const char *key, int max_msg,
                       char *err)
{
    *sock = zmq_socket(c->zctx, ZMQ_ROUTER);
    if (*sock == NULL)
        return error_set(err, ERR_SYSTEM, "zmq_socket(ROUTER): %s", zmq_strerror(zmq_errno()));
    int linger_ms = 0;
    int64_t max_bytes = max_msg;
    if (zmq_setsockopt(*sock, ZMQ_LINGER, &linger_ms, sizeof(linger_ms)) != 0 ||
        (max_bytes > 0 && zmq_setsockopt(*sock, ZMQ_MAXMSGSIZE, &max_bytes, sizeof(max_bytes)) != 0))
        return error_set(err, ERR_SYSTEM, "%s: zmq_setsockopt: %s", key, zmq_strerror(zmq_errno()));
    if (zmq_bind(*sock, endpoint) != 0)
        return error_set(err, ERR_SYSTEM, "%s: cannot bind %s: %s", key, endpoint, zmq_strerror(zmq_errno()));
    return 0;
}

int coordinator_create(struct coordinator **out, const struct proc_config *cfg, char *err)
{
    *out = NULL;
    struct coordinator *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return error_set(err, ERR_NOMEM, "coordinator: out of memory");
    c->cfg = *cfg;
    const struct coordinator_config *cc = &c->cfg.coordinator;
    c->max_message_bytes = (size_t)cc->max_message_bytes;
    c->default_mode = strcmp(cc->spec_mode, "point_mass") == 0 ? SPECULATE_MODE_POINT_MASS : SPECULATE_MODE_SAMPLED;
    c->t_start_ms = now_ms();
    c->rng_state = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(c->t_start_ms * 1000.0);
    metrics_init(&c->metrics);
    c->target_idle_since_ms = -1;
    int rc = 0;
    c->n_seqs = cc->max_concurrency + cc->max_queue;
    c->seqs = calloc((size_t)c->n_seqs, sizeof(*c->seqs));
    if (c->seqs == NULL) {
        rc = error_set(err, ERR_NOMEM, "coordinator: out of memory");
        goto fail;
    }
    char tk_err[ERR_MSG_MAX] = "";
    rc = tokenizer_load(&c->tk, cc->tokenizer, tk_err);
    if (rc == ERR_IO || rc == ERR_NOT_FOUND) {
        LOG_WARN("coordinator.tokenizer: %s; only prompt_ids requests will be served", tk_err);
        c->tk = NULL;
        rc = 0;
    } else if (rc != 0) {
        rc = error_set(err, rc, "coordinator.tokenizer: %s", tk_err);
        goto fail;
    }
    remove_stale_segments(c->cfg.instance);
    c->zctx = zmq_ctx_new();
    if (c->zctx == NULL) {
        rc = error_set(err, ERR_SYSTEM, "zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
        goto fail;
    }
    int hard_max = cc->max_message_bytes > INT32_MAX / COORD_HARD_MESSAGE_FACTOR
                       ? INT32_MAX
                       : cc->max_message_bytes * COORD_HARD_MESSAGE_FACTOR;
    if ((rc = bind_router(c, &c->clients, cc->client_endpoint, "coordinator.client_endpoint", hard_max, err)) != 0)
        goto fail;
    if ((rc = bind_router(c, &c->workers, cc->worker_endpoint, "coordinator.worker_endpoint", 0, err)) != 0)
        goto fail;
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
    for (int i = 0; c->seqs != NULL && i < c->n_seqs; i++)
        seq_reset(&c->seqs[i]);
    free(c->seqs);
    for (int r = 0; r < 2; r++)
        cJSON_Delete(c->worker[r].shm);
    if (c->clients != NULL)
        zmq_close(c->clients);
    if (c->workers != NULL)
        zmq_close(c->workers);
    if (c->zctx != NULL)
        zmq_ctx_term(c->zctx);
    tokenizer_destroy(c->tk);
    free(c);
}

int coordinator_run(struct coordinator *c, volatile sig_atomic_t *stop, char *err)
{
    LOG_INFO("coordinator serving clients on %s, workers on %s", c->cfg.coordinator.client_endpoint,
             c->cfg.coordinator.worker_endpoint);
    int tick_ms = c->cfg.coordinator.heartbeat_ms / 2;
    if (tick_ms < 10)
        tick_ms = 10;
    double next_tick = now_ms();
    while (!*stop) {
        zmq_pollitem_t items[2] = {
            {.socket = c->workers, .events = ZMQ_POLLIN},
            {.socket = c->clients, .events = ZMQ_POLLIN},
        };
        double wait = next_tick - now_ms();
        int n = zmq_poll(items, 2, wait > 0 ? (long)wait : 0);
        if (n < 0) {
            if (zmq_errno() == EINTR)
                continue;
            return error_set(err, ERR_SYSTEM, "zmq_poll: %s", zmq_strerror(zmq_errno()));
        }
        /* Workers first: their replies free slots and move rounds along.
         * Bounded batches keep one busy socket from starving the other. */
        for (int i = 0; i < 64 && (items[0].revents & ZMQ_POLLIN); i++) {
            on_worker_message(c);
            int ev = 0;
            size_t sz = sizeof(ev);
            if (zmq_getsockopt(c->workers, ZMQ_EVENTS, &ev, &sz) != 0 || !(ev & ZMQ_POLLIN))
                break;
        }
        for (int i = 0; i < 64 && (items[1].revents & ZMQ_POLLIN); i++) {
            on_client_message(c);
            int ev = 0;
            size_t sz = sizeof(ev);
            if (zmq_getsockopt(c->clients, ZMQ_EVENTS, &ev, &sz) != 0 || !(ev & ZMQ_POLLIN))
                break;
        }
        if (now_ms() >= next_tick) {
            on_tick(c);
            next_tick = now_ms() + tick_ms;
        }
    }
    LOG_INFO("coordinator stopping");
    return 0;
}
