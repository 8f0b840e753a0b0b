/* tokenizer.c: Llama 3 byte-level BPE, byte-exact with HuggingFace tokenizers.
 *
 * What it is: a loader for tokenizer.json (cJSON) and an encoder/decoder that
 * follows the Rust implementation step by step:
 *   1. added tokens are split out of the text (leftmost-longest match; special
 *      ones only with TOKENIZER_PARSE_SPECIAL);
 *   2. each remaining segment is split by the Split pre-tokenizer's regex with
 *      the Isolated behaviour (matches and the gaps between them are pieces);
 *   3. each piece's bytes are the byte-level symbols; with ignore_merges a
 *      piece that is a whole vocab entry is one token, otherwise adjacent
 *      symbols are merged lowest merge rank first, leftmost first (a binary
 *      heap over pair positions: O(n log n) even for megabyte-long words).
 * Decoding concatenates each token's bytes (the byte-level alphabet mapped
 * back; a token with a character outside the alphabet contributes its UTF-8
 * as is, like the Rust ByteLevel decoder) and repairs invalid UTF-8 with
 * U+FFFD per maximal invalid subsequence.
 *
 * What it is not: a general HF tokenizer (see tokenizer.h for what is
 * rejected) and not a cache: encode keeps no state between calls.
 *
 * Invariants: after load, every field is read-only. Ids are < n_vocab;
 * dec_len[id] < 0 marks an unused id. The regex is compiled once and shared;
 * each encode call owns its match data and scratch buffers. PCRE2 is told the
 * subject is valid UTF-8 only after encode has validated it.
 *
 * Why \s is rewritten: PCRE2 10.42's \s under UCP also matches U+180E, while
 * the reference (Oniguruma) follows Unicode White_Space, so \s and \S in the
 * file's pattern are compiled as \p{White_Space} and \P{White_Space}.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer.h"

#include "error.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define TOK_MAX_IDS (1 << 24) /* refuse absurd ids instead of allocating for them */
#define TOK_ALPHABET_CP 324   /* byte-level code points are all below this */

struct tok_merge_slot {
    uint64_t key; /* (left id << 32) | right id; UINT64_MAX = empty */
    int32_t rank;
    int32_t new_id;
};

struct tok_added {
    char *content; /* raw text, not byte-level mapped */
    size_t len;
    int32_t id;
    int special;
};

struct tokenizer {
    char *path; /* the tokenizer.json actually read, for messages */
    int32_t n_vocab;
    int ignore_merges;

    /* Model vocab keys (byte-level strings, as in the JSON) per id. */
    char *key_arena;
    uint32_t *key_off;
    int32_t *key_len; /* -1 = id not in the model vocab */
    uint32_t *vocab_slots; /* open addressing, id + 1; 0 = empty */
    size_t vocab_mask;

    /* Decoded bytes per id (model vocab or added token). */
    uint8_t *dec_arena;
    uint32_t *dec_off;
    int32_t *dec_len; /* -1 = unused id */
    uint8_t *is_special;

    struct tok_merge_slot *merge_slots;
    size_t merge_mask;

    int32_t byte_id[256];      /* id of the single-byte symbol, -1 if absent */
    uint8_t byte_utf8[256][2]; /* the byte-level character of each byte */
    uint8_t byte_utf8_len[256];

    struct tok_added *added; /* sorted by length, longest first */
    size_t n_added;
    uint8_t first_any[256];     /* some added token starts with this byte */
    uint8_t first_plain[256];   /* some non-special added token does */

    int32_t *bos_prefix; /* TemplateProcessing single, before $A */
    size_t n_bos_prefix;
    int32_t *bos_suffix; /* after $A */
    size_t n_bos_suffix;

    pcre2_code *re; /* NULL: no Split pre-tokenizer, a segment is one piece */
};

/* ---- byte-level alphabet (GPT-2 bytes_to_unicode) ---- */

static void byte_level_tables(int32_t byte_to_cp[256], int16_t cp_to_byte[TOK_ALPHABET_CP])
{
    int n = 0;
    for (int i = 0; i < TOK_ALPHABET_CP; i++)
        cp_to_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        byte_to_cp[b] = printable ? b : 256 + n++;
        cp_to_byte[byte_to_cp[b]] = (int16_t)b;
    }
}

/* ---- UTF-8 helpers ---- */

