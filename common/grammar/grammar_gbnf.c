/* grammar_gbnf.c: the parser of the grammar text (docs/grammar.md).
 *
 * A rule's body runs until the next `name ::=` or the end of the text, so
 * rules may span lines. Quantifiers become helper rules named after the rule
 * they occur in ("value_3"), which is what error messages about them name.
 */
#include "grammar_gbnf.h"

#include "error.h"

#include <stdio.h>
#include <string.h>

struct parser {
    const char *s;
    size_t len, pos;
    struct grammar_builder *b;
    char *err;
    const char *rule; /* the rule being defined */
    int depth;
};

static int fail(struct parser *p, const char *what)
{
    size_t line = 1, col = 1;
    for (size_t i = 0; i < p->pos && i < p->len; i++)
        if (p->s[i] == '\n')
            line++, col = 1;
        else
            col++;
    return error_set(p->err, ERR_FORMAT, "grammar: line %zu, column %zu: %s", line, col, what);
}

static int nomem(struct parser *p, int rc)
{
    if (rc == ERR_RANGE)
        return error_set(p->err, ERR_RANGE, "grammar: too large (more than %d rules or %d elements)",
                         GRAMMAR_RULES_MAX, GRAMMAR_ELEMS_MAX);
    return error_set(p->err, rc, "grammar: out of memory");
}

static void skip_space(struct parser *p)
{
    while (p->pos < p->len) {
        char c = p->s[p->pos];
        if (c == '#') {
            while (p->pos < p->len && p->s[p->pos] != '\n')
                p->pos++;
        } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
            p->pos++;
        } else {
            break;
        }
    }
}

static int is_name_char(char c, int first)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
           (!first && ((c >= '0' && c <= '9') || c == '-'));
}

static size_t name_len_at(const struct parser *p, size_t at)
{
    size_t n = 0;
    while (at + n < p->len && is_name_char(p->s[at + n], n == 0))
        n++;
    return n;
}

/* 1 when the text at pos is `name ::=` (a new rule begins). */
static int at_rule_start(const struct parser *p)
{
    size_t n = name_len_at(p, p->pos), i = p->pos + n;
    if (n == 0)
        return 0;
    while (i < p->len && (p->s[i] == ' ' || p->s[i] == '\t' || p->s[i] == '\n' || p->s[i] == '\r'))
        i++;
    return i + 3 <= p->len && memcmp(p->s + i, "::=", 3) == 0;
}

