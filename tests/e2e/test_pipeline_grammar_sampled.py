#!/usr/bin/python3
"""Structured output, sampled: the distribution of constrained output with
model drafts equals constrained target-only decoding's (trained pair).

1,200 seeded requests (temperature 1, a grammar of two letters from a-e,
25 outcomes) drafted by the model at K 3, whose q rows are then the masked
draft's, against 1,200 the target samples alone under the same grammar: a
chi-square test of homogeneity at alpha 0.001
(test_pipeline_sampled_distribution.py's). Every output is in the grammar.
Its power on the same data: the target alone at temperature 2 is told apart
at the same alpha."""
from tandem_e2e import Pipeline, check, generate_concurrently, main
from test_pipeline_sampled_distribution import ALPHA, homogeneity

N = 1200
GRAMMAR = {"type": "gbnf", "text": "root ::= [a-e] [a-e]\n"}
PROMPT = [{"role": "user", "content": "Say something wise about time."}]


def test():
    p = Pipeline("gsampled", max_concurrency=8, max_queue=16, extra={"coordinator": {"spec_k_max": 8}})
    p.use_pair("trained")
    p.start_all()

    def sample(tag, extra):
        reqs = [dict({"id": "%s%d" % (tag, i), "messages": PROMPT, "max_tokens": 4, "temperature": 1.0,
                      "seed": 7000 + i, "grammar": GRAMMAR}, **extra) for i in range(N)]
        counts = {}
        for lo in range(0, N, 8):
            for done in generate_concurrently(p, reqs[lo:lo + 8]):
                check(done.get("type") == "done", "%s: %s" % (tag, done))
                text = done["text"]
                check(len(text) == 2 and all(ch in "abcde" for ch in text) and done["finish_reason"] == "stop",
                      "%s: output %r (%s) is not in the grammar" % (tag, text, done["finish_reason"]))
                counts[text] = counts.get(text, 0) + 1
        return counts

    before = p.stats()["spec"]
    drafted = sample("m", {"draft": "model", "spec_k": 3})
    st = p.stats()["spec"]
    check(st["num_draft_tokens"] - before["num_draft_tokens"] > N, "the drafts were not put to the test")
    alone = sample("t", {"draft": "none"})
    stat, dof, pv = homogeneity(drafted, alone)
    print("grammar, model drafts K 3 vs target alone: chi-square %.2f, %d dof, p = %.4f (%d outcomes)" %
          (stat, dof, pv, len(set(drafted) | set(alone))))
    check(dof >= 3, "too few outcomes to test: %s" % sorted(drafted.items()))
    check(pv > ALPHA, "constrained sampled output differs from the target's (p = %g < %g)" % (pv, ALPHA))
    hot = sample("h", {"draft": "none", "temperature": 2.0})
    stat, dof, pv = homogeneity(alone, hot)
    print("power: temperature 1 vs 2 under the grammar, chi-square %.2f, %d dof, p = %.3g" % (stat, dof, pv))
    check(pv < ALPHA, "the test cannot tell temperature 2 from 1 (p = %g): it has no power" % pv)


if __name__ == "__main__":
    main(test)
