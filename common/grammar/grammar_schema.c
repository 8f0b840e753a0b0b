/* grammar_schema.c: JSON schema -> grammar.
 *
 * One rule per schema node; the JSON building blocks (whitespace, string,
 * number, any value) are shared rules named in angle brackets ("<string>"),
 * names no schema can produce. Objects with listed properties emit them in
 * the listed order, each optional one omissible; the comma bookkeeping uses
 * two rules per property: A_i "from property i, nothing written yet" and
 * B_i "from property i, something written", so the grammar is linear in the
 * number of properties.
 */
#include "grammar_schema.h"

#include "error.h"
#include "grammar_regex.h"
#include "json_check.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ref_memo {
    char *ref;
    int32_t rule;
};

struct compiler {
    struct grammar_builder *b;
    const cJSON *root;
    char *err;
    char path[512];
    size_t path_len;
    int depth;
    struct ref_memo *refs;
    size_t n_refs, cap_refs;
};

static const char *const annotations[] = {"title", "description", "default", "examples",
                                          "$schema", "$id", "$comment", "deprecated",
                                          "readOnly", "writeOnly", "$defs", "definitions"};
static const char *const structural[] = {"type", "properties", "required", "additionalProperties",
                                         "items", "minItems", "maxItems", "minLength",
                                         "maxLength", "pattern", "enum", "const", "anyOf",
                                         "$ref"};

static int in_list(const char *key, const char *const *list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(key, list[i]) == 0)
            return 1;
    return 0;
}
#define IN_LIST(key, list) in_list(key, list, sizeof list / sizeof *list)

