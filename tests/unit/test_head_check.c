/* test_head_check.c: a request head's syntax (head_check.h), without any
 * socket: each verdict on a whole head, and the same heads fed a byte at a
 * time, as a slow client sends them: no well-formed prefix is ever refused,
 * and a fault is found by the line that holds it. The answers on the wire
 * are checked end to end (tests/e2e/test_gateway_malformed.py). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "head_check.h"

#define HOST "Host: x\r\n"
#define CHUNKED "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"

struct head_case {
    const char *head;
    enum head_check_verdict verdict; /* on the whole head */
    int status;                      /* when refused */
};

/* one line per case: what it proves in its comment */
static const struct head_case cases[] = {
    {"GET /v1/models HTTP/1.1\r\n" HOST "\r\n", HEAD_CHECK_OK, 0},          /* the plain case */
    {"\r\n\r\nGET / HTTP/1.0\r\n\r\n", HEAD_CHECK_OK, 0},                   /* leading empty lines skipped */
    {"GET / HTTP/1.1\n" HOST "\n", HEAD_CHECK_OK, 0},                       /* bare LF line ends */
    {"GET / HTTP/1.9\r\n" HOST "\r\n", HEAD_CHECK_OK, 0},                   /* a later 1.x minor is 1.1 */
    {"GET / HTTP/1.1\r\nX-A:\r\nX-B: \xc3\xa9\t1\r\n\r\n", HEAD_CHECK_OK, 0}, /* empty value, obs-text, HTAB */
    {"POST / HTTP/1.1\r\nContent-Length: 12 \r\n\r\n", HEAD_CHECK_OK, 0},   /* OWS around a number */
    {"GET / HTTP/1.1\r\n" HOST, HEAD_CHECK_MORE, 0},                        /* no empty line yet */
    {"GET / HTTP/1.1", HEAD_CHECK_MORE, 0},                                 /* no line end yet */
    {"GET/ HTTP/1.1\r\n\r\n", HEAD_CHECK_REFUSED, 400},                     /* a method with '/' */
    {"GET  / HTTP/1.1\r\n\r\n", HEAD_CHECK_REFUSED, 400},                   /* two spaces */
    {"GET / HTTP/1.1 \r\n\r\n", HEAD_CHECK_REFUSED, 400},                   /* a space after the version */
    {"GET / HTTP/11\r\n\r\n", HEAD_CHECK_REFUSED, 400},                     /* no dot */
    {"GET /\r\n", HEAD_CHECK_REFUSED, 400},                                 /* HTTP/0.9: no empty line needed */
    {"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", HEAD_CHECK_REFUSED, 505},          /* the HTTP/2 preface */
    {"GET / HTTP/0.9\r\n\r\n", HEAD_CHECK_REFUSED, 505},                    /* major 0 */
    {"\x16\x03\x01", HEAD_CHECK_REFUSED, 400},                              /* a TLS hello, at its first byte */
    {"GET / HTTP/1.1\r\nX-A : 1\r\n\r\n", HEAD_CHECK_REFUSED, 400},         /* space before the colon */
    {"GET / HTTP/1.1\r\nX-A: 1\r\n 2\r\n\r\n", HEAD_CHECK_REFUSED, 400},    /* obs-fold */
    {"GET / HTTP/1.1\r\nX-A: 1\r2\r\n\r\n", HEAD_CHECK_REFUSED, 400},       /* a bare CR */
    {"GET / HTTP/1.1\r\nX-A: 1\x7f\r\n\r\n", HEAD_CHECK_REFUSED, 400},      /* DEL in a value */
    {"GET / HTTP/1.1\r\n: 1\r\n\r\n", HEAD_CHECK_REFUSED, 400},             /* an empty name */
    {"GET / HTTP/1.1\r\nContent-Length: 0x10\r\n\r\n", HEAD_CHECK_REFUSED, 400},   /* not decimal */
    {"GET / HTTP/1.1\r\ncontent-length: 5, 5\r\n\r\n", HEAD_CHECK_REFUSED, 400},   /* a list, any case */
    {"GET / HTTP/1.1\r\nContent-Length:\r\n\r\n", HEAD_CHECK_REFUSED, 400},        /* empty */
    {"GET / HTTP/1.1\r\nContent-Length: 1234567890123456789\r\n\r\n", HEAD_CHECK_REFUSED, 413}, /* 19 digits */
    {CHUNKED "5\r\nhello\r\n0\r\n\r\n", HEAD_CHECK_OK, 0},                /* a whole chunked body */
    {CHUNKED "5;ext=1\r\nhello\r\n0\r\n\r\n", HEAD_CHECK_OK, 0},          /* a chunk extension */
    {CHUNKED "A\nhellohello\n0\n\n", HEAD_CHECK_OK, 0},                      /* bare LF, upper-case hex */
    {CHUNKED "zz\r\n", HEAD_CHECK_REFUSED, 400},                              /* not hexadecimal */
    {CHUNKED "\r\n", HEAD_CHECK_REFUSED, 400},                                /* no size at all */
    {CHUNKED "5\r\nhelloXX0\r\n\r\n", HEAD_CHECK_REFUSED, 400},              /* data longer than its size */
    {CHUNKED "1000000000000000\r\n", HEAD_CHECK_REFUSED, 413},                /* 16 hex digits: past 2^60 */
    {"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\nzz\r\n", HEAD_CHECK_OK, 0}, /* framing.c's */
};

