#!/usr/bin/python3
"""Every answer is the gateway's (issue 63, item a), over raw sockets:
1. A request head that libmicrohttpd would answer itself with an HTML page
   (a malformed request line, HTTP/0.9, an HTTP/2 preface on the HTTP/1.1
   port, a Content-Length that is not a number or is past 2^64, a request
   line or head too large, too many header fields) and those RFC 9112 says a
   server must refuse (whitespace before a colon, line folding, a control
   byte in a value, a bare CR), and a malformed chunked body sent with its
   head, get exactly one response: the status, an
   OpenAI error object, "Connection: close", and the connection closed.
2. Bytes that are no HTTP at all (a TLS hello on the plain port) are
   answered 400 at once, without waiting for a line end that never comes.
3. A well-formed request, and one with a head just under the limit, are
   still served, and a kept-alive connection serves a second request.
4. The refusals are counted in the gateway's /metrics, and the gateway
   still serves after all of them."""
import json
import time

from tandem_e2e import Pipeline, check, http, main, require_gateway
from test_gateway_framing import exchange, one_error, port_of, responses

H = b"Host: x\r\n"
GET = b"GET /v1/models HTTP/1.1\r\n" + H
CHUNKED = b"POST /v1/completions HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\n\r\n"
TLS_HELLO = bytes.fromhex("16030100a5010000a10303") + bytes(range(32))

# (what it proves, request bytes, status, error code)
CASES = [
    ("no space after the method", b"GET/v1/models HTTP/1.1\r\n" + H + b"\r\n", 400, "invalid_request_line"),
    ("two spaces in the request line", b"GET  /v1/models HTTP/1.1\r\n" + H + b"\r\n", 400, "invalid_request_line"),
    ("a lower-case version", b"GET /v1/models http/1.1\r\n" + H + b"\r\n", 400, "invalid_request_line"),
    ("HTTP/0.9: no version, no empty line after it", b"GET /v1/models\r\n", 400, "invalid_request_line"),
    ("an HTTP/2 preface on the HTTP/1.1 port", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505,
     "http_version_not_supported"),
    ("HTTP/0.8", b"GET /v1/models HTTP/0.8\r\n" + H + b"\r\n", 505, "http_version_not_supported"),
    ("a TLS hello on the plain port", TLS_HELLO, 400, "invalid_request_line"),
    ("Content-Length: abc", b"POST /v1/completions HTTP/1.1\r\n" + H + b"Content-Length: abc\r\n\r\n", 400,
     "invalid_framing"),
    ("Content-Length: -1", b"POST /v1/completions HTTP/1.1\r\n" + H + b"Content-Length: -1\r\n\r\n", 400,
     "invalid_framing"),
    ("Content-Length past 2^64",
     b"POST /v1/completions HTTP/1.1\r\n" + H + b"Content-Length: 99999999999999999999999\r\n\r\n", 413,
     "request_too_large"),
    ("a space before the colon", GET + b"X-A : 1\r\n\r\n", 400, "invalid_header"),
    ("line folding", GET + b"X-A: 1\r\n  2\r\n\r\n", 400, "invalid_header"),
    ("a NUL in a header value", GET + b"X-A: 1\x002\r\n\r\n", 400, "invalid_header"),
    ("a bare CR in a header value", GET + b"X-A: 1\r2\r\n\r\n", 400, "invalid_header"),
    ("a header line without a colon", GET + b"X-A\r\n\r\n", 400, "invalid_header"),
    ("a 20 KiB request line", b"GET /" + b"a" * 20480 + b" HTTP/1.1\r\n" + H + b"\r\n", 414, "uri_too_long"),
    ("a 20 KiB header", GET + b"X-A: " + b"a" * 20480 + b"\r\n\r\n", 431, "request_header_fields_too_large"),
    ("101 header fields", GET + b"".join(b"X-%d: 1\r\n" % i for i in range(101)) + b"\r\n", 431,
     "request_header_fields_too_large"),
    ("a malformed chunk size (sent with the head)", CHUNKED + b"zz\r\nhello\r\n0\r\n\r\n", 400, "invalid_chunk"),
    ("a chunk size past 2^64 (sent with the head)", CHUNKED + b"fffffffffffffffffffff\r\n", 413,
     "request_too_large"),
    ("chunk data longer than its size", CHUNKED + b"2\r\n{}}\r\n0\r\n\r\n", 400, "invalid_chunk"),
]


def refused(p):
    for what, data, status, code in CASES:
        t0 = time.time()
        raw, closed = exchange(p, data)
        check(not raw.lstrip().lower().startswith(b"<html") and b"<html" not in raw.lower(),
              "%s: an HTML answer: %r" % (what, raw[:300]))
        err = one_error(raw, closed, what, status, code)
        print("%-46s %d %-32s %.3f s  %s" % (what, status, code, time.time() - t0, err["message"]))


def served(p):
    # a head just under 16 KiB, and a second request on the same connection
    big = GET + b"X-A: " + b"a" * 15000 + b"\r\n\r\n"
    raw, _ = exchange(p, big + GET + b"Connection: close\r\n\r\n", timeout_s=5)
    rs = responses(raw, "a 15 KB head, then a second request")
    check(len(rs) == 2 and rs[0][0] == 200 and rs[1][0] == 200,
          "a 15 KB head and a kept-alive second request: %s" % [(st, b[:100]) for st, _, b in rs])
    check(json.loads(rs[1][2])["data"][0]["id"] == "tiny", "the second request's answer: %r" % rs[1][2][:200])
    st, _, _ = http("GET", p.base_url + "/health")
    check(st == 200, "/health after the refusals: %d" % st)
    print("a 15 KB head and a kept-alive second request served; /health 200")


def counted(p):
    st, _, body = http("GET", p.base_url + "/metrics")
    check(st == 200, "/metrics: %d" % st)
    text = body.decode()
    for status in (400, 413, 414, 431, 505):
        check('status="%d"' % status in text, "/metrics counts no %d: %s" % (
            status, [line for line in text.splitlines() if "status=" in line][:20]))
    print("the refusals are counted in /metrics")


def test():
    require_gateway()
    p = Pipeline("gwmalformed", worker_timeout_ms=5000)
    p.make_pair()
    p.enable_gateway()
    p.start_all()
    p.start("gateway")
    p.wait_http("/health")
    print("gateway on port %d" % port_of(p))
    refused(p)
    served(p)
    counted(p)
    check(p.procs["gateway"].poll() is None, "the gateway exited")


if __name__ == "__main__":
    main(test)