static size_t path_push(struct compiler *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static size_t path_push(struct compiler *c, const char *fmt, ...)
{
    size_t old = c->path_len;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(c->path + old, sizeof c->path - old, fmt, ap);
    va_end(ap);
    if (n > 0)
        c->path_len = old + (size_t)n < sizeof c->path ? old + (size_t)n : sizeof c->path - 1;
    return old;
}

static void path_pop(struct compiler *c, size_t old)
{
    c->path_len = old;
    c->path[old] = 0;
}

static int bad(struct compiler *c, int code, const char *what)
{
    return error_set(c->err, code, "%s: %s", c->path, what);
}

static int nomem(struct compiler *c, int rc)
{
    if (rc == ERR_RANGE)
        return error_set(c->err, ERR_RANGE, "%s: the schema makes too large a grammar", c->path);
    return error_set(c->err, rc, "%s: out of memory", c->path);
}

static int32_t rule_elem(int32_t rule)
{
    return GRAMMAR_ELEM(GRAMMAR_KIND_RULE, rule);
}

static int lit(struct compiler *c, struct grammar_seq *s, const char *text)
{
    return grammar_seq_literal(c->b, s, text, strlen(text));
}

static int cls(struct compiler *c, struct grammar_seq *s, const char *ranges)
{
    /* ranges: pairs of bytes "az09" = [a-z0-9] */
    struct grammar_class k = {{0}};
    for (size_t i = 0; ranges[i] && ranges[i + 1]; i += 2)
        grammar_class_add(&k, (uint8_t)ranges[i], (uint8_t)ranges[i + 1]);
    int32_t e;
    int rc = grammar_builder_class(c->b, &k, &e);
    return rc ? rc : grammar_seq_push(s, e);
}

/* Adds s as an alternative of rule and empties s. */
static int alt(struct compiler *c, int32_t rule, struct grammar_seq *s)
{
    int rc = grammar_builder_alt(c->b, rule, s);
    s->n = 0;
    return rc;
}

static int repeat(struct compiler *c, const struct grammar_seq *sub, long min, long max,
                  struct grammar_seq *out)
{
    return grammar_builder_repeat(c->b, "rep", sub, min, max, out);
}

/* The shared rule `name`, defined by `define` on first use. */
static int shared(struct compiler *c, const char *name,
                  int (*define)(struct compiler *c, int32_t rule), int32_t *rule)
{
    int rc = grammar_builder_rule(c->b, name, rule);
    if (rc || grammar_builder_rule_defined(c->b, *rule))
        return rc;
    return define(c, *rule);
}

static int define_ws(struct compiler *c, int32_t rule)
{
    struct grammar_seq one = {0}, s = {0};
    int rc = cls(c, &one, "  \t\t\n\n");
    if (rc == 0)
        rc = repeat(c, &one, 0, GRAMMAR_SCHEMA_WS_MAX, &s);
    if (rc == 0)
        rc = alt(c, rule, &s);
    grammar_seq_free(&one);
    grammar_seq_free(&s);
    return rc;
}

static int ws(struct compiler *c, struct grammar_seq *s)
{
    int32_t r;
    int rc = shared(c, "<ws>", define_ws, &r);
    return rc ? rc : grammar_seq_push(s, rule_elem(r));
}

static int define_char(struct compiler *c, int32_t rule)
{
    struct grammar_seq s = {0};
    int32_t utf8;
    int rc = cls(c, &s, "  !!#[]\x7f");
    rc = rc ? rc : alt(c, rule, &s);
    rc = rc ? rc : lit(c, &s, "\\");
    rc = rc ? rc : cls(c, &s, "\"\"\\\\//bbffnnrrtt");
    rc = rc ? rc : alt(c, rule, &s);
    /* \uXXXX except surrogates (D800-DFFF), so a character is one code point */
    rc = rc ? rc : lit(c, &s, "\\u");
    rc = rc ? rc : cls(c, &s, "09acACefEF");
    for (int i = 0; i < 3 && rc == 0; i++)
        rc = cls(c, &s, "09afAF");
    rc = rc ? rc : alt(c, rule, &s);
    rc = rc ? rc : lit(c, &s, "\\u");
    rc = rc ? rc : cls(c, &s, "ddDD");
    rc = rc ? rc : cls(c, &s, "07");
    for (int i = 0; i < 2 && rc == 0; i++)
        rc = cls(c, &s, "09afAF");
    rc = rc ? rc : alt(c, rule, &s);
    rc = rc ? rc : grammar_builder_utf8_multi(c->b, &utf8);
    rc = rc ? rc : grammar_seq_push(&s, rule_elem(utf8));
    rc = rc ? rc : alt(c, rule, &s);
    grammar_seq_free(&s);
    return rc;
}

/* A string of min..max characters (max -1: unbounded) appended to s. */
static int string_of(struct compiler *c, long min, long max, struct grammar_seq *s)
{
    int32_t ch;
    struct grammar_seq one = {0};
    int rc = shared(c, "<char>", define_char, &ch);
    rc = rc ? rc : grammar_seq_push(&one, rule_elem(ch));
    rc = rc ? rc : lit(c, s, "\"");
    rc = rc ? rc : repeat(c, &one, min, max, s);
    rc = rc ? rc : lit(c, s, "\"");
    grammar_seq_free(&one);
    return rc;
}

static int define_string(struct compiler *c, int32_t rule)
{
    struct grammar_seq s = {0};
    int rc = string_of(c, 0, -1, &s);
    rc = rc ? rc : alt(c, rule, &s);
    grammar_seq_free(&s);
    return rc;
}

/* digits: first class then up to n_more of [0-9]. */
static int digits(struct compiler *c, const char *first, long min_more, long n_more,
                  struct grammar_seq *s)
{
    struct grammar_seq d = {0};
    int rc = first ? cls(c, s, first) : 0;
    rc = rc ? rc : cls(c, &d, "09");
    rc = rc ? rc : repeat(c, &d, min_more, n_more, s);
    grammar_seq_free(&d);
    return rc;
}

static int define_integer(struct compiler *c, int32_t rule)
{
    struct grammar_seq s = {0};
    int rc = 0;
    for (int neg = 0; neg < 2 && rc == 0; neg++) {
        rc = neg ? lit(c, &s, "-") : 0;
        rc = rc ? rc : lit(c, &s, "0");
        rc = rc ? rc : alt(c, rule, &s);
        rc = rc ? rc : (neg ? lit(c, &s, "-") : 0);
        rc = rc ? rc : digits(c, "19", 0, 15, &s);
        rc = rc ? rc : alt(c, rule, &s);
    }
    grammar_seq_free(&s);
    return rc;
}

static int define_number(struct compiler *c, int32_t rule)
{
    int32_t integer, frac, exp;
    struct grammar_seq s = {0}, sub = {0};
    int rc = shared(c, "<integer>", define_integer, &integer);
    rc = rc ? rc : grammar_builder_rule(c->b, "<frac>", &frac);
    rc = rc ? rc : lit(c, &s, ".");
    rc = rc ? rc : digits(c, NULL, 1, 16, &s);
    rc = rc ? rc : alt(c, frac, &s);
    rc = rc ? rc : grammar_builder_rule(c->b, "<exp>", &exp);
    rc = rc ? rc : cls(c, &s, "eeEE");
    rc = rc ? rc : cls(c, &sub, "++--");
    rc = rc ? rc : repeat(c, &sub, 0, 1, &s);
    rc = rc ? rc : digits(c, NULL, 1, 3, &s);
    rc = rc ? rc : alt(c, exp, &s);
    /* number ::= integer frac? exp? */
    rc = rc ? rc : grammar_seq_push(&s, rule_elem(integer));
    sub.n = 0;
    rc = rc ? rc : grammar_seq_push(&sub, rule_elem(frac));
    rc = rc ? rc : repeat(c, &sub, 0, 1, &s);
    sub.n = 0;
    rc = rc ? rc : grammar_seq_push(&sub, rule_elem(exp));
    rc = rc ? rc : repeat(c, &sub, 0, 1, &s);
    rc = rc ? rc : alt(c, rule, &s);
    grammar_seq_free(&s);
    grammar_seq_free(&sub);
    return rc;
}

static int define_value(struct compiler *c, int32_t rule);

/* "[" ws (item ws ("," ws item ws){min-1,max-1})? "]" with item = rule `item`. */
static int array_of(struct compiler *c, int32_t item, long min, long max, struct grammar_seq *s)
{
    struct grammar_seq first = {0}, rest = {0}, body = {0};
    int rc = lit(c, s, "[");
    rc = rc ? rc : ws(c, s);
    if (max != 0) {
        rc = rc ? rc : grammar_seq_push(&first, rule_elem(item));
        rc = rc ? rc : ws(c, &first);
        rc = rc ? rc : lit(c, &rest, ",");
        rc = rc ? rc : ws(c, &rest);
        rc = rc ? rc : grammar_seq_push(&rest, rule_elem(item));
        rc = rc ? rc : ws(c, &rest);
        for (size_t i = 0; i < first.n && rc == 0; i++)
            rc = grammar_seq_push(&body, first.elems[i]);
        rc = rc ? rc : repeat(c, &rest, min > 0 ? min - 1 : 0, max < 0 ? -1 : max - 1, &body);
        rc = rc ? rc : repeat(c, &body, min > 0 ? 1 : 0, 1, s);
    }
    rc = rc ? rc : lit(c, s, "]");
    grammar_seq_free(&first);
    grammar_seq_free(&rest);
    grammar_seq_free(&body);
    return rc;
}

static int define_array(struct compiler *c, int32_t rule)
{
    int32_t value;
    struct grammar_seq s = {0};
    int rc = grammar_builder_rule(c->b, "<value>", &value);
    rc = rc ? rc : array_of(c, value, 0, -1, &s);
    rc = rc ? rc : alt(c, rule, &s);
    grammar_seq_free(&s);
    /* defined after this rule has its alternative: the definitions recurse */
    return rc ? rc : shared(c, "<value>", define_value, &value);
}

static int define_object(struct compiler *c, int32_t rule)
{
    int32_t str, value, kv;
    struct grammar_seq s = {0}, rest = {0}, body = {0};
    int rc = shared(c, "<string>", define_string, &str);
    rc = rc ? rc : grammar_builder_rule(c->b, "<value>", &value);
    rc = rc ? rc : grammar_builder_rule(c->b, "<member>", &kv);
    rc = rc ? rc : grammar_seq_push(&s, rule_elem(str));
    rc = rc ? rc : ws(c, &s);
    rc = rc ? rc : lit(c, &s, ":");
    rc = rc ? rc : ws(c, &s);
    rc = rc ? rc : grammar_seq_push(&s, rule_elem(value));
    rc = rc ? rc : ws(c, &s);
    rc = rc ? rc : alt(c, kv, &s);
    rc = rc ? rc : lit(c, &rest, ",");
    rc = rc ? rc : ws(c, &rest);
    rc = rc ? rc : grammar_seq_push(&rest, rule_elem(kv));
    rc = rc ? rc : grammar_seq_push(&body, rule_elem(kv));
    rc = rc ? rc : repeat(c, &rest, 0, -1, &body);
    rc = rc ? rc : lit(c, &s, "{");
    rc = rc ? rc : ws(c, &s);
    rc = rc ? rc : repeat(c, &body, 0, 1, &s);
    rc = rc ? rc : lit(c, &s, "}");
    rc = rc ? rc : alt(c, rule, &s);
    grammar_seq_free(&s);
    grammar_seq_free(&rest);
    grammar_seq_free(&body);
    return rc ? rc : shared(c, "<value>", define_value, &value);
}

static int define_value(struct compiler *c, int32_t rule)
{
    static const char *const names[] = {"<object>", "<array>", "<string>", "<number>"};
    int (*const defines[])(struct compiler *, int32_t) = {define_object, define_array,
                                                            define_string, define_number};
    struct grammar_seq s = {0};
    int rc = 0;
    /* an alternative per kind, the kinds defined after: object and array
     * refer back to <value>, which then has its alternatives */
    int32_t r;
    for (int i = 0; i < 4 && rc == 0; i++) {
        rc = grammar_builder_rule(c->b, names[i], &r);
        rc = rc ? rc : grammar_seq_push(&s, rule_elem(r));
        rc = rc ? rc : alt(c, rule, &s);
    }
    static const char *const words[] = {"true", "false", "null"};
    for (int i = 0; i < 3 && rc == 0; i++) {
        rc = lit(c, &s, words[i]);
        rc = rc ? rc : alt(c, rule, &s);
    }
    grammar_seq_free(&s);
    for (int i = 0; i < 4 && rc == 0; i++)
        rc = shared(c, names[i], defines[i], &r);
    return rc;
}

static int compile(struct compiler *c, const cJSON *node, int32_t *rule);

/* The JSON text of a string (its key or value form), appended as a literal. */
static int json_string_lit(struct compiler *c, const char *str, struct grammar_seq *s)
{
    int rc = lit(c, s, "\"");
    for (const char *p = str; *p && rc == 0; p++) {
        char esc[8];
        uint8_t ch = (uint8_t)*p;
        if (ch == '"' || ch == '\\')
            snprintf(esc, sizeof esc, "\\%c", ch);
        else if (ch < 0x20)
            snprintf(esc, sizeof esc, "\\u%04x", ch);
        else
            esc[0] = (char)ch, esc[1] = 0;
        rc = lit(c, s, esc);
    }
    return rc ? rc : lit(c, s, "\"");
}

/* minItems and the like: a non-negative integer up to COUNT_MAX, or dflt. */
static int get_count(struct compiler *c, const cJSON *node, const char *key, long dflt, long *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(node, key);
    *out = dflt;
    if (!v)
        return 0;
    size_t old = path_push(c, ".%s", key);
    int rc = 0;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble != floor(v->valuedouble))
        rc = bad(c, ERR_INVALID_ARG, "must be a non-negative integer");
    else if (v->valuedouble > GRAMMAR_SCHEMA_COUNT_MAX)
        rc = bad(c, ERR_UNSUPPORTED, "values over 1000 are not supported");
    else
        *out = (long)v->valuedouble;
    path_pop(c, old);
    return rc;
}

