/* test_sampling.c: sampling parameters, the adjusted distribution against a
 * plain full-sort reference, argmax, inverse-CDF draws, keyed sampling and its
 * distribution (chi-square). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "argmax.h"
#include "error.h"
#include "philox.h"
#include "sampling.h"
#include "stats_helpers.h"

/* ---- plain reference: full sort, then the rules of sampling.h ---- */

static const float *ref_sort_logits;

static int ref_order(const void *a, const void *b)
{
    int i = *(const int *)a, j = *(const int *)b;
    float li = ref_sort_logits[i], lj = ref_sort_logits[j];
    if (li != lj)
        return li > lj ? -1 : 1;
    return i < j ? -1 : 1;
}

/* probs[v] per the documented rules, computed the slow obvious way. */
static void reference_adjust(const struct sampling_params *p, const float *logits, int vocab,
                             float *probs)
{
    int *order = malloc((size_t)vocab * sizeof *order);
    float *e = malloc((size_t)vocab * sizeof *e);
    char *kept = calloc((size_t)vocab, 1);
    assert_non_null(order);
    assert_non_null(e);
    assert_non_null(kept);
    for (int v = 0; v < vocab; v++)
        order[v] = v;
    ref_sort_logits = logits;
    qsort(order, (size_t)vocab, sizeof *order, ref_order);
    for (int v = 0; v < vocab; v++)
        probs[v] = 0.0f;
    if (p->temperature == 0.0f) {
        probs[order[0]] = 1.0f;
        goto done;
    }
    float m = logits[order[0]];
    for (int v = 0; v < vocab; v++)
        e[v] = expf((logits[v] - m) / p->temperature);
    int n_kept = vocab;
    if (p->top_k > 0 && p->top_k < vocab)
        n_kept = p->top_k;
    if (p->top_p < 1.0f) {
        for (int r = 0; r < n_kept; r++)
            kept[order[r]] = 1;
        double s = 0.0;
        for (int v = 0; v < vocab; v++) /* index order, kept tokens only */
            if (kept[v])
                s += e[v];
        memset(kept, 0, (size_t)vocab);
        double cum = 0.0;
        for (int r = 0; r < n_kept; r++) {
            cum += e[order[r]];
            if (cum >= (double)p->top_p * s) {
                n_kept = r + 1;
                break;
            }
        }
    }
    for (int r = 0; r < n_kept; r++)
        kept[order[r]] = 1;
    for (int v = 0; v < vocab; v++)
        if (kept[v] && e[v] < p->min_p)
            kept[v] = 0;
    double total = 0.0;
    for (int v = 0; v < vocab; v++)
        if (kept[v])
            total += e[v];
    for (int v = 0; v < vocab; v++)
        probs[v] = kept[v] ? (float)(e[v] / total) : 0.0f;
done:
    free(order);
    free(e);
    free(kept);
}

static struct sampling_params params(float t, int k, float top_p, float min_p)
{
    struct sampling_params p;
    sampling_params_default(&p);
    p.temperature = t;
    p.top_k = k;
    p.top_p = top_p;
    p.min_p = min_p;
    return p;
}

static void adjust_ok(const struct sampling_params *p, const float *logits, int vocab,
                      float *probs)
{
    struct sampling_workspace *ws = NULL;
    char err[ERR_MSG_MAX] = "";
    assert_int_equal(sampling_workspace_create(&ws, vocab, err), 0);
    int rc = sampling_adjust(ws, p, logits, vocab, probs, err);
    if (rc)
        print_error("sampling_adjust: %s\n", err);
    assert_int_equal(rc, 0);
    sampling_workspace_destroy(ws);
}

/* ---- parameters ---- */

static void test_sampling_defaults_are_greedy_and_valid(void **state)
{
    (void)state;
    struct sampling_params p;
    memset(&p, 0xff, sizeof p);
    sampling_params_default(&p);
    assert_true(p.temperature == 0.0f);
    assert_int_equal(p.top_k, 0);
    assert_true(p.top_p == 1.0f);
    assert_true(p.min_p == 0.0f);
    assert_true(p.seed == 0);
    assert_true(sampling_params_is_greedy(&p));
    assert_int_equal(sampling_params_validate(&p, NULL), 0);
}

