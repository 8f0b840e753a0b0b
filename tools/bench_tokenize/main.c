/* tandem-bench-tokenize: encode speed on 1 MB of mixed English prose and code.
 *
 *   tandem-bench-tokenize --tokenizer PATH [--mb N] [--repeat R]
 * Builds N MB (default 1) of text from varied prose, code with tabs and
 * indentation, numbers and a little non-Latin text, encodes it R times
 * (default 5) and prints the best time, MB/s and tokens.
 */
#include "error.h"
#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *const snippets[] = {
    "The quick brown fox jumps over the lazy dog. It wasn't the first time; they'd done it before, "
    "and THEY'LL do it again in 2024.\n",
    "Speculative decoding lets a small draft model propose tokens that the target verifies in one pass. ",
    "int main(int argc, char **argv)\n{\n\tfor (int i = 0; i < argc; i++) {\n\t\tprintf(\"%s\\n\", argv[i]);\n\t}\n\treturn 0;\n}\n",
    "def tokenize(text: str) -> list[int]:\n    ids = []\n    for word in text.split():\n        ids.append(vocab.get(word, 0))\n    return ids\n\n",
    "See https://example.com/path/to/page?query=1&lang=en#section for details (3.14159, 1,234,567).\r\n",
    "   Indented   text  with    runs of spaces\n\n\n and blank lines.\n",
    "Prix: 42 €, naïve café, résumé; Größe: 13 m²; 東京は日本の首都です。 Привет, мир! \n",
    "{\"model\": \"llama-3.2\", \"max_tokens\": 128, \"temperature\": 0.7, \"stream\": true}\n",
    "SELECT id, name FROM users WHERE created_at > '2023-01-01' ORDER BY id DESC LIMIT 10;\n",
    "In 1969, Apollo 11 landed on the Moon; Neil Armstrong's words were heard by 650000000 people. ",
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    const char *path = NULL;
    double mb = 1.0;
    int repeat = 5;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--tokenizer") == 0 && i + 1 < argc)
            path = argv[++i];
        else if (strcmp(argv[i], "--mb") == 0 && i + 1 < argc)
            mb = atof(argv[++i]);
        else if (strcmp(argv[i], "--repeat") == 0 && i + 1 < argc)
            repeat = atoi(argv[++i]);
        else
            path = NULL, i = argc;
    }
    if (!path || mb <= 0 || repeat < 1) {
        fprintf(stderr, "usage: tandem-bench-tokenize --tokenizer PATH [--mb N] [--repeat R]\n");
        return 2;
    }
    char err[ERR_MSG_MAX];
    struct tokenizer *tk;
    double t0 = now_s();
    if (tokenizer_load(&tk, path, err)) {
        fprintf(stderr, "tandem-bench-tokenize: %s\n", err);
        return 1;
    }
    double load_s = now_s() - t0;
    size_t target = (size_t)(mb * 1024 * 1024), len = 0;
    char *text = malloc(target + 1024);
    if (!text) {
        fprintf(stderr, "tandem-bench-tokenize: out of memory\n");
        tokenizer_destroy(tk);
        return 1;
    }
    unsigned seed = 12345;
    size_t n_snip = sizeof snippets / sizeof *snippets;
    while (len < target) {
        seed = seed * 1103515245u + 12345u;
        const char *s = snippets[(seed >> 16) % n_snip];
        size_t l = strlen(s);
        memcpy(text + len, s, l);
        len += l;
    }
    double best = 1e30;
    size_t n_tokens = 0;
    for (int r = 0; r < repeat; r++) {
        int32_t *ids;
        t0 = now_s();
        if (tokenizer_encode(tk, text, len, 0, &ids, &n_tokens, err)) {
            fprintf(stderr, "tandem-bench-tokenize: %s\n", err);
            free(text);
            tokenizer_destroy(tk);
            return 1;
        }
        double dt = now_s() - t0;
        free(ids);
        if (dt < best)
            best = dt;
    }
    double mbytes = (double)len / (1024.0 * 1024.0);
    printf("load %.3f s; encoded %.2f MB (%zu bytes) -> %zu tokens; best of %d: %.4f s, %.2f MB/s; "
           "%.4f s per MB\n",
           load_s, mbytes, len, n_tokens, repeat, best, mbytes / best, best / mbytes);
    free(text);
    tokenizer_destroy(tk);
    return 0;
}
