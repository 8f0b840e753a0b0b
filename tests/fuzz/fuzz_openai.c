/* fuzz_openai.c: an HTTP request body from fuzz bytes, as the gateway reads
 * it: openai_parse_request for /v1/chat/completions and /v1/completions.
 * A body that parses must give the coordinator a message its intake takes
 * as a well-formed "generate" envelope once the bridge adds the id (range
 * checks are the coordinator's, so request_from_json may still refuse it,
 * naming the field); then it is run through request_from_json as the
 * coordinator would. A body that is refused gets 400 (404 for a model not
 * served) and an error object that prints as UTF-8 JSON, whatever bytes the
 * body held. With tools, the body's bytes and its first message's content
 * are also read as a model's output (openai_tools_parse): a call or NULL,
 * never a crash. */
#include "fuzz_common.h"

#include <stdbool.h>

#include "error.h"
#include "openai.h"
#include "request.h"
#include "utf8.h"

#define FUZZ_MODEL "tandem-fuzz"

static void check_accepted(struct openai_request *r)
{
    if (!cJSON_IsObject(r->generate))
        abort();
    if (cJSON_AddStringToObject(r->generate, "id", "fuzz-1") == NULL)
        return;
    char *text = cJSON_PrintUnformatted(r->generate);
    if (text == NULL)
        return;
    char err[ERR_MSG_MAX];
    cJSON *root = NULL;
    enum request_kind kind;
    if (request_parse_envelope(text, strlen(text), &root, &kind, err) != 0 || kind != REQUEST_KIND_GENERATE)
        abort();
    static const struct request_limits limits = {.max_tokens_max = 4096};
    struct request *req = NULL;
    if (request_from_json(&req, root, &limits, err) == 0)
        request_destroy(req);
    cJSON_Delete(root);
    free(text);
}

static void check_calls(const struct openai_request *r, const char *text)
{
    cJSON *calls = openai_tools_parse(&r->tools, text, "call");
    if (calls != NULL && (!cJSON_IsArray(calls) || cJSON_GetArraySize(calls) < 1))
        abort();
    cJSON_Delete(calls);
    (void)openai_tools_may_be_call(&r->tools, text);
}

/* The body, and its first message's content, as output texts. */
static void check_tool_output(const struct openai_request *r, const uint8_t *data, size_t size)
{
    if (r->tools.choice == OPENAI_TOOLS_OFF)
        return;
    const cJSON *m0 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(r->generate, "messages"), 0);
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(m0, "content");
    if (cJSON_IsString(content))
        check_calls(r, content->valuestring);
    char *text = malloc(size + 1);
    if (text == NULL)
        return;
    memcpy(text, data, size);
    text[size] = '\0';
    check_calls(r, text);
    free(text);
}

static void check_refused(const struct openai_error *e)
{
    /* 400 for a malformed or unsupported body, 404 for a model not served,
     * 500 only when memory ran out. */
    bool expected = e->status == 400 || (e->status == 404 && strcmp(e->code, "model_not_found") == 0) ||
                    (e->status == 500 && strcmp(e->message, "out of memory") == 0);
    if (!expected || e->type == NULL)
        abort();
    if (memchr(e->message, '\0', sizeof e->message) == NULL || memchr(e->param, '\0', sizeof e->param) == NULL ||
        memchr(e->code, '\0', sizeof e->code) == NULL)
        abort();
    cJSON *j = openai_error_json(e);
    if (j == NULL)
        return;
    char *text = cJSON_PrintUnformatted(j);
    /* What the client reads must be UTF-8 JSON, whatever bytes it sent. */
    if (text != NULL && !utf8_valid((const uint8_t *)text, strlen(text), NULL))
        abort();
    free(text);
    cJSON_Delete(j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const enum openai_kind kinds[] = {OPENAI_CHAT, OPENAI_COMPLETION};
    for (size_t k = 0; k < 4; k++) {
        struct openai_request r;
        struct openai_error e;
        memset(&r, 0, sizeof r);
        memset(&e, 0, sizeof e);
        /* lenient (unknown fields listed) and strict (gateway.strict_fields) */
        const struct openai_policy policy = {.served_model = FUZZ_MODEL, .strict_fields = k >= 2};
        if (openai_parse_request(kinds[k % 2], (const char *)data, size, &policy, &r, &e) == 0) {
            if (r.kind != kinds[k % 2])
                abort();
            /* the ignored list goes into a response header as it is */
            for (const char *c = r.ignored; *c; c++)
                if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
                      *c == '_' || *c == '.' || *c == '-' || *c == '?' || *c == ','))
                    abort();
            if (policy.strict_fields && r.ignored[0] != '\0')
                abort();
            check_accepted(&r);
            check_tool_output(&r, data, size);
            openai_request_free(&r);
        } else {
            check_refused(&e);
        }
    }
    return 0;
}
