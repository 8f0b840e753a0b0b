/* request.h: a client's "generate" request, parsed and validated.
 *
 * What it is: the one place that turns the JSON a client sends to the
 * coordinator ({"v":1,"type":"generate",...}, see docs/protocol.md) into a
 * plain struct whose every field is in range. A request that comes out of
 * request_parse is safe to schedule as far as its own fields go; what
 * depends on the models (token ids against the vocabulary, prompt length
 * against the context) is checked by the coordinator after tokenization.
 * What it is not: a tokenizer or a scheduler; it knows nothing of models.
 *
 * Errors: every rejection names the field and what was wrong, e.g.
 * "temperature: expected a number, got string", "max_tokens: must be >= 1,
 * got 0", "request is not valid JSON". The wire error code for all of them
 * is "invalid_request" (REQUEST_ERROR_CODE).
 */
#ifndef TANDEM_REQUEST_H
#define TANDEM_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "grammar_spec.h"
#include "sampling.h"

#define REQUEST_PROTOCOL_VERSION 1
#define REQUEST_ID_MAX 128           /* bytes of the client's "id" string */
#define REQUEST_STOP_MAX 8           /* stop strings per request */
#define REQUEST_STOP_BYTES_MAX 256   /* bytes per stop string */
#define REQUEST_SPEC_K_MAX 16        /* largest spec_k a client may ask for */
#define REQUEST_MAX_TOKENS_DEFAULT 128
#define REQUEST_N_MAX 16             /* choices per request */
#define REQUEST_ERROR_CODE "invalid_request"

enum request_input {
    REQUEST_INPUT_PROMPT = 0,    /* "prompt": text, tokenized as is (with BOS) */
    REQUEST_INPUT_MESSAGES = 1,  /* "messages": chat, rendered by the chat template */
    REQUEST_INPUT_IDS = 2,       /* "prompt_ids": token ids passed through */
};

enum request_spec_mode {
    REQUEST_SPEC_MODE_DEFAULT = 0,  /* not given: the coordinator's configured mode */
    REQUEST_SPEC_MODE_SAMPLED = 1,
    REQUEST_SPEC_MODE_POINT_MASS = 2,
};

/* Where a request's drafts come from (its "draft" field). */
enum request_draft {
    REQUEST_DRAFT_DEFAULT = 0,   /* not given: the coordinator's configured source (coordinator.draft) */
    REQUEST_DRAFT_MODEL = 1,     /* the draft worker's model */
    REQUEST_DRAFT_NGRAM = 2,     /* n-grams of the request's own tokens, made in the coordinator */
    REQUEST_DRAFT_NONE = 3,      /* no speculation: target-only decoding */
    REQUEST_DRAFT_SUFFIX = 4,    /* earlier requests' prompts and outputs (the suffix cache) */
    REQUEST_DRAFT_AUTO = 5,      /* greedy: a long suffix-cache match, else a longest-context n-gram
                                    match, else the model (any n-gram match without one); sampled: the
                                    model (a seed then reproduces its output) */
    REQUEST_DRAFT_PREDICTION = 6, /* not a client's value: the request's "prediction", a source the
                                     coordinator takes before the others when it matches */
};

/* A request's token trees ("spec_tree", issue 61; docs/token-trees.md):
 * "off", "auto", or a node budget N: the coordinator's model-free drafts
 * (suffix cache, n-grams) go to the target as a token tree of at most N
 * nodes, its root (the last token) included, as the model counts them
 * (LLAMA_TREE_MAX): N - 1 drafts. */
#define REQUEST_SPEC_TREE_UNSET (-1)  /* not given: coordinator.spec_tree */
#define REQUEST_SPEC_TREE_OFF 0       /* chains only */
#define REQUEST_SPEC_TREE_AUTO 1      /* the coordinator's choice (docs/token-trees.md says which) */
#define REQUEST_SPEC_TREE_MIN 2       /* the smallest budget: the root and one draft */
#define REQUEST_SPEC_TREE_MAX 32      /* the largest: the model's tree limit */

struct request_message {
    char *role;      /* non-empty */
    char *content;   /* may be empty */
    char *tool_call_name;      /* "tool_calls": [{"name", "arguments"}]: the one call, NULL when none */
    cJSON *tool_call_arguments; /* its arguments (any JSON value), owned; NULL when none */
};

#define REQUEST_TOOLS_MAX 128   /* tool definitions per request */

/* Limits that come from the coordinator's configuration. */
struct request_limits {
    int max_tokens_max;   /* largest accepted max_tokens (>= 1) */
    int spec_k_max;       /* largest accepted spec_k (the draft's buffer holds that many
                             drafts per round); 0 = REQUEST_SPEC_K_MAX */
};