/* Length of the valid UTF-8 sequence at s[0..n), or 0 if invalid there. */
static size_t utf8_valid_len(const uint8_t *s, size_t n)
{
    uint8_t b = s[0];
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF;
    if (b < 0x80)
        return 1;
    if (b >= 0xC2 && b <= 0xDF) {
        need = 1;
    } else if (b >= 0xE0 && b <= 0xEF) {
        need = 2;
        if (b == 0xE0)
            lo = 0xA0;
        if (b == 0xED)
            hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
        need = 3;
        if (b == 0xF0)
            lo = 0x90;
        if (b == 0xF4)
            hi = 0x8F;
    } else {
        return 0;
    }
    if (n < need + 1)
        return 0;
    for (size_t k = 1; k <= need; k++) {
        if (s[k] < lo || s[k] > hi)
            return 0;
        lo = 0x80;
        hi = 0xBF;
    }
    return need + 1;
}

/* Lead byte -> number of continuation bytes and the range of the first. */
static int utf8_lead(uint8_t b, size_t *need, uint8_t *lo, uint8_t *hi)
{
    *lo = 0x80;
    *hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) {
        *need = 1;
    } else if (b >= 0xE0 && b <= 0xEF) {
        *need = 2;
        if (b == 0xE0)
            *lo = 0xA0;
        if (b == 0xED)
            *hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
        *need = 3;
        if (b == 0xF0)
            *lo = 0x90;
        if (b == 0xF4)
            *hi = 0x8F;
    } else {
        return 0;
    }
    return 1;
}

size_t tokenizer_utf8_repair(const uint8_t *in, size_t n, uint8_t *out)
{
    size_t i = 0, o = 0;
    while (i < n) {
        uint8_t b = in[i];
        size_t need;
        uint8_t lo, hi;
        if (b < 0x80) {
            out[o++] = b;
            i++;
            continue;
        }
        if (!utf8_lead(b, &need, &lo, &hi)) {
            out[o++] = 0xEF, out[o++] = 0xBF, out[o++] = 0xBD;
            i++;
            continue;
        }
        size_t j = i + 1, k = 0;
        while (k < need && j < n && in[j] >= lo && in[j] <= hi) {
            j++;
            k++;
            lo = 0x80;
            hi = 0xBF;
        }
        if (k == need) {
            memcpy(out + o, in + i, j - i);
            o += j - i;
        } else {
            out[o++] = 0xEF, out[o++] = 0xBF, out[o++] = 0xBD;
        }
        i = j;
    }
    return o;
}

int tokenizer_utf8_valid(const uint8_t *in, size_t n, size_t *bad_offset)
{
    for (size_t i = 0; i < n;) {
        size_t l = utf8_valid_len(in + i, n - i);
        if (l == 0) {
            if (bad_offset)
                *bad_offset = i;
            return 0;
        }
        i += l;
    }
    return 1;
}

size_t tokenizer_utf8_incomplete_tail(const uint8_t *in, size_t n)
{
    for (size_t t = 1; t <= 3 && t <= n; t++) {
        size_t start = n - t, need;
        uint8_t lo, hi;
        if (!utf8_lead(in[start], &need, &lo, &hi))
            continue;
        if (need < t) /* a complete (or over-long) sequence: nothing held */
            return 0;
        for (size_t j = start + 1; j < n; j++) {
            if (in[j] < lo || in[j] > hi)
                return 0;
            lo = 0x80;
            hi = 0xBF;
        }
        return t;
    }
    return 0;
}

/* Decodes one code point of a string known to be valid UTF-8 (cJSON output). */
static uint32_t utf8_next_cp(const uint8_t *s, size_t n, size_t *adv)
{
    size_t l = utf8_valid_len(s, n);
    if (l == 0) {
        *adv = 1;
        return 0xFFFFFFFFu;
    }
    *adv = l;
    if (l == 1)
        return s[0];
    if (l == 2)
        return ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
    if (l == 3)
        return ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    return ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
           ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
}

/* ---- hashing ---- */

static uint64_t hash_bytes(const void *p, size_t n)
{
    const uint8_t *s = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 1099511628211ull;
    }
    return h ^ (h >> 29);
}

static uint64_t hash_pair(uint64_t key)
{
    key *= 0x9E3779B97F4A7C15ull;
    return key ^ (key >> 31);
}

static size_t table_size_for(size_t n)
{
    size_t cap = 16;
    while (cap < 2 * n + 1)
        cap <<= 1;
    return cap;
}

