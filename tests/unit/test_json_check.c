/* test_json_check.c: the strict JSON pass (common/base/json_check.h) and the
 * UTF-8 cut helper it quotes keys with (utf8_cut_len).
 *
 * Every case cJSON accepts silently and the protocol forbids is refused with
 * a message saying what and where; RFC 8259 text is accepted unchanged. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "json_check.h"
#include "utf8.h"

static int check_n(const char *s, size_t n, char *err)
{
    err[0] = '\0';
    return json_check(s, n, err);
}

static int check(const char *s, char *err)
{
    return check_n(s, strlen(s), err);
}

static void expect_ok(const char *s)
{
    char err[ERR_MSG_MAX];
    int rc = check(s, err);
    if (rc != 0)
        fail_msg("refused %s: %s", s, err);
}

/* Refused with code, and the message holds `needle`. */
static void expect_bad_n(const char *s, size_t n, int code, const char *needle)
{
    char err[ERR_MSG_MAX];
    int rc = check_n(s, n, err);
    if (rc != code || strstr(err, needle) == NULL)
        fail_msg("%.60s: got %d \"%s\", expected %d with \"%s\"", s, rc, err, code, needle);
    assert_true(utf8_valid((const uint8_t *)err, strlen(err), NULL));
}

static void expect_bad(const char *s, int code, const char *needle)
{
    expect_bad_n(s, strlen(s), code, needle);
}

static void test_json_check_accepts_rfc8259(void **state)
{
    (void)state;
    expect_ok("{}");
    expect_ok("[]");
    expect_ok(" {\"v\": 1, \"type\": \"generate\", \"a\": [1, -0.5e+3, 2E-2, true, false, null, {}]}\r\n");
    expect_ok("\"\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\\ud83d\\ude00\"");
    expect_ok("{\"h\\u00e9\": \"caf\xc3\xa9 \xf0\x9f\x98\x80\"}");
    expect_ok("0");
    expect_ok("{\"a\": {\"x\": 1}, \"b\": {\"x\": 2}}"); /* same key in two objects */
    expect_ok("[{\"x\": 1}, {\"x\": 2}]");
    char err[ERR_MSG_MAX];
    assert_int_equal(check_n("{}\0\0", 4, err), 0); /* trailing NULs some clients send */
}

static void test_json_check_rejects_bad_syntax(void **state)
{
    (void)state;
    expect_bad("", ERR_FORMAT, "expected a value at offset 0");
    expect_bad("{", ERR_FORMAT, "expected a string key");
    expect_bad("{\"a\" 1}", ERR_FORMAT, "expected ':'");
    expect_bad("{\"a\": 1,}", ERR_FORMAT, "expected a string key");
    expect_bad("[1,]", ERR_FORMAT, "invalid value");
    expect_bad("[1 2]", ERR_FORMAT, "expected ',' or ']'");
    expect_bad("{'a': 1}", ERR_FORMAT, "expected a string key");
    expect_bad("01", ERR_FORMAT, "trailing bytes");
    expect_bad("1.", ERR_FORMAT, "no digit after the point");
    expect_bad("1e", ERR_FORMAT, "no digit in the exponent");
    expect_bad("+1", ERR_FORMAT, "invalid value");
    expect_bad("NaN", ERR_FORMAT, "invalid value");
    expect_bad("tru", ERR_FORMAT, "invalid value");
    expect_bad("\"abc", ERR_FORMAT, "unterminated string");
    expect_bad("\"\\x\"", ERR_FORMAT, "invalid escape");
    expect_bad("\"\\u12g4\"", ERR_FORMAT, "invalid \\u escape");
    expect_bad("{} x", ERR_FORMAT, "trailing bytes after the value at offset 3");
}

static void test_json_check_rejects_control_characters_and_nul(void **state)
{
    (void)state;
    expect_bad("{\"id\": \"a\nb\"}", ERR_FORMAT, "raw control character 0x0a in a string (escape it) at offset 9");
    expect_bad("{\"id\": \"a\tb\"}", ERR_FORMAT, "raw control character 0x09");
    expect_bad_n("{\"id\": \"a\0b\"}", 13, ERR_FORMAT, "raw control character 0x00");
    expect_bad("{\"prompt\": \"abc\\u0000def\"}", ERR_FORMAT,
               "\\u0000 in a string: NUL characters are not accepted at offset 15");
    expect_bad("{\"a\\u0000\": 1}", ERR_FORMAT, "\\u0000");
    expect_bad_n("{}\0x", 4, ERR_FORMAT, "trailing bytes");
}

static void test_json_check_rejects_invalid_utf8(void **state)
{
    (void)state;
    expect_bad("{\"id\": \"\xff\"}", ERR_FORMAT, "invalid UTF-8 in a string at offset 8");
    expect_bad("{\"id\": \"\xc3\"}", ERR_FORMAT, "invalid UTF-8");        /* cut character */
    expect_bad("{\"id\": \"\xc0\xaf\"}", ERR_FORMAT, "invalid UTF-8");    /* overlong */
    expect_bad("{\"id\": \"\xed\xa0\x80\"}", ERR_FORMAT, "invalid UTF-8"); /* surrogate */
    expect_bad("{\"\xfe\": 1}", ERR_FORMAT, "invalid UTF-8");
    expect_bad("\xef\xbb\xbf{}", ERR_FORMAT, "invalid value"); /* no BOM */
    expect_bad("\"\\ud83d\"", ERR_FORMAT, "lone UTF-16 high surrogate");
    expect_bad("\"\\ude00\\ud83d\"", ERR_FORMAT, "lone UTF-16 low surrogate");
}

