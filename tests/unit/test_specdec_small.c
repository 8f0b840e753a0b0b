/* test_specdec_small.c: greedy speculative output equals target-only output
 * on the `small` pair (the real Llama 3 vocabulary of 128,256 tokens, a draft
 * a third of the target's size), 20 prompts, every K in 1..8 and adaptive K.
 * Slower than the tiny-pair tests: it is the vocabulary-sized case, so an
 * argument 0 or 1 runs one half of the prompts (CTest runs the halves as two
 * tests side by side); no argument runs all 20. */
#include <stdlib.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "specdec_fixtures.h"

static int g_half = -1; /* -1: every prompt; 0 or 1: that half */

static void test_specdec_small_pair_greedy_equals_target_only(void **state)
{
    (void)state;
    char root[256], draft_dir[300], target_dir[300];
    fixture_tmpdir(root, sizeof root);
    snprintf(draft_dir, sizeof draft_dir, "%s/draft", root);
    snprintf(target_dir, sizeof target_dir, "%s/target", root);
    fixture_make(draft_dir, "small-draft", 1, 0, NULL, 0);
    fixture_make(target_dir, "small", 2, 0, draft_dir, 0.02);
    char err[ERR_MSG_MAX] = "";
    struct kern_backend *be;
    fixture_check(kern_cpu_create(&be, 0, err), "kern_cpu_create", err);
    struct loaded_model draft, target;
    fixture_load(&draft, draft_dir, be, 256);
    fixture_load(&target, target_dir, be, 256);
    double acc;
    const int first = g_half < 0 ? 0 : 10 * g_half, n = g_half < 0 ? 20 : 10;
    check_greedy_equality_range(&draft, &target, first, n, 10, 1, &acc);
    fprintf(stderr, "  small pair (noise 0.02): greedy acceptance %.3f\n", acc);
    assert_true(acc > 0.3);
    fixture_unload(&draft);
    fixture_unload(&target);
    be->ops->destroy(be);
    fixture_rmdir(root);
}

int main(int argc, char **argv)
{
    if (argc > 1) {
        g_half = atoi(argv[1]);
        if (g_half != 0 && g_half != 1) {
            fprintf(stderr, "usage: %s [0|1]\n", argv[0]);
            return 2;
        }
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_specdec_small_pair_greedy_equals_target_only),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
