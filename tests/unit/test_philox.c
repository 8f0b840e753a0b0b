/* test_philox.c: Philox-4x32-10 known answers, the documented keyed-uniform
 * mapping, and statistical sanity of the uniforms. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cmocka.h>

#include "philox.h"
#include "stats_helpers.h"

static void check_kat(const uint32_t ctr[4], const uint32_t key[2], const uint32_t want[4])
{
    uint32_t got[4];
    philox4x32_10(ctr, key, got);
    for (int i = 0; i < 4; i++) {
        if (got[i] != want[i])
            print_error("word %d: got 0x%08x, want 0x%08x\n", i, got[i], want[i]);
        assert_int_equal(got[i], want[i]);
    }
}

/* Random123 tests/kat_vectors, philox4x32_10 lines. */
static void test_philox_matches_random123_known_answers(void **state)
{
    (void)state;
    const uint32_t c0[4] = {0, 0, 0, 0}, k0[2] = {0, 0};
    const uint32_t w0[4] = {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8};
    check_kat(c0, k0, w0);
    const uint32_t c1[4] = {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff};
    const uint32_t k1[2] = {0xffffffff, 0xffffffff};
    const uint32_t w1[4] = {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd};
    check_kat(c1, k1, w1);
    const uint32_t c2[4] = {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344};
    const uint32_t k2[2] = {0xa4093822, 0x299f31d0};
    const uint32_t w2[4] = {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1};
    check_kat(c2, k2, w2);
}

/* The mapping in philox.h, rebuilt by hand: key = seed halves, counter =
 * {pos lo, pos hi, stream, index/4}, word index%4, top 24 bits * 2^-24. */
static void test_philox_uniform_follows_documented_mapping(void **state)
{
    (void)state;
    const uint64_t seeds[] = {0, 1, 0x123456789abcdef0ull, UINT64_MAX};
    const uint64_t positions[] = {0, 7, 0xfffffffful, 0x100000000ull, 0xdeadbeefcafeull};
    const uint32_t streams[] = {PHILOX_STREAM_TARGET_SAMPLE, PHILOX_STREAM_TARGET_ACCEPT,
                                PHILOX_STREAM_DRAFT_SAMPLE};
    for (size_t a = 0; a < sizeof seeds / sizeof seeds[0]; a++)
        for (size_t b = 0; b < sizeof positions / sizeof positions[0]; b++)
            for (size_t s = 0; s < 3; s++)
                for (uint32_t index = 0; index < 9; index++) {
                    uint64_t seed = seeds[a], pos = positions[b];
                    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
                    uint32_t ctr[4] = {(uint32_t)pos, (uint32_t)(pos >> 32), streams[s],
                                       index / 4};
                    uint32_t out[4];
                    philox4x32_10(ctr, key, out);
                    double want = (double)(out[index % 4] >> 8) / 16777216.0;
                    float got = philox_uniform(seed, streams[s], pos, index);
                    assert_true((double)got == want);
                }
}

static void test_philox_streams_are_distinct(void **state)
{
    (void)state;
    assert_int_not_equal(PHILOX_STREAM_TARGET_SAMPLE, PHILOX_STREAM_TARGET_ACCEPT);
    assert_int_not_equal(PHILOX_STREAM_TARGET_SAMPLE, PHILOX_STREAM_DRAFT_SAMPLE);
    assert_int_not_equal(PHILOX_STREAM_TARGET_ACCEPT, PHILOX_STREAM_DRAFT_SAMPLE);
    /* Same (seed, position), different streams: different numbers (2^-24
     * chance of a coincidence per pair; these fixed inputs do not collide). */
    int equal = 0;
    for (uint64_t pos = 0; pos < 1000; pos++) {
        float a = philox_uniform(42, PHILOX_STREAM_TARGET_SAMPLE, pos, 0);
        float b = philox_uniform(42, PHILOX_STREAM_TARGET_ACCEPT, pos, 0);
        float c = philox_uniform(42, PHILOX_STREAM_DRAFT_SAMPLE, pos, 0);
        equal += (a == b) + (a == c) + (b == c);
    }
    assert_true(equal <= 1);
}

