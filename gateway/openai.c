/* openai.c: OpenAI request validation and response shapes (see openai.h).
 *
 * Field policy, per endpoint: a table of known fields says what each one
 * becomes. Fields Tandem implements are translated (max_completion_tokens
 * and max_tokens -> max_tokens, stop as a string -> a list); fields that
 * change nothing at their neutral value (n = 1, echo = false, ...) are
 * accepted only at that value; fields Tandem cannot honour (tools,
 * prediction, ...) are a 400 naming them. response_format becomes the
 * native "grammar", compiled here so that an unsupported schema keyword is
 * a 400 naming it under response_format. Unknown fields are accepted
 * and listed in openai_request.ignored (frontends and evaluation harnesses
 * send vendor extras written for vLLM's server, which accepts unknown fields
 * and logs them), or a 400 naming them under policy->strict_fields (what
 * OpenAI's own API does). JSON
 * null means "not given", as in OpenAI's API; so does an absent "model"
 * (the served one).
 */
#include "openai.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "json_check.h"
#include "json_type.h"
#include "grammar_spec.h"
#include "request.h"
#include "sampling.h"
#include "utf8.h"

#define E400 400
#define INVALID "invalid_request_error"

/* Makes buf (a C string in size bytes) valid UTF-8: invalid bytes become
 * U+FFFD and the result is cut at a character boundary to fit. Error texts
 * quote client bytes (a field name, a role) and are cut to fixed buffers;
 * what goes back must be UTF-8 JSON whatever the client sent. */
static void utf8_fix(char *buf, size_t size)
{
    size_t n = strlen(buf);
    if (utf8_valid((const uint8_t *)buf, n, NULL))
        return;
    uint8_t fixed[3 * OPENAI_MESSAGE_MAX];
    if (n > OPENAI_MESSAGE_MAX)
        n = OPENAI_MESSAGE_MAX;
    size_t m = utf8_repair((const uint8_t *)buf, n, fixed);
    m = utf8_cut_len(fixed, m, size - 1);
    memcpy(buf, fixed, m);
    buf[m] = '\0';
}

int openai_error_set(struct openai_error *e, int status, const char *type, const char *code, const char *param,
                     const char *fmt, ...)
{
    e->status = status;
    e->type = type;
    snprintf(e->code, sizeof(e->code), "%s", code ? code : "");
    snprintf(e->param, sizeof(e->param), "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof(e->message), fmt, ap);
    va_end(ap);
    utf8_fix(e->code, sizeof(e->code));
    utf8_fix(e->param, sizeof(e->param));
    utf8_fix(e->message, sizeof(e->message));
    return status;
}

enum field_rule {
    F_MODEL,
    F_MESSAGES,
    F_PROMPT,
    F_MAX_TOKENS,
    F_NUMBER,         /* passed through under the same name */
    F_INTEGER,        /* passed through under the same name */
    F_DRAFT,          /* the draft source (an extension): one of request.h's names, passed through */
    F_SPEC_TREE,      /* token trees (an extension): "off", "auto" or a node budget, passed through */
    F_SEED,
    F_STOP,
    F_STREAM,
    F_STREAM_OPTIONS,
    F_ONE,            /* best_of: 1 only */
    F_N,              /* n: 1..16 choices, passed through */
    F_FALSE,          /* echo: false only */
    F_LOGPROBS,       /* chat: a boolean; completions: the top count 0..20 */
    F_TOP_LOGPROBS,   /* chat: the top count 0..20, with logprobs true */
    F_LOGIT_BIAS,     /* an object, passed through (the coordinator checks it) */
    F_BOOL,           /* passed through when true (ignore_eos, vLLM's extension) */
    F_IGNORED,        /* user: a string of metadata with no effect on generation */
    F_RESPONSE_FORMAT, /* text, json_object, json_schema -> the native "grammar" (compiled here) */
    F_PREDICTION,     /* {"type": "content", "content": text or text parts} -> the native "prediction" */
    F_TOOLS,          /* tools, tool_choice, parallel_tool_calls: kept, translated together (openai_tools.c) */
    F_UNSUPPORTED,    /* any non-null value is a 400 */
};

struct field {
    const char *name;
    enum field_rule rule;
    unsigned kinds;   /* bit 1 << OPENAI_CHAT, 1 << OPENAI_COMPLETION */
};

#define CHAT (1u << OPENAI_CHAT)
#define COMP (1u << OPENAI_COMPLETION)

static const struct field fields[] = {
    {"model", F_MODEL, CHAT | COMP},
    {"messages", F_MESSAGES, CHAT},
    {"prompt", F_PROMPT, COMP},
    {"max_tokens", F_MAX_TOKENS, CHAT | COMP},
    {"max_completion_tokens", F_MAX_TOKENS, CHAT},
    {"temperature", F_NUMBER, CHAT | COMP},
    {"top_p", F_NUMBER, CHAT | COMP},
    {"min_p", F_NUMBER, CHAT | COMP},
    {"top_k", F_INTEGER, CHAT | COMP},
    {"spec_k", F_INTEGER, CHAT | COMP},
    {"draft", F_DRAFT, CHAT | COMP},
    {"spec_tree", F_SPEC_TREE, CHAT | COMP},
    {"seed", F_SEED, CHAT | COMP},
    {"stop", F_STOP, CHAT | COMP},
    {"stream", F_STREAM, CHAT | COMP},
    {"stream_options", F_STREAM_OPTIONS, CHAT | COMP},
    {"n", F_N, CHAT | COMP},
    {"best_of", F_ONE, COMP},
    {"logprobs", F_LOGPROBS, CHAT | COMP},
    {"top_logprobs", F_TOP_LOGPROBS, CHAT},
    {"echo", F_FALSE, COMP},
    {"suffix", F_UNSUPPORTED, COMP},
    {"presence_penalty", F_NUMBER, CHAT | COMP},
    {"frequency_penalty", F_NUMBER, CHAT | COMP},
    {"repetition_penalty", F_NUMBER, CHAT | COMP},
    {"ignore_eos", F_BOOL, CHAT | COMP},
    {"logit_bias", F_LOGIT_BIAS, CHAT | COMP},
    {"user", F_IGNORED, CHAT | COMP},
    {"tools", F_TOOLS, CHAT},
    {"tool_choice", F_TOOLS, CHAT},
    {"parallel_tool_calls", F_TOOLS, CHAT},
    {"functions", F_UNSUPPORTED, CHAT},
    {"function_call", F_UNSUPPORTED, CHAT},
    {"response_format", F_RESPONSE_FORMAT, CHAT | COMP},
    {"modalities", F_UNSUPPORTED, CHAT},
    {"audio", F_UNSUPPORTED, CHAT},
    {"prediction", F_PREDICTION, CHAT | COMP},
    {"reasoning_effort", F_UNSUPPORTED, CHAT},
    {"web_search_options", F_UNSUPPORTED, CHAT},
    {"store", F_UNSUPPORTED, CHAT},
    {"metadata", F_UNSUPPORTED, CHAT},
    {"service_tier", F_UNSUPPORTED, CHAT | COMP},
};

static int bad(struct openai_error *e, const char *param, const char *fmt, const char *a, const char *b)
{
    openai_error_set(e, E400, INVALID, NULL, param, fmt, a, b);
    return -1;
}

/* cJSON reads a number beyond a double's range (1e999) as infinity, which
 * it would print as null: said here, or the coordinator would answer "got
 * null" about a number. */
static int expect_finite(const cJSON *v, const char *name, struct openai_error *e)
{
    if (!isfinite(v->valuedouble))
        return bad(e, name, "%s: the number is not finite (beyond the range of a double, about 1.8e308)%s", name,
                   "");
    return 0;
}

static int expect_number(const cJSON *v, const char *name, struct openai_error *e)
{
    if (!cJSON_IsNumber(v))
        return bad(e, name, "%s: expected a number, got %s", name, json_type_name(v));
    return expect_finite(v, name, e);
}

static int expect_integer(const cJSON *v, const char *name, struct openai_error *e);

/* logprobs (completions), top_logprobs (chat): 0..SAMPLING_TOP_LOGPROBS_MAX. */
static int expect_top_count(const cJSON *v, const char *name, struct openai_error *e)
{
    if (expect_integer(v, name, e) != 0)
        return -1;
    if (v->valuedouble < 0 || v->valuedouble > SAMPLING_TOP_LOGPROBS_MAX)
        return bad(e, name, "%s: must be in 0..20, got %s", name, v->valuedouble < 0 ? "less" : "more");
    return 0;
}

static int expect_integer(const cJSON *v, const char *name, struct openai_error *e)
{
    if (!cJSON_IsNumber(v))
        return bad(e, name, "%s: expected an integer, got %s", name, json_type_name(v));
    if (expect_finite(v, name, e) != 0)
        return -1;
    if (v->valuedouble != floor(v->valuedouble) || fabs(v->valuedouble) > 9.0e15)
        return bad(e, name, "%s: expected an integer%s", name, "");
    return 0;
}

/* The text of one chat message's content: a string, null, or an array of
 * {"type":"text","text":...} parts (joined). Returns a malloc'd string. */
static char *message_content(const cJSON *content, int index, struct openai_error *e)
{
    char param[OPENAI_PARAM_MAX];
    snprintf(param, sizeof(param), "messages[%d].content", index);
    if (content == NULL || cJSON_IsNull(content))
        return strdup("");
    if (cJSON_IsString(content))
        return strdup(content->valuestring);
    if (!cJSON_IsArray(content)) {
        bad(e, param, "%s: expected a string or an array of text parts, got %s", param, json_type_name(content));
        return NULL;
    }
    size_t total = 1;
    const cJSON *part = NULL;
    int i = 0;
    cJSON_ArrayForEach(part, content) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsObject(part) || !cJSON_IsString(type) || strcmp(type->valuestring, "text") != 0 ||
            !cJSON_IsString(text)) {
            char p[OPENAI_PARAM_MAX + 16];
            snprintf(p, sizeof(p), "%s[%d]", param, i);
            bad(e, p, "%s: only {\"type\": \"text\", \"text\": ...} parts are supported%s", p, "");
            return NULL;
        }
        total += strlen(text->valuestring);
        i++;
    }
    char *out = malloc(total);
    if (out == NULL) {
        openai_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        return NULL;
    }
    out[0] = '\0';
    cJSON_ArrayForEach(part, content) strcat(out, cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring);
    return out;
}

