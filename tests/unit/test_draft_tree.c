/* test_draft_tree.c: token trees of draft candidates (issue 61):
 * draft_tree.c's merging of chains (shared prefixes, weights, the node
 * budget, topological order), and the trees the suffix cache and the n-gram
 * source propose: each holds the chain its source proposes alone, every
 * root path is a continuation the source could have proposed (checked by a
 * brute-force search over random requests), and a second continuation seen
 * after the same context becomes a second branch. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "draft_tree.h"
#include "error.h"
#include "ngram.h"
#include "suffix_cache.h"

static uint64_t rng_next(uint64_t *x)
{
    *x = *x * 6364136223846793005ull + 1442695040888963407ull;
    return *x >> 33;
}

/* parents before children, every parent inside the tree, no two children
 * of one node with the same token, depth within depth_max */
static void assert_well_formed(const struct draft_tree *t, int nodes_max, int depth_max)
{
    assert_true(t->n >= 0 && t->n <= nodes_max);
    for (int i = 0; i < t->n; i++) {
        assert_true(t->parents[i] >= -1 && t->parents[i] < i);
        assert_true(t->weight[i] >= 1);
        assert_true(draft_tree_depth(t, i) <= depth_max);
        for (int j = i + 1; j < t->n; j++)
            if (t->parents[j] == t->parents[i])
                assert_int_not_equal(t->tokens[j], t->tokens[i]);
    }
}

/* The root path to node i into path; returns its length. */
static int path_to(const struct draft_tree *t, int i, int32_t *path)
{
    int32_t up[DRAFT_TREE_NODES_MAX];
    int d = 0;
    for (int v = i; v >= 0; v = t->parents[v])
        up[d++] = t->tokens[v];
    for (int j = 0; j < d; j++)
        path[j] = up[d - 1 - j];
    return d;
}

static void test_chains_share_prefixes_within_the_budget(void **state)
{
    (void)state;
    struct draft_tree t;
    draft_tree_clear(&t);
    const int32_t a[] = {5, 6, 7, 8}, b[] = {5, 6, 9}, c[] = {4, 6}, d[] = {5, 6, 7, 1, 2};
    assert_int_equal(draft_tree_add_chain(&t, a, 4, 1, 8), 4);
    assert_int_equal(draft_tree_add_chain(&t, b, 3, 1, 8), 3); /* one new node: 9 under 6 */
    assert_int_equal(t.n, 5);
    assert_int_equal(draft_tree_add_chain(&t, c, 2, 2, 8), 2);
    assert_int_equal(t.n, 7);
    /* the budget: 8 nodes, so only 1 of d's two new tokens fits */
    assert_int_equal(draft_tree_add_chain(&t, d, 5, 1, 8), 4);
    assert_int_equal(t.n, 8);
    assert_well_formed(&t, 8, 5);
    assert_int_equal(t.weight[0], 3); /* 5: a, b and d went through it */
    assert_int_equal(t.weight[1], 3); /* 6 under 5 */
    assert_int_equal(t.weight[5], 2); /* 4: c's weight */
    assert_int_equal(draft_tree_match(&t, a, 4), 4);
    assert_int_equal(draft_tree_match(&t, d, 5), 4);
    const int32_t miss[] = {5, 6, 3};
    assert_int_equal(draft_tree_match(&t, miss, 3), 2);
    assert_int_equal(draft_tree_match(&t, c, 2), 2);
    const int32_t none[] = {6};
    assert_int_equal(draft_tree_match(&t, none, 1), 0);
    /* a full tree still takes a chain it already holds */
    assert_int_equal(draft_tree_add_chain(&t, b, 3, 1, 8), 3);
    assert_int_equal(t.n, 8);
}

static struct suffix_cache *make_cache(void)
{
    struct suffix_cache *sc = NULL;
    char err[ERR_MSG_MAX];
    assert_int_equal(suffix_cache_create(&sc, (size_t)4 << 20, err), 0);
    return sc;
}

/* Two requests continue the same 4 tokens differently: the tree has both
 * branches, the newer (longer match first) as the chain suffix_cache_draft
 * proposes. */
