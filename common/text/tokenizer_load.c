/* tokenizer_load.c: builds a tokenizer from tokenizer.json (see tokenizer.h
 * for what is accepted and refused): the model vocab and merges, added
 * tokens, the Split pre-tokenizer's regex, the TemplateProcessing
 * post-processor. Every refusal names the place in the file. tokenizer.c
 * encodes and decodes with what is built here.
 */
#include "tokenizer_private.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "error.h"
#include "utf8.h"

static int read_file(const char *path, char **buf_out, size_t *len_out, char *err)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return error_set_errno(err, ERR_IO, errno, "%s: cannot open", path);
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (cap - len < 65536) {
            size_t ncap = cap ? cap * 2 : 1 << 20;
            char *nb = realloc(buf, ncap + 1);
            if (!nb) {
                free(buf);
                fclose(f);
                return error_set(err, ERR_NOMEM, "%s: out of memory reading the file", path);
            }
            buf = nb;
            cap = ncap;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) {
            if (ferror(f)) {
                int e = errno;
                free(buf);
                fclose(f);
                return error_set_errno(err, ERR_IO, e, "%s: read failed", path);
            }
            break;
        }
    }
    if (fclose(f) != 0) {
        int e = errno;
        free(buf);
        return error_set_errno(err, ERR_IO, e, "%s: close failed", path);
    }
    buf[len] = '\0';
    *buf_out = buf;
    *len_out = len;
    return 0;
}

/* A JSON field that must be absent, null or false (or 0 / "" for strings). */
static int is_off(const cJSON *j)
{
    if (!j || cJSON_IsNull(j) || cJSON_IsFalse(j))
        return 1;
    if (cJSON_IsString(j) && j->valuestring[0] == '\0')
        return 1;
    if (cJSON_IsNumber(j) && j->valuedouble == 0.0)
        return 1;
    return 0;
}

static int json_id(const cJSON *j, int32_t *out)
{
    if (!cJSON_IsNumber(j))
        return 0;
    double d = j->valuedouble;
    if (!(d >= 0 && d < TOK_MAX_IDS) || d != (double)(int32_t)d)
        return 0;
    *out = (int32_t)d;
    return 1;
}

static const char *json_type(const cJSON *obj)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(obj, "type");
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

/* Decodes a byte-level string into its bytes; if a character lies outside the
 * alphabet the token's UTF-8 is used unchanged (the Rust decoder's rule).
 * out must hold n bytes. Returns the length. */
static size_t byte_level_decode(const char *s, size_t n, const int16_t *cp_to_byte, uint8_t *out)
{
    size_t i = 0, o = 0;
    while (i < n) {
        size_t adv;
        uint32_t cp = utf8_next_cp((const uint8_t *)s + i, n - i, &adv);
        if (cp >= TOK_ALPHABET_CP || cp_to_byte[cp] < 0) {
            memcpy(out, s, n);
            return n;
        }
        out[o++] = (uint8_t)cp_to_byte[cp];
        i += adv;
    }
    return o;
}

/* "\s" -> "\p{White_Space}", "\S" -> "\P{White_Space}"; other escapes kept. */
static char *rewrite_pattern(const char *pat)
{
    size_t n = strlen(pat), cap = n * 8 + 1, o = 0;
    char *out = malloc(cap);
    if (!out)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        if (pat[i] == '\\' && i + 1 < n) {
            char c = pat[i + 1];
            if (c == 's' || c == 'S') {
                const char *r = c == 's' ? "\\p{White_Space}" : "\\P{White_Space}";
                memcpy(out + o, r, strlen(r));
                o += strlen(r);
            } else {
                out[o++] = '\\';
                out[o++] = c;
            }
            i++;
            continue;
        }
        out[o++] = pat[i];
    }
    out[o] = '\0';
    return out;
}

