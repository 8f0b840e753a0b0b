/* test_openai_tools.c: OpenAI's tools through the gateway's translation
 * (gateway/openai_tools.c, and the messages of gateway/openai.c), without
 * any process. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "openai.h"

#define TOOLS                                                                                                       \
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"d\",\"parameters\":"           \
    "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}},"             \
    "{\"type\":\"function\",\"function\":{\"name\":\"now\"}}]"

static int parse_chat(const char *extra, struct openai_request *r, struct openai_error *e)
{
    char body[4096];
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]%s}", extra);
    const struct openai_policy policy = {.served_model = "tiny", .strict_fields = true};
    return openai_parse_request(OPENAI_CHAT, body, strlen(body), &policy, r, e);
}

/* tools pass through as given; auto (the default) adds no grammar; required
 * and a named function add a grammar of the call, anyOf over the tools
 * for required. */
static void test_openai_tools_choice_sets_the_grammar(void **state)
{
    (void)state;
    struct openai_request r;
    struct openai_error e;
    assert_int_equal(parse_chat(",\"tools\":" TOOLS, &r, &e), 0);
    assert_int_equal(r.tools.choice, OPENAI_TOOL_CHOICE_AUTO);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(r.generate, "tools")), 2);
    assert_null(cJSON_GetObjectItem(r.generate, "grammar"));
    openai_request_free(&r);

    assert_int_equal(parse_chat(",\"tools\":" TOOLS ",\"tool_choice\":\"required\"", &r, &e), 0);
    const cJSON *schema = cJSON_GetObjectItem(cJSON_GetObjectItem(r.generate, "grammar"), "schema");
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(schema, "anyOf")), 2);
    openai_request_free(&r);

    assert_int_equal(parse_chat(",\"tools\":" TOOLS ",\"tool_choice\":{\"type\":\"function\",\"function\":"
                                "{\"name\":\"get_weather\"}},\"parallel_tool_calls\":false",
                                &r, &e),
                     0);
    assert_int_equal(r.tools.choice, OPENAI_TOOL_CHOICE_NAMED);
    assert_false(r.tools.parallel);
    schema = cJSON_GetObjectItem(cJSON_GetObjectItem(r.generate, "grammar"), "schema");
    const cJSON *props = cJSON_GetObjectItem(schema, "properties");
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(props, "name"), "const")->valuestring,
                        "get_weather");
    assert_non_null(cJSON_GetObjectItem(cJSON_GetObjectItem(props, "parameters"), "required"));
    openai_request_free(&r);

    assert_int_equal(parse_chat(",\"tools\":" TOOLS ",\"tool_choice\":\"none\"", &r, &e), 0);
    assert_int_equal(r.tools.choice, OPENAI_TOOL_CHOICE_NONE);
    assert_non_null(cJSON_GetObjectItem(r.generate, "tools"));
    assert_null(cJSON_GetObjectItem(r.generate, "grammar"));
    openai_request_free(&r);
}

