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
 * greedily. Every turn is a request to the server's own scheduler and
 * target role in this process (coordinator/local.h): its prompt comes from
 * the prefix cache (prefill is not timed), and once answered the
 * coordinator adds it to its suffix cache, as a server does. Each method
 * (a fresh pipeline, so a fresh suffix cache) decodes every turn:
 * target-only, chains of K and trees of a node budget (the request's
 * spec_k and spec_tree) from the suffix cache, from n-grams of the request
 * itself, and from "auto". Greedy: every method's output must equal
 * target-only's (checked: exit 1 if not). Methods alternate within each of
 * --reps repetitions; medians of the decode time (drafting included) are
 * printed with tokens per round, rows verified per round and the share of
 * rounds that went as trees; --show 1 prints the answers first.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "kernels.h"
#include "llama.h"
#include "local_generate.h"
#include "logging.h"
#include "tokenizer.h"

#define TS_METHODS_MAX 16
#define TS_REPS_MAX 15

struct ts_method {
    const char *name;
    const char *draft; /* the request's "draft" */
    int spec_k;        /* a chain's K; a tree's depth cap */
    int spec_tree;     /* 0: a chain ("off"); else the node budget, the root counted */
};

static const struct ts_method ts_methods[] = {
    {"target-only", "none", 0, 0},
    {"suffix chain 4", "suffix", 4, 0},
    {"suffix chain 8", "suffix", 8, 0},
    {"suffix chain 16", "suffix", 16, 0},
    {"suffix tree 8", "suffix", 8, 8},
    {"suffix tree 16", "suffix", 12, 16},
    {"suffix tree 32", "suffix", 16, 32},
    {"ngram chain 4", "ngram", 4, 0},
    {"ngram chain 8", "ngram", 8, 0},
    {"ngram tree 8", "ngram", 6, 8},
    {"ngram tree 16", "ngram", 8, 16},
    {"auto tree 16", "auto", 12, 16},
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
    long rounds, tokens, rows, tree_rounds;
};

/* What every method's run shares. */
struct ts_bench {
    const char *model_dir;
    struct llama_ctx *ctx;
    struct kern_backend *be;
    struct llama_model *model;
    const struct tokenizer *tk;
    int turns, gen;
};

/* One turn of method m through the pipeline: conv's answer appended to it. */
static int run_turn(const struct ts_bench *b, const struct ts_method *m, struct local *l, struct ts_seq *conv,
                    struct ts_run *r, char *err)
{
    int32_t *out = malloc((size_t)b->gen * sizeof *out);
    if (!out)
        return error_set(err, ERR_NOMEM, "out of memory");
    struct local_gen_request rq = {.prompt = conv->ids, .n_prompt = conv->n, .max_tokens = b->gen,
                                   .spec_k = m->spec_k, .draft = m->draft, .ignore_eos = true,
                                   .spec_tree = m->spec_tree ? m->spec_tree : -1};
    sampling_params_default(&rq.sampling);
    struct local_gen_result res = {.ids = out, .cap = b->gen};
    int rc = local_generate(l, &rq, &res, err);
    if (!rc && res.n != b->gen)
        rc = error_set(err, ERR_INTERNAL, "%d tokens answered, %d asked", res.n, b->gen);
    if (!rc)
        rc = seq_push(conv, out, res.n);
    free(out);
    if (rc)
        return rc;
    r->decode_s += res.st.decode_ms / 1e3;
    r->tokens += res.st.generated_tokens - 1;
    r->rounds += res.st.rounds;
    r->rows += res.st.rounds + res.st.drafted;
    r->tree_rounds += res.st.tree_rounds;
    return 0;
}

/* The server's scheduler and its target role over b's model, in process,
 * with an empty suffix cache (target only: no draft model). */
static int pipeline_create(const struct ts_bench *b, struct local **out, char *err)
{
    struct proc_config cfg;
    proc_config_defaults(&cfg);
    cfg.coordinator.max_concurrency = 1;
    cfg.coordinator.spec_k_max = 16;
    snprintf(cfg.coordinator.tokenizer, sizeof cfg.coordinator.tokenizer, "%s", b->model_dir);
    struct worker_main_model tm;
    worker_main_model_borrow(&tm, b->be, b->model, b->ctx);
    const struct local_params p = {.cfg = &cfg, .target = &tm};
    return local_create(out, &p, err);
}

/* Every turn of method m from an empty conversation and cache; the output
 * tokens (all turns') into *outputs. */
static int run_method(const struct ts_bench *b, const struct ts_method *m, struct ts_run *r,
                      struct ts_seq *outputs, char *err)
{
    struct local *l = NULL;
    struct ts_seq conv = {0};
    int rc = pipeline_create(b, &l, err);
    memset(r, 0, sizeof *r);
    outputs->n = 0;
    for (int t = 0; rc == 0 && t < b->turns; t++) {
        if ((rc = turn_prompt(&conv, b->tk, t, err)))
            break;
        const int start = conv.n;
        if ((rc = run_turn(b, m, l, &conv, r, err)) || (rc = seq_push(outputs, conv.ids + start, conv.n - start)))
            break;
        if ((rc = seq_text(&conv, b->tk, "<|eot_id|>", err)))
            break;
    }
    if (rc == ERR_NOMEM)
        error_set(err, rc, "out of memory");
    local_destroy(l);
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
    const struct llama_ctx_params cp = {.n_slots = 1, .max_seq_len = turns * (900 + gen) + 64,
                                        .prefix_cache = true};
    if (llama_ctx_create(&ctx, model, &cp, err) || llama_ctx_warm_up(ctx, err))
        return die("llama_ctx_create", err);
    /* the roles' and the scheduler's lines are a server operator's */
    logging_set_level(LOGGING_WARN);
    const struct ts_bench bench = {.model_dir = model_dir, .ctx = ctx, .be = be, .model = model, .tk = tk, .turns = turns, .gen = gen};
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
    printf("%-16s %10s %12s %11s %11s %10s %8s\n", "method", "decode ms", "tokens/round", "rows/round",
           "tree share", "tokens/s", "speedup");
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
        printf("%-16s %10.1f %12.2f %11.2f %11.2f %10.1f %8.2f\n", ts_methods[mi].name, 1e3 * med,
               (double)r->tokens / (double)r->rounds, (double)r->rows / (double)r->rounds,
               (double)r->tree_rounds / (double)r->rounds, (double)r->tokens / med, base / med);
    }
    free(want.ids);
    free(got.ids);
    tokenizer_destroy(tk);
    llama_ctx_destroy(ctx);
    llama_model_destroy(model);
    be->ops->destroy(be);
    return 0;
}