/* An assistant message's "tool_calls" as the native one call
 * {"name", "arguments": the parsed JSON}: the Llama 3.x template renders
 * one call a turn, and its arguments as JSON, not as the string. */
static int translate_tool_calls(const cJSON *calls, const char *param, cJSON *o, struct openai_error *e)
{
    char p[OPENAI_PARAM_MAX + 48];
    snprintf(p, sizeof(p), "%s.tool_calls", param);
    if (!cJSON_IsArray(calls))
        return bad(e, p, "%s: expected an array, got %s", p, json_type_name(calls));
    if (cJSON_GetArraySize(calls) == 0)
        return 0;
    if (cJSON_GetArraySize(calls) > 1)
        return bad(e, p, "%s: at most one call a message (the Llama 3.x template renders one a turn)%s", p, "");
    const cJSON *c = calls->child;
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(c, "type");
    if (!cJSON_IsObject(c) || !cJSON_IsObject(fn) || !cJSON_IsString(name) || !cJSON_IsString(args) ||
        (type != NULL && (!cJSON_IsString(type) || strcmp(type->valuestring, "function") != 0)))
        return bad(e, p, "%s[0]: expected {\"id\", \"type\": \"function\", \"function\": {\"name\": string, "
                   "\"arguments\": string}}%s", p, "");
    char why[ERR_MSG_MAX];
    cJSON *parsed = NULL;
    if (json_check(args->valuestring, strlen(args->valuestring), why) == 0)
        parsed = cJSON_Parse(args->valuestring);
    if (parsed == NULL)
        return bad(e, p, "%s[0].function.arguments: not valid JSON (it is the call's arguments as JSON text)%s",
                   p, "");
    cJSON *arr = cJSON_AddArrayToObject(o, "tool_calls");
    cJSON *one = cJSON_CreateObject();
    if (arr == NULL || one == NULL || !cJSON_AddItemToArray(arr, one) ||
        !cJSON_AddStringToObject(one, "name", name->valuestring) || !cJSON_AddItemToObject(one, "arguments", parsed)) {
        if (one == NULL || arr == NULL)
            cJSON_Delete(one);
        cJSON_Delete(parsed);
        return openai_error_set(e, 500, "server_error", NULL, NULL, "out of memory"), -1;
    }
    return 0;
}

/* The fields a message of role r may carry besides role and content. */
static bool message_field_ok(const char *r, const char *field)
{
    return strcmp(field, "role") == 0 || strcmp(field, "content") == 0 ||
           (strcmp(r, "assistant") == 0 && strcmp(field, "tool_calls") == 0) ||
           (strcmp(r, "tool") == 0 && strcmp(field, "tool_call_id") == 0);
}

