/* scheduler.c: owns the sequences: queueing, admission into worker slots,
 * speculation rounds, accepted tokens and stop conditions, and endings
 * (the replies themselves are built in replies.c).
 *
 * Scheduling, per sequence (H = history, n tokens; see coordinator.h for the
 * cache invariants):
 *   admit:   prefill {prompt} to the draft and to the target at the same
 *            time (the target's also chooses the first token).
 *   round:   K from the sequence's controller (fixed when the request or the
 *            config sets it). K = 0 or no draft: run {feed=[H[n-1]], steps};
 *            drafts matched here: verify_matched {feed=[H[n-1]], drafts},
 *            or as a token tree (spec_tree a node budget): verify_tree
 *            {feed=[H[n-1]], drafts, parents}.
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
 * Round states: coordinator/round.h has them and their transitions; every
 * change of state goes through seq_move (round_move), checked against the
 * table in round.c. A reply is used only in a state that awaits it, for
 * the awaited round; the pre-draft has a state of its own (enum
 * predraft_state).
 *
 * Halves: fresh drafts always go to half 0 and pre-drafts to half 1. A
 * fresh draft is sent only when no verification of that sequence is in
 * flight, and a pre-draft is written while the target reads half 0, so the
 * draft never writes a half the target is reading.
 */
#include "scheduler.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admission.h"
#include "constraint.h"
#include "drafters.h"
#include "error.h"
#include "logging.h"
#include "replies.h"
#include "round.h"
#include "round_timing.h"
#include "worker_msg.h"
#include "worker_send.h"

static void seq_start(struct coordinator *c, struct seq *s);

/* Most plain steps asked for at once (verify "steps"): a run ends early
 * only at an end-of-sequence token or a release, so its length bounds
 * nothing but how long a draft that registers meanwhile waits to be used. */
#define PLAIN_RUN_MAX 32
/* Plain steps after a lookup for a match found nothing, before the next
 * one: each lookup costs a trip through the coordinator (0.4-0.7 ms
 * against a 5 ms step of the small target on 2 cores) and the target's
 * wait for the next verification. The run doubles with every miss in a
 * row, up to PLAIN_RUN_MAX, and starts again from MATCH_MISS_RUN after a
 * match: a request that never matches runs near target-only speed, one
 * that starts repeating itself is caught within a few tokens. */
#define MATCH_MISS_RUN 4

static struct worker_msg_seq msg_seq(const struct seq *s)
{
    return (struct worker_msg_seq){.req = (int64_t)s->req, .slot = s->slot};
}

static struct worker_msg_sampling msg_sampling(const struct seq *s)
{
    return (struct worker_msg_sampling){.sp = s->sp, .mode = s->mode, .ctl = s->ctl};
}

/* Whether s drafts with the draft worker's model now. */
static bool draft_usable(const struct coordinator *c, const struct seq *s)
{
    const struct worker *d = &c->pair[s->pair].worker[ROLE_DRAFT];
    return coord_seq_uses_model(s) && d->up && !s->spec_off && s->slot < d->n_slots;
}

void scheduler_seq_reset(struct seq *s)
{
    output_destroy(s->out);
    logprobs_free(&s->lp);
    free(s->hist);
    free(s->half_bytes[0]);
    free(s->half_bytes[1]);
    cJSON_Delete(s->grammar);
    constraint_seq_free(s->gram);
    free(s->pred);
    int slot = s->slot;
    memset(s, 0, sizeof(*s));
    s->slot = slot;
    s->state = SEQ_FREE;
}

static void send_release(struct coordinator *c, struct seq *s)
{
    for (int r = 0; r < 2; r++) {
        if (!coord_pair_of(c, s)->worker[r].up)
            continue;
        struct worker_msg_seq m = msg_seq(s);
        cJSON *h = worker_msg_release_encode(&m);
        if (h != NULL)
            worker_send(c, s->pair, (enum worker_role)r, h, NULL);
    }
}

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

/* The slot is taken: blocks reserved, one more active sequence. */
static void seq_take_slot(struct coordinator *c, struct seq *s)
{
    struct pair *p = coord_pair_of(c, s);
    for (int r = 0; r < 2; r++) {
        s->kv_reserved[r] = r == ROLE_DRAFT && (s->spec_off || !coord_seq_uses_model(s))
                                ? 0
                                : admission_kv_blocks(c, p, (enum worker_role)r, s);
        p->kv_reserved[r] += s->kv_reserved[r];
    }
    p->n_active++;
    p->requests_admitted++;
    if (c->n_active++ == 0)
        c->busy_since_ms = coord_now_ms();
}

/* The slot is given back: the workers release it, the blocks return. */
static void seq_leave_slot(struct coordinator *c, struct seq *s)
{
    send_release(c, s);
    struct pair *p = coord_pair_of(c, s);
    /* the release ends a run of plain steps: the steps after the one in
     * flight will not be answered */
    if (s->round.state == ROUND_PLAIN_RUN && s->round.verify.steps - s->round.verify.done > 1) {
        p->target_outstanding -= s->round.verify.steps - s->round.verify.done - 1;
        if (p->target_outstanding < 0)
            p->target_outstanding = 0;
    }
    for (int r = 0; r < 2; r++) {
        p->kv_reserved[r] -= s->kv_reserved[r];
        s->kv_reserved[r] = 0;
    }
    p->n_active--;
    if (--c->n_active == 0 && c->busy_since_ms >= 0) {
        c->metrics.busy_ms_total += coord_now_ms() - c->busy_since_ms;
        c->busy_since_ms = -1;
    }
}

/* Takes an unfinished sequence out of the queue or its slot (the workers
 * release the slot) and frees the record. */
static void seq_drop(struct coordinator *c, struct seq *s)
{
    if (s->state == SEQ_ACTIVE) {
        seq_leave_slot(c, s);
    } else if (s->state == SEQ_QUEUED) {
        queue_remove(c, s);
    }
    scheduler_seq_reset(s);
}

/* Ends a sequence with an error reply (code) and frees its slot. */
void scheduler_fail(struct coordinator *c, struct seq *s, enum metrics_error code, const char *message)
{
    replies_error_of(c, s, code, message);
    seq_drop(c, s);
}

/* Moves s's round by ev. The scheduler decides its events, so one the
 * table refuses is a bug here: the request fails (internal) rather than
 * go on in a state nothing expects. false: s was failed and freed. */
