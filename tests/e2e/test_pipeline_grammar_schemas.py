#!/usr/bin/python3
"""Structured output through the three processes, checked by someone else's
validator: 200 random JSON schemas (objects nested up to three deep with
required and optional properties, enums and consts of every JSON type,
arrays with bounds, anyOf, type lists, strings with lengths or anchored
patterns, $defs and $ref) sent to one pipeline of the trained pair, eight
at a time, greedy and seeded sampled, drafts from the model, n-grams, the
suffix cache and auto; every output must end (EOS where the grammar
allows it), parse as JSON and validate against its schema with Python's
jsonschema (Debian's python3-jsonschema), not with the project's code.

The schemas are bounded (every string, array and object has a longest
spelling), so each output ends within max_tokens whatever the model
prefers: this model fills every gap the grammar allows with spaces.
TANDEM_GRAMMAR_SCHEMAS sets how many (default 200)."""
import json
import os
import random
import time

from tandem_e2e import Fail, Pipeline, check, generate_concurrently, main, skip

try:
    import jsonschema
except ImportError:  # pragma: no cover
    skip("python3-jsonschema is not installed")

from test_grammar_schemas import WORDS, rand_value

N = int(os.environ.get("TANDEM_GRAMMAR_SCHEMAS", "200"))
MAX_TOKENS = 2000
PATTERNS = ["^[a-z]{2,5}$", r"^\d{3}-\d{4}$", "^.{0,3}$", "^[^a-z]{1,3}$", "^(foo|bar)$", r"^[A-Z]\w{0,4}$"]
PROMPTS = ["Write a Python function named split_lines.", "Tell me something about the sea.",
           "Say something wise about time.", "Give me a quote about love."]
SOURCES = ("model", "ngram", "suffix", "auto", "none")


def small_value(rng):
    """An enum or const member whose JSON text is short."""
    while True:
        v = rand_value(rng)
        if len(json.dumps(v)) <= 40:
            return v


def rand_schema(rng, depth=0):
    kinds = ["string", "integer", "number", "boolean", "null", "enum", "const", "typelist"]
    if depth < 3:
        kinds += ["array", "object", "object", "anyOf"]
    k = rng.choice(kinds)
    if k == "string":
        s = {"type": "string"}
        if rng.random() < 0.4:
            s["pattern"] = rng.choice(PATTERNS)
        else:
            lo = rng.randrange(3)
            s["minLength"] = lo
            s["maxLength"] = lo + rng.randrange(8)
    elif k in ("integer", "number", "boolean", "null"):
        s = {"type": k}
    elif k == "enum":
        s = {"enum": [small_value(rng) for _ in range(1 + rng.randrange(4))]}
    elif k == "const":
        s = {"const": small_value(rng)}
    elif k == "typelist":
        s = {"type": rng.sample(["integer", "number", "boolean", "null"], 2)}
    elif k == "array":
        s = {"type": "array", "items": rand_schema(rng, depth + 1), "maxItems": rng.randrange(4)}
        if rng.random() < 0.4:
            s["minItems"] = rng.randrange(s["maxItems"] + 1)
    elif k == "object":
        names = rng.sample(WORDS + ["k%d" % i for i in range(8)], rng.randrange(5))
        s = {"type": "object", "properties": {n: rand_schema(rng, depth + 1) for n in names},
             "additionalProperties": False}
        if names and rng.random() < 0.8:
            s["required"] = [n for n in names if rng.random() < 0.5]
    else:
        s = {"anyOf": [rand_schema(rng, depth + 1) for _ in range(2 + rng.randrange(2))]}
    if rng.random() < 0.1:
        s["description"] = "random schema"
    return s


def rand_top(rng):
    if rng.random() < 0.15:
        return {"$defs": {"item": rand_schema(rng, 1)}, "type": "array", "items": {"$ref": "#/$defs/item"},
                "maxItems": 3}
    return rand_schema(rng)


def test():
    p = Pipeline("gschemas", max_concurrency=8, max_queue=32, extra={"coordinator": {"spec_k_max": 8}})
    p.use_pair("trained")
    p.start_all()
    rng = random.Random(60)
    schemas = [rand_top(rng) for _ in range(N)]
    reqs = []
    for i, schema in enumerate(schemas):
        req = {"id": "g%d" % i, "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": MAX_TOKENS,
               "draft": SOURCES[i % len(SOURCES)], "grammar": {"type": "json_schema", "schema": schema}}
        if i % 3 == 2:
            req.update(temperature=1.0, seed=i, spec_k=4)
        else:
            req.update(temperature=0, spec_k=1 + i % 8)
        reqs.append(req)
    t0 = time.time()
    tokens = 0
    for lo in range(0, N, 8):
        for req, done in zip(reqs[lo:lo + 8], generate_concurrently(p, reqs[lo:lo + 8])):
            i = int(req["id"][1:])
            what = "schema %d (%s, draft %s)\n%s" % (i, "greedy" if req["temperature"] == 0 else "sampled",
                                                   req["draft"], json.dumps(schemas[i]))
            check(done.get("type") == "done", "%s: %s" % (what, done))
            check(done["finish_reason"] == "stop", "%s: did not end: %s" % (what, done))
            try:
                value = json.loads(done["text"])
            except ValueError as e:
                raise Fail("%s: output is not JSON (%s): %r" % (what, e, done["text"]))
            errors = list(jsonschema.Draft202012Validator(schemas[i]).iter_errors(value))
            check(not errors, "%s: output %r does not validate: %s" % (what, done["text"],
                                                                      errors[0].message if errors else ""))
            tokens += len(done["ids"])
    st = p.stats()["spec"]
    print("%d schemas, %d tokens in %.1f s, all parse and validate; acceptance %.3f" %
          (N, tokens, time.time() - t0, st["acceptance_rate"]))


if __name__ == "__main__":
    main(test)
