/* test_openai.c: the gateway's OpenAI request validation and response shapes
 * (gateway/openai.c), without any process. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "openai.h"

static int parse(enum openai_kind kind, const char *body, struct openai_request *r, struct openai_error *e)
{
    const struct openai_policy policy = {.served_model = "tiny", .strict_fields = false};
    return openai_parse_request(kind, body, strlen(body), &policy, r, e);
}

static int parse_strict(enum openai_kind kind, const char *body, struct openai_request *r, struct openai_error *e)
{
    const struct openai_policy policy = {.served_model = "tiny", .strict_fields = true};
    return openai_parse_request(kind, body, strlen(body), &policy, r, e);
}

static void test_openai_chat_translates_to_a_generate_message(void **state)
{
    (void)state;
    struct openai_request r;
    struct openai_error e;
    assert_int_equal(parse(OPENAI_CHAT,
                           "{\"model\":\"tiny\",\"messages\":[{\"role\":\"developer\",\"content\":\"be brief\"},"
                           "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\","
                           "\"text\":\"b\"}]}],\"max_completion_tokens\":7,\"max_tokens\":3,\"stop\":\"x\",\"n\":1,"
                           "\"temperature\":0,\"stream\":true,\"stream_options\":{\"include_usage\":true},"
                           "\"user\":\"u\",\"logprobs\":false,\"top_k\":5,\"spec_k\":2,\"seed\":null}",
                           &r, &e),
                     0);
    assert_true(r.stream);
    assert_true(r.include_usage);
    const cJSON *g = r.generate;
    assert_string_equal(cJSON_GetObjectItem(g, "type")->valuestring, "generate");
    assert_int_equal(cJSON_GetObjectItem(g, "max_tokens")->valueint, 7);
    assert_int_equal(cJSON_GetObjectItem(g, "top_k")->valueint, 5);
    assert_null(cJSON_GetObjectItem(g, "seed"));
    const cJSON *stop = cJSON_GetObjectItem(g, "stop");
    assert_true(cJSON_IsArray(stop));
    assert_string_equal(cJSON_GetArrayItem(stop, 0)->valuestring, "x");
    const cJSON *m = cJSON_GetObjectItem(g, "messages");
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(m, 0), "role")->valuestring, "system");
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(m, 1), "content")->valuestring, "ab");
    openai_request_free(&r);
}

/* The draft source (an extension field) is passed through; an unknown one
 * is a 400 naming the field. */
static void test_openai_draft_source_extension(void **state)
{
    (void)state;
    struct openai_request r;
    struct openai_error e;
    assert_int_equal(parse(OPENAI_COMPLETION, "{\"model\":\"tiny\",\"prompt\":\"hi\",\"draft\":\"ngram\"}", &r, &e),
                     0);
    assert_string_equal(cJSON_GetObjectItem(r.generate, "draft")->valuestring, "ngram");
    openai_request_free(&r);
    assert_int_not_equal(parse(OPENAI_CHAT,
                               "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
                               "\"draft\":\"medusa\"}",
                               &r, &e),
                         0);
    assert_string_equal(e.param, "draft");
    assert_non_null(strstr(e.message, "medusa"));
    assert_int_not_equal(parse(OPENAI_COMPLETION, "{\"model\":\"tiny\",\"prompt\":\"hi\",\"draft\":3}", &r, &e), 0);
    assert_string_equal(e.param, "draft");
    /* token trees, the same way: a budget or a name passed through */
    assert_int_equal(parse(OPENAI_COMPLETION, "{\"model\":\"tiny\",\"prompt\":\"hi\",\"spec_tree\":16}", &r, &e), 0);
    assert_int_equal(cJSON_GetObjectItem(r.generate, "spec_tree")->valueint, 16);
    openai_request_free(&r);
    assert_int_equal(parse(OPENAI_COMPLETION, "{\"model\":\"tiny\",\"prompt\":\"hi\",\"spec_tree\":\"off\"}", &r, &e),
                     0);
    assert_string_equal(cJSON_GetObjectItem(r.generate, "spec_tree")->valuestring, "off");
    openai_request_free(&r);
    assert_int_not_equal(parse(OPENAI_COMPLETION, "{\"model\":\"tiny\",\"prompt\":\"hi\",\"spec_tree\":40}", &r, &e), 0);
    assert_string_equal(e.param, "spec_tree");
    assert_non_null(strstr(e.message, "2..32"));
}