static bool seq_move(struct coordinator *c, struct seq *s, enum round_event ev)
{
    char err[ERR_MSG_MAX];
    if (round_move(&s->round, ev, err) == 0)
        return true;
    LOG_ERROR("request \"%s\" (#%llu): %s", s->id, (unsigned long long)s->req, err);
    scheduler_fail(c, s, METRICS_ERR_INTERNAL, "internal error: the speculation round went astray");
    return false;
}

void scheduler_cancel(struct coordinator *c, struct seq *s)
{
    LOG_INFO("request \"%s\" (#%llu): cancelled after %d generated tokens", s->id, (unsigned long long)s->req,
             s->generated);
    c->metrics.requests_failed[METRICS_ERR_CANCELLED]++;
    seq_drop(c, s);
    scheduler_admit(c);
}

void scheduler_cancel_gone(struct coordinator *c)
{
    for (int g = 0; g < c->n_gone; g++) {
        for (int i = 0; i < c->n_seqs; i++) {
            struct seq *s = &c->seqs[i];
            if (s->state != SEQ_FREE && s->client_size == c->gone_size[g] &&
                memcmp(s->client, c->gone[g], s->client_size) == 0)
                scheduler_cancel(c, s);
        }
    }
    c->n_gone = 0;
}

static void seq_finish(struct coordinator *c, struct seq *s, enum metrics_finish reason)
{
    double t = coord_now_ms();
    /* The history belongs to the pair: measurements taken with a draft that
     * has since been lost (or replaced) would mislead the next request. */
    struct pair *p = coord_pair_of(c, s);
    if (s->kc.rounds_observed > 0 && s->draft_gen == p->draft_gen) {
        p->k_history = s->kc;
        p->k_history_valid = true;
    }
    char err[ERR_MSG_MAX];
    bool stopped = false;
    if (output_finish(s->out, &stopped, err) != 0)
        LOG_WARN("request \"%s\": detokenizer: %s", s->id, err);
    if (stopped)
        reason = METRICS_FINISH_STOP_STRING;
    double prefill_ms = s->t_first_ms - s->t_admit_ms;
    double decode_ms = t - s->t_first_ms;
    double queue_ms = s->t_admit_ms - s->t_arrival_ms;
    replies_done(c, s, reason, t);
    drafters_remember(c, s); /* later requests may draft from it */
    struct metrics *mt = &c->metrics;
    mt->requests_finished[reason]++;
    mt->generated_tokens_total += (uint64_t)s->generated;
    mt->queue_ms_total += queue_ms;
    mt->prefill_ms_total += prefill_ms;
    mt->decode_ms_total += decode_ms;
    if (s->generated > 1 && decode_ms > 0) {
        /* the first token is the prefill's: the decode rate counts the rest */
        mt->request_tokens_per_s_sum += (s->generated - 1) / (decode_ms / 1000.0);
        mt->request_rate_samples++;
    }
    LOG_INFO("request \"%s\" (#%llu): %d prompt + %d generated tokens, %s, %d rounds, acceptance %.3f, "
             "pre-draft %d/%d, %.1f ms",
             s->id, (unsigned long long)s->req, s->n_prompt, s->generated, metrics_finish_name(reason), s->rounds,
             s->drafted ? (double)s->accepted / s->drafted : 0.0, s->predraft_used, s->predraft_offered,
             t - s->t_arrival_ms);
    seq_leave_slot(c, s);
    scheduler_seq_reset(s);
    scheduler_admit(c);
}

/* Positions the sequence may still grow by (see adaptive_k_next). */
static int seq_room(const struct coordinator *c, const struct seq *s)
{
    int by_tokens = s->max_tokens - s->generated;
    int by_ctx = coord_context_len(c, s) - s->n_hist + 1;
    return by_tokens < by_ctx ? by_tokens : by_ctx;
}

/* A verification to send: k drafts (0: plain steps) read from half, of
 * which `cached` are in the draft's cache once accepted; or the k drafts
 * in inline_drafts, made here from `source` (not the draft's: no half). */
struct verify_call {
    int k, half, round, cached, steps;
    bool beside_draft;          /* sent with its draft: the target waits on the buffer */
    const int32_t *inline_drafts;
    const int32_t *inline_parents; /* NULL, or inline_drafts are a token tree: k nodes */
    enum request_draft source;  /* inline_drafts only */
};

/* The round event a verification's sending is. */
static enum round_event verify_event(const struct verify_call *v)
{
    return v->beside_draft ? ROUND_VERIFY_BESIDE_SENT : v->k > 0 ? ROUND_VERIFY_SENT : ROUND_RUN_SENT;
}

/* The target command that carries v, by meaning: a run of plain steps
 * (k 0), drafts matched here (verify_matched) or the draft's half (verify,
 * with the half's bytes as a second frame where the two share no memory).
 * NULL when out of memory, or after failing s (a half that did not come). */
static cJSON *verify_message(struct coordinator *c, struct seq *s, const struct verify_call *v,
                             struct protocol_frame *frames, int *n_frames)
{
    struct pair *p = coord_pair_of(c, s);
    const struct worker_msg_target_call call = {
        .seq = msg_seq(s), .round = v->round, .keep_len = s->n_hist - 1, .sampling = msg_sampling(s),
        .feed = &s->hist[s->n_hist - 1], .n_feed = 1, .logprobs = logprobs_ask(&s->lp)};
    *n_frames = 1;
    if (v->k == 0)
        return worker_msg_run_encode(&(struct worker_msg_run){.call = call, .steps = v->steps}, &frames[0]);
    if (v->inline_parents != NULL) {
        struct worker_msg_verify_tree m = {.call = call, .n_nodes = v->k};
        memcpy(m.drafts, v->inline_drafts, (size_t)v->k * sizeof(int32_t));
        memcpy(m.parents, v->inline_parents, (size_t)v->k * sizeof(int32_t));
        return worker_msg_verify_tree_encode(&m, &frames[0]);
    }
    if (v->inline_drafts != NULL) {
        struct worker_msg_verify_matched m = {.call = call, .n_drafts = v->k};
        memcpy(m.drafts, v->inline_drafts, (size_t)v->k * sizeof(int32_t));
        return worker_msg_verify_matched_encode(&m, &frames[0]);
    }
    if (p->halves_as_frames) {
        /* the half the draft sent with its draft_ready: kept until a verify reads it */
        if (s->half_bytes[v->half] == NULL) {
            scheduler_fail(c, s, METRICS_ERR_INTERNAL, "the draft's half did not come with its draft_ready");
            return NULL;
        }
        frames[1] = (struct protocol_frame){.data = s->half_bytes[v->half], .size_bytes = s->half_len[v->half]};
        *n_frames = 2;
    }
    /* The draft's buffer rides along, so a target that missed an attach
     * (or restarted) can import it. The half's header tells the target where
     * the drafts start (after the guess in a pre-drafted half). */
    return worker_msg_verify_encode(&(struct worker_msg_verify){.call = call, .k = v->k, .half = v->half,
                                                                .shm = coord_draft_descriptor(p),
                                                                .await_draft = v->beside_draft},
                                    &frames[0]);
}

