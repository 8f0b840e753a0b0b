/* fuzz_tiny_tokenizer.h: the small generated tokenizer the text targets
 * encode with (tests/fuzz/data/tiny_tokenizer.json: tandem-make-model's tiny
 * tokenizer, vocabulary 512, the Llama 3 shape), loaded once per process and
 * freed at exit. FUZZ_TINY_TOKENIZER (set by tests/fuzz/CMakeLists.txt) is its
 * path; the environment variable of the same name overrides it. */
#ifndef TANDEM_FUZZ_TINY_TOKENIZER_H
#define TANDEM_FUZZ_TINY_TOKENIZER_H

#include <stdio.h>
#include <stdlib.h>

#include "error.h"
#include "tokenizer.h"

#ifndef FUZZ_TINY_TOKENIZER
#error "FUZZ_TINY_TOKENIZER (path of tests/fuzz/data/tiny_tokenizer.json) must be defined"
#endif

static struct tokenizer *fuzz_tiny;

static inline void fuzz_tiny_free(void)
{
    tokenizer_destroy(fuzz_tiny);
    fuzz_tiny = NULL;
}

/* Aborts when the file does not load: that is the test's setup, not an input. */
static inline const struct tokenizer *fuzz_tiny_tokenizer(void)
{
    if (fuzz_tiny)
        return fuzz_tiny;
    char err[ERR_MSG_MAX];
    const char *path = getenv("FUZZ_TINY_TOKENIZER");
    if (!path || !path[0])
        path = FUZZ_TINY_TOKENIZER;
    if (tokenizer_load(&fuzz_tiny, path, err) != 0) {
        fprintf(stderr, "fuzz: the tiny tokenizer does not load: %s\n", err);
        abort();
    }
    atexit(fuzz_tiny_free);
    return fuzz_tiny;
}

#endif
