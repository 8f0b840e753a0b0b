/* openai_tools.c: OpenAI's function calling over Llama 3.1/3.2's tool
 * format (contract in openai_tools.h).
 *
 * Invariant: a forced call (required, named) is constrained by the same
 * grammar engine as response_format, so its text always parses here
 * unless max_tokens cuts it; an unparsable text is returned as content,
 * never dropped.
 */
#include "openai_tools.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "grammar_spec.h"
#include "json_check.h"
#include "openai.h"
#include "request.h"

#define TOOL_NAME_MAX 64
#define PYTHON_TAG "<|python_tag|>"

static int bad(struct openai_error *e, const char *param, const char *msg)
{
    openai_error_set(e, 400, "invalid_request_error", NULL, param, "%s", msg);
    return -1;
}

static int oom(struct openai_error *e)
{
    openai_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    return -1;
}

/* OpenAI's rule for a function name: 1..64 of [A-Za-z0-9_-]. */
static bool name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > TOOL_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
            return false;
    }
    return true;
}

/* Compiles {"type": "json_schema", "schema": schema} as response_format's
 * would be: an unsupported keyword is a 400 naming it under
 * "<path>.parameters" (path: "tools[i].function"). */
static int schema_check(const cJSON *schema, const char *path, const char *param, struct openai_error *e)
{
    cJSON *g = cJSON_CreateObject();
    cJSON *copy = cJSON_Duplicate(schema, 1);
    if (g == NULL || copy == NULL || !cJSON_AddStringToObject(g, "type", "json_schema") ||
        !cJSON_AddItemToObject(g, "schema", copy)) {
        cJSON_Delete(copy);
        cJSON_Delete(g);
        return oom(e);
    }
    struct grammar_spec spec = {0};
    char why[ERR_MSG_MAX];
    int rc = grammar_spec_from_json(&spec, g, path, 0, why);
    if (rc == 0)
        rc = grammar_spec_check(&spec, path, why);
    grammar_spec_free(&spec);
    cJSON_Delete(g);
    if (rc == ERR_NOMEM)
        return oom(e);
    if (rc == 0)
        return 0;
    /* the engine names the wrapper's key, "<path>.schema": the client wrote "<path>.parameters" */
    char msg[OPENAI_MESSAGE_MAX];
    size_t n = strlen(path);
    if (strncmp(why, path, n) == 0 && strncmp(why + n, ".schema", 7) == 0)
        snprintf(msg, sizeof msg, "%s.parameters%s", path, why + n + 7);
    else
        snprintf(msg, sizeof msg, "%s", why);
    return bad(e, param, msg);
}

/* One entry of "tools": {"type": "function", "function": {"name",
 * "description"?, "parameters"?, "strict"?}}; its name added to names. */
static int tool_check(const cJSON *t, int i, cJSON *names, struct openai_error *e)
{
    char p[OPENAI_PARAM_MAX], msg[OPENAI_MESSAGE_MAX];
    snprintf(p, sizeof p, "tools[%d]", i);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
    if (!cJSON_IsObject(t) || !cJSON_IsString(type) || strcmp(type->valuestring, "function") != 0 ||
        !cJSON_IsObject(fn)) {
        snprintf(msg, sizeof msg, "%s: expected {\"type\": \"function\", \"function\": {\"name\", ...}}", p);
        return bad(e, p, msg);
    }
    for (const cJSON *f = t->child; f; f = f->next) {
        if (strcmp(f->string, "type") != 0 && strcmp(f->string, "function") != 0) {
            snprintf(msg, sizeof msg, "%s.%.64s: unknown field", p, f->string);
            return bad(e, p, msg);
        }
    }
    for (const cJSON *f = fn->child; f; f = f->next) {
        const char *k = f->string;
        bool ok = (strcmp(k, "name") == 0 && cJSON_IsString(f)) ||
                  (strcmp(k, "description") == 0 && cJSON_IsString(f)) ||
                  (strcmp(k, "parameters") == 0 && cJSON_IsObject(f)) ||
                  (strcmp(k, "strict") == 0 && (cJSON_IsBool(f) || cJSON_IsNull(f)));
        if (!ok) {
            snprintf(msg, sizeof msg, "%s.function.%.64s: %s", p, k,
                     strcmp(k, "name") == 0 || strcmp(k, "description") == 0 ? "expected a string"
                     : strcmp(k, "parameters") == 0                          ? "expected an object (a JSON schema)"
                     : strcmp(k, "strict") == 0                              ? "expected a boolean"
                                                                             : "unknown field");
            return bad(e, p, msg);
        }
    }
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
    if (name == NULL || !name_ok(name->valuestring)) {
        snprintf(msg, sizeof msg, "%s.function.name: %s", p,
                 name == NULL ? "required" : "must be 1..64 characters of a-z, A-Z, 0-9, _ and -");
        return bad(e, p, msg);
    }
    for (const cJSON *n = names->child; n; n = n->next) {
        if (strcmp(n->valuestring, name->valuestring) == 0) {
            snprintf(msg, sizeof msg, "%s.function.name: \"%s\" is declared twice", p, name->valuestring);
            return bad(e, p, msg);
        }
    }
    cJSON *s = cJSON_CreateString(name->valuestring);
    if (s == NULL || !cJSON_AddItemToArray(names, s)) {
        cJSON_Delete(s);
        return oom(e);
    }
    return 0;
}

