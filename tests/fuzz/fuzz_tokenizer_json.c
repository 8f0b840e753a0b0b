/* fuzz_tokenizer_json.c: tokenizer.json from fuzz bytes through
 * tokenizer_load (written to a temporary file: the loader reads a path).
 * A tokenizer that loads is used: a few fixed texts (plain, special-token
 * text, invalid UTF-8) are encoded with every flag and decoded again, and
 * every id's bytes are read. */
#include "fuzz_common.h"

#include "error.h"
#include "tokenizer.h"

static const char *const probe_texts[] = {
    "Hello, world! 123 tokens", "<|begin_of_text|>x<|eot_id|> \n\n  y", "caf\xc3\xa9 \xf0\x9f\x98\x80",
    "\xff\xfe invalid", "",
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[512], err[ERR_MSG_MAX];
    fuzz_write_file("tokenizer.json", data, size, path, sizeof path);
    struct tokenizer *tk = NULL;
    if (tokenizer_load(&tk, path, err) != 0)
        return 0;
    int vocab = tokenizer_vocab_size(tk);
    volatile uint8_t sink = 0;
    for (int32_t id = 0; id < vocab; id++) {
        size_t n = 0;
        const uint8_t *b = tokenizer_token_bytes(tk, id, &n);
        if (b && n > 0)
            sink ^= b[0] ^ b[n - 1];
        (void)tokenizer_is_special(tk, id);
    }
    (void)sink;
    for (size_t t = 0; t < sizeof probe_texts / sizeof probe_texts[0]; t++) {
        for (unsigned flags = 0; flags < 4; flags++) {
            int32_t *ids = NULL;
            size_t n = 0;
            if (tokenizer_encode(tk, probe_texts[t], strlen(probe_texts[t]), flags, &ids, &n,
                                 err) == 0) {
                for (size_t i = 0; i < n; i++)
                    if (ids[i] < 0 || ids[i] >= vocab)
                        abort(); /* encode hands out only ids of this vocabulary */
                char *text = NULL;
                size_t len = 0;
                if (tokenizer_decode(tk, ids, n, (int)(flags & 1), &text, &len, err) == 0)
                    free(text);
            }
            free(ids);
        }
    }
    (void)tokenizer_token_id(tk, "<|eot_id|>");
    tokenizer_destroy(tk);
    return 0;
}
