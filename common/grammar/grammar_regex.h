/* grammar_regex.h: a JSON schema's `pattern` as a grammar rule over the
 * bytes of a JSON string's contents (between the quotes, escapes included).
 *
 * What it is: a parser of a regular expression subset common to ECMA-262
 * (what JSON Schema names) and Python's re (what validators often run):
 * literals, `.`, classes with ASCII ranges and negation, \d \w \s and their
 * negations, escaped punctuation, \n \r \t, groups (capturing or (?:...)),
 * alternation, the quantifiers ? * + {n} {n,} {n,m} (a lazy `?` after them
 * changes nothing a string can match), `^` at the start and `$` at the end.
 * The match is a search, as validators do it: without `^` anything may come
 * before, without `$` anything after.
 * Each character is written the way the JSON string needs it: `"` as \",
 * `\` as \\, control characters as \n, \t, \r, \b, \f or \u00XX.
 * Where the dialects differ the grammar takes the part both accept: \d, \w,
 * \s are their ASCII members, \D, \W, \S their ASCII complements; `.` and a
 * negated class admit any non-ASCII character.
 * What it is not: backreferences, lookaround, \b, Unicode classes, `^` or
 * `$` elsewhere, non-ASCII characters inside classes: refused, named.
 */
#ifndef TANDEM_GRAMMAR_REGEX_H
#define TANDEM_GRAMMAR_REGEX_H

#include "grammar.h"

#define GRAMMAR_REGEX_NESTING_MAX 32

/* Adds to b a rule matching the JSON-encoded contents of the strings
 * `pattern` finds a match in; *rule_out is it. `any_char` is the rule of one
 * JSON string character (for what may surround an unanchored match).
 * ERR_UNSUPPORTED or ERR_INVALID_ARG with the reason ("at 4: lookahead is
 * not supported") in err, without a prefix; ERR_NOMEM, ERR_RANGE. */
int grammar_regex_compile(struct grammar_builder *b, const char *pattern, int32_t any_char,
                          int32_t *rule_out, char *err);

#endif
