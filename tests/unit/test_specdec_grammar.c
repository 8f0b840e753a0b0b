/* test_specdec_grammar.c: the target half under a grammar, greedy (issue
 * 60): its rows read through the argmax screen under the grammar's masks
 * (llama_seq_batch.argmax_allow) give, token for token, what whole rows of
 * logits masked by token_mask_apply give, for plain decoding and for
 * n-gram drafts the grammar sometimes refuses; the output parses as the
 * grammar says (it ends where the grammar may end). On the trained target,
 * whose tokenizer the masks are over. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "error.h"
#include "grammar_match.h"
#include "grammar_spec.h"
#include "kernels.h"
#include "llama.h"
#include "ngram.h"
#include "specdec.h"
#include "specdec_internal.h"
#include "token_mask.h"
#include "tokenizer.h"

#define MAX_OUT 96

struct fixture {
    struct kern_backend *be;
    struct llama_model *model;
    struct llama_ctx *ctx;
    struct specdec_target *t;
    struct tokenizer *tk;
    struct grammar_engine *engine;
    struct token_mask_vocab *vocab;
    struct token_mask *mask;
    struct specdec_grammar gram;
};

static void ok(int rc, const char *what, const char *err)
{
    if (rc)
        fail_msg("%s: %s", what, err);
}

static void open_fixture(struct fixture *f, const char *schema)
{
    char err[ERR_MSG_MAX] = "", dir[1024];
    memset(f, 0, sizeof *f);
    snprintf(dir, sizeof dir, "%s/models/trained/target", TANDEM_TEST_SOURCE_DIR);
    ok(kern_cpu_create(&f->be, 1, err), "kern_cpu_create", err);
    ok(llama_model_load(&f->model, dir, f->be, err), "llama_model_load", err);
    const struct llama_ctx_params p = {.n_slots = 1, .max_seq_len = 512};
    ok(llama_ctx_create(&f->ctx, f->model, &p, err), "llama_ctx_create", err);
    ok(specdec_target_create(&f->t, f->ctx, err), "specdec_target_create", err);
    assert_true(specdec_target_prepare_argmax(f->t));
    ok(tokenizer_load(&f->tk, dir, err), "tokenizer_load", err);
    struct grammar_spec spec = {.kind = GRAMMAR_SPEC_JSON_SCHEMA, .text = strdup(schema),
                                .len = strlen(schema)};
    struct grammar *g = NULL;
    ok(grammar_spec_compile(&spec, "schema", &g, err), "grammar_spec_compile", err);
    grammar_spec_free(&spec);
    ok(grammar_engine_create(&f->engine, g, 0, err), "grammar_engine_create", err);
    const int32_t n = tokenizer_vocab_size(f->tk);
    const uint8_t **bytes = NULL;
    size_t *lens = NULL;
    ok(tokenizer_text_tokens(f->tk, &bytes, &lens, err), "tokenizer_text_tokens", err);
    ok(token_mask_vocab_create(&f->vocab, bytes, lens, n, err), "token_mask_vocab_create", err);
    free(bytes);
    free(lens);
    ok(token_mask_create(&f->mask, f->engine, f->vocab, 0, err), "token_mask_create", err);
    const struct model_config *cfg = llama_model_config(f->model);
    f->gram.mask = f->mask;
    f->gram.vocab = f->vocab;
    f->gram.eos = (struct token_mask_eos){.ids = cfg->eos_token_ids, .n = cfg->n_eos_token_ids};
    f->gram.bits = malloc(token_mask_words(f->mask) * sizeof(uint64_t));
    assert_non_null(f->gram.bits);
    assert_int_equal(grammar_matcher_init(&f->gram.matcher, f->engine), 0);
}

static void close_fixture(struct fixture *f)
{
    grammar_matcher_free(&f->gram.matcher);
    free(f->gram.bits);
    token_mask_destroy(f->mask);
    token_mask_vocab_destroy(f->vocab);
    grammar_engine_destroy(f->engine);
    tokenizer_destroy(f->tk);
    specdec_target_destroy(f->t);
    llama_ctx_destroy(f->ctx);
    llama_model_destroy(f->model);
    f->be->ops->destroy(f->be);
}

static bool is_eos(const struct model_config *cfg, int32_t id)
{
    for (int i = 0; i < cfg->n_eos_token_ids; i++)
        if (cfg->eos_token_ids[i] == id)
            return true;
    return false;
}

/* Greedy decoding of prompt under the grammar: k = 0 plain steps, else
 * n-gram drafts of up to k tokens (not cut by the grammar: the target
 * refuses what leaves it). Returns the output's length. */
