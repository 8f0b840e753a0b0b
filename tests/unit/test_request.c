/* test_request.c: the client request parser accepts well-formed "generate"
 * requests with their defaults and rejects every bad request the issue lists
 * (not JSON, missing prompt, unknown field, wrong types, max_tokens <= 0, bad
 * sampling values) with a message that names the field. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "error.h"
#include "request.h"
#include "sampling.h"
#include "utf8.h"

static const struct request_limits limits = {.max_tokens_max = 4096};

static struct request *parse_ok(const char *json)
{
    char err[ERR_MSG_MAX] = "";
    struct request *r = NULL;
    int rc = request_parse(&r, json, strlen(json), &limits, err);
    if (rc != 0)
        print_error("unexpected rejection of %s: %s\n", json, err);
    assert_int_equal(rc, 0);
    assert_non_null(r);
    return r;
}

/* Expects a rejection whose message contains `needle`. */
static void parse_bad(const char *json, int expected_rc, const char *needle)
{
    char err[ERR_MSG_MAX] = "";
    struct request *r = NULL;
    int rc = request_parse(&r, json, strlen(json), &limits, err);
    if (rc == 0 || strstr(err, needle) == NULL)
        print_error("request %s: rc %d, message \"%s\", expected to contain \"%s\"\n", json, rc, err, needle);
    assert_int_equal(rc, expected_rc);
    assert_null(r);
    assert_non_null(strstr(err, needle));
}

static void test_request_prompt_gets_defaults(void **state)
{
    (void)state;
    struct request *r = parse_ok("{\"v\":1,\"type\":\"generate\",\"id\":\"a1\",\"prompt\":\"Hello\"}");
    assert_string_equal(r->id, "a1");
    assert_int_equal(r->input, REQUEST_INPUT_PROMPT);
    assert_string_equal(r->prompt, "Hello");
    assert_int_equal(r->prompt_len, 5);
    assert_int_equal(r->max_tokens, 128);
    assert_true(r->temperature == 1.0);
    assert_int_equal(r->top_k, 0);
    assert_true(r->top_p == 1.0);
    assert_true(r->min_p == 0.0);
    assert_false(r->has_seed);
    assert_int_equal(r->n_stop, 0);
    assert_false(r->stream);
    assert_false(r->ignore_eos);
    assert_int_equal(r->spec_k, -1);
    assert_int_equal(r->spec_mode, REQUEST_SPEC_MODE_DEFAULT);
    assert_int_equal(r->draft, REQUEST_DRAFT_DEFAULT);
    assert_int_equal(r->spec_tree, REQUEST_SPEC_TREE_UNSET);
    request_destroy(r);
}

/* spec_tree: "off", "auto" or a node budget 2..32, as a string or a
 * number; anything else refused naming the field. One line a case. */
