#!/usr/bin/python3
"""Slow and idle HTTP clients cannot starve the gateway (issue 49):
1. 300 connections from 127.0.0.2 that send nothing or half a request, with
   the default limits: at most max_connections_per_ip (64) of them are kept,
   the rest are answered 429 (an OpenAI error object, not a reset) and
   closed at once; completions from 127.0.0.1 are answered
   within a bound meanwhile; the kept ones are closed once
   header_timeout_ms has passed, a client trickling a byte at a time too (a
   deadline, not an idle timeout), and a body that stops is closed after
   body_timeout_ms.
2. Without a per-address limit, 300 idle connections are all held and cost
   no thread each (the event loops are gateway.threads; a thread per
   connection would be 300 more), while completions, streamed ones too, are
   answered.
3. A chunked upload over max_body_bytes gets its 413 (an OpenAI error
   object) before the whole upload is sent; a chunked one under the limit
   is served."""
import json
import select
import socket
import threading
import time

from tandem_e2e import Fail, Pipeline, check, http, main, require_gateway, sse_events

N_SLOW = 300
SERVE_BOUND_S = 10.0


def port_of(p):
    return int(p.base_url.rsplit(":", 1)[1])


def open_from(p, source, first_bytes=b""):
    """A connection to the gateway bound to the source address; sends first_bytes."""
    s = socket.socket()
    s.bind((source, 0))
    s.settimeout(5)
    s.connect(("127.0.0.1", port_of(p)))
    if first_bytes:
        s.sendall(first_bytes)
    s.setblocking(False)
    return s


ANSWERS = {}  # id(socket): what the gateway sent on it before closing it


def is_closed(s):
    """True when the gateway closed (or reset) the connection: readable to
    its end, or an error; False while it is open. What it sent first goes
    to ANSWERS."""
    while True:
        r, _, _ = select.select([s], [], [], 0)
        if not r:
            return False
        try:
            chunk = s.recv(4096)
        except BlockingIOError:
            return False
        except OSError:
            return True
        if not chunk:
            return True
        ANSWERS[id(s)] = ANSWERS.get(id(s), b"") + chunk


def slow_crowd(p, n):
    """n connections from 127.0.0.2: every other one idle, the others half a request."""
    half = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    return [open_from(p, "127.0.0.2", b"" if i % 2 == 0 else half) for i in range(n)]


def completions_answered(p, n=4, stream=False):
    """n completions at once from 127.0.0.1; returns the seconds until all answered."""
    body = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 8, "temperature": 0, "stream": stream}
    results = [None] * n

    def one(i):
        try:
            results[i] = http("POST", p.base_url + "/v1/completions", body, timeout_s=SERVE_BOUND_S)
        except Exception as e:  # reported below
            results[i] = (0, {}, repr(e).encode())
    t0 = time.time()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(SERVE_BOUND_S + 5)
    took = time.time() - t0
    for st, _, raw in results:
        check(st == 200, "a completion from 127.0.0.1 among slow clients: %s %s" % (st, raw[:300]))
        if stream:
            events = sse_events(raw)
            check(events and events[-1] == "[DONE]", "stream among slow clients: %r" % raw[-200:])
        else:
            check(len(json.loads(raw)["tandem"]["ids"]) == 8, "completion: %s" % raw[:300])
    check(took < SERVE_BOUND_S, "completions took %.1f s among slow clients" % took)
    return took


def wait_closed(socks, within_s, what):
    deadline = time.time() + within_s
    open_ = list(socks)
    while open_ and time.time() < deadline:
        open_ = [s for s in open_ if not is_closed(s)]
        time.sleep(0.05)
    check(not open_, "%s: %d of %d connections still open after %.1f s" % (what, len(open_), len(socks), within_s))


def gateway_threads(p):
    with open("/proc/%d/status" % p.procs["gateway"].pid) as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise Fail("no Threads: line for the gateway")


