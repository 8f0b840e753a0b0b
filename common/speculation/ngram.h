/* ngram.h: drafts from a sequence's own tokens, no model: the token that
 * most often followed the longest recent context that occurred before
 * (orders n_max down to n_min), chained token by token over what it
 * predicted. Verified by the target like any draft, as point masses (no
 * draft distribution exists), so the output stays exactly the target's; a
 * wrong guess costs only the rows it added to the verification.
 *
 * Stateless: each call scans the last `window` tokens, O(window * (n_max -
 * n_min + 1) * n_max) per predicted token, a fraction of a millisecond for
 * the defaults against a forward call of milliseconds. Reentrant; nothing
 * is allocated.
 */
#ifndef TANDEM_NGRAM_H
#define TANDEM_NGRAM_H

#include <stdint.h>

#include "draft_tree.h"

#define NGRAM_N_MAX 8
#define NGRAM_WINDOW_MAX 65536

struct ngram_params {
    int n_min, n_max; /* context lengths tried, longest first: 1 <= n_min <= n_max <= NGRAM_N_MAX */
    int window;       /* the last `window` tokens are searched, 1..NGRAM_WINDOW_MAX */
};

/* Defaults: 2- to 4-grams over the last 1024 tokens. */
void ngram_params_default(struct ngram_params *p);

/* 0 when p is usable, else ERR_INVALID_ARG naming the field (err: NULL or
 * ERR_MSG_MAX bytes). */
int ngram_params_check(const struct ngram_params *p, char *err);

/* Predicts up to k_max tokens that follow hist[0..n_hist) into out (room
 * for k_max) and returns how many: it stops at the first token with no
 * context match. Among the tokens that followed a match of the longest
 * matching order, the most frequent wins; a tie goes to the most recent. */
int ngram_draft(const struct ngram_params *p, const int32_t *hist, int n_hist, int k_max, int32_t *out);

/* Most candidates a tree node takes from one context. */
#define NGRAM_TREE_BRANCH_MAX 4

/* Several continuations as a token tree (draft_tree.h): ngram_draft's chain
 * of up to depth_max tokens first, then, from the root down, at each of its
 * positions the next best candidates (up to `branch` in all there, at most
 * NGRAM_TREE_BRANCH_MAX), each continued by ngram_draft's rule to depth_max,
 * while the tree has fewer than nodes_max nodes. Returns the nodes. */
int ngram_draft_tree(const struct ngram_params *p, const int32_t *hist, int n_hist, int depth_max,
                     int nodes_max, int branch, struct draft_tree *out);

#endif
