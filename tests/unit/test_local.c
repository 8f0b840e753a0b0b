/* test_local.c: the server's speculation run in one process (local.h).
 *
 * The oracle is the target alone: greedy output through the coordinator's
 * scheduler and the two roles in process equals target-only output for
 * every draft source (model, ngram, suffix, auto, none) and K (adaptive,
 * 1, 4, 8), on the tiny matched pair; the pair speculates (drafts are
 * accepted); a seeded sampled request gives the same ids twice; a reply
 * callback that asks to stop cancels the request and leaves the pipeline
 * ready for the next one.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "local.h"
#include "local_generate.h"
#include "specdec_fixtures.h"

#define MAX_TOKENS 40

struct fixture {
    char root[256], draft_dir[300], target_dir[300];
    struct kern_backend *be;
    struct loaded_model draft, target;
    struct worker_main_model draft_m, target_m;
    struct local *local;
};

/* What the replies of one request said. */
struct outcome {
    int32_t ids[MAX_TOKENS + 1];
    int n_ids;
    int replies, drafted, accepted;
    char finish[32];
    int stop_after; /* > 0: ask to stop at that reply */
};

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    fixture_tmpdir(f->root, sizeof f->root);
    snprintf(f->draft_dir, sizeof f->draft_dir, "%s/draft", f->root);
    snprintf(f->target_dir, sizeof f->target_dir, "%s/target", f->root);
    fixture_make(f->draft_dir, "tiny-draft", 1, 0, NULL, 0);
    fixture_make(f->target_dir, "tiny", 2, 0, f->draft_dir, 0.02);
    char err[ERR_MSG_MAX] = "";
    fixture_check(kern_cpu_create(&f->be, 2, err), "kern_cpu_create", err);
    fixture_load(&f->draft, f->draft_dir, f->be, 512);
    fixture_load(&f->target, f->target_dir, f->be, 512);
    worker_main_model_borrow(&f->draft_m, f->be, f->draft.model, f->draft.ctx);
    worker_main_model_borrow(&f->target_m, f->be, f->target.model, f->target.ctx);
    struct proc_config cfg;
    proc_config_defaults(&cfg);
    cfg.coordinator.max_concurrency = 1;
    snprintf(cfg.draft_worker.model, sizeof cfg.draft_worker.model, "%s", f->draft_dir);
    snprintf(cfg.target_worker.model, sizeof cfg.target_worker.model, "%s", f->target_dir);
    struct local_params p = {.cfg = &cfg, .target = &f->target_m, .draft = &f->draft_m};
    fixture_check(local_create(&f->local, &p, err), "local_create", err);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    local_destroy(f->local);
    fixture_unload(&f->draft);
    fixture_unload(&f->target);
    f->be->ops->destroy(f->be);
    fixture_rmdir(f->root);
    free(f);
    return 0;
}

static int on_reply(void *user, const cJSON *reply)
{
    struct outcome *o = user;
    o->replies++;
    const char *type = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(reply, "type"));
    assert_non_null(type);
    if (strcmp(type, "error") == 0)
        fail_msg("error reply: %s", cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(reply, "message")));
    if (strcmp(type, "done") == 0) {
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(reply, "ids");
        o->n_ids = 0;
        for (const cJSON *id = ids ? ids->child : NULL; id && o->n_ids <= MAX_TOKENS; id = id->next)
            o->ids[o->n_ids++] = (int32_t)id->valuedouble;
        snprintf(o->finish, sizeof o->finish, "%s",
                 cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(reply, "finish_reason")));
        const cJSON *spec = cJSON_GetObjectItemCaseSensitive(reply, "spec");
        o->drafted = (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(spec, "drafted"));
        o->accepted = (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(spec, "accepted"));
        /* spec.accepted_at: a round that accepted m drafts counts at
         * positions 0..m-1, so the counts never rise and sum to accepted */
        struct local_stats st;
        local_stats_from_done(reply, &st);
        int sum = 0;
        for (int i = 0; i < SPECULATE_K_MAX; i++) {
            sum += st.accepted_at[i];
            assert_true(i == 0 || st.accepted_at[i] <= st.accepted_at[i - 1]);
        }
        assert_int_equal(sum, o->accepted);
        assert_true(st.accepted_at[0] <= st.rounds);
    }
    return o->stop_after > 0 && o->replies >= o->stop_after;
}