/* Sends the verification v of s; the round waits for it from now. */
static void send_verify(struct coordinator *c, struct seq *s, const struct verify_call *v)
{
    const int k = v->k;
    const bool matched = v->inline_drafts != NULL;
    struct pair *p = coord_pair_of(c, s);
    struct protocol_frame frames[2];
    int n_frames = 1;
    cJSON *h = verify_message(c, s, v, frames, &n_frames);
    if (h == NULL) {
        if (s->state == SEQ_ACTIVE) /* not failed already: out of memory */
            scheduler_fail(c, s, METRICS_ERR_INTERNAL, "out of memory");
        return;
    }
    if (!seq_move(c, s, verify_event(v))) {
        cJSON_Delete(h);
        return;
    }
    struct round_verify *rv = &s->round.verify;
    *rv = (struct round_verify){
        .round = v->round, .k = k, .L = s->n_hist, .cached = v->cached, .keep = s->n_hist - 1, .feed = 1,
        .steps = v->steps, .done = 0, .source = matched ? v->source : REQUEST_DRAFT_MODEL,
        .tree = v->inline_parents != NULL, .beside = BESIDE_DRAFT_AWAITED,
    };
    c->metrics.beside_draft_total += v->beside_draft;
    round_timing_verify_sent(c, s, k, v->beside_draft);
    p->target_outstanding += v->steps; /* each step is answered */
    if (v->steps > 1) {
        c->metrics.plain_runs_total++;
        c->metrics.plain_run_steps_total += (uint64_t)v->steps;
    }
    worker_send_frames(c, s->pair, ROLE_TARGET, h, frames, n_frames);
}

/* A verification of the k drafts of the draft's half, cached of them in
 * the draft's cache once accepted. */
static void send_verify_of_half(struct coordinator *c, struct seq *s, int k, int half, int round, int cached)
{
    send_verify(c, s, &(struct verify_call){.k = k, .half = half, .round = round, .cached = cached, .steps = 1});
}

/* Sends a token tree of model-free drafts when s takes trees and its
 * sources propose one: paths at most k_cap deep, at most the budget's
 * nodes, no more than the context holds beside the history (the tree's
 * nodes all take a position until the path is kept). A tree that is a
 * chain goes as one (verify_matched). Never cut by what a row costs (a
 * measured time, which differs run to run): a seeded request's drafts stay
 * a function of its tokens, and its output reproducible. false: no tree
 * went out. */
static bool send_matched_tree(struct coordinator *c, struct seq *s, int k_cap)
{
    int nodes = drafters_tree_budget(c, s);
    const int ctx_room = coord_context_len(c, s) - s->n_hist;
    if (nodes > ctx_room)
        nodes = ctx_room;
    if (nodes > WORKER_MSG_TREE_NODES_MAX)
        nodes = WORKER_MSG_TREE_NODES_MAX;
    if (nodes < 1)
        return false;
    struct draft_tree t;
    enum request_draft source = REQUEST_DRAFT_NGRAM;
    const int n = drafters_propose_tree(c, s, draft_usable(c, s), k_cap, nodes, &t, &source);
    if (n == 0)
        return false;
    const bool chain = drafters_tree_is_chain(&t);
    send_verify(c, s, &(struct verify_call){.k = n, .half = COORD_HALF_FRESH, .round = ++s->round.counter,
                                            .steps = 1, .inline_drafts = t.tokens,
                                            .inline_parents = chain ? NULL : t.parents, .source = source});
    s->match_miss_run = MATCH_MISS_RUN;
    return true;
}

/* Sends the drafts a match made here predicts (at most K, as many as
 * fit); false when nothing matched. */
static bool send_matched_draft(struct coordinator *c, struct seq *s, int room)
{
    int k_cap = s->kc.k_fixed > 0 ? s->kc.k_fixed : c->cfg.coordinator.spec_k_max;
    if (k_cap > room - 1)
        k_cap = room - 1; /* the k drafts and the token after them */
    if (k_cap > SPECULATE_K_MAX)
        k_cap = SPECULATE_K_MAX;
    if (k_cap < 1)
        return false;
    if (send_matched_tree(c, s, k_cap))
        return true;
    int32_t drafts[SPECULATE_K_MAX];
    enum request_draft source = REQUEST_DRAFT_NGRAM;
    const int k = drafters_propose(c, s, draft_usable(c, s), k_cap, drafts, &source);
    if (k == 0)
        return false;
    send_verify(c, s, &(struct verify_call){.k = k, .half = COORD_HALF_FRESH, .round = ++s->round.counter,
                                            .steps = 1, .inline_drafts = drafts, .source = source});
    s->match_miss_run = MATCH_MISS_RUN;
    return true;
}

/* Whether a verification may go out beside its draft: the target then
 * waits on the draft's buffer (shm_buffer_half_wait) and starts as soon as
 * the round is published, without the trip of draft_ready through here.
 * Small pair on 2 cores, 1 + 1 threads, K = 1, three alternating pairs of
 * runs: 1.04-1.24x the tokens/s. Not where the workers share cores: the
 * draft's reply and this process's handling of it then run beside the
 * verification and slow it (2 + 2 threads: 0.9-1.05x, no clear gain; again
 * with the half-byte draft head at K = 2: round walls 9.9-11.5 ms beside
 * the draft against 9.9-10.8 the usual way, two alternating pairs). Over
 * POSIX shared memory only: on cuda_ipc the device side has its own
 * ordering, not tried so yet. */
