/* test_lane.c: lane framing over real SOCK_SEQPACKET sockets (a socketpair,
 * and a listen/connect/accept through a socket file). */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "error.h"
#include "lane.h"
#include "protocol.h"
#include "tmpdir_fixture.h"

#define MAX_BYTES 4096

static void make_pair(int fd[2])
{
    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK, 0, fd), 0);
}

static void send_typed(int fd, const char *type, int seq)
{
    char err[ERR_MSG_MAX];
    cJSON *h = protocol_header_new(type);
    assert_non_null(h);
    assert_non_null(cJSON_AddNumberToObject(h, "seq", seq));
    assert_int_equal(lane_send(fd, h, NULL, 0, err), 0);
    cJSON_Delete(h);
}

static int recv_seq(int fd, struct protocol_msg *m)
{
    char err[ERR_MSG_MAX];
    assert_int_equal(lane_recv(fd, MAX_BYTES, m, err), 0);
    int seq = -1;
    assert_int_equal(protocol_get_int(m->header, "seq", 0, 1000, &seq, err), 0);
    return seq;
}

static void test_round_trip_keeps_header_frames_and_order(void **state)
{
    (void)state;
    int fd[2];
    make_pair(fd);
    char err[ERR_MSG_MAX];
    cJSON *h = protocol_header_new(PROTOCOL_VERIFY);
    assert_non_null(cJSON_AddStringToObject(h, "note", "héllo"));
    const int32_t tokens[3] = {7, -1, 128255};
    const char empty[1] = {0};
    const struct protocol_frame frames[2] = {{tokens, sizeof tokens}, {empty, 0}};
    assert_int_equal(lane_send(fd[0], h, frames, 2, err), 0);
    char *printed = cJSON_PrintUnformatted(h);
    const size_t header_bytes = strlen(printed);
    free(printed);
    cJSON_Delete(h);
    send_typed(fd[0], PROTOCOL_HEARTBEAT, 2);

    struct protocol_msg m;
    assert_int_equal(lane_recv(fd[1], MAX_BYTES, &m, err), 0);
    assert_string_equal(m.type, PROTOCOL_VERIFY);
    const char *note = NULL;
    assert_int_equal(protocol_get_string(m.header, "note", 16, &note, err), 0);
    assert_string_equal(note, "héllo");
    assert_int_equal(m.n_frames, 2);
    assert_int_equal(m.frame_size_bytes[0], sizeof tokens);
    assert_memory_equal(m.frame_data[0], tokens, sizeof tokens);
    assert_int_equal(m.frame_size_bytes[1], 0);
    assert_int_equal(m.total_bytes, header_bytes + sizeof tokens);
    assert_int_equal(m.identity_size, 0);
    protocol_msg_free(&m);
    assert_int_equal(recv_seq(fd[1], &m), 2);
    assert_string_equal(m.type, PROTOCOL_HEARTBEAT);
    protocol_msg_free(&m);
    assert_int_equal(lane_recv(fd[1], MAX_BYTES, &m, err), ERR_TIMEOUT);
    protocol_msg_free(&m);
    close(fd[0]);
    close(fd[1]);
}

static void test_end_of_file_both_ways(void **state)
{
    (void)state;
    int fd[2];
    make_pair(fd);
    char err[ERR_MSG_MAX];
    send_typed(fd[0], PROTOCOL_HEARTBEAT, 1);
    close(fd[0]);
    struct protocol_msg m;
    /* what was sent before the close still arrives, then the end */
    assert_int_equal(recv_seq(fd[1], &m), 1);
    protocol_msg_free(&m);
    assert_int_equal(lane_recv(fd[1], MAX_BYTES, &m, err), ERR_CANCELLED);
    protocol_msg_free(&m);
    cJSON *h = protocol_header_new(PROTOCOL_HEARTBEAT);
    assert_int_equal(lane_send(fd[1], h, NULL, 0, err), ERR_CANCELLED);
    cJSON_Delete(h);
    close(fd[1]);
}

/* Writes a raw datagram (forged prefix and body). */
static void send_raw(int fd, const void *data, size_t size)
{
    assert_int_equal(send(fd, data, size, 0), (ssize_t)size);
}

