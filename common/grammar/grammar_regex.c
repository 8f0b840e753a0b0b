/* grammar_regex.c: see grammar_regex.h. A recursive-descent parser that
 * builds rules as it reads; each character set becomes a rule of the JSON
 * spellings of its characters. */
#include "grammar_regex.h"

#include "error.h"

#include <stdio.h>
#include <string.h>

struct rx {
    const char *s;
    size_t len, pos;
    struct grammar_builder *b;
    char *err;
    int depth;
    int end_anchor; /* the pattern ends with `$` (seen at the top level) */
};

/* A set of characters: ASCII members, and whether every non-ASCII one is in. */
struct charset {
    uint64_t ascii[2];
    int non_ascii;
};

static void cs_add(struct charset *cs, unsigned lo, unsigned hi)
{
    for (unsigned c = lo; c <= hi && c < 128; c++)
        cs->ascii[c >> 6] |= 1ull << (c & 63);
}

static int cs_has(const struct charset *cs, unsigned c)
{
    return (int)((cs->ascii[c >> 6] >> (c & 63)) & 1);
}

static int fail(struct rx *r, int code, const char *what)
{
    return error_set(r->err, code, "at %zu: %s", r->pos, what);
}

static int nomem(struct rx *r, int rc)
{
    return error_set(r->err, rc, rc == ERR_RANGE ? "the pattern makes too large a grammar"
                                                 : "out of memory");
}

/* The JSON spelling of control character c. */
static void control_escape(unsigned c, char out[8])
{
    static const char named[][3] = {{'\b', 'b'}, {'\f', 'f'}, {'\n', 'n'}, {'\r', 'r'}, {'\t', 't'}};
    for (size_t i = 0; i < sizeof named / sizeof *named; i++)
        if ((unsigned)named[i][0] == c) {
            snprintf(out, 8, "\\%c", named[i][1]);
            return;
        }
    snprintf(out, 8, "\\u%04x", c);
}

/* Appends a rule admitting every character of cs, spelled as JSON needs. */
static int emit_charset(struct rx *r, const struct charset *cs, struct grammar_seq *out)
{
    int32_t rule, e, utf8;
    struct grammar_class raw = {{0}};
    struct grammar_seq s = {0};
    int rc = grammar_builder_rule_fresh(r->b, "pattern", &rule), any_raw = 0;
    for (unsigned c = 0x20; c < 0x80 && rc == 0; c++)
        if (cs_has(cs, c) && c != '"' && c != '\\')
            grammar_class_add(&raw, c, c), any_raw = 1;
    if (rc == 0 && any_raw && (rc = grammar_builder_class(r->b, &raw, &e)) == 0)
        rc = grammar_builder_alt1(r->b, rule, e);
    unsigned specials[0x22];
    for (unsigned c = 0; c < 0x20; c++)
        specials[c] = c;
    specials[0x20] = '"';
    specials[0x21] = '\\';
    for (unsigned i = 0; i < 0x22 && rc == 0; i++) {
        unsigned c = specials[i];
        if (!cs_has(cs, c))
            continue;
        char esc[8];
        if (c < 0x20)
            control_escape(c, esc);
        else
            snprintf(esc, sizeof esc, "\\%c", c);
        s.n = 0;
        rc = grammar_seq_literal(r->b, &s, esc, strlen(esc));
        rc = rc ? rc : grammar_builder_alt(r->b, rule, &s);
    }
    if (rc == 0 && cs->non_ascii && (rc = grammar_builder_utf8_multi(r->b, &utf8)) == 0)
        rc = grammar_builder_alt1(r->b, rule, GRAMMAR_ELEM(GRAMMAR_KIND_RULE, utf8));
    grammar_seq_free(&s);
    if (rc)
        return nomem(r, rc);
    if (!grammar_builder_rule_defined(r->b, rule))
        return fail(r, ERR_INVALID_ARG, "a class that admits no character");
    return grammar_seq_push(out, GRAMMAR_ELEM(GRAMMAR_KIND_RULE, rule)) ? nomem(r, ERR_NOMEM) : 0;
}

