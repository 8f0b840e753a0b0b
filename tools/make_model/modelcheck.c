/* modelcheck.c: tandem-model-check, measures what the generator's models do
 * when run: how peaked their next-token distributions are, and how often a
 * derived target agrees with its draft under greedy decoding.
 *
 *   tandem-model-check --draft DIR [--target DIR] [--prompts N] [--len L]
 *                      [--seed S] [--threads N]
 *
 * Prompts are L token ids drawn uniformly (seeded) from the vocabulary minus
 * its last 16 ids (the special tokens of the tiny and Llama 3 vocabularies),
 * after bos when the config has one. For each model it prints the top-1
 * probability at the last prompt position (median, quartiles, share inside
 * [0.05, 0.9]); with --target, the first-token greedy agreement (argmax at the
 * last prompt position equal) and the agreement over every prompt position.
 * A measuring tool, not a test: it exits 0 whatever the figures are.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "genrand.h"
#include "kernels.h"
#include "llama.h"

struct mc_model {
    struct llama_model *model;
    struct llama_ctx *ctx;
    int vocab;
};

static int mc_open(struct mc_model *m, const char *dir, struct kern_backend *be, int max_len,
                   char *err)
{
    struct llama_ctx_params cp = {.n_slots = 1, .max_seq_len = max_len};
    int rc = llama_model_load(&m->model, dir, be, err);
    if (rc)
        return rc;
    m->vocab = llama_model_config(m->model)->vocab_size;
    return llama_ctx_create(&m->ctx, m->model, &cp, err);
}

static void mc_close(struct mc_model *m)
{
    llama_ctx_destroy(m->ctx);
    llama_model_destroy(m->model);
}

/* Runs the prompt from an empty slot; logits of every position. */
static int mc_run(struct mc_model *m, const int32_t *toks, int n, float *logits, char *err)
{
    int rc = llama_ctx_truncate(m->ctx, 0, 0, err);
    if (rc)
        return rc;
    struct llama_seq_batch b = {.slot = 0, .tokens = toks, .n_tokens = n, .n_logits = n, .logits_out = logits};
    return llama_forward(m->ctx, &b, 1, err);
}

static int argmax(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

static double top1_prob(const float *x, int n)
{
    float mx = x[argmax(x, n)];
    double sum = 0.0;
    for (int i = 0; i < n; i++)
        sum += exp((double)(x[i] - mx));
    return 1.0 / sum;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void report_top1(const char *label, double *p, int n)
{
    int inside = 0;
    for (int i = 0; i < n; i++)
        inside += p[i] >= 0.05 && p[i] <= 0.9;
    qsort(p, (size_t)n, sizeof *p, cmp_double);
    printf("%s: top-1 probability at the last position over %d prompts: min %.3f, q1 %.3f, "
           "median %.3f, q3 %.3f, max %.3f; %.0f%% in [0.05, 0.9]\n",
           label, n, p[0], p[n / 4], p[n / 2], p[(3 * n) / 4], p[n - 1], 100.0 * inside / n);
}

struct check_opts {
    const char *draft_dir, *target_dir; /* target_dir NULL: the draft alone */
    int n_prompts, len, threads;
    uint64_t seed;
};

/* 0, or 2 (the usage error's exit code) with the reason on stderr. */
static int parse_opts(int argc, char **argv, struct check_opts *o)
{
    *o = (struct check_opts){.n_prompts = 50, .len = 16, .seed = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "tandem-model-check: %s needs a value\n", a);
            return 2;
        }
        if (strcmp(a, "--draft") == 0) o->draft_dir = v;
        else if (strcmp(a, "--target") == 0) o->target_dir = v;
        else if (strcmp(a, "--prompts") == 0) o->n_prompts = atoi(v);
        else if (strcmp(a, "--len") == 0) o->len = atoi(v);
        else if (strcmp(a, "--seed") == 0) o->seed = strtoull(v, NULL, 0);
        else if (strcmp(a, "--threads") == 0) o->threads = atoi(v);
        else {
            fprintf(stderr, "usage: tandem-model-check --draft DIR [--target DIR] [--prompts N] "
                            "[--len L] [--seed S] [--threads N]\n");
            return 2;
        }
        i++;
    }
    if (!o->draft_dir || o->n_prompts < 1 || o->len < 1 || o->len > 4096) {
        fprintf(stderr, "tandem-model-check: --draft DIR is required; --prompts >= 1; "
                        "--len in 1..4096\n");
        return 2;
    }
    return 0;
}

/* The models (t NULL without --target), the buffers of one prompt's run
 * and the figures gathered over the prompts. */