static void test_suffix_tree_branches_where_requests_differ(void **state)
{
    (void)state;
    struct suffix_cache *sc = make_cache();
    const int32_t r1[] = {1, 2, 3, 4, 5, 10, 11, 12}, r2[] = {9, 2, 3, 4, 5, 20, 21, 22};
    assert_int_equal(suffix_cache_add(sc, r1, 8), 0);
    assert_int_equal(suffix_cache_add(sc, r2, 8), 0);
    const int32_t hist[] = {7, 2, 3, 4, 5};
    int32_t chain[8];
    int len = 0, len_tree = 0;
    const int k = suffix_cache_draft(sc, hist, 5, 8, chain, &len);
    struct draft_tree t;
    assert_int_equal(suffix_cache_draft_tree(sc, hist, 5, 8, 16, &t, &len_tree), 6);
    assert_int_equal(len_tree, len);
    assert_well_formed(&t, 16, 8);
    assert_int_equal(k, 3);
    assert_int_equal(chain[0], 20); /* equal matches: the newest request */
    assert_int_equal(draft_tree_match(&t, chain, k), k);
    assert_int_equal(t.tokens[0], 20); /* the chain is merged first */
    const int32_t other[] = {10, 11, 12};
    assert_int_equal(draft_tree_match(&t, other, 3), 3);
    /* a longer backward match wins the first place */
    const int32_t hist1[] = {1, 2, 3, 4, 5};
    assert_int_equal(suffix_cache_draft_tree(sc, hist1, 5, 8, 16, &t, &len_tree), 6);
    assert_int_equal(t.tokens[0], 10);
    assert_int_equal(len_tree, 5);
    /* a budget of 2 nodes: the first chain's first two tokens */
    assert_int_equal(suffix_cache_draft_tree(sc, hist1, 5, 8, 2, &t, NULL), 2);
    assert_int_equal(t.tokens[0], 10);
    assert_int_equal(t.tokens[1], 11);
    assert_int_equal(t.parents[1], 0);
    suffix_cache_destroy(sc);
}

/* Whether path[0..d) followed an occurrence of hist's last 4 tokens in one
 * of the requests. */
static bool stored_continuation(int32_t (*reqs)[40], int n_reqs, const int32_t *hist, int n_hist,
                                const int32_t *path, int d)
{
    for (int r = 0; r < n_reqs; r++)
        for (int i = 0; i + 4 + d <= 40; i++)
            if (!memcmp(&reqs[r][i], &hist[n_hist - 4], 4 * sizeof(int32_t)) &&
                !memcmp(&reqs[r][i + 4], path, (size_t)d * sizeof(int32_t)))
                return true;
    return false;
}

static void test_suffix_tree_paths_are_stored_continuations(void **state)
{
    (void)state;
    uint64_t x = 7;
    for (int trial = 0; trial < 200; trial++) {
        struct suffix_cache *sc = make_cache();
        int32_t reqs[12][40];
        const int n_reqs = 2 + (int)(rng_next(&x) % 10);
        for (int r = 0; r < n_reqs; r++) {
            for (int i = 0; i < 40; i++)
                reqs[r][i] = (int32_t)(rng_next(&x) % 4); /* few symbols: many matches */
            assert_int_equal(suffix_cache_add(sc, reqs[r], 40), 0);
        }
        int32_t hist[12];
        for (int i = 0; i < 12; i++)
            hist[i] = (int32_t)(rng_next(&x) % 4);
        const int depth = 1 + (int)(rng_next(&x) % 10), nodes = 1 + (int)(rng_next(&x) % 32);
        int32_t chain[16], path[DRAFT_TREE_NODES_MAX];
        const int k = suffix_cache_draft(sc, hist, 12, depth, chain, NULL);
        struct draft_tree t;
        suffix_cache_draft_tree(sc, hist, 12, depth, nodes, &t, NULL);
        assert_well_formed(&t, nodes, depth);
        assert_int_equal(draft_tree_match(&t, chain, k), k < nodes ? k : nodes);
        for (int i = 0; i < t.n; i++) {
            const int d = path_to(&t, i, path);
            if (!stored_continuation(reqs, n_reqs, hist, 12, path, d))
                fail_msg("trial %d: node %d's path of %d tokens follows no stored occurrence",
                         trial, i, d);
        }
        suffix_cache_destroy(sc);
    }
}

