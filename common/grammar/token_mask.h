/* token_mask.h: which vocabulary tokens a grammar state allows.
 *
 * What it is: the vocabulary's byte strings as a trie laid out in preorder
 * (struct token_mask_vocab, built once per tokenizer and shared read-only),
 * and a per-engine mask cache (struct token_mask) that computes, for a
 * matcher state, the bitset of tokens whose bytes the grammar accepts from
 * it. The computation walks the trie in order and skips a subtree as soon as
 * the state it reaches is dead; the transitions come from the engine's
 * memoized rows (grammar_match.h), so after warm-up a walk is array lookups
 * over contiguous memory. Finished masks are cached per state.
 *
 * What it is not: aware of special tokens. Tokens given without bytes (the
 * tokenizer's special tokens) are never allowed; whether an end-of-sequence
 * token may be sampled is the caller's decision from grammar_engine_can_end.
 *
 * Threads: a token_mask is used by one thread at a time, like its engine.
 */
#ifndef TANDEM_TOKEN_MASK_H
#define TANDEM_TOKEN_MASK_H

#include "grammar_match.h"

#include <stddef.h>
#include <stdint.h>

/* Longest token the trie takes, in bytes. */
#define TOKEN_MASK_TOKEN_BYTES_MAX 1024

struct token_mask_vocab;

/* bytes[i], lens[i]: token i's bytes (bytes[i] NULL or lens[i] 0: a token
 * the mask never allows). The bytes are copied. ERR_INVALID_ARG naming the
 * token when one is longer than TOKEN_MASK_TOKEN_BYTES_MAX; ERR_NOMEM. */
int token_mask_vocab_create(struct token_mask_vocab **out, const uint8_t *const *bytes,
                            const size_t *lens, int32_t n_tokens, char *err);
void token_mask_vocab_destroy(struct token_mask_vocab *v); /* NULL-safe */
int32_t token_mask_vocab_n_tokens(const struct token_mask_vocab *v);
int32_t token_mask_vocab_n_nodes(const struct token_mask_vocab *v);

/* Bytes of token id (NULL, *len 0 for a token without bytes). */
const uint8_t *token_mask_vocab_bytes(const struct token_mask_vocab *v, int32_t id, size_t *len);

struct token_mask;

/* Borrows e and v: both must outlive m. cache_max_bytes bounds the cached
 * masks (0: 64 MiB; less than one mask: nothing is cached); past it the
 * cache is emptied and refilled. */
int token_mask_create(struct token_mask **out, struct grammar_engine *e,
                      const struct token_mask_vocab *v, size_t cache_max_bytes, char *err);
void token_mask_destroy(struct token_mask *m); /* NULL-safe */

/* Number of uint64_t words of a mask: ceil(n_tokens / 64). */
size_t token_mask_words(const struct token_mask *m);

/* Writes the allowed-token bitset of `state` to bits[0..token_mask_words):
 * bit i of bits[i / 64] set when token i's bytes are accepted from state.
 * Returns 0 or ERR_NOMEM (the engine's cap). */
int token_mask_compute(struct token_mask *m, int32_t state, uint64_t *bits, char *err);

/* What the walks did so far (for benchmarks): trie walks (cache misses),
 * nodes stepped, subtrees admitted whole. */
void token_mask_counts(const struct token_mask *m, uint64_t *walks, uint64_t *nodes_walked,
                       uint64_t *subtrees_admitted);

/* ---- for the samplers: what the wiring into requests needs ----
 * An end-of-sequence token has no bytes: it is allowed exactly where the
 * grammar can end. */
struct token_mask_eos {
    const int32_t *ids;
    int n;
};

/* Sets logits[i] to -INFINITY for every token i (of n_vocab) that bits does
 * not allow, the EOS ids excepted where can_end. Returns the number of
 * tokens left allowed: 0 only for a dead state or a vocabulary without a
 * token for any continuation (a byte-level one has every single byte), and
 * then the caller must end the sequence itself. */
int32_t token_mask_apply(const uint64_t *bits, float *logits, int32_t n_vocab,
                         const struct token_mask_eos *eos, int can_end);

/* Steps m over one token id: its bytes, or for an EOS id (no bytes) a state
 * of its own where the grammar can end, so that a matcher holds one state
 * per position of the output (the rule every holder of a matcher keeps: the
 * engine's halves, the coordinator's draft cut). 0; ERR_INVALID_ARG when
 * the grammar refuses it (m unchanged): the token has no bytes, its bytes
 * leave the grammar, or an EOS comes before the grammar can end; ERR_RANGE
 * for an id outside v; ERR_NOMEM. err: NULL or ERR_MSG_MAX bytes. */
int token_mask_take(struct grammar_matcher *m, const struct token_mask_vocab *v,
                    const struct token_mask_eos *eos, int32_t id, char *err);

/* token_mask_take over tokens[0..n) while the grammar accepts them, and
 * after an EOS no further (the output ends there). The matcher keeps one
 * state per token taken (grammar_matcher_rollback undoes them). Returns how
 * many it took (>= 0; drafts past a refusal are cut there), or
 * token_mask_take's error other than a refusal (< 0). */
int token_mask_accept_tokens(struct grammar_matcher *m, const struct token_mask_vocab *v,
                             const int32_t *tokens, int n, const struct token_mask_eos *eos,
                             char *err);

static inline int token_mask_test(const uint64_t *bits, int32_t id)
{
    return (int)((bits[id >> 6] >> (id & 63)) & 1);
}

#endif
