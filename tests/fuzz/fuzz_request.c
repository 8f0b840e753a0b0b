/* fuzz_request.c: a client message from fuzz bytes, as the coordinator's
 * intake reads it: request_parse_envelope, request_peek_id on whatever
 * parsed, then request_from_json for a "generate" (prompt, chat messages,
 * prompt_ids, sampling fields, seeds as numbers or strings, stop strings,
 * spec_k / spec_mode). A request that parses is checked against the
 * invariants request.h promises, reading every string it owns, and is then
 * tokenized as coordinator/intake.c does it (the prompt with BOS, chat
 * messages through the chat template, with and without the 3.1 date block)
 * with the small generated tokenizer: client text reaches the tokenizer and
 * the template only through here. */
#include "fuzz_common.h"
#include "fuzz_tiny_tokenizer.h"

#include "chat_template.h"
#include "error.h"
#include "request.h"

/* What intake does with a parsed request's text. */
static void tokenize_request(const struct request *r)
{
    const struct tokenizer *tk = fuzz_tiny_tokenizer();
    char err[ERR_MSG_MAX];
    int32_t *ids = NULL;
    size_t n = 0;
    if (r->input == REQUEST_INPUT_PROMPT) {
        if (tokenizer_encode(tk, r->prompt, r->prompt_len, TOKENIZER_ADD_BOS, &ids, &n, err) == 0)
            free(ids);
        return;
    }
    if (r->input != REQUEST_INPUT_MESSAGES)
        return;
    struct chat_message *m = calloc((size_t)r->n_messages, sizeof *m);
    if (!m)
        return;
    for (int i = 0; i < r->n_messages; i++) {
        m[i].role = r->messages[i].role;
        m[i].content = r->messages[i].content;
        m[i].content_len = strlen(r->messages[i].content);
    }
    const struct chat_template_options dated = {.date_string = "26 Jul 2024"};
    const struct chat_template_options *opts[] = {NULL, &dated};
    for (size_t k = 0; k < 2; k++) {
        if (chat_template_encode(tk, m, (size_t)r->n_messages, 1, opts[k], &ids, &n, err) == 0) {
            for (size_t i = 0; i < n; i++)
                if (ids[i] < 0 || ids[i] >= tokenizer_vocab_size(tk))
                    abort();
            free(ids);
        }
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