static int new_rule(struct compiler *c, const char *base, int32_t *rule)
{
    int rc = grammar_builder_rule_fresh(c->b, base, rule);
    return rc ? nomem(c, rc) : 0;
}

/* "pattern": a string whose contents the regular expression finds a match in
 * (grammar_regex.h). */
static int compile_pattern(struct compiler *c, const cJSON *node, const cJSON *pattern,
                           int32_t rule)
{
    size_t old = path_push(c, ".pattern");
    int rc = 0;
    if (!cJSON_IsString(pattern))
        rc = bad(c, ERR_INVALID_ARG, "must be a string");
    else if (cJSON_GetObjectItemCaseSensitive(node, "minLength") ||
             cJSON_GetObjectItemCaseSensitive(node, "maxLength"))
        rc = bad(c, ERR_UNSUPPORTED, "pattern beside minLength or maxLength is not supported");
    int32_t ch, body;
    char why[ERR_MSG_MAX];
    int named = 1; /* whether err already says what failed */
    if (rc == 0 && (rc = shared(c, "<char>", define_char, &ch)))
        named = 0;
    if (rc == 0 && (rc = grammar_regex_compile(c->b, pattern->valuestring, ch, &body, why)))
        rc = error_set(c->err, rc, "%s: %.300s", c->path, why);
    if (rc && !named)
        rc = nomem(c, rc);
    path_pop(c, old);
    if (rc)
        return rc;
    struct grammar_seq s = {0};
    rc = lit(c, &s, "\"");
    rc = rc ? rc : grammar_seq_push(&s, rule_elem(body));
    rc = rc ? rc : lit(c, &s, "\"");
    rc = rc ? rc : alt(c, rule, &s);
    grammar_seq_free(&s);
    return rc ? nomem(c, rc) : 0;
}

