/* test_specdec_tree.c: greedy tree verification (specdec_tree.h) gives the
 * target's own greedy output, whatever the trees: built from the target's
 * top-3 tokens at each step (the right one left out now and then) and
 * random tokens, bushy or deep, 1..31 candidates, for several prompts; the
 * KV ledger checked after every round. The target half's tree jobs
 * (specdec_verify_job.parents, what the target worker runs for verify_tree)
 * give it too, batched beside plain decoding in one forward, greedy and
 * sampled with top_k 1 (the target's distribution a point mass: the
 * sampled rule must then take exactly its choice); what the tree path does
 * not do yet is refused, the slot untouched. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "error.h"
#include "kernels.h"
#include "llama.h"
#include "modelgen.h"
#include "specdec.h"
#include "specdec_tree.h"

enum { PROMPT = 12, OUT = 160, TOP = 3 };

static void ok(int rc, const char *what, const char *err)
{
    if (rc)
        fail_msg("%s returned %d: %s", what, rc, err);
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int rng_int(uint64_t *s, int n) { return (int)(rng_next(s) % (uint64_t)n); }

/* Target-only greedy: g[k] the argmax after the prompt and g[0..k-1],
 * top[k][0..TOP) that row's TOP largest (top[k][0] = g[k]). */
static void target_only(struct llama_ctx *ctx, const int32_t *prompt, int32_t *g,
                        int32_t (*top)[TOP], int vocab)
{
    char err[ERR_MSG_MAX] = "";
    float *logits = malloc((size_t)vocab * sizeof(float));
    ok(llama_ctx_truncate(ctx, 0, 0, err), "truncate", err);
    struct llama_seq_batch b = {.slot = 0, .tokens = prompt, .n_tokens = PROMPT, .n_logits = 1,
                                .logits_out = logits};
    for (int k = 0; k < OUT; k++) {
        ok(llama_forward(ctx, &b, 1, err), "llama_forward", err);
        for (int j = 0; j < TOP; j++) {
            int best = -1;
            for (int v = 0; v < vocab; v++) {
                int taken = 0;
                for (int i = 0; i < j; i++)
                    taken |= top[k][i] == v;
                if (!taken && (best < 0 || logits[v] > logits[best]))
                    best = v;
            }
            top[k][j] = best;
        }
        g[k] = top[k][0];
        b = (struct llama_seq_batch){.slot = 0, .tokens = &g[k], .n_tokens = 1, .n_logits = 1,
                                     .logits_out = logits};
    }
    free(logits);
}

/* A tree for the step that predicts g[pos]: along the target's path, at
 * depth j the siblings g[pos + j] (left out one time in six), its two
 * runners-up and random tokens, in random order; noise subtrees under
 * some wrong siblings; at most `budget` candidates. Returns their count. */
static int make_tree(const int32_t *g, int32_t (*top)[TOP], int pos, int budget, int vocab,
                     uint64_t *rng, int32_t *tokens, int32_t *parents)
{
    int n = 0, parent = -1;
    for (int j = 0; pos + j < OUT && n < budget; j++) {
        int32_t sib[6];
        int ns = 0;
        const int keep_true = rng_int(rng, 6) != 0;
        if (keep_true)
            sib[ns++] = g[pos + j];
        for (int t = 1; t < TOP; t++)
            if (rng_int(rng, 2))
                sib[ns++] = top[pos + j][t];
        for (int r = rng_int(rng, 3); r > 0; r--)
            sib[ns++] = rng_int(rng, vocab);
        for (int i = ns - 1; i > 0; i--) {
            const int k = rng_int(rng, i + 1);
            const int32_t t = sib[i];
            sib[i] = sib[k];
            sib[k] = t;
        }
        int true_node = -1;
        for (int i = 0; i < ns && n < budget; i++) {
            tokens[n] = sib[i];
            parents[n] = parent;
            if (sib[i] == g[pos + j] && true_node < 0)
                true_node = n;
            n++;
            /* a wrong sibling's own short noise branch */
            if (sib[i] != g[pos + j] && rng_int(rng, 3) == 0)
                for (int d = 0, p = n - 1; d < 2 && n < budget; d++, p = n - 1) {
                    tokens[n] = rng_int(rng, vocab);
                    parents[n++] = p;
                }
        }
        if (true_node < 0 || !keep_true)
            break;
        parent = true_node;
    }
    return n;
}

