/* test_scheduler.c: the coordinator's scheduler (coordinator/scheduler.c)
 * without processes. The real scheduler, round timing, output, metrics,
 * adaptive-K and worker-message code run; what would leave the process is
 * recorded instead (coord_fakes.h): the commands to the workers, decoded
 * by the workers' own decoders, and the client replies. Worker replies are
 * built with the workers' encoders and fed to the scheduler's handlers as
 * the registry's dispatch would.
 *
 * Covered: admission (prefill to both workers); each round state and its
 * transitions; a round (draft -> verify -> accepted tokens) and the
 * draft-cache bookkeeping behind each next draft's keep_len and feed (after
 * a partial acceptance, a full one, a pre-draft used, a pre-draft missed, a
 * draft lost); pre-drafts arriving before and after the verification's
 * reply, and one the draft could not make; a verification sent beside its
 * draft, the target giving up on it, the draft failing under it; stale and
 * malformed replies; the draft lost in every state a round waits in, and
 * repeated draft errors (plain decoding); plain runs of steps; endings (end
 * of sequence, max_tokens, a target error) and cancel in every state
 * (queued, prefilling, drafting, verifying). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "coord_fakes.h"
#include "coord_state.h"
#include "drafters.h"
#include "error.h"
#include "replies.h"
#include "scheduler.h"
#include "worker_msg.h"
#include "worker_send.h"

#define VOCAB 100
#define EOS 99
#define MAX_SEQ 64
#define N_SEQS 4

/* ---- the coordinator and its sequences ---- */

static const struct worker_msg_limits worker_limits = {
    .n_slots = N_SEQS, .max_seq_len = MAX_SEQ, .k_max = SPECULATE_K_MAX, .vocab_size = VOCAB};

struct fixture {
    struct coordinator c;
};

static void worker_up(struct worker *w, const char *backend)
{
    w->up = true;
    snprintf(w->backend, sizeof w->backend, "%s", backend);
    w->vocab_size = VOCAB;
    w->eos_ids[0] = EOS;
    w->n_eos = 1;
    w->max_seq_len = MAX_SEQ;
    w->n_slots = N_SEQS;
}

/* A coordinator with a target and a draft, their cores shared (no
 * pre-drafts) and the draft's buffer not POSIX (no verification beside its
 * draft); a test that wants either says so. */
static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof *f);
    if (!f || coord_test_init(&f->c, N_SEQS) != 0)
        return -1;
    struct coordinator *c = &f->c;
    c->cfg.coordinator.spec_k_max = 8;
    worker_up(&c->pair[0].worker[ROLE_TARGET], "cuda");
    worker_up(&c->pair[0].worker[ROLE_DRAFT], "cuda");
    c->pair[0].worker[ROLE_DRAFT].shm = cJSON_CreateObject();
    c->pair[0].worker[ROLE_DRAFT].shm_posix = false;
    c->pair[0].draft_gen = 1;
    if (!c->pair[0].worker[ROLE_DRAFT].shm)
        return -1;
    /* no pre-drafts and no verification beside its draft unless a test
     * asks for them: rounds one at a time */
    c->pair[0].cores_shared = true;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    coord_test_fini(&f->c);
    free(f);
    return 0;
}

static struct worker_msg_draft expect_draft(void)
{
    struct worker_msg_draft d;
    char err[ERR_MSG_MAX];
    assert_int_equal(worker_msg_draft_decode(next_command(ROLE_DRAFT, PROTOCOL_DRAFT),
                                             &worker_limits, &d, err), 0);
    return d;
}

/* A target command as a test reads it: whichever of prefill, run,
 * verify_matched, verify_tree and verify came, decoded by its own decoder,
 * flattened (k 0 for a prefill and a run, steps 1 but for a run). */
struct target_cmd {
    const char *type;
    int64_t round;
    int keep_len, k, half, steps;
    const int32_t *feed;
    int n_feed;
    int32_t drafts[WORKER_MSG_TREE_NODES_MAX];
    int n_drafts;           /* verify_matched and verify_tree only */
    int32_t parents[WORKER_MSG_TREE_NODES_MAX]; /* verify_tree only */
    bool await_draft;
    const cJSON *shm;
};

/* Whether e is one of the target's commands (expect_verify reads it). */
static bool is_target_cmd(const struct sent *e)
{
    const char *t = e->msg.type;
    return e->role == ROLE_TARGET && (strcmp(t, PROTOCOL_PREFILL) == 0 || strcmp(t, PROTOCOL_RUN) == 0 ||
                                      strcmp(t, PROTOCOL_VERIFY_MATCHED) == 0 || strcmp(t, PROTOCOL_VERIFY_TREE) == 0 ||
                                      strcmp(t, PROTOCOL_VERIFY) == 0);
}

static void take_call(struct target_cmd *t, const struct worker_msg_target_call *call)
{
    t->round = call->round;
    t->keep_len = call->keep_len;
    t->feed = call->feed;
    t->n_feed = call->n_feed;
}

static struct target_cmd expect_verify(void)
{
    assert_true(next_sent < n_sent);
    const char *type = sent_log[next_sent].msg.type;
    struct protocol_msg *m = next_command(ROLE_TARGET, type);
    struct target_cmd t = {.type = type, .steps = 1};
    char err[ERR_MSG_MAX] = "";
    int rc = ERR_PROTOCOL;
    if (strcmp(type, PROTOCOL_PREFILL) == 0) {
        struct worker_msg_prefill p;
        rc = worker_msg_prefill_decode(m, &worker_limits, &p, err);
        t.round = p.round;
        t.feed = p.prompt;
        t.n_feed = p.n_prompt;
    } else if (strcmp(type, PROTOCOL_RUN) == 0) {
        struct worker_msg_run r;
        rc = worker_msg_run_decode(m, &worker_limits, &r, err);
        take_call(&t, &r.call);
        t.steps = r.steps;
    } else if (strcmp(type, PROTOCOL_VERIFY_MATCHED) == 0) {
        struct worker_msg_verify_matched vm;
        rc = worker_msg_verify_matched_decode(m, &worker_limits, &vm, err);
        take_call(&t, &vm.call);
        t.k = t.n_drafts = vm.n_drafts;
        memcpy(t.drafts, vm.drafts, sizeof vm.drafts);
    } else if (strcmp(type, PROTOCOL_VERIFY_TREE) == 0) {
        struct worker_msg_verify_tree vt;
        rc = worker_msg_verify_tree_decode(m, &worker_limits, &vt, err);
        take_call(&t, &vt.call);
        t.k = t.n_drafts = vt.n_nodes;
        memcpy(t.drafts, vt.drafts, sizeof vt.drafts);
        memcpy(t.parents, vt.parents, sizeof vt.parents);
    } else if (strcmp(type, PROTOCOL_VERIFY) == 0) {
        struct worker_msg_verify v;
        rc = worker_msg_verify_decode(m, &worker_limits, &v, err);
        take_call(&t, &v.call);
        t.k = v.k;
        t.half = v.half;
        t.await_draft = v.await_draft;
        t.shm = v.shm;
    } else {
        fail_msg("expected a target command, got %s", type);
    }
    if (rc != 0)
        fail_msg("%s: %s", type, err);
    return t;
}

static void expect_releases(void)
{
    next_command(ROLE_DRAFT, PROTOCOL_RELEASE);
    next_command(ROLE_TARGET, PROTOCOL_RELEASE);
}

static void assert_feed(const int32_t *feed, int n_feed, const int32_t *want, int n_want)
{
    assert_int_equal(n_feed, n_want);
    for (int i = 0; i < n_want; i++)
        if (feed[i] != want[i])
            fail_msg("feed[%d] is %d, want %d", i, feed[i], want[i]);
}

/* ---- worker replies ---- */

/* Hands a worker's message to the scheduler as from a worker of s's pair. */
static void feed_msg(struct coordinator *c, int pair, cJSON *h, const struct protocol_frame *frame,
                     void (*handle)(struct coordinator *, int, const struct protocol_msg *))
{
    assert_non_null(h);
    struct protocol_msg m = over_the_wire(h, frame);
    cJSON_Delete(h);
    handle(c, pair, &m);
    protocol_msg_free(&m);
}

static void verify_done(struct coordinator *c, const struct seq *s, int64_t round, int n_acc,
                        const int32_t *tokens, int step)
{
    struct worker_msg_verify_done m = {
        .seq = {.req = (int64_t)s->req, .slot = s->slot}, .round = round, .n_accepted = n_acc,
        .verify_ms = 1.0, .idle_ms = -1, .step = step, .tokens = tokens, .n_tokens = n_acc + 1};
    struct protocol_frame frame;
    cJSON *h = worker_msg_verify_done_encode(&m, &frame);
    feed_msg(c, s->pair, h, &frame, scheduler_on_verify_done);
}

static void draft_ready(struct coordinator *c, const struct seq *s, int64_t round, int half, int k,
                        int guess, bool predraft)
{
    struct worker_msg_draft_ready m = {
        .seq = {.req = (int64_t)s->req, .slot = s->slot}, .half = half, .round = round, .k = k,
        .guess = guess, .predraft = predraft, .draft_ms = 0.5};
    feed_msg(c, s->pair, worker_msg_draft_ready_encode(&m), NULL, scheduler_on_draft_ready);
}

static void worker_error(struct coordinator *c, enum worker_role role, const struct seq *s,
                         int code, const char *in_reply_to)
{
    const struct worker_msg_seq seq = {.req = (int64_t)s->req, .slot = s->slot};
    cJSON *h = worker_msg_error_encode(&seq, code, "a test's error", in_reply_to);
    assert_non_null(h);
    struct protocol_msg m = over_the_wire(h, NULL);
    cJSON_Delete(h);
    scheduler_on_worker_error(c, s->pair, role, &m);
    protocol_msg_free(&m);
}

/* Admits a request and answers its prefill with `first`: returns it with
 * the first round's command(s) in the log. */