static int hex_val(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* One byte of a literal or class at pos (an escape or a plain byte). */
static int read_byte(struct parser *p, unsigned *out)
{
    if (p->pos >= p->len)
        return fail(p, "unexpected end of the grammar in a literal or class");
    char c = p->s[p->pos++];
    if (c != '\\') {
        *out = (uint8_t)c;
        return 0;
    }
    if (p->pos >= p->len)
        return fail(p, "unexpected end of the grammar after '\\'");
    c = p->s[p->pos++];
    switch (c) {
    case 'n': *out = '\n'; return 0;
    case 'r': *out = '\r'; return 0;
    case 't': *out = '\t'; return 0;
    case '\\': case '"': case '[': case ']': case '-': case '^': case '/': case '\'':
        *out = (uint8_t)c;
        return 0;
    case 'x': {
        int hi = p->pos + 1 < p->len ? hex_val(p->s[p->pos]) : -1;
        int lo = hi >= 0 ? hex_val(p->s[p->pos + 1]) : -1;
        if (lo < 0)
            return fail(p, "\\x takes two hexadecimal digits");
        p->pos += 2;
        *out = (unsigned)(hi * 16 + lo);
        return 0;
    }
    default:
        p->pos--;
        return fail(p, "unknown escape (use \\n \\r \\t \\\\ \\\" \\[ \\] \\- \\^ \\xHH)");
    }
}

static int parse_literal(struct parser *p, struct grammar_seq *out)
{
    p->pos++; /* the opening quote */
    while (p->pos < p->len && p->s[p->pos] != '"') {
        unsigned byte;
        int rc = read_byte(p, &byte);
        if (rc)
            return rc;
        uint8_t b8 = (uint8_t)byte;
        if ((rc = grammar_seq_literal(p->b, out, &b8, 1)))
            return nomem(p, rc);
    }
    if (p->pos >= p->len)
        return fail(p, "unterminated string literal");
    p->pos++;
    return 0;
}

/* Appends `class` (plus any UTF-8 character when `with_utf8`) to out. */
static int push_class(struct parser *p, const struct grammar_class *cls, int with_utf8,
                      struct grammar_seq *out)
{
    int32_t e, rule, utf8;
    int rc = grammar_builder_class(p->b, cls, &e);
    if (rc == 0 && !with_utf8)
        rc = grammar_seq_push(out, e);
    if (rc || !with_utf8)
        return rc ? nomem(p, rc) : 0;
    if ((rc = grammar_builder_utf8_multi(p->b, &utf8)) ||
        (rc = grammar_builder_rule_fresh(p->b, p->rule, &rule)) ||
        (rc = grammar_builder_alt1(p->b, rule, e)) ||
        (rc = grammar_builder_alt1(p->b, rule, GRAMMAR_ELEM(GRAMMAR_KIND_RULE, utf8))) ||
        (rc = grammar_seq_push(out, GRAMMAR_ELEM(GRAMMAR_KIND_RULE, rule))))
        return nomem(p, rc);
    return 0;
}

static int parse_class(struct parser *p, struct grammar_seq *out)
{
    struct grammar_class cls = {{0}};
    p->pos++; /* '[' */
    int negate = p->pos < p->len && p->s[p->pos] == '^';
    p->pos += (size_t)negate;
    while (p->pos < p->len && p->s[p->pos] != ']') {
        unsigned lo, hi;
        int raw = p->s[p->pos] != '\\';
        int rc = read_byte(p, &lo);
        if (rc)
            return rc;
        hi = lo;
        if (p->pos + 1 < p->len && p->s[p->pos] == '-' && p->s[p->pos + 1] != ']') {
            p->pos++;
            raw = raw || p->s[p->pos] != '\\';
            if ((rc = read_byte(p, &hi)))
                return rc;
            if (hi < lo)
                return fail(p, "class range with its end before its start");
        }
        if (raw && (lo >= 0x80 || hi >= 0x80))
            return fail(p, "a character class takes ASCII characters and \\xHH bytes; write a "
                           "non-ASCII character as a literal");
        if (negate && hi >= 0x80)
            return fail(p, "a negated class takes ASCII only (it always admits non-ASCII "
                           "characters)");
        grammar_class_add(&cls, lo, hi);
    }
    if (p->pos >= p->len)
        return fail(p, "unterminated character class");
    p->pos++;
    if (negate) {
        struct grammar_class inv = {{0}};
        for (unsigned x = 0; x < 0x80; x++)
            if (!grammar_class_has(&cls, x))
                grammar_class_add(&inv, x, x);
        return push_class(p, &inv, 1, out);
    }
    return push_class(p, &cls, 0, out);
}

static int parse_alts(struct parser *p, int32_t rule);

static int parse_group(struct parser *p, struct grammar_seq *out)
{
    if (++p->depth > GRAMMAR_GBNF_NESTING_MAX)
        return fail(p, "parentheses nested too deep");
    p->pos++; /* '(' */
    int32_t rule;
    int rc = grammar_builder_rule_fresh(p->b, p->rule, &rule);
    if (rc)
        return nomem(p, rc);
    if ((rc = parse_alts(p, rule)))
        return rc;
    skip_space(p);
    if (p->pos >= p->len || p->s[p->pos] != ')')
        return fail(p, "expected ')'");
    p->pos++;
    p->depth--;
    if ((rc = grammar_seq_push(out, GRAMMAR_ELEM(GRAMMAR_KIND_RULE, rule))))
        return nomem(p, rc);
    return 0;
}

static int parse_primary(struct parser *p, struct grammar_seq *out)
{
    char c = p->s[p->pos];
    if (c == '"')
        return parse_literal(p, out);
    if (c == '[')
        return parse_class(p, out);
    if (c == '(')
        return parse_group(p, out);
    if (c == '.') {
        struct grammar_class ascii = {{0}};
        p->pos++;
        grammar_class_add(&ascii, 0, 0x7F);
        return push_class(p, &ascii, 1, out);
    }
    size_t n = name_len_at(p, p->pos);
    if (n == 0)
        return fail(p, "expected a literal, a class, '(', '.' or a rule name");
    char name[128];
    if (n >= sizeof name)
        return fail(p, "rule name longer than 127 characters");
    memcpy(name, p->s + p->pos, n);
    name[n] = 0;
    p->pos += n;
    int32_t rule;
    int rc = grammar_builder_rule(p->b, name, &rule);
    if (rc == 0)
        rc = grammar_seq_push(out, GRAMMAR_ELEM(GRAMMAR_KIND_RULE, rule));
    return rc ? nomem(p, rc) : 0;
}

/* Reads {n}, {n,} or {n,m}; *max -1 for unbounded. */
static int parse_braces(struct parser *p, long *min, long *max)
{
    p->pos++;
    long v[2] = {-1, -1};
    int k = 0;
    for (;;) {
        skip_space(p);
        if (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') {
            v[k] = 0;
            while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') {
                v[k] = v[k] * 10 + (p->s[p->pos++] - '0');
                if (v[k] > GRAMMAR_GBNF_REPEAT_MAX)
                    return fail(p, "repetition count over 1000");
            }
            skip_space(p);
        }
        if (p->pos < p->len && p->s[p->pos] == ',' && k == 0) {
            p->pos++, k = 1;
            continue;
        }
        break;
    }
    if (p->pos >= p->len || p->s[p->pos] != '}' || v[0] < 0)
        return fail(p, "expected {n}, {n,} or {n,m}");
    p->pos++;
    *min = v[0];
    *max = k == 0 ? v[0] : v[1];
    if (*max >= 0 && *max < *min)
        return fail(p, "{n,m} with m less than n");
    return 0;
}

