#!/usr/bin/python3
"""Strict HTTP framing at the gateway (issue 63, item 1; issue 62, item 5),
over raw sockets:
1. A request whose headers do not say plainly where its body ends
   (repeated or conflicting Content-Length, Content-Length with
   Transfer-Encoding, an unknown or repeated transfer coding) or whose target
   the gateway does not serve ("*", authority form, a decoded NUL, no or two
   Host headers in HTTP/1.1) gets its
   RFC 9112 status (400, 501 for an unknown coding) with an OpenAI error
   object, "Connection: close", and the connection closed: exactly one
   response, also when the bytes after the headers hold a second request.
2. Two pipelined requests with plain framing get two responses (the
   counting in 1 would see a smuggled one).
3. An absolute-form target (GET http://host/v1/models) is served like its
   path.
4. A request with only its headers sent and a Content-Length over
   max_body_bytes gets its 413 at once, before any body byte is sent."""
import json
import socket
import time

from tandem_e2e import Fail, Pipeline, check, main, require_gateway

H = b"Host: x\r\n"
POST = b"POST /v1/completions HTTP/1.1\r\n" + H + b"Content-Type: application/json\r\n"
BODY = b'{"model":"tiny","prompt":[5,6],"max_tokens":1}'
SMUGGLED = b"GET /v1/models HTTP/1.1\r\n" + H + b"\r\n"

