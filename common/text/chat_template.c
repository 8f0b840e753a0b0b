/* chat_template.c: Llama 3.x Instruct conversations rendered to token ids.
 *
 * What it is: the template's text, produced segment by segment. The text
 * between two special tokens is encoded as one unit with special-token
 * parsing off, which gives the same ids as rendering the template to a string
 * and encoding it with special parsing on, except that special-token text
 * inside a message stays plain text (on purpose: no forged turns).
 * What it is not: a Jinja engine. Tools, tool calls and custom templates are
 * not rendered (docs/chat-template.md).
 *
 * Invariant: the special ids come from the tokenizer by name, never by number.
 */
#include "chat_template.h"

#include "error.h"
#include "tokenizer.h"
#include "utf8.h"

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
    char *text; /* scratch for "\n\n" + content */
    size_t cap_text;
    int32_t bos, start_header, end_header, eot;
};

static int push_id(struct render *r, int32_t id, char *err)
{
    if (ids_push(&r->out, &id, 1))
        return error_set(err, ERR_NOMEM, "chat template: out of memory");
    return 0;
}

/* Encodes a + b as one plain-text segment. */
static int push_text(struct render *r, const char *a, size_t la, const char *b, size_t lb, const char *what,
                     char *err)
{
    if (la + lb + 1 > r->cap_text) {
        char *nt = realloc(r->text, la + lb + 1);
        if (!nt)
            return error_set(err, ERR_NOMEM, "chat template: out of memory");
        r->text = nt;
        r->cap_text = la + lb + 1;
    }
    if (la)
        memcpy(r->text, a, la);
    if (lb)
        memcpy(r->text + la, b, lb);
    int32_t *ids;
    size_t n;
    char inner[ERR_MSG_MAX];
    int rc = tokenizer_encode(r->tk, r->text, la + lb, 0, &ids, &n, inner);
    if (rc)
        return error_set(err, rc, "%s: %s", what, inner);
    rc = ids_push(&r->out, ids, n);
    free(ids);
    if (rc)
        return error_set(err, ERR_NOMEM, "chat template: out of memory");
    return 0;
}

static int header(struct render *r, const char *role, const char *what, char *err)
{
    int rc;
    if ((rc = push_id(r, r->start_header, err)) || (rc = push_text(r, role, strlen(role), NULL, 0, what, err)) ||
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

int chat_template_encode(const struct tokenizer *tk, const struct chat_message *msgs, size_t n,
                         int add_generation_prompt, const struct chat_template_options *opts, int32_t **ids_out,
                         size_t *n_out, char *err)
{
    if (!tk || !ids_out || !n_out || (!msgs && n > 0))
        return error_set(err, ERR_INVALID_ARG, "chat_template_encode: NULL argument");
    *ids_out = NULL;
    *n_out = 0;
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
    }
    struct render r = {.tk = tk};
    int rc;
    if ((rc = lookup(tk, "<|begin_of_text|>", &r.bos, err)) ||
        (rc = lookup(tk, "<|start_header_id|>", &r.start_header, err)) ||
        (rc = lookup(tk, "<|end_header_id|>", &r.end_header, err)) || (rc = lookup(tk, "<|eot_id|>", &r.eot, err)))
        return rc;
    char what[64];
    size_t first = 0;
    const char *date = opts ? opts->date_string : NULL;
    if ((rc = push_id(&r, r.bos, err)))
        goto done;
    if (date) {
        /* 3.1/3.2: the system turn always comes first, with the dates. */
        char block[256];
        int bl = snprintf(block, sizeof block, "\n\nCutting Knowledge Date: December 2023\nToday Date: %s\n\n", date);
        if (bl < 0 || (size_t)bl >= sizeof block) {
            rc = error_set(err, ERR_INVALID_ARG, "chat template: date_string too long");
            goto done;
        }
        size_t ts = 0, tl = 0;
        const char *sys = "";
        if (n > 0 && strcmp(msgs[0].role, "system") == 0) {
            chat_template_trim(msgs[0].content, msgs[0].content_len, &ts, &tl);
            sys = msgs[0].content + ts;
            first = 1;
        }
        if ((rc = header(&r, "system", "system header", err)) ||
            (rc = push_text(&r, block, (size_t)bl, tl ? sys : NULL, tl, "messages[0].content", err)) ||
            (rc = push_id(&r, r.eot, err)))
            goto done;
    }
    for (size_t i = first; i < n; i++) {
        const struct chat_message *m = &msgs[i];
        if (date && (strcmp(m->role, "tool") == 0 || strcmp(m->role, "ipython") == 0)) {
            rc = error_set(err, ERR_UNSUPPORTED, "messages[%zu].role: \"%s\" (tool results) is not supported", i,
                           m->role);
            goto done;
        }
        size_t ts = 0, tl = 0;
        chat_template_trim(m->content, m->content_len, &ts, &tl);
        snprintf(what, sizeof what, "messages[%zu].role", i);
        if ((rc = header(&r, m->role, what, err)))
            goto done;
        snprintf(what, sizeof what, "messages[%zu].content", i);
        if ((rc = push_text(&r, "\n\n", 2, tl ? m->content + ts : NULL, tl, what, err)) ||
            (rc = push_id(&r, r.eot, err)))
            goto done;
    }
    if (add_generation_prompt) {
        if ((rc = header(&r, "assistant", "generation prompt", err)) ||
            (rc = push_text(&r, "\n\n", 2, NULL, 0, "generation prompt", err)))
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
