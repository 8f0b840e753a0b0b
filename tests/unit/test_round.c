/* test_round.c: the round's transition table (coordinator/round.c) against
 * its specification, written here again line by line: every (state, event)
 * pair listed below leads where the line says, and every pair not listed is
 * refused with the state left as it was. A transition added to the table
 * without its line here (or one taken out) fails. How the scheduler drives
 * each of these is test_scheduler.c's round_cases. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "error.h"
#include "round.h"

struct legal {
    enum round_state from;
    enum round_event ev;
    enum round_state to;
};

static const struct legal legal[] = {
    {ROUND_IDLE, ROUND_PREFILL_SENT, ROUND_PREFILLING},
    {ROUND_IDLE, ROUND_DRAFT_SENT, ROUND_DRAFTING},
    {ROUND_IDLE, ROUND_VERIFY_SENT, ROUND_VERIFYING},           /* a pre-draft hit, matched drafts */
    {ROUND_IDLE, ROUND_RUN_SENT, ROUND_PLAIN_RUN},
    {ROUND_PREFILLING, ROUND_TARGET_DONE, ROUND_IDLE},
    {ROUND_DRAFTING, ROUND_VERIFY_BESIDE_SENT, ROUND_VERIFY_BESIDE_DRAFT},
    {ROUND_DRAFTING, ROUND_VERIFY_SENT, ROUND_VERIFYING},       /* draft_ready */
    {ROUND_DRAFTING, ROUND_DRAFT_LOST, ROUND_IDLE},
    {ROUND_VERIFYING, ROUND_TARGET_DONE, ROUND_IDLE},
    {ROUND_VERIFYING, ROUND_PREDRAFT_AWAITED, ROUND_AWAIT_PREDRAFT},
    {ROUND_VERIFY_BESIDE_DRAFT, ROUND_TARGET_DONE, ROUND_IDLE},
    {ROUND_VERIFY_BESIDE_DRAFT, ROUND_PREDRAFT_AWAITED, ROUND_AWAIT_PREDRAFT},
    {ROUND_VERIFY_BESIDE_DRAFT, ROUND_TARGET_GAVE_UP, ROUND_DRAFTING},
    {ROUND_VERIFY_BESIDE_DRAFT, ROUND_VERIFY_SENT, ROUND_VERIFYING}, /* gave up, the draft in */
    {ROUND_VERIFY_BESIDE_DRAFT, ROUND_BESIDE_ABANDONED, ROUND_IDLE},
    {ROUND_AWAIT_PREDRAFT, ROUND_PREDRAFT_RESOLVED, ROUND_IDLE},
    {ROUND_AWAIT_PREDRAFT, ROUND_DRAFT_LOST, ROUND_IDLE},
    {ROUND_PLAIN_RUN, ROUND_STEP_DONE, ROUND_PLAIN_RUN},
    {ROUND_PLAIN_RUN, ROUND_TARGET_DONE, ROUND_IDLE},
};
#define N_LEGAL (sizeof legal / sizeof legal[0])

static const struct legal *find_legal(enum round_state from, enum round_event ev)
{
    for (size_t i = 0; i < N_LEGAL; i++)
        if (legal[i].from == from && legal[i].ev == ev)
            return &legal[i];
    return NULL;
}

static void test_round_every_pair_as_specified(void **state)
{
    (void)state;
    int allowed = 0;
    for (int st = 0; st < ROUND_STATES; st++) {
        for (int ev = 0; ev < ROUND_EVENTS; ev++) {
            const struct legal *l = find_legal((enum round_state)st, (enum round_event)ev);
            struct round r = {.state = (enum round_state)st, .counter = 7};
            char err[ERR_MSG_MAX] = "";
            const int rc = round_move(&r, (enum round_event)ev, err);
            if (l != NULL && (rc != 0 || r.state != l->to))
                fail_msg("%s in %s: want %s, got rc %d state %s", round_event_name((enum round_event)ev),
                         round_state_name((enum round_state)st), round_state_name(l->to), rc,
                         round_state_name(r.state));
            if (l == NULL && (rc == 0 || r.state != (enum round_state)st))
                fail_msg("%s in %s: must be refused, got rc %d state %s",
                         round_event_name((enum round_event)ev), round_state_name((enum round_state)st), rc,
                         round_state_name(r.state));
            if (l == NULL) {
                /* the refusal names the event and the state */
                assert_non_null(strstr(err, round_event_name((enum round_event)ev)));
                assert_non_null(strstr(err, round_state_name((enum round_state)st)));
            }
            assert_int_equal(r.counter, 7); /* the move touches nothing but the state */
            allowed += rc == 0;
        }
    }
    assert_int_equal(allowed, (int)N_LEGAL);
}

static void test_round_refuses_values_out_of_range(void **state)
{
    (void)state;
    enum round_state to = ROUND_IDLE;
    assert_false(round_allows((enum round_state)ROUND_STATES, ROUND_TARGET_DONE, &to));
    assert_false(round_allows(ROUND_VERIFYING, (enum round_event)ROUND_EVENTS, &to));
    assert_false(round_allows((enum round_state)-1, ROUND_TARGET_DONE, &to));
    struct round r = {.state = ROUND_VERIFYING};
    assert_int_equal(round_move(&r, (enum round_event)ROUND_EVENTS, NULL), -1);
    assert_int_equal(r.state, ROUND_VERIFYING);
}

/* What the scheduler asks of a round before using a reply. */
static void test_round_awaits(void **state)
{
    (void)state;
    for (int st = 0; st < ROUND_STATES; st++) {
        struct round r = {.state = (enum round_state)st};
        const bool target = st == ROUND_PREFILLING || st == ROUND_VERIFYING || st == ROUND_VERIFY_BESIDE_DRAFT ||
                            st == ROUND_PLAIN_RUN;
        assert_int_equal(round_awaits_target(&r), target);
        for (int b = BESIDE_DRAFT_AWAITED; b <= BESIDE_DRAFT_LOST; b++) {
            r.verify.beside = (enum beside_draft)b;
            const bool draft = st == ROUND_DRAFTING || (st == ROUND_VERIFY_BESIDE_DRAFT && b == BESIDE_DRAFT_AWAITED);
            assert_int_equal(round_awaits_draft(&r), draft);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_every_pair_as_specified),
        cmocka_unit_test(test_round_refuses_values_out_of_range),
        cmocka_unit_test(test_round_awaits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
