/* grammar_gbnf.h: the grammar text of a request's `grammar` field (a GBNF-like
 * notation, docs/grammar.md) compiled to a grammar.
 *
 * What it is: a recursive-descent parser of rules `name ::= alternatives`
 * with literals, byte classes, groups, `.` and the quantifiers ? * + {n}
 * {n,} {n,m}; the start rule is `root`.
 * What it is not: a regex engine or a Unicode class parser: classes take
 * ASCII characters and \xHH bytes; a non-ASCII character in a class is
 * refused (write it as a literal or an alternative).
 */
#ifndef TANDEM_GRAMMAR_GBNF_H
#define TANDEM_GRAMMAR_GBNF_H

#include "grammar.h"

#include <stddef.h>

#define GRAMMAR_GBNF_TEXT_MAX (1 << 20) /* bytes of grammar text */
#define GRAMMAR_GBNF_NESTING_MAX 64     /* parentheses */
#define GRAMMAR_GBNF_REPEAT_MAX 1000    /* n and m of {n,m} */

/* Parses text[0..len). On success *out owns the grammar. ERR_FORMAT with a
 * message naming the line, column and what was wrong ("grammar: line 3,
 * column 9: expected '::=' after rule name 'value'"), or the rule (undefined,
 * left-recursive); ERR_RANGE past a limit above; ERR_NOMEM. */
int grammar_gbnf_parse(const char *text, size_t len, struct grammar **out, char *err);

#endif
