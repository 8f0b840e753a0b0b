/* test_scheduler.c: the coordinator's scheduler (coordinator/scheduler.c)
 * without processes. The real scheduler, output, metrics, adaptive-K and
 * worker-message code run; what would leave the process is recorded
 * instead: registry_send (commands to the workers, kept as they would
 * arrive, and decoded by the workers' own decoders) and the client replies
 * (replies_*). Worker replies are built with the workers' encoders and fed
 * to the scheduler's handlers as the registry's dispatch would.
 *
 * Covered: admission (prefill to both workers); a round (draft -> verify
 * -> accepted tokens) and the draft-cache bookkeeping behind each next
 * draft's keep_len and feed (after a partial acceptance, a full one, a
 * pre-draft used, a pre-draft missed, a draft lost); pre-drafts arriving
 * before and after the verification's reply; a verification sent beside
 * its draft, and the target giving up on it; stale and malformed replies;
 * a lost draft and repeated draft errors (plain decoding); plain runs of
 * steps; endings (end of sequence, max_tokens, a target error) and cancel
 * in every state (queued, prefilling, drafting, verifying). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "coord_state.h"
#include "error.h"
#include "registry.h"
#include "replies.h"
#include "scheduler.h"
#include "worker_msg.h"

#define VOCAB 100
#define EOS 99
#define MAX_SEQ 64
#define N_SEQS 4
#define LOG_MAX 64

/* ---- what leaves the process, recorded ---- */

struct sent {
    enum worker_role role;
    struct protocol_msg msg; /* as the worker would receive it */
};

static struct sent sent_log[LOG_MAX];
static int n_sent, next_sent;

static struct protocol_msg over_the_wire(cJSON *h, const struct protocol_frame *frame)
{
    struct protocol_msg m;
    memset(&m, 0, sizeof m);
    char *text = cJSON_PrintUnformatted(h);
    assert_non_null(text);
    m.header = cJSON_Parse(text);
    free(text);
    assert_non_null(m.header);
    m.type = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m.header, "type"));
    if (frame && frame->size_bytes > 0) {
        m.frame_data[0] = malloc(frame->size_bytes);
        assert_non_null(m.frame_data[0]);
        memcpy(m.frame_data[0], frame->data, frame->size_bytes);
        m.frame_size_bytes[0] = frame->size_bytes;
        m.n_frames = 1;
    }
    return m;
}

int registry_send(struct coordinator *c, enum worker_role role, cJSON *hdr,
                  const struct protocol_frame *frame)
{
    (void)c;
    assert_true(n_sent < LOG_MAX);
    sent_log[n_sent].role = role;
    sent_log[n_sent].msg = over_the_wire(hdr, frame);
    n_sent++;
    cJSON_Delete(hdr);
    return 0;
}

struct replies {
    int errors, dones, streams;
    enum metrics_error last_error;
    enum metrics_finish last_finish;
    int32_t done_ids[MAX_SEQ];
    int n_done_ids;
};
static struct replies rep;

void replies_send(struct coordinator *c, const uint8_t *identity, size_t identity_size,
                  const cJSON *msg)
{
    (void)c, (void)identity, (void)identity_size, (void)msg;
}

void replies_error(struct coordinator *c, const uint8_t *identity, size_t identity_size,
                   const char *id, enum metrics_error code, const char *message)
{
    (void)c, (void)identity, (void)identity_size, (void)id, (void)message;
    rep.errors++;
    rep.last_error = code;
}

void replies_stream(struct coordinator *c, struct seq *s, bool final)
{
    (void)c, (void)s, (void)final;
    rep.streams++;
}

void replies_done(struct coordinator *c, struct seq *s, enum metrics_finish reason, double t)
{
    (void)c, (void)t;
    rep.dones++;
    rep.last_finish = reason;
    rep.n_done_ids = s->n_hist - s->n_prompt;
    memcpy(rep.done_ids, s->hist + s->n_prompt, (size_t)rep.n_done_ids * sizeof(int32_t));
}

