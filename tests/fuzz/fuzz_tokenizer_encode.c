/* fuzz_tokenizer_encode.c: tokenizer_encode on arbitrary bytes, with the
 * small generated tokenizer tests/fuzz/data/tiny_tokenizer.json (the same
 * Llama 3 shape as the real file: Split regex, byte-level BPE with
 * ignore_merges, 16 special tokens, BOS template), loaded once.
 *
 * Input: the first byte's low two bits are the flags (TOKENIZER_ADD_BOS,
 * TOKENIZER_PARSE_SPECIAL), the rest is the text. Oracles: valid UTF-8 must
 * encode (invalid must be refused, never crash), every id is in the
 * vocabulary, and decoding the ids without specials (or with specials, when
 * they were parsed and no BOS added) gives back exactly the text: byte-level
 * BPE loses nothing. */
#include "fuzz_common.h"
#include "fuzz_tiny_tokenizer.h"

#include "utf8.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[ERR_MSG_MAX];
    const struct tokenizer *tiny = fuzz_tiny_tokenizer();
    if (size < 1)
        return 0;
    unsigned flags = data[0] & 3u;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = tokenizer_encode(tiny, text, len, flags, &ids, &n, err);
    size_t bad_offset = 0;
    int valid = utf8_valid((const uint8_t *)text, len, &bad_offset) == 1;
    if (rc != 0) {
        free(ids);
        if (valid && rc != ERR_NOMEM) {
            fprintf(stderr, "valid UTF-8 refused: %s\n", err);
            abort();
        }
        return 0;
    }
    if (!valid)
        abort(); /* invalid UTF-8 must be refused */
    int vocab = tokenizer_vocab_size(tiny);
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab)
            abort();
    /* Without parsed specials every id is plain text; with them, specials
     * decode to their own content. The BOS is the only addition. */
    int skip_special = (flags & TOKENIZER_ADD_BOS) ? 1 : 0;
    if (!(flags & TOKENIZER_PARSE_SPECIAL) || !skip_special) {
        char *back = NULL;
        size_t back_len = 0;
        if (tokenizer_decode(tiny, ids, n, skip_special, &back, &back_len, err) == 0) {
            if (back_len != len || memcmp(back, text, len) != 0) {
                fprintf(stderr, "decode(encode(text)) != text (flags %u)\n", flags);
                abort();
            }
            free(back);
        }
    }
    free(ids);
    return 0;
}