static int translate_message(const cJSON *m, int i, cJSON *out, struct openai_error *e)
{
    char param[OPENAI_PARAM_MAX];
    snprintf(param, sizeof(param), "messages[%d]", i);
    if (!cJSON_IsObject(m))
        return bad(e, param, "%s: expected an object, got %s", param, json_type_name(m));
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
    char rparam[OPENAI_PARAM_MAX + 8];
    snprintf(rparam, sizeof(rparam), "%s.role", param);
    if (!cJSON_IsString(role))
        return bad(e, rparam, "%s: expected a string, got %s", rparam, json_type_name(role));
    const char *r = role->valuestring;
    if (strcmp(r, "developer") == 0)
        r = "system"; /* OpenAI's newer name for the system role */
    if (strcmp(r, "system") != 0 && strcmp(r, "user") != 0 && strcmp(r, "assistant") != 0 && strcmp(r, "tool") != 0)
        return bad(e, rparam, "%s: must be system, developer, user, assistant or tool, got \"%.32s\"", rparam,
                   role->valuestring);
    const cJSON *f = NULL;
    cJSON_ArrayForEach(f, m) {
        if (!message_field_ok(r, f->string)) {
            char p[OPENAI_PARAM_MAX + 64];
            snprintf(p, sizeof(p), "%s.%.48s", param, f->string);
            return bad(e, p, "%s: not supported (messages carry role and content; assistant messages "
                       "tool_calls, tool messages tool_call_id)%s", p, "");
        }
    }
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(m, "tool_call_id");
    if (id != NULL && !cJSON_IsString(id))
        return bad(e, param, "%s.tool_call_id: expected a string, got %s", param, json_type_name(id));
    char *content = message_content(cJSON_GetObjectItemCaseSensitive(m, "content"), i, e);
    if (content == NULL)
        return -1;
    cJSON *o = cJSON_CreateObject();
    if (o == NULL || cJSON_AddStringToObject(o, "role", r) == NULL ||
        cJSON_AddStringToObject(o, "content", content) == NULL || !cJSON_AddItemToArray(out, o)) {
        cJSON_Delete(o);
        free(content);
        return openai_error_set(e, 500, "server_error", NULL, NULL, "out of memory"), -1;
    }
    free(content);
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
    if (calls != NULL && !cJSON_IsNull(calls))
        return translate_tool_calls(calls, param, o, e);
    return 0;
}

static int translate_messages(const cJSON *v, cJSON *gen, struct openai_error *e)
{
    if (!cJSON_IsArray(v))
        return bad(e, "messages", "messages: expected an array, got %s%s", json_type_name(v), "");
    if (cJSON_GetArraySize(v) == 0)
        return bad(e, "messages", "messages: must not be empty%s%s", "", "");
    cJSON *out = cJSON_AddArrayToObject(gen, "messages");
    if (out == NULL)
        return openai_error_set(e, 500, "server_error", NULL, NULL, "out of memory"), -1;
    const cJSON *m = NULL;
    int i = 0;
    cJSON_ArrayForEach(m, v) {
        if (translate_message(m, i, out, e) != 0)
            return -1;
        i++;
    }
    return 0;
}

/* prompt: a string, a list of one string, a list of token ids, or a list
 * of one list of token ids. */
static int translate_prompt(const cJSON *v, cJSON *gen, struct openai_error *e)
{
    if (cJSON_IsArray(v) && cJSON_GetArraySize(v) == 1 &&
        (cJSON_IsString(v->child) || cJSON_IsArray(v->child)))
        v = v->child;
    else if (cJSON_IsArray(v) && cJSON_GetArraySize(v) > 1 && !cJSON_IsNumber(v->child))
        return bad(e, "prompt", "prompt: only one prompt per request is supported (got %s)%s",
                   cJSON_GetArraySize(v) == 2 ? "2" : "several", "");
    if (cJSON_IsString(v)) {
        if (v->valuestring[0] == '\0')
            return bad(e, "prompt", "prompt: must not be empty%s%s", "", "");
        return cJSON_AddStringToObject(gen, "prompt", v->valuestring) ? 0
               : (openai_error_set(e, 500, "server_error", NULL, NULL, "out of memory"), -1);
    }
    if (cJSON_IsArray(v)) {
        if (cJSON_GetArraySize(v) == 0)
            return bad(e, "prompt", "prompt: must not be empty%s%s", "", "");
        const cJSON *id = NULL;
        cJSON_ArrayForEach(id, v) {
            if (!cJSON_IsNumber(id) || id->valuedouble != floor(id->valuedouble) || id->valuedouble < 0 ||
                id->valuedouble > 2147483647.0)
                return bad(e, "prompt", "prompt: a token-id list must hold non-negative integers%s%s", "", "");
        }
        cJSON *ids = cJSON_Duplicate(v, 1);
        if (ids == NULL || !cJSON_AddItemToObject(gen, "prompt_ids", ids)) {
            cJSON_Delete(ids);
            return openai_error_set(e, 500, "server_error", NULL, NULL, "out of memory"), -1;
        }
        return 0;
    }
    return bad(e, "prompt", "prompt: expected a string or a list of token ids, got %s%s", json_type_name(v), "");
}

static int translate_stop(const cJSON *v, cJSON *gen, struct openai_error *e)
{
    cJSON *list = NULL;
    if (cJSON_IsString(v)) {
        list = cJSON_CreateArray();
        if (list != NULL)
            cJSON_AddItemToArray(list, cJSON_CreateString(v->valuestring));
    } else if (cJSON_IsArray(v)) {
        const cJSON *s = NULL;
        cJSON_ArrayForEach(s, v) {
            if (!cJSON_IsString(s))
                return bad(e, "stop", "stop: expected strings, got %s%s", json_type_name(s), "");
        }
        list = cJSON_Duplicate(v, 1);
    } else {
        return bad(e, "stop", "stop: expected a string or a list of strings, got %s%s", json_type_name(v), "");
    }
    if (list == NULL || !cJSON_AddItemToObject(gen, "stop", list)) {
        cJSON_Delete(list);
        return openai_error_set(e, 500, "server_error", NULL, NULL, "out of memory"), -1;
    }
    return 0;
}

/* Appends name to out->ignored (see openai.h: bytes outside [A-Za-z0-9_.-]
 * become '?', names cut at 64 bytes, ",..." once the list is full). */
static void ignored_add(struct openai_request *out, const char *name)
{
    char *list = out->ignored;
    size_t n = strlen(list);
    if (n >= 4 && strcmp(list + n - 4, ",...") == 0)
        return;
    char clean[65];
    size_t k = 0;
    for (; name[k] != '\0' && k < sizeof(clean) - 1; k++) {
        char ch = name[k];
        bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' ||
                  ch == '.' || ch == '-';
        clean[k] = ok ? ch : '?';
    }
    clean[k] = '\0';
    const size_t need = (n > 0 ? 1 : 0) + k;
    if (n + need + 4 >= sizeof(out->ignored)) { /* keep room for ",..." */
        snprintf(list + n, sizeof(out->ignored) - n, "%s...", n > 0 ? "," : "");
        return;
    }
    snprintf(list + n, sizeof(out->ignored) - n, "%s%s", n > 0 ? "," : "", clean);
}

/* response_format: {"type": "text"} (nothing), {"type": "json_object"},
 * {"type": "json_schema", "json_schema": {"name", "schema", "strict",
 * "description"}} -> "grammar". The output always follows the schema,
 * strict or not (a schema without "schema" is any JSON value). */