static void test_openai_completion_prompt_forms(void **state)
{
    (void)state;
    struct openai_request r;
    struct openai_error e;
    assert_int_equal(parse(OPENAI_COMPLETION, "{\"model\":\"tiny\",\"prompt\":[[1,2,3]]}", &r, &e), 0);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(r.generate, "prompt_ids")), 3);
    openai_request_free(&r);
    assert_int_equal(parse(OPENAI_COMPLETION, "{\"model\":\"tiny\",\"prompt\":[\"hi\"]}", &r, &e), 0);
    assert_string_equal(cJSON_GetObjectItem(r.generate, "prompt")->valuestring, "hi");
    openai_request_free(&r);
    assert_int_not_equal(parse(OPENAI_COMPLETION, "{\"model\":\"tiny\",\"prompt\":[\"a\",\"b\"]}", &r, &e), 0);
    assert_string_equal(e.param, "prompt");
}

static void test_openai_refusals_name_the_field(void **state)
{
    (void)state;
    static const struct {
        enum openai_kind kind;
        const char *body;
        int status;
        const char *param;
    } cases[] = {
        {OPENAI_CHAT, "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":17}", 400, "n"},
        {OPENAI_CHAT, "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[]}", 400,
         "tools"},
        {OPENAI_CHAT, "{\"model\":\"big\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 404, "model"},
        {OPENAI_CHAT, "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"name\":\"x\"}]}", 400,
         "messages[0].name"},
        {OPENAI_COMPLETION, "{\"model\":\"tiny\",\"prompt\":\"x\",\"echo\":true}", 400, "echo"},
        {OPENAI_COMPLETION, "{\"model\":\"tiny\",\"prompt\":\"x\",\"max_tokens\":\"3\"}", 400, "max_tokens"},
        {OPENAI_COMPLETION, "{\"model\":7,\"prompt\":\"x\"}", 400, "model"},
        /* the penalties are numbers (their ranges are the coordinator's) */
        {OPENAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"repetition_penalty\":\"1\"}", 400,
         "repetition_penalty"},
        /* known fields keep their types, lenient or not */
        {OPENAI_COMPLETION, "{\"prompt\":\"x\",\"ignore_eos\":1}", 400, "ignore_eos"},
        {OPENAI_COMPLETION, "{\"prompt\":\"x\",\"temperature\":\"hot\"}", 400, "temperature"},
        {OPENAI_COMPLETION, "[]", 400, ""},
        /* user is a string (docs/http.md), not any JSON value */
        {OPENAI_COMPLETION, "{\"model\":\"tiny\",\"prompt\":\"x\",\"user\":7}", 400, "user"},
        {OPENAI_CHAT, "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"user\":{}}", 400,
         "user"},
        {OPENAI_COMPLETION, "{\"model\":\"tiny\",\"prompt\":\"x\",\"user\":true}", 400, "user"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct openai_request r;
        struct openai_error e;
        assert_int_not_equal(parse(cases[i].kind, cases[i].body, &r, &e), 0);
        assert_null(r.generate);
        assert_int_equal(e.status, cases[i].status);
        assert_string_equal(e.param, cases[i].param);
    }
}

/* The clients people use: no model means the served one, null too; a
 * field the gateway does not know is accepted and listed (cleaned for a
 * header), or refused naming it when strict; ignore_eos is a known field
 * (passed on when true, below); repetition_penalty 1 is accepted. */
static void test_openai_lenient_fields_are_listed_strict_refused(void **state)
{
    (void)state;
    static const struct {
        enum openai_kind kind;
        const char *body;
        const char *ignored;     /* lenient: the list; strict: NULL = accepted too */
        const char *strict_param;
    } cases[] = {
        {OPENAI_COMPLETION, "{\"prompt\":\"x\"}", "", NULL},
        {OPENAI_COMPLETION, "{\"model\":null,\"prompt\":\"x\"}", "", NULL},
        {OPENAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"zz\":1}", "zz", "zz"},
        {OPENAI_COMPLETION, "{\"model\":\"tiny\",\"prompt\":\"x\",\"chat_template_kwargs\":{},\"a\\r\\nX: y\":1}",
         "chat_template_kwargs,a??X??y", "chat_template_kwargs"},
        {OPENAI_COMPLETION, "{\"prompt\":\"x\",\"ignore_eos\":false,\"repetition_penalty\":1}", "", NULL},
        {OPENAI_CHAT,
         "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"repetition_penalty\":1.0,\"ignore_eos\":null}", "",
         NULL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct openai_request r;
        struct openai_error e;
        if (parse(cases[i].kind, cases[i].body, &r, &e) != 0)
            fail_msg("case %zu: refused (%d %s) when lenient", i, e.status, e.message);
        assert_non_null(r.generate);
        if (strcmp(r.ignored, cases[i].ignored) != 0)
            fail_msg("case %zu: ignored \"%s\", want \"%s\"", i, r.ignored, cases[i].ignored);
        assert_null(cJSON_GetObjectItem(r.generate, "ignore_eos"));
        assert_null(cJSON_GetObjectItem(r.generate, "zz"));
        openai_request_free(&r);
        int rc = parse_strict(cases[i].kind, cases[i].body, &r, &e);
        if (cases[i].strict_param == NULL) {
            assert_int_equal(rc, 0);
            assert_string_equal(r.ignored, "");
            openai_request_free(&r);
        } else {
            if (rc == 0)
                fail_msg("case %zu: accepted when strict", i);
            assert_int_equal(e.status, 400);
            assert_string_equal(e.param, cases[i].strict_param);
        }
    }
    /* ignore_eos: true reaches the coordinator, lenient or strict */
    for (int strict = 0; strict < 2; strict++) {
        struct openai_request r;
        struct openai_error e;
        const char *b = "{\"prompt\":\"x\",\"ignore_eos\":true}";
        assert_int_equal(strict ? parse_strict(OPENAI_COMPLETION, b, &r, &e) : parse(OPENAI_COMPLETION, b, &r, &e), 0);
        assert_true(cJSON_IsTrue(cJSON_GetObjectItem(r.generate, "ignore_eos")));
        assert_string_equal(r.ignored, "");
        openai_request_free(&r);
    }
    /* a long list is cut with ",..." and stays within its buffer */
    char body[4096] = "{\"prompt\":\"x\"";
    for (int i = 0; i < 40; i++) {
        char f[64];
        snprintf(f, sizeof f, ",\"vendor_extra_field_%02d\":%d", i, i);
        strcat(body, f);
    }
    strcat(body, "}");
    struct openai_request r;
    struct openai_error e;
    assert_int_equal(parse(OPENAI_COMPLETION, body, &r, &e), 0);
    size_t n = strlen(r.ignored);
    assert_true(n < sizeof(r.ignored));
    assert_string_equal(r.ignored + n - 4, ",...");
    assert_non_null(strstr(r.ignored, "vendor_extra_field_00,vendor_extra_field_01"));
    openai_request_free(&r);
    /* a model that is not the served one stays a 404, lenient or not */
    assert_int_not_equal(parse(OPENAI_COMPLETION, "{\"model\":\"gpt-4\",\"prompt\":\"x\"}", &r, &e), 0);
    assert_int_equal(e.status, 404);
    assert_string_equal(e.code, "model_not_found");
    /* penalties and logit_bias reach the coordinator, which checks their ranges */
    assert_int_equal(parse(OPENAI_COMPLETION, "{\"prompt\":\"x\",\"repetition_penalty\":1.2,"
                                              "\"presence_penalty\":0.5,\"logit_bias\":{\"7\":-100}}", &r, &e), 0);
    assert_true(cJSON_GetObjectItem(r.generate, "repetition_penalty")->valuedouble == 1.2);
    assert_true(cJSON_GetObjectItem(cJSON_GetObjectItem(r.generate, "logit_bias"), "7")->valuedouble == -100);
    openai_request_free(&r);
    assert_int_not_equal(parse(OPENAI_COMPLETION, "{\"prompt\":\"x\",\"logit_bias\":[1]}", &r, &e), 0);
    assert_string_equal(e.param, "logit_bias");
}

/* response_format: text is nothing; json_object and json_schema become the
 * native "grammar" (the schema passed as written, strict or not); an
 * unsupported keyword or an unknown type is a 400 on response_format whose
 * message names the keyword and where it is. */
static void test_openai_response_format_becomes_grammar(void **state)
{
    (void)state;
    struct openai_request r;
    struct openai_error e;
    assert_int_equal(parse(OPENAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                                        "\"response_format\":{\"type\":\"text\"}}", &r, &e), 0);
    assert_null(cJSON_GetObjectItem(r.generate, "grammar"));
    openai_request_free(&r);
    assert_int_equal(parse(OPENAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                                        "\"response_format\":{\"type\":\"json_object\"}}", &r, &e), 0);
    const cJSON *g = cJSON_GetObjectItem(r.generate, "grammar");
    assert_string_equal(cJSON_GetObjectItem(g, "type")->valuestring, "json_object");
    openai_request_free(&r);
    assert_int_equal(parse(OPENAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                                        "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{"
                                        "\"name\":\"n\",\"strict\":true,\"schema\":{\"type\":\"integer\"}}}}",
                           &r, &e), 0);
    g = cJSON_GetObjectItem(r.generate, "grammar");
    assert_string_equal(cJSON_GetObjectItem(g, "type")->valuestring, "json_schema");
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(g, "schema"), "type")->valuestring, "integer");
    openai_request_free(&r);
    static const char *const bad[][2] = {
        {"{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"schema\":{\"type\":\"integer\","
         "\"minimum\":0}}}", "response_format.json_schema.schema: unsupported keyword 'minimum'"},
        {"{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"schema\":{\"properties\":{\"a\":"
         "{\"format\":\"date\"}}}}}", "response_format.json_schema.schema.properties.a: unsupported keyword 'format'"},
        {"{\"type\":\"json_schema\"}", "response_format.json_schema: required"},
        {"{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"strict\":\"yes\"}}", "strict"},
        {"{\"type\":\"yaml\"}", "response_format.type: must be"},
        {"{\"type\":\"json_object\",\"extra\":1}", "response_format.extra: unknown field"},
        {"\"json\"", "response_format: expected an object"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char body[512];
        snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":%s}",
                 bad[i][0]);
        int rc = parse(OPENAI_CHAT, body, &r, &e);
        if (rc == 0 || strstr(e.message, bad[i][1]) == NULL)
            print_error("%s: rc %d, message \"%s\", expected \"%s\"\n", body, rc, rc ? e.message : "", bad[i][1]);
        assert_int_not_equal(rc, 0);
        assert_int_equal(e.status, 400);
        assert_string_equal(e.param, "response_format");
        assert_non_null(strstr(e.message, bad[i][1]));
    }
}

/* prediction: OpenAI's content (a string, or text parts joined) becomes
 * the native "prediction" text; another shape is a 400 naming it. */
static void test_openai_prediction_becomes_text(void **state)
{
    (void)state;
    struct openai_request r;
    struct openai_error e;
    assert_int_equal(parse(OPENAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                                        "\"prediction\":{\"type\":\"content\",\"content\":[{\"type\":\"text\","
                                        "\"text\":\"ab\"},{\"type\":\"text\",\"text\":\"c\"}]}}", &r, &e), 0);
    assert_string_equal(cJSON_GetObjectItem(r.generate, "prediction")->valuestring, "abc");
    openai_request_free(&r);
    assert_int_equal(parse(OPENAI_COMPLETION, "{\"prompt\":\"x\",\"prediction\":{\"type\":\"content\","
                                              "\"content\":\"def\"}}", &r, &e), 0);
    assert_string_equal(cJSON_GetObjectItem(r.generate, "prediction")->valuestring, "def");
    openai_request_free(&r);
    static const char *const bad[] = {"\"abc\"", "{\"type\":\"text\",\"content\":\"a\"}",
                                      "{\"type\":\"content\",\"content\":5}",
                                      "{\"type\":\"content\",\"content\":[{\"type\":\"image_url\"}]}",
                                      "{\"type\":\"content\",\"content\":\"a\",\"x\":1}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char body[256];
        snprintf(body, sizeof body, "{\"prompt\":\"x\",\"prediction\":%s}", bad[i]);
        assert_int_not_equal(parse(OPENAI_COMPLETION, body, &r, &e), 0);
        assert_int_equal(e.status, 400);
        assert_string_equal(e.param, "prediction");
    }
}

/* logprobs: chat's boolean and top_logprobs, completions' count, become the
 * coordinator's "logprobs": N; out of range or top_logprobs alone: a 400
 * naming the field. */
static void test_openai_logprobs_fields_translate(void **state)
{
    (void)state;
    static const struct {
        enum openai_kind kind;
        const char *body;
        int want;           /* the coordinator's logprobs; -1: absent; -2: refused */
        const char *param;
    } cases[] = {
        {OPENAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true}", 0, NULL},
        {OPENAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,\"top_logprobs\":20}", 20, NULL},
        {OPENAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":false,\"top_logprobs\":null}", -1, NULL},
        {OPENAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":2}", -2, "top_logprobs"},
        {OPENAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,\"top_logprobs\":21}", -2, "top_logprobs"},
        {OPENAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":1}", -2, "logprobs"},
        {OPENAI_COMPLETION, "{\"prompt\":\"x\",\"logprobs\":3}", 3, NULL},
        {OPENAI_COMPLETION, "{\"prompt\":\"x\",\"logprobs\":null}", -1, NULL},
        {OPENAI_COMPLETION, "{\"prompt\":\"x\",\"logprobs\":-1}", -2, "logprobs"},
        {OPENAI_COMPLETION, "{\"prompt\":\"x\",\"logprobs\":true}", -2, "logprobs"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct openai_request r;
        struct openai_error e;
        int rc = parse(cases[i].kind, cases[i].body, &r, &e);
        if (cases[i].want == -2) {
            if (rc == 0)
                fail_msg("case %zu: accepted", i);
            assert_int_equal(e.status, 400);
            assert_string_equal(e.param, cases[i].param);
            continue;
        }
        if (rc != 0)
            fail_msg("case %zu: refused: %s", i, e.message);
        const cJSON *lp = cJSON_GetObjectItem(r.generate, "logprobs");
        if (cases[i].want == -1)
            assert_null(lp);
        else
            assert_int_equal(lp->valueint, cases[i].want);
        openai_request_free(&r);
    }
}

/* A done reply's logprobs entries in both OpenAI layouts. */
static void test_openai_logprobs_layouts(void **state)
{
    (void)state;
    cJSON *done = cJSON_Parse(
        "{\"type\":\"done\",\"text\":\"ab\",\"ids\":[1,2],\"finish_reason\":\"length\",\"logprobs\":["
        "{\"id\":1,\"token\":\"a\",\"bytes\":[97],\"logprob\":-0.5,\"text_offset\":0,"
        "\"top_logprobs\":[{\"id\":1,\"token\":\"a\",\"bytes\":[97],\"logprob\":-0.5},"
        "{\"id\":9,\"token\":\"z\",\"bytes\":[122],\"logprob\":-1.5}]},"
        "{\"id\":2,\"token\":\"b\",\"bytes\":[98],\"logprob\":-0.25,\"text_offset\":1,\"top_logprobs\":[]}]}");
    cJSON *r = openai_response_json(OPENAI_CHAT, "chatcmpl-1", 5, "tiny", done);
    const cJSON *lp = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "choices"), 0), "logprobs");
    const cJSON *content = cJSON_GetObjectItem(lp, "content");
    assert_int_equal(cJSON_GetArraySize(content), 2);
    const cJSON *e0 = cJSON_GetArrayItem(content, 0);
    assert_string_equal(cJSON_GetObjectItem(e0, "token")->valuestring, "a");
    assert_true(cJSON_GetObjectItem(e0, "logprob")->valuedouble == -0.5);
    assert_int_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(e0, "bytes"), 0)->valueint, 97);
    const cJSON *alt = cJSON_GetArrayItem(cJSON_GetObjectItem(e0, "top_logprobs"), 1);
    assert_string_equal(cJSON_GetObjectItem(alt, "token")->valuestring, "z");
    assert_null(cJSON_GetObjectItem(alt, "top_logprobs"));
    cJSON_Delete(r);
    r = openai_response_json(OPENAI_COMPLETION, "cmpl-1", 5, "tiny", done);
    lp = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "choices"), 0), "logprobs");
    assert_string_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "tokens"), 1)->valuestring, "b");
    assert_true(cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "token_logprobs"), 1)->valuedouble == -0.25);
    assert_int_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "text_offset"), 1)->valueint, 1);
    const cJSON *top0 = cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "top_logprobs"), 0);
    assert_true(cJSON_GetObjectItem(top0, "z")->valuedouble == -1.5);
    cJSON_Delete(r);
    cJSON_DeleteItemFromObject(done, "logprobs");
    r = openai_response_json(OPENAI_COMPLETION, "cmpl-1", 5, "tiny", done);
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "choices"), 0), "logprobs")));
    cJSON_Delete(r);
    cJSON_Delete(done);
}

