/* test_speculate_tree.c: the accept/reject walk over a tree of drafts
 * (speculate_tree.h). A tree that is a chain decides exactly as
 * speculate_verify; greedy follows the target's argmax down the tree; sampled
 * output is the target's distribution by chi-square (the first token against
 * the root's p, the second against the p of the token before it), with
 * children drawn from the same q, from different q and point masses mixed
 * under one root; the broken variant (children in a fixed order, p not
 * updated after a rejection) fails the same test; malformed trees are
 * refused by name. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "error.h"
#include "philox.h"
#include "sampling.h"
#include "speculate.h"
#include "speculate_tree.h"
#include "stats_helpers.h"

#define ALPHA 1e-4
#define MIN_EXPECTED 5.0
enum { V = 6, TRIALS = 40000 };

/* A distribution over V tokens that depends on the context alone (the
 * tokens before the position, as the target's rows do): siblings with the
 * same token get the same row, as in a real tree. Some tokens get nothing. */
static void context_row(const int32_t *ctx, int n_ctx, float *row)
{
    uint32_t h = 2166136261u;
    for (int i = 0; i < n_ctx; i++)
        h = (h ^ (uint32_t)ctx[i]) * 16777619u;
    double sum = 0.0;
    float w[V];
    for (int v = 0; v < V; v++) {
        h = h * 1664525u + 1013904223u;
        w[v] = (h >> 28) < 3 ? 0.0f : (float)((h >> 8) & 0xffff) / 65536.0f + 0.05f;
        sum += w[v];
    }
    for (int v = 0; v < V; v++)
        row[v] = (float)(w[v] / sum);
}

/* A tree's shape and proposals: parents, and per node either a q row it
 * is drawn from (q_of >= 0: one of the Q rows) or a fixed token. */
enum { Q = 2 };
static const float q_tab[Q][V] = {
    {0.40f, 0.05f, 0.05f, 0.30f, 0.10f, 0.10f},
    {0.05f, 0.50f, 0.05f, 0.05f, 0.05f, 0.30f},
};

struct shape {
    int n;
    int32_t parents[8];
    int q_of[8];       /* -1: a point mass at fixed[i] */
    int32_t fixed[8];
};

/* One trial: the drafts drawn (seeded by t, independent of the target's
 * streams), the target's rows computed for their contexts, the walk run.
 * Returns the number of tokens emitted (1 + accepted) into out. */
static int trial(const struct shape *sh, uint64_t t, enum speculate_tree_fault fault, int32_t *out)
{
    struct speculate_tree_input in = {.n = sh->n, .vocab = V, .seed = t, .position0 = 100, .fault = fault};
    int32_t tokens[8];
    const float *q_rows[8];
    float p_rows[9][V];
    int32_t ctx[8];
    context_row(ctx, 0, p_rows[0]);
    for (int i = 0; i < sh->n; i++) {
        if (sh->q_of[i] >= 0) {
            q_rows[i] = q_tab[sh->q_of[i]];
            tokens[i] = sampling_draw(q_rows[i], V, philox_uniform(t, PHILOX_STREAM_DRAFT_SAMPLE, 7, (uint32_t)i));
        } else {
            q_rows[i] = NULL;
            tokens[i] = sh->fixed[i];
        }
        /* the context of the row after node i: its path's tokens */
        int depth = 0;
        for (int a = i; a >= 0; a = sh->parents[a])
            depth++;
        int k = depth;
        for (int a = i; a >= 0; a = sh->parents[a])
            ctx[--k] = tokens[a];
        context_row(ctx, depth, p_rows[i + 1]);
    }
    in.tokens = tokens;
    in.parents = sh->parents;
    in.q_rows = q_rows;
    in.p_rows = &p_rows[0][0];
    float scratch[V];
    int32_t path[8];
    int n_acc = -1;
    char err[ERR_MSG_MAX];
    assert_int_equal(speculate_tree_verify(&in, scratch, out, path, &n_acc, err), 0);
    for (int d = 0; d < n_acc; d++)
        assert_int_equal(out[d], tokens[path[d]]);
    return n_acc + 1;
}

