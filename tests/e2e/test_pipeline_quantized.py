#!/usr/bin/python3
"""Quantized weights through the three processes: a draft worker with
`quantize: int8` leaves greedy output exactly the unquantized target's (the
target verifies every token) and still has drafts accepted; a target
worker with `quantize: int8` serves what tandem-generate --quantize int8
computes; the workers log the weight memory before and after; a bad value
is refused at start, naming the key."""
import subprocess

from tandem_e2e import Pipeline, binary, check, generate, main, reference


def test():
    p = Pipeline("quant", extra={"draft_worker": {"quantize": "int8"}})
    draft, target = p.make_pair()
    p.start_all()
    s = p.client()
    for i, ids in enumerate(([5, 6, 7, 8], [100, 3, 42, 42, 9, 17], [1])):
        ref = reference(target, ids, 40)["ids"]
        done, _ = generate(s, {"id": "d%d" % i, "prompt_ids": ids, "max_tokens": 40, "temperature": 0,
                               "draft": "model", "spec_k": 4})
        check(done.get("ids") == ref, "int8 draft, prompt %d: %s != target-only %s" % (i, done.get("ids"), ref))
    st = p.stats()["spec"]
    check(st["num_accepted_tokens"] > 0, "the int8 draft had nothing accepted: %s" % st)
    rate8 = st["num_accepted_tokens"] / st["num_draft_tokens"]
    s.close()
    log = open(p.logs["draft"]).read()
    check("weights quantized int8" in log, "the draft did not log its weight memory:\n%s" % log[-1500:])
    print("int8 draft: %d of %d drafted tokens accepted; %s" %
          (st["num_accepted_tokens"], st["num_draft_tokens"],
           [l for l in log.splitlines() if "quantized" in l][0].split("INFO: ")[-1]))
    p.close()

    # int4: the same exactness (the tiny draft's rows are 64 weights: two groups)
    p4 = Pipeline("quant4", extra={"draft_worker": {"quantize": "int4"}})
    draft, target = p4.make_pair()
    p4.start_all()
    s = p4.client()
    for i, ids in enumerate(([5, 6, 7, 8], [100, 3, 42, 42, 9, 17], [1])):
        done, _ = generate(s, {"id": "d4-%d" % i, "prompt_ids": ids, "max_tokens": 40, "temperature": 0,
                               "draft": "model", "spec_k": 4})
        check(done.get("ids") == reference(target, ids, 40)["ids"], "int4 draft, prompt %d: %s" % (i, done))
    # Exactness holds whatever the draft proposes (the target verifies every
    # token), so only acceptance shows that the int4 draft still computes
    # its model: scrambled int4 weights propose noise. Measured on these
    # prompts: 64 of 191 accepted (0.34; the int8 draft 0.59; nibbles
    # swapped within their groups: 0.05); asserted: half the measured.
    st = p4.stats()["spec"]
    rate4 = st["num_accepted_tokens"] / max(1, st["num_draft_tokens"])
    print("int4 draft: %d of %d drafted tokens accepted (%.2f; int8 draft %.2f)" %
          (st["num_accepted_tokens"], st["num_draft_tokens"], rate4, rate8))
    check(rate4 >= 0.17, "the int4 draft's acceptance %.2f is below 0.17 (measured 0.34): are its weights "
          "what the model holds? %s" % (rate4, st))
    s.close()
    p4.close()

    q = Pipeline("quanttarget", extra={"target_worker": {"quantize": "int8"}})
    _, target = q.make_pair()
    q.start_all()
    s = q.client()
    ids = [9, 8, 7, 6]
    want = reference(target, ids, 32, extra=["--quantize", "int8"])["ids"]
    done, _ = generate(s, {"id": "t", "prompt_ids": ids, "max_tokens": 32, "temperature": 0})
    check(done.get("ids") == want, "int8 target: %s != tandem-generate --quantize int8 %s" % (done.get("ids"), want))
    s.close()
    q.close()

    # a bad value: the worker refuses to start and names the key
    b = Pipeline("quantbad", extra={"target_worker": {"quantize": "int3"}})
    b.make_pair()
    r = subprocess.run([binary("target"), "--config", b.write_config()], capture_output=True, text=True, timeout=60)
    check(r.returncode != 0 and "quantize" in r.stderr + r.stdout, "quantize int3: %d %s" % (r.returncode, r.stderr))
    b.close()


if __name__ == "__main__":
    main(test)