static int compile_string(struct compiler *c, const cJSON *node, int32_t rule)
{
    const cJSON *pattern = cJSON_GetObjectItemCaseSensitive(node, "pattern");
    if (pattern)
        return compile_pattern(c, node, pattern, rule);
    long min, max;
    int rc = get_count(c, node, "minLength", 0, &min);
    rc = rc ? rc : get_count(c, node, "maxLength", -1, &max);
    if (rc)
        return rc;
    if (max >= 0 && max < min)
        return bad(c, ERR_INVALID_ARG, "maxLength is less than minLength");
    struct grammar_seq s = {0};
    rc = string_of(c, min, max, &s);
    rc = rc ? rc : alt(c, rule, &s);
    grammar_seq_free(&s);
    return rc ? nomem(c, rc) : 0;
}

static int compile_array(struct compiler *c, const cJSON *node, int32_t rule)
{
    long min, max;
    int rc = get_count(c, node, "minItems", 0, &min);
    rc = rc ? rc : get_count(c, node, "maxItems", -1, &max);
    if (rc)
        return rc;
    if (max >= 0 && max < min)
        return bad(c, ERR_INVALID_ARG, "maxItems is less than minItems");
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(node, "items");
    int32_t item;
    size_t old = path_push(c, ".items");
    if (cJSON_IsArray(items))
        rc = bad(c, ERR_UNSUPPORTED, "the tuple form (an array of schemas) is not supported");
    else if (items)
        rc = compile(c, items, &item);
    else
        rc = nomem(c, shared(c, "<value>", define_value, &item));
    path_pop(c, old);
    if (rc)
        return rc;
    struct grammar_seq s = {0};
    rc = array_of(c, item, min, max, &s);
    rc = rc ? rc : alt(c, rule, &s);
    grammar_seq_free(&s);
    return rc ? nomem(c, rc) : 0;
}