static void test_specdec_tree_greedy_equals_target_only(void **state)
{
    (void)state;
    char dir[256], err[ERR_MSG_MAX] = "";
    snprintf(dir, sizeof dir, "/tmp/tandem-test-specdec-tree-XXXXXX");
    assert_non_null(mkdtemp(dir));
    struct modelgen_params mp = {.preset = "tiny", .seed = 11, .force = 1};
    ok(modelgen_write(dir, &mp, err), "modelgen_write", err);
    struct kern_backend *be = NULL;
    struct llama_model *model = NULL;
    ok(kern_cpu_create(&be, 2, err), "kern_cpu_create", err);
    ok(llama_model_load(&model, dir, be, err), "llama_model_load", err);
    ok(llama_model_prepare_argmax(model, false, err), "prepare_argmax", err);
    const int vocab = llama_model_config(model)->vocab_size;
    struct llama_ctx_params p = {.n_slots = 1, .max_seq_len = PROMPT + OUT + 64,
                                 .kv_block_size = 8, .prefix_cache = true};
    struct llama_ctx *ref = NULL, *ctx = NULL;
    ok(llama_ctx_create(&ref, model, &p, err), "llama_ctx_create", err);
    ok(llama_ctx_create(&ctx, model, &p, err), "llama_ctx_create", err);
    uint64_t rng = 5;
    int32_t g[OUT], top[OUT][TOP], got[OUT + LLAMA_TREE_MAX];
    long rounds = 0, produced = 0, nodes = 0;
    for (int prompt_i = 0; prompt_i < 6; prompt_i++) {
        int32_t prompt[PROMPT];
        for (int i = 0; i < PROMPT; i++)
            prompt[i] = rng_int(&rng, vocab);
        target_only(ref, prompt, g, top, vocab);
        ok(llama_ctx_truncate(ctx, 0, 0, err), "truncate", err);
        const struct llama_seq_batch pre = {.slot = 0, .tokens = prompt, .n_tokens = PROMPT - 1};
        ok(llama_forward(ctx, &pre, 1, err), "prefill", err);
        int32_t last = prompt[PROMPT - 1];
        int pos = 0;
        while (pos < OUT) {
            int32_t tokens[LLAMA_TREE_MAX], parents[LLAMA_TREE_MAX];
            const int budget = rng_int(&rng, LLAMA_TREE_MAX); /* 0 .. 31 */
            const int n = make_tree(g, top, pos, budget, vocab, &rng, tokens, parents);
            const struct specdec_tree tree = {.last = last, .tokens = tokens, .parents = parents,
                                              .n = n};
            int n_out = 0;
            ok(specdec_tree_verify_greedy(ctx, 0, &tree, got + pos, &n_out, err),
               "specdec_tree_verify_greedy", err);
            assert_true(n_out >= 1 && n_out <= n + 1);
            const int check = pos + n_out < OUT ? n_out : OUT - pos;
            if (memcmp(got + pos, g + pos, (size_t)check * sizeof(int32_t)))
                fail_msg("prompt %d, round %ld: a tree of %d gave tokens %d.. unlike the target's",
                         prompt_i, rounds, n, pos);
            assert_int_equal(llama_ctx_slot_len(ctx, 0), PROMPT - 1 + pos + n_out);
            ok(llama_ctx_kv_check(ctx, err), "llama_ctx_kv_check", err);
            last = got[pos + n_out - 1];
            pos += n_out;
            rounds++;
            nodes += n;
        }
        produced += OUT;
    }
    fprintf(stderr, "  %ld tokens in %ld rounds of trees (%.1f candidates, %.2f tokens a round)\n",
            produced, rounds, (double)nodes / (double)rounds, (double)produced / (double)rounds);
    assert_true(produced > 2 * rounds);
    /* a tree too large, refused before any forward */
    int32_t t32[LLAMA_TREE_MAX], p32[LLAMA_TREE_MAX];
    for (int i = 0; i < LLAMA_TREE_MAX; i++)
        t32[i] = 0, p32[i] = i - 1;
    const struct specdec_tree big = {.last = 0, .tokens = t32, .parents = p32,
                                     .n = LLAMA_TREE_MAX};
    const int len = llama_ctx_slot_len(ctx, 0);
    int n_out = 0;
    assert_int_equal(specdec_tree_verify_greedy(ctx, 0, &big, got, &n_out, err), ERR_INVALID_ARG);
    assert_int_equal(llama_ctx_slot_len(ctx, 0), len);
    llama_ctx_destroy(ctx);
    llama_ctx_destroy(ref);
    llama_model_destroy(model);
    be->ops->destroy(be);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

/* The deepest path of a tree. */
static int tree_depth(const int32_t *parents, int n)
{
    int depth[LLAMA_TREE_MAX], max = 0;
    for (int i = 0; i < n; i++) {
        depth[i] = parents[i] < 0 ? 1 : depth[parents[i]] + 1;
        max = depth[i] > max ? depth[i] : max;
    }
    return max;
}

/* One step of the target half for jobs[0..n) until each is done. */
static void run_jobs(struct specdec_target *t, struct specdec_verify_job **jobs, int n)
{
    char err[ERR_MSG_MAX] = "";
    for (int i = 0; i < n; i++)
        specdec_verify_job_init(jobs[i]);
    for (int guard = 0; guard < 64; guard++) {
        int left = 0;
        for (int i = 0; i < n; i++)
            left += !jobs[i]->done;
        if (!left)
            return;
        ok(specdec_target_step(t, jobs, n, NULL, err), "specdec_target_step", err);
    }
    fail_msg("jobs not done after 64 steps");
}

/* Slot 0 decodes by tree jobs (a feed of 1 or 2 tokens), slot 1 by plain
 * steps of the same prompt, in the same forward calls: both must give the
 * target-only tokens g. */
static void decode_by_tree_jobs(struct specdec_target *t, const int32_t *prompt, const int32_t *g,
                                int32_t (*top)[TOP], const struct sampling_params *sp, uint64_t *rng,
                                long *nodes)
{
    const int vocab = llama_model_config(llama_ctx_model(specdec_target_ctx(t)))->vocab_size;
    int32_t got[2][OUT + LLAMA_TREE_MAX];
    struct specdec_verify_job a = {.slot = 0, .feed = prompt, .n_feed = PROMPT, .sp = *sp,
                                   .mode = SPECULATE_MODE_POINT_MASS};
    struct specdec_verify_job b = a;
    b.slot = 1;
    struct specdec_verify_job *jobs[2] = {&a, &b};
    run_jobs(t, jobs, 2);
    assert_int_equal(a.rc, 0);
    assert_int_equal(b.rc, 0);
    got[0][0] = a.tokens_out[0];
    got[1][0] = b.tokens_out[0];
    int pos = 1, pos_b = 1;
    while (pos < OUT) {
        int32_t tokens[LLAMA_TREE_MAX], parents[LLAMA_TREE_MAX];
        int n = 0;
        for (int budget = 1 + rng_int(rng, SPECDEC_TREE_NODES_MAX); budget > 0; budget /= 2) {
            n = make_tree(g, top, pos, budget, vocab, rng, tokens, parents);
            if (tree_depth(parents, n) <= SPECULATE_K_MAX)
                break;
        }
        /* now and then the job cuts the slot back a token and feeds two:
         * the first runs as the feed's head, before the tree's forward */
        const int n_feed = pos >= 2 && rng_int(rng, 4) == 0 ? 2 : 1;
        a = (struct specdec_verify_job){.slot = 0, .keep_len = PROMPT + pos - n_feed,
                                        .feed = got[0] + pos - n_feed, .n_feed = n_feed, .draft = tokens,
                                        .k = n, .parents = n > 0 ? parents : NULL, .sp = *sp,
                                        .mode = SPECULATE_MODE_POINT_MASS};
        b = (struct specdec_verify_job){.slot = 1, .keep_len = PROMPT + pos_b - 1, .feed = got[1] + pos_b - 1,
                                        .n_feed = 1, .sp = *sp, .mode = SPECULATE_MODE_POINT_MASS};
        run_jobs(t, jobs, pos_b < OUT ? 2 : 1);
        if (a.rc)
            fail_msg("tree job at %d (%d nodes): %s", pos, n, a.err);
        memcpy(got[0] + pos, a.tokens_out, (size_t)(a.n_accepted + 1) * sizeof(int32_t));
        const int check = pos + a.n_accepted + 1 < OUT ? a.n_accepted + 1 : OUT - pos;
        if (memcmp(got[0] + pos, g + pos, (size_t)check * sizeof(int32_t)))
            fail_msg("a tree job of %d nodes gave tokens %d.. unlike the target's", n, pos);
        pos += a.n_accepted + 1;
        assert_int_equal(llama_ctx_slot_len(specdec_target_ctx(t), 0), PROMPT + pos - 1);
        if (pos_b < OUT) {
            assert_int_equal(b.rc, 0);
            got[1][pos_b++] = b.tokens_out[0];
        }
        *nodes += n;
    }
    while (pos_b < OUT) {
        b = (struct specdec_verify_job){.slot = 1, .keep_len = PROMPT + pos_b - 1, .feed = got[1] + pos_b - 1,
                                        .n_feed = 1, .sp = *sp, .mode = SPECULATE_MODE_POINT_MASS};
        run_jobs(t, &jobs[1], 1);
        got[1][pos_b++] = b.tokens_out[0];
    }
    assert_memory_equal(got[1], g, OUT * sizeof(int32_t));
}

static void test_specdec_tree_target_jobs_equal_target_only(void **state)
{
    (void)state;
    char dir[256], err[ERR_MSG_MAX] = "";
    snprintf(dir, sizeof dir, "/tmp/tandem-test-specdec-tree-jobs-XXXXXX");
    assert_non_null(mkdtemp(dir));
    struct modelgen_params mp = {.preset = "tiny", .seed = 12, .force = 1};
    ok(modelgen_write(dir, &mp, err), "modelgen_write", err);
    struct kern_backend *be = NULL;
    struct llama_model *model = NULL;
    ok(kern_cpu_create(&be, 2, err), "kern_cpu_create", err);
    ok(llama_model_load(&model, dir, be, err), "llama_model_load", err);
    const int vocab = llama_model_config(model)->vocab_size;
    struct llama_ctx_params p = {.n_slots = 2, .max_seq_len = PROMPT + OUT + 64, .kv_block_size = 8,
                                 .prefix_cache = true};
    struct llama_ctx *ref = NULL, *ctx = NULL;
    ok(llama_ctx_create(&ref, model, &p, err), "llama_ctx_create", err);
    ok(llama_ctx_create(&ctx, model, &p, err), "llama_ctx_create", err);
    struct specdec_target *t = NULL;
    ok(specdec_target_create(&t, ctx, err), "specdec_target_create", err);
    specdec_target_prepare_argmax(t);
    uint64_t rng = 9;
    int32_t g[OUT], top[OUT][TOP];
    long nodes = 0;
    struct sampling_params greedy, top1;
    sampling_params_default(&greedy);
    greedy.temperature = 0;
    sampling_params_default(&top1);
    top1.temperature = 1.0f;
    top1.top_k = 1;
    top1.seed = 77;
    for (int prompt_i = 0; prompt_i < 4; prompt_i++) {
        int32_t prompt[PROMPT];
        for (int i = 0; i < PROMPT; i++)
            prompt[i] = rng_int(&rng, vocab);
        target_only(ref, prompt, g, top, vocab);
        decode_by_tree_jobs(t, prompt, g, top, prompt_i % 2 ? &top1 : &greedy, &rng, &nodes);
        ok(llama_ctx_kv_check(ctx, err), "llama_ctx_kv_check", err);
    }
    assert_true(nodes > 4 * OUT);
    /* refused before any forward, the slot as it was: a path deeper than
     * verify_done carries, and logprobs (not on the tree path yet) */
    int32_t tk[SPECULATE_K_MAX + 1], par[SPECULATE_K_MAX + 1], feed[1] = {g[0]};
    for (int i = 0; i <= SPECULATE_K_MAX; i++)
        tk[i] = 0, par[i] = i - 1;
    const int len = llama_ctx_slot_len(ctx, 0);
    struct specdec_verify_job j = {.slot = 0, .keep_len = len, .feed = feed, .n_feed = 1, .draft = tk,
                                   .k = SPECULATE_K_MAX + 1, .parents = par, .sp = greedy};
    struct specdec_verify_job *jobs[1] = {&j};
    run_jobs(t, jobs, 1);
    assert_int_equal(j.rc, ERR_INVALID_ARG);
    assert_non_null(strstr(j.err, "deep"));
    j.k = 2;
    j.logprobs = true;
    run_jobs(t, jobs, 1);
    assert_int_equal(j.rc, ERR_UNSUPPORTED);
    assert_non_null(strstr(j.err, "logprobs"));
    assert_int_equal(llama_ctx_slot_len(ctx, 0), len);
    specdec_target_destroy(t);
    llama_ctx_destroy(ctx);
    llama_ctx_destroy(ref);
    llama_model_destroy(model);
    be->ops->destroy(be);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_specdec_tree_greedy_equals_target_only),
        cmocka_unit_test(test_specdec_tree_target_jobs_equal_target_only),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