# (what it proves, request bytes, status, error code)
REFUSED = [
    ("two Content-Length that disagree",
     POST + b"Content-Length: %d\r\nContent-Length: 1\r\n\r\n" % len(BODY) + BODY, 400, "invalid_framing"),
    ("two Content-Length that agree: repeated is refused too",
     POST + b"Content-Length: %d\r\nContent-Length: %d\r\n\r\n" % (len(BODY), len(BODY)) + BODY, 400,
     "invalid_framing"),
    ("Content-Length with Transfer-Encoding: chunked",
     POST + b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n" % (len(BODY) + 7) +
     b"%x\r\n" % len(BODY) + BODY + b"\r\n0\r\n\r\n", 400, "invalid_framing"),
    ("an unknown transfer coding", POST + b"Transfer-Encoding: gzip\r\n\r\nabc", 501, "unsupported_transfer_coding"),
    ("an unknown coding before chunked", POST + b"Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 501,
     "unsupported_transfer_coding"),
    ("chunked twice in one header", POST + b"Transfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n", 400,
     "invalid_framing"),
    ("two Transfer-Encoding headers",
     POST + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400, "invalid_framing"),
    ("Transfer-Encoding in an HTTP/1.0 request",
     b"POST /v1/completions HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400, "invalid_framing"),
    ("HTTP/1.1 without Host", b"GET /v1/models HTTP/1.1\r\n\r\n", 400, "invalid_request_target"),
    ("two Host headers", b"GET /v1/models HTTP/1.1\r\n" + H + b"Host: y\r\n\r\n", 400, "invalid_request_target"),
    ("asterisk form", b"OPTIONS * HTTP/1.1\r\n" + H + b"\r\n", 400, "invalid_request_target"),
    ("authority form", b"GET x:443 HTTP/1.1\r\n" + H + b"\r\n", 400, "invalid_request_target"),
    ("a decoded NUL in the model name", b"GET /v1/models/ti%00ny HTTP/1.1\r\n" + H + b"\r\n", 400,
     "invalid_request_target"),
    ("a decoded NUL in a middle segment", b"GET /v1/mo%00dels/tiny HTTP/1.1\r\n" + H + b"\r\n", 400,
     "invalid_request_target"),
    ("a decoded NUL in an absolute-form target", b"GET http://x/v1/models/tiny%00 HTTP/1.1\r\n" + H + b"\r\n", 400,
     "invalid_request_target"),
]

# (what it proves, request bytes: a refused request whose "body" is a second request)
SMUGGLING = [
    ("CL.TE: chunked ends at 0, the rest is a request",
     POST + b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n" % (5 + len(SMUGGLED)) + b"0\r\n\r\n" +
     SMUGGLED),
    ("TE.CL: Content-Length 0, the chunk is a request",
     POST + b"Transfer-Encoding: chunked\r\nContent-Length: 0\r\n\r\n" + b"%x\r\n" % len(SMUGGLED) + SMUGGLED +
     b"\r\n0\r\n\r\n"),
    ("CL.CL: the first says 0, the second covers a request",
     POST + b"Content-Length: 0\r\nContent-Length: %d\r\n\r\n" % len(SMUGGLED) + SMUGGLED),
]


def port_of(p):
    return int(p.base_url.rsplit(":", 1)[1])


def exchange(p, data, timeout_s=5.0):
    """Sends data; reads until the gateway closes or timeout_s passes.
    Returns (bytes read, closed)."""
    s = socket.create_connection(("127.0.0.1", port_of(p)), timeout=timeout_s)
    got = b""
    try:
        s.sendall(data)
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            s.settimeout(max(0.01, deadline - time.time()))
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                return got, False
            if not chunk:
                return got, True
            got += chunk
        return got, False
    except ConnectionResetError:
        return got, True
    finally:
        s.close()


def responses(raw, what):
    """The responses in raw, each (status, lower-cased headers, body); every
    one must have a Content-Length."""
    out = []
    while raw:
        head, sep, rest = raw.partition(b"\r\n\r\n")
        check(sep, "%s: a response cut short: %r" % (what, raw[:300]))
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        check(len(parts) >= 2 and parts[0].startswith("HTTP/1.") and parts[1].isdigit(),
              "%s: not a status line: %r" % (what, lines[0]))
        h = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            h[k.strip().lower()] = v.strip()
        check("content-length" in h, "%s: a response without Content-Length: %r" % (what, head))
        n = int(h["content-length"])
        check(len(rest) >= n, "%s: a body cut short: %r" % (what, rest[:300]))
        out.append((int(parts[1]), h, rest[:n]))
        raw = rest[n:]
    return out


def one_error(raw, closed, what, status, code):
    """raw is exactly one response: status, an OpenAI error object with code,
    Connection: close, and the connection was closed after it."""
    rs = responses(raw, what)
    check(len(rs) == 1, "%s: %d responses, expected 1: %r" % (what, len(rs), raw[:600]))
    st, h, body = rs[0]
    check(st == status, "%s: status %d, expected %d: %r" % (what, st, status, raw[:400]))
    check(h.get("content-type", "").startswith("application/json"), "%s: content-type %r" % (what, h))
    try:
        err = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        raise Fail("%s: not an OpenAI error object: %r" % (what, body[:300]))
    check(set(err) == {"message", "type", "param", "code"}, "%s: error fields %s" % (what, sorted(err)))
    check(err["code"] == code, "%s: code %r, expected %r (%s)" % (what, err["code"], code, err["message"]))
    check(h.get("connection", "").lower() == "close", "%s: no Connection: close: %r" % (what, h))
    check(closed, "%s: the connection stayed open after the answer" % what)
    return err


def refused(p):
    for what, data, status, code in REFUSED:
        raw, closed = exchange(p, data)
        err = one_error(raw, closed, what, status, code)
        print("%-56s %d %s" % (what, status, err["message"]))
    for what, data in SMUGGLING:
        raw, closed = exchange(p, data)
        one_error(raw, closed, what, 400, "invalid_framing")
        print("%-56s one response, closed" % what)


def served(p):
    # Control: plain framing, two pipelined requests, two answers.
    raw, _ = exchange(p, POST + b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY + SMUGGLED, timeout_s=3)
    rs = responses(raw, "two pipelined requests")
    check(len(rs) == 2 and rs[0][0] == 200 and rs[1][0] == 200,
          "two pipelined requests: %s" % [(st, b[:100]) for st, _, b in rs])
    for target in (b"http://x/v1/models", b"HTTP://127.0.0.1:%d/v1/models/tiny" % port_of(p)):
        raw, _ = exchange(p, b"GET " + target + b" HTTP/1.1\r\n" + H + b"Connection: close\r\n\r\n")
        rs = responses(raw, target.decode())
        check(len(rs) == 1 and rs[0][0] == 200, "absolute form %s: %r" % (target, raw[:300]))
        body = json.loads(rs[0][2])
        check(body.get("id") == "tiny" or body.get("data", [{}])[0].get("id") == "tiny",
              "absolute form %s: %s" % (target, body))
    print("pipelined requests and absolute-form targets served")


def too_large_headers_only(p):
    """Only the headers, no body byte: the 413 must come from the headers."""
    limit = p.config["gateway"]["max_body_bytes"]
    t0 = time.time()
    raw, closed = exchange(p, POST + b"Content-Length: %d\r\n\r\n" % (limit + 1), timeout_s=3)
    check(raw, "Content-Length over the limit with no body sent: no answer within 3 s (closed %s)" % closed)
    one_error(raw, closed, "Content-Length over the limit, headers only", 413, "request_too_large")
    print("413 for a Content-Length of %d before any body byte, in %.3f s" % (limit + 1, time.time() - t0))


def test():
    require_gateway()
    p = Pipeline("gwframing", worker_timeout_ms=5000)
    p.make_pair()
    p.enable_gateway(max_body_bytes=4096)
    p.start_all()
    p.start("gateway")
    p.wait_http("/health")
    refused(p)
    served(p)
    too_large_headers_only(p)
    check(p.procs["gateway"].poll() is None, "the gateway exited")


if __name__ == "__main__":
    main(test)
