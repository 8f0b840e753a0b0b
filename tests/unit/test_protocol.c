/* test_protocol.c: message framing over a real ZeroMQ inproc ROUTER/DEALER pair. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <zmq.h>

#include "error.h"
#include "protocol.h"

struct pair {
    void *zctx;
    void *router;
    void *dealer;
};

static int setup(void **state)
{
    struct pair *p = calloc(1, sizeof *p);
    if (!p)
        return -1;
    p->zctx = zmq_ctx_new();
    p->router = zmq_socket(p->zctx, ZMQ_ROUTER);
    p->dealer = zmq_socket(p->zctx, ZMQ_DEALER);
    int timeout_ms = 5000, linger = 0;
    zmq_setsockopt(p->router, ZMQ_RCVTIMEO, &timeout_ms, sizeof timeout_ms);
    zmq_setsockopt(p->dealer, ZMQ_RCVTIMEO, &timeout_ms, sizeof timeout_ms);
    zmq_setsockopt(p->router, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(p->dealer, ZMQ_LINGER, &linger, sizeof linger);
    if (zmq_bind(p->router, "inproc://test-protocol") != 0 ||
        zmq_connect(p->dealer, "inproc://test-protocol") != 0)
        return -1;
    *state = p;
    return 0;
}

static int teardown(void **state)
{
    struct pair *p = *state;
    zmq_close(p->dealer);
    zmq_close(p->router);
    zmq_ctx_term(p->zctx);
    free(p);
    return 0;
}

/* Sends raw parts from the dealer (to forge bad messages). */
static void send_raw(void *sock, const char *const *parts, const size_t *sizes, int n)
{
    for (int i = 0; i < n; i++)
        assert_true(zmq_send(sock, parts[i], sizes[i], i + 1 < n ? ZMQ_SNDMORE : 0) >= 0);
}

static void send_good(struct pair *p, const char *type)
{
    cJSON *h = protocol_header_new(type);
    assert_non_null(h);
    char err[ERR_MSG_MAX];
    assert_int_equal(protocol_send(p->dealer, NULL, 0, h, NULL, 0, 0, err), 0);
    cJSON_Delete(h);
}

static void test_protocol_round_trip_with_token_frames(void **state)
{
    struct pair *p = *state;
    char err[ERR_MSG_MAX] = "";
    cJSON *h = protocol_header_new(PROTOCOL_VERIFY);
    assert_non_null(h);
    cJSON_AddNumberToObject(h, "req", 42);
    cJSON_AddNumberToObject(h, "slot", 3);
    int32_t toks[5] = {1, -2, 300000, 4, 5};
    struct protocol_frame fr[2] = {{toks, sizeof toks}, {NULL, 0}};
    assert_int_equal(protocol_send(p->dealer, NULL, 0, h, fr, 2, 0, err), 0);
    cJSON_Delete(h);

    struct protocol_msg m;
    assert_int_equal(protocol_recv(p->router, true, 1 << 20, 0, &m, err), 0);
    assert_true(m.identity_size > 0);
    assert_string_equal(m.type, "verify");
    int req = -1, slot = -1;
    assert_int_equal(protocol_get_int(m.header, "req", 0, 1000, &req, err), 0);
    assert_int_equal(protocol_get_int(m.header, "slot", 0, 7, &slot, err), 0);
    assert_int_equal(req, 42);
    assert_int_equal(slot, 3);
    assert_int_equal(m.n_frames, 2);
    const int32_t *got = NULL;
    int n = 0;
    assert_int_equal(protocol_frame_tokens(&m, 0, "feed", 1, 16, &got, &n, err), 0);
    assert_int_equal(n, 5);
    assert_memory_equal(got, toks, sizeof toks);
    assert_int_equal(protocol_frame_tokens(&m, 1, "empty", 0, 16, &got, &n, err), 0);
    assert_int_equal(n, 0);

    /* Reply back through the router using the routing id. */
    cJSON *r = protocol_header_new(PROTOCOL_WELCOME);
    assert_int_equal(protocol_send(p->router, m.identity, m.identity_size, r, NULL, 0, 0, err), 0);
    cJSON_Delete(r);
    protocol_msg_free(&m);
    assert_null(m.header);
    struct protocol_msg back;
    assert_int_equal(protocol_recv(p->dealer, false, 1 << 20, 0, &back, err), 0);
    assert_string_equal(back.type, "welcome");
    assert_int_equal(back.identity_size, 0);
    assert_int_equal(back.n_frames, 0);
    protocol_msg_free(&back);
    protocol_msg_free(&back); /* idempotent */
}

