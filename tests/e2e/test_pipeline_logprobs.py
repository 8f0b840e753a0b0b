#!/usr/bin/python3
"""Log-probabilities (the request's "logprobs") through the three processes
(tiny pair).

1. Greedy: speculative decoding (draft model at K 2 and 5, n-gram, suffix
   cache) reports the same ids and the same logprobs, bit for bit, as
   target-only decoding through the same pipeline (draft "none").
2. Seeded sampling, speculative (model, K 3): every emitted token's entry
   equals, bit for bit, what target-only decoding reports for that position
   when it is fed the same prefix (one target-only request per position,
   prompt + the tokens before it, max_tokens 1): the top alternatives are a
   function of the prefix alone, and the emitted token's logprob must be its
   entry there when it is among them.
3. Independent reference: tandem-generate --dump-logits runs the target's
   forward in-process over prompt + output and writes the raw logits; the
   test computes log-softmax itself in float64 (numpy) and compares every
   reported logprob (emitted and top) with |a - b| <= 1e-6 + 1e-6 |b|. Why
   that tolerance: the CPU kernels are batch-invariant (the dumped rows equal
   the verification's bit for bit), so what differs is the log-sum-exp's
   summation order in double (~1e-15 relative) and the rounding of the
   result to float32 (half an ulp: 6e-8 relative), both far inside it; a
   wrong row (off by one position) or a softmax with temperature is off by
   orders of magnitude more.
4. Streaming: the token events' logprobs concatenate to the done reply's.
Also: logprobs out of 0..20 is an invalid_request naming the field."""
import os

import numpy as np

from tandem_e2e import Pipeline, binary, check, generate, main, run

TOP = 5


def entries_key(entries):
    """What must match bit for bit: id, logprob, and the top list."""
    return [(e["id"], e["logprob"], [(t["id"], t["logprob"]) for t in e["top_logprobs"]]) for e in entries]


def log_softmax(rows):
    r = rows.astype(np.float64)
    m = r.max(axis=1, keepdims=True)
    return (r - m) - np.log(np.exp(r - m).sum(axis=1, keepdims=True))


def dumped_logprobs(p, target, prompt, out):
    """float64 log-softmax of the target's logits for each token of out."""
    path = os.path.join(p.dir, "logits.f32")
    run([binary("generate"), "--model", target, "--ids", ",".join(map(str, prompt + out)), "--max-tokens", "1",
         "--temperature", "0", "--threads", "1", "--dump-logits", path])
    rows = np.fromfile(path, dtype=np.float32)
    n = len(prompt) + len(out)  # prompt + out + the one generated token, less the last
    check(rows.size % n == 0, "dumped %d floats for %d positions" % (rows.size, n))
    rows = rows.reshape(n, -1)
    return log_softmax(rows[len(prompt) - 1:len(prompt) - 1 + len(out)])


def check_against(ref, done, what):
    """Every reported logprob against the independent float64 log-softmax."""
    worst = 0.0
    for i, e in enumerate(done["logprobs"]):
        pairs = [(e["id"], e["logprob"])] + [(t["id"], t["logprob"]) for t in e["top_logprobs"]]
        for tok, lp in pairs:
            b = ref[i][tok]
            err = abs(lp - b)
            worst = max(worst, err)
            check(err <= 1e-6 + 1e-6 * abs(b), "%s: token %d (%d): logprob %.9g, reference %.9g" % (what, i, tok, lp, b))
        order = np.lexsort((np.arange(ref.shape[1]), -ref[i]))[:TOP]
        check([t["id"] for t in e["top_logprobs"]] == list(order),
              "%s: token %d: top ids %s, reference %s" % (what, i, [t["id"] for t in e["top_logprobs"]], list(order)))
    return worst