static bool verify_beside_draft(const struct pair *p)
{
    return !p->cores_shared && p->worker[ROLE_DRAFT].shm_posix && !p->halves_as_frames;
}

/* Sends a fresh draft of k tokens (and asks for a pre-draft when useful). */
static void send_draft(struct coordinator *c, struct seq *s, int k, int room)
{
    struct pair *p = coord_pair_of(c, s);
    if (s->draft_gen != p->draft_gen)
        s->draft_valid = 0;
    if (s->draft_valid > s->n_hist - 1)
        s->draft_valid = s->n_hist - 1;
    /* Pre-draft the next round when it fits and no other sequence is queued
     * for the draft (then its time is better spent there). */
    int predraft_k = 0;
    int room_after = room - (k + 1);
    const struct worker *d = &p->worker[ROLE_DRAFT];
    int draft_room = d->max_seq_len - (s->n_hist + k);
    if (room_after > 1 && draft_room > 1) {
        /* a pre-draft proposes its guess and predraft_k drafts: at most
         * SPECULATE_K_MAX tokens in all (worker_msg.h) */
        predraft_k = k < SPECULATE_K_MAX ? k : SPECULATE_K_MAX - 1;
        if (predraft_k > room_after - 1)
            predraft_k = room_after - 1;
        if (predraft_k > draft_room - 1)
            predraft_k = draft_room - 1;
        int busy = 0;
        for (int i = 0; i < c->n_seqs; i++)
            busy += c->seqs[i].state == SEQ_ACTIVE && c->seqs[i].pair == s->pair &&
                    (c->seqs[i].round.state == ROUND_DRAFTING ||
                                                       (c->seqs[i].round.state == ROUND_VERIFY_BESIDE_DRAFT &&
                                                        c->seqs[i].round.verify.beside == BESIDE_DRAFT_AWAITED));
        /* On cores the draft shares with the target a pre-draft slows the
         * verification beside it by more than it can save (small pair on 2
         * cores, 2 + 2 threads: rounds with pre-drafts took 2-4x as long,
         * verification 16-19 ms against 6-7 alone). Elsewhere, alone,
         * whether it pays is the controller's to measure. */
        if (busy > 0 || p->cores_shared || !adaptive_k_predraft(&s->kc))
            predraft_k = 0;
    }
    struct worker_msg_draft m = {
        .seq = msg_seq(s), .half = COORD_HALF_FRESH, .round = s->round.counter + 1,
        .keep_len = s->draft_valid, .k = k, .predraft_k = predraft_k, .sampling = msg_sampling(s),
        .feed = &s->hist[s->draft_valid], .n_feed = s->n_hist - s->draft_valid,
    };
    struct protocol_frame frame;
    cJSON *h = worker_msg_draft_encode(&m, &frame);
    if (h == NULL) {
        scheduler_fail(c, s, METRICS_ERR_INTERNAL, "out of memory");
        return;
    }
    if (!seq_move(c, s, ROUND_DRAFT_SENT)) {
        cJSON_Delete(h);
        return;
    }
    s->round.counter += 2;  /* round r for the draft, r + 1 for its pre-draft */
    s->round.draft = (struct round_draft){
        .round = s->round.counter - 1, .k = k, .predraft_k = predraft_k, .n_feed = m.n_feed};
    /* an abandoned pre-draft still being made keeps its state until its
     * reply: the new one's reply comes after it */
    if (predraft_k > 0)
        s->round.predraft.state = PREDRAFT_PENDING;
    round_timing_draft_sent(s, s->draft_prefilling);
    s->draft_gen = p->draft_gen;
    if (worker_send(c, s->pair, ROLE_DRAFT, h, &frame) == 0 && verify_beside_draft(p))
        send_verify(c, s, &(struct verify_call){.k = k, .half = COORD_HALF_FRESH, .round = s->round.draft.round,
                                                .cached = k - 1, .steps = 1, .beside_draft = true});
}

/* Decides and sends the next round of an active sequence that waits for
 * nothing. */
static void seq_advance(struct coordinator *c, struct seq *s)
{
    if (s->state != SEQ_ACTIVE || s->round.state != ROUND_IDLE)
        return;
    int room = seq_room(c, s);
    if (room <= 0) {
        seq_finish(c, s, METRICS_FINISH_LENGTH);
        return;
    }
    if (send_matched_draft(c, s, room))
        return;
    int k = 0, steps = 1;
    if (draft_usable(c, s)) {
        struct pair *p = coord_pair_of(c, s);
        int draft_room = p->worker[ROLE_DRAFT].max_seq_len - s->n_hist + 1;
        /* every active sequence of the pair shares its target's forward
         * calls, and what rounds cost at each load (one sequence's rounds
         * price the others') */
        struct adaptive_k_load load = {.batch = p->n_active, .call_ms_base = p->call_ms_base,
                                       .call_ms_per_row = p->call_ms_per_row, .costs = p->wall_costs};
        k = adaptive_k_next_under_load(&s->kc, room < draft_room ? room : draft_room, &load);
        /* the plain rounds the controller commits to go as one run: each
         * would otherwise cost a trip through the coordinator, 0.4-0.7 ms
         * against a 5 ms step of the small target on 2 cores */
        if (k <= 0)
            steps = adaptive_k_plain_run(&s->kc, room < PLAIN_RUN_MAX ? room : PLAIN_RUN_MAX);
    } else if (s->draft == REQUEST_DRAFT_NGRAM || (s->draft == REQUEST_DRAFT_SUFFIX && c->suffix) ||
               (s->draft == REQUEST_DRAFT_AUTO && sampling_params_is_greedy(&s->sp))) {
        /* no match now: a few plain steps, then another look */
        if (s->match_miss_run < MATCH_MISS_RUN)
            s->match_miss_run = MATCH_MISS_RUN;
        steps = room < s->match_miss_run ? room : s->match_miss_run;
        s->match_miss_run = s->match_miss_run * 2 < PLAIN_RUN_MAX ? s->match_miss_run * 2 : PLAIN_RUN_MAX;
    } else {
        steps = room < PLAIN_RUN_MAX ? room : PLAIN_RUN_MAX;
        c->metrics.target_only_rounds_total += (uint64_t)steps;
    }
    if (k <= 0) {
        send_verify(c, s, &(struct verify_call){.half = COORD_HALF_FRESH, .round = ++s->round.counter,
                                                .steps = steps});
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
        if (!s->ignore_eos && coord_is_eos(c, s, tokens[i])) {
            *reason = METRICS_FINISH_STOP;
            return true;
        }
        if (s->generated >= s->max_tokens || s->n_hist > coord_context_len(c, s)) {
            *reason = METRICS_FINISH_LENGTH;
            return true;
        }
    }
    return false;
}

