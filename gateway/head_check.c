/* head_check.c: a request head's syntax, RFC 9112 2-5 (see head_check.h).
 *
 * Line by line over the bytes received so far: a line is judged once its
 * LF is in, so a fault is answered without waiting for the rest of a head
 * that may never come. A line ends at LF with an optional CR before it (a
 * bare LF is accepted, as RFC 9112 2.2 allows and libmicrohttpd does). */
#include "head_check.h"

#include <stdbool.h>
#include <string.h>
#include <strings.h>

/* RFC 9110 5.6.2: the characters of a method and of a field name */
static bool is_tchar(unsigned char c)
{
    if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
        return true;
    return c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

/* The line from buf[start]: false when its LF is not in the first n bytes;
 * else its length without the line end, and where the next line starts. */
static bool line_at(const char *buf, size_t n, size_t start, size_t *len, size_t *next)
{
    const char *lf = memchr(buf + start, '\n', n - start);
    if (lf == NULL)
        return false;
    size_t end = (size_t)(lf - buf);
    *next = end + 1;
    *len = end > start && buf[end - 1] == '\r' ? end - 1 - start : end - start;
    return true;
}

static enum head_check_verdict refuse(struct openai_error *e, int status, const char *code, const char *message)
{
    openai_error_set(e, status, "invalid_request_error", code, NULL, "%s", message);
    return HEAD_CHECK_REFUSED;
}

/* RFC 9112 3: method SP request-target SP HTTP-version */
static enum head_check_verdict request_line(const unsigned char *s, size_t len, struct openai_error *e)
{
    static const char bad[] = "malformed request line: expected METHOD SP TARGET SP HTTP/1.1";
    size_t j = 0;
    while (j < len && is_tchar(s[j]))
        j++;
    if (j == 0 || j == len || s[j] != ' ')
        return refuse(e, 400, "invalid_request_line", bad);
    size_t k = j + 1;
    while (k < len && s[k] > 0x20 && s[k] != 0x7f)
        k++;
    if (k == j + 1)
        return refuse(e, 400, "invalid_request_line", bad);
    if (k == len)
        return refuse(e, 400, "invalid_request_line",
                      "a request line without an HTTP version (HTTP/0.9): HTTP/1.0 or HTTP/1.1 is required");
    const unsigned char *v = s + k + 1;
    size_t vlen = len - k - 1;
    if (s[k] != ' ' || vlen != 8 || memcmp(v, "HTTP/", 5) != 0 || v[5] < '0' || v[5] > '9' || v[6] != '.' ||
        v[7] < '0' || v[7] > '9')
        return refuse(e, 400, "invalid_request_line", bad);
    if (v[5] != '1') /* 1.x past 1.1 is served as 1.1 (RFC 9110 6.2), as libmicrohttpd does */
        return refuse(e, 505, "http_version_not_supported",
                      "this server speaks HTTP/1.0 and HTTP/1.1 (HTTP/2 only over TLS with ALPN, which it does not "
                      "offer)");
    return HEAD_CHECK_MORE;
}

/* Content-Length's value (RFC 9110 8.6): digits only. More digits than
 * 2^63 holds is a body no limit admits: 413 here, since libmicrohttpd
 * would answer it in HTML; a smaller one past max_body_bytes is server.c's
 * 413, which names the limit. */
static enum head_check_verdict content_length(const unsigned char *v, size_t len, struct openai_error *e)
{
    while (len > 0 && (v[0] == ' ' || v[0] == '\t')) {
        v++;
        len--;
    }
    while (len > 0 && (v[len - 1] == ' ' || v[len - 1] == '\t'))
        len--;
    if (len == 0)
        return refuse(e, 400, "invalid_framing", "Content-Length is empty");
    for (size_t i = 0; i < len; i++)
        if (v[i] < '0' || v[i] > '9')
            return refuse(e, 400, "invalid_framing", "Content-Length is not a decimal number");
    if (len > 18)
        return refuse(e, 413, "request_too_large", "Content-Length is larger than any body this server accepts");
    return HEAD_CHECK_MORE;
}

/* RFC 9112 5: field-name ":" OWS field-value OWS; no whitespace before the
 * colon (5.1: must be refused), no line folding (5.2), no control byte
 * but HTAB in the value (RFC 9110 5.5: a bare CR or a NUL included). */
static enum head_check_verdict field_line(const unsigned char *s, size_t len, struct openai_error *e)
{
    if (s[0] == ' ' || s[0] == '\t')
        return refuse(e, 400, "invalid_header", "a header line starts with whitespace (obs-fold is not accepted)");
    size_t j = 0;
    while (j < len && is_tchar(s[j]))
        j++;
    if (j == 0 || j == len || s[j] != ':')
        return refuse(e, 400, "invalid_header", "malformed header line: expected NAME: VALUE with no space before the colon");
    for (size_t i = j + 1; i < len; i++)
        if ((s[i] < 0x20 && s[i] != '\t') || s[i] == 0x7f)
            return refuse(e, 400, "invalid_header", "a header value holds a control character");
    if (j == 14 && strncasecmp((const char *)s, "Content-Length", 14) == 0)
        return content_length(s + j + 1, len - j - 1, e);
    return HEAD_CHECK_MORE;
}

enum head_check_verdict head_check(const char *buf, size_t n, struct openai_error *e)
{
    const bool past_limit = n > HEAD_CHECK_MAX_BYTES;
    if (past_limit)
        n = HEAD_CHECK_MAX_BYTES;
    size_t i = 0, len, next;
    /* RFC 9112 2.2: empty lines before the request line are ignored */
    while (i < n && (buf[i] == '\n' || (buf[i] == '\r' && i + 1 < n && buf[i + 1] == '\n')))
        i += buf[i] == '\r' ? 2 : 1;
    if (!line_at(buf, n, i, &len, &next)) {
        /* what is not a method is known at its first byte: a TLS hello to
         * the plain port, binary noise, is answered at once */
        size_t j = i;
        while (j < n && is_tchar((unsigned char)buf[j]))
            j++;
        if (j < n && buf[j] != ' ' && !(buf[j] == '\r' && j + 1 == n))
            return refuse(e, 400, "invalid_request_line", "malformed request line: expected METHOD SP TARGET SP HTTP/1.1");
        return past_limit ? refuse(e, 414, "uri_too_long", "the request line is longer than 16384 bytes")
                          : HEAD_CHECK_MORE;
    }
    enum head_check_verdict v = request_line((const unsigned char *)buf + i, len, e);
    if (v != HEAD_CHECK_MORE)
        return v;
    for (int fields = 0;; fields++) {
        i = next;
        if (!line_at(buf, n, i, &len, &next))
            break;
        if (len == 0)
            return HEAD_CHECK_OK;
        if (fields == HEAD_CHECK_MAX_FIELDS)
            return refuse(e, 431, "request_header_fields_too_large", "more than 100 header fields");
        if ((v = field_line((const unsigned char *)buf + i, len, e)) != HEAD_CHECK_MORE)
            return v;
    }
    return past_limit ? refuse(e, 431, "request_header_fields_too_large", "the request head is longer than 16384 bytes")
                      : HEAD_CHECK_MORE;
}
