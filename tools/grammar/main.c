/* tandem-grammar: structured output from the command line.
 *
 *   tandem-grammar check  (--schema FILE | --gbnf FILE | --json-object)
 *   tandem-grammar sample --tokenizer PATH (--schema FILE | --schemas FILE.jsonl | --gbnf FILE
 *                         | --json-object) [--n N] [--seed S] [--free-steps N] [--max-tokens N]
 *   tandem-grammar bench  --tokenizer PATH (--schema FILE | --gbnf FILE | --json-object)
 *                         [--outputs N] [--seed S]
 *
 * check compiles and prints "ok" or the error (exit 1). sample draws random
 * outputs by walking the token mask (walk.h) and prints one JSON line per
 * grammar: {"index": i, "outputs": [...]} or {"index": i, "error": "...",
 * "code": "unsupported"}; --schemas takes one schema per line (the test of
 * tests/e2e/test_grammar_schemas.py). bench times the mask per token
 * (docs/perf/grammar.md).
 */
#include "error.h"
#include "grammar_gbnf.h"
#include "grammar_schema.h"
#include "tokenizer.h"
#include "walk.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct opts {
    const char *cmd, *tokenizer, *schema, *schemas, *gbnf;
    int json_object, n, free_steps, max_tokens, outputs;
    unsigned long long seed;
};

static int usage(void)
{
    fprintf(stderr,
            "usage: tandem-grammar check|sample|bench [--tokenizer PATH] (--schema FILE | "
            "--schemas FILE.jsonl | --gbnf FILE | --json-object) [--n N] [--seed S] "
            "[--free-steps N] [--max-tokens N] [--outputs N]\n");
    return 2;
}

static int parse_args(int argc, char **argv, struct opts *o)
{
    *o = (struct opts){.n = 1, .free_steps = 40, .max_tokens = 4000, .outputs = 20, .seed = 1};
    if (argc < 2)
        return -1;
    o->cmd = argv[1];
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--json-object") == 0) {
            o->json_object = 1;
            continue;
        }
        if (!v)
            return -1;
        i++;
        if (strcmp(a, "--tokenizer") == 0)
            o->tokenizer = v;
        else if (strcmp(a, "--schema") == 0)
            o->schema = v;
        else if (strcmp(a, "--schemas") == 0)
            o->schemas = v;
        else if (strcmp(a, "--gbnf") == 0)
            o->gbnf = v;
        else if (strcmp(a, "--n") == 0)
            o->n = atoi(v);
        else if (strcmp(a, "--seed") == 0)
            o->seed = strtoull(v, NULL, 10);
        else if (strcmp(a, "--free-steps") == 0)
            o->free_steps = atoi(v);
        else if (strcmp(a, "--max-tokens") == 0)
            o->max_tokens = atoi(v);
        else if (strcmp(a, "--outputs") == 0)
            o->outputs = atoi(v);
        else
            return -1;
    }
    int sources = !!o->schema + !!o->schemas + !!o->gbnf + o->json_object;
    return sources == 1 && o->n >= 1 && o->outputs >= 1 && o->max_tokens >= 1 ? 0 : -1;
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    size_t cap = 0;
    *len = 0;
    for (;;) {
        if (*len + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 8192;
            char *p = realloc(buf, cap);
            if (!p)
                break;
            buf = p;
        }
        size_t got = fread(buf + *len, 1, cap - *len - 1, f);
        *len += got;
        if (got == 0)
            break;
    }
    fclose(f);
    if (buf)
        buf[*len] = 0;
    return buf;
}

/* The grammar of the chosen source (text: the schema or grammar text). */
static int compile_source(const struct opts *o, const char *text, size_t len, struct grammar **g,
                          char *err)
{
    if (o->json_object)
        return grammar_schema_any_object(g, err);
    if (o->gbnf)
        return grammar_gbnf_parse(text, len, g, err);
    return grammar_schema_compile_text(text, len, "schema", g, err);
}

static int load_vocab(const char *path, struct token_mask_vocab **v, int32_t single[256],
                      char *err)
{
    struct tokenizer *tk;
    int rc = tokenizer_load(&tk, path, err);
    if (rc)
        return rc;
    int32_t n = tokenizer_vocab_size(tk);
    const uint8_t **bytes = NULL;
    size_t *lens = NULL;
    rc = tokenizer_text_tokens(tk, &bytes, &lens, err);
    for (int b = 0; b < 256; b++)
        single[b] = -1;
    for (int32_t i = 0; i < n && rc == 0; i++)
        if (bytes[i] && lens[i] == 1 && single[bytes[i][0]] < 0)
            single[bytes[i][0]] = i;
    if (rc == 0)
        rc = token_mask_vocab_create(v, bytes, lens, n, err);
    free(bytes);
    free(lens);
    tokenizer_destroy(tk);
    return rc;
}

