/* test_connections.c: coordinator/connections.c over a real ROUTER on an
 * ipc:// endpoint: a message is bound to its connection (source descriptor
 * and generation), the binding goes stale when that connection drops, and a
 * new connection on the same descriptor number (the kernel reuses it) is a
 * new generation, so a request of the old one never passes for the new. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <zmq.h>

#include "connections.h"
#include "error.h"
#include "tmpdir_fixture.h"

struct rig {
    struct tmpdir_fixture *tmp;
    char endpoint[128];
    void *zctx;
    void *router;
    struct connections *cs;
    void *clients[4];        /* closed at teardown (a failed assertion skips the test's own close) */
    int n_clients;
};

static int setup(void **state)
{
    void *tmp = NULL;
    if (tmpdir_fixture_setup(&tmp, "tandem_conns") != 0)
        return -1;
    struct rig *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return -1;
    r->tmp = tmp;
    snprintf(r->endpoint, sizeof(r->endpoint), "ipc://%s/c.sock", r->tmp->dir);
    r->zctx = zmq_ctx_new();
    r->router = zmq_socket(r->zctx, ZMQ_ROUTER);
    char err[ERR_MSG_MAX];
    int linger = 0, timeout_ms = 5000;
    if (r->router == NULL || zmq_setsockopt(r->router, ZMQ_LINGER, &linger, sizeof(linger)) != 0 ||
        zmq_setsockopt(r->router, ZMQ_RCVTIMEO, &timeout_ms, sizeof(timeout_ms)) != 0 ||
        connections_create(&r->cs, r->zctx, r->router, err) != 0 || zmq_bind(r->router, r->endpoint) != 0)
        return -1;
    *state = r;
    return 0;
}

static int teardown(void **state)
{
    struct rig *r = *state;
    for (int i = 0; i < r->n_clients; i++)
        if (r->clients[i] != NULL)
            zmq_close(r->clients[i]);
    connections_destroy(r->cs);
    zmq_close(r->router);
    zmq_ctx_term(r->zctx);
    void *tmp = r->tmp;
    free(r);
    return tmpdir_fixture_teardown(&tmp);
}

static void *client(struct rig *r, const char *routing_id)
{
    void *s = zmq_socket(r->zctx, ZMQ_DEALER);
    assert_non_null(s);
    int linger = 0;
    assert_int_equal(zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger)), 0);
    if (routing_id != NULL)
        assert_int_equal(zmq_setsockopt(s, ZMQ_ROUTING_ID, routing_id, strlen(routing_id)), 0);
    assert_int_equal(zmq_connect(s, r->endpoint), 0);
    assert_true(r->n_clients < 4);
    r->clients[r->n_clients++] = s;
    return s;
}

/* The peer goes away (as a client process that exits). */
static void client_close(struct rig *r, void *s)
{
    for (int i = 0; i < r->n_clients; i++)
        if (r->clients[i] == s)
            r->clients[i] = NULL;
    assert_int_equal(zmq_close(s), 0);
}

/* Receives one message at the ROUTER as the coordinator does: once it is
 * readable, the events first (its connection's acceptance is among them),
 * then the message; returns the source descriptor of its frame. */
static int receive(struct rig *r)
{
    zmq_pollitem_t item = {.socket = r->router, .events = ZMQ_POLLIN};
    assert_int_equal(zmq_poll(&item, 1, 5000), 1);
    connections_update(r->cs);
    char id[256];
    assert_true(zmq_recv(r->router, id, sizeof(id), 0) > 0);
    zmq_msg_t part;
    assert_int_equal(zmq_msg_init(&part), 0);
    assert_true(zmq_msg_recv(&part, r->router, 0) >= 0);
    int fd = zmq_msg_get(&part, ZMQ_SRCFD);
    zmq_msg_close(&part);
    assert_true(fd >= 0);
    return fd;
}

/* Reads events until a drop is seen (the I/O thread reports it shortly after
 * the peer closed). Returns the number of drops. */
static int wait_drop(struct rig *r)
{
    for (int i = 0; i < 500; i++) {
        int n = connections_update(r->cs);
        if (n > 0)
            return n;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return 0;
}

static void test_connections_request_goes_stale_when_its_connection_drops(void **state)
{
    struct rig *r = *state;
    void *a = client(r, "a-chosen-id");
    assert_int_equal(zmq_send(a, "x", 1, 0), 1);
    int fd = receive(r);
    struct conn_ref ref = connections_ref(r->cs, fd);
    assert_true(connections_open(r->cs, ref));
    client_close(r, a);
    assert_int_equal(wait_drop(r), 1);
    assert_false(connections_open(r->cs, ref));
}

static void test_connections_reused_descriptor_is_a_new_generation(void **state)
{
    struct rig *r = *state;
    void *a = client(r, NULL);
    assert_int_equal(zmq_send(a, "x", 1, 0), 1);
    int fd_a = receive(r);
    struct conn_ref ref_a = connections_ref(r->cs, fd_a);
    client_close(r, a);
    assert_int_equal(wait_drop(r), 1);
    /* The kernel hands B the lowest free descriptor, usually A's. Whatever
     * the number, A's request must not pass for B's connection, and B's
     * must be open. */
    void *b = client(r, NULL);
    assert_int_equal(zmq_send(b, "y", 1, 0), 1);
    int fd_b = receive(r);
    struct conn_ref ref_b = connections_ref(r->cs, fd_b);
    assert_true(connections_open(r->cs, ref_b));
    assert_false(connections_open(r->cs, ref_a));
    if (fd_b == fd_a)
        assert_int_not_equal(ref_b.gen, ref_a.gen);
    client_close(r, b);
}

static void test_connections_changed_flags_events_of_the_last_update(void **state)
{
    struct rig *r = *state;
    void *a = client(r, NULL);
    assert_int_equal(zmq_send(a, "x", 1, 0), 1);
    int fd = receive(r);
    /* Nothing happened on fd since: not changed. */
    connections_update(r->cs);
    assert_false(connections_changed(r->cs, fd));
    client_close(r, a);
    assert_int_equal(wait_drop(r), 1);
    assert_true(connections_changed(r->cs, fd));
    connections_update(r->cs);
    assert_false(connections_changed(r->cs, fd));
    assert_false(connections_changed(r->cs, -1));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_connections_request_goes_stale_when_its_connection_drops, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_connections_reused_descriptor_is_a_new_generation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_connections_changed_flags_events_of_the_last_update, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
