/* trees.c: tandem-bench-trees, what verifying a token tree costs the target
 * on the CPU (docs/perf/cpu-token-trees.md):
 *
 *   tandem-bench-trees [--model DIR | --models DIR] [--threads N] [--context N]
 *       [--nodes 4,8,16,32] [--reps N] [--argmax 0|1]
 *
 * One target (--model, else the `small` preset generated into --models,
 * default ./bench-models/small), a sequence of --context tokens (256), and
 * for each size n: one forward of 1 row, of a chain of n rows and of a
 * random tree of n nodes (seeded; depth about log n), every row asking for
 * its argmax as a greedy verification does (--argmax 0: whole logits),
 * each undone after it ran; the three interleaved --reps times (31) and
 * the medians printed (and the ratio of the fastest tree to the fastest
 * chain), with the cost of llama_ctx_tree_accept moving the deepest path. This machine is noisy: compare within a line, not across
 * runs.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "error.h"
#include "kernels.h"
#include "llama.h"
#include "modelgen.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int fail(const char *what, const char *err)
{
    fprintf(stderr, "tandem-bench-trees: %s: %s\n", what, err);
    return 1;
}

/* A random tree of n nodes whose node i hangs under one of the nodes
 * (i - 1) / 2 .. i - 1, or the root: bushy near the root, depth ~ log n. */
static void bench_tree(int32_t *parents, int n, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        const int lo = (i - 1) / 2;
        parents[i] = i == 0 ? -1 : lo + (int)((x >> 33) % (uint64_t)(i - lo));
    }
}

static int depth_of(const int32_t *parents, int i, int32_t *path)
{
    int32_t up[LLAMA_TREE_MAX];
    int d = 0;
    for (int32_t v = i; v >= 0; v = parents[v])
        up[d++] = v;
    for (int j = 0; j < d; j++)
        path[j] = up[d - 1 - j];
    return d;
}

struct trees_opts {
    const char *model_dir, *models;
    int threads, context, reps, argmax;
    char nodes_list[128];
};

/* 0, or 2 (the usage error's exit code) with the reason on stderr. */
static int parse_opts(int argc, char **argv, struct trees_opts *o)
{
    *o = (struct trees_opts){.models = "bench-models", .context = 256, .reps = 31, .argmax = 1};
    snprintf(o->nodes_list, sizeof o->nodes_list, "4,8,16,32");
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc) {
            fprintf(stderr, "usage: tandem-bench-trees [--model DIR | --models DIR] [--threads N]"
                            " [--context N] [--nodes 4,8,16,32] [--reps N] [--argmax 0|1]\n");
            return 2;
        }
        const char *k = argv[i], *v = argv[++i];
        if (!strcmp(k, "--model")) o->model_dir = v;
        else if (!strcmp(k, "--models")) o->models = v;
        else if (!strcmp(k, "--threads")) o->threads = atoi(v);
        else if (!strcmp(k, "--context")) o->context = atoi(v);
        else if (!strcmp(k, "--reps")) o->reps = atoi(v);
        else if (!strcmp(k, "--argmax")) o->argmax = atoi(v);
        else if (!strcmp(k, "--nodes")) snprintf(o->nodes_list, sizeof o->nodes_list, "%s", v);
        else {
            fprintf(stderr, "tandem-bench-trees: unknown option %s\n", k);
            return 2;
        }
    }
    return 0;
}

/* One context holding the --context prompt, and what the timed calls read
 * and write: their ids, outputs and each rep's times. */
struct trees_bench {
    struct llama_ctx *ctx;
    int context, reps, argmax;
    int32_t ids[LLAMA_TREE_MAX], picks[LLAMA_TREE_MAX];
    float *logits;              /* [LLAMA_TREE_MAX, vocab] */
    double *t1, *tc, *tt, *ta;  /* [reps]: 1 row, chain, tree ms; tree accept us */
};

/* One line of the table: a tree of n nodes against a chain of n rows and
 * against one row, interleaved reps times; each call undone after it ran. */