static struct seq *prefilled(struct coordinator *c, int max_tokens, int k_fixed, int32_t first)
{
    const int32_t prompt[3] = {1, 2, 3};
    struct seq *s = request(c, prompt, 3, max_tokens, k_fixed);
    struct worker_msg_prefill p;
    char err[ERR_MSG_MAX];
    assert_int_equal(worker_msg_prefill_decode(next_command(ROLE_DRAFT, PROTOCOL_PREFILL),
                                               &worker_limits, &p, err), 0);
    assert_feed(p.prompt, p.n_prompt, prompt, 3);
    struct target_cmd v = expect_verify();
    assert_string_equal(v.type, PROTOCOL_PREFILL);
    assert_true(v.k == 0 && v.keep_len == 0 && v.round == 1);
    assert_feed(v.feed, v.n_feed, prompt, 3);
    no_more_commands();
    verify_done(c, s, 1, 0, &first, 1);
    return s;
}

/* prefilled, then its first round up to the verification: returns the
 * sequence, the draft and the verify commands in *d and *v. */
static struct seq *verifying(struct coordinator *c, int max_tokens, struct worker_msg_draft *d,
                             struct target_cmd *v)
{
    struct seq *s = prefilled(c, max_tokens, 2, 40);
    *d = expect_draft();
    draft_ready(c, s, d->round, 0, d->k, -1, false);
    *v = expect_verify();
    return s;
}

/* The registry's part when the draft is lost (registry_draft_lost): the
 * worker down, a new draft generation, every active sequence told. */
static void lose_draft(struct coordinator *c)
{
    c->pair[0].worker[ROLE_DRAFT].up = false;
    c->pair[0].draft_gen++;
    for (int i = 0; i < c->n_seqs; i++)
        if (c->seqs[i].state == SEQ_ACTIVE)
            scheduler_forget_draft(c, &c->seqs[i]);
}

/* Answers every command for s as the workers would (drafts of the asked k;
 * a pre-draft the draft could not make; every draft accepted; plain runs
 * step by step) until s ends, and fails if s waits for something nothing
 * will send (a stall). Returns the number of drafts asked for. */
static int run_to_end(struct coordinator *c, struct seq *s)
{
    const uint64_t req = s->req;
    int32_t next_tok = 10, drafts = 0;
    for (int guard = 0; s->state == SEQ_ACTIVE && s->req == req; guard++) {
        assert_true(guard < 200);
        if (next_sent >= n_sent)
            fail_msg("request stalled in round state %d", (int)s->round.state);
        const struct sent *e = &sent_log[next_sent];
        if (e->role == ROLE_DRAFT && strcmp(e->msg.type, PROTOCOL_DRAFT) == 0) {
            struct worker_msg_draft d = expect_draft();
            drafts++;
            draft_ready(c, s, d.round, 0, d.k, -1, false);
            if (d.predraft_k > 0)
                draft_ready(c, s, d.round + 1, 1, 0, -1, true);
        } else if (is_target_cmd(e)) {
            struct target_cmd v = expect_verify();
            for (int step = 1; step <= v.steps && s->state == SEQ_ACTIVE && s->req == req; step++) {
                int32_t t[SPECULATE_K_MAX + 1];
                for (int i = 0; i <= v.k; i++)
                    t[i] = 10 + (next_tok++ % 80); /* never EOS */
                verify_done(c, s, v.round, v.k, t, step);
            }
        } else {
            next_sent++; /* a release or a prefill: nothing to answer */
        }
    }
    return drafts;
}

/* A sequence that ended with all max_tokens generated and a done reply. */
static void assert_done_with(int max_tokens)
{
    assert_int_equal(rep.dones, 1);
    assert_int_equal(rep.errors, 0);
    assert_int_equal(rep.last_finish, METRICS_FINISH_LENGTH);
    assert_int_equal(rep.n_done_ids, max_tokens);
}

/* ---- tests ---- */

static void test_scheduler_admission_prefills_both_workers(void **state)
{
    struct fixture *f = *state;
    struct seq *s = prefilled(&f->c, 10, 2, 40);
    assert_int_equal(s->state, SEQ_ACTIVE);
    assert_int_equal(s->n_hist, 4);
    assert_int_equal(f->c.n_active, 1);
    /* the prefill's token is streamed; the first round drafts */
    assert_int_equal(rep.streams, 1);
    struct worker_msg_draft d = expect_draft();
    assert_int_equal(d.k, 2);
}

/* keep_len/feed of each next draft: what the draft's cache holds. A partial
 * acceptance keeps the accepted drafts cached (the correction is fed); a
 * full one keeps the k-1 drafts it fed (the last draft and the bonus are
 * fed). */
static void test_scheduler_round_keeps_the_draft_cache_right(void **state)
{
    struct fixture *f = *state;
    struct coordinator *c = &f->c;
    struct seq *s = prefilled(c, 20, 2, 40);
    /* round 1: the draft holds the prompt; it is fed the prefill's token */
    struct worker_msg_draft d = expect_draft();
    const int32_t hist1[1] = {40};
    assert_int_equal(d.keep_len, 3);
    assert_feed(d.feed, d.n_feed, hist1, 1);
    assert_int_equal(d.k, 2);
    assert_int_equal(d.predraft_k, 0);
    no_more_commands();
    draft_ready(c, s, d.round, 0, 2, -1, false);
    struct target_cmd v = expect_verify();
    assert_true(v.k == 2 && v.half == 0 && v.round == d.round && v.keep_len == 3);
    assert_feed(v.feed, v.n_feed, hist1, 1);
    /* one of two accepted, then the correction */
    const int32_t t1[2] = {41, 52};
    verify_done(c, s, v.round, 1, t1, 1);
    assert_int_equal(s->n_hist, 6);
    d = expect_draft();
    /* cached: prompt + 40 + the accepted draft 41; fed: the correction */
    const int32_t feed2[1] = {52};
    assert_int_equal(d.keep_len, 5);
    assert_feed(d.feed, d.n_feed, feed2, 1);
    draft_ready(c, s, d.round, 0, 2, -1, false);
    v = expect_verify();
    assert_true(v.k == 2 && v.keep_len == 5);
    /* both accepted, then the bonus */
    const int32_t t2[3] = {53, 54, 55};
    verify_done(c, s, v.round, 2, t2, 1);
    assert_int_equal(s->n_hist, 9);
    d = expect_draft();
    /* the draft fed its first draft only: the second draft and the bonus go in */
    const int32_t feed3[2] = {54, 55};
    assert_int_equal(d.keep_len, 7);
    assert_feed(d.feed, d.n_feed, feed3, 2);
    no_more_commands();
}

/* A pre-draft made while the target verifies: used at once when all drafts
 * were accepted and its guess is the bonus (from half 1, past the guess);
 * dropped otherwise, the next draft then rolling back to before the bonus. */
static void test_scheduler_predraft_hit_and_miss(void **state)
{
    struct fixture *f = *state;
    struct coordinator *c = &f->c;
    c->pair[0].cores_shared = false; /* the draft has hardware of its own: pre-drafts */
    struct seq *s = prefilled(c, 30, 2, 40);
    struct worker_msg_draft d = expect_draft();
    assert_int_equal(d.predraft_k, 2);
    draft_ready(c, s, d.round, 0, 2, -1, false);
    struct target_cmd v = expect_verify();
    /* the pre-draft arrives first, guessing 62 */
    draft_ready(c, s, d.round + 1, 1, 2, 62, true);
    no_more_commands();
    const int32_t t1[3] = {60, 61, 62};
    verify_done(c, s, v.round, 2, t1, 1);
    /* hit: verified at once from half 1, nothing sent to the draft */
    v = expect_verify();
    assert_true(v.k == 2 && v.half == 1 && v.round == d.round + 1);
    assert_int_equal(v.keep_len, s->n_hist - 1);
    const int32_t bonus1[1] = {62};
    assert_feed(v.feed, v.n_feed, bonus1, 1);
    assert_int_equal(s->predraft_used, 1);
    no_more_commands();
    /* the pre-drafted round: both accepted -> the draft holds all but the
     * last pre-draft and the bonus */
    const int32_t t2[3] = {63, 64, 65};
    const int before = s->n_hist;
    verify_done(c, s, v.round, 2, t2, 1);
    d = expect_draft();
    assert_int_equal(d.keep_len, before + 1);
    const int32_t feed2[2] = {64, 65};
    assert_feed(d.feed, d.n_feed, feed2, 2);
    /* miss: the verification's reply comes before the pre-draft, whose
     * guess is then wrong */
    draft_ready(c, s, d.round, 0, d.k, -1, false);
    v = expect_verify();
    const int32_t t3[3] = {66, 67, 70};
    verify_done(c, s, v.round, d.k, t3, 1);
    no_more_commands(); /* waits for the pre-draft on its way */
    draft_ready(c, s, d.round + 1, 1, d.k, 68, true);
    d = expect_draft();
    /* rolled back: the pre-draft fed 67 and the guess; the bonus 70 is fed */
    assert_int_equal(d.keep_len, s->n_hist - 1);
    const int32_t feed3[1] = {70};
    assert_feed(d.feed, d.n_feed, feed3, 1);
    assert_int_equal(s->predraft_used, 1);
    assert_int_equal(s->predraft_offered, 2);
}

/* A pre-draft the draft could not make (its reply says k 0, guess -1)
 * that arrives before the verification's reply: when every draft is then
 * accepted, nothing more is on its way and the next round goes out at once
 * rather than waiting for it. */
static void test_scheduler_failed_predraft_does_not_stall(void **state)
{
    struct fixture *f = *state;
    struct coordinator *c = &f->c;
    c->pair[0].cores_shared = false;
    struct seq *s = prefilled(c, 30, 2, 40);
    struct worker_msg_draft d = expect_draft();
    assert_int_equal(d.predraft_k, 2);
    draft_ready(c, s, d.round, 0, 2, -1, false);
    struct target_cmd v = expect_verify();
    draft_ready(c, s, d.round + 1, 1, 0, -1, true);
    no_more_commands();
    const int32_t t1[3] = {60, 61, 62};
    verify_done(c, s, v.round, 2, t1, 1);
    d = expect_draft();
    /* the draft fed its drafts up to 60: 61 and the bonus go in */
    assert_int_equal(d.keep_len, s->n_hist - 2);
    const int32_t feed[2] = {61, 62};
    assert_feed(d.feed, d.n_feed, feed, 2);
    assert_int_equal(s->predraft_used, 0);
}