static int32_t vocab_lookup(const struct tokenizer *tk, const char *s, size_t n)
{
    if (!tk->vocab_slots)
        return -1;
    size_t i = (size_t)hash_bytes(s, n) & tk->vocab_mask;
    for (;;) {
        uint32_t v = tk->vocab_slots[i];
        if (v == 0)
            return -1;
        int32_t id = (int32_t)(v - 1);
        if ((size_t)tk->key_len[id] == n && memcmp(tk->key_arena + tk->key_off[id], s, n) == 0)
            return id;
        i = (i + 1) & tk->vocab_mask;
    }
}

/* Inserts id under its key; a later duplicate key replaces the earlier id. */
static void vocab_insert(struct tokenizer *tk, int32_t id)
{
    const char *s = tk->key_arena + tk->key_off[id];
    size_t n = (size_t)tk->key_len[id];
    size_t i = (size_t)hash_bytes(s, n) & tk->vocab_mask;
    for (;;) {
        uint32_t v = tk->vocab_slots[i];
        if (v == 0) {
            tk->vocab_slots[i] = (uint32_t)id + 1;
            return;
        }
        int32_t other = (int32_t)(v - 1);
        if ((size_t)tk->key_len[other] == n && memcmp(tk->key_arena + tk->key_off[other], s, n) == 0) {
            tk->vocab_slots[i] = (uint32_t)id + 1;
            return;
        }
        i = (i + 1) & tk->vocab_mask;
    }
}

static const struct tok_merge_slot *merge_lookup(const struct tokenizer *tk, int32_t a, int32_t b)
{
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t i = (size_t)hash_pair(key) & tk->merge_mask;
    for (;;) {
        const struct tok_merge_slot *s = &tk->merge_slots[i];
        if (s->key == key)
            return s;
        if (s->key == UINT64_MAX)
            return NULL;
        i = (i + 1) & tk->merge_mask;
    }
}

static void merge_insert(struct tokenizer *tk, int32_t a, int32_t b, int32_t rank, int32_t new_id)
{
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t i = (size_t)hash_pair(key) & tk->merge_mask;
    for (;;) {
        struct tok_merge_slot *s = &tk->merge_slots[i];
        if (s->key == key || s->key == UINT64_MAX) {
            s->key = key;
            s->rank = rank; /* a duplicate merge takes the later rank, as the reference's map */
            s->new_id = new_id;
            return;
        }
        i = (i + 1) & tk->merge_mask;
    }
}

/* ---- loading ---- */

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

static int added_index_by_content(const struct tokenizer *tk, const char *s, size_t n)
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
    int32_t id = vocab_lookup(tk, s, n);
    if (id < 0)
        return error_set(err, ERR_FORMAT, "%s: model.merges[%zu]: token \"%.*s\" is not in the vocab", tk->path, idx,
                         (int)(n > 64 ? 64 : n), s);
    *out = id;
    return 0;
}

