/* request.c: parsing and validation of a client's "generate" request.
 *
 * Invariants of a struct request returned by request_from_json: exactly one
 * of prompt / messages / prompt_ids is set, every numeric field is in the
 * range documented in request.h, every string is NUL-terminated and owned by
 * the request. Nothing here asserts on the input: every shape a client can
 * send ends in 0 or an error naming the field.
 */
#include "request.h"
#include "json_check.h"
#include "json_type.h"

#include <errno.h>
#include <stdio.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "sampling.h"
#include "utf8.h"

/* Bytes of client text (a field name, a value) quoted in an error message. */
#define REQUEST_QUOTE_MAX 64

/* How many bytes of s to quote with "%.*s": at most REQUEST_QUOTE_MAX, never
 * ending inside a character. */
static int quote_len(const char *s)
{
    return (int)utf8_cut_len((const uint8_t *)s, strlen(s), REQUEST_QUOTE_MAX);
}

/* Largest integer a double holds exactly: seeds above it must be strings. */
#define REQUEST_EXACT_INT_MAX 9007199254740992.0

int request_parse_envelope(const char *data, size_t len, cJSON **root_out,
                           enum request_kind *kind_out, char *err)
{
    *root_out = NULL;
    if (data == NULL || len == 0)
        return error_set(err, ERR_FORMAT, "request is not valid JSON (empty message)");
    /* cJSON takes raw control characters and invalid UTF-8, cuts strings at
     * \u0000 and keeps the first of two equal keys: the strict pass first. */
    char why[ERR_MSG_MAX];
    int rc = json_check(data, len, why);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(data, len, &end, 0);
    /* Even a refused text may name its id (request_peek_id checks it). */
    *root_out = root;
    if (rc == ERR_INVALID_ARG)
        return error_set(err, ERR_INVALID_ARG, "%s", why);
    if (rc != 0)
        return error_set(err, rc == ERR_NOMEM ? ERR_NOMEM : ERR_FORMAT, "request is not valid JSON: %s",
                         why);
    if (root == NULL) /* cannot happen after json_check; never trust it blindly */
        return error_set(err, ERR_FORMAT, "request is not valid JSON");
    if (!cJSON_IsObject(root))
        return error_set(err, ERR_FORMAT, "request must be a JSON object, got %s", json_type_name(root));
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "v");
    if (v == NULL)
        return error_set(err, ERR_FORMAT, "v: required (protocol version %d)", REQUEST_PROTOCOL_VERSION);
    if (!cJSON_IsNumber(v))
        return error_set(err, ERR_FORMAT, "v: expected a number, got %s", json_type_name(v));
    if (v->valuedouble != REQUEST_PROTOCOL_VERSION)
        return error_set(err, ERR_FORMAT, "v: unsupported protocol version %g (this server speaks %d)",
                         v->valuedouble, REQUEST_PROTOCOL_VERSION);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(root, "type");
    if (type == NULL)
        return error_set(err, ERR_FORMAT, "type: required (\"generate\", \"stats\" or \"cancel\")");
    if (!cJSON_IsString(type))
        return error_set(err, ERR_FORMAT, "type: expected a string, got %s", json_type_name(type));
    if (strcmp(type->valuestring, "generate") == 0)
        *kind_out = REQUEST_KIND_GENERATE;
    else if (strcmp(type->valuestring, "stats") == 0)
        *kind_out = REQUEST_KIND_STATS;
    else if (strcmp(type->valuestring, "cancel") == 0)
        *kind_out = REQUEST_KIND_CANCEL;
    else
        return error_set(err, ERR_FORMAT,
                         "type: unknown message type \"%.*s\" (expected \"generate\", \"stats\" or \"cancel\")",
                         quote_len(type->valuestring), type->valuestring);
    return 0;
}

const char *request_peek_id(const cJSON *root)
{
    const cJSON *id = cJSON_IsObject(root) ? cJSON_GetObjectItemCaseSensitive(root, "id") : NULL;
    /* Echoed in every reply: only an id that is valid UTF-8. */
    if (cJSON_IsString(id) && strlen(id->valuestring) <= REQUEST_ID_MAX &&
        utf8_valid((const uint8_t *)id->valuestring, strlen(id->valuestring), NULL))
        return id->valuestring;
    return "";
}

static size_t skip_ws(const char *d, size_t n, size_t i)
{
    while (i < n && (d[i] == ' ' || d[i] == '\t' || d[i] == '\n' || d[i] == '\r'))
        i++;
    return i;
}

/* The index after the string whose opening quote is at i (SIZE_MAX when it
 * never ends). */
static size_t skip_string(const char *d, size_t n, size_t i)
{
    for (i++; i < n; i++) {
        if (d[i] == '\\')
            i++;
        else if (d[i] == '"')
            return i + 1;
    }
    return SIZE_MAX;
}

/* The index of the ',' or '}' that ends the value starting at i, at the
 * object's own level (n when the text ends first). */