static int translate_response_format(const cJSON *v, cJSON *gen, struct openai_error *e)
{
    if (!cJSON_IsObject(v))
        return bad(e, "response_format", "response_format: expected an object, got %s%s", json_type_name(v), "");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(v, "type");
    if (!cJSON_IsString(type))
        return bad(e, "response_format", "response_format.type: required, one of \"text\", \"json_object\", "
                   "\"json_schema\"%s%s", "", "");
    const cJSON *f = NULL;
    cJSON_ArrayForEach(f, v) {
        if (strcmp(f->string, "type") != 0 && strcmp(f->string, "json_schema") != 0)
            return bad(e, "response_format", "response_format.%.64s: unknown field%s", f->string, "");
    }
    if (strcmp(type->valuestring, "text") == 0)
        return 0;
    cJSON *g = cJSON_CreateObject();
    if (g == NULL || !cJSON_AddItemToObject(gen, "grammar", g)) {
        cJSON_Delete(g);
        return openai_error_set(e, 500, "server_error", NULL, NULL, "out of memory"), -1;
    }
    struct grammar_spec spec = {0};
    char why[ERR_MSG_MAX];
    if (strcmp(type->valuestring, "json_object") == 0) {
        spec.kind = GRAMMAR_SPEC_JSON_OBJECT;
        if (!cJSON_AddStringToObject(g, "type", "json_object"))
            return openai_error_set(e, 500, "server_error", NULL, NULL, "out of memory"), -1;
    } else if (strcmp(type->valuestring, "json_schema") == 0) {
        const cJSON *js = cJSON_GetObjectItemCaseSensitive(v, "json_schema");
        if (!cJSON_IsObject(js))
            return bad(e, "response_format", "response_format.json_schema: required, an object with \"name\" "
                       "and \"schema\"%s%s", "", "");
        cJSON_ArrayForEach(f, js) {
            if (strcmp(f->string, "name") != 0 && strcmp(f->string, "schema") != 0 &&
                strcmp(f->string, "strict") != 0 && strcmp(f->string, "description") != 0)
                return bad(e, "response_format", "response_format.json_schema.%.64s: unknown field%s", f->string,
                           "");
        }
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(js, "name");
        const cJSON *strict = cJSON_GetObjectItemCaseSensitive(js, "strict");
        if (name != NULL && !cJSON_IsString(name))
            return bad(e, "response_format", "response_format.json_schema.name: expected a string, got %s%s",
                       json_type_name(name), "");
        if (strict != NULL && !cJSON_IsBool(strict) && !cJSON_IsNull(strict))
            return bad(e, "response_format", "response_format.json_schema.strict: expected a boolean, got %s%s",
                       json_type_name(strict), "");
        const cJSON *schema = cJSON_GetObjectItemCaseSensitive(js, "schema");
        cJSON *copy = schema != NULL ? cJSON_Duplicate(schema, 1) : cJSON_CreateTrue();
        if (copy == NULL || !cJSON_AddStringToObject(g, "type", "json_schema") ||
            !cJSON_AddItemToObject(g, "schema", copy)) {
            cJSON_Delete(copy);
            return openai_error_set(e, 500, "server_error", NULL, NULL, "out of memory"), -1;
        }
        int rc = grammar_spec_from_json(&spec, g, "response_format.json_schema", 0, why);
        if (rc != 0)
            return bad(e, "response_format", "%s%s", why, "");
    } else {
        return bad(e, "response_format", "response_format.type: must be \"text\", \"json_object\" or "
                   "\"json_schema\", got \"%.64s\"%s", type->valuestring, "");
    }
    /* compiled here: what the coordinator would refuse is named as the client wrote it */
    int rc = grammar_spec_check(&spec, "response_format.json_schema", why);
    grammar_spec_free(&spec);
    if (rc == ERR_NOMEM)
        return openai_error_set(e, 500, "server_error", NULL, NULL, "out of memory"), -1;
    if (rc != 0)
        return bad(e, "response_format", "%s%s", why, "");
    return 0;
}

/* prediction: {"type": "content", "content": a string or an array of
 * {"type": "text", "text"} parts (joined)} -> the native "prediction". */
static int translate_prediction(const cJSON *v, cJSON *gen, struct openai_error *e)
{
    const cJSON *type = cJSON_IsObject(v) ? cJSON_GetObjectItemCaseSensitive(v, "type") : NULL;
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "content") != 0)
        return bad(e, "prediction", "prediction: expected {\"type\": \"content\", \"content\": ...}%s%s", "", "");
    const cJSON *f = NULL;
    cJSON_ArrayForEach(f, v) {
        if (strcmp(f->string, "type") != 0 && strcmp(f->string, "content") != 0)
            return bad(e, "prediction", "prediction.%.64s: unknown field%s", f->string, "");
    }
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(v, "content");
    size_t len = 0;
    const cJSON *part = NULL;
    if (cJSON_IsArray(content)) {
        cJSON_ArrayForEach(part, content) {
            const cJSON *pt = cJSON_GetObjectItemCaseSensitive(part, "type");
            const cJSON *tx = cJSON_GetObjectItemCaseSensitive(part, "text");
            if (!cJSON_IsString(pt) || strcmp(pt->valuestring, "text") != 0 || !cJSON_IsString(tx))
                return bad(e, "prediction", "prediction.content: only {\"type\": \"text\", \"text\": ...} "
                           "parts are supported%s%s", "", "");
            len += strlen(tx->valuestring);
        }
    } else if (!cJSON_IsString(content)) {
        return bad(e, "prediction", "prediction.content: expected a string or an array of text parts, got %s%s",
                   json_type_name(content), "");
    }
    char *text = cJSON_IsString(content) ? strdup(content->valuestring) : malloc(len + 1);
    if (text == NULL)
        return openai_error_set(e, 500, "server_error", NULL, NULL, "out of memory"), -1;
    if (cJSON_IsArray(content)) {
        size_t at = 0;
        cJSON_ArrayForEach(part, content) {
            const char *tx = cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring;
            memcpy(text + at, tx, strlen(tx));
            at += strlen(tx);
        }
        text[at] = '\0';
    }
    const bool ok = cJSON_AddStringToObject(gen, "prediction", text) != NULL;
    free(text);
    return ok ? 0 : (openai_error_set(e, 500, "server_error", NULL, NULL, "out of memory"), -1);
}

/* root's field name, NULL when absent or null (null means "not given"). */
static const cJSON *not_null(const cJSON *root, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
    return v != NULL && !cJSON_IsNull(v) ? v : NULL;
}

static const struct field *field_find(enum openai_kind kind, const char *name)
{
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++)
        if ((fields[i].kinds & (1u << kind)) && strcmp(fields[i].name, name) == 0)
            return &fields[i];
    return NULL;
}

static int apply_model(const char *name, const cJSON *v, const char *served_model,
                       struct openai_error *e)
{
    if (!cJSON_IsString(v))
        return bad(e, name, "model: expected a string, got %s%s", json_type_name(v), "");
    if (strcmp(v->valuestring, served_model) != 0) {
        openai_error_set(e, 404, INVALID, "model_not_found", "model",
                         "model: \"%.200s\" does not exist; this server serves \"%.200s\"", v->valuestring,
                         served_model);
        return -1;
    }
    return 0;
}

static int apply_max_tokens(const char *name, const cJSON *v, cJSON *gen, struct openai_error *e)
{
    if (expect_integer(v, name, e) != 0)
        return -1;
    /* max_completion_tokens wins over the deprecated max_tokens. */
    if (strcmp(name, "max_tokens") == 0 && cJSON_GetObjectItemCaseSensitive(gen, "max_tokens") != NULL)
        return 0;
    cJSON_DeleteItemFromObjectCaseSensitive(gen, "max_tokens");
    return cJSON_AddNumberToObject(gen, "max_tokens", v->valuedouble) ? 0 : -1;
}