/* Replies that are not the awaited ones change nothing. */
static void test_scheduler_drops_stale_replies(void **state)
{
    struct fixture *f = *state;
    struct coordinator *c = &f->c;
    struct seq *s = prefilled(c, 20, 2, 40);
    struct worker_msg_draft d = expect_draft();
    const int n_hist = s->n_hist;
    const int32_t t[3] = {41, 42, 43};
    /* a verification's reply while none is in flight, an old round's draft */
    verify_done(c, s, d.round, 2, t, 1);
    draft_ready(c, s, d.round - 2, 0, 2, -1, false);
    /* a reply for a request that does not exist */
    struct seq ghost = *s;
    ghost.req = 9999;
    draft_ready(c, &ghost, d.round, 0, 2, -1, false);
    no_more_commands();
    assert_int_equal(s->n_hist, n_hist);
    draft_ready(c, s, d.round, 0, 2, -1, false);
    struct target_cmd v = expect_verify();
    /* the same draft_ready again, and the previous round's verify_done */
    draft_ready(c, s, d.round, 0, 2, -1, false);
    verify_done(c, s, 1, 0, t, 1);
    no_more_commands();
    assert_int_equal(s->n_hist, n_hist);
    verify_done(c, s, v.round, 2, t, 1);
    assert_int_equal(s->n_hist, n_hist + 3);
    /* and that round's reply once more: dropped */
    verify_done(c, s, v.round, 2, t, 1);
    assert_int_equal(s->n_hist, n_hist + 3);
    assert_int_equal(rep.errors, 0);
}

/* A verify_done claiming more accepted drafts than the round had fails
 * the request: the target is broken. */
static void test_scheduler_fails_a_malformed_reply(void **state)
{
    struct fixture *f = *state;
    struct coordinator *c = &f->c;
    struct worker_msg_draft d;
    struct target_cmd v;
    struct seq *s = verifying(c, 20, &d, &v);
    const int32_t t[4] = {41, 42, 43, 44};
    verify_done(c, s, v.round, 3, t, 1);
    assert_int_equal(rep.errors, 1);
    assert_int_equal(rep.last_error, METRICS_ERR_INTERNAL);
    expect_releases();
    assert_int_equal(s->state, SEQ_FREE);
    assert_int_equal(c->n_active, 0);
}

/* The draft goes away mid-round: the sequence goes on without it, in plain
 * steps the target runs back to back, to the end. */
static void test_scheduler_lost_draft_falls_back_to_plain_steps(void **state)
{
    struct fixture *f = *state;
    struct coordinator *c = &f->c;
    struct seq *s = prefilled(c, 12, 2, 40);
    (void)expect_draft();
    c->pair[0].worker[ROLE_DRAFT].up = false;
    c->pair[0].draft_gen++;
    scheduler_forget_draft(c, s);
    struct target_cmd v = expect_verify();
    assert_int_equal(v.k, 0);
    const int room = s->max_tokens - s->generated;
    assert_int_equal(v.steps, room);
    /* the steps are answered one by one; nothing is sent in between */
    int32_t tok = 70;
    for (int step = 1; step < v.steps; step++, tok++) {
        verify_done(c, s, v.round, 0, &tok, step);
        no_more_commands();
    }
    assert_int_equal(rep.dones, 0);
    verify_done(c, s, v.round, 0, &tok, v.steps);
    assert_int_equal(rep.dones, 1);
    assert_int_equal(rep.last_finish, METRICS_FINISH_LENGTH);
    assert_int_equal(rep.n_done_ids, 12);
    next_command(ROLE_TARGET, PROTOCOL_RELEASE); /* only the target: the draft is down */
    no_more_commands();
}

/* Draft errors: the round moves on from an empty draft cache; the third
 * turns speculation off for the request. */
static void test_scheduler_draft_errors_turn_speculation_off(void **state)
{
    struct fixture *f = *state;
    struct coordinator *c = &f->c;
    struct seq *s = prefilled(c, 40, 2, 40);
    for (int e = 0; e < COORD_DRAFT_ERRORS_MAX - 1; e++) {
        struct worker_msg_draft d = expect_draft();
        (void)d;
        worker_error(c, ROLE_DRAFT, s, ERR_INTERNAL, PROTOCOL_DRAFT);
        /* the next round re-feeds everything */
        d = expect_draft();
        assert_int_equal(d.keep_len, 0);
        assert_int_equal(d.n_feed, s->n_hist);
        draft_ready(c, s, d.round, 0, d.k, -1, false);
        struct target_cmd v = expect_verify();
        const int32_t t[3] = {41, 42, 43};
        verify_done(c, s, v.round, 0, t, 1);
    }
    (void)expect_draft();
    worker_error(c, ROLE_DRAFT, s, ERR_INTERNAL, PROTOCOL_DRAFT);
    assert_true(s->spec_off);
    struct target_cmd v = expect_verify();
    assert_int_equal(v.k, 0);
    assert_true(v.steps > 1);
    assert_int_equal(rep.errors, 0);
}

/* Beside its draft (POSIX buffer, own cores): the verification goes out
 * with the draft. The target giving up waiting is not the request's end:
 * once the draft answers, it goes the usual way. */
static void test_scheduler_verify_beside_draft_and_its_timeout(void **state)
{
    struct fixture *f = *state;
    struct coordinator *c = &f->c;
    c->pair[0].cores_shared = false;
    c->pair[0].worker[ROLE_DRAFT].shm_posix = true;
    struct seq *s = prefilled(c, 20, 2, 40);
    struct worker_msg_draft d = expect_draft();
    struct target_cmd v = expect_verify();
    assert_true(v.await_draft && v.k == 2 && v.round == d.round);
    no_more_commands();
    worker_error(c, ROLE_TARGET, s, ERR_TIMEOUT, PROTOCOL_VERIFY);
    assert_int_equal(rep.errors, 0);
    no_more_commands();
    draft_ready(c, s, d.round, 0, 2, -1, false);
    v = expect_verify();
    assert_true(!v.await_draft && v.k == 2 && v.round == d.round);
    const int32_t t[2] = {41, 42};
    verify_done(c, s, v.round, 1, t, 1);
    assert_int_equal(s->n_hist, 6);
}

/* The round's state at each step: prefill, a fresh draft, its
 * verification, a fully accepted round waiting for its pre-draft, the
 * pre-draft verified at once, and plain steps once the draft is gone. */
static void test_scheduler_round_states(void **state)
{
    struct fixture *f = *state;
    struct coordinator *c = &f->c;
    c->pair[0].cores_shared = false;
    const int32_t prompt[3] = {1, 2, 3};
    struct seq *s = request(c, prompt, 3, 30, 2);
    assert_int_equal(s->round.state, ROUND_PREFILLING);
    next_command(ROLE_DRAFT, PROTOCOL_PREFILL);
    struct target_cmd v = expect_verify();
    const int32_t first = 40;
    verify_done(c, s, v.round, 0, &first, 1);
    assert_int_equal(s->round.state, ROUND_DRAFTING);
    struct worker_msg_draft d = expect_draft();
    assert_int_equal(s->round.predraft.state, PREDRAFT_PENDING);
    draft_ready(c, s, d.round, 0, 2, -1, false);
    assert_int_equal(s->round.state, ROUND_VERIFYING);
    v = expect_verify();
    const int32_t t1[3] = {60, 61, 62};
    verify_done(c, s, v.round, 2, t1, 1);
    assert_int_equal(s->round.state, ROUND_AWAIT_PREDRAFT);
    no_more_commands();
    draft_ready(c, s, d.round + 1, 1, 2, 62, true);
    assert_int_equal(s->round.state, ROUND_VERIFYING);
    assert_int_equal(s->round.predraft.state, PREDRAFT_NONE);
    v = expect_verify();
    assert_int_equal(v.half, 1);
    /* the draft is lost while the target verifies: nothing changes until
     * its reply, then plain steps */
    lose_draft(c);
    assert_int_equal(s->round.state, ROUND_VERIFYING);
    no_more_commands();
    const int32_t t2[2] = {63, 70};
    verify_done(c, s, v.round, 1, t2, 1);
    assert_int_equal(s->round.state, ROUND_PLAIN_RUN);
    v = expect_verify();
    assert_true(v.k == 0 && v.steps > 1);
    /* a step answered: the run goes on at the target */
    const int32_t t3 = 71;
    verify_done(c, s, v.round, 0, &t3, 1);
    assert_int_equal(s->round.state, ROUND_PLAIN_RUN);
    no_more_commands();
}

/* ---- the round's transitions as a table: (state, event) -> (state, commands) ----
 *
 * Each line brings a fresh sequence into a state (reach), makes one event
 * happen through the scheduler's own entry points (fire), and states the
 * round's state when the scheduler returns and the commands it sent, in
 * order ("role:type", space-separated). IDLE never lasts past a call: a
 * transition to IDLE shows as the next round's state and commands. Every
 * transition round.h allows is some line's; test_round.c checks that the
 * table allows no other. */

struct at {
    struct seq *s;
    struct worker_msg_draft d;   /* the round's draft command, where there is one */
    struct target_cmd v;  /* the verification (or prefill) in flight */
};

static const int32_t at_prompt[3] = {1, 2, 3};
/* a fully accepted round of 2 drafts: the bonus is its last token */
static const int32_t all_accepted[3] = {60, 61, 62};
#define AT_BONUS 62

/* the pair's draft on hardware of its own: pre-drafts */
static void own_cores(struct coordinator *c)
{
    c->pair[0].cores_shared = false;
}

/* ... and over POSIX shared memory: verifications beside their drafts */
static void beside_capable(struct coordinator *c)
{
    own_cores(c);
    c->pair[0].worker[ROLE_DRAFT].shm_posix = true;
}

static void at_nothing(struct coordinator *c, struct at *a)
{
    (void)c;
    a->s = NULL;
}

static void at_prefilling(struct coordinator *c, struct at *a)
{
    a->s = request(c, at_prompt, 3, 30, 2);
    next_command(ROLE_DRAFT, PROTOCOL_PREFILL);
    a->v = expect_verify();
}

static void at_prefilling_beside(struct coordinator *c, struct at *a)
{
    beside_capable(c);
    at_prefilling(c, a);
}

static void at_drafting(struct coordinator *c, struct at *a)
{
    a->s = prefilled(c, 30, 2, 40);
    a->d = expect_draft();
}

static void at_verifying(struct coordinator *c, struct at *a)
{
    at_drafting(c, a);
    draft_ready(c, a->s, a->d.round, 0, a->d.k, -1, false);
    a->v = expect_verify();
}