static size_t skip_value(const char *d, size_t n, size_t i)
{
    int depth = 0;
    while (i < n) {
        const char ch = d[i];
        if (ch == '"') {
            if ((i = skip_string(d, n, i)) == SIZE_MAX)
                return n;
            continue;
        }
        if (ch == '{' || ch == '[')
            depth++;
        else if ((ch == '}' || ch == ']') && depth > 0)
            depth--;
        else if ((ch == ',' || ch == '}') && depth == 0)
            return i;
        i++;
    }
    return n;
}

const char *request_peek_id_text(const char *d, size_t n, char *out, size_t cap)
{
    out[0] = '\0';
    size_t i = skip_ws(d, n, 0);
    if (i >= n || d[i] != '{')
        return out;
    i++;
    while ((i = skip_ws(d, n, i)) < n && d[i] == '"') {
        const size_t key = i + 1, key_end = skip_string(d, n, i);
        if (key_end == SIZE_MAX)
            return out;
        const bool is_id = key_end - key == 3 && memcmp(d + key, "id", 2) == 0;
        i = skip_ws(d, n, key_end);
        if (i >= n || d[i] != ':')
            return out;
        i = skip_ws(d, n, i + 1);
        if (is_id) {
            if (i >= n || d[i] != '"')
                return out;
            const size_t v = i + 1, after = skip_string(d, n, i);
            if (after == SIZE_MAX)
                return out;
            const size_t len = after - 1 - v;
            if (len > REQUEST_ID_MAX || len >= cap ||
                memchr(d + v, '\\', len) != NULL || !utf8_valid((const uint8_t *)d + v, len, NULL))
                return out;
            for (size_t k = 0; k < len; k++)
                if ((unsigned char)d[v + k] < 0x20)
                    return out;
            memcpy(out, d + v, len);
            out[len] = '\0';
            return out;
        }
        i = skip_value(d, n, i);
        if (i >= n || d[i] != ',')
            return out;
        i++;
    }
    return out;
}

static int expect_number(const cJSON *item, const char *name, double *out, char *err)
{
    if (!cJSON_IsNumber(item))
        return error_set(err, ERR_INVALID_ARG, "%s: expected a number, got %s", name, json_type_name(item));
    if (!isfinite(item->valuedouble))
        return error_set(err, ERR_INVALID_ARG, "%s: must be a finite number", name);
    *out = item->valuedouble;
    return 0;
}

/* An integral JSON number in [lo, hi]. */
static int expect_int(const cJSON *item, const char *name, long long lo, long long hi, long long *out,
                      char *err)
{
    double d = 0;
    int rc = expect_number(item, name, &d, err);
    if (rc != 0)
        return rc;
    if (d != floor(d))
        return error_set(err, ERR_INVALID_ARG, "%s: expected an integer, got %g", name, d);
    if (d < (double)lo)
        return error_set(err, ERR_INVALID_ARG, "%s: must be >= %lld, got %.0f", name, lo, d);
    if (d > (double)hi)
        return error_set(err, ERR_INVALID_ARG, "%s: must be <= %lld, got %.0f", name, hi, d);
    *out = (long long)d;
    return 0;
}

static int expect_string(const cJSON *item, const char *name, char *err)
{
    if (!cJSON_IsString(item))
        return error_set(err, ERR_INVALID_ARG, "%s: expected a string, got %s", name, json_type_name(item));
    return 0;
}

static char *dup_string(const char *s)
{
    size_t n = strlen(s);
    char *d = malloc(n + 1);
    if (d != NULL)
        memcpy(d, s, n + 1);
    return d;
}

static int parse_seed(const cJSON *item, uint64_t *out, char *err)
{
    if (cJSON_IsNumber(item)) {
        double d = item->valuedouble;
        if (!isfinite(d) || d != floor(d))
            return error_set(err, ERR_INVALID_ARG, "seed: expected a non-negative integer, got %g", d);
        if (d < 0)
            return error_set(err, ERR_INVALID_ARG, "seed: must be >= 0, got %.0f", d);
        if (d > REQUEST_EXACT_INT_MAX)
            return error_set(err, ERR_INVALID_ARG,
                             "seed: %.0f is too large for a JSON number; send seeds above 2^53 as a decimal string",
                             d);
        *out = (uint64_t)d;
        return 0;
    }
    if (cJSON_IsString(item)) {
        const char *s = item->valuestring;
        size_t n = strlen(s);
        if (n == 0 || n > 20)
            return error_set(err, ERR_INVALID_ARG, "seed: expected a decimal integer string, got \"%.*s\"",
                             quote_len(s), s);
        for (size_t i = 0; i < n; i++)
            if (s[i] < '0' || s[i] > '9')
                return error_set(err, ERR_INVALID_ARG, "seed: expected a decimal integer string, got \"%.*s\"",
                                 quote_len(s), s);
        errno = 0;
        unsigned long long v = strtoull(s, NULL, 10);
        if (errno == ERANGE)
            return error_set(err, ERR_INVALID_ARG, "seed: must be < 2^64, got \"%s\"", s);
        *out = (uint64_t)v;
        return 0;
    }
    return error_set(err, ERR_INVALID_ARG, "seed: expected a number or a decimal string, got %s",
                     json_type_name(item));
}

