#!/usr/bin/python3
"""Every bad request of the issue gets an error reply with its code and a
message naming the problem, and the coordinator keeps serving: not JSON,
missing prompt, unknown field, wrong types, prompt longer than the context,
max_tokens <= 0, bad sampling values, oversized message, token id outside the
vocabulary; past max_concurrency + max_queue a request gets `overloaded` at
once; a draft whose vocabulary differs from the target's is refused."""
import json
import subprocess
import time

from tandem_e2e import Pipeline, binary, check, collect, generate, main, reference


def expect_error(sock, req, code, needle, rid=""):
    raw = req if isinstance(req, bytes) else json.dumps(req).encode()
    sock.send(raw)
    check(sock.poll(20000), "no reply to %r" % raw[:200])
    m = sock.recv_json()
    check(m.get("type") == "error", "expected an error for %r, got %s" % (raw[:200], m))
    check(m.get("code") == code, "expected code %s for %r, got %s" % (code, raw[:200], m))
    check(needle in m.get("message", ""), "message %r lacks %r" % (m.get("message"), needle))
    check(m.get("id") == rid, "error reply id %r, expected %r" % (m.get("id"), rid))


def test():
    p = Pipeline("errors", max_concurrency=1, max_queue=1,
                 extra={"target_worker": {"max_seq_len": 64}, "draft_worker": {"max_seq_len": 64}})
    draft, target = p.make_pair()
    p.start_all()
    s = p.client()
    g = {"v": 1, "type": "generate", "id": "e"}

    expect_error(s, b"this is not json", "invalid_request", "not valid JSON")
    expect_error(s, b'{"v":1,"type":"generate","prompt_ids":[1,2', "invalid_request", "not valid JSON")
    expect_error(s, dict(g, max_tokens=4), "invalid_request", "prompt: required", "e")
    expect_error(s, dict(g, prompt_ids=[1], colour="red"), "invalid_request", "colour: unknown field", "e")
    expect_error(s, dict(g, prompt_ids=[1], temperature="hot"), "invalid_request",
                 "temperature: expected a number, got string", "e")
    expect_error(s, dict(g, prompt_ids="1,2"), "invalid_request", "prompt_ids: expected an array", "e")
    expect_error(s, dict(g, prompt_ids=[1], stream="yes"), "invalid_request", "stream: expected a boolean", "e")
    expect_error(s, dict(g, prompt_ids=[1], max_tokens=0), "invalid_request", "max_tokens: must be >= 1, got 0", "e")
    expect_error(s, dict(g, prompt_ids=[1], max_tokens=-3), "invalid_request", "max_tokens: must be >= 1", "e")
    expect_error(s, dict(g, prompt_ids=[1], temperature=-1), "invalid_request", "temperature: must be in [0, 1e+06]", "e")
    expect_error(s, dict(g, prompt_ids=[1], top_p=0), "invalid_request", "top_p: must be in (0, 1]", "e")
    expect_error(s, dict(g, prompt_ids=[1], top_k=-2), "invalid_request", "top_k: must be >= 0", "e")
    expect_error(s, dict(g, prompt_ids=[1], min_p=3), "invalid_request", "min_p: must be in [0, 1]", "e")
    expect_error(s, dict(g, prompt_ids=[1], stop=[""]), "invalid_request", "stop[0]: must not be empty", "e")
    expect_error(s, dict(g, prompt_ids=[1, 999999]), "invalid_request", "prompt_ids[1]", "e")
    expect_error(s, dict(g, prompt_ids=list(range(1, 100))), "context_full", "do not fit the context", "e")
    expect_error(s, {"v": 2, "type": "generate", "id": "e", "prompt_ids": [1]}, "invalid_request",
                 "unsupported protocol version", "e")
    expect_error(s, {"v": 1, "type": "launch", "id": "e"}, "invalid_request", "unknown message type", "e")
    big = json.dumps(dict(g, prompt="x" * (3 << 19))).encode()  # 1.5 MiB: over the limit, under the hard cap
    expect_error(s, big, "invalid_request", "too large", "e")  # its id read without parsing it

    # Still serving, and correctly.
    ref = reference(target, [5, 6, 7], 10)["ids"]
    done, _ = generate(s, {"id": "ok", "prompt_ids": [5, 6, 7], "max_tokens": 10, "temperature": 0})
    check(done.get("ids") == ref, "after bad requests: %s" % done)

    # Stop strings: the text up to the stop string, finish_reason stop_string.
    full, _ = generate(s, {"id": "full", "prompt": "hello", "max_tokens": 30, "temperature": 0})
    text = full["text"]
    if len(text) > 6:
        stop = text[3:6]
        cut, _ = generate(s, {"id": "cut", "prompt": "hello", "max_tokens": 30, "temperature": 0, "stop": [stop]})
        check(cut["finish_reason"] == "stop_string", "stop string: %s" % cut)
        check(cut["text"] == text[:text.index(stop)], "stop string: text %r, expected %r" %
              (cut["text"], text[:text.index(stop)]))

    # Overload: 1 active + 1 queued, the third is refused at once.
    long_req = {"v": 1, "type": "generate", "prompt_ids": [1, 2], "max_tokens": 60, "temperature": 0}
    for i in range(3):
        s.send_json(dict(long_req, id="o%d" % i))
    t0 = time.time()
    m, _ = collect(s, "o2", 20)
    check(m["type"] == "error" and m["code"] == "overloaded", "third request: %s" % m)
    for i in range(2):
        m, _ = collect(s, "o%d" % i, 60)
        check(m["type"] == "done", "request o%d under load: %s" % (i, m))
    check(time.time() - t0 < 60, "overload handling too slow")

    # The CLI reports the error and exits 1.
    r = subprocess.run([binary("client"), "--endpoint", p.endpoint, "--ids", "1", "--max-tokens", "0",
                        "--timeout-ms", "10000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    check(r.returncode == 2 or (r.returncode == 1 and "max_tokens" in r.stderr), "CLI: %d %s" % (r.returncode, r.stderr))
    r = subprocess.run([binary("client"), "--endpoint", p.endpoint, "--ids", "1", "--temperature", "-1",
                        "--timeout-ms", "10000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    check(r.returncode == 1 and "temperature" in r.stderr, "CLI error: %d %s" % (r.returncode, r.stderr))
    s.close()
    p.close()

    # A draft with another vocabulary is refused with a clear log line.
    p = Pipeline("refuse")
    p.make_pair()
    other = p.dir + "/other-draft"
    subprocess.run([binary("make_model"), "--preset", "tiny-draft", "--vocab", "400", "--out", other],
                   check=True, stdout=subprocess.DEVNULL)
    p.config["draft_worker"]["model"] = other
    p.start("coordinator")
    p.start("draft")   # before the target: held, checked when the target registers
    time.sleep(0.5)
    p.start("target")
    deadline = time.time() + 20
    while time.time() < deadline and "refusing draft worker" not in p.log_tail("coordinator", 200):
        time.sleep(0.2)
    log = p.log_tail("coordinator", 200)
    check("refusing draft worker" in log and "vocab_size 400 differs from the target's 512" in log,
          "no refusal log line:\n%s" % log)
    try:
        p.procs["draft"].wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    check(p.procs["draft"].returncode == 78, "refused draft: exit status %s, expected 78" % p.procs["draft"].returncode)
    p.kill("draft")
    p.wait_workers(draft=False, target=True)
    s = p.client()
    done, _ = generate(s, {"id": "t", "prompt_ids": [3, 4], "max_tokens": 5, "temperature": 0})
    check(done["type"] == "done", "target-only service with a refused draft: %s" % done)
    s.close()
    p.close()


if __name__ == "__main__":
    main(test)