static int load_model(struct tokenizer *tk, const cJSON *model, const cJSON *added, int16_t *cp_to_byte, char *err)
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

    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (!cJSON_IsObject(vocab))
        return error_set(err, ERR_FORMAT, "%s: model.vocab: expected an object", p);
    if (!cJSON_IsArray(merges))
        return error_set(err, ERR_FORMAT, "%s: model.merges: expected an array", p);
    if (added && !cJSON_IsNull(added) && !cJSON_IsArray(added))
        return error_set(err, ERR_FORMAT, "%s: added_tokens: expected an array", p);

    /* Sizes first: the largest id over vocab and added tokens, key bytes. */
    int32_t max_id = -1;
    size_t key_bytes = 0, n_vocab_entries = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, vocab) {
        int32_t id;
        if (!json_id(it, &id))
            return error_set(err, ERR_FORMAT, "%s: model.vocab[\"%.64s\"]: id must be an integer in 0..%d", p,
                             it->string ? it->string : "", TOK_MAX_IDS - 1);
        if (id > max_id)
            max_id = id;
        key_bytes += strlen(it->string);
        n_vocab_entries++;
    }
    size_t n_added = 0;
    if (cJSON_IsArray(added)) {
        cJSON_ArrayForEach(it, added) {
            int32_t id;
            const cJSON *content = cJSON_GetObjectItemCaseSensitive(it, "content");
            if (!json_id(cJSON_GetObjectItemCaseSensitive(it, "id"), &id))
                return error_set(err, ERR_FORMAT, "%s: added_tokens[%zu].id: expected an integer id", p, n_added);
            if (!cJSON_IsString(content) || content->valuestring[0] == '\0')
                return error_set(err, ERR_FORMAT, "%s: added_tokens[%zu].content: expected a non-empty string", p, n_added);
            static const char *flags[] = {"single_word", "lstrip", "rstrip"};
            for (size_t f = 0; f < 3; f++)
                if (!is_off(cJSON_GetObjectItemCaseSensitive(it, flags[f])))
                    return error_set(err, ERR_UNSUPPORTED, "%s: added_tokens[%zu].%s is not supported", p, n_added, flags[f]);
            if (id > max_id)
                max_id = id;
            key_bytes += strlen(content->valuestring);
            n_added++;
        }
    }
    if (max_id < 0)
        return error_set(err, ERR_FORMAT, "%s: model.vocab is empty", p);
    int32_t n = max_id + 1;
    tk->n_vocab = n;
    tk->key_arena = malloc(key_bytes + 1);
    tk->key_off = calloc((size_t)n, sizeof *tk->key_off);
    tk->key_len = malloc((size_t)n * sizeof *tk->key_len);
    tk->dec_arena = malloc(key_bytes + 1);
    tk->dec_off = calloc((size_t)n, sizeof *tk->dec_off);
    tk->dec_len = malloc((size_t)n * sizeof *tk->dec_len);
    tk->is_special = calloc((size_t)n, 1);
    tk->vocab_mask = table_size_for(n_vocab_entries) - 1;
    tk->vocab_slots = calloc(tk->vocab_mask + 1, sizeof *tk->vocab_slots);
    tk->added = calloc(n_added ? n_added : 1, sizeof *tk->added);
    if (!tk->key_arena || !tk->key_off || !tk->key_len || !tk->dec_arena || !tk->dec_off || !tk->dec_len ||
        !tk->is_special || !tk->vocab_slots || !tk->added)
        return error_set(err, ERR_NOMEM, "%s: out of memory for %d ids", p, n);
    for (int32_t i = 0; i < n; i++)
        tk->key_len[i] = tk->dec_len[i] = -1;

    size_t ko = 0, dko = 0;
    cJSON_ArrayForEach(it, vocab) {
        int32_t id = 0;
        json_id(it, &id);
        size_t len = strlen(it->string);
        if (tk->key_len[id] >= 0)
            return error_set(err, ERR_FORMAT, "%s: model.vocab: id %d appears twice", p, id);
        memcpy(tk->key_arena + ko, it->string, len);
        tk->key_off[id] = (uint32_t)ko;
        tk->key_len[id] = (int32_t)len;
        ko += len;
        size_t dl = byte_level_decode(it->string, len, cp_to_byte, tk->dec_arena + dko);
        tk->dec_off[id] = (uint32_t)dko;
        tk->dec_len[id] = (int32_t)dl;
        dko += dl;
        vocab_insert(tk, id);
    }
    int32_t max_added = -1;
    if (cJSON_IsArray(added)) {
        cJSON_ArrayForEach(it, added) {
            struct tok_added *a = &tk->added[tk->n_added];
            json_id(cJSON_GetObjectItemCaseSensitive(it, "id"), &a->id);
            const char *content = cJSON_GetObjectItemCaseSensitive(it, "content")->valuestring;
            a->len = strlen(content);
            a->special = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(it, "special"));
            if (added_index_by_content(tk, content, a->len) >= 0)
                return error_set(err, ERR_FORMAT, "%s: added_tokens: \"%.64s\" appears twice", p, content);
            /* The reference ignores an added token's stored id and gives it
             * its vocab id, or the next id after the vocab and the added
             * tokens so far; a file that disagrees would tokenize differently
             * there, so it is refused rather than guessed at. */
            int32_t expect = vocab_lookup(tk, content, a->len);
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

    /* Single-byte symbols. */
    int32_t byte_to_cp[256];
    byte_level_tables(byte_to_cp, cp_to_byte); /* same tables again, for byte_to_cp */
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
        tk->byte_id[b] = vocab_lookup(tk, (const char *)tk->byte_utf8[b], tk->byte_utf8_len[b]);
    }

    /* Merges: "a b" strings or ["a", "b"] pairs; rank = position. */
    size_t n_merges = (size_t)cJSON_GetArraySize(merges);
    tk->merge_mask = table_size_for(n_merges) - 1;
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
        inew = vocab_lookup(tk, joined, la + lb);
        if (inew < 0) {
            rc = error_set(err, ERR_FORMAT, "%s: model.merges[%zu]: merged token \"%.*s\" is not in the vocab", p, idx,
                           (int)((la + lb) > 64 ? 64 : la + lb), joined);
            break;
        }
        merge_insert(tk, ia, ib, (int32_t)idx, inew);
        idx++;
    }
    free(joined);
    return rc;
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
    byte_level_tables(byte_to_cp, cp_to_byte);
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