/* A message's "tool_calls": exactly one {"name": non-empty string,
 * "arguments": any JSON value}; the Llama 3.1/3.2 template renders one call
 * a turn and refuses more. */
static int parse_tool_call(struct request_message *msg, const cJSON *calls, int i, char *err)
{
    if (!cJSON_IsArray(calls) || cJSON_GetArraySize(calls) != 1)
        return error_set(err, ERR_INVALID_ARG,
                         "messages[%d].tool_calls: expected an array of exactly one call (the template renders "
                         "one call a turn), got %s",
                         i, cJSON_IsArray(calls) ? "another count" : json_type_name(calls));
    const cJSON *c = calls->child;
    if (!cJSON_IsObject(c))
        return error_set(err, ERR_INVALID_ARG, "messages[%d].tool_calls[0]: expected an object, got %s", i,
                         json_type_name(c));
    const cJSON *f = NULL;
    cJSON_ArrayForEach(f, c) {
        if (f->string == NULL || (strcmp(f->string, "name") != 0 && strcmp(f->string, "arguments") != 0))
            return error_set(err, ERR_INVALID_ARG, "messages[%d].tool_calls[0].%.*s: unknown field", i,
                             f->string ? quote_len(f->string) : 1, f->string ? f->string : "?");
    }
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(c, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(c, "arguments");
    if (!cJSON_IsString(name) || name->valuestring[0] == '\0')
        return error_set(err, ERR_INVALID_ARG, "messages[%d].tool_calls[0].name: expected a non-empty string", i);
    if (args == NULL)
        return error_set(err, ERR_INVALID_ARG, "messages[%d].tool_calls[0].arguments: required", i);
    msg->tool_call_name = dup_string(name->valuestring);
    msg->tool_call_arguments = cJSON_Duplicate(args, 1);
    if (msg->tool_call_name == NULL || msg->tool_call_arguments == NULL)
        return error_set(err, ERR_NOMEM, "messages: out of memory");
    return 0;
}

/* "tools": 1..REQUEST_TOOLS_MAX objects, kept as given for the template. */
static int parse_tools(struct request *r, const cJSON *item, char *err)
{
    if (!cJSON_IsArray(item))
        return error_set(err, ERR_INVALID_ARG, "tools: expected an array, got %s", json_type_name(item));
    int n = cJSON_GetArraySize(item);
    if (n < 1 || n > REQUEST_TOOLS_MAX)
        return error_set(err, ERR_INVALID_ARG, "tools: must hold 1..%d tools, got %d", REQUEST_TOOLS_MAX, n);
    int i = 0;
    const cJSON *t = NULL;
    cJSON_ArrayForEach(t, item) {
        if (!cJSON_IsObject(t))
            return error_set(err, ERR_INVALID_ARG, "tools[%d]: expected an object, got %s", i, json_type_name(t));
        i++;
    }
    if (r->input != REQUEST_INPUT_MESSAGES)
        return error_set(err, ERR_INVALID_ARG, "tools: only with messages (the chat template renders them)");
    r->tools = cJSON_Duplicate(item, 1);
    if (r->tools == NULL)
        return error_set(err, ERR_NOMEM, "tools: out of memory");
    return 0;
}

static int parse_messages(struct request *r, const cJSON *item, char *err)
{
    if (!cJSON_IsArray(item))
        return error_set(err, ERR_INVALID_ARG, "messages: expected an array, got %s", json_type_name(item));
    int n = cJSON_GetArraySize(item);
    if (n < 1)
        return error_set(err, ERR_INVALID_ARG, "messages: must hold at least one message");
    r->messages = calloc((size_t)n, sizeof(*r->messages));
    if (r->messages == NULL)
        return error_set(err, ERR_NOMEM, "messages: out of memory");
    int i = 0;
    const cJSON *m = NULL;
    cJSON_ArrayForEach(m, item) {
        if (!cJSON_IsObject(m))
            return error_set(err, ERR_INVALID_ARG, "messages[%d]: expected an object, got %s", i,
                             json_type_name(m));
        const cJSON *f = NULL;
        cJSON_ArrayForEach(f, m) {
            if (f->string == NULL || (strcmp(f->string, "role") != 0 && strcmp(f->string, "content") != 0 &&
                                      strcmp(f->string, "tool_calls") != 0))
                return error_set(err, ERR_INVALID_ARG, "messages[%d].%.*s: unknown field", i,
                                 f->string ? quote_len(f->string) : 1, f->string ? f->string : "?");
        }
        const cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        char name[48];
        if (role == NULL)
            return error_set(err, ERR_INVALID_ARG, "messages[%d].role: required", i);
        snprintf(name, sizeof(name), "messages[%d].role", i);
        int rc = expect_string(role, name, err);
        if (rc != 0)
            return rc;
        if (role->valuestring[0] == '\0')
            return error_set(err, ERR_INVALID_ARG, "messages[%d].role: must not be empty", i);
        if (content == NULL && calls == NULL)
            return error_set(err, ERR_INVALID_ARG, "messages[%d].content: required", i);
        snprintf(name, sizeof(name), "messages[%d].content", i);
        if (content != NULL && (rc = expect_string(content, name, err)) != 0)
            return rc;
        r->messages[i].role = dup_string(role->valuestring);
        r->messages[i].content = dup_string(content != NULL ? content->valuestring : "");
        r->n_messages = i + 1;
        if (r->messages[i].role == NULL || r->messages[i].content == NULL)
            return error_set(err, ERR_NOMEM, "messages: out of memory");
        if (calls != NULL && (rc = parse_tool_call(&r->messages[i], calls, i, err)) != 0)
            return rc;
        i++;
    }
    return 0;
}

static int parse_prompt_ids(struct request *r, const cJSON *item, char *err)
{
    if (!cJSON_IsArray(item))
        return error_set(err, ERR_INVALID_ARG, "prompt_ids: expected an array, got %s", json_type_name(item));
    int n = cJSON_GetArraySize(item);
    if (n < 1)
        return error_set(err, ERR_INVALID_ARG, "prompt_ids: must hold at least one token id");
    r->prompt_ids = malloc((size_t)n * sizeof(*r->prompt_ids));
    if (r->prompt_ids == NULL)
        return error_set(err, ERR_NOMEM, "prompt_ids: out of memory");
    int i = 0;
    const cJSON *e = NULL;
    cJSON_ArrayForEach(e, item) {
        char name[32];
        snprintf(name, sizeof(name), "prompt_ids[%d]", i);
        long long v = 0;
        int rc = expect_int(e, name, 0, INT32_MAX, &v, err);
        if (rc != 0)
            return rc;
        r->prompt_ids[i++] = (int32_t)v;
    }
    r->n_prompt_ids = n;
    return 0;
}

static int parse_stop(struct request *r, const cJSON *item, char *err)
{
    if (!cJSON_IsArray(item))
        return error_set(err, ERR_INVALID_ARG, "stop: expected an array of strings, got %s",
                         json_type_name(item));
    int n = cJSON_GetArraySize(item);
    if (n > REQUEST_STOP_MAX)
        return error_set(err, ERR_INVALID_ARG, "stop: at most %d strings, got %d", REQUEST_STOP_MAX, n);
    if (n == 0)
        return 0;
    r->stop = calloc((size_t)n, sizeof(*r->stop));
    if (r->stop == NULL)
        return error_set(err, ERR_NOMEM, "stop: out of memory");
    int i = 0;
    const cJSON *e = NULL;
    cJSON_ArrayForEach(e, item) {
        if (!cJSON_IsString(e))
            return error_set(err, ERR_INVALID_ARG, "stop[%d]: expected a string, got %s", i, json_type_name(e));
        size_t len = strlen(e->valuestring);
        if (len == 0)
            return error_set(err, ERR_INVALID_ARG, "stop[%d]: must not be empty", i);
        if (len > REQUEST_STOP_BYTES_MAX)
            return error_set(err, ERR_INVALID_ARG, "stop[%d]: at most %d bytes, got %zu", i,
                             REQUEST_STOP_BYTES_MAX, len);
        r->stop[i] = dup_string(e->valuestring);
        r->n_stop = i + 1;
        if (r->stop[i] == NULL)
            return error_set(err, ERR_NOMEM, "stop: out of memory");
        i++;
    }
    return 0;
}

static const char *const request_fields[] = {
    "v", "type", "id", "prompt", "messages", "prompt_ids", "max_tokens", "temperature", "top_k", "top_p",
    "min_p", "seed", "stop", "stream", "spec_k", "spec_mode", "draft", "spec_tree", "ignore_eos",
    "logprobs", "n", "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias",
    "grammar", "prediction", "tools",
};

static int check_fields(const cJSON *root, char *err)
{
    const size_t n_known = sizeof(request_fields) / sizeof(request_fields[0]);
    const cJSON *f = NULL;
    cJSON_ArrayForEach(f, root) {
        if (f->string == NULL)
            return error_set(err, ERR_INVALID_ARG, "request: field without a name");
        size_t k = 0;
        while (k < n_known && strcmp(f->string, request_fields[k]) != 0)
            k++;
        if (k == n_known)
            return error_set(err, ERR_INVALID_ARG, "%.*s: unknown field", quote_len(f->string),
                             f->string);
        for (const cJSON *g = f->next; g != NULL; g = g->next)
            if (g->string != NULL && strcmp(g->string, f->string) == 0)
                return error_set(err, ERR_INVALID_ARG, "%.*s: given more than once",
                                 quote_len(f->string), f->string);
    }
    return 0;
}

int request_cancel_from_json(const cJSON *root, char *id_out, char *err)
{
    id_out[0] = '\0';
    const cJSON *f = NULL;
    cJSON_ArrayForEach(f, root) {
        if (f->string == NULL || (strcmp(f->string, "v") != 0 && strcmp(f->string, "type") != 0 &&
                                  strcmp(f->string, "id") != 0))
            return error_set(err, ERR_INVALID_ARG, "%.*s: unknown field (a cancel carries only v, type and id)",
                             f->string ? quote_len(f->string) : 0, f->string ? f->string : "");
    }
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(root, "id");
    if (id == NULL)
        return error_set(err, ERR_INVALID_ARG, "id: required (the id of the request to cancel)");
    int rc = expect_string(id, "id", err);
    if (rc != 0)
        return rc;
    size_t n = strlen(id->valuestring);
    if (n > REQUEST_ID_MAX)
        return error_set(err, ERR_INVALID_ARG, "id: at most %d bytes, got %zu", REQUEST_ID_MAX, n);
    memcpy(id_out, id->valuestring, n + 1);
    return 0;
}

/* "id": at most REQUEST_ID_MAX bytes, copied. */
static int fill_id(struct request *r, const cJSON *root, char *err)
{
    int rc;
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(root, "id");
    if (item != NULL) {
        if ((rc = expect_string(item, "id", err)) != 0)
            return rc;
        if (strlen(item->valuestring) > REQUEST_ID_MAX)
            return error_set(err, ERR_INVALID_ARG, "id: at most %d bytes, got %zu", REQUEST_ID_MAX,
                             strlen(item->valuestring));
        memcpy(r->id, item->valuestring, strlen(item->valuestring) + 1);
    }
    return 0;
}

/* The input: exactly one of prompt, messages, prompt_ids. */
static int fill_input(struct request *r, const cJSON *root, char *err)
{
    int rc;
    const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    const cJSON *messages = cJSON_GetObjectItemCaseSensitive(root, "messages");
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(root, "prompt_ids");
    int n_inputs = (prompt != NULL) + (messages != NULL) + (ids != NULL);
    if (n_inputs == 0)
        return error_set(err, ERR_INVALID_ARG, "prompt: required (exactly one of prompt, messages, prompt_ids)");
    if (n_inputs > 1)
        return error_set(err, ERR_INVALID_ARG,
                         "prompt: give exactly one of prompt, messages, prompt_ids (got %d of them)", n_inputs);
    if (prompt != NULL) {
        if ((rc = expect_string(prompt, "prompt", err)) != 0)
            return rc;
        r->input = REQUEST_INPUT_PROMPT;
        r->prompt_len = strlen(prompt->valuestring);
        if (r->prompt_len == 0)
            return error_set(err, ERR_INVALID_ARG, "prompt: must not be empty");
        r->prompt = dup_string(prompt->valuestring);
        if (r->prompt == NULL)
            return error_set(err, ERR_NOMEM, "prompt: out of memory");
    } else if (messages != NULL) {
        r->input = REQUEST_INPUT_MESSAGES;
        if ((rc = parse_messages(r, messages, err)) != 0)
            return rc;
    } else {
        r->input = REQUEST_INPUT_IDS;
        if ((rc = parse_prompt_ids(r, ids, err)) != 0)
            return rc;
    }
    return 0;
}

/* max_tokens and the sampling settings, checked as the workers check them. */
static int fill_sampling(struct request *r, const cJSON *root, const struct request_limits *limits, char *err)
{
    const cJSON *item;
    int rc;
    long long v = 0;
    double d = 0;
    if ((item = cJSON_GetObjectItemCaseSensitive(root, "max_tokens")) != NULL) {
        if ((rc = expect_int(item, "max_tokens", 1, limits->max_tokens_max, &v, err)) != 0)
            return rc;
        r->max_tokens = (int)v;
    }
    if ((item = cJSON_GetObjectItemCaseSensitive(root, "temperature")) != NULL) {
        if ((rc = expect_number(item, "temperature", &d, err)) != 0)
            return rc;
        r->temperature = d;
    }
    if ((item = cJSON_GetObjectItemCaseSensitive(root, "top_k")) != NULL) {
        if ((rc = expect_int(item, "top_k", 0, SAMPLING_TOP_K_MAX, &v, err)) != 0)
            return rc;
        r->top_k = (int)v;
    }
    if ((item = cJSON_GetObjectItemCaseSensitive(root, "top_p")) != NULL) {
        if ((rc = expect_number(item, "top_p", &d, err)) != 0)
            return rc;
        r->top_p = d;
    }
    if ((item = cJSON_GetObjectItemCaseSensitive(root, "min_p")) != NULL) {
        if ((rc = expect_number(item, "min_p", &d, err)) != 0)
            return rc;
        r->min_p = d;
    }
    /* Exactly what the workers will accept (one definition: sampling.h). */
    struct sampling_params sp;
    sampling_params_default(&sp);
    if ((rc = sampling_params_set(&sp, r->temperature, r->top_k, r->top_p, r->min_p, err)) != 0)
        return rc;
    return 0;
}

/* seed, stop, stream and ignore_eos. */
static int fill_output_controls(struct request *r, const cJSON *root, char *err)
{
    const cJSON *item;
    int rc;
    if ((item = cJSON_GetObjectItemCaseSensitive(root, "seed")) != NULL) {
        if ((rc = parse_seed(item, &r->seed, err)) != 0)
            return rc;
        r->has_seed = true;
    }
    if ((item = cJSON_GetObjectItemCaseSensitive(root, "stop")) != NULL) {
        if ((rc = parse_stop(r, item, err)) != 0)
            return rc;
    }
    if ((item = cJSON_GetObjectItemCaseSensitive(root, "stream")) != NULL) {
        if (!cJSON_IsBool(item))
            return error_set(err, ERR_INVALID_ARG, "stream: expected a boolean, got %s", json_type_name(item));
        r->stream = cJSON_IsTrue(item);
    }
    if ((item = cJSON_GetObjectItemCaseSensitive(root, "ignore_eos")) != NULL) {
        if (!cJSON_IsBool(item))
            return error_set(err, ERR_INVALID_ARG, "ignore_eos: expected a boolean, got %s",
                             json_type_name(item));
        r->ignore_eos = cJSON_IsTrue(item);
    }
    return 0;
}

/* spec_k, spec_mode, draft and spec_tree. */
static int fill_speculation(struct request *r, const cJSON *root, const struct request_limits *limits, char *err)
{
    const cJSON *item;
    long long v = 0;
    int rc;
    if ((item = cJSON_GetObjectItemCaseSensitive(root, "spec_k")) != NULL) {
        int k_max = limits->spec_k_max > 0 ? limits->spec_k_max : REQUEST_SPEC_K_MAX;
        if ((rc = expect_int(item, "spec_k", 0, REQUEST_SPEC_K_MAX, &v, err)) != 0)
            return rc;
        if (v > k_max)
            return error_set(err, ERR_INVALID_ARG,
                             "spec_k: must be <= %d (this server drafts at most coordinator.spec_k_max = "
                             "%d tokens per round), got %lld",
                             k_max, k_max, v);
        r->spec_k = (int)v;
    }
    if ((item = cJSON_GetObjectItemCaseSensitive(root, "spec_mode")) != NULL) {
        if ((rc = expect_string(item, "spec_mode", err)) != 0)
            return rc;
        if (strcmp(item->valuestring, "sampled") == 0)
            r->spec_mode = REQUEST_SPEC_MODE_SAMPLED;
        else if (strcmp(item->valuestring, "point_mass") == 0)
            r->spec_mode = REQUEST_SPEC_MODE_POINT_MASS;
        else
            return error_set(err, ERR_INVALID_ARG,
                             "spec_mode: expected \"sampled\" or \"point_mass\", got \"%.*s\"",
                             quote_len(item->valuestring), item->valuestring);
    }
    if ((item = cJSON_GetObjectItemCaseSensitive(root, "draft")) != NULL) {
        if ((rc = expect_string(item, "draft", err)) != 0)
            return rc;
        if ((rc = request_draft_parse(item->valuestring, "draft", &r->draft, err)) != 0)
            return rc;
    }
    if ((item = cJSON_GetObjectItemCaseSensitive(root, "spec_tree")) != NULL &&
        (rc = request_spec_tree_parse(item, "spec_tree", &r->spec_tree, err)) != 0)
        return rc;
    return 0;
}

static int fill_request(struct request *r, const cJSON *root, const struct request_limits *limits, char *err)
{
    const cJSON *item;
    int rc;
    if ((rc = check_fields(root, err)) != 0 || (rc = fill_id(r, root, err)) != 0 ||
        (rc = fill_input(r, root, err)) != 0)
        return rc;
    if ((item = cJSON_GetObjectItemCaseSensitive(root, "tools")) != NULL && (rc = parse_tools(r, item, err)) != 0)
        return rc;

    if ((rc = fill_sampling(r, root, limits, err)) != 0 || (rc = fill_output_controls(r, root, err)) != 0)
        return rc;
    return fill_speculation(r, root, limits, err);
}

/* logit_bias: {"<token id>": bias, ...}, OpenAI's shape. */
static int parse_logit_bias(struct sampling_controls *c, const cJSON *item, char *err)
{
    if (!cJSON_IsObject(item))
        return error_set(err, ERR_INVALID_ARG, "logit_bias: expected an object, got %s", json_type_name(item));
    const cJSON *e = NULL;
    cJSON_ArrayForEach(e, item) {
        if (c->n_bias == SAMPLING_BIAS_MAX)
            return error_set(err, ERR_INVALID_ARG, "logit_bias: at most %d entries", SAMPLING_BIAS_MAX);
        char *end = NULL;
        long id = strtol(e->string, &end, 10);
        if (e->string[0] < '0' || e->string[0] > '9' || *end != '\0' || id > INT32_MAX)
            return error_set(err, ERR_INVALID_ARG, "logit_bias: keys are token ids, got \"%.*s\"",
                             quote_len(e->string), e->string);
        if (!cJSON_IsNumber(e) || !(fabs(e->valuedouble) <= SAMPLING_BIAS_ABS_MAX))
            return error_set(err, ERR_INVALID_ARG, "logit_bias: the bias of token %ld must be a number in "
                             "[-100, 100]", id);
        c->bias_ids[c->n_bias] = (int32_t)id;
        c->bias[c->n_bias++] = (float)e->valuedouble;
    }
    return 0;
}

/* The penalties (sampling.h's ranges, named as given). */
static int parse_penalties(struct sampling_controls *c, const cJSON *root, char *err)
{
    static const char *const names[3] = {"presence_penalty", "frequency_penalty", "repetition_penalty"};
    float *dst[3] = {&c->presence_penalty, &c->frequency_penalty, &c->repetition_penalty};
    for (int i = 0; i < 3; i++) {
        const cJSON *item = cJSON_GetObjectItemCaseSensitive(root, names[i]);
        double d = 0;
        int rc = item ? expect_number(item, names[i], &d, err) : 0;
        if (rc != 0)
            return rc;
        if (item)
            *dst[i] = (float)d;
        if (i == 2 && item && !(d > 0))
            return error_set(err, ERR_INVALID_ARG, "repetition_penalty: must be in (0, 10], got %g", d);
    }
    return sampling_controls_validate(c, err);
}

/* The fields fill_request leaves to others (it is long enough). */
static int fill_outputs(struct request *r, const cJSON *root, char *err)
{
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(root, "n");
    if (n != NULL) {
        long long v = 0;
        int rc = expect_int(n, "n", 1, REQUEST_N_MAX, &v, err);
        if (rc != 0)
            return rc;
        r->n = (int)v;
    }
    const cJSON *bias = cJSON_GetObjectItemCaseSensitive(root, "logit_bias");
    int brc = bias ? parse_logit_bias(&r->ctl, bias, err) : 0;
    if (brc == 0)
        brc = parse_penalties(&r->ctl, root, err);
    if (brc != 0)
        return brc;
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(root, "logprobs");
    if (item != NULL) {
        long long v = 0;
        int rc = expect_int(item, "logprobs", 0, SAMPLING_TOP_LOGPROBS_MAX, &v, err);
        if (rc != 0)
            return rc;
        r->logprobs = (int)v;
    }
    /* prediction: the text, or OpenAI's {"type": "content", "content": text} */
    const cJSON *pred = cJSON_GetObjectItemCaseSensitive(root, "prediction");
    if (pred != NULL && !cJSON_IsNull(pred)) {
        const cJSON *text = pred;
        if (cJSON_IsObject(pred)) {
            const cJSON *type = cJSON_GetObjectItemCaseSensitive(pred, "type");
            text = cJSON_GetObjectItemCaseSensitive(pred, "content");
            const cJSON *f = NULL;
            cJSON_ArrayForEach(f, pred) {
                if (strcmp(f->string, "type") != 0 && strcmp(f->string, "content") != 0)
                    return error_set(err, ERR_INVALID_ARG, "prediction.%.*s: unknown field", quote_len(f->string),
                                     f->string);
            }
            if (!cJSON_IsString(type) || strcmp(type->valuestring, "content") != 0)
                return error_set(err, ERR_INVALID_ARG, "prediction.type: must be \"content\"");
        }
        if (!cJSON_IsString(text))
            return error_set(err, ERR_INVALID_ARG, "prediction: expected a string or {\"type\": \"content\", "
                             "\"content\": string}, got %s", json_type_name(text));
        r->prediction_len = strlen(text->valuestring);
        if (!(r->prediction = strdup(text->valuestring)))
            return error_set(err, ERR_NOMEM, "prediction: out of memory");
    }
    /* Compiled here, engine and all, so that a grammar a worker would fail
     * on is the client's error, named, before anything is scheduled. */
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(root, "grammar");
    if (g != NULL && !cJSON_IsNull(g)) {
        int rc = grammar_spec_from_json(&r->grammar, g, "grammar", 0, err);
        if (rc == 0)
            rc = grammar_spec_check(&r->grammar, "grammar", err);
        if (rc != 0)
            return rc == ERR_NOMEM ? rc : ERR_INVALID_ARG;
    }
    return 0;
}

int request_from_json(struct request **out, const cJSON *root, const struct request_limits *limits,
                      char *err)
{
    *out = NULL;
    if (!cJSON_IsObject(root))
        return error_set(err, ERR_INVALID_ARG, "request must be a JSON object");
    if (limits == NULL || limits->max_tokens_max < 1)
        return error_set(err, ERR_INVALID_ARG, "request limits: max_tokens_max must be >= 1");
    struct request *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return error_set(err, ERR_NOMEM, "request: out of memory");
    r->max_tokens = REQUEST_MAX_TOKENS_DEFAULT < limits->max_tokens_max ? REQUEST_MAX_TOKENS_DEFAULT
                                                                         : limits->max_tokens_max;
    r->temperature = 1.0;
    r->top_k = 0;
    r->top_p = 1.0;
    r->min_p = 0.0;
    r->spec_k = -1;
    r->spec_mode = REQUEST_SPEC_MODE_DEFAULT;
    r->spec_tree = REQUEST_SPEC_TREE_UNSET;
    r->logprobs = -1;
    r->n = 1;
    int rc = fill_request(r, root, limits, err);
    if (rc == 0)
        rc = fill_outputs(r, root, err);
    if (rc != 0) {
        request_destroy(r);
        return rc;
    }
    *out = r;
    return 0;
}

int request_parse(struct request **out, const char *data, size_t len,
                  const struct request_limits *limits, char *err)
{
    *out = NULL;
    cJSON *root = NULL;
    enum request_kind kind = REQUEST_KIND_GENERATE;
    int rc = request_parse_envelope(data, len, &root, &kind, err);
    if (rc == 0 && kind != REQUEST_KIND_GENERATE)
        rc = error_set(err, ERR_FORMAT, "type: expected \"generate\"");
    if (rc == 0)
        rc = request_from_json(out, root, limits, err);
    cJSON_Delete(root);
    return rc;
}

void request_destroy(struct request *req)
{
    if (req == NULL)
        return;
    free(req->prompt);
    for (int i = 0; i < req->n_messages; i++) {
        free(req->messages[i].role);
        free(req->messages[i].content);
        free(req->messages[i].tool_call_name);
        cJSON_Delete(req->messages[i].tool_call_arguments);
    }
    free(req->messages);
    cJSON_Delete(req->tools);
    free(req->prompt_ids);
    for (int i = 0; i < req->n_stop; i++)
        free(req->stop[i]);
    free(req->stop);
    grammar_spec_free(&req->grammar);
    free(req->prediction);
    free(req);
}

const char *request_draft_name(enum request_draft draft)
{
    switch (draft) {
    case REQUEST_DRAFT_MODEL:
        return "model";
    case REQUEST_DRAFT_NGRAM:
        return "ngram";
    case REQUEST_DRAFT_NONE:
        return "none";
    case REQUEST_DRAFT_SUFFIX:
        return "suffix";
    case REQUEST_DRAFT_AUTO:
        return "auto";
    case REQUEST_DRAFT_PREDICTION:
        return "prediction";
    default:
        return "default";
    }
}

int request_draft_parse(const char *text, const char *field, enum request_draft *out, char *err)
{
    for (enum request_draft d = REQUEST_DRAFT_MODEL; d <= REQUEST_DRAFT_AUTO; d++)
        if (strcmp(text, request_draft_name(d)) == 0) {
            *out = d;
            return 0;
        }
    return error_set(err, ERR_INVALID_ARG,
                     "%s: expected \"auto\", \"model\", \"ngram\", \"suffix\" or \"none\", got \"%.*s\"", field,
                     quote_len(text), text);
}

const char *request_spec_mode_name(enum request_spec_mode mode)
{
    switch (mode) {
    case REQUEST_SPEC_MODE_SAMPLED:
        return "sampled";
    case REQUEST_SPEC_MODE_POINT_MASS:
        return "point_mass";
    default:
        return "default";
    }
}

int request_spec_tree_parse_text(const char *text, const char *field, int *out, char *err)
{
    if (strcmp(text, "off") == 0) {
        *out = REQUEST_SPEC_TREE_OFF;
        return 0;
    }
    if (strcmp(text, "auto") == 0) {
        *out = REQUEST_SPEC_TREE_AUTO;
        return 0;
    }
    char *end = NULL;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (text[0] >= '0' && text[0] <= '9' && *end == '\0' && errno == 0 && v >= REQUEST_SPEC_TREE_MIN &&
        v <= REQUEST_SPEC_TREE_MAX) {
        *out = (int)v;
        return 0;
    }
    return error_set(err, ERR_INVALID_ARG,
                     "%s: expected \"off\", \"auto\" or a node budget %d..%d (the last token and the drafts), "
                     "got \"%.*s\"",
                     field, REQUEST_SPEC_TREE_MIN, REQUEST_SPEC_TREE_MAX, quote_len(text), text);
}

int request_spec_tree_parse(const cJSON *item, const char *field, int *out, char *err)
{
    if (cJSON_IsString(item))
        return request_spec_tree_parse_text(item->valuestring, field, out, err);
    if (!cJSON_IsNumber(item))
        return error_set(err, ERR_INVALID_ARG,
                         "%s: expected \"off\", \"auto\" or an integer %d..%d, got %s", field,
                         REQUEST_SPEC_TREE_MIN, REQUEST_SPEC_TREE_MAX, json_type_name(item));
    const double v = item->valuedouble;
    if (v != floor(v) || v < REQUEST_SPEC_TREE_MIN || v > REQUEST_SPEC_TREE_MAX)
        return error_set(err, ERR_INVALID_ARG,
                         "%s: a node budget must be an integer %d..%d (the last token and the drafts), got %g",
                         field, REQUEST_SPEC_TREE_MIN, REQUEST_SPEC_TREE_MAX, v);
    *out = (int)v;
    return 0;
}

const char *request_spec_tree_name(int spec_tree, char *buf)
{
    if (spec_tree == REQUEST_SPEC_TREE_OFF)
        return "off";
    if (spec_tree == REQUEST_SPEC_TREE_AUTO)
        return "auto";
    snprintf(buf, 12, "%d", spec_tree);
    return buf;
}
