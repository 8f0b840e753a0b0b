#!/usr/bin/python3
"""The gateway's limits agree with the coordinator's, and its exposure is a
choice (issue 49):
1. With coordinator.max_message_bytes 8192, the gateway's derived body limit
   is 8192 - 512: a body of the coordinator's size is a 413 at once (not a
   coordinator error, not a 504), a body of the gateway's limit is served,
   and a body under the limit that grows in translation past the
   coordinator's limit (token ids written 2e9) is a 413 naming
   coordinator.max_message_bytes, answered at once.
2. An explicit gateway.max_body_bytes the coordinator cannot take stops the
   gateway at start (exit 78) naming both keys.
3. Listening beyond loopback without an API key stops it at start, naming
   gateway.listen, gateway.api_key and gateway.allow_unauthenticated; with
   allow_unauthenticated: 1 it serves (and warns).
4. A parked request ends at its deadline: with request_timeout_ms 700 and
   the target stopped, a completion (streamed or not) is a 504 within 3 s and
   is cancelled; /health of a stopped coordinator is a 503 after its 1 s.
5. metrics_require_key: /metrics needs the key (401 with an OpenAI error
   object, then 200 with it, any case of "Bearer"); /health still does not;
   without a key to require it stops at start."""
import json
import signal
import time

from tandem_e2e import Fail, Pipeline, check, http, main, require_gateway

KEY = "sk-limits-1"
COORD_MAX = 8192
BODY_MAX = COORD_MAX - 512


def error_of(st, h, raw, status, what):
    check(st == status, "%s: status %d, expected %d: %s" % (what, st, status, raw[:300]))
    check(h.get("content-type", "").startswith("application/json"), "%s: content-type %s" % (what, h))
    try:
        err = json.loads(raw)["error"]
    except (ValueError, KeyError, TypeError):
        raise Fail("%s: not an OpenAI error object: %r" % (what, raw[:300]))
    check(set(err) == {"message", "type", "param", "code"}, "%s: error fields %s" % (what, sorted(err)))
    return err


