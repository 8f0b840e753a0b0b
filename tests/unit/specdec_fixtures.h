/* specdec_fixtures.h: shared helpers for the speculative-decoding tests:
 * model pairs written by the model generator into temporary directories,
 * loaded on the CPU backend, and generation with or without a draft. */
#ifndef TANDEM_TESTS_SPECDEC_FIXTURES_H
#define TANDEM_TESTS_SPECDEC_FIXTURES_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "kernels.h"
#include "llama.h"
#include "modelgen.h"
#include "sampling.h"
#include "local_generate.h"
#include "logging.h"
#include "proc_config.h"
#include "specdec.h"
#include "worker_main.h"

struct loaded_model {
    struct llama_model *model;
    struct llama_ctx *ctx;
};

static inline void fixture_check(int rc, const char *what, const char *err)
{
    if (rc)
        fprintf(stderr, "%s failed (%d): %s\n", what, rc, err);
    assert_int_equal(rc, 0);
}

static inline void fixture_tmpdir(char *dir, size_t size)
{
    snprintf(dir, size, "/tmp/tandem-test-specdec-XXXXXX");
    assert_non_null(mkdtemp(dir));
}

static inline void fixture_rmdir(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

/* Writes a model of `preset` (or, with from_dir, derives one from it). */
static inline void fixture_make(const char *out_dir, const char *preset, uint64_t seed, int vocab,
                                const char *from_dir, double noise)
{
    char err[ERR_MSG_MAX] = "";
    struct modelgen_params p = {.preset = preset, .seed = seed, .vocab_size_override = vocab,
                                .force = 1};
    int rc = from_dir ? modelgen_derive(out_dir, from_dir, &p, noise, err)
                      : modelgen_write(out_dir, &p, err);
    fixture_check(rc, from_dir ? "modelgen_derive" : "modelgen_write", err);
}

static inline void fixture_load(struct loaded_model *m, const char *dir, struct kern_backend *be,
                                int max_seq_len)
{
    char err[ERR_MSG_MAX] = "";
    fixture_check(llama_model_load(&m->model, dir, be, err), "llama_model_load", err);
    struct llama_ctx_params p = {.n_slots = 1, .max_seq_len = max_seq_len};
    fixture_check(llama_ctx_create(&m->ctx, m->model, &p, err), "llama_ctx_create", err);
}

static inline void fixture_unload(struct loaded_model *m)
{
    llama_ctx_destroy(m->ctx);
    llama_model_destroy(m->model);
}

static inline void fixture_random_ids(int32_t *ids, int n, int vocab_lo, int vocab_hi,
                                      uint64_t seed)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = vocab_lo + (int32_t)((x >> 33) % (uint64_t)(vocab_hi - vocab_lo));
    }
}

/* The server's scheduler and both roles in this process (coordinator/
 * local.h) over target and draft (NULL: none): the one speculation loop
 * every test of it drives. whole_heads: argmax_copy off (greedy rows read
 * the whole LM head); prefill_chunk 0: the default. */
struct fixture_pipeline_opts {
    bool whole_heads;
    int prefill_chunk;
};

static inline struct local *fixture_pipeline(struct loaded_model *draft, struct loaded_model *target,
                                             const struct fixture_pipeline_opts *o)
{
    struct proc_config cfg;
    proc_config_defaults(&cfg);
    cfg.coordinator.max_concurrency = 1;
    cfg.coordinator.spec_k_max = SPECULATE_K_MAX;
    struct worker_config *wc[2] = {&cfg.draft_worker, &cfg.target_worker};
    for (int r = 0; r < 2; r++) {
        wc[r]->argmax_copy = o == NULL || !o->whole_heads;
        if (o && o->prefill_chunk)
            wc[r]->prefill_chunk = o->prefill_chunk;
    }
    struct worker_main_model dm, tm;
    worker_main_model_borrow(&tm, llama_ctx_backend(target->ctx), target->model, target->ctx);
    if (draft)
        worker_main_model_borrow(&dm, llama_ctx_backend(draft->ctx), draft->model, draft->ctx);
    const struct local_params p = {.cfg = &cfg, .target = &tm, .draft = draft ? &dm : NULL};
    char err[ERR_MSG_MAX] = "";
    struct local *l = NULL;
    /* a line per request is a server operator's; the tests print their figures */
    logging_set_level(LOGGING_WARN);
    fixture_check(local_create(&l, &p, err), "local_create", err);
    return l;
}

/* One request through the pipeline: up to rq->max_tokens ids. */
static inline void fixture_generate(struct local *l, const struct local_gen_request *rq, int32_t *out, int *n_out,
                                    struct local_stats *st)
{
    char err[ERR_MSG_MAX] = "";
    struct local_gen_result res = {.ids = out, .cap = rq->max_tokens};
    fixture_check(local_generate(l, rq, &res, err), "local_generate", err);
    *n_out = res.n;
    *st = res.st;
}

/* Greedy request fields: ids, K (< 0 target-only: draft "none"), the
 * draft source otherwise ("model" when NULL), EOS ending it or not. */
