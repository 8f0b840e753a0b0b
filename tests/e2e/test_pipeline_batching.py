#!/usr/bin/python3
"""Continuous batching: output never depends on the load.

1. 16 concurrent greedy requests with different prompt lengths (1..150
   tokens, so long prompts are prefilled a chunk per step beside the others'
   rounds) and max_tokens, speculation on (adaptive K, and fixed K for some):
   every output equals that request's own target-only output run alone
   (tandem-generate), and the stats show the target really ran several
   sequences per forward call.
2. A KV pool that holds four such requests at a time (kv_tokens):
   a burst of 14 is admitted four at a time, the rest wait in the queue, and
   whatever the queue cannot hold is refused with `overloaded` at once; every
   admitted request completes with its target-only ids, no reservation is
   left afterwards, and the next request is served.
"""
import random
import threading

from tandem_e2e import Pipeline, check, generate, main, reference


def run_concurrently(p, reqs, timeout_s=600):
    """Sends every request from its own client at once; returns {id: reply}."""
    results = {}
    start = threading.Barrier(len(reqs))

    def one(req):
        c = p.client()
        try:
            start.wait(30)
            results[req["id"]] = generate(c, req, timeout_s)[0]
        except Exception as e:  # reported by the caller's checks
            results[req["id"]] = {"type": "exception", "message": str(e)}
        finally:
            c.close()

    threads = [threading.Thread(target=one, args=(r,)) for r in reqs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s + 60)
    return results


def test_sixteen_concurrent():
    p = Pipeline("batch16", max_concurrency=16, max_queue=16, worker_timeout_ms=10000,
                 extra={"target_worker": {"prefill_chunk": 16}, "draft_worker": {"prefill_chunk": 16}})
    draft, target = p.make_pair()
    p.start_all()
    rng = random.Random(12)
    reqs, expected = [], {}
    for i in range(16):
        n_prompt = [1, 3, 150, 20, 64, 7, 120, 33][i % 8] + i
        ids = [rng.randrange(1, 512) for _ in range(n_prompt)]
        n = 8 + (i * 7) % 41
        req = {"id": "b%d" % i, "prompt_ids": ids, "max_tokens": n, "temperature": 0}
        if i % 4 == 1:
            req["spec_k"] = 1 + i % 5
        reqs.append(req)
        expected[req["id"]] = reference(target, ids, n)["ids"]
    results = run_concurrently(p, reqs)
    for r in reqs:
        got = results.get(r["id"], {})
        check(got.get("type") == "done", "request %s: %s" % (r["id"], got))
        check(got["ids"] == expected[r["id"]],
              "request %s (prompt %d, max_tokens %d): batched ids %s != target-only alone %s" %
              (r["id"], len(r["prompt_ids"]), r["max_tokens"], got["ids"], expected[r["id"]]))
    st = p.stats()
    b = st["batch"]
    hist = b["seqs_per_call"]
    multi = sum(v for k, v in hist.items() if k != "1")
    print("target calls %d, mean %.2f sequences and %.1f rows per call, histogram %s; "
          "aggregate %.1f tokens/s, per request %.1f tokens/s" %
          (b["target_calls"], b["mean_seqs_per_call"], b["mean_rows_per_call"], hist,
           st["tokens"]["aggregate_tokens_per_s"], st["tokens"]["per_request_tokens_per_s"]))
    check(b["target_calls"] > 0, "no target call counted: %s" % b)
    check(multi > 0 and b["mean_seqs_per_call"] > 1.5,
          "the target never batched: %s" % b)
    check(st["spec"]["num_draft_tokens"] > 0, "no speculation under load: %s" % st["spec"])
    prom = st["prometheus"]
    for name in ("tandem_target_batch_size_bucket", "tandem_target_batch_size_count",
                 "tandem_busy_seconds_total"):
        check(name in prom, "prometheus text lacks %s" % name)
    p.close()


def test_kv_admission():
    # max_seq_len 256: kv_tokens 512 is two full sequences (32 blocks of 16);
    # a request of 20 + 90 tokens reserves ceil((20 + 90 + k_max + 1) / 16)
    # = 8 blocks in the target's pool (k_max 8) and ceil((110 + 2 k_max + 2)
    # / 16) = 8 in the draft's, so four run at a time.
    p = Pipeline("batchkv", max_concurrency=8, max_queue=4, worker_timeout_ms=10000,
                 extra={"coordinator": {"spec_k_max": 8},
                        "target_worker": {"max_seq_len": 256, "kv_tokens": 512},
                        "draft_worker": {"max_seq_len": 256, "kv_tokens": 512}})
    draft, target = p.make_pair()
    p.start_all()
    st = p.stats()
    check(st["kv_blocks"]["target_total"] == 32, "target pool: %s" % st["kv_blocks"])
    rng = random.Random(5)
    reqs, expected = [], {}
    for i in range(14):
        ids = [rng.randrange(1, 512) for _ in range(20)]
        req = {"id": "k%d" % i, "prompt_ids": ids, "max_tokens": 90, "temperature": 0}
        reqs.append(req)
        expected[req["id"]] = reference(target, ids, 90)["ids"]
    results = run_concurrently(p, reqs)
    done = overloaded = 0
    for r in reqs:
        got = results.get(r["id"], {})
        if got.get("type") == "error":
            check(got.get("code") == "overloaded", "request %s: %s" % (r["id"], got))
            overloaded += 1
            continue
        check(got.get("type") == "done", "request %s: %s" % (r["id"], got))
        check(got["ids"] == expected[r["id"]], "request %s: ids differ from target-only" % r["id"])
        done += 1
    st = p.stats()
    kv = st["kv_blocks"]
    print("burst of 14: %d done, %d overloaded; admissions that waited for KV blocks: %d; %s" %
          (done, overloaded, kv["admissions_waited"], kv))
    check(overloaded > 0, "a burst beyond pool and queue was never refused")
    check(done >= 8, "only %d of the burst were served (4 active + 4 queued expected)" % done)
    check(kv["admissions_waited"] > 0, "no admission waited for KV blocks: %s" % kv)
    check(kv["target_reserved"] == 0 and kv["draft_reserved"] == 0, "blocks still reserved: %s" % kv)
    check(st["requests"]["active"] == 0 and st["requests"]["queued"] == 0, "requests left: %s" % st["requests"])
    # nothing is lost: the next request is served
    s = p.client()
    again = generate(s, dict(reqs[0], id="after"))[0]
    s.close()
    check(again.get("type") == "done" and again["ids"] == expected["k0"], "after the burst: %s" % again)
    p.close()


def test():
    test_sixteen_concurrent()
    test_kv_admission()


if __name__ == "__main__":
    main(test)
