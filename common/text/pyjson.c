/* pyjson.c: Python json.dumps layout for chat templates (contract in pyjson.h). */
#include "pyjson.h"

#include "error.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct sbuf {
    char *p;
    size_t n, cap;
    int oom;
};

static void put(struct sbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *np = realloc(b->p, cap);
        if (!np) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void puts_(struct sbuf *b, const char *s) { put(b, s, strlen(s)); }

static void put_string(struct sbuf *b, const char *s)
{
    put(b, "\"", 1);
    for (const unsigned char *u = (const unsigned char *)s; *u; u++) {
        char esc[8];
        switch (*u) {
        case '"': puts_(b, "\\\""); break;
        case '\\': puts_(b, "\\\\"); break;
        case '\b': puts_(b, "\\b"); break;
        case '\f': puts_(b, "\\f"); break;
        case '\n': puts_(b, "\\n"); break;
        case '\r': puts_(b, "\\r"); break;
        case '\t': puts_(b, "\\t"); break;
        default:
            if (*u < 0x20) {
                snprintf(esc, sizeof esc, "\\u%04x", *u);
                puts_(b, esc);
            } else {
                put(b, (const char *)u, 1);
            }
        }
    }
    put(b, "\"", 1);
}

/* Python's float repr: the shortest %g text that reads back the same value,
 * positional for exponents -4..15, else "1e+16" style. */
static int put_number(struct sbuf *b, double v)
{
    char t[40];
    if (!isfinite(v))
        return ERR_INVALID_ARG;
    if (v == floor(v) && fabs(v) < 9007199254740992.0) {
        snprintf(t, sizeof t, "%.0f", v);
        if (strcmp(t, "-0") == 0) /* Python writes the float -0.0 as "-0.0"; as an int it is 0 */
            snprintf(t, sizeof t, "0");
        puts_(b, t);
        return 0;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(t, sizeof t, "%.*g", prec, v);
        if (strtod(t, NULL) == v)
            break;
    }
    char *e = strchr(t, 'e');
    int exp10 = e ? atoi(e + 1) : 0;
    if (e && exp10 >= -4 && exp10 < 16) { /* %g chose an exponent Python's repr would not */
        snprintf(t, sizeof t, "%.17g", v);
        for (int prec = 1; prec <= 17; prec++) {
            char f[40];
            snprintf(f, sizeof f, "%.*f", prec, v);
            if (strtod(f, NULL) == v) {
                snprintf(t, sizeof t, "%s", f);
                break;
            }
        }
    }
    puts_(b, t);
    return 0;
}

static void newline(struct sbuf *b, int indent, int level)
{
    put(b, "\n", 1);
    for (int i = 0; i < indent * level; i++)
        put(b, " ", 1);
}

static int dump(struct sbuf *b, const cJSON *v, int indent, int level)
{
    if (cJSON_IsNull(v)) {
        puts_(b, "null");
    } else if (cJSON_IsTrue(v)) {
        puts_(b, "true");
    } else if (cJSON_IsFalse(v)) {
        puts_(b, "false");
    } else if (cJSON_IsNumber(v)) {
        return put_number(b, v->valuedouble);
    } else if (cJSON_IsString(v)) {
        put_string(b, v->valuestring);
    } else if (cJSON_IsArray(v) || cJSON_IsObject(v)) {
        int obj = cJSON_IsObject(v);
        put(b, obj ? "{" : "[", 1);
        for (const cJSON *c = v->child; c; c = c->next) {
            if (c != v->child)
                puts_(b, indent >= 0 ? "," : ", ");
            if (indent >= 0)
                newline(b, indent, level + 1);
            if (obj) {
                if (!c->string)
                    return ERR_INVALID_ARG;
                put_string(b, c->string);
                puts_(b, ": ");
            }
            int rc = dump(b, c, indent, level + 1);
            if (rc)
                return rc;
        }
        if (indent >= 0 && v->child)
            newline(b, indent, level);
        put(b, obj ? "}" : "]", 1);
    } else {
        return ERR_INVALID_ARG;
    }
    return 0;
}

int pyjson_dump(const struct cJSON *v, int indent, char **out, size_t *len)
{
    struct sbuf b = {0};
    *out = NULL;
    *len = 0;
    int rc = v ? dump(&b, v, indent, 0) : ERR_INVALID_ARG;
    if (!rc && !b.p)
        put(&b, "", 0);
    if (!rc && b.oom)
        rc = ERR_NOMEM;
    if (rc) {
        free(b.p);
        return rc;
    }
    *out = b.p;
    *len = b.n;
    return 0;
}
