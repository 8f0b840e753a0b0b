/* drafters.h: drafts made in the coordinator, from matches instead of a
 * model: n-grams of a request's own tokens (common/speculation/ngram.h)
 * and stretches of earlier requests (the suffix cache,
 * common/speculation/suffix_cache.h). Which source a round takes follows
 * the request's "draft" (docs/protocol.md); how many of the matched drafts
 * go to the target follows what a verification row costs (the target's
 * call-cost fit) against what the source's drafts were worth to this
 * request so far, so that matches that do not pay are not sent.
 */
#ifndef TANDEM_DRAFTERS_H
#define TANDEM_DRAFTERS_H

#include <stdbool.h>
#include <stdint.h>

#include "coord_state.h"
#include "draft_tree.h"

/* Drafts for s's next round from a match made here, at most k_cap, into
 * drafts; returns how many (0: no match, or none worth a verification
 * row) and the source in *source. model_usable: the draft worker could
 * draft this round instead ("auto" then takes only a long suffix match). */
int drafters_propose(struct coordinator *c, const struct seq *s, bool model_usable, int k_cap, int32_t *drafts,
                     enum request_draft *source);

/* How many drafts s's rounds may send as one token tree (verify_tree),
 * 0 for chains only: its spec_tree budget less the root when it is a node
 * budget, and only where the tree path serves it exactly as a chain would:
 * a model-free source (suffix, ngram, auto), no prediction, logprobs,
 * sampling controls or grammar, and a CPU target (the CUDA tree forward has
 * not run on a GPU yet). "auto": a tree of DRAFTERS_AUTO_TREE_NODES where the
 * pair's rounds alone measured trees paying over chains (tree_choice.h),
 * chains otherwise and in a batch (docs/token-trees.md). */
int drafters_tree_budget(const struct coordinator *c, const struct seq *s);

/* The node budget of an "auto" tree, the root counted: where trees paid in
 * the benchmarks, 8 nodes took as many tokens a round as 16 or 32
 * (docs/perf/cpu-token-trees.md). Admission reserves KV for it. */
#define DRAFTERS_AUTO_TREE_NODES 8

/* A token tree for s's next round from the model-free sources, under
 * drafters_propose's rules for which source a request takes: the suffix
 * cache's continuations (suffix_cache_draft_tree), else the n-grams' with
 * their runner-ups (ngram_draft_tree). Paths at most depth_max deep, at
 * most nodes_max (<= DRAFT_TREE_NODES_MAX) nodes. Returns the nodes (0:
 * no match) and the source in *source. An explicit budget is the client's
 * choice: the tree is not cut by what a row costs. */
int drafters_propose_tree(struct coordinator *c, const struct seq *s, bool model_usable, int depth_max,
                          int nodes_max, struct draft_tree *out, enum request_draft *source);

/* Whether t is a chain (each node the child of the one before). */
bool drafters_tree_is_chain(const struct draft_tree *t);

/* The target's verdict on a round of matched drafts from source: k
 * drafted, n_acc accepted. */
void drafters_learn(struct seq *s, enum request_draft source, int k, int n_acc);

/* A finished request's prompt and output join the suffix cache. */
void drafters_remember(struct coordinator *c, const struct seq *s);

/* The most drafts worth verifying for a request whose drafts each pass
 * with probability accept (0..1), at most k_max, when a target call costs
 * call_ms_base (shared by batch sequences) + call_ms_per_row a row: the k
 * that maximises expected tokens per millisecond, 0 when plain decoding
 * does better. A cost that was not measured (both 0) makes drafts free:
 * k_max. Exposed for its test. */
int drafters_worth_k(double accept, int k_max, double call_ms_base, double call_ms_per_row, int batch);

#endif
