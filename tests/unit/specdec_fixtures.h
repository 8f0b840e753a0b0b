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
#include "specdec.h"

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

static inline void fixture_generate(struct specdec_draft *d, struct specdec_target *t, const int32_t *prompt,
                     int n_prompt, int max_tokens, int k, const struct sampling_params *sp,
                     enum speculate_mode mode, const int32_t *stop, int n_stop, int32_t *out,
                     int *n_out, struct specdec_stats *st)
{
    struct specdec_request req = {.prompt = prompt, .n_prompt = n_prompt, .max_tokens = max_tokens,
                                  .sampling = *sp, .mode = mode, .k_fixed = k, .stop_ids = stop,
                                  .n_stop_ids = n_stop, .slot = 0};
    char err[ERR_MSG_MAX] = "";
    fixture_check(specdec_generate(d, t, &req, out, n_out, st, NULL, NULL, err), "specdec_generate",
                  err);
}

/* n_prompts prompts, target-only vs speculative for K = 1..8 and adaptive
 * (0), in the sampled draft mode and (n_modes 2) the point-mass mode. */
/* Prompts first_prompt .. first_prompt + n_prompts - 1 (a test may split
 * them across processes). */
static inline void check_greedy_equality_range(struct loaded_model *draft_m,
                                               struct loaded_model *target_m, int first_prompt,
                                               int n_prompts, int max_tokens, int n_modes,
                                               double *acceptance_out)
{
    char err[ERR_MSG_MAX] = "";
    struct specdec_draft *d;
    struct specdec_target *t;
    fixture_check(specdec_draft_create(&d, draft_m->ctx, err), "specdec_draft_create", err);
    fixture_check(specdec_target_create(&t, target_m->ctx, err), "specdec_target_create", err);
    /* the screen where the backend has one (the CPU's, here): its ids are
     * checked against whole logits below */
    assert_true(specdec_draft_prepare_argmax(d));
    assert_true(specdec_target_prepare_argmax(t));
    const struct model_config *cfg = llama_model_config(target_m->model);
    struct sampling_params sp;
    sampling_params_default(&sp);
    sp.temperature = 0;
    long drafted = 0, accepted = 0;
    int32_t *expect = malloc((size_t)max_tokens * sizeof(int32_t));
    int32_t *got = malloc((size_t)max_tokens * sizeof(int32_t));
    for (int i = first_prompt; i < first_prompt + n_prompts; i++) {
        int32_t prompt[32];
        int n_prompt = 2 + i % 19;
        fixture_random_ids(prompt, n_prompt, 0, cfg->vocab_size, 100 + (uint64_t)i);
        int n_expect, n_got;
        struct specdec_stats st;
        fixture_generate(NULL, t, prompt, n_prompt, max_tokens, 0, &sp, SPECULATE_MODE_SAMPLED,
                 cfg->eos_token_ids, cfg->n_eos_token_ids, expect, &n_expect, &st);
        /* the ids above come from the backend's argmax screen where it has
         * one (kernels/cpu/argmax.c): whole rows of logits give the same */
        specdec_target_set_argmax(t, false);
        fixture_generate(NULL, t, prompt, n_prompt, max_tokens, 0, &sp, SPECULATE_MODE_SAMPLED,
                 cfg->eos_token_ids, cfg->n_eos_token_ids, got, &n_got, &st);
        specdec_target_set_argmax(t, true);
        if (n_got != n_expect || memcmp(got, expect, (size_t)n_got * sizeof(int32_t)))
            fail_msg("prompt %d: target-only greedy ids from whole logits differ from the "
                     "argmax screen's (%d vs %d tokens)", i, n_got, n_expect);
        for (int k = 0; k <= 8; k++) {
            for (int mode = 0; mode < n_modes; mode++) {
                fixture_generate(d, t, prompt, n_prompt, max_tokens, k, &sp, (enum speculate_mode)mode,
                         cfg->eos_token_ids, cfg->n_eos_token_ids, got, &n_got, &st);
                if (n_got != n_expect || memcmp(got, expect, (size_t)n_got * sizeof(int32_t)))
                    fail_msg("prompt %d, K=%d, mode %d: speculative output differs from "
                             "target-only (%d vs %d tokens)", i, k, mode, n_got, n_expect);
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
    specdec_draft_destroy(d);
    specdec_target_destroy(t);
}

static inline void check_greedy_equality(struct loaded_model *draft_m,
                                         struct loaded_model *target_m, int n_prompts,
                                         int max_tokens, int n_modes, double *acceptance_out)
{
    check_greedy_equality_range(draft_m, target_m, 0, n_prompts, max_tokens, n_modes,
                                acceptance_out);
}

#endif