/* \d \w \s and their negations; 0 when c is none of them. */
static int class_escape(unsigned c, struct charset *cs)
{
    struct charset k = {{0, 0}, 0};
    switch (c | 0x20) {
    case 'd': cs_add(&k, '0', '9'); break;
    case 'w':
        cs_add(&k, '0', '9');
        cs_add(&k, 'A', 'Z');
        cs_add(&k, 'a', 'z');
        cs_add(&k, '_', '_');
        break;
    case 's': cs_add(&k, '\t', '\r'), cs_add(&k, ' ', ' '); break;
    default: return 0;
    }
    if (c >= 'A' && c <= 'Z') { /* the ASCII complement: both dialects agree there */
        k.ascii[0] = ~k.ascii[0];
        k.ascii[1] = ~k.ascii[1];
    }
    cs->ascii[0] |= k.ascii[0];
    cs->ascii[1] |= k.ascii[1];
    return 1;
}

static int hex4(const char *p, size_t n, unsigned *out)
{
    *out = 0;
    for (size_t i = 0; i < n; i++) {
        char c = p[i], lower = (char)(c | 0x20);
        int v = -1;
        if (c >= '0' && c <= '9')
            v = c - '0';
        else if (lower >= 'a' && lower <= 'f')
            v = lower - 'a' + 10;
        if (v < 0)
            return -1;
        *out = *out * 16 + (unsigned)v;
    }
    return 0;
}

/* One character of a class or an escape outside one, at r->pos (after the
 * backslash when `escaped`): its code (ASCII), or a class into cs (*code
 * -1). Non-ASCII in a class is refused. */
static int class_char(struct rx *r, int in_class, unsigned *code, struct charset *cs)
{
    unsigned char c = (unsigned char)r->s[r->pos];
    if (c != '\\') {
        if (c >= 0x80)
            return fail(r, ERR_UNSUPPORTED, "a non-ASCII character inside a class");
        r->pos++;
        *code = c;
        return 0;
    }
    if (++r->pos >= r->len)
        return fail(r, ERR_INVALID_ARG, "a pattern ending with '\\'");
    c = (unsigned char)r->s[r->pos++];
    *code = (unsigned)-1;
    if (class_escape(c, cs)) {
        if (in_class && c >= 'A' && c <= 'Z')
            return fail(r, ERR_UNSUPPORTED, "\\D, \\W or \\S inside a class");
        return 0;
    }
    static const char controls[][2] = {{'n', '\n'}, {'r', '\r'}, {'t', '\t'}, {'f', '\f'}, {'v', '\v'}};
    for (size_t i = 0; i < sizeof controls / sizeof *controls; i++)
        if (c == (unsigned char)controls[i][0]) {
            *code = (unsigned char)controls[i][1];
            return 0;
        }
    if ((c == 'x' || c == 'u') && r->pos + (c == 'x' ? 2 : 4) <= r->len &&
        hex4(r->s + r->pos, c == 'x' ? 2 : 4, code) == 0) {
        r->pos += c == 'x' ? 2 : 4;
        if (*code >= 0x80)
            return fail(r, ERR_UNSUPPORTED, "a \\x or \\u escape of a non-ASCII character");
        return 0;
    }
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
        return fail(r, ERR_UNSUPPORTED,
                    "this escape (backreference, \\b, \\p, ...) is not supported");
    *code = c; /* escaped punctuation */
    return 0;
}

static int parse_class(struct rx *r, struct grammar_seq *out)
{
    struct charset cs = {{0, 0}, 0};
    int negate = ++r->pos < r->len && r->s[r->pos] == '^';
    r->pos += (size_t)negate;
    if (r->pos < r->len && r->s[r->pos] == ']')
        return fail(r, ERR_UNSUPPORTED, "a class starting with ']' (escape it)");
    while (r->pos < r->len && r->s[r->pos] != ']') {
        unsigned lo, hi;
        int rc = class_char(r, 1, &lo, &cs);
        if (rc)
            return rc;
        if (lo == (unsigned)-1)
            continue;
        hi = lo;
        if (r->pos + 1 < r->len && r->s[r->pos] == '-' && r->s[r->pos + 1] != ']') {
            r->pos++;
            struct charset none = {{0, 0}, 0};
            if ((rc = class_char(r, 1, &hi, &none)))
                return rc;
            if (hi == (unsigned)-1 || hi < lo)
                return fail(r, ERR_INVALID_ARG, "a bad class range");
        }
        cs_add(&cs, lo, hi);
    }
    if (r->pos >= r->len)
        return fail(r, ERR_INVALID_ARG, "an unterminated class");
    r->pos++;
    if (negate) {
        cs.ascii[0] = ~cs.ascii[0];
        cs.ascii[1] = ~cs.ascii[1];
        cs.non_ascii = 1;
    }
    return emit_charset(r, &cs, out);
}

