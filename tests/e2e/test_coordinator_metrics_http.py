#!/usr/bin/python3
"""Prometheus without the gateway (issue 64, item d): with
coordinator.metrics_listen set, the coordinator serves GET /metrics on that
port itself:
1. 200, text/plain version 0.0.4, the same series the stats request gives
   (tandem_requests_total counts a request made over ZeroMQ, and
   tandem_worker_up{worker="target"} is 1), Connection: close, closed.
2. Another path is a 404, another method a 405; a connection that sends
   nothing is closed after about 2 s and the coordinator keeps serving
   (a completion and another scrape) meanwhile.
3. A port already in use stops the coordinator at start with exit 78 (a
   configuration error: the supervisor does not restart it), naming
   coordinator.metrics_listen."""
import socket
import subprocess
import time

from tandem_e2e import Pipeline, binary, check, free_port, generate, http, main


def scrape(port, what=b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", timeout_s=5):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
    try:
        s.sendall(what)
        got = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return got
            got += chunk
    finally:
        s.close()


def sample(text, name):
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def test():
    port = free_port()
    p = Pipeline("coordmetrics", extra={"coordinator": {"metrics_listen": "127.0.0.1:%d" % port}})
    p.make_pair()
    p.start_all()
    p.wait_workers(1, 1)
    c = p.client()
    done, _ = generate(c, {"id": "m1", "prompt_ids": [5, 6, 7], "max_tokens": 4, "temperature": 0})
    check(done["type"] == "done", "the completion: %s" % done)
    st, h, body = http("GET", "http://127.0.0.1:%d/metrics" % port)
    text = body.decode()
    check(st == 200 and h.get("content-type", "").startswith("text/plain; version=0.0.4"),
          "GET /metrics: %d %s" % (st, h))
    check(h.get("connection", "").lower() == "close", "GET /metrics: Connection %r" % h.get("connection"))
    check(sample(text, "tandem_requests_total") == 1.0, "tandem_requests_total: %s" % sample(text, "tandem_requests_total"))
    check('tandem_worker_up{worker="target"' in text, "no tandem_worker_up for the target:\n%s" % text[:2000])
    print("GET /metrics: 200, %d lines, tandem_requests_total 1" % len(text.splitlines()))

    raw = scrape(port, b"GET /other HTTP/1.1\r\nHost: x\r\n\r\n")
    check(raw.startswith(b"HTTP/1.1 404 "), "GET /other: %r" % raw[:100])
    raw = scrape(port, b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    check(raw.startswith(b"HTTP/1.1 405 "), "POST /metrics: %r" % raw[:100])
    idle = socket.create_connection(("127.0.0.1", port), timeout=10)
    t0 = time.time()
    done, _ = generate(c, {"id": "m2", "prompt_ids": [5, 6, 7], "max_tokens": 4, "temperature": 0})
    check(done["type"] == "done", "a completion beside an idle scrape connection: %s" % done)
    raw = scrape(port)
    check(raw.startswith(b"HTTP/1.1 200 ") and b"tandem_requests_total 2\n" in raw, "scrape beside an idle one: %r" %
          raw[:200])
    check(idle.recv(100) == b"", "the idle connection got bytes")
    waited = time.time() - t0
    check(1.5 <= waited <= 4, "the idle connection was closed after %.2f s" % waited)
    idle.close()
    print("404, 405; an idle connection closed after %.2f s while the coordinator served on" % waited)

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    taken = holder.getsockname()[1]
    r = subprocess.run([binary("coordinator"), "--config", p.dir + "/config.json",
                        "--coordinator.metrics_listen", "127.0.0.1:%d" % taken,
                        "--coordinator.client_endpoint", "ipc://%s/other.sock" % p.dir,
                        "--coordinator.worker_endpoint", "ipc://%s/otherw.sock" % p.dir],
                       capture_output=True, text=True, timeout=30)
    holder.close()
    check(r.returncode == 78 and "coordinator.metrics_listen" in r.stderr,
          "a taken metrics port: exit %d, %s" % (r.returncode, r.stderr[-500:]))
    print("a taken port: exit %d, %s" % (r.returncode, r.stderr.strip().splitlines()[-1]))


if __name__ == "__main__":
    main(test)