static void at_verifying_with_predraft(struct coordinator *c, struct at *a)
{
    own_cores(c);
    at_verifying(c, a);
    assert_true(a->d.predraft_k > 0);
}

static void at_await_predraft(struct coordinator *c, struct at *a)
{
    at_verifying_with_predraft(c, a);
    verify_done(c, a->s, a->v.round, 2, all_accepted, 1);
}

static void at_beside(struct coordinator *c, struct at *a)
{
    beside_capable(c);
    a->s = prefilled(c, 30, 2, 40);
    a->d = expect_draft();
    a->v = expect_verify();
    assert_true(a->v.await_draft && a->d.predraft_k > 0);
}

static void at_beside_draft_in(struct coordinator *c, struct at *a)
{
    at_beside(c, a);
    draft_ready(c, a->s, a->d.round, 0, a->d.k, -1, false);
}

static void at_beside_draft_lost(struct coordinator *c, struct at *a)
{
    at_beside(c, a);
    lose_draft(c);
}

/* plain steps: no draft worker up when the request comes (room for more
 * than one run) */
static void at_plain_run(struct coordinator *c, struct at *a)
{
    c->pair[0].worker[ROLE_DRAFT].up = false;
    a->s = request(c, at_prompt, 3, 60, 2);
    a->v = expect_verify();
    const int32_t first = 40;
    verify_done(c, a->s, a->v.round, 0, &first, 1);
    a->v = expect_verify();
    assert_true(a->v.k == 0 && a->v.steps > 2);
}

/* ... its last step the next reply */
static void at_plain_run_last_step(struct coordinator *c, struct at *a)
{
    at_plain_run(c, a);
    for (int step = 1; step < a->v.steps; step++) {
        const int32_t t = 50 + step;
        verify_done(c, a->s, a->v.round, 0, &t, step);
    }
}

static void fire_admit(struct coordinator *c, struct at *a)
{
    a->s = request(c, at_prompt, 3, 30, 2);
}

/* the target's reply, one draft rejected (a prefill's or a step's: its token) */
static void fire_target_done(struct coordinator *c, struct at *a)
{
    const int32_t t[2] = {41, 42};
    const int n_acc = a->v.k > 0 ? 1 : 0;
    verify_done(c, a->s, a->v.round, n_acc, t, a->s->round.verify.done + 1);
}

static void fire_target_done_all(struct coordinator *c, struct at *a)
{
    verify_done(c, a->s, a->v.round, 2, all_accepted, 1);
}

static void fire_draft_ready(struct coordinator *c, struct at *a)
{
    draft_ready(c, a->s, a->d.round, 0, a->d.k, -1, false);
}

static void fire_draft_ready_wrong_k(struct coordinator *c, struct at *a)
{
    draft_ready(c, a->s, a->d.round, 0, a->d.k - 1, -1, false);
}

static void fire_draft_lost(struct coordinator *c, struct at *a)
{
    (void)a;
    lose_draft(c);
}

static void fire_predraft_hit(struct coordinator *c, struct at *a)
{
    draft_ready(c, a->s, a->d.round + 1, 1, a->d.predraft_k, AT_BONUS, true);
}

static void fire_predraft_miss(struct coordinator *c, struct at *a)
{
    draft_ready(c, a->s, a->d.round + 1, 1, a->d.predraft_k, AT_BONUS + 1, true);
}

static void fire_target_timeout(struct coordinator *c, struct at *a)
{
    worker_error(c, ROLE_TARGET, a->s, ERR_TIMEOUT, PROTOCOL_VERIFY);
}

struct round_case {
    const char *name;
    void (*reach)(struct coordinator *, struct at *);
    enum round_state from;
    void (*fire)(struct coordinator *, struct at *);
    enum round_state to;
    const char *commands;
};

static const struct round_case round_cases[] = {
    /* admission: the draft prefills beside the target's prefill */
    {"admitted", at_nothing, ROUND_IDLE, fire_admit, ROUND_PREFILLING, "draft:prefill target:prefill"},
    /* prefill_sent, then target_done: the first round drafts */
    {"prefill answered", at_prefilling, ROUND_PREFILLING, fire_target_done, ROUND_DRAFTING, "draft:draft"},
    /* ... and where the pair allows, its verification goes beside the draft */
    {"prefill answered, beside", at_prefilling_beside, ROUND_PREFILLING, fire_target_done,
     ROUND_VERIFY_BESIDE_DRAFT, "draft:draft target:verify"},
    /* verify_sent from DRAFTING */
    {"draft ready", at_drafting, ROUND_DRAFTING, fire_draft_ready, ROUND_VERIFYING, "target:verify"},
    /* draft_lost from DRAFTING: plain steps without a draft */
    {"draft lost while drafting", at_drafting, ROUND_DRAFTING, fire_draft_lost, ROUND_PLAIN_RUN, "target:run"},
    /* draft_lost from DRAFTING (a reply not what was asked): drafted again from scratch */
    {"draft of the wrong k", at_drafting, ROUND_DRAFTING, fire_draft_ready_wrong_k, ROUND_DRAFTING, "draft:draft"},
    /* target_done from VERIFYING: the next round */
    {"verified, one rejected", at_verifying, ROUND_VERIFYING, fire_target_done, ROUND_DRAFTING, "draft:draft"},
    /* ... a pre-draft on its way was abandoned: a fresh draft */
    {"verified, pre-draft abandoned", at_verifying_with_predraft, ROUND_VERIFYING, fire_target_done,
     ROUND_DRAFTING, "draft:draft"},
    /* predraft_awaited from VERIFYING */
    {"all accepted, pre-draft coming", at_verifying_with_predraft, ROUND_VERIFYING, fire_target_done_all,
     ROUND_AWAIT_PREDRAFT, ""},
    /* predraft_resolved: its guess is the bonus, verified at once (verify_sent from IDLE) */
    {"pre-draft hit", at_await_predraft, ROUND_AWAIT_PREDRAFT, fire_predraft_hit, ROUND_VERIFYING,
     "target:verify"},
    /* predraft_resolved: a wrong guess, a fresh draft */
    {"pre-draft miss", at_await_predraft, ROUND_AWAIT_PREDRAFT, fire_predraft_miss, ROUND_DRAFTING, "draft:draft"},
    /* draft_lost from AWAIT_PREDRAFT */
    {"draft lost awaiting the pre-draft", at_await_predraft, ROUND_AWAIT_PREDRAFT, fire_draft_lost,
     ROUND_PLAIN_RUN, "target:run"},
    /* target_done from VERIFY_BESIDE_DRAFT (its draft in): the next round, beside again */
    {"beside, verified", at_beside_draft_in, ROUND_VERIFY_BESIDE_DRAFT, fire_target_done,
     ROUND_VERIFY_BESIDE_DRAFT, "draft:draft target:verify"},
    /* predraft_awaited from VERIFY_BESIDE_DRAFT */
    {"beside, all accepted, pre-draft coming", at_beside_draft_in, ROUND_VERIFY_BESIDE_DRAFT,
     fire_target_done_all, ROUND_AWAIT_PREDRAFT, ""},
    /* target_gave_up: the draft not in, draft_ready will send the verification */
    {"beside, target gave up, draft awaited", at_beside, ROUND_VERIFY_BESIDE_DRAFT, fire_target_timeout,
     ROUND_DRAFTING, ""},
    /* verify_sent from VERIFY_BESIDE_DRAFT: the draft in, verified again the usual way */
    {"beside, target gave up, draft in", at_beside_draft_in, ROUND_VERIFY_BESIDE_DRAFT, fire_target_timeout,
     ROUND_VERIFYING, "target:verify"},
    /* beside_abandoned: the draft lost too */
    {"beside, target gave up, draft lost", at_beside_draft_lost, ROUND_VERIFY_BESIDE_DRAFT, fire_target_timeout,
     ROUND_PLAIN_RUN, "target:run"},
    /* step_done: the run goes on at the target by itself */
    {"plain step", at_plain_run, ROUND_PLAIN_RUN, fire_target_done, ROUND_PLAIN_RUN, ""},
    /* target_done from PLAIN_RUN: its last step, the next run */
    {"plain run's last step", at_plain_run_last_step, ROUND_PLAIN_RUN, fire_target_done, ROUND_PLAIN_RUN,
     "target:run"},
};

/* The commands recorded from index `from` on, as "role:type ...". */
static void commands_since(int from, char *out, size_t size)
{
    size_t used = 0;
    out[0] = '\0';
    for (int i = from; i < n_sent && used < size; i++)
        used += (size_t)snprintf(out + used, size - used, "%s%s:%s", i > from ? " " : "",
                                 coord_role_name((enum worker_role)sent_log[i].role), sent_log[i].msg.type);
}

static void test_scheduler_round_transitions_table(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof round_cases / sizeof round_cases[0]; i++) {
        const struct round_case *rc = &round_cases[i];
        void *fixture = NULL;
        assert_int_equal(setup(&fixture), 0);
        struct coordinator *c = &((struct fixture *)fixture)->c;
        log_clear();
        struct at a = {0};
        rc->reach(c, &a);
        if (a.s != NULL && a.s->round.state != rc->from)
            fail_msg("\"%s\": reached %s, not %s", rc->name, round_state_name(a.s->round.state),
                     round_state_name(rc->from));
        const int mark = n_sent;
        rc->fire(c, &a);
        char got[512];
        commands_since(mark, got, sizeof got);
        if (a.s->state != SEQ_ACTIVE || a.s->round.state != rc->to || strcmp(got, rc->commands) != 0)
            fail_msg("\"%s\": %s with [%s], want %s with [%s]", rc->name,
                     a.s->state == SEQ_ACTIVE ? round_state_name(a.s->round.state) : "(freed)", got,
                     round_state_name(rc->to), rc->commands);
        assert_int_equal(rep.errors, 0);
        teardown(&fixture);
        log_clear();
    }
}

/* A transition the table refuses fails the request (an internal error,
 * the slot released) instead of going on: a plain run's record corrupted to
 * say it verified drafts with a pre-draft on its way, so that its last
 * step's reply asks for predraft_awaited in PLAIN_RUN. */
