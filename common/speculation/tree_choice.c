/* tree_choice.c: see tree_choice.h. */
#include "tree_choice.h"

#include <string.h>

/* Rounds each way is measured over before the two are compared; its sums
 * decay per round of their own kind, so about the last 16 rounds count. */
#define TREE_TRIAL 8
#define TREE_DECAY 0.94
/* Once chosen, the other way is tried again for TREE_RETRY_TRIAL rounds
 * every TREE_RETRY rounds: a trial of the losing way costs at most 4 of
 * 132 rounds at its loss (trees at 0.75x a chain: 0.8% of the time). */
#define TREE_RETRY 128
#define TREE_RETRY_TRIAL 4
/* The tree must win by this much to be chosen: a tree round verifies
 * several times the rows of a chain, and a tie is the chain's. */
#define TREE_MARGIN 1.02

void tree_choice_init(struct tree_choice *tc)
{
    memset(tc, 0, sizeof *tc);
}

static double rate_of(const struct tree_choice *tc, int way)
{
    return tc->ms[way] > 0 ? tc->tokens[way] / tc->ms[way] : 0.0;
}

bool tree_choice_trees(const struct tree_choice *tc)
{
    if (tc->rounds[0] < TREE_TRIAL)
        return false;
    if (tc->rounds[1] < TREE_TRIAL)
        return true;
    return tc->trial_left > 0 ? !tc->trees : tc->trees;
}

void tree_choice_note(struct tree_choice *tc, bool tree, int tokens, double wall_ms)
{
    if (wall_ms <= 0 || tokens < 1)
        return;
    const int way = tree ? 1 : 0;
    tc->ms[way] = tc->ms[way] * TREE_DECAY + wall_ms;
    tc->tokens[way] = tc->tokens[way] * TREE_DECAY + tokens;
    tc->rounds[way]++;
    if (tc->rounds[0] < TREE_TRIAL || tc->rounds[1] < TREE_TRIAL)
        return;
    if (tc->trial_left > 0) {
        if (way != (tc->trees ? 1 : 0))
            tc->trial_left--;
    } else if (++tc->since_trial >= TREE_RETRY) {
        tc->since_trial = 0;
        tc->trial_left = TREE_RETRY_TRIAL;
    }
    if (tc->trial_left == 0)
        tc->trees = rate_of(tc, 1) > TREE_MARGIN * rate_of(tc, 0);
}
