#!/usr/bin/python3
"""OpenAI tools through the gateway, on the trained pair (it has a Llama 3
tokenizer, so the 3.1/3.2 tool format renders as it would for Llama):

1. A forced call ("required" over two tools, and a named function), greedy:
   the output always parses as a call of a declared tool whose arguments
   validate against its parameters (the grammar engine), and the ids with
   drafts from the model (K 4), n-grams, the suffix cache and "auto" equal
   target-only decoding (draft "none") through the same three processes.
2. Streamed, the call arrives as delta.tool_calls and finish_reason
   "tool_calls", the same call as the whole response's; with tool_choice
   auto the stream (held while it might be a call) is the whole response.
3. The official npm `openai` client gets tool_calls (streamed and not) and
   sends the assistant's call and a `role: tool` result back (a second and a
   third turn, tool_choice auto and none).
4. The prompt of a conversation with tools, a call and a tool result is the
   template's: the test renders the Llama 3.2 template's tool rules itself
   (json.dumps is HF's tojson), tokenizes that text, and the gateway's
   request gives the output and the logprobs (bit for bit) of those
   prompt_ids: the same prompt.
5. Bad tool definitions and choices are 400s naming what was wrong.
Prints the tokens/s of a 3-turn tool chat with draft auto and target-only."""
import json
import os
import subprocess

from tandem_e2e import (Pipeline, binary, check, generate, http, main, require_gateway, run_openai_client, skip,
                        sse_events)

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]}}}
CLOCK = {"type": "function", "function": {
    "name": "get_time", "description": "The time in a time zone.",
    "parameters": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET", "PST"]}},
                   "required": ["zone"]}}}
TOOLS = [WEATHER, CLOCK]
QUESTION = "What is the weather like in Paris today?"
MAX_TOKENS = 700  # the grammar lets 16 bytes of whitespace between tokens, which this model fills
SOURCES = (("model", 4), ("ngram", 4), ("suffix", 4), ("auto", None))


def chat(url, body):
    status, _, raw = http("POST", url + "/v1/chat/completions", body, timeout_s=300)
    check(status == 200, "chat: %d %s" % (status, raw[:400]))
    return json.loads(raw)


def check_call(name, resp, allowed):
    """The choice is one call of a tool in allowed, its arguments valid."""
    choice = resp["choices"][0]
    check(choice["finish_reason"] == "tool_calls", "%s: finish_reason %s: %s" % (name, choice["finish_reason"],
                                                                              choice))
    msg = choice["message"]
    check(msg["content"] is None and len(msg["tool_calls"]) == 1, "%s: message %s" % (name, msg))
    call = msg["tool_calls"][0]
    check(call["type"] == "function" and call["id"].startswith("call_"), "%s: call %s" % (name, call))
    fn = call["function"]
    check(fn["name"] in allowed, "%s: called %s, not one of %s" % (name, fn["name"], allowed))
    args = json.loads(fn["arguments"])
    if fn["name"] == "get_weather":
        check(isinstance(args.get("city"), str) and len(args["city"]) <= 12 and
              args.get("unit") in ("celsius", "fahrenheit") and len(args) == 2, "%s: arguments %s" % (name, args))
    else:
        check(args.get("zone") in ("UTC", "CET", "PST") and len(args) == 1, "%s: arguments %s" % (name, args))
    return call


def forced(url, base):
    """Forced calls: they parse; speculation changes no id."""
    out = {}
    for label, choice, allowed in (("required", "required", ["get_weather", "get_time"]),
                                   ("named", {"type": "function", "function": {"name": "get_time"}}, ["get_time"])):
        body = dict(base, tool_choice=choice)
        ref = chat(url, dict(body, draft="none"))
        call = check_call(label + " target-only", ref, allowed)
        for src, k in SOURCES:
            extra = {"draft": src}
            if k:
                extra["spec_k"] = k
            got = chat(url, dict(body, **extra))
            check(got["tandem"]["ids"] == ref["tandem"]["ids"], "%s, draft %s K %s: ids %s != target-only %s" %
                  (label, src, k, got["tandem"]["ids"], ref["tandem"]["ids"]))
            check(got["choices"][0]["message"]["tool_calls"][0]["function"] == call["function"],
                  "%s, draft %s: %s" % (label, src, got["choices"][0]["message"]))
        # streamed: the role chunk, one delta.tool_calls chunk, finish_reason tool_calls
        status, _, raw = http("POST", url + "/v1/chat/completions", dict(body, stream=True), timeout_s=300)
        check(status == 200, "%s stream: %d" % (label, status))
        events = sse_events(raw)
        check(events[-1] == "[DONE]", "%s stream: no [DONE]: %s" % (label, events[-3:]))
        chunks = [json.loads(e) for e in events[:-1]]
        deltas = [c["choices"][0]["delta"] for c in chunks]
        calls = [d["tool_calls"] for d in deltas if "tool_calls" in d]
        check(len(calls) == 1 and calls[0][0]["function"] == call["function"] and calls[0][0]["index"] == 0,
              "%s stream: tool_calls deltas %s, want %s" % (label, calls, call))
        check(not any(d.get("content") for d in deltas), "%s stream: content beside the call: %s" % (label, deltas))
        check(chunks[-1]["choices"][0]["finish_reason"] == "tool_calls", "%s stream: last %s" % (label, chunks[-1]))
        ids = [i for c in chunks for i in c.get("tandem", {}).get("ids", [])]
        check(ids == ref["tandem"]["ids"], "%s stream: ids %s != %s" % (label, ids, ref["tandem"]["ids"]))
        out[label] = call
    return out