static int load_pre_tokenizer(struct tokenizer *tk, const cJSON *pt, char *err)
{
    const char *p = tk->path;
    if (!cJSON_IsObject(pt))
        return error_set(err, ERR_UNSUPPORTED, "%s: pre_tokenizer: missing (a ByteLevel pre-tokenizer is required)", p);
    const cJSON *items[8];
    size_t n_items = 0;
    const char *type = json_type(pt);
    if (type && strcmp(type, "Sequence") == 0) {
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(pt, "pretokenizers");
        if (!cJSON_IsArray(arr))
            return error_set(err, ERR_FORMAT, "%s: pre_tokenizer.pretokenizers: expected an array", p);
        const cJSON *it;
        cJSON_ArrayForEach(it, arr) {
            if (n_items == 8)
                return error_set(err, ERR_UNSUPPORTED, "%s: pre_tokenizer: too many steps", p);
            items[n_items++] = it;
        }
    } else {
        items[n_items++] = pt;
    }
    int seen_split = 0, seen_bytelevel = 0;
    for (size_t i = 0; i < n_items; i++) {
        const cJSON *it = items[i];
        const char *t = cJSON_IsObject(it) ? json_type(it) : NULL;
        if (!t)
            return error_set(err, ERR_FORMAT, "%s: pre_tokenizer step %zu: missing type", p, i);
        if (strcmp(t, "Split") == 0) {
            if (seen_split || seen_bytelevel)
                return error_set(err, ERR_UNSUPPORTED, "%s: pre_tokenizer: only one Split before ByteLevel is supported", p);
            const cJSON *pat = cJSON_GetObjectItemCaseSensitive(it, "pattern");
            const cJSON *rx = cJSON_IsObject(pat) ? cJSON_GetObjectItemCaseSensitive(pat, "Regex") : NULL;
            if (!cJSON_IsString(rx))
                return error_set(err, ERR_UNSUPPORTED, "%s: pre_tokenizer Split: only a {\"Regex\": ...} pattern is supported", p);
            const cJSON *beh = cJSON_GetObjectItemCaseSensitive(it, "behavior");
            if (!cJSON_IsString(beh) || strcmp(beh->valuestring, "Isolated") != 0)
                return error_set(err, ERR_UNSUPPORTED, "%s: pre_tokenizer Split: only behavior \"Isolated\" is supported", p);
            if (!is_off(cJSON_GetObjectItemCaseSensitive(it, "invert")))
                return error_set(err, ERR_UNSUPPORTED, "%s: pre_tokenizer Split: invert is not supported", p);
            char *pattern = rewrite_pattern(rx->valuestring);
            if (!pattern)
                return error_set(err, ERR_NOMEM, "%s: out of memory compiling the regex", p);
            int ec;
            PCRE2_SIZE eo;
            tk->re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
            free(pattern);
            if (!tk->re) {
                PCRE2_UCHAR msg[256];
                pcre2_get_error_message(ec, msg, sizeof msg);
                return error_set(err, ERR_FORMAT, "%s: pre_tokenizer Split regex: %s (at offset %zu)", p,
                                 (const char *)msg, (size_t)eo);
            }
            /* JIT is an optimisation: when unavailable the interpreter runs. */
            (void)pcre2_jit_compile(tk->re, PCRE2_JIT_COMPLETE);
            seen_split = 1;
        } else if (strcmp(t, "ByteLevel") == 0) {
            if (seen_bytelevel)
                return error_set(err, ERR_UNSUPPORTED, "%s: pre_tokenizer: two ByteLevel steps", p);
            if (!is_off(cJSON_GetObjectItemCaseSensitive(it, "add_prefix_space")))
                return error_set(err, ERR_UNSUPPORTED, "%s: pre_tokenizer ByteLevel: add_prefix_space is not supported", p);
            if (!is_off(cJSON_GetObjectItemCaseSensitive(it, "use_regex")))
                return error_set(err, ERR_UNSUPPORTED, "%s: pre_tokenizer ByteLevel: use_regex is not supported", p);
            seen_bytelevel = 1;
        } else {
            return error_set(err, ERR_UNSUPPORTED, "%s: pre_tokenizer type \"%s\" is not supported", p, t);
        }
    }
    if (!seen_bytelevel)
        return error_set(err, ERR_UNSUPPORTED, "%s: pre_tokenizer: a ByteLevel step is required", p);
    return 0;
}

int tokenizer_added_index(const struct tokenizer *tk, const char *s, size_t n)
{
    for (size_t i = 0; i < tk->n_added; i++)
        if (tk->added[i].len == n && memcmp(tk->added[i].content, s, n) == 0)
            return (int)i;
    return -1;
}