/* Uses or drops the pre-draft after a fully accepted round whose bonus is
 * s->round.predraft.bonus (already in the history); the sequence waits for
 * nothing else. */
static void seq_resolve_predraft(struct coordinator *c, struct seq *s)
{
    if (s->round.state == ROUND_AWAIT_PREDRAFT && !seq_move(c, s, ROUND_PREDRAFT_RESOLVED))
        return;
    const bool ready = s->round.predraft.state == PREDRAFT_READY;
    s->round.predraft.state = PREDRAFT_NONE;
    if (!ready || s->draft_gen != coord_pair_of(c, s)->draft_gen || !draft_usable(c, s)) {
        seq_advance(c, s);
        return;
    }
    /* The pre-draft fed t_k: the draft now holds everything but the bonus. */
    s->draft_valid = s->n_hist - 1;
    int room = seq_room(c, s);
    if (s->round.predraft.guess == s->round.predraft.bonus && room > 1) {
        int k = s->round.predraft.k < room - 1 ? s->round.predraft.k : room - 1;
        s->predraft_used++;
        c->metrics.predraft_used_total++;
        round_timing_predraft_used(s);
        /* The draft cached the guess and predraft_k - 1 drafts after it. */
        send_verify_of_half(c, s, k, s->round.predraft.half, s->round.predraft.round, s->round.predraft.k - 1);
        s->draft_valid = s->n_hist; /* the guess equals the bonus: cached too */
        return;
    }
    seq_advance(c, s);
}

/* What the coordinator checks worker replies against: its own request
 * records for slots, the target's vocabulary for token ids. */
static struct worker_msg_limits reply_limits(const struct coordinator *c, int pair)
{
    const struct worker *t = &c->pair[pair].worker[ROLE_TARGET];
    return (struct worker_msg_limits){
        .n_slots = c->n_seqs,
        .max_seq_len = t->max_seq_len,
        .k_max = SPECULATE_K_MAX,
        .vocab_size = t->vocab_size,
    };
}

/* The active sequence a reply of a worker of this pair names, or NULL
 * (finished, stale, or another pair's). */
static struct seq *seq_for(struct coordinator *c, int pair, const struct worker_msg_seq *m)
{
    for (int i = 0; m->req >= 0 && i < c->n_seqs; i++) {
        struct seq *s = &c->seqs[i];
        if (s->state == SEQ_ACTIVE && s->req == (uint64_t)m->req && s->slot == m->slot && s->pair == pair)
            return s;
    }
    return NULL;
}

/* After a verification that did not end s: the pre-draft decides the next
 * round when every draft was accepted and one is on its way or back (bonus:
 * the round's bonus token), the next round is decided here otherwise. */
static void seq_after_verify(struct coordinator *c, struct seq *s, int k, int n_acc, int32_t bonus)
{
    struct round_predraft *pd = &s->round.predraft;
    if (k > 0 && n_acc == k && (pd->state == PREDRAFT_PENDING || pd->state == PREDRAFT_READY)) {
        pd->bonus = bonus;
        if (pd->state == PREDRAFT_READY) {
            if (seq_move(c, s, ROUND_TARGET_DONE))
                seq_resolve_predraft(c, s);
        } else {
            /* it is on its way: the draft handles messages in order */
            seq_move(c, s, ROUND_PREDRAFT_AWAITED);
        }
        return;
    }
    /* a pre-draft not back yet is still being made: the draft works beside
     * whatever the target does next */
    pd->state = pd->state == PREDRAFT_PENDING || pd->state == PREDRAFT_ABANDONED ? PREDRAFT_ABANDONED
                                                                                 : PREDRAFT_NONE;
    if (seq_move(c, s, ROUND_TARGET_DONE))
        seq_advance(c, s);
}

/* The verify_done in msg, decoded into *m, when it is the reply s awaits
 * (its sequence returned); NULL when it was dropped (stale) or failed s
 * (malformed). */
static struct seq *awaited_verify_done(struct coordinator *c, int pair, const struct protocol_msg *msg,
                                       struct worker_msg_verify_done *m)
{
    char err[ERR_MSG_MAX] = "";
    struct worker_msg_limits lim = reply_limits(c, pair);
    int rc = worker_msg_verify_done_decode(msg, &lim, m, err);
    struct seq *s = seq_for(c, pair, &m->seq);
    if (s == NULL) {
        LOG_DEBUG("target verify_done dropped: %s", rc ? err : "no such active request (finished or stale)");
        return NULL;
    }
    /* Only a reply to the awaited round can fail the request; anything
     * older is dropped, well formed or not. */
    const struct round_verify *v = &s->round.verify;
    if (!round_awaits_target(&s->round) || m->round != v->round || (rc == 0 && m->step != v->done + 1)) {
        LOG_DEBUG("target verify_done for \"%s\" dropped: not the awaited round", s->id);
        return NULL;
    }
    if (rc == 0 && m->n_accepted > v->k)
        rc = error_set(err, ERR_PROTOCOL, "n_accepted: must be in 0..%d, got %d", v->k, m->n_accepted);
    if (rc == 0)
        rc = logprobs_keep(&s->lp, s->generated, m, err);
    if (rc != 0) {
        LOG_ERROR("target verify_done for \"%s\" is malformed: %s", s->id, err);
        scheduler_fail(c, s, METRICS_ERR_INTERNAL, "the target worker sent a malformed reply");
        return NULL;
    }
    return s;
}

/* What the draft's cache holds after the verification of s accepted n_acc
 * of its drafts: the round's drafts it cached, unless the draft failed or
 * was lost meanwhile. */
