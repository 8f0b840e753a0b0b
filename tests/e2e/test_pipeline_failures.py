#!/usr/bin/python3
"""Worker failures: killing the draft (SIGKILL) in the middle of a request
still completes it with the target-only greedy output, new requests are
served target-only, and a restarted draft is used again; killing the target
ends its requests with `target_unavailable` within worker_timeout_ms (plus
slack), new requests get `target_unavailable`, and after the target is
restarted by hand service resumes. No /dev/shm segment of the instance is left
behind (the coordinator removes the killed draft's)."""
import signal
import time

from tandem_e2e import Pipeline, check, collect, generate, main, next_event, reference

TIMEOUT_MS = 1500


def test():
    p = Pipeline("fail", worker_timeout_ms=TIMEOUT_MS)
    draft, target = p.make_pair()
    p.start_all()
    s = p.client()
    ids = [11, 22, 33, 44, 55]
    n = 3000
    ref = reference(target, ids, n)["ids"]

    # Kill the draft while a long request runs.
    s.send_json({"v": 1, "type": "generate", "id": "long", "prompt_ids": ids, "max_tokens": n, "temperature": 0,
                 "stream": True})
    first = next_event(s, "long")  # the first token event: the request is running
    check(first["type"] == "token", "long request: %s" % first)
    p.kill("draft")
    done, _ = collect(s, "long", 120)
    check(p.stats()["workers"]["draft"]["losses"] == 1, "the draft's death was not noticed")
    check(done["type"] == "done", "request after the draft died: %s" % done)
    check(done["ids"] == ref, "ids after the draft died differ from target-only (first difference at %s)" %
          next((i for i, (a, b) in enumerate(zip(done["ids"], ref)) if a != b), min(len(done["ids"]), len(ref))))
    p.wait_workers(draft=False, target=True)
    check(p.shm_segments() == [], "the killed draft's segment was not removed: %s" % p.shm_segments())

    # Target-only service meanwhile, in runs of plain steps: the 29 tokens
    # after the prefill's first are one run the target decodes by itself
    # (draft "model": "auto" would draft n-grams here without a draft).
    ref2 = reference(target, [7, 8, 9], 30)["ids"]
    runs_before = p.stats()["spec"]
    done, toks = generate(s, {"id": "solo", "prompt_ids": [7, 8, 9], "max_tokens": 30, "temperature": 0,
                              "stream": True, "draft": "model"})
    check(done.get("ids") == ref2, "target-only service: %s" % done)
    check(sum((t["ids"] for t in toks), []) == ref2, "target-only service: streamed ids differ")
    runs = p.stats()["spec"]
    check((runs["plain_runs"] - runs_before["plain_runs"], runs["plain_run_steps"] - runs_before["plain_run_steps"])
          == (1, 29), "target-only service: plain runs %s, before %s" % (runs, runs_before))
    # Sampled, seeded: a run draws what one-step rounds draw (by position).
    sampled = ["--seed", "4242", "--top-k", "40"]
    ref3 = reference(target, [7, 8, 9], 30, 0.9, sampled)["ids"]
    done, _ = generate(s, {"id": "solo-s", "prompt_ids": [7, 8, 9], "max_tokens": 30, "temperature": 0.9,
                           "top_k": 40, "seed": 4242})
    check(done.get("ids") == ref3, "target-only sampled: %s, tandem-generate %s" % (done.get("ids"), ref3))

    # The draft comes back: used again (its caches start empty).
    p.start("draft")
    p.wait_workers(draft=True, target=True)
    before = p.stats()["spec"]["num_draft_tokens"]
    done, _ = generate(s, {"id": "back", "prompt_ids": [7, 8, 9], "max_tokens": 30, "temperature": 0})
    check(done.get("ids") == ref2, "after the draft returned: %s" % done)
    check(p.stats()["spec"]["num_draft_tokens"] > before, "the restarted draft was not used")

    # Kill the target while a request runs: target_unavailable, bounded time.
    s.send_json({"v": 1, "type": "generate", "id": "doomed", "prompt_ids": ids, "max_tokens": n, "temperature": 0,
                 "stream": True})
    check(next_event(s, "doomed")["type"] == "token", "doomed request did not start")
    p.kill("target")
    t0 = time.time()
    m, _ = collect(s, "doomed", 60)
    waited = time.time() - t0
    # It may have finished just before the kill; otherwise it must fail fast.
    if m["type"] != "done":
        check(m["type"] == "error" and m["code"] == "target_unavailable", "request when the target died: %s" % m)
        check(waited < TIMEOUT_MS / 1000.0 + 5, "target_unavailable took %.1f s" % waited)
    p.wait_workers(draft=True, target=False)
    m, _ = generate(s, {"id": "none", "prompt_ids": [1], "max_tokens": 3}, 20)
    check(m["type"] == "error" and m["code"] == "target_unavailable", "request without a target: %s" % m)

    # Restart the target by hand: service resumes, with the draft.
    p.start("target")
    p.wait_workers(draft=True, target=True)
    done, _ = generate(s, {"id": "resumed", "prompt_ids": ids, "max_tokens": 40, "temperature": 0})
    check(done.get("ids") == ref[:40], "after the target restarted: %s" % done)

    # A hung draft (SIGSTOP) while a request runs: a verification sent
    # beside its draft stops waiting, the draft is declared lost, and the
    # request finishes target-only with the target's output. (Draft
    # "model": this request repeats earlier ones, which "auto" would draft
    # from the suffix cache without waiting on the draft at all.)
    losses = p.stats()["workers"]["draft"]["losses"]
    s.send_json({"v": 1, "type": "generate", "id": "hung-draft", "prompt_ids": ids, "max_tokens": 600,
                 "temperature": 0, "stream": True, "draft": "model"})
    check(next_event(s, "hung-draft")["type"] == "token", "hung-draft request did not start")
    p.procs["draft"].send_signal(signal.SIGSTOP)
    try:
        done, _ = collect(s, "hung-draft", 120)
    finally:
        p.procs["draft"].send_signal(signal.SIGCONT)
    check(done.get("ids") == ref[:600], "after the draft hung: %s" % {k: v for k, v in done.items() if k != "ids"})
    st = p.stats()
    # At least one loss: resumed (SIGCONT above), the draft may register
    # twice before these stats, the second time after noticing its dropped
    # connection, which the registry counts as a restart (a second loss).
    check(st["workers"]["draft"]["losses"] >= losses + 1, "the hung draft was not declared lost: %s" % st["workers"])
    print("hung draft: %d verifications beside drafts, %d given up" %
          (st["spec"]["verify_beside_draft"], st["spec"]["verify_beside_draft_failed"]))

    # Clean stop: nothing left in /dev/shm.
    s.close()
    for role in ("draft", "target", "coordinator"):
        p.kill(role, signal.SIGTERM)
    check(p.shm_segments() == [], "segments left after stop: %s" % p.shm_segments())
    p.close()


if __name__ == "__main__":
    main(test)