static int parse_alts(struct rx *r, int32_t rule);

static int parse_group(struct rx *r, struct grammar_seq *out)
{
    r->pos++;
    if (r->pos < r->len && r->s[r->pos] == '?') {
        if (r->pos + 1 < r->len && r->s[r->pos + 1] == ':')
            r->pos += 2;
        else
            return fail(r, ERR_UNSUPPORTED, "lookaround, named groups and flags are not supported");
    }
    if (++r->depth > GRAMMAR_REGEX_NESTING_MAX)
        return fail(r, ERR_UNSUPPORTED, "groups nested too deep");
    int32_t rule;
    int rc = grammar_builder_rule_fresh(r->b, "pattern", &rule);
    if (rc)
        return nomem(r, rc);
    if ((rc = parse_alts(r, rule)))
        return rc;
    if (r->pos >= r->len || r->s[r->pos] != ')')
        return fail(r, ERR_INVALID_ARG, "a missing ')'");
    r->pos++;
    r->depth--;
    return grammar_seq_push(out, GRAMMAR_ELEM(GRAMMAR_KIND_RULE, rule)) ? nomem(r, ERR_NOMEM) : 0;
}

/* A literal non-ASCII character, copied as its UTF-8 bytes. */
static int parse_utf8_literal(struct rx *r, struct grammar_seq *out)
{
    unsigned char c = (unsigned char)r->s[r->pos];
    size_t n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    if (n == 1 || r->pos + n > r->len)
        return fail(r, ERR_INVALID_ARG, "invalid UTF-8");
    int rc = grammar_seq_literal(r->b, out, r->s + r->pos, n);
    r->pos += n;
    return rc ? nomem(r, rc) : 0;
}

static int parse_atom(struct rx *r, struct grammar_seq *out)
{
    unsigned char c = (unsigned char)r->s[r->pos];
    struct charset cs = {{0, 0}, 0};
    unsigned code;
    switch (c) {
    case '(':
        return parse_group(r, out);
    case '[':
        return parse_class(r, out);
    case '.':
        r->pos++;
        cs_add(&cs, 0, 0x7F);
        cs.ascii[0] &= ~(1ull << '\n');
        cs.non_ascii = 1;
        return emit_charset(r, &cs, out);
    case '^':
    case '$':
        return fail(r, ERR_UNSUPPORTED, "'^' and '$' only at the start and the end");
    case '*':
    case '+':
    case '?':
    case '{':
        return fail(r, ERR_INVALID_ARG, "nothing to repeat");
    default:
        break;
    }
    if (c >= 0x80)
        return parse_utf8_literal(r, out);
    int rc = class_char(r, 0, &code, &cs);
    if (rc)
        return rc;
    if (code != (unsigned)-1)
        cs_add(&cs, code, code);
    return emit_charset(r, &cs, out);
}

/* {n}, {n,}, {n,m} at r->pos; max -1 unbounded. */
static int parse_braces(struct rx *r, long *min, long *max)
{
    long v[2] = {-1, -1};
    int k = 0;
    for (r->pos++; r->pos < r->len; r->pos++) {
        char c = r->s[r->pos];
        if (c >= '0' && c <= '9') {
            v[k] = (v[k] < 0 ? 0 : v[k]) * 10 + (c - '0');
            if (v[k] > 1000)
                return fail(r, ERR_UNSUPPORTED, "repetition counts over 1000");
        } else if (c == ',' && k == 0) {
            k = 1;
        } else {
            break;
        }
    }
    if (r->pos >= r->len || r->s[r->pos] != '}' || v[0] < 0)
        return fail(r, ERR_UNSUPPORTED, "a '{' that is not a quantifier (escape it)");
    r->pos++;
    *min = v[0];
    *max = k == 0 ? v[0] : v[1];
    if (*max >= 0 && *max < *min)
        return fail(r, ERR_INVALID_ARG, "{n,m} with m less than n");
    return 0;
}

