/* tree_choice.h: whether a token tree pays over a chain, measured.
 *
 * `spec_tree: auto` (docs/token-trees.md): a tree of the model-free
 * sources' drafts takes more tokens a round than their chain (n-grams on
 * the agent-like conversation: 1.34-1.37 against 1.16-1.17) but verifies
 * more rows; whether the rows cost less than the tokens earn is the
 * hardware's and the target's (on the trained pair's cache-resident CPU
 * target a tree ran at 0.74-0.78x target-only where the chain ran at
 * 0.99x). So it is measured, as the pre-draft choice is: rounds drafted as
 * chains, then as trees, each for a few rounds, then whichever gave more
 * tokens per millisecond of wall time, the other tried again for a few
 * rounds now and then (costs move with the machine's load). It runs no
 * model and reads no clock: the caller feeds each finished round.
 */
#ifndef TANDEM_TREE_CHOICE_H
#define TANDEM_TREE_CHOICE_H

#include <stdbool.h>

struct tree_choice {
    /* decayed sums per way: [0] chains, [1] trees */
    double ms[2], tokens[2];
    int rounds[2];           /* rounds fed, undecayed */
    bool trees;              /* the choice, once both were measured */
    int trial_left;          /* rounds left trying the way not chosen */
    int since_trial;         /* rounds since the last trial ended */
};

void tree_choice_init(struct tree_choice *tc);

/* Whether the next round of matched drafts should go as a tree. */
bool tree_choice_trees(const struct tree_choice *tc);

/* A finished round of matched drafts: sent as a tree or not, the tokens it
 * gave (accepted + the target's own) and its wall time (<= 0: not
 * measured, not counted). */
void tree_choice_note(struct tree_choice *tc, bool tree, int tokens, double wall_ms);

#endif
