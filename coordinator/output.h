/* output.h: the text side of one sequence in the coordinator.
 *
 * What it is: accepted token ids go in one at a time; it detokenizes them
 * incrementally (common/text/detokenizer.h, so a piece never ends inside a UTF-8
 * sequence), finds the request's stop strings in the text, and says which
 * bytes may be streamed to the client now. While stop strings are set, the
 * last (longest stop string - 1) bytes are held back from the stream, since
 * they may turn out to be the start of a stop string; the stream never
 * splits a UTF-8 character.
 * What it is not: it does not decide about EOS or max_tokens (the
 * coordinator does), and it sends nothing.
 *
 * Without a tokenizer (tk NULL: a model directory without tokenizer.json)
 * the text stays empty and stop strings never match.
 */
#ifndef TANDEM_COORDINATOR_OUTPUT_H
#define TANDEM_COORDINATOR_OUTPUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct tokenizer;
struct output;

/* Borrows tk (may be NULL) and copies the stop strings (non-empty). Special
 * tokens produce no text (as tandem-generate's text). Returns 0, ERR_NOMEM. */
int output_create(struct output **out, const struct tokenizer *tk, char *const *stop, int n_stop,
                  char *err);
void output_destroy(struct output *o);  /* NULL-safe */

/* Adds one accepted token. When the text now contains a stop string, the
 * text is cut just before it and *stopped is set (push nothing afterwards).
 * Returns 0, ERR_RANGE (id not in the vocabulary) or ERR_NOMEM. */
int output_push(struct output *o, int32_t id, bool *stopped, char *err);

/* End of the stream (EOS, length, ...): releases bytes the detokenizer held
 * (repaired) and checks stop strings once more. Returns 0 or ERR_NOMEM. */
int output_finish(struct output *o, bool *stopped, char *err);

/* The whole text so far (NUL-terminated; may contain NUL bytes). */
const char *output_text(const struct output *o, size_t *len_out);

/* The bytes that may be streamed now and were not streamed yet; marks them
 * streamed. final: the sequence is over, everything goes. The pointer is
 * valid until the next call on o. */
const char *output_take_stream(struct output *o, bool final, size_t *len_out);

#endif
