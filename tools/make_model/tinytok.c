/* tinytok.c: learns the tiny BPE vocabulary and writes it as tokenizer.json
 * and tokenizer_config.json (see tinytok.h for the vocabulary layout).
 *
 * Training is the textbook greedy loop: split the corpus into pre-tokens with
 * the Llama 3 regex, count unique pre-tokens, then repeatedly count adjacent
 * symbol pairs (weighted by pre-token count), merge the best pair everywhere
 * and record it. The corpus is a few kilobytes, so recounting every round
 * costs well under a millisecond per merge.
 */
#include "tinytok.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <errno.h>
#include <pcre2.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

/* The Llama 3 pre-tokenizer regex, as in its tokenizer.json. */
static const char tinytok_regex[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

const char tinytok_chat_template[] =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

static const char *const tinytok_specials[TINYTOK_N_SPECIAL] = {
    "<|begin_of_text|>",           "<|end_of_text|>",
    "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",   "<|reserved_special_token_2|>",
    "<|start_header_id|>",         "<|end_header_id|>",
    "<|eom_id|>",                  "<|eot_id|>",
    "<|python_tag|>",              "<|reserved_special_token_3|>",
    "<|reserved_special_token_4|>", "<|reserved_special_token_5|>",
    "<|reserved_special_token_6|>", "<|reserved_special_token_7|>",
};

const char *tinytok_special_name(int k)
{
    return (k >= 0 && k < TINYTOK_N_SPECIAL) ? tinytok_specials[k] : NULL;
}

/* One unique pre-token: its symbols (token ids) and how often it occurs. */
struct tt_word {
    int *syms;
    int n_syms;
    int count;
};

struct tt_state {
    /* byte-level alphabet */
    int byte_codepoint[256]; /* GPT-2 bytes_to_unicode */
    int byte_id[256];        /* token id of each byte */
    /* tokens: raw bytes of token id i are bytes[tok_off[i] .. tok_off[i]+tok_len[i]) */
    unsigned char *bytes;
    size_t bytes_len, bytes_cap;
    size_t *tok_off;
    int *tok_len;
    int n_tokens;
    int (*merges)[2];
    int n_merges;
    /* corpus */
    struct tt_word *words;
    int n_words;
    int *sym_pool;
};

struct tt_piece {
    const char *s;
    int len;
};

static int piece_cmp(const void *a, const void *b)
{
    const struct tt_piece *x = a, *y = b;
    int n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->s, y->s, (size_t)n);
    return c ? c : (x->len > y->len) - (x->len < y->len);
}

static void bytes_to_unicode(struct tt_state *st)
{
    int n = 0, next_id = 0;
    int in_bs[256] = {0};
    for (int b = 0; b < 256; b++)
        if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))
            in_bs[b] = 1;
    /* ids follow bytes_to_unicode's list: the printable bytes in order, then
     * the others mapped to U+0100 + n. */
    for (int b = 0; b < 256; b++)
        if (in_bs[b]) {
            st->byte_codepoint[b] = b;
            st->byte_id[b] = next_id++;
        }
    for (int b = 0; b < 256; b++)
        if (!in_bs[b]) {
            st->byte_codepoint[b] = 256 + n++;
            st->byte_id[b] = next_id++;
        }
}

/* Adds a token with raw bytes s[0..len). */
static int add_token(struct tt_state *st, const unsigned char *s, int len)
{
    if (st->bytes_len + (size_t)len > st->bytes_cap) {
        size_t cap = st->bytes_cap ? st->bytes_cap * 2 : 4096;
        while (cap < st->bytes_len + (size_t)len)
            cap *= 2;
        unsigned char *nb = realloc(st->bytes, cap);
        if (!nb)
            return -1;
        st->bytes = nb;
        st->bytes_cap = cap;
    }
    memcpy(st->bytes + st->bytes_len, s, (size_t)len);
    st->tok_off[st->n_tokens] = st->bytes_len;
    st->tok_len[st->n_tokens] = len;
    st->bytes_len += (size_t)len;
    st->n_tokens++;
    return 0;
}