/* ---- encoding ---- */

struct heap_item {
    int32_t rank;
    int32_t pos;
};

/* Per-call state: output ids and BPE scratch, grown on demand. */
struct enc_ctx {
    const struct tokenizer *tk;
    int32_t *ids;
    size_t n_ids, cap_ids;
    int32_t *sym, *prev, *next;
    size_t cap_sym;
    struct heap_item *heap;
    size_t n_heap, cap_heap;
    char *map;
    size_t cap_map;
    pcre2_match_data *md;
};

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t ncap = *cap ? *cap : 64;
    while (ncap < need)
        ncap *= 2;
    void *np = realloc(*p, ncap * elem);
    if (!np)
        return -1;
    *p = np;
    *cap = ncap;
    return 0;
}

static int emit(struct enc_ctx *c, int32_t id)
{
    if (c->n_ids == c->cap_ids && grow((void **)&c->ids, &c->cap_ids, c->n_ids + 1, sizeof *c->ids))
        return ERR_NOMEM;
    c->ids[c->n_ids++] = id;
    return 0;
}

static int heap_less(const struct heap_item *a, const struct heap_item *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(struct enc_ctx *c, int32_t rank, int32_t pos)
{
    size_t i = c->n_heap++;
    struct heap_item it = {rank, pos};
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!heap_less(&it, &c->heap[parent]))
            break;
        c->heap[i] = c->heap[parent];
        i = parent;
    }
    c->heap[i] = it;
}

static struct heap_item heap_pop(struct enc_ctx *c)
{
    struct heap_item top = c->heap[0];
    struct heap_item last = c->heap[--c->n_heap];
    size_t i = 0, n = c->n_heap;
    for (;;) {
        size_t l = 2 * i + 1, m = i;
        const struct heap_item *best = &last;
        if (l < n && heap_less(&c->heap[l], best))
            m = l, best = &c->heap[l];
        if (l + 1 < n && heap_less(&c->heap[l + 1], best))
            m = l + 1;
        if (m == i)
            break;
        c->heap[i] = c->heap[m];
        i = m;
    }
    if (n > 0)
        c->heap[i] = last;
    return top;
}

static void push_pair(struct enc_ctx *c, int32_t pos)
{
    if (pos < 0)
        return;
    int32_t nx = c->next[pos];
    if (nx < 0)
        return;
    const struct tok_merge_slot *m = merge_lookup(c->tk, c->sym[pos], c->sym[nx]);
    if (m)
        heap_push(c, m->rank, pos);
}