static void test_request_spec_tree_values(void **state)
{
    (void)state;
    static const struct {
        const char *value; /* the JSON value */
        int want;          /* its reading, or -100: refused */
        const char *why;   /* the refusal's words */
    } cases[] = {
        {"\"off\"", REQUEST_SPEC_TREE_OFF, NULL},
        {"\"auto\"", REQUEST_SPEC_TREE_AUTO, NULL},
        {"2", 2, NULL},                          /* the root and one draft */
        {"32", 32, NULL},                        /* the model's tree limit */
        {"\"16\"", 16, NULL},                    /* a budget as text, as the config writes it */
        {"1", -100, "spec_tree: a node budget must be an integer 2..32 (the last token and the drafts), got 1"},
        {"33", -100, "spec_tree: a node budget must be an integer 2..32"},
        {"4.5", -100, "spec_tree: a node budget must be an integer 2..32"},
        {"\"bushy\"", -100, "spec_tree: expected \"off\", \"auto\" or a node budget 2..32 (the last token and "
                            "the drafts), got \"bushy\""},
        {"\"33\"", -100, "got \"33\""},
        {"\"+8\"", -100, "got \"+8\""},
        {"true", -100, "spec_tree: expected \"off\", \"auto\" or an integer 2..32, got boolean"},
        {"null", -100, "spec_tree: expected \"off\", \"auto\" or an integer 2..32, got null"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[160];
        snprintf(text, sizeof text, "{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"spec_tree\":%s}",
                 cases[i].value);
        if (cases[i].want == -100) {
            parse_bad(text, ERR_INVALID_ARG, cases[i].why);
            continue;
        }
        struct request *r = parse_ok(text);
        assert_int_equal(r->spec_tree, cases[i].want);
        request_destroy(r);
    }
    char buf[12];
    assert_string_equal(request_spec_tree_name(REQUEST_SPEC_TREE_OFF, buf), "off");
    assert_string_equal(request_spec_tree_name(REQUEST_SPEC_TREE_AUTO, buf), "auto");
    assert_string_equal(request_spec_tree_name(24, buf), "24");
}

static void test_request_all_fields_are_read(void **state)
{
    (void)state;
    struct request *r = parse_ok(
        "{\"v\":1,\"type\":\"generate\",\"id\":\"x\",\"prompt_ids\":[1,2,300],\"max_tokens\":7,"
        "\"temperature\":0.5,\"top_k\":40,\"top_p\":0.9,\"min_p\":0.05,\"seed\":42,"
        "\"stop\":[\"\\n\\n\",\"END\"],\"stream\":true,\"spec_k\":4,\"spec_mode\":\"point_mass\",\"ignore_eos\":true}");
    assert_int_equal(r->input, REQUEST_INPUT_IDS);
    assert_int_equal(r->n_prompt_ids, 3);
    assert_int_equal(r->prompt_ids[0], 1);
    assert_int_equal(r->prompt_ids[2], 300);
    assert_int_equal(r->max_tokens, 7);
    assert_true(r->temperature == 0.5);
    assert_int_equal(r->top_k, 40);
    assert_true(r->top_p == 0.9);
    assert_true(r->min_p == 0.05);
    assert_true(r->has_seed);
    assert_true(r->seed == 42);
    assert_int_equal(r->n_stop, 2);
    assert_string_equal(r->stop[0], "\n\n");
    assert_string_equal(r->stop[1], "END");
    assert_true(r->stream);
    assert_true(r->ignore_eos);
    assert_int_equal(r->spec_k, 4);
    assert_int_equal(r->spec_mode, REQUEST_SPEC_MODE_POINT_MASS);
    request_destroy(r);
}

static void test_request_messages_are_read(void **state)
{
    (void)state;
    struct request *r = parse_ok("{\"v\":1,\"type\":\"generate\",\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                                 "{\"role\":\"user\",\"content\":\"Hi\"}],\"temperature\":0}");
    assert_int_equal(r->input, REQUEST_INPUT_MESSAGES);
    assert_int_equal(r->n_messages, 2);
    assert_string_equal(r->messages[0].role, "system");
    assert_string_equal(r->messages[0].content, "Be brief.");
    assert_string_equal(r->messages[1].role, "user");
    assert_string_equal(r->messages[1].content, "Hi");
    assert_true(r->temperature == 0.0);
    request_destroy(r);
}

/* tools and a message's one tool call are read; the forms the template
 * cannot render are refused, named. */
static void test_request_tools_and_tool_calls(void **state)
{
    (void)state;
    struct request *r = parse_ok(
        "{\"v\":1,\"type\":\"generate\",\"messages\":[{\"role\":\"user\",\"content\":\"w?\"},"
        "{\"role\":\"assistant\",\"tool_calls\":[{\"name\":\"f\",\"arguments\":{\"a\":1}}]},"
        "{\"role\":\"tool\",\"content\":\"ok\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}");
    assert_int_equal(r->n_messages, 3);
    assert_null(r->messages[0].tool_call_name);
    assert_string_equal(r->messages[1].tool_call_name, "f");
    assert_string_equal(r->messages[1].content, "");
    assert_int_equal(cJSON_GetObjectItem(r->messages[1].tool_call_arguments, "a")->valueint, 1);
    assert_int_equal(cJSON_GetArraySize(r->tools), 1);
    request_destroy(r);
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"tools\":[{}]}", ERR_INVALID_ARG,
              "tools: only with messages");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[]}",
              ERR_INVALID_ARG, "tools: must hold 1..128");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[1]}",
              ERR_INVALID_ARG, "tools[0]: expected an object");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"messages\":[{\"role\":\"assistant\",\"tool_calls\":"
              "[{\"name\":\"f\",\"arguments\":{}},{\"name\":\"g\",\"arguments\":{}}]}]}",
              ERR_INVALID_ARG, "messages[0].tool_calls: expected an array of exactly one call");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"messages\":[{\"role\":\"assistant\",\"tool_calls\":"
              "[{\"name\":\"\",\"arguments\":{}}]}]}",
              ERR_INVALID_ARG, "messages[0].tool_calls[0].name");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"messages\":[{\"role\":\"assistant\",\"tool_calls\":"
              "[{\"name\":\"f\"}]}]}",
              ERR_INVALID_ARG, "messages[0].tool_calls[0].arguments: required");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"messages\":[{\"role\":\"assistant\",\"tool_calls\":"
              "[{\"name\":\"f\",\"arguments\":{},\"id\":\"c\"}]}]}",
              ERR_INVALID_ARG, "messages[0].tool_calls[0].id: unknown field");
}

