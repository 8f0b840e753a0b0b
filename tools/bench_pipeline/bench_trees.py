#!/usr/bin/python3
"""bench_trees.py: token trees against chains and target-only through the
three-process pipeline (issue 61), greedy, in one run.

    bench_trees.py [--build DIR] [--max-tokens N] [--threads N] [--repeat N]

The trained pair (models/trained). Prompts: the e2e test's (tests/e2e/
test_pipeline_trees.py): id prompts ending in a phrase they hold twice
before, each time followed by something else, and three code prompts the
target continues with repeats of its own. Every prompt is served once with
draft none first: its ids are the reference every method must give (the
benchmark fails otherwise), and the suffix cache then holds them. Methods,
each over every prompt, in a fresh order each repeat: target-only (draft
none), and for the n-grams and the suffix cache a chain of K 4 (spec_tree
off) and trees of budget 8 and 16 (32 for the suffix cache) with paths of K
4, and spec_tree "auto" (the coordinator's measured choice, one pair's
for both sources). Printed per method: tokens a round (generated after the first token over
verification calls), rows a round (the nodes or drafts verified and the fed
token, over verification calls), tree rounds, and tokens/s (tokens after
the first over decode time, all requests together), with its ratio to
target-only. Needs python3-zmq (run with /usr/bin/python3); uses
tests/e2e/tandem_e2e.py.
"""
import argparse
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(SRC, "tests", "e2e"))

METHODS = [  # label, draft, spec_tree, spec_k
    ("target-only", "none", "off", None),
    ("ngram chain 4", "ngram", "off", 4),
    ("ngram tree 8", "ngram", 8, 4),
    ("ngram tree 16", "ngram", 16, 4),
    ("ngram auto", "ngram", "auto", 4),
    ("suffix chain 4", "suffix", "off", 4),
    ("suffix tree 8", "suffix", 8, 4),
    ("suffix tree 16", "suffix", 16, 4),
    ("suffix tree 32", "suffix", 32, 4),
    ("suffix auto", "suffix", "auto", 4),
]


def main():
    ap = argparse.ArgumentParser(description="Tandem token trees through the pipeline")
    ap.add_argument("--build", default=os.environ.get("TANDEM_BUILD_DIR", os.path.join(SRC, "build")))
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1, help="threads per worker")
    ap.add_argument("--repeat", type=int, default=3, help="runs of every method over every prompt")
    args = ap.parse_args()
    os.environ["TANDEM_BUILD_DIR"] = os.path.abspath(args.build)
    import tandem_e2e
    from tandem_e2e import Pipeline, check, generate
    from test_pipeline_trees import TEXTS, prompts

    p = Pipeline("bench-trees", max_concurrency=1, extra={"coordinator": {"request_timeout_ms": 3600000,
                                                                          "spec_k_max": 16}})
    p.use_pair("trained")
    for role in ("draft_worker", "target_worker"):
        p.config[role]["threads"] = args.threads
        p.config[role]["max_seq_len"] = 2048
    p.start_all()
    s = p.client()
    cases = prompts(6, 11) + TEXTS
    n = args.max_tokens
    refs = []
    for i, c in enumerate(cases):
        done, _ = generate(s, dict(c, id="ref%d" % i, max_tokens=n, temperature=0, draft="none"), timeout_s=600)
        check(done.get("type") == "done", "reference %d: %s" % (i, done))
        refs.append(done["ids"])
    sums = {m[0]: {"tokens": 0, "rounds": 0, "rows": 0, "tree_rounds": 0, "decode_ms": 0.0} for m in METHODS}
    order_rng = random.Random(3)
    for r in range(args.repeat):
        order = list(METHODS)
        order_rng.shuffle(order)
        for label, draft, tree, k in order:
            for i, c in enumerate(cases):
                req = dict(c, id="%s-%d-%d" % (label, r, i), max_tokens=n, temperature=0, draft=draft,
                           spec_tree=tree)
                if k:
                    req["spec_k"] = k
                done, _ = generate(s, req, timeout_s=600)
                check(done.get("ids") == refs[i], "%s, prompt %d: output differs from target-only" % (label, i))
                sp, t = done["spec"], sums[label]
                t["tokens"] += len(done["ids"]) - 1
                t["rounds"] += sp["rounds"]
                t["rows"] += sp["drafted"] + sp["rounds"]
                t["tree_rounds"] += sp["tree_rounds"]
                t["decode_ms"] += done["timing"]["decode_ms"]
    s.close()
    p.close()
    load = os.getloadavg()
    print("== token trees through the pipeline, trained pair, greedy, %d prompts x %d tokens, %d runs each "
          "(load average %.1f %.1f %.1f) ==" % (len(cases), n, args.repeat, *load))
    print("| method | tokens/round | rows/round | tree rounds | tokens/s | vs target-only |")
    print("|---|---|---|---|---|---|")
    base = sums["target-only"]
    base_tps = base["tokens"] * 1000.0 / base["decode_ms"]
    for label, _, _, _ in METHODS:
        t = sums[label]
        tps = t["tokens"] * 1000.0 / t["decode_ms"] if t["decode_ms"] > 0 else 0.0
        print("| %s | %.2f | %.2f | %d | %.0f | %.2f |" %
              (label, t["tokens"] / max(1, t["rounds"]), t["rows"] / max(1, t["rounds"]), t["tree_rounds"], tps,
               tps / base_tps))
    tandem_e2e.PIPELINES.clear()


if __name__ == "__main__":
    main()
