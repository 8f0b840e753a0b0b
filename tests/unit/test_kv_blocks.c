/* test_kv_blocks.c: the KV block ledger's invariant walker (kv_blocks_check).
 *
 * The walker is what guards the prefix cache against a silent slip (a
 * block left under a stale name maps KV another request overwrites), so it
 * is tested both ways: a long random sequence of the ledger's own
 * operations, the way llama.c calls them, keeps it clean at every step,
 * and each kind of corruption, made by hand on a healthy ledger, is
 * reported with the invariant it breaks named.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "kv_blocks.h"

#define BS 4
#define N_BLOCKS 12

static void assert_clean(const struct kv_blocks *kb, const char *when)
{
    char err[ERR_MSG_MAX] = "";
    int rc = kv_blocks_check(kb, err);
    if (rc)
        fail_msg("%s: %s", when, err);
}

static void assert_broken(const struct kv_blocks *kb, const char *want, const char *what)
{
    char err[ERR_MSG_MAX] = "";
    int rc = kv_blocks_check(kb, err);
    if (rc != ERR_INTERNAL || !strstr(err, want))
        fail_msg("%s: expected a report containing \"%s\", got rc %d \"%s\"", what, want, rc, err);
}

/* A ledger in every state: blocks 0-1 a held chain (published), block 2
 * held privately and part written, blocks 3-4 a cached chain, the rest
 * free. */
static void healthy(struct kv_blocks *kb)
{
    char err[ERR_MSG_MAX] = "";
    assert_int_equal(kv_blocks_init(kb, N_BLOCKS, BS, true, 0, err), 0);
    const int32_t a[2 * BS] = {1, 2, 3, 4, 5, 6, 7, 8};
    const int32_t c[2 * BS] = {9, 9, 9, 9, 8, 8, 8, 8};
    int32_t b0 = kv_blocks_take(kb), b1 = kv_blocks_take(kb), b2 = kv_blocks_take(kb);
    kv_blocks_set_tokens(kb, b0, 0, a, BS);
    kv_blocks_publish(kb, b0, -1);
    kv_blocks_set_tokens(kb, b1, 0, a + BS, BS);
    kv_blocks_publish(kb, b1, b0);
    kv_blocks_set_tokens(kb, b2, 0, a, 2);
    int32_t c0 = kv_blocks_take(kb), c1 = kv_blocks_take(kb);
    kv_blocks_set_tokens(kb, c0, 0, c, BS);
    kv_blocks_publish(kb, c0, -1);
    kv_blocks_set_tokens(kb, c1, 0, c + BS, BS);
    kv_blocks_publish(kb, c1, c0);
    kv_blocks_drop(kb, c1);
    kv_blocks_drop(kb, c0);
    assert_int_equal(kb->n_published, 4);
    assert_int_equal(kb->n_cached, 2);
    assert_clean(kb, "the healthy ledger");
}

/* Operations as llama.c makes them (take, fill, publish a full block under
 * the one before it, unpublish before a rewrite, drop, find, clear) on a
 * few sequences of tokens that share prefixes: the walker finds nothing,
 * and published blocks are found again. */
static void test_kv_blocks_check_clean_under_random_operations(void **state)
{
    (void)state;
    for (int cap = 0; cap <= 5; cap += 5) {
        struct kv_blocks kb;
        char err[ERR_MSG_MAX] = "";
        assert_int_equal(kv_blocks_init(&kb, N_BLOCKS, BS, true, cap, err), 0);
        /* three slots' tables, tokens from a small alphabet so names repeat */
        int32_t table[3][N_BLOCKS];
        int n_held[3] = {0, 0, 0};
        uint64_t x = 88172645463325252ull;
        int finds = 0;
        for (int step = 0; step < 4000; step++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            const int s = (int)(x % 3), op = (int)((x >> 8) % 5);
            int32_t toks[BS];
            for (int i = 0; i < BS; i++)
                toks[i] = (int32_t)((x >> (16 + 2 * i)) % 2);
            const int32_t parent = n_held[s] > 0 ? table[s][n_held[s] - 1] : -1;
            if (op <= 1 && n_held[s] < 4 && kv_blocks_available(&kb) > 0) {
                /* a full block computed and published */
                const int32_t b = kv_blocks_take(&kb);
                kv_blocks_set_tokens(&kb, b, 0, toks, BS);
                kv_blocks_publish(&kb, b, parent);
                table[s][n_held[s]++] = b;
            } else if (op == 2 && n_held[s] < 4) {
                /* a lookup, as a new prompt's mapping */
                const int32_t b = kv_blocks_find(&kb, parent, toks);
                if (b >= 0) {
                    table[s][n_held[s]++] = b;
                    finds++;
                }
            } else if (op == 3 && n_held[s] > 0) {
                /* a rollback into the last block: unpublished (one holder)
                 * and written again, or given back */
                const int32_t b = table[s][n_held[s] - 1];
                if (kb.refs[b] == 1) {
                    kv_blocks_unpublish(&kb, b);
                    kv_blocks_set_tokens(&kb, b, BS / 2, toks, BS / 2);
                    kv_blocks_publish(&kb, b, n_held[s] > 1 ? table[s][n_held[s] - 2] : -1);
                } else {
                    kv_blocks_drop(&kb, b);
                    n_held[s]--;
                }
            } else if (op == 4) {
                while (n_held[s] > 0)
                    kv_blocks_drop(&kb, table[s][--n_held[s]]);
                if ((x >> 40) % 7 == 0)
                    kv_blocks_clear_cached(&kb);
            }
            char when[64];
            snprintf(when, sizeof when, "cap %d, step %d (op %d)", cap, step, op);
            assert_clean(&kb, when);
        }
        assert_true(finds > 50);
        assert_true(kb.evictions > 0);
        kv_blocks_free(&kb);
    }
}

