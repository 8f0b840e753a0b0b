#!/usr/bin/python3
"""Drafts made in the coordinator (draft "ngram": the request's own
tokens; "suffix": earlier requests' tokens; "auto"): greedy output equals
target-only ids for ids, for K 1..16, alone and in a batch beside requests
drafting with the model and with none; a request served a second time is
drafted from the suffix cache; the stats count each source's rounds. A
deployment without a draft worker (no draft_worker section,
coordinator.draft "ngram") starts, serves the same output and drafts. An
unknown source is an invalid_request naming the field. tandem-generate,
running the same scheduler in process, takes every source with the same
ids."""
import random

from tandem_e2e import Pipeline, check, generate, generate_concurrently, main, reference


def prompts(n, seed):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        # a phrase said twice gives the n-gram source something to find
        phrase = [rng.randrange(1, 512) for _ in range(rng.randrange(3, 8))]
        out.append([rng.randrange(1, 512) for _ in range(rng.randrange(0, 6))] + phrase * 2 + phrase[:2])
    return out


def test():
    p = Pipeline("ngram", max_concurrency=4, extra={"coordinator": {"spec_k_max": 16}})
    _, target = p.make_pair()
    p.start_all()
    s = p.client()
    cases = prompts(8, 3)
    n = 40
    refs = [reference(target, ids, n)["ids"] for ids in cases]
    # alone, K 1..16
    for i, ids in enumerate(cases):
        for k in (1 + 2 * i, 16 - i):
            done, _ = generate(s, {"id": "n%d-%d" % (i, k), "prompt_ids": ids, "max_tokens": n, "temperature": 0,
                                   "draft": "ngram", "spec_k": k})
            check(done["type"] == "done", "prompt %d K %d: %s" % (i, k, done))
            check(done["ids"] == refs[i], "prompt %d K %d: n-gram ids %s != target-only %s" %
                  (i, k, done["ids"], refs[i]))
    st = p.stats()["spec"]
    check(st["ngram_drafts"] > 0 and st["ngram_accepted_tokens"] > 0, "no n-gram round accepted anything: %s" % st)
    check(st["num_drafts"] == st["ngram_drafts"], "rounds drafted by the model for draft ngram: %s" % st)
    # every prompt was served: drafted from the suffix cache now, nearly
    # every token accepted; "auto" takes the same matches
    for source in ("suffix", "auto"):
        before = p.stats()["spec"]
        for i, ids in enumerate(cases):
            done, _ = generate(s, {"id": "%s%d" % (source, i), "prompt_ids": ids, "max_tokens": n, "temperature": 0,
                                   "draft": source})
            check(done.get("ids") == refs[i], "prompt %d, %s: %s" % (i, source, done))
        after = p.stats()["spec"]
        acc = after["suffix_accepted_tokens"] - before["suffix_accepted_tokens"]
        check(acc >= len(cases) * (n // 2), "draft %s on repeated requests: %d tokens accepted from the cache: %s" %
              (source, acc, after))
    # a batch: each source beside the others
    sources = ["ngram", "model", "none", "suffix"]
    out = generate_concurrently(p, [{"id": "b%d" % i, "prompt_ids": cases[i], "max_tokens": n, "temperature": 0,
                         "draft": sources[i]} for i in range(4)])
    for i, r in enumerate(out):
        check(r.get("type") == "done" and r["ids"] == refs[i], "batch %d (%s): %s" % (i, sources[i], r))
    # an unknown source
    done, _ = generate(s, {"id": "bad", "prompt_ids": [5], "draft": "medusa"})
    check(done["type"] == "error" and done["code"] == "invalid_request" and "draft" in done["message"],
          "draft medusa: %s" % done)
    st = p.stats()["spec"]
    print("ngram: %d rounds, %d of %d drafted tokens accepted; suffix: %d rounds, %d of %d" %
          (st["ngram_drafts"], st["ngram_accepted_tokens"], st["ngram_draft_tokens"], st["suffix_drafts"],
           st["suffix_accepted_tokens"], st["suffix_draft_tokens"]))
    s.close()
    p.close()

    # no draft worker at all
    q = Pipeline("ngram-alone", extra={"coordinator": {"draft": "ngram"}})
    _, target = q.make_pair()
    del q.config["draft_worker"]
    q.start("coordinator")
    q.start("target")
    q.wait_workers(draft=False, target=True)
    s = q.client()
    for i, ids in enumerate(cases[:3]):
        done, _ = generate(s, {"id": "t%d" % i, "prompt_ids": ids, "max_tokens": n, "temperature": 0})
        check(done.get("ids") == refs[i], "target-only deployment, prompt %d: %s" % (i, done))
    st = q.stats()["spec"]
    check(st["ngram_drafts"] > 0, "a deployment without a draft worker drafted nothing: %s" % st)
    print("without a draft worker: %d n-gram rounds, %d of %d drafted tokens accepted" %
          (st["ngram_drafts"], st["ngram_accepted_tokens"], st["ngram_draft_tokens"]))
    # tandem-generate runs the same scheduler in process: every source the
    # server has gives the target's ids there too
    for source in ("ngram", "suffix", "auto", "none"):
        for i, ids in enumerate(cases[:3]):
            got = reference(target, ids, n, extra=["--drafter", source, "--spec-k", str(2 + i)])
            check(got["ids"] == refs[i] and got["drafter"] == source,
                  "tandem-generate --drafter %s, prompt %d: %s != %s" % (source, i, got["ids"], refs[i]))
    s.close()
    q.close()


if __name__ == "__main__":
    main(test)
