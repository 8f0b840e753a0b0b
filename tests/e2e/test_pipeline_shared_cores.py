#!/usr/bin/python3
"""Draft and target on the same cores, with more threads than cores: the
coordinator learns it from the workers' registrations (their "cpu"), says so
in its log and stats, and never has the draft pre-draft beside a
verification; the output is still the target's. With one thread each on a
machine of two cores or more, the two do not contend and it says that."""
import os

from tandem_e2e import Pipeline, check, generate, main, reference


def run(threads, expect_shared):
    p = Pipeline("cores%d" % threads, extra={"draft_worker": {"threads": threads},
                                             "target_worker": {"threads": threads}})
    draft, target = p.make_pair()
    p.start_all()
    s = p.client()
    for i, ids in enumerate(([5, 6, 7], [100, 3, 44, 9], [1])):
        ref = reference(target, ids, 40)["ids"]
        done, _ = generate(s, {"id": "c%d" % i, "prompt_ids": ids, "max_tokens": 40, "temperature": 0})
        check(done.get("ids") == ref, "threads %d, prompt %d: %s, target-only %s" % (threads, i, done, ref))
    st = p.stats()
    check(st["workers"]["cores_shared"] == expect_shared,
          "threads %d on %d CPUs: cores_shared %s" % (threads, len(os.sched_getaffinity(0)),
                                                     st["workers"]["cores_shared"]))
    with open(p.logs["coordinator"]) as f:
        log = f.read()
    said = "share cores: the draft works only while the target waits" in log
    check(said == expect_shared, "threads %d: the coordinator's log %s the sharing:\n%s" %
          (threads, "does not say" if expect_shared else "wrongly says", p.log_tail("coordinator")))
    if expect_shared:
        check(st["spec"]["predraft_offered"] == 0, "pre-drafts on shared cores: %s" % st["spec"])
        check(st["spec"]["num_drafts"] > 0, "no drafting at all: %s" % st["spec"])
    s.close()
    p.close()


def test():
    cpus = len(os.sched_getaffinity(0))
    # as many threads each as there are CPUs: together twice as many
    run(cpus, True)
    run(1, cpus < 2)


if __name__ == "__main__":
    main(test)
