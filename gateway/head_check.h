/* head_check.h: the syntax of a request's head (RFC 9112 2-5), judged on
 * the bytes received so far, before libmicrohttpd reads any of them.
 *
 * libmicrohttpd 0.9.75 answers a head it cannot parse itself, with HTML and
 * no hook to replace it; the gateway's accept loop (front.h) runs this on
 * the peeked bytes of each new connection and answers the refused ones with
 * an OpenAI error object instead. What it refuses is what libmicrohttpd
 * would refuse (so that libmicrohttpd never does) plus what RFC 9112 says a
 * server must reject (whitespace before a header's colon, line folding, a
 * bare CR). A chunked body's framing (RFC 9112 7.1) is judged as far as it
 * came with the head: a client that writes its request at once has all of
 * it judged here. What it passes, framing.h judges once libmicrohttpd has parsed
 * it: repeated or conflicting framing headers, Host, the target's form.
 *
 * Pure: no state, no I/O, callable from any thread.
 */
#ifndef TANDEM_GATEWAY_HEAD_CHECK_H
#define TANDEM_GATEWAY_HEAD_CHECK_H

#include <stddef.h>

#include "openai.h"

/* The largest head passed on. libmicrohttpd keeps the head and a record per
 * header in one pool per connection (server.c sets it to
 * SERVER_CONNECTION_MEMORY_BYTES); these keep it well inside, so
 * libmicrohttpd's own 414 and 431 are never reached. */
#define HEAD_CHECK_MAX_BYTES (16 * 1024)
#define HEAD_CHECK_MAX_FIELDS 100

enum head_check_verdict {
    HEAD_CHECK_MORE = 0, /* no fault so far, the head is not complete: wait for more bytes */
    HEAD_CHECK_OK,       /* a complete head, well formed */
    HEAD_CHECK_REFUSED,  /* e says why, with its status: 400, 413, 414, 431, 505 */
};

/* Judges the first n bytes of a connection (buf need not be terminated).
 * A fault is found as soon as its line is complete, so a request line with
 * no version (HTTP/0.9, whose client sends no empty line after it) is
 * answered at once. n past HEAD_CHECK_MAX_BYTES without a complete head is
 * refused (414 while the request line is not complete, else 431). */
enum head_check_verdict head_check(const char *buf, size_t n, struct openai_error *e);

#endif
