/* test_cpulist.c: CPU sets in list notation (common/base/cpulist.h) and the
 * test that tells whether two thread pools contend for cores. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "cpulist.h"
#include "error.h"

static struct cpulist parsed(const char *text)
{
    struct cpulist l;
    char err[ERR_MSG_MAX] = "";
    assert_int_equal(cpulist_parse(text, &l, err), 0);
    return l;
}

static void test_cpulist_parse_then_format_gives_the_shortest_list(void **state)
{
    (void)state;
    const char *cases[][2] = {
        {"0", "0"},           {"0-1", "0-1"},          {"0,1", "0-1"},
        {"0-3,8-11", "0-3,8-11"}, {"2,4,6", "2,4,6"}, {"0-0,1-1,2", "0-2"},
        {"1023", "1023"},     {"5-1023", "5-1023"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct cpulist l = parsed(cases[i][0]);
        char out[64], err[ERR_MSG_MAX];
        assert_int_equal(cpulist_format(&l, out, sizeof out, err), 0);
        assert_string_equal(out, cases[i][1]);
    }
    struct cpulist l = parsed("0-3,8-11");
    assert_int_equal(cpulist_count(&l), 8);
    assert_true(cpulist_has(&l, 3) && cpulist_has(&l, 8) && !cpulist_has(&l, 4) && !cpulist_has(&l, 12));
}

static void test_cpulist_parse_refuses_what_is_not_a_list(void **state)
{
    (void)state;
    const char *bad[] = {"", ",", "0,", ",0", "a", "-1", "1-", "3-1", "1,1", "2,1", "0-3,2", "1024",
                         "0-1024", "99999999999999999999", " 1", "1 ", "1;2", "+1", "0x1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct cpulist l;
        char err[ERR_MSG_MAX] = "";
        assert_int_equal(cpulist_parse(bad[i], &l, err), ERR_FORMAT);
        assert_non_null(strstr(err, "cpu list"));
    }
}

static void test_cpulist_format_reports_a_short_buffer_and_an_empty_set(void **state)
{
    (void)state;
    struct cpulist l = parsed("0,2,4,6,8,10");
    char out[8], err[ERR_MSG_MAX] = "";
    assert_int_equal(cpulist_format(&l, out, sizeof out, err), ERR_RANGE);
    assert_non_null(strstr(err, "8 bytes"));
    struct cpulist none;
    cpulist_clear(&none);
    assert_int_equal(cpulist_format(&none, out, sizeof out, err), ERR_INVALID_ARG);
    assert_int_equal(cpulist_add(&none, CPULIST_MAX), ERR_RANGE);
    assert_int_equal(cpulist_add(&none, -1), ERR_RANGE);
}

static void test_cpulist_oversubscribed_needs_overlap_and_more_threads_than_cpus(void **state)
{
    (void)state;
    struct cpulist two = parsed("0-1"), other_two = parsed("2-3"), four = parsed("0-3"),
                   shifted = parsed("1-2");
    assert_true(cpulist_oversubscribed(&two, 2, &two, 2));    /* the demo: 2 + 2 threads on 2 cores */
    assert_true(cpulist_oversubscribed(&two, 2, &two, 1));
    assert_false(cpulist_oversubscribed(&two, 1, &two, 1));   /* the CI pipeline tests: 1 + 1 */
    assert_false(cpulist_oversubscribed(&two, 2, &other_two, 2)); /* disjoint: no sharing */
    assert_false(cpulist_oversubscribed(&four, 2, &four, 2)); /* enough cores for both */
    assert_true(cpulist_oversubscribed(&four, 3, &four, 2));
    assert_true(cpulist_oversubscribed(&two, 2, &shifted, 2)); /* 3 CPUs for 4 threads */
    assert_false(cpulist_oversubscribed(&two, 1, &shifted, 2));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpulist_parse_then_format_gives_the_shortest_list),
        cmocka_unit_test(test_cpulist_parse_refuses_what_is_not_a_list),
        cmocka_unit_test(test_cpulist_format_reports_a_short_buffer_and_an_empty_set),
        cmocka_unit_test(test_cpulist_oversubscribed_needs_overlap_and_more_threads_than_cpus),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
