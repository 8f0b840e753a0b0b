/* bench.h: what tandem-bench's files share (main.c: the command line, the
 * CPU runtime, batch and spec benchmarks; runtime_cuda.c: the runtime
 * benchmark on a GPU). */
#ifndef TANDEM_TOOLS_BENCH_H
#define TANDEM_TOOLS_BENCH_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels.h"
#include "llama.h"
#include "quantize.h"
#include "sampling.h"
#include "local_generate.h"

struct bench_opts {
    const char *models_dir;
    int threads, tokens;
    char presets[256];
    char noise[128];
    char ks[64]; /* K values to run; 0 = adaptive */
    int modes;   /* also compare the sampled and point-mass draft modes */
    int profile; /* runtime: also print where a decode token's time goes, per op */
    int prefix;  /* runtime: tokens already in the sequence the verification rows extend */
    int prompt;  /* spec: tokens of each request's prompt */
    const char *pair; /* spec: "small", "1b" (the Llama-1B shape, 2-layer draft), "trained" */
    const char *trained_dir; /* spec --pair trained: holds target/ and draft/ (models/trained) */
    const char *model, *text; /* ppl: the model directory and the text file */
    int context;              /* ppl: tokens per window (256, the trained context) */
    int repeats;      /* spec: turns of target-only and every K, alternating */
    int full_head;    /* spec: every K also with the draft reading its whole LM head */
    const char *backend, *device; /* "cpu" (default) or "cuda"; device: ordinal or UUID */
    enum quantize_mode quantize, draft_quantize; /* runtime and spec targets; spec drafts */
};
struct bench_model {
    struct llama_model *model;
    struct llama_ctx *ctx;
};
/* Monotonic seconds. */
double now_s(void);
/* Prints "tandem-bench: what: err" and returns 1. */
int die(const char *what, const char *err);
/* The model of preset at dir, generated (deterministically) when missing;
 * with from_dir, derived from it at noise. 0 or 1 (printed). */
int ensure_model(const char *dir, const char *preset, uint64_t seed, const char *from_dir,
                 double noise);
/* The model at dir with one sequence of up to max_seq_len tokens, its
 * projections quantized as quant says; no_graphs as llama_ctx_params. */
int load(struct bench_model *m, const char *dir, struct kern_backend *be, int max_seq_len,
         enum quantize_mode quant);
void unload(struct bench_model *m);
/* Fixed prompts (ids) for a run of requests; owned, freed by bench_prompts_free. */
enum { BENCH_PROMPTS_MAX = 6 };
struct bench_prompts {
    int n;
    int32_t *ids[BENCH_PROMPTS_MAX];
    int len[BENCH_PROMPTS_MAX];
};
/* A pair as the server runs it, in this process (coordinator/local.h):
 * the target, and the draft (NULL: none). */
struct bench_pipeline {
    struct bench_model *target, *draft;
    const char *sampler;   /* the workers' sampler: "host" or "device" */
    bool whole_heads;      /* argmax_copy off: greedy rows read their whole LM head */
};
/* A run of requests: n_prompts of prompt_len synthetic ids, or (prompts
 * non-NULL) those prompts; max_tokens each to the end (EOS ignored). */
struct bench_requests {
    int n_prompts, prompt_len, max_tokens;
    const struct bench_prompts *prompts;
    int k;                          /* < 0: target-only; 0: adaptive; else fixed K of model drafts */
    struct sampling_params sp;      /* the seed is the prompt's number from 1 */
    enum speculate_mode mode;
};
/* Runs rq through a fresh pipeline over p (a new pair history, as a server
 * just started): the summed figures and decode tokens/s. 0 or 1 (printed). */
int run_requests(const struct bench_pipeline *p, const struct bench_requests *rq, struct local_stats *sum,
                 double *tps);
/* The first n (1..BENCH_PROMPTS_MAX) of trained.c's chat questions, rendered
 * with the chat template of the tokenizer in model_dir. 0 or 1 (printed). */
int bench_prompts_chat(struct bench_prompts *p, const char *model_dir, int n);
void bench_prompts_free(struct bench_prompts *p);
/* tandem-bench ppl (trained.c): perplexity of o->model on o->text. */
int bench_ppl(const struct bench_opts *o, struct kern_backend *be);
/* ms per forward call of `rows` rows extending slot 0's `prefix` tokens,
 * over `calls` calls (the rows' logits to logits_host, logits_dev or only
 * their argmax to argmax_out). */
int time_rows(struct bench_model *m, float *logits_host, float *logits_dev, int32_t *argmax_out,
              int prefix, int rows, int calls, double *ms_out);
/* The runtime benchmark on a GPU (runtime_cuda.c). */
int bench_runtime_cuda(const struct bench_opts *o, struct kern_backend *be);

#endif
