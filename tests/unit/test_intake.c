/* test_intake.c: client messages in (coordinator/intake.c) without
 * processes or sockets. The real intake, prompt, scheduler, round timing,
 * output, metrics and request-validation code run; the client's message is
 * handed to intake_dispatch as the poll loop would, and what would leave
 * the process is recorded (coord_fakes.h).
 *
 * Covered: a generate request becoming an admitted sequence with the
 * request's sampling, K and limits; every rejection an error reply of the
 * right code naming what was wrong (a malformed envelope, a bad field, a
 * seed past 2^53, token ids outside the vocabulary, a prompt longer than
 * the context, no target, a full queue, the per-client limit); a new
 * request starting from the pair's K history; cancel (the sender's request
 * only); stats. */
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
#include "intake.h"
#include "scheduler.h"

#define VOCAB 100
#define CONTEXT 64
#define N_SEQS 4

struct fixture {
    struct coordinator c;
};

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof *f);
    if (!f || coord_test_init(&f->c, N_SEQS) != 0)
        return -1;
    struct coordinator *c = &f->c;
    c->cfg.coordinator.max_concurrency = 2;
    c->cfg.coordinator.max_queue = 1;
    struct worker *t = &c->pair[0].worker[ROLE_TARGET];
    t->up = true;
    t->vocab_size = VOCAB;
    t->eos_ids[0] = VOCAB - 1;
    t->n_eos = 1;
    t->max_seq_len = CONTEXT;
    t->n_slots = N_SEQS;
    c->rng_state = 42;
    c->default_draft = REQUEST_DRAFT_MODEL;
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

static void from(struct coordinator *c, const char *client, const char *json)
{
    const struct conn_ref conn = {.fd = 7, .gen = 1};
    intake_dispatch(c, (const uint8_t *)client, strlen(client), conn, json, strlen(json));
}

/* The sequence of this client and request id, or NULL. */
static struct seq *seq_of(struct coordinator *c, const char *client, const char *id)
{
    for (int i = 0; i < c->n_seqs; i++) {
        struct seq *s = &c->seqs[i];
        if (s->state != SEQ_FREE && s->client_size == strlen(client) &&
            memcmp(s->client, client, s->client_size) == 0 && strcmp(s->id, id) == 0)
            return s;
    }
    return NULL;
}

/* The last message was refused with code, its message naming `names`. */
static void assert_refused(enum metrics_error code, const char *names)
{
    assert_int_equal(rep.errors, 1);
    assert_int_equal(rep.last_error, code);
    if (strstr(rep.last_error_message, names) == NULL)
        fail_msg("error \"%s\" does not name \"%s\"", rep.last_error_message, names);
    rep.errors = 0;
}

static void test_intake_generate_admits_a_sequence(void **state)
{
    struct coordinator *c = &((struct fixture *)*state)->c;
    from(c, "A", "{\"v\":1,\"type\":\"generate\",\"id\":\"g1\",\"prompt_ids\":[5,6,7],\"max_tokens\":9,"
                 "\"temperature\":0.7,\"top_k\":20,\"seed\":1234,\"spec_k\":3,\"stream\":true}");
    assert_int_equal(rep.errors, 0);
    struct seq *s = seq_of(c, "A", "g1");
    assert_non_null(s);
    assert_int_equal(s->state, SEQ_ACTIVE);
    assert_int_equal(s->n_prompt, 3);
    assert_int_equal(s->hist[2], 7);
    assert_int_equal(s->max_tokens, 9);
    assert_true(s->stream);
    assert_int_equal(s->sp.top_k, 20);
    assert_true(s->sp.temperature > 0.69f && s->sp.temperature < 0.71f);
    assert_int_equal(s->sp.seed, 1234);
    assert_int_equal(s->kc.k_fixed, 3);
    assert_int_equal(s->draft, REQUEST_DRAFT_MODEL); /* the coordinator's, as the fixture sets it */
    assert_int_equal(c->metrics.requests_total, 1);
    /* admitted at once: the target prefills it (no draft is up) */
    next_command(ROLE_TARGET, PROTOCOL_PREFILL);
    no_more_commands();
    /* a seed is drawn when none is given, within what JSON carries exactly */
    from(c, "A", "{\"v\":1,\"type\":\"generate\",\"id\":\"g2\",\"prompt_ids\":[5],\"max_tokens\":2}");
    struct seq *s2 = seq_of(c, "A", "g2");
    assert_non_null(s2);
    assert_true(s2->sp.seed <= COORD_SEED_MAX);
    /* the draft source: the request's, else the coordinator's */
    c->cfg.coordinator.max_queue = 2;
    from(c, "A", "{\"v\":1,\"type\":\"generate\",\"id\":\"g3\",\"prompt_ids\":[5],\"max_tokens\":2,\"draft\":\"ngram\"}");
    assert_int_equal(seq_of(c, "A", "g3")->draft, REQUEST_DRAFT_NGRAM);
    c->default_draft = REQUEST_DRAFT_NONE;
    from(c, "B", "{\"v\":1,\"type\":\"generate\",\"id\":\"g4\",\"prompt_ids\":[5],\"max_tokens\":2}");
    assert_int_equal(seq_of(c, "B", "g4")->draft, REQUEST_DRAFT_NONE);
    assert_int_equal(rep.errors, 0);
}

