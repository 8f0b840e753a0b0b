/* openai_tools.h: OpenAI's function calling over Llama 3.1/3.2's tool format.
 *
 * What it is: pure functions, no I/O. The request side checks "tools",
 * "tool_choice" and "parallel_tool_calls", passes the tools to the
 * coordinator (its chat template renders them, docs/chat-template.md) and,
 * for "required" or a named function, a grammar (a JSON schema of the call,
 * {"name": ..., "parameters": <that function's parameters>}) so that the
 * output always parses as a call. The response side reads a choice's text
 * as a call of a declared function: JSON {"name", "parameters"} (or
 * "arguments"), optionally after <|python_tag|>, several joined by ';'.
 * What it is not: the messages' translation (openai.c: role "tool",
 * assistant "tool_calls") or the stream's bookkeeping (generation.c).
 */
#ifndef TANDEM_GATEWAY_OPENAI_TOOLS_H
#define TANDEM_GATEWAY_OPENAI_TOOLS_H

#include <stdbool.h>

#include <cjson/cJSON.h>

struct openai_error;

enum openai_tool_choice {
    OPENAI_TOOLS_OFF = 0,    /* no tools: the text is content */
    OPENAI_TOOL_CHOICE_NONE, /* tools rendered, the output never read as a call */
    OPENAI_TOOL_CHOICE_AUTO, /* a call when the text parses as one, else content */
    OPENAI_TOOL_CHOICE_REQUIRED, /* a call of one of the tools, by grammar */
    OPENAI_TOOL_CHOICE_NAMED,    /* a call of the named tool, by grammar */
};

/* What the response side needs of a request's tools. */
struct openai_tools {
    enum openai_tool_choice choice;
    bool parallel;   /* parallel_tool_calls (default true): several calls kept, else the first */
    cJSON *names;    /* the declared function names (an array of strings), owned; NULL when off */
    cJSON *named;    /* NAMED: the name (a string item of names, borrowed), else NULL */
};

/* Checks the request's tools (NULL: absent), tool_choice (NULL: absent)
 * and parallel_tool_calls (NULL: absent), adds "tools" and, for required or
 * named, "grammar" to gen. A request with a "grammar" already
 * (response_format) and a forced call is a 400. Returns 0, or -1 with e
 * filled (a 400 naming the field, 500 out of memory); out is zeroed first
 * and holds what it set on either path (openai_tools_free). */
int openai_tools_translate(const cJSON *tools, const cJSON *choice, const cJSON *parallel, cJSON *gen,
                           struct openai_tools *out, struct openai_error *e);
void openai_tools_free(struct openai_tools *t);

/* Whether text (a choice's output so far) may still become a call: 1 yes,
 * 0 it is content whatever follows. Always 0 for off and none; 1 for
 * required and named. */
int openai_tools_may_be_call(const struct openai_tools *t, const char *text);

/* The calls in a choice's whole text, as OpenAI's tool_calls array
 * ([{"id": "<id_prefix>_<k>", "type": "function", "function": {"name",
 * "arguments": JSON text}}]); NULL when the text is content (or out of
 * memory). Caller deletes. */
cJSON *openai_tools_parse(const struct openai_tools *t, const char *text, const char *id_prefix);

/* Rewrites a whole chat response's choices whose text is a call: content
 * null, message.tool_calls, finish_reason "tool_calls". */
void openai_tools_apply_response(const struct openai_tools *t, cJSON *response);

#endif