static void draft_cache_after_verify(struct coordinator *c, struct seq *s, int n_acc)
{
    const struct round_verify *v = &s->round.verify;
    if (v->k > 0 && s->draft_gen == coord_pair_of(c, s)->draft_gen && v->source == REQUEST_DRAFT_MODEL &&
        !(s->round.state == ROUND_VERIFY_BESIDE_DRAFT && v->beside == BESIDE_DRAFT_LOST)) {
        int cached = v->cached < n_acc ? v->cached : n_acc;
        s->draft_valid = v->L + cached;
    }
}

void scheduler_on_verify_done(struct coordinator *c, int pair, const struct protocol_msg *msg)
{
    struct worker_msg_verify_done m;
    struct seq *s = awaited_verify_done(c, pair, msg, &m);
    if (s == NULL)
        return;
    const double now = coord_now_ms();
    if (m.prefix.present) {
        metrics_prefix_report(&c->metrics, pair, ROLE_TARGET, m.prefix.looked_up, m.prefix.cached,
                              m.prefix.cached_blocks, m.prefix.evictions);
        s->prompt_cached = m.prefix.cached;
    }
    round_timing_verify_done(c, s, &m, now);
    struct round_verify *v = &s->round.verify;
    const int k = v->k, n_acc = m.n_accepted;
    /* a run of plain steps goes on at the target by itself, but never past
     * an end-of-sequence token (the target's rule: it knows nothing of
     * ignore_eos), so a request that ignores it must not wait for the rest */
    const bool at_eos = v->steps > 1 && m.n_tokens > 0 && coord_is_eos(c, s, m.tokens[m.n_tokens - 1]);
    const bool run_goes_on = ++v->done < v->steps && !at_eos;
    if (at_eos && v->done < v->steps) {
        struct pair *p = coord_pair_of(c, s);
        p->target_outstanding -= v->steps - v->done;
        if (p->target_outstanding < 0)
            p->target_outstanding = 0;
        v->steps = v->done;
    }
    if (s->round.state == ROUND_PREFILLING) {
        s->t_first_ms = now;
        s->target_len = s->n_prompt;
    } else {
        s->target_len = v->keep + v->feed + n_acc;
        if (k > 0 && v->source == REQUEST_DRAFT_PREDICTION) {
            s->pred_accepted += n_acc;
            s->pred_rejected += k - n_acc;
        } else if (k > 0 && v->source != REQUEST_DRAFT_MODEL) {
            drafters_learn(s, v->source, k, n_acc);
        }
    }
    draft_cache_after_verify(c, s, n_acc);
    enum metrics_finish reason = METRICS_FINISH_STOP;
    bool ended = seq_accept_tokens(c, s, m.tokens, m.n_tokens, &reason);
    replies_stream(c, s, false);
    if (s->replies_stalled) {
        /* tokens it will never see: end it, and say so (the error is held
         * until the client reads again) */
        c->metrics.slow_client_cancels_total++;
        scheduler_fail(c, s, METRICS_ERR_CANCELLED,
                       "the client did not read its replies (its queue is full): token events were lost, "
                       "so the request was cancelled");
        return;
    }
    if (ended) {
        seq_finish(c, s, reason);
        return;
    }
    if (run_goes_on) {
        /* the next step feeds the token just accepted */
        if (seq_move(c, s, ROUND_STEP_DONE)) {
            v->keep = s->n_hist - 1;
            round_timing_step_sent(s, now);
        }
        return;
    }
    seq_after_verify(c, s, k, n_acc, m.tokens[n_acc]);
}

/* A pre-draft's reply for s (k drafts after the guess). */
static void on_predraft(struct coordinator *c, struct seq *s, int round, int half, int k, int guess)
{
    if (s->round.predraft.state != PREDRAFT_PENDING || round <= s->round.draft.round || round > s->round.counter) {
        LOG_DEBUG("draft pre-draft for \"%s\" round %d dropped (stale)", s->id, round);
        return;
    }
    /* k counts the drafts after the guess; tolerate workers that count the guess too. */
    int pk = k;
    if (pk > s->round.draft.predraft_k)
        pk = s->round.draft.predraft_k;
    s->predraft_offered++;
    c->metrics.predraft_offered_total++;
    /* one the draft could not make (k 0, guess -1) is no more on its way */
    s->round.predraft.state = pk > 0 && guess >= 0 ? PREDRAFT_READY : PREDRAFT_NONE;
    s->round.predraft.round = round;
    s->round.predraft.k = pk;
    s->round.predraft.half = half;
    s->round.predraft.guess = guess;
    if (s->round.state == ROUND_AWAIT_PREDRAFT)
        seq_resolve_predraft(c, s);
}

void scheduler_on_draft_ready(struct coordinator *c, int pair, const struct protocol_msg *msg)
{
    char err[ERR_MSG_MAX] = "";
    struct worker_msg_limits lim = reply_limits(c, pair);
    struct worker_msg_draft_ready m;
    int rc = worker_msg_draft_ready_decode(msg, &lim, &m, err);
    struct seq *s = seq_for(c, pair, &m.seq);
    if (s == NULL) {
        LOG_DEBUG("draft draft_ready dropped: %s", rc ? err : "no such active request (finished or stale)");
        return;
    }
    if (rc != 0) {
        LOG_ERROR("draft draft_ready for \"%s\" is malformed: %s", s->id, err);
        return;
    }
    const int round = (int)m.round, half = m.half, k = m.k;
    round_timing_draft_compute(c, s, m.draft_ms);
    if (msg->n_frames >= 1 && coord_pair_of(c, s)->halves_as_frames && half >= 0 && half <= 1) {
        /* the half's bytes (a draft without shared memory): the next verify
         * of this half carries them; a newer publication replaces them */
        void *copy = realloc(s->half_bytes[half], msg->frame_size_bytes[0] > 0 ? msg->frame_size_bytes[0] : 1);
        if (copy != NULL)
            memcpy(copy, msg->frame_data[0], msg->frame_size_bytes[0]);
        else
            free(s->half_bytes[half]); /* its verify fails the request: no bytes for the half */
        s->half_bytes[half] = copy;
        s->half_len[half] = copy != NULL ? msg->frame_size_bytes[0] : 0;
    }
    /* the draft answers a slot's commands in order: any reply comes after
     * the abandoned pre-draft it made before */
    if (s->round.predraft.state == PREDRAFT_ABANDONED)
        s->round.predraft.state = PREDRAFT_NONE;
    if (m.predraft) {
        on_predraft(c, s, round, half, k, m.guess);
        return;
    }
    if (!round_awaits_draft(&s->round) || round != s->round.draft.round) {
        LOG_DEBUG("draft draft_ready for \"%s\" round %d dropped (stale)", s->id, round);
        return;
    }
    if (k != s->round.draft.k) {
        LOG_ERROR("draft draft_ready for \"%s\": k %d, asked for %d", s->id, k, s->round.draft.k);
        s->draft_valid = 0;
        s->round.predraft.state = PREDRAFT_NONE;
        if (s->round.state == ROUND_VERIFY_BESIDE_DRAFT) {
            s->round.verify.beside = BESIDE_DRAFT_LOST; /* the target's reply moves it on */
            return;
        }
        if (seq_move(c, s, ROUND_DRAFT_LOST))
            seq_advance(c, s);
        return;
    }
    round_timing_draft_ready(s, k, m.draft_ms);
    s->draft_valid = s->n_hist + k - 1;
    if (s->round.state == ROUND_VERIFY_BESIDE_DRAFT) {
        round_timing_draft_wait(c, s, s->round.times.draft_ready_ms);
        s->round.verify.beside = BESIDE_DRAFT_IN;
        return;
    }
    send_verify_of_half(c, s, k, half, round, k - 1);
}