static int apply_draft(const char *name, const cJSON *v, cJSON *gen, struct openai_error *e)
{
    if (!cJSON_IsString(v))
        return bad(e, name, "draft: expected a string, got %s%s", json_type_name(v), "");
    enum request_draft draft;
    char why[ERR_MSG_MAX];
    if (request_draft_parse(v->valuestring, name, &draft, why) != 0)
        return bad(e, name, "%s%s", why, "");
    return cJSON_AddStringToObject(gen, name, v->valuestring) ? 0 : -1;
}

/* "spec_tree": "off", "auto" or a node budget (request_spec_tree_parse), passed on as given. */
static int apply_spec_tree(const char *name, const cJSON *v, cJSON *gen, struct openai_error *e)
{
    int tree;
    char why[ERR_MSG_MAX];
    if (request_spec_tree_parse(v, name, &tree, why) != 0)
        return bad(e, name, "%s%s", why, "");
    cJSON *copy = cJSON_Duplicate(v, 0);
    if (copy == NULL || !cJSON_AddItemToObject(gen, name, copy)) {
        cJSON_Delete(copy);
        return -1;
    }
    return 0;
}

static int apply_seed(const char *name, const cJSON *v, cJSON *gen, struct openai_error *e)
{
    if (expect_integer(v, name, e) != 0)
        return -1;
    if (v->valuedouble < 0)
        return bad(e, name, "seed: must be >= 0%s%s", "", "");
    return cJSON_AddNumberToObject(gen, name, v->valuedouble) ? 0 : -1;
}

static int apply_stream_options(const char *name, const cJSON *v, struct openai_request *out,
                                struct openai_error *e)
{
    if (!cJSON_IsObject(v))
        return bad(e, name, "stream_options: expected an object, got %s%s", json_type_name(v), "");
    const cJSON *o = NULL;
    cJSON_ArrayForEach(o, v) {
        if (strcmp(o->string, "include_usage") != 0)
            return bad(e, "stream_options", "stream_options.%.48s: not supported%s", o->string, "");
        if (!cJSON_IsBool(o))
            return bad(e, "stream_options", "stream_options.include_usage: expected a boolean, got %s%s",
                       json_type_name(o), "");
        out->include_usage = cJSON_IsTrue(o);
    }
    return 0;
}

static int apply_n(const char *name, const cJSON *v, struct openai_request *out,
                   struct openai_error *e)
{
    if (expect_integer(v, name, e) != 0)
        return -1;
    if (v->valuedouble < 1 || v->valuedouble > REQUEST_N_MAX)
        return bad(e, name, "n: must be in 1..16, got %s%s", v->valuedouble < 1 ? "less" : "more", "");
    out->n = (int)v->valuedouble;
    return cJSON_AddNumberToObject(out->generate, name, v->valuedouble) ? 0 : -1;
}

/* Fields that take only a value the server already uses: the count 1, or
 * false. */
static int apply_fixed(const struct field *f, const cJSON *v, struct openai_error *e)
{
    const char *name = f->name;
    if (f->rule == F_ONE) {
        if (expect_integer(v, name, e) != 0)
            return -1;
        if (v->valuedouble != 1)
            return bad(e, name, "%s: only 1 is supported, got %s", name, v->valuedouble < 1 ? "less" : "more");
        return 0;
    }
    if (!cJSON_IsBool(v))
        return bad(e, name, "%s: expected a boolean, got %s", name, json_type_name(v));
    if (cJSON_IsTrue(v))
        return bad(e, name, "%s: not supported by this server (only false)%s", name, "");
    return 0;
}

/* logprobs: a boolean in chat, the count of top tokens in completions. */
static int apply_logprobs(const char *name, const cJSON *v, struct openai_request *out,
                          struct openai_error *e)
{
    if (out->kind == OPENAI_CHAT) {
        if (!cJSON_IsBool(v))
            return bad(e, name, "%s: expected a boolean, got %s", name, json_type_name(v));
        out->logprobs = cJSON_IsTrue(v);
        return 0;
    }
    if (expect_top_count(v, name, e) != 0)
        return -1;
    out->logprobs = true;
    out->top_logprobs = (int)v->valuedouble;
    return 0;
}

static int apply_top_logprobs(const char *name, const cJSON *v, struct openai_request *out,
                              struct openai_error *e)
{
    if (expect_top_count(v, name, e) != 0)
        return -1;
    out->top_logprobs = (int)v->valuedouble;
    out->top_given = true;
    return 0;
}

static int apply_logit_bias(const char *name, const cJSON *v, cJSON *gen, struct openai_error *e)
{
    if (!cJSON_IsObject(v))
        return bad(e, name, "%s: expected an object, got %s", name, json_type_name(v));
    cJSON *copy = cJSON_Duplicate(v, 1);
    if (copy == NULL || !cJSON_AddItemToObject(gen, name, copy)) {
        cJSON_Delete(copy);
        return -1;
    }
    return 0;
}

/* Checks field f's value v and carries it into out: the coordinator's
 * generate message (out->generate) or the request's own flags. */
static int apply_field(const struct field *f, const cJSON *v, const struct openai_policy *policy,
                       struct openai_request *out, struct openai_error *e)
{
    const char *name = f->name;
    cJSON *gen = out->generate;
    switch (f->rule) {
    case F_MODEL:
        return apply_model(name, v, policy->served_model, e);
    case F_MESSAGES:
        return translate_messages(v, gen, e);
    case F_PROMPT:
        return translate_prompt(v, gen, e);
    case F_MAX_TOKENS:
        return apply_max_tokens(name, v, gen, e);
    case F_NUMBER:
        if (expect_number(v, name, e) != 0)
            return -1;
        return cJSON_AddNumberToObject(gen, name, v->valuedouble) ? 0 : -1;
    case F_INTEGER:
        if (expect_integer(v, name, e) != 0)
            return -1;
        return cJSON_AddNumberToObject(gen, name, v->valuedouble) ? 0 : -1;
    case F_DRAFT:
        return apply_draft(name, v, gen, e);
    case F_SPEC_TREE:
        return apply_spec_tree(name, v, gen, e);
    case F_SEED:
        return apply_seed(name, v, gen, e);
    case F_STOP:
        return translate_stop(v, gen, e);
    case F_STREAM:
        if (!cJSON_IsBool(v))
            return bad(e, name, "stream: expected a boolean, got %s%s", json_type_name(v), "");
        out->stream = cJSON_IsTrue(v);
        return 0;
    case F_STREAM_OPTIONS:
        return apply_stream_options(name, v, out, e);
    case F_N:
        return apply_n(name, v, out, e);
    case F_ONE:
    case F_FALSE:
        return apply_fixed(f, v, e);
    case F_LOGPROBS:
        return apply_logprobs(name, v, out, e);
    case F_TOP_LOGPROBS:
        return apply_top_logprobs(name, v, out, e);
    case F_LOGIT_BIAS:
        return apply_logit_bias(name, v, gen, e);
    case F_BOOL:
        if (!cJSON_IsBool(v))
            return bad(e, name, "%s: expected a boolean, got %s", name, json_type_name(v));
        return !cJSON_IsTrue(v) || cJSON_AddBoolToObject(gen, name, true) ? 0 : -1;
    case F_IGNORED:
        if (!cJSON_IsString(v))
            return bad(e, name, "%s: expected a string, got %s", name, json_type_name(v));
        return 0;
    case F_RESPONSE_FORMAT:
        return translate_response_format(v, gen, e);
    case F_PREDICTION:
        return translate_prediction(v, gen, e);
    case F_TOOLS:
        return 0; /* after the loop: tool_choice needs tools, whatever their order */
    case F_UNSUPPORTED:
        return bad(e, name, "%s: not supported by this server%s", name, "");
    }
    return bad(e, name, "%s: unexpected field%s", name, "");
}

