/* http_reply.c: response helpers for libmicrohttpd (see http_reply.h). */
#define _GNU_SOURCE /* POLLRDHUP */
#include "http_reply.h"

#include <poll.h>
#include <stdlib.h>
#include <string.h>

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
                                          const char *hvalue)
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
    if (hname != NULL)
        MHD_add_response_header(r, hname, hvalue);
    enum MHD_Result rc = MHD_queue_response(conn, (unsigned)status, r);
    MHD_destroy_response(r);
    return rc;
}

enum MHD_Result http_reply_json(struct MHD_Connection *conn, int status, cJSON *body)
{
    return reply_json_headers(conn, status, body, NULL, NULL);
}

enum MHD_Result http_reply_error(struct MHD_Connection *conn, const struct openai_error *e, const char *allow)
{
    if (e->status == 401)
        return reply_json_headers(conn, e->status, openai_error_json(e), MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (e->status == 405 && allow != NULL)
        return reply_json_headers(conn, e->status, openai_error_json(e), MHD_HTTP_HEADER_ALLOW, allow);
    return reply_json_headers(conn, e->status, openai_error_json(e), NULL, NULL);
}

bool http_reply_client_gone(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci == NULL)
        return false;
    struct pollfd pfd = {.fd = ci->connect_fd, .events = POLLRDHUP};
    return poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}
