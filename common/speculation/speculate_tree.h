/* speculate_tree.h: the accept/reject step over a tree of drafts (SpecInfer's
 * multi-draft rule, Miao et al. 2024) on host float arrays: the tree's
 * counterpart of speculate_verify (speculate.h), whose conventions it keeps.
 *
 * The tree: n nodes (at most SPECULATE_TREE_NODES_MAX) in topological order
 * (a parent's index below its children's), node i holding token t_i and
 * parents[i] (-1: a child of the root, the last accepted token). Each node
 * carries its proposal: the distribution its token was drawn from (q row,
 * V floats), or none (NULL: a point mass at t_i, as n-gram, suffix-cache and
 * argmax proposals are). Sources may mix under one root. p_rows holds the
 * target's distributions: row 0 after the root, row i + 1 after node i (the
 * rows of a verification that ran the tree).
 *
 * The rule, from the root down:
 *   greedy: follow the child whose token is argmax p (the lowest index among
 *     ties, the child of lowest index among equal tokens); where none is,
 *     emit argmax p and stop; at a leaf emit its argmax p (the bonus).
 *   sampled: r = p (the node's row). Visit the node's children in a random
 *     order; child x with proposal q is accepted iff u * q(x) * S < r(x) (S
 *     the sum of r, 1 for the row itself; a point mass has q(x) = 1), and
 *     the walk moves to it; otherwise r = max(r - q, 0) (a point mass: r(x) =
 *     0) and the next child is tried. No child accepted: the token is drawn
 *     from r (from p where r has no mass left); a leaf: from p (the bonus).
 * Why it is exact: each trial is a rejection-sampling step whose output,
 * accepted or not, is distributed as the current r (speculate.h's proof,
 * with r for p), and the proposals are independent of the earlier trials;
 * so the emitted token is distributed as p at every node, and the walk's
 * output is the target's.
 *
 * Randomness (philox.h), at depth d (position n = position0 + d - 1): the
 * j-th child tried uses u = philox_uniform(seed, PHILOX_STREAM_TARGET_ACCEPT,
 * n, j); the visiting order is a Fisher-Yates shuffle with draws of the same
 * stream at index SPECULATE_TREE_ORDER_INDEX + j; a correction or bonus uses
 * PHILOX_STREAM_TARGET_SAMPLE at n, index 0. So a tree that is a chain (one
 * child a node) decides exactly as speculate_verify on the same chain.
 *
 * Threads: reentrant; nothing is allocated.
 */
#ifndef TANDEM_SPECULATE_TREE_H
#define TANDEM_SPECULATE_TREE_H

#include <stdint.h>

#include "speculate.h"

#define SPECULATE_TREE_NODES_MAX 32
/* The Philox index of the first draw of a node's visiting order. */
#define SPECULATE_TREE_ORDER_INDEX 64

/* Deliberate faults, for tests ONLY (the zero value is none): the chi-square
 * test shows it detects a broken rule. */
enum speculate_tree_fault {
    SPECULATE_TREE_FAULT_NONE = 0,
    /* Children tried in index order, and r left as p after a rejection. */
    SPECULATE_TREE_FAULT_FIXED_ORDER_NO_RESIDUAL = 1,
};

struct speculate_tree_input {
    int n;                       /* nodes, 0..SPECULATE_TREE_NODES_MAX */
    int vocab;                   /* V >= 1 */
    const int32_t *tokens;       /* (n) each in 0..V-1 */
    const int32_t *parents;      /* (n) -1 or an earlier node */
    const float *const *q_rows;  /* (n) a row (V) or NULL (point mass); NULL: all point masses */
    const float *p_rows;         /* (n + 1, V) */
    int greedy;
    uint64_t seed;
    uint64_t position0;          /* the position of the root's children */
    enum speculate_tree_fault fault; /* tests only; leave 0 */
};

/* Walks the tree. tokens_out [n + 1] receives the accepted nodes' tokens,
 * root down, then the correction or bonus; path_out [n] (may be NULL) the
 * accepted nodes' indices; *n_accepted_out how many were accepted. scratch
 * [vocab] is overwritten (required unless greedy). ERR_INVALID_ARG: n or
 * vocab out of range, a missing array, a token outside the vocabulary or a
 * parent not before its child (named by index), a row with no positive
 * entry where a token must be drawn. */
int speculate_tree_verify(const struct speculate_tree_input *in, float *scratch, int32_t *tokens_out,
                          int32_t *path_out, int *n_accepted_out, char *err);

#endif