static void expect_invalid(struct sampling_params p, const char *needle1, const char *needle2)
{
    char err[ERR_MSG_MAX] = "";
    assert_int_equal(sampling_params_validate(&p, err), ERR_INVALID_ARG);
    if (!strstr(err, needle1) || !strstr(err, needle2))
        print_error("message '%s' lacks '%s' or '%s'\n", err, needle1, needle2);
    assert_non_null(strstr(err, needle1));
    assert_non_null(strstr(err, needle2));
}

static void test_sampling_validate_names_the_bad_field(void **state)
{
    (void)state;
    expect_invalid(params(-1.0f, 0, 1.0f, 0.0f), "temperature:", "got -1");
    expect_invalid(params(NAN, 0, 1.0f, 0.0f), "temperature:", "nan");
    expect_invalid(params(INFINITY, 0, 1.0f, 0.0f), "temperature:", "inf");
    expect_invalid(params(1.0f, -3, 1.0f, 0.0f), "top_k:", "got -3");
    expect_invalid(params(1.0f, 0, 0.0f, 0.0f), "top_p:", "got 0");
    expect_invalid(params(1.0f, 0, 1.5f, 0.0f), "top_p:", "got 1.5");
    expect_invalid(params(1.0f, 0, NAN, 0.0f), "top_p:", "nan");
    expect_invalid(params(1.0f, 0, 1.0f, -0.25f), "min_p:", "got -0.25");
    expect_invalid(params(1.0f, 0, 1.0f, 2.0f), "min_p:", "got 2");
    expect_invalid(params(1.0f, 0, 1.0f, NAN), "min_p:", "nan");
    /* Boundaries that are valid. */
    struct sampling_params ok = params(0.0f, 0, 1.0f, 1.0f);
    assert_int_equal(sampling_params_validate(&ok, NULL), 0);
    ok = params(2.0f, 100000, 1e-6f, 0.0f);
    assert_int_equal(sampling_params_validate(&ok, NULL), 0);
    assert_false(sampling_params_is_greedy(&ok));
    /* sampling_adjust refuses invalid params too. */
    struct sampling_params bad = params(-1.0f, 0, 1.0f, 0.0f);
    float logits[2] = {0, 1}, probs[2];
    struct sampling_workspace *ws = NULL;
    assert_int_equal(sampling_workspace_create(&ws, 2, NULL), 0);
    assert_int_equal(sampling_adjust(ws, &bad, logits, 2, probs, NULL), ERR_INVALID_ARG);
    sampling_workspace_destroy(ws);
    assert_int_equal(sampling_workspace_create(&ws, 0, NULL), ERR_INVALID_ARG);
    assert_null(ws);
    sampling_workspace_destroy(NULL);
}

/* ---- argmax and draw ---- */

static void test_argmax_f32_picks_lowest_index_and_skips_nan(void **state)
{
    (void)state;
    float a[6] = {1, 3, 2, 3, 3, -1};
    assert_int_equal(argmax_f32(a, 6), 1);
    float b[4] = {NAN, -INFINITY, NAN, -INFINITY};
    assert_int_equal(argmax_f32(b, 4), 1);
    float c[3] = {NAN, 0.5f, NAN};
    assert_int_equal(argmax_f32(c, 3), 1);
    float d[2] = {NAN, NAN};
    assert_int_equal(argmax_f32(d, 2), -1);
    assert_int_equal(argmax_f32(a, 0), -1);
}

