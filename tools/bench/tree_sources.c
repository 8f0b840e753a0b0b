/* tree_sources.c: tandem-bench-tree-sources, whether token trees from the
 * model-free draft sources pay on the CPU (issue 61; docs/perf/
 * cpu-token-trees.md):
 *
 *   tandem-bench-tree-sources [--model DIR] [--turns N] [--gen N] [--reps N]
 *       [--threads N] [--show 0|1]
 *
 * An agent-like conversation on one target (default: the trained target,
 * models/trained/target): each turn's prompt is the whole conversation so
 * far, then the same Python file passed back as a tool's output with one
 * more line edited, then a question; the target answers --gen tokens
 * greedily. Every turn is a new request: its prompt is prefilled anew (not
 * timed), and once answered it is added to a suffix cache, as the
 * coordinator adds finished requests. Each method decodes every turn:
 * target-only, chains of k tokens and trees of n nodes from the suffix cache
 * and from n-grams of the request itself, and a mixed tree (the suffix
 * tree with the n-gram chain merged under the same root). Chains are
 * verified as a chain forward, trees by specdec_tree_verify_greedy; both
 * accept by greedy matching, so every method's output must equal
 * target-only's (checked: exit 1 if not). Methods alternate within each of
 * --reps repetitions; medians of the decode time (drafting included)
 * are printed with tokens per round and rows verified per round; --show 1
 * prints the answers first.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "draft_tree.h"
#include "error.h"
#include "kernels.h"
#include "llama.h"
#include "ngram.h"
#include "specdec_tree.h"
#include "suffix_cache.h"
#include "tokenizer.h"

#define TS_METHODS_MAX 16
#define TS_REPS_MAX 15

enum ts_source { TS_NONE, TS_SUFFIX, TS_NGRAM, TS_MIXED };

struct ts_method {
    const char *name;
    enum ts_source source;
    int tree;  /* 0: a chain of `size` tokens; 1: a tree of `size` nodes */
    int size;
    int depth; /* a tree's depth cap */
};

static const struct ts_method ts_methods[] = {
    {"target-only", TS_NONE, 0, 0, 0},
    {"suffix chain 4", TS_SUFFIX, 0, 4, 4},
    {"suffix chain 8", TS_SUFFIX, 0, 8, 8},
    {"suffix chain 16", TS_SUFFIX, 0, 16, 16},
    {"suffix tree 8", TS_SUFFIX, 1, 8, 8},
    {"suffix tree 16", TS_SUFFIX, 1, 16, 12},
    {"suffix tree 31", TS_SUFFIX, 1, 31, 16},
    {"ngram chain 4", TS_NGRAM, 0, 4, 4},
    {"ngram chain 8", TS_NGRAM, 0, 8, 8},
    {"ngram tree 8", TS_NGRAM, 1, 8, 6},
    {"ngram tree 16", TS_NGRAM, 1, 16, 8},
    {"mixed tree 16", TS_MIXED, 1, 16, 12},
};
#define TS_N_METHODS ((int)(sizeof ts_methods / sizeof *ts_methods))

/* The file an agent's tool keeps passing back; each turn edits one more
 * line (the edits list), as a code-editing loop does. */
static const char ts_file[] =
    "import os\n"
    "import sys\n"
    "\n"
    "def read_config(path):\n"
    "    \"\"\"Return the settings of the file at path as a dictionary.\"\"\"\n"
    "    settings = {}\n"
    "    with open(path) as f:\n"
    "        for line in f:\n"
    "            line = line.strip()\n"
    "            if not line or line.startswith('#'):\n"
    "                continue\n"
    "            key, value = line.split('=', 1)\n"
    "            settings[key.strip()] = value.strip()\n"
    "    return settings\n"
    "\n"
    "def parse_args(argv):\n"
    "    \"\"\"Return the options and the arguments of the command line.\"\"\"\n"
    "    options = {}\n"
    "    args = []\n"
    "    for arg in argv[1:]:\n"
    "        if arg.startswith('--'):\n"
    "            name, _, value = arg[2:].partition('=')\n"
    "            options[name] = value\n"
    "        else:\n"
    "            args.append(arg)\n"
    "    return options, args\n";

static const char *const ts_edits[][2] = {
    {"settings = {}", "settings = dict()"},
    {"args = []", "args = list()"},
    {"line.strip()", "line.rstrip()"},
    {"options = {}", "options = dict()"},
    {"argv[1:]", "argv[2:]"},
    {"import sys", "import sys\nimport re"},
};