static void test_request_seed_as_decimal_string_keeps_all_64_bits(void **state)
{
    (void)state;
    struct request *r = parse_ok("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"seed\":\"18446744073709551615\"}");
    assert_true(r->has_seed);
    assert_true(r->seed == UINT64_MAX);
    request_destroy(r);
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"seed\":\"18446744073709551616\"}", ERR_INVALID_ARG,
              "seed: must be < 2^64");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"seed\":\"12a\"}", ERR_INVALID_ARG, "seed: expected");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"seed\":-1}", ERR_INVALID_ARG, "seed: must be >= 0");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"seed\":1e300}", ERR_INVALID_ARG, "seed:");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"seed\":true}", ERR_INVALID_ARG,
              "seed: expected a number or a decimal string, got boolean");
}

static void test_request_not_json_is_rejected(void **state)
{
    (void)state;
    parse_bad("this is not json", ERR_FORMAT, "request is not valid JSON");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\"", ERR_FORMAT, "request is not valid JSON");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\"} trailing", ERR_FORMAT, "request is not valid JSON");
    parse_bad("", ERR_FORMAT, "request is not valid JSON");
    parse_bad("[1,2,3]", ERR_FORMAT, "request must be a JSON object, got array");
}

static void test_request_envelope_is_checked(void **state)
{
    (void)state;
    parse_bad("{\"type\":\"generate\",\"prompt\":\"x\"}", ERR_FORMAT, "v: required");
    parse_bad("{\"v\":2,\"type\":\"generate\",\"prompt\":\"x\"}", ERR_FORMAT, "v: unsupported protocol version 2");
    parse_bad("{\"v\":\"1\",\"type\":\"generate\",\"prompt\":\"x\"}", ERR_FORMAT, "v: expected a number, got string");
    parse_bad("{\"v\":1,\"prompt\":\"x\"}", ERR_FORMAT, "type: required");
    parse_bad("{\"v\":1,\"type\":\"launch\",\"prompt\":\"x\"}", ERR_FORMAT, "type: unknown message type \"launch\"");
}

static void test_request_missing_prompt_is_rejected(void **state)
{
    (void)state;
    parse_bad("{\"v\":1,\"type\":\"generate\",\"max_tokens\":5}", ERR_INVALID_ARG, "prompt: required");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt\":\"\"}", ERR_INVALID_ARG, "prompt: must not be empty");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt_ids\":[]}", ERR_INVALID_ARG, "prompt_ids: must hold at least one");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"messages\":[]}", ERR_INVALID_ARG, "messages: must hold at least one");
}

static void test_request_two_prompts_are_rejected(void **state)
{
    (void)state;
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"prompt_ids\":[1]}", ERR_INVALID_ARG,
              "exactly one of prompt, messages, prompt_ids");
}

static void test_request_unknown_field_is_rejected(void **state)
{
    (void)state;
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"temprature\":0.5}", ERR_INVALID_ARG,
              "temprature: unknown field");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"name\":\"n\"}]}",
              ERR_INVALID_ARG, "messages[0].name: unknown field");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"max_tokens\":3,\"max_tokens\":4}", ERR_INVALID_ARG,
              "max_tokens: given more than once");
}

/* logprobs, n and the sampling controls: defaults, values read, and every
 * refusal naming its field. */
