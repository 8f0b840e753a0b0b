/* test_tree_choice.c: spec_tree "auto"'s measured choice between token
 * trees and chains (tree_choice.h). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <cmocka.h>

#include "tree_choice.h"

/* Feeds `rounds` rounds the choice asks for: a chain gives chain_tokens in
 * chain_ms, a tree tree_tokens in tree_ms. Returns the rounds sent as
 * trees. */
static int feed(struct tree_choice *tc, int rounds, int chain_tokens, double chain_ms, int tree_tokens,
                double tree_ms)
{
    int trees = 0;
    for (int r = 0; r < rounds; r++) {
        const bool tree = tree_choice_trees(tc);
        trees += tree;
        tree_choice_note(tc, tree, tree ? tree_tokens : chain_tokens, tree ? tree_ms : chain_ms);
    }
    return trees;
}

/* Chains first, then trees, each measured for 8 rounds; then trees where
 * they give more tokens per millisecond (4 in 12 ms against 2 in 10), with
 * chains tried again now and then. */
static void test_tree_choice_trees_where_they_pay(void **state)
{
    (void)state;
    struct tree_choice tc;
    tree_choice_init(&tc);
    assert_false(tree_choice_trees(&tc));
    assert_int_equal(feed(&tc, 8, 2, 10.0, 4, 12.0), 0);
    assert_int_equal(feed(&tc, 8, 2, 10.0, 4, 12.0), 8);
    const int trees = feed(&tc, 528, 2, 10.0, 4, 12.0);
    assert_true(trees >= 528 - 4 * 5);
    assert_true(trees < 528); /* chains were tried again */
}

/* Where a tree costs more than its extra tokens earn (the trained pair's
 * CPU target: 1.37 tokens in 1.6x the time of a chain's 1.17), chains;
 * trees are tried again for at most 4 rounds in 132. */
static void test_tree_choice_chains_where_trees_do_not_pay(void **state)
{
    (void)state;
    struct tree_choice tc;
    tree_choice_init(&tc);
    feed(&tc, 16, 2, 10.0, 3, 16.0);
    assert_false(tree_choice_trees(&tc));
    const int trees = feed(&tc, 528, 2, 10.0, 3, 16.0);
    assert_true(trees > 0);
    assert_true(trees <= 4 * 4);
}

/* A tie is the chain's; a round without a wall time teaches nothing. */
static void test_tree_choice_ties_and_unmeasured_rounds(void **state)
{
    (void)state;
    struct tree_choice tc;
    tree_choice_init(&tc);
    feed(&tc, 16, 2, 10.0, 2, 10.0);
    assert_false(tree_choice_trees(&tc));
    struct tree_choice fresh;
    tree_choice_init(&fresh);
    for (int i = 0; i < 20; i++)
        tree_choice_note(&fresh, false, 2, 0.0);
    assert_int_equal(fresh.rounds[0], 0);
    assert_false(tree_choice_trees(&fresh));
}

/* The costs move (the machine's load): a choice for trees turns to chains
 * once the retried chains are measured faster. */
static void test_tree_choice_follows_a_change_in_cost(void **state)
{
    (void)state;
    struct tree_choice tc;
    tree_choice_init(&tc);
    feed(&tc, 64, 2, 10.0, 4, 12.0);
    assert_true(tree_choice_trees(&tc));
    feed(&tc, 800, 2, 10.0, 4, 30.0);
    assert_false(tree_choice_trees(&tc));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tree_choice_trees_where_they_pay),
        cmocka_unit_test(test_tree_choice_chains_where_trees_do_not_pay),
        cmocka_unit_test(test_tree_choice_ties_and_unmeasured_rounds),
        cmocka_unit_test(test_tree_choice_follows_a_change_in_cost),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