/* Resolves a TemplateProcessing special-token name to its ids. */
static int template_special_ids(struct tokenizer *tk, const cJSON *specials, const char *name,
                                int32_t **dst, size_t *n_dst, char *err)
{
    const char *p = tk->path;
    const cJSON *ent = cJSON_IsObject(specials) ? cJSON_GetObjectItemCaseSensitive(specials, name) : NULL;
    const cJSON *ids = ent ? cJSON_GetObjectItemCaseSensitive(ent, "ids") : NULL;
    if (!cJSON_IsArray(ids))
        return error_set(err, ERR_FORMAT, "%s: post_processor: special token \"%s\" has no ids", p, name);
    const cJSON *it;
    cJSON_ArrayForEach(it, ids) {
        int32_t id;
        if (!json_id(it, &id) || id >= tk->n_vocab || tk->dec_len[id] < 0)
            return error_set(err, ERR_FORMAT, "%s: post_processor: special token \"%s\" has an invalid id", p, name);
        int32_t *nd = realloc(*dst, (*n_dst + 1) * sizeof **dst);
        if (!nd)
            return error_set(err, ERR_NOMEM, "%s: out of memory", p);
        *dst = nd;
        nd[(*n_dst)++] = id;
    }
    return 0;
}

static int load_post_processor_one(struct tokenizer *tk, const cJSON *pp, int *seen_template, char *err)
{
    const char *p = tk->path;
    const char *t = cJSON_IsObject(pp) ? json_type(pp) : NULL;
    if (!t)
        return error_set(err, ERR_FORMAT, "%s: post_processor: missing type", p);
    if (strcmp(t, "ByteLevel") == 0)
        return 0; /* only trims offsets; ids are unchanged */
    if (strcmp(t, "TemplateProcessing") != 0)
        return error_set(err, ERR_UNSUPPORTED, "%s: post_processor type \"%s\" is not supported", p, t);
    if (*seen_template)
        return error_set(err, ERR_UNSUPPORTED, "%s: post_processor: two TemplateProcessing steps", p);
    *seen_template = 1;
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(pp, "single");
    const cJSON *specials = cJSON_GetObjectItemCaseSensitive(pp, "special_tokens");
    if (!cJSON_IsArray(single))
        return error_set(err, ERR_FORMAT, "%s: post_processor.single: expected an array", p);
    int seen_seq = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, single) {
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(it, "SpecialToken");
        const cJSON *sq = cJSON_GetObjectItemCaseSensitive(it, "Sequence");
        if (cJSON_IsObject(st)) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(st, "id");
            if (!cJSON_IsString(id))
                return error_set(err, ERR_FORMAT, "%s: post_processor.single: SpecialToken without id", p);
            int rc = seen_seq ? template_special_ids(tk, specials, id->valuestring, &tk->bos_suffix, &tk->n_bos_suffix, err)
                              : template_special_ids(tk, specials, id->valuestring, &tk->bos_prefix, &tk->n_bos_prefix, err);
            if (rc)
                return rc;
        } else if (cJSON_IsObject(sq)) {
            if (seen_seq)
                return error_set(err, ERR_UNSUPPORTED, "%s: post_processor.single: two sequences", p);
            seen_seq = 1;
        } else {
            return error_set(err, ERR_FORMAT, "%s: post_processor.single: unknown item", p);
        }
    }
    return 0;
}

static int load_post_processor(struct tokenizer *tk, const cJSON *pp, char *err)
{
    if (!pp || cJSON_IsNull(pp))
        return 0;
    int seen_template = 0;
    const char *t = cJSON_IsObject(pp) ? json_type(pp) : NULL;
    if (t && strcmp(t, "Sequence") == 0) {
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(pp, "processors");
        if (!cJSON_IsArray(arr))
            return error_set(err, ERR_FORMAT, "%s: post_processor.processors: expected an array", tk->path);
        const cJSON *it;
        cJSON_ArrayForEach(it, arr) {
            int rc = load_post_processor_one(tk, it, &seen_template, err);
            if (rc)
                return rc;
        }
        return 0;
    }
    return load_post_processor_one(tk, pp, &seen_template, err);
}