/* tool_choice: "none", "auto", "required" or {"type": "function",
 * "function": {"name"}} naming a declared tool. */
static int choice_parse(const cJSON *v, struct openai_tools *out, struct openai_error *e)
{
    char msg[OPENAI_MESSAGE_MAX];
    if (v == NULL) {
        out->choice = out->names ? OPENAI_TOOL_CHOICE_AUTO : OPENAI_TOOLS_OFF;
        return 0;
    }
    if (cJSON_IsString(v)) {
        const char *s = v->valuestring;
        if (strcmp(s, "none") == 0)
            out->choice = out->names ? OPENAI_TOOL_CHOICE_NONE : OPENAI_TOOLS_OFF;
        else if (strcmp(s, "auto") == 0 || strcmp(s, "required") == 0)
            out->choice = s[0] == 'a' ? OPENAI_TOOL_CHOICE_AUTO : OPENAI_TOOL_CHOICE_REQUIRED;
        else {
            snprintf(msg, sizeof msg, "tool_choice: must be \"none\", \"auto\", \"required\" or "
                     "{\"type\": \"function\", \"function\": {\"name\": ...}}, got \"%.64s\"", s);
            return bad(e, "tool_choice", msg);
        }
    } else {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(v, "type");
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(v, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (!cJSON_IsObject(v) || !cJSON_IsString(type) || strcmp(type->valuestring, "function") != 0 ||
            !cJSON_IsString(name))
            return bad(e, "tool_choice", "tool_choice: expected \"none\", \"auto\", \"required\" or "
                       "{\"type\": \"function\", \"function\": {\"name\": ...}}");
        for (cJSON *n = out->names ? out->names->child : NULL; n; n = n->next)
            if (strcmp(n->valuestring, name->valuestring) == 0)
                out->named = n;
        if (out->named == NULL) {
            snprintf(msg, sizeof msg, "tool_choice.function.name: \"%.64s\" is not one of the tools",
                     name->valuestring);
            return bad(e, "tool_choice", msg);
        }
        out->choice = OPENAI_TOOL_CHOICE_NAMED;
    }
    if (out->names == NULL && out->choice != OPENAI_TOOLS_OFF)
        return bad(e, "tool_choice", "tool_choice: only with tools");
    return 0;
}

/* {"type": "object", "properties": {"name": {"const": NAME}, "parameters":
 * PARAMS}, "required": ["name", "parameters"]}: the call of one tool, in
 * the order Llama 3.x writes it. No parameters: an empty object. */
static cJSON *call_schema(const cJSON *tool)
{
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tool, "function");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
    cJSON *s = cJSON_CreateObject();
    cJSON *props = cJSON_AddObjectToObject(s, "properties");
    cJSON *n = cJSON_AddObjectToObject(props, "name");
    cJSON *p = params ? cJSON_Duplicate(params, 1) : cJSON_Parse("{\"type\": \"object\", \"properties\": {}}");
    cJSON *req = cJSON_Parse("[\"name\", \"parameters\"]");
    if (s == NULL || props == NULL || n == NULL || p == NULL || req == NULL ||
        !cJSON_AddStringToObject(s, "type", "object") || !cJSON_AddStringToObject(n, "const", name->valuestring) ||
        !cJSON_AddItemToObject(props, "parameters", p)) {
        cJSON_Delete(p);
        cJSON_Delete(req);
        cJSON_Delete(s);
        return NULL;
    }
    if (!cJSON_AddItemToObject(s, "required", req)) { /* p is s's now */
        cJSON_Delete(req);
        cJSON_Delete(s);
        return NULL;
    }
    return s;
}

