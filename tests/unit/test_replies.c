/* test_replies.c: the coordinator's client replies (coordinator/replies.c)
 * over a real ROUTER socket (ZMQ_ROUTER_MANDATORY, as the coordinator's)
 * and a client DEALER that reads only when the test says: its queue fills
 * after a few messages and the ROUTER answers EAGAIN, the case that used
 * to be covered only by a multi-minute end-to-end script.
 *
 * Covered: a final reply refused by a full queue is held, not dropped; it
 * is sent again on a later tick once the client reads, and only then; one
 * held past COORD_HELD_REPLY_MS is dropped and counted; a reply to a client
 * that is gone is not held and the client is noted as gone; past
 * COORD_HELD_REPLIES_MAX held replies the next one is dropped and counted;
 * a token event refused by a full queue marks the request stalled.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <zmq.h>

#include "connections.h"
#include "coord_state.h"
#include "error.h"
#include "output.h"
#include "protocol.h"
#include "replies.h"

#define CLIENT_ID "client-a"

struct fixture {
    struct coordinator c;
    void *zctx, *client;
};

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof *f);
    if (!f)
        return -1;
    char err[ERR_MSG_MAX];
    metrics_init(&f->c.metrics);
    f->zctx = zmq_ctx_new();
    f->c.clients = f->zctx ? zmq_socket(f->zctx, ZMQ_ROUTER) : NULL;
    if (!f->c.clients)
        return -1;
    const int one = 1, hwm = 1;
    if (zmq_setsockopt(f->c.clients, ZMQ_ROUTER_MANDATORY, &one, sizeof one) != 0 ||
        zmq_setsockopt(f->c.clients, ZMQ_SNDHWM, &hwm, sizeof hwm) != 0 ||
        connections_create(&f->c.conns, f->zctx, f->c.clients, err) != 0 ||
        zmq_bind(f->c.clients, "inproc://test-replies") != 0)
        return -1;
    f->client = zmq_socket(f->zctx, ZMQ_DEALER);
    if (!f->client || zmq_setsockopt(f->client, ZMQ_ROUTING_ID, CLIENT_ID, strlen(CLIENT_ID)) != 0 ||
        zmq_setsockopt(f->client, ZMQ_RCVHWM, &hwm, sizeof hwm) != 0 ||
        zmq_connect(f->client, "inproc://test-replies") != 0)
        return -1;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    replies_free_held(&f->c);
    connections_destroy(f->c.conns);
    const int zero = 0;
    zmq_setsockopt(f->client, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(f->c.clients, ZMQ_LINGER, &zero, sizeof zero);
    zmq_close(f->client);
    zmq_close(f->c.clients);
    zmq_ctx_term(f->zctx);
    free(f);
    return 0;
}

/* One pass of the coordinator's poll loop over the client socket, then a
 * tick: zmq_poll reads the socket's events, which is when libzmq takes in
 * a reader's notice that its queue has room again. */
static void tick(struct coordinator *c, double now_ms)
{
    int events = 0;
    size_t size = sizeof events;
    assert_int_equal(zmq_getsockopt(c->clients, ZMQ_EVENTS, &events, &size), 0);
    replies_retry_held(c, now_ms);
}

static enum reply_sent send_filler(struct coordinator *c)
{
    cJSON *m = protocol_header_new("token");
    assert_non_null(m);
    cJSON_AddStringToObject(m, "id", "filler");
    const enum reply_sent r = replies_send(c, (const uint8_t *)CLIENT_ID, strlen(CLIENT_ID), m);
    cJSON_Delete(m);
    return r;
}

/* Sends fillers until the client's queue refuses one; returns how many went. */
static int fill_queue(struct coordinator *c)
{
    int sent = 0;
    for (;;) {
        const enum reply_sent r = send_filler(c);
        if (r == REPLY_FULL)
            return sent;
        assert_int_equal(r, REPLY_SENT);
        assert_true(++sent < 1000);
    }
}

/* What the client has: the ids of the messages it reads, fillers aside,
 * into ids (up to max); returns how many messages it read in all. */
static int client_reads(struct fixture *f, char ids[][32], int max, int *n_ids)
{
    int n = 0;
    *n_ids = 0;
    for (;;) {
        char buf[4096];
        const int len = zmq_recv(f->client, buf, sizeof buf - 1, ZMQ_DONTWAIT);
        if (len < 0) {
            assert_int_equal(zmq_errno(), EAGAIN);
            return n;
        }
        assert_true(len < (int)sizeof buf);
        buf[len] = '\0';
        n++;
        cJSON *m = cJSON_Parse(buf);
        assert_non_null(m);
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(m, "id");
        if (cJSON_IsString(id) && strcmp(id->valuestring, "filler") != 0 && *n_ids < max)
            snprintf(ids[(*n_ids)++], 32, "%s", id->valuestring);
        cJSON_Delete(m);
    }
}

/* A final reply meeting a full queue is held, retried on each tick while
 * the queue stays full, and delivered once the client reads: never
 * dropped, nothing counted as undelivered. */
