/* fuzz_grammar_check.h: what the grammar fuzz targets check on a grammar that
 * compiled: an engine over it (with a small memory cap) steps through every
 * byte from the start state and along the input itself, and the token mask
 * of a small vocabulary (every single byte and some longer strings) agrees
 * with the matcher, token by token, in the states reached. */
#ifndef TANDEM_FUZZ_GRAMMAR_CHECK_H
#define TANDEM_FUZZ_GRAMMAR_CHECK_H

#include "error.h"
#include "grammar_match.h"
#include "token_mask.h"

#include <stdlib.h>

static inline void fuzz_mask_agrees(struct grammar_engine *e, struct token_mask *m,
                                    const struct token_mask_vocab *v, int32_t state, uint64_t *bits)
{
    char err[ERR_MSG_MAX];
    if (token_mask_compute(m, state, bits, err))
        return; /* the memory cap: an error, not a crash */
    for (int32_t id = 0; id < token_mask_vocab_n_tokens(v); id++) {
        size_t len;
        const uint8_t *b = token_mask_vocab_bytes(v, id, &len);
        int32_t next;
        if (grammar_engine_feed(e, state, b, len, &next, err))
            return;
        if ((next != GRAMMAR_STATE_DEAD) != token_mask_test(bits, id))
            abort();
    }
}

/* Consumes g. */
static inline void fuzz_grammar_exercise(struct grammar *g, const uint8_t *data, size_t size)
{
    static const char *const extra[] = {"{\"", "\":", "\"}", "true", "null", "\xc3\xa9", "ab",
                                        "  ", "\"a\"", "[1,", "]}", "\\u00"};
    enum { N_EXTRA = sizeof extra / sizeof *extra };
    char err[ERR_MSG_MAX];
    struct grammar_engine *e;
    if (grammar_engine_create(&e, g, (size_t)16 << 20, err))
        return;
    const uint8_t *bytes[256 + N_EXTRA];
    size_t lens[256 + N_EXTRA];
    static uint8_t singles[256];
    for (int i = 0; i < 256; i++)
        singles[i] = (uint8_t)i, bytes[i] = &singles[i], lens[i] = 1;
    for (int i = 0; i < N_EXTRA; i++)
        bytes[256 + i] = (const uint8_t *)extra[i], lens[256 + i] = strlen(extra[i]);
    struct token_mask_vocab *v = NULL;
    struct token_mask *m = NULL;
    uint64_t bits[(256 + N_EXTRA + 63) / 64];
    if (token_mask_vocab_create(&v, bytes, lens, 256 + N_EXTRA, err) == 0 &&
        token_mask_create(&m, e, v, 0, err) == 0) {
        int32_t state = grammar_engine_start(e);
        fuzz_mask_agrees(e, m, v, state, bits);
        /* along the input: the fuzzer finds inputs that are also sentences */
        for (size_t i = 0; i < size && i < 256 && state != GRAMMAR_STATE_DEAD; i++) {
            if (grammar_engine_feed(e, state, &data[i], 1, &state, err))
                break;
            if (i % 16 == 15)
                fuzz_mask_agrees(e, m, v, state, bits);
        }
        (void)grammar_engine_can_end(e, state);
    }
    token_mask_destroy(m);
    token_mask_vocab_destroy(v);
    grammar_engine_destroy(e);
}

#endif
