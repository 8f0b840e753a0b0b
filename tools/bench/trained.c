/* trained.c: what tandem-bench runs on a trained model pair (models/trained):
 * real chat prompts for `spec --pair trained`, and `ppl`, the perplexity of
 * a model on a text, the project's own check of a model card's figure.
 *
 * Perplexity is computed as tools/train/eval_ppl.py computes it: the text
 * (special-token text parsed, no BOS added) is cut into consecutive windows
 * of --context tokens, each window starts from an empty sequence, and every
 * token after a window's first is scored from the ones before it. The mean
 * negative log-likelihood is summed in double over float logits.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "chat_template.h"
#include "error.h"
#include "tokenizer.h"

/* The questions of the trained pair's benchmark: the kinds its chat data
 * holds (verse and sayings, Python), phrased as a user would. */
static const char *const bench_questions[BENCH_PROMPTS_MAX] = {
    "Write a short poem about two bicycles riding in tandem.",
    "Write a Python function named read_config.",
    "Say something wise about time.",
    "Show me the Python code of parse_args.",
    "Give me a quote about love.",
    "How would you write copy_file in Python?",
};

int bench_prompts_chat(struct bench_prompts *p, const char *model_dir, int n)
{
    char err[ERR_MSG_MAX] = "";
    struct tokenizer *tk = NULL;
    memset(p, 0, sizeof *p);
    if (n < 1 || n > BENCH_PROMPTS_MAX)
        return die("prompts", "count must be 1..6");
    if (tokenizer_load(&tk, model_dir, err))
        return die(model_dir, err);
    for (int i = 0; i < n; i++) {
        struct chat_message msg = {.role = "user", .content = bench_questions[i],
                                   .content_len = strlen(bench_questions[i])};
        size_t len = 0;
        if (chat_template_encode(tk, &msg, 1, 1, NULL, &p->ids[i], &len, err)) {
            tokenizer_destroy(tk);
            bench_prompts_free(p);
            return die("chat prompt", err);
        }
        p->len[i] = (int)len;
        p->n = i + 1;
    }
    tokenizer_destroy(tk);
    return 0;
}

void bench_prompts_free(struct bench_prompts *p)
{
    for (int i = 0; i < p->n; i++)
        free(p->ids[i]);
    memset(p, 0, sizeof *p);
}

static int read_file(const char *path, char **buf_out, size_t *len_out)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "tandem-bench: %s: %s\n", path, strerror(errno));
        return 1;
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0)
            break;
        if (len == cap) {
            char *bigger = realloc(buf, cap * 2);
            if (!bigger) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = bigger;
            cap *= 2;
        }
    }
    int bad = !buf || ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        fprintf(stderr, "tandem-bench: %s: read failed or out of memory\n", path);
        return 1;
    }
    *buf_out = buf;
    *len_out = len;
    return 0;
}

/* Sum of -log p(next token) over one window's rows, from its logits. */
static double window_nll(const float *logits, const int32_t *ids, int n, int vocab)
{
    double nll = 0;
    for (int r = 0; r + 1 < n; r++) {
        const float *row = logits + (size_t)r * vocab;
        float mx = row[0];
        for (int v = 1; v < vocab; v++)
            mx = row[v] > mx ? row[v] : mx;
        double sum = 0;
        for (int v = 0; v < vocab; v++)
            sum += exp((double)row[v] - mx);
        nll += log(sum) + mx - row[ids[r + 1]];
    }
    return nll;
}

int bench_ppl(const struct bench_opts *o, struct kern_backend *be)
{
    if (!o->model || !o->text) {
        fprintf(stderr, "tandem-bench ppl: --model DIR and --text FILE are required\n");
        return 2;
    }
    char err[ERR_MSG_MAX] = "";
    struct tokenizer *tk = NULL;
    if (tokenizer_load(&tk, o->model, err))
        return die(o->model, err);
    char *text = NULL;
    size_t text_len = 0;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (read_file(o->text, &text, &text_len)) {
        tokenizer_destroy(tk);
        return 1;
    }
    int rc = tokenizer_encode(tk, text, text_len, TOKENIZER_PARSE_SPECIAL, &ids, &n_ids, err);
    free(text);
    tokenizer_destroy(tk);
    if (rc)
        return die(o->text, err);
    const int ctx_len = o->context;
    struct bench_model m;
    if (n_ids < 2 || load(&m, o->model, be, ctx_len, o->quantize)) {
        if (n_ids < 2)
            fprintf(stderr, "tandem-bench ppl: %s: fewer than 2 tokens\n", o->text);
        free(ids);
        return 1;
    }
    const int vocab = llama_model_config(m.model)->vocab_size;
    float *logits = malloc((size_t)ctx_len * (size_t)vocab * sizeof(float));
    if (!logits) {
        free(ids);
        unload(&m);
        return die("ppl", "out of memory");
    }
    double nll = 0;
    long scored = 0;
    for (size_t at = 0; at + 1 < n_ids; at += (size_t)ctx_len) {
        const int n = n_ids - at < (size_t)ctx_len ? (int)(n_ids - at) : ctx_len;
        if (n < 2)
            break;
        struct llama_seq_batch b = {.slot = 0, .tokens = ids + at, .n_tokens = n, .n_logits = n,
                                    .logits_out = logits};
        if (llama_forward(m.ctx, &b, 1, err) || llama_ctx_truncate(m.ctx, 0, 0, err)) {
            free(logits);
            free(ids);
            unload(&m);
            return die("ppl forward", err);
        }
        nll += window_nll(logits, ids + at, n, vocab);
        scored += n - 1;
    }
    printf("{\"model\": \"%s\", \"text\": \"%s\", \"tokens\": %zu, \"scored\": %ld, "
           "\"context\": %d, \"nll\": %.6f, \"ppl\": %.4f}\n",
           o->model, o->text, n_ids, scored, ctx_len, nll / (double)scored,
           exp(nll / (double)scored));
    free(logits);
    free(ids);
    unload(&m);
    return 0;
}