static void log_clear(void)
{
    for (int i = 0; i < n_sent; i++)
        protocol_msg_free(&sent_log[i].msg);
    n_sent = next_sent = 0;
    memset(&rep, 0, sizeof rep);
}

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
    if (!f)
        return -1;
    struct coordinator *c = &f->c;
    proc_config_defaults(&c->cfg);
    c->cfg.coordinator.max_concurrency = N_SEQS;
    c->cfg.coordinator.spec_k_max = 8;
    worker_up(&c->worker[ROLE_TARGET], "cuda");
    worker_up(&c->worker[ROLE_DRAFT], "cuda");
    c->worker[ROLE_DRAFT].shm = cJSON_CreateObject();
    c->worker[ROLE_DRAFT].shm_posix = false;
    c->draft_gen = 1;
    c->seqs = calloc(N_SEQS, sizeof *c->seqs);
    if (!c->seqs || !c->worker[ROLE_DRAFT].shm)
        return -1;
    c->n_seqs = N_SEQS;
    for (int i = 0; i < N_SEQS; i++)
        c->seqs[i].slot = i;
    c->busy_since_ms = -1;
    c->target_idle_since_ms = -1;
    /* no pre-drafts and no verification beside its draft unless a test
     * asks for them: rounds one at a time */
    c->cores_shared = true;
    metrics_init(&c->metrics);
    log_clear();
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    for (int i = 0; i < N_SEQS; i++)
        if (f->c.seqs[i].state != SEQ_FREE)
            scheduler_seq_reset(&f->c.seqs[i]);
    free(f->c.seqs);
    cJSON_Delete(f->c.worker[ROLE_DRAFT].shm);
    log_clear();
    free(f);
    return 0;
}

/* A request as intake fills it in: greedy, K fixed by k_fixed (0 = the
 * controller's), queued and admitted where it fits. */
static struct seq *request(struct coordinator *c, const int32_t *prompt, int n_prompt,
                           int max_tokens, int k_fixed)
{
    struct seq *s = NULL;
    for (int i = 0; i < c->n_seqs && !s; i++)
        if (c->seqs[i].state == SEQ_FREE)
            s = &c->seqs[i];
    assert_non_null(s);
    static uint64_t next_req = 1;
    char err[ERR_MSG_MAX];
    s->req = next_req++;
    snprintf(s->id, sizeof s->id, "r%llu", (unsigned long long)s->req);
    s->cap_hist = n_prompt + max_tokens + SPECULATE_K_MAX + 2;
    s->hist = malloc((size_t)s->cap_hist * sizeof(int32_t));
    assert_non_null(s->hist);
    memcpy(s->hist, prompt, (size_t)n_prompt * sizeof(int32_t));
    s->n_hist = s->n_prompt = n_prompt;
    s->max_tokens = max_tokens;
    sampling_params_default(&s->sp);
    s->sp.temperature = 0.0f;
    s->mode = SPECULATE_MODE_SAMPLED;
    assert_int_equal(output_create(&s->out, NULL, NULL, 0, err), 0);
    adaptive_k_init_wall(&s->kc, k_fixed, c->cfg.coordinator.spec_k_max);
    s->t_arrival_ms = coord_now_ms();
    scheduler_enqueue(c, s);
    return s;
}

/* ---- commands the workers received ---- */

static struct protocol_msg *next_command(enum worker_role role, const char *type)
{
    for (; next_sent < n_sent; next_sent++) {
        struct sent *e = &sent_log[next_sent];
        if (e->role == role && strcmp(e->msg.type, type) == 0)
            return &sent_log[next_sent++].msg;
        fail_msg("expected %s to the %s worker, got %s to the %s", type, coord_role_name(role),
                 e->msg.type, coord_role_name(e->role));
    }
    fail_msg("expected %s to the %s worker, nothing more was sent", type, coord_role_name(role));
    return NULL;
}

static void no_more_commands(void)
{
    if (next_sent < n_sent)
        fail_msg("unexpected %s to the %s worker", sent_log[next_sent].msg.type,
                 coord_role_name(sent_log[next_sent].role));
}

static struct worker_msg_draft expect_draft(void)
{
    struct worker_msg_draft d;
    char err[ERR_MSG_MAX];
    assert_int_equal(worker_msg_draft_decode(next_command(ROLE_DRAFT, PROTOCOL_DRAFT),
                                             &worker_limits, &d, err), 0);
    return d;
}