static void test_sampling_draw_inverts_the_cdf_and_skips_zeros(void **state)
{
    (void)state;
    const float p[5] = {0.0f, 0.25f, 0.0f, 0.25f, 0.5f};
    assert_int_equal(sampling_draw(p, 5, 0.0f), 1);
    assert_int_equal(sampling_draw(p, 5, 0.24f), 1);
    assert_int_equal(sampling_draw(p, 5, 0.25f), 3); /* running sum must exceed u */
    assert_int_equal(sampling_draw(p, 5, 0.49f), 3);
    assert_int_equal(sampling_draw(p, 5, 0.5f), 4);
    assert_int_equal(sampling_draw(p, 5, 0.99999994f), 4);
    /* Unnormalised input is scaled by its sum. */
    const float q[3] = {2.0f, 0.0f, 6.0f};
    assert_int_equal(sampling_draw(q, 3, 0.2499f), 0);
    assert_int_equal(sampling_draw(q, 3, 0.25f), 2);
    /* Trailing zeros are never returned, even at u just below 1. */
    const float r[4] = {0.3f, 0.7f, 0.0f, 0.0f};
    assert_int_equal(sampling_draw(r, 4, 0.99999994f), 1);
    /* A mass below double rounding of the total is never reached; no zero either. */
    const float s[4] = {1.0f, 1e-30f, 0.0f, -1.0f};
    assert_int_equal(sampling_draw(s, 4, 0.99999994f), 0);
    const float nan_row[3] = {NAN, 0.0f, 1.0f};
    assert_int_equal(sampling_draw(nan_row, 3, 0.0f), 2);
    const float zero[3] = {0, 0, 0};
    assert_int_equal(sampling_draw(zero, 3, 0.5f), -1);
    assert_int_equal(sampling_draw(zero, 0, 0.5f), -1);
}

/* ---- the adjusted distribution ---- */

static void test_sampling_greedy_is_one_hot_at_first_max(void **state)
{
    (void)state;
    const float logits[5] = {0.5f, 2.0f, -INFINITY, 2.0f, 1.0f};
    float probs[5];
    struct sampling_params p = params(0.0f, 2, 0.3f, 0.5f); /* filters ignored */
    adjust_ok(&p, logits, 5, probs);
    for (int v = 0; v < 5; v++)
        assert_true(probs[v] == (v == 1 ? 1.0f : 0.0f));
}

static void test_sampling_temperature_scales_softmax(void **state)
{
    (void)state;
    const float logits[4] = {1.0f, 2.0f, 3.0f, -INFINITY};
    float probs[4];
    const float temps[3] = {1.0f, 0.5f, 2.0f};
    for (int t = 0; t < 3; t++) {
        struct sampling_params p = params(temps[t], 0, 1.0f, 0.0f);
        adjust_ok(&p, logits, 4, probs);
        double z = 0.0;
        for (int v = 0; v < 3; v++)
            z += exp(logits[v] / temps[t]);
        for (int v = 0; v < 3; v++)
            assert_true(fabs(probs[v] - exp(logits[v] / temps[t]) / z) < 1e-6);
        assert_true(probs[3] == 0.0f);
    }
}

/* softmax(1,2,3,4) = 0.0321, 0.0871, 0.2369, 0.6439 (computed by hand). */
static void test_sampling_filters_on_hand_examples(void **state)
{
    (void)state;
    const float logits[4] = {1.0f, 2.0f, 3.0f, 4.0f};
    float probs[4];
    struct sampling_params p = params(1.0f, 0, 0.5f, 0.0f); /* 0.644 >= 0.5 */
    adjust_ok(&p, logits, 4, probs);
    assert_true(probs[3] == 1.0f && probs[0] == 0.0f && probs[1] == 0.0f && probs[2] == 0.0f);
    p = params(1.0f, 0, 0.7f, 0.0f); /* 0.644 < 0.7 <= 0.881 */
    adjust_ok(&p, logits, 4, probs);
    assert_true(probs[0] == 0.0f && probs[1] == 0.0f);
    assert_true(fabs(probs[2] - 0.2689414) < 1e-6 && fabs(probs[3] - 0.7310586) < 1e-6);
    p = params(1.0f, 3, 1.0f, 0.0f); /* top-3 of 4 */
    adjust_ok(&p, logits, 4, probs);
    assert_true(probs[0] == 0.0f);
    assert_true(fabs(probs[1] - 0.0900306) < 1e-6 && fabs(probs[3] - 0.6652410) < 1e-6);
    p = params(1.0f, 0, 1.0f, 0.2f); /* e = .050 .135 .368 1: min_p 0.2 keeps 2 and 3 */
    adjust_ok(&p, logits, 4, probs);
    assert_true(probs[0] == 0.0f && probs[1] == 0.0f && probs[2] > 0.0f && probs[3] > 0.0f);
    p = params(1.0f, 2, 0.99f, 0.5f); /* top-2 {2,3}, top-p keeps both, min_p drops 2 */
    adjust_ok(&p, logits, 4, probs);
    assert_true(probs[3] == 1.0f && probs[2] == 0.0f);
    /* top_k >= vocab is off. */
    p = params(1.0f, 4, 1.0f, 0.0f);
    adjust_ok(&p, logits, 4, probs);
    assert_true(probs[0] > 0.03f);
    p = params(1.0f, 100, 1.0f, 0.0f);
    adjust_ok(&p, logits, 4, probs);
    assert_true(probs[0] > 0.03f);
}