static void test_openai_coordinator_errors_map_to_statuses(void **state)
{
    (void)state;
    static const struct {
        const char *reply;
        int status;
        const char *param;
    } cases[] = {
        {"{\"code\":\"invalid_request\",\"message\":\"max_tokens: must be >= 1, got 0\"}", 400, "max_tokens"},
        {"{\"code\":\"context_full\",\"message\":\"prompt: 99 tokens do not fit\"}", 400, "prompt"},
        {"{\"code\":\"overloaded\",\"message\":\"1 requests active\"}", 429, ""},
        {"{\"code\":\"target_unavailable\",\"message\":\"no target\"}", 503, ""},
        {"{\"code\":\"coordinator_unavailable\",\"message\":\"down\"}", 503, ""},
        {"{\"code\":\"internal\",\"message\":\"worker failed\"}", 500, ""},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        cJSON *reply = cJSON_Parse(cases[i].reply);
        struct openai_error e;
        openai_error_from_reply(reply, &e);
        cJSON_Delete(reply); /* e must not borrow from it */
        assert_int_equal(e.status, cases[i].status);
        assert_string_equal(e.param, cases[i].param);
        cJSON *j = openai_error_json(&e);
        const cJSON *o = cJSON_GetObjectItem(j, "error");
        assert_non_null(cJSON_GetObjectItem(o, "message"));
        assert_non_null(cJSON_GetObjectItem(o, "type"));
        assert_non_null(cJSON_GetObjectItem(o, "param"));
        assert_non_null(cJSON_GetObjectItem(o, "code"));
        cJSON_Delete(j);
    }
}