/* kv_i ::= "name" ws ":" ws value ws, appended to s. */
static int member(struct compiler *c, const cJSON *prop, struct grammar_seq *s)
{
    int32_t value;
    size_t old = path_push(c, ".properties.%s", prop->string);
    int rc = compile(c, prop, &value);
    path_pop(c, old);
    if (rc)
        return rc;
    rc = json_string_lit(c, prop->string, s);
    rc = rc ? rc : ws(c, s);
    rc = rc ? rc : lit(c, s, ":");
    rc = rc ? rc : ws(c, s);
    rc = rc ? rc : grammar_seq_push(s, rule_elem(value));
    rc = rc ? rc : ws(c, s);
    return rc ? nomem(c, rc) : 0;
}

static int check_required(struct compiler *c, const cJSON *props, const cJSON *required)
{
    if (!required)
        return 0;
    size_t old = path_push(c, ".required");
    int rc = cJSON_IsArray(required) ? 0 : bad(c, ERR_INVALID_ARG, "must be an array of names");
    const cJSON *r;
    cJSON_ArrayForEach(r, required)
    {
        if (rc)
            break;
        if (!cJSON_IsString(r))
            rc = bad(c, ERR_INVALID_ARG, "must be an array of names");
        else if (!cJSON_GetObjectItemCaseSensitive(props, r->valuestring))
            rc = error_set(c->err, ERR_INVALID_ARG,
                           "%s: '%.100s' is not in properties (no other property can be written)",
                           c->path, r->valuestring);
    }
    path_pop(c, old);
    return rc;
}

static int is_required(const cJSON *required, const char *name)
{
    const cJSON *r;
    cJSON_ArrayForEach(r, required)
    {
        if (cJSON_IsString(r) && strcmp(r->valuestring, name) == 0)
            return 1;
    }
    return 0;
}

/* The A_i / B_i chain over the listed properties (see the file comment);
 * *first is A_0. */
static int members_chain(struct compiler *c, const cJSON *props, const cJSON *required,
                         int32_t *first)
{
    int n = cJSON_GetArraySize(props), rc = 0;
    int32_t a_next, b_next, a, b;
    struct grammar_seq s = {0};
    if ((rc = new_rule(c, "props", &a_next)) || (rc = new_rule(c, "props", &b_next)))
        return rc;
    rc = nomem(c, alt(c, a_next, &s));
    rc = rc ? rc : nomem(c, alt(c, b_next, &s));
    for (int i = n - 1; i >= 0 && rc == 0; i--) {
        const cJSON *prop = cJSON_GetArrayItem(props, i);
        int req = is_required(required, prop->string);
        if ((rc = new_rule(c, "props", &a)) || (rc = new_rule(c, "props", &b)))
            break;
        struct grammar_seq kv = {0};
        if ((rc = member(c, prop, &kv))) {
            grammar_seq_free(&kv);
            break;
        }
        for (int with_comma = 0; with_comma < 2 && rc == 0; with_comma++) {
            rc = with_comma ? lit(c, &s, ",") : 0;
            rc = rc ? rc : (with_comma ? ws(c, &s) : 0);
            for (size_t k = 0; k < kv.n && rc == 0; k++)
                rc = grammar_seq_push(&s, kv.elems[k]);
            rc = rc ? rc : grammar_seq_push(&s, rule_elem(b_next));
            rc = rc ? rc : alt(c, with_comma ? b : a, &s);
            if (rc == 0 && !req) { /* skipped: on to the next with the same "written" */
                rc = grammar_seq_push(&s, rule_elem(with_comma ? b_next : a_next));
                rc = rc ? rc : alt(c, with_comma ? b : a, &s);
            }
        }
        if (rc)
            rc = nomem(c, rc);
        grammar_seq_free(&kv);
        a_next = a, b_next = b;
    }
    grammar_seq_free(&s);
    *first = a_next;
    return rc;
}

static int compile_object(struct compiler *c, const cJSON *node, int32_t rule)
{
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(node, "properties");
    const cJSON *required = cJSON_GetObjectItemCaseSensitive(node, "required");
    const cJSON *extra = cJSON_GetObjectItemCaseSensitive(node, "additionalProperties");
    if (extra && !cJSON_IsFalse(extra)) {
        size_t old = path_push(c, ".additionalProperties");
        int rc = bad(c, ERR_UNSUPPORTED, "only false is supported (or leave it out)");
        path_pop(c, old);
        return rc;
    }
    if (props && !cJSON_IsObject(props)) {
        size_t old = path_push(c, ".properties");
        int rc = bad(c, ERR_INVALID_ARG, "must be an object of schemas");
        path_pop(c, old);
        return rc;
    }
    int rc = check_required(c, props, required);
    if (rc)
        return rc;
    struct grammar_seq s = {0};
    if (!props && !extra) { /* any object */
        int32_t any;
        rc = shared(c, "<object>", define_object, &any);
        rc = rc ? rc : grammar_seq_push(&s, rule_elem(any));
    } else {
        int32_t first = -1;
        rc = props ? members_chain(c, props, required, &first) : 0;
        if (rc) {
            grammar_seq_free(&s);
            return rc;
        }
        rc = lit(c, &s, "{");
        rc = rc ? rc : ws(c, &s);
        rc = rc ? rc : (first >= 0 ? grammar_seq_push(&s, rule_elem(first)) : 0);
        rc = rc ? rc : lit(c, &s, "}");
    }
    rc = rc ? rc : alt(c, rule, &s);
    grammar_seq_free(&s);
    return rc ? nomem(c, rc) : 0;
}