static void test_request_outputs_and_controls(void **state)
{
    (void)state;
    struct request *r = parse_ok("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\"}");
    assert_int_equal(r->logprobs, -1);
    assert_int_equal(r->n, 1);
    assert_false(sampling_controls_active(&r->ctl));
    request_destroy(r);
    r = parse_ok("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"logprobs\":0,\"n\":16,"
                 "\"presence_penalty\":-2,\"frequency_penalty\":0.5,\"repetition_penalty\":1.3,"
                 "\"logit_bias\":{\"7\":-100,\"0\":2.5}}");
    assert_int_equal(r->logprobs, 0);
    assert_int_equal(r->n, 16);
    assert_true(r->ctl.presence_penalty == -2.0f && r->ctl.frequency_penalty == 0.5f);
    assert_true(r->ctl.repetition_penalty == 1.3f);
    assert_int_equal(r->ctl.n_bias, 2);
    assert_int_equal(r->ctl.bias_ids[0], 7);
    assert_true(r->ctl.bias[1] == 2.5f);
    request_destroy(r);
    static const char *const bad[][2] = {
        {"\"logprobs\":21", "logprobs:"},
        {"\"logprobs\":true", "logprobs:"},
        {"\"n\":0", "n:"},
        {"\"n\":17", "n:"},
        {"\"presence_penalty\":2.01", "presence_penalty:"},
        {"\"frequency_penalty\":\"1\"", "frequency_penalty:"},
        {"\"repetition_penalty\":0", "repetition_penalty:"},
        {"\"repetition_penalty\":11", "repetition_penalty:"},
        {"\"logit_bias\":[]", "logit_bias:"},
        {"\"logit_bias\":{\"-1\":1}", "logit_bias:"},
        {"\"logit_bias\":{\"1x\":1}", "logit_bias:"},
        {"\"logit_bias\":{\"3\":100.5}", "logit_bias:"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char json[256];
        snprintf(json, sizeof json, "{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",%s}", bad[i][0]);
        parse_bad(json, ERR_INVALID_ARG, bad[i][1]);
    }
}

/* grammar: each form read into the spec the workers compile (a schema as
 * its JSON text); each refusal names the field, and for a schema or a
 * grammar text the keyword or the place, as the compiler says it. */
static void test_request_grammar_is_compiled_and_named(void **state)
{
    (void)state;
    struct request *r = parse_ok("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\"}");
    assert_int_equal(r->grammar.kind, GRAMMAR_SPEC_NONE);
    request_destroy(r);
    r = parse_ok("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"grammar\":{\"type\":\"json_schema\","
                 "\"schema\":{\"type\":\"object\",\"properties\":{\"a\":{\"enum\":[1,\"b\"]}}}}}");
    assert_int_equal(r->grammar.kind, GRAMMAR_SPEC_JSON_SCHEMA);
    assert_string_equal(r->grammar.text, "{\"type\":\"object\",\"properties\":{\"a\":{\"enum\":[1,\"b\"]}}}");
    request_destroy(r);
    r = parse_ok("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"grammar\":{\"type\":\"gbnf\","
                 "\"text\":\"root ::= [a-z]+\"}}");
    assert_int_equal(r->grammar.kind, GRAMMAR_SPEC_GBNF);
    assert_string_equal(r->grammar.text, "root ::= [a-z]+");
    request_destroy(r);
    r = parse_ok("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"grammar\":{\"type\":\"json_object\"}}");
    assert_int_equal(r->grammar.kind, GRAMMAR_SPEC_JSON_OBJECT);
    assert_null(r->grammar.text);
    request_destroy(r);
    static const char *const bad[][2] = {
        /* the field's own shape */
        {"\"grammar\":\"root ::= x\"", "grammar: expected an object, got string"},
        {"\"grammar\":{}", "grammar.type: required"},
        {"\"grammar\":{\"type\":\"regex\"}", "grammar.type: must be"},
        {"\"grammar\":{\"type\":\"gbnf\"}", "grammar.text: required"},
        {"\"grammar\":{\"type\":\"gbnf\",\"text\":\"a\",\"x\":1}", "grammar.x: unknown field"},
        {"\"grammar\":{\"type\":\"json_schema\"}", "grammar.schema: required"},
        {"\"grammar\":{\"type\":\"json_schema\",\"schema\":\"{}\"}", "grammar.schema: required"},
        /* a schema's text travels only between processes */
        {"\"grammar\":{\"type\":\"json_schema\",\"text\":\"{}\"}", "grammar.text: unknown field"},
        {"\"grammar\":{\"type\":\"json_object\",\"schema\":{}}", "grammar.schema: unknown field"},
        /* what the compilers refuse, with the keyword and where */
        {"\"grammar\":{\"type\":\"json_schema\",\"schema\":{\"properties\":{\"age\":{\"minimum\":0}}}}",
         "grammar.schema.properties.age: unsupported keyword 'minimum'"},
        {"\"grammar\":{\"type\":\"json_schema\",\"schema\":{\"type\":\"array\",\"prefixItems\":[]}}",
         "'prefixItems'"},
        {"\"grammar\":{\"type\":\"json_schema\",\"schema\":{\"type\":\"object\",\"required\":[\"a\"]}}", "'a'"},
        {"\"grammar\":{\"type\":\"json_schema\",\"schema\":false}", "grammar.schema"},
        {"\"grammar\":{\"type\":\"gbnf\",\"text\":\"root ::= \\\"a\"}", "grammar"},
        {"\"grammar\":{\"type\":\"gbnf\",\"text\":\"item ::= [a-z]\"}", "root"},
        {"\"grammar\":{\"type\":\"gbnf\",\"text\":\"root ::= root \\\"a\\\"\"}", "root"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char json[512];
        snprintf(json, sizeof json, "{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",%s}", bad[i][0]);
        parse_bad(json, ERR_INVALID_ARG, bad[i][1]);
    }
}

/* prediction: the text, as a string or OpenAI's {"type": "content",
 * "content": text}; other shapes named. */
static void test_request_prediction_forms(void **state)
{
    (void)state;
    struct request *r = parse_ok("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"prediction\":\"abc\"}");
    assert_string_equal(r->prediction, "abc");
    assert_int_equal(r->prediction_len, 3);
    request_destroy(r);
    r = parse_ok("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"prediction\":{\"type\":\"content\","
                 "\"content\":\"de\"}}");
    assert_string_equal(r->prediction, "de");
    request_destroy(r);
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"prediction\":5}", ERR_INVALID_ARG,
              "prediction: expected a string");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"prediction\":{\"type\":\"text\","
              "\"content\":\"a\"}}", ERR_INVALID_ARG, "prediction.type: must be \"content\"");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"prediction\":{\"type\":\"content\","
              "\"content\":\"a\",\"z\":1}}", ERR_INVALID_ARG, "prediction.z: unknown field");
}

