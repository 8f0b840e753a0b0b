#!/usr/bin/python3
"""Sampled output through the three processes has the target's distribution:
tokens 2 to 4 of 1,200 seeded requests of 5 tokens (temperature 1, top_k 3:
at most 27 outcomes) drafted by the model with K 3 (the first token comes
from the prefill, the next round drafts 3: every position of it goes
through accept/reject), against 1,200 the target samples alone (draft
"none") through the same pipeline, by a chi-square test of homogeneity at
alpha 0.001. Seeds make each run the same: the test cannot flake, and a
change in the numbers is a change in behaviour. Its power is shown on the
same data: the target alone at temperature 1 against temperature 0.6 must
be told apart at the same alpha."""
import math

from tandem_e2e import Pipeline, check, generate_concurrently, main

ALPHA = 0.001
N = 1200
PROMPT = [11, 42, 7, 300, 5]


def upper_gamma_regularized(a, x):
    """Q(a, x) = Gamma(a, x) / Gamma(a): a series below a + 1, else Lentz's
    continued fraction (Numerical Recipes, 6.2)."""
    if x <= 0:
        return 1.0
    lg = math.lgamma(a)
    if x < a + 1:
        term = total = 1.0 / a
        ap = a
        for _ in range(1000):
            ap += 1
            term *= x / ap
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return 1.0 - total * math.exp(-x + a * math.log(x) - lg)
    tiny = 1e-300
    b = x + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    for i in range(1, 1000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return math.exp(-x + a * math.log(x) - lg) * h


def homogeneity(a, b):
    """Chi-square statistic, degrees of freedom and p-value of two samples
    of outcomes being drawn from one distribution (outcomes seen fewer than
    10 times in both together are pooled into one cell)."""
    keys = set(a) | set(b)
    na, nb = sum(a.values()), sum(b.values())
    cells, rare = [], [0, 0]
    for k in keys:
        x, y = a.get(k, 0), b.get(k, 0)
        if x + y < 10:
            rare[0] += x
            rare[1] += y
        else:
            cells.append((x, y))
    if sum(rare) > 0:
        cells.append(tuple(rare))
    stat = 0.0
    for x, y in cells:
        t = x + y
        for obs, n in ((x, na), (y, nb)):
            exp = t * n / (na + nb)
            stat += (obs - exp) ** 2 / exp
    dof = len(cells) - 1
    return stat, dof, upper_gamma_regularized(dof / 2.0, stat / 2.0)


def sample(p, tag, extra):
    reqs = [dict({"id": "%s%d" % (tag, i), "prompt_ids": PROMPT, "max_tokens": 5, "temperature": 1.0,
                  "top_k": 3, "seed": 1000 + i}, **extra) for i in range(N)]
    counts = {}
    for lo in range(0, N, 8):
        for done in generate_concurrently(p, reqs[lo:lo + 8]):
            check(done.get("type") == "done", "%s: %s" % (tag, done))
            key = tuple(done["ids"][1:4])  # shorter when an EOS ended it: an outcome too
            counts[key] = counts.get(key, 0) + 1
    return counts


def test():
    # upper_gamma_regularized against known chi-square quantiles
    for q, dof, want in ((10.828, 1, 0.001), (3.841, 1, 0.05), (18.307, 10, 0.05), (45.315, 20, 0.001)):
        got = upper_gamma_regularized(dof / 2.0, q / 2.0)
        check(abs(got - want) < want * 0.01, "chi-square tail at %g, %d dof: %g, want %g" % (q, dof, got, want))
    p = Pipeline("sampledist", max_concurrency=8, max_queue=16)
    p.make_pair()
    p.start_all()
    drafted = sample(p, "m", {"draft": "model", "spec_k": 3})
    alone = sample(p, "t", {"draft": "none"})
    st = p.stats()["spec"]
    check(st["num_draft_tokens"] > 2 * N and st["accepted_per_pos"][2] > 0,
          "the model's drafts were not put to the test: %s" % st)
    stat, dof, pv = homogeneity(drafted, alone)
    print("model drafts K 3 vs target alone: chi-square %.2f, %d dof, p = %.4f (%d outcomes; acceptance %.3f)" %
          (stat, dof, pv, len(set(drafted) | set(alone)), st["num_accepted_tokens"] / max(1, st["num_draft_tokens"])))
    check(dof >= 3, "too few outcomes to test: %s" % sorted(drafted.items()))
    check(pv > ALPHA, "the pipeline's sampled output differs from the target's (p = %g < %g)" % (pv, ALPHA))
    cooler = sample(p, "c", {"draft": "none", "temperature": 0.6})
    stat, dof, pv = homogeneity(alone, cooler)
    print("power: temperature 1 vs 0.6, chi-square %.2f, %d dof, p = %.3g" % (stat, dof, pv))
    check(pv < ALPHA, "the test cannot tell temperature 1 from 0.6 (p = %g): it has no power" % pv)
    p.close()


if __name__ == "__main__":
    main(test)
