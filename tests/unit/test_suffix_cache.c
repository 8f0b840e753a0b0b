/* test_suffix_cache.c: the cross-request draft source
 * (common/speculation/suffix_cache.c): a stored request is continued where
 * it went; the longest match wins; the byte budget holds under a stream of
 * distinct requests, and every proposal is what followed its match in a
 * request that was added (a brute-force search); the least recently used
 * request is the one evicted, and never proposed again. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "error.h"
#include "suffix_cache.h"

static struct suffix_cache *make(size_t budget)
{
    struct suffix_cache *sc = NULL;
    char err[ERR_MSG_MAX];
    assert_int_equal(suffix_cache_create(&sc, budget, err), 0);
    return sc;
}

static void test_suffix_cache_continues_a_stored_request(void **state)
{
    (void)state;
    struct suffix_cache *sc = make(1 << 20);
    const int32_t req[12] = {10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21};
    assert_int_equal(suffix_cache_add(sc, req, 12), 0);
    assert_int_equal(suffix_cache_requests(sc), 1);
    /* the same prompt again: its first 6 tokens */
    int32_t out[8];
    int len = 0;
    assert_int_equal(suffix_cache_draft(sc, req, 6, 8, out, &len), 6);
    assert_memory_equal(out, &req[6], 6 * sizeof(int32_t));
    assert_int_equal(len, 6);
    assert_int_equal(suffix_cache_draft(sc, req, 6, 2, out, NULL), 2);
    /* fewer than the key, or a key never seen: nothing */
    assert_int_equal(suffix_cache_draft(sc, req, 3, 8, out, &len), 0);
    const int32_t other[5] = {1, 12, 13, 14, 99};
    assert_int_equal(suffix_cache_draft(sc, other, 5, 8, out, &len), 0);
    assert_int_equal(len, 0);
    /* the end of a stored request: no token after it */
    assert_int_equal(suffix_cache_draft(sc, req, 12, 8, out, NULL), 0);
    suffix_cache_destroy(sc);
}

/* Two stored requests share a key; the one matching further back wins. */
static void test_suffix_cache_prefers_the_longest_match(void **state)
{
    (void)state;
    struct suffix_cache *sc = make(1 << 20);
    const int32_t a[9] = {1, 2, 3, 50, 51, 52, 53, 70, 71};
    const int32_t b[9] = {9, 9, 3, 50, 51, 52, 53, 80, 81};
    assert_int_equal(suffix_cache_add(sc, a, 9), 0);
    assert_int_equal(suffix_cache_add(sc, b, 9), 0);
    const int32_t hist[7] = {1, 2, 3, 50, 51, 52, 53};
    int32_t out[2];
    int len = 0;
    assert_int_equal(suffix_cache_draft(sc, hist, 7, 2, out, &len), 2);
    assert_int_equal(out[0], 70);
    assert_int_equal(len, 7);
    const int32_t hist2[6] = {9, 3, 50, 51, 52, 53};
    assert_int_equal(suffix_cache_draft(sc, hist2, 6, 2, out, &len), 2);
    assert_int_equal(out[0], 80);
    assert_int_equal(len, 6);
    suffix_cache_destroy(sc);
}

static void test_suffix_cache_refuses_a_budget_too_small(void **state)
{
    (void)state;
    struct suffix_cache *sc = NULL;
    char err[ERR_MSG_MAX];
    assert_int_equal(suffix_cache_create(&sc, 100, err), ERR_INVALID_ARG);
    assert_null(sc);
    assert_non_null(strstr(err, "budget"));
}

static uint64_t next(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* Every request added, for the brute-force check. */
struct added {
    int32_t tok[2000][48];
    int n[2000];
};

/* A stream of distinct requests over a small alphabet (keys recur across
 * them) with a lookup after each: the bytes stay within the budget, old
 * requests are evicted, and every proposal is what followed its match in a
 * request that was added (ASan: nothing evicted is read). */
static void test_suffix_cache_stays_in_budget_under_a_stream(void **state)
{
    (void)state;
    const size_t budget = 48 * 1024;
    struct suffix_cache *sc = make(budget);
    static struct added all;
    uint64_t rng = 7;
    int drafted = 0;
    for (int r = 0; r < 2000; r++) {
        int32_t *req = all.tok[r];
        const int n = 8 + (int)(next(&rng) % 40);
        for (int i = 0; i < n; i++)
            req[i] = (int32_t)(next(&rng) % 6);
        all.n[r] = n;
        assert_int_equal(suffix_cache_add(sc, req, n), 0);
        assert_true(suffix_cache_bytes(sc) <= budget);
        int32_t hist[12], out[8];
        for (int i = 0; i < 12; i++)
            hist[i] = (int32_t)(next(&rng) % 6);
        int len = 0;
        const int k = suffix_cache_draft(sc, hist, 12, 8, out, &len);
        if (k == 0)
            continue;
        drafted++;
        assert_true(len >= SUFFIX_CACHE_KEY);
        bool found = false;
        for (int j = r; j >= 0 && !found; j--) {
            const int32_t *t = all.tok[j];
            for (int p = len; p + k <= all.n[j] && !found; p++)
                found = memcmp(&t[p - len], &hist[12 - len], (size_t)len * sizeof(int32_t)) == 0 &&
                        memcmp(&t[p], out, (size_t)k * sizeof(int32_t)) == 0;
        }
        if (!found)
            fail_msg("request %d: a proposal of %d tokens after a %d-token match is in no request", r, k, len);
    }
    assert_true(suffix_cache_evicted(sc) > 1000);
    assert_true(suffix_cache_requests(sc) < 100);
    assert_true(drafted > 100);
    suffix_cache_destroy(sc);
}

/* A request evicted (the least recently used) is never proposed again;
 * one matched meanwhile is kept (it became the most recently used). */
static void test_suffix_cache_evicts_the_least_recently_used(void **state)
{
    (void)state;
    const size_t budget = 24 * 1024;
    struct suffix_cache *sc = make(budget);
    const int32_t a[10] = {1000, 1001, 1002, 1003, 1004, 1005, 1006, 1007, 1008, 1009};
    const int32_t b[10] = {2000, 2001, 2002, 2003, 2004, 2005, 2006, 2007, 2008, 2009};
    assert_int_equal(suffix_cache_add(sc, a, 10), 0);
    assert_int_equal(suffix_cache_add(sc, b, 10), 0);
    int32_t out[4], filler[40];
    for (int r = 0; suffix_cache_evicted(sc) < 2; r++) {
        /* b is matched now and then: it stays */
        assert_int_equal(suffix_cache_draft(sc, b, 5, 4, out, NULL), 4);
        for (int i = 0; i < 40; i++)
            filler[i] = 3000 + r * 40 + i;
        assert_int_equal(suffix_cache_add(sc, filler, 40), 0);
        assert_true(r < 1000);
    }
    assert_int_equal(suffix_cache_draft(sc, a, 5, 4, out, NULL), 0);
    assert_int_equal(suffix_cache_draft(sc, b, 5, 4, out, NULL), 4);
    assert_int_equal(out[0], 2005);
    suffix_cache_destroy(sc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_suffix_cache_continues_a_stored_request),
        cmocka_unit_test(test_suffix_cache_prefers_the_longest_match),
        cmocka_unit_test(test_suffix_cache_refuses_a_budget_too_small),
        cmocka_unit_test(test_suffix_cache_stays_in_budget_under_a_stream),
        cmocka_unit_test(test_suffix_cache_evicts_the_least_recently_used),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