static void test_request_wrong_types_are_named(void **state)
{
    (void)state;
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"temperature\":\"hot\"}", ERR_INVALID_ARG,
              "temperature: expected a number, got string");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt\":5}", ERR_INVALID_ARG, "prompt: expected a string, got number");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"max_tokens\":\"10\"}", ERR_INVALID_ARG,
              "max_tokens: expected a number, got string");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"max_tokens\":2.5}", ERR_INVALID_ARG,
              "max_tokens: expected an integer");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"stream\":1}", ERR_INVALID_ARG,
              "stream: expected a boolean, got number");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"ignore_eos\":\"yes\"}", ERR_INVALID_ARG,
              "ignore_eos: expected a boolean, got string");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"stop\":\"END\"}", ERR_INVALID_ARG,
              "stop: expected an array of strings, got string");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"stop\":[3]}", ERR_INVALID_ARG,
              "stop[0]: expected a string, got number");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt_ids\":[1,\"2\"]}", ERR_INVALID_ARG,
              "prompt_ids[1]: expected a number, got string");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt_ids\":{\"a\":1}}", ERR_INVALID_ARG,
              "prompt_ids: expected an array, got object");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"messages\":[\"hi\"]}", ERR_INVALID_ARG,
              "messages[0]: expected an object, got string");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"messages\":[{\"role\":\"user\",\"content\":null}]}", ERR_INVALID_ARG,
              "messages[0].content: expected a string, got null");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"messages\":[{\"content\":\"x\"}]}", ERR_INVALID_ARG,
              "messages[0].role: required");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"id\":7}", ERR_INVALID_ARG,
              "id: expected a string, got number");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"spec_mode\":1}", ERR_INVALID_ARG,
              "spec_mode: expected a string, got number");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"draft\":\"medusa\"}", ERR_INVALID_ARG,
              "draft: expected \"auto\", \"model\", \"ngram\", \"suffix\" or \"none\", got \"medusa\"");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"draft\":2}", ERR_INVALID_ARG,
              "draft: expected a string, got number");
    const char *names[5] = {"model", "ngram", "none", "suffix", "auto"};
    const enum request_draft want[5] = {REQUEST_DRAFT_MODEL, REQUEST_DRAFT_NGRAM, REQUEST_DRAFT_NONE,
                                        REQUEST_DRAFT_SUFFIX, REQUEST_DRAFT_AUTO};
    for (int i = 0; i < 5; i++) {
        char text[128];
        snprintf(text, sizeof text, "{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"draft\":\"%s\"}", names[i]);
        struct request *r = parse_ok(text);
        assert_int_equal(r->draft, want[i]);
        assert_string_equal(request_draft_name(r->draft), names[i]);
        request_destroy(r);
    }
}

