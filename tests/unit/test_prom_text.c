/* test_prom_text.c: the Prometheus text writer (common/base/prom_text.c)
 * both the coordinator's and the gateway's metrics are written with. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "error.h"
#include "prom_text.h"

static char *finish(struct prom_text *t)
{
    char *buf = NULL;
    size_t len = 0;
    char err[ERR_MSG_MAX];
    assert_int_equal(prom_text_finish(t, &buf, &len, err), 0);
    assert_non_null(buf);
    assert_int_equal(strlen(buf), len);
    return buf;
}

static void test_prom_text_families_and_samples(void **state)
{
    (void)state;
    struct prom_text t;
    prom_text_init(&t, NULL, 0);
    prom_single(&t, "a_total", "counter", "Things.", 42);
    prom_single_labelled(&t, "b", "gauge", "A fraction.", "model_name=\"m\"", 0.25);
    prom_family(&t, "c_total", "counter", "By kind.");
    prom_sample(&t, "c_total", "kind=\"x\"", 3);
    prom_sample(&t, "c_total", "", 4);
    char *text = finish(&t);
    assert_string_equal(text, "# HELP a_total Things.\n# TYPE a_total counter\na_total 42\n"
                              "# HELP b A fraction.\n# TYPE b gauge\nb{model_name=\"m\"} 0.25\n"
                              "# HELP c_total By kind.\n# TYPE c_total counter\nc_total{kind=\"x\"} 3\nc_total 4\n");
    free(text);
}

/* Buckets are cumulative, +Inf holds everything, labels come before le. */
static void test_prom_text_histogram(void **state)
{
    (void)state;
    const double bounds[2] = {0.5, 1};
    const uint64_t counts[3] = {2, 1, 4};
    const struct prom_histogram h = {.bounds = bounds, .counts = counts, .n_bounds = 2, .sum = 9.5, .count = 7};
    struct prom_text t;
    prom_text_init(&t, NULL, 0);
    prom_histogram(&t, "h", "Hist.", NULL, &h);
    prom_histogram(&t, "l", "Labelled.", "model_name=\"m\"", &h);
    char *text = finish(&t);
    assert_string_equal(text, "# HELP h Hist.\n# TYPE h histogram\n"
                              "h_bucket{le=\"0.5\"} 2\nh_bucket{le=\"1\"} 3\nh_bucket{le=\"+Inf\"} 7\n"
                              "h_sum 9.500000\nh_count 7\n"
                              "# HELP l Labelled.\n# TYPE l histogram\n"
                              "l_bucket{model_name=\"m\",le=\"0.5\"} 2\nl_bucket{model_name=\"m\",le=\"1\"} 3\n"
                              "l_bucket{model_name=\"m\",le=\"+Inf\"} 7\n"
                              "l_sum{model_name=\"m\"} 9.500000\nl_count{model_name=\"m\"} 7\n");
    free(text);
}

static void test_prom_text_appends_and_grows(void **state)
{
    (void)state;
    char *start = strdup("x 1\n");
    assert_non_null(start);
    struct prom_text t;
    prom_text_init(&t, start, 4);
    for (int i = 0; i < 2000; i++)
        prom_sample(&t, "series_with_a_long_name", "i=\"0123456789\"", i);
    char *text = finish(&t);
    assert_memory_equal(text, "x 1\nseries_with_a_long_name{i=\"0123456789\"} 0\n", 45);
    assert_non_null(strstr(text, "series_with_a_long_name{i=\"0123456789\"} 1999\n"));
    free(text);
}

static void test_prom_text_label_values_escaped(void **state)
{
    (void)state;
    char *v = prom_label_value("a\"b\\c\nd");
    assert_non_null(v);
    assert_string_equal(v, "a\\\"b\\\\c\\nd");
    free(v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prom_text_families_and_samples),
        cmocka_unit_test(test_prom_text_histogram),
        cmocka_unit_test(test_prom_text_appends_and_grows),
        cmocka_unit_test(test_prom_text_label_values_escaped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