static void test_intake_rejections_name_what_was_wrong(void **state)
{
    struct coordinator *c = &((struct fixture *)*state)->c;
    from(c, "A", "{\"v\":1,\"type\":\"generate\",");
    assert_refused(METRICS_ERR_INVALID_REQUEST, "JSON");
    from(c, "A", "{\"v\":1,\"type\":\"generate\",\"id\":\"b1\",\"prompt_ids\":[5],\"max_tokens\":0}");
    assert_refused(METRICS_ERR_INVALID_REQUEST, "max_tokens");
    assert_string_equal(rep.last_error_id, "b1");
    from(c, "A", "{\"v\":1,\"type\":\"generate\",\"id\":\"b2\",\"prompt_ids\":[5],\"max_tokens\":4,"
                 "\"seed\":9007199254740993}");
    assert_refused(METRICS_ERR_INVALID_REQUEST, "seed");
    from(c, "A", "{\"v\":1,\"type\":\"generate\",\"id\":\"b3\",\"prompt_ids\":[5,100],\"max_tokens\":4}");
    assert_refused(METRICS_ERR_INVALID_REQUEST, "prompt_ids");
    char big[1024];
    int n = snprintf(big, sizeof big, "{\"v\":1,\"type\":\"generate\",\"id\":\"b4\",\"max_tokens\":4,\"prompt_ids\":[");
    for (int i = 0; i < CONTEXT + 1; i++)
        n += snprintf(big + n, sizeof big - (size_t)n, "%s5", i ? "," : "");
    snprintf(big + n, sizeof big - (size_t)n, "]}");
    from(c, "A", big);
    assert_refused(METRICS_ERR_CONTEXT_FULL, "context");
    assert_int_equal(c->n_active + c->n_queued, 0);
    no_more_commands();
    /* no target */
    c->pair[0].worker[ROLE_TARGET].up = false;
    from(c, "A", "{\"v\":1,\"type\":\"generate\",\"id\":\"b5\",\"prompt_ids\":[5],\"max_tokens\":4}");
    assert_refused(METRICS_ERR_TARGET_UNAVAILABLE, "target");
    assert_int_equal(c->metrics.requests_total, 6);
}

static void test_intake_limits_queue_and_clients(void **state)
{
    struct coordinator *c = &((struct fixture *)*state)->c;
    c->cfg.coordinator.max_requests_per_client = 2;
    from(c, "A", "{\"v\":1,\"type\":\"generate\",\"id\":\"a1\",\"prompt_ids\":[5],\"max_tokens\":4}");
    from(c, "A", "{\"v\":1,\"type\":\"generate\",\"id\":\"a2\",\"prompt_ids\":[5],\"max_tokens\":4}");
    assert_int_equal(rep.errors, 0);
    from(c, "A", "{\"v\":1,\"type\":\"generate\",\"id\":\"a3\",\"prompt_ids\":[5],\"max_tokens\":4}");
    assert_refused(METRICS_ERR_OVERLOADED, "max_requests_per_client");
    /* two active (max_concurrency), one queued (max_queue), then full */
    from(c, "B", "{\"v\":1,\"type\":\"generate\",\"id\":\"b1\",\"prompt_ids\":[5],\"max_tokens\":4}");
    assert_int_equal(rep.errors, 0);
    assert_int_equal(c->n_active, 2);
    assert_int_equal(c->n_queued, 1);
    from(c, "C", "{\"v\":1,\"type\":\"generate\",\"id\":\"c1\",\"prompt_ids\":[5],\"max_tokens\":4}");
    assert_refused(METRICS_ERR_OVERLOADED, "max_queue 1");
}