static void test_request_max_tokens_out_of_range_is_rejected(void **state)
{
    (void)state;
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"max_tokens\":0}", ERR_INVALID_ARG,
              "max_tokens: must be >= 1, got 0");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"max_tokens\":-5}", ERR_INVALID_ARG,
              "max_tokens: must be >= 1, got -5");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"max_tokens\":4097}", ERR_INVALID_ARG,
              "max_tokens: must be <= 4096, got 4097");
    struct request *r = parse_ok("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"max_tokens\":4096}");
    assert_int_equal(r->max_tokens, 4096);
    request_destroy(r);
}

static void test_request_bad_sampling_values_are_rejected(void **state)
{
    (void)state;
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"temperature\":-0.1}", ERR_INVALID_ARG,
              "temperature: must be in [0, 1e+06], got -0.1");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"top_k\":-1}", ERR_INVALID_ARG, "top_k: must be >= 0");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"top_p\":0}", ERR_INVALID_ARG,
              "top_p: must be in (0, 1], got 0");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"top_p\":1.5}", ERR_INVALID_ARG,
              "top_p: must be in (0, 1], got 1.5");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"min_p\":-0.5}", ERR_INVALID_ARG,
              "min_p: must be in [0, 1]");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"min_p\":2}", ERR_INVALID_ARG, "min_p: must be in [0, 1]");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"spec_k\":17}", ERR_INVALID_ARG,
              "spec_k: must be <= 16, got 17");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"spec_mode\":\"fast\"}", ERR_INVALID_ARG,
              "spec_mode: expected \"sampled\" or \"point_mass\"");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt_ids\":[-3]}", ERR_INVALID_ARG, "prompt_ids[0]: must be >= 0");
}

static void test_request_stop_limits_are_enforced(void **state)
{
    (void)state;
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"stop\":[\"\"]}", ERR_INVALID_ARG,
              "stop[0]: must not be empty");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"stop\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\"]}",
              ERR_INVALID_ARG, "stop: at most 8 strings, got 9");
    char json[1024];
    char big[300];
    memset(big, 'a', 257);
    big[257] = '\0';
    snprintf(json, sizeof(json), "{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"stop\":[\"ok\",\"%s\"]}", big);
    parse_bad(json, ERR_INVALID_ARG, "stop[1]: at most 256 bytes, got 257");
}

static void test_request_stats_envelope_and_peek_id(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX];
    cJSON *root = NULL;
    enum request_kind kind = REQUEST_KIND_GENERATE;
    const char *stats = "{\"v\":1,\"type\":\"stats\",\"id\":\"s\"}";
    assert_int_equal(request_parse_envelope(stats, strlen(stats), &root, &kind, err), 0);
    assert_int_equal(kind, REQUEST_KIND_STATS);
    assert_string_equal(request_peek_id(root), "s");
    cJSON_Delete(root);
    /* A failed type check still leaves the tree, so the reply can carry the id. */
    const char *bad = "{\"v\":1,\"type\":\"nope\",\"id\":\"q7\"}";
    assert_int_equal(request_parse_envelope(bad, strlen(bad), &root, &kind, err), ERR_FORMAT);
    assert_non_null(root);
    assert_string_equal(request_peek_id(root), "q7");
    cJSON_Delete(root);
    /* The message need not be NUL-terminated. */
    const char text[] = "{\"v\":1,\"type\":\"generate\",\"prompt\":\"abc\"}XXXX";
    struct request *r = NULL;
    assert_int_equal(request_parse(&r, text, sizeof(text) - 1 - 4, &limits, err), 0);
    assert_string_equal(r->prompt, "abc");
    request_destroy(r);
    request_destroy(NULL);
}

/* Issue 15: cJSON's lenience does not reach a request (json_check first). */
static void test_request_strict_json_is_enforced(void **state)
{
    (void)state;
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt\":\"ab\\u0000cd\"}", ERR_FORMAT,
              "\\u0000 in a string: NUL characters are not accepted");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt\":\"a\tb\"}", ERR_FORMAT,
              "raw control character 0x09");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt\":\"\xff\"}", ERR_FORMAT, "invalid UTF-8");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"messages\":[{\"role\":\"user\",\"content\":\"x\","
              "\"content\":\"y\"}]}", ERR_INVALID_ARG, "messages[0].content: given more than once");
    parse_bad("{\"v\":1,\"v\":1,\"type\":\"generate\",\"prompt\":\"x\"}", ERR_INVALID_ARG,
              "v: given more than once");
    /* a raw NUL inside a string: the length is explicit */
    const char nul[] = "{\"v\":1,\"type\":\"generate\",\"prompt\":\"a\0b\"}";
    char err[ERR_MSG_MAX] = "";
    struct request *r = NULL;
    assert_int_equal(request_parse(&r, nul, sizeof nul - 1, &limits, err), ERR_FORMAT);
    assert_non_null(strstr(err, "raw control character 0x00"));
}