static inline struct local_gen_request fixture_greedy(const int32_t *prompt, int n_prompt, int max_tokens, int k,
                                                      const char *draft, bool stop_at_eos)
{
    struct local_gen_request rq = {.prompt = prompt, .n_prompt = n_prompt, .max_tokens = max_tokens,
                                   .spec_k = k < 0 ? 0 : k, .draft = k < 0 ? "none" : draft ? draft : "model",
                                   .ignore_eos = !stop_at_eos};
    sampling_params_default(&rq.sampling);
    return rq;
}

/* The oracle, apart from the scheduler: target-only greedy ids by plain
 * decoding (one forward call a token, the argmax of the whole row of
 * logits), up to max_tokens, the context's end (every position fed, the
 * last token with it) or (stop_at_eos) an EOS id, which is kept. */
static inline void fixture_reference_greedy(struct loaded_model *t, const int32_t *prompt, int n_prompt,
                                            int max_tokens, bool stop_at_eos, int32_t *out, int *n_out)
{
    char err[ERR_MSG_MAX] = "";
    const struct model_config *mc = llama_model_config(t->model);
    float *logits = malloc((size_t)mc->vocab_size * sizeof *logits);
    assert_non_null(logits);
    fixture_check(llama_ctx_truncate(t->ctx, 0, 0, err), "llama_ctx_truncate", err);
    /* the last token is never fed: it needs no position */
    const int room = llama_ctx_max_seq_len(t->ctx) - n_prompt + 1;
    const int32_t *feed = prompt;
    int n_feed = n_prompt;
    *n_out = 0;
    while (*n_out < max_tokens && *n_out < room) {
        struct llama_seq_batch b = {.slot = 0, .tokens = feed, .n_tokens = n_feed, .n_logits = 1,
                                    .logits_out = logits};
        fixture_check(llama_forward(t->ctx, &b, 1, err), "llama_forward", err);
        int32_t best = 0;
        for (int v = 1; v < mc->vocab_size; v++)
            best = logits[v] > logits[best] ? v : best;
        out[(*n_out)++] = best;
        bool eos = false;
        for (int e = 0; e < mc->n_eos_token_ids; e++)
            eos = eos || mc->eos_token_ids[e] == best;
        if (stop_at_eos && eos)
            break;
        feed = &out[*n_out - 1];
        n_feed = 1;
    }
    fixture_check(llama_ctx_truncate(t->ctx, 0, 0, err), "llama_ctx_truncate", err);
    free(logits);
}

/* n_prompts prompts, target-only vs speculative for K = 1..8 and adaptive
 * (0), in the sampled draft mode and (n_modes 2) the point-mass mode,
 * through the pipeline with the argmax screens on; the oracle is plain
 * decoding from whole rows of logits (fixture_reference_greedy). */
/* Prompts first_prompt .. first_prompt + n_prompts - 1 (a test may split
 * them across processes). */
static inline void check_greedy_equality_range(struct loaded_model *draft_m,
                                               struct loaded_model *target_m, int first_prompt,
                                               int n_prompts, int max_tokens, int n_modes,
                                               double *acceptance_out)
{
    struct local *l = fixture_pipeline(draft_m, target_m, NULL);
    const struct model_config *cfg = llama_model_config(target_m->model);
    long drafted = 0, accepted = 0;
    int32_t *expect = malloc((size_t)max_tokens * sizeof(int32_t));
    int32_t *got = malloc((size_t)max_tokens * sizeof(int32_t));
    for (int i = first_prompt; i < first_prompt + n_prompts; i++) {
        int32_t prompt[32];
        int n_prompt = 2 + i % 19;
        fixture_random_ids(prompt, n_prompt, 0, cfg->vocab_size, 100 + (uint64_t)i);
        int n_expect, n_got;
        struct local_stats st;
        fixture_reference_greedy(target_m, prompt, n_prompt, max_tokens, true, expect, &n_expect);
        for (int k = -1; k <= 8; k++) {
            for (int mode = 0; mode < (k < 0 ? 1 : n_modes); mode++) {
                struct local_gen_request rq = fixture_greedy(prompt, n_prompt, max_tokens, k, NULL, true);
                rq.mode = (enum speculate_mode)mode;
                fixture_generate(l, &rq, got, &n_got, &st);
                if (n_got != n_expect || memcmp(got, expect, (size_t)n_got * sizeof(int32_t)))
                    fail_msg("prompt %d, K=%d, mode %d: output differs from target-only plain decoding "
                             "(%d vs %d tokens)", i, k, mode, n_got, n_expect);
                drafted += st.drafted;
                accepted += st.accepted;
                assert_true(st.accepted <= st.drafted);
                assert_true(st.generated_tokens == n_got);
            }
        }
    }
    *acceptance_out = drafted ? (double)accepted / drafted : 0;
    free(expect);
    free(got);
    local_destroy(l);
}

static inline void check_greedy_equality(struct loaded_model *draft_m,
                                         struct loaded_model *target_m, int n_prompts,
                                         int max_tokens, int n_modes, double *acceptance_out)
{
    check_greedy_equality_range(draft_m, target_m, 0, n_prompts, max_tokens, n_modes,
                                acceptance_out);
}

#endif