/* 1 when value v is of JSON schema type `type`. */
static int value_has_type(const cJSON *v, const char *type)
{
    if (strcmp(type, "string") == 0)
        return cJSON_IsString(v);
    if (strcmp(type, "number") == 0)
        return cJSON_IsNumber(v);
    if (strcmp(type, "integer") == 0)
        return cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble);
    if (strcmp(type, "boolean") == 0)
        return cJSON_IsBool(v);
    if (strcmp(type, "null") == 0)
        return cJSON_IsNull(v);
    if (strcmp(type, "object") == 0)
        return cJSON_IsObject(v);
    return strcmp(type, "array") == 0 && cJSON_IsArray(v);
}

static int value_matches_types(const cJSON *v, const cJSON *type)
{
    if (!type)
        return 1;
    if (cJSON_IsString(type))
        return value_has_type(v, type->valuestring);
    const cJSON *t;
    cJSON_ArrayForEach(t, type)
    {
        if (cJSON_IsString(t) && value_has_type(v, t->valuestring))
            return 1;
    }
    return 0;
}

/* enum / const: one literal alternative per value. */
static int compile_enum(struct compiler *c, const cJSON *node, int32_t rule)
{
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(node, "enum");
    const cJSON *cn = cJSON_GetObjectItemCaseSensitive(node, "const");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(node, "type");
    if (en && cn)
        return bad(c, ERR_UNSUPPORTED, "enum and const together are not supported");
    size_t old = path_push(c, en ? ".enum" : ".const");
    int rc = en && (!cJSON_IsArray(en) || cJSON_GetArraySize(en) == 0)
                 ? bad(c, ERR_INVALID_ARG, "must be a non-empty array")
                 : 0;
    const cJSON *v = en ? en->child : cn;
    for (int i = 0; v && rc == 0; v = en ? v->next : NULL, i++) {
        if (!value_matches_types(v, type)) {
            rc = error_set(c->err, ERR_INVALID_ARG, "%s[%d]: does not match the schema's type",
                           c->path, i);
            break;
        }
        char *text = cJSON_PrintUnformatted(v);
        struct grammar_seq s = {0};
        rc = text ? lit(c, &s, text) : ERR_NOMEM;
        rc = rc ? rc : alt(c, rule, &s);
        grammar_seq_free(&s);
        cJSON_free(text);
        if (rc)
            rc = nomem(c, rc);
    }
    path_pop(c, old);
    return rc;
}

static int compile_anyof(struct compiler *c, const cJSON *node, int32_t rule)
{
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(node, "anyOf");
    size_t old = path_push(c, ".anyOf");
    int rc = !cJSON_IsArray(any) || cJSON_GetArraySize(any) == 0
                 ? bad(c, ERR_INVALID_ARG, "must be a non-empty array of schemas")
                 : 0;
    int i = 0;
    const cJSON *sub;
    cJSON_ArrayForEach(sub, any)
    {
        if (rc)
            break;
        int32_t r;
        size_t at = path_push(c, "[%d]", i++);
        rc = compile(c, sub, &r);
        path_pop(c, at);
        if (rc == 0)
            rc = grammar_builder_alt1(c->b, rule, rule_elem(r)) ? nomem(c, ERR_NOMEM) : 0;
    }
    path_pop(c, old);
    return rc;
}

/* A JSON pointer ("#", "#/$defs/a") resolved in the root schema. */
static const cJSON *resolve(const cJSON *root, const char *ref)
{
    if (ref[0] != '#')
        return NULL;
    const cJSON *at = root;
    const char *p = ref + 1;
    while (*p == '/' && at) {
        char key[256];
        size_t n = 0;
        for (p++; *p && *p != '/' && n + 1 < sizeof key; p++) {
            if (*p == '~' && (p[1] == '0' || p[1] == '1'))
                key[n++] = p[1] == '0' ? '~' : '/', p++;
            else
                key[n++] = *p;
        }
        key[n] = 0;
        if (cJSON_IsArray(at)) {
            char *end;
            long idx = strtol(key, &end, 10);
            at = *end || n == 0 ? NULL : cJSON_GetArrayItem(at, (int)idx);
        } else {
            at = cJSON_IsObject(at) ? cJSON_GetObjectItemCaseSensitive(at, key) : NULL;
        }
    }
    return *p ? NULL : at;
}

