/* grammar_cache.h: compiled grammars shared by the sequences that use the
 * same one: an engine and its mask cache per grammar text, found by the
 * text's hash (grammar_spec_hash), so a schema many requests send is
 * compiled once and its masks stay warm.
 *
 * What it is: a reference-counted set over one vocabulary. An entry in use
 * (get without put) is never freed, since a matcher holds state ids of its
 * engine; unused entries are kept, the least recently used dropped past
 * keep_unused of them.
 * What it is not: thread-safe (one thread, like the engines), or aware of
 * a tokenizer: the vocabulary comes in built (token_mask.h).
 */
#ifndef TANDEM_GRAMMAR_CACHE_H
#define TANDEM_GRAMMAR_CACHE_H

#include "grammar_spec.h"
#include "token_mask.h"

struct grammar_cache;

/* Borrows vocab (it must outlive the cache). */
int grammar_cache_create(struct grammar_cache **out, const struct token_mask_vocab *vocab,
                         int keep_unused, char *err);
void grammar_cache_destroy(struct grammar_cache *c); /* NULL-safe; every entry put back first */

/* The engine and mask of spec, compiled (named `where` in errors) on first
 * use; each get is paired with a put of the engine. */
int grammar_cache_get(struct grammar_cache *c, const struct grammar_spec *spec, const char *where,
                      struct grammar_engine **engine, struct token_mask **mask, char *err);
void grammar_cache_put(struct grammar_cache *c, const struct grammar_engine *engine);

/* Entries held (in use or kept). */
int grammar_cache_size(const struct grammar_cache *c);

#endif
