/* tokenizer.h: byte-level BPE tokenizer for the Llama 3 family, loaded from a
 * HuggingFace tokenizer.json, byte-exact with HuggingFace `tokenizers`.
 *
 * What it is: the `BPE` model (vocab, merges as "a b" strings or ["a","b"]
 * pairs, ignore_merges), the `Split` pre-tokenizer with the file's regex
 * (PCRE2, UTF + UCP; \s and \S mean Unicode White_Space as in the Rust
 * implementation), the `ByteLevel` pre-tokenizer and decoder, added/special
 * tokens taken from `added_tokens`, and the `TemplateProcessing` post-processor
 * (the BOS prefix, applied only with TOKENIZER_ADD_BOS).
 * What it is not: a general HF tokenizer. Normalizers, other models, BPE
 * dropout, byte_fallback, word prefixes/suffixes and added tokens with
 * lstrip/rstrip/single_word are rejected at load with ERR_UNSUPPORTED.
 *
 * Nothing is hard-coded to 128,256 ids: the vocabulary size, the special ids
 * and names all come from the file (the project's tiny test tokenizer has the
 * same shape with ~512 ids).
 *
 * Thread safety: after tokenizer_load returns, the tokenizer is read-only;
 * every function below may be called on one tokenizer from several threads at
 * once (encode keeps its scratch space per call).
 */
#ifndef TANDEM_TOKENIZER_H
#define TANDEM_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

struct tokenizer;

/* Loads a tokenizer. `path` is a tokenizer.json file or a model directory
 * containing one. On success *out owns the tokenizer (free it with
 * tokenizer_destroy). Returns 0, ERR_IO (missing/unreadable file),
 * ERR_FORMAT (malformed or truncated JSON, bad merge form, merge token not in
 * vocab, duplicate ids...), ERR_UNSUPPORTED (a feature outside the Llama 3
 * family) or ERR_NOMEM; the reason names the file and the field. */
int tokenizer_load(struct tokenizer **out, const char *path, char *err);

/* NULL-safe. */
void tokenizer_destroy(struct tokenizer *tk);

enum tokenizer_flags {
    /* Apply the post-processor's single-sequence template (Llama 3: prefix
     * <|begin_of_text|>). Without it no special token is added. */
    TOKENIZER_ADD_BOS = 1,
    /* Text equal to a special token's content ("<|eot_id|>") becomes that
     * token (the reference's default). Without it such text is encoded as
     * plain text, which is what a server must do with user content. Added
     * tokens that are not special are always matched, as in the reference. */
    TOKENIZER_PARSE_SPECIAL = 2,
};

/* Encodes `len` bytes of UTF-8 `text` (NUL bytes allowed; text may be NULL
 * when len is 0). On success *ids_out is a malloc'd array the caller frees
 * (non-NULL even when *n_out is 0). Returns 0, ERR_INVALID_ARG (invalid
 * UTF-8, with the byte offset) or ERR_NOMEM. */
int tokenizer_encode(const struct tokenizer *tk, const char *text, size_t len, unsigned flags,
                     int32_t **ids_out, size_t *n_out, char *err);

/* Decodes ids to bytes exactly as the reference: token bytes concatenated,
 * then each maximal invalid UTF-8 subsequence replaced by U+FFFD. With
 * skip_special, special tokens produce nothing. No space cleanup. On success
 * *text_out is a malloc'd, NUL-terminated buffer of *len_out bytes (the text
 * may itself contain NUL bytes) that the caller frees. Returns 0, ERR_RANGE
 * (an id outside 0..vocab_size-1 or with no token) or ERR_NOMEM. */
int tokenizer_decode(const struct tokenizer *tk, const int32_t *ids, size_t n, int skip_special,
                     char **text_out, size_t *len_out, char *err);

/* Number of ids: one more than the largest id of the vocab and added tokens. */
int tokenizer_vocab_size(const struct tokenizer *tk);

/* Id of the token whose text is `token_text` (an added token's content such
 * as "<|eot_id|>", or a vocab entry in its byte-level form); -1 if absent. */
int tokenizer_token_id(const struct tokenizer *tk, const char *token_text);

/* 1 if id is a special added token, 0 otherwise (also for ids out of range). */
int tokenizer_is_special(const struct tokenizer *tk, int32_t id);

/* The raw bytes id decodes to (before UTF-8 repair), or NULL with *len_out 0
 * when id is out of range or unused. The pointer lives as long as tk. */
const uint8_t *tokenizer_token_bytes(const struct tokenizer *tk, int32_t id, size_t *len_out);

/* The bytes of every id below tokenizer_vocab_size that stands for text:
 * *bytes_out[id] (NULL with length 0 for a special token or an unused id)
 * and *lens_out[id], both malloc'd (the caller frees the two arrays; the
 * bytes live as long as tk). The table a grammar's token mask is built over
 * (token_mask_vocab_create): special tokens never match text. ERR_NOMEM. */
int tokenizer_text_tokens(const struct tokenizer *tk, const uint8_t ***bytes_out, size_t **lens_out,
                          char *err);

#endif
