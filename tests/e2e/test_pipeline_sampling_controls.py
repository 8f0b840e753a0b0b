#!/usr/bin/python3
"""Sampling controls (logit_bias, presence_penalty, frequency_penalty,
repetition_penalty) through the three processes (tiny pair).

1. Greedy: speculative decoding with each control and all of them together,
   draft model at K 1, 3 and 6, n-gram and suffix-cache drafts, equals
   target-only decoding (draft "none") with the same controls, ids for ids;
   every control changes the output of at least one prompt (it is applied).
   A row's penalties count the drafts before it: a bug there shows at once,
   since accepted drafts are what make tokens repeat.
2. Batched: the same requests sent 8 at a time beside requests without
   controls give the same ids.
3. Sampled: tokens 2 to 4 of 1,200 seeded requests (temperature 1, top_k 3,
   presence_penalty 1.5, frequency_penalty 1, repetition_penalty 1.5) drafted
   by the model at K 3 against 1,200 the target samples alone with the same
   controls: a chi-square test of homogeneity at alpha 0.001
   (test_pipeline_sampled_distribution.py's). Its power on the same data: the
   target alone without the controls (a pipeline that dropped them) is told
   apart at the same alpha.
Also: a bias for a token outside the vocabulary and penalties out of range
are invalid_request errors naming the field."""
from tandem_e2e import Pipeline, check, generate, generate_concurrently, main
from test_pipeline_sampled_distribution import ALPHA, homogeneity

N = 1200
PROMPTS = [[5, 17, 99, 3, 42], [7, 7, 7, 200, 31, 8, 150, 22, 9], [300, 1, 2, 3, 4, 5, 6], [11, 42, 7, 300, 5]]
CONTROLS = {
    "presence": {"presence_penalty": 1.2},
    "frequency": {"frequency_penalty": 0.7},
    "repetition": {"repetition_penalty": 1.4},
    "bias": None,  # filled from the target-only output: push its top tokens away
    "all": {"presence_penalty": 0.5, "frequency_penalty": 0.5, "repetition_penalty": 1.2},
    "negative": {"presence_penalty": -1.0, "frequency_penalty": -0.5},
}
SOURCES = (("model", 1), ("model", 3), ("model", 6), ("ngram", 4), ("suffix", 4))


def test():
    p = Pipeline("sampctl", max_concurrency=8, max_queue=16, extra={"coordinator": {"spec_k_max": 8}})
    p.make_pair()
    p.start_all()
    s = p.client()
    plain = {}
    for i, ids in enumerate(PROMPTS):
        done, _ = generate(s, {"id": "p%d" % i, "prompt_ids": ids, "max_tokens": 24, "temperature": 0,
                               "draft": "none"})
        plain[i] = done["ids"]
    top = sorted(set(sum(plain.values(), [])), key=lambda t: -sum(v.count(t) for v in plain.values()))[:3]
    CONTROLS["bias"] = {"logit_bias": {str(t): -30 for t in top}}
    CONTROLS["all"]["logit_bias"] = {str(top[0]): -5, str(top[-1]): 3}

    changed = set()
    expected = []
    for name, ctl in CONTROLS.items():
        for i, ids in enumerate(PROMPTS):
            base = dict({"prompt_ids": ids, "max_tokens": 24, "temperature": 0}, **ctl)
            ref, _ = generate(s, dict(base, id="r%s%d" % (name, i), draft="none"))
            check(ref["type"] == "done", "%s: %s" % (name, ref))
            if ref["ids"] != plain[i]:
                changed.add(name)
            expected.append((base, ref["ids"]))
            for src, k in SOURCES:
                done, _ = generate(s, dict(base, id="s%s%d%s%d" % (name, i, src, k), draft=src, spec_k=k))
                check(done.get("ids") == ref["ids"], "%s, prompt %d, draft %s K %d: %s != target-only %s" %
                      (name, i, src, k, done.get("ids"), ref["ids"]))
    check(changed == set(CONTROLS), "controls without effect: %s" % (set(CONTROLS) - changed))

    # Batched beside requests without controls.
    reqs = []
    for j, (base, _) in enumerate(expected):
        reqs.append(dict(base, id="b%d" % j, draft="model", spec_k=2 + j % 4))
        reqs.append({"id": "n%d" % j, "prompt_ids": base["prompt_ids"], "max_tokens": 24, "temperature": 0,
                     "draft": "model", "spec_k": 3})
    for lo in range(0, len(reqs), 8):
        for req, done in zip(reqs[lo:lo + 8], generate_concurrently(p, reqs[lo:lo + 8])):
            j = int(req["id"][1:])
            want = expected[j][1] if req["id"][0] == "b" else plain[PROMPTS.index(req["prompt_ids"])]
            check(done.get("ids") == want, "batched %s: %s != %s" % (req["id"], done.get("ids"), want))

    for bad, field in (({"logit_bias": {"100000": 1}}, "logit_bias"), ({"logit_bias": {"x": 1}}, "logit_bias"),
                       ({"logit_bias": {"3": 101}}, "logit_bias"), ({"presence_penalty": 2.5}, "presence_penalty"),
                       ({"frequency_penalty": -3}, "frequency_penalty"), ({"repetition_penalty": 0}, "repetition_penalty")):
        err, _ = generate(s, dict({"id": "bad", "prompt_ids": [1, 2]}, **bad))
        check(err["type"] == "error" and err["code"] == "invalid_request" and err["message"].startswith(field + ":"),
              "%s: %s" % (bad, err))

    # Sampled: the distribution of tokens 2..4.
    ctl = {"presence_penalty": 1.5, "frequency_penalty": 1.0, "repetition_penalty": 1.5}

    def sample(tag, extra):
        reqs = [dict({"id": "%s%d" % (tag, i), "prompt_ids": PROMPTS[3], "max_tokens": 5, "temperature": 1.0,
                      "top_k": 3, "seed": 1000 + i}, **extra) for i in range(N)]
        counts = {}
        for lo in range(0, N, 8):
            for done in generate_concurrently(p, reqs[lo:lo + 8]):
                check(done.get("type") == "done", "%s: %s" % (tag, done))
                key = tuple(done["ids"][1:4])
                counts[key] = counts.get(key, 0) + 1
        return counts

    before = p.stats()["spec"]
    drafted = sample("m", dict(ctl, draft="model", spec_k=3))
    st = p.stats()["spec"]
    check(st["num_draft_tokens"] - before["num_draft_tokens"] > 2 * N, "the drafts were not put to the test")
    alone = sample("t", dict(ctl, draft="none"))
    stat, dof, pv = homogeneity(drafted, alone)
    print("penalties, model drafts K 3 vs target alone: chi-square %.2f, %d dof, p = %.4f (%d outcomes)" %
          (stat, dof, pv, len(set(drafted) | set(alone))))
    check(dof >= 3, "too few outcomes to test: %s" % sorted(drafted.items()))
    check(pv > ALPHA, "sampled output with penalties differs from the target's (p = %g < %g)" % (pv, ALPHA))
    dropped = sample("d", {"draft": "none"})
    stat, dof, pv = homogeneity(alone, dropped)
    print("power: with the penalties vs without, chi-square %.2f, %d dof, p = %.3g" % (stat, dof, pv))
    check(pv < ALPHA, "the test cannot tell the penalties from none (p = %g): it has no power" % pv)


if __name__ == "__main__":
    main(test)