/* Byte-level BPE of one pre-token piece. */
static int bpe_piece(struct enc_ctx *c, const uint8_t *s, size_t n)
{
    const struct tokenizer *tk = c->tk;
    if (n == 0)
        return 0;
    if (tk->ignore_merges || n == 1) {
        if (grow((void **)&c->map, &c->cap_map, 2 * n, 1))
            return ERR_NOMEM;
        size_t m = 0;
        for (size_t i = 0; i < n; i++) {
            memcpy(c->map + m, tk->byte_utf8[s[i]], tk->byte_utf8_len[s[i]]);
            m += tk->byte_utf8_len[s[i]];
        }
        int32_t id = vocab_lookup(tk, c->map, m);
        if (id >= 0)
            return emit(c, id);
    }
    if (n > c->cap_sym) {
        size_t cap = c->cap_sym ? c->cap_sym : 64;
        while (cap < n)
            cap *= 2;
        int32_t *a = realloc(c->sym, cap * sizeof *a);
        if (a)
            c->sym = a;
        int32_t *b = realloc(c->prev, cap * sizeof *b);
        if (b)
            c->prev = b;
        int32_t *d = realloc(c->next, cap * sizeof *d);
        if (d)
            c->next = d;
        if (!a || !b || !d)
            return ERR_NOMEM;
        c->cap_sym = cap;
    }
    /* Each merge kills one symbol and pushes at most two pairs, so the heap
     * never holds more than 3 n entries. */
    if (grow((void **)&c->heap, &c->cap_heap, 3 * n + 4, sizeof *c->heap))
        return ERR_NOMEM;
    /* Symbols: one per byte; a byte without a vocab symbol is dropped, as the
     * reference does without an unk token. */
    int32_t m = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = tk->byte_id[s[i]];
        if (id >= 0)
            c->sym[m++] = id;
    }
    for (int32_t i = 0; i < m; i++) {
        c->prev[i] = i - 1;
        c->next[i] = i + 1 < m ? i + 1 : -1;
    }
    c->n_heap = 0;
    for (int32_t i = 0; i + 1 < m; i++)
        push_pair(c, i);
    while (c->n_heap > 0) {
        struct heap_item top = heap_pop(c);
        int32_t pos = top.pos;
        if (c->sym[pos] < 0)
            continue; /* merged into its left neighbour */
        int32_t nx = c->next[pos];
        if (nx < 0)
            continue;
        const struct tok_merge_slot *mg = merge_lookup(tk, c->sym[pos], c->sym[nx]);
        if (!mg || mg->rank != top.rank)
            continue; /* stale: the pair changed since it was pushed */
        c->sym[pos] = mg->new_id;
        c->sym[nx] = -1;
        c->next[pos] = c->next[nx];
        if (c->next[nx] >= 0)
            c->prev[c->next[nx]] = pos;
        push_pair(c, c->prev[pos]);
        push_pair(c, pos);
    }
    for (int32_t i = 0; i >= 0 && m > 0; i = c->next[i]) {
        int rc = emit(c, c->sym[i]);
        if (rc)
            return rc;
    }
    return 0;
}