static void test_sampling_ties_break_toward_lower_index(void **state)
{
    (void)state;
    const float flat[6] = {0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f};
    float probs[6];
    struct sampling_params p = params(1.0f, 3, 1.0f, 0.0f);
    adjust_ok(&p, flat, 6, probs);
    for (int v = 0; v < 6; v++)
        assert_true(fabs(probs[v] - (v < 3 ? 1.0f / 3 : 0.0f)) < 1e-7);
    p = params(1.0f, 0, 0.5f, 0.0f); /* running sums 1/6, 2/6, 3/6 >= 1/2 */
    adjust_ok(&p, flat, 6, probs);
    for (int v = 0; v < 6; v++)
        assert_true(fabs(probs[v] - (v < 3 ? 1.0f / 3 : 0.0f)) < 1e-7);
    /* Tie at the top-k boundary: {5, 9, 9, 9, 1}, k = 2 keeps 1 and 2. */
    const float b[5] = {5, 9, 9, 9, 1};
    p = params(1.0f, 2, 1.0f, 0.0f);
    adjust_ok(&p, b, 5, probs);
    assert_true(probs[1] == 0.5f && probs[2] == 0.5f && probs[3] == 0.0f);
}

static void test_sampling_top_p_keeps_at_least_one_token(void **state)
{
    (void)state;
    const float logits[5] = {0.1f, 0.2f, 0.3f, 0.0f, 0.29f};
    float probs[5];
    struct sampling_params p = params(1.0f, 0, 1e-7f, 0.0f);
    adjust_ok(&p, logits, 5, probs);
    for (int v = 0; v < 5; v++)
        assert_true(probs[v] == (v == 2 ? 1.0f : 0.0f));
    p = params(1.0f, 0, 1.0f, 1.0f); /* min_p 1 keeps the max only */
    adjust_ok(&p, logits, 5, probs);
    assert_true(probs[2] == 1.0f);
}

static void fill_logits(float *logits, int vocab, uint64_t seed, int quantised, int masked)
{
    for (int v = 0; v < vocab; v++) {
        float u1 = philox_uniform(seed, 7, (uint64_t)v, 0);
        float u2 = philox_uniform(seed, 7, (uint64_t)v, 1);
        /* Heavy-ish tail like real logits: a few large values. */
        float x = 8.0f * u1 - 4.0f + (u2 > 0.999f ? 12.0f * u2 : 0.0f);
        if (quantised)
            x = roundf(x * 2.0f) / 2.0f; /* many exact ties */
        if (masked && u2 < 0.1f)
            x = -INFINITY;
        logits[v] = x;
    }
}