def auto_streams_as_whole(url, base):
    """tool_choice auto, streamed: the chunks held while the text might be a
    call go out in order, so the stream is the whole response (text, ids,
    finish_reason), whichever it turned out to be."""
    poem = [{"role": "user", "content": "Write a poem about the sea."}]
    # the third opens with "{" (json_object), so it is held to its end, then sent as content
    for msgs, extra in ((base["messages"], {}), (poem, {}), (poem, {"response_format": {"type": "json_object"}})):
        body = dict(base, messages=msgs, tool_choice="auto", max_tokens=60, **extra)
        whole = chat(url, body)
        status, _, raw = http("POST", url + "/v1/chat/completions", dict(body, stream=True), timeout_s=300)
        check(status == 200, "auto stream: %d" % status)
        chunks = [json.loads(e) for e in sse_events(raw)[:-1]]
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
        ids = [i for c in chunks for i in c.get("tandem", {}).get("ids", [])]
        calls = [d for c in chunks for d in c["choices"][0]["delta"].get("tool_calls", [])]
        w = whole["choices"][0]
        check(chunks[-1]["choices"][0]["finish_reason"] == w["finish_reason"], "auto stream finish: %s vs %s" %
              (chunks[-1]["choices"][0], w))
        if w["message"].get("tool_calls"):
            check([c["function"] for c in calls] == [c["function"] for c in w["message"]["tool_calls"]],
                  "auto stream calls %s vs %s" % (calls, w["message"]))
        else:
            check(not extra or w["message"]["content"].startswith("{"), "json_object: %r" % w["message"]["content"])
            check(text == w["message"]["content"] and ids == whole["tandem"]["ids"] and not calls,
                  "auto stream: %r %s vs whole %r %s" % (text, ids, w["message"]["content"], whole["tandem"]["ids"]))


def refusals(url, base):
    cases = [
        (dict(base, tools=[{"type": "function", "function": {"name": "bad name"}}]), "tools[0]", "function.name"),
        (dict(base, tools=[{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}}}}]), "tools[0]",
         "tools[0].function.parameters.properties.n: unsupported keyword 'minimum'"),
        (dict(base, tools=[WEATHER, WEATHER]), "tools[1]", "twice"),
        (dict(base, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice",
         "nope"),
        (dict(base, tool_choice="required"), "tool_choice", "only with tools"),
        (dict(base, messages=[{"role": "assistant", "tool_calls": [{"id": "a", "type": "function", "function": {
            "name": "get_time", "arguments": "{zone: UTC}"}}]}]), "messages[0].tool_calls", "arguments"),
    ]
    for body, param, says in cases:
        status, _, raw = http("POST", url + "/v1/chat/completions", body)
        err = json.loads(raw).get("error", {})
        check(status == 400 and err.get("param") == param and says in err.get("message", ""),
              "refusal %s: %d %s" % (param, status, raw[:300]))