void scheduler_on_prefill_done(struct coordinator *c, int pair, const struct protocol_msg *msg)
{
    char err[ERR_MSG_MAX] = "";
    struct worker_msg_limits lim = reply_limits(c, pair);
    struct worker_msg_prefill_done m;
    int rc = worker_msg_prefill_done_decode(msg, &lim, &m, err);
    struct seq *s = seq_for(c, pair, &m.seq);
    if (s == NULL || rc != 0) {
        LOG_DEBUG("draft prefill_done dropped: %s", rc ? err : "no such active request (finished or stale)");
        return;
    }
    s->draft_prefilling = false;
    if (m.prefix.present)
        metrics_prefix_report(&c->metrics, pair, ROLE_DRAFT, m.prefix.looked_up, m.prefix.cached,
                              m.prefix.cached_blocks, m.prefix.evictions);
    LOG_DEBUG("request \"%s\": draft prefill %.1f ms (%d prompt tokens cached)", s->id, m.prefill_ms,
              m.prefix.cached);
}

/* Drops everything the sequence expected from the draft (its cache, a
 * pending draft or pre-draft) and, if it was waiting for one, moves it on. */
void scheduler_forget_draft(struct coordinator *c, struct seq *s)
{
    s->draft_valid = 0;
    s->draft_prefilling = false;
    s->round.predraft.state = PREDRAFT_NONE;
    switch (s->round.state) {
    case ROUND_DRAFTING:
    case ROUND_AWAIT_PREDRAFT:
        if (seq_move(c, s, ROUND_DRAFT_LOST))
            seq_advance(c, s);
        break;
    case ROUND_VERIFY_BESIDE_DRAFT:
        /* the target's reply (or its giving up) moves it on */
        if (s->round.verify.beside == BESIDE_DRAFT_AWAITED)
            s->round.verify.beside = BESIDE_DRAFT_LOST;
        break;
    default:
        break;
    }
}

/* The target gave up on a verification sent beside its draft (the draft
 * did not publish in time, or its buffer was replaced): the draft's
 * trouble, not the target's. It goes again the usual way once the draft
 * answers, or the sequence moves on without the draft. */
static void on_beside_draft_failed(struct coordinator *c, struct seq *s)
{
    c->metrics.beside_draft_failed_total++;
    const bool draft_same = s->draft_gen == coord_pair_of(c, s)->draft_gen && draft_usable(c, s);
    if (draft_same && s->round.verify.beside == BESIDE_DRAFT_AWAITED) {
        seq_move(c, s, ROUND_TARGET_GAVE_UP); /* draft_ready sends the verification */
        return;
    }
    if (draft_same && s->round.verify.beside == BESIDE_DRAFT_IN) {
        send_verify_of_half(c, s, s->round.verify.k, COORD_HALF_FRESH, s->round.verify.round,
                            s->round.verify.k - 1);
        return;
    }
    if (s->round.predraft.state == PREDRAFT_PENDING)
        s->round.predraft.state = PREDRAFT_ABANDONED;
    else if (s->round.predraft.state == PREDRAFT_READY)
        s->round.predraft.state = PREDRAFT_NONE;
    if (seq_move(c, s, ROUND_BESIDE_ABANDONED))
        seq_advance(c, s);
}

void scheduler_on_worker_error(struct coordinator *c, int pair, enum worker_role role,
                               const struct protocol_msg *msg)
{
    struct worker_msg_limits lim = reply_limits(c, pair);
    struct worker_msg_error m;
    worker_msg_error_decode(msg, &lim, &m);
    const char *code = m.code, *message = m.message;
    struct seq *s = seq_for(c, pair, &m.seq);
    if (s == NULL) {
        LOG_WARN("%s worker error (no active request): %s: %s", coord_role_name(role), code, message);
        return;
    }
    LOG_WARN("%s worker error for request \"%s\": %s: %s", coord_role_name(role), s->id, code, message);
    if (role == ROLE_TARGET && s->round.state == ROUND_VERIFY_BESIDE_DRAFT &&
        (strcmp(code, "timeout") == 0 || strcmp(code, "unavailable") == 0)) {
        on_beside_draft_failed(c, s);
        return;
    }
    if (role == ROLE_TARGET) {
        bool ctx = strcmp(code, "context_full") == 0;
        scheduler_fail(c, s, ctx ? METRICS_ERR_CONTEXT_FULL : METRICS_ERR_INTERNAL,
                 ctx ? "the sequence no longer fits the target's context" : "the target worker failed this request");
        return;
    }
    /* Draft trouble never fails a request: fall back to a full re-feed, and
     * to target-only decoding if it keeps failing. */
    if (++s->draft_errors >= COORD_DRAFT_ERRORS_MAX)
        s->spec_off = true;
    scheduler_forget_draft(c, s);
}