static void test_scheduler_refused_transition_fails_the_request(void **state)
{
    struct fixture *f = *state;
    struct coordinator *c = &f->c;
    struct at a = {0};
    at_plain_run_last_step(c, &a);
    a.s->round.verify.k = 2;
    a.s->round.predraft.state = PREDRAFT_PENDING;
    const int mark = n_sent;
    verify_done(c, a.s, a.v.round, 2, all_accepted, a.s->round.verify.done + 1);
    assert_int_equal(rep.errors, 1);
    assert_int_equal(rep.last_error, METRICS_ERR_INTERNAL);
    assert_int_equal(a.s->state, SEQ_FREE);
    char got[512];
    commands_since(mark, got, sizeof got);
    assert_string_equal(got, "target:release");
}

/* The draft lost in each state a round can wait in: the sequence never
 * stalls, and ends with every token it asked for. */
static void test_scheduler_draft_lost_in_every_state(void **state)
{
    struct fixture *f = *state;
    struct coordinator *c = &f->c;
    const int max_tokens = 16;
    for (int where = 0; where < 5; where++) {
        log_clear();
        c->pair[0].worker[ROLE_DRAFT].up = true;
        c->pair[0].cores_shared = !(where == 2 || where == 3);
        c->pair[0].worker[ROLE_DRAFT].shm_posix = where == 2;
        struct seq *s = prefilled(c, max_tokens, 2, 40);
        enum round_state want = ROUND_DRAFTING;
        if (where == 0) {
            (void)expect_draft();
        } else if (where == 1) {
            /* verifying */
            struct worker_msg_draft d = expect_draft();
            draft_ready(c, s, d.round, 0, d.k, -1, false);
            want = ROUND_VERIFYING; /* its verify is answered by run_to_end */
        } else if (where == 2) {
            /* a verification beside its draft, the draft not in */
            (void)expect_draft();
            (void)expect_verify();
            want = ROUND_VERIFY_BESIDE_DRAFT;
        } else if (where == 3) {
            /* every draft accepted, the pre-draft on its way */
            struct worker_msg_draft d = expect_draft();
            assert_true(d.predraft_k > 0);
            draft_ready(c, s, d.round, 0, d.k, -1, false);
            struct target_cmd v = expect_verify();
            const int32_t t[3] = {41, 42, 43};
            verify_done(c, s, v.round, 2, t, 1);
            want = ROUND_AWAIT_PREDRAFT;
        } else if (where == 4) {
            /* a plain run: speculation off for this sequence */
            s->spec_off = true;
            struct worker_msg_draft d = expect_draft();
            draft_ready(c, s, d.round, 0, d.k, -1, false);
            struct target_cmd v = expect_verify();
            const int32_t t[2] = {41, 42};
            verify_done(c, s, v.round, 1, t, 1);
            want = ROUND_PLAIN_RUN;
        }
        assert_int_equal(s->round.state, want);
        lose_draft(c);
        if (where == 2) {
            /* the target gives up on the draft that will never come */
            worker_error(c, ROLE_TARGET, s, ERR_TIMEOUT, PROTOCOL_VERIFY);
        }
        const int drafts = run_to_end(c, s);
        if (drafts != 0)
            fail_msg("draft lost in round state %d: %d drafts asked for after", (int)want, drafts);
        assert_done_with(max_tokens);
    }
}

/* A draft error for a round whose verification went beside it: the target
 * then gives up waiting, and the sequence moves on without that draft
 * (never waiting for a draft_ready that will not come). */
static void test_scheduler_beside_draft_error_then_timeout(void **state)
{
    struct fixture *f = *state;
    struct coordinator *c = &f->c;
    c->pair[0].cores_shared = false;
    c->pair[0].worker[ROLE_DRAFT].shm_posix = true;
    struct seq *s = prefilled(c, 12, 2, 40);
    (void)expect_draft();
    struct target_cmd v = expect_verify();
    assert_true(v.await_draft);
    worker_error(c, ROLE_DRAFT, s, ERR_INTERNAL, PROTOCOL_DRAFT);
    assert_int_equal(s->round.state, ROUND_VERIFY_BESIDE_DRAFT);
    no_more_commands();
    worker_error(c, ROLE_TARGET, s, ERR_TIMEOUT, PROTOCOL_VERIFY);
    /* the next round re-feeds the draft from scratch */
    struct worker_msg_draft d = expect_draft();
    assert_int_equal(d.keep_len, 0);
    assert_int_equal(d.n_feed, s->n_hist);
    draft_ready(c, s, d.round, 0, d.k, -1, false);
    if (d.predraft_k > 0)
        draft_ready(c, s, d.round + 1, 1, 0, -1, true);
    run_to_end(c, s);
    assert_done_with(12);
}

/* draft "ngram": drafts made here from the sequence's own tokens travel in
 * the verification (point masses, no half, no draft worker involved); no
 * match means a short run of plain steps, then another look. */
static void test_scheduler_ngram_drafts_travel_in_the_verify(void **state)
{
    struct fixture *f = *state;
    struct coordinator *c = &f->c;
    ngram_params_default(&c->ngram);
    c->cfg.coordinator.spec_k_max = 3;
    const int32_t prompt[8] = {5, 6, 7, 8, 5, 6, 7, 8};
    struct seq *s = request_from(c, prompt, 8, 20, 0, REQUEST_DRAFT_NGRAM);
    /* no prefill for the draft worker: only the target's */
    struct target_cmd v = expect_verify();
    assert_int_equal(v.k, 0);
    no_more_commands();
    const int32_t first = 5;
    verify_done(c, s, v.round, 0, &first, 1);
    /* ... 7 8 5 6 7 8 5: predicted 6 7 8 (K 3) */
    v = expect_verify();
    assert_int_equal(v.k, 3);
    assert_int_equal(v.n_drafts, 3);
    const int32_t want[3] = {6, 7, 8};
    assert_memory_equal(v.drafts, want, sizeof want);
    assert_null(v.shm);
    assert_int_equal(s->round.state, ROUND_VERIFYING);
    no_more_commands();
    /* two accepted, then the correction 40: "7 40" never came before, so
     * no match: plain steps */
    const int32_t t[3] = {6, 7, 40};
    verify_done(c, s, v.round, 2, t, 1);
    assert_int_equal(c->metrics.ngram_drafts_total, 1);
    assert_int_equal(c->metrics.ngram_draft_tokens_total, 3);
    assert_int_equal(c->metrics.ngram_accepted_tokens_total, 2);
    assert_int_equal(s->draft_valid, 0);
    v = expect_verify();
    assert_int_equal(v.k, 0);
    assert_int_equal(v.steps, 4);
    assert_int_equal(s->round.state, ROUND_PLAIN_RUN);
    no_more_commands();
    /* still nothing to match after the run: the next run is twice as long */
    for (int step = 1; step <= 4; step++) {
        const int32_t fresh = 40 + step;
        verify_done(c, s, v.round, 0, &fresh, step);
    }
    v = expect_verify();
    assert_int_equal(v.k, 0);
    assert_int_equal(v.steps, 8);
}

/* spec_tree a node budget: an n-gram match with two continuations goes to
 * the target as one tree (verify_tree), its stats counted; the same round
 * is a chain (verify_matched) with spec_tree off or auto, with sampling
 * controls, and on a target that is not on the CPU. */
static void test_scheduler_ngram_tree_travels_in_verify_tree(void **state)
{
    struct fixture *f = *state;
    struct coordinator *c = &f->c;
    ngram_params_default(&c->ngram);
    c->cfg.coordinator.spec_k_max = 3;
    /* "5 6 7" was followed by 8, then by 9 */
    const int32_t prompt[10] = {5, 6, 7, 8, 5, 6, 7, 9, 5, 6};
    static const struct {
        int spec_tree;
        bool controls;
        const char *backend;
        const char *want; /* the round's command */
    } cases[] = {
        {16, false, "cpu", PROTOCOL_VERIFY_TREE},
        {REQUEST_SPEC_TREE_OFF, false, "cpu", PROTOCOL_VERIFY_MATCHED},
        {REQUEST_SPEC_TREE_AUTO, false, "cpu", PROTOCOL_VERIFY_MATCHED}, /* auto: chains until trees are measured */
        {16, true, "cpu", PROTOCOL_VERIFY_MATCHED},                      /* controls: not on the tree path */
        {16, false, "cuda", PROTOCOL_VERIFY_MATCHED},                    /* the CUDA tree forward: not run yet */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        log_clear();
        snprintf(c->pair[0].worker[ROLE_TARGET].backend, sizeof c->pair[0].worker[ROLE_TARGET].backend, "%s",
                 cases[i].backend);
        struct seq *s = request_from(c, prompt, 10, 20, 0, REQUEST_DRAFT_NGRAM);
        s->spec_tree = cases[i].spec_tree;
        s->ctl.presence_penalty = cases[i].controls ? 0.5f : 0.0f;
        struct target_cmd v = expect_verify();
        assert_int_equal(v.k, 0);
        const int32_t first = 7;
        verify_done(c, s, v.round, 0, &first, 1);
        v = expect_verify();
        if (strcmp(v.type, cases[i].want) != 0)
            fail_msg("case %zu: %s, expected %s", i, v.type, cases[i].want);
        if (strcmp(cases[i].want, PROTOCOL_VERIFY_TREE) != 0) {
            scheduler_cancel(c, s);
            continue;
        }
        /* 9 5 6 (the chain: the latest continuation first), and under the
         * root its runner-up 8 5 6 */
        const int32_t want_drafts[6] = {9, 5, 6, 8, 5, 6}, want_parents[6] = {-1, 0, 1, -1, 3, 4};
        assert_int_equal(v.n_drafts, 6);
        assert_memory_equal(v.drafts, want_drafts, sizeof want_drafts);
        assert_memory_equal(v.parents, want_parents, sizeof want_parents);
        assert_int_equal(v.keep_len, 10);
        /* the target took the second branch: 8 5, then its own 30 */
        const uint64_t rounds_before = c->metrics.tree_rounds_total;
        const int32_t t[3] = {8, 5, 30};
        verify_done(c, s, v.round, 2, t, 1);
        assert_int_equal(c->metrics.tree_rounds_total, rounds_before + 1);
        assert_int_equal(s->tree_rounds, 1);
        assert_int_equal(s->tree_nodes, 6);
        assert_int_equal(s->tree_accepted, 2);
        assert_int_equal(s->n_hist, 14);
        assert_int_equal(s->hist[11], 8);
        assert_int_equal(s->hist[13], 30);
        scheduler_cancel(c, s);
    }
    assert_int_equal(c->metrics.tree_nodes_total, 6);
    assert_int_equal(c->metrics.tree_accepted_tokens_total, 2);
}

