/* grammar_schema.h: a JSON schema (the `response_format` of a request)
 * compiled to a grammar whose sentences are exactly JSON texts that the
 * schema validates, or a subset of them.
 *
 * The subset (docs/grammar.md has the table): type (one or a list of
 * object, array, string, number, integer, boolean, null), properties,
 * required, additionalProperties (false or absent: only the listed
 * properties, in the listed order), items (one schema), minItems, maxItems,
 * minLength, maxLength, pattern (grammar_regex.h; not beside the lengths),
 * enum, const, anyOf, $ref to "#" or into $defs /
 * definitions (recursion allowed), and the annotations title, description,
 * default, examples, $schema, $id, $comment, deprecated, readOnly, writeOnly.
 * Anything else is refused with ERR_UNSUPPORTED naming the keyword and its
 * path ("schema.properties.age: unsupported keyword 'minimum'"), a malformed
 * schema with ERR_INVALID_ARG naming what is wrong, so nothing is silently
 * ignored: what the grammar produces always validates.
 *
 * The JSON produced: no whitespace before the value or after it; up to
 * GRAMMAR_SCHEMA_WS_MAX bytes of space, tab, newline between tokens;
 * numbers with at most 16 integer and 16 fraction digits and 3 exponent
 * digits; strings of well-formed UTF-8 with JSON's escapes, no \u escape of
 * a surrogate (so a schema's lengths count the same characters).
 */
#ifndef TANDEM_GRAMMAR_SCHEMA_H
#define TANDEM_GRAMMAR_SCHEMA_H

#include "grammar.h"

#include <cjson/cJSON.h>

#define GRAMMAR_SCHEMA_WS_MAX 16
#define GRAMMAR_SCHEMA_DEPTH_MAX 64
#define GRAMMAR_SCHEMA_COUNT_MAX 1000 /* minItems, maxItems, minLength, maxLength */

/* Compiles `schema`. `where` names the schema in messages ("schema",
 * "response_format.json_schema.schema"). On success *out owns the grammar. */
int grammar_schema_compile(const cJSON *schema, const char *where, struct grammar **out,
                           char *err);

/* The same from JSON text text[0..len) (checked by json_check first). */
int grammar_schema_compile_text(const char *text, size_t len, const char *where,
                                struct grammar **out, char *err);

/* The grammar of `{"type": "json_object"}`: any JSON object. */
int grammar_schema_any_object(struct grammar **out, char *err);

#endif