static int decode(struct fixture *f, const int32_t *prompt, int n_prompt, int k, bool screen,
                  int32_t *out)
{
    char err[ERR_MSG_MAX] = "";
    const struct model_config *cfg = llama_model_config(f->model);
    struct sampling_params sp;
    sampling_params_default(&sp);
    sp.temperature = 0;
    struct ngram_params np;
    ngram_params_default(&np);
    specdec_target_set_argmax(f->t, screen);
    f->gram.n_prompt = n_prompt;
    grammar_matcher_rollback(&f->gram.matcher, f->gram.matcher.n_tokens);
    int32_t hist[512], feed[512], drafts[16], got[17];
    memcpy(hist, prompt, (size_t)n_prompt * sizeof *hist);
    memcpy(feed, prompt, (size_t)n_prompt * sizeof *feed);
    int n_hist = n_prompt, n_feed = n_prompt, keep = 0, n_out = 0;
    while (n_out < MAX_OUT) {
        int n_draft = k > 0 ? ngram_draft(&np, hist, n_hist, k, drafts) : 0;
        if (n_draft > MAX_OUT - n_out - 1)
            n_draft = MAX_OUT - n_out - 1 > 0 ? MAX_OUT - n_out - 1 : 0;
        struct specdec_verify_job job = {.slot = 0, .keep_len = keep, .feed = feed, .n_feed = n_feed,
                                         .draft = drafts, .k = n_draft, .sp = sp,
                                         .mode = SPECULATE_MODE_SAMPLED, .gram = &f->gram};
        ok(specdec_target_run(f->t, &job, err), "specdec_target_run", err);
        const int n_acc = job.n_accepted;
        memcpy(got, job.tokens_out, (size_t)(n_acc + 1) * sizeof *got);
        keep += n_feed + n_acc;
        for (int i = 0; i <= n_acc && n_out < MAX_OUT; i++) {
            out[n_out++] = got[i];
            hist[n_hist++] = got[i];
            if (is_eos(cfg, got[i]))
                return n_out;
        }
        feed[0] = got[n_acc];
        n_feed = 1;
    }
    return n_out;
}

/* For each prompt: whole masked logits' output, then the screen's and
 * n-gram drafts' (k 2, 4, 8), which must equal it; want_end: the output
 * must reach an EOS (which only the EOS bits of a mask allow). */
static void check_schema(const char *schema, bool want_end)
{
    static const char *const prompts[] = {
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nGive me a person as "
        "JSON.<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWrite a Python function "
        "named read_config.<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    };
    struct fixture f;
    open_fixture(&f, schema);
    char err[ERR_MSG_MAX] = "";
    long screened = 0;
    for (size_t p = 0; p < sizeof prompts / sizeof *prompts; p++) {
        int32_t *prompt = NULL;
        size_t n_prompt = 0;
        ok(tokenizer_encode(f.tk, prompts[p], strlen(prompts[p]), TOKENIZER_PARSE_SPECIAL, &prompt,
                            &n_prompt, err),
           "tokenizer_encode", err);
        int32_t want[MAX_OUT], got[MAX_OUT];
        const int n_want = decode(&f, prompt, (int)n_prompt, 0, false, want);
        assert_true(n_want >= 2);
        if (want_end && !is_eos(llama_model_config(f.model), want[n_want - 1]))
            fail_msg("prompt %zu: %d tokens without an end", p, n_want);
        static const int ks[] = {0, 2, 4, 8};
        for (size_t c = 0; c < sizeof ks / sizeof *ks; c++)
            for (int screen = 0; screen < 2; screen++) {
                const int n_got = decode(&f, prompt, (int)n_prompt, ks[c], screen, got);
                if (n_got != n_want || memcmp(got, want, (size_t)n_got * sizeof *got) != 0)
                    fail_msg("prompt %zu, k %d, screen %d: %d tokens differ from whole masked "
                             "logits' %d", p, ks[c], screen, n_got, n_want);
                if (screen)
                    screened += kern_cpu_argmax_candidates(f.be) >= 1;
            }
        /* the output is a sentence of the grammar, so far */
        int32_t st = grammar_engine_start(f.engine);
        for (int i = 0; i < n_want && st != GRAMMAR_STATE_DEAD; i++) {
            size_t len;
            const uint8_t *b = token_mask_vocab_bytes(f.vocab, want[i], &len);
            if (b)
                ok(grammar_engine_feed(f.engine, st, b, len, &st, err), "grammar_engine_feed", err);
        }
        assert_int_not_equal(st, GRAMMAR_STATE_DEAD);
        free(prompt);
    }
    /* the last call of screened runs was answered by the screen, not whole rows */
    assert_true(screened >= 1);
    close_fixture(&f);
}

static void test_screen_under_masks_equals_masked_logits(void **state)
{
    (void)state;
    check_schema("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\","
                 "\"maxLength\":12},\"age\":{\"type\":\"integer\"},\"tags\":{\"type\":"
                 "\"array\",\"items\":{\"type\":\"string\",\"maxLength\":4},\"maxItems\":3}},"
                 "\"required\":[\"name\",\"age\"]}",
                 false);
    /* a short sentence: the mask then admits only the end of the output */
    check_schema("{\"enum\":[\"cat\",\"dog\",3,null]}", true);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_screen_under_masks_equals_masked_logits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