/* Bad definitions and choices are 400s naming what was wrong. */
static void test_openai_tools_refusals_name_the_problem(void **state)
{
    (void)state;
    static const struct {
        const char *extra, *param, *says;
    } cases[] = {
        {",\"tools\":{}", "tools", "array"},
        {",\"tools\":[{\"type\":\"function\"}]", "tools[0]", "\"function\""},
        {",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a b\"}}]", "tools[0]", "function.name"},
        {",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\",\"parameters\":[]}}]", "tools[0]",
         "function.parameters"},
        {",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\"}},{\"type\":\"function\",\"function\":"
         "{\"name\":\"a\"}}]",
         "tools[1]", "twice"},
        {",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\",\"parameters\":{\"type\":\"object\","
         "\"properties\":{\"n\":{\"type\":\"integer\",\"minimum\":0}}}}}]",
         "tools[0]", "tools[0].function.parameters.properties.n: unsupported keyword 'minimum'"},
        {",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\",\"x\":1}}]", "tools[0]", "function.x"},
        {",\"tool_choice\":\"required\"", "tool_choice", "only with tools"},
        {",\"tools\":" TOOLS ",\"tool_choice\":\"always\"", "tool_choice", "always"},
        {",\"tools\":" TOOLS ",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"b\"}}", "tool_choice",
         "not one of the tools"},
        {",\"tools\":" TOOLS ",\"parallel_tool_calls\":1", "parallel_tool_calls", "boolean"},
        {",\"tools\":" TOOLS ",\"tool_choice\":\"required\",\"response_format\":{\"type\":\"json_object\"}",
         "tool_choice", "response_format"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct openai_request r;
        struct openai_error e;
        if (parse_chat(cases[i].extra, &r, &e) != -1 || e.status != 400 || strcmp(e.param, cases[i].param) != 0 ||
            strstr(e.message, cases[i].says) == NULL)
            fail_msg("case %zu (%s): status %d param %s message %s", i, cases[i].extra, e.status, e.param,
                     e.message);
    }
}

/* role "tool" and an assistant's tool_calls reach the coordinator as the
 * native message fields; two calls in one message, or arguments that are
 * not JSON, are 400s. */
static void test_openai_tools_messages_translate(void **state)
{
    (void)state;
    struct openai_request r;
    struct openai_error e;
    const char *body =
        "{\"messages\":[{\"role\":\"user\",\"content\":\"w?\"},{\"role\":\"assistant\",\"content\":null,"
        "\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
        "\"arguments\":\"{\\\"city\\\": \\\"Paris\\\"}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"c1\","
        "\"content\":\"18 C\"}]}";
    const struct openai_policy policy = {.served_model = "tiny", .strict_fields = true};
    assert_int_equal(openai_parse_request(OPENAI_CHAT, body, strlen(body), &policy, &r, &e), 0);
    const cJSON *m = cJSON_GetObjectItem(r.generate, "messages");
    const cJSON *call = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(m, 1), "tool_calls"), 0);
    assert_string_equal(cJSON_GetObjectItem(call, "name")->valuestring, "get_weather");
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(call, "arguments"), "city")->valuestring, "Paris");
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(m, 2), "role")->valuestring, "tool");
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(m, 2), "content")->valuestring, "18 C");
    assert_null(cJSON_GetObjectItem(cJSON_GetArrayItem(m, 2), "tool_call_id"));
    openai_request_free(&r);

    static const char *const bad[] = {
        "{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"a\",\"arguments\":\"{\"}}]}]}",
        "{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"name\":\"a\",\"arguments\":\"{}\"}},"
        "{\"function\":{\"name\":\"a\",\"arguments\":\"{}\"}}]}]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"tool_calls\":[]}]}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (openai_parse_request(OPENAI_CHAT, bad[i], strlen(bad[i]), &policy, &r, &e) != -1 || e.status != 400 ||
            strstr(e.param, "messages[") == NULL)
            fail_msg("bad %zu: status %d param %s", i, e.status, e.param);
    }
}

/* The output: a call of a declared tool (after <|python_tag|>, with
 * "parameters" or "arguments", several joined by ';') becomes tool_calls;
 * anything else stays content. */
