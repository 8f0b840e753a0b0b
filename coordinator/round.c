/* round.c: see round.h. The transition table is the comment at the top of
 * round.h made code: a cell names the state an event leads to, or -1 where
 * the event cannot happen in that state. */
#include "round.h"

#include <stddef.h>

#include "error.h"

#define NO (-1)

static const signed char next_state[ROUND_STATES][ROUND_EVENTS] = {
    /*                 prefill_sent      draft_sent      beside_sent                verify_sent      run_sent
     *                 step_done         target_done     predraft_awaited           predraft_resolved
     *                 draft_lost        target_gave_up  beside_abandoned */
    [ROUND_IDLE] = {ROUND_PREFILLING, ROUND_DRAFTING, NO, ROUND_VERIFYING, ROUND_PLAIN_RUN,
                    NO, NO, NO, NO,
                    NO, NO, NO},
    [ROUND_PREFILLING] = {NO, NO, NO, NO, NO,
                          NO, ROUND_IDLE, NO, NO,
                          NO, NO, NO},
    [ROUND_DRAFTING] = {NO, NO, ROUND_VERIFY_BESIDE_DRAFT, ROUND_VERIFYING, NO,
                        NO, NO, NO, NO,
                        ROUND_IDLE, NO, NO},
    [ROUND_VERIFYING] = {NO, NO, NO, NO, NO,
                         NO, ROUND_IDLE, ROUND_AWAIT_PREDRAFT, NO,
                         NO, NO, NO},
    [ROUND_VERIFY_BESIDE_DRAFT] = {NO, NO, NO, ROUND_VERIFYING, NO,
                                   NO, ROUND_IDLE, ROUND_AWAIT_PREDRAFT, NO,
                                   NO, ROUND_DRAFTING, ROUND_IDLE},
    [ROUND_AWAIT_PREDRAFT] = {NO, NO, NO, NO, NO,
                              NO, NO, NO, ROUND_IDLE,
                              ROUND_IDLE, NO, NO},
    [ROUND_PLAIN_RUN] = {NO, NO, NO, NO, NO,
                         ROUND_PLAIN_RUN, ROUND_IDLE, NO, NO,
                         NO, NO, NO},
};

bool round_allows(enum round_state from, enum round_event ev, enum round_state *to)
{
    if ((unsigned)from >= ROUND_STATES || (unsigned)ev >= ROUND_EVENTS || next_state[from][ev] == NO)
        return false;
    *to = (enum round_state)next_state[from][ev];
    return true;
}

int round_move(struct round *r, enum round_event ev, char *err)
{
    enum round_state to;
    if (!round_allows(r->state, ev, &to)) {
        if (err != NULL)
            error_set(err, ERR_INTERNAL, "round: %s in state %s is not a legal transition", round_event_name(ev),
                      round_state_name(r->state));
        return -1;
    }
    r->state = to;
    return 0;
}

bool round_awaits_target(const struct round *r)
{
    return r->state == ROUND_PREFILLING || r->state == ROUND_VERIFYING || r->state == ROUND_VERIFY_BESIDE_DRAFT ||
           r->state == ROUND_PLAIN_RUN;
}

bool round_awaits_draft(const struct round *r)
{
    return r->state == ROUND_DRAFTING ||
           (r->state == ROUND_VERIFY_BESIDE_DRAFT && r->verify.beside == BESIDE_DRAFT_AWAITED);
}

const char *round_state_name(enum round_state s)
{
    static const char *const names[ROUND_STATES] = {
        "idle", "prefilling", "drafting", "verifying", "verify_beside_draft", "await_predraft", "plain_run",
    };
    return (unsigned)s < ROUND_STATES ? names[s] : "?";
}

const char *round_event_name(enum round_event ev)
{
    static const char *const names[ROUND_EVENTS] = {
        "prefill_sent", "draft_sent", "verify_beside_sent", "verify_sent", "run_sent", "step_done",
        "target_done", "predraft_awaited", "predraft_resolved", "draft_lost", "target_gave_up",
        "beside_abandoned",
    };
    return (unsigned)ev < ROUND_EVENTS ? names[ev] : "?";
}