/* 2^20 draws: mean 1/2 and variance 1/12 within 6 standard errors (se of the
 * mean = sqrt(1/12/N) = 2.8e-4; of the variance = sqrt(1/180/N) = 7.3e-5), all
 * in [0,1); and a 64-bin histogram passes chi-square at alpha = 1e-4. */
static void test_philox_uniform_is_uniform_on_unit_interval(void **state)
{
    (void)state;
    enum { N = 1 << 20, BINS = 64 };
    static uint64_t counts[BINS];
    double sum = 0.0, sum2 = 0.0;
    for (int i = 0; i < BINS; i++)
        counts[i] = 0;
    for (uint64_t i = 0; i < N; i++) {
        /* Mix positions, seeds and streams the way Tandem uses them. */
        float u = philox_uniform(1000 + (i & 7), (uint32_t)(1 + (i >> 3) % 3), (i >> 3) / 3, 0);
        assert_true(u >= 0.0f && u < 1.0f);
        sum += u;
        sum2 += (double)u * u;
        counts[(int)(u * BINS)]++;
    }
    double mean = sum / N, var = sum2 / N - mean * mean;
    printf("philox uniform: mean %.6f (want 0.5), variance %.6f (want %.6f)\n", mean, var,
           1.0 / 12.0);
    assert_true(fabs(mean - 0.5) < 6.0 * sqrt(1.0 / 12.0 / N));
    assert_true(fabs(var - 1.0 / 12.0) < 6.0 * sqrt(1.0 / 180.0 / N));
    double expected[BINS];
    for (int i = 0; i < BINS; i++)
        expected[i] = (double)N / BINS;
    int df;
    double stat = chi_square_statistic(counts, expected, BINS, 5.0, &df);
    double crit = chi_square_critical(df, 1e-4);
    printf("philox uniform: chi-square %.2f, df %d, critical(1e-4) %.2f\n", stat, df, crit);
    assert_int_equal(df, BINS - 1);
    assert_true(stat <= crit);
}

/* The helpers themselves, against published chi-square table values. */
static void test_stats_helpers_match_chi_square_tables(void **state)
{
    (void)state;
    struct {
        int df;
        double alpha, want;
    } table[] = {
        {1, 0.05, 3.841459}, {2, 0.05, 5.991465}, {10, 0.01, 23.209251},
        {1, 0.001, 10.827566}, {30, 0.05, 43.772972}, {100, 0.05, 124.342113},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        double got = chi_square_critical(table[i].df, table[i].alpha);
        if (fabs(got - table[i].want) > 1e-5 * table[i].want)
            print_error("df %d alpha %g: got %.6f want %.6f\n", table[i].df, table[i].alpha, got,
                        table[i].want);
        assert_true(fabs(got - table[i].want) <= 1e-5 * table[i].want);
    }
    /* df = 2: the tail is exactly exp(-x/2). */
    assert_true(fabs(chi_square_p_value(9.0, 2) - exp(-4.5)) < 1e-12);
    /* Pooling: bins expecting < 5 join one pool; an impossible bin is infinite. */
    uint64_t obs[5] = {10, 10, 1, 2, 0};
    double exp_counts[5] = {10, 10, 2, 2, 0};
    int df;
    double stat = chi_square_statistic(obs, exp_counts, 5, 5.0, &df);
    /* Pool {1,2} expects 4 < 5: merged into bin 0 -> bins (13 vs 14), (10 vs 10). */
    assert_int_equal(df, 1);
    assert_true(fabs(stat - 1.0 / 14.0) < 1e-12);
    obs[4] = 1;
    stat = chi_square_statistic(obs, exp_counts, 5, 5.0, &df);
    assert_true(isinf(stat));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_philox_matches_random123_known_answers),
        cmocka_unit_test(test_philox_uniform_follows_documented_mapping),
        cmocka_unit_test(test_philox_streams_are_distinct),
        cmocka_unit_test(test_philox_uniform_is_uniform_on_unit_interval),
        cmocka_unit_test(test_stats_helpers_match_chi_square_tables),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
