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

/* What the fields say about the body: chunked_only when Transfer-Encoding
 * is exactly "chunked" and there is no Content-Length (any other mix is
 * framing.c's to refuse, and then no byte after the head is a chunk). */
struct head_framing {
    int n_content_length, n_chunked_only, n_transfer_encoding;
};

/* A value without its surrounding OWS equals word, in any case. */
static bool value_is(const unsigned char *v, size_t len, const char *word)
{
    while (len > 0 && (v[0] == ' ' || v[0] == '\t')) {
        v++;
        len--;
    }
    while (len > 0 && (v[len - 1] == ' ' || v[len - 1] == '\t'))
        len--;
    return len == strlen(word) && strncasecmp((const char *)v, word, len) == 0;
}

/* RFC 9112 5: field-name ":" OWS field-value OWS; no whitespace before the
 * colon (5.1: must be refused), no line folding (5.2), no control byte
 * but HTAB in the value (RFC 9110 5.5: a bare CR or a NUL included). */
static enum head_check_verdict field_line(const unsigned char *s, size_t len, struct head_framing *f,
                                          struct openai_error *e)
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
    if (j == 17 && strncasecmp((const char *)s, "Transfer-Encoding", 17) == 0) {
        f->n_transfer_encoding++;
        f->n_chunked_only += value_is(s + j + 1, len - j - 1, "chunked");
    }
    if (j == 14 && strncasecmp((const char *)s, "Content-Length", 14) == 0) {
        f->n_content_length++;
        return content_length(s + j + 1, len - j - 1, e);
    }
    return HEAD_CHECK_MORE;
}

/* RFC 9112 7.1: chunk-size [ chunk-ext ] CRLF chunk-data CRLF, as far as
 * the bytes received go (the rest is libmicrohttpd's to parse: a client
 * that sends its body in one write with its head has all of it judged). */
static enum head_check_verdict chunks(const unsigned char *b, size_t n, struct openai_error *e)
{
    static const char bad[] = "malformed chunked body: expected a hexadecimal chunk size, then CRLF";
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        while (j < n && ((b[j] >= '0' && b[j] <= '9') || ((b[j] | 0x20) >= 'a' && (b[j] | 0x20) <= 'f')))
            j++;
        const size_t digits = j - i;
        if (digits > 15)
            return refuse(e, 413, "request_too_large", "a chunk size larger than any body this server accepts");
        if (j == n)
            return HEAD_CHECK_OK; /* the size line goes on past what came */
        size_t ext = j;
        while (ext < n && (b[ext] == ' ' || b[ext] == '\t'))
            ext++;
        if (ext < n && b[ext] == ';') /* an extension: any visible bytes to the line end */
            while (ext < n && (b[ext] >= 0x20 || b[ext] == '\t') && b[ext] != 0x7f)
                ext++;
        if (ext == n || (b[ext] == '\r' && ext + 1 == n))
            return HEAD_CHECK_OK;
        if (digits == 0 || (b[ext] != '\n' && !(b[ext] == '\r' && b[ext + 1] == '\n')))
            return refuse(e, 400, "invalid_chunk", bad);
        size_t size = 0;
        for (size_t k = i; k < j; k++)
            size = size * 16 + (size_t)(b[k] <= '9' ? b[k] - '0' : (b[k] | 0x20) - 'a' + 10);
        if (size == 0)
            return HEAD_CHECK_OK; /* the last chunk: trailers follow */
        i = ext + (b[ext] == '\r' ? 2 : 1);
        if (size >= n - i)
            return HEAD_CHECK_OK;
        i += size;
        if (b[i] == '\n')
            i++;
        else if (b[i] == '\r' && (i + 1 == n || b[i + 1] == '\n'))
            i += 2;
        else
            return refuse(e, 400, "invalid_chunk", "malformed chunked body: a chunk's data is not followed by CRLF");
    }
    return HEAD_CHECK_OK;
}

enum head_check_verdict head_check(const char *buf, size_t n, struct openai_error *e)
{
    struct head_framing f = {0};
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
        if (len == 0) {
            if (f.n_chunked_only == 1 && f.n_transfer_encoding == 1 && f.n_content_length == 0)
                return chunks((const unsigned char *)buf + next, n - next, e);
            return HEAD_CHECK_OK;
        }
        if (fields == HEAD_CHECK_MAX_FIELDS)
            return refuse(e, 431, "request_header_fields_too_large", "more than 100 header fields");
        if ((v = field_line((const unsigned char *)buf + i, len, &f, e)) != HEAD_CHECK_MORE)
            return v;
    }
    return past_limit ? refuse(e, 431, "request_header_fields_too_large", "the request head is longer than 16384 bytes")
                      : HEAD_CHECK_MORE;
}
