/* draft_tree.h: a token tree of draft candidates after a sequence's newest
 * token, built by merging candidate continuations (chains) under one root:
 * chains that share a prefix share its nodes, so n candidates of depth d
 * cost the target only their distinct tokens. What the suffix cache and the
 * n-gram source propose when asked for several continuations
 * (suffix_cache_draft_tree, ngram_draft_tree), in the layout a tree
 * verification takes (speculate_tree.h, llama_forward's parents): nodes in
 * topological order, parents[i] < i, -1 for a child of the root.
 *
 * Every node is a point mass (no draft distribution), so verification keeps
 * the target's output exactly whatever the tree holds. A node's weight is
 * the support of its subtree (the summed weights of the chains through it):
 * the sources rank candidates by it, and the first chain merged is always
 * whole (within the node budget), so a tree holds the chain its source
 * would have proposed alone. Plain data; nothing is allocated.
 */
#ifndef TANDEM_DRAFT_TREE_H
#define TANDEM_DRAFT_TREE_H

#include <stdint.h>

#define DRAFT_TREE_NODES_MAX 32

struct draft_tree {
    int n;
    int32_t tokens[DRAFT_TREE_NODES_MAX];
    int32_t parents[DRAFT_TREE_NODES_MAX]; /* -1: a child of the root */
    int32_t weight[DRAFT_TREE_NODES_MAX];
};

void draft_tree_clear(struct draft_tree *t);

/* Merges chain[0..n) under the root: follows the node's child holding the
 * next token while there is one, then appends the rest as new nodes while
 * the tree has fewer than nodes_max (<= DRAFT_TREE_NODES_MAX) nodes, adding
 * weight to every node of the path. Returns how many of the chain's tokens
 * the tree now holds along it (n when it fit). */
int draft_tree_add_chain(struct draft_tree *t, const int32_t *chain, int n, int32_t weight,
                         int nodes_max);

/* The depth of node i (1 for a child of the root). */
int draft_tree_depth(const struct draft_tree *t, int i);

/* How many leading tokens of want[0..n) the tree holds as one root path:
 * the tokens greedy verification would accept when want is the target's
 * output. */
int draft_tree_match(const struct draft_tree *t, const int32_t *want, int n);

#endif