def deadlines_and_per_ip_limit(p):
    header_s = p.config["gateway"]["header_timeout_ms"] / 1000.0
    body_s = p.config["gateway"]["body_timeout_ms"] / 1000.0
    t_open = time.time()
    crowd = slow_crowd(p, N_SLOW)
    trickle = open_from(p, "127.0.0.1", b"P")
    stalled_body = open_from(p, "127.0.0.1", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                             b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"model\":")
    time.sleep(0.5)
    kept = [s for s in crowd if not is_closed(s)]
    check(0 < len(kept) <= 64, "max_connections_per_ip 64: %d of %d connections from 127.0.0.2 kept" %
          (len(kept), N_SLOW))
    for s in crowd:
        if s not in kept:
            got = ANSWERS.get(id(s), b"")
            check(got.startswith(b"HTTP/1.1 429 ") and b'"code":"too_many_connections"' in got,
                  "a connection past max_connections_per_ip: %r" % got[:300])
    took = completions_answered(p)
    print("per-address limit: %d of %d slow connections kept; 4 completions answered in %.2f s" %
          (len(kept), N_SLOW, took))
    check(time.time() - t_open < header_s - 0.5, "the completions took too long to check the deadlines")
    check(not any(is_closed(s) for s in kept), "slow connections closed before header_timeout_ms")
    # A byte every 0.2 s: never idle, still past its deadline.
    for ch in b"OST /v1/models HTTP/1.1\r\nX-Slow: " + b"a" * 200:
        if time.time() - t_open > header_s + 2 or is_closed(trickle):
            break
        try:
            trickle.send(bytes([ch]))
        except OSError:
            break
        time.sleep(0.2)
    wait_closed(kept + [trickle], max(0.0, t_open + header_s + 2.0 - time.time()), "header_timeout_ms")
    wait_closed([stalled_body], max(0.0, t_open + body_s + 2.0 - time.time()), "body_timeout_ms")
    print("kept and trickling connections closed %.1f s after they opened (header_timeout_ms %d)" %
          (time.time() - t_open, header_s * 1000))
    for s in crowd + [trickle, stalled_body]:
        s.close()


def held_without_threads(p):
    crowd = slow_crowd(p, N_SLOW)
    time.sleep(0.5)
    closed = sum(1 for s in crowd if is_closed(s))
    check(closed == 0, "no per-address limit: %d of %d slow connections were closed" % (closed, N_SLOW))
    threads = gateway_threads(p)
    check(threads < 40, "the gateway runs %d threads holding %d idle connections" % (threads, N_SLOW))
    took = completions_answered(p)
    took_stream = completions_answered(p, stream=True)
    print("%d idle connections held by %d threads; completions in %.2f s, streamed in %.2f s" %
          (N_SLOW, threads, took, took_stream))
    check(not any(is_closed(s) for s in crowd), "idle connections closed before header_timeout_ms")
    for s in crowd:
        s.close()


def chunked(p, limit):
    """Chunks of 1 KiB, up to 64 times the limit; returns (bytes sent, response bytes)."""
    s = socket.create_connection(("127.0.0.1", port_of(p)), timeout=10)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Transfer-Encoding: chunked\r\n\r\n")
    body = b'{"model":"tiny","prompt":"' + b"a" * (64 * limit) + b'"}'
    sent, got = 0, b""
    try:
        while sent < len(body):
            piece = body[sent:sent + 1024]
            s.sendall(b"%x\r\n" % len(piece) + piece + b"\r\n")
            sent += len(piece)
            if select.select([s], [], [], 0.02)[0]:
                break
        if sent == len(body):
            s.sendall(b"0\r\n\r\n")
    except OSError:
        pass  # the gateway closed its side: read what it said
    s.settimeout(5)
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
            if b"\r\n\r\n" in got and got.split(b"\r\n\r\n", 1)[1].rstrip().endswith(b"}"):
                break
    except OSError:
        pass
    s.close()
    return sent, len(body), got


def chunked_over_limit(p):
    limit = p.config["gateway"]["max_body_bytes"]
    sent, total, got = chunked(p, limit)
    check(got.startswith(b"HTTP/1.1 413"), "chunked upload over the limit: %r" % got[:300])
    err = json.loads(got.split(b"\r\n\r\n", 1)[1])["error"]
    check(err["code"] == "request_too_large" and set(err) == {"message", "type", "param", "code"},
          "413 error object: %s" % err)
    check(sent <= limit + 16 * 1024, "the 413 came after %d of %d bytes were sent (limit %d)" % (sent, total, limit))
    print("chunked upload: 413 after %d of %d bytes (limit %d)" % (sent, total, limit))
    # Under the limit, chunked is served.
    s = socket.create_connection(("127.0.0.1", port_of(p)), timeout=30)
    data = json.dumps({"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 4}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n" +
              b"%x\r\n" % 10 + data[:10] + b"\r\n" + b"%x\r\n" % (len(data) - 10) + data[10:] + b"\r\n0\r\n\r\n")
    got = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        got += chunk
    s.close()
    check(got.startswith(b"HTTP/1.1 200"), "chunked upload under the limit: %r" % got[:300])


def test():
    require_gateway()
    p = Pipeline("gwslow", max_concurrency=4, max_queue=16)
    p.make_pair()
    p.enable_gateway(header_timeout_ms=3000, body_timeout_ms=3000)
    p.start_all()
    p.start("gateway")
    p.wait_http()
    deadlines_and_per_ip_limit(p)

    p.kill("gateway", sig=15)
    p.config["gateway"].update(max_connections_per_ip=0, header_timeout_ms=30000, threads=2, max_body_bytes=4096)
    p.start("gateway")
    p.wait_http()
    held_without_threads(p)
    chunked_over_limit(p)
    st, _, raw = http("GET", p.base_url + "/v1/models", None)
    check(st == 200 and p.procs["gateway"].poll() is None, "after the slow clients: %s %s" % (st, raw[:200]))


if __name__ == "__main__":
    main(test)