/* Pre-tokenizes a segment free of added tokens and encodes its pieces. */
static int encode_segment(struct enc_ctx *c, const uint8_t *s, size_t n, char *err)
{
    const struct tokenizer *tk = c->tk;
    int rc;
    if (n == 0)
        return 0;
    if (!tk->re)
        return bpe_piece(c, s, n);
    size_t last = 0, from = 0;
    while (from < n) {
        int mr = pcre2_match(tk->re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, c->md, NULL);
        if (mr == PCRE2_ERROR_NOMATCH)
            break;
        if (mr < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(mr, msg, sizeof msg);
            return error_set(err, ERR_INTERNAL, "tokenizer: regex match failed: %s", (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) { /* empty match: move on one character */
            size_t adv = utf8_valid_len(s + ms, n - ms);
            from = ms + (adv ? adv : 1);
            continue;
        }
        if (ms > last && (rc = bpe_piece(c, s + last, ms - last)))
            goto nomem;
        if ((rc = bpe_piece(c, s + ms, me - ms)))
            goto nomem;
        last = from = me;
    }
    if (last < n && (rc = bpe_piece(c, s + last, n - last)))
        goto nomem;
    return 0;
nomem:
    return error_set(err, rc, "tokenizer: out of memory encoding %zu bytes", n);
}

/* Index in tk->added of the longest allowed added token at s[0..n), or -1. */
static int match_added(const struct tokenizer *tk, const uint8_t *s, size_t n, int parse_special)
{
    for (size_t i = 0; i < tk->n_added; i++) {
        const struct tok_added *a = &tk->added[i];
        if (a->len <= n && (parse_special || !a->special) && memcmp(a->content, s, a->len) == 0)
            return (int)i;
    }
    return -1;
}

int tokenizer_encode(const struct tokenizer *tk, const char *text, size_t len, unsigned flags, int32_t **ids_out,
                     size_t *n_out, char *err)
{
    if (!tk || !ids_out || !n_out || (!text && len > 0))
        return error_set(err, ERR_INVALID_ARG, "tokenizer_encode: NULL argument");
    *ids_out = NULL;
    *n_out = 0;
    const uint8_t *s = (const uint8_t *)text;
    size_t bad;
    if (!tokenizer_utf8_valid(s, len, &bad))
        return error_set(err, ERR_INVALID_ARG, "text: invalid UTF-8 at byte offset %zu", bad);
    struct enc_ctx c = {.tk = tk};
    int rc = 0;
    if (tk->re && !(c.md = pcre2_match_data_create_from_pattern(tk->re, NULL))) {
        rc = error_set(err, ERR_NOMEM, "tokenizer: out of memory for regex match data");
        goto done;
    }
    if (grow((void **)&c.ids, &c.cap_ids, len / 3 + 16, sizeof *c.ids)) {
        rc = error_set(err, ERR_NOMEM, "tokenizer: out of memory encoding %zu bytes", len);
        goto done;
    }
    if (flags & TOKENIZER_ADD_BOS)
        for (size_t i = 0; i < tk->n_bos_prefix && !rc; i++)
            rc = emit(&c, tk->bos_prefix[i]);
    int parse_special = (flags & TOKENIZER_PARSE_SPECIAL) != 0;
    const uint8_t *first = parse_special ? tk->first_any : tk->first_plain;
    size_t seg = 0;
    for (size_t i = 0; i < len && !rc;) {
        int a = first[s[i]] ? match_added(tk, s + i, len - i, parse_special) : -1;
        if (a < 0) {
            i++;
            continue;
        }
        if ((rc = encode_segment(&c, s + seg, i - seg, err)))
            goto done;
        rc = emit(&c, tk->added[a].id);
        i += tk->added[a].len;
        seg = i;
    }
    if (!rc)
        rc = encode_segment(&c, s + seg, len - seg, err);
    if (flags & TOKENIZER_ADD_BOS)
        for (size_t i = 0; i < tk->n_bos_suffix && !rc; i++)
            rc = emit(&c, tk->bos_suffix[i]);
    if (rc == ERR_NOMEM)
        error_set(err, rc, "tokenizer: out of memory encoding %zu bytes", len);
done:
    pcre2_match_data_free(c.md);
    free(c.sym);
    free(c.prev);
    free(c.next);
    free(c.heap);
    free(c.map);
    if (rc) {
        free(c.ids);
        return rc;
    }
    *ids_out = c.ids;
    *n_out = c.n_ids;
    return 0;
}

/* ---- decoding and lookups ---- */

int tokenizer_decode(const struct tokenizer *tk, const int32_t *ids, size_t n, int skip_special, char **text_out,
                     size_t *len_out, char *err)
{
    if (!tk || !text_out || !len_out || (!ids && n > 0))
        return error_set(err, ERR_INVALID_ARG, "tokenizer_decode: NULL argument");
    *text_out = NULL;
    *len_out = 0;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= tk->n_vocab || tk->dec_len[id] < 0)
            return error_set(err, ERR_RANGE, "ids[%zu]: token id %d is not in the vocabulary (0..%d)", i, id,
                             tk->n_vocab - 1);
        if (!(skip_special && tk->is_special[id]))
            total += (size_t)tk->dec_len[id];
    }
    uint8_t *raw = malloc(total + 1);
    char *out = malloc(3 * total + 1);
    if (!raw || !out) {
        free(raw);
        free(out);
        return error_set(err, ERR_NOMEM, "tokenizer: out of memory decoding %zu ids", n);
    }
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (skip_special && tk->is_special[id])
            continue;
        memcpy(raw + o, tk->dec_arena + tk->dec_off[id], (size_t)tk->dec_len[id]);
        o += (size_t)tk->dec_len[id];
    }
    size_t len = tokenizer_utf8_repair(raw, o, (uint8_t *)out);
    free(raw);
    out[len] = '\0';
    *text_out = out;
    *len_out = len;
    return 0;
}

int tokenizer_vocab_size(const struct tokenizer *tk)
{
    return tk ? tk->n_vocab : 0;
}

int tokenizer_token_id(const struct tokenizer *tk, const char *token_text)
{
    if (!tk || !token_text)
        return -1;
    size_t n = strlen(token_text);
    int a = added_index_by_content(tk, token_text, n);
    if (a >= 0)
        return tk->added[a].id;
    return vocab_lookup(tk, token_text, n);
}

int tokenizer_is_special(const struct tokenizer *tk, int32_t id)
{
    if (!tk || id < 0 || id >= tk->n_vocab)
        return 0;
    return tk->is_special[id];
}

const uint8_t *tokenizer_token_bytes(const struct tokenizer *tk, int32_t id, size_t *len_out)
{
    *len_out = 0;
    if (!tk || id < 0 || id >= tk->n_vocab || tk->dec_len[id] < 0)
        return NULL;
    *len_out = (size_t)tk->dec_len[id];
    return tk->dec_arena + tk->dec_off[id];
}
