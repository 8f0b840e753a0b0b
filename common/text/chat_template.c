/* chat_template.c: Llama 3.x Instruct conversations rendered to token ids.
 *
 * What it is: the template's text, produced segment by segment. The text
 * between two special tokens is encoded as one unit with special-token
 * parsing off, which gives the same ids as rendering the template to a string
 * and encoding it with special parsing on, except that special-token text
 * inside a message stays plain text (on purpose: no forged turns).
 * What it is not: a Jinja engine. Custom templates and 3.1's builtin_tools
 * are not rendered (docs/chat-template.md).
 *
 * Invariant: the special ids come from the tokenizer by name, never by number.
 */
#include "chat_template.h"

#include "error.h"
#include "pyjson.h"
#include "tokenizer.h"
#include "utf8.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ids_buf {
    int32_t *v;
    size_t n, cap;
};

static int ids_push(struct ids_buf *b, const int32_t *ids, size_t n)
{
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n)
            cap *= 2;
        int32_t *nv = realloc(b->v, cap * sizeof *nv);
        if (!nv)
            return ERR_NOMEM;
        b->v = nv;
        b->cap = cap;
    }
    memcpy(b->v + b->n, ids, n * sizeof *ids);
    b->n += n;
    return 0;
}

/* Code point at s[i..len) (valid UTF-8 assumed) and its length. */
static uint32_t cp_at(const uint8_t *s, size_t i, size_t len, size_t *l)
{
    uint8_t b = s[i];
    if (b < 0x80 || i + 1 >= len) {
        *l = 1;
        return b;
    }
    if (b < 0xE0) {
        *l = 2;
        return ((uint32_t)(b & 0x1F) << 6) | (s[i + 1] & 0x3F);
    }
    if (b < 0xF0 && i + 2 < len) {
        *l = 3;
        return ((uint32_t)(b & 0x0F) << 12) | ((uint32_t)(s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F);
    }
    *l = 1; /* four-byte sequences are never whitespace */
    return 0x10000;
}

/* Python's str.isspace(): bidi class WS/B/S or category Zs. */
static int py_space(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

void chat_template_trim(const char *s, size_t len, size_t *start, size_t *trimmed_len)
{
    const uint8_t *u = (const uint8_t *)s;
    size_t a = 0, e = len, l;
    while (a < e && py_space(cp_at(u, a, e, &l)))
        a += l;
    while (e > a) {
        size_t b = e - 1;
        while (b > a && (u[b] & 0xC0) == 0x80 && e - b < 4)
            b--;
        if (!py_space(cp_at(u, b, e, &l)) || b + l != e)
            break;
        e = b;
    }
    *start = a;
    *trimmed_len = e - a;
}

struct render {
    const struct tokenizer *tk;
    struct ids_buf out;
    char *text; /* scratch: the plain text between two special tokens */
    size_t cap_text, text_len;
    int32_t bos, start_header, end_header, eot;
    const char *date; /* 3.1/3.2: the system block's date_string; NULL: 3.0 */
    int with_tools;   /* tool definitions were given (3.1/3.2) */
};

static int push_id(struct render *r, int32_t id, char *err)
{
    if (ids_push(&r->out, &id, 1))
        return error_set(err, ERR_NOMEM, "chat template: out of memory");
    return 0;
}

/* Appends to the scratch text (text_flush encodes it as one segment). */
static int text_append(struct render *r, const char *s, size_t n, char *err)
{
    if (r->text_len + n + 1 > r->cap_text) {
        size_t cap = r->cap_text ? r->cap_text : 256;
        while (cap < r->text_len + n + 1)
            cap *= 2;
        char *nt = realloc(r->text, cap);
        if (!nt)
            return error_set(err, ERR_NOMEM, "chat template: out of memory");
        r->text = nt;
        r->cap_text = cap;
    }
    if (n)
        memcpy(r->text + r->text_len, s, n);
    r->text_len += n;
    return 0;
}

/* Encodes the scratch text as one plain-text segment and empties it. */
static int text_flush(struct render *r, const char *what, char *err)
{
    int32_t *ids;
    size_t n;
    char inner[ERR_MSG_MAX];
    int rc = tokenizer_encode(r->tk, r->text, r->text_len, 0, &ids, &n, inner);
    r->text_len = 0;
    if (rc)
        return error_set(err, rc, "%s: %s", what, inner);
    rc = ids_push(&r->out, ids, n);
    free(ids);
    if (rc)
        return error_set(err, ERR_NOMEM, "chat template: out of memory");
    return 0;
}

/* Encodes s as one plain-text segment (the scratch text is empty between
 * segments: every one is flushed where it ends). */
static int push_text(struct render *r, const char *s, size_t n, const char *what, char *err)
{
    int rc = text_append(r, s, n, err);
    return rc ? rc : text_flush(r, what, err);
}

static int header(struct render *r, const char *role, const char *what, char *err)
{
    int rc;
    if ((rc = push_id(r, r->start_header, err)) || (rc = push_text(r, role, strlen(role), what, err)) ||
        (rc = push_id(r, r->end_header, err)))
        return rc;
    return 0;
}

static int lookup(const struct tokenizer *tk, const char *name, int32_t *out, char *err)
{
    int id = tokenizer_token_id(tk, name);
    if (id < 0)
        return error_set(err, ERR_UNSUPPORTED, "chat template: the tokenizer has no %s token", name);
    *out = id;
    return 0;
}

static int validate_messages(const struct chat_message *msgs, size_t n, char *err)
{
    for (size_t i = 0; i < n; i++) {
        size_t bad;
        if (!msgs[i].role)
            return error_set(err, ERR_INVALID_ARG, "messages[%zu].role: missing", i);
        if (!msgs[i].content && msgs[i].content_len > 0)
            return error_set(err, ERR_INVALID_ARG, "messages[%zu].content: NULL with length %zu", i,
                             msgs[i].content_len);
        if (!utf8_valid((const uint8_t *)msgs[i].role, strlen(msgs[i].role), &bad))
            return error_set(err, ERR_INVALID_ARG, "messages[%zu].role: invalid UTF-8 at byte offset %zu", i, bad);
        if (!utf8_valid((const uint8_t *)msgs[i].content, msgs[i].content_len, &bad))
            return error_set(err, ERR_INVALID_ARG, "messages[%zu].content: invalid UTF-8 at byte offset %zu", i, bad);
        if (msgs[i].tool_call_name &&
            !utf8_valid((const uint8_t *)msgs[i].tool_call_name, strlen(msgs[i].tool_call_name), &bad))
            return error_set(err, ERR_INVALID_ARG, "messages[%zu].tool_calls: invalid UTF-8 in the name", i);
    }
    return 0;
}

/* tojson(v, indent) appended to the scratch text after its first *at bytes. */
static int push_json(struct render *r, const cJSON *v, int indent, const char *what, char *err)
{
    char *js;
    size_t jl;
    int rc = pyjson_dump(v, indent, &js, &jl);
    if (rc)
        return error_set(err, rc, "%s: cannot be written as JSON", what);
    rc = text_append(r, js, jl, err);
    free(js);
    return rc;
}

/* 3.1/3.2: the system turn, with the dates, "Environment: ipython" when
 * there are tools, and the system message if msgs[0] is one (*first = 1). */
static int render_system(struct render *r, const struct chat_message *msgs, size_t n, size_t *first,
                         char *err)
{
    char block[256];
    int bl = snprintf(block, sizeof block, "\n\n%sCutting Knowledge Date: December 2023\nToday Date: %s\n\n",
                      r->with_tools ? "Environment: ipython\n" : "", r->date);
    if (bl < 0 || (size_t)bl >= sizeof block)
        return error_set(err, ERR_INVALID_ARG, "chat template: date_string too long");
    size_t ts = 0, tl = 0;
    const char *sys = "";
    if (n > 0 && strcmp(msgs[0].role, "system") == 0) {
        chat_template_trim(msgs[0].content, msgs[0].content_len, &ts, &tl);
        sys = msgs[0].content + ts;
        *first = 1;
    }
    int rc;
    if ((rc = header(r, "system", "system header", err)) ||
        (rc = text_append(r, block, (size_t)bl, err)) || (rc = text_append(r, sys, tl, err)) ||
        (rc = text_flush(r, "messages[0].content", err)) ||
        (rc = push_id(r, r->eot, err)))
        return rc;
    return 0;
}

/* 3.1/3.2 with tools_in_user_message: the next message's content, whatever
 * its role, in a user turn after the instructions and the tools. */
static int render_tools_turn(struct render *r, const struct chat_message *msgs, size_t n, const cJSON *tools,
                             size_t *first, char *err)
{
    static const char intro[] =
        "\n\nGiven the following functions, please respond with a JSON for a function call with its proper "
        "arguments that best answers the given prompt.\n\nRespond in the format {\"name\": function name, "
        "\"parameters\": dictionary of argument name and its value}.Do not use variables.\n\n";
    if (*first >= n)
        return error_set(err, ERR_INVALID_ARG,
                         "tools: the template puts them in the first user message, and there is none");
    int rc;
    r->text_len = 0;
    if ((rc = header(r, "user", "tools header", err)) || (rc = text_append(r, intro, sizeof intro - 1, err)))
        return rc;
    char what[48];
    int i = 0;
    for (const cJSON *t = tools->child; t; t = t->next, i++) {
        snprintf(what, sizeof what, "tools[%d]", i);
        if ((rc = push_json(r, t, 4, what, err)) || (rc = text_append(r, "\n\n", 2, err)))
            return rc;
    }
    const struct chat_message *m = &msgs[*first];
    size_t ts = 0, tl = 0;
    chat_template_trim(m->content, m->content_len, &ts, &tl);
    snprintf(what, sizeof what, "messages[%zu].content", *first);
    if ((rc = text_append(r, tl ? m->content + ts : "", tl, err)) || (rc = text_flush(r, what, err)) ||
        (rc = push_id(r, r->eot, err)))
        return rc;
    *first += 1;
    return 0;
}

/* One message of the loop; dated: the 3.1/3.2 rules for tool turns. */
static int render_message(struct render *r, const struct chat_message *m, size_t i, int dated, char *err)
{
    char what[64];
    int rc;
    r->text_len = 0;
    snprintf(what, sizeof what, "messages[%zu].tool_calls", i);
    if (m->tool_call_name) {
        if ((rc = header(r, "assistant", what, err)) || (rc = text_append(r, "\n\n{\"name\": \"", 12, err)) ||
            (rc = text_append(r, m->tool_call_name, strlen(m->tool_call_name), err)) ||
            (rc = text_append(r, "\", \"parameters\": ", 17, err)) ||
            (rc = push_json(r, m->tool_call_arguments, -1, what, err)) || (rc = text_append(r, "}", 1, err)))
            return rc;
    } else if (dated && (strcmp(m->role, "tool") == 0 || strcmp(m->role, "ipython") == 0)) {
        snprintf(what, sizeof what, "messages[%zu].content", i);
        char *c = malloc(m->content_len + 1);
        if (!c)
            return error_set(err, ERR_NOMEM, "chat template: out of memory");
        if (m->content_len)
            memcpy(c, m->content, m->content_len);
        c[m->content_len] = '\0';
        cJSON *s = cJSON_CreateString(c);
        free(c);
        if (!s)
            return error_set(err, ERR_NOMEM, "chat template: out of memory");
        rc = header(r, "ipython", what, err);
        if (!rc && !(rc = text_append(r, "\n\n", 2, err)))
            rc = push_json(r, s, -1, what, err);
        cJSON_Delete(s);
        if (rc)
            return rc;
    } else {
        size_t ts = 0, tl = 0;
        chat_template_trim(m->content, m->content_len, &ts, &tl);
        snprintf(what, sizeof what, "messages[%zu].role", i);
        if ((rc = header(r, m->role, what, err)))
            return rc;
        snprintf(what, sizeof what, "messages[%zu].content", i);
        if ((rc = text_append(r, "\n\n", 2, err)) || (rc = text_append(r, tl ? m->content + ts : "", tl, err)))
            return rc;
    }
    if ((rc = text_flush(r, what, err)) || (rc = push_id(r, r->eot, err)))
        return rc;
    return 0;
}

int chat_template_encode(const struct tokenizer *tk, const struct chat_message *msgs, size_t n,
                         int add_generation_prompt, const struct chat_template_options *opts, int32_t **ids_out,
                         size_t *n_out, char *err)
{
    if (!tk || !ids_out || !n_out || (!msgs && n > 0))
        return error_set(err, ERR_INVALID_ARG, "chat_template_encode: NULL argument");
    *ids_out = NULL;
    *n_out = 0;
    int rc = validate_messages(msgs, n, err);
    if (rc)
        return rc;
    const char *date = opts ? opts->date_string : NULL;
    const cJSON *tools = opts ? opts->tools : NULL;
    int with_tools = tools && cJSON_IsArray(tools) && tools->child;
    if (!date && with_tools)
        return error_set(err, ERR_INVALID_ARG, "chat template: tools need the 3.1/3.2 template (date_string)");
    for (size_t i = 0; i < n && !date; i++)
        if (msgs[i].tool_call_name)
            return error_set(err, ERR_INVALID_ARG, "messages[%zu].tool_calls: need the 3.1/3.2 template", i);
    struct render r = {.tk = tk, .date = date, .with_tools = with_tools};
    if ((rc = lookup(tk, "<|begin_of_text|>", &r.bos, err)) ||
        (rc = lookup(tk, "<|start_header_id|>", &r.start_header, err)) ||
        (rc = lookup(tk, "<|end_header_id|>", &r.end_header, err)) || (rc = lookup(tk, "<|eot_id|>", &r.eot, err)))
        return rc;
    size_t first = 0;
    if ((rc = push_id(&r, r.bos, err)))
        goto done;
    if (date && (rc = render_system(&r, msgs, n, &first, err)))
        goto done;
    if (with_tools && (rc = render_tools_turn(&r, msgs, n, tools, &first, err)))
        goto done;
    for (size_t i = first; i < n; i++)
        if ((rc = render_message(&r, &msgs[i], i, date != NULL, err)))
            goto done;
    if (add_generation_prompt) {
        if ((rc = header(&r, "assistant", "generation prompt", err)) ||
            (rc = push_text(&r, "\n\n", 2, "generation prompt", err)))
            goto done;
    }
done:
    free(r.text);
    if (rc) {
        free(r.out.v);
        return rc;
    }
    if (!r.out.v && !(r.out.v = malloc(sizeof *r.out.v)))
        return error_set(err, ERR_NOMEM, "chat template: out of memory");
    *ids_out = r.out.v;
    *n_out = r.out.n;
    return 0;
}
