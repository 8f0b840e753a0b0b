#!/usr/bin/python3
"""Structured output (the request's "grammar", the gateway's response_format)
through the three processes, on the trained pair (it has a tokenizer; the
grammar's masks are over its bytes).

1. Greedy: for a JSON schema, json_object and a GBNF grammar, output with
   drafts from the model (K 1, 4, 8), n-grams and the suffix cache (K 4, 8)
   equals constrained target-only decoding by tandem-generate (no draft),
   ids for ids; the suffix cache then holds the same answers, so its drafts
   are long and cut by the grammar where they leave it.
2. Batched: the constrained requests sent beside unconstrained ones (a
   slot's grammar must never leak into its neighbours or into the next
   request in the slot) give the same ids as alone.
3. The output parses as JSON and validates against the schema
   (python3-jsonschema: Debian's, not the project's code).
4. Errors: an unsupported keyword is invalid_request naming it; through the
   gateway, response_format with one is a 400 naming the keyword, and a
   json_schema chat completion's content validates."""
import json
import os
import tempfile

from tandem_e2e import (Pipeline, check, generate, generate_concurrently, http, main, require_gateway, run,
                        binary, skip)

try:
    import jsonschema
except ImportError:  # pragma: no cover
    skip("python3-jsonschema is not installed")

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer"},
        "kind": {"enum": ["cat", "dog", 3, None]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "kind"],
}
GBNF = 'root ::= "(" item ("," ws item){0,3} ")"\nitem ::= [a-z]{1,6} | [0-9]{1,3}\nws ::= " "?\n'
PROMPTS = ["Write a Python function named read_config.", "Give me a quote about love."]
MAX_TOKENS = 700
SOURCES = (("model", 1), ("model", 4), ("model", 8), ("ngram", 4), ("suffix", 4), ("suffix", 8))