/* "1 2 X ... 1 2 Y ... 1 2": both X and Y hang under the root, X (twice
 * seen) first, as ngram_draft's chain; each branch continues. */
static void test_ngram_tree_takes_the_runner_up(void **state)
{
    (void)state;
    struct ngram_params p;
    ngram_params_default(&p);
    const int32_t hist[] = {1, 2, 30, 31, 5, 1, 2, 40, 41, 6, 1, 2, 30, 31, 7, 1, 2};
    const int n = (int)(sizeof hist / sizeof *hist);
    int32_t chain[8];
    const int k = ngram_draft(&p, hist, n, 4, chain);
    assert_true(k >= 2);
    assert_int_equal(chain[0], 30);
    struct draft_tree t;
    assert_true(ngram_draft_tree(&p, hist, n, 4, 16, 2, &t) > k);
    assert_well_formed(&t, 16, 4);
    assert_int_equal(draft_tree_match(&t, chain, k), k);
    const int32_t runner_up[] = {40, 41};
    assert_int_equal(draft_tree_match(&t, runner_up, 2), 2);
    /* branch 1 is the chain alone */
    assert_int_equal(ngram_draft_tree(&p, hist, n, 4, 16, 1, &t), k);
    /* the budget holds */
    assert_int_equal(ngram_draft_tree(&p, hist, n, 4, 3, 4, &t), 3);
    assert_well_formed(&t, 3, 4);
    /* nothing matches: an empty tree */
    const int32_t fresh[] = {100, 101, 102};
    assert_int_equal(ngram_draft_tree(&p, fresh, 3, 4, 16, 4, &t), 0);
}

/* Random histories: the tree holds ngram_draft's chain, and each node's
 * token is one ngram_draft could propose there as a top candidate of some
 * context order (checked as: the token followed an earlier occurrence of
 * the path's last n_min tokens before it). */
static void test_ngram_tree_paths_follow_occurrences(void **state)
{
    (void)state;
    struct ngram_params p;
    ngram_params_default(&p);
    uint64_t x = 11;
    for (int trial = 0; trial < 300; trial++) {
        int32_t seq[64 + DRAFT_TREE_NODES_MAX], chain[DRAFT_TREE_NODES_MAX];
        const int n = 8 + (int)(rng_next(&x) % 56);
        for (int i = 0; i < n; i++)
            seq[i] = (int32_t)(rng_next(&x) % 3);
        const int depth = 1 + (int)(rng_next(&x) % 8), nodes = 1 + (int)(rng_next(&x) % 32);
        const int branch = 1 + (int)(rng_next(&x) % 4);
        const int k = ngram_draft(&p, seq, n, depth, chain);
        struct draft_tree t;
        ngram_draft_tree(&p, seq, n, depth, nodes, branch, &t);
        assert_well_formed(&t, nodes, depth);
        assert_int_equal(draft_tree_match(&t, chain, k), k < nodes ? k : nodes);
        for (int i = 0; i < t.n; i++) {
            int32_t path[DRAFT_TREE_NODES_MAX];
            const int d = path_to(&t, i, path);
            memcpy(seq + n, path, (size_t)d * sizeof(int32_t));
            const int len = n + d - 1; /* the node's token at seq[len] */
            bool seen = false;
            for (int j = 0; j + p.n_min < len && !seen; j++)
                seen = !memcmp(&seq[j], &seq[len - p.n_min], (size_t)p.n_min * sizeof(int32_t)) &&
                       seq[j + p.n_min] == seq[len];
            if (!seen)
                fail_msg("trial %d: node %d (depth %d) follows no occurrence of its context", trial,
                         i, d);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chains_share_prefixes_within_the_budget),
        cmocka_unit_test(test_suffix_tree_branches_where_requests_differ),
        cmocka_unit_test(test_suffix_tree_paths_are_stored_continuations),
        cmocka_unit_test(test_ngram_tree_takes_the_runner_up),
        cmocka_unit_test(test_ngram_tree_paths_follow_occurrences),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