static void seq_start(struct coordinator *c, struct seq *s)
{
    const struct pair *p = coord_pair_of(c, s);
    if (p->k_history_valid) {
        /* what the pair's earlier requests measured, with this request's
         * own K settings */
        const int k_fixed = s->kc.k_fixed, k_max = s->kc.k_max;
        s->kc = p->k_history;
        adaptive_k_new_request(&s->kc);
        s->kc.k_fixed = k_fixed;
        s->kc.k_max = k_max;
    }
    s->state = SEQ_ACTIVE;
    s->t_admit_ms = coord_now_ms();
    seq_take_slot(c, s);
    c->metrics.prompt_tokens_total += (uint64_t)s->n_prompt;
    s->target_len = 0;
    s->draft_valid = 0;
    s->draft_gen = coord_pair_of(c, s)->draft_gen;
    if (draft_usable(c, s) && s->n_prompt < coord_pair_of(c, s)->worker[ROLE_DRAFT].max_seq_len) {
        struct worker_msg_prefill pm = {
            .seq = msg_seq(s), .sampling = msg_sampling(s), .prompt = s->hist, .n_prompt = s->n_prompt,
            .grammar = s->grammar,
        };
        struct protocol_frame pf;
        cJSON *h = worker_msg_prefill_encode(&pm, &pf);
        if (h != NULL && worker_send(c, s->pair, ROLE_DRAFT, h, &pf) == 0) {
            s->draft_valid = s->n_prompt;
            s->draft_prefilling = true;
        }
    }
    /* The target's prefill also chooses the first token: round 1. */
    s->round.counter = 1;
    struct worker_msg_prefill m = {
        .seq = msg_seq(s), .sampling = msg_sampling(s), .prompt = s->hist, .n_prompt = s->n_prompt,
        .round = s->round.counter, .logprobs = logprobs_ask(&s->lp), .grammar = s->grammar,
    };
    struct protocol_frame frame;
    cJSON *h = worker_msg_prefill_encode(&m, &frame);
    if (h == NULL) {
        scheduler_fail(c, s, METRICS_ERR_INTERNAL, "out of memory");
        return;
    }
    if (!seq_move(c, s, ROUND_PREFILL_SENT)) {
        cJSON_Delete(h);
        return;
    }
    s->round.verify = (struct round_verify){
        .round = s->round.counter, .k = 0, .keep = 0, .feed = s->n_prompt, .steps = 1, .done = 0,
        .source = REQUEST_DRAFT_MODEL};
    round_timing_prefill_sent(c, s);
    coord_pair_of(c, s)->target_outstanding++;
    worker_send(c, s->pair, ROLE_TARGET, h, &frame);
}

/* The lowest slot of pair p no active sequence holds, or -1. */
static int free_slot(const struct coordinator *c, int p)
{
    const int n_slots = admission_pair_slots(c, &c->pair[p]);
    for (int i = 0; i < n_slots; i++) {
        bool used = false;
        for (int j = 0; j < c->n_seqs && !used; j++)
            used = c->seqs[j].state == SEQ_ACTIVE && c->seqs[j].pair == p && c->seqs[j].slot == i;
        if (!used)
            return i;
    }
    return -1;
}

/* Whether s is a later choice of a request (n > 1) whose first choice has
 * not finished its prefill: it waits, so that its prompt is mapped from
 * the target's prefix cache instead of computed again. */
static bool first_choice_prefilling(const struct coordinator *c, const struct seq *s)
{
    for (int i = 0; s->index > 0 && i < c->n_seqs; i++) {
        const struct seq *f = &c->seqs[i];
        if (f->state != SEQ_FREE && f->index == 0 && f->n_choices == s->n_choices &&
            f->client_size == s->client_size && memcmp(f->client, s->client, s->client_size) == 0 &&
            strcmp(f->id, s->id) == 0)
            return f->state == SEQ_QUEUED || f->round.state == ROUND_PREFILLING;
    }
    return false;
}

void scheduler_admit(struct coordinator *c)
{
    while (c->queue_head != NULL && coord_any_target(c) != NULL) {
        struct seq *s = c->queue_head;
        if (first_choice_prefilling(c, s))
            return; /* first come, first served: the queue waits a prefill */
        int need = 0;
        const int pair = admission_choose_pair(c, s, &need);
        if (pair == ADMISSION_NEVER) {
            const struct worker *t = coord_any_target(c);
            char msg[256];
            snprintf(msg, sizeof msg,
                     "the request may need %d KV blocks of %d positions, the target worker's "
                     "pool holds %d (kv_tokens)", need, t->kv_block_size, t->kv_blocks);
            scheduler_fail(c, s, METRICS_ERR_OVERLOADED, msg);
            continue;
        }
        if (pair == ADMISSION_LATER) {
            /* First come, first served: the head waits for slots or blocks
             * to return (the queue bounds how many wait; past it,
             * overloaded). */
            bool slots_full = true;
            for (int p = 0; p < c->n_pairs && slots_full; p++)
                slots_full = !c->pair[p].worker[ROLE_TARGET].up ||
                             c->pair[p].n_active >= admission_pair_slots(c, &c->pair[p]);
            if (!slots_full && !s->kv_waited) {
                s->kv_waited = true;
                c->metrics.kv_waits_total++;
            }
            return;
        }
        const int slot = free_slot(c, pair);
        if (slot < 0)
            return; /* cannot be: the pair's sequences hold fewer than its slots */
        c->queue_head = s->next_queued;
        if (c->queue_head == NULL)
            c->queue_tail = NULL;
        s->next_queued = NULL;
        c->n_queued--;
        s->pair = pair;
        s->slot = slot;
        seq_start(c, s);
    }
}

void scheduler_tick(struct coordinator *c)
{
    double t = coord_now_ms();
    for (int i = 0; i < c->n_seqs; i++) {
        struct seq *s = &c->seqs[i];
        if (s->state != SEQ_FREE && t - s->t_arrival_ms > c->cfg.coordinator.request_timeout_ms)
            scheduler_fail(c, s, METRICS_ERR_INTERNAL, "request_timeout_ms exceeded");
    }
    scheduler_admit(c);
}

void scheduler_enqueue(struct coordinator *c, struct seq *s)
{
    s->state = SEQ_QUEUED;
    s->next_queued = NULL;
    if (c->queue_tail != NULL)
        c->queue_tail->next_queued = s;
    else
        c->queue_head = s;
    c->queue_tail = s;
    c->n_queued++;
    scheduler_admit(c);
}
