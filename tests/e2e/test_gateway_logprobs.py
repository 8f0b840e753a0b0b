#!/usr/bin/python3
"""logprobs over HTTP (tiny pair, speculative, greedy): chat's
choices[].logprobs.content (token, logprob, bytes, top_logprobs) and
completions' legacy layout (tokens, token_logprobs, top_logprobs,
text_offset), streamed and not, through curl-like requests and OpenAI's
official Node client (npm `openai`), carry exactly the entries the native
protocol reports for the same request; top_logprobs without logprobs and a
count beyond 20 are 400s naming the field."""
import json

from tandem_e2e import (Pipeline, check, generate, http, main, require_gateway, run_openai_client, skip,
                        sse_events)

PROMPT = "Once upon a time"
CHAT = "Hello there, who are you?"
N = 16
TOP = 3


def chat_view(entries):
    """The native entries as chat's content list."""
    return [{"token": e["token"], "logprob": e["logprob"], "bytes": e["bytes"],
             "top_logprobs": [{"token": t["token"], "logprob": t["logprob"], "bytes": t["bytes"]}
                              for t in e["top_logprobs"]]} for e in entries]


def legacy_view(entries):
    """The native entries in completions' legacy layout."""
    tops = []
    for e in entries:
        d = {}
        for t in e["top_logprobs"]:
            d.setdefault(t["token"], t["logprob"])
        tops.append(d)
    return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": tops, "text_offset": [e["text_offset"] for e in entries]}


def merge_legacy(parts):
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for p in parts:
        for k in out:
            out[k] += p[k]
    return out


def post(url, path, body):
    status, _, data = http("POST", url + path, body)
    return status, data


NODE_SCRIPT = r"""
const OpenAI = require(process.env.OPENAI_MODULE);
const client = new OpenAI({ baseURL: process.env.BASE_URL + "/v1", apiKey: "unused", maxRetries: 0 });
(async () => {
  const out = {};
  const common = { model: "tiny", temperature: 0, max_tokens: %(n)d, spec_k: 3 };
  out.chat = await client.chat.completions.create({ ...common, logprobs: true, top_logprobs: %(top)d,
                                                    messages: [{ role: "user", content: %(chat)s }] });
  out.comp = await client.completions.create({ ...common, logprobs: %(top)d, prompt: %(prompt)s });
  const s = await client.chat.completions.create({ ...common, logprobs: true, top_logprobs: %(top)d, stream: true,
                                                   messages: [{ role: "user", content: %(chat)s }] });
  out.chat_stream = [];
  for await (const c of s) out.chat_stream.push(c);
  console.log(JSON.stringify(out));
})().catch((e) => { console.error(e); process.exit(1); });
"""


def run_node(url):
    script = NODE_SCRIPT % {"n": N, "top": TOP, "chat": json.dumps(CHAT), "prompt": json.dumps(PROMPT)}
    return run_openai_client(script, url)


def test():
    require_gateway()
    p = Pipeline("gwlogprobs")
    p.make_pair()
    url = p.enable_gateway()
    p.start_all()
    p.start("gateway")
    p.wait_http()
    s = p.client()
    messages = [{"role": "user", "content": CHAT}]
    native_c, _ = generate(s, {"id": "c", "messages": messages, "max_tokens": N, "temperature": 0, "logprobs": TOP,
                               "draft": "none"})
    native_p, _ = generate(s, {"id": "p", "prompt": PROMPT, "max_tokens": N, "temperature": 0, "logprobs": TOP,
                               "draft": "none"})
    check(native_c["type"] == "done" and native_p["type"] == "done", "native: %s %s" % (native_c, native_p))
    want_chat, want_comp = chat_view(native_c["logprobs"]), legacy_view(native_p["logprobs"])

    chat = {"model": "tiny", "messages": messages, "max_tokens": N, "temperature": 0, "logprobs": True,
            "top_logprobs": TOP, "spec_k": 3}
    status, body = post(url, "/v1/chat/completions", chat)
    check(status == 200, "chat: %d %s" % (status, body[:300]))
    got = json.loads(body)["choices"][0]["logprobs"]
    check(got["content"] == want_chat, "chat logprobs differ from the native protocol's:\n%s\n%s" % (got, want_chat))
    status, body = post(url, "/v1/chat/completions", dict(chat, stream=True))
    chunks = [json.loads(e) for e in sse_events(body)[:-1]]
    streamed = sum(((c["choices"][0]["logprobs"] or {}).get("content", []) for c in chunks if c["choices"]), [])
    check(streamed == want_chat, "streamed chat logprobs differ")

    comp = {"model": "tiny", "prompt": PROMPT, "max_tokens": N, "temperature": 0, "logprobs": TOP, "spec_k": 4}
    status, body = post(url, "/v1/completions", comp)
    check(status == 200, "completion: %d %s" % (status, body[:300]))
    got = json.loads(body)["choices"][0]["logprobs"]
    check(got == want_comp, "completion logprobs differ:\n%s\n%s" % (got, want_comp))
    status, body = post(url, "/v1/completions", dict(comp, stream=True))
    chunks = [json.loads(e) for e in sse_events(body)[:-1]]
    parts = [c["choices"][0]["logprobs"] for c in chunks if c["choices"] and c["choices"][0]["logprobs"]]
    check(merge_legacy(parts) == want_comp, "streamed completion logprobs differ")

    # without logprobs: null, as before
    status, body = post(url, "/v1/completions", dict(comp, logprobs=None))
    check(json.loads(body)["choices"][0]["logprobs"] is None, "logprobs null when not asked for")
    for path, bad, param in (("/v1/chat/completions", dict(chat, logprobs=False), "top_logprobs"),
                             ("/v1/chat/completions", dict(chat, top_logprobs=21), "top_logprobs"),
                             ("/v1/completions", dict(comp, logprobs=21), "logprobs")):
        status, body = post(url, path, bad)
        err = json.loads(body)["error"]
        check(status == 400 and err["param"] == param, "%s %s: %d %s" % (path, param, status, err))

    out = run_node(url)
    if out is None:
        skip("npm package openai is not installed (scripts/install-deps.sh); the HTTP checks passed")
    check(out["chat"]["choices"][0]["logprobs"]["content"] == want_chat, "openai client chat logprobs differ")
    check(out["comp"]["choices"][0]["logprobs"] == want_comp, "openai client completion logprobs differ")
    streamed = sum(((c["choices"][0].get("logprobs") or {}).get("content", []) for c in out["chat_stream"]
                    if c["choices"]), [])
    check(streamed == want_chat, "openai client streamed chat logprobs differ")


if __name__ == "__main__":
    main(test)
