/* test_registry.c: the coordinator's worker records (coordinator/registry.c)
 * without processes. The real registry, scheduler, round timing, lanes,
 * output, metrics and worker-message code run; what would leave the
 * process is recorded (coord_fakes.h). Worker messages are built with the
 * workers' encoders, given a routing id, and handed to registry_dispatch
 * as the poll loop would.
 *
 * Covered: registration and the welcome; a draft held until the target
 * registers, then paired (welcome, attach); a draft that does not match
 * the target refused, naming the difference; a malformed registration
 * refused; a repeated registration answered again, not taken for a
 * restart, and one after a connection drop taken for one; messages from
 * unknown senders and from the held draft dropped; a silent draft lost
 * (its sequences go on target-only) and a silent target lost (its requests
 * fail); a restarted target failing the old requests; the count of
 * verifications the target owes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "coord_fakes.h"
#include "coord_state.h"
#include "error.h"
#include "registry.h"
#include "scheduler.h"
#include "worker_msg.h"

#define VOCAB 100
#define EOS 99
#define N_SEQS 4

static const char TARGET_ID[] = "target-1";
static const char DRAFT_ID[] = "draft-1";

struct fixture {
    struct coordinator c;
};

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof *f);
    if (!f || coord_test_init(&f->c, N_SEQS) != 0)
        return -1;
    f->c.cfg.coordinator.worker_timeout_ms = 1000;
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

/* ---- worker messages ---- */

static void dispatch(struct coordinator *c, const char *identity, cJSON *h,
                     const struct protocol_frame *frame)
{
    assert_non_null(h);
    struct protocol_msg m = over_the_wire(h, frame);
    cJSON_Delete(h);
    m.identity_size = strlen(identity);
    memcpy(m.identity, identity, m.identity_size);
    registry_dispatch(c, &m);
    protocol_msg_free(&m);
}

/* A registration as worker_link sends it; vocab and pid vary per test. A
 * draft's buffer is POSIX shared memory, or CUDA IPC with ipc true (no
 * verification then goes beside its draft: rounds go one step at a time). */
static const char *next_domain = ""; /* the shm_domain the next registration names */

static void register_worker_in(struct coordinator *c, const char *identity, const char *role, int pid,
                               int vocab, int drops, bool ipc, int pair)
{
    cJSON *shm = NULL;
    if (strcmp(role, "draft") == 0) {
        shm = cJSON_CreateObject();
        assert_non_null(shm);
        cJSON_AddStringToObject(shm, "name", "/tandem-test-registry-none");
        cJSON_AddStringToObject(shm, "transport", ipc ? "cuda_ipc" : "posix");
    }
    struct worker_msg_register r = {
        .role = role, .pid = pid, .model = "m", .backend = "cpu", .vocab_size = vocab,
        .eos_ids = {EOS}, .n_eos = 1, .max_seq_len = 64, .n_slots = N_SEQS, .bos_id = -1,
        .shm = shm, .drops = drops, .pair = pair, .shm_domain = next_domain,
    };
    dispatch(c, identity, worker_msg_register_encode(&r), NULL);
    cJSON_Delete(shm);
}

static void register_worker_on(struct coordinator *c, const char *identity, const char *role, int pid,
                               int vocab, int drops, bool ipc)
{
    register_worker_in(c, identity, role, pid, vocab, drops, ipc, 0);
}

static void register_worker(struct coordinator *c, const char *identity, const char *role, int pid,
                            int vocab, int drops)
{
    register_worker_on(c, identity, role, pid, vocab, drops, true);
}

static void register_pair(struct coordinator *c)
{
    register_worker(c, TARGET_ID, "target", 100, VOCAB, 0);
    register_worker(c, DRAFT_ID, "draft", getpid(), VOCAB, 0);
    log_clear();
}