static int cmp_added_longest_first(const void *a, const void *b)
{
    const struct tok_added *x = a, *y = b;
    if (x->len != y->len)
        return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int merge_side_id(const struct tokenizer *tk, const char *s, size_t n, size_t idx, char *err, int32_t *out)
{
    int32_t id = tokenizer_vocab_lookup(tk, s, n);
    if (id < 0)
        return error_set(err, ERR_FORMAT, "%s: model.merges[%zu]: token \"%.*s\" is not in the vocab", tk->path, idx,
                         (int)(n > 64 ? 64 : n), s);
    *out = id;
    return 0;
}

/* The added tokens (after the vocab is in): their ids checked against the
 * reference's numbering, their text replacing the vocab's for decoding
 * (into dec_arena at *dko), sorted longest first for the pre-split. */
static int load_added_tokens(struct tokenizer *tk, const cJSON *added, size_t n_vocab_entries,
                             const int16_t *cp_to_byte, size_t *dko_io, char *err)
{
    const char *p = tk->path;
    const cJSON *it;
    size_t dko = *dko_io;
    int32_t max_added = -1;
    if (cJSON_IsArray(added)) {
        cJSON_ArrayForEach(it, added) {
            struct tok_added *a = &tk->added[tk->n_added];
            json_id(cJSON_GetObjectItemCaseSensitive(it, "id"), &a->id);
            const char *content = cJSON_GetObjectItemCaseSensitive(it, "content")->valuestring;
            a->len = strlen(content);
            a->special = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(it, "special"));
            if (tokenizer_added_index(tk, content, a->len) >= 0)
                return error_set(err, ERR_FORMAT, "%s: added_tokens: \"%.64s\" appears twice", p, content);
            /* The reference ignores an added token's stored id and gives it
             * its vocab id, or the next id after the vocab and the added
             * tokens so far; a file that disagrees would tokenize differently
             * there, so it is refused rather than guessed at. */
            int32_t expect = tokenizer_vocab_lookup(tk, content, a->len);
            if (expect < 0)
                expect = (max_added >= (int32_t)n_vocab_entries) ? max_added + 1 : (int32_t)n_vocab_entries;
            if (expect != a->id)
                return error_set(err, ERR_FORMAT,
                                 "%s: added_tokens[%zu] \"%.64s\": id %d, but the reference assigns %d (added "
                                 "tokens must follow the vocab's %zu entries without gaps)",
                                 p, tk->n_added, content, a->id, expect, n_vocab_entries);
            if (a->id > max_added)
                max_added = a->id;
            a->content = malloc(a->len + 1);
            if (!a->content)
                return error_set(err, ERR_NOMEM, "%s: out of memory", p);
            memcpy(a->content, content, a->len + 1);
            tk->n_added++;
            /* An added token's text replaces the vocab entry's for decoding. */
            size_t dl = byte_level_decode(content, a->len, cp_to_byte, tk->dec_arena + dko);
            tk->dec_off[a->id] = (uint32_t)dko;
            tk->dec_len[a->id] = (int32_t)dl;
            dko += dl;
            tk->is_special[a->id] = (uint8_t)a->special;
            tk->first_any[(uint8_t)content[0]] = 1;
            if (!a->special)
                tk->first_plain[(uint8_t)content[0]] = 1;
        }
        qsort(tk->added, tk->n_added, sizeof *tk->added, cmp_added_longest_first);
    }

    *dko_io = dko;
    return 0;
}

/* Each byte's single-symbol token: its byte-level text and its id. */
static void load_byte_symbols(struct tokenizer *tk, int16_t *cp_to_byte)
{
    int32_t byte_to_cp[256];
    tokenizer_byte_level_tables(byte_to_cp, cp_to_byte); /* same tables again, for byte_to_cp */
    for (int b = 0; b < 256; b++) {
        uint32_t cp = (uint32_t)byte_to_cp[b];
        if (cp < 0x80) {
            tk->byte_utf8[b][0] = (uint8_t)cp;
            tk->byte_utf8_len[b] = 1;
        } else {
            tk->byte_utf8[b][0] = (uint8_t)(0xC0 | (cp >> 6));
            tk->byte_utf8[b][1] = (uint8_t)(0x80 | (cp & 0x3F));
            tk->byte_utf8_len[b] = 2;
        }
        tk->byte_id[b] = tokenizer_vocab_lookup(tk, (const char *)tk->byte_utf8[b], tk->byte_utf8_len[b]);
    }

}

/* The merges ("a b" strings or ["a", "b"] pairs; rank = position), each
 * side and the merged token checked against the vocab. */
