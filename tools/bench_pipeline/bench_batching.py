#!/usr/bin/python3
"""bench_batching.py: aggregate throughput of the three-process pipeline under
concurrent load, with and without speculation, in one run.

    bench_batching.py [--build DIR] [--pair tiny|small|3b] [--target DIR --draft DIR]
                      [--backend cpu|cuda] [--device D] [--concurrency 1,4,16]
                      [--max-tokens N] [--threads N] [--noise S] [--spec-k K]
                      [--sources model,auto] [--rounds N]

--pair 3b makes the 3B-shaped pair (llama-3.2-3b derived from llama-3.2-3b-draft,
8 GB on disk): for the GPU, with --backend cuda.

For each concurrency C, C clients send one greedy request each at the same
moment (distinct prompts of 8..40 tokens); the aggregate throughput is the
tokens generated over the wall time from the first send to the last reply.
Configurations: target-only (no draft worker: the coordinator decodes with
K = 0) and one speculative pipeline per draft source in --sources (the
requests' "draft" field; adaptive K or --spec-k). All are up for the whole
run and take turns, in a rotating order, at each C of each round; each C of
each round sends prompts of its own. Every speculative reply must equal the target-only
reply for the same prompt (batching and speculation never change a greedy
token), or the benchmark fails. Printed per C: the median aggregate tokens/s
of each configuration, the target's mean sequences per forward call, and
each round's speculative/target-only ratio with their median.
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


def measure(e2e, p, reqs):
    """One burst of reqs on pipeline p: (tokens/s, mean sequences per target
    call, (drafted, accepted, rounds)) and the replies' ids by request index."""
    before_all = p.stats()
    before = before_all["batch"]
    got, wall = burst(e2e, p, reqs, 3600)
    tokens = 0
    ids = []
    for i, r in enumerate(reqs):
        g = got.get(r["id"], {})
        e2e.check(g.get("type") == "done", "request %s: %s" % (r["id"], g))
        tokens += len(g["ids"])
        ids.append(g["ids"])
    after = p.stats()
    b = after["batch"]
    calls = b["target_calls"] - before["target_calls"]
    seqs = b["mean_seqs_per_call"] * b["target_calls"] - before["mean_seqs_per_call"] * before["target_calls"]
    spec = [after["spec"][f] - before_all["spec"][f] for f in ("num_draft_tokens", "num_accepted_tokens", "rounds")]
    return (tokens / wall, seqs / calls if calls else 0.0, tuple(spec)), ids


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
    ap.add_argument("--sources", default="model",
                    help="the requests' draft sources to run, each in a pipeline of its own: model, auto, ...")
    ap.add_argument("--rounds", type=int, default=1,
                    help="rounds of every (C, configuration), alternated; fresh prompts each round")
    args = ap.parse_args()
    os.environ["TANDEM_BUILD_DIR"] = os.path.abspath(args.build)
    import tandem_e2e as e2e

    levels = [int(x) for x in args.concurrency.split(",")]
    sources = [x for x in args.sources.split(",") if x]
    top = max(levels)
    worker = {"threads": args.threads, "backend": args.backend}
    if args.backend == "cuda":
        worker["device"] = args.device
        worker["max_seq_len"] = 2048  # the pool of top x 2048 positions must fit beside the weights
    extra = {"coordinator": {"spec_k": args.spec_k},
             "draft_worker": dict(worker), "target_worker": dict(worker)}
    # The pair is made once, in a pipeline of its own that is never started,
    # and every configuration loads it (the 3B pair is 8 GB).
    holder = None
    if args.target and args.draft:
        models = (args.draft, args.target)
    else:
        holder = e2e.Pipeline("bbmodels")
        names = {"tiny": ("tiny-draft", "tiny"), "small": ("small-draft", "small"),
                 "3b": ("llama-3.2-3b-draft", "llama-3.2-3b")}[args.pair]
        models = holder.make_pair(names[0], names[1], noise=args.noise)
    # Every configuration has its pipeline up for the whole run (idle ones
    # wait on their sockets), so each (C, round) runs them back to back in a
    # rotating order and a change in the machine's load falls on all alike.
    # Each draft source has its own coordinator: one source's finished
    # requests never feed another's suffix cache.
    modes = ["target-only"] + sources
    pipes = {}
    figures = {}
    status = 0
    try:
        for mode in modes:
            p = e2e.Pipeline("bb%s" % mode.replace("-", ""), max_concurrency=top, max_queue=top,
                             worker_timeout_ms=30000, extra=extra)
            pipes[mode] = p
            p.config["draft_worker"]["model"], p.config["target_worker"]["model"] = models
            p.start("coordinator")
            p.start("target")
            if mode != "target-only":
                p.start("draft")
            p.wait_workers(draft=mode != "target-only", target=True)
        for rnd in range(args.rounds):
            for c in levels:
                # prompts of their own at each C and round: a prompt seen
                # before would be drafted whole from the suffix cache
                rng = random.Random(3 + 1000 * rnd + c)
                prompts = [[rng.randrange(1, 500) for _ in range(rng.randrange(8, 41))] for _ in range(c)]
                order = modes[rnd % len(modes):] + modes[:rnd % len(modes)]
                replies = {}
                for mode in order:
                    reqs = [{"id": "r%d_%d_%d" % (rnd, c, i), "prompt_ids": prompts[i],
                             "max_tokens": args.max_tokens, "temperature": 0} for i in range(c)]
                    if mode != "target-only":
                        for r in reqs:
                            r["draft"] = mode
                    fig, replies[mode] = measure(e2e, pipes[mode], reqs)
                    figures.setdefault((mode, c), []).append(fig)
                for mode in sources:
                    for i in range(c):
                        e2e.check(replies[mode][i] == replies["target-only"][i],
                                  "C=%d request %d: %s output differs from target-only" % (c, i, mode))
    except e2e.Fail as ex:
        print("bench_batching: %s" % ex, file=sys.stderr)
        for p in pipes.values():
            for role in p.logs:
                print(p.log_tail(role), file=sys.stderr)
        status = 1
    finally:
        for p in pipes.values():
            p.close()
        if holder:
            holder.close()
    if status:
        return status
    report(args, levels, sources, figures)
    return 0


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def report(args, levels, sources, figures):
    print("Tandem batching benchmark: %s pair, greedy, %d tokens per request, %d thread(s) per worker, "
          "K %s, backend %s, %d round(s) alternated; every speculative reply equal to its target-only reply" %
          (args.pair if not args.target else "given", args.max_tokens, args.threads,
           args.spec_k or "adaptive", args.backend, args.rounds))
    print("  %5s  %-12s  %12s  %9s  %-22s  %9s  %s" % ("C", "draft", "tokens/s", "seqs/call", "vs target-only",
                                                     "median", "drafted/accepted/rounds"))
    for c in levels:
        plain = [f[0] for f in figures[("target-only", c)]]
        print("  %5d  %-12s  %12.1f  %9.1f" % (c, "target-only", median(plain),
                                               median([f[1] for f in figures[("target-only", c)]])))
        for mode in sources:
            fs = figures[(mode, c)]
            ratios = [f[0] / t for f, t in zip(fs, plain)]
            dr, ac, rd = (sum(f[2][j] for f in fs) for j in range(3))
            print("  %5d  %-12s  %12.1f  %9.1f  %-22s  %8.2fx  %d/%d/%d" %
                  (c, mode, median([f[0] for f in fs]), median([f[1] for f in fs]),
                   " ".join("%.2f" % r for r in ratios), median(ratios), dr, ac, rd))
    print("  (tokens/s: aggregate, median over the rounds; seqs/call: mean sequences per target forward call; "
          "vs target-only: each round's ratio to the target-only run beside it)")


if __name__ == "__main__":
    sys.exit(main())
