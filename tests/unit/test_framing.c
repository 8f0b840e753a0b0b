/* test_framing.c: the request-target helpers of framing.h that need no
 * connection: which target forms are served and their path, and a decoded
 * NUL. framing_refused needs libmicrohttpd's connection: it is checked end
 * to end (tests/e2e/test_gateway_framing.py). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "framing.h"

static void test_framing_path_of_takes_origin_and_absolute_form(void **state)
{
    (void)state;
    static const struct {
        const char *url, *path; /* NULL path: not served */
    } cases[] = {
        {"/v1/models", "/v1/models"},
        {"http://host/v1/models", "/v1/models"},          /* absolute form: routed by path */
        {"HTTPS://h:8443/health?x=1", "/health?x=1"},     /* the scheme in any case */
        {"http://host", "/"},                              /* no path: the root */
        {"*", NULL},                                       /* asterisk form */
        {"host:443", NULL},                                /* authority form */
        {"http://", NULL},                                 /* no authority */
        {"http:///v1/models", NULL},
        {"ftp://host/v1/models", NULL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *got = framing_path_of(cases[i].url);
        if (cases[i].path == NULL)
            assert_null(got);
        else
            assert_string_equal(got, cases[i].path);
    }
}

static void test_framing_unescape_turns_a_decoded_nul_into_an_empty_target(void **state)
{
    (void)state;
    char plain[] = "/v1/models/t%69ny";
    assert_int_equal(framing_unescape(NULL, NULL, plain), strlen("/v1/models/tiny"));
    assert_string_equal(plain, "/v1/models/tiny");
    char nul[] = "/v1/models/ti%00ny";
    assert_int_equal(framing_unescape(NULL, NULL, nul), 0);
    assert_string_equal(nul, "");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_framing_path_of_takes_origin_and_absolute_form),
        cmocka_unit_test(test_framing_unescape_turns_a_decoded_nul_into_an_empty_target),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