static struct worker_msg_verify expect_verify(void)
{
    struct worker_msg_verify v;
    char err[ERR_MSG_MAX];
    assert_int_equal(worker_msg_verify_decode(next_command(ROLE_TARGET, PROTOCOL_VERIFY),
                                              &worker_limits, &v, err), 0);
    return v;
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

static void feed_msg(struct coordinator *c, cJSON *h, const struct protocol_frame *frame,
                     void (*handle)(struct coordinator *, const struct protocol_msg *))
{
    assert_non_null(h);
    struct protocol_msg m = over_the_wire(h, frame);
    cJSON_Delete(h);
    handle(c, &m);
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
    feed_msg(c, h, &frame, scheduler_on_verify_done);
}

static void draft_ready(struct coordinator *c, const struct seq *s, int64_t round, int half, int k,
                        int guess, bool predraft)
{
    struct worker_msg_draft_ready m = {
        .seq = {.req = (int64_t)s->req, .slot = s->slot}, .half = half, .round = round, .k = k,
        .guess = guess, .predraft = predraft, .draft_ms = 0.5};
    feed_msg(c, worker_msg_draft_ready_encode(&m), NULL, scheduler_on_draft_ready);
}

static void worker_error(struct coordinator *c, enum worker_role role, const struct seq *s,
                         int code, const char *in_reply_to)
{
    const struct worker_msg_seq seq = {.req = (int64_t)s->req, .slot = s->slot};
    cJSON *h = worker_msg_error_encode(&seq, code, "a test's error", in_reply_to);
    assert_non_null(h);
    struct protocol_msg m = over_the_wire(h, NULL);
    cJSON_Delete(h);
    scheduler_on_worker_error(c, role, &m);
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
    struct worker_msg_verify v = expect_verify();
    assert_true(v.k == 0 && v.keep_len == 0 && v.round == 1);
    assert_feed(v.feed, v.n_feed, prompt, 3);
    no_more_commands();
    verify_done(c, s, 1, 0, &first, 1);
    return s;
}

/* prefilled, then its first round up to the verification: returns the
 * sequence, the draft and the verify commands in *d and *v. */
static struct seq *verifying(struct coordinator *c, int max_tokens, struct worker_msg_draft *d,
                             struct worker_msg_verify *v)
{
    struct seq *s = prefilled(c, max_tokens, 2, 40);
    *d = expect_draft();
    draft_ready(c, s, d->round, 0, d->k, -1, false);
    *v = expect_verify();
    return s;
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
    struct worker_msg_verify v = expect_verify();
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
    c->cores_shared = false; /* the draft has hardware of its own: pre-drafts */
    struct seq *s = prefilled(c, 30, 2, 40);
    struct worker_msg_draft d = expect_draft();
    assert_int_equal(d.predraft_k, 2);
    draft_ready(c, s, d.round, 0, 2, -1, false);
    struct worker_msg_verify v = expect_verify();
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
    struct worker_msg_verify v = expect_verify();
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
    struct worker_msg_verify v;
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
    c->worker[ROLE_DRAFT].up = false;
    c->draft_gen++;
    scheduler_forget_draft(c, s);
    struct worker_msg_verify v = expect_verify();
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
        struct worker_msg_verify v = expect_verify();
        const int32_t t[3] = {41, 42, 43};
        verify_done(c, s, v.round, 0, t, 1);
    }
    (void)expect_draft();
    worker_error(c, ROLE_DRAFT, s, ERR_INTERNAL, PROTOCOL_DRAFT);
    assert_true(s->spec_off);
    struct worker_msg_verify v = expect_verify();
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
    c->cores_shared = false;
    c->worker[ROLE_DRAFT].shm_posix = true;
    struct seq *s = prefilled(c, 20, 2, 40);
    struct worker_msg_draft d = expect_draft();
    struct worker_msg_verify v = expect_verify();
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
    struct worker_msg_verify v = expect_verify();
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

/* A target error fails the request with the error's meaning. */
static void test_scheduler_target_error_fails_the_request(void **state)
{
    struct fixture *f = *state;
    struct coordinator *c = &f->c;
    struct worker_msg_draft d;
    struct worker_msg_verify v;
    struct seq *s = verifying(c, 20, &d, &v);
    worker_error(c, ROLE_TARGET, s, ERR_CONTEXT_FULL, PROTOCOL_VERIFY);
    assert_int_equal(rep.errors, 1);
    assert_int_equal(rep.last_error, METRICS_ERR_CONTEXT_FULL);
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
    struct worker_msg_verify v = expect_verify();
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_scheduler_admission_prefills_both_workers, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_scheduler_round_keeps_the_draft_cache_right, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_scheduler_predraft_hit_and_miss, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scheduler_drops_stale_replies, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scheduler_fails_a_malformed_reply, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scheduler_lost_draft_falls_back_to_plain_steps, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_scheduler_draft_errors_turn_speculation_off, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_scheduler_verify_beside_draft_and_its_timeout, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_scheduler_endings_release_and_admit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scheduler_target_error_fails_the_request, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_scheduler_cancel_in_every_state, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
