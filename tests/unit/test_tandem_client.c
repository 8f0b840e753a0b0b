/* test_tandem_client.c: the C client library against a stand-in coordinator
 * (a ROUTER on an ipc:// endpoint in a temporary directory) that dies: a
 * request in flight is reported lost at once (ERR_UNAVAILABLE, after the
 * replies that came before), a drop with nothing in flight is not reported,
 * and the client is served again by a coordinator that comes back. A cancel
 * is not a request: it leaves nothing pending. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <zmq.h>

#include "error.h"
#include "tandem_client.h"
#include "tmpdir_fixture.h"

/* The client must hear of a drop in well under this (a killed process's
 * sockets are closed by the kernel at once). */
#define LOST_WITHIN_MS 2000

struct fake {
    struct tmpdir_fixture *tmp;
    char endpoint[128];
    void *zctx;
    void *router;
    void *zap;    /* the CURVE tests' ZAP handler */
};

static int setup(void **state)
{
    void *tmp = NULL;
    if (tmpdir_fixture_setup(&tmp, "tandem_client") != 0)
        return -1;
    struct fake *f = calloc(1, sizeof(*f));
    if (f == NULL)
        return -1;
    f->tmp = tmp;
    snprintf(f->endpoint, sizeof(f->endpoint), "ipc://%s/c.sock", f->tmp->dir);
    f->zctx = zmq_ctx_new();
    *state = f;
    return f->zctx != NULL ? 0 : -1;
}

static int teardown(void **state)
{
    struct fake *f = *state;
    if (f->router != NULL)
        zmq_close(f->router);
    if (f->zap != NULL)
        zmq_close(f->zap);
    zmq_ctx_term(f->zctx);
    void *tmp = f->tmp;
    free(f);
    return tmpdir_fixture_teardown(&tmp);
}

static void router_start(struct fake *f)
{
    f->router = zmq_socket(f->zctx, ZMQ_ROUTER);
    assert_non_null(f->router);
    int linger = 0, timeout_ms = 5000;
    assert_int_equal(zmq_setsockopt(f->router, ZMQ_LINGER, &linger, sizeof(linger)), 0);
    assert_int_equal(zmq_setsockopt(f->router, ZMQ_RCVTIMEO, &timeout_ms, sizeof(timeout_ms)), 0);
    assert_int_equal(zmq_bind(f->router, f->endpoint), 0);
}

/* The coordinator dies: its socket closes, the peer sees the drop. */
static void router_kill(struct fake *f)
{
    assert_int_equal(zmq_close(f->router), 0);
    f->router = NULL;
}

/* Receives one client message; returns its routing id's length (id copied). */
static size_t router_recv(struct fake *f, uint8_t *id, size_t id_max)
{
    int n = zmq_recv(f->router, id, id_max, 0);
    assert_true(n > 0);
    int more = 0;
    size_t sz = sizeof(more);
    assert_int_equal(zmq_getsockopt(f->router, ZMQ_RCVMORE, &more, &sz), 0);
    assert_true(more);
    char body[512];
    assert_true(zmq_recv(f->router, body, sizeof(body), 0) > 0);
    return (size_t)n;
}

static void router_reply(struct fake *f, const uint8_t *id, size_t id_size, const char *json)
{
    assert_int_equal(zmq_send(f->router, id, id_size, ZMQ_SNDMORE), (int)id_size);
    assert_int_equal(zmq_send(f->router, json, strlen(json), 0), (int)strlen(json));
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1000.0 + (double)ts.tv_nsec / 1e6;
}

/* A CURVE coordinator that admits no client: its ZAP handler (RFC 27, a REP
 * at inproc://zeromq.zap.01 in the router's context) answers every
 * handshake with status 400. */
static void *curve_router_start(struct fake *f, char server_public[41])
{
    char secret[41];
    assert_int_equal(zmq_curve_keypair(server_public, secret), 0);
    void *zap = zmq_socket(f->zctx, ZMQ_REP);
    assert_non_null(zap);
    int linger = 0, on = 1;
    assert_int_equal(zmq_setsockopt(zap, ZMQ_LINGER, &linger, sizeof(linger)), 0);
    assert_int_equal(zmq_bind(zap, "inproc://zeromq.zap.01"), 0);
    f->router = zmq_socket(f->zctx, ZMQ_ROUTER);
    assert_non_null(f->router);
    assert_int_equal(zmq_setsockopt(f->router, ZMQ_LINGER, &linger, sizeof(linger)), 0);
    assert_int_equal(zmq_setsockopt(f->router, ZMQ_CURVE_SERVER, &on, sizeof(on)), 0);
    assert_int_equal(zmq_setsockopt(f->router, ZMQ_CURVE_SECRETKEY, secret, 40), 0);
    assert_int_equal(zmq_bind(f->router, f->endpoint), 0);
    return zap;
}