/* What depends on several fields, once all are read: tools and
 * tool_choice, top_logprobs with logprobs, stream_options with stream. */
static int finish_request(enum openai_kind kind, const cJSON *root, cJSON *gen, struct openai_request *out,
                          struct openai_error *e)
{
    if (kind == OPENAI_CHAT &&
        openai_tools_translate(not_null(root, "tools"), not_null(root, "tool_choice"),
                               not_null(root, "parallel_tool_calls"), gen, &out->tools, e) != 0)
        return -1;
    if (out->top_given && !out->logprobs)
        return bad(e, "top_logprobs", "top_logprobs: only with logprobs true%s%s", "", "");
    if (out->logprobs && cJSON_AddNumberToObject(gen, "logprobs", out->top_logprobs) == NULL)
        return openai_error_set(e, 500, "server_error", NULL, NULL, "out of memory"), -1;
    if (out->include_usage && !out->stream)
        return bad(e, "stream_options", "stream_options: only allowed when stream is true%s%s", "", "");
    if (cJSON_AddBoolToObject(gen, "stream", out->stream) == NULL)
        return openai_error_set(e, 500, "server_error", NULL, NULL, "out of memory"), -1;
    return 0;
}

int openai_parse_request(enum openai_kind kind, const char *body, size_t len, const struct openai_policy *policy,
                         struct openai_request *out, struct openai_error *e)
{
    memset(out, 0, sizeof(*out));
    out->kind = kind;
    out->n = 1;
    if (body == NULL || len == 0)
        return bad(e, "", "request body is empty: expected a JSON object%s%s", "", "");
    /* The coordinator's strict pass, here first: cJSON alone takes invalid
     * UTF-8, raw control characters and repeated keys (the first wins),
     * which the coordinator would refuse only after a round trip, or which
     * would reach it silently changed. */
    char why[ERR_MSG_MAX];
    int jrc = json_check(body, len, why);
    if (jrc == ERR_NOMEM)
        return openai_error_set(e, 500, "server_error", NULL, NULL, "out of memory"), -1;
    if (jrc == ERR_INVALID_ARG) { /* well-formed, a key repeated: why names its path */
        const char *cut = strstr(why, ": given more than once");
        char param[OPENAI_PARAM_MAX] = "";
        if (cut != NULL)
            snprintf(param, sizeof(param), "%.*s", (int)(cut - why), why);
        return bad(e, param, "%s%s", why, "");
    }
    if (jrc != 0)
        return bad(e, "", "request body is not valid JSON: %s%s", why, "");
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (root == NULL)
        return bad(e, "", "request body is not valid JSON%s%s", "", "");
    for (const char *p = end; p != NULL && p < body + len; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\r' && *p != '\n') {
            cJSON_Delete(root);
            return bad(e, "", "request body is not valid JSON (trailing bytes)%s%s", "", "");
        }
    }
    int rc = -1;
    if (!cJSON_IsObject(root)) {
        bad(e, "", "request body must be a JSON object, got %s%s", json_type_name(root), "");
        goto done;
    }
    cJSON *gen = cJSON_CreateObject();
    if (gen == NULL || cJSON_AddNumberToObject(gen, "v", 1) == NULL ||
        cJSON_AddStringToObject(gen, "type", "generate") == NULL) {
        cJSON_Delete(gen);
        openai_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
        goto done;
    }
    out->generate = gen;
    const char *required = kind == OPENAI_CHAT ? "messages" : "prompt";
    if (cJSON_GetObjectItemCaseSensitive(root, required) == NULL) {
        bad(e, required, "%s: required%s", required, "");
        goto done;
    }
    /* max_completion_tokens first, so it wins over max_tokens whatever the order. */
    const cJSON *mct = cJSON_GetObjectItemCaseSensitive(root, "max_completion_tokens");
    if (kind == OPENAI_CHAT && mct != NULL && !cJSON_IsNull(mct) &&
        apply_field(field_find(kind, "max_completion_tokens"), mct, policy, out, e) != 0)
        goto done;
    const cJSON *f = NULL;
    cJSON_ArrayForEach(f, root) {
        const struct field *fd = field_find(kind, f->string);
        if (fd == NULL) {
            if (policy->strict_fields) {
                bad(e, f->string, "%.64s: unknown field (gateway.strict_fields is on)%s", f->string, "");
                goto done;
            }
            ignored_add(out, f->string);
            continue;
        }
        if (cJSON_IsNull(f) && fd->rule != F_MESSAGES && fd->rule != F_PROMPT)
            continue;
        if (fd->rule == F_MAX_TOKENS && strcmp(fd->name, "max_completion_tokens") == 0)
            continue;
        if (apply_field(fd, f, policy, out, e) != 0)
            goto done;
    }
    rc = finish_request(kind, root, gen, out, e);
done:
    cJSON_Delete(root);
    if (rc != 0) {
        cJSON_Delete(out->generate);
        out->generate = NULL;
        openai_tools_free(&out->tools);
    }
    return rc;
}

void openai_request_free(struct openai_request *r)
{
    if (r == NULL)
        return;
    cJSON_Delete(r->generate);
    r->generate = NULL;
    openai_tools_free(&r->tools);
}

cJSON *openai_error_json(const struct openai_error *e)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *o = cJSON_AddObjectToObject(root, "error");
    if (o == NULL) {
        cJSON_Delete(root);
        return NULL;
    }
    cJSON_AddStringToObject(o, "message", e->message);
    cJSON_AddStringToObject(o, "type", e->type ? e->type : "server_error");
    if (e->param[0])
        cJSON_AddStringToObject(o, "param", e->param);
    else
        cJSON_AddNullToObject(o, "param");
    if (e->code[0])
        cJSON_AddStringToObject(o, "code", e->code);
    else
        cJSON_AddNullToObject(o, "code");
    return root;
}

static const char *string_of(const cJSON *obj, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    return cJSON_IsString(v) ? v->valuestring : "";
}