/* The generate request's JSON (docs/protocol.md); the caller frees it. */
static char *request_json(const int32_t *prompt, int n_prompt, const char *draft, int k, double temperature,
                          bool stream)
{
    cJSON *r = cJSON_CreateObject();
    assert_non_null(r);
    cJSON_AddNumberToObject(r, "v", 1);
    cJSON_AddStringToObject(r, "type", "generate");
    cJSON_AddStringToObject(r, "id", "t");
    cJSON *ids = cJSON_AddArrayToObject(r, "prompt_ids");
    for (int i = 0; i < n_prompt; i++)
        cJSON_AddItemToArray(ids, cJSON_CreateNumber(prompt[i]));
    cJSON_AddNumberToObject(r, "max_tokens", MAX_TOKENS);
    cJSON_AddNumberToObject(r, "temperature", temperature);
    cJSON_AddNumberToObject(r, "seed", 1234);
    cJSON_AddNumberToObject(r, "spec_k", k);
    cJSON_AddStringToObject(r, "draft", draft);
    cJSON_AddBoolToObject(r, "stream", stream);
    char *text = cJSON_PrintUnformatted(r);
    assert_non_null(text);
    cJSON_Delete(r);
    return text;
}

static void run(struct fixture *f, const char *request, struct outcome *o)
{
    char err[ERR_MSG_MAX] = "";
    fixture_check(local_run(f->local, request, on_reply, o, err), "local_run", err);
}

/* Target-only greedy ids of prompt by plain decoding, the oracle. */
static void target_only(struct fixture *f, const int32_t *prompt, int n_prompt, int32_t *out, int *n_out)
{
    fixture_reference_greedy(&f->target, prompt, n_prompt, MAX_TOKENS, true, out, n_out);
}

static void test_local_greedy_equals_target_only_for_every_source_and_k(void **state)
{
    struct fixture *f = *state;
    static const char *const sources[] = {"model", "ngram", "suffix", "auto", "none"};
    static const int ks[] = {0, 1, 4, 8};
    const int vocab = llama_model_config(f->target.model)->vocab_size;
    long drafted = 0, accepted = 0;
    for (int i = 0; i < 4; i++) {
        int32_t prompt[24], expect[MAX_TOKENS];
        const int n_prompt = 3 + 5 * i;
        fixture_random_ids(prompt, n_prompt, 0, vocab, 300 + (uint64_t)i);
        int n_expect = 0;
        target_only(f, prompt, n_prompt, expect, &n_expect);
        for (size_t s = 0; s < sizeof sources / sizeof *sources; s++)
            for (size_t k = 0; k < sizeof ks / sizeof *ks; k++) {
                char *req = request_json(prompt, n_prompt, sources[s], ks[k], 0.0, k % 2 == 1);
                struct outcome o = {0};
                run(f, req, &o);
                free(req);
                if (o.n_ids != n_expect || memcmp(o.ids, expect, (size_t)n_expect * sizeof *expect) != 0)
                    fail_msg("prompt %d, draft %s, K %d: %d ids differ from the target's %d", i, sources[s],
                             ks[k], o.n_ids, n_expect);
                if (strcmp(sources[s], "model") == 0) {
                    drafted += o.drafted;
                    accepted += o.accepted;
                }
            }
    }
    fprintf(stderr, "  model drafts: %ld drafted, %ld accepted\n", drafted, accepted);
    /* a matched pair must speculate in process, or the test proves little */
    assert_true(drafted > 0 && accepted > drafted / 2);
}

static void test_local_seeded_sampling_is_reproducible(void **state)
{
    struct fixture *f = *state;
    const int32_t prompt[] = {5, 17, 3, 42, 8};
    struct outcome a = {0}, b = {0};
    /* fixed K: an adaptive K follows measured times, and another K draws
     * other numbers */
    for (int k = 1; k <= 4; k += 3) {
        char *req = request_json(prompt, 5, "model", k, 1.0, false);
        run(f, req, &a);
        run(f, req, &b);
        free(req);
        assert_int_equal(a.n_ids, b.n_ids);
        assert_memory_equal(a.ids, b.ids, (size_t)a.n_ids * sizeof *a.ids);
    }
}

static void test_local_cancel_leaves_the_pipeline_ready(void **state)
{
    struct fixture *f = *state;
    const int32_t prompt[] = {9, 1, 4, 1, 5};
    char *req = request_json(prompt, 5, "model", 2, 0.0, true);
    struct outcome stopped = {.stop_after = 2}, whole = {0};
    char err[ERR_MSG_MAX] = "";
    assert_int_equal(local_run(f->local, req, on_reply, &stopped, err), ERR_CANCELLED);
    run(f, req, &whole);
    free(req);
    int32_t expect[MAX_TOKENS];
    int n_expect = 0;
    target_only(f, prompt, 5, expect, &n_expect);
    assert_int_equal(whole.n_ids, n_expect);
    assert_memory_equal(whole.ids, expect, (size_t)n_expect * sizeof *expect);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_local_greedy_equals_target_only_for_every_source_and_k),
        cmocka_unit_test(test_local_seeded_sampling_is_reproducible),
        cmocka_unit_test(test_local_cancel_leaves_the_pipeline_ready),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
