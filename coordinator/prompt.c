/* prompt.c: a request's input as token ids (contract in prompt.h). */
#include "prompt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template.h"

#include <stdbool.h>
#include "error.h"
#include "speculate.h"

/* Ids being built: malloc'd, n of them. */
struct id_list {
    int32_t *ids;
    size_t n;
};

/* The ids of r's input into *out, unchecked against the target (but
 * prompt_ids). */
static int prompt_ids(const struct tokenizer *tk, const struct prompt_limits *lim,
                      const struct request *r, struct id_list *out, char *msg, size_t msg_size)
{
    int32_t **ids = &out->ids;
    size_t *n = &out->n;
    char err[ERR_MSG_MAX] = "";
    int rc;
    if (r->input == REQUEST_INPUT_IDS) {
        for (int i = 0; i < r->n_prompt_ids; i++) {
            if (r->prompt_ids[i] >= lim->vocab) {
                snprintf(msg, msg_size, "prompt_ids[%d]: token id %d is outside the vocabulary (0..%d)", i,
                         r->prompt_ids[i], lim->vocab - 1);
                return ERR_INVALID_ARG;
            }
        }
        *ids = malloc(sizeof(**ids) * (size_t)r->n_prompt_ids);
        if (*ids == NULL) {
            snprintf(msg, msg_size, "out of memory");
            return ERR_NOMEM;
        }
        memcpy(*ids, r->prompt_ids, sizeof(**ids) * (size_t)r->n_prompt_ids);
        *n = (size_t)r->n_prompt_ids;
        return 0;
    }
    if (tk == NULL) {
        snprintf(msg, msg_size, "%s: this server has no tokenizer (no tokenizer.json in %.200s); send prompt_ids",
                 r->input == REQUEST_INPUT_PROMPT ? "prompt" : "messages",
                 lim->tokenizer_path ? lim->tokenizer_path : "");
        return ERR_INVALID_ARG;
    }
    if (r->input == REQUEST_INPUT_PROMPT) {
        rc = tokenizer_encode(tk, r->prompt, r->prompt_len, TOKENIZER_ADD_BOS, ids, n, err);
        if (rc != 0)
            snprintf(msg, msg_size, "prompt: %s", err);
        return rc;
    }
    struct chat_message *m = calloc((size_t)r->n_messages, sizeof(*m));
    if (m == NULL) {
        snprintf(msg, msg_size, "out of memory");
        return ERR_NOMEM;
    }
    bool tool_turns = r->tools != NULL;
    for (int i = 0; i < r->n_messages; i++) {
        m[i].role = r->messages[i].role;
        m[i].content = r->messages[i].content;
        m[i].content_len = strlen(r->messages[i].content);
        m[i].tool_call_name = r->messages[i].tool_call_name;
        m[i].tool_call_arguments = r->messages[i].tool_call_arguments;
        tool_turns = tool_turns || m[i].tool_call_name != NULL || strcmp(m[i].role, "tool") == 0 ||
                     strcmp(m[i].role, "ipython") == 0;
    }
    /* Tools and tool turns exist only in the 3.1/3.2 template, whose system
     * turn carries a date: the template's own default, so a prompt does not
     * change from day to day (docs/chat-template.md). */
    const struct chat_template_options tools_opts = {.date_string = PROMPT_TOOLS_DATE, .tools = r->tools};
    rc = chat_template_encode(tk, m, (size_t)r->n_messages, 1, tool_turns ? &tools_opts : NULL, ids, n, err);
    free(m);
    if (rc != 0)
        snprintf(msg, msg_size, "messages: %s", err);
    return rc;
}

int prompt_build(const struct tokenizer *tk, const struct prompt_limits *lim,
                 const struct request *r, int32_t **ids_out, int *n_out, int *cap_out, char *msg,
                 size_t msg_size)
{
    *ids_out = NULL;
    for (int i = 0; i < r->ctl.n_bias; i++) {
        if (r->ctl.bias_ids[i] >= lim->vocab) {
            snprintf(msg, msg_size, "logit_bias: token id %d is outside the vocabulary (0..%d)",
                     (int)r->ctl.bias_ids[i], lim->vocab - 1);
            return ERR_INVALID_ARG;
        }
    }
    struct id_list list = {0};
    int rc = prompt_ids(tk, lim, r, &list, msg, msg_size);
    int32_t *ids = list.ids;
    const size_t n = list.n;
    if (rc != 0) {
        free(ids);
        return rc;
    }
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= lim->vocab) {
            snprintf(msg, msg_size, "prompt: the tokenizer produced id %d outside the target's vocabulary of %d",
                     ids[i], lim->vocab);
            free(ids);
            return ERR_MISMATCH;
        }
    }
    if (n == 0) {
        free(ids);
        snprintf(msg, msg_size, "prompt: encodes to no tokens");
        return ERR_INVALID_ARG;
    }
    const int ctx = lim->context_len;
    if ((long long)n >= ctx) {
        snprintf(msg, msg_size, "prompt: %zu tokens do not fit the context of %d tokens (at most %d)", n, ctx,
                 ctx - 1);
        free(ids);
        return ERR_CONTEXT_FULL;
    }
    int cap = (int)n + r->max_tokens + SPECULATE_K_MAX + 2;
    if (cap > ctx + SPECULATE_K_MAX + 2)
        cap = ctx + SPECULATE_K_MAX + 2;
    int32_t *hist = realloc(ids, sizeof(*hist) * (size_t)cap);
    if (hist == NULL) {
        free(ids);
        snprintf(msg, msg_size, "out of memory");
        return ERR_NOMEM;
    }
    *ids_out = hist;
    *n_out = (int)n;
    *cap_out = cap;
    return 0;
}
