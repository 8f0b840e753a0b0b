/* test_admit.c: the gateway's connection counts (admit.h), without any
 * process: the per-address and total limits, a refused connection counted
 * until it closes, many addresses told apart. The answers themselves are
 * checked end to end (tests/e2e/test_gateway_overload.py). */
#include <arpa/inet.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "admit.h"
#include "error.h"

static uint32_t addr(const char *dotted)
{
    struct in_addr a;
    assert_int_equal(inet_pton(AF_INET, dotted, &a), 1);
    return a.s_addr;
}

static void test_admit_per_address_limit_leaves_other_addresses_served(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX];
    struct admit *a = NULL;
    assert_int_equal(admit_create(&a, 100, 2, err), 0);
    assert_int_equal(admit_enter(a, addr("127.0.0.2")), ADMIT_OK);
    assert_int_equal(admit_enter(a, addr("127.0.0.2")), ADMIT_OK);
    assert_int_equal(admit_enter(a, addr("127.0.0.2")), ADMIT_OVER_ADDRESS);
    assert_int_equal(admit_enter(a, addr("127.0.0.1")), ADMIT_OK);
    /* the refused one is counted until it closes: its socket is held */
    admit_leave(a, addr("127.0.0.2"));
    assert_int_equal(admit_enter(a, addr("127.0.0.2")), ADMIT_OVER_ADDRESS);
    admit_leave(a, addr("127.0.0.2"));
    admit_leave(a, addr("127.0.0.2"));
    assert_int_equal(admit_enter(a, addr("127.0.0.2")), ADMIT_OK);
    admit_destroy(a);
}

static void test_admit_total_limit_counts_every_address(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX];
    struct admit *a = NULL;
    assert_int_equal(admit_create(&a, 3, 0, err), 0);
    /* 0 per address: no limit per address, only the total */
    for (int i = 0; i < 3; i++)
        assert_int_equal(admit_enter(a, addr("10.0.0.1")), ADMIT_OK);
    assert_int_equal(admit_enter(a, addr("10.0.0.2")), ADMIT_OVER_TOTAL);
    admit_leave(a, addr("10.0.0.2"));
    admit_leave(a, addr("10.0.0.1"));
    assert_int_equal(admit_enter(a, addr("10.0.0.2")), ADMIT_OK);
    /* addresses that hash alike are still told apart */
    admit_destroy(a);
    assert_int_equal(admit_create(&a, 100000, 1, err), 0);
    for (uint32_t i = 0; i < 20000; i++)
        assert_int_equal(admit_enter(a, htonl(0x0a000000u + i)), ADMIT_OK);
    for (uint32_t i = 0; i < 20000; i += 997)
        assert_int_equal(admit_enter(a, htonl(0x0a000000u + i)), ADMIT_OVER_ADDRESS);
    admit_destroy(a); /* frees what is still counted */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_admit_per_address_limit_leaves_other_addresses_served),
        cmocka_unit_test(test_admit_total_limit_counts_every_address),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