static void compare_with_reference(const struct sampling_params *p, const float *logits,
                                   int vocab, struct sampling_workspace *ws, float *got,
                                   float *want)
{
    char err[ERR_MSG_MAX] = "";
    int rc = sampling_adjust(ws, p, logits, vocab, got, err);
    if (rc)
        print_error("%s\n", err);
    assert_int_equal(rc, 0);
    reference_adjust(p, logits, vocab, want);
    int bad = 0;
    double sum = 0.0;
    for (int v = 0; v < vocab; v++) {
        sum += got[v];
        int differ = (got[v] == 0.0f) != (want[v] == 0.0f) ||
                     fabsf(got[v] - want[v]) > 1e-6f * want[v] + 1e-12f;
        if (differ && bad++ < 5)
            print_error("T %g k %d top_p %g min_p %g vocab %d: probs[%d] = %g, reference %g\n",
                        (double)p->temperature, p->top_k, (double)p->top_p, (double)p->min_p,
                        vocab, v, (double)got[v], (double)want[v]);
    }
    assert_int_equal(bad, 0);
    assert_true(fabs(sum - 1.0) < 1e-4);
}

static void test_sampling_matches_full_sort_reference(void **state)
{
    (void)state;
    const struct sampling_params cases[] = {
        params(1.0f, 0, 1.0f, 0.0f),  params(0.7f, 40, 1.0f, 0.0f), params(1.0f, 1, 1.0f, 0.0f),
        params(1.0f, 0, 0.9f, 0.0f),  params(1.3f, 0, 0.5f, 0.0f),  params(1.0f, 50, 0.9f, 0.0f),
        params(0.8f, 0, 1.0f, 0.05f), params(1.0f, 20, 0.95f, 0.1f), params(0.0f, 0, 1.0f, 0.0f),
        params(5.0f, 0, 0.999f, 0.0f), params(1.0f, 999, 0.3f, 0.0f),
        params(1.0f, 2000, 1.0f, 0.0f), params(0.9f, 3000, 0.8f, 0.02f), /* quickselect */
    };
    const int vocabs[2] = {1000, 4099};
    int vmax = 4099;
    float *logits = malloc(vmax * sizeof *logits), *got = malloc(vmax * sizeof *got),
          *want = malloc(vmax * sizeof *want);
    assert_non_null(logits);
    assert_non_null(got);
    assert_non_null(want);
    struct sampling_workspace *ws = NULL;
    assert_int_equal(sampling_workspace_create(&ws, vmax, NULL), 0);
    for (int vi = 0; vi < 2; vi++)
        for (int variant = 0; variant < 4; variant++) {
            fill_logits(logits, vocabs[vi], 100 + variant, variant & 1, variant & 2);
            for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
                compare_with_reference(&cases[c], logits, vocabs[vi], ws, got, want);
        }
    sampling_workspace_destroy(ws);
    free(logits);
    free(got);
    free(want);
}

static void test_sampling_rejects_bad_logits_and_sizes(void **state)
{
    (void)state;
    struct sampling_workspace *ws = NULL;
    assert_int_equal(sampling_workspace_create(&ws, 4, NULL), 0);
    struct sampling_params p = params(1.0f, 0, 1.0f, 0.0f);
    float probs[8], logits[4] = {0.0f, NAN, 1.0f, 2.0f};
    char err[ERR_MSG_MAX] = "";
    assert_int_equal(sampling_adjust(ws, &p, logits, 4, probs, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "logits[1]"));
    logits[1] = INFINITY;
    assert_int_equal(sampling_adjust(ws, &p, logits, 4, probs, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "+inf"));
    for (int v = 0; v < 4; v++)
        logits[v] = -INFINITY;
    assert_int_equal(sampling_adjust(ws, &p, logits, 4, probs, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "-inf"));
    float big[8] = {0};
    assert_int_equal(sampling_adjust(ws, &p, big, 8, probs, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "vocab"));
    assert_int_equal(sampling_adjust(ws, &p, big, 0, probs, err), ERR_INVALID_ARG);
    /* A single finite logit among masks gets all the mass. */
    logits[2] = -3.0f;
    assert_int_equal(sampling_adjust(ws, &p, logits, 4, probs, err), 0);
    assert_true(probs[2] == 1.0f && probs[0] == 0.0f);
    sampling_workspace_destroy(ws);
}