def body_of_size(n):
    """A completion body of exactly n bytes, padded in "user" (accepted and
    dropped: a long prompt would make prefill messages to the workers over
    the small coordinator.max_message_bytes of this test)."""
    base = json.dumps({"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 1, "user": ""}).encode()
    body = json.dumps({"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 1, "user": "u" * (n - len(base))}).encode()
    check(len(body) == n, "padding: %d != %d" % (len(body), n))
    return body


def start_refused(p, what, needles, **gateway):
    p.kill("gateway", sig=15)
    saved = dict(p.config["gateway"])
    p.config["gateway"].update(gateway)
    proc = p.start("gateway")
    try:
        rc = proc.wait(timeout=20)
    except Exception:
        raise Fail("%s: the gateway started" % what)
    finally:
        p.config["gateway"] = saved
    log = open(p.logs["gateway"]).read()
    check(rc == 78, "%s: exit %s, expected 78 (a configuration error)\n%s" % (what, rc, log[-1000:]))
    for n in needles:
        check(n in log, "%s: the error does not name %s:\n%s" % (what, n, log[-1000:]))
    p.procs.pop("gateway", None)


def restart(p, **gateway):
    p.kill("gateway", sig=15)
    p.config["gateway"].update(gateway)
    p.start("gateway")
    p.wait_http("/health")


def sizes(p):
    url = p.base_url + "/v1/completions"
    t0 = time.time()
    st, h, raw = http("POST", url, body_of_size(COORD_MAX), timeout_s=30)
    err = error_of(st, h, raw, 413, "a body of coordinator.max_message_bytes")
    check(err["code"] == "request_too_large" and "gateway.max_body_bytes" in err["message"], "413: %s" % err)
    check(time.time() - t0 < 5, "the 413 took %.1f s" % (time.time() - t0))

    st, _, raw = http("POST", url, body_of_size(BODY_MAX), timeout_s=30)
    check(st == 200, "a body of exactly the gateway's limit (%d bytes): %d %s" % (BODY_MAX, st, raw[:300]))

    ids = b",".join([b"2e9"] * ((BODY_MAX - 100) // 4))
    grown = b'{"model":"tiny","prompt":[' + ids + b'],"max_tokens":1}'
    check(len(grown) <= BODY_MAX, "the growing body is %d bytes" % len(grown))
    t0 = time.time()
    st, h, raw = http("POST", url, grown, timeout_s=30)
    err = error_of(st, h, raw, 413, "a body that grows past the coordinator's limit")
    check(err["code"] == "request_too_large" and "coordinator.max_message_bytes" in err["message"],
          "413 for the translated size: %s" % err)
    check(time.time() - t0 < 5, "the 413 took %.1f s" % (time.time() - t0))
    print("413 for %d bytes that become a larger message: %s" % (len(grown), err["message"]))
    check(p.stats()["requests"]["active"] == 0, "a refused request reached the coordinator")


def silence(p):
    """Parked requests end at their deadline: the watcher wakes them."""
    restart(p, request_timeout_ms=700)
    body = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 4}
    p.procs["target"].send_signal(signal.SIGSTOP)
    try:
        for stream in (False, True):
            t0 = time.time()
            st, h, raw = http("POST", p.base_url + "/v1/completions", dict(body, stream=stream), timeout_s=30)
            took = time.time() - t0
            err = error_of(st, h, raw, 504, "a silent coordinator (stream %s)" % stream)
            check(err["code"] == "timeout" and 0.6 < took < 3.0, "504 after %.2f s: %s" % (took, err))
    finally:
        p.procs["target"].send_signal(signal.SIGCONT)
    p.procs["coordinator"].send_signal(signal.SIGSTOP)
    try:
        t0 = time.time()
        st, h, raw = http("GET", p.base_url + "/health", None, timeout_s=30)
        took = time.time() - t0
        err = error_of(st, h, raw, 503, "/health of a stopped coordinator")
        check(err["code"] == "coordinator_unavailable" and 0.9 < took < 3.0, "503 after %.2f s: %s" % (took, err))
    finally:
        p.procs["coordinator"].send_signal(signal.SIGCONT)
    deadline = time.time() + 10
    while p.stats()["requests"]["active"] != 0:
        check(time.time() < deadline, "the timed-out requests were not cancelled")
        time.sleep(0.05)


def metrics_key(p):
    restart(p, api_key=KEY, metrics_require_key=1)
    st, h, raw = http("GET", p.base_url + "/metrics", None)
    err = error_of(st, h, raw, 401, "/metrics without the key")
    check(err["type"] == "authentication_error" and h.get("www-authenticate") == "Bearer", "401: %s %s" % (err, h))
    for auth in ("Bearer " + KEY, "bearer " + KEY, "BEARER\t" + KEY):
        st, _, raw = http("GET", p.base_url + "/metrics", None, headers={"Authorization": auth})
        check(st == 200 and b"tandem_gateway_requests_total" in raw, "/metrics with %r: %d %s" % (auth, st, raw[:200]))
    st, _, raw = http("GET", p.base_url + "/health", None)
    check(st == 200, "/health needs no key: %d %s" % (st, raw[:200]))
    st, h, raw = http("GET", p.base_url + "/v1/models", None, headers={"Authorization": "Basic " + KEY})
    error_of(st, h, raw, 401, "another scheme")


def exposure(p):
    port = p.base_url.rsplit(":", 1)[1]
    start_refused(p, "0.0.0.0 without a key", ["gateway.listen", "gateway.api_key", "gateway.allow_unauthenticated"],
                  listen="0.0.0.0:" + port)
    start_refused(p, "metrics_require_key without a key", ["gateway.metrics_require_key"], metrics_require_key=1)
    restart(p, listen="0.0.0.0:" + port, allow_unauthenticated=1)
    st, _, raw = http("GET", p.base_url + "/v1/models", None)
    check(st == 200, "0.0.0.0 with allow_unauthenticated: %d %s" % (st, raw[:200]))
    check("WITHOUT an API key" in open(p.logs["gateway"]).read(), "no warning for an unauthenticated gateway")


def test():
    require_gateway()
    p = Pipeline("gwlimits", worker_timeout_ms=10000, extra={"coordinator": {"max_message_bytes": COORD_MAX}})
    p.make_pair()
    p.enable_gateway()
    p.start_all()
    start_refused(p, "max_body_bytes over the coordinator's limit",
                  ["gateway.max_body_bytes", "coordinator.max_message_bytes"], max_body_bytes=COORD_MAX)
    p.start("gateway")
    p.wait_http("/health")
    sizes(p)
    silence(p)
    metrics_key(p)
    p.config["gateway"].pop("api_key")
    p.config["gateway"].pop("metrics_require_key")
    exposure(p)
    check(p.procs["gateway"].poll() is None and p.procs["coordinator"].poll() is None, "a process died")


if __name__ == "__main__":
    main(test)