static int load_merges(struct tokenizer *tk, const cJSON *merges, char *err)
{
    const char *p = tk->path;
    const cJSON *it;
    size_t n_merges = (size_t)cJSON_GetArraySize(merges);
    tk->merge_mask = tokenizer_table_size_for(n_merges) - 1;
    tk->merge_slots = malloc((tk->merge_mask + 1) * sizeof *tk->merge_slots);
    char *joined = malloc(2 * 4096 + 1);
    if (!tk->merge_slots || !joined) {
        free(joined);
        return error_set(err, ERR_NOMEM, "%s: out of memory for %zu merges", p, n_merges);
    }
    for (size_t i = 0; i <= tk->merge_mask; i++)
        tk->merge_slots[i].key = UINT64_MAX;
    size_t idx = 0;
    int rc = 0;
    cJSON_ArrayForEach(it, merges) {
        const char *a, *b;
        size_t la, lb;
        if (cJSON_IsString(it)) {
            const char *s = it->valuestring;
            const char *sp = strchr(s, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                rc = error_set(err, ERR_FORMAT, "%s: model.merges[%zu]: \"%.64s\" is not of the form \"a b\"", p, idx, s);
                break;
            }
            a = s;
            la = (size_t)(sp - s);
            b = sp + 1;
            lb = strlen(b);
        } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 && cJSON_IsString(cJSON_GetArrayItem(it, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(it, 1))) {
            a = cJSON_GetArrayItem(it, 0)->valuestring;
            b = cJSON_GetArrayItem(it, 1)->valuestring;
            la = strlen(a);
            lb = strlen(b);
        } else {
            rc = error_set(err, ERR_FORMAT, "%s: model.merges[%zu]: unknown merge form (expected \"a b\" or [\"a\",\"b\"])", p, idx);
            break;
        }
        int32_t ia = -1, ib = -1, inew;
        if ((rc = merge_side_id(tk, a, la, idx, err, &ia)) || (rc = merge_side_id(tk, b, lb, idx, err, &ib)))
            break;
        if (la + lb > 2 * 4096) {
            rc = error_set(err, ERR_FORMAT, "%s: model.merges[%zu]: merged token too long", p, idx);
            break;
        }
        memcpy(joined, a, la);
        memcpy(joined + la, b, lb);
        inew = tokenizer_vocab_lookup(tk, joined, la + lb);
        if (inew < 0) {
            rc = error_set(err, ERR_FORMAT, "%s: model.merges[%zu]: merged token \"%.*s\" is not in the vocab", p, idx,
                           (int)((la + lb) > 64 ? 64 : la + lb), joined);
            break;
        }
        tokenizer_merge_insert(tk, ia, ib, (int32_t)idx, inew);
        idx++;
    }
    free(joined);
    return rc;
}

/* model's settings that are not vocabulary: only BPE, every option this
 * tokenizer does not implement off; ignore_merges kept. */
static int check_model_settings(struct tokenizer *tk, const cJSON *model, char *err)
{
    const char *p = tk->path;
    if (!cJSON_IsObject(model))
        return error_set(err, ERR_FORMAT, "%s: model: missing", p);
    const char *t = json_type(model);
    if (t && strcmp(t, "BPE") != 0)
        return error_set(err, ERR_UNSUPPORTED, "%s: model type \"%s\" is not supported (BPE only)", p, t);
    static const char *off_fields[] = {"dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
                                       "byte_fallback"};
    for (size_t i = 0; i < sizeof off_fields / sizeof *off_fields; i++)
        if (!is_off(cJSON_GetObjectItemCaseSensitive(model, off_fields[i])))
            return error_set(err, ERR_UNSUPPORTED, "%s: model.%s is not supported", p, off_fields[i]);
    const cJSON *im = cJSON_GetObjectItemCaseSensitive(model, "ignore_merges");
    if (im && !cJSON_IsBool(im) && !cJSON_IsNull(im))
        return error_set(err, ERR_FORMAT, "%s: model.ignore_merges: expected a boolean", p);
    tk->ignore_merges = cJSON_IsTrue(im);
    return 0;
}

/* What the tables must hold: the largest id over vocab and added tokens,
 * the bytes of their keys, and how many of each. */
struct vocab_sizes {
    int32_t max_id;
    size_t key_bytes, n_vocab_entries, n_added;
};

/* Counts vocab and the added tokens into *sz, checking each id and added
 * token as it goes. */
