/* http_reply.c: response helpers for libmicrohttpd (see http_reply.h). */
#define _GNU_SOURCE /* POLLRDHUP */
#include "http_reply.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

enum MHD_Result http_reply_text(struct MHD_Connection *conn, int status, const char *content_type, const char *text,
                                size_t len)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)text, MHD_RESPMEM_MUST_COPY);
    if (r == NULL)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    enum MHD_Result rc = MHD_queue_response(conn, (unsigned)status, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result reply_json_headers(struct MHD_Connection *conn, int status, cJSON *body, const char *hname,
                                          const char *hvalue, bool close)
{
    char *text = body ? cJSON_PrintUnformatted(body) : NULL;
    cJSON_Delete(body);
    if (text == NULL) {
        static const char oom[] =
            "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,\"code\":null}}";
        return http_reply_text(conn, 500, "application/json", oom, sizeof(oom) - 1);
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    if (r == NULL) {
        cJSON_free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    if (hname != NULL && MHD_add_response_header(r, hname, hvalue) != MHD_YES) {
        MHD_destroy_response(r);
        return MHD_NO;
    }
    /* a client told to come back is told when (RFC 9110 10.2.3) */
    if ((status == 429 || status == 503) &&
        MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, HTTP_REPLY_RETRY_AFTER_TEXT) != MHD_YES) {
        MHD_destroy_response(r);
        return MHD_NO;
    }
    /* libmicrohttpd closes the connection after a response that says so */
    if (close && MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close") != MHD_YES) {
        MHD_destroy_response(r);
        return MHD_NO;
    }
    enum MHD_Result rc = MHD_queue_response(conn, (unsigned)status, r);
    MHD_destroy_response(r);
    return rc;
}

enum MHD_Result http_reply_json(struct MHD_Connection *conn, int status, cJSON *body)
{
    return reply_json_headers(conn, status, body, NULL, NULL, false);
}

enum MHD_Result http_reply_json_header(struct MHD_Connection *conn, int status, cJSON *body, const char *hname,
                                       const char *hvalue)
{
    return reply_json_headers(conn, status, body, hname, hvalue, false);
}

enum MHD_Result http_reply_error(struct MHD_Connection *conn, const struct openai_error *e, const char *allow)
{
    if (e->status == 401)
        return reply_json_headers(conn, e->status, openai_error_json(e), MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer",
                                  false);
    if (e->status == 405 && allow != NULL)
        return reply_json_headers(conn, e->status, openai_error_json(e), MHD_HTTP_HEADER_ALLOW, allow, false);
    return reply_json_headers(conn, e->status, openai_error_json(e), NULL, NULL, false);
}

enum MHD_Result http_reply_error_close(struct MHD_Connection *conn, const struct openai_error *e)
{
    return reply_json_headers(conn, e->status, openai_error_json(e), NULL, NULL, true);
}

bool http_reply_client_gone(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci == NULL)
        return false;
    struct pollfd pfd = {.fd = ci->connect_fd, .events = POLLRDHUP};
    return poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

int http_reply_error_to_socket(int fd, const struct openai_error *e)
{
    cJSON *obj = openai_error_json(e);
    char *body = obj ? cJSON_PrintUnformatted(obj) : NULL;
    cJSON_Delete(obj);
    if (body == NULL)
        return -1;
    char head[256];
    const bool retry = e->status == 429 || e->status == 503;
    int n = snprintf(head, sizeof(head),
                     "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                     "%s%s%sConnection: close\r\n\r\n",
                     e->status, MHD_get_reason_phrase_for((unsigned)e->status), strlen(body),
                     retry ? "Retry-After: " : "", retry ? HTTP_REPLY_RETRY_AFTER_TEXT : "", retry ? "\r\n" : "");
    int rc = -1;
    if (n > 0 && (size_t)n < sizeof(head)) {
        struct iovec iov[2] = {{head, (size_t)n}, {body, strlen(body)}};
        size_t total = iov[0].iov_len + iov[1].iov_len, sent = 0;
        /* Small enough for any socket buffer: a short write means the
         * client stopped reading, and then the answer is lost anyway. */
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 2};
        ssize_t w;
        do
            w = sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        while (w < 0 && errno == EINTR);
        if (w > 0)
            sent = (size_t)w;
        if (sent == total)
            rc = 0;
    }
    cJSON_free(body);
    /* the end of the answer: the client reads it to the end of the stream */
    if (shutdown(fd, SHUT_WR) != 0 && errno != ENOTCONN)
        rc = -1;
    return rc;
}

int http_reply_error_early(struct MHD_Connection *conn, const struct openai_error *e)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci == NULL)
        return -1;
    return http_reply_error_to_socket(ci->connect_fd, e);
}