/* Every message that quotes client text is valid UTF-8, and an id that is
 * not valid UTF-8 is never echoed. */
static void test_request_errors_quote_client_text_as_valid_utf8(void **state)
{
    (void)state;
    char json[1024], err[ERR_MSG_MAX];
    char name[400] = "";
    for (int i = 0; i < 100; i++)
        strcat(name, "\xc3\xa9"); /* é: 2 bytes; cuts at 32 or 64 bytes fall inside one if odd */
    strcat(name, "x");
    const char *fmts[] = {
        "{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"a%s\":1}",
        "{\"v\":1,\"type\":\"generate\",\"messages\":[{\"role\":\"u\",\"content\":\"x\",\"a%s\":1}]}",
        "{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"spec_mode\":\"a%s\"}",
        "{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"seed\":\"a%s\"}",
        "{\"v\":1,\"type\":\"a%s\"}",
        "{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"a%s\":1,\"a%s\":2}",
    };
    for (size_t i = 0; i < sizeof fmts / sizeof fmts[0]; i++) {
        snprintf(json, sizeof json, fmts[i], name, name);
        struct request *r = NULL;
        int rc = request_parse(&r, json, strlen(json), &limits, err);
        assert_int_not_equal(rc, 0);
        if (!utf8_valid((const uint8_t *)err, strlen(err), NULL))
            fail_msg("case %zu: message is not valid UTF-8: %s", i, err);
    }
    /* an id that is not valid UTF-8 is not peeked */
    const char *bad_id = "{\"v\":1,\"type\":\"stats\",\"id\":\"\xc3\"}";
    cJSON *root = NULL;
    enum request_kind kind;
    assert_int_equal(request_parse_envelope(bad_id, strlen(bad_id), &root, &kind, err), ERR_FORMAT);
    assert_string_equal(request_peek_id(root), "");
    cJSON_Delete(root);
    /* a refused message still names a valid id for the reply */
    const char *dup = "{\"v\":1,\"type\":\"generate\",\"id\":\"r1\",\"top_k\":1,\"top_k\":2}";
    assert_int_equal(request_parse_envelope(dup, strlen(dup), &root, &kind, err), ERR_INVALID_ARG);
    assert_string_equal(request_peek_id(root), "r1");
    cJSON_Delete(root);
}

/* What the coordinator accepts is exactly what the workers run: the limits
 * of sampling.h, floats as the sampler sees them, spec_k up to what the
 * draft drafts. */
static void test_request_sampling_limits_match_the_workers(void **state)
{
    (void)state;
    struct request *r = parse_ok("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"temperature\":1e6,"
                                 "\"top_k\":1073741824,\"top_p\":1e-40,\"min_p\":1e-50}");
    struct sampling_params sp;
    char err[ERR_MSG_MAX];
    assert_int_equal(sampling_params_set(&sp, r->temperature, r->top_k, r->top_p, r->min_p, err), 0);
    assert_int_equal(sampling_params_validate(&sp, err), 0);
    request_destroy(r);
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"temperature\":1000001}", ERR_INVALID_ARG,
              "temperature: must be in [0, 1e+06], got 1e+06");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"temperature\":1e300}", ERR_INVALID_ARG,
              "temperature: must be in [0, 1e+06]");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"top_k\":1073741825}", ERR_INVALID_ARG,
              "top_k: must be <= 1073741824");
    parse_bad("{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"top_p\":1e-50}", ERR_INVALID_ARG,
              "top_p: 1e-50 is 0 as a 32-bit float");
    /* spec_k: at most what the server drafts per round */
    const struct request_limits k8 = {.max_tokens_max = 100, .spec_k_max = 8};
    const char *k9 = "{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"spec_k\":9}";
    assert_int_equal(request_parse(&r, k9, strlen(k9), &k8, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "spec_k: must be <= 8 (this server drafts at most coordinator.spec_k_max"));
    const char *ok8 = "{\"v\":1,\"type\":\"generate\",\"prompt\":\"x\",\"spec_k\":8}";
    assert_int_equal(request_parse(&r, ok8, strlen(ok8), &k8, err), 0);
    assert_int_equal(r->spec_k, 8);
    request_destroy(r);
}

