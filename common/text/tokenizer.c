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
#include "tokenizer_private.h"
#include "utf8.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- byte-level alphabet (GPT-2 bytes_to_unicode) ---- */

void tokenizer_byte_level_tables(int32_t byte_to_cp[256], int16_t cp_to_byte[TOK_ALPHABET_CP])
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

size_t tokenizer_table_size_for(size_t n)
{
    size_t cap = 16;
    while (cap < 2 * n + 1)
        cap <<= 1;
    return cap;
}

int32_t tokenizer_vocab_lookup(const struct tokenizer *tk, const char *s, size_t n)
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
void tokenizer_vocab_insert(struct tokenizer *tk, int32_t id)
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

void tokenizer_merge_insert(struct tokenizer *tk, int32_t a, int32_t b, int32_t rank, int32_t new_id)
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
        int32_t id = tokenizer_vocab_lookup(tk, c->map, m);
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
    if (!utf8_valid(s, len, &bad))
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
    size_t len = utf8_repair(raw, o, (uint8_t *)out);
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
    int a = tokenizer_added_index(tk, token_text, n);
    if (a >= 0)
        return tk->added[a].id;
    return tokenizer_vocab_lookup(tk, token_text, n);
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

int tokenizer_text_tokens(const struct tokenizer *tk, const uint8_t ***bytes_out, size_t **lens_out,
                          char *err)
{
    const int32_t n = tokenizer_vocab_size(tk);
    const uint8_t **bytes = calloc((size_t)n + 1, sizeof *bytes);
    size_t *lens = calloc((size_t)n + 1, sizeof *lens);
    if (!bytes || !lens) {
        free(bytes);
        free(lens);
        return error_set(err, ERR_NOMEM, "tokenizer: out of memory for %d tokens' bytes", (int)n);
    }
    for (int32_t i = 0; i < n; i++)
        if (!tokenizer_is_special(tk, i))
            bytes[i] = tokenizer_token_bytes(tk, i, &lens[i]);
    *bytes_out = bytes;
    *lens_out = lens;
    return 0;
}