/* ---- keyed sampling ---- */

static void test_sampling_sample_is_keyed_and_reproducible(void **state)
{
    (void)state;
    enum { V = 64 };
    float logits[V], probs[V];
    fill_logits(logits, V, 5, 0, 0);
    struct sampling_workspace *ws = NULL;
    assert_int_equal(sampling_workspace_create(&ws, V, NULL), 0);
    struct sampling_params p = params(1.0f, 0, 1.0f, 0.0f);
    p.seed = 0xabcdef;
    int32_t a, b;
    int differ_pos = 0, differ_seed = 0, differ_stream = 0;
    for (uint64_t pos = 0; pos < 200; pos++) {
        assert_int_equal(sampling_sample(ws, &p, logits, V, PHILOX_STREAM_TARGET_SAMPLE, pos,
                                         probs, &a, NULL), 0);
        assert_int_equal(sampling_sample(ws, &p, logits, V, PHILOX_STREAM_TARGET_SAMPLE, pos,
                                         probs, &b, NULL), 0);
        assert_int_equal(a, b);
        /* The drawn token is the documented inverse-CDF of the keyed uniform. */
        float u = philox_uniform(p.seed, PHILOX_STREAM_TARGET_SAMPLE, pos, 0);
        assert_int_equal(a, sampling_draw(probs, V, u));
        if (pos > 0) {
            int32_t prev;
            assert_int_equal(sampling_sample(ws, &p, logits, V, PHILOX_STREAM_TARGET_SAMPLE,
                                             pos - 1, probs, &prev, NULL), 0);
            differ_pos += prev != a;
        }
        assert_int_equal(sampling_sample(ws, &p, logits, V, PHILOX_STREAM_DRAFT_SAMPLE, pos,
                                         probs, &b, NULL), 0);
        differ_stream += a != b;
        struct sampling_params p2 = p;
        p2.seed = p.seed + 1;
        assert_int_equal(sampling_sample(ws, &p2, logits, V, PHILOX_STREAM_TARGET_SAMPLE, pos,
                                         probs, &b, NULL), 0);
        differ_seed += a != b;
    }
    assert_true(differ_pos > 100 && differ_stream > 100 && differ_seed > 100);
    /* Greedy ignores the uniform. */
    p.temperature = 0.0f;
    assert_int_equal(sampling_sample(ws, &p, logits, V, 1, 3, probs, &a, NULL), 0);
    assert_int_equal(a, argmax_f32(logits, V));
    sampling_workspace_destroy(ws);
}

/* Tokens drawn at N = 50,000 positions with a fixed seed, V = 12 (with a
 * top-k cut and -inf masks), against the adjusted probabilities: Pearson
 * chi-square, bins expecting < 5 pooled, alpha = 1e-4 (a correct sampler
 * fails about 1 run in 10,000; the seed is fixed so the outcome is fixed). */