static const char *const ts_questions[] = {
    "Show me the Python code of parse_args.",
    "Write a Python function named read_config.",
    "How would you write copy_file in Python?",
    "Show me the Python code of read_config.",
    "Write a Python function named parse_args.",
    "Show me the Python code of main.",
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int die(const char *what, const char *err)
{
    fprintf(stderr, "tandem-bench-tree-sources: %s: %s\n", what, err);
    return 1;
}

/* A growing token sequence. */
struct ts_seq {
    int32_t *ids;
    int n, cap;
};

static int seq_push(struct ts_seq *s, const int32_t *ids, int n)
{
    if (s->n + n > s->cap) {
        int cap = s->cap ? s->cap : 1024;
        while (cap < s->n + n)
            cap *= 2;
        int32_t *p = realloc(s->ids, (size_t)cap * sizeof *p);
        if (!p)
            return ERR_NOMEM;
        s->ids = p;
        s->cap = cap;
    }
    memcpy(s->ids + s->n, ids, (size_t)n * sizeof *ids);
    s->n += n;
    return 0;
}

/* Appends text (special tokens parsed) to s. */
static int seq_text(struct ts_seq *s, const struct tokenizer *tk, const char *text, char *err)
{
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = tokenizer_encode(tk, text, strlen(text), TOKENIZER_PARSE_SPECIAL, &ids, &n, err);
    if (rc == 0 && (rc = seq_push(s, ids, (int)n)))
        error_set(err, rc, "out of memory");
    free(ids);
    return rc;
}

/* The file after `turn` edits. */
static void edited_file(int turn, char *out, size_t cap)
{
    snprintf(out, cap, "%s", ts_file);
    for (int e = 0; e < turn && e < (int)(sizeof ts_edits / sizeof *ts_edits); e++) {
        char *at = strstr(out, ts_edits[e][0]);
        if (!at)
            continue;
        char tail[4096];
        snprintf(tail, sizeof tail, "%s", at + strlen(ts_edits[e][0]));
        snprintf(at, cap - (size_t)(at - out), "%s%s", ts_edits[e][1], tail);
    }
}

/* Turn t's user message and the assistant header, appended to the
 * conversation. */
static int turn_prompt(struct ts_seq *conv, const struct tokenizer *tk, int t, char *err)
{
    char file[4096], msg[6144];
    edited_file(t, file, sizeof file);
    snprintf(msg, sizeof msg,
             "%s<|start_header_id|>user<|end_header_id|>\n\nThe tool returned:\n%s\n%s<|eot_id|>"
             "<|start_header_id|>assistant<|end_header_id|>\n\n",
             t == 0 ? "<|begin_of_text|>" : "", file,
             ts_questions[t % (int)(sizeof ts_questions / sizeof *ts_questions)]);
    return seq_text(conv, tk, msg, err);
}

struct ts_run {
    double decode_s;
    long rounds, tokens, rows;
};

/* The draft of `m` after hist, into tree (a chain is a tree of one path). */
static void propose(const struct ts_method *m, struct suffix_cache *sc, const struct ts_seq *h,
                    struct draft_tree *tree)
{
    struct ngram_params np;
    ngram_params_default(&np);
    int32_t chain[DRAFT_TREE_NODES_MAX];
    draft_tree_clear(tree);
    if (m->source == TS_NONE)
        return;
    if (!m->tree) {
        const int k = m->source == TS_SUFFIX ? suffix_cache_draft(sc, h->ids, h->n, m->size, chain, NULL)
                                             : ngram_draft(&np, h->ids, h->n, m->size, chain);
        draft_tree_add_chain(tree, chain, k, 1, m->size);
        return;
    }
    if (m->source == TS_NGRAM) {
        ngram_draft_tree(&np, h->ids, h->n, m->depth, m->size, 2, tree);
        return;
    }
    suffix_cache_draft_tree(sc, h->ids, h->n, m->depth, m->size, tree, NULL);
    if (m->source == TS_MIXED) {
        const int k = ngram_draft(&np, h->ids, h->n, m->depth, chain);
        draft_tree_add_chain(tree, chain, k, 1, m->size);
    }
}

/* A chain verified as a chain: [last, d...] in one forward, the longest
 * prefix the target agrees with kept. */
static int verify_chain(struct llama_ctx *ctx, int32_t last, const struct draft_tree *d, int32_t *out,
                        int *n_out, char *err)
{
    int32_t tokens[LLAMA_TREE_MAX], picks[LLAMA_TREE_MAX];
    const int k = d->n;
    tokens[0] = last;
    memcpy(tokens + 1, d->tokens, (size_t)k * sizeof(int32_t));
    const int len = llama_ctx_slot_len(ctx, 0);
    const struct llama_seq_batch b = {.slot = 0, .tokens = tokens, .n_tokens = k + 1,
                                      .n_logits = k + 1, .argmax_out = picks};
    int rc = llama_forward(ctx, &b, 1, err);
    if (rc)
        return rc;
    int m = 0;
    while (m < k && d->tokens[m] == picks[m])
        m++;
    memcpy(out, d->tokens, (size_t)m * sizeof(int32_t));
    out[m] = picks[m];
    *n_out = m + 1;
    return llama_ctx_truncate(ctx, 0, len + m + 1, err);
}

/* What every method's run shares. */
struct ts_bench {
    struct llama_ctx *ctx;
    const struct tokenizer *tk;
    int turns, gen;
};

/* One turn of method m: prefill conv (untimed), decode b->gen tokens into
 * conv. */
static int run_turn(const struct ts_bench *b, const struct ts_method *m, struct suffix_cache *sc,
                    struct ts_seq *conv, struct ts_run *r, char *err)
{
    struct llama_ctx *ctx = b->ctx;
    const int gen = b->gen;
    int32_t first;
    int rc = llama_ctx_truncate(ctx, 0, 0, err);
    /* the conversation so far from the prefix cache, as the server serves a
     * follow-up (prefill is not what is measured) */
    const int mapped = rc ? 0 : llama_ctx_prefix_map(ctx, 0, conv->ids, conv->n, conv->n - 1);
    const struct llama_seq_batch pre = {.slot = 0, .tokens = conv->ids + mapped,
                                        .n_tokens = conv->n - mapped, .n_logits = 1,
                                        .argmax_out = &first};
    if (rc || (rc = llama_forward(ctx, &pre, 1, err)) || (rc = seq_push(conv, &first, 1)))
        return rc;
    int made = 1;
    const double t0 = now_s();
    while (made < gen) {
        struct draft_tree d;
        propose(m, sc, conv, &d);
        int32_t out[LLAMA_TREE_MAX];
        int n_out = 0;
        const int32_t last = conv->ids[conv->n - 1];
        if (!m->tree) {
            rc = verify_chain(ctx, last, &d, out, &n_out, err);
        } else {
            const struct specdec_tree t = {.last = last, .tokens = d.tokens, .parents = d.parents,
                                           .n = d.n};
            rc = specdec_tree_verify_greedy(ctx, 0, &t, out, &n_out, err);
        }
        if (rc)
            return rc;
        if (n_out > gen - made)
            n_out = gen - made; /* the same gen tokens for every method */
        if ((rc = seq_push(conv, out, n_out)))
            return rc;
        made += n_out;
        r->rounds++;
        r->rows += d.n + 1;
    }
    r->decode_s += now_s() - t0;
    r->tokens += gen - 1;
    return 0;
}

/* Every turn of method m from an empty conversation and cache; the output
 * tokens (all turns') into *outputs. */
static int run_method(const struct ts_bench *b, const struct ts_method *m, struct ts_run *r,
                      struct ts_seq *outputs, char *err)
{
    struct suffix_cache *sc = NULL;
    struct ts_seq conv = {0};
    int rc = suffix_cache_create(&sc, (size_t)16 << 20, err);
    memset(r, 0, sizeof *r);
    outputs->n = 0;
    for (int t = 0; rc == 0 && t < b->turns; t++) {
        if ((rc = turn_prompt(&conv, b->tk, t, err)))
            break;
        const int start = conv.n;
        if ((rc = run_turn(b, m, sc, &conv, r, err)) ||
            (rc = seq_push(outputs, conv.ids + start, conv.n - start)) ||
            (rc = suffix_cache_add(sc, conv.ids, conv.n)))
            break;
        if ((rc = seq_text(&conv, b->tk, "<|eot_id|>", err)))
            break;
    }
    if (rc == ERR_NOMEM)
        error_set(err, rc, "out of memory");
    suffix_cache_destroy(sc);
    free(conv.ids);
    return rc;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    const char *model_dir = "models/trained/target";
    int turns = 6, gen = 96, reps = 3, threads = 0, show = 0;
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc) {
            fprintf(stderr, "usage: tandem-bench-tree-sources [--model DIR] [--turns N] [--gen N]"
                            " [--reps N] [--threads N] [--show 0|1]\n");
            return 2;
        }
        const char *k = argv[i], *v = argv[++i];
        if (!strcmp(k, "--model")) model_dir = v;
        else if (!strcmp(k, "--turns")) turns = atoi(v);
        else if (!strcmp(k, "--gen")) gen = atoi(v);
        else if (!strcmp(k, "--reps")) reps = atoi(v);
        else if (!strcmp(k, "--threads")) threads = atoi(v);
        else if (!strcmp(k, "--show")) show = atoi(v);
        else {
            fprintf(stderr, "tandem-bench-tree-sources: unknown option %s\n", k);
            return 2;
        }
    }
    if (turns < 1 || turns > 12 || gen < 2 || gen > 512 || reps < 1 || reps > TS_REPS_MAX)
        return die("options", "--turns in 1..12, --gen in 2..512, --reps in 1..15");
    char err[ERR_MSG_MAX] = "";
    struct kern_backend *be = NULL;
    struct llama_model *model = NULL;
    struct llama_ctx *ctx = NULL;
    struct tokenizer *tk = NULL;
    if (kern_cpu_create(&be, threads, err))
        return die("kern_cpu_create", err);
    if (llama_model_load(&model, model_dir, be, err))
        return die("llama_model_load", err);
    if (tokenizer_load(&tk, model_dir, err))
        return die("tokenizer_load", err);
    /* greedy verification reads argmax rows, as the target worker's does */
    if (llama_model_prepare_argmax(model, false, err))
        return die("llama_model_prepare_argmax", err);
    const struct llama_ctx_params cp = {.n_slots = 1, .max_seq_len = turns * (900 + gen) + 64,
                                        .prefix_cache = true};
    if (llama_ctx_create(&ctx, model, &cp, err) || llama_ctx_warm_up(ctx, err))
        return die("llama_ctx_create", err);
    if (!llama_ctx_has_argmax(ctx))
        return die("backend", "no argmax rows (matmul_argmax)");
    const struct ts_bench bench = {.ctx = ctx, .tk = tk, .turns = turns, .gen = gen};
    static struct ts_run runs[TS_N_METHODS][TS_REPS_MAX];
    struct ts_seq want = {0}, got = {0};
    for (int rep = 0; rep < reps; rep++)
        for (int mi = 0; mi < TS_N_METHODS; mi++) {
            struct ts_seq *dst = mi == 0 && rep == 0 ? &want : &got;
            if (run_method(&bench, &ts_methods[mi], &runs[mi][rep], dst, err))
                return die(ts_methods[mi].name, err);
            if (dst == &got && (got.n != want.n ||
                                memcmp(got.ids, want.ids, (size_t)got.n * sizeof(int32_t)) != 0)) {
                fprintf(stderr, "tandem-bench-tree-sources: %s: output differs from target-only\n",
                        ts_methods[mi].name);
                return 1;
            }
        }
    if (show) {
        char *text = NULL;
        size_t len = 0;
        if (tokenizer_decode(tk, want.ids, (size_t)want.n, 0, &text, &len, err))
            return die("tokenizer_decode", err);
        printf("# the answers, all turns:\n%.*s\n", (int)len, text);
        free(text);
    }
    printf("# %s, %d threads, %d turns of %d tokens, medians of %d; every output == target-only\n",
           model_dir, kern_cpu_threads(be), turns, gen, reps);
    printf("%-16s %10s %12s %11s %10s %8s\n", "method", "decode ms", "tokens/round", "rows/round",
           "tokens/s", "speedup");
    double base = 0;
    for (int mi = 0; mi < TS_N_METHODS; mi++) {
        double t[TS_REPS_MAX];
        for (int rep = 0; rep < reps; rep++)
            t[rep] = runs[mi][rep].decode_s;
        qsort(t, (size_t)reps, sizeof *t, cmp_double);
        const double med = reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]);
        const struct ts_run *r = &runs[mi][0];
        if (mi == 0)
            base = med;
        printf("%-16s %10.1f %12.2f %11.2f %10.1f %8.2f\n", ts_methods[mi].name, 1e3 * med,
               (double)r->tokens / (double)r->rounds, (double)r->rows / (double)r->rounds,
               (double)r->tokens / med, base / med);
    }
    free(want.ids);
    free(got.ids);
    tokenizer_destroy(tk);
    llama_ctx_destroy(ctx);
    llama_model_destroy(model);
    be->ops->destroy(be);
    return 0;
}
