/* output.c: incremental text, stop strings and the stream cut (output.h).
 *
 * Invariants: text[0..len) is the detokenized text of the tokens pushed so
 * far (up to a stop string, once one matched), always NUL-terminated;
 * streamed <= len and text[streamed] starts a UTF-8 character.
 */
#include "output.h"

#include <stdlib.h>
#include <string.h>

#include "detokenizer.h"
#include "error.h"

struct output {
    struct detokenizer *dt;  /* NULL without a tokenizer */
    char **stop;
    size_t *stop_len;
    int n_stop;
    size_t stop_len_max;
    char *text;
    size_t len, cap;
    size_t streamed;
    bool stopped;
};

int output_create(struct output **out, const struct tokenizer *tk, char *const *stop, int n_stop,
                  char *err)
{
    *out = NULL;
    struct output *o = calloc(1, sizeof(*o));
    if (o == NULL)
        return error_set(err, ERR_NOMEM, "output: out of memory");
    o->cap = 256;
    o->text = malloc(o->cap);
    if (o->text == NULL)
        goto nomem;
    o->text[0] = '\0';
    if (tk != NULL) {
        int rc = detokenizer_create(&o->dt, tk, 1, err);
        if (rc != 0) {
            output_destroy(o);
            return rc;
        }
    }
    if (n_stop > 0) {
        o->stop = calloc((size_t)n_stop, sizeof(*o->stop));
        o->stop_len = calloc((size_t)n_stop, sizeof(*o->stop_len));
        if (o->stop == NULL || o->stop_len == NULL)
            goto nomem;
        for (int i = 0; i < n_stop; i++) {
            size_t n = strlen(stop[i]);
            o->stop[i] = malloc(n + 1);
            if (o->stop[i] == NULL)
                goto nomem;
            memcpy(o->stop[i], stop[i], n + 1);
            o->stop_len[i] = n;
            o->n_stop = i + 1;
            if (n > o->stop_len_max)
                o->stop_len_max = n;
        }
    }
    *out = o;
    return 0;
nomem:
    output_destroy(o);
    return error_set(err, ERR_NOMEM, "output: out of memory");
}

void output_destroy(struct output *o)
{
    if (o == NULL)
        return;
    detokenizer_destroy(o->dt);
    for (int i = 0; i < o->n_stop; i++)
        free(o->stop[i]);
    free(o->stop);
    free(o->stop_len);
    free(o->text);
    free(o);
}

static int append(struct output *o, const char *piece, size_t n, char *err)
{
    if (o->len + n + 1 > o->cap) {
        size_t cap = o->cap;
        while (o->len + n + 1 > cap)
            cap *= 2;
        char *t = realloc(o->text, cap);
        if (t == NULL)
            return error_set(err, ERR_NOMEM, "output: out of memory");
        o->text = t;
        o->cap = cap;
    }
    memcpy(o->text + o->len, piece, n);
    o->len += n;
    o->text[o->len] = '\0';
    return 0;
}

/* First occurrence of needle[0..m) in hay[0..n) (m >= 1), or NULL. */
static const char *find_bytes(const char *hay, size_t n, const char *needle, size_t m)
{
    for (size_t i = 0; i + m <= n; i++)
        if (hay[i] == needle[0] && memcmp(hay + i, needle, m) == 0)
            return hay + i;
    return NULL;
}

/* Looks for a stop string that ends in the bytes added after old_len. */
static void check_stop(struct output *o, size_t old_len)
{
    if (o->n_stop == 0 || o->len == old_len)
        return;
    size_t from = old_len + 1 > o->stop_len_max ? old_len + 1 - o->stop_len_max : 0;
    size_t best = o->len;
    for (int i = 0; i < o->n_stop; i++) {
        const char *hit = find_bytes(o->text + from, o->len - from, o->stop[i], o->stop_len[i]);
        if (hit != NULL && (size_t)(hit - o->text) < best)
            best = (size_t)(hit - o->text);
    }
    if (best < o->len) {
        o->len = best;
        o->text[best] = '\0';
        o->stopped = true;
        if (o->streamed > o->len)  /* cannot happen: the stream holds back stop_len_max - 1 bytes */
            o->streamed = o->len;
    }
}

int output_push(struct output *o, int32_t id, bool *stopped, char *err)
{
    *stopped = o->stopped;
    if (o->stopped || o->dt == NULL)
        return 0;
    const char *piece = NULL;
    size_t n = 0;
    int rc = detokenizer_push(o->dt, id, &piece, &n, err);
    if (rc != 0)
        return rc;
    size_t old_len = o->len;
    if ((rc = append(o, piece, n, err)) != 0)
        return rc;
    check_stop(o, old_len);
    *stopped = o->stopped;
    return 0;
}

int output_finish(struct output *o, bool *stopped, char *err)
{
    *stopped = o->stopped;
    if (o->stopped || o->dt == NULL)
        return 0;
    const char *piece = NULL;
    size_t n = 0;
    int rc = detokenizer_flush(o->dt, &piece, &n, err);
    if (rc != 0)
        return rc;
    size_t old_len = o->len;
    if ((rc = append(o, piece, n, err)) != 0)
        return rc;
    check_stop(o, old_len);
    *stopped = o->stopped;
    return 0;
}

const char *output_text(const struct output *o, size_t *len_out)
{
    *len_out = o->len;
    return o->text;
}

const char *output_take_stream(struct output *o, bool final, size_t *len_out)
{
    size_t safe = o->len;
    if (!final && !o->stopped && o->stop_len_max > 1) {
        safe = o->len > o->stop_len_max - 1 ? o->len - (o->stop_len_max - 1) : 0;
        /* Never cut a UTF-8 character: back up over continuation bytes. */
        while (safe > o->streamed && safe < o->len && ((unsigned char)o->text[safe] & 0xC0) == 0x80)
            safe--;
    }
    if (safe < o->streamed)
        safe = o->streamed;
    const char *p = o->text + o->streamed;
    *len_out = safe - o->streamed;
    o->streamed = safe;
    return p;
}