/* spec_tree "auto": chains until the pair's rounds alone measured trees
 * paying (tree_choice.h), then a tree of DRAFTERS_AUTO_TREE_NODES;
 * in a batch chains again; and its matched rounds alone teach the choice. */
static void test_scheduler_auto_tree_where_trees_were_measured_paying(void **state)
{
    struct fixture *f = *state;
    struct coordinator *c = &f->c;
    ngram_params_default(&c->ngram);
    c->cfg.coordinator.spec_k_max = 3;
    const int32_t prompt[10] = {5, 6, 7, 8, 5, 6, 7, 9, 5, 6};
    snprintf(c->pair[0].worker[ROLE_TARGET].backend, sizeof c->pair[0].worker[ROLE_TARGET].backend, "cpu");
    for (int pass = 0; pass < 3; pass++) {
        log_clear();
        if (pass == 1) {
            /* chains gave a token in 10 ms, trees 2 */
            tree_choice_init(&c->pair[0].trees);
            for (int i = 0; i < 8; i++)
                tree_choice_note(&c->pair[0].trees, false, 1, 10.0);
            for (int i = 0; i < 8; i++)
                tree_choice_note(&c->pair[0].trees, true, 2, 10.0);
            assert_true(tree_choice_trees(&c->pair[0].trees));
        }
        struct seq *s = request_from(c, prompt, 10, 20, 0, REQUEST_DRAFT_NGRAM);
        s->spec_tree = REQUEST_SPEC_TREE_AUTO;
        if (pass == 2)
            c->pair[0].n_active = 2; /* a batch: another sequence shares the calls */
        struct target_cmd v = expect_verify();
        const int32_t first = 7;
        verify_done(c, s, v.round, 0, &first, 1);
        v = expect_verify();
        const char *want = pass == 1 ? PROTOCOL_VERIFY_TREE : PROTOCOL_VERIFY_MATCHED;
        if (strcmp(v.type, want) != 0)
            fail_msg("pass %d: %s, expected %s", pass, v.type, want);
        if (pass == 1) {
            /* 9 5 6 and its runner-up 8 5 6, within the 7 drafts of an
             * 8-node budget */
            assert_int_equal(v.n_drafts, 6);
            const int32_t want_parents[6] = {-1, 0, 1, -1, 3, 4};
            assert_memory_equal(v.parents, want_parents, sizeof want_parents);
        }
        if (pass == 0) {
            /* alone, its chain round is counted for the choice */
            const int before = c->pair[0].trees.rounds[0];
            const int32_t t[2] = {9, 30};
            verify_done(c, s, v.round, 1, t, 1);
            assert_int_equal(c->pair[0].trees.rounds[0], before + 1);
        }
        scheduler_cancel(c, s);
        c->pair[0].n_active = 0;
    }
}

/* Answers a sequence's commands until it ends, as run_to_end does, and
 * returns how many of its verifications carried drafts made here. */
static int inline_rounds_to_end(struct coordinator *c, struct seq *s, const int32_t *script, int n_script)
{
    const uint64_t req = s->req;
    int inline_rounds = 0, pos = s->n_hist - s->n_prompt;
    for (int guard = 0; s->state == SEQ_ACTIVE && s->req == req; guard++) {
        assert_true(guard < 200);
        if (next_sent >= n_sent)
            fail_msg("request stalled in round state %d", (int)s->round.state);
        const struct sent *e = &sent_log[next_sent];
        if (e->role == ROLE_DRAFT && strcmp(e->msg.type, PROTOCOL_DRAFT) == 0) {
            struct worker_msg_draft d = expect_draft();
            draft_ready(c, s, d.round, 0, d.k, -1, false);
            if (d.predraft_k > 0)
                draft_ready(c, s, d.round + 1, 1, 0, -1, true);
        } else if (is_target_cmd(e)) {
            struct target_cmd v = expect_verify();
            inline_rounds += v.n_drafts > 0;
            for (int step = 1; step <= v.steps && s->state == SEQ_ACTIVE && s->req == req; step++) {
                /* the target's choice is the script's next tokens: drafts that
                 * agree with it are accepted */
                int32_t t[SPECULATE_K_MAX + 1];
                int n_acc = 0;
                while (n_acc < v.k && pos + n_acc < n_script &&
                       (v.n_drafts == 0 || v.drafts[n_acc] == script[pos + n_acc]))
                    n_acc++;
                for (int i = 0; i <= n_acc; i++)
                    t[i] = script[(pos + i) % n_script];
                pos += n_acc + 1;
                verify_done(c, s, v.round, n_acc, t, step);
            }
        } else {
            next_sent++;
        }
    }
    return inline_rounds;
}

/* draft "suffix": a request served once is drafted from the suffix cache
 * the second time, its drafts the first one's output; "auto" does the same
 * for a greedy request (the match is long) and keeps the model for a
 * sampled one. */
static void test_scheduler_suffix_and_auto(void **state)
{
    struct fixture *f = *state;
    struct coordinator *c = &f->c;
    char err[ERR_MSG_MAX];
    assert_int_equal(suffix_cache_create(&c->suffix, 1 << 20, err), 0);
    c->cfg.coordinator.spec_k_max = 4;
    const int32_t prompt[10] = {11, 12, 13, 14, 15, 16, 17, 18, 19, 20};
    int32_t script[12];
    for (int i = 0; i < 12; i++)
        script[i] = 40 + (i * 7) % 23;
    /* served once with no drafts: stored when it finishes */
    struct seq *s = request_from(c, prompt, 10, 12, 0, REQUEST_DRAFT_NONE);
    assert_int_equal(inline_rounds_to_end(c, s, script, 12), 0);
    assert_int_equal(suffix_cache_requests(c->suffix), 1);
    /* again, drafting from the cache: every round after the prefill */
    log_clear();
    s = request_from(c, prompt, 10, 12, 0, REQUEST_DRAFT_SUFFIX);
    /* 12 tokens: the prefill's, two rounds of 4 drafts and a bonus, and a
     * last plain step (no room for a draft and the token after it) */
    assert_int_equal(inline_rounds_to_end(c, s, script, 12), 2);
    assert_int_equal(rep.n_done_ids, 12);
    assert_memory_equal(rep.done_ids, script, sizeof script);
    assert_int_equal(c->metrics.suffix_accepted_tokens_total, 8);
    assert_int_equal(c->metrics.ngram_drafts_total, 0);
    /* auto, greedy: the cache again */
    log_clear();
    s = request_from(c, prompt, 10, 12, 0, REQUEST_DRAFT_AUTO);
    assert_int_equal(inline_rounds_to_end(c, s, script, 12), 2);
    /* auto, greedy, no earlier request like it: a sequence repeating its
     * own 4-token context is drafted from its n-grams, beside the model */
    log_clear();
    const int32_t looping[12] = {61, 62, 63, 64, 65, 61, 62, 63, 64, 65, 61, 62};
    s = request_from(c, looping, 12, 6, 0, REQUEST_DRAFT_AUTO);
    (void)next_command(ROLE_DRAFT, PROTOCOL_PREFILL);
    struct target_cmd pv = expect_verify();
    const int32_t t63 = 63;
    verify_done(c, s, pv.round, 0, &t63, 1);
    pv = expect_verify();
    assert_true(pv.n_drafts >= 2);
    assert_int_equal(pv.drafts[0], 64);
    assert_int_equal(pv.drafts[1], 65);
    scheduler_cancel(c, s);
    /* auto, sampled: the model drafts, nothing is made here */
    log_clear();
    s = request_from(c, prompt, 10, 12, 2, REQUEST_DRAFT_AUTO);
    s->sp.temperature = 0.8f;
    assert_int_equal(inline_rounds_to_end(c, s, script, 12), 0);
    assert_true(c->metrics.num_drafts_total > c->metrics.suffix_drafts_total);
}

/* Which source "auto" takes for a greedy round (drafters_propose), one line
 * a case. Beside a usable model a short coincidence must not displace the
 * model's drafts: only an n-gram match of the longest context, or a long
 * suffix-cache match, is taken; without a model any match is. The suffix
 * cache holds one earlier request: 30..45. */
static void test_scheduler_auto_picks_its_source(void **state)
{
    struct fixture *f = *state;
    struct coordinator *c = &f->c;
    char err[ERR_MSG_MAX];
    ngram_params_default(&c->ngram); /* 2- to 4-grams */
    assert_int_equal(suffix_cache_create(&c->suffix, 1 << 20, err), 0);
    int32_t earlier[16];
    for (int i = 0; i < 16; i++)
        earlier[i] = 30 + i;
    assert_int_equal(suffix_cache_add(c->suffix, earlier, 16), 0);
    enum { NONE = -1 };
    static const struct {
        const char *what;
        int32_t hist[16];
        int n_hist;
        bool model_usable;
        int source; /* enum request_draft, or NONE: the round is the model's */
        int32_t first; /* the first draft, where there is one */
    } cases[] = {
        /* 7 8 came before, followed by 9; the 3- and 4-token contexts never did */
        {"a 2-token repeat beside a model: the model drafts",
         {1, 7, 8, 9, 2, 3, 4, 5, 6, 7, 8}, 11, true, NONE, 0},
        {"the same repeat with no model: the n-gram drafts it",
         {1, 7, 8, 9, 2, 3, 4, 5, 6, 7, 8}, 11, false, REQUEST_DRAFT_NGRAM, 9},
        {"a sequence repeating its own 4-token context: n-grams even beside a model",
         {61, 62, 63, 64, 65, 61, 62, 63, 64}, 9, true, REQUEST_DRAFT_NGRAM, 65},
        {"an earlier request matched over 10 tokens: the suffix cache",
         {5, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39}, 11, true, REQUEST_DRAFT_SUFFIX, 40},
        {"an earlier request matched over 5 tokens beside a model: the model",
         {5, 6, 9, 1, 2, 30, 31, 32, 33, 34}, 10, true, NONE, 0},
        {"the same short match with no model: the suffix cache",
         {5, 6, 9, 1, 2, 30, 31, 32, 33, 34}, 10, false, REQUEST_DRAFT_SUFFIX, 35},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct seq s = {.draft = REQUEST_DRAFT_AUTO, .pair = 0, .n_hist = cases[i].n_hist};
        sampling_params_default(&s.sp);
        s.sp.temperature = 0;
        s.hist = (int32_t *)cases[i].hist;
        snprintf(s.id, sizeof s.id, "case %zu", i);
        int32_t drafts[8];
        enum request_draft source = REQUEST_DRAFT_NONE;
        const int k = drafters_propose(c, &s, cases[i].model_usable, 4, drafts, &source);
        if (cases[i].source == NONE) {
            if (k != 0)
                fail_msg("%s: %d drafts from %s", cases[i].what, k, request_draft_name(source));
            continue;
        }
        if (k < 1 || (int)source != cases[i].source || drafts[0] != cases[i].first)
            fail_msg("%s: %d drafts from %s, the first %d; want %s, first %d", cases[i].what, k,
                     request_draft_name(source), k > 0 ? drafts[0] : -1,
                     request_draft_name((enum request_draft)cases[i].source), cases[i].first);
    }
}

