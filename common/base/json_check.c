/* json_check.c: the strict pass over peer JSON (see json_check.h).
 *
 * Recursive descent, at most JSON_CHECK_DEPTH_MAX frames deep. Duplicate
 * keys: the keys of every open object are unescaped into one arena (never
 * longer than the input: an escape is never shorter than what it stands
 * for) and listed in one vector, both used as stacks; when an object closes
 * its keys are sorted and neighbours compared, O(n log n) however many keys
 * a hostile message holds. The first duplicate is remembered and the pass
 * goes on, so a syntax error later in the text still wins (ERR_FORMAT).
 */
#include "json_check.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "utf8.h"

/* Bytes of a key path quoted in a message. */
#define JSON_CHECK_PATH_MAX 160

struct jc_key {
    const char *s; /* unescaped, in the arena */
    size_t len;
};

struct jc_frame {
    bool is_object;
    long index;          /* arrays: the current element */
    const char *key;     /* objects: the current member's key (arena) */
    size_t key_len;
};

struct jc {
    const uint8_t *start, *p, *end;
    char *err;
    char *arena;         /* [input length + 1]; NULL until the first key */
    size_t arena_len;
    struct jc_key *keys;
    size_t n_keys, cap_keys;
    struct jc_frame path[JSON_CHECK_DEPTH_MAX + 1];
    int depth;
    bool dup;
    char dup_msg[ERR_MSG_MAX];
};

static int jc_fail(struct jc *j, const char *what)
{
    return error_set(j->err, ERR_FORMAT, "%s at offset %zu", what, (size_t)(j->p - j->start));
}

static void skip_ws(struct jc *j)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
        j->p++;
}

static int hex4(const uint8_t *s, uint32_t *out)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        uint8_t c = s[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (uint32_t)(c - 'A' + 10);
        else
            return -1;
    }
    *out = v;
    return 0;
}

static size_t put_utf8(char *out, uint32_t cp)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* A string at j->p (the opening quote). With out, its unescaped bytes are
 * appended there and *out_len set. */
static int check_string(struct jc *j, char *out, size_t *out_len)
{
    size_t n = 0;
    j->p++;
    for (;;) {
        if (j->p >= j->end)
            return jc_fail(j, "unterminated string");
        uint8_t c = *j->p;
        if (c == '"') {
            j->p++;
            break;
        }
        if (c < 0x20) {
            char what[96];
            snprintf(what, sizeof what, "raw control character 0x%02x in a string (escape it)", c);
            return jc_fail(j, what);
        }
        if (c >= 0x80) {
            size_t l = utf8_valid_len(j->p, (size_t)(j->end - j->p));
            if (l == 0)
                return jc_fail(j, "invalid UTF-8 in a string");
            if (out)
                memcpy(out + n, j->p, l);
            n += l;
            j->p += l;
            continue;
        }
        if (c != '\\') {
            if (out)
                out[n] = (char)c;
            n++;
            j->p++;
            continue;
        }
        if (j->end - j->p < 2)
            return jc_fail(j, "unterminated string");
        uint8_t e = j->p[1];
        char one = 0;
        switch (e) {
        case '"': one = '"'; break;
        case '\\': one = '\\'; break;
        case '/': one = '/'; break;
        case 'b': one = '\b'; break;
        case 'f': one = '\f'; break;
        case 'n': one = '\n'; break;
        case 'r': one = '\r'; break;
        case 't': one = '\t'; break;
        case 'u': break;
        default: return jc_fail(j, "invalid escape in a string");
        }
        if (e != 'u') {
            if (out)
                out[n] = one;
            n++;
            j->p += 2;
            continue;
        }
        uint32_t cp;
        if (j->end - j->p < 6 || hex4(j->p + 2, &cp) != 0)
            return jc_fail(j, "invalid \\u escape in a string");
        if (cp == 0)
            return jc_fail(j, "\\u0000 in a string: NUL characters are not accepted");
        if (cp >= 0xDC00 && cp <= 0xDFFF)
            return jc_fail(j, "lone UTF-16 low surrogate escape in a string");
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            uint32_t lo;
            if (j->end - j->p < 12 || j->p[6] != '\\' || j->p[7] != 'u' || hex4(j->p + 8, &lo) != 0 ||
                lo < 0xDC00 || lo > 0xDFFF)
                return jc_fail(j, "lone UTF-16 high surrogate escape in a string");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            j->p += 6;
        }
        j->p += 6;
        if (out)
            put_utf8(out + n, cp);
        n += cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    }
    if (out_len)
        *out_len = n;
    return 0;
}

