#!/usr/bin/python3
"""Cancellation: an HTTP client that hangs up mid-stream (or before its
answer) has its request cancelled: the coordinator's active count is back to
zero within a second, twenty such hang-ups in a row leak nothing (a later
request is served, both slots work). In the client protocol: a "cancel"
message ends the request with code "cancelled"; a DEALER that vanishes
mid-stream is cancelled too (ZMQ_ROUTER_MANDATORY); tandem-client
--cancel-after-ms cancels."""
import json
import socket
import subprocess
import threading
import time

import zmq

from tandem_e2e import Pipeline, binary, check, http, main, next_event, no_eos, reference, require_gateway

MAX_TOKENS = 8000  # never reached: every request here is cancelled long before


def cancelled(p):
    return p.stats()["requests"]["errors"]["cancelled"]


def wait_idle(p, what, within_s=1.0):
    t0 = time.time()
    while True:
        r = p.stats()["requests"]
        if r["active"] == 0 and r["queued"] == 0:
            return time.time() - t0
        check(time.time() - t0 < within_s, "%s: still %d active, %d queued after %.1f s" %
              (what, r["active"], r["queued"], within_s))
        time.sleep(0.01)


def open_stream(p, body):
    """Sends a streamed request on a raw socket and reads up to the first
    event; returns the socket."""
    port = int(p.base_url.rsplit(":", 1)[1])
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    data = json.dumps(body).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(data) + data)
    got = b""
    while b"data: " not in got:
        chunk = s.recv(4096)
        check(chunk, "the stream closed before its first event: %r" % got[:300])
        got += chunk
    check(got.startswith(b"HTTP/1.1 200"), "stream status: %r" % got[:200])
    return s


def test():
    require_gateway()
    p = Pipeline("gwcancel", max_concurrency=2, max_queue=2)
    draft, target = p.make_pair()
    no_eos(draft, target)
    p.enable_gateway()
    p.start_all()
    p.start("gateway")
    p.wait_http()
    body = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True}

    # One hang-up mid-stream, then twenty in a row.
    worst = 0.0
    for i in range(21):
        s = open_stream(p, body)
        s.close()
        worst = max(worst, wait_idle(p, "hang-up %d" % i))
    check(cancelled(p) == 21, "21 hang-ups, %d cancelled" % cancelled(p))
    print("slowest return to idle after a hang-up: %.3f s" % worst)

    # A non-streamed request whose client hangs up before the answer.
    port = int(p.base_url.rsplit(":", 1)[1])
    s = socket.create_connection(("127.0.0.1", port))
    data = json.dumps(dict(body, stream=False)).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(data) + data)
    deadline = time.time() + 5
    while p.stats()["requests"]["active"] == 0 and time.time() < deadline:
        time.sleep(0.01)
    s.close()
    wait_idle(p, "non-streamed hang-up")
    check(cancelled(p) == 22, "non-streamed hang-up not cancelled: %d" % cancelled(p))

    # Nothing leaked: both slots serve, the output is still the target's.
    ref = reference(target, [3, 1, 4], 16)
    results = []

    def one():
        results.append(http("POST", p.base_url + "/v1/completions",
                            {"model": "tiny", "prompt": [3, 1, 4], "max_tokens": 16, "temperature": 0}))
    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for st, _, raw in results:
        check(st == 200 and json.loads(raw)["tandem"]["ids"] == ref["ids"], "after the hang-ups: %d %s" % (st, raw[:200]))
    check(len(results) == 2, "concurrent requests: %d answered" % len(results))

    # The client protocol's cancel.
    z = p.client()
    z.send_json({"v": 1, "type": "generate", "id": "c1", "prompt_ids": [5, 6, 7], "max_tokens": MAX_TOKENS,
                 "temperature": 0, "stream": True})
    check(next_event(z, "c1")["type"] == "token", "no token before the cancel")
    z.send_json({"v": 1, "type": "cancel", "id": "c1"})
    while True:
        m = next_event(z, "c1", 10)
        if m["type"] != "token":
            break
    check(m["type"] == "error" and m["code"] == "cancelled", "cancel reply: %s" % m)
    wait_idle(p, "cancel message")
    z.send_json({"v": 1, "type": "cancel", "id": "c1"})  # nothing runs: ignored, no reply
    z.send_json({"v": 1, "type": "cancel"})
    m = next_event(z, "", 10)
    check(m["type"] == "error" and m["code"] == "invalid_request" and "id: required" in m["message"],
          "cancel without id: %s" % m)
    z.close()

    # A DEALER that vanishes mid-stream.
    z = p.client()
    z.send_json({"v": 1, "type": "generate", "id": "v1", "prompt_ids": [5, 6, 7], "max_tokens": MAX_TOKENS,
                 "temperature": 0, "stream": True})
    check(next_event(z, "v1")["type"] == "token", "no token before vanishing")
    z.close(linger=0)
    wait_idle(p, "vanished DEALER")

    # tandem-client --cancel-after-ms.
    r = subprocess.run([binary("client"), "--endpoint", p.endpoint, "--ids", "5,6,7", "--max-tokens",
                        str(MAX_TOKENS), "--temperature", "0", "--stream", "--cancel-after-ms", "100"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    check(r.returncode == 1 and "cancelled" in r.stderr, "tandem-client --cancel-after-ms: %d %s" %
          (r.returncode, r.stderr))
    wait_idle(p, "tandem-client cancel")
    n = cancelled(p)
    check(n == 25, "cancelled count %d, expected 25" % n)
    check(p.procs["coordinator"].poll() is None and p.procs["gateway"].poll() is None, "a process died")


if __name__ == "__main__":
    main(test)