static void test_head_check_table(void **state)
{
    (void)state;
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        struct openai_error e = {0};
        const char *h = cases[k].head;
        enum head_check_verdict v = head_check(h, strlen(h), &e);
        if (v != cases[k].verdict || (v == HEAD_CHECK_REFUSED && e.status != cases[k].status))
            fail_msg("case %zu (%s): verdict %d status %d, expected %d %d", k, h, v, e.status, cases[k].verdict,
                     cases[k].status);
    }
}

static void test_head_check_byte_at_a_time_refuses_no_good_prefix(void **state)
{
    (void)state;
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const char *h = cases[k].head;
        size_t n = strlen(h);
        for (size_t i = 1; i < n; i++) {
            struct openai_error e = {0};
            enum head_check_verdict v = head_check(h, i, &e);
            if (cases[k].verdict != HEAD_CHECK_REFUSED && v == HEAD_CHECK_REFUSED)
                fail_msg("case %zu: its first %zu bytes refused (%s)", k, i, e.message);
            if (v == HEAD_CHECK_REFUSED && e.status != cases[k].status)
                fail_msg("case %zu: its first %zu bytes refused %d, the whole %d", k, i, e.status, cases[k].status);
        }
    }
}

static void test_head_check_limits(void **state)
{
    (void)state;
    static char buf[HEAD_CHECK_MAX_BYTES + 64];
    struct openai_error e;
    /* a target that fills the limit: 414; a header that does: 431 */
    memset(buf, 'a', sizeof buf);
    memcpy(buf, "GET /", 5);
    assert_int_equal(head_check(buf, HEAD_CHECK_MAX_BYTES + 1, &e), HEAD_CHECK_REFUSED);
    assert_int_equal(e.status, 414);
    assert_int_equal(head_check(buf, HEAD_CHECK_MAX_BYTES, &e), HEAD_CHECK_MORE);
    memcpy(buf, "GET / HTTP/1.1\r\nX-A: ", 21);
    assert_int_equal(head_check(buf, HEAD_CHECK_MAX_BYTES + 1, &e), HEAD_CHECK_REFUSED);
    assert_int_equal(e.status, 431);
    /* 100 fields pass, 101 do not */
    size_t n = (size_t)snprintf(buf, sizeof buf, "GET / HTTP/1.1\r\n");
    for (int i = 0; i < HEAD_CHECK_MAX_FIELDS; i++)
        n += (size_t)snprintf(buf + n, sizeof buf - n, "X-%d: 1\r\n", i);
    memcpy(buf + n, "\r\n", 2);
    assert_int_equal(head_check(buf, n + 2, &e), HEAD_CHECK_OK);
    memcpy(buf + n, "X-Z: 1\r\n\r\n", 10);
    assert_int_equal(head_check(buf, n + 10, &e), HEAD_CHECK_REFUSED);
    assert_int_equal(e.status, 431);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_head_check_table),
        cmocka_unit_test(test_head_check_byte_at_a_time_refuses_no_good_prefix),
        cmocka_unit_test(test_head_check_limits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