static int check_number(struct jc *j)
{
    const uint8_t *p = j->p;
    if (p < j->end && *p == '-')
        p++;
    if (p >= j->end || *p < '0' || *p > '9')
        return jc_fail(j, "invalid number");
    if (*p == '0')
        p++;
    else
        while (p < j->end && *p >= '0' && *p <= '9')
            p++;
    if (p < j->end && *p == '.') {
        p++;
        if (p >= j->end || *p < '0' || *p > '9') {
            j->p = p;
            return jc_fail(j, "invalid number (no digit after the point)");
        }
        while (p < j->end && *p >= '0' && *p <= '9')
            p++;
    }
    if (p < j->end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < j->end && (*p == '+' || *p == '-'))
            p++;
        if (p >= j->end || *p < '0' || *p > '9') {
            j->p = p;
            return jc_fail(j, "invalid number (no digit in the exponent)");
        }
        while (p < j->end && *p >= '0' && *p <= '9')
            p++;
    }
    j->p = p;
    return 0;
}

static int cmp_key(const void *a, const void *b)
{
    const struct jc_key *x = a, *y = b;
    size_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->s, y->s, n);
    if (c != 0)
        return c;
    return x->len < y->len ? -1 : x->len > y->len;
}

/* Appends s[0..n) to buf (at *used, capacity JSON_CHECK_PATH_MAX), cut at a
 * character boundary; a cut is marked with "..." and ends the path. */
static void path_put(char *buf, size_t *used, const char *s, size_t n)
{
    const size_t full = JSON_CHECK_PATH_MAX - 1;
    if (*used >= full)
        return;
    if (n <= full - *used) {
        memcpy(buf + *used, s, n);
        *used += n;
        buf[*used] = '\0';
        return;
    }
    /* A cut: keep room for "..." (less of it when even that does not fit). */
    size_t left = full - *used;
    size_t take = utf8_cut_len((const uint8_t *)s, n, left > 3 ? left - 3 : 0);
    memcpy(buf + *used, s, take);
    *used += take;
    size_t dots = full - *used < 3 ? full - *used : 3;
    memcpy(buf + *used, "...", dots);
    buf[*used + dots] = '\0';
    *used = full;
}

/* Remembers the first duplicate: the path of the open containers, then key. */
static void note_duplicate(struct jc *j, const struct jc_key *key)
{
    if (j->dup)
        return;
    j->dup = true;
    char path[JSON_CHECK_PATH_MAX];
    size_t used = 0;
    path[0] = '\0';
    for (int d = 0; d < j->depth - 1; d++) {
        const struct jc_frame *f = &j->path[d];
        if (f->is_object) {
            if (d > 0)
                path_put(path, &used, ".", 1);
            path_put(path, &used, f->key, f->key_len);
        } else {
            char idx[32];
            snprintf(idx, sizeof idx, "[%ld]", f->index);
            path_put(path, &used, idx, strlen(idx));
        }
    }
    if (j->depth > 1)
        path_put(path, &used, ".", 1);
    path_put(path, &used, key->s, key->len);
    snprintf(j->dup_msg, sizeof j->dup_msg, "%s: given more than once (duplicate key)", path);
}

static int check_value(struct jc *j);

