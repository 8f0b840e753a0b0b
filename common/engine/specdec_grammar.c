/* specdec_grammar.c: structured output in the two halves (struct
 * specdec_grammar in specdec.h): the matcher kept on what the slot's KV
 * holds, and the masks on the rows a job reads.
 *
 * Invariant: at a job's start the matcher holds one state per output token
 * at positions n_prompt .. keep_len + n_feed - 1 (the rollback is O(1):
 * grammar_matcher keeps every state). An end-of-sequence token holds the
 * state it was taken in, so positions and states stay one to one.
 */
#include <math.h>
#include <string.h>

#include "error.h"
#include "specdec_internal.h"

int specdec_grammar_take(struct specdec_grammar *g, const int32_t *tokens, int n, bool strict,
                         char *err)
{
    for (int i = 0; i < n && !g->lost; i++) {
        int rc = token_mask_take(&g->matcher, g->vocab, &g->eos, tokens[i], err);
        if (rc == ERR_INVALID_ARG && !strict)
            g->lost = true;
        else if (rc)
            return rc;
    }
    return 0;
}

int specdec_grammar_start(struct specdec_grammar *g, int keep_len, const int32_t *feed, int n_feed,
                          bool strict, char *err)
{
    int out_len = keep_len - g->n_prompt, skip = 0;
    if (out_len < 0) {
        skip = -out_len;
        out_len = 0;
    }
    g->lost = false;
    if ((size_t)out_len > g->matcher.n_tokens) {
        if (strict)
            return error_set(err, ERR_INVALID_ARG, "grammar: the slot's tokens before position %d "
                             "were not matched", keep_len);
        g->lost = true;
        return 0;
    }
    grammar_matcher_rollback(&g->matcher, g->matcher.n_tokens - (size_t)out_len);
    return skip < n_feed ? specdec_grammar_take(g, feed + skip, n_feed - skip, strict, err) : 0;
}

/* Masks row with `state` (token_mask_apply: EOS kept where the grammar can
 * end); ids past the tokenizer's vocabulary are refused. Returns the
 * number of tokens left (>= 0) or an error. */
/* g->bits = the mask of `state`; returns how many ids of the model's vocab
 * it covers (the tokenizer's, at most vocab), or an error. */
static int state_bits(struct specdec_grammar *g, int32_t state, int vocab, char *err)
{
    int rc = token_mask_compute(g->mask, state, g->bits, err);
    if (rc)
        return rc;
    const int n_mask = token_mask_vocab_n_tokens(g->vocab);
    return n_mask < vocab ? n_mask : vocab;
}

/* A row nothing may follow: strict's error, or the grammar lost (1). */
static int nothing_allowed(struct specdec_grammar *g, bool strict, char *err)
{
    if (strict)
        return error_set(err, ERR_INVALID_ARG, "grammar: nothing may follow the output and the "
                         "model has no end-of-sequence token");
    g->lost = true;
    return 1;
}

static int mask_state(struct specdec_grammar *g, int32_t state, float *row, int vocab, char *err)
{
    const int n_mask = state_bits(g, state, vocab, err);
    if (n_mask < 0)
        return n_mask;
    const int allowed = token_mask_apply(g->bits, row, n_mask, &g->eos,
                                         grammar_engine_can_end(g->matcher.engine, state));
    for (int i = n_mask; i < vocab; i++)
        row[i] = -INFINITY;
    return allowed;
}

int specdec_grammar_mask_row(struct specdec_grammar *g, float *row, int vocab, bool strict,
                             char *err)
{
    if (g->lost)
        return 0;
    int n = mask_state(g, grammar_matcher_state(&g->matcher), row, vocab, err);
    if (n < 0)
        return n;
    return n == 0 && (n = nothing_allowed(g, strict, err)) < 0 ? n : 0;
}

int specdec_grammar_mask_rows(struct specdec_grammar *g, const int32_t *drafts, int k, float *rows,
                              int vocab, char *err)
{
    const size_t base = g->matcher.n_tokens;
    /* the states after 0..n_ok drafts: a refused draft's own row is the
     * last one read (its token has no probability there) */
    int rc = specdec_grammar_take(g, drafts, k, false, err);
    const int n_ok = (int)(g->matcher.n_tokens - base);
    g->lost = false;
    for (int i = 0; !rc && i <= n_ok && i <= k; i++) {
        const size_t keep = g->matcher.n_tokens;
        g->matcher.n_tokens = base + (size_t)i;
        rc = specdec_grammar_mask_row(g, rows + (size_t)i * (size_t)vocab, vocab, true, err);
        g->matcher.n_tokens = keep;
    }
    grammar_matcher_rollback(&g->matcher, (size_t)n_ok);
    return rc;
}

/* allow = the ids `state` admits among vocab (specdec_grammar_allow_rows);
 * returns how many, or an error. */
static int allow_state(struct specdec_grammar *g, int32_t state, uint64_t *allow, int vocab,
                       char *err)
{
    const int n_mask = state_bits(g, state, vocab, err);
    if (n_mask < 0)
        return n_mask;
    const size_t words = ((size_t)vocab + 63) / 64;
    const size_t mask_words = ((size_t)n_mask + 63) / 64;
    for (size_t w = 0; w < words; w++)
        allow[w] = w < mask_words ? g->bits[w] : 0;
    if (n_mask % 64)
        allow[n_mask / 64] &= (1ull << (n_mask % 64)) - 1; /* ids past the tokenizer's */
    if (grammar_engine_can_end(g->matcher.engine, state))
        for (int e = 0; e < g->eos.n; e++)
            if (g->eos.ids[e] >= 0 && g->eos.ids[e] < vocab)
                allow[g->eos.ids[e] / 64] |= 1ull << (g->eos.ids[e] % 64);
    int n = 0;
    for (size_t w = 0; w < words; w++)
        n += __builtin_popcountll(allow[w]);
    return n;
}

int specdec_grammar_allow_rows(struct specdec_grammar *g, const int32_t *drafts, int k,
                               uint64_t *allow, int vocab, char *err)
{
    const size_t words = ((size_t)vocab + 63) / 64;
    memset(allow, 0, (size_t)(k + 1) * words * sizeof *allow);
    if (g->lost)
        return 0; /* a target's grammar is never lost: strict starts fail instead */
    const size_t base = g->matcher.n_tokens;
    int rc = specdec_grammar_take(g, drafts, k, false, err);
    const int n_ok = (int)(g->matcher.n_tokens - base);
    g->lost = false;
    for (int i = 0; !rc && i <= n_ok && i <= k; i++) {
        const int n = allow_state(g, g->matcher.states[base + (size_t)i], allow + (size_t)i * words,
                                  vocab, err);
        if (n < 0)
            rc = n;
        else if (n == 0)
            rc = nothing_allowed(g, true, err);
    }
    grammar_matcher_rollback(&g->matcher, (size_t)n_ok);
    return rc;
}

int specdec_grammar_allow_row(struct specdec_grammar *g, uint64_t *allow, int vocab, bool strict,
                              char *err)
{
    if (g->lost)
        return 1;
    const int n = allow_state(g, grammar_matcher_state(&g->matcher), allow, vocab, err);
    if (n < 0)
        return n;
    return n == 0 ? nothing_allowed(g, strict, err) : 0;
}
