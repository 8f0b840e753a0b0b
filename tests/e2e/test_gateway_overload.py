#!/usr/bin/python3
"""Overload is answered, never a reset (issue 63, item 3):
1. 1,000 connections at once from 127.0.0.2, each asking GET /v1/models,
   with the default limits (max_connections_per_ip 64): every one gets a
   whole HTTP answer, a 200 or a 429 with Retry-After and an OpenAI error
   object (code too_many_connections), then an orderly close; none is
   reset or closed without a word; at most 64 are served. Meanwhile
   completions from 127.0.0.1 are served.
2. With max_connections 8 (no per-address limit), 20 connections: 8 are
   served, 12 get a 503 with Retry-After naming gateway.max_connections.
3. Past the coordinator's queue (max_concurrency 4 + max_queue 8), a
   completion's 429 carries Retry-After too."""
import json
import resource
import select
import socket
import threading
import time

from tandem_e2e import Fail, Pipeline, check, http, main, require_gateway

N_CROWD = 1000
REQUEST = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"


def port_of(p):
    return int(p.base_url.rsplit(":", 1)[1])


def crowd(p, source, n):
    """n connections from source, each sending REQUEST; returns the sockets."""
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind((source, 0))
        s.settimeout(10)
        s.connect(("127.0.0.1", port_of(p)))
        s.sendall(REQUEST)
        s.setblocking(False)
        socks.append(s)
    return socks


def read_answers(socks, within_s):
    """Reads every socket until it holds one whole response (the served
    ones stay open: keep-alive) or is closed. Returns a list of
    (bytes, how it ended: "answered", "eof", "reset")."""
    got = {s: b"" for s in socks}
    ended = {}
    deadline = time.time() + within_s
    while len(ended) < len(socks) and time.time() < deadline:
        waiting = [s for s in socks if s not in ended]
        r, _, _ = select.select(waiting[:1000], [], [], 0.2)
        for s in r:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                ended[s] = "reset"
                continue
            except BlockingIOError:
                continue
            if not chunk:
                ended[s] = "eof"
                continue
            got[s] += chunk
            head, sep, body = got[s].partition(b"\r\n\r\n")
            if sep and b"content-length:" in head.lower():
                n = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                if len(body) >= n and head.startswith(b"HTTP/1.1 200"):
                    ended[s] = "answered"  # served and kept alive
    return [(got[s], ended.get(s, "silent")) for s in socks]


def parse(raw, what):
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    h = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    check(lines[0].startswith("HTTP/1.1 "), "%s: not an HTTP response: %r" % (what, raw[:200]))
    return int(lines[0].split()[1]), h, body


def refused_properly(raw, end, status, what):
    check(end == "eof", "%s: ended %s after %r" % (what, end, raw[:200]))
    st, h, body = parse(raw, what)
    check(st == status, "%s: status %d, expected %d: %r" % (what, st, status, raw[:300]))
    check(h.get("retry-after") == "1", "%s: Retry-After %r" % (what, h.get("retry-after")))
    check(h.get("connection", "").lower() == "close", "%s: Connection %r" % (what, h.get("connection")))
    err = json.loads(body)["error"]
    check(set(err) == {"message", "type", "param", "code"} and err["code"] == "too_many_connections",
          "%s: error %s" % (what, err))
    return err


def crowd_of_1000(p):
    body = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 8, "temperature": 0}
    served = []

    def normal_client():
        while len(served) < 6 and time.time() < t_end:
            st, _, raw = http("POST", p.base_url + "/v1/completions", body, timeout_s=20)
            served.append((st, raw[:200]))
    t0 = time.time()
    t_end = t0 + 30
    th = threading.Thread(target=normal_client)
    th.start()
    socks = crowd(p, "127.0.0.2", N_CROWD)
    opened = time.time() - t0
    answers = read_answers(socks, 15)
    th.join(30)
    took = time.time() - t0
    ends = {}
    for raw, end in answers:
        ends[end] = ends.get(end, 0) + 1
    ok = [a for a in answers if a[1] == "answered"]
    refused = [a for a in answers if a[1] != "answered"]
    for i, (raw, end) in enumerate(refused):
        err = refused_properly(raw, end, 429, "connection %d of the crowd" % i)
    check(0 < len(ok) <= 64, "max_connections_per_ip 64: %d of %d connections served" % (len(ok), N_CROWD))
    check(served and all(st == 200 for st, _ in served), "127.0.0.1 among the crowd: %s" % served)
    print("%d connections from 127.0.0.2 opened in %.2f s: %d served, %d answered 429 and closed (%s); "
          "127.0.0.1 served %d completions meanwhile; %.2f s in all" %
          (N_CROWD, opened, len(ok), len(refused), err["message"], len(served), took))
    for s in socks:
        s.close()


def total_limit(p):
    p.kill("gateway", sig=15)
    p.config["gateway"].update(max_connections=8, max_connections_per_ip=0)
    p.start("gateway")
    p.wait_http("/v1/models")
    time.sleep(0.3)  # the probe's connection is gone
    socks = crowd(p, "127.0.0.1", 20)
    answers = read_answers(socks, 10)
    ok = [a for a in answers if a[1] == "answered"]
    refused = [a for a in answers if a[1] != "answered"]
    check(len(ok) == 8, "max_connections 8: %d of 20 served" % len(ok))
    for i, (raw, end) in enumerate(refused):
        err = refused_properly(raw, end, 503, "connection %d past max_connections" % i)
        check("gateway.max_connections" in err["message"], "503 message: %s" % err["message"])
    print("max_connections 8: 8 served, %d answered 503 (%s)" % (len(refused), err["message"]))
    for s in socks:
        s.close()


def queue_full(p):
    """Twenty slow completions at once against 4 + 8 places: the rest are 429s."""
    body = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 2000, "temperature": 0}
    results = []

    def one():
        results.append(http("POST", p.base_url + "/v1/completions", body, timeout_s=120))
    threads = [threading.Thread(target=one) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(150)
    full = [(st, h, raw) for st, h, raw in results if st == 429]
    check(full, "20 completions against max_concurrency 4 + max_queue 8: no 429: %s" %
          [st for st, _, _ in results])
    for st, h, raw in full:
        check(h.get("retry-after") == "1", "429 from the coordinator's queue: Retry-After %r" % h.get("retry-after"))
        check(json.loads(raw)["error"]["code"] == "overloaded", "429: %r" % raw[:200])
    print("coordinator queue full: %d of 20 answered 429 with Retry-After" % len(full))


def test():
    require_gateway()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < N_CROWD + 200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    p = Pipeline("gwoverload", worker_timeout_ms=5000,
                 extra={"target_worker": {"max_seq_len": 4096}, "draft_worker": {"max_seq_len": 4096}})
    p.make_pair()
    p.enable_gateway(threads=2)
    p.start_all()
    p.start("gateway")
    p.wait_http("/health")
    crowd_of_1000(p)
    queue_full(p)
    total_limit(p)
    check(p.procs["gateway"].poll() is None, "the gateway exited")


if __name__ == "__main__":
    main(test)
