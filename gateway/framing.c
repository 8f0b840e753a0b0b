/* framing.c: a request's framing, Host and target, judged from its head
 * (see framing.h). */
#include "framing.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

/* The path of a request target: the target itself in origin form
 * ("/health"); past the authority in absolute form ("http://host/health",
 * which RFC 9112 3.2.2 says a server must accept; its Host header is then
 * the authority's, and the gateway routes by path alone); NULL for any
 * other form ("*", "host:443"), which the gateway does not serve. */
const char *framing_path_of(const char *url)
{
    if (url[0] == '/')
        return url;
    size_t scheme = strncasecmp(url, "http://", 7) == 0 ? 7 : strncasecmp(url, "https://", 8) == 0 ? 8 : 0;
    if (scheme == 0 || url[scheme] == '\0' || url[scheme] == '/')
        return NULL;
    const char *slash = strchr(url + scheme, '/');
    return slash != NULL ? slash : "/";
}

/* libmicrohttpd's own percent-decoding writes a decoded %00 into the
 * target, which then ends there ("/v1/models/ti%00ny" would be routed as
 * "/v1/models/ti"). A target that decodes to a NUL becomes "" instead,
 * which framing_refused refuses (as it refuses an empty target). Query
 * arguments go through here too; the gateway reads none. */
size_t framing_unescape(void *cls, struct MHD_Connection *conn, char *s)
{
    (void)cls;
    (void)conn;
    size_t n = MHD_http_unescape(s);
    if (strlen(s) != n) {
        s[0] = '\0';
        return 0;
    }
    return n;
}

/* What a request's headers say about where its body ends. */
struct framing {
    int n_content_length;   /* Content-Length headers */
    int n_transfer_encoding;/* Transfer-Encoding headers */
    int n_codings;          /* transfer codings over all of them */
    int n_chunked;
    char unknown[32];       /* the first coding other than chunked; "" = none */
    int n_host;             /* Host headers */
};

static enum MHD_Result framing_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    struct framing *f = cls;
    (void)kind;
    if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) == 0)
        f->n_content_length++;
    if (strcasecmp(key, MHD_HTTP_HEADER_HOST) == 0)
        f->n_host++;
    if (strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING) != 0)
        return MHD_YES;
    f->n_transfer_encoding++;
    /* a list of codings (RFC 9110 5.6.1: empty elements allowed), each a
     * token with optional parameters, in any case */
    for (const char *v = value != NULL ? value : ""; *v != '\0';) {
        while (*v == ' ' || *v == '\t' || *v == ',')
            v++;
        size_t len = strcspn(v, ",; \t");
        if (len > 0) {
            f->n_codings++;
            if (len == 7 && strncasecmp(v, "chunked", 7) == 0)
                f->n_chunked++;
            else if (f->unknown[0] == '\0')
                snprintf(f->unknown, sizeof(f->unknown), "%.*s", (int)(len < 24 ? len : 24), v);
        }
        v += len;
        v += strcspn(v, ",");
    }
    return MHD_YES;
}

/* Refuses (true, e set) a request whose headers do not say plainly where its
 * body ends, or whose target the gateway does not serve. Decided before any
 * body byte is read; the answer closes the connection (RFC 9112 6.3): a
 * proxy in front that read the framing the other way would otherwise carry
 * a hidden request in what the gateway takes for a body. */
bool framing_refused(struct MHD_Connection *conn, const char *url, const char *version, struct openai_error *e)
{
    struct framing f = {0};
    if (MHD_get_connection_values(conn, MHD_HEADER_KIND, framing_header, &f) < 0) {
        openai_error_set(e, 500, "server_error", NULL, NULL, "cannot read the request's headers");
        return true;
    }
    if (f.n_content_length > 1) {
        openai_error_set(e, 400, "invalid_request_error", "invalid_framing", NULL,
                         "Content-Length: given %d times; a request has at most one", f.n_content_length);
        return true;
    }
    if (f.n_content_length > 0 && f.n_transfer_encoding > 0) {
        openai_error_set(e, 400, "invalid_request_error", "invalid_framing", NULL,
                         "Content-Length and Transfer-Encoding together: a request has one or the other");
        return true;
    }
    if (f.unknown[0] != '\0') {
        openai_error_set(e, 501, "invalid_request_error", "unsupported_transfer_coding", NULL,
                         "Transfer-Encoding: \"%s\" is not supported (only chunked)", f.unknown);
        return true;
    }
    if (f.n_transfer_encoding > 1 || f.n_chunked > 1) {
        openai_error_set(e, 400, "invalid_request_error", "invalid_framing", NULL,
                         "Transfer-Encoding: chunked given more than once");
        return true;
    }
    if (f.n_transfer_encoding > 0 && (f.n_codings == 0 || strcmp(version, MHD_HTTP_VERSION_1_0) == 0)) {
        openai_error_set(e, 400, "invalid_request_error", "invalid_framing", NULL,
                         f.n_codings == 0 ? "Transfer-Encoding: empty"
                                          : "Transfer-Encoding: not allowed in an HTTP/1.0 request");
        return true;
    }
    /* RFC 9112 3.2: an HTTP/1.1 request has exactly one Host; a proxy and
     * the gateway could otherwise disagree on whose request it is */
    if (f.n_host > 1) {
        openai_error_set(e, 400, "invalid_request_error", "invalid_request_target", NULL,
                         "Host: given %d times; a request has one", f.n_host);
        return true;
    }
    if (f.n_host == 0 && strcmp(version, MHD_HTTP_VERSION_1_1) == 0) {
        openai_error_set(e, 400, "invalid_request_error", "invalid_request_target", NULL,
                         "Host: missing; an HTTP/1.1 request has one");
        return true;
    }
    if (url[0] == '\0') {
        openai_error_set(e, 400, "invalid_request_error", "invalid_request_target", NULL,
                         "request target: empty, or a NUL byte (%%00) in it");
        return true;
    }
    if (framing_path_of(url) == NULL) {
        openai_error_set(e, 400, "invalid_request_error", "invalid_request_target", NULL,
                         "request target \"%.200s\": only a path (/v1/models) or an absolute URL "
                         "(http://host/v1/models) is served",
                         url);
        return true;
    }
    return false;
}