/* Chi-square of the first emitted token against the root's row and of the
 * second against the row after the first; the largest statistic over its
 * critical value (> 1: rejected at ALPHA). */
static double worst_ratio(const struct shape *sh, enum speculate_tree_fault fault, const char *name)
{
    uint64_t first[V] = {0}, second[V][V] = {{0}};
    for (uint64_t t = 1; t <= TRIALS; t++) {
        int32_t out[9];
        const int n = trial(sh, t, fault, out);
        first[out[0]]++;
        if (n >= 2)
            second[out[0]][out[1]]++;
    }
    double worst = 0.0;
    float row[V];
    double expected[V];
    context_row(NULL, 0, row);
    for (int x = -1; x < V; x++) {
        const uint64_t *obs = x < 0 ? first : second[x];
        uint64_t total = 0;
        for (int v = 0; v < V; v++)
            total += obs[v];
        if (total < 200)
            continue;
        if (x >= 0) {
            const int32_t ctx[1] = {x};
            context_row(ctx, 1, row);
        }
        for (int v = 0; v < V; v++)
            expected[v] = (double)row[v] * (double)total;
        int df = 0;
        const double stat = chi_square_statistic(obs, expected, V, MIN_EXPECTED, &df);
        assert_true(df >= 1);
        const double ratio = stat / chi_square_critical(df, ALPHA);
        printf("%s: %s (n %llu): chi-square %.2f, df %d, critical %.2f\n", name, x < 0 ? "first token" : "second",
               (unsigned long long)total, stat, df, chi_square_critical(df, ALPHA));
        if (ratio > worst)
            worst = ratio;
    }
    return worst;
}

/* Three children of the root drawn from one q (with replacement), one
 * point mass beside them, and a second level under two of them. */
static const struct shape mixed = {
    .n = 7,
    .parents = {-1, -1, -1, -1, 0, 0, 3},
    .q_of = {0, 0, 0, -1, 1, -1, 1},
    .fixed = {0, 0, 0, 3, 0, 2, 0},
};
/* Only point masses: an n-gram or suffix-cache tree. */
static const struct shape matched = {
    .n = 5,
    .parents = {-1, -1, -1, 1, 1},
    .q_of = {-1, -1, -1, -1, -1},
    .fixed = {3, 0, 5, 3, 4},
};

static void test_tree_sampled_output_is_the_targets(void **state)
{
    (void)state;
    assert_true(worst_ratio(&mixed, SPECULATE_TREE_FAULT_NONE, "mixed") <= 1.0);
    assert_true(worst_ratio(&matched, SPECULATE_TREE_FAULT_NONE, "matched") <= 1.0);
}

/* The same test catches a rule that tries the children in a fixed order
 * and does not take a rejected child's mass out of p. */
static void test_tree_broken_rule_fails_chi_square(void **state)
{
    (void)state;
    assert_true(worst_ratio(&mixed, SPECULATE_TREE_FAULT_FIXED_ORDER_NO_RESIDUAL, "broken mixed") > 1.0);
    assert_true(worst_ratio(&matched, SPECULATE_TREE_FAULT_FIXED_ORDER_NO_RESIDUAL, "broken matched") > 1.0);
}

