/* specdec_tree.h: greedy verification of a token tree on the target, in
 * process (issue 61; docs/token-trees.md). One forward of the tree, then
 * the longest root path whose every node is the target's argmax after the
 * path before it, plus the target's own next token: the output of greedy
 * decoding whatever the tree held. Not yet wired into the target half or
 * the workers (specdec_target.c verifies chains). */
#ifndef TANDEM_ENGINE_SPECDEC_TREE_H
#define TANDEM_ENGINE_SPECDEC_TREE_H

#include <stdint.h>

#include "llama.h"

/* A tree of candidate tokens after `last`, the sequence's newest token
 * (not yet in the slot's KV, as a chain verification's first row):
 * tokens[i] with parents[i] (-1: a child of `last`; parents before
 * children), n in 0..LLAMA_TREE_MAX - 1. */
struct specdec_tree {
    int32_t last;
    const int32_t *tokens;
    const int32_t *parents;
    int n;
};

/* Runs `last` and the tree on slot in one llama_forward (argmax rows where
 * the backend has them, else whole logits), follows from `last` the child
 * equal to the target's argmax while there is one, and keeps that path's
 * KV (llama_ctx_tree_accept): the slot grows by 1 + the matched nodes.
 * out (host, >= n + 1 ids) gets the matched candidates then the target's
 * next token (a correction, or the bonus after a whole path); *n_out their
 * count, 1 .. n + 1. The next round's `last` is out[*n_out - 1]. Errors are
 * llama_forward's or llama_ctx_tree_accept's; ERR_INVALID_ARG for a tree
 * too large; the slot is then as before the call. */
int specdec_tree_verify_greedy(struct llama_ctx *ctx, int slot, const struct specdec_tree *tree,
                               int32_t *out, int *n_out, char *err);

#endif