static void test_protocol_malformed_json_is_rejected_and_drained(void **state)
{
    struct pair *p = *state;
    char err[ERR_MSG_MAX] = "";
    const char *parts[] = {"{\"v\":1,\"type\":", "abcd"};
    size_t sizes[] = {strlen(parts[0]), 4};
    send_raw(p->dealer, parts, sizes, 2);
    send_good(p, "heartbeat");
    struct protocol_msg m;
    assert_int_equal(protocol_recv(p->router, true, 1 << 20, 0, &m, err), ERR_PROTOCOL);
    assert_string_equal(err, "header: not valid JSON");
    assert_true(m.identity_size > 0); /* the caller can still answer */
    protocol_msg_free(&m);
    /* The next message starts on a boundary. */
    assert_int_equal(protocol_recv(p->router, true, 1 << 20, 0, &m, err), 0);
    assert_string_equal(m.type, "heartbeat");
    protocol_msg_free(&m);
}

static void test_protocol_wrong_version_and_missing_type_are_rejected(void **state)
{
    struct pair *p = *state;
    char err[ERR_MSG_MAX] = "";
    const char *bad_v[] = {"{\"v\":2,\"type\":\"generate\",\"id\":\"x\"}"};
    size_t s1[] = {strlen(bad_v[0])};
    send_raw(p->dealer, bad_v, s1, 1);
    struct protocol_msg m;
    assert_int_equal(protocol_recv(p->router, true, 1 << 20, 0, &m, err), ERR_PROTOCOL);
    assert_non_null(strstr(err, "v: unsupported protocol version 2"));
    assert_non_null(m.header); /* kept so the reply can carry the id */
    protocol_msg_free(&m);

    const char *no_v[] = {"{\"type\":\"generate\"}"};
    size_t s2[] = {strlen(no_v[0])};
    send_raw(p->dealer, no_v, s2, 1);
    assert_int_equal(protocol_recv(p->router, true, 1 << 20, 0, &m, err), ERR_PROTOCOL);
    assert_string_equal(err, "v: required");
    protocol_msg_free(&m);

    const char *no_type[] = {"{\"v\":1}"};
    size_t s3[] = {strlen(no_type[0])};
    send_raw(p->dealer, no_type, s3, 1);
    assert_int_equal(protocol_recv(p->router, true, 1 << 20, 0, &m, err), ERR_PROTOCOL);
    assert_string_equal(err, "type: required");
    protocol_msg_free(&m);

    const char *arr[] = {"[1,2]"};
    size_t s4[] = {5};
    send_raw(p->dealer, arr, s4, 1);
    assert_int_equal(protocol_recv(p->router, true, 1 << 20, 0, &m, err), ERR_PROTOCOL);
    assert_string_equal(err, "header: expected a JSON object");
    protocol_msg_free(&m);
}

static void test_protocol_oversized_message_is_rejected_and_drained(void **state)
{
    struct pair *p = *state;
    char err[ERR_MSG_MAX] = "";
    cJSON *h = protocol_header_new("generate");
    size_t big_n = 4096;
    int32_t *big = calloc(big_n, sizeof *big);
    assert_non_null(big);
    struct protocol_frame fr[1] = {{big, big_n * sizeof *big}};
    assert_int_equal(protocol_send(p->dealer, NULL, 0, h, fr, 1, 0, err), 0);
    cJSON_Delete(h);
    free(big);
    send_good(p, "stats");
    struct protocol_msg m;
    assert_int_equal(protocol_recv(p->router, true, 1024, 0, &m, err), ERR_PROTOCOL);
    assert_non_null(strstr(err, "larger than the limit of 1024 bytes"));
    assert_int_equal(m.n_frames, 0);
    protocol_msg_free(&m);
    assert_int_equal(protocol_recv(p->router, true, 1024, 0, &m, err), 0);
    assert_string_equal(m.type, "stats");
    protocol_msg_free(&m);
}