static void test_sampling_sample_distribution_passes_chi_square(void **state)
{
    (void)state;
    enum { V = 12, N = 50000 };
    const float logits[V] = {1.0f, 0.5f, -INFINITY, 2.0f, 0.0f, -1.0f,
                             1.5f, -2.5f, 0.7f,      -INFINITY, 3.0f, -0.3f};
    struct sampling_params p = params(0.9f, 9, 1.0f, 0.0f);
    p.seed = 20240601;
    float probs[V];
    uint64_t counts[V] = {0};
    struct sampling_workspace *ws = NULL;
    assert_int_equal(sampling_workspace_create(&ws, V, NULL), 0);
    for (uint64_t pos = 0; pos < N; pos++) {
        int32_t tok;
        assert_int_equal(sampling_sample(ws, &p, logits, V, PHILOX_STREAM_TARGET_SAMPLE, pos,
                                         probs, &tok, NULL), 0);
        assert_true(tok >= 0 && tok < V);
        counts[tok]++;
    }
    double expected[V];
    for (int v = 0; v < V; v++)
        expected[v] = N * (double)probs[v];
    int df;
    double stat = chi_square_statistic(counts, expected, V, 5.0, &df);
    double crit = chi_square_critical(df, 1e-4);
    printf("sampling chi-square: %.2f, df %d, critical(1e-4) %.2f\n", stat, df, crit);
    assert_true(df >= 5);
    assert_true(stat <= crit);
    sampling_workspace_destroy(ws);
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Llama-3 vocab: prints the time per call of each mode (figures for the
 * report; not asserted, timing under sanitizers is meaningless) and checks
 * the fast paths against the reference on this size too. */
static void test_sampling_adjust_at_llama3_vocab(void **state)
{
    (void)state;
    enum { V = 128256 };
    float *logits = malloc(V * sizeof *logits), *got = malloc(V * sizeof *got),
          *want = malloc(V * sizeof *want);
    assert_non_null(logits);
    assert_non_null(got);
    assert_non_null(want);
    fill_logits(logits, V, 77, 0, 0);
    struct sampling_workspace *ws = NULL;
    assert_int_equal(sampling_workspace_create(&ws, V, NULL), 0);
    const struct sampling_params cases[] = {
        params(0.0f, 0, 1.0f, 0.0f), params(1.0f, 0, 1.0f, 0.0f),  params(0.7f, 50, 1.0f, 0.0f),
        params(0.7f, 0, 0.9f, 0.0f), params(0.7f, 50, 0.9f, 0.0f), params(1.0f, 0, 1.0f, 0.05f),
        params(1.0f, 5000, 0.95f, 0.0f),
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int reps = 20;
        double t0 = now_ms();
        for (int r = 0; r < reps; r++)
            assert_int_equal(sampling_adjust(ws, &cases[c], logits, V, got, NULL), 0);
        double ms = (now_ms() - t0) / reps;
        printf("sampling_adjust V=%d T=%g top_k=%d top_p=%g min_p=%g: %.3f ms/call\n", V,
               (double)cases[c].temperature, cases[c].top_k, (double)cases[c].top_p,
               (double)cases[c].min_p, ms);
        compare_with_reference(&cases[c], logits, V, ws, got, want);
    }
    sampling_workspace_destroy(ws);
    free(logits);
    free(got);
    free(want);
}

/* Raw log-softmax against a plain reference in long double, ties in the
 * top list toward the lower index, the count clamped to the vocabulary. */
static void test_sampling_logprobs_are_raw_log_softmax(void **state)
{
    (void)state;
    const float logits[6] = {2.0f, -1.0f, 3.5f, 3.5f, 0.25f, -40.0f};
    long double m = 3.5L, total = 0;
    for (int v = 0; v < 6; v++)
        total += expl((long double)logits[v] - m);
    struct sampling_logprobs lp;
    char err[ERR_MSG_MAX] = "";
    assert_int_equal(sampling_logprobs(logits, 6, 4, 4, &lp, err), 0);
    const double want4 = (double)(((long double)logits[4] - m) - logl(total));
    assert_true(fabs(lp.logprob - want4) <= 1e-6 * fabs(want4));
    assert_int_equal(lp.n_top, 4);
    const int32_t order[4] = {2, 3, 0, 4};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(lp.top_ids[i], order[i]);
        const double want = (double)(((long double)logits[order[i]] - m) - logl(total));
        assert_true(fabs(lp.top_logprobs[i] - want) <= 1e-6 * (1 + fabs(want)));
    }
    assert_true(lp.top_logprobs[0] == lp.top_logprobs[1]); /* a tie, the same number */
    assert_int_equal(sampling_logprobs(logits, 6, 0, 99, &lp, err), 0);
    assert_int_equal(lp.n_top, 6);                         /* clamped to the vocabulary */
    assert_int_equal(lp.top_ids[5], 5);
    assert_int_equal(sampling_logprobs(logits, 6, 0, 0, &lp, err), 0);
    assert_int_equal(lp.n_top, 0);
    const float masked[3] = {0.0f, -INFINITY, 1.0f};
    assert_int_equal(sampling_logprobs(masked, 3, 1, 3, &lp, err), 0);
    assert_true(lp.logprob == SAMPLING_LOGPROB_MIN);       /* -inf reported as vLLM does */
    const float bad[2] = {0.0f, NAN};
    assert_int_equal(sampling_logprobs(bad, 2, 0, 1, &lp, err), ERR_INVALID_ARG);
    assert_int_equal(sampling_logprobs(logits, 6, 6, 1, &lp, err), ERR_INVALID_ARG);
}