static int pretokenize(struct tt_state *st, char *err)
{
    int errcode, rc = 0;
    PCRE2_SIZE erroff;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)tinytok_regex, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP, &errcode, &erroff, NULL);
    if (!re)
        return error_set(err, ERR_INTERNAL, "tiny tokenizer: regex does not compile (%d at %zu)",
                         errcode, (size_t)erroff);
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    size_t len = strlen(tinytok_corpus);
    struct tt_piece *pieces = malloc(len * sizeof *pieces); /* at most one per byte */
    if (!md || !pieces) {
        rc = error_set(err, ERR_NOMEM, "tiny tokenizer: out of memory");
        goto done;
    }
    size_t n_pieces = 0, pos = 0;
    while (pos < len) {
        int m = pcre2_match(re, (PCRE2_SPTR)tinytok_corpus, len, pos, 0, md, NULL);
        if (m == PCRE2_ERROR_NOMATCH)
            break;
        if (m < 0) {
            rc = error_set(err, ERR_INTERNAL, "tiny tokenizer: regex match failed (%d)", m);
            goto done;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        if (ov[1] <= ov[0]) { /* cannot happen with this regex: every branch eats a char */
            pos = ov[0] + 1;
            continue;
        }
        pieces[n_pieces].s = tinytok_corpus + ov[0];
        pieces[n_pieces].len = (int)(ov[1] - ov[0]);
        n_pieces++;
        pos = ov[1];
    }
    qsort(pieces, n_pieces, sizeof *pieces, piece_cmp);
    st->words = calloc(n_pieces ? n_pieces : 1, sizeof *st->words);
    st->sym_pool = malloc((len ? len : 1) * sizeof *st->sym_pool);
    if (!st->words || !st->sym_pool) {
        rc = error_set(err, ERR_NOMEM, "tiny tokenizer: out of memory");
        goto done;
    }
    size_t used = 0;
    for (size_t i = 0; i < n_pieces; i++) {
        if (i > 0 && piece_cmp(&pieces[i - 1], &pieces[i]) == 0) {
            st->words[st->n_words - 1].count++;
            continue;
        }
        struct tt_word *w = &st->words[st->n_words++];
        w->syms = st->sym_pool + used;
        w->n_syms = pieces[i].len;
        w->count = 1;
        for (int k = 0; k < pieces[i].len; k++)
            w->syms[k] = st->byte_id[(unsigned char)pieces[i].s[k]];
        used += (size_t)pieces[i].len;
    }
done:
    free(pieces);
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    return rc;
}

/* Open-addressing table of pair counts, rebuilt each round. */
#define TT_TABLE_SIZE 32768 /* > number of distinct adjacent pairs in the corpus */

struct tt_slot {
    int a, b; /* a < 0: empty */
    long count;
};

static int token_exists(const struct tt_state *st, const unsigned char *s, int len)
{
    for (int i = 0; i < st->n_tokens; i++)
        if (st->tok_len[i] == len && memcmp(st->bytes + st->tok_off[i], s, (size_t)len) == 0)
            return 1;
    return 0;
}