static int check_object(struct jc *j)
{
    size_t key_base = j->n_keys, arena_base = j->arena_len;
    struct jc_frame *f = &j->path[j->depth - 1];
    f->is_object = true;
    f->key = "";
    f->key_len = 0;
    j->p++;
    skip_ws(j);
    if (j->p < j->end && *j->p == '}') {
        j->p++;
        return 0;
    }
    for (;;) {
        skip_ws(j);
        if (j->p >= j->end || *j->p != '"')
            return jc_fail(j, "expected a string key");
        if (!j->arena && !(j->arena = malloc((size_t)(j->end - j->start) + 1)))
            return error_set(j->err, ERR_NOMEM, "json check: out of memory");
        if (j->n_keys == j->cap_keys) {
            size_t cap = j->cap_keys ? 2 * j->cap_keys : 16;
            struct jc_key *k = realloc(j->keys, cap * sizeof *k);
            if (!k)
                return error_set(j->err, ERR_NOMEM, "json check: out of memory");
            j->keys = k;
            j->cap_keys = cap;
        }
        char *key = j->arena + j->arena_len;
        size_t key_len = 0;
        int rc = check_string(j, key, &key_len);
        if (rc)
            return rc;
        j->arena_len += key_len;
        j->keys[j->n_keys++] = (struct jc_key){key, key_len};
        f->key = key;
        f->key_len = key_len;
        skip_ws(j);
        if (j->p >= j->end || *j->p != ':')
            return jc_fail(j, "expected ':' after a key");
        j->p++;
        if ((rc = check_value(j)))
            return rc;
        skip_ws(j);
        if (j->p < j->end && *j->p == ',') {
            j->p++;
            continue;
        }
        if (j->p < j->end && *j->p == '}') {
            j->p++;
            break;
        }
        return jc_fail(j, "expected ',' or '}' in an object");
    }
    size_t n = j->n_keys - key_base;
    if (n > 1 && !j->dup) {
        qsort(j->keys + key_base, n, sizeof *j->keys, cmp_key);
        for (size_t i = key_base + 1; i < j->n_keys; i++)
            if (cmp_key(&j->keys[i - 1], &j->keys[i]) == 0) {
                note_duplicate(j, &j->keys[i]);
                break;
            }
    }
    j->n_keys = key_base;
    j->arena_len = arena_base;
    return 0;
}

static int check_array(struct jc *j)
{
    struct jc_frame *f = &j->path[j->depth - 1];
    f->is_object = false;
    f->index = 0;
    j->p++;
    skip_ws(j);
    if (j->p < j->end && *j->p == ']') {
        j->p++;
        return 0;
    }
    for (;; f->index++) {
        int rc = check_value(j);
        if (rc)
            return rc;
        skip_ws(j);
        if (j->p < j->end && *j->p == ',') {
            j->p++;
            continue;
        }
        if (j->p < j->end && *j->p == ']') {
            j->p++;
            return 0;
        }
        return jc_fail(j, "expected ',' or ']' in an array");
    }
}

static int check_literal(struct jc *j, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(j->end - j->p) < n || memcmp(j->p, word, n) != 0)
        return jc_fail(j, "invalid value");
    j->p += n;
    return 0;
}

static int check_value(struct jc *j)
{
    skip_ws(j);
    if (j->p >= j->end)
        return jc_fail(j, "expected a value");
    switch (*j->p) {
    case '{':
    case '[': {
        if (j->depth >= JSON_CHECK_DEPTH_MAX) {
            char what[64];
            snprintf(what, sizeof what, "nested deeper than %d", JSON_CHECK_DEPTH_MAX);
            return jc_fail(j, what);
        }
        j->depth++;
        int rc = *j->p == '{' ? check_object(j) : check_array(j);
        j->depth--;
        return rc;
    }
    case '"': return check_string(j, NULL, NULL);
    case 't': return check_literal(j, "true");
    case 'f': return check_literal(j, "false");
    case 'n': return check_literal(j, "null");
    default:
        if (*j->p == '-' || (*j->p >= '0' && *j->p <= '9'))
            return check_number(j);
        if (*j->p >= 0x80 && utf8_valid_len(j->p, (size_t)(j->end - j->p)) == 0)
            return jc_fail(j, "invalid UTF-8");
        return jc_fail(j, "invalid value");
    }
}

int json_check(const char *data, size_t len, char *err)
{
    struct jc j = {.start = (const uint8_t *)data, .p = (const uint8_t *)data,
                   .end = (const uint8_t *)data + len, .err = err};
    if (!data)
        j.end = j.p;
    int rc = check_value(&j);
    if (rc == 0) {
        skip_ws(&j);
        while (j.p < j.end && *j.p == '\0')
            j.p++;
        if (j.p < j.end)
            rc = jc_fail(&j, "trailing bytes after the value");
    }
    if (rc == 0 && j.dup)
        rc = error_set(err, ERR_INVALID_ARG, "%s", j.dup_msg);
    free(j.arena);
    free(j.keys);
    return rc;
}