static void test_replies_full_queue_holds_the_final_reply_until_read(void **state)
{
    struct fixture *f = *state;
    struct coordinator *c = &f->c;
    assert_true(fill_queue(c) >= 1);
    replies_error(c, (const uint8_t *)CLIENT_ID, strlen(CLIENT_ID), "r1", METRICS_ERR_INVALID_REQUEST,
                  "a test's error");
    assert_int_equal(c->n_held, 1);
    assert_int_equal(c->metrics.requests_failed[METRICS_ERR_INVALID_REQUEST], 1);
    const double since = c->held[0].since_ms;
    for (int t = 1; t <= 3; t++) {
        tick(c, since + t * 100.0);
        assert_int_equal(c->n_held, 1);
    }
    char ids[4][32];
    int n_ids;
    assert_true(client_reads(f, ids, 4, &n_ids) >= 1);
    assert_int_equal(n_ids, 0); /* the error was not sent meanwhile */
    tick(c, since + 400.0);
    assert_int_equal(c->n_held, 0);
    assert_int_equal(client_reads(f, ids, 4, &n_ids), 1);
    assert_int_equal(n_ids, 1);
    assert_string_equal(ids[0], "r1");
    assert_int_equal(c->metrics.replies_undelivered_total, 0);
}

/* A client that reads nothing for COORD_HELD_REPLY_MS loses its held
 * reply, and the loss is counted. */
static void test_replies_held_reply_dropped_after_the_limit_and_counted(void **state)
{
    struct fixture *f = *state;
    struct coordinator *c = &f->c;
    fill_queue(c);
    replies_error(c, (const uint8_t *)CLIENT_ID, strlen(CLIENT_ID), "r2", METRICS_ERR_INVALID_REQUEST,
                  "a test's error");
    assert_int_equal(c->n_held, 1);
    const double since = c->held[0].since_ms;
    tick(c, since + COORD_HELD_REPLY_MS - 1.0);
    assert_int_equal(c->n_held, 1);
    assert_int_equal(c->metrics.replies_undelivered_total, 0);
    tick(c, since + COORD_HELD_REPLY_MS + 1.0);
    assert_int_equal(c->n_held, 0);
    assert_int_equal(c->metrics.replies_undelivered_total, 1);
    char ids[4][32];
    int n_ids;
    client_reads(f, ids, 4, &n_ids);
    assert_int_equal(n_ids, 0);
}

/* A reply to a routing id no client holds: gone, not held, the id noted
 * once (its requests are cancelled by the poll loop). */
static void test_replies_gone_client_is_noted_not_held(void **state)
{
    struct fixture *f = *state;
    struct coordinator *c = &f->c;
    cJSON *m = protocol_header_new("done");
    assert_non_null(m);
    for (int i = 0; i < 2; i++)
        assert_int_equal(replies_send(c, (const uint8_t *)"nobody", 6, m), REPLY_GONE);
    cJSON_Delete(m);
    assert_int_equal(c->n_gone, 1);
    assert_int_equal(c->gone_size[0], 6);
    assert_memory_equal(c->gone[0], "nobody", 6);
    replies_error(c, (const uint8_t *)"nobody", 6, "r3", METRICS_ERR_INVALID_REQUEST, "gone");
    assert_int_equal(c->n_held, 0);
}

/* Past COORD_HELD_REPLIES_MAX held replies, the next is dropped and
 * counted; the held ones all arrive once the client reads. */
static void test_replies_held_replies_are_bounded(void **state)
{
    struct fixture *f = *state;
    struct coordinator *c = &f->c;
    fill_queue(c);
    for (int i = 0; i <= COORD_HELD_REPLIES_MAX; i++) {
        char id[32];
        snprintf(id, sizeof id, "h%d", i);
        replies_error(c, (const uint8_t *)CLIENT_ID, strlen(CLIENT_ID), id, METRICS_ERR_INVALID_REQUEST,
                      "held");
    }
    assert_int_equal(c->n_held, COORD_HELD_REPLIES_MAX);
    assert_int_equal(c->metrics.replies_undelivered_total, 1);
    /* the client reads, a tick sends what fits, again and again */
    static char ids[COORD_HELD_REPLIES_MAX][32];
    int got = 0;
    const double since = c->held[0].since_ms;
    for (int t = 0; t < 10 * COORD_HELD_REPLIES_MAX && c->n_held > 0; t++) {
        int n_ids;
        client_reads(f, ids + got, COORD_HELD_REPLIES_MAX - got, &n_ids);
        got += n_ids;
        tick(c, since + 1.0);
    }
    int n_ids;
    client_reads(f, ids + got, COORD_HELD_REPLIES_MAX - got, &n_ids);
    got += n_ids;
    assert_int_equal(c->n_held, 0);
    assert_int_equal(got, COORD_HELD_REPLIES_MAX);
    assert_int_equal(c->metrics.replies_undelivered_total, 1);
}

