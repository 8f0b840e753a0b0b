/* prompt.h: a generate request's input as token ids: prompt_ids checked
 * against the vocabulary, or text through the tokenizer (BOS added), or chat
 * messages through the model's chat template. The one place client text
 * reaches the tokenizer and the template (intake.c calls it; the request
 * fuzz target drives it as it is).
 *
 * What it is not: it sends nothing and holds no coordinator state; intake
 * turns its message into the client's error reply. */
#ifndef TANDEM_PROMPT_H
#define TANDEM_PROMPT_H

#include <stddef.h>
#include <stdint.h>

#include "request.h"
#include "tokenizer.h"

/* The "Today Date" of the Llama 3.1/3.2 system turn, used when a
 * conversation has tools or tool turns (the template's default). */
#define PROMPT_TOOLS_DATE "26 Jul 2024"

/* What the ids must fit. */
struct prompt_limits {
    int vocab;                  /* the target's vocabulary: every id in 0..vocab-1 */
    int context_len;            /* the target's context: at most context_len - 1 ids */
    const char *tokenizer_path; /* named when text comes without a tokenizer */
};

/* *ids_out (malloc'd, the caller frees it) holds *n_out ids, 1 <= *n_out <
 * context_len, with room for *cap_out >= *n_out + 1 ids: the prompt plus
 * max_tokens and a round's drafts, capped at what the context can hold.
 * tk NULL: only prompt_ids are accepted. On failure returns the error code
 * (ERR_INVALID_ARG, ERR_MISMATCH: the tokenizer produced an id outside the
 * target's vocabulary, ERR_CONTEXT_FULL, ERR_NOMEM, or the tokenizer's) with
 * msg, the client's reply, naming the field ("prompt_ids[3]: token id 900 is
 * outside the vocabulary (0..511)"), and *ids_out NULL. */
int prompt_build(const struct tokenizer *tk, const struct prompt_limits *lim,
                 const struct request *r, int32_t **ids_out, int *n_out, int *cap_out, char *msg,
                 size_t msg_size);

#endif