/* A chain (one child a node) decides as speculate_verify does, both modes. */
static void test_tree_chain_equals_speculate_verify(void **state)
{
    (void)state;
    enum { K = 5 };
    for (int mode = 0; mode < 2; mode++) {
        for (uint64_t seed = 1; seed <= 3000; seed++) {
            float p_rows[K + 1][V], q_rows[K][V];
            int32_t drafts[K];
            const float *q_ptr[K];
            int32_t parents[K];
            for (int i = 0; i <= K; i++) {
                const int32_t ctx[2] = {(int32_t)seed, i};
                context_row(ctx, 2, p_rows[i]);
            }
            for (int i = 0; i < K; i++) {
                memcpy(q_rows[i], q_tab[i % Q], sizeof q_rows[i]);
                drafts[i] = sampling_draw(q_rows[i], V, philox_uniform(seed, PHILOX_STREAM_DRAFT_SAMPLE, 100 + i, 0));
                q_ptr[i] = mode == SPECULATE_MODE_SAMPLED ? q_rows[i] : NULL;
                parents[i] = i - 1;
            }
            struct speculate_input chain = {
                .k = K, .vocab = V, .draft_tokens = drafts, .q_rows = &q_rows[0][0], .p_rows = &p_rows[0][0],
                .mode = (enum speculate_mode)mode, .seed = seed, .position0 = 100};
            struct speculate_tree_input tree = {
                .n = K, .vocab = V, .tokens = drafts, .parents = parents, .q_rows = q_ptr,
                .p_rows = &p_rows[0][0], .seed = seed, .position0 = 100};
            float scratch[V];
            int32_t a[K + 1], b[K + 1];
            int na = -1, nb = -1;
            char err[ERR_MSG_MAX];
            assert_int_equal(speculate_verify(&chain, scratch, a, &na, err), 0);
            assert_int_equal(speculate_tree_verify(&tree, scratch, b, NULL, &nb, err), 0);
            assert_int_equal(na, nb);
            assert_memory_equal(a, b, (size_t)(na + 1) * sizeof a[0]);
        }
    }
}

/* Greedy: the child equal to the argmax is followed, wherever it stands
 * among its siblings; where none is, the argmax is the correction. */
static void test_tree_greedy_follows_the_argmax(void **state)
{
    (void)state;
    float p_rows[6][V] = {{0}};
    p_rows[0][2] = 1.0f; /* root: 2 */
    p_rows[3][4] = 1.0f; /* after node 2 (token 2): 4 */
    p_rows[5][1] = 1.0f; /* after node 4 (token 4): 1, no such child: correction */
    const int32_t tokens[5] = {0, 5, 2, 4, 4};
    const int32_t parents[5] = {-1, -1, -1, 0, 2};
    struct speculate_tree_input in = {.n = 5, .vocab = V, .tokens = tokens, .parents = parents,
                                      .p_rows = &p_rows[0][0], .greedy = 1};
    int32_t out[6], path[5];
    int n_acc = -1;
    char err[ERR_MSG_MAX];
    assert_int_equal(speculate_tree_verify(&in, NULL, out, path, &n_acc, err), 0);
    assert_int_equal(n_acc, 2);
    assert_int_equal(path[0], 2);
    assert_int_equal(path[1], 4);
    assert_int_equal(out[0], 2);
    assert_int_equal(out[1], 4);
    assert_int_equal(out[2], 1);
}

static void test_tree_refuses_malformed_trees(void **state)
{
    (void)state;
    float p_rows[3][V] = {{1.0f}, {1.0f}, {1.0f}};
    int32_t tokens[2] = {0, 1}, parents[2] = {-1, 1};
    struct speculate_tree_input in = {.n = 2, .vocab = V, .tokens = tokens, .parents = parents,
                                      .p_rows = &p_rows[0][0]};
    float scratch[V];
    int32_t out[3];
    int n_acc = 0;
    char err[ERR_MSG_MAX] = "";
    assert_int_equal(speculate_tree_verify(&in, scratch, out, NULL, &n_acc, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "node 1: parent 1"));
    parents[1] = 0;
    tokens[1] = V;
    assert_int_equal(speculate_tree_verify(&in, scratch, out, NULL, &n_acc, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "node 1: token"));
    tokens[1] = 1;
    in.n = SPECULATE_TREE_NODES_MAX + 1;
    assert_int_equal(speculate_tree_verify(&in, scratch, out, NULL, &n_acc, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "nodes"));
    in.n = 2;
    assert_int_equal(speculate_tree_verify(&in, NULL, out, NULL, &n_acc, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "scratch"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tree_chain_equals_speculate_verify),
        cmocka_unit_test(test_tree_greedy_follows_the_argmax),
        cmocka_unit_test(test_tree_sampled_output_is_the_targets),
        cmocka_unit_test(test_tree_broken_rule_fails_chi_square),
        cmocka_unit_test(test_tree_refuses_malformed_trees),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