NODE_SCRIPT = r"""
const OpenAI = require(process.env.OPENAI_MODULE);
const client = new OpenAI({ baseURL: process.env.BASE_URL + "/v1", apiKey: "none" });
const tools = %(tools)s;
const question = [{ role: "user", content: %(question)s }];
(async () => {
  const model = (await client.models.list()).data[0].id;
  const common = { model, temperature: 0, max_tokens: %(max_tokens)d, tools };
  const out = {};
  const first = await client.chat.completions.create({ ...common, messages: question, tool_choice: "required" });
  out.first = first.choices[0];
  // streamed: the call put together from its deltas, as clients do
  const stream = await client.chat.completions.create({ ...common, messages: question, tool_choice: "required",
                                                        stream: true });
  const calls = [];
  let finish = null;
  for await (const chunk of stream) {
    const c = chunk.choices[0];
    if (c.finish_reason) finish = c.finish_reason;
    for (const d of c.delta.tool_calls || []) {
      if (!calls[d.index]) calls[d.index] = { id: d.id, type: d.type, function: { name: "", arguments: "" } };
      if (d.function && d.function.name) calls[d.index].function.name += d.function.name;
      if (d.function && d.function.arguments) calls[d.index].function.arguments += d.function.arguments;
    }
  }
  out.stream = { calls, finish };
  // the call and its result sent back: role tool
  const call = first.choices[0].message.tool_calls[0];
  const turn2 = [...question, first.choices[0].message,
                 { role: "tool", tool_call_id: call.id, content: "18 degrees and sunny" }];
  const second = await client.chat.completions.create({ ...common, messages: turn2 });
  out.second = second;
  const turn3 = [...turn2, { role: "assistant", content: "It is sunny." }, { role: "user", content: "And tomorrow?" }];
  out.third = await client.chat.completions.create({ ...common, messages: turn3, tool_choice: "none" });
  console.log(JSON.stringify(out));
})().catch((e) => { console.error(e); process.exit(1); });
"""


def node_client(url, want):
    script = NODE_SCRIPT % {"tools": json.dumps(TOOLS), "question": json.dumps(QUESTION), "max_tokens": MAX_TOKENS}
    out = run_openai_client(script, url)
    if out is None:
        skip("npm package openai is not installed (scripts/install-deps.sh)")
    first = out["first"]
    check(first["finish_reason"] == "tool_calls" and
          first["message"]["tool_calls"][0]["function"] == want["function"],
          "openai client: %s, want %s" % (first, want))
    s = out["stream"]
    check(s["finish"] == "tool_calls" and len(s["calls"]) == 1 and s["calls"][0]["function"] == want["function"] and
          s["calls"][0]["id"].startswith("call_"), "openai client stream: %s" % s)
    for turn in ("second", "third"):
        c = out[turn]["choices"][0]
        check(c["finish_reason"] in ("stop", "length", "tool_calls"), "%s turn: %s" % (turn, c))
        check(out[turn]["usage"]["prompt_tokens"] > out["first"].get("index", 0), "%s turn usage" % turn)
    c = out["third"]["choices"][0]
    check(isinstance(c["message"]["content"], str) and "tool_calls" not in c["message"] and
          c["finish_reason"] != "tool_calls", "tool_choice none: %s" % c)
    check(out["third"]["usage"]["prompt_tokens"] > out["second"]["usage"]["prompt_tokens"],
          "the third turn's prompt holds the second's: %s %s" % (out["third"]["usage"], out["second"]["usage"]))


def three_turns(url, draft):
    """A 3-turn tool chat (forced call, its result, a follow-up): decode tokens/s."""
    msgs = [{"role": "user", "content": QUESTION}]
    base = {"temperature": 0, "max_tokens": MAX_TOKENS, "tools": TOOLS, "draft": draft}
    tokens, ms, ids = 0, 0.0, []
    r = chat(url, dict(base, messages=msgs, tool_choice="required"))
    for turn in range(3):
        tokens += r["usage"]["completion_tokens"]
        ms += r["tandem"]["timing"]["decode_ms"] + r["tandem"]["timing"]["prefill_ms"]
        ids.append(r["tandem"]["ids"])
        m = r["choices"][0]["message"]
        msgs.append({k: v for k, v in m.items() if k in ("role", "content", "tool_calls")})
        if m.get("tool_calls"):
            msgs.append({"role": "tool", "tool_call_id": m["tool_calls"][0]["id"], "content": "18 degrees, sunny"})
        else:
            msgs.append({"role": "user", "content": "Thanks. And in Rome?"})
        if turn < 2:
            r = chat(url, dict(base, messages=msgs))
    return tokens, ms, ids


