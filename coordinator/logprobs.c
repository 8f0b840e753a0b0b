/* logprobs.c: a sequence's log-probabilities (contract in logprobs.h). */
#include "logprobs.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "utf8.h"

struct worker_msg_logprobs logprobs_ask(const struct seq_logprobs *lp)
{
    return (struct worker_msg_logprobs){.on = lp->on, .top = lp->on ? lp->top : 0};
}

int logprobs_keep(struct seq_logprobs *lp, int at, const struct worker_msg_verify_done *m,
                  char *err)
{
    if (!lp->on)
        return 0;
    if (!m->has_logprobs)
        return error_set(err, ERR_PROTOCOL, "logprobs: asked for, not in the reply");
    const int want = at + m->n_tokens;
    if (want > lp->cap) {
        int cap = lp->cap > 0 ? lp->cap : 16;
        while (cap < want)
            cap *= 2;
        struct sampling_logprobs *v = realloc(lp->v, (size_t)cap * sizeof *v);
        if (!v)
            return error_set(err, ERR_NOMEM, "logprobs: out of memory");
        lp->v = v;
        lp->cap = cap;
    }
    memcpy(lp->v + at, m->logprobs, (size_t)m->n_tokens * sizeof *lp->v);
    return 0;
}

/* "token" and "bytes" of id: its text, made valid UTF-8, and its raw bytes. */
static bool add_token_text(cJSON *o, const struct tokenizer *tk, int32_t id)
{
    size_t n = 0;
    const uint8_t *b = tk ? tokenizer_token_bytes(tk, id, &n) : NULL;
    char *text = malloc(3 * n + 1);
    cJSON *bytes = cJSON_AddArrayToObject(o, "bytes");
    bool ok = text && bytes;
    if (ok) {
        text[n ? utf8_repair(b, n, (uint8_t *)text) : 0] = '\0';
        ok = cJSON_AddStringToObject(o, "token", text) != NULL;
    }
    for (size_t i = 0; ok && i < n; i++)
        ok = cJSON_AddItemToArray(bytes, cJSON_CreateNumber(b[i]));
    free(text);
    return ok;
}

static cJSON *entry_json(const struct tokenizer *tk, int32_t id, float logprob)
{
    cJSON *o = cJSON_CreateObject();
    if (o && cJSON_AddNumberToObject(o, "id", id) && add_token_text(o, tk, id) &&
        cJSON_AddNumberToObject(o, "logprob", logprob))
        return o;
    cJSON_Delete(o);
    return NULL;
}

/* Code points of id's text (each byte a replacement would take counts as
 * one: utf8_repair turns a maximal invalid subsequence into one U+FFFD,
 * close enough for an offset that only orders tokens). */
static int token_chars(const struct tokenizer *tk, int32_t id)
{
    size_t n = 0;
    const uint8_t *b = tk ? tokenizer_token_bytes(tk, id, &n) : NULL;
    int chars = 0;
    for (size_t i = 0; i < n; i++)
        chars += (b[i] & 0xC0) != 0x80;
    return chars;
}

/* text_offset of generated token `index`. */
static int text_offset(const struct tokenizer *tk, struct seq_logprobs *lp, const int32_t *ids,
                       int index)
{
    if (index < lp->off_index)
        lp->off_index = lp->off_chars = 0;
    for (; lp->off_index < index; lp->off_index++)
        lp->off_chars += token_chars(tk, ids[lp->off_index]);
    return lp->off_chars;
}

bool logprobs_add_json(cJSON *obj, const struct tokenizer *tk, struct seq_logprobs *lp,
                       const int32_t *ids, int from, int n)
{
    if (!lp->on)
        return true;
    cJSON *a = cJSON_AddArrayToObject(obj, "logprobs");
    for (int i = 0; a && i < n; i++) {
        const struct sampling_logprobs *e = &lp->v[from + i];
        cJSON *o = entry_json(tk, ids[from + i], e->logprob);
        if (o && !cJSON_AddNumberToObject(o, "text_offset", text_offset(tk, lp, ids, from + i))) {
            cJSON_Delete(o);
            o = NULL;
        }
        cJSON *top = o ? cJSON_AddArrayToObject(o, "top_logprobs") : NULL;
        if (!top || !cJSON_AddItemToArray(a, o)) {
            cJSON_Delete(o);
            return false;
        }
        for (int t = 0; t < e->n_top; t++) {
            cJSON *alt = entry_json(tk, e->top_ids[t], e->top_logprobs[t]);
            if (!alt || !cJSON_AddItemToArray(top, alt)) {
                cJSON_Delete(alt);
                return false;
            }
        }
    }
    return a != NULL;
}

void logprobs_free(struct seq_logprobs *lp)
{
    free(lp->v);
    lp->v = NULL;
    lp->cap = 0;
}