/* The message the routing id was refused with. */
static const char *refusal_for(const char *identity)
{
    struct protocol_msg *m = next_command(COORD_FAKES_TO_IDENTITY, PROTOCOL_REFUSED);
    const struct sent *e = &sent_log[next_sent - 1];
    assert_int_equal(e->identity_size, strlen(identity));
    assert_memory_equal(e->identity, identity, e->identity_size);
    return cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m->header, "message"));
}

/* Admits a request and answers its prefill: it is then drafting. */
static struct seq *drafting(struct coordinator *c)
{
    const int32_t prompt[3] = {1, 2, 3};
    struct seq *s = request(c, prompt, 3, 20, 2);
    assert_int_equal(s->state, SEQ_ACTIVE);
    next_command(ROLE_DRAFT, PROTOCOL_PREFILL);
    next_command(ROLE_TARGET, PROTOCOL_PREFILL);
    const int32_t first = 40;
    struct worker_msg_verify_done m = {
        .seq = {.req = (int64_t)s->req, .slot = s->slot}, .round = s->round.verify.round, .n_accepted = 0,
        .verify_ms = 1.0, .idle_ms = -1, .step = 1, .tokens = &first, .n_tokens = 1};
    struct protocol_frame frame;
    c->pair[0].target_outstanding = 1;
    dispatch(c, TARGET_ID, worker_msg_verify_done_encode(&m, &frame), &frame);
    next_command(ROLE_DRAFT, PROTOCOL_DRAFT);
    assert_int_equal(s->round.state, ROUND_DRAFTING);
    return s;
}

/* ---- tests ---- */

static void test_registry_pairs_target_then_draft(void **state)
{
    struct coordinator *c = &((struct fixture *)*state)->c;
    register_worker(c, TARGET_ID, "target", 100, VOCAB, 0);
    assert_true(c->pair[0].worker[ROLE_TARGET].up);
    next_command(ROLE_TARGET, PROTOCOL_WELCOME);
    no_more_commands();
    register_worker_on(c, DRAFT_ID, "draft", getpid(), VOCAB, 0, false);
    assert_true(c->pair[0].worker[ROLE_DRAFT].up);
    assert_true(c->pair[0].worker[ROLE_DRAFT].shm_posix);
    next_command(ROLE_DRAFT, PROTOCOL_WELCOME);
    /* the target learns where the draft's buffer is */
    struct protocol_msg *attach = next_command(ROLE_TARGET, PROTOCOL_ATTACH);
    assert_non_null(cJSON_GetObjectItemCaseSensitive(attach->header, "shm"));
    no_more_commands();
    assert_int_equal(c->metrics.worker_registrations[ROLE_TARGET], 1);
    assert_int_equal(c->metrics.worker_registrations[ROLE_DRAFT], 1);
    assert_int_equal(c->pair[0].worker[ROLE_DRAFT].gen, c->pair[0].draft_gen);
}

static void test_registry_holds_a_draft_until_the_target(void **state)
{
    struct coordinator *c = &((struct fixture *)*state)->c;
    register_worker(c, DRAFT_ID, "draft", getpid(), VOCAB, 0);
    assert_true(c->pair[0].worker[ROLE_DRAFT].held);
    assert_false(c->pair[0].worker[ROLE_DRAFT].up);
    no_more_commands();
    /* what the held draft sends is dropped */
    struct worker_msg_draft_ready m = {.seq = {.req = 1, .slot = 0}, .round = 3, .k = 2, .guess = -1};
    dispatch(c, DRAFT_ID, worker_msg_draft_ready_encode(&m), NULL);
    no_more_commands();
    register_worker(c, TARGET_ID, "target", 100, VOCAB, 0);
    next_command(ROLE_TARGET, PROTOCOL_WELCOME);
    next_command(ROLE_DRAFT, PROTOCOL_WELCOME);
    next_command(ROLE_TARGET, PROTOCOL_ATTACH);
    no_more_commands();
    assert_true(c->pair[0].worker[ROLE_DRAFT].up);
    assert_false(c->pair[0].worker[ROLE_DRAFT].held);
}