void openai_error_from_reply(const cJSON *reply, struct openai_error *e)
{
    const char *code = string_of(reply, "code");
    const char *message = string_of(reply, "message");
    /* The coordinator names the field first: "max_tokens: must be >= 1". */
    char param[OPENAI_PARAM_MAX] = "";
    size_t n = strcspn(message, ": ");
    if (message[n] == ':' && n > 0 && n < sizeof(param)) {
        memcpy(param, message, n);
        param[n] = '\0';
    }
    if (strcmp(code, "invalid_request") == 0)
        openai_error_set(e, 400, INVALID, NULL, param, "%s", message);
    else if (strcmp(code, "context_full") == 0)
        openai_error_set(e, 400, INVALID, "context_length_exceeded", param, "%s", message);
    else if (strcmp(code, "overloaded") == 0)
        openai_error_set(e, 429, "rate_limit_error", "overloaded", NULL, "%s", message);
    else if (strcmp(code, "target_unavailable") == 0 || strcmp(code, "coordinator_unavailable") == 0)
        openai_error_set(e, 503, "server_error", code, NULL, "%s", message);
    else
        openai_error_set(e, 500, "server_error", code[0] ? code : "internal", NULL, "%s", message);
}

const char *openai_finish_reason(const char *coordinator_reason)
{
    return strcmp(coordinator_reason, "length") == 0 ? "length" : "stop";
}

/* A number at obj.section.name summed over the done replies a response
 * covers: its "choices" (n > 1: openai_merge_dones) or itself; *all says
 * whether every one had it. */
static double sum_over_choices(const cJSON *done, const char *section, const char *name, bool *all)
{
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(done, "choices");
    const cJSON *one = cJSON_IsArray(list) ? list->child : done;
    double total = 0;
    *all = true;
    for (; one != NULL; one = cJSON_IsArray(list) ? one->next : NULL) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(one, section), name);
        *all = *all && cJSON_IsNumber(v);
        total += cJSON_IsNumber(v) ? v->valuedouble : 0;
    }
    return total;
}

cJSON *openai_merge_dones(cJSON *const *dones, int n)
{
    cJSON *merged = cJSON_Duplicate(dones[0], 1);
    cJSON *list = n > 1 && merged ? cJSON_AddArrayToObject(merged, "choices") : NULL;
    for (int i = 0; list && i < n; i++) {
        cJSON *d = cJSON_Duplicate(dones[i], 1);
        if (d == NULL || !cJSON_AddItemToArray(list, d)) {
            cJSON_Delete(d);
            cJSON_Delete(merged);
            return NULL;
        }
    }
    return n > 1 && !list ? (cJSON_Delete(merged), NULL) : merged;
}

static cJSON *usage_json(const cJSON *done)
{
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(done, "usage");
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens");
    bool all = true;
    double pt = cJSON_IsNumber(p) ? p->valuedouble : 0;
    double gt = sum_over_choices(done, "usage", "generated_tokens", &all);
    cJSON *o = cJSON_CreateObject();
    if (o == NULL)
        return NULL;
    cJSON_AddNumberToObject(o, "prompt_tokens", pt);
    cJSON_AddNumberToObject(o, "completion_tokens", gt);
    cJSON_AddNumberToObject(o, "total_tokens", pt + gt);
    /* prompt tokens the target did not compute: its prefix cache had them */
    const cJSON *cached = cJSON_GetObjectItemCaseSensitive(u, "cached_prompt_tokens");
    if (cJSON_IsNumber(cached)) {
        cJSON *d = cJSON_AddObjectToObject(o, "prompt_tokens_details");
        if (d != NULL)
            cJSON_AddNumberToObject(d, "cached_tokens", cached->valuedouble);
    }
    /* drafted tokens the target accepted and rejected, in OpenAI's own
     * words for predicted tokens (its "predicted outputs" are drafts too);
     * with a prediction, its own drafts only, as OpenAI counts them */
    bool have_d = true, have_a = true, have_pa = true, have_pr = true;
    double drafted = sum_over_choices(done, "spec", "drafted", &have_d);
    double accepted = sum_over_choices(done, "spec", "accepted", &have_a);
    const double pred_a = sum_over_choices(done, "usage", "accepted_prediction_tokens", &have_pa);
    const double pred_r = sum_over_choices(done, "usage", "rejected_prediction_tokens", &have_pr);
    if (have_pa && have_pr) {
        have_d = have_a = true;
        accepted = pred_a;
        drafted = pred_a + pred_r;
    }
    if (have_d && have_a) {
        cJSON *d = cJSON_AddObjectToObject(o, "completion_tokens_details");
        if (d != NULL) {
            cJSON_AddNumberToObject(d, "accepted_prediction_tokens", accepted);
            cJSON_AddNumberToObject(d, "rejected_prediction_tokens", drafted - accepted);
        }
    }
    return o;
}

/* Tandem's own figures: ids always, the speculation and timing blocks of a
 * done reply when there is one. */
static cJSON *tandem_json(const cJSON *ids_from, const cJSON *done)
{
    cJSON *t = cJSON_CreateObject();
    if (t == NULL)
        return NULL;
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(ids_from, "ids");
    cJSON_AddItemToObject(t, "ids", ids ? cJSON_Duplicate(ids, 1) : cJSON_CreateArray());
    if (done != NULL) {
        const cJSON *spec = cJSON_GetObjectItemCaseSensitive(done, "spec");
        const cJSON *timing = cJSON_GetObjectItemCaseSensitive(done, "timing");
        if (spec)
            cJSON_AddItemToObject(t, "spec", cJSON_Duplicate(spec, 1));
        if (timing)
            cJSON_AddItemToObject(t, "timing", cJSON_Duplicate(timing, 1));
    }
    return t;
}

