#!/usr/bin/python3
"""bench_drafters.py: the draft sources side by side through the three-process
pipeline, greedy, in one run.

    bench_drafters.py [--build DIR] [--pair trained|tiny|small] [--target DIR --draft DIR] [--max-tokens N]
                      [--threads N] [--repeat N] [--candidates N] [--spec-k-max K]

Sources: none (target-only through the pipeline), model, ngram, suffix, auto.
Scenarios:
  (a) repeated: a request served once before (every source then sees the
      same request again; the suffix cache holds the earlier one);
  (b) loops: a request whose target-only output repeats itself (of
      --candidates random prompts, the one whose output has the most
      repeated 4-grams);
  (c) no matches: the candidate whose output repeats least.
(a) runs on a pipeline with the suffix cache; (b) and (c) on a second one
without it (coordinator.suffix_cache_mib 0), so that running the same request
once per source does not turn (b) and (c) into (a): there `suffix` finds
nothing and `auto` is the model's. Runs are interleaved, in a new random
order each repeat; medians. Prints tokens/s and its ratio to target-only,
the acceptance (accepted / drafted) and the mean accepted tokens per round.
Models: --target/--draft, else (--pair trained, the default) the trained pair
of models/trained, whose prompts are chat questions of the kinds it was
trained on (tandem_e2e.TRAINED_QUESTIONS: (a) the first, (b) and (c) chosen
among the rest); or (--pair small) models/small and models/small-draft (the
demo's random pair) when present, else a tiny pair made in a temporary
directory, whose prompts are random ids.
Needs python3-zmq (run with /usr/bin/python3); uses tests/e2e/tandem_e2e.py.
"""
import argparse
import os
import random
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(SRC, "tests", "e2e"))

SOURCES = ["none", "model", "ngram", "suffix", "auto"]


def repeat_share(ids):
    """Share of tokens that follow a 4-gram seen earlier in the same output."""
    seen, hits = set(), 0
    for i in range(4, len(ids)):
        key = tuple(ids[i - 4:i])
        hits += key in seen
        seen.add(key)
    return hits / max(1, len(ids) - 4)


def main():
    ap = argparse.ArgumentParser(description="Tandem draft sources benchmark")
    ap.add_argument("--build", default=os.environ.get("TANDEM_BUILD_DIR", os.path.join(SRC, "build")))
    ap.add_argument("--pair", default="trained", choices=["trained", "tiny", "small"],
                    help="trained: models/trained; small: models/small and models/small-draft (the demo's "
                         "random pair) when present; tiny: made here")
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1, help="threads per worker")
    ap.add_argument("--repeat", type=int, default=3, help="runs per source and scenario (the median is printed)")
    ap.add_argument("--candidates", type=int, default=8, help="random prompts tried for (b) and (c)")
    ap.add_argument("--spec-k-max", type=int, default=8, help="coordinator.spec_k_max: the most drafts a round carries")
    args = ap.parse_args()
    os.environ["TANDEM_BUILD_DIR"] = os.path.abspath(args.build)
    import tandem_e2e
    from tandem_e2e import TRAINED_QUESTIONS, Pipeline, check, generate
    chat = args.pair == "trained" and not args.target

    def pipeline(name, suffix_mib):
        p = Pipeline(name, max_concurrency=1, extra={"coordinator": {"suffix_cache_mib": suffix_mib,
                                                                     "request_timeout_ms": 3600000,
                                                                     "spec_k_max": args.spec_k_max}})
        if args.target:
            p.config["target_worker"]["model"] = os.path.abspath(args.target)
            p.config["draft_worker"]["model"] = os.path.abspath(args.draft)
        else:
            p.use_pair(args.pair)
        for role in ("draft_worker", "target_worker"):
            p.config[role]["threads"] = args.threads
            p.config[role]["max_seq_len"] = 2048
        p.start_all()
        return p

    def run(p, sock, ids, source, tag):
        # ids: prompt ids, or (trained pair) a question asked as a chat
        prompt = {"messages": [{"role": "user", "content": ids}]} if isinstance(ids, str) else {"prompt_ids": ids}
        done, _ = generate(sock, dict(prompt, id=tag, max_tokens=args.max_tokens, temperature=0, draft=source),
                           timeout_s=600)
        check(done.get("type") == "done", "%s: %s" % (tag, done))
        return done

    def measure(p, sock, ids, label, results, ref):
        rows = {s: [] for s in SOURCES}
        shuffle = random.Random(len(label))
        for r in range(args.repeat):
            # a fresh order each repeat: a source that always followed the
            # same one would inherit its leftovers (a draft worker still
            # spinning after a model request slows what comes next)
            order = list(SOURCES)
            shuffle.shuffle(order)
            for source in order:
                d = run(p, sock, ids, source, "%s-%s-%d" % (label, source, r))
                check(d["ids"] == ref, "%s, %s: output differs from target-only" % (label, source))
                rows[source].append(d)
        results[label] = rows

    rng = random.Random(5)
    results = {}
    # (a) on a pipeline with the suffix cache
    p = pipeline("drafters-a", 64)
    s = p.client()
    prompt_a = TRAINED_QUESTIONS[0] if chat else [rng.randrange(1, 500) for _ in range(24)]
    first = run(p, s, prompt_a, "none", "a-first")
    measure(p, s, prompt_a, "(a) repeated", results, first["ids"])
    s.close()
    p.close()
    # (b), (c) on one without it
    p = pipeline("drafters-bc", 0)
    s = p.client()
    cands = []
    for i in range(len(TRAINED_QUESTIONS) - 1 if chat else args.candidates):
        ids = TRAINED_QUESTIONS[1 + i] if chat else [rng.randrange(1, 500) for _ in range(24)]
        out = run(p, s, ids, "none", "cand-%d" % i)["ids"]
        # the trained pair's answers end (<|eot_id|>) well before max_tokens
        if len(out) >= (8 if chat else args.max_tokens // 2):
            cands.append((repeat_share(out), ids, out))
    check(len(cands) >= 2, "too few candidates ran long enough")
    cands.sort(key=lambda c: c[0])
    loops, plain = cands[-1], cands[0]
    measure(p, s, loops[1], "(b) loops", results, loops[2])
    measure(p, s, plain[1], "(c) no matches", results, plain[2])
    s.close()
    p.close()

    med = lambda xs: statistics.median(xs) if xs else 0.0
    print("== draft sources, greedy, %d tokens, %d runs each (medians, order shuffled per repeat) ==" %
          (args.max_tokens, args.repeat))
    print("repeated 4-grams in the output: (b) %.2f, (c) %.2f" % (loops[0], plain[0]))
    for label, rows in results.items():
        base = med([d["timing"]["tokens_per_s"] for d in rows["none"]])
        print(label)
        for source in SOURCES:
            ds = rows[source]
            tps = med([d["timing"]["tokens_per_s"] for d in ds])
            drafted = sum(d["spec"]["drafted"] for d in ds)
            accepted = sum(d["spec"]["accepted"] for d in ds)
            mean_len = med([d["spec"]["mean_accepted_per_round"] for d in ds])
            print("  %-7s %8.2f tokens/s  %5.2fx target-only  acceptance %s  accepted/round %.2f" %
                  (source, tps, tps / base if base > 0 else 0.0,
                   "%.3f" % (accepted / drafted) if drafted else "  -  ", mean_len))
    tandem_e2e.PIPELINES.clear()


if __name__ == "__main__":
    main()