static void test_openai_tools_output_parses_as_calls(void **state)
{
    (void)state;
    struct openai_request r;
    struct openai_error e;
    assert_int_equal(parse_chat(",\"tools\":" TOOLS, &r, &e), 0);
    const struct openai_tools *t = &r.tools;
    cJSON *calls = openai_tools_parse(t, " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", "c");
    assert_int_equal(cJSON_GetArraySize(calls), 1);
    const cJSON *c = cJSON_GetArrayItem(calls, 0);
    assert_string_equal(cJSON_GetObjectItem(c, "id")->valuestring, "c_0");
    assert_string_equal(cJSON_GetObjectItem(c, "type")->valuestring, "function");
    const cJSON *fn = cJSON_GetObjectItem(c, "function");
    assert_string_equal(cJSON_GetObjectItem(fn, "name")->valuestring, "get_weather");
    assert_string_equal(cJSON_GetObjectItem(fn, "arguments")->valuestring, "{\"city\":\"Paris\"}");
    cJSON_Delete(calls);
    calls = openai_tools_parse(t, "<|python_tag|>{\"name\": \"now\", \"arguments\": {}}; {\"name\": \"now\"}", "c");
    assert_int_equal(cJSON_GetArraySize(calls), 2);
    cJSON_Delete(calls);
    static const char *const content[] = {
        "Sunny.", "{\"name\": \"rain\", \"parameters\": {}}", "{\"name\": \"now\", \"parameters\": 3}",
        "{\"name\": \"now\", \"parameters\": {}} and more", "{\"name\": \"now\", \"parameters\": {}, \"x\": 1}",
        "{\"name\": \"now\", \"name\": \"now\"}", "",
    };
    for (size_t i = 0; i < sizeof content / sizeof content[0]; i++)
        if ((calls = openai_tools_parse(t, content[i], "c")) != NULL)
            fail_msg("content %zu parsed as a call: %s", i, content[i]);
    assert_int_equal(openai_tools_may_be_call(t, "  "), 1);
    assert_int_equal(openai_tools_may_be_call(t, "<|pyth"), 1);
    assert_int_equal(openai_tools_may_be_call(t, " {\"na"), 1);
    assert_int_equal(openai_tools_may_be_call(t, " Hello"), 0);
    openai_request_free(&r);
}

/* A whole response whose text is a call: content null, tool_calls,
 * finish_reason "tool_calls"; tool_choice none leaves it content. */
static void test_openai_tools_rewrite_the_response(void **state)
{
    (void)state;
    struct openai_request r;
    struct openai_error e;
    assert_int_equal(parse_chat(",\"tools\":" TOOLS, &r, &e), 0);
    cJSON *done = cJSON_Parse("{\"type\":\"done\",\"text\":\"{\\\"name\\\": \\\"now\\\", \\\"parameters\\\": {}}\","
                              "\"ids\":[1,2],\"finish_reason\":\"stop\",\"usage\":{\"prompt_tokens\":3,"
                              "\"generated_tokens\":2}}");
    cJSON *resp = openai_response_json(OPENAI_CHAT, "chatcmpl-gw-1", 1, "tiny", done);
    openai_tools_apply_response(&r.tools, resp);
    const cJSON *choice = cJSON_GetArrayItem(cJSON_GetObjectItem(resp, "choices"), 0);
    const cJSON *msg = cJSON_GetObjectItem(choice, "message");
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(msg, "content")));
    assert_string_equal(cJSON_GetObjectItem(choice, "finish_reason")->valuestring, "tool_calls");
    const cJSON *call = cJSON_GetArrayItem(cJSON_GetObjectItem(msg, "tool_calls"), 0);
    assert_string_equal(cJSON_GetObjectItem(call, "id")->valuestring, "call_chatcmpl-gw-1_0_0");
    cJSON_Delete(resp);
    openai_request_free(&r);
    assert_int_equal(parse_chat(",\"tools\":" TOOLS ",\"tool_choice\":\"none\"", &r, &e), 0);
    resp = openai_response_json(OPENAI_CHAT, "chatcmpl-gw-1", 1, "tiny", done);
    openai_tools_apply_response(&r.tools, resp);
    choice = cJSON_GetArrayItem(cJSON_GetObjectItem(resp, "choices"), 0);
    assert_true(cJSON_IsString(cJSON_GetObjectItem(cJSON_GetObjectItem(choice, "message"), "content")));
    assert_string_equal(cJSON_GetObjectItem(choice, "finish_reason")->valuestring, "stop");
    cJSON_Delete(resp);
    cJSON_Delete(done);
    openai_request_free(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_openai_tools_choice_sets_the_grammar),
        cmocka_unit_test(test_openai_tools_refusals_name_the_problem),
        cmocka_unit_test(test_openai_tools_messages_translate),
        cmocka_unit_test(test_openai_tools_output_parses_as_calls),
        cmocka_unit_test(test_openai_tools_rewrite_the_response),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
