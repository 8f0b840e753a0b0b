/* test_ngram.c: n-gram drafts (common/speculation/ngram.c) against a plain
 * reference written here, on hand-made sequences and on random ones. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "error.h"
#include "ngram.h"

static int draft(const int32_t *h, int n, int k_max, int32_t *out)
{
    struct ngram_params p;
    ngram_params_default(&p);
    return ngram_draft(&p, h, n, k_max, out);
}

/* A repeated phrase is continued where it went before, and the chain
 * follows it past its end into what came next. */
static void test_ngram_continues_a_repeated_phrase(void **state)
{
    (void)state;
    const int32_t h[] = {1, 2, 3, 4, 5, 6, 9, 9, 1, 2, 3};
    int32_t out[8];
    int k = draft(h, 11, 8, out);
    /* 2,3 -> 4 -> 5 -> 6 -> 9 -> 9 -> 1 -> 2 -> 3 (the chain goes round) */
    const int32_t want[8] = {4, 5, 6, 9, 9, 1, 2, 3};
    assert_int_equal(k, 8);
    assert_memory_equal(out, want, sizeof want);
    assert_int_equal(draft(h, 11, 3, out), 3);
}

/* No earlier occurrence of any context: nothing is drafted. */
static void test_ngram_without_a_match_drafts_nothing(void **state)
{
    (void)state;
    const int32_t h[] = {1, 2, 3, 4, 5, 6, 7, 8};
    int32_t out[4];
    assert_int_equal(draft(h, 8, 4, out), 0);
    assert_int_equal(draft(h, 1, 4, out), 0);
    assert_int_equal(draft(h, 0, 4, out), 0);
}

/* The longest matching context decides, not the shorter one: after
 * "7 1 2", a 3-gram match says 8 although "1 2" alone was followed by 5
 * more often. */
static void test_ngram_prefers_the_longest_context(void **state)
{
    (void)state;
    const int32_t h[] = {1, 2, 5, 0, 1, 2, 5, 0, 7, 1, 2, 8, 0, 7, 1, 2};
    int32_t out[1];
    assert_int_equal(draft(h, 16, 1, out), 1);
    assert_int_equal(out[0], 8);
}

/* Among continuations of the same context, the most frequent wins, and a
 * tie goes to the most recent. */
static void test_ngram_picks_the_most_frequent_then_the_latest(void **state)
{
    (void)state;
    const int32_t freq[] = {3, 4, 10, 3, 4, 10, 3, 4, 11, 3, 4};
    int32_t out[1];
    assert_int_equal(draft(freq, 11, 1, out), 1);
    assert_int_equal(out[0], 10);
    const int32_t tie[] = {3, 4, 10, 3, 4, 11, 3, 4};
    assert_int_equal(draft(tie, 8, 1, out), 1);
    assert_int_equal(out[0], 11);
}

/* Only the window is searched. */
static void test_ngram_searches_only_the_window(void **state)
{
    (void)state;
    const int32_t h[] = {5, 6, 7, 0, 0, 1, 2, 3, 4, 9, 5, 6};
    struct ngram_params p = {.n_min = 2, .n_max = 2, .window = 12};
    int32_t out[1];
    assert_int_equal(ngram_draft(&p, h, 12, 1, out), 1);
    assert_int_equal(out[0], 7);
    p.window = 11; /* the occurrence at 0 is out of reach */
    assert_int_equal(ngram_draft(&p, h, 12, 1, out), 0);
}

static void test_ngram_params_are_checked(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX];
    struct ngram_params p;
    ngram_params_default(&p);
    assert_int_equal(ngram_params_check(&p, err), 0);
    p.n_min = 0;
    assert_int_equal(ngram_params_check(&p, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "n_min"));
    ngram_params_default(&p);
    p.n_max = 1;
    assert_int_equal(ngram_params_check(&p, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "n_max"));
    ngram_params_default(&p);
    p.window = 0;
    assert_int_equal(ngram_params_check(&p, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "window"));
}

/* The reference: one token at a time, every order, every earlier start. */
static int32_t reference_next(const int32_t *s, int len, const struct ngram_params *p)
{
    for (int n = p->n_max; n >= p->n_min; n--) {
        if (len <= n)
            continue;
        int best_tok = -1, best_count = 0, best_last = -1;
        for (int i = len - p->window > 0 ? len - p->window : 0; i + n < len; i++) {
            if (memcmp(s + i, s + len - n, (size_t)n * sizeof(int32_t)) != 0)
                continue;
            int count = 0, last = -1;
            for (int j = len - p->window > 0 ? len - p->window : 0; j + n < len; j++)
                if (memcmp(s + j, s + len - n, (size_t)n * sizeof(int32_t)) == 0 && s[j + n] == s[i + n]) {
                    count++;
                    last = j;
                }
            if (count > best_count || (count == best_count && last > best_last)) {
                best_tok = s[i + n];
                best_count = count;
                best_last = last;
            }
        }
        if (best_tok >= 0)
            return best_tok;
    }
    return -1;
}

/* Random sequences over small alphabets (many matches, few candidates
 * each): the chained drafts equal the reference's, token for token. */
static void test_ngram_matches_the_reference_on_random_sequences(void **state)
{
    (void)state;
    uint64_t rng = 12345;
    for (int trial = 0; trial < 300; trial++) {
        int32_t s[256 + 16];
        const int n = 1 + (int)((rng = rng * 6364136223846793005ull + 1442695040888963407ull) >> 33) % 256;
        const int alphabet = 2 + trial % 6;
        for (int i = 0; i < n; i++)
            s[i] = (int32_t)((rng = rng * 6364136223846793005ull + 1442695040888963407ull) >> 33) % alphabet;
        struct ngram_params p = {.n_min = 1 + trial % 2, .n_max = 2 + trial % 3, .window = 16 + trial % 300};
        int32_t out[16];
        const int k = ngram_draft(&p, s, n, 16, out);
        int len = n;
        for (int j = 0; j < 16; j++) {
            const int32_t want = reference_next(s, len, &p);
            if (j == k) {
                assert_int_equal(want, -1);
                break;
            }
            if (out[j] != want)
                fail_msg("trial %d: draft %d is %d, the reference says %d", trial, j, out[j], want);
            s[len++] = want;
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ngram_continues_a_repeated_phrase),
        cmocka_unit_test(test_ngram_without_a_match_drafts_nothing),
        cmocka_unit_test(test_ngram_prefers_the_longest_context),
        cmocka_unit_test(test_ngram_picks_the_most_frequent_then_the_latest),
        cmocka_unit_test(test_ngram_searches_only_the_window),
        cmocka_unit_test(test_ngram_params_are_checked),
        cmocka_unit_test(test_ngram_matches_the_reference_on_random_sequences),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