static void test_openai_response_and_chunks_have_openai_shapes(void **state)
{
    (void)state;
    cJSON *done = cJSON_Parse("{\"type\":\"done\",\"text\":\"hey\",\"ids\":[1,2],\"finish_reason\":\"stop_string\","
                              "\"usage\":{\"prompt_tokens\":4,\"generated_tokens\":2},"
                              "\"spec\":{\"rounds\":1,\"drafted\":5,\"accepted\":3}}");
    cJSON *r = openai_response_json(OPENAI_CHAT, "chatcmpl-1", 5, "tiny", done);
    const cJSON *details = cJSON_GetObjectItem(cJSON_GetObjectItem(r, "usage"), "completion_tokens_details");
    assert_int_equal(cJSON_GetObjectItem(details, "accepted_prediction_tokens")->valueint, 3);
    assert_int_equal(cJSON_GetObjectItem(details, "rejected_prediction_tokens")->valueint, 2);
    const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(r, "choices"), 0);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(c, "message"), "content")->valuestring, "hey");
    assert_string_equal(cJSON_GetObjectItem(c, "finish_reason")->valuestring, "stop");
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(r, "usage"), "total_tokens")->valueint, 6);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(cJSON_GetObjectItem(r, "tandem"), "ids")), 2);
    cJSON_Delete(r);
    cJSON *u = openai_usage_chunk_json(OPENAI_COMPLETION, "cmpl-1", 5, "tiny", done);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(u, "choices")), 0);
    assert_string_equal(cJSON_GetObjectItem(u, "object")->valuestring, "text_completion");
    cJSON_Delete(u);
    cJSON *first = openai_chunk_json(OPENAI_CHAT, "chatcmpl-1", 5, "tiny",
                                     &(struct openai_chunk){.role_first = true, .with_usage_null = true});
    const cJSON *d = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(first, "choices"), 0), "delta");
    assert_string_equal(cJSON_GetObjectItem(d, "role")->valuestring, "assistant");
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(first, "usage")));
    cJSON_Delete(first);
    cJSON_Delete(done);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_openai_chat_translates_to_a_generate_message),
        cmocka_unit_test(test_openai_completion_prompt_forms),
        cmocka_unit_test(test_openai_draft_source_extension),
        cmocka_unit_test(test_openai_refusals_name_the_field),
        cmocka_unit_test(test_openai_lenient_fields_are_listed_strict_refused),
        cmocka_unit_test(test_openai_coordinator_errors_map_to_statuses),
        cmocka_unit_test(test_openai_response_and_chunks_have_openai_shapes),
        cmocka_unit_test(test_openai_logprobs_fields_translate),
        cmocka_unit_test(test_openai_response_format_becomes_grammar),
        cmocka_unit_test(test_openai_prediction_becomes_text),
        cmocka_unit_test(test_openai_logprobs_layouts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
