/* specdec_tree.h: greedy verification of a token tree on the target, in
 * process (issue 61; docs/token-trees.md). One forward of the tree, then
 * the longest root path whose every node is the target's argmax after the
 * path before it, plus the target's own next token: the output of greedy
 * decoding whatever the tree held. The target half's jobs verify trees
 * too (specdec_verify_job.parents): specdec_tree_check and
 * specdec_tree_finish below are their part, batched with chains in one
 * forward call by specdec_target_step. */
#ifndef TANDEM_ENGINE_SPECDEC_TREE_H
#define TANDEM_ENGINE_SPECDEC_TREE_H

#include <stdint.h>

#include "llama.h"

struct specdec_target;
struct specdec_verify_job;

/* Most drafts of a tree job: with the last feed token (the tree's root)
 * the forward holds LLAMA_TREE_MAX rows. */
#define SPECDEC_TREE_NODES_MAX (LLAMA_TREE_MAX - 1)

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

/* Checks a tree job before its first step: 1..SPECDEC_TREE_NODES_MAX
 * drafts, each parent -1 or an earlier draft, no path deeper than
 * SPECULATE_K_MAX (tokens_out's room), no logprobs, controls, grammar or
 * device sampling (ERR_UNSUPPORTED naming it: the tree path lacks them).
 * 0 or the error, in err. */
int specdec_tree_check(const struct specdec_target *t, const struct specdec_verify_job *j, char *err);

/* The accept step of a tree job whose final entry ran: the entry held the
 * last feed token then the k drafts, rows [k + 1] of logits in p_rows (its
 * rows are overwritten) or, greedy, their argmaxes in p_argmax. Greedy
 * follows the target's argmax down the tree; sampled, speculate_tree_verify
 * with every draft a point mass (seed, Philox position keep_len + n_feed,
 * as a chain's). Keeps the path's KV (llama_ctx_tree_accept); on any error
 * the slot is cut back to before the tree and the job fails. Sets
 * tokens_out, n_accepted and done, or the job's error. */
void specdec_tree_finish(struct specdec_target *t, struct specdec_verify_job *j, float *p_rows,
                         const int32_t *p_argmax);

#endif