static int learn_merges(struct tt_state *st, int n_merges, char *err)
{
    struct tt_slot *table = malloc(TT_TABLE_SIZE * sizeof *table);
    unsigned char *cat = malloc(4096);
    int rc = 0;
    if (!table || !cat) {
        rc = error_set(err, ERR_NOMEM, "tiny tokenizer: out of memory");
        goto done;
    }
    while (st->n_merges < n_merges) {
        for (int i = 0; i < TT_TABLE_SIZE; i++)
            table[i].a = -1;
        for (int w = 0; w < st->n_words; w++) {
            const struct tt_word *wd = &st->words[w];
            for (int k = 0; k + 1 < wd->n_syms; k++) {
                int a = wd->syms[k], b = wd->syms[k + 1];
                uint32_t h = (uint32_t)(a * 2654435761u) ^ (uint32_t)(b * 40503u);
                uint32_t slot = h & (TT_TABLE_SIZE - 1);
                while (table[slot].a >= 0 && (table[slot].a != a || table[slot].b != b))
                    slot = (slot + 1) & (TT_TABLE_SIZE - 1);
                if (table[slot].a < 0) {
                    table[slot].a = a;
                    table[slot].b = b;
                    table[slot].count = 0;
                }
                table[slot].count += wd->count;
            }
        }
        /* Best pair whose concatenation is a new string. Slots of pairs that
         * fail that test are marked (count = -1) and the search repeats. */
        int best = -1;
        for (;;) {
            best = -1;
            for (int i = 0; i < TT_TABLE_SIZE; i++) {
                const struct tt_slot *s = &table[i];
                if (s->a < 0 || s->count <= 0)
                    continue;
                if (best < 0 || s->count > table[best].count ||
                    (s->count == table[best].count &&
                     (s->a < table[best].a || (s->a == table[best].a && s->b < table[best].b))))
                    best = i;
            }
            if (best < 0)
                break;
            int la = st->tok_len[table[best].a], lb = st->tok_len[table[best].b];
            if (la + lb > 4096) {
                table[best].count = -1;
                continue;
            }
            memcpy(cat, st->bytes + st->tok_off[table[best].a], (size_t)la);
            memcpy(cat + la, st->bytes + st->tok_off[table[best].b], (size_t)lb);
            if (!token_exists(st, cat, la + lb))
                break;
            table[best].count = -1;
        }
        if (best < 0) {
            rc = error_set(err, ERR_INTERNAL,
                           "tiny tokenizer: the corpus supports only %d merges, %d wanted",
                           st->n_merges, n_merges);
            goto done;
        }
        int a = table[best].a, b = table[best].b;
        int new_id = st->n_tokens;
        if (add_token(st, cat, st->tok_len[a] + st->tok_len[b])) {
            rc = error_set(err, ERR_NOMEM, "tiny tokenizer: out of memory");
            goto done;
        }
        st->merges[st->n_merges][0] = a;
        st->merges[st->n_merges][1] = b;
        st->n_merges++;
        for (int w = 0; w < st->n_words; w++) {
            struct tt_word *wd = &st->words[w];
            int o = 0;
            for (int k = 0; k < wd->n_syms; k++) {
                if (k + 1 < wd->n_syms && wd->syms[k] == a && wd->syms[k + 1] == b) {
                    wd->syms[o++] = new_id;
                    k++;
                } else {
                    wd->syms[o++] = wd->syms[k];
                }
            }
            wd->n_syms = o;
        }
    }
done:
    free(table);
    free(cat);
    return rc;
}

/* Writes codepoint cp as UTF-8, JSON-escaped where JSON needs it. */
static void put_json_codepoint(FILE *f, int cp)
{
    if (cp == '"' || cp == '\\') {
        fputc('\\', f);
        fputc(cp, f);
    } else if (cp < 0x20) {
        fprintf(f, "\\u%04x", cp);
    } else if (cp < 0x80) {
        fputc(cp, f);
    } else if (cp < 0x800) {
        fputc(0xC0 | (cp >> 6), f);
        fputc(0x80 | (cp & 0x3F), f);
    } else {
        fputc(0xE0 | (cp >> 12), f);
        fputc(0x80 | ((cp >> 6) & 0x3F), f);
        fputc(0x80 | (cp & 0x3F), f);
    }
}

/* Token id as its byte-level string (no quotes). */
static void put_token(FILE *f, const struct tt_state *st, int id)
{
    for (int k = 0; k < st->tok_len[id]; k++)
        put_json_codepoint(f, st->byte_codepoint[st->bytes[st->tok_off[id] + k]]);
}

/* A plain C string as a JSON string (with quotes). */
static void put_json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '\n')
            fputs("\\n", f);
        else if (c == '\t')
            fputs("\\t", f);
        else if (c == '"' || c == '\\') {
            fputc('\\', f);
            fputc(c, f);
        } else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

static int close_checked(FILE *f, const char *path, char *err)
{
    int bad = ferror(f);
    if (fclose(f) != 0 || bad)
        return error_set(err, ERR_IO, "%s: write failed", path);
    return 0;
}