/* The client's next message, parsed (the test frees it). */
static cJSON *client_next(struct fixture *f)
{
    char buf[4096];
    const int len = zmq_recv(f->client, buf, sizeof buf - 1, 0);
    assert_true(len > 0 && len < (int)sizeof buf);
    buf[len] = '\0';
    cJSON *m = cJSON_Parse(buf);
    assert_non_null(m);
    return m;
}

/* A failed choice of a request of several says which one ("index"); the
 * error of a request of one choice carries none, as before n existed. */
static void test_replies_error_of_a_choice_names_its_index(void **state)
{
    struct fixture *f = *state;
    struct coordinator *c = &f->c;
    struct seq s = {.index = 2, .n_choices = 3, .client_size = strlen(CLIENT_ID)};
    memcpy(s.client, CLIENT_ID, s.client_size);
    snprintf(s.id, sizeof s.id, "multi");
    replies_error_of(c, &s, METRICS_ERR_CONTEXT_FULL, "a choice ran out of context");
    cJSON *m = client_next(f);
    const cJSON *index = cJSON_GetObjectItemCaseSensitive(m, "index");
    assert_true(cJSON_IsNumber(index) && index->valueint == 2);
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "id")), "multi");
    assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "code")), "context_full");
    cJSON_Delete(m);
    s.index = 0;
    s.n_choices = 1;
    replies_error_of(c, &s, METRICS_ERR_CONTEXT_FULL, "one choice");
    m = client_next(f);
    assert_null(cJSON_GetObjectItemCaseSensitive(m, "index"));
    cJSON_Delete(m);
    assert_int_equal(c->metrics.requests_failed[METRICS_ERR_CONTEXT_FULL], 2);
}

/* cJSON's allocations, the n-th of which (from 1; 0: none) fails once. */
static int alloc_count, alloc_fail_at;

static void *failing_malloc(size_t size)
{
    if (++alloc_count == alloc_fail_at)
        return NULL;
    return malloc(size);
}

/* Memory running out while the done reply is built, at each of its
 * allocations in turn: the client gets either the whole done reply (its
 * text and ids) or an internal error naming the lost output, never a done
 * reply missing its output, and always exactly one of the two. */
static void test_replies_done_without_memory_is_an_error_not_half_a_reply(void **state)
{
    struct fixture *f = *state;
    struct coordinator *c = &f->c;
    char err[ERR_MSG_MAX];
    int32_t hist[6] = {1, 2, 3, 40, 41, 42};
    struct seq s = {.n_choices = 1, .client_size = strlen(CLIENT_ID), .hist = hist, .n_prompt = 3,
                    .generated = 3};
    memcpy(s.client, CLIENT_ID, s.client_size);
    snprintf(s.id, sizeof s.id, "oom");
    assert_int_equal(output_create(&s.out, NULL, NULL, 0, err), 0);
    int errors = 0, dones = 0;
    for (alloc_fail_at = 1; alloc_fail_at < 120; alloc_fail_at++) {
        alloc_count = 0;
        cJSON_Hooks hooks = {.malloc_fn = failing_malloc, .free_fn = free};
        cJSON_InitHooks(&hooks);
        replies_done(c, &s, METRICS_FINISH_LENGTH, 10.0);
        cJSON_InitHooks(NULL);
        tick(c, 20.0); /* a reply that failed to encode was held: it goes now */
        zmq_pollitem_t item = {.socket = f->client, .events = ZMQ_POLLIN};
        if (zmq_poll(&item, 1, 2000) != 1)
            fail_msg("allocation %d failing: no reply reached the client", alloc_fail_at);
        cJSON *m = client_next(f);
        const char *type = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "type"));
        assert_non_null(type);
        if (strcmp(type, "error") == 0) {
            assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "code")),
                                "internal");
            errors++;
        } else {
            assert_string_equal(type, "done");
            const cJSON *ids = cJSON_GetObjectItemCaseSensitive(m, "ids");
            assert_true(cJSON_IsArray(ids) && cJSON_GetArraySize(ids) == 3);
            assert_non_null(cJSON_GetObjectItemCaseSensitive(m, "text"));
            assert_non_null(cJSON_GetObjectItemCaseSensitive(m, "finish_reason"));
            dones++;
        }
        cJSON_Delete(m);
        int more = 0;
        size_t size = sizeof more;
        assert_int_equal(zmq_getsockopt(f->client, ZMQ_EVENTS, &more, &size), 0);
        assert_false(more & ZMQ_POLLIN); /* one reply, not two */
    }
    assert_true(errors >= 5); /* the output's parts each failed once */
    assert_true(dones >= 1);  /* and past them, the whole reply */
    output_destroy(s.out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_replies_full_queue_holds_the_final_reply_until_read, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_replies_held_reply_dropped_after_the_limit_and_counted, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_replies_gone_client_is_noted_not_held, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replies_held_replies_are_bounded, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replies_error_of_a_choice_names_its_index, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replies_done_without_memory_is_an_error_not_half_a_reply,
                                        setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