static void test_json_check_reports_duplicate_keys_with_their_path(void **state)
{
    (void)state;
    expect_bad("{\"max_tokens\": 1, \"max_tokens\": 2}", ERR_INVALID_ARG, "max_tokens: given more than once");
    expect_bad("{\"a\": 1, \"\\u0061\": 2}", ERR_INVALID_ARG, "a: given more than once");
    expect_bad("{\"v\": 1, \"messages\": [{\"role\": \"user\", \"content\": \"x\"},"
               " {\"role\": \"user\", \"content\": \"y\", \"role\": \"system\"}]}",
               ERR_INVALID_ARG, "messages[1].role: given more than once");
    expect_bad("{\"a\": {\"b\": {\"c\": 1, \"c\": 2}}}", ERR_INVALID_ARG, "a.b.c: given more than once");
    expect_bad("[[{\"k\": 1, \"k\": 1}]]", ERR_INVALID_ARG, "[0][0].k: given more than once");
    /* a syntax error after the duplicate still wins */
    expect_bad("{\"a\": 1, \"a\": 2, }", ERR_FORMAT, "expected a string key");
    /* a long key is quoted cut at a character boundary */
    char msg[1400];
    strcpy(msg, "{\"");
    for (int i = 0; i < 300; i++)
        strcat(msg, "\xc3\xa9");
    strcat(msg, "\": 1, \"");
    for (int i = 0; i < 300; i++)
        strcat(msg, "\xc3\xa9");
    strcat(msg, "\": 2}");
    expect_bad(msg, ERR_INVALID_ARG, "...: given more than once");
}

static void test_json_check_many_keys_and_deep_nesting(void **state)
{
    (void)state;
    /* 100000 distinct keys: sorted, not compared pairwise */
    size_t cap = 100000 * 16 + 16, n = 0;
    char *s = malloc(cap);
    s[n++] = '{';
    for (int i = 0; i < 100000; i++)
        n += (size_t)snprintf(s + n, cap - n, "%s\"k%d\":%d", i ? "," : "", i, i);
    s[n++] = '}';
    char err[ERR_MSG_MAX];
    assert_int_equal(check_n(s, n, err), 0);
    n = (size_t)snprintf(s, cap, "{\"k5\":0,");
    for (int i = 0; i < 100000; i++)
        n += (size_t)snprintf(s + n, cap - n, "%s\"k%d\":%d", i ? "," : "", i, i);
    s[n++] = '}';
    assert_int_equal(check_n(s, n, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "k5: given more than once"));
    /* nesting */
    n = 0;
    for (int i = 0; i < JSON_CHECK_DEPTH_MAX; i++)
        s[n++] = '[';
    for (int i = 0; i < JSON_CHECK_DEPTH_MAX; i++)
        s[n++] = ']';
    assert_int_equal(check_n(s, n, err), 0);
    memmove(s + 1, s, n);
    s[0] = '[';
    s[++n] = ']';
    n++;
    expect_bad_n(s, n, ERR_FORMAT, "nested deeper than 64");
    free(s);
}

static void test_utf8_cut_len_stops_at_a_character_boundary(void **state)
{
    (void)state;
    const uint8_t *s = (const uint8_t *)"ab\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80";
    size_t n = strlen((const char *)s);
    assert_int_equal(utf8_cut_len(s, n, 0), 0);
    assert_int_equal(utf8_cut_len(s, n, 2), 2);
    assert_int_equal(utf8_cut_len(s, n, 3), 2); /* not inside the é */
    assert_int_equal(utf8_cut_len(s, n, 4), 4);
    assert_int_equal(utf8_cut_len(s, n, 6), 4);
    assert_int_equal(utf8_cut_len(s, n, 7), 7);
    assert_int_equal(utf8_cut_len(s, n, 10), 7);
    assert_int_equal(utf8_cut_len(s, n, 11), 11);
    assert_int_equal(utf8_cut_len(s, n, 100), 11);
    /* invalid bytes count one each */
    assert_int_equal(utf8_cut_len((const uint8_t *)"\xff\xfe\xc3", 3, 2), 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_check_accepts_rfc8259),
        cmocka_unit_test(test_json_check_rejects_bad_syntax),
        cmocka_unit_test(test_json_check_rejects_control_characters_and_nul),
        cmocka_unit_test(test_json_check_rejects_invalid_utf8),
        cmocka_unit_test(test_json_check_reports_duplicate_keys_with_their_path),
        cmocka_unit_test(test_json_check_many_keys_and_deep_nesting),
        cmocka_unit_test(test_utf8_cut_len_stops_at_a_character_boundary),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
