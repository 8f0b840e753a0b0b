/* lane.c: see lane.h. */
#define _GNU_SOURCE
#include "lane.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include "error.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "lane.c assumes a little-endian host (the datagram prefix is little-endian)"
#endif

#define LANE_MAGIC 0x314E4C54u /* "TLN1" */
/* What the kernel keeps of a send buffer beyond one datagram's bytes
 * (unix_dgram_sendmsg refuses a datagram longer than the buffer less 32). */
#define LANE_SNDBUF_SLACK 65536

struct lane_prefix {
    uint32_t magic;
    uint32_t header_bytes;
    uint32_t n_frames;
    uint32_t frame_bytes[PROTOCOL_MAX_FRAMES];
};

bool lane_path_for(const char *worker_endpoint, char *out, size_t out_size)
{
    static const char scheme[] = "ipc://";
    if (strncmp(worker_endpoint, scheme, sizeof scheme - 1) != 0)
        return false;
    const char *path = worker_endpoint + sizeof scheme - 1;
    const size_t cap = out_size - 1 < LANE_PATH_MAX ? out_size - 1 : LANE_PATH_MAX;
    const int n = snprintf(out, out_size, "%s.lane", path);
    return path[0] != '\0' && n > 0 && (size_t)n <= cap;
}

int lane_key_new(char *out, char *err)
{
    unsigned char raw[LANE_KEY_LEN / 2];
    size_t got = 0;
    while (got < sizeof raw) {
        const ssize_t n = getrandom(raw + got, sizeof raw - got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return error_set_errno(err, ERR_SYSTEM, errno, "lane key: getrandom");
        got += (size_t)n;
    }
    for (size_t i = 0; i < sizeof raw; i++)
        snprintf(out + 2 * i, 3, "%02x", raw[i]);
    return 0;
}

static int lane_address(const char *path, struct sockaddr_un *addr, char *err)
{
    memset(addr, 0, sizeof *addr);
    addr->sun_family = AF_UNIX;
    if (strlen(path) > LANE_PATH_MAX || strlen(path) >= sizeof addr->sun_path)
        return error_set(err, ERR_INVALID_ARG, "lane %s: path longer than %d bytes", path,
                         LANE_PATH_MAX);
    memcpy(addr->sun_path, path, strlen(path) + 1);
    return 0;
}

int lane_listen(const char *path, int *fd, char *err)
{
    *fd = -1;
    struct sockaddr_un addr;
    int rc = lane_address(path, &addr, err);
    if (rc)
        return rc;
    struct stat st;
    /* a socket file outlives its process: only a socket is ours to remove */
    if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode) && unlink(path) != 0)
        return error_set_errno(err, ERR_SYSTEM, errno, "lane %s: unlink of the old socket", path);
    const int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s < 0)
        return error_set_errno(err, ERR_SYSTEM, errno, "lane %s: socket", path);
    if (bind(s, (const struct sockaddr *)&addr, sizeof addr) != 0) {
        rc = error_set_errno(err, ERR_SYSTEM, errno, "lane %s: bind", path);
        close(s);
        return rc;
    }
    if (chmod(path, 0600) != 0 || listen(s, 8) != 0) {
        rc = error_set_errno(err, ERR_SYSTEM, errno, "lane %s: chmod/listen", path);
        close(s);
        unlink(path);
        return rc;
    }
    *fd = s;
    return 0;
}

int lane_accept(int listen_fd, int *fd, char *err)
{
    *fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (*fd >= 0)
        return 0;
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED)
        return error_set(err, ERR_TIMEOUT, "lane: no connection waiting");
    return error_set_errno(err, ERR_SYSTEM, errno, "lane: accept");
}

int lane_connect(const char *path, int *fd, char *err)
{
    *fd = -1;
    struct sockaddr_un addr;
    int rc = lane_address(path, &addr, err);
    if (rc)
        return rc;
    const int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (s < 0)
        return error_set_errno(err, ERR_SYSTEM, errno, "lane %s: socket", path);
    int r;
    do
        r = connect(s, (const struct sockaddr *)&addr, sizeof addr);
    while (r != 0 && errno == EINTR);
    const int flags = r == 0 ? fcntl(s, F_GETFL) : -1;
    if (r != 0 || flags < 0 || fcntl(s, F_SETFL, flags | O_NONBLOCK) != 0) {
        rc = error_set_errno(err, ERR_SYSTEM, errno, "lane %s: connect", path);
        close(s);
        return rc;
    }
    *fd = s;
    return 0;
}

int lane_fit(int fd, size_t max_message_bytes, char *err)
{
    const size_t need = max_message_bytes + sizeof(struct lane_prefix) + LANE_SNDBUF_SLACK;
    if (need > INT32_MAX / 2)
        return error_set(err, ERR_UNSUPPORTED, "lane: messages of %zu bytes are too large",
                         max_message_bytes);
    const int ask = (int)need;
    int got = 0;
    socklen_t len = sizeof got;
    if (setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &ask, sizeof ask) != 0 ||
        getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &got, &len) != 0)
        return error_set_errno(err, ERR_SYSTEM, errno, "lane: SO_SNDBUF");
    /* the kernel doubles what it grants and caps it at twice wmem_max */
    if ((size_t)got < need)
        return error_set(err, ERR_UNSUPPORTED,
                         "lane: a send buffer of %d bytes cannot carry messages of %zu bytes "
                         "(net.core.wmem_max)",
                         got, max_message_bytes);
    return 0;
}