struct request {
    char id[REQUEST_ID_MAX + 1];   /* client's id, "" when not given */
    enum request_input input;
    char *prompt;                  /* REQUEST_INPUT_PROMPT: NUL-terminated text */
    size_t prompt_len;             /* bytes of prompt */
    struct request_message *messages; /* REQUEST_INPUT_MESSAGES */
    int n_messages;                /* >= 1 */
    cJSON *tools;                  /* "tools": an array of 1..REQUEST_TOOLS_MAX objects (rendered by the
                                      chat template as given), owned; NULL when not given */
    int32_t *prompt_ids;           /* REQUEST_INPUT_IDS: each >= 0 */
    int n_prompt_ids;              /* >= 1 */
    int max_tokens;                /* 1 .. limits.max_tokens_max, default 128 */
    /* Sampling: exactly what sampling_params_set accepts, i.e. what the
     * workers run (a top_p that is 0 as a float is refused). */
    double temperature;            /* [0, SAMPLING_TEMPERATURE_MAX], default 1.0; 0 = greedy */
    int top_k;                     /* [0, SAMPLING_TOP_K_MAX], default 0 (off) */
    double top_p;                  /* (0, 1], default 1 */
    double min_p;                  /* [0, 1], default 0 */
    uint64_t seed;                 /* meaningful when has_seed */
    bool has_seed;
    char **stop;                   /* n_stop non-empty strings */
    int n_stop;                    /* 0 .. REQUEST_STOP_MAX */
    bool stream;                   /* default false */
    bool ignore_eos;               /* default false; true: an EOS id does not end the request
                                      (max_tokens or the context does) */
    int spec_k;                    /* -1 = not given, else 0 .. limits.spec_k_max (0 = adaptive) */
    enum request_spec_mode spec_mode;
    enum request_draft draft;
    int spec_tree;                 /* REQUEST_SPEC_TREE_UNSET, _OFF, _AUTO or a budget 2..32 */
    int logprobs;                  /* -1 = not given; else 0 .. SAMPLING_TOP_LOGPROBS_MAX: each
                                      emitted token's logprob and that many top alternatives */
    int n;                         /* choices sampled from the prompt: 1 .. REQUEST_N_MAX, default 1 */
    struct sampling_controls ctl;  /* logit_bias and penalties (sampling.h), zero when not given;
                                      bias ids >= 0, checked against the vocabulary by the
                                      coordinator */
    char *prediction;              /* "prediction": the expected output's text (a draft source),
                                      NULL when not given */
    size_t prediction_len;
    struct grammar_spec grammar;   /* structured output ("grammar"): kind NONE when not given;
                                      compiled once by request_from_json, so it is valid */
};

/* Kind of a client message, from its "type" field. */
enum request_kind {
    REQUEST_KIND_GENERATE = 0,
    REQUEST_KIND_STATS = 1,
    REQUEST_KIND_CANCEL = 2,  /* {"v":1,"type":"cancel","id":...}: stop that request */
};

/* Parses len bytes of JSON (not necessarily NUL-terminated) into a cJSON
 * tree, checks "v" and "type", and reports the kind. *root_out owns the tree
 * (cJSON_Delete) and is set even on a failed "v"/"type" check, so the caller
 * can still read the client's "id" for the error reply (request_peek_id);
 * it is NULL when cJSON cannot parse the text. The text goes through
 * json_check first (valid UTF-8, no raw control character or \u0000 in a
 * string, no key twice), so cJSON's lenience never reaches a request.
 * Returns 0, ERR_FORMAT ("request is not valid JSON: <why>", "request must
 * be a JSON object", "v: ...", "type: ..."), ERR_INVALID_ARG ("<path>: given
 * more than once (duplicate key)"; the tree holds the first) or ERR_NOMEM. */
int request_parse_envelope(const char *data, size_t len, cJSON **root_out,
                           enum request_kind *kind_out, char *err);

/* The client's "id" when root is an object with a string "id" of at most
 * REQUEST_ID_MAX bytes that is valid UTF-8, else "". Never NULL; borrows root. */
const char *request_peek_id(const cJSON *root);

/* The "id" of JSON text too large to parse (a message over the size
 * limit), read without building a tree: the string value of the top-level
 * object's key "id", written to out (cap bytes, NUL-terminated) when it is
 * there, holds no escape, is valid UTF-8 and at most REQUEST_ID_MAX bytes;
 * else out is "". One pass over data[0..len), no allocation; stops at the
 * id. Returns out. */
const char *request_peek_id_text(const char *data, size_t len, char *out, size_t cap);

/* Validates a "generate" object (as returned by request_parse_envelope) and
 * fills a new request. *out owns everything it points to (request_destroy).
 * Returns 0, ERR_INVALID_ARG (a field missing, unknown, of the wrong type or
 * out of range; err names it) or ERR_NOMEM. */
int request_from_json(struct request **out, const cJSON *root, const struct request_limits *limits,
                      char *err);

/* Validates a "cancel" object (as returned by request_parse_envelope): only
 * "v", "type" and a string "id" of at most REQUEST_ID_MAX bytes (required:
 * a cancel names the request it stops). Copies the id into id_out (at least
 * REQUEST_ID_MAX + 1 bytes). Returns 0 or ERR_INVALID_ARG naming the field. */
int request_cancel_from_json(const cJSON *root, char *id_out, char *err);

/* Envelope + generate in one call; ERR_FORMAT also when the type is not
 * "generate". */
int request_parse(struct request **out, const char *data, size_t len,
                  const struct request_limits *limits, char *err);

/* NULL-safe. */
void request_destroy(struct request *req);

/* "sampled" / "point_mass" / "default". */
const char *request_spec_mode_name(enum request_spec_mode mode);
/* "model", "ngram", "none", "suffix", "auto" (or "default");
 * request_draft_parse is the inverse: 0, or ERR_INVALID_ARG naming the
 * field and the values. */
const char *request_draft_name(enum request_draft draft);
int request_draft_parse(const char *text, const char *field, enum request_draft *out, char *err);

/* "spec_tree" as a JSON value: "off", "auto" or an integer 2..32, into
 * REQUEST_SPEC_TREE_OFF, _AUTO or the budget. ERR_INVALID_ARG naming field
 * otherwise. */
int request_spec_tree_parse(const cJSON *item, const char *field, int *out, char *err);
/* The same from text (a config value): "off", "auto" or a decimal 2..32. */
int request_spec_tree_parse_text(const char *text, const char *field, int *out, char *err);
/* "off", "auto", or the budget's digits, into buf [12]. */
const char *request_spec_tree_name(int spec_tree, char *buf);

#endif