def test():
    require_gateway()
    p = Pipeline("grammar", max_concurrency=8, max_queue=32, extra={"coordinator": {"spec_k_max": 8}})
    p.use_pair("trained")
    base_url = p.enable_gateway()
    p.start_all()
    p.start("gateway")
    p.wait_http()
    s = p.client()
    tmp = tempfile.mkdtemp(dir=p.dir)
    schema_file = os.path.join(tmp, "schema.json")
    gbnf_file = os.path.join(tmp, "g.gbnf")
    with open(schema_file, "w") as f:
        json.dump(SCHEMA, f)
    with open(gbnf_file, "w") as f:
        f.write(GBNF)
    object_file = os.path.join(tmp, "object.json")
    with open(object_file, "w") as f:
        json.dump({"type": "object"}, f)  # tandem-generate's json_object: the same language
    # (wire form, tandem-generate's flags, max_tokens, whether it must finish): any object's
    # strings are unbounded (this model fills them with spaces), the others are not
    grammars = {
        "schema": ({"type": "json_schema", "schema": SCHEMA}, ["--json-schema", schema_file], MAX_TOKENS, True),
        "object": ({"type": "json_object"}, ["--json-schema", object_file], 160, False),
        "gbnf": ({"type": "gbnf", "text": GBNF}, ["--grammar-file", gbnf_file], MAX_TOKENS, True),
    }
    target = p.config["target_worker"]["model"]

    expected = {}
    for gname, (grammar, flags, max_tokens, finishes) in grammars.items():
        for i, prompt in enumerate(PROMPTS):
            ref = json.loads(run([binary("generate"), "--model", target, "--prompt", prompt, "--max-tokens",
                                  str(max_tokens), "--temperature", "0", "--threads", "1", "--json"] + flags))
            check(ref["finish_reason"] == "stop" or not finishes, "%s %d: the reference did not finish: %s" %
                  (gname, i, ref))
            if ref["finish_reason"] != "stop":
                check(ref["text"].lstrip().startswith("{"), "object: %r" % ref["text"])
            elif gname == "gbnf":
                check(ref["text"].startswith("(") and ref["text"].endswith(")"), "gbnf: %r" % ref["text"])
            else:
                value = json.loads(ref["text"])
                jsonschema.validate(value, SCHEMA if gname == "schema" else {"type": "object"})
            base = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "grammar": grammar}
            alone, _ = generate(s, dict(base, id="t%s%d" % (gname, i), draft="none"))
            check(alone.get("ids") == ref["ids"], "%s %d: target-only through the pipeline %s != tandem-generate "
                  "%s" % (gname, i, alone.get("ids"), ref["ids"]))
            expected[(gname, i)] = (base, ref["ids"])
            for src, k in SOURCES:
                done, _ = generate(s, dict(base, id="s%s%d%s%d" % (gname, i, src, k), draft=src, spec_k=k))
                check(done.get("ids") == ref["ids"], "%s, prompt %d, draft %s K %d: %s != target-only %s" %
                      (gname, i, src, k, done.get("ids"), ref["ids"]))
                check(done["finish_reason"] == ref["finish_reason"], "%s: %s" % (gname, done))
    st = p.stats()["spec"]
    print("spec after the greedy runs: %s" % json.dumps({k: st[k] for k in sorted(st) if "accept" in k}))

    # Batched beside unconstrained requests, drafts from every source.
    plain = {}
    for i, prompt in enumerate(PROMPTS):
        done, _ = generate(s, {"id": "p%d" % i, "prompt": prompt, "max_tokens": 40, "temperature": 0,
                               "draft": "none"})
        plain[i] = done["ids"]
    reqs = []
    for j, ((gname, i), (base, _)) in enumerate(sorted(expected.items())):
        src, k = SOURCES[j % len(SOURCES)]
        reqs.append(dict(base, id="b%s%d" % (gname, i), draft=src, spec_k=k))
        reqs.append({"id": "n%d_%d" % (j, i), "prompt": PROMPTS[i], "max_tokens": 40, "temperature": 0,
                     "draft": "model", "spec_k": 3})
    for lo in range(0, len(reqs), 8):
        for req, done in zip(reqs[lo:lo + 8], generate_concurrently(p, reqs[lo:lo + 8])):
            if req["id"][0] == "b":
                want = expected[(req["id"][1:-1], int(req["id"][-1]))][1]
            else:
                want = plain[int(req["id"].split("_")[1])]
            check(done.get("ids") == want, "batched %s: %s != %s" % (req["id"], done.get("ids"), want))

    # Errors, named.
    bad = dict(SCHEMA, properties=dict(SCHEMA["properties"], age={"type": "integer", "minimum": 0}))
    err, _ = generate(s, {"id": "bad", "prompt": "x", "grammar": {"type": "json_schema", "schema": bad}})
    check(err["type"] == "error" and err["code"] == "invalid_request" and "minimum" in err["message"] and
          err["message"].startswith("grammar.schema.properties.age"), "unsupported keyword: %s" % err)
    err, _ = generate(s, {"id": "bad2", "prompt": "x", "grammar": {"type": "gbnf", "text": "root ::= \"a"}})
    check(err["type"] == "error" and err["message"].startswith("grammar"), "bad gbnf: %s" % err)
    err, _ = generate(s, {"id": "bad3", "prompt": "x", "grammar": {"type": "regex"}})
    check(err["type"] == "error" and err["message"].startswith("grammar.type"), "bad type: %s" % err)

    chat = {"messages": [{"role": "user", "content": PROMPTS[1]}], "max_tokens": MAX_TOKENS, "temperature": 0}
    status, _, body = http("POST", base_url + "/v1/chat/completions", dict(chat, response_format={
        "type": "json_schema", "json_schema": {"name": "pet", "strict": True, "schema": bad}}))
    answer = json.loads(body)
    check(status == 400 and "minimum" in answer["error"]["message"] and
          "response_format.json_schema.schema.properties.age" in answer["error"]["message"],
          "gateway, unsupported keyword: %d %s" % (status, body[:300]))
    status, _, body = http("POST", base_url + "/v1/chat/completions", dict(chat, response_format={
        "type": "json_schema", "json_schema": {"name": "pet", "strict": True, "schema": SCHEMA}}))
    check(status == 200, "gateway json_schema: %d %s" % (status, body[:300]))
    content = json.loads(body)["choices"][0]["message"]["content"]
    jsonschema.validate(json.loads(content), SCHEMA)
    status, _, body = http("POST", base_url + "/v1/chat/completions", dict(chat, response_format={
        "type": "json_object"}))
    check(status == 200 and isinstance(json.loads(json.loads(body)["choices"][0]["message"]["content"]), dict),
          "gateway json_object: %d %s" % (status, body[:300]))


if __name__ == "__main__":
    main(test)