/* Matched drafts go to the target only where a verification row is worth
 * it: always where the cost was not measured; on a CPU-like cost (a row
 * as dear as a call) only drafts nearly sure to pass; where the call
 * dominates (a GPU's) guesses too; fewer when a batch shares the call. */
static void test_scheduler_matched_drafts_only_where_they_pay(void **state)
{
    (void)state;
    assert_int_equal(drafters_worth_k(0.3, 8, 0, 0, 1), 8);
    assert_int_equal(drafters_worth_k(1.0, 8, 0.3, 28.6, 1), 8);
    assert_int_equal(drafters_worth_k(0.6, 8, 0.3, 28.6, 1), 0);
    const int gpu = drafters_worth_k(0.6, 8, 20.0, 0.5, 1);
    assert_true(gpu >= 2);
    assert_true(drafters_worth_k(0.6, 8, 20.0, 0.5, 16) < gpu);
    /* in the scheduler: an n-gram source on a CPU-like cost, its drafts
     * failing, stops drafting once its probes are spent */
    struct fixture *f = *state;
    struct coordinator *c = &f->c;
    ngram_params_default(&c->ngram);
    c->pair[0].call_ms_base = 0.3;
    c->pair[0].call_ms_per_row = 28.6;
    const int32_t prompt[8] = {5, 6, 7, 8, 5, 6, 7, 8};
    struct seq *s = request_from(c, prompt, 8, 40, 0, REQUEST_DRAFT_NGRAM);
    struct target_cmd v = expect_verify();
    int32_t tok = 5;
    verify_done(c, s, v.round, 0, &tok, 1);
    int probes = 0;
    for (int guard = 0; guard < 30 && s->state == SEQ_ACTIVE; guard++) {
        v = expect_verify();
        /* every draft rejected: the correction is a token never seen */
        int32_t t[SPECULATE_K_MAX + 1];
        t[0] = 90 + guard % 8;
        probes += v.n_drafts > 0;
        assert_true(v.n_drafts <= 2);
        for (int step = 1; step <= v.steps && s->state == SEQ_ACTIVE; step++)
            verify_done(c, s, v.round, 0, t, step);
        /* the sequence repeats its prompt's pattern for the n-grams to match */
        if (s->state == SEQ_ACTIVE)
            s->hist[s->n_hist - 1] = prompt[(s->n_hist - 1) % 4];
    }
    assert_true(probes >= 1 && probes <= 8);
}

/* End of sequence and max_tokens end a request with done, release its slot
 * on both workers and admit the next queued one. */
static void test_scheduler_endings_release_and_admit(void **state)
{
    struct fixture *f = *state;
    struct coordinator *c = &f->c;
    c->cfg.coordinator.max_concurrency = 1;
    struct seq *s = prefilled(c, 20, 2, 40);
    struct worker_msg_draft d = expect_draft();
    const int32_t prompt[2] = {5, 6};
    struct seq *queued = request(c, prompt, 2, 5, 2);
    assert_int_equal(queued->state, SEQ_QUEUED);
    draft_ready(c, s, d.round, 0, 2, -1, false);
    struct target_cmd v = expect_verify();
    const int32_t t[2] = {41, EOS};
    verify_done(c, s, v.round, 1, t, 1);
    assert_int_equal(rep.dones, 1);
    assert_int_equal(rep.last_finish, METRICS_FINISH_STOP);
    const int32_t want[3] = {40, 41, EOS};
    assert_int_equal(rep.n_done_ids, 3);
    assert_memory_equal(rep.done_ids, want, sizeof want);
    expect_releases();
    /* the queued request took the slot */
    assert_int_equal(queued->state, SEQ_ACTIVE);
    next_command(ROLE_DRAFT, PROTOCOL_PREFILL);
    v = expect_verify();
    assert_int_equal(v.n_feed, 2);
    /* max_tokens: 5 tokens, K never overflows what is left */
    int32_t first = 50;
    verify_done(c, queued, v.round, 0, &first, 1);
    int guard = 0;
    while (queued->state == SEQ_ACTIVE && guard++ < 10) {
        assert_true(next_sent < n_sent);
        int32_t tt[SPECULATE_K_MAX + 1];
        if (sent_log[next_sent].role == ROLE_DRAFT) {
            d = expect_draft();
            assert_true(d.k <= queued->max_tokens - queued->generated - 1);
            draft_ready(c, queued, d.round, 0, d.k, -1, false);
            v = expect_verify();
        } else {
            v = expect_verify(); /* the last token: a plain step */
            assert_int_equal(v.k, 0);
        }
        for (int i = 0; i <= v.k; i++)
            tt[i] = 51 + i;
        verify_done(c, queued, v.round, v.k, tt, 1);
    }
    assert_int_equal(rep.last_finish, METRICS_FINISH_LENGTH);
    assert_int_equal(rep.n_done_ids, 5);
}

/* ignore_eos: an EOS id is one more token, the request goes on until
 * max_tokens (the EOS among its ids). */
static void test_scheduler_ignore_eos_runs_to_max_tokens(void **state)
{
    struct fixture *f = *state;
    struct coordinator *c = &f->c;
    struct seq *s = prefilled(c, 4, 2, 40);
    s->ignore_eos = true;
    struct worker_msg_draft d = expect_draft();
    draft_ready(c, s, d.round, 0, 2, -1, false);
    struct target_cmd v = expect_verify();
    const int32_t t[2] = {41, EOS};
    verify_done(c, s, v.round, 1, t, 1);
    assert_int_equal(rep.dones, 0);
    assert_int_equal(s->state, SEQ_ACTIVE);
    assert_int_equal(s->generated, 3);
    /* the next round ends it at max_tokens, not at an EOS */
    v = sent_log[next_sent].role == ROLE_DRAFT ? (draft_ready(c, s, expect_draft().round, 0, 0, -1, false),
                                                  expect_verify())
                                               : expect_verify();
    const int32_t last = EOS;
    verify_done(c, s, v.round, 0, &last, 1);
    assert_int_equal(rep.dones, 1);
    assert_int_equal(rep.last_finish, METRICS_FINISH_LENGTH);
    const int32_t want[4] = {40, 41, EOS, EOS};
    assert_int_equal(rep.n_done_ids, 4);
    assert_memory_equal(rep.done_ids, want, sizeof want);
}

/* A target error fails the request with the error's meaning. */
static void test_scheduler_target_error_fails_the_request(void **state)
{
    struct fixture *f = *state;
    struct coordinator *c = &f->c;
    struct worker_msg_draft d;
    struct target_cmd v;
    struct seq *s = verifying(c, 20, &d, &v);
    worker_error(c, ROLE_TARGET, s, ERR_CONTEXT_FULL, PROTOCOL_VERIFY);
    assert_int_equal(rep.errors, 1);
    assert_int_equal(rep.last_error, METRICS_ERR_CONTEXT_FULL);
    expect_releases();
    assert_int_equal(s->state, SEQ_FREE);
}

/* A client whose queue is full loses token events: its request ends at
 * once with a cancelled error saying why (never a silently cut stream),
 * both workers release the slot, and the stats count it. */
static void test_scheduler_slow_client_is_cancelled_with_a_reason(void **state)
{
    struct fixture *f = *state;
    struct coordinator *c = &f->c;
    struct worker_msg_draft d;
    struct target_cmd v;
    struct seq *s = verifying(c, 20, &d, &v);
    assert_int_equal(s->state, SEQ_ACTIVE);
    assert_int_equal(rep.errors, 0); /* its first token went out: a queue with room */
    rep.queue_full = true;
    const int32_t tokens[3] = {41, 42, 43};
    verify_done(c, s, v.round, 2, tokens, 1);
    assert_int_equal(rep.errors, 1);
    assert_int_equal(rep.last_error, METRICS_ERR_CANCELLED);
    assert_non_null(strstr(rep.last_error_message, "did not read its replies"));
    assert_int_equal(c->metrics.slow_client_cancels_total, 1);
    expect_releases();
    assert_int_equal(s->state, SEQ_FREE);
}

/* Cancel in every state: queued (nothing to release), prefilling, drafting,
 * verifying (both workers release the slot); the workers' later replies
 * are stale. */
static void test_scheduler_cancel_in_every_state(void **state)
{
    struct fixture *f = *state;
    struct coordinator *c = &f->c;
    c->cfg.coordinator.max_concurrency = 1;
    const int32_t prompt[3] = {1, 2, 3};
    struct seq *a = request(c, prompt, 3, 10, 2);
    struct seq *b = request(c, prompt, 3, 10, 2);
    assert_int_equal(b->state, SEQ_QUEUED);
    next_command(ROLE_DRAFT, PROTOCOL_PREFILL);
    struct target_cmd v = expect_verify();
    /* queued */
    scheduler_cancel(c, b);
    assert_int_equal(b->state, SEQ_FREE);
    assert_int_equal(c->n_queued, 0);
    no_more_commands();
    /* prefilling */
    const uint64_t req_a = a->req;
    scheduler_cancel(c, a);
    expect_releases();
    assert_int_equal(c->n_active, 0);
    struct seq stale = {.req = req_a, .slot = 0};
    int32_t tok = 40;
    verify_done(c, &stale, v.round, 0, &tok, 1);
    no_more_commands();
    /* drafting */
    struct seq *s = prefilled(c, 10, 2, 40);
    struct worker_msg_draft d = expect_draft();
    struct seq copy = *s;
    scheduler_cancel(c, s);
    expect_releases();
    draft_ready(c, &copy, d.round, 0, 2, -1, false);
    no_more_commands();
    /* verifying */
    s = verifying(c, 10, &d, &v);
    copy = *s;
    scheduler_cancel(c, s);
    expect_releases();
    const int32_t t[3] = {41, 42, 43};
    verify_done(c, &copy, v.round, 2, t, 1);
    no_more_commands();
    assert_int_equal(rep.dones, 0);
    assert_int_equal(c->metrics.requests_failed[METRICS_ERR_CANCELLED], 4);
}

