/* tokenizer_private.h: the tokenizer's state and the table helpers shared by
 * its two halves, tokenizer_load.c (building it from tokenizer.json) and
 * tokenizer.c (encoding, decoding, lookups). Not for other modules: they
 * use tokenizer.h.
 */
#ifndef TANDEM_TOKENIZER_PRIVATE_H
#define TANDEM_TOKENIZER_PRIVATE_H

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer.h"

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

/* GPT-2's bytes_to_unicode: the byte-level alphabet both ways. */
void tokenizer_byte_level_tables(int32_t byte_to_cp[256], int16_t cp_to_byte[TOK_ALPHABET_CP]);
/* Power-of-two open-addressing table size for n entries. */
size_t tokenizer_table_size_for(size_t n);
/* Id of the model vocab key s[0..n), or -1. */
int32_t tokenizer_vocab_lookup(const struct tokenizer *tk, const char *s, size_t n);
void tokenizer_vocab_insert(struct tokenizer *tk, int32_t id);
void tokenizer_merge_insert(struct tokenizer *tk, int32_t a, int32_t b, int32_t rank, int32_t new_id);
/* Index into tk->added of the added token whose content is s[0..n), or -1. */
int tokenizer_added_index(const struct tokenizer *tk, const char *s, size_t n);

#endif