static void test_protocol_bad_token_frames_are_rejected(void **state)
{
    struct pair *p = *state;
    char err[ERR_MSG_MAX] = "";
    const char *parts[] = {"{\"v\":1,\"type\":\"draft\"}", "abcdefg"};
    size_t sizes[] = {strlen(parts[0]), 7};
    send_raw(p->dealer, parts, sizes, 2);
    struct protocol_msg m;
    assert_int_equal(protocol_recv(p->router, true, 1 << 20, 0, &m, err), 0);
    const int32_t *t;
    int n;
    assert_int_equal(protocol_frame_tokens(&m, 0, "feed", 1, 8, &t, &n, err), ERR_PROTOCOL);
    assert_string_equal(err, "feed: frame of 7 bytes is not an int32 array");
    assert_int_equal(protocol_frame_tokens(&m, 1, "feed", 1, 8, &t, &n, err), ERR_PROTOCOL);
    assert_non_null(strstr(err, "feed: token frame 2 missing"));
    protocol_msg_free(&m);

    int32_t toks[3] = {1, 2, 3};
    cJSON *h = protocol_header_new("draft");
    struct protocol_frame fr[1] = {{toks, sizeof toks}};
    assert_int_equal(protocol_send(p->dealer, NULL, 0, h, fr, 1, 0, err), 0);
    cJSON_Delete(h);
    assert_int_equal(protocol_recv(p->router, true, 1 << 20, 0, &m, err), 0);
    assert_int_equal(protocol_frame_tokens(&m, 0, "feed", 4, 8, &t, &n, err), ERR_PROTOCOL);
    assert_string_equal(err, "feed: 3 tokens, expected 4..8");
    protocol_msg_free(&m);

    /* Too many frames. */
    const char *many[] = {"{\"v\":1,\"type\":\"draft\"}", "", "", "", "", ""};
    size_t many_sizes[] = {strlen(many[0]), 0, 0, 0, 0, 0};
    _Static_assert(PROTOCOL_MAX_FRAMES == 4, "six parts exceed the frame limit");
    send_raw(p->dealer, many, many_sizes, 6);
    assert_int_equal(protocol_recv(p->router, true, 1 << 20, 0, &m, err), ERR_PROTOCOL);
    assert_non_null(strstr(err, "binary frames"));
    protocol_msg_free(&m);
}

static void test_protocol_getters_validate_types_and_ranges(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX] = "";
    cJSON *o = cJSON_Parse("{\"max_tokens\":0,\"k\":\"3\",\"t\":0.5,\"f\":1.5,\"s\":\"abc\","
                           "\"b\":true,\"arr\":[1,2,300],\"sampling\":{\"top_k\":-1},"
                           "\"big\":123456789012,\"nul\":null}");
    assert_non_null(o);
    int iv;
    assert_int_equal(protocol_get_int(o, "max_tokens", 1, INT32_MAX, &iv, err), ERR_PROTOCOL);
    assert_string_equal(err, "max_tokens: must be >= 1, got 0");
    assert_int_equal(protocol_get_int(o, "k", 0, 16, &iv, err), ERR_PROTOCOL);
    assert_string_equal(err, "k: expected an integer, got string");
    assert_int_equal(protocol_get_int(o, "f", 0, 16, &iv, err), ERR_PROTOCOL);
    assert_string_equal(err, "f: expected an integer, got 1.5");
    assert_int_equal(protocol_get_int(o, "missing", 0, 16, &iv, err), ERR_PROTOCOL);
    assert_string_equal(err, "missing: required");
    assert_int_equal(protocol_get_int(o, "nul", 0, 16, &iv, err), ERR_PROTOCOL);
    assert_string_equal(err, "nul: expected an integer, got null");
    assert_int_equal(protocol_get_int_opt(o, "missing", 0, 16, 7, &iv, err), 0);
    assert_int_equal(iv, 7);
    int64_t big;
    assert_int_equal(protocol_get_i64(o, "big", 0, INT64_MAX, &big, err), 0);
    assert_true(big == 123456789012LL);
    assert_int_equal(protocol_get_int(o, "big", 0, INT32_MAX, &iv, err), ERR_PROTOCOL);

    const cJSON *sampling;
    assert_int_equal(protocol_get_object(o, "sampling", &sampling, err), 0);
    assert_int_equal(protocol_get_int(sampling, "sampling.top_k", 0, 1000, &iv, err),
                     ERR_PROTOCOL);
    assert_string_equal(err, "sampling.top_k: must be in 0..1000, got -1");
    assert_int_equal(protocol_get_object(o, "s", &sampling, err), ERR_PROTOCOL);
    assert_string_equal(err, "s: expected an object, got string");

    double d;
    assert_int_equal(protocol_get_double(o, "t", 0.0, 2.0, &d, err), 0);
    assert_true(d == 0.5);
    assert_int_equal(protocol_get_double(o, "f", 0.0, 1.0, &d, err), ERR_PROTOCOL);
    assert_string_equal(err, "f: must be in 0..1, got 1.5");
    assert_int_equal(protocol_get_double_opt(o, "nope", 0.0, 1.0, 0.25, &d, err), 0);
    assert_true(d == 0.25);

    bool b = false;
    assert_int_equal(protocol_get_bool(o, "b", &b, err), 0);
    assert_true(b);
    assert_int_equal(protocol_get_bool(o, "s", &b, err), ERR_PROTOCOL);
    assert_string_equal(err, "s: expected a boolean, got string");

    const char *sv;
    assert_int_equal(protocol_get_string(o, "s", 10, &sv, err), 0);
    assert_string_equal(sv, "abc");
    assert_int_equal(protocol_get_string(o, "s", 2, &sv, err), ERR_PROTOCOL);
    assert_string_equal(err, "s: longer than 2 bytes");
    assert_int_equal(protocol_get_string_opt(o, "nope", 2, "dflt", &sv, err), 0);
    assert_string_equal(sv, "dflt");

    int32_t arr[4];
    int n;
    assert_int_equal(protocol_get_int_array(o, "arr", 0, 1000, arr, 4, &n, err), 0);
    assert_int_equal(n, 3);
    assert_int_equal(arr[2], 300);
    assert_int_equal(protocol_get_int_array(o, "arr", 0, 100, arr, 4, &n, err), ERR_PROTOCOL);
    assert_string_equal(err, "arr[2]: must be in 0..100, got 300");
    assert_int_equal(protocol_get_int_array(o, "arr", 0, 1000, arr, 2, &n, err), ERR_PROTOCOL);

    static const char *const allowed[] = {"max_tokens", "k", "t", "f", "s", "b", "arr",
                                          "sampling", "big", "nul", NULL};
    assert_int_equal(protocol_check_fields(o, allowed, NULL, err), 0);
    static const char *const fewer[] = {"max_tokens", NULL};
    assert_int_equal(protocol_check_fields(o, fewer, NULL, err), ERR_PROTOCOL);
    assert_string_equal(err, "k: unknown field");
    assert_int_equal(protocol_check_fields(o, fewer, "sampling", err), ERR_PROTOCOL);
    assert_string_equal(err, "sampling.k: unknown field");
    cJSON_Delete(o);
}

