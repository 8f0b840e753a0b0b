#!/usr/bin/python3
"""Every malformed or unsupported HTTP request gets its status and an OpenAI
error object naming the problem, and the gateway and the coordinator keep
serving: 401 without the API key (any case of "Bearer" is accepted), 404
unknown path or model, 405 wrong method, 413 body too large, 400 for bad
JSON, missing fields, wrong types, numbers beyond a double's range
(named "not finite"), out-of-range values (n > 16, logprobs beyond 20,
penalties, a logit_bias for no token), top_logprobs without logprobs, a tool without its
function, a tool_choice without tools,
a response_format of an unknown type or with a schema keyword the grammar
engine cannot honour (named) and a prompt longer than the context, 429 when the coordinator is full.

Lenient where the clients are: no "model" is the served one; an unknown
field is answered 200 and named in the Tandem-Ignored-Fields header and
one gateway log line; restarted with gateway.strict_fields: true, the same
unknown field is a 400 naming it. ignore_eos: true generates past EOS up to
max_tokens: the same ids as without it up to the EOS, then more."""
import json
import subprocess
import signal
import socket
import threading
import time

from tandem_e2e import Fail, Pipeline, binary, check, http, main, reference, require_gateway

KEY = "sk-test-123"
AUTH = {"Authorization": "Bearer " + KEY}


def expect(p, method, path, body, status, param=None, needle=None, headers=AUTH, code=None):
    st, h, raw = http(method, p.base_url + path, body, headers=headers, timeout_s=30)
    what = "%s %s %r" % (method, path, body if not isinstance(body, bytes) else body[:80])
    check(st == status, "%s: status %d, expected %d: %s" % (what, st, status, raw[:300]))
    check(h.get("content-type", "").startswith("application/json"), "%s: content-type %s" % (what, h))
    try:
        err = json.loads(raw)["error"]
    except (ValueError, KeyError, TypeError):
        raise Fail("%s: not an OpenAI error object: %r" % (what, raw[:300]))
    check(set(err) == {"message", "type", "param", "code"}, "%s: error fields %s" % (what, sorted(err)))
    if param is not None:
        check(err["param"] == param, "%s: param %r, expected %r (%s)" % (what, err["param"], param, err["message"]))
    if needle is not None:
        check(needle in err["message"], "%s: message %r lacks %r" % (what, err["message"], needle))
    if code is not None:
        check(err["code"] == code, "%s: code %r, expected %r" % (what, err["code"], code))
    return err, h