/* A new request starts from what the pair taught the last one (the K
 * controller's history), with its own K setting. */
static void test_intake_starts_from_the_pairs_k_history(void **state)
{
    struct coordinator *c = &((struct fixture *)*state)->c;
    adaptive_k_init_wall(&c->pair[0].k_history, 0, 8);
    c->pair[0].k_history.accept_rate = 0.875;
    c->pair[0].k_history.rounds_observed = 12;
    c->pair[0].k_history_valid = true;
    from(c, "A", "{\"v\":1,\"type\":\"generate\",\"id\":\"h\",\"prompt_ids\":[5],\"max_tokens\":4,\"spec_k\":2}");
    struct seq *s = seq_of(c, "A", "h");
    assert_non_null(s);
    assert_true(s->kc.accept_rate > 0.87 && s->kc.accept_rate < 0.88);
    assert_int_equal(s->kc.k_fixed, 2);
}

/* A cancel ends the sender's request of that id, with a "cancelled" reply;
 * another client's request of the same id goes on. */
static void test_intake_cancel_is_per_client(void **state)
{
    struct coordinator *c = &((struct fixture *)*state)->c;
    from(c, "A", "{\"v\":1,\"type\":\"generate\",\"id\":\"x\",\"prompt_ids\":[5],\"max_tokens\":4}");
    from(c, "B", "{\"v\":1,\"type\":\"generate\",\"id\":\"x\",\"prompt_ids\":[5],\"max_tokens\":4}");
    assert_non_null(seq_of(c, "A", "x"));
    from(c, "A", "{\"v\":1,\"type\":\"cancel\",\"id\":\"x\"}");
    assert_null(seq_of(c, "A", "x"));
    assert_non_null(seq_of(c, "B", "x"));
    assert_non_null(strstr(rep.last_sent, "\"cancelled\""));
    assert_int_equal(c->metrics.requests_failed[METRICS_ERR_CANCELLED], 1);
    /* nothing of that id: not an error */
    from(c, "A", "{\"v\":1,\"type\":\"cancel\",\"id\":\"nothing\"}");
    assert_int_equal(rep.errors, 0);
    from(c, "A", "{\"v\":1,\"type\":\"cancel\"}");
    assert_refused(METRICS_ERR_INVALID_REQUEST, "id");
}

static void test_intake_stats(void **state)
{
    struct coordinator *c = &((struct fixture *)*state)->c;
    from(c, "A", "{\"v\":1,\"type\":\"generate\",\"id\":\"s\",\"prompt_ids\":[5],\"max_tokens\":4}");
    from(c, "A", "{\"v\":1,\"type\":\"stats\",\"id\":\"q\"}");
    assert_int_equal(rep.errors, 0);
    assert_int_equal(rep.sends, 1);
    assert_non_null(strstr(rep.last_sent, "\"type\":\"stats\""));
    assert_non_null(strstr(rep.last_sent, "\"id\":\"q\""));
    assert_non_null(strstr(rep.last_sent, "tandem_requests_total"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_intake_generate_admits_a_sequence, setup, teardown),
        cmocka_unit_test_setup_teardown(test_intake_rejections_name_what_was_wrong, setup, teardown),
        cmocka_unit_test_setup_teardown(test_intake_limits_queue_and_clients, setup, teardown),
        cmocka_unit_test_setup_teardown(test_intake_starts_from_the_pairs_k_history, setup, teardown),
        cmocka_unit_test_setup_teardown(test_intake_cancel_is_per_client, setup, teardown),
        cmocka_unit_test_setup_teardown(test_intake_stats, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
