/* stats_helpers.h: small statistics for goodness-of-fit tests (test code only).
 *
 * Pearson's chi-square statistic with pooling of sparse bins, and the
 * chi-square distribution's upper tail and critical values computed from the
 * regularized incomplete gamma function (series below a+1, Lentz continued
 * fraction above), accurate to ~1e-10 relative, far better than a table.
 *
 * Usage in a test (alpha is the false-failure rate of a correct sampler):
 *
 *     int df;
 *     double stat = chi_square_statistic(counts, expected, n, 5.0, &df);
 *     assert_true(df >= 1);
 *     assert_true(stat <= chi_square_critical(df, 1e-4));
 *
 * All functions are static inline: include this header from any test.
 * Not a library: no error codes; the inputs are the test's own numbers.
 */
#ifndef TANDEM_TESTS_STATS_HELPERS_H
#define TANDEM_TESTS_STATS_HELPERS_H

#include <math.h>
#include <stdint.h>

/* Regularized lower incomplete gamma P(a, x), a > 0, x >= 0. */
static inline double stats_gamma_p(double a, double x)
{
    if (x <= 0.0)
        return 0.0;
    double log_prefix = a * log(x) - x - lgamma(a);
    if (x < a + 1.0) {
        /* Series: P = e^-x x^a / Gamma(a+1) * sum x^n / ((a+1)...(a+n)). */
        double term = 1.0 / a, sum = term;
        for (int n = 1; n < 100000; n++) {
            term *= x / (a + n);
            sum += term;
            if (fabs(term) < fabs(sum) * 1e-16)
                break;
        }
        return sum * exp(log_prefix);
    }
    /* Continued fraction for Q = 1 - P (modified Lentz). */
    const double tiny = 1e-300;
    double b = x + 1.0 - a, c = 1.0 / tiny, d = 1.0 / b, h = d;
    for (int i = 1; i < 100000; i++) {
        double an = -i * (i - a);
        b += 2.0;
        d = an * d + b;
        if (fabs(d) < tiny)
            d = tiny;
        c = b + an / c;
        if (fabs(c) < tiny)
            c = tiny;
        d = 1.0 / d;
        double delta = d * c;
        h *= delta;
        if (fabs(delta - 1.0) < 1e-16)
            break;
    }
    return 1.0 - exp(log_prefix) * h;
}

/* Upper tail Q(a, x) = 1 - P(a, x), computed without cancellation when small. */
static inline double stats_gamma_q(double a, double x)
{
    if (x <= 0.0)
        return 1.0;
    if (x < a + 1.0)
        return 1.0 - stats_gamma_p(a, x);
    const double tiny = 1e-300;
    double b = x + 1.0 - a, c = 1.0 / tiny, d = 1.0 / b, h = d;
    for (int i = 1; i < 100000; i++) {
        double an = -i * (i - a);
        b += 2.0;
        d = an * d + b;
        if (fabs(d) < tiny)
            d = tiny;
        c = b + an / c;
        if (fabs(c) < tiny)
            c = tiny;
        d = 1.0 / d;
        double delta = d * c;
        h *= delta;
        if (fabs(delta - 1.0) < 1e-16)
            break;
    }
    return exp(a * log(x) - x - lgamma(a)) * h;
}

/* P(X >= stat) for X ~ chi-square(df): the p-value of a statistic. */
static inline double chi_square_p_value(double stat, int df)
{
    if (df < 1)
        return 1.0;
    if (isinf(stat))
        return 0.0;
    return stats_gamma_q(0.5 * df, 0.5 * stat);
}

/* The x with P(X >= x) = alpha for X ~ chi-square(df), df >= 1,
 * 0 < alpha < 1. Bisection on the upper tail, to ~1e-12 relative. */
static inline double chi_square_critical(int df, double alpha)
{
    double lo = 0.0, hi = (double)df + 10.0;
    while (chi_square_p_value(hi, df) > alpha)
        hi *= 2.0;
    for (int i = 0; i < 200 && hi - lo > 1e-12 * hi; i++) {
        double mid = 0.5 * (lo + hi);
        if (chi_square_p_value(mid, df) > alpha)
            lo = mid;
        else
            hi = mid;
    }
    return 0.5 * (lo + hi);
}

/* Pearson's statistic sum (O - E)^2 / E over n_bins bins.
 * observed: counts; expected: expected counts (n_samples * probability).
 * Bins with 0 < expected < min_expected are pooled into one bin; if that pool
 * still expects fewer than min_expected it is merged into the regular bin with
 * the smallest expectation (min_expected = 0 disables pooling). A bin with
 * expected == 0 but observed > 0 is an impossible outcome: returns INFINITY.
 * *df_out = (bins after pooling) - 1; a result with df < 1 tests nothing and
 * the caller must reject it. */
static inline double chi_square_statistic(const uint64_t *observed, const double *expected,
                                          int n_bins, double min_expected, int *df_out)
{
    double stat = 0.0, pool_o = 0.0, pool_e = 0.0;
    int n_regular = 0, smallest = -1;
    for (int i = 0; i < n_bins; i++) {
        if (expected[i] <= 0.0) {
            if (observed[i] > 0) {
                *df_out = n_bins > 1 ? n_bins - 1 : 1;
                return INFINITY;
            }
            continue;
        }
        if (expected[i] < min_expected) {
            pool_o += (double)observed[i];
            pool_e += expected[i];
            continue;
        }
        n_regular++;
        if (smallest < 0 || expected[i] < expected[smallest])
            smallest = i;
    }
    int merge_pool = pool_e > 0.0 && pool_e < min_expected && smallest >= 0;
    for (int i = 0; i < n_bins; i++) {
        if (expected[i] <= 0.0 || expected[i] < min_expected)
            continue;
        double o = (double)observed[i], e = expected[i];
        if (merge_pool && i == smallest) {
            o += pool_o;
            e += pool_e;
        }
        stat += (o - e) * (o - e) / e;
    }
    int n_eff = n_regular;
    if (pool_e > 0.0 && !merge_pool) {
        stat += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
        n_eff++;
    }
    *df_out = n_eff - 1;
    return stat;
}

#endif