/* The forced call's grammar: one tool's call, or anyOf over the tools'. */
static int add_call_grammar(const cJSON *tools, const struct openai_tools *t, cJSON *gen, struct openai_error *e)
{
    if (cJSON_GetObjectItemCaseSensitive(gen, "grammar") != NULL)
        return bad(e, "tool_choice", "tool_choice: a forced call (\"required\" or a named function) cannot be "
                   "combined with response_format");
    cJSON *schema = NULL;
    if (t->choice == OPENAI_TOOL_CHOICE_NAMED || cJSON_GetArraySize(tools) == 1) {
        for (const cJSON *tl = tools->child; tl && !schema; tl = tl->next) {
            const cJSON *nm = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(tl, "function"), "name");
            if (t->choice != OPENAI_TOOL_CHOICE_NAMED || strcmp(nm->valuestring, t->named->valuestring) == 0)
                if ((schema = call_schema(tl)) == NULL)
                    return oom(e);
        }
    } else {
        schema = cJSON_CreateObject();
        cJSON *any = cJSON_AddArrayToObject(schema, "anyOf");
        if (any == NULL) {
            cJSON_Delete(schema);
            return oom(e);
        }
        for (const cJSON *tl = tools->child; tl; tl = tl->next) {
            cJSON *one = call_schema(tl);
            if (one == NULL || !cJSON_AddItemToArray(any, one)) {
                cJSON_Delete(one);
                cJSON_Delete(schema);
                return oom(e);
            }
        }
    }
    if (schema_check(schema, "tools", "tools", e) != 0) {
        cJSON_Delete(schema);
        return -1;
    }
    cJSON *g = cJSON_AddObjectToObject(gen, "grammar");
    if (g == NULL || !cJSON_AddStringToObject(g, "type", "json_schema") ||
        !cJSON_AddItemToObject(g, "schema", schema)) {
        cJSON_Delete(schema); /* not added: still ours */
        return oom(e);
    }
    return 0;
}

int openai_tools_translate(const cJSON *tools, const cJSON *choice, const cJSON *parallel, cJSON *gen,
                           struct openai_tools *out, struct openai_error *e)
{
    memset(out, 0, sizeof *out);
    out->parallel = true;
    if (parallel != NULL) {
        if (!cJSON_IsBool(parallel))
            return bad(e, "parallel_tool_calls", "parallel_tool_calls: expected a boolean");
        out->parallel = cJSON_IsTrue(parallel);
    }
    if (tools != NULL) {
        if (!cJSON_IsArray(tools) || cJSON_GetArraySize(tools) < 1 || cJSON_GetArraySize(tools) > REQUEST_TOOLS_MAX)
            return bad(e, "tools", "tools: expected an array of 1..128 tools");
        if ((out->names = cJSON_CreateArray()) == NULL)
            return oom(e);
        int i = 0;
        for (const cJSON *t = tools->child; t; t = t->next, i++) {
            if (tool_check(t, i, out->names, e) != 0)
                return -1;
            const cJSON *params =
                cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(t, "function"), "parameters");
            char path[OPENAI_PARAM_MAX], param[OPENAI_PARAM_MAX];
            snprintf(path, sizeof path, "tools[%d].function", i);
            snprintf(param, sizeof param, "tools[%d]", i);
            /* checked for every tool, so a schema the grammar cannot hold is
             * refused whatever tool_choice says, not only when forced */
            if (params != NULL && schema_check(params, path, param, e) != 0)
                return -1;
        }
    }
    if (choice_parse(choice, out, e) != 0)
        return -1;
    if (out->names == NULL)
        return 0;
    cJSON *copy = cJSON_Duplicate(tools, 1);
    if (copy == NULL || !cJSON_AddItemToObject(gen, "tools", copy)) {
        cJSON_Delete(copy);
        return oom(e);
    }
    if (out->choice == OPENAI_TOOL_CHOICE_REQUIRED || out->choice == OPENAI_TOOL_CHOICE_NAMED)
        return add_call_grammar(tools, out, gen, e);
    return 0;
}

void openai_tools_free(struct openai_tools *t)
{
    if (t == NULL)
        return;
    cJSON_Delete(t->names);
    memset(t, 0, sizeof *t);
}

static const char *skip_space(const char *s)
{
    while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r')
        s++;
    return s;
}

int openai_tools_may_be_call(const struct openai_tools *t, const char *text)
{
    if (t->choice == OPENAI_TOOLS_OFF || t->choice == OPENAI_TOOL_CHOICE_NONE)
        return 0;
    if (t->choice != OPENAI_TOOL_CHOICE_AUTO)
        return 1;
    const char *s = skip_space(text);
    size_t n = strlen(s), tag = strlen(PYTHON_TAG);
    if (n < tag && strncmp(s, PYTHON_TAG, n) == 0)
        return 1; /* the tag's text, not whole yet */
    if (strncmp(s, PYTHON_TAG, tag) == 0)
        s = skip_space(s + tag);
    return *s == '\0' || *s == '{';
}