static int count_vocab(const char *p, const cJSON *vocab, const cJSON *added, struct vocab_sizes *sz, char *err)
{
    *sz = (struct vocab_sizes){.max_id = -1};
    const cJSON *it;
    cJSON_ArrayForEach(it, vocab) {
        int32_t id;
        if (!json_id(it, &id))
            return error_set(err, ERR_FORMAT, "%s: model.vocab[\"%.64s\"]: id must be an integer in 0..%d", p,
                             it->string ? it->string : "", TOK_MAX_IDS - 1);
        if (id > sz->max_id)
            sz->max_id = id;
        sz->key_bytes += strlen(it->string);
        sz->n_vocab_entries++;
    }
    if (!cJSON_IsArray(added))
        return 0;
    cJSON_ArrayForEach(it, added) {
        int32_t id;
        const size_t i = sz->n_added;
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(it, "content");
        if (!json_id(cJSON_GetObjectItemCaseSensitive(it, "id"), &id))
            return error_set(err, ERR_FORMAT, "%s: added_tokens[%zu].id: expected an integer id", p, i);
        if (!cJSON_IsString(content) || content->valuestring[0] == '\0')
            return error_set(err, ERR_FORMAT, "%s: added_tokens[%zu].content: expected a non-empty string", p, i);
        static const char *flags[] = {"single_word", "lstrip", "rstrip"};
        for (size_t f = 0; f < 3; f++)
            if (!is_off(cJSON_GetObjectItemCaseSensitive(it, flags[f])))
                return error_set(err, ERR_UNSUPPORTED, "%s: added_tokens[%zu].%s is not supported", p, i, flags[f]);
        if (id > sz->max_id)
            sz->max_id = id;
        sz->key_bytes += strlen(content->valuestring);
        sz->n_added++;
    }
    return 0;
}

/* tk's tables for the ids 0..max_id, every id absent until filled. */
static int alloc_tables(struct tokenizer *tk, const struct vocab_sizes *sz, char *err)
{
    const int32_t n = sz->max_id + 1;
    tk->n_vocab = n;
    tk->key_arena = malloc(sz->key_bytes + 1);
    tk->key_off = calloc((size_t)n, sizeof *tk->key_off);
    tk->key_len = malloc((size_t)n * sizeof *tk->key_len);
    tk->dec_arena = malloc(sz->key_bytes + 1);
    tk->dec_off = calloc((size_t)n, sizeof *tk->dec_off);
    tk->dec_len = malloc((size_t)n * sizeof *tk->dec_len);
    tk->is_special = calloc((size_t)n, 1);
    tk->vocab_mask = tokenizer_table_size_for(sz->n_vocab_entries) - 1;
    tk->vocab_slots = calloc(tk->vocab_mask + 1, sizeof *tk->vocab_slots);
    tk->added = calloc(sz->n_added ? sz->n_added : 1, sizeof *tk->added);
    if (!tk->key_arena || !tk->key_off || !tk->key_len || !tk->dec_arena || !tk->dec_off || !tk->dec_len ||
        !tk->is_special || !tk->vocab_slots || !tk->added)
        return error_set(err, ERR_NOMEM, "%s: out of memory for %d ids", tk->path, n);
    for (int32_t i = 0; i < n; i++)
        tk->key_len[i] = tk->dec_len[i] = -1;
    return 0;
}

/* The vocab's keys and their decoded bytes into the tables (*dko: bytes
 * of the decode arena used). */
static int fill_vocab(struct tokenizer *tk, const cJSON *vocab, int16_t *cp_to_byte, size_t *dko, char *err)
{
    size_t ko = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, vocab) {
        int32_t id = 0;
        json_id(it, &id);
        size_t len = strlen(it->string);
        if (tk->key_len[id] >= 0)
            return error_set(err, ERR_FORMAT, "%s: model.vocab: id %d appears twice", tk->path, id);
        memcpy(tk->key_arena + ko, it->string, len);
        tk->key_off[id] = (uint32_t)ko;
        tk->key_len[id] = (int32_t)len;
        ko += len;
        size_t dl = byte_level_decode(it->string, len, cp_to_byte, tk->dec_arena + *dko);
        tk->dec_off[id] = (uint32_t)*dko;
        tk->dec_len[id] = (int32_t)dl;
        *dko += dl;
        tokenizer_vocab_insert(tk, id);
    }
    return 0;
}

