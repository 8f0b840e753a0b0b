#!/usr/bin/python3
"""The HTTP gateway speaks OpenAI's API: curl and OpenAI's official Node
client library (npm `openai`, from .deps/npm) get chat and text completions,
streamed and not, whose greedy text and token ids equal the target-only output
of tandem-generate, with the right usage counts; /v1/models lists the served
model."""
import json
import subprocess

from tandem_e2e import (Pipeline, binary, check, main, reference, require_gateway, run, run_openai_client, skip,
                        sse_events)

PROMPT = "Once upon a time"
CHAT = "Hello there, who are you?"
N = 24


def generate_ref(target, flag, text):
    return json.loads(run([binary("generate"), "--model", target, flag, text, "--max-tokens", str(N),
                           "--temperature", "0", "--threads", "1", "--json"]))


def curl(url, body, stream=False):
    cmd = ["curl", "-sS", "--max-time", "120", "-H", "Content-Type: application/json", "-d", json.dumps(body),
           "-w", "\n%{http_code}"]
    if stream:
        cmd.append("-N")
    r = subprocess.run(cmd + [url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=150)
    check(r.returncode == 0, "curl %s: %s" % (url, r.stderr))
    out, code = r.stdout.rsplit("\n", 1)
    check(code == "200", "curl %s: status %s: %s" % (url, code, out[:500]))
    return out


def finish_of(ref):
    """OpenAI's finish_reason for a reference: the EOS ends it early."""
    return "length" if ref["finish_reason"] == "length" else "stop"


def check_whole(name, resp, ref, chat):
    choice = resp["choices"][0]
    text = choice["message"]["content"] if chat else choice["text"]
    check(text == ref["text"], "%s: text %r != target-only %r" % (name, text, ref["text"]))
    check(resp["tandem"]["ids"] == ref["ids"], "%s: ids %s != %s" % (name, resp["tandem"]["ids"], ref["ids"]))
    check(choice["finish_reason"] == finish_of(ref), "%s: finish_reason %s" % (name, choice["finish_reason"]))
    u = dict(resp["usage"])
    n = len(ref["ids"])
    # the drafts the target accepted and rejected, in OpenAI's words for predicted tokens
    spec, details = resp["tandem"]["spec"], u.pop("completion_tokens_details", None)
    # the prompt tokens the prefix cache held (the tests send one prompt several times)
    cached = u.pop("prompt_tokens_details", {}).get("cached_tokens")
    check(isinstance(cached, int) and 0 <= cached < ref["prompt_tokens"],
          "%s: prompt_tokens_details.cached_tokens %r" % (name, cached))
    check(details == {"accepted_prediction_tokens": spec["accepted"],
                      "rejected_prediction_tokens": spec["drafted"] - spec["accepted"]},
          "%s: completion_tokens_details %s, spec %s" % (name, details, spec))
    check(u == {"prompt_tokens": ref["prompt_tokens"], "completion_tokens": n, "total_tokens": ref["prompt_tokens"] + n},
          "%s: usage %s (prompt %d)" % (name, u, ref["prompt_tokens"]))
    check(resp["object"] == ("chat.completion" if chat else "text_completion"), "%s: object %s" % (name, resp["object"]))
    check("acceptance_rate" in resp["tandem"]["spec"], "%s: no tandem.spec" % name)


def check_stream(name, events, ref, chat, usage):
    check(events and events[-1] == "[DONE]", "%s: does not end with [DONE]: %s" % (name, events[-3:]))
    chunks = [json.loads(e) for e in events[:-1]]
    text, ids, finish, seen_usage = "", [], None, None
    for c in chunks:
        check(c["object"] == ("chat.completion.chunk" if chat else "text_completion"), "%s: object %s" % (name, c))
        if c.get("usage"):
            seen_usage = c["usage"]
            continue
        ch = c["choices"][0]
        text += (ch["delta"].get("content") or "") if chat else ch["text"]
        ids += c.get("tandem", {}).get("ids", [])
        finish = ch["finish_reason"] or finish
    check(text == ref["text"], "%s: streamed text %r != %r" % (name, text, ref["text"]))
    check(ids == ref["ids"], "%s: streamed ids %s != %s" % (name, ids, ref["ids"]))
    check(finish == finish_of(ref), "%s: finish_reason %s" % (name, finish))
    if usage:
        n = len(ref["ids"])
        seen_usage = dict(seen_usage)
        details = seen_usage.pop("completion_tokens_details", {})
        cached = seen_usage.pop("prompt_tokens_details", {}).get("cached_tokens")
        check(isinstance(cached, int) and 0 <= cached < ref["prompt_tokens"],
              "%s: usage chunk cached_tokens %r" % (name, cached))
        check(set(details) == {"accepted_prediction_tokens", "rejected_prediction_tokens"},
              "%s: usage chunk details %s" % (name, details))
        check(seen_usage == {"prompt_tokens": ref["prompt_tokens"], "completion_tokens": n,
                             "total_tokens": ref["prompt_tokens"] + n}, "%s: usage chunk %s" % (name, seen_usage))
        check(chunks[-1]["choices"] == [], "%s: the usage chunk is not last" % name)


NODE_SCRIPT = r"""
const OpenAI = require(process.env.OPENAI_MODULE);
const client = new OpenAI({ baseURL: process.env.BASE_URL + "/v1", apiKey: "unused", maxRetries: 0 });
(async () => {
  const out = {};
  const common = { model: "tiny", temperature: 0, max_tokens: %(n)d };
  out.chat = await client.chat.completions.create({ ...common, messages: [{ role: "user", content: %(chat)s }] });
  out.comp = await client.completions.create({ ...common, prompt: %(prompt)s });
  const s1 = await client.chat.completions.create({ ...common, messages: [{ role: "user", content: %(chat)s }],
                                                    stream: true, stream_options: { include_usage: true } });
  out.chat_stream = [];
  for await (const c of s1) out.chat_stream.push(JSON.stringify(c));
  const s2 = await client.completions.create({ ...common, prompt: %(prompt)s, stream: true });
  out.comp_stream = [];
  for await (const c of s2) out.comp_stream.push(JSON.stringify(c));
  out.models = await client.models.list();
  try {
    await client.chat.completions.create({ ...common, n: 17, messages: [{ role: "user", content: "x" }] });
    out.n2 = "accepted";
  } catch (e) { out.n2 = { status: e.status, param: e.param, message: e.message }; }
  console.log(JSON.stringify(out));
})().catch((e) => { console.error(e); process.exit(1); });
"""


def run_node(base_url):
    script = NODE_SCRIPT % {"n": N, "chat": json.dumps(CHAT), "prompt": json.dumps(PROMPT)}
    out = run_openai_client(script, base_url)
    if out is None:
        skip("npm package openai is not installed (scripts/install-deps.sh)")
    return out


def test():
    require_gateway()
    p = Pipeline("gwopenai")
    draft, target = p.make_pair()
    url = p.enable_gateway()
    p.start_all()
    p.start("gateway")
    p.wait_http()
    ref_p = generate_ref(target, "--prompt", PROMPT)
    ref_c = generate_ref(target, "--chat", CHAT)
    check(len(ref_c["ids"]) > 5, "chat reference too short to test with: %s" % ref_c)

    comp = {"model": "tiny", "prompt": PROMPT, "max_tokens": N, "temperature": 0}
    chat = {"model": "tiny", "messages": [{"role": "user", "content": CHAT}], "max_tokens": N, "temperature": 0}
    check_whole("curl completion", json.loads(curl(url + "/v1/completions", comp)), ref_p, False)
    check_whole("curl chat", json.loads(curl(url + "/v1/chat/completions", chat)), ref_c, True)
    check_stream("curl completion stream",
                 sse_events(curl(url + "/v1/completions", dict(comp, stream=True), stream=True)), ref_p, False, False)
    check_stream("curl chat stream", sse_events(curl(url + "/v1/chat/completions",
                                                     dict(chat, stream=True, stream_options={"include_usage": True}),
                                                     stream=True)), ref_c, True, True)
    # max_completion_tokens, a token-id prompt, a stop string.
    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    ref_ids = reference(target, ids, N)
    r = json.loads(curl(url + "/v1/completions", dict(comp, prompt=ids)))
    check(r["tandem"]["ids"] == ref_ids["ids"] and r["usage"]["prompt_tokens"] == len(ids),
          "token-id prompt: %s != %s" % (r["tandem"]["ids"], ref_ids["ids"]))
    r = json.loads(curl(url + "/v1/chat/completions", dict(chat, max_tokens=2, max_completion_tokens=5)))
    check(r["usage"]["completion_tokens"] == 5, "max_completion_tokens wins over max_tokens: %s" % r["usage"])
    if len(ref_c["text"]) > 6:
        stop = ref_c["text"][3:6]
        r = json.loads(curl(url + "/v1/chat/completions", dict(chat, stop=stop)))
        check(r["choices"][0]["message"]["content"] == ref_c["text"][:ref_c["text"].index(stop)] and
              r["choices"][0]["finish_reason"] == "stop", "stop string: %s" % r["choices"][0])

    out = run_node(url)
    check_whole("openai chat", out["chat"], ref_c, True)
    check_whole("openai completion", out["comp"], ref_p, False)
    check_stream("openai chat stream", out["chat_stream"] + ["[DONE]"], ref_c, True, True)
    check_stream("openai completion stream", out["comp_stream"] + ["[DONE]"], ref_p, False, False)
    check([m["id"] for m in out["models"]["data"]] == ["tiny"], "models: %s" % out["models"])
    check(isinstance(out["n2"], dict) and out["n2"]["status"] == 400 and out["n2"]["param"] == "n",
          "n = 17 through the client: %s" % out["n2"])


if __name__ == "__main__":
    main(test)