struct raw_prefix {
    uint32_t magic, header_bytes, n_frames, frame_bytes[PROTOCOL_MAX_FRAMES];
};

static void expect_protocol_error(int fd, const char *needle)
{
    char err[ERR_MSG_MAX] = "";
    struct protocol_msg m;
    assert_int_equal(lane_recv(fd, MAX_BYTES, &m, err), ERR_PROTOCOL);
    if (!strstr(err, needle))
        fail_msg("error \"%s\" does not name \"%s\"", err, needle);
    protocol_msg_free(&m);
}

static void test_bad_datagrams_are_refused_and_consumed(void **state)
{
    (void)state;
    int fd[2];
    make_pair(fd);
    const char header[] = "{\"v\":1,\"type\":\"heartbeat\"}";
    char buf[256];
    struct raw_prefix p = {.magic = 0x314E4C54u, .header_bytes = sizeof header - 1};

    /* a wrong magic */
    struct raw_prefix bad = p;
    bad.magic = 0x12345678u;
    memcpy(buf, &bad, sizeof bad);
    memcpy(buf + sizeof bad, header, sizeof header - 1);
    send_raw(fd[0], buf, sizeof bad + sizeof header - 1);
    /* a prefix that counts more bytes than the datagram has */
    bad = p;
    bad.header_bytes += 5;
    memcpy(buf, &bad, sizeof bad);
    send_raw(fd[0], buf, sizeof bad + sizeof header - 1);
    /* too many frames */
    bad = p;
    bad.n_frames = PROTOCOL_MAX_FRAMES + 1;
    memcpy(buf, &bad, sizeof bad);
    send_raw(fd[0], buf, sizeof bad + sizeof header - 1);
    /* shorter than a prefix */
    send_raw(fd[0], "xy", 2);
    /* a header that is not JSON, and one without "v" */
    const char not_json[] = "{\"v\":1,";
    bad = p;
    bad.header_bytes = sizeof not_json - 1;
    memcpy(buf, &bad, sizeof bad);
    memcpy(buf + sizeof bad, not_json, sizeof not_json - 1);
    send_raw(fd[0], buf, sizeof bad + sizeof not_json - 1);
    const char no_v[] = "{\"type\":\"x\"}";
    bad.header_bytes = sizeof no_v - 1;
    memcpy(buf, &bad, sizeof bad);
    memcpy(buf + sizeof bad, no_v, sizeof no_v - 1);
    send_raw(fd[0], buf, sizeof bad + sizeof no_v - 1);
    /* larger than the receiver's limit */
    char *big = calloc(1, MAX_BYTES + 64);
    assert_non_null(big);
    bad = p;
    bad.header_bytes = MAX_BYTES + 1;
    memcpy(big, &bad, sizeof bad);
    send_raw(fd[0], big, sizeof bad + MAX_BYTES + 1);
    free(big);
    send_typed(fd[0], PROTOCOL_HEARTBEAT, 9);

    expect_protocol_error(fd[1], "magic");
    expect_protocol_error(fd[1], "prefix counts");
    expect_protocol_error(fd[1], "binary frames");
    expect_protocol_error(fd[1], "outside");
    expect_protocol_error(fd[1], "not valid JSON");
    expect_protocol_error(fd[1], "v: required");
    expect_protocol_error(fd[1], "outside");
    /* each bad datagram was consumed: the good one after them comes through */
    struct protocol_msg m;
    assert_int_equal(recv_seq(fd[1], &m), 9);
    protocol_msg_free(&m);
    close(fd[0]);
    close(fd[1]);
}

static void test_send_refuses_too_many_frames_and_fills_up(void **state)
{
    (void)state;
    int fd[2];
    make_pair(fd);
    char err[ERR_MSG_MAX];
    cJSON *h = protocol_header_new(PROTOCOL_HEARTBEAT);
    const struct protocol_frame frames[PROTOCOL_MAX_FRAMES + 1] = {{"a", 1}};
    assert_int_equal(lane_send(fd[0], h, frames, PROTOCOL_MAX_FRAMES + 1, err), ERR_INVALID_ARG);
    /* nobody reads: sends stop with ERR_UNAVAILABLE, never block */
    static char payload[32768];
    const struct protocol_frame big = {payload, sizeof payload};
    int rc = 0, sent = 0;
    while (sent < 100000 && (rc = lane_send(fd[0], h, &big, 1, err)) == 0)
        sent++;
    assert_int_equal(rc, ERR_UNAVAILABLE);
    assert_true(sent > 0);
    cJSON_Delete(h);
    close(fd[0]);
    close(fd[1]);
}