static int load_model(struct tokenizer *tk, const cJSON *model, const cJSON *added, int16_t *cp_to_byte, char *err)
{
    const char *p = tk->path;
    int rc = check_model_settings(tk, model, err);
    if (rc)
        return rc;
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (!cJSON_IsObject(vocab))
        return error_set(err, ERR_FORMAT, "%s: model.vocab: expected an object", p);
    if (!cJSON_IsArray(merges))
        return error_set(err, ERR_FORMAT, "%s: model.merges: expected an array", p);
    if (added && !cJSON_IsNull(added) && !cJSON_IsArray(added))
        return error_set(err, ERR_FORMAT, "%s: added_tokens: expected an array", p);
    struct vocab_sizes sz;
    if ((rc = count_vocab(p, vocab, added, &sz, err)))
        return rc;
    if (sz.max_id < 0)
        return error_set(err, ERR_FORMAT, "%s: model.vocab is empty", p);
    size_t dko = 0;
    if ((rc = alloc_tables(tk, &sz, err)) || (rc = fill_vocab(tk, vocab, cp_to_byte, &dko, err)) ||
        (rc = load_added_tokens(tk, added, sz.n_vocab_entries, cp_to_byte, &dko, err)))
        return rc;
    load_byte_symbols(tk, cp_to_byte);
    return load_merges(tk, merges, err);
}

int tokenizer_load(struct tokenizer **out, const char *path, char *err)
{
    if (!out || !path)
        return error_set(err, ERR_INVALID_ARG, "tokenizer_load: NULL argument");
    *out = NULL;
    struct tokenizer *tk = calloc(1, sizeof *tk);
    char *buf = NULL;
    cJSON *root = NULL;
    int rc;
    if (!tk)
        return error_set(err, ERR_NOMEM, "%s: out of memory", path);
    struct stat st;
    size_t plen = strlen(path);
    tk->path = malloc(plen + sizeof "/tokenizer.json");
    if (!tk->path) {
        rc = error_set(err, ERR_NOMEM, "%s: out of memory", path);
        goto fail;
    }
    memcpy(tk->path, path, plen + 1);
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        memcpy(tk->path + plen, "/tokenizer.json", sizeof "/tokenizer.json");
    size_t len = 0;
    if ((rc = read_file(tk->path, &buf, &len, err)))
        goto fail;
    const char *end = NULL;
    root = cJSON_ParseWithLengthOpts(buf, len, &end, 0);
    if (!root) {
        size_t at = end && end >= buf ? (size_t)(end - buf) : 0;
        rc = error_set(err, ERR_FORMAT, "%s: malformed or truncated JSON near byte %zu of %zu", tk->path, at, len);
        goto fail;
    }
    free(buf);
    buf = NULL;
    if (!cJSON_IsObject(root)) {
        rc = error_set(err, ERR_FORMAT, "%s: expected a JSON object", tk->path);
        goto fail;
    }
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    if (norm && !cJSON_IsNull(norm)) {
        rc = error_set(err, ERR_UNSUPPORTED, "%s: normalizer is not supported (Llama 3 has none)", tk->path);
        goto fail;
    }
    int16_t cp_to_byte[TOK_ALPHABET_CP];
    int32_t byte_to_cp[256];
    tokenizer_byte_level_tables(byte_to_cp, cp_to_byte);
    if ((rc = load_model(tk, cJSON_GetObjectItemCaseSensitive(root, "model"),
                         cJSON_GetObjectItemCaseSensitive(root, "added_tokens"), cp_to_byte, err)))
        goto fail;
    if ((rc = load_pre_tokenizer(tk, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), err)))
        goto fail;
    if ((rc = load_post_processor(tk, cJSON_GetObjectItemCaseSensitive(root, "post_processor"), err)))
        goto fail;
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    const char *dt = cJSON_IsObject(dec) ? json_type(dec) : NULL;
    if (!dt || strcmp(dt, "ByteLevel") != 0) {
        rc = error_set(err, ERR_UNSUPPORTED, "%s: decoder must be ByteLevel", tk->path);
        goto fail;
    }
    cJSON_Delete(root);
    *out = tk;
    return 0;
fail:
    free(buf);
    cJSON_Delete(root);
    tokenizer_destroy(tk);
    return rc;
}

void tokenizer_destroy(struct tokenizer *tk)
{
    if (!tk)
        return;
    for (size_t i = 0; i < tk->n_added; i++)
        free(tk->added[i].content);
    free(tk->added);
    free(tk->path);
    free(tk->key_arena);
    free(tk->key_off);
    free(tk->key_len);
    free(tk->vocab_slots);
    free(tk->dec_arena);
    free(tk->dec_off);
    free(tk->dec_len);
    free(tk->is_special);
    free(tk->merge_slots);
    free(tk->bos_prefix);
    free(tk->bos_suffix);
    pcre2_code_free(tk->re);
    free(tk);
}
