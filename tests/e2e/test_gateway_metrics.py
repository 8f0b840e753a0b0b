#!/usr/bin/python3
"""GET /metrics is valid Prometheus text (checked by a small parser here:
HELP/TYPE lines, samples, labels, histogram buckets) holding the
coordinator's figures and the gateway's, and its counters move with traffic;
GET /health is 200 while the target is registered, 503 once it is killed
(requests then get 503 too) and 200 again after it is restarted.

The engine gauges a balancer reads under vLLM's names (llm-d's inference
scheduler: vllm:num_requests_waiting, vllm:num_requests_running,
vllm:kv_cache_usage_perc and its old name vllm:gpu_cache_usage_perc, label
model_name) are checked against real load: with more long streamed requests
in flight than the coordinator has slots, running is the slot count, running
plus waiting is the number in flight, and the KV usage is in (0, 1]; once
they are gone (hung up: the gateway cancels them) all three are 0 again;
without a coordinator the series are absent, not 0.

vLLM's names for what its dashboards chart, label model_name, beside
Tandem's own: the histograms vllm:time_to_first_token_seconds,
vllm:time_per_output_token_seconds and vllm:e2e_request_latency_seconds
move with the tandem_gateway_* ones, and vllm:prompt_tokens_total,
vllm:generation_tokens_total and vllm:spec_decode_num_{drafts,draft_tokens,
accepted_tokens}_total equal the coordinator's tandem_* counters of the
same scrape. A target-only instance (no draft_worker section) exports no
series labelled worker="draft": no tandem_worker_up{worker="draft"} 0 that
would never clear."""
import http.client as http_client
import json
import math
import os
import re
import socket
import threading
import time
import urllib.parse

from tandem_e2e import Fail, Pipeline, check, http, main, reference, require_gateway, sse_events, time_scale

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
    # Histograms: per label set (less le), cumulative buckets, +Inf equal to _count.
    for name, kind in types.items():
        if kind != "histogram":
            continue
        series = {}
        for (nm, l), v in samples.items():
            if nm == name + "_bucket":
                d = dict(l)
                series.setdefault(frozenset((k, x) for k, x in d.items() if k != "le"), []).append((float(d["le"]), v))
        check(series, "%s: no buckets" % name)
        for labels, buckets in series.items():
            buckets.sort(key=lambda b: b[0])
            check(math.isinf(buckets[-1][0]), "%s%s: no +Inf bucket" % (name, dict(labels)))
            check(all(a[1] <= b[1] for a, b in zip(buckets, buckets[1:])), "%s: buckets not cumulative" % name)
            check(buckets[-1][1] == samples.get((name + "_count", labels)), "%s%s: +Inf != _count" %
                  (name, dict(labels)))
            check((name + "_sum", labels) in samples, "%s%s: no _sum" % (name, dict(labels)))
    return samples


def metrics_text(p):
    st, h, raw = http("GET", p.base_url + "/metrics", None)
    check(st == 200 and h.get("content-type", "").startswith("text/plain"), "/metrics: %d %s" % (st, h))
    return parse_prometheus(raw.decode()), raw.decode()


def metrics(p):
    return metrics_text(p)[0]


def value(samples, name, **labels):
    return samples.get((name, frozenset(labels.items())), 0.0)


MODEL = "tiny"   # the served model name: the target directory's basename
ENGINE_GAUGES = ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
                 "vllm:gpu_cache_usage_perc")