struct check_run {
    struct mc_model *d, *t;
    float *ld, *lt;   /* [len + 1, vocab]: each model's logits of a prompt */
    double *pd, *pt;  /* [n_prompts]: top-1 probability at the last position */
    int32_t *toks;    /* [len + 1] */
    int agree_first, agree_all, n_all;
};

/* Runs every prompt through the draft and the target and gathers the
 * figures the report prints. */
static int check_prompts(const struct check_opts *o, struct check_run *r, char *err)
{
    const int vocab = r->d->vocab, n_tok = o->len + 1;
    const int bos = llama_model_config(r->d->model)->bos_token_id;
    const int pool = vocab > 32 ? vocab - 16 : vocab;
    uint64_t key = genrand_key(o->seed, "model-check prompts");
    for (int p = 0; p < o->n_prompts; p++) {
        int n = 0;
        if (bos >= 0)
            r->toks[n++] = bos;
        for (; n < n_tok; n++)
            r->toks[n] = (int32_t)(genrand_mix64(key + (uint64_t)p * 4096 + (uint64_t)n) %
                                   (uint64_t)pool);
        int rc = mc_run(r->d, r->toks, n, r->ld, err);
        if (!rc && r->t)
            rc = mc_run(r->t, r->toks, n, r->lt, err);
        if (rc)
            return rc;
        const float *dl = r->ld + (size_t)(n - 1) * (size_t)vocab;
        r->pd[p] = top1_prob(dl, vocab);
        if (r->t) {
            const float *tl = r->lt + (size_t)(n - 1) * (size_t)vocab;
            r->pt[p] = top1_prob(tl, vocab);
            r->agree_first += argmax(dl, vocab) == argmax(tl, vocab);
            for (int i = 0; i < n; i++, r->n_all++)
                r->agree_all += argmax(r->ld + (size_t)i * (size_t)vocab, vocab) ==
                                argmax(r->lt + (size_t)i * (size_t)vocab, vocab);
        }
    }
    return 0;
}

static void check_report(const struct check_opts *o, struct check_run *r)
{
    report_top1("draft ", r->pd, o->n_prompts);
    if (r->t) {
        report_top1("target", r->pt, o->n_prompts);
        printf("greedy agreement: first token %d/%d = %.1f%%; every prompt position %d/%d = "
               "%.1f%%\n",
               r->agree_first, o->n_prompts, 100.0 * r->agree_first / o->n_prompts, r->agree_all,
               r->n_all, 100.0 * r->agree_all / r->n_all);
    }
}

int main(int argc, char **argv)
{
    struct check_opts o;
    if (parse_opts(argc, argv, &o))
        return 2;
    char err[ERR_MSG_MAX];
    struct kern_backend *be = NULL;
    struct mc_model d = {0}, t = {0};
    struct check_run r = {.d = &d, .t = o.target_dir ? &t : NULL};
    const int len = o.len;
    int rc = kern_cpu_create(&be, o.threads, err);
    if (!rc)
        rc = mc_open(&d, o.draft_dir, be, len + 1, err);
    if (!rc && o.target_dir)
        rc = mc_open(&t, o.target_dir, be, len + 1, err);
    if (!rc && o.target_dir && t.vocab != d.vocab)
        rc = error_set(err, ERR_MISMATCH, "vocab %d vs %d", d.vocab, t.vocab);
    if (rc) {
        fprintf(stderr, "tandem-model-check: %s\n", err);
        goto done;
    }
    const int vocab = d.vocab, n_tok = len + 1;
    r.ld = malloc((size_t)n_tok * (size_t)vocab * sizeof *r.ld);
    r.lt = malloc((size_t)n_tok * (size_t)vocab * sizeof *r.lt);
    r.pd = malloc((size_t)o.n_prompts * sizeof *r.pd);
    r.pt = malloc((size_t)o.n_prompts * sizeof *r.pt);
    r.toks = malloc((size_t)n_tok * sizeof *r.toks);
    if (!r.ld || !r.lt || !r.pd || !r.pt || !r.toks) {
        fprintf(stderr, "tandem-model-check: out of memory\n");
        rc = ERR_NOMEM;
        goto done;
    }
    if ((rc = check_prompts(&o, &r, err))) {
        fprintf(stderr, "tandem-model-check: %s\n", err);
        goto done;
    }
    check_report(&o, &r);
done:
    free(r.ld);
    free(r.lt);
    free(r.pd);
    free(r.pt);
    free(r.toks);
    if (o.target_dir)
        mc_close(&t);
    mc_close(&d);
    if (be)
        be->ops->destroy(be);
    return rc ? 1 : 0;
}
