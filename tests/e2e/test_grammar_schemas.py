#!/usr/bin/python3
"""Structured output checked by someone else's validator: 200 random JSON
schemas (nesting, enums and consts of every JSON type, arrays with bounds,
objects with optional and required properties, anyOf, type lists, strings
with lengths or patterns, $defs and $ref) are compiled by tandem-grammar, which draws
random outputs by walking the token mask over a real vocabulary (the trained
pair's tokenizer, and the first 40 schemas again over the 128,256-token
Llama 3 tokenizer from .deps when it is there); every output must parse as
JSON and validate against its schema with Python's jsonschema (Debian's
python3-jsonschema), not with the project's code. Then each unsupported
keyword is refused by the command line, naming it and its path."""
import json
import os
import random
import subprocess
import sys
import tempfile

from tandem_e2e import skip


try:
    import jsonschema
except ImportError:  # pragma: no cover
    skip("python3-jsonschema is not installed for %s (scripts/install-deps.sh)" % sys.executable)

SOURCE = os.environ.get("TANDEM_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.environ.get("TANDEM_BUILD_DIR", os.path.join(SOURCE, "build"))
TOOL = os.path.join(BUILD, "tools", "grammar", "tandem-grammar")
TRAINED = os.path.join(SOURCE, "models", "trained", "target", "tokenizer.json")
LLAMA3 = os.path.join(os.environ.get("TANDEM_DEPS_DIR", os.path.join(SOURCE, ".deps")), "npm",
                      "node_modules", "@lenml", "tokenizer-llama3_1", "models", "tokenizer.json")

WORDS = ["a", "b", "name", "x y", "quote\"d", "back\\slash", "tab\tbed", "new\nline", "caf\u00e9",
         "\u6771\u4eac", "emoji \U0001F600", "", "ctrl\u0001"]


class Fail(Exception):
    pass


def rand_value(rng, depth=0):
    k = rng.randrange(7 if depth < 2 else 5)
    if k == 0:
        return rng.choice(WORDS)
    if k == 1:
        return rng.randrange(-1000, 1000)
    if k == 2:
        return rng.choice([0.5, -2.25, 1e-3, 3.0e8, 123.456])
    if k == 3:
        return rng.choice([True, False])
    if k == 4:
        return None
    if k == 5:
        return [rand_value(rng, depth + 1) for _ in range(rng.randrange(3))]
    return {rng.choice(WORDS): rand_value(rng, depth + 1) for _ in range(rng.randrange(3))}


def annotate(rng, schema):
    if rng.random() < 0.15:
        schema["description"] = "random schema"
    if rng.random() < 0.05:
        schema["title"] = "t"
    return schema


PATTERNS = ["^[a-z]{2,5}$", r"^\d{3}-\d{4}$", "^(foo|bar)+$", "ab", "^[A-Z][a-z]*( [A-Z][a-z]*)*$",
            '^[^"\\\\]*$', "^.{0,3}$", r"^\w+@\w+\.com$", r"^(\+|-)?\d+(\.\d+)?$", 'x"y',
            "^[\\x00-\\x1f]?z$", "^\u00e9+$", r"^\s*$", "^[^a-z]{1,3}$", "(?:ab|cd)e?$", "^a.c"]


def rand_string(rng):
    s = {"type": "string"}
    if rng.random() < 0.5:
        s["pattern"] = rng.choice(PATTERNS)
    elif rng.random() < 0.4:
        lo = rng.randrange(4)
        s["minLength"] = lo
        if rng.random() < 0.7:
            s["maxLength"] = lo + rng.randrange(8)
    elif rng.random() < 0.3:
        s["maxLength"] = rng.randrange(6)
    return s


def rand_array(rng, depth):
    s = {"type": "array"}
    if rng.random() < 0.9:
        s["items"] = rand_schema(rng, depth + 1)
    if rng.random() < 0.4:
        s["minItems"] = rng.randrange(3)
    if rng.random() < 0.4:
        s["maxItems"] = s.get("minItems", 0) + rng.randrange(4)
    return s


def rand_object(rng, depth):
    names = rng.sample(WORDS + ["k%d" % i for i in range(8)], rng.randrange(5))
    props = {n: rand_schema(rng, depth + 1) for n in names}
    s = {"type": "object", "properties": props}
    if names and rng.random() < 0.8:
        s["required"] = [n for n in names if rng.random() < 0.5]
    if rng.random() < 0.7:
        s["additionalProperties"] = False
    return s


def rand_schema(rng, depth=0):
    """A schema of the supported subset; deeper nodes lean to scalars."""
    kinds = ["string", "integer", "number", "boolean", "null", "enum", "const", "typelist"]
    if depth < 4:
        kinds += ["array", "object", "object", "anyOf"]
    if depth < 2:
        kinds += ["array", "object", "any"]
    k = rng.choice(kinds)
    if k == "string":
        s = rand_string(rng)
    elif k in ("integer", "number", "boolean", "null"):
        s = {"type": k}
    elif k == "enum":
        s = {"enum": [rand_value(rng) for _ in range(1 + rng.randrange(4))]}
    elif k == "const":
        s = {"const": rand_value(rng)}
    elif k == "typelist":
        s = {"type": rng.sample(["string", "integer", "number", "boolean", "null"], 2)}
    elif k == "array":
        s = rand_array(rng, depth)
    elif k == "object":
        s = rand_object(rng, depth)
    elif k == "anyOf":
        s = {"anyOf": [rand_schema(rng, depth + 1) for _ in range(2 + rng.randrange(2))]}
    else:
        s = rng.choice([{}, True, {"type": "object"}])
        if s is True:
            return s
    return annotate(rng, s)


def rand_top(rng):
    if rng.random() < 0.15:
        return {"$defs": {"item": rand_schema(rng, 1)}, "type": "array",
                "items": {"$ref": "#/$defs/item"}, "maxItems": 3}
    if rng.random() < 0.05:  # recursion through $ref
        return {"$defs": {"node": {"type": "object", "properties": {
                    "v": {"type": "integer"}, "next": {"$ref": "#/$defs/node"}},
                    "required": ["v"], "additionalProperties": False}},
                "$ref": "#/$defs/node"}
    return rand_schema(rng)


def sample(schemas, tokenizer, n, seed):
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for s in schemas:
            f.write(json.dumps(s) + "\n")
        path = f.name
    try:
        r = subprocess.run([TOOL, "sample", "--tokenizer", tokenizer, "--schemas", path,
                            "--n", str(n), "--seed", str(seed), "--free-steps", "24"],
                           capture_output=True, text=True, timeout=1200)
    finally:
        os.unlink(path)
    if r.returncode != 0:
        raise Fail("tandem-grammar sample exited %d: %s" % (r.returncode, r.stderr[-2000:]))
    # split on "\n" only: str.splitlines() also splits at U+0085 and U+2028,
    # which JSON leaves unescaped inside strings
    lines = [json.loads(line) for line in r.stdout.split("\n") if line]
    if len(lines) != len(schemas):
        raise Fail("%d schemas, %d result lines" % (len(schemas), len(lines)))
    return lines


def validate(schemas, lines, what):
    n_outputs = 0
    for s, line in zip(schemas, lines):
        if "error" in line:
            raise Fail("%s: schema %d refused or failed: %s\n%s" % (what, line["index"], line["error"],
                                                                   json.dumps(s)))
        validator = jsonschema.Draft202012Validator(s)
        for out in line["outputs"]:
            try:
                value = json.loads(out)
            except ValueError as e:
                raise Fail("%s: schema %d: output is not JSON (%s): %r\n%s"
                           % (what, line["index"], e, out, json.dumps(s)))
            errors = list(validator.iter_errors(value))
            if errors:
                raise Fail("%s: schema %d: output %r does not validate: %s\n%s"
                           % (what, line["index"], out, errors[0].message, json.dumps(s)))
            n_outputs += 1
    print("%s: %d schemas, %d outputs, all valid" % (what, len(schemas), n_outputs))


UNSUPPORTED = ["minimum", "maximum", "exclusiveMinimum", "multipleOf", "format", "oneOf",
               "allOf", "not", "if", "patternProperties", "minProperties", "uniqueItems", "contains",
               "prefixItems", "unevaluatedProperties"]


def check_refusals():
    for kw in UNSUPPORTED:
        schema = {"type": "object", "properties": {"a": {"type": "array", "items": {kw: 1}}}}
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(schema, f)
            path = f.name
        try:
            r = subprocess.run([TOOL, "check", "--schema", path], capture_output=True, text=True)
        finally:
            os.unlink(path)
        want = "schema.properties.a.items: unsupported keyword '%s'" % kw
        if r.returncode != 1 or want not in r.stderr:
            raise Fail("%s: exit %d, %r; want %r" % (kw, r.returncode, r.stderr, want))
    print("refusals: %d keywords, each named with its path" % len(UNSUPPORTED))


def test():
    if not os.path.exists(TOOL):
        raise Fail("%s not built" % TOOL)
    rng = random.Random(60)
    schemas = [rand_top(rng) for _ in range(200)]
    for s in schemas:
        jsonschema.Draft202012Validator.check_schema(s)
    validate(schemas, sample(schemas, TRAINED, 3, 1), "trained tokenizer")
    if os.path.exists(LLAMA3):
        validate(schemas[:40], sample(schemas[:40], LLAMA3, 2, 2), "Llama 3 tokenizer")
    else:
        print("Llama 3 tokenizer not in .deps: only the trained one")
    check_refusals()


if __name__ == "__main__":
    try:
        test()
    except Fail as e:
        print("FAIL: %s" % e)
        sys.exit(1)
    print("PASS")