/* Answers the handshakes that arrive within ms with status ("200" admits,
 * "400" refuses). Returns how many. */
static int zap_answer_for(void *zap, int ms, const char *status)
{
    int answered = 0;
    double end = now_ms() + ms;
    for (double left = ms; left > 0; left = end - now_ms()) {
        zmq_pollitem_t item = {.socket = zap, .events = ZMQ_POLLIN};
        int n = zmq_poll(&item, 1, (long)left);
        assert_true(n >= 0);
        if (n == 0)
            continue;
        char req_id[256];
        int more = 1, part = 0;
        size_t sz = sizeof(more);
        int id_size = 0;
        while (more) {
            char buf[512];
            int got = zmq_recv(zap, buf, sizeof(buf), 0);
            assert_true(got >= 0);
            if (part == 1) {
                id_size = got < (int)sizeof(req_id) ? got : (int)sizeof(req_id);
                memcpy(req_id, buf, (size_t)id_size);
            }
            part++;
            assert_int_equal(zmq_getsockopt(zap, ZMQ_RCVMORE, &more, &sz), 0);
        }
        assert_int_equal(zmq_send(zap, "1.0", 3, ZMQ_SNDMORE), 3);
        assert_int_equal(zmq_send(zap, req_id, (size_t)id_size, ZMQ_SNDMORE), id_size);
        assert_int_equal(zmq_send(zap, status, 3, ZMQ_SNDMORE), 3);
        assert_int_equal(zmq_send(zap, "-", 1, ZMQ_SNDMORE), 1);
        assert_int_equal(zmq_send(zap, "", 0, ZMQ_SNDMORE), 0);
        assert_int_equal(zmq_send(zap, "", 0, 0), 0);
        answered++;
    }
    return answered;
}

static int zap_refuse_for(void *zap, int ms)
{
    return zap_answer_for(zap, ms, "400");
}

static const char request[] = "{\"v\":1,\"type\":\"generate\",\"id\":\"r\",\"prompt_ids\":[1,2]}";

/* A request from a refused client fails with ERR_UNAVAILABLE naming why, in
 * well under LOST_WITHIN_MS: at once when the client has seen its refusal,
 * else at the next handshake (ZeroMQ retries; refused again while the ZAP
 * handler is served between short receives). */
static void expect_refused(struct tandem_client *c, void *zap, const char *why)
{
    char err[ERR_MSG_MAX] = "";
    double t0 = now_ms();
    int rc = tandem_client_send_raw(c, request, strlen(request), err);
    while (rc == 0 && now_ms() - t0 < LOST_WITHIN_MS) {
        struct tandem_client_event ev;
        zap_refuse_for(zap, 50);
        rc = tandem_client_recv(c, 50, &ev, err);
        if (rc == 0)
            tandem_client_event_free(&ev);
        if (rc == ERR_TIMEOUT)
            rc = 0;
    }
    assert_int_equal(rc, ERR_UNAVAILABLE);
    assert_non_null(strstr(err, "refused the connection"));
    assert_non_null(strstr(err, why));
    assert_true(now_ms() - t0 < LOST_WITHIN_MS);
}

/* The request's optional speculation fields go out only when set. */
static void test_tandem_client_request_carries_the_draft_source(void **state)
{
    (void)state;
    struct tandem_client_request req;
    tandem_client_request_init(&req);
    const int32_t ids[2] = {5, 6};
    req.ids = ids;
    req.n_ids = 2;
    cJSON *j = NULL;
    char err[ERR_MSG_MAX];
    assert_int_equal(tandem_client_request_to_json(&req, &j, err), 0);
    assert_null(cJSON_GetObjectItemCaseSensitive(j, "draft"));
    cJSON_Delete(j);
    req.draft = "suffix";
    req.spec_mode = "point_mass";
    assert_int_equal(tandem_client_request_to_json(&req, &j, err), 0);
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "draft")), "suffix");
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "spec_mode")), "point_mass");
    cJSON_Delete(j);
}