/* The controls on a hand example: bias, then repetition over prompt and
 * output, then frequency and presence over the output only; counts left
 * zero; bad ids refused. */
static void test_sampling_controls_follow_vllm_rules(void **state)
{
    (void)state;
    float logits[6] = {1.0f, -1.0f, 2.0f, 0.5f, -2.0f, 4.0f};
    const int32_t toks[5] = {0, 1, 2, 2, 1}; /* prompt 0, 1; output 2, 2, 1 */
    const struct sampling_history h = {.tokens = toks, .n_prompt = 2, .n_tokens = 5};
    struct sampling_controls c = {.presence_penalty = 0.5f, .frequency_penalty = 0.25f,
                                  .repetition_penalty = 2.0f, .n_bias = 1, .bias_ids = {5},
                                  .bias = {-3.0f}};
    int32_t counts[6] = {0};
    char err[ERR_MSG_MAX] = "";
    assert_true(sampling_controls_active(&c));
    assert_int_equal(sampling_controls_validate(&c, err), 0);
    assert_int_equal(sampling_controls_apply(&c, &h, counts, logits, 6, err), 0);
    assert_true(logits[0] == 0.5f);                        /* prompt only: repetition */
    assert_true(logits[1] == (-2.0f - 0.25f) - 0.5f);      /* x r, then once in the output */
    assert_true(logits[2] == (1.0f - 0.5f) - 0.5f);        /* / r, then twice */
    assert_true(logits[3] == 0.5f && logits[4] == -2.0f);  /* untouched */
    assert_true(logits[5] == 1.0f);                        /* biased */
    for (int v = 0; v < 6; v++)
        assert_int_equal(counts[v], 0);
    const struct sampling_controls none = {0};
    assert_false(sampling_controls_active(&none));
    c.bias_ids[0] = 6;
    assert_int_equal(sampling_controls_apply(&c, &h, counts, logits, 6, err), ERR_INVALID_ARG);
    c.bias_ids[0] = 5;
    c.presence_penalty = 2.5f;
    assert_int_equal(sampling_controls_validate(&c, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "presence_penalty"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sampling_defaults_are_greedy_and_valid),
        cmocka_unit_test(test_sampling_validate_names_the_bad_field),
        cmocka_unit_test(test_argmax_f32_picks_lowest_index_and_skips_nan),
        cmocka_unit_test(test_sampling_draw_inverts_the_cdf_and_skips_zeros),
        cmocka_unit_test(test_sampling_greedy_is_one_hot_at_first_max),
        cmocka_unit_test(test_sampling_temperature_scales_softmax),
        cmocka_unit_test(test_sampling_filters_on_hand_examples),
        cmocka_unit_test(test_sampling_ties_break_toward_lower_index),
        cmocka_unit_test(test_sampling_top_p_keeps_at_least_one_token),
        cmocka_unit_test(test_sampling_matches_full_sort_reference),
        cmocka_unit_test(test_sampling_rejects_bad_logits_and_sizes),
        cmocka_unit_test(test_sampling_sample_is_keyed_and_reproducible),
        cmocka_unit_test(test_sampling_sample_distribution_passes_chi_square),
        cmocka_unit_test(test_sampling_adjust_at_llama3_vocab),
        cmocka_unit_test(test_sampling_logprobs_are_raw_log_softmax),
        cmocka_unit_test(test_sampling_controls_follow_vllm_rules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