def test():
    p = Pipeline("logprobs", max_concurrency=4, extra={"coordinator": {"spec_k_max": 8}})
    draft, target = p.make_pair()
    p.start_all()
    s = p.client()

    prompts = [[5, 17, 99, 3, 42], [7, 7, 7, 200, 31, 8, 150, 22, 9], [300, 1, 2, 3, 4, 5, 6]]
    worst = 0.0
    for i, ids in enumerate(prompts):
        base = {"prompt_ids": ids, "max_tokens": 24, "temperature": 0, "logprobs": TOP}
        ref, _ = generate(s, dict(base, id="t%d" % i, draft="none"))
        check(ref["type"] == "done", "target-only: %s" % ref)
        check(len(ref["logprobs"]) == len(ref["ids"]), "one entry per id: %s" % ref)
        check([e["id"] for e in ref["logprobs"]] == ref["ids"], "entries name the ids")
        check(all(len(e["top_logprobs"]) == TOP for e in ref["logprobs"]), "top count")
        for src, k in (("model", 2), ("model", 5), ("ngram", 4), ("suffix", 4)):
            done, _ = generate(s, dict(base, id="s%d%s%d" % (i, src, k), draft=src, spec_k=k))
            what = "prompt %d, draft %s, K %d" % (i, src, k)
            check(done.get("ids") == ref["ids"], "%s: ids %s != target-only %s" % (what, done.get("ids"), ref["ids"]))
            check(entries_key(done["logprobs"]) == entries_key(ref["logprobs"]),
                  "%s: logprobs differ from target-only" % what)
            if src == "model":
                check(done["spec"]["accepted"] > 0, "%s: nothing accepted: %s" % (what, done["spec"]))
        worst = max(worst, check_against(dumped_logprobs(p, target, ids, ref["ids"]), ref, "prompt %d" % i))

    # Seeded sampling: teacher-forced target-only requests, position by position.
    for i, ids in enumerate(prompts[:2]):
        done, _ = generate(s, {"id": "x%d" % i, "prompt_ids": ids, "max_tokens": 12, "temperature": 0.9,
                               "seed": 1234 + i, "spec_k": 3, "draft": "model", "logprobs": TOP})
        check(done["type"] == "done" and done["spec"]["accepted"] > 0, "sampled: %s" % done)
        for j, e in enumerate(done["logprobs"]):
            one, _ = generate(s, {"id": "f%d_%d" % (i, j), "prompt_ids": ids + done["ids"][:j], "max_tokens": 1,
                                  "temperature": 0, "draft": "none", "logprobs": TOP})
            f = one["logprobs"][0]
            top = [(t["id"], t["logprob"]) for t in f["top_logprobs"]]
            check([(t["id"], t["logprob"]) for t in e["top_logprobs"]] == top,
                  "sampled %d, token %d: top %s != target-only %s" % (i, j, e["top_logprobs"], top))
            for tid, lp in top:
                if tid == e["id"]:
                    check(lp == e["logprob"], "sampled %d, token %d: logprob %r != %r" % (i, j, e["logprob"], lp))
        worst = max(worst, check_against(dumped_logprobs(p, target, ids, done["ids"]), done, "sampled %d" % i))

    # Streaming: the events add up to the done reply.
    done, toks = generate(s, {"id": "st", "prompt_ids": prompts[0], "max_tokens": 20, "temperature": 0,
                              "logprobs": 2, "stream": True, "spec_k": 4})
    streamed = sum((t.get("logprobs", []) for t in toks), [])
    check(entries_key(streamed) == entries_key(done["logprobs"]), "streamed logprobs do not add up")
    check([e["text_offset"] for e in done["logprobs"]] == sorted(e["text_offset"] for e in done["logprobs"]),
          "text offsets go forward")

    for bad in (-1, 21, 2.5, "3"):
        err, _ = generate(s, {"id": "bad", "prompt_ids": [1, 2], "logprobs": bad})
        check(err["type"] == "error" and err["code"] == "invalid_request" and err["message"].startswith("logprobs:"),
              "logprobs %r: %s" % (bad, err))
    print("worst |logprob - float64 reference|: %.3g" % worst)


if __name__ == "__main__":
    main(test)