static void test_protocol_dontwait_receive_reports_timeout(void **state)
{
    struct pair *p = *state;
    char err[ERR_MSG_MAX] = "";
    struct protocol_msg m;
    assert_int_equal(protocol_recv(p->router, true, 1024, PROTOCOL_DONTWAIT, &m, err),
                     ERR_TIMEOUT);
    protocol_msg_free(&m);
}

/* A header tree handed over (the in-process transport's copy) is checked
 * as a received one: type borrowed from it, a wrong version or no tree
 * refused by name, the tree owned by the message either way. */
static void test_protocol_adopted_header_is_checked(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX] = "";
    struct protocol_msg m = {0};
    cJSON *h = protocol_header_new("verify");
    assert_non_null(h);
    assert_int_equal(protocol_msg_adopt_header(&m, h, err), 0);
    assert_string_equal(m.type, "verify");
    protocol_msg_free(&m);
    h = cJSON_CreateObject();
    assert_non_null(h);
    cJSON_AddNumberToObject(h, "v", 2);
    cJSON_AddStringToObject(h, "type", "verify");
    assert_int_equal(protocol_msg_adopt_header(&m, h, err), ERR_PROTOCOL);
    assert_non_null(strstr(err, "v: unsupported protocol version 2"));
    protocol_msg_free(&m);
    assert_int_equal(protocol_msg_adopt_header(&m, NULL, err), ERR_NOMEM);
    protocol_msg_free(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_protocol_round_trip_with_token_frames, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_protocol_malformed_json_is_rejected_and_drained,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_protocol_wrong_version_and_missing_type_are_rejected,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_protocol_oversized_message_is_rejected_and_drained,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_protocol_bad_token_frames_are_rejected, setup,
                                        teardown),
        cmocka_unit_test(test_protocol_getters_validate_types_and_ranges),
        cmocka_unit_test(test_protocol_adopted_header_is_checked),
        cmocka_unit_test_setup_teardown(test_protocol_dontwait_receive_reports_timeout, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
