#!/usr/bin/python3
"""Greedy output through the three processes equals tandem-generate's
target-only output, ids for ids, on 12 prompts (tiny pair), for every K 1..16
(spec_k_max 16, model drafts), with 8 concurrent
clients, with streaming (token events concatenate to the done reply), and on
the small pair for two prompts; seeded sampling is reproducible; the stats
reply carries the Prometheus counters; no shared-memory segment is left after
the workers stop."""
import random
import threading

from tandem_e2e import Pipeline, check, collect, generate, main, reference


def prompts(n, vocab, seed):
    rng = random.Random(seed)
    return [[rng.randrange(1, vocab) for _ in range(rng.randrange(1, 40))] for _ in range(n)]


def test():
    p = Pipeline("greedy", max_concurrency=8, max_queue=8, extra={"coordinator": {"spec_k_max": 16}})
    draft, target = p.make_pair()
    p.start_all()
    s = p.client()

    # 12 prompts, one at a time, different lengths and K settings.
    cases = prompts(12, 512, 7)
    expected = {}
    for i, ids in enumerate(cases):
        n = 24 + 8 * (i % 5)
        ref = reference(target, ids, n)["ids"]
        expected[i] = (ids, n, ref)
        req = {"id": "g%d" % i, "prompt_ids": ids, "max_tokens": n, "temperature": 0}
        if i % 3 == 1:
            req["spec_k"] = 1 + i % 6
        done, _ = generate(s, req)
        check(done["type"] == "done", "prompt %d: %s" % (i, done))
        check(done["ids"] == ref, "prompt %d: pipeline ids %s != target-only %s" % (i, done["ids"], ref))
        check(done["usage"]["generated_tokens"] == len(ref), "prompt %d: usage %s" % (i, done["usage"]))
        check(done["finish_reason"] in ("length", "stop"), "prompt %d: finish_reason %s" % (i, done["finish_reason"]))

    # Every K a server can be configured for (spec_k_max 16), model drafts.
    for k in range(1, 17):
        ids, n, ref = expected[k % 12]
        done, _ = generate(s, {"id": "k%d" % k, "prompt_ids": ids, "max_tokens": n, "temperature": 0,
                               "spec_k": k, "draft": "model"})
        check(done.get("ids") == ref, "K %d: pipeline ids %s != target-only %s" % (k, done.get("ids"), ref))
        check(done["spec"]["drafted"] > 0, "K %d: nothing drafted: %s" % (k, done["spec"]))

    # Streaming: the token events' ids and texts add up to the done reply.
    ids, n, ref = expected[0]
    done, toks = generate(s, {"id": "st", "prompt_ids": ids, "max_tokens": n, "temperature": 0, "stream": True})
    check(done["ids"] == ref, "streamed ids differ")
    check(sum((t["ids"] for t in toks), []) == ref, "token events' ids do not add up to the result")
    check("".join(t["text"] for t in toks) == done["text"], "token events' text does not add up to the result")

    # 8 concurrent clients, each its own socket, all correct.
    results = {}

    def worker(i):
        c = p.client()
        try:
            ids, n, _ = expected[i]
            results[i] = generate(c, {"id": "c%d" % i, "prompt_ids": ids, "max_tokens": n, "temperature": 0})[0]
        except Exception as e:  # reported below
            results[i] = {"type": "exception", "message": str(e)}
        finally:
            c.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    for i in range(8):
        r = results.get(i, {})
        check(r.get("type") == "done", "concurrent client %d: %s" % (i, r))
        check(r["ids"] == expected[i][2], "concurrent client %d: ids differ from target-only" % i)

    # Several requests in flight on one socket (replies told apart by id).
    for i in range(4):
        ids, n, _ = expected[i]
        s.send_json({"v": 1, "type": "generate", "id": "m%d" % i, "prompt_ids": ids, "max_tokens": n, "temperature": 0})
    for i in range(4):
        done, _ = collect(s, "m%d" % i)
        check(done["ids"] == expected[i][2], "multiplexed request %d: ids differ" % i)

    # Seeded sampling is reproducible with a fixed K (which positions are
    # drafted decides which Philox draws are used, so an adaptive K, driven by
    # measured times, may pick other ones), and equals tandem-generate's
    # in-process speculative run with the same seed and K.
    ids = cases[3]
    req = {"prompt_ids": ids, "max_tokens": 40, "temperature": 0.9, "top_k": 50, "top_p": 0.95, "seed": 1234,
           "spec_k": 3}
    a = generate(s, dict(req, id="s1"))[0]
    b = generate(s, dict(req, id="s2"))[0]
    check(a["type"] == "done" and b["type"] == "done", "sampling: %s %s" % (a, b))
    check(a["ids"] == b["ids"], "seeded sampling not reproducible: %s vs %s" % (a["ids"], b["ids"]))
    ref = reference(target, ids, 40, 0.9, ["--draft", draft, "--spec-k", "3", "--top-k", "50", "--top-p", "0.95",
                                           "--seed", "1234"])["ids"]
    check(a["ids"] == ref, "seeded sampling differs from tandem-generate --draft's: %s vs %s" % (a["ids"], ref))
    c = generate(s, dict(req, id="s3", seed=99))[0]
    check(c["ids"] != a["ids"], "another seed gave the same sample")

    # Metrics.
    st = p.stats()
    check(st["requests"]["finished"] >= 12 + 1 + 8 + 4 + 2, "stats: finished %s" % st["requests"])
    check(st["spec"]["num_draft_tokens"] > 0, "stats: no draft tokens counted")
    prom = st["prometheus"]
    for name in ("tandem_requests_total", "tandem_generated_tokens_total", "tandem_spec_decode_num_drafts_total",
                 "tandem_spec_decode_num_draft_tokens_total", "tandem_spec_decode_num_accepted_tokens_total",
                 'tandem_spec_decode_num_accepted_tokens_per_pos{position="0"}', "tandem_predraft_used_total",
                 "tandem_draft_wait_seconds_total", "tandem_draft_wait_rounds_total"):
        check(name in prom, "prometheus text lacks %s" % name)
    # Every round with drafts waited for its draft (or found its pre-draft
    # ready): a wait per such round sent (rounds a request abandoned are sent
    # but not counted as drafts), none longer than the whole decode.
    tm = st["time_ms"]
    check(0 < st["spec"]["num_drafts"] <= tm["draft_wait_rounds"],
          "stats: %s draft waits for %s rounds with drafts" % (tm["draft_wait_rounds"], st["spec"]["num_drafts"]))
    check(0 <= tm["draft_wait_per_round"] <= tm["draft_wait_max"] <= tm["decode"],
          "stats: draft wait per round %s, max %s, decode %s" % (tm["draft_wait_per_round"], tm["draft_wait_max"],
                                                               tm["decode"]))
    # One thread each: the workers do not share cores, so verifications go
    # out beside their drafts (the target waits on the draft's buffer).
    check(st["spec"]["verify_beside_draft"] > 0, "no verification went beside its draft: %s" % st["spec"])
    print("pre-draft used %d of %d offered; acceptance %.3f" %
          (st["spec"]["predraft_used"], st["spec"]["predraft_offered"], st["spec"]["acceptance_rate"]))
    s.close()

    # Workers stop cleanly: the draft removes its segment.
    p.kill("draft", 15)
    p.kill("target", 15)
    p.kill("coordinator", 15)
    for role in ("draft", "target", "coordinator"):
        check(p.stopped[role].returncode == 0, "%s exited %s on SIGTERM" % (role, p.stopped[role].returncode))
    check(p.shm_segments() == [], "shared segments left: %s" % p.shm_segments())
    p.close()

    # The small pair (Llama 3 tokenizer): text prompt and chat, two prompts.
    # Under ASan on a busy machine one forward pass of the small target can outlast
    # the default 1.5 s liveness timeout (the worker does not heartbeat mid-pass).
    p = Pipeline("small", max_concurrency=2, max_queue=2, worker_timeout_ms=10000)
    draft, target = p.make_pair("small-draft", "small", noise="0.02")
    p.start_all()
    s = p.client()
    for i, ids in enumerate([[128000, 791, 6864, 315, 9822, 374], [128000, 40, 1093, 311]]):
        ref = reference(target, ids, 12)["ids"]
        done, _ = generate(s, {"id": "sm%d" % i, "prompt_ids": ids, "max_tokens": 12, "temperature": 0})
        check(done.get("ids") == ref, "small pair prompt %d: %s != %s" % (i, done.get("ids"), ref))
    done, toks = generate(s, {"id": "chat", "messages": [{"role": "user", "content": "Hello there"}],
                              "max_tokens": 8, "temperature": 0, "stream": True})
    check(done["type"] == "done" and done["usage"]["prompt_tokens"] > 5, "chat request: %s" % done)
    check("".join(t["text"] for t in toks) == done["text"], "chat: streamed text differs from the result")
    s.close()
    p.close()


if __name__ == "__main__":
    main(test)