static void test_registry_refuses_a_draft_that_does_not_match(void **state)
{
    struct coordinator *c = &((struct fixture *)*state)->c;
    register_worker(c, TARGET_ID, "target", 100, VOCAB, 0);
    log_clear();
    register_worker(c, DRAFT_ID, "draft", getpid(), VOCAB + 1, 0);
    const char *why = refusal_for(DRAFT_ID);
    assert_non_null(strstr(why, "vocab_size 101"));
    assert_non_null(strstr(why, "target's 100"));
    no_more_commands();
    assert_false(c->pair[0].worker[ROLE_DRAFT].up);
    assert_int_equal(c->metrics.draft_refusals, 1);
}

static void test_registry_refuses_a_malformed_registration(void **state)
{
    struct coordinator *c = &((struct fixture *)*state)->c;
    cJSON *h = protocol_header_new(PROTOCOL_REGISTER);
    cJSON_AddStringToObject(h, "role", "target");
    dispatch(c, TARGET_ID, h, NULL);
    const char *why = refusal_for(TARGET_ID);
    assert_non_null(strstr(why, "pid"));
    assert_false(c->pair[0].worker[ROLE_TARGET].up);
    no_more_commands();
}

/* A worker repeats register until welcomed: the same process is welcomed
 * again and keeps its sequences; after a connection drop (drops + 1) its
 * slots are empty, so it is a restart: its sequences re-feed the draft. */
static void test_registry_repeat_registration_and_restart(void **state)
{
    struct coordinator *c = &((struct fixture *)*state)->c;
    register_pair(c);
    const uint64_t gen = c->pair[0].draft_gen;
    struct seq *s = drafting(c);
    register_worker(c, DRAFT_ID, "draft", getpid(), VOCAB, 0);
    next_command(ROLE_DRAFT, PROTOCOL_WELCOME);
    next_command(ROLE_TARGET, PROTOCOL_ATTACH);
    no_more_commands();
    assert_int_equal(c->pair[0].draft_gen, gen);
    assert_int_equal(s->round.state, ROUND_DRAFTING);
    /* the same process after a drop: its draft is gone */
    register_worker(c, DRAFT_ID, "draft", getpid(), VOCAB, 1);
    assert_true(c->pair[0].draft_gen > gen);
    assert_int_equal(c->metrics.worker_losses[ROLE_DRAFT], 1);
    /* the sequence stopped waiting for the lost draft: a plain run */
    struct worker_msg_run run;
    char err[ERR_MSG_MAX];
    const struct worker_msg_limits lim = {.n_slots = N_SEQS, .max_seq_len = 64, .k_max = SPECULATE_K_MAX,
                                          .vocab_size = VOCAB};
    assert_int_equal(worker_msg_run_decode(next_command(ROLE_TARGET, PROTOCOL_RUN), &lim, &run, err), 0);
    assert_true(run.steps >= 1);
    next_command(ROLE_DRAFT, PROTOCOL_WELCOME);
    next_command(ROLE_TARGET, PROTOCOL_ATTACH);
    no_more_commands();
    assert_true(c->pair[0].worker[ROLE_DRAFT].up);
    assert_int_equal(s->draft_valid, 0);
}

static void test_registry_drops_unknown_senders(void **state)
{
    struct coordinator *c = &((struct fixture *)*state)->c;
    register_pair(c);
    struct seq *s = drafting(c);
    const int n_hist = s->n_hist;
    /* a draft_ready for the awaited round, from a stranger */
    struct worker_msg_draft_ready m = {.seq = {.req = (int64_t)s->req, .slot = s->slot},
                                       .round = s->round.draft.round, .k = 2, .guess = -1};
    dispatch(c, "stranger", worker_msg_draft_ready_encode(&m), NULL);
    no_more_commands();
    assert_int_equal(s->round.state, ROUND_DRAFTING);
    /* the same from the draft moves the round on */
    dispatch(c, DRAFT_ID, worker_msg_draft_ready_encode(&m), NULL);
    next_command(ROLE_TARGET, PROTOCOL_VERIFY);
    assert_int_equal(s->round.state, ROUND_VERIFYING);
    assert_int_equal(s->n_hist, n_hist);
}

