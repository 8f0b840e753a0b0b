#!/usr/bin/python3
"""n > 1 (tiny pair): n sequences sampled from one prompt, batched
together, choice i seeded with seed + i, so it equals a request of n = 1
with that seed (and the same fixed spec_k), through the native protocol
(done and token replies with "index") and over HTTP (choices[i].index, usage
summed, streamed chunks with their index and one [DONE]); greedy choices are
all the target-only output; the prompt is computed once (the later choices
map it from the target's prefix cache)."""
import json
import subprocess
import time

from tandem_e2e import Pipeline, _next_reply, binary, check, generate, http, main, require_gateway, sse_events

PROMPT = [11, 42, 7, 300, 5]
N = 4


def native_n(s, req):
    """The done replies of a request with n > 1 by index, and its token events."""
    s.send_json(dict({"v": 1, "type": "generate"}, **req))
    dones, tokens = {}, []
    while len(dones) < req["n"]:
        m = _next_reply(s, req["id"], time.time() + 60, 60)
        check(m["type"] in ("token", "done"), "n: %s" % m)
        if m["type"] == "token":
            tokens.append(m)
        else:
            check(m["index"] not in dones, "index %d twice" % m["index"])
            dones[m["index"]] = m
    return dones, tokens


def test():
    require_gateway()
    p = Pipeline("gwn", max_concurrency=8, max_queue=16, extra={"coordinator": {"spec_k_max": 8}})
    p.make_pair()
    url = p.enable_gateway()
    p.start_all()
    p.start("gateway")
    p.wait_http()
    s = p.client()
    base = {"prompt_ids": PROMPT, "max_tokens": 12, "temperature": 1.0, "spec_k": 3, "draft": "model"}
    singles = [generate(s, dict(base, id="one%d" % i, seed=77 + i))[0]["ids"] for i in range(N)]
    check(len(set(map(tuple, singles))) > 1, "the seeds give one output: the test would prove nothing")

    dones, tokens = native_n(s, dict(base, id="nat", seed=77, n=N, stream=True))
    for i in range(N):
        check(dones[i]["ids"] == singles[i], "choice %d: %s != seed %d alone %s" % (i, dones[i]["ids"], 77 + i,
                                                                                    singles[i]))
        streamed = sum((t["ids"] for t in tokens if t["index"] == i), [])
        check(streamed == dones[i]["ids"], "choice %d: token events do not add up" % i)

    # tandem-client --n: each choice's summary (with its index), in index order
    cli = [binary("client"), "--endpoint", p.endpoint, "--timeout-ms", "60000", "--ids", ",".join(map(str, PROMPT)),
           "--max-tokens", "12", "--temperature", "1", "--spec-k", "3", "--draft-source", "model", "--seed", "77"]
    r = subprocess.run(cli + ["--n", str(N), "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=120)
    check(r.returncode == 0, "tandem-client --n: %d %s" % (r.returncode, r.stderr))
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    check([x["index"] for x in lines] == list(range(N)), "tandem-client --n indexes: %s" % r.stdout)
    check([x["ids"] for x in lines] == singles, "tandem-client --n ids differ from the seeds alone")
    r = subprocess.run(cli + ["--n", "2", "--stream"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=60)
    check(r.returncode == 2 and "--stream" in r.stderr, "--n 2 --stream: %d %s" % (r.returncode, r.stderr))

    greedy, _ = generate(s, dict(base, id="g1", temperature=0))
    dones, _ = native_n(s, dict(base, id="gn", temperature=0, n=3))
    check(all(dones[i]["ids"] == greedy["ids"] for i in range(3)), "greedy choices differ from target-only")
    # The prompt is computed once: the later choices wait for the first's
    # prefill and map its blocks from the target's prefix cache.
    long_prompt = [(7 * i + 3) % 500 + 1 for i in range(70)]
    dones, _ = native_n(s, dict(base, id="pc", prompt_ids=long_prompt, n=3, seed=9))
    check(dones[0]["usage"]["cached_prompt_tokens"] == 0, "first choice: %s" % dones[0]["usage"])
    check(all(dones[i]["usage"]["cached_prompt_tokens"] >= 64 for i in (1, 2)),
          "later choices computed the prompt again: %s" % [dones[i]["usage"] for i in range(3)])

    comp = {"model": "tiny", "prompt": PROMPT, "max_tokens": 12, "temperature": 1.0, "spec_k": 3, "draft": "model",
            "seed": 77, "n": N}
    status, _, body = http("POST", url + "/v1/completions", comp)
    check(status == 200, "http n: %d %s" % (status, body[:300]))
    r = json.loads(body)
    check([c["index"] for c in r["choices"]] == list(range(N)), "choices: %s" % r["choices"])
    check(r["usage"]["completion_tokens"] == sum(len(x) for x in singles), "usage: %s" % r["usage"])
    for i in range(N):
        d, _ = generate(s, {"id": "t%d" % i, "prompt_ids": PROMPT, "max_tokens": 12, "temperature": 1.0,
                            "spec_k": 3, "draft": "model", "seed": 77 + i})
        check(r["choices"][i]["text"] == d["text"], "http choice %d: %r != %r" % (i, r["choices"][i]["text"], d["text"]))

    status, _, body = http("POST", url + "/v1/chat/completions",
                           {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10,
                            "temperature": 1.0, "seed": 5, "n": 3, "stream": True,
                            "stream_options": {"include_usage": True}})
    events = sse_events(body)
    check(events[-1] == "[DONE]" and events.count("[DONE]") == 1, "one [DONE] at the end: %s" % events[-3:])
    chunks = [json.loads(e) for e in events[:-1]]
    finishes = [c["choices"][0]["index"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    check(sorted(finishes) == [0, 1, 2], "a finish_reason per choice: %s" % finishes)
    check(chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0, "usage chunk last")
    status, _, body = http("POST", url + "/v1/completions", dict(comp, n=17))
    check(status == 400 and json.loads(body)["error"]["param"] == "n", "n 17: %d %s" % (status, body))


if __name__ == "__main__":
    main(test)