def render_llama32(messages, tools, date="26 Jul 2024"):
    """The Llama 3.2 Instruct template's text (tools_in_user_message, as HF
    renders it: tojson is json.dumps(ensure_ascii=False), trim is strip)."""
    dumps = lambda v, indent=None: json.dumps(v, ensure_ascii=False, indent=indent)
    system = ""
    if messages[0]["role"] == "system":
        system, messages = messages[0]["content"].strip(), messages[1:]
    out = "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
    out += "Environment: ipython\n" if tools is not None else ""
    out += "Cutting Knowledge Date: December 2023\nToday Date: " + date + "\n\n" + system + "<|eot_id|>"
    if tools is not None:
        first, messages = messages[0]["content"].strip(), messages[1:]
        out += "<|start_header_id|>user<|end_header_id|>\n\n"
        out += ("Given the following functions, please respond with a JSON for a function call with its proper "
                "arguments that best answers the given prompt.\n\n")
        out += 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.'
        out += "Do not use variables.\n\n"
        for t in tools:
            out += dumps(t, 4) + "\n\n"
        out += first + "<|eot_id|>"
    for m in messages:
        if m.get("tool_calls"):
            fn = m["tool_calls"][0]["function"]
            out += ('<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "' + fn["name"] + '", "parameters": ' +
                    dumps(json.loads(fn["arguments"])) + "}<|eot_id|>")
        elif m["role"] in ("tool", "ipython"):
            out += "<|start_header_id|>ipython<|end_header_id|>\n\n" + dumps(m["content"]) + "<|eot_id|>"
        else:
            out += "<|start_header_id|>" + m["role"] + "<|end_header_id|>\n\n" + m["content"].strip() + "<|eot_id|>"
    return out + "<|start_header_id|>assistant<|end_header_id|>\n\n"


def prompt_is_the_templates(p, url, call):
    """The gateway's prompt for a tool conversation is the template's ids."""
    msgs = [{"role": "system", "content": " You help. "}, {"role": "user", "content": QUESTION},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": "18 \u00b0C\n\"sunny\""}]
    tok = os.path.join(p.config["target_worker"]["model"], "tokenizer.json")
    r = subprocess.run([binary("tokenize"), "--tokenizer", tok, "--parse-special"], input=render_llama32(msgs, TOOLS),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    check(r.returncode == 0, "tandem-tokenize: %s" % r.stderr)
    ids = json.loads(r.stdout)
    got = chat(url, {"messages": msgs, "tools": TOOLS, "max_tokens": 40, "temperature": 0, "draft": "none",
                     "logprobs": True})
    check(got["usage"]["prompt_tokens"] == len(ids), "prompt tokens %d != the template's %d" %
          (got["usage"]["prompt_tokens"], len(ids)))
    done, _ = generate(p.client(), {"id": "tmpl", "prompt_ids": ids, "max_tokens": 40, "temperature": 0,
                                    "draft": "none", "logprobs": 0})
    check(done.get("ids") == got["tandem"]["ids"], "the template's prompt_ids give %s, the gateway's %s" %
          (done.get("ids"), got["tandem"]["ids"]))
    # the same ids could follow a slightly different prompt; the logits could not (bit for bit)
    want = [e["logprob"] for e in done["logprobs"]]
    have = [e["logprob"] for e in got["choices"][0]["logprobs"]["content"]]
    check(have == want, "logprobs after the gateway's prompt %s != after the template's %s" % (have[:4], want[:4]))


def test():
    require_gateway()
    p = Pipeline("tools", max_concurrency=4, max_queue=16, extra={"coordinator": {"spec_k_max": 8}})
    p.use_pair("trained")
    url = p.enable_gateway()
    p.start_all()
    p.start("gateway")
    p.wait_http()
    base = {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": MAX_TOKENS,
            "temperature": 0, "tools": TOOLS}
    calls = forced(url, base)
    prompt_is_the_templates(p, url, calls["required"])
    auto_streams_as_whole(url, base)
    refusals(url, dict(base, tools=None))
    node_client(url, calls["required"])
    t_ref = three_turns(url, "none")
    t_auto = three_turns(url, "auto")
    check(t_auto[2] == t_ref[2], "3-turn tool chat: draft auto ids %s != target-only %s" % (t_auto[2], t_ref[2]))
    for label, (tokens, ms, _) in (("target-only", t_ref), ("draft auto", t_auto)):
        print("3-turn tool chat, %s: %d tokens in %.1f ms of prefill+decode: %.1f tokens/s" %
              (label, tokens, ms, tokens / (ms / 1000.0) if ms > 0 else 0.0))
    print("ok: forced calls parse and equal target-only; stream; openai client; role tool; refusals")


if __name__ == "__main__":
    main(test)
