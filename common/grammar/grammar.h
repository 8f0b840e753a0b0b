/* grammar.h: a context-free grammar over bytes, and the builder that makes one.
 *
 * What it is: the common form both front ends compile to (grammar_gbnf.h for
 * the grammar text, grammar_schema.h for JSON schemas) and that the matcher
 * (grammar_match.h) runs. A grammar is a list of rules; a rule is a list of
 * alternatives; an alternative is a sequence of elements, each either a byte
 * class (a set of bytes, one byte of input) or a reference to a rule.
 * Everything is bytes: UTF-8 is spelled out by the front ends as byte
 * sequences, so the matcher never decodes text.
 *
 * What it is not: a parser of anything. It checks only what the matcher
 * needs: every referenced rule is defined, and no rule can reach itself
 * without consuming a byte (left recursion, or a repetition of something that
 * can be empty), which would make the matcher loop.
 *
 * Invariants of a finished grammar: immutable; shared read-only by any number
 * of engines.
 */
#ifndef TANDEM_GRAMMAR_H
#define TANDEM_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

/* Limits that keep a hostile grammar or schema from exhausting memory. */
#define GRAMMAR_RULES_MAX 65536
#define GRAMMAR_ELEMS_MAX (1 << 22)

/* An element: kind in the low two bits, index above. */
enum grammar_kind {
    GRAMMAR_KIND_END = 0,   /* end of an alternative */
    GRAMMAR_KIND_CLASS = 1, /* one byte out of the class with this index */
    GRAMMAR_KIND_RULE = 2,  /* the rule with this index */
};
#define GRAMMAR_ELEM(kind, index) ((int32_t)(((uint32_t)(index) << 2) | (uint32_t)(kind)))
#define GRAMMAR_ELEM_KIND(e) ((int)((uint32_t)(e)&3u))
#define GRAMMAR_ELEM_INDEX(e) ((int32_t)((uint32_t)(e) >> 2))

/* A byte class: bit b of bits[b / 8] set when byte b is in it. */
struct grammar_class {
    uint8_t bits[32];
};

/* An alternative under construction; the builder copies it when it is added. */
struct grammar_seq {
    int32_t *elems;
    size_t n, cap;
};

/* The finished grammar. Alternatives are flattened into elems, each ending
 * with an END element; rule r's alternatives start at
 * elems[alt_start[rule_alt[r] .. rule_alt[r + 1])]. */
struct grammar {
    int32_t *elems;
    size_t n_elems;
    uint32_t *alt_start;
    uint32_t *rule_alt;
    int32_t n_rules;
    struct grammar_class *classes;
    int32_t n_classes;
    int32_t root;
};

struct grammar_builder;

int grammar_builder_create(struct grammar_builder **out);
void grammar_builder_destroy(struct grammar_builder *b); /* NULL-safe */

/* The rule called `name`, created (without alternatives) on first use. Rules
 * referenced but never given an alternative are an error at finish, naming
 * the rule. ERR_RANGE past GRAMMAR_RULES_MAX, ERR_NOMEM. */
int grammar_builder_rule(struct grammar_builder *b, const char *name, int32_t *id_out);

/* A new rule named after `base` and a counter ("value_7"): the front ends'
 * rules for repetitions and groups. */
int grammar_builder_rule_fresh(struct grammar_builder *b, const char *base, int32_t *id_out);

/* The name of a rule (valid while the builder lives). */
const char *grammar_builder_rule_name(const struct grammar_builder *b, int32_t id);

/* Number of alternatives of rule id so far. */
size_t grammar_builder_alt_count(const struct grammar_builder *b, int32_t id);

/* 1 when rule id has at least one alternative. */
int grammar_builder_rule_defined(const struct grammar_builder *b, int32_t id);

/* The element for byte class `cls` (equal classes share an index). */
int grammar_builder_class(struct grammar_builder *b, const struct grammar_class *cls,
                          int32_t *elem_out);

/* Appends one element to s. ERR_RANGE past GRAMMAR_ELEMS_MAX, ERR_NOMEM. */
int grammar_seq_push(struct grammar_seq *s, int32_t elem);

/* Appends one class element per byte of bytes[0..len). */
int grammar_seq_literal(struct grammar_builder *b, struct grammar_seq *s, const void *bytes,
                        size_t len);

void grammar_seq_free(struct grammar_seq *s); /* leaves s empty and reusable */

/* Adds a copy of s as an alternative of rule id (s may be empty: the
 * alternative matches the empty string). */
int grammar_builder_alt(struct grammar_builder *b, int32_t id, const struct grammar_seq *s);

/* Checks and flattens the grammar with `root` as its start rule. On success
 * *out owns the grammar (grammar_free). The builder stays usable only for
 * destroy. ERR_FORMAT naming the rule: a rule referenced and never defined,
 * a rule that reaches itself without consuming a byte; ERR_NOMEM. */
int grammar_builder_finish(struct grammar_builder *b, int32_t root, struct grammar **out,
                           char *err);

void grammar_free(struct grammar *g); /* NULL-safe */

/* The rule (named "<utf8>", made once per builder) matching exactly one
 * well-formed UTF-8 character of two to four bytes: no overlong forms, no
 * surrogates, nothing past U+10FFFF. */
int grammar_builder_utf8_multi(struct grammar_builder *b, int32_t *id_out);

/* Appends to out the elements of sub repeated min..max times (max < 0:
 * unbounded), through helper rules named after `base`. ERR_RANGE, ERR_NOMEM. */
int grammar_builder_repeat(struct grammar_builder *b, const char *base,
                           const struct grammar_seq *sub, long min, long max,
                           struct grammar_seq *out);

/* A sequence of one element (convenience for alternatives of one element). */
int grammar_builder_alt1(struct grammar_builder *b, int32_t id, int32_t elem);

/* Class helpers. */
static inline void grammar_class_add(struct grammar_class *c, unsigned lo, unsigned hi)
{
    for (unsigned x = lo; x <= hi && x < 256; x++)
        c->bits[x >> 3] |= (uint8_t)(1u << (x & 7));
}
static inline int grammar_class_has(const struct grammar_class *c, unsigned x)
{
    return (c->bits[x >> 3] >> (x & 7)) & 1;
}

#endif
