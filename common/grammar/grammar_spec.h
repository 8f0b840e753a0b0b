/* grammar_spec.h: a request's grammar as it travels: which front end
 * (grammar text, JSON schema, any JSON object) and its text, parsed from the
 * request's JSON, compiled where it is used, hashed to share engines.
 *
 * The forms (docs/protocol.md, "grammar"):
 *   {"type": "gbnf", "text": "<grammar text>"}
 *   {"type": "json_schema", "schema": <schema>}   (a client's form)
 *   {"type": "json_schema", "text": "<schema as JSON text>"}  (between processes)
 *   {"type": "json_object"}
 * A schema is kept as its JSON text (cJSON_PrintUnformatted), so that the
 * coordinator and both workers hash and compile the same bytes.
 *
 * What it is not: a cache or a matcher; the holders of engines decide.
 */
#ifndef TANDEM_GRAMMAR_SPEC_H
#define TANDEM_GRAMMAR_SPEC_H

#include "grammar.h"

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

enum grammar_spec_kind {
    GRAMMAR_SPEC_NONE = 0,
    GRAMMAR_SPEC_GBNF = 1,
    GRAMMAR_SPEC_JSON_SCHEMA = 2,
    GRAMMAR_SPEC_JSON_OBJECT = 3,
};

struct grammar_spec {
    enum grammar_spec_kind kind;
    char *text;  /* NUL-terminated: the grammar text or the schema's JSON; NULL for json_object */
    size_t len;
};

/* Reads `item` (one of the forms above; `field` names it in messages:
 * "grammar"). A client's schema is "schema"; "text" is refused for it
 * unless wire_form (a worker message). Only the shape is checked here:
 * grammar_spec_check compiles. *out owns its text (grammar_spec_free).
 * ERR_INVALID_ARG naming the field, ERR_NOMEM. */
int grammar_spec_from_json(struct grammar_spec *out, const cJSON *item, const char *field,
                           int wire_form, char *err);

/* The wire form of s as a new object (NULL when out of memory). */
cJSON *grammar_spec_to_json(const struct grammar_spec *s);

/* Compiles s; `where` names it in messages ("grammar"). *out owns the
 * grammar. The front ends' errors (grammar_gbnf.h, grammar_schema.h). */
int grammar_spec_compile(const struct grammar_spec *s, const char *where, struct grammar **out,
                         char *err);

/* Compiles s and builds its engine once, then drops both: what a request's
 * validation runs so that every error a worker could meet is the client's
 * 400 instead. */
int grammar_spec_check(const struct grammar_spec *s, const char *where, char *err);

/* FNV-1a over the kind and the text: the key of an engine cache. */
uint64_t grammar_spec_hash(const struct grammar_spec *s);
/* 1 when a and b are the same grammar. */
int grammar_spec_equal(const struct grammar_spec *a, const struct grammar_spec *b);
/* *dst = a copy of src. ERR_NOMEM. */
int grammar_spec_copy(struct grammar_spec *dst, const struct grammar_spec *src);

/* "gbnf", "json_schema", "json_object", "none". */
const char *grammar_spec_kind_name(enum grammar_spec_kind kind);

void grammar_spec_free(struct grammar_spec *s); /* leaves s NONE; NULL-safe */

#endif