/* ---- several pairs ---- */

/* The last command taken went to this pair's worker. */
static void assert_to_pair(int pair)
{
    assert_true(next_sent > 0);
    if (sent_log[next_sent - 1].pair != pair)
        fail_msg("%s went to pair %d, want pair %d", sent_log[next_sent - 1].msg.type,
                 sent_log[next_sent - 1].pair, pair);
}

/* A second pair beside the fixture's: requests go to the pair with the
 * most free KV, then the fewest sequences; every command of a sequence goes
 * to its own pair's workers, a reply from the other pair's worker is stale,
 * and a pair whose pool can never hold a request is passed over. */
static void test_scheduler_pairs_spread_and_keep_to_their_own(void **state)
{
    struct coordinator *c = &((struct fixture *)*state)->c;
    c->n_pairs = 2;
    c->cfg.coordinator.max_concurrency = 1; /* a slot a pair; N_SEQS records hold a queued one too */
    worker_up(&c->pair[1].worker[ROLE_TARGET], "cuda");
    worker_up(&c->pair[1].worker[ROLE_DRAFT], "cuda");
    c->pair[1].worker[ROLE_DRAFT].shm = cJSON_CreateObject();
    assert_non_null(c->pair[1].worker[ROLE_DRAFT].shm);
    c->pair[1].draft_gen = 1;
    c->pair[1].cores_shared = true;
    const int32_t prompt[3] = {1, 2, 3};
    struct seq *s[2];
    const int want_pair[2] = {0, 1};
    for (int i = 0; i < 2; i++) {
        s[i] = request(c, prompt, 3, 6, 2);
        assert_int_equal(s[i]->state, SEQ_ACTIVE);
        assert_int_equal(s[i]->pair, want_pair[i]);
        assert_int_equal(s[i]->slot, 0); /* slots count per pair */
        next_command(ROLE_DRAFT, PROTOCOL_PREFILL);
        assert_to_pair(want_pair[i]);
        expect_verify();
        assert_to_pair(want_pair[i]);
    }
    no_more_commands();
    assert_int_equal(c->pair[0].n_active, 1);
    assert_int_equal(c->pair[1].n_active, 1);
    /* every slot taken: the next one waits */
    struct seq *queued = request(c, prompt, 3, 6, 2);
    assert_int_equal(queued->state, SEQ_QUEUED);
    no_more_commands();
    /* s[1] (pair 1, slot 0) and s[0] (pair 0, slot 0) differ only by pair:
     * pair 0's target answering for s[1] is stale */
    const int32_t first = 40;
    struct worker_msg_verify_done m = {
        .seq = {.req = (int64_t)s[1]->req, .slot = s[1]->slot}, .round = 1, .n_accepted = 0,
        .verify_ms = 1.0, .idle_ms = -1, .step = 1, .tokens = &first, .n_tokens = 1};
    struct protocol_frame frame;
    feed_msg(c, 0, worker_msg_verify_done_encode(&m, &frame), &frame, scheduler_on_verify_done);
    assert_int_equal(s[1]->round.state, ROUND_PREFILLING);
    no_more_commands();
    /* from its own pair it moves on, and its round goes to pair 1 */
    verify_done(c, s[1], 1, 0, &first, 1);
    assert_int_equal(s[1]->generated, 1);
    expect_draft();
    assert_to_pair(1);
    /* pair 1 ends s[1]: the queued request takes the freed slot there */
    scheduler_cancel(c, s[1]);
    next_command(ROLE_DRAFT, PROTOCOL_RELEASE);
    assert_to_pair(1);
    next_command(ROLE_TARGET, PROTOCOL_RELEASE);
    assert_to_pair(1);
    assert_int_equal(queued->state, SEQ_ACTIVE);
    assert_int_equal(queued->pair, 1);
    assert_int_equal(queued->slot, 0);
}

/* KV decides before the sequence counts: the pair whose target has the
 * most free blocks takes the request; one whose pool is too small for it
 * is passed over while another can hold it, and only when none can is the
 * request refused. */
static void test_scheduler_pairs_admit_by_free_kv(void **state)
{
    struct coordinator *c = &((struct fixture *)*state)->c;
    c->n_pairs = 2;
    c->cfg.coordinator.max_concurrency = 2;
    worker_up(&c->pair[1].worker[ROLE_TARGET], "cuda");
    c->pair[0].worker[ROLE_TARGET].max_seq_len = 1024;
    c->pair[1].worker[ROLE_TARGET].max_seq_len = 1024;
    c->pair[0].worker[ROLE_TARGET].kv_blocks = 4;
    c->pair[0].worker[ROLE_TARGET].kv_block_size = 16;
    c->pair[1].worker[ROLE_TARGET].kv_blocks = 16;
    c->pair[1].worker[ROLE_TARGET].kv_block_size = 16;
    const int32_t prompt[3] = {1, 2, 3};
    /* 3 + 40 + 9 positions: 4 blocks; pair 1 has 16 free */
    struct seq *a = request_from(c, prompt, 3, 40, 2, REQUEST_DRAFT_NONE);
    assert_int_equal(a->pair, 1);
    assert_int_equal(c->pair[1].kv_reserved[ROLE_TARGET], 4);
    /* 3 + 60 + 9 positions: 5 blocks, more than pair 0's whole pool */
    struct seq *b = request_from(c, prompt, 3, 60, 2, REQUEST_DRAFT_NONE);
    assert_int_equal(b->state, SEQ_ACTIVE);
    assert_int_equal(b->pair, 1);
    assert_int_equal(rep.errors, 0);
    /* pair 1's slots are full, pair 0's pool can never hold it: it waits
     * for pair 1 rather than failing */
    struct seq *d = request_from(c, prompt, 3, 60, 2, REQUEST_DRAFT_NONE);
    assert_int_equal(d->state, SEQ_QUEUED);
    assert_int_equal(rep.errors, 0);
    scheduler_cancel(c, d);
    /* a request no pool could ever hold is refused, naming the blocks */
    struct seq *e = request_from(c, prompt, 3, 400, 2, REQUEST_DRAFT_NONE);
    (void)e;
    assert_int_equal(rep.errors, 1);
    assert_int_equal(rep.last_error, METRICS_ERR_OVERLOADED);
    assert_non_null(strstr(rep.last_error_message, "KV blocks"));
}

/* A pair whose draft shares no memory with its target: the half's bytes
 * come with draft_ready (a fresh draft's and a pre-draft's), and the verify
 * of that half carries them as its second frame, unchanged; a verify with
 * no bytes for its half fails the request rather than have the target read
 * memory that holds nothing. */
static void test_scheduler_halves_travel_with_their_messages(void **state)
{
    struct coordinator *c = &((struct fixture *)*state)->c;
    c->pair[0].halves_as_frames = true;
    struct seq *s = prefilled(c, 20, 2, 40);
    struct worker_msg_draft d = expect_draft();
    const char bytes[] = "the half's bytes, as the draft packed them";
    struct worker_msg_draft_ready m = {
        .seq = {.req = (int64_t)s->req, .slot = s->slot}, .half = 0, .round = d.round, .k = d.k,
        .guess = -1, .predraft = false, .draft_ms = 0.5};
    const struct protocol_frame half = {.data = bytes, .size_bytes = sizeof bytes};
    feed_msg(c, s->pair, worker_msg_draft_ready_encode(&m), &half, scheduler_on_draft_ready);
    struct protocol_msg *v = next_command(ROLE_TARGET, PROTOCOL_VERIFY);
    assert_int_equal(v->n_frames, 2);
    assert_int_equal(v->frame_size_bytes[1], sizeof bytes);
    assert_memory_equal(v->frame_data[1], bytes, sizeof bytes);
    no_more_commands();
    /* the next round's draft_ready comes without its bytes: no verify of
     * memory the target never got */
    const int32_t toks[3] = {41, 42, 43};
    verify_done(c, s, d.round, 2, toks, 1);
    d = expect_draft();
    free(s->half_bytes[0]); /* as if the bytes never came */
    s->half_bytes[0] = NULL;
    draft_ready(c, s, d.round, 0, d.k, -1, false);
    assert_int_equal(rep.errors, 1);
    assert_int_equal(rep.last_error, METRICS_ERR_INTERNAL);
    assert_non_null(strstr(rep.last_error_message, "half"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_scheduler_admission_prefills_both_workers, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_scheduler_round_keeps_the_draft_cache_right, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_scheduler_predraft_hit_and_miss, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scheduler_failed_predraft_does_not_stall, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scheduler_round_states, setup, teardown),
        cmocka_unit_test(test_scheduler_round_transitions_table),
        cmocka_unit_test_setup_teardown(test_scheduler_refused_transition_fails_the_request, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scheduler_draft_lost_in_every_state, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scheduler_beside_draft_error_then_timeout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scheduler_ngram_drafts_travel_in_the_verify, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scheduler_ngram_tree_travels_in_verify_tree, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scheduler_auto_tree_where_trees_were_measured_paying, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scheduler_suffix_and_auto, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scheduler_auto_picks_its_source, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scheduler_matched_drafts_only_where_they_pay, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scheduler_drops_stale_replies, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scheduler_fails_a_malformed_reply, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scheduler_lost_draft_falls_back_to_plain_steps, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_scheduler_draft_errors_turn_speculation_off, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_scheduler_verify_beside_draft_and_its_timeout, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_scheduler_ignore_eos_runs_to_max_tokens, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scheduler_endings_release_and_admit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scheduler_target_error_fails_the_request, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_scheduler_slow_client_is_cancelled_with_a_reason, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scheduler_cancel_in_every_state, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scheduler_pairs_spread_and_keep_to_their_own, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scheduler_pairs_admit_by_free_kv, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scheduler_halves_travel_with_their_messages, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
