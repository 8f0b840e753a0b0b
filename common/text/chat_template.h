/* chat_template.h: the Llama 3.x Instruct chat template, rendered straight to
 * token ids.
 *
 * Default (options NULL or date_string NULL): the Llama 3 template, as in the
 * tokenizer_config.json of Llama-3-8B-Instruct:
 *   <|begin_of_text|> then per message
 *   <|start_header_id|>ROLE<|end_header_id|>\n\nTRIM(CONTENT)<|eot_id|>
 *   and, with add_generation_prompt, <|start_header_id|>assistant<|end_header_id|>\n\n
 * With date_string set: the Llama 3.1/3.2 system block without tools
 * (docs/chat-template.md): a system turn always comes first and reads
 *   "Cutting Knowledge Date: December 2023\nToday Date: DATE\n\n" + TRIM(system)
 * (the system message, if first, moves into it).
 * Tools (date_string set, docs/chat-template.md), as the 3.1/3.2 template
 * renders them with tools_in_user_message (its default):
 *   - with opts->tools (a non-empty array): "Environment: ipython\n" opens the
 *     system text, and the first message after the system one (whatever its
 *     role) becomes a user turn holding the instructions, each tool as
 *     tojson(indent=4) + "\n\n", then TRIM(its content);
 *   - a message with tool_call_name: an assistant turn
 *     {"name": "NAME", "parameters": tojson(arguments)} (its content unused);
 *   - roles "tool" and "ipython": an ipython turn holding tojson(content)
 *     (the template encodes a string too: it is iterable), not trimmed.
 * tojson is Python's json.dumps (pyjson.h).
 *
 * TRIM is Jinja's trim as HF transformers runs it (Python str.strip(): the
 * str.isspace() characters). Role and content are always plain text: the text
 * "<|eot_id|>" inside a message never becomes the special token, so a user
 * cannot forge turns. Special ids are looked up by name in the tokenizer.
 * Thread-safe on a shared tokenizer.
 */
#ifndef TANDEM_CHAT_TEMPLATE_H
#define TANDEM_CHAT_TEMPLATE_H

#include <stddef.h>
#include <stdint.h>

struct tokenizer;
struct cJSON;

struct chat_message {
    const char *role;    /* NUL-terminated, e.g. "system", "user", "assistant" */
    const char *content; /* UTF-8, content_len bytes (may hold NUL; NULL when 0) */
    size_t content_len;
    /* An assistant's tool call (3.1/3.2 only; NULL: none): the function's
     * name and its arguments (any JSON value, an object in practice). */
    const char *tool_call_name;
    const struct cJSON *tool_call_arguments;
};

struct chat_template_options {
    /* NULL: Llama 3 template. Otherwise the 3.1/3.2 knowledge-date system
     * block with this "Today Date" (HF's default is "26 Jul 2024"). */
    const char *date_string;
    /* 3.1/3.2 only: the tool definitions, a JSON array rendered as given
     * (OpenAI's {"type": "function", "function": {...}} objects); NULL or
     * empty: no tools. Borrowed. */
    const struct cJSON *tools;
};

/* Renders msgs[0..n) and encodes them. On success *ids_out is malloc'd (the
 * caller frees it). Returns 0, ERR_INVALID_ARG (a NULL role, invalid UTF-8,
 * named by message index; tools without a message to carry them; a tool
 * call or tools without date_string), ERR_UNSUPPORTED (the tokenizer lacks a
 * Llama 3 special token) or ERR_NOMEM. opts may be NULL. */
int chat_template_encode(const struct tokenizer *tk, const struct chat_message *msgs, size_t n,
                         int add_generation_prompt, const struct chat_template_options *opts, int32_t **ids_out,
                         size_t *n_out, char *err);

/* Python str.strip() on s[0..len): sets *start and *trimmed_len. */
void chat_template_trim(const char *s, size_t len, size_t *start, size_t *trimmed_len);

#endif
