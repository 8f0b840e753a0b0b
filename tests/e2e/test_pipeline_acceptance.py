#!/usr/bin/python3
"""A draft that is the target itself proposes what the target would choose:
under greedy decoding every draft must be accepted, through the three
processes, with pre-drafts and verifications beside their drafts. Output
tests cannot see a mistake in the coordinator's draft-cache bookkeeping
(the target's verification keeps the output exact; only speed is lost);
this test can: a wrong keep_len or feed makes the draft continue from a
context the target does not have, and its acceptance falls."""
import random

from tandem_e2e import Pipeline, check, generate, main, reference

# Both models run the same kernels on the same weights, one row at a time
# (the draft) or k + 1 rows at once (the target); the CPU kernels give the
# same logits either way, so nothing short of a bookkeeping mistake makes a
# draft differ from the target's choice.
MIN_ACCEPTANCE = 0.99


def test():
    p = Pipeline("acceptance")
    _, target = p.make_pair()
    p.config["draft_worker"]["model"] = target
    p.start_all()
    s = p.client()
    rng = random.Random(11)
    drafted = accepted = 0
    for i in range(6):
        ids = [rng.randrange(1, 512) for _ in range(rng.randrange(2, 30))]
        n = 40
        done, _ = generate(s, {"id": "a%d" % i, "prompt_ids": ids, "max_tokens": n, "temperature": 0,
                               "spec_k": 2 + i % 4, "draft": "model"})
        check(done["type"] == "done", "prompt %d: %s" % (i, done))
        check(done["ids"] == reference(target, ids, n)["ids"], "prompt %d: ids differ from target-only" % i)
        sp = done["spec"]
        # with every draft accepted, a round of k drafts yields k + 1
        # tokens: drafts are most of the output unless rounds went plain
        # (a draft that failed, a request that fell back to target-only)
        check(sp["drafted"] >= n // 2, "prompt %d: %d of %d tokens drafted: %s" % (i, sp["drafted"], n, sp))
        check(sp["acceptance_rate"] >= MIN_ACCEPTANCE,
              "prompt %d: acceptance %.3f (%d of %d) with the target as its own draft" %
              (i, sp["acceptance_rate"], sp["accepted"], sp["drafted"]))
        drafted += sp["drafted"]
        accepted += sp["accepted"]
    st = p.stats()
    print("acceptance %d/%d; pre-drafts used %d of %d offered; %d verifications beside their drafts" %
          (accepted, drafted, st["spec"]["predraft_used"], st["spec"]["predraft_offered"],
           st["spec"]["verify_beside_draft"]))
    s.close()
    p.close()


if __name__ == "__main__":
    main(test)