static int bench_nodes(struct trees_bench *tb, int n)
{
    char err[ERR_MSG_MAX] = "";
    int32_t parents[LLAMA_TREE_MAX], path[LLAMA_TREE_MAX];
    bench_tree(parents, n, 42 + (uint64_t)n);
    int deepest = 0, d_max = 0;
    for (int i = 0; i < n; i++) {
        const int d = depth_of(parents, i, path);
        if (d > d_max)
            d_max = d, deepest = i;
    }
    depth_of(parents, deepest, path);
    for (int r = 0; r < tb->reps; r++) {
        struct llama_seq_batch b[3] = {
            {.slot = 0, .tokens = tb->ids, .n_tokens = 1, .n_logits = 1},
            {.slot = 0, .tokens = tb->ids, .n_tokens = n, .n_logits = n},
            {.slot = 0, .tokens = tb->ids, .n_tokens = n, .n_logits = n, .parents = parents},
        };
        double *dst[3] = {tb->t1, tb->tc, tb->tt};
        for (int k = 0; k < 3; k++) {
            if (tb->argmax)
                b[k].argmax_out = tb->picks;
            else
                b[k].logits_out = tb->logits;
            const double t0 = now_s();
            if (llama_forward(tb->ctx, &b[k], 1, err))
                return fail("forward", err);
            dst[k][r] = 1e3 * (now_s() - t0);
            if (k == 2) {
                const double a0 = now_s();
                if (llama_ctx_tree_accept(tb->ctx, 0, path, d_max, err))
                    return fail("tree accept", err);
                tb->ta[r] = 1e6 * (now_s() - a0);
            }
            if (llama_ctx_truncate(tb->ctx, 0, tb->context, err))
                return fail("truncate", err);
        }
    }
    /* median sorts: the minimum is then element 0 */
    const int reps = tb->reps;
    const double m1 = median(tb->t1, reps), mc = median(tb->tc, reps), mt = median(tb->tt, reps);
    printf("%5d %6d %10.3f %10.3f %10.3f %11.2f %11.2f %15.2f %10.1f\n", n, d_max, m1, mc,
           mt, mc / m1, mt / mc, tb->tt[0] / tb->tc[0], median(tb->ta, reps));
    return 0;
}

int main(int argc, char **argv)
{
    struct trees_opts o;
    if (parse_opts(argc, argv, &o))
        return 2;
    const char *model_dir = o.model_dir;
    const int context = o.context, reps = o.reps, argmax = o.argmax;
    if (reps < 1 || reps > 1000 || context < 1 || context > 4096)
        return fail("options", "--reps must be in 1..1000, --context in 1..4096");
    char err[ERR_MSG_MAX] = "", dir[512];
    if (!model_dir) {
        snprintf(dir, sizeof dir, "%s/small", o.models);
        struct stat sb;
        if (stat(dir, &sb) != 0) {
            struct modelgen_params p = {.preset = "small", .seed = 1, .force = 1};
            if (modelgen_write(dir, &p, err))
                return fail("modelgen_write", err);
        }
        model_dir = dir;
    }
    struct kern_backend *be = NULL;
    struct llama_model *model = NULL;
    struct llama_ctx *ctx = NULL;
    if (kern_cpu_create(&be, o.threads, err))
        return fail("kern_cpu_create", err);
    if (llama_model_load(&model, model_dir, be, err))
        return fail("llama_model_load", err);
    if (argmax && llama_model_prepare_argmax(model, false, err))
        return fail("llama_model_prepare_argmax", err);
    struct llama_ctx_params cp = {.n_slots = 1, .max_seq_len = context + 2 * LLAMA_TREE_MAX};
    if (llama_ctx_create(&ctx, model, &cp, err) || llama_ctx_warm_up(ctx, err))
        return fail("llama_ctx_create", err);
    const int vocab = llama_model_config(model)->vocab_size;
    struct trees_bench tb = {.ctx = ctx, .context = context, .reps = reps, .argmax = argmax};
    int32_t *prompt = malloc((size_t)context * sizeof(int32_t));
    tb.logits = malloc((size_t)LLAMA_TREE_MAX * (size_t)vocab * sizeof(float));
    for (int i = 0; i < context; i++)
        prompt[i] = (int32_t)((13 + 7919 * (long)i) % vocab);
    for (int i = 0; i < LLAMA_TREE_MAX; i++)
        tb.ids[i] = (int32_t)((101 + 104729 * (long)i) % vocab);
    const struct llama_seq_batch pre = {.slot = 0, .tokens = prompt, .n_tokens = context};
    if (llama_forward(ctx, &pre, 1, err))
        return fail("prefill", err);
    printf("# %s, %d threads, context %d, %s, medians of %d\n", model_dir, kern_cpu_threads(be),
           context, argmax ? "argmax rows" : "logits rows", reps);
    printf("%5s %6s %10s %10s %10s %11s %11s %15s %10s\n", "nodes", "depth", "1 row ms",
           "chain ms", "tree ms", "chain/1row", "tree/chain", "tree/chain min", "accept us");
    tb.t1 = malloc((size_t)reps * sizeof(double)), tb.tc = malloc((size_t)reps * sizeof(double));
    tb.tt = malloc((size_t)reps * sizeof(double)), tb.ta = malloc((size_t)reps * sizeof(double));
    for (char *save = NULL, *tok = strtok_r(o.nodes_list, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        const int n = atoi(tok);
        if (n < 1 || n > LLAMA_TREE_MAX)
            return fail("--nodes", "each in 1..32");
        if (bench_nodes(&tb, n))
            return 1;
    }
    free(tb.t1);
    free(tb.tc);
    free(tb.tt);
    free(tb.ta);
    free(prompt);
    free(tb.logits);
    llama_ctx_destroy(ctx);
    llama_model_destroy(model);
    be->ops->destroy(be);
    return 0;
}