def engine(p):
    """The vLLM-named gauges of one scrape, {name: value} (each checked to
    be there, typed gauge, labelled model_name only), and the samples."""
    samples, text = metrics_text(p)
    got = {}
    for name in ENGINE_GAUGES:
        check("# TYPE %s gauge\n" % name in text, "no gauge TYPE line for %s" % name)
        key = (name, frozenset({("model_name", MODEL)}))
        check(key in samples, "%s{model_name=\"%s\"} missing from /metrics" % (name, MODEL))
        check(sum(1 for nm, _ in samples if nm == name) == 1, "%s: more than one series" % name)
        got[name] = samples[key]
    check(got["vllm:kv_cache_usage_perc"] == got["vllm:gpu_cache_usage_perc"],
          "kv_cache_usage_perc %s != gpu_cache_usage_perc %s" %
          (got["vllm:kv_cache_usage_perc"], got["vllm:gpu_cache_usage_perc"]))
    check(0.0 <= got["vllm:kv_cache_usage_perc"] <= 1.0, "KV usage out of [0, 1]: %s" % got)
    # the same scrape's coordinator figures they are made of
    check(got["vllm:num_requests_running"] == value(samples, "tandem_requests_active") and
          got["vllm:num_requests_waiting"] == value(samples, "tandem_requests_queued"),
          "running/waiting %s disagree with tandem_requests_active %s / queued %s" %
          (got, value(samples, "tandem_requests_active"), value(samples, "tandem_requests_queued")))
    total = value(samples, "tandem_kv_blocks_total_target")
    check(total > 0 and abs(got["vllm:kv_cache_usage_perc"] - value(samples, "tandem_kv_blocks_reserved_target") /
                            total) < 1e-6, "KV usage %s is not reserved/total of the target's pool (%s/%s)" %
          (got["vllm:kv_cache_usage_perc"], value(samples, "tandem_kv_blocks_reserved_target"), total))
    return got


class HeldStream:
    """A streamed completion read on a thread of its own until it ends or
    hang_up() cuts it."""

    def __init__(self, base_url, body):
        u = urllib.parse.urlsplit(base_url)
        self.conn = http_client.HTTPConnection(u.hostname, u.port, timeout=300)
        self.body = body
        self.status, self.events, self.error, self.ended_at = None, [], None, None
        self.connected = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            self.conn.connect()
            self.connected.set()
            self.conn.request("POST", "/v1/completions", body=json.dumps(self.body),
                              headers={"Content-Type": "application/json"})
            r = self.conn.getresponse()
            self.status = r.status
            while True:
                line = r.readline()
                if not line:
                    break
                if line.startswith(b"data: "):
                    self.events.append(line[6:].strip())
        except (OSError, http_client.HTTPException) as e:
            self.error = e
        finally:
            self.connected.set()
            self.ended_at = time.time()

    def hang_up(self):
        try:
            self.conn.sock.shutdown(socket.SHUT_RDWR)
        except (OSError, AttributeError):
            pass
        self.thread.join(30)
        self.conn.close()


def check_engine_gauges_under_load(p, slots):
    """More long streamed requests than slots: the gauges add up while they
    run, and go back to 0 once they are gone."""
    n = slots + 3
    prompt, max_tokens = [64, 65, 66, 67], 2000
    # the premise: this prompt's greedy output is long (no EOS before
    # max_tokens), so no request ends while the gauges are read
    ref = reference(p.config["target_worker"]["model"], prompt, max_tokens)
    check(ref["finish_reason"] == "length", "prompt %s ends after %d tokens (%s): pick a longer-running one" %
          (prompt, len(ref["ids"]), ref["finish_reason"]))
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "draft": "none"}
    held = [HeldStream(p.base_url, body) for _ in range(n)]
    try:
        deadline = time.time() + 30 * time_scale()
        while True:
            g = engine(p)
            running, waiting = g["vllm:num_requests_running"], g["vllm:num_requests_waiting"]
            check(running + waiting <= n and running <= slots,
                  "%d requests in flight, %d slots: running %s, waiting %s" % (n, slots, running, waiting))
            if running + waiting == n:
                break
            check(time.time() < deadline, "running %s + waiting %s never reached the %d requests in flight" %
                  (running, waiting, n))
            time.sleep(0.05)
        ended = [h for h in held if h.ended_at is not None]
        check(not ended, "%d stream(s) ended while the gauges were read (status %s, error %s): the premise of "
              "long requests failed" % (len(ended), ended[0].status, ended[0].error) if ended else "")
        check(running == slots and waiting == n - slots,
              "%d requests in flight, %d slots: running %s (want %d), waiting %s (want %d)" %
              (n, slots, running, slots, waiting, n - slots))
        usage = g["vllm:kv_cache_usage_perc"]
        check(0.0 < usage <= 1.0, "KV usage %s with %d sequences running" % (usage, running))
        print("under load: %d in flight, %d slots: vllm:num_requests_running %g, vllm:num_requests_waiting %g, "
              "vllm:kv_cache_usage_perc %.4f" % (n, slots, running, waiting, usage))
    finally:
        for h in held:
            h.hang_up()   # the gateway cancels each at the coordinator
    deadline = time.time() + 20 * time_scale()
    while True:
        g = engine(p)
        if g["vllm:num_requests_running"] == 0 and g["vllm:num_requests_waiting"] == 0 and \
                g["vllm:kv_cache_usage_perc"] == 0:
            break
        check(time.time() < deadline, "gauges not back to 0 after the requests were cancelled: %s" % g)
        time.sleep(0.05)


