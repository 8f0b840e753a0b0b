#!/usr/bin/python3
"""GET /metrics is valid Prometheus text (checked by a small parser here:
HELP/TYPE lines, samples, labels, histogram buckets) holding the
coordinator's figures and the gateway's, and its counters move with traffic;
GET /health is 200 while the target is registered, 503 once it is killed
(requests then get 503 too) and 200 again after it is restarted."""
import json
import math
import re
import time

from tandem_e2e import Fail, Pipeline, check, http, main, require_gateway, sse_events

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+-?\d+)?$')
LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*(,|$)')


def parse_prometheus(text):
    """{(name, frozenset(labels)): value}, checking the format as it goes."""
    types, samples = {}, {}
    for n, line in enumerate(text.split("\n"), 1):
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 2 and parts[1] == "TYPE":
                check(len(parts) == 4 and parts[3] in ("counter", "gauge", "histogram", "summary", "untyped"),
                      "line %d: bad TYPE: %r" % (n, line))
                check(parts[2] not in types, "line %d: second TYPE for %s" % (n, parts[2]))
                types[parts[2]] = parts[3]
            continue
        m = SAMPLE.match(line)
        check(m is not None, "line %d: not a sample: %r" % (n, line))
        name, labels_text, value = m.group(1), m.group(3) or "", m.group(4)
        labels, pos = {}, 0
        while pos < len(labels_text):
            lm = LABEL.match(labels_text, pos)
            check(lm is not None, "line %d: bad labels: %r" % (n, labels_text))
            labels[lm.group(1)] = lm.group(2)
            pos = lm.end()
        try:
            v = float(value)
        except ValueError:
            raise Fail("line %d: bad value %r" % (n, value))
        key = (name, frozenset(labels.items()))
        check(key not in samples, "line %d: duplicate sample %s" % (n, line))
        samples[key] = v
        base = re.sub(r"_(bucket|sum|count|total)$", "", name)
        check(name in types or base in types or name.rsplit("_", 1)[0] in types,
              "line %d: %s has no TYPE line" % (n, name))
    # Histograms: cumulative buckets, +Inf equal to _count.
    for name, kind in types.items():
        if kind != "histogram":
            continue
        buckets = sorted(((float(dict(l)["le"]), v) for (nm, l), v in samples.items() if nm == name + "_bucket"),
                         key=lambda b: b[0])
        check(buckets and math.isinf(buckets[-1][0]), "%s: no +Inf bucket" % name)
        check(all(a[1] <= b[1] for a, b in zip(buckets, buckets[1:])), "%s: buckets not cumulative" % name)
        check(buckets[-1][1] == samples[(name + "_count", frozenset())], "%s: +Inf != _count" % name)
    return samples


def metrics(p):
    st, h, raw = http("GET", p.base_url + "/metrics", None)
    check(st == 200 and h.get("content-type", "").startswith("text/plain"), "/metrics: %d %s" % (st, h))
    return parse_prometheus(raw.decode())


def value(samples, name, **labels):
    return samples.get((name, frozenset(labels.items())), 0.0)


def wait_health(p, status, within_s):
    t0 = time.time()
    while True:
        st, _, raw = http("GET", p.base_url + "/health", None, timeout_s=10)
        if st == status:
            return raw
        check(time.time() - t0 < within_s, "/health still %d after %.1f s (wanted %d): %s" %
              (st, within_s, status, raw[:200]))
        time.sleep(0.05)


def test():
    require_gateway()
    p = Pipeline("gwmetrics", worker_timeout_ms=2000)
    draft, target = p.make_pair()
    p.enable_gateway()
    p.start_all()
    p.start("gateway")
    p.wait_http()
    check(json.loads(wait_health(p, 200, 5)) == {"status": "ok"}, "/health body")

    before = metrics(p)
    check(value(before, "tandem_gateway_coordinator_up") == 1, "coordinator_up")
    check(("tandem_spec_decode_num_draft_tokens_total", frozenset()) in before, "coordinator figures missing")
    comp = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 12, "temperature": 0}
    for _ in range(3):
        check(http("POST", p.base_url + "/v1/completions", comp)[0] == 200, "completion")
    st, _, raw = http("POST", p.base_url + "/v1/chat/completions",
                      {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
                       "stream": True})
    check(st == 200 and sse_events(raw)[-1] == "[DONE]", "stream")
    check(http("POST", p.base_url + "/v1/completions", dict(comp, n=3))[0] == 400, "n=3")
    after = metrics(p)

    def delta(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)
    check(delta("tandem_gateway_requests_total", endpoint="/v1/completions", status="200") == 3, "200 count")
    check(delta("tandem_gateway_requests_total", endpoint="/v1/completions", status="400") == 1, "400 count")
    check(delta("tandem_gateway_requests_total", endpoint="/v1/chat/completions", status="200") == 1, "chat count")
    check(delta("tandem_gateway_requests_total", endpoint="/metrics", status="200") == 1, "metrics count")
    check(delta("tandem_gateway_time_to_first_token_seconds_count") == 4, "ttft count")
    check(delta("tandem_gateway_e2e_request_latency_seconds_count") == 4, "e2e count")
    check(delta("tandem_gateway_time_per_output_token_seconds_count") >= 1, "tpot count")
    check(delta("tandem_gateway_generated_tokens_total") >= 4, "generated tokens")
    check(delta("tandem_requests_total") == 4, "coordinator requests_total moved by %s" % delta("tandem_requests_total"))
    check(value(after, "tandem_gateway_requests_in_flight") == 0 and
          value(after, "tandem_gateway_requests_waiting") == 0, "gauges back to 0")

    # The target dies: /health and requests say 503; back after the restart.
    p.kill("target")
    wait_health(p, 503, 10)
    st, _, raw = http("POST", p.base_url + "/v1/completions", comp)
    check(st == 503 and json.loads(raw)["error"]["code"] == "target_unavailable", "without a target: %d %s" %
          (st, raw[:200]))
    check(value(metrics(p), "tandem_worker_up", role="target") == 0, "tandem_worker_up{role=target} while down")
    p.start("target")
    wait_health(p, 200, 30)
    check(http("POST", p.base_url + "/v1/completions", comp)[0] == 200, "after the restart")

    # The coordinator gone: /health 503, /metrics still answers with the gateway's own figures.
    p.kill("coordinator")
    wait_health(p, 503, 5)
    m = metrics(p)
    check(value(m, "tandem_gateway_coordinator_up") == 0, "coordinator_up after its death")
    st, _, raw = http("POST", p.base_url + "/v1/completions", comp, timeout_s=30)
    check(st == 503, "without a coordinator: %d %s" % (st, raw[:200]))


if __name__ == "__main__":
    main(test)