static int compile_ref(struct compiler *c, const cJSON *node, int32_t rule)
{
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(node, "$ref");
    size_t old = path_push(c, ".$ref");
    const cJSON *target = cJSON_IsString(ref) ? resolve(c->root, ref->valuestring) : NULL;
    int rc = target ? 0 : bad(c, ERR_INVALID_ARG,
                              "must be a pointer into this schema (\"#\", \"#/$defs/name\")");
    path_pop(c, old);
    for (size_t i = 0; i < c->n_refs && rc == 0; i++)
        if (strcmp(c->refs[i].ref, ref->valuestring) == 0)
            return grammar_builder_alt1(c->b, rule, rule_elem(c->refs[i].rule)) ? nomem(c, ERR_NOMEM) : 0;
    if (rc)
        return rc;
    if (c->n_refs == c->cap_refs) {
        size_t cap = c->cap_refs ? c->cap_refs * 2 : 8;
        struct ref_memo *m = realloc(c->refs, cap * sizeof *m);
        if (!m)
            return nomem(c, ERR_NOMEM);
        c->refs = m, c->cap_refs = cap;
    }
    /* memoized before compiling the target, so a recursive schema refers to
     * the rule being defined */
    struct ref_memo *m = &c->refs[c->n_refs];
    if (!(m->ref = strdup(ref->valuestring)))
        return nomem(c, ERR_NOMEM);
    m->rule = rule;
    c->n_refs++;
    int32_t body;
    char saved[sizeof c->path];
    size_t saved_len = c->path_len;
    memcpy(saved, c->path, sizeof saved);
    path_pop(c, 0);
    path_push(c, "%.400s", ref->valuestring);
    rc = compile(c, target, &body);
    memcpy(c->path, saved, sizeof saved);
    c->path_len = saved_len;
    if (rc == 0 && grammar_builder_alt1(c->b, rule, rule_elem(body)))
        rc = nomem(c, ERR_NOMEM);
    return rc;
}

static int compile_type(struct compiler *c, const cJSON *node, const char *type, int32_t rule)
{
    static const char *const words[][2] = {{"boolean", "true"}, {"boolean", "false"},
                                           {"null", "null"}};
    if (strcmp(type, "string") == 0)
        return compile_string(c, node, rule);
    if (strcmp(type, "array") == 0)
        return compile_array(c, node, rule);
    if (strcmp(type, "object") == 0)
        return compile_object(c, node, rule);
    int32_t r;
    int rc, found = 0;
    if (strcmp(type, "integer") == 0 || strcmp(type, "number") == 0) {
        int is_int = type[0] == 'i';
        rc = shared(c, is_int ? "<integer>" : "<number>", is_int ? define_integer : define_number,
                    &r);
        rc = rc ? rc : grammar_builder_alt1(c->b, rule, rule_elem(r));
        return rc ? nomem(c, rc) : 0;
    }
    for (size_t i = 0; i < sizeof words / sizeof *words; i++) {
        if (strcmp(type, words[i][0]) != 0)
            continue;
        struct grammar_seq s = {0};
        found = 1;
        rc = lit(c, &s, words[i][1]);
        rc = rc ? rc : alt(c, rule, &s);
        grammar_seq_free(&s);
        if (rc)
            return nomem(c, rc);
    }
    if (found)
        return 0;
    size_t old = path_push(c, ".type");
    rc = error_set(c->err, ERR_INVALID_ARG,
                   "%s: unknown type '%.64s' (object, array, string, number, integer, boolean, "
                   "null)",
                   c->path, type);
    path_pop(c, old);
    return rc;
}

static int compile_types(struct compiler *c, const cJSON *node, const cJSON *type, int32_t rule)
{
    if (cJSON_IsString(type))
        return compile_type(c, node, type->valuestring, rule);
    size_t old = path_push(c, ".type");
    int rc = !cJSON_IsArray(type) || cJSON_GetArraySize(type) == 0
                 ? bad(c, ERR_INVALID_ARG, "must be a type name or a non-empty array of them")
                 : 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, type)
    {
        if (rc)
            break;
        if (!cJSON_IsString(t)) {
            rc = bad(c, ERR_INVALID_ARG, "must be a type name or a non-empty array of them");
            break;
        }
        path_pop(c, old);
        rc = compile_type(c, node, t->valuestring, rule);
        path_push(c, ".type");
    }
    path_pop(c, old);
    return rc;
}

/* Refuses keywords outside the subset, and keywords that the subset supports
 * but not beside `alone` ($ref, anyOf, enum, const). */
static int check_keywords(struct compiler *c, const cJSON *node)
{
    const char *alone = NULL;
    static const char *const solo[] = {"$ref", "anyOf", "enum", "const"};
    for (size_t i = 0; i < 4 && !alone; i++)
        if (cJSON_GetObjectItemCaseSensitive(node, solo[i]))
            alone = solo[i];
    const cJSON *k;
    cJSON_ArrayForEach(k, node)
    {
        if (IN_LIST(k->string, annotations))
            continue;
        if (!IN_LIST(k->string, structural))
            return error_set(c->err, ERR_UNSUPPORTED, "%s: unsupported keyword '%.64s'", c->path,
                             k->string);
        int with_enum = alone && alone[0] != '$' && alone[0] != 'a' &&
                        (strcmp(k->string, "type") == 0 || strcmp(k->string, "enum") == 0 ||
                         strcmp(k->string, "const") == 0);
        if (alone && strcmp(k->string, alone) != 0 && !with_enum)
            return error_set(c->err, ERR_UNSUPPORTED,
                             "%s: keyword '%.64s' beside '%s' is not supported", c->path,
                             k->string, alone);
    }
    return 0;
}

