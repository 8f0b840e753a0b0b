#!/usr/bin/python3
"""The trained pair (models/trained, tools/train) through the normal paths.

- Regression guard on the weights and the forward pass together: the
  target's greedy answer to the fixed chat prompt of models/trained/expected.json
  is the committed text, ids for ids.
- It is just another model: speculative output (in process, and through the
  three processes with the draft model and with n-gram drafts) equals
  target-only output, and the answer is a chat answer (it ends with the
  end-of-turn token, finish_reason "stop", when the committed one does).
- The weights are what the card says: tandem-bench ppl on the held-out slice
  (models/trained/heldout.txt) matches the perplexity PyTorch computed on the
  same slice (models/trained/eval.json) within 1%, for target and draft.
"""
import json
import os

from tandem_e2e import Pipeline, binary, check, generate, main, run

SRC = os.environ.get("TANDEM_SOURCE_DIR") or os.path.normpath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BUILD = os.environ.get("TANDEM_BUILD_DIR") or os.path.join(SRC, "build")
TRAINED = os.path.join(SRC, "models", "trained")
TARGET = os.path.join(TRAINED, "target")
DRAFT = os.path.join(TRAINED, "draft")


def load_json(name):
    path = os.path.join(TRAINED, name)
    check(os.path.isfile(path), "%s missing (the trained pair is committed; see tools/train)" % path)
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def generate_chat(prompt, max_tokens, draft=None):
    cmd = [binary("generate"), "--model", TARGET, "--chat", prompt, "--max-tokens", str(max_tokens),
           "--temperature", "0", "--threads", "1", "--json"]
    if draft:
        # a fixed K: adaptive K may stop drafting where the draft looks dear
        # (under a sanitizer), and then nothing would be checked
        cmd += ["--draft", draft, "--spec-k", "3"]
    return json.loads(run(cmd))


def check_perplexity(ev):
    bench = os.path.join(BUILD, "tools", "bench", "tandem-bench")
    check(os.access(bench, os.X_OK), "tandem-bench not built at %s" % bench)
    text = os.path.join(TRAINED, ev["text"])
    for name in ("target", "draft"):
        want = ev[name]
        got = json.loads(run([bench, "ppl", "--model", os.path.join(TRAINED, name), "--text", text,
                              "--context", str(ev["context"]), "--threads", "1"]).strip().splitlines()[-1])
        check(got["scored"] == want["scored"],
              "%s: tandem scored %d tokens of the held-out slice, PyTorch %d (the tokenizers differ)"
              % (name, got["scored"], want["scored"]))
        rel = abs(got["ppl"] - want["ppl"]) / want["ppl"]
        print("%s perplexity on %s: tandem %.4f, pytorch %.4f (%.3f%% apart)"
              % (name, ev["text"], got["ppl"], want["ppl"], 100 * rel))
        check(rel <= 0.01, "%s: tandem perplexity %.4f is more than 1%% from PyTorch's %.4f"
              % (name, got["ppl"], want["ppl"]))


def test():
    exp = load_json("expected.json")
    check_perplexity(load_json("eval.json"))

    ref = generate_chat(exp["prompt"], exp["max_tokens"])
    check(ref["ids"] == exp["ids"], "target-only ids %s\n  != committed %s" % (ref["ids"], exp["ids"]))
    check(ref["text"] == exp["text"], "target-only text %r\n  != committed %r" % (ref["text"], exp["text"]))
    spec = generate_chat(exp["prompt"], exp["max_tokens"], DRAFT)
    check(spec["ids"] == exp["ids"], "in-process speculative ids %s != target-only %s" % (spec["ids"], exp["ids"]))
    check(spec["rounds"] > 0 and spec["acceptance_rate"] > 0,
          "in-process speculation accepted nothing: %s" % spec)

    p = Pipeline("trained", extra={"draft_worker": {"max_seq_len": 2048},
                                   "target_worker": {"max_seq_len": 2048}})
    p.config["draft_worker"]["model"] = DRAFT
    p.config["target_worker"]["model"] = TARGET
    p.start_all()
    s = p.client()
    for source in ("model", "ngram"):
        done, _ = generate(s, {"id": "t-" + source, "messages": [{"role": "user", "content": exp["prompt"]}],
                               "max_tokens": exp["max_tokens"], "temperature": 0, "draft": source})
        check(done.get("type") == "done", "draft %s: %s" % (source, done))
        check(done["ids"] == exp["ids"], "draft %s: pipeline ids %s != target-only %s" % (source, done["ids"], exp["ids"]))
        check(done["text"] == exp["text"], "draft %s: pipeline text %r != %r" % (source, done["text"], exp["text"]))
        check(done["finish_reason"] == exp["finish_reason"],
              "draft %s: finish_reason %s, committed %s" % (source, done["finish_reason"], exp["finish_reason"]))
        print("pipeline, draft %s: acceptance %.3f, %.2f accepted/round" % (
            source, done["spec"].get("acceptance_rate", 0), done["spec"].get("mean_accepted_per_round", 0)))
    check(exp["finish_reason"] in ("stop", "length"), "expected.json: finish_reason %r" % exp["finish_reason"])


if __name__ == "__main__":
    main(test)
