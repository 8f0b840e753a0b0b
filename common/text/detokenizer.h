/* detokenizer.h: incremental (streaming) detokenization.
 *
 * Feeding ids one at a time and concatenating every piece returned by
 * detokenizer_push plus the final detokenizer_flush gives exactly the bytes
 * tokenizer_decode returns for all the ids at once. No piece ever ends inside
 * a UTF-8 sequence that later tokens could complete: those bytes are held
 * back; bytes that can no longer become valid are emitted as U+FFFD, as the
 * one-shot decode does.
 *
 * Thread safety: a detokenizer belongs to one thread (one stream); distinct
 * detokenizers on one shared tokenizer may run in parallel.
 */
#ifndef TANDEM_DETOKENIZER_H
#define TANDEM_DETOKENIZER_H

#include <stddef.h>
#include <stdint.h>

struct tokenizer;
struct detokenizer;

/* Borrows tk: it must outlive the detokenizer. skip_special drops special
 * tokens, like tokenizer_decode's flag. Returns 0 or ERR_NOMEM. */
int detokenizer_create(struct detokenizer **out, const struct tokenizer *tk, int skip_special, char *err);

/* NULL-safe. */
void detokenizer_destroy(struct detokenizer *dt);

/* Adds one id. *piece_out points to the newly complete text (*len_out bytes,
 * possibly 0; NUL-terminated) owned by dt and valid until the next call on
 * dt. Returns 0, ERR_RANGE (id not in the vocabulary; dt is unchanged) or
 * ERR_NOMEM. */
int detokenizer_push(struct detokenizer *dt, int32_t id, const char **piece_out, size_t *len_out, char *err);

/* Ends the stream: returns the held bytes (repaired to U+FFFD) the same way
 * and resets dt for a new stream. Returns 0 or ERR_NOMEM. */
int detokenizer_flush(struct detokenizer *dt, const char **piece_out, size_t *len_out, char *err);

#endif
