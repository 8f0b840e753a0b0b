#!/usr/bin/python3
"""bench_batching.py: aggregate throughput of the three-process pipeline under
concurrent load, with and without speculation, in one run.

    bench_batching.py [--build DIR] [--pair tiny|small|3b] [--target DIR --draft DIR]
                      [--backend cpu|cuda] [--device D] [--concurrency 1,4,16]
                      [--max-tokens N] [--threads N] [--noise S] [--spec-k K]

--pair 3b makes the 3B-shaped pair (llama-3.2-3b derived from llama-3.2-3b-draft,
8 GB on disk): for the GPU, with --backend cuda.

For each concurrency C, C clients send one greedy request each at the same
moment (distinct prompts of 8..40 tokens); the aggregate throughput is the
tokens generated over the wall time from the first send to the last reply.
Two configurations run side by side: target-only (no draft worker: the
coordinator decodes with K = 0) and speculative (draft worker up, adaptive K
or --spec-k). Every reply of the speculative run must equal the target-only
run's reply for the same prompt (batching and speculation never change a
greedy token), or the benchmark fails. Printed per C: aggregate tokens/s of
both, their ratio to C = 1, and the target's mean sequences per forward call.
Needs python3-zmq (run with /usr/bin/python3); uses tests/e2e/tandem_e2e.py.
"""
import argparse
import os
import random
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(SRC, "tests", "e2e"))


def burst(e2e, p, reqs, timeout_s):
    """Sends reqs from one client each at once; returns (replies by id, wall s)."""
    results = {}
    gate = threading.Barrier(len(reqs) + 1)

    def one(req):
        c = p.client()
        try:
            gate.wait(60)
            results[req["id"]] = e2e.generate(c, req, timeout_s)[0]
        except Exception as ex:  # checked by the caller
            results[req["id"]] = {"type": "exception", "message": str(ex)}
        finally:
            c.close()

    threads = [threading.Thread(target=one, args=(r,)) for r in reqs]
    for t in threads:
        t.start()
    gate.wait(60)
    t0 = time.time()
    for t in threads:
        t.join(timeout_s + 60)
    return results, time.time() - t0


def main():
    ap = argparse.ArgumentParser(description="Tandem batching benchmark")
    ap.add_argument("--build", default=os.environ.get("TANDEM_BUILD_DIR", os.path.join(SRC, "build")))
    ap.add_argument("--pair", default="tiny", choices=["tiny", "small", "3b"])
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--backend", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--device", default="0")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1, help="threads per worker")
    ap.add_argument("--noise", default="0.05")
    ap.add_argument("--spec-k", type=int, default=0, help="fixed K (0 = adaptive)")
    args = ap.parse_args()
    os.environ["TANDEM_BUILD_DIR"] = os.path.abspath(args.build)
    import tandem_e2e as e2e

    levels = [int(x) for x in args.concurrency.split(",")]
    top = max(levels)
    rng = random.Random(3)
    prompts = [[rng.randrange(1, 500) for _ in range(rng.randrange(8, 41))] for _ in range(top)]
    worker = {"threads": args.threads, "backend": args.backend}
    if args.backend == "cuda":
        worker["device"] = args.device
        worker["max_seq_len"] = 2048  # the pool of top x 2048 positions must fit beside the weights
    extra = {"coordinator": {"spec_k": args.spec_k},
             "draft_worker": dict(worker), "target_worker": dict(worker)}
    # The pair is made once, in a pipeline of its own that is never started,
    # and both configurations load it (the 3B pair is 8 GB).
    holder = None
    if args.target and args.draft:
        models = (args.draft, args.target)
    else:
        holder = e2e.Pipeline("bbmodels")
        names = {"tiny": ("tiny-draft", "tiny"), "small": ("small-draft", "small"),
                 "3b": ("llama-3.2-3b-draft", "llama-3.2-3b")}[args.pair]
        models = holder.make_pair(names[0], names[1], noise=args.noise)
    figures = {}
    replies = {}
    status = 0
    for mode in ("target-only", "speculative"):
        p = e2e.Pipeline("bbatch", max_concurrency=top, max_queue=top, worker_timeout_ms=30000,
                         extra=extra)
        try:
            p.config["draft_worker"]["model"], p.config["target_worker"]["model"] = models
            p.start("coordinator")
            p.start("target")
            if mode == "speculative":
                p.start("draft")
            p.wait_workers(draft=mode == "speculative", target=True)
            for c in levels:
                before_all = p.stats()
                before = before_all["batch"]
                reqs = [{"id": "r%d_%d" % (c, i), "prompt_ids": prompts[i], "max_tokens": args.max_tokens,
                         "temperature": 0} for i in range(c)]
                got, wall = burst(e2e, p, reqs, 3600)
                tokens = 0
                for i, r in enumerate(reqs):
                    g = got.get(r["id"], {})
                    e2e.check(g.get("type") == "done", "%s C=%d request %d: %s" % (mode, c, i, g))
                    tokens += len(g["ids"])
                    key = (c, i)
                    if mode == "target-only":
                        replies[key] = g["ids"]
                    else:
                        e2e.check(g["ids"] == replies[key],
                                  "C=%d request %d: speculative output differs from target-only" % (c, i))
                after = p.stats()
                b = after["batch"]
                calls = b["target_calls"] - before["target_calls"]
                seqs = b["mean_seqs_per_call"] * b["target_calls"] - before["mean_seqs_per_call"] * before["target_calls"]
                drafted = after["spec"]["num_draft_tokens"] - before_all["spec"]["num_draft_tokens"]
                accepted = (after["spec"]["num_accepted_tokens"]
                            - before_all["spec"]["num_accepted_tokens"])
                rounds = after["spec"]["rounds"] - before_all["spec"]["rounds"]
                figures[(mode, c)] = (tokens / wall, seqs / calls if calls else 0.0,
                                      (drafted, accepted, rounds))
        except e2e.Fail as ex:
            print("bench_batching: %s" % ex, file=sys.stderr)
            for role in p.logs:
                print(p.log_tail(role), file=sys.stderr)
            status = 1
        finally:
            p.close()
        if status:
            if holder:
                holder.close()
            return status
    if holder:
        holder.close()
    print("Tandem batching benchmark: %s pair, greedy, %d tokens per request, %d thread(s) per worker, "
          "K %s, backend %s; every speculative reply equal to its target-only reply" %
          (args.pair if not args.target else "given", args.max_tokens, args.threads,
           args.spec_k or "adaptive", args.backend))
    print("  %5s  %28s  %28s  %10s  %s" % ("C", "target-only tokens/s", "speculative tokens/s", "spec/plain",
                                         "drafted/accepted/rounds"))
    base = {m: figures[(m, levels[0])][0] for m in ("target-only", "speculative")}
    for c in levels:
        t, ts, _ = figures[("target-only", c)]
        s, ss, (dr, ac, rd) = figures[("speculative", c)]
        print("  %5d  %9.1f (%5.2fx, %4.1f/call)  %9.1f (%5.2fx, %4.1f/call)  %9.2fx  %d/%d/%d" %
              (c, t, t / base["target-only"], ts, s, s / base["speculative"], ss, s / t if t else 0,
               dr, ac, rd))
    print("  (Nx: aggregate throughput against C = %d of the same configuration; /call: mean sequences per "
          "target forward call; drafted/accepted draft tokens and rounds of the speculative run)" % levels[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