static int setup_dir(void **state)
{
    return tmpdir_fixture_setup(state, "test_lane");
}

static int teardown_dir(void **state)
{
    return tmpdir_fixture_teardown(state);
}

static void test_listen_connect_accept(void **state)
{
    struct tmpdir_fixture *f = *state;
    char path[128], err[ERR_MSG_MAX];
    snprintf(path, sizeof path, "%s/w.lane", f->dir);
    int lfd;
    assert_int_equal(lane_listen(path, &lfd, err), 0);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_true(S_ISSOCK(st.st_mode));
    assert_int_equal(st.st_mode & 0777, 0600);
    int afd;
    assert_int_equal(lane_accept(lfd, &afd, err), ERR_TIMEOUT);
    int cfd;
    assert_int_equal(lane_connect(path, &cfd, err), 0);
    assert_int_equal(lane_accept(lfd, &afd, err), 0);
    send_typed(cfd, PROTOCOL_LANE, 3);
    struct protocol_msg m;
    assert_int_equal(recv_seq(afd, &m), 3);
    protocol_msg_free(&m);
    send_typed(afd, PROTOCOL_LANE, 4);
    assert_int_equal(recv_seq(cfd, &m), 4);
    protocol_msg_free(&m);
    close(cfd);
    close(afd);
    close(lfd);
    /* a socket file left behind is replaced by the next listener */
    assert_int_equal(lane_listen(path, &lfd, err), 0);
    close(lfd);
    unlink(path);
    /* nobody listening */
    assert_int_equal(lane_connect(path, &cfd, err), ERR_SYSTEM);
    assert_non_null(strstr(err, path));
}

static void test_paths_keys_and_fit(void **state)
{
    (void)state;
    char out[LANE_PATH_MAX + 1], err[ERR_MSG_MAX];
    assert_true(lane_path_for("ipc:///run/t/workers.sock", out, sizeof out));
    assert_string_equal(out, "/run/t/workers.sock.lane");
    assert_false(lane_path_for("tcp://127.0.0.1:5555", out, sizeof out));
    assert_false(lane_path_for("ipc://", out, sizeof out));
    char longer[200] = "ipc:///";
    memset(longer + 7, 'a', 150);
    longer[157] = '\0';
    assert_false(lane_path_for(longer, out, sizeof out));
    int fd;
    assert_int_equal(lane_listen(longer + 6, &fd, err), ERR_INVALID_ARG);

    char a[LANE_KEY_LEN + 1], b[LANE_KEY_LEN + 1];
    assert_int_equal(lane_key_new(a, err), 0);
    assert_int_equal(lane_key_new(b, err), 0);
    assert_int_equal(strlen(a), LANE_KEY_LEN);
    assert_int_equal(strspn(a, "0123456789abcdef"), LANE_KEY_LEN);
    assert_string_not_equal(a, b);

    int pair[2];
    make_pair(pair);
    assert_int_equal(lane_fit(pair[0], 65536, err), 0);
    /* SO_SNDBUF is capped at net.core.wmem_max (no FORCE): half a GiB is
     * beyond any default, so such a lane is refused */
    assert_int_equal(lane_fit(pair[0], (size_t)1 << 29, err), ERR_UNSUPPORTED);
    assert_non_null(strstr(err, "wmem_max"));
    close(pair[0]);
    close(pair[1]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_keeps_header_frames_and_order),
        cmocka_unit_test(test_end_of_file_both_ways),
        cmocka_unit_test(test_bad_datagrams_are_refused_and_consumed),
        cmocka_unit_test(test_send_refuses_too_many_frames_and_fills_up),
        cmocka_unit_test_setup_teardown(test_listen_connect_accept, setup_dir, teardown_dir),
        cmocka_unit_test(test_paths_keys_and_fit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