/* Heartbeats go to both; a draft silent past worker_timeout_ms is lost
 * and its sequence goes on target-only; a silent target fails them all. */
static void test_registry_silent_workers_are_lost(void **state)
{
    struct coordinator *c = &((struct fixture *)*state)->c;
    register_pair(c);
    struct seq *s = drafting(c);
    const int32_t prompt[2] = {5, 6};
    c->cfg.coordinator.max_concurrency = 1;
    struct seq *queued = request(c, prompt, 2, 5, 2);
    assert_int_equal(queued->state, SEQ_QUEUED);
    registry_tick(c);
    next_command(ROLE_DRAFT, PROTOCOL_HEARTBEAT);
    next_command(ROLE_TARGET, PROTOCOL_HEARTBEAT);
    no_more_commands();
    assert_true(c->pair[0].worker[ROLE_DRAFT].up);
    c->pair[0].worker[ROLE_DRAFT].last_seen_ms -= 2 * c->cfg.coordinator.worker_timeout_ms;
    registry_tick(c);
    assert_false(c->pair[0].worker[ROLE_DRAFT].up);
    assert_int_equal(c->metrics.worker_losses[ROLE_DRAFT], 1);
    next_command(ROLE_TARGET, PROTOCOL_RUN); /* plain steps, no draft */
    assert_int_equal(s->round.state, ROUND_PLAIN_RUN);
    assert_int_equal(rep.errors, 0);
    c->pair[0].worker[ROLE_TARGET].last_seen_ms -= 2 * c->cfg.coordinator.worker_timeout_ms;
    registry_tick(c);
    assert_false(c->pair[0].worker[ROLE_TARGET].up);
    assert_int_equal(rep.errors, 2); /* the active and the queued request */
    assert_int_equal(rep.last_error, METRICS_ERR_TARGET_UNAVAILABLE);
    assert_int_equal(s->state, SEQ_FREE);
    assert_int_equal(queued->state, SEQ_FREE);
    assert_int_equal(c->pair[0].target_outstanding, 0);
}

/* A target registering again (restarted) lost its sequences: their
 * requests fail; the draft, matching the new target, stays. */
static void test_registry_restarted_target_fails_old_requests(void **state)
{
    struct coordinator *c = &((struct fixture *)*state)->c;
    register_pair(c);
    struct seq *s = drafting(c);
    register_worker(c, "target-2", "target", 101, VOCAB, 0);
    assert_int_equal(rep.errors, 1);
    assert_int_equal(rep.last_error, METRICS_ERR_TARGET_UNAVAILABLE);
    assert_int_equal(s->state, SEQ_FREE);
    assert_true(c->pair[0].worker[ROLE_TARGET].up);
    assert_int_equal(c->pair[0].worker[ROLE_TARGET].pid, 101);
    assert_true(c->pair[0].worker[ROLE_DRAFT].up);
    next_command(ROLE_DRAFT, PROTOCOL_RELEASE); /* the failed request's slot */
    next_command(ROLE_TARGET, PROTOCOL_WELCOME);
    next_command(ROLE_TARGET, PROTOCOL_ATTACH);
    no_more_commands();
}

/* Every verify is answered once (verify_done or error): the target is
 * idle when none is owed, and a stale answer still counts. */