def test():
    require_gateway()
    p = Pipeline("gwerrors", max_concurrency=1, max_queue=0, worker_timeout_ms=5000,
                 extra={"target_worker": {"max_seq_len": 64}, "draft_worker": {"max_seq_len": 64}})
    draft, target = p.make_pair()
    p.enable_gateway(api_key=KEY, max_body_bytes=4096)
    p.start_all()
    p.start("gateway")
    p.wait_http("/health")
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    comp = {"model": "tiny", "prompt": "hi", "max_tokens": 4}

    # Authentication, routes, methods, size.
    err, h = expect(p, "GET", "/v1/models", None, 401, headers={})
    check(err["type"] == "authentication_error" and h.get("www-authenticate") == "Bearer", "401: %s %s" % (err, h))
    expect(p, "POST", "/v1/chat/completions", chat, 401, headers={"Authorization": "Bearer wrong"})
    expect(p, "POST", "/v1/chat/completions", chat, 401, headers={"Authorization": "Basic " + KEY})
    expect(p, "POST", "/v1/chat/completions", chat, 401, headers={"Authorization": "Bearer" + KEY})
    # The scheme is case-insensitive (RFC 9110): any case of "Bearer" is Bearer.
    for auth in ("bearer " + KEY, "BEARER " + KEY, "bEaReR \t " + KEY):
        st, _, raw = http("GET", p.base_url + "/v1/models", None, headers={"Authorization": auth})
        check(st == 200, "Authorization %r: %d %s" % (auth, st, raw[:200]))
    expect(p, "GET", "/v1/nothing", None, 404, code="not_found")
    expect(p, "GET", "/v1/models/other", None, 404, code="model_not_found")
    err, h = expect(p, "GET", "/v1/chat/completions", None, 405, code="method_not_allowed")
    check(h.get("allow") == "POST", "405 Allow header: %s" % h)
    expect(p, "DELETE", "/v1/models", None, 405)
    expect(p, "POST", "/v1/completions", dict(comp, prompt="x" * 8000), 413, code="request_too_large")

    # Bodies.
    expect(p, "POST", "/v1/chat/completions", b"not json", 400, needle="not valid JSON")
    expect(p, "POST", "/v1/chat/completions", b"", 400, needle="empty")
    expect(p, "POST", "/v1/chat/completions", b"[1,2]", 400, needle="JSON object")
    expect(p, "POST", "/v1/chat/completions", b'{"model":"tiny","messages":[', 400, needle="not valid JSON")
    expect(p, "POST", "/v1/chat/completions", {"messages": chat["messages"], "model": 7}, 400, param="model")
    expect(p, "POST", "/v1/chat/completions", dict(chat, model="gpt-4"), 404, param="model", code="model_not_found")
    expect(p, "POST", "/v1/chat/completions", {"model": "tiny"}, 400, param="messages")
    expect(p, "POST", "/v1/completions", {"model": "tiny"}, 400, param="prompt")
    expect(p, "POST", "/v1/chat/completions", dict(chat, messages=[]), 400, param="messages")
    expect(p, "POST", "/v1/chat/completions", dict(chat, messages="hi"), 400, param="messages")
    expect(p, "POST", "/v1/chat/completions", dict(chat, messages=[{"role": "function", "content": "x"}]), 400,
           param="messages[0].role")
    expect(p, "POST", "/v1/chat/completions", dict(chat, messages=[{"role": "user", "content": 5}]), 400,
           param="messages[0].content")
    expect(p, "POST", "/v1/chat/completions",
           dict(chat, messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]), 400,
           param="messages[0].content[0]")
    expect(p, "POST", "/v1/chat/completions", dict(chat, n=17), 400, param="n")
    expect(p, "POST", "/v1/chat/completions", dict(chat, logprobs=1), 400, param="logprobs")
    expect(p, "POST", "/v1/chat/completions", dict(chat, top_logprobs=2), 400, param="top_logprobs")
    expect(p, "POST", "/v1/chat/completions", dict(chat, tools=[{"type": "function"}]), 400, param="tools[0]",
           needle="tools[0]: expected")
    expect(p, "POST", "/v1/chat/completions", dict(chat, tool_choice="auto"), 400, param="tool_choice")
    expect(p, "POST", "/v1/chat/completions", dict(chat, response_format={"type": "json_schema", "json_schema": {
        "name": "n", "schema": {"type": "integer", "minimum": 0}}}), 400, param="response_format",
           needle="unsupported keyword 'minimum'")
    expect(p, "POST", "/v1/chat/completions", dict(chat, response_format={"type": "xml"}), 400,
           param="response_format")
    expect(p, "POST", "/v1/chat/completions", dict(chat, presence_penalty=2.5), 400, param="presence_penalty")
    expect(p, "POST", "/v1/chat/completions", dict(chat, logit_bias={"99999999": 5}), 400, param="logit_bias")
    expect(p, "POST", "/v1/chat/completions", dict(chat, repetition_penalty=0), 400, param="repetition_penalty")
    expect(p, "POST", "/v1/chat/completions", dict(chat, ignore_eos="yes"), 400, param="ignore_eos")
    expect(p, "POST", "/v1/chat/completions", b'{"model":"tiny","model":"tiny","messages":[]}', 400, param="model",
           needle="more than once")
    # Nested repeats too, and bytes that are not UTF-8 (json.loads of the
    # reply fails unless the error body is UTF-8 JSON).
    expect(p, "POST", "/v1/chat/completions",
           b'{"model":"tiny","messages":[{"role":"user","content":"a","content":"b"}]}', 400,
           param="messages[0].content", needle="more than once")
    expect(p, "POST", "/v1/chat/completions",
           b'{"model":"tiny","messages":[{"role":"user","content":"a\xfe"}]}', 400, needle="UTF-8")
    expect(p, "POST", "/v1/chat/completions", b'{"model":"tiny","messages":[],"col\xefour":1}', 400,
           needle="UTF-8")
    expect(p, "POST", "/v1/completions", dict(comp, echo=True), 400, param="echo")
    expect(p, "POST", "/v1/completions", dict(comp, suffix="x"), 400, param="suffix")
    expect(p, "POST", "/v1/completions", dict(comp, logprobs=21), 400, param="logprobs")
    expect(p, "POST", "/v1/completions", dict(comp, best_of=3), 400, param="best_of")
    expect(p, "POST", "/v1/completions", dict(comp, prompt=["a", "b"]), 400, param="prompt")
    expect(p, "POST", "/v1/completions", dict(comp, prompt=[1, -2]), 400, param="prompt")
    expect(p, "POST", "/v1/completions", dict(comp, stream="yes"), 400, param="stream")
    expect(p, "POST", "/v1/completions", dict(comp, stream_options={"include_usage": True}), 400,
           param="stream_options")
    expect(p, "POST", "/v1/completions", dict(comp, stream=True, stream_options={"x": 1}), 400,
           param="stream_options")
    expect(p, "POST", "/v1/completions", dict(comp, temperature="hot"), 400, param="temperature")
    # Numbers beyond a double's range (cJSON reads them as infinity) are
    # named as such, not as "null" after a round trip.
    for field in ("temperature", "top_p", "min_p", "presence_penalty", "seed", "max_tokens", "top_k"):
        for num in (b"1e999", b"-1e999"):
            raw = b'{"model":"tiny","prompt":"hi","' + field.encode() + b'":' + num + b'}'
            err, _ = expect(p, "POST", "/v1/completions", raw, 400, param=field, needle="not finite")
            check("null" not in err["message"], "%s %s: %s" % (field, num, err["message"]))
    expect(p, "POST", "/v1/completions", dict(comp, max_tokens=1.5), 400, param="max_tokens")
    expect(p, "POST", "/v1/completions", dict(comp, stop=[1]), 400, param="stop")
    # Range checks come back from the coordinator, still naming the field.
    expect(p, "POST", "/v1/completions", dict(comp, max_tokens=0), 400, param="max_tokens")
    expect(p, "POST", "/v1/completions", dict(comp, temperature=-1), 400, param="temperature")
    expect(p, "POST", "/v1/completions", dict(comp, top_p=0), 400, param="top_p")
    expect(p, "POST", "/v1/completions", dict(comp, spec_k=99), 400, param="spec_k")
    expect(p, "POST", "/v1/completions", dict(comp, stop=["a"] * 9), 400, param="stop")
    expect(p, "POST", "/v1/completions", dict(comp, prompt=[1] * 100), 400, code="context_length_exceeded")
    expect(p, "POST", "/v1/completions", dict(comp, prompt=[1, 999999]), 400, param="prompt_ids[1]")
    # A streamed request that is refused gets the status, not an event stream.
    expect(p, "POST", "/v1/chat/completions", dict(chat, max_tokens=0, stream=True), 400, param="max_tokens")

    # 429: the one slot taken (the target paused so that it stays taken), no queue.
    p.procs["target"].send_signal(signal.SIGSTOP)
    result = {}

    def slow():
        result["r"] = http("POST", p.base_url + "/v1/completions", dict(comp, prompt=[5, 6, 7]), headers=AUTH)
    t = threading.Thread(target=slow)
    try:
        t.start()
        deadline = time.time() + 5
        while p.stats()["requests"]["active"] != 1 and time.time() < deadline:
            time.sleep(0.02)
        expect(p, "POST", "/v1/completions", comp, 429, code="overloaded")
    finally:
        p.procs["target"].send_signal(signal.SIGCONT)
    t.join(60)
    check(result.get("r", (0,))[0] == 200, "the request holding the slot: %s" % (result.get("r"),))

    # A client that sends half a body and hangs up harms nothing.
    s = socket.create_connection(("127.0.0.1", int(p.base_url.rsplit(":", 1)[1])))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\nAuthorization: Bearer " +
              KEY.encode() + b"\r\n\r\n{\"model\":")
    s.close()

    # Lenient by default: no model is the served one; unknown fields and
    # are accepted, named in a header and a log line.
    lenient = [
        # (path, body, Tandem-Ignored-Fields or None)
        ("/v1/chat/completions", {"messages": chat["messages"], "max_tokens": 2}, None),
        ("/v1/completions", dict(comp, model=None, repetition_penalty=1.0, ignore_eos=False), None),
        ("/v1/chat/completions", dict(chat, colour="red", chat_template_kwargs={"x": 1}), "colour,chat_template_kwargs"),
        ("/v1/completions", dict(comp, ignore_eos=True, stream=True), None),
    ]
    for path, body, listed in lenient:
        st, h, raw = http("POST", p.base_url + path, body, headers=AUTH, timeout_s=30)
        check(st == 200, "lenient %s %r: %d %s" % (path, body, st, raw[:300]))
        check(h.get("tandem-ignored-fields") == listed, "%s %r: Tandem-Ignored-Fields %r, want %r" %
              (path, body, h.get("tandem-ignored-fields"), listed))
        if not body.get("stream"):
            check(json.loads(raw)["model"] == "tiny", "%s %r: model %s" % (path, body, json.loads(raw)["model"]))
    deadline = time.time() + 5
    while "fields accepted without effect: colour,chat_template_kwargs" not in p.log_tail("gateway", 400):
        check(time.time() < deadline, "no log line for the ignored fields:\n%s" % p.log_tail("gateway"))
        time.sleep(0.05)

    # ignore_eos: the same ids up to the EOS, then on to max_tokens.
    eos_prompt = [33, 3]
    ref = reference(target, eos_prompt, 20)
    check(ref["finish_reason"] == "stop" and len(ref["ids"]) < 20,
          "premise: %s should end at an EOS before 20 tokens: %s" % (eos_prompt, ref))
    body = dict(comp, prompt=eos_prompt, max_tokens=20, temperature=0)
    st, _, raw = http("POST", p.base_url + "/v1/completions", body, headers=AUTH)
    out = json.loads(raw)
    check(st == 200 and out["tandem"]["ids"] == ref["ids"] and out["choices"][0]["finish_reason"] == "stop",
          "without ignore_eos: %d %s (reference %s)" % (st, raw[:300], ref["ids"]))
    st, _, raw = http("POST", p.base_url + "/v1/completions", dict(body, ignore_eos=True), headers=AUTH)
    out = json.loads(raw)
    ids = out["tandem"]["ids"]
    check(st == 200 and len(ids) == 20 and ids[:len(ref["ids"])] == ref["ids"] and
          out["choices"][0]["finish_reason"] == "length" and out["usage"]["completion_tokens"] == 20,
          "ignore_eos: %d %s (reference %s)" % (st, raw[:400], ref["ids"]))
    print("ignore_eos: %d ids past the EOS at %d" % (len(ids) - len(ref["ids"]), len(ref["ids"]) - 1))
    # target-only decoding runs plain steps, which the target stops at an EOS: the
    # coordinator must not wait for the rest of the run
    st, _, raw = http("POST", p.base_url + "/v1/completions", dict(body, ignore_eos=True, draft="none"), headers=AUTH,
                      timeout_s=30)
    check(st == 200 and json.loads(raw)["tandem"]["ids"] == ids, "ignore_eos, draft none: %d %s" % (st, raw[:300]))

    # Still serving, and correctly; the coordinator is fine too.
    ref = reference(target, [5, 6, 7], 8)
    st, _, raw = http("POST", p.base_url + "/v1/completions", dict(comp, prompt=[5, 6, 7], max_tokens=8,
                                                                    temperature=0), headers=AUTH)
    check(st == 200 and json.loads(raw)["tandem"]["ids"] == ref["ids"], "after the errors: %d %s" % (st, raw[:300]))
    st, _, raw = http("GET", p.base_url + "/v1/models", None, headers=AUTH)
    check(st == 200 and json.loads(raw)["data"][0]["id"] == "tiny", "models: %d %s" % (st, raw))
    check(http("GET", p.base_url + "/health", None)[0] == 200, "/health needs no key")
    check(p.procs["gateway"].poll() is None and p.procs["coordinator"].poll() is None, "a process died")
    s = p.stats()["requests"]
    check(s["active"] == 0 and s["queued"] == 0, "coordinator: %s" % s)

    # gateway.strict_fields: true gives back the 400 naming the field.
    p.kill("gateway", signal.SIGTERM)
    p.config["gateway"]["strict_fields"] = True
    p.start("gateway")
    p.wait_http("/health")
    expect(p, "POST", "/v1/chat/completions", dict(chat, colour="red"), 400, param="colour", needle="unknown field")
    st, h, _ = http("POST", p.base_url + "/v1/completions", dict(comp, ignore_eos=True), headers=AUTH)
    check(st == 200 and "tandem-ignored-fields" not in h, "strict, ignore_eos: %d %s" % (st, h))
    st, h, _ = http("POST", p.base_url + "/v1/completions", dict(comp, repetition_penalty=1), headers=AUTH)
    check(st == 200 and "tandem-ignored-fields" not in h, "strict, repetition_penalty 1: %d %s" % (st, h))

    # A second gateway on the address the first holds: a configuration error
    # (78, not restarted by the supervisor) that says why, as the
    # coordinator's metrics port does (one listen rule, common/base).
    r = subprocess.run([binary("gateway"), "--config", p.dir + "/config.json"], capture_output=True, text=True,
                       timeout=60)
    check(r.returncode == 78 and "another process listens there" in r.stderr,
          "a taken HTTP port: exit %d, %s" % (r.returncode, r.stderr[-500:]))
    check(p.procs["gateway"].poll() is None, "the first gateway died")


if __name__ == "__main__":
    main(test)