int lane_send(int fd, const cJSON *header, const struct protocol_frame *frames, int n_frames,
              char *err)
{
    if (n_frames < 0 || n_frames > PROTOCOL_MAX_FRAMES)
        return error_set(err, ERR_INVALID_ARG, "lane send: %d frames (at most %d)", n_frames,
                         PROTOCOL_MAX_FRAMES);
    char *text = cJSON_PrintUnformatted(header);
    if (!text)
        return error_set(err, ERR_NOMEM, "lane send: out of memory printing the header");
    struct lane_prefix prefix = {.magic = LANE_MAGIC, .n_frames = (uint32_t)n_frames};
    const size_t text_bytes = strlen(text);
    prefix.header_bytes = (uint32_t)text_bytes;
    struct iovec iov[2 + PROTOCOL_MAX_FRAMES];
    iov[0] = (struct iovec){.iov_base = &prefix, .iov_len = sizeof prefix};
    iov[1] = (struct iovec){.iov_base = text, .iov_len = text_bytes};
    for (int i = 0; i < n_frames; i++) {
        prefix.frame_bytes[i] = (uint32_t)frames[i].size_bytes;
        iov[2 + i] = (struct iovec){.iov_base = (void *)(uintptr_t)frames[i].data,
                                    .iov_len = frames[i].size_bytes};
    }
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)(2 + n_frames)};
    ssize_t n;
    do
        n = sendmsg(fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    const int e = errno;
    free(text);
    if (n >= 0)
        return 0;
    if (e == EAGAIN || e == EWOULDBLOCK || e == ENOBUFS)
        return error_set(err, ERR_UNAVAILABLE, "lane send: the socket is full");
    if (e == EPIPE || e == ECONNRESET || e == ENOTCONN)
        return error_set(err, ERR_CANCELLED, "lane send: the peer is gone");
    if (e == EMSGSIZE)
        return error_set(err, ERR_PROTOCOL, "lane send: larger than the lane carries");
    return error_set_errno(err, ERR_SYSTEM, e, "lane send");
}

/* Consumes the waiting datagram (a 1-byte read drops the rest of it). */
static void lane_drop_datagram(int fd)
{
    char byte;
    (void)recv(fd, &byte, 1, MSG_DONTWAIT);
}

int lane_recv(int fd, size_t max_message_bytes, struct protocol_msg *msg, char *err)
{
    memset(msg, 0, sizeof *msg);
    ssize_t n;
    do
        n = recv(fd, NULL, 0, MSG_PEEK | MSG_TRUNC | MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return error_set(err, ERR_TIMEOUT, "lane: nothing to receive");
        if (errno == ECONNRESET)
            return error_set(err, ERR_CANCELLED, "lane: the peer is gone");
        return error_set_errno(err, ERR_SYSTEM, errno, "lane recv");
    }
    if (n == 0) {
        /* nobody sends an empty datagram: this is the end of the lane */
        return error_set(err, ERR_CANCELLED, "lane: closed by the peer");
    }
    const size_t size = (size_t)n;
    if (size < sizeof(struct lane_prefix) ||
        size - sizeof(struct lane_prefix) > max_message_bytes) {
        lane_drop_datagram(fd);
        return error_set(err, ERR_PROTOCOL, "message: %zu bytes, outside %zu..%zu", size,
                         sizeof(struct lane_prefix), sizeof(struct lane_prefix) + max_message_bytes);
    }
    char *buf = malloc(size);
    if (!buf) {
        lane_drop_datagram(fd);
        return error_set(err, ERR_NOMEM, "lane recv: out of memory for %zu bytes", size);
    }
    do
        n = recv(fd, buf, size, MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    if (n < 0 || (size_t)n != size) {
        const int e = n < 0 ? errno : EIO;
        free(buf);
        return error_set_errno(err, ERR_SYSTEM, e, "lane recv");
    }
    struct lane_prefix prefix;
    memcpy(&prefix, buf, sizeof prefix);
    size_t body = (size_t)prefix.header_bytes;
    int rc = 0;
    if (prefix.magic != LANE_MAGIC)
        rc = error_set(err, ERR_PROTOCOL, "message: not a lane datagram (magic %08x)",
                       prefix.magic);
    else if (prefix.n_frames > PROTOCOL_MAX_FRAMES)
        rc = error_set(err, ERR_PROTOCOL, "message: more than %d binary frames",
                       PROTOCOL_MAX_FRAMES);
    for (uint32_t i = 0; rc == 0 && i < prefix.n_frames; i++)
        body += (size_t)prefix.frame_bytes[i];
    if (rc == 0 && body != size - sizeof prefix)
        rc = error_set(err, ERR_PROTOCOL, "message: the prefix counts %zu bytes, the datagram has %zu",
                       body, size - sizeof prefix);
    const char *at = buf + sizeof prefix;
    if (rc == 0) {
        msg->total_bytes = body;
        rc = protocol_msg_parse_header(msg, at, prefix.header_bytes, err);
        at += prefix.header_bytes;
    }
    for (uint32_t i = 0; rc == 0 && i < prefix.n_frames; i++) {
        const size_t fb = prefix.frame_bytes[i];
        void *copy = malloc(fb > 0 ? fb : 1);
        if (!copy) {
            rc = error_set(err, ERR_NOMEM, "message: out of memory for a %zu-byte frame", fb);
            break;
        }
        memcpy(copy, at, fb);
        at += fb;
        msg->frame_data[i] = copy;
        msg->frame_size_bytes[i] = fb;
        msg->n_frames++;
    }
    free(buf);
    return rc;
}