static void test_tandem_client_reports_lost_request_after_earlier_replies(void **state)
{
    struct fake *f = *state;
    char err[ERR_MSG_MAX];
    router_start(f);
    struct tandem_client *c = NULL;
    assert_int_equal(tandem_client_create(&c, f->endpoint, err), 0);
    assert_int_equal(tandem_client_send_raw(c, request, strlen(request), err), 0);
    uint8_t id[256];
    size_t id_size = router_recv(f, id, sizeof(id));
    router_reply(f, id, id_size, "{\"type\":\"token\",\"id\":\"r\",\"text\":\"a\",\"ids\":[7]}");
    /* The token is surely on the client's side before the death: it was read. */
    struct tandem_client_event ev;
    assert_int_equal(tandem_client_recv(c, 5000, &ev, err), 0);
    assert_int_equal(ev.type, TANDEM_CLIENT_EVENT_TOKEN);
    tandem_client_event_free(&ev);
    router_reply(f, id, id_size, "{\"type\":\"token\",\"id\":\"r\",\"text\":\"b\",\"ids\":[8]}");
    router_kill(f);
    double t0 = now_ms();
    /* The reply sent before the death comes first, then the loss. */
    assert_int_equal(tandem_client_recv(c, 10000, &ev, err), 0);
    assert_string_equal(ev.text, "b");
    tandem_client_event_free(&ev);
    int rc = tandem_client_recv(c, 10000, &ev, err);
    double waited = now_ms() - t0;
    assert_int_equal(rc, ERR_UNAVAILABLE);
    assert_non_null(strstr(err, "lost the connection to the coordinator"));
    assert_true(waited < LOST_WITHIN_MS);
    /* Reported once: afterwards, silence is a timeout again. */
    assert_int_equal(tandem_client_recv(c, 100, &ev, err), ERR_TIMEOUT);
    tandem_client_destroy(c);
}

static void test_tandem_client_drop_with_nothing_sent_is_not_reported(void **state)
{
    struct fake *f = *state;
    char err[ERR_MSG_MAX];
    router_start(f);
    struct tandem_client *c = NULL;
    assert_int_equal(tandem_client_create(&c, f->endpoint, err), 0);
    /* A stats round trip: the connection is up, and nothing is in flight after it. */
    const char stats[] = "{\"v\":1,\"type\":\"stats\"}";
    assert_int_equal(tandem_client_send_raw(c, stats, strlen(stats), err), 0);
    uint8_t id[256];
    size_t id_size = router_recv(f, id, sizeof(id));
    router_reply(f, id, id_size, "{\"type\":\"stats\",\"id\":\"\"}");
    struct tandem_client_event ev;
    assert_int_equal(tandem_client_recv(c, 5000, &ev, err), 0);
    assert_int_equal(ev.type, TANDEM_CLIENT_EVENT_STATS);
    tandem_client_event_free(&ev);
    /* The client read its reply: nothing is pending, a drop loses nothing
     * and is not an error; a request sent after it is served. */
    router_kill(f);
    assert_int_equal(tandem_client_recv(c, 500, &ev, err), ERR_TIMEOUT);
    router_start(f);
    assert_int_equal(tandem_client_send_raw(c, stats, strlen(stats), err), 0);
    id_size = router_recv(f, id, sizeof(id));
    router_reply(f, id, id_size, "{\"type\":\"stats\",\"id\":\"\"}");
    assert_int_equal(tandem_client_recv(c, 5000, &ev, err), 0);
    assert_int_equal(ev.type, TANDEM_CLIENT_EVENT_STATS);
    tandem_client_event_free(&ev);
    tandem_client_destroy(c);
}

static void test_tandem_client_cancel_leaves_nothing_pending(void **state)
{
    struct fake *f = *state;
    char err[ERR_MSG_MAX];
    router_start(f);
    struct tandem_client *c = NULL;
    assert_int_equal(tandem_client_create(&c, f->endpoint, err), 0);
    assert_int_equal(tandem_client_send_raw(c, request, strlen(request), err), 0);
    uint8_t id[256];
    size_t id_size = router_recv(f, id, sizeof(id));
    router_reply(f, id, id_size, "{\"type\":\"done\",\"id\":\"r\",\"text\":\"\",\"ids\":[]}");
    struct tandem_client_event ev;
    assert_int_equal(tandem_client_recv(c, 5000, &ev, err), 0);
    assert_int_equal(ev.type, TANDEM_CLIENT_EVENT_DONE);
    tandem_client_event_free(&ev);
    /* A cancel of a request that already ended gets no reply at all. */
    assert_int_equal(tandem_client_cancel(c, "r", err), 0);
    router_recv(f, id, sizeof(id));
    router_kill(f);
    assert_int_equal(tandem_client_recv(c, 500, &ev, err), ERR_TIMEOUT);
    tandem_client_destroy(c);
}

