/* fuzz_request.c: a client message from fuzz bytes, as the coordinator's
 * intake reads it: request_parse_envelope, request_peek_id on whatever
 * parsed, then request_from_json for a "generate" (prompt, chat messages,
 * prompt_ids, sampling fields, seeds as numbers or strings, stop strings,
 * spec_k / spec_mode). A request that parses is checked against the
 * invariants request.h promises, reading every string it owns, and its
 * input goes through intake's own prompt_build (coordinator/prompt.c: the
 * prompt with BOS, chat messages through the chat template, prompt_ids
 * against the vocabulary) with the small generated tokenizer, whose result
 * is checked against prompt.h's promises; the chat template also runs with
 * the 3.1 date block. Client text reaches the tokenizer and the template
 * only through here. */
#include "fuzz_common.h"
#include "fuzz_tiny_tokenizer.h"

#include "chat_template.h"
#include "error.h"
#include "prompt.h"
#include "request.h"

/* The context the ids must fit: small, so that long inputs reach the
 * context check. */
#define FUZZ_CONTEXT 512

/* What intake does with a parsed request's input, and the promises of
 * prompt.h on what comes back. */
static void tokenize_request(const struct request *r)
{
    const struct tokenizer *tk = fuzz_tiny_tokenizer();
    const struct prompt_limits lim = {.vocab = tokenizer_vocab_size(tk),
                                      .context_len = FUZZ_CONTEXT, .tokenizer_path = "fuzz"};
    char msg[512];
    int32_t *ids = NULL;
    int n = 0, cap = 0;
    for (int with_tk = 0; with_tk < 2; with_tk++) {
        int rc = prompt_build(with_tk ? tk : NULL, &lim, r, &ids, &n, &cap, msg, sizeof msg);
        if (rc == 0) {
            if (!ids || n < 1 || n >= FUZZ_CONTEXT || cap < n + 1)
                abort();
            for (int i = 0; i < n; i++)
                if (ids[i] < 0 || ids[i] >= lim.vocab)
                    abort();
            ids[cap - 1] = 0; /* the room promised is there */
            free(ids);
        } else if (ids || msg[0] == '\0') {
            abort();
        }
    }
    if (r->input != REQUEST_INPUT_MESSAGES)
        return;
    /* the template with the 3.1 date block, which intake does not send */
    struct chat_message *m = calloc((size_t)r->n_messages, sizeof *m);
    if (!m)
        return;
    for (int i = 0; i < r->n_messages; i++) {
        m[i].role = r->messages[i].role;
        m[i].content = r->messages[i].content;
        m[i].content_len = strlen(r->messages[i].content);
        m[i].tool_call_name = r->messages[i].tool_call_name;
        m[i].tool_call_arguments = r->messages[i].tool_call_arguments;
    }
    const struct chat_template_options dated = {.date_string = "26 Jul 2024", .tools = r->tools};
    char err[ERR_MSG_MAX];
    size_t n_dated = 0;
    int32_t *dated_ids = NULL;
    if (chat_template_encode(tk, m, (size_t)r->n_messages, 1, &dated, &dated_ids, &n_dated, err) == 0) {
        for (size_t i = 0; i < n_dated; i++)
            if (dated_ids[i] < 0 || dated_ids[i] >= tokenizer_vocab_size(tk))
                abort();
        free(dated_ids);
    }
    free(m);
}

static void check_request(const struct request *r, const struct request_limits *lim)
{
    if (strlen(r->id) > REQUEST_ID_MAX)
        abort();
    switch (r->input) {
    case REQUEST_INPUT_PROMPT:
        if (!r->prompt || r->prompt[r->prompt_len] != '\0' || r->messages || r->prompt_ids)
            abort();
        break;
    case REQUEST_INPUT_MESSAGES:
        if (!r->messages || r->n_messages < 1 || r->prompt || r->prompt_ids)
            abort();
        for (int i = 0; i < r->n_messages; i++)
            if (!r->messages[i].role || r->messages[i].role[0] == '\0' ||
                !r->messages[i].content || strlen(r->messages[i].content) > SIZE_MAX / 2)
                abort();
        break;
    case REQUEST_INPUT_IDS:
        if (!r->prompt_ids || r->n_prompt_ids < 1 || r->prompt || r->messages)
            abort();
        for (int i = 0; i < r->n_prompt_ids; i++)
            if (r->prompt_ids[i] < 0)
                abort();
        break;
    default:
        abort();
    }
    if (r->max_tokens < 1 || r->max_tokens > lim->max_tokens_max || !(r->temperature >= 0) ||
        r->top_k < 0 || !(r->top_p > 0 && r->top_p <= 1) || !(r->min_p >= 0 && r->min_p <= 1) ||
        r->n_stop < 0 || r->n_stop > REQUEST_STOP_MAX || r->spec_k < -1 ||
        r->spec_k > REQUEST_SPEC_K_MAX)
        abort();
    for (int i = 0; i < r->n_stop; i++) {
        size_t n = strlen(r->stop[i]);
        if (n == 0 || n > REQUEST_STOP_BYTES_MAX)
            abort();
    }
    (void)request_spec_mode_name(r->spec_mode);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const struct request_limits limits = {.max_tokens_max = 4096};
    char err[ERR_MSG_MAX];
    cJSON *root = NULL;
    enum request_kind kind;
    int rc = request_parse_envelope((const char *)data, size, &root, &kind, err);
    const char *id = request_peek_id(root);
    if (!id || strlen(id) > REQUEST_ID_MAX)
        abort();
    /* the tree-less reading of the id (messages too large to parse) never
     * reads past the text, and where it finds an id in text cJSON accepts,
     * it is the one the tree holds */
    char raw_id[REQUEST_ID_MAX + 1];
    request_peek_id_text((const char *)data, size, raw_id, sizeof raw_id);
    if (strlen(raw_id) > REQUEST_ID_MAX || (rc == 0 && raw_id[0] != '\0' && strcmp(raw_id, id) != 0))
        abort();
    if (rc == 0 && kind == REQUEST_KIND_GENERATE) {
        struct request *r = NULL;
        if (request_from_json(&r, root, &limits, err) == 0) {
            check_request(r, &limits);
            tokenize_request(r);
            request_destroy(r);
        }
    }
    cJSON_Delete(root);
    /* The one-call form must agree with the two steps. */
    struct request *r2 = NULL;
    if (request_parse(&r2, (const char *)data, size, &limits, err) == 0) {
        check_request(r2, &limits);
        request_destroy(r2);
    }
    return 0;
}