/* A walker over grammar g (consumed). */
static int walker_open(struct walk_ctx *w, struct grammar *g, const struct token_mask_vocab *v,
                       size_t cache_bytes, char *err)
{
    int rc = grammar_engine_create(&w->engine, g, 0, err);
    if (rc == 0)
        rc = token_mask_create(&w->mask, w->engine, v, cache_bytes, err);
    if (rc == 0) {
        w->vocab = v;
        w->bits = malloc(token_mask_words(w->mask) * sizeof *w->bits);
        rc = w->bits ? 0 : error_set(err, ERR_NOMEM, "out of memory");
    }
    return rc;
}

static void walker_close(struct walk_ctx *w)
{
    token_mask_destroy(w->mask);
    grammar_engine_destroy(w->engine);
    free(w->bits);
    free(w->times);
    w->mask = NULL, w->engine = NULL, w->bits = NULL, w->times = NULL;
    w->n_times = w->cap_times = 0;
}

/* One grammar's line of `sample` output. */
static int sample_one(const struct opts *o, struct walk_ctx *w, int index, const char *text,
                      size_t len, const struct token_mask_vocab *v)
{
    char err[ERR_MSG_MAX] = "";
    struct grammar *g = NULL;
    cJSON *line = cJSON_CreateObject(), *outs = cJSON_CreateArray();
    cJSON_AddNumberToObject(line, "index", index);
    int rc = compile_source(o, text, len, &g, err);
    if (rc == 0 && (rc = walker_open(w, g, v, 0, err)) == 0) {
        for (int k = 0; k < o->n && rc == 0; k++) {
            char *out;
            size_t out_len;
            int free_steps = (int)(walk_rand(w) % (uint64_t)(o->free_steps + 1));
            rc = walk_one(w, free_steps, o->max_tokens, &out, &out_len, err);
            if (rc == 0) {
                cJSON_AddItemToArray(outs, cJSON_CreateString(out));
                free(out);
            }
        }
    }
    walker_close(w);
    if (rc) {
        cJSON_AddStringToObject(line, "error", err);
        cJSON_AddStringToObject(line, "code", error_name(rc));
        cJSON_Delete(outs);
    } else {
        cJSON_AddItemToObject(line, "outputs", outs);
    }
    char *printed = cJSON_PrintUnformatted(line);
    if (printed)
        printf("%s\n", printed);
    cJSON_free(printed);
    cJSON_Delete(line);
    return printed ? 0 : ERR_NOMEM;
}

