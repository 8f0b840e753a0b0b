#!/usr/bin/python3
"""Token trees through the three processes (issue 61; docs/token-trees.md):
the coordinator's model-free drafts (n-grams, the suffix cache, "auto") go
to the target as one tree (verify_tree) when a request sets "spec_tree" to a
node budget. On the trained pair: greedy output equals target-only ids for
ids with budgets 4, 8, 16 and 32, alone and batched; sampled output with
top_k 1 (the target's distribution a point mass) equals greedy output, which
any accept rule that takes a node the target would not sample breaks; seeded
sampled output is the same alone and batched; the stats show the trees were
verified (nodes beyond the accepted paths), so the equalities are not those
of chains. "off", spec_tree "auto" (chains today) and a request with
logprobs (not on the tree path yet) send no tree; a bad budget is an
invalid_request naming the field."""
import random

from tandem_e2e import Pipeline, check, generate, generate_concurrently, main, reference


def prompts(n, seed):
    """Id prompts ending in a phrase they hold twice before, followed by
    something else each time: once served, the suffix cache knows several
    continuations of it (the prompts' and the outputs'), a tree's
    branches."""
    rng = random.Random(seed)
    key = [rng.randrange(256, 4000) for _ in range(8)]

    def noise(k):
        return [rng.randrange(256, 4000) for _ in range(k)]
    return [{"prompt_ids": noise(4) + key + noise(5) + key + noise(5) + key} for _ in range(n)]


# Code the trained target continues with repeats of its own: the n-grams'
# matches, a runner-up now and then
TEXTS = [{"prompt": "import os\nimport sys\nimport re\nimport json\n"},
         {"prompt": "def add_one(x):\n    return x + 1\n\n\ndef add_two(x):\n    return x + 2\n\n\ndef add_three(x):\n"},
         {"prompt": "self.a = a\nself.b = b\nself.c = c\nself.d = d\n"}]


def spec(done):
    return done.get("spec", {})