static void test_registry_counts_what_the_target_owes(void **state)
{
    struct coordinator *c = &((struct fixture *)*state)->c;
    register_pair(c);
    c->pair[0].target_outstanding = 2;
    c->pair[0].target_idle_since_ms = -1;
    const int32_t tok = 5;
    struct worker_msg_verify_done m = {.seq = {.req = 77, .slot = 0}, .round = 1, .n_accepted = 0,
                                       .verify_ms = 1.0, .idle_ms = -1, .step = 1, .tokens = &tok,
                                       .n_tokens = 1};
    struct protocol_frame frame;
    dispatch(c, TARGET_ID, worker_msg_verify_done_encode(&m, &frame), &frame);
    assert_int_equal(c->pair[0].target_outstanding, 1);
    assert_true(c->pair[0].target_idle_since_ms < 0);
    const struct worker_msg_seq seq = {.req = 77, .slot = 0};
    dispatch(c, TARGET_ID, worker_msg_error_encode(&seq, ERR_INTERNAL, "gone", PROTOCOL_VERIFY), NULL);
    assert_int_equal(c->pair[0].target_outstanding, 0);
    assert_true(c->pair[0].target_idle_since_ms > 0);
    /* a heartbeat is owed nothing */
    dispatch(c, TARGET_ID, protocol_header_new(PROTOCOL_HEARTBEAT), NULL);
    assert_int_equal(c->pair[0].target_outstanding, 0);
    no_more_commands();
}

/* Two pairs: each register names its pair; a pair outside the config and
 * a target unlike the other pair's are refused, naming why; a lost target
 * fails only its own pair's requests, the queue waits for the other pair,
 * and requests after the loss go there. */
static void test_registry_two_pairs(void **state)
{
    struct coordinator *c = &((struct fixture *)*state)->c;
    c->n_pairs = 2;
    c->cfg.coordinator.max_concurrency = 1;
    register_pair(c);
    register_worker_in(c, "target-b", "target", 200, VOCAB, 0, true, 2);
    assert_non_null(strstr(refusal_for("target-b"), "pair 2: this coordinator serves 2 pairs"));
    register_worker_in(c, "target-b", "target", 200, VOCAB + 1, 0, true, 1);
    assert_non_null(strstr(refusal_for("target-b"), "every pair must serve the same model"));
    assert_false(c->pair[1].worker[ROLE_TARGET].up);
    register_worker_in(c, "target-b", "target", 200, VOCAB, 0, true, 1);
    register_worker_in(c, "draft-b", "draft", getpid(), VOCAB, 0, true, 1);
    assert_true(c->pair[1].worker[ROLE_TARGET].up && c->pair[1].worker[ROLE_DRAFT].up);
    assert_int_equal(c->pair[1].worker[ROLE_TARGET].pid, 200);
    assert_int_equal(c->pair[0].worker[ROLE_TARGET].pid, 100);
    log_clear();
    const int32_t prompt[3] = {1, 2, 3};
    struct seq *a = request(c, prompt, 3, 20, 2), *b = request(c, prompt, 3, 20, 2);
    struct seq *queued = request(c, prompt, 3, 20, 2);
    assert_int_equal(a->pair, 0);
    assert_int_equal(b->pair, 1);
    assert_int_equal(queued->state, SEQ_QUEUED);
    /* pair 1's target goes silent */
    c->pair[1].worker[ROLE_TARGET].last_seen_ms = coord_now_ms() - 5000;
    for (int p = 0; p < 2; p++)
        for (int r = 0; r < 2; r++)
            if (p != 1 || r != ROLE_TARGET)
                c->pair[p].worker[r].last_seen_ms = coord_now_ms();
    registry_tick(c);
    assert_false(c->pair[1].worker[ROLE_TARGET].up);
    assert_true(c->pair[0].worker[ROLE_TARGET].up && c->pair[1].worker[ROLE_DRAFT].up);
    assert_int_equal(rep.errors, 1);
    assert_int_equal(rep.last_error, METRICS_ERR_TARGET_UNAVAILABLE);
    assert_int_equal(b->state, SEQ_FREE);
    assert_int_equal(a->state, SEQ_ACTIVE);
    assert_int_equal(queued->state, SEQ_QUEUED);
    /* a's pair serves the rest: the queued request once a's slot is free */
    scheduler_cancel(c, a);
    assert_int_equal(queued->state, SEQ_ACTIVE);
    assert_int_equal(queued->pair, 0);
    struct seq *later = request(c, prompt, 3, 20, 2);
    assert_int_equal(later->state, SEQ_QUEUED); /* pair 0 full, pair 1 has no target */
    /* the last target lost: nothing left to wait for */
    c->pair[0].worker[ROLE_TARGET].last_seen_ms = coord_now_ms() - 5000;
    registry_tick(c);
    assert_int_equal(queued->state, SEQ_FREE);
    assert_int_equal(later->state, SEQ_FREE);
    assert_int_equal(rep.errors, 3);
}

