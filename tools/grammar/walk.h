/* walk.h: random outputs of a grammar, drawn token by token through its mask
 * (tandem-grammar's sample and bench).
 *
 * A walk first draws uniformly among the allowed tokens for a random number
 * of steps, then "closes": half of its steps take the one-byte token of the
 * first byte of a shortest path to a state where the grammar can end (a
 * search over the engine's rows), the others prefer one-byte tokens that end
 * things (" } ] 0 n t f), so that it ends without always taking the same
 * way. Any
 * allowed token whose bytes the matcher then refuses, or a state with no
 * allowed token and no end, is reported as an inconsistency: the walk is
 * also a check of the mask against the matcher.
 */
#ifndef TANDEM_GRAMMAR_WALK_H
#define TANDEM_GRAMMAR_WALK_H

#include "token_mask.h"

#include <stddef.h>
#include <stdint.h>

struct walk_ctx {
    struct grammar_engine *engine;
    struct token_mask *mask;
    const struct token_mask_vocab *vocab;
    uint64_t *bits;           /* token_mask_words */
    int32_t single_byte[256]; /* the token whose bytes are exactly that byte, or -1 */
    uint64_t rng;
    /* when set, each mask computation's time in seconds is appended here */
    double *times;
    size_t n_times, cap_times;
    /* when set, each timed mask is also applied to this row (token_mask_apply) */
    float *logits;
    int32_t n_logits;
};

/* One output; *text malloc'd (NUL-terminated, *len bytes). max_tokens bounds
 * the walk. Returns 0, ERR_INTERNAL with the reason in err for an
 * inconsistency or a walk that did not end, ERR_NOMEM. */
int walk_one(struct walk_ctx *w, int free_steps, int max_tokens, char **text, size_t *len,
             char *err);

uint64_t walk_rand(struct walk_ctx *w);

#endif