static int write_tokenizer_json(const struct tt_state *st, const char *path, int vocab_size,
                                char *err)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return error_set_errno(err, ERR_IO, errno, "%s: cannot create", path);
    int special0 = vocab_size - TINYTOK_N_SPECIAL;
    fputs("{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n"
          "  \"added_tokens\": [\n", f);
    for (int k = 0; k < TINYTOK_N_SPECIAL; k++)
        fprintf(f,
                "    {\n      \"id\": %d,\n      \"content\": \"%s\",\n"
                "      \"single_word\": false,\n      \"lstrip\": false,\n"
                "      \"rstrip\": false,\n      \"normalized\": false,\n"
                "      \"special\": true\n    }%s\n",
                special0 + k, tinytok_specials[k], k + 1 < TINYTOK_N_SPECIAL ? "," : "");
    fputs("  ],\n  \"normalizer\": null,\n  \"pre_tokenizer\": {\n    \"type\": \"Sequence\",\n"
          "    \"pretokenizers\": [\n      {\n        \"type\": \"Split\",\n"
          "        \"pattern\": {\n          \"Regex\": ", f);
    put_json_string(f, tinytok_regex);
    fputs("\n        },\n        \"behavior\": \"Isolated\",\n        \"invert\": false\n"
          "      },\n      {\n        \"type\": \"ByteLevel\",\n"
          "        \"add_prefix_space\": false,\n        \"trim_offsets\": true,\n"
          "        \"use_regex\": false\n      }\n    ]\n  },\n", f);
    const char *bos = tinytok_specials[TINYTOK_BOS];
    fprintf(f,
            "  \"post_processor\": {\n    \"type\": \"Sequence\",\n    \"processors\": [\n"
            "      {\n        \"type\": \"ByteLevel\",\n        \"add_prefix_space\": true,\n"
            "        \"trim_offsets\": false,\n        \"use_regex\": true\n      },\n"
            "      {\n        \"type\": \"TemplateProcessing\",\n        \"single\": [\n"
            "          {\n            \"SpecialToken\": {\n              \"id\": \"%s\",\n"
            "              \"type_id\": 0\n            }\n          },\n"
            "          {\n            \"Sequence\": {\n              \"id\": \"A\",\n"
            "              \"type_id\": 0\n            }\n          }\n        ],\n"
            "        \"pair\": [\n"
            "          {\n            \"SpecialToken\": {\n              \"id\": \"%s\",\n"
            "              \"type_id\": 0\n            }\n          },\n"
            "          {\n            \"Sequence\": {\n              \"id\": \"A\",\n"
            "              \"type_id\": 0\n            }\n          },\n"
            "          {\n            \"SpecialToken\": {\n              \"id\": \"%s\",\n"
            "              \"type_id\": 1\n            }\n          },\n"
            "          {\n            \"Sequence\": {\n              \"id\": \"B\",\n"
            "              \"type_id\": 1\n            }\n          }\n        ],\n"
            "        \"special_tokens\": {\n          \"%s\": {\n            \"id\": \"%s\",\n"
            "            \"ids\": [\n              %d\n            ],\n"
            "            \"tokens\": [\n              \"%s\"\n            ]\n          }\n"
            "        }\n      }\n    ]\n  },\n",
            bos, bos, bos, bos, bos, special0 + TINYTOK_BOS, bos);
    fputs("  \"decoder\": {\n    \"type\": \"ByteLevel\",\n    \"add_prefix_space\": true,\n"
          "    \"trim_offsets\": true,\n    \"use_regex\": true\n  },\n"
          "  \"model\": {\n    \"type\": \"BPE\",\n    \"dropout\": null,\n"
          "    \"unk_token\": null,\n    \"continuing_subword_prefix\": null,\n"
          "    \"end_of_word_suffix\": null,\n    \"fuse_unk\": false,\n"
          "    \"byte_fallback\": false,\n    \"ignore_merges\": true,\n    \"vocab\": {\n", f);
    for (int id = 0; id < st->n_tokens; id++) {
        fputs("      \"", f);
        put_token(f, st, id);
        fprintf(f, "\": %d%s\n", id, id + 1 < st->n_tokens ? "," : "");
    }
    fputs("    },\n    \"merges\": [\n", f);
    for (int m = 0; m < st->n_merges; m++) {
        fputs("      \"", f);
        put_token(f, st, st->merges[m][0]);
        fputc(' ', f);
        put_token(f, st, st->merges[m][1]);
        fprintf(f, "\"%s\n", m + 1 < st->n_merges ? "," : "");
    }
    fputs("    ]\n  }\n}", f);
    return close_checked(f, path, err);
}

