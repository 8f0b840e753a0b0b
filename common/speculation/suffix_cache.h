/* suffix_cache.h: earlier requests' prompts and outputs, shared by all
 * requests of one coordinator, as a source of drafts: where the last
 * SUFFIX_CACHE_KEY tokens of a sequence occurred in an earlier request,
 * what followed them there is proposed, from the occurrence that matches
 * the longest stretch backwards (the most recent on a tie). A repeated
 * request, a retry, an agent's tool loop get most of their tokens this
 * way. Verified by the target as point masses, like any coordinator draft.
 *
 * Bounded: every stored request (its tokens and one index entry per
 * position) counts against a byte budget; past it the least recently used
 * requests (stored or matched) are evicted, their index entries with
 * them, so a lookup only ever reads live requests. Single-threaded.
 */
#ifndef TANDEM_SUFFIX_CACHE_H
#define TANDEM_SUFFIX_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "draft_tree.h"

/* Tokens a match must cover at least (the index key). */
#define SUFFIX_CACHE_KEY 4
/* Longest stretch a match is measured over, backwards from the key. */
#define SUFFIX_CACHE_MATCH_MAX 64

struct suffix_cache;

/* 0, or ERR_INVALID_ARG (budget below what one bucket table takes) /
 * ERR_NOMEM; err: NULL or ERR_MSG_MAX bytes. */
int suffix_cache_create(struct suffix_cache **out, size_t budget_bytes, char *err);
void suffix_cache_destroy(struct suffix_cache *sc); /* NULL-safe */

/* Stores a finished request's tokens (prompt and output). One longer than
 * the budget allows is not stored. Old requests are evicted to make room.
 * 0 or ERR_NOMEM (the cache is left as it was). */
int suffix_cache_add(struct suffix_cache *sc, const int32_t *tokens, int n_tokens);

/* Up to k_max tokens that followed the last SUFFIX_CACHE_KEY tokens of
 * hist in a stored request, into out; returns how many (0: no match), and
 * in *match_len (may be NULL) how many tokens of hist the match covers.
 * The request matched becomes the most recently used. */
int suffix_cache_draft(struct suffix_cache *sc, const int32_t *hist, int n_hist, int k_max, int32_t *out,
                       int *match_len);

/* Matches a tree proposes from, at most: the longest first. */
#define SUFFIX_CACHE_TREE_CANDIDATES 16

/* Several continuations at once, as a token tree (draft_tree.h): the
 * continuations (up to depth_max tokens each) of up to
 * SUFFIX_CACHE_TREE_CANDIDATES stored occurrences of the key, the longest
 * backward matches first (the newest on a tie), merged while the tree has
 * fewer than nodes_max nodes. The first is suffix_cache_draft's chain, so
 * the tree holds it (whole when depth_max <= nodes_max). Returns the nodes;
 * *match_len as suffix_cache_draft's. */
int suffix_cache_draft_tree(struct suffix_cache *sc, const int32_t *hist, int n_hist, int depth_max,
                            int nodes_max, struct draft_tree *out, int *match_len);

/* What it holds: bytes counted against the budget, requests stored, and
 * requests evicted since it was created. */
size_t suffix_cache_bytes(const struct suffix_cache *sc);
size_t suffix_cache_budget(const struct suffix_cache *sc);
int suffix_cache_requests(const struct suffix_cache *sc);
uint64_t suffix_cache_evicted(const struct suffix_cache *sc);

#endif