static bool declared(const struct openai_tools *t, const char *name)
{
    if (t->choice == OPENAI_TOOL_CHOICE_NAMED)
        return strcmp(name, t->named->valuestring) == 0;
    for (const cJSON *n = t->names->child; n; n = n->next)
        if (strcmp(n->valuestring, name) == 0)
            return true;
    return false;
}

/* One call object of the text as OpenAI's tool call, or NULL. */
static cJSON *call_of(const struct openai_tools *t, const cJSON *o, const char *id_prefix, int k)
{
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(o, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(o, "parameters");
    if (args == NULL)
        args = cJSON_GetObjectItemCaseSensitive(o, "arguments");
    if (!cJSON_IsObject(o) || !cJSON_IsString(name) || !declared(t, name->valuestring) ||
        (args != NULL && !cJSON_IsObject(args)) || cJSON_GetArraySize(o) != 1 + (args != NULL))
        return NULL;
    char *text = args != NULL ? cJSON_PrintUnformatted(args) : NULL;
    char id[96];
    snprintf(id, sizeof id, "%s_%d", id_prefix, k);
    cJSON *c = cJSON_CreateObject();
    cJSON *fn = cJSON_AddObjectToObject(c, "function");
    if (fn == NULL || (args != NULL && text == NULL) || !cJSON_AddStringToObject(c, "id", id) ||
        !cJSON_AddStringToObject(c, "type", "function") || !cJSON_AddStringToObject(fn, "name", name->valuestring) ||
        !cJSON_AddStringToObject(fn, "arguments", text != NULL ? text : "{}")) {
        cJSON_Delete(c);
        c = NULL;
    }
    cJSON_free(text);
    /* the id first, as OpenAI orders it */
    if (c != NULL) {
        cJSON *f = cJSON_DetachItemFromObjectCaseSensitive(c, "function");
        cJSON_AddItemToObject(c, "function", f);
    }
    return c;
}

cJSON *openai_tools_parse(const struct openai_tools *t, const char *text, const char *id_prefix)
{
    if (t->choice == OPENAI_TOOLS_OFF || t->choice == OPENAI_TOOL_CHOICE_NONE || text == NULL)
        return NULL;
    const char *s = skip_space(text);
    if (strncmp(s, PYTHON_TAG, strlen(PYTHON_TAG)) == 0)
        s = skip_space(s + strlen(PYTHON_TAG));
    cJSON *calls = cJSON_CreateArray();
    for (int k = 0; calls != NULL && *s != '\0'; k++) {
        const char *end = NULL;
        char why[ERR_MSG_MAX];
        /* the strict check first: cJSON alone takes a repeated key */
        cJSON *o = cJSON_ParseWithOpts(s, &end, 0);
        bool ok = o != NULL && json_check(s, (size_t)(end - s), why) == 0;
        cJSON *c = ok ? call_of(t, o, id_prefix, k) : NULL;
        cJSON_Delete(o);
        if (c == NULL) {
            cJSON_Delete(calls);
            return NULL;
        }
        if (t->parallel || k == 0)
            cJSON_AddItemToArray(calls, c);
        else
            cJSON_Delete(c);
        s = skip_space(end);
        if (*s == ';')
            s = skip_space(s + 1);
        else if (*s != '\0') {
            cJSON_Delete(calls);
            return NULL;
        }
    }
    if (calls != NULL && cJSON_GetArraySize(calls) == 0) {
        cJSON_Delete(calls);
        return NULL;
    }
    return calls;
}

void openai_tools_apply_response(const struct openai_tools *t, cJSON *response)
{
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(response, "id");
    cJSON *choice = NULL;
    cJSON_ArrayForEach(choice, cJSON_GetObjectItemCaseSensitive(response, "choices")) {
        cJSON *msg = cJSON_GetObjectItemCaseSensitive(choice, "message");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(msg, "content");
        const cJSON *index = cJSON_GetObjectItemCaseSensitive(choice, "index");
        char prefix[96];
        snprintf(prefix, sizeof prefix, "call_%s_%d", cJSON_IsString(id) ? id->valuestring : "",
                 cJSON_IsNumber(index) ? index->valueint : 0);
        cJSON *calls = cJSON_IsString(content) ? openai_tools_parse(t, content->valuestring, prefix) : NULL;
        if (calls == NULL)
            continue;
        cJSON_ReplaceItemInObjectCaseSensitive(msg, "content", cJSON_CreateNull());
        cJSON_AddItemToObject(msg, "tool_calls", calls);
        cJSON_ReplaceItemInObjectCaseSensitive(choice, "finish_reason", cJSON_CreateString("tool_calls"));
    }
}