static int compile(struct compiler *c, const cJSON *node, int32_t *rule)
{
    if (c->depth >= GRAMMAR_SCHEMA_DEPTH_MAX)
        return bad(c, ERR_UNSUPPORTED, "schema nested more than 64 deep");
    if (cJSON_IsFalse(node))
        return bad(c, ERR_INVALID_ARG, "the schema false admits no value");
    int rc = new_rule(c, "schema", rule);
    if (rc)
        return rc;
    if (cJSON_IsTrue(node)) {
        int32_t any;
        rc = shared(c, "<value>", define_value, &any);
        rc = rc ? rc : grammar_builder_alt1(c->b, *rule, rule_elem(any));
        return rc ? nomem(c, rc) : 0;
    }
    if (!cJSON_IsObject(node))
        return bad(c, ERR_INVALID_ARG, "a schema must be an object or a boolean");
    if ((rc = check_keywords(c, node)))
        return rc;
    c->depth++;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(node, "type");
    if (cJSON_GetObjectItemCaseSensitive(node, "$ref"))
        rc = compile_ref(c, node, *rule);
    else if (cJSON_GetObjectItemCaseSensitive(node, "anyOf"))
        rc = compile_anyof(c, node, *rule);
    else if (cJSON_GetObjectItemCaseSensitive(node, "enum") ||
             cJSON_GetObjectItemCaseSensitive(node, "const"))
        rc = compile_enum(c, node, *rule);
    else if (type)
        rc = compile_types(c, node, type, *rule);
    else if (cJSON_GetObjectItemCaseSensitive(node, "properties") ||
             cJSON_GetObjectItemCaseSensitive(node, "additionalProperties") ||
             cJSON_GetObjectItemCaseSensitive(node, "required"))
        rc = compile_object(c, node, *rule);
    else if (cJSON_GetObjectItemCaseSensitive(node, "items") ||
             cJSON_GetObjectItemCaseSensitive(node, "minItems") ||
             cJSON_GetObjectItemCaseSensitive(node, "maxItems"))
        rc = compile_array(c, node, *rule);
    else if (cJSON_GetObjectItemCaseSensitive(node, "minLength") ||
             cJSON_GetObjectItemCaseSensitive(node, "maxLength") ||
             cJSON_GetObjectItemCaseSensitive(node, "pattern"))
        rc = compile_string(c, node, *rule);
    else {
        int32_t any;
        rc = shared(c, "<value>", define_value, &any);
        rc = rc ? rc : grammar_builder_alt1(c->b, *rule, rule_elem(any));
        rc = rc ? nomem(c, rc) : 0;
    }
    c->depth--;
    return rc;
}

static int finish(struct compiler *c, int rc, int32_t root, struct grammar **out)
{
    if (rc == 0)
        rc = grammar_builder_finish(c->b, root, out, c->err);
    for (size_t i = 0; i < c->n_refs; i++)
        free(c->refs[i].ref);
    free(c->refs);
    grammar_builder_destroy(c->b);
    return rc;
}

int grammar_schema_compile(const cJSON *schema, const char *where, struct grammar **out,
                           char *err)
{
    struct compiler c = {.root = schema, .err = err};
    if (grammar_builder_create(&c.b))
        return error_set(err, ERR_NOMEM, "%s: out of memory", where);
    path_push(&c, "%.200s", where);
    int32_t root = -1;
    int rc = compile(&c, schema, &root);
    return finish(&c, rc, root, out);
}

int grammar_schema_compile_text(const char *text, size_t len, const char *where,
                                struct grammar **out, char *err)
{
    char why[ERR_MSG_MAX];
    if (json_check(text, len, why))
        return error_set(err, ERR_INVALID_ARG, "%.200s: not valid JSON: %.280s", where, why);
    cJSON *schema = cJSON_ParseWithLength(text, len);
    if (!schema)
        return error_set(err, ERR_INVALID_ARG, "%.200s: not valid JSON", where);
    int rc = grammar_schema_compile(schema, where, out, err);
    cJSON_Delete(schema);
    return rc;
}

int grammar_schema_any_object(struct grammar **out, char *err)
{
    struct compiler c = {.err = err};
    if (grammar_builder_create(&c.b))
        return error_set(err, ERR_NOMEM, "json_object: out of memory");
    path_push(&c, "json_object");
    int32_t root = -1;
    int rc = shared(&c, "<object>", define_object, &root);
    return finish(&c, rc ? nomem(&c, rc) : 0, root, out);
}