/* The id of text too large to parse: read from the top-level object only,
 * past values of every kind, and only when it is a plain string. */
static void test_request_peek_id_text(void **state)
{
    (void)state;
    char out[REQUEST_ID_MAX + 1];
    static const struct {
        const char *text, *want;
    } cases[] = {
        {"{\"id\": \"req-1\", \"prompt\": \"x\"}", "req-1"},
        {"{\"v\":1,\"type\":\"generate\",\"prompt\":\"a,b}\\\"id\\\":\\\"no\",\"id\":\"late\"}", "late"},
        {"  {\"messages\":[{\"id\":\"inner\"},[1,{\"x\":\"}\"}]],\"id\":\"outer\"}", "outer"},
        {"{\"prompt_ids\":[1,2,3,", ""},                  /* cut before any id */
        {"{\"id\":\"cut", ""},                              /* the id never ends */
        {"{\"id\":\"a\\\"b\"}", ""},                    /* an escape: not echoed */
        {"{\"id\":7}", ""},                                  /* not a string */
        {"[\"id\",\"x\"]", ""},                            /* not an object */
        {"{\"idx\":\"n\",\"i\":\"m\"}", ""},           /* other keys only */
        {"{\"id\":\"\xff\xfe\"}", ""},                   /* invalid UTF-8 */
        {"", ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *got = request_peek_id_text(cases[i].text, strlen(cases[i].text), out, sizeof out);
        if (strcmp(got, cases[i].want) != 0)
            fail_msg("case %zu (%s): got \"%s\", want \"%s\"", i, cases[i].text, got, cases[i].want);
    }
    /* an id longer than the limit is not echoed; one at the limit is */
    char text[REQUEST_ID_MAX + 32], id[REQUEST_ID_MAX + 2];
    for (int len = REQUEST_ID_MAX; len <= REQUEST_ID_MAX + 1; len++) {
        memset(id, 'k', (size_t)len);
        id[len] = '\0';
        snprintf(text, sizeof text, "{\"id\":\"%s\"}", id);
        request_peek_id_text(text, strlen(text), out, sizeof out);
        assert_string_equal(out, len == REQUEST_ID_MAX ? id : "");
    }
    /* every prefix of a message: never reads past its length */
    const char *full = "{\"v\":1,\"prompt\":\"long text\",\"stop\":[\"a\",\"b\"],\"id\":\"whole\"}";
    for (size_t n = 0; n <= strlen(full); n++) {
        char *copy = malloc(n ? n : 1);
        assert_non_null(copy);
        memcpy(copy, full, n);
        request_peek_id_text(copy, n, out, sizeof out);
        assert_string_equal(out, n == strlen(full) || n >= strlen(full) - 1 ? "whole" : "");
        free(copy);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_request_prompt_gets_defaults),
        cmocka_unit_test(test_request_all_fields_are_read),
        cmocka_unit_test(test_request_spec_tree_values),
        cmocka_unit_test(test_request_outputs_and_controls),
        cmocka_unit_test(test_request_messages_are_read),
        cmocka_unit_test(test_request_tools_and_tool_calls),
        cmocka_unit_test(test_request_seed_as_decimal_string_keeps_all_64_bits),
        cmocka_unit_test(test_request_not_json_is_rejected),
        cmocka_unit_test(test_request_envelope_is_checked),
        cmocka_unit_test(test_request_missing_prompt_is_rejected),
        cmocka_unit_test(test_request_two_prompts_are_rejected),
        cmocka_unit_test(test_request_unknown_field_is_rejected),
        cmocka_unit_test(test_request_wrong_types_are_named),
        cmocka_unit_test(test_request_grammar_is_compiled_and_named),
        cmocka_unit_test(test_request_prediction_forms),
        cmocka_unit_test(test_request_max_tokens_out_of_range_is_rejected),
        cmocka_unit_test(test_request_bad_sampling_values_are_rejected),
        cmocka_unit_test(test_request_stop_limits_are_enforced),
        cmocka_unit_test(test_request_stats_envelope_and_peek_id),
        cmocka_unit_test(test_request_strict_json_is_enforced),
        cmocka_unit_test(test_request_errors_quote_client_text_as_valid_utf8),
        cmocka_unit_test(test_request_sampling_limits_match_the_workers),
        cmocka_unit_test(test_request_peek_id_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