# vLLM's name -> the Tandem series it must equal in the same scrape
VLLM_HISTOGRAMS = {"vllm:time_to_first_token_seconds": "tandem_gateway_time_to_first_token_seconds",
                   "vllm:time_per_output_token_seconds": "tandem_gateway_time_per_output_token_seconds",
                   "vllm:e2e_request_latency_seconds": "tandem_gateway_e2e_request_latency_seconds"}
VLLM_COUNTERS = {"vllm:prompt_tokens_total": "tandem_prompt_tokens_total",
                 "vllm:generation_tokens_total": "tandem_generated_tokens_total",
                 "vllm:spec_decode_num_drafts_total": "tandem_spec_decode_num_drafts_total",
                 "vllm:spec_decode_num_draft_tokens_total": "tandem_spec_decode_num_draft_tokens_total",
                 "vllm:spec_decode_num_accepted_tokens_total": "tandem_spec_decode_num_accepted_tokens_total"}


def check_vllm_series(samples, text):
    """Every vLLM-named histogram and counter is there, typed, labelled
    model_name, and equal to its Tandem twin of the same scrape."""
    mn = frozenset({("model_name", MODEL)})
    for name, twin in VLLM_HISTOGRAMS.items():
        check("# TYPE %s histogram\n" % name in text, "no histogram TYPE line for %s" % name)
        for part in ("_count", "_sum"):
            check((name + part, mn) in samples, "%s%s{model_name=\"%s\"} missing" % (name, part, MODEL))
            check(abs(samples[(name + part, mn)] - value(samples, twin + part)) < 1e-6,
                  "%s%s %s != %s%s %s" % (name, part, samples[(name + part, mn)], twin, part,
                                          value(samples, twin + part)))
        buckets = [(dict(l)["le"], v) for (nm, l), v in samples.items() if nm == name + "_bucket"]
        check(all(dict(l).get("model_name") == MODEL for (nm, l), _ in samples.items() if nm == name + "_bucket"),
              "%s buckets without model_name" % name)
        check(len(buckets) > 5, "%s: %d buckets" % (name, len(buckets)))
    for name, twin in VLLM_COUNTERS.items():
        check("# TYPE %s counter\n" % name in text, "no counter TYPE line for %s" % name)
        check((name, mn) in samples, "%s{model_name=\"%s\"} missing" % (name, MODEL))
        check(samples[(name, mn)] == value(samples, twin), "%s %s != %s %s" %
              (name, samples[(name, mn)], twin, value(samples, twin)))
    pos0 = frozenset({("model_name", MODEL), ("position", "0")})
    check(samples.get(("vllm:spec_decode_num_accepted_tokens_per_pos_total", pos0)) ==
          value(samples, "tandem_spec_decode_num_accepted_tokens_per_pos", position="0"),
          "vllm:spec_decode_num_accepted_tokens_per_pos_total{position=0} missing or != Tandem's")


