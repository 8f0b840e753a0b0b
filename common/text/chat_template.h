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
 * (the system message, if first, moves into it); roles "tool" and "ipython"
 * are refused there (ERR_UNSUPPORTED), since tool turns are not rendered.
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

struct chat_message {
    const char *role;    /* NUL-terminated, e.g. "system", "user", "assistant" */
    const char *content; /* UTF-8, content_len bytes (may hold NUL; NULL when 0) */
    size_t content_len;
};

struct chat_template_options {
    /* NULL: Llama 3 template. Otherwise the 3.1/3.2 knowledge-date system
     * block with this "Today Date" (HF's default is "26 Jul 2024"). */
    const char *date_string;
};

/* Renders msgs[0..n) and encodes them. On success *ids_out is malloc'd (the
 * caller frees it). Returns 0, ERR_INVALID_ARG (a NULL role, invalid UTF-8,
 * named by message index), ERR_UNSUPPORTED (the tokenizer lacks a Llama 3
 * special token, or a tool role with date_string) or ERR_NOMEM. opts may be NULL. */
int chat_template_encode(const struct tokenizer *tk, const struct chat_message *msgs, size_t n,
                         int add_generation_prompt, const struct chat_template_options *opts, int32_t **ids_out,
                         size_t *n_out, char *err);

/* Python str.strip() on s[0..len): sets *start and *trimmed_len. */
void chat_template_trim(const char *s, size_t len, size_t *start, size_t *trimmed_len);

#endif