def test():
    p = Pipeline("trees", max_concurrency=4, extra={"coordinator": {"spec_k_max": 16}})
    p.use_pair("trained")
    target = p.config["target_worker"]["model"]
    p.start_all()
    s = p.client()
    cases = prompts(6, 11) + TEXTS
    n = 32
    # target-only through the pipeline (draft none), and once by
    # tandem-generate, the same ids; the outputs fill the suffix cache
    refs = []
    for i, c in enumerate(cases):
        done, _ = generate(s, dict(c, id="ref%d" % i, max_tokens=n, temperature=0, draft="none"))
        check(done.get("type") == "done", "reference %d: %s" % (i, done))
        refs.append(done["ids"])
    check(reference(target, cases[0]["prompt_ids"], n)["ids"] == refs[0], "draft none != tandem-generate")

    # greedy, alone: every budget, every model-free source. The paths are
    # spec_k deep (a budget past the depth is spent on branches)
    totals = {}
    for source in ("ngram", "suffix", "auto"):
        rounds = nodes = accepted = 0
        for i, c in enumerate(cases):
            for budget, k in ((4, 2), (8, 4), (16, 4), (32, 8)):
                rid = "%s-%d-%d" % (source, i, budget)
                done, _ = generate(s, dict(c, id=rid, max_tokens=n, temperature=0, draft=source, spec_k=k,
                                           spec_tree=budget))
                check(done.get("type") == "done", "%s: %s" % (rid, done))
                check(done["ids"] == refs[i], "%s: tree ids %s != target-only %s" % (rid, done["ids"], refs[i]))
                st = spec(done)
                rounds += st["tree_rounds"]
                nodes += st["tree_nodes"]
                accepted += st["tree_accepted"]
                check(st["tree_nodes"] <= st["tree_rounds"] * (budget - 1),
                      "%s: %d nodes in %d rounds, more than the budget" % (rid, st["tree_nodes"], st["tree_rounds"]))
                check(st["tree_accepted"] <= st["tree_rounds"] * k,
                      "%s: accepted paths deeper than spec_k: %s" % (rid, st))
        totals[source] = (rounds, nodes, accepted)
        print("%s: %d tree rounds, %d nodes verified, %d accepted" % (source, rounds, nodes, accepted))
    check(totals["auto"][0] > 0, "draft auto (taking suffix matches) sent no tree")
    # spec_tree "auto", given or the default: chains or trees of at most 8
    # nodes as the pair's measured choice says (tree_choice.h), the
    # target's output either way
    for i, c in enumerate(cases[:3]):
        for extra in ({"spec_tree": "auto"}, {}):
            done, _ = generate(s, dict(c, id="auto%d" % i, max_tokens=n, temperature=0, draft="suffix", spec_k=4,
                                       **extra))
            st = spec(done) if done.get("type") == "done" else {}
            check(done.get("ids") == refs[i] and st.get("drafted", 0) > 0 and
                  st.get("tree_nodes", 0) <= st.get("tree_rounds", 0) * 7,
                  "spec_tree %s: %s" % (extra.get("spec_tree", "(default)"), done))
    # a tree goes out only when it is not a chain: more nodes than its
    # accepted path and the round's bonus in every round
    rounds, nodes, accepted = totals["suffix"]
    check(rounds >= 10 and nodes > accepted + rounds and accepted > 0,
          "suffix: %d tree rounds, %d nodes, %d accepted: the trees were not verified" % (rounds, nodes, accepted))
    rounds, nodes, accepted = totals["ngram"]
    check(rounds == 0 or nodes > accepted + rounds, "ngram: %d tree rounds, %d nodes, %d accepted" %
          (rounds, nodes, accepted))

    # batched: budgets and sources side by side with a chain and target-only
    plan = [("suffix", 32, 8), ("suffix", 8, 2), ("ngram", 16, 4), ("suffix", "off", 4), ("none", 16, 0),
            ("auto", 16, 4), ("ngram", 32, 4), ("suffix", 16, 4)]
    out = generate_concurrently(p, [dict(cases[i], id="b%d" % i, max_tokens=n, temperature=0, draft=src,
                                         spec_tree=budget, **({"spec_k": k} if k else {}))
                                    for i, (src, budget, k) in enumerate(plan)])
    for i, r in enumerate(out):
        check(r.get("type") == "done" and r["ids"] == refs[i], "batch %d %s: %s" % (i, plan[i], r))
    check(sum(spec(r)["tree_rounds"] for r in out) > 0, "the batch sent no tree: %s" % out)
    check(spec(out[3])["tree_rounds"] == 0, "spec_tree off sent trees: %s" % out[3])

    # sampled with top_k 1: p is a point mass at the argmax, so the tree
    # rule must accept exactly the target's choice: greedy output
    tree_rounds = 0
    for i, c in enumerate(cases):
        done, _ = generate(s, dict(c, id="k1-%d" % i, max_tokens=n, temperature=1.0, top_k=1, seed=5,
                                   draft="suffix", spec_k=4, spec_tree=16))
        check(done.get("ids") == refs[i], "top_k 1, prompt %d: %s != greedy %s" % (i, done.get("ids"), refs[i]))
        tree_rounds += spec(done)["tree_rounds"]
    check(tree_rounds > 0, "top_k 1: no tree was verified")

    # seeded sampling: the same ids alone, again, and batched. The n-grams
    # draft from the request's own tokens only, so its trees are the same
    # each time (the suffix cache's change as requests finish, and a seed
    # reproduces the output of the same drafts: chains alike)
    sampled = {"max_tokens": n, "temperature": 0.5, "seed": 1234, "draft": "ngram", "spec_k": 4, "spec_tree": 32}
    first, tree_rounds = [], 0
    for i, c in enumerate(cases):
        for seed in (1234, 99, 7):
            a, _ = generate(s, dict(sampled, id="s%d" % i, seed=seed, **c))
            b, _ = generate(s, dict(sampled, id="t%d" % i, seed=seed, **c))
            check(a.get("type") == "done" and a["ids"] == b.get("ids"), "seeded prompt %d: %s then %s" % (i, a, b))
            tree_rounds += spec(a)["tree_rounds"]
        first.append(a["ids"])
    print("seeded sampling: %d tree rounds" % tree_rounds)
    check(tree_rounds > 0, "seeded sampling: no tree was verified")
    out = generate_concurrently(p, [dict(sampled, id="u%d" % i, seed=7, **c) for i, c in enumerate(cases[-4:])])
    for i, r in enumerate(out):
        check(r.get("ids") == first[len(cases) - 4 + i], "seeded prompt %d batched: %s != %s" %
              (i, r.get("ids"), first[len(cases) - 4 + i]))

    # not on the tree path yet: logprobs go as chains, same ids
    done, _ = generate(s, dict(cases[0], id="lp", max_tokens=n, temperature=0, draft="suffix", spec_k=4,
                               spec_tree=16, logprobs=2))
    check(done.get("ids") == refs[0] and spec(done)["tree_rounds"] == 0, "logprobs with spec_tree: %s" % done)

    # bad budgets
    for bad in ("bushy", 1, 33, 2.5, True):
        done, _ = generate(s, {"id": "bad", "prompt_ids": [5], "spec_tree": bad})
        check(done["type"] == "error" and done["code"] == "invalid_request" and "spec_tree" in done["message"],
              "spec_tree %r: %s" % (bad, done))

    st = p.stats()["spec"]
    check(st["tree_rounds"] > 0 and st["tree_nodes"] > st["tree_accepted_tokens"],
          "stats: %s" % st)
    print("stats: %d tree rounds, %d nodes, %d accepted" %
          (st["tree_rounds"], st["tree_nodes"], st["tree_accepted_tokens"]))
    s.close()
    p.close()


if __name__ == "__main__":
    main(test)