static void test_tandem_client_is_served_by_a_restarted_coordinator(void **state)
{
    struct fake *f = *state;
    char err[ERR_MSG_MAX];
    router_start(f);
    struct tandem_client *c = NULL;
    assert_int_equal(tandem_client_create(&c, f->endpoint, err), 0);
    assert_int_equal(tandem_client_send_raw(c, request, strlen(request), err), 0);
    uint8_t id[256];
    router_recv(f, id, sizeof(id));
    router_kill(f);
    struct tandem_client_event ev;
    assert_int_equal(tandem_client_recv(c, 10000, &ev, err), ERR_UNAVAILABLE);
    /* The coordinator is back at the same endpoint: ZeroMQ reconnects, a
     * request sent now is answered, and the old drop is not reported again. */
    router_start(f);
    assert_int_equal(tandem_client_send_raw(c, request, strlen(request), err), 0);
    size_t id_size = router_recv(f, id, sizeof(id));
    router_reply(f, id, id_size, "{\"type\":\"done\",\"id\":\"r\",\"text\":\"\",\"ids\":[]}");
    assert_int_equal(tandem_client_recv(c, 10000, &ev, err), 0);
    assert_int_equal(ev.type, TANDEM_CLIENT_EVENT_DONE);
    tandem_client_event_free(&ev);
    tandem_client_destroy(c);
}

/* A refused handshake ends ZeroMQ's connection for good (no reconnect, no
 * pipe left to queue into): a request sent after it must fail at once with
 * the reason, not block in zmq_send (a DEALER with no pipe blocks). */
static void test_tandem_client_refused_key_is_an_error_not_a_hang(void **state)
{
    struct fake *f = *state;
    char err[ERR_MSG_MAX];
    char server_public[41], stranger_public[41], stranger_secret[41];
    void *zap = curve_router_start(f, server_public);
    f->zap = zap;
    assert_int_equal(zmq_curve_keypair(stranger_public, stranger_secret), 0);
    struct tandem_client *c = NULL;
    assert_int_equal(tandem_client_create_curve(&c, f->endpoint, server_public, stranger_secret, err), 0);
    /* The refusal lands before the client sends anything. */
    assert_true(zap_refuse_for(zap, 500) >= 1);
    expect_refused(c, zap, "does not admit this side's CURVE key");
    /* libzmq does not try again after a ZAP refusal (no handshake in 3 s
     * without the following), so the refused send asked for a new
     * connection: once the coordinator admits the key, the next request
     * goes through. */
    assert_true(zap_answer_for(zap, 1000, "200") >= 1);
    uint8_t id[256];
    size_t id_size = 0;
    for (int tries = 0; tries < 20 && id_size == 0; tries++) {
        if (tandem_client_send_raw(c, request, strlen(request), err) == 0)
            id_size = router_recv(f, id, sizeof(id));
        else
            zap_answer_for(zap, 250, "200");
    }
    assert_true(id_size > 0);
    router_reply(f, id, id_size, "{\"type\":\"done\",\"id\":\"r\",\"text\":\"\",\"ids\":[]}");
    struct tandem_client_event ev;
    assert_int_equal(tandem_client_recv(c, 5000, &ev, err), 0);
    assert_int_equal(ev.type, TANDEM_CLIENT_EVENT_DONE);
    tandem_client_event_free(&ev);
    tandem_client_destroy(c);
}

/* The same for a client without CURVE at a CURVE coordinator: the two ends
 * disagree on the security mechanism, and the client says so. */
static void test_tandem_client_plain_client_at_curve_server_is_told_why(void **state)
{
    struct fake *f = *state;
    char err[ERR_MSG_MAX];
    char server_public[41];
    void *zap = curve_router_start(f, server_public);
    f->zap = zap;
    struct tandem_client *c = NULL;
    assert_int_equal(tandem_client_create(&c, f->endpoint, err), 0);
    zap_refuse_for(zap, 500);
    expect_refused(c, zap, "CURVE");
    tandem_client_destroy(c);
}

/* A CURVE client holding another server's public key: the coordinator cannot
 * read its hello and closes the connection; the client's request is queued
 * for ZeroMQ's retry and fails when that is refused too, naming the key. */
static void test_tandem_client_wrong_server_key_is_told_why(void **state)
{
    struct fake *f = *state;
    char err[ERR_MSG_MAX];
    char server_public[41], other_public[41], other_secret[41];
    f->zap = curve_router_start(f, server_public);
    assert_int_equal(zmq_curve_keypair(other_public, other_secret), 0);
    struct tandem_client *c = NULL;
    assert_int_equal(tandem_client_create_curve(&c, f->endpoint, other_public, NULL, err), 0);
    zap_refuse_for(f->zap, 300);
    expect_refused(c, f->zap, "public key");
    tandem_client_destroy(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tandem_client_request_carries_the_draft_source),
        cmocka_unit_test_setup_teardown(test_tandem_client_reports_lost_request_after_earlier_replies, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_tandem_client_drop_with_nothing_sent_is_not_reported, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tandem_client_cancel_leaves_nothing_pending, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tandem_client_is_served_by_a_restarted_coordinator, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tandem_client_refused_key_is_an_error_not_a_hang, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tandem_client_plain_client_at_curve_server_is_told_why, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_tandem_client_wrong_server_key_is_told_why, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