/* Draft and target in different shm domains (other hosts, other /dev/shm):
 * the target gets the draft's descriptor as "frames" (no cuda object, the
 * layout kept), the draft's welcome says "halves": "frames"; a target that
 * comes back in the draft's domain maps the buffer again, and the draft is
 * told. Unknown domains count as shared. */
static void test_registry_draft_without_shared_memory(void **state)
{
    struct coordinator *c = &((struct fixture *)*state)->c;
    next_domain = "boot-a:1:2";
    register_worker(c, TARGET_ID, "target", 100, VOCAB, 0);
    next_domain = "boot-b:1:2";
    register_worker(c, DRAFT_ID, "draft", getpid(), VOCAB, 0);
    assert_true(c->pair[0].halves_as_frames);
    next_command(ROLE_TARGET, PROTOCOL_WELCOME);
    struct protocol_msg *w = next_command(ROLE_DRAFT, PROTOCOL_WELCOME);
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(w->header, "halves")), "frames");
    struct protocol_msg *a = next_command(ROLE_TARGET, PROTOCOL_ATTACH);
    const cJSON *shm = cJSON_GetObjectItemCaseSensitive(a->header, "shm");
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(shm, "transport")), "frames");
    assert_null(cJSON_GetObjectItemCaseSensitive(shm, "cuda"));
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(shm, "name")), "/tandem-test-registry-none");
    no_more_commands();
    /* the target restarts in the draft's domain */
    next_domain = "boot-b:1:2";
    register_worker(c, "target-2", "target", 101, VOCAB, 0);
    assert_false(c->pair[0].halves_as_frames);
    next_command(ROLE_TARGET, PROTOCOL_WELCOME);
    w = next_command(ROLE_DRAFT, PROTOCOL_WELCOME);
    assert_null(cJSON_GetObjectItemCaseSensitive(w->header, "halves"));
    a = next_command(ROLE_TARGET, PROTOCOL_ATTACH);
    shm = cJSON_GetObjectItemCaseSensitive(a->header, "shm");
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(shm, "transport")), "cuda_ipc");
    no_more_commands();
    /* a target that names no domain: assumed shared */
    next_domain = "";
    register_worker(c, "target-3", "target", 102, VOCAB, 0);
    assert_false(c->pair[0].halves_as_frames);
    next_domain = "";
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_registry_pairs_target_then_draft, setup, teardown),
        cmocka_unit_test_setup_teardown(test_registry_holds_a_draft_until_the_target, setup, teardown),
        cmocka_unit_test_setup_teardown(test_registry_refuses_a_draft_that_does_not_match, setup, teardown),
        cmocka_unit_test_setup_teardown(test_registry_refuses_a_malformed_registration, setup, teardown),
        cmocka_unit_test_setup_teardown(test_registry_repeat_registration_and_restart, setup, teardown),
        cmocka_unit_test_setup_teardown(test_registry_drops_unknown_senders, setup, teardown),
        cmocka_unit_test_setup_teardown(test_registry_silent_workers_are_lost, setup, teardown),
        cmocka_unit_test_setup_teardown(test_registry_restarted_target_fails_old_requests, setup, teardown),
        cmocka_unit_test_setup_teardown(test_registry_counts_what_the_target_owes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_registry_two_pairs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_registry_draft_without_shared_memory, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