static int repeat(struct parser *p, const struct grammar_seq *sub, long min, long max,
                  struct grammar_seq *out)
{
    int rc = grammar_builder_repeat(p->b, p->rule, sub, min, max, out);
    return rc ? nomem(p, rc) : 0;
}

static int parse_item(struct parser *p, struct grammar_seq *out)
{
    struct grammar_seq sub = {0};
    int rc = parse_primary(p, &sub);
    long min = 1, max = 1;
    if (rc == 0 && p->pos < p->len) {
        char c = p->s[p->pos];
        if (c == '*' || c == '+' || c == '?') {
            p->pos++;
            min = c == '+' ? 1 : 0;
            max = c == '?' ? 1 : -1;
        } else if (c == '{') {
            rc = parse_braces(p, &min, &max);
        }
    }
    if (rc == 0)
        rc = repeat(p, &sub, min, max, out);
    grammar_seq_free(&sub);
    return rc;
}

static int parse_seq(struct parser *p, struct grammar_seq *out)
{
    for (;;) {
        skip_space(p);
        if (p->pos >= p->len || p->s[p->pos] == '|' || p->s[p->pos] == ')' || at_rule_start(p))
            return 0;
        int rc = parse_item(p, out);
        if (rc)
            return rc;
    }
}

static int parse_alts(struct parser *p, int32_t rule)
{
    for (;;) {
        struct grammar_seq seq = {0};
        int rc = parse_seq(p, &seq);
        if (rc == 0 && (rc = grammar_builder_alt(p->b, rule, &seq)))
            rc = nomem(p, rc);
        grammar_seq_free(&seq);
        if (rc)
            return rc;
        if (p->pos >= p->len || p->s[p->pos] != '|')
            return 0;
        p->pos++;
    }
}

static int parse_rule(struct parser *p)
{
    size_t n = name_len_at(p, p->pos);
    char name[128];
    if (n == 0)
        return fail(p, "expected a rule name");
    if (n >= sizeof name)
        return fail(p, "rule name longer than 127 characters");
    memcpy(name, p->s + p->pos, n);
    name[n] = 0;
    p->pos += n;
    skip_space(p);
    if (p->pos + 3 > p->len || memcmp(p->s + p->pos, "::=", 3) != 0) {
        char msg[200];
        snprintf(msg, sizeof msg, "expected '::=' after rule name '%s'", name);
        return fail(p, msg);
    }
    p->pos += 3;
    int32_t rule;
    int rc = grammar_builder_rule(p->b, name, &rule);
    if (rc)
        return nomem(p, rc);
    if (grammar_builder_rule_defined(p->b, rule)) {
        char msg[200];
        snprintf(msg, sizeof msg, "rule '%s' defined twice", name);
        return fail(p, msg);
    }
    p->rule = grammar_builder_rule_name(p->b, rule);
    p->depth = 0;
    if ((rc = parse_alts(p, rule)))
        return rc;
    if (p->pos < p->len && p->s[p->pos] == ')')
        return fail(p, "unbalanced ')'");
    return 0;
}

int grammar_gbnf_parse(const char *text, size_t len, struct grammar **out, char *err)
{
    if (len > GRAMMAR_GBNF_TEXT_MAX)
        return error_set(err, ERR_RANGE, "grammar: %zu bytes, more than %d", len,
                         GRAMMAR_GBNF_TEXT_MAX);
    struct parser p = {.s = text, .len = len, .err = err};
    int rc = grammar_builder_create(&p.b);
    if (rc)
        return error_set(err, rc, "grammar: out of memory");
    for (skip_space(&p); rc == 0 && p.pos < p.len; skip_space(&p))
        rc = parse_rule(&p);
    int32_t root = -1;
    if (rc == 0) {
        if ((rc = grammar_builder_rule(p.b, "root", &root)))
            rc = nomem(&p, rc);
        else if (!grammar_builder_rule_defined(p.b, root))
            rc = error_set(err, ERR_FORMAT, "grammar: no rule 'root' (the start rule)");
    }
    if (rc == 0)
        rc = grammar_builder_finish(p.b, root, out, err);
    grammar_builder_destroy(p.b);
    return rc;
}