static int write_tokenizer_config(const char *path, int vocab_size, int model_max_length,
                                  char *err)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return error_set_errno(err, ERR_IO, errno, "%s: cannot create", path);
    int special0 = vocab_size - TINYTOK_N_SPECIAL;
    fputs("{\n  \"added_tokens_decoder\": {\n", f);
    for (int k = 0; k < TINYTOK_N_SPECIAL; k++)
        fprintf(f,
                "    \"%d\": {\n      \"content\": \"%s\",\n      \"lstrip\": false,\n"
                "      \"normalized\": false,\n      \"rstrip\": false,\n"
                "      \"single_word\": false,\n      \"special\": true\n    }%s\n",
                special0 + k, tinytok_specials[k], k + 1 < TINYTOK_N_SPECIAL ? "," : "");
    fprintf(f, "  },\n  \"bos_token\": \"%s\",\n  \"chat_template\": ",
            tinytok_specials[TINYTOK_BOS]);
    put_json_string(f, tinytok_chat_template);
    fprintf(f,
            ",\n  \"clean_up_tokenization_spaces\": true,\n  \"eos_token\": \"%s\",\n"
            "  \"model_input_names\": [\n    \"input_ids\",\n    \"attention_mask\"\n  ],\n"
            "  \"model_max_length\": %d,\n"
            "  \"tokenizer_class\": \"PreTrainedTokenizerFast\"\n}\n",
            tinytok_specials[TINYTOK_EOT], model_max_length);
    return close_checked(f, path, err);
}

int tinytok_write(const char *dir, int vocab_size, int model_max_length, char *err)
{
    struct tt_state st;
    int rc;
    char path[4096];
    memset(&st, 0, sizeof st);
    if (vocab_size < TINYTOK_MIN_VOCAB || vocab_size > TINYTOK_MAX_VOCAB)
        return error_set(err, ERR_INVALID_ARG,
                         "tiny tokenizer: vocab_size must be in %d..%d, got %d",
                         TINYTOK_MIN_VOCAB, TINYTOK_MAX_VOCAB, vocab_size);
    int n_base = vocab_size - TINYTOK_N_SPECIAL;
    st.tok_off = calloc((size_t)n_base, sizeof *st.tok_off);
    st.tok_len = calloc((size_t)n_base, sizeof *st.tok_len);
    st.merges = calloc((size_t)n_base, sizeof *st.merges);
    if (!st.tok_off || !st.tok_len || !st.merges) {
        rc = error_set(err, ERR_NOMEM, "tiny tokenizer: out of memory");
        goto done;
    }
    bytes_to_unicode(&st);
    for (int id = 0; id < 256; id++) {
        /* the byte whose id is `id` */
        for (int b = 0; b < 256; b++)
            if (st.byte_id[b] == id) {
                unsigned char c = (unsigned char)b;
                if (add_token(&st, &c, 1)) {
                    rc = error_set(err, ERR_NOMEM, "tiny tokenizer: out of memory");
                    goto done;
                }
                break;
            }
    }
    rc = pretokenize(&st, err);
    if (rc)
        goto done;
    rc = learn_merges(&st, n_base - 256, err);
    if (rc)
        goto done;
    if (snprintf(path, sizeof path, "%s/tokenizer_config.json", dir) >= (int)sizeof path) {
        rc = error_set(err, ERR_INVALID_ARG, "%s: path too long", dir);
        goto done;
    }
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    rc = write_tokenizer_json(&st, path, vocab_size, err);
    if (rc)
        goto done;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    rc = write_tokenizer_config(path, vocab_size, model_max_length, err);
done:
    free(st.bytes);
    free(st.tok_off);
    free(st.tok_len);
    free(st.merges);
    free(st.words);
    free(st.sym_pool);
    return rc;
}