static int cmd_sample(const struct opts *o, char *err)
{
    struct walk_ctx w = {.rng = o->seed};
    struct token_mask_vocab *v;
    int rc = load_vocab(o->tokenizer, &v, w.single_byte, err);
    if (rc)
        return rc;
    size_t len = 0;
    const char *file = o->schemas ? o->schemas : o->schema ? o->schema : o->gbnf;
    char *text = file ? read_file(file, &len) : NULL;
    if (file && !text)
        rc = error_set(err, ERR_IO, "%s: cannot read", file);
    else if (!o->schemas)
        rc = sample_one(o, &w, 0, text, len, v);
    int index = 0;
    for (char *line = text, *end; rc == 0 && o->schemas && line && *line; line = end) {
        end = strchr(line, '\n');
        end = end ? end + 1 : line + strlen(line);
        if (end - line > 1)
            rc = sample_one(o, &w, index++, line, (size_t)(end - line), v);
    }
    free(text);
    token_mask_vocab_destroy(v);
    return rc;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void report(const char *what, struct walk_ctx *w)
{
    if (w->n_times == 0)
        return;
    qsort(w->times, w->n_times, sizeof *w->times, cmp_double);
    size_t n = w->n_times, p99 = (n * 99 + 99) / 100 - 1;
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += w->times[i];
    printf("%-44s %6zu tokens: median %8.1f us, p99 %8.1f us, max %8.1f us, mean %8.1f us\n", what,
           n, w->times[n / 2] * 1e6, w->times[p99 < n ? p99 : n - 1] * 1e6,
           w->times[n - 1] * 1e6, sum / (double)n * 1e6);
    w->n_times = 0;
}

/* Walks `outputs` random outputs, timing every mask. */
static int bench_pass(const struct opts *o, struct walk_ctx *w, const char *what, char *err)
{
    if (!w->times) { /* a non-NULL array makes walk_one record */
        if (!(w->times = malloc(1024 * sizeof *w->times)))
            return error_set(err, ERR_NOMEM, "out of memory");
        w->cap_times = 1024;
    }
    for (int k = 0; k < o->outputs; k++) {
        char *out;
        size_t len;
        int free_steps = (int)(walk_rand(w) % (uint64_t)(o->free_steps + 1));
        int rc = walk_one(w, free_steps, o->max_tokens, &out, &len, err);
        if (rc)
            return rc;
        if (k == 0)
            printf("  e.g. %.200s%s\n", out, len > 200 ? "..." : "");
        free(out);
    }
    uint64_t walks, nodes, admitted;
    token_mask_counts(w->mask, &walks, &nodes, &admitted);
    report(what, w);
    printf("  trie walks so far %llu: %.0f nodes stepped and %.0f subtrees admitted whole per walk\n",
           (unsigned long long)walks, walks ? (double)nodes / (double)walks : 0.0,
           walks ? (double)admitted / (double)walks : 0.0);
    return 0;
}

static int cmd_bench(const struct opts *o, char *err)
{
    struct walk_ctx w = {.rng = o->seed};
    struct token_mask_vocab *v;
    double t0 = now_s();
    int rc = load_vocab(o->tokenizer, &v, w.single_byte, err);
    if (rc)
        return rc;
    printf("vocabulary %d tokens, trie %d nodes; tokenizer and trie %.0f ms\n",
           token_mask_vocab_n_tokens(v), token_mask_vocab_n_nodes(v), (now_s() - t0) * 1e3);
    size_t len = 0;
    const char *file = o->schema ? o->schema : o->gbnf;
    char *text = file ? read_file(file, &len) : NULL;
    struct grammar *g = NULL;
    if (file && !text)
        rc = error_set(err, ERR_IO, "%s: cannot read", file);
    t0 = now_s();
    rc = rc ? rc : compile_source(o, text, len, &g, err);
    if (rc == 0)
        printf("grammar: %d rules, %d classes, %zu elements; compiled in %.2f ms\n", g->n_rules,
               g->n_classes, g->n_elems, (now_s() - t0) * 1e3);
    rc = rc ? rc : walker_open(&w, g, v, 0, err);
    rc = rc ? rc : bench_pass(o, &w, "cold (fresh engine and cache)", err);
    rc = rc ? rc : bench_pass(o, &w, "warm (same engine, new outputs)", err);
    /* a request's cost per token: the mask, then the row of logits it masks */
    if (rc == 0) {
        w.n_logits = token_mask_vocab_n_tokens(v);
        w.logits = calloc((size_t)w.n_logits, sizeof *w.logits);
        rc = w.logits ? 0 : error_set(err, ERR_NOMEM, "out of memory");
    }
    rc = rc ? rc : bench_pass(o, &w, "warm + applied to a row of logits", err);
    free(w.logits);
    w.logits = NULL;
    if (rc == 0)
        printf("engine: %d states, %.1f MiB\n", grammar_engine_n_states(w.engine),
               (double)grammar_engine_memory(w.engine) / (1 << 20));
    /* the trie walk alone: rows warm, no mask cache */
    if (rc == 0) {
        token_mask_destroy(w.mask);
        w.mask = NULL;
        rc = token_mask_create(&w.mask, w.engine, v, 1, err);
    }
    rc = rc ? rc : bench_pass(o, &w, "walk only (rows warm, mask cache off)", err);
    walker_close(&w);
    free(text);
    token_mask_vocab_destroy(v);
    return rc;
}

static int cmd_check(const struct opts *o, char *err)
{
    size_t len = 0;
    const char *file = o->schema ? o->schema : o->gbnf;
    char *text = file ? read_file(file, &len) : NULL;
    if (file && !text)
        return error_set(err, ERR_IO, "%s: cannot read", file);
    struct grammar *g = NULL;
    int rc = compile_source(o, text, len, &g, err);
    free(text);
    if (rc == 0)
        printf("ok: %d rules, %d classes, %zu elements\n", g->n_rules, g->n_classes, g->n_elems);
    grammar_free(g);
    return rc;
}

int main(int argc, char **argv)
{
    struct opts o;
    if (parse_args(argc, argv, &o))
        return usage();
    char err[ERR_MSG_MAX] = "";
    int rc;
    if (strcmp(o.cmd, "check") == 0)
        rc = cmd_check(&o, err);
    else if (!o.tokenizer)
        return usage();
    else if (strcmp(o.cmd, "sample") == 0)
        rc = cmd_sample(&o, err);
    else if (strcmp(o.cmd, "bench") == 0 && !o.schemas)
        rc = cmd_bench(&o, err);
    else
        return usage();
    if (rc) {
        fprintf(stderr, "tandem-grammar: %s\n", err[0] ? err : error_str(rc));
        return 1;
    }
    return 0;
}
