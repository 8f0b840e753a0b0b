/* openai.h: OpenAI's HTTP API shapes, translated to and from the
 * coordinator's client protocol.
 *
 * What it is: pure functions, no I/O. openai_parse_request validates a
 * /v1/chat/completions or /v1/completions body and builds the coordinator's
 * "generate" message; the openai_*_json functions build responses, stream
 * chunks and error objects from the coordinator's replies. A field this
 * server knows and cannot honour (functions, audio, ...) is a
 * 400 naming it, never silently
 * ignored; a field it does not know is accepted and listed (the vendor
 * extras of frontends and harnesses), or a 400 under strict_fields; range
 * checks of the sampling fields
 * are left to the coordinator, whose message names the field too.
 * What it is not: an HTTP server (server.c) or a client of the coordinator
 * (generation.c).
 */
#ifndef TANDEM_GATEWAY_OPENAI_H
#define TANDEM_GATEWAY_OPENAI_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "openai_tools.h"

#define OPENAI_MESSAGE_MAX 512
#define OPENAI_PARAM_MAX 96
#define OPENAI_IGNORED_MAX 256   /* the list of fields a request had ignored */

enum openai_kind {
    OPENAI_CHAT = 0,         /* /v1/chat/completions */
    OPENAI_COMPLETION = 1,   /* /v1/completions */
};

/* An error as OpenAI reports it: {"error":{"message","type","param","code"}}
 * with its HTTP status. */
struct openai_error {
    int status;
    const char *type;        /* "invalid_request_error", "authentication_error", ... */
    char code[48];           /* "": JSON null (copied: replies are freed before errors are sent) */
    char param[OPENAI_PARAM_MAX];  /* "": JSON null */
    char message[OPENAI_MESSAGE_MAX];
};

/* What a parse checks a request against: the served model's name (what an
 * absent "model" means; another name is a 404) and whether fields this
 * server does not know are a 400 (strict_fields, gateway.strict_fields) or
 * accepted, listed in openai_request.ignored. */
struct openai_policy {
    const char *served_model;
    bool strict_fields;
};

/* A validated request. generate is the coordinator's message without "id"
 * (owned: openai_request_free). ignored: the fields accepted without
 * effect (unknown fields when not strict), comma
 * separated, "" when none; each name kept to [A-Za-z0-9_.-] (any other byte
 * is '?', so the list can go in a header and a log line as it is), the list
 * cut with ",..." when it does not fit. */
struct openai_request {
    enum openai_kind kind;
    bool stream;
    bool include_usage;      /* stream_options.include_usage */
    bool logprobs;           /* chat logprobs true, or completions logprobs N */
    int top_logprobs;        /* chat top_logprobs, completions logprobs: 0..20 */
    bool top_given;          /* chat top_logprobs was given (needs logprobs true) */
    int n;                   /* choices, 1..16 (the coordinator's "n") */
    cJSON *generate;
    char ignored[OPENAI_IGNORED_MAX];
    struct openai_tools tools; /* tools and tool_choice: how the output is read (openai_tools.h) */
};

/* Fills e (status, type, code, param, printf-style message); returns e->status. */
int openai_error_set(struct openai_error *e, int status, const char *type, const char *code, const char *param,
                     const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* Parses len bytes of body for kind under policy: "model", when given and
 * not null, must equal policy->served_model (404 model_not_found). 0, or
 * -1 with e filled (400 for every malformed or unsupported request). */
int openai_parse_request(enum openai_kind kind, const char *body, size_t len, const struct openai_policy *policy,
                         struct openai_request *out, struct openai_error *e);
void openai_request_free(struct openai_request *r);

/* The error object of e (caller cJSON_Deletes; NULL when out of memory). */
cJSON *openai_error_json(const struct openai_error *e);

/* Fills e from a coordinator error reply {"code","message"}: the status a
 * client should see (invalid_request / context_full 400, overloaded 429,
 * target_unavailable and coordinator_unavailable 503, anything else 500)
 * and the param the message names ("max_tokens: must be ..."). */
void openai_error_from_reply(const cJSON *reply, struct openai_error *e);

/* "stop" or "length" for the coordinator's finish_reason. */
const char *openai_finish_reason(const char *coordinator_reason);

/* The done replies of a request's n > 1 choices (in index order) as one
 * reply for the functions below: the first, with "choices" holding them
 * all (the response's choices; usage sums over them). n == 1: a copy of
 * dones[0]. New (caller deletes), NULL when out of memory. */
cJSON *openai_merge_dones(cJSON *const *dones, int n);

/* The whole non-streamed response for a coordinator "done" reply (or
 * openai_merge_dones' of several). */
cJSON *openai_response_json(enum openai_kind kind, const char *response_id, long created, const char *model,
                            const cJSON *done);

/* What one stream chunk carries besides the response's identity. */
struct openai_chunk {
    const cJSON *token;   /* a coordinator "token" reply (its text and ids), or NULL */
    const cJSON *done;    /* the final chunk's "done" reply (finish_reason, the tandem
                             statistics), else NULL */
    bool role_first;      /* the chat chunk that opens the stream (delta.role) */
    bool with_usage_null; /* "usage": null on the chunk (stream_options.include_usage) */
};

/* One stream chunk. */
cJSON *openai_chunk_json(enum openai_kind kind, const char *response_id, long created, const char *model,
                         const struct openai_chunk *chunk);

/* The usage-only chunk of stream_options.include_usage (choices empty). */
cJSON *openai_usage_chunk_json(enum openai_kind kind, const char *response_id, long created, const char *model,
                               const cJSON *done);

#endif