/* The bug the walker was written for: a block rolled back into without
 * being unpublished, written with other tokens, then let go and cleared. */
static void test_kv_blocks_check_reports_a_block_written_under_its_name(void **state)
{
    (void)state;
    struct kv_blocks kb;
    char err[ERR_MSG_MAX] = "";
    assert_int_equal(kv_blocks_init(&kb, N_BLOCKS, BS, true, 0, err), 0);
    const int32_t drafts[BS] = {5, 6, 7, 8}, accepted[BS] = {5, 6, 1, 2};
    const int32_t b = kv_blocks_take(&kb);
    kv_blocks_set_tokens(&kb, b, 0, drafts, BS);
    kv_blocks_publish(&kb, b, -1);
    assert_clean(&kb, "published");
    /* rollback to 2 positions, no unpublish, then two other tokens */
    kv_blocks_set_tokens(&kb, b, 2, accepted + 2, 2);
    assert_broken(&kb, "its tokens changed while published", "written under its old name");
    /* the same slip seen after the block went back and the cache was cleared */
    kv_blocks_drop(&kb, b);
    kv_blocks_clear_cached(&kb);
    assert_broken(&kb, "not published (a stale name)", "cleared with a stale name");
    kv_blocks_free(&kb);
}

/* Each corruption, made on a healthy ledger, named. */
static void test_kv_blocks_check_names_each_broken_invariant(void **state)
{
    (void)state;
    struct kv_blocks kb;

    healthy(&kb); /* a free block pushed twice */
    kb.free_stack[kb.n_free++] = kb.free_stack[0];
    assert_broken(&kb, "on the free stack twice", "double free");
    kv_blocks_free(&kb);

    healthy(&kb); /* a held block also on the free stack */
    kb.free_stack[kb.n_free++] = 0;
    assert_broken(&kb, "in no single state", "held and free");
    kv_blocks_free(&kb);

    healthy(&kb); /* a holder count off by one: the block looks free-ish */
    kb.refs[2] = 0;
    assert_broken(&kb, "in no single state", "held block with no holder");
    kv_blocks_free(&kb);

    healthy(&kb); /* a chain that loops */
    kb.chain[0] = 0;
    assert_broken(&kb, "loops", "chain cycle");
    kv_blocks_free(&kb);

    healthy(&kb); /* a published flag without a chain entry */
    kb.published[2] = true;
    assert_broken(&kb, "published but not chained", "published, unchained");
    kv_blocks_free(&kb);

    healthy(&kb); /* the published count drifted */
    kb.n_published--;
    assert_broken(&kb, "n_published", "count drift");
    kv_blocks_free(&kb);

    healthy(&kb); /* a cached block unlinked from the LRU list */
    kb.lru_head = kb.lru_next[kb.lru_head];
    kb.lru_prev[kb.lru_head] = -1;
    kb.n_cached--;
    assert_broken(&kb, "in no single state", "cached block lost from the LRU");
    kv_blocks_free(&kb);

    healthy(&kb); /* the LRU list's back links broken */
    kb.lru_prev[kb.lru_tail] = kb.lru_tail;
    assert_broken(&kb, "points back", "LRU back link");
    kv_blocks_free(&kb);

    healthy(&kb); /* two blocks under one name */
    {
        const int32_t a[BS] = {1, 2, 3, 4};
        const int32_t b = kv_blocks_take(&kb);
        kv_blocks_set_tokens(&kb, b, 0, a, BS);
        kb.parent[b] = -1;
        kb.parent_gen[b] = 0;
        kb.published[b] = true;
        kb.n_published++;
        /* chained in front of block 0 in the same bucket */
        for (uint32_t h = 0; h < kb.n_buckets; h++)
            for (int32_t o = kb.bucket[h]; o >= 0; o = kb.chain[o])
                if (o == 0) {
                    kb.chain[b] = kb.bucket[h];
                    kb.bucket[h] = b;
                    h = kb.n_buckets - 1;
                    break;
                }
        assert_broken(&kb, "under one name", "duplicate name");
    }
    kv_blocks_free(&kb);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kv_blocks_check_clean_under_random_operations),
        cmocka_unit_test(test_kv_blocks_check_reports_a_block_written_under_its_name),
        cmocka_unit_test(test_kv_blocks_check_names_each_broken_invariant),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