/* A chat entry {token, logprob, bytes} from a coordinator entry. */
static cJSON *chat_entry(const cJSON *src)
{
    cJSON *o = cJSON_CreateObject();
    const cJSON *bytes = cJSON_GetObjectItemCaseSensitive(src, "bytes");
    const cJSON *lp = cJSON_GetObjectItemCaseSensitive(src, "logprob");
    if (o == NULL || cJSON_AddStringToObject(o, "token", string_of(src, "token")) == NULL ||
        cJSON_AddNumberToObject(o, "logprob", cJSON_IsNumber(lp) ? lp->valuedouble : 0) == NULL ||
        !cJSON_AddItemToObject(o, "bytes", bytes ? cJSON_Duplicate(bytes, 1) : cJSON_CreateArray())) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

/* chat: {"content": [{token, logprob, bytes, top_logprobs: [...]}], "refusal": null} */
static cJSON *chat_logprobs(const cJSON *entries)
{
    cJSON *r = cJSON_CreateObject();
    cJSON *content = cJSON_AddArrayToObject(r, "content");
    if (content == NULL || cJSON_AddNullToObject(r, "refusal") == NULL) {
        cJSON_Delete(r);
        return NULL;
    }
    const cJSON *src = NULL;
    cJSON_ArrayForEach(src, entries) {
        cJSON *o = chat_entry(src);
        cJSON *top = o ? cJSON_AddArrayToObject(o, "top_logprobs") : NULL;
        if (top == NULL || !cJSON_AddItemToArray(content, o)) {
            cJSON_Delete(o);
            cJSON_Delete(r);
            return NULL;
        }
        const cJSON *alt = NULL;
        cJSON_ArrayForEach(alt, cJSON_GetObjectItemCaseSensitive(src, "top_logprobs")) {
            cJSON *a = chat_entry(alt);
            if (a == NULL || !cJSON_AddItemToArray(top, a)) {
                cJSON_Delete(a);
                cJSON_Delete(r);
                return NULL;
            }
        }
    }
    return r;
}

static double number_of(const cJSON *obj, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

/* completions (the legacy layout): {tokens, token_logprobs, top_logprobs:
 * [{token: logprob}], text_offset}. Two alternatives with the same text
 * keep the likelier (an object's keys are unique). */
static cJSON *completion_logprobs(const cJSON *entries)
{
    cJSON *r = cJSON_CreateObject();
    cJSON *tokens = cJSON_AddArrayToObject(r, "tokens");
    cJSON *lps = cJSON_AddArrayToObject(r, "token_logprobs");
    cJSON *tops = cJSON_AddArrayToObject(r, "top_logprobs");
    cJSON *offs = cJSON_AddArrayToObject(r, "text_offset");
    if (offs == NULL) {
        cJSON_Delete(r);
        return NULL;
    }
    const cJSON *src = NULL;
    cJSON_ArrayForEach(src, entries) {
        cJSON *top = cJSON_CreateObject();
        bool ok = top && cJSON_AddItemToArray(tops, top);
        if (!ok)
            cJSON_Delete(top);
        ok = ok && cJSON_AddItemToArray(tokens, cJSON_CreateString(string_of(src, "token"))) &&
             cJSON_AddItemToArray(lps, cJSON_CreateNumber(number_of(src, "logprob"))) &&
             cJSON_AddItemToArray(offs, cJSON_CreateNumber(number_of(src, "text_offset")));
        const cJSON *alt = NULL;
        cJSON_ArrayForEach(alt, cJSON_GetObjectItemCaseSensitive(src, "top_logprobs")) {
            const char *t = string_of(alt, "token");
            if (ok && !cJSON_HasObjectItem(top, t))
                ok = cJSON_AddNumberToObject(top, t, number_of(alt, "logprob")) != NULL;
        }
        if (!ok) {
            cJSON_Delete(r);
            return NULL;
        }
    }
    return r;
}

/* choices[].logprobs of a coordinator reply: null when it carries none. */
static void add_logprobs(cJSON *choice, enum openai_kind kind, const cJSON *reply)
{
    const cJSON *entries = reply ? cJSON_GetObjectItemCaseSensitive(reply, "logprobs") : NULL;
    cJSON *lp = !cJSON_IsArray(entries)     ? NULL
                : kind == OPENAI_CHAT       ? chat_logprobs(entries)
                                            : completion_logprobs(entries);
    if (lp == NULL || !cJSON_AddItemToObject(choice, "logprobs", lp)) {
        cJSON_Delete(lp);
        cJSON_AddNullToObject(choice, "logprobs");
    }
}

static cJSON *envelope(enum openai_kind kind, const char *id, long created, const char *model, bool chunk)
{
    cJSON *r = cJSON_CreateObject();
    if (r == NULL)
        return NULL;
    cJSON_AddStringToObject(r, "id", id);
    cJSON_AddStringToObject(r, "object",
                            kind == OPENAI_COMPLETION ? "text_completion"
                            : chunk                   ? "chat.completion.chunk"
                                                      : "chat.completion");
    cJSON_AddNumberToObject(r, "created", (double)created);
    cJSON_AddStringToObject(r, "model", model);
    return r;
}

/* "index" of a coordinator reply: 0 unless the request had n > 1. */
static int index_of(const cJSON *reply)
{
    const cJSON *i = reply ? cJSON_GetObjectItemCaseSensitive(reply, "index") : NULL;
    return cJSON_IsNumber(i) ? i->valueint : 0;
}

/* One choice of a whole response from its done reply. */
static cJSON *choice_json(enum openai_kind kind, const cJSON *done)
{
    cJSON *c = cJSON_CreateObject();
    if (c == NULL)
        return NULL;
    cJSON_AddNumberToObject(c, "index", index_of(done));
    const char *text = string_of(done, "text");
    if (kind == OPENAI_CHAT) {
        cJSON *m = cJSON_AddObjectToObject(c, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        cJSON_AddStringToObject(m, "content", text);
    } else {
        cJSON_AddStringToObject(c, "text", text);
    }
    add_logprobs(c, kind, done);
    cJSON_AddStringToObject(c, "finish_reason", openai_finish_reason(string_of(done, "finish_reason")));
    return c;
}

cJSON *openai_response_json(enum openai_kind kind, const char *response_id, long created, const char *model,
                            const cJSON *done)
{
    cJSON *r = envelope(kind, response_id, created, model, false);
    cJSON *choices = cJSON_AddArrayToObject(r, "choices");
    if (choices == NULL) {
        cJSON_Delete(r);
        return NULL;
    }
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(done, "choices");
    for (const cJSON *one = cJSON_IsArray(list) ? list->child : done; one != NULL;
         one = cJSON_IsArray(list) ? one->next : NULL) {
        cJSON *c = choice_json(kind, one);
        if (c == NULL || !cJSON_AddItemToArray(choices, c)) {
            cJSON_Delete(c);
            cJSON_Delete(r);
            return NULL;
        }
    }
    cJSON_AddItemToObject(r, "usage", usage_json(done));
    cJSON_AddItemToObject(r, "tandem", tandem_json(done, done));
    return r;
}

cJSON *openai_chunk_json(enum openai_kind kind, const char *response_id, long created, const char *model,
                         const struct openai_chunk *chunk)
{
    const cJSON *token = chunk->token, *done = chunk->done;
    const bool role_first = chunk->role_first;
    cJSON *r = envelope(kind, response_id, created, model, true);
    cJSON *choices = cJSON_AddArrayToObject(r, "choices");
    cJSON *c = cJSON_CreateObject();
    if (choices == NULL || c == NULL) {
        cJSON_Delete(c);
        cJSON_Delete(r);
        return NULL;
    }
    cJSON_AddItemToArray(choices, c);
    cJSON_AddNumberToObject(c, "index", index_of(token ? token : done));
    const char *text = token ? string_of(token, "text") : "";
    if (kind == OPENAI_CHAT) {
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        if (role_first)
            cJSON_AddStringToObject(d, "role", "assistant");
        if (role_first || token != NULL)
            cJSON_AddStringToObject(d, "content", text);
    } else {
        cJSON_AddStringToObject(c, "text", text);
    }
    add_logprobs(c, kind, token);
    if (done != NULL)
        cJSON_AddStringToObject(c, "finish_reason", openai_finish_reason(string_of(done, "finish_reason")));
    else
        cJSON_AddNullToObject(c, "finish_reason");
    if (chunk->with_usage_null)
        cJSON_AddNullToObject(r, "usage");
    if (token != NULL || done != NULL)
        cJSON_AddItemToObject(r, "tandem", tandem_json(token, done));
    return r;
}

cJSON *openai_usage_chunk_json(enum openai_kind kind, const char *response_id, long created, const char *model,
                               const cJSON *done)
{
    cJSON *r = envelope(kind, response_id, created, model, true);
    if (r == NULL)
        return NULL;
    cJSON_AddArrayToObject(r, "choices");
    cJSON_AddItemToObject(r, "usage", usage_json(done));
    return r;
}