static int parse_item(struct rx *r, struct grammar_seq *out)
{
    struct grammar_seq sub = {0};
    long min = 1, max = 1;
    int rc = parse_atom(r, &sub);
    if (rc == 0 && r->pos < r->len) {
        char c = r->s[r->pos];
        if (c == '*' || c == '+' || c == '?') {
            r->pos++;
            min = c == '+';
            max = c == '?' ? 1 : -1;
        } else if (c == '{') {
            rc = parse_braces(r, &min, &max);
        }
        if (rc == 0 && (min != 1 || max != 1) && r->pos < r->len && r->s[r->pos] == '?')
            r->pos++; /* lazy: the same strings match */
        if (rc == 0 && r->pos < r->len && strchr("*+?{", r->s[r->pos]) && (min != 1 || max != 1))
            rc = fail(r, ERR_INVALID_ARG, "nothing to repeat");
    }
    if (rc == 0 && (rc = grammar_builder_repeat(r->b, "pattern", &sub, min, max, out)))
        rc = nomem(r, rc);
    grammar_seq_free(&sub);
    return rc;
}

static int parse_seq(struct rx *r, struct grammar_seq *out)
{
    while (r->pos < r->len && r->s[r->pos] != '|' && r->s[r->pos] != ')') {
        if (r->s[r->pos] == '$' && r->pos + 1 == r->len && r->depth == 0) {
            r->pos++;
            r->end_anchor = 1;
            return 0;
        }
        int rc = parse_item(r, out);
        if (rc)
            return rc;
    }
    return 0;
}

static int parse_alts(struct rx *r, int32_t rule)
{
    for (;;) {
        struct grammar_seq seq = {0};
        int rc = parse_seq(r, &seq);
        if (rc == 0 && (rc = grammar_builder_alt(r->b, rule, &seq)))
            rc = nomem(r, rc);
        grammar_seq_free(&seq);
        if (rc)
            return rc;
        if (r->pos >= r->len || r->s[r->pos] != '|')
            return 0;
        if (r->end_anchor)
            return fail(r, ERR_UNSUPPORTED, "'$' before a '|': anchor a group instead, ^(a|b)$");
        r->pos++;
    }
}

int grammar_regex_compile(struct grammar_builder *b, const char *pattern, int32_t any_char,
                          int32_t *rule_out, char *err)
{
    struct rx r = {.s = pattern, .len = strlen(pattern), .b = b, .err = err};
    int start_anchor = r.len > 0 && pattern[0] == '^';
    r.pos = (size_t)start_anchor;
    int32_t core, rule;
    int rc = grammar_builder_rule_fresh(b, "pattern", &core);
    if (rc)
        return nomem(&r, rc);
    if ((rc = parse_alts(&r, core)))
        return rc;
    if (r.pos < r.len)
        return fail(&r, ERR_INVALID_ARG, "an unmatched ')'");
    if ((start_anchor || r.end_anchor) && grammar_builder_alt_count(b, core) > 1)
        return error_set(err, ERR_UNSUPPORTED,
                         "'^' or '$' beside a top-level '|': anchor a group instead, ^(a|b)$");
    /* a search: what the anchors leave open takes any characters */
    struct grammar_seq any = {0}, s = {0};
    rc = grammar_seq_push(&any, GRAMMAR_ELEM(GRAMMAR_KIND_RULE, any_char));
    rc = rc ? rc : grammar_builder_rule_fresh(b, "pattern", &rule);
    rc = rc || start_anchor ? rc : grammar_builder_repeat(b, "pattern", &any, 0, -1, &s);
    rc = rc ? rc : grammar_seq_push(&s, GRAMMAR_ELEM(GRAMMAR_KIND_RULE, core));
    rc = rc || r.end_anchor ? rc : grammar_builder_repeat(b, "pattern", &any, 0, -1, &s);
    rc = rc ? rc : grammar_builder_alt(b, rule, &s);
    grammar_seq_free(&any);
    grammar_seq_free(&s);
    if (rc)
        return nomem(&r, rc);
    *rule_out = rule;
    return 0;
}