def check_dashboard_series(samples):
    """Every series deploy/grafana/tandem-vllm.json queries is exported."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy", "grafana",
                        "tandem-vllm.json")
    with open(path) as f:
        dash = json.load(f)
    exprs = [t["expr"] for panel in dash["panels"] for t in panel["targets"]]
    names = set(re.findall(r"\b(vllm:[a-z0-9_]+|tandem_[a-z0-9_]+)", " ".join(exprs)))
    exported = {nm for nm, _ in samples}
    missing = sorted(n for n in names if n not in exported)
    check(len(names) >= 8 and not missing, "the dashboard queries series /metrics lacks: %s" % missing)


def check_target_only_has_no_draft_series():
    """An instance without a draft_worker section: no series says a draft
    is down, the target's say it is up, and the vLLM series are there."""
    p = Pipeline("gwmetricsto")
    p.make_pair()
    del p.config["draft_worker"]
    p.enable_gateway()
    p.start("coordinator")
    p.start("target")
    p.wait_workers(draft=False, target=True)
    p.start("gateway")
    p.wait_http()
    comp = {"prompt": [5, 6, 7], "max_tokens": 6, "temperature": 0}
    check(http("POST", p.base_url + "/v1/completions", comp)[0] == 200, "target-only completion")
    samples, text = metrics_text(p)
    up = samples.get(("tandem_worker_up", frozenset({"worker": "draft", "pair": "0"}.items())))
    check(up is None, "a target-only instance exports tandem_worker_up{worker=\"draft\",pair=\"0\"} %s "
          "(a 'down' that never clears)" % up)
    draft = sorted("%s%s" % (nm, dict(l)) for nm, l in samples if dict(l).get("worker") == "draft")
    check(not draft, "a target-only instance exports draft series (a permanent 'down'): %s" % draft[:5])
    check(value(samples, "tandem_worker_up", worker="target", pair="0") == 1, "target-only: target not up")
    check_vllm_series(samples, text)
    check(samples[("vllm:generation_tokens_total", frozenset({("model_name", MODEL)}))] >= 1,
          "target-only: vllm:generation_tokens_total did not move")
    print("target-only: no worker=\"draft\" series; vLLM-named series present")
    p.close()


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

    idle = engine(p)
    check(all(v == 0 for v in idle.values()), "engine gauges of an idle instance: %s" % idle)
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
    check(http("POST", p.base_url + "/v1/completions", dict(comp, n=17))[0] == 400, "n=17")
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
    check(delta("vllm:time_to_first_token_seconds_count", model_name=MODEL) == 4, "vllm ttft count")
    check(delta("vllm:e2e_request_latency_seconds_count", model_name=MODEL) == 4, "vllm e2e count")
    check(delta("vllm:generation_tokens_total", model_name=MODEL) >= 4, "vllm generation tokens")
    check(delta("vllm:prompt_tokens_total", model_name=MODEL) >= 4, "vllm prompt tokens")
    check_vllm_series(after, metrics_text(p)[1])
    check_dashboard_series(after)
    # a draft is configured here: its series are there, and up
    check(value(after, "tandem_worker_up", worker="draft", pair="0") == 1, "draft not up in a draft deployment")
    check(value(after, "tandem_gateway_requests_in_flight") == 0 and
          value(after, "tandem_gateway_requests_waiting") == 0, "gauges back to 0")
    done = engine(p)
    check(all(v == 0 for v in done.values()), "engine gauges after the requests finished: %s" % done)
    check_engine_gauges_under_load(p, p.config["coordinator"]["max_concurrency"])

    # The target dies: /health and requests say 503; back after the restart.
    p.kill("target")
    wait_health(p, 503, 10)
    st, _, raw = http("POST", p.base_url + "/v1/completions", comp)
    check(st == 503 and json.loads(raw)["error"]["code"] == "target_unavailable", "without a target: %d %s" %
          (st, raw[:200]))
    up = metrics(p).get(("tandem_worker_up", frozenset({"worker": "target", "pair": "0"}.items())))
    check(up == 0, "tandem_worker_up{worker=target,pair=0} while down: %s" % up)
    p.start("target")
    wait_health(p, 200, 30)
    check(http("POST", p.base_url + "/v1/completions", comp)[0] == 200, "after the restart")

    # The coordinator gone: /health 503, /metrics still answers with the gateway's own figures.
    p.kill("coordinator")
    wait_health(p, 503, 5)
    m = metrics(p)
    check(value(m, "tandem_gateway_coordinator_up") == 0, "coordinator_up after its death")
    left = [nm for nm, _ in m if nm in ENGINE_GAUGES]
    check(not left, "engine gauges without a coordinator (must be absent, not stale or 0): %s" % left)
    st, _, raw = http("POST", p.base_url + "/v1/completions", comp, timeout_s=30)
    check(st == 503, "without a coordinator: %d %s" % (st, raw[:200]))
    p.close()

    check_target_only_has_no_draft_series()


if __name__ == "__main__":
    main(test)
