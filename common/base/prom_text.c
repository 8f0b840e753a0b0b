/* prom_text.c: see prom_text.h. */
#include "prom_text.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

void prom_text_init(struct prom_text *t, char *buf, size_t len)
{
    *t = (struct prom_text){.buf = buf, .len = buf ? len : 0, .cap = buf ? len + 1 : 0};
}

void prom_printf(struct prom_text *t, const char *fmt, ...)
{
    while (!t->failed) {
        va_list ap;
        va_start(ap, fmt);
        const int n = vsnprintf(t->buf ? t->buf + t->len : NULL, t->buf ? t->cap - t->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->failed = true;
            return;
        }
        if (t->buf != NULL && t->len + (size_t)n < t->cap) {
            t->len += (size_t)n;
            return;
        }
        const size_t cap = (t->cap ? t->cap * 2 : 4096) + (size_t)n;
        char *b = realloc(t->buf, cap);
        if (b == NULL) {
            t->failed = true;
            return;
        }
        t->buf = b;
        t->cap = cap;
    }
}

void prom_family(struct prom_text *t, const char *name, const char *type, const char *help)
{
    prom_printf(t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

void prom_sample(struct prom_text *t, const char *name, const char *labels, double v)
{
    const bool braces = labels != NULL && labels[0] != '\0';
    prom_printf(t, "%s%s%s%s %.17g\n", name, braces ? "{" : "", braces ? labels : "", braces ? "}" : "", v);
}

void prom_single(struct prom_text *t, const char *name, const char *type, const char *help, double v)
{
    prom_single_labelled(t, name, type, help, NULL, v);
}

void prom_single_labelled(struct prom_text *t, const char *name, const char *type, const char *help,
                          const char *labels, double v)
{
    prom_family(t, name, type, help);
    prom_sample(t, name, labels, v);
}

void prom_histogram(struct prom_text *t, const char *name, const char *help, const char *labels,
                    const struct prom_histogram *h)
{
    const bool lab = labels != NULL && labels[0] != '\0';
    const char *sep = lab ? "," : "";
    if (!lab)
        labels = "";
    prom_family(t, name, "histogram", help);
    uint64_t cum = 0;
    for (int i = 0; i < h->n_bounds; i++) {
        cum += h->counts[i];
        if (h->le_text != NULL)
            prom_printf(t, "%s_bucket{%s%sle=\"%s\"} %llu\n", name, labels, sep, h->le_text[i],
                        (unsigned long long)cum);
        else
            prom_printf(t, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, labels, sep, h->bounds[i],
                        (unsigned long long)cum);
    }
    cum += h->counts[h->n_bounds];
    prom_printf(t, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, labels, sep, (unsigned long long)cum);
    if (lab)
        prom_printf(t, "%s_sum{%s} %.6f\n%s_count{%s} %llu\n", name, labels, h->sum, name, labels,
                    (unsigned long long)h->count);
    else
        prom_printf(t, "%s_sum %.6f\n%s_count %llu\n", name, h->sum, name, (unsigned long long)h->count);
}

char *prom_label_value(const char *v)
{
    char *out = malloc(2 * strlen(v) + 1), *o = out;
    if (out == NULL)
        return NULL;
    for (; *v != '\0'; v++) {
        if (*v == '\\' || *v == '"' || *v == '\n')
            *o++ = '\\';
        *o++ = *v == '\n' ? 'n' : *v;
    }
    *o = '\0';
    return out;
}

int prom_text_finish(struct prom_text *t, char **buf, size_t *len, char *err)
{
    if (t->failed) {
        free(t->buf);
        *t = (struct prom_text){0};
        return error_set(err, ERR_NOMEM, "metrics text: out of memory");
    }
    *buf = t->buf;
    *len = t->len;
    return 0;
}
